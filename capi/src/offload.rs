//! Offload and restore at the same address, and copy-on-write of part of
//! a shared prefix (C API 1.3): a region's private bytes moved to memory
//! of another binding and brought back later where they were, and a
//! granule range of a mapped prefix made private to one region. Both are
//! the host's transactions (`Region::offload_to`, `restore`, `privatise`),
//! ordered by the plugin ABI 1.3 stream-ordered copy.
//!
//! Plain allocations have no entry here: the host always refuses to
//! offload one (no plugin ABI slot re-places memory at the same address),
//! and a function that can only answer `MEMPLUG_HOST_STATUS_UNSUPPORTED`
//! would be ABI to keep for nothing.

use crate::callbacks::lock_region;
use crate::common::{MemplugHostBinding, MemplugHostFence, MemplugHostRegion, MemplugHostStream};
use crate::error::{boundary, require_non_null, write_out, Error, Result};
use crate::handle::Kind;
use crate::manager_tables::{self, pin, same_manager, FenceEntry, RegionEntry, StreamEntry};
use crate::slot_table::{Pinned, Vacant};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::struct_size::{check_out_sized, write_sized};
use memplug_host_dep::{MemoryBinding, PluginFence, Residence, SharedFence, Stream};
use memplug_sdk::prefix::Prefixed;
use std::time::Duration;

/// Size of `MemplugHostOffloadReport` in API 1.3, where it first appeared.
pub const MEMPLUG_HOST_OFFLOAD_REPORT_SIZE_1_3: u32 = 24;
/// Size of `MemplugHostResidence` in API 1.3, where it first appeared.
pub const MEMPLUG_HOST_RESIDENCE_SIZE_1_3: u32 = 24;

/// `MemplugHostResidence::kind`: the private bytes are committed on the
/// region's device (the normal state).
pub const MEMPLUG_HOST_RESIDENCE_DEVICE: u32 = 0;
/// `MemplugHostResidence::kind`: the private bytes are held in memory of
/// the offload's target binding (`memplug_host_region_offload`).
pub const MEMPLUG_HOST_RESIDENCE_HOST: u32 = 1;

/// What `memplug_host_region_offload` did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostOffloadReport {
    /// `sizeof(MemplugHostOffloadReport)`; set to the bytes written.
    pub struct_size: u32,
    /// Private ranges the plugin refused to decommit (each kept, with its
    /// bytes in place; the plugin's refusal reached the log callback as
    /// `MEMPLUG_HOST_LOG_WARN`).
    pub ranges_kept: u32,
    /// Device bytes decommitted and refunded to the region's pool: the
    /// answer a holder gives a pressure ticket.
    pub released: u64,
    /// Device bytes still committed and charged (the ranges kept).
    pub kept: u64,
}

/// Where a region's private bytes are (`memplug_host_region_residence`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostResidence {
    /// `sizeof(MemplugHostResidence)`; set to the bytes written.
    pub struct_size: u32,
    /// `MEMPLUG_HOST_RESIDENCE_DEVICE` or `MEMPLUG_HOST_RESIDENCE_HOST`.
    pub kind: u32,
    /// While offloaded: the first byte of the host copy, an allocation of
    /// the target binding (0 when there was nothing private to copy); 0
    /// on the device.
    pub host_addr: u64,
    /// While offloaded: the private bytes the host copy holds; 0 on the
    /// device.
    pub host_bytes: u64,
}

// SAFETY: both are `#[repr(C)]`, `Copy`, made of integers (all-zero
// valid) and start with `struct_size: u32`; their sizes are asserted.
unsafe impl Prefixed for MemplugHostOffloadReport {
    const SIZE_1_0: u32 = MEMPLUG_HOST_OFFLOAD_REPORT_SIZE_1_3;
}
// SAFETY: as above.
unsafe impl Prefixed for MemplugHostResidence {
    const SIZE_1_0: u32 = MEMPLUG_HOST_RESIDENCE_SIZE_1_3;
}
const _: () = {
    assert!(std::mem::size_of::<MemplugHostOffloadReport>() == MEMPLUG_HOST_OFFLOAD_REPORT_SIZE_1_3 as usize);
    assert!(std::mem::size_of::<MemplugHostResidence>() == MEMPLUG_HOST_RESIDENCE_SIZE_1_3 as usize);
};

