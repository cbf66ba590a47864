//! The shared mapping capability: physical objects mapped into ranges of
//! reservations, and (ABI 1.1) shared across processes as descriptors.

use super::{class_tag, Access, MechanismInner};
use crate::error::{CallError, ObjectKind, ReleaseError};
use crate::governor::AllocationClass;
use crate::tokens::{PhysicalObject, Reservation};
use memplug_sdk::abi::*;
use memplug_sdk::Status;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Physical objects mapped into reservations.
#[derive(Clone, Copy)]
pub struct SharedMappingApi<'m> {
    pub(super) m: &'m MechanismInner,
    pub(super) vt: &'m MemplugSharedMapping,
}

impl<'m> SharedMappingApi<'m> {
    /// Creates a zero-filled physical object of at least `size` bytes.
    pub fn create(&self, size: u64) -> Result<PhysicalObject, CallError> {
        self.create_tagged(size, MEMPLUG_CLASS_OTHER)
    }

    /// [`create`](Self::create), telling a 1.1 plugin what the object is
    /// for.
    pub fn create_as(&self, size: u64, class: AllocationClass) -> Result<PhysicalObject, CallError> {
        self.create_tagged(size, class_tag(class))
    }

    fn create_tagged(&self, size: u64, tag: u32) -> Result<PhysicalObject, CallError> {
        const SLOT: &str = "shared_mapping.create";
        let m = self.m;
        let req = m.request(size, m.props.granularity, tag);
        let mut out = MechanismInner::empty_block();
        m.call(SLOT, slot!(self.vt.create), (&req, &mut out))?;
        self.new_object(SLOT, &req, &out, size)
    }

    /// Counts a physical object the plugin reported making, after checking
    /// it is at least as large as asked.
    fn new_object(
        &self,
        slot: &'static str,
        req: &MemplugRequest,
        out: &MemplugBlock,
        size: u64,
    ) -> Result<PhysicalObject, CallError> {
        let m = self.m;
        if out.size < size {
            return Err(m.refuse(
                slot,
                Status::Internal,
                format!("plugin reported success but returned {} bytes for {size}", out.size),
            ));
        }
        m.born(ObjectKind::PhysicalObject);
        Ok(PhysicalObject(m.object(req, out)))
    }

    /// Maps `[object_offset, +len)` of `object` at `[offset, +len)` of `r`.
    pub fn map(
        &self,
        object: &PhysicalObject,
        object_offset: u64,
        r: &Reservation,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<(), CallError> {
        const SLOT: &str = "shared_mapping.map";
        let m = self.m;
        let o = m.ref_if_made_here(SLOT, &object.0)?;
        let res = m.ref_if_made_here(SLOT, &r.0)?;
        m.check_range(SLOT, "physical object", object.0.size, object_offset, len)?;
        m.check_range(SLOT, "reservation", r.0.size, offset, len)?;
        m.call(SLOT, slot!(self.vt.map), (&o, object_offset, &res, offset, len, access.bits()))
    }

    /// Unmaps the mapping at `[offset, +len)` of `r`.
    pub fn unmap(&self, r: &Reservation, offset: u64, len: u64) -> Result<(), CallError> {
        const SLOT: &str = "shared_mapping.unmap";
        let res = self.m.ref_if_made_here(SLOT, &r.0)?;
        self.m.check_range(SLOT, "reservation", r.0.size, offset, len)?;
        self.m.call(SLOT, slot!(self.vt.unmap), (&res, offset, len))
    }

    /// Takes another reference to `object`; release each one.
    pub fn retain(&self, object: &PhysicalObject) -> Result<PhysicalObject, CallError> {
        const SLOT: &str = "shared_mapping.retain";
        let o = self.m.ref_if_made_here(SLOT, &object.0)?;
        self.m.call(SLOT, slot!(self.vt.retain), (&o,))?;
        self.m.born(ObjectKind::PhysicalObject);
        Ok(PhysicalObject(object.0))
    }

    /// Whether [`export_fd`](Self::export_fd) and
    /// [`import_fd`](Self::import_fd) can be called: the plugin agreed on
    /// ABI 1.1 or newer and has `MEMPLUG_CAP_SHARED_EXPORT`.
    pub fn can_export(&self) -> bool {
        self.vt.export_fd.is_some() && self.vt.import_fd.is_some()
    }

    /// Why export/import are absent (`Unsupported`, never a no-op).
    #[cold]
    fn no_export(&self, slot: &'static str) -> CallError {
        let why = if self.m.minor == 0 {
            "the plugin agreed on ABI 1.0; sharing across processes needs 1.1".to_string()
        } else {
            "the mechanism does not have MEMPLUG_CAP_SHARED_EXPORT".to_string()
        };
        self.m.refuse(slot, Status::Unsupported, why)
    }

    /// A new file descriptor for the memory of `object`, to hand to another
    /// process (for example over a Unix socket with `SCM_RIGHTS`), which
    /// imports it with [`import_fd`](Self::import_fd). The descriptor is
    /// the caller's; it holds the memory, not a counted reference, so the
    /// object is released as usual. `Unsupported` when the plugin agreed on
    /// 1.0 or lacks the capability.
    pub fn export_fd(&self, object: &PhysicalObject) -> Result<OwnedFd, CallError> {
        const SLOT: &str = "shared_mapping.export_fd";
        let Some(f) = self.vt.export_fd else {
            return Err(self.no_export(SLOT));
        };
        let o = self.m.ref_if_made_here(SLOT, &object.0)?;
        let mut fd: i32 = -1;
        self.m.call(SLOT, f, (&o, &mut fd))?;
        if fd < 0 {
            return Err(self.m.refuse(
                SLOT,
                Status::Internal,
                format!("plugin reported success but returned fd {fd}"),
            ));
        }
        // SAFETY: on success the plugin hands over a descriptor the caller
        // owns (ABI contract); nothing else owns this number.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// A physical object of this mechanism backed by the memory `fd` names
    /// (exported by [`export_fd`](Self::export_fd), here or in another
    /// process), of at least `size` bytes. `fd` stays the caller's. Release
    /// the object as one made by [`create`](Self::create). `Unsupported`
    /// when the plugin agreed on 1.0 or lacks the capability.
    pub fn import_fd(&self, fd: BorrowedFd<'_>, size: u64) -> Result<PhysicalObject, CallError> {
        const SLOT: &str = "shared_mapping.import_fd";
        let Some(f) = self.vt.import_fd else {
            return Err(self.no_export(SLOT));
        };
        let m = self.m;
        let req = m.request(size, m.props.granularity, MEMPLUG_CLASS_OTHER);
        let mut out = MechanismInner::empty_block();
        // `fd` is borrowed: open for the whole call.
        m.call(SLOT, f, (fd.as_raw_fd(), &req, &mut out))?;
        self.new_object(SLOT, &req, &out, size)
    }

    /// Drops one reference.
    pub fn release(&self, object: PhysicalObject) -> Result<(), ReleaseError<PhysicalObject>> {
        const SLOT: &str = "shared_mapping.release";
        let m = self.m;
        m.release_object(SLOT, object, ObjectKind::PhysicalObject, slot!(self.vt.release), |o| {
            Ok((m.ref_if_made_here(SLOT, &o.0)?,))
        })
    }
}
