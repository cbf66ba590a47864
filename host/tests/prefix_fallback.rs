//! `Region::map_prefix` on a mechanism that refuses read-only views with
//! `UNSUPPORTED` (as `cuMemSetAccess` may with `PROT_READ`): the prefix is
//! mapped read-write instead, the region says so, and the prefix is still
//! charged once.

mod common;

use common::*;
use memplug_host::{Access as HostAccess, LoadOptions, Plugin, Requirements};
use memplug_sdk::*;
use std::sync::{Mutex, MutexGuard, PoisonError};

const GRAN: u64 = 64 * KIB;

/// Bookkeeping only: addresses are never dereferenced (the test's prefix
/// initialiser does not touch its view).
struct State {
    next: u64,
    /// Live reservations and physical objects, by handle.
    live: Vec<u64>,
    /// (reservation handle, offset, len, access) of each mapping.
    maps: Vec<(u64, u64, u64, Access)>,
    read_only_refusals: u64,
}

static STATE: Mutex<State> =
    Mutex::new(State { next: 0, live: Vec::new(), maps: Vec::new(), read_only_refusals: 0 });

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn new_object(size: u64, addr_of: impl FnOnce(u64) -> u64) -> Block {
    let mut s = state();
    s.next += 1;
    let h = s.next;
    s.live.push(h);
    Block { addr: addr_of(h), size: size.div_ceil(GRAN) * GRAN, handle: h }
}

fn forget(handle: u64) -> PluginResult<()> {
    let mut s = state();
    let before = s.live.len();
    s.live.retain(|&h| h != handle);
    if s.live.len() == before {
        return Err(PluginError::new(Status::UnknownAllocation, "no such object"));
    }
    s.maps.retain(|m| m.0 != handle);
    Ok(())
}

struct NoReadOnly;

impl Allocator for NoReadOnly {
    fn properties(&self) -> Properties {
        Properties { min_alignment: 8, max_alignment: 4096, granularity: GRAN }
    }
    fn allocate(&self, _: &Request) -> PluginResult<Block> {
        Err(PluginError::unsupported("no allocator"))
    }
    fn deallocate(&self, _: &ObjectRef) -> PluginResult<()> {
        Err(PluginError::unsupported("no allocator"))
    }
}

impl VirtualBacking for NoReadOnly {
    fn reserve(&self, r: &Request) -> PluginResult<Block> {
        Ok(new_object(r.size, |h| h << 40))
    }
    fn commit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn decommit(&self, _: &ObjectRef, _: u64, _: u64) -> PluginResult<()> {
        Ok(())
    }
    fn committed_bytes(&self, _: &ObjectRef) -> PluginResult<u64> {
        Ok(0)
    }
    fn release(&self, r: &ObjectRef) -> PluginResult<()> {
        forget(r.handle)
    }
}

impl SharedMapping for NoReadOnly {
    fn create(&self, r: &Request) -> PluginResult<Block> {
        Ok(new_object(r.size, |_| 0))
    }
    fn map(
        &self,
        _: &ObjectRef,
        _: u64,
        res: &ObjectRef,
        offset: u64,
        len: u64,
        access: Access,
    ) -> PluginResult<()> {
        let mut s = state();
        if access == Access::ReadOnly {
            s.read_only_refusals += 1;
            return Err(PluginError::unsupported("read-only views are not supported by this device"));
        }
        s.maps.push((res.handle, offset, len, access));
        Ok(())
    }
    fn unmap(&self, res: &ObjectRef, offset: u64, len: u64) -> PluginResult<()> {
        let mut s = state();
        let before = s.maps.len();
        s.maps.retain(|m| (m.0, m.1, m.2) != (res.handle, offset, len));
        if s.maps.len() == before {
            return Err(PluginError::new(Status::InvalidState, "no such mapping"));
        }
        Ok(())
    }
    fn retain(&self, _: &ObjectRef) -> PluginResult<()> {
        Err(PluginError::unsupported("no retain"))
    }
    fn release(&self, o: &ObjectRef) -> PluginResult<()> {
        forget(o.handle)
    }
}

fn no_read_only_plugin() -> ExportedPlugin {
    PluginBuilder::new("no-read-only", "0.0.1")
        .mechanism(
            MechanismBuilder::new("noro", 1, CPU0, NoReadOnly).virtual_backing().shared_mapping().build(),
        )
        .live_objects(|| state().live.len() as u64)
        .build()
}
declare_entry!(no_read_only_entry, no_read_only_plugin);

#[test]
fn a_refused_read_only_prefix_is_mapped_read_write_and_the_region_says_so() {
    within(60, || {
        let p = unsafe { Plugin::from_entry(no_read_only_entry, "no-read-only", &LoadOptions::default()) }
            .unwrap();
        let req = Requirements { virtual_backing: true, shared_mapping: true, sync: false };
        let rig = Rig::new(p, req, 64 * MIB);
        let prefix = rig.binding.create_shared(3 * GRAN, |_| {}).unwrap();
        let plen = prefix.len();
        assert_eq!(plen, 3 * GRAN);
        assert_eq!(rig.pool.snapshot().used, plen, "the prefix is charged at creation");

        let mut regions = Vec::new();
        for i in 0..3u64 {
            let mut r = rig.binding.reserve_virtual(plen + 4 * GRAN).unwrap();
            assert_eq!(r.prefix_access(), None, "no prefix yet");
            assert!(!r.prefix_is_read_only());
            r.map_prefix(&prefix).unwrap();
            assert_eq!(r.prefix_access(), Some(HostAccess::ReadWrite), "the fallback is visible");
            assert!(!r.prefix_is_read_only(), "never claimed read-only");
            assert!(format!("{r:?}").contains("read-write"), "{r:?}");
            assert_eq!(r.len(), plen);
            assert_eq!(state().read_only_refusals, i + 1, "read-only was asked for first");
            let maps = state().maps.clone();
            let prefix_maps: Vec<_> = maps.iter().filter(|m| m.1 == 0 && m.2 == plen).collect();
            assert_eq!(prefix_maps.len() as u64, i + 1, "{maps:?}");
            assert!(prefix_maps.iter().all(|m| m.3 == Access::ReadWrite));
            assert_eq!(
                rig.pool.snapshot().used,
                plen,
                "mapping charges nothing: one prefix, however many regions"
            );
            regions.push(r);
        }
        // The private part grows after the prefix and is charged as usual.
        regions[0].grow_to(plen + GRAN, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!(regions[0].len(), plen + GRAN);
        assert_eq!(rig.pool.snapshot().used, plen + GRAN);

        drop(regions);
        assert_eq!(rig.pool.snapshot().used, plen, "the prefix stays while it is held");
        drop(prefix);
        assert_eq!(rig.pool.snapshot().used, 0);
        assert!(state().maps.is_empty(), "every view unmapped");
        assert!(state().live.is_empty(), "every object released");
        rig.unload();
    });
}
