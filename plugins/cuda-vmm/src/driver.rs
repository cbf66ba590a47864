//! The CUDA driver: found once, checked once, then called through a table
//! of entry points.
//!
//! **Finding it.** `MEMPLUG_CUDA_DRIVER=/path/to/libcuda.so.1` names the
//! library to use (tests point it at the fake in `fake-driver/`). Without
//! it, the dynamic loader's search path (so `LD_LIBRARY_PATH` applies) is
//! tried for `libcuda.so.1` first (the driver's ABI name), then `libcuda.so`
//! (which may be the CUDA toolkit's *stub*), then the other names cudarc
//! knows. A candidate whose `cuInit` answers `CUDA_ERROR_STUB_LIBRARY` (34)
//! is closed and the next one tried, so a stub on the path never hides the
//! real driver. The file actually loaded (`dladdr`) is `Driver::loaded_path`
//! and is in the plugin's version string.
//!
//! **Why a table.** cudarc's `sys` functions resolve each symbol on first
//! use and panic when the library or the symbol is missing; its `CUresult`
//! is a Rust enum, so a status code newer than the bindings would be an
//! invalid value. Here every entry point the plugin uses is resolved at
//! load, typed with cudarc's `sys` structs but with a plain `u32` result: a
//! missing symbol is a clear `DEVICE_UNAVAILABLE` at load, and no driver
//! call can panic. Loading runs inside `catch_unwind` once, and its answer
//! is cached for the process.
//!
//! This module is public (hidden from the docs) so that tests and benches
//! can make raw driver calls through the very library the plugin uses.

use cudarc::driver::sys as cu;
use memplug_sdk::{PluginError, PluginResult, Status};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

pub use cu::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUhostFn, CUmemAccessDesc, CUmemAllocationProp,
    CUmemGenericAllocationHandle, CUstream,
};

/// A raw `CUresult`: kept as a number, so codes newer than cudarc's
/// bindings are still just numbers.
pub type CuResult = u32;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
/// `CUDA_ERROR_NOT_READY`: what `cuEventQuery` says of a pending event.
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const CUDA_ERROR_NOT_SUPPORTED: CuResult = 801;

/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
const ATTR_VMM_SUPPORTED: c_uint = 102;
/// `CU_STREAM_NON_BLOCKING`.
pub const STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const EVENT_DISABLE_TIMING: c_uint = 2;
/// `CU_EVENT_BLOCKING_SYNC`: `cuEventSynchronize` puts the thread to sleep
/// until the event completes instead of spinning.
pub const EVENT_BLOCKING_SYNC: c_uint = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
const GRANULARITY_MINIMUM: c_uint = 0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub(crate) const GRANULARITY_RECOMMENDED: c_uint = 1;

/// The environment variable that names the driver library to use.
pub const DRIVER_ENV: &str = "MEMPLUG_CUDA_DRIVER";

macro_rules! entry_points {
    ($(#[$doc:meta])* $name:ident { $( $field:ident = $sym:literal ($($arg:ty),*); )* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        #[allow(missing_docs)]
        pub struct $name {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
        }

        impl $name {
            /// Every entry point, or the names of those the library lacks.
            fn resolve(find: &dyn Fn(&str) -> Option<*mut c_void>) -> Result<Self, Vec<&'static str>> {
                let mut missing = Vec::new();
                $(
                    let $field = find($sym);
                    if $field.is_none() {
                        missing.push($sym);
                    }
                )*
                if !missing.is_empty() {
                    return Err(missing);
                }
                // SAFETY: each symbol is the driver entry point of that name,
                // whose C signature is the one written here.
                Ok(unsafe {
                    $name {
                        $( $field: std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(
                            $field.unwrap_or(std::ptr::null_mut()),
                        ), )*
                    }
                })
            }
        }
    };
}

