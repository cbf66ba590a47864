//! Shared prefixes and growing regions on the CPU plugin: one physical
//! prefix mapped read-only into many regions is charged once (accounting
//! follows the bytes actually mapped, invariant 2), every region sees the
//! bytes its initialiser wrote, regions grow at a stable address with their
//! earlier bytes intact, and everything comes back to zero — in the pool and
//! in the plugin — once the regions and the prefix are gone.

mod common;

use common::*;
use memplug_host::{BindingError, ObjectKind, Region};
use std::sync::Arc;

const REGIONS: usize = 8;

fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

/// The byte region `i` writes into the private bytes of its grow `step`.
fn mark(i: usize, step: u64) -> u8 {
    (i as u64 * 37 + step) as u8
}

fn bytes(addr: u64, len: u64) -> &'static [u8] {
    // SAFETY: callers pass committed or mapped CPU memory of a live region.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }
}

fn plugin_reported(rig: &Rig) -> u64 {
    rig.manager
        .registry()
        .live_reports()
        .into_iter()
        .find(|(n, _)| *n == rig.plugin)
        .expect("registered")
        .1
        .plugin_reported
}

#[test]
fn invariant_2_one_prefix_in_eight_regions_is_charged_once_and_read_by_all() {
    within(60, || {
        let rig = Rig::cpu("shared-prefix", 64 * MIB);
        let m = rig.mechanism().clone();
        let g = m.properties().granularity;
        let want = 100 * KIB + 1;
        let prefix = rig
            .binding
            .create_shared(want, |v| {
                assert!(v.len >= want);
                // SAFETY: the temporary writable mapping of the new object.
                let s = unsafe { v.as_mut_slice() };
                for (i, b) in s.iter_mut().enumerate() {
                    *b = pattern(i as u64);
                }
            })
            .unwrap();
        let plen = prefix.len();
        assert_eq!(plen, want.div_ceil(g) * g);
        assert_eq!(prefix.charged(), plen);
        assert_eq!(rig.pool.used(), plen);

        let mut regions: Vec<Region> = Vec::new();
        for _ in 0..REGIONS {
            let mut r = rig.binding.reserve_virtual(4 * MIB).unwrap();
            r.map_prefix(&prefix).unwrap();
            assert_eq!((r.len(), r.committed()), (plen, 0));
            regions.push(r);
        }
        assert_eq!(rig.pool.used(), plen, "mapping a prefix charges nothing");
        assert_eq!(m.live(ObjectKind::PhysicalObject), 1);

        // Each region grows its private part, in steps, at a fixed address.
        for (i, r) in regions.iter_mut().enumerate() {
            let addr = r.addr();
            for step in 1..=(4 * (i as u64 + 1)) {
                let old = r.len();
                r.grow_to(plen + step * 8 * KIB, |v| {
                    assert_eq!(v.addr, addr);
                    Ok::<(), ()>(())
                })
                .unwrap();
                assert_eq!(r.addr(), addr, "a region never moves");
                // SAFETY: the newly committed private bytes of this region.
                unsafe {
                    std::ptr::write_bytes((addr + old) as *mut u8, mark(i, step), (r.len() - old) as usize)
                };
            }
        }
        let private: u64 = regions.iter().map(Region::committed).sum();
        assert_eq!(rig.pool.used(), plen + private, "prefix once + private commits");
        assert_eq!(Ledger::of(&rig.pool).leased, plen + private);

        for (i, r) in regions.iter().enumerate() {
            let all = bytes(r.addr(), r.len());
            let (head, tail) = all.split_at(plen as usize);
            assert!(
                head.iter().enumerate().all(|(j, b)| *b == pattern(j as u64)),
                "region {i} does not see the prefix"
            );
            for (k, chunk) in tail.chunks(8 * KIB as usize).enumerate() {
                let m = mark(i, k as u64 + 1);
                assert!(chunk.iter().all(|b| *b == m), "region {i} lost its step {k}");
            }
        }

        // The regions keep the prefix alive after the caller's handle goes.
        drop(prefix);
        assert_eq!(rig.pool.used(), plen + private);
        assert!(bytes(regions[7].addr(), plen).iter().enumerate().all(|(j, b)| *b == pattern(j as u64)));
        // Each region gives back its private part; the prefix goes with the last.
        while let Some(r) = regions.pop() {
            let before = rig.pool.used();
            let c = r.committed();
            drop(r);
            let expect = if regions.is_empty() { 0 } else { before - c };
            assert_eq!(rig.pool.used(), expect);
        }
        assert!(Ledger::of(&rig.pool).is_zero(), "{:?}", Ledger::of(&rig.pool));
        assert_eq!(live(&m), [0; 5]);
        assert_eq!(plugin_reported(&rig), 0, "the plugin holds nothing");
        drop(m);
        rig.unload();
    });
}

