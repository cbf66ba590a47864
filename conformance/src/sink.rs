//! The kit's message sink: records every write a plugin makes during one
//! call (how long, from which thread, whether it is UTF-8), and a log of
//! every call that failed or wrote, which the `messages.*` and `structs.*`
//! checks judge at the end of the run.

use core::ffi::{c_char, c_void};
use memplug_sdk::abi::{MemplugMessageSink, MemplugStatus, MEMPLUG_MESSAGE_MAX, MEMPLUG_STATUS_OK};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;

/// One call of `sink.write` by the plugin.
#[derive(Clone, Debug)]
pub(crate) struct Write {
    /// The length the plugin claimed.
    pub len: usize,
    /// `msg` was NULL.
    pub null_msg: bool,
    /// Written from a thread other than the one that made the call.
    pub foreign_thread: bool,
    /// The first `MEMPLUG_MESSAGE_MAX` bytes are UTF-8 (a character cut at
    /// the bound counts as UTF-8).
    pub utf8: bool,
    /// Those bytes, lossily decoded.
    pub text: String,
}

/// Collects the writes of one call; thread-safe because a misbehaving
/// plugin may write from elsewhere. [`call`] leaks one per call, so a sink
/// the plugin kept past its call still points at live memory: a write
/// into it then lands in [`late_writes`] instead of in freed stack memory
/// (which would pass unseen, or crash somewhere unrelated).
pub(crate) struct Recorder {
    caller: ThreadId,
    writes: Mutex<Vec<Write>>,
    /// The slot whose call this recorder served.
    slot: &'static str,
    /// Set once that call returned: later writes are the plugin's bug.
    returned: AtomicBool,
}

/// How many late writes are kept (a plugin writing in a loop into a kept
/// sink must not fill the kit's memory or its report).
const LATE_KEPT: usize = 16;

