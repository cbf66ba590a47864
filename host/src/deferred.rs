//! The deferred-free queue: one design, owned by the host (ARCHITECTURE.md §4).
//!
//! An owning object released while the device may still use it is enqueued
//! with the fences of its last use. Entries retire — the creating
//! mechanism frees, then the governor is refunded — only once every fence
//! has completed (invariant 4). Retiring happens on `poll()`, on an optional
//! reaper thread, or in `drain()` at teardown, which reports what it could
//! not retire. No lock is held while a fence is queried or a plugin called.

use crate::events::{events_wanted, Event, EventKind, Hub};
use crate::fence::{Completion, SharedFence};
use crate::governor::{AllocationClass, HolderId, Pool};
// loom's models under `--cfg loom` (tests/deferred_loom.rs), std's otherwise.
use crate::sync::{self, lock, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

mod drain;
mod entries;
use drain::StuckLog;
use entries::Entries;

/// What retiring one entry did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetireOutcome {
    /// The mechanism freed it and the charge was refunded.
    Freed {
        /// Bytes refunded to the pool (0 for an object that carried no
        /// charge, such as a temporary reservation).
        bytes: u64,
    },
    /// The mechanism could not free it: the charge stays, quarantined
    /// (invariant 7), with the plugin's explanation.
    Quarantined {
        /// Bytes that stay charged, counted as quarantined.
        bytes: u64,
        /// The refused call, as text (slot, status and the plugin's
        /// message).
        reason: String,
    },
    /// Its context is lost: the object went with the device, the plugin
    /// was not asked to free it, and its charge is settled when the
    /// context terminates (once, with the binding's other charges).
    Lost {
        /// Bytes left charged until the termination settles them.
        bytes: u64,
    },
}

/// The work of freeing one object once its fences completed: deallocate
/// through the creating mechanism, then refund (or quarantine) the charge.
///
/// The queue calls each job's `retire` exactly once, on whichever thread
/// polls (a caller of `poll` or `drain`, or the reaper), with no queue lock
/// held; it may call into a plugin. The host implements it for its owning
/// types; an embedder implements it to order its own frees after fences.
pub trait Retire: Send {
    /// Frees the object (every fence it waited on has completed, or was of
    /// a lost device) and says what happened to its charge. Must not panic:
    /// a panic unwinds through the poller.
    fn retire(self: Box<Self>) -> RetireOutcome;
    /// One line naming the object, for the entries a [`DrainReport`] lists
    /// as left.
    fn describe(&self) -> String;
    /// Whom the object's charge belongs to, for the `Retired` event
    /// (`crate::events`); asked only while someone listens.
    fn charged_to(&self) -> Option<ChargedTo> {
        None
    }
    /// Whether the object's context is lost or terminated: retiring it
    /// then calls no plugin and refunds nothing (the context's termination
    /// settles its charge, once), so it need not wait for its fences —
    /// which, on a device that is gone, may never answer.
    /// [`DeferredFreeQueue::settle_lost`] retires such entries at once.
    /// Asked under the queue's lock: must be cheap and take no lock. The
    /// default, `false`, keeps an entry waiting for its fences.
    fn settled_elsewhere(&self) -> bool {
        false
    }
}

/// Whom a freed object was charged to.
#[derive(Clone, Debug)]
pub struct ChargedTo {
    /// The pool charged.
    pub pool: Arc<Pool>,
    /// The holder charged (`None`: the pool's anonymous account).
    pub holder: Option<HolderId>,
    /// The class charged.
    pub class: AllocationClass,
}

/// One object waiting to be freed.
struct Entry {
    /// The fences not yet known complete. The entry waits on the last one;
    /// fences known complete are dropped from the end.
    fences: Vec<SharedFence>,
    job: Box<dyn Retire>,
}

/// The entries waiting on one fence.
struct Bucket {
    fence: SharedFence,
    entries: Entries<Entry>,
}

/// Streams whose emptied queues are kept for reuse (`Waiting::take`).
const KEEP_EMPTY: usize = 16;

/// A stream's identity in `order_key`: (mechanism key, stream handle).
type StreamKey = (u64, u64);
/// A bucket's place in its stream: (sequence, fence identity).
type StreamSlot = (u64, usize);

/// A fence's identity while a bucket holds it (its address cannot be
/// reused while the `Arc` lives).
fn identity(f: &SharedFence) -> usize {
    Arc::as_ptr(f) as *const () as usize
}

