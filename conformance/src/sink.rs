//! The kit's message sink: records every write a plugin makes during one
//! call (how long, from which thread, whether it is UTF-8), and a log of
//! every call that failed or wrote, which the `messages.*` and `structs.*`
//! checks judge at the end of the run.

use core::ffi::{c_char, c_void};
use memplug_sdk::abi::{MemplugMessageSink, MemplugStatus, MEMPLUG_MESSAGE_MAX, MEMPLUG_STATUS_OK};
use std::panic::{catch_unwind, AssertUnwindSafe};
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

/// Collects the writes of one call. Lives on the caller's stack for the
/// call; thread-safe because a misbehaving plugin may write from elsewhere.
pub(crate) struct Recorder {
    caller: ThreadId,
    writes: Mutex<Vec<Write>>,
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Recorder { caller: std::thread::current().id(), writes: Mutex::new(Vec::new()) }
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
#[derive(Default)]
pub(crate) struct Log {
    calls: Mutex<Vec<Logged>>,
    /// `(slot, detail)`: an output written past its `struct_size`.
    pub(crate) overruns: Mutex<Vec<(&'static str, String)>>,
    /// `(slot, status)`: an output changed by a call that failed.
    pub(crate) written_on_failure: Mutex<Vec<(&'static str, MemplugStatus)>>,
}

impl Log {
    pub(crate) fn record(&self, slot: &'static str, status: MemplugStatus, writes: Vec<Write>) {
        if status != MEMPLUG_STATUS_OK || !writes.is_empty() {
            self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(Logged { slot, status, writes });
        }
    }

    pub(crate) fn calls(&self) -> Vec<Logged> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn overrun(&self, slot: &'static str, detail: String) {
        self.overruns.lock().unwrap_or_else(|e| e.into_inner()).push((slot, detail));
    }

    pub(crate) fn wrote_on_failure(&self, slot: &'static str, status: MemplugStatus) {
        self.written_on_failure.lock().unwrap_or_else(|e| e.into_inner()).push((slot, status));
    }
}

/// Runs one plugin call with a fresh recorder, logs it, and returns the
/// status with the messages written.
pub(crate) fn call(
    log: &Log,
    slot: &'static str,
    f: impl FnOnce(*const MemplugMessageSink) -> MemplugStatus,
) -> (MemplugStatus, Vec<Write>) {
    let rec = Recorder::new();
    let sink = rec.sink();
    let status = f(&sink);
    let writes = rec.take();
    log.record(slot, status, writes.clone());
    (status, writes)
}
