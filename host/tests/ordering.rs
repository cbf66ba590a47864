//! ABI 1.2's device ordering and peer access, end to end (issue 12 items 4
//! and 5): queue-ordered binding (`commit_on`, `decommit_on`, `map_on`,
//! `unmap_on` return fences the host counts), `stream_wait_fence`,
//! `stream_adopt_typed`, and peer access — reaching a 1.2 plugin with the
//! arguments the host was given, refused before the plugin when a range or
//! handle is wrong, and absent (`Unsupported`) for a host or plugin of 1.1.

use memplug_host::{Access, LoadOptions, ObjectKind, Plugin, Status};
use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

const CPU2: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 2 };
const PEER: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 };
/// A peer the plugin answers write-without-read for (the SDK masks bits
/// no minor defines, so this is the undefined answer an SDK plugin can
/// give).
const WRITE_ONLY: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 8 };
const G: u64 = 4096;

/// A bookkeeping-only device: addresses from a counter, every queued
/// operation complete at once; it records what it was asked.
#[derive(Default)]
struct Orderly {
    next: AtomicU64,
    log: Mutex<Vec<String>>,
}

impl Orderly {
    fn note(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }
    fn id(&self) -> u64 {
        self.next.fetch_add(1, SeqCst) + 1
    }
}

