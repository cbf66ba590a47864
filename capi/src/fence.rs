//! Streams and fences: recorded by a plugin on a stream it made, or
//! supplied by the runtime as a query/wait callback pair.

use crate::callbacks::{CallbackScope, UserData};
use crate::common::{MemplugHostFence, MemplugHostManager, MemplugHostMechanism, MemplugHostStream};
use crate::error::{boundary, c_str, require_non_null, write_out, Error, Result};
use crate::handle::Kind;
use crate::manager_tables::{self, pin, pin_manager, same_manager, FenceEntry, StreamEntry, Tables};
use crate::slot_table::Pinned;
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use memplug_host_dep::registry::Context;
use memplug_host_dep::{FnFence, PluginFence, SharedFence};
use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Fences resolved from C handles: up to four kept inline (the common
/// case costs no allocation), more on the heap.
pub(crate) enum Fences {
    Inline([Option<SharedFence>; 4]),
    Heap(Vec<SharedFence>),
}

impl Fences {
    pub(crate) fn into_vec(self) -> Vec<SharedFence> {
        self.into_iter().collect()
    }
}

impl IntoIterator for Fences {
    type Item = SharedFence;
    type IntoIter = std::iter::Chain<
        std::iter::Flatten<std::array::IntoIter<Option<SharedFence>, 4>>,
        std::vec::IntoIter<SharedFence>,
    >;
    fn into_iter(self) -> Self::IntoIter {
        match self {
            Fences::Inline(a) => a.into_iter().flatten().chain(Vec::new()),
            Fences::Heap(v) => [None, None, None, None].into_iter().flatten().chain(v),
        }
    }
}

/// Resolves `count` fence handles of the manager in seat `manager`.
/// Inlined into the frees: out of line, its 72-byte result was copied
/// twice more on its way to `release_after`.
///
/// # Safety
/// `fences` must be NULL or readable for `count` handles.
#[inline(always)]
pub(crate) unsafe fn collect_fences(
    manager: u32,
    fences: *const MemplugHostFence,
    count: usize,
) -> Result<Fences> {
    if count == 0 {
        return Ok(Fences::Inline([None, None, None, None]));
    }
    require_non_null(fences, "fences")?;
    if count > (isize::MAX as usize) / std::mem::size_of::<MemplugHostFence>() {
        return Err(Error::new(S::InvalidArgument, format!("{count} fences overflow")));
    }
    // SAFETY: non-NULL, `count` readable handles by the caller's contract.
    let hs = unsafe { std::slice::from_raw_parts(fences, count) };
    let resolve = |h: &MemplugHostFence| resolve_fence(manager, *h).map(|(f, _)| f);
    if count <= 4 {
        let mut out = [None, None, None, None];
        for (o, h) in out.iter_mut().zip(hs) {
            *o = Some(resolve(h)?);
        }
        return Ok(Fences::Inline(out));
    }
    hs.iter().map(resolve).collect::<Result<Vec<_>>>().map(Fences::Heap)
}

/// Resolves one fence handle of the manager in seat `manager` to the fence
/// it names (its own reference). Always inlined: the single-fence frees
/// call it directly, without [`Fences`] (callgrind: the four-slot array,
/// its pattern match and its drop cost them more than the lookup).
/// Also returns the seat's tables, for the caller's next lookup there: the
/// handle is decoded and the tables found once.
#[inline(always)]
pub(crate) fn resolve_fence(manager: u32, h: MemplugHostFence) -> Result<(SharedFence, &'static Tables)> {
    let (f, tables) = pin_fence(manager, h)?;
    Ok((SharedFence::clone(&f.fence), tables))
}

/// [`resolve_fence`] leaving the fence's entry pinned, for a caller that
/// clones the fence where it is used (the single-fence free: its reference
/// is made in place, not moved through the stack).
#[inline(always)]
pub(crate) fn pin_fence(manager: u32, h: MemplugHostFence) -> Result<(Pinned<FenceEntry>, &'static Tables)> {
    let raw = crate::handle::expect(h.id, Kind::Fence)?;
    if raw.manager != manager {
        return Err(manager_tables::wrong_manager(h.id, Kind::Fence));
    }
    manager_tables::pin_raw::<FenceEntry>(raw, h.id)
}

/// Creates a stream on a mechanism with the sync capability
/// (`MEMPLUG_HOST_STATUS_UNSUPPORTED` without). Work enqueued on it runs in
/// order; fences recorded on it complete when the work before them has run.
///
/// Ownership: the caller owns the handle (`memplug_host_stream_destroy`).
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_stream_create(
    mechanism: MemplugHostMechanism,
    out: *mut MemplugHostStream,
) -> MemplugHostStatus {
    boundary("memplug_host_stream_create", || {
        require_non_null(out, "out")?;
        let (ctx, seat) = pin::<Arc<Context>>(mechanism.id)?;
        let mech = ctx.mechanism().clone();
        drop(ctx);
        let sync = mech.sync().ok_or_else(|| {
            Error::new(S::Unsupported, format!("mechanism {} has no sync capability", mech.label()))
        })?;
        let stream = sync.stream_create()?;
        let entry = StreamEntry { mechanism: mech, stream: Mutex::new(Some(stream)) };
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, entry, [0, 0], out, |id| MemplugHostStream { id }) }
    })
}

