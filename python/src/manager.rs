//! The manager and what it hands out before any memory: plugins, contexts
//! (selected mechanisms), pools with hard budgets, pressure holders whose
//! callbacks are Python callables.

use crate::errors;
use crate::interp::with_python;
use crate::memory::{Binding, CachingBinding};
use crate::streams::{Fence, Stream};
use memplug_host::governor::{
    AllocationClass, HolderRegistration, Pool as HostPool, PressureTicket, Priority,
};
use memplug_host::{dlpack, Requirements};
use memplug_host::{
    BindingSpec, CacheConfig, Context as HostContext, LoadOptions, Mechanism, OverlapCheck, Plugin,
    ProcessMemoryManager, SyncApi,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU, MEMPLUG_DEVICE_CUDA};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The process memory manager: plugins, pools, bindings.
#[pyclass(frozen, module = "memplug")]
pub struct Manager {
    inner: Arc<ProcessMemoryManager>,
}

fn class_of(name: &str) -> PyResult<AllocationClass> {
    AllocationClass::ALL.into_iter().find(|c| c.name() == name).ok_or_else(|| {
        errors::invalid(format!(
            "unknown allocation class {name:?} (weights, kv, activations, workspace, other)"
        ))
    })
}

fn kind_of(device: &Bound<'_, PyAny>) -> PyResult<u32> {
    if let Ok(n) = device.extract::<u32>() {
        return Ok(n);
    }
    match device.extract::<String>()?.as_str() {
        "cpu" => Ok(MEMPLUG_DEVICE_CPU),
        "cuda" => Ok(MEMPLUG_DEVICE_CUDA),
        other => Err(errors::invalid(format!("unknown device kind {other:?} (cpu, cuda, or a number)"))),
    }
}

/// The DLPack device of a context's mechanism (or a vendor kind's raw
/// numbers: its exports are refused anyway).
fn device_of(ctx: &HostContext) -> (i32, i32) {
    let d = ctx.mechanism().device();
    dlpack::dl_device(d).map_or((d.0.kind as i32, d.0.ordinal as i32), |d| (d.device_type, d.device_id))
}

