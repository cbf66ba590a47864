//! Turns the author traits into ABI vtables. Every slot body runs behind one
//! panic boundary ([`guard`]): a panic becomes `MEMPLUG_STATUS_INTERNAL`
//! with the panic message, an `Err` becomes its code and message. Out-params
//! are written only on success, and never past the host's `struct_size`.

use crate::abi::{self, *};
use crate::author::*;
use crate::status::Status;
use core::ffi::{c_char, c_void};
use core::ptr::addr_of_mut;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::Duration;

/// Writes `msg` into the host's sink, if there is one.
///
/// # Safety
/// `sink` is NULL or points to a valid sink for the duration of the call.
pub unsafe fn write_message(sink: *const MemplugMessageSink, msg: &str) {
    if let Some(s) = sink.as_ref() {
        if let Some(w) = s.write {
            w(s.ctx, msg.as_ptr().cast::<c_char>(), msg.len());
        }
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "non-string panic payload"
    }
}

/// Runs a slot body: `Ok` → `MEMPLUG_STATUS_OK`, `Err` → its code plus a
/// message, panic → `MEMPLUG_STATUS_INTERNAL` plus the panic message.
///
/// The body's result is turned into a status inside the panic boundary, so
/// the success path hands back one register instead of moving a 32-byte
/// `Result` through memory; both failure paths are out of line.
///
/// # Safety
/// `sink` as for [`write_message`].
#[inline(always)]
pub unsafe fn guard(
    sink: *const MemplugMessageSink,
    slot: &'static str,
    body: impl FnOnce() -> PluginResult<()>,
) -> MemplugStatus {
    let run = || match body() {
        Ok(()) => abi::MEMPLUG_STATUS_OK,
        Err(e) => report_error(sink, e),
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(status) => status,
        Err(payload) => report_panic(sink, slot, payload),
    }
}

/// The `Err` path of [`guard`]: the message to the sink, the code back.
#[cold]
#[inline(never)]
unsafe fn report_error(sink: *const MemplugMessageSink, e: PluginError) -> MemplugStatus {
    if !e.message.is_empty() {
        write_message(sink, &e.message);
    }
    e.status.raw()
}

/// The panic path of [`guard`].
#[cold]
#[inline(never)]
unsafe fn report_panic(
    sink: *const MemplugMessageSink,
    slot: &'static str,
    payload: Box<dyn std::any::Any + Send>,
) -> MemplugStatus {
    // Formatting can itself panic in theory; keep it inside a boundary.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let msg = format!("plugin panicked in `{slot}`: {}", panic_text(&*payload));
        write_message(sink, &msg);
    }));
    Status::Internal.raw()
}

/// Reads an untrusted host struct as a prefix: copies
/// `min(struct_size, sizeof T)` bytes into a zeroed `T`. Refuses NULL and a
/// prefix shorter than `min_size` (the 1.0 size).
///
/// # Safety
/// `p` is NULL or points to at least `struct_size` readable bytes, where
/// `struct_size` is the `u32` at offset 0.
#[inline(always)]
pub unsafe fn read_prefix<T: Copy + Default>(p: *const T, min_size: u32, what: &str) -> PluginResult<T> {
    let mut local = T::default();
    let v = prefix_view(p, min_size, what, &mut local)?;
    Ok(v.read_unaligned())
}

/// [`read_prefix`] without the copy: a pointer to `size_of::<T>()` readable
/// bytes holding the prefix, zero-extended. That is `p` itself for a writer
/// of this minor or newer (the common case, so its fields are loaded straight
/// from the host's struct, each once), or `local` holding the copy of a
/// shorter prefix.
///
/// # Safety
/// As for [`read_prefix`]; the answer may be unaligned and is valid while
/// both `*p` and `local` are.
#[inline(always)]
unsafe fn prefix_view<T: Copy + Default>(
    p: *const T,
    min_size: u32,
    what: &str,
    local: &mut T,
) -> PluginResult<*const T> {
    if p.is_null() {
        return Err(null_argument(what));
    }
    let declared = p.cast::<u32>().read_unaligned();
    if declared as usize >= core::mem::size_of::<T>() {
        return Ok(p);
    }
    *local = read_short_prefix(p, declared, min_size, what)?;
    Ok(local)
}