impl Allocator for Orderly {
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

impl VirtualBacking for Orderly {
    fn reserve(&self, r: &Request) -> PluginResult<Block> {
        let h = self.id();
        Ok(Block { addr: h << 32, size: r.size.div_ceil(G) * G, handle: h })
    }
    fn commit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn decommit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn committed_bytes(&self, _: &ObjectRef) -> PluginResult<u64> {
        Ok(0)
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
    const CAN_QUEUE: bool = true;
    fn commit_on(&self, r: &ObjectRef, offset: u64, len: u64, stream: u64) -> PluginResult<u64> {
        self.note(format!("commit_on {} +{offset:#x} {len:#x} on {stream}", r.handle));
        Ok(self.id())
    }
    fn decommit_on(&self, r: &ObjectRef, offset: u64, len: u64, stream: u64) -> PluginResult<u64> {
        self.note(format!("decommit_on {} +{offset:#x} {len:#x} on {stream}", r.handle));
        Ok(self.id())
    }
}

impl SharedMapping for Orderly {
    fn create(&self, r: &Request) -> PluginResult<Block> {
        Ok(Block { addr: 0, size: r.size.div_ceil(G) * G, handle: self.id() })
    }
    fn map(&self, _: &ObjectRef, _: u64, _: &ObjectRef, _: u64, _: u64, _: Access) -> PluginResult<()> {
        Ok(())
    }
    fn unmap(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn retain(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
    const CAN_QUEUE_MAPS: bool = true;
    fn map_on(
        &self,
        o: &ObjectRef,
        oo: u64,
        r: &ObjectRef,
        off: u64,
        len: u64,
        a: Access,
        stream: u64,
    ) -> PluginResult<u64> {
        self.note(format!(
            "map_on {}+{oo:#x} -> {} +{off:#x} {len:#x} {a:?} on {stream}",
            o.handle, r.handle
        ));
        Ok(self.id())
    }
    fn unmap_on(&self, r: &ObjectRef, off: u64, len: u64, stream: u64) -> PluginResult<u64> {
        self.note(format!("unmap_on {} +{off:#x} {len:#x} on {stream}", r.handle));
        Ok(self.id())
    }
}

impl StreamSync for Orderly {
    fn stream_create(&self) -> PluginResult<u64> {
        Ok(self.id())
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
    fn fence_query(&self, _: u64) -> PluginResult<FenceState> {
        Ok(FenceState::Complete)
    }
    fn fence_wait(&self, _: u64, _: Duration) -> PluginResult<FenceState> {
        Ok(FenceState::Complete)
    }
    fn fence_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
    const CAN_WAIT_FENCE: bool = true;
    fn stream_wait_fence(&self, stream: u64, fence: u64) -> PluginResult<()> {
        self.note(format!("stream {stream} waits for fence {fence}"));
        Ok(())
    }
    const CAN_ADOPT_TYPED: bool = true;
    fn stream_adopt_typed(&self, kind: u32, native: *mut core::ffi::c_void) -> PluginResult<u64> {
        if kind != MEMPLUG_DEVICE_CUDA {
            return Err(PluginError::unsupported(format!("kind {kind} is not adopted")));
        }
        self.note(format!("adopt kind {kind} native {:#x}", native as usize));
        Ok(self.id())
    }
}

impl PeerAccess for Orderly {
    fn can_access_peer(&self, peer: MemplugDevice) -> PluginResult<u32> {
        Ok(match peer {
            PEER => MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE,
            WRITE_ONLY => MEMPLUG_ACCESS_WRITE,
            _ => 0,
        })
    }
    fn set_peer_access(
        &self,
        r: &ObjectRef,
        off: u64,
        len: u64,
        peer: MemplugDevice,
        access: u32,
    ) -> PluginResult<()> {
        self.note(format!(
            "peer {}:{} gets {access:#x} on {} +{off:#x} {len:#x}",
            peer.kind, peer.ordinal, r.handle
        ));
        Ok(())
    }
}

static LOG: Mutex<Option<MechanismState<Orderly>>> = Mutex::new(None);

fn orderly_plugin() -> ExportedPlugin {
    let b = MechanismBuilder::new("orderly", 3, CPU2, Orderly::default())
        .virtual_backing()
        .shared_mapping()
        .sync()
        .peer_access();
    *LOG.lock().unwrap() = Some(b.state());
    PluginBuilder::new("orderly", "1").mechanism(b.build()).live_objects(|| 0).build()
}
memplug_sdk::declare_entry!(orderly_entry, orderly_plugin);

fn log() -> Vec<String> {
    LOG.lock().unwrap().as_ref().unwrap().log.lock().unwrap().clone()
}

fn load(max_minor: u32) -> Plugin {
    let opts = LoadOptions { max_minor, ..LoadOptions::default() };
    unsafe { Plugin::from_entry(orderly_entry, "orderly", &opts) }.unwrap()
}

#[test]
fn queued_binding_waits_adoption_and_peer_access_reach_a_1_2_plugin() {
    let p = load(2);
    let m = p.mechanism("orderly").unwrap();
    let c = m.capabilities();
    assert!(c.queued_binding() && c.peer_access(), "{c:?}");
    // SAFETY: test harness; every object is released below.
    let un = unsafe { m.ungoverned() };
    let (vb, sm, sync) = (un.virtual_backing().unwrap(), un.shared_mapping().unwrap(), m.sync().unwrap());
    let stream = sync.stream_create().unwrap();
    let res = vb.reserve(16 * G).unwrap();
    let fences_before = m.live(ObjectKind::Fence);
    let f = vb.commit_on(&res, 0, 4 * G, &stream).unwrap();
    assert_eq!(m.live(ObjectKind::Fence), fences_before + 1, "a queued fence is counted live");
    assert!(sync.fence_query(&f).unwrap());
    let g = vb.decommit_on(&res, G, G, &stream).unwrap();
    let e = vb.commit_on(&res, 15 * G, 2 * G, &stream).unwrap_err();
    assert_eq!(e.status, Status::OutOfRange, "the host refuses a range past the reservation: {e}");
    let obj = sm.create(2 * G).unwrap();
    let h = sm.map_on(&obj, 0, &res, 8 * G, 2 * G, Access::ReadOnly, &stream).unwrap();
    let i = sm.unmap_on(&res, 8 * G, 2 * G, &stream).unwrap();
    sync.stream_wait_fence(&stream, &h).unwrap();
    // SAFETY: the plugin only records the pointer.
    let adopted = unsafe { sync.stream_adopt_typed(MEMPLUG_DEVICE_CUDA, 0x1234 as *mut _) }.unwrap();
    let refused = unsafe { sync.stream_adopt_typed(MEMPLUG_DEVICE_VULKAN, 0x1234 as *mut _) }.unwrap_err();
    assert_eq!(refused.status, Status::Unsupported);
    let peer = m.peer_access().unwrap();
    assert_eq!(peer.can_access_peer(PEER).unwrap(), Some(Access::ReadWrite));
    assert_eq!(peer.can_access_peer(CPU2).unwrap(), None);
    let e = peer.can_access_peer(WRITE_ONLY).unwrap_err();
    assert_eq!(e.status, Status::Internal, "an undefined answer is the plugin's fault, not 'none': {e}");
    assert!(e.message.contains("neither 0 (none), READ nor READ|WRITE"), "{e}");
    peer.set_peer_access(&res, 0, 4 * G, PEER, Some(Access::ReadOnly)).unwrap();
    peer.set_peer_access(&res, 0, 4 * G, PEER, None).unwrap();
    let e = peer.set_peer_access(&res, 0, 17 * G, PEER, None).unwrap_err();
    assert_eq!(e.status, Status::OutOfRange);
    let (r, o, s) = (res.raw().handle, obj.raw().handle, stream.handle());
    assert_eq!(
        log(),
        [
            format!("commit_on {r} +0x0 0x4000 on {s}"),
            format!("decommit_on {r} +0x1000 0x1000 on {s}"),
            format!("map_on {o}+0x0 -> {r} +0x8000 0x2000 ReadOnly on {s}"),
            format!("unmap_on {r} +0x8000 0x2000 on {s}"),
            format!("stream {s} waits for fence {}", h.handle()),
            "adopt kind 2 native 0x1234".to_string(),
            format!("peer 2:0 gets 0x1 on {r} +0x0 0x4000"),
            format!("peer 2:0 gets 0x0 on {r} +0x0 0x4000"),
        ],
        "each call reached the plugin once, with the host's arguments; the refused ones did not"
    );
    for fence in [f, g, h, i] {
        sync.fence_destroy(fence).unwrap();
    }
    assert_eq!(m.live(ObjectKind::Fence), fences_before);
    sync.stream_destroy(adopted).unwrap();
    sync.stream_destroy(stream).unwrap();
    sm.release(obj).unwrap();
    vb.release(res).unwrap();
}

#[test]
fn a_1_1_host_sees_none_of_it() {
    let p = load(1);
    let m = p.mechanism("orderly").unwrap();
    let c = m.capabilities();
    assert!(!c.queued_binding() && !c.peer_access() && m.peer_access().is_none(), "{c:?}");
    // SAFETY: test harness; every object is released below.
    let un = unsafe { m.ungoverned() };
    let (vb, sync) = (un.virtual_backing().unwrap(), m.sync().unwrap());
    let stream = sync.stream_create().unwrap();
    let res = vb.reserve(4 * G).unwrap();
    let e = vb.commit_on(&res, 0, G, &stream).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    let f = sync.fence_record(&stream).unwrap();
    let e = sync.stream_wait_fence(&stream, &f).unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(stream).unwrap();
    vb.release(res).unwrap();
}

#[test]
fn the_cpu_plugin_orders_a_stream_behind_another_streams_fence() {
    use std::sync::atomic::AtomicBool;
    use std::sync::{mpsc, Arc};
    let path = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let p = Plugin::load(&path).unwrap();
    let m = p.mechanism("cpu").unwrap();
    let sync = m.sync().unwrap();
    let (a, b) = (sync.stream_create().unwrap(), sync.stream_create().unwrap());
    let (open, gate) = mpsc::channel::<()>();
    sync.enqueue(&a, move || {
        let _ = gate.recv_timeout(Duration::from_secs(20));
    })
    .unwrap();
    let fa = sync.fence_record(&a).unwrap();
    sync.stream_wait_fence(&b, &fa).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let r = ran.clone();
    sync.enqueue(&b, move || r.store(true, SeqCst)).unwrap();
    let fb = sync.fence_record(&b).unwrap();
    // B's work is behind A's fence, which is behind the gate: not done.
    assert!(!sync.fence_wait(&fb, Duration::from_millis(50)).unwrap());
    assert!(!ran.load(SeqCst), "ran before the fence it waits for");
    open.send(()).unwrap();
    assert!(sync.fence_wait(&fb, Duration::from_secs(20)).unwrap());
    assert!(ran.load(SeqCst));
    for f in [fa, fb] {
        sync.fence_destroy(f).unwrap();
    }
    sync.stream_destroy(a).unwrap();
    sync.stream_destroy(b).unwrap();
}
