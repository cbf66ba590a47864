//! Mechanism lives through the C API (issue 11): lifecycle callbacks, a
//! loss declared by the runtime (DEVICE_LOST for new work, notices, one
//! settlement, inert handles), retirement and replacement (new bindings go
//! to the successor, the old plugin unloaded once settled), termination
//! and its refusals, re-entry from a lifecycle callback, unsubscribing
//! while a callback runs, and frees racing `memplug_host_allocation_is_lost`.
//!
//! The lost mechanism is the real CPU plugin loaded by path (the loss is
//! the runtime's own, `memplug_host_mechanism_declare_lost`: no plugin
//! support needed). The replacement is a second CPU mechanism: a private
//! copy of the CPU plugin's library is refused (one plugin name per
//! manager: `MEMPLUG_HOST_STATUS_ALREADY_EXISTS`, checked below), so the
//! successor is a small SDK plugin linked into this test and registered
//! with `memplug_host_manager_register_entry`.

use memplug_host_capi::*;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_sdk::{Allocator, Block, ExportedPlugin, MechanismBuilder, ObjectRef, PluginBuilder};
use memplug_sdk::{PluginResult, Properties, Request};
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

mod common;
use common::{last_error, ok, plugin_path};

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

// ---- a second CPU mechanism, linked in --------------------------------------

/// Blocks of the in-process successor: (address, backing memory).
static SUCCESSOR_BLOCKS: Mutex<Vec<(u64, Vec<u8>)>> = Mutex::new(Vec::new());
static SUCCESSOR_CALLS: AtomicU64 = AtomicU64::new(0);

struct Successor;

impl Allocator for Successor {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        SUCCESSOR_CALLS.fetch_add(1, SeqCst);
        let mut mem = vec![0u8; (r.size + r.alignment) as usize];
        let addr = (mem.as_mut_ptr() as u64).next_multiple_of(r.alignment.max(16));
        SUCCESSOR_BLOCKS.lock().unwrap().push((addr, mem));
        Ok(Block { addr, size: r.size, handle: addr })
    }
    fn deallocate(&self, o: &ObjectRef) -> PluginResult<()> {
        SUCCESSOR_CALLS.fetch_add(1, SeqCst);
        SUCCESSOR_BLOCKS.lock().unwrap().retain(|(a, _)| *a != o.handle);
        Ok(())
    }
}

fn successor_plugin() -> ExportedPlugin {
    PluginBuilder::new("memplug-cpu-successor", "1")
        .mechanism(MechanismBuilder::new("cpu-successor", 7, CPU0, Successor).build())
        .live_objects(|| SUCCESSOR_BLOCKS.lock().unwrap().len() as u64)
        .build()
}
memplug_sdk::declare_entry!(successor_entry, successor_plugin);

// ---- what a subscriber saw ------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
struct Notice {
    pool: String,
    holder_id: u64,
    class: u32,
    objects: u64,
    bytes: u64,
    quarantined: u64,
}

#[derive(Clone, Debug)]
struct Seen {
    from: MemplugHostLifeState,
    to: MemplugHostLifeState,
    subscription: MemplugHostSubscription,
    context: String,
    reason: Option<String>,
    notices: Vec<Notice>,
    settlement: Option<MemplugHostSettlement>,
    thread: std::thread::ThreadId,
    /// Statuses of calls made from inside the callback.
    poll: MemplugHostStatus,
    declare_lost: MemplugHostStatus,
    terminate: MemplugHostStatus,
    state: MemplugHostStatus,
}

struct Recorder {
    manager: MemplugHostManager,
    mechanism: MemplugHostMechanism,
    seen: Mutex<Vec<Seen>>,
}

unsafe fn text(p: *const std::ffi::c_char, len: usize) -> String {
    let bytes = std::slice::from_raw_parts(p.cast::<u8>(), len);
    assert_eq!(*p.add(len), 0, "NUL-terminated after its length");
    String::from_utf8(bytes.to_vec()).unwrap()
}

