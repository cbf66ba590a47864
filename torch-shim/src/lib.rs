//! `libmemplug_torch.so`: the two functions
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "memplug_torch_alloc",
//! "memplug_torch_free")` loads, over a process-wide memplug manager, and
//! `memplug_torch_stats_json` for the figures.
//!
//! * **Lazily started**: the first call reads the configuration (the
//!   environment, [`config::VARIABLES`]), loads the plugin (by default the
//!   CUDA VMM plugin beside this file) and starts the reaper; each device
//!   gets its context, pool (its budget) and binding at its first use.
//! * **Frees ordered behind torch's stream**: the `cudaStream_t` of a free
//!   is adopted by the mechanism (once per stream) and a fence recorded on
//!   it; the memory goes back (to the mechanism through the deferred-free
//!   queue, or to the cache for reuse by other streams) only after that
//!   fence. With the cache (`MEMPLUG_TORCH_CACHE=1`, the default) a block
//!   freed on a stream is reused at once by the next request on the same
//!   stream, as torch's own allocator does.
//! * **A refusal torch can catch**: torch uses the pointer its allocator
//!   returns unchecked, so a refused allocation throws a C++ exception
//!   (`cpp/refusal.cpp`) that torch turns into a Python `RuntimeError`;
//!   `memplug_torch_try_alloc` is the same call returning NULL instead.
//! * **No Rust panic unwinds or aborts into torch**: each export is one
//!   panic boundary; a free of a pointer this shim did not hand out
//!   is counted, logged and ignored, a free that cannot be ordered keeps
//!   the block rather than free it on a guess.

pub mod config;
mod device;
mod log;
mod shim;
mod table;

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Statuses of [`memplug_torch_stats_json`] (the numbers of
/// `memplug_host.h`'s `MEMPLUG_HOST_STATUS_*` for the same meanings).
pub const STATS_OK: c_int = 0;
/// `written` is NULL, or `buf` is NULL with a capacity.
pub const STATS_INVALID_ARGUMENT: c_int = 2;
/// The text does not fit: nothing written, `*written` = the capacity
/// needed (NUL included).
pub const STATS_BUFFER_TOO_SMALL: c_int = 268;
/// The statistics could not be gathered (a panic, reported on stderr).
pub const STATS_INTERNAL: c_int = 10;

/// Allocates `size` bytes on CUDA device `device` for work on `stream`
/// (torch's `cudaStream_t`), the function torch's
/// `CUDAPluggableAllocator` calls. A refusal of a size above zero (over
/// budget, a device the plugin does not serve, a shim that did not start)
/// **throws a C++ exception** (`memplug_torch::AllocationRefused`, a
/// `std::runtime_error` saying why): torch uses the pointer its allocator
/// returns without checking it, and turns only an exception into a Python
/// error (a `RuntimeError`). Size 0 is NULL. Callers that are not C++ use
/// [`memplug_torch_try_alloc`].
///
/// # Safety
/// `stream` is a live CUDA stream of `device`, or NULL (the legacy default
/// stream), as torch passes it. The caller is C++ code that can take an
/// exception (torch is); nothing else may call it.
#[no_mangle]
pub unsafe extern "C-unwind" fn memplug_torch_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    match alloc(size, device, stream) {
        Ok(p) => p,
        Err(_) if size == 0 => std::ptr::null_mut(),
        Err(why) => {
            let text = format!("memplug: CUDA allocation of {size} bytes on cuda:{device} refused: {why}");
            // Everything this frame owned is gone but `text`, dropped by the
            // unwind; the exception goes on into torch.
            // SAFETY: a C++ function that only throws; `text` outlives the
            // call (it copies the bytes into the exception first).
            unsafe { memplug_torch_throw_refusal(text.as_ptr().cast(), text.len()) }
        }
    }
}

/// [`memplug_torch_alloc`] without the exception: NULL when refused (the
/// reason is in the log and `failed_allocs` counts it). For C callers and
/// tests; torch needs the exception.
///
/// # Safety
/// As [`memplug_torch_alloc`], but any caller may call it.
#[no_mangle]
pub unsafe extern "C" fn memplug_torch_try_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    alloc(size, device, stream).unwrap_or(std::ptr::null_mut())
}

/// One panic boundary for both allocation exports.
fn alloc(size: isize, device: c_int, stream: *mut c_void) -> Result<*mut c_void, String> {
    let r = catch_unwind(AssertUnwindSafe(|| match shim::get() {
        Ok(s) => s.alloc(size, device, stream as usize),
        Err(e) => Err(format!("the shim did not start: {e}")),
    }));
    match r {
        Ok(Ok(addr)) => Ok(addr as usize as *mut c_void),
        Ok(Err(why)) => Err(why),
        Err(_) => {
            log::warn(format_args!("alloc({size}, device {device}) panicked; refused"));
            Err("the shim panicked (see its log)".into())
        }
    }
}

