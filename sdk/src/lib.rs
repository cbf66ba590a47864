//! memplug SDK: the plugin ABI and the Rust plugin-author layer.
//!
//! * [`abi`] — the `#[repr(C)]` ABI, major 1; `include/memplug.h` is
//!   generated from it.
//! * [`Status`] — status codes as a Rust enum.
//! * [`descriptor`] — the ABI 1.2 memory descriptor and device identity.
//! * [`copy`] — the ABI 1.3 stream-ordered copy: its address spaces and
//!   the range checks every side makes.
//! * [`author`] — the traits a vendor implements ([`Allocator`] required;
//!   [`VirtualBacking`], [`SharedMapping`], [`StreamSync`] optional).
//! * [`export`] — builders that turn those traits into vtables, checking
//!   every call against the mechanism's id, device and properties before
//!   the trait sees it, and the [`export_plugin!`] macro that defines the
//!   entry symbol. The built plugin is freed when the host calls its
//!   `unload` slot.
//! * [`prefix`] — the `struct_size` prefix protocol (reading and writing
//!   growable structs, reading bounded plugin strings), the one
//!   implementation every reader and writer uses.
//! * [`facts`] — the ABI's facts: struct sizes per minor, and each
//!   vtable's slots (name, offset, need, minor).
//!
//! A vendor writes no `unsafe extern "C"` function: every slot is generated,
//! every panic is caught into `MEMPLUG_STATUS_INTERNAL` with its message.

#![deny(missing_docs)]
#![warn(rustdoc::broken_intra_doc_links)]

pub mod abi;
pub mod author;
pub mod copy;
pub mod descriptor;
pub mod export;
pub mod facts;
pub mod prefix;
pub mod status;

pub use author::*;
pub use copy::{check_copy_ranges, copy_range_inside, copy_range_unbacked, CopyKinds, CopyRangeError};
pub use descriptor::{Descriptor, DeviceIdentity, Handle, HandleRef, Location};
pub use export::{
    BuiltMechanism, ExportedPlugin, HostLink, LossReport, MechanismBuilder, MechanismState, PluginBuilder,
};
pub use status::Status;
