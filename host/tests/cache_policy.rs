//! The cache's idle policy on the reference CPU plugin: a cap on idle
//! bytes (a quarter of the pool's capacity unless set), an age, and a usage
//! threshold; what each gives back, when, and that the pool's ledger stays
//! exact.

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, CacheConfig, CachingBinding, IdlePolicy, ManagerError, ObjectKind};
use std::time::Duration;

fn cache(r: &Rig, idle: IdlePolicy) -> CachingBinding {
    r.manager
        .bind_caching(
            &r.context,
            &r.pool,
            BindingSpec::new(AllocationClass::Activations),
            CacheConfig { idle, ..CacheConfig::default() },
        )
        .unwrap()
}

fn cap(bytes: u64) -> IdlePolicy {
    IdlePolicy { max_idle_bytes: Some(bytes), ..IdlePolicy::default() }
}

fn allocations(r: &Rig) -> u64 {
    r.mechanism().live(ObjectKind::Allocation)
}

#[test]
fn frees_past_the_cap_give_idle_blocks_back_and_the_pool_keeps_only_the_cap() {
    let r = Rig::cpu("idle-cap", 64 * MIB);
    let c = cache(&r, cap(3 * KIB));
    let blocks: Vec<_> = (0..6).map(|_| c.allocate(KIB, 64).unwrap()).collect();
    let each = blocks[0].charged();
    assert_eq!(each, KIB);
    drop(blocks);
    let s = c.stats();
    assert_eq!(s.idle_bytes, 3 * KIB, "{s:?}");
    assert_eq!((s.idle_blocks, s.trimmed_bytes), (3, 3 * KIB));
    assert_eq!(r.pool.used(), 3 * KIB);
    assert_eq!(allocations(&r), 3);
    // What is kept still serves requests.
    let again = c.allocate(KIB, 64).unwrap();
    assert_eq!(c.stats().hits, 1);
    drop(again);
    c.trim(u64::MAX);
    assert_eq!(r.pool.used(), 0);
}

#[test]
fn the_default_cap_is_a_quarter_of_the_pool_and_a_cap_of_zero_keeps_nothing() {
    let r = Rig::cpu("idle-default", 64 * MIB);
    let c = cache(&r, IdlePolicy::default());
    assert_eq!(c.max_idle_bytes(), 16 * MIB);
    drop((0..24).map(|_| c.allocate(MIB, 64).unwrap()).collect::<Vec<_>>());
    assert_eq!(c.stats().idle_bytes, 16 * MIB);
    assert_eq!(r.pool.used(), 16 * MIB);
    drop(c);
    assert_eq!(r.pool.used(), 0);

    let none = cache(&r, cap(0));
    drop(none.allocate(KIB, 64).unwrap());
    assert_eq!((none.stats().idle_bytes, r.pool.used(), allocations(&r)), (0, 0, 0));
    let unbounded = cache(&r, cap(u64::MAX));
    assert_eq!(unbounded.max_idle_bytes(), u64::MAX);
}

#[test]
fn a_block_past_the_cap_with_nothing_idle_goes_straight_back_counted_as_the_cap_giving_it_back() {
    let r = Rig::cpu("idle-pass", 64 * MIB);
    let c = cache(&r, cap(2 * KIB));
    // Nothing idle: the block goes back without being kept (the fast path).
    drop(c.allocate(4 * KIB, 64).unwrap());
    let s = c.stats();
    assert_eq!((s.misses, s.idle_bytes, s.idle_blocks), (1, 0, 0), "{s:?}");
    assert_eq!((s.in_use_bytes, s.in_use_blocks, s.trimmed_bytes), (0, 0, 4 * KIB), "{s:?}");
    assert_eq!((r.pool.used(), allocations(&r)), (0, 0));
    // A block idle already: kept first, then the cap gives the largest
    // back; the figures of that block are the same.
    let small = c.allocate(KIB, 64).unwrap();
    let large = c.allocate(4 * KIB, 64).unwrap();
    drop(small);
    drop(large);
    let s = c.stats();
    assert_eq!((s.misses, s.idle_bytes, s.idle_blocks), (3, KIB, 1), "{s:?}");
    assert_eq!((s.in_use_bytes, s.in_use_blocks, s.trimmed_bytes), (0, 0, 8 * KIB), "{s:?}");
    assert_eq!((r.pool.used(), allocations(&r)), (KIB, 1));
}

