//! What the export layer checks before a vendor's trait is called: request
//! flags, sizes, alignments and devices; every reference's mechanism and
//! device; empty, unaligned and overflowing ranges. Each refusal must reach
//! no trait method, return its code and explain itself; what passes must
//! reach the trait as documented (the alignment raised to `min_alignment`).

use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const ID: u64 = 7;
const DEV: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 3 };
const MIN: u64 = 16;
const MAX: u64 = 4096;
const G: u64 = 0x1000;

/// Calls that reached the vendor, and the last request it saw.
static CALLS: AtomicU64 = AtomicU64::new(0);
static PROPERTIES_CALLS: AtomicU64 = AtomicU64::new(0);
static SEEN: Mutex<Option<Request>> = Mutex::new(None);
/// The tests share the counters: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn reached() -> PluginResult<()> {
    CALLS.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

fn made(r: &Request) -> PluginResult<Block> {
    CALLS.fetch_add(1, Ordering::SeqCst);
    *SEEN.lock().unwrap() = Some(*r);
    Ok(Block { addr: 0x10000, size: r.size, handle: 1 })
}

struct Recorder;

impl Allocator for Recorder {
    fn properties(&self) -> Properties {
        PROPERTIES_CALLS.fetch_add(1, Ordering::SeqCst);
        Properties { min_alignment: MIN, max_alignment: MAX, granularity: G }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        made(r)
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        reached()
    }
}

impl VirtualBacking for Recorder {
    fn reserve(&self, r: &Request) -> PluginResult<Block> {
        made(r)
    }
    fn commit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        reached()
    }
    fn decommit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        reached()
    }
    fn committed_bytes(&self, _: &ObjectRef) -> PluginResult<u64> {
        reached().map(|()| 0)
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        reached()
    }
}

impl SharedMapping for Recorder {
    fn create(&self, r: &Request) -> PluginResult<Block> {
        made(r)
    }
    fn map(&self, _: &ObjectRef, _: u64, _: &ObjectRef, _: u64, _: u64, _: Access) -> PluginResult<()> {
        reached()
    }
    fn unmap(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        reached()
    }
    fn retain(&self, _: &ObjectRef) -> PluginResult<()> {
        reached()
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        reached()
    }
}

fn plugin() -> ExportedPlugin {
    PluginBuilder::new("recorder", "1")
        .mechanism(MechanismBuilder::new("rec", ID, DEV, Recorder).virtual_backing().shared_mapping().build())
        .live_objects(|| 0)
        .build()
}
declare_entry!(entry, plugin);

struct Msgs(Vec<String>);
unsafe extern "C" fn keep(ctx: *mut c_void, msg: *const c_char, len: usize) {
    let m = &mut *(ctx as *mut Msgs);
    m.0.push(String::from_utf8_lossy(std::slice::from_raw_parts(msg.cast(), len)).into_owned());
}

/// The mechanism's 1.1 descriptor; the test holds [`SERIAL`] while using it.
fn mechanism() -> (&'static MemplugMechanism, std::sync::MutexGuard<'static, ()>) {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = MemplugHostInfo {
        struct_size: MEMPLUG_HOST_INFO_SIZE_1_1,
        abi_major: 1,
        min_minor: 0,
        max_minor: 1,
        host_name: std::ptr::null(),
        services: core::ptr::null(),
    };
    let mut out = MemplugNegotiation {
        struct_size: MEMPLUG_NEGOTIATION_SIZE_1_1,
        agreed_minor: 0,
        plugin: std::ptr::null(),
    };
    // SAFETY: valid pointers; the plugin is never unloaded here, so its
    // descriptors stay valid.
    unsafe {
        assert_eq!(entry(&host, &mut out, std::ptr::null()), MEMPLUG_STATUS_OK);
        (&**(*out.plugin).mechanisms, serial)
    }
}