unsafe extern "C" fn record(ud: *mut c_void, e: *const MemplugHostLifecycleEvent) {
    let r = &*(ud as *const Recorder);
    let e = &*e;
    assert_eq!(e.struct_size as usize, std::mem::size_of::<MemplugHostLifecycleEvent>());
    let notices = (0..e.notice_count)
        .map(|i| {
            let n = &*e.notices.cast::<u8>().add(i * e.notice_size).cast::<MemplugHostLossNotice>();
            Notice {
                pool: text(n.pool_name, n.pool_name_len),
                holder_id: n.holder_id,
                class: n.alloc_class,
                objects: n.objects,
                bytes: n.bytes,
                quarantined: n.quarantined_bytes,
            }
        })
        .collect();
    let mut state = MemplugHostLifeState::Active;
    let seen = Seen {
        from: e.from,
        to: e.to,
        subscription: e.subscription,
        context: text(e.context, e.context_len),
        reason: (!e.reason.is_null()).then(|| text(e.reason, e.reason_len)),
        notices,
        settlement: e.settlement.as_ref().copied(),
        thread: std::thread::current().id(),
        poll: memplug_host_manager_poll(r.manager, null_mut()),
        declare_lost: memplug_host_mechanism_declare_lost(
            r.mechanism,
            c"from a callback".as_ptr(),
            null_mut(),
        ),
        terminate: memplug_host_manager_terminate(r.manager, r.mechanism, 0, null_mut()),
        state: memplug_host_mechanism_state(r.mechanism, &mut state),
    };
    r.seen.lock().unwrap().push(seen);
}

fn subscribe(r: &Recorder) -> MemplugHostSubscription {
    let mut s = MemplugHostSubscription::default();
    ok(unsafe {
        memplug_host_mechanism_subscribe(r.mechanism, Some(record), r as *const _ as *mut c_void, &mut s)
    });
    assert_ne!(s.id, 0);
    s
}

fn state(m: MemplugHostMechanism) -> MemplugHostLifeState {
    let mut s = MemplugHostLifeState::Active;
    ok(unsafe { memplug_host_mechanism_state(m, &mut s) });
    s
}

fn reason(m: MemplugHostMechanism) -> String {
    let mut n = usize::MAX;
    ok(unsafe { memplug_host_mechanism_reason(m, null_mut(), 0, &mut n) });
    let mut buf = vec![0u8; n + 1];
    let mut again = 0;
    ok(unsafe { memplug_host_mechanism_reason(m, buf.as_mut_ptr().cast(), buf.len(), &mut again) });
    assert_eq!(again, n);
    buf.truncate(n);
    String::from_utf8(buf).unwrap()
}

fn pool_stats(p: MemplugHostPool) -> MemplugHostPoolStats {
    let mut s = MemplugHostPoolStats { struct_size: MEMPLUG_HOST_POOL_STATS_SIZE_1_0, ..Default::default() };
    ok(unsafe { memplug_host_pool_stats(p, &mut s) });
    s
}

fn allocate(b: MemplugHostBinding, size: u64) -> (MemplugHostAllocation, u64) {
    let mut a = MemplugHostAllocation::default();
    ok(unsafe { memplug_host_allocate(b, size, 64, &mut a, null_mut()) });
    let mut info = MemplugHostAllocationInfo {
        struct_size: MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0,
        ..Default::default()
    };
    ok(unsafe { memplug_host_allocation_info(a, &mut info) });
    (a, info.size)
}

fn is_lost(a: MemplugHostAllocation) -> bool {
    let mut lost = false;
    ok(unsafe { memplug_host_allocation_is_lost(a, &mut lost) });
    lost
}

fn settlement_of(m: MemplugHostMechanism) -> Result<MemplugHostSettlement, MemplugHostStatus> {
    let mut s = MemplugHostSettlement { struct_size: MEMPLUG_HOST_SETTLEMENT_SIZE_1_0, ..Default::default() };
    match unsafe { memplug_host_mechanism_settlement(m, &mut s) } {
        MemplugHostStatus::Ok => Ok(s),
        e => Err(e),
    }
}

fn mechanism_plugin_name(info: &MemplugHostMechanismInfo) -> String {
    unsafe { CStr::from_ptr(info.plugin_name.as_ptr()) }.to_str().unwrap().to_string()
}

fn new_manager() -> MemplugHostManager {
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    ok(unsafe { memplug_host_manager_load_plugin(m, plugin_path().as_ptr()) });
    m
}

fn find(m: MemplugHostManager, name: &CStr) -> MemplugHostMechanism {
    let mut mech = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_find_mechanism(m, name.as_ptr(), &mut mech) });
    mech
}

// ---- a loss declared by the runtime ---------------------------------------------

