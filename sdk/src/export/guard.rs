//! The panic boundary every slot body runs behind, and the host's message
//! sink.

use crate::abi::{self, MemplugMessageSink, MemplugStatus};
use crate::author::{PluginError, PluginResult};
use crate::status::Status;
use core::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Writes `msg` into the host's sink, if there is one.
///
/// # Safety
/// `sink` is NULL or points to a valid sink for the duration of the call.
pub unsafe fn write_message(sink: *const MemplugMessageSink, msg: &str) {
    if let Some(s) = sink.as_ref() {
        if let Some(w) = s.write {
            w(s.ctx, msg.as_ptr().cast::<c_char>(), msg.len());
        }
    }
}

pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "non-string panic payload"
    }
}

/// Runs a slot body: `Ok` → `MEMPLUG_STATUS_OK`, `Err` → its code plus a
/// message, panic → `MEMPLUG_STATUS_INTERNAL` plus the panic message.
///
/// The body's result is turned into a status inside the panic boundary, so
/// the success path hands back one register instead of moving a 32-byte
/// `Result` through memory; both failure paths are out of line.
///
/// # Safety
/// `sink` as for [`write_message`].
#[inline(always)]
pub unsafe fn guard(
    sink: *const MemplugMessageSink,
    slot: &'static str,
    body: impl FnOnce() -> PluginResult<()>,
) -> MemplugStatus {
    let run = || match body() {
        Ok(()) => abi::MEMPLUG_STATUS_OK,
        Err(e) => report_error(sink, e),
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(status) => status,
        Err(payload) => report_panic(sink, slot, payload),
    }
}

/// The `Err` path of [`guard`]: the message to the sink, the code back.
#[cold]
#[inline(never)]
unsafe fn report_error(sink: *const MemplugMessageSink, e: PluginError) -> MemplugStatus {
    if !e.message.is_empty() {
        write_message(sink, &e.message);
    }
    e.status.raw()
}

/// The panic path of [`guard`].
#[cold]
#[inline(never)]
unsafe fn report_panic(
    sink: *const MemplugMessageSink,
    slot: &'static str,
    payload: Box<dyn std::any::Any + Send>,
) -> MemplugStatus {
    // Formatting can itself panic in theory; keep it inside a boundary.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let msg = format!("plugin panicked in `{slot}`: {}", panic_text(&*payload));
        write_message(sink, &msg);
    }));
    Status::Internal.raw()
}