/// Wraps a runtime's own stream as a host stream (C API 1.1; the plugin's
/// `stream_adopt_typed`, plugin ABI 1.2): `native_kind` is the
/// `MEMPLUG_DEVICE_*` kind (memplug.h) of the API that made `native` —
/// `MEMPLUG_DEVICE_CUDA` for a `CUstream` — so the plugin can check it is a
/// stream it knows how to use. `native` is passed through as it is (NULL
/// included: CUDA's default stream is NULL). Work enqueued on the host
/// stream, fences recorded on it and queued operations
/// (`memplug_host_region_grow_on`) are ordered with the runtime's own work
/// on that stream.
///
/// A mechanism without the sync capability, or whose plugin does not
/// publish `stream_adopt_typed` (optional, plugin ABI 1.2), refuses with
/// `MEMPLUG_HOST_STATUS_UNSUPPORTED`; so does the plugin for a kind it does
/// not adopt. Nothing is made on refusal.
///
/// Ownership: the caller owns the handle (`memplug_host_stream_destroy`,
/// which ends the plugin's wrapper, never the native stream: that stays
/// the runtime's, and must outlive the handle). Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable; `native` a live stream of the API
/// `native_kind` names (or what that API accepts as one), valid until the
/// handle is destroyed.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_stream_adopt_typed(
    mechanism: MemplugHostMechanism,
    native_kind: u32,
    native: *mut c_void,
    out: *mut MemplugHostStream,
) -> MemplugHostStatus {
    boundary("memplug_host_stream_adopt_typed", || {
        require_non_null(out, "out")?;
        let (ctx, seat) = pin::<Arc<Context>>(mechanism.id)?;
        let mech = ctx.mechanism().clone();
        drop(ctx);
        let sync = mech.sync().ok_or_else(|| {
            Error::new(S::Unsupported, format!("mechanism {} has no sync capability", mech.label()))
        })?;
        // The table slot first: an adopted stream is never made and then
        // dropped for want of a handle.
        let vacant = manager_tables::vacant::<StreamEntry>(seat)?;
        // SAFETY: the caller vouches for `native` (this function's contract).
        let stream = unsafe { sync.stream_adopt_typed(native_kind, native) }?;
        let entry = StreamEntry { mechanism: mech, stream: Mutex::new(Some(stream)) };
        let id = manager_tables::fill(seat, vacant, entry, [0, 0]);
        // SAFETY: `out` was checked non-NULL.
        unsafe { write_out(out, MemplugHostStream { id }) };
        Ok(())
    })
}

/// Destroys a stream after the work submitted to it has run (as the
/// plugin defines). Fences recorded on it stay valid. The zero handle is a
/// no-op. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_stream_destroy(stream: MemplugHostStream) -> MemplugHostStatus {
    boundary("memplug_host_stream_destroy", || {
        manager_tables::remove::<StreamEntry>(stream.id)?;
        Ok(())
    })
}

/// Enqueues `fn(userdata)` on a stream: it runs once, on the stream's
/// thread, after the work submitted before it (as CUDA's
/// `cuLaunchHostFunc`). This is how CPU streams get work, and how a runtime
/// puts real in-flight work in front of a free.
///
/// Thread-safety: any thread. `userdata` must stay valid until `fn` runs.
///
/// # Safety
/// `fn` must be callable as documented by `MemplugHostStreamFn`.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_stream_enqueue(
    stream: MemplugHostStream,
    func: MemplugHostStreamFn,
    userdata: *mut c_void,
) -> MemplugHostStatus {
    boundary("memplug_host_stream_enqueue", || {
        let Some(f) = func else {
            return Err(Error::null("fn"));
        };
        let (e, _) = pin::<StreamEntry>(stream.id)?;
        let ud = UserData(userdata);
        let guard = e.stream.lock().unwrap_or_else(|p| p.into_inner());
        let s = guard.as_ref().ok_or_else(|| Error::new(S::InvalidState, "the stream was destroyed"))?;
        let sync = e.mechanism.sync().expect("checked at creation");
        sync.enqueue(s, move || {
            let ud = ud;
            let _scope = CallbackScope::enter();
            // SAFETY: the caller's function and userdata, called once.
            unsafe { f(ud.0) }
        })?;
        Ok(())
    })
}

