//! API 1.1 of the host C API: what ABI 1.2 says of a mechanism's memory
//! and device reaches C (`memplug_host_mechanism_descriptor`,
//! `memplug_host_mechanism_identity`, the typed-export capability bit);
//! selection by memory needs (`memplug_host_manager_select_needing`); a
//! binding's placement (the options appended in 1.1) reaches a 1.2
//! plugin's requests, and a caller built with the 1.0 options asks for
//! none. Against the reference CPU plugin and a recording plugin linked in.

mod common;

use common::{last_error, ok, plugin_path};
use memplug_host_capi::*;
use memplug_sdk::abi::*;
use memplug_sdk::{
    Allocator, Block, Descriptor, DeviceIdentity, ExportedPlugin, Location, MechanismBuilder, ObjectRef,
    PluginBuilder, PluginError, PluginResult, Properties, Request,
};
use std::alloc::Layout;
use std::collections::HashMap;
use std::mem::size_of;
use std::ptr::{null, null_mut};
use std::sync::Mutex;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
const CPU1: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 1 };
const MIB2: u64 = 2 << 20;
const CPU_ATTRIBUTES: u32 =
    MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT | MEMPLUG_ATTR_READ_ONLY_ENFORCED;

fn sized<T: Default>(set: impl FnOnce(&mut T, u32)) -> T {
    let mut v = T::default();
    set(&mut v, size_of::<T>() as u32);
    v
}

fn descriptor_of(m: MemplugHostMechanism) -> MemplugHostDescriptor {
    let mut d = sized(|d: &mut MemplugHostDescriptor, n| d.struct_size = n);
    ok(unsafe { memplug_host_mechanism_descriptor(m, &mut d) });
    d
}

fn mechanism_info(m: MemplugHostMechanism) -> MemplugHostMechanismInfo {
    // SAFETY: integers, a device and char arrays: valid when zeroed.
    let mut i = unsafe { std::mem::zeroed::<MemplugHostMechanismInfo>() };
    i.struct_size = size_of::<MemplugHostMechanismInfo>() as u32;
    ok(unsafe { memplug_host_mechanism_info(m, &mut i) });
    i
}

fn needs(attributes: u32, location: Location, page_size: u64) -> MemplugHostMemoryNeeds {
    MemplugHostMemoryNeeds {
        struct_size: size_of::<MemplugHostMemoryNeeds>() as u32,
        attributes,
        location_kind: location.kind,
        location_id: location.id,
        page_size,
    }
}

fn select_needing(
    m: MemplugHostManager,
    device: MemplugDevice,
    n: &MemplugHostMemoryNeeds,
) -> Result<MemplugHostMechanism, (MemplugHostStatus, String)> {
    let mut mech = MemplugHostMechanism::default();
    match unsafe { memplug_host_manager_select_needing(m, device, 0, n, &mut mech) } {
        MemplugHostStatus::Ok => Ok(mech),
        s => {
            assert_eq!(mech.id, 0, "written only on success");
            Err((s, last_error()))
        }
    }
}

/// A manager with the CPU plugin loaded and its mechanism.
fn cpu() -> (MemplugHostManager, MemplugHostMechanism) {
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    ok(unsafe { memplug_host_manager_load_plugin(m, plugin_path().as_ptr()) });
    let mut mech = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_find_mechanism(m, c"memplug-cpu/cpu".as_ptr(), &mut mech) });
    (m, mech)
}

