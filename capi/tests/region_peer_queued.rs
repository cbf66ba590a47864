//! What plugin ABI 1.2 adds to regions and streams, through the C API
//! (1.1): peer access to a range of a region
//! (`memplug_host_region_set_peer_access`), a grow queued on a stream
//! (`memplug_host_region_grow_on`, returning a fence) and typed stream
//! adoption (`memplug_host_stream_adopt_typed`).
//!
//! The success paths run against a linked-in plugin (registered with
//! `memplug_host_manager_register_entry`) that has peer access, queued
//! binding and typed adoption, records what it is asked, and completes a
//! queued commit's fence only when the test says so. The refusals of a
//! mechanism without them run against the reference CPU plugin. Every
//! refusal is checked to have changed nothing: the region's figures, the
//! pool's charge and what reached the plugin.

mod common;

use common::{last_error, ok, plugin_path};
use memplug_host_capi::*;
use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::collections::HashSet;
use std::ffi::CStr;
use std::mem::size_of;
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

const G: u64 = 4096;
const DEV: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 3 };
/// The peer the linked-in plugin can give read access to (and no more).
const PEER: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 };
const RW: u32 = MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;

// ---- the linked-in plugin ----------------------------------------------

/// A bookkeeping-only device: addresses from a counter; a queued commit's
/// fence is pending until [`complete_all`]; everything else completes at
/// once. It records every call that reaches it. `Q`: whether it queues
/// commits and adopts typed streams (the plugin's "q" mechanism, which
/// also has peer access) or not ("plain": neither, nor peer access).
#[derive(Default)]
struct Queued<const Q: bool> {
    next: AtomicU64,
    log: Mutex<Vec<String>>,
    pending: Mutex<HashSet<u64>>,
    refuse_commit: AtomicBool,
}

impl<const Q: bool> Queued<Q> {
    fn note(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }
    fn id(&self) -> u64 {
        self.next.fetch_add(1, SeqCst) + 1
    }
    fn state(&self, fence: u64) -> FenceState {
        if self.pending.lock().unwrap().contains(&fence) {
            FenceState::Pending
        } else {
            FenceState::Complete
        }
    }
}

impl<const Q: bool> Allocator for Queued<Q> {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: G }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        let h = self.id();
        Ok(Block { addr: h << 32, size: r.size, handle: h })
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

impl<const Q: bool> VirtualBacking for Queued<Q> {
    fn reserve(&self, r: &Request) -> PluginResult<Block> {
        let h = self.id();
        self.note(format!("reserve {h}"));
        Ok(Block { addr: h << 32, size: r.size.div_ceil(G) * G, handle: h })
    }
    fn commit(&self, r: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        self.note(format!("commit {} +{offset:#x} {len:#x}", r.handle));
        Ok(())
    }
    fn decommit(&self, r: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        self.note(format!("decommit {} +{offset:#x} {len:#x}", r.handle));
        Ok(())
    }
    fn committed_bytes(&self, _: &ObjectRef) -> PluginResult<u64> {
        Ok(0)
    }
    fn release(&self, r: &ObjectRef) -> PluginResult<()> {
        self.note(format!("release {}", r.handle));
        Ok(())
    }
    const CAN_QUEUE: bool = Q;
    fn commit_on(&self, r: &ObjectRef, offset: u64, len: u64, stream: u64) -> PluginResult<u64> {
        if self.refuse_commit.swap(false, SeqCst) {
            return Err(PluginError::out_of_memory("the test refuses this commit_on"));
        }
        let f = self.id();
        self.pending.lock().unwrap().insert(f);
        self.note(format!("commit_on {} +{offset:#x} {len:#x} on {stream} -> {f}", r.handle));
        Ok(f)
    }
    fn decommit_on(&self, r: &ObjectRef, offset: u64, len: u64, stream: u64) -> PluginResult<u64> {
        self.note(format!("decommit_on {} +{offset:#x} {len:#x} on {stream}", r.handle));
        Ok(self.id())
    }
}

