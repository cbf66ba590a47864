//! Copies with pageable host memory, without waiting.
//!
//! CUDA's "API synchronization behavior": `cuMemcpyAsync` from pageable
//! host memory first waits for the stream's earlier work, and to pageable
//! memory returns only once the copy is done. The ABI's copy slot returns
//! without waiting, so the plugin never hands pageable memory to the
//! driver: the host side of such a copy is a `memcpy` run by a host
//! function (`cuLaunchHostFunc`) in the stream's order, and the device side
//! a `cuMemcpyAsync` to or from a page-locked **staging chunk**:
//!
//! * host → device, per piece: a host function copies the piece into a
//!   chunk, then `cuMemcpyAsync(device, chunk)`;
//! * device → host, per piece: `cuMemcpyAsync(chunk, device)`, then a host
//!   function copies the chunk out;
//! * host ↔ host with a pageable side: one host function copies.
//!
//! A copy uses at most [`RING`] chunks whatever its length, in turn: the
//! stream runs its pieces in order, so piece `k + RING` cannot touch a
//! chunk before piece `k` is done with it. A last host function gives the
//! chunks back to the context's pool ([`StagingPool`]), which keeps every
//! chunk it made until the plugin is unloaded (`cuMemFreeHost` would
//! synchronise the device) and makes a new one (`cuMemHostAlloc`, which
//! does not) only when none is idle: chunks in use at once bound its size.
//!
//! Host functions run on the driver's thread, one at a time for every
//! stream of the process: a large pageable copy holds up other streams'
//! host functions for its `memcpy`s. Page-locked memory (the `cuda<N>-host`
//! mechanism's) avoids it and goes to the driver directly.

use crate::driver::{CUdeviceptr, CUstream, Driver, HostAlloc, CUDA_SUCCESS};
use memplug_sdk::{PluginError, PluginResult};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes per staging chunk.
pub const CHUNK: u64 = 2 << 20;
/// Chunks one copy uses at most.
pub const RING: usize = 4;

/// A context's idle staging chunks (page-locked, [`CHUNK`] bytes each).
#[derive(Default)]
pub(crate) struct StagingPool {
    idle: Mutex<Vec<CUdeviceptr>>,
}

impl StagingPool {
    /// `n` chunks: idle ones first, new ones for the rest. The context
    /// must be current. On failure the chunks taken go back.
    fn take(&self, d: &Driver, api: HostAlloc, n: usize) -> PluginResult<Vec<CUdeviceptr>> {
        let mut got: Vec<CUdeviceptr> = {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            let keep = idle.len().saturating_sub(n);
            idle.split_off(keep)
        };
        while got.len() < n {
            let made = {
                let _relaxed = crate::capture::Relaxed::new(d);
                crate::pinned::alloc(d, api, CHUNK as usize)
            };
            match made {
                Ok(p) => got.push(p),
                Err(e) => {
                    self.give(got);
                    return Err(e);
                }
            }
        }
        Ok(got)
    }

    /// Puts chunks back (also from a host function: no driver call).
    fn give(&self, chunks: Vec<CUdeviceptr>) {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).extend(chunks);
    }

    /// Every idle chunk, to be freed (at unload: every copy has run).
    pub(crate) fn drain(&self) -> Vec<CUdeviceptr> {
        std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Which side of a staged copy is pageable host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Staged {
    /// The source: host → device.
    Source,
    /// The destination: device → host.
    Destination,
    /// Both sides are host memory (one or both pageable): one `memcpy`.
    HostToHost,
}

/// One host function's work.
type Job = Box<dyn FnOnce() + Send>;

/// The trampoline the driver calls: runs the job once, frees it, and never
/// lets a panic unwind into the driver.
unsafe extern "C" fn run_job(data: *mut c_void) {
    // SAFETY: the box leaked by `launch`, run exactly once.
    let job = unsafe { Box::from_raw(data.cast::<Job>()) };
    let _ = catch_unwind(AssertUnwindSafe(job));
}

/// Enqueues `job` on `stream` as a host function.
fn launch(d: &Driver, stream: CUstream, job: Job) -> PluginResult<()> {
    let data = Box::into_raw(Box::new(job));
    // SAFETY: a live stream; on success the driver calls the trampoline
    // once, which frees the box.
    let r = unsafe { (d.api.launch_host_func)(stream, Some(run_job), data.cast()) };
    if r != CUDA_SUCCESS {
        // SAFETY: refused, so never run: the box is still ours.
        drop(unsafe { Box::from_raw(data) });
        return Err(d.error(r, "cuLaunchHostFunc"));
    }
    Ok(())
}

/// `memcpy` of `len` bytes as a host function's job. The caller of the
/// copy slot vouches for its host ranges until the copy completes (the
/// ABI's `MEMPLUG_COPY_HOST`); device sides are staging chunks.
fn host_copy(dst: u64, src: u64, len: u64) -> Job {
    Box::new(move || {
        // SAFETY: see above; the ranges do not overlap (the SDK checked).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len as usize) }
    })
}

/// Enqueues a copy of `len` bytes from `src` to `dst` on `stream`, with
/// the `side` that is pageable host memory handled by host functions (see
/// the module docs). The stream's context must be current.
///
/// A driver failure after part of the copy was enqueued is returned; the
/// chunks the enqueued part uses are then not given back to the pool
/// (a host function may still write into them), only the others.
#[allow(clippy::too_many_arguments)]
pub(crate) fn staged_copy(
    d: &Driver,
    api: Option<HostAlloc>,
    pool: &Arc<StagingPool>,
    stream: CUstream,
    dst: u64,
    src: u64,
    len: u64,
    side: Staged,
) -> PluginResult<()> {
    if side == Staged::HostToHost {
        return launch(d, stream, host_copy(dst, src, len));
    }
    let api = api.ok_or_else(|| {
        PluginError::unsupported(
            "copy: a range is pageable host memory, which the driver copies only by waiting, and this \
             driver has no cuMemHostAlloc to stage it through page-locked memory; use page-locked memory \
             (the cuda<N>-host mechanism's)",
        )
    })?;
    let pieces = len.div_ceil(CHUNK);
    let ring = pool.take(d, api, (pieces as usize).min(RING))?;
    let mut off = 0;
    let mut piece = 0usize;
    while off < len {
        let n = (len - off).min(CHUNK);
        let chunk = ring[piece % ring.len()];
        let enqueued = match side {
            Staged::Source => launch(d, stream, host_copy(chunk, src + off, n)).and_then(|()| {
                // SAFETY: a page-locked chunk and device memory the caller
                // vouched for (judged by copy.rs).
                d.check(
                    unsafe { (d.api.memcpy_async)(dst + off, chunk, n as usize, stream) },
                    "cuMemcpyAsync",
                )
            }),
            _ => d
                .check(
                    // SAFETY: as above, the other way.
                    unsafe { (d.api.memcpy_async)(chunk, src + off, n as usize, stream) },
                    "cuMemcpyAsync",
                )
                .and_then(|()| launch(d, stream, host_copy(dst + off, chunk, n))),
        };
        if let Err(e) = enqueued {
            // Chunks no piece used yet are free to go back.
            pool.give(ring.iter().skip(piece + 1).copied().collect());
            return Err(e);
        }
        off += n;
        piece += 1;
    }
    let back = Arc::clone(pool);
    let give: Job = Box::new(move || back.give(ring));
    // Not given back if this fails: a piece's host function may still use
    // them (see above).
    launch(d, stream, give)
}
