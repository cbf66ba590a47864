//! Drives the CPU plugin through its C ABI exactly as a host would: calls
//! the entry symbol with a `MemplugHostInfo`, reads the descriptor, and
//! calls the vtable slots with a message sink that captures what the plugin
//! says.
//!
//! Tests of one binary share one plugin instance (the entry builds it
//! once), so [`harness`] serialises them: counts of live objects taken
//! under it are exact.

#![allow(dead_code)]

pub use memplug_sdk::abi::*;
pub use memplug_sdk::Status;

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

/// A refused call: its status and everything the plugin wrote to the sink.
pub struct Failure {
    pub status: Status,
    pub raw: MemplugStatus,
    pub message: String,
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.status, self.raw, self.message)
    }
}

/// What a slot returned.
pub type Outcome<T> = Result<T, Failure>;

/// Messages written by one call. The plugin writes on the calling thread,
/// before returning, so a `RefCell` on the caller's stack is enough.
#[derive(Default)]
struct Capture {
    messages: RefCell<Vec<String>>,
}

unsafe extern "C" fn capture_write(ctx: *mut c_void, msg: *const c_char, len: usize) {
    let capture = &*(ctx as *const Capture);
    let bytes = std::slice::from_raw_parts(msg.cast::<u8>(), len);
    capture.messages.borrow_mut().push(String::from_utf8_lossy(bytes).into_owned());
}

/// Calls a slot with a capturing sink. A success must say nothing; a
/// failure is returned with its messages.
pub fn call(f: impl FnOnce(*const MemplugMessageSink) -> MemplugStatus) -> Outcome<()> {
    let capture = Capture::default();
    let sink =
        MemplugMessageSink { ctx: &capture as *const Capture as *mut c_void, write: Some(capture_write) };
    let raw = f(&sink);
    let messages = capture.messages.into_inner();
    if raw == MEMPLUG_STATUS_OK {
        assert!(messages.is_empty(), "a successful call wrote {messages:?}");
        return Ok(());
    }
    Err(Failure { status: Status::from_raw_conservative(raw), raw, message: messages.join("\n") })
}

/// Asserts `r` was refused with `status` and an explanation; returns it.
#[track_caller]
pub fn refused<T: std::fmt::Debug>(r: Outcome<T>, status: Status) -> String {
    match r {
        Ok(v) => panic!("expected {status}, the call succeeded with {v:?}"),
        Err(f) => {
            assert_eq!(f.status, status, "wrong status; message: {}", f.message);
            assert!(!f.message.is_empty(), "{status} came without a message");
            f.message
        }
    }
}

/// Asserts a pending-fence answer: the code, and no message — "not yet"
/// is an answer, not a failure, so polling never allocates a message.
pub fn pending<T: std::fmt::Debug>(r: Outcome<T>, status: Status) {
    match r {
        Ok(v) => panic!("expected {status}, the call succeeded with {v:?}"),
        Err(f) => {
            assert_eq!(f.status, status, "wrong status; message: {}", f.message);
            assert!(f.message.is_empty(), "{status} carried a message: {}", f.message);
        }
    }
}

/// The device the CPU mechanism serves.
pub const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// A host info asking for minors `min..=max` of major `major`.
pub fn host_info(major: u32, min: u32, max: u32) -> MemplugHostInfo {
    MemplugHostInfo {
        struct_size: std::mem::size_of::<MemplugHostInfo>() as u32,
        abi_major: major,
        min_minor: min,
        max_minor: max,
        host_name: c"memplug-cpu-tests".as_ptr(),
        services: core::ptr::null(),
    }
}

/// Calls an entry function as a host does at load.
pub fn negotiate(entry: MemplugEntryV1, host: &MemplugHostInfo) -> Outcome<MemplugNegotiation> {
    let mut out = MemplugNegotiation {
        struct_size: std::mem::size_of::<MemplugNegotiation>() as u32,
        agreed_minor: u32::MAX,
        plugin: std::ptr::null(),
    };
    call(|sink| unsafe { entry(host, &mut out, sink) })?;
    Ok(out)
}

/// A NUL-terminated string from the descriptor.
pub fn text(p: *const c_char) -> String {
    assert!(!p.is_null());
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
}

