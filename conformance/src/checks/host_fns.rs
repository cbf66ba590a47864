//! Host functions the kit enqueues on plugin streams.

use super::*;

/// A gate a host function waits at until the kit opens it (or 30 s pass:
/// a stream worker is never held forever by the kit).
#[derive(Default)]
pub(crate) struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    /// Set once the host function has passed the gate.
    pub passed: AtomicBool,
}

impl Gate {
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            open = self.cv.wait_timeout(open, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        self.passed.store(true, Ordering::SeqCst);
    }
}

/// Work the kit puts on a stream.
pub(crate) enum Job {
    /// Sleeps, then sets the flag.
    SleepThenSet(Duration, Arc<AtomicBool>),
    /// Waits at the gate.
    Gate(Arc<Gate>),
    /// Appends a number.
    Push(Arc<Mutex<Vec<u32>>>, u32),
}

unsafe extern "C" fn run_job(userdata: *mut c_void) {
    // Runs on a plugin thread: nothing may unwind into it.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the Box leaked by `enqueue_job`, run once.
        let job = unsafe { Box::from_raw(userdata.cast::<Job>()) };
        match *job {
            Job::SleepThenSet(d, flag) => {
                std::thread::sleep(d);
                flag.store(true, Ordering::SeqCst);
            }
            Job::Gate(g) => g.wait(),
            Job::Push(v, n) => v.lock().unwrap_or_else(|e| e.into_inner()).push(n),
        }
    }));
}

/// Enqueues `job`; on refusal the job is dropped here (the plugin must
/// not run what it refused).
pub(crate) fn enqueue_job(m: &Mech, log: &Log, stream: u64, job: Job) -> MemplugStatus {
    let userdata = Box::into_raw(Box::new(job)).cast::<c_void>();
    let s = m.enqueue(log, stream, Some(run_job), userdata);
    if s != MEMPLUG_STATUS_OK {
        // SAFETY: refused, so never run: the box is still ours.
        drop(unsafe { Box::from_raw(userdata.cast::<Job>()) });
    }
    s
}

/// Runs `f` on its own thread and gives up on it after `limit` (a plugin
/// call that never returns must not stop the run; the thread is left).
pub(crate) fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("memplug-conformance-bounded".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}