/// Resolves `stream` of the manager in seat `seat` (as `grow_on` does).
fn stream_of(seat: u32, stream: MemplugHostStream) -> Result<Pinned<StreamEntry>> {
    crate::handle::expect(stream.id, Kind::Stream)?;
    same_manager(seat, stream.id, Kind::Stream)?;
    Ok(pin::<StreamEntry>(stream.id)?.0)
}

/// Runs `op` on the live stream of `st`.
fn on_stream<T>(st: &StreamEntry, op: impl FnOnce(&Stream) -> Result<T>) -> Result<T> {
    let guard = st.stream.lock().unwrap_or_else(|p| p.into_inner());
    let s = guard.as_ref().ok_or_else(|| Error::new(S::InvalidState, "the stream was destroyed"))?;
    op(s)
}

/// The fence of an operation just done on `s` (a stream of `st`), as the
/// caller's handle gets it: with a fence recorded on the stream right
/// after the operation, so that `memplug_host_stream_wait_fence` can order
/// another stream behind it (when the plugin refuses to record one, the
/// handle is still a fence to wait on).
fn fence_entry(st: &StreamEntry, s: &Stream, fence: SharedFence) -> FenceEntry {
    FenceEntry { fence, recorded: PluginFence::record_typed(&st.mechanism, s).ok() }
}

/// Fills the fence slot reserved before the operation (nothing may fail
/// after it) and writes the handle.
///
/// # Safety
/// `out` is non-NULL and writable.
unsafe fn hand_out(seat: u32, vacant: Vacant<FenceEntry>, entry: FenceEntry, out: *mut MemplugHostFence) {
    let id = manager_tables::fill(seat, vacant, entry, [0, 0]);
    // SAFETY: the caller's.
    unsafe { write_out(out, MemplugHostFence { id }) };
}

