//! The shim's configuration, read once from the environment at the first
//! call (torch gives the allocator functions no other way in). Every
//! variable is listed in [`VARIABLES`]; the README's table is the same
//! list. A bad value is an error naming the variable, never a silent
//! default: the shim then refuses every allocation and says why.

use std::path::PathBuf;
use std::time::Duration;

/// How much the shim writes to stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Nothing.
    Off = 0,
    /// Refusals that mean a bug or a misconfiguration (unknown pointers,
    /// frees that could not be ordered, a failed start).
    Warn = 1,
    /// Also every failed allocation and each device's set-up.
    Info = 2,
}

/// When a freed block may be reused (`MEMPLUG_TORCH_REUSE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// `all-streams` (the default): not before every stream the shim has
    /// seen on the device (every stream torch allocated or freed on, and
    /// each one given to `memplug_torch_note_stream`) has passed a fence
    /// recorded when the block was freed. While the freeing stream is the
    /// only one seen, a request on it reuses the block at once. The safe
    /// policy where tensors are read on side streams: torch's
    /// `record_stream` does not reach a pluggable allocator.
    AllStreams,
    /// `free-stream`: after a fence on the freeing stream only, and at
    /// once on that stream (torch's own allocator without
    /// `record_stream`): fewer fences, but a side stream still reading the
    /// block may see it reused.
    FreeStream,
}

/// What the environment asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `MEMPLUG_TORCH_PLUGIN`: the plugin library; `None` = the CUDA VMM
    /// plugin beside the shim's own file.
    pub plugin: Option<PathBuf>,
    /// `MEMPLUG_TORCH_POOL_BYTES`: each device's budget; `None` = the
    /// device's total memory as its plugin reports it.
    pub pool_bytes: Option<u64>,
    /// `MEMPLUG_TORCH_CACHE`: the caching binding in front (default on).
    pub cache: bool,
    /// `MEMPLUG_TORCH_CACHE_MAX_BLOCK`: requests above it bypass the cache.
    pub cache_max_block: u64,
    /// `MEMPLUG_TORCH_CACHE_MAX_IDLE`: the most bytes the cache keeps idle
    /// (`None`: a quarter of the pool; `Some(u64::MAX)` from `none`).
    pub cache_max_idle: Option<u64>,
    /// `MEMPLUG_TORCH_GC_THRESHOLD`: a fraction of the pool a miss keeps
    /// the pool under by giving idle blocks back first (PyTorch's
    /// `garbage_collection_threshold`).
    pub gc_threshold: Option<f64>,
    /// `MEMPLUG_TORCH_WAIT_MS`: how long an allocation that does not fit
    /// waits for frees queued behind fences to land before it fails (0:
    /// not at all). It never waits when nothing is queued.
    pub wait: Duration,
    /// `MEMPLUG_TORCH_REAPER_MS`: how often completed frees are retired.
    pub reaper: Duration,
    /// `MEMPLUG_TORCH_LOG`.
    pub log: LogLevel,
    /// `MEMPLUG_TORCH_REUSE`.
    pub reuse: Reuse,
    /// `MEMPLUG_NODE_SOCKET`: a node authority each device's pool joins
    /// (as `cuda<N>`): its budget is then what this process leases, shared
    /// with every process on the device.
    pub node_socket: Option<PathBuf>,
}

/// Every variable the shim reads, with its meaning (for `--help`-like
/// listings and the tests that keep the README in step).
pub const VARIABLES: &[(&str, &str)] = &[
    ("MEMPLUG_TORCH_PLUGIN", "plugin library path (default: libmemplug_plugin_cuda_vmm.so beside the shim)"),
    (
        "MEMPLUG_TORCH_POOL_BYTES",
        "budget per device, bytes with an optional K/M/G/T suffix (default: device memory)",
    ),
    ("MEMPLUG_TORCH_CACHE", "1: caching binding in front (default), 0: every free goes to the mechanism"),
    ("MEMPLUG_TORCH_CACHE_MAX_BLOCK", "largest request the cache keeps (default 1G)"),
    (
        "MEMPLUG_TORCH_CACHE_MAX_IDLE",
        "most bytes the cache keeps idle, or none for no cap (default: a quarter of the pool)",
    ),
    ("MEMPLUG_TORCH_GC_THRESHOLD", "fraction in (0, 1] of the pool a miss keeps use under (default: off)"),
    ("MEMPLUG_TORCH_WAIT_MS", "how long a request over budget waits for queued frees (default 1000)"),
    ("MEMPLUG_TORCH_REAPER_MS", "how often completed frees are retired (default 1)"),
    ("MEMPLUG_TORCH_LOG", "off, warn (default) or info"),
    (
        "MEMPLUG_TORCH_REUSE",
        "all-streams (default): a freed block waits for every stream seen; free-stream: for its own only",
    ),
    (
        "MEMPLUG_NODE_SOCKET",
        "a node authority's socket: each device's budget is leased from it (default: none)",
    ),
];

