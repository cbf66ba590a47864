//! Stalls for the `concurrency.*` checks: a schedule that forces the race
//! a handle table without a lock loses.
//!
//! Threads that call a plugin freely meet inside its table only when two
//! of them are in a window of a few instructions at once, which on a busy
//! machine (fewer free cores than threads) is rare: a plugin without a lock
//! passed the free-running storm in about four runs of five. So the storm's
//! threads stall each other: before each of its plugin calls a thread
//! picks another one that is inside a plugin call and interrupts it with a
//! signal whose handler only sleeps ([`STALL`]), then makes its own call.
//! The interrupted call stops wherever it was, possibly half way through
//! an update of the table, and the other threads' calls run into that
//! half-done update. A plugin with a lock only makes them wait for it.
//! Nothing else changes: the handler sleeps and restores `errno`, and
//! `SA_RESTART` restarts an interrupted system call.
//!
//! A thread is stalled again only once its last stall is over (signals
//! queued faster than they end would stop it for good). Each check runs in
//! its own process, so the handler installed here stays in that process.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an interrupted call stands still: long enough for the other
/// threads, on a busy machine, to reach the table meanwhile (100 µs caught
/// an unlocked table less often: notes/kit29.md).
const STALL: Duration = Duration::from_micros(300);

/// Stalls the allocator's storm makes at least (its threads go round
/// again until then); measured on an unlocked table
/// (conformance/tests/fixtures/racy_plugin.c): notes/kit29.md. The
/// allocator is the table every plugin has.
pub(crate) const ENOUGH_ALLOCATOR: usize = 1500;

/// Stalls of the other storms, which meet the same table more slowly
/// (each round maps memory): enough to catch it often, short enough for
/// the default run.
pub(crate) const ENOUGH_OTHERS: usize = 200;

/// A storm stops going round after this long, stalls or not (a machine
/// too busy to make them). Its first thread tells the kit it is alive
/// every [`ALIVE_EVERY`], so a long storm is not taken for a hang.
const LONGEST: Duration = Duration::from_secs(20);

/// See [`LONGEST`].
pub(crate) const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// The signal the stalls use: one of the real-time signals the C library
/// leaves to programs, unlikely to be one a plugin handles.
fn stall_signal() -> libc::c_int {
    libc::SIGRTMIN() + 6
}

extern "C" fn on_stall(_: libc::c_int) {
    // SAFETY: __errno_location and nanosleep are async-signal-safe; errno
    // is put back so the interrupted code never sees it change.
    unsafe {
        let errno = *libc::__errno_location();
        let ts = libc::timespec { tv_sec: 0, tv_nsec: STALL.as_nanos() as libc::c_long };
        libc::nanosleep(&ts, std::ptr::null_mut());
        *libc::__errno_location() = errno;
    }
}

/// One thread of the storm.
struct Victim {
    thread: libc::pthread_t,
    /// Set while it is inside a plugin call (`sink::call`).
    in_call: Arc<AtomicBool>,
    /// Until when (ns since the storm started) its last stall lasts.
    until: AtomicU64,
}

/// The storm's threads.
pub(crate) struct Stalls {
    /// Held while a signal is sent and while a thread leaves, so no
    /// signal is sent to a thread that has gone.
    victims: Mutex<Vec<Victim>>,
    turn: AtomicUsize,
    sent: AtomicUsize,
    started: Instant,
}

/// A storm thread's membership: its plugin calls are marked while it
/// lasts; dropping it leaves the list.
pub(crate) struct Enlisted<'a> {
    stalls: &'a Stalls,
    in_call: Arc<AtomicBool>,
}

impl Enlisted<'_> {
    /// Stalls another thread of the storm that is inside a plugin call, if
    /// one is (and its last stall is over): called before this thread's
    /// own plugin calls, which then meet the stalled one's half-done work.
    pub(crate) fn stall_another(&self) {
        let s = self.stalls;
        let now = s.started.elapsed().as_nanos() as u64;
        let v = s.victims.lock().unwrap_or_else(|e| e.into_inner());
        let n = v.len();
        let first = s.turn.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            let x = &v[(first + i) % n];
            if Arc::ptr_eq(&x.in_call, &self.in_call)
                || !x.in_call.load(Ordering::Acquire)
                || x.until.load(Ordering::Relaxed) > now
            {
                continue;
            }
            x.until.store(now + 2 * STALL.as_nanos() as u64, Ordering::Relaxed);
            // SAFETY: the thread is enlisted, so it has not left (it leaves
            // under this lock); the signal's handler only sleeps.
            unsafe { libc::pthread_kill(x.thread, stall_signal()) };
            s.sent.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
}

impl Drop for Enlisted<'_> {
    fn drop(&mut self) {
        crate::sink::mark_plugin_calls(None);
        let mut v = self.stalls.victims.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|x| !Arc::ptr_eq(&x.in_call, &self.in_call));
    }
}

impl Stalls {
    /// Installs the handler (in this check's process) and returns the
    /// list storm threads enlist in.
    pub(crate) fn new() -> Stalls {
        // SAFETY: a handler that only sleeps, for a signal nothing else here
        // uses.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stall as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(stall_signal(), &sa, std::ptr::null_mut());
        }
        Stalls {
            victims: Mutex::new(Vec::new()),
            turn: AtomicUsize::new(0),
            sent: AtomicUsize::new(0),
            started: Instant::now(),
        }
    }

    /// Enlists the calling thread: its plugin calls (`sink::call`) set its
    /// flag while they run.
    pub(crate) fn enlist(&self) -> Enlisted<'_> {
        let in_call = Arc::new(AtomicBool::new(false));
        // SAFETY: pthread_self has no preconditions.
        let thread = unsafe { libc::pthread_self() };
        self.victims.lock().unwrap_or_else(|e| e.into_inner()).push(Victim {
            thread,
            in_call: in_call.clone(),
            until: AtomicU64::new(0),
        });
        crate::sink::mark_plugin_calls(Some(in_call.clone()));
        Enlisted { stalls: self, in_call }
    }

    /// Whether the storm has had `enough` stalls, or [`LONGEST`] has gone
    /// by.
    pub(crate) fn had(&self, enough: usize) -> bool {
        self.sent.load(Ordering::Relaxed) >= enough || self.started.elapsed() > LONGEST
    }

    /// How many calls were stalled.
    pub(crate) fn sent(&self) -> usize {
        self.sent.load(Ordering::Relaxed)
    }
}
