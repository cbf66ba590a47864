//! A CPU mechanism: its flavour (what kind of host memory it serves) and
//! the tables of everything it has handed out. The capability traits are
//! implemented next to the state they drive (`allocator.rs`,
//! `virtual_backing.rs`, `shared.rs`, `streams.rs`), once for every
//! flavour.

use crate::allocator::Allocations;
use crate::flavor::{Base, Flavor};
use crate::mapped_allocations::MappedAllocations;
use crate::reservations::Reservations;
use crate::shared::PhysicalObjects;
use crate::streams::Streams;
use std::sync::Arc;

/// State of one mechanism of one plugin instance. Each kind of object has
/// its own table, so a handle of one kind can never be resolved as another.
pub struct CpuMechanism<F: Flavor = Base> {
    /// The mechanism's name, for messages.
    pub(crate) name: String,
    /// What kind of memory it serves.
    pub(crate) flavor: F,
    /// The flavour's granularity: of reservations, commits and physical
    /// objects.
    pub(crate) granularity: u64,
    /// RAM plus swap, read once: physical objects larger than this are
    /// refused.
    pub(crate) memory_capacity: u64,
    /// Plain allocations from the system allocator (flavours with
    /// `SYSTEM_HEAP`).
    pub(crate) allocations: Allocations,
    /// Plain allocations that are mappings of their own (the others).
    pub(crate) mapped: MappedAllocations,
    /// Address-space reservations, with their committed ranges and mappings.
    pub(crate) reservations: Reservations,
    /// memfd-backed physical objects (shared with queued unmaps, which
    /// drop a mapping's reference when their stream runs them).
    pub(crate) physical: Arc<PhysicalObjects>,
    /// Streams and fences.
    pub(crate) streams: Streams,
}

impl<F: Flavor> CpuMechanism<F> {
    /// A mechanism called `name` serving `flavor`, with nothing alive.
    pub fn new(name: &str, flavor: F) -> Self {
        CpuMechanism {
            name: name.to_string(),
            granularity: flavor.granularity(),
            flavor,
            memory_capacity: crate::meminfo::capacity_bytes().unwrap_or(u64::MAX),
            allocations: Allocations::default(),
            mapped: MappedAllocations::default(),
            reservations: Reservations::default(),
            physical: Arc::default(),
            streams: Streams::default(),
        }
    }

    /// Allocations + reservations + physical objects + streams + fences
    /// alive now. A physical object counts until its last reference, mapping
    /// references included, is gone: its memory is still held until then.
    pub fn live_objects(&self) -> u64 {
        (self.allocations.len()
            + self.mapped.len()
            + self.reservations.len()
            + self.physical.len()
            + self.streams.stream_count()
            + self.streams.fence_count()) as u64
    }
}