extern "C-unwind" {
    /// `cpp/refusal.cpp`: throws `memplug_torch::AllocationRefused` with
    /// the `len` bytes at `why` as its text.
    fn memplug_torch_throw_refusal(why: *const c_char, len: usize) -> !;
}

/// Frees `ptr` (from [`memplug_torch_alloc`]) after the work queued on
/// `stream` so far. NULL does nothing; a pointer not handed out by this
/// shim (or freed already) is counted and ignored.
///
/// # Safety
/// `stream` is a live CUDA stream of `device`, or NULL, as torch passes it.
#[no_mangle]
pub unsafe extern "C" fn memplug_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    if ptr.is_null() {
        return;
    }
    let r = catch_unwind(AssertUnwindSafe(|| match shim::get() {
        Ok(s) => s.free(ptr as usize as u64, size, device, stream as usize),
        Err(_) => log::warn(format_args!("free({ptr:p}): the shim did not start; ignored")),
    }));
    if r.is_err() {
        log::warn(format_args!("free({ptr:p}, {size}, device {device}) panicked; the block is not freed"));
    }
}

/// Adds `stream` (a `cudaStream_t` of CUDA device `device`, or NULL for
/// the legacy default stream) to the streams a freed block waits for under
/// `MEMPLUG_TORCH_REUSE=all-streams` (the default): call it, through
/// `ctypes`, for a side stream that reads tensors but never allocates or
/// frees through torch, as `record_stream` would tell torch's own
/// allocator (README, "PyTorch"). Streams torch allocates or frees on are
/// seen without it. Returns 0, or -1 when refused (the reason in the log).
/// Starts the shim.
///
/// # Safety
/// `stream` is a live CUDA stream of `device` that outlives the process's
/// use of the shim (torch's streams do), or NULL.
#[no_mangle]
pub unsafe extern "C" fn memplug_torch_note_stream(device: c_int, stream: *mut c_void) -> c_int {
    let r = catch_unwind(AssertUnwindSafe(|| match shim::get() {
        Ok(s) => s.note_stream(device, stream as usize),
        Err(e) => Err(format!("the shim did not start: {e}")),
    }));
    match r {
        Ok(Ok(())) => 0,
        Ok(Err(why)) => {
            log::warn(format_args!("note_stream(device {device}, {stream:p}) refused: {why}"));
            -1
        }
        Err(_) => {
            log::warn(format_args!("note_stream(device {device}) panicked; refused"));
            -1
        }
    }
}

/// Gives every device's idle cached blocks back to the driver (behind the
/// fences of their last use), as `torch.cuda.empty_cache()` does for
/// torch's own allocator — which it does not do for a pluggable one: call
/// this through `ctypes` (README, "PyTorch"). Returns the bytes given back
/// (0 before the first allocation, or without the cache). Does not start
/// the shim.
#[no_mangle]
pub extern "C" fn memplug_torch_empty_cache() -> u64 {
    catch_unwind(|| match shim::started() {
        Some(Ok(s)) => s.empty_cache(),
        _ => 0,
    })
    .unwrap_or_else(|_| {
        log::warn(format_args!("empty_cache panicked"));
        0
    })
}

/// The figures as one line of JSON: `{"schema_version":1, "shim": {...},
/// "host": <the host's statistics report, or null before the first
/// call>}` (README, "PyTorch"). Buffer protocol of `memplug_host.h`: on
/// success the text and a NUL, `*written` = the text's length; a buffer too
/// small (or `buf = NULL, cap = 0`) gets nothing, `*written` = the capacity
/// needed. Does not start the shim.
///
/// # Safety
/// `buf` has room for `cap` bytes (or is NULL with `cap = 0`); `written`
/// is writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_torch_stats_json(
    buf: *mut c_char,
    cap: usize,
    written: *mut usize,
) -> c_int {
    if written.is_null() || (buf.is_null() && cap != 0) {
        return STATS_INVALID_ARGUMENT;
    }
    let Ok(text) = catch_unwind(stats_text) else {
        log::warn(format_args!("gathering statistics panicked"));
        return STATS_INTERNAL;
    };
    let needed = text.len() + 1;
    if buf.is_null() || cap < needed {
        // SAFETY: checked non-NULL above; the caller's out-parameter.
        unsafe { *written = needed };
        return STATS_BUFFER_TOO_SMALL;
    }
    // SAFETY: `buf` has `cap >= needed` bytes; the text is ours.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
        *written = text.len();
    }
    STATS_OK
}

fn stats_text() -> String {
    let (shim, host) = match shim::started() {
        None => (serde_json::json!({ "started": false, "error": null }), serde_json::Value::Null),
        Some(Err(e)) => (serde_json::json!({ "started": false, "error": e }), serde_json::Value::Null),
        Some(Ok(s)) => {
            let host = memplug_host::observe::to_json(&s.host_stats());
            (s.stats_json(), serde_json::from_str(&host).expect("the host's report is JSON"))
        }
    };
    serde_json::json!({ "schema_version": 1, "shim": shim, "host": host }).to_string()
}