#[test]
fn the_cpu_plugins_descriptor_identity_and_typed_export_reach_c() {
    let (m, mech) = cpu();
    let d = descriptor_of(mech);
    assert_eq!(d.struct_size, MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1);
    assert_eq!(d.attributes, CPU_ATTRIBUTES);
    assert_eq!(d.export_types, MEMPLUG_HANDLE_MEMFD);
    assert_eq!((d.location_kind, d.location_id), (MEMPLUG_LOCATION_HOST, 0));
    assert_eq!(d.maps_at_offsets, 1);
    assert_eq!(d.page_sizes, 4096, "the 4 KiB bit only");
    let info = mechanism_info(mech);
    assert_ne!(info.capabilities & MEMPLUG_CAP_TYPED_EXPORT, 0, "{:#x}", info.capabilities);
    assert_eq!(d.recommended_granularity % info.granularity.max(1), 0);

    let mut id = sized(|i: &mut MemplugHostDeviceIdentity, n| i.struct_size = n);
    ok(unsafe { memplug_host_mechanism_identity(mech, &mut id) });
    assert_eq!(id.struct_size, MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1);
    assert_eq!((id.valid, id.numa_node), (MEMPLUG_IDENTITY_NUMA_NODE, 0));

    // Short, NULL, stale: refused, the out-struct untouched.
    let mut short = MemplugHostDescriptor { struct_size: 4, ..Default::default() };
    assert_eq!(
        unsafe { memplug_host_mechanism_descriptor(mech, &mut short) },
        MemplugHostStatus::InvalidArgument
    );
    assert!(last_error().contains("MemplugHostDescriptor: struct_size is 4"), "{}", last_error());
    assert_eq!(short, MemplugHostDescriptor { struct_size: 4, ..Default::default() });
    let mut short = MemplugHostDeviceIdentity { struct_size: 47, ..Default::default() };
    assert_eq!(
        unsafe { memplug_host_mechanism_identity(mech, &mut short) },
        MemplugHostStatus::InvalidArgument
    );
    assert_eq!(short.valid, 0);
    assert_eq!(
        unsafe { memplug_host_mechanism_descriptor(mech, null_mut()) },
        MemplugHostStatus::NullArgument
    );
    assert_eq!(unsafe { memplug_host_mechanism_identity(mech, null_mut()) }, MemplugHostStatus::NullArgument);
    // A longer struct (a later header's): the library writes what it knows
    // and says so in struct_size.
    #[repr(C)]
    #[derive(Default)]
    struct Longer {
        d: MemplugHostDescriptor,
        later: u64,
    }
    let mut longer = Longer {
        d: MemplugHostDescriptor { struct_size: size_of::<Longer>() as u32, ..Default::default() },
        later: 7,
    };
    ok(unsafe { memplug_host_mechanism_descriptor(mech, &mut longer.d) });
    assert_eq!(
        (longer.d.struct_size, longer.d.attributes, longer.later),
        (MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1, CPU_ATTRIBUTES, 7)
    );

    ok(memplug_host_mechanism_release(mech));
    let mut d = sized(|d: &mut MemplugHostDescriptor, n| d.struct_size = n);
    assert_eq!(unsafe { memplug_host_mechanism_descriptor(mech, &mut d) }, MemplugHostStatus::StaleHandle);
    assert_eq!(unsafe { memplug_host_mechanism_identity(mech, &mut id) }, MemplugHostStatus::StaleHandle);
    ok(memplug_host_manager_destroy(m));
}

