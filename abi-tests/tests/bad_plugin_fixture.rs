//! The bad plugin fixture (`abi-tests/c/bad_plugin.c`) misbehaves exactly as
//! its header comment says, one way per variant, so the host's loader tests
//! can trust what they are refusing. Each variant is loaded with libloading
//! and inspected through the raw ABI, with no host code involved; the
//! default must be a working minimal plugin.

mod contained;

use contained::{contained_plugin, CONTAINMENT_VARIANTS};
use core::ffi::{c_char, c_void, CStr};
use memplug_sdk::abi::*;
use memplug_test_support::{bad_plugin, BAD_PLUGIN_VARIANTS};
use std::path::Path;

unsafe extern "C" fn record(ctx: *mut c_void, msg: *const c_char, len: usize) {
    let s = &mut *(ctx as *mut String);
    let bytes = std::slice::from_raw_parts(msg.cast::<u8>(), len);
    *s = String::from_utf8_lossy(bytes).into_owned();
}

/// A loaded fixture and what its entry answered.
struct Loaded {
    _lib: libloading::Library,
    status: MemplugStatus,
    message: String,
    answer: MemplugNegotiation,
}

impl Loaded {
    fn plugin(&self) -> &MemplugPlugin {
        assert!(!self.answer.plugin.is_null(), "no plugin descriptor");
        unsafe { &*self.answer.plugin }
    }

    fn mechanism(&self, i: usize) -> &MemplugMechanism {
        unsafe { &**self.plugin().mechanisms.add(i) }
    }
}

fn load(path: &Path) -> Loaded {
    let lib = unsafe { libloading::Library::new(path) }.expect("dlopen the fixture");
    let entry: MemplugEntryV1 =
        *unsafe { lib.get::<MemplugEntryV1>(b"memplug_plugin_v1\0") }.expect("entry symbol");
    let host = MemplugHostInfo {
        struct_size: MEMPLUG_HOST_INFO_SIZE_1_0,
        abi_major: MEMPLUG_ABI_MAJOR,
        min_minor: 0,
        max_minor: MEMPLUG_ABI_MINOR,
        host_name: c"bad_plugin_fixture".as_ptr(),
        services: core::ptr::null(),
    };
    let mut answer = MemplugNegotiation {
        struct_size: MEMPLUG_NEGOTIATION_SIZE_1_0,
        agreed_minor: u32::MAX,
        plugin: core::ptr::null(),
    };
    let mut message = String::new();
    let sink = MemplugMessageSink { ctx: (&mut message as *mut String).cast(), write: Some(record) };
    let status = unsafe { entry(&host, &mut answer, &sink) };
    Loaded { _lib: lib, status, message, answer }
}

fn load_variant(v: &str) -> Loaded {
    load(&bad_plugin(Some(v)))
}

fn request(size: u64, device: MemplugDevice, object_id: u64) -> MemplugRequest {
    MemplugRequest {
        struct_size: MEMPLUG_REQUEST_SIZE_1_0,
        flags: 0,
        size,
        alignment: 16,
        object_id,
        device,
        class_tag: 0,
        reserved0: 0,
        ..Default::default()
    }
}

/// Allocates and frees through the raw vtable, checking identity and
/// `live_objects` on the way.
fn allocate_and_free(l: &Loaded, device: MemplugDevice) {
    let p = l.plugin();
    let m = l.mechanism(0);
    let a = unsafe { &*m.allocator };
    let live = p.live_objects.expect("live_objects");
    let mut msg = String::new();
    let sink = MemplugMessageSink { ctx: (&mut msg as *mut String).cast(), write: Some(record) };
    let r = request(100, device, 41);
    let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_0, ..Default::default() };
    unsafe {
        assert_eq!(a.allocate.unwrap()(m.ctx, &r, &mut b, &sink), MEMPLUG_STATUS_OK, "{msg}");
        assert_eq!(b.addr % 16, 0);
        core::ptr::write_bytes(b.addr as *mut u8, 0x5a, b.size as usize);
        assert_eq!(live(p.ctx), 1);
        let mut o = MemplugObjectRef {
            struct_size: MEMPLUG_OBJECT_REF_SIZE_1_0,
            reserved0: 0,
            mechanism_id: m.mechanism_id + 1,
            device,
            object_id: 41,
            addr: b.addr,
            size: b.size,
            handle: b.handle,
        };
        assert_eq!(a.deallocate.unwrap()(m.ctx, &o, &sink), MEMPLUG_STATUS_WRONG_MECHANISM);
        o.mechanism_id = m.mechanism_id;
        assert_eq!(a.deallocate.unwrap()(m.ctx, &o, &sink), MEMPLUG_STATUS_OK, "{msg}");
        assert_eq!(a.deallocate.unwrap()(m.ctx, &o, &sink), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
        assert_eq!(live(p.ctx), 0);
    }
}

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

