//! The sync capability: streams are CUDA streams (made non-blocking by
//! `stream_create`, or a runtime's own `CUstream` wrapped by `stream_adopt`
//! without taking ownership); host functions go through `cuLaunchHostFunc`;
//! a fence is an event recorded on the stream (`cuEventRecord`), queried
//! with `cuEventQuery`.
//!
//! Stream and fence handles carry a serial number in their upper 32 bits
//! beside the table key in the lower 32, as in the CPU plugin: the ABI names
//! them by a bare `uint64_t`.
//!
//! **No lock across a driver call.** The tables hold `Arc`s: a call finds
//! its entry under the table's lock, clones it and lets the lock go before
//! it calls the driver, so a thread blocked in the driver on one stream
//! never holds up another stream's calls (nor the same stream's, but for
//! its destruction). A stream's own gate counts the submissions in flight:
//! `stream_destroy` closes it (later submissions are `BUSY`), waits for
//! those in flight to return, and only then synchronises and destroys the
//! stream, so nothing is ever submitted to a stream being destroyed.
//!
//! **Events are pooled** (see `context.rs`): a fence takes a complete event
//! of its context's pool, or creates one, and gives it back when destroyed.
//!
//! **Waiting without polling.** `fence_wait` asks `cuEventQuery` once; a
//! pending fence with no time limit is waited for with `cuEventSynchronize`
//! (the events are blocking-sync: the thread sleeps in the driver until
//! the event completes); with a limit, a waiter thread of the mechanism
//! makes the `cuEventSynchronize` and signals the caller, who sleeps on a
//! condition variable until the signal or the deadline, whichever comes
//! first. Only when every one of [`MAX_WAITERS`] waiter threads is already
//! busy does a wait fall back to polling.

use crate::context::Pin;
use crate::driver::{
    CUcontext, CUevent, CUstream, CuResult, Driver, Entered, CUDA_ERROR_NOT_READY, CUDA_SUCCESS,
};
use crate::mechanism::CudaMechanism;
use memplug_sdk::{FenceState, HostFn, PluginError, PluginResult, Status, StreamSync};
use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Waiter threads per mechanism, at most (each serves one timed wait at a
/// time; idle ones park until the next).
pub const MAX_WAITERS: usize = 16;

/// One stream.
pub struct StreamEntry {
    serial: u32,
    pub(crate) raw: CUstream,
    /// The stream's context: the primary context, or for an adopted stream
    /// whatever context it was created in.
    pub(crate) ctx: CUcontext,
    /// Made by `stream_create` (destroyed with it) rather than adopted.
    owned: bool,
    gate: Mutex<Gate>,
    /// Signalled when the last submission in flight leaves a closing gate.
    drained: Condvar,
    /// Declared last: the context is released after the rest is gone.
    pub(crate) pin: Pin,
}

#[derive(Default)]
struct Gate {
    /// Set while `stream_destroy` waits for the stream.
    closing: bool,
    /// Submissions (host functions, fence records) in the driver now.
    in_flight: u32,
}

/// A submission let through a stream's gate; leaves it when dropped.
struct Admitted<'a>(&'a StreamEntry);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut g = self.0.gate();
        g.in_flight -= 1;
        if g.closing && g.in_flight == 0 {
            self.0.drained.notify_all();
        }
    }
}

impl StreamEntry {
    fn gate(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets one submission in, unless the stream is being destroyed.
    fn admit(&self, call: &str) -> PluginResult<Admitted<'_>> {
        let mut g = self.gate();
        if g.closing {
            return Err(closing(call));
        }
        g.in_flight += 1;
        Ok(Admitted(self))
    }
}

/// A fence's event. Whoever holds it last gives it back: to its context's
/// pool (an event of the primary context), or to the driver.
pub(crate) struct Event {
    raw: CUevent,
    pub(crate) ctx: CUcontext,
    /// From the primary context's pool (and going back to it).
    pooled: bool,
    /// Declared last: keeps the context while the event lives.
    pin: Pin,
}

