//! What the shim's tests share: the fake CUDA driver (the CUDA plugin's,
//! `plugins/cuda-vmm/fake-driver`), the built shim opened with `dlopen` as
//! torch opens it, and each scenario run in a child process of its own.
//!
//! Why children: the shim reads its configuration once per process, at
//! the first call, and keeps its manager for the life of the process (as
//! it must under torch). So each scenario — its own variables, its own
//! fresh shim — is this test binary run again with `--exact <scenario>
//! --ignored`; the scenarios are `#[ignore]`d so a plain run only starts
//! them through their parent test.

#![allow(dead_code)]

use memplug_test_support::{c_compiler, find_cdylib, run_tool, test_tmp_dir};
use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The built shim: `MEMPLUG_TORCH_SHIM`, or the one cargo built.
pub fn shim_path() -> PathBuf {
    find_cdylib("memplug_torch", "MEMPLUG_TORCH_SHIM")
}

/// Compiles the fake driver once per parent process; returns its path.
pub fn fake_driver() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/cuda-vmm/fake-driver/fake_cuda.c");
        let out = test_tmp_dir("fake-cuda").join("libcuda.so.1");
        let mut cmd = c_compiler(None);
        cmd.args(["-std=gnu11", "-O1", "-shared", "-fPIC", "-pthread", "-fvisibility=hidden"])
            .args(["-Wall", "-Wextra", "-Werror", "-Wl,-soname,libcuda.so.1"])
            .arg(&src)
            .arg("-o")
            .arg(&out);
        run_tool(cmd);
        out
    })
}

/// Runs scenario `name` (an `#[ignore]`d test of this binary) in a child
/// with the fake driver and `vars` (every other `MEMPLUG_TORCH_*` removed);
/// returns its stderr (the shim's messages) after asserting it passed.
pub fn run_scenario(name: &str, vars: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    cmd.args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"]);
    for (k, _) in std::env::vars() {
        if k.starts_with("MEMPLUG_TORCH_") && k != "MEMPLUG_TORCH_SHIM" {
            cmd.env_remove(k);
        }
    }
    cmd.env("MEMPLUG_CUDA_DRIVER", fake_driver())
        .env("MEMPLUG_FAKE_CUDA_DEVICES", "2")
        .env("MEMPLUG_FAKE_CUDA_MEM_MIB", "1024")
        .env("MEMPLUG_TORCH_TEST_SHIM", shim_path())
        .envs(vars.iter().copied());
    let out = cmd.output().expect("run the scenario");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "scenario {name} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    stderr.into_owned()
}

type AllocFn = unsafe extern "C" fn(isize, c_int, *mut c_void) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void, usize, c_int, *mut c_void);
type StatsFn = unsafe extern "C" fn(*mut c_char, usize, *mut usize) -> c_int;

/// The shim as torch sees it: the library and its two functions (plus the
/// statistics).
pub struct Shim {
    _lib: libloading::Library,
    alloc: AllocFn,
    free: FreeFn,
    stats: StatsFn,
}

impl Shim {
    /// Opens the shim named by the parent (in a scenario).
    pub fn open() -> Shim {
        let path = std::env::var_os("MEMPLUG_TORCH_TEST_SHIM").expect("run as a scenario (run_scenario)");
        // SAFETY: the shim's initialisers are Rust's (none of its own).
        let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen the shim");
        // SAFETY: the exported functions' types (src/lib.rs).
        unsafe {
            // The non-throwing twin: torch's `memplug_torch_alloc` throws a
            // C++ exception on refusal, which must not unwind into Rust.
            let alloc = *lib.get::<AllocFn>(b"memplug_torch_try_alloc").expect("alloc symbol");
            let free = *lib.get::<FreeFn>(b"memplug_torch_free").expect("free symbol");
            let stats = *lib.get::<StatsFn>(b"memplug_torch_stats_json").expect("stats symbol");
            Shim { _lib: lib, alloc, free, stats }
        }
    }

