//! How the plugin finds (or fails to find) a CUDA driver. Each scenario
//! needs its own process (the driver is found once per process), so each
//! test here runs `child_load` in a child process with the environment of
//! the scenario, and checks what it printed. The child must exit cleanly:
//! a panic or an abort in the plugin fails the test.

mod common;

use common::*;
use memplug_host::{LoadError, Plugin};
use std::ffi::OsStr;
use std::process::Output;

/// Loads the plugin with whatever environment the parent set, uses it a
/// little, and prints one `RESULT` line.
#[test]
#[ignore = "run in a child process by the other tests of this file"]
fn child_load() {
    if !is_child() {
        return;
    }
    match Plugin::load(plugin_path()) {
        Err(LoadError::EntryFailed { status, message, .. }) => {
            println!("RESULT entry-failed {status} | {message}")
        }
        Err(e) => println!("RESULT other-error | {e}"),
        Ok(p) => {
            let names: Vec<String> =
                p.mechanisms().iter().map(|m| format!("{}={:?}", m.name(), m.capabilities())).collect();
            let m = cuda0(&p);
            let info = m.memory_info().unwrap().unwrap();
            let a = unsafe { m.ungoverned() }.allocator().allocate(4096, 256).unwrap();
            unsafe { m.ungoverned() }.allocator().deallocate(a).unwrap();
            let sync = m.sync().unwrap();
            let s = sync.stream_create().unwrap();
            let f = sync.fence_record(&s).unwrap();
            assert!(sync.fence_wait(&f, std::time::Duration::from_secs(10)).unwrap());
            sync.fence_destroy(f).unwrap();
            sync.stream_destroy(s).unwrap();
            drop(m);
            println!("DRIVER {}", p.version());
            println!("RESULT loaded {} total={}", names.join(","), info.total_bytes);
            p.unload().unwrap();
        }
    }
}

fn result(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("the child printed no RESULT line:\n{text}"))
        .to_string()
}

/// The plugin's version line the child printed (it names the driver file).
fn driver_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split_once("DRIVER ").map(|(_, v)| v))
        .unwrap_or_else(|| panic!("the child printed no DRIVER line:\n{text}"))
        .to_string()
}

fn load_in_child(env: &[(&str, Option<&OsStr>)]) -> String {
    result(&run_child("child_load", env))
}

#[track_caller]
fn assert_unavailable(r: &str, needle: &str) {
    assert!(
        r.starts_with("entry-failed MEMPLUG_STATUS_DEVICE_UNAVAILABLE | "),
        "expected DEVICE_UNAVAILABLE, got: {r}"
    );
    assert!(r.contains(needle), "the message should say {needle:?}: {r}");
}

#[test]
fn a_named_driver_that_cannot_be_loaded_is_device_unavailable() {
    let r = load_in_child(&[("MEMPLUG_CUDA_DRIVER", Some(OsStr::new("/nonexistent/libcuda.so.1")))]);
    assert_unavailable(&r, "MEMPLUG_CUDA_DRIVER=/nonexistent/libcuda.so.1 cannot be loaded");
}

#[test]
fn no_driver_at_all_is_device_unavailable_with_a_message() {
    // SAFETY: only tries to open libraries by name.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("skipped: this machine has a CUDA driver installed");
        return;
    }
    let empty = memplug_test_support::test_tmp_dir("no-driver");
    let r = load_in_child(&[("MEMPLUG_CUDA_DRIVER", None), ("LD_LIBRARY_PATH", Some(empty.as_os_str()))]);
    assert_unavailable(&r, "no CUDA driver: libcuda.so.1 not found");
    assert!(r.contains("MEMPLUG_CUDA_DRIVER"), "the message says how to name one: {r}");
}

#[test]
fn cudarc_finds_a_driver_on_the_library_path() {
    if real() {
        return;
    }
    let dir = build_fake("on-path", &[]);
    let r = load_in_child(&[
        ("MEMPLUG_CUDA_DRIVER", None),
        ("LD_LIBRARY_PATH", Some(dir.as_os_str())),
        ("MEMPLUG_FAKE_CUDA_DEVICES", Some(OsStr::new("1"))),
        ("MEMPLUG_FAKE_CUDA_MEM_MIB", Some(OsStr::new("96"))),
    ]);
    assert_eq!(
        r,
        format!(
            "loaded cuda0-vmm=allocator|virtual_backing|shared_mapping|sync|typed_export,cuda0-host=allocator|sync \
             total={}",
            96u64 << 20
        )
    );
}