#[cold]
unsafe fn read_short_prefix<T: Copy + Default>(
    p: *const T,
    declared: u32,
    min_size: u32,
    what: &str,
) -> PluginResult<T> {
    if declared < min_size {
        return Err(short_struct(what, declared, min_size));
    }
    let mut local = T::default();
    core::ptr::copy_nonoverlapping(p.cast::<u8>(), (&mut local as *mut T).cast::<u8>(), declared as usize);
    Ok(local)
}

#[cold]
fn null_argument(what: &str) -> PluginError {
    PluginError::invalid_argument(format!("{what} is NULL"))
}

#[cold]
fn short_struct(what: &str, declared: u32, min_size: u32) -> PluginError {
    PluginError::invalid_argument(format!(
        "{what}.struct_size is {declared}, shorter than the {min_size} bytes of ABI 1.0"
    ))
}

/// How many bytes of a host out-struct the plugin may write: checks NULL
/// and the 1.0 minimum before anything is made, so a bad out-param never
/// strands an object the host cannot receive.
///
/// # Safety
/// `out` is NULL or points to a readable `u32` `struct_size`.
#[inline(always)]
pub unsafe fn out_capacity<T>(out: *mut T, min_size: u32, what: &str) -> PluginResult<usize> {
    if out.is_null() {
        return Err(null_argument(what));
    }
    let declared = out.cast::<u32>().read_unaligned();
    if declared < min_size {
        return Err(short_struct(what, declared, min_size));
    }
    Ok((declared as usize).min(core::mem::size_of::<T>()))
}

/// Writes `value` into a host out-struct whose capacity `out_capacity`
/// returned, leaving the host's `struct_size` as it is.
///
/// # Safety
/// `out` points to at least `capacity` writable bytes, `capacity >= 4`.
#[inline(always)]
pub unsafe fn write_checked<T: Copy>(out: *mut T, value: &T, capacity: usize) {
    if capacity == core::mem::size_of::<T>() {
        // Fixed length: compiles to a few moves. The shorter, variable
        // length lives in its own function so the two copies cannot be
        // merged into one call to `memcpy`.
        let src = (value as *const T).cast::<u8>().add(4);
        let dst = out.cast::<u8>().add(4);
        core::ptr::copy_nonoverlapping(src, dst, core::mem::size_of::<T>() - 4);
    } else {
        write_short(out, value, capacity);
    }
}

/// The part of [`write_checked`] for a host that knows an older, shorter
/// struct.
#[cold]
#[inline(never)]
unsafe fn write_short<T: Copy>(out: *mut T, value: &T, capacity: usize) {
    let src = (value as *const T).cast::<u8>().add(4);
    let dst = out.cast::<u8>().add(4);
    core::ptr::copy_nonoverlapping(src, dst, capacity - 4);
}

/// Writes `value` into a host out-struct, never past the host's
/// `struct_size` (which stays as the host set it).
///
/// # Safety
/// `out` is NULL or points to at least `struct_size` writable bytes.
#[inline(always)]
pub unsafe fn write_prefix<T: Copy>(out: *mut T, value: &T, min_size: u32, what: &str) -> PluginResult<()> {
    let cap = out_capacity(out, min_size, what)?;
    write_checked(out, value, cap);
    Ok(())
}