    /// `memplug_torch_note_stream(device, stream)`: 0, or -1 when refused.
    pub fn note_stream(&self, device: i32, stream: CuStream) -> c_int {
        type NoteFn = unsafe extern "C" fn(c_int, *mut c_void) -> c_int;
        // SAFETY: the export's type (src/lib.rs); a stream of the fake.
        unsafe { (*self._lib.get::<NoteFn>(b"memplug_torch_note_stream").unwrap())(device, stream.0) }
    }

    /// `memplug_torch_empty_cache()`: the bytes given back.
    pub fn empty_cache(&self) -> u64 {
        // SAFETY: the export's type (src/lib.rs).
        unsafe { (*self._lib.get::<unsafe extern "C" fn() -> u64>(b"memplug_torch_empty_cache").unwrap())() }
    }

    pub fn alloc(&self, size: isize, device: i32, stream: CuStream) -> u64 {
        // SAFETY: a stream of the fake (or NULL), as torch would pass.
        unsafe { (self.alloc)(size, device, stream.0) as u64 }
    }

    pub fn free(&self, ptr: u64, size: usize, device: i32, stream: CuStream) {
        // SAFETY: as `alloc`.
        unsafe { (self.free)(ptr as *mut c_void, size, device, stream.0) }
    }

    /// The raw buffer protocol: (status, written).
    pub fn stats_raw(&self, buf: &mut [u8]) -> (c_int, usize) {
        let mut written = usize::MAX;
        let p = if buf.is_empty() { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() };
        // SAFETY: `buf` has `len` bytes; `written` is a local.
        let st = unsafe { (self.stats)(p, buf.len(), &mut written) };
        (st, written)
    }

    /// The statistics, parsed. Figures may change between asking for the
    /// size and fetching the text (the reaper runs), so with room to spare
    /// and once more if it still grew.
    pub fn stats(&self) -> serde_json::Value {
        let (st, mut need) = self.stats_raw(&mut []);
        assert_eq!(st, 268, "asking for the size");
        loop {
            let mut buf = vec![0u8; need + 256];
            match self.stats_raw(&mut buf) {
                (0, len) => {
                    assert_eq!(buf[len], 0, "NUL-terminated");
                    return serde_json::from_slice(&buf[..len]).expect("statistics are JSON");
                }
                (268, n) => need = n,
                other => panic!("memplug_torch_stats_json: {other:?}"),
            }
        }
    }

    /// The shim's own figure `key`.
    pub fn figure(&self, key: &str) -> u64 {
        self.stats()["shim"][key].as_u64().unwrap_or_else(|| panic!("no figure {key}"))
    }

    /// Device 0's pool use.
    pub fn pool_used(&self) -> u64 {
        self.stats()["shim"]["devices"][0]["used"].as_u64().expect("device 0 open")
    }
}

/// A `CUstream` (NULL: the legacy default stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuStream(pub *mut c_void);
// SAFETY: a driver handle, usable from any thread.
unsafe impl Send for CuStream {}
unsafe impl Sync for CuStream {}

pub const LEGACY: CuStream = CuStream(std::ptr::null_mut());

/// The fake driver, opened by the path the plugin opened (the same library).
pub struct Fake {
    lib: libloading::Library,
}

type Cu = u32;

impl Fake {
    pub fn open() -> Fake {
        let path = std::env::var_os("MEMPLUG_CUDA_DRIVER").expect("run as a scenario");
        // SAFETY: the fake's initialisers are plain C.
        let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen the fake");
        let f = Fake { lib };
        // SAFETY: cuInit(0), and device 0's primary context made current
        // on this thread (the fake's streams are made in it).
        unsafe {
            assert_eq!(f.sym::<unsafe extern "C" fn(u32) -> Cu>("cuInit")(0), 0);
            let mut ctx = std::ptr::null_mut::<c_void>();
            let retain =
                f.sym::<unsafe extern "C" fn(*mut *mut c_void, c_int) -> Cu>("cuDevicePrimaryCtxRetain");
            assert_eq!(retain(&mut ctx, 0), 0);
            assert_eq!(f.sym::<unsafe extern "C" fn(*mut c_void) -> Cu>("cuCtxPushCurrent_v2")(ctx), 0);
        }
        f
    }

