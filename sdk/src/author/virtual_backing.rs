//! Optional capability: reserve a virtual range, commit and decommit parts
//! of it (`VirtualBacking`).

use super::*;

/// Optional capability: reserve address ranges, commit and decommit
/// physical memory in them, release them.
///
/// Already checked by the SDK for every method, before it is called: each
/// reservation reference's `mechanism_id` (`WRONG_MECHANISM`) and `device`
/// (`WRONG_DEVICE`), and for `commit` and `decommit` that the range
/// `(offset, len)` is non-empty, a multiple of the granularity at both ends
/// and that `offset + len` does not overflow (all `OUT_OF_RANGE`). The SDK
/// cannot know a reservation's real size, so the bound `offset + len <=
/// size` (`OUT_OF_RANGE`) is yours, against the size you recorded.
pub trait VirtualBacking: Send + Sync + 'static {
    /// Reserves `request.size` bytes rounded up to the granularity, nothing
    /// committed, at a granularity-aligned address. The request is checked
    /// as for [`Allocator::allocate`] except the alignment, which the ABI
    /// says is ignored and is passed unchecked. Yours: rounding (a size
    /// that cannot be rounded is `OUT_OF_MEMORY`) and remembering
    /// `object_id`.
    fn reserve(&self, request: &Request) -> PluginResult<Block>;
    /// Makes `[offset, offset + len)` usable. Yours: the handle names a live
    /// reservation (`UNKNOWN_ALLOCATION`), the range is within it
    /// (`OUT_OF_RANGE`), no page of it is committed or mapped
    /// (`INVALID_STATE`); on failure nothing is committed.
    fn commit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    /// Gives the memory of `[offset, offset + len)` back; it reads as zeros
    /// after a later commit. Yours: as for `commit`, with every page
    /// committed (`INVALID_STATE` otherwise).
    fn decommit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    /// Bytes committed by `commit` and not decommitted (mapped ranges do
    /// not count). Yours: the handle (`UNKNOWN_ALLOCATION`).
    fn committed_bytes(&self, reservation: &ObjectRef) -> PluginResult<u64>;
    /// Decommits everything, unmaps every shared mapping in the reservation
    /// (dropping their references) and gives the range back. Yours: the
    /// handle (`UNKNOWN_ALLOCATION`).
    fn release(&self, reservation: &ObjectRef) -> PluginResult<()>;

    /// Whether binding is also a queue operation (ABI 1.2,
    /// `MEMPLUG_CAP_QUEUED_BINDING`): `commit_on`/`decommit_on` (and, with
    /// a shared mapping, its `map_on`/`unmap_on`, which must then be
    /// implemented too) are published to 1.2 hosts. Needs the sync
    /// capability: the stream and the fence returned are yours.
    const CAN_QUEUE: bool = false;

    /// `commit` enqueued on `stream` after its earlier work; returns a fence
    /// that completes once the range is usable. The reservation and range
    /// are checked as for `commit`; the stream is yours to check.
    fn commit_on(
        &self,
        _reservation: &ObjectRef,
        _offset: u64,
        _len: u64,
        _stream: u64,
    ) -> PluginResult<u64> {
        Err(PluginError::unsupported("commit_on is not published"))
    }

    /// `decommit` enqueued on `stream`, as [`commit_on`](Self::commit_on).
    fn decommit_on(
        &self,
        _reservation: &ObjectRef,
        _offset: u64,
        _len: u64,
        _stream: u64,
    ) -> PluginResult<u64> {
        Err(PluginError::unsupported("decommit_on is not published"))
    }
}
