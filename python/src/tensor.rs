//! DLPack for Python: dtypes by name, the `Tensor` view object, and the
//! `__dlpack__` / `__dlpack_device__` protocol of the Python array API
//! (a versioned `dltensor_versioned` capsule, or a legacy `dltensor` one
//! for a consumer that asks for no version; destructors and deleters are
//! native, so they are safe at interpreter shutdown).

use crate::errors;
use memplug_host::dlpack::private_copy;
use memplug_host::dlpack::{self, DLDataType, ExportOptions, ManagedTensor, SharedRegion, TensorLayout};
use memplug_host::SharedFence;
use memplug_host::{CachedAllocation, OwnedAllocation};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

/// The capsule name of a versioned tensor; a consumer renames it to
/// `used_dltensor_versioned` once it owns the tensor.
const NAME: &CStr = c"dltensor_versioned";

/// What a view exports from.
#[derive(Clone)]
pub enum Source {
    Allocation(Arc<OwnedAllocation>),
    Cached(Arc<CachedAllocation>),
    Region(SharedRegion),
}

impl Source {
    fn export(&self, layout: &TensorLayout, options: ExportOptions) -> PyResult<ManagedTensor> {
        let r = match self {
            Source::Allocation(a) => dlpack::export(a.clone(), layout, options).map_err(|r| r.error),
            Source::Cached(a) => dlpack::export(a.clone(), layout, options).map_err(|r| r.error),
            Source::Region(r) => r.to_dlpack(layout, options),
        };
        r.map_err(errors::export)
    }
}

/// DLPack's element type for a name (`"float32"`, `"f4"`, `"uint8"`, ...),
/// a NumPy dtype (its `str()`), or a NumPy scalar type (its `__name__`).
pub fn dtype_of(obj: &Bound<'_, PyAny>) -> PyResult<DLDataType> {
    let name: String = if let Ok(s) = obj.extract::<String>() {
        s
    } else if let Ok(n) = obj.getattr("__name__").and_then(|n| n.extract::<String>()) {
        n
    } else {
        obj.str()?.extract()?
    };
    use dlpack::{K_DL_BFLOAT, K_DL_BOOL, K_DL_COMPLEX, K_DL_FLOAT, K_DL_INT, K_DL_UINT};
    let (code, bits) = match name.trim_start_matches(['<', '=', '|']) {
        "int8" | "i1" => (K_DL_INT, 8),
        "int16" | "i2" => (K_DL_INT, 16),
        "int32" | "i4" => (K_DL_INT, 32),
        "int64" | "i8" => (K_DL_INT, 64),
        "uint8" | "u1" => (K_DL_UINT, 8),
        "uint16" | "u2" => (K_DL_UINT, 16),
        "uint32" | "u4" => (K_DL_UINT, 32),
        "uint64" | "u8" => (K_DL_UINT, 64),
        "float16" | "f2" => (K_DL_FLOAT, 16),
        "float32" | "f4" => (K_DL_FLOAT, 32),
        "float64" | "f8" => (K_DL_FLOAT, 64),
        "bfloat16" => (K_DL_BFLOAT, 16),
        "complex64" | "c8" => (K_DL_COMPLEX, 64),
        "complex128" | "c16" => (K_DL_COMPLEX, 128),
        "bool" | "b1" | "bool_" => (K_DL_BOOL, 8),
        other => return Err(PyValueError::new_err(format!("unknown dtype {other:?}"))),
    };
    Ok(DLDataType { code, bits, lanes: 1 })
}

/// A layout from Python arguments: a shape (an int or a sequence of ints),
/// a dtype, a byte offset, strides in elements (or `None`).
pub fn layout_of(
    shape: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    offset: u64,
    strides: Option<Vec<i64>>,
) -> PyResult<TensorLayout> {
    let dtype = match dtype {
        Some(d) => dtype_of(d)?,
        None => DLDataType { code: dlpack::K_DL_UINT, bits: 8, lanes: 1 },
    };
    let shape: Vec<i64> = match shape.extract::<i64>() {
        Ok(n) => vec![n],
        Err(_) => shape.extract()?,
    };
    Ok(TensorLayout { shape, dtype, strides, byte_offset: offset })
}

