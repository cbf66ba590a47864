//! Shared by the CUDA plugin's tests and benches.
//!
//! Two modes:
//! * **fake** (the default, and CI's): the fake driver in `fake-driver/` is
//!   compiled with the system C compiler and the plugin is pointed at it
//!   with `MEMPLUG_CUDA_DRIVER`; tests may look inside it (context
//!   reference counts, live driver objects, bytes in use).
//! * **real** (`MEMPLUG_CUDA_TEST_REAL=1`, set by `device-check.sh`): the
//!   system's driver and GPU; nothing is compiled, fake-only checks are
//!   skipped.
//!
//! Isolation: every [`load`] opens a private copy of the plugin library (a
//! test that fails with objects alive leaves its copy loaded, with its own
//! state, and the next test gets a fresh one), and [`serial`] takes the
//! fake driver's counts as the test's baseline, so the quiescence checks
//! compare against what this test found, not against zero: one failure
//! cannot cascade into every later test. The guard [`serial`] returns
//! reports, on a panic, what the failing test left behind.
//!
//! `MEMPLUG_FAKE_CUDA_NO_READ_ONLY=1` (fake mode) makes the fake refuse
//! read-only access; the tests then take the read-write fallback
//! ([`map_read_only_or_fallback`]) and say so.
//!
//! `MEMPLUG_FAKE_CUDA_FAIL_CREATE_AT=k` (fake mode) chooses the step at
//! which the rollback tests (`tests/driver_rules.rs`) fail `cuMemCreate`
//! ([`fail_create_mode`]); [`setup`] takes it out of the environment of
//! the test processes themselves, whose other tests expect their memory
//! (the fake would fail the k-th `cuMemCreate` of the process, in whichever
//! test that happens to be), and the rollback tests hand it to the fake of
//! a child process explicitly.
//!
//! Data is always moved with driver copies (`cuMemcpy*`), never by
//! dereferencing device addresses, so the same tests run on both.

#![allow(dead_code)]

use memplug_host::{Access, PhysicalObject, Reservation, SharedMappingApi, Status};
use memplug_host::{LoadOptions, Mechanism, Plugin};
use memplug_plugin_cuda_vmm::driver::{self, CUcontext, CUdevice, Driver, CUDA_SUCCESS};
use memplug_test_support::{c_compiler, find_cdylib, run_tool, test_tmp_dir};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

/// The granularity of the fake driver.
pub const FAKE_GRANULARITY: u64 = 2 << 20;

/// Whether the tests run against the real driver.
pub fn real() -> bool {
    std::env::var("MEMPLUG_CUDA_TEST_REAL").as_deref() == Ok("1")
}

/// The plugin library: `MEMPLUG_CUDA_PLUGIN`, or the one cargo built.
pub fn plugin_path() -> PathBuf {
    find_cdylib("memplug_plugin_cuda_vmm", "MEMPLUG_CUDA_PLUGIN")
}

/// Compiles a variant of the fake driver (with `defines`) into a folder of
/// its own, as `libcuda.so.1` with a `libcuda.so` link beside it; returns
/// the folder.
pub fn build_fake(variant: &str, defines: &[&str]) -> PathBuf {
    let dir = test_tmp_dir(&format!("fake-cuda-{variant}"));
    build_fake_into(&dir, "libcuda.so.1", defines);
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).expect("symlink libcuda.so");
    dir
}

/// Compiles a variant of the fake driver (with `defines`) as `dir/file`
/// (soname `libcuda.so.1`, like the real driver and its stub).
pub fn build_fake_into(dir: &Path, file: &str, defines: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fake-driver/fake_cuda.c");
    let out = dir.join(file);
    let mut cmd = c_compiler(None);
    cmd.args([
        "-std=gnu11",
        "-O1",
        "-shared",
        "-fPIC",
        "-pthread",
        "-fvisibility=hidden",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wl,-soname,libcuda.so.1",
    ])
    .args(defines)
    .arg(&src)
    .arg("-o")
    .arg(&out);
    run_tool(cmd);
}

