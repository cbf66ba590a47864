//! ABI 1.3's stream-ordered copy through the host (`SyncApi::copy`):
//! refused before the plugin when the host can tell (a range wrapping
//! around the address space, overlapping ranges, a foreign stream, no
//! slot: a plugin of 1.2, or one that does not publish it), passed through
//! with the host's arguments otherwise, `len` 0 a no-op; the copy spaces
//! in the properties only at 1.3; and on the CPU plugin, the bytes copied
//! in the stream's order (after a host function that writes the source,
//! before one that reads the destination and before a later fence), and
//! memory past an allocation or uncommitted refused.

use memplug_host::{LoadOptions, Plugin, Status};
use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

const CPU3: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 3 };

/// Streams that do nothing; copies are recorded, not made.
#[derive(Default)]
struct Recorder {
    next: AtomicU64,
    copies: Mutex<Vec<(u64, u64, u64, u64)>>,
}

impl Allocator for Recorder {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        Ok(Block { addr: 0x10_0000 * (self.next.fetch_add(1, SeqCst) + 1), size: r.size, handle: 1 })
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

impl StreamSync for Recorder {
    fn stream_create(&self) -> PluginResult<u64> {
        Ok(self.next.fetch_add(1, SeqCst) + 1)
    }
    fn stream_destroy(&self, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn enqueue_host_fn(&self, _: u64, f: HostFn) -> PluginResult<()> {
        f.call();
        Ok(())
    }
    fn fence_record(&self, _: u64) -> PluginResult<u64> {
        Ok(self.next.fetch_add(1, SeqCst) + 1)
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
    const CAN_COPY: bool = true;
    fn copy_kinds(&self) -> u32 {
        MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_PEER
    }
    fn copy(&self, stream: u64, dst: u64, src: u64, len: u64) -> PluginResult<()> {
        self.copies.lock().unwrap().push((stream, dst, src, len));
        Ok(())
    }
}

static STATE: Mutex<Option<MechanismState<Recorder>>> = Mutex::new(None);

fn recorder_plugin() -> ExportedPlugin {
    let b = MechanismBuilder::new("recorder", 9, CPU3, Recorder::default()).sync();
    *STATE.lock().unwrap() = Some(b.state());
    PluginBuilder::new("recorder", "1").mechanism(b.build()).live_objects(|| 0).build()
}
memplug_sdk::declare_entry!(recorder_entry, recorder_plugin);

fn copies() -> Vec<(u64, u64, u64, u64)> {
    std::mem::take(&mut *STATE.lock().unwrap().as_ref().unwrap().copies.lock().unwrap())
}

fn load(max_minor: u32) -> Plugin {
    let opts = LoadOptions { max_minor, ..LoadOptions::default() };
    unsafe { Plugin::from_entry(recorder_entry, "recorder", &opts) }.unwrap()
}

/// One test drives the recorder (its log is shared by every load).
#[test]
fn the_host_checks_what_it_can_and_passes_the_rest_through_at_1_3_only() {
    let p = load(3);
    assert_eq!(p.abi_version(), (1, 3));
    let m = p.mechanism("recorder").unwrap();
    let kinds = m.properties().copy_kinds;
    assert!(kinds.device() && kinds.peer() && !kinds.host(), "{kinds:?}");
    let sync = m.sync().unwrap();
    assert!(sync.can_copy());
    let s = sync.stream_create().unwrap();
    copies();
    // SAFETY (every call): the recorder touches no memory.
    unsafe { sync.copy(&s, 0x2000, 0x1000, 0x1000) }.unwrap();
    assert_eq!(copies(), [(s.handle(), 0x2000, 0x1000, 0x1000)], "the host's arguments, once");
    unsafe { sync.copy(&s, 0x2000, 0x2000, 0) }.unwrap();
    assert_eq!(copies(), [], "len 0 is done without the plugin");
    for (dst, src, len, status, says) in [
        (0x1800, 0x1000, 0x1000, Status::InvalidArgument, "overlap"),
        (0x1000, 0x1fff, 0x1000, Status::InvalidArgument, "overlap"),
        (u64::MAX - 0xff, 0x1000, 0x100, Status::OutOfRange, "the dst range"),
        (0x1000, u64::MAX, 2, Status::OutOfRange, "the src range"),
    ] {
        let e = unsafe { sync.copy(&s, dst, src, len) }.unwrap_err();
        assert_eq!(e.status, status, "{e}");
        assert!(e.message.contains(says), "{e}");
    }
    assert_eq!(copies(), [], "refused before the plugin");
    // Another mechanism's stream is refused too.
    let path = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let cpu = Plugin::load(&path).unwrap();
    let cm = cpu.mechanism("cpu").unwrap();
    let foreign = cm.sync().unwrap().stream_create().unwrap();
    let e = unsafe { sync.copy(&foreign, 0x2000, 0x1000, 8) }.unwrap_err();
    assert_eq!(e.status, Status::WrongMechanism, "{e}");
    cm.sync().unwrap().stream_destroy(foreign).unwrap();
    sync.stream_destroy(s).unwrap();
    drop(p);

    // A host pinned to 1.2: no slot, no spaces, refused by the host.
    let p = load(2);
    let m = p.mechanism("recorder").unwrap();
    assert_eq!(m.properties().copy_kinds, CopyKinds::NONE);
    let sync = m.sync().unwrap();
    assert!(!sync.can_copy());
    let s = sync.stream_create().unwrap();
    let e = unsafe { sync.copy(&s, 0x2000, 0x1000, 8) }.unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    assert!(e.message.contains("agreed on ABI 1.2"), "{e}");
    assert_eq!(copies(), []);
    sync.stream_destroy(s).unwrap();
}

fn cpu() -> Plugin {
    let path = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    Plugin::load(&path).unwrap()
}

#[test]
fn the_cpu_plugin_copies_in_stream_order() {
    let p = cpu();
    let m = p.mechanism("cpu").unwrap();
    let kinds = m.properties().copy_kinds;
    assert!(kinds.device() && kinds.host() && !kinds.peer(), "{kinds:?}");
    let sync = m.sync().unwrap();
    // SAFETY: test memory, handed back below.
    let alloc = unsafe { m.ungoverned() }.allocator();
    let (a, b) = (alloc.allocate(1 << 16, 64).unwrap(), alloc.allocate(1 << 16, 64).unwrap());
    let (src, dst) = (a.addr(), b.addr());
    unsafe { std::ptr::write_bytes(dst as *mut u8, 0xee, 1 << 16) };
    let s = sync.stream_create().unwrap();
    // The stream is held behind a gate; the source is written by a host
    // function that runs after it, so a copy that does not wait copies the
    // old bytes.
    let (open, gate) = mpsc::channel::<()>();
    sync.enqueue(&s, move || {
        let _ = gate.recv_timeout(Duration::from_secs(20));
        for i in 0..(1u64 << 16) {
            unsafe { *((src + i) as *mut u8) = (i % 251) as u8 };
        }
    })
    .unwrap();
    unsafe { sync.copy(&s, dst + 8, src + 16, 4096) }.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let into = seen.clone();
    sync.enqueue(&s, move || {
        let bytes = unsafe { std::slice::from_raw_parts((dst + 8) as *const u8, 4096) };
        into.lock().unwrap().extend_from_slice(bytes);
    })
    .unwrap();
    let f = sync.fence_record(&s).unwrap();
    assert!(!sync.fence_wait(&f, Duration::from_millis(50)).unwrap(), "done before the gate opened");
    assert_eq!(unsafe { *((dst + 8) as *const u8) }, 0xee, "copied before its turn");
    open.send(()).unwrap();
    assert!(sync.fence_wait(&f, Duration::from_secs(20)).unwrap());
    let want: Vec<u8> = (16..16 + 4096u64).map(|i| (i % 251) as u8).collect();
    assert_eq!(*seen.lock().unwrap(), want, "the host function after the copy sees it");
    let out = unsafe { std::slice::from_raw_parts(dst as *const u8, 1 << 16) };
    assert_eq!(&out[8..8 + 4096], &want[..], "the fence after the copy completes after it");
    assert!(out[..8].iter().chain(&out[8 + 4096..]).all(|&b| b == 0xee), "no byte outside the range");
    sync.fence_destroy(f).unwrap();

    // Host memory on either side (MEMPLUG_COPY_HOST).
    let mut host = vec![0u8; 4096];
    unsafe { sync.copy(&s, host.as_mut_ptr() as u64, dst + 8, 4096) }.unwrap();
    let f = sync.fence_record(&s).unwrap();
    assert!(sync.fence_wait(&f, Duration::from_secs(20)).unwrap());
    assert_eq!(host, want);
    sync.fence_destroy(f).unwrap();

    // Past the end of an allocation, from inside or from outside it.
    for (d, sr) in [(dst + (1 << 16) - 8, src), (dst, src + (1 << 16) - 8), (dst - 8, host.as_ptr() as u64)] {
        let e = unsafe { sync.copy(&s, d, sr, 16) }.unwrap_err();
        assert_eq!(e.status, Status::OutOfRange, "{e}");
        assert!(e.message.contains("not wholly inside the allocation"), "{e}");
    }
    sync.stream_destroy(s).unwrap();
    alloc.deallocate(a).unwrap();
    alloc.deallocate(b).unwrap();
}

#[test]
fn the_cpu_plugin_copies_only_committed_parts_of_a_reservation() {
    let p = cpu();
    let m = p.mechanism("cpu").unwrap();
    let g = m.properties().granularity;
    let sync = m.sync().unwrap();
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let r = vb.reserve(4 * g).unwrap();
    vb.commit(&r, 0, g).unwrap();
    vb.commit(&r, 2 * g, g).unwrap();
    let s = sync.stream_create().unwrap();
    let mut host = vec![7u8; 2 * g as usize];
    let e = unsafe { sync.copy(&s, r.addr() + g / 2, host.as_ptr() as u64, g) }.unwrap_err();
    assert_eq!(e.status, Status::OutOfRange, "into the uncommitted granule: {e}");
    assert!(e.message.contains("not all committed or mapped"), "{e}");
    let e = unsafe { sync.copy(&s, r.addr() + 3 * g, host.as_ptr() as u64, 2 * g) }.unwrap_err();
    assert_eq!(e.status, Status::OutOfRange, "past the reservation: {e}");
    unsafe { sync.copy(&s, r.addr() + 2 * g, host.as_ptr() as u64, g) }.unwrap();
    unsafe { sync.copy(&s, host.as_mut_ptr() as u64 + g, r.addr() + 2 * g, g) }.unwrap();
    let f = sync.fence_record(&s).unwrap();
    assert!(sync.fence_wait(&f, Duration::from_secs(20)).unwrap());
    assert!(host.iter().all(|&b| b == 7));
    sync.fence_destroy(f).unwrap();
    sync.stream_destroy(s).unwrap();
    vb.decommit(&r, 0, g).unwrap();
    vb.decommit(&r, 2 * g, g).unwrap();
    vb.release(r).unwrap();
}