/// Moves the region's private bytes — the committed part after its prefix
/// and the prefix ranges made private (`memplug_host_region_privatise`) —
/// to memory of `target` (a binding of host memory, possibly of another
/// mechanism), to be brought back at the same addresses by
/// `memplug_host_region_restore`. The shared prefix stays mapped.
///
/// Steps: wait up to `timeout_ns` for the work recorded on the region
/// (fences of its shrinks and queued grows) → allocate the host copy from
/// `target` (charged to its pool) → copy each private range out on
/// `stream` (a stream of the region's mechanism) → wait for the copies
/// (the rest of `timeout_ns`) → decommit the ranges and refund them to the
/// region's pool. Until the restore nothing may touch the device range
/// past the prefix: growing, shrinking, privatising and a second offload
/// are refused (`MEMPLUG_HOST_STATUS_INVALID_STATE`), a DLPack export
/// views the prefix only, and `memplug_host_region_info` still reports
/// the `len` and `committed` the bytes come back to. Freeing the region
/// frees its host copy too. A region with no private bytes is marked
/// offloaded with nothing moved.
///
/// On success `out_report` (set its `struct_size` first) says what was
/// released: the device bytes actually decommitted. A range whose
/// decommit the plugin refuses stays committed and charged with its bytes
/// in place (`kept`, `ranges_kept`; the refusal reaches the log callback);
/// when no range could be decommitted the offload is undone and refused
/// with `_INVALID_STATE`, every refusal in the message.
///
/// Refusals, each leaving the region, its bytes and both pools as they
/// were: `MEMPLUG_HOST_STATUS_INVALID_STATE` when already offloaded;
/// `_UNSUPPORTED` for a mechanism without the copy, or whose copy does not
/// reach `target`'s memory (`memplug_host_mechanism_copy_kinds`);
/// `_OUT_OF_BUDGET` when `target`'s pool has no room; `_BUSY` when the
/// region's work or the copy did not complete within `timeout_ns` (a host
/// copy a copy may still write is freed behind that copy's fence);
/// `_WRONG_MANAGER` for a target or stream of another manager; a stream
/// of another mechanism is refused with the host's code
/// (`_WRONG_MECHANISM`); `_INVALID_STATE` for a destroyed stream.
///
/// Ownership: `out_report` is the caller's, written only on success; the
/// target binding and the stream stay the caller's (the host copy keeps
/// what it needs of the binding alive). Thread-safety: any thread; calls
/// on one region are serialised, and this one holds the region for up to
/// `timeout_ns`.
///
/// # Safety
/// `out_report` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_offload(
    region: MemplugHostRegion,
    target: MemplugHostBinding,
    stream: MemplugHostStream,
    timeout_ns: u64,
    out_report: *mut MemplugHostOffloadReport,
) -> MemplugHostStatus {
    boundary("memplug_host_region_offload", || {
        require_non_null(out_report, "out_report")?;
        // SAFETY: non-NULL; the caller's contract covers its size field.
        unsafe { check_out_sized(out_report, "MemplugHostOffloadReport") }?;
        let (e, seat) = pin::<RegionEntry>(region.id)?;
        crate::handle::expect(target.id, Kind::Binding)?;
        same_manager(seat, target.id, Kind::Binding)?;
        let (t, _) = pin::<MemoryBinding>(target.id)?;
        let st = stream_of(seat, stream)?;
        let mut l = lock_region(&e)?;
        let r = on_stream(&st, |s| Ok(l.guard.offload_to(&t, s, Duration::from_nanos(timeout_ns))?))?;
        drop(l);
        let report = MemplugHostOffloadReport {
            struct_size: MEMPLUG_HOST_OFFLOAD_REPORT_SIZE_1_3,
            ranges_kept: u32::try_from(r.refusals.len()).unwrap_or(u32::MAX),
            released: r.released,
            kept: r.kept,
        };
        // SAFETY: non-NULL, its size checked above.
        unsafe { write_sized(out_report, report, "MemplugHostOffloadReport") }
    })
}

/// Brings an offloaded region's bytes back at the same addresses: budget
/// granted → the decommitted ranges recommitted → each copied back on
/// `stream` → charged to the region's pool again. `out_fence` receives the
/// fence after which the bytes are in place: wait for it
/// (`memplug_host_fence_wait`) before the host reads them, or order other
/// streams behind it (`memplug_host_stream_wait_fence`, when the plugin
/// records fences); work enqueued later on `stream` is already after it.
/// The host copy is freed (its pool refunded) behind that fence, through
/// the deferred-free queue; the region's free and later shrinks wait for
/// it on their own.
///
/// Refusals, each leaving the region offloaded with its host copy intact
/// and both pools as they were: `MEMPLUG_HOST_STATUS_INVALID_STATE` for a
/// region that is not offloaded or a destroyed stream; `_OUT_OF_BUDGET`
/// when the region's pool has no room for the bytes (as for a grow);
/// `_WRONG_MANAGER` for a stream of another manager; a stream of another
/// mechanism is refused with the host's code (`_WRONG_MECHANISM`).
///
/// Ownership: the caller owns the fence handle
/// (`memplug_host_fence_release`), written only on success; the stream
/// stays the caller's. Thread-safety: any thread; calls on one region are
/// serialised.
///
/// # Safety
/// `out_fence` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_restore(
    region: MemplugHostRegion,
    stream: MemplugHostStream,
    out_fence: *mut MemplugHostFence,
) -> MemplugHostStatus {
    boundary("memplug_host_region_restore", || {
        require_non_null(out_fence, "out_fence")?;
        let (e, seat) = pin::<RegionEntry>(region.id)?;
        let st = stream_of(seat, stream)?;
        // The fence's table slot first: once the copies are enqueued,
        // nothing may fail.
        let vacant = manager_tables::vacant::<FenceEntry>(seat)?;
        let mut l = lock_region(&e)?;
        let f = on_stream(&st, |s| Ok(fence_entry(&st, s, l.guard.restore(s)?)))?;
        drop(l);
        // SAFETY: checked non-NULL.
        unsafe { hand_out(seat, vacant, f, out_fence) };
        Ok(())
    })
}

