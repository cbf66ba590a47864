//! Free and total memory of the machine, from `/proc/meminfo`.
//!
//! "Free" is `MemAvailable` (what can be allocated without swapping: free
//! pages plus reclaimable caches), not `MemFree`, which undercounts badly on
//! any machine that has been running a while. Kernels older than 3.14 lack
//! `MemAvailable`; `MemFree` is the fallback there.

use memplug_sdk::{MemoryInfo, PluginError, PluginResult};

/// Reads the machine's memory figures now.
pub fn read() -> PluginResult<MemoryInfo> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| PluginError::internal(format!("memory_info: cannot read /proc/meminfo: {e}")))?;
    parse(&text)
}

/// Free and total memory of NUMA node `node` now, from its sysfs
/// `meminfo` (lines `Node N MemTotal: ... kB`). A node has no
/// `MemAvailable`: free is `MemFree` (reclaimable caches are not counted).
pub fn read_node(node: u32) -> PluginResult<MemoryInfo> {
    let path = format!("/sys/devices/system/node/node{node}/meminfo");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| PluginError::internal(format!("memory_info: cannot read {path}: {e}")))?;
    // Drop the "Node N " prefix and read it as /proc/meminfo.
    let prefix = format!("Node {node} ");
    let lines: String =
        text.lines().filter_map(|l| l.strip_prefix(&prefix)).flat_map(|l| [l, "\n"]).collect();
    parse(&lines).map_err(|e| PluginError::internal(format!("{} ({path})", e.message)))
}

/// The most memory the machine could ever back: RAM plus swap. An object
/// larger than this can never be filled, so it is refused up front rather
/// than failing page by page later. `None` when `/proc/meminfo` is
/// unreadable (no limit is imposed then).
pub fn capacity_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let total = field(&text, "MemTotal")?;
    Some(total.saturating_add(field(&text, "SwapTotal").unwrap_or(0)))
}

/// The value of a `Name:   123 kB` line, in bytes.
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// Parses the text of `/proc/meminfo`.
fn parse(text: &str) -> PluginResult<MemoryInfo> {
    let field = |name: &str| field(text, name);
    let total_bytes = field("MemTotal")
        .ok_or_else(|| PluginError::internal("memory_info: /proc/meminfo has no readable MemTotal line"))?;
    let free_bytes = field("MemAvailable").or_else(|| field("MemFree")).ok_or_else(|| {
        PluginError::internal("memory_info: /proc/meminfo has no MemAvailable or MemFree line")
    })?;
    Ok(MemoryInfo { free_bytes: free_bytes.min(total_bytes), total_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_available_and_total() {
        let t = "MemTotal:        8000000 kB\nMemFree:          100000 kB\nMemAvailable:    5000000 kB\n";
        let m = parse(t).unwrap();
        assert_eq!(m.total_bytes, 8_000_000 * 1024);
        assert_eq!(m.free_bytes, 5_000_000 * 1024);
    }

    #[test]
    fn falls_back_to_memfree_and_refuses_garbage() {
        let m = parse("MemTotal: 10 kB\nMemFree: 4 kB\n").unwrap();
        assert_eq!(m.free_bytes, 4096);
        assert!(parse("MemTotalish: 10 kB\n").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn node_zero_reports_no_more_than_the_machine() {
        if !std::path::Path::new("/sys/devices/system/node/node0").exists() {
            eprintln!("skipped: this kernel has no NUMA nodes in sysfs");
            return;
        }
        let n = read_node(0).unwrap();
        assert!(n.total_bytes > 0 && n.free_bytes <= n.total_bytes);
        assert!(n.total_bytes <= read().unwrap().total_bytes);
    }

    #[test]
    fn this_machine_reports_sane_figures() {
        let m = read().unwrap();
        assert!(m.total_bytes > 0 && m.free_bytes <= m.total_bytes);
    }
}
