//! Budget that comes from outside the process: a pool whose capacity is
//! what another party (a node authority shared by every process on a
//! device) has leased to this process. The pool asks its [`BudgetSource`]
//! for more before it asks its own holders; the source raises the pool's
//! capacity by what it obtained. Grants inside the capacity already held
//! never reach the source: the fast path is unchanged.

use super::pool::Pool;
use crate::ids::AllocationClass;
use crate::ids::Priority;
use std::sync::Arc;
use std::time::Instant;

/// Where a pool's budget comes from when it is not fixed
/// ([`Pool::set_budget_source`]).
pub trait BudgetSource: Send + Sync {
    /// `pool` is short of `missing` bytes for a request that may wait until
    /// `deadline` (`None`: it may not wait; a source still answers in a
    /// bounded time). Obtain budget and raise the pool's capacity by it
    /// (`Pool::set_capacity`; a raise always succeeds); return the bytes
    /// added (0: none could be had). Called with no governor lock held, on
    /// the requesting thread; never from inside a pressure callback of the
    /// same pool tree.
    fn acquire(&self, pool: &Pool, missing: u64, deadline: Option<Instant>) -> u64;

    /// [`BudgetSource::acquire`] for a request of `class` made at
    /// `priority` (its holder's, or [`Priority::HIGHEST`] without one): a
    /// source that presses others (a node authority) asks only those of
    /// equal or lower priority and tells their holders the class, as the
    /// governor does in a process. By default the request is `acquire`d.
    fn acquire_for(
        &self,
        pool: &Pool,
        missing: u64,
        class: AllocationClass,
        priority: Priority,
        deadline: Option<Instant>,
    ) -> u64 {
        let _ = (class, priority);
        self.acquire(pool, missing, deadline)
    }
}

impl Pool {
    /// Makes `source` this pool's source of budget: a request the pool's
    /// capacity cannot hold asks the source for the bytes missing before
    /// asking holders. Once per pool; a second source is refused (returned).
    pub fn set_budget_source(&self, source: Arc<dyn BudgetSource>) -> Result<(), Arc<dyn BudgetSource>> {
        self.source.set(source)
    }

    /// Whether this pool already has a source (a second one is refused).
    pub fn has_budget_source(&self) -> bool {
        self.source.get().is_some()
    }

    /// Whether this pool or an ancestor takes budget from a source (its
    /// capacity may grow: a request above it may still be served).
    pub(super) fn has_source(&self) -> bool {
        let mut level = Some(self);
        while let Some(p) = level {
            if p.source.get().is_some() {
                return true;
            }
            level = p.level.parent().map(|p| &**p);
        }
        false
    }

    /// Asks the sources of this pool and its ancestors that cannot hold
    /// `bytes` for what they miss; true when any capacity was added.
    pub(super) fn ask_sources(
        &self,
        bytes: u64,
        class: AllocationClass,
        priority: Priority,
        deadline: Option<Instant>,
    ) -> bool {
        let mut added = false;
        let mut level = Some(self);
        while let Some(p) = level {
            if let Some(src) = p.source.get() {
                let missing = bytes.saturating_sub(p.free());
                if missing > 0 && !super::holder::in_pressure_near(&p.lineage) {
                    added |= src.acquire_for(p, missing, class, priority, deadline) > 0;
                }
            }
            level = p.level.parent().map(|p| &**p);
        }
        added
    }
}
