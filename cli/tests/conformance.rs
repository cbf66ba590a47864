//! `memplug conformance` as a vendor runs it: the reference CPU plugin
//! passes every check, the C example plugin passes what it implements and
//! skips the rest with reasons, and each misbehaving plugin of
//! `abi-tests/c/bad_plugin.c` fails the checks that catch it (non-zero exit,
//! the JSON names them) — the same checks `abi-tests/MISBEHAVIOURS.md`
//! lists for it.

mod common;

use common::xml::{attr, parse_xml};
use memplug_test_support::{bad_plugin, compile_c_plugin, repo_root, test_tmp_dir, BAD_PLUGIN_VARIANTS};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

/// A run of `memplug ARGS`; a `conformance` run gets short thread storms
/// (`--storm-stalls`): these tests are about the command, not about
/// catching races (conformance/tests/concurrency.rs is), except where a
/// test asks for the full storms (`--storm-stalls` given, or
/// [`memplug_full_storms`]).
fn memplug(args: &[&str]) -> Output {
    let mut all = args.to_vec();
    if args.first() == Some(&"conformance") && !args.contains(&"--storm-stalls") {
        all.splice(1..1, ["--storm-stalls", "10"]);
    }
    memplug_full_storms(&all)
}

/// A run of `memplug ARGS` as given.
fn memplug_full_storms(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memplug")).args(args).output().expect("run memplug")
}

/// One JSON run: whether it exited 0, and the report.
fn run_json(plugin: Option<&Path>, extra: &[&str]) -> (bool, Value, String) {
    run_json_with(plugin, extra, memplug)
}

/// [`run_json`] through `run`.
fn run_json_with(plugin: Option<&Path>, extra: &[&str], run: fn(&[&str]) -> Output) -> (bool, Value, String) {
    let mut args = vec!["conformance", "--json"];
    let p;
    if let Some(path) = plugin {
        p = path.to_str().expect("UTF-8 path").to_string();
        args.push(&p);
    }
    args.extend_from_slice(extra);
    let out = run(&args);
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
    // With the kit's full storms: the reference plugin must pass them.
    let (ok, v, stderr) = run_json_with(None, &[], memplug_full_storms);
    let failed = with_outcome(&v, "fail");
    assert!(ok && failed.is_empty(), "failed: {failed:?}\n{stderr}\n{v:#}");
    assert_skips_explained(&v);
    assert_eq!(v["plugin_name"], "memplug-cpu");
    // Every check of the kit ran (per-mechanism ones for "cpu").
    let ran: BTreeSet<&str> = checks(&v).iter().map(|c| c["name"].as_str().unwrap()).collect();
    for c in memplug_conformance::CHECKS {
        assert!(ran.contains(c.name), "{} did not run", c.name);
    }
    // The only absences the reference plugin has are stream_adopt (and
    // 1.2's typed stream_adopt_typed) and peer access (ABI 1.2; it
    // publishes stream_wait_fence and queue-ordered binding, which pass); and
    // the kit looks only for what a mechanism claims of its memory (ABI
    // 1.2): it claims no zero fill, and no page size but the base one.
    let skipped: BTreeSet<String> = checks(&v)
        .iter()
        .filter(|c| c["outcome"] == "skip" && (c["mechanism"].is_null() || c["mechanism"] == "cpu"))
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    let want = [
        "sync.stream_adopt",
        "claims.zero_filled",
        "claims.page_size_used",
        "claims.placement_used",
        "claims.pinned_locked",
        "ordering.stream_adopt_typed",
        "ordering.peer_access",
    ];
    assert_eq!(skipped, want.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(), "{v:#}");
    for c in checks(&v).iter().filter(|c| c["outcome"] == "skip" && c["mechanism"] == "cpu") {
        let why = c["detail"].as_str().unwrap();
        match c["name"].as_str().unwrap() {
            "claims.zero_filled" => assert!(why.contains("does not claim"), "{c}"),
            "claims.page_size_used" => assert!(why.contains("only the base page"), "{c}"),
            "claims.placement_used" => assert!(why.contains("claims no NUMA node"), "{c}"),
            "claims.pinned_locked" => assert!(why.contains("does not claim MEMPLUG_ATTR_PINNED"), "{c}"),
            "ordering.stream_adopt_typed" => assert!(why.contains("not published"), "{c}"),
            "ordering.peer_access" => assert!(why.contains("no MEMPLUG_CAP_PEER_ACCESS"), "{c}"),
            _ => {}
        }
    }
    assert!(with_outcome(&v, "pass").contains("ordering.stream_wait_fence"), "{v:#}");
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
    // A usage error: exit 2 and nothing on stdout (docs/cli.md), though
    // the plugin-wide checks ran before the name could be looked up.
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&out.stdout));
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
            "descriptor.minor_1_is_1_1" => assert!(why.contains("only ABI 1.0"), "{c}"),
            // The memory descriptor, the identity, request placement and
            // the claims checked against the memory are 1.2's.
            n if n.starts_with("descriptor.") || n.starts_with("claims.") => {
                assert!(why.contains("agreed on ABI 1.0") && why.contains("ABI 1.2"), "{c}")
            }
            // Device ordering and peer access are 1.2's.
            n if n.starts_with("ordering.") => {
                assert!(why.contains("agreed minor is 1.0") && why.contains("ABI 1.2"), "{c}")
            }
            // The stream-ordered copy is 1.3's.
            n if n.starts_with("copy.") => {
                assert!(why.contains("agreed minor is 1.0") && why.contains("ABI 1.3"), "{c}")
            }
            // Device loss and the host services are 1.2's (the one loss
            // check that needs no loss, loss.negotiation_reports, passes).
            "loss.reported_through_services" | "loss.every_slot_device_lost" | "loss.unknown_mechanism" => {
                assert!(why.contains("agreed on ABI 1.0") && why.contains("ABI 1.2"), "{c}")
            }
            // What a host below 1.2 is told after a loss needs a loss.
            "loss.none_below_1_2" => assert!(why.contains("exports no device-loss test trigger"), "{c}"),
            "loss.host_fns_run_once" => assert!(why.contains("no sync"), "{c}"),
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
        "loss.negotiation_reports",
        "negotiation.host_size_respected",
    ] {
        assert!(passed.contains(want), "{want} did not pass: {v:#}");
    }
}

