//! Reservations: the table of address ranges handed out by `reserve`, and
//! the state of each (committed pages, shared mappings).
//!
//! Each reservation has its own lock so that a long commit or decommit of
//! one range does not stall every other reservation. The table lock is only
//! held to find a reservation; the work happens under the reservation's
//! lock. A released reservation leaves the table, then is flagged under
//! that lock, so a caller that found it just before the release sees the
//! flag and touches no address that may already belong to someone else.
//! One that nobody else holds is emptied instead and kept for reuse.

use crate::checks::unknown;
use crate::handles::{handle_of, key_of};
use crate::mappings::{Mapping, Mappings};
use crate::os::Guarded;
use crate::ranges::RangeSet;
use memplug_sdk::{ObjectRef, PluginError, PluginResult};
use slab::Slab;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

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
    pub mappings: Mappings,
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
        self.mappings.last_before(end, false).is_some_and(|(s, m)| s + m.len > start)
    }

    /// Whether every byte of the non-empty `[start, end)` is committed or
    /// mapped, the ranges a copy may touch (a range a queued change is
    /// giving up is neither).
    pub fn usable(&self, start: u64, end: u64) -> bool {
        let mut at = start;
        while at < end {
            let mapping_end = self.mappings.last_before(at, true).map(|(s, m)| s + m.len);
            match self.committed.end_of_run(at).or(mapping_end.filter(|&e| e > at)) {
                Some(e) => at = e,
                None => return false,
            }
        }
        true
    }

    /// Takes the shared mappings (`None` when there are none) and forgets
    /// the committed and draining ranges: the state of a reservation that
    /// is being released. An empty vector of mappings is left in place,
    /// with its room for a spare's next use (taking and walking it cost
    /// ~50 instructions for nothing); a tree is taken even when empty, so
    /// that a spare starts with a vector again.
    fn empty(&mut self) -> Option<Mappings> {
        self.committed.clear();
        self.draining.clear();
        let keep = matches!(&self.mappings, Mappings::Few(v) if v.is_empty());
        (!keep).then(|| std::mem::take(&mut self.mappings))
    }

    /// Whether the reservation was released (for work queued before the
    /// release, which must then touch none of its addresses).
    pub fn is_released(&self) -> bool {
        self.released
    }

    /// The checks of `unmap` and `unmap_on`: the range is in bounds and
    /// exactly one mapping starts at `offset` and spans `len`. Returns the
    /// end of the range and the mapping.
    pub fn check_unmap(
        &self,
        offset: u64,
        len: u64,
        limit: u64,
        granularity: u64,
        call: &str,
    ) -> PluginResult<(u64, Mapping)> {
        let end = crate::checks::check_range(offset, len, limit, granularity, call)?;
        let wrong = |msg: String| PluginError::invalid_state(format!("{msg}; nothing was changed"));
        match self.mappings.get(offset) {
            Some(m) if m.len == len => Ok((end, m)),
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

/// A reservation: its identity, unchanged while anyone but the table can
/// reach it (a spare one gets a new one, see `Reservations::insert`), plus
/// locked state.
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

    /// Puts a spare reservation (nobody else holds it: `Arc::get_mut`
    /// succeeded) to use for a new range; its state was emptied when it
    /// became spare.
    #[inline(always)]
    fn reuse(&mut self, object_id: u64, g: Guarded, size: u64) {
        self.object_id = object_id;
        self.addr = g.addr;
        self.size = size;
        self.mapped_start = g.mapped_start;
        self.mapped_len = g.mapped_len;
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

/// What `release` still has to do once a reservation is out of the table
/// and marked released: give back its mappings and its address range.
pub struct Retired {
    /// The whole mapping made for the range (`Reservation::mapped_start`).
    pub mapped_start: u64,
    /// Bytes of that mapping.
    pub mapped_len: u64,
    /// Its shared mappings, whose references on their physical objects
    /// must be dropped (`None` when it had none, see `State::empty`).
    pub mappings: Option<Mappings>,
}

/// At most this many released reservations are kept for reuse. Why keep
/// any: a reserve + release pair spent ~190 instructions and two atomic
/// operations allocating, dropping and freeing the reservation (callgrind
/// `reserve`); a spare one is reused under the table lock `reserve` takes
/// anyway. A few cover a caller that holds several reservations at once;
/// each costs ~200 bytes.
const SPARES: usize = 8;

/// Live reservations, and released ones kept for reuse.
#[derive(Default)]
pub struct Reservations {
    inner: Mutex<Inner>,
}

/// The state behind the table lock.
#[derive(Default)]
struct Inner {
    /// Live reservations by slab key (`handles::key_of`).
    live: Slab<Arc<Reservation>>,
    /// Released reservations nobody else held, their state emptied: never
    /// cloned while here, so each is unique when taken out again.
    spare: Vec<Arc<Reservation>>,
}

impl Reservations {
    /// Locks the table; poison is ignored for the reason given in
    /// `handles.rs`.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Number of live reservations (spares are not).
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// Records a new reservation of `size` bytes at `g.addr` with nothing
    /// committed, and returns its handle: a spare one put to use if there
    /// is one, else a new one, built here from its fields so that it is
    /// written straight into its allocation (built by the caller, its ~170
    /// bytes were copied twice on the way).
    pub fn insert(&self, object_id: u64, g: Guarded, size: u64) -> u64 {
        let mut t = self.lock();
        let reused = t.spare.pop().and_then(|mut r| {
            // Always unique (see `Inner::spare`); were it not, it would be
            // left to whoever holds it and a new one made.
            Arc::get_mut(&mut r)?.reuse(object_id, g, size);
            Some(r)
        });
        let r = reused.unwrap_or_else(|| Arc::new(Reservation::new(object_id, g, size)));
        handle_of(t.live.insert(r))
    }

    /// Finds the reservation `obj` names by its handle (the SDK has checked
    /// its mechanism and device).
    pub fn find(&self, obj: &ObjectRef) -> PluginResult<Arc<Reservation>> {
        key_of(obj.handle)
            .and_then(|key| self.lock().live.get(key).filter(|r| r.is(obj)).map(Arc::clone))
            .ok_or_else(|| unknown(obj, "reservation"))
    }

    /// The first live reservation that shares a byte with `[start, end)`
    /// (a scan: reservations are few, and a copy is not a hot path).
    pub fn meeting(&self, start: u64, end: u64) -> Option<Arc<Reservation>> {
        self.lock().live.iter().map(|(_, r)| r).find(|r| r.addr < end && start < r.addr + r.size).cloned()
    }

    /// Takes the reservation `obj` names out of the table and marks it
    /// released (`release`): one lookup under one lock, so of two racing
    /// releases exactly one gets it and the other is refused as for a
    /// handle never made.
    ///
    /// A call that found it before, or a queued job, may still hold it:
    /// then the flag is set under its lock, which they take before
    /// touching an address, and the last of them frees it. When nobody
    /// does, nobody can ever see it again: it is emptied under the table
    /// lock, without its own, and kept as a spare (the flag is left unset
    /// for its next use).
    pub fn retire(&self, obj: &ObjectRef) -> PluginResult<Retired> {
        let refused = || unknown(obj, "reservation");
        let key = key_of(obj.handle).ok_or_else(refused)?;
        let mut t = self.lock();
        if !t.live.get(key).is_some_and(|r| r.is(obj)) {
            return Err(refused());
        }
        let mut r = t.live.remove(key);
        let (mapped_start, mapped_len) = (r.mapped_start, r.mapped_len);
        if let Some(unique) = Arc::get_mut(&mut r) {
            let state = unique.state.get_mut().unwrap_or_else(PoisonError::into_inner);
            let mappings = state.empty();
            // Dropped (freed) after the table lock, when there are enough.
            let extra = if t.spare.len() < SPARES {
                t.spare.push(r);
                None
            } else {
                Some(r)
            };
            drop(t);
            drop(extra);
            return Ok(Retired { mapped_start, mapped_len, mappings });
        }
        drop(t);
        let mut state = r.lock_any();
        state.released = true;
        let mappings = state.empty();
        Ok(Retired { mapped_start, mapped_len, mappings })
    }
}