/// The queue's maps are keyed by the host's own numbers (mechanism keys,
/// stream handles, fence addresses), hashed on every enqueue and poll: a
/// multiply-and-rotate hash costs a few instructions where the default
/// SipHash costs dozens, and its resistance to chosen keys buys nothing
/// against a plugin, which runs in the process anyway.
#[derive(Default)]
struct WordHasher(u64);

impl std::hash::Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<WordHasher>>;

/// Where entries wait, by the fence they wait on. Ordered fences (those with
/// an [`order_key`](crate::fence::FenceSource::order_key)) wait in their
/// stream's queue, oldest first: a poll queries only each stream's oldest
/// fence until it meets one not complete, so retiring costs O(streams +
/// ready), not O(pending). Other fences wait grouped by fence: a poll
/// queries each distinct fence once.
#[derive(Default)]
struct Waiting {
    streams: FastMap<StreamKey, BTreeMap<StreamSlot, Bucket>>,
    unordered: FastMap<usize, Bucket>,
    /// Entries with no fence left: retired by the next poll.
    ready: Vec<Entry>,
    /// A poll's list of streams to visit, kept between polls so a poll
    /// allocates nothing for it (a second poller at the same time makes
    /// its own).
    scratch: Vec<StreamKey>,
}

impl Waiting {
    fn place(&mut self, e: Entry) {
        let Some(f) = e.fences.last() else {
            self.ready.push(e);
            return;
        };
        let id = identity(f);
        let new = |e: Entry| {
            let fence = e.fences.last().expect("checked above").clone();
            Bucket { fence, entries: Entries::one(e) }
        };
        use std::collections::{btree_map, hash_map};
        match f.order_key() {
            Some((mechanism, stream, sequence)) => {
                match self.streams.entry((mechanism, stream)).or_default().entry((sequence, id)) {
                    btree_map::Entry::Occupied(mut o) => o.get_mut().entries.push(e),
                    btree_map::Entry::Vacant(v) => {
                        v.insert(new(e));
                    }
                }
            }
            None => match self.unordered.entry(id) {
                hash_map::Entry::Occupied(mut o) => o.get_mut().entries.push(e),
                hash_map::Entry::Vacant(v) => {
                    v.insert(new(e));
                }
            },
        }
    }

    /// The oldest fence of `stream`, cloned to be queried outside the lock.
    fn head(&self, stream: &StreamKey) -> Option<(StreamSlot, SharedFence)> {
        let (slot, b) = self.streams.get(stream)?.first_key_value()?;
        Some((*slot, b.fence.clone()))
    }

    /// Takes the bucket at `slot` of `stream` (gone when another poller
    /// took it first), dropping the stream's queue once empty.
    ///
    /// With few streams, an emptied queue stays (a stream that frees one
    /// object at a time would otherwise free and remake its queue's node
    /// on every enqueue); a poll skips empty queues, and past
    /// [`KEEP_EMPTY`] streams every emptied queue goes at once, so the
    /// empty ones kept are bounded.
    fn take(&mut self, stream: &StreamKey, slot: &StreamSlot) -> Option<Bucket> {
        let q = self.streams.get_mut(stream)?;
        let b = q.remove(slot);
        if q.is_empty() && self.streams.len() > KEEP_EMPTY {
            self.streams.remove(stream);
        }
        b
    }