#[test]
fn a_declared_loss_is_told_settled_once_and_leaves_every_handle_inert() {
    unsafe {
        let m = new_manager();
        let mech = find(m, c"memplug-cpu/cpu");
        let mut pool = MemplugHostPool::default();
        ok(memplug_host_pool_create(m, c"gpu0".as_ptr(), 1 << 24, &mut pool));
        let mut holder = MemplugHostHolder::default();
        ok(memplug_host_holder_register(pool, c"kv".as_ptr(), 1, None, null_mut(), &mut holder));
        let mut holder_id = 0;
        ok(memplug_host_holder_id(holder, &mut holder_id));
        assert_ne!(holder_id, 0);
        let opts = MemplugHostBindingOptions {
            struct_size: MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0,
            alloc_class: MEMPLUG_HOST_CLASS_KV,
            holder,
            wait_ns: 0,
            ..Default::default()
        };
        let mut binding = MemplugHostBinding::default();
        ok(memplug_host_binding_create(m, mech, pool, &opts, &mut binding));

        let rec = Box::new(Recorder { manager: m, mechanism: mech, seen: Mutex::new(Vec::new()) });
        let sub = subscribe(&rec);
        assert_eq!(state(mech), MemplugHostLifeState::Active);
        assert_eq!(reason(mech), "", "no reason while active");
        assert_eq!(settlement_of(mech).unwrap_err(), MemplugHostStatus::NotReady);

        let made: Vec<_> = [1000, 5000, 64].into_iter().map(|n| allocate(binding, n)).collect();
        let charged: u64 = made.iter().map(|(_, size)| size).sum();
        assert_eq!(pool_stats(pool).used, charged);
        assert!(made.iter().all(|(a, _)| !is_lost(*a)));

        // The loss: told at once, on this thread, with one notice.
        let mut moved = false;
        ok(memplug_host_mechanism_declare_lost(
            mech,
            c"the runtime saw an illegal address".as_ptr(),
            &mut moved,
        ));
        assert!(moved);
        assert_eq!(state(mech), MemplugHostLifeState::Lost);
        assert!(reason(mech).contains("the runtime saw an illegal address"), "{}", reason(mech));
        {
            let seen = rec.seen.lock().unwrap();
            assert_eq!(seen.len(), 1, "{seen:?}");
            let lost = &seen[0];
            assert_eq!((lost.from, lost.to), (MemplugHostLifeState::Active, MemplugHostLifeState::Lost));
            assert_eq!(lost.subscription, sub);
            assert_eq!(lost.context, "memplug-cpu/cpu");
            assert!(lost.reason.as_deref().unwrap().contains("illegal address"), "{lost:?}");
            assert_eq!(lost.thread, std::thread::current().id());
            assert_eq!(
                lost.notices,
                [Notice {
                    pool: "gpu0".into(),
                    holder_id,
                    class: MEMPLUG_HOST_CLASS_KV,
                    objects: 3,
                    bytes: charged,
                    quarantined: 0
                }]
            );
            assert!(lost.settlement.is_none());
            // From inside the callback: what delivers events is refused,
            // reading the state is fine.
            assert_eq!(lost.poll, MemplugHostStatus::Reentrant);
            assert_eq!(lost.declare_lost, MemplugHostStatus::Reentrant);
            assert_eq!(lost.terminate, MemplugHostStatus::Reentrant);
            assert_eq!(lost.state, MemplugHostStatus::Ok);
        }
        // A second declaration moves nothing and tells nobody.
        ok(memplug_host_mechanism_declare_lost(mech, c"again".as_ptr(), &mut moved));
        assert!(!moved);
        assert_eq!(rec.seen.lock().unwrap().len(), 1);

        // Every object went with the device; no new work, no new binding.
        assert!(made.iter().all(|(a, _)| is_lost(*a)));
        let mut none = MemplugHostAllocation::default();
        assert_eq!(
            memplug_host_allocate(binding, 64, 64, &mut none, null_mut()),
            MemplugHostStatus::DeviceLost
        );
        assert!(last_error().contains("lost"), "{}", last_error());
        assert_eq!(none.id, 0, "out-params are written only on success");
        let mut b2 = MemplugHostBinding::default();
        assert_eq!(
            memplug_host_binding_create(m, mech, pool, null(), &mut b2),
            MemplugHostStatus::DeviceLost
        );
        assert_eq!(b2.id, 0);
        assert_eq!(pool_stats(pool).used, charged, "charged until the context terminates");
        assert_eq!(settlement_of(mech).unwrap_err(), MemplugHostStatus::NotReady);

        // The poll terminates it: one settlement, of exactly what was charged.
        ok(memplug_host_manager_poll(m, null_mut()));
        assert_eq!(state(mech), MemplugHostLifeState::Terminated);
        let s = {
            let seen = rec.seen.lock().unwrap();
            assert_eq!(seen.len(), 2, "{seen:?}");
            let t = &seen[1];
            assert_eq!((t.from, t.to), (MemplugHostLifeState::Lost, MemplugHostLifeState::Terminated));
            assert!(t.notices.is_empty());
            assert_eq!(t.poll, MemplugHostStatus::Reentrant);
            t.settlement.expect("the terminated event carries the settlement")
        };
        assert_eq!(s.struct_size, MEMPLUG_HOST_SETTLEMENT_SIZE_1_0);
        assert_eq!(s.after_loss, 1);
        assert_eq!(s.bytes, charged);
        assert_eq!(s.quarantined_bytes, 0);
        assert_eq!((s.leases, s.bindings, s.objects_forgotten), (3, 1, 3));
        assert_eq!(settlement_of(mech).unwrap(), s, "the same settlement, read afterwards");
        let st = pool_stats(pool);
        assert_eq!((st.used, st.leased), (0, 0), "every charge discharged");

        // Destroying the handles afterwards: no plugin call, no second refund.
        for (a, _) in &made {
            ok(memplug_host_allocation_free(*a));
        }
        let st = pool_stats(pool);
        assert_eq!((st.used, st.leased, st.quarantined), (0, 0, 0));
        let mut out =
            MemplugHostSettlement { struct_size: MEMPLUG_HOST_SETTLEMENT_SIZE_1_0, ..Default::default() };
        assert_eq!(memplug_host_manager_terminate(m, mech, 0, &mut out), MemplugHostStatus::InvalidState);
        assert!(last_error().contains("already terminated"), "{}", last_error());
        assert_eq!(out.bytes, 0, "out-params are written only on success");
        ok(memplug_host_manager_poll(m, null_mut()));
        assert_eq!(rec.seen.lock().unwrap().len(), 2, "each transition delivered once");

        ok(memplug_host_mechanism_unsubscribe(sub));
        assert_eq!(memplug_host_mechanism_unsubscribe(sub), MemplugHostStatus::StaleHandle);
        ok(memplug_host_binding_destroy(binding));
        ok(memplug_host_holder_unregister(holder));
        ok(memplug_host_manager_destroy(m));
        drop(rec);
    }
}

