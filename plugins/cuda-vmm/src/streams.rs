//! The sync capability: streams are CUDA streams (made non-blocking by
//! `stream_create`, or a runtime's own `CUstream` wrapped by `stream_adopt`
//! without taking ownership); host functions go through `cuLaunchHostFunc`;
//! a fence is an event recorded on the stream (`cuEventRecord`), queried
//! with `cuEventQuery`, waited for by polling it.
//!
//! Stream and fence handles carry a serial number in their upper 32 bits
//! beside the table key in the lower 32, as in the CPU plugin: the ABI names
//! them by a bare `uint64_t`.
//!
//! Work is submitted to a stream under the table's lock, and
//! `stream_destroy` marks the stream closing under the same lock before it
//! waits, so nothing is ever submitted to a stream being destroyed.

use crate::context::Pin;
use crate::driver::{
    CUcontext, CUevent, CUstream, Entered, CUDA_ERROR_NOT_READY, CUDA_SUCCESS, EVENT_DISABLE_TIMING,
};
use crate::mechanism::CudaMechanism;
use memplug_sdk::{FenceState, HostFn, PluginError, PluginResult, Status, StreamSync};
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// One stream.
pub struct StreamEntry {
    serial: u32,
    raw: CUstream,
    /// The stream's context: the primary context, or for an adopted stream
    /// whatever context it was created in.
    ctx: CUcontext,
    /// Made by `stream_create` (destroyed with it) rather than adopted.
    owned: bool,
    /// Set while `stream_destroy` waits for the stream.
    closing: bool,
    /// Declared last: the context is released after the rest is gone.
    pin: Pin,
}

/// One fence.
pub struct FenceEntry {
    serial: u32,
    event: CUevent,
    ctx: CUcontext,
    /// Declared last: keeps the context while the event lives.
    _pin: Pin,
}

// SAFETY: driver handles, usable from any thread.
unsafe impl Send for StreamEntry {}
unsafe impl Send for FenceEntry {}

