//! The dma-buf heap mechanism, `"dmabuf-system"`: memory from the kernel's
//! system dma-buf heap (`/dev/dma_heap/system`), the allocator Linux gives
//! devices that share buffers (cameras, display, video, accelerators
//! importing through `DMA_BUF` fds). Published only where the heap exists
//! and one buffer could really be allocated and mapped.
//!
//! Everything is a dma-buf, so every object can be handed to a device
//! driver: a physical object is one buffer (exported and imported as
//! `MEMPLUG_HANDLE_DMABUF_FD`); an allocation is one buffer mapped; a
//! commit maps one buffer per granule (2 MiB), so that any granule-aligned
//! part of a commit can be decommitted and its memory really goes back — a
//! buffer lives as long as any mapping of any part of it does, so one
//! buffer per commit could not be given back piecewise.
//!
//! Claims: host-visible (the heap's buffers can be mapped) and zero-filled
//! (the system heap hands out cleared pages). Not host-coherent: a device
//! importing the buffer may need `DMA_BUF_IOCTL_SYNC` around CPU access,
//! which is the importer's business. Read-only views are enforced by the
//! MMU as for any mapping.

use crate::flavor::{cpu_device, Flavor, Offer};
use crate::os;
use memplug_sdk::abi;
use memplug_sdk::{Access, Descriptor, Location, MemoryInfo, PluginError, PluginResult};
use rustix::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use rustix::fs::{Mode, OFlags};

/// Where the system heap is.
const HEAP: &str = "/dev/dma_heap/system";
/// Granularity: one buffer per 2 MiB of a commit (the system heap serves
/// large buffers from high-order pages).
const GRANULE: u64 = 2 << 20;
/// Id of `"dmabuf-system"`.
pub const DMA_HEAP_ID: u64 = 3;

/// `struct dma_heap_allocation_data` (linux/dma-heap.h).
#[repr(C)]
struct AllocationData {
    len: u64,
    fd: u32,
    fd_flags: u32,
    heap_flags: u64,
}

/// `DMA_HEAP_IOCTL_ALLOC`: `_IOWR('H', 0x0, struct dma_heap_allocation_data)`.
const DMA_HEAP_IOCTL_ALLOC: libc::c_ulong = (3 << 30)
    | ((std::mem::size_of::<AllocationData>() as libc::c_ulong) << 16)
    | ((b'H' as libc::c_ulong) << 8);

/// The system heap, open.
pub struct DmaHeap {
    heap: OwnedFd,
}

impl DmaHeap {
    /// A new buffer of `len` bytes (a multiple of the page), as a
    /// close-on-exec read-write descriptor.
    fn buffer(&self, len: u64, what: &str) -> PluginResult<OwnedFd> {
        let mut data =
            AllocationData { len, fd: 0, fd_flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32, heap_flags: 0 };
        // SAFETY: the argument is the kernel's struct, alive for the call.
        let r = unsafe { libc::ioctl(self.heap.as_raw_fd(), DMA_HEAP_IOCTL_ALLOC, &mut data) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            let msg = format!("{what}: DMA_HEAP_IOCTL_ALLOC of {len} bytes on {HEAP} failed: {e}");
            return Err(match e.raw_os_error() {
                Some(libc::ENOMEM) => PluginError::out_of_memory(msg),
                _ => PluginError::internal(msg),
            });
        }
        // SAFETY: the kernel returned a new descriptor that nobody else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(data.fd as i32) })
    }
}

impl Flavor for DmaHeap {
    const SYSTEM_HEAP: bool = false;
    const SHARED: bool = true;
    const OBJECT_HANDLE: u32 = abi::MEMPLUG_HANDLE_DMABUF_FD;

    fn granularity(&self) -> u64 {
        GRANULE
    }

    fn descriptor(&self) -> Descriptor {
        Descriptor {
            recommended_granularity: 0,
            page_sizes: Descriptor::page_size_bit(os::page_size()),
            attributes: abi::MEMPLUG_ATTR_HOST_VISIBLE
                | abi::MEMPLUG_ATTR_READ_ONLY_ENFORCED
                | abi::MEMPLUG_ATTR_ZERO_FILLED,
            export_types: abi::MEMPLUG_HANDLE_DMABUF_FD,
            location: Location::HOST,
            maps_at_offsets: true,
        }
    }

    fn serves(&self, l: Location) -> bool {
        l.kind == abi::MEMPLUG_LOCATION_ANY || l.kind == abi::MEMPLUG_LOCATION_HOST
    }

    unsafe fn prepare(&self, _addr: u64, _len: u64, _what: &str) -> PluginResult<()> {
        Ok(())
    }