/// Readies this process: in fake mode builds the fake and points the
/// plugin (and the raw driver calls of the tests) at it, with two devices
/// unless the caller chose otherwise. Idempotent.
pub fn setup() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        if real() {
            return;
        }
        // The rollback tests' step (see the module docs): kept here, out
        // of this process's environment (a child is handed it explicitly).
        if !is_child() {
            if let Some(k) = std::env::var_os(FAIL_CREATE_ENV) {
                let _ =
                    FAIL_CREATE_MODE.set(k.to_str().and_then(|k| k.trim().parse().ok()).filter(|&k| k > 0));
                std::env::remove_var(FAIL_CREATE_ENV);
            }
        }
        let lib = build_fake("default", &[]).join("libcuda.so.1");
        // Before any thread of this process reads the environment for the
        // driver: the first load happens after this returns.
        std::env::set_var(driver::DRIVER_ENV, &lib);
        if std::env::var_os("MEMPLUG_FAKE_CUDA_DEVICES").is_none() {
            std::env::set_var("MEMPLUG_FAKE_CUDA_DEVICES", "2");
        }
    });
}

/// The fake's switch that fails a `cuMemCreate` (see the module docs).
pub const FAIL_CREATE_ENV: &str = "MEMPLUG_FAKE_CUDA_FAIL_CREATE_AT";
static FAIL_CREATE_MODE: OnceLock<Option<u64>> = OnceLock::new();

/// The step `MEMPLUG_FAKE_CUDA_FAIL_CREATE_AT` named for this run (taken
/// out of the environment by [`setup`]); `None` without it.
pub fn fail_create_mode() -> Option<u64> {
    setup();
    FAIL_CREATE_MODE.get().copied().flatten()
}

/// The fake driver's counts when a test began (all zero in real mode and in
/// child processes that take no [`serial`] guard).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Baseline {
    pub objects: i64,
    pub streams: i64,
    pub events: i64,
    pub ctx_refs: [i32; 2],
    pub host_allocs: i64,
}

static BASELINE: Mutex<Baseline> =
    Mutex::new(Baseline { objects: 0, streams: 0, events: 0, ctx_refs: [0, 0], host_allocs: 0 });

fn current_counts() -> Baseline {
    match fake_live_objects() {
        None => Baseline::default(),
        Some(objects) => Baseline {
            objects,
            streams: fake_live_streams().unwrap(),
            events: fake_live_events().unwrap(),
            ctx_refs: [fake_ctx_refs(0).unwrap(), fake_ctx_refs(1).unwrap()],
            host_allocs: fake_live_host_allocs().unwrap_or(0),
        },
    }
}

