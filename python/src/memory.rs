//! Bindings and what they make: plain and caching bindings, allocations,
//! cached allocations and shared prefixes. Every call that may wait
//! (allocation under pressure, frees that call the plugin) releases the
//! GIL, so pressure callbacks and other Python threads run meanwhile.

use crate::errors;
use crate::region::Region;
use crate::streams::{Fence, Stream};
use crate::tensor::{dlpack_capsule, layout_of, Request, Source, Tensor, Uses};
use memplug_host::dlpack::TensorLayout;
use memplug_host::{CachedAllocation as HostCached, CachingBinding as HostCaching, StreamKey};
use memplug_host::{DeferredFreeQueue, Retire, RetireOutcome, SharedFence};
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
    /// The manager's deferred-free queue, for frees behind fences that
    /// cannot go through the host object itself (it is shared with live
    /// exports).
    pub(crate) queue: Arc<DeferredFreeQueue>,
}

#[pymethods]
impl Binding {
    /// Allocates `size` bytes aligned to `alignment`; raises `OutOfBudget`
    /// when the pool has no room after pressure (and the binding's wait).
    #[pyo3(signature = (size, alignment=256))]
    fn allocate(&self, py: Python<'_>, size: u64, alignment: u64) -> PyResult<Allocation> {
        let b = self.inner.clone();
        let a = py.allow_threads(move || b.allocate(size, alignment)).map_err(errors::binding)?;
        Ok(Allocation::new(a, self.device, self.queue.clone()))
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
    pub(crate) queue: Arc<DeferredFreeQueue>,
}

/// A stream as the cache keys it: a memplug `Stream`, or an int (a
/// runtime's own stream handle, e.g. a `cudaStream_t`; equal ints must be
/// the same stream).
fn stream_key(stream: &Bound<'_, PyAny>) -> PyResult<StreamKey> {
    if let Ok(s) = stream.downcast::<Stream>() {
        return s.get().key();
    }
    match stream.extract::<u64>() {
        Ok(h) => Ok(StreamKey::runtime(h)),
        Err(_) => Err(errors::invalid(format!(
            "a stream is a memplug.Stream or an int runtime handle, not {}",
            stream.get_type().name()?
        ))),
    }
}

impl CachingBinding {
    fn wrap(&self, a: HostCached, uses: Uses) -> CachedAllocation {
        let (addr, size) = (a.addr(), a.size());
        CachedAllocation {
            inner: Mutex::new(Some(Arc::new(a))),
            addr,
            size,
            device: self.device,
            uses: Arc::new(uses),
            pins: Uses::default(),
            queue: self.queue.clone(),
        }
    }
}

#[pymethods]
impl CachingBinding {
    #[pyo3(signature = (size, alignment=256))]
    fn allocate(&self, py: Python<'_>, size: u64, alignment: u64) -> PyResult<CachedAllocation> {
        let c = self.inner.clone();
        let a = py.allow_threads(move || c.allocate(size, alignment)).map_err(errors::binding)?;
        Ok(self.wrap(a, Uses::default()))
    }
    /// A block for work on `stream` (a memplug `Stream` or an int runtime
    /// handle): it may reuse a block freed on that stream whose work has
    /// not completed, since the stream runs in order. On a memplug stream
    /// a fence is recorded after the allocation, so host access (an
    /// export to the CPU) first waits for the earlier work; on a runtime
    /// stream that ordering is the runtime's.
    #[pyo3(signature = (size, stream, alignment=256))]
    fn allocate_on(
        &self,
        py: Python<'_>,
        size: u64,
        stream: &Bound<'_, PyAny>,
        alignment: u64,
    ) -> PyResult<CachedAllocation> {
        let key = stream_key(stream)?;
        let c = self.inner.clone();
        let a = py.allow_threads(move || c.allocate_on(size, alignment, key)).map_err(errors::binding)?;
        let uses = Uses::default();
        if let Ok(s) = stream.downcast::<Stream>() {
            uses.add(s.get().record()?.shared.clone());
        }
        Ok(self.wrap(a, uses))
    }
    /// Gives up to `bytes` idle bytes back; returns the bytes given back.
    fn trim(&self, py: Python<'_>, bytes: u64) -> u64 {
        let c = self.inner.clone();
        py.allow_threads(move || c.trim(bytes))
    }
    /// Applies the idle policy now (age, cap, usage threshold); returns the
    /// bytes given back.
    fn collect(&self, py: Python<'_>) -> u64 {
        let c = self.inner.clone();
        py.allow_threads(move || c.collect())
    }
    /// The cap on idle bytes this cache applies (`2**64 - 1`: none).
    #[getter]
    fn max_idle_bytes(&self) -> u64 {
        self.inner.max_idle_bytes()
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
            ("pinned_blocks", s.pinned_blocks),
            ("trimmed_bytes", s.trimmed_bytes),
            ("pressure_bytes", s.pressure_bytes),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}

/// A deferred-free job that drops a shared handle once its fences have
/// completed: the memory is freed when that was the last reference, or
/// when the last export lets go after it.
struct DropLater<T: Send> {
    owner: Option<T>,
    what: String,
}

impl<T: Send> Retire for DropLater<T> {
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        drop(self.owner.take());
        // The charge is refunded by the handle's own release.
        RetireOutcome::Freed { bytes: 0 }
    }
    fn describe(&self) -> String {
        self.what.clone()
    }
}

/// Releases `owner` behind `fences` through `queue` (none: at once).
fn drop_behind<T: Send + 'static>(
    queue: &DeferredFreeQueue,
    owner: T,
    fences: Vec<SharedFence>,
    what: String,
) {
    if fences.is_empty() {
        drop(owner);
    } else {
        queue.release(fences, Box::new(DropLater { owner: Some(owner), what }));
    }
}

