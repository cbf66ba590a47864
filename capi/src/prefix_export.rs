//! Typed export of shared prefixes (C API 1.1, plugin ABI 1.2
//! `MEMPLUG_CAP_TYPED_EXPORT`): a prefix's memory as a handle another
//! binding, mechanism or process imports as a prefix of its own, charged
//! once to the importing binding's pool.

use crate::common::{MemplugHostBinding, MemplugHostPrefix};
use crate::error::{boundary, require_non_null, Error, Result};
use crate::manager_tables::{self, pin};
use crate::status::MemplugHostStatus;
use crate::status::MemplugHostStatus as S;
use crate::struct_size::{check_out_sized, read_sized, write_sized};
use memplug_host_dep::{MemoryBinding, SharedPrefix};
use memplug_sdk::abi::{MEMPLUG_HANDLE_BLOB_MAX, MEMPLUG_HANDLE_WIN32};
use memplug_sdk::{Handle, HandleRef};
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd};
use std::sync::Arc;

use memplug_sdk::descriptor::{FD_KINDS, HANDLE_KINDS as KINDS};

/// Refuses anything but one known `MEMPLUG_HANDLE_*` bit.
fn one_kind(kind: u32) -> Result<()> {
    if kind & !KINDS != 0 || kind.count_ones() != 1 {
        return Err(Error::new(
            S::InvalidArgument,
            format!("handle kind {kind:#x} is not one MEMPLUG_HANDLE_* bit"),
        ));
    }
    Ok(())
}

/// Exports a shared prefix's memory as a new handle of `kind` (one
/// `MEMPLUG_HANDLE_*` bit) and writes it to `out` (set `out->struct_size`
/// to `sizeof(MemplugHostHandle)` first). Another binding — of this
/// manager or another, in this process or one the handle is passed to —
/// imports it with `memplug_host_binding_import_prefix`. The prefix stays
/// charged to its own pool; exporting charges nothing.
///
/// Name `kind` in the `export_types` of the options of the binding that
/// makes the prefix: a mechanism may make memory exportable only as it was
/// asked to (the reference CPU plugin's is always a memfd). A mechanism that
/// does not offer `kind` (its descriptor's `export_types`), has no
/// `MEMPLUG_CAP_TYPED_EXPORT`, agreed on an ABI minor below 1.2, or did not
/// make this prefix exportable so refuses with
/// `MEMPLUG_HOST_STATUS_UNSUPPORTED`. An unknown kind, or several bits, is
/// `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`.
///
/// Ownership: what `out` receives is the caller's — close an fd kind's
/// `fd` (`close`), a `MEMPLUG_HANDLE_WIN32` handle (`CloseHandle`) when
/// done; the memory lives on while any handle or importer holds it. On
/// failure nothing is written and nothing needs closing.
/// Thread-safety: any thread.
///
/// # Safety
/// `out` must be NULL or writable for its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_prefix_export_handle(
    prefix: MemplugHostPrefix,
    kind: u32,
    out: *mut MemplugHostHandle,
) -> MemplugHostStatus {
    boundary("memplug_host_prefix_export_handle", || {
        require_non_null(out, "out")?;
        // SAFETY: non-NULL; the caller's contract covers the size. Checked
        // before exporting: a refusal after it would have to close the fd.
        unsafe { check_out_sized(out, "MemplugHostHandle") }?;
        one_kind(kind)?;
        let (p, _) = pin::<Arc<SharedPrefix>>(prefix.id)?;
        let handle = p.export_handle(kind)?;
        drop(p);
        let mut value =
            MemplugHostHandle { struct_size: MEMPLUG_HOST_HANDLE_SIZE_1_1, kind, ..Default::default() };
        match handle {
            Handle::Fd { fd, .. } => {
                value.fd = fd.as_raw_fd();
                // SAFETY: non-NULL, size checked above. On a refusal `fd`
                // is dropped, and so closed: nothing reaches the caller.
                unsafe { write_sized(out, value, "MemplugHostHandle") }?;
                // The caller's from now.
                let _ = fd.into_raw_fd();
            }
            Handle::Win32(w) => {
                value.win32 = w;
                // SAFETY: as above.
                unsafe { write_sized(out, value, "MemplugHostHandle") }?;
            }
            Handle::Blob(b) => {
                // The host checked the plugin's blob fits.
                value.blob_len = b.len() as u32;
                value.blob[..b.len()].copy_from_slice(&b);
                // SAFETY: as above.
                unsafe { write_sized(out, value, "MemplugHostHandle") }?;
            }
        }
        Ok(())
    })
}

