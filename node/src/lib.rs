//! One memplug budget for every process on a device.
//!
//! A **node authority** ([`Authority`], or `memplug node serve`) owns each
//! device's capacity and leases it to processes in chunks over a Unix
//! socket. A process joins its root pools with a [`NodeLink`]: a pool's
//! capacity is then what the authority leased to it, a grant inside it
//! never leaves the process, a request past it asks the authority, and the
//! authority, when it has nothing free, sends pressure tickets to other
//! processes, whose pools hand them to their holders exactly as an
//! in-process ticket. A process that dies has its leases reclaimed at once
//! and once; an authority that dies leaves every process running on what
//! it holds until a new one starts and learns it.
//!
//! * `wire.rs` — the frames on the socket;
//! * `books.rs` — the authority's books (pure: model-tested);
//! * `peer.rs` — a peer's credentials and liveness (`SO_PEERCRED`, pidfd);
//! * `authority.rs` — the authority's threads;
//! * `link.rs` — a process's side;
//! * `gate.rs` — the link's rule for changing a pool's capacity (loom-tested).

mod authority;
pub mod books;
// Public (hidden) for tests/link_loom.rs.
#[doc(hidden)]
pub mod gate;
mod link;
mod peer;
mod sync;
pub mod wire;

pub use authority::{Authority, AuthorityConfig, BooksView};
pub use link::{LinkDevice, LinkOptions, LinkStats, NodeLink};

/// The environment variable naming the socket a process joins by
/// configuration ([`join_from_env`]).
pub const SOCKET_ENV: &str = "MEMPLUG_NODE_SOCKET";

/// Set to `1`, an authority watches its members' liveness through `/proc`
/// instead of pidfds: the fallback taken where `pidfd_open` fails (a
/// kernel before 5.3, valgrind 3.19), forced so tests run it anywhere.
pub use peer::NO_PIDFD_ENV;

/// Joins `devices` to the authority named by `MEMPLUG_NODE_SOCKET`, if
/// set: `Ok(None)` when it is not (the in-process governor stays as it is).
pub fn join_from_env(devices: Vec<LinkDevice>) -> std::io::Result<Option<NodeLink>> {
    match std::env::var_os(SOCKET_ENV) {
        None => Ok(None),
        Some(path) => NodeLink::join(path, devices, LinkOptions::default()).map(Some),
    }
}