/// Host-assigned object ids: unique in the process, never an address.
pub fn next_object_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1_000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The plugin's vtables, copied out of the descriptor. Plain data and
/// function pointers, so it can go to other threads.
#[derive(Clone, Copy)]
pub struct Api {
    pub plugin_ctx: usize,
    pub live_objects: unsafe extern "C" fn(*mut c_void) -> u64,
    pub ctx: usize,
    pub mechanism_id: u64,
    pub device: MemplugDevice,
    pub alloc: MemplugAllocator,
    pub vb: MemplugVirtualBacking,
    pub sm: MemplugSharedMapping,
    pub sync: MemplugSync,
}

impl Api {
    /// Reads the vtables of the `"cpu"` mechanism (the first) of a
    /// negotiated plugin.
    pub fn from_descriptor(plugin: &MemplugPlugin) -> Api {
        Api::named(plugin, "cpu").expect("the plugin publishes \"cpu\" first")
    }

    /// Reads the vtables of mechanism `name`, if the plugin publishes it
    /// (the placed and huge-page mechanisms only where the machine serves
    /// them). A capability it lacks reads as an empty vtable.
    pub fn named(plugin: &MemplugPlugin, name: &str) -> Option<Api> {
        // Every vtable is a size, padding and optional function pointers,
        // for which all-zero bytes are a valid (empty) value.
        fn or_empty<T: Copy>(p: *const T) -> T {
            if p.is_null() {
                unsafe { std::mem::zeroed() }
            } else {
                unsafe { *p }
            }
        }
        let mechs = unsafe { std::slice::from_raw_parts(plugin.mechanisms, plugin.mechanism_count as usize) };
        let mech = mechs
            .iter()
            .map(|&m| unsafe { &*m })
            .find(|m| unsafe { std::ffi::CStr::from_ptr(m.name) }.to_bytes() == name.as_bytes())?;
        unsafe {
            Some(Api {
                plugin_ctx: plugin.ctx as usize,
                live_objects: plugin.live_objects.expect("live_objects is required"),
                ctx: mech.ctx as usize,
                mechanism_id: mech.mechanism_id,
                device: mech.device,
                alloc: *mech.allocator,
                vb: or_empty(mech.virtual_backing),
                sm: or_empty(mech.shared_mapping),
                sync: or_empty(mech.sync),
            })
        }
    }

    fn ctx(&self) -> *mut c_void {
        self.ctx as *mut c_void
    }

    /// `live_objects` of the plugin.
    pub fn live(&self) -> u64 {
        unsafe { (self.live_objects)(self.plugin_ctx as *mut c_void) }
    }

    /// A well-formed request for `size` bytes aligned to `alignment`, with
    /// a fresh object id.
    pub fn request(&self, size: u64, alignment: u64) -> MemplugRequest {
        MemplugRequest {
            struct_size: std::mem::size_of::<MemplugRequest>() as u32,
            flags: 0,
            size,
            alignment,
            object_id: next_object_id(),
            device: self.device,
            class_tag: 0,
            reserved0: 0,
            ..Default::default()
        }
    }

    /// How the host names back the object `block` made for `request`.
    pub fn object_ref(&self, request: &MemplugRequest, block: &MemplugBlock) -> MemplugObjectRef {
        MemplugObjectRef {
            struct_size: std::mem::size_of::<MemplugObjectRef>() as u32,
            reserved0: 0,
            mechanism_id: self.mechanism_id,
            device: request.device,
            object_id: request.object_id,
            addr: block.addr,
            size: block.size,
            handle: block.handle,
        }
    }

    fn empty_block() -> MemplugBlock {
        MemplugBlock { struct_size: std::mem::size_of::<MemplugBlock>() as u32, ..Default::default() }
    }

    // ---- allocator ----

    pub fn properties(&self) -> Outcome<MemplugProperties> {
        let mut out = MemplugProperties {
            struct_size: std::mem::size_of::<MemplugProperties>() as u32,
            ..Default::default()
        };
        call(|sink| unsafe { self.alloc.properties.unwrap()(self.ctx(), &mut out, sink) })?;
        Ok(out)
    }

    pub fn memory_info(&self) -> Outcome<MemplugMemoryInfo> {
        let mut out = MemplugMemoryInfo {
            struct_size: std::mem::size_of::<MemplugMemoryInfo>() as u32,
            ..Default::default()
        };
        call(|sink| unsafe {
            self.alloc.memory_info.expect("memory_info is published")(self.ctx(), &mut out, sink)
        })?;
        Ok(out)
    }

    pub fn allocate_raw(&self, request: &MemplugRequest) -> Outcome<MemplugBlock> {
        let mut out = Self::empty_block();
        call(|sink| unsafe { self.alloc.allocate.unwrap()(self.ctx(), request, &mut out, sink) })?;
        Ok(out)
    }

