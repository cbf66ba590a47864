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
//! device's memory follows the device's rules. The driver's own refusal
//! of unmapped memory (`CUDA_ERROR_INVALID_VALUE`) would come too, but
//! says neither which range nor why.
//!
//! What the driver is handed depends on what each range is: this
//! mechanism's or its sibling's memory is known from the tables; any other
//! range is asked of the driver (`cuPointerGetAttribute`, memory type and
//! device ordinal, at its first and last byte): page-locked host memory
//! and this device's memory go to `cuMemcpyAsync` as they are; **another
//! device's memory is `UNSUPPORTED`** (no `MEMPLUG_COPY_PEER`), never
//! taken for host memory; memory the driver does not know is pageable
//! host memory, which `cuMemcpyAsync` would copy only by waiting, so it is
//! staged (`staging.rs`) and the slot still returns without waiting. A
//! range whose two ends are different kinds of memory is `OUT_OF_RANGE`.
//!
//! A copy on a stream that is capturing a CUDA graph is refused
//! (`capture.rs`).

use crate::allocator::Allocation;
use crate::driver::{Entered, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use crate::handles::Table;
use crate::mechanism::{CudaMechanism, MechanismKind, Sibling};
use crate::staging::Staged;
use memplug_sdk::abi::{MEMPLUG_COPY_DEVICE, MEMPLUG_COPY_HOST};
use memplug_sdk::{copy_range_inside, copy_range_unbacked, PluginError, PluginResult, Status};

/// The spaces this mechanism copies between.
pub const COPY_KINDS: u32 = MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST;

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
const ATTR_MEMORY_TYPE: i32 = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
const ATTR_DEVICE_ORDINAL: i32 = 9;
/// `CU_MEMORYTYPE_HOST`: page-locked (allocated or registered) host memory.
const MEMORYTYPE_HOST: u32 = 1;

/// What a copy range is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// This device's memory (or managed memory): the driver copies it.
    Device,
    /// Page-locked host memory: the driver copies it without waiting.
    Locked,
    /// Memory the driver does not know: pageable host memory.
    Pageable,
}

impl CudaMechanism {
    /// Judges a range against this mechanism's memory and its sibling's
    /// (see the module docs) and says what it is; `None` when it meets
    /// neither (the driver is asked then). The SDK checked `start + len`
    /// fits.
    fn judge_copy_range(&self, which: &str, start: u64, len: u64) -> PluginResult<Option<Kind>> {
        let mine = match self.kind {
            MechanismKind::Device => Kind::Device,
            MechanismKind::PinnedHost => Kind::Locked,
        };
        if let Some(verdict) = self.judge_own(which, start, start + len) {
            return verdict.map(|()| Some(mine));
        }
        let theirs = match &self.sibling {
            Sibling::None => None,
            Sibling::PinnedBlocks(blocks) => judge_blocks(blocks, which, start, start + len, "pinned block")
                .map(|v| v.map(|()| Kind::Locked)),
            Sibling::Device(device) => {
                device.judge_own(which, start, start + len).map(|v| v.map(|()| Kind::Device))
            }
        };
        theirs.transpose()
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

    /// What the driver says the byte at `p` is (see [`Kind`]).
    fn pointer_kind(&self, which: &str, p: u64) -> PluginResult<Kind> {
        let d = self.driver;
        let mut ty: u32 = 0;
        // SAFETY: resolved entry point, out-pointer to a local of the
        // attribute's type (`CUmemorytype`, 32 bits).
        match unsafe { (d.api.pointer_get_attribute)((&mut ty as *mut u32).cast(), ATTR_MEMORY_TYPE, p) } {
            CUDA_SUCCESS => {}
            CUDA_ERROR_INVALID_VALUE => return Ok(Kind::Pageable),
            r => return Err(d.error(r, "cuPointerGetAttribute")),
        }
        if ty == MEMORYTYPE_HOST {
            return Ok(Kind::Locked);
        }
        let mut ordinal: i32 = -1;
        // SAFETY: as above (`int`).
        let r = unsafe {
            (d.api.pointer_get_attribute)((&mut ordinal as *mut i32).cast(), ATTR_DEVICE_ORDINAL, p)
        };
        d.check(r, "cuPointerGetAttribute")?;
        if i64::from(ordinal) != i64::from(self.device.ordinal) {
            return Err(PluginError::unsupported(format!(
                "copy: the {which} range at {p:#x} is memory of CUDA device {ordinal}, and mechanism \"{}\" \
                 copies only its own device's memory and host memory (no MEMPLUG_COPY_PEER)",
                self.name
            )));
        }
        Ok(Kind::Device)
    }

    /// What `[start, start + len)` is, asking the driver at both ends.
    fn driver_kind(&self, which: &str, start: u64, len: u64) -> PluginResult<Kind> {
        let first = self.pointer_kind(which, start)?;
        let last = self.pointer_kind(which, start + len - 1)?;
        if first != last {
            return Err(PluginError::new(
                Status::OutOfRange,
                format!(
                    "copy: the {which} range [{start:#x}, {:#x}) starts in {first:?} memory and ends in \
                     {last:?} memory: a range must lie in one kind of memory",
                    start + len
                ),
            ));
        }
        Ok(first)
    }

    /// Copies `len` bytes from `src` to `dst` on `stream` without waiting
    /// (the SDK has answered `len` 0 and refused wrapping and overlapping
    /// ranges).
    pub(crate) fn copy_on(&self, stream: u64, dst: u64, src: u64, len: u64) -> PluginResult<()> {
        let _slot = self.slot("copy")?;
        let known_dst = self.judge_copy_range("dst", dst, len)?;
        let known_src = self.judge_copy_range("src", src, len)?;
        let d = self.driver;
        self.with_open_stream(stream, "copy", |s| {
            let _e = Entered::new(d, s.ctx)?;
            crate::capture::refuse_if_capturing(d, s.raw, "copy")?;
            let to = known_dst.map_or_else(|| self.driver_kind("dst", dst, len), Ok)?;
            let from = known_src.map_or_else(|| self.driver_kind("src", src, len), Ok)?;
            let staged = match (to, from) {
                (Kind::Pageable, Kind::Pageable | Kind::Locked) | (Kind::Locked, Kind::Pageable) => {
                    Some(Staged::HostToHost)
                }
                (Kind::Pageable, Kind::Device) => Some(Staged::Destination),
                (Kind::Device, Kind::Pageable) => Some(Staged::Source),
                _ => None,
            };
            match staged {
                Some(side) => {
                    crate::staging::staged_copy(d, d.host_alloc, s.pin.staging(), s.raw, dst, src, len, side)
                }
                // SAFETY: a live stream; both ranges are this mechanism's
                // usable memory, page-locked host memory or this device's
                // memory (judged above), which the ABI makes the caller
                // keep until the copy has run.
                None => {
                    d.check(unsafe { (d.api.memcpy_async)(dst, src, len as usize, s.raw) }, "cuMemcpyAsync")
                }
            }
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