/// The running test's baseline.
pub fn baseline() -> Baseline {
    *BASELINE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Held for a test's duration (see [`serial`]).
pub struct TestGuard {
    _lock: MutexGuard<'static, ()>,
}

impl Drop for TestGuard {
    fn drop(&mut self) {
        // Runs on a panic too: say what the failing test left; the next test
        // takes its own baseline and its own plugin copy, so it is not
        // affected.
        if std::thread::panicking() && !real() {
            let (b, now) = (baseline(), current_counts());
            if b != now {
                eprintln!(
                    "NOTE: the failing test left the fake driver at {now:?} (it began at {b:?}); its plugin \
                     copy stays loaded; later tests compare against their own baseline"
                );
            }
        }
    }
}

/// Serialises the tests of one binary (the fake driver's counts are per
/// process) and records the driver's counts as this test's baseline.
pub fn serial() -> TestGuard {
    static LOCK: Mutex<()> = Mutex::new(());
    let lock = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    setup();
    *BASELINE.lock().unwrap_or_else(PoisonError::into_inner) = current_counts();
    TestGuard { _lock: lock }
}

/// Loads a private copy of the plugin (after [`setup`]): a library opened
/// twice by one path is one library, and one left loaded by a failed test
/// (a plugin with live objects is never closed) would hand its state to the
/// next.
pub fn load() -> Plugin {
    load_with(&LoadOptions::default())
}

/// [`load`] with `opts` (a host speaking an older minor, say).
pub fn load_with(opts: &LoadOptions) -> Plugin {
    load_private(opts, false).0
}

/// [`load_with`], and the same private copy opened again with `libloading`
/// before its file goes: `dlopen` of a loaded file hands back the same
/// library, so its `memplug_plugin_v1` serves the plugin instance the host
/// holds (a second, raw host of it).
pub fn load_with_same(opts: &LoadOptions) -> (Plugin, libloading::Library) {
    let (p, same) = load_private(opts, true);
    (p, same.expect("opened"))
}

fn load_private(opts: &LoadOptions, reopen: bool) -> (Plugin, Option<libloading::Library>) {
    setup();
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let src = plugin_path();
    let dir = test_tmp_dir(&format!("cuda-plugin-{}-{n}", std::process::id()));
    let dst = dir.join(format!("libmemplug_plugin_cuda_vmm_{n}.so"));
    std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {} to {}: {e}", src.display(), dst.display()));
    let p = Plugin::load_with(&dst, opts).unwrap_or_else(|e| panic!("the CUDA plugin did not load: {e}"));
    // SAFETY: the library the host just loaded (its initialisers ran).
    let same =
        reopen.then(|| unsafe { libloading::Library::new(&dst) }.expect("dlopen the loaded copy again"));
    // The mapping stays; the file is not needed once loaded.
    let _ = std::fs::remove_dir_all(&dir);
    (p, same)
}

/// Whether the fake was told to refuse read-only access
/// (`MEMPLUG_FAKE_CUDA_NO_READ_ONLY`, read at its first `cuInit`).
pub fn no_read_only_env() -> bool {
    !real() && std::env::var("MEMPLUG_FAKE_CUDA_NO_READ_ONLY").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Maps `len` bytes of `obj` at `offset` read-only into `res` at `at`; when
/// the driver refuses read-only access (`UNSUPPORTED`) it asserts the
/// refusal left the range unmapped, prints a note and maps it read-write
/// instead (the host's `Region::map_prefix` fallback). Returns the access
/// the range got.
#[track_caller]
pub fn map_read_only_or_fallback(
    sm: &SharedMappingApi<'_>,
    obj: &PhysicalObject,
    offset: u64,
    res: &Reservation,
    at: u64,
    len: u64,
) -> Access {
    match sm.map(obj, offset, res, at, len, Access::ReadOnly) {
        Ok(()) => Access::ReadOnly,
        Err(e) if e.status == Status::Unsupported => {
            assert!(e.message.contains("read-only"), "{e}");
            println!("NOTE: read-only mapping refused ({e}); mapping read-write instead");
            // The refusal left nothing mapped there: the same range maps.
            sm.map(obj, offset, res, at, len, Access::ReadWrite)
                .unwrap_or_else(|e| panic!("the read-write fallback failed: {e}"));
            Access::ReadWrite
        }
        Err(e) => panic!("read-only map: {e}"),
    }
}

/// The mechanism of device 0.
pub fn cuda0(p: &Plugin) -> Mechanism {
    p.mechanism("cuda0-vmm").unwrap_or_else(|| panic!("no cuda0-vmm in {:?}", p.mechanisms())).clone()
}

/// The driver the plugin uses, reached through the plugin crate's own copy
/// of the loader (same library, same process).
pub fn drv() -> &'static Driver {
    setup();
    driver::driver().unwrap_or_else(|e| panic!("driver: {e}"))
}

/// Runs `f` with device `ordinal`'s primary context current, retained for
/// the call only.
pub fn in_context<R>(ordinal: u32, f: impl FnOnce(&'static Driver) -> R) -> R {
    let d = drv();
    let dev: CUdevice = d.devices[ordinal as usize].device;
    let mut ctx: CUcontext = std::ptr::null_mut();
    unsafe {
        assert_eq!((d.api.primary_ctx_retain)(&mut ctx, dev), CUDA_SUCCESS);
        assert_eq!((d.api.ctx_push)(ctx), CUDA_SUCCESS);
    }
    let r = f(d);
    // After a sticky fault (`f` may cause one: a write through a read-only
    // view) pop and release may answer the fault, as a real driver may;
    // they still pop and release.
    let ok = |c: memplug_plugin_cuda_vmm::driver::CuResult| {
        c == CUDA_SUCCESS || memplug_plugin_cuda_vmm::driver::is_sticky(c)
    };
    unsafe {
        let mut popped: CUcontext = std::ptr::null_mut();
        let c = (d.api.ctx_pop)(&mut popped);
        assert!(ok(c), "cuCtxPopCurrent: {c}");
        let c = (d.api.primary_ctx_release)(dev);
        assert!(ok(c), "cuDevicePrimaryCtxRelease: {c}");
    }
    r
}

/// Copies `data` to device address `addr`; the driver's status on failure.
pub fn write(addr: u64, data: &[u8]) -> Result<(), u32> {
    in_context(0, |d| {
        let r = unsafe { (d.api.memcpy_htod)(addr, data.as_ptr().cast::<c_void>(), data.len()) };
        let r = if r == CUDA_SUCCESS { unsafe { (d.api.ctx_synchronize)() } } else { r };
        if r == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(r)
        }
    })
}

/// Reads `len` bytes from device address `addr`.
pub fn read(addr: u64, len: usize) -> Vec<u8> {
    in_context(0, |d| {
        let mut v = vec![0u8; len];
        let r = unsafe { (d.api.memcpy_dtoh)(v.as_mut_ptr().cast::<c_void>(), addr, len) };
        assert_eq!(r, CUDA_SUCCESS, "cuMemcpyDtoH of {len} bytes at {addr:#x}: {}", d.error_name(r));
        v
    })
}

/// Writes a little pattern, distinct per `seed`, at `addr`.
pub fn stamp(addr: u64, seed: u8) {
    let data: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7).wrapping_add(seed)).collect();
    write(addr, &data).expect("write to committed memory");
}