#[test]
fn regions_and_prefixes_of_a_lost_context_are_lost_and_free_without_a_second_refund() {
    unsafe {
        let m = new_manager();
        let mech = find(m, c"memplug-cpu/cpu");
        let mut pool = MemplugHostPool::default();
        ok(memplug_host_pool_create(m, c"gpu0".as_ptr(), 1 << 26, &mut pool));
        let mut binding = MemplugHostBinding::default();
        ok(memplug_host_binding_create(m, mech, pool, null(), &mut binding));
        let mut region = MemplugHostRegion::default();
        ok(memplug_host_region_reserve(binding, 1 << 24, &mut region));
        ok(memplug_host_region_grow(region, 1 << 20, None, null_mut()));
        let mut prefix = MemplugHostPrefix::default();
        ok(memplug_host_prefix_create(binding, 1 << 16, None, null_mut(), &mut prefix));
        let charged = pool_stats(pool).used;
        assert!(charged >= (1 << 20) + (1 << 16));
        let (mut r_lost, mut p_lost) = (true, true);
        ok(memplug_host_region_is_lost(region, &mut r_lost));
        ok(memplug_host_prefix_is_lost(prefix, &mut p_lost));
        assert!(!r_lost && !p_lost);

        ok(memplug_host_mechanism_declare_lost(mech, c"device reset".as_ptr(), null_mut()));
        ok(memplug_host_region_is_lost(region, &mut r_lost));
        ok(memplug_host_prefix_is_lost(prefix, &mut p_lost));
        assert!(r_lost && p_lost);
        assert_eq!(
            memplug_host_region_grow(region, 2 << 20, None, null_mut()),
            MemplugHostStatus::DeviceLost
        );

        let mut s =
            MemplugHostSettlement { struct_size: MEMPLUG_HOST_SETTLEMENT_SIZE_1_0, ..Default::default() };
        ok(memplug_host_manager_terminate(m, mech, 1_000_000_000, &mut s));
        assert_eq!(s.bytes, charged, "{s:?}");
        assert_eq!(pool_stats(pool).used, 0);
        ok(memplug_host_region_free(region));
        ok(memplug_host_prefix_release(prefix));
        let st = pool_stats(pool);
        assert_eq!((st.used, st.leased), (0, 0));
        ok(memplug_host_manager_destroy(m));
    }
}

