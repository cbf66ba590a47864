//! How a plugin is loaded, from C (API 1.3): the overlap check, the
//! writable-file policy and a SHA-256 pin, the options the Rust host's
//! `LoadOptions` has. `memplug_host_manager_load_plugin` and
//! `_register_entry` keep the defaults; the `_with` functions take these.

use crate::error::{boundary, c_str, Error, Result};
use crate::manager_tables::pin_manager;
use crate::status::MemplugHostStatus;
use crate::struct_size::read_sized;
use memplug_host_dep::{LoadOptions, OverlapCheck, Plugin};
use memplug_sdk::abi::{MemplugHostInfo, MemplugMessageSink, MemplugNegotiation, MemplugStatus};
use memplug_sdk::prefix::Prefixed;
use std::ffi::c_char;

/// `MemplugHostLoadOptions::check_overlaps`: this library's default
/// (`MEMPLUG_HOST_OVERLAPS_ALL` when it was built for debugging,
/// `MEMPLUG_HOST_OVERLAPS_AUTO` otherwise).
pub const MEMPLUG_HOST_OVERLAPS_DEFAULT: u32 = 0;
/// No block is checked for overlaps.
pub const MEMPLUG_HOST_OVERLAPS_OFF: u32 = 1;
/// Reservations are checked; allocations are not.
pub const MEMPLUG_HOST_OVERLAPS_RESERVATIONS: u32 = 2;
/// Reservations, and the allocations of every mechanism whose device is
/// not the CPU (where an allocation is a driver call and the check is
/// small beside it).
pub const MEMPLUG_HOST_OVERLAPS_AUTO: u32 = 3;
/// Every allocation and reservation (about 660 instructions per block made
/// and given back: +60 % on a CPU allocation pair).
pub const MEMPLUG_HOST_OVERLAPS_ALL: u32 = 4;
/// Size of `MemplugHostLoadOptions` in API 1.3, where it first appeared.
pub const MEMPLUG_HOST_LOAD_OPTIONS_SIZE_1_3: u32 = 24;

/// Options of a plugin load. Zeroed (with `struct_size` set), it asks for
/// the defaults: the library's overlap check, files writable by others
/// refused, no pin.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostLoadOptions {
    /// `sizeof(MemplugHostLoadOptions)`.
    pub struct_size: u32,
    /// Which blocks a mechanism returns are checked against its live ones
    /// (a block overlapping one is refused as the plugin's failure, naming
    /// both): one `MEMPLUG_HOST_OVERLAPS_*` value.
    pub check_overlaps: u32,
    /// Non-zero: load even when the file, or a directory on its path, is
    /// writable by others than its owner.
    pub allow_writable_by_others: u32,
    /// Zero.
    pub reserved0: u32,
    /// NULL, or the file's expected SHA-256 as 64 hex digits (NUL
    /// terminated): any other file is refused. Read during the call only.
    /// Ignored by `memplug_host_manager_register_entry_with`, which loads
    /// no file.
    pub expected_sha256: *const c_char,
}

impl Default for MemplugHostLoadOptions {
    fn default() -> Self {
        MemplugHostLoadOptions {
            struct_size: 0,
            check_overlaps: 0,
            allow_writable_by_others: 0,
            reserved0: 0,
            expected_sha256: std::ptr::null(),
        }
    }
}

// SAFETY: `#[repr(C)]`, `Copy`, all-zero valid (a NULL pointer, zeros);
// the size below is asserted.
unsafe impl Prefixed for MemplugHostLoadOptions {
    const SIZE_1_0: u32 = MEMPLUG_HOST_LOAD_OPTIONS_SIZE_1_3;
}
const _: () =
    assert!(std::mem::size_of::<MemplugHostLoadOptions>() == MEMPLUG_HOST_LOAD_OPTIONS_SIZE_1_3 as usize);

