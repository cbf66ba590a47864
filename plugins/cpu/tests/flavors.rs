//! The NUMA-node and 2 MiB-page mechanisms, through the raw ABI: what each
//! claims, and that the kernel says the claim holds — node policy from
//! `get_mempolicy`, huge pages from `/proc/self/smaps`. A mechanism this
//! machine does not serve is skipped with the plugin's reason.

mod common;
use common::*;
use std::os::fd::AsRawFd;

const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
const HUGE: u64 = 2 << 20;

/// The policy mode and, with `MPOL_F_NODE`, the node of the page at `addr`.
fn mempolicy(addr: u64, flags: u64) -> (i32, Vec<u64>) {
    let mut mode: i32 = -1;
    let mut mask = [0u64; 16];
    let r =
        unsafe { libc::syscall(libc::SYS_get_mempolicy, &mut mode, mask.as_mut_ptr(), 1025u64, addr, flags) };
    assert_eq!(r, 0, "get_mempolicy: {}", std::io::Error::last_os_error());
    (mode, mask.to_vec())
}

const MPOL_F_NODE: u64 = 1;
const MPOL_F_ADDR: u64 = 2;

/// Touches `addr` and asserts its page is bound to `node` and lives there.
fn assert_on_node(addr: u64, node: u32, what: &str) {
    unsafe { (addr as *mut u8).write_volatile(7) };
    let (mode, _) = mempolicy(addr, MPOL_F_ADDR);
    assert_eq!(mode, libc::MPOL_BIND, "{what}: the page's policy is not MPOL_BIND");
    let (on, _) = mempolicy(addr, MPOL_F_ADDR | MPOL_F_NODE);
    assert_eq!(on, node as i32, "{what}: the page is not on node {node}");
}

#[test]
fn a_node_mechanism_binds_every_kind_of_memory_to_its_node() {
    let Some(h) = harness_of("cpu-node0") else { return };
    let p = h.properties().unwrap();
    assert_eq!((p.location_kind, p.location_id), (MEMPLUG_LOCATION_NUMA_NODE, 0));
    assert_ne!(p.attributes & MEMPLUG_ATTR_ZERO_FILLED, 0);
    assert_eq!(h.device, MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 });
    let g = p.granularity;

    let a = h.allocate(100, 1).unwrap();
    assert_eq!(a.addr % g, 0, "a mapped allocation starts on a page");
    assert_eq!(unsafe { *(a.addr as *const u64) }, 0, "zero-filled");
    assert_on_node(a.addr, 0, "allocation");
    h.deallocate(&a).unwrap();

    let r = h.reserve(4 * g).unwrap();
    h.commit(&r, 0, g).unwrap();
    assert_on_node(r.addr, 0, "commit");

    // A physical object's pages follow the policy its file was given.
    let o = h.create(g).unwrap();
    h.map(&o, 0, &r, g, g, RW).unwrap();
    assert_on_node(r.addr + g, 0, "mapped physical object");
    // Unmapping puts a fresh reservation mapping back, without the policy;
    // a commit there must bind again.
    h.unmap(&r, g, g).unwrap();
    h.commit(&r, g, g).unwrap();
    assert_on_node(r.addr + g, 0, "commit where a mapping was");
    h.release_object(&o).unwrap();
    h.release_reservation(&r).unwrap();

    let info = h.memory_info().unwrap();
    assert!(info.total_bytes > 0 && info.free_bytes <= info.total_bytes);
    h.assert_balanced();
}

#[test]
fn placement_is_refused_where_the_memory_is_not() {
    let Some(h) = harness_of("cpu-node0") else { return };
    let elsewhere =
        MemplugRequest { location_kind: MEMPLUG_LOCATION_NUMA_NODE, location_id: 1, ..h.request(64, 1) };
    let msg = refused(h.allocate_raw(&elsewhere), Status::Unsupported);
    assert!(msg.contains("cpu-node0") && msg.contains("id 1"), "{msg}");
    refused(h.reserve_raw(&elsewhere), Status::Unsupported);
    refused(h.create_raw(&elsewhere), Status::Unsupported);
    let here =
        MemplugRequest { location_kind: MEMPLUG_LOCATION_NUMA_NODE, location_id: 0, ..h.request(64, 1) };
    let b = h.allocate_raw(&here).unwrap();
    h.deallocate(&h.object_ref(&here, &b)).unwrap();

    // "cpu" places nothing: a node is refused, host memory is served.
    let cpu = Api::from_descriptor(descriptor());
    let on_node =
        MemplugRequest { location_kind: MEMPLUG_LOCATION_NUMA_NODE, location_id: 0, ..cpu.request(64, 16) };
    let msg = refused(cpu.allocate_raw(&on_node), Status::Unsupported);
    assert!(msg.contains("cpu-node<N>"), "the refusal names where placed memory is: {msg}");
    let host = MemplugRequest { location_kind: MEMPLUG_LOCATION_HOST, ..cpu.request(64, 16) };
    let b = cpu.allocate_raw(&host).unwrap();
    cpu.deallocate(&cpu.object_ref(&host, &b)).unwrap();
    h.assert_balanced();
}

