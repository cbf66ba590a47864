//! `memplug demo --plot FILE.svg --trace FILE`: one run draws the chart,
//! writes the trace and prints the JSON report, and the three agree. The
//! chart is well-formed XML with a series for each class, the pool, the
//! capacity, the tickets, evictions and the kernel's figures, and a mark
//! per ticket; the trace is Trace Event Format JSON with a complete event
//! per scene, an instant per timeline event, and counters for the pool's
//! use per class and for the kernel's figures.

mod common;

use common::xml::{attr, parse_xml, Element};
use serde_json::Value;
use std::process::Command;

/// One run with all three outputs: the report, the SVG, the trace.
fn run() -> (Value, String, Value) {
    let dir = memplug_test_support::test_tmp_dir("demo_chart");
    let (svg, trace) = (dir.join("demo.svg"), dir.join("demo.trace.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_memplug"))
        .args(["demo", "--json", "--plot", svg.to_str().unwrap(), "--trace", trace.to_str().unwrap()])
        .env_remove("MEMPLUG_CPU_TEST_SWITCHES")
        .output()
        .expect("run memplug");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = serde_json::from_slice(&out.stdout).expect("the report");
    let trace = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("the trace is JSON");
    (report, std::fs::read_to_string(&svg).unwrap(), trace)
}

fn of_kind<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["timeline"].as_array().unwrap().iter().filter(|e| e["kind"] == kind).collect()
}

#[test]
fn the_chart_the_trace_and_the_report_agree() {
    let (report, svg, trace) = run();
    check_chart(&report, &svg);
    check_trace(&report, &trace);
}

fn check_chart(report: &Value, svg: &str) {
    let elements = parse_xml(svg).unwrap_or_else(|e| panic!("{e}\n{}", &svg[..svg.len().min(400)]));
    let root: &Element = &elements[0];
    assert_eq!(root.name, "svg");
    assert_eq!((attr(root, "width"), attr(root, "height")), ("1280", "640"));
    let texts: Vec<&str> = elements.iter().filter(|e| e.name == "text").map(|e| e.text.as_str()).collect();
    for series in [
        "weights (governor: charged)",
        "kv (governor: charged)",
        "pool used (governor)",
        "pool capacity (64 MiB)",
        "pressure ticket",
        "eviction",
        "OutOfBudget",
        "offloaded to the host pool",
        "restored at its address",
        "copy-on-write (privatise)",
        "device lost",
        "weights resident (kernel: pagemap)",
        "kv resident (kernel: pagemap)",
        "process resident Δ, less host copies (kernel)",
        "host pool: charged (another pool, not this budget)",
        "stranded by the loss, uncharged (kernel)",
    ] {
        assert!(texts.contains(&series), "no series {series:?} in the legend: {texts:?}");
    }
    for s in report["scenes"].as_array().unwrap() {
        let key = format!("{} {}", s["step"], s["title"].as_str().unwrap());
        assert!(texts.contains(&key.as_str()), "no scene {key:?}: {texts:?}");
    }
    // A triangle per pressure ticket, and the legend's; a cross's two
    // strokes per eviction and OutOfBudget.
    let count = |name: &str| elements.iter().filter(|e| e.name == name).count();
    let tickets = of_kind(report, "ticket").len();
    assert!(tickets > 0);
    assert_eq!(count("polygon"), tickets + 1, "one triangle per ticket");
    // Dots at the measurements: per class, the process's delta, the
    // stranded pages once lost; and the legend's.
    let ms = report["measurements"].as_array().unwrap();
    let present = |k: &str| ms.iter().filter(|m| !m[k].is_null()).count();
    let stranded = ms.iter().filter(|m| m["stranded"] != 0 && !m["resident_stranded"].is_null()).count();
    let host = ms.iter().filter(|m| m["governor_host"] != 0).count();
    assert!(host > 0, "the offload charged the host pool");
    let dots =
        present("resident_weights") + present("resident_kv") + present("process_delta") + stranded + host;
    assert_eq!(count("circle"), dots + 5, "a dot per kernel figure and host-pool figure");
    // A square per offload, restore and copy-on-write, and the legend's,
    // told apart by colour (host pool cyan, copy-on-write pink).
    let squares = |colour: &str| {
        elements
            .iter()
            .filter(|e| e.name == "rect")
            .filter(|e| e.attrs.iter().any(|(k, v)| (k == "fill" || k == "stroke") && v == colour))
            .count()
    };
    let (offloads, restores) = (of_kind(report, "offload").len(), of_kind(report, "restore").len());
    assert!(offloads > 0 && restores > 0);
    assert_eq!(squares("#17BECF"), offloads + restores + 2, "a square per offload and restore");
    assert_eq!(squares("#E377C2"), of_kind(report, "privatise").len() + 1, "a square per copy-on-write");
    // The device pool's figures stay under its capacity: the host copies
    // are another pool's (drawn apart), not a breach of this budget.
    let capacity = report["scenario"]["pool_capacity"].as_i64().unwrap();
    for m in ms {
        // (A lost context's stranded pages are resident and uncharged, and
        // drawn apart too.)
        let apart = m["resident_host"].as_i64().unwrap_or(0) + m["resident_stranded"].as_i64().unwrap_or(0);
        if let Some(d) = m["process_delta"].as_i64() {
            assert!(d - apart <= capacity + (1 << 20), "{m}: the ring would sit above the capacity");
        }
        assert!(m["governor_used"].as_i64().unwrap() <= capacity, "{m}");
    }
}

