//! The allocator capability: aligned blocks from the global allocator, one
//! slab slot each.
//!
//! This is the path benchmarked against malloc/free, so the success path
//! formats nothing and allocates nothing but the block: one slab insert or
//! remove under an uncontended mutex, and the memory call made outside it.

use crate::checks::{check_owner, check_request, unknown};
use crate::handles::Table;
use crate::mechanism::CpuMechanism;
use crate::meminfo;
use memplug_sdk::{Allocator, Block, MemoryInfo, ObjectRef, PluginError, PluginResult, Properties, Request};
use std::alloc::Layout;

/// Alignment every allocation has: what malloc gives on x86-64 and
/// aarch64, so small requests cost nothing extra.
pub const MIN_ALIGNMENT: u64 = 16;
/// Largest alignment honoured: 1 GiB, the largest page size of either
/// architecture.
pub const MAX_ALIGNMENT: u64 = 1 << 30;

/// What was issued for one allocation, to check references against and to
/// rebuild its layout when it is freed.
struct Issued {
    object_id: u64,
    addr: u64,
    size: u64,
    align: u64,
}

impl Issued {
    #[inline]
    fn is(&self, obj: &ObjectRef) -> bool {
        self.object_id == obj.object_id && self.addr == obj.addr && self.size == obj.size
    }
}

/// Live allocations.
#[derive(Default)]
pub struct Allocations {
    table: Table<Issued>,
}

impl Allocations {
    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        check_request(r, "allocate")?;
        if !r.alignment.is_power_of_two() || r.alignment > MAX_ALIGNMENT {
            return Err(bad_alignment(r.alignment));
        }
        let align = r.alignment.max(MIN_ALIGNMENT);
        // Layout's own rule: the size rounded up to the alignment must not
        // exceed isize::MAX. Checked here once, so the layout can be built
        // without checking the alignment a second time.
        if r.size > isize::MAX as u64 - (align - 1) {
            return Err(too_big(r.size));
        }
        // SAFETY: `align` is a power of two (checked above) and the size
        // obeys Layout's limit, so the layout is valid; the size is non-zero
        // (check_request), as `alloc` requires.
        let p =
            unsafe { std::alloc::alloc(Layout::from_size_align_unchecked(r.size as usize, align as usize)) };
        if p.is_null() {
            return Err(too_big(r.size));
        }
        let handle = self.table.insert(Issued {
            object_id: r.object_id,
            addr: p as u64,
            size: r.size,
            align,
        });
        Ok(Block {
            addr: p as u64,
            size: r.size,
            handle,
        })
    }

    fn deallocate(&self, obj: &ObjectRef) -> PluginResult<()> {
        check_owner(obj, "allocation")?;
        let issued = self
            .table
            .remove(obj.handle, |e| e.is(obj))
            .ok_or_else(|| unknown(obj, "allocation"))?;
        // SAFETY: the slot held exactly what `allocate` got from
        // `std::alloc::alloc` with this (valid) size and alignment, and
        // removing it from the table makes this the only free of that block.
        unsafe {
            std::alloc::dealloc(
                issued.addr as *mut u8,
                Layout::from_size_align_unchecked(issued.size as usize, issued.align as usize),
            )
        };
        Ok(())
    }
}

#[cold]
fn bad_alignment(alignment: u64) -> PluginError {
    PluginError::invalid_argument(format!(
        "allocate: alignment {alignment} must be a power of two from 1 to {MAX_ALIGNMENT}"
    ))
}

#[cold]
fn too_big(size: u64) -> PluginError {
    PluginError::out_of_memory(format!("allocate: {size} bytes cannot be allocated"))
}

impl Allocator for CpuMechanism {
    const HAS_MEMORY_INFO: bool = true;

    fn properties(&self) -> Properties {
        Properties {
            min_alignment: MIN_ALIGNMENT,
            max_alignment: MAX_ALIGNMENT,
            granularity: self.granularity,
        }
    }

    fn allocate(&self, request: &Request) -> PluginResult<Block> {
        self.allocations.allocate(request)
    }

    fn deallocate(&self, object: &ObjectRef) -> PluginResult<()> {
        self.allocations.deallocate(object)
    }

    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        meminfo::read()
    }
}
