//! Optional capability: physical objects mapped at several addresses,
//! exported and imported (`SharedMapping`).

use super::*;
use std::os::fd::{BorrowedFd, OwnedFd};

/// Optional capability: physical objects mapped into ranges of
/// reservations of the same mechanism.
///
/// Already checked by the SDK for every method, before it is called: each
/// object and reservation reference's `mechanism_id` (`WRONG_MECHANISM`)
/// and `device` (`WRONG_DEVICE`); for `map` the access bits (read or
/// read|write, else `INVALID_ARGUMENT`) and both ranges, and for `unmap`
/// its range: non-empty, multiples of the granularity, no overflow of
/// `offset + len` (`OUT_OF_RANGE`). Yours: handles (`UNKNOWN_ALLOCATION`,
/// including a reservation passed as a physical object), bounds against the
/// sizes you recorded (`OUT_OF_RANGE`), and state (`INVALID_STATE`);
/// nothing changes on failure.
pub trait SharedMapping: Send + Sync + 'static {
    /// Creates a zero-filled physical object of `request.size` bytes
    /// rounded up to the granularity, holding one reference; `addr` is
    /// zero. The request is checked as for [`VirtualBacking::reserve`].
    fn create(&self, request: &Request) -> PluginResult<Block>;
    /// Maps `[object_offset, object_offset + len)` of `object` at
    /// `[offset, offset + len)` of `reservation`, adding a reference to the
    /// object. Yours: both handles, both bounds, and that the reservation
    /// range is neither committed nor mapped (`INVALID_STATE`).
    #[allow(clippy::too_many_arguments)]
    fn map(
        &self,
        object: &ObjectRef,
        object_offset: u64,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        access: Access,
    ) -> PluginResult<()>;
    /// Unmaps exactly one earlier mapping that starts at `offset` of
    /// `reservation` and spans `len` bytes, dropping its reference. Yours:
    /// the handle, and that such a mapping exists.
    fn unmap(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    /// Adds a reference to `object`. Yours: the handle.
    fn retain(&self, object: &ObjectRef) -> PluginResult<()>;
    /// Whether `map_on`/`unmap_on` are published (ABI 1.2, with the virtual
    /// backing's `CAN_QUEUE`: `MEMPLUG_CAP_QUEUED_BINDING` needs both).
    const CAN_QUEUE_MAPS: bool = false;
    /// `map` enqueued on `stream` (ABI 1.2); returns a fence that completes
    /// once the mapping is usable. Checked as for `map`.
    #[allow(clippy::too_many_arguments)]
    fn map_on(
        &self,
        _object: &ObjectRef,
        _object_offset: u64,
        _reservation: &ObjectRef,
        _offset: u64,
        _len: u64,
        _access: Access,
        _stream: u64,
    ) -> PluginResult<u64> {
        Err(PluginError::unsupported("map_on is not published"))
    }
    /// `unmap` enqueued on `stream`, as [`map_on`](Self::map_on).
    fn unmap_on(&self, _reservation: &ObjectRef, _offset: u64, _len: u64, _stream: u64) -> PluginResult<u64> {
        Err(PluginError::unsupported("unmap_on is not published"))
    }
    /// Drops a reference from `create` or `retain`; the memory goes back
    /// when the last reference (mappings included) is gone. Yours: the
    /// handle, and refusing a release too many.
    fn release(&self, object: &ObjectRef) -> PluginResult<()>;

    /// Whether `export_fd` and `import_fd` are published (ABI 1.1,
    /// `MEMPLUG_CAP_SHARED_EXPORT`). When false the slots are NULL, the
    /// flag is clear, and the two methods below are never called. Hosts
    /// that agreed on 1.0 never see them either way.
    const CAN_EXPORT: bool = false;

    /// A new descriptor for the memory of a live physical object, owned by
    /// the caller (the host, which may pass it to another process). Called
    /// only when `CAN_EXPORT` is true, with the reference checked as for
    /// the other methods and the host's `out_fd` non-NULL. Yours: the
    /// handle; make the descriptor for this call (never one you keep).
    fn export_fd(&self, _object: &ObjectRef) -> PluginResult<OwnedFd> {
        Err(PluginError::unsupported("export_fd is not published"))
    }

    /// A physical object backed by the memory `fd` names, of
    /// `request.size` bytes (rounded up to the granularity), holding one
    /// reference as from `create`. `fd` stays the caller's: duplicate what
    /// you keep. Called only when `CAN_EXPORT` is true, with `fd`
    /// non-negative and the request checked as for `create`. Yours: a
    /// descriptor you cannot use (`INVALID_ARGUMENT`), and a size larger
    /// than the memory behind it.
    fn import_fd(&self, _fd: BorrowedFd<'_>, _request: &Request) -> PluginResult<Block> {
        Err(PluginError::unsupported("import_fd is not published"))
    }

    /// Whether `export_handle` and `import_handle` are published (ABI 1.2,
    /// `MEMPLUG_CAP_TYPED_EXPORT`), to hosts that agreed on 1.2. The kinds
    /// offered are your [`Descriptor::export_types`](crate::Descriptor).
    const CAN_EXPORT_HANDLES: bool = false;

    /// A new handle of kind `handle_type` for a live physical object's
    /// memory, owned by the caller. Called only when `CAN_EXPORT_HANDLES`
    /// is true, with the reference checked, `handle_type` one kind your
    /// descriptor's `export_types` lists (else the SDK answered
    /// `UNSUPPORTED`), and the host's out struct writable. Return a handle
    /// of exactly that kind (another is refused as your internal error).
    /// Yours: an object not made exportable that way (`UNSUPPORTED`).
    fn export_handle(&self, _object: &ObjectRef, _handle_type: u32) -> PluginResult<crate::Handle> {
        Err(PluginError::unsupported("export_handle is not published"))
    }

    /// A physical object backed by `handle`'s memory, of `request.size`
    /// bytes (rounded up to the granularity), holding one reference as from
    /// `create`. The handle stays the caller's. Called only when
    /// `CAN_EXPORT_HANDLES` is true, with the handle's kind one your
    /// descriptor lists, a descriptor non-negative, a blob at most 64 bytes,
    /// and the request checked as for `create`. Yours: a handle you cannot
    /// use (`INVALID_ARGUMENT`), a size larger than the memory behind it.
    fn import_handle(&self, _handle: crate::HandleRef<'_>, _request: &Request) -> PluginResult<Block> {
        Err(PluginError::unsupported("import_handle is not published"))
    }
}