// Both run on every allocate and free, and callers live in other crates (the
// thunks are instantiated in the plugin), so they must be inlined there. Each
// field is loaded once, straight from the host's struct where it is long
// enough: the plugin sees one snapshot, and nothing is copied through the
// stack.
#[inline(always)]
unsafe fn request_of(p: *const MemplugRequest) -> PluginResult<Request> {
    if p.is_null() {
        return Err(null_argument("request"));
    }
    let declared = p.cast::<u32>().read_unaligned();
    if declared < abi::size_1_0::REQUEST {
        return Err(short_struct("request", declared, abi::size_1_0::REQUEST));
    }
    // Every 1.0 field lies inside the 1.0 prefix the host sent; the 1.1
    // field is read only when the host's struct reaches it (a 1.0 host's
    // request is OTHER). No copy either way: one compare more than 1.0.
    macro_rules! field {
        ($f:ident: $t:ty) => {
            p.cast::<u8>().add(core::mem::offset_of!(MemplugRequest, $f)).cast::<$t>().read_unaligned()
        };
    }
    let class_tag =
        if declared >= abi::size_1_1::REQUEST { field!(class_tag: u32) } else { abi::MEMPLUG_CLASS_OTHER };
    Ok(Request {
        flags: field!(flags: u32),
        size: field!(size: u64),
        alignment: field!(alignment: u64),
        object_id: field!(object_id: u64),
        device: field!(device: MemplugDevice),
        class_tag,
    })
}

#[inline(always)]
unsafe fn object_of(p: *const MemplugObjectRef, what: &str) -> PluginResult<ObjectRef> {
    read_prefix(p, abi::size_1_0::OBJECT_REF, what)
}

#[inline(always)]
unsafe fn block_capacity(out: *mut MemplugBlock) -> PluginResult<usize> {
    out_capacity(out, abi::size_1_0::BLOCK, "out block")
}

#[inline(always)]
unsafe fn write_block(out: *mut MemplugBlock, b: Block, capacity: usize) {
    // `capacity` is at least the 1.0 size (`block_capacity` checked it), so
    // while the struct has not grown since 1.0 the test folds away.
    let full = core::mem::size_of::<MemplugBlock>();
    if capacity == full || abi::size_1_0::BLOCK as usize == full {
        // What `write_checked` writes (every byte but `struct_size`), as
        // four stores rather than a copy through the stack.
        addr_of_mut!((*out).reserved0).write_unaligned(0);
        addr_of_mut!((*out).addr).write_unaligned(b.addr);
        addr_of_mut!((*out).size).write_unaligned(b.size);
        addr_of_mut!((*out).handle).write_unaligned(b.handle);
    } else {
        let v = MemplugBlock { struct_size: 0, reserved0: 0, addr: b.addr, size: b.size, handle: b.handle };
        write_checked(out, &v, capacity);
    }
}

unsafe fn write_u64(out: *mut u64, v: u64, what: &str) -> PluginResult<()> {
    if out.is_null() {
        return Err(PluginError::invalid_argument(format!("{what} is NULL")));
    }
    out.write(v);
    Ok(())
}

#[inline]
unsafe fn this<'a, M>(ctx: *mut c_void) -> &'a M {
    &*(ctx as *const M)
}

// ---- allocator thunks ----

unsafe extern "C" fn a_properties<M: Allocator>(
    ctx: *mut c_void,
    out: *mut MemplugProperties,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "properties", || {
        let p = this::<M>(ctx).properties();
        let v = MemplugProperties {
            struct_size: 0,
            reserved0: 0,
            min_alignment: p.min_alignment,
            max_alignment: p.max_alignment,
            granularity: p.granularity,
        };
        write_prefix(out, &v, abi::size_1_0::PROPERTIES, "out properties")
    })
}

unsafe extern "C" fn a_allocate<M: Allocator>(
    ctx: *mut c_void,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "allocate", || {
        let r = request_of(request)?;
        let cap = block_capacity(out)?;
        let b = this::<M>(ctx).allocate(&r)?;
        write_block(out, b, cap);
        Ok(())
    })
}

unsafe extern "C" fn a_deallocate<M: Allocator>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "deallocate", || this::<M>(ctx).deallocate(&object_of(object, "object")?))
}

unsafe extern "C" fn a_memory_info<M: Allocator>(
    ctx: *mut c_void,
    out: *mut MemplugMemoryInfo,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "memory_info", || {
        let m = this::<M>(ctx).memory_info()?;
        let v = MemplugMemoryInfo {
            struct_size: 0,
            reserved0: 0,
            free_bytes: m.free_bytes,
            total_bytes: m.total_bytes,
        };
        write_prefix(out, &v, abi::size_1_0::MEMORY_INFO, "out memory info")
    })
}

