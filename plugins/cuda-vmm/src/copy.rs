//! The stream-ordered copy (ABI 1.3): `cuMemcpyAsync` on the stream, under
//! unified addressing, so one call copies device to device, host to device
//! and device to host (`MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST`).
//!
//! The ranges are judged against the mechanism's own tables before the
//! driver sees them: a range that meets one of its allocations or
//! reservations must lie wholly inside that allocation, or in committed
//! granules or shared mappings of that reservation (`OUT_OF_RANGE`
//! otherwise, saying which range and why); any other range is host memory,
//! which the caller vouches for. The driver's own refusal of unmapped
//! memory (`CUDA_ERROR_INVALID_VALUE`) would come too, but says neither
//! which range nor why. Peer memory (`MEMPLUG_COPY_PEER`) is not offered:
//! another device's memory is not in this mechanism's tables, so it could
//! not be told from host memory.
//!
//! On a real driver, a copy to or from pageable host memory may return only
//! once it is done (the driver stages it), so the call can wait for the
//! stream's earlier work; pinned host memory avoids that (not made here).

use crate::driver::Entered;
use crate::mechanism::CudaMechanism;
use memplug_sdk::abi::{MEMPLUG_COPY_DEVICE, MEMPLUG_COPY_HOST};
use memplug_sdk::{copy_range_inside, copy_range_unbacked, PluginResult};

/// The spaces this mechanism copies between.
pub const COPY_KINDS: u32 = MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST;

impl CudaMechanism {
    /// Refuses a range that meets this mechanism's memory without lying in
    /// memory a copy may touch (the SDK checked `start + len` fits).
    fn judge_copy_range(&self, which: &str, start: u64, len: u64) -> PluginResult<()> {
        let end = start + len;
        if let Some((addr, size)) = self.allocations.find_map(|a| a.meeting(start, end)) {
            return copy_range_inside(which, start, end, "allocation", addr, size);
        }
        let meeting = |r: &std::sync::Arc<crate::virtual_backing::Reservation>| {
            (r.addr < end && start < r.addr + r.size).then(|| std::sync::Arc::clone(r))
        };
        let Some(r) = self.reservations.find_map(meeting) else {
            return Ok(()); // host memory: the caller's
        };
        copy_range_inside(which, start, end, "reservation", r.addr, r.size)?;
        if !r.state().usable(start - r.addr, end - r.addr, self.granularity.max(1)) {
            return Err(copy_range_unbacked(which, start, end, r.addr));
        }
        Ok(())
    }

    /// `cuMemcpyAsync(dst, src, len)` on `stream` (the SDK has answered
    /// `len` 0 and refused wrapping and overlapping ranges).
    pub(crate) fn copy_on(&self, stream: u64, dst: u64, src: u64, len: u64) -> PluginResult<()> {
        let _slot = self.slot("copy")?;
        self.judge_copy_range("dst", dst, len)?;
        self.judge_copy_range("src", src, len)?;
        let d = self.driver;
        self.with_open_stream(stream, "copy", |s| {
            let _e = Entered::new(d, s.ctx)?;
            // SAFETY: a live stream; both ranges are this mechanism's usable
            // memory or the caller's host memory (judged above), which the
            // ABI makes the caller keep until the copy has run.
            d.check(unsafe { (d.api.memcpy_async)(dst, src, len as usize, s.raw) }, "cuMemcpyAsync")
        })
    }
}