entry_points! {
    /// The entry points every mechanism needs (all present since CUDA 10;
    /// stream priorities since 5.5).
    Core {
        init = "cuInit"(c_uint);
        driver_get_version = "cuDriverGetVersion"(*mut c_int);
        device_get_count = "cuDeviceGetCount"(*mut c_int);
        device_get = "cuDeviceGet"(*mut CUdevice, c_int);
        device_get_attribute = "cuDeviceGetAttribute"(*mut c_int, c_uint, CUdevice);
        device_get_name = "cuDeviceGetName"(*mut c_char, c_int, CUdevice);
        get_error_name = "cuGetErrorName"(CuResult, *mut *const c_char);
        primary_ctx_retain = "cuDevicePrimaryCtxRetain"(*mut CUcontext, CUdevice);
        primary_ctx_release = "cuDevicePrimaryCtxRelease_v2"(CUdevice);
        ctx_push = "cuCtxPushCurrent_v2"(CUcontext);
        ctx_pop = "cuCtxPopCurrent_v2"(*mut CUcontext);
        ctx_get_current = "cuCtxGetCurrent"(*mut CUcontext);
        ctx_get_device = "cuCtxGetDevice"(*mut CUdevice);
        ctx_synchronize = "cuCtxSynchronize"();
        mem_alloc = "cuMemAlloc_v2"(*mut CUdeviceptr, usize);
        mem_free = "cuMemFree_v2"(CUdeviceptr);
        mem_get_info = "cuMemGetInfo_v2"(*mut usize, *mut usize);
        memcpy_htod = "cuMemcpyHtoD_v2"(CUdeviceptr, *const c_void, usize);
        memcpy_dtoh = "cuMemcpyDtoH_v2"(*mut c_void, CUdeviceptr, usize);
        memcpy_dtod = "cuMemcpyDtoD_v2"(CUdeviceptr, CUdeviceptr, usize);
        memset_d8_async = "cuMemsetD8Async"(CUdeviceptr, u8, usize, CUstream);
        memcpy_async = "cuMemcpyAsync"(CUdeviceptr, CUdeviceptr, usize, CUstream);
        stream_create = "cuStreamCreate"(*mut CUstream, c_uint);
        stream_create_with_priority = "cuStreamCreateWithPriority"(*mut CUstream, c_uint, c_int);
        ctx_get_stream_priority_range = "cuCtxGetStreamPriorityRange"(*mut c_int, *mut c_int);
        stream_destroy = "cuStreamDestroy_v2"(CUstream);
        stream_synchronize = "cuStreamSynchronize"(CUstream);
        stream_get_ctx = "cuStreamGetCtx"(CUstream, *mut CUcontext);
        launch_host_func = "cuLaunchHostFunc"(CUstream, CUhostFn, *mut c_void);
        event_create = "cuEventCreate"(*mut CUevent, c_uint);
        event_record = "cuEventRecord"(CUevent, CUstream);
        event_query = "cuEventQuery"(CUevent);
        event_synchronize = "cuEventSynchronize"(CUevent);
        event_destroy = "cuEventDestroy_v2"(CUevent);
        device_get_uuid = "cuDeviceGetUuid"(*mut [u8; 16], CUdevice);
        device_can_access_peer = "cuDeviceCanAccessPeer"(*mut c_int, CUdevice, CUdevice);
        stream_wait_event = "cuStreamWaitEvent"(CUstream, CUevent, c_uint);
        // Since CUDA 10.1: what a copy range is (copy.rs), whether a
        // stream captures a graph and the thread's capture mode (capture.rs).
        pointer_get_attribute = "cuPointerGetAttribute"(*mut c_void, c_int, CUdeviceptr);
        stream_is_capturing = "cuStreamIsCapturing"(CUstream, *mut c_int);
        thread_exchange_capture_mode = "cuThreadExchangeStreamCaptureMode"(*mut c_int);
    }
}

entry_points! {
    /// The virtual memory management entry points (CUDA 10.2 and later).
    Vmm {
        address_reserve = "cuMemAddressReserve"(*mut CUdeviceptr, usize, usize, CUdeviceptr, u64);
        address_free = "cuMemAddressFree"(CUdeviceptr, usize);
        create = "cuMemCreate"(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64);
        release = "cuMemRelease"(CUmemGenericAllocationHandle);
        map = "cuMemMap"(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64);
        unmap = "cuMemUnmap"(CUdeviceptr, usize);
        set_access = "cuMemSetAccess"(CUdeviceptr, usize, *const CUmemAccessDesc, usize);
        granularity = "cuMemGetAllocationGranularity"(*mut usize, *const CUmemAllocationProp, c_uint);
    }
}