/// Runs a slot with a message sink; returns its status and message (one).
fn call(f: impl FnOnce(*const MemplugMessageSink) -> MemplugStatus) -> (MemplugStatus, Option<String>) {
    let mut msgs = Msgs(Vec::new());
    let sink = MemplugMessageSink { ctx: (&mut msgs as *mut Msgs).cast(), write: Some(keep) };
    let st = f(&sink);
    assert!(msgs.0.len() <= 1, "{:?}", msgs.0);
    (st, msgs.0.pop())
}

fn req(size: u64, alignment: u64) -> MemplugRequest {
    MemplugRequest {
        struct_size: MEMPLUG_REQUEST_SIZE_1_1,
        flags: 0,
        size,
        alignment,
        object_id: 42,
        device: DEV,
        class_tag: 0,
        reserved0: 0,
        ..Default::default()
    }
}

fn obj() -> MemplugObjectRef {
    MemplugObjectRef {
        struct_size: MEMPLUG_OBJECT_REF_SIZE_1_0,
        reserved0: 0,
        mechanism_id: ID,
        device: DEV,
        object_id: 42,
        addr: 0x10000,
        size: 8 * G,
        handle: 1,
    }
}

/// Asserts `f` is refused with `want` and a message containing `says`,
/// without reaching the vendor.
#[track_caller]
fn refused(want: MemplugStatus, says: &str, f: impl FnOnce(*const MemplugMessageSink) -> MemplugStatus) {
    let before = CALLS.load(Ordering::SeqCst);
    let (st, msg) = call(f);
    assert_eq!(st, want, "{msg:?}");
    let msg = msg.expect("a refusal explains itself");
    assert!(msg.contains(says), "{msg:?} does not say {says:?}");
    assert_eq!(CALLS.load(Ordering::SeqCst), before, "a refused call reached the vendor: {msg}");
}

#[track_caller]
fn passes(f: impl FnOnce(*const MemplugMessageSink) -> MemplugStatus) {
    let before = CALLS.load(Ordering::SeqCst);
    let (st, msg) = call(f);
    assert_eq!(st, MEMPLUG_STATUS_OK, "{msg:?}");
    assert_eq!(CALLS.load(Ordering::SeqCst), before + 1);
}

fn other_devices() -> [MemplugDevice; 2] {
    [
        MemplugDevice { kind: DEV.kind, ordinal: DEV.ordinal + 1 },
        MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: DEV.ordinal },
    ]
}

#[test]
fn allocate_requests_are_checked_and_the_alignment_raised_to_the_minimum() {
    let (m, _serial) = mechanism();
    let a = unsafe { &*m.allocator };
    let allocate = a.allocate.unwrap();
    // Each call writes its own copy of `out`.
    let out = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_0, ..Default::default() };
    let try_req = |r: MemplugRequest| move |sink| unsafe { allocate(m.ctx, &r, &mut { out }, sink) };

    refused(MEMPLUG_STATUS_INVALID_ARGUMENT, "size is zero", try_req(req(0, MIN)));
    for flags in [1, 0x8000_0000] {
        refused(MEMPLUG_STATUS_INVALID_ARGUMENT, "flags", try_req(MemplugRequest { flags, ..req(64, MIN) }));
    }
    for bad in [0, 3, 24, 2 * MAX, 1 << 63, u64::MAX] {
        refused(MEMPLUG_STATUS_INVALID_ARGUMENT, "alignment", try_req(req(64, bad)));
    }
    for device in other_devices() {
        refused(MEMPLUG_STATUS_WRONG_DEVICE, "device", try_req(MemplugRequest { device, ..req(64, MIN) }));
    }
    // Several faults at once: the device is named first.
    let all_wrong = MemplugRequest { flags: 1, device: other_devices()[0], ..req(0, 3) };
    refused(MEMPLUG_STATUS_WRONG_DEVICE, "device", try_req(all_wrong));

    for (asked, seen) in [(1, MIN), (8, MIN), (MIN, MIN), (64, 64), (MAX, MAX)] {
        passes(try_req(req(100, asked)));
        let r = SEEN.lock().unwrap().expect("the vendor saw the request");
        assert_eq!((r.alignment, r.size, r.object_id, r.device), (seen, 100, 42, DEV), "asked {asked}");
    }
}