/// docs/demo.svg (the README's picture) is the chart the demo draws now:
/// the same legend and the same scene key (the figures differ run to run,
/// the words may not). Regenerate it with `cargo build -p
/// memplug-plugin-cpu && cargo run -p memplug-cli -- demo --plot
/// docs/demo.svg` (with the plugin's library the device-loss scene runs).
#[test]
fn the_committed_chart_is_the_one_the_demo_draws() {
    let (_, svg, _) = run();
    let words = |svg: &str| -> Vec<String> {
        let elements = parse_xml(svg).expect("well-formed SVG");
        let mut w: Vec<String> = elements
            .iter()
            .filter(|e| e.name == "text")
            .map(|e| e.text.trim().to_string())
            .filter(|t| !t.is_empty() && t.parse::<f64>().is_err())
            .collect();
        w.sort();
        w.dedup();
        w
    };
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/demo.svg");
    let committed = std::fs::read_to_string(&path).expect("docs/demo.svg");
    assert_eq!(
        words(&committed),
        words(&svg),
        "docs/demo.svg is stale: regenerate it with `cargo build -p memplug-plugin-cpu && cargo run -p \
         memplug-cli -- demo --plot docs/demo.svg` (the library, so that the device-loss scene runs)"
    );
}

fn check_trace(report: &Value, trace: &Value) {
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    assert_eq!(trace["displayTimeUnit"], "ms");
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        assert!(["M", "X", "i", "C"].contains(&ph), "{e}");
        assert!(e["name"].is_string() && e["pid"].is_u64(), "{e}");
        if ph != "M" {
            assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
        }
    }
    let with = |ph: &str| events.iter().filter(|e| e["ph"] == ph).collect::<Vec<_>>();
    // Microseconds: the report's milliseconds times 1000.
    let us = |ms: &Value| (ms.as_f64().unwrap() * 1000.0).round();

    // One complete event per scene, in order, where the report puts it.
    let scenes = report["scenes"].as_array().unwrap();
    let xs = with("X");
    assert_eq!(xs.len(), scenes.len());
    for (x, s) in xs.iter().zip(scenes) {
        assert_eq!(x["name"], format!("{}. {}", s["step"], s["title"].as_str().unwrap()));
        assert_eq!(x["args"]["scene"], s["id"]);
        assert_eq!(x["ts"].as_f64().unwrap(), us(&s["start_ms"]));
        assert_eq!(x["dur"].as_f64().unwrap(), us(&s["end_ms"]) - us(&s["start_ms"]), "{x}");
    }

    // One instant per timeline event (and one per measurement), in order.
    let t = report["timeline"].as_array().unwrap();
    let instants: Vec<_> = with("i").into_iter().filter(|e| e["cat"] != "measure").collect();
    assert_eq!(instants.len(), t.len());
    for (i, e) in instants.iter().zip(t) {
        assert_eq!((&i["name"], &i["cat"], &i["args"]["subject"]), (&e["kind"], &e["scene"], &e["subject"]));
        assert_eq!(i["ts"].as_f64().unwrap(), us(&e["t_ms"]));
    }

    // The pool counter after every event: the classes that held anything,
    // in MiB, adding up to the pool's use.
    let counters = with("C");
    let pool: Vec<_> = counters.iter().filter(|c| c["name"] == "pool use per class (MiB)").collect();
    assert_eq!(pool.len(), t.len());
    for (c, e) in pool.iter().zip(t) {
        let args = c["args"].as_object().unwrap();
        let mut keys: Vec<&str> = args.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["kv", "weights"], "{c}");
        let sum: f64 = args.values().map(|v| v.as_f64().unwrap()).sum();
        assert_eq!(sum * (1 << 20) as f64, e["pool_used"].as_f64().unwrap(), "{c} vs {e}");
    }
    let evict = of_kind(report, "evict")[0];
    assert!(pool.iter().any(|c| c["ts"].as_f64().unwrap() == us(&evict["t_ms"])));

    // The kernel counter at every measurement.
    let ms = report["measurements"].as_array().unwrap();
    let kernel: Vec<_> = counters.iter().filter(|c| c["name"] == "kernel resident (MiB)").collect();
    assert_eq!(kernel.len(), ms.len());
    for (c, m) in kernel.iter().zip(ms) {
        assert_eq!(c["ts"].as_f64().unwrap(), us(&m["t_ms"]));
        assert_eq!(
            c["args"]["governor"].as_f64().unwrap() * (1 << 20) as f64,
            m["governor_used"].as_f64().unwrap()
        );
        assert_eq!(c["args"]["smaps delta"].is_number(), !m["process_delta"].is_null(), "{c}");
        assert_eq!(c["args"]["pagemap"].is_number(), !m["resident_kv"].is_null(), "{c}");
    }
    assert_eq!(trace["otherData"]["ok"], true);
}