// ---- virtual backing thunks ----

unsafe extern "C" fn v_reserve<M: VirtualBacking>(
    ctx: *mut c_void,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "reserve", || {
        let r = request_of(request)?;
        let cap = block_capacity(out)?;
        let b = this::<M>(ctx).reserve(&r)?;
        write_block(out, b, cap);
        Ok(())
    })
}

unsafe extern "C" fn v_commit<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "commit", || this::<M>(ctx).commit(&object_of(res, "reservation")?, offset, len))
}

unsafe extern "C" fn v_decommit<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "decommit", || this::<M>(ctx).decommit(&object_of(res, "reservation")?, offset, len))
}

unsafe extern "C" fn v_committed<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "committed_bytes", || {
        let n = this::<M>(ctx).committed_bytes(&object_of(res, "reservation")?)?;
        write_u64(out, n, "out_bytes")
    })
}

unsafe extern "C" fn v_release<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "release", || this::<M>(ctx).release(&object_of(res, "reservation")?))
}

// ---- shared mapping thunks ----

unsafe extern "C" fn s_create<M: SharedMapping>(
    ctx: *mut c_void,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "create", || {
        let r = request_of(request)?;
        let cap = block_capacity(out)?;
        let b = this::<M>(ctx).create(&r)?;
        write_block(out, b, cap);
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn s_map<M: SharedMapping>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    object_offset: u64,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    access: u32,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "map", || {
        let acc = Access::from_bits(access).ok_or_else(|| {
            PluginError::invalid_argument(format!(
                "access {access:#x} is neither MEMPLUG_ACCESS_READ nor READ|WRITE"
            ))
        })?;
        this::<M>(ctx).map(
            &object_of(object, "object")?,
            object_offset,
            &object_of(res, "reservation")?,
            offset,
            len,
            acc,
        )
    })
}

unsafe extern "C" fn s_unmap<M: SharedMapping>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "unmap", || this::<M>(ctx).unmap(&object_of(res, "reservation")?, offset, len))
}

unsafe extern "C" fn s_retain<M: SharedMapping>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "retain", || this::<M>(ctx).retain(&object_of(object, "object")?))
}

unsafe extern "C" fn s_release<M: SharedMapping>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "release", || SharedMapping::release(this::<M>(ctx), &object_of(object, "object")?))
}

unsafe extern "C" fn s_export_fd<M: SharedMapping>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    out_fd: *mut i32,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "export_fd", || {
        // Checked before anything is made: a descriptor nobody can receive
        // would leak.
        if out_fd.is_null() {
            return Err(PluginError::invalid_argument("out_fd is NULL"));
        }
        let fd = this::<M>(ctx).export_fd(&object_of(object, "object")?)?;
        out_fd.write(std::os::fd::IntoRawFd::into_raw_fd(fd));
        Ok(())
    })
}

unsafe extern "C" fn s_import_fd<M: SharedMapping>(
    ctx: *mut c_void,
    fd: i32,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "import_fd", || {
        if fd < 0 {
            return Err(PluginError::invalid_argument(format!("fd {fd} is not a file descriptor")));
        }
        let r = request_of(request)?;
        let cap = block_capacity(out)?;
        // SAFETY: the caller keeps `fd` open for the duration of the call
        // (ABI contract); the plugin only borrows it.
        let borrowed = std::os::fd::BorrowedFd::borrow_raw(fd);
        let b = this::<M>(ctx).import_fd(borrowed, &r)?;
        write_block(out, b, cap);
        Ok(())
    })
}

// ---- sync thunks ----

unsafe extern "C" fn y_stream_create<M: StreamSync>(
    ctx: *mut c_void,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "stream_create", || {
        if out.is_null() {
            return Err(PluginError::invalid_argument("out_stream is NULL"));
        }
        let s = this::<M>(ctx).stream_create()?;
        write_u64(out, s, "out_stream")
    })
}

