//! Primary contexts: each device's primary context is retained
//! (`cuDevicePrimaryCtxRetain`) on the plugin's first use of the device and
//! released only when the mechanism is freed, at the plugin's unload. A
//! primary context costs ~0.1–0.5 s and device memory to create, so
//! retaining it per object (or per `memory_info` call when nothing is
//! alive) would create and destroy one over and over; a runtime (vLLM,
//! PyTorch) keeps it retained for the life of the process too. Every live
//! object still holds a [`Pin`], the handle through which it reaches the
//! context.
//!
//! Each device also has a plugin-owned, non-blocking stream of the
//! context's **greatest priority** (`cuCtxGetStreamPriorityRange`,
//! `cuStreamCreateWithPriority`), made once at the first zero-fill and used
//! only to zero-fill memory the plugin commits or creates (the ABI promises
//! zeros): zeroing never waits behind a runtime's work on other streams
//! (non-blocking: no implicit wait for the legacy default stream), and on a
//! busy GPU its blocks are scheduled before those of default-priority
//! streams. It lives as long as the context's retention.
//!
//! Each context also keeps a bounded **pool of events** ([`EVENT_POOL_MAX`])
//! for fences: a fence takes one (`cuEventCreate` only when the pool is
//! empty) and gives it back when it is destroyed, as PyTorch pools its
//! events. Events are blocking-sync (`CU_EVENT_BLOCKING_SYNC`, so
//! `cuEventSynchronize` sleeps instead of spinning) without timing.
//!
//! No lock here is held across a driver call, but the first pin's
//! `cuDevicePrimaryCtxRetain` (once per context).
//!
//! A context that met a sticky error is *dead* ([`DeviceContext::mark_dead`]):
//! every later slot fails without calling the driver, and the loss is
//! reported to the hosts once (see `loss.rs`).

use crate::driver::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUstream, Driver, Entered, CUDA_ERROR_NOT_READY, CUDA_SUCCESS,
    EVENT_BLOCKING_SYNC, EVENT_DISABLE_TIMING, STREAM_NON_BLOCKING,
};
use crate::loss::LossLine;
use memplug_sdk::{PluginError, PluginResult};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// Events kept for reuse per context, at most. A fence recorded and
/// destroyed over and over reuses one event; a burst of live fences
/// beyond this many gives the extra events back to the driver.
pub const EVENT_POOL_MAX: usize = 64;

/// The flags of every event the plugin creates.
pub const EVENT_FLAGS: std::ffi::c_uint = EVENT_BLOCKING_SYNC | EVENT_DISABLE_TIMING;

struct State {
    pins: u64,
    ctx: CUcontext,
}

/// A raw driver handle kept in a lock (the handles are usable from any
/// thread).
struct Raw<T>(T);
// SAFETY: driver handles, usable from any thread.
unsafe impl<T> Send for Raw<T> {}

/// One device's primary context, retained while pinned.
pub struct DeviceContext {
    driver: &'static Driver,
    device: CUdevice,
    state: Mutex<State>,
    /// The zero-fill stream (null until the first zero-fill).
    zero_stream: Mutex<Raw<CUstream>>,
    /// Events of this context ready for reuse (complete).
    events: Mutex<Vec<Raw<CUevent>>>,
    /// Set by the first sticky error seen in the context (the driver's
    /// context is dead): why, for every later slot, which fails without
    /// calling the driver.
    dead: OnceLock<String>,
    /// The mechanisms this context serves (the device's, and its pinned
    /// one), each reported lost with it.
    mechanism_ids: Vec<u64>,
    /// The device's ordinal, for messages.
    ordinal: u32,
    /// The plugin instance's line to its hosts.
    loss: Arc<LossLine>,
    /// Page-locked chunks that pageable copies are staged through
    /// (`staging.rs`), freed at unload.
    staging: Arc<crate::staging::StagingPool>,
    /// Frees `cuMemFree`/`cuMemFreeHost` off the caller's thread
    /// (`freer.rs`).
    freer: crate::freer::Freer,
    /// The loss was reported (once per context, for each of its mechanisms).
    reported: AtomicBool,
}

