//! `memplug node serve` and `memplug node status` as a person runs them:
//! the authority as a process of its own, its books read over its socket,
//! bad arguments refused with the reason.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn memplug() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memplug"))
}

#[test]
fn serve_then_status_in_json_and_prometheus() {
    let dir = std::env::temp_dir().join(format!("memplug-cli-node-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("node.sock");
    let mut server = memplug()
        .args(["node", "serve", "--socket"])
        .arg(&socket)
        .args(["--device", "cpu0=64M", "--device", "cpu1=1G", "--chunk", "1M"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let json = loop {
        let out = memplug().args(["node", "status", "--socket"]).arg(&socket).output().unwrap();
        if out.status.success() {
            break String::from_utf8(out.stdout).unwrap();
        }
        assert!(Instant::now() < end, "no status: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(20));
    };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["devices"]["cpu0"]["capacity"], 64u64 << 20);
    assert_eq!(v["devices"]["cpu1"]["free"], 1u64 << 30);
    assert_eq!(v["chunk"], 1u64 << 20);
    assert_eq!(v["books_exact"], true);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
    // A member declaring KV and weights on cpu0: the status shows its
    // classes, in JSON and Prometheus text.
    use memplug_node::wire::{self, Declared, Frame, Msg};
    let mut member = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let classes = 1 << memplug_host::governor::AllocationClass::Kv as u8
        | 1 << memplug_host::governor::AllocationClass::Weights as u8;
    let devices = vec![Declared { device: "cpu0".into(), priority: 2, classes, holding: 0 }];
    wire::write_msg(&mut member, &Msg::Hello { version: wire::VERSION, devices }).unwrap();
    assert!(matches!(wire::read_frame(&mut member).unwrap(), Frame::Msg(Msg::Welcome { .. })));
    let out = memplug().args(["node", "status", "--socket"]).arg(&socket).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["members"][0]["classes"]["cpu0"], serde_json::json!(["weights", "kv"]), "{v}");
    let prom = memplug().args(["node", "status", "--prometheus", "--socket"]).arg(&socket).output().unwrap();
    let text = String::from_utf8(prom.stdout).unwrap();
    assert!(text.contains("memplug_node_capacity_bytes{device=\"cpu0\"} 67108864"), "{text}");
    assert!(text.contains(",device=\"cpu0\",class=\"kv\"} 1"), "{text}");
    drop(member);
    // A second authority on the same socket is refused.
    let second = memplug()
        .args(["node", "serve", "--socket"])
        .arg(&socket)
        .args(["--device", "cpu0=1M"])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&second.stderr).contains("already serves"));
    server.kill().unwrap();
    let _ = server.wait();
}

#[test]
fn bad_arguments_are_refused_with_the_reason() {
    let out = memplug().args(["node", "serve", "--socket", "x.sock", "--device", "cpu0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected NAME=BYTES"));
    let out = memplug().args(["node", "status", "--socket", "/nonexistent/node.sock"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/node.sock"));
    let out = memplug()
        .args(["node", "serve", "--socket", "x.sock", "--device", "cpu0=1MiB", "--group-quota", "staff=1MiB"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"staff\" is not a group id"));
}

/// `memplug node demo`: two processes on one budget, every check passing,
/// in text, in JSON (with the samples the chart draws) and as a chart.
#[test]
fn the_two_process_demo_balances_in_text_json_and_a_chart() {
    let out = memplug().args(["node", "demo"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("offloaded to host memory") && text.contains("(same address: true)"), "{text}");
    assert!(!text.contains("FAIL"), "{text}");

    let dir = std::env::temp_dir().join(format!("memplug-cli-node-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let chart = dir.join("node.svg");
    let out = memplug().args(["node", "demo", "--json", "--plot"]).arg(&chart).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], true, "{doc}");
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["counts"]["failed"], 0);
    let checks = doc["checks"].as_array().unwrap();
    assert!(checks.len() >= 7 && checks.iter().all(|c| c["ok"] == true), "{doc}");
    assert_eq!(doc["ledger"]["trainer"]["allocated"], doc["ledger"]["trainer"]["freed"]);
    assert_eq!(doc["ledger"]["node"]["leased_at_end"], 0);
    let samples = doc["samples"].as_array().unwrap();
    assert!(samples.iter().any(|s| s["trainer_leased"].as_u64().unwrap() > 0), "the trainer leased nothing");
    assert!(samples.iter().any(|s| s["host_copies"].as_u64().unwrap() > 0), "nothing was offloaded");
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("trainer: leased") && svg.contains("node: capacity"));
    let _ = std::fs::remove_dir_all(&dir);
}
