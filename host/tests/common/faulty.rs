//! "faulty": the reference CPU plugin (in process: real mmap and memfd
//! memory, its real stream workers) behind a shim of its C vtables that
//! can fail any one of the slots an offload, a restore or a privatise
//! uses, answer DEVICE_LOST from the copy, or hold back the fences it
//! records. Not a fake: every call it lets through is the CPU plugin's.
//!
//! A failing call changes nothing (the ABI's rule for a refusal): the shim
//! answers before calling the plugin. Fences held back answer NOT_READY
//! (and TIMEOUT from a wait) until released, and only fences recorded
//! while held: a fence that reported complete keeps doing so.

#![allow(dead_code)]

use memplug_sdk::abi::*;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The slots a fault can be put in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    Allocate,
    Commit,
    Decommit,
    Map,
    Unmap,
    Copy,
    FenceRecord,
    EnqueueHostFn,
}

pub const SLOTS: [Slot; 8] = [
    Slot::Allocate,
    Slot::Commit,
    Slot::Decommit,
    Slot::Map,
    Slot::Unmap,
    Slot::Copy,
    Slot::FenceRecord,
    Slot::EnqueueHostFn,
];

/// What a test controls.
#[derive(Default)]
pub struct Faults {
    /// Per slot: the countdown to its failure (-1: none armed).
    countdown: [AtomicI64; 8],
    fired: [AtomicU64; 8],
    /// The next copy answers DEVICE_LOST (the host then loses the context).
    pub lose_at_copy: AtomicBool,
    /// Fences recorded while set are held back.
    pub hold_fences: AtomicBool,
    held: Mutex<HashSet<u64>>,
    /// Queued operations (`commit_on`, `decommit_on`, `map_on`,
    /// `unmap_on`) run, then answer OK with fence handle 0 (a fence the
    /// plugin cannot have recorded; the real one is destroyed).
    pub queued_fence_zero: AtomicBool,
    /// Fences returned by queued operations while set are held back.
    pub hold_queued: AtomicBool,
    /// `fence_record` answers OK with fence handle 0 (the real one is
    /// destroyed).
    pub record_fence_zero: AtomicBool,
    /// Run on another thread after a copy was accepted and the stream has
    /// run it (a loss reported there finds no copy still writing).
    #[allow(clippy::type_complexity)]
    after_copy: Mutex<Option<std::sync::Arc<dyn Fn() + Send + Sync>>>,
}

impl Faults {
    /// The `k`-th next call of `slot` (0: the very next) fails, once.
    pub fn arm(&self, slot: Slot, k: i64) {
        self.countdown[slot as usize].store(k, SeqCst);
    }
    pub fn disarm(&self) {
        for c in &self.countdown {
            c.store(-1, SeqCst);
        }
        self.lose_at_copy.store(false, SeqCst);
        self.queued_fence_zero.store(false, SeqCst);
        self.hold_queued.store(false, SeqCst);
        self.record_fence_zero.store(false, SeqCst);
        *self.after_copy.lock().unwrap() = None;
    }
    /// Runs `f` once, on a thread of its own, right after the next copy
    /// was accepted (and has run: the stream is drained first).
    pub fn after_next_copy(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.after_copy.lock().unwrap() = Some(std::sync::Arc::new(f));
    }
    pub fn fired(&self, slot: Slot) -> u64 {
        self.fired[slot as usize].load(SeqCst)
    }
    /// Lets every held fence complete (as the device would, eventually).
    pub fn release_fences(&self) {
        self.hold_fences.store(false, SeqCst);
        self.held.lock().unwrap().clear();
    }
    fn fire(&self, slot: Slot) -> bool {
        let i = slot as usize;
        let hit = self.countdown[i]
            .fetch_update(SeqCst, SeqCst, |c| match c {
                c if c < 0 => None,
                0 => Some(-1),
                c => Some(c - 1),
            })
            .is_ok_and(|prev| prev == 0);
        if hit {
            self.fired[i].fetch_add(1, SeqCst);
        }
        hit
    }
}

pub fn faults() -> &'static Faults {
    static F: OnceLock<Faults> = OnceLock::new();
    F.get_or_init(|| {
        let f = Faults::default();
        f.disarm();
        f
    })
}

/// The switches are the process's, so a test that sets them runs alone
/// under this guard, from switches all off: run side by side, a fault
/// armed for one test's call fires in another's (a loss armed for one
/// test's copy lost another test's context).
pub fn one_test_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let g = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    faults().disarm();
    faults().release_fences();
    g
}

/// The CPU plugin's own tables, by mechanism context.
#[derive(Clone, Copy)]
struct Inner {
    alloc: MemplugAllocator,
    vb: Option<MemplugVirtualBacking>,
    sm: Option<MemplugSharedMapping>,
    sync: Option<MemplugSync>,
}
// SAFETY: plain function pointers and the plugin's own context pointers,
// which the plugin makes thread-safe.
unsafe impl Send for Inner {}

fn inner(ctx: *mut c_void) -> Inner {
    *tables().lock().unwrap().get(&(ctx as usize)).expect("a context the shim wrapped")
}