#[test]
fn the_huge_page_mechanism_commits_2_mib_pages_or_nothing() {
    let Some(h) = harness_of("cpu-huge-2m") else { return };
    let p = h.properties().unwrap();
    assert_eq!(p.granularity, HUGE);
    assert_eq!(p.page_sizes, HUGE, "2 MiB pages only");
    assert_eq!(
        p.attributes,
        MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT | MEMPLUG_ATTR_ZERO_FILLED
    );
    assert_eq!(p.export_types, 0, "no shared mapping, nothing to export");
    assert!(h.sm.create.is_none(), "no shared mapping: shmem huge pages are a system-wide setting");

    let r = h.reserve(8 * HUGE).unwrap();
    assert_eq!(r.addr % HUGE, 0, "a reservation starts on a huge page");
    assert_eq!(smaps_huge(r.addr, r.size), 0);
    h.commit(&r, 2 * HUGE, 4 * HUGE).unwrap();
    // Backed at commit, without a touch: the claim is checked when made.
    assert!(
        smaps_huge(r.addr, r.size) >= 4 * HUGE,
        "after a 4 huge-page commit smaps shows {} bytes of huge pages",
        smaps_huge(r.addr, r.size)
    );
    assert_eq!(unsafe { *((r.addr + 3 * HUGE) as *const u64) }, 0, "zero-filled");
    h.decommit(&r, 2 * HUGE, 4 * HUGE).unwrap();
    assert_eq!(smaps_huge(r.addr, r.size), 0, "decommit gives the huge pages back");
    assert_eq!(resident_bytes(r.addr, r.size), 0);
    h.release_reservation(&r).unwrap();

    let a = h.allocate(100, 1).unwrap();
    assert_eq!(a.addr % HUGE, 0);
    assert!(smaps_huge(a.addr, HUGE) >= HUGE, "an allocation is one huge page");
    h.deallocate(&a).unwrap();

    // A request naming the base page is not one this mechanism publishes.
    let base = MemplugRequest { page_size: 4096, ..h.request(HUGE, 1) };
    refused(h.reserve_raw(&base), Status::InvalidArgument);
    h.assert_balanced();
}

#[test]
fn every_mechanism_not_published_says_why() {
    for o in memplug_plugin_cpu::offers() {
        match &o.not_offered {
            None => eprintln!("published: {} (id {:#x}, device CPU {})", o.name, o.id, o.device.ordinal),
            Some(why) => {
                assert!(!why.is_empty());
                eprintln!("not published: {}: {why}", o.name);
            }
        }
    }
    assert_eq!(memplug_plugin_cpu::offers()[0].name, "cpu");
}

#[test]
fn the_dma_buf_heap_mechanism_shares_dma_bufs_and_gives_granules_back() {
    use std::os::fd::AsFd;
    let Some(h) = harness_of("dmabuf-system") else { return };
    let p = h.properties().unwrap();
    let g = p.granularity;
    assert_eq!(g, HUGE, "one buffer per 2 MiB granule");
    assert_eq!(p.export_types, MEMPLUG_HANDLE_DMABUF_FD);
    assert_ne!(p.attributes & MEMPLUG_ATTR_ZERO_FILLED, 0);

    // A commit is one buffer per granule: half of it can go back.
    let r = h.reserve(4 * g).unwrap();
    h.commit(&r, 0, 2 * g).unwrap();
    let (_, what) = mapping_at(r.addr).unwrap();
    assert!(what.contains("dmabuf"), "a committed granule maps a dma-buf: {what}");
    assert_eq!(unsafe { *((r.addr + g) as *const u64) }, 0, "zero-filled");
    unsafe { ((r.addr + g) as *mut u8).write_volatile(9) };
    h.decommit(&r, 0, g).unwrap();
    assert_eq!(mapping_at(r.addr).unwrap().0, "---p");
    assert_eq!(unsafe { ((r.addr + g) as *const u8).read_volatile() }, 9, "the other granule is untouched");
    assert_eq!(h.committed(&r).unwrap(), g);

    // A physical object is a dma-buf; exported and imported, both views
    // show the same bytes.
    let o = h.create(g).unwrap();
    let fd = h.export_fd(&o).unwrap();
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    assert!(link.to_string_lossy().contains("dmabuf"), "{}", link.display());
    let imported = h.import_fd(fd.as_fd(), g).unwrap();
    h.map(&o, 0, &r, 2 * g, g, RW).unwrap();
    h.map(&imported, 0, &r, 3 * g, g, RW).unwrap();
    unsafe { ((r.addr + 2 * g) as *mut u8).write_volatile(5) };
    assert_eq!(unsafe { ((r.addr + 3 * g) as *const u8).read_volatile() }, 5);
    // A memfd is not a dma-buf.
    let memfd = rustix::fs::memfd_create("not-a-dmabuf", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, g).unwrap();
    refused(h.import_fd(memfd.as_fd(), g), Status::InvalidArgument);
    h.release_object(&o).unwrap();
    h.release_object(&imported).unwrap();
    h.release_reservation(&r).unwrap();
    h.assert_balanced();
}
