//! The host's loader against real `.so` files: every malformed plugin of
//! `abi-tests/c/bad_plugin.c` is refused with a message naming the problem
//! (or, for the variants a correct host accepts, loads and behaves), the
//! host stays up, and the C example plugin — written only against
//! `memplug.h` — loads and works through the safe wrappers.

use memplug_host::{LoadError, ObjectKind, Plugin, Status};
use memplug_test_support::{bad_plugin, compile_c_plugin, repo_root, test_tmp_dir};

fn refused(variant: &str) -> LoadError {
    match Plugin::load(bad_plugin(Some(variant))) {
        Ok(p) => panic!("{variant} loaded: {p:?}"),
        Err(e) => e,
    }
}

fn assert_mentions(e: &LoadError, parts: &[&str]) {
    let text = e.to_string();
    for p in parts {
        assert!(text.contains(p), "message {text:?} does not mention {p:?}");
    }
}

#[test]
fn a_missing_file_is_refused() {
    let e = Plugin::load("/nonexistent/libnothing.so").unwrap_err();
    assert!(matches!(e, LoadError::NotFound(_)), "{e}");
    assert_mentions(&e, &["/nonexistent/libnothing.so", "does not exist"]);
}

#[test]
fn a_file_that_is_not_a_library_is_refused() {
    let dir = test_tmp_dir("not_a_library");
    let path = dir.join("libfake.so");
    std::fs::write(&path, b"this is a text file, not an ELF object\n").unwrap();
    let e = Plugin::load(&path).unwrap_err();
    assert!(matches!(e, LoadError::NotALibrary { .. }), "{e}");
    assert_mentions(&e, &["libfake.so", "not a loadable library"]);
}

#[test]
fn a_library_without_the_entry_symbol_is_refused() {
    let e = refused("BAD_NO_ENTRY");
    assert!(matches!(e, LoadError::MissingEntrySymbol { .. }), "{e}");
    assert_mentions(&e, &["memplug_plugin_v1"]);
}

#[test]
fn a_wrong_major_is_refused() {
    let e = refused("BAD_WRONG_MAJOR");
    assert!(matches!(e, LoadError::Malformed { .. }), "{e}");
    assert_mentions(&e, &["major 2"]);
}

#[test]
fn version_refusals_and_contradictions_are_refused() {
    let e = refused("BAD_VERSION_REFUSE");
    assert!(matches!(e, LoadError::VersionMismatch { .. }), "{e}");
    assert_mentions(&e, &["bad_plugin refuses"]);
    let e = refused("BAD_AGREED_MINOR");
    assert_mentions(&e, &["agreed on minor 7"]);
    let e = refused("BAD_ENTRY_FAILS");
    assert!(matches!(e, LoadError::EntryFailed { status: Status::Internal, .. }), "{e}");
    assert_mentions(&e, &["init failed: no device"]);
    let e = refused("BAD_NULL_PLUGIN");
    assert!(matches!(e, LoadError::NullRequired { .. }), "{e}");
    assert_mentions(&e, &["plugin descriptor"]);
}

#[test]
fn short_structs_are_refused_with_their_sizes() {
    for (variant, what, declared, required) in [
        ("BAD_SHORT_PLUGIN", "plugin descriptor", 16, 72),
        ("BAD_SHORT_MECHANISM", "mechanism #0", 8, 72),
        ("BAD_SHORT_ALLOCATOR", "allocator", 12, 40),
    ] {
        let e = refused(variant);
        match &e {
            LoadError::ShortStruct { what: w, declared: d, required: r, .. } => {
                assert!(w.contains(what), "{variant}: {e}");
                assert_eq!((*d, *r), (declared, required), "{variant}: {e}");
            }
            other => panic!("{variant}: expected ShortStruct, got {other}"),
        }
    }
}

#[test]
fn null_required_slots_are_refused_naming_the_slot() {
    for (variant, slot) in [
        ("BAD_NULL_ALLOCATE", "allocator.allocate"),
        ("BAD_NO_LIVE_OBJECTS", "live_objects"),
        ("BAD_NULL_NAME", "name"),
    ] {
        let e = refused(variant);
        assert!(matches!(e, LoadError::NullRequired { .. }), "{variant}: {e}");
        assert_mentions(&e, &[slot]);
    }
    let e = refused("BAD_NULL_ALLOCATOR");
    assert_mentions(&e, &["allocator pointer is NULL"]);
}

