//! The caching binding on the reference CPU plugin: freed blocks are kept
//! charged and reused by size class; reuse is stream-ordered; idle bytes go
//! back first under pressure and on trim; loss and retirement keep nothing;
//! the pool's ledger is exact at every step.

mod common;

use common::*;
use memplug_host::governor::{AllocationClass, GovernorError, Priority};
use memplug_host::{
    BindingError, BindingSpec, CacheConfig, CacheStats, CachedAllocation, CachingBinding, IdlePolicy,
    ManagerError, ObjectKind, StreamKey,
};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn cache(r: &Rig, config: CacheConfig) -> CachingBinding {
    r.manager
        .bind_caching(&r.context, &r.pool, BindingSpec::new(AllocationClass::Activations), config)
        .unwrap()
}

/// A cache without an idle cap: these tests fill small pools with idle
/// blocks to see pressure and reuse (the idle policy: `cache_policy.rs`).
fn plain(r: &Rig) -> CachingBinding {
    let idle = IdlePolicy { max_idle_bytes: Some(u64::MAX), ..IdlePolicy::default() };
    cache(r, CacheConfig { idle, ..CacheConfig::default() })
}

fn allocations(r: &Rig) -> u64 {
    r.mechanism().live(ObjectKind::Allocation)
}

#[test]
fn a_freed_block_serves_the_next_request_of_its_class_and_stays_charged_as_idle() {
    let r = Rig::cpu("cache-hit", 64 * MIB);
    let c = plain(&r);
    let a = c.allocate(1000, 64).unwrap();
    let (addr, charged) = (a.addr(), a.charged());
    assert_eq!((a.size(), a.block_size()), (1000, 1024), "1000 B rounds to the 1024 B class");
    assert_eq!(addr % 64, 0, "aligned as asked");
    drop(a);
    // Still charged, as the cache's idle bytes, under the cache's holder.
    assert_eq!(r.pool.used(), charged);
    assert_eq!(r.pool.holder_stats(c.holder().id()).unwrap().totals().leased, charged);
    let s = c.stats();
    assert_eq!((s.idle_bytes, s.idle_blocks, s.in_use_blocks, s.misses, s.hits), (charged, 1, 0, 1, 0));
    // Any size of the class is served by that block, without the plugin.
    let before = allocations(&r);
    let b = c.allocate(1024, 8).unwrap();
    assert_eq!(b.addr(), addr);
    assert_eq!(allocations(&r), before);
    let s = c.stats();
    assert_eq!((s.hits, s.idle_blocks, s.in_use_blocks, s.in_use_bytes), (1, 0, 1, charged));
    // A larger class is another block.
    let d = c.allocate(1100, 8).unwrap();
    assert_ne!(d.addr(), addr);
    assert_eq!(d.block_size(), 1280);
    assert_eq!(r.pool.used(), charged + d.charged());
    drop((b, d));
    assert_eq!(c.trim(u64::MAX), charged + 1280);
    assert_eq!(r.pool.used(), 0);
    assert_eq!(allocations(&r), 0);
    assert_eq!(c.stats().trimmed_bytes, charged + 1280);
}

#[test]
fn a_block_freed_on_a_stream_is_reused_at_once_on_that_stream_and_elsewhere_only_after_its_fence() {
    let r = Rig::cpu("cache-streams", 64 * MIB);
    let c = plain(&r);
    let (s1, s2) = (StreamKey::runtime(1), StreamKey::runtime(2));
    let a = c.allocate_on(4096, 256, s1).unwrap();
    let addr = a.addr();
    let gate = Gate::new("kernel on s1");
    a.free_on(s1, gate.fence.clone());
    assert_eq!(c.stats().pending_blocks, 1);
    // Another stream and the host get a new block while s1's work may run.
    let other = c.allocate_on(4096, 256, s2).unwrap();
    let host = c.allocate(4096, 256).unwrap();
    assert_ne!(other.addr(), addr);
    assert_ne!(host.addr(), addr);
    drop((other, host));
    // The same stream takes it at once: its new work runs after the old.
    let again = c.allocate_on(4096, 256, s1).unwrap();
    assert_eq!(again.addr(), addr);
    // Freed behind the gate again; once it opens, anyone may take it.
    again.free_on(s1, gate.fence.clone());
    let ready = c.allocate(4096, 256).unwrap();
    assert_ne!(ready.addr(), addr, "the host must not reuse a block whose fence is pending");
    gate.open();
    let mut seen = HashSet::new();
    let taken: Vec<CachedAllocation> = (0..3).map(|_| c.allocate_on(4096, 256, s2).unwrap()).collect();
    for t in &taken {
        seen.insert(t.addr());
    }
    assert!(seen.contains(&addr), "after its fence the block serves another stream");
    assert_eq!(c.stats().pending_blocks, 0);
    drop((ready, taken));
    let idle = c.stats().idle_bytes;
    assert_eq!(idle, r.pool.used());
    assert_eq!(c.trim(u64::MAX), idle);
    assert_eq!(r.pool.used(), 0);
}