impl<const Q: bool> StreamSync for Queued<Q> {
    fn stream_create(&self) -> PluginResult<u64> {
        let s = self.id();
        self.note(format!("created stream {s}"));
        Ok(s)
    }
    fn stream_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn enqueue_host_fn(&self, _: u64, f: HostFn) -> PluginResult<()> {
        f.call();
        Ok(())
    }
    fn fence_record(&self, _: u64) -> PluginResult<u64> {
        Ok(self.id())
    }
    fn fence_query(&self, f: u64) -> PluginResult<FenceState> {
        Ok(self.state(f))
    }
    fn fence_wait(&self, f: u64, _: Duration) -> PluginResult<FenceState> {
        Ok(self.state(f))
    }
    fn fence_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
    const CAN_WAIT_FENCE: bool = true;
    fn stream_wait_fence(&self, stream: u64, fence: u64) -> PluginResult<()> {
        self.note(format!("stream {stream} waits for fence {fence}"));
        Ok(())
    }
    const CAN_ADOPT_TYPED: bool = Q;
    fn stream_adopt_typed(&self, kind: u32, native: *mut core::ffi::c_void) -> PluginResult<u64> {
        if kind != MEMPLUG_DEVICE_CUDA {
            return Err(PluginError::unsupported(format!("kind {kind} is not adopted")));
        }
        let s = self.id();
        self.note(format!("adopt kind {kind} native {:#x} -> stream {s}", native as usize));
        Ok(s)
    }
}

impl<const Q: bool> PeerAccess for Queued<Q> {
    fn can_access_peer(&self, peer: MemplugDevice) -> PluginResult<u32> {
        Ok(if peer == PEER { MEMPLUG_ACCESS_READ } else { 0 })
    }
    fn set_peer_access(
        &self,
        r: &ObjectRef,
        off: u64,
        len: u64,
        peer: MemplugDevice,
        access: u32,
    ) -> PluginResult<()> {
        if access & !self.can_access_peer(peer)? != 0 {
            return Err(PluginError::unsupported(format!(
                "peer {}:{} gets at most read",
                peer.kind, peer.ordinal
            )));
        }
        self.note(format!(
            "peer {}:{} gets {access:#x} on {} +{off:#x} {len:#x}",
            peer.kind, peer.ordinal, r.handle
        ));
        Ok(())
    }
}

static PLUGIN: Mutex<Option<MechanismState<Queued<true>>>> = Mutex::new(None);
static PLAIN: Mutex<Option<MechanismState<Queued<false>>>> = Mutex::new(None);

fn queued_plugin() -> ExportedPlugin {
    let q =
        MechanismBuilder::new("q", 5, DEV, Queued::<true>::default()).virtual_backing().sync().peer_access();
    *PLUGIN.lock().unwrap() = Some(q.state());
    let plain = MechanismBuilder::new("plain", 6, DEV, Queued::<false>::default()).virtual_backing().sync();
    *PLAIN.lock().unwrap() = Some(plain.state());
    PluginBuilder::new("capi-queued", "1")
        .mechanism(q.build())
        .mechanism(plain.build())
        .live_objects(|| 0)
        .build()
}
memplug_sdk::declare_entry!(queued_entry, queued_plugin);

fn with_plugin<R>(f: impl FnOnce(&Queued<true>) -> R) -> R {
    f(PLUGIN.lock().unwrap().as_ref().expect("loaded"))
}

fn log() -> Vec<String> {
    with_plugin(|q| q.log.lock().unwrap().clone())
}

/// Completes every queued commit's fence.
fn complete_all() {
    with_plugin(|q| q.pending.lock().unwrap().clear());
}

// ---- C API helpers -----------------------------------------------------

fn manager_with(entry: bool) -> (MemplugHostManager, MemplugHostMechanism) {
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    let name: &CStr = if entry {
        ok(unsafe { memplug_host_manager_register_entry(m, Some(queued_entry), c"capi queued".as_ptr()) });
        c"capi-queued/q"
    } else {
        ok(unsafe { memplug_host_manager_load_plugin(m, plugin_path().as_ptr()) });
        c"memplug-cpu/cpu"
    };
    let mut mech = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_find_mechanism(m, name.as_ptr(), &mut mech) });
    (m, mech)
}

fn capabilities(mech: MemplugHostMechanism) -> u32 {
    // SAFETY: integers, a device and char arrays: valid when zeroed.
    let mut i = unsafe { std::mem::zeroed::<MemplugHostMechanismInfo>() };
    i.struct_size = size_of::<MemplugHostMechanismInfo>() as u32;
    ok(unsafe { memplug_host_mechanism_info(mech, &mut i) });
    i.capabilities
}

