//! A cached block pinned by work outside any stream (`pinned_by`: what a
//! UCX registration or transfer records) and freed before the pin
//! completes stays out of the cache's idle lists: no request gets it, on
//! the stream it was freed on neither; trim, the idle policy and pressure
//! tickets do not give it back; it serves requests again once the pin
//! completes; the pool's ledger is exact throughout.

mod common;

use common::*;
use memplug_host::governor::{AllocationClass, GovernorError};
use memplug_host::{BindingError, BindingSpec, CacheConfig, CachingBinding, IdlePolicy, StreamKey};

fn plain(r: &Rig) -> CachingBinding {
    let idle = IdlePolicy { max_idle_bytes: Some(u64::MAX), ..IdlePolicy::default() };
    let config = CacheConfig { idle, ..CacheConfig::default() };
    r.manager
        .bind_caching(&r.context, &r.pool, BindingSpec::new(AllocationClass::Activations), config)
        .unwrap()
}

#[test]
fn a_pinned_block_freed_on_its_stream_is_reused_by_nobody_and_given_back_by_nothing_until_the_pin_completes()
{
    let r = Rig::cpu("cache-pinned", 4 * MIB);
    let c = plain(&r);
    let s1 = StreamKey::runtime(1);
    let mut a = c.allocate_on(MIB, 4096, s1).unwrap();
    let (addr, charged) = (a.addr(), a.charged());
    let pin = Gate::new("UCX registration");
    a.pinned_by(pin.fence.clone());
    // Freed on s1 behind a kernel that already ran: without the pin the
    // next request on s1 would take it at once.
    a.free_on(s1, Gate::completed("kernel on s1"));
    let s = c.stats();
    assert_eq!((s.pinned_blocks, s.idle_blocks, s.in_use_blocks, s.in_use_bytes), (1, 0, 1, charged));
    // The same stream, and another thread, get other blocks.
    let same = c.allocate_on(MIB, 4096, s1).unwrap();
    assert_ne!(same.addr(), addr, "the pinned block went to a request on the stream it was freed on");
    let c2 = c.clone();
    let other = std::thread::spawn(move || c2.allocate(MIB, 4096).unwrap()).join().unwrap();
    assert_ne!(other.addr(), addr, "the pinned block went to another thread");
    assert_eq!(r.pool.used(), 3 * charged);
    // Neither trim, the idle policy nor a pressure ticket gives it back.
    assert_eq!(c.trim(u64::MAX), 0);
    assert_eq!(c.collect(), 0);
    let weights = r.manager.bind(&r.context, &r.pool, BindingSpec::new(AllocationClass::Weights)).unwrap();
    let e = weights.allocate(2 * MIB, 4096).unwrap_err();
    assert!(matches!(e, BindingError::Budget(GovernorError::OutOfBudget(_))), "{e}");
    assert_eq!(c.stats().pressure_bytes, 0);
    assert_eq!(r.pool.used(), 3 * charged);
    r.manager.poll();
    assert_eq!(r.pool.used(), 3 * charged, "the pinned block is still charged");
    // Once the pin completes the block serves the next miss.
    pin.open();
    let back = c.allocate_on(MIB, 4096, s1).unwrap();
    assert_eq!(back.addr(), addr, "the unpinned block is reused");
    let s = c.stats();
    assert_eq!((s.pinned_blocks, s.in_use_blocks, s.in_use_bytes), (0, 3, 3 * charged));
    assert_eq!(r.pool.used(), 3 * charged);
    drop((same, other, back));
    assert_eq!(c.trim(u64::MAX), 3 * charged);
    assert!(Ledger::of(&r.pool).is_zero());
}

#[test]
fn a_pinned_block_dropped_goes_idle_after_its_pin_and_a_retirement_frees_it_behind_the_pin() {
    let r = Rig::cpu("cache-pinned-loss", 8 * MIB);
    let c = plain(&r);
    // A pin already complete at the free: idle at once.
    let mut a = c.allocate(MIB, 4096).unwrap();
    let addr = a.addr();
    a.pinned_by(Gate::completed("done"));
    drop(a);
    assert_eq!((c.stats().pinned_blocks, c.stats().idle_blocks), (0, 1));
    let mut a = c.allocate(MIB, 4096).unwrap();
    assert_eq!(a.addr(), addr);
    // A pending pin: parked; trim sees it once the pin completed.
    let pin = Gate::new("transfer");
    a.pinned_by(pin.fence.clone());
    drop(a);
    assert_eq!(c.trim(u64::MAX), 0);
    pin.open();
    assert_eq!(c.trim(u64::MAX), MIB);
    assert_eq!(r.pool.used(), 0);
    // Parked when the context retires: freed behind the pin, not before.
    let mut a = c.allocate(MIB, 4096).unwrap();
    let pin = Gate::new("registration");
    a.pinned_by(pin.fence.clone());
    drop(a);
    r.context.retire("test").unwrap();
    r.manager.poll();
    assert_eq!(c.stats().pinned_blocks, 0, "a retiring context keeps nothing");
    assert_eq!(r.pool.used(), MIB, "still charged until the pin completes");
    pin.open();
    r.manager.poll();
    assert_eq!(r.pool.used(), 0);
}