#[pymethods]
impl Manager {
    #[new]
    fn new() -> Self {
        Manager { inner: Arc::new(ProcessMemoryManager::new()) }
    }
    /// Registers the reference CPU plugin linked into this module, through
    /// the same checks as a loaded one; returns its name.
    fn register_cpu_plugin(&self) -> PyResult<String> {
        // SAFETY: the reference CPU plugin's entry, built against this ABI.
        let p = unsafe {
            Plugin::from_entry(
                memplug_plugin_cpu::cpu_plugin_entry,
                "memplug-cpu (linked)",
                &LoadOptions::default(),
            )
        }
        .map_err(|e| errors::manager(e.into()))?;
        let name = p.name().to_string();
        self.inner.register_plugin(p).map_err(errors::manager)?;
        Ok(name)
    }
    /// Loads a plugin library by path (`./libx.so`, never a bare name);
    /// returns its name. `check_overlaps`: which blocks the host checks
    /// against the live ones (`"off"`, `"reservations"`, `"auto"`, `"all"`;
    /// default: this build's, `"auto"` in a release build);
    /// `expected_sha256`: refuse any other file.
    #[pyo3(signature = (path, *, check_overlaps=None, expected_sha256=None))]
    fn load_plugin(
        &self,
        py: Python<'_>,
        path: std::path::PathBuf,
        check_overlaps: Option<&str>,
        expected_sha256: Option<String>,
    ) -> PyResult<String> {
        let mut opts = LoadOptions { expected_sha256, ..LoadOptions::default() };
        if let Some(c) = check_overlaps {
            opts.check_overlaps = match c {
                "off" => OverlapCheck::Off,
                "reservations" => OverlapCheck::Reservations,
                "auto" => OverlapCheck::Auto,
                "all" => OverlapCheck::All,
                other => {
                    return Err(errors::invalid(format!(
                        "check_overlaps {other:?} is none of 'off', 'reservations', 'auto', 'all'"
                    )))
                }
            };
        }
        let m = self.inner.clone();
        py.allow_threads(move || m.load_plugin(path, &opts)).map_err(errors::manager)
    }
    /// Picks a mechanism for `device` (`"cpu"`, `"cuda"` or a
    /// `MEMPLUG_DEVICE_*` number) with the capabilities asked.
    #[pyo3(signature = (device=None, ordinal=0, *, virtual_backing=false, shared_mapping=false, sync=false))]
    fn select(
        &self,
        device: Option<&Bound<'_, PyAny>>,
        ordinal: u32,
        virtual_backing: bool,
        shared_mapping: bool,
        sync: bool,
    ) -> PyResult<Context> {
        let kind = device.map_or(Ok(MEMPLUG_DEVICE_CPU), kind_of)?;
        let dev = MemplugDevice { kind, ordinal };
        let ctx = self
            .inner
            .select(dev, Requirements { virtual_backing, shared_mapping, sync })
            .map_err(errors::manager)?;
        Ok(Context { inner: ctx })
    }
    /// A pool with a hard capacity in bytes.
    fn create_pool(&self, name: &str, capacity: u64) -> PyResult<Pool> {
        Ok(Pool { inner: self.inner.create_pool(name, capacity).map_err(errors::manager)? })
    }
    /// Joins `pool` to the node authority at `socket` (`memplug node serve`)
    /// as `device`: its capacity becomes what this process leases, and
    /// pressure crosses processes. Create the pool with capacity 0.
    /// `classes`: the classes of memory the pool holds (`["kv"]`; None:
    /// any): the authority presses this process only for requests of
    /// those classes.
    #[pyo3(signature = (socket, pool, device, priority=0, classes=None))]
    fn join_node(
        &self,
        py: Python<'_>,
        socket: std::path::PathBuf,
        pool: &Pool,
        device: &str,
        priority: u32,
        classes: Option<Vec<String>>,
    ) -> PyResult<crate::node::NodeLink> {
        let mut mask = 0u8;
        for name in classes.unwrap_or_default() {
            mask |= 1 << class_of(&name)? as u8;
        }
        crate::node::join(py, socket, pool, device, priority, mask)
    }
    /// A pool of `capacity` bytes nested under `parent` (a pool of this
    /// manager): every charge in it must fit in it and in each ancestor,
    /// and counts at each.
    fn create_child_pool(&self, parent: &Pool, name: &str, capacity: u64) -> PyResult<Pool> {
        let p = self.inner.create_child_pool(name, &parent.inner, capacity).map_err(errors::manager)?;
        Ok(Pool { inner: p })
    }
    /// A runtime fence (the host's `FnFence`): `query()` says, truthy,
    /// whether the runtime's work is done; `wait(seconds)`, if given,
    /// blocks up to that long (else `query` is polled). Both are called
    /// with the GIL on whatever thread asks (a poll, a drain, the
    /// reaper); an exception counts as not done and is reported through
    /// `sys.unraisablehook`.
    #[pyo3(signature = (query, wait=None, *, name="python fence"))]
    fn fence_from(&self, query: PyObject, wait: Option<PyObject>, name: &str) -> Fence {
        crate::streams::fence_from(name.to_string(), query, wait)
    }
    /// A binding of `context` charged to `pool` under `alloc_class`
    /// (`weights`, `kv`, `activations`, `workspace`, `other`), attributed
    /// to `holder` if given; `wait` seconds for room after pressure.
    #[pyo3(signature = (context, pool, alloc_class="other", *, holder=None, wait=None))]
    fn bind(
        &self,
        context: &Context,
        pool: &Pool,
        alloc_class: &str,
        holder: Option<&Holder>,
        wait: Option<f64>,
    ) -> PyResult<Binding> {
        let mut spec = BindingSpec::new(class_of(alloc_class)?);
        if let Some(h) = holder {
            spec = spec.holder(h.id_now()?);
        }
        if let Some(w) = wait {
            spec =
                spec.wait(Duration::try_from_secs_f64(w).map_err(|e| errors::invalid(format!("wait: {e}")))?);
        }
        let b = self.inner.bind(&context.inner, &pool.inner, spec).map_err(errors::manager)?;
        Ok(Binding { inner: b, device: device_of(&context.inner), queue: self.inner.queue().clone() })
    }
    /// A caching binding (it registers its own holder, `holder_name`). The
    /// idle policy: `max_idle_bytes` (default a quarter of the pool's
    /// capacity; 0 keeps nothing), `max_idle_age` in seconds (blocks idle
    /// longer go back at misses and `collect()`), `gc_threshold` (a fraction
    /// of the pool's capacity a miss keeps the pool under by giving idle
    /// blocks back first).
    #[pyo3(signature = (context, pool, alloc_class="other", *, holder_name="cache", max_block=None,
                        max_idle_bytes=None, max_idle_age=None, gc_threshold=None))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn bind_caching(
        &self,
        context: &Context,
        pool: &Pool,
        alloc_class: &str,
        holder_name: &str,
        max_block: Option<u64>,
        max_idle_bytes: Option<u64>,
        max_idle_age: Option<f64>,
        gc_threshold: Option<f64>,
    ) -> PyResult<CachingBinding> {
        let mut config = CacheConfig { holder_name: holder_name.into(), ..CacheConfig::default() };
        if let Some(m) = max_block {
            config.max_block = m;
        }
        config.idle.max_idle_bytes = max_idle_bytes;
        if let Some(a) = max_idle_age {
            let age =
                Duration::try_from_secs_f64(a).map_err(|e| errors::invalid(format!("max_idle_age: {e}")))?;
            config.idle.max_idle_age = Some(age);
        }
        config.idle.gc_threshold = gc_threshold;
        let spec = BindingSpec::new(class_of(alloc_class)?);
        let c =
            self.inner.bind_caching(&context.inner, &pool.inner, spec, config).map_err(errors::manager)?;
        Ok(CachingBinding { inner: c, device: device_of(&context.inner), queue: self.inner.queue().clone() })
    }
    /// Retires frees whose fences completed: `{"retired", "quarantined",
    /// "still_pending"}`.
    fn poll<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.inner.clone();
        let r = py.allow_threads(move || m.poll());
        let d = PyDict::new(py);
        d.set_item("retired", r.retired)?;
        d.set_item("quarantined", r.quarantined)?;
        d.set_item("still_pending", r.still_pending)?;
        Ok(d)
    }
    /// Waits up to `timeout` seconds for every pending free.
    #[pyo3(signature = (timeout=1.0))]
    fn drain<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyDict>> {
        let t = Duration::try_from_secs_f64(timeout).map_err(|e| errors::invalid(format!("timeout: {e}")))?;
        let m = self.inner.clone();
        let r = py.allow_threads(move || m.drain(t));
        let d = PyDict::new(py);
        d.set_item("retired", r.retired)?;
        d.set_item("quarantined", r.quarantined)?;
        d.set_item("left", r.left)?;
        Ok(d)
    }
    /// Every mechanism registered: name, device, capabilities.
    fn mechanisms<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.inner
            .mechanisms()
            .iter()
            .map(|m| {
                let d = PyDict::new(py);
                d.set_item("name", m.label())?;
                d.set_item("device", m.device().to_string())?;
                d.set_item("capabilities", m.capabilities().names())?;
                Ok(d)
            })
            .collect()
    }
}

