//! ABI 1.2's memory descriptor, request placement and typed handles,
//! clause by clause (`docs/CONTRACT.md` names these tests):
//!
//! * a mechanism claims only the attributes every object it makes has: the
//!   reference CPU plugin's and the future plugin's claims are checked
//!   against their memory (and the checker against a plugin that lies);
//! * hints never make a request fail, unknown bits included (flags do);
//! * the host sends `MEMPLUG_HINT_UNINITIALIZED_OK` only when the binding
//!   says so;
//! * a mechanism without `MEMPLUG_PROP_MAPS_AT_OFFSETS` has its physical
//!   objects mapped whole, at offset 0, by the host;
//! * `export_handle` writes its handle only on success and never past the
//!   `struct_size` the caller set; `import_handle` rounds the size up to
//!   the granularity and refuses more than the handle's memory;
//! * device kinds: DLPack's numbers, none assigned in the vendor range.
//!
//! The raw-ABI tests call a plugin's slots through `libloading`, with no
//! host code in between, so that what is measured is the plugin's own
//! answer.

use core::ffi::{c_char, c_void};
use memplug_abi_tests::layout::sdk;
use memplug_host::governor::AllocationClass;
use memplug_host::{
    Access, BindingSpec, Descriptor, Handle, HandleRef, Location, Mechanism, Placement, Plugin,
    ProcessMemoryManager, Requirements, Status,
};
use memplug_sdk::abi::*;
use memplug_test_support::{compile_c_plugin, find_cdylib, repo_root};
use std::alloc::Layout;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

fn cpu_plugin() -> PathBuf {
    find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN")
}

fn future_plugin() -> PathBuf {
    compile_c_plugin(&repo_root().join("abi-tests/c/future_plugin.c"), &[], "memplug_future_descriptor")
}

// ---- attribute claims, checked against the memory ----

/// The `(start, end, perms)` of the mapping of `/proc/self/maps` holding
/// `addr`.
fn mapping_of(addr: u64) -> Option<(u64, u64, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (lo, hi) = f.next()?.split_once('-')?;
        let (lo, hi) = (u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?);
        (lo <= addr && addr < hi).then(|| (lo, hi, f.next().unwrap_or("").to_string()))
    })
}

/// The `Locked:` kilobytes `/proc/self/smaps` reports for the mapping
/// starting at `start`.
fn locked_kib(start: u64) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let is_range = |t: &str| {
        t.split_once('-')
            .is_some_and(|(a, b)| u64::from_str_radix(a, 16).is_ok() && u64::from_str_radix(b, 16).is_ok())
    };
    let head = format!("{start:x}-");
    let mut inside = false;
    for l in smaps.lines() {
        if l.split_whitespace().next().is_some_and(is_range) {
            inside = l.starts_with(&head);
        } else if inside {
            if let Some(v) = l.strip_prefix("Locked:") {
                return v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            }
        }
    }
    0
}

/// Reads `len` bytes at `addr`.
///
/// # Safety
/// `addr..addr + len` is readable.
unsafe fn bytes_at(addr: u64, len: u64) -> Vec<u8> {
    std::slice::from_raw_parts(addr as *const u8, len as usize).to_vec()
}

