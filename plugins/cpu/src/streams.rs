//! The sync capability for the CPU: a stream is a worker thread draining a
//! channel in order; a fence is a flag the worker raises when it reaches the
//! fence's place in that order. There is no native stream to adopt, so
//! `CAN_ADOPT` stays false and the slot is NULL.
//!
//! Stream and fence handles carry a serial number in their upper 32 bits
//! next to the slab key in the lower 32: the ABI names them by a bare
//! `uint64_t`, with no host `object_id` to tell a stale handle from the
//! object that reused its slot.

use crate::handles::Table;
use crate::mechanism::CpuMechanism;
use memplug_sdk::{FenceState, HostFn, PluginError, PluginResult, Status, StreamSync};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// What a stream's worker runs, in submission order.
enum Work {
    Run(HostFn),
    Signal(Arc<Fence>),
    /// `stream_wait_fence`: later work waits for another fence.
    Wait(Arc<Fence>),
    /// The plugin's own work in stream order (a queued decommit or unmap).
    Job(Box<dyn FnOnce() + Send>),
}

/// A fence's completion flag; waiters sleep on the condition variable.
#[derive(Default)]
struct Fence {
    done: Mutex<bool>,
    raised: Condvar,
}

impl Fence {
    fn flag(&self) -> MutexGuard<'_, bool> {
        // Nothing that can panic runs under this lock; poison is ignored.
        self.done.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn signal(&self) {
        *self.flag() = true;
        self.raised.notify_all();
    }

    fn state(&self) -> FenceState {
        if *self.flag() {
            FenceState::Complete
        } else {
            FenceState::Pending
        }
    }

    fn wait(&self, timeout: Duration) -> FenceState {
        // A timeout too long to add to now (u64::MAX ns is ~584 years)
        // means waiting for as long as it takes.
        let deadline = Instant::now().checked_add(timeout);
        let mut done = self.flag();
        while !*done {
            done = match deadline {
                None => self.raised.wait(done).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return FenceState::Pending;
                    }
                    self.raised.wait_timeout(done, deadline - now).unwrap_or_else(PoisonError::into_inner).0
                }
            };
        }
        FenceState::Complete
    }
}

struct Stream {
    serial: u32,
    queue: Sender<Work>,
    worker: JoinHandle<()>,
}

struct FenceSlot {
    serial: u32,
    fence: Arc<Fence>,
}

/// Live streams and fences.
#[derive(Default)]
pub struct Streams {
    streams: Table<Stream>,
    fences: Table<FenceSlot>,
    next_serial: AtomicU32,
}

const KEY_BITS: u64 = 0xffff_ffff;

/// Splits a stream or fence handle into its table handle and serial.
fn split(handle: u64) -> (u64, u32) {
    (handle & KEY_BITS, (handle >> 32) as u32)
}

#[cold]
fn unknown(what: &str, handle: u64) -> PluginError {
    PluginError::unknown_allocation(format!(
        "{what} handle {handle:#x} does not name a live {what}: never made, already destroyed, or forged"
    ))
}

impl Streams {
    /// Number of live streams.
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// Number of live fences.
    pub fn fence_count(&self) -> usize {
        self.fences.len()
    }

    fn serial(&self) -> u32 {
        self.next_serial.fetch_add(1, Ordering::Relaxed)
    }

    /// Joins a table handle and a serial; `None` if the slab has grown past
    /// 2^32 - 1 entries, the most the handle layout can name.
    fn compose(key_handle: u64, serial: u32) -> Option<u64> {
        (key_handle <= KEY_BITS).then_some(u64::from(serial) << 32 | key_handle)
    }

    /// Runs `f` on the stream `handle` names.
    fn with_stream<R>(&self, handle: u64, f: impl FnOnce(&mut Stream) -> R) -> PluginResult<R> {
        let (key, serial) = split(handle);
        self.streams.with(key, |s| s.serial == serial, f).ok_or_else(|| unknown("stream", handle))
    }

    /// Runs `f` on the fence `handle` names.
    fn with_fence<R>(&self, handle: u64, f: impl FnOnce(&mut FenceSlot) -> R) -> PluginResult<R> {
        let (key, serial) = split(handle);
        self.fences.with(key, |s| s.serial == serial, f).ok_or_else(|| unknown("fence", handle))
    }

    /// Fails (`UNKNOWN_ALLOCATION`) unless `stream` names a live stream.
    pub(crate) fn check_stream(&self, stream: u64) -> PluginResult<()> {
        self.with_stream(stream, |_| ())
    }

    /// Puts the plugin's own `job` at the end of the stream's queue.
    pub(crate) fn submit_job(
        &self,
        stream: u64,
        job: Box<dyn FnOnce() + Send>,
        call: &str,
    ) -> PluginResult<()> {
        self.submit(stream, Work::Job(job), call)
    }

