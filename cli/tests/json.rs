//! Every `--json` document of `memplug` (docs/cli.md): `schema_version`
//! an integer, `ok` a boolean, `counts` that agree with the document's own
//! lists and with what the text output of the same command says; the
//! could-not-run form when the command could not do its job; and the exit
//! statuses that go with each.

use serde_json::Value;
use std::process::{Command, Output};

fn memplug(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memplug"));
    c.args(args).env_remove("MEMPLUG_CPU_TEST_SWITCHES");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run memplug")
}

/// `memplug args`: exit code, the JSON document on stdout, stderr.
fn json(args: &[&str], env: &[(&str, &str)]) -> (i32, Value, String) {
    let out = memplug(args, env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{args:?}: not JSON ({e}): {}\n{stderr}", String::from_utf8_lossy(&out.stdout))
    });
    (out.status.code().expect("exited"), v, stderr)
}

/// `memplug args`: exit code and stdout.
fn text(args: &[&str]) -> (i32, String) {
    let out = memplug(args, &[]);
    (out.status.code().expect("exited"), String::from_utf8(out.stdout).unwrap())
}

fn u(v: &Value) -> usize {
    v.as_u64().unwrap_or_else(|| panic!("not an unsigned integer: {v}")) as usize
}

/// The fields every document has, with their types.
fn assert_envelope(v: &Value, ok: bool) {
    assert!(v["schema_version"].is_u64(), "schema_version is an integer: {v:#}");
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["ok"], ok, "{v:#}");
    assert!(v["counts"].is_object(), "{v:#}");
}