#[test]
fn default_is_a_correct_minimal_plugin() {
    let l = load(&bad_plugin(None));
    assert_eq!(l.status, MEMPLUG_STATUS_OK, "{}", l.message);
    assert_eq!(l.answer.agreed_minor, 0);
    let p = l.plugin();
    assert_eq!(p.struct_size, MEMPLUG_PLUGIN_SIZE_1_0);
    assert_eq!((p.abi_major, p.min_minor, p.max_minor), (1, 0, 0));
    assert_eq!(p.mechanism_count, 1);
    let m = l.mechanism(0);
    assert_eq!(m.struct_size, MEMPLUG_MECHANISM_SIZE_1_0);
    assert_eq!(m.capabilities, MEMPLUG_CAP_ALLOCATOR);
    assert_eq!(m.mechanism_id, 7);
    assert_eq!(unsafe { CStr::from_ptr(m.name) }.to_str(), Ok("bad-plugin"));
    assert_eq!(m.device, CPU0);
    assert!(m.virtual_backing.is_null() && m.shared_mapping.is_null() && m.sync.is_null());
    let a = unsafe { &*m.allocator };
    assert_eq!(a.struct_size, MEMPLUG_ALLOCATOR_SIZE_1_0);
    assert!(a.properties.is_some() && a.allocate.is_some() && a.deallocate.is_some());
    allocate_and_free(&l, CPU0);
}

#[test]
fn every_variant_is_known_to_the_c_source() {
    let src =
        std::fs::read_to_string(memplug_test_support::repo_root().join("abi-tests/c/bad_plugin.c")).unwrap();
    for v in BAD_PLUGIN_VARIANTS {
        assert!(src.contains(&format!("defined({v})")), "{v} is not counted in the #error guard");
        assert!(src.contains(&format!(" * {v} ")), "{v} is not in the header comment");
    }
}

#[test]
fn every_containment_variant_is_known_to_the_c_source() {
    let src =
        std::fs::read_to_string(memplug_test_support::repo_root().join("abi-tests/c/bad_plugin.c")).unwrap();
    for v in CONTAINMENT_VARIANTS {
        assert!(src.contains(&format!("defined({v})")), "{v} is not counted in the #error guard");
        assert!(src.contains(&format!(" * {v} ")), "{v} is not in the header comment");
    }
}

#[test]
fn the_descriptor_variants_speak_only_abi_1_1_and_publish_export_and_import() {
    for v in [
        "BAD_EXPORT_FD_STDIN",
        "BAD_EXPORT_FD_CLOSED",
        "BAD_EXPORT_FD_PIPE",
        "BAD_IMPORT_CLOSES_FD",
        "BAD_EXPORT_NOT_MEMFD",
    ] {
        let l = load(&contained_plugin(v));
        assert_eq!((l.status, l.answer.agreed_minor), (MEMPLUG_STATUS_OK, 1), "{v}: {}", l.message);
        assert_eq!((l.plugin().min_minor, l.plugin().max_minor), (1, 1), "{v}");
        let m = l.mechanism(0);
        assert_ne!(m.capabilities & MEMPLUG_CAP_SHARED_EXPORT, 0, "{v}");
        let sm = unsafe { &*m.shared_mapping };
        assert!(sm.struct_size >= MEMPLUG_SHARED_MAPPING_SIZE_1_1, "{v}");
        assert!(sm.export_fd.is_some() && sm.import_fd.is_some(), "{v}");
    }
    // The others keep speaking 1.0 only.
    let l = load(&contained_plugin("BAD_HOST_FN_TWICE"));
    assert_eq!((l.status, l.answer.agreed_minor), (MEMPLUG_STATUS_OK, 0));
}

