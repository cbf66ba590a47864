//! The deferred-free queue: one design, owned by the host (DESIGN.md §4).
//!
//! An owning object released while the device may still use it is enqueued
//! with the fences of its last use. Entries retire — the creating
//! mechanism frees, then the governor is refunded — only once every fence
//! has completed (invariant 4). Retiring happens on `poll()`, on an optional
//! reaper thread, or in `drain()` at teardown, which reports what it could
//! not retire. No lock is held while a fence is queried or a plugin called.

use crate::fence::SharedFence;
// loom's models under `--cfg loom` (tests/deferred_loom.rs), std's otherwise.
use crate::sync::{self, lock, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What retiring one entry did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetireOutcome {
    /// The mechanism freed it and the charge was refunded.
    Freed { bytes: u64 },
    /// The mechanism could not free it: the charge stays, quarantined
    /// (invariant 7), with the plugin's explanation.
    Quarantined { bytes: u64, reason: String },
}

/// The work of freeing one object once its fences completed: deallocate
/// through the creating mechanism, then refund (or quarantine) the charge.
pub trait Retire: Send {
    fn retire(self: Box<Self>) -> RetireOutcome;
    /// For teardown reports.
    fn describe(&self) -> String;
}

struct Entry {
    fences: Vec<SharedFence>,
    job: Box<dyn Retire>,
}

impl Entry {
    /// True when every fence reports completion; a fence whose query fails
    /// counts as not complete (never free on a guess).
    fn ready(&self, errors: &AtomicU64) -> bool {
        self.fences.iter().all(|f| match f.query() {
            Ok(done) => done,
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        })
    }
}

/// Counters of a queue, all monotonic except `pending`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub enqueued: u64,
    /// Freed without ever waiting in the queue (fences already complete).
    pub immediate: u64,
    pub retired: u64,
    pub quarantined: u64,
    pub fence_errors: u64,
    pub pending: usize,
}

/// What one `poll` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollReport {
    pub retired: usize,
    pub quarantined: usize,
    pub still_pending: usize,
}

/// What `drain` could not retire before its timeout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    pub retired: usize,
    pub quarantined: usize,
    /// One line per entry left, naming the object and its fences.
    pub left: Vec<String>,
}

impl DrainReport {
    pub fn is_complete(&self) -> bool {
        self.left.is_empty()
    }
}

/// The queue. Thread-safe; share it as `Arc<DeferredFreeQueue>`.
#[derive(Default)]
pub struct DeferredFreeQueue {
    entries: Mutex<Vec<Entry>>,
    /// Entries enqueued and not yet retired, including those a poller holds
    /// outside the lock.
    outstanding: AtomicUsize,
    enqueued: AtomicU64,
    immediate: AtomicU64,
    retired: AtomicU64,
    quarantined: AtomicU64,
    fence_errors: AtomicU64,
    wake: Condvar,
    wake_lock: Mutex<()>,
}

