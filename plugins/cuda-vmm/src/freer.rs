//! Frees that never wait for the device.
//!
//! CUDA's "API synchronization behavior": `cuMemFree` and `cuMemFreeHost`
//! synchronise the device — they return only once all work already
//! submitted to it is done. A `deallocate` that called them would wait for
//! every stream of the device, including a runtime's that may be blocked
//! on a host function waiting for a lock the freeing thread holds (a
//! deadlock), and the host's reaper would stall until the device is idle.
//!
//! So `deallocate` takes the block out of the mechanism's table and hands
//! it to this context's **freer thread** (one per context, started on the
//! first free, in the relaxed capture mode so it never breaks another
//! thread's graph capture), which makes the driver call. The ABI's
//! ordering still holds: the host frees only after the fences of the work
//! that used the block (invariant 4), so nothing the device still runs
//! touches it; the synchronisation only delays when the memory returns to
//! the driver. Meanwhile:
//!
//! * `memory_info` counts as free the bytes of frees handed over and not
//!   started yet (read after the driver's figure, so a free is never
//!   counted twice; one in the driver meanwhile is not counted at all);
//! * an allocation the driver refuses for lack of memory waits (at most
//!   [`FLUSH_LIMIT`]) for the frees already handed over, then tries once
//!   more;
//! * unload waits for every free handed over before it releases the
//!   context.
//!
//! A free the driver refuses afterwards cannot be answered to anyone: it
//! is counted ([`Freer::failures`]), and on a dead context (a sticky
//! error) nothing is left to free anyway.

use crate::driver::{CUcontext, CUdeviceptr, Driver, Entered};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an allocation refused for lack of memory waits for the frees
/// already handed over before it tries again.
pub const FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// One block to give back.
struct Job {
    ctx: CUcontext,
    base: CUdeviceptr,
    bytes: u64,
    /// `cuMemFreeHost` rather than `cuMemFree`.
    host: bool,
}

// SAFETY: a driver handle and addresses, usable from any thread.
unsafe impl Send for Job {}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs handed over and not yet done (queued or in the driver).
    pending: usize,
    /// Device bytes of the jobs still queued (not in the driver yet).
    queued_device_bytes: u64,
    failures: u64,
    shutdown: bool,
}

struct Shared {
    driver: &'static Driver,
    queue: Mutex<Queue>,
    /// Signalled when a job arrives, one is done, or shutdown begins.
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A context's freer (see the module docs).
pub(crate) struct Freer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Freer {
    pub(crate) fn new(driver: &'static Driver) -> Self {
        Freer {
            shared: Arc::new(Shared { driver, queue: Mutex::default(), cv: Condvar::new() }),
            thread: Mutex::new(None),
        }
    }

    /// Hands `base` (of `bytes`, made in `ctx`; `host`: by
    /// `cuMemHostAlloc`) over to be freed. Never waits for the driver.
    /// When no thread can be started, frees here (waiting for the device,
    /// as the driver does) rather than never.
    pub(crate) fn free(&self, ctx: CUcontext, base: CUdeviceptr, bytes: u64, host: bool) {
        let job = Job { ctx, base, bytes, host };
        let mut t = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if t.is_none() {
            let shared = Arc::clone(&self.shared);
            match std::thread::Builder::new().name("memplug-cuda-free".into()).spawn(move || run(&shared)) {
                Ok(h) => *t = Some(h),
                Err(_) => {
                    drop(t);
                    let ok = free_now(self.shared.driver, &job);
                    self.shared.lock().failures += u64::from(!ok);
                    return;
                }
            }
        }
        drop(t);
        let mut q = self.shared.lock();
        q.pending += 1;
        if !host {
            q.queued_device_bytes += bytes;
        }
        q.jobs.push_back(job);
        self.shared.cv.notify_all();
    }

    /// Device bytes handed over whose free has not started: read it after
    /// the driver's free figure (see the module docs).
    pub(crate) fn queued_device_bytes(&self) -> u64 {
        self.shared.lock().queued_device_bytes
    }

    /// Frees the driver refused after they were handed over.
    #[allow(dead_code)]
    pub(crate) fn failures(&self) -> u64 {
        self.shared.lock().failures
    }

    /// Waits until every free handed over so far is done, at most `limit`;
    /// whether they all are.
    pub(crate) fn flush(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut q = self.shared.lock();
        while q.pending > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = self.shared.cv.wait_timeout(q, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }
}

impl Freer {
    /// At unload: waits for every free handed over and stops the thread
    /// (before the context is released). Idempotent.
    pub(crate) fn finish(&self) {
        self.shared.lock().shutdown = true;
        self.shared.cv.notify_all();
        // Never called on the freer thread itself (it holds no reference
        // to its context). No `std::thread::current()` here: on the
        // unloading thread it would leave a thread-local destructor of this
        // library behind, run when that thread exits, after the unload.
        if let Some(t) = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Freer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The freer thread: frees until shut down with nothing left.
fn run(shared: &Shared) {
    let d = shared.driver;
    // This thread's capture mode, for its life.
    let _relaxed = crate::capture::Relaxed::new(d);
    let mut q = shared.lock();
    loop {
        if let Some(job) = q.jobs.pop_front() {
            if !job.host {
                q.queued_device_bytes -= job.bytes;
            }
            drop(q);
            let ok = free_now(d, &job);
            q = shared.lock();
            q.pending -= 1;
            q.failures += u64::from(!ok);
            shared.cv.notify_all();
            continue;
        }
        if q.shutdown {
            return;
        }
        q = shared.cv.wait(q).unwrap_or_else(PoisonError::into_inner);
    }
}

/// The driver call; whether it succeeded (a dead context's sticky answer
/// counts as done: its memory went with it).
fn free_now(d: &Driver, job: &Job) -> bool {
    let Ok(_e) = Entered::new(d, job.ctx) else { return false };
    let r = if job.host {
        match d.host_alloc {
            // SAFETY: a block `cuMemHostAlloc` returned, handed over once.
            Some(api) => unsafe { (api.free)(job.base as *mut std::ffi::c_void) },
            None => return false,
        }
    } else {
        // SAFETY: a block `cuMemAlloc` returned, handed over once.
        unsafe { (d.api.mem_free)(job.base) }
    };
    r == crate::driver::CUDA_SUCCESS || crate::driver::is_sticky(r)
}
