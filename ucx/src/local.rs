//! The local side of a region transfer: a [`Region`] owned by the caller
//! (`&mut`), or a [`SharedRegion`], the form the Python binding and DLPack
//! exports hold (a region behind its own lock, shared with the views
//! exported from it). Registration and transfers need only what this
//! trait gives, so both forms take the same checks and the same pins.

use memplug_host::dlpack::SharedRegion;
use memplug_host::{BindingError, GrowError, Region, RegionView, SharedFence};

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