#[test]
fn selection_by_memory_needs_says_what_is_missing() {
    let (m, mech) = cpu();
    ok(memplug_host_mechanism_release(mech));
    let all = needs(MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT, Location::HOST, 4096);
    let found = select_needing(m, CPU0, &all).unwrap();
    assert_eq!(descriptor_of(found).attributes, CPU_ATTRIBUTES);
    ok(memplug_host_mechanism_release(found));
    // NULL needs and empty needs: plain selection.
    let mut plain = MemplugHostMechanism::default();
    ok(unsafe {
        memplug_host_manager_select_needing(m, CPU0, MEMPLUG_CAP_VIRTUAL_BACKING, null(), &mut plain)
    });
    ok(memplug_host_mechanism_release(plain));
    ok(memplug_host_mechanism_release(select_needing(m, CPU0, &needs(0, Location::ANY, 0)).unwrap()));

    let (s, e) =
        select_needing(m, CPU0, &needs(MEMPLUG_ATTR_PINNED | MEMPLUG_ATTR_HOST_VISIBLE, Location::ANY, 0))
            .unwrap_err();
    assert_eq!(s, MemplugHostStatus::Unsupported);
    assert!(e.contains("attributes 0x8") && e.starts_with("memplug_host_manager_select_needing: "), "{e}");
    // A node no mechanism on CPU 0 is at, a page size none backs with.
    let (s, e) = select_needing(m, CPU0, &needs(0, Location::numa_node(7), 0)).unwrap_err();
    assert_eq!(s, MemplugHostStatus::Unsupported);
    assert!(e.contains("location 3:7 (it has 2:0)"), "{e}");
    let (s, e) = select_needing(m, CPU0, &needs(0, Location::ANY, 1 << 30)).unwrap_err();
    assert_eq!(s, MemplugHostStatus::Unsupported);
    assert!(e.contains("page size 0x40000000"), "{e}");
    // Where the CPU plugin has them, node 0 and 2 MiB pages are served by
    // its node and huge-page mechanisms.
    let published =
        |n: &str| memplug_plugin_cpu::offers().iter().any(|o| o.name == n && o.not_offered.is_none());
    if published("cpu-node0") {
        let found = select_needing(m, CPU0, &needs(0, Location::numa_node(0), 0)).unwrap();
        assert_eq!(descriptor_of(found).location_kind, MEMPLUG_LOCATION_NUMA_NODE);
        ok(memplug_host_mechanism_release(found));
    }
    if published("cpu-huge-2m") {
        let found = select_needing(m, CPU0, &needs(0, Location::ANY, MIB2)).unwrap();
        assert_eq!(descriptor_of(found).page_sizes, MIB2);
        ok(memplug_host_mechanism_release(found));
    }
    assert_eq!(select_needing(m, CPU1, &all).unwrap_err().0, MemplugHostStatus::NotFound);

    // Malformed needs.
    for (bad, what) in [
        (needs(1 << 20, Location::ANY, 0), "unknown attribute bits 0x100000"),
        (needs(0, Location { kind: 9, id: 0 }, 0), "unknown location kind 9"),
        (needs(0, Location { kind: MEMPLUG_LOCATION_HOST, id: 3 }, 0), "location id 3"),
        (needs(0, Location::ANY, 3 << 12), "not a power of two"),
        (MemplugHostMemoryNeeds { struct_size: 8, ..Default::default() }, "struct_size is 8"),
    ] {
        let (s, e) = select_needing(m, CPU0, &bad).unwrap_err();
        assert_eq!(s, MemplugHostStatus::InvalidArgument, "{e}");
        assert!(e.contains(what), "{what}: {e}");
    }
    let mut out = MemplugHostMechanism::default();
    assert_eq!(
        unsafe { memplug_host_manager_select_needing(m, CPU0, 1 << 30, &all, &mut out) },
        MemplugHostStatus::InvalidArgument
    );
    assert_eq!(
        unsafe { memplug_host_manager_select_needing(m, CPU0, 0, &all, null_mut()) },
        MemplugHostStatus::NullArgument
    );
    ok(memplug_host_manager_destroy(m));
}

fn binding_options(class: u32) -> MemplugHostBindingOptions {
    MemplugHostBindingOptions {
        struct_size: size_of::<MemplugHostBindingOptions>() as u32,
        alloc_class: class,
        ..Default::default()
    }
}

fn bind(
    m: MemplugHostManager,
    mech: MemplugHostMechanism,
    pool: MemplugHostPool,
    o: *const MemplugHostBindingOptions,
) -> Result<MemplugHostBinding, (MemplugHostStatus, String)> {
    let mut b = MemplugHostBinding::default();
    match unsafe { memplug_host_binding_create(m, mech, pool, o, &mut b) } {
        MemplugHostStatus::Ok => Ok(b),
        s => {
            assert_eq!(b.id, 0, "written only on success");
            Err((s, last_error()))
        }
    }
}

fn allocate(b: MemplugHostBinding, size: u64) -> Result<MemplugHostAllocation, (MemplugHostStatus, String)> {
    let mut a = MemplugHostAllocation::default();
    match unsafe { memplug_host_allocate(b, size, 64, &mut a, null_mut()) } {
        MemplugHostStatus::Ok => Ok(a),
        s => Err((s, last_error())),
    }
}

