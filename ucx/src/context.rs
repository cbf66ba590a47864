//! One UCP context and its worker: what every registration, endpoint and
//! transfer of a process hangs on.
//!
//! Every UCP call of the crate is made under one lock (`Inner::worker`):
//! the worker is created `UCS_THREAD_MODE_SERIALIZED`, and the deferred-free
//! queue's reaper queries transfer fences (which progress the worker) from
//! its own thread, beside the thread that issues transfers. A single lock
//! is enough: a UCP call here is short (non-blocking `_nbx` calls, one
//! progress pass), and no lock is held while waiting between passes.

use crate::error::{check, UcxError};
use crate::sys::{self, Ucp};
use std::ffi::CString;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A UCP context and worker (features: RMA). Cheap to clone.
///
/// Transports come from UCX's environment, read when it is made:
/// `UCX_TLS` (e.g. `tcp`, `posix,cma,self`, `rc,ud` on InfiniBand) and
/// `UCX_NET_DEVICES`.
#[derive(Clone)]
pub struct Ucx {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) ucp: &'static Ucp,
    pub(crate) context: sys::ucp_context_h,
    worker: Mutex<Worker>,
    /// `worker_address`, fetched once.
    address: Vec<u8>,
}

/// The worker handle; only reachable through the lock.
pub(crate) struct Worker(pub(crate) sys::ucp_worker_h);

// SAFETY: the context is thread-safe (`mt_workers_shared`), and the worker
// (serialized mode) is only used under `Inner::worker`'s lock.
unsafe impl Send for Inner {}
// SAFETY: as above.
unsafe impl Sync for Inner {}
// SAFETY: the handle moves with its lock.
unsafe impl Send for Worker {}

impl Ucx {
    /// Whether UCX can be used in this process; the error says why not
    /// and how to install it (tests skip on it).
    pub fn available() -> Result<(), UcxError> {
        Ucp::get().map(|_| ()).map_err(UcxError::Unavailable)
    }

    /// Reads UCX's configuration from the environment (`UCX_*`) and makes
    /// a context with RMA and one worker.
    pub fn new() -> Result<Ucx, UcxError> {
        Ucx::with_config(&[])
    }

    /// [`new`](Self::new), with UCX settings overridden for this context
    /// only, by name without the `UCX_` prefix: `[("TLS", "tcp"),
    /// ("NET_DEVICES", "lo")]` (`ucp_config_modify`). Unlike setting
    /// `UCX_*` variables, this is safe in a process with other threads.
    pub fn with_config(settings: &[(&str, &str)]) -> Result<Ucx, UcxError> {
        let ucp = Ucp::get().map_err(UcxError::Unavailable)?;
        let mut config = std::ptr::null_mut();
        // SAFETY: null prefix and file name mean UCX's defaults; a valid
        // out-pointer.
        check("ucp_config_read", unsafe {
            (ucp.config_read)(std::ptr::null(), std::ptr::null(), &mut config)
        })?;
        for (name, value) in settings {
            let (n, v) = match (CString::new(*name), CString::new(*value)) {
                (Ok(n), Ok(v)) => (n, v),
                _ => {
                    // SAFETY: read above; not used after.
                    unsafe { (ucp.config_release)(config) };
                    return Err(UcxError::Invalid(format!(
                        "UCX setting {name:?}={value:?} contains a NUL byte"
                    )));
                }
            };
            // SAFETY: a live config; NUL-terminated strings.
            let st = unsafe { (ucp.config_modify)(config, n.as_ptr(), v.as_ptr()) };
            if st != sys::UCS_OK {
                // SAFETY: read above; not used after.
                unsafe { (ucp.config_release)(config) };
                let e = crate::error::ucx_error("ucp_config_modify", st);
                return Err(UcxError::Invalid(format!("UCX setting {name}={value}: {e}")));
            }
        }
        let name = CString::new("memplug").expect("no NUL");
        let params = sys::ucp_params_t {
            field_mask: sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED,
            features: sys::UCP_FEATURE_RMA,
            mt_workers_shared: 1,
            name: name.as_ptr(),
            ..Default::default()
        };
        let mut context = std::ptr::null_mut();
        // SAFETY: params and config valid for the call; out-pointer valid.
        let st = unsafe {
            (ucp.init_version)(sys::UCP_API_MAJOR, sys::UCP_API_MINOR, &params, config, &mut context)
        };
        // SAFETY: read above; not used after.
        unsafe { (ucp.config_release)(config) };
        check("ucp_init", st)?;
        let wp = sys::ucp_worker_params_t {
            field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE,
            thread_mode: sys::UCS_THREAD_MODE_SERIALIZED,
            ..Default::default()
        };
        let mut worker = std::ptr::null_mut();
        // SAFETY: a live context, valid params and out-pointer.
        if let Err(e) = check("ucp_worker_create", unsafe { (ucp.worker_create)(context, &wp, &mut worker) })
        {
            // SAFETY: made above, nothing else uses it.
            unsafe { (ucp.cleanup)(context) };
            return Err(e);
        }
        let (mut addr, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: a live worker; valid out-pointers.
        let st = unsafe { (ucp.worker_get_address)(worker, &mut addr, &mut len) };
        let address = if st == sys::UCS_OK {
            // SAFETY: UCX returned `len` readable bytes at `addr`.
            let v = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
            // SAFETY: returned by get_address for this worker.
            unsafe { (ucp.worker_release_address)(worker, addr) };
            v
        } else {
            // SAFETY: made above, nothing else uses them.
            unsafe {
                (ucp.worker_destroy)(worker);
                (ucp.cleanup)(context);
            }
            return Err(crate::error::ucx_error("ucp_worker_get_address", st));
        };
        Ok(Ucx { inner: Arc::new(Inner { ucp, context, worker: Mutex::new(Worker(worker)), address }) })
    }

    /// This worker's address, for a peer's endpoint (opaque bytes).
    pub fn worker_address(&self) -> &[u8] {
        &self.inner.address
    }

    /// One progress pass of the worker: a peer's reads and writes of this
    /// process's registered memory over TCP need it (the shared-memory
    /// transports do not). Returns whether anything progressed.
    pub fn progress(&self) -> bool {
        self.inner.progress()
    }
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Worker> {
        // A panic under the lock leaves UCX's state as the call left it;
        // the handle itself is still valid.
        self.worker.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn progress(&self) -> bool {
        let w = self.lock();
        // SAFETY: a live worker, under its lock.
        unsafe { (self.ucp.worker_progress)(w.0) != 0 }
    }

    /// Progresses the worker until `done()` or the deadline. It spins
    /// while passes make progress and for 2 ms after the last that did (a
    /// transfer in flight runs at full speed, as `ucx_perftest` polls);
    /// then it pauses between passes, doubling up to 1 ms, so an idle wait
    /// costs little CPU.
    pub(crate) fn progress_until(&self, deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
        let mut last = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            if done() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return done();
            }
            if self.progress() {
                last = now;
                pause = Duration::from_micros(20);
            } else if now.duration_since(last) > Duration::from_millis(2) {
                std::thread::sleep(pause.min(deadline.saturating_duration_since(now)));
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Last holder: every endpoint, registration and transfer (they hold
        // an `Arc<Inner>`) is gone.
        let w = self.worker.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: made in `new`, destroyed once, worker before context.
        unsafe {
            (self.ucp.worker_destroy)(w.0);
            (self.ucp.cleanup)(self.context);
        }
    }
}