entry_points! {
    /// Shareable handles (CUDA 10.2 and later): a physical allocation
    /// exported as an OS handle (here a POSIX file descriptor) and imported
    /// in another process. Optional: a driver without them still loads, and
    /// its mechanisms offer no export kinds (see `export.rs`).
    Share {
        export = "cuMemExportToShareableHandle"(*mut c_void, CUmemGenericAllocationHandle, c_uint, u64);
        import = "cuMemImportFromShareableHandle"(*mut CUmemGenericAllocationHandle, *mut c_void, c_uint);
        properties_from_handle =
            "cuMemGetAllocationPropertiesFromHandle"(*mut CUmemAllocationProp, CUmemGenericAllocationHandle);
    }
}

entry_points! {
    /// Page-locked host memory (present since CUDA 2.2). Optional: a driver
    /// without them still loads, and only the pinned-host mechanisms are
    /// absent (see `pinned.rs`).
    HostAlloc {
        alloc = "cuMemHostAlloc"(*mut *mut c_void, usize, c_uint);
        free = "cuMemFreeHost"(*mut c_void);
    }
}

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the one
/// that allocated it.
pub const MEMHOSTALLOC_PORTABLE: c_uint = 1;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: mapped into the device's address space
/// (under unified addressing at the same address as on the host).
pub const MEMHOSTALLOC_DEVICEMAP: c_uint = 2;

/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
pub const ATTR_POSIX_FD_SUPPORTED: c_uint = 103;
/// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` (not used: fabric
/// handles are not implemented, see `export.rs`).
pub const ATTR_FABRIC_SUPPORTED: c_uint = 128;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, as a raw number.
pub const HANDLE_TYPE_POSIX_FD: c_uint = 1;

/// One device as found at load.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Ordinal among CUDA devices (the memplug device ordinal too).
    pub ordinal: u32,
    /// The driver's handle of the device.
    pub device: CUdevice,
    /// What the driver calls it.
    pub name: String,
    /// The VMM granularity (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`) when the
    /// device supports virtual memory management; `None` when it does not
    /// (the mechanism then publishes neither virtual backing nor shared
    /// mapping).
    pub vmm_granularity: Option<u64>,
    /// What else the driver says of the device (ABI 1.2's descriptor and
    /// identity).
    pub facts: crate::device_facts::DeviceFacts,
}

/// The loaded, initialised driver.
pub struct Driver {
    /// Entry points every mechanism needs.
    pub api: Core,
    /// VMM entry points, when the library has them all.
    pub vmm: Option<Vmm>,
    /// Shareable-handle entry points, when the library has them all.
    pub share: Option<Share>,
    /// Pinned host memory entry points, when the library has them both.
    pub host_alloc: Option<HostAlloc>,
    /// `cuDriverGetVersion`, e.g. 12080 for 12.8.
    pub version: i32,
    /// Every device, in ordinal order.
    pub devices: Vec<DeviceInfo>,
    /// Where the library came from, for messages.
    pub origin: String,
    /// The file the dynamic loader actually loaded (from `dladdr` of
    /// `cuInit`), e.g. `/usr/lib/x86_64-linux-gnu/libcuda.so.1`; in the
    /// plugin's version string, so a device check can print it.
    pub loaded_path: String,
    lib: &'static libloading::Library,
}

// SAFETY: function pointers and a library handle that is never closed; the
// driver's entry points may be called from any thread.
unsafe impl Send for Driver {}
unsafe impl Sync for Driver {}

impl Driver {
    /// The address of any symbol of the loaded library (tests use it to
    /// reach the fake driver's introspection functions).
    pub fn symbol(&self, name: &str) -> Option<*mut c_void> {
        lookup(self.lib, name)
    }