/// Where the region's private bytes are now: `out->kind` is
/// `MEMPLUG_HOST_RESIDENCE_DEVICE`, or `MEMPLUG_HOST_RESIDENCE_HOST` with
/// the host copy's address and size while offloaded. Set
/// `out->struct_size` first. Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_residence(
    region: MemplugHostRegion,
    out: *mut MemplugHostResidence,
) -> MemplugHostStatus {
    boundary("memplug_host_region_residence", || {
        require_non_null(out, "out")?;
        let (e, _) = pin::<RegionEntry>(region.id)?;
        let residence = lock_region(&e)?.guard.residence();
        let (kind, host_addr, host_bytes) = match residence {
            Residence::Device => (MEMPLUG_HOST_RESIDENCE_DEVICE, 0, 0),
            Residence::Host { addr, bytes } => (MEMPLUG_HOST_RESIDENCE_HOST, addr, bytes),
        };
        let value = MemplugHostResidence {
            struct_size: MEMPLUG_HOST_RESIDENCE_SIZE_1_3,
            kind,
            host_addr,
            host_bytes,
        };
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, value, "MemplugHostResidence") }
    })
}

/// Gives this region a private copy of `[offset, offset + len)` of its
/// shared prefix (offsets from the region's base, multiples of the
/// mechanism's granularity) — copy-on-write, e.g. of the prefix's last
/// block when a request's prompt diverges inside it. Private memory is
/// committed there, charged to the region's pool, and filled on `stream`
/// with the prefix's bytes; every other region mapping the prefix keeps
/// reading the shared ones, and the prefix stays charged once. Writes
/// through this region then change only its own copy (the range is
/// writable once `out_fence` completes).
///
/// Waits up to `timeout_ns` for the work recorded on the region first
/// (the range is briefly unmapped). `out_fence` receives the fence after
/// which the private bytes are in place, as for
/// `memplug_host_region_restore`. The whole change is a transaction: on
/// any refusal the mappings, the charge and the bytes are as they were.
///
/// Refusals: `MEMPLUG_HOST_STATUS_INVALID_STATE` for a region without a
/// prefix, an offloaded one, or a destroyed stream;
/// `_INVALID_ARGUMENT` for a range that is empty, unaligned, past the
/// prefix, or already private in part; `_UNSUPPORTED` for a mechanism
/// without the copy, or one that maps objects only whole
/// (`MEMPLUG_PROP_MAPS_AT_OFFSETS` unset) when the range is not the whole
/// prefix; `_OUT_OF_BUDGET`; `_BUSY` when the region's work did not
/// complete within `timeout_ns`; `_WRONG_MANAGER` for a stream of another
/// manager; a stream of another mechanism is refused with the host's code
/// (`_WRONG_MECHANISM`).
///
/// Ownership: the caller owns the fence handle
/// (`memplug_host_fence_release`), written only on success; the stream
/// stays the caller's. Thread-safety: any thread; calls on one region are
/// serialised.
///
/// # Safety
/// `out_fence` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_region_privatise(
    region: MemplugHostRegion,
    offset: u64,
    len: u64,
    stream: MemplugHostStream,
    timeout_ns: u64,
    out_fence: *mut MemplugHostFence,
) -> MemplugHostStatus {
    boundary("memplug_host_region_privatise", || {
        require_non_null(out_fence, "out_fence")?;
        let (e, seat) = pin::<RegionEntry>(region.id)?;
        let st = stream_of(seat, stream)?;
        let vacant = manager_tables::vacant::<FenceEntry>(seat)?;
        let mut l = lock_region(&e)?;
        let timeout = Duration::from_nanos(timeout_ns);
        let f = on_stream(&st, |s| Ok(fence_entry(&st, s, l.guard.privatise(offset, len, s, timeout)?)))?;
        drop(l);
        // SAFETY: checked non-NULL.
        unsafe { hand_out(seat, vacant, f, out_fence) };
        Ok(())
    })
}
