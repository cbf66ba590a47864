//! The allocator capability. For `"cpu"`: aligned blocks from the system
//! allocator, one slot each in a sharded handle table; the placed and
//! huge-page mechanisms map each allocation (`mapped_allocations.rs`).
//!
//! This is the path benchmarked against malloc/free (ARCHITECTURE.md §6), so the
//! success path formats nothing and allocates nothing but the block, and is
//! inlined whole into the SDK's slot thunk: one slot insert or remove under
//! a short per-shard lock, and the memory call made outside it.

use crate::checks::{unknown, unknown_object};
use crate::flavor::Flavor;
use crate::mechanism::CpuMechanism;
use crate::slots::{Insertion, Pending, Removal, Slots};
use memplug_sdk::{Allocator, Block, MemoryInfo, ObjectRef, PluginError, PluginResult, Properties, Request};

/// Alignment every allocation has: what malloc gives on x86-64 and
/// aarch64, so small requests cost nothing extra.
pub const MIN_ALIGNMENT: u64 = 16;
/// Largest alignment honoured: 1 GiB, the largest page size of either
/// architecture.
pub const MAX_ALIGNMENT: u64 = 1 << 30;
/// Whether the C allocator's `malloc` gives [`MIN_ALIGNMENT`] to every
/// block of at least that many bytes: the C ABIs of these architectures
/// make `max_align_t` 16 bytes, and glibc, musl and the BSDs' and Apple's
/// allocators honour it. Elsewhere every block comes from `posix_memalign`.
const MALLOC_GIVES_MIN_ALIGNMENT: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

/// What was issued for one allocation, to check references against.
#[derive(Clone, Copy)]
struct Issued {
    object_id: u64,
    addr: u64,
    size: u64,
}

impl Issued {
    /// Whether this is what a reference with these fields names. Takes
    /// the fields, not the reference, so a caller out of line can be
    /// handed them in registers.
    #[inline(always)]
    fn is(&self, object_id: u64, addr: u64, size: u64) -> bool {
        self.object_id == object_id && self.addr == addr && self.size == size
    }
}

/// Live allocations.
#[derive(Default)]
pub struct Allocations {
    table: Slots<Issued>,
}

impl Allocations {
    /// Number of live allocations.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// `(addr, size)` of a live allocation that shares a byte with
    /// `[start, end)`, if any (a scan of every shard: for copies, not for
    /// the allocate/free path).
    pub fn meeting(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        self.table.find_map(|i| (i.addr < end && start < i.addr + i.size).then_some((i.addr, i.size)))
    }

    /// The SDK has refused unknown flags, a zero size, another device and an
    /// alignment that is not a power of two up to [`MAX_ALIGNMENT`] (this
    /// mechanism's `max_alignment`), and raised it to [`MIN_ALIGNMENT`].
    #[inline(always)]
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        debug_assert!(r.size != 0 && r.alignment.is_power_of_two());
        debug_assert!((MIN_ALIGNMENT..=MAX_ALIGNMENT).contains(&r.alignment));
        let (size, align) = (r.size, r.alignment);
        // The C allocator's memory, called directly: the host gets it
        // whatever global allocator this library might set, and the common
        // case is two compares and `malloc` (`std`'s `System` would test
        // the layout again, after a bound on the size for its `Layout`).
        // (A size no `usize` holds, only on 32-bit targets, goes to
        // `aligned`, which refuses it.)
        let p = if MALLOC_GIVES_MIN_ALIGNMENT
            && align == MIN_ALIGNMENT
            && size >= MIN_ALIGNMENT
            && size <= usize::MAX as u64
        {
            // SAFETY: plain malloc; the block is at least 16-aligned here
            // (see MALLOC_GIVES_MIN_ALIGNMENT).
            unsafe { libc::malloc(size as usize) }
        } else {
            aligned(size, align)
        };
        if p.is_null() {
            return Err(too_big(size));
        }
        let issued = Issued { object_id: r.object_id, addr: p as u64, size };
        match self.table.try_insert(issued) {
            Insertion::Inserted(handle) => Ok(Block { addr: p as u64, size, handle }),
            Insertion::Later(pending) => self.insert_later(pending),
        }
    }

    /// The end of [`Allocations::allocate`] when its slot insert could not
    /// finish on the fast path (the shard's lock held, or no free slot).
    #[cold]
    #[inline(never)]
    fn insert_later(&self, pending: Pending<'_, Issued>) -> PluginResult<Block> {
        let issued = *pending.value();
        let Some(handle) = self.table.insert_later(pending) else {
            // SAFETY: just allocated by the C allocator, and never published.
            unsafe { libc::free(issued.addr as *mut libc::c_void) };
            return Err(table_full());
        };
        Ok(Block { addr: issued.addr, size: issued.size, handle })
    }

    /// The SDK has refused references of another mechanism or device.
    ///
    /// The slot is removed without waiting for its shard's lock; when
    /// another thread holds it, the whole free starts over out of line
    /// ([`Allocations::deallocate_contended`]). So the fields compared
    /// here are never live across a call, and the thunk this is inlined
    /// into saves fewer registers.
    #[inline(always)]
    fn deallocate(&self, obj: &ObjectRef) -> PluginResult<()> {
        let (handle, object_id, addr, size) = (obj.handle, obj.object_id, obj.addr, obj.size);
        let issued = match self.table.try_remove(handle, |e| e.is(object_id, addr, size)) {
            Removal::Removed(issued) => issued,
            Removal::Refused => return Err(unknown(obj, "allocation")),
            Removal::Busy => return self.deallocate_contended(handle, object_id, addr, size),
        };
        free(issued);
        Ok(())
    }

    /// [`Allocations::deallocate`] when the shard's lock was held: waits
    /// for it this time.
    #[cold]
    #[inline(never)]
    fn deallocate_contended(&self, handle: u64, object_id: u64, addr: u64, size: u64) -> PluginResult<()> {
        match self.table.remove(handle, |e| e.is(object_id, addr, size)) {
            Some(issued) => {
                free(issued);
                Ok(())
            }
            None => Err(unknown_object("allocation", handle, object_id, addr, size)),
        }
    }
}