    /// Turns a driver status into a plugin result; `call` names the entry
    /// point for the message.
    #[inline]
    pub fn check(&self, code: CuResult, call: &str) -> PluginResult<()> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.error(code, call))
        }
    }

    /// The failure for a driver status other than success. A sticky code
    /// (see [`is_sticky`]) has the status the slot running on this thread
    /// chose (`DEVICE_LOST` for an instance a 1.2 host holds, else
    /// `DEVICE_UNAVAILABLE`: [`sticky_status`]), and is noted for that slot,
    /// which marks its context dead when it returns.
    #[cold]
    pub fn error(&self, code: CuResult, call: &str) -> PluginError {
        let status = if is_sticky(code) { sticky_status() } else { status_of(code) };
        let e = PluginError::new(status, format!("{call} failed: {} ({code})", self.error_name(code)));
        if is_sticky(code) {
            STICKY_SEEN.with(|s| {
                let mut s = s.borrow_mut();
                if s.is_none() {
                    *s = Some(e.clone());
                }
            });
        }
        e
    }

    /// The driver's name for a status code, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn error_name(&self, code: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: resolved entry point; `p` is written on success and then
        // points to a static string of the driver.
        let r = unsafe { (self.api.get_error_name)(code, &mut p) };
        if r != CUDA_SUCCESS || p.is_null() {
            return "an error code this driver does not name".into();
        }
        // SAFETY: a NUL-terminated static string (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

thread_local! {
    /// The first sticky failure seen on this thread since the running slot
    /// began (`take_sticky`).
    static STICKY_SEEN: std::cell::RefCell<Option<PluginError>> = const { std::cell::RefCell::new(None) };
}

/// Takes the sticky failure noted on this thread, if any.
pub(crate) fn take_sticky() -> Option<PluginError> {
    STICKY_SEEN.with(|s| s.borrow_mut().take())
}

thread_local! {
    /// The status a sticky error gets on this thread (set by the running
    /// slot; `DEVICE_UNAVAILABLE` outside slots).
    static STICKY_STATUS: std::cell::Cell<Status> = const { std::cell::Cell::new(Status::DeviceUnavailable) };
}

/// The status a sticky error gets on this thread now.
pub fn sticky_status() -> Status {
    STICKY_STATUS.with(|s| s.get())
}

/// Sets the status sticky errors get on this thread; returns the previous.
pub(crate) fn set_sticky_status(status: Status) -> Status {
    STICKY_STATUS.with(|s| s.replace(status))
}

