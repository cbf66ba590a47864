//! The plugin as the kit sees it: its strings read through the SDK's
//! bounded reader (its descriptors are read as untrusted prefixes through
//! `memplug_sdk::prefix`, in `checks/descriptor.rs`), and one wrapper per
//! slot that passes a recording sink and a guarded output buffer (so a
//! write past `struct_size`, or a write on failure, is noticed), and logs
//! the call.

use crate::sink::{call, Log};
use core::ffi::{c_char, c_void};
use memplug_sdk::abi::*;
use memplug_sdk::prefix::{read_bounded_str, StringError, MAX_NAME};
use std::sync::atomic::{AtomicU64, Ordering};

/// Filler of guarded output buffers.
pub(crate) const FILL: u8 = 0xa5;
/// Bytes of a guarded output buffer (every ABI 1.0 output fits well inside).
const GUARDED: usize = 128;

/// An output struct inside a larger buffer whose other bytes are `FILL`:
/// after the call, a byte past `struct_size` that changed is an overrun.
#[repr(C, align(8))]
pub(crate) struct Guarded {
    bytes: [u8; GUARDED],
    declared: u32,
}

impl Guarded {
    pub(crate) fn new(declared: u32) -> Self {
        let mut g = Guarded { bytes: [FILL; GUARDED], declared };
        g.bytes[..4].copy_from_slice(&declared.to_ne_bytes());
        g
    }

    pub(crate) fn ptr<T>(&mut self) -> *mut T {
        self.bytes.as_mut_ptr().cast()
    }

    /// The struct as written (fields past `struct_size` read as `FILL`).
    pub(crate) fn read<T: Copy>(&self) -> T {
        assert!(core::mem::size_of::<T>() <= GUARDED);
        // SAFETY: in bounds (checked), and every ABI output is plain data.
        unsafe { self.bytes.as_ptr().cast::<T>().read_unaligned() }
    }

    /// True when no byte past `struct_size` changed.
    pub(crate) fn tail_intact(&self) -> bool {
        let from = (self.declared as usize).min(GUARDED);
        self.bytes[from..].iter().all(|&b| b == FILL)
    }

    /// True when no byte of `[from, to)` changed (fields the writer left
    /// as the kit filled them).
    pub(crate) fn untouched_in(&self, from: usize, to: usize) -> bool {
        self.bytes[from.min(GUARDED)..to.min(GUARDED)].iter().all(|&b| b == FILL)
    }

    /// True when nothing at all changed (the output of a failed call).
    pub(crate) fn untouched(&self) -> bool {
        self.bytes[..4] == self.declared.to_ne_bytes() && self.bytes[4..].iter().all(|&b| b == FILL)
    }

    /// Logs what the call did to the buffer that it must not have done.
    fn audit(&self, log: &Log, slot: &'static str, status: MemplugStatus) {
        if !self.tail_intact() {
            log.overrun(slot, format!("wrote past struct_size {} of its output", self.declared));
        }
        if status != MEMPLUG_STATUS_OK && !self.untouched() {
            log.wrote_on_failure(slot, status);
        }
    }
}

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

    fn out_handle(
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

/// What the kit puts in an `out_fence` before a queued call: a failed call
/// that changed it wrote its output on failure.
pub(crate) const FENCE_UNWRITTEN: u64 = 0xa5a5_a5a5_a5a5_a5a5;

/// Where a queued call writes its fence: the kit's word, or NULL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FenceOut {
    Kit,
    Null,
}