/// What of `m`'s attribute claims its memory contradicts, checked as far as
/// this process can see: host-visible memory is read and written by the
/// host; zero-filled memory (allocations, committed ranges, physical
/// objects) reads as zero; pinned memory is locked (`Locked:` in smaps);
/// with a shared mapping, host-coherent objects show a write through one
/// mapping in another at once, and read-only mappings are mapped without
/// write permission. Device-local, compressed and RDMA are not visible
/// from here. Returns the contradictions (empty: every checkable claim
/// holds) and the claims it checked.
fn claims_contradicted(m: &Mechanism) -> (Vec<String>, Vec<&'static str>) {
    let d = m.properties().descriptor;
    let claims = |bit: u32| d.attributes & bit != 0;
    let mut lies = Vec::new();
    let mut checked = Vec::new();
    // SAFETY: test harness; every object is released below.
    let api = unsafe { m.ungoverned() };
    let a = api.allocator().allocate(8192, 64).expect("allocate");
    if claims(MEMPLUG_ATTR_HOST_VISIBLE) {
        checked.push("host_visible");
        // SAFETY: a live host-visible allocation of 8192 bytes.
        unsafe { std::ptr::write_bytes(a.addr() as *mut u8, 0x3c, 8192) };
        if unsafe { bytes_at(a.addr(), 8192) }.iter().any(|&b| b != 0x3c) {
            lies.push("host_visible: the host's writes do not read back".to_string());
        }
    }
    if claims(MEMPLUG_ATTR_PINNED) {
        checked.push("pinned");
        let locked = mapping_of(a.addr()).map(|(lo, _, _)| locked_kib(lo)).unwrap_or(0);
        if locked == 0 {
            lies.push(format!("pinned: the allocation at {:#x} is not locked in memory", a.addr()));
        }
    }
    api.allocator().deallocate(a).expect("deallocate");
    if claims(MEMPLUG_ATTR_ZERO_FILLED) {
        checked.push("zero_filled");
        // Memory the test dirtied and gave back is the likeliest to be
        // handed out again: zero-filled means zero anyway.
        for _ in 0..4 {
            let a = api.allocator().allocate(8192, 64).expect("allocate");
            // SAFETY: a live allocation of 8192 bytes (host-visible, or the
            // claim is void anyway: the plugin is a CPU one).
            let dirty = unsafe { bytes_at(a.addr(), 8192) }.iter().any(|&b| b != 0);
            unsafe { std::ptr::write_bytes(a.addr() as *mut u8, 0xa5, 8192) };
            api.allocator().deallocate(a).expect("deallocate");
            if dirty {
                lies.push("zero_filled: a new allocation does not read as zero".to_string());
                break;
            }
        }
    }
    let g = m.properties().granularity;
    if let (Some(sm), Some(vb)) = (api.shared_mapping(), api.virtual_backing()) {
        let o = sm.create(g).expect("create");
        let (ra, rb) = (vb.reserve(g).expect("reserve"), vb.reserve(g).expect("reserve"));
        sm.map(&o, 0, &ra, 0, g, Access::ReadWrite).expect("map");
        if claims(MEMPLUG_ATTR_ZERO_FILLED) && unsafe { bytes_at(ra.addr(), g) }.iter().any(|&b| b != 0) {
            lies.push("zero_filled: a new physical object does not read as zero".to_string());
        }
        sm.map(&o, 0, &rb, 0, g, Access::ReadOnly).expect("map read-only");
        if claims(MEMPLUG_ATTR_HOST_COHERENT) {
            checked.push("host_coherent");
            // SAFETY: `ra` maps `o` read-write, `rb` read-only, `g` bytes each.
            unsafe { std::ptr::copy_nonoverlapping(b"coherent".as_ptr(), ra.addr() as *mut u8, 8) };
            if unsafe { bytes_at(rb.addr(), 8) } != b"coherent" {
                lies.push("host_coherent: a write through one mapping is not seen through another".into());
            }
        }
        if claims(MEMPLUG_ATTR_READ_ONLY_ENFORCED) {
            checked.push("read_only_enforced");
            match mapping_of(rb.addr()) {
                Some((_, _, perms)) if perms.as_bytes().get(1) == Some(&b'-') => {}
                other => lies.push(format!("read_only_enforced: the read-only view is mapped {other:?}")),
            }
        }
        sm.unmap(&rb, 0, g).expect("unmap");
        sm.unmap(&ra, 0, g).expect("unmap");
        vb.release(rb).expect("release");
        vb.release(ra).expect("release");
        sm.release(o).expect("release");
    }
    if claims(MEMPLUG_ATTR_ZERO_FILLED) {
        if let Some(vb) = api.virtual_backing() {
            let r = vb.reserve(g).expect("reserve");
            vb.commit(&r, 0, g).expect("commit");
            if unsafe { bytes_at(r.addr(), g) }.iter().any(|&b| b != 0) {
                lies.push("zero_filled: a committed range does not read as zero".to_string());
            }
            vb.release(r).expect("release");
        }
    }
    (lies, checked)
}

/// The reference CPU plugin and the future plugin (at 1.2) claim exactly
/// what their memory has, and every claim this process can check holds;
/// what they do not claim (pinned, zero-filled, device-local, compressed,
/// RDMA) they are not asked to prove.
#[test]
fn the_cpu_and_future_plugins_claim_only_what_their_memory_has() {
    let cases = [
        (
            cpu_plugin(),
            MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT | MEMPLUG_ATTR_READ_ONLY_ENFORCED,
            &["host_visible", "host_coherent", "read_only_enforced"][..],
        ),
        (future_plugin(), MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT, &["host_visible"][..]),
    ];
    for (path, attributes, want_checked) in cases {
        let p = Plugin::load(&path).unwrap();
        assert_eq!(p.abi_version(), (1, memplug_host::HOST_MAX_MINOR), "{}", path.display());
        let m = &p.mechanisms()[0];
        assert_eq!(m.properties().descriptor.attributes, attributes, "{}", p.name());
        let (lies, checked) = claims_contradicted(m);
        assert!(lies.is_empty(), "{}: {lies:?}", p.name());
        assert_eq!(checked, want_checked, "{}", p.name());
        p.unload().unwrap();
    }
}