/// A CUDA toolkit's stub `libcuda.so` on the library path (cuInit answers
/// CUDA_ERROR_STUB_LIBRARY) beside the driver's `libcuda.so.1`: the driver
/// is used, and the plugin's version names the file.
#[test]
fn a_toolkit_stub_named_libcuda_so_does_not_hide_the_driver() {
    if real() {
        return;
    }
    let dir = memplug_test_support::test_tmp_dir("fake-cuda-stub-beside-driver");
    build_fake_into(&dir, "libcuda.so", &["-DFAKE_STUB"]);
    build_fake_into(&dir, "libcuda.so.1", &[]);
    let out = run_child(
        "child_load",
        &[
            ("MEMPLUG_CUDA_DRIVER", None),
            ("LD_LIBRARY_PATH", Some(dir.as_os_str())),
            ("MEMPLUG_FAKE_CUDA_DEVICES", Some(OsStr::new("1"))),
        ],
    );
    let r = result(&out);
    assert!(r.starts_with("loaded cuda0-vmm="), "the stub hid the driver: {r}");
    let version = driver_line(&out);
    let real_one = dir.join("libcuda.so.1");
    assert!(version.ends_with(&format!(": {})", real_one.display())), "version {version:?}");
}

/// A stub that does have the ABI name (earlier on the path) is skipped:
/// the next candidate, `libcuda.so` from a later folder, is the driver.
#[test]
fn a_stub_answering_cuinit_with_34_is_skipped_for_the_next_candidate() {
    if real() {
        return;
    }
    let stub = memplug_test_support::test_tmp_dir("fake-cuda-stub-first");
    build_fake_into(&stub, "libcuda.so.1", &["-DFAKE_STUB"]);
    let good = memplug_test_support::test_tmp_dir("fake-cuda-driver-second");
    build_fake_into(&good, "libcuda.so", &[]);
    let path = std::env::join_paths([&stub, &good]).unwrap();
    let out = run_child(
        "child_load",
        &[
            ("MEMPLUG_CUDA_DRIVER", None),
            ("LD_LIBRARY_PATH", Some(path.as_os_str())),
            ("MEMPLUG_FAKE_CUDA_DEVICES", Some(OsStr::new("1"))),
        ],
    );
    assert!(result(&out).starts_with("loaded cuda0-vmm="), "{}", result(&out));
    let version = driver_line(&out);
    assert!(version.ends_with(&format!(": {})", good.join("libcuda.so").display())), "version {version:?}");
    // Only stubs: a message that says so.
    let r = load_in_child(&[("MEMPLUG_CUDA_DRIVER", None), ("LD_LIBRARY_PATH", Some(stub.as_os_str()))]);
    assert_unavailable(&r, "only the CUDA toolkit's stub library was found");
}

#[test]
fn a_driver_without_devices_is_device_unavailable() {
    if real() {
        return;
    }
    let lib = build_fake("no-device", &[]).join("libcuda.so.1");
    let r = load_in_child(&[
        ("MEMPLUG_CUDA_DRIVER", Some(lib.as_os_str())),
        ("MEMPLUG_FAKE_CUDA_DEVICES", Some(OsStr::new("0"))),
    ]);
    assert_unavailable(&r, "cuInit failed: CUDA_ERROR_NO_DEVICE (100)");
}

#[test]
fn a_driver_missing_an_entry_point_is_device_unavailable_not_a_panic() {
    if real() {
        return;
    }
    let lib = build_fake("no-event-query", &["-DFAKE_CUDA_OMIT_EVENT_QUERY"]).join("libcuda.so.1");
    let r = load_in_child(&[("MEMPLUG_CUDA_DRIVER", Some(lib.as_os_str()))]);
    assert_unavailable(&r, "lacks entry points this plugin needs: cuEventQuery");
}

#[test]
fn a_driver_without_vmm_publishes_allocator_and_sync_only() {
    if real() {
        return;
    }
    let lib = build_fake("no-vmm", &["-DFAKE_CUDA_OMIT_VMM"]).join("libcuda.so.1");
    let r = load_in_child(&[
        ("MEMPLUG_CUDA_DRIVER", Some(lib.as_os_str())),
        ("MEMPLUG_FAKE_CUDA_DEVICES", Some(OsStr::new("1"))),
    ]);
    assert_eq!(
        r,
        format!("loaded cuda0-vmm=allocator|sync,cuda0-host=allocator|sync total={}", 1024u64 << 20)
    );
}

/// A driver without `cuMemHostAlloc`/`cuMemFreeHost`: the plugin loads, the
/// device mechanism is whole, and only the pinned mechanism is absent.
#[test]
fn a_driver_without_host_alloc_loads_without_the_pinned_mechanism() {
    if real() {
        return;
    }
    let lib = build_fake("no-host-alloc", &["-DFAKE_CUDA_OMIT_HOST_ALLOC"]).join("libcuda.so.1");
    let r = load_in_child(&[
        ("MEMPLUG_CUDA_DRIVER", Some(lib.as_os_str())),
        ("MEMPLUG_FAKE_CUDA_DEVICES", Some(OsStr::new("1"))),
    ]);
    assert_eq!(
        r,
        format!(
            "loaded cuda0-vmm=allocator|virtual_backing|shared_mapping|sync|typed_export total={}",
            1024u64 << 20
        )
    );
}

#[test]
fn the_library_exports_only_the_entry_symbol() {
    let symbols = memplug_test_support::exported_symbols(&plugin_path());
    let ours: Vec<&String> = symbols.iter().filter(|s| !s.starts_with('_') && !s.contains('@')).collect();
    assert_eq!(ours, vec!["memplug_plugin_v1"], "all defined dynamic symbols: {symbols:?}");
}
