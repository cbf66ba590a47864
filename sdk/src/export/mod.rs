//! Turns the author traits into ABI vtables. Every slot body runs behind one
//! panic boundary ([`guard()`]): a panic becomes `MEMPLUG_STATUS_INTERNAL`
//! with the panic message, an `Err` becomes its code and message. Out-params
//! are written only on success, and never past the host's `struct_size`.
//!
//! * `guard` — the panic boundary and the message sink;
//! * `args` — a slot's arguments read and its out-params written through
//!   the prefix protocol ([`crate::prefix`]);
//! * `thunks` — the `extern "C"` slot functions, generic over the vendor's
//!   implementation;
//! * `builder` — [`MechanismBuilder`] and [`PluginBuilder`], which freeze
//!   them into static descriptors;
//! * `entry` — negotiation and the macros that define the entry symbol.

mod args;
mod builder;
mod entry;
mod guard;
mod thunks;

pub use builder::{BuiltMechanism, ExportedPlugin, MechanismBuilder, PluginBuilder};
pub use entry::{negotiate, PluginCell};
pub use guard::{guard, write_message};