/// The 1.2 slots: queue-ordered binding, cross-stream waits, typed adopt
/// and peer access.
impl Mech {
    /// Runs a queued call with `out_fence` as `out` says; the status and
    /// the fence written (a failed call that wrote one is logged).
    fn fence_out(
        &self,
        log: &Log,
        slot: &'static str,
        out: FenceOut,
        f: impl FnOnce(*mut u64, *const MemplugMessageSink) -> MemplugStatus,
    ) -> (MemplugStatus, u64) {
        let mut fence = FENCE_UNWRITTEN;
        let p: *mut u64 = match out {
            FenceOut::Kit => &mut fence,
            FenceOut::Null => core::ptr::null_mut(),
        };
        let (status, _) = call(log, slot, |sink| f(p, sink));
        if status != MEMPLUG_STATUS_OK && fence != FENCE_UNWRITTEN {
            log.wrote_on_failure(slot, status);
        }
        (status, fence)
    }

    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn range_on(
        &self,
        log: &Log,
        slot: &'static str,
        f: Option<
            unsafe extern "C" fn(
                *mut c_void,
                *const MemplugObjectRef,
                u64,
                u64,
                u64,
                *mut u64,
                *const MemplugMessageSink,
            ) -> MemplugStatus,
        >,
        r: &MemplugObjectRef,
        (offset, len): (u64, u64),
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let Some(f) = f else {
            return (MEMPLUG_STATUS_UNSUPPORTED, FENCE_UNWRITTEN);
        };
        // SAFETY: a published slot; pointers live for the call.
        self.fence_out(log, slot, out, |p, sink| unsafe { f(self.ctx, r, offset, len, stream, p, sink) })
    }

    /// `commit_on` (ABI 1.2, `MEMPLUG_CAP_QUEUED_BINDING`).
    pub(crate) fn commit_on(
        &self,
        log: &Log,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let f = self.vb.and_then(|v| v.commit_on);
        self.range_on(log, "virtual_backing.commit_on", f, r, (offset, len), stream, out)
    }

    /// `decommit_on` (ABI 1.2, `MEMPLUG_CAP_QUEUED_BINDING`).
    pub(crate) fn decommit_on(
        &self,
        log: &Log,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let f = self.vb.and_then(|v| v.decommit_on);
        self.range_on(log, "virtual_backing.decommit_on", f, r, (offset, len), stream, out)
    }

    /// `map_on` (ABI 1.2, `MEMPLUG_CAP_QUEUED_BINDING`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map_on(
        &self,
        log: &Log,
        object: &MemplugObjectRef,
        object_offset: u64,
        r: &MemplugObjectRef,
        (offset, len): (u64, u64),
        access: u32,
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let Some(f) = self.sm.and_then(|v| v.map_on) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, FENCE_UNWRITTEN);
        };
        // SAFETY: a published slot; pointers live for the call.
        self.fence_out(log, "shared_mapping.map_on", out, |p, sink| unsafe {
            f(self.ctx, object, object_offset, r, offset, len, access, stream, p, sink)
        })
    }

    /// `unmap_on` (ABI 1.2, `MEMPLUG_CAP_QUEUED_BINDING`).
    pub(crate) fn unmap_on(
        &self,
        log: &Log,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        stream: u64,
        out: FenceOut,
    ) -> (MemplugStatus, u64) {
        let f = self.sm.and_then(|v| v.unmap_on);
        self.range_on(log, "shared_mapping.unmap_on", f, r, (offset, len), stream, out)
    }

    /// `stream_wait_fence` (ABI 1.2, optional).
    pub(crate) fn stream_wait_fence(&self, log: &Log, stream: u64, fence: u64) -> MemplugStatus {
        let Some(f) = self.sync.and_then(|v| v.stream_wait_fence) else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; the sink lives for the call.
        call(log, "sync.stream_wait_fence", |sink| unsafe { f(self.ctx, stream, fence, sink) }).0
    }

    /// `stream_adopt_typed` (ABI 1.2, optional): the status and the stream.
    pub(crate) fn stream_adopt_typed(
        &self,
        log: &Log,
        kind: u32,
        native: *mut c_void,
    ) -> Option<(MemplugStatus, u64)> {
        let f = self.sync.and_then(|s| s.stream_adopt_typed)?;
        // SAFETY: a published slot; pointers live for the call.
        Some(self.out_handle(log, "sync.stream_adopt_typed", |out, sink| unsafe {
            f(self.ctx, kind, native, out, sink)
        }))
    }

    /// `can_access_peer` (ABI 1.2, `MEMPLUG_CAP_PEER_ACCESS`): the status
    /// and the access bits (the kit's filler when unwritten).
    pub(crate) fn can_access_peer(&self, log: &Log, peer: &MemplugDevice) -> (MemplugStatus, u32) {
        let Some(f) = self.peer.and_then(|p| p.can_access_peer) else {
            return (MEMPLUG_STATUS_UNSUPPORTED, 0);
        };
        let mut out = ACCESS_UNWRITTEN;
        let slot = "peer_access.can_access_peer";
        // SAFETY: a published slot; pointers live for the call.
        let (status, _) = call(log, slot, |sink| unsafe { f(self.ctx, peer, &mut out, sink) });
        if status != MEMPLUG_STATUS_OK && out != ACCESS_UNWRITTEN {
            log.wrote_on_failure(slot, status);
        }
        (status, out)
    }

    /// `set_peer_access` (ABI 1.2, `MEMPLUG_CAP_PEER_ACCESS`).
    pub(crate) fn set_peer_access(
        &self,
        log: &Log,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        peer: &MemplugDevice,
        access: u32,
    ) -> MemplugStatus {
        let Some(f) = self.peer.and_then(|p| p.set_peer_access) else {
            return MEMPLUG_STATUS_UNSUPPORTED;
        };
        // SAFETY: a published slot; pointers live for the call.
        call(log, "peer_access.set_peer_access", |sink| unsafe {
            f(self.ctx, r, offset, len, peer, access, sink)
        })
        .0
    }
}