impl Config {
    /// The configuration of this process's environment.
    pub fn from_env() -> Result<Config, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The configuration `get` describes (`get(name)` = the variable's
    /// value, `None` when unset). An empty value counts as unset.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let get = |name: &str| get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let ms = |name: &str, dflt: u64| -> Result<u64, String> {
            get(name).map_or(Ok(dflt), |v| {
                v.parse::<u64>().map_err(|_| format!("{name}={v:?}: not a whole number of milliseconds"))
            })
        };
        let pool_bytes = match get("MEMPLUG_TORCH_POOL_BYTES") {
            None => None,
            Some(v) => Some(parse_bytes(&v).map_err(|e| format!("MEMPLUG_TORCH_POOL_BYTES={v:?}: {e}"))?),
        };
        if pool_bytes == Some(0) {
            return Err("MEMPLUG_TORCH_POOL_BYTES=0: a pool of no bytes refuses everything".into());
        }
        let cache = match get("MEMPLUG_TORCH_CACHE").as_deref() {
            None | Some("1") => true,
            Some("0") => false,
            Some(v) => return Err(format!("MEMPLUG_TORCH_CACHE={v:?}: expected 0 or 1")),
        };
        let cache_max_block = match get("MEMPLUG_TORCH_CACHE_MAX_BLOCK") {
            None => 1 << 30,
            Some(v) => parse_bytes(&v).map_err(|e| format!("MEMPLUG_TORCH_CACHE_MAX_BLOCK={v:?}: {e}"))?,
        };
        let cache_max_idle = match get("MEMPLUG_TORCH_CACHE_MAX_IDLE").as_deref() {
            None => None,
            Some("none") => Some(u64::MAX),
            Some(v) => Some(parse_bytes(v).map_err(|e| format!("MEMPLUG_TORCH_CACHE_MAX_IDLE={v:?}: {e}"))?),
        };
        let gc_threshold = match get("MEMPLUG_TORCH_GC_THRESHOLD") {
            None => None,
            Some(v) => match v.parse::<f64>() {
                Ok(t) if t > 0.0 && t <= 1.0 => Some(t),
                _ => return Err(format!("MEMPLUG_TORCH_GC_THRESHOLD={v:?}: expected a fraction in (0, 1]")),
            },
        };
        let wait = Duration::from_millis(ms("MEMPLUG_TORCH_WAIT_MS", 1000)?);
        let reaper = ms("MEMPLUG_TORCH_REAPER_MS", 1)?;
        if reaper == 0 {
            return Err("MEMPLUG_TORCH_REAPER_MS=0: the reaper needs an interval of at least 1 ms".into());
        }
        let log = match get("MEMPLUG_TORCH_LOG").as_deref() {
            None | Some("warn") => LogLevel::Warn,
            Some("off") => LogLevel::Off,
            Some("info") => LogLevel::Info,
            Some(v) => return Err(format!("MEMPLUG_TORCH_LOG={v:?}: expected off, warn or info")),
        };
        let reuse = match get("MEMPLUG_TORCH_REUSE").as_deref() {
            None | Some("all-streams") => Reuse::AllStreams,
            Some("free-stream") => Reuse::FreeStream,
            Some(v) => return Err(format!("MEMPLUG_TORCH_REUSE={v:?}: expected all-streams or free-stream")),
        };
        Ok(Config {
            plugin: get("MEMPLUG_TORCH_PLUGIN").map(PathBuf::from),
            pool_bytes,
            cache,
            cache_max_block,
            cache_max_idle,
            gc_threshold,
            wait,
            reaper: Duration::from_millis(reaper),
            log,
            reuse,
            node_socket: get("MEMPLUG_NODE_SOCKET").map(PathBuf::from),
        })
    }
}