/// A selected mechanism's context.
#[pyclass(frozen, module = "memplug")]
pub struct Context {
    pub(crate) inner: Arc<HostContext>,
}

#[pymethods]
impl Context {
    /// `plugin/mechanism`.
    #[getter]
    fn name(&self) -> String {
        self.inner.label().to_string()
    }
    /// The device, as the host names it (`cpu:0`).
    #[getter]
    fn device(&self) -> String {
        self.inner.mechanism().device().to_string()
    }
    /// `(device_type, device_id)` as DLPack numbers them.
    #[getter]
    fn dlpack_device(&self) -> (i32, i32) {
        device_of(&self.inner)
    }
    /// A new stream of the mechanism's sync capability (`Unsupported`
    /// without one).
    fn create_stream(&self) -> PyResult<Stream> {
        let m = self.inner.mechanism();
        let s = sync_of(m)?.stream_create().map_err(errors::call)?;
        Ok(Stream::new(m.clone(), s))
    }
    /// Wraps a runtime's own stream: `handle` is its native value (a
    /// `CUstream` as an int; 0 is CUDA's default stream), `kind` the API
    /// that made it (`"cuda"`, `"cpu"` or a `MEMPLUG_DEVICE_*` number).
    /// The stream stays the runtime's and must outlive the returned
    /// `Stream`. `Unsupported` where the plugin adopts no stream of that
    /// kind (the CPU plugin adopts none).
    fn adopt_stream(&self, handle: u64, kind: &Bound<'_, PyAny>) -> PyResult<Stream> {
        let m = self.inner.mechanism();
        let native = usize::try_from(handle)
            .map_err(|_| errors::invalid(format!("stream handle {handle:#x} is not a pointer here")))?;
        // SAFETY: the caller's contract (documented): a live native stream
        // of `kind` that outlives the wrapper.
        let s = unsafe { sync_of(m)?.stream_adopt_typed(kind_of(kind)?, native as *mut std::ffi::c_void) }
            .map_err(errors::call)?;
        Ok(Stream::new(m.clone(), s))
    }
}

fn sync_of(m: &Mechanism) -> PyResult<SyncApi<'_>> {
    m.sync().ok_or_else(|| errors::unsupported(format!("mechanism {} has no sync capability", m.label())))
}

/// A pool: a hard budget in bytes.
#[pyclass(frozen, module = "memplug")]
pub struct Pool {
    pub(crate) inner: Arc<HostPool>,
}

fn pressure_ticket<'py>(py: Python<'py>, t: &PressureTicket) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("bytes_wanted", t.bytes_wanted)?;
    d.set_item("alloc_class", t.class.name())?;
    d.set_item("priority", t.priority.0)?;
    d.set_item("pool", t.pool.get())?;
    Ok(d)
}