    pub fn allocate(&self, size: u64, alignment: u64) -> Outcome<MemplugObjectRef> {
        let r = self.request(size, alignment);
        let b = self.allocate_raw(&r)?;
        Ok(self.object_ref(&r, &b))
    }

    pub fn deallocate(&self, object: &MemplugObjectRef) -> Outcome<()> {
        call(|sink| unsafe { self.alloc.deallocate.unwrap()(self.ctx(), object, sink) })
    }

    // ---- virtual backing ----

    pub fn reserve_raw(&self, request: &MemplugRequest) -> Outcome<MemplugBlock> {
        let mut out = Self::empty_block();
        call(|sink| unsafe { self.vb.reserve.unwrap()(self.ctx(), request, &mut out, sink) })?;
        Ok(out)
    }

    pub fn reserve(&self, size: u64) -> Outcome<MemplugObjectRef> {
        let r = self.request(size, 1);
        let b = self.reserve_raw(&r)?;
        Ok(self.object_ref(&r, &b))
    }

    pub fn commit(&self, r: &MemplugObjectRef, offset: u64, len: u64) -> Outcome<()> {
        call(|sink| unsafe { self.vb.commit.unwrap()(self.ctx(), r, offset, len, sink) })
    }

    pub fn decommit(&self, r: &MemplugObjectRef, offset: u64, len: u64) -> Outcome<()> {
        call(|sink| unsafe { self.vb.decommit.unwrap()(self.ctx(), r, offset, len, sink) })
    }

    pub fn committed(&self, r: &MemplugObjectRef) -> Outcome<u64> {
        let mut out = u64::MAX;
        call(|sink| unsafe { self.vb.committed_bytes.unwrap()(self.ctx(), r, &mut out, sink) })?;
        Ok(out)
    }

    pub fn release_reservation(&self, r: &MemplugObjectRef) -> Outcome<()> {
        call(|sink| unsafe { self.vb.release.unwrap()(self.ctx(), r, sink) })
    }

    // ---- shared mapping ----

    pub fn create_raw(&self, request: &MemplugRequest) -> Outcome<MemplugBlock> {
        let mut out = Self::empty_block();
        call(|sink| unsafe { self.sm.create.unwrap()(self.ctx(), request, &mut out, sink) })?;
        Ok(out)
    }

