//! Turns the author traits into ABI vtables. Every slot body runs behind one
//! panic boundary ([`guard()`]): a panic becomes `MEMPLUG_STATUS_INTERNAL`
//! with the panic message, an `Err` becomes its code and message. Out-params
//! are written only on success, and never past the host's `struct_size`.
//!
//! Before a vendor's trait method is called, its slot checks everything the
//! ABI lets it check without the vendor's tables (see [`crate::author`] for
//! what each method may assume):
//!
//! * requests (`allocate`, `reserve`, `create`, `import_fd`): no unknown
//!   flag bits and a non-zero size (`INVALID_ARGUMENT`), the mechanism's
//!   device (`WRONG_DEVICE`); for `allocate` also an alignment that is a
//!   power of two no larger than `max_alignment` (`INVALID_ARGUMENT`),
//!   raised to `min_alignment` before the vendor sees it;
//! * every object reference: the mechanism's id (`WRONG_MECHANISM`), then
//!   its device (`WRONG_DEVICE`);
//! * ranges (`commit`, `decommit`, `map` — both ranges — and `unmap`):
//!   non-empty, multiples of the granularity, `offset + len` within 64 bits
//!   (`OUT_OF_RANGE`); the bound against the object's size is the vendor's;
//! * map access bits, NULL and short host structs, NULL out-pointers, NULL
//!   host functions and negative descriptors (`INVALID_ARGUMENT`).
//!
//! * `guard` — the panic boundary and the message sink;
//! * `args` — a slot's arguments read and its out-params written through
//!   the prefix protocol ([`crate::prefix`]);
//! * `context` — the per-mechanism context a slot receives (the vendor's
//!   implementation and the mechanism's id, device and properties) and the
//!   checks above;
//! * `thunks` — the `extern "C"` slot functions, generic over the vendor's
//!   implementation;
//! * `builder` — [`MechanismBuilder`] and [`PluginBuilder`], which freeze
//!   them into descriptors owned by the [`ExportedPlugin`];
//! * `owned` — the heap storage those descriptors point at;
//! * `host_link` — [`HostLink`], the plugin's line to its hosts (ABI 1.2
//!   services): a reported loss latches the mechanism (every slot then
//!   answers `MEMPLUG_STATUS_DEVICE_LOST`) and tells every host;
//! * `entry` — negotiation, the [`PluginCell`] that owns the plugin from
//!   the first negotiation to the last `unload`, and the macros that define
//!   the entry symbol.

mod args;
mod builder;
mod context;
mod entry;
mod guard;
mod host_link;
mod owned;
mod thunks;
mod thunks_1_2;
mod thunks_1_3;

pub use builder::{BuiltMechanism, ExportedPlugin, MechanismBuilder, MechanismState, PluginBuilder};
pub use entry::{negotiate, PluginCell};
pub use guard::{guard, write_message};
pub use host_link::{HostLink, LossReport};