#[test]
fn the_escapes_variant_really_puts_control_characters_in_its_names() {
    let l = load(&contained_plugin("BAD_ESCAPES_IN_NAMES"));
    assert_eq!(l.status, MEMPLUG_STATUS_OK, "{}", l.message);
    let name = unsafe { CStr::from_ptr(l.plugin().name) }.to_bytes();
    let version = unsafe { CStr::from_ptr(l.plugin().version) }.to_bytes();
    let mechanism = unsafe { CStr::from_ptr(l.mechanism(0).name) }.to_bytes();
    assert!(name.contains(&0x1b) && name.contains(&0x07) && name.contains(&b'\r'), "{name:?}");
    assert!(version.contains(&0x1b), "{version:?}");
    assert!(mechanism.contains(&0x1b) && mechanism.contains(&b'\n'), "{mechanism:?}");
    for s in [name, version, mechanism] {
        assert!(
            std::str::from_utf8(s).is_ok(),
            "valid UTF-8, so only the escaping stands between it and a terminal"
        );
    }
}

#[test]
#[should_panic(expected = "unknown bad_plugin variant")]
fn a_misspelt_variant_is_refused() {
    bad_plugin(Some("BAD_WRONG_MAJR"));
}

#[test]
fn no_entry() {
    let lib = unsafe { libloading::Library::new(bad_plugin(Some("BAD_NO_ENTRY"))) }.unwrap();
    assert!(unsafe { lib.get::<MemplugEntryV1>(b"memplug_plugin_v1\0") }.is_err());
    assert!(unsafe { lib.get::<MemplugEntryV1>(b"memplug_plugin\0") }.is_ok());
}

#[test]
fn entry_level_variants() {
    let l = load_variant("BAD_WRONG_MAJOR");
    assert_eq!((l.status, l.plugin().abi_major), (MEMPLUG_STATUS_OK, 2));

    let l = load_variant("BAD_VERSION_REFUSE");
    assert_eq!(l.status, MEMPLUG_STATUS_VERSION_MISMATCH);
    assert!(l.message.contains("refuses"), "{:?}", l.message);

    let l = load_variant("BAD_AGREED_MINOR");
    assert_eq!((l.status, l.answer.agreed_minor), (MEMPLUG_STATUS_OK, 7));

    let l = load_variant("BAD_ENTRY_FAILS");
    assert_eq!(l.status, MEMPLUG_STATUS_INTERNAL);
    assert_eq!(l.message, "init failed: no device");

    let l = load_variant("BAD_NULL_PLUGIN");
    assert_eq!(l.status, MEMPLUG_STATUS_OK);
    assert!(l.answer.plugin.is_null());
}

