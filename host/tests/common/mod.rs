//! Helpers shared by the `binding_*` integration tests: an isolated copy of
//! the reference CPU plugin per test, a manager + pool + binding rig, the
//! governor's ledger as a comparable value, runtime fences whose completion
//! a test controls, and a deadlock guard.

#![allow(dead_code)]

pub mod faulty;
pub mod lossy;

use memplug_host::governor::{AllocationClass, Pool, PoolSnapshot};
use memplug_host::{
    BindingSpec, Context, FnFence, Mechanism, MemoryBinding, ObjectKind, Plugin, ProcessMemoryManager,
    Requirements, SharedFence,
};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

pub const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;

/// The reference CPU plugin, loaded from a private copy of its cdylib.
///
/// A library opened twice by the same path is the same library, and the
/// CPU plugin keeps its state (and its own live-object count, which the
/// unload gate reads) in the library. Tests of one binary run in parallel,
/// so each test that checks plugin-wide counts or unloads loads its own
/// copy: a different file is a different library, with its own state.
pub fn isolated_cpu_plugin(tag: &str) -> Plugin {
    let src = memplug_test_support::find_cdylib("memplug_plugin_cpu", "MEMPLUG_CPU_PLUGIN");
    let dir = memplug_test_support::test_tmp_dir(&format!("cpu-plugin-{tag}"));
    let dst = dir.join(format!("libmemplug_plugin_cpu_{tag}.so"));
    std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("copy {} to {}: {e}", src.display(), dst.display()));
    let plugin = Plugin::load(&dst).unwrap_or_else(|e| panic!("load {}: {e}", dst.display()));
    // The mapping stays; the file is not needed once loaded.
    let _ = std::fs::remove_dir_all(&dir);
    plugin
}

/// A manager with one plugin registered, a pool and a binding on it.
pub struct Rig {
    pub manager: ProcessMemoryManager,
    pub plugin: String,
    pub context: Arc<Context>,
    pub pool: Arc<Pool>,
    pub binding: MemoryBinding,
}

impl Rig {
    /// Registers `plugin`, selects the mechanism with `req` on CPU 0, and
    /// binds it to a fresh pool of `capacity` bytes (class Other, no holder).
    pub fn new(plugin: Plugin, req: Requirements, capacity: u64) -> Rig {
        let manager = ProcessMemoryManager::new();
        let name = plugin.name().to_string();
        manager.register_plugin(plugin).unwrap();
        let context = manager.select(CPU0, req).unwrap();
        let pool = manager.create_pool("pool", capacity).unwrap();
        let binding = manager.bind(&context, &pool, BindingSpec::new(AllocationClass::Other)).unwrap();
        Rig { manager, plugin: name, context, pool, binding }
    }

    /// An isolated CPU plugin with every capability.
    pub fn cpu(tag: &str, capacity: u64) -> Rig {
        let all = Requirements { virtual_backing: true, shared_mapping: true, sync: true };
        Rig::new(isolated_cpu_plugin(tag), all, capacity)
    }

    pub fn mechanism(&self) -> &Mechanism {
        self.context.mechanism()
    }

    /// Drops the rig's own binding and context handles (the unload gate
    /// counts them) and asks the manager to unload the plugin.
    pub fn try_unload(self) -> (ProcessMemoryManager, Result<(), String>) {
        let Rig { manager, plugin, context, binding, .. } = self;
        drop(binding);
        drop(context);
        let r = manager.unload_plugin(&plugin).map_err(|e| e.to_string());
        (manager, r)
    }

    /// Unloads the plugin; panics with the refusal if it is refused.
    pub fn unload(self) -> ProcessMemoryManager {
        let (m, r) = self.try_unload();
        r.unwrap_or_else(|e| panic!("unload refused: {e}"));
        m
    }

    /// The refusal of an unload that must be refused.
    pub fn unload_refused(self) -> (ProcessMemoryManager, String) {
        let (m, r) = self.try_unload();
        let e = r.expect_err("the unload must be refused");
        (m, e)
    }
}

