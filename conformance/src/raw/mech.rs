//! One published mechanism (`Mech`) and a wrapper per ABI 1.0/1.1 slot:
//! the allocator, virtual backing, shared mapping and sync tables, each call
//! logged through a recording sink; the requests and object references the
//! checks pass them.

use super::*;
use crate::sink::{call, Log};
use core::ffi::{c_char, c_void};
use memplug_sdk::abi::*;
use memplug_sdk::prefix::{read_bounded_str, StringError, MAX_NAME};
use std::sync::atomic::{AtomicU64, Ordering};

/// Host-assigned object ids: unique for the run, never an address.
pub(crate) fn next_object_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x00c0_ffee_0000_0001);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Reads a plugin string through the SDK's bounded reader
/// ([`read_bounded_str`]: NUL-terminated UTF-8, byte by byte, at most
/// [`MAX_NAME`] bytes), and says what is wrong with it in the kit's words.
///
/// # Safety
/// `p` is NULL or readable up to its terminator or `MAX_NAME` bytes.
pub(crate) unsafe fn plugin_string(p: *const c_char) -> Result<String, String> {
    read_bounded_str(p).map_err(|e| match e {
        StringError::Null => "is NULL".into(),
        StringError::Unterminated => format!("has no NUL terminator within {MAX_NAME} bytes"),
        StringError::Empty => "is empty".into(),
        StringError::NotUtf8 => "is not UTF-8".into(),
    })
}

/// Whether the kit read a memory descriptor (ABI 1.2) in the mechanism's
/// properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DescriptorSeen {
    /// The agreed minor is below 1.2: none was asked for.
    Older,
    /// Agreed on 1.2, but `properties` left every byte past the 1.0 prefix
    /// unwritten (the kit's fields read as zero).
    Unwritten,
    /// Agreed on 1.2 and written.
    Written,
}

/// One mechanism, as published (vtables copied as prefixes).
#[derive(Clone)]
pub(crate) struct Mech {
    pub name: String,
    pub id: u64,
    pub device: MemplugDevice,
    pub caps: u32,
    pub ctx: *mut c_void,
    /// The minor agreed in negotiation: 1.1 items are used only from 1.
    pub agreed_minor: u32,
    /// The newest minor the plugin declares (bits of a minor newer than
    /// the kit's are that minor's, not a failure).
    pub plugin_max_minor: u32,
    pub alloc: MemplugAllocator,
    pub vb: Option<MemplugVirtualBacking>,
    pub sm: Option<MemplugSharedMapping>,
    pub sync: Option<MemplugSync>,
    /// The 1.2 peer access table (`MEMPLUG_CAP_PEER_ACCESS`, agreed minor
    /// of 2 or more).
    pub peer: Option<MemplugPeerAccess>,
    /// Its properties: at an agreed minor of 2 with the memory descriptor
    /// (zero when [`DescriptorSeen::Unwritten`]).
    pub props: MemplugProperties,
    pub descriptor: DescriptorSeen,
    /// The 1.2 device identity the descriptor points at (NULL when none,
    /// or below 1.2).
    pub identity: *const MemplugDeviceIdentity,
    /// The plugin-wide live-object counter and its context.
    pub live_objects: unsafe extern "C" fn(*mut c_void) -> u64,
    pub plugin_ctx: *mut c_void,
}

// SAFETY: the ABI makes every slot callable from any thread concurrently.
unsafe impl Send for Mech {}
unsafe impl Sync for Mech {}

/// A request of `size` bytes aligned to `alignment`, for this mechanism's
/// device, with a fresh object id.
pub(crate) fn request(m: &Mech, size: u64, alignment: u64) -> MemplugRequest {
    MemplugRequest {
        struct_size: MEMPLUG_REQUEST_SIZE_1_0,
        flags: 0,
        size,
        alignment,
        object_id: next_object_id(),
        device: m.device,
        ..Default::default()
    }
}

/// [`request`] at the ABI 1.2 size (hints, export kinds, page size and
/// location zero: nothing asked).
pub(crate) fn request_1_2(m: &Mech, size: u64, alignment: u64) -> MemplugRequest {
    MemplugRequest { struct_size: MEMPLUG_REQUEST_SIZE_1_2, ..request(m, size, alignment) }
}

