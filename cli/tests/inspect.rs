//! `memplug inspect` as a user runs it: the reference CPU plugin by
//! default, JSON on request, a plugin given by path, and a clear error for
//! a file that is not a plugin or a bare file name.

use memplug_test_support::{compile_c_plugin, find_cdylib, repo_root, test_tmp_dir};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn memplug(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_memplug")).args(args).output().expect("run memplug")
}

#[test]
fn inspect_without_a_plugin_shows_the_cpu_plugin() {
    let out = memplug(&["inspect"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let page = page_size();
    for want in [
        "memplug-cpu",
        "abi         1.3",
        "cpu:0",
        "allocator, virtual_backing, shared_mapping, sync, shared_export, typed_export",
        &format!("page sizes    {} KiB", page >> 10),
        "attributes    host_visible, host_coherent, read_only_enforced",
        "export types  memfd",
        "location      host",
        "maps          at any granularity-aligned offset",
        "identity      numa node 0",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

#[test]
fn inspect_json_is_machine_readable() {
    let out = memplug(&["inspect", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["abi"], "1.3");
    let m = &v["mechanisms"][0];
    assert_eq!(m["name"], "cpu");
    let caps: Vec<&str> = m["capabilities"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(
        caps,
        [
            "allocator",
            "virtual_backing",
            "shared_mapping",
            "sync",
            "shared_export",
            "typed_export",
            "queued_binding"
        ]
    );
    assert_eq!(m["unknown_capability_bits"], 0);
    let page = page_size();
    assert_eq!(m["granularity"].as_u64(), Some(page));
    assert!(m["memory"]["total_bytes"].as_u64().unwrap() >= m["memory"]["free_bytes"].as_u64().unwrap());
    // ABI 1.2: the memory descriptor and the device identity.
    let d = &m["descriptor"];
    assert_eq!(d["page_sizes"], serde_json::json!([page]));
    assert_eq!(d["recommended_granularity"], 0);
    assert_eq!(d["attributes"], serde_json::json!(["host_visible", "host_coherent", "read_only_enforced"]));
    assert_eq!((&d["unknown_attribute_bits"], &d["unknown_export_type_bits"]), (&0.into(), &0.into()));
    assert_eq!(d["export_types"], serde_json::json!(["memfd"]));
    assert_eq!(d["location"], serde_json::json!({"kind": "host", "id": 0}));
    assert_eq!(d["maps_at_offsets"], true);
    assert_eq!(
        m["identity"],
        serde_json::json!({"uuid": null, "pci": null, "sub_device": null, "numa_node": 0})
    );
    // ABI 1.3: what the copy copies between, and the optional slots.
    assert_eq!(m["copy_kinds"], serde_json::json!(["device", "host"]));
    assert_eq!(m["unknown_copy_kind_bits"], 0);
    let slots: Vec<&str> =
        m["optional_slots"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    for want in
        ["allocator.memory_info", "sync.copy", "shared_mapping.export_handle", "virtual_backing.decommit_on"]
    {
        assert!(slots.contains(&want), "{want} not in {slots:?}");
    }
    assert!(!slots.contains(&"sync.stream_adopt"), "{slots:?}");
    let out = memplug(&["inspect"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("  copy kinds    device, host\n"), "{text}");
    assert!(text.contains("  optional      allocator.memory_info, sync.copy, "), "{text}");
}

/// A plugin that agreed on 1.0 or 1.1 has no descriptor and no identity to
/// show: `null` in JSON (the keys are always there), a dash in the table;
/// a plugin that agreed on 1.2 and published neither shows empty lists.
#[test]
fn inspect_shows_no_descriptor_below_1_2() {
    let so = compile_c_plugin(&repo_root().join("c-examples/plugin/example_plugin.c"), &[], "inspect_1_0");
    let path = so.to_str().unwrap();
    let out = memplug(&["inspect", path, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["abi"], "1.0");
    let m = &v["mechanisms"][0];
    let keys = m.as_object().unwrap();
    assert!(keys.contains_key("descriptor") && keys.contains_key("identity"), "{m}");
    assert!(m["descriptor"].is_null() && m["identity"].is_null(), "{m}");
    let out = memplug(&["inspect", path]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("descriptor    - (ABI 1.2)") && !text.contains("identity "), "{text}");
    assert!(!text.contains("page sizes"), "{text}");
    assert!(
        m["copy_kinds"].is_null() && m["optional_slots"] == serde_json::json!(["allocator.memory_info"]),
        "{m}"
    );
    assert!(
        text.contains("copy kinds    - (ABI 1.3)") && text.contains("optional      allocator.memory_info\n"),
        "{text}"
    );
}

fn page_size() -> u64 {
    // The CPU plugin's granularity is the OS page size.
    let out = Command::new("getconf").arg("PAGESIZE").output().expect("getconf");
    String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
}

#[test]
fn inspect_refuses_a_file_that_is_not_a_plugin() {
    let dir = std::env::temp_dir().join(format!("memplug-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bogus = dir.join("libbogus.so");
    std::fs::write(&bogus, "not a library").unwrap();
    let out = memplug(&["inspect", bogus.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a loadable library"), "{err}");
    let out = memplug(&["inspect", "/nonexistent/libx.so"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inspect_takes_a_path_and_never_searches_for_a_bare_name() {
    let chmod = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    const FILE: &str = "libmemplug_plugin_cpu.so";
    // The current directory holds the CPU plugin; LD_LIBRARY_PATH a
    // different, world-writable library under the same file name.
    let here = test_tmp_dir("inspect_bare_here");
    chmod(&here, 0o755);
    std::fs::copy(find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN"), here.join(FILE)).unwrap();
    chmod(&here.join(FILE), 0o755);
    let elsewhere = test_tmp_dir("inspect_bare_elsewhere");
    let other =
        compile_c_plugin(&repo_root().join("c-examples/plugin/example_plugin.c"), &[], "inspect_bare");
    std::fs::copy(other, elsewhere.join(FILE)).unwrap();
    chmod(&elsewhere.join(FILE), 0o666);
    chmod(&elsewhere, 0o777);
    let inspect = |arg: &str| {
        Command::new(env!("CARGO_BIN_EXE_memplug"))
            .args(["inspect", arg])
            .current_dir(&here)
            .env("LD_LIBRARY_PATH", &elsewhere)
            .output()
            .expect("run memplug")
    };
    let out = inspect(FILE);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "a bare name was loaded:\n{stdout}");
    assert!(!stdout.contains("memplug-c-example"), "{stdout}");
    assert!(stderr.contains("bare file name") && stderr.contains(&format!("./{FILE}")), "{stderr}");
    let out = inspect(&format!("./{FILE}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("plugin      memplug-cpu"), "{stdout}");
    assert!(stdout.contains(&format!("origin      ./{FILE}")), "{stdout}");
    chmod(&elsewhere, 0o755);
}

#[test]
fn inspect_shows_control_characters_in_names_escaped_never_raw() {
    // A plugin whose name, version and mechanism name carry terminal
    // escapes (clear screen, set title, colours), CR, LF, BEL, DEL, a C1
    // CSI and a right-to-left override (abi-tests/c/bad_plugin.c,
    // BAD_ESCAPES_IN_NAMES).
    let src = memplug_test_support::repo_root().join("abi-tests/c/bad_plugin.c");
    let so =
        memplug_test_support::compile_c_plugin(&src, &["BAD_ESCAPES_IN_NAMES"], "bad_plugin_escapes_inspect");
    let path = so.to_str().unwrap();
    for args in [vec!["inspect", path], vec!["inspect", path, "--json"]] {
        let out = memplug(&args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            for bad in [0x1b, 0x07, b'\r', 0x7f] {
                assert!(!bytes.contains(&bad), "{args:?}: byte {bad:#04x} on {stream}");
            }
            let text = String::from_utf8(bytes.clone()).unwrap();
            assert!(!text.contains('\u{9b}') && !text.contains('\u{202e}'), "{args:?}: {text:?}");
        }
        let text = String::from_utf8(out.stdout).unwrap();
        if args.len() == 2 {
            for want in [
                r"memplug-bad-\x1b[2J\x1b]0;owned\x07plugin\r 0.0.0\x1b[31m\u{9b}\u{202e}",
                r"bad-\x1b[1mplugin\n\x7f",
            ] {
                assert!(text.contains(want), "missing {want:?} in:\n{text}");
            }
        } else {
            let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
            assert_eq!(v["name"], r"memplug-bad-\x1b[2J\x1b]0;owned\x07plugin\r");
            assert_eq!(v["mechanisms"][0]["name"], r"bad-\x1b[1mplugin\n\x7f");
        }
    }
}
