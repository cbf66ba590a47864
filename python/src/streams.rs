//! Streams and fences where the mechanism has the sync capability: a
//! stream runs host functions (Python callables) and queued operations in
//! order; a fence says when the work before it has run. A fence is either
//! recorded on a stream (the plugin's) or made from a runtime's own query
//! (`Manager.fence_from`, the host's `FnFence`).

use crate::errors;
use crate::interp::{wait_interruptibly, with_python};
use memplug_host::{FnFence, Mechanism, PluginFence, SharedFence, StreamKey};
use pyo3::prelude::*;
use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub fn secs(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|e| errors::invalid(format!("{what}: {e}")))
}

std::thread_local! {
    /// The stream (mechanism key, handle) whose host function this thread
    /// is running, if any.
    static RUNNING_ON: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Whether `fence` is a point of the stream whose host function this
/// thread is running and is not complete: it comes after the running
/// work, so waiting for it would never return — and that work is already
/// ordered before it by the stream.
pub fn after_running_work(fence: &SharedFence) -> bool {
    let Some((mechanism, stream, _)) = fence.order_key() else { return false };
    RUNNING_ON.with(|r| r.get() == Some((mechanism, stream))) && !matches!(fence.query(), Ok(true))
}

/// A stream of a mechanism's sync capability, made (`Context.create_stream`)
/// or adopted (`Context.adopt_stream`). `close()` (or leaving a `with`
/// block) destroys it once its submitted work has run.
#[pyclass(frozen, module = "memplug")]
pub struct Stream {
    mechanism: Mechanism,
    inner: Mutex<Option<memplug_host::Stream>>,
    handle: u64,
}

impl Stream {
    pub fn new(mechanism: Mechanism, s: memplug_host::Stream) -> Self {
        let handle = s.handle();
        Stream { mechanism, inner: Mutex::new(Some(s)), handle }
    }

    fn guard(&self) -> MutexGuard<'_, Option<memplug_host::Stream>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` with the live stream (under its lock: nothing here blocks).
    pub fn with<R>(&self, f: impl FnOnce(&memplug_host::Stream) -> PyResult<R>) -> PyResult<R> {
        match &*self.guard() {
            Some(s) => f(s),
            None => Err(errors::released("stream")),
        }
    }

    pub fn mechanism(&self) -> &Mechanism {
        &self.mechanism
    }

    pub fn key(&self) -> PyResult<StreamKey> {
        self.with(|s| Ok(StreamKey::of(s)))
    }

    /// Records a fence after the work submitted so far.
    pub fn record(&self) -> PyResult<Fence> {
        let f = self.with(|s| PluginFence::record_typed(&self.mechanism, s).map_err(errors::call))?;
        Ok(Fence::recorded(f))
    }

    fn sync(&self) -> memplug_host::SyncApi<'_> {
        self.mechanism.sync().expect("a stream exists only on a mechanism with sync")
    }

    /// Destroys the stream (the caller released the GIL: the worker may
    /// need it to finish a host function). A refusal puts it back.
    fn destroy(&self) -> Result<(), memplug_host::CallError> {
        let Some(s) = self.guard().take() else { return Ok(()) };
        self.sync().stream_destroy(s).map_err(|e| {
            *self.guard() = Some(e.object);
            e.error
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.guard().is_none() {
            return;
        }
        // Dropped with the GIL held (a deallocation): destroying joins the
        // worker, which may be waiting for the GIL to run a host function.
        // A refusal (dropped on its own worker) leaves the stream counted
        // live on its mechanism: visible, never a hang.
        with_python((), |py| py.allow_threads(|| drop(self.destroy())));
    }
}

#[pymethods]
impl Stream {
    /// The plugin's handle (opaque).
    #[getter]
    fn handle(&self) -> u64 {
        self.handle
    }
    /// Whether `close()` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.guard().is_none()
    }
    /// Runs `callable()` on the stream's worker after the work submitted
    /// before it, taking the GIL there. An exception is reported through
    /// `sys.unraisablehook` and the stream goes on; once the interpreter
    /// is exiting the callable is skipped.
    fn enqueue(&self, callable: PyObject) -> PyResult<()> {
        let me = (self.mechanism.key(), self.handle);
        self.with(|s| {
            self.sync()
                .enqueue(s, move || {
                    let outer = RUNNING_ON.with(|r| r.replace(Some(me)));
                    with_python((), |py| {
                        if let Err(e) = callable.call0(py) {
                            e.write_unraisable(py, Some(callable.bind(py)));
                        }
                    });
                    RUNNING_ON.with(|r| r.set(outer));
                })
                .map_err(errors::call)
        })
    }
    /// A fence after the work submitted so far.
    fn record_fence(&self) -> PyResult<Fence> {
        self.record()
    }
    /// Later work on this stream waits for `fence` (recorded on a stream of
    /// the same mechanism) without blocking the caller. A runtime fence is
    /// refused (`InvalidArgument`): wait for it on the host instead.
    fn wait_fence(&self, fence: &Fence) -> PyResult<()> {
        let recorded = fence.recorded.as_ref().ok_or_else(|| {
            errors::invalid("a stream waits only on a fence recorded on a stream (record_fence)".into())
        })?;
        self.with(|s| self.sync().stream_wait_fence(s, recorded.token()).map_err(errors::call))
    }
    /// Waits (the GIL released) until the work submitted so far has run;
    /// `False` on timeout.
    #[pyo3(signature = (timeout=None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        self.record()?.wait(py, timeout)
    }
    /// Destroys the stream once its work has run (idempotent). Refused
    /// (`MemplugError`, status `BUSY`) from one of its own host functions.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.destroy()).map_err(errors::call)
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
    fn __repr__(&self) -> String {
        format!("memplug.Stream(handle={:#x}, mechanism={})", self.handle, self.mechanism.label())
    }
}

