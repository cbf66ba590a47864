//! ABI 1.2's memory descriptor and device identity, end to end (issue 12):
//! what a plugin publishes reaches `Mechanism::properties().descriptor` and
//! `Mechanism::identity` at 1.2 and nothing of it at 1.1; selection by
//! attributes, location and page size; a binding's placement reaches the
//! plugin's requests (hints, page size, location, export kinds) at 1.2 and
//! not below; the SDK refuses a page size the mechanism does not publish;
//! the loader refuses a malformed recommended granularity.

use memplug_host::governor::AllocationClass;
use memplug_host::{
    BindingSpec, Descriptor, LoadError, LoadOptions, Location, MemoryNeeds, Plugin, ProcessMemoryManager,
    Requirements, Status,
};
use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const CPU1: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 1 };
const MIB2: u64 = 2 << 20;

fn descriptor() -> Descriptor {
    Descriptor {
        recommended_granularity: 64 << 10,
        page_sizes: Descriptor::page_size_bit(4096) | Descriptor::page_size_bit(MIB2),
        attributes: MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_ZERO_FILLED,
        export_types: MEMPLUG_HANDLE_MEMFD,
        location: Location::numa_node(1),
        maps_at_offsets: true,
    }
}

fn identity() -> DeviceIdentity {
    DeviceIdentity {
        valid: MEMPLUG_IDENTITY_UUID | MEMPLUG_IDENTITY_PCI | MEMPLUG_IDENTITY_NUMA_NODE,
        uuid: *b"memplug-test-dev",
        pci_domain: 0,
        pci_bus: 0x41,
        pci_device: 2,
        pci_function: 1,
        numa_node: 1,
        ..Default::default()
    }
}

/// A heap allocator that keeps the last request it was sent.
#[derive(Default)]
struct Recorder {
    last: Seen,
    blocks: Mutex<HashMap<u64, Layout>>,
    bad_granularity: bool,
}

impl Allocator for Recorder {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 4096 }
    }
    fn descriptor(&self) -> Descriptor {
        let d = descriptor();
        if self.bad_granularity {
            return Descriptor { recommended_granularity: 3 << 12, ..d };
        }
        d
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        *self.last.lock().unwrap() = Some(*r);
        let layout = Layout::from_size_align(r.size as usize, r.alignment as usize).unwrap();
        // SAFETY: non-zero size (checked by the SDK).
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as u64;
        self.blocks.lock().unwrap().insert(p, layout);
        Ok(Block { addr: p, size: r.size, handle: p })
    }
    fn deallocate(&self, o: &ObjectRef) -> PluginResult<()> {
        let l = self
            .blocks
            .lock()
            .unwrap()
            .remove(&o.handle)
            .ok_or_else(|| PluginError::unknown_allocation("?"))?;
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(o.handle as *mut u8, l) };
        Ok(())
    }
}

/// The last request each recorder saw.
type Seen = Arc<Mutex<Option<Request>>>;
static LAST: OnceLock<Mutex<HashMap<&'static str, Seen>>> = OnceLock::new();

fn last(name: &'static str) -> Seen {
    LAST.get_or_init(Default::default).lock().unwrap().entry(name).or_default().clone()
}

fn build(name: &'static str, bad_granularity: bool) -> ExportedPlugin {
    let r = Recorder { last: last(name), bad_granularity, ..Default::default() };
    PluginBuilder::new(name, "1")
        .mechanism(MechanismBuilder::new("rec", 7, CPU1, r).identity(identity()).build())
        .live_objects(|| 0)
        .build()
}

mod at12 {
    fn init() -> memplug_sdk::ExportedPlugin {
        super::build("rec-12", false)
    }
    memplug_sdk::declare_entry!(pub entry, init);
}
mod at11 {
    fn init() -> memplug_sdk::ExportedPlugin {
        super::build("rec-11", false)
    }
    memplug_sdk::declare_entry!(pub entry, init);
}
mod bad {
    fn init() -> memplug_sdk::ExportedPlugin {
        super::build("rec-bad", true)
    }
    memplug_sdk::declare_entry!(pub entry, init);
}