/// The checker above has teeth: a plugin claiming pinned, zero-filled
/// memory for dirty, pageable heap blocks is caught on both counts.
#[test]
fn a_plugin_claiming_what_its_memory_lacks_is_caught() {
    let p = unsafe { Plugin::from_entry(liar::entry, "liar", &Default::default()) }.unwrap();
    let m = &p.mechanisms()[0];
    assert_eq!(
        m.properties().descriptor.attributes,
        MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_PINNED | MEMPLUG_ATTR_ZERO_FILLED
    );
    let (lies, checked) = claims_contradicted(m);
    assert_eq!(checked, ["host_visible", "pinned", "zero_filled"]);
    assert_eq!(lies.len(), 2, "{lies:?}");
    assert!(lies[0].starts_with("pinned:") && lies[1].starts_with("zero_filled:"), "{lies:?}");
    p.unload().unwrap();
}

// ---- an SDK heap allocator that records the requests it is sent ----

/// A heap allocator plugin built with the SDK: it records every request
/// and fills what it hands out with 0xa5 (so it is neither zeroed nor
/// locked).
#[derive(Default)]
struct Heap {
    descriptor: Descriptor,
    blocks: Mutex<HashMap<u64, Layout>>,
    seen: Mutex<Vec<memplug_sdk::Request>>,
}

impl memplug_sdk::Allocator for Heap {
    fn properties(&self) -> memplug_sdk::Properties {
        memplug_sdk::Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
    }
    fn descriptor(&self) -> Descriptor {
        self.descriptor
    }
    fn allocate(&self, r: &memplug_sdk::Request) -> memplug_sdk::PluginResult<memplug_sdk::Block> {
        self.seen.lock().unwrap().push(*r);
        let layout = Layout::from_size_align(r.size as usize, r.alignment as usize).unwrap();
        // SAFETY: non-zero size (checked by the SDK).
        let p = unsafe { std::alloc::alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: just allocated with this layout.
        unsafe { std::ptr::write_bytes(p, 0xa5, r.size as usize) };
        self.blocks.lock().unwrap().insert(p as u64, layout);
        Ok(memplug_sdk::Block { addr: p as u64, size: r.size, handle: p as u64 })
    }
    fn deallocate(&self, o: &memplug_sdk::ObjectRef) -> memplug_sdk::PluginResult<()> {
        let l = self
            .blocks
            .lock()
            .unwrap()
            .remove(&o.handle)
            .ok_or_else(|| memplug_sdk::PluginError::unknown_allocation("not a live block"))?;
        // SAFETY: allocated above with this layout, out of the table now.
        unsafe { std::alloc::dealloc(o.handle as *mut u8, l) };
        Ok(())
    }
}

/// One SDK plugin around a [`Heap`] with `descriptor`; `module::entry` and
/// `module::STATE` (the heap, to read what it was sent).
macro_rules! heap_plugin {
    ($m:ident, $name:literal, $descriptor:expr) => {
        mod $m {
            use memplug_sdk::abi::*;
            use memplug_sdk::*;
            pub static STATE: std::sync::OnceLock<MechanismState<super::Heap>> = std::sync::OnceLock::new();
            fn init() -> ExportedPlugin {
                let heap = super::Heap { descriptor: $descriptor, ..Default::default() };
                let b = MechanismBuilder::new("heap", 3, super::CPU0, heap);
                let state = b.state();
                let _ = STATE.set(b.state());
                PluginBuilder::new($name, "1")
                    .mechanism(b.build())
                    .live_objects(move || state.blocks.lock().unwrap().len() as u64)
                    .build()
            }
            declare_entry!(pub entry, init);
        }
    };
}

heap_plugin!(
    liar,
    "liar",
    memplug_host::Descriptor {
        attributes: MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_PINNED | MEMPLUG_ATTR_ZERO_FILLED,
        ..Default::default()
    }
);
heap_plugin!(
    recorder,
    "recorder",
    memplug_host::Descriptor { attributes: MEMPLUG_ATTR_HOST_VISIBLE, ..Default::default() }
);

/// `MEMPLUG_HINT_UNINITIALIZED_OK` reaches the plugin only from a binding
/// built with `BindingSpec::uninitialized_ok()`: a binding without it
/// (even one that asks for a location) and the ungoverned allocator send
/// no hint.
#[test]
fn the_host_sends_uninitialized_ok_only_when_the_binding_says_so() {
    let mgr = ProcessMemoryManager::new();
    // SAFETY: the SDK entry of this test binary.
    mgr.register_plugin(
        unsafe { Plugin::from_entry(recorder::entry, "recorder", &Default::default()) }.unwrap(),
    )
    .unwrap();
    let ctx = mgr.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    let pool = mgr.create_pool("p", 1 << 24).unwrap();
    let seen = || {
        let s =
            recorder::STATE.get().unwrap().seen.lock().unwrap().pop().expect("a request reached the plugin");
        s.hints
    };
    let cases = [
        (BindingSpec::new(AllocationClass::Kv), 0, "a plain binding"),
        (BindingSpec::new(AllocationClass::Kv).location(Location::HOST), 0, "a binding with a location"),
        (BindingSpec::new(AllocationClass::Kv).uninitialized_ok(), MEMPLUG_HINT_UNINITIALIZED_OK, "said so"),
    ];
    for (spec, hints, what) in cases {
        let b = mgr.bind(&ctx, &pool, spec).unwrap();
        let a = b.allocate(4096, 64).unwrap();
        assert_eq!(seen(), hints, "{what}");
        drop(a);
    }
    // SAFETY: test harness; the allocation is freed below.
    let api = unsafe { ctx.mechanism().ungoverned() };
    let a = api.allocator().allocate(4096, 64).unwrap();
    assert_eq!(seen(), 0, "the ungoverned allocator");
    api.allocator().deallocate(a).unwrap();
    assert_eq!(pool.used(), 0);
}

// ---- raw ABI: a plugin's own answers ----

unsafe extern "C" fn record(ctx: *mut c_void, msg: *const c_char, len: usize) {
    let s = &mut *(ctx as *mut String);
    *s = String::from_utf8_lossy(std::slice::from_raw_parts(msg.cast::<u8>(), len)).into_owned();
}

/// A plugin library negotiated with directly, as a 1.2 host with no
/// services.
struct Raw {
    _lib: libloading::Library,
    plugin: *const MemplugPlugin,
    agreed: u32,
}

impl Raw {
    fn open(path: &Path) -> Raw {
        // SAFETY: a plugin library of this repository.
        let lib = unsafe { libloading::Library::new(path) }.expect("dlopen");
        // SAFETY: the ABI's entry type.
        let entry: MemplugEntryV1 = *unsafe { lib.get::<MemplugEntryV1>(b"memplug_plugin_v1\0") }.unwrap();
        let host = MemplugHostInfo {
            struct_size: MEMPLUG_HOST_INFO_SIZE_1_2,
            abi_major: 1,
            min_minor: 0,
            max_minor: 2,
            host_name: c"memory_descriptor".as_ptr(),
            services: core::ptr::null(),
        };
        let mut out = MemplugNegotiation {
            struct_size: MEMPLUG_NEGOTIATION_SIZE_1_2,
            agreed_minor: 0,
            plugin: core::ptr::null(),
        };
        // SAFETY: valid arguments for the call; no sink.
        let st = unsafe { entry(&host, &mut out, core::ptr::null()) };
        assert_eq!(st, MEMPLUG_STATUS_OK, "{}", path.display());
        Raw { _lib: lib, plugin: out.plugin, agreed: out.agreed_minor }
    }