/// Fences from Python `Fence` objects.
fn fences_of(fences: Vec<PyRef<'_, Fence>>) -> Vec<SharedFence> {
    fences.iter().map(|f| f.shared.clone()).collect()
}

/// The DLPack methods every memory object shares: the whole of it as bytes
/// (`__dlpack__`), or a typed view (`view`).
macro_rules! dlpack_methods {
    ($ty:ty) => {
        #[pymethods]
        impl $ty {
            /// A typed view for `numpy.from_dlpack`: `shape` (an int or a
            /// tuple), `dtype` (a name or a NumPy dtype; `uint8` when `None`), `offset` in bytes,
            /// `strides` in elements (row-major when `None`), `read_only` (the flag only),
            /// `on_read_only` (`"refuse"`, `"share"` or `"copy"`: what goes out when the bytes
            /// are mapped read-only, see `OnReadOnly`).
            #[pyo3(signature = (shape, dtype=None, offset=0, strides=None, read_only=false, on_read_only="refuse"))]
            fn view(
                &self,
                shape: &Bound<'_, PyAny>,
                dtype: Option<&Bound<'_, PyAny>>,
                offset: u64,
                strides: Option<Vec<i64>>,
                read_only: bool,
                on_read_only: &str,
            ) -> PyResult<Tensor> {
                let layout = layout_of(shape, dtype, offset, strides)?;
                Tensor::new(self.source()?, layout, read_only, on_read_only, self.device, self.uses.clone())
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
                let req = Request { stream, max_version, dl_device, copy };
                let view = crate::tensor::View::WHOLE;
                dlpack_capsule(py, &source, &layout, view, self.device, &self.uses, req)
            }
            fn __dlpack_device__(&self) -> (i32, i32) {
                self.device
            }
            /// Records stream work that uses this memory until `fence`
            /// completes: exports to the host wait for it, frees go
            /// behind it.
            fn used_by(&self, fence: &Fence) {
                self.uses.add(fence.shared.clone());
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
    uses: Arc<Uses>,
    /// UCX registrations' pins (`Ucx.register_allocation`): the free waits
    /// for them as for `uses`, but exports do not (a reader of a
    /// registered allocation would otherwise wait for its deregistration).
    pins: Uses,
    queue: Arc<DeferredFreeQueue>,
}

impl Allocation {
    fn new(a: OwnedAllocation, device: (i32, i32), queue: Arc<DeferredFreeQueue>) -> Self {
        let (addr, size) = (a.addr(), a.size());
        let uses = Arc::default();
        let pins = Uses::default();
        Allocation { inner: Mutex::new(Some(Arc::new(a))), addr, size, device, uses, pins, queue }
    }
    /// Runs `f` with the host allocation, its uses and its pins, under the
    /// handle's lock, so that a `free()` meanwhile waits and then sees
    /// what `f` recorded (`ucx.rs`). `None` once freed.
    pub(crate) fn with_parts<R>(
        &self,
        f: impl FnOnce(&Arc<OwnedAllocation>, &Uses, &Uses) -> R,
    ) -> Option<R> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|a| f(a, &self.uses, &self.pins))
    }
    /// Releases this handle behind `fences` and the recorded uses: through
    /// the host allocation's own `release_after` when no export shares
    /// it, else by dropping the shared handle behind them.
    fn release_after(&self, mut fences: Vec<SharedFence>) -> Option<impl FnOnce() + Send> {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        fences.extend(self.uses.pending());
        fences.extend(self.pins.pending());
        let (queue, what) = (self.queue.clone(), format!("{self:?}"));
        Some(move || match Arc::try_unwrap(taken) {
            Ok(a) => a.release_after(fences),
            Err(shared) => drop_behind(&queue, shared, fences, what),
        })
    }
    fn source(&self) -> PyResult<Source> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.clone().map(Source::Allocation).ok_or_else(|| errors::released("allocation"))
    }
    fn len_now(&self) -> u64 {
        self.size
    }
    fn release(&self, py: Python<'_>) {
        if let Some(free) = self.release_after(Vec::new()) {
            py.allow_threads(free);
        }
    }
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "memplug.Allocation(addr={:#x}, size={})", self.addr, self.size)
    }
}