#[test]
fn reserve_and_create_requests_are_checked_but_not_their_alignment() {
    let (m, _serial) = mechanism();
    let vb = unsafe { &*m.virtual_backing };
    let sm = unsafe { &*m.shared_mapping };
    let out = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_0, ..Default::default() };
    for (name, slot) in [("reserve", vb.reserve.unwrap()), ("create", sm.create.unwrap())] {
        let go = |r: MemplugRequest| move |sink| unsafe { slot(m.ctx, &r, &mut { out }, sink) };
        refused(MEMPLUG_STATUS_INVALID_ARGUMENT, &format!("{name}: size is zero"), go(req(0, 0)));
        refused(MEMPLUG_STATUS_INVALID_ARGUMENT, "flags", go(MemplugRequest { flags: 2, ..req(G, 0) }));
        for device in other_devices() {
            refused(MEMPLUG_STATUS_WRONG_DEVICE, "device", go(MemplugRequest { device, ..req(G, 0) }));
        }
        // The ABI says the alignment is ignored here: passed as sent.
        for alignment in [0, 3, 1 << 40] {
            passes(go(req(G, alignment)));
            assert_eq!(SEEN.lock().unwrap().unwrap().alignment, alignment);
        }
    }
}

#[test]
fn references_of_another_mechanism_or_device_are_refused_mechanism_first() {
    let (m, _serial) = mechanism();
    let a = unsafe { &*m.allocator };
    let vb = unsafe { &*m.virtual_backing };
    let sm = unsafe { &*m.shared_mapping };
    let foreign = MemplugObjectRef { mechanism_id: ID + 1, ..obj() };
    let both = MemplugObjectRef { device: other_devices()[1], ..foreign };
    let mut bad: Vec<(MemplugObjectRef, MemplugStatus, &str)> = vec![
        (foreign, MEMPLUG_STATUS_WRONG_MECHANISM, "mechanism 8"),
        (both, MEMPLUG_STATUS_WRONG_MECHANISM, "mechanism 8"),
    ];
    for device in other_devices() {
        bad.push((MemplugObjectRef { device, ..obj() }, MEMPLUG_STATUS_WRONG_DEVICE, "device"));
    }
    let mut n = 0u64;
    let good = obj();
    for (o, want, says) in &bad {
        refused(*want, says, |s| unsafe { a.deallocate.unwrap()(m.ctx, o, s) });
        refused(*want, says, |s| unsafe { vb.commit.unwrap()(m.ctx, o, 0, G, s) });
        refused(*want, says, |s| unsafe { vb.decommit.unwrap()(m.ctx, o, 0, G, s) });
        refused(*want, says, |s| unsafe { vb.committed_bytes.unwrap()(m.ctx, o, &mut n, s) });
        refused(*want, says, |s| unsafe { vb.release.unwrap()(m.ctx, o, s) });
        refused(*want, says, |s| unsafe {
            sm.map.unwrap()(m.ctx, o, 0, &good, 0, G, MEMPLUG_ACCESS_READ, s)
        });
        refused(*want, says, |s| unsafe {
            sm.map.unwrap()(m.ctx, &good, 0, o, 0, G, MEMPLUG_ACCESS_READ, s)
        });
        refused(*want, says, |s| unsafe { sm.unmap.unwrap()(m.ctx, o, 0, G, s) });
        refused(*want, says, |s| unsafe { sm.retain.unwrap()(m.ctx, o, s) });
        refused(*want, says, |s| unsafe { sm.release.unwrap()(m.ctx, o, s) });
    }
    passes(|s| unsafe { a.deallocate.unwrap()(m.ctx, &good, s) });
    passes(|s| unsafe { sm.retain.unwrap()(m.ctx, &good, s) });
}

