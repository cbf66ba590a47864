//! Primary contexts: each device's primary context is retained
//! (`cuDevicePrimaryCtxRetain`) while anything the plugin made on the device
//! is alive, and released when the last such thing goes. Every live object
//! holds a [`Pin`]; the first pin retains the context, the last one drops it.
//!
//! Each device also has a plugin-owned, non-blocking stream used only to
//! zero-fill memory the plugin commits or creates (the ABI promises zeros),
//! so that zeroing never waits behind a runtime's work on other streams. It
//! lives exactly as long as the pins do.

use crate::driver::{CUcontext, CUdevice, CUdeviceptr, CUstream, Driver, Entered, STREAM_NON_BLOCKING};
use memplug_sdk::PluginResult;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

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
}

// SAFETY: the raw pointers are driver handles, usable from any thread; the
// mutex guards them.
unsafe impl Send for DeviceContext {}
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// The context of `device`, not retained yet.
    pub fn new(driver: &'static Driver, device: CUdevice) -> Arc<Self> {
        Arc::new(DeviceContext {
            driver,
            device,
            state: Mutex::new(State {
                pins: 0,
                ctx: std::ptr::null_mut(),
                zero_stream: std::ptr::null_mut(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A pin: the primary context is retained (on the first pin) and stays
    /// so until the pin is dropped.
    pub fn pin(self: &Arc<Self>) -> PluginResult<Pin> {
        let mut s = self.lock();
        if s.pins == 0 {
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
        let mut s = self.lock();
        s.pins -= 1;
        if s.pins > 0 {
            return;
        }
        let d = self.driver;
        if !s.zero_stream.is_null() {
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
