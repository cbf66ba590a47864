//! Library, C API and plugin ABI versions.

use crate::error::{boundary, boundary_value, require_non_null, Result};
use crate::status::MemplugHostStatus;
use crate::struct_size::write_sized;
use memplug_host_dep::{HOST_MAX_MINOR, HOST_MIN_MINOR};
use memplug_sdk::abi::MEMPLUG_ABI_MAJOR;
use std::ffi::c_char;

fn parse(v: &str) -> u32 {
    v.parse().unwrap_or(0)
}

fn version() -> MemplugHostVersion {
    MemplugHostVersion {
        struct_size: MEMPLUG_HOST_VERSION_SIZE_1_0,
        major: parse(env!("CARGO_PKG_VERSION_MAJOR")),
        minor: parse(env!("CARGO_PKG_VERSION_MINOR")),
        patch: parse(env!("CARGO_PKG_VERSION_PATCH")),
        api_major: MEMPLUG_HOST_API_MAJOR,
        api_minor: MEMPLUG_HOST_API_MINOR,
        abi_major: MEMPLUG_ABI_MAJOR,
        abi_min_minor: HOST_MIN_MINOR,
        abi_max_minor: HOST_MAX_MINOR,
        reserved0: 0,
    }
}

/// Fills `out` with the library's versions: its own, the C API's it
/// implements, and the plugin ABI range it loads. Set `out->struct_size`
/// to `sizeof(MemplugHostVersion)` first.
///
/// A program built against this header checks at start-up that
/// `api_major == MEMPLUG_HOST_API_MAJOR` and
/// `api_minor >= MEMPLUG_HOST_API_MINOR`.
///
/// Ownership: `out` is the caller's; written only on success.
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_get_version(out: *mut MemplugHostVersion) -> MemplugHostStatus {
    boundary("memplug_host_get_version", || -> Result<()> {
        require_non_null(out, "out")?;
        // SAFETY: non-NULL; the caller's contract covers the size.
        unsafe { write_sized(out, version(), "MemplugHostVersion") }
    })
}

/// The library version as a static NUL-terminated string, e.g. `"0.1.0"`.
///
/// Ownership: static; never free it. Thread-safety: any thread. Never
/// fails.
#[no_mangle]
pub extern "C" fn memplug_host_version_string() -> *const c_char {
    boundary_value("memplug_host_version_string", std::ptr::null(), || {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    })
}

/// Checks that this library implements the C API a program was compiled
/// against: pass `MEMPLUG_HOST_API_MAJOR` and `MEMPLUG_HOST_API_MINOR`
/// (`MEMPLUG_HOST_CHECK_API()` does). `MEMPLUG_HOST_STATUS_VERSION_MISMATCH`
/// (with a message naming both versions) when the major differs or the
/// library's minor is older than the header's.
///
/// Thread-safety: any thread.
#[no_mangle]
pub extern "C" fn memplug_host_check_api(major: u32, minor: u32) -> MemplugHostStatus {
    boundary("memplug_host_check_api", || {
        if major != MEMPLUG_HOST_API_MAJOR || minor > MEMPLUG_HOST_API_MINOR {
            return Err(crate::error::Error::new(
                MemplugHostStatus::VersionMismatch,
                format!(
                    "the program was built against C API {major}.{minor}; this library implements \
                     {MEMPLUG_HOST_API_MAJOR}.{MEMPLUG_HOST_API_MINOR}"
                ),
            ));
        }
        Ok(())
    })
}

/// Major version of this C API: changes only with an incompatible change.
pub const MEMPLUG_HOST_API_MAJOR: u32 = 1;

/// Minor version of this C API: grows when functions or struct fields are
/// appended.
pub const MEMPLUG_HOST_API_MINOR: u32 = 3;

/// Versions of the library (`memplug_host_get_version`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostVersion {
    /// Set by the caller to `sizeof(MemplugHostVersion)`; set by the
    /// library to the bytes it wrote.
    pub struct_size: u32,
    /// Library version (semantic versioning).
    pub major: u32,
    /// Library minor version.
    pub minor: u32,
    /// Library patch version.
    pub patch: u32,
    /// C API version the library implements (compare with
    /// `MEMPLUG_HOST_API_MAJOR` / `MEMPLUG_HOST_API_MINOR` of the header).
    pub api_major: u32,
    /// C API minor version the library implements (a library serves every
    /// header of its major with a minor up to this).
    pub api_minor: u32,
    /// Plugin ABI major the host loads (`MEMPLUG_ABI_MAJOR`).
    pub abi_major: u32,
    /// Oldest plugin ABI minor the host negotiates.
    pub abi_min_minor: u32,
    /// Newest plugin ABI minor the host negotiates (see `abi_min_minor`).
    pub abi_max_minor: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
}

/// Size of `MemplugHostVersion` in API 1.0.
pub const MEMPLUG_HOST_VERSION_SIZE_1_0: u32 = 40;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_matches_the_crate() {
        let mut v = MemplugHostVersion {
            struct_size: std::mem::size_of::<MemplugHostVersion>() as u32,
            ..Default::default()
        };
        assert_eq!(unsafe { memplug_host_get_version(&mut v) }, MemplugHostStatus::Ok);
        assert_eq!(v.api_major, MEMPLUG_HOST_API_MAJOR);
        assert_eq!(v.abi_major, 1);
        let s = unsafe { std::ffi::CStr::from_ptr(memplug_host_version_string()) };
        assert_eq!(s.to_str().unwrap(), format!("{}.{}.{}", v.major, v.minor, v.patch));
        let mut short = MemplugHostVersion { struct_size: 4, ..Default::default() };
        assert_eq!(unsafe { memplug_host_get_version(&mut short) }, MemplugHostStatus::InvalidArgument);
        assert_eq!(short.major, 0, "out-params are written only on success");
        assert_eq!(
            unsafe { memplug_host_get_version(std::ptr::null_mut()) },
            MemplugHostStatus::NullArgument
        );
        assert_eq!(memplug_host_check_api(1, 0), MemplugHostStatus::Ok);
        // API 1.1: what plugin ABI 1.2 adds — the descriptor, identity, needs
        // and placement; typed prefix export; stream waits and typed
        // adoption; peer access; a region's grow queued on a stream.
        // API 1.2: caching bindings; statistics as JSON and Prometheus text,
        // event and log callbacks. API 1.3: DLPack export, the stream-ordered
        // copy, offload/restore and copy-on-write of regions.
        assert_eq!((v.api_minor, MEMPLUG_HOST_API_MINOR), (3, 3));
        assert_eq!(memplug_host_check_api(1, 1), MemplugHostStatus::Ok);
        assert_eq!(memplug_host_check_api(1, 2), MemplugHostStatus::Ok);
        assert_eq!(memplug_host_check_api(1, 3), MemplugHostStatus::Ok);
        assert_eq!(memplug_host_check_api(1, 4), MemplugHostStatus::VersionMismatch);
        assert_eq!(memplug_host_check_api(1, 99), MemplugHostStatus::VersionMismatch);
        assert_eq!(memplug_host_check_api(2, 0), MemplugHostStatus::VersionMismatch);
    }
}