#[test]
fn used_by_keeps_a_block_from_everyone_until_its_fence_and_a_trim_frees_it_only_after() {
    let r = Rig::cpu("cache-used-by", 64 * MIB);
    let c = plain(&r);
    let mut a = c.allocate(2048, 64).unwrap();
    let addr = a.addr();
    let gate = Gate::new("device read");
    a.used_by(gate.fence.clone());
    drop(a);
    let s = c.stats();
    assert_eq!((s.idle_blocks, s.pending_blocks), (1, 1));
    let b = c.allocate_on(2048, 64, StreamKey::runtime(7)).unwrap();
    assert_ne!(b.addr(), addr, "a fence of no known stream is waited for by every stream");
    drop(b);
    // Trimmed while pending: handed to the deferred-free queue, still
    // charged and alive until the fence completes.
    let charged = 2 * 2048;
    assert_eq!(c.trim(u64::MAX), charged);
    assert_eq!(r.pool.used(), 2048, "the pending block is freed only after its fence");
    assert_eq!(allocations(&r), 1);
    gate.open();
    r.manager.poll();
    assert_eq!(r.pool.used(), 0);
    assert_eq!(allocations(&r), 0);
}

#[test]
fn pressure_takes_idle_bytes_from_the_cache_never_a_block_in_use_and_the_answer_is_what_was_given_back() {
    let r = Rig::cpu("cache-pressure", 4 * MIB);
    let c = plain(&r);
    let kept = c.allocate(MIB, 4096).unwrap();
    let idle: Vec<_> = (0..2).map(|_| c.allocate(MIB, 4096).unwrap()).collect();
    drop(idle);
    assert_eq!(r.pool.used(), 3 * MIB);
    // A request on behalf of no holder needs 2 MiB: 1 MiB is free, the
    // cache's idle 2 MiB are asked for.
    let other = r.manager.bind(&r.context, &r.pool, BindingSpec::new(AllocationClass::Weights)).unwrap();
    let big = other.allocate(2 * MIB, 4096).unwrap();
    let h = r.pool.holder_stats(c.holder().id()).unwrap();
    assert_eq!(h.pressure.tickets, 1);
    assert!(h.pressure.bytes_answered >= MIB, "answered {}", h.pressure.bytes_answered);
    assert_eq!(h.pressure.bytes_answered, c.stats().pressure_bytes);
    assert_eq!(r.pool.used(), MIB + 2 * MIB + (2 * MIB - h.pressure.bytes_answered));
    // The block in use is intact and still the cache's.
    // SAFETY: CPU plugin memory, live and ours.
    unsafe { std::ptr::write_bytes(kept.addr() as *mut u8, 0xA5, MIB as usize) };
    assert_eq!(c.stats().in_use_bytes, MIB);
    // With nothing idle, a further ticket gets zero and the request fails.
    let refused = other.allocate(2 * MIB, 4096).unwrap_err();
    assert!(matches!(refused, BindingError::Budget(GovernorError::OutOfBudget(_))), "{refused}");
    drop((big, kept));
    c.trim(u64::MAX);
    assert!(Ledger::of(&r.pool).is_zero());
}

#[test]
fn a_miss_in_a_full_pool_gives_back_the_caches_own_idle_blocks_before_asking_another_holder() {
    let r = Rig::cpu("cache-own-first", 4 * MIB);
    let asked = Arc::new(AtomicU64::new(0));
    let seen = asked.clone();
    let _other = r.pool.register_holder("other", Priority::LOWEST, move |_| {
        seen.fetch_add(1, Ordering::Relaxed);
        0
    });
    let c = plain(&r);
    drop((0..4).map(|_| c.allocate(MIB, 4096).unwrap()).collect::<Vec<_>>());
    assert_eq!((r.pool.used(), c.stats().idle_bytes), (4 * MIB, 4 * MIB));
    // Another class (2 MiB) needs room the cache itself holds idle.
    let a = c.allocate(2 * MIB, 4096).unwrap();
    assert_eq!(asked.load(Ordering::Relaxed), 0, "the other holder must not be asked");
    assert_eq!(c.stats().pressure_bytes, 2 * MIB);
    assert_eq!(r.pool.used(), 4 * MIB);
    drop(a);
    c.trim(u64::MAX);
    assert_eq!(r.pool.used(), 0);
}

