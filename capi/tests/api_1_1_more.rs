//! More of API 1.1 of the host C API, against the reference CPU plugin
//! (plugin ABI 1.2): typed export of shared prefixes
//! (`memplug_host_prefix_export_handle`, `memplug_host_binding_import_prefix`,
//! `MemplugHostHandle`), a stream ordered behind another stream's fence
//! (`memplug_host_stream_wait_fence`), and peer access
//! (`memplug_host_mechanism_can_access_peer`), which the CPU plugin does not
//! have.

mod common;

use common::{last_error, ok, plugin_path};
use memplug_host_capi::*;
use memplug_sdk::abi::*;
use std::ffi::c_void;
use std::mem::size_of;
use std::os::fd::{FromRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };
const MIB: u64 = 1 << 20;

fn cpu() -> (MemplugHostManager, MemplugHostMechanism) {
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    ok(unsafe { memplug_host_manager_load_plugin(m, plugin_path().as_ptr()) });
    let mut mech = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_find_mechanism(m, c"memplug-cpu/cpu".as_ptr(), &mut mech) });
    (m, mech)
}

fn info(mech: MemplugHostMechanism) -> MemplugHostMechanismInfo {
    // SAFETY: integers, a device and char arrays: valid when zeroed.
    let mut i = unsafe { std::mem::zeroed::<MemplugHostMechanismInfo>() };
    i.struct_size = size_of::<MemplugHostMechanismInfo>() as u32;
    ok(unsafe { memplug_host_mechanism_info(mech, &mut i) });
    i
}

fn pool(m: MemplugHostManager, name: &std::ffi::CStr) -> MemplugHostPool {
    let mut p = MemplugHostPool::default();
    ok(unsafe { memplug_host_pool_create(m, name.as_ptr(), 256 * MIB, &mut p) });
    p
}

fn used(p: MemplugHostPool) -> u64 {
    // SAFETY: integers: valid when zeroed.
    let mut s = unsafe { std::mem::zeroed::<MemplugHostPoolStats>() };
    s.struct_size = size_of::<MemplugHostPoolStats>() as u32;
    ok(unsafe { memplug_host_pool_stats(p, &mut s) });
    s.used
}

fn binding(
    m: MemplugHostManager,
    mech: MemplugHostMechanism,
    p: MemplugHostPool,
    export_types: u32,
) -> MemplugHostBinding {
    let opts = MemplugHostBindingOptions {
        struct_size: size_of::<MemplugHostBindingOptions>() as u32,
        alloc_class: MEMPLUG_HOST_CLASS_WEIGHTS,
        export_types,
        ..Default::default()
    };
    let mut b = MemplugHostBinding::default();
    ok(unsafe { memplug_host_binding_create(m, mech, p, &opts, &mut b) });
    b
}

unsafe extern "C" fn fill_pattern(_: *mut c_void, addr: u64, len: u64) {
    // SAFETY: the writable view the host hands the init callback.
    let s = unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, len as usize) };
    for (i, b) in s.iter_mut().enumerate() {
        *b = (i % 251) as u8 ^ 0x5a;
    }
}

fn prefix_len(p: MemplugHostPrefix) -> (u64, u64) {
    let mut i = MemplugHostPrefixInfo {
        struct_size: size_of::<MemplugHostPrefixInfo>() as u32,
        ..Default::default()
    };
    ok(unsafe { memplug_host_prefix_info(p, &mut i) });
    (i.len, i.charged)
}