/// The number after `label` in `text`'s line that starts with it.
fn number_after(text: &str, label: &str) -> usize {
    let line =
        text.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or_else(|| panic!("no {label:?}"));
    let rest = &line.trim_start()[label.len()..];
    rest.split_whitespace().next().and_then(|w| w.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

#[test]
fn inspect_json_has_a_version_ok_and_counts_that_match_the_table() {
    let (code, v, _) = json(&["inspect", "--json"], &[]);
    assert_eq!(code, 0);
    assert_envelope(&v, true);
    let n = v["mechanisms"].as_array().unwrap().len();
    assert!(n >= 1);
    assert_eq!(u(&v["counts"]["mechanisms"]), n);
    let (code, t) = text(&["inspect"]);
    assert_eq!(code, 0);
    assert_eq!(number_after(&t, "mechanisms"), n, "{t}");
    assert_eq!(t.matches("  mechanism     ").count(), n, "{t}");
}

#[test]
fn inspect_json_of_a_file_that_is_not_a_plugin_says_why() {
    let (code, v, stderr) = json(&["inspect", "/nonexistent/libx.so", "--json"], &[]);
    assert_eq!(code, 3, "{stderr}");
    assert_envelope(&v, false);
    assert!(v["error"].as_str().unwrap().contains("does not exist"), "{v:#}");
    assert_eq!(v["counts"]["mechanisms"], 0);
    assert!(stderr.contains("does not exist"), "{stderr}");
}

#[test]
fn demo_json_counts_its_checks_and_names_its_scenes() {
    let (code, v, stderr) = json(&["demo", "--json"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_envelope(&v, true);
    let checks = v["checks"].as_array().unwrap();
    let passed = checks.iter().filter(|c| c["ok"] == true && c["skipped"] == false).count();
    let skipped = checks.iter().filter(|c| c["skipped"] == true).count();
    let c = &v["counts"];
    assert_eq!(
        (u(&c["checks"]), u(&c["passed"]), u(&c["skipped"]), u(&c["failed"])),
        (checks.len(), passed, skipped, checks.len() - passed - skipped)
    );
    assert_eq!(u(&c["failed"]), 0);

    // The scenes: the story's ten steps in order, back to back; every
    // event belongs to one of them, and each counts its own.
    let scenes = v["scenes"].as_array().unwrap();
    let ids: Vec<&str> = scenes.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "setup",
            "weights",
            "requests",
            "decode",
            "fence",
            "out_of_budget",
            "offload",
            "copy_on_write",
            "device_loss",
            "teardown"
        ]
    );
    for (i, s) in scenes.iter().enumerate() {
        assert_eq!(u(&s["step"]), i + 1);
        assert!(!s["title"].as_str().unwrap().is_empty());
        assert!(s["start_ms"].as_f64().unwrap() <= s["end_ms"].as_f64().unwrap(), "{s}");
        if let Some(next) = scenes.get(i + 1) {
            assert_eq!(s["end_ms"], next["start_ms"]);
        }
    }
    let t = v["timeline"].as_array().unwrap();
    for s in scenes {
        let n = t.iter().filter(|e| e["scene"] == s["id"]).count();
        assert_eq!(u(&s["events"]), n, "{s}");
        assert!(n > 0, "scene {} logged nothing", s["id"]);
    }
    assert_eq!(scenes.iter().map(|s| u(&s["events"])).sum::<usize>(), t.len());
    // Where the story's landmarks fall.
    let scene_of = |kind: &str| t.iter().find(|e| e["kind"] == kind).map(|e| e["scene"].as_str().unwrap());
    assert_eq!(scene_of("evict"), Some("decode"));
    assert_eq!(scene_of("fence"), Some("fence"));
    assert_eq!(scene_of("out_of_budget"), Some("out_of_budget"));
    assert_eq!(scene_of("lost"), Some("device_loss"));
    assert_eq!(scene_of("unload"), Some("teardown"));

    // Per class: the classes' charges add up to the pool's use.
    for e in t {
        let classes = e["class_used"].as_object().unwrap();
        assert_eq!(classes.len(), 5, "{e}");
        let sum: u64 = classes.values().map(|b| b.as_u64().unwrap()).sum();
        assert_eq!(sum, e["pool_used"].as_u64().unwrap(), "{e}");
    }
    assert!(t.iter().any(|e| e["class_used"]["weights"].as_u64().unwrap() > 0));
    assert!(t.iter().any(|e| e["class_used"]["kv"].as_u64().unwrap() > 0));
    // Each measurement is at its `measure` event.
    let measured: Vec<&Value> = t.iter().filter(|e| e["kind"] == "measure").map(|e| &e["t_ms"]).collect();
    let ms: Vec<&Value> = v["measurements"].as_array().unwrap().iter().map(|m| &m["t_ms"]).collect();
    assert_eq!(ms, measured);

    // The text says the same count.
    let (code, t) = text(&["demo"]);
    assert_eq!(code, 0);
    assert!(t.contains(&format!("all {} checks passed", checks.len())), "{t}");
    assert_eq!(t.matches("  [ok] ").count(), passed, "{t}");
    for s in scenes {
        assert!(t.contains(&format!("-- {}. {}", s["step"], s["title"].as_str().unwrap())), "{t}");
    }
}

#[test]
fn demo_json_that_could_not_run_says_why() {
    // The CPU plugin named where there is none: the demo cannot start.
    let (code, v, stderr) = json(&["demo", "--json"], &[("MEMPLUG_CPU_PLUGIN", "/nonexistent/libx.so")]);
    assert_eq!(code, 3, "{stderr}");
    assert_envelope(&v, false);
    assert!(v["error"].as_str().unwrap().contains("does not exist"), "{v:#}");
    assert_eq!(v["counts"], serde_json::json!({"checks": 0, "passed": 0, "skipped": 0, "failed": 0}));
    assert!(stderr.contains("memplug: demo:"), "{stderr}");
}

/// The kit's report counts per mechanism too (the plugin-wide checks
/// under a null mechanism); they add up to the totals, agree with the
/// checks, and with the table's closing lines.
#[test]
fn conformance_json_counts_per_mechanism_and_in_all() {
    // Short storms: the counts are the point here, not the races. A long
    // --timeout: two kits run at once beside the rest of the suite, and on
    // a loaded two-core machine a check may show no sign of life for the
    // default 10 s (a timeout fails the run).
    let (json_run, text_run) = std::thread::scope(|s| {
        let j = s.spawn(|| json(&["conformance", "--json", "--storm-stalls", "10", "--timeout", "60"], &[]));
        let t = s.spawn(|| text(&["conformance", "--storm-stalls", "10", "--timeout", "60"]));
        (j.join().unwrap(), t.join().unwrap())
    });
    let (code, v, stderr) = json_run;
    assert_eq!(code, 0, "{stderr}");
    assert_envelope(&v, true);
    let checks = v["checks"].as_array().unwrap();
    let outcomes = ["pass", "fail", "skip", "crash", "timeout"];
    let count = |mech: Option<&Value>, o: &str| {
        checks.iter().filter(|c| c["outcome"] == o && mech.is_none_or(|m| &c["mechanism"] == m)).count()
    };
    let total = &v["counts"];
    assert_eq!(u(&total["total"]), checks.len());
    for o in outcomes {
        assert_eq!(u(&total[o]), count(None, o), "{o}");
    }
    let by = v["counts_by_mechanism"].as_array().unwrap();
    assert!(by[0]["mechanism"].is_null(), "plugin-wide first: {by:#?}");
    let published: Vec<&Value> = v["mechanisms"].as_array().unwrap().iter().map(|m| &m["name"]).collect();
    let named: Vec<&Value> = by[1..].iter().map(|m| &m["mechanism"]).collect();
    assert_eq!(named, published, "one entry per mechanism checked, in order");
    for m in by {
        for o in outcomes {
            assert_eq!(u(&m[o]), count(Some(&m["mechanism"]), o), "{m}");
        }
        assert_eq!(u(&m["total"]), outcomes.iter().map(|o| u(&m[*o])).sum::<usize>());
    }
    for o in outcomes.iter().chain(&["total"]) {
        assert_eq!(by.iter().map(|m| u(&m[*o])).sum::<usize>(), u(&total[*o]), "{o}");
    }

    let (code, t) = text_run;
    // The table names the check that failed: kept in the message.
    assert_eq!(code, 0, "{t}");
    let line = |c: &Value| {
        format!(
            "{} passed, {} failed, {} skipped, {} crashed, {} timed out",
            c["pass"], c["fail"], c["skip"], c["crash"], c["timeout"]
        )
    };
    assert!(t.contains(&format!("\n{} ({} checks)\n", line(total), total["total"])), "{t}");
    assert!(t.contains(&format!("\nplugin-wide: {}\n", line(&by[0]))), "{t}");
    for m in &by[1..] {
        let name = m["mechanism"].as_str().unwrap();
        assert!(t.contains(&format!("\nmechanism {name}: {}\n", line(m))), "{t}");
    }
}

#[test]
fn the_help_gives_the_exit_statuses_and_usage_errors_exit_2() {
    let (code, help) = text(&["--help"]);
    assert_eq!(code, 0);
    for want in
        ["Exit status", "0  ok", "1  a check failed", "2  usage error", "3  could not run", "docs/cli.md"]
    {
        assert!(help.contains(want), "--help does not say {want:?}:\n{help}");
    }
    for bad in [&["bogus"][..], &["demo", "--no-such-flag"], &["demo", "--plot", "/nonexistent/dir/x.svg"]] {
        let out = memplug(bad, &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(out.stdout.is_empty(), "{bad:?}: nothing ran");
    }
    let out = memplug(&["demo", "--trace", "/nonexistent/dir/t.json"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot create the trace"), "{out:?}");
}