#[test]
fn lying_capability_flags_are_refused_saying_which() {
    let e = refused("BAD_FLAG_WITHOUT_POINTER");
    assert!(matches!(e, LoadError::CapabilityMismatch { .. }), "{e}");
    assert_mentions(&e, &["MEMPLUG_CAP_VIRTUAL_BACKING is set", "virtual_backing pointer is NULL"]);
    let e = refused("BAD_POINTER_WITHOUT_FLAG");
    assert!(matches!(e, LoadError::CapabilityMismatch { .. }), "{e}");
    assert_mentions(&e, &["sync pointer is set", "MEMPLUG_CAP_SYNC is not"]);
}

#[test]
fn zero_or_duplicate_mechanisms_are_refused() {
    assert_mentions(&refused("BAD_ZERO_MECHANISMS"), &["no mechanism"]);
    assert_mentions(&refused("BAD_DUPLICATE_ID"), &["share id 7"]);
}

#[test]
fn an_unknown_status_code_is_mapped_conservatively_and_kept() {
    let p = Plugin::load(bad_plugin(Some("BAD_UNKNOWN_STATUS"))).unwrap();
    let e = unsafe { p.mechanisms()[0].ungoverned() }.allocator().allocate(64, 16).unwrap_err();
    assert_eq!(e.status, Status::Internal);
    assert_eq!(e.raw, 777);
    assert!(e.is_unknown_code());
    assert!(e.to_string().contains("unknown status code 777"), "{e}");
    assert!(!e.message.is_empty());
    assert_eq!(p.mechanisms()[0].live(ObjectKind::Allocation), 0);
}

#[test]
fn unknown_capability_bits_and_device_kinds_load_conservatively() {
    let p = Plugin::load(bad_plugin(Some("BAD_UNKNOWN_CAPS"))).unwrap();
    let m = &p.mechanisms()[0];
    assert_eq!(m.capabilities().unknown_bits(), 1 << 31);
    assert!(unsafe { m.ungoverned() }.virtual_backing().is_none() && m.sync().is_none());
    let p = Plugin::load(bad_plugin(Some("BAD_UNKNOWN_DEVICE_KIND"))).unwrap();
    assert_eq!(p.mechanisms()[0].device().to_string(), "unknown(99):0");
}

#[test]
fn a_plugin_reporting_live_objects_refuses_to_unload() {
    let p = Plugin::load(bad_plugin(Some("BAD_LIVE_FOREVER"))).unwrap();
    let refused = p.unload().unwrap_err();
    assert_eq!(refused.report.plugin_reported, 3);
    assert!(refused.to_string().contains("reports 3 live object"), "{refused}");
}

#[test]
fn the_correct_default_loads_allocates_and_unloads() {
    let p = Plugin::load(bad_plugin(None)).unwrap();
    let m = p.mechanisms()[0].clone();
    let a = unsafe { m.ungoverned() }.allocator().allocate(100, 16).unwrap();
    assert_eq!(a.addr() % 16, 0);
    // A live allocation and a held mechanism handle both keep it loaded.
    let p = match p.unload() {
        Ok(()) => panic!("unloaded with a live allocation"),
        Err(refused) => {
            let text = refused.to_string();
            assert!(text.contains("1 allocations of mechanism"), "{text}");
            assert!(text.contains("handle(s)"), "{text}");
            refused.plugin
        }
    };
    unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    drop(m);
    p.unload().unwrap();
}

