//! The governor: "is there capacity, and whose is it?" (ARCHITECTURE.md §1, §4).
//!
//! The governor charges bytes against the capacity of *pools* (one per
//! physical memory domain). It never allocates, never frees, and never
//! chooses a victim (invariant 5): under pressure it sends *tickets* to
//! registered *holders*, which decide what to give up and release it
//! through the normal paths.
//!
//! # Life of a charge
//!
//! ```text
//!  try_reserve / reserve ──► Grant ──commit(actual)──► Lease ──release──► refunded
//!          │                   │  drop: refunded         │ └─quarantine──► charged for good
//!          └─ OutOfBudget      └─commit_into(&mut lease)─┘    release_part / quarantine_part
//! ```
//!
//! * A [`Grant`] (a provisional charge) is made before the physical memory
//!   exists (invariant 2); dropping it refunds. [`Grant::commit`] charges
//!   the bytes actually obtained: less refunds the rest, more is charged if
//!   it fits or refused with the grant handed back. (Not to be confused
//!   with [`crate::tokens::Reservation`], a virtual backing's address
//!   range.)
//! * A [`Lease`] is a plain token. It ends with [`Pool::release`] once the
//!   physical free completed, or [`Pool::quarantine`] when the plugin could
//!   not complete it (invariant 7: the bytes stay charged, reported apart,
//!   never refunded). A lease dropped without either stays charged and is
//!   counted as leaked — never a silent refund.
//! * Growth commits more bytes into an existing lease
//!   ([`Grant::commit_into`]); shrinking refunds part of one
//!   ([`Pool::release_part`]). Accounting always follows mapped bytes.
//!
//! # Pressure
//!
//! [`Pool::reserve`] asks holders for room when a request does not fit:
//! lowest priority first (ties in registration order), only holders whose
//! priority is at most the requester's, never the requester itself, one at a
//! time, stopping as soon as the request fits, with no lock held during a
//! callback. Then, given a deadline, it waits for refunds — which may arrive
//! late, from deferred frees — and fails with [`OutOfBudget`] (carrying a
//! [`PoolSnapshot`]) when the deadline passes.
//!
//! # Trees of pools
//!
//! A pool may have a parent ([`Governor::create_child_pool`]): a
//! process-wide limit over per-device pools, per-model or per-tenant pools
//! under a device pool. A charge fits only if it fits in the pool and in
//! every ancestor, and is charged at each level, leaf first: a parent's
//! `used` includes its children's charges. A level that has no room
//! refunds the levels already charged, so no level ever exceeds its
//! capacity and nothing leaks; refunds, partial refunds, quarantine and
//! commits of more or less than granted are exact at every level. The
//! refusal ([`OutOfBudget`]) names the chain and the level that was short,
//! and carries that pool's snapshot. Pressure tickets go to the holders
//! under the short pool (that pool and its descendants). Capacities change
//! at run time ([`Pool::set_capacity`]); a child's may exceed its parent's.
//!
//! # Fast path and cost (ARCHITECTURE.md §6)
//!
//! Capacity is one 64-bit word per pool (`used` plus the capacity's
//! offset from the maximum, so a capacity change is one update of the same
//! word): a grant is a compare-exchange loop that never lets the bytes
//! exceed the capacity, a refund one `fetch_sub`; a pool with `k`
//! ancestors costs `k + 1` of each, a pool without a parent one test more. Its top bit says "someone waits", so a refund learns from
//! the value it already read whether to wake anyone. The compare-exchange
//! starts from the value the thread last saw (kept in its shard), so an
//! uncontended grant needs no separate load and a contended one no extra
//! cache-line transfer; a refusal is decided only on a fresh read. Every
//! other figure (per class, per holder) lives in per-thread *shards*
//! written with plain loads and stores: reserve + commit + release costs
//! two locked instructions in all, the same as a bare
//! `fetch_add`/`fetch_sub` pair, plus three thread-local lookups. No lock,
//! no allocation, no reference counting: grants borrow their pool and
//! leases are plain tokens. (`benches/governor.rs` measures it against the
//! pair.)
//!
//! The price is in snapshots: per-class figures are exact whenever no
//! operation is in flight, and approximate (each clamped at zero) while
//! other threads operate; `used`, `free`, `capacity` and `peak` are always
//! exact (`peak` but for a charge racing a capacity change, see
//! [`PoolSnapshot::peak`]). The exact peak is kept per pool only: a
//! per-class peak kept exactly would need a shared counter per class on the
//! fast path, so per-class peaks are sampled (see [`stats`]). Cumulative
//! bytes granted are one more counter of the shard's line; bytes released
//! are derived from it. Events (`crate::events`) cost a grant one relaxed
//! load of a process-wide word while nobody listens.
//!
//! # Thread-safety
//!
//! Every public type is `Send + Sync` (tokens are `Send + Sync` values);
//! every method may be called from any thread at any time, including from
//! inside a pressure callback. Items document their locking.

mod error;
mod events;
mod grant;
mod holder;
mod level;
mod pool;
mod shard;
mod source;
pub mod stats;
mod tree;