fn pool_and_binding(
    m: MemplugHostManager,
    mech: MemplugHostMechanism,
    name: &CStr,
    capacity: u64,
) -> (MemplugHostPool, MemplugHostBinding) {
    let mut p = MemplugHostPool::default();
    ok(unsafe { memplug_host_pool_create(m, name.as_ptr(), capacity, &mut p) });
    let mut b = MemplugHostBinding::default();
    ok(unsafe { memplug_host_binding_create(m, mech, p, null(), &mut b) });
    (p, b)
}

fn used(p: MemplugHostPool) -> u64 {
    // SAFETY: integers: valid when zeroed.
    let mut s = unsafe { std::mem::zeroed::<MemplugHostPoolStats>() };
    s.struct_size = size_of::<MemplugHostPoolStats>() as u32;
    ok(unsafe { memplug_host_pool_stats(p, &mut s) });
    s.used
}

/// A region's (len, committed).
fn figures(r: MemplugHostRegion) -> (u64, u64) {
    let mut i = MemplugHostRegionInfo {
        struct_size: size_of::<MemplugHostRegionInfo>() as u32,
        ..Default::default()
    };
    ok(unsafe { memplug_host_region_info(r, &mut i) });
    (i.len, i.committed)
}

fn reserve(b: MemplugHostBinding, bytes: u64) -> MemplugHostRegion {
    let mut r = MemplugHostRegion::default();
    ok(unsafe { memplug_host_region_reserve(b, bytes, &mut r) });
    r
}

fn stream(mech: MemplugHostMechanism) -> MemplugHostStream {
    let mut s = MemplugHostStream::default();
    ok(unsafe { memplug_host_stream_create(mech, &mut s) });
    s
}

fn done(f: MemplugHostFence) -> bool {
    let mut d = false;
    ok(unsafe { memplug_host_fence_query(f, &mut d) });
    d
}

fn grow_on(
    r: MemplugHostRegion,
    len: u64,
    s: MemplugHostStream,
) -> Result<MemplugHostFence, MemplugHostStatus> {
    let mut f = MemplugHostFence { id: 0xdead };
    match unsafe { memplug_host_region_grow_on(r, len, s, &mut f) } {
        MemplugHostStatus::Ok => Ok(f),
        e => {
            assert_eq!(f.id, 0xdead, "out_fence is written only on success");
            Err(e)
        }
    }
}

/// The number right after `prefix` in the last line of the plugin's log
/// that starts with it (the line must be there).
fn last_id(prefix: &str) -> u64 {
    let l = log();
    let line = l.iter().rev().find(|s| s.starts_with(prefix)).expect("logged");
    line[prefix.len()..].split_whitespace().next().unwrap().parse().unwrap()
}

// ---- against the linked-in plugin: the success paths ----------------------

/// The linked-in plugin's "plain" mechanism (virtual backing and streams;
/// no queued binding, no typed adoption, no peer access) refuses each, and
/// nothing is charged, changed or sent to the plugin.
fn without_the_capabilities_nothing_is_charged_or_asked(m: MemplugHostManager) {
    let mut mech = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_find_mechanism(m, c"capi-queued/plain".as_ptr(), &mut mech) });
    let caps = capabilities(mech);
    assert_eq!(caps & (MEMPLUG_CAP_PEER_ACCESS | MEMPLUG_CAP_QUEUED_BINDING), 0, "{caps:#x}");
    let vb_sync = MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SYNC;
    assert_eq!(caps & vb_sync, vb_sync, "{caps:#x}");
    let plain_log = || PLAIN.lock().unwrap().as_ref().unwrap().log.lock().unwrap().clone();
    let (pool, b) = pool_and_binding(m, mech, c"plain", 8 * G);
    let r = reserve(b, 8 * G);
    ok(unsafe { memplug_host_region_grow(r, 2 * G, None, null_mut()) });
    let s = stream(mech);
    let before = (figures(r), used(pool), plain_log());
    assert_eq!((before.0, before.1), ((2 * G, 2 * G), 2 * G));

    assert_eq!(grow_on(r, 4 * G, s), Err(MemplugHostStatus::Unsupported));
    let e = last_error();
    assert!(
        e.starts_with("memplug_host_region_grow_on: ")
            && e.contains("capi-queued/plain has no queued binding (MEMPLUG_CAP_QUEUED_BINDING"),
        "{e}"
    );
    assert_eq!(
        memplug_host_region_set_peer_access(r, 0, G, PEER, MEMPLUG_ACCESS_READ),
        MemplugHostStatus::Unsupported
    );
    assert!(last_error().contains("no peer access (MEMPLUG_CAP_PEER_ACCESS"), "{}", last_error());
    let mut a = MemplugHostStream { id: 0xdead };
    assert_eq!(
        unsafe { memplug_host_stream_adopt_typed(mech, MEMPLUG_DEVICE_CUDA, 0x1234 as *mut _, &mut a) },
        MemplugHostStatus::Unsupported
    );
    assert!(last_error().contains("does not publish stream_adopt_typed"), "{}", last_error());
    assert_eq!(a.id, 0xdead, "written only on success");
    assert_eq!((figures(r), used(pool), plain_log()), before, "nothing charged, committed or asked");

    ok(memplug_host_stream_destroy(s));
    ok(memplug_host_region_free(r));
    assert_eq!(used(pool), 0);
    ok(memplug_host_binding_destroy(b));
    ok(memplug_host_pool_release(pool));
    ok(memplug_host_mechanism_release(mech));
}