/// The driver codes after which a context is unusable for the rest of the
/// process: every code the driver API documents with "This leaves the
/// process in an inconsistent state and any further CUDA work will return
/// the same error" or "the device cannot be used again", with its name.
/// One list: [`is_sticky`] reads it, and the fake driver's tests inject
/// each code of it.
pub const STICKY_CODES: &[(CuResult, &str)] = &[
    (226, "CUDA_ERROR_CONTAINED"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (710, "CUDA_ERROR_ASSERT"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
    (721, "CUDA_ERROR_TENSOR_MEMORY_LEAK"),
    // "The MPS client has been terminated by the server. To continue using
    // CUDA, the process must be terminated and relaunched."
    (810, "CUDA_ERROR_MPS_CLIENT_TERMINATED"),
    (911, "CUDA_ERROR_EXTERNAL_DEVICE"),
];

/// Whether `code` is a *sticky* error ([`STICKY_CODES`]): the context is
/// unusable for the rest of the process and every later call in it fails.
pub fn is_sticky(code: CuResult) -> bool {
    STICKY_CODES.iter().any(|&(c, _)| c == code)
}

/// The memplug status of a driver status code: exhaustion is
/// `OUT_OF_MEMORY`; a driver, device or context that is absent, lost or
/// broken is `DEVICE_UNAVAILABLE`; "not supported" is `UNSUPPORTED`;
/// anything else is the plugin's `INTERNAL` failure. Sticky errors are
/// `DEVICE_UNAVAILABLE` here, their ABI 1.0/1.1 meaning; a slot of an
/// instance a 1.2 host holds makes them `DEVICE_LOST` ([`Driver::error`]
/// uses [`sticky_status`]) and reports the loss.
pub fn status_of(code: CuResult) -> Status {
    match code {
        2 => Status::OutOfMemory,
        // NOT_INITIALIZED, DEINITIALIZED, STUB_LIBRARY, INSUFFICIENT_DRIVER,
        // DEVICE_UNAVAILABLE, NO_DEVICE, INVALID_DEVICE, DEVICE_NOT_LICENSED,
        // CONTEXT_IS_DESTROYED, ECC_UNCORRECTABLE, SYSTEM_NOT_READY,
        // SYSTEM_DRIVER_MISMATCH, COMPAT_NOT_SUPPORTED_ON_DEVICE, UNKNOWN.
        3 | 4 | 34 | 35 | 46 | 100 | 101 | 102 | 709 | 214 | 802 | 803 | 804 | 999 => {
            Status::DeviceUnavailable
        }
        // The sticky errors: the context is dead. DEVICE_UNAVAILABLE is the
        // nearest code of ABI 1.0/1.1; at 1.2 a slot makes them DEVICE_LOST
        // (`sticky_status`).
        c if is_sticky(c) => Status::DeviceUnavailable,
        CUDA_ERROR_NOT_SUPPORTED => Status::Unsupported,
        _ => Status::Internal,
    }
}

fn lookup(lib: &libloading::Library, name: &str) -> Option<*mut c_void> {
    // SAFETY: only the address is taken; nothing is called here.
    unsafe { lib.get::<*mut c_void>(name) }.ok().map(|s| *s).filter(|p| !p.is_null())
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs one of the cudarc calls that may panic, turning a panic into a
/// `DEVICE_UNAVAILABLE` failure.
fn guarded<T>(f: impl FnOnce() -> T) -> PluginResult<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        PluginError::new(
            Status::DeviceUnavailable,
            format!("the CUDA driver could not be loaded: {}", panic_text(&*p)),
        )
    })
}

fn unavailable(msg: String) -> PluginError {
    PluginError::new(Status::DeviceUnavailable, msg)
}

/// The library names tried, in order, without repeats: `libcuda.so.1` (the
/// driver's ABI name, which the toolkit's stub never has), then
/// `libcuda.so` (which may be the toolkit's stub, or a development link to
/// the driver), then the other names cudarc knows.
fn searched_names() -> Vec<String> {
    let mut names: Vec<String> = vec!["libcuda.so.1".into(), "libcuda.so".into()];
    for n in cudarc::get_lib_name_candidates("cuda") {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names
}

/// The driver, loaded and initialised on first use; the answer, success or
/// failure, is kept for the life of the process (of this library).
pub fn driver() -> PluginResult<&'static Driver> {
    static DRIVER: OnceLock<PluginResult<Driver>> = OnceLock::new();
    DRIVER.get_or_init(|| guarded(load).and_then(|r| r)).as_ref().map_err(Clone::clone)
}

/// `CUDA_ERROR_STUB_LIBRARY`: what the toolkit's stub `libcuda.so` answers
/// to `cuInit`.
pub const CUDA_ERROR_STUB_LIBRARY: CuResult = 34;

/// Opens `name` (a path, or a bare name the dynamic loader searches for).
fn open(name: &std::ffi::OsStr) -> Result<libloading::Library, String> {
    let flags = libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL;
    // SAFETY: loading runs the library's initialisers; the name is the
    // CUDA driver's, or one whoever set MEMPLUG_CUDA_DRIVER chose.
    match unsafe { libloading::os::unix::Library::open(Some(name), flags) } {
        Ok(lib) => Ok(lib.into()),
        // libloading puts dlerror()'s text in the source.
        Err(e) => Err(std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string())),
    }
}

/// The file the loader mapped for the object that holds `sym`.
fn loaded_file(sym: *mut c_void) -> Option<String> {
    // SAFETY: `dladdr` only reads the loader's tables; `info` is written on
    // success, and its `dli_fname` is a NUL-terminated string of the loader.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(sym.cast_const(), &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned())
    }
}