/// What a successful `allocate`/`reserve`/`create` made, as the host would
/// name it back.
pub(crate) fn object_ref(m: &Mech, object_id: u64, b: &MemplugBlock) -> MemplugObjectRef {
    MemplugObjectRef {
        struct_size: MEMPLUG_OBJECT_REF_SIZE_1_0,
        reserved0: 0,
        mechanism_id: m.id,
        device: m.device,
        object_id,
        addr: b.addr,
        size: b.size,
        handle: b.handle,
    }
}

/// The result of a call that makes an object.
pub(crate) struct Made {
    pub status: MemplugStatus,
    pub block: MemplugBlock,
    pub obj: MemplugObjectRef,
}

type MakeFn = unsafe extern "C" fn(
    *mut c_void,
    *const MemplugRequest,
    *mut MemplugBlock,
    *const MemplugMessageSink,
) -> MemplugStatus;

type RangeFn = unsafe extern "C" fn(
    *mut c_void,
    *const MemplugObjectRef,
    u64,
    u64,
    *const MemplugMessageSink,
) -> MemplugStatus;

type ObjFn =
    unsafe extern "C" fn(*mut c_void, *const MemplugObjectRef, *const MemplugMessageSink) -> MemplugStatus;

type HandleFn = unsafe extern "C" fn(*mut c_void, u64, *const MemplugMessageSink) -> MemplugStatus;

impl Mech {
    pub(crate) fn live(&self) -> u64 {
        // SAFETY: validated non-NULL before any Mech is built.
        unsafe { (self.live_objects)(self.plugin_ctx) }
    }

    pub(crate) fn is_cpu(&self) -> bool {
        self.device.kind == MEMPLUG_DEVICE_CPU
    }

    /// Whether a physical object may be mapped from an offset, or in part:
    /// always below 1.2; at 1.2 only with `MEMPLUG_PROP_MAPS_AT_OFFSETS`.
    pub(crate) fn maps_at_offsets(&self) -> bool {
        self.agreed_minor < 2 || self.props.flags & MEMPLUG_PROP_MAPS_AT_OFFSETS != 0
    }

    /// Whether the plugin may know a minor newer than the kit's (whose
    /// bits the kit cannot judge).
    pub(crate) fn newer_than_kit(&self) -> bool {
        self.plugin_max_minor > MEMPLUG_ABI_MINOR
    }

    fn make(&self, log: &Log, slot: &'static str, f: Option<MakeFn>, req: &MemplugRequest) -> Made {
        self.make_raw(log, slot, f, req, req.object_id, MEMPLUG_BLOCK_SIZE_1_0)
    }

    /// `f` with the request as given (which names `object_id`) and an
    /// output of `out_size` bytes.
    pub(crate) fn make_raw(
        &self,
        log: &Log,
        slot: &'static str,
        f: Option<MakeFn>,
        req: *const MemplugRequest,
        object_id: u64,
        out_size: u32,
    ) -> Made {
        let Some(f) = f else {
            return Made {
                status: MEMPLUG_STATUS_UNSUPPORTED,
                block: MemplugBlock::default(),
                obj: MemplugObjectRef::default(),
            };
        };
        let mut out = Guarded::new(out_size);
        // SAFETY: a published slot; every pointer lives for the call.
        let (status, _) = call(log, slot, |sink| unsafe { f(self.ctx, req, out.ptr(), sink) });
        out.audit(log, slot, status);
        let block: MemplugBlock = out.read();
        Made { status, block, obj: object_ref(self, object_id, &block) }
    }

    pub(crate) fn allocate(&self, log: &Log, req: &MemplugRequest) -> Made {
        self.make(log, "allocator.allocate", self.alloc.allocate, req)
    }

    pub(crate) fn deallocate(&self, log: &Log, obj: &MemplugObjectRef) -> MemplugStatus {
        self.obj_call(log, "allocator.deallocate", self.alloc.deallocate, obj)
    }