#[test]
fn a_prefix_exported_as_a_memfd_imports_into_another_pool_charged_once_each() {
    let (m, mech) = cpu();
    let (pa, pb) = (pool(m, c"exporter"), pool(m, c"importer"));
    let (ba, bb) = (binding(m, mech, pa, MEMPLUG_HANDLE_MEMFD), binding(m, mech, pb, 0));
    let gran = info(mech).granularity.max(4096);
    let mut prefix = MemplugHostPrefix::default();
    ok(unsafe { memplug_host_prefix_create(ba, gran, Some(fill_pattern), null_mut(), &mut prefix) });
    let (len, charged) = prefix_len(prefix);
    assert_eq!((len, charged), (gran, gran));
    assert_eq!((used(pa), used(pb)), (len, 0));

    // Export: a new memfd, the caller's.
    let mut h = MemplugHostHandle::default();
    ok(unsafe { memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD, &mut h) });
    assert_eq!(
        (h.struct_size, h.kind, h.blob_len, h.win32),
        (MEMPLUG_HOST_HANDLE_SIZE_1_1, MEMPLUG_HANDLE_MEMFD, 0, 0)
    );
    assert!(h.fd > 2, "{}", h.fd);
    assert_eq!(used(pa), len, "exporting charges nothing");

    // Import into the other binding: charged once, to its own pool.
    let mut imported = MemplugHostPrefix::default();
    ok(unsafe { memplug_host_binding_import_prefix(bb, &h, len, &mut imported) });
    assert_eq!(prefix_len(imported), (len, len));
    assert_eq!((used(pa), used(pb)), (len, len));
    // The handle stays the caller's: closing it leaves the import alone.
    drop(unsafe { OwnedFd::from_raw_fd(h.fd) });

    // Mapped into a region of the importer: the exporter's bytes.
    let mut r = MemplugHostRegion::default();
    ok(unsafe { memplug_host_region_reserve(bb, 4 * len, &mut r) });
    ok(memplug_host_region_map_prefix(r, imported));
    let mut ri = MemplugHostRegionInfo {
        struct_size: size_of::<MemplugHostRegionInfo>() as u32,
        ..Default::default()
    };
    ok(unsafe { memplug_host_region_info(r, &mut ri) });
    assert_eq!(ri.prefix_len, len);
    let bytes = unsafe { std::slice::from_raw_parts(ri.addr as usize as *const u8, len as usize) };
    assert!(bytes.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8 ^ 0x5a));
    assert_eq!((used(pa), used(pb)), (len, len), "mapping charges nothing");

    // Unoffered and malformed kinds; the out-struct untouched.
    let mut h2 = MemplugHostHandle::default();
    assert_eq!(
        unsafe { memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_DMABUF_FD, &mut h2) },
        MemplugHostStatus::Unsupported,
        "{}",
        last_error()
    );
    assert_eq!(h2, MemplugHostHandle::default());
    for bad in [0, MEMPLUG_HANDLE_MEMFD | MEMPLUG_HANDLE_DMABUF_FD, 1 << 20] {
        assert_eq!(
            unsafe { memplug_host_prefix_export_handle(prefix, bad, &mut h2) },
            MemplugHostStatus::InvalidArgument
        );
        assert!(last_error().contains("not one MEMPLUG_HANDLE_* bit"), "{}", last_error());
    }
    let mut short = MemplugHostHandle { struct_size: 16, ..Default::default() };
    assert_eq!(
        unsafe { memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD, &mut short) },
        MemplugHostStatus::InvalidArgument
    );
    assert!(last_error().contains("MemplugHostHandle: struct_size is 16"), "{}", last_error());
    assert_eq!(short.fd, -1);
    assert_eq!(
        unsafe { memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD, null_mut()) },
        MemplugHostStatus::NullArgument
    );
    // Malformed imports, refused before the plugin.
    let mut out = MemplugHostPrefix::default();
    let neg = MemplugHostHandle { kind: MEMPLUG_HANDLE_MEMFD, fd: -1, ..Default::default() };
    assert_eq!(
        unsafe { memplug_host_binding_import_prefix(bb, &neg, len, &mut out) },
        MemplugHostStatus::InvalidArgument
    );
    // A descriptor that is closed is the caller's mistake, not a shortage
    // of memory: INVALID_ARGUMENT, naming the fd.
    // (A number far above any open one: a descriptor closed here could be
    // reused at once by another test's thread.)
    let closed_fd = 900_001;
    let closed = MemplugHostHandle { kind: MEMPLUG_HANDLE_MEMFD, fd: closed_fd, ..Default::default() };
    assert_eq!(
        unsafe { memplug_host_binding_import_prefix(bb, &closed, len, &mut out) },
        MemplugHostStatus::InvalidArgument,
        "{}",
        last_error()
    );
    assert!(last_error().contains(&format!("fd {closed_fd}")), "{}", last_error());
    let blob = MemplugHostHandle { kind: MEMPLUG_HANDLE_VENDOR_BLOB, blob_len: 65, ..Default::default() };
    assert_eq!(
        unsafe { memplug_host_binding_import_prefix(bb, &blob, len, &mut out) },
        MemplugHostStatus::InvalidArgument
    );
    let short = MemplugHostHandle { struct_size: 8, ..Default::default() };
    assert_eq!(
        unsafe { memplug_host_binding_import_prefix(bb, &short, len, &mut out) },
        MemplugHostStatus::InvalidArgument
    );
    assert_eq!(
        unsafe { memplug_host_binding_import_prefix(bb, std::ptr::null(), len, &mut out) },
        MemplugHostStatus::NullArgument
    );
    assert_eq!(out.id, 0, "written only on success");
    assert_eq!((used(pa), used(pb)), (len, len));

    // Everything back: each pool refunded once.
    ok(memplug_host_region_free(r));
    ok(memplug_host_prefix_release(imported));
    assert_eq!((used(pa), used(pb)), (len, 0));
    ok(memplug_host_prefix_release(prefix));
    assert_eq!((used(pa), used(pb)), (0, 0));
    assert_eq!(
        unsafe { memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD, &mut h2) },
        MemplugHostStatus::StaleHandle
    );
    for b in [ba, bb] {
        ok(memplug_host_binding_destroy(b));
    }
    ok(memplug_host_manager_destroy(m));
}

struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    entered: AtomicBool,
}

unsafe extern "C" fn hold(ud: *mut c_void) {
    // SAFETY: the test's gate, alive until both streams drained.
    let g = unsafe { &*(ud as *const Gate) };
    g.entered.store(true, Ordering::SeqCst);
    let mut open = g.open.lock().unwrap();
    while !*open {
        open = g.cv.wait(open).unwrap();
    }
}

