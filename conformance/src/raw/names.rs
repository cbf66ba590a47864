//! Names for details: status codes and device kinds (the SDK's).

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

/// The device kinds the ABI names, and the vendors' range: the SDK's
/// facts, in the kit's words.
pub(crate) use memplug_sdk::facts::{device_kind_name, is_vendor_device_kind as is_vendor_kind};
