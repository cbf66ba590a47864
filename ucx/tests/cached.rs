//! Cached allocations on the wire, between two real processes: a caching
//! binding's block registered whole or in part, offered, freed while
//! registered (the handle gone) — another request, on the stream it was
//! freed on or from another thread, gets a different block until the
//! deregistration, after which the block serves again — and a block that
//! receives a pull, freed with the get in flight, kept the same way until
//! the get completes. The pools end exact on both sides.

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, CacheConfig, CachingBinding, IdlePolicy, SharedFence, StreamKey};
use memplug_ucx::{Access, Peer, Ucx, UcxError};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const STREAM: StreamKey = StreamKey::runtime(7);

/// The child's side; an ordinary run does nothing here.
#[test]
fn child() {
    let Some((role, ucx, peer)) = child_side() else { return };
    match role.as_str() {
        "cached-owner" => owner(ucx, peer),
        r => panic!("unknown role {r}"),
    }
}

fn caching(m: &Memory) -> CachingBinding {
    let idle = IdlePolicy { max_idle_bytes: Some(u64::MAX), ..IdlePolicy::default() };
    let config = CacheConfig { idle, ..CacheConfig::default() };
    m.manager.bind_caching(&m.context, &m.pool, BindingSpec::new(AllocationClass::Kv), config).unwrap()
}

/// A fence already complete: the stream work the block was last used by.
fn ran() -> SharedFence {
    memplug_host::FnFence::new("kernel that ran", || true, |_| true)
}

/// Registers a cached block (whole, and a part), offers it, frees it while
/// registered and checks nobody gets it; stalls so the parent's pull into
/// its own cached block stays in flight; serves until the parent gives the
/// range back; then deregisters and sees the block reused.
fn owner(ucx: Ucx, mut peer: Peer) {
    let m = memory(8 * MIB);
    let cache = caching(&m);
    let mut a = cache.allocate_on(MIB, 4096, STREAM).unwrap();
    let (addr, charged) = (a.addr(), a.charged());
    // SAFETY: the block's CPU memory, ours.
    unsafe { fill(addr, MIB, 11) };
    // Parts: an empty range, one past the end or overflowing are refused.
    for (off, len) in [(0, 0), (MIB - 4096, 8192), (4096, u64::MAX)] {
        let e = ucx.register_allocation_range(&m.context, &mut a, off, len, Access::Read).err().unwrap();
        assert!(
            matches!(e, UcxError::Invalid(_)) && e.to_string().contains("not inside the allocation"),
            "{e}"
        );
    }
    let part = ucx.register_allocation_range(&m.context, &mut a, 4096, 8192, Access::Read).unwrap();
    assert_eq!((part.addr(), part.len()), (addr + 4096, 8192));
    drop(part);
    let reg = ucx.register_allocation(&m.context, &mut a, Access::Read).unwrap();
    assert_eq!((reg.addr(), reg.len()), (addr, MIB));
    // Freed while registered, on its stream behind work that already ran.
    a.free_on(STREAM, ran());
    let same = cache.allocate_on(MIB, 4096, STREAM).unwrap();
    assert_ne!(same.addr(), addr, "a registered block went to the stream it was freed on");
    let c2 = cache.clone();
    let other = std::thread::spawn(move || c2.allocate(MIB, 4096).unwrap()).join().unwrap();
    assert_ne!(other.addr(), addr, "a registered block went to another thread");
    for b in [&same, &other] {
        // SAFETY: CPU memory of live blocks, ours.
        unsafe { std::ptr::write_bytes(b.addr() as *mut u8, 0xEE, MIB as usize) };
    }
    assert_eq!(cache.trim(u64::MAX), 0, "nothing idle: the registered block is not trimmed");
    assert_eq!((cache.stats().pinned_blocks, m.pool.used()), (1, 3 * charged));
    peer.offer(&reg, 1).unwrap();
    // Stall: the parent's pull from this process waits for its progress.
    std::thread::sleep(Duration::from_secs(1));
    let deadline = Instant::now() + TIMEOUT;
    while peer.exported() > 0 {
        assert!(Instant::now() < deadline, "the parent did not release the range");
        ucx.progress();
        peer.pump().unwrap();
    }
    assert_eq!((cache.stats().pinned_blocks, m.pool.used()), (1, 3 * charged));
    reg.deregister().map_err(|(_, e)| e).unwrap();
    // Deregistered: the block serves the next request, its bytes intact.
    let back = cache.allocate_on(MIB, 4096, STREAM).unwrap();
    assert_eq!(back.addr(), addr, "the deregistered block is reused");
    // SAFETY: as above.
    assert!(unsafe { holds(addr, MIB, 11, 0) });
    assert_eq!((cache.stats().pinned_blocks, m.pool.used()), (0, 3 * charged));
    drop((same, other, back));
    assert_eq!(cache.trim(u64::MAX), 3 * charged);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);
    peer.serve(TIMEOUT).unwrap();
}

fn cached_blocks_are_registered_pulled_and_kept_from_reuse(test: &str, net: Net) {
    let Some(()) = ucx_or_skip(test) else { return };
    let m = memory(8 * MIB);
    let cache = caching(&m);
    let mut c = spawn("cached-owner", net);
    let r = c.peer.next_offer(TIMEOUT).unwrap();
    assert_eq!(r.len, MIB);
    // The owner stalls: this get is in flight while its block is freed.
    let mut pa = cache.allocate_on(MIB, 4096, STREAM).unwrap();
    let (addr, charged) = (pa.addr(), pa.charged());
    let t = c.peer.pull_into_allocation(&mut pa, 0, &r, 0, MIB).unwrap();
    pa.free_on(STREAM, ran());
    let same = cache.allocate_on(MIB, 4096, STREAM).unwrap();
    let c2 = cache.clone();
    let other = std::thread::spawn(move || c2.allocate(MIB, 4096).unwrap()).join().unwrap();
    assert!(!t.is_complete(), "the owner's stall should keep the get in flight");
    assert_ne!(same.addr(), addr, "a block with a get in flight went to its stream");
    assert_ne!(other.addr(), addr, "a block with a get in flight went to another thread");
    assert_eq!((cache.stats().pinned_blocks, m.pool.used()), (1, 3 * charged));
    t.wait(TIMEOUT).unwrap();
    // Complete: the block serves again, holding the owner's bytes.
    let back = cache.allocate_on(MIB, 4096, STREAM).unwrap();
    assert_eq!(back.addr(), addr);
    // SAFETY: the block's CPU memory; the get completed.
    assert!(unsafe { holds(addr, MIB, 11, 0) }, "the pulled bytes are not the owner's");
    c.peer.release(&r, TIMEOUT).unwrap();
    drop((same, other, back));
    cache.trim(u64::MAX);
    m.manager.poll();
    assert_eq!(m.pool.used(), 0);
    c.join();
}

#[test]
fn cached_blocks_are_registered_pulled_and_kept_from_reuse_over_tcp() {
    cached_blocks_are_registered_pulled_and_kept_from_reuse("cached_blocks_..._over_tcp", TCP);
}

#[test]
fn cached_blocks_are_registered_pulled_and_kept_from_reuse_over_shared_memory() {
    cached_blocks_are_registered_pulled_and_kept_from_reuse("cached_blocks_..._over_shared_memory", SHM);
}
