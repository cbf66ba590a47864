//! CUDA graph capture: what the plugin does when a stream it is handed is
//! capturing (`cuStreamBeginCapture`), and how its own allocation calls
//! keep out of another thread's capture.
//!
//! **Work on a capturing stream is refused** (`INVALID_STATE`, saying why),
//! before anything is enqueued: a fence, a host function, a wait for a
//! fence or a copy (the plugin offers no queued binding). Work submitted
//! there is not run
//! but recorded into a graph that runs once per launch, while the ABI
//! promises each of them runs exactly once, in the stream's order, and a
//! fence's event recorded during capture may not even be queried
//! (`CUDA_ERROR_CAPTURED_EVENT`): the host's deferred-free queue would wait
//! on it for ever. PyTorch's answer, private memory pools kept alive for
//! the graph's life, belongs to the runtime that owns the graph (it knows
//! when the graph goes); memplug's runtime records fences after the
//! capture ends instead. Plain allocation needs no stream and is allowed.
//!
//! **Capture modes.** In the default (global) mode, a
//! "potentially unsafe" call such as `cuMemAlloc` or `cuMemFree` made by
//! any thread while another thread captures is refused and invalidates
//! that capture. PyTorch's caching allocator switches the calling thread to
//! the relaxed mode around `cudaMalloc` for this reason; the plugin does the
//! same around its allocation and free calls ([`Relaxed`]), so an
//! allocation from a data-loader thread cannot break a training thread's
//! capture.

use crate::driver::{CUstream, Driver, CUDA_SUCCESS};
use memplug_sdk::{PluginError, PluginResult, Status};
use std::ffi::c_int;

/// `CU_STREAM_CAPTURE_STATUS_NONE`.
const CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;

/// Refuses work on `stream` when it is capturing a graph (or its capture
/// was invalidated); `call` names the slot. The stream's context must be
/// current.
pub(crate) fn refuse_if_capturing(d: &Driver, stream: CUstream, call: &str) -> PluginResult<()> {
    let mut status: c_int = CAPTURE_STATUS_NONE;
    // SAFETY: a live stream (the caller holds it), out-pointer to a local.
    let r = unsafe { (d.api.stream_is_capturing)(stream, &mut status) };
    if r == CUDA_SUCCESS && status == CAPTURE_STATUS_NONE {
        return Ok(());
    }
    if r != CUDA_SUCCESS && crate::driver::is_sticky(r) {
        return Err(d.error(r, "cuStreamIsCapturing"));
    }
    let why = if r == CUDA_SUCCESS {
        format!("capture status {status}")
    } else {
        format!("cuStreamIsCapturing: {} ({r})", d.error_name(r))
    };
    Err(PluginError::new(
        Status::InvalidState,
        format!(
            "{call}: the stream is capturing a CUDA graph ({why}): work enqueued there would run once per \
             graph launch, not once, and a fence recorded there cannot be waited for; enqueue it before \
             cuStreamBeginCapture or after cuStreamEndCapture"
        ),
    ))
}

/// The calling thread in the relaxed capture mode while this lives (the
/// previous mode is put back when it goes): see the module docs.
pub(crate) struct Relaxed<'a> {
    driver: &'a Driver,
    previous: Option<c_int>,
}

impl<'a> Relaxed<'a> {
    /// Switches this thread to the relaxed capture mode. A driver that
    /// refuses leaves the mode as it was (the call then meets whatever
    /// the capture rules say).
    pub(crate) fn new(driver: &'a Driver) -> Self {
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: resolved entry point, in/out pointer to a local.
        let r = unsafe { (driver.api.thread_exchange_capture_mode)(&mut mode) };
        Relaxed { driver, previous: (r == CUDA_SUCCESS).then_some(mode) }
    }
}

impl Drop for Relaxed<'_> {
    fn drop(&mut self) {
        if let Some(mut mode) = self.previous {
            // SAFETY: as in `new`; puts back the mode it swapped out.
            unsafe { (self.driver.api.thread_exchange_capture_mode)(&mut mode) };
        }
    }
}