// ---- retirement and replacement ----------------------------------------------------

#[test]
fn replacement_routes_new_bindings_to_the_new_mechanism_and_unloads_the_old_plugin() {
    unsafe {
        let m = new_manager();
        // A second copy of the CPU plugin's library, under another path, is
        // the same plugin name: refused, one plugin per name.
        let dir = memplug_test_support::test_tmp_dir("cpu-plugin-copy");
        let src = std::path::PathBuf::from(plugin_path().to_str().unwrap());
        let copy = dir.join(src.file_name().unwrap());
        std::fs::copy(&src, &copy).unwrap();
        let copy_c = std::ffi::CString::new(copy.to_str().unwrap()).unwrap();
        assert_eq!(memplug_host_manager_load_plugin(m, copy_c.as_ptr()), MemplugHostStatus::AlreadyExists);
        assert!(last_error().contains("memplug-cpu"), "{}", last_error());
        ok(memplug_host_manager_register_entry(m, Some(successor_entry), c"in-process successor".as_ptr()));

        let old = find(m, c"memplug-cpu/cpu");
        let new = find(m, c"memplug-cpu-successor/cpu-successor");
        let mut pool = MemplugHostPool::default();
        ok(memplug_host_pool_create(m, c"cpu0".as_ptr(), 1 << 24, &mut pool));
        let mut b_old = MemplugHostBinding::default();
        ok(memplug_host_binding_create(m, old, pool, null(), &mut b_old));
        let (kept, kept_size) = allocate(b_old, 4096);
        let rec = Box::new(Recorder { manager: m, mechanism: old, seen: Mutex::new(Vec::new()) });
        let _sub = subscribe(&rec);

        // Refusals first: they change nothing.
        assert_eq!(
            memplug_host_manager_replace(m, old, old, c"x".as_ptr(), false),
            MemplugHostStatus::InvalidArgument
        );
        assert_eq!(memplug_host_manager_replace(m, old, new, null(), false), MemplugHostStatus::NullArgument);
        let mut other = MemplugHostManager::default();
        ok(memplug_host_manager_create(&mut other));
        assert_eq!(
            memplug_host_manager_replace(other, old, new, c"x".as_ptr(), false),
            MemplugHostStatus::WrongManager
        );
        ok(memplug_host_manager_destroy(other));
        assert_eq!(state(old), MemplugHostLifeState::Active);

        ok(memplug_host_manager_replace(m, old, new, c"driver upgrade".as_ptr(), true));
        assert_eq!(state(old), MemplugHostLifeState::Retiring);
        assert_eq!(state(new), MemplugHostLifeState::Active);
        {
            let seen = rec.seen.lock().unwrap();
            assert_eq!(seen.len(), 1);
            assert_eq!(
                (seen[0].from, seen[0].to),
                (MemplugHostLifeState::Active, MemplugHostLifeState::Retiring)
            );
            assert!(seen[0].reason.as_deref().unwrap().contains("driver upgrade"), "{:?}", seen[0]);
        }
        assert_eq!(
            memplug_host_manager_replace(m, old, new, c"twice".as_ptr(), false),
            MemplugHostStatus::InvalidState
        );

        // The old binding makes nothing new; its object keeps working.
        let mut none = MemplugHostAllocation::default();
        assert_eq!(
            memplug_host_allocate(b_old, 64, 64, &mut none, null_mut()),
            MemplugHostStatus::InvalidState
        );
        assert!(!is_lost(kept), "a replaced context's objects are not lost");
        // A binding asked of the old mechanism is made on the new one.
        let mut b = MemplugHostBinding::default();
        ok(memplug_host_binding_create(m, old, pool, null(), &mut b));
        let mut info = std::mem::zeroed::<MemplugHostMechanismInfo>();
        info.struct_size = MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0;
        ok(memplug_host_binding_mechanism_info(b, &mut info));
        assert_eq!(mechanism_plugin_name(&info), "memplug-cpu-successor");
        ok(memplug_host_binding_mechanism_info(b_old, &mut info));
        assert_eq!(mechanism_plugin_name(&info), "memplug-cpu");
        let calls = SUCCESSOR_CALLS.load(SeqCst);
        let (fresh, fresh_size) = allocate(b, 4096);
        assert_eq!(SUCCESSOR_CALLS.load(SeqCst), calls + 1, "the new plugin made it");
        // Selection no longer chooses the old plugin: its other mechanisms
        // (the CPU plugin's node and huge-page ones) retired with it, since
        // the plugin is to be unloaded.
        let mut sel = MemplugHostMechanism::default();
        ok(memplug_host_manager_select(m, CPU0, 0, &mut sel));
        ok(memplug_host_mechanism_info(sel, &mut info));
        assert_eq!(mechanism_plugin_name(&info), "memplug-cpu-successor");
        ok(memplug_host_mechanism_release(sel));
        let mut n = 0usize;
        ok(memplug_host_manager_mechanism_count(m, &mut n));
        for i in 0..n {
            let mut each = MemplugHostMechanism::default();
            ok(memplug_host_manager_mechanism(m, i, &mut each));
            ok(memplug_host_mechanism_info(each, &mut info));
            if mechanism_plugin_name(&info) == "memplug-cpu" {
                assert_ne!(
                    state(each),
                    MemplugHostLifeState::Active,
                    "an old plugin's mechanism still serves"
                );
            }
            ok(memplug_host_mechanism_release(each));
        }

        // Terminating a retiring context with a live object: BUSY, nothing settled.
        let mut s =
            MemplugHostSettlement { struct_size: MEMPLUG_HOST_SETTLEMENT_SIZE_1_0, ..Default::default() };
        assert_eq!(memplug_host_manager_terminate(m, old, 20_000_000, &mut s), MemplugHostStatus::Busy);
        assert!(last_error().contains("live object"), "{}", last_error());
        assert_eq!(s.bindings, 0);
        ok(memplug_host_manager_poll(m, null_mut()));
        assert_eq!(state(old), MemplugHostLifeState::Retiring, "one object still alive");
        assert_eq!(pool_stats(pool).used, kept_size + fresh_size);

        // Its last object freed by its own plugin, refunded as usual; the
        // next poll terminates it and unloads its plugin.
        let successor_calls = SUCCESSOR_CALLS.load(SeqCst);
        ok(memplug_host_allocation_free(kept));
        assert_eq!(
            SUCCESSOR_CALLS.load(SeqCst),
            successor_calls,
            "the new plugin never frees the old one's memory"
        );
        assert_eq!(pool_stats(pool).used, fresh_size);
        ok(memplug_host_manager_poll(m, null_mut()));
        assert_eq!(state(old), MemplugHostLifeState::Terminated);
        let settled = settlement_of(old).unwrap();
        assert_eq!((settled.after_loss, settled.bytes, settled.objects_forgotten), (0, 0, 0));
        {
            let seen = rec.seen.lock().unwrap();
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[1].to, MemplugHostLifeState::Terminated);
            assert_eq!(seen[1].settlement, Some(settled));
        }
        let mut n = 0usize;
        ok(memplug_host_manager_mechanism_count(m, &mut n));
        assert_eq!(n, 1, "the old plugin was unloaded");
        // Its handles stay valid and inert.
        ok(memplug_host_mechanism_info(old, &mut info));
        assert_eq!(mechanism_plugin_name(&info), "memplug-cpu");

        // Retiring the new one too: the chain ends, bindings are refused.
        ok(memplug_host_mechanism_retire(new, c"maintenance".as_ptr()));
        assert_eq!(memplug_host_mechanism_retire(new, c"again".as_ptr()), MemplugHostStatus::InvalidState);
        let mut b3 = MemplugHostBinding::default();
        assert_eq!(
            memplug_host_binding_create(m, old, pool, null(), &mut b3),
            MemplugHostStatus::InvalidState
        );
        assert!(last_error().contains("no active successor"), "{}", last_error());
        assert_eq!(memplug_host_manager_select(m, CPU0, 0, &mut sel), MemplugHostStatus::NotFound);
        ok(memplug_host_allocation_free(fresh));
        let mut s =
            MemplugHostSettlement { struct_size: MEMPLUG_HOST_SETTLEMENT_SIZE_1_0, ..Default::default() };
        ok(memplug_host_manager_terminate(m, new, 1_000_000_000, &mut s));
        assert_eq!((s.after_loss, s.bytes), (0, 0));
        assert_eq!(pool_stats(pool).used, 0);
        assert!(SUCCESSOR_BLOCKS.lock().unwrap().is_empty());

        ok(memplug_host_binding_destroy(b));
        ok(memplug_host_binding_destroy(b_old));
        ok(memplug_host_manager_destroy(m));
        drop(rec);
    }
}