/// A pressure callback's answer: the bytes it released. An exception, or
/// an answer that is not a non-negative int, is a refusal (0), reported
/// through `sys.unraisablehook`; `None` is a plain 0.
fn answer(py: Python<'_>, cb: &PyObject, t: &PressureTicket) -> u64 {
    let r = pressure_ticket(py, t).and_then(|ticket| cb.call1(py, (ticket,)));
    let r = r.and_then(|v| if v.is_none(py) { Ok(0) } else { v.extract::<u64>(py) });
    r.unwrap_or_else(|e| {
        e.write_unraisable(py, Some(cb.bind(py)));
        0
    })
}

#[pymethods]
impl Pool {
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }
    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
    #[getter]
    fn used(&self) -> u64 {
        self.inner.used()
    }
    #[getter]
    fn free(&self) -> u64 {
        self.inner.free()
    }
    #[getter]
    fn peak(&self) -> u64 {
        self.inner.peak()
    }
    /// Registers a pressure holder: `callback(ticket)` (a dict with
    /// `bytes_wanted`, `alloc_class`, `priority`, `pool`) is called, with
    /// the GIL, on whatever thread needs room, and returns the bytes it
    /// released (freeing its allocations). Lower priorities are asked
    /// first.
    #[pyo3(signature = (name, callback, priority=0))]
    fn register_holder(&self, name: &str, callback: PyObject, priority: u32) -> Holder {
        let reg = self.inner.register_holder(name, Priority(priority), move |t: &PressureTicket| {
            with_python(0, |py| answer(py, &callback, t))
        });
        let id = reg.id();
        Holder { inner: Mutex::new(Some(reg)), id, pool: self.inner.clone() }
    }
    /// The pool's figures: capacity, used, free, peak, reserved, leased,
    /// quarantined, per-class charges, pressure tickets and answers.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.snapshot();
        let d = PyDict::new(py);
        d.set_item("name", &*s.name)?;
        for (k, v) in [
            ("capacity", s.capacity),
            ("used", s.used),
            ("free", s.free),
            ("peak", s.peak),
            ("reserved", s.reserved),
            ("leased", s.leased),
            ("quarantined", s.quarantined),
            ("waits", s.waits),
            ("wait_timeouts", s.wait_timeouts),
        ] {
            d.set_item(k, v)?;
        }
        d.set_item("holders", s.holders)?;
        d.set_item("parent", self.inner.parent().map(|p| p.name().to_string()))?;
        let children: Vec<String> = self.inner.children().iter().map(|c| c.name().to_string()).collect();
        d.set_item("children", children)?;
        d.set_item("depth", self.inner.depth())?;
        let classes = PyDict::new(py);
        for c in AllocationClass::ALL {
            classes.set_item(c.name(), s.class(c).charged())?;
        }
        d.set_item("classes", classes)?;
        let p = PyDict::new(py);
        p.set_item("tickets", s.pressure.tickets)?;
        p.set_item("bytes_wanted", s.pressure.bytes_wanted)?;
        p.set_item("bytes_answered", s.pressure.bytes_answered)?;
        p.set_item("zero_answers", s.pressure.zero_answers)?;
        d.set_item("pressure", p)?;
        Ok(d)
    }
}

/// A pressure holder's registration; `unregister()` (or leaving a `with`
/// block) stops its tickets.
#[pyclass(frozen, module = "memplug")]
pub struct Holder {
    inner: Mutex<Option<HolderRegistration>>,
    id: memplug_host::governor::HolderId,
    pool: Arc<HostPool>,
}

impl Holder {
    fn id_now(&self) -> PyResult<memplug_host::governor::HolderId> {
        match &*self.inner.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(_) => Ok(self.id),
            None => Err(errors::released("holder")),
        }
    }
}

#[pymethods]
impl Holder {
    #[getter]
    fn id(&self) -> u64 {
        self.id.get()
    }
    /// The holder's charges and pressure figures.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.pool.holder_stats(self.id).ok_or_else(|| errors::released("holder"))?;
        let d = PyDict::new(py);
        d.set_item("name", &*s.name)?;
        d.set_item("registered", s.registered)?;
        d.set_item("charged", s.totals().charged())?;
        d.set_item("tickets", s.pressure.tickets)?;
        d.set_item("bytes_answered", s.pressure.bytes_answered)?;
        d.set_item("zero_answers", s.pressure.zero_answers)?;
        Ok(d)
    }
    fn unregister(&self, py: Python<'_>) {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        if taken.is_some() {
            py.allow_threads(move || drop(taken));
        }
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.unregister(py);
        false
    }
}