fn load(entry: MemplugEntryV1, name: &str, max_minor: u32) -> Result<Plugin, LoadError> {
    let opts = LoadOptions { max_minor, ..LoadOptions::default() };
    unsafe { Plugin::from_entry(entry, name, &opts) }
}

#[test]
fn the_descriptor_and_identity_reach_a_1_2_host_and_nothing_of_them_a_1_1_host() {
    let p = load(at12::entry, "rec-12", 2).unwrap();
    let m = p.mechanism("rec").unwrap();
    assert_eq!(m.properties().descriptor, descriptor());
    assert_eq!(m.properties().granularity, 4096);
    let id = m.identity().expect("published");
    assert_eq!((id.uuid, id.pci_bus, id.pci_function, id.numa_node), (*b"memplug-test-dev", 0x41, 1, 1));
    assert_eq!(id.valid, MEMPLUG_IDENTITY_UUID | MEMPLUG_IDENTITY_PCI | MEMPLUG_IDENTITY_NUMA_NODE);

    let p11 = load(at11::entry, "rec-11", 1).unwrap();
    let m11 = p11.mechanism("rec").unwrap();
    assert_eq!(p11.abi_version(), (1, 1));
    assert_eq!(m11.properties().descriptor, Descriptor::default(), "a 1.1 host reads only the 1.0 prefix");
    assert_eq!(m11.identity(), None);
}

#[test]
fn selection_by_attributes_location_and_page_size_says_what_is_missing() {
    let mgr = ProcessMemoryManager::new();
    mgr.register_plugin(load(at12::entry, "rec-12", 2).unwrap()).unwrap();
    let any = Requirements::ALLOCATOR_ONLY;
    let needs = MemoryNeeds {
        attributes: MEMPLUG_ATTR_ZERO_FILLED,
        location: Some(Location::numa_node(1)),
        page_size: Some(MIB2),
    };
    assert!(mgr.select_needing(CPU1, any, &needs).is_ok());
    let pinned = MemoryNeeds { attributes: MEMPLUG_ATTR_PINNED | MEMPLUG_ATTR_ZERO_FILLED, ..needs };
    let e = mgr.select_needing(CPU1, any, &pinned).unwrap_err().to_string();
    assert!(e.contains("attributes 0x8"), "names only the missing bit: {e}");
    let elsewhere = MemoryNeeds { location: Some(Location::numa_node(0)), ..needs };
    let e = mgr.select_needing(CPU1, any, &elsewhere).unwrap_err().to_string();
    assert!(e.contains("location 3:0 (it has 3:1)"), "{e}");
    let huge = MemoryNeeds { page_size: Some(1 << 30), ..needs };
    let e = mgr.select_needing(CPU1, any, &huge).unwrap_err().to_string();
    assert!(e.contains("page size 0x40000000"), "{e}");
}

#[test]
fn a_bindings_placement_reaches_a_1_2_plugin_and_not_a_1_1_one() {
    for (entry, name, minor) in [(at12::entry as MemplugEntryV1, "rec-12", 2), (at11::entry, "rec-11", 1)] {
        let mgr = ProcessMemoryManager::new();
        mgr.register_plugin(load(entry, name, minor).unwrap()).unwrap();
        let ctx = mgr.context(&format!("{name}/rec")).unwrap();
        let pool = mgr.create_pool("p", 1 << 30).unwrap();
        let spec = BindingSpec::new(AllocationClass::Kv)
            .uninitialized_ok()
            .page_size(MIB2)
            .location(Location::numa_node(1))
            .export_types(MEMPLUG_HANDLE_MEMFD);
        let b = mgr.bind(&ctx, &pool, spec).unwrap();
        let a = b.allocate(8192, 64).unwrap();
        let r = last(if minor == 2 { "rec-12" } else { "rec-11" }).lock().unwrap().unwrap();
        if minor == 2 {
            assert!(r.uninitialized_ok());
            assert_eq!(
                (r.page_size, r.location, r.export_types),
                (MIB2, Location::numa_node(1), MEMPLUG_HANDLE_MEMFD)
            );
        } else {
            assert_eq!((r.hints, r.page_size, r.location, r.export_types), (0, 0, Location::ANY, 0), "{r:?}");
        }
        assert_eq!(r.class(), RequestClass::Kv);
        drop(a);
        assert_eq!(pool.used(), 0);
    }
}

