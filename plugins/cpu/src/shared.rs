//! The shared mapping capability: a physical object is a sealed memfd; a
//! mapping is that memfd mapped `MAP_SHARED|MAP_FIXED` over a range of a
//! reservation; unmapping puts the reservation's `PROT_NONE` mapping back.
//!
//! References: one from `create`, one per `retain`, one per live mapping.
//! Host references and mapping references are counted apart because only
//! the host's make the handle valid: once the host has released its last
//! one the handle is refused, yet the pages stay while any mapping shows
//! them. The memfd is closed — and its pages freed — when both reach zero.
//!
//! Across processes (ABI 1.1): `export_fd` hands the caller a duplicate of
//! the memfd; `import_fd` adopts a duplicate of a sealed memfd from
//! elsewhere as a new physical object (`fd_sharing.rs` checks it). Both
//! sides then map the same pages.
//!
//! Lock order: a reservation's lock, then this table's lock; never the
//! other way round.

use crate::checks::{check_range, round_up, unknown};
use crate::classes::Counted;
use crate::fd_sharing;
use crate::flavor::Flavor;
use crate::handles::Table;
use crate::mappings::Mapping;
use crate::mechanism::CpuMechanism;
use crate::os;
use memplug_sdk::{Access, Block, ObjectRef, PluginError, PluginResult, Request, SharedMapping};
use rustix::fd::{BorrowedFd, OwnedFd};

/// One physical object.
struct Physical {
    object_id: u64,
    size: u64,
    /// References held by the host: from `create` and each `retain`.
    host_refs: u64,
    /// References held by live mappings.
    mappings: u64,
    /// Closing it (by dropping the entry) frees the pages once no mapping
    /// shows them (and no other process holds the memfd).
    fd: OwnedFd,
    /// The class the creating request was tagged with, counted while the
    /// object lives (uncounted as the entry drops).
    _class: Counted,
}

impl Physical {
    fn is(&self, obj: &ObjectRef) -> bool {
        self.host_refs > 0 && self.object_id == obj.object_id && obj.addr == 0 && self.size == obj.size
    }
}

/// Live physical objects, counting those kept only by mappings.
#[derive(Default)]
pub struct PhysicalObjects {
    table: Table<Physical>,
}

impl PhysicalObjects {
    /// Number of physical objects whose memory is still held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// A new physical object holding `fd`, with the host's one reference.
    fn insert(&self, request: &Request, size: u64, fd: OwnedFd) -> Block {
        let handle = self.table.insert(Physical {
            object_id: request.object_id,
            size,
            host_refs: 1,
            mappings: 0,
            fd,
            _class: Counted::new(request.class()),
        });
        Block { addr: 0, size, handle }
    }

    /// Drops the reference a mapping of `handle` held, closing the memfd if
    /// it was the last one.
    pub fn drop_mapping(&self, handle: u64) {
        // The entry cannot have gone: a mapping's reference keeps it. Its
        // memfd, if this was the last reference, is closed as `_last`
        // drops, after the table lock is released.
        let _last = self.table.update(
            handle,
            |p| p.mappings > 0,
            |p| {
                p.mappings -= 1;
                p.host_refs == 0 && p.mappings == 0
            },
        );
    }
}

fn find_failed(obj: &ObjectRef) -> PluginError {
    unknown(obj, "physical object")
}

#[cold]
fn wrong_state(msg: String) -> PluginError {
    PluginError::invalid_state(format!("{msg}; nothing was changed"))
}

impl<F: Flavor> SharedMapping for CpuMechanism<F> {
    fn create(&self, request: &Request) -> PluginResult<Block> {
        self.flavor.check_location(request, &self.name, "create")?;
        let size = round_up(request.size, self.granularity, "create")?;
        if size > self.memory_capacity {
            return Err(PluginError::out_of_memory(format!(
                "create: {size} bytes exceed the {} bytes of memory and swap this machine has",
                self.memory_capacity
            )));
        }
        let fd = self.flavor.object_file(size, "create")?;
        Ok(self.physical.insert(request, size, fd))
    }

