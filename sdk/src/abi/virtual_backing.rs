//! Optional capability: the `MemplugVirtualBacking` table (reserve, commit,
//! decommit, release a virtual range).

use super::*;
use core::ffi::c_void;

/// Optional capability: reserve address ranges and commit physical memory
/// into them. Addresses stay stable while a reservation grows. Ranges are
/// `(offset, len)` within the reservation, granularity-aligned, non-empty,
/// in bounds, and `offset + len` must not overflow.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugVirtualBacking {
    /// `sizeof(MemplugVirtualBacking)` as the plugin knows it.
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Required. Reserves `request.size` bytes (rounded up to the
    /// granularity) of address space with nothing committed.
    pub reserve: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            request: *const MemplugRequest,
            out: *mut MemplugBlock,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Makes `[offset, offset+len)` usable (read-write). Every page
    /// of the range must be uncommitted (`MEMPLUG_STATUS_INVALID_STATE`
    /// otherwise); on failure nothing is committed.
    pub commit: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            reservation: *const MemplugObjectRef,
            offset: u64,
            len: u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Gives the physical memory of `[offset, offset+len)` back to
    /// the device; the range becomes inaccessible and reads as zeros after a
    /// later commit. Every page must be committed
    /// (`MEMPLUG_STATUS_INVALID_STATE` otherwise).
    pub decommit: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            reservation: *const MemplugObjectRef,
            offset: u64,
            len: u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Writes the exact number of bytes committed in the
    /// reservation by `commit` and not yet decommitted. Ranges mapped with
    /// `MemplugSharedMapping::map` are not committed bytes (their memory
    /// belongs to the physical object) and are never counted here.
    pub committed_bytes: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            reservation: *const MemplugObjectRef,
            out_bytes: *mut u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Decommits everything, unmaps every shared mapping in the
    /// reservation (dropping the reference each mapping held on its
    /// physical object) and gives the address range back.
    pub release: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            reservation: *const MemplugObjectRef,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.2; present if and only if `MEMPLUG_CAP_QUEUED_BINDING` is set.
    /// `commit` as a queue operation: enqueued on `stream` (a stream of this
    /// mechanism's sync capability) after the work before it, with a fence
    /// written to `*out_fence` that completes once the range is usable. The
    /// same checks as `commit`, made before anything is enqueued.
    pub commit_on: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            reservation: *const MemplugObjectRef,
            offset: u64,
            len: u64,
            stream: u64,
            out_fence: *mut u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.2; present if and only if `MEMPLUG_CAP_QUEUED_BINDING` is set.
    /// `decommit` as a queue operation, as `commit_on`; the fence completes
    /// once the range is gone. It must not race device work still using
    /// the range: work before it on `stream` is ordered by the stream,
    /// other streams' work is the caller's to order.
    pub decommit_on: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            reservation: *const MemplugObjectRef,
            offset: u64,
            len: u64,
            stream: u64,
            out_fence: *mut u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
}