    /// # Safety
    /// `T` is the symbol's type.
    unsafe fn sym<T: Copy>(&self, name: &str) -> T {
        *self.lib.get::<T>(name.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// A new non-blocking stream (on the calling thread's context: the
    /// thread that opened the fake).
    pub fn stream(&self) -> CuStream {
        let mut s = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; flags 1 = CU_STREAM_NON_BLOCKING.
        let r = unsafe {
            self.sym::<unsafe extern "C" fn(*mut *mut c_void, u32) -> Cu>("cuStreamCreate")(&mut s, 1)
        };
        assert_eq!(r, 0, "cuStreamCreate");
        CuStream(s)
    }

    /// Holds `s` until the gate opens: later work on it (a fence) stays
    /// pending.
    pub fn block(&self, s: CuStream, gate: &'static Gate) {
        type HostFn = unsafe extern "C" fn(*mut c_void);
        unsafe extern "C" fn wait_gate(g: *mut c_void) {
            // SAFETY: a `&'static Gate` (below).
            let g = unsafe { &*(g as *const Gate) };
            let end = Instant::now() + Duration::from_secs(20);
            while !g.0.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let launch = unsafe {
            self.sym::<unsafe extern "C" fn(*mut c_void, HostFn, *mut c_void) -> Cu>("cuLaunchHostFunc")
        };
        // SAFETY: a live stream; the gate is static.
        let r = unsafe { launch(s.0, wait_gate, gate as *const Gate as *mut c_void) };
        assert_eq!(r, 0, "cuLaunchHostFunc");
    }

    pub fn synchronize(&self, s: CuStream) {
        // SAFETY: a live stream.
        let r = unsafe { self.sym::<unsafe extern "C" fn(*mut c_void) -> Cu>("cuStreamSynchronize")(s.0) };
        assert_eq!(r, 0, "cuStreamSynchronize");
    }

    /// Device memory read back through the driver.
    pub fn read(&self, ptr: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: `out` has `len` bytes.
        let r = unsafe {
            self.sym::<unsafe extern "C" fn(*mut c_void, u64, usize) -> Cu>("cuMemcpyDtoH_v2")(
                out.as_mut_ptr().cast(),
                ptr,
                len,
            )
        };
        assert_eq!(r, 0, "cuMemcpyDtoH");
        out
    }

    /// Bytes the fake holds for device `dev`'s allocations.
    pub fn used_bytes(&self, dev: i32) -> u64 {
        // SAFETY: the fake's inspection function.
        unsafe { self.sym::<unsafe extern "C" fn(c_int) -> u64>("fake_cuda_used_bytes")(dev) }
    }
}

/// Opens once; host functions blocked on it return.
pub struct Gate(pub std::sync::atomic::AtomicBool);

impl Gate {
    pub const fn new() -> Gate {
        Gate(std::sync::atomic::AtomicBool::new(false))
    }
    pub fn open(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Waits up to 5 s for `cond`.
#[track_caller]
/// Opens the device (and adopts `stream`) with a block allocated and freed
/// on `stream` without the cache, and returns the driver's use once that
/// block is back in the driver. The shim's charge goes back when the
/// plugin takes the block, the driver's memory later, from the plugin's
/// freer thread: a baseline read between the two would count the block.
pub fn warm_up_plain(shim: &Shim, fake: &Fake, stream: CuStream) -> u64 {
    let warm = shim.alloc(4096, 0, stream);
    assert_ne!(warm, 0, "the warm-up allocation");
    let with_warm = fake.used_bytes(0);
    shim.free(warm, 4096, 0, stream);
    eventually("the warm-up block's charge refunded", || shim.pool_used() == 0);
    eventually("the warm-up block back in the driver", || fake.used_bytes(0) < with_warm);
    fake.used_bytes(0)
}

pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}
