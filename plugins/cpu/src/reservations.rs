//! Reservations: the table of address ranges handed out by `reserve`, and
//! the state of each (committed pages, shared mappings).
//!
//! Each reservation has its own lock so that a long commit or decommit of
//! one range does not stall every other reservation. The table lock is only
//! held to find a reservation; the work happens under the reservation's
//! lock. A released reservation is flagged under that lock before it leaves
//! the table, so a caller that found it just before the release sees the
//! flag and touches no address that may already belong to someone else.

use crate::checks::unknown;
use crate::handles::Table;
use crate::os::Guarded;
use crate::ranges::RangeSet;
use memplug_sdk::{ObjectRef, PluginError, PluginResult};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// One shared mapping inside a reservation.
pub struct Mapping {
    /// Length in bytes; an unmap must name exactly this.
    pub len: u64,
    /// Handle of the physical object mapped here; the mapping holds one of
    /// its references.
    pub object: u64,
}

/// Mutable state of a reservation.
#[derive(Default)]
pub struct State {
    /// Set once the address range has been given back; every later call
    /// through a stale `Arc` must refuse.
    released: bool,
    /// Committed ranges, as offsets into the reservation.
    pub committed: RangeSet,
    /// Shared mappings by starting offset; they never overlap each other
    /// or committed ranges.
    pub mappings: BTreeMap<u64, Mapping>,
    /// Ranges given up by a queued `decommit_on`/`unmap_on` whose stream
    /// has not reached it yet: neither committed nor mapped any more, but
    /// not to be committed or mapped again before the change has run.
    pub draining: RangeSet,
}

impl State {
    /// Whether any shared mapping overlaps `[start, end)`.
    pub fn mapped(&self, start: u64, end: u64) -> bool {
        // Mappings are disjoint and sorted by start: only the last one
        // starting before `end` can reach past `start`.
        self.mappings.range(..end).next_back().is_some_and(|(&s, m)| s + m.len > start)
    }

    /// Whether every byte of the non-empty `[start, end)` is committed or
    /// mapped, the ranges a copy may touch (a range a queued change is
    /// giving up is neither).
    pub fn usable(&self, start: u64, end: u64) -> bool {
        let mut at = start;
        while at < end {
            let mapping_end = self.mappings.range(..=at).next_back().map(|(&s, m)| s + m.len);
            match self.committed.end_of_run(at).or(mapping_end.filter(|&e| e > at)) {
                Some(e) => at = e,
                None => return false,
            }
        }
        true
    }

    /// Whether the reservation was released (for work queued before the
    /// release, which must then touch none of its addresses).
    pub fn is_released(&self) -> bool {
        self.released
    }

    /// The checks of `unmap` and `unmap_on`: the range is in bounds and
    /// exactly one mapping starts at `offset` and spans `len`. Returns the
    /// end of the range.
    pub fn check_unmap(
        &self,
        offset: u64,
        len: u64,
        limit: u64,
        granularity: u64,
        call: &str,
    ) -> PluginResult<u64> {
        let end = crate::checks::check_range(offset, len, limit, granularity, call)?;
        let wrong = |msg: String| PluginError::invalid_state(format!("{msg}; nothing was changed"));
        match self.mappings.get(&offset) {
            Some(m) if m.len == len => Ok(end),
            Some(m) => Err(wrong(format!(
                "{call}: the mapping at offset {offset:#x} spans {:#x} bytes, not {len:#x}",
                m.len
            ))),
            None => Err(wrong(format!(
                "{call}: no mapping starts at offset {offset:#x} (range [{offset:#x}, {end:#x}))"
            ))),
        }
    }

    /// `INVALID_STATE` when `[start, end)` meets a range a queued change
    /// has not finished giving up.
    pub fn check_not_draining(&self, call: &str, start: u64, end: u64) -> PluginResult<()> {
        if self.draining.intersects(start, end) {
            return Err(PluginError::invalid_state(format!(
                "{call}: range [{start:#x}, {end:#x}) meets a queued decommit or unmap that has not run yet \
                 (wait for its fence); nothing was changed"
            )));
        }
        Ok(())
    }
}