#[test]
fn invariant_2_a_region_grows_and_shrinks_in_place_and_keeps_its_bytes() {
    within(60, || {
        let rig = Rig::cpu("shared-grow", 64 * MIB);
        let mut r = rig.binding.reserve_virtual(8 * MIB).unwrap();
        let addr = r.addr();
        assert_eq!((r.capacity(), r.len(), rig.pool.used()), (8 * MIB, 0, 0));
        for step in 1..=64u64 {
            let old = r.len();
            r.grow_to(step * 64 * KIB, |_| Ok::<(), ()>(())).unwrap();
            assert_eq!(r.addr(), addr);
            // SAFETY: newly committed bytes of this region.
            unsafe { std::ptr::write_bytes((addr + old) as *mut u8, step as u8, (r.len() - old) as usize) };
            assert_eq!(rig.pool.used(), r.committed());
        }
        let check = |len: u64| {
            bytes(addr, len)
                .chunks(64 * KIB as usize)
                .enumerate()
                .all(|(k, c)| c.iter().all(|b| *b == k as u8 + 1))
        };
        assert!(check(r.len()));
        // Growing within the committed length is a no-op; past the
        // reservation is refused and changes nothing.
        r.grow_to(KIB, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!(r.len(), 4 * MIB);
        assert!(matches!(
            r.grow_to(9 * MIB, |_| Ok::<(), ()>(())),
            Err(memplug_host::GrowError::Binding(BindingError::Invalid(_)))
        ));
        assert_eq!((r.len(), rig.pool.used()), (4 * MIB, 4 * MIB));

        // Shrink (no fences: decommitted and refunded at once), then grow.
        r.shrink_to(MIB, Vec::new()).unwrap();
        assert_eq!((r.len(), rig.pool.used()), (MIB, MIB));
        assert!(check(MIB));
        r.grow_to(2 * MIB, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!(r.addr(), addr);
        assert!(check(MIB));
        assert!(bytes(addr + MIB, MIB).iter().all(|b| *b == 0), "decommitted pages come back zeroed");
        drop(r);
        assert!(Ledger::of(&rig.pool).is_zero());
        assert_eq!(live(rig.mechanism()), [0; 5]);
        rig.unload();
    });
}

#[test]
fn map_prefix_refuses_what_would_break_the_region() {
    within(30, || {
        let rig = Rig::cpu("shared-refusals", 64 * MIB);
        let prefix = rig.binding.create_shared(64 * KIB, |_| {}).unwrap();
        // Larger than the region.
        let mut small = rig.binding.reserve_virtual(32 * KIB).unwrap();
        assert!(matches!(small.map_prefix(&prefix), Err(BindingError::Invalid(_))));
        // Into a region that already has private bytes.
        let mut used = rig.binding.reserve_virtual(MIB).unwrap();
        used.grow_to(8 * KIB, |_| Ok::<(), ()>(())).unwrap();
        assert!(matches!(used.map_prefix(&prefix), Err(BindingError::State(_))));
        // Twice.
        let mut r = rig.binding.reserve_virtual(MIB).unwrap();
        r.map_prefix(&prefix).unwrap();
        assert!(matches!(r.map_prefix(&prefix), Err(BindingError::State(_))));
        assert_eq!(Arc::strong_count(&prefix), 2);
        assert_eq!(rig.pool.used(), 64 * KIB + 8 * KIB);
        drop((small, used, r, prefix));
        assert!(Ledger::of(&rig.pool).is_zero());
        assert_eq!(live(rig.mechanism()), [0; 5]);
    });
}