/// Records a fence after the work submitted to `stream` so far.
///
/// Ownership: the caller owns the handle (`memplug_host_fence_release`).
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_fence_record(
    stream: MemplugHostStream,
    out: *mut MemplugHostFence,
) -> MemplugHostStatus {
    boundary("memplug_host_fence_record", || {
        require_non_null(out, "out")?;
        let (e, seat) = pin::<StreamEntry>(stream.id)?;
        let guard = e.stream.lock().unwrap_or_else(|p| p.into_inner());
        let s = guard.as_ref().ok_or_else(|| Error::new(S::InvalidState, "the stream was destroyed"))?;
        let f = PluginFence::record_typed(&e.mechanism, s)?;
        drop(guard);
        let entry = FenceEntry { fence: f.clone(), recorded: Some(f) };
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, entry, [0, 0], out, |id| MemplugHostFence { id }) }
    })
}

/// Orders `stream` behind `fence`: work enqueued on the stream after this
/// call runs only once the fence has completed; the caller does not wait
/// (as CUDA's `cuStreamWaitEvent`). The fence must have been recorded
/// (`memplug_host_fence_record`) on a stream of the same mechanism —
/// possibly this one — and belong to the stream's manager
/// (`MEMPLUG_HOST_STATUS_WRONG_MANAGER` otherwise); a fence of another
/// mechanism is refused with the host's code (`_WRONG_MECHANISM`), one
/// made by `memplug_host_fence_from_callbacks` with `_INVALID_ARGUMENT`
/// (no plugin can wait on a runtime's callbacks: wait for it on the host,
/// then enqueue). A plugin that does not publish `stream_wait_fence`
/// (optional, plugin ABI 1.2) refuses with `MEMPLUG_HOST_STATUS_UNSUPPORTED`.
///
/// Ownership: both handles stay the caller's; releasing the fence handle
/// afterwards does not undo the wait. Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_stream_wait_fence(
    stream: MemplugHostStream,
    fence: MemplugHostFence,
) -> MemplugHostStatus {
    boundary("memplug_host_stream_wait_fence", || {
        let (e, seat) = pin::<StreamEntry>(stream.id)?;
        crate::handle::expect(fence.id, Kind::Fence)?;
        same_manager(seat, fence.id, Kind::Fence)?;
        let (f, _) = pin::<FenceEntry>(fence.id)?;
        let recorded = f.recorded.clone().ok_or_else(|| {
            Error::new(
                S::InvalidArgument,
                "the fence was made by memplug_host_fence_from_callbacks: a stream waits only on a fence \
                 recorded on a stream of its mechanism (memplug_host_fence_record)",
            )
        })?;
        drop(f);
        let guard = e.stream.lock().unwrap_or_else(|p| p.into_inner());
        let s = guard.as_ref().ok_or_else(|| Error::new(S::InvalidState, "the stream was destroyed"))?;
        let sync = e.mechanism.sync().expect("checked at creation");
        sync.stream_wait_fence(s, recorded.token())?;
        Ok(())
    })
}

struct RuntimeFence {
    query: unsafe extern "C" fn(*mut c_void) -> bool,
    wait: MemplugHostFenceWaitFn,
    release: MemplugHostReleaseFn,
    userdata: UserData,
}

impl RuntimeFence {
    fn query(&self) -> bool {
        let _scope = CallbackScope::enter();
        // SAFETY: the runtime's callback and userdata, as registered.
        unsafe { (self.query)(self.userdata.0) }
    }

    fn wait(&self, timeout: Duration) -> bool {
        if let Some(w) = self.wait {
            let ns = timeout.as_nanos().min(u64::MAX as u128) as u64;
            let _scope = CallbackScope::enter();
            // SAFETY: as above.
            return unsafe { w(self.userdata.0, ns) };
        }
        // No wait callback: poll the query with a short sleep.
        let deadline = Instant::now() + timeout;
        loop {
            if self.query() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::sleep((deadline - now).min(Duration::from_micros(100)));
        }
    }
}

impl Drop for RuntimeFence {
    fn drop(&mut self) {
        if let Some(r) = self.release {
            let _scope = CallbackScope::enter();
            // SAFETY: called exactly once, when the last reference goes.
            unsafe { r(self.userdata.0) }
        }
    }
}