/// What the kit puts in `can_access_peer`'s output before the call.
pub(crate) const ACCESS_UNWRITTEN: u32 = 0xa5a5_a5a5;

/// The name of a status code, for details.
pub(crate) fn status_name(s: MemplugStatus) -> String {
    let name = match s {
        MEMPLUG_STATUS_OK => "OK",
        MEMPLUG_STATUS_UNSUPPORTED => "UNSUPPORTED",
        MEMPLUG_STATUS_INVALID_ARGUMENT => "INVALID_ARGUMENT",
        MEMPLUG_STATUS_OUT_OF_MEMORY => "OUT_OF_MEMORY",
        MEMPLUG_STATUS_WRONG_MECHANISM => "WRONG_MECHANISM",
        MEMPLUG_STATUS_WRONG_DEVICE => "WRONG_DEVICE",
        MEMPLUG_STATUS_UNKNOWN_ALLOCATION => "UNKNOWN_ALLOCATION",
        MEMPLUG_STATUS_DEVICE_UNAVAILABLE => "DEVICE_UNAVAILABLE",
        MEMPLUG_STATUS_INTERNAL => "INTERNAL",
        MEMPLUG_STATUS_OUT_OF_RANGE => "OUT_OF_RANGE",
        MEMPLUG_STATUS_INVALID_STATE => "INVALID_STATE",
        MEMPLUG_STATUS_VERSION_MISMATCH => "VERSION_MISMATCH",
        MEMPLUG_STATUS_NOT_READY => "NOT_READY",
        MEMPLUG_STATUS_TIMEOUT => "TIMEOUT",
        MEMPLUG_STATUS_BUSY => "BUSY",
        MEMPLUG_STATUS_DEVICE_LOST => "DEVICE_LOST",
        other => return format!("unknown status {other}"),
    };
    name.to_string()
}

/// The device kinds the ABI defines (1.0's two, and since 1.2 every kind
/// DLPack numbers).
pub(crate) fn device_kind_name(kind: MemplugDeviceKind) -> Option<&'static str> {
    Some(match kind {
        MEMPLUG_DEVICE_CPU => "cpu",
        MEMPLUG_DEVICE_CUDA => "cuda",
        MEMPLUG_DEVICE_CUDA_HOST => "cuda_host",
        MEMPLUG_DEVICE_OPENCL => "opencl",
        MEMPLUG_DEVICE_VULKAN => "vulkan",
        MEMPLUG_DEVICE_METAL => "metal",
        MEMPLUG_DEVICE_VPI => "vpi",
        MEMPLUG_DEVICE_ROCM => "rocm",
        MEMPLUG_DEVICE_ROCM_HOST => "rocm_host",
        MEMPLUG_DEVICE_EXT_DEV => "ext_dev",
        MEMPLUG_DEVICE_CUDA_MANAGED => "cuda_managed",
        MEMPLUG_DEVICE_ONEAPI => "oneapi",
        MEMPLUG_DEVICE_WEBGPU => "webgpu",
        MEMPLUG_DEVICE_HEXAGON => "hexagon",
        MEMPLUG_DEVICE_MAIA => "maia",
        _ => return None,
    })
}