/// Imports memory exported as `handle` (by `memplug_host_prefix_export_handle`
/// here or in another process, or by a runtime that speaks the same kind)
/// as a shared prefix of `size` bytes (rounded up to the granularity) made
/// through `binding`: charged once to the binding's pool, however many
/// regions map it (`memplug_host_region_map_prefix`, read-only), refunded
/// when it is freed. The handle's memory must be at least `size` bytes.
///
/// `handle->struct_size` must be at least `MEMPLUG_HOST_HANDLE_SIZE_1_1`;
/// its `kind` one `MEMPLUG_HANDLE_*` bit; for the fd kinds `fd` an open
/// descriptor (a negative one is `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`),
/// for a blob `blob_len` at most `MEMPLUG_HANDLE_BLOB_MAX`. A mechanism
/// that cannot import the kind (no `MEMPLUG_CAP_TYPED_EXPORT`, a kind it
/// does not offer) refuses with `MEMPLUG_HOST_STATUS_UNSUPPORTED`; a
/// handle it does not recognise with its own code; no room in the pool is
/// `MEMPLUG_HOST_STATUS_OUT_OF_BUDGET`.
///
/// Ownership: the handle stays the caller's (an fd is borrowed for the
/// call; the plugin keeps a duplicate if it needs one): close it whenever
/// convenient. The caller owns the new prefix (`memplug_host_prefix_release`).
/// Thread-safety: any thread.
///
/// # Safety
/// `handle` must be NULL or readable for its `struct_size` bytes, and an
/// fd in it an open descriptor of the caller's until the call returns;
/// `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn memplug_host_binding_import_prefix(
    binding: MemplugHostBinding,
    handle: *const MemplugHostHandle,
    size: u64,
    out: *mut MemplugHostPrefix,
) -> MemplugHostStatus {
    boundary("memplug_host_binding_import_prefix", || {
        require_non_null(handle, "handle")?;
        require_non_null(out, "out")?;
        // SAFETY: non-NULL; the caller's contract covers the size.
        let h = unsafe { read_sized(handle, "MemplugHostHandle") }?;
        one_kind(h.kind)?;
        let href = if h.kind & FD_KINDS != 0 {
            if h.fd < 0 {
                return Err(Error::new(
                    S::InvalidArgument,
                    format!("MemplugHostHandle: fd {} for handle kind {:#x}", h.fd, h.kind),
                ));
            }
            // SAFETY: an open descriptor of the caller's until the call
            // returns (the contract); only borrowed (the host duplicates it
            // to lend the plugin).
            HandleRef::Fd { kind: h.kind, fd: unsafe { BorrowedFd::borrow_raw(h.fd) } }
        } else if h.kind == MEMPLUG_HANDLE_WIN32 {
            HandleRef::Win32(h.win32)
        } else {
            let n = h.blob_len as usize;
            if h.blob_len > MEMPLUG_HANDLE_BLOB_MAX {
                return Err(Error::new(
                    S::InvalidArgument,
                    format!("MemplugHostHandle: blob_len {n} (at most {MEMPLUG_HANDLE_BLOB_MAX})"),
                ));
            }
            HandleRef::Blob(&h.blob[..n])
        };
        let (b, seat) = pin::<MemoryBinding>(binding.id)?;
        let p = b.import_shared(href, size)?;
        drop(b);
        let (len, charged) = (p.len(), p.charged());
        // SAFETY: `out` was checked non-NULL.
        unsafe { manager_tables::issue(seat, p, [len, charged], out, |id| MemplugHostPrefix { id }) }
    })
}

/// A typed handle to memory (the plugin ABI 1.2 `MemplugHandle`): what
/// `memplug_host_prefix_export_handle` writes and
/// `memplug_host_binding_import_prefix` reads. One kind per handle:
///
/// * `MEMPLUG_HANDLE_OPAQUE_FD`, `_DMABUF_FD`, `_MEMFD`: `fd` is a file
///   descriptor (else -1). One written by an export is new and the
///   caller's: close it when done (it keeps the memory alive for whoever
///   imports it, in this process or another one it is passed to). Import
///   only borrows it (the plugin keeps a duplicate if it needs one).
/// * `MEMPLUG_HANDLE_WIN32`: `win32` is a Windows NT handle, owned as an
///   fd is (else 0).
/// * `MEMPLUG_HANDLE_VENDOR_BLOB`: the first `blob_len` bytes of `blob`
///   (at most `MEMPLUG_HANDLE_BLOB_MAX`) are a vendor's opaque bytes.
///
/// Set `struct_size` to `sizeof(MemplugHostHandle)` (at least
/// `MEMPLUG_HOST_HANDLE_SIZE_1_1`) before either call. Since API 1.1.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemplugHostHandle {
    /// `sizeof(MemplugHostHandle)`; set to the bytes written.
    pub struct_size: u32,
    /// One `MEMPLUG_HANDLE_*` bit (memplug.h).
    pub kind: u32,
    /// The descriptor of the fd kinds; -1 otherwise.
    pub fd: i32,
    /// Zero.
    pub reserved0: u32,
    /// The handle of `MEMPLUG_HANDLE_WIN32`; zero otherwise.
    pub win32: u64,
    /// Bytes of `blob` used (`MEMPLUG_HANDLE_VENDOR_BLOB`); zero otherwise.
    pub blob_len: u32,
    /// Zero.
    pub reserved1: u32,
    /// A vendor blob's bytes.
    pub blob: [u8; 64],
}

impl Default for MemplugHostHandle {
    fn default() -> Self {
        MemplugHostHandle {
            struct_size: MEMPLUG_HOST_HANDLE_SIZE_1_1,
            kind: 0,
            fd: -1,
            reserved0: 0,
            win32: 0,
            blob_len: 0,
            reserved1: 0,
            blob: [0; 64],
        }
    }
}

/// Size of `MemplugHostHandle` in API 1.1, where it first appeared.
pub const MEMPLUG_HOST_HANDLE_SIZE_1_1: u32 = 96;
