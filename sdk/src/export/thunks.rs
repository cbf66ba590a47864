//! The slot functions a vtable publishes, generic over the vendor's
//! implementation `M`: each reads its arguments ([`super::args`]), checks
//! what the mechanism's facts decide ([`super::context`]: request flags,
//! size, alignment and device; references' mechanism and device; ranges),
//! calls the author trait behind [`guard`], and writes its out-params only
//! on success.

use super::args::{block_capacity, object_of, request_of, write_block, write_out, write_u64};
use super::context::{mech, MechCtx};
use super::guard::guard;
use crate::abi::*;
use crate::author::*;
use crate::status::Status;
use core::ffi::c_void;
use std::time::Duration;

impl<M> MechCtx<M> {
    /// Reads an object reference (`kind` names the argument when it is
    /// malformed) and checks it names this mechanism and device (`what`
    /// names the object in the refusal).
    ///
    /// # Safety
    /// `p` as for [`object_of`].
    #[inline(always)]
    unsafe fn object(
        &self,
        p: *const MemplugObjectRef,
        kind: &'static str,
        what: &'static str,
    ) -> PluginResult<ObjectRef> {
        let o = object_of(p, kind)?;
        self.facts.object(&o, what)?;
        Ok(o)
    }

    /// The body of the slots that act on a range of a reservation
    /// (`commit`, `decommit`, `unmap`, and 1.2's queued twins): the
    /// reservation checked, the range checked, then `act`.
    ///
    /// # Safety
    /// `res` as for [`object_of`].
    #[inline(always)]
    pub(super) unsafe fn on_range<R>(
        &self,
        res: *const MemplugObjectRef,
        offset: u64,
        len: u64,
        slot: &'static str,
        reservation: &'static str,
        act: impl FnOnce(&ObjectRef) -> PluginResult<R>,
    ) -> PluginResult<R> {
        let r = object_of(res, "reservation")?;
        self.facts.object(&r, reservation)?;
        self.facts.range(offset, len, slot)?;
        act(&r)
    }

    /// The arguments of `map` (and 1.2's `map_on`): the physical object and
    /// the reservation read and checked against this mechanism, both
    /// ranges checked (`on_object` and `on_reservation` name them in a
    /// refusal).
    ///
    /// # Safety
    /// `object` and `res` as for [`object_of`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn mapping(
        &self,
        object: *const MemplugObjectRef,
        object_offset: u64,
        res: *const MemplugObjectRef,
        offset: u64,
        len: u64,
        on_object: &'static str,
        on_reservation: &'static str,
    ) -> PluginResult<(ObjectRef, ObjectRef)> {
        let o = object_of(object, "object")?;
        let r = object_of(res, "reservation")?;
        self.facts.object(&o, on_object)?;
        self.facts.object(&r, on_reservation)?;
        self.facts.range(object_offset, len, on_object)?;
        self.facts.range(offset, len, on_reservation)?;
        Ok((o, r))
    }

    /// The body of every slot that makes an object from a request other
    /// than `allocate` (`reserve`, `create`, `import_fd`): read and check
    /// the request, check the out-block before anything is made, make it,
    /// write the block.
    ///
    /// # Safety
    /// `request` as for [`request_of`], `out` as for [`block_capacity`].
    #[inline(always)]
    unsafe fn make_block(
        &self,
        request: *const MemplugRequest,
        out: *mut MemplugBlock,
        what: &'static str,
        make: impl FnOnce(&Request) -> PluginResult<Block>,
    ) -> PluginResult<()> {
        let r = request_of(request)?;
        self.facts.request(&r, what)?;
        let cap = block_capacity(out)?;
        write_block(out, make(&r)?, cap);
        Ok(())
    }
}

// ---- allocator thunks ----