/// A fence: `query()` never blocks; `wait(timeout)` blocks with the GIL
/// released. Pass it to `Allocation.free_after`, `CachedAllocation.free_on`
/// or `Stream.wait_fence`.
#[pyclass(frozen, module = "memplug")]
pub struct Fence {
    pub shared: SharedFence,
    /// Set for a fence recorded on a stream: a stream of its mechanism
    /// can wait on it.
    pub recorded: Option<Arc<PluginFence>>,
}

impl Fence {
    pub fn recorded(f: Arc<PluginFence>) -> Self {
        Fence { shared: f.clone(), recorded: Some(f) }
    }
}

#[pymethods]
impl Fence {
    /// Whether the work before it has run. A failed query raises.
    fn query(&self, py: Python<'_>) -> PyResult<bool> {
        let f = self.shared.clone();
        py.allow_threads(move || f.query()).map_err(errors::call)
    }
    /// Waits up to `timeout` seconds (`None`: as long as it takes);
    /// `True` when complete. Ctrl-C interrupts it. Refused
    /// (`InvalidState`) in a host function for a later fence of its own
    /// stream, which could never complete while it waits.
    #[pyo3(signature = (timeout=None))]
    pub fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        if after_running_work(&self.shared) {
            return Err(errors::state(
                "a host function cannot wait for a fence recorded after it on its own stream".into(),
            ));
        }
        let timeout = timeout.map(|t| secs("timeout", t)).transpose()?;
        let f = self.shared.clone();
        let mut failed = None;
        let done = wait_interruptibly(py, timeout, |slice| match f.wait(slice) {
            Ok(done) => done,
            Err(e) => {
                failed = Some(e);
                true
            }
        })?;
        failed.map_or(Ok(done), |e| Err(errors::call(e)))
    }
    fn __repr__(&self) -> String {
        format!("memplug.Fence({})", self.shared.describe())
    }
}

/// A runtime fence from Python callables: `query()` → truthy when done;
/// `wait(seconds)` → truthy when done (without one, `query` is polled).
/// They run with the GIL on whatever thread asks; an exception is
/// reported through `sys.unraisablehook` and counts as not done (never
/// free on a guess).
pub fn fence_from(name: String, query: PyObject, wait: Option<PyObject>) -> Fence {
    let query = Arc::new(query);
    let ask = {
        let query = query.clone();
        move || call_bool(&query, None)
    };
    let wait = move |timeout: Duration| match &wait {
        Some(w) => call_bool(w, Some(timeout.as_secs_f64())),
        None => poll(|| call_bool(&query, None), timeout),
    };
    Fence { shared: FnFence::new(name, ask, wait), recorded: None }
}

/// `f()`, or `f(seconds)`, as a bool.
fn call_bool(f: &PyObject, seconds: Option<f64>) -> bool {
    with_python(false, |py| {
        let r = match seconds {
            None => f.call0(py),
            Some(s) => f.call1(py, (s,)),
        };
        r.and_then(|v| v.is_truthy(py)).unwrap_or_else(|e| {
            e.write_unraisable(py, Some(f.bind(py)));
            false
        })
    })
}

fn poll(query: impl Fn() -> bool, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if query() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep((deadline - now).min(Duration::from_micros(200)));
    }
}
