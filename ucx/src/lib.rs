//! memplug memory on the wire: regions, allocations and shared prefixes
//! registered with UCX's UCP API, their remote keys sent to a peer, and
//! one-sided reads and writes between processes and nodes — with memplug's
//! guarantees kept across the wire:
//!
//! * **residency** — a registered range is pinned: its shrink, offload,
//!   privatise and release wait (or refuse with `Busy`) until it is
//!   deregistered, and an owner deregisters only once the peer released
//!   the key or acknowledged a revoke ([`Registration`], [`Peer::revoke`]);
//!   a context loss deregisters first;
//! * **ordering** — a transfer's completion is a memplug fence
//!   ([`Transfer::fence`]), recorded on the local memory, so frees order
//!   behind remote transfers;
//! * **budget** — the receiving side charges its pool before any byte moves
//!   ([`Peer::pull_into_region`] grows first; `OutOfBudget` moves nothing);
//! * **faults** — a lost peer, a failed endpoint, a released or revoked
//!   range: each a distinct [`UcxError`]; every wait has a deadline
//!   ([`ErrorHandling`] says what a deadline can cancel).
//!
//! A region that grows is registered part by part
//! ([`GrowingRegistration`]). Regions are taken as a [`LocalRegion`]: an
//! owned `Region` or a `SharedRegion` (the Python binding's, shared with
//! its DLPack views). Allocations are taken as a [`LocalAllocation`]: an
//! `OwnedAllocation`, a caching binding's `CachedAllocation` (registered
//! or with a transfer in flight, a freed block is reused by nobody until
//! then), or the Python binding's; whole
//! ([`Ucx::register_allocation`]) or in part
//! ([`Ucx::register_allocation_range`]). The C API (`memplug_host_ucx_*`, feature `ucx` of
//! `memplug-host-capi`), `memplug_ucx.hpp` and the Python module's `Ucx*`
//! classes are thin layers over this crate. The control stream between two peers (a Unix
//! socket, or TCP between nodes) must connect trusted processes: UCX aborts
//! on a malformed worker address, and only damage and foreign formats are
//! caught before it reads one.
//!
//! UCX is opened at run time (`libucp.so.0`, see `sys.rs`): the crate builds
//! without it, and [`Ucx::available`] says why it cannot be used.
//! Transports are UCX's choice under `UCX_TLS` (TCP and shared memory are
//! tested here; InfiniBand/RoCE use the same calls, untested here).

mod context;
mod error;
mod growth;
mod local;
mod move_memory;
mod peer;
mod registration;
#[doc(hidden)]
pub mod sys;
mod transfer;
mod wire;

pub use context::Ucx;
pub use error::UcxError;
pub use growth::GrowingRegistration;
pub use local::{LocalAllocation, LocalRegion};
pub use peer::{ControlStream, Peer, RemoteRange};
pub use registration::{Access, Registration};
pub use transfer::{ErrorHandling, Transfer};
