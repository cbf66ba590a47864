//! API 1.3 load options (`memplug_host_manager_load_plugin_with`,
//! `_register_entry_with`): the overlap check set from C either way on a
//! plugin that hands out a live block's address again
//! (`BAD_OVERLAPPING_BLOCKS` of `abi-tests/c/bad_plugin.c`), malformed
//! options refused before anything is loaded, and a SHA-256 pin.

mod common;

use common::{last_error, ok, plugin_path};
use memplug_host_capi::*;
use std::ffi::CString;
use std::mem::size_of;
use std::ptr::null_mut;

const MIB: u64 = 1 << 20;

fn overlapping_plugin() -> CString {
    let src = memplug_test_support::repo_root().join("abi-tests/c/bad_plugin.c");
    let so =
        memplug_test_support::compile_c_plugin(&src, &["BAD_OVERLAPPING_BLOCKS"], "capi_overlapping_blocks");
    CString::new(so.to_str().unwrap()).unwrap()
}

fn opts(check_overlaps: u32) -> MemplugHostLoadOptions {
    MemplugHostLoadOptions {
        struct_size: size_of::<MemplugHostLoadOptions>() as u32,
        check_overlaps,
        ..Default::default()
    }
}

/// A manager with `path` loaded with `o`, a pool and a binding of its
/// first mechanism.
fn rig(path: &CString, o: Option<&MemplugHostLoadOptions>) -> (MemplugHostManager, MemplugHostBinding) {
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    let o = o.map_or(std::ptr::null(), |o| o as *const _);
    ok(unsafe { memplug_host_manager_load_plugin_with(m, path.as_ptr(), o) });
    let mut mech = MemplugHostMechanism::default();
    ok(unsafe { memplug_host_manager_mechanism(m, 0, &mut mech) });
    let mut p = MemplugHostPool::default();
    ok(unsafe { memplug_host_pool_create(m, c"p".as_ptr(), 64 * MIB, &mut p) });
    let bo = MemplugHostBindingOptions {
        struct_size: size_of::<MemplugHostBindingOptions>() as u32,
        alloc_class: MEMPLUG_HOST_CLASS_OTHER,
        ..Default::default()
    };
    let mut b = MemplugHostBinding::default();
    ok(unsafe { memplug_host_binding_create(m, mech, p, &bo, &mut b) });
    (m, b)
}

#[test]
fn the_overlap_check_set_from_c_refuses_an_aliasing_block_and_off_lets_it_through() {
    let path = overlapping_plugin();
    for (check, refused) in [
        (MEMPLUG_HOST_OVERLAPS_ALL, true),
        (MEMPLUG_HOST_OVERLAPS_OFF, false),
        // A CPU plugin's allocations are not checked under AUTO.
        (MEMPLUG_HOST_OVERLAPS_AUTO, false),
    ] {
        let (m, b) = rig(&path, Some(&opts(check)));
        let (mut first, mut second, mut addr) = (MemplugHostAllocation::default(), Default::default(), 0u64);
        ok(unsafe { memplug_host_allocate(b, 4096, 16, &mut first, &mut addr) });
        let s = unsafe { memplug_host_allocate(b, 4096, 16, &mut second, null_mut()) };
        if refused {
            assert_eq!(s, MemplugHostStatus::Internal, "check {check}: {}", last_error());
            assert!(last_error().contains("overlaps live allocation object"), "{}", last_error());
            assert!(last_error().contains(&format!("{addr:#x}")), "{}", last_error());
            assert_eq!(second.id, 0, "written only on success");
        } else {
            ok(s);
            // The alias was taken: the plugin's records name one block, so
            // its second free is refused and quarantined (never a crash).
            let _ = memplug_host_allocation_free(second);
        }
        ok(memplug_host_allocation_free(first));
        ok(memplug_host_binding_destroy(b));
        ok(memplug_host_manager_destroy(m));
    }
    // The library's default (a debug build of the tests: every block).
    let (m, b) = rig(&path, None);
    let (mut first, mut second) = (MemplugHostAllocation::default(), MemplugHostAllocation::default());
    ok(unsafe { memplug_host_allocate(b, 4096, 16, &mut first, null_mut()) });
    let s = unsafe { memplug_host_allocate(b, 4096, 16, &mut second, null_mut()) };
    assert_eq!(s == MemplugHostStatus::Internal, cfg!(debug_assertions), "{s:?}: {}", last_error());
    ok(memplug_host_allocation_free(first));
    ok(memplug_host_binding_destroy(b));
    ok(memplug_host_manager_destroy(m));
}

#[test]
fn malformed_options_are_refused_and_nothing_is_loaded() {
    let mut m = MemplugHostManager::default();
    ok(unsafe { memplug_host_manager_create(&mut m) });
    let path = plugin_path();
    let bad_value = opts(9);
    let reserved = MemplugHostLoadOptions { reserved0: 1, ..opts(0) };
    let short = MemplugHostLoadOptions { struct_size: 8, ..opts(0) };
    for (o, says) in [
        (bad_value, "not a MEMPLUG_HOST_OVERLAPS_* value"),
        (reserved, "reserved0 must be zero"),
        (short, "struct_size is 8"),
    ] {
        assert_eq!(
            unsafe { memplug_host_manager_load_plugin_with(m, path.as_ptr(), &o) },
            MemplugHostStatus::InvalidArgument
        );
        assert!(last_error().contains(says), "{}", last_error());
    }
    let mut count = 99;
    ok(unsafe { memplug_host_manager_mechanism_count(m, &mut count) });
    assert_eq!(count, 0, "nothing was loaded");
    // A pin the file does not match: refused, naming the mismatch.
    let pin = CString::new("00".repeat(32)).unwrap();
    let pinned = MemplugHostLoadOptions { expected_sha256: pin.as_ptr(), ..opts(0) };
    assert_eq!(
        unsafe { memplug_host_manager_load_plugin_with(m, path.as_ptr(), &pinned) },
        MemplugHostStatus::LoadFailed
    );
    assert!(
        last_error().to_lowercase().contains("sha-256") || last_error().contains("sha256"),
        "{}",
        last_error()
    );
    // NULL options: the defaults, and the plugin loads.
    ok(unsafe { memplug_host_manager_load_plugin_with(m, path.as_ptr(), std::ptr::null()) });
    ok(unsafe { memplug_host_manager_mechanism_count(m, &mut count) });
    assert!(count > 0);
    ok(memplug_host_manager_destroy(m));
}