    fn map(
        &self,
        object: &ObjectRef,
        object_offset: u64,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        access: Access,
    ) -> PluginResult<()> {
        let res = self.reservations.find(reservation)?;
        let mut state = res.lock(reservation)?;
        let end = check_range(offset, len, res.size, self.granularity, "map: reservation")?;
        self.physical
            .table
            .with(
                object.handle,
                |p| p.is(object),
                |p| {
                    check_range(object_offset, len, p.size, self.granularity, "map: physical object")?;
                    if state.committed.intersects(offset, end) {
                        return Err(wrong_state(format!(
                            "map: reservation range [{offset:#x}, {end:#x}) has committed pages"
                        )));
                    }
                    if state.mapped(offset, end) {
                        return Err(wrong_state(format!(
                            "map: reservation range [{offset:#x}, {end:#x}) is already mapped"
                        )));
                    }
                    state.check_not_draining("map", offset, end)?;
                    // SAFETY: the range is inside a live reservation whose
                    // lock is held, and is neither committed nor mapped; the
                    // file range was checked against the sealed size.
                    unsafe { os::map_shared(res.addr + offset, len, &p.fd, object_offset, access, "map")? };
                    p.mappings += 1;
                    Ok(())
                },
            )
            .ok_or_else(|| find_failed(object))??;
        state.mappings.insert(offset, Mapping { len, object: object.handle });
        Ok(())
    }

    fn unmap(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let res = self.reservations.find(reservation)?;
        let mut state = res.lock(reservation)?;
        state.check_unmap(offset, len, res.size, self.granularity, "unmap")?;
        // SAFETY: the range is exactly one mapping of a live reservation
        // whose lock is held; the host gives up this view of the object.
        unsafe { os::restore_reserved(res.addr + offset, len, "unmap")? };
        let removed = state.mappings.remove(offset);
        drop(state);
        if let Some(m) = removed {
            self.physical.drop_mapping(m.object);
        }
        Ok(())
    }

    fn retain(&self, object: &ObjectRef) -> PluginResult<()> {
        self.physical
            .table
            .with(
                object.handle,
                |p| p.is(object),
                |p| {
                    p.host_refs = p.host_refs.checked_add(1).ok_or_else(|| {
                        PluginError::invalid_state("retain: the reference count would overflow")
                    })?;
                    Ok(())
                },
            )
            .ok_or_else(|| find_failed(object))?
    }

    fn release(&self, object: &ObjectRef) -> PluginResult<()> {
        // A last reference's memfd closes as `_last` drops, outside the lock.
        let _last = self
            .physical
            .table
            .update(
                object.handle,
                |p| p.is(object),
                |p| {
                    p.host_refs -= 1;
                    p.host_refs == 0 && p.mappings == 0
                },
            )
            .ok_or_else(|| find_failed(object))?;
        Ok(())
    }

    const CAN_EXPORT: bool = true;

    fn export_fd(&self, object: &ObjectRef) -> PluginResult<OwnedFd> {
        self.physical
            .table
            .with(object.handle, |p| p.is(object), |p| fd_sharing::duplicate(&p.fd, "export_fd"))
            .ok_or_else(|| find_failed(object))?
    }

    fn import_fd(&self, fd: BorrowedFd<'_>, request: &Request) -> PluginResult<Block> {
        let size = round_up(request.size, self.granularity, "import_fd")?;
        let kept = self.flavor.adopt_file(fd, size)?;
        Ok(self.physical.insert(request, size, kept))
    }

    // ABI 1.2 queue-ordered binding (`queued.rs`).
    const CAN_QUEUE_MAPS: bool = true;

    fn map_on(
        &self,
        object: &ObjectRef,
        object_offset: u64,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        access: Access,
        stream: u64,
    ) -> PluginResult<u64> {
        crate::queued::map_on(self, object, object_offset, reservation, offset, len, access, stream)
    }

    fn unmap_on(&self, reservation: &ObjectRef, offset: u64, len: u64, stream: u64) -> PluginResult<u64> {
        crate::queued::unmap_on(self, reservation, offset, len, stream)
    }

    // ABI 1.2: the same descriptors, typed. The SDK has checked the kind is
    // one the descriptor offers (the flavour's one kind), so nothing else
    // arrives here.
    const CAN_EXPORT_HANDLES: bool = true;

    fn export_handle(&self, object: &ObjectRef, handle_type: u32) -> PluginResult<memplug_sdk::Handle> {
        Ok(memplug_sdk::Handle::Fd { kind: handle_type, fd: self.export_fd(object)? })
    }

    fn import_handle(&self, handle: memplug_sdk::HandleRef<'_>, request: &Request) -> PluginResult<Block> {
        match handle {
            memplug_sdk::HandleRef::Fd { fd, kind } if kind == F::OBJECT_HANDLE => self.import_fd(fd, request),
            other => Err(PluginError::unsupported(format!(
                "import_handle: {other:?} is not a descriptor of the kind this mechanism's objects are ({:#x})",
                F::OBJECT_HANDLE
            ))),
        }
    }
}