/// What one candidate library turned out to be.
enum Candidate {
    /// Opened, `cuInit` succeeded (or failed with something other than
    /// "stub"); kept.
    Driver(libloading::Library),
    /// `cuInit` said `CUDA_ERROR_STUB_LIBRARY`: the toolkit's stub, closed.
    Stub(String),
    /// Not found or not loadable.
    Absent,
}

/// Opens `name` and calls its `cuInit` once to tell the toolkit's stub from
/// a driver (the call is repeated, harmlessly, by `initialise`).
fn try_candidate(name: &str) -> Candidate {
    let Ok(lib) = open(std::ffi::OsStr::new(name)) else {
        return Candidate::Absent;
    };
    let Some(init) = lookup(&lib, "cuInit") else {
        // Not a driver at all: `Core::resolve` will say what it lacks.
        return Candidate::Driver(lib);
    };
    // SAFETY: the driver's `cuInit(unsigned int)`.
    let init: unsafe extern "C" fn(c_uint) -> CuResult = unsafe { std::mem::transmute(init) };
    // SAFETY: as above; flags must be 0.
    if unsafe { init(0) } == CUDA_ERROR_STUB_LIBRARY {
        let path = lookup(&lib, "cuInit").and_then(loaded_file).unwrap_or_else(|| name.to_string());
        drop(lib);
        return Candidate::Stub(path);
    }
    Candidate::Driver(lib)
}

fn load() -> PluginResult<Driver> {
    let (lib, origin) = match std::env::var_os(DRIVER_ENV).filter(|v| !v.is_empty()) {
        Some(path) => {
            let shown = format!("{DRIVER_ENV}={}", path.to_string_lossy());
            let lib = open(&path)
                .map_err(|why| unavailable(format!("no CUDA driver: {shown} cannot be loaded: {why}")))?;
            (lib, shown)
        }
        None => {
            let names = searched_names();
            let mut stubs = Vec::new();
            let mut found = None;
            for name in &names {
                match try_candidate(name) {
                    Candidate::Driver(lib) => {
                        found = Some((lib, format!("{name}, found on the loader's path")));
                        break;
                    }
                    Candidate::Stub(path) => stubs.push(path),
                    Candidate::Absent => {}
                }
            }
            match found {
                Some(f) => f,
                None if !stubs.is_empty() => {
                    return Err(unavailable(format!(
                        "no CUDA driver: only the CUDA toolkit's stub library was found ({}: cuInit failed with \
                         CUDA_ERROR_STUB_LIBRARY (34)); install the NVIDIA driver, take the stub's folder off \
                         LD_LIBRARY_PATH, or set {DRIVER_ENV}=/path/to/libcuda.so.1",
                        stubs.join(", ")
                    )))
                }
                None => {
                    return Err(unavailable(format!(
                        "no CUDA driver: libcuda.so.1 not found (searched the loader's path for {}); install \
                         the NVIDIA driver or set {DRIVER_ENV}=/path/to/libcuda.so.1",
                        names.join(", ")
                    )))
                }
            }
        }
    };
    // Never closed: the entry points are used for the life of the process.
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    let find = |name: &str| lookup(lib, name);
    let api = Core::resolve(&find).map_err(|missing| {
        unavailable(format!(
            "the CUDA driver ({origin}) lacks entry points this plugin needs: {}",
            missing.join(", ")
        ))
    })?;
    let loaded_path = loaded_file(api.init as *mut c_void).unwrap_or_else(|| "an unknown file".into());
    let origin = format!("{origin}: {loaded_path}");
    let vmm = Vmm::resolve(&find).ok();
    let share = Share::resolve(&find).ok();
    let host_alloc = HostAlloc::resolve(&find).ok();
    let mut driver =
        Driver { api, vmm, share, host_alloc, version: 0, devices: Vec::new(), origin, loaded_path, lib };
    driver.initialise()?;
    Ok(driver)
}

