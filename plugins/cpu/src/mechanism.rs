//! The `"cpu"` mechanism: its identity and the tables of everything it has
//! handed out. The capability traits are implemented next to the state they
//! drive (`allocator.rs`, `virtual_backing.rs`, `shared.rs`, `streams.rs`).

use crate::allocator::Allocations;
use crate::reservations::Reservations;
use crate::shared::PhysicalObjects;
use crate::streams::Streams;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};

/// Mechanism name published in the descriptor.
pub const MECHANISM_NAME: &str = "cpu";
/// Mechanism id published in the descriptor; every object reference must
/// carry it.
pub const MECHANISM_ID: u64 = 1;
/// The one device this mechanism serves.
pub const DEVICE: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// State of one plugin instance. Each kind of object has its own table, so
/// a handle of one kind can never be resolved as another.
pub struct CpuMechanism {
    /// The OS page size: granularity of reservations, commits and physical
    /// objects.
    pub(crate) granularity: u64,
    /// RAM plus swap, read once: physical objects larger than this are
    /// refused.
    pub(crate) memory_capacity: u64,
    /// Plain allocations.
    pub(crate) allocations: Allocations,
    /// Address-space reservations, with their committed ranges and mappings.
    pub(crate) reservations: Reservations,
    /// memfd-backed physical objects.
    pub(crate) physical: PhysicalObjects,
    /// Streams and fences.
    pub(crate) streams: Streams,
}

impl CpuMechanism {
    /// An instance with nothing alive.
    pub fn new() -> Self {
        CpuMechanism {
            granularity: crate::os::page_size(),
            memory_capacity: crate::meminfo::capacity_bytes().unwrap_or(u64::MAX),
            allocations: Allocations::default(),
            reservations: Reservations::default(),
            physical: PhysicalObjects::default(),
            streams: Streams::default(),
        }
    }

    /// Allocations + reservations + physical objects + streams + fences
    /// alive now. A physical object counts until its last reference, mapping
    /// references included, is gone: its memory is still held until then.
    pub fn live_objects(&self) -> u64 {
        (self.allocations.len()
            + self.reservations.len()
            + self.physical.len()
            + self.streams.stream_count()
            + self.streams.fence_count()) as u64
    }
}