#[test]
fn peer_access_queued_grow_and_typed_adoption_reach_a_plugin_that_has_them() {
    let (m, mech) = manager_with(true);
    without_the_capabilities_nothing_is_charged_or_asked(m);
    let caps = capabilities(mech);
    assert_eq!(
        caps & (MEMPLUG_CAP_PEER_ACCESS | MEMPLUG_CAP_QUEUED_BINDING),
        MEMPLUG_CAP_PEER_ACCESS | MEMPLUG_CAP_QUEUED_BINDING,
        "{caps:#x}"
    );
    let (pool, b) = pool_and_binding(m, mech, c"queued", 8 * G);
    let r = reserve(b, 16 * G);
    let res = last_id("reserve ");
    let s = stream(mech);
    let sid = last_id("created stream ");
    assert_eq!((figures(r), used(pool)), ((0, 0), 0));

    // A queued grow: charged at once, the commit enqueued on the stream,
    // the fence pending until the plugin completes it.
    let f = grow_on(r, 3 * G - 100, s).unwrap();
    assert_eq!((figures(r), used(pool)), ((3 * G, 3 * G), 3 * G), "rounded to the granularity, charged");
    let fid = last_id(&format!("commit_on {res} +0x0 0x3000 on {sid} -> "));
    assert!(!done(f), "the commit's fence is the plugin's, still pending");
    let mut complete = true;
    ok(unsafe { memplug_host_fence_wait(f, 1_000_000, &mut complete) });
    assert!(!complete);

    // Another stream can be ordered behind it: the plugin gets its fence.
    let s2 = stream(mech);
    let sid2 = last_id("created stream ");
    ok(memplug_host_stream_wait_fence(s2, f));
    assert_eq!(log().last().unwrap(), &format!("stream {sid2} waits for fence {fid}"));

    // Peer access to the range is refused while its commit is in flight.
    let before = log();
    assert_eq!(
        memplug_host_region_set_peer_access(r, 0, G, PEER, MEMPLUG_ACCESS_READ),
        MemplugHostStatus::Busy
    );
    assert!(last_error().contains("was committed on a stream and its fence"), "{}", last_error());
    assert_eq!(log(), before, "nothing reached the plugin");

    complete_all();
    assert!(done(f));
    ok(memplug_host_region_set_peer_access(r, 0, 3 * G, PEER, MEMPLUG_ACCESS_READ));
    ok(memplug_host_region_set_peer_access(r, G, G, PEER, 0));
    assert_eq!(
        log()[before.len()..],
        [
            format!("peer 2:0 gets 0x1 on {res} +0x0 0x3000"),
            format!("peer 2:0 gets 0x0 on {res} +0x1000 0x1000")
        ]
    );

    // Peer access refusals: nothing reaches the plugin (the last one is
    // the plugin's own), nothing changes.
    let before = log();
    for (offset, len, access, want, says) in [
        (
            0,
            4 * G,
            MEMPLUG_ACCESS_READ,
            MemplugHostStatus::OutOfRange,
            "past the region's 0x3000 usable bytes",
        ),
        (G, u64::MAX, MEMPLUG_ACCESS_READ, MemplugHostStatus::OutOfRange, "overflowing"),
        (0, 0, MEMPLUG_ACCESS_READ, MemplugHostStatus::OutOfRange, "empty"),
        (1, G, MEMPLUG_ACCESS_READ, MemplugHostStatus::OutOfRange, "not aligned to the granularity"),
        (0, G, MEMPLUG_ACCESS_WRITE, MemplugHostStatus::InvalidArgument, "access 0x2 is not 0"),
        (0, G, 4, MemplugHostStatus::InvalidArgument, "access 0x4 is not 0"),
        (0, G, RW, MemplugHostStatus::Unsupported, "gets at most read"),
    ] {
        assert_eq!(
            memplug_host_region_set_peer_access(r, offset, len, PEER, access),
            want,
            "{offset} {len} {access}"
        );
        let e = last_error();
        assert!(e.starts_with("memplug_host_region_set_peer_access: ") && e.contains(says), "{says}: {e}");
    }
    assert_eq!(log(), before);
    assert_eq!((figures(r), used(pool)), ((3 * G, 3 * G), 3 * G));

    // The plugin refuses the commit: the charge goes back, the region is
    // as it was.
    with_plugin(|q| q.refuse_commit.store(true, SeqCst));
    assert_eq!(grow_on(r, 5 * G, s), Err(MemplugHostStatus::OutOfMemory));
    assert!(last_error().contains("the test refuses this commit_on"), "{}", last_error());
    assert_eq!((figures(r), used(pool)), ((3 * G, 3 * G), 3 * G), "refunded, unchanged");

    // Host refusals: beyond the reservation, over the pool's capacity, a
    // NULL out-param, the zero stream, another manager's stream.
    let before = log();
    assert_eq!(grow_on(r, 17 * G, s), Err(MemplugHostStatus::InvalidArgument));
    assert_eq!(grow_on(r, 12 * G, s), Err(MemplugHostStatus::OutOfBudget));
    assert_eq!(
        unsafe { memplug_host_region_grow_on(r, 5 * G, s, null_mut()) },
        MemplugHostStatus::NullArgument
    );
    assert_eq!(grow_on(r, 5 * G, MemplugHostStream::default()), Err(MemplugHostStatus::InvalidHandle));
    let (m2, mech2) = manager_with(false);
    let other = stream(mech2);
    assert_eq!(grow_on(r, 5 * G, other), Err(MemplugHostStatus::WrongManager));
    ok(memplug_host_stream_destroy(other));
    ok(memplug_host_manager_destroy(m2));
    assert_eq!(log(), before, "nothing reached the plugin");
    assert_eq!((figures(r), used(pool)), ((3 * G, 3 * G), 3 * G));

    // At or below the length: no commit, a fence recorded on the stream.
    let g = grow_on(r, 2 * G, s).unwrap();
    assert!(done(g));
    assert_eq!(log(), before, "no commit_on");
    assert_eq!((figures(r), used(pool)), ((3 * G, 3 * G), 3 * G));

    // Typed adoption: the kind and the native pointer reach the plugin;
    // a queued grow on the adopted stream goes to its stream.
    let mut a = MemplugHostStream::default();
    ok(unsafe { memplug_host_stream_adopt_typed(mech, MEMPLUG_DEVICE_CUDA, 0x1234 as *mut _, &mut a) });
    let aid = last_id("adopt kind 2 native 0x1234 -> stream ");
    let mut refused = MemplugHostStream { id: 0xdead };
    assert_eq!(
        unsafe {
            memplug_host_stream_adopt_typed(mech, MEMPLUG_DEVICE_VULKAN, 0x1234 as *mut _, &mut refused)
        },
        MemplugHostStatus::Unsupported
    );
    assert!(last_error().contains("kind 7 is not adopted"), "{}", last_error());
    assert_eq!(refused.id, 0xdead, "written only on success");
    assert_eq!(
        unsafe { memplug_host_stream_adopt_typed(mech, MEMPLUG_DEVICE_CUDA, null_mut(), null_mut()) },
        MemplugHostStatus::NullArgument
    );
    let h = grow_on(r, 5 * G, a).unwrap();
    last_id(&format!("commit_on {res} +0x3000 0x2000 on {aid} -> "));
    assert_eq!((figures(r), used(pool)), ((5 * G, 5 * G), 5 * G));

    // The region's free waits for the pending commit: still charged until
    // the fence completes and the queue runs.
    ok(memplug_host_region_free(r));
    ok(unsafe { memplug_host_manager_poll(m, null_mut()) });
    assert_eq!(used(pool), 5 * G, "the free waits for the queued commit's fence");
    assert!(!log().iter().any(|l| l == &format!("release {res}")));
    complete_all();
    ok(unsafe { memplug_host_manager_poll(m, null_mut()) });
    assert_eq!(used(pool), 0, "refunded once the commit completed");
    assert!(log().iter().any(|l| l == &format!("release {res}")));

    // A first grow refused by the plugin leaves a fresh region uncharged.
    let r2 = reserve(b, 4 * G);
    with_plugin(|q| q.refuse_commit.store(true, SeqCst));
    assert_eq!(grow_on(r2, G, s), Err(MemplugHostStatus::OutOfMemory));
    assert_eq!((figures(r2), used(pool)), ((0, 0), 0));
    let k = grow_on(r2, G, s).unwrap();
    assert_eq!((figures(r2), used(pool)), ((G, G), G));
    complete_all();
    ok(memplug_host_region_free(r2));
    ok(unsafe { memplug_host_manager_poll(m, null_mut()) });
    assert_eq!(used(pool), 0);

    for fence in [f, g, h, k] {
        ok(memplug_host_fence_release(fence));
    }
    for st in [s, s2, a] {
        ok(memplug_host_stream_destroy(st));
    }
    ok(memplug_host_binding_destroy(b));
    ok(memplug_host_pool_release(pool));
    ok(memplug_host_manager_destroy(m));
}

