//! The process-wide state behind the exports: one manager (created at the
//! first call, never torn down: torch may free after Python's teardown
//! began, and the process's end gives the memory back), one
//! [`DeviceState`] per device (at its first use), the pointer table.

use crate::config::Config;
use crate::device::{DeviceState, Held};
use crate::log;
use crate::table::PtrTable;
use memplug_host::governor::GovernorError;
use memplug_host::{BindingError, LoadOptions, ProcessMemoryManager, Status};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// Devices the shim serves (torch's `int device`, 0-based).
pub(crate) const MAX_DEVICES: usize = 64;

/// The plugin loaded when `MEMPLUG_TORCH_PLUGIN` is unset, looked for in
/// the shim's own folder.
pub(crate) const DEFAULT_PLUGIN: &str = "libmemplug_plugin_cuda_vmm.so";

struct Entry {
    held: Held,
    device: i32,
}

pub(crate) struct Shim {
    config: Config,
    plugin: PathBuf,
    mgr: ProcessMemoryManager,
    devices: Box<[OnceLock<Result<DeviceState, String>>]>,
    table: PtrTable<Entry>,
    failed_allocs: AtomicU64,
    unknown_frees: AtomicU64,
    /// Cached bytes given back to the driver: on a driver out-of-memory
    /// before the retry, and by `memplug_torch_empty_cache`.
    trimmed_bytes: AtomicU64,
    /// Blocks whose free could not be ordered behind torch's stream: kept,
    /// never freed on a guess.
    orphans: Mutex<Vec<Held>>,
}

static SHIM: OnceLock<Result<Shim, String>> = OnceLock::new();

/// The shim, created at the first call; `Err` (the same one every time)
/// when its configuration or its plugin was refused.
pub(crate) fn get() -> Result<&'static Shim, &'static str> {
    SHIM.get_or_init(|| {
        let s = Shim::start();
        if let Err(e) = &s {
            log::warn(format_args!("not started, every allocation will fail: {e}"));
        }
        s
    })
    .as_ref()
    .map_err(String::as_str)
}

/// The shim if a call already created it (statistics do not start it).
pub(crate) fn started() -> Option<Result<&'static Shim, &'static str>> {
    SHIM.get().map(|s| s.as_ref().map_err(String::as_str))
}

impl Shim {
    fn start() -> Result<Shim, String> {
        let config = Config::from_env()?;
        log::set_level(config.log);
        let plugin = match &config.plugin {
            Some(p) => p.clone(),
            None => default_plugin()?,
        };
        let mgr = ProcessMemoryManager::new();
        mgr.set_log_hook(log::plugin);
        mgr.load_plugin(&plugin, &LoadOptions::default())
            .map_err(|e| format!("loading {}: {e}", plugin.display()))?;
        mgr.start_reaper(config.reaper);
        log::info(format_args!(
            "started: plugin {}, cache {}, budget {}",
            plugin.display(),
            if config.cache { "on" } else { "off" },
            config.pool_bytes.map_or("device memory".into(), |b| format!("{b} B per device")),
        ));
        Ok(Shim {
            devices: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            config,
            plugin,
            mgr,
            table: PtrTable::new(),
            failed_allocs: AtomicU64::new(0),
            unknown_frees: AtomicU64::new(0),
            trimmed_bytes: AtomicU64::new(0),
            orphans: Mutex::default(),
        })
    }