/// A reservation: immutable identity plus locked state.
pub struct Reservation {
    /// Host-assigned id given at `reserve`.
    pub object_id: u64,
    /// First byte of the range.
    pub addr: u64,
    /// Bytes in the range (a multiple of the granularity).
    pub size: u64,
    /// The whole mapping made for the range, its guards included
    /// (`os::reserve_guarded`): what `release` gives back.
    pub mapped_start: u64,
    /// Bytes of that mapping.
    pub mapped_len: u64,
    state: Mutex<State>,
}

impl Reservation {
    /// A reservation of `size` bytes at `g.addr` with nothing committed.
    #[inline(always)]
    fn new(object_id: u64, g: Guarded, size: u64) -> Self {
        Reservation {
            object_id,
            addr: g.addr,
            size,
            mapped_start: g.mapped_start,
            mapped_len: g.mapped_len,
            state: Mutex::new(State::default()),
        }
    }

    fn is(&self, obj: &ObjectRef) -> bool {
        self.object_id == obj.object_id && self.addr == obj.addr && self.size == obj.size
    }

    /// Locks the state whatever it is (work a stream runs after a release
    /// must see the flag, not be refused).
    pub fn lock_any(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks a reservation just taken out of the table released and takes
    /// its shared mappings (`None` when it has none). Nothing can find it
    /// any more, but a call that found it before, or a queued job, may
    /// still hold it: then the flag is set under the lock, which they take
    /// before touching an address. When nobody does, the state is reached
    /// without the lock (one atomic operation instead of two on every
    /// release).
    pub fn retire(this: &mut Arc<Self>) -> Option<BTreeMap<u64, Mapping>> {
        fn retire(state: &mut State) -> Option<BTreeMap<u64, Mapping>> {
            state.released = true;
            // An empty map is left for the state's drop: taking it and
            // iterating it cost ~50 instructions for nothing.
            (!state.mappings.is_empty()).then(|| std::mem::take(&mut state.mappings))
        }
        match Arc::get_mut(this) {
            Some(r) => retire(r.state.get_mut().unwrap_or_else(PoisonError::into_inner)),
            None => retire(&mut this.lock_any()),
        }
    }

    /// Locks the state, refusing (`UNKNOWN_ALLOCATION`) a reservation that
    /// was released after `obj` found it. Poison is ignored for the reason
    /// given in `handles.rs`.
    pub fn lock(&self, obj: &ObjectRef) -> PluginResult<MutexGuard<'_, State>> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.released {
            return Err(unknown(obj, "reservation"));
        }
        Ok(state)
    }
}

/// Live reservations.
#[derive(Default)]
pub struct Reservations {
    table: Table<Arc<Reservation>>,
}

impl Reservations {
    /// Number of live reservations.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Records a new reservation of `size` bytes at `g.addr` with nothing
    /// committed, and returns its handle. Built here, from its fields, so
    /// that it is written straight into its allocation: built by the
    /// caller, its ~170 bytes were copied twice on the way (~60
    /// instructions of every `reserve`).
    pub fn insert(&self, object_id: u64, g: Guarded, size: u64) -> u64 {
        self.table.insert(Arc::new(Reservation::new(object_id, g, size)))
    }

    /// Finds the reservation `obj` names by its handle (the SDK has checked
    /// its mechanism and device).
    pub fn find(&self, obj: &ObjectRef) -> PluginResult<Arc<Reservation>> {
        self.table
            .with(obj.handle, |r| r.is(obj), |r| Arc::clone(r))
            .ok_or_else(|| unknown(obj, "reservation"))
    }

    /// The first live reservation that shares a byte with `[start, end)`
    /// (a scan: reservations are few, and a copy is not a hot path).
    pub fn meeting(&self, start: u64, end: u64) -> Option<Arc<Reservation>> {
        self.table.lock().iter().map(|(_, r)| r).find(|r| r.addr < end && start < r.addr + r.size).cloned()
    }

    /// Takes the reservation `obj` names out of the table (`release`): one
    /// lookup under one lock, so of two racing releases exactly one gets
    /// it and the other is refused as for a handle never made.
    pub fn take(&self, obj: &ObjectRef) -> PluginResult<Arc<Reservation>> {
        self.table.remove(obj.handle, |r| r.is(obj)).ok_or_else(|| unknown(obj, "reservation"))
    }
}
