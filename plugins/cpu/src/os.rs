//! The Linux memory calls the plugin makes, each wrapped once, with OS
//! errors turned into plugin statuses. Everything `unsafe` about address
//! ranges lives here; callers guarantee the ranges are theirs.

use memplug_sdk::{Access, PluginError, PluginResult};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{Advice, MapFlags, MprotectFlags, ProtFlags};
use std::ffi::c_void;
use std::sync::OnceLock;

/// The OS page size in bytes.
///
/// Read from the OS once and kept: it cannot change while the process
/// runs, and asking each time (`sysconf` under rustix's libc backend) cost
/// ~50 instructions of every `reserve` (callgrind `reserve`).
pub fn page_size() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| rustix::param::page_size() as u64)
}

/// Maps an OS error of `call` to a status: exhaustion of memory, address
/// space or file size is `OUT_OF_MEMORY`; anything else is the plugin's
/// own failure.
#[cold]
fn os_error(call: &str, what: &str, e: Errno) -> PluginError {
    let msg = format!("{what}: {call} failed: {e}");
    if e == Errno::NOMEM || e == Errno::FBIG || e == Errno::NOSPC || e == Errno::AGAIN {
        PluginError::out_of_memory(msg)
    } else {
        PluginError::internal(msg)
    }
}

fn ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

/// `len` as a `usize`; a length that does not fit cannot be mapped.
fn usize_len(len: u64, what: &str) -> PluginResult<usize> {
    usize::try_from(len)
        .map_err(|_| PluginError::out_of_memory(format!("{what}: {len} bytes exceed the address space")))
}

/// Reserves `len` bytes of address space with no access and no commit
/// charge; returns the address.
pub fn reserve(len: u64, what: &str) -> PluginResult<u64> {
    let n = usize_len(len, what)?;
    // SAFETY: a NULL hint lets the kernel pick an unused range; nothing
    // existing is touched.
    let p = unsafe {
        rustix::mm::mmap_anonymous(
            core::ptr::null_mut(),
            n,
            ProtFlags::empty(),
            MapFlags::PRIVATE | MapFlags::NORESERVE,
        )
    }
    .map_err(|e| os_error("mmap(PROT_NONE)", what, e))?;
    Ok(p as u64)
}

/// Gives a whole reservation back.
///
/// # Safety
/// `[addr, addr + len)` is a reservation the caller owns and nothing refers
/// to any more.
pub unsafe fn unreserve(addr: u64, len: u64, what: &str) -> PluginResult<()> {
    rustix::mm::munmap(ptr(addr), len as usize).map_err(|e| os_error("munmap", what, e))
}

/// Makes an uncommitted range of a reservation readable and writable.
///
/// # Safety
/// `[addr, addr + len)` lies in a reservation the caller owns and is not
/// committed or mapped.
pub unsafe fn commit(addr: u64, len: u64, what: &str) -> PluginResult<()> {
    let r = rustix::mm::mprotect(ptr(addr), len as usize, MprotectFlags::READ | MprotectFlags::WRITE);
    if let Err(e) = r {
        // mprotect can fail after changing part of the range (splitting
        // areas past the map-count limit); put the whole range back to no
        // access so a refused commit leaves nothing usable behind.
        let _ = rustix::mm::mprotect(ptr(addr), len as usize, MprotectFlags::empty());
        return Err(os_error("mprotect(PROT_READ|PROT_WRITE)", what, e));
    }
    Ok(())
}

/// Drops the pages of a committed range and makes it inaccessible; a later
/// commit reads zeros.
///
/// # Safety
/// `[addr, addr + len)` lies in a reservation the caller owns, is committed
/// anonymous memory, and nothing will read it again before a new commit.
pub unsafe fn decommit(addr: u64, len: u64, what: &str) -> PluginResult<()> {
    // DONTNEED frees private anonymous pages at once; mprotect alone would
    // keep them resident.
    rustix::mm::madvise(ptr(addr), len as usize, Advice::LinuxDontNeed)
        .map_err(|e| os_error("madvise(MADV_DONTNEED)", what, e))?;
    rustix::mm::mprotect(ptr(addr), len as usize, MprotectFlags::empty()).map_err(|e| {
        // The data is gone either way; keep the range usable (as zeros) so
        // the caller's record of it as committed stays true.
        let _ = rustix::mm::mprotect(ptr(addr), len as usize, MprotectFlags::READ | MprotectFlags::WRITE);
        os_error("mprotect(PROT_NONE)", what, e)
    })
}