impl Driver {
    fn initialise(&mut self) -> PluginResult<()> {
        let api = self.api;
        // SAFETY (every call below): resolved entry points, out-pointers to
        // locals.
        let r = unsafe { (api.init)(0) };
        if r != CUDA_SUCCESS {
            return Err(unavailable(format!(
                "the CUDA driver ({}) did not initialise: cuInit failed: {} ({r})",
                self.origin,
                self.error_name(r)
            )));
        }
        let mut version = 0;
        self.check(unsafe { (api.driver_get_version)(&mut version) }, "cuDriverGetVersion")
            .map_err(|e| unavailable(e.message))?;
        self.version = version;
        let mut count = 0;
        self.check(unsafe { (api.device_get_count)(&mut count) }, "cuDeviceGetCount")
            .map_err(|e| unavailable(e.message))?;
        if count <= 0 {
            return Err(unavailable(format!("the CUDA driver ({}) reports no CUDA device", self.origin)));
        }
        for ordinal in 0..count {
            let mut device: CUdevice = 0;
            self.check(unsafe { (api.device_get)(&mut device, ordinal) }, "cuDeviceGet")
                .map_err(|e| unavailable(e.message))?;
            let mut name = [0 as c_char; 256];
            let name = if unsafe { (api.device_get_name)(name.as_mut_ptr(), 256, device) } == CUDA_SUCCESS {
                // SAFETY: the driver wrote a NUL-terminated name.
                unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned()
            } else {
                format!("CUDA device {ordinal}")
            };
            let vmm = self.vmm.filter(|_| self.vmm_supported(device));
            let facts = crate::device_facts::DeviceFacts::probe(self, device, vmm.is_some());
            let vmm_granularity =
                vmm.and_then(|v| self.granularity(v, device, GRANULARITY_MINIMUM, facts.rdma_with_vmm));
            self.devices.push(DeviceInfo { ordinal: ordinal as u32, device, name, vmm_granularity, facts });
        }
        Ok(())
    }

    /// Whether `device` supports virtual memory management.
    fn vmm_supported(&self, device: CUdevice) -> bool {
        let mut supported = 0;
        // SAFETY: resolved entry point, out-pointer to a local.
        let r = unsafe { (self.api.device_get_attribute)(&mut supported, ATTR_VMM_SUPPORTED, device) };
        r == CUDA_SUCCESS && supported != 0
    }

    /// The granularity (`option`: minimum or recommended) of every kind of
    /// physical memory the plugin creates on `device`, queried with the
    /// properties it is created with: `gpuDirectRDMACapable` when `rdma`,
    /// and both without a handle type and, where the device exports POSIX
    /// descriptors, with one (`export.rs`). The driver may answer each
    /// differently; the largest (powers of two: a multiple of the others)
    /// serves them all. `None` unless every answer is a power of two.
    pub(crate) fn granularity(&self, vmm: Vmm, device: CUdevice, option: c_uint, rdma: bool) -> Option<u64> {
        let mut posix = 0;
        // SAFETY: resolved entry point, out-pointer to a local.
        let r = unsafe { (self.api.device_get_attribute)(&mut posix, ATTR_POSIX_FD_SUPPORTED, device) };
        let exportable = self.share.is_some() && r == CUDA_SUCCESS && posix == 1;
        let mut largest = None;
        for with_handle in [false, true] {
            if with_handle && !exportable {
                continue;
            }
            let mut prop = allocation_prop(device);
            prop.allocFlags.gpuDirectRDMACapable = u8::from(rdma);
            if with_handle {
                prop.requestedHandleTypes =
                    cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
            }
            let g = self.granularity_of(vmm, device, &prop, option)?;
            largest = Some(largest.map_or(g, |l: u64| l.max(g)));
        }
        largest
    }

    /// `cuMemGetAllocationGranularity` for `prop`, when the driver answers
    /// a power of two.
    fn granularity_of(
        &self,
        vmm: Vmm,
        device: CUdevice,
        prop: &CUmemAllocationProp,
        option: c_uint,
    ) -> Option<u64> {
        let prop = *prop;
        let mut g = 0usize;
        // SAFETY: resolved entry point; `prop` and `g` live for the call.
        let mut r = unsafe { (vmm.granularity)(&mut g, &prop, option) };
        if r != CUDA_SUCCESS {
            // A driver that wants a context for the query: ask again with
            // the primary context current, retained for the query only.
            r = self.with_primary_context(device, || unsafe { (vmm.granularity)(&mut g, &prop, option) });
        }
        (r == CUDA_SUCCESS && g.is_power_of_two()).then_some(g as u64)
    }