unsafe extern "C" fn y_stream_adopt<M: StreamSync>(
    ctx: *mut c_void,
    native: *mut c_void,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "stream_adopt", || {
        if out.is_null() {
            return Err(PluginError::invalid_argument("out_stream is NULL"));
        }
        let s = this::<M>(ctx).stream_adopt(native)?;
        write_u64(out, s, "out_stream")
    })
}

unsafe extern "C" fn y_stream_destroy<M: StreamSync>(
    ctx: *mut c_void,
    stream: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "stream_destroy", || this::<M>(ctx).stream_destroy(stream))
}

unsafe extern "C" fn y_enqueue<M: StreamSync>(
    ctx: *mut c_void,
    stream: u64,
    func: MemplugHostFn,
    userdata: *mut c_void,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "enqueue_host_fn", || {
        let f = func.ok_or_else(|| PluginError::invalid_argument("func is NULL"))?;
        this::<M>(ctx).enqueue_host_fn(stream, HostFn::new(f, userdata))
    })
}

unsafe extern "C" fn y_fence_record<M: StreamSync>(
    ctx: *mut c_void,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "fence_record", || {
        if out.is_null() {
            return Err(PluginError::invalid_argument("out_fence is NULL"));
        }
        let f = this::<M>(ctx).fence_record(stream)?;
        write_u64(out, f, "out_fence")
    })
}

/// Pending is an answer, not a failure: it gets its code and no message
/// (an empty `String` does not allocate, so polling stays cheap).
#[inline]
fn fence_status(state: FenceState, pending: Status) -> PluginResult<()> {
    match state {
        FenceState::Complete => Ok(()),
        FenceState::Pending => Err(PluginError { status: pending, message: String::new() }),
    }
}

unsafe extern "C" fn y_fence_query<M: StreamSync>(
    ctx: *mut c_void,
    fence: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "fence_query", || fence_status(this::<M>(ctx).fence_query(fence)?, Status::NotReady))
}

unsafe extern "C" fn y_fence_wait<M: StreamSync>(
    ctx: *mut c_void,
    fence: u64,
    timeout_ns: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "fence_wait", || {
        let st = this::<M>(ctx).fence_wait(fence, Duration::from_nanos(timeout_ns))?;
        fence_status(st, Status::Timeout)
    })
}

unsafe extern "C" fn y_fence_destroy<M: StreamSync>(
    ctx: *mut c_void,
    fence: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "fence_destroy", || this::<M>(ctx).fence_destroy(fence))
}

// ---- builders ----

/// One mechanism under construction: a vendor object `M` implementing
/// [`Allocator`] and whichever optional capabilities it opts into.
pub struct MechanismBuilder<M: 'static> {
    name: CString,
    id: u64,
    device: MemplugDevice,
    imp: &'static M,
    virtual_backing: Option<MemplugVirtualBacking>,
    shared_mapping: Option<MemplugSharedMapping>,
    sync: Option<MemplugSync>,
}

impl<M: Allocator> MechanismBuilder<M> {
    /// `id` must be non-zero and unique in the plugin; `name` unique too.
    /// The implementation lives as long as the loaded library.
    pub fn new(name: &str, id: u64, device: MemplugDevice, imp: M) -> Self {
        MechanismBuilder {
            name: CString::new(name).expect("mechanism name contains NUL"),
            id,
            device,
            imp: Box::leak(Box::new(imp)),
            virtual_backing: None,
            shared_mapping: None,
            sync: None,
        }
    }

