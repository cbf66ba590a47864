//! A dead CUDA context through ABI 1.2 (fake driver only): a sticky error
//! the fake injects (`fake_cuda_inject_sticky_fault`) makes the mechanism
//! lost — the slot that meets it answers DEVICE_LOST and reports the loss
//! once through the plugin's `HostLink`, the host's context goes to `Lost`,
//! and every later slot answers DEVICE_LOST from the SDK without reaching
//! the driver. With `MEMPLUG_CUDA_LOSS_POLL_MS` a watcher notices it while
//! no slot is called. (A 1.1 host keeps DEVICE_UNAVAILABLE: see
//! `child_sticky_fault` in `vmm.rs`.)
//!
//! Each scenario runs in a child process, with a private copy of the
//! plugin: the fault is for the rest of the process. The host refuses
//! every call into a lost mechanism itself, so the plugin's own answers are
//! read by a second, raw host of the same instance ([`RawHost`]).

mod common;

use common::*;
use memplug_host::{LifeState, LoadOptions, Status};
use memplug_plugin_cuda_vmm::LOSS_POLL_ENV;
use memplug_sdk::abi::*;
use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::time::Duration;

const MIB: u64 = 1 << 20;

// ---- a raw host: the plugin's slots called directly ----

#[derive(Default)]
struct Capture(RefCell<String>);

unsafe extern "C" fn capture(ctx: *mut c_void, msg: *const c_char, len: usize) {
    let c = &*(ctx as *const Capture);
    c.0.borrow_mut().push_str(&String::from_utf8_lossy(std::slice::from_raw_parts(msg.cast::<u8>(), len)));
}

/// Calls a slot with a capturing sink: its status and message.
fn call(f: impl FnOnce(*const MemplugMessageSink) -> MemplugStatus) -> (MemplugStatus, String) {
    let c = Capture::default();
    let sink = MemplugMessageSink { ctx: &c as *const Capture as *mut c_void, write: Some(capture) };
    let raw = f(&sink);
    (raw, c.0.into_inner())
}

/// A second host of the instance the host loaded: it negotiated ABI 1.2
/// (without services) through the same library's entry symbol, and calls
/// one mechanism's slots itself.
struct RawHost {
    mech: MemplugMechanism,
}

impl RawHost {
    fn new(same: &libloading::Library, mechanism_id: u64) -> RawHost {
        // SAFETY: the entry symbol's ABI type.
        let entry: libloading::Symbol<MemplugEntryV1> = unsafe { same.get(b"memplug_plugin_v1") }.unwrap();
        let host = MemplugHostInfo {
            struct_size: std::mem::size_of::<MemplugHostInfo>() as u32,
            abi_major: MEMPLUG_ABI_MAJOR,
            min_minor: 0,
            max_minor: MEMPLUG_ABI_MINOR,
            host_name: c"cuda-device-lost-raw".as_ptr(),
            services: std::ptr::null(),
        };
        let mut out = MemplugNegotiation {
            struct_size: std::mem::size_of::<MemplugNegotiation>() as u32,
            agreed_minor: u32::MAX,
            plugin: std::ptr::null(),
        };
        let (st, msg) = call(|sink| unsafe { entry(&host, &mut out, sink) });
        assert_eq!(st, MEMPLUG_STATUS_OK, "raw negotiation: {msg}");
        assert_eq!(out.agreed_minor, MEMPLUG_ABI_MINOR);
        let plugin = unsafe { &*out.plugin };
        let mechs = unsafe { std::slice::from_raw_parts(plugin.mechanisms, plugin.mechanism_count as usize) };
        let mech = mechs
            .iter()
            .map(|m| unsafe { **m })
            .find(|m| m.mechanism_id == mechanism_id)
            .expect("the mechanism is in the descriptor");
        RawHost { mech }
    }

