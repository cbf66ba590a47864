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
//! Each device also has a plugin-owned, non-blocking stream used only to
//! zero-fill memory the plugin commits or creates (the ABI promises zeros),
//! so that zeroing never waits behind a runtime's work on other streams. It
//! lives as long as the context's retention.

//!
//! A context that met a sticky error is *dead* ([`DeviceContext::mark_dead`]):
//! every later slot fails without calling the driver, and the loss is
//! reported to the hosts once (see `loss.rs`).

use crate::driver::{CUcontext, CUdevice, CUdeviceptr, CUstream, Driver, Entered, STREAM_NON_BLOCKING};
use crate::loss::LossLine;
use memplug_sdk::{PluginError, PluginResult};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

struct State {
    pins: u64,
    ctx: CUcontext,
    zero_stream: CUstream,
}

/// One device's primary context, retained while pinned.
pub struct DeviceContext {
    driver: &'static Driver,
    device: CUdevice,
    state: Mutex<State>,
    /// Set by the first sticky error seen in the context (the driver's
    /// context is dead): why, for every later slot, which fails without
    /// calling the driver.
    dead: OnceLock<String>,
    /// The mechanism this context serves, for the loss report.
    mechanism_id: u64,
    /// The device's ordinal, for messages.
    ordinal: u32,
    /// The plugin instance's line to its hosts.
    loss: Arc<LossLine>,
    /// The loss was reported (once per mechanism).
    reported: AtomicBool,
}

// SAFETY: the raw pointers are driver handles, usable from any thread; the
// mutex guards them.
unsafe impl Send for DeviceContext {}
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// The context of `device` (ordinal `ordinal`), serving mechanism
    /// `mechanism_id`, not retained yet.
    pub fn new(
        driver: &'static Driver,
        device: CUdevice,
        ordinal: u32,
        mechanism_id: u64,
        loss: Arc<LossLine>,
    ) -> Arc<Self> {
        Arc::new(DeviceContext {
            driver,
            device,
            state: Mutex::new(State {
                pins: 0,
                ctx: std::ptr::null_mut(),
                zero_stream: std::ptr::null_mut(),
            }),
            dead: OnceLock::new(),
            mechanism_id,
            ordinal,
            loss,
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

    /// Reports the loss of a dead context to the hosts, once, when a host
    /// that agreed on 1.2 or newer holds the instance (until then the
    /// context answers DEVICE_UNAVAILABLE and nothing is reported).
    pub(crate) fn notice_loss(&self) {
        let Some(why) = self.dead.get() else { return };
        if !self.loss.speaks_1_2() || self.reported.swap(true, Ordering::AcqRel) {
            return;
        }
        self.loss.report(self.mechanism_id, why);
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
        let s = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if s.ctx.is_null() {
            return;
        }
        let d = self.driver;
        if !s.zero_stream.is_null() && self.dead.get().is_none() {
            if let Ok(_e) = Entered::new(d, s.ctx) {
                // SAFETY: the plugin's own stream, idle (every zero-fill
                // waits for its memset before returning).
                unsafe { (d.api.stream_destroy)(s.zero_stream) };
            }
            s.zero_stream = std::ptr::null_mut();
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

    /// Makes the context current on this thread while the answer lives.
    pub fn enter(&self) -> PluginResult<Entered> {
        Entered::new(self.dev.driver, self.ctx)
    }

    /// Writes zeros over `[addr, addr + len)` and waits until they are
    /// there. The context must be current (see [`Pin::enter`]).
    pub fn zero_fill(&self, addr: CUdeviceptr, len: u64) -> PluginResult<()> {
        let d = self.dev.driver;
        let stream = {
            let mut s = self.dev.lock();
            if s.zero_stream.is_null() {
                let mut stream: CUstream = std::ptr::null_mut();
                // SAFETY: resolved entry point, out-pointer to a local; the
                // context is current (the caller entered it).
                d.check(
                    unsafe { (d.api.stream_create)(&mut stream, STREAM_NON_BLOCKING) },
                    "cuStreamCreate",
                )?;
                s.zero_stream = stream;
            }
            // The stream outlives this call: this pin keeps it.
            s.zero_stream
        };
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