#[test]
fn a_page_size_the_mechanism_does_not_publish_is_refused_by_the_sdk() {
    let mgr = ProcessMemoryManager::new();
    mgr.register_plugin(load(at12::entry, "rec-12", 2).unwrap()).unwrap();
    let ctx = mgr.context("rec-12/rec").unwrap();
    let pool = mgr.create_pool("p", 1 << 30).unwrap();
    let b = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv).page_size(64 << 10)).unwrap();
    let e = b.allocate(4096, 64).unwrap_err();
    assert!(
        matches!(&e, memplug_host::BindingError::Plugin(c) if c.status == Status::InvalidArgument && c.message.contains("page size 0x10000")),
        "{e}"
    );
    assert_eq!(pool.used(), 0, "the refused request's grant came back");
}

#[test]
fn a_recommended_granularity_that_is_no_multiple_of_the_granularity_is_refused_at_load() {
    let e = load(bad::entry, "rec-bad", 2).unwrap_err().to_string();
    assert!(e.contains("recommended_granularity 0x3000"), "{e}");
    // A 1.1 host never reads the descriptor, so the same plugin loads there.
    assert!(load(bad::entry, "rec-bad", 1).is_ok());
}

fn cpu_at(tag: &str, max_minor: u32) -> Plugin {
    let src = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let dir = memplug_test_support::test_tmp_dir(&format!("descriptor-{tag}"));
    let dst = dir.join(format!("libmemplug_plugin_cpu_{tag}.so"));
    std::fs::copy(&src, &dst).unwrap();
    let p = Plugin::load_with(&dst, &LoadOptions { max_minor, ..LoadOptions::default() }).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    p
}

#[test]
fn the_cpu_plugin_publishes_its_descriptor_and_exports_typed_memfds() {
    let p = cpu_at("typed12", 2);
    let m = p.mechanism("cpu").unwrap();
    let d = m.properties().descriptor;
    assert_eq!(
        d.attributes,
        MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT | MEMPLUG_ATTR_READ_ONLY_ENFORCED
    );
    assert_eq!((d.export_types, d.location, d.maps_at_offsets), (MEMPLUG_HANDLE_MEMFD, Location::HOST, true));
    assert!(d.accepts_page_size(4096) && !d.accepts_page_size(2 << 20));
    assert_eq!(m.identity().map(|i| (i.valid, i.numa_node)), Some((MEMPLUG_IDENTITY_NUMA_NODE, 0)));
    assert!(m.capabilities().typed_export());

    // SAFETY: test harness; every object is released below.
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let placed = memplug_host::Placement { export_types: MEMPLUG_HANDLE_MEMFD, ..Default::default() };
    let o = sm.create_placed(8192, AllocationClass::Other, &placed).unwrap();
    let dmabuf = memplug_host::Placement { export_types: MEMPLUG_HANDLE_DMABUF_FD, ..Default::default() };
    let e = sm.create_placed(8192, AllocationClass::Other, &dmabuf).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "a kind the mechanism does not offer, asked at create: {e}");

    let e = sm.export_handle(&o, MEMPLUG_HANDLE_DMABUF_FD).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    let h = sm.export_handle(&o, MEMPLUG_HANDLE_MEMFD).unwrap();
    let memplug_host::Handle::Fd { kind, fd } = &h else { panic!("a descriptor: {h:?}") };
    assert_eq!(*kind, MEMPLUG_HANDLE_MEMFD);
    use std::os::fd::{AsFd, AsRawFd};
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    assert!(link.to_string_lossy().starts_with("/memfd:"), "really a memfd: {link:?}");
    let imported =
        sm.import_handle(memplug_host::HandleRef::Fd { kind: *kind, fd: fd.as_fd() }, 8192).unwrap();
    assert!(imported.size() >= 8192);
    let blob = sm.import_handle(memplug_host::HandleRef::Blob(&[1, 2, 3]), 8192).unwrap_err();
    assert_eq!(blob.status, Status::Unsupported, "{blob}");
    sm.release(imported).unwrap();
    sm.release(o).unwrap();
    drop(h);

    // Pinned to 1.1: no descriptor, no typed export (1.1's export_fd stays).
    let p11 = cpu_at("typed11", 1);
    let m11 = p11.mechanism("cpu").unwrap();
    assert_eq!(m11.properties().descriptor, Descriptor::default());
    assert!(!m11.capabilities().typed_export() && m11.capabilities().shared_export());
    let sm11 = unsafe { m11.ungoverned() }.shared_mapping().unwrap();
    let o = sm11.create(4096).unwrap();
    let e = sm11.export_handle(&o, MEMPLUG_HANDLE_MEMFD).unwrap_err();
    assert!(e.status == Status::Unsupported && e.message.contains("typed handles need 1.2"), "{e}");
    sm11.release(o).unwrap();
}