    fn request(&self, size: u64) -> MemplugRequest {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 40);
        MemplugRequest {
            struct_size: std::mem::size_of::<MemplugRequest>() as u32,
            flags: 0,
            size,
            alignment: 256,
            object_id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            device: self.mech.device,
            class_tag: 0,
            reserved0: 0,
            ..Default::default()
        }
    }

    fn allocate(&self, size: u64) -> Result<MemplugObjectRef, (MemplugStatus, String)> {
        let r = self.request(size);
        let mut b =
            MemplugBlock { struct_size: std::mem::size_of::<MemplugBlock>() as u32, ..Default::default() };
        let alloc = unsafe { &*self.mech.allocator };
        let (st, msg) = call(|sink| unsafe { alloc.allocate.unwrap()(self.mech.ctx, &r, &mut b, sink) });
        if st != MEMPLUG_STATUS_OK {
            return Err((st, msg));
        }
        Ok(MemplugObjectRef {
            struct_size: std::mem::size_of::<MemplugObjectRef>() as u32,
            reserved0: 0,
            mechanism_id: self.mech.mechanism_id,
            device: r.device,
            object_id: r.object_id,
            addr: b.addr,
            size: b.size,
            handle: b.handle,
        })
    }

    /// Every slot kind once (allocate, deallocate of `block`, memory_info,
    /// properties, reserve, stream_create): what each answered.
    fn every_slot(&self, block: &MemplugObjectRef) -> Vec<(&'static str, MemplugStatus, String)> {
        let ctx = self.mech.ctx;
        let alloc = unsafe { &*self.mech.allocator };
        let vb = unsafe { &*self.mech.virtual_backing };
        let sync = unsafe { &*self.mech.sync };
        let mut v = Vec::new();
        let (st, m) = match self.allocate(MIB) {
            Ok(_) => (MEMPLUG_STATUS_OK, String::new()),
            Err(e) => e,
        };
        v.push(("allocate", st, m));
        let (st, m) = call(|sink| unsafe { alloc.deallocate.unwrap()(ctx, block, sink) });
        v.push(("deallocate", st, m));
        let mut info = MemplugMemoryInfo {
            struct_size: std::mem::size_of::<MemplugMemoryInfo>() as u32,
            ..Default::default()
        };
        let (st, m) = call(|sink| unsafe { alloc.memory_info.unwrap()(ctx, &mut info, sink) });
        v.push(("memory_info", st, m));
        let mut props = MemplugProperties {
            struct_size: std::mem::size_of::<MemplugProperties>() as u32,
            ..Default::default()
        };
        let (st, m) = call(|sink| unsafe { alloc.properties.unwrap()(ctx, &mut props, sink) });
        v.push(("properties", st, m));
        let r = self.request(FAKE_GRANULARITY);
        let mut b =
            MemplugBlock { struct_size: std::mem::size_of::<MemplugBlock>() as u32, ..Default::default() };
        let (st, m) = call(|sink| unsafe { vb.reserve.unwrap()(ctx, &r, &mut b, sink) });
        v.push(("reserve", st, m));
        let mut stream = 0u64;
        let (st, m) = call(|sink| unsafe { sync.stream_create.unwrap()(ctx, &mut stream, sink) });
        v.push(("stream_create", st, m));
        v
    }
}

// ---- the scenarios ----

#[test]
fn a_sticky_fault_met_by_a_slot_loses_the_mechanism_once() {
    if real() || is_child() {
        return;
    }
    let out = run_child("child_slot_meets_the_fault", &[(LOSS_POLL_ENV, None)]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("SLOT LOSS OK"));
}

