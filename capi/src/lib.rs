//! The memplug host C API: embed the memplug host from C and C++.
//!
//! The header is `include/memplug_host.h`, generated from this crate by
//! cbindgen (`capi/cbindgen.toml`) and checked for drift by
//! `tests/header_drift.rs`. Cargo builds it as `libmemplug_host_capi.so`,
//! `libmemplug_host_capi.a` and an rlib (for Rust tests and benches);
//! CMake installs the C libraries as `libmemplug_host.so` / `.a`.
//!
//! Conventions (modelled on rustls-ffi and wasmtime's C API):
//!
//! * Every exported function runs its body behind one panic boundary
//!   (`error::boundary`): a panic becomes `MEMPLUG_HOST_STATUS_PANIC` with
//!   its message, never an unwind into C (invariant 8).
//! * Fallible functions return a [`MemplugHostStatus`] (`uint32_t`); the
//!   reason is this thread's last error message
//!   (`memplug_host_last_error_message`). Status codes are never
//!   renumbered; 0-14 are the plugin ABI's codes, host codes start at 256.
//! * Out-parameters are written only on success. Structs that can grow
//!   carry `struct_size`.
//! * Objects are generational 64-bit handles resolved through lock-free
//!   tables per manager ([`handle`] packs the bits, [`slot_table`] holds
//!   the objects, `manager_tables` ties them to managers): a stale, forged, wrong-kind or
//!   other-manager handle is refused with a status, never undefined
//!   behaviour. Destroying or freeing the zero handle is a no-op.
//! * Whoever allocates a thing frees it: no heap object changes sides;
//!   strings are copied into caller buffers or fixed fields.

#![deny(missing_docs)]
#![warn(rustdoc::broken_intra_doc_links)]
#![deny(unsafe_op_in_unsafe_fn)]

// The host crate under another name, so that its paths stand apart from
// the C API's `memplug_host_*` items at a glance.
extern crate memplug_host as memplug_host_dep;

pub mod binding;
pub mod cache;
mod callbacks;
pub mod copy;
pub mod dlpack;
pub mod error;
pub mod fence;
pub mod handle;
pub mod lifecycle;
pub mod load_options;
pub mod manager;
mod manager_tables;
pub mod node;
pub mod observe;
pub mod offload;
pub mod peer;
pub mod pool;
pub mod prefix_export;
pub mod region;
mod subscriber;
// Public (hidden) for tests/slot_table_loom.rs.
#[doc(hidden)]
pub mod slot_table;
pub mod stats;
pub mod status;
mod sync;
pub mod types;
pub mod version;

pub use binding::*;
pub use cache::*;
pub use copy::*;
pub use dlpack::*;
pub use error::{memplug_host_last_error_message, memplug_host_last_error_status};
pub use fence::*;
pub use lifecycle::*;
pub use load_options::*;
pub use manager::*;
pub use node::*;
pub use observe::*;
pub use offload::*;
pub use peer::*;
pub use pool::*;
pub use prefix_export::*;
pub use region::*;
pub use stats::*;
pub use status::{memplug_host_status_name, MemplugHostStatus};
pub use types::*;
pub use version::*;