    fn obj_call(
        &self,
        log: &Log,
        slot: &'static str,
        f: Option<ObjFn>,
        obj: &MemplugObjectRef,
    ) -> MemplugStatus {
        let Some(f) = f else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; pointers live for the call.
        call(log, slot, |sink| unsafe { f(self.ctx, obj, sink) }).0
    }

    fn range_call(
        &self,
        log: &Log,
        slot: &'static str,
        f: Option<RangeFn>,
        obj: &MemplugObjectRef,
        offset: u64,
        len: u64,
    ) -> MemplugStatus {
        let Some(f) = f else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; pointers live for the call.
        call(log, slot, |sink| unsafe { f(self.ctx, obj, offset, len, sink) }).0
    }

    pub(crate) fn properties(&self, log: &Log, out_size: u32) -> (MemplugStatus, Guarded) {
        let mut out = Guarded::new(out_size);
        let Some(f) = self.alloc.properties else {
            return (MEMPLUG_STATUS_UNSUPPORTED, out);
        };
        // SAFETY: a published slot; the buffer outlives the call.
        let (status, _) = call(log, "allocator.properties", |sink| unsafe { f(self.ctx, out.ptr(), sink) });
        out.audit(log, "allocator.properties", status);
        (status, out)
    }

    pub(crate) fn memory_info(&self, log: &Log) -> Option<(MemplugStatus, Guarded)> {
        let f = self.alloc.memory_info?;
        let mut out = Guarded::new(MEMPLUG_MEMORY_INFO_SIZE_1_0);
        // SAFETY: a published slot; the buffer outlives the call.
        let (status, _) = call(log, "allocator.memory_info", |sink| unsafe { f(self.ctx, out.ptr(), sink) });
        out.audit(log, "allocator.memory_info", status);
        Some((status, out))
    }

    // ---- virtual backing -------------------------------------------------

    pub(crate) fn reserve(&self, log: &Log, size: u64) -> Made {
        let req = request(self, size, self.props.granularity.max(1));
        self.make(log, "virtual_backing.reserve", self.vb.and_then(|v| v.reserve), &req)
    }

    /// `reserve` with the request as given.
    pub(crate) fn reserve_req(&self, log: &Log, req: &MemplugRequest) -> Made {
        self.make(log, "virtual_backing.reserve", self.vb.and_then(|v| v.reserve), req)
    }

    pub(crate) fn commit(&self, log: &Log, r: &MemplugObjectRef, offset: u64, len: u64) -> MemplugStatus {
        self.range_call(log, "virtual_backing.commit", self.vb.and_then(|v| v.commit), r, offset, len)
    }

    pub(crate) fn decommit(&self, log: &Log, r: &MemplugObjectRef, offset: u64, len: u64) -> MemplugStatus {
        self.range_call(log, "virtual_backing.decommit", self.vb.and_then(|v| v.decommit), r, offset, len)
    }

