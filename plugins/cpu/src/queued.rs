//! ABI 1.2 queue-ordered binding on the CPU: `commit_on`, `decommit_on`,
//! `map_on`, `unmap_on`, each returning a fence recorded on the stream.
//!
//! Making a range usable cannot hurt work already queued (that work may
//! not touch a range that was not usable), so `commit_on` and `map_on`
//! change the mapping at once and return a fence that completes when the
//! stream reaches that point: the range is usable in stream order from
//! there on. Giving a range up is what must wait for earlier work, so
//! `decommit_on` and `unmap_on` take the range out of the reservation's
//! state at once (a later call sees it gone: a second decommit is refused,
//! and the range cannot be committed or mapped again until the change has
//! run — `State::draining`) and leave the pages themselves to a job the
//! stream's worker runs in order, before the fence. A reservation released
//! before its stream gets there is left alone by the job (its addresses
//! may already be someone else's); a queued unmap still drops the mapping's
//! reference on the physical object then, so nothing leaks.
//!
//! Every check is made before anything changes, as for the synchronous
//! slots: an unknown stream, a range in the wrong state, a mapping that is
//! not exactly one — each refused with nothing done.

use crate::checks::check_range;
use crate::flavor::Flavor;
use crate::mechanism::CpuMechanism;
use crate::os;
use memplug_sdk::{Access, ObjectRef, PluginError, PluginResult, SharedMapping, StreamSync, VirtualBacking};
use std::sync::Arc;

/// Records the fence that completes when `stream` reaches this point.
fn fence_after<F: Flavor>(m: &CpuMechanism<F>, stream: u64, call: &str) -> PluginResult<u64> {
    m.fence_record(stream).map_err(|e| {
        PluginError::new(
            e.status,
            format!("{call}: the change is made, but no fence could follow it: {}", e.message),
        )
    })
}

pub(crate) fn commit_on<F: Flavor>(
    m: &CpuMechanism<F>,
    reservation: &ObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
) -> PluginResult<u64> {
    m.streams.check_stream(stream)?;
    m.commit(reservation, offset, len)?;
    fence_after(m, stream, "commit_on")
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn map_on<F: Flavor>(
    m: &CpuMechanism<F>,
    object: &ObjectRef,
    object_offset: u64,
    reservation: &ObjectRef,
    offset: u64,
    len: u64,
    access: Access,
    stream: u64,
) -> PluginResult<u64> {
    m.streams.check_stream(stream)?;
    m.map(object, object_offset, reservation, offset, len, access)?;
    fence_after(m, stream, "map_on")
}

pub(crate) fn decommit_on<F: Flavor>(
    m: &CpuMechanism<F>,
    reservation: &ObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
) -> PluginResult<u64> {
    let res = m.reservations.find(reservation)?;
    let mut state = res.lock(reservation)?;
    let end = check_range(offset, len, res.size, m.granularity, "decommit_on")?;
    if !state.committed.covers(offset, end) {
        return Err(PluginError::invalid_state(format!(
            "decommit_on: range [{offset:#x}, {end:#x}) has pages that are not committed; nothing was changed"
        )));
    }
    let held = Arc::clone(&res);
    let job = Box::new(move || {
        let mut state = held.lock_any();
        if !state.is_released() {
            // SAFETY: the reservation is live (its lock is held and it is
            // not released) and the range was committed anonymous memory
            // the host gave up; the draining mark kept anyone from reusing
            // it since.
            // madvise(DONTNEED) and mprotect(PROT_NONE) on a range of our
            // own mapping do not fail in practice; if they do, the pages
            // stay readable and resident, which wastes memory but breaks
            // nothing the host can see (there is no one to tell: the fence
            // carries no status).
            let _ = unsafe { F::decommit(held.addr + offset, len, "decommit_on") };
        }
        state.draining.remove(offset, end);
    });
    // Submitted under the reservation's lock: the job waits for it, so it
    // sees the state below.
    m.streams.submit_job(stream, job, "decommit_on")?;
    state.committed.remove(offset, end);
    state.draining.insert(offset, end);
    drop(state);
    fence_after(m, stream, "decommit_on")
}

pub(crate) fn unmap_on<F: Flavor>(
    m: &CpuMechanism<F>,
    reservation: &ObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
) -> PluginResult<u64> {
    let res = m.reservations.find(reservation)?;
    let mut state = res.lock(reservation)?;
    let (end, mapping) = state.check_unmap(offset, len, res.size, m.granularity, "unmap_on")?;
    let object = mapping.object;
    let held = Arc::clone(&res);
    let physical = Arc::clone(&m.physical);
    let job = Box::new(move || {
        let mut state = held.lock_any();
        if !state.is_released() {
            // SAFETY: the range was exactly one mapping of this live
            // reservation, given up by the host; the draining mark kept it
            // from reuse since.
            // As for a decommit: should it fail, the view stays, nothing
            // else breaks.
            let _ = unsafe { os::restore_reserved(held.addr + offset, len, "unmap_on") };
        }
        state.draining.remove(offset, end);
        drop(state);
        // The mapping's reference goes once the view has (or the release
        // took it).
        physical.drop_mapping(object);
    });
    m.streams.submit_job(stream, job, "unmap_on")?;
    state.mappings.remove(offset);
    state.draining.insert(offset, end);
    drop(state);
    fence_after(m, stream, "unmap_on")
}