pub(super) unsafe extern "C" fn a_properties<M: Allocator>(
    ctx: *mut c_void,
    out: *mut MemplugProperties,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "properties", || {
        // The copy taken at build time, which every check uses.
        let f = &mech::<M>(ctx)?.facts;
        let p = f.properties;
        let mut v = MemplugProperties {
            min_alignment: p.min_alignment,
            max_alignment: p.max_alignment,
            granularity: p.granularity,
            ..Default::default()
        };
        // The 1.2 descriptor: written only as far as the host's struct
        // reaches (a 1.0/1.1 host's ends before it).
        f.descriptor.write_into(&mut v);
        // The 1.3 copy spaces, likewise only within a 1.3 host's struct.
        v.copy_kinds = f.copy_kinds();
        write_out(out, &v, "out properties")
    })
}

pub(super) unsafe extern "C" fn a_allocate<M: Allocator>(
    ctx: *mut c_void,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "allocate", || {
        let m = mech::<M>(ctx)?;
        let r = m.facts.allocation(request_of(request)?)?;
        let cap = block_capacity(out)?;
        let b = m.imp.allocate(&r)?;
        write_block(out, b, cap);
        Ok(())
    })
}

pub(super) unsafe extern "C" fn a_deallocate<M: Allocator>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "deallocate", || {
        let m = mech::<M>(ctx)?;
        let o = m.object(object, "object", "deallocate: allocation")?;
        m.imp.deallocate(&o)
    })
}

pub(super) unsafe extern "C" fn a_memory_info<M: Allocator>(
    ctx: *mut c_void,
    out: *mut MemplugMemoryInfo,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "memory_info", || {
        let m = mech::<M>(ctx)?.imp.memory_info()?;
        let v = MemplugMemoryInfo {
            struct_size: 0,
            reserved0: 0,
            free_bytes: m.free_bytes,
            total_bytes: m.total_bytes,
        };
        write_out(out, &v, "out memory info")
    })
}

// ---- virtual backing thunks ----

pub(super) unsafe extern "C" fn v_reserve<M: VirtualBacking>(
    ctx: *mut c_void,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "reserve", || {
        let m = mech::<M>(ctx)?;
        m.make_block(request, out, "reserve", |r| m.imp.reserve(r))
    })
}

pub(super) unsafe extern "C" fn v_commit<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "commit", || {
        let m = mech::<M>(ctx)?;
        m.on_range(res, offset, len, "commit", "commit: reservation", |r| m.imp.commit(r, offset, len))
    })
}

pub(super) unsafe extern "C" fn v_decommit<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "decommit", || {
        let m = mech::<M>(ctx)?;
        m.on_range(res, offset, len, "decommit", "decommit: reservation", |r| m.imp.decommit(r, offset, len))
    })
}

pub(super) unsafe extern "C" fn v_committed<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "committed_bytes", || {
        let m = mech::<M>(ctx)?;
        let r = m.object(res, "reservation", "committed_bytes: reservation")?;
        let n = m.imp.committed_bytes(&r)?;
        write_u64(out, n, "out_bytes")
    })
}

pub(super) unsafe extern "C" fn v_release<M: VirtualBacking>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "release", || {
        let m = mech::<M>(ctx)?;
        let r = m.object(res, "reservation", "release: reservation")?;
        VirtualBacking::release(&m.imp, &r)
    })
}

// ---- shared mapping thunks ----

pub(super) unsafe extern "C" fn s_create<M: SharedMapping>(
    ctx: *mut c_void,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "create", || {
        let m = mech::<M>(ctx)?;
        m.make_block(request, out, "create", |r| m.imp.create(r))
    })
}

#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn s_map<M: SharedMapping>(
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
        let m = mech::<M>(ctx)?;
        let (o, r) =
            m.mapping(object, object_offset, res, offset, len, "map: physical object", "map: reservation")?;
        m.imp.map(&o, object_offset, &r, offset, len, acc)
    })
}