// ---- refusals ----------------------------------------------------------------------

#[test]
fn lifecycle_calls_refuse_bad_arguments_without_effect() {
    unsafe {
        let m = new_manager();
        let mech = find(m, c"memplug-cpu/cpu");
        let mut sub = MemplugHostSubscription::default();
        assert_eq!(
            memplug_host_mechanism_subscribe(mech, None, null_mut(), &mut sub),
            MemplugHostStatus::NullArgument
        );
        assert_eq!(
            memplug_host_mechanism_subscribe(mech, Some(record), null_mut(), null_mut()),
            MemplugHostStatus::NullArgument
        );
        assert_eq!(sub.id, 0);
        assert_eq!(memplug_host_mechanism_state(mech, null_mut()), MemplugHostStatus::NullArgument);
        assert_eq!(memplug_host_mechanism_retire(mech, null()), MemplugHostStatus::NullArgument);
        assert_eq!(
            memplug_host_mechanism_declare_lost(mech, null(), null_mut()),
            MemplugHostStatus::NullArgument
        );
        assert_eq!(state(mech), MemplugHostLifeState::Active);
        // An active context cannot be terminated.
        assert_eq!(memplug_host_manager_terminate(m, mech, 0, null_mut()), MemplugHostStatus::InvalidState);
        assert!(last_error().contains("active"), "{}", last_error());
        // A short settlement struct is refused before anything is done.
        ok(memplug_host_mechanism_declare_lost(mech, c"gone".as_ptr(), null_mut()));
        let mut short = MemplugHostSettlement { struct_size: 8, ..Default::default() };
        assert_eq!(
            memplug_host_manager_terminate(m, mech, 0, &mut short),
            MemplugHostStatus::InvalidArgument
        );
        assert_eq!(state(mech), MemplugHostLifeState::Lost, "not terminated by a refused call");
        // Wrong kinds and the zero handle.
        let pool_like = MemplugHostMechanism { id: mech.id & !(0xf << 60) | (3 << 60) };
        assert_eq!(memplug_host_mechanism_retire(pool_like, c"x".as_ptr()), MemplugHostStatus::InvalidHandle);
        ok(memplug_host_mechanism_unsubscribe(MemplugHostSubscription::default()));
        assert_eq!(
            memplug_host_mechanism_unsubscribe(MemplugHostSubscription { id: mech.id }),
            MemplugHostStatus::InvalidHandle
        );
        let mut lost = false;
        assert_eq!(
            memplug_host_allocation_is_lost(MemplugHostAllocation::default(), &mut lost),
            MemplugHostStatus::InvalidHandle
        );
        ok(memplug_host_mechanism_release(mech));
        assert_eq!(
            memplug_host_mechanism_state(mech, &mut MemplugHostLifeState::Active),
            MemplugHostStatus::StaleHandle
        );
        ok(memplug_host_manager_destroy(m));
    }
}