/// Whether the pattern of `seed` is at `addr`.
pub fn has_stamp(addr: u64, seed: u8) -> bool {
    let data: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7).wrapping_add(seed)).collect();
    read(addr, 64) == data
}

/// A function of the fake driver's introspection API (`None` in real mode).
fn fake_fn<T: Copy>(name: &str) -> Option<T> {
    if real() {
        return None;
    }
    let p = drv().symbol(name)?;
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function pointer type of that fake symbol.
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

/// References the fake holds on device `dev`'s primary context.
pub fn fake_ctx_refs(dev: i32) -> Option<i32> {
    fake_fn::<unsafe extern "C" fn(i32) -> i32>("fake_cuda_primary_ctx_refs").map(|f| unsafe { f(dev) })
}

/// `cuDevicePrimaryCtxRetain` and `cuDevicePrimaryCtxRelease` calls made
/// for `dev` so far, in the fake.
pub fn fake_ctx_calls(dev: i32) -> Option<(i64, i64)> {
    fake_fn::<unsafe extern "C" fn(i32, i32) -> i64>("fake_cuda_primary_ctx_calls")
        .map(|f| unsafe { (f(dev, 0), f(dev, 1)) })
}

/// The access (`PROT_*` bits) the fake says device `dev` has to the
/// mapping at `ptr`: the owner's mprotect, or what a peer was given; -1
/// where nothing is mapped.
pub fn fake_access_of(ptr: u64, dev: i32) -> Option<i32> {
    fake_fn::<unsafe extern "C" fn(u64, i32) -> i32>("fake_cuda_access_of").map(|f| unsafe { f(ptr, dev) })
}

/// `cuMemCreate` calls the fake took with `gpuDirectRDMACapable` set.
pub fn fake_rdma_creates() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_rdma_creates").map(|f| unsafe { f() })
}

/// Bytes of physical memory in use on `dev` in the fake.
pub fn fake_used(dev: i32) -> Option<u64> {
    fake_fn::<unsafe extern "C" fn(i32) -> u64>("fake_cuda_used_bytes").map(|f| unsafe { f(dev) })
}

/// Driver objects alive in the fake (allocations, reservations, physical
/// objects, mappings, streams, events).
pub fn fake_live_objects() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_live_objects").map(|f| unsafe { f() })
}

/// Driver calls the fake has answered so far.
pub fn fake_calls() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_calls").map(|f| unsafe { f() })
}

