//! A dead context, reported (ABI 1.2): how a sticky CUDA error becomes
//! `MEMPLUG_STATUS_DEVICE_LOST` and a `report_device_lost` to the hosts.
//!
//! **Which status.** `DEVICE_LOST` is a code of ABI 1.2; a host that agreed
//! on 1.0 or 1.1 cannot know it. One plugin instance may be held by several
//! hosts (`dlopen` of one file is one library), and a slot does not know
//! which host called it, so the instance decides by what it knows: once a
//! host that agreed on 1.2 or newer has negotiated it ([`LossLine::host_agreed`],
//! called by the entry after each successful negotiation), a dead context
//! is `DEVICE_LOST` and is reported; until then it is `DEVICE_UNAVAILABLE`
//! (the nearest 1.0/1.1 code) and nothing is reported. A context that died
//! while only older hosts held the instance is reported the first time
//! anything touches it after a 1.2 host arrived.
//!
//! **Reported once.** Per mechanism, through the instance's
//! [`HostLink`]: the first slot that meets the sticky error (or finds the
//! context dead), or the watcher below, whichever comes first. The report
//! latches the mechanism inside the SDK, so later slots answer
//! `DEVICE_LOST` without reaching this crate.
//!
//! **Asynchronously.** The CUDA driver has no callback for a dead context.
//! With `MEMPLUG_CUDA_LOSS_POLL_MS=N` (read when the plugin instance is
//! built; off by default) a watcher thread asks every retained context
//! every `N` ms with `cuMemGetInfo` (cheap, never waits for work, and
//! answers the sticky error of a dead context), so a loss is reported even
//! while no slot is called. The thread is stopped and joined when the
//! plugin is unloaded, before the library can go.

use crate::mechanism::CudaMechanism;
use memplug_sdk::{HostLink, MechanismState, Status};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// The environment variable that turns the watcher on: its period in
/// milliseconds (absent, empty, `0` or not a number: off).
pub const POLL_ENV: &str = "MEMPLUG_CUDA_LOSS_POLL_MS";

/// One plugin instance's line to its hosts, shared by its mechanisms.
pub struct LossLine {
    link: HostLink,
    /// A host that agreed on ABI 1.2 or newer negotiated this instance.
    speaks_1_2: AtomicBool,
}

impl LossLine {
    /// A line for an instance being built, with its link.
    pub fn new(link: &HostLink) -> Arc<LossLine> {
        Arc::new(LossLine { link: link.clone(), speaks_1_2: AtomicBool::new(false) })
    }

    /// A negotiation of this instance succeeded at `minor`.
    pub fn host_agreed(&self, minor: u32) {
        if minor >= 2 {
            self.speaks_1_2.store(true, Ordering::Release);
        }
    }

    /// Whether a dead context is `DEVICE_LOST` (and reported) now.
    pub fn speaks_1_2(&self) -> bool {
        self.speaks_1_2.load(Ordering::Acquire)
    }

    /// The status of a dead context for this instance's hosts.
    pub fn lost_status(&self) -> Status {
        if self.speaks_1_2() {
            Status::DeviceLost
        } else {
            Status::DeviceUnavailable
        }
    }

    /// Reports mechanism `id` lost (the caller reports each mechanism once).
    pub fn report(&self, id: u64, reason: &str) {
        // A host that refuses (it is unloading, say) has nothing more to
        // be told; the SDK's latch is set either way.
        let _ = self.link.report_device_lost(id, reason);
    }
}

/// The line of the instance an entry's cell holds now, for the entry to
/// tell it what each negotiation agreed on. One per entry point (each has
/// its own instance).
pub struct CurrentLine(Mutex<Weak<LossLine>>);

impl CurrentLine {
    /// Empty, for a `static`.
    pub const fn new() -> Self {
        CurrentLine(Mutex::new(Weak::new()))
    }

    /// The instance being built now has `line`.
    pub fn set(&self, line: &Arc<LossLine>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(line);
    }

    /// A negotiation succeeded at `minor`: the instance it handed out is
    /// the current one (the hold it just took keeps it from being freed
    /// and rebuilt meanwhile).
    pub fn host_agreed(&self, minor: u32) {
        if let Some(line) = self.0.lock().unwrap_or_else(PoisonError::into_inner).upgrade() {
            line.host_agreed(minor);
        }
    }
}

/// The watcher's period from [`POLL_ENV`], if it is on.
pub fn poll_period() -> Option<Duration> {
    let ms: u64 = std::env::var(POLL_ENV).ok()?.trim().parse().ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

type Stop = Arc<(Mutex<bool>, Condvar)>;

/// The watcher thread of one plugin instance; stopped and joined on drop
/// (the instance's drop, at unload).
pub struct Watcher {
    stop: Stop,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching `mechanisms` every `period`; `None` when no thread
    /// could be started (the plugin then relies on its slots alone).
    pub fn start(period: Duration, mechanisms: Vec<MechanismState<CudaMechanism>>) -> Option<Watcher> {
        let stop: Stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("memplug-cuda-loss".into())
            .spawn(move || {
                let (lock, cv) = &*flag;
                let mut stopped = lock.lock().unwrap_or_else(PoisonError::into_inner);
                loop {
                    stopped = cv.wait_timeout(stopped, period).unwrap_or_else(PoisonError::into_inner).0;
                    if *stopped {
                        return;
                    }
                    // Not under the lock: a poll calls the driver.
                    drop(stopped);
                    for m in &mechanisms {
                        m.ctx.poll();
                    }
                    stopped = lock.lock().unwrap_or_else(PoisonError::into_inner);
                }
            })
            .ok()?;
        Some(Watcher { stop, thread: Some(thread) })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            // Never the watcher itself: it holds no hold on the plugin.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_context_is_device_lost_only_once_a_1_2_host_negotiated() {
        let line = LossLine::new(&HostLink::new());
        assert_eq!(line.lost_status(), Status::DeviceUnavailable);
        line.host_agreed(0);
        line.host_agreed(1);
        assert_eq!(line.lost_status(), Status::DeviceUnavailable, "1.0 and 1.1 have no DEVICE_LOST");
        line.host_agreed(2);
        assert_eq!(line.lost_status(), Status::DeviceLost);
        line.host_agreed(1);
        assert_eq!(line.lost_status(), Status::DeviceLost, "a later 1.1 host changes nothing");
    }

    #[test]
    fn the_current_line_reaches_the_live_instance_only() {
        let current = CurrentLine::new();
        current.host_agreed(2); // no instance yet: nothing to tell
        let old = LossLine::new(&HostLink::new());
        current.set(&old);
        drop(old);
        current.host_agreed(2); // that instance is gone: nothing to tell
        let line = LossLine::new(&HostLink::new());
        current.set(&line);
        current.host_agreed(2);
        assert!(line.speaks_1_2());
    }
}