// ---- unsubscribing while a callback runs ---------------------------------------

struct Slow {
    entered: AtomicBool,
    left: AtomicBool,
    calls: AtomicU32,
    release: AtomicBool,
}

unsafe extern "C" fn slow(ud: *mut c_void, _e: *const MemplugHostLifecycleEvent) {
    let s = &*(ud as *const Slow);
    s.calls.fetch_add(1, SeqCst);
    s.entered.store(true, SeqCst);
    while !s.release.load(SeqCst) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(20));
    s.left.store(true, SeqCst);
}

/// Ends its own subscription from inside the callback.
unsafe extern "C" fn unsubscribe_self(ud: *mut c_void, e: *const MemplugHostLifecycleEvent) {
    let status = &*(ud as *const AtomicU32);
    status.store(memplug_host_mechanism_unsubscribe((*e).subscription) as u32, SeqCst);
}

#[test]
fn unsubscribe_waits_for_a_callback_on_another_thread_and_a_callback_may_end_its_own() {
    unsafe {
        let m = new_manager();
        let mech = find(m, c"memplug-cpu/cpu");
        let s = Box::new(Slow {
            entered: AtomicBool::new(false),
            left: AtomicBool::new(false),
            calls: AtomicU32::new(0),
            release: AtomicBool::new(false),
        });
        let mut sub = MemplugHostSubscription::default();
        ok(memplug_host_mechanism_subscribe(mech, Some(slow), &*s as *const Slow as *mut c_void, &mut sub));
        let self_status = Box::new(AtomicU32::new(u32::MAX));
        let mut sub2 = MemplugHostSubscription::default();
        ok(memplug_host_mechanism_subscribe(
            mech,
            Some(unsubscribe_self),
            &*self_status as *const AtomicU32 as *mut c_void,
            &mut sub2,
        ));

        let t = std::thread::spawn(move || memplug_host_mechanism_retire(mech, c"shutting down".as_ptr()));
        while !s.entered.load(SeqCst) {
            std::thread::yield_now();
        }
        let waiter = {
            let sub = sub;
            std::thread::spawn(move || memplug_host_mechanism_unsubscribe(sub))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "unsubscribe waits for the running callback");
        s.release.store(true, SeqCst);
        assert_eq!(waiter.join().unwrap(), MemplugHostStatus::Ok);
        assert!(s.left.load(SeqCst), "unsubscribe returned only after the callback did");
        assert_eq!(t.join().unwrap(), MemplugHostStatus::Ok);
        assert_eq!(
            self_status.load(SeqCst),
            MemplugHostStatus::Ok as u32,
            "a callback ended its own subscription"
        );
        assert_eq!(memplug_host_mechanism_unsubscribe(sub2), MemplugHostStatus::StaleHandle);

        // Neither is called again.
        ok(memplug_host_manager_terminate(m, mech, 1_000_000_000, null_mut()));
        assert_eq!(s.calls.load(SeqCst), 1);
        ok(memplug_host_manager_destroy(m));
    }
}