    /// Takes out every entry whose job is settled elsewhere (its context is
    /// lost), dropping buckets and stream queues left empty. O(pending):
    /// run at a termination or a stuck drain, never per poll.
    fn take_settled_elsewhere(&mut self) -> Vec<Entry> {
        let mut out = Vec::new();
        let mut pick =
            |entries: &mut Entries<Entry>| out.extend(entries.take_where(|e| e.job.settled_elsewhere()));
        for q in self.streams.values_mut() {
            for b in q.values_mut() {
                pick(&mut b.entries);
            }
            q.retain(|_, b| !b.entries.is_empty());
        }
        self.streams.retain(|_, q| !q.is_empty());
        for b in self.unordered.values_mut() {
            pick(&mut b.entries);
        }
        self.unordered.retain(|_, b| !b.entries.is_empty());
        let (gone, keep): (Vec<Entry>, Vec<Entry>) =
            std::mem::take(&mut self.ready).into_iter().partition(|e| e.job.settled_elsewhere());
        self.ready = keep;
        out.extend(gone);
        out
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> {
        let ordered = self.streams.values().flat_map(|q| q.values());
        ordered.chain(self.unordered.values()).flat_map(|b| b.entries.iter()).chain(self.ready.iter())
    }
}

/// Counters of a queue, all monotonic except `pending`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct QueueStats {
    /// Entries that went into the queue to wait for their fences.
    pub enqueued: u64,
    /// Freed without ever waiting in the queue (fences already complete).
    /// Counted in `retired` too.
    pub immediate: u64,
    /// Jobs that ended freed or lost, immediate ones included.
    pub retired: u64,
    /// Jobs whose free the plugin refused: their charge stays, quarantined.
    pub quarantined: u64,
    /// Fence queries that failed (other than DEVICE_LOST). The entry kept
    /// waiting: a fence that cannot be read is never taken as complete.
    pub fence_errors: u64,
    /// Entries whose context was lost: left to its termination to settle
    /// (counted in `retired` too: they left the queue).
    pub lost: u64,
    /// Fences that answered DEVICE_LOST: they will never complete, and the
    /// work they guarded went with the device, so they count as complete.
    pub lost_fences: u64,
    /// Waits of `drain` on a fence that failed (other than DEVICE_LOST):
    /// the entry is stuck on a fence that cannot be read.
    pub wait_errors: u64,
    /// Pauses `drain` took because a pass retired nothing and its wait
    /// returned at once (a failing or non-blocking fence): the bounded
    /// exponential backoff that keeps a stuck entry from spinning.
    pub backoffs: u64,
    /// Entries of lost or terminated contexts retired without waiting for
    /// their fences (`settle_lost`; counted in `retired` and `lost` too).
    pub settled_lost: u64,
    /// Entries enqueued and not yet retired, at the time of the snapshot.
    pub pending: usize,
}

/// What one `poll` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Entries this poll retired (freed, or left to a lost context's
    /// settlement).
    pub retired: usize,
    /// Entries this poll tried to free and the plugin refused.
    pub quarantined: usize,
    /// Entries still waiting when the poll ended (all pollers' together).
    pub still_pending: usize,
}

/// What `drain` could not retire before its timeout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Entries retired during the drain.
    pub retired: usize,
    /// Entries whose free the plugin refused during the drain.
    pub quarantined: usize,
    /// One line per entry left, naming the object and its fences.
    pub left: Vec<String>,
    /// The last entry whose fence's wait failed during the drain, with the
    /// fence and the error (`None`: every wait answered).
    pub stuck: Option<String>,
}

impl DrainReport {
    /// Whether the queue was empty when the drain ended (nothing `left`).
    pub fn is_complete(&self) -> bool {
        self.left.is_empty()
    }
}

/// The queue. Thread-safe; share it as `Arc<DeferredFreeQueue>`.
#[derive(Default)]
pub struct DeferredFreeQueue {
    waiting: Mutex<Waiting>,
    /// Entries enqueued and not yet retired, including those a poller holds
    /// outside the lock.
    outstanding: AtomicUsize,
    enqueued: AtomicU64,
    immediate: AtomicU64,
    retired: AtomicU64,
    quarantined: AtomicU64,
    fence_errors: AtomicU64,
    lost: AtomicU64,
    lost_fences: AtomicU64,
    wait_errors: AtomicU64,
    backoffs: AtomicU64,
    settled_lost: AtomicU64,
    /// When the last line about a stuck entry was logged (rate limit).
    stuck_log: Mutex<StuckLog>,
    wake: Condvar,
    wake_lock: Mutex<()>,
    /// Where `Retired` events go (none for a queue made on its own).
    hub: Option<Arc<Hub>>,
}

impl DeferredFreeQueue {
    /// An empty queue, shared. No thread runs until
    /// [`spawn_reaper`](Self::spawn_reaper).
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A queue whose `Retired` events go to `hub`.
    pub fn with_hub(hub: Arc<Hub>) -> Arc<Self> {
        Arc::new(DeferredFreeQueue { hub: Some(hub), ..Self::default() })
    }

    /// Frees now when every fence has already completed (the common case
    /// for host-visible work), else enqueues (as [`enqueue`](Self::enqueue)
    /// does). Never blocks on a fence.
    pub fn release(&self, fences: Vec<SharedFence>, job: Box<dyn Retire>) {
        let mut e = Entry { fences, job };
        if self.settle_fences(&mut e.fences) {
            self.immediate.fetch_add(1, Ordering::Relaxed);
            self.run(e.job);
        } else {
            self.push(e);
        }
    }