/// What `__dlpack__` hands out for a view whose bytes are mapped without
/// write access (a shared prefix mapped read-only). No consumer may be able
/// to crash the process by writing: PyTorch ignores DLPack's read-only
/// flag and JAX's legacy capsule cannot carry it, so a zero-copy export of
/// such bytes happens only when the caller says its consumer honours the
/// flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnReadOnly {
    /// `"refuse"` (the default): `BufferError`, saying what to choose.
    Refuse,
    /// `"share"`: zero-copy, flagged read-only, to a consumer asking for a
    /// versioned capsule (NumPy 2.1+ honours the flag); refused to a
    /// legacy one, which cannot be told.
    Share,
    /// `"copy"`: a private, writable copy (CPU memory), flagged
    /// `IS_COPIED`; writes stay in the copy.
    Copy,
}

impl OnReadOnly {
    /// The choices, as `view(on_read_only=...)` spells them.
    pub const NAMES: [&'static str; 3] = ["refuse", "share", "copy"];

    pub fn parse(s: &str) -> PyResult<Self> {
        match s {
            "refuse" => Ok(OnReadOnly::Refuse),
            "share" => Ok(OnReadOnly::Share),
            "copy" => Ok(OnReadOnly::Copy),
            other => Err(PyValueError::new_err(format!(
                "on_read_only={other:?}: expected one of {:?} (what a view of read-only memory hands out)",
                Self::NAMES
            ))),
        }
    }
}

/// A typed view of memplug memory: what `numpy.from_dlpack` (or
/// `torch.from_dlpack`) takes. Each `__dlpack__` exports a new tensor
/// (no copy, unless asked) that keeps the memory alive until its consumer
/// lets go.
#[pyclass(frozen, module = "memplug")]
pub struct Tensor {
    source: Source,
    layout: TensorLayout,
    read_only: bool,
    on_read_only: OnReadOnly,
    device: (i32, i32),
    uses: Arc<Uses>,
}

impl Tensor {
    pub fn new(
        source: Source,
        layout: TensorLayout,
        read_only: bool,
        on_read_only: &str,
        device: (i32, i32),
        uses: Arc<Uses>,
    ) -> PyResult<Self> {
        let on_read_only = OnReadOnly::parse(on_read_only)?;
        // Checked now, so a bad view fails where it is made.
        let t = Tensor { source, layout, read_only, on_read_only, device, uses };
        drop(t.source.export(&t.layout, ExportOptions { read_only, fences: Vec::new() })?);
        Ok(t)
    }
}

#[pymethods]
impl Tensor {
    /// Extents.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.layout.shape.clone()
    }
    /// Bytes from the memory's start to the first element.
    #[getter]
    fn offset(&self) -> u64 {
        self.layout.byte_offset
    }
    /// What `__dlpack__` hands out if the view's bytes are mapped
    /// read-only: `"refuse"`, `"share"` or `"copy"`.
    #[getter]
    fn on_read_only(&self) -> &'static str {
        OnReadOnly::NAMES[self.on_read_only as usize]
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
        let req = Request { stream, max_version, dl_device, copy };
        let view = View { read_only: self.read_only, on_read_only: self.on_read_only };
        dlpack_capsule(py, &self.source, &self.layout, view, self.device, &self.uses, req)
    }
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.device
    }
    fn __repr__(&self) -> String {
        format!(
            "memplug.Tensor(shape={:?}, dtype={:?}, offset={}, on_read_only={:?})",
            self.layout.shape,
            self.layout.dtype,
            self.layout.byte_offset,
            self.on_read_only()
        )
    }
}

/// The fences of stream work that last used a piece of memory and may not
/// have completed: an export to the host waits for them (the array API's
/// "synchronise for kDLCPU"), a free goes behind them. Shared by the
/// memory object and its `Tensor` views.
#[derive(Default)]
pub struct Uses(Mutex<Vec<SharedFence>>);

impl Uses {
    fn fences(&self) -> std::sync::MutexGuard<'_, Vec<SharedFence>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Records work on the memory that completes with `fence`.
    pub fn add(&self, fence: SharedFence) {
        let mut f = self.fences();
        f.retain(|f| !matches!(f.query(), Ok(true)));
        f.push(fence);
    }
    /// The fences not yet seen complete.
    pub fn pending(&self) -> Vec<SharedFence> {
        let mut f = self.fences();
        f.retain(|f| !matches!(f.query(), Ok(true)));
        f.clone()
    }
    /// Waits, the GIL released and Ctrl-C honoured, for every pending use.
    /// A fence later on the stream whose host function is exporting is
    /// skipped: the stream already orders it after this work.
    fn wait_all(&self, py: Python<'_>) -> PyResult<()> {
        for f in self.pending().into_iter().filter(|f| !crate::streams::after_running_work(f)) {
            let mut failed = None;
            crate::interp::wait_interruptibly(py, None, |slice| match f.wait(slice) {
                Ok(done) => done,
                Err(e) => {
                    failed = Some(e);
                    true
                }
            })?;
            if let Some(e) = failed {
                return Err(PyBufferError::new_err(format!(
                    "waiting for {} before the export failed: {e}",
                    f.describe()
                )));
            }
        }
        Ok(())
    }
}

