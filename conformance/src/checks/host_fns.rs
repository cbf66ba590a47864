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

/// Jobs enqueued and not yet run, by the id their host function gets as
/// `userdata`. A job is taken out when it runs: a plugin that runs a host
/// function twice (or one whose enqueue it refused) finds nothing, which
/// the kit counts ([`STRAY_RUNS`]) and the check reports, instead of a
/// second free of the job crashing the check without a reason.
static JOBS: Mutex<std::collections::BTreeMap<usize, Job>> = Mutex::new(std::collections::BTreeMap::new());
static NEXT_JOB: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// Host functions the plugin ran with no job waiting: a second run, or a
/// run after a refused enqueue.
pub(crate) static STRAY_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn run_job(userdata: *mut c_void) {
    // Runs on a plugin thread: nothing may unwind into it.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let job = JOBS.lock().unwrap_or_else(|e| e.into_inner()).remove(&(userdata as usize));
        let Some(job) = job else {
            STRAY_RUNS.fetch_add(1, Ordering::SeqCst);
            fresh::mark(
                "a host function ran with no enqueue waiting for it: a second run, or a run after its enqueue was \
                 refused",
            );
            return;
        };
        match job {
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
    let id = NEXT_JOB.fetch_add(1, Ordering::SeqCst);
    JOBS.lock().unwrap_or_else(|e| e.into_inner()).insert(id, job);
    let s = m.enqueue(log, stream, Some(run_job), id as *mut c_void);
    if s != MEMPLUG_STATUS_OK {
        // Refused, so never to run: dropped now (a later run is stray).
        JOBS.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
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