fn tables() -> &'static Mutex<HashMap<usize, Inner>> {
    static T: OnceLock<Mutex<HashMap<usize, Inner>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn injected(sink: *const MemplugMessageSink, status: MemplugStatus, what: &str) -> MemplugStatus {
    if !sink.is_null() {
        // SAFETY: the host's sink, valid for this call.
        unsafe {
            let s = &*sink;
            if let Some(w) = s.write {
                w(s.ctx, what.as_ptr().cast(), what.len());
            }
        }
    }
    status
}

macro_rules! guard {
    ($slot:expr, $sink:expr) => {
        if faults().fire($slot) {
            let status =
                if $slot == Slot::Allocate { MEMPLUG_STATUS_OUT_OF_MEMORY } else { MEMPLUG_STATUS_INTERNAL };
            return injected($sink, status, concat!("injected failure of ", stringify!($slot)));
        }
    };
}

unsafe extern "C" fn allocate(
    ctx: *mut c_void,
    request: *const MemplugRequest,
    out: *mut MemplugBlock,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard!(Slot::Allocate, sink);
    inner(ctx).alloc.allocate.unwrap()(ctx, request, out, sink)
}

unsafe extern "C" fn commit(
    ctx: *mut c_void,
    r: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard!(Slot::Commit, sink);
    inner(ctx).vb.unwrap().commit.unwrap()(ctx, r, offset, len, sink)
}