/// Makes the fake's contexts sticky-faulted with `code` (every later call
/// fails with it).
pub fn fake_sticky_fault(code: u32) {
    let f = fake_fn::<unsafe extern "C" fn(u32)>("fake_cuda_sticky_fault").expect("fake mode");
    unsafe { f(code) }
}

/// `fake_cuda_inject_sticky_fault(code)`: the fake's contexts are dead
/// from now on (every later call but the context-stack ones returns
/// `code`); returns the sticky code in force before (0: none).
pub fn fake_inject_sticky_fault(code: i32) -> i32 {
    let f = fake_fn::<unsafe extern "C" fn(i32) -> i32>("fake_cuda_inject_sticky_fault").expect("fake mode");
    unsafe { f(code) }
}

/// The sticky code in force in the fake (0: none).
pub fn fake_sticky_code() -> i32 {
    let f = fake_fn::<unsafe extern "C" fn() -> i32>("fake_cuda_sticky_code").expect("fake mode");
    unsafe { f() }
}

/// The mechanism of device 1.
pub fn cuda1(p: &Plugin) -> Mechanism {
    p.mechanism("cuda1-vmm").unwrap_or_else(|| panic!("no cuda1-vmm in {:?}", p.mechanisms())).clone()
}

/// The pinned host memory mechanism of device `ordinal`.
pub fn cuda_host(p: &Plugin, ordinal: u32) -> Mechanism {
    let name = format!("cuda{ordinal}-host");
    p.mechanism(&name).unwrap_or_else(|| panic!("no {name} in {:?}", p.mechanisms())).clone()
}

/// The device mechanisms (`cuda<N>-vmm`), in ordinal order.
pub fn device_mechanisms(p: &Plugin) -> Vec<Mechanism> {
    p.mechanisms()
        .iter()
        .filter(|m| m.device().0.kind == memplug_sdk::abi::MEMPLUG_DEVICE_CUDA)
        .cloned()
        .collect()
}

/// Live pinned host blocks in the fake (`cuMemHostAlloc` not yet freed).
pub fn fake_live_host_allocs() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_live_host_allocs").map(|f| unsafe { f() })
}

/// The `cuMemHostAlloc` flags of the live pinned block holding `ptr` in
/// the fake (-1: none holds it).
pub fn fake_host_alloc_flags(ptr: u64) -> Option<i64> {
    fake_fn::<unsafe extern "C" fn(u64) -> i64>("fake_cuda_host_alloc_flags").map(|f| unsafe { f(ptr) })
}

/// Asserts that `probe`, a deliberate bad access made straight through the
/// driver, fails; in fake mode it must fail with the sticky
/// CUDA_ERROR_ILLEGAL_ADDRESS, which is then cleared (a real process would
/// have to end) so the test can go on.
#[track_caller]
pub fn assert_bad_access(probe: impl FnOnce() -> Result<(), u32>, what: &str) {
    let r = probe();
    assert!(r.is_err(), "{what}: the access went through");
    if let Some(clear) = fake_fn::<unsafe extern "C" fn()>("fake_cuda_clear_sticky") {
        assert_eq!(r, Err(700), "{what}: the fake reports a bad access as sticky ILLEGAL_ADDRESS");
        unsafe { clear() };
    }
}

/// Streams alive in the fake.
pub fn fake_live_streams() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_live_streams").map(|f| unsafe { f() })
}