#[test]
fn requests_above_max_block_bypass_the_cache_and_bad_configurations_are_refused() {
    let r = Rig::cpu("cache-bypass", 64 * MIB);
    let c = cache(&r, CacheConfig { max_block: 64 * 1024, ..CacheConfig::default() });
    let big = c.allocate(128 * 1024, 4096).unwrap();
    assert!(!big.is_cached());
    drop(big);
    assert_eq!(r.pool.used(), 0, "a bypassed block is freed, not kept");
    assert_eq!(c.stats(), CacheStats { bypasses: 1, ..CacheStats::default() });
    // Alignment that is not a power of two: the binding's own refusal.
    assert!(matches!(c.allocate(64, 3), Err(BindingError::Invalid(_)) | Err(BindingError::Plugin(_))));

    let holder = r.pool.register_holder("mine", Priority::LOWEST, |_| 0);
    let spec = BindingSpec::new(AllocationClass::Other).holder(holder.id());
    let e = r.manager.bind_caching(&r.context, &r.pool, spec, CacheConfig::default()).unwrap_err();
    assert!(matches!(e, ManagerError::CacheHolder { .. }), "{e}");
    let bad = CacheConfig { min_alignment: 48, ..CacheConfig::default() };
    let e = r
        .manager
        .bind_caching(&r.context, &r.pool, BindingSpec::new(AllocationClass::Other), bad)
        .unwrap_err();
    assert!(e.to_string().contains("min_alignment 48"), "{e}");
}

#[test]
fn a_lost_context_keeps_nothing_idle_refuses_new_blocks_and_settles_exactly() {
    let r = Rig::cpu("cache-loss", 64 * MIB);
    let c = plain(&r);
    let in_use = c.allocate(8192, 64).unwrap();
    drop(c.allocate(4096, 64).unwrap());
    assert_eq!(r.pool.used(), 8192 + 4096);
    r.context.declare_lost("the runtime saw an illegal address");
    // The poll delivers the loss (the cache drops its idle block: no plugin
    // call, no refund) and settles the context: both blocks once.
    r.manager.poll();
    assert_eq!(c.stats().idle_blocks, 0, "idle blocks of a lost device are dropped");
    let s = r.context.settlement().expect("terminated by the poll");
    assert_eq!(s.bindings.iter().map(|b| b.bytes).sum::<u64>(), 8192 + 4096);
    assert_eq!(r.pool.used(), 0);
    assert_eq!(r.pool.discharged(), 8192 + 4096);
    let e = c.allocate(4096, 64).unwrap_err();
    assert!(e.to_string().contains("lost") || e.to_string().contains("terminated"), "{e}");
    assert!(in_use.is_lost());
    drop(in_use);
    assert_eq!(c.stats().idle_blocks, 0, "a lost block is not kept");
    assert_eq!((r.pool.used(), r.pool.discharged()), (0, 8192 + 4096), "nothing refunded twice");
}

#[test]
fn dropping_the_cache_frees_every_idle_block_and_unregisters_its_holder() {
    let r = Rig::cpu("cache-drop", 64 * MIB);
    let c = plain(&r);
    let holder = c.holder().id();
    let a = c.allocate(300, 64).unwrap();
    drop(c.allocate(5000, 64).unwrap());
    drop(c);
    // The block still out keeps the cache; it goes back, then everything.
    assert_eq!(allocations(&r), 2);
    drop(a);
    assert_eq!(allocations(&r), 0);
    assert!(Ledger::of(&r.pool).is_zero());
    assert!(!r.pool.holder_stats(holder).is_some_and(|h| h.registered), "the cache's holder is unregistered");
}

#[test]
fn two_threads_allocating_and_freeing_never_share_a_block_and_the_figures_add_up() {
    within(60, || {
        let r = Rig::cpu("cache-threads", 256 * MIB);
        let c = plain(&r);
        let live = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (c, live) = (c.clone(), live.clone());
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let size = 64 + (i * 37 + t * 11) % 8192;
                        let a = c.allocate(size, 64).unwrap();
                        assert!(live.lock().unwrap().insert(a.addr()), "block handed out twice");
                        // SAFETY: our block, at least `size` bytes.
                        unsafe { std::ptr::write_bytes(a.addr() as *mut u8, t as u8, size as usize) };
                        assert!(live.lock().unwrap().remove(&a.addr()));
                        drop(a);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = c.stats();
        assert_eq!(s.hits + s.misses, 4000);
        assert_eq!((s.in_use_blocks, s.in_use_bytes), (0, 0));
        assert_eq!(s.idle_bytes, r.pool.used());
        assert_eq!(s.idle_blocks, allocations(&r));
        c.trim(u64::MAX);
        assert!(Ledger::of(&r.pool).is_zero());
    });
}
