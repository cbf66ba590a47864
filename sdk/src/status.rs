//! The Rust view of `MemplugStatus`: one enum whose discriminants are the ABI
//! constants, so the numbers live in exactly one place (`abi/`), and
//! whose variants, [`Status::ALL`] and C names come from one list.

use crate::abi;

/// Defines [`Status`] from one list of `Variant = CONSTANT` lines: the enum
/// (each discriminant the `abi` constant, each variant's docs a link to
/// that constant's), [`Status::ALL`] in list order and [`Status::c_name`]
/// (the constant's name, from the same token). Adding a code is one line
/// here (after its constant in `abi/`, which cbindgen reads).
macro_rules! statuses {
    ($($variant:ident = $constant:ident,)+) => {
        /// A status code as both sides of the ABI understand it.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Status {
            $(
                #[doc = concat!("[`", stringify!($constant), "`](abi::", stringify!($constant), "): see the constant for what it means and who returns it.")]
                $variant = abi::$constant,
            )+
        }

        impl Status {
            /// Every status, in numeric order.
            pub const ALL: [Status; [$(stringify!($variant)),+].len()] = [$(Status::$variant),+];

            /// The C constant's name, e.g. `MEMPLUG_STATUS_OUT_OF_RANGE`.
            pub fn c_name(self) -> &'static str {
                match self {
                    $(Status::$variant => stringify!($constant),)+
                }
            }
        }
    };
}

statuses! {
    Ok = MEMPLUG_STATUS_OK,
    Unsupported = MEMPLUG_STATUS_UNSUPPORTED,
    InvalidArgument = MEMPLUG_STATUS_INVALID_ARGUMENT,
    OutOfMemory = MEMPLUG_STATUS_OUT_OF_MEMORY,
    WrongMechanism = MEMPLUG_STATUS_WRONG_MECHANISM,
    WrongDevice = MEMPLUG_STATUS_WRONG_DEVICE,
    UnknownAllocation = MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
    DeviceUnavailable = MEMPLUG_STATUS_DEVICE_UNAVAILABLE,
    Internal = MEMPLUG_STATUS_INTERNAL,
    OutOfRange = MEMPLUG_STATUS_OUT_OF_RANGE,
    InvalidState = MEMPLUG_STATUS_INVALID_STATE,
    VersionMismatch = MEMPLUG_STATUS_VERSION_MISMATCH,
    NotReady = MEMPLUG_STATUS_NOT_READY,
    Timeout = MEMPLUG_STATUS_TIMEOUT,
    Busy = MEMPLUG_STATUS_BUSY,
    DeviceLost = MEMPLUG_STATUS_DEVICE_LOST,
}

impl Status {
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

    /// The code as it crosses the ABI (the `MEMPLUG_STATUS_*` value).
    #[inline]
    pub fn raw(self) -> abi::MemplugStatus {
        self as abi::MemplugStatus
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
