//! A plugin slot that calls back into the host C API on the thread the host
//! called it from is refused with `MEMPLUG_HOST_STATUS_REENTRANT`: it can
//! neither destroy the manager under the outer call (which then returned a
//! live-looking handle to a destroyed manager) nor use any other function.
//! The plugin is linked in and registered with
//! `memplug_host_manager_register_entry`, the C API's in-process entry.

use memplug_host_capi::*;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU};
use memplug_sdk::{Allocator, Block, ExportedPlugin, MechanismBuilder, ObjectRef, PluginBuilder};
use memplug_sdk::{PluginResult, Properties, Request};
use std::ptr::null;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

const CPU0: MemplugDevice = MemplugDevice { kind: MEMPLUG_DEVICE_CPU, ordinal: 0 };

/// The manager the plugin tries to destroy, and what each re-entry got.
static MANAGER: AtomicU64 = AtomicU64::new(0);
static DESTROY_STATUS: AtomicU32 = AtomicU32::new(u32::MAX);
static FREE_STATUS: AtomicU32 = AtomicU32::new(u32::MAX);
static BLOCKS: Mutex<Vec<(u64, Vec<u8>)>> = Mutex::new(Vec::new());

struct Reentrant;

impl Allocator for Reentrant {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
    }
    fn allocate(&self, r: &Request) -> PluginResult<Block> {
        let m = MemplugHostManager { id: MANAGER.load(Ordering::SeqCst) };
        DESTROY_STATUS.store(memplug_host_manager_destroy(m) as u32, Ordering::SeqCst);
        let a = MemplugHostAllocation { id: 0x1234_5678 };
        FREE_STATUS.store(memplug_host_allocation_free(a) as u32, Ordering::SeqCst);
        let mut mem = vec![0u8; (r.size + r.alignment) as usize];
        let base = mem.as_mut_ptr() as u64;
        let addr = base.next_multiple_of(r.alignment.max(16));
        BLOCKS.lock().unwrap().push((addr, mem));
        Ok(Block { addr, size: r.size, handle: addr })
    }
    fn deallocate(&self, o: &ObjectRef) -> PluginResult<()> {
        BLOCKS.lock().unwrap().retain(|(a, _)| *a != o.handle);
        Ok(())
    }
}

fn plugin() -> ExportedPlugin {
    PluginBuilder::new("reentrant", "1")
        .mechanism(MechanismBuilder::new("reenters", 1, CPU0, Reentrant).build())
        .live_objects(|| BLOCKS.lock().unwrap().len() as u64)
        .build()
}
memplug_sdk::declare_entry!(entry, plugin);

fn ok(s: MemplugHostStatus) {
    assert_eq!(s, MemplugHostStatus::Ok);
}

#[test]
fn a_slot_calling_back_into_the_c_api_is_refused_and_the_outer_call_stays_sound() {
    unsafe {
        let mut m = MemplugHostManager::default();
        ok(memplug_host_manager_create(&mut m));
        MANAGER.store(m.id, Ordering::SeqCst);
        ok(memplug_host_manager_register_entry(m, Some(entry), c"in-process reentrant".as_ptr()));
        let mut mech = MemplugHostMechanism::default();
        ok(memplug_host_manager_select(m, CPU0, 0, &mut mech));
        let mut pool = MemplugHostPool::default();
        ok(memplug_host_pool_create(m, c"cpu0".as_ptr(), 1 << 20, &mut pool));
        let mut binding = MemplugHostBinding::default();
        ok(memplug_host_binding_create(m, mech, pool, null(), &mut binding));

        let mut a = MemplugHostAllocation::default();
        ok(memplug_host_allocate(binding, 4096, 64, &mut a, std::ptr::null_mut()));
        assert_eq!(DESTROY_STATUS.load(Ordering::SeqCst), MemplugHostStatus::Reentrant as u32);
        assert_eq!(FREE_STATUS.load(Ordering::SeqCst), MemplugHostStatus::Reentrant as u32);

        // The manager and the allocation are alive and usable.
        ok(memplug_host_allocation_free(a));
        ok(memplug_host_binding_destroy(binding));
        ok(memplug_host_mechanism_release(mech));
        ok(memplug_host_manager_destroy(m));
        assert!(BLOCKS.lock().unwrap().is_empty());
    }
}

#[test]
fn a_null_entry_is_refused() {
    unsafe {
        let mut m = MemplugHostManager::default();
        ok(memplug_host_manager_create(&mut m));
        assert_eq!(
            memplug_host_manager_register_entry(m, None, c"none".as_ptr()),
            MemplugHostStatus::NullArgument
        );
        ok(memplug_host_manager_destroy(m));
    }
}