/// The full C plugin (`c-examples/plugin/full_plugin.c`, 1.0..=1.3) passes
/// every check; it skips only what a CPU mechanism cannot have: pages
/// larger than the base page, a NUMA placement or pinned pages it does not
/// claim, native streams to adopt, and peers.
#[test]
fn the_full_c_plugin_passes_every_check_it_can_run() {
    let src = repo_root().join("c-examples/plugin/full_plugin.c");
    let so = compile_c_plugin(&src, &[], "full_plugin_conformance");
    let (ok, v, stderr) = run_json(Some(&so), &[]);
    let failed = with_outcome(&v, "fail");
    assert!(ok && failed.is_empty(), "failed: {failed:?}\n{stderr}\n{v:#}");
    assert_skips_explained(&v);
    let skipped = with_outcome(&v, "skip");
    let expected: BTreeSet<String> = [
        "claims.page_size_used",
        "claims.placement_used",
        "claims.pinned_locked",
        "sync.stream_adopt",
        "ordering.stream_adopt_typed",
        "ordering.peer_access",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(skipped, expected, "{v:#}");
    // The 1.2 and 1.3 checks ran: the loss through the services, queued
    // binding, typed export, the copy slot.
    let passed = with_outcome(&v, "pass");
    for want in [
        "loss.reported_through_services",
        "loss.every_slot_device_lost",
        "loss.host_fns_run_once",
        "loss.none_below_1_2",
        "ordering.release_waits_for_work",
        "shared_mapping.typed_export",
        "shared_mapping.import_lent_fd",
        "copy.bytes_exact",
        "copy.bounds",
        "concurrency.shared_mapping",
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
    // Bit 31 in the descriptor a 1.0 host gets: no minor defines it.
    ("BAD_UNKNOWN_CAPS", &["descriptor.capabilities", "descriptor.minor_0_is_1_0"], true),
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
            // It copies a whole host info of its own size (32 bytes with
            // this header) whatever the struct_size: past a 24-byte one.
            "negotiation.host_size_respected",
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

// ---------------------------------------------------------------------------
// The isolated kit: every check in its own process
// ---------------------------------------------------------------------------

/// One variant of `abi-tests/c/kit_crashers.c` (`None`: the C example
/// plugin behind the fixture's wrapper, unchanged).
fn crasher(variant: Option<&str>) -> std::path::PathBuf {
    let src = repo_root().join("abi-tests/c/kit_crashers.c");
    let name = format!("kit_{}", variant.unwrap_or("plain").to_lowercase());
    compile_c_plugin(&src, variant.as_slice(), &name)
}

/// A run with any arguments: exit code, stdout, stderr.
fn memplug_code(args: &[&str]) -> (i32, Vec<u8>, String) {
    let out = memplug(args);
    (
        out.status.code().expect("exited, not killed"),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A JSON run of `plugin`: exit code, the report, stderr.
fn json_code(plugin: &Path, extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["conformance", "--json", plugin.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = memplug_code(&args);
    let v: Value = serde_json::from_slice(&stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{stderr}", String::from_utf8_lossy(&stdout)));
    (code, v, stderr)
}

/// `(name, mechanism)` of every result.
fn ran(v: &Value) -> BTreeSet<(String, String)> {
    checks(v)
        .iter()
        .map(|c| {
            (c["name"].as_str().unwrap().to_string(), c["mechanism"].as_str().unwrap_or("-").to_string())
        })
        .collect()
}

/// The report is complete: schema 1, counts that add up to the checks,
/// `ok` as the outcomes say, and every check the clean plugin runs.
fn assert_complete(v: &Value, clean: &Value) {
    assert_eq!(v["schema_version"], 1, "{v:#}");
    let n = checks(v).len();
    let counts = &v["counts"];
    let total: u64 =
        ["pass", "fail", "skip", "crash", "timeout"].iter().map(|k| counts[*k].as_u64().unwrap()).sum();
    assert_eq!(total as usize, n, "counts {counts} for {n} checks");
    for k in ["pass", "fail", "skip", "crash", "timeout"] {
        assert_eq!(counts[k].as_u64().unwrap() as usize, with_outcome_all(v, k), "{k}");
    }
    let failing = counts["fail"].as_u64().unwrap()
        + counts["crash"].as_u64().unwrap()
        + counts["timeout"].as_u64().unwrap();
    assert_eq!(v["ok"], failing == 0 && v["could_not_run"].is_null(), "{v:#}");
    for c in checks(v) {
        assert!(c["duration_ms"].as_f64().is_some(), "{c}");
    }
    assert_eq!(ran(v), ran(clean), "the run did not go on with every check");
}

/// How many results ended `outcome` (per mechanism, unlike `with_outcome`).
fn with_outcome_all(v: &Value, outcome: &str) -> usize {
    checks(v).iter().filter(|c| c["outcome"] == outcome).count()
}

fn result<'a>(v: &'a Value, name: &str) -> &'a Value {
    checks(v)
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in the report: {v:#}"))
}

/// The text table of one run: exit code, stdout (lossless), stderr.
fn text_code(plugin: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["conformance", plugin.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = memplug_code(&args);
    (code, String::from_utf8(stdout).expect("UTF-8 table"), stderr)
}

/// The table's line for `check`.
fn line<'a>(text: &'a str, check: &str) -> &'a str {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(check))
        .unwrap_or_else(|| panic!("no line for {check} in:\n{text}"))
}

fn clean_report() -> &'static Value {
    static CLEAN: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    CLEAN.get_or_init(|| {
        let (code, v, stderr) = json_code(&crasher(None), &[]);
        assert_eq!(code, 0, "the fixture's base plugin must pass: {stderr}\n{v:#}");
        v
    })
}

#[test]
fn a_segfault_in_allocate_is_that_checks_crash_and_the_run_goes_on() {
    let so = crasher(Some("KIT_SEGV_ALLOCATE"));
    let (code, v, stderr) = json_code(&so, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert_complete(&v, clean_report());
    let usable = result(&v, "allocator.usable");
    assert_eq!(usable["outcome"], "crash", "{usable}");
    assert_eq!(usable["signal"], "SIGSEGV", "{usable}");
    assert!(usable["detail"].as_str().unwrap().contains("SIGSEGV"), "{usable}");
    // What does not allocate still passes, before and after the crashes.
    for name in ["descriptor.properties", "virtual_backing.residency", "lifecycle.unload_ready"] {
        assert_eq!(result(&v, name)["outcome"], "pass", "{name}: {v:#}");
    }
    let (code, text, _) = text_code(&so, &[]);
    assert_eq!(code, 1);
    let l = line(&text, "allocator.usable");
    assert!(l.contains("CRASH") && l.contains("SIGSEGV"), "{l}");
    assert!(line(&text, "lifecycle.unload_ready").contains("pass"), "{text}");
    assert!(text.contains(" crashed, 0 timed out"), "{text}");
}

#[test]
fn an_abort_is_that_checks_crash_and_nothing_else_fails() {
    let so = crasher(Some("KIT_ABORT_MEMORY_INFO"));
    let (code, v, stderr) = json_code(&so, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("1 conformance check(s) failed: allocator.memory_info"), "{stderr}");
    assert_complete(&v, clean_report());
    assert_eq!(with_outcome(&v, "crash"), BTreeSet::from(["allocator.memory_info".to_string()]));
    assert!(with_outcome(&v, "fail").is_empty(), "{v:#}");
    assert_eq!(result(&v, "allocator.memory_info")["signal"], "SIGABRT");
    let (code, text, _) = text_code(&so, &[]);
    assert_eq!(code, 1);
    assert!(line(&text, "allocator.memory_info").contains("SIGABRT"), "{text}");
    assert!(text.contains(" 0 failed, ") && text.contains(" skipped, 1 crashed, 0 timed out"), "{text}");
}

#[test]
fn an_exit_in_a_slot_is_a_crash_too() {
    let (code, v, _) = json_code(&crasher(Some("KIT_EXIT_MEMORY_INFO")), &[]);
    assert_eq!(code, 1);
    assert_complete(&v, clean_report());
    let c = result(&v, "allocator.memory_info");
    assert_eq!(c["outcome"], "crash");
    assert!(c["detail"].as_str().unwrap().contains("exited with status 3"), "{c}");
}

#[test]
fn a_hang_is_that_checks_timeout_and_the_run_goes_on() {
    let so = crasher(Some("KIT_HANG_MEMORY_INFO"));
    let t = std::time::Instant::now();
    let (code, v, stderr) = json_code(&so, &["--timeout", "1"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "{:?}", t.elapsed());
    assert_complete(&v, clean_report());
    assert_eq!(v["timeout_s"], 1.0);
    assert_eq!(with_outcome(&v, "timeout"), BTreeSet::from(["allocator.memory_info".to_string()]));
    assert!(with_outcome(&v, "fail").is_empty() && with_outcome(&v, "crash").is_empty(), "{v:#}");
    let c = result(&v, "allocator.memory_info");
    assert!(c["duration_ms"].as_f64().unwrap() >= 900.0, "{c}");
    assert!(c["detail"].as_str().unwrap().contains("SIGKILL"), "{c}");

    // Text streams: the lines before the hang are out while it hangs.
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_memplug"))
        .args(["conformance", "--storm-stalls", "10", "--timeout", "2", so.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let before = lines.by_ref().map(|l| l.unwrap()).find(|l| l.starts_with("allocator.unknown_flags"));
    assert!(before.is_some(), "no allocator.unknown_flags line");
    assert!(child.try_wait().unwrap().is_none(), "the line came only once the run ended");
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(rest.iter().any(|l| l.starts_with("allocator.memory_info") && l.contains("TIMEOUT")), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("1 timed out")), "{rest:?}");
    assert_eq!(child.wait().unwrap().code(), Some(1));
}

#[test]
fn what_a_crashing_plugin_prints_is_captured_escaped_and_kept_out_of_the_report() {
    let so = crasher(Some("KIT_NOISY_MEMORY_INFO"));
    let (code, stdout, _) = memplug_code(&["conformance", "--json", so.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(!stdout.contains(&0x1b), "a raw escape reached stdout");
    let v: Value = serde_json::from_slice(&stdout).expect("the plugin's output did not corrupt the JSON");
    assert_complete(&v, clean_report());
    let c = result(&v, "allocator.memory_info");
    let d = c["detail"].as_str().unwrap();
    assert_eq!(c["outcome"], "crash");
    assert!(d.contains("kit-noise on stdout") && d.contains("kit-noise on stderr"), "{d}");
    assert!(d.contains("\\x1b[31mred") && !d.contains('\x1b') && !d.contains('\x07'), "{d:?}");
    let (code, text, _) = text_code(&so, &[]);
    assert_eq!(code, 1);
    assert!(!text.contains('\x1b') && text.contains("kit-noise on stderr \\x1b]0;title\\x07"), "{text}");
}

#[test]
fn a_sink_written_after_its_call_returned_fails_the_run() {
    // The kit keeps every sink valid, so the late write is recorded, not a
    // write into freed stack memory that passes unseen (exit 0).
    let (code, v, stderr) = json_code(&crasher(Some("KIT_SINK_AFTER_RETURN")), &[]);
    assert_eq!(code, 1, "{stderr}\n{v:#}");
    assert_complete(&v, clean_report());
    assert_eq!(with_outcome(&v, "fail"), BTreeSet::from(["messages.sink_after_return".to_string()]), "{v:#}");
    let d = result(&v, "messages.sink_after_return")["detail"].as_str().unwrap().to_string();
    assert!(d.contains("allocator.allocate (\"written after the call returned\")"), "{d}");
}

#[test]
fn a_host_function_run_twice_is_named_not_a_crash() {
    // One of the contained variants (abi-tests/tests/contained), built here.
    let src = repo_root().join("abi-tests/c/bad_plugin.c");
    let so = compile_c_plugin(&src, &["BAD_HOST_FN_TWICE"], "kit_host_fn_twice");
    let (code, v, stderr) = json_code(&so, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(with_outcome(&v, "crash").is_empty() && with_outcome(&v, "timeout").is_empty(), "{v:#}");
    let d = result(&v, "sync.in_order")["detail"].as_str().unwrap().to_string();
    assert!(
        d.contains("host function(s) the kit had no enqueue waiting for: a function run a second time"),
        "{d}"
    );
    assert!(with_outcome(&v, "fail").contains("sync.enqueue_refusal"), "{v:#}");
}

#[test]
fn a_plugin_that_keeps_its_sinks_is_named_in_bounded_time_with_a_summary() {
    // One of the contained variants: it keeps every sink (struct and
    // pointer) and writes into it after the call, also from a detached
    // thread. The kit's sinks stay valid, so each late write is recorded
    // and named; nothing crashes or hangs (before: SIGSEGV and timeouts,
    // past 90 s with no summary).
    let src = repo_root().join("abi-tests/c/bad_plugin.c");
    let so = compile_c_plugin(&src, &["BAD_SINK_LATE"], "kit_sink_late");
    let started = std::time::Instant::now();
    let (code, text, stderr) = text_code(&so, &[]);
    let took = started.elapsed();
    assert_eq!(code, 1, "{text}\n{stderr}");
    assert!(took < std::time::Duration::from_secs(90), "took {took:?}");
    assert!(text.contains("0 crashed, 0 timed out"), "{text}");
    assert!(line(&text, "messages.sink_after_return").contains("FAIL"), "{text}");
    assert!(text.contains("written into the sink of an earlier call"), "{text}");
    let summary = text.lines().last().unwrap_or("");
    assert!(summary.contains("passed,") && summary.contains("1 failed"), "{text}");
}

#[test]
fn an_entry_that_answers_ok_without_writing_is_refused_not_followed() {
    let so = crasher(Some("KIT_UNWRITTEN_ANSWER"));
    let (code, v, stderr) = json_code(&so, &[]);
    // The kit names the failing check: 1, not 3 ("could not run").
    assert_eq!(code, 1, "{stderr}\n{v:#}");
    assert_eq!(v["ok"], false);
    let c = result(&v, "negotiation.accepts_host");
    assert_eq!(c["outcome"], "fail", "{c}");
    assert!(c["detail"].as_str().unwrap().contains("without writing its answer"), "{c}");
    assert!(v["could_not_run"].as_str().unwrap().contains("negotiation.accepts_host"), "{v:#}");
    assert!(with_outcome(&v, "crash").is_empty(), "{v:#}");
    assert!(stderr.contains("could not run"), "{stderr}");
    let (code, text, _) = text_code(&so, &[]);
    assert_eq!(code, 1);
    assert!(text.contains("could not run: negotiation.accepts_host failed"), "{text}");
}

#[test]
fn malformed_negotiation_answers_are_refused_before_they_are_read() {
    for (variant, says) in [
        ("KIT_MISALIGNED_ANSWER", "is not aligned"),
        ("KIT_UNMAPPED_ANSWER", "not mapped readable"),
        ("KIT_MINOR_ANSWER", "agreed minor 77"),
        ("KIT_STRUCT_SIZE_ANSWER", "overwrote the answer's struct_size"),
    ] {
        let (code, v, stderr) = json_code(&crasher(Some(variant)), &[]);
        assert_eq!(code, 1, "{variant}: {stderr}\n{v:#}");
        let c = result(&v, "negotiation.accepts_host");
        assert_eq!(c["outcome"], "fail", "{variant}: {c}");
        assert!(c["detail"].as_str().unwrap().contains(says), "{variant}: {c}");
        assert!(with_outcome(&v, "crash").is_empty(), "{variant}: {v:#}");
        assert!(v["could_not_run"].is_string(), "{variant}");
    }
}

#[test]
fn names_with_terminal_escapes_are_printed_escaped_in_every_format() {
    let so = crasher(Some("KIT_ESCAPE_NAMES"));
    let dir = test_tmp_dir("escape_names_junit");
    let junit = dir.join("report.xml");
    let (code, stdout, stderr) =
        memplug_code(&["conformance", "--json", "--junit", junit.to_str().unwrap(), so.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let v: Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(v["plugin_name"], "evil\\x1b[2J\\x1b[31m-plugin");
    assert_eq!(v["plugin_version"], "6.6.6\\x07\\r\\x1b[1A");
    assert_eq!(v["mechanisms"][0]["name"], "mech\\x1b]0;pwned\\x07");
    let (code, text, _) = text_code(&so, &[]);
    assert_eq!(code, 0);
    let xml = std::fs::read_to_string(&junit).unwrap();
    for (what, s) in [("json", String::from_utf8(stdout).unwrap()), ("text", text), ("junit", xml.clone())] {
        let bad: Vec<char> = s.chars().filter(|c| c.is_control() && *c != '\n').collect();
        assert!(bad.is_empty(), "{what} carries control characters {bad:?}");
        // In JSON the escape's backslash is itself escaped.
        let want = if what == "json" { r"mech\\x1b]0;pwned\\x07" } else { r"mech\x1b]0;pwned\x07" };
        assert!(s.contains(want), "{what} does not name the mechanism escaped");
    }
    parse_xml(&xml).unwrap();
}

#[test]
fn a_plugin_linked_with_a_version_script_exports_only_its_entry() {
    let so = versioned_example_plugin("versioned_conformance");
    let (code, v, stderr) = json_code(&so, &[]);
    let c = result(&v, "exports.only_entry_symbols");
    assert_eq!(c["outcome"], "pass", "{c}");
    assert_eq!(c["detail"], "exports only memplug_plugin_v1");
    assert_eq!(code, 0, "{stderr}\n{v:#}");
}

/// The C example plugin linked with `abi-tests/c/versioned_plugin.map`.
fn versioned_example_plugin(name: &str) -> std::path::PathBuf {
    let dir = test_tmp_dir(name);
    let so = dir.join(format!("lib{name}.so"));
    let map = repo_root().join("abi-tests/c/versioned_plugin.map");
    let mut cmd = memplug_test_support::c_compiler(None);
    cmd.args(memplug_test_support::C_PLUGIN_FLAGS)
        .arg("-I")
        .arg(memplug_test_support::include_dir())
        .arg(repo_root().join("c-examples/plugin/example_plugin.c"))
        .arg(format!("-Wl,--version-script={}", map.display()))
        .arg("-o")
        .arg(&so)
        .arg("-lpthread");
    memplug_test_support::run_tool(cmd);
    so
}

#[test]
fn the_junit_report_parses_and_its_counts_match() {
    for (plugin, code) in
        [(crasher(Some("KIT_ABORT_MEMORY_INFO")), 1), (crasher(Some("KIT_SEGV_ALLOCATE")), 1)]
    {
        let dir = test_tmp_dir("junit_counts");
        let junit = dir.join("report.xml");
        let (got, v, stderr) = json_code(&plugin, &["--junit", junit.to_str().unwrap()]);
        assert_eq!(got, code, "{stderr}");
        let xml = std::fs::read_to_string(&junit).unwrap();
        let elements = parse_xml(&xml).unwrap_or_else(|e| panic!("{e}\n{xml}"));
        let cases: Vec<_> = elements.iter().filter(|e| e.name == "testcase").collect();
        assert_eq!(cases.len(), checks(&v).len(), "one testcase per check");
        let count = |tag: &str| elements.iter().filter(|e| e.name == tag).count();
        let n = |k: &str| v["counts"][k].as_u64().unwrap() as usize;
        assert_eq!(count("failure"), n("fail"));
        assert_eq!(count("error"), n("crash") + n("timeout"));
        assert_eq!(count("skipped"), n("skip"));
        for root in elements.iter().filter(|e| e.name == "testsuites" || e.name == "testsuite") {
            assert_eq!(attr(root, "tests"), cases.len().to_string());
            assert_eq!(attr(root, "failures"), n("fail").to_string());
            assert_eq!(attr(root, "errors"), (n("crash") + n("timeout")).to_string());
            assert_eq!(attr(root, "skipped"), n("skip").to_string());
        }
        assert!(
            elements.iter().any(|e| e.name == "error" && attr(e, "type") == "crash"),
            "a crash is an error element"
        );
    }
    // A file that is not a plugin: the JUnit report says so as an error.
    let dir = test_tmp_dir("junit_not_a_plugin");
    let junit = dir.join("report.xml");
    let (code, _, _) =
        memplug_code(&["conformance", "--junit", junit.to_str().unwrap(), "/nonexistent/libx.so"]);
    assert_eq!(code, 3);
    let elements = parse_xml(&std::fs::read_to_string(&junit).unwrap()).unwrap();
    assert!(elements.iter().any(|e| e.name == "testcase" && attr(e, "name") == "could_not_run"));
}

/// `--storm-stalls N` ends each storm soon after N stalls, where the
/// kit's own figure for the allocator's storm is 800.
#[test]
fn storm_stalls_shortens_the_thread_storms() {
    let (ok, v, stderr) = run_json(None, &["--mechanism", "cpu", "--storm-stalls", "5"]);
    assert!(ok, "{stderr}");
    let detail = result(&v, "concurrency.allocator")["detail"].as_str().expect("a detail").to_string();
    let stalled: usize = detail
        .rsplit("; ")
        .next()
        .and_then(|d| d.strip_suffix(" calls stalled mid-call"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no stall count in: {detail}"));
    assert!(stalled < 800, "{stalled} stalls with --storm-stalls 5: {detail}");
}

#[test]
fn exit_codes_for_usage_and_for_a_kit_that_cannot_run() {
    for bad in [
        &["conformance", "--timeout", "0"][..],
        &["conformance", "--timeout", "soon"],
        &["conformance", "--no-such-flag"],
        &["conformance", "--mechanism", "no-such-mechanism"],
        &["conformance", "--junit", "/nonexistent/dir/report.xml"],
        &["conformance", "a", "b"],
        &["conformance", "--storm-stalls", "0"],
        &["conformance", "--storm-stalls", "many"],
    ] {
        let (code, _, stderr) = memplug_code(bad);
        assert_eq!(code, 2, "{bad:?}: {stderr}");
    }
    let (code, stdout, _) = memplug_code(&["conformance", "--help"]);
    assert_eq!(code, 0);
    let help = String::from_utf8(stdout).unwrap();
    for want in [
        "Exit status",
        "0  every check passed",
        "1  a check failed, crashed or timed out",
        "2  usage",
        "3  the kit could not run and no check names why",
        "--timeout",
        "--junit",
    ] {
        assert!(help.contains(want), "--help does not say {want:?}:\n{help}");
    }
    // Missing file, not a library: 3, and --json still prints a report.
    let (code, v, stderr) = json_code(Path::new("/nonexistent/libx.so"), &[]);
    assert_eq!(code, 3, "{stderr}");
    assert!(v["could_not_run"].as_str().unwrap().contains("does not exist"), "{v:#}");
    assert_eq!((v["ok"].clone(), v["schema_version"].clone()), (Value::Bool(false), Value::from(1)));
    let dir = test_tmp_dir("exit_not_a_library");
    let bogus = dir.join("libbogus.so");
    std::fs::write(&bogus, "not a library").unwrap();
    // Not a library, no entry: the run names the failing check, so 1.
    let (code, v, _) = json_code(&bogus, &[]);
    assert_eq!(code, 1);
    assert!(v["could_not_run"].as_str().unwrap().starts_with("load.open failed"), "{v:#}");
    let (code, _, _) = json_code(&bad_plugin(Some("BAD_NO_ENTRY")), &[]);
    assert_eq!(code, 1);
    // The reference plugin: 0.
    assert_eq!(memplug_code(&["conformance", "--json"]).0, 0);
}

#[test]
fn a_closed_stdout_or_stderr_changes_nothing() {
    use std::process::Stdio;
    let bin = env!("CARGO_BIN_EXE_memplug");
    // A reader that went away (EPIPE), text and JSON.
    // Short storms (see `memplug`) on the plain CPU mechanism only (the
    // 2 MiB-page one was most of the time): the exit status is the point.
    // With stdout gone, the JUnit report is what says why a check failed.
    let junit = test_tmp_dir("closed_stdout").join("report.xml");
    let junit_arg = junit.to_str().unwrap();
    let why = || std::fs::read_to_string(&junit).unwrap_or_else(|e| format!("(no JUnit report: {e})"));
    for args in [
        &["conformance", "--mechanism", "cpu", "--storm-stalls", "10", "--junit", junit_arg][..],
        &["conformance", "--mechanism", "cpu", "--storm-stalls", "10", "--json", "--junit", junit_arg],
    ] {
        let mut child =
            Command::new(bin).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            why()
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
    // Failing plugins (one that fails a check, one that crashes) with
    // stderr gone too: still 1, not 101 (the panic of a failed eprintln!).
    for so in [bad_plugin(Some("BAD_DOUBLE_FREE_OK")), crasher(Some("KIT_ABORT_MEMORY_INFO"))] {
        for json in [false, true] {
            let mut args = vec!["conformance", "--storm-stalls", "10", so.to_str().unwrap()];
            if json {
                args.push("--json");
            }
            let mut child =
                Command::new(bin).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
            drop(child.stdout.take());
            drop(child.stderr.take());
            assert_eq!(child.wait().unwrap().code(), Some(1), "{args:?}");
        }
    }
    // Descriptors closed outright (`>&- 2>&-`).
    let status = Command::new("sh")
        .args([
            "-c",
            "exec \"$0\" conformance --mechanism cpu --storm-stalls 10 --junit \"$1\" >&- 2>&-",
            bin,
            junit_arg,
        ])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", why());
}

/// A bare file name is refused (exit 3, saying to give a path) rather than
/// handed to `dlopen`, which would search `LD_LIBRARY_PATH` for it and
/// could load a file other than the one checked; the same name given as a
/// path runs.
#[test]
fn a_bare_name_is_refused_and_the_same_file_by_path_runs() {
    let so = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let dir = so.parent().unwrap();
    let name = so.file_name().unwrap().to_str().unwrap();
    let run_in = |arg: &str| {
        Command::new(env!("CARGO_BIN_EXE_memplug"))
            .args(["conformance", "--storm-stalls", "10", arg, "--json"])
            .current_dir(dir)
            .env("LD_LIBRARY_PATH", dir)
            .output()
            .expect("run memplug")
    };
    let bare = run_in(name);
    assert_eq!(bare.status.code(), Some(3), "{}", String::from_utf8_lossy(&bare.stdout));
    let v: Value = serde_json::from_slice(&bare.stdout).unwrap();
    let why = v["could_not_run"].as_str().unwrap_or_default();
    assert!(why.contains("bare file name") && why.contains(&format!("./{name}")), "{why}");
    let by_path = run_in(&format!("./{name}"));
    assert_eq!(by_path.status.code(), Some(0), "{}", String::from_utf8_lossy(&by_path.stdout));
}

/// `memplug conformance` with no argument where no CPU plugin library is
/// (what `cargo install` leaves): the kit runs on the copy linked into
/// `memplug`, as `inspect` does, and skips only what needs a library file.
#[test]
fn without_a_library_the_kit_runs_on_the_linked_in_copy() {
    let dir = memplug_test_support::test_tmp_dir("conformance_installed");
    let exe = dir.join("memplug");
    std::fs::copy(env!("CARGO_BIN_EXE_memplug"), &exe).expect("copy memplug");
    let out = Command::new(&exe)
        .args(["conformance", "--json", "--timeout", "60", "--storm-stalls", "10"])
        .env_remove("MEMPLUG_CPU_PLUGIN")
        .output()
        .expect("run the copy");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stderr}"));
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{v:#}");
    assert_eq!(v["plugin_path"], "memplug-cpu (in-process)", "{v:#}");
    assert!(v["could_not_run"].is_null(), "{v:#}");
    assert_skips_explained(&v);
    let skipped = with_outcome(&v, "skip");
    for name in ["load.open", "exports.only_entry_symbols"] {
        assert!(skipped.contains(name), "{name} is not skipped: {skipped:?}");
        assert!(result(&v, name)["detail"].as_str().unwrap().contains("linked into"), "{v:#}");
    }
    assert!(with_outcome(&v, "pass").contains("load.entry_symbol"));
    // Every per-mechanism check that does not need a second copy passed.
    let passed = with_outcome(&v, "pass");
    for name in ["allocator.alignment", "negotiation.accepts_host", "descriptor.plugin"] {
        assert!(passed.contains(name), "{name} did not pass: {v:#}");
    }
    assert!(checks(&v).iter().any(|c| c["mechanism"] == "cpu" && c["outcome"] == "pass"));
    // The text table names it too.
    let text = Command::new(&exe)
        .args(["conformance", "--mechanism", "cpu", "--timeout", "60"])
        .env_remove("MEMPLUG_CPU_PLUGIN")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&text.stdout), String::from_utf8_lossy(&text.stderr));
    assert!(text.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("library   memplug-cpu (in-process)"), "{stdout}");
}