/// Maps `[fd_offset, fd_offset + len)` of a memfd over a range of a
/// reservation.
///
/// # Safety
/// `[addr, addr + len)` lies in a reservation the caller owns and is
/// neither committed nor mapped; the file range exists.
pub unsafe fn map_shared(
    addr: u64,
    len: u64,
    fd: impl AsFd,
    fd_offset: u64,
    access: Access,
    what: &str,
) -> PluginResult<()> {
    let prot = match access {
        Access::ReadOnly => ProtFlags::READ,
        Access::ReadWrite => ProtFlags::READ | ProtFlags::WRITE,
    };
    let r =
        rustix::mm::mmap(ptr(addr), len as usize, prot, MapFlags::SHARED | MapFlags::FIXED, fd, fd_offset);
    if let Err(e) = r {
        // A failed MAP_FIXED may already have removed what was there; put
        // the reservation back so the range is not left open to others.
        let _ = restore_reserved(addr, len, what);
        return Err(os_error("mmap(MAP_SHARED|MAP_FIXED)", what, e));
    }
    Ok(())
}

/// Puts a fresh no-access reservation mapping over a range, replacing
/// whatever was mapped there.
///
/// # Safety
/// `[addr, addr + len)` lies in a reservation the caller owns and nothing
/// will read the old contents again.
pub unsafe fn restore_reserved(addr: u64, len: u64, what: &str) -> PluginResult<()> {
    rustix::mm::mmap_anonymous(
        ptr(addr),
        len as usize,
        ProtFlags::empty(),
        MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::FIXED,
    )
    .map(|_| ())
    .map_err(|e| os_error("mmap(PROT_NONE, MAP_FIXED)", what, e))
}

/// A zero-filled memfd of exactly `len` bytes whose size can never change:
/// mappings of it rely on every page they cover existing.
pub fn memfd(len: u64, what: &str) -> PluginResult<OwnedFd> {
    let fd = rustix::fs::memfd_create("memplug-cpu", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| os_error("memfd_create", what, e))?;
    rustix::fs::ftruncate(&fd, len).map_err(|e| match e {
        // ftruncate says EINVAL for a length past the largest file size.
        Errno::INVAL => os_error("ftruncate", what, Errno::FBIG),
        e => os_error("ftruncate", what, e),
    })?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
        .map_err(|e| os_error("fcntl(F_ADD_SEALS)", what, e))?;
    Ok(fd)
}

/// Reserves `len` bytes of address space (as [`reserve`]) starting on a
/// multiple of `align` (a power of two at least the page size), for pages
/// larger than the base page: the kernel only backs a range with a huge
/// page where the range covers a whole aligned one.
pub fn reserve_aligned(len: u64, align: u64, what: &str) -> PluginResult<u64> {
    let page = page_size();
    if align <= page {
        return reserve(len, what);
    }
    let padded = len
        .checked_add(align - page)
        .ok_or_else(|| PluginError::out_of_memory(format!("{what}: {len} bytes exceed the address space")))?;
    let start = reserve(padded, what)?;
    let aligned = start.next_multiple_of(align);
    // SAFETY: both trimmed pieces are inside the reservation just made and
    // nothing refers to them; the aligned middle is kept.
    unsafe {
        if aligned > start {
            unreserve(start, aligned - start, what)?;
        }
        let tail = start + padded - (aligned + len);
        if tail > 0 {
            unreserve(aligned + len, tail, what)?;
        }
    }
    Ok(aligned)
}

/// A reservation's usable range and the whole mapping made for it (the
/// range and its guards), which is what is given back.
#[derive(Clone, Copy, Debug)]
pub struct Guarded {
    /// First byte of the usable range.
    pub addr: u64,
    /// First byte of the mapping, guards included.
    pub mapped_start: u64,
    /// Bytes of the mapping, guards included.
    pub mapped_len: u64,
}

