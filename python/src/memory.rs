//! Bindings and what they make: plain and caching bindings, allocations,
//! cached allocations and shared prefixes. Every call that may wait
//! (allocation under pressure, frees that call the plugin) releases the
//! GIL, so pressure callbacks and other Python threads run meanwhile.

use crate::errors;
use crate::region::Region;
use crate::tensor::{dlpack_capsule, layout_of, Source, Tensor};
use memplug_host::dlpack::TensorLayout;
use memplug_host::{CachedAllocation as HostCached, CachingBinding as HostCaching};
use memplug_host::{MemoryBinding, OwnedAllocation, SharedPrefix as HostPrefix};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex};

/// A binding: memory from one mechanism, charged to one pool, holder and
/// class.
#[pyclass(frozen, module = "memplug")]
pub struct Binding {
    pub(crate) inner: MemoryBinding,
    pub(crate) device: (i32, i32),
}

#[pymethods]
impl Binding {
    /// Allocates `size` bytes aligned to `alignment`; raises `OutOfBudget`
    /// when the pool has no room after pressure (and the binding's wait).
    #[pyo3(signature = (size, alignment=256))]
    fn allocate(&self, py: Python<'_>, size: u64, alignment: u64) -> PyResult<Allocation> {
        let b = self.inner.clone();
        let a = py.allow_threads(move || b.allocate(size, alignment)).map_err(errors::binding)?;
        Ok(Allocation::new(a, self.device))
    }
    /// Reserves `max_bytes` of address space for a region that grows at a
    /// stable base; nothing is charged until it grows.
    fn reserve(&self, py: Python<'_>, max_bytes: u64) -> PyResult<Region> {
        let b = self.inner.clone();
        let r = py.allow_threads(move || b.reserve_virtual(max_bytes)).map_err(errors::binding)?;
        Ok(Region::new(r, self.device))
    }
    /// A shared prefix of `size` bytes (rounded up to the granularity),
    /// charged once, starting with `data`; regions map it read-only.
    #[pyo3(signature = (size, data=None))]
    fn create_shared(&self, py: Python<'_>, size: u64, data: Option<Vec<u8>>) -> PyResult<SharedPrefix> {
        let data = data.unwrap_or_default();
        if data.len() as u64 > size {
            return Err(errors::invalid(format!("{} B of data for a prefix of {size} B", data.len())));
        }
        let b = self.inner.clone();
        let p = py
            .allow_threads(move || {
                b.create_shared(size, |view| {
                    // SAFETY: the CPU mechanism's memory, writable through
                    // this temporary view only; `data` fits (checked).
                    unsafe { view.as_mut_slice()[..data.len()].copy_from_slice(&data) }
                })
            })
            .map_err(errors::binding)?;
        Ok(SharedPrefix { inner: p })
    }
    /// The class its charges count under.
    #[getter]
    fn alloc_class(&self) -> &'static str {
        self.inner.class().name()
    }
}

/// A caching binding: freed blocks are kept (charged, reported as idle)
/// and reused by size class; idle bytes go first under pressure.
#[pyclass(frozen, module = "memplug")]
pub struct CachingBinding {
    pub(crate) inner: HostCaching,
    pub(crate) device: (i32, i32),
}

#[pymethods]
impl CachingBinding {
    #[pyo3(signature = (size, alignment=256))]
    fn allocate(&self, py: Python<'_>, size: u64, alignment: u64) -> PyResult<CachedAllocation> {
        let c = self.inner.clone();
        let a = py.allow_threads(move || c.allocate(size, alignment)).map_err(errors::binding)?;
        let (addr, size) = (a.addr(), a.size());
        Ok(CachedAllocation { inner: Mutex::new(Some(Arc::new(a))), addr, size, device: self.device })
    }
    /// Gives up to `bytes` idle bytes back; returns the bytes given back.
    fn trim(&self, py: Python<'_>, bytes: u64) -> u64 {
        let c = self.inner.clone();
        py.allow_threads(move || c.trim(bytes))
    }
    /// Hits, misses, idle and in-use bytes and blocks.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("hits", s.hits),
            ("misses", s.misses),
            ("bypasses", s.bypasses),
            ("idle_bytes", s.idle_bytes),
            ("idle_blocks", s.idle_blocks),
            ("pending_blocks", s.pending_blocks),
            ("in_use_bytes", s.in_use_bytes),
            ("in_use_blocks", s.in_use_blocks),
            ("trimmed_bytes", s.trimmed_bytes),
            ("pressure_bytes", s.pressure_bytes),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}

/// Drops a host object with the GIL released (its free may call the
/// plugin and the governor).
fn release_outside_gil<T: Send>(py: Python<'_>, v: Option<T>) {
    if v.is_some() {
        py.allow_threads(move || drop(v));
    }
}

