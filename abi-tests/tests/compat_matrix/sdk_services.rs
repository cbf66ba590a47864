//! SDK plugins in process, between hosts of different minors: which hosts
//! a plugin is given the ABI 1.2 services by, whom a loss report reaches,
//! and the host's and the SDK's refusals of the services where they do not
//! apply.

use super::*;

// ---- SDK plugins in process, between hosts of different minors ----

/// A plain heap allocator plugin built with the SDK and a `HostLink`, so a
/// test can see which hosts the plugin was given services by
/// (`HostLink::hosts`) and whom a loss report reaches.
mod sdk {
    use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
    use memplug_sdk::*;
    use std::alloc::Layout;
    use std::collections::HashMap;
    use std::sync::Mutex;

    pub const MECHANISM_ID: u64 = 12;
    const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

    #[derive(Default)]
    pub struct Heap {
        blocks: Mutex<HashMap<u64, Layout>>,
    }

    impl Allocator for Heap {
        fn properties(&self) -> Properties {
            Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
        }
        fn allocate(&self, r: &Request) -> PluginResult<Block> {
            let layout = Layout::from_size_align(r.size as usize, r.alignment as usize)
                .map_err(|e| PluginError::invalid_argument(e.to_string()))?;
            // SAFETY: not zero-sized (the SDK refuses size 0).
            let p = unsafe { std::alloc::alloc(layout) };
            if p.is_null() {
                return Err(PluginError::out_of_memory("heap exhausted"));
            }
            self.blocks.lock().unwrap().insert(p as u64, layout);
            Ok(Block { addr: p as u64, size: r.size, handle: p as u64 })
        }
        fn deallocate(&self, o: &ObjectRef) -> PluginResult<()> {
            let layout = self
                .blocks
                .lock()
                .unwrap()
                .remove(&o.handle)
                .ok_or_else(|| PluginError::unknown_allocation("not a live block"))?;
            // SAFETY: allocated above with this layout, out of the table now.
            unsafe { std::alloc::dealloc(o.handle as *mut u8, layout) };
            Ok(())
        }
    }

    pub fn build(name: &'static str, max_minor: u32, link: &HostLink) -> ExportedPlugin {
        let heap = MechanismBuilder::new("heap", MECHANISM_ID, CPU0, Heap::default());
        let state = heap.state();
        PluginBuilder::new(name, "1")
            .minors(0, max_minor)
            .host_link(link)
            .mechanism(heap.build())
            .live_objects(move || state.blocks.lock().unwrap().len() as u64)
            .build()
    }
}

/// One SDK plugin instance (its own plugin cell and link) per test:
/// `sdk_instance!(module, "name", max_minor)` defines `module::entry` and
/// `module::LINK`.
macro_rules! sdk_instance {
    ($m:ident, $name:literal, $max:expr) => {
        mod $m {
            #[allow(dead_code)]
            pub const NAME: &str = $name;
            pub static LINK: std::sync::LazyLock<memplug_sdk::HostLink> =
                std::sync::LazyLock::new(memplug_sdk::HostLink::new);
            fn init() -> memplug_sdk::ExportedPlugin {
                super::sdk::build($name, $max, &LINK)
            }
            memplug_sdk::declare_entry!(pub entry, init);
        }
    };
}

sdk_instance!(sdk_1_2, "sdk-1.2", 2);
sdk_instance!(sdk_1_1, "sdk-1.1", 1);
sdk_instance!(sdk_raw, "sdk-raw", 2);
sdk_instance!(sdk_stash, "sdk-stash", 2);

fn load_entry(entry: memplug_sdk::abi::MemplugEntryV1, name: &str, max_minor: u32) -> Plugin {
    let opts = LoadOptions { max_minor, ..Default::default() };
    // SAFETY: an SDK entry of this test binary.
    unsafe { Plugin::from_entry(entry, name, &opts) }.unwrap()
}

/// allocate/free through the plugin's one mechanism.
fn allocate_and_free(p: &Plugin) {
    let alloc = unsafe { p.mechanisms()[0].ungoverned() }.allocator();
    let a = alloc.allocate(256, 64).unwrap_or_else(|e| panic!("1.{}: allocate: {e}", p.abi_version().1));
    // SAFETY: a live heap block of 256 bytes.
    unsafe { std::ptr::write_bytes(a.addr() as *mut u8, 0xa5, 256) };
    alloc.deallocate(a).unwrap_or_else(|e| panic!("1.{}: deallocate: {}", p.abi_version().1, e.error));
}