/// What the view asks of an export.
#[derive(Clone, Copy)]
pub struct View {
    /// Flag the export read-only (advisory where the bytes are writable).
    pub read_only: bool,
    pub on_read_only: OnReadOnly,
}

impl View {
    /// The memory object's own `__dlpack__`: all of it, nothing chosen.
    pub const WHOLE: View = View { read_only: false, on_read_only: OnReadOnly::Refuse };
}

/// What a `__dlpack__` call asked for.
pub struct Request<'a, 'py> {
    pub stream: Option<&'a Bound<'py, PyAny>>,
    pub max_version: Option<(u32, u32)>,
    pub dl_device: Option<(i32, i32)>,
    pub copy: Option<bool>,
}

/// `__dlpack__` per the Python array API (2023.12):
///
/// * `max_version` of major 1 or later: a versioned capsule
///   (`dltensor_versioned`); `None` (JAX, a consumer older than DLPack
///   1.0) or major 0: a legacy `dltensor` capsule (`DLManagedTensor`),
///   which cannot carry the read-only flag;
/// * `stream`: on kDLCPU only `None` is accepted (`BufferError`
///   otherwise), and the export first waits on the host for the stream
///   work that last used the memory (`Uses`). On a device with streams,
///   `-1` means "no synchronisation"; any other value also waits on the
///   host, which orders every consumer stream after that work;
/// * `dl_device` other than the memory's: `BufferError`;
/// * `copy=True`: a private copy (CPU memory; `BufferError` elsewhere);
///   `copy=False`: never a copy; `None`: a copy only where the view chose
///   `on_read_only="copy"` and its bytes are read-only.
///
/// A view whose bytes are mapped read-only goes out as its
/// [`OnReadOnly`] says: no consumer, honouring the flag or not, gets
/// memory whose first write would crash the process unless the caller
/// chose `"share"` for a consumer that honours the flag.
pub fn dlpack_capsule(
    py: Python<'_>,
    source: &Source,
    layout: &TensorLayout,
    view: View,
    device: (i32, i32),
    uses: &Uses,
    req: Request<'_, '_>,
) -> PyResult<PyObject> {
    if req.dl_device.is_some_and(|d| d != device) {
        return Err(PyBufferError::new_err(format!(
            "the memory is on DLPack device {device:?}, not {:?}",
            req.dl_device
        )));
    }
    let stream = req.stream.filter(|s| !s.is_none());
    if device.0 == dlpack::K_DL_CPU {
        if let Some(s) = stream {
            return Err(PyBufferError::new_err(format!(
                "the memory is on kDLCPU, which has no streams: only stream=None is accepted, not {s}"
            )));
        }
        uses.wait_all(py)?;
    } else if stream.is_none_or(|s| s.extract::<i64>().ok() != Some(-1)) {
        uses.wait_all(py)?;
    }
    let versioned = req.max_version.is_some_and(|(major, _)| major >= dlpack::DLPACK_MAJOR_VERSION);
    let t = source.export(layout, ExportOptions { read_only: view.read_only, fences: Vec::new() })?;
    let t = choose(t, view, versioned, req.copy)?;
    if !versioned && t.is_read_only() {
        return Err(PyBufferError::new_err(
            "this view was made with read_only=True, and the consumer asked for a legacy DLPack capsule (no \
             max_version: JAX, NumPy < 2.1), which cannot carry the read-only flag; make the view without \
             read_only=True for this consumer",
        ));
    }
    let raw = t.into_raw();
    let (ptr, name, destructor): (*mut std::ffi::c_void, &CStr, ffi::PyCapsule_Destructor) = if versioned {
        (raw.cast(), NAME, destructor)
    } else {
        (legacy(raw).cast(), LEGACY_NAME, legacy_destructor)
    };
    // SAFETY: a valid name and pointer; the destructor matches the name.
    let cap = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if cap.is_null() {
        // SAFETY: the tensor was not handed over: its own deleter frees it.
        unsafe {
            if versioned {
                drop(ManagedTensor::from_raw(raw));
            } else {
                legacy_delete(ptr.cast());
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference.
    Ok(unsafe { PyObject::from_owned_ptr(py, cap) })
}

/// What goes out for `t`: itself, a private copy, or a refusal (see
/// [`dlpack_capsule`] and [`OnReadOnly`]).
fn choose(t: ManagedTensor, view: View, versioned: bool, copy: Option<bool>) -> PyResult<ManagedTensor> {
    // A copy that cannot be made is the array API's BufferError, like
    // every other refusal of `__dlpack__`.
    let copied = |t: &ManagedTensor| {
        private_copy(t, view.read_only).map_err(|e| PyBufferError::new_err(e.to_string()))
    };
    if copy == Some(true) {
        return copied(&t);
    }
    if !t.memory_is_read_only() {
        return Ok(t);
    }
    match (view.on_read_only, copy) {
        (OnReadOnly::Copy, None) => copied(&t),
        (OnReadOnly::Copy, _) => Err(PyBufferError::new_err(
            "copy=False, but this view of read-only memory is exported as a copy (on_read_only='copy'); \
             make the view with on_read_only='share' for a zero-copy, read-only export",
        )),
        (OnReadOnly::Share, _) if versioned => Ok(t),
        (OnReadOnly::Share, _) => Err(PyBufferError::new_err(format!(
            "{}: the consumer asked for a legacy DLPack capsule (no max_version; JAX always does), which \
             cannot carry the read-only flag, so on_read_only='share' cannot be honoured; make the view \
             with on_read_only='copy' for a private, writable copy",
            describe(&t)
        ))),
        (OnReadOnly::Refuse, _) => Err(PyBufferError::new_err(format!(
            "{}: writing through it would crash the process, and PyTorch ignores DLPack's read-only flag \
             (JAX's legacy capsule cannot carry it), so memplug does not export it zero-copy unless told \
             how. Make the view with on_read_only='copy' (a private, writable copy: PyTorch, JAX), or \
             on_read_only='share' (zero-copy, flagged read-only: only for a consumer that honours the \
             flag, such as NumPy 2.1+); or pass copy=True to numpy/torch.from_dlpack; or make the range \
             private first (Region.privatise)",
            describe(&t)
        ))),
    }
}

/// The exported bytes, for a refusal.
fn describe(t: &ManagedTensor) -> String {
    format!(
        "the view at {:#x} (shape {:?}) reaches into a shared prefix mapped read-only",
        t.data(),
        t.shape()
    )
}

/// Runs the tensor's deleter unless a consumer took it (and renamed the
/// capsule): an unconsumed capsule still owns its tensor.
unsafe extern "C" fn destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let p =
                ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<dlpack::DLManagedTensorVersioned>();
            if let Some(delete) = p.as_ref().and_then(|t| t.deleter) {
                delete(p);
            }
        }
    }
}