pub(super) unsafe extern "C" fn s_unmap<M: SharedMapping>(
    ctx: *mut c_void,
    res: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "unmap", || {
        let m = mech::<M>(ctx)?;
        m.on_range(res, offset, len, "unmap", "unmap: reservation", |r| m.imp.unmap(r, offset, len))
    })
}

pub(super) unsafe extern "C" fn s_retain<M: SharedMapping>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "retain", || {
        let m = mech::<M>(ctx)?;
        let o = m.object(object, "object", "retain: physical object")?;
        m.imp.retain(&o)
    })
}

pub(super) unsafe extern "C" fn s_release<M: SharedMapping>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "release", || {
        let m = mech::<M>(ctx)?;
        let o = m.object(object, "object", "release: physical object")?;
        SharedMapping::release(&m.imp, &o)
    })
}

pub(super) unsafe extern "C" fn s_export_fd<M: SharedMapping>(
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
        let m = mech::<M>(ctx)?;
        let o = m.object(object, "object", "export_fd: physical object")?;
        let fd = m.imp.export_fd(&o)?;
        out_fd.write(std::os::fd::IntoRawFd::into_raw_fd(fd));
        Ok(())
    })
}

pub(super) unsafe extern "C" fn s_import_fd<M: SharedMapping>(
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
        let m = mech::<M>(ctx)?;
        // SAFETY: the caller keeps `fd` open for the duration of the call
        // (ABI contract); the plugin only borrows it.
        let borrowed = std::os::fd::BorrowedFd::borrow_raw(fd);
        m.make_block(request, out, "import_fd", |r| m.imp.import_fd(borrowed, r))
    })
}

/// One kind of the mechanism's `export_types`, or `UNSUPPORTED` naming it.
fn offered_kind(offered: u32, kind: u32, slot: &str) -> PluginResult<()> {
    if kind.is_power_of_two() && offered & kind != 0 {
        return Ok(());
    }
    Err(PluginError::unsupported(format!(
        "{slot}: handle kind {kind:#x} is not one this mechanism offers (export_types {offered:#x})"
    )))
}

pub(super) unsafe extern "C" fn s_export_handle<M: SharedMapping>(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    handle_type: u32,
    out: *mut MemplugHandle,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "export_handle", || {
        let m = mech::<M>(ctx)?;
        let o = m.object(object, "object", "export_handle: physical object")?;
        offered_kind(m.facts.descriptor.export_types, handle_type, "export_handle")?;
        // Checked before anything is made: a handle nobody can receive
        // would leak.
        crate::prefix::out_capacity(out)
            .map_err(|_| PluginError::invalid_argument("out handle is NULL or short"))?;
        let h = m.imp.export_handle(&o, handle_type)?;
        if h.kind() != handle_type {
            return Err(PluginError::internal(format!(
                "export_handle: the plugin made a handle of kind {:#x} where {handle_type:#x} was asked",
                h.kind()
            )));
        }
        let mut v = MemplugHandle { handle_type, ..Default::default() };
        match h {
            crate::Handle::Fd { fd, .. } => v.fd = std::os::fd::IntoRawFd::into_raw_fd(fd),
            crate::Handle::Win32(w) => v.win32 = w,
            crate::Handle::Blob(b) => {
                if b.len() > v.blob.len() {
                    return Err(PluginError::internal(format!(
                        "export_handle: a blob of {} bytes (at most 64)",
                        b.len()
                    )));
                }
                v.blob[..b.len()].copy_from_slice(&b);
                v.blob_len = b.len() as u32;
            }
        }
        // The capacity was checked above, so this cannot fail and the new
        // descriptor reaches the caller.
        write_out(out, &v, "out handle")
    })
}

