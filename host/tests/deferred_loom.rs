//! Exhaustive interleavings of the deferred-free queue (loom): a free
//! enqueued by one thread while another polls is retired exactly once, and
//! never before its fence — for unordered fences (grouped by fence), for
//! fences of one stream (a per-stream queue polled from its oldest fence),
//! and for an entry with fences of both kinds, which moves from one
//! fence's place to the next's as they complete.
//!
//! Built only with `--cfg loom` (see `governor_loom.rs` for the command).
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::thread;
use memplug_host::{DeferredFreeQueue, FenceSource, Retire, RetireOutcome};
use std::sync::Arc;
use std::time::Duration;

/// A fence another thread completes.
struct Flag(Arc<AtomicBool>);

impl FenceSource for Flag {
    fn query(&self) -> Result<bool, memplug_host::CallError> {
        Ok(self.0.load(Ordering::Acquire))
    }
    fn wait(&self, _: Duration) -> Result<bool, memplug_host::CallError> {
        Ok(self.0.load(Ordering::Acquire))
    }
    fn describe(&self) -> String {
        "flag".into()
    }
}

/// A fence of one stream: `seq` orders it among that stream's fences.
struct OnStream(Arc<AtomicBool>, u64);

impl FenceSource for OnStream {
    fn query(&self) -> Result<bool, memplug_host::CallError> {
        Ok(self.0.load(Ordering::Acquire))
    }
    fn wait(&self, _: Duration) -> Result<bool, memplug_host::CallError> {
        Ok(self.0.load(Ordering::Acquire))
    }
    fn describe(&self) -> String {
        format!("stream fence {}", self.1)
    }
    fn order_key(&self) -> Option<(u64, u64, u64)> {
        Some((1, 1, self.1))
    }
}

/// Records when it ran relative to its fence.
struct Job {
    freed: Arc<AtomicU64>,
    fence_done: Arc<AtomicBool>,
}

/// A job behind several fences: asserts all of them completed.
struct JobAll {
    freed: Arc<AtomicU64>,
    fences_done: Vec<Arc<AtomicBool>>,
}

impl Retire for JobAll {
    fn retire(self: Box<Self>) -> RetireOutcome {
        for d in &self.fences_done {
            assert!(d.load(Ordering::Acquire), "retired before one of its fences completed");
        }
        self.freed.fetch_add(1, Ordering::AcqRel);
        RetireOutcome::Freed { bytes: 1 }
    }
    fn describe(&self) -> String {
        "job (several fences)".into()
    }
}

impl Retire for Job {
    fn retire(self: Box<Self>) -> RetireOutcome {
        assert!(self.fence_done.load(Ordering::Acquire), "retired before its fence completed");
        self.freed.fetch_add(1, Ordering::AcqRel);
        RetireOutcome::Freed { bytes: 1 }
    }
    fn describe(&self) -> String {
        "job".into()
    }
}

#[test]
fn invariant_4_a_free_enqueued_during_a_poll_retires_once_after_its_fence() {
    loom::model(|| {
        let q = Arc::new(DeferredFreeQueue::default());
        let freed = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (q2, f2, d2) = (q.clone(), freed.clone(), done.clone());
        let producer = thread::spawn(move || {
            let fence: memplug_host::SharedFence = Arc::new(Flag(d2.clone()));
            q2.enqueue(vec![fence], Box::new(Job { freed: f2, fence_done: d2 }));
        });
        let (q3, d3) = (q.clone(), done.clone());
        let poller = thread::spawn(move || {
            q3.poll();
            d3.store(true, Ordering::Release);
            q3.poll();
        });
        producer.join().unwrap();
        poller.join().unwrap();
        q.poll();
        assert_eq!(freed.load(Ordering::Acquire), 1, "retired exactly once");
        assert_eq!(q.pending(), 0);
    });
}

#[test]
fn two_pollers_never_retire_the_same_entry_twice() {
    loom::model(|| {
        let q = Arc::new(DeferredFreeQueue::default());
        let freed = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(true));
        let fence: memplug_host::SharedFence = Arc::new(Flag(done.clone()));
        q.enqueue(vec![fence], Box::new(Job { freed: freed.clone(), fence_done: done }));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let q = q.clone();
                thread::spawn(move || {
                    q.poll();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(freed.load(Ordering::Acquire), 1);
        assert_eq!(q.pending(), 0);
    });
}

#[test]
fn stream_fences_retire_in_order_once_each_while_a_producer_enqueues() {
    // Three threads: bounded at two preemptions, which keeps the model to
    // seconds (unbounded it ran for minutes) and still interleaves the
    // producer's enqueue with both polls.
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(2);
    model.check(|| {
        let q = Arc::new(DeferredFreeQueue::default());
        let freed = Arc::new(AtomicU64::new(0));
        let (d1, d2) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        // The older fence's free is queued first.
        let f1: memplug_host::SharedFence = Arc::new(OnStream(d1.clone(), 1));
        q.enqueue(vec![f1], Box::new(Job { freed: freed.clone(), fence_done: d1.clone() }));
        let (q2, fr2, dd2) = (q.clone(), freed.clone(), d2.clone());
        let producer = thread::spawn(move || {
            let f2: memplug_host::SharedFence = Arc::new(OnStream(dd2.clone(), 2));
            q2.enqueue(vec![f2], Box::new(Job { freed: fr2, fence_done: dd2 }));
        });
        let (q3, dd1, dd2) = (q.clone(), d1.clone(), d2.clone());
        let poller = thread::spawn(move || {
            // The stream completes in order while this thread polls.
            dd1.store(true, Ordering::Release);
            q3.poll();
            dd2.store(true, Ordering::Release);
        });
        q.poll();
        producer.join().unwrap();
        poller.join().unwrap();
        q.poll();
        assert_eq!(freed.load(Ordering::Acquire), 2, "each retired exactly once");
        assert_eq!(q.pending(), 0);
        assert_eq!(q.stats().retired, 2);
    });
}

#[test]
fn an_entry_behind_a_stream_fence_and_a_runtime_fence_waits_for_both() {
    loom::model(|| {
        let q = Arc::new(DeferredFreeQueue::default());
        let freed = Arc::new(AtomicU64::new(0));
        let (ds, dr) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let fs: memplug_host::SharedFence = Arc::new(OnStream(ds.clone(), 7));
        let fr: memplug_host::SharedFence = Arc::new(Flag(dr.clone()));
        let job = JobAll { freed: freed.clone(), fences_done: vec![ds.clone(), dr.clone()] };
        // Waits on the stream fence (the last) first, then moves to the
        // runtime fence.
        q.release(vec![fr, fs], Box::new(job));
        let (q2, ds2, dr2) = (q.clone(), ds.clone(), dr.clone());
        let completer = thread::spawn(move || {
            ds2.store(true, Ordering::Release);
            q2.poll();
            dr2.store(true, Ordering::Release);
        });
        let q3 = q.clone();
        let poller = thread::spawn(move || {
            q3.poll();
        });
        completer.join().unwrap();
        poller.join().unwrap();
        q.poll();
        assert_eq!(freed.load(Ordering::Acquire), 1, "retired exactly once, after both");
        assert_eq!(q.pending(), 0);
    });
}
