//! Plain allocations of the placed and huge-page mechanisms: one fresh
//! mapping each, prepared by the flavour (bound to a node, or backed by
//! huge pages) before the host sees it. A placement or a page size cannot
//! be given to memory carved from the shared system heap, so these
//! allocations cost a system call each and take at least one granule; the
//! `"cpu"` mechanism keeps the heap path for small, frequent allocations.

use crate::checks::{round_up, unknown};
use crate::flavor::Flavor;
use crate::handles::Table;
use crate::os;
use memplug_sdk::{Block, ObjectRef, PluginResult, Request};

/// What was issued for one allocation.
struct Issued {
    object_id: u64,
    addr: u64,
    /// Bytes the host asked for (what references name).
    size: u64,
    /// Bytes mapped: the size rounded up to the granularity.
    mapped: u64,
}

/// Live mapped allocations.
#[derive(Default)]
pub struct MappedAllocations {
    table: Table<Issued>,
}

impl MappedAllocations {
    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// A fresh mapping of `r.size` bytes (rounded up to `granularity`)
    /// aligned to `r.alignment` (the SDK checked it against the published
    /// maximum and raised it to the minimum, the granularity).
    pub fn allocate<F: Flavor>(&self, flavor: &F, granularity: u64, r: &Request) -> PluginResult<Block> {
        let mapped = round_up(r.size, granularity, "allocate")?;
        let addr = flavor.map_allocation(mapped, r.alignment.max(granularity), "allocate")?;
        let handle = self.table.insert(Issued { object_id: r.object_id, addr, size: r.size, mapped });
        Ok(Block { addr, size: r.size, handle })
    }

    /// `(addr, size)` of a live allocation that shares a byte with
    /// `[start, end)`, if any (a scan).
    pub fn meeting(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        self.table
            .lock()
            .iter()
            .map(|(_, i)| i)
            .find(|i| i.addr < end && start < i.addr + i.size)
            .map(|i| (i.addr, i.size))
    }

    /// Unmaps the allocation `obj` names.
    pub fn deallocate(&self, obj: &ObjectRef) -> PluginResult<()> {
        let issued = self
            .table
            .remove(obj.handle, |e| e.object_id == obj.object_id && e.addr == obj.addr && e.size == obj.size)
            .ok_or_else(|| unknown(obj, "allocation"))?;
        // SAFETY: the range was mapped by `allocate` for this allocation
        // alone, and removing it from the table makes this its only unmap.
        unsafe { os::unreserve(issued.addr, issued.mapped, "deallocate") }
    }
}
