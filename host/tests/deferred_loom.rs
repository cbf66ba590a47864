//! Exhaustive interleavings of the deferred-free queue (loom): a free
//! enqueued by one thread while another polls is retired exactly once, and
//! never before its fence.
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

/// Records when it ran relative to its fence.
struct Job {
    freed: Arc<AtomicU64>,
    fence_done: Arc<AtomicBool>,
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
