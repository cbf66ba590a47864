//! Stalls for the `concurrency.*` checks: a schedule that forces the race
//! a handle table without a lock loses.
//!
//! Threads that call a plugin freely meet inside its table only when two
//! of them are in a window of a few instructions at once, which on a busy
//! machine (fewer free cores than threads) is rare: a plugin without a lock
//! passed the free-running storm in about four runs of five. So each thread
//! of a storm has a timer of its own ([`TICK`], `SIGEV_THREAD_ID`) whose
//! signal interrupts it wherever it is; when the interrupt finds it inside
//! a plugin call (`sink::in_plugin_call`), the handler makes it stand
//! still there ([`STALL`]), possibly half way through an update of the
//! plugin's table, while the other threads' calls run into that half-done
//! update. Elsewhere the handler returns at once. A plugin with a lock only
//! makes the others wait for it. Nothing else changes: the handler restores
//! `errno`, `SA_RESTART` restarts an interrupted system call, and a timer's
//! signals never pile up (a POSIX timer counts overruns instead).
//!
//! (Signalling a thread seen inside a call from another thread stalled it
//! too late, mostly after the call had returned: a call lasts far less than
//! a signal takes to arrive. Its own timer stops a thread at a random point
//! of what it is running, and it stands still only inside a call.)
//!
//! Each check runs in its own process, so the handler installed here stays
//! in that process.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often each storm thread is interrupted.
const TICK: Duration = Duration::from_micros(400);

/// How long a thread interrupted inside a plugin call stands still: long
/// enough for the other threads, on a busy machine, to reach the table
/// meanwhile.
const STALL: Duration = Duration::from_micros(300);

/// Stalls the allocator's storm makes at least (its threads go round
/// again until then); measured on an unlocked table
/// (conformance/tests/fixtures/racy_plugin.c) with
/// `scripts/kit-catch-rate.sh`: 100 runs of 100 caught. The
/// allocator is the table every plugin has.
pub(crate) const ENOUGH_ALLOCATOR: usize = 800;

/// Stalls of the other storms, which meet the same table more slowly
/// (each round maps memory): enough to catch it often, short enough for
/// the default run.
pub(crate) const ENOUGH_OTHERS: usize = 100;

/// A storm stops going round after this long, stalls or not (a machine
/// too busy to make them). Meanwhile it tells the kit it is alive every
/// [`ALIVE_EVERY`] in which plugin calls returned, so a long storm is not
/// taken for a hang (and a hung call still is).
const LONGEST: Duration = Duration::from_secs(20);

/// See [`LONGEST`]: well under the shortest --timeout (1 s).
pub(crate) const ALIVE_EVERY: Duration = Duration::from_millis(200);

/// Calls stalled in this process (the handler counts them).
static STALLED: AtomicUsize = AtomicUsize::new(0);

/// The signal the timers send: one of the real-time signals the C library
/// leaves to programs, unlikely to be one a plugin handles.
fn stall_signal() -> libc::c_int {
    libc::SIGRTMIN() + 6
}

thread_local! {
    /// When (CLOCK_MONOTONIC, ns) this thread's last stall ended: a tick
    /// that arrives sooner (it fell due during the stall, or the thread
    /// waited for a core) does not stall it again, so a stalled thread
    /// always runs on for a while.
    static LAST_STALL_END: Cell<u64> = const { Cell::new(0) };
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime is async-signal-safe and writes `ts` only.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

extern "C" fn on_tick(_: libc::c_int) {
    if !crate::sink::in_plugin_call() {
        return;
    }
    let now = monotonic_ns();
    if now < LAST_STALL_END.with(Cell::get) + STALL.as_nanos() as u64 {
        return;
    }
    // SAFETY: __errno_location and nanosleep are async-signal-safe, as is
    // an atomic add; errno is put back so the interrupted code never sees
    // it change.
    unsafe {
        let errno = *libc::__errno_location();
        let ts = libc::timespec { tv_sec: 0, tv_nsec: STALL.as_nanos() as libc::c_long };
        libc::nanosleep(&ts, std::ptr::null_mut());
        *libc::__errno_location() = errno;
    }
    LAST_STALL_END.with(|t| t.set(monotonic_ns()));
    STALLED.fetch_add(1, Ordering::Relaxed);
}

/// One storm's stalls.
pub(crate) struct Stalls {
    started: Instant,
    /// [`STALLED`] when the storm started.
    base: usize,
}

/// A storm thread's timer, deleted when it is dropped (before the thread
/// ends).
pub(crate) struct Enlisted {
    timer: Option<libc::timer_t>,
}

impl Drop for Enlisted {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            // SAFETY: the timer this thread created, deleted once.
            unsafe { libc::timer_delete(t) };
        }
    }
}

impl Stalls {
    /// Installs the handler (in this check's process).
    pub(crate) fn new() -> Stalls {
        // SAFETY: a handler that only sleeps (inside a plugin call), for a
        // signal nothing else here uses.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_tick as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(stall_signal(), &sa, std::ptr::null_mut());
        }
        Stalls { started: Instant::now(), base: STALLED.load(Ordering::Relaxed) }
    }

    /// Gives the calling thread (storm thread `t`) its timer; the threads'
    /// periods differ a little, so they do not tick in step. Without a
    /// timer (timer_create refused) the thread runs unstalled.
    pub(crate) fn enlist(&self, t: usize) -> Enlisted {
        // SAFETY: a zeroed sigevent filled as timer_create documents, for
        // this thread; the timer is armed only once created.
        unsafe {
            let mut ev: libc::sigevent = std::mem::zeroed();
            ev.sigev_notify = libc::SIGEV_THREAD_ID;
            ev.sigev_signo = stall_signal();
            ev.sigev_notify_thread_id = libc::gettid();
            let mut timer: libc::timer_t = std::mem::zeroed();
            if libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut timer) != 0 {
                return Enlisted { timer: None };
            }
            let period = TICK + Duration::from_micros(17 * (t as u64 % 8));
            let ts = libc::timespec { tv_sec: 0, tv_nsec: period.as_nanos() as libc::c_long };
            let spec = libc::itimerspec { it_interval: ts, it_value: ts };
            libc::timer_settime(timer, 0, &spec, std::ptr::null_mut());
            Enlisted { timer: Some(timer) }
        }
    }

    /// Whether the storm has had `enough` stalls, or [`LONGEST`] has gone
    /// by.
    pub(crate) fn had(&self, enough: usize) -> bool {
        self.sent() >= enough || self.started.elapsed() > LONGEST
    }

    /// How many plugin calls were stalled.
    pub(crate) fn sent(&self) -> usize {
        STALLED.load(Ordering::Relaxed).saturating_sub(self.base)
    }
}