/// `123`, `64K`, `512M`, `8G`, `1T` (powers of 1024; a trailing `B` or
/// `iB` is allowed: `8GiB`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("unknown unit {c:?} (K, M, G or T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| "not a whole number of bytes".to_string())?;
    n.checked_mul(1u64 << shift).ok_or_else(|| "too large".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Result<Config, String> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(move |n| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults() {
        let c = with(&[]).unwrap();
        assert_eq!((c.plugin, c.pool_bytes, c.cache), (None, None, true));
        assert_eq!(c.wait, Duration::from_secs(1));
        assert_eq!((c.reaper, c.log, c.cache_max_block), (Duration::from_millis(1), LogLevel::Warn, 1 << 30));
        assert_eq!(c.reuse, Reuse::AllStreams);
        assert_eq!((c.cache_max_idle, c.gc_threshold), (None, None));
    }

    #[test]
    fn the_idle_policy() {
        let c =
            with(&[("MEMPLUG_TORCH_CACHE_MAX_IDLE", "2G"), ("MEMPLUG_TORCH_GC_THRESHOLD", "0.8")]).unwrap();
        assert_eq!((c.cache_max_idle, c.gc_threshold), (Some(2 << 30), Some(0.8)));
        assert_eq!(with(&[("MEMPLUG_TORCH_CACHE_MAX_IDLE", "none")]).unwrap().cache_max_idle, Some(u64::MAX));
        for bad in ["0", "1.5", "x"] {
            let e = with(&[("MEMPLUG_TORCH_GC_THRESHOLD", bad)]).unwrap_err();
            assert!(e.contains("expected a fraction in (0, 1]"), "{e}");
        }
    }

    #[test]
    fn values() {
        let c = with(&[
            ("MEMPLUG_TORCH_PLUGIN", "./libx.so"),
            ("MEMPLUG_TORCH_POOL_BYTES", "8GiB"),
            ("MEMPLUG_TORCH_CACHE", "0"),
            ("MEMPLUG_TORCH_WAIT_MS", "20"),
            ("MEMPLUG_TORCH_LOG", "off"),
            ("MEMPLUG_TORCH_REUSE", "free-stream"),
        ])
        .unwrap();
        assert_eq!(c.reuse, Reuse::FreeStream);
        assert_eq!(c.plugin, Some(PathBuf::from("./libx.so")));
        assert_eq!(c.pool_bytes, Some(8 << 30));
        assert!(!c.cache);
        assert_eq!(c.wait, Duration::from_millis(20));
        assert_eq!(c.log, LogLevel::Off);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("MEMPLUG_TORCH_POOL_BYTES", "lots"),
            ("MEMPLUG_TORCH_POOL_BYTES", "0"),
            ("MEMPLUG_TORCH_POOL_BYTES", "8X"),
            ("MEMPLUG_TORCH_CACHE", "yes"),
            ("MEMPLUG_TORCH_WAIT_MS", "-1"),
            ("MEMPLUG_TORCH_REAPER_MS", "0"),
            ("MEMPLUG_TORCH_LOG", "loud"),
            ("MEMPLUG_TORCH_REUSE", "never"),
        ] {
            let e = with(&[(k, v)]).unwrap_err();
            assert!(e.starts_with(k), "{k}={v}: {e}");
        }
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64K"), Ok(64 << 10));
        assert_eq!(parse_bytes("512m"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1T"), Ok(1 << 40));
        assert!(parse_bytes("99999999999T").is_err());
        assert!(parse_bytes("G").is_err());
    }

    #[test]
    fn every_variable_read_is_listed() {
        // The parser reads exactly the listed names.
        let read = std::cell::RefCell::new(Vec::new());
        let _ = Config::from_lookup(|n| {
            read.borrow_mut().push(n.to_string());
            None
        });
        let mut read = read.into_inner();
        read.sort();
        let mut listed: Vec<String> = VARIABLES.iter().map(|(n, _)| n.to_string()).collect();
        listed.sort();
        assert_eq!(read, listed);
    }
}