    fn device(&self, device: i32) -> Result<&DeviceState, String> {
        let slot = usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| format!("device {device} is out of range (0..{MAX_DEVICES})"))?;
        slot.get_or_init(|| {
            let d = DeviceState::open(&self.mgr, &self.config, device);
            match &d {
                Ok(s) => log::info(format_args!(
                    "cuda:{device}: pool {} of {} B",
                    s.pool().name(),
                    s.pool().capacity()
                )),
                Err(e) => log::warn(format_args!("cuda:{device} not served: {e}")),
            }
            d
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// torch's alloc: an address, or why not (counted and logged; the
    /// export turns it into NULL or a C++ exception).
    pub(crate) fn alloc(&self, size: isize, device: i32, stream: usize) -> Result<u64, String> {
        self.try_alloc(size, device, stream).inspect_err(|why| {
            self.failed_allocs.fetch_add(1, Ordering::Relaxed);
            log::info(format_args!("alloc({size}, device {device}, stream {stream:#x}) refused: {why}"));
        })
    }

    fn try_alloc(&self, size: isize, device: i32, stream: usize) -> Result<u64, String> {
        let size = u64::try_from(size).map_err(|_| "a negative size".to_string())?;
        if size == 0 {
            return Err("a size of 0".into());
        }
        let d = self.device(device)?;
        let held = match d.allocate(size, stream) {
            Err(BindingError::Budget(GovernorError::OutOfBudget(_))) if self.await_pending_frees(d, size) => {
                d.allocate(size, stream)
            }
            // The driver itself is out of memory (the budget had room):
            // idle cached blocks hold device memory; give them back, wait
            // for their frees, and try once more, as torch's own allocator
            // frees its cached blocks and retries before it reports OOM.
            Err(BindingError::Plugin(e)) if e.status == Status::OutOfMemory && self.release_cached(d) => {
                d.allocate(size, stream)
            }
            r => r,
        }
        .map_err(|e| e.to_string())?;
        let addr = held.addr();
        self.table.insert(addr, Entry { held, device }).map_err(|e| {
            // Not handed out twice: this one stays with its owner in the
            // table, the new one is kept too (a plugin bug, said loudly).
            log::warn(format_args!("the mechanism returned {addr:#x}, which torch still holds"));
            lock(&self.orphans).push(e.held);
            format!("address {addr:#x} returned twice")
        })?;
        Ok(addr)
    }

    /// Gives `d`'s idle cached blocks back and waits (up to
    /// `MEMPLUG_TORCH_WAIT_MS`) for the queue to free them: whether
    /// anything went back, so a retry can succeed.
    fn release_cached(&self, d: &DeviceState) -> bool {
        let trimmed = d.trim();
        self.trimmed_bytes.fetch_add(trimmed, Ordering::Relaxed);
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_micros(20);
        while self.mgr.poll().still_pending > 0 && start.elapsed() < self.config.wait {
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(1));
        }
        trimmed > 0
    }

    /// `memplug_torch_empty_cache`: every device's idle cached blocks given
    /// back to the driver (behind their fences); the bytes given back.
    pub(crate) fn empty_cache(&self) -> u64 {
        let trimmed: u64 = self
            .devices
            .iter()
            .filter_map(|d| d.get())
            .filter_map(|d| d.as_ref().ok())
            .map(|d| d.trim())
            .sum();
        self.trimmed_bytes.fetch_add(trimmed, Ordering::Relaxed);
        self.mgr.poll();
        trimmed
    }

    /// Over budget with frees still queued behind their fences (torch's
    /// kernels, or a cached block given back under pressure): waits for
    /// them, as PyTorch's own allocator synchronises before it reports
    /// out-of-memory, until the pool has `size` free, nothing is queued, or
    /// `MEMPLUG_TORCH_WAIT_MS` passed. Whether to try once more.
    fn await_pending_frees(&self, d: &DeviceState, size: u64) -> bool {
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_micros(20);
        loop {
            let pending = self.mgr.poll().still_pending > 0;
            if d.pool().free() >= size {
                return true;
            }
            if !pending || start.elapsed() >= self.config.wait {
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(1));
        }
    }

    /// `memplug_torch_note_stream`: `stream` of `device` joins the streams
    /// frees wait for (see `Reuse::AllStreams`).
    pub(crate) fn note_stream(&self, device: i32, stream: usize) -> Result<(), String> {
        self.device(device)?.note_stream(stream)
    }

    /// torch's free: ordered behind `stream`; an unknown pointer is
    /// counted, logged and ignored.
    pub(crate) fn free(&self, ptr: u64, size: usize, device: i32, stream: usize) {
        let Some(Entry { held, device: owner }) = self.table.remove(ptr) else {
            let n = self.unknown_frees.fetch_add(1, Ordering::Relaxed) + 1;
            log::warn_limited(
                n,
                format_args!("free({ptr:#x}, {size}, device {device}): not allocated here (ignored)"),
            );
            return;
        };
        if owner != device || held.size() != size as u64 {
            log::info(format_args!(
                "free({ptr:#x}, {size}, device {device}): allocated as {} B on device {owner}; freed as that",
                held.size()
            ));
        }
        let d = self.device(owner).expect("a device that allocated is open");
        if let Err((held, why)) = d.free_on(held, stream, self.config.reuse) {
            log::warn(format_args!(
                "free({ptr:#x}) could not be ordered behind stream {stream:#x} ({why}): kept"
            ));
            lock(&self.orphans).push(held);
        }
    }

    pub(crate) fn stats_json(&self) -> serde_json::Value {
        let counts = self.table.counts();
        let devices: Vec<serde_json::Value> =
            self.devices.iter().filter_map(|d| d.get()?.as_ref().ok()).map(DeviceState::stats_json).collect();
        let orphans = lock(&self.orphans);
        serde_json::json!({
            "started": true,
            "error": null,
            "plugin": self.plugin.display().to_string(),
            "cache": self.config.cache,
            "allocs": counts.inserted,
            "frees": counts.removed,
            "live": counts.live,
            "live_bytes": self.table.sum(|e| e.held.size()),
            "failed_allocs": self.failed_allocs.load(Ordering::Relaxed),
            "unknown_frees": self.unknown_frees.load(Ordering::Relaxed),
            "trimmed_bytes": self.trimmed_bytes.load(Ordering::Relaxed),
            "orphaned": orphans.len(),
            "orphaned_bytes": orphans.iter().map(Held::size).sum::<u64>(),
            "devices": devices,
        })
    }
}

impl Shim {
    /// The host's statistics report (pools, queue, contexts).
    pub(crate) fn host_stats(&self) -> memplug_host::observe::StatsReport {
        self.mgr.stats()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `DEFAULT_PLUGIN` in the folder the shim's own file was loaded from.
fn default_plugin() -> Result<PathBuf, String> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = default_plugin as *const libc::c_void;
    // SAFETY: `here` is code of this library; `info` is an out-parameter.
    let found = unsafe { libc::dladdr(here, &mut info) } != 0 && !info.dli_fname.is_null();
    if !found {
        return Err("cannot tell where the shim was loaded from; set MEMPLUG_TORCH_PLUGIN".into());
    }
    // SAFETY: dladdr's file name is a NUL-terminated string it owns.
    let file = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let file = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(file.to_bytes()));
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let plugin = dir.join(DEFAULT_PLUGIN);
    if !plugin.is_file() {
        return Err(format!(
            "MEMPLUG_TORCH_PLUGIN is unset and {} does not exist; set it to the plugin's path",
            plugin.display()
        ));
    }
    Ok(plugin)
}
