//! What a grow update or a prefix initialiser sees of a region: its base
//! address and usable length, and whether it went with a lost device.

/// A view of a region's usable bytes, given to grow updates and prefix
/// initialisers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionView {
    /// The region's base address (its reservation's first byte); the same
    /// in every view of one region.
    pub addr: u64,
    /// Usable bytes from `addr`: the mapped prefix plus the committed
    /// private part.
    pub len: u64,
    /// The region's context was lost when the view was taken: its memory
    /// is gone and must not be touched.
    pub(crate) lost: bool,
    /// The region's private bytes were in host memory when the view was
    /// taken (`Region::offload_to`): only the prefix is on the device.
    pub(crate) offloaded: bool,
}

impl RegionView {
    /// Whether the region's context was lost when the view was taken (its
    /// memory is gone).
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Whether the region's private bytes were offloaded to host memory
    /// when the view was taken: the device range past the prefix is not
    /// committed, and nothing may touch it until `Region::restore`.
    pub fn is_offloaded(&self) -> bool {
        self.offloaded
    }

    /// The bytes, for mechanisms whose addresses are host addresses (CPU).
    ///
    /// # Safety
    /// The mechanism's memory must be host-accessible and mapped writable,
    /// and nothing else may access it for the lifetime of the slice.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len as usize)
    }
}