    /// The implementation, for plugin-level bookkeeping such as
    /// `live_objects`.
    pub fn implementation(&self) -> &'static M {
        self.imp
    }

    pub fn virtual_backing(mut self) -> Self
    where
        M: VirtualBacking,
    {
        self.virtual_backing = Some(MemplugVirtualBacking {
            struct_size: abi::size_1_0::VIRTUAL_BACKING,
            reserved0: 0,
            reserve: Some(v_reserve::<M>),
            commit: Some(v_commit::<M>),
            decommit: Some(v_decommit::<M>),
            committed_bytes: Some(v_committed::<M>),
            release: Some(v_release::<M>),
        });
        self
    }

    pub fn shared_mapping(mut self) -> Self
    where
        M: SharedMapping,
    {
        // The 1.1 table; `build` derives the 1.0 view a 1.0 host gets.
        self.shared_mapping = Some(MemplugSharedMapping {
            struct_size: abi::size_1_1::SHARED_MAPPING,
            reserved0: 0,
            create: Some(s_create::<M>),
            map: Some(s_map::<M>),
            unmap: Some(s_unmap::<M>),
            retain: Some(s_retain::<M>),
            release: Some(s_release::<M>),
            export_fd: if M::CAN_EXPORT { Some(s_export_fd::<M>) } else { None },
            import_fd: if M::CAN_EXPORT { Some(s_import_fd::<M>) } else { None },
        });
        self
    }

    pub fn sync(mut self) -> Self
    where
        M: StreamSync,
    {
        self.sync = Some(MemplugSync {
            struct_size: abi::size_1_0::SYNC,
            reserved0: 0,
            stream_create: Some(y_stream_create::<M>),
            stream_adopt: if M::CAN_ADOPT { Some(y_stream_adopt::<M>) } else { None },
            stream_destroy: Some(y_stream_destroy::<M>),
            enqueue_host_fn: Some(y_enqueue::<M>),
            fence_record: Some(y_fence_record::<M>),
            fence_query: Some(y_fence_query::<M>),
            fence_wait: Some(y_fence_wait::<M>),
            fence_destroy: Some(y_fence_destroy::<M>),
        });
        self
    }

    /// Freezes the mechanism into ABI structs that live as long as the
    /// library (they are leaked on purpose: a plugin descriptor is static).
    /// One descriptor per minor the SDK speaks: a host that agreed on 1.0
    /// gets a 1.0 view (no 1.1 capability bit, 1.0-sized sub-vtables), so
    /// it never sees what it cannot use and a 1.1 host never has to mask.
    pub fn build(self) -> BuiltMechanism {
        fn leak<T>(v: Option<T>) -> *const T {
            v.map_or(core::ptr::null(), |v| Box::leak(Box::new(v)) as *const T)
        }
        let allocator = MemplugAllocator {
            struct_size: abi::size_1_0::ALLOCATOR,
            reserved0: 0,
            properties: Some(a_properties::<M>),
            allocate: Some(a_allocate::<M>),
            deallocate: Some(a_deallocate::<M>),
            memory_info: if M::HAS_MEMORY_INFO { Some(a_memory_info::<M>) } else { None },
        };
        let mut caps = abi::MEMPLUG_CAP_ALLOCATOR;
        if self.virtual_backing.is_some() {
            caps |= abi::MEMPLUG_CAP_VIRTUAL_BACKING;
        }
        if let Some(sm) = &self.shared_mapping {
            caps |= abi::MEMPLUG_CAP_SHARED_MAPPING;
            if sm.export_fd.is_some() {
                caps |= abi::MEMPLUG_CAP_SHARED_EXPORT;
            }
        }
        if self.sync.is_some() {
            caps |= abi::MEMPLUG_CAP_SYNC;
        }
        // ABI 1.0's view of the shared mapping table: the 1.0 prefix only.
        let shared_1_0 = self.shared_mapping.map(|sm| MemplugSharedMapping {
            struct_size: abi::size_1_0::SHARED_MAPPING,
            export_fd: None,
            import_fd: None,
            ..sm
        });
        let mech_1_1 = MemplugMechanism {
            struct_size: abi::size_1_1::MECHANISM,
            capabilities: caps,
            mechanism_id: self.id,
            name: self.name.into_raw(),
            device: self.device,
            ctx: self.imp as *const M as *mut c_void,
            allocator: leak(Some(allocator)),
            virtual_backing: leak(self.virtual_backing),
            shared_mapping: leak(self.shared_mapping),
            sync: leak(self.sync),
        };
        let mech_1_0 = MemplugMechanism {
            struct_size: abi::size_1_0::MECHANISM,
            capabilities: caps & abi::MEMPLUG_CAP_ALL_1_0,
            shared_mapping: leak(shared_1_0),
            ..mech_1_1
        };
        BuiltMechanism([Box::leak(Box::new(mech_1_0)), Box::leak(Box::new(mech_1_1))])
    }
}

