//! `memplug demo --trace FILE`: the demo's timeline as a Chrome/Perfetto
//! trace, in the Trace Event Format's JSON object form (`traceEvents`,
//! `ts` in microseconds): each scene a complete event (`ph` "X") on one
//! track, each timeline event an instant (`ph` "i") on another, the pool's
//! use per allocation class a counter (`ph` "C") after every event, and
//! the kernel's resident figures a counter at every measurement. Open it
//! in ui.perfetto.dev or chrome://tracing.

use super::report::Report;
use super::MIB;
use serde_json::{json, Map, Value};

const PID: u32 = 1;
/// The tracks (threads, to a trace viewer).
const SCENES_TID: u32 = 1;
const EVENTS_TID: u32 = 2;
const KERNEL_TID: u32 = 3;

/// The name of the pool-use counter; its series are the allocation
/// classes, in MiB.
const POOL_COUNTER: &str = "pool use per class (MiB)";
/// The name of the kernel's counter, in MiB.
const KERNEL_COUNTER: &str = "kernel resident (MiB)";

/// Milliseconds as the format's microseconds (whole: the timeline's
/// resolution is 0.1 ms).
fn us(ms: f64) -> f64 {
    (ms * 1000.0).round()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

fn thread_name(tid: u32, name: &str) -> Value {
    json!({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": name}})
}

/// The trace of `r`, as one JSON document.
pub(super) fn trace(r: &Report) -> Value {
    let mut events = vec![
        json!({"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": "memplug demo"}}),
        thread_name(SCENES_TID, "scenes"),
        thread_name(EVENTS_TID, "timeline events"),
        thread_name(KERNEL_TID, "kernel measurements"),
    ];
    for s in &r.scenes {
        events.push(json!({
            "name": format!("{}. {}", s.step, s.title),
            "cat": "scene",
            "ph": "X",
            "ts": us(s.start_ms),
            "dur": us(s.end_ms) - us(s.start_ms),
            "pid": PID,
            "tid": SCENES_TID,
            "args": {"scene": s.id, "events": s.events},
        }));
    }
    // The classes that held anything, so the counter has no flat tracks.
    let classes: Vec<&str> = memplug_host::governor::AllocationClass::ALL
        .iter()
        .map(|c| c.name())
        .filter(|c| r.timeline.iter().any(|e| e.class_used.get(c).is_some_and(|&b| b != 0)))
        .collect();
    for e in &r.timeline {
        events.push(json!({
            "name": e.kind,
            "cat": e.scene,
            "ph": "i",
            "s": "t",
            "ts": us(e.t_ms),
            "pid": PID,
            "tid": EVENTS_TID,
            "args": {"subject": e.subject, "detail": e.detail, "pool_used": e.pool_used},
        }));
        let mut args = Map::new();
        for c in &classes {
            args.insert((*c).to_string(), mib(e.class_used.get(c).copied().unwrap_or(0)).into());
        }
        events.push(json!({"name": POOL_COUNTER, "ph": "C", "ts": us(e.t_ms), "pid": PID, "args": args}));
    }
    for m in &r.measurements {
        let mut args = Map::new();
        args.insert("governor".into(), mib(m.governor_used).into());
        if let (Some(w), Some(k)) = (m.resident_weights, m.resident_kv) {
            args.insert("pagemap".into(), mib(w + k).into());
        }
        if let Some(d) = m.process_delta {
            args.insert("smaps delta".into(), (d as f64 / MIB as f64).into());
        }
        if m.stranded != 0 {
            args.insert("stranded".into(), mib(m.stranded).into());
        }
        events.push(json!({"name": KERNEL_COUNTER, "ph": "C", "ts": us(m.t_ms), "pid": PID, "args": args}));
        events.push(json!({
            "name": m.label,
            "cat": "measure",
            "ph": "i",
            "s": "t",
            "ts": us(m.t_ms),
            "pid": PID,
            "tid": KERNEL_TID,
            "args": {"agree": m.exact_ok && m.process_ok},
        }));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "tool": "memplug demo",
            "schema_version": r.schema_version,
            "ok": r.ok,
            "checks_passed": r.counts.passed,
            "checks_failed": r.counts.failed,
        },
    })
}
