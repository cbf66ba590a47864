//! The local side of a transfer: a [`Region`] owned by the caller
//! (`&mut`), or a [`SharedRegion`], the form the Python binding and DLPack
//! exports hold (a region behind its own lock, shared with the views
//! exported from it); an [`OwnedAllocation`], a [`CachedAllocation`] (a
//! caching binding's block), or any form that holds one and keeps its free
//! behind recorded work ([`LocalAllocation`]: the Python binding's
//! allocations, shared with their DLPack exports).
//! Registration and transfers need only what these traits give, so every
//! form takes the same checks and the same pins.

use memplug_host::dlpack::SharedRegion;
use memplug_host::{
    BindingError, CachedAllocation, GrowError, OwnedAllocation, Region, RegionView, SharedFence,
};

/// A region as registration and transfers see it.
///
/// For a [`SharedRegion`] each call takes the region's lock on its own: a
/// check and the grow or pin that follows are not one step, so a shrink
/// from another thread between them is possible; the pin or fence recorded
/// afterwards still orders every later shrink, and a shrink's decommit
/// waits for fences already recorded.
pub trait LocalRegion {
    /// Base address and usable length now.
    fn view(&self) -> RegionView;
    /// Private bytes committed (usable length minus the mapped prefix).
    fn committed(&self) -> u64;
    /// Address space reserved.
    fn capacity(&self) -> u64;
    /// Whether the mapped prefix is read-only.
    fn prefix_is_read_only(&self) -> bool;
    /// Grows the usable length to `len` (charged first: `OutOfBudget`).
    fn grow_to(&mut self, len: u64) -> Result<(), BindingError>;
    /// Records work in flight on the region (its shrink, offload,
    /// privatise and release wait for it).
    fn used_by(&mut self, fence: SharedFence);
}

fn grown(r: Result<(), GrowError<std::convert::Infallible>>) -> Result<(), BindingError> {
    r.map_err(|e| match e {
        GrowError::Binding(b) => b,
        GrowError::Update(never) => match never {},
    })
}

impl LocalRegion for Region {
    fn view(&self) -> RegionView {
        Region::view(self)
    }
    fn committed(&self) -> u64 {
        Region::committed(self)
    }
    fn capacity(&self) -> u64 {
        Region::capacity(self)
    }
    fn prefix_is_read_only(&self) -> bool {
        Region::prefix_is_read_only(self)
    }
    fn grow_to(&mut self, len: u64) -> Result<(), BindingError> {
        grown(Region::grow_to(self, len, |_| Ok(())))
    }
    fn used_by(&mut self, fence: SharedFence) {
        Region::used_by(self, fence)
    }
}

impl LocalRegion for SharedRegion {
    fn view(&self) -> RegionView {
        SharedRegion::view(self)
    }
    fn committed(&self) -> u64 {
        self.with(Region::committed)
    }
    fn capacity(&self) -> u64 {
        self.with(Region::capacity)
    }
    fn prefix_is_read_only(&self) -> bool {
        self.with(Region::prefix_is_read_only)
    }
    fn grow_to(&mut self, len: u64) -> Result<(), BindingError> {
        grown(SharedRegion::grow_to(self, len, |_| Ok(())))
    }
    fn used_by(&mut self, fence: SharedFence) {
        SharedRegion::used_by(self, fence)
    }
}

/// An allocation as registration and transfers see it.
pub trait LocalAllocation {
    /// The first byte's address.
    fn addr(&self) -> u64;
    /// Usable bytes.
    fn size(&self) -> u64;
    /// Whether it went with a lost device.
    fn is_lost(&self) -> bool;
    /// Records a transfer on it: its free waits for the transfer (and so
    /// may a reader that must see the bytes landed).
    fn used_by(&mut self, fence: SharedFence);
    /// Records a registration's pin: its free waits until the range is
    /// deregistered. Separate from [`used_by`](Self::used_by) because a
    /// form whose exports wait for recorded work (the Python binding's)
    /// must not make its readers wait for a deregistration; by default the
    /// same record.
    fn pinned_by(&mut self, fence: SharedFence) {
        self.used_by(fence)
    }
}

impl LocalAllocation for OwnedAllocation {
    fn addr(&self) -> u64 {
        OwnedAllocation::addr(self)
    }
    fn size(&self) -> u64 {
        OwnedAllocation::size(self)
    }
    fn is_lost(&self) -> bool {
        OwnedAllocation::is_lost(self)
    }
    fn used_by(&mut self, fence: SharedFence) {
        OwnedAllocation::used_by(self, fence)
    }
}

/// A caching binding's block. Both a registration and a transfer pin it
/// ([`CachedAllocation::pinned_by`]): freed meanwhile, the block is kept
/// out of the cache's idle lists — handed to no other request, on the
/// stream it was freed on neither, and not given back to the mechanism by
/// trim or pressure — until the registration is gone and the transfer
/// complete. (A plain `used_by` fence would not do for a transfer: a block
/// freed with `free_on` is reused on its stream without asking its fences.)
/// The range is the bytes requested ([`CachedAllocation::size`]), not the
/// whole block.
impl LocalAllocation for CachedAllocation {
    fn addr(&self) -> u64 {
        CachedAllocation::addr(self)
    }
    fn size(&self) -> u64 {
        CachedAllocation::size(self)
    }
    fn is_lost(&self) -> bool {
        CachedAllocation::is_lost(self)
    }
    fn used_by(&mut self, fence: SharedFence) {
        CachedAllocation::pinned_by(self, fence)
    }
    fn pinned_by(&mut self, fence: SharedFence) {
        CachedAllocation::pinned_by(self, fence)
    }
}