unsafe extern "C" fn mark(ud: *mut c_void) {
    // SAFETY: the test's flag, alive until the stream drained.
    unsafe { &*(ud as *const AtomicBool) }.store(true, Ordering::SeqCst);
}

fn query(f: MemplugHostFence) -> bool {
    let mut done = false;
    ok(unsafe { memplug_host_fence_query(f, &mut done) });
    done
}

#[test]
fn a_stream_ordered_behind_another_streams_fence_waits_for_it() {
    let (m, mech) = cpu();
    let (mut a, mut b) = (MemplugHostStream::default(), MemplugHostStream::default());
    ok(unsafe { memplug_host_stream_create(mech, &mut a) });
    ok(unsafe { memplug_host_stream_create(mech, &mut b) });
    let gate = Gate { open: Mutex::new(false), cv: Condvar::new(), entered: AtomicBool::new(false) };
    let ran = AtomicBool::new(false);
    ok(unsafe { memplug_host_stream_enqueue(a, Some(hold), &gate as *const Gate as *mut c_void) });
    let mut fa = MemplugHostFence::default();
    ok(unsafe { memplug_host_fence_record(a, &mut fa) });
    ok(memplug_host_stream_wait_fence(b, fa));
    // The caller's fence handle may go: the wait holds its own.
    ok(memplug_host_fence_release(fa));
    ok(unsafe { memplug_host_stream_enqueue(b, Some(mark), &ran as *const AtomicBool as *mut c_void) });
    let mut fb = MemplugHostFence::default();
    ok(unsafe { memplug_host_fence_record(b, &mut fb) });

    while !gate.entered.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(!query(fb), "B completed while A is held");
    assert!(!ran.load(Ordering::SeqCst), "B's work ran while A is held");

    *gate.open.lock().unwrap() = true;
    gate.cv.notify_all();
    let mut done = false;
    ok(unsafe { memplug_host_fence_wait(fb, 10_000_000_000, &mut done) });
    assert!(done && ran.load(Ordering::SeqCst));

    // Refusals: a runtime's fence, a stale one, the zero handle, another
    // manager's.
    unsafe extern "C" fn yes(_: *mut c_void) -> bool {
        true
    }
    let mut rf = MemplugHostFence::default();
    ok(unsafe {
        memplug_host_fence_from_callbacks(m, c"runtime".as_ptr(), Some(yes), None, None, null_mut(), &mut rf)
    });
    assert_eq!(memplug_host_stream_wait_fence(b, rf), MemplugHostStatus::InvalidArgument);
    assert!(last_error().contains("memplug_host_fence_from_callbacks"), "{}", last_error());
    assert_eq!(memplug_host_stream_wait_fence(b, fa), MemplugHostStatus::StaleHandle);
    assert_eq!(
        memplug_host_stream_wait_fence(b, MemplugHostFence::default()),
        MemplugHostStatus::InvalidHandle
    );
    let (m2, mech2) = cpu();
    let mut c = MemplugHostStream::default();
    ok(unsafe { memplug_host_stream_create(mech2, &mut c) });
    assert_eq!(memplug_host_stream_wait_fence(c, fb), MemplugHostStatus::WrongManager);
    ok(memplug_host_stream_destroy(c));
    ok(memplug_host_manager_destroy(m2));

    for f in [fb, rf] {
        ok(memplug_host_fence_release(f));
    }
    ok(memplug_host_stream_destroy(a));
    ok(memplug_host_stream_destroy(b));
    ok(memplug_host_manager_destroy(m));
}

#[test]
fn the_cpu_plugin_has_no_peer_access_and_says_so() {
    let (m, mech) = cpu();
    let caps = info(mech).capabilities;
    assert_eq!(caps & MEMPLUG_CAP_PEER_ACCESS, 0, "{caps:#x}");
    assert_ne!(
        caps & MEMPLUG_CAP_QUEUED_BINDING,
        0,
        "the CPU plugin queues its binding (ABI 1.2): {caps:#x}"
    );
    let mut access = 7u32;
    let peer = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 1 };
    assert_eq!(
        unsafe { memplug_host_mechanism_can_access_peer(mech, peer, &mut access) },
        MemplugHostStatus::Unsupported
    );
    let e = last_error();
    assert!(
        e.starts_with("memplug_host_mechanism_can_access_peer: ")
            && e.contains("no peer access (MEMPLUG_CAP_PEER_ACCESS"),
        "{e}"
    );
    assert_eq!(access, 7, "written only on success");
    assert_eq!(
        unsafe { memplug_host_mechanism_can_access_peer(mech, CPU0, null_mut()) },
        MemplugHostStatus::NullArgument
    );
    ok(memplug_host_mechanism_release(mech));
    assert_eq!(
        unsafe { memplug_host_mechanism_can_access_peer(mech, CPU0, &mut access) },
        MemplugHostStatus::StaleHandle
    );
    ok(memplug_host_manager_destroy(m));
}