#[test]
fn a_prefix_exported_as_a_typed_memfd_is_imported_by_another_binding_with_the_same_bytes() {
    let mgr = ProcessMemoryManager::new();
    mgr.register_plugin(cpu_at("prefix12", 2)).unwrap();
    let ctx = mgr.context("memplug-cpu/cpu").unwrap();
    let (pa, pb) = (mgr.create_pool("a", 64 << 20).unwrap(), mgr.create_pool("b", 64 << 20).unwrap());
    let spec = BindingSpec::new(AllocationClass::Kv).export_types(MEMPLUG_HANDLE_MEMFD);
    let (ba, bb) = (mgr.bind(&ctx, &pa, spec.clone()).unwrap(), mgr.bind(&ctx, &pb, spec).unwrap());
    let prefix = ba
        .create_shared(8192, |v| {
            // SAFETY: CPU memory, mapped writable for the initialiser only.
            unsafe { v.as_mut_slice() }.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8)
        })
        .unwrap();
    let h = prefix.export_handle(MEMPLUG_HANDLE_MEMFD).unwrap();
    let e = prefix.export_handle(MEMPLUG_HANDLE_DMABUF_FD).unwrap_err();
    assert!(
        e.to_string().contains("UNSUPPORTED") || e.to_string().contains("not one this mechanism offers"),
        "{e}"
    );
    let memplug_host::Handle::Fd { kind, fd } = &h else { panic!("{h:?}") };
    use std::os::fd::AsFd;
    let imported =
        bb.import_shared(memplug_host::HandleRef::Fd { kind: *kind, fd: fd.as_fd() }, 8192).unwrap();
    assert_eq!((pa.used(), pb.used()), (8192, 8192), "each side charges what it holds, once");
    let mut region = bb.reserve_virtual(1 << 20).unwrap();
    region.map_prefix(&imported).unwrap();
    let v = region.view();
    // SAFETY: CPU memory mapped (read-only) by the region for its life.
    let bytes = unsafe { std::slice::from_raw_parts(v.addr as *const u8, 8192) };
    assert!(
        bytes.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8),
        "the same bytes through the import"
    );
    drop(region);
    drop(imported);
    drop(prefix);
    drop(h);
    mgr.poll();
    assert_eq!((pa.used(), pb.used()), (0, 0));
}

/// Issue 28, item 9: a descriptor to import must be of the kind it claims
/// (a memfd is shared memory, a dma-buf a dma-buf), and a regular file
/// that is not memory is refused before the plugin sees it.
#[test]
fn an_import_of_a_descriptor_that_is_not_what_it_claims_is_refused_first() {
    use std::os::fd::AsFd;
    let p = cpu_at("typed12-kinds", 2);
    let m = p.mechanism("cpu").unwrap();
    // SAFETY: test harness; nothing is made.
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let status = std::fs::File::open("/proc/self/status").unwrap();
    let h = memplug_host::HandleRef::Fd { kind: MEMPLUG_HANDLE_MEMFD, fd: status.as_fd() };
    let e = sm.import_handle(h, 8192).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("not a memfd but /proc/"), "{e}");
    let e = sm.import_fd(status.as_fd(), 8192).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("not shared memory"), "{e}");
    assert_eq!(m.live(memplug_host::ObjectKind::PhysicalObject), 0);
}