/// Asserts nothing is left of this test's plugin: it reports no live
/// object, and (fake mode, counted from the test's [`baseline`]) each
/// primary context is retained at most once more (by the plugin, which
/// keeps it until it is unloaded) and the driver holds nothing more but the
/// plugin's zero-fill stream and its pool of at most `EVENT_POOL_MAX`
/// events of each retained context.
#[track_caller]
pub fn assert_quiescent(p: &Plugin) {
    assert_eq!(p.plugin_live_objects(), 0, "plugin live objects: {}", p.live_report());
    if let Some(n) = fake_live_objects() {
        let b = baseline();
        let mut retained = 0;
        for dev in 0..2 {
            let refs = fake_ctx_refs(dev).unwrap() - b.ctx_refs[dev as usize];
            assert!(
                refs <= 1,
                "primary context of device {dev} retained {refs} more times with nothing alive"
            );
            retained += i64::from(refs);
        }
        let streams = fake_live_streams().unwrap() - b.streams;
        assert!(streams <= retained, "{streams} streams left for {retained} retained contexts");
        let pooled = fake_live_events().unwrap() - b.events;
        let pool_max = memplug_plugin_cuda_vmm::EVENT_POOL_MAX as i64;
        assert!(
            (0..=retained * pool_max).contains(&pooled),
            "{pooled} events left for {retained} retained contexts (a pool holds at most {pool_max})"
        );
        // Page-locked staging chunks of pageable copies stay pooled until
        // unload (`staging.rs`); the tests run one copy at a time.
        let staged = || fake_live_host_allocs().unwrap_or(0) - b.host_allocs;
        let left = || fake_live_objects().unwrap() - b.objects - streams - pooled - staged();
        let _ = n;
        eventually("the frees handed to the plugin's freer reach the driver", || left() == 0);
        let ring = memplug_plugin_cuda_vmm::STAGING_RING as i64;
        assert!(
            (0..=2 * ring).contains(&staged()),
            "{} staging chunks pooled (one copy uses {ring})",
            staged()
        );
    }
}

/// Waits, checking every millisecond for up to 20 s, until `cond` holds
/// (a bound against hanging, not a timing claim: e.g. the plugin frees on
/// its freer thread, so the fake's counts follow a deallocate a moment
/// later), and fails naming `what` if it never does.
#[track_caller]
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never happened within 20 s: {what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Unloads `p` (nothing may be alive) and asserts (fake mode) that no
/// primary context is retained any more.
#[track_caller]
pub fn unload_released(p: Plugin) {
    assert_quiescent(&p);
    p.unload().unwrap();
    let b = baseline();
    for dev in 0..2 {
        if let Some(refs) = fake_ctx_refs(dev) {
            assert_eq!(
                refs, b.ctx_refs[dev as usize],
                "primary context of device {dev} still retained after unload"
            );
        }
    }
    if let Some(n) = fake_live_objects() {
        assert_eq!(n, b.objects, "objects left in the (fake) driver after unload");
    }
}

/// Runs the ignored test `name` of this test binary in a child process with
/// `env` changes (`None` removes a variable). The child's output comes
/// back; it is asserted to have exited normally (no panic, no abort).
pub fn run_child(name: &str, env: &[(&str, Option<&std::ffi::OsStr>)]) -> Output {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("MEMPLUG_CUDA_CHILD", "1")
        .env("MEMPLUG_CUDA_PLUGIN", plugin_path());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().expect("spawn child test");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child {name} did not exit cleanly ({}):\n{text}", out.status);
    assert!(text.contains("1 passed"), "child {name} ran no test:\n{text}");
    out
}

/// Whether this process is a child started by [`run_child`].
pub fn is_child() -> bool {
    std::env::var_os("MEMPLUG_CUDA_CHILD").is_some()
}

/// Events alive in the fake (the plugin's pool included).
pub fn fake_live_events() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_live_events").map(|f| unsafe { f() })
}

/// Calls the fake answered so far to the entry point `name` (one of the
/// counted ones: `cuMemCreate`, `cuMemUnmap`, `cuEventCreate`, …).
pub fn fake_entry_calls(name: &str) -> Option<i64> {
    let f = fake_fn::<unsafe extern "C" fn(*const std::ffi::c_char) -> i64>("fake_cuda_entry_calls")?;
    let c = std::ffi::CString::new(name).unwrap();
    let n = unsafe { f(c.as_ptr()) };
    assert!(n >= 0, "the fake does not count {name}");
    Some(n)
}

/// Makes the next call of the entry point `name` wait inside the fake
/// until [`fake_release_blocked`].
pub fn fake_block_next_call(name: &str) {
    let f = fake_fn::<unsafe extern "C" fn(*const std::ffi::c_char) -> i32>("fake_cuda_block_next_call")
        .expect("fake mode");
    let c = std::ffi::CString::new(name).unwrap();
    assert_eq!(unsafe { f(c.as_ptr()) }, 0, "the fake cannot block {name}");
}

