//! The kinds of host memory the plugin's mechanisms serve (ABI 1.2's
//! memory descriptor made real): what differs between `"cpu"`, a NUMA
//! node's mechanism and the 2 MiB-page mechanism is here and only here —
//! their granularity, what they claim, which placements they accept, and
//! what is done to fresh memory before the host sees it. Everything else
//! (tables, range checks, sharing, streams) is the same code for all.
//!
//! A mechanism is `CpuMechanism<F>` for one flavour `F`, so the flavour's
//! choices are made at compile time: the `"cpu"` mechanism's benchmarked
//! allocation path has no branch for the others.

use crate::os;
use memplug_sdk::abi::{self, MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_sdk::{Descriptor, DeviceIdentity, Location, MemoryInfo, PluginError, PluginResult, Request};
use rustix::fd::{BorrowedFd, OwnedFd};

/// What one kind of host memory is.
pub trait Flavor: Send + Sync + Sized + 'static {
    /// Plain allocations come from the system allocator (the path measured
    /// against malloc) rather than one fresh mapping each, which is what a
    /// placement or a page size needs.
    const SYSTEM_HEAP: bool;
    /// Whether the mechanism offers shared mapping (memfd physical
    /// objects): only where its placement or page size carries over to a
    /// file's pages.
    const SHARED: bool;

    /// Granularity of reservations, commits and physical objects (and the
    /// least a mapped allocation takes).
    fn granularity(&self) -> u64;
    /// What every object of the mechanism is (ABI 1.2).
    fn descriptor(&self) -> Descriptor;
    /// Whether a request's location is one this memory is at.
    fn serves(&self, location: Location) -> bool;
    /// Places or backs a fresh read-write anonymous range before the host
    /// sees it. On failure the range is the caller's to give back.
    ///
    /// # Safety
    /// The range is mapped read-write, granularity-aligned, the caller's,
    /// and holds nothing anyone wants.
    unsafe fn prepare(&self, addr: u64, len: u64, what: &str) -> PluginResult<()>;
    /// Places a new memfd's pages (before any is faulted in).
    fn place_file(&self, fd: &OwnedFd, len: u64, what: &str) -> PluginResult<()>;
    /// Free and total memory of what this mechanism draws from.
    fn memory_info(&self) -> PluginResult<MemoryInfo>;

    /// The `MEMPLUG_HANDLE_*` kind its physical objects' descriptors are.
    const OBJECT_HANDLE: u32 = abi::MEMPLUG_HANDLE_MEMFD;

    /// Makes a range of a reservation usable (`commit`): anonymous pages,
    /// prepared. Nothing is left changed on failure.
    ///
    /// # Safety
    /// The range lies in a reservation the caller owns, granularity-
    /// aligned, neither committed nor mapped.
    unsafe fn commit(&self, addr: u64, len: u64, what: &str) -> PluginResult<()> {
        // SAFETY: the caller's range (see above).
        unsafe {
            os::commit(addr, len, what)?;
            if let Err(e) = self.prepare(addr, len, what) {
                let _ = os::decommit(addr, len, what);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Gives a committed range back (`decommit`; also run by a stream for
    /// a queued one, hence no `self`).
    ///
    /// # Safety
    /// The range lies in a reservation the caller owns and is committed;
    /// nobody reads it again before a new commit.
    unsafe fn decommit(addr: u64, len: u64, what: &str) -> PluginResult<()> {
        // SAFETY: the caller's range (see above).
        unsafe { os::decommit(addr, len, what) }
    }

    /// Fresh read-write memory of `len` bytes aligned to `align` for one
    /// allocation, prepared; given back with `os::unreserve`.
    fn map_allocation(&self, len: u64, align: u64, what: &str) -> PluginResult<u64> {
        let addr = os::map_fresh(len, align, what)?;
        // SAFETY: just mapped read-write, nobody else's; given back whole
        // on failure.
        if let Err(e) = unsafe { self.prepare(addr, len, what) } {
            let _ = unsafe { os::unreserve(addr, len, what) };
            return Err(e);
        }
        Ok(addr)
    }

    /// The file of a new physical object of `len` bytes: a sealed memfd,
    /// placed.
    fn object_file(&self, len: u64, what: &str) -> PluginResult<OwnedFd> {
        let fd = os::memfd(len, what)?;
        self.place_file(&fd, len, what)?;
        Ok(fd)
    }

    /// Checks an imported descriptor is a file this mechanism's objects
    /// can be, of at least `size` bytes, and keeps a duplicate of it.
    fn adopt_file(&self, fd: BorrowedFd<'_>, size: u64) -> PluginResult<OwnedFd> {
        crate::fd_sharing::adopt(fd, size)
    }

    /// `UNSUPPORTED` for a request whose location this memory is not at.
    #[inline(always)]
    fn check_location(&self, request: &Request, name: &str, what: &str) -> PluginResult<()> {
        if self.serves(request.location) {
            return Ok(());
        }
        Err(wrong_place(request.location, name, what))
    }
}

#[cold]
#[inline(never)]
fn wrong_place(location: Location, name: &str, what: &str) -> PluginError {
    PluginError::unsupported(format!(
        "{what}: mechanism \"{name}\" cannot place memory at location kind {} id {} (the CPU plugin has a \
         mechanism per NUMA node, \"cpu-node<N>\", for placed memory)",
        location.kind, location.id
    ))
}

/// Host memory with no placement, backed by base pages: the `"cpu"`
/// mechanism.
pub struct Base {
    page: u64,
}

impl Base {
    /// The flavour of this machine's base page.
    pub fn new() -> Base {
        Base { page: os::page_size() }
    }
}

/// Host memory: either no preference, or "host".
fn anywhere_on_host(l: Location) -> bool {
    l.kind == abi::MEMPLUG_LOCATION_ANY || l.kind == abi::MEMPLUG_LOCATION_HOST
}

/// Attributes every flavour has: host memory, the host's own view of it.
const HOST_MEMORY: u32 = abi::MEMPLUG_ATTR_HOST_VISIBLE | abi::MEMPLUG_ATTR_HOST_COHERENT;

impl Flavor for Base {
    const SYSTEM_HEAP: bool = true;
    const SHARED: bool = true;

    fn granularity(&self) -> u64 {
        self.page
    }

    /// Host memory on no particular node, read-only views enforced by the
    /// MMU (`mprotect`), physical objects exported as memfds that map at
    /// any page offset, base pages. Not zero-filled: allocations come from
    /// the system allocator, which does not clear them (committed ranges
    /// and physical objects are zero, but an attribute is a promise about
    /// every object).
    fn descriptor(&self) -> Descriptor {
        Descriptor {
            recommended_granularity: 0,
            page_sizes: Descriptor::page_size_bit(self.page),
            attributes: HOST_MEMORY | abi::MEMPLUG_ATTR_READ_ONLY_ENFORCED,
            export_types: abi::MEMPLUG_HANDLE_MEMFD,
            location: Location::HOST,
            maps_at_offsets: true,
        }
    }

    #[inline(always)]
    fn serves(&self, l: Location) -> bool {
        anywhere_on_host(l)
    }

    unsafe fn prepare(&self, _addr: u64, _len: u64, _what: &str) -> PluginResult<()> {
        // Pages are faulted in where and as the kernel likes.
        Ok(())
    }

    fn place_file(&self, _fd: &OwnedFd, _len: u64, _what: &str) -> PluginResult<()> {
        Ok(())
    }

    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        crate::meminfo::read()
    }
}

/// Host memory bound to one NUMA node with `mbind(MPOL_BIND)`: every page
/// of an allocation, a commit or a physical object comes from that node or
/// the fault fails. Device `{CPU, node}`, location that node.
pub struct Node {
    page: u64,
    node: u32,
}

impl Node {
    /// The flavour of node `node` (which [`node_mechanisms`] found).
    fn new(node: u32) -> Node {
        Node { page: os::page_size(), node }
    }
}

impl Flavor for Node {
    const SYSTEM_HEAP: bool = false;
    const SHARED: bool = true;

    fn granularity(&self) -> u64 {
        self.page
    }

    /// As `"cpu"`, but located on the node and zero-filled (every object is
    /// a fresh mapping or memfd).
    fn descriptor(&self) -> Descriptor {
        Descriptor {
            recommended_granularity: 0,
            page_sizes: Descriptor::page_size_bit(self.page),
            attributes: HOST_MEMORY | abi::MEMPLUG_ATTR_READ_ONLY_ENFORCED | abi::MEMPLUG_ATTR_ZERO_FILLED,
            export_types: abi::MEMPLUG_HANDLE_MEMFD,
            location: Location::numa_node(self.node),
            maps_at_offsets: true,
        }
    }

    fn serves(&self, l: Location) -> bool {
        anywhere_on_host(l) || l == Location::numa_node(self.node)
    }

    unsafe fn prepare(&self, addr: u64, len: u64, what: &str) -> PluginResult<()> {
        // SAFETY: the caller's range (see the trait).
        unsafe { os::bind_to_node(addr, len, self.node, what) }
    }

    /// A file's pages follow the policy set on any mapping of it (the
    /// policy is kept with the file), so one short-lived mapping binds them
    /// all before the first is faulted in.
    fn place_file(&self, fd: &OwnedFd, len: u64, what: &str) -> PluginResult<()> {
        let addr = os::reserve(len, what)?;
        // SAFETY: the reservation was just made and is the caller's; the
        // memfd has `len` bytes (sealed); the view is dropped right after.
        unsafe {
            let placed = os::map_shared(addr, len, fd, 0, memplug_sdk::Access::ReadWrite, what)
                .and_then(|()| os::bind_to_node(addr, len, self.node, what));
            os::unreserve(addr, len, what)?;
            placed
        }
    }

    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        crate::meminfo::read_node(self.node)
    }
}

/// The huge page this flavour serves: 2 MiB, the PMD size of x86-64 and of
/// aarch64 with 4 KiB base pages.
pub const HUGE_PAGE: u64 = 2 << 20;

/// Host memory backed by 2 MiB transparent huge pages, faulted in and
/// collapsed at commit (and at allocation), so the claim is checked when
/// the memory is made: a commit the kernel cannot back with huge pages is
/// refused (`OUT_OF_MEMORY`), never silently served with base pages.
///
/// No shared mapping: memfd pages are huge only where the machine's shmem
/// THP setting allows it, a separate, system-wide choice the plugin cannot
/// make or check per object.
pub struct Huge;

impl Flavor for Huge {
    const SYSTEM_HEAP: bool = false;
    const SHARED: bool = false;

    fn granularity(&self) -> u64 {
        HUGE_PAGE
    }

    /// Host memory, zero-filled, 2 MiB pages only; nothing to export.
    fn descriptor(&self) -> Descriptor {
        Descriptor {
            recommended_granularity: 0,
            page_sizes: Descriptor::page_size_bit(HUGE_PAGE),
            attributes: HOST_MEMORY | abi::MEMPLUG_ATTR_ZERO_FILLED,
            export_types: 0,
            location: Location::HOST,
            maps_at_offsets: false,
        }
    }

    fn serves(&self, l: Location) -> bool {
        anywhere_on_host(l)
    }

    unsafe fn prepare(&self, addr: u64, len: u64, what: &str) -> PluginResult<()> {
        // SAFETY: the caller's range, aligned to the granularity (2 MiB).
        unsafe { os::back_with_huge_pages(addr, len, what) }
    }

    fn place_file(&self, _fd: &OwnedFd, _len: u64, what: &str) -> PluginResult<()> {
        Err(PluginError::internal(format!("{what}: the 2 MiB-page mechanism has no physical objects")))
    }

    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        crate::meminfo::read()
    }
}

/// The published facts of one mechanism the plugin may offer.
#[derive(Clone, Debug)]
pub struct Offer {
    /// Mechanism name.
    pub name: String,
    /// Mechanism id.
    pub id: u64,
    /// The device it serves (a CPU device's ordinal is its NUMA node).
    pub device: MemplugDevice,
    /// Why it is not published on this machine, or `None` when it is.
    pub not_offered: Option<String>,
}

/// Id of `"cpu"`.
pub const CPU_ID: u64 = 1;
/// Id of `"cpu-huge-2m"`.
pub const HUGE_ID: u64 = 2;
/// Id of `"cpu-node<N>"` is this plus N.
pub const NODE_ID_BASE: u64 = 0x100;

/// The CPU device of ordinal (NUMA node) `n`.
pub const fn cpu_device(n: u32) -> MemplugDevice {
    MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: n }
}