/// The huge page of x86-64 (and aarch64 with 4 KiB pages).
const HUGE_PAGE: u64 = 2 << 20;

/// Reserves `len` bytes of address space (as [`reserve`]) starting on a
/// multiple of `align` (a power of two), between two no-access guards of at least a page
/// that the kernel will never merge with the range.
///
/// Why: the kernel merges adjacent anonymous mappings whose flags match. A
/// reservation placed next to another one (or to a glibc arena's reserved
/// tail) became one kernel mapping with it whenever both had the same
/// protection, so every whole-range commit split that mapping and every
/// decommit merged it back: about twice the time of the same three calls
/// on a mapping with no such neighbour (measured here with
/// `hotpath commit-2m` and `bench mechanism`). The guards are mapped
/// without `MAP_NORESERVE` and the range with it: the flags differ, so the
/// kernel never merges the range with its guards, whatever its protection,
/// and nothing else can be its neighbour. (Under `vm.overcommit_memory=2`
/// the kernel drops `MAP_NORESERVE`; the range may merge again, which costs
/// time only.) A guard costs address space, never memory or commit charge:
/// it is never accessible.
///
/// Two calls: the whole span, then the range mapped again over its middle;
/// the slack that puts the range on `align` stays in the guards rather
/// than costing two more calls to trim. A range of a huge page or more
/// also starts on a huge page, as the kernel places such a mapping by
/// itself (for transparent huge pages): measured here, a whole-range
/// commit + decommit of 2 MiB starting one page past a huge page took
/// ~1.4x as long as one starting on it.
pub fn reserve_guarded(len: u64, align: u64, what: &str) -> PluginResult<Guarded> {
    let page = page_size();
    let mut align = align.max(page);
    if len >= HUGE_PAGE {
        align = align.max(HUGE_PAGE);
    }
    let too_big = || PluginError::out_of_memory(format!("{what}: {len} bytes exceed the address space"));
    let mapped_len = len.checked_add(page + align).ok_or_else(too_big)?;
    let n = usize_len(mapped_len, what)?;
    // SAFETY: a NULL hint lets the kernel pick an unused range; nothing
    // existing is touched. No `MAP_NORESERVE`: these flags are the guards'.
    let mapped_start = unsafe {
        rustix::mm::mmap_anonymous(core::ptr::null_mut(), n, ProtFlags::empty(), MapFlags::PRIVATE)
    }
    .map_err(|e| os_error("mmap(PROT_NONE)", what, e))? as u64;
    // At most `align - page` above the first guard page, so at least a
    // page of guard is left on either side.
    let addr = (mapped_start + page).next_multiple_of(align);
    // SAFETY: `[addr, addr + len)` lies inside the mapping just made, which
    // nothing refers to yet.
    if let Err(e) = unsafe { restore_reserved(addr, len, what) } {
        // SAFETY: the mapping just made, still nobody's.
        let _ = unsafe { unreserve(mapped_start, mapped_len, what) };
        return Err(e);
    }
    Ok(Guarded { addr, mapped_start, mapped_len })
}

/// The most NUMA nodes a placement can name; the node mask passed to the
/// kernel has this many bits.
pub const MAX_NUMA_NODES: u32 = 1024;

/// Binds the pages of `[addr, addr + len)` to NUMA node `node`
/// (`mbind(MPOL_BIND)`): pages faulted in later come from that node only,
/// and a fault the node cannot serve fails rather than spilling elsewhere.
/// The policy belongs to the mapping: a range mapped afresh (unmap puts a
/// new reservation mapping back) must be bound again.
///
/// # Safety
/// `[addr, addr + len)` is mapped and belongs to the caller.
pub unsafe fn bind_to_node(addr: u64, len: u64, node: u32, what: &str) -> PluginResult<()> {
    debug_assert!(node < MAX_NUMA_NODES);
    let mut mask = [0u64; (MAX_NUMA_NODES / 64) as usize];
    mask[(node / 64) as usize] = 1 << (node % 64);
    // The kernel reads `maxnode - 1` bits of the mask (a historical
    // off-by-one every caller compensates for).
    let maxnode = MAX_NUMA_NODES as u64 + 1;
    // SAFETY: the mask outlives the call and holds `maxnode - 1` bits; the
    // range is the caller's (see above). No flags: nothing is migrated.
    let r =
        unsafe { libc::syscall(libc::SYS_mbind, addr, len, libc::MPOL_BIND, mask.as_ptr(), maxnode, 0u32) };
    if r != 0 {
        return Err(os_error("mbind(MPOL_BIND)", what, Errno::from_raw_os_error(last_errno())));
    }
    Ok(())
}