#[test]
fn empty_unaligned_and_overflowing_ranges_are_out_of_range() {
    let (m, _serial) = mechanism();
    let vb = unsafe { &*m.virtual_backing };
    let sm = unsafe { &*m.shared_mapping };
    let o = obj();
    let cases = [
        (G, 0, "is empty"),
        (G / 2, G, "not aligned"),
        (0, G + 1, "not aligned"),
        (u64::MAX - G + 1, 2 * G, "overflows"),
    ];
    let read = MEMPLUG_ACCESS_READ;
    for (off, len, says) in cases {
        let want = MEMPLUG_STATUS_OUT_OF_RANGE;
        refused(want, says, |s| unsafe { vb.commit.unwrap()(m.ctx, &o, off, len, s) });
        refused(want, says, |s| unsafe { vb.decommit.unwrap()(m.ctx, &o, off, len, s) });
        refused(want, says, |s| unsafe { sm.unmap.unwrap()(m.ctx, &o, off, len, s) });
        // Either range of a map.
        refused(want, says, |s| unsafe { sm.map.unwrap()(m.ctx, &o, off, &o, 0, len, read, s) });
        refused(want, says, |s| unsafe { sm.map.unwrap()(m.ctx, &o, 0, &o, off, len, read, s) });
    }
    // Past the object's end is the vendor's to judge (only it knows the
    // size): the SDK lets it through.
    passes(|s| unsafe { vb.commit.unwrap()(m.ctx, &o, 64 * G, G, s) });
    passes(|s| unsafe { sm.map.unwrap()(m.ctx, &o, G, &o, 2 * G, G, read, s) });
    refused(MEMPLUG_STATUS_INVALID_ARGUMENT, "access", |s| unsafe {
        sm.map.unwrap()(m.ctx, &o, 0, &o, 0, G, MEMPLUG_ACCESS_WRITE, s)
    });
}

#[test]
fn properties_are_read_once_and_the_slot_answers_with_them() {
    let (m, _serial) = mechanism();
    let a = unsafe { &*m.allocator };
    let before = PROPERTIES_CALLS.load(Ordering::SeqCst);
    let mut p = MemplugProperties { struct_size: MEMPLUG_PROPERTIES_SIZE_1_0, ..Default::default() };
    for _ in 0..3 {
        assert_eq!(unsafe { a.properties.unwrap()(m.ctx, &mut p, std::ptr::null()) }, MEMPLUG_STATUS_OK);
        assert_eq!((p.min_alignment, p.max_alignment, p.granularity), (MIN, MAX, G));
    }
    assert_eq!(PROPERTIES_CALLS.load(Ordering::SeqCst), before, "the slot called the vendor again");
    assert_eq!(before, 1, "properties() runs once, when the mechanism is built");
}

#[test]
fn every_failure_code_has_a_helper() {
    type Helper = fn(&'static str) -> PluginError;
    let helpers: [(Helper, Status); 15] = [
        (|m| PluginError::unsupported(m), Status::Unsupported),
        (|m| PluginError::invalid_argument(m), Status::InvalidArgument),
        (|m| PluginError::out_of_memory(m), Status::OutOfMemory),
        (|m| PluginError::wrong_mechanism(m), Status::WrongMechanism),
        (|m| PluginError::wrong_device(m), Status::WrongDevice),
        (|m| PluginError::unknown_allocation(m), Status::UnknownAllocation),
        (|m| PluginError::device_unavailable(m), Status::DeviceUnavailable),
        (|m| PluginError::internal(m), Status::Internal),
        (|m| PluginError::out_of_range(m), Status::OutOfRange),
        (|m| PluginError::invalid_state(m), Status::InvalidState),
        (|m| PluginError::version_mismatch(m), Status::VersionMismatch),
        (|m| PluginError::not_ready(m), Status::NotReady),
        (|m| PluginError::timeout(m), Status::Timeout),
        (|m| PluginError::busy(m), Status::Busy),
        (|m| PluginError::device_lost(m), Status::DeviceLost),
    ];
    let failures: Vec<Status> = Status::ALL.iter().copied().filter(|s| *s != Status::Ok).collect();
    assert_eq!(failures, helpers.iter().map(|(_, s)| *s).collect::<Vec<_>>(), "one helper per failure code");
    for (h, s) in helpers {
        assert_eq!(h("why"), PluginError { status: s, message: "why".into() });
    }
}
