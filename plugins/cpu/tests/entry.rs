//! The entry points and the descriptor: what a host sees when it loads the
//! plugin, before it calls any slot.

mod common;
use common::*;

#[test]
fn descriptor_publishes_the_cpu_mechanism_first_with_every_capability() {
    let _h = harness();
    let plugin = descriptor();
    assert_eq!(plugin.struct_size, MEMPLUG_PLUGIN_SIZE_1_0);
    assert_eq!(plugin.abi_major, 1);
    assert_eq!(text(plugin.name), "memplug-cpu");
    assert!(!text(plugin.version).is_empty());
    assert!(plugin.live_objects.is_some());
    // "cpu" first, then what this machine serves (`offers` probes it the
    // same way the plugin does).
    let offered: Vec<String> = memplug_plugin_cpu::offers()
        .into_iter()
        .filter(|o| o.not_offered.is_none())
        .map(|o| o.name)
        .collect();
    let mechs = unsafe { std::slice::from_raw_parts(plugin.mechanisms, plugin.mechanism_count as usize) };
    let names: Vec<String> = mechs.iter().map(|&m| text(unsafe { (*m).name }).to_string()).collect();
    assert_eq!(names, offered);

    let mech = unsafe { &**plugin.mechanisms };
    assert_eq!(text(mech.name), "cpu");
    assert_eq!(mech.mechanism_id, 1);
    assert_eq!(mech.device, CPU0);
    // Negotiated at 1.3 (the newest minor; 1.3 adds no capability bit):
    // every capability 1.2 defines, typed export and queue-ordered binding
    // included, but peer access (no other device to grant it to), in a
    // 1.2-sized mechanism (88 bytes) with its identity.
    assert_eq!(mech.struct_size, MEMPLUG_MECHANISM_SIZE_1_2);
    assert_eq!(mech.capabilities, MEMPLUG_CAP_ALL_1_2 & !MEMPLUG_CAP_PEER_ACCESS);
    assert!(mech.peer_access.is_null(), "no peer access without MEMPLUG_CAP_PEER_ACCESS");
    assert!(!mech.virtual_backing.is_null() && !mech.shared_mapping.is_null() && !mech.sync.is_null());
    let vb = unsafe { &*mech.virtual_backing };
    assert_eq!(vb.struct_size, MEMPLUG_VIRTUAL_BACKING_SIZE_1_2);
    assert!(vb.commit_on.is_some() && vb.decommit_on.is_some(), "queue-ordered binding");
    let sm = unsafe { &*mech.shared_mapping };
    assert_eq!(sm.struct_size, MEMPLUG_SHARED_MAPPING_SIZE_1_2);
    assert!(sm.export_fd.is_some() && sm.import_fd.is_some());
    assert!(sm.export_handle.is_some() && sm.import_handle.is_some());
    assert!(sm.map_on.is_some() && sm.unmap_on.is_some(), "queue-ordered binding");
    assert!(!mech.identity.is_null(), "the CPU mechanism publishes its identity at 1.2");
    let id = unsafe { &*mech.identity };
    assert_eq!(id.struct_size, MEMPLUG_DEVICE_IDENTITY_SIZE_1_2);
    assert_eq!(id.valid, MEMPLUG_IDENTITY_NUMA_NODE, "a CPU device knows its NUMA node only");
    assert_eq!(id.numa_node, CPU0.ordinal, "a CPU device's ordinal is its NUMA node");

    let alloc = unsafe { &*mech.allocator };
    assert!(alloc.memory_info.is_some(), "HAS_MEMORY_INFO publishes the slot");
    let sync = unsafe { &*mech.sync };
    assert_eq!(sync.struct_size, MEMPLUG_SYNC_SIZE_1_3);
    assert!(sync.copy.is_some(), "the stream worker copies (ABI 1.3)");
    assert!(sync.stream_adopt.is_none(), "CPU streams have no native handle to adopt");
    assert!(sync.stream_wait_fence.is_some(), "the stream worker waits for another stream's fence (ABI 1.2)");
    assert!(sync.stream_adopt_typed.is_none(), "no native stream of any API to adopt");
}

#[test]
fn properties_are_16_byte_minimum_1_gib_maximum_page_granularity() {
    let h = harness();
    let p = h.properties().unwrap();
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    assert_eq!(p.min_alignment, 16);
    assert_eq!(p.max_alignment, 1 << 30);
    assert_eq!(p.granularity, page);
}

#[test]
fn memory_info_reports_the_machine() {
    let h = harness();
    let m = h.memory_info().unwrap();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(m.total_bytes, total_kib * 1024);
    assert!(m.free_bytes > 0 && m.free_bytes <= m.total_bytes);
}

#[test]
fn negotiation_refuses_other_majors_and_disjoint_minors() {
    let _h = harness();
    let entry = memplug_plugin_cpu::memplug_plugin_v1;
    let msg = refused(negotiate(entry, &host_info(2, 0, 0)), Status::VersionMismatch);
    assert!(msg.contains("major"), "{msg}");
    let msg = refused(negotiate(entry, &host_info(1, MEMPLUG_ABI_MINOR + 1, 3)), Status::VersionMismatch);
    assert!(msg.contains("minor"), "{msg}");
    let ok = negotiate(entry, &host_info(1, 0, 7)).unwrap();
    assert_eq!(ok.agreed_minor, MEMPLUG_ABI_MINOR, "the agreed minor is a ceiling of both sides");
}

#[test]
fn the_in_process_entry_serves_its_own_instance() {
    let h = harness();
    let n =
        negotiate(memplug_plugin_cpu::cpu_plugin_entry, &host_info(MEMPLUG_ABI_MAJOR, 0, MEMPLUG_ABI_MINOR))
            .unwrap();
    let plugin = unsafe { &*n.plugin };
    assert!(!std::ptr::eq(plugin, descriptor()));
    let other = Api::from_descriptor(plugin);
    let before = other.live();

    let block = other.allocate(64, 16).unwrap();
    assert_eq!(other.live(), before + 1);
    // The exported instance never made it, so it must not free it.
    refused(h.deallocate(&block), Status::UnknownAllocation);
    other.deallocate(&block).unwrap();
    assert_eq!(other.live(), before);
    h.assert_balanced();
}