    fn place_file(&self, _fd: &OwnedFd, _len: u64, _what: &str) -> PluginResult<()> {
        Ok(())
    }

    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        crate::meminfo::read()
    }

    /// One buffer per granule, each mapped over its part of the range;
    /// on failure every part mapped so far is put back.
    unsafe fn commit(&self, addr: u64, len: u64, what: &str) -> PluginResult<()> {
        let mut done = 0;
        while done < len {
            let mapped = self.buffer(GRANULE, what).and_then(|b| {
                // SAFETY: the granule lies in the caller's range, neither
                // committed nor mapped; the buffer has GRANULE bytes. The
                // mapping keeps the buffer; our descriptor closes here.
                unsafe { os::map_shared(addr + done, GRANULE, &b, 0, Access::ReadWrite, what) }
            });
            if let Err(e) = mapped {
                if done > 0 {
                    // SAFETY: the parts mapped above are ours to give back.
                    let _ = unsafe { os::restore_reserved(addr, done, what) };
                }
                return Err(e);
            }
            done += GRANULE;
        }
        Ok(())
    }

    /// Unmapping frees each granule's buffer (it has no other mapping).
    unsafe fn decommit(addr: u64, len: u64, what: &str) -> PluginResult<()> {
        // SAFETY: the caller's committed range (see the trait).
        unsafe { os::restore_reserved(addr, len, what) }
    }

    fn map_allocation(&self, len: u64, align: u64, what: &str) -> PluginResult<u64> {
        let addr = os::reserve_aligned(len, align, what)?;
        let mapped = self.buffer(len, what).and_then(|b| {
            // SAFETY: the range was just reserved; the buffer has `len` bytes.
            unsafe { os::map_shared(addr, len, &b, 0, Access::ReadWrite, what) }
        });
        if let Err(e) = mapped {
            // SAFETY: our reservation; nothing refers to it.
            let _ = unsafe { os::unreserve(addr, len, what) };
            return Err(e);
        }
        Ok(addr)
    }

    fn object_file(&self, len: u64, what: &str) -> PluginResult<OwnedFd> {
        self.buffer(len, what)
    }

    /// A dma-buf (its link in `/proc/self/fd` names the dma-buf file
    /// system), open read-write, of at least `size` bytes.
    fn adopt_file(&self, fd: BorrowedFd<'_>, size: u64) -> PluginResult<OwnedFd> {
        let refuse =
            |why: String| PluginError::invalid_argument(format!("import_fd: {why}; nothing was imported"));
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| refuse(format!("the descriptor cannot be inspected: {e}")))?;
        if !link.to_string_lossy().contains("dmabuf") {
            return Err(refuse(format!("the descriptor is {}, not a dma-buf", link.display())));
        }
        let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| refuse(format!("F_GETFL failed: {e}")))?;
        if flags & OFlags::RWMODE != OFlags::RDWR {
            return Err(refuse("the dma-buf is not open for reading and writing".into()));
        }
        let len = rustix::fs::seek(fd, rustix::fs::SeekFrom::End(0))
            .map_err(|e| refuse(format!("its size cannot be read (lseek: {e})")))?;
        if len < size {
            return Err(PluginError::out_of_range(format!(
                "import_fd: the dma-buf is {len} bytes, less than the {size} asked for; nothing was imported"
            )));
        }
        crate::fd_sharing::duplicate(fd.as_fd(), "import_fd")
    }
}

/// The dma-buf heap mechanism, if this machine has the system heap and
/// one buffer can be allocated and mapped there.
pub fn dma_heap_mechanism() -> (Offer, Option<DmaHeap>) {
    let mut offer =
        Offer { name: "dmabuf-system".into(), id: DMA_HEAP_ID, device: cpu_device(0), not_offered: None };
    let opened = rustix::fs::open(HEAP, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty());
    let heap = match opened {
        Ok(fd) => DmaHeap { heap: fd },
        Err(e) => {
            offer.not_offered =
                Some(format!("{HEAP} cannot be opened ({e}): this kernel has no system dma-buf heap"));
            return (offer, None);
        }
    };
    let probe = heap.map_allocation(GRANULE, GRANULE, "probe");
    match probe {
        Ok(addr) => {
            // SAFETY: the probe mapping is ours and nothing refers to it.
            let _ = unsafe { os::unreserve(addr, GRANULE, "probe") };
            (offer, Some(heap))
        }
        Err(e) => {
            offer.not_offered =
                Some(format!("a 2 MiB buffer from {HEAP} could not be mapped: {}", e.message));
            (offer, None)
        }
    }
}