/// Backs a read-write range with transparent huge pages now, or fails:
/// marks it `MADV_HUGEPAGE`, faults every page in (`MADV_POPULATE_WRITE`),
/// then asks the kernel to collapse it into huge pages synchronously
/// (`MADV_COLLAPSE`), which fails when it cannot — so a page size claimed
/// is a page size delivered, not a hope. `OUT_OF_MEMORY` when the kernel
/// has no huge page to give.
///
/// `MADV_COLLAPSE` answers `EAGAIN` for a state that passes by itself (a
/// page still in another CPU's batch on its way to the LRU, a page locked
/// or referenced for a moment by the kernel's own work): the madvise page
/// documents it as "trying again might succeed", and on a busy machine
/// with several threads allocating it does happen, so it is tried again
/// [`COLLAPSE_TRIES`] times, a little later each time, before the
/// allocation is refused. `EBUSY` is the memory cgroup refusing the huge
/// page's charge: out of memory too, for this process.
///
/// # Safety
/// `[addr, addr + len)` is mapped read-write, aligned to the huge page and
/// belongs to the caller, who gives up its contents (it reads zeros after).
pub unsafe fn back_with_huge_pages(addr: u64, len: u64, what: &str) -> PluginResult<()> {
    rustix::mm::madvise(ptr(addr), len as usize, Advice::LinuxHugepage)
        .map_err(|e| os_error("madvise(MADV_HUGEPAGE)", what, e))?;
    rustix::mm::madvise(ptr(addr), len as usize, Advice::LinuxPopulateWrite)
        .map_err(|e| os_error("madvise(MADV_POPULATE_WRITE)", what, e))?;
    let mut tries = 0;
    let e = loop {
        // SAFETY: as above; collapsing moves no data the caller still wants.
        if unsafe { libc::madvise(ptr(addr), len as usize, libc::MADV_COLLAPSE) } == 0 {
            return Ok(());
        }
        let e = Errno::from_raw_os_error(last_errno());
        tries += 1;
        if e != Errno::AGAIN || tries == COLLAPSE_TRIES {
            break e;
        }
        std::thread::sleep(std::time::Duration::from_micros(100 << tries));
    };
    let msg = format!(
        "{what}: madvise(MADV_COLLAPSE) failed ({tries} tries): {e}: the kernel could not back the range with huge pages"
    );
    Err(if e == Errno::AGAIN || e == Errno::NOMEM || e == Errno::BUSY {
        PluginError::out_of_memory(msg)
    } else {
        PluginError::internal(msg)
    })
}

/// How many times [`back_with_huge_pages`] asks for a collapse that
/// answered `EAGAIN` (waiting 0.2, 0.4, 0.8 ms between: about 1.4 ms at
/// most, against the milliseconds a collapse itself takes).
const COLLAPSE_TRIES: u32 = 4;

/// Maps `len` fresh, zeroed, read-write bytes aligned to `align`; returns
/// the address. Given back with [`unreserve`].
pub fn map_fresh(len: u64, align: u64, what: &str) -> PluginResult<u64> {
    let addr = reserve_aligned(len, align, what)?;
    // SAFETY: the range was just reserved and is neither committed nor
    // mapped; on failure it is given back whole.
    if let Err(e) = unsafe { commit(addr, len, what) } {
        // SAFETY: as above; nothing refers to it.
        let _ = unsafe { unreserve(addr, len, what) };
        return Err(e);
    }
    Ok(addr)
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