/// One instance of a 1.2 SDK plugin held by a 1.2 host and by a host pinned
/// to 1.1 at once: both agree on the newest minor they share and both
/// allocate; only the 1.2 host's services are attached, so a loss the
/// plugin reports reaches the 1.2 host alone (its mechanism lost, its
/// calls DEVICE_LOST) while the 1.1 host hears nothing and counts nothing.
#[test]
fn services_reach_only_the_host_that_agreed_on_1_2() {
    use memplug_sdk::LossReport;
    let link = &*sdk_1_2::LINK;
    let h12 = load_entry(sdk_1_2::entry, sdk_1_2::NAME, 2);
    assert_eq!((h12.abi_version(), h12.plugin_minor_range()), ((1, 2), (0, 2)));
    assert_eq!(link.hosts(), 1, "the 1.2 host's services are attached");
    let h11 = load_entry(sdk_1_2::entry, sdk_1_2::NAME, 1);
    assert_eq!(h11.abi_version(), (1, 1));
    assert_eq!(link.hosts(), 1, "a host that agreed on 1.1 passed a table, and the plugin left it alone");
    allocate_and_free(&h12);
    allocate_and_free(&h11);

    let report = link.report_device_lost(sdk::MECHANISM_ID, "matrix: the device is gone");
    assert_eq!(report, LossReport { known: true, accepted: 1, refused: vec![] });
    let s12 = h12.service_stats();
    assert_eq!((s12.losses, s12.repeats, s12.refused), (1, 0, 0), "{s12:?}");
    assert_eq!(h12.mechanisms()[0].life_state(), LifeState::Lost);
    let e = unsafe { h12.mechanisms()[0].ungoverned() }.allocator().allocate(64, 16).unwrap_err();
    assert_eq!(e.status, Status::DeviceLost, "{e}");
    assert_eq!(h11.service_stats(), ServiceStats::default(), "the 1.1 host was never called");
    assert_eq!(h11.mechanisms()[0].life_state(), LifeState::Active, "the 1.1 host lost nothing");
    // A second report of the same loss: OK again, nothing changes.
    assert_eq!(link.report_device_lost(sdk::MECHANISM_ID, "again").accepted, 1);
    let s12 = h12.service_stats();
    assert_eq!((s12.losses, s12.repeats), (1, 1), "{s12:?}");
    h11.unload().unwrap();
    h12.unload().unwrap();
    assert_eq!(link.hosts(), 0, "the last unload detaches every host");
}

/// A plugin that speaks only 1.1 (`PluginBuilder::minors(0, 1)`) loaded by
/// the 1.2 host: agreed 1.1, works, and takes nothing from the services the
/// host passed; a loss it reports reaches no host.
#[test]
fn a_1_1_sdk_plugin_takes_no_services_from_a_1_2_host() {
    let link = &*sdk_1_1::LINK;
    let p = load_entry(sdk_1_1::entry, sdk_1_1::NAME, HOST_MAX_MINOR);
    assert_eq!((p.abi_version(), p.plugin_minor_range()), ((1, 1), (0, 1)));
    assert_eq!(link.hosts(), 0, "services are 1.2: not attached at 1.1");
    allocate_and_free(&p);
    let report = link.report_device_lost(sdk::MECHANISM_ID, "nobody hears this");
    assert!(report.known && report.accepted == 0 && report.refused.is_empty(), "{report:?}");
    assert_eq!(p.service_stats(), ServiceStats::default());
    assert_eq!(p.mechanisms()[0].life_state(), LifeState::Active);
    p.unload().unwrap();
}

/// The host's table, as the entry below last received it: (ctx, slot).
static STASHED: std::sync::Mutex<Option<(usize, usize)>> = std::sync::Mutex::new(None);

/// The `sdk_stash` entry, keeping a copy of the host's services table (as
/// a plugin may) so that the test can call it the way a plugin that
/// ignores the rules would.
unsafe extern "C" fn stashing_entry(
    host: *const memplug_sdk::abi::MemplugHostInfo,
    out: *mut memplug_sdk::abi::MemplugNegotiation,
    sink: *const memplug_sdk::abi::MemplugMessageSink,
) -> memplug_sdk::abi::MemplugStatus {
    // SAFETY: the host's info, valid for the call.
    let h = unsafe { &*host };
    if h.struct_size >= memplug_sdk::abi::MEMPLUG_HOST_INFO_SIZE_1_2 && !h.services.is_null() {
        // SAFETY: the host's table, valid until unload (and kept after).
        let t = unsafe { &*h.services };
        *STASHED.lock().unwrap() = Some((t.ctx as usize, t.report_device_lost.unwrap() as usize));
    }
    // SAFETY: the same arguments, passed on.
    unsafe { sdk_stash::entry(host, out, sink) }
}

fn stashed_report(id: u64, reason: &[u8]) -> memplug_sdk::abi::MemplugStatus {
    type Report = unsafe extern "C" fn(*mut core::ffi::c_void, u64, *const core::ffi::c_char, usize) -> u32;
    let (ctx, f) = STASHED.lock().unwrap().expect("a table was passed");
    // SAFETY: the host's own slot and context, copied above.
    let f: Report = unsafe { std::mem::transmute::<usize, Report>(f) };
    // SAFETY: a valid (pointer, length) pair.
    unsafe { f(ctx as *mut _, id, reason.as_ptr().cast(), reason.len()) }
}

