//! The stream-ordered copy (ABI 1.3): a `memcpy` the stream's worker runs
//! in its place in the queue, so it comes after the host functions and
//! other work submitted before it and before the fences recorded after it.
//!
//! Memory of this mechanism and host memory are one address space here, so
//! the mechanism publishes both spaces (`MEMPLUG_COPY_DEVICE |
//! MEMPLUG_COPY_HOST`) and tells them apart by its own tables: a range that
//! shares a byte with one of its allocations or reservations must lie
//! wholly inside that allocation, or inside committed or mapped parts of
//! that reservation (`OUT_OF_RANGE` otherwise: past an allocation's end,
//! an uncommitted page, a range a queued decommit is giving up); any other
//! range is the caller's host memory, which, as for `memcpy`, only the
//! caller can vouch for. Finding a range is a scan of the live objects: a
//! copy is bulk work, and indexing every allocation by address would cost
//! the allocate/free path, which is benchmarked against malloc.

use crate::flavor::Flavor;
use crate::mechanism::CpuMechanism;
use memplug_sdk::abi::{MEMPLUG_COPY_DEVICE, MEMPLUG_COPY_HOST};
use memplug_sdk::{copy_range_inside, copy_range_unbacked, PluginResult};

/// The spaces this mechanism copies between.
pub const COPY_KINDS: u32 = MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST;

impl<F: Flavor> CpuMechanism<F> {
    /// Refuses a range that meets this mechanism's memory without lying
    /// wholly in memory a copy may touch. The SDK has checked that
    /// `start + len` fits and `len > 0`.
    fn judge_copy_range(&self, which: &str, start: u64, len: u64) -> PluginResult<()> {
        let end = start + len;
        let allocation = self.allocations.meeting(start, end).or_else(|| self.mapped.meeting(start, end));
        if let Some((addr, size)) = allocation {
            return copy_range_inside(which, start, end, "allocation", addr, size);
        }
        let Some(r) = self.reservations.meeting(start, end) else {
            return Ok(()); // host memory: the caller's
        };
        copy_range_inside(which, start, end, "reservation", r.addr, r.size)?;
        let state = r.lock_any();
        if state.is_released() || !state.usable(start - r.addr, end - r.addr) {
            return Err(copy_range_unbacked(which, start, end, r.addr));
        }
        Ok(())
    }

    /// `len` bytes from `src` to `dst` in `stream`'s order (the SDK has
    /// answered `len` 0 and refused wrapping and overlapping ranges).
    pub(crate) fn copy_on(&self, stream: u64, dst: u64, src: u64, len: u64) -> PluginResult<()> {
        self.streams.check_stream(stream)?;
        self.judge_copy_range("dst", dst, len)?;
        self.judge_copy_range("src", src, len)?;
        let job = move || {
            // SAFETY: both ranges were judged above to lie in this
            // mechanism's usable memory or in the caller's host memory, and
            // the ABI makes the caller keep both alive, and unchanged by
            // anything else, until the copy has run (it frees or decommits
            // them only behind a fence recorded after it). They do not
            // overlap (checked by the SDK).
            unsafe { core::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len as usize) }
        };
        self.streams.submit_job(stream, Box::new(job), "copy")
    }
}