    pub fn create(&self, size: u64) -> Outcome<MemplugObjectRef> {
        let r = self.request(size, 1);
        let b = self.create_raw(&r)?;
        Ok(self.object_ref(&r, &b))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn map(
        &self,
        object: &MemplugObjectRef,
        object_offset: u64,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        access: u32,
    ) -> Outcome<()> {
        call(|sink| unsafe {
            self.sm.map.unwrap()(self.ctx(), object, object_offset, r, offset, len, access, sink)
        })
    }

    pub fn unmap(&self, r: &MemplugObjectRef, offset: u64, len: u64) -> Outcome<()> {
        call(|sink| unsafe { self.sm.unmap.unwrap()(self.ctx(), r, offset, len, sink) })
    }

    pub fn retain(&self, object: &MemplugObjectRef) -> Outcome<()> {
        call(|sink| unsafe { self.sm.retain.unwrap()(self.ctx(), object, sink) })
    }

    pub fn release_object(&self, object: &MemplugObjectRef) -> Outcome<()> {
        call(|sink| unsafe { self.sm.release.unwrap()(self.ctx(), object, sink) })
    }

    // ---- sync ----

    pub fn stream_create(&self) -> Outcome<u64> {
        let mut out = 0;
        call(|sink| unsafe { self.sync.stream_create.unwrap()(self.ctx(), &mut out, sink) })?;
        Ok(out)
    }

    pub fn stream_destroy(&self, stream: u64) -> Outcome<()> {
        call(|sink| unsafe { self.sync.stream_destroy.unwrap()(self.ctx(), stream, sink) })
    }

    /// Enqueues `func(userdata)`; the caller keeps `userdata` alive until
    /// the function has run.
    pub fn enqueue(
        &self,
        stream: u64,
        func: unsafe extern "C" fn(*mut c_void),
        userdata: *const c_void,
    ) -> Outcome<()> {
        call(|sink| unsafe {
            self.sync.enqueue_host_fn.unwrap()(self.ctx(), stream, Some(func), userdata as *mut c_void, sink)
        })
    }

    pub fn fence_record(&self, stream: u64) -> Outcome<u64> {
        let mut out = 0;
        call(|sink| unsafe { self.sync.fence_record.unwrap()(self.ctx(), stream, &mut out, sink) })?;
        Ok(out)
    }

    pub fn fence_query(&self, fence: u64) -> Outcome<()> {
        call(|sink| unsafe { self.sync.fence_query.unwrap()(self.ctx(), fence, sink) })
    }

    pub fn fence_wait(&self, fence: u64, timeout_ns: u64) -> Outcome<()> {
        call(|sink| unsafe { self.sync.fence_wait.unwrap()(self.ctx(), fence, timeout_ns, sink) })
    }

    // ---- sharing across processes (ABI 1.1) ----

    pub fn export_fd(&self, object: &MemplugObjectRef) -> Outcome<OwnedFd> {
        let mut fd = -1;
        call(|sink| unsafe {
            self.sm.export_fd.expect("export_fd published")(self.ctx as *mut _, object, &mut fd, sink)
        })?;
        assert!(fd >= 0);
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub fn import_raw(&self, fd: i32, request: &MemplugRequest) -> Outcome<MemplugBlock> {
        let mut out = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_1, ..Default::default() };
        call(|sink| unsafe {
            self.sm.import_fd.expect("import_fd published")(self.ctx as *mut _, fd, request, &mut out, sink)
        })?;
        Ok(out)
    }

    pub fn import_fd(&self, fd: BorrowedFd<'_>, size: u64) -> Outcome<MemplugObjectRef> {
        let r = self.request(size, 1);
        let b = self.import_raw(fd.as_raw_fd(), &r)?;
        assert_eq!(b.addr, 0, "a physical object has no address until mapped");
        assert!(b.size >= size);
        Ok(self.object_ref(&r, &b))
    }

    // ---- queue-ordered binding (ABI 1.2) ----

    pub fn commit_on(&self, r: &MemplugObjectRef, offset: u64, len: u64, stream: u64) -> Outcome<u64> {
        let mut fence = 0;
        call(|sink| unsafe {
            self.vb.commit_on.expect("commit_on")(self.ctx(), r, offset, len, stream, &mut fence, sink)
        })?;
        Ok(fence)
    }

    pub fn decommit_on(&self, r: &MemplugObjectRef, offset: u64, len: u64, stream: u64) -> Outcome<u64> {
        let mut fence = 0;
        call(|sink| unsafe {
            self.vb.decommit_on.expect("decommit_on")(self.ctx(), r, offset, len, stream, &mut fence, sink)
        })?;
        Ok(fence)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn map_on(
        &self,
        object: &MemplugObjectRef,
        object_offset: u64,
        r: &MemplugObjectRef,
        offset: u64,
        len: u64,
        access: u32,
        stream: u64,
    ) -> Outcome<u64> {
        let mut fence = 0;
        call(|sink| unsafe {
            self.sm.map_on.expect("map_on")(
                self.ctx(),
                object,
                object_offset,
                r,
                offset,
                len,
                access,
                stream,
                &mut fence,
                sink,
            )
        })?;
        Ok(fence)
    }

    pub fn unmap_on(&self, r: &MemplugObjectRef, offset: u64, len: u64, stream: u64) -> Outcome<u64> {
        let mut fence = 0;
        call(|sink| unsafe {
            self.sm.unmap_on.expect("unmap_on")(self.ctx(), r, offset, len, stream, &mut fence, sink)
        })?;
        Ok(fence)
    }

    pub fn fence_destroy(&self, fence: u64) -> Outcome<()> {
        call(|sink| unsafe { self.sync.fence_destroy.unwrap()(self.ctx(), fence, sink) })
    }
}

/// The negotiated descriptor of the exported entry `memplug_plugin_v1`.
pub fn descriptor() -> &'static MemplugPlugin {
    static PLUGIN: OnceLock<usize> = OnceLock::new();
    let p = *PLUGIN.get_or_init(|| {
        let host = host_info(MEMPLUG_ABI_MAJOR, 0, MEMPLUG_ABI_MINOR);
        let n = negotiate(memplug_plugin_cpu::memplug_plugin_v1, &host).expect("negotiation");
        n.plugin as usize
    });
    unsafe { &*(p as *const MemplugPlugin) }
}

/// Exclusive use of the plugin for one test, with the live-object count it
/// started from.
pub struct Harness {
    _serial: MutexGuard<'static, ()>,
    pub api: Api,
    pub baseline: u64,
}

impl std::ops::Deref for Harness {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Harness {
    /// Asserts every object the test made has gone again.
    #[track_caller]
    pub fn assert_balanced(&self) {
        assert_eq!(self.live(), self.baseline, "live_objects did not return to its starting value");
    }