// ---- against the CPU plugin: the refusals --------------------------------

#[test]
fn the_cpu_plugin_refuses_peer_access_and_typed_adoption_and_queues_a_grow_only_if_it_can() {
    let (m, mech) = manager_with(false);
    let caps = capabilities(mech);
    assert_eq!(caps & MEMPLUG_CAP_PEER_ACCESS, 0, "{caps:#x}");
    let (pool, b) = pool_and_binding(m, mech, c"cpu", 64 << 20);
    let r = reserve(b, 1 << 20);
    ok(unsafe { memplug_host_region_grow(r, 64 << 10, None, null_mut()) });
    let before = (figures(r), used(pool));
    assert_eq!(before.0 .0, before.1);
    assert!(before.1 >= 64 << 10);

    let cpu1 = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 1 };
    assert_eq!(
        memplug_host_region_set_peer_access(r, 0, 4096, cpu1, MEMPLUG_ACCESS_READ),
        MemplugHostStatus::Unsupported
    );
    let e = last_error();
    assert!(
        e.starts_with("memplug_host_region_set_peer_access: ")
            && e.contains("no peer access (MEMPLUG_CAP_PEER_ACCESS"),
        "{e}"
    );
    assert_eq!(memplug_host_region_set_peer_access(r, 0, 4096, cpu1, 8), MemplugHostStatus::InvalidArgument);
    assert_eq!((figures(r), used(pool)), before);

    let s = stream(mech);
    if caps & MEMPLUG_CAP_QUEUED_BINDING == 0 {
        assert_eq!(grow_on(r, 1 << 20, s), Err(MemplugHostStatus::Unsupported));
        let e = last_error();
        assert!(
            e.starts_with("memplug_host_region_grow_on: ")
                && e.contains("no queued binding (MEMPLUG_CAP_QUEUED_BINDING"),
            "{e}"
        );
        assert_eq!((figures(r), used(pool)), before, "nothing charged or committed");
    } else {
        // A CPU plugin that queues its commits: the grow is charged at
        // once and its fence completes.
        let f = grow_on(r, 1 << 20, s).unwrap();
        assert_eq!((figures(r), used(pool)), ((1 << 20, 1 << 20), 1 << 20));
        let mut complete = false;
        ok(unsafe { memplug_host_fence_wait(f, 10_000_000_000, &mut complete) });
        assert!(complete);
        ok(memplug_host_fence_release(f));
    }

    let mut a = MemplugHostStream { id: 0xdead };
    assert_eq!(
        unsafe { memplug_host_stream_adopt_typed(mech, MEMPLUG_DEVICE_CUDA, 0x1234 as *mut _, &mut a) },
        MemplugHostStatus::Unsupported
    );
    assert!(last_error().contains("does not publish stream_adopt_typed"), "{}", last_error());
    assert_eq!(a.id, 0xdead);

    // Stale handles are refused as such.
    ok(memplug_host_region_free(r));
    ok(unsafe { memplug_host_manager_poll(m, null_mut()) });
    assert_eq!(memplug_host_region_set_peer_access(r, 0, 4096, cpu1, 0), MemplugHostStatus::StaleHandle);
    assert_eq!(grow_on(r, 4096, s), Err(MemplugHostStatus::StaleHandle));
    assert_eq!(used(pool), 0);
    ok(memplug_host_stream_destroy(s));
    ok(memplug_host_binding_destroy(b));
    ok(memplug_host_pool_release(pool));
    ok(memplug_host_manager_destroy(m));
}