    fn mechanism(&self) -> &MemplugMechanism {
        // SAFETY: the plugin's descriptor, valid until unload.
        unsafe { &**(*self.plugin).mechanisms }
    }

    fn live(&self) -> u64 {
        // SAFETY: as above.
        let p = unsafe { &*self.plugin };
        unsafe { p.live_objects.unwrap()(p.ctx) }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the descriptor of the negotiation above, unloaded once.
        let p = unsafe { &*self.plugin };
        if !std::thread::panicking() {
            assert_eq!(self.live(), 0, "every object was released");
        }
        if let Some(unload) = p.unload {
            unsafe { unload(p.ctx) };
        }
    }
}

/// A 1.2 request, every 1.2 field present.
fn request_1_2(size: u64, alignment: u64, device: MemplugDevice, object_id: u64) -> MemplugRequest {
    MemplugRequest {
        struct_size: MEMPLUG_REQUEST_SIZE_1_2,
        size,
        alignment,
        object_id,
        device,
        ..Default::default()
    }
}

/// Calls `f` with a sink and returns its status and the message.
fn with_sink(f: impl FnOnce(&MemplugMessageSink) -> MemplugStatus) -> (MemplugStatus, String) {
    let mut msg = String::new();
    let sink = MemplugMessageSink { ctx: (&mut msg as *mut String).cast(), write: Some(record) };
    let st = f(&sink);
    (st, msg)
}

fn object_ref(m: &MemplugMechanism, object_id: u64, b: &MemplugBlock) -> MemplugObjectRef {
    MemplugObjectRef {
        struct_size: MEMPLUG_OBJECT_REF_SIZE_1_0,
        reserved0: 0,
        mechanism_id: m.mechanism_id,
        device: m.device,
        object_id,
        addr: b.addr,
        size: b.size,
        handle: b.handle,
    }
}

/// Hints are hints: a request with every hint bit set, the ones no minor
/// defines included, is served as one without (allocate, reserve, create),
/// while a flag bit the ABI does not define is refused — by the CPU plugin
/// (the SDK) and by the future plugin (plain C).
#[test]
fn unknown_hint_bits_never_make_a_request_fail() {
    for path in [cpu_plugin(), future_plugin()] {
        let raw = Raw::open(&path);
        assert_eq!(raw.agreed, 2, "{}", path.display());
        let m = raw.mechanism();
        // SAFETY: published tables, valid until unload.
        let a = unsafe { &*m.allocator };
        let mut r = request_1_2(4096, 64, m.device, 101);
        r.hints = u32::MAX;
        let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_2, ..Default::default() };
        let (st, msg) = with_sink(|s| unsafe { a.allocate.unwrap()(m.ctx, &r, &mut b, s) });
        assert_eq!(st, MEMPLUG_STATUS_OK, "{}: allocate with every hint bit: {msg}", path.display());
        let o = object_ref(m, 101, &b);
        assert_eq!(unsafe { a.deallocate.unwrap()(m.ctx, &o, core::ptr::null()) }, MEMPLUG_STATUS_OK);

        let mut flagged = request_1_2(4096, 64, m.device, 102);
        flagged.flags = 1 << 31;
        let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_2, ..Default::default() };
        let st = unsafe { a.allocate.unwrap()(m.ctx, &flagged, &mut b, core::ptr::null()) };
        assert_ne!(
            st,
            MEMPLUG_STATUS_OK,
            "{}: an unknown flag bit is refused, unlike a hint",
            path.display()
        );
        assert_eq!(raw.live(), 0);