impl DeferredFreeQueue {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Frees now when every fence has already completed (the common case
    /// for host-visible work), else enqueues. Never blocks on a fence.
    pub fn release(&self, fences: Vec<SharedFence>, job: Box<dyn Retire>) {
        let e = Entry { fences, job };
        if e.ready(&self.fence_errors) {
            self.immediate.fetch_add(1, Ordering::Relaxed);
            self.count(e.job.retire());
        } else {
            self.push(e);
        }
    }

    /// Always enqueues, even if the fences are complete.
    pub fn enqueue(&self, fences: Vec<SharedFence>, job: Box<dyn Retire>) {
        self.push(Entry { fences, job });
    }

    fn push(&self, e: Entry) {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        self.enqueued.fetch_add(1, Ordering::Relaxed);
        // No wake-up per entry: the reaper polls on its interval, and a
        // notify here would cost a futex call on every enqueue.
        lock(&self.entries).push(e);
    }

    fn count(&self, outcome: RetireOutcome) -> bool {
        match outcome {
            RetireOutcome::Freed { .. } => {
                self.retired.fetch_add(1, Ordering::Relaxed);
                true
            }
            RetireOutcome::Quarantined { .. } => {
                self.quarantined.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Retires every entry whose fences have completed.
    pub fn poll(&self) -> PollReport {
        let batch = std::mem::take(&mut *lock(&self.entries));
        let mut report = PollReport::default();
        let mut keep = Vec::new();
        for e in batch {
            if e.ready(&self.fence_errors) {
                let freed = self.count(e.job.retire());
                self.outstanding.fetch_sub(1, Ordering::AcqRel);
                if freed {
                    report.retired += 1;
                } else {
                    report.quarantined += 1;
                }
            } else {
                keep.push(e);
            }
        }
        report.still_pending = keep.len();
        if !keep.is_empty() {
            lock(&self.entries).extend(keep);
        }
        report
    }

    /// Entries enqueued and not yet retired.
    pub fn pending(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> QueueStats {
        QueueStats {
            enqueued: self.enqueued.load(Ordering::Relaxed),
            immediate: self.immediate.load(Ordering::Relaxed),
            retired: self.retired.load(Ordering::Relaxed),
            quarantined: self.quarantined.load(Ordering::Relaxed),
            fence_errors: self.fence_errors.load(Ordering::Relaxed),
            pending: self.pending(),
        }
    }

    /// Retires everything it can within `timeout`, waiting on fences, and
    /// reports what is left (teardown).
    pub fn drain(&self, timeout: Duration) -> DrainReport {
        let deadline = Instant::now() + timeout;
        let mut report = DrainReport::default();
        loop {
            let p = self.poll();
            report.retired += p.retired;
            report.quarantined += p.quarantined;
            if self.pending() == 0 {
                return report;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // Wait on one incomplete fence outside the lock, in short slices
            // so a fence that errors or another poller cannot stall us.
            let slice = (deadline - now).min(Duration::from_millis(10));
            match self.first_pending_fence() {
                Some(f) => {
                    let _ = f.wait(slice);
                }
                None => std::thread::sleep(slice.min(Duration::from_millis(1))),
            }
        }
        let entries = lock(&self.entries);
        report.left = entries
            .iter()
            .map(|e| {
                let fences: Vec<String> = e.fences.iter().map(|f| f.describe()).collect();
                format!("{} waiting on [{}]", e.job.describe(), fences.join(", "))
            })
            .collect();
        report
    }

    fn first_pending_fence(&self) -> Option<SharedFence> {
        let entries = lock(&self.entries);
        entries.first().and_then(|e| e.fences.first().cloned())
    }

    /// Starts a background thread that polls every `interval`. Stopped and
    /// joined when the handle drops.
    pub fn spawn_reaper(self: &Arc<Self>, interval: Duration) -> Reaper {
        let stop = Arc::new(AtomicBool::new(false));
        let (q, s) = (self.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("memplug-reaper".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    q.poll();
                    drop(sync::wait_timeout(&q.wake, lock(&q.wake_lock), interval));
                }
            })
            .expect("spawn reaper thread");
        Reaper { queue: self.clone(), stop, thread: Some(thread) }
    }
}

/// A running reaper thread; dropping it stops and joins the thread.
pub struct Reaper {
    queue: Arc<DeferredFreeQueue>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.queue.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::FnFence;
    use std::sync::atomic::AtomicBool;

    struct Job(Arc<AtomicU64>, bool);
    impl Retire for Job {
        fn retire(self: Box<Self>) -> RetireOutcome {
            self.0.fetch_add(1, Ordering::SeqCst);
            if self.1 {
                RetireOutcome::Freed { bytes: 1 }
            } else {
                RetireOutcome::Quarantined { bytes: 1, reason: "refused".into() }
            }
        }
        fn describe(&self) -> String {
            "test job".into()
        }
    }

    fn gate() -> (Arc<AtomicBool>, SharedFence) {
        let done = Arc::new(AtomicBool::new(false));
        let (q, w) = (done.clone(), done.clone());
        let f = FnFence::new(
            "gate",
            move || q.load(Ordering::SeqCst),
            move |t| {
                std::thread::sleep(t.min(Duration::from_millis(1)));
                w.load(Ordering::SeqCst)
            },
        );
        (done, f)
    }

    #[test]
    fn invariant_4_nothing_retires_before_its_fence() {
        let q = DeferredFreeQueue::new();
        let freed = Arc::new(AtomicU64::new(0));
        let (done, f) = gate();
        q.release(vec![f.clone()], Box::new(Job(freed.clone(), true)));
        assert_eq!(q.poll(), PollReport { retired: 0, quarantined: 0, still_pending: 1 });
        assert_eq!(freed.load(Ordering::SeqCst), 0);
        done.store(true, Ordering::SeqCst);
        assert_eq!(q.poll().retired, 1);
        assert_eq!(freed.load(Ordering::SeqCst), 1);
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn completed_fences_free_immediately() {
        let q = DeferredFreeQueue::new();
        let freed = Arc::new(AtomicU64::new(0));
        let (done, f) = gate();
        done.store(true, Ordering::SeqCst);
        q.release(vec![f], Box::new(Job(freed.clone(), true)));
        assert_eq!(freed.load(Ordering::SeqCst), 1);
        assert_eq!(q.stats().immediate, 1);
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn drain_reports_what_it_could_not_retire() {
        let q = DeferredFreeQueue::new();
        let freed = Arc::new(AtomicU64::new(0));
        let (_never, f) = gate();
        q.enqueue(vec![f], Box::new(Job(freed.clone(), true)));
        let r = q.drain(Duration::from_millis(30));
        assert!(!r.is_complete());
        assert_eq!(r.left.len(), 1);
        assert!(r.left[0].contains("test job") && r.left[0].contains("runtime fence 'gate'"), "{:?}", r.left);
        assert_eq!(freed.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn failed_frees_are_counted_as_quarantined() {
        let q = DeferredFreeQueue::new();
        let n = Arc::new(AtomicU64::new(0));
        q.enqueue(Vec::new(), Box::new(Job(n.clone(), false)));
        assert_eq!(q.poll().quarantined, 1);
        assert_eq!(q.stats().quarantined, 1);
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn reaper_retires_in_the_background() {
        let q = DeferredFreeQueue::new();
        let freed = Arc::new(AtomicU64::new(0));
        let (done, f) = gate();
        q.enqueue(vec![f], Box::new(Job(freed.clone(), true)));
        let reaper = q.spawn_reaper(Duration::from_millis(1));
        done.store(true, Ordering::SeqCst);
        let t = Instant::now();
        while q.pending() != 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(reaper);
        assert_eq!(freed.load(Ordering::SeqCst), 1);
    }
}
