//! Typed handles (ABI 1.2, `MEMPLUG_CAP_TYPED_EXPORT`): a physical object
//! exported as the kind of handle a consumer needs — a memfd, a dma-buf, a
//! driver's opaque descriptor, a Windows handle, a vendor's bytes — and
//! imported back, here or in another process. The kinds are chosen when
//! the memory is made (`Placement::export_types`), as the APIs vendors ship
//! require, and a mechanism says which it offers
//! (`Descriptor::export_types`).
//!
//! The host checks what it can of every answer: the kind is the one asked
//! for, a descriptor is a new one that can carry memory (never a standard
//! stream, never one it would close by mistake), a blob fits. Importing
//! lends the plugin a duplicate of the caller's descriptor, as 1.1's
//! `import_fd` does.

use super::shared_mapping::{exported_fd_fault, handle_kind_fault, refused_fd, OpenFds};
use super::{MechanismInner, Placement, SharedMappingApi};
use crate::error::CallError;
use crate::tokens::PhysicalObject;
use memplug_sdk::abi::*;
use memplug_sdk::descriptor::FD_KINDS;
use memplug_sdk::{Handle, HandleRef, Status};
use std::os::fd::{FromRawFd, OwnedFd};

impl SharedMappingApi<'_> {
    #[cold]
    fn no_typed_export(&self, slot: &'static str) -> CallError {
        let why = if self.m.minor < 2 {
            format!("the plugin agreed on ABI 1.{}; typed handles need 1.2", self.m.minor)
        } else {
            "the mechanism does not have MEMPLUG_CAP_TYPED_EXPORT".to_string()
        };
        self.m.refuse(slot, Status::Unsupported, why)
    }

    /// A new handle of kind `kind` (one `MEMPLUG_HANDLE_*` bit) for the
    /// memory of `object`, owned by the caller. `Unsupported` when the
    /// plugin agreed on less than 1.2, lacks the capability, does not offer
    /// the kind, or did not make the object exportable that way.
    pub fn export_handle(&self, object: &PhysicalObject, kind: u32) -> Result<Handle, CallError> {
        const SLOT: &str = "shared_mapping.export_handle";
        let Some(f) = self.vt.export_handle else {
            return Err(self.no_typed_export(SLOT));
        };
        let o = self.m.ref_if_made_here(SLOT, &object.0)?;
        let mut out = MemplugHandle { struct_size: MEMPLUG_HANDLE_SIZE_1_2, ..Default::default() };
        // What was open before the call (see `export_fd`).
        let before = if kind & FD_KINDS != 0 { OpenFds::now() } else { OpenFds(None) };
        self.m.call(SLOT, f, (&o, kind, &mut out))?;
        let bad =
            |why: String| self.m.refuse(SLOT, Status::Internal, format!("plugin reported success but {why}"));
        if out.handle_type != kind {
            return Err(bad(format!(
                "returned a handle of kind {:#x} where {kind:#x} was asked",
                out.handle_type
            )));
        }
        if kind & FD_KINDS != 0 {
            let fd = out.fd;
            let fault = exported_fd_fault(fd)
                .and_then(|()| before.new_one(fd))
                .and_then(|()| handle_kind_fault(fd, kind));
            if let Err(why) = fault {
                // A new descriptor of the wrong kind is closed; any other
                // number may be the host's own and is left alone.
                return Err(self.m.refuse(SLOT, Status::Internal, refused_fd(fd, &why, &before)));
            }
            // SAFETY: a new descriptor the caller owns (ABI contract),
            // checked above to be open, not a standard stream and able to
            // carry memory.
            return Ok(Handle::Fd { kind, fd: unsafe { OwnedFd::from_raw_fd(out.fd) } });
        }
        if kind == MEMPLUG_HANDLE_WIN32 {
            return Ok(Handle::Win32(out.win32));
        }
        let n = out.blob_len as usize;
        if n > out.blob.len() {
            return Err(bad(format!("returned a blob of {n} bytes (at most {MEMPLUG_HANDLE_BLOB_MAX})")));
        }
        Ok(Handle::Blob(out.blob[..n].to_vec()))
    }

    /// A physical object of this mechanism backed by `handle`'s memory, of
    /// at least `size` bytes; the handle stays the caller's. Release the
    /// object as one made by [`create`](Self::create).
    pub fn import_handle(&self, handle: HandleRef<'_>, size: u64) -> Result<PhysicalObject, CallError> {
        const SLOT: &str = "shared_mapping.import_handle";
        let Some(f) = self.vt.import_handle else {
            return Err(self.no_typed_export(SLOT));
        };
        let m = self.m;
        let req = m.request(size, m.props.granularity, MEMPLUG_CLASS_OTHER, &Placement::default());
        let mut out = MechanismInner::empty_block();
        let mut h = MemplugHandle { struct_size: MEMPLUG_HANDLE_SIZE_1_2, ..Default::default() };
        let mut known = 0;
        match handle {
            HandleRef::Fd { kind, fd } => {
                let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
                // A kind the mechanism does not publish is an absence
                // (invariant 3), whatever the descriptor is.
                if m.props.descriptor.export_types & kind == 0 {
                    return Err(m.refuse(
                        SLOT,
                        Status::Unsupported,
                        format!(
                            "handles of kind {kind:#x} are not among the kinds this mechanism imports ({:#x})",
                            m.props.descriptor.export_types
                        ),
                    ));
                }
                // The caller's descriptor must be what it says, before the
                // plugin is handed it.
                if let Err(why) = handle_kind_fault(raw, kind) {
                    return Err(m.refuse(
                        SLOT,
                        Status::InvalidArgument,
                        format!("the descriptor to import, fd {raw} of kind {kind:#x}, {why}; nothing was imported"),
                    ));
                }
                known = super::shared_mapping::file_length(raw);
                h.handle_type = kind;
                self.lend(SLOT, fd, |lent| {
                    h.fd = lent;
                    m.call(SLOT, f, (&h, &req, &mut out))
                })?;
            }
            HandleRef::Win32(w) => {
                h.handle_type = MEMPLUG_HANDLE_WIN32;
                h.win32 = w;
                m.call(SLOT, f, (&h, &req, &mut out))?;
            }
            HandleRef::Blob(b) => {
                if b.len() > h.blob.len() {
                    return Err(m.refuse(
                        SLOT,
                        Status::InvalidArgument,
                        format!("a blob of {} bytes (at most {MEMPLUG_HANDLE_BLOB_MAX})", b.len()),
                    ));
                }
                h.handle_type = MEMPLUG_HANDLE_VENDOR_BLOB;
                h.blob[..b.len()].copy_from_slice(b);
                h.blob_len = b.len() as u32;
                m.call(SLOT, f, (&h, &req, &mut out))?;
            }
        }
        self.new_object_of(SLOT, &req, &out, size, known)
    }
}
