//! The sync capability: streams, host functions, fences.
//!
//! # Host functions a plugin misuses
//!
//! A host function (`SyncApi::enqueue`) reaches the plugin as an id in
//! `userdata`, never as a pointer: the closure stays in a host table until
//! its first run takes it out. So, whatever the plugin does:
//!
//! * the closure runs **at most once**: a second run of the same id finds
//!   no entry and does nothing;
//! * it is **never called after it was freed**: the table owns it until the
//!   run that consumes it, and a stale id only misses in the table;
//! * a **refused enqueue** (`enqueue_host_fn` returned a failure) means the
//!   host drops the function when the call returns: it does not run after
//!   that, and a plugin that runs the id anyway, then or later, from any
//!   thread, is ignored. A plugin that ran it *during* the failing call
//!   (before returning its failure) has run it once, which is the other
//!   safe reading of a refusal; a caller must not assume either.
//!
//! Every ignored run (a second run, a run after a refusal, an id never
//! issued) is counted in [`stray_host_fn_calls`]. What the host cannot
//! tell is a plugin that runs the id of *another* pending function early
//! (ids are not secrets): that breaks ordering, not memory safety.

use super::call::Held;
use super::call::Opaque;
use super::MechanismInner;
use crate::error::{CallError, ObjectKind, ReleaseError};
use crate::tokens::{Fence, Stream};
use memplug_sdk::abi::*;
use memplug_sdk::Status;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Streams and fences.
#[derive(Clone, Copy)]
pub struct SyncApi<'m> {
    pub(super) m: &'m MechanismInner,
    pub(super) vt: &'m MemplugSync,
}

type BoxedHostFn = Box<dyn FnOnce() + Send + 'static>;

/// Host functions handed to plugins and not yet run, by id. The plugin gets
/// the id as its `userdata`, never a pointer to host memory: a plugin that
/// runs a function twice, or runs one whose enqueue it refused, finds no
/// entry and nothing happens — no closure is ever called after it was freed,
/// or more than once. (A `BTreeMap` rather than a hash map: its nodes are
/// reachable from the static through pointers to their start, so leak
/// checkers see pending functions as reachable, not "possibly lost".)
static PENDING_HOST_FNS: Mutex<BTreeMap<u64, BoxedHostFn>> = Mutex::new(BTreeMap::new());
static NEXT_HOST_FN: AtomicU64 = AtomicU64::new(1);
/// Calls of a host function id that was already run, refused or never
/// issued: each is a plugin breaking the contract, counted and ignored.
static STRAY_HOST_FN_CALLS: AtomicU64 = AtomicU64::new(0);

fn pending() -> std::sync::MutexGuard<'static, BTreeMap<u64, BoxedHostFn>> {
    PENDING_HOST_FNS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn take_host_fn(id: u64) -> Option<BoxedHostFn> {
    pending().remove(&id)
}

/// How many times plugins called a host function they had already run, or
/// one whose enqueue failed, or an id never issued (process-wide).
pub fn stray_host_fn_calls() -> u64 {
    STRAY_HOST_FN_CALLS.load(Ordering::Relaxed)
}

unsafe extern "C" fn run_host_fn(userdata: *mut c_void) {
    // Called by plugin code: nothing may unwind back into it.
    let _ = catch_unwind(AssertUnwindSafe(|| match take_host_fn(userdata as usize as u64) {
        // A panic in the function is reported on stderr by the panic hook
        // and stops here.
        Some(f) => f(),
        None => {
            STRAY_HOST_FN_CALLS.fetch_add(1, Ordering::Relaxed);
        }
    }));
}

