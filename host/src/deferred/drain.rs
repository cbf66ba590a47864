//! Ending the queue's waits (ARCHITECTURE.md §4, Deferred free and
//! fences): entries of lost contexts retired without their fences, and a
//! drain whose every wait ends — paced when nothing moves, and saying which
//! entry is stuck and why.

use super::{DeferredFreeQueue, DrainReport};
use crate::events::Level;
use crate::fence::SharedFence;
use crate::sync::lock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The first pause of a `drain` pass that made no progress, and the most
/// it doubles to: short enough that a fence completing soon is seen soon,
/// long enough that a fence failing at once costs a few hundred plugin
/// calls a second, not millions.
const MIN_PAUSE: Duration = Duration::from_micros(50);
const MAX_PAUSE: Duration = Duration::from_millis(4);
/// At most one log line about stuck entries per this interval.
const STUCK_LOG_EVERY: Duration = Duration::from_secs(1);

/// The rate limit of the stuck-entry log line.
#[derive(Default)]
pub(super) struct StuckLog {
    last: Option<Instant>,
    /// Failed waits since the last line.
    since: u64,
}

impl DeferredFreeQueue {
    /// Retires every entry whose context is lost or terminated
    /// ([`Retire::settled_elsewhere`](super::Retire::settled_elsewhere)) now, without waiting for its fences:
    /// its retire calls no plugin and refunds nothing, and the fences of a
    /// device that is gone may never answer. Each entry leaves the queue
    /// under the lock before it runs, so it is retired exactly once.
    /// Returns how many it retired. O(pending): the manager runs it when a
    /// context terminates, and `drain` when a pass made no progress.
    pub fn settle_lost(&self) -> usize {
        let gone = lock(&self.waiting).take_settled_elsewhere();
        let n = gone.len();
        for e in gone {
            self.run(e.job);
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
        }
        self.settled_lost.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Retires everything it can within `timeout`, waiting on fences, and
    /// reports what is left (teardown).
    ///
    /// Every wait here ends: each is a slice of at most 10 ms, and a pass
    /// that retires nothing while its wait returns at once (a fence whose
    /// wait fails, or a plugin that ignores the timeout) backs off,
    /// doubling a pause from 50 µs up to 4 ms, instead of calling the
    /// plugin again at once. Such a pass also retires the entries of lost
    /// contexts ([`settle_lost`](Self::settle_lost)). A fence whose wait
    /// keeps failing is reported — the entry, the fence and the error — in
    /// the log (one line a second at most, with the count since the last)
    /// and counted in [`QueueStats::wait_errors`](super::QueueStats::wait_errors) and
    /// [`QueueStats::backoffs`](super::QueueStats::backoffs).
    pub fn drain(&self, timeout: Duration) -> DrainReport {
        let deadline = Instant::now() + timeout;
        let mut report = DrainReport::default();
        let mut pause = MIN_PAUSE;
        let mut stuck: Option<String> = None;
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
            let progressed = p.retired + p.quarantined > 0;
            if progressed {
                pause = MIN_PAUSE;
            }
            // Wait on one incomplete fence outside the lock, in short slices
            // so a fence that errors or another poller cannot stall us.
            let slice = (deadline - now).min(Duration::from_millis(10));
            let waited_at = Instant::now();
            match self.first_pending() {
                Some((f, entry)) => match f.wait(slice) {
                    Ok(_) => {}
                    Err(e) if e.status == memplug_sdk::Status::DeviceLost => {}
                    Err(e) => {
                        self.wait_errors.fetch_add(1, Ordering::Relaxed);
                        let why = format!("{entry} is stuck: waiting on {} failed: {e}", f.describe());
                        self.report_stuck(&why);
                        stuck = Some(why);
                    }
                },
                None => std::thread::sleep(slice.min(Duration::from_millis(1))),
            }
            if !progressed && waited_at.elapsed() < pause {
                // Nothing retired and the wait did not wait: the entries of
                // lost contexts go now (their fences may never answer), and
                // the next pass comes after a pause, not at once.
                if self.settle_lost() > 0 {
                    continue;
                }
                self.backoffs.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
        let waiting = lock(&self.waiting);
        report.left = waiting
            .entries()
            .map(|e| {
                let fences: Vec<String> = e.fences.iter().map(|f| f.describe()).collect();
                format!("{} waiting on [{}]", e.job.describe(), fences.join(", "))
            })
            .collect();
        drop(waiting);
        report.stuck = stuck;
        report
    }

    /// Logs `why` (a stuck entry) at most once per [`STUCK_LOG_EVERY`],
    /// with the number of failures since the last line: a fence that fails
    /// a million times makes a handful of lines, not a million.
    #[cold]
    fn report_stuck(&self, why: &str) {
        let line = {
            let mut log = lock(&self.stuck_log);
            log.since += 1;
            let due = log.last.is_none_or(|t| t.elapsed() >= STUCK_LOG_EVERY);
            if !due {
                return;
            }
            let line = match log.since {
                1 => why.to_string(),
                n => format!("{why} ({n} failed waits since the last report)"),
            };
            log.last = Some(Instant::now());
            log.since = 0;
            line
        };
        crate::events::plugin_message(self.hub.as_deref(), Level::Warn, "memplug deferred-free queue", &line);
    }

    /// The fence of one entry still waiting, with that entry described.
    fn first_pending(&self) -> Option<(SharedFence, String)> {
        let w = lock(&self.waiting);
        let ordered = w.streams.values().filter_map(|q| q.first_key_value()).map(|(_, b)| b);
        let b = ordered.chain(w.unordered.values()).next()?;
        let entry = b.entries.first().map_or_else(|| "an entry".to_string(), |e| e.job.describe());
        Some((b.fence.clone(), entry))
    }
}
