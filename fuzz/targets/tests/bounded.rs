//! The bounded fuzz run, on the stable toolchain: each target's body on
//! every seed of `fuzz/corpus/<target>/` and on pseudo-random inputs from a
//! fixed seed. Deterministic (apart from thread timing in `host_calls`), and
//! a few seconds long; the long, coverage-guided run is
//! `scripts/fuzz.sh TARGET [SECONDS]`.
//!
//! Environment: `MEMPLUG_FUZZ_ITERATIONS` (default 2000 per target) and
//! `MEMPLUG_FUZZ_SEED` (default fixed) widen or vary the random part.

use memplug_fuzz_targets::input::SplitMix64;
use memplug_fuzz_targets::{host_calls, plugin_descriptor};
use std::path::PathBuf;
use std::time::Instant;

type Body = fn(&[u8]);
type Describe = fn(&[u8]) -> String;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).expect("read seed"))).collect()
}

/// Runs `body` on one input; on a panic, says which input and what it
/// decodes to before failing.
fn one(target: &str, label: &str, data: &[u8], body: Body, describe: Describe) {
    if let Err(panic) = std::panic::catch_unwind(|| body(data)) {
        let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
        eprintln!("{target}: input {label} failed ({} bytes): {hex}\n{}", data.len(), describe(data));
        std::panic::resume_unwind(panic);
    }
}

/// Runs the target on the seeds and the random inputs; returns how many
/// random inputs ran.
fn bounded(target: &str, body: Body, describe: Describe, max_len: usize) -> u64 {
    let start = Instant::now();
    let seeds = corpus(target);
    assert!(!seeds.is_empty(), "fuzz/corpus/{target}/ has no seed");
    for (path, data) in &seeds {
        one(target, &path.display().to_string(), data, body, describe);
    }
    let n = env_u64("MEMPLUG_FUZZ_ITERATIONS", 2000);
    let seed = env_u64("MEMPLUG_FUZZ_SEED", 0x006d_656d_706c_7567);
    let mut rng = SplitMix64(seed ^ target.len() as u64);
    for i in 0..n {
        let len = (rng.next_u64() % (max_len as u64 + 1)) as usize;
        let data = rng.bytes(len);
        one(target, &format!("#{i} (seed {seed})"), &data, body, describe);
    }
    eprintln!("{target}: {} seeds + {n} random inputs in {:.2?}", seeds.len(), start.elapsed());
    n
}

/// With the default iteration count the random inputs must reach every
/// outcome listed: a decoder change that made them shallow fails here.
const REACH_CHECK_FROM: u64 = 1000;

#[test]
fn plugin_descriptor_bounded() {
    let n = bounded("plugin_descriptor", plugin_descriptor::run, plugin_descriptor::describe, 512);
    let outcomes = plugin_descriptor::outcomes();
    eprintln!("plugin_descriptor outcomes: {outcomes:?}");
    if n >= REACH_CHECK_FROM {
        for (what, count) in &outcomes {
            assert!(*count > 0, "no input reached outcome {what}: {outcomes:?}");
        }
        let loaded = outcomes[0].1;
        assert!(loaded * 20 >= n, "only {loaded} of {n} random plugins loaded: {outcomes:?}");
        // What ABI 1.2 added is reached by loaded plugins too (a handful
        // each: asserted for the default seed only, other seeds may miss
        // one).
        let features = plugin_descriptor::loaded_1_2();
        eprintln!("plugin_descriptor 1.2 features loaded: {features:?}");
        if std::env::var_os("MEMPLUG_FUZZ_SEED").is_none() {
            for (what, count) in &features {
                assert!(*count > 0, "no loaded mechanism had {what}: {features:?}");
            }
        }
    }
}

#[test]
fn host_calls_bounded() {
    let n = bounded("host_calls", host_calls::run, host_calls::describe, 256);
    let outcomes = host_calls::outcomes();
    eprintln!("host_calls outcomes (op, ran, succeeded): {outcomes:?}");
    if n >= REACH_CHECK_FROM {
        for op in
            ["allocate", "reserve_virtual", "grow_to", "create_shared", "map_prefix", "(pressure tickets)"]
        {
            let hit = outcomes.iter().find(|(name, _, _)| name == op).map_or(0, |o| o.2);
            assert!(hit > 0, "no random input made {op} succeed: {outcomes:?}");
        }
    }
}

/// Replays one input (a crash artifact of the long run) on the stable
/// toolchain: `MEMPLUG_FUZZ_REPLAY=PATH` (relative to the repository root
/// or absolute); the target is the one named in the path, or
/// `MEMPLUG_FUZZ_TARGET`. Does nothing without the variable.
#[test]
fn replay() {
    let Ok(path) = std::env::var("MEMPLUG_FUZZ_REPLAY") else { return };
    let mut file = PathBuf::from(&path);
    if file.is_relative() && !file.exists() {
        file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(&path);
    }
    let target = std::env::var("MEMPLUG_FUZZ_TARGET").unwrap_or_else(|_| {
        ["plugin_descriptor", "host_calls"]
            .into_iter()
            .find(|t| path.contains(t))
            .unwrap_or_else(|| panic!("name the target: MEMPLUG_FUZZ_TARGET=plugin_descriptor|host_calls"))
            .to_string()
    });
    let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let (body, describe): (Body, Describe) = match target.as_str() {
        "plugin_descriptor" => (plugin_descriptor::run, plugin_descriptor::describe),
        "host_calls" => (host_calls::run, host_calls::describe),
        t => panic!("unknown target {t}"),
    };
    eprintln!("{target}: {}\n{}", file.display(), describe(&data));
    one(&target, &path, &data, body, describe);
}
