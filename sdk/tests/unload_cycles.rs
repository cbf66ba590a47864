//! Loading and unloading a plugin library does not grow memory: the SDK
//! frees the built plugin (descriptors, tables, names, contexts, the
//! vendor's implementation) when the host calls `unload`, and the next load
//! builds it again.
//!
//! The CPU plugin's cdylib goes through `memplug_host::Plugin::load` and
//! `unload` (dlopen/dlclose) many times, using the plugin each time, with
//! resident memory (`VmRSS` of `/proc/self/status`) read after a warm-up and
//! at the end.

use memplug_host::Plugin;
use std::path::Path;

const WARM_UP: usize = 100;
const CYCLES: usize = 1000;
/// Growth allowed over `CYCLES` after the warm-up. The leak this guards
/// against was about 3 KiB a cycle (3 MiB over the run).
const ALLOWED_GROWTH: u64 = 256 * 1024;

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("a VmRSS line");
    let kib: u64 = line.split_whitespace().nth(1).expect("a value").parse().expect("a number");
    kib * 1024
}

/// One load, one allocation through the freshly built plugin, one unload.
fn cycle(path: &Path) {
    let plugin = Plugin::load(path).unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    let cpu = plugin.mechanism("cpu").expect("the cpu mechanism");
    // SAFETY: the allocation is freed right away, before the plugin goes.
    let a = unsafe { cpu.ungoverned() }.allocator().allocate(4096, 64).expect("allocate");
    unsafe { cpu.ungoverned() }.allocator().deallocate(a).map_err(|e| e.to_string()).expect("deallocate");
    plugin.unload().map_err(|e| e.to_string()).expect("nothing is live, so it unloads");
}

#[test]
fn a_thousand_load_unload_cycles_keep_resident_memory_flat() {
    let path = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    for _ in 0..WARM_UP {
        cycle(&path);
    }
    let before = resident_bytes();
    for _ in 0..CYCLES {
        cycle(&path);
    }
    let after = resident_bytes();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let still_mapped = std::fs::read_to_string("/proc/self/maps").unwrap().contains(&name);
    println!("{name} mapped after the last unload: {still_mapped}");
    let growth = after.saturating_sub(before);
    println!(
        "resident after {WARM_UP} warm-up cycles: {} KiB; after {CYCLES} more: {} KiB (growth {} KiB, {:.1} \
         bytes a cycle)",
        before / 1024,
        after / 1024,
        growth / 1024,
        growth as f64 / CYCLES as f64
    );
    assert!(
        growth < ALLOWED_GROWTH,
        "resident memory grew by {growth} bytes over {CYCLES} load/unload cycles ({} a cycle)",
        growth / CYCLES as u64
    );
}
