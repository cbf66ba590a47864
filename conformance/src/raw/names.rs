//! Names for details: status codes and device kinds.

use memplug_sdk::abi::*;

/// The name of a status code, for details.
pub(crate) fn status_name(s: MemplugStatus) -> String {
    let name = match s {
        MEMPLUG_STATUS_OK => "OK",
        MEMPLUG_STATUS_UNSUPPORTED => "UNSUPPORTED",
        MEMPLUG_STATUS_INVALID_ARGUMENT => "INVALID_ARGUMENT",
        MEMPLUG_STATUS_OUT_OF_MEMORY => "OUT_OF_MEMORY",
        MEMPLUG_STATUS_WRONG_MECHANISM => "WRONG_MECHANISM",
        MEMPLUG_STATUS_WRONG_DEVICE => "WRONG_DEVICE",
        MEMPLUG_STATUS_UNKNOWN_ALLOCATION => "UNKNOWN_ALLOCATION",
        MEMPLUG_STATUS_DEVICE_UNAVAILABLE => "DEVICE_UNAVAILABLE",
        MEMPLUG_STATUS_INTERNAL => "INTERNAL",
        MEMPLUG_STATUS_OUT_OF_RANGE => "OUT_OF_RANGE",
        MEMPLUG_STATUS_INVALID_STATE => "INVALID_STATE",
        MEMPLUG_STATUS_VERSION_MISMATCH => "VERSION_MISMATCH",
        MEMPLUG_STATUS_NOT_READY => "NOT_READY",
        MEMPLUG_STATUS_TIMEOUT => "TIMEOUT",
        MEMPLUG_STATUS_BUSY => "BUSY",
        MEMPLUG_STATUS_DEVICE_LOST => "DEVICE_LOST",
        other => return format!("unknown status {other}"),
    };
    name.to_string()
}

/// The device kinds the ABI defines (1.0's two, and since 1.2 every kind
/// DLPack numbers).
pub(crate) fn device_kind_name(kind: MemplugDeviceKind) -> Option<&'static str> {
    Some(match kind {
        MEMPLUG_DEVICE_CPU => "cpu",
        MEMPLUG_DEVICE_CUDA => "cuda",
        MEMPLUG_DEVICE_CUDA_HOST => "cuda_host",
        MEMPLUG_DEVICE_OPENCL => "opencl",
        MEMPLUG_DEVICE_VULKAN => "vulkan",
        MEMPLUG_DEVICE_METAL => "metal",
        MEMPLUG_DEVICE_VPI => "vpi",
        MEMPLUG_DEVICE_ROCM => "rocm",
        MEMPLUG_DEVICE_ROCM_HOST => "rocm_host",
        MEMPLUG_DEVICE_EXT_DEV => "ext_dev",
        MEMPLUG_DEVICE_CUDA_MANAGED => "cuda_managed",
        MEMPLUG_DEVICE_ONEAPI => "oneapi",
        MEMPLUG_DEVICE_WEBGPU => "webgpu",
        MEMPLUG_DEVICE_HEXAGON => "hexagon",
        MEMPLUG_DEVICE_MAIA => "maia",
        _ => return None,
    })
}

/// A kind in the vendors' range (ABI 1.2).
pub(crate) fn is_vendor_kind(kind: MemplugDeviceKind) -> bool {
    (MEMPLUG_DEVICE_VENDOR_FIRST..=MEMPLUG_DEVICE_VENDOR_LAST).contains(&kind)
}
