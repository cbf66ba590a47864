//! What the node's multi-process tests share (`node.rs`, `faults.rs`): an
//! authority on a socket, and a member — a manager with the reference CPU
//! plugin, a root pool joined to the node, and an LRU holder that evicts
//! its cached blocks when a ticket comes (or first sleeps, to play a slow
//! or mute member).

// Each test binary uses its own part of this.
#![allow(dead_code)]

use memplug_host::governor::{AllocationClass, HolderRegistration, Pool, PressureTicket, Priority};
use memplug_host::{
    BindingSpec, LoadOptions, MemoryBinding, OwnedAllocation, Plugin, ProcessMemoryManager, Requirements,
};
use memplug_node::{Authority, AuthorityConfig, LinkDevice, LinkOptions, NodeLink};
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const MIB: u64 = 1 << 20;
pub const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// An authority governing `capacity` bytes of "cpu0" in 1 MiB chunks, its
/// members skipped after `ticket_timeout` without an answer.
pub fn authority(path: &Path, capacity: u64, ticket_timeout: Duration) -> Authority {
    let mut c = AuthorityConfig::new(path, vec![("cpu0".into(), capacity)]);
    c.chunk = MIB;
    c.ticket_timeout = ticket_timeout;
    Authority::start(c).unwrap()
}

/// A process's side: a manager with the CPU plugin, a root pool joined to
/// the node, and an LRU holder whose blocks (`cached`) pressure may evict.
pub struct Member {
    pub _mgr: ProcessMemoryManager,
    pub pool: Arc<Pool>,
    pub binding: MemoryBinding,
    pub cached: Arc<Mutex<Vec<OwnedAllocation>>>,
    pub _holder: HolderRegistration,
    pub link: NodeLink,
    /// The class and priority of each ticket its holder was given.
    pub tickets: Arc<Mutex<Vec<(AllocationClass, Priority)>>>,
}

/// How a member is made.
pub struct Spec {
    /// The priority it declares to the node.
    pub priority: u32,
    /// Its holder's priority (and so its requests').
    pub holder_priority: Priority,
    /// How long its holder sleeps on a ticket before it evicts (a slow or
    /// mute member).
    pub holder_delay: Option<Duration>,
    /// How long its binding's requests wait.
    pub wait: Duration,
    /// Its binding's class.
    pub class: AllocationClass,
    /// The classes it declares to the node (0: any).
    pub classes: u8,
}

pub fn member(path: &Path, spec: Spec) -> Member {
    let mgr = ProcessMemoryManager::new();
    // SAFETY: the reference CPU plugin's entry, built against this ABI.
    let cpu =
        unsafe { Plugin::from_entry(memplug_plugin_cpu::cpu_plugin_entry, "cpu", &LoadOptions::default()) }
            .unwrap();
    mgr.register_plugin(cpu).unwrap();
    let ctx = mgr.select(CPU0, Requirements::ALLOCATOR_ONLY).unwrap();
    let pool = mgr.create_pool("cpu0", 0).unwrap();
    let cached: Arc<Mutex<Vec<OwnedAllocation>>> = Arc::default();
    let c = cached.clone();
    let tickets: Arc<Mutex<Vec<(AllocationClass, Priority)>>> = Arc::default();
    let seen = tickets.clone();
    let delay = spec.holder_delay;
    let holder = pool.register_holder("lru", spec.holder_priority, move |t: &PressureTicket| {
        seen.lock().unwrap().push((t.class, t.priority));
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        let mut freed = 0;
        let mut v = c.lock().unwrap();
        while freed < t.bytes_wanted && !v.is_empty() {
            freed += v.remove(0).charged();
        }
        freed
    });
    let binding_spec = BindingSpec::new(spec.class).holder(holder.id()).wait(spec.wait);
    let binding = mgr.bind(&ctx, &pool, binding_spec).unwrap();
    let device = LinkDevice {
        device: "cpu0".into(),
        pool: pool.clone(),
        priority: spec.priority,
        classes: spec.classes,
    };
    let link = NodeLink::join(path, vec![device], LinkOptions::default()).unwrap();
    Member { _mgr: mgr, pool, binding, cached, _holder: holder, link, tickets }
}