#[test]
fn the_cpu_plugin_judges_a_bindings_placement() {
    let (m, mech) = cpu();
    let mut pool = MemplugHostPool::default();
    ok(unsafe { memplug_host_pool_create(m, c"cpu0".as_ptr(), 16 << 20, &mut pool) });

    // What the CPU plugin can do: 4 KiB pages, memfd export, host memory.
    let mut o = binding_options(MEMPLUG_HOST_CLASS_KV);
    o.hints = MEMPLUG_HINT_UNINITIALIZED_OK;
    o.page_size = 4096;
    o.export_types = MEMPLUG_HANDLE_MEMFD;
    o.location_kind = MEMPLUG_LOCATION_HOST;
    let b = bind(m, mech, pool, &o).unwrap();
    ok(memplug_host_allocation_free(allocate(b, 8192).unwrap()));
    let mut p = MemplugHostPrefix::default();
    ok(unsafe { memplug_host_prefix_create(b, 8192, None, null_mut(), &mut p) });
    ok(memplug_host_prefix_release(p));
    ok(memplug_host_binding_destroy(b));

    // What it cannot: refused by the plugin when memory is asked for, the
    // grant given back.
    let mut huge = binding_options(MEMPLUG_HOST_CLASS_KV);
    huge.page_size = MIB2;
    let b = bind(m, mech, pool, &huge).unwrap();
    let (s, e) = allocate(b, 8192).unwrap_err();
    assert_eq!(s, MemplugHostStatus::InvalidArgument, "{e}");
    assert!(e.contains("page size 0x200000"), "{e}");
    ok(memplug_host_binding_destroy(b));
    let mut dmabuf = binding_options(MEMPLUG_HOST_CLASS_OTHER);
    dmabuf.export_types = MEMPLUG_HANDLE_DMABUF_FD;
    let b = bind(m, mech, pool, &dmabuf).unwrap();
    assert_eq!(allocate(b, 8192).unwrap_err().0, MemplugHostStatus::Unsupported);
    let mut p = MemplugHostPrefix::default();
    assert_eq!(
        unsafe { memplug_host_prefix_create(b, 8192, None, null_mut(), &mut p) },
        MemplugHostStatus::Unsupported
    );
    assert_eq!(p.id, 0);
    ok(memplug_host_binding_destroy(b));

    // A caller built with the 1.0 options: whatever follows its struct is
    // not read (here, placement the plugin would refuse).
    let mut old = huge;
    old.export_types = MEMPLUG_HANDLE_DMABUF_FD;
    old.hints = 0xdead;
    old.location_kind = 77;
    old.struct_size = MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0;
    let b = bind(m, mech, pool, &old).unwrap();
    ok(memplug_host_allocation_free(allocate(b, 8192).unwrap()));
    ok(memplug_host_binding_destroy(b));

    // Malformed placement: refused before anything is made.
    for (set, what) in [
        (
            (|o: &mut MemplugHostBindingOptions| o.hints = 1 << 5) as fn(&mut MemplugHostBindingOptions),
            "unknown hint bits 0x20",
        ),
        (|o| o.export_types = 1 << 9, "unknown export kind bits 0x200"),
        (|o| o.page_size = 4097, "page size 0x1001 is not a power of two"),
        (|o| o.location_kind = 5, "unknown location kind 5"),
        (|o| (o.location_kind, o.location_id) = (MEMPLUG_LOCATION_ANY, 1), "location id 1"),
    ] {
        let mut o = binding_options(MEMPLUG_HOST_CLASS_OTHER);
        set(&mut o);
        let (s, e) = bind(m, mech, pool, &o).unwrap_err();
        assert_eq!(s, MemplugHostStatus::InvalidArgument, "{e}");
        assert!(e.contains(what) && e.contains("MemplugHostBindingOptions"), "{what}: {e}");
    }
    let mut tier = binding_options(MEMPLUG_HOST_CLASS_OTHER);
    (tier.location_kind, tier.location_id) = (MEMPLUG_LOCATION_TIER, 2);
    ok(memplug_host_binding_destroy(bind(m, mech, pool, &tier).unwrap()));

    let mut stats = sized(|s: &mut MemplugHostPoolStats, n| s.struct_size = n);
    ok(unsafe { memplug_host_pool_stats(pool, &mut stats) });
    assert_eq!(stats.used, 0, "every refused request's grant came back");
    ok(memplug_host_manager_destroy(m));
}

// ---- a linked-in plugin that records the requests it is sent ------------

static SEEN: Mutex<Option<Request>> = Mutex::new(None);

#[derive(Default)]
struct Recorder {
    blocks: Mutex<HashMap<u64, Layout>>,
}