/// Wraps a runtime's own fence (a CUDA event, a timeline semaphore value,
/// anything) as a host fence: `query` (required) says whether the work
/// before it has completed, without blocking; `wait` (may be NULL: the host
/// then polls `query`) blocks up to a timeout; `release` (may be NULL) is
/// called exactly once when the host drops its last reference — after the
/// caller's handle is released and every free waiting on it has retired —
/// so the runtime can free `userdata`. `name` appears in reports.
///
/// The callbacks run on any thread (the one freeing, polling, or the
/// reaper), possibly concurrently; they must not unwind.
///
/// Ownership: the caller owns the handle (`memplug_host_fence_release`).
/// Thread-safety: any thread.
///
/// # Safety
/// `name` must be NULL or NUL-terminated; `out` NULL or writable; the
/// callbacks callable as documented with `userdata` until `release`.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_fence_from_callbacks(
    manager: MemplugHostManager,
    name: *const c_char,
    query: MemplugHostFenceQueryFn,
    wait: MemplugHostFenceWaitFn,
    release: MemplugHostReleaseFn,
    userdata: *mut c_void,
    out: *mut MemplugHostFence,
) -> MemplugHostStatus {
    boundary("memplug_host_fence_from_callbacks", || {
        // SAFETY: the caller's contract.
        let name = unsafe { c_str(name, "name") }?;
        require_non_null(out, "out")?;
        let Some(query) = query else {
            return Err(Error::null("query"));
        };
        let (_, seat) = pin_manager(manager.id)?;
        let rf = Arc::new(RuntimeFence { query, wait, release, userdata: UserData(userdata) });
        let (q, w) = (rf.clone(), rf);
        let f = FnFence::new(name, move || q.query(), move |t| w.wait(t));
        let entry = FenceEntry { fence: f, recorded: None };
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, entry, [0, 0], out, |id| MemplugHostFence { id }) }
    })
}

/// Asks whether a fence has completed, without blocking; `out_complete`
/// receives the answer. Thread-safety: any thread.
///
/// # Safety
/// `out_complete` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_fence_query(
    fence: MemplugHostFence,
    out_complete: *mut bool,
) -> MemplugHostStatus {
    boundary("memplug_host_fence_query", || {
        require_non_null(out_complete, "out_complete")?;
        let (f, _) = pin::<FenceEntry>(fence.id)?;
        let done = f.fence.query()?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_complete, done) };
        Ok(())
    })
}

/// Waits up to `timeout_ns` for a fence; `out_complete` receives whether
/// it completed (a timeout is not an error). Thread-safety: any thread.
///
/// # Safety
/// `out_complete` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_fence_wait(
    fence: MemplugHostFence,
    timeout_ns: u64,
    out_complete: *mut bool,
) -> MemplugHostStatus {
    boundary("memplug_host_fence_wait", || {
        require_non_null(out_complete, "out_complete")?;
        let (f, _) = pin::<FenceEntry>(fence.id)?;
        let done = f.fence.wait(Duration::from_nanos(timeout_ns))?;
        // SAFETY: checked non-NULL.
        unsafe { write_out(out_complete, done) };
        Ok(())
    })
}

/// Releases the caller's fence handle; frees waiting on the fence keep
/// their own references. The zero handle is a no-op. Thread-safety: any
/// thread.
#[no_mangle]
pub extern "C" fn memplug_host_fence_release(fence: MemplugHostFence) -> MemplugHostStatus {
    boundary("memplug_host_fence_release", || {
        manager_tables::remove::<FenceEntry>(fence.id)?;
        Ok(())
    })
}

/// A runtime fence's query: true when the work before it has completed.
/// Never blocks. Called from any thread (the caller of a free, a poll, the
/// reaper), possibly concurrently. Must not unwind.
pub type MemplugHostFenceQueryFn = Option<unsafe extern "C" fn(userdata: *mut c_void) -> bool>;

/// A runtime fence's wait: blocks up to `timeout_ns`; true when complete.
/// Same threading rules as the query.
pub type MemplugHostFenceWaitFn =
    Option<unsafe extern "C" fn(userdata: *mut c_void, timeout_ns: u64) -> bool>;

/// Called exactly once when the host drops its last reference to a
/// runtime fence, on whichever thread drops it, so the runtime may free
/// what `userdata` points to. Must not unwind.
pub type MemplugHostReleaseFn = Option<unsafe extern "C" fn(userdata: *mut c_void)>;

/// A host function run on a stream after the work submitted before it
/// (`memplug_host_stream_enqueue`). Runs once, on the stream's thread. Must
/// not unwind.
pub type MemplugHostStreamFn = Option<unsafe extern "C" fn(userdata: *mut c_void)>;