#[test]
fn descriptor_variants() {
    let l = load_variant("BAD_SHORT_PLUGIN");
    assert_eq!(l.plugin().struct_size, 16);

    let l = load_variant("BAD_SHORT_MECHANISM");
    assert_eq!(l.mechanism(0).struct_size, 8);

    let l = load_variant("BAD_SHORT_ALLOCATOR");
    assert_eq!(unsafe { (*l.mechanism(0).allocator).struct_size }, 12);

    let l = load_variant("BAD_NULL_ALLOCATE");
    let a = unsafe { &*l.mechanism(0).allocator };
    assert!(a.allocate.is_none() && a.deallocate.is_some());

    let l = load_variant("BAD_NULL_ALLOCATOR");
    assert!(l.mechanism(0).allocator.is_null());

    let l = load_variant("BAD_FLAG_WITHOUT_POINTER");
    let m = l.mechanism(0);
    assert!(m.capabilities & MEMPLUG_CAP_VIRTUAL_BACKING != 0 && m.virtual_backing.is_null());

    let l = load_variant("BAD_POINTER_WITHOUT_FLAG");
    let m = l.mechanism(0);
    assert!(m.capabilities & MEMPLUG_CAP_SYNC == 0 && !m.sync.is_null());

    let l = load_variant("BAD_ZERO_MECHANISMS");
    assert_eq!(l.plugin().mechanism_count, 0);

    let l = load_variant("BAD_NULL_NAME");
    assert!(l.mechanism(0).name.is_null());

    let l = load_variant("BAD_DUPLICATE_ID");
    assert_eq!(l.plugin().mechanism_count, 2);
    assert_eq!(l.mechanism(0).mechanism_id, l.mechanism(1).mechanism_id);
    assert_ne!(unsafe { CStr::from_ptr(l.mechanism(0).name) }, unsafe {
        CStr::from_ptr(l.mechanism(1).name)
    });

    let l = load_variant("BAD_NO_LIVE_OBJECTS");
    assert!(l.plugin().live_objects.is_none());
}

#[test]
fn variants_a_host_must_load() {
    let l = load_variant("BAD_LIVE_FOREVER");
    assert_eq!(l.status, MEMPLUG_STATUS_OK);
    assert_eq!(unsafe { l.plugin().live_objects.unwrap()(l.plugin().ctx) }, 3);

    let l = load_variant("BAD_UNKNOWN_CAPS");
    assert_eq!(l.mechanism(0).capabilities, MEMPLUG_CAP_ALLOCATOR | (1 << 31));
    allocate_and_free(&l, CPU0);

    let l = load_variant("BAD_UNKNOWN_DEVICE_KIND");
    let device = MemplugDevice { kind: 99, ordinal: 0 };
    assert_eq!(l.mechanism(0).device, device);
    allocate_and_free(&l, device);

    let l = load_variant("BAD_UNKNOWN_STATUS");
    let m = l.mechanism(0);
    let a = unsafe { &*m.allocator };
    let mut msg = String::new();
    let sink = MemplugMessageSink { ctx: (&mut msg as *mut String).cast(), write: Some(record) };
    let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_0, ..Default::default() };
    let status = unsafe { a.allocate.unwrap()(m.ctx, &request(8, CPU0, 1), &mut b, &sink) };
    assert_eq!(status, 777);
    assert!(msg.contains("777"), "{msg:?}");
}

/// Allocates `size` bytes aligned to `alignment` through the raw vtable.
fn raw_allocate(l: &Loaded, size: u64, alignment: u64) -> (MemplugStatus, MemplugBlock) {
    let m = l.mechanism(0);
    let a = unsafe { &*m.allocator };
    let mut b = MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_0, ..Default::default() };
    let mut r = request(size, CPU0, 9);
    r.alignment = alignment;
    let status = unsafe { a.allocate.unwrap()(m.ctx, &r, &mut b, core::ptr::null()) };
    (status, b)
}

#[test]
fn descriptor_misbehaviours_of_the_later_variants() {
    let l = load_variant("BAD_LONG_STRUCTS");
    assert!(l.plugin().struct_size > MEMPLUG_PLUGIN_SIZE_1_0);
    assert!(l.mechanism(0).struct_size > MEMPLUG_MECHANISM_SIZE_1_0);
    assert!(unsafe { (*l.mechanism(0).allocator).struct_size } > MEMPLUG_ALLOCATOR_SIZE_1_0);
    allocate_and_free(&l, CPU0);

    let l = load_variant("BAD_CAPS_ABOVE_MINOR");
    assert_eq!((l.answer.agreed_minor, l.plugin().max_minor), (0, 0));
    assert_eq!(l.mechanism(0).capabilities, MEMPLUG_CAP_ALLOCATOR | (1 << 4));

    let l = load_variant("BAD_DUPLICATE_NAME");
    assert_eq!(l.plugin().mechanism_count, 2);
    assert_ne!(l.mechanism(0).mechanism_id, l.mechanism(1).mechanism_id);
    assert_eq!(unsafe { CStr::from_ptr(l.mechanism(0).name) }, unsafe {
        CStr::from_ptr(l.mechanism(1).name)
    });

    // The [full] variants publish every capability of ABI 1.0.
    for v in [
        "BAD_UNKNOWN_ACCESS",
        "BAD_RANGE_UNCHECKED",
        "BAD_COMMITTED_LIES",
        "BAD_FORGED_FENCE",
        "BAD_FENCE_NEVER",
        "BAD_READ_ONLY_WRITABLE",
    ] {
        let l = load_variant(v);
        let m = l.mechanism(0);
        assert_eq!(m.capabilities, MEMPLUG_CAP_ALL_1_0, "{v}");
        assert!(!m.virtual_backing.is_null() && !m.shared_mapping.is_null() && !m.sync.is_null(), "{v}");
        allocate_and_free(&l, CPU0);
    }
}