/// The legacy capsule name; a consumer renames it `used_dltensor`.
const LEGACY_NAME: &CStr = c"dltensor";

/// A legacy tensor in front of a versioned one: the same `DLTensor` (its
/// shape and strides point into the versioned block, which lives until
/// the legacy deleter runs the versioned one).
fn legacy(v: *mut dlpack::DLManagedTensorVersioned) -> *mut dlpack::DLManagedTensor {
    // SAFETY: `v` is a live tensor we own; `DLTensor` is plain data, read
    // bitwise (it owns nothing).
    let dl_tensor = unsafe { std::ptr::read(&(*v).dl_tensor) };
    Box::into_raw(Box::new(dlpack::DLManagedTensor {
        dl_tensor,
        manager_ctx: v.cast(),
        deleter: Some(legacy_delete),
    }))
}

/// The legacy tensor's deleter: frees it, then runs the versioned one's.
/// Native, never unwinding; safe on any thread at any time.
unsafe extern "C" fn legacy_delete(p: *mut dlpack::DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: made by `legacy` (the consumer's contract: called once).
    let b = unsafe { Box::from_raw(p) };
    let v = b.manager_ctx.cast::<dlpack::DLManagedTensorVersioned>();
    drop(b);
    // SAFETY: the versioned tensor `legacy` wrapped, still owned.
    if let Some(delete) = unsafe { v.as_ref() }.and_then(|t| t.deleter) {
        unsafe { delete(v) }
    }
}

/// [`destructor`] for a legacy capsule.
unsafe extern "C" fn legacy_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            let p =
                ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()).cast::<dlpack::DLManagedTensor>();
            legacy_delete(p);
        }
    }
}