pub use crate::ids::{AllocationClass, HolderId, PoolId, Priority};
pub use error::{ChargePath, GovernorError, OutOfBudget, Rejected};
pub use grant::{Grant, Lease};
pub use holder::{HolderRegistration, PressureCallback, PressureTicket};
pub use level::MAX_CAPACITY;
pub(crate) use pool::Discharge;
pub use pool::{Pool, REASK_MAX};
pub use source::BudgetSource;
pub use stats::{ClassStats, HolderStats, PoolSnapshot, PressureStats};

use crate::events::Hub;
use crate::sync::{lock, Mutex};
use std::sync::Arc;

/// The process's budgets: a set of pools.
///
/// Thread-safety: `Send + Sync`; every method takes a short internal lock
/// (pool creation and lookup are not on any hot path — callers keep the
/// `Arc<Pool>`).
pub struct Governor {
    pools: Mutex<Vec<Arc<Pool>>>,
    /// Where its pools' events go.
    hub: Arc<Hub>,
}

impl Governor {
    /// An empty governor, with a hub of its own.
    pub fn new() -> Arc<Governor> {
        Self::with_hub(Hub::new())
    }

    /// An empty governor whose pools' events go to `hub`.
    pub fn with_hub(hub: Arc<Hub>) -> Arc<Governor> {
        Arc::new(Governor { pools: Mutex::new(Vec::new()), hub })
    }

    /// Where its pools' events go.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Creates a pool of `capacity_bytes` for one physical memory domain.
    /// Names are unique within a governor.
    pub fn create_pool(&self, name: &str, capacity_bytes: u64) -> Result<PoolId, GovernorError> {
        let mut pools = lock(&self.pools);
        if pools.iter().any(|p| p.name() == name) {
            return Err(GovernorError::DuplicatePool { name: name.to_owned() });
        }
        let pool = Pool::new(name, capacity_bytes, self.hub.clone())?;
        let id = pool.id();
        pools.push(pool);
        Ok(id)
    }

    /// Creates a pool of `capacity_bytes` under `parent` (a pool of this
    /// governor, by id or by reference): every charge made in it must fit
    /// in it and in every ancestor, and is charged at each (a parent's
    /// `used` includes its children's charges). A child's capacity may
    /// exceed its parent's: the smaller limit binds. Names are unique
    /// within a governor; a parent this governor does not have is
    /// [`GovernorError::UnknownPool`].
    ///
    /// The child holds its parent alive. Thread-safety: as
    /// [`create_pool`](Self::create_pool).
    pub fn create_child_pool(
        &self,
        name: &str,
        parent: impl Into<PoolId>,
        capacity_bytes: u64,
    ) -> Result<PoolId, GovernorError> {
        let parent = parent.into();
        let mut pools = lock(&self.pools);
        if pools.iter().any(|p| p.name() == name) {
            return Err(GovernorError::DuplicatePool { name: name.to_owned() });
        }
        let Some(parent) = pools.iter().find(|p| p.id() == parent).cloned() else {
            return Err(GovernorError::UnknownPool { pool: parent });
        };
        let pool = Pool::new_under(name, capacity_bytes, parent)?;
        let id = pool.id();
        pools.push(pool);
        Ok(id)
    }

    /// The pool with this id, if this governor made it.
    pub fn pool(&self, id: PoolId) -> Option<Arc<Pool>> {
        lock(&self.pools).iter().find(|p| p.id() == id).cloned()
    }

    /// The pool with this name.
    pub fn pool_by_name(&self, name: &str) -> Option<Arc<Pool>> {
        lock(&self.pools).iter().find(|p| p.name() == name).cloned()
    }

    /// Every pool, in creation order.
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        lock(&self.pools).clone()
    }

    /// A snapshot of every pool, in creation order.
    pub fn snapshot(&self) -> Vec<PoolSnapshot> {
        self.pools().iter().map(|p| p.snapshot()).collect()
    }
}

impl std::fmt::Debug for Governor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Governor").field("pools", &*lock(&self.pools)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_and_sync() {
        assert_send_sync::<Governor>();
        assert_send_sync::<Pool>();
        assert_send_sync::<Grant<'static>>();
        assert_send_sync::<Lease>();
        assert_send_sync::<HolderRegistration>();
        assert_send_sync::<PressureTicket>();
        assert_send_sync::<OutOfBudget>();
        assert_send_sync::<GovernorError>();
        assert_send_sync::<Rejected<Lease>>();
        assert_send_sync::<PoolSnapshot>();
        assert_send_sync::<HolderStats>();
    }

    #[test]
    fn token_sizes_stay_small() {
        assert!(std::mem::size_of::<Lease>() <= 32);
        assert!(std::mem::size_of::<Grant<'static>>() <= 32);
        assert!(std::mem::size_of::<Result<Grant<'static>, GovernorError>>() <= 48);
    }

    #[test]
    fn duplicate_pool_names_are_refused() {
        let g = Governor::new();
        let id = g.create_pool("gpu0", 1 << 20).unwrap();
        assert!(matches!(g.create_pool("gpu0", 1), Err(GovernorError::DuplicatePool { .. })));
        assert_eq!(g.pool(id).unwrap().name(), "gpu0");
        assert_eq!(g.pool_by_name("gpu0").unwrap().id(), id);
        assert_eq!(g.snapshot().len(), 1);
    }
}