#[test]
fn negotiation_misbehaviours_of_the_later_variants() {
    // BAD_NEGOTIATE_LAX says OK to a host of major 2 with a short struct.
    let lib = unsafe { libloading::Library::new(bad_plugin(Some("BAD_NEGOTIATE_LAX"))) }.unwrap();
    let entry = *unsafe { lib.get::<MemplugEntryV1>(b"memplug_plugin_v1\0") }.unwrap();
    let host = MemplugHostInfo {
        struct_size: 8,
        abi_major: 2,
        min_minor: 5,
        max_minor: 9,
        host_name: core::ptr::null(),
        services: core::ptr::null(),
    };
    let mut answer = [0u64; 4];
    answer[0] = 8; // struct_size 8: the answer must not be written past it.
    let status = unsafe { entry(&host, answer.as_mut_ptr().cast(), core::ptr::null()) };
    assert_eq!(status, MEMPLUG_STATUS_OK);
    assert_ne!(answer[1], 0, "the plugin pointer was written past struct_size 8");
}

#[test]
fn allocation_misbehaviours_of_the_later_variants() {
    let l = load_variant("BAD_NULL_BLOCK");
    let (s, b) = raw_allocate(&l, 64, 16);
    assert_eq!((s, b.addr), (MEMPLUG_STATUS_OK, 0));
    assert_eq!(unsafe { l.plugin().live_objects.unwrap()(l.plugin().ctx) }, 0);

    let l = load_variant("BAD_MISALIGNED_BLOCK");
    let (s, b) = raw_allocate(&l, 64, 64);
    assert_eq!((s, b.addr % 64), (MEMPLUG_STATUS_OK, 16));

    let l = load_variant("BAD_LIVE_ZERO");
    let (s, _) = raw_allocate(&l, 64, 16);
    assert_eq!(s, MEMPLUG_STATUS_OK);
    assert_eq!(unsafe { l.plugin().live_objects.unwrap()(l.plugin().ctx) }, 0);

    let l = load_variant("BAD_WRITES_OUT_ON_FAILURE");
    let (s, b) = raw_allocate(&l, 0, 16);
    assert_eq!(s, MEMPLUG_STATUS_INVALID_ARGUMENT);
    assert_ne!(b.addr, 0, "the refused call wrote its output");

    let l = load_variant("BAD_DOUBLE_FREE_OK");
    let m = l.mechanism(0);
    let (s, b) = raw_allocate(&l, 64, 16);
    assert_eq!(s, MEMPLUG_STATUS_OK);
    let o = MemplugObjectRef {
        struct_size: MEMPLUG_OBJECT_REF_SIZE_1_0,
        reserved0: 0,
        mechanism_id: m.mechanism_id,
        device: CPU0,
        object_id: 9,
        addr: b.addr,
        size: b.size,
        handle: b.handle,
    };
    let a = unsafe { &*m.allocator };
    for _ in 0..2 {
        assert_eq!(unsafe { a.deallocate.unwrap()(m.ctx, &o, core::ptr::null()) }, MEMPLUG_STATUS_OK);
    }
}