impl Allocator for Recorder {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 4096 }
    }
    fn descriptor(&self) -> Descriptor {
        Descriptor {
            recommended_granularity: 64 << 10,
            page_sizes: Descriptor::page_size_bit(4096) | Descriptor::page_size_bit(MIB2),
            attributes: MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_ZERO_FILLED,
            export_types: MEMPLUG_HANDLE_MEMFD | MEMPLUG_HANDLE_OPAQUE_FD,
            location: Location::numa_node(1),
            maps_at_offsets: false,
        }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        *SEEN.lock().unwrap() = Some(*r);
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

fn identity() -> DeviceIdentity {
    DeviceIdentity {
        valid: MEMPLUG_IDENTITY_UUID | MEMPLUG_IDENTITY_PCI | MEMPLUG_IDENTITY_SUB_DEVICE,
        uuid: *b"memplug-capi-dev",
        pci_domain: 1,
        pci_bus: 0x41,
        pci_device: 2,
        pci_function: 1,
        sub_device: 3,
        ..Default::default()
    }
}

fn recorder_plugin() -> ExportedPlugin {
    PluginBuilder::new("capi-recorder", "1")
        .mechanism(MechanismBuilder::new("rec", 7, CPU1, Recorder::default()).identity(identity()).build())
        .mechanism(MechanismBuilder::new("anon", 8, CPU1, Recorder::default()).build())
        .live_objects(|| 0)
        .build()
}
memplug_sdk::declare_entry!(recorder_entry, recorder_plugin);

#[test]
fn a_linked_plugins_identity_and_a_bindings_placement_cross_the_c_api() {
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    ok(unsafe { memplug_host_manager_register_entry(m, Some(recorder_entry), c"capi recorder".as_ptr()) });
    let mut rec = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_find_mechanism(m, c"capi-recorder/rec".as_ptr(), &mut rec) });
    let mut anon = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_find_mechanism(m, c"capi-recorder/anon".as_ptr(), &mut anon) });

    let mut id = sized(|i: &mut MemplugHostDeviceIdentity, n| i.struct_size = n);
    ok(unsafe { memplug_host_mechanism_identity(rec, &mut id) });
    let want = identity();
    assert_eq!(
        (
            id.valid,
            id.uuid,
            id.pci_domain,
            id.pci_bus,
            id.pci_device,
            id.pci_function,
            id.sub_device,
            id.numa_node
        ),
        (want.valid, want.uuid, 1, 0x41, 2, 1, 3, 0)
    );
    let mut none = sized(|i: &mut MemplugHostDeviceIdentity, n| i.struct_size = n);
    assert_eq!(unsafe { memplug_host_mechanism_identity(anon, &mut none) }, MemplugHostStatus::NotFound);
    assert!(last_error().contains("capi-recorder/anon published no device identity"), "{}", last_error());
    assert_eq!(none.valid, 0, "untouched");
    let d = descriptor_of(rec);
    assert_eq!((d.recommended_granularity, d.page_sizes), (64 << 10, 4096 | MIB2));
    assert_eq!((d.location_kind, d.location_id, d.maps_at_offsets), (MEMPLUG_LOCATION_NUMA_NODE, 1, 0));
    assert_eq!(d.export_types, MEMPLUG_HANDLE_MEMFD | MEMPLUG_HANDLE_OPAQUE_FD);

    // Selection by location, first match in registration order.
    let found =
        select_needing(m, CPU1, &needs(MEMPLUG_ATTR_ZERO_FILLED, Location::numa_node(1), MIB2)).unwrap();
    let info = mechanism_info(found);
    assert_eq!(info.mechanism_id, 7);
    ok(memplug_host_mechanism_release(found));

    let mut pool = MemplugHostPool::default();
    ok(unsafe { memplug_host_pool_create(m, c"cpu1".as_ptr(), 16 << 20, &mut pool) });
    let mut o = binding_options(MEMPLUG_HOST_CLASS_WEIGHTS);
    o.hints = MEMPLUG_HINT_UNINITIALIZED_OK;
    o.page_size = MIB2;
    o.export_types = MEMPLUG_HANDLE_OPAQUE_FD;
    (o.location_kind, o.location_id) = (MEMPLUG_LOCATION_NUMA_NODE, 1);
    let mut old = o;
    old.struct_size = MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0;
    for (opts, placed) in [(&o as *const _, true), (&old as *const _, false), (null(), false)] {
        let b = bind(m, rec, pool, opts).unwrap();
        let a = allocate(b, 8192).unwrap();
        let r = SEEN.lock().unwrap().take().expect("the plugin was asked");
        if placed {
            assert!(r.uninitialized_ok());
            assert_eq!(
                (r.page_size, r.location, r.export_types),
                (MIB2, Location::numa_node(1), MEMPLUG_HANDLE_OPAQUE_FD)
            );
        } else {
            assert_eq!((r.hints, r.page_size, r.location, r.export_types), (0, 0, Location::ANY, 0), "{r:?}");
        }
        ok(memplug_host_allocation_free(a));
        ok(memplug_host_binding_destroy(b));
    }
    ok(memplug_host_manager_destroy(m));
}
