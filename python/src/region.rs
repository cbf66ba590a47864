//! Regions: address space that grows in place (a KV cache), optionally
//! after a shared prefix mapped read-only. NumPy views of it stay valid as
//! it grows; it refuses to shrink under a live view.

use crate::errors;
use crate::memory::{dlpack_methods, Binding, SharedPrefix};
use crate::streams::{secs, Fence, Stream};
use crate::tensor::{dlpack_capsule, layout_of, Request, Source, Tensor, Uses};
use memplug_host::dlpack::{SharedRegion, TensorLayout};
use memplug_host::{GrowError, Residence};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex};

/// A region: `grow_to` commits (and charges) more bytes at the same base;
/// an update callback that raises undoes the grow.
#[pyclass(frozen, module = "memplug")]
pub struct Region {
    inner: Mutex<Option<SharedRegion>>,
    addr: u64,
    device: (i32, i32),
    uses: Arc<Uses>,
}

impl Region {
    pub(crate) fn new(r: memplug_host::Region, device: (i32, i32)) -> Self {
        let addr = r.addr();
        Region { inner: Mutex::new(Some(SharedRegion::new(r))), addr, device, uses: Arc::default() }
    }
    pub(crate) fn shared(&self) -> PyResult<SharedRegion> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.clone().ok_or_else(|| errors::released("region"))
    }
    fn source(&self) -> PyResult<Source> {
        self.shared().map(Source::Region)
    }
    fn len_now(&self) -> u64 {
        self.shared().map_or(0, |r| r.view().len)
    }
    /// Takes the region out, its recorded uses handed to it (its release
    /// waits for them).
    fn take(&self) -> Option<SharedRegion> {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        for f in self.uses.pending() {
            taken.used_by(f);
        }
        Some(taken)
    }
    fn release(&self, py: Python<'_>) {
        if let Some(r) = self.take() {
            py.allow_threads(move || drop(r));
        }
    }
}