    /// Drops fences from the end of `fences` while they report completion
    /// (a failed query stops it and is counted; a lost device's fence
    /// counts as complete); `true` when none is left, else the last one
    /// left is the one to wait on. Called outside every lock: dropping a
    /// plugin fence calls the plugin. The queue judges its entries with it,
    /// and so does a caller that frees at once without making a job (none
    /// is boxed, no reference is cloned) and otherwise
    /// [`enqueue`](Self::enqueue)s the fences left, with
    /// [`count_immediate`](Self::count_immediate) after a free it ran.
    pub(crate) fn settle_fences(&self, fences: &mut Vec<SharedFence>) -> bool {
        while let Some(f) = fences.last() {
            if !self.done(f) {
                return false;
            }
            fences.pop();
        }
        true
    }

    /// Counts a free its caller ran at once after
    /// [`settle_fences`](Self::settle_fences) said its fences had
    /// completed, as `release` counts a job it runs at once (and tells the
    /// hub of the freed bytes, charged to `who`).
    pub(crate) fn count_immediate(&self, outcome: RetireOutcome, who: impl FnOnce() -> Option<ChargedTo>) {
        self.immediate.fetch_add(1, Ordering::Relaxed);
        if events_wanted() && self.hub.is_some() {
            self.observe_retired(&outcome, who());
        }
        self.count(outcome);
    }

    /// Always enqueues, even if the fences are complete — save a job whose
    /// context is already lost or terminated
    /// ([`Retire::settled_elsewhere`]), which retires at once: nothing
    /// would end its wait.
    pub fn enqueue(&self, fences: Vec<SharedFence>, job: Box<dyn Retire>) {
        self.push(Entry { fences, job });
    }

    fn push(&self, e: Entry) {
        if e.job.settled_elsewhere() {
            // Its context is already lost or terminated: nothing would ever
            // settle it here after the termination's `settle_lost` (its
            // fences may never answer), and its retire calls no plugin.
            // Only the enqueue path pays this check, not an immediate free.
            self.settled_lost.fetch_add(1, Ordering::Relaxed);
            self.run(e.job);
            return;
        }
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        self.enqueued.fetch_add(1, Ordering::Relaxed);
        // No wake-up per entry: the reaper polls on its interval, and a
        // notify here would cost a futex call on every enqueue.
        lock(&self.waiting).place(e);
    }