/// Host-side live counts of a mechanism, by kind (see `ObjectKind::ALL`).
pub fn live(m: &Mechanism) -> [u64; 5] {
    ObjectKind::ALL.map(|k| m.live(k))
}

/// The balance of a pool: every figure that must come back exactly after a
/// rolled-back transaction (cumulative counters such as `grants` or
/// `failures` are left out on purpose: they record history, not state).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ledger {
    pub used: u64,
    pub reserved: u64,
    pub leased: u64,
    pub quarantined: u64,
    /// Per class: (reserved, leased, quarantined, live leases).
    pub classes: [(u64, u64, u64, u64); AllocationClass::COUNT],
}

impl Ledger {
    pub fn of(pool: &Pool) -> Ledger {
        Ledger::from_snapshot(&pool.snapshot())
    }

    pub fn from_snapshot(s: &PoolSnapshot) -> Ledger {
        Ledger {
            used: s.used,
            reserved: s.reserved,
            leased: s.leased,
            quarantined: s.quarantined,
            classes: s.classes.map(|c| (c.reserved, c.leased, c.quarantined, c.leases)),
        }
    }

    /// A pool with nothing charged at all.
    pub fn is_zero(&self) -> bool {
        self.used == 0
            && self.reserved == 0
            && self.leased == 0
            && self.quarantined == 0
            && self.classes.iter().all(|c| *c == (0, 0, 0, 0))
    }
}

/// A runtime fence a test completes by hand.
#[derive(Clone)]
pub struct Gate {
    done: Arc<AtomicBool>,
    pub fence: SharedFence,
}

impl Gate {
    pub fn new(name: &str) -> Gate {
        let done = Arc::new(AtomicBool::new(false));
        let (q, w) = (done.clone(), done.clone());
        let fence = FnFence::new(
            name,
            move || q.load(Ordering::Acquire),
            move |t| {
                let end = Instant::now() + t;
                while !w.load(Ordering::Acquire) {
                    if Instant::now() >= end {
                        return false;
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                true
            },
        );
        Gate { done, fence }
    }

    /// An already completed fence.
    pub fn completed(name: &str) -> SharedFence {
        let g = Gate::new(name);
        g.open();
        g.fence
    }

    pub fn is_open(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    pub fn open(&self) {
        self.done.store(true, Ordering::Release);
    }
}

/// Polls `cond` until it holds or `timeout` passes; returns whether it held.
pub fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `f` on another thread and fails the test if it does not finish in
/// `secs` seconds (a deadlock shows up as this failure, not a hung run).
pub fn within<R: Send + 'static>(secs: u64, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("did not finish within {secs} s: deadlock?"),
    }
}

/// A stream of a mechanism's sync capability, destroyed (after its work
/// has run) on drop.
pub struct CpuStream {
    mechanism: Mechanism,
    stream: Option<memplug_host::Stream>,
}

impl CpuStream {
    pub fn new(m: &Mechanism) -> CpuStream {
        let stream = m.sync().expect("sync capability").stream_create().unwrap();
        CpuStream { mechanism: m.clone(), stream: Some(stream) }
    }

    /// The stream's token.
    pub fn stream(&self) -> &memplug_host::Stream {
        self.stream.as_ref().expect("present until drop")
    }

    /// Puts `f` on the stream, after the work submitted before it.
    pub fn run(&self, f: impl FnOnce() + Send + 'static) {
        self.mechanism.sync().unwrap().enqueue(self.stream(), f).unwrap();
    }

    /// A fence after the work submitted so far.
    pub fn fence(&self) -> SharedFence {
        memplug_host::PluginFence::record(&self.mechanism, self.stream()).unwrap()
    }
}

impl Drop for CpuStream {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            // A lost context is not called: its streams went with it.
            if let Err(e) = self.mechanism.sync().unwrap().stream_destroy(s) {
                assert_eq!(e.error.status, memplug_host::Status::DeviceLost, "{e}");
            }
        }
    }
}