        let mut props = MemplugProperties { struct_size: MEMPLUG_PROPERTIES_SIZE_1_2, ..Default::default() };
        assert_eq!(unsafe { a.properties.unwrap()(m.ctx, &mut props, core::ptr::null()) }, MEMPLUG_STATUS_OK);
        let g = props.granularity;
        if !m.virtual_backing.is_null() {
            let vb = unsafe { &*m.virtual_backing };
            let mut r = request_1_2(g, g, m.device, 103);
            r.hints = u32::MAX;
            let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_2, ..Default::default() };
            let (st, msg) = with_sink(|s| unsafe { vb.reserve.unwrap()(m.ctx, &r, &mut b, s) });
            assert_eq!(st, MEMPLUG_STATUS_OK, "{}: reserve with every hint bit: {msg}", path.display());
            let o = object_ref(m, 103, &b);
            assert_eq!(unsafe { vb.release.unwrap()(m.ctx, &o, core::ptr::null()) }, MEMPLUG_STATUS_OK);
        }
        if !m.shared_mapping.is_null() {
            let sm = unsafe { &*m.shared_mapping };
            let mut r = request_1_2(g, g, m.device, 104);
            r.hints = u32::MAX;
            let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_2, ..Default::default() };
            let (st, msg) = with_sink(|s| unsafe { sm.create.unwrap()(m.ctx, &r, &mut b, s) });
            assert_eq!(st, MEMPLUG_STATUS_OK, "{}: create with every hint bit: {msg}", path.display());
            let o = object_ref(m, 104, &b);
            assert_eq!(unsafe { sm.release.unwrap()(m.ctx, &o, core::ptr::null()) }, MEMPLUG_STATUS_OK);
        }
        assert_eq!(raw.live(), 0);
    }
}

