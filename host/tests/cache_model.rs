//! Model-based test of the caching binding on the reference CPU plugin:
//! random sequences of allocate (on the host or a stream), free, free
//! behind a fence on a stream, fence completion, trim and an outside
//! request that presses the cache, against a reference model of which
//! blocks are handed out and which are idle (ready, or pending behind
//! which fence on which stream). After every step:
//!
//! * no block is handed out twice, and a handed-out block's bytes are the
//!   ones its owner wrote (nobody else was given it);
//! * a block handed out while its fence was pending went to the stream it
//!   was freed on (stream-ordered reuse);
//! * the cache's figures equal the model's, and the pool's use is exactly
//!   the cache's idle + in-use bytes plus the outside allocations;
//! * at the end, trim and drop give every byte back.

mod common;

use common::*;
use memplug_host::governor::AllocationClass;
use memplug_host::{BindingSpec, CacheConfig, CachedAllocation, ObjectKind, OwnedAllocation, StreamKey};
use proptest::prelude::*;
use std::collections::HashMap;

const STREAMS: u64 = 3;
const GATES: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// Allocate `sizes[size]` on stream `stream` (0: the host).
    Allocate { size: usize, stream: u64 },
    /// Drop the `n`th held block.
    Free { n: usize },
    /// Give the `n`th held block back on `stream` behind gate `gate`.
    FreeOn { n: usize, stream: u64, gate: usize },
    /// Complete gate `gate` (a new, open gate replaces it).
    Open { gate: usize },
    /// `trim(bytes)`.
    Trim { bytes: u64 },
    /// An allocation of another binding of `bytes`, kept.
    Outside { bytes: u64 },
    /// Drop the outside allocations.
    DropOutside,
}

const SIZES: [u64; 4] = [64, 1000, 4096, 65536];

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..SIZES.len(), 0..=STREAMS).prop_map(|(size, stream)| Op::Allocate { size, stream }),
        2 => (0..16usize).prop_map(|n| Op::Free { n }),
        2 => (0..16usize, 1..=STREAMS, 0..GATES).prop_map(|(n, stream, gate)| Op::FreeOn { n, stream, gate }),
        1 => (0..GATES).prop_map(|gate| Op::Open { gate }),
        1 => prop_oneof![Just(0u64), Just(4096), Just(u64::MAX)].prop_map(|bytes| Op::Trim { bytes }),
        1 => (1u64..6).prop_map(|k| Op::Outside { bytes: k * 64 * 1024 }),
        1 => Just(Op::DropOutside),
    ]
}

struct Held {
    block: CachedAllocation,
    /// What its owner wrote into it.
    byte: u8,
}

fn fill(a: &CachedAllocation, byte: u8) {
    // SAFETY: CPU plugin memory, handed to this test alone.
    unsafe { std::ptr::write_bytes(a.addr() as *mut u8, byte, a.size() as usize) }
}

fn holds(a: &CachedAllocation, byte: u8) -> bool {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(a.addr() as *const u8, a.size() as usize) }.iter().all(|b| *b == byte)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let r = Rig::cpu("cache-model", 512 * 1024);
    let cache = r
        .manager
        .bind_caching(
            &r.context,
            &r.pool,
            BindingSpec::new(AllocationClass::Activations),
            CacheConfig::default(),
        )
        .unwrap();
    let outside_binding =
        r.manager.bind(&r.context, &r.pool, BindingSpec::new(AllocationClass::Weights)).unwrap();
    let mut gates: Vec<Gate> = (0..GATES).map(|i| Gate::new(&format!("gate {i}"))).collect();
    let mut held: Vec<Held> = Vec::new();
    let mut outside: Vec<OwnedAllocation> = Vec::new();
    // Blocks freed behind a fence not yet seen complete: address -> (stream,
    // gate it waits for).
    let mut pending: HashMap<u64, (u64, Gate)> = HashMap::new();
    let mut next_byte = 1u8;
    for op in ops {
        match op {
            Op::Allocate { size, stream } => {
                let got = if stream == 0 {
                    cache.allocate(SIZES[size], 64)
                } else {
                    cache.allocate_on(SIZES[size], 64, StreamKey::runtime(stream))
                };
                let Ok(a) = got else { continue }; // out of budget: nothing changed
                prop_assert!(!held.iter().any(|h| h.block.addr() == a.addr()), "block handed out twice");
                if let Some((s, gate)) = pending.remove(&a.addr()) {
                    prop_assert!(
                        gate.is_open() || s == stream,
                        "pending block of stream {s} given to {stream}"
                    );
                }
                next_byte = next_byte.wrapping_add(1).max(1);
                fill(&a, next_byte);
                held.push(Held { block: a, byte: next_byte });
            }
            Op::Free { n } if !held.is_empty() => {
                let h = held.remove(n % held.len());
                prop_assert!(holds(&h.block, h.byte), "someone else wrote into a held block");
                drop(h.block);
            }
            Op::FreeOn { n, stream, gate } if !held.is_empty() => {
                let h = held.remove(n % held.len());
                prop_assert!(holds(&h.block, h.byte));
                pending.insert(h.block.addr(), (stream, gates[gate].clone()));
                h.block.free_on(StreamKey::runtime(stream), gates[gate].fence.clone());
            }
            Op::Open { gate } => {
                gates[gate].open();
                gates[gate] = Gate::new(&format!("gate {gate}"));
            }
            Op::Trim { bytes } => {
                let before = cache.stats().idle_bytes;
                let given = cache.trim(bytes);
                prop_assert!(given <= before);
                prop_assert!(
                    bytes == 0 || given >= bytes.min(before),
                    "trim({bytes}) gave {given} of {before}"
                );
            }
            Op::Outside { bytes } => {
                if let Ok(a) = outside_binding.allocate(bytes, 4096) {
                    outside.push(a);
                }
            }
            Op::DropOutside => outside.clear(),
            _ => {}
        }
        r.manager.poll();
        let s = cache.stats();
        let in_use: u64 = held.iter().map(|h| h.block.charged()).sum();
        prop_assert_eq!(s.in_use_blocks, held.len() as u64);
        prop_assert_eq!(s.in_use_bytes, in_use);
        // Every object the plugin holds is accounted for: idle or handed out
        // by the cache, an outside allocation, or a trimmed pending block
        // waiting in the deferred-free queue for its fence (still charged).
        let queued = r.manager.queue().pending() as u64;
        prop_assert_eq!(
            r.mechanism().live(ObjectKind::Allocation),
            s.idle_blocks + s.in_use_blocks + outside.len() as u64 + queued
        );
        let outside_bytes: u64 = outside.iter().map(OwnedAllocation::charged).sum();
        let counted = s.idle_bytes + in_use + outside_bytes;
        prop_assert!(r.pool.used() >= counted && (queued > 0 || r.pool.used() == counted));
        prop_assert!(r.pool.used() <= r.pool.capacity());
    }
    for h in &held {
        prop_assert!(holds(&h.block, h.byte));
    }
    drop(held);
    drop(outside);
    for g in &gates {
        g.open();
    }
    cache.trim(u64::MAX);
    r.manager.poll();
    prop_assert_eq!(r.pool.used(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn the_cache_hands_out_each_block_once_orders_reuse_by_stream_and_its_figures_match(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        run(ops)?;
    }
}
