//! Status codes of the host C API.
//!
//! The enum below is the one list of codes: its variants, numbers and docs
//! are what cbindgen writes into `memplug_host.h`, and `build.rs` derives
//! [`MemplugHostStatus::ALL`] and the C names from it. Adding a code is
//! adding one documented variant (never renumber one).

use memplug_sdk::Status;
use std::ffi::c_char;

/// Result of every fallible function of the host C API.
///
/// `MEMPLUG_HOST_STATUS_OK` (zero) is success. Codes 0 to 15 have exactly
/// the meaning of the plugin ABI's `MEMPLUG_STATUS_*` codes of the same
/// number (a plugin's refusal comes back with its own code); codes from 256
/// on are the host's own, leaving room for the plugin ABI to add codes in
/// later minors without a clash. Codes are never renumbered; a caller treats
/// a code it does not know as a failure.
///
/// Every failure also sets this thread's last error message
/// (`memplug_host_last_error_message`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemplugHostStatus {
    /// Success.
    Ok = 0,
    /// The mechanism lacks the capability the call needs (an explicit
    /// absence, never a silent no-op).
    Unsupported = 1,
    /// An argument is malformed: a zero or non-power-of-two alignment, a size
    /// that overflows, a short `struct_size`, a string that is not UTF-8.
    InvalidArgument = 2,
    /// The plugin (the device) has no memory for the request.
    OutOfMemory = 3,
    /// The plugin reports the object was made by another mechanism.
    WrongMechanism = 4,
    /// The plugin reports the request names a device it does not serve.
    WrongDevice = 5,
    /// The plugin does not know the object.
    UnknownAllocation = 6,
    /// The device or its driver cannot be reached.
    DeviceUnavailable = 7,
    /// Something failed inside the host or the plugin.
    Internal = 8,
    /// A size or range lies outside what the object or pool allows.
    OutOfRange = 9,
    /// The object is in the wrong state for the request (for example a
    /// prefix mapped into a region that already has committed bytes).
    InvalidState = 10,
    /// The plugin's ABI version range does not overlap the host's.
    VersionMismatch = 11,
    /// Not complete yet.
    NotReady = 12,
    /// A wait ran out of time.
    Timeout = 13,
    /// Still in use (an unload refused because objects are alive, a range
    /// whose decommit still waits for fences).
    Busy = 14,
    /// The device or context behind the mechanism is gone (ABI 1.2): the
    /// host no longer calls it, every object it made went with it, and its
    /// charges are settled when its context terminates. Handles to those
    /// objects stay valid to destroy (which calls no plugin).
    DeviceLost = 15,
    /// The pool's budget has no room, even after asking its holders.
    OutOfBudget = 256,
    /// The handle named an object that was freed or destroyed (or whose
    /// manager was destroyed).
    StaleHandle = 257,
    /// The handle belongs to another manager than the one the call is about.
    WrongManager = 258,
    /// A required pointer argument is NULL.
    NullArgument = 259,
    /// The host panicked; the panic was contained and its message is the
    /// last error. The objects involved are in an unknown but memory-safe
    /// state.
    Panic = 260,
    /// The handle is not a handle of the expected kind, or was never issued
    /// (zero, forged, corrupted).
    InvalidHandle = 261,
    /// The call is not allowed from inside a callback the host is running
    /// on this thread (destroying the manager from a pressure callback,
    /// growing the region whose grow is running the callback), nor from
    /// inside a plugin slot the host is calling on this thread (no function
    /// of this API may be called from plugin code the host called).
    Reentrant = 262,
    /// A plugin could not be loaded (missing file, not a library, no entry
    /// symbol, malformed or lying tables); the message says which.
    LoadFailed = 263,
    /// Nothing matches the name or the requirements given.
    NotFound = 264,
    /// The name is already taken (a pool or plugin name).
    AlreadyExists = 265,
    /// The caller's update callback refused a grown region; the region is
    /// as it was before the call.
    CallbackRefused = 266,
    /// A table is full: this manager has too many live objects of one
    /// kind, or the process too many managers.
    LimitReached = 267,
    /// The caller's buffer is too small for the text asked for; nothing was
    /// written to it, and the size out-parameter says the capacity needed.
    BufferTooSmall = 268,
}

use MemplugHostStatus as S;

impl MemplugHostStatus {
    /// The host status of a plugin status (the same number).
    pub fn from_plugin(s: Status) -> S {
        S::ALL[s as usize]
    }
}

// The plugin ABI's codes come first in `ALL`, with their own numbers, so
// `from_plugin` can index it: checked here, at compile time (a plugin code
// without its host twin fails the build).
const _: () = {
    let mut i = 0;
    while i < Status::ALL.len() {
        assert!(S::ALL[i] as u32 == Status::ALL[i] as u32);
        i += 1;
    }
};

// `MemplugHostStatus::ALL` and `name_c`, derived by build.rs from the enum
// above (the one list of codes; see `status_tables` in capi/build.rs).
include!(concat!(env!("OUT_DIR"), "/host_status_tables.rs"));

/// The name of a status code, e.g. `"MEMPLUG_HOST_STATUS_STALE_HANDLE"`, or
/// `"MEMPLUG_HOST_STATUS_UNKNOWN"` for a code this library does not know.
///
/// Ownership: the string is static; never free it. Thread-safety: any
/// thread. Never fails.
#[no_mangle]
pub extern "C" fn memplug_host_status_name(status: u32) -> *const c_char {
    let name: &'static [u8] = match S::ALL.iter().find(|s| **s as u32 == status) {
        Some(s) => s.name_c(),
        None => b"MEMPLUG_HOST_STATUS_UNKNOWN\0",
    };
    name.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_codes_keep_their_numbers() {
        for s in Status::ALL {
            assert_eq!(S::from_plugin(s) as u32, s.raw(), "{s:?}");
        }
    }

    #[test]
    fn all_is_in_numeric_order_and_named() {
        let mut last = None;
        for s in S::ALL {
            if let Some(l) = last {
                assert!((s as u32) > l);
            }
            last = Some(s as u32);
            let name = std::str::from_utf8(s.name_c()).unwrap();
            let camel: String = name
                .trim_end_matches('\0')
                .trim_start_matches("MEMPLUG_HOST_STATUS_")
                .split('_')
                .map(|w| w[..1].to_string() + &w[1..].to_lowercase())
                .collect();
            assert_eq!(camel, format!("{s:?}"));
        }
    }

    #[test]
    fn numbers_are_frozen() {
        // Never renumber: these values are part of the C ABI.
        assert_eq!(S::Busy as u32, 14);
        assert_eq!(S::OutOfBudget as u32, 256);
        assert_eq!(S::StaleHandle as u32, 257);
        assert_eq!(S::WrongManager as u32, 258);
        assert_eq!(S::NullArgument as u32, 259);
        assert_eq!(S::Panic as u32, 260);
        assert_eq!(S::InvalidHandle as u32, 261);
        assert_eq!(S::Reentrant as u32, 262);
        assert_eq!(S::LoadFailed as u32, 263);
        assert_eq!(S::NotFound as u32, 264);
        assert_eq!(S::AlreadyExists as u32, 265);
        assert_eq!(S::CallbackRefused as u32, 266);
        assert_eq!(S::LimitReached as u32, 267);
        assert_eq!(S::BufferTooSmall as u32, 268);
    }
}
