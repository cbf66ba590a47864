//! The stream-ordered copy (ABI 1.3): `cuMemcpyAsync` on the stream, under
//! unified addressing, so one call copies device to device, host to device
//! and device to host (`MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST`).
//!
//! The ranges are judged against the mechanism's own tables before the
//! driver sees them: a range that meets one of its allocations or
//! reservations must lie wholly inside that allocation, or in committed
//! granules or shared mappings of that reservation (`OUT_OF_RANGE`
//! otherwise, saying which range and why). The two mechanisms of a device
//! (device memory and pinned host memory, `pinned.rs`) also judge each
//! other's memory the same way: a range meeting a pinned block must lie
//! inside it, and on the pinned mechanism (whose `MEMPLUG_COPY_DEVICE` is
//! its blocks and the device mechanism's memory) a range meeting the
//! device's memory follows the device's rules. Any other range is host
//! memory, which the caller vouches for. The driver's own refusal of unmapped
//! memory (`CUDA_ERROR_INVALID_VALUE`) would come too, but says neither
//! which range nor why. Peer memory (`MEMPLUG_COPY_PEER`) is not offered:
//! another device's memory is not in this mechanism's tables, so it could
//! not be told from host memory.
//!
//! On a real driver, a copy to or from pageable host memory may return only
//! once it is done (the driver stages it), so the call can wait for the
//! stream's earlier work; pinned host memory (the `cuda<N>-host`
//! mechanism's) avoids that.

use crate::allocator::Allocation;
use crate::driver::Entered;
use crate::handles::Table;
use crate::mechanism::{CudaMechanism, MechanismKind, Sibling};
use memplug_sdk::abi::{MEMPLUG_COPY_DEVICE, MEMPLUG_COPY_HOST};
use memplug_sdk::{copy_range_inside, copy_range_unbacked, PluginResult};

/// The spaces this mechanism copies between.
pub const COPY_KINDS: u32 = MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST;

impl CudaMechanism {
    /// Refuses a range that meets this mechanism's memory, or its sibling's
    /// (see the module docs), without lying in memory a copy may touch (the
    /// SDK checked `start + len` fits).
    fn judge_copy_range(&self, which: &str, start: u64, len: u64) -> PluginResult<()> {
        if let Some(verdict) = self.judge_own(which, start, start + len) {
            return verdict;
        }
        match &self.sibling {
            Sibling::None => Ok(()),
            Sibling::PinnedBlocks(blocks) => {
                judge_blocks(blocks, which, start, start + len, "pinned block").unwrap_or(Ok(()))
            }
            Sibling::Device(device) => device.judge_own(which, start, start + len).unwrap_or(Ok(())),
        }
    }

    /// The verdict on `[start, end)` when it meets this mechanism's own
    /// allocations or reservations; `None` when it meets neither.
    fn judge_own(&self, which: &str, start: u64, end: u64) -> Option<PluginResult<()>> {
        let what = match self.kind {
            MechanismKind::Device => "allocation",
            MechanismKind::PinnedHost => "pinned block",
        };
        if let Some(verdict) = judge_blocks(&self.allocations, which, start, end, what) {
            return Some(verdict);
        }
        let meeting = |r: &std::sync::Arc<crate::virtual_backing::Reservation>| {
            // A reservation being released is not there for a copy (its
            // addresses may already belong to a new one).
            let leaving = r.leaving.load(std::sync::atomic::Ordering::Acquire);
            (!leaving && r.addr < end && start < r.addr + r.size).then(|| std::sync::Arc::clone(r))
        };
        let r = self.reservations.find_map(meeting)?;
        Some(copy_range_inside(which, start, end, "reservation", r.addr, r.size).and_then(|()| {
            if r.state().usable(start - r.addr, end - r.addr, self.granularity.max(1)) {
                Ok(())
            } else {
                Err(copy_range_unbacked(which, start, end, r.addr))
            }
        }))
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

/// The verdict on `[start, end)` when it meets one of `blocks` (each called
/// `what` in the message): it must lie wholly inside that block; `None`
/// when it meets none.
fn judge_blocks(
    blocks: &Table<Allocation>,
    which: &str,
    start: u64,
    end: u64,
    what: &str,
) -> Option<PluginResult<()>> {
    let (addr, size) = blocks.find_map(|a| a.meeting(start, end))?;
    Some(copy_range_inside(which, start, end, what, addr, size))
}