    /// Puts `work` at the end of the stream's queue.
    fn submit(&self, stream: u64, work: Work, call: &str) -> PluginResult<()> {
        self.with_stream(stream, |s| s.queue.send(work).is_ok())?
            .then_some(())
            .ok_or_else(|| PluginError::internal(format!("{call}: the stream's worker thread has stopped")))
    }
}

fn run_worker(queue: std::sync::mpsc::Receiver<Work>) {
    // Ends when the stream is destroyed (its sender dropped) and every
    // item submitted before has run.
    for work in queue {
        match work {
            Work::Run(f) => f.call(),
            Work::Signal(fence) => fence.signal(),
            Work::Wait(fence) => {
                fence.wait(Duration::MAX);
            }
            Work::Job(job) => job(),
        }
    }
}

impl<F: crate::flavor::Flavor> StreamSync for CpuMechanism<F> {
    fn stream_create(&self) -> PluginResult<u64> {
        let (queue, receiver) = channel();
        let worker = thread::Builder::new()
            .name("memplug-cpu-stream".into())
            .spawn(move || run_worker(receiver))
            .map_err(|e| {
                PluginError::out_of_memory(format!("stream_create: cannot start a worker thread: {e}"))
            })?;
        let serial = self.streams.serial();
        let key = self.streams.streams.insert(Stream { serial, queue, worker });
        Streams::compose(key, serial).ok_or_else(|| {
            // Dropping the stream closes its queue; the idle worker exits.
            self.streams.streams.remove(key, |_| true);
            PluginError::out_of_memory("stream_create: too many live streams")
        })
    }

    fn stream_destroy(&self, stream: u64) -> PluginResult<()> {
        let me = thread::current().id();
        if self.streams.with_stream(stream, |s| s.worker.thread().id() == me)? {
            // Joining the worker from itself would never return.
            return Err(PluginError::new(
                Status::Busy,
                "stream_destroy: a stream cannot be destroyed from one of its own host functions",
            ));
        }
        let (key, serial) = split(stream);
        let s = self
            .streams
            .streams
            .remove(key, |s| s.serial == serial)
            .ok_or_else(|| unknown("stream", stream))?;
        drop(s.queue);
        s.worker
            .join()
            .map_err(|_| PluginError::internal("stream_destroy: the stream's worker thread panicked"))
    }

    fn enqueue_host_fn(&self, stream: u64, f: HostFn) -> PluginResult<()> {
        self.streams.submit(stream, Work::Run(f), "enqueue_host_fn")
    }

    fn fence_record(&self, stream: u64) -> PluginResult<u64> {
        let fence = Arc::new(Fence::default());
        self.streams.submit(stream, Work::Signal(Arc::clone(&fence)), "fence_record")?;
        let serial = self.streams.serial();
        let key = self.streams.fences.insert(FenceSlot { serial, fence });
        Streams::compose(key, serial).ok_or_else(|| {
            self.streams.fences.remove(key, |_| true);
            PluginError::out_of_memory("fence_record: too many live fences")
        })
    }

    fn fence_query(&self, fence: u64) -> PluginResult<FenceState> {
        self.streams.with_fence(fence, |f| f.fence.state())
    }

    fn fence_wait(&self, fence: u64, timeout: Duration) -> PluginResult<FenceState> {
        // Wait outside the table lock: other fences stay usable meanwhile,
        // and a concurrent fence_destroy only drops the table's reference.
        let f = self.streams.with_fence(fence, |f| Arc::clone(&f.fence))?;
        Ok(f.wait(timeout))
    }

    // ABI 1.2: the stream's worker waits for the fence before running what
    // comes after (the fence is kept alive by the queue, even if its handle
    // is destroyed meanwhile).
    const CAN_WAIT_FENCE: bool = true;

    fn stream_wait_fence(&self, stream: u64, fence: u64) -> PluginResult<()> {
        let f = self.streams.with_fence(fence, |f| Arc::clone(&f.fence))?;
        self.streams.submit(stream, Work::Wait(f), "stream_wait_fence")
    }

    // ABI 1.3: a copy is a job of the stream's worker (copy.rs).
    const CAN_COPY: bool = true;

    fn copy_kinds(&self) -> u32 {
        crate::copy::COPY_KINDS
    }

    fn copy(&self, stream: u64, dst: u64, src: u64, len: u64) -> PluginResult<()> {
        self.copy_on(stream, dst, src, len)
    }

    fn fence_destroy(&self, fence: u64) -> PluginResult<()> {
        let (key, serial) = split(fence);
        self.streams
            .fences
            .remove(key, |f| f.serial == serial)
            .map(drop)
            .ok_or_else(|| unknown("fence", fence))
    }
}