/// A kind in the vendors' range (ABI 1.2).
pub(crate) fn is_vendor_kind(kind: MemplugDeviceKind) -> bool {
    (MEMPLUG_DEVICE_VENDOR_FIRST..=MEMPLUG_DEVICE_VENDOR_LAST).contains(&kind)
}

// ---- descriptors handed out by export_fd ------------------------------------

/// What an open descriptor names: its file's `(st_dev, st_ino)`, or `None`
/// when `fd` is not open. Two descriptors of one file name the same; a
/// number closed and reused for another file names something else.
pub(crate) fn fd_identity(fd: i32) -> Option<(u64, u64)> {
    if fd < 0 {
        return None;
    }
    // SAFETY: fstat only writes the zeroed struct it is given.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// The size of the regular file `fd` names, or `None` for anything else
/// (another kind of descriptor, or none).
pub(crate) fn fd_file_size(fd: i32) -> Option<u64> {
    // SAFETY: as in `fd_identity`.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    (st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(st.st_size as u64)
}

/// Descriptors the kit owns, each with the identity it had when the kit
/// took it: dropping closes each one that still names that file, and never
/// a number a misbehaving plugin closed behind the kit's back and the
/// process reused.
/// The handle kinds whose `fd` is a descriptor.
const FD_KINDS: u32 = MEMPLUG_HANDLE_OPAQUE_FD | MEMPLUG_HANDLE_DMABUF_FD | MEMPLUG_HANDLE_MEMFD;

/// Stops the check (a failure naming it, through the child's panic guard)
/// when an export answered with one of the descriptors the kit's check
/// process had open before the call — its standard streams, its message
/// pipe to the kit, the plugin file it loads: a plugin handing out a
/// descriptor it does not own. The kit must never adopt and close one of
/// those (closing the message pipe would end the check without a
/// verdict, and look like the plugin exiting).
fn refuse_kit_fd(slot: &str, fd: i32) {
    let what = match fd {
        0 => "the kit's standard input",
        1 | 2 => "the kit's standard output or error",
        crate::os::MESSAGE_FD => "the kit's own message pipe to its parent",
        crate::os::KEPT_FD => "the kit's own descriptor of the plugin library",
        _ => return,
    };
    panic!(
        "{slot} returned descriptor {fd}, which is {what}: open before the call, not made for it. The plugin \
         handed out a descriptor it does not own (an export must be a new descriptor, e.g. a dup of its own); \
         the kit leaves it open"
    );
}

#[derive(Default)]
pub(crate) struct OwnedFds(Vec<(i32, (u64, u64))>);

impl OwnedFds {
    /// Takes ownership of `fd`, which names the file `id`.
    pub(crate) fn adopt(&mut self, fd: i32, id: (u64, u64)) {
        self.0.push((fd, id));
    }

    /// Closes `fd` now (if it still names the file it was adopted with).
    pub(crate) fn close(&mut self, fd: i32) {
        if let Some(i) = self.0.iter().position(|(f, _)| *f == fd) {
            let (fd, id) = self.0.swap_remove(i);
            close_if_same(fd, id);
        }
    }
}

impl Drop for OwnedFds {
    fn drop(&mut self) {
        for (fd, id) in self.0.drain(..) {
            close_if_same(fd, id);
        }
    }
}

fn close_if_same(fd: i32, id: (u64, u64)) {
    if fd_identity(fd) == Some(id) {
        // SAFETY: the kit's own descriptor, still naming the file it took.
        unsafe { libc::close(fd) };
    }
}

/// `[0, len)` of the file `fd` mapped shared into this process (read-only
/// or read-write); unmapped on drop.
pub(crate) struct FdView {
    pub addr: *mut u8,
    len: usize,
}

impl FdView {
    /// Maps `fd`, which the caller checked is a regular file of at least
    /// `len` bytes; `None` when mmap refuses.
    pub(crate) fn map(fd: i32, len: u64, write: bool) -> Option<FdView> {
        let prot = if write { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a new mapping chosen by the kernel; nothing else is touched.
        let p = unsafe { libc::mmap(core::ptr::null_mut(), len as usize, prot, libc::MAP_SHARED, fd, 0) };
        (p != libc::MAP_FAILED).then(|| FdView { addr: p.cast(), len: len as usize })
    }
}

impl Drop for FdView {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}
