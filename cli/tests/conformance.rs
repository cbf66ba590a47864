//! `memplug conformance` as a vendor runs it: the reference CPU plugin
//! passes every check, the C example plugin passes what it implements and
//! skips the rest with reasons, and each misbehaving plugin of
//! `abi-tests/c/bad_plugin.c` fails the checks that catch it (non-zero exit,
//! the JSON names them) — the same checks `abi-tests/MISBEHAVIOURS.md`
//! lists for it.

use memplug_test_support::{bad_plugin, compile_c_plugin, repo_root, test_tmp_dir, BAD_PLUGIN_VARIANTS};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

fn memplug(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memplug")).args(args).output().expect("run memplug")
}

/// One JSON run: whether it exited 0, and the report.
fn run_json(plugin: Option<&Path>, extra: &[&str]) -> (bool, Value, String) {
    let mut args = vec!["conformance", "--json"];
    let p;
    if let Some(path) = plugin {
        p = path.to_str().expect("UTF-8 path").to_string();
        args.push(&p);
    }
    args.extend_from_slice(extra);
    let out = memplug(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{stderr}", String::from_utf8_lossy(&out.stdout)));
    (out.status.success(), v, stderr)
}

fn checks(v: &Value) -> &Vec<Value> {
    v["checks"].as_array().expect("checks")
}

fn with_outcome(v: &Value, outcome: &str) -> BTreeSet<String> {
    checks(v)
        .iter()
        .filter(|c| c["outcome"] == outcome)
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

/// Every skip says why.
fn assert_skips_explained(v: &Value) {
    for c in checks(v).iter().filter(|c| c["outcome"] == "skip") {
        let why = c["detail"].as_str().unwrap_or("");
        assert!(why.len() > 10, "{} skipped without a reason: {c}", c["name"]);
    }
}

#[test]
fn the_reference_cpu_plugin_passes_every_check() {
    let (ok, v, stderr) = run_json(None, &[]);
    let failed = with_outcome(&v, "fail");
    assert!(ok && failed.is_empty(), "failed: {failed:?}\n{stderr}\n{v:#}");
    assert_skips_explained(&v);
    assert_eq!(v["plugin_name"], "memplug-cpu");
    // Every check of the kit ran (per-mechanism ones for "cpu").
    let ran: BTreeSet<&str> = checks(&v).iter().map(|c| c["name"].as_str().unwrap()).collect();
    for c in memplug_conformance::CHECKS {
        assert!(ran.contains(c.name), "{} did not run", c.name);
    }
    // The only absence the reference plugin has is stream_adopt.
    let skipped = with_outcome(&v, "skip");
    assert_eq!(skipped, BTreeSet::from(["sync.stream_adopt".to_string()]), "{v:#}");
}

#[test]
fn the_table_and_the_mechanism_filter() {
    let out = memplug(&["conformance"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for want in ["memplug conformance: memplug-cpu", "CHECK", "allocator.alignment", "0 failed"] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let (ok, v, _) = run_json(None, &["--mechanism", "cpu"]);
    assert!(ok);
    assert!(checks(&v).iter().any(|c| c["mechanism"] == "cpu"));
    let out = memplug(&["conformance", "--mechanism", "no-such-mechanism"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no mechanism 'no-such-mechanism'") && err.contains("cpu"), "{err}");
}

#[test]
fn the_c_example_plugin_passes_what_it_implements_and_skips_the_rest() {
    let src = repo_root().join("c-examples/plugin/example_plugin.c");
    let so = compile_c_plugin(&src, &[], "example_plugin_conformance");
    let (ok, v, stderr) = run_json(Some(&so), &[]);
    let failed = with_outcome(&v, "fail");
    assert!(ok && failed.is_empty(), "failed: {failed:?}\n{stderr}\n{v:#}");
    assert_skips_explained(&v);
    // It has an allocator and virtual backing; no shared mapping, no sync.
    for c in checks(&v).iter().filter(|c| c["outcome"] == "skip") {
        let name = c["name"].as_str().unwrap();
        let why = c["detail"].as_str().unwrap();
        match name {
            n if n.starts_with("shared_mapping.") => assert!(why.contains("no shared_mapping"), "{c}"),
            // Need shared mapping too.
            "virtual_backing.release_drops_mappings" | "concurrency.shared_mapping" => {
                assert!(why.contains("no shared_mapping"), "{c}")
            }
            n if n.starts_with("sync.") || n == "concurrency.sync" => assert!(why.contains("no sync"), "{c}"),
            // Speaks only 1.0.
            "allocator.class_tags" => assert!(why.contains("1.1"), "{c}"),
            other => panic!("unexpected skip of {other}: {c}"),
        }
    }
    let passed = with_outcome(&v, "pass");
    for want in [
        "allocator.alignment",
        "virtual_backing.residency",
        "virtual_backing.out_of_range",
        "virtual_backing.invalid_state",
        "identity.reservation",
        "concurrency.virtual_backing",
        "allocator.memory_info",
    ] {
        assert!(passed.contains(want), "{want} did not pass: {v:#}");
    }
}

/// `(variant, checks that must fail, whether no other check may fail)`.
/// Where one lie spoils everything after it (an allocator that never
/// allocates, fences that never complete) only the checks that name it are
/// required.
const EXPECTED: &[(&str, &[&str], bool)] = &[
    ("BAD_NO_ENTRY", &["load.entry_symbol", "exports.only_entry_symbols"], true),
    ("BAD_WRONG_MAJOR", &["descriptor.plugin"], true),
    ("BAD_VERSION_REFUSE", &["negotiation.accepts_host"], false),
    ("BAD_AGREED_MINOR", &["negotiation.accepts_host", "negotiation.host_range_wider"], false),
    ("BAD_SHORT_PLUGIN", &["descriptor.plugin"], true),
    ("BAD_SHORT_MECHANISM", &["descriptor.mechanisms"], true),
    ("BAD_SHORT_ALLOCATOR", &["descriptor.vtables"], true),
    ("BAD_NULL_ALLOCATE", &["descriptor.vtables"], true),
    ("BAD_NULL_ALLOCATOR", &["descriptor.capabilities"], true),
    ("BAD_FLAG_WITHOUT_POINTER", &["descriptor.capabilities"], true),
    ("BAD_POINTER_WITHOUT_FLAG", &["descriptor.capabilities"], true),
    ("BAD_UNKNOWN_STATUS", &["allocator.usable", "allocator.zero_size"], false),
    ("BAD_ZERO_MECHANISMS", &["descriptor.plugin"], true),
    ("BAD_NULL_NAME", &["descriptor.mechanisms"], true),
    ("BAD_DUPLICATE_ID", &["descriptor.mechanisms"], true),
    ("BAD_ENTRY_FAILS", &["negotiation.accepts_host"], false),
    ("BAD_NO_LIVE_OBJECTS", &["descriptor.plugin"], true),
    ("BAD_LIVE_FOREVER", &["lifecycle.live_objects", "lifecycle.unload_ready"], true),
    ("BAD_NULL_PLUGIN", &["negotiation.accepts_host"], false),
    ("BAD_UNKNOWN_CAPS", &["descriptor.capabilities"], true),
    ("BAD_UNKNOWN_DEVICE_KIND", &["descriptor.device"], true),
    ("BAD_CAPS_ABOVE_MINOR", &["descriptor.capabilities", "descriptor.minor_0_is_1_0"], true),
    ("BAD_UNKNOWN_ACCESS", &["shared_mapping.unknown_access"], true),
    ("BAD_MESSAGE_UNTERMINATED", &["messages.bounded"], true),
    ("BAD_MESSAGE_OVERLONG", &["messages.bounded"], true),
    ("BAD_NULL_BLOCK", &["allocator.usable", "allocator.alignment"], false),
    ("BAD_MISALIGNED_BLOCK", &["allocator.alignment"], true),
    ("BAD_RANGE_UNCHECKED", &["virtual_backing.out_of_range"], true),
    ("BAD_COMMITTED_LIES", &["virtual_backing.accounting", "virtual_backing.reserve"], false),
    ("BAD_FORGED_FENCE", &["sync.fence_orders", "sync.wait_timeout", "sync.unknown_fence"], false),
    ("BAD_FENCE_NEVER", &["sync.fence_orders", "sync.wait_timeout"], false),
    ("BAD_DUPLICATE_NAME", &["descriptor.mechanisms"], true),
    ("BAD_SINK_OTHER_THREAD", &["messages.calling_thread"], true),
    ("BAD_LIVE_ZERO", &["lifecycle.live_objects"], true),
    ("BAD_DEALLOC_ANY", &["identity.wrong_mechanism", "identity.wrong_device"], true),
    ("BAD_DOUBLE_FREE_OK", &["identity.double_free"], true),
    ("BAD_WRITES_OUT_ON_FAILURE", &["structs.out_untouched_on_failure"], true),
    (
        "BAD_NEGOTIATE_LAX",
        &[
            "negotiation.host_range_above",
            "negotiation.refuses_wrong_major",
            "negotiation.short_host_struct",
            "negotiation.short_out",
            "structs.writes_within_size",
        ],
        true,
    ),
    ("BAD_READ_ONLY_WRITABLE", &["shared_mapping.read_only"], true),
];

/// Legal, if unusual: the kit passes them.
const LEGAL: &[&str] = &["BAD_LONG_STRUCTS", "BAD_SINK_TWICE", "BAD_REENTRANT_ENTRY"];

#[test]
fn every_variant_has_a_verdict() {
    let known: BTreeSet<&str> = EXPECTED.iter().map(|e| e.0).chain(LEGAL.iter().copied()).collect();
    let all: BTreeSet<&str> = BAD_PLUGIN_VARIANTS.iter().copied().collect();
    assert_eq!(known, all, "EXPECTED + LEGAL must cover BAD_PLUGIN_VARIANTS exactly");
    // MISBEHAVIOURS.md names, in each variant's row, the checks that catch it.
    let table = std::fs::read_to_string(repo_root().join("abi-tests/MISBEHAVIOURS.md")).unwrap();
    for (variant, fails, _) in EXPECTED {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| `{variant}`")))
            .unwrap_or_else(|| panic!("MISBEHAVIOURS.md has no row for {variant}"));
        for f in *fails {
            assert!(row.contains(f), "MISBEHAVIOURS.md's row for {variant} does not name {f}");
        }
    }
}

/// Runs `f` over `items` on four threads, each taking the next item when
/// it is done with one (a slow plugin does not hold up the others).
fn parallel<T: Sync>(items: &[T], f: impl Fn(&T) + Sync) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match items.get(i) {
                    Some(item) => f(item),
                    None => break,
                }
            });
        }
    });
}

