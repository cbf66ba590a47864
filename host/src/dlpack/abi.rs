//! The `#[repr(C)]` mirror of DLPack 1.x's exchange structs, as declared by
//! the vendored `include/dlpack/dlpack.h` (`tests/dlpack_layout.rs` compiles
//! static assertions of every size, alignment, offset and constant below
//! against that header). Only what an exporter fills in is mirrored: the
//! versioned tensor, and the legacy unversioned `DLManagedTensor` that
//! older consumers ask for; the exchange-API function tables are not.

use std::ffi::c_void;

/// `DLPACK_MAJOR_VERSION`: a consumer refuses a tensor of another major.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// `DLPACK_MINOR_VERSION` of the vendored header.
pub const DLPACK_MINOR_VERSION: u32 = 3;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy. memplug sets
/// it only on a [`private_copy`](super::private_copy), which a caller asks
/// for; an export never copies by itself.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;

/// `kDLCPU`.
pub const K_DL_CPU: i32 = 1;
/// `kDLCUDA`.
pub const K_DL_CUDA: i32 = 2;

/// `kDLInt`: signed integer.
pub const K_DL_INT: u8 = 0;
/// `kDLUInt`: unsigned integer.
pub const K_DL_UINT: u8 = 1;
/// `kDLFloat`: IEEE floating point.
pub const K_DL_FLOAT: u8 = 2;
/// `kDLBfloat`: bfloat16.
pub const K_DL_BFLOAT: u8 = 4;
/// `kDLComplex`: complex (a compact pair per element).
pub const K_DL_COMPLEX: u8 = 5;
/// `kDLBool`: boolean (8 bits per element by convention).
pub const K_DL_BOOL: u8 = 6;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major: the layout of [`DLManagedTensorVersioned`].
    pub major: u32,
    /// Minor: additions (device types, dtype codes), layout unchanged.
    pub minor: u32,
}

/// `DLDevice`. `device_type` is the C enum `DLDeviceType` (an `int` in C,
/// `int32_t` in C++).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// `kDLCPU`, `kDLCUDA`, ...: the same numbers as `MEMPLUG_DEVICE_*`.
    pub device_type: i32,
    /// The device's ordinal (0 for host memory).
    pub device_id: i32,
}

/// `DLDataType`: one element's type.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// `kDLInt`, `kDLFloat`, ...
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: a strided view of memory; owns nothing.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// The first element (NULL for a tensor of no elements).
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements (never NULL when `ndim` is not zero).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element (memplug exports 0: `data`
    /// already points at it).
    pub byte_offset: u64,
}

/// `DLManagedTensorVersioned`: a tensor with its owner's deleter.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version the producer filled in.
    pub version: DLPackVersion,
    /// The producer's context (memplug: the tensor's own allocation).
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when done; frees `self` and whatever
    /// keeps the memory alive.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// `DLManagedTensor`: the legacy (DLPack 0.x) unversioned tensor, for a
/// consumer that asks for no version (`__dlpack__()` without
/// `max_version`). It has no flags: no read-only bit.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when done; frees `self` and whatever
    /// keeps the memory alive.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}