/// The Rust options of a caller's struct (NULL: the defaults).
///
/// # Safety
/// `options` is NULL or readable for its `struct_size`; its
/// `expected_sha256` NULL or NUL-terminated.
unsafe fn options(options: *const MemplugHostLoadOptions) -> Result<LoadOptions> {
    let mut out = LoadOptions::default();
    if options.is_null() {
        return Ok(out);
    }
    // SAFETY: non-NULL; the caller's contract covers the size.
    let o = unsafe { read_sized(options, "MemplugHostLoadOptions") }?;
    out.check_overlaps = match o.check_overlaps {
        MEMPLUG_HOST_OVERLAPS_DEFAULT => OverlapCheck::build_default(),
        MEMPLUG_HOST_OVERLAPS_OFF => OverlapCheck::Off,
        MEMPLUG_HOST_OVERLAPS_RESERVATIONS => OverlapCheck::Reservations,
        MEMPLUG_HOST_OVERLAPS_AUTO => OverlapCheck::Auto,
        MEMPLUG_HOST_OVERLAPS_ALL => OverlapCheck::All,
        other => {
            return Err(Error::new(
                MemplugHostStatus::InvalidArgument,
                format!("check_overlaps {other} is not a MEMPLUG_HOST_OVERLAPS_* value (0 to 4)"),
            ))
        }
    };
    if o.reserved0 != 0 {
        return Err(Error::new(MemplugHostStatus::InvalidArgument, "reserved0 must be zero"));
    }
    out.allow_writable_by_others = o.allow_writable_by_others != 0;
    if !o.expected_sha256.is_null() {
        // SAFETY: the caller's contract.
        out.expected_sha256 = Some(unsafe { c_str(o.expected_sha256, "expected_sha256") }?.to_owned());
    }
    Ok(out)
}

/// `memplug_host_manager_load_plugin` with `options` (NULL: the defaults):
/// which blocks are checked for overlaps, whether a file writable by others
/// is loaded, and a SHA-256 the file must have. A `check_overlaps` that is
/// no `MEMPLUG_HOST_OVERLAPS_*` value, a non-zero `reserved0` or a short
/// `struct_size` is `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`, and nothing is
/// loaded.
///
/// Thread-safety: any thread.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string; `options` NULL or
/// readable for its `struct_size`, with `expected_sha256` NULL or
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_load_plugin_with(
    manager: crate::common::MemplugHostManager,
    path: *const c_char,
    options: *const MemplugHostLoadOptions,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_load_plugin_with", || {
        // SAFETY: the caller's contract.
        let (path, opts) = unsafe { (c_str(path, "path")?, self::options(options)?) };
        let (m, _) = pin_manager(manager.id)?;
        m.pm.load_plugin(path, &opts)?;
        Ok(())
    })
}

/// `memplug_host_manager_register_entry` with `options` (NULL: the
/// defaults; `expected_sha256` and `allow_writable_by_others` do not apply
/// to an entry function, which has no file). Fails as
/// `memplug_host_manager_load_plugin_with` does.
///
/// Thread-safety: any thread.
///
/// # Safety
/// As `memplug_host_manager_register_entry`; `options` NULL or readable for
/// its `struct_size`.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_manager_register_entry_with(
    manager: crate::common::MemplugHostManager,
    entry: Option<
        unsafe extern "C" fn(
            *const MemplugHostInfo,
            *mut MemplugNegotiation,
            *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    label: *const c_char,
    options: *const MemplugHostLoadOptions,
) -> MemplugHostStatus {
    boundary("memplug_host_manager_register_entry_with", || {
        let entry = entry.ok_or_else(|| Error::null("entry"))?;
        // SAFETY: the caller's contract.
        let (label, opts) = unsafe { (c_str(label, "label")?, self::options(options)?) };
        let (m, _) = pin_manager(manager.id)?;
        // SAFETY: the caller vouches for `entry`.
        let plugin = unsafe { Plugin::from_entry(entry, label, &opts) }
            .map_err(memplug_host_dep::ManagerError::from)?;
        m.pm.register_plugin(plugin)?;
        Ok(())
    })
}