impl Event {
    /// Gives the event back (once); the driver's failure, if any.
    fn give_back(&mut self, driver: &'static Driver) -> PluginResult<()> {
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        let _e = Entered::new(driver, self.ctx)?;
        if self.pooled {
            return self.pin.give_event(raw);
        }
        // SAFETY: an event of this mechanism nothing uses any more.
        driver.check(unsafe { (driver.api.event_destroy)(raw) }, "cuEventDestroy")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // The last holder was not `fence_destroy` (a concurrent query or a
        // waiter thread): nobody to tell of a failure.
        if let Ok(d) = crate::driver::driver() {
            let _ = self.give_back(d);
        }
    }
}

/// One fence: its serial and its event (shared with the calls using it).
pub struct FenceEntry {
    serial: u32,
    event: Arc<Event>,
}

// SAFETY: driver handles, usable from any thread; the mutable parts are
// behind locks.
unsafe impl Send for StreamEntry {}
unsafe impl Sync for StreamEntry {}
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

/// `CU_STREAM_LEGACY`.
const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
const STREAM_PER_THREAD: usize = 0x2;
const KEY_BITS: u64 = 0xffff_ffff;

thread_local! {
    /// Set while a host function runs on this (driver) thread.
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

/// The trampoline the driver calls: runs the host's function once, frees
/// its box, and never lets a panic unwind into the driver.
unsafe extern "C" fn run_host_fn(userdata: *mut c_void) {
    // SAFETY: the box leaked by `enqueue_host_fn`, run exactly once.
    let f = unsafe { Box::from_raw(userdata.cast::<HostFn>()) };
    IN_HOST_FN.with(|c| c.set(true));
    let _ = catch_unwind(AssertUnwindSafe(|| f.call()));
    IN_HOST_FN.with(|c| c.set(false));
}

/// Whether this thread is running a host function this plugin launched.
pub(crate) fn in_host_fn() -> bool {
    IN_HOST_FN.with(Cell::get)
}

fn split(handle: u64) -> (u64, u32) {
    (handle & KEY_BITS, (handle >> 32) as u32)
}

#[cold]
fn unknown(what: &str, handle: u64) -> PluginError {
    PluginError::unknown_allocation(format!(
        "{what} handle {handle:#x} does not name a live {what}: never made, already destroyed, or forged"
    ))
}

#[cold]
fn closing(call: &str) -> PluginError {
    PluginError::new(Status::Busy, format!("{call}: the stream is being destroyed"))
}

/// The answer a waiter thread gives: `cuEventSynchronize`'s status.
struct Signal {
    done: Mutex<Option<CuResult>>,
    cv: Condvar,
}

struct Job {
    event: Arc<Event>,
    signal: Arc<Signal>,
}

#[derive(Default)]
struct WaitQueue {
    jobs: VecDeque<Job>,
    /// Threads parked, waiting for a job.
    idle: usize,
    threads: Vec<JoinHandle<()>>,
    shutdown: bool,
}

/// A mechanism's waiter threads (see the module docs); stopped and joined
/// when the mechanism is freed, at unload. Every job is an event recorded
/// on a stream the plugin knew; unload waits until every stream is
/// destroyed, which waits for its work, so no job outlives it.
#[derive(Default)]
pub(crate) struct Waiters {
    queue: Arc<(Mutex<WaitQueue>, Condvar)>,
}

impl Waiters {
    /// Hands `job` to a waiter thread (starting one if none is idle);
    /// gives it back when all [`MAX_WAITERS`] are busy.
    fn submit(&self, driver: &'static Driver, job: Job) -> Result<(), Job> {
        let (lock, cv) = &*self.queue;
        let mut q = lock.lock().unwrap_or_else(PoisonError::into_inner);
        if q.shutdown {
            return Err(job);
        }
        if q.idle > q.jobs.len() {
            q.jobs.push_back(job);
            cv.notify_one();
            return Ok(());
        }
        if q.threads.len() >= MAX_WAITERS {
            return Err(job);
        }
        let queue = Arc::clone(&self.queue);
        let spawned = std::thread::Builder::new()
            .name("memplug-cuda-wait".into())
            .spawn(move || waiter(driver, &queue));
        match spawned {
            Ok(t) => {
                q.threads.push(t);
                q.jobs.push_back(job);
                cv.notify_one();
                Ok(())
            }
            Err(_) => Err(job),
        }
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        let (lock, cv) = &*self.queue;
        let threads = {
            let mut q = lock.lock().unwrap_or_else(PoisonError::into_inner);
            q.shutdown = true;
            cv.notify_all();
            std::mem::take(&mut q.threads)
        };
        for t in threads {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// A waiter thread: runs jobs until shut down (finishing those queued).
fn waiter(driver: &'static Driver, queue: &(Mutex<WaitQueue>, Condvar)) {
    let (lock, cv) = queue;
    let mut q = lock.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        if let Some(job) = q.jobs.pop_front() {
            drop(q);
            let Job { event, signal } = job;
            let r = synchronize(driver, &event);
            // Let the event go before the signal: the caller may destroy
            // the fence (and recycle its event) as soon as it hears.
            drop(event);
            *signal.done.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
            signal.cv.notify_all();
            q = lock.lock().unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        if q.shutdown {
            return;
        }
        q.idle += 1;
        q = cv.wait(q).unwrap_or_else(PoisonError::into_inner);
        q.idle -= 1;
    }
}

/// `cuEventSynchronize` of `event`, its context current meanwhile: the
/// thread sleeps in the driver until the event completes (blocking-sync).
fn synchronize(driver: &'static Driver, event: &Event) -> CuResult {
    // If the context cannot be made current, the sync meets whatever made
    // it unusable and says so.
    let _entered = Entered::new(driver, event.ctx);
    // SAFETY: a live event (the caller holds it), of a stream the plugin
    // knows.
    unsafe { (driver.api.event_synchronize)(event.raw) }
}

/// `timeout` means "no limit" (the ABI's `UINT64_MAX` nanoseconds).
fn unbounded(timeout: Duration) -> bool {
    timeout >= Duration::from_nanos(u64::MAX)
}

impl CudaMechanism {
    fn compose(&self, key: u64, serial: u32) -> Option<u64> {
        (key <= KEY_BITS).then_some(u64::from(serial) << 32 | key)
    }

    fn insert_stream(&self, entry: StreamEntry) -> PluginResult<u64> {
        let serial = entry.serial;
        let key = self.streams.insert(Arc::new(entry));
        self.compose(key, serial).ok_or_else(|| {
            let gone = self.streams.remove(key, |_| true);
            if let Some(s) = &gone {
                if s.owned {
                    // SAFETY: the stream just made, unused.
                    let _ = Entered::new(self.driver, s.ctx)
                        .map(|_e| unsafe { (self.driver.api.stream_destroy)(s.raw) });
                }
            }
            PluginError::out_of_memory("stream_create: too many live streams")
        })
    }

    /// The stream `stream` names (the table's lock is held for the lookup
    /// only).
    fn stream_entry(&self, stream: u64) -> PluginResult<Arc<StreamEntry>> {
        let (key, serial) = split(stream);
        self.streams
            .with(key, |s| s.serial == serial, |s| Arc::clone(s))
            .ok_or_else(|| unknown("stream", stream))
    }

    /// Runs `f` on an open stream, admitted through its gate (no lock held
    /// while `f` calls the driver).
    pub(crate) fn with_open_stream<R>(
        &self,
        stream: u64,
        call: &str,
        f: impl FnOnce(&StreamEntry) -> PluginResult<R>,
    ) -> PluginResult<R> {
        let entry = self.stream_entry(stream)?;
        let _admitted = entry.admit(call)?;
        f(&entry)
    }

    /// The event of fence `fence` (the table's lock is held for the lookup
    /// only; the clone keeps the event alive while it is used).
    fn fence_event(&self, fence: u64) -> PluginResult<Arc<Event>> {
        let (key, serial) = split(fence);
        self.fences
            .with(key, |f| f.serial == serial, |f| Arc::clone(&f.event))
            .ok_or_else(|| unknown("fence", fence))
    }

    fn query_event(&self, event: &Event) -> PluginResult<FenceState> {
        let d = self.driver;
        // SAFETY: a live event (the caller holds it).
        match unsafe { (d.api.event_query)(event.raw) } {
            CUDA_SUCCESS => Ok(FenceState::Complete),
            CUDA_ERROR_NOT_READY => Ok(FenceState::Pending),
            r => Err(d.error(r, "cuEventQuery")),
        }
    }

    /// Waits for `event` with a limit, through a waiter thread; `None`
    /// when no waiter thread could take the job.
    fn wait_through_waiter(&self, event: &Arc<Event>, deadline: Instant) -> Option<PluginResult<FenceState>> {
        let d = self.driver;
        let signal = Arc::new(Signal { done: Mutex::new(None), cv: Condvar::new() });
        let job = Job { event: Arc::clone(event), signal: Arc::clone(&signal) };
        if self.waiters.submit(d, job).is_err() {
            return None;
        }
        let mut done = signal.done.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(r) = *done {
                return Some(match r {
                    CUDA_SUCCESS => Ok(FenceState::Complete),
                    r => Err(d.error(r, "cuEventSynchronize")),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            done = signal.cv.wait_timeout(done, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        drop(done);
        // The deadline passed; the waiter thread keeps its job until the
        // event completes. One last look: it may have completed just now.
        Some(self.query_event(event))
    }

    /// The old way, when every waiter thread is busy: polls with sleeps
    /// growing from 1 µs to 200 µs.
    fn poll_until(&self, event: &Event, deadline: Instant) -> PluginResult<FenceState> {
        let mut pause = Duration::from_micros(1);
        loop {
            if self.query_event(event)? == FenceState::Complete {
                return Ok(FenceState::Complete);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(FenceState::Pending);
            }
            let sleep = pause.min(deadline - now);
            std::thread::sleep(sleep);
            pause = (pause * 2).min(Duration::from_micros(200));
        }
    }
}

impl StreamSync for CudaMechanism {
    const CAN_ADOPT: bool = true;

    // ABI 1.2: typed adoption (a CUDA stream only) and cross-stream waits
    // (`cuStreamWaitEvent`: the device orders the work, no thread waits).
    const CAN_ADOPT_TYPED: bool = true;
    const CAN_WAIT_FENCE: bool = true;
    // ABI 1.3: `cuMemcpyAsync` on the stream (copy.rs).
    const CAN_COPY: bool = true;

    fn copy_kinds(&self) -> u32 {
        crate::copy::COPY_KINDS
    }

    fn copy(&self, stream: u64, dst: u64, src: u64, len: u64) -> PluginResult<()> {
        self.copy_on(stream, dst, src, len)
    }

    fn stream_adopt_typed(&self, native_kind: u32, native: *mut c_void) -> PluginResult<u64> {
        if native_kind != memplug_sdk::abi::MEMPLUG_DEVICE_CUDA {
            let _slot = self.slot("stream_adopt_typed")?;
            return Err(PluginError::unsupported(format!(
                "stream_adopt_typed: a native stream of device kind {native_kind} is not a CUstream; this \
                 mechanism adopts CUDA streams (kind {})",
                memplug_sdk::abi::MEMPLUG_DEVICE_CUDA
            )));
        }
        self.stream_adopt(native)
    }

    fn stream_wait_fence(&self, stream: u64, fence: u64) -> PluginResult<()> {
        let _slot = self.slot("stream_wait_fence")?;
        let event = self.fence_event(fence)?;
        let d = self.driver;
        self.with_open_stream(stream, "stream_wait_fence", |s| {
            let _e = Entered::new(d, s.ctx)?;
            crate::capture::refuse_if_capturing(d, s.raw, "stream_wait_fence")?;
            // SAFETY: a live stream and a live event (kept by the Arc); the
            // driver takes the event's current record, so destroying the
            // fence afterwards does not undo the wait.
            d.check(unsafe { (d.api.stream_wait_event)(s.raw, event.raw, 0) }, "cuStreamWaitEvent")
        })
    }

    fn stream_create(&self) -> PluginResult<u64> {
        let _slot = self.slot("stream_create")?;
        let d = self.driver;
        let pin = self.ctx.pin()?;
        let raw = {
            let _e = pin.enter()?;
            let mut raw: CUstream = std::ptr::null_mut();
            // SAFETY: resolved entry point, out-pointer to a local.
            let r = unsafe { (d.api.stream_create)(&mut raw, crate::driver::STREAM_NON_BLOCKING) };
            d.check(r, "cuStreamCreate")?;
            raw
        };
        self.insert_stream(StreamEntry {
            serial: self.serial(),
            raw,
            ctx: pin.ctx(),
            owned: true,
            gate: Mutex::default(),
            drained: Condvar::new(),
            pin,
        })
    }

    fn stream_adopt(&self, native: *mut c_void) -> PluginResult<u64> {
        let _slot = self.slot("stream_adopt")?;
        if native as usize == STREAM_PER_THREAD {
            return Err(PluginError::invalid_argument(
                "stream_adopt: CU_STREAM_PER_THREAD names a different stream on every thread; adopt a real \
                 stream or the legacy default stream",
            ));
        }
        let d = self.driver;
        let pin = self.ctx.pin()?;
        let (raw, ctx) = if native.is_null() || native as usize == STREAM_LEGACY {
            // The legacy default stream of this device's primary context.
            (native.cast(), pin.ctx())
        } else {
            let raw: CUstream = native.cast();
            let mut ctx: CUcontext = std::ptr::null_mut();
            // SAFETY: the runtime vouches that `native` is a CUstream.
            let r = unsafe { (d.api.stream_get_ctx)(raw, &mut ctx) };
            if r != CUDA_SUCCESS {
                return Err(PluginError::invalid_argument(format!(
                    "stream_adopt: {native:p} is not a stream the driver knows: cuStreamGetCtx failed: {} ({r})",
                    d.error_name(r)
                )));
            }
            let _e = Entered::new(d, ctx)?;
            let mut device = 0;
            // SAFETY: out-pointer to a local; the stream's context current.
            d.check(unsafe { (d.api.ctx_get_device)(&mut device) }, "cuCtxGetDevice")?;
            if device != self.driver.devices[self.device.ordinal as usize].device {
                return Err(PluginError::new(
                    Status::WrongDevice,
                    format!(
                        "stream_adopt: the stream belongs to CUDA device {device}; mechanism \"{}\" serves device {}",
                        self.name, self.device.ordinal
                    ),
                ));
            }
            (raw, ctx)
        };
        self.insert_stream(StreamEntry {
            serial: self.serial(),
            raw,
            ctx,
            owned: false,
            gate: Mutex::default(),
            drained: Condvar::new(),
            pin,
        })
    }

    fn stream_destroy(&self, stream: u64) -> PluginResult<()> {
        let _slot = self.slot("stream_destroy")?;
        let entry = self.stream_entry(stream)?;
        {
            let mut g = entry.gate();
            if g.closing {
                return Err(closing("stream_destroy"));
            }
            g.closing = true;
            // Submissions already let in finish their driver call first.
            while g.in_flight > 0 {
                g = entry.drained.wait(g).unwrap_or_else(PoisonError::into_inner);
            }
        }
        let d = self.driver;
        // Wait for the work already submitted (host functions of this
        // library included: none may run after the stream is gone).
        let done = Entered::new(d, entry.ctx).and_then(|_e| {
            // SAFETY: a live stream; nothing new is submitted while closing.
            d.check(unsafe { (d.api.stream_synchronize)(entry.raw) }, "cuStreamSynchronize")?;
            if entry.owned {
                // SAFETY: the plugin's own stream, idle.
                d.check(unsafe { (d.api.stream_destroy)(entry.raw) }, "cuStreamDestroy")?;
            }
            Ok(())
        });
        match done {
            Ok(()) => {
                let (key, _) = split(stream);
                let gone = self.streams.remove(key, |s| Arc::ptr_eq(s, &entry));
                drop(gone);
                Ok(())
            }
            Err(e) => {
                entry.gate().closing = false;
                Err(e)
            }
        }
    }

    fn enqueue_host_fn(&self, stream: u64, f: HostFn) -> PluginResult<()> {
        let _slot = self.slot("enqueue_host_fn")?;
        let d = self.driver;
        self.with_open_stream(stream, "enqueue_host_fn", |s| {
            let _e = Entered::new(d, s.ctx)?;
            crate::capture::refuse_if_capturing(d, s.raw, "enqueue_host_fn")?;
            let task = Box::into_raw(Box::new(f));
            // SAFETY: a live stream; on success the driver calls the
            // trampoline once, which frees the box.
            let r = unsafe { (d.api.launch_host_func)(s.raw, Some(run_host_fn), task.cast()) };
            if r != CUDA_SUCCESS {
                // SAFETY: refused, so never run: the box is still ours.
                drop(unsafe { Box::from_raw(task) });
                return Err(d.error(r, "cuLaunchHostFunc"));
            }
            Ok(())
        })
    }

    fn fence_record(&self, stream: u64) -> PluginResult<u64> {
        let _slot = self.slot("fence_record")?;
        let d = self.driver;
        let event = self.with_open_stream(stream, "fence_record", |s| {
            let _e = Entered::new(d, s.ctx)?;
            crate::capture::refuse_if_capturing(d, s.raw, "fence_record")?;
            // The primary context's events come from its pool; an adopted
            // stream of another context gets a new event of that context.
            let pooled = s.ctx == s.pin.ctx();
            let raw = if pooled {
                s.pin.take_event()?
            } else {
                let mut raw: CUevent = std::ptr::null_mut();
                // SAFETY: out-pointer to a local; the stream's context current.
                d.check(
                    unsafe { (d.api.event_create)(&mut raw, crate::context::EVENT_FLAGS) },
                    "cuEventCreate",
                )?;
                raw
            };
            // Given back (pooled or destroyed) if the record fails.
            let event = Event { raw, ctx: s.ctx, pooled, pin: s.pin.another() };
            // SAFETY: a live event and stream of the same context.
            let r = unsafe { (d.api.event_record)(event.raw, s.raw) };
            if r != CUDA_SUCCESS {
                return Err(d.error(r, "cuEventRecord"));
            }
            Ok(event)
        })?;
        let serial = self.serial();
        let key = self.fences.insert(FenceEntry { serial, event: Arc::new(event) });
        self.compose(key, serial).ok_or_else(|| {
            drop(self.fences.remove(key, |_| true));
            PluginError::out_of_memory("fence_record: too many live fences")
        })
    }

    fn fence_query(&self, fence: u64) -> PluginResult<FenceState> {
        let _slot = self.slot("fence_query")?;
        let event = self.fence_event(fence)?;
        self.query_event(&event)
    }

    fn fence_wait(&self, fence: u64, timeout: Duration) -> PluginResult<FenceState> {
        let _slot = self.slot("fence_wait")?;
        let event = self.fence_event(fence)?;
        match self.query_event(&event)? {
            FenceState::Complete => return Ok(FenceState::Complete),
            FenceState::Pending if timeout.is_zero() => return Ok(FenceState::Pending),
            FenceState::Pending => {}
        }
        let d = self.driver;
        if unbounded(timeout) {
            // No limit: sleep in the driver until the event completes.
            return d.check(synchronize(d, &event), "cuEventSynchronize").map(|()| FenceState::Complete);
        }
        let deadline = Instant::now().checked_add(timeout);
        match deadline {
            Some(deadline) => match self.wait_through_waiter(&event, deadline) {
                Some(r) => r,
                None => self.poll_until(&event, deadline),
            },
            // A limit too far to represent: as good as none.
            None => d.check(synchronize(d, &event), "cuEventSynchronize").map(|()| FenceState::Complete),
        }
    }

    fn fence_destroy(&self, fence: u64) -> PluginResult<()> {
        let _slot = self.slot("fence_destroy")?;
        let (key, serial) = split(fence);
        let gone = self.fences.remove(key, |f| f.serial == serial).ok_or_else(|| unknown("fence", fence))?;
        // Outside the table's lock. When a concurrent query or a waiter
        // thread still holds the event, the last of them gives it back.
        match Arc::try_unwrap(gone.event) {
            Ok(mut event) => event.give_back(self.driver),
            Err(_shared) => Ok(()),
        }
    }
}