/// A mechanism frozen into its ABI descriptors, one per minor the SDK
/// speaks (index = minor).
pub struct BuiltMechanism([&'static MemplugMechanism; VIEWS]);

/// Number of minors this SDK writes descriptors for (1.0 and 1.1).
const VIEWS: usize = abi::MEMPLUG_ABI_MINOR as usize + 1;

/// The whole plugin under construction.
pub struct PluginBuilder {
    name: &'static str,
    version: &'static str,
    min_minor: u32,
    max_minor: u32,
    mechanisms: Vec<BuiltMechanism>,
    live_objects: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
}

impl PluginBuilder {
    pub fn new(name: &'static str, version: &'static str) -> Self {
        PluginBuilder {
            name,
            version,
            min_minor: 0,
            max_minor: abi::MEMPLUG_ABI_MINOR,
            mechanisms: Vec::new(),
            live_objects: None,
        }
    }

    /// Narrows the minor range the plugin speaks (default: 0 to the SDK's
    /// newest).
    pub fn minors(mut self, min: u32, max: u32) -> Self {
        self.min_minor = min;
        self.max_minor = max;
        self
    }

    pub fn mechanism(mut self, m: BuiltMechanism) -> Self {
        self.mechanisms.push(m);
        self
    }

    /// How many objects the plugin holds alive (required: the host's unload
    /// gate asks it).
    pub fn live_objects(mut self, f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.live_objects = Some(Box::new(f));
        self
    }

    pub fn build(self) -> ExportedPlugin {
        let live = self.live_objects.expect("PluginBuilder::live_objects is required");
        let live: &'static (dyn Fn() -> u64 + Send + Sync) = Box::leak(live);
        let live_ctx: &'static LiveFn = Box::leak(Box::new(LiveFn(live)));
        let name = CString::new(self.name).expect("plugin name contains NUL").into_raw();
        let version = CString::new(self.version).expect("plugin version contains NUL").into_raw();
        let count = self.mechanisms.len() as u32;
        let descs = core::array::from_fn(|minor| {
            let ptrs: Vec<*const MemplugMechanism> =
                self.mechanisms.iter().map(|m| m.0[minor] as *const _).collect();
            let desc = MemplugPlugin {
                struct_size: abi::size_1_0::PLUGIN,
                abi_major: abi::MEMPLUG_ABI_MAJOR,
                min_minor: self.min_minor,
                max_minor: self.max_minor,
                name,
                version,
                ctx: live_ctx as *const LiveFn as *mut c_void,
                mechanism_count: count,
                reserved0: 0,
                mechanisms: Box::leak(ptrs.into_boxed_slice()).as_ptr(),
                live_objects: Some(live_thunk),
                unload: None,
            };
            &*Box::leak(Box::new(desc))
        });
        ExportedPlugin { descs, max_minor: self.max_minor }
    }
}

struct LiveFn(&'static (dyn Fn() -> u64 + Send + Sync));

unsafe extern "C" fn live_thunk(ctx: *mut c_void) -> u64 {
    // A panic here cannot be reported through a status; report "still
    // alive" so the host refuses to unload, the conservative answer.
    catch_unwind(AssertUnwindSafe(|| (this::<LiveFn>(ctx).0)())).unwrap_or(u64::MAX)
}

/// A finished plugin descriptor (one view per minor), static for the life
/// of the library.
pub struct ExportedPlugin {
    descs: [&'static MemplugPlugin; VIEWS],
    max_minor: u32,
}

// SAFETY: the descriptor is immutable after build and every slot is required
// by the ABI to be callable from any thread.
unsafe impl Send for ExportedPlugin {}
unsafe impl Sync for ExportedPlugin {}

impl ExportedPlugin {
    /// The descriptor of the newest minor the plugin speaks.
    pub fn descriptor(&self) -> &'static MemplugPlugin {
        self.descriptor_for(self.max_minor)
    }

    /// The descriptor a host that agreed on `minor` gets: what ABI 1.`minor`
    /// defines and nothing newer (minors past this SDK's newest get its
    /// newest view).
    pub fn descriptor_for(&self, minor: u32) -> &'static MemplugPlugin {
        self.descs[(minor as usize).min(VIEWS - 1)]
    }
}

/// Storage for a plugin built on first negotiation.
pub type PluginCell = OnceLock<Result<ExportedPlugin, String>>;

/// The body of an entry symbol: builds the plugin once, negotiates the minor
/// with the host (two-sided), writes the answer.
///
/// # Safety
/// Pointers as the entry-symbol contract (`MemplugEntryV1`) describes.
pub unsafe fn negotiate(
    cell: &PluginCell,
    init: fn() -> ExportedPlugin,
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "memplug_plugin_v1", || {
        let host = read_prefix(host, abi::size_1_0::HOST_INFO, "host info")?;
        if host.abi_major != abi::MEMPLUG_ABI_MAJOR {
            return Err(PluginError::new(
                Status::VersionMismatch,
                format!("host speaks ABI major {}, this entry serves major 1", host.abi_major),
            ));
        }
        let plugin = cell
            .get_or_init(|| {
                catch_unwind(init).map_err(|p| format!("plugin init panicked: {}", panic_text(&*p)))
            })
            .as_ref()
            .map_err(|e| PluginError::internal(e.clone()))?;
        let d = plugin.descriptor();
        let lo = host.min_minor.max(d.min_minor);
        let hi = host.max_minor.min(d.max_minor);
        if lo > hi {
            return Err(PluginError::new(
                Status::VersionMismatch,
                format!(
                    "no common minor: host speaks 1.{}..=1.{}, plugin speaks 1.{}..=1.{}",
                    host.min_minor, host.max_minor, d.min_minor, d.max_minor
                ),
            ));
        }
        let answer =
            MemplugNegotiation { struct_size: 0, agreed_minor: hi, plugin: plugin.descriptor_for(hi) };
        write_prefix(out, &answer, abi::size_1_0::NEGOTIATION, "out negotiation")
    })
}

/// Exports a plugin from a cdylib: defines the `memplug_plugin_v1` entry
/// symbol around `init: fn() -> ExportedPlugin`.
///
/// ```ignore
/// memplug_sdk::export_plugin!(my_plugin);
/// fn my_plugin() -> memplug_sdk::ExportedPlugin { /* PluginBuilder … */ }
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($init:path) => {
        /// memplug entry symbol, ABI major 1.
        ///
        /// # Safety
        /// Called by a memplug host according to `memplug.h`.
        #[no_mangle]
        pub unsafe extern "C" fn memplug_plugin_v1(
            host: *const $crate::abi::MemplugHostInfo,
            out: *mut $crate::abi::MemplugNegotiation,
            sink: *const $crate::abi::MemplugMessageSink,
        ) -> $crate::abi::MemplugStatus {
            static CELL: $crate::export::PluginCell = $crate::export::PluginCell::new();
            $crate::export::negotiate(&CELL, $init, host, out, sink)
        }
    };
}

/// Defines an entry function with the `memplug_plugin_v1` signature under
/// another, unexported name: for plugins linked into the host's own binary
/// and handed to the loader as an in-process entry.
#[macro_export]
macro_rules! declare_entry {
    ($vis:vis $name:ident, $init:path) => {
        /// In-process memplug entry function, ABI major 1.
        ///
        /// # Safety
        /// Called by a memplug host according to `memplug.h`.
        $vis unsafe extern "C" fn $name(
            host: *const $crate::abi::MemplugHostInfo,
            out: *mut $crate::abi::MemplugNegotiation,
            sink: *const $crate::abi::MemplugMessageSink,
        ) -> $crate::abi::MemplugStatus {
            static CELL: $crate::export::PluginCell = $crate::export::PluginCell::new();
            $crate::export::negotiate(&CELL, $init, host, out, sink)
        }
    };
}
