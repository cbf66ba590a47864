//! `memplug demo` as a user runs it: the scripted LLM-serving scenario on
//! the reference CPU plugin exits 0, its JSON parses, the ledger ends at
//! zero, and the timeline shows pressure, eviction, a zero answer, an
//! OutOfBudget that rolls back, and a free that waits for its fence.

use serde_json::Value;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn memplug(args: &[&str]) -> (Output, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_memplug")).args(args).output().expect("run memplug");
    (out, t.elapsed())
}

fn events<'a>(v: &'a Value, kind: &str) -> Vec<&'a Value> {
    v["timeline"].as_array().unwrap().iter().filter(|e| e["kind"] == kind).collect()
}

#[test]
fn demo_runs_and_every_check_passes() {
    let (out, took) = memplug(&["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout:\n{text}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    for want in [
        "timeline",
        "ticket        weights",
        "evict         weights",
        "answers 0",
        "OutOfBudget",
        "queued behind a fence",
        "ledger (after teardown)",
        "unloaded",
        "checks passed",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(!text.contains("FAIL") && !text.contains("DISAGREE"), "{text}");
    // A few seconds in a debug build; generous here for loaded machines.
    assert!(took < Duration::from_secs(30), "demo took {took:?}");
}

#[test]
fn demo_json_is_one_document_with_a_zero_ledger() {
    let (out, _) = memplug(&["demo", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one valid JSON document");
    assert_eq!(v["ok"], true, "{v:#}");
    for c in v["checks"].as_array().unwrap() {
        assert_eq!(c["ok"], true, "check failed: {c}");
    }

    // The ledger ends at zero and the plugin unloads.
    let l = &v["ledger"];
    assert_eq!(l["pool"]["used"], 0);
    assert_eq!(l["pool"]["capacity"], 64 << 20);
    assert!(l["pool"]["peak"].as_u64().unwrap() <= 64 << 20);
    assert!(l["pool"]["peak"].as_u64().unwrap() > 0);
    for c in l["classes"].as_array().unwrap() {
        for f in ["reserved", "leased", "quarantined"] {
            assert_eq!(c[f], 0, "class {} {f}", c["class"]);
        }
    }
    assert_eq!(l["queue"]["pending"], 0);
    assert!(l["queue"]["retired"].as_u64().unwrap() >= 1);
    assert_eq!(l["plugin"]["live_objects"], 0);
    assert_eq!(l["plugin"]["host_objects"], 0);
    assert_eq!(l["plugin"]["unloaded"], true);
    assert_eq!(l["resident_after"], 0);

    // Holders: weights answered tickets with bytes, kv with zero.
    let holder = |name: &str| {
        l["holders"].as_array().unwrap().iter().find(|h| h["name"] == name).cloned().expect(name)
    };
    let (w, kv) = (holder("weights"), holder("kv"));
    assert!(w["tickets"].as_u64().unwrap() >= 1);
    assert!(w["bytes_answered"].as_u64().unwrap() > 0);
    assert!(kv["tickets"].as_u64().unwrap() >= 1);
    assert_eq!(kv["bytes_answered"], 0);
    assert_eq!(kv["zero_answers"], kv["tickets"]);

    // The timeline shows the pressure and what it did, in order.
    let t = v["timeline"].as_array().unwrap();
    let ms: Vec<f64> = t.iter().map(|e| e["t_ms"].as_f64().unwrap()).collect();
    assert!(ms.windows(2).all(|w| w[0] <= w[1]), "timeline out of order");
    let pos = |pred: &dyn Fn(&Value) -> bool| t.iter().position(pred);
    let ticket_w = pos(&|e| e["kind"] == "ticket" && e["subject"] == "weights").expect("weights ticket");
    let evict = pos(&|e| e["kind"] == "evict").expect("eviction");
    let ticket_kv = pos(&|e| {
        e["kind"] == "ticket" && e["subject"] == "kv" && e["detail"].as_str().unwrap().contains("answers 0")
    })
    .expect("kv answering 0");
    let oob = pos(&|e| e["kind"] == "out_of_budget").expect("out of budget");
    let rollback = pos(&|e| e["kind"] == "rollback").expect("rollback");
    assert!(ticket_w < evict && ticket_kv < oob && oob < rollback);
    assert!(t[oob]["detail"].as_str().unwrap().contains("OutOfBudget"));
    // An eviction refunds: the pool's use drops across it.
    assert!(t[evict]["pool_used"].as_u64() < t[evict - 1]["pool_used"].as_u64());
    // Growth never exceeds the hard capacity.
    assert!(t.iter().all(|e| e["pool_used"].as_u64().unwrap() <= 64 << 20));
    assert!(events(&v, "grow").iter().all(|e| e["detail"].as_str().unwrap().contains("same address")));

    // The fence-ordered free: queued, not retired before the fence, then
    // retired with the queue empty.
    let release = pos(&|e| e["kind"] == "release").expect("release behind a fence");
    let fence = pos(&|e| e["kind"] == "fence").expect("fence completion");
    let retired = pos(&|e| e["kind"] == "retired").expect("retirement");
    assert!(release < fence && fence < retired);
    assert!(t[release]["detail"].as_str().unwrap().contains("queue pending 1"));
    assert!(t[retired]["detail"].as_str().unwrap().contains("queue pending 0"));
    assert_eq!(t[release]["pool_used"], t[fence]["pool_used"], "charge kept until the fence");
    assert!(t[retired]["pool_used"].as_u64() < t[fence]["pool_used"].as_u64());

    // Governor and kernel agree at every measurement, and end at zero.
    let m = v["measurements"].as_array().unwrap();
    assert!(m.len() >= 4);
    for x in m {
        assert_eq!(x["exact_ok"], true, "{x}");
        assert_eq!(x["process_ok"], true, "{x}");
    }
    assert_eq!(m.last().unwrap()["governor_used"], 0);
    assert_eq!(events(&v, "unload").len(), 1);
}