    /// `true` when `f` reports completion; a fence whose query fails counts
    /// as not complete (never free on a guess) — except a fence of a lost
    /// device, which never completes and guards work that is gone.
    fn done(&self, f: &SharedFence) -> bool {
        let c = Completion::of(f);
        let counter = match c {
            Completion::Lost => &self.lost_fences,
            Completion::Failed => &self.fence_errors,
            Completion::Complete | Completion::Pending => return c.frees(),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        c.frees()
    }

    /// Retires `job` and counts what it did; `true` when it left the queue.
    #[inline]
    fn run(&self, job: Box<dyn Retire>) -> bool {
        if events_wanted() && self.hub.is_some() {
            return self.run_observed(job);
        }
        self.count(job.retire())
    }

    /// [`run`](Self::run), telling the hub of a freed object.
    #[cold]
    #[inline(never)]
    fn run_observed(&self, job: Box<dyn Retire>) -> bool {
        let who = job.charged_to();
        let outcome = job.retire();
        self.observe_retired(&outcome, who);
        self.count(outcome)
    }

    /// Tells the hub of a freed object's bytes.
    #[cold]
    fn observe_retired(&self, outcome: &RetireOutcome, who: Option<ChargedTo>) {
        if let (RetireOutcome::Freed { bytes }, Some(hub)) = (outcome, &self.hub) {
            let e = match &who {
                Some(c) => Event::new(EventKind::Retired, c.pool.id(), c.pool.name(), *bytes)
                    .holder(c.holder)
                    .class(c.class),
                None => Event::new_bare(EventKind::Retired, *bytes),
            };
            hub.emit(&e);
        }
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
            RetireOutcome::Lost { .. } => {
                self.retired.fetch_add(1, Ordering::Relaxed);
                self.lost.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    }

    /// The entries of a bucket whose fence completed: each drops that
    /// fence (its last) and either retires or goes to `again`, to wait on
    /// its next fence not known complete.
    fn advance(&self, b: Bucket, report: &mut PollReport, again: &mut Vec<Entry>) {
        for mut e in b.entries {
            e.fences.pop();
            self.retire_or_keep(e, report, again);
        }
    }

    fn retire_or_keep(&self, mut e: Entry, report: &mut PollReport, again: &mut Vec<Entry>) {
        if !self.settle_fences(&mut e.fences) {
            again.push(e);
            return;
        }
        let freed = self.run(e.job);
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        if freed {
            report.retired += 1;
        } else {
            report.quarantined += 1;
        }
    }

    /// Retires every entry whose fences have completed. Queries each
    /// stream's oldest pending fence (and the next, while they complete)
    /// and each distinct unordered fence once; nothing else. Every entry is
    /// in the structure or held by exactly one poller, never both, so two
    /// pollers never retire one entry twice.
    pub fn poll(&self) -> PollReport {
        let mut report = PollReport::default();
        let mut again = Vec::new();
        let (ready, streams, unordered) = {
            let mut w = lock(&self.waiting);
            let ready = std::mem::take(&mut w.ready);
            let mut streams = std::mem::take(&mut w.scratch);
            streams.clear();
            // Empty queues kept for reuse (`Waiting::take`) have nothing to visit.
            streams.extend(w.streams.iter().filter(|(_, q)| !q.is_empty()).map(|(k, _)| *k));
            let unordered: Vec<(usize, SharedFence)> =
                w.unordered.iter().map(|(id, b)| (*id, b.fence.clone())).collect();
            (ready, streams, unordered)
        };
        for e in ready {
            self.retire_or_keep(e, &mut report, &mut again);
        }
        for stream in &streams {
            // Fences of one stream complete in order: stop at the first
            // that has not.
            loop {
                // Bound first: a guard in a `while let` scrutinee would be
                // held through the query.
                let head = lock(&self.waiting).head(stream);
                let Some((slot, fence)) = head else { break };
                if !self.done(&fence) {
                    break;
                }
                let taken = lock(&self.waiting).take(stream, &slot);
                if let Some(b) = taken {
                    self.advance(b, &mut report, &mut again);
                }
            }
        }
        for (id, fence) in unordered {
            if self.done(&fence) {
                let taken = lock(&self.waiting).unordered.remove(&id);
                if let Some(b) = taken {
                    self.advance(b, &mut report, &mut again);
                }
            }
        }
        {
            let mut w = lock(&self.waiting);
            for e in again {
                w.place(e);
            }
            if w.scratch.capacity() < streams.capacity() {
                w.scratch = streams;
            }
        }
        report.still_pending = self.pending();
        report
    }

    /// Entries enqueued and not yet retired.
    pub fn pending(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// The counters now. Each is read on its own (relaxed), so figures
    /// taken while others poll may be a few entries apart.
    pub fn stats(&self) -> QueueStats {
        QueueStats {
            enqueued: self.enqueued.load(Ordering::Relaxed),
            immediate: self.immediate.load(Ordering::Relaxed),
            retired: self.retired.load(Ordering::Relaxed),
            quarantined: self.quarantined.load(Ordering::Relaxed),
            fence_errors: self.fence_errors.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            lost_fences: self.lost_fences.load(Ordering::Relaxed),
            wait_errors: self.wait_errors.load(Ordering::Relaxed),
            backoffs: self.backoffs.load(Ordering::Relaxed),
            settled_lost: self.settled_lost.load(Ordering::Relaxed),
            pending: self.pending(),
        }
    }

    /// Starts a background thread that polls every `interval`. Stopped and
    /// joined when the handle drops.
    pub fn spawn_reaper(self: &Arc<Self>, interval: Duration) -> Reaper {
        self.spawn_reaper_with(interval, || {})
    }

    /// [`spawn_reaper`](Self::spawn_reaper), running `tick` after each poll
    /// (the manager drives its contexts' lives there).
    pub fn spawn_reaper_with(
        self: &Arc<Self>,
        interval: Duration,
        tick: impl Fn() + Send + 'static,
    ) -> Reaper {
        let stop = Arc::new(AtomicBool::new(false));
        let (q, s) = (self.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("memplug-reaper".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    q.poll();
                    tick();
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
    use std::time::Instant;

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