pub(super) unsafe extern "C" fn s_import_handle<M: SharedMapping>(
    ctx: *mut c_void,
    handle: *const MemplugHandle,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "import_handle", || {
        let m = mech::<M>(ctx)?;
        let h: MemplugHandle = super::args::read_in(handle, "handle")?;
        offered_kind(m.facts.descriptor.export_types, h.handle_type, "import_handle")?;
        let borrowed = if h.handle_type & crate::descriptor::FD_KINDS != 0 {
            if h.fd < 0 {
                return Err(PluginError::invalid_argument(format!(
                    "handle.fd {} is not a file descriptor",
                    h.fd
                )));
            }
            // SAFETY: the caller keeps the descriptor open for the call
            // (ABI contract); the plugin only borrows it.
            crate::HandleRef::Fd { kind: h.handle_type, fd: std::os::fd::BorrowedFd::borrow_raw(h.fd) }
        } else if h.handle_type == MEMPLUG_HANDLE_WIN32 {
            crate::HandleRef::Win32(h.win32)
        } else {
            let n = h.blob_len as usize;
            if n > h.blob.len() {
                return Err(PluginError::invalid_argument(format!("handle.blob_len {n} is over 64")));
            }
            // The bytes are read out of the caller's struct before the
            // vendor sees them (one snapshot).
            return m.make_block(request, out, "import_handle", |r| {
                m.imp.import_handle(crate::HandleRef::Blob(&h.blob[..n]), r)
            });
        };
        m.make_block(request, out, "import_handle", |r| m.imp.import_handle(borrowed, r))
    })
}

// ---- sync thunks ----

pub(super) unsafe extern "C" fn y_stream_create<M: StreamSync>(
    ctx: *mut c_void,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "stream_create", || {
        if out.is_null() {
            return Err(PluginError::invalid_argument("out_stream is NULL"));
        }
        let s = mech::<M>(ctx)?.imp.stream_create()?;
        write_u64(out, s, "out_stream")
    })
}

pub(super) unsafe extern "C" fn y_stream_adopt<M: StreamSync>(
    ctx: *mut c_void,
    native: *mut c_void,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "stream_adopt", || {
        if out.is_null() {
            return Err(PluginError::invalid_argument("out_stream is NULL"));
        }
        let s = mech::<M>(ctx)?.imp.stream_adopt(native)?;
        write_u64(out, s, "out_stream")
    })
}

pub(super) unsafe extern "C" fn y_stream_destroy<M: StreamSync>(
    ctx: *mut c_void,
    stream: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "stream_destroy", || mech::<M>(ctx)?.imp.stream_destroy(stream))
}

pub(super) unsafe extern "C" fn y_enqueue<M: StreamSync>(
    ctx: *mut c_void,
    stream: u64,
    func: MemplugHostFn,
    userdata: *mut c_void,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "enqueue_host_fn", || {
        let f = func.ok_or_else(|| PluginError::invalid_argument("func is NULL"))?;
        mech::<M>(ctx)?.imp.enqueue_host_fn(stream, HostFn::new(f, userdata))
    })
}

pub(super) unsafe extern "C" fn y_fence_record<M: StreamSync>(
    ctx: *mut c_void,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "fence_record", || {
        if out.is_null() {
            return Err(PluginError::invalid_argument("out_fence is NULL"));
        }
        let f = mech::<M>(ctx)?.imp.fence_record(stream)?;
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

pub(super) unsafe extern "C" fn y_fence_query<M: StreamSync>(
    ctx: *mut c_void,
    fence: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "fence_query", || fence_status(mech::<M>(ctx)?.imp.fence_query(fence)?, Status::NotReady))
}

pub(super) unsafe extern "C" fn y_fence_wait<M: StreamSync>(
    ctx: *mut c_void,
    fence: u64,
    timeout_ns: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "fence_wait", || {
        let st = mech::<M>(ctx)?.imp.fence_wait(fence, Duration::from_nanos(timeout_ns))?;
        fence_status(st, Status::Timeout)
    })
}

pub(super) unsafe extern "C" fn y_fence_destroy<M: StreamSync>(
    ctx: *mut c_void,
    fence: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard(sink, "fence_destroy", || mech::<M>(ctx)?.imp.fence_destroy(fence))
}