// SAFETY: the raw pointers are driver handles, usable from any thread; the
// mutex guards them.
unsafe impl Send for DeviceContext {}
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// The context of `device` (ordinal `ordinal`), serving the mechanisms
    /// `mechanism_ids`, not retained yet.
    pub fn new(
        driver: &'static Driver,
        device: CUdevice,
        ordinal: u32,
        mechanism_ids: Vec<u64>,
        loss: Arc<LossLine>,
    ) -> Arc<Self> {
        Arc::new(DeviceContext {
            driver,
            device,
            state: Mutex::new(State { pins: 0, ctx: std::ptr::null_mut() }),
            zero_stream: Mutex::new(Raw(std::ptr::null_mut())),
            events: Mutex::new(Vec::new()),
            dead: OnceLock::new(),
            mechanism_ids,
            ordinal,
            loss,
            staging: Arc::default(),
            freer: crate::freer::Freer::new(driver),
            reported: AtomicBool::new(false),
        })
    }

    /// The plugin instance's line to its hosts.
    pub(crate) fn loss(&self) -> &LossLine {
        &self.loss
    }

    /// Why the context is dead, once it is.
    pub(crate) fn dead(&self) -> Option<&str> {
        self.dead.get().map(String::as_str)
    }

    /// A sticky error (`sticky`) was seen in this context: it is dead from
    /// now on (the first error is the one kept), and the loss is reported
    /// when the instance's hosts speak 1.2 ([`Self::notice_loss`]).
    pub(crate) fn mark_dead(&self, sticky: &PluginError) {
        let _ = self.dead.set(format!(
            "the CUDA context of device {} is dead (a sticky error: {}); every later call fails without \
             reaching the driver: the process must end to use the device again",
            self.ordinal, sticky.message
        ));
        self.notice_loss();
    }

    /// Reports the loss of a dead context to the hosts, once, for every
    /// mechanism it serves, when a host that agreed on 1.2 or newer holds
    /// the instance (until then the context answers DEVICE_UNAVAILABLE and
    /// nothing is reported).
    pub(crate) fn notice_loss(&self) {
        let Some(why) = self.dead.get() else { return };
        if !self.loss.speaks_1_2() || self.reported.swap(true, Ordering::AcqRel) {
            return;
        }
        for &id in &self.mechanism_ids {
            self.loss.report(id, why);
        }
    }

    /// The watcher's question (see `loss.rs`): a retained context that is
    /// not known dead yet is asked `cuMemGetInfo`; a sticky answer marks it
    /// dead and reports the loss. A context never retained is not asked
    /// (asking would create it).
    pub(crate) fn poll(&self) {
        if self.dead.get().is_some() {
            // Dead while only older hosts held the instance: report it
            // now if a 1.2 host came since.
            self.notice_loss();
            return;
        }
        let ctx = self.lock().ctx;
        if ctx.is_null() {
            return;
        }
        let d = self.driver;
        let _ = crate::driver::take_sticky();
        let _ = Entered::new(d, ctx).and_then(|_e| {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: resolved entry point, out-pointers to locals, a
            // context this mechanism keeps retained, current.
            d.check(unsafe { (d.api.mem_get_info)(&mut free, &mut total) }, "cuMemGetInfo")
        });
        if let Some(e) = crate::driver::take_sticky() {
            self.mark_dead(&e);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A pin: the primary context is retained (on the first pin ever) and
    /// stays so until the mechanism is freed.
    pub fn pin(self: &Arc<Self>) -> PluginResult<Pin> {
        let mut s = self.lock();
        if s.ctx.is_null() {
            let mut ctx: CUcontext = std::ptr::null_mut();
            // SAFETY: resolved entry point, out-pointer to a local.
            let r = unsafe { (self.driver.api.primary_ctx_retain)(&mut ctx, self.device) };
            self.driver.check(r, "cuDevicePrimaryCtxRetain")?;
            s.ctx = ctx;
        }
        s.pins += 1;
        Ok(Pin { dev: Arc::clone(self), ctx: s.ctx })
    }

    fn unpin(&self) {
        // The context stays retained (see the module docs).
        self.lock().pins -= 1;
    }
}

impl Drop for DeviceContext {
    /// At unload (no pin can be left: each holds an `Arc` of this): the
    /// zero-fill stream goes and the retention of the first pin is given
    /// back.
    fn drop(&mut self) {
        // Every free handed over is done before the context goes.
        self.freer.finish();
        let s = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if s.ctx.is_null() {
            return;
        }
        let d = self.driver;
        let zero = std::mem::replace(
            &mut self.zero_stream.get_mut().unwrap_or_else(PoisonError::into_inner).0,
            std::ptr::null_mut(),
        );
        let events = std::mem::take(self.events.get_mut().unwrap_or_else(PoisonError::into_inner));
        let chunks = self.staging.drain();
        if self.dead.get().is_none() {
            if let Ok(_e) = Entered::new(d, s.ctx) {
                if let Some(api) = d.host_alloc {
                    for c in chunks {
                        // Every copy has run: unload waits for every stream.
                        let _ = crate::pinned::free(d, api, c);
                    }
                }
                for e in events {
                    // SAFETY: pooled events are complete and used by nothing.
                    unsafe { (d.api.event_destroy)(e.0) };
                }
                if !zero.is_null() {
                    // SAFETY: the plugin's own stream, idle (every zero-fill
                    // waits for its memset before returning).
                    unsafe { (d.api.stream_destroy)(zero) };
                }
            }
        }
        // Nothing can be done about a failure here: the context is not
        // used again either way.
        // SAFETY: balances the retain of the first pin.
        unsafe { (d.api.primary_ctx_release)(self.device) };
        s.ctx = std::ptr::null_mut();
    }
}

/// Keeps a device's primary context retained; see the module docs.
pub struct Pin {
    dev: Arc<DeviceContext>,
    ctx: CUcontext,
}

// SAFETY: as for `DeviceContext`.
unsafe impl Send for Pin {}
unsafe impl Sync for Pin {}

impl Pin {
    /// The retained primary context.
    pub fn ctx(&self) -> CUcontext {
        self.ctx
    }

    /// One more pin of the same context (it is already retained).
    pub fn another(&self) -> Pin {
        self.dev.lock().pins += 1;
        Pin { dev: Arc::clone(&self.dev), ctx: self.ctx }
    }

    /// The context's staging chunks for pageable copies.
    pub(crate) fn staging(&self) -> &Arc<crate::staging::StagingPool> {
        &self.dev.staging
    }

    /// The context's freer.
    pub(crate) fn freer(&self) -> &crate::freer::Freer {
        &self.dev.freer
    }

    /// Makes the context current on this thread while the answer lives.
    pub fn enter(&self) -> PluginResult<Entered> {
        Entered::new(self.dev.driver, self.ctx)
    }

    /// The zero-fill stream, made on first use at the context's greatest
    /// priority. The context must be current.
    fn zero_stream(&self) -> PluginResult<CUstream> {
        let dev = &self.dev;
        let made = dev.zero_stream.lock().unwrap_or_else(PoisonError::into_inner).0;
        if !made.is_null() {
            return Ok(made);
        }
        let d = dev.driver;
        // Made outside the lock; if another thread made one meanwhile, this
        // one goes.
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: resolved entry points, out-pointers to locals; the
        // context is current (the caller entered it).
        d.check(
            unsafe { (d.api.ctx_get_stream_priority_range)(&mut least, &mut greatest) },
            "cuCtxGetStreamPriorityRange",
        )?;
        let mut stream: CUstream = std::ptr::null_mut();
        d.check(
            unsafe { (d.api.stream_create_with_priority)(&mut stream, STREAM_NON_BLOCKING, greatest) },
            "cuStreamCreateWithPriority",
        )?;
        let mut slot = dev.zero_stream.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.0.is_null() {
            slot.0 = stream;
            return Ok(stream);
        }
        let theirs = slot.0;
        drop(slot);
        // SAFETY: the stream just made, unused.
        unsafe { (d.api.stream_destroy)(stream) };
        Ok(theirs)
    }

    /// An event of this context for a fence: one from the pool, or a new
    /// one. The context must be current.
    pub fn take_event(&self) -> PluginResult<CUevent> {
        if let Some(e) = self.dev.events.lock().unwrap_or_else(PoisonError::into_inner).pop() {
            return Ok(e.0);
        }
        let d = self.dev.driver;
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: resolved entry point, out-pointer to a local; the context
        // is current.
        d.check(unsafe { (d.api.event_create)(&mut event, EVENT_FLAGS) }, "cuEventCreate")?;
        Ok(event)
    }

    /// Gives back an event [`Pin::take_event`] handed out, that nothing
    /// uses any more: to the pool when it is complete and the pool has
    /// room, else to the driver. The context must be current.
    pub fn give_event(&self, event: CUevent) -> PluginResult<()> {
        let d = self.dev.driver;
        // SAFETY: a live event of this context.
        let mut first = match unsafe { (d.api.event_query)(event) } {
            CUDA_SUCCESS => {
                let mut pool = self.dev.events.lock().unwrap_or_else(PoisonError::into_inner);
                if pool.len() < EVENT_POOL_MAX {
                    pool.push(Raw(event));
                    return Ok(());
                }
                Ok(())
            }
            // Still pending (its fence was destroyed first): not reused, so
            // a later fence never inherits an older record.
            CUDA_ERROR_NOT_READY => Ok(()),
            r => Err(d.error(r, "cuEventQuery")),
        };
        // SAFETY: as above; nothing uses it any more.
        let r = d.check(unsafe { (d.api.event_destroy)(event) }, "cuEventDestroy");
        if first.is_ok() {
            first = r;
        }
        first
    }

    /// Writes zeros over `[addr, addr + len)` and waits until they are
    /// there. The context must be current (see [`Pin::enter`]).
    pub fn zero_fill(&self, addr: CUdeviceptr, len: u64) -> PluginResult<()> {
        let d = self.dev.driver;
        // The stream outlives this call: this pin keeps it.
        let stream = self.zero_stream()?;
        // SAFETY: the range is mapped read-write (the caller's guarantee).
        d.check(unsafe { (d.api.memset_d8_async)(addr, 0, len as usize, stream) }, "cuMemsetD8Async")?;
        // SAFETY: the plugin's own stream.
        d.check(unsafe { (d.api.stream_synchronize)(stream) }, "cuStreamSynchronize")
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.dev.unpin();
    }
}