/// `export_handle` checks the caller's `MemplugHandle` before it makes
/// anything: one shorter than the struct it writes is refused with nothing
/// written; one longer than it knows gets its bytes and nothing past them;
/// an exact one gets a new descriptor of the kind asked for.
#[test]
fn export_handle_writes_only_on_success_and_never_past_struct_size() {
    const GUARD: u8 = 0x5c;
    let raw = Raw::open(&cpu_plugin());
    let m = raw.mechanism();
    assert_ne!(m.capabilities & MEMPLUG_CAP_TYPED_EXPORT, 0);
    // SAFETY: published table, long enough for the 1.2 slots (the bit).
    let sm = unsafe { &*m.shared_mapping };
    assert!(sm.struct_size >= MEMPLUG_SHARED_MAPPING_SIZE_1_2);
    let mut r = request_1_2(4096, 4096, m.device, 201);
    r.export_types = MEMPLUG_HANDLE_MEMFD;
    let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_2, ..Default::default() };
    assert_eq!(unsafe { sm.create.unwrap()(m.ctx, &r, &mut b, core::ptr::null()) }, MEMPLUG_STATUS_OK);
    let o = object_ref(m, 201, &b);
    let export = sm.export_handle.unwrap();
    let sizes =
        [0, 8, 16, MEMPLUG_HANDLE_SIZE_1_2 - 1, MEMPLUG_HANDLE_SIZE_1_2, MEMPLUG_HANDLE_SIZE_1_2 + 64];
    /// A `MemplugHandle`'s room and more, aligned as one.
    #[repr(C, align(8))]
    struct Room([u8; MEMPLUG_HANDLE_SIZE_1_2 as usize + 128]);
    for declared in sizes {
        let mut room = Room([GUARD; MEMPLUG_HANDLE_SIZE_1_2 as usize + 128]);
        let buf = &mut room.0;
        buf[..4].copy_from_slice(&declared.to_ne_bytes());
        let out = buf.as_mut_ptr().cast::<MemplugHandle>();
        let (st, msg) = with_sink(|s| unsafe { export(m.ctx, &o, MEMPLUG_HANDLE_MEMFD, out, s) });
        let untouched_from = if st == MEMPLUG_STATUS_OK { declared as usize } else { 4 };
        assert!(
            buf[untouched_from..].iter().all(|&x| x == GUARD),
            "struct_size {declared}, status {st} ({msg}): written past byte {untouched_from}"
        );
        if declared < MEMPLUG_HANDLE_SIZE_1_2 {
            assert_eq!(st, MEMPLUG_STATUS_INVALID_ARGUMENT, "struct_size {declared}: {msg}");
            continue;
        }
        assert_eq!(st, MEMPLUG_STATUS_OK, "struct_size {declared}: {msg}");
        // SAFETY: at least MEMPLUG_HANDLE_SIZE_1_2 bytes, written above.
        let h = unsafe { out.read_unaligned() };
        assert_eq!((h.struct_size, h.handle_type), (declared, MEMPLUG_HANDLE_MEMFD));
        assert!(h.fd > 2, "a new descriptor: {}", h.fd);
        let link = std::fs::read_link(format!("/proc/self/fd/{}", h.fd)).unwrap();
        assert!(link.to_string_lossy().starts_with("/memfd:"), "{link:?}");
        // SAFETY: a new descriptor the caller owns (the ABI), closed once.
        drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(h.fd) });
    }
    assert_eq!(unsafe { sm.release.unwrap()(m.ctx, &o, core::ptr::null()) }, MEMPLUG_STATUS_OK);
}

/// `import_handle` makes an object of `request.size` bytes rounded up to
/// the granularity, and refuses a size beyond the memory behind the handle
/// (nothing made); the imported object shares the exporter's memory.
#[test]
fn import_handle_rounds_up_and_never_exceeds_the_memory_behind_the_handle() {
    let p = Plugin::load(cpu_plugin()).unwrap();
    let m = &p.mechanisms()[0];
    let g = m.properties().granularity;
    // SAFETY: test harness; every object is released below.
    let api = unsafe { m.ungoverned() };
    let (sm, vb) = (api.shared_mapping().unwrap(), api.virtual_backing().unwrap());
    let placed = Placement { export_types: MEMPLUG_HANDLE_MEMFD, ..Default::default() };
    let a = sm.create_placed(2 * g, AllocationClass::Other, &placed).unwrap();
    let h = sm.export_handle(&a, MEMPLUG_HANDLE_MEMFD).unwrap();
    let Handle::Fd { kind, fd } = &h else { panic!("{h:?}") };
    let live = || m.live(memplug_host::ObjectKind::PhysicalObject);
    let before = live();
    let e = sm.import_handle(HandleRef::Fd { kind: *kind, fd: fd.as_fd() }, 3 * g).unwrap_err();
    assert_ne!(e.status, Status::Ok, "{e}");
    assert_eq!(live(), before, "a refused import made nothing");
    let b = sm.import_handle(HandleRef::Fd { kind: *kind, fd: fd.as_fd() }, g + 1).unwrap();
    assert_eq!(b.size(), 2 * g, "g + 1 bytes rounded up to the granularity");
    assert!(fd.as_raw_fd() > 2, "the caller's descriptor stays open");
    drop(h);
    let (ra, rb) = (vb.reserve(2 * g).unwrap(), vb.reserve(2 * g).unwrap());
    sm.map(&a, 0, &ra, 0, 2 * g, Access::ReadWrite).unwrap();
    sm.map(&b, 0, &rb, 0, 2 * g, Access::ReadOnly).unwrap();
    // SAFETY: both map the same 2 g bytes.
    unsafe { std::ptr::copy_nonoverlapping(b"imported".as_ptr(), (ra.addr() + g) as *mut u8, 8) };
    assert_eq!(unsafe { bytes_at(rb.addr() + g, 8) }, b"imported");
    sm.unmap(&rb, 0, 2 * g).unwrap();
    sm.unmap(&ra, 0, 2 * g).unwrap();
    vb.release(rb).unwrap();
    vb.release(ra).unwrap();
    sm.release(b).unwrap();
    sm.release(a).unwrap();
    p.unload().unwrap();
}

// ---- a mechanism whose objects map only whole ----

