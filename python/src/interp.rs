//! Calling Python from threads the host owns (a stream's worker, the
//! reaper, whoever polls a runtime fence or asks for pressure). Such a
//! thread must not ask for the GIL once the interpreter has begun to shut
//! down: CPython 3.9–3.13 ends a thread that takes the GIL during
//! finalisation with `pthread_exit`, whose forced unwind through Rust
//! frames aborts the process. So an `atexit` hook, registered when the
//! module loads, stops new calls and waits (the GIL released) for those in
//! flight; after it, every call gives its fallback answer.

use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

static EXITING: AtomicBool = AtomicBool::new(false);
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// How long the exit hook waits for calls in flight: a host function that
/// blocks longer is the program's own hang, not one to add to it.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Runs `f` with the GIL, or answers `fallback` once the interpreter is
/// exiting (or gone).
pub fn with_python<R>(fallback: R, f: impl FnOnce(Python<'_>) -> R) -> R {
    // Counted before the flag is read: the exit hook, which sets the flag
    // first, then sees this call and waits for it.
    IN_FLIGHT.fetch_add(1, SeqCst);
    // SAFETY: a plain query of the interpreter's state.
    let alive = !EXITING.load(SeqCst) && unsafe { pyo3::ffi::Py_IsInitialized() } != 0;
    let r = if alive { Python::with_gil(f) } else { fallback };
    IN_FLIGHT.fetch_sub(1, SeqCst);
    r
}

/// The `atexit` hook: no Python call starts after it; those in flight
/// finish first (up to `EXIT_GRACE`).
#[pyfunction]
fn _memplug_at_exit(py: Python<'_>) {
    EXITING.store(true, SeqCst);
    py.allow_threads(|| {
        let deadline = Instant::now() + EXIT_GRACE;
        while IN_FLIGHT.load(SeqCst) != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Registers the exit hook.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(_memplug_at_exit, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}

/// Waits for `done` to say true, `slice` at a time with the GIL released,
/// handling signals between slices (Ctrl-C interrupts the wait). `None`
/// waits for as long as it takes; `Ok(false)` is a timeout.
pub fn wait_interruptibly(
    py: Python<'_>,
    timeout: Option<Duration>,
    mut done: impl FnMut(Duration) -> bool + Send,
) -> PyResult<bool> {
    const SLICE: Duration = Duration::from_millis(50);
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let slice = left.map_or(SLICE, |l| l.min(SLICE));
        if py.allow_threads(|| done(slice)) {
            return Ok(true);
        }
        if left.is_some_and(|l| l <= slice) {
            return Ok(false);
        }
        py.check_signals()?;
    }
}
