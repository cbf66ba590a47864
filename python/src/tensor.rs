//! DLPack for Python: dtypes by name, the `Tensor` view object, and the
//! `__dlpack__` / `__dlpack_device__` protocol of the Python array API
//! (the capsule is a versioned `dltensor_versioned`; its destructor is
//! native, so it is safe at interpreter shutdown).

use crate::errors;
use memplug_host::dlpack::{self, DLDataType, ExportOptions, ManagedTensor, SharedRegion, TensorLayout};
use memplug_host::{CachedAllocation, OwnedAllocation};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::CStr;
use std::sync::Arc;

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

/// A typed view of memplug memory: what `numpy.from_dlpack` (or
/// `torch.from_dlpack`) takes. Each `__dlpack__` exports a new tensor
/// (no copy) that keeps the memory alive until its consumer lets go.
#[pyclass(frozen, module = "memplug")]
pub struct Tensor {
    source: Source,
    layout: TensorLayout,
    read_only: bool,
    device: (i32, i32),
}

impl Tensor {
    pub fn new(source: Source, layout: TensorLayout, read_only: bool, device: (i32, i32)) -> PyResult<Self> {
        // Checked now, so a bad view fails where it is made.
        let t = Tensor { source, layout, read_only, device };
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
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        dlpack_capsule(
            py,
            &self.source,
            &self.layout,
            self.read_only,
            self.device,
            stream,
            max_version,
            dl_device,
            copy,
        )
    }
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.device
    }
    fn __repr__(&self) -> String {
        format!(
            "memplug.Tensor(shape={:?}, dtype={:?}, offset={})",
            self.layout.shape, self.layout.dtype, self.layout.byte_offset
        )
    }
}

/// `__dlpack__` per the Python array API: a versioned capsule (DLPack
/// 1.x) for a consumer that asks for major 1 or later; refused with
/// `BufferError` for a legacy consumer (no `max_version`), for another
/// device, and for `copy=True` (memplug exports without copying).
#[allow(clippy::too_many_arguments)]
pub fn dlpack_capsule(
    py: Python<'_>,
    source: &Source,
    layout: &TensorLayout,
    read_only: bool,
    device: (i32, i32),
    stream: Option<&Bound<'_, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<PyObject> {
    if copy == Some(true) {
        return Err(PyBufferError::new_err("memplug exports its memory without copying (copy=True refused)"));
    }
    if dl_device.is_some_and(|d| d != device) {
        return Err(PyBufferError::new_err(format!(
            "the memory is on DLPack device {device:?}, not {dl_device:?}"
        )));
    }
    match max_version {
        Some((major, _)) if major >= dlpack::DLPACK_MAJOR_VERSION => {}
        _ => {
            return Err(PyBufferError::new_err(
                "memplug exports versioned DLPack tensors (1.x) only: pass max_version=(1, 0) or later",
            ))
        }
    }
    // A CPU consumer passes no stream; a device consumer's stream has
    // nothing to wait for here: memplug queues no work of its own on the
    // memory (callers order their own work with fences).
    let _ = stream;
    let t = source.export(layout, ExportOptions { read_only, fences: Vec::new() })?;
    let raw = t.into_raw();
    // SAFETY: a valid name and pointer; the destructor is `destructor`.
    let cap = unsafe { ffi::PyCapsule_New(raw.cast(), NAME.as_ptr(), Some(destructor)) };
    if cap.is_null() {
        // SAFETY: the tensor was not handed over.
        drop(unsafe { ManagedTensor::from_raw(raw) });
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference.
    Ok(unsafe { PyObject::from_owned_ptr(py, cap) })
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