/// A typed exporter that lies about its first handle: a `MEMFD` that is
/// `/proc/self/status` opened anew (issue 28, item 9). Its second export is
/// a real memfd.
#[derive(Default)]
struct MislabelledExports {
    exports: AtomicU64,
}

impl Allocator for MislabelledExports {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 4096 }
    }
    fn descriptor(&self) -> Descriptor {
        descriptor()
    }
    fn allocate(&self, _: &Request) -> PluginResult<Block> {
        Err(PluginError::out_of_memory("this mechanism only makes physical objects"))
    }
    fn deallocate(&self, o: &ObjectRef) -> PluginResult<()> {
        Err(PluginError::unknown_allocation(format!("{:#x}", o.handle)))
    }
}

impl SharedMapping for MislabelledExports {
    fn create(&self, r: &Request) -> PluginResult<Block> {
        Ok(Block { addr: 0, size: r.size.next_multiple_of(4096), handle: 1 })
    }
    fn map(&self, _: &ObjectRef, _: u64, _: &ObjectRef, _: u64, _: u64, _: Access) -> PluginResult<()> {
        Err(PluginError::unsupported("no reservations"))
    }
    fn unmap(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Err(PluginError::unsupported("no reservations"))
    }
    fn retain(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
    const CAN_EXPORT_HANDLES: bool = true;
    fn export_handle(&self, _: &ObjectRef, kind: u32) -> PluginResult<Handle> {
        let fd: std::os::fd::OwnedFd = if self.exports.fetch_add(1, Ordering::Relaxed) == 0 {
            std::fs::File::open("/proc/self/status").unwrap().into()
        } else {
            let name = std::ffi::CString::new("mislabelled-but-right").unwrap();
            let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0);
            unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }
        };
        Ok(Handle::Fd { kind, fd })
    }
}

mod mislabelled {
    fn init() -> memplug_sdk::ExportedPlugin {
        memplug_sdk::PluginBuilder::new("mislabelled", "1")
            .mechanism(
                memplug_sdk::MechanismBuilder::new(
                    "liar",
                    9,
                    super::CPU1,
                    super::MislabelledExports::default(),
                )
                .shared_mapping()
                .build(),
            )
            .live_objects(|| 0)
            .build()
    }
    memplug_sdk::declare_entry!(pub entry, init);
}

#[test]
fn a_typed_export_that_is_not_of_its_kind_is_refused_and_closed() {
    use std::os::fd::AsRawFd;
    let p = load(mislabelled::entry, "mislabelled", 2).unwrap();
    let m = p.mechanism("liar").unwrap();
    // SAFETY: test harness; the object is released below.
    let sm = unsafe { m.ungoverned() }.shared_mapping().unwrap();
    let placed = memplug_host::Placement { export_types: MEMPLUG_HANDLE_MEMFD, ..Default::default() };
    let o = sm.create_placed(4096, AllocationClass::Other, &placed).unwrap();
    let e = sm.export_handle(&o, MEMPLUG_HANDLE_MEMFD).unwrap_err();
    assert_eq!(e.status, Status::Internal, "{e}");
    assert_eq!(e.slot, "shared_mapping.export_handle");
    for part in ["not a memfd but /proc/", "status", "the host closed it"] {
        assert!(e.message.contains(part), "{part:?}: {e}");
    }
    let n: i32 = e.message.split("returned fd ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    assert!(std::fs::read_link(format!("/proc/self/fd/{n}")).is_err(), "fd {n} was closed, not leaked");
    assert!(memplug_host::plugin_faults().refused_descriptors >= 1);
    // A real memfd is taken.
    let h = sm.export_handle(&o, MEMPLUG_HANDLE_MEMFD).unwrap();
    let memplug_host::Handle::Fd { fd, .. } = &h else { panic!("{h:?}") };
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
    assert!(link.to_string_lossy().starts_with("/memfd:mislabelled-but-right"), "{link:?}");
    drop(h);
    sm.release(o).unwrap();
}