impl<'m> SyncApi<'m> {
    /// Gives a stream or fence back: checks this mechanism issued it
    /// (`parts` says its key, its handle and what it is), then destroys it.
    fn destroy<T: std::fmt::Debug>(
        &self,
        slot_name: &'static str,
        token: T,
        kind: ObjectKind,
        slot: unsafe extern "C" fn(*mut c_void, u64, *const MemplugMessageSink) -> MemplugStatus,
        parts: impl FnOnce(&T) -> (u64, u64, &'static str),
    ) -> Result<(), ReleaseError<T>> {
        let m = self.m;
        m.release_object(Held::No, slot_name, token, kind, slot, |t| {
            let (key, handle, what) = parts(t);
            m.check_handle_made_here(slot_name, key, what)?;
            Ok((handle,))
        })
    }

    /// Creates a stream of the plugin's own (`sync.stream_create`). The
    /// caller owns it and gives it back with `stream_destroy`; until then it
    /// counts as a live object of the mechanism and holds its plugin
    /// loaded.
    ///
    /// Only an `Active` context makes streams: a stream is a live object,
    /// and one made on a retiring context would hold back its termination.
    pub fn stream_create(&self) -> Result<Stream, CallError> {
        self.m.refuse_unless_active("sync.stream_create")?;
        let mut out = 0u64;
        self.m.call("sync.stream_create", slot!(self.vt.stream_create), (&mut out,))?;
        self.m.born(ObjectKind::Stream);
        Ok(Stream { mechanism_key: self.m.key, handle: out })
    }

    /// Whether the plugin can wrap a runtime's native stream.
    pub fn can_adopt(&self) -> bool {
        self.vt.stream_adopt.is_some()
    }

    /// Wraps a native stream (e.g. a `CUstream`), not taking ownership.
    /// `Unsupported` when the plugin does not publish the slot.
    ///
    /// # Safety
    /// `native` must be a live native stream of the mechanism's device that
    /// outlives the returned `Stream`; the plugin dereferences it.
    pub unsafe fn stream_adopt(&self, native: *mut c_void) -> Result<Stream, CallError> {
        let Some(f) = self.vt.stream_adopt else {
            return Err(self.m.refuse(
                "sync.stream_adopt",
                Status::Unsupported,
                "the plugin does not publish stream_adopt".into(),
            ));
        };
        self.m.refuse_unless_active("sync.stream_adopt")?;
        let mut out = 0u64;
        self.m.call("sync.stream_adopt", f, (Opaque(native), &mut out))?;
        self.m.born(ObjectKind::Stream);
        Ok(Stream { mechanism_key: self.m.key, handle: out })
    }

    /// Destroys a stream after its submitted work has run.
    pub fn stream_destroy(&self, s: Stream) -> Result<(), ReleaseError<Stream>> {
        self.destroy("sync.stream_destroy", s, ObjectKind::Stream, slot!(self.vt.stream_destroy), |s| {
            (s.mechanism_key, s.handle, "stream")
        })
    }

    /// Runs `f` on the stream after the work submitted before it. `f` runs
    /// at most once, whatever the plugin does. When the enqueue fails, `f`
    /// is dropped as the call returns and never runs after that (it may
    /// have run once already if the plugin ran it before failing; see the
    /// module documentation).
    pub fn enqueue(&self, s: &Stream, f: impl FnOnce() + Send + 'static) -> Result<(), CallError> {
        const SLOT: &str = "sync.enqueue_host_fn";
        self.m.check_handle_made_here(SLOT, s.mechanism_key, "stream")?;
        let id = NEXT_HOST_FN.fetch_add(1, Ordering::Relaxed);
        pending().insert(id, Box::new(f));
        let userdata = Opaque(id as usize as *mut c_void);
        let func: MemplugHostFn = Some(run_host_fn);
        let r = self.m.call(SLOT, slot!(self.vt.enqueue_host_fn), (s.handle, func, userdata));
        if r.is_err() {
            // Refused: whether or not the plugin runs it anyway, the
            // function is gone, so a late call finds nothing.
            drop(take_host_fn(id));
        }
        r
    }

    /// Records a fence after the work submitted so far.
    pub fn fence_record(&self, s: &Stream) -> Result<Fence, CallError> {
        const SLOT: &str = "sync.fence_record";
        self.m.check_handle_made_here(SLOT, s.mechanism_key, "stream")?;
        let mut out = 0u64;
        self.m.call(SLOT, slot!(self.vt.fence_record), (s.handle, &mut out))?;
        if out == 0 {
            // Fences are non-zero handles: a plugin cannot have recorded
            // this one, so nothing may ever wait on it (it would never
            // answer, or answer for another). Nothing was made: not counted.
            return Err(self.m.refuse(
                SLOT,
                Status::Internal,
                "plugin misbehaviour: the slot returned OK with fence handle 0 (fences are non-zero \
                 handles); refused"
                    .into(),
            ));
        }
        self.m.born(ObjectKind::Fence);
        Ok(Fence { mechanism_key: self.m.key, handle: out })
    }

    /// `true` when the fence has completed; never blocks.
    pub fn fence_query(&self, f: &Fence) -> Result<bool, CallError> {
        const SLOT: &str = "sync.fence_query";
        self.m.check_handle_made_here(SLOT, f.mechanism_key, "fence")?;
        self.m.call_answer(SLOT, slot!(self.vt.fence_query), (f.handle,), MEMPLUG_STATUS_NOT_READY)
    }

    /// Waits up to `timeout`; `true` when the fence completed.
    pub fn fence_wait(&self, f: &Fence, timeout: Duration) -> Result<bool, CallError> {
        const SLOT: &str = "sync.fence_wait";
        self.m.check_handle_made_here(SLOT, f.mechanism_key, "fence")?;
        let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        self.m.call_answer(SLOT, slot!(self.vt.fence_wait), (f.handle, ns), MEMPLUG_STATUS_TIMEOUT)
    }

    /// Destroys a fence made by this mechanism (`sync.fence_destroy`). A
    /// refusal hands the fence back, still counted live.
    pub fn fence_destroy(&self, f: Fence) -> Result<(), ReleaseError<Fence>> {
        self.destroy("sync.fence_destroy", f, ObjectKind::Fence, slot!(self.vt.fence_destroy), |f| {
            (f.mechanism_key, f.handle, "fence")
        })
    }
}