/// Waits (up to `timeout_ms`) until `n` calls are held by the fake's hook;
/// how many are.
pub fn fake_wait_blocked(n: i32, timeout_ms: i32) -> i32 {
    let f = fake_fn::<unsafe extern "C" fn(i32, i32) -> i32>("fake_cuda_wait_blocked").expect("fake mode");
    unsafe { f(n, timeout_ms) }
}

/// Lets every call held by the fake's hook go on.
pub fn fake_release_blocked() {
    let f = fake_fn::<unsafe extern "C" fn()>("fake_cuda_release_blocked").expect("fake mode");
    unsafe { f() }
}

/// Makes the k-th `cuMemCreate` from now fail with OUT_OF_MEMORY (0
/// disarms); the calls made so far.
pub fn fake_fail_create_at(k: i64) -> i64 {
    let f = fake_fn::<unsafe extern "C" fn(i64) -> i64>("fake_cuda_fail_create_at").expect("fake mode");
    unsafe { f(k) }
}

/// `cuMemCreate` calls failed on purpose so far.
pub fn fake_create_failures() -> i64 {
    let f = fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_create_failures").expect("fake mode");
    unsafe { f() }
}

/// Makes the fake's `cuMemUnmap` take one mapping per call (or not); the
/// previous setting.
pub fn fake_set_unmap_one_mapping(on: bool) -> bool {
    let f =
        fake_fn::<unsafe extern "C" fn(i32) -> i32>("fake_cuda_set_unmap_one_mapping").expect("fake mode");
    unsafe { f(i32::from(on)) != 0 }
}

/// `cuMemsetD8Async` calls on streams of `priority`.
pub fn fake_memsets_at_priority(priority: i32) -> i64 {
    let f = fake_fn::<unsafe extern "C" fn(i32) -> i64>("fake_cuda_memsets_at_priority").expect("fake mode");
    unsafe { f(priority) }
}

/// `cuEventSynchronize` calls on blocking-sync events (`true`) or others.
pub fn fake_event_syncs(blocking: bool) -> i64 {
    let f = fake_fn::<unsafe extern "C" fn(i32) -> i64>("fake_cuda_event_syncs").expect("fake mode");
    unsafe { f(i32::from(blocking)) }
}

/// Threads inside the fake's `cuEventSynchronize` now.
pub fn fake_threads_in_event_sync() -> i64 {
    let f = fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_threads_in_event_sync").expect("fake mode");
    unsafe { f() }
}

/// Driver calls the fake refused because a host function made them.
pub fn fake_callback_refused() -> i64 {
    let f = fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_callback_refused").expect("fake mode");
    unsafe { f() }
}

/// Device memory a live context takes off the fake's free figure.
pub fn fake_ctx_overhead() -> u64 {
    let f = fake_fn::<unsafe extern "C" fn() -> u64>("fake_cuda_ctx_overhead_bytes").expect("fake mode");
    unsafe { f() }
}

/// `cuMemcpyAsync` calls the fake made wait because a side was pageable
/// host memory (`None` in real mode).
pub fn fake_pageable_copies() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_pageable_copies").map(|f| unsafe { f() })
}

/// `cuMemFree`/`cuMemFreeHost` calls that synchronised the device in the
/// fake (`None` in real mode).
pub fn fake_free_syncs() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_free_syncs").map(|f| unsafe { f() })
}

/// Operations the fake recorded into a graph instead of running (`None`
/// in real mode).
pub fn fake_captured_ops() -> Option<i64> {
    fake_fn::<unsafe extern "C" fn() -> i64>("fake_cuda_captured_ops").map(|f| unsafe { f() })
}

/// A driver entry point by name, typed `T` (a function pointer), from the
/// library the plugin uses (the real driver or the fake).
pub fn driver_entry<T: Copy>(name: &str) -> T {
    let p = drv().symbol(name).unwrap_or_else(|| panic!("the driver has no {name}"));
    assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function pointer type of that entry point.
    unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) }
}