/// A plugin that calls the services although it agreed on 1.1 (the host
/// pinned to 1.1 still passes its table) is refused with INVALID_STATE and
/// loses nothing; so is one calling a table it kept after the host unloaded
/// it. The same plugin at 1.2 is heard.
#[test]
fn the_host_refuses_services_below_1_2_and_after_unload() {
    use memplug_sdk::abi::{MEMPLUG_STATUS_INVALID_STATE, MEMPLUG_STATUS_OK};
    let p = load_entry(stashing_entry, sdk_stash::NAME, 1);
    assert_eq!(p.abi_version(), (1, 1));
    assert_eq!(stashed_report(sdk::MECHANISM_ID, b"at 1.1"), MEMPLUG_STATUS_INVALID_STATE);
    let st = p.service_stats();
    assert_eq!((st.losses, st.refused), (0, 1), "{st:?}");
    assert!(st.last_refusal.as_deref().unwrap().contains("1.1"), "{st:?}");
    assert_eq!(p.mechanisms()[0].life_state(), LifeState::Active);
    allocate_and_free(&p);
    p.unload().unwrap();
    assert_eq!(stashed_report(sdk::MECHANISM_ID, b"after unload"), MEMPLUG_STATUS_INVALID_STATE);

    let p = load_entry(stashing_entry, sdk_stash::NAME, 2);
    assert_eq!(stashed_report(sdk::MECHANISM_ID, b"at 1.2"), MEMPLUG_STATUS_OK);
    assert_eq!(p.service_stats().losses, 1);
    assert_eq!(p.mechanisms()[0].life_state(), LifeState::Lost);
    p.unload().unwrap();
    assert_eq!(stashed_report(sdk::MECHANISM_ID, b"after unload"), MEMPLUG_STATUS_INVALID_STATE);
}

/// What a services table the SDK is handed must look like for the plugin
/// to call it: a host info whose `struct_size` reaches `services`, a table
/// whose `struct_size` covers `report_device_lost`, a non-NULL slot, and an
/// agreed minor of at least 2. The entry is called directly with crafted
/// host infos; the table counts the calls it gets.
#[test]
fn the_sdk_reads_services_only_where_struct_size_covers_them() {
    use memplug_sdk::abi::*;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

    static CALLS: AtomicU32 = AtomicU32::new(0);
    unsafe extern "C" fn counted(
        _ctx: *mut core::ffi::c_void,
        _id: u64,
        _reason: *const core::ffi::c_char,
        _len: usize,
    ) -> MemplugStatus {
        CALLS.fetch_add(1, SeqCst);
        MEMPLUG_STATUS_OK
    }
    let table = |struct_size: u32, slot: bool| MemplugHostServices {
        struct_size,
        reserved0: 0,
        ctx: core::ptr::null_mut(),
        report_device_lost: if slot { Some(counted) } else { None },
    };
    let full = table(MEMPLUG_HOST_SERVICES_SIZE_1_2, true);
    let short = table(16, true);
    let no_slot = table(MEMPLUG_HOST_SERVICES_SIZE_1_2, false);
    let link = &*sdk_raw::LINK;
    // (host info struct_size, max minor, services, calls a report makes)
    let cases: [(u32, u32, *const MemplugHostServices, u32, &str); 6] = [
        (MEMPLUG_HOST_INFO_SIZE_1_2, 2, &full, 1, "a 1.2 host info and table"),
        (MEMPLUG_HOST_INFO_SIZE_1_2, 1, &full, 0, "agreed 1.1"),
        (MEMPLUG_HOST_INFO_SIZE_1_1, 2, &full, 0, "a 24-byte host info: `services` is not there"),
        (MEMPLUG_HOST_INFO_SIZE_1_2, 2, &short, 0, "a table too short for the slot"),
        (MEMPLUG_HOST_INFO_SIZE_1_2, 2, &no_slot, 0, "a NULL slot"),
        (MEMPLUG_HOST_INFO_SIZE_1_2, 2, core::ptr::null(), 0, "no table"),
    ];
    for (size, max_minor, services, calls, what) in cases {
        let info = MemplugHostInfo {
            struct_size: size,
            abi_major: 1,
            min_minor: 0,
            max_minor,
            host_name: c"compat-matrix".as_ptr(),
            services,
        };
        let mut out = MemplugNegotiation {
            struct_size: MEMPLUG_NEGOTIATION_SIZE_1_2,
            agreed_minor: 0,
            plugin: core::ptr::null(),
        };
        // SAFETY: valid pointers for the call; no sink.
        let st = unsafe { sdk_raw::entry(&info, &mut out, core::ptr::null()) };
        assert_eq!((st, out.agreed_minor), (MEMPLUG_STATUS_OK, max_minor), "{what}");
        let before = CALLS.load(SeqCst);
        let report = link.report_device_lost(sdk::MECHANISM_ID, "probe");
        assert_eq!(CALLS.load(SeqCst) - before, calls, "{what}: {report:?}");
        assert_eq!(report.accepted as u32, calls, "{what}");
        // Give the hold back (as a host's unload does): the plugin is freed
        // and the next negotiation builds it again.
        // SAFETY: the descriptor the entry just returned, unloaded once.
        unsafe {
            let d = &*out.plugin;
            assert_eq!(d.live_objects.unwrap()(d.ctx), 0);
            d.unload.unwrap()(d.ctx);
        }
        assert_eq!(link.hosts(), 0, "{what}: unload detaches");
    }
}

// ---- the 1.1 rules, enforced by the current host ----