/// The vendor's view: the C example plugin, built only against
/// `include/memplug.h`, loads through the same checks and works.
#[test]
fn the_c_example_plugin_loads_and_works() {
    let src = repo_root().join("c-examples/plugin/example_plugin.c");
    let so = compile_c_plugin(&src, &[], "example_plugin_host_test");
    let p = Plugin::load(&so).unwrap();
    assert_eq!(p.abi_version(), (1, 0));
    let m = p.mechanism("c-example").expect("mechanism c-example").clone();
    assert!(unsafe { m.ungoverned() }.virtual_backing().is_some());
    let a = unsafe { m.ungoverned() }.allocator().allocate(4096, 256).unwrap();
    assert_eq!(a.addr() % 256, 0);
    let vb = unsafe { m.ungoverned() }.virtual_backing().unwrap();
    let g = m.properties().granularity;
    let r = vb.reserve(16 * g).unwrap();
    vb.commit(&r, 0, 4 * g).unwrap();
    // SAFETY: committed read-write just above.
    unsafe { (r.addr() as *mut u8).write(42) };
    assert_eq!(vb.committed_bytes(&r).unwrap(), 4 * g);
    let e = vb.decommit(&r, 4 * g, g).unwrap_err();
    assert_eq!(e.status, Status::InvalidState, "{e}");
    let e = vb.commit(&r, u64::MAX - g + 1, 2 * g).unwrap_err();
    assert_eq!(e.status, Status::OutOfRange, "{e}");
    vb.decommit(&r, 0, 4 * g).unwrap();
    assert_eq!(vb.committed_bytes(&r).unwrap(), 0);
    vb.release(r).unwrap();
    unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    assert_eq!(p.plugin_live_objects(), 0);
    drop(m);
    p.unload().unwrap();
}

#[test]
fn a_forged_or_double_freed_allocation_is_refused_and_changes_nothing() {
    let p = Plugin::load(bad_plugin(None)).unwrap();
    let m = &p.mechanisms()[0];
    let a = unsafe { m.ungoverned() }.allocator().allocate(64, 16).unwrap();
    let raw = *a.raw();
    unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
    // SAFETY: deliberately a use of a freed handle; the plugin must refuse.
    let again = unsafe { memplug_host::Allocation::from_raw(raw) };
    let e = unsafe { m.ungoverned() }.allocator().deallocate(again).unwrap_err();
    assert_eq!(e.error.status, Status::UnknownAllocation, "{}", e.error);
    let mut forged = raw;
    forged.handle ^= 0xdead_0000;
    let e = unsafe { m.ungoverned() }
        .allocator()
        .deallocate(unsafe { memplug_host::Allocation::from_raw(forged) })
        .unwrap_err();
    assert_eq!(e.error.status, Status::UnknownAllocation, "{}", e.error);
    assert_eq!(p.plugin_live_objects(), 0);
}

mod policy {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn private_copy(name: &str) -> std::path::PathBuf {
        let dir = test_tmp_dir(name);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let so = dir.join("libpolicy.so");
        std::fs::copy(bad_plugin(None), &so).unwrap();
        std::fs::set_permissions(&so, std::fs::Permissions::from_mode(0o755)).unwrap();
        so
    }

    #[test]
    fn a_plugin_writable_by_others_is_refused_unless_allowed() {
        let so = private_copy("policy_writable");
        Plugin::load(&so).expect("0755 loads");
        std::fs::set_permissions(&so, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Plugin::load(&so).unwrap_err();
        assert!(matches!(e, LoadError::Policy { .. }), "{e}");
        assert_mentions(&e, &["writable by others", "777"]);
        let opts = memplug_host::LoadOptions { allow_writable_by_others: true, ..Default::default() };
        Plugin::load_with(&so, &opts).expect("explicitly allowed");
        // A group-writable directory on the path is refused the same way.
        std::fs::set_permissions(&so, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = so.parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = Plugin::load(&so).unwrap_err();
        assert_mentions(&e, &["writable by others", "775"]);
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_sha256_pin_refuses_any_other_file() {
        let so = private_copy("policy_sha");
        let good = memplug_host::policy::sha256_hex(&mut std::fs::File::open(&so).unwrap()).unwrap();
        assert_eq!(good.len(), 64);
        let pin =
            |h: &str| memplug_host::LoadOptions { expected_sha256: Some(h.into()), ..Default::default() };
        Plugin::load_with(&so, &pin(&good.to_uppercase())).expect("matching pin loads");
        let wrong = format!("{}0", &good[..63]);
        let e = Plugin::load_with(&so, &pin(&wrong)).unwrap_err();
        assert!(matches!(e, LoadError::Policy { .. }), "{e}");
        assert_mentions(&e, &["SHA-256 mismatch", &good]);
    }
}
