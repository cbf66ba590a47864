//! The plugin as the kit sees it: its strings read through the SDK's
//! bounded reader (its descriptors are read as untrusted prefixes through
//! `memplug_sdk::prefix`, in `checks/descriptor.rs`), and one wrapper per
//! slot that passes a recording sink and a guarded output buffer (so a
//! write past `struct_size`, or a write on failure, is noticed), and logs
//! the call.

mod fds;
mod guarded;
mod mech;
mod names;
mod queued;

pub(crate) use fds::*;
pub(crate) use guarded::*;
pub(crate) use mech::*;
pub(crate) use names::*;
pub(crate) use queued::*;
