//! Optional capability: the `MemplugSharedMapping` table (physical objects
//! mapped at several addresses, exported and imported), and the typed
//! `MemplugHandle` it exports.

use super::*;
use core::ffi::c_void;

/// Optional capability: physical objects that can be mapped into ranges of
/// several reservations (of the same mechanism). A physical object holds one
/// reference from `create`, one per `retain`, and one per live mapping; its
/// memory goes back to the device when the last is dropped. Every slot
/// that takes a physical object or a reservation checks it as `deallocate`
/// checks an allocation: another mechanism's object is refused with
/// `MEMPLUG_STATUS_WRONG_MECHANISM`, another device's with
/// `MEMPLUG_STATUS_WRONG_DEVICE`, an unknown, released or altered one with
/// `MEMPLUG_STATUS_UNKNOWN_ALLOCATION`, and nothing changes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugSharedMapping {
    /// `sizeof(MemplugSharedMapping)` as the plugin knows it.
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Required. Creates a physical object of `request.size` bytes (rounded
    /// up to the granularity), zero-filled. `out.addr` is zero.
    pub create: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            request: *const MemplugRequest,
            out: *mut MemplugBlock,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Maps `[object_offset, object_offset+len)` of `object` at
    /// `[offset, offset+len)` of `reservation` with `MEMPLUG_ACCESS_*`
    /// `access` (read, or read|write). The reservation range must be neither
    /// committed nor mapped.
    pub map: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            object: *const MemplugObjectRef,
            object_offset: u64,
            reservation: *const MemplugObjectRef,
            offset: u64,
            len: u64,
            access: u32,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Unmaps exactly one earlier mapping that starts at `offset`
    /// of `reservation` and spans `len` bytes.
    pub unmap: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            reservation: *const MemplugObjectRef,
            offset: u64,
            len: u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Adds a reference to `object`.
    pub retain: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            object: *const MemplugObjectRef,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Drops a reference to `object` (from `create` or `retain`).
    pub release: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            object: *const MemplugObjectRef,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.1; present if and only if `MEMPLUG_CAP_SHARED_EXPORT` is set
    /// (a host never calls it otherwise). Writes to `*out_fd` a new file
    /// descriptor for the memory of `object` (a live physical object of
    /// this mechanism), for another process to `import_fd`. The caller owns
    /// the descriptor and closes it; it stays valid after the object is
    /// released (it holds the memory, not a reference the plugin counts).
    /// It must be a descriptor made for this call (for example with
    /// `dup`), never one the plugin keeps, closes later or shares, and
    /// never 0, 1 or 2.
    /// A host refuses a number that was open before the call, and a
    /// regular file that is not shared memory; it closes a refused
    /// descriptor that the call opened.
    /// `*out_fd` is written only on success.
    pub export_fd: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            object: *const MemplugObjectRef,
            out_fd: *mut i32,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.1; present if and only if `MEMPLUG_CAP_SHARED_EXPORT` is set.
    /// Creates a physical object of this mechanism backed by the memory `fd`
    /// names (exported by `export_fd`, here or in another process), of
    /// `request.size` bytes rounded up to the granularity, which must not
    /// exceed the memory behind `fd`. The plugin duplicates what it keeps;
    /// the caller keeps `fd` and closes it when it wishes. The object holds
    /// one reference, as from `create`, and `out.addr` is zero. A
    /// descriptor the mechanism cannot use is refused with
    /// `MEMPLUG_STATUS_INVALID_ARGUMENT`.
    pub import_fd: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            fd: i32,
            request: *const MemplugRequest,
            out: *mut MemplugBlock,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.2; present if and only if `MEMPLUG_CAP_TYPED_EXPORT` is set
    /// (with a table of at least `MEMPLUG_SHARED_MAPPING_SIZE_1_2`, at an
    /// agreed minor of at least 2). Exports physical object `object` as a
    /// handle of kind `handle_type` (one `MEMPLUG_HANDLE_*` bit the
    /// mechanism publishes in `export_types`), written into `out` (never
    /// past `out->struct_size`). For descriptor kinds, `out->fd` is a new
    /// descriptor the caller owns and closes, of the kind it claims (a host
    /// refuses a `MEMPLUG_HANDLE_MEMFD` that is not shared memory and a
    /// `MEMPLUG_HANDLE_DMABUF_FD` that is not a dma-buf); for `MEMPLUG_HANDLE_WIN32`,
    /// `out->win32` a new handle the caller owns; for
    /// `MEMPLUG_HANDLE_VENDOR_BLOB`, `out->blob_len` bytes of `out->blob`.
    /// A kind the mechanism does not offer, or an object that was not made
    /// exportable as it (requests name the kinds at creation), is refused
    /// with `MEMPLUG_STATUS_UNSUPPORTED`.
    pub export_handle: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            object: *const MemplugObjectRef,
            handle_type: u32,
            out: *mut MemplugHandle,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.2; present if and only if `MEMPLUG_CAP_TYPED_EXPORT` is set.
    /// Creates a physical object of this mechanism from `handle` (exported
    /// by `export_handle`, here or in another process), of `request.size`
    /// bytes rounded up to the granularity, which must not exceed the
    /// memory behind the handle. The handle stays the caller's: the plugin
    /// duplicates what it keeps. The object holds one reference, as from
    /// `create`. A handle the mechanism cannot use is refused with
    /// `MEMPLUG_STATUS_INVALID_ARGUMENT`; a kind it does not import with
    /// `MEMPLUG_STATUS_UNSUPPORTED`.
    pub import_handle: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            handle: *const MemplugHandle,
            request: *const MemplugRequest,
            out: *mut MemplugBlock,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.2; present if and only if `MEMPLUG_CAP_QUEUED_BINDING` is set.
    /// `map` as a queue operation on `stream`, with a fence written to
    /// `*out_fence` that completes once the mapping is usable (see
    /// `MemplugVirtualBacking::commit_on`).
    pub map_on: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            object: *const MemplugObjectRef,
            object_offset: u64,
            reservation: *const MemplugObjectRef,
            offset: u64,
            len: u64,
            access: u32,
            stream: u64,
            out_fence: *mut u64,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Since 1.2; present if and only if `MEMPLUG_CAP_QUEUED_BINDING` is set.
    /// `unmap` as a queue operation on `stream` (see `map_on`).
    pub unmap_on: Option<
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

/// Bytes of `MemplugHandle::blob`: enough for the IPC and fabric handles
/// vendors define today (64 bytes). Frozen with the struct.
pub const MEMPLUG_HANDLE_BLOB_MAX: u32 = 64;

/// Since 1.2. A typed, shareable handle to a physical object's memory: a
/// descriptor, a Windows handle or a vendor's opaque bytes, as
/// `handle_type` says. Written by `export_handle` into caller memory (the
/// caller sets `struct_size`); read by `import_handle` as a prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemplugHandle {
    /// `sizeof(MemplugHandle)` as its owner knows it.
    pub struct_size: u32,
    /// One `MEMPLUG_HANDLE_*` bit.
    pub handle_type: u32,
    /// For `MEMPLUG_HANDLE_OPAQUE_FD`, `DMABUF_FD` and `MEMFD`: the
    /// descriptor; -1 otherwise.
    pub fd: i32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// For `MEMPLUG_HANDLE_WIN32`: the handle's value; zero otherwise.
    pub win32: u64,
    /// For `MEMPLUG_HANDLE_VENDOR_BLOB`: how many bytes of `blob` are used
    /// (at most `MEMPLUG_HANDLE_BLOB_MAX`); zero otherwise.
    pub blob_len: u32,
    /// Explicit padding; zero.
    pub reserved1: u32,
    /// A vendor blob's bytes.
    pub blob: [u8; 64],
}

impl Default for MemplugHandle {
    fn default() -> Self {
        MemplugHandle {
            struct_size: 0,
            handle_type: 0,
            fd: -1,
            reserved0: 0,
            win32: 0,
            blob_len: 0,
            reserved1: 0,
            blob: [0; 64],
        }
    }
}