/// The device identity of a CPU device: its NUMA node.
pub fn identity(node: u32) -> DeviceIdentity {
    DeviceIdentity { valid: abi::MEMPLUG_IDENTITY_NUMA_NODE, numa_node: node, ..Default::default() }
}

/// The 2 MiB-page mechanism, if this machine can serve it: transparent
/// huge pages not switched off, and one huge page really obtained (mapped,
/// faulted in and collapsed, then given back).
pub fn huge_mechanism() -> (Offer, Option<Huge>) {
    let why_not = huge_unavailable();
    let offer =
        Offer { name: "cpu-huge-2m".into(), id: HUGE_ID, device: cpu_device(0), not_offered: why_not };
    let flavor = offer.not_offered.is_none().then_some(Huge);
    (offer, flavor)
}

fn huge_unavailable() -> Option<String> {
    const SETTING: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
    match std::fs::read_to_string(SETTING) {
        Err(e) => return Some(format!("{SETTING} cannot be read ({e}): no transparent huge pages")),
        Ok(s) if s.contains("[never]") => {
            return Some(format!("transparent huge pages are off ({SETTING}: {})", s.trim()))
        }
        Ok(_) => {}
    }
    if os::page_size() >= HUGE_PAGE || HUGE_PAGE % os::page_size() != 0 {
        return Some(format!("the base page ({} bytes) is not smaller than 2 MiB", os::page_size()));
    }
    // MADV_COLLAPSE answers EAGAIN (out of memory here) when no huge page
    // can be had at that moment (fragmentation, other work compacting):
    // a few tries, so that one busy instant does not decide what this
    // process publishes (each process probes afresh, and a conformance
    // check runs in a process of its own).
    let mut last = None;
    for attempt in 0..5 {
        let addr = match os::map_fresh(HUGE_PAGE, HUGE_PAGE, "probe") {
            Ok(a) => a,
            Err(e) => return Some(format!("no 2 MiB range could be mapped: {}", e.message)),
        };
        // SAFETY: the probe range was just mapped read-write and is ours.
        let backed = unsafe { Huge.prepare(addr, HUGE_PAGE, "probe") };
        // SAFETY: as above; nothing refers to it after this.
        let _ = unsafe { os::unreserve(addr, HUGE_PAGE, "probe") };
        match backed {
            Ok(()) => return None,
            Err(e) if e.status == memplug_sdk::Status::OutOfMemory => {
                last = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(2 << attempt));
            }
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    last.map(|e| format!("the kernel did not back a 2 MiB probe with a huge page: {}", e.message))
}

/// The mechanism of each NUMA node with memory, where binding to a node
/// works here (`mbind` can be refused, e.g. by a seccomp policy).
pub fn node_mechanisms() -> Vec<(Offer, Option<Node>)> {
    let nodes = match memory_nodes() {
        Ok(nodes) => nodes,
        Err(why) => {
            let offer = Offer {
                name: "cpu-node<N>".into(),
                id: NODE_ID_BASE,
                device: cpu_device(0),
                not_offered: Some(why),
            };
            return vec![(offer, None)];
        }
    };
    nodes
        .into_iter()
        .map(|n| {
            let why_not = bind_unavailable(n);
            let offer = Offer {
                name: format!("cpu-node{n}"),
                id: NODE_ID_BASE + u64::from(n),
                device: cpu_device(n),
                not_offered: why_not,
            };
            let flavor = offer.not_offered.is_none().then(|| Node::new(n));
            (offer, flavor)
        })
        .collect()
}

fn bind_unavailable(node: u32) -> Option<String> {
    let page = os::page_size();
    let addr = match os::map_fresh(page, page, "probe") {
        Ok(a) => a,
        Err(e) => return Some(format!("no page could be mapped: {}", e.message)),
    };
    // SAFETY: the probe page was just mapped and is ours.
    let bound = unsafe { os::bind_to_node(addr, page, node, "probe") };
    // SAFETY: as above.
    let _ = unsafe { os::unreserve(addr, page, "probe") };
    bound.err().map(|e| format!("binding memory to node {node} is refused here: {}", e.message))
}

/// NUMA nodes with memory, from sysfs (`has_memory`, or `online` on
/// kernels without it).
fn memory_nodes() -> Result<Vec<u32>, String> {
    const DIR: &str = "/sys/devices/system/node";
    let text = std::fs::read_to_string(format!("{DIR}/has_memory"))
        .or_else(|_| std::fs::read_to_string(format!("{DIR}/online")))
        .map_err(|e| format!("{DIR} cannot be read ({e}): no NUMA nodes are known"))?;
    let nodes = parse_node_list(text.trim()).ok_or_else(|| format!("{DIR}/has_memory reads {text:?}"))?;
    Ok(nodes.into_iter().filter(|&n| n < os::MAX_NUMA_NODES).collect())
}

/// A sysfs node list such as `0-1,3`.
fn parse_node_list(s: &str) -> Option<Vec<u32>> {
    let mut nodes = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?),
            None => {
                let n = part.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if hi < lo || hi - lo >= os::MAX_NUMA_NODES {
            return None;
        }
        nodes.extend(lo..=hi);
    }
    Some(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_parse_as_sysfs_writes_them() {
        assert_eq!(parse_node_list("0"), Some(vec![0]));
        assert_eq!(parse_node_list("0-2,5"), Some(vec![0, 1, 2, 5]));
        assert_eq!(parse_node_list(""), Some(vec![]));
        assert_eq!(parse_node_list("3-1"), None);
        assert_eq!(parse_node_list("x"), None);
    }

    #[test]
    fn locations_are_served_only_where_the_memory_is() {
        let node = Node::new(1);
        assert!(
            node.serves(Location::ANY) && node.serves(Location::HOST) && node.serves(Location::numa_node(1))
        );
        assert!(!node.serves(Location::numa_node(0)) && !node.serves(Location::DEVICE));
        assert!(!Base::new().serves(Location::numa_node(0)) && Base::new().serves(Location::HOST));
    }
}