#[test]
fn misbehaving_plugins_fail_the_checks_that_catch_them() {
    parallel(EXPECTED, |&(variant, must_fail, only)| {
        let (ok, v, stderr) = run_json(Some(&bad_plugin(Some(variant))), &[]);
        let failed = with_outcome(&v, "fail");
        assert!(!ok, "{variant}: exit status 0 with failures {failed:?}");
        assert!(stderr.contains("conformance check(s) failed"), "{variant}: {stderr}");
        for f in must_fail {
            assert!(failed.contains(*f), "{variant}: {f} did not fail; failed: {failed:?}");
        }
        if only {
            let want: BTreeSet<String> = must_fail.iter().map(|s| s.to_string()).collect();
            assert_eq!(failed, want, "{variant}: other checks failed too\n{v:#}");
        }
        for c in checks(&v).iter().filter(|c| c["outcome"] == "fail") {
            assert!(!c["detail"].as_str().unwrap().is_empty(), "{variant}: a failure without detail: {c}");
        }
    });
}

#[test]
fn legal_oddities_and_the_correct_default_pass() {
    let variants: Vec<Option<&str>> = std::iter::once(None).chain(LEGAL.iter().map(|v| Some(*v))).collect();
    parallel(&variants, |&variant| {
        let (ok, v, stderr) = run_json(Some(&bad_plugin(variant)), &[]);
        assert!(ok, "{variant:?}: {:?}\n{stderr}", with_outcome(&v, "fail"));
        assert_skips_explained(&v);
    });
}