/// Bookkeeping only: addresses are never dereferenced.
#[derive(Default)]
struct WholeState {
    next: u64,
    /// Live reservations and physical objects: handle → size.
    live: HashMap<u64, u64>,
    /// Every `map` call: (object handle, object size, object offset, len).
    maps: Vec<(u64, u64, u64, u64)>,
    /// Live mappings: (reservation handle, offset, len).
    mapped: Vec<(u64, u64, u64)>,
}

static WHOLE: Mutex<Option<WholeState>> = Mutex::new(None);

fn whole() -> MutexGuard<'static, Option<WholeState>> {
    WHOLE.lock().unwrap_or_else(PoisonError::into_inner)
}

const WHOLE_GRAN: u64 = 64 << 10;

struct WholeOnly;

impl WholeOnly {
    fn make(size: u64, addr_of: impl FnOnce(u64) -> u64) -> memplug_sdk::Block {
        let mut g = whole();
        let s = g.get_or_insert_with(Default::default);
        s.next += 1;
        let h = s.next;
        let size = size.div_ceil(WHOLE_GRAN) * WHOLE_GRAN;
        s.live.insert(h, size);
        memplug_sdk::Block { addr: addr_of(h), size, handle: h }
    }
    fn forget(handle: u64) -> memplug_sdk::PluginResult<()> {
        let mut g = whole();
        let s = g.get_or_insert_with(Default::default);
        s.live
            .remove(&handle)
            .ok_or_else(|| memplug_sdk::PluginError::unknown_allocation("no such object"))?;
        s.mapped.retain(|m| m.0 != handle);
        Ok(())
    }
}

impl memplug_sdk::Allocator for WholeOnly {
    fn properties(&self) -> memplug_sdk::Properties {
        memplug_sdk::Properties { min_alignment: 8, max_alignment: 4096, granularity: WHOLE_GRAN }
    }
    fn descriptor(&self) -> Descriptor {
        Descriptor {
            page_sizes: Descriptor::page_size_bit(WHOLE_GRAN),
            location: Location::DEVICE,
            maps_at_offsets: false,
            ..Default::default()
        }
    }
    fn allocate(&self, _: &memplug_sdk::Request) -> memplug_sdk::PluginResult<memplug_sdk::Block> {
        Err(memplug_sdk::PluginError::unsupported("no allocator"))
    }
    fn deallocate(&self, _: &memplug_sdk::ObjectRef) -> memplug_sdk::PluginResult<()> {
        Err(memplug_sdk::PluginError::unsupported("no allocator"))
    }
}

impl memplug_sdk::VirtualBacking for WholeOnly {
    fn reserve(&self, r: &memplug_sdk::Request) -> memplug_sdk::PluginResult<memplug_sdk::Block> {
        Ok(Self::make(r.size, |h| h << 40))
    }
    fn commit(&self, _: &memplug_sdk::ObjectRef, _: u64, _: u64) -> memplug_sdk::PluginResult<()> {
        Ok(())
    }
    fn decommit(&self, _: &memplug_sdk::ObjectRef, _: u64, _: u64) -> memplug_sdk::PluginResult<()> {
        Ok(())
    }
    fn committed_bytes(&self, _: &memplug_sdk::ObjectRef) -> memplug_sdk::PluginResult<u64> {
        Ok(0)
    }
    fn release(&self, r: &memplug_sdk::ObjectRef) -> memplug_sdk::PluginResult<()> {
        Self::forget(r.handle)
    }
}

impl memplug_sdk::SharedMapping for WholeOnly {
    fn create(&self, r: &memplug_sdk::Request) -> memplug_sdk::PluginResult<memplug_sdk::Block> {
        Ok(Self::make(r.size, |_| 0))
    }
    fn map(
        &self,
        object: &memplug_sdk::ObjectRef,
        object_offset: u64,
        reservation: &memplug_sdk::ObjectRef,
        offset: u64,
        len: u64,
        _: memplug_sdk::Access,
    ) -> memplug_sdk::PluginResult<()> {
        let mut g = whole();
        let s = g.get_or_insert_with(Default::default);
        let size = s.live.get(&object.handle).copied().unwrap_or(0);
        s.maps.push((object.handle, size, object_offset, len));
        s.mapped.push((reservation.handle, offset, len));
        Ok(())
    }
    fn unmap(
        &self,
        reservation: &memplug_sdk::ObjectRef,
        offset: u64,
        len: u64,
    ) -> memplug_sdk::PluginResult<()> {
        let mut g = whole();
        let s = g.get_or_insert_with(Default::default);
        let before = s.mapped.len();
        s.mapped.retain(|m| *m != (reservation.handle, offset, len));
        if s.mapped.len() == before {
            return Err(memplug_sdk::PluginError::new(Status::InvalidState, "no such mapping"));
        }
        Ok(())
    }
    fn retain(&self, _: &memplug_sdk::ObjectRef) -> memplug_sdk::PluginResult<()> {
        Err(memplug_sdk::PluginError::unsupported("no retain"))
    }
    fn release(&self, o: &memplug_sdk::ObjectRef) -> memplug_sdk::PluginResult<()> {
        Self::forget(o.handle)
    }
}