    /// Runs `f` with `device`'s primary context retained and current, and
    /// puts everything back afterwards; `f`'s status, or the failure of
    /// getting there.
    fn with_primary_context(&self, device: CUdevice, f: impl FnOnce() -> CuResult) -> CuResult {
        let api = self.api;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: resolved entry points; what is retained and pushed here is
        // popped and released before returning.
        unsafe {
            let r = (api.primary_ctx_retain)(&mut ctx, device);
            if r != CUDA_SUCCESS {
                return r;
            }
            let r = match (api.ctx_push)(ctx) {
                CUDA_SUCCESS => {
                    let r = f();
                    let mut popped: CUcontext = std::ptr::null_mut();
                    (api.ctx_pop)(&mut popped);
                    r
                }
                r => r,
            };
            (api.primary_ctx_release)(device);
            r
        }
    }
}

/// Properties of device-local physical memory on `device`, as `cuMemCreate`
/// and `cuMemGetAllocationGranularity` take them.
pub fn allocation_prop(device: CUdevice) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: cu::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: cu::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// Access for `device` to a mapped range: read-only or read-write.
pub fn access_desc(device: CUdevice, writable: bool) -> CUmemAccessDesc {
    CUmemAccessDesc {
        location: cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device },
        flags: if writable {
            cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        } else {
            cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ
        },
    }
}

/// The calling thread's current context made `ctx` for as long as this
/// lives, and put back as it was afterwards: the plugin never leaves a
/// runtime's thread with a different current context.
pub struct Entered {
    api: Core,
    pushed: bool,
}

impl Entered {
    /// Makes `ctx` current on this thread (a no-op when it already is).
    pub(crate) fn new(driver: &Driver, ctx: CUcontext) -> PluginResult<Entered> {
        let api = driver.api;
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: resolved entry point, out-pointer to a local.
        driver.check(unsafe { (api.ctx_get_current)(&mut current) }, "cuCtxGetCurrent")?;
        if current == ctx {
            return Ok(Entered { api, pushed: false });
        }
        // SAFETY: `ctx` is a context the caller keeps retained.
        driver.check(unsafe { (api.ctx_push)(ctx) }, "cuCtxPushCurrent")?;
        Ok(Entered { api, pushed: true })
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: pops what `new` pushed on this thread.
            unsafe { (self.api.ctx_pop)(&mut popped) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_codes_map_to_the_conservative_status() {
        assert_eq!(status_of(2), Status::OutOfMemory);
        for lost in [3, 4, 35, 100, 101, 700, 709, 999] {
            assert_eq!(status_of(lost), Status::DeviceUnavailable, "{lost}");
        }
        for &(sticky, name) in STICKY_CODES {
            assert!(is_sticky(sticky), "{name}");
            assert_eq!(status_of(sticky), Status::DeviceUnavailable, "{name}");
        }
        // A device-side assert and a contained error kill the context too.
        assert!(is_sticky(710) && is_sticky(226));
        assert!(!is_sticky(701) && !is_sticky(713) && !is_sticky(720) && !is_sticky(2));
        // Outside a slot, a sticky error keeps its 1.0/1.1 status.
        assert_eq!(sticky_status(), Status::DeviceUnavailable);
        assert_eq!(status_of(CUDA_ERROR_NOT_SUPPORTED), Status::Unsupported);
        assert_eq!(status_of(CUDA_ERROR_INVALID_VALUE), Status::Internal);
        assert_eq!(status_of(123_456), Status::Internal, "a code newer than this build");
    }

    #[test]
    fn the_searched_names_start_with_libcuda_so_1_then_libcuda_so_and_do_not_repeat() {
        let names = searched_names();
        // The driver's ABI name first, then the name a toolkit stub has.
        assert_eq!(names[0], "libcuda.so.1");
        assert_eq!(names[1], "libcuda.so");
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
    }
}