#[test]
#[ignore = "run by a_sticky_fault_met_by_a_slot_loses_the_mechanism_once in a child process"]
fn child_slot_meets_the_fault() {
    if !is_child() {
        return;
    }
    let (p, same) = load_with_same(&LoadOptions::default());
    assert_eq!(p.abi_version(), (1, memplug_host::HOST_MAX_MINOR));
    let (m0, m1) = (cuda0(&p), cuda1(&p));
    let raw = RawHost::new(&same, m0.id());
    let a = unsafe { m0.ungoverned() }.allocator();
    let block = a.allocate(4096, 256).unwrap();
    let raw_block = raw.allocate(4096).expect("raw allocate before the fault");
    assert!(m1.memory_info().unwrap().is_ok());
    let live = p.plugin_live_objects();

    assert_eq!(fake_inject_sticky_fault(700), 0, "no fault before");
    assert_eq!(fake_sticky_code(), 700);
    // Nothing has met the fault yet (no slot, no watcher): nothing lost.
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(m0.life_state(), LifeState::Active);
    assert_eq!(p.service_stats().losses, 0);

    // The slot that meets it answers DEVICE_LOST, having reported the loss.
    let e = a.allocate(4096, 256).unwrap_err();
    assert_eq!(e.status, Status::DeviceLost, "{e}");
    assert!(e.message.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    assert_eq!(m0.life_state(), LifeState::Lost);
    let reason = m0.life_reason().expect("a reason");
    assert!(reason.contains("is dead") && reason.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{reason}");
    // Reported for both mechanisms of device 0 (its device memory and its
    // pinned host memory share the context: tests/pinned.rs).
    let stats = p.service_stats();
    assert_eq!((stats.losses, stats.repeats, stats.refused), (2, 0, 0), "{stats:?}");
    // Device 1 has not met the fault yet: its mechanism is still active.
    assert_eq!(m1.life_state(), LifeState::Active);

    let calls = fake_calls().unwrap();
    // The host refuses every call into the lost mechanism.
    assert_eq!(m0.memory_info().unwrap().unwrap_err().status, Status::DeviceLost);
    let e = a.deallocate(block).unwrap_err();
    assert_eq!(e.error.status, Status::DeviceLost, "{}", e.error);
    let _ = e.object.into_raw();
    // Every slot of the plugin answers DEVICE_LOST (the SDK's latch), with
    // no driver call and no second report.
    for (slot, st, msg) in raw.every_slot(&raw_block) {
        assert_eq!(st, MEMPLUG_STATUS_DEVICE_LOST, "{slot}: {msg}");
        assert!(msg.contains("reported lost"), "{slot}: {msg}");
    }
    assert_eq!(fake_calls().unwrap(), calls, "no driver call after the loss");
    assert_eq!(p.plugin_live_objects(), live, "nothing made or freed");
    assert_eq!(p.service_stats().losses, 2, "reported once per mechanism");

    // Device 1's context did not fault: its mechanism keeps working (one
    // fault kills one context, as on a real driver; the fake is as strict).
    assert!(m1.memory_info().unwrap().is_ok(), "device 1 met device 0's fault");
    assert_eq!(m1.life_state(), LifeState::Active);
    let stats = p.service_stats();
    assert_eq!((stats.losses, stats.repeats, stats.refused), (2, 0, 0), "{stats:?}");
    println!("SLOT LOSS OK");
    // Objects are alive in a lost plugin: it stays loaded.
    std::mem::forget(p);
    std::mem::forget(same);
}

/// Every code the driver documents as killing the context (a device-side
/// assert, a contained error, ... : `driver::STICKY_CODES`) loses the
/// mechanism when a slot meets it; one child process per code, since a
/// fault is for the life of the process.
#[test]
fn every_context_killing_code_loses_the_mechanism() {
    if real() || is_child() {
        return;
    }
    for &(code, name) in memplug_plugin_cuda_vmm::driver::STICKY_CODES {
        let c = code.to_string();
        let out = run_child(
            "child_one_sticky_code",
            &[("MEMPLUG_TEST_STICKY_CODE", Some(std::ffi::OsStr::new(&c)))],
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("CODE LOST OK"), "{name} ({code})");
    }
}

#[test]
#[ignore = "run by every_context_killing_code_loses_the_mechanism in a child process"]
fn child_one_sticky_code() {
    if !is_child() {
        return;
    }
    let code: i32 = std::env::var("MEMPLUG_TEST_STICKY_CODE").unwrap().parse().unwrap();
    let p = load();
    let m0 = cuda0(&p);
    let a = unsafe { m0.ungoverned() }.allocator();
    let block = a.allocate(4096, 256).unwrap();
    assert_eq!(fake_inject_sticky_fault(code), 0);
    let e = a.allocate(4096, 256).unwrap_err();
    assert_eq!(e.status, Status::DeviceLost, "code {code}: {e}");
    assert_eq!(m0.life_state(), LifeState::Lost, "code {code}");
    // Released quietly: the lost block is refused without a driver call,
    // and the plugin's context cleanup (whose pop and release the fake now
    // answers with the fault) does not panic.
    let e = a.deallocate(block).unwrap_err();
    assert_eq!(e.error.status, Status::DeviceLost);
    let _ = e.object.into_raw();
    println!("CODE LOST OK");
    std::mem::forget(p);
}

#[test]
fn the_watcher_notices_a_dead_context_while_no_slot_is_called() {
    if real() || is_child() {
        return;
    }
    let out = run_child("child_watcher", &[(LOSS_POLL_ENV, Some(std::ffi::OsStr::new("5")))]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("WATCHER OK"));
}

#[test]
#[ignore = "run by the_watcher_notices_a_dead_context_while_no_slot_is_called in a child process"]
fn child_watcher() {
    if !is_child() {
        return;
    }
    assert_eq!(std::env::var(LOSS_POLL_ENV).as_deref(), Ok("5"));
    // The watcher polls while the plugin is loaded and is gone after unload.
    let p = load();
    assert!(cuda0(&p).memory_info().unwrap().is_ok(), "retains device 0's context");
    let before = fake_calls().unwrap();
    eventually("the watcher to poll", || fake_calls().unwrap() >= before + 8);
    unload_released(p);
    let after = fake_calls().unwrap();
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(fake_calls().unwrap(), after, "the watcher was stopped with the plugin");

    // A loss noticed with no slot called.
    let p = load();
    let (m0, m1) = (cuda0(&p), cuda1(&p));
    assert!(m0.memory_info().unwrap().is_ok());
    assert_eq!(fake_inject_sticky_fault(719), 0);
    eventually("the watcher to report the loss", || m0.life_state() == LifeState::Lost);
    let reason = m0.life_reason().expect("a reason");
    assert!(reason.contains("CUDA_ERROR_LAUNCH_FAILED"), "{reason}");
    // Device 0's two mechanisms.
    assert_eq!(p.service_stats().losses, 2);
    // Device 1's context was never retained: the watcher does not create
    // it, so nothing there met the fault.
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(m1.life_state(), LifeState::Active);
    assert_eq!(fake_ctx_refs(1), Some(0));
    // The host refuses device 0 now; the loss was reported once.
    assert_eq!(m0.memory_info().unwrap().unwrap_err().status, Status::DeviceLost);
    let stats = p.service_stats();
    assert_eq!((stats.losses, stats.repeats, stats.refused), (2, 0, 0), "{stats:?}");
    println!("WATCHER OK");
    std::mem::forget(p);
}