mod whole_only {
    use memplug_sdk::*;
    fn init() -> ExportedPlugin {
        PluginBuilder::new("whole-only", "1")
            .mechanism(
                MechanismBuilder::new("whole", 5, super::CPU0, super::WholeOnly)
                    .virtual_backing()
                    .shared_mapping()
                    .build(),
            )
            .live_objects(|| super::whole().as_ref().map_or(0, |s| s.live.len() as u64))
            .build()
    }
    declare_entry!(pub entry, init);
}

/// A mechanism without `MEMPLUG_PROP_MAPS_AT_OFFSETS` (its objects map
/// only whole, at offset 0): a shared prefix, filled and then mapped into
/// several regions that grow past it, is only ever mapped whole.
#[test]
fn without_maps_at_offsets_the_host_maps_objects_whole() {
    let mgr = ProcessMemoryManager::new();
    // SAFETY: the SDK entry of this test binary.
    let p = unsafe { Plugin::from_entry(whole_only::entry, "whole-only", &Default::default()) }.unwrap();
    assert!(!p.mechanisms()[0].properties().descriptor.maps_at_offsets);
    mgr.register_plugin(p).unwrap();
    let req = Requirements { virtual_backing: true, shared_mapping: true, sync: false };
    let ctx = mgr.select(CPU0, req).unwrap();
    let pool = mgr.create_pool("p", 1 << 30).unwrap();
    let b = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    for size in [1, WHOLE_GRAN, 3 * WHOLE_GRAN + 1] {
        let prefix = b.create_shared(size, |_| {}).unwrap();
        let mut regions = Vec::new();
        for _ in 0..3 {
            let mut r = b.reserve_virtual(prefix.len() + 4 * WHOLE_GRAN).unwrap();
            r.map_prefix(&prefix).unwrap();
            r.grow_to(prefix.len() + WHOLE_GRAN, |_| Ok::<(), ()>(())).unwrap();
            regions.push(r);
        }
        drop(regions);
        drop(prefix);
    }
    mgr.drain(std::time::Duration::from_secs(10));
    let g = whole();
    let s = g.as_ref().unwrap();
    assert_eq!(s.maps.len(), 3 * 4, "a fill and three regions per prefix: {:?}", s.maps);
    let partial: Vec<_> = s.maps.iter().filter(|(_, size, off, len)| *off != 0 || len != size).collect();
    assert!(partial.is_empty(), "(object, size, offset, len) not mapped whole: {partial:?}");
    assert!(s.live.is_empty() && s.mapped.is_empty(), "everything released");
}

// ---- device kinds ----

/// The device kinds are DLPack's `DLDeviceType` numbers, and memplug
/// assigns none in the vendor range (`MEMPLUG_DEVICE_VENDOR_FIRST..=
/// MEMPLUG_DEVICE_VENDOR_LAST`, the range's own two bounds aside).
#[test]
fn device_kinds_are_dlpacks_and_none_lies_in_the_vendor_range() {
    // dlpack.h, DLDeviceType.
    let dlpack: &[(&str, i128)] = &[
        ("CPU", 1),
        ("CUDA", 2),
        ("CUDA_HOST", 3),
        ("OPENCL", 4),
        ("VULKAN", 7),
        ("METAL", 8),
        ("VPI", 9),
        ("ROCM", 10),
        ("ROCM_HOST", 11),
        ("EXT_DEV", 12),
        ("CUDA_MANAGED", 13),
        ("ONEAPI", 14),
        ("WEBGPU", 15),
        ("HEXAGON", 16),
        ("MAIA", 17),
    ];
    let (first, last) = (MEMPLUG_DEVICE_VENDOR_FIRST as i128, MEMPLUG_DEVICE_VENDOR_LAST as i128);
    assert_eq!((first, last), (0x1_0000, 0x1_ffff));
    let kinds: Vec<(&str, i128)> = sdk::int_constants()
        .into_iter()
        .filter_map(|(n, v)| Some((n.strip_prefix("MEMPLUG_DEVICE_")?, v)))
        // The range's bounds, and MEMPLUG_DEVICE_IDENTITY_SIZE_1_2 (a size).
        .filter(|(n, _)| !n.starts_with("VENDOR_") && !n.starts_with("IDENTITY_"))
        .collect();
    assert_eq!(kinds, dlpack, "every MEMPLUG_DEVICE_* kind, in order, is DLPack's");
    for (name, v) in &kinds {
        assert!(!(first..=last).contains(v), "MEMPLUG_DEVICE_{name} = {v:#x} lies in the vendor range");
    }
}
