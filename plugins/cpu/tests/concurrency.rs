//! Every slot may be called from any thread concurrently (ARCHITECTURE.md §3,
//! Threads): allocations made and freed on four threads at once, some freed
//! on a thread other than the one that made them, balance exactly.

mod common;
use common::*;

use std::sync::mpsc;

const THREADS: usize = 4;
const ROUNDS: usize = 20_000;

#[test]
fn four_threads_allocating_and_freeing_balance_live_objects() {
    let h = harness();
    let api = h.api;
    // Each thread hands a share of its allocations to its neighbour to free.
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<MemplugObjectRef>()).unzip();
    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, inbox)| {
            let outbox = senders[(t + 1) % THREADS].clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                for i in 0..ROUNDS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let size = 1 + x % 4096;
                    let alignment = 1u64 << ((x >> 20) % 13);
                    let o = api.allocate(size, alignment).unwrap();
                    assert_eq!(o.addr % alignment.max(16), 0);
                    // The first and last byte are this allocation's alone.
                    unsafe {
                        *(o.addr as *mut u8) = t as u8;
                        *((o.addr + size - 1) as *mut u8) = t as u8;
                    }
                    match i % 3 {
                        0 => api.deallocate(&o).unwrap(),
                        1 => held.push(o),
                        _ => outbox.send(o).unwrap(),
                    }
                    if held.len() > 64 {
                        for o in held.drain(..32) {
                            api.deallocate(&o).unwrap();
                        }
                    }
                    while let Ok(o) = inbox.try_recv() {
                        api.deallocate(&o).unwrap();
                    }
                }
                drop(outbox);
                for o in held {
                    api.deallocate(&o).unwrap();
                }
                inbox
            })
        })
        .collect();
    drop(senders);
    let inboxes: Vec<_> = handles.into_iter().map(|t| t.join().unwrap()).collect();
    // What was sent after a neighbour stopped looking is freed here.
    for inbox in inboxes {
        for o in inbox.try_iter() {
            api.deallocate(&o).unwrap();
        }
    }
    h.assert_balanced();
}

/// A reservation leaves the table before its addresses are unmapped: a copy
/// into a fresh reservation that the kernel placed at a just-released
/// address must never meet the released one's stale entry (it was answered
/// `OUT_OF_RANGE`, 9–29 times per stress run, when `release` unmapped
/// first). Four threads reserve, commit, copy into and release reservations
/// of one size, so addresses recycle between them constantly.
#[test]
fn a_copy_never_meets_a_released_reservation_at_a_recycled_address() {
    let h = harness();
    let api = h.api;
    let copy = api.sync.copy.expect("the 1.3 view publishes copy");
    let page = h.page();
    let size = 4 * page;
    let spurious = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let stream = api.stream_create().unwrap();
                let src = [7u8; 64];
                for _ in 0..ROUNDS / 4 {
                    let r = api.reserve(size).unwrap();
                    api.commit(&r, 0, size).unwrap();
                    let dst = r.addr + size - 64;
                    let run = call(|sink| unsafe {
                        copy(api.ctx as *mut std::ffi::c_void, stream, dst, src.as_ptr() as u64, 64, sink)
                    });
                    match run {
                        Ok(()) => {
                            let f = api.fence_record(stream).unwrap();
                            api.fence_wait(f, u64::MAX).unwrap();
                            api.fence_destroy(f).unwrap();
                            assert_eq!(unsafe { *(dst as *const u8) }, 7);
                        }
                        Err(e) => {
                            eprintln!("spurious refusal of a valid copy: {e:?}");
                            spurious.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    api.release_reservation(&r).unwrap();
                }
                api.stream_destroy(stream).unwrap();
            });
        }
    });
    assert_eq!(spurious.into_inner(), 0, "valid copies were refused");
    h.assert_balanced();
}