/// `CU_STREAM_LEGACY`.
const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`.
const STREAM_PER_THREAD: usize = 0x2;
const KEY_BITS: u64 = 0xffff_ffff;

thread_local! {
    /// Set while a host function runs on this (driver) thread.
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

/// The trampoline the driver calls: runs the host's function once, frees
/// its box, and never lets a panic unwind into the driver.
unsafe extern "C" fn run_host_fn(userdata: *mut c_void) {
    // SAFETY: the box leaked by `enqueue_host_fn`, run exactly once.
    let f = unsafe { Box::from_raw(userdata.cast::<HostFn>()) };
    IN_HOST_FN.with(|c| c.set(true));
    let _ = catch_unwind(AssertUnwindSafe(|| f.call()));
    IN_HOST_FN.with(|c| c.set(false));
}

/// Whether this thread is running a host function this plugin launched.
pub(crate) fn in_host_fn() -> bool {
    IN_HOST_FN.with(Cell::get)
}

fn split(handle: u64) -> (u64, u32) {
    (handle & KEY_BITS, (handle >> 32) as u32)
}

#[cold]
fn unknown(what: &str, handle: u64) -> PluginError {
    PluginError::unknown_allocation(format!(
        "{what} handle {handle:#x} does not name a live {what}: never made, already destroyed, or forged"
    ))
}

#[cold]
fn closing(call: &str) -> PluginError {
    PluginError::new(Status::Busy, format!("{call}: the stream is being destroyed"))
}

impl CudaMechanism {
    fn compose(&self, key: u64, serial: u32) -> Option<u64> {
        (key <= KEY_BITS).then_some(u64::from(serial) << 32 | key)
    }

    fn insert_stream(&self, entry: StreamEntry) -> PluginResult<u64> {
        let serial = entry.serial;
        let key = self.streams.insert(entry);
        self.compose(key, serial).ok_or_else(|| {
            let gone = self.streams.remove(key, |_| true);
            if let Some(s) = &gone {
                if s.owned {
                    // SAFETY: the stream just made, unused.
                    let _ = Entered::new(self.driver, s.ctx)
                        .map(|_e| unsafe { (self.driver.api.stream_destroy)(s.raw) });
                }
            }
            PluginError::out_of_memory("stream_create: too many live streams")
        })
    }

    /// Runs `f` on an open stream, under the table lock.
    fn with_open_stream<R>(
        &self,
        stream: u64,
        call: &str,
        f: impl FnOnce(&mut StreamEntry) -> PluginResult<R>,
    ) -> PluginResult<R> {
        let (key, serial) = split(stream);
        self.streams
            .with(key, |s| s.serial == serial, |s| if s.closing { Err(closing(call)) } else { f(s) })
            .ok_or_else(|| unknown("stream", stream))?
    }

    fn query(&self, fence: u64) -> PluginResult<FenceState> {
        let (key, serial) = split(fence);
        let d = self.driver;
        self.fences
            .with(
                key,
                |f| f.serial == serial,
                // Under the lock: a concurrent destroy cannot free the event
                // in between.
                // SAFETY: a live event of this mechanism.
                |f| match unsafe { (d.api.event_query)(f.event) } {
                    CUDA_SUCCESS => Ok(FenceState::Complete),
                    CUDA_ERROR_NOT_READY => Ok(FenceState::Pending),
                    r => Err(d.error(r, "cuEventQuery")),
                },
            )
            .ok_or_else(|| unknown("fence", fence))?
    }
}

impl StreamSync for CudaMechanism {
    const CAN_ADOPT: bool = true;

    fn stream_create(&self) -> PluginResult<u64> {
        let _slot = self.slot("stream_create")?;
        let d = self.driver;
        let pin = self.ctx.pin()?;
        let raw = {
            let _e = pin.enter()?;
            let mut raw: CUstream = std::ptr::null_mut();
            // SAFETY: resolved entry point, out-pointer to a local.
            let r = unsafe { (d.api.stream_create)(&mut raw, crate::driver::STREAM_NON_BLOCKING) };
            d.check(r, "cuStreamCreate")?;
            raw
        };
        self.insert_stream(StreamEntry {
            serial: self.serial(),
            raw,
            ctx: pin.ctx(),
            owned: true,
            closing: false,
            pin,
        })
    }

    fn stream_adopt(&self, native: *mut c_void) -> PluginResult<u64> {
        let _slot = self.slot("stream_adopt")?;
        if native as usize == STREAM_PER_THREAD {
            return Err(PluginError::invalid_argument(
                "stream_adopt: CU_STREAM_PER_THREAD names a different stream on every thread; adopt a real \
                 stream or the legacy default stream",
            ));
        }
        let d = self.driver;
        let pin = self.ctx.pin()?;
        let (raw, ctx) = if native.is_null() || native as usize == STREAM_LEGACY {
            // The legacy default stream of this device's primary context.
            (native.cast(), pin.ctx())
        } else {
            let raw: CUstream = native.cast();
            let mut ctx: CUcontext = std::ptr::null_mut();
            // SAFETY: the runtime vouches that `native` is a CUstream.
            let r = unsafe { (d.api.stream_get_ctx)(raw, &mut ctx) };
            if r != CUDA_SUCCESS {
                return Err(PluginError::invalid_argument(format!(
                    "stream_adopt: {native:p} is not a stream the driver knows: cuStreamGetCtx failed: {} ({r})",
                    d.error_name(r)
                )));
            }
            let _e = Entered::new(d, ctx)?;
            let mut device = 0;
            // SAFETY: out-pointer to a local; the stream's context current.
            d.check(unsafe { (d.api.ctx_get_device)(&mut device) }, "cuCtxGetDevice")?;
            if device != self.driver.devices[self.device.ordinal as usize].device {
                return Err(PluginError::new(
                    Status::WrongDevice,
                    format!(
                        "stream_adopt: the stream belongs to CUDA device {device}; mechanism \"{}\" serves device {}",
                        self.name, self.device.ordinal
                    ),
                ));
            }
            (raw, ctx)
        };
        self.insert_stream(StreamEntry { serial: self.serial(), raw, ctx, owned: false, closing: false, pin })
    }

    fn stream_destroy(&self, stream: u64) -> PluginResult<()> {
        let _slot = self.slot("stream_destroy")?;
        let (raw, ctx, owned) = self.with_open_stream(stream, "stream_destroy", |s| {
            s.closing = true;
            Ok((s.raw, s.ctx, s.owned))
        })?;
        let d = self.driver;
        // Wait for the work already submitted (host functions of this
        // library included: none may run after the stream is gone).
        let done = Entered::new(d, ctx).and_then(|_e| {
            // SAFETY: a live stream; nothing new is submitted while closing.
            d.check(unsafe { (d.api.stream_synchronize)(raw) }, "cuStreamSynchronize")?;
            if owned {
                // SAFETY: the plugin's own stream, idle.
                d.check(unsafe { (d.api.stream_destroy)(raw) }, "cuStreamDestroy")?;
            }
            Ok(())
        });
        let (key, serial) = split(stream);
        match done {
            Ok(()) => {
                let gone = self.streams.remove(key, |s| s.serial == serial);
                drop(gone);
                Ok(())
            }
            Err(e) => {
                self.streams.with(key, |s| s.serial == serial, |s| s.closing = false);
                Err(e)
            }
        }
    }

    fn enqueue_host_fn(&self, stream: u64, f: HostFn) -> PluginResult<()> {
        let _slot = self.slot("enqueue_host_fn")?;
        let d = self.driver;
        self.with_open_stream(stream, "enqueue_host_fn", |s| {
            let _e = Entered::new(d, s.ctx)?;
            let task = Box::into_raw(Box::new(f));
            // SAFETY: a live stream; on success the driver calls the
            // trampoline once, which frees the box.
            let r = unsafe { (d.api.launch_host_func)(s.raw, Some(run_host_fn), task.cast()) };
            if r != CUDA_SUCCESS {
                // SAFETY: refused, so never run: the box is still ours.
                drop(unsafe { Box::from_raw(task) });
                return Err(d.error(r, "cuLaunchHostFunc"));
            }
            Ok(())
        })
    }

    fn fence_record(&self, stream: u64) -> PluginResult<u64> {
        let _slot = self.slot("fence_record")?;
        let d = self.driver;
        let (event, ctx, pin) = self.with_open_stream(stream, "fence_record", |s| {
            let _e = Entered::new(d, s.ctx)?;
            let mut event: CUevent = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; the stream's context current.
            d.check(unsafe { (d.api.event_create)(&mut event, EVENT_DISABLE_TIMING) }, "cuEventCreate")?;
            // SAFETY: a live event and stream of the same context.
            let r = unsafe { (d.api.event_record)(event, s.raw) };
            if r != CUDA_SUCCESS {
                // SAFETY: the event just made, unused.
                unsafe { (d.api.event_destroy)(event) };
                return Err(d.error(r, "cuEventRecord"));
            }
            Ok((event, s.ctx, s.pin.another()))
        })?;
        let serial = self.serial();
        let key = self.fences.insert(FenceEntry { serial, event, ctx, _pin: pin });
        self.compose(key, serial).ok_or_else(|| {
            if let Some(f) = self.fences.remove(key, |_| true) {
                // SAFETY: the event just made.
                unsafe { (d.api.event_destroy)(f.event) };
            }
            PluginError::out_of_memory("fence_record: too many live fences")
        })
    }

    fn fence_query(&self, fence: u64) -> PluginResult<FenceState> {
        let _slot = self.slot("fence_query")?;
        self.query(fence)
    }

    fn fence_wait(&self, fence: u64, timeout: Duration) -> PluginResult<FenceState> {
        let _slot = self.slot("fence_wait")?;
        // Polls cuEventQuery: cuEventSynchronize cannot time out, and how it
        // waits (spin, yield, block) depends on flags the runtime set on the
        // context. Sleeps grow from 1 µs to 200 µs between polls.
        let deadline = Instant::now().checked_add(timeout);
        let mut pause = Duration::from_micros(1);
        loop {
            if self.query(fence)? == FenceState::Complete {
                return Ok(FenceState::Complete);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(FenceState::Pending);
            }
            let sleep = deadline.map_or(pause, |d| pause.min(d - now));
            std::thread::sleep(sleep);
            pause = (pause * 2).min(Duration::from_micros(200));
        }
    }

    fn fence_destroy(&self, fence: u64) -> PluginResult<()> {
        let _slot = self.slot("fence_destroy")?;
        let (key, serial) = split(fence);
        let d = self.driver;
        let (gone, r) = self
            .fences
            .update(
                key,
                |f| f.serial == serial,
                |f| {
                    let r = Entered::new(d, f.ctx).and_then(|_e| {
                        // SAFETY: a live event of this mechanism, removed
                        // from the table only if this succeeds.
                        d.check(unsafe { (d.api.event_destroy)(f.event) }, "cuEventDestroy")
                    });
                    (r.is_ok(), r)
                },
            )
            .ok_or_else(|| unknown("fence", fence))?;
        drop(gone);
        r
    }
}
