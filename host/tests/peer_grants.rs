//! Peer access survives what takes a range away and gives it back (issue
//! 30 item 5): a driver's access setting belongs to a mapping (CUDA's
//! `cuMemSetAccess` is gone after an unmap or a decommit), so the region
//! remembers what `set_peer_access` granted and gives it back on every
//! recommit: a grow after a shrink, and a restore after an offload.
//! A bookkeeping plugin records every call; its memory is never touched.

mod common;

use memplug_host::governor::AllocationClass;
use memplug_host::{Access, BindingSpec, LoadOptions, Plugin, ProcessMemoryManager, Requirements};
use memplug_sdk::abi::*;
use memplug_sdk::*;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

const CPU5: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 5 };
const PEER: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 0 };
const OTHER: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: 1 };
const G: u64 = 4096;

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn note(s: String) {
    LOG.lock().unwrap().push(s);
}

/// Calls logged since the last `take()`.
fn take() -> Vec<String> {
    std::mem::take(&mut *LOG.lock().unwrap())
}

#[derive(Default)]
struct Ledger {
    next: AtomicU64,
}

impl Ledger {
    fn id(&self) -> u64 {
        self.next.fetch_add(1, SeqCst) + 1
    }
}

impl Allocator for Ledger {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: G }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        let h = self.id();
        Ok(Block { addr: h << 32, size: r.size, handle: h })
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

impl VirtualBacking for Ledger {
    fn reserve(&self, r: &Request) -> PluginResult<Block> {
        let h = self.id();
        Ok(Block { addr: h << 32, size: r.size.div_ceil(G) * G, handle: h })
    }
    fn commit(&self, _: &ObjectRef, off: u64, len: u64) -> PluginResult<()> {
        note(format!("commit +{off:#x} {len:#x}"));
        Ok(())
    }
    fn decommit(&self, _: &ObjectRef, off: u64, len: u64) -> PluginResult<()> {
        note(format!("decommit +{off:#x} {len:#x}"));
        Ok(())
    }
    fn committed_bytes(&self, _: &ObjectRef) -> PluginResult<u64> {
        Ok(0)
    }
    fn release(&self, _: &ObjectRef) -> PluginResult<()> {
        Ok(())
    }
}

impl PeerAccess for Ledger {
    fn can_access_peer(&self, _: MemplugDevice) -> PluginResult<u32> {
        Ok(MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE)
    }
    fn set_peer_access(
        &self,
        _: &ObjectRef,
        off: u64,
        len: u64,
        peer: MemplugDevice,
        a: u32,
    ) -> PluginResult<()> {
        note(format!("peer {}:{} gets {a:#x} on +{off:#x} {len:#x}", peer.kind, peer.ordinal));
        Ok(())
    }
}

fn ledger_plugin() -> ExportedPlugin {
    let b = MechanismBuilder::new("ledger", 5, CPU5, Ledger::default()).virtual_backing().peer_access();
    PluginBuilder::new("ledger", "1").mechanism(b.build()).live_objects(|| 0).build()
}
memplug_sdk::declare_entry!(ledger_entry, ledger_plugin);

#[test]
fn a_grant_comes_back_on_every_recommit_and_a_revoke_stays_revoked() {
    let p = unsafe { Plugin::from_entry(ledger_entry, "ledger", &LoadOptions::default()) }.unwrap();
    let manager = ProcessMemoryManager::new();
    manager.register_plugin(p).unwrap();
    let req = Requirements { virtual_backing: true, ..Requirements::ALLOCATOR_ONLY };
    let ctx = manager.select(CPU5, req).unwrap();
    let pool = manager.create_pool("p", 1 << 30).unwrap();
    let binding = manager.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Kv)).unwrap();
    let mut r = binding.reserve_virtual(16 * G).unwrap();
    r.grow_to(4 * G, |_| Ok::<(), ()>(())).unwrap();
    r.set_peer_access(0, 4 * G, PEER, Some(Access::ReadWrite)).unwrap();
    r.set_peer_access(G, G, OTHER, Some(Access::ReadOnly)).unwrap();
    take();

    // Shrink to one granule: the tail's decommit runs (no fences); the
    // grow that follows commits it again and gives both peers back what
    // they had there.
    r.shrink_to(G, Vec::new()).unwrap();
    manager.poll();
    assert_eq!(take(), ["decommit +0x1000 0x3000"]);
    r.grow_to(4 * G, |_| Ok::<(), ()>(())).unwrap();
    assert_eq!(
        take(),
        [
            "commit +0x1000 0x3000",
            "peer 2:0 gets 0x3 on +0x1000 0x3000",
            "peer 2:1 gets 0x1 on +0x1000 0x1000"
        ]
    );

    // A revoke is remembered too: a range revoked for PEER stays without
    // access after the next recommit; the rest keeps it.
    r.set_peer_access(2 * G, G, PEER, None).unwrap();
    r.shrink_to(G, Vec::new()).unwrap();
    manager.poll();
    take();
    r.grow_to(4 * G, |_| Ok::<(), ()>(())).unwrap();
    assert_eq!(
        take(),
        [
            "commit +0x1000 0x3000",
            "peer 2:0 gets 0x3 on +0x1000 0x1000",
            "peer 2:0 gets 0x3 on +0x3000 0x1000",
            "peer 2:1 gets 0x1 on +0x1000 0x1000",
        ]
    );
    drop(r);
    manager.drain(Duration::from_secs(5));
    assert_eq!(pool.used(), 0);
}