/// A block of `size` bytes aligned to `align` (a power of two of at least
/// 16, so a multiple of the pointer size, as `posix_memalign` requires),
/// or NULL when the C allocator has none.
#[inline(never)]
fn aligned(size: u64, align: u64) -> *mut libc::c_void {
    let Ok(size) = usize::try_from(size) else {
        return core::ptr::null_mut();
    };
    let mut p = core::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; the alignment is a power of two
    // and a multiple of `size_of::<*mut c_void>()` (the SDK raised it to
    // MIN_ALIGNMENT and checked it is at most MAX_ALIGNMENT).
    match unsafe { libc::posix_memalign(&mut p, align as usize, size) } {
        0 => p,
        _ => core::ptr::null_mut(),
    }
}

/// Gives back the block a removed slot held.
#[inline(always)]
fn free(issued: Issued) {
    // SAFETY: the slot held what `allocate` got from the C allocator, and
    // removing it from the table makes this the only free of that block.
    unsafe { libc::free(issued.addr as *mut libc::c_void) };
}

#[cold]
fn too_big(size: u64) -> PluginError {
    PluginError::out_of_memory(format!("allocate: {size} bytes cannot be allocated"))
}

#[cold]
fn table_full() -> PluginError {
    PluginError::out_of_memory("allocate: this thread's shard of the allocation table is full")
}

impl<F: Flavor> Allocator for CpuMechanism<F> {
    const HAS_MEMORY_INFO: bool = true;

    fn properties(&self) -> Properties {
        Properties {
            // A mapped allocation starts on a granule at least.
            min_alignment: if F::SYSTEM_HEAP { MIN_ALIGNMENT } else { self.granularity },
            max_alignment: MAX_ALIGNMENT,
            granularity: self.granularity,
        }
    }

    /// What every object of this mechanism is (ABI 1.2): the flavour's
    /// claims (`flavor.rs`).
    fn descriptor(&self) -> memplug_sdk::Descriptor {
        self.flavor.descriptor()
    }

    #[inline(always)]
    fn allocate(&self, request: &Request) -> PluginResult<Block> {
        self.flavor.check_location(request, &self.name, "allocate")?;
        if F::SYSTEM_HEAP {
            self.allocations.allocate(request)
        } else {
            self.mapped.allocate(&self.flavor, self.granularity, request)
        }
    }

    #[inline(always)]
    fn deallocate(&self, object: &ObjectRef) -> PluginResult<()> {
        if F::SYSTEM_HEAP {
            self.allocations.deallocate(object)
        } else {
            self.mapped.deallocate(object)
        }
    }

    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        self.flavor.memory_info()
    }
}