impl Drop for Allocation {
    /// Garbage collected without `free()`: still behind its recorded uses.
    fn drop(&mut self) {
        if let Some(free) = self.release_after(Vec::new()) {
            free();
        }
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
    /// Releases this handle (idempotent), behind any use recorded with
    /// `used_by`.
    fn free(&self, py: Python<'_>) {
        self.release(py);
    }
    /// Releases this handle behind `fences` (and any recorded use): the
    /// memory stays allocated and charged until they complete and the
    /// manager polls (`poll`, `drain`); never blocks.
    fn free_after(&self, py: Python<'_>, fences: Vec<PyRef<'_, Fence>>) -> PyResult<()> {
        let free = self.release_after(fences_of(fences)).ok_or_else(|| errors::released("allocation"))?;
        py.allow_threads(free);
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!("{self:?}")
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
    uses: Arc<Uses>,
    /// UCX registrations' and transfers' pins (`ucx.rs`): the block's free
    /// hands them to the cache (`pinned_by`), which then reuses the block
    /// for nobody, on the stream it was freed on neither, until they
    /// complete; exports do not wait for them.
    pins: Uses,
    queue: Arc<DeferredFreeQueue>,
}

impl CachedAllocation {
    /// Runs `f` with the host block, its uses and its pins, under the
    /// handle's lock, so that a `free()` meanwhile waits and then sees
    /// what `f` recorded (`ucx.rs`). `None` once freed.
    pub(crate) fn with_parts<R>(&self, f: impl FnOnce(&Arc<HostCached>, &Uses, &Uses) -> R) -> Option<R> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|a| f(a, &self.uses, &self.pins))
    }
    fn source(&self) -> PyResult<Source> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.clone().map(Source::Cached).ok_or_else(|| errors::released("cached allocation"))
    }
    fn len_now(&self) -> u64 {
        self.size
    }
    /// Gives the block back: on `stream` behind `fence` (the cache's
    /// stream-ordered reuse) when no export shares it, else by dropping
    /// the shared handle behind the fences; the recorded uses go with it.
    fn give_back(&self, on: Option<(StreamKey, SharedFence)>) -> Option<impl FnOnce() + Send> {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        let uses = self.uses.pending();
        let pins = self.pins.pending();
        let (queue, what) = (self.queue.clone(), format!("{self:?}"));
        Some(move || match Arc::try_unwrap(taken) {
            Ok(mut a) => {
                for f in pins {
                    a.pinned_by(f);
                }
                for f in uses {
                    a.used_by(f);
                }
                match on {
                    Some((key, fence)) => a.free_on(key, fence),
                    None => drop(a),
                }
            }
            Err(shared) => {
                let fences = uses.into_iter().chain(pins).chain(on.map(|(_, f)| f)).collect();
                drop_behind(&queue, shared, fences, what)
            }
        })
    }
    fn release(&self, py: Python<'_>) {
        if let Some(back) = self.give_back(None) {
            py.allow_threads(back);
        }
    }
}

impl std::fmt::Debug for CachedAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "memplug.CachedAllocation(addr={:#x}, size={})", self.addr, self.size)
    }
}

impl Drop for CachedAllocation {
    fn drop(&mut self) {
        if let Some(back) = self.give_back(None) {
            back();
        }
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
    /// Gives the block back behind `fence`, the last work using it on
    /// `stream` (a memplug `Stream` or an int runtime handle): a request
    /// on the same stream (`allocate_on`) may reuse it at once, any other
    /// only once `fence` completes.
    fn free_on(&self, py: Python<'_>, stream: &Bound<'_, PyAny>, fence: &Fence) -> PyResult<()> {
        let key = stream_key(stream)?;
        let back = self
            .give_back(Some((key, fence.shared.clone())))
            .ok_or_else(|| errors::released("cached allocation"))?;
        py.allow_threads(back);
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!("{self:?}")
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