    /// The granularity (page size) the plugin publishes.
    pub fn page(&self) -> u64 {
        self.properties().unwrap().granularity
    }
}

/// Takes the plugin for one test (serialised with the binary's other tests).
pub fn harness() -> Harness {
    static SERIAL: Mutex<()> = Mutex::new(());
    // A failed test poisons the lock; the next test still runs, against
    // whatever the failed one left, and its own counts stay relative.
    let serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let api = Api::from_descriptor(descriptor());
    let baseline = api.live();
    Harness { _serial: serial, api, baseline }
}

/// Takes the plugin for one test of mechanism `name`, or says why this
/// machine does not have it (and the test is skipped).
pub fn harness_of(name: &str) -> Option<Harness> {
    let h = harness();
    let Some(api) = Api::named(descriptor(), name) else {
        let why = memplug_plugin_cpu::offers()
            .into_iter()
            .filter(|o| o.name == name || (o.name == "cpu-node<N>" && name.starts_with("cpu-node")))
            .find_map(|o| o.not_offered)
            .unwrap_or_else(|| "the plugin does not know it".into());
        eprintln!("skipped: mechanism \"{name}\" is not published on this machine: {why}");
        return None;
    };
    Some(Harness { baseline: api.live(), api, ..h })
}

// ---- what the kernel says about our memory ----

/// Bytes of `[addr, addr + len)` resident in memory, page by page
/// (`mincore`). For a shared mapping this is whether the object's pages
/// exist, whichever view touched them.
pub fn resident_bytes(addr: u64, len: u64) -> u64 {
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let pages = len.div_ceil(page) as usize;
    let mut vec = vec![0u8; pages];
    let rc = unsafe { libc::mincore(addr as *mut c_void, len as usize, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * page
}

/// The mapping of `addr` in `/proc/self/maps`: its permissions and the
/// rest of its line (device, inode, path); `None` if nothing is mapped.
pub fn mapping_at(addr: u64) -> Option<(String, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
        if !(start..end).contains(&addr) {
            return None;
        }
        let perms = fields.next()?.to_owned();
        Some((perms, fields.collect::<Vec<_>>().join(" ")))
    })
}

/// The bounds `[start, end)` of the kernel mapping (one line of
/// `/proc/self/maps`) that holds `addr`; `None` if nothing is mapped.
pub fn mapping_bounds(addr: u64) -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|line| {
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
        (start..end).contains(&addr).then_some((start, end))
    })
}

/// Bytes of transparent huge pages `/proc/self/smaps` shows in the
/// mappings that overlap `[addr, addr + len)` (each counted whole).
pub fn smaps_huge(addr: u64, len: u64) -> u64 {
    smaps_field(addr, len, "AnonHugePages:")
}

/// Resident bytes `/proc/self/smaps` attributes to the mappings that
/// overlap `[addr, addr + len)` (each counted whole).
pub fn smaps_rss(addr: u64, len: u64) -> u64 {
    smaps_field(addr, len, "Rss:")
}

/// The sum of a `kB` field of `/proc/self/smaps` over the mappings that
/// overlap `[addr, addr + len)`.
fn smaps_field(addr: u64, len: u64, field: &str) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut total = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((s, e)) = first.split_once('-') {
            if let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) {
                inside = s < addr + len && addr < e;
                continue;
            }
        }
        if inside {
            if let Some(kb) = line.strip_prefix(field) {
                total += kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024;
            }
        }
    }
    total
}

/// Number of memfds of this plugin open in the process.
pub fn plugin_memfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains("memfd:memplug-cpu"))
        .count()
}

// ---- holding a stream ----

/// Blocks until the test opens the gate, then raises a flag.
#[derive(Default)]
pub struct Gate {
    pub open: Mutex<bool>,
    pub opened: Condvar,
    pub flag: AtomicBool,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

pub unsafe extern "C" fn wait_at_gate(p: *mut c_void) {
    let g = &*(p as *const Gate);
    let mut open = g.open.lock().unwrap();
    while !*open {
        open = g.opened.wait(open).unwrap();
    }
    g.flag.store(true, Ordering::Release);
}
