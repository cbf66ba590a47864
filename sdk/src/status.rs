//! The Rust view of `MemplugStatus`: one enum whose discriminants are the ABI
//! constants, so the numbers live in exactly one place (`abi.rs`).

use crate::abi;

/// A status code as both sides of the ABI understand it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Ok = abi::MEMPLUG_STATUS_OK,
    Unsupported = abi::MEMPLUG_STATUS_UNSUPPORTED,
    InvalidArgument = abi::MEMPLUG_STATUS_INVALID_ARGUMENT,
    OutOfMemory = abi::MEMPLUG_STATUS_OUT_OF_MEMORY,
    WrongMechanism = abi::MEMPLUG_STATUS_WRONG_MECHANISM,
    WrongDevice = abi::MEMPLUG_STATUS_WRONG_DEVICE,
    UnknownAllocation = abi::MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
    DeviceUnavailable = abi::MEMPLUG_STATUS_DEVICE_UNAVAILABLE,
    Internal = abi::MEMPLUG_STATUS_INTERNAL,
    OutOfRange = abi::MEMPLUG_STATUS_OUT_OF_RANGE,
    InvalidState = abi::MEMPLUG_STATUS_INVALID_STATE,
    VersionMismatch = abi::MEMPLUG_STATUS_VERSION_MISMATCH,
    NotReady = abi::MEMPLUG_STATUS_NOT_READY,
    Timeout = abi::MEMPLUG_STATUS_TIMEOUT,
    Busy = abi::MEMPLUG_STATUS_BUSY,
}

impl Status {
    /// Every status, in numeric order.
    pub const ALL: [Status; 15] = [
        Status::Ok,
        Status::Unsupported,
        Status::InvalidArgument,
        Status::OutOfMemory,
        Status::WrongMechanism,
        Status::WrongDevice,
        Status::UnknownAllocation,
        Status::DeviceUnavailable,
        Status::Internal,
        Status::OutOfRange,
        Status::InvalidState,
        Status::VersionMismatch,
        Status::NotReady,
        Status::Timeout,
        Status::Busy,
    ];

    /// Maps a raw code to a status. A code this build does not know means
    /// the peer is newer or broken; the most conservative meaning is an
    /// internal failure, and `None` tells the caller it was unknown.
    #[inline]
    pub fn from_raw(raw: abi::MemplugStatus) -> Option<Status> {
        Status::ALL.get(raw as usize).copied()
    }

    /// Like [`Status::from_raw`], mapping unknown codes to `Internal`.
    #[inline]
    pub fn from_raw_conservative(raw: abi::MemplugStatus) -> Status {
        Status::from_raw(raw).unwrap_or(Status::Internal)
    }

    #[inline]
    pub fn raw(self) -> abi::MemplugStatus {
        self as abi::MemplugStatus
    }

    /// The C constant's name, e.g. `MEMPLUG_STATUS_OUT_OF_RANGE`.
    pub fn c_name(self) -> &'static str {
        match self {
            Status::Ok => "MEMPLUG_STATUS_OK",
            Status::Unsupported => "MEMPLUG_STATUS_UNSUPPORTED",
            Status::InvalidArgument => "MEMPLUG_STATUS_INVALID_ARGUMENT",
            Status::OutOfMemory => "MEMPLUG_STATUS_OUT_OF_MEMORY",
            Status::WrongMechanism => "MEMPLUG_STATUS_WRONG_MECHANISM",
            Status::WrongDevice => "MEMPLUG_STATUS_WRONG_DEVICE",
            Status::UnknownAllocation => "MEMPLUG_STATUS_UNKNOWN_ALLOCATION",
            Status::DeviceUnavailable => "MEMPLUG_STATUS_DEVICE_UNAVAILABLE",
            Status::Internal => "MEMPLUG_STATUS_INTERNAL",
            Status::OutOfRange => "MEMPLUG_STATUS_OUT_OF_RANGE",
            Status::InvalidState => "MEMPLUG_STATUS_INVALID_STATE",
            Status::VersionMismatch => "MEMPLUG_STATUS_VERSION_MISMATCH",
            Status::NotReady => "MEMPLUG_STATUS_NOT_READY",
            Status::Timeout => "MEMPLUG_STATUS_TIMEOUT",
            Status::Busy => "MEMPLUG_STATUS_BUSY",
        }
    }
}

impl core::fmt::Display for Status {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.c_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_dense_and_round_trips() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(s.raw() as usize, i);
            assert_eq!(Status::from_raw(s.raw()), Some(*s));
        }
        assert_eq!(Status::from_raw(Status::ALL.len() as u32), None);
        assert_eq!(Status::from_raw_conservative(0xdead_beef), Status::Internal);
    }
}
