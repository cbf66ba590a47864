//! The required capability: the `MemplugAllocator` table, and the request,
//! block and object reference its slots take.

use super::*;
use core::ffi::c_void;

/// What the host asks `allocate` (or `reserve`, or `create`) for.
/// Host-owned, valid for the duration of the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugRequest {
    /// `sizeof(MemplugRequest)` as the host knows it.
    pub struct_size: u32,
    /// Reserved for flags of later minors; zero in 1.0. A plugin refuses
    /// unknown bits with `MEMPLUG_STATUS_INVALID_ARGUMENT`.
    pub flags: u32,
    /// Bytes wanted. Zero is refused with `MEMPLUG_STATUS_INVALID_ARGUMENT`.
    pub size: u64,
    /// Alignment wanted, a power of two; ignored by `reserve` and `create`,
    /// which align to the granularity.
    pub alignment: u64,
    /// Host-assigned identifier of the object to be made; unique for the
    /// lifetime of the host process, never derived from an address.
    pub object_id: u64,
    /// The device the host believes it is talking to.
    pub device: MemplugDevice,
    /// Since 1.1 (present when `struct_size >= MEMPLUG_REQUEST_SIZE_1_1`).
    /// What the memory is for: one of the `MEMPLUG_CLASS_*` values. A hint;
    /// an unknown value means `MEMPLUG_CLASS_OTHER`. A host sends it only
    /// when the agreed minor is at least 1.
    pub class_tag: u32,
    /// Since 1.1. Explicit padding; zero.
    pub reserved0: u32,
    /// Since 1.2 (present when `struct_size >= MEMPLUG_REQUEST_SIZE_1_2`;
    /// a host sends the 1.2 fields only when the agreed minor is at least
    /// 2). `MEMPLUG_HINT_*` bits; a plugin ignores bits it does not know.
    pub hints: u32,
    /// Since 1.2. `MEMPLUG_HANDLE_*` kinds the caller will export the
    /// object as (many APIs decide at creation). A plugin that cannot make
    /// an object exportable as one of them refuses with
    /// `MEMPLUG_STATUS_UNSUPPORTED`.
    pub export_types: u32,
    /// Since 1.2. The page size wanted, a power of two the mechanism
    /// publishes in `page_sizes`; zero for the mechanism's choice. Another
    /// value is refused with `MEMPLUG_STATUS_INVALID_ARGUMENT`.
    pub page_size: u64,
    /// Since 1.2. Where the memory should live: `MEMPLUG_LOCATION_*`
    /// (`MEMPLUG_LOCATION_ANY`: no preference) and its node or tier. A
    /// plugin that cannot place it there refuses with
    /// `MEMPLUG_STATUS_UNSUPPORTED`.
    pub location_kind: u32,
    /// Since 1.2. The node or tier `location_kind` names (else zero).
    pub location_id: u32,
}

/// An object made by a plugin: an allocation, a reservation or a physical
/// object. Written by the plugin into host memory on success.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugBlock {
    /// `sizeof(MemplugBlock)` as the host knows it (set by the host).
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Device address of the first byte; zero for a physical object, which
    /// has no address until it is mapped.
    pub addr: u64,
    /// Bytes actually obtained (at least the bytes requested). A host refuses
    /// a block that claims more than the request rounded up to the largest of
    /// the granularity, `max_alignment`, 4096 and the requested page size,
    /// plus the larger of the granularity and 2 MiB.
    pub size: u64,
    /// Plugin handle for the object, opaque to the host.
    pub handle: u64,
}

/// How the host names an object back to the plugin that made it.
/// Host-owned, valid for the duration of the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugObjectRef {
    /// `sizeof(MemplugObjectRef)` as the host knows it.
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// The mechanism that made the object.
    pub mechanism_id: u64,
    /// The device the object lives on.
    pub device: MemplugDevice,
    /// The host-assigned identifier given when the object was made.
    pub object_id: u64,
    /// Address, size and plugin handle exactly as the plugin returned them.
    pub addr: u64,
    /// See `addr`.
    pub size: u64,
    /// See `addr`.
    pub handle: u64,
}

/// Required capability: plain allocations.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugAllocator {
    /// `sizeof(MemplugAllocator)` as the plugin knows it.
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Required. Writes the mechanism's properties.
    pub properties: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            out: *mut MemplugProperties,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Makes an allocation of at least `request.size` bytes aligned
    /// to `request.alignment`; writes `out` only on success.
    pub allocate: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            request: *const MemplugRequest,
            out: *mut MemplugBlock,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Frees an allocation made by `allocate` of this mechanism.
    /// Refuses foreign, unknown and already freed allocations with their own
    /// codes and changes nothing then.
    pub deallocate: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            object: *const MemplugObjectRef,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Optional (NULL when the device cannot tell). Writes free/total bytes.
    pub memory_info: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            out: *mut MemplugMemoryInfo,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
}