#[test]
fn an_extra_exported_symbol_fails_the_exports_check() {
    let dir = test_tmp_dir("extra_export");
    let src = dir.join("extra_export.c");
    let bad = repo_root().join("abi-tests/c/bad_plugin.c");
    std::fs::write(
        &src,
        format!(
            "#include \"{}\"\nMEMPLUG_EXPORT int memplug_helper_leak(void);\nint memplug_helper_leak(void) {{ \
             return 1; }}\n",
            bad.display()
        ),
    )
    .unwrap();
    let so = compile_c_plugin(&src, &[], "extra_export");
    let (ok, v, _) = run_json(Some(&so), &[]);
    assert!(!ok);
    assert_eq!(with_outcome(&v, "fail"), BTreeSet::from(["exports.only_entry_symbols".to_string()]));
    let c = checks(&v).iter().find(|c| c["name"] == "exports.only_entry_symbols").unwrap();
    assert!(c["detail"].as_str().unwrap().contains("memplug_helper_leak"), "{c}");
}

#[test]
fn a_file_that_is_not_a_plugin() {
    let dir = test_tmp_dir("not_a_plugin");
    let bogus = dir.join("libbogus.so");
    std::fs::write(&bogus, "not a library").unwrap();
    let (ok, v, _) = run_json(Some(&bogus), &[]);
    assert!(!ok);
    assert!(with_outcome(&v, "fail").contains("load.open"), "{v:#}");
    let out = memplug(&["conformance", "/nonexistent/libx.so"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}