unsafe extern "C" fn decommit(
    ctx: *mut c_void,
    r: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard!(Slot::Decommit, sink);
    inner(ctx).vb.unwrap().decommit.unwrap()(ctx, r, offset, len, sink)
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn map(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    object_offset: u64,
    r: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    access: u32,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard!(Slot::Map, sink);
    inner(ctx).sm.unwrap().map.unwrap()(ctx, object, object_offset, r, offset, len, access, sink)
}

unsafe extern "C" fn unmap(
    ctx: *mut c_void,
    r: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard!(Slot::Unmap, sink);
    inner(ctx).sm.unwrap().unmap.unwrap()(ctx, r, offset, len, sink)
}

unsafe extern "C" fn copy(
    ctx: *mut c_void,
    stream: u64,
    dst: u64,
    src: u64,
    len: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    if faults().lose_at_copy.swap(false, SeqCst) {
        // A lost device runs nothing more: the copies already accepted
        // have finished (or, on a real device, stopped) when it says so.
        drain_stream(ctx, stream, sink);
        return injected(sink, MEMPLUG_STATUS_DEVICE_LOST, "injected loss of the device during a copy");
    }
    guard!(Slot::Copy, sink);
    let st = inner(ctx).sync.unwrap().copy.unwrap()(ctx, stream, dst, src, len, sink);
    let hook = faults().after_copy.lock().unwrap().take();
    if let (MEMPLUG_STATUS_OK, Some(f)) = (st, hook) {
        drain_stream(ctx, stream, sink);
        std::thread::spawn(move || f()).join().unwrap();
    }
    st
}

/// Waits, through the plugin itself, for the work on `stream` to run.
unsafe fn drain_stream(ctx: *mut c_void, stream: u64, sink: *const MemplugMessageSink) {
    let s = inner(ctx).sync.unwrap();
    let mut f = 0u64;
    if s.fence_record.unwrap()(ctx, stream, &mut f, sink) == MEMPLUG_STATUS_OK {
        s.fence_wait.unwrap()(ctx, f, u64::MAX, sink);
        s.fence_destroy.unwrap()(ctx, f, sink);
    }
}

/// The fence a queued operation returned, as the test wants it: handed
/// on, held back, or replaced by 0 (the real one destroyed).
unsafe fn queued_answer(
    ctx: *mut c_void,
    st: MemplugStatus,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    if st != MEMPLUG_STATUS_OK {
        return st;
    }
    if faults().queued_fence_zero.load(SeqCst) {
        inner(ctx).sync.unwrap().fence_destroy.unwrap()(ctx, *out, sink);
        *out = 0;
    } else if faults().hold_queued.load(SeqCst) {
        faults().held.lock().unwrap().insert(*out);
    }
    st
}

unsafe extern "C" fn commit_on(
    ctx: *mut c_void,
    r: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    let st = inner(ctx).vb.unwrap().commit_on.unwrap()(ctx, r, offset, len, stream, out, sink);
    queued_answer(ctx, st, out, sink)
}

unsafe extern "C" fn decommit_on(
    ctx: *mut c_void,
    r: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    let st = inner(ctx).vb.unwrap().decommit_on.unwrap()(ctx, r, offset, len, stream, out, sink);
    queued_answer(ctx, st, out, sink)
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn map_on(
    ctx: *mut c_void,
    object: *const MemplugObjectRef,
    object_offset: u64,
    r: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    access: u32,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    let st = inner(ctx).sm.unwrap().map_on.unwrap()(
        ctx,
        object,
        object_offset,
        r,
        offset,
        len,
        access,
        stream,
        out,
        sink,
    );
    queued_answer(ctx, st, out, sink)
}

unsafe extern "C" fn unmap_on(
    ctx: *mut c_void,
    r: *const MemplugObjectRef,
    offset: u64,
    len: u64,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    let st = inner(ctx).sm.unwrap().unmap_on.unwrap()(ctx, r, offset, len, stream, out, sink);
    queued_answer(ctx, st, out, sink)
}

unsafe extern "C" fn fence_record(
    ctx: *mut c_void,
    stream: u64,
    out: *mut u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard!(Slot::FenceRecord, sink);
    let st = inner(ctx).sync.unwrap().fence_record.unwrap()(ctx, stream, out, sink);
    if st == MEMPLUG_STATUS_OK && faults().record_fence_zero.load(SeqCst) {
        inner(ctx).sync.unwrap().fence_destroy.unwrap()(ctx, *out, sink);
        *out = 0;
        return st;
    }
    if st == MEMPLUG_STATUS_OK && faults().hold_fences.load(SeqCst) {
        faults().held.lock().unwrap().insert(*out);
    }
    st
}

unsafe extern "C" fn enqueue_host_fn(
    ctx: *mut c_void,
    stream: u64,
    func: MemplugHostFn,
    userdata: *mut c_void,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    guard!(Slot::EnqueueHostFn, sink);
    inner(ctx).sync.unwrap().enqueue_host_fn.unwrap()(ctx, stream, func, userdata, sink)
}

fn held(fence: u64) -> bool {
    faults().held.lock().unwrap().contains(&fence)
}

unsafe extern "C" fn fence_query(
    ctx: *mut c_void,
    fence: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    if held(fence) {
        return MEMPLUG_STATUS_NOT_READY;
    }
    inner(ctx).sync.unwrap().fence_query.unwrap()(ctx, fence, sink)
}

unsafe extern "C" fn fence_wait(
    ctx: *mut c_void,
    fence: u64,
    timeout_ns: u64,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    if held(fence) {
        std::thread::sleep(std::time::Duration::from_nanos(timeout_ns.min(2_000_000)));
        return MEMPLUG_STATUS_TIMEOUT;
    }
    inner(ctx).sync.unwrap().fence_wait.unwrap()(ctx, fence, timeout_ns, sink)
}

fn leak<T>(v: T) -> *const T {
    Box::leak(Box::new(v))
}

/// Wraps one mechanism's tables (copies of the plugin's, a few slots
/// replaced); the copies live for the process, as a plugin's do.
unsafe fn wrap(m: &MemplugMechanism) -> *const MemplugMechanism {
    let t = Inner {
        alloc: *m.allocator,
        vb: (!m.virtual_backing.is_null()).then(|| *m.virtual_backing),
        sm: (!m.shared_mapping.is_null()).then(|| *m.shared_mapping),
        sync: (!m.sync.is_null()).then(|| *m.sync),
    };
    tables().lock().unwrap().insert(m.ctx as usize, t);
    let mut w = *m;
    w.allocator = leak(MemplugAllocator { allocate: Some(allocate), ..t.alloc });
    if let Some(vb) = t.vb {
        w.virtual_backing = leak(MemplugVirtualBacking {
            commit: Some(commit),
            decommit: Some(decommit),
            commit_on: vb.commit_on.map(|_| commit_on as _),
            decommit_on: vb.decommit_on.map(|_| decommit_on as _),
            ..vb
        });
    }
    if let Some(sm) = t.sm {
        w.shared_mapping = leak(MemplugSharedMapping {
            map: Some(map),
            unmap: Some(unmap),
            map_on: sm.map_on.map(|_| map_on as _),
            unmap_on: sm.unmap_on.map(|_| unmap_on as _),
            ..sm
        });
    }
    if let Some(s) = t.sync {
        w.sync = leak(MemplugSync {
            copy: s.copy.map(|_| copy as _),
            fence_record: Some(fence_record),
            fence_query: Some(fence_query),
            fence_wait: Some(fence_wait),
            enqueue_host_fn: Some(enqueue_host_fn),
            ..s
        });
    }
    leak(w)
}

/// The entry: the CPU plugin's own, its descriptor republished with every
/// mechanism wrapped.
///
/// # Safety
/// Called by the host's loader as a plugin entry.
pub unsafe extern "C" fn faulty_cpu_entry(
    host: *const MemplugHostInfo,
    out: *mut MemplugNegotiation,
    sink: *const MemplugMessageSink,
) -> MemplugStatus {
    let st = memplug_plugin_cpu::cpu_plugin_entry(host, out, sink);
    if st != MEMPLUG_STATUS_OK {
        return st;
    }
    let neg = &mut *out;
    let mut p = *neg.plugin;
    let mechanisms: Vec<*const MemplugMechanism> =
        (0..p.mechanism_count as usize).map(|i| wrap(&**p.mechanisms.add(i))).collect();
    p.mechanisms = Box::leak(mechanisms.into_boxed_slice()).as_ptr();
    neg.plugin = leak(p);
    MEMPLUG_STATUS_OK
}