/// The DLPack methods every memory object shares: the whole of it as bytes
/// (`__dlpack__`), or a typed view (`view`).
macro_rules! dlpack_methods {
    ($ty:ty) => {
        #[pymethods]
        impl $ty {
            /// A typed view for `numpy.from_dlpack`: `shape` (an int or a
            /// tuple), `dtype` (a name or a NumPy dtype; `uint8` when `None`), `offset` in bytes,
            /// `strides` in elements (row-major when `None`).
            #[pyo3(signature = (shape, dtype=None, offset=0, strides=None, read_only=false))]
            fn view(
                &self,
                shape: &Bound<'_, PyAny>,
                dtype: Option<&Bound<'_, PyAny>>,
                offset: u64,
                strides: Option<Vec<i64>>,
                read_only: bool,
            ) -> PyResult<Tensor> {
                Tensor::new(self.source()?, layout_of(shape, dtype, offset, strides)?, read_only, self.device)
            }
            #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
            fn __dlpack__(
                &self,
                py: Python<'_>,
                stream: Option<&Bound<'_, PyAny>>,
                max_version: Option<(u32, u32)>,
                dl_device: Option<(i32, i32)>,
                copy: Option<bool>,
            ) -> PyResult<PyObject> {
                let (source, len) = (self.source()?, self.len_now());
                let layout = TensorLayout::bytes(len);
                dlpack_capsule(py, &source, &layout, false, self.device, stream, max_version, dl_device, copy)
            }
            fn __dlpack_device__(&self) -> (i32, i32) {
                self.device
            }
            fn __enter__(slf: Py<Self>) -> Py<Self> {
                slf
            }
            #[pyo3(signature = (*_args))]
            fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
                self.release(py);
                false
            }
        }
    };
}
pub(crate) use dlpack_methods;

/// An allocation. `free()` (or leaving a `with` block) releases this
/// handle; the memory is freed once no exported tensor uses it.
#[pyclass(frozen, module = "memplug")]
pub struct Allocation {
    inner: Mutex<Option<Arc<OwnedAllocation>>>,
    addr: u64,
    size: u64,
    device: (i32, i32),
}

impl Allocation {
    fn new(a: OwnedAllocation, device: (i32, i32)) -> Self {
        let (addr, size) = (a.addr(), a.size());
        Allocation { inner: Mutex::new(Some(Arc::new(a))), addr, size, device }
    }
    fn source(&self) -> PyResult<Source> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.clone().map(Source::Allocation).ok_or_else(|| errors::released("allocation"))
    }
    fn len_now(&self) -> u64 {
        self.size
    }
    fn release(&self, py: Python<'_>) {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        release_outside_gil(py, taken);
    }
}

#[pymethods]
impl Allocation {
    /// The first byte's address (host memory on the CPU plugin).
    #[getter]
    fn addr(&self) -> u64 {
        self.addr
    }
    /// Usable bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }
    /// Whether `free()` was called.
    #[getter]
    fn freed(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }
    /// Releases this handle (idempotent).
    fn free(&self, py: Python<'_>) {
        self.release(py);
    }
    fn __repr__(&self) -> String {
        format!("memplug.Allocation(addr={:#x}, size={})", self.addr, self.size)
    }
}
dlpack_methods!(Allocation);

/// A block of a caching binding; `free()` gives it back to the cache once
/// no exported tensor uses it.
#[pyclass(frozen, module = "memplug")]
pub struct CachedAllocation {
    inner: Mutex<Option<Arc<HostCached>>>,
    addr: u64,
    size: u64,
    device: (i32, i32),
}

impl CachedAllocation {
    fn source(&self) -> PyResult<Source> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.clone().map(Source::Cached).ok_or_else(|| errors::released("cached allocation"))
    }
    fn len_now(&self) -> u64 {
        self.size
    }
    fn release(&self, py: Python<'_>) {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        release_outside_gil(py, taken);
    }
}

#[pymethods]
impl CachedAllocation {
    #[getter]
    fn addr(&self) -> u64 {
        self.addr
    }
    /// Bytes requested.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }
    fn free(&self, py: Python<'_>) {
        self.release(py);
    }
    fn __repr__(&self) -> String {
        format!("memplug.CachedAllocation(addr={:#x}, size={})", self.addr, self.size)
    }
}
dlpack_methods!(CachedAllocation);

/// A shared prefix (a system prompt's KV, say): charged once, mapped
/// read-only at the start of any number of regions.
#[pyclass(frozen, module = "memplug")]
pub struct SharedPrefix {
    pub(crate) inner: Arc<HostPrefix>,
}

#[pymethods]
impl SharedPrefix {
    /// Bytes (rounded up to the granularity).
    #[getter]
    fn len(&self) -> u64 {
        self.inner.len()
    }
    /// Bytes charged to the pool (once, however many regions map it).
    #[getter]
    fn charged(&self) -> u64 {
        self.inner.charged()
    }
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }
}