    pub(crate) fn committed(&self, log: &Log, r: &MemplugObjectRef) -> (MemplugStatus, u64) {
        let Some(f) = self.vb.and_then(|v| v.committed_bytes) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, 0);
        };
        let mut out = 0u64;
        // SAFETY: a published slot; pointers live for the call.
        let (status, _) =
            call(log, "virtual_backing.committed_bytes", |sink| unsafe { f(self.ctx, r, &mut out, sink) });
        (status, out)
    }

    pub(crate) fn release_reservation(&self, log: &Log, r: &MemplugObjectRef) -> MemplugStatus {
        self.obj_call(log, "virtual_backing.release", self.vb.and_then(|v| v.release), r)
    }

    // ---- shared mapping --------------------------------------------------

    pub(crate) fn create(&self, log: &Log, size: u64) -> Made {
        let req = request(self, size, self.props.granularity.max(1));
        self.make(log, "shared_mapping.create", self.sm.and_then(|v| v.create), &req)
    }

    /// `create` with the request as given.
    pub(crate) fn create_req(&self, log: &Log, req: &MemplugRequest) -> Made {
        self.make(log, "shared_mapping.create", self.sm.and_then(|v| v.create), req)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map(
        &self,
        log: &Log,
        object: &MemplugObjectRef,
        object_offset: u64,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        access: u32,
    ) -> MemplugStatus {
        let Some(f) = self.sm.and_then(|v| v.map) else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; pointers live for the call.
        call(log, "shared_mapping.map", |sink| unsafe {
            f(self.ctx, object, object_offset, r, offset, len, access, sink)
        })
        .0
    }

    pub(crate) fn unmap(&self, log: &Log, r: &MemplugObjectRef, offset: u64, len: u64) -> MemplugStatus {
        self.range_call(log, "shared_mapping.unmap", self.sm.and_then(|v| v.unmap), r, offset, len)
    }

    /// `export_fd` (ABI 1.1): the status and the descriptor.
    pub(crate) fn export_fd(&self, log: &Log, o: &MemplugObjectRef) -> (MemplugStatus, i32) {
        let Some(f) = self.sm.and_then(|v| v.export_fd) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, -1);
        };
        let mut fd = -1;
        // SAFETY: a published slot; pointers live for the call.
        let (status, _) =
            call(log, "shared_mapping.export_fd", |sink| unsafe { f(self.ctx, o, &mut fd, sink) });
        if status == MEMPLUG_STATUS_OK {
            refuse_kit_fd("export_fd", fd);
        }
        (status, fd)
    }

    /// `import_fd` (ABI 1.1) of `size` bytes from `fd`.
    pub(crate) fn import_fd(&self, log: &Log, fd: i32, size: u64) -> Made {
        let Some(f) = self.sm.and_then(|v| v.import_fd) else {
            return Made {
                status: MEMPLUG_STATUS_UNSUPPORTED,
                block: MemplugBlock::default(),
                obj: MemplugObjectRef::default(),
            };
        };
        let req = request(self, size, self.props.granularity.max(1));
        let mut out = Guarded::new(MEMPLUG_BLOCK_SIZE_1_0);
        // SAFETY: a published slot; every pointer lives for the call.
        let (status, _) =
            call(log, "shared_mapping.import_fd", |sink| unsafe { f(self.ctx, fd, &req, out.ptr(), sink) });
        out.audit(log, "shared_mapping.import_fd", status);
        let block: MemplugBlock = out.read();
        Made { status, block, obj: object_ref(self, req.object_id, &block) }
    }

    /// `export_handle` (ABI 1.2) of kind `kind` into a guarded handle of
    /// `out_size` bytes: the status and the output.
    pub(crate) fn export_handle(
        &self,
        log: &Log,
        o: &MemplugObjectRef,
        kind: u32,
        out_size: u32,
    ) -> (MemplugStatus, Guarded) {
        let mut out = Guarded::new(out_size);
        let Some(f) = self.sm.and_then(|v| v.export_handle) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, out);
        };
        // SAFETY: a published slot; pointers live for the call.
        let (status, _) = call(log, "shared_mapping.export_handle", |sink| unsafe {
            f(self.ctx, o, kind, out.ptr(), sink)
        });
        out.audit(log, "shared_mapping.export_handle", status);
        if status == MEMPLUG_STATUS_OK && out.read::<MemplugHandle>().handle_type & FD_KINDS != 0 {
            refuse_kit_fd("export_handle", out.read::<MemplugHandle>().fd);
        }
        (status, out)
    }

    /// `import_handle` (ABI 1.2) of `handle` with `req`.
    pub(crate) fn import_handle(&self, log: &Log, handle: &MemplugHandle, req: &MemplugRequest) -> Made {
        let Some(f) = self.sm.and_then(|v| v.import_handle) else {
            return Made {
                status: MEMPLUG_STATUS_UNSUPPORTED,
                block: MemplugBlock::default(),
                obj: MemplugObjectRef::default(),
            };
        };
        let mut out = Guarded::new(MEMPLUG_BLOCK_SIZE_1_0);
        // SAFETY: a published slot; every pointer lives for the call.
        let (status, _) = call(log, "shared_mapping.import_handle", |sink| unsafe {
            f(self.ctx, handle, req, out.ptr(), sink)
        });
        out.audit(log, "shared_mapping.import_handle", status);
        let block: MemplugBlock = out.read();
        Made { status, block, obj: object_ref(self, req.object_id, &block) }
    }

    pub(crate) fn retain(&self, log: &Log, o: &MemplugObjectRef) -> MemplugStatus {
        self.obj_call(log, "shared_mapping.retain", self.sm.and_then(|v| v.retain), o)
    }

    pub(crate) fn release_object(&self, log: &Log, o: &MemplugObjectRef) -> MemplugStatus {
        self.obj_call(log, "shared_mapping.release", self.sm.and_then(|v| v.release), o)
    }

    // ---- sync ------------------------------------------------------------

    pub(super) fn out_handle(
        &self,
        log: &Log,
        slot: &'static str,
        f: impl FnOnce(*mut u64, *const MemplugMessageSink) -> MemplugStatus,
    ) -> (MemplugStatus, u64) {
        let mut out = 0u64;
        let (status, _) = call(log, slot, |sink| f(&mut out, sink));
        (status, out)
    }

    pub(crate) fn stream_create(&self, log: &Log) -> (MemplugStatus, u64) {
        let Some(f) = self.sync.and_then(|s| s.stream_create) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, 0);
        };
        // SAFETY: a published slot; pointers live for the call.
        self.out_handle(log, "sync.stream_create", |out, sink| unsafe { f(self.ctx, out, sink) })
    }

    pub(crate) fn stream_adopt(&self, log: &Log, native: *mut c_void) -> Option<(MemplugStatus, u64)> {
        let f = self.sync.and_then(|s| s.stream_adopt)?;
        // SAFETY: a published slot; pointers live for the call.
        Some(self.out_handle(log, "sync.stream_adopt", |out, sink| unsafe { f(self.ctx, native, out, sink) }))
    }

    fn handle_call(&self, log: &Log, slot: &'static str, f: Option<HandleFn>, h: u64) -> MemplugStatus {
        let Some(f) = f else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; the sink lives for the call.
        call(log, slot, |sink| unsafe { f(self.ctx, h, sink) }).0
    }

    pub(crate) fn stream_destroy(&self, log: &Log, s: u64) -> MemplugStatus {
        self.handle_call(log, "sync.stream_destroy", self.sync.and_then(|v| v.stream_destroy), s)
    }

    /// Enqueues `func(userdata)` on stream `s`.
    pub(crate) fn enqueue(
        &self,
        log: &Log,
        s: u64,
        func: MemplugHostFn,
        userdata: *mut c_void,
    ) -> MemplugStatus {
        let Some(f) = self.sync.and_then(|v| v.enqueue_host_fn) else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; the function and its data outlive the
        // call (the caller's business).
        call(log, "sync.enqueue_host_fn", |sink| unsafe { f(self.ctx, s, func, userdata, sink) }).0
    }

    pub(crate) fn fence_record(&self, log: &Log, s: u64) -> (MemplugStatus, u64) {
        let Some(f) = self.sync.and_then(|v| v.fence_record) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, 0);
        };
        // SAFETY: a published slot; pointers live for the call.
        self.out_handle(log, "sync.fence_record", |out, sink| unsafe { f(self.ctx, s, out, sink) })
    }

    pub(crate) fn fence_query(&self, log: &Log, fence: u64) -> MemplugStatus {
        self.handle_call(log, "sync.fence_query", self.sync.and_then(|v| v.fence_query), fence)
    }

    pub(crate) fn fence_wait(&self, log: &Log, fence: u64, timeout_ns: u64) -> MemplugStatus {
        let Some(f) = self.sync.and_then(|v| v.fence_wait) else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; the sink lives for the call.
        call(log, "sync.fence_wait", |sink| unsafe { f(self.ctx, fence, timeout_ns, sink) }).0
    }

    pub(crate) fn fence_destroy(&self, log: &Log, fence: u64) -> MemplugStatus {
        self.handle_call(log, "sync.fence_destroy", self.sync.and_then(|v| v.fence_destroy), fence)
    }
}