#[test]
fn destroying_the_manager_ends_its_subscriptions() {
    unsafe {
        let m = new_manager();
        let mech = find(m, c"memplug-cpu/cpu");
        let calls = Box::new(AtomicU32::new(0));
        unsafe extern "C" fn count(ud: *mut c_void, _e: *const MemplugHostLifecycleEvent) {
            (*(ud as *const AtomicU32)).fetch_add(1, SeqCst);
        }
        let mut sub = MemplugHostSubscription::default();
        ok(memplug_host_mechanism_subscribe(
            mech,
            Some(count),
            &*calls as *const AtomicU32 as *mut c_void,
            &mut sub,
        ));
        ok(memplug_host_manager_destroy(m));
        assert_eq!(memplug_host_mechanism_unsubscribe(sub), MemplugHostStatus::StaleHandle);
        assert_eq!(calls.load(SeqCst), 0);
    }
}

// ---- a free racing is_lost ---------------------------------------------------------

unsafe extern "C" fn never_done(_ud: *mut c_void) -> bool {
    false
}

#[test]
fn a_free_after_fences_racing_is_lost_still_waits_for_the_fence() {
    unsafe {
        let m = new_manager();
        let mech = find(m, c"memplug-cpu/cpu");
        let mut pool = MemplugHostPool::default();
        ok(memplug_host_pool_create(m, c"cpu0".as_ptr(), 1 << 26, &mut pool));
        let mut binding = MemplugHostBinding::default();
        ok(memplug_host_binding_create(m, mech, pool, null(), &mut binding));
        let mut fence = MemplugHostFence::default();
        ok(memplug_host_fence_from_callbacks(
            m,
            c"never".as_ptr(),
            Some(never_done),
            None,
            None,
            null_mut(),
            &mut fence,
        ));

        let current = std::sync::Arc::new(AtomicU64::new(0));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let reader = {
            let (current, stop) = (current.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(SeqCst) {
                    let mut lost = false;
                    let a = MemplugHostAllocation { id: current.load(SeqCst) };
                    if a.id != 0 && memplug_host_allocation_is_lost(a, &mut lost) == MemplugHostStatus::Ok {
                        assert!(!lost);
                        reads += 1;
                    }
                }
                reads
            })
        };
        let mut expected = 0;
        for _ in 0..2000 {
            let (a, size) = allocate(binding, 4096);
            expected += size;
            current.store(a.id, SeqCst);
            ok(memplug_host_allocation_free_after(a, &fence, 1));
            assert_eq!(memplug_host_allocation_free_after(a, &fence, 1), MemplugHostStatus::StaleHandle);
        }
        stop.store(true, SeqCst);
        let _reads = reader.join().unwrap();
        // Not one of them was freed early: all still charged, all queued.
        assert_eq!(pool_stats(pool).used, expected);
        let mut report =
            MemplugHostPollReport { struct_size: MEMPLUG_HOST_POLL_REPORT_SIZE_1_0, ..Default::default() };
        ok(memplug_host_manager_poll(m, &mut report));
        assert_eq!((report.retired, report.pending), (0, 2000));
        // The queue keeps them (the fence never completes): the manager's
        // drain leaves them allocated rather than free on a guess.
        ok(memplug_host_fence_release(fence));
        ok(memplug_host_binding_destroy(binding));
        ok(memplug_host_manager_destroy(m));
    }
}