#[pymethods]
impl Region {
    /// The base address; the same for the region's whole life.
    #[getter]
    fn addr(&self) -> u64 {
        self.addr
    }
    /// Usable bytes: the prefix and the committed part.
    #[getter]
    fn len(&self) -> PyResult<u64> {
        Ok(self.shared()?.view().len)
    }
    /// Address space reserved.
    #[getter]
    fn capacity(&self) -> PyResult<u64> {
        Ok(self.shared()?.with(|r| r.capacity()))
    }
    /// Private bytes committed (and charged).
    #[getter]
    fn committed(&self) -> PyResult<u64> {
        Ok(self.shared()?.with(|r| r.committed()))
    }
    /// Whether a prefix is mapped read-only at the start.
    #[getter]
    fn prefix_is_read_only(&self) -> PyResult<bool> {
        Ok(self.shared()?.with(|r| r.prefix_is_read_only()))
    }
    /// Exported views still alive.
    #[getter]
    fn views(&self) -> PyResult<usize> {
        Ok(self.shared()?.views())
    }
    /// Grows to at least `len` usable bytes: grant → commit → `update(addr,
    /// len)` → charge. If `update` raises, the new bytes are decommitted,
    /// the grant returned, and its exception raised here. Waits for
    /// pressure with the GIL released (the callback takes it back).
    #[pyo3(signature = (len, update=None))]
    fn grow_to(&self, py: Python<'_>, len: u64, update: Option<PyObject>) -> PyResult<()> {
        let r = self.shared()?;
        let result = py.allow_threads(move || {
            r.grow_to(len, |view| match &update {
                None => Ok(()),
                Some(f) => Python::with_gil(|py| f.call1(py, (view.addr, view.len)).map(drop)),
            })
        });
        match result {
            Ok(()) => Ok(()),
            Err(GrowError::Update(e)) => Err(e),
            Err(GrowError::Binding(e)) => Err(errors::binding(e)),
        }
    }
    /// Grows to at least `len` usable bytes as a queued operation on
    /// `stream` (the mechanism's queued binding): the commit runs after the
    /// work already on the stream; the returned `Fence` completes once the
    /// new bytes are usable. Charged at once; exports to the host wait for
    /// the fence. A mechanism without queued binding raises `Unsupported`.
    fn grow_on(&self, py: Python<'_>, len: u64, stream: &Stream) -> PyResult<Fence> {
        let r = self.shared()?;
        let fence = stream.with(|s| py.allow_threads(|| r.grow_on(len, s)).map_err(errors::binding))?;
        let fence = Fence::recorded(fence);
        self.uses.add(fence.shared.clone());
        Ok(fence)
    }
    /// Shrinks the private part to `len` usable bytes; refused
    /// (`InvalidState`) while a view exported from the region is alive.
    fn shrink_to(&self, py: Python<'_>, len: u64) -> PyResult<()> {
        let (r, fences) = (self.shared()?, self.uses.pending());
        py.allow_threads(move || r.shrink_to(len, fences)).map_err(errors::binding)
    }
    /// Moves the private bytes to memory of `target` (a host binding) and
    /// gives the device range back; `restore` brings them back at the same
    /// address. Returns `{"released": bytes decommitted, "kept": bytes the
    /// mechanism would not decommit}`. A transaction: on any error the
    /// region is as it was. Refused while a view exported from it is alive.
    #[pyo3(signature = (target, stream, timeout=10.0))]
    fn offload_to<'py>(
        &self,
        py: Python<'py>,
        target: &Binding,
        stream: &Stream,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (r, t, timeout) = (self.shared()?, target.inner.clone(), secs("timeout", timeout)?);
        let report =
            stream.with(|s| py.allow_threads(|| r.offload_to(&t, s, timeout)).map_err(errors::binding))?;
        let d = PyDict::new(py);
        d.set_item("released", report.released)?;
        d.set_item("kept", report.kept)?;
        Ok(d)
    }
    /// Recommits the offloaded bytes at the same address and copies them
    /// back on `stream`; the returned `Fence` completes once they are there
    /// (work later on `stream` is already ordered after it).
    fn restore(&self, py: Python<'_>, stream: &Stream) -> PyResult<Fence> {
        let r = self.shared()?;
        let fence = stream.with(|s| py.allow_threads(|| r.restore(s)).map_err(errors::binding))?;
        self.uses.add(fence.clone());
        Ok(Fence { shared: fence, recorded: None })
    }
    /// Gives this region a private copy of `[offset, offset + len)` of its
    /// shared prefix (granule-aligned); the other regions keep the shared
    /// bytes. The `Fence` completes once the copy is in place.
    #[pyo3(signature = (offset, len, stream, timeout=10.0))]
    fn privatise(
        &self,
        py: Python<'_>,
        offset: u64,
        len: u64,
        stream: &Stream,
        timeout: f64,
    ) -> PyResult<Fence> {
        let (r, timeout) = (self.shared()?, secs("timeout", timeout)?);
        let fence = stream
            .with(|s| py.allow_threads(|| r.privatise(offset, len, s, timeout)).map_err(errors::binding))?;
        self.uses.add(fence.clone());
        Ok(Fence { shared: fence, recorded: None })
    }
    /// Where the private bytes are: `("device", 0, 0)`, or `("host", addr,
    /// bytes)` while offloaded.
    #[getter]
    fn residence(&self) -> PyResult<(&'static str, u64, u64)> {
        Ok(match self.shared()?.residence() {
            Residence::Device => ("device", 0, 0),
            Residence::Host { addr, bytes } => ("host", addr, bytes),
        })
    }
    /// Maps `prefix` read-only at the start of this empty region.
    fn map_prefix(&self, py: Python<'_>, prefix: &SharedPrefix) -> PyResult<()> {
        let (r, p) = (self.shared()?, prefix.inner.clone());
        py.allow_threads(move || r.map_prefix(&p)).map_err(errors::binding)
    }
    /// Releases this handle (idempotent); the region is freed once no view
    /// uses it.
    fn close(&self, py: Python<'_>) {
        self.release(py);
    }
    fn __repr__(&self) -> String {
        format!("memplug.Region(addr={:#x}, len={})", self.addr, self.len_now())
    }
}
dlpack_methods!(Region);

impl Drop for Region {
    /// Garbage collected without `close()`: still behind its recorded uses.
    fn drop(&mut self) {
        drop(self.take());
    }
}