#[test]
fn the_cap_holds_over_blocks_freed_on_several_threads() {
    let r = Rig::cpu("idle-threads", 64 * MIB);
    let c = cache(&r, cap(4 * KIB));
    let all_made = std::sync::Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (c, all_made) = (c.clone(), all_made.clone());
            // Each thread frees into its own shard (threads take stripes
            // in turn); the sum over shards is what the cap bounds.
            std::thread::spawn(move || {
                let mine: Vec<_> = (0..3).map(|_| c.allocate(KIB, 64).unwrap()).collect();
                all_made.wait();
                drop(mine);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = c.stats();
    assert_eq!((s.misses, s.in_use_blocks), (12, 0), "{s:?}");
    assert!(s.idle_bytes <= 4 * KIB, "{s:?}");
    assert_eq!(s.trimmed_bytes, 12 * KIB - s.idle_bytes);
    assert_eq!(r.pool.used(), s.idle_bytes);
}

#[test]
fn a_miss_finds_a_block_another_thread_freed() {
    let r = Rig::cpu("idle-probe", 64 * MIB);
    let c = cache(&r, IdlePolicy::default());
    let c2 = c.clone();
    let addr = std::thread::spawn(move || {
        let a = c2.allocate(4 * KIB, 64).unwrap();
        a.addr()
    })
    .join()
    .unwrap();
    let b = c.allocate(4 * KIB, 64).unwrap();
    assert_eq!(b.addr(), addr, "the other shard's idle block was found");
    assert_eq!((c.stats().hits, c.stats().misses), (1, 1));
}

#[test]
fn blocks_idle_past_the_age_go_back_at_collect_and_at_the_next_miss() {
    let r = Rig::cpu("idle-age", 64 * MIB);
    let age = Duration::from_millis(50);
    let c = cache(&r, IdlePolicy { max_idle_age: Some(age), ..cap(u64::MAX) });
    drop((0..3).map(|_| c.allocate(KIB, 64).unwrap()).collect::<Vec<_>>());
    assert_eq!(c.collect(), 0, "young blocks are kept");
    assert_eq!(r.pool.used(), 3 * KIB);
    std::thread::sleep(age * 3);
    assert_eq!(c.collect(), 3 * KIB);
    assert_eq!((r.pool.used(), allocations(&r)), (0, 0));
    assert_eq!(c.stats().trimmed_bytes, 3 * KIB);

    // At a miss: the first miss after the age gives the old blocks back.
    drop(c.allocate(KIB, 64).unwrap());
    std::thread::sleep(age * 3);
    let other = c.allocate(8 * KIB, 64).unwrap(); // another class: a miss
    assert_eq!(c.stats().idle_bytes, 0);
    assert_eq!(r.pool.used(), other.charged());
}

#[test]
fn a_miss_past_the_usage_threshold_gives_idle_blocks_back_first() {
    let r = Rig::cpu("idle-gc", 64 * MIB);
    let c = cache(&r, IdlePolicy { gc_threshold: Some(0.5), ..cap(u64::MAX) });
    drop((0..30).map(|_| c.allocate(MIB, 64).unwrap()).collect::<Vec<_>>());
    assert_eq!(r.pool.used(), 30 * MIB);
    // 30 MiB used + a 4 MiB miss would pass 32 MiB: 2 MiB go back first.
    let big = c.allocate(4 * MIB, 64).unwrap();
    assert_eq!(r.pool.used(), 32 * MIB);
    assert_eq!(c.stats().trimmed_bytes, 2 * MIB);
    drop(big);
    assert_eq!((c.collect(), r.pool.used()), (0, 32 * MIB), "at the line, not past it");
    // Memory outside the cache takes the pool past the line: collect
    // brings it back with idle blocks.
    let other = r.manager.bind(&r.context, &r.pool, BindingSpec::new(AllocationClass::Weights)).unwrap();
    let weights = other.allocate(4 * MIB, 64).unwrap();
    assert_eq!(c.collect(), 4 * MIB);
    assert_eq!(r.pool.used(), 32 * MIB);
    drop(weights);
}

#[test]
fn policies_that_cannot_work_are_refused_with_the_reason() {
    let r = Rig::cpu("idle-bad", 64 * MIB);
    for (idle, why) in [
        (
            IdlePolicy { gc_threshold: Some(1.5), ..IdlePolicy::default() },
            "gc_threshold 1.5 is not in (0, 1]",
        ),
        (IdlePolicy { gc_threshold: Some(0.0), ..IdlePolicy::default() }, "gc_threshold 0 is not in (0, 1]"),
        (IdlePolicy { max_idle_age: Some(Duration::ZERO), ..IdlePolicy::default() }, "max_idle_age 0"),
    ] {
        let err = r
            .manager
            .bind_caching(
                &r.context,
                &r.pool,
                BindingSpec::new(AllocationClass::Activations),
                CacheConfig { idle, ..CacheConfig::default() },
            )
            .unwrap_err();
        assert!(matches!(err, ManagerError::Cache(_)), "{err}");
        assert!(err.to_string().contains(why), "{err}");
    }
}