/// Writes into a sink after its call returned, as `(slot, text)`, since
/// the last [`take_late_writes`]; and how many there were in all.
static LATE: Mutex<(Vec<(&'static str, String)>, usize)> = Mutex::new((Vec::new(), 0));

/// The late writes recorded since the last call, and their total count.
pub(crate) fn take_late_writes() -> (Vec<(&'static str, String)>, usize) {
    std::mem::take(&mut *LATE.lock().unwrap_or_else(|e| e.into_inner()))
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Recorder::for_slot("")
    }

    fn for_slot(slot: &'static str) -> Self {
        Recorder {
            caller: std::thread::current().id(),
            writes: Mutex::new(Vec::new()),
            slot,
            returned: AtomicBool::new(false),
        }
    }

    /// A sink pointing at `self`; valid while `self` is.
    pub(crate) fn sink(&self) -> MemplugMessageSink {
        MemplugMessageSink { ctx: (self as *const Recorder).cast_mut().cast(), write: Some(record_write) }
    }

    pub(crate) fn take(&self) -> Vec<Write> {
        std::mem::take(&mut *self.writes.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

unsafe extern "C" fn record_write(ctx: *mut c_void, msg: *const c_char, len: usize) {
    // Called from plugin code: nothing may unwind into it.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(rec) = ctx.cast::<Recorder>().cast_const().as_ref() else {
            return;
        };
        let foreign_thread = std::thread::current().id() != rec.caller;
        let w = if msg.is_null() {
            Write { len, null_msg: true, foreign_thread, utf8: true, text: String::new() }
        } else {
            // Read no more than a host keeps, whatever the plugin claims.
            let n = len.min(MEMPLUG_MESSAGE_MAX as usize);
            let bytes = core::slice::from_raw_parts(msg.cast::<u8>(), n);
            let utf8 = match std::str::from_utf8(bytes) {
                Ok(_) => true,
                // Cut inside a character by the bound: still UTF-8.
                Err(e) => e.error_len().is_none() && n < len,
            };
            Write {
                len,
                null_msg: false,
                foreign_thread,
                utf8,
                text: String::from_utf8_lossy(bytes).into_owned(),
            }
        };
        if rec.returned.load(Ordering::SeqCst) {
            let mut late = LATE.lock().unwrap_or_else(|e| e.into_inner());
            late.1 += 1;
            if late.0.len() < LATE_KEPT {
                let text: String = w.text.chars().take(80).collect();
                late.0.push((rec.slot, text));
            }
            return;
        }
        rec.writes.lock().unwrap_or_else(|e| e.into_inner()).push(w);
    }));
}

/// One logged call: a failure, or a success that wrote messages anyway.
#[derive(Clone, Debug)]
pub(crate) struct Logged {
    pub slot: &'static str,
    pub status: MemplugStatus,
    pub writes: Vec<Write>,
}

/// Everything the run observed through sinks and output buffers.
///
/// Each check runs in its own process: there the log starts as a copy of
/// what the checks before it logged ([`Log::snapshot`]), is muted while the
/// kit re-runs the checks that set the plugin up, and what the check itself
/// adds ([`Log::since`]) goes back to the kit, which adds it to its own.
#[derive(Default)]
pub(crate) struct Log {
    /// While set, nothing is recorded.
    muted: AtomicBool,
    calls: Mutex<Vec<Logged>>,
    /// `(slot, detail)`: an output written past its `struct_size`.
    pub(crate) overruns: Mutex<Vec<(&'static str, String)>>,
    /// `(slot, status)`: an output changed by a call that failed.
    pub(crate) written_on_failure: Mutex<Vec<(&'static str, MemplugStatus)>>,
    /// `(slot, text)`: a write into a sink after its call returned (at
    /// most a few per check), and how many there were in all.
    pub(crate) late: Mutex<(Vec<(&'static str, String)>, usize)>,
}

/// How long each list of a [`Log`] was at some moment.
#[derive(Clone, Copy)]
pub(crate) struct Marks(usize, usize, usize);

/// What a [`Log`] recorded after some [`Marks`].
pub(crate) type Entries = (Vec<Logged>, Vec<(&'static str, String)>, Vec<(&'static str, MemplugStatus)>);

fn locked<T: Clone>(m: &Mutex<Vec<T>>) -> std::sync::MutexGuard<'_, Vec<T>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn tail<T: Clone>(m: &Mutex<Vec<T>>, from: usize) -> Vec<T> {
    locked(m).get(from..).map(<[T]>::to_vec).unwrap_or_default()
}

impl Log {
    /// Stops (or resumes) recording.
    pub(crate) fn set_muted(&self, muted: bool) {
        self.muted.store(muted, Ordering::SeqCst);
    }

    fn muted(&self) -> bool {
        self.muted.load(Ordering::SeqCst)
    }

    /// An unmuted copy of everything recorded so far.
    pub(crate) fn snapshot(&self) -> Log {
        Log {
            muted: AtomicBool::new(false),
            calls: Mutex::new(locked(&self.calls).clone()),
            overruns: Mutex::new(locked(&self.overruns).clone()),
            written_on_failure: Mutex::new(locked(&self.written_on_failure).clone()),
            late: Mutex::new(self.late.lock().unwrap_or_else(|e| e.into_inner()).clone()),
        }
    }

    pub(crate) fn marks(&self) -> Marks {
        Marks(locked(&self.calls).len(), locked(&self.overruns).len(), locked(&self.written_on_failure).len())
    }

    /// Everything recorded after `m`.
    pub(crate) fn since(&self, m: Marks) -> Entries {
        (tail(&self.calls, m.0), tail(&self.overruns, m.1), tail(&self.written_on_failure, m.2))
    }

    pub(crate) fn record(&self, slot: &'static str, status: MemplugStatus, writes: Vec<Write>) {
        if self.muted() {
            return;
        }
        if status != MEMPLUG_STATUS_OK || !writes.is_empty() {
            self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(Logged { slot, status, writes });
        }
    }

    pub(crate) fn calls(&self) -> Vec<Logged> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn overrun(&self, slot: &'static str, detail: String) {
        if self.muted() {
            return;
        }
        self.overruns.lock().unwrap_or_else(|e| e.into_inner()).push((slot, detail));
    }

    /// Adds late writes (`count` in all, `kept` of them with their text).
    pub(crate) fn late(&self, kept: Vec<(&'static str, String)>, count: usize) {
        if count == 0 {
            return;
        }
        let mut l = self.late.lock().unwrap_or_else(|e| e.into_inner());
        l.1 += count;
        for k in kept {
            if l.0.len() < LATE_KEPT {
                l.0.push(k);
            }
        }
    }

    pub(crate) fn wrote_on_failure(&self, slot: &'static str, status: MemplugStatus) {
        if self.muted() {
            return;
        }
        self.written_on_failure.lock().unwrap_or_else(|e| e.into_inner()).push((slot, status));
    }
}

thread_local! {
    /// Set while this thread is inside a plugin call: the concurrency
    /// checks stall a thread only there (`checks/stalls.rs`, whose signal
    /// handler reads it; a const-initialised atomic, no lazy set-up).
    static IN_PLUGIN: AtomicBool = const { AtomicBool::new(false) };
}

/// Whether this thread is inside a plugin call (async-signal-safe).
pub(crate) fn in_plugin_call() -> bool {
    IN_PLUGIN.with(|f| f.load(Ordering::Relaxed))
}

/// Plugin calls that returned, in this process: a long storm tells the
/// kit it is alive only while this moves (`checks/concurrency.rs`).
static CALLS_DONE: AtomicUsize = AtomicUsize::new(0);

/// See [`CALLS_DONE`].
pub(crate) fn calls_done() -> usize {
    CALLS_DONE.load(Ordering::Relaxed)
}

/// Runs `f`, a call into the plugin, with this thread's flag set.
fn in_plugin<R>(f: impl FnOnce() -> R) -> R {
    IN_PLUGIN.with(|flag| flag.store(true, Ordering::Relaxed));
    let r = f();
    IN_PLUGIN.with(|flag| flag.store(false, Ordering::Relaxed));
    CALLS_DONE.fetch_add(1, Ordering::Relaxed);
    r
}

/// Runs one plugin call with a fresh recorder, logs it, and returns the
/// status with the messages written.
pub(crate) fn call(
    log: &Log,
    slot: &'static str,
    f: impl FnOnce(*const MemplugMessageSink) -> MemplugStatus,
) -> (MemplugStatus, Vec<Write>) {
    // Leaked: see `Recorder` (a few dozen bytes per call, in a check's
    // short-lived process).
    let rec: &'static Recorder = Box::leak(Box::new(Recorder::for_slot(slot)));
    // The sink struct is leaked with it, not a local: a plugin that keeps
    // the pointer and writes through it after the call reaches the
    // recorder (a late write, recorded), never a reused stack slot (which
    // crashed or hung the check, and made a run with many such checks
    // time out one by one).
    let sink: &'static MemplugMessageSink = Box::leak(Box::new(rec.sink()));
    let status = in_plugin(|| f(sink));
    rec.returned.store(true, Ordering::SeqCst);
    let writes = rec.take();
    log.record(slot, status, writes.clone());
    (status, writes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_into_a_sink_after_its_call_returned_is_recorded_as_late() {
        let log = Log::default();
        let mut kept = MemplugMessageSink { ctx: core::ptr::null_mut(), write: None };
        let (_, writes) = call(&log, "allocator.allocate", |sink| {
            // SAFETY: the sink the kit passed, valid for the call.
            kept = unsafe { *sink };
            MEMPLUG_STATUS_OK
        });
        assert!(writes.is_empty());
        let text = "too late";
        // SAFETY: the kit keeps the recorder alive: this is what a plugin
        // that kept the sink does.
        unsafe { kept.write.unwrap()(kept.ctx, text.as_ptr().cast(), text.len()) };
        let (late, count) = take_late_writes();
        assert_eq!(count, 1);
        assert_eq!(late, vec![("allocator.allocate", "too late".to_string())]);
    }
}
