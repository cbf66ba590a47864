//! The slot table's unit tests (loom's are in `tests/slot_table_loom.rs`).

use super::*;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

#[test]
fn locate_covers_every_index_once() {
    let mut expected = (0usize, 0usize);
    for i in 0..10_000u32 {
        let (k, off) = locate(i);
        assert_eq!((k, off), expected, "index {i}");
        expected.1 += 1;
        if expected.1 == chunk_len(expected.0) {
            expected = (expected.0 + 1, 0);
        }
    }
    let (k, off) = locate(MAX_INDEX);
    assert!(k < CHUNKS && off < chunk_len(k));
}

fn key(index: u32, gen: u32) -> Key {
    Key { index, gen }
}

#[test]
fn every_index_finds_its_own_slot_in_its_chunk() {
    // `slot` adds the index to a chunk's biased base: each index of the
    // first chunks must land on the slot `locate` names, in the chunk the
    // table made, and an index of a chunk not yet made on none.
    let t = leak(SlotTable::<u32>::new(MAX_INDEX));
    let n = (BASE * 7) as u32 + 5; // into chunk 3
    let keys: Vec<_> = (0..n).map(|v| t.insert(v, [v as u64, 0]).unwrap()).collect();
    for (v, &(i, g)) in keys.iter().enumerate() {
        let (k, off) = locate(i);
        let first = t.chunks[k].load(Acquire);
        assert!(std::ptr::eq(t.slot(i).unwrap(), first.wrapping_add(off)), "index {i}");
        assert_eq!(*t.pin(key(i, g)).unwrap(), v as u32);
    }
    let next_chunk = (BASE * 15) as u32;
    assert!(t.slot(next_chunk).is_none());
    assert_eq!(t.pin(key(next_chunk, 1)).err(), Some(Miss::Invalid));
}

#[test]
fn stale_and_forged_handles_are_told_apart() {
    let t = leak(SlotTable::<String>::new(MAX_INDEX));
    let (i, g) = t.insert("a".into(), [1, 2]).unwrap();
    assert_eq!(&*t.pin(key(i, g)).unwrap(), "a");
    assert_eq!(t.meta(key(i, g)).unwrap(), [1, 2]);
    assert!(matches!(t.remove(key(i, g)), Ok(Removed::Now(s)) if s == "a"));
    assert_eq!(t.pin(key(i, g)).err(), Some(Miss::Stale));
    assert_eq!(t.remove(key(i, g)).err(), Some(Miss::Stale));
    assert_eq!(t.pin(key(i, g + 5)).err(), Some(Miss::Invalid));
    assert_eq!(t.pin(key(1 << 27, 1)).err(), Some(Miss::Invalid));
    // The index is reused with a newer generation.
    let (i2, g2) = t.insert("b".into(), [0, 0]).unwrap();
    assert_eq!((i2, g2), (i, g + 1));
    assert_eq!(t.pin(key(i, g)).err(), Some(Miss::Stale));
}

#[test]
fn remove_while_pinned_defers_the_drop_to_the_last_reader() {
    struct D(Arc<AtomicU32>);
    impl Drop for D {
        fn drop(&mut self) {
            self.0.fetch_add(1, Relaxed);
        }
    }
    let drops = Arc::new(AtomicU32::new(0));
    let t = leak(SlotTable::<D>::new(MAX_INDEX));
    let (i, g) = t.insert(D(drops.clone()), [0, 0]).ok().unwrap();
    let p1 = t.pin(key(i, g)).ok().unwrap();
    let p2 = t.pin(key(i, g)).ok().unwrap();
    assert!(matches!(t.remove(key(i, g)), Ok(Removed::Deferred)));
    assert_eq!(t.pin(key(i, g)).err(), Some(Miss::Stale));
    assert!(t.remove(key(i, g)).is_err());
    drop(p1);
    assert_eq!(drops.load(Relaxed), 0);
    drop(p2);
    assert_eq!(drops.load(Relaxed), 1);
    let (i2, g2) = t.insert(D(drops.clone()), [0, 0]).ok().unwrap();
    assert_eq!((i2, g2), (i, g + 1));
}

#[test]
fn generations_retire_instead_of_wrapping() {
    let t = leak(SlotTable::<u32>::new(MAX_INDEX));
    let (i, g) = t.insert(1, [0, 0]).unwrap();
    let slot = t.slot(i).unwrap();
    // Pretend the slot already went through every generation.
    slot.state.store(free_state(MAX_GEN) | OCC, Release);
    assert!(matches!(t.remove(key(i, MAX_GEN)), Ok(Removed::Now(1))));
    assert_eq!(t.pin(key(i, MAX_GEN)).err(), Some(Miss::Stale));
    assert_eq!(t.pin(key(i, g)).err(), Some(Miss::Stale));
    for _ in 0..1000 {
        let (j, _) = t.insert(2, [0, 0]).unwrap();
        assert_ne!(j, i, "a retired slot is never reissued");
        let _ = t.remove(key(j, gen_of(t.slot(j).unwrap().state.load(Acquire))));
    }
}

#[test]
fn exclusive_use_waits_for_readers_holds_off_pins_and_drops_a_removed_value() {
    struct D(u32, Arc<AtomicU32>);
    impl Drop for D {
        fn drop(&mut self) {
            self.1.fetch_add(1, Relaxed);
        }
    }
    let drops = Arc::new(AtomicU32::new(0));
    let t = leak(SlotTable::<D>::new(MAX_INDEX));
    let (i, g) = t.insert(D(1, drops.clone()), [0, 0]).ok().unwrap();
    assert_eq!(t.with_exclusive(key(i, g), |d| std::mem::replace(&mut d.0, 2)).ok(), Some(1));
    assert_eq!(t.pin(key(i, g)).ok().unwrap().0, 2, "the change is seen by the next pin");
    // A pin taken while the value is held waits for the holder.
    let seen = std::thread::scope(|s| {
        t.with_exclusive(key(i, g), |d| {
            let h = s.spawn(move || t.pin(key(i, g)).ok().unwrap().0);
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!h.is_finished(), "a pin must wait for the exclusive holder");
            d.0 = 3;
            h
        })
        .ok()
        .unwrap()
        .join()
        .unwrap()
    });
    assert_eq!(seen, 3);
    // A remove while held: stale at once, dropped by the holder after
    // its closure, exactly once.
    t.with_exclusive(key(i, g), |_| {
        assert!(matches!(t.remove(key(i, g)), Ok(Removed::Deferred)));
        assert_eq!(drops.load(Relaxed), 0);
    })
    .ok()
    .unwrap();
    assert_eq!(drops.load(Relaxed), 1);
    assert_eq!(t.with_exclusive(key(i, g), |_| ()).err(), Some(Miss::Stale));
    assert_eq!(t.pin(key(i, g)).err(), Some(Miss::Stale));
    // A panic inside puts the value back and frees the slot for readers.
    let (i, g) = t.insert(D(7, drops.clone()), [0, 0]).ok().unwrap();
    let r = std::panic::catch_unwind(|| t.with_exclusive(key(i, g), |_| panic!("inside")));
    assert!(r.is_err());
    assert_eq!(t.pin(key(i, g)).ok().unwrap().0, 7);
}

#[test]
fn racing_removes_free_exactly_once() {
    let t = leak(SlotTable::<Arc<()>>::new(MAX_INDEX));
    let token = Arc::new(());
    for _ in 0..200 {
        let (i, g) = t.insert(token.clone(), [0, 0]).unwrap();
        let wins: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(move || matches!(t.remove(key(i, g)), Ok(Removed::Now(_))) as u32))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(wins, 1);
    }
    assert_eq!(Arc::strong_count(&token), 1);
}

#[test]
fn many_threads_insert_and_remove() {
    let t = leak(SlotTable::<u64>::new(MAX_INDEX));
    std::thread::scope(|s| {
        for th in 0..4u64 {
            s.spawn(move || {
                let mut live = Vec::new();
                for n in 0..5000u64 {
                    let (i, g) = t.insert(th * 1_000_000 + n, [n, th]).unwrap();
                    live.push((i, g, th * 1_000_000 + n));
                    if n % 3 == 0 {
                        let (i, g, v) = live.swap_remove(0);
                        assert!(matches!(t.remove(key(i, g)), Ok(Removed::Now(x)) if x == v));
                    }
                }
                for (i, g, v) in live {
                    assert_eq!(*t.pin(key(i, g)).unwrap(), v);
                    assert!(matches!(t.remove(key(i, g)), Ok(Removed::Now(x)) if x == v));
                }
            });
        }
    });
}

#[test]
fn a_bounded_table_reports_full() {
    let t = leak(SlotTable::<u8>::new(3));
    let got: Vec<_> = (0..4).map(|_| t.insert(0, [0, 0]).unwrap()).collect();
    assert_eq!(got.len(), 4);
    assert!(t.insert(9, [0, 0]).is_err());
}

#[test]
fn try_take_drop_updates_and_drops_in_place_once() {
    // The update runs on the stored value before its drop, the drop runs
    // exactly once (of racing takers, one wins), nothing changes while a
    // reader holds it, and the handle is stale afterwards.
    struct D(Arc<AtomicU32>, u32);
    impl Drop for D {
        fn drop(&mut self) {
            self.0.fetch_add(self.1, Relaxed);
        }
    }
    let t = leak(SlotTable::<D>::new(MAX_INDEX));
    let drops = Arc::new(AtomicU32::new(0));
    let (i, g) = t.insert(D(drops.clone(), 1), [0, 0]).ok().unwrap();
    let p = t.pin(key(i, g)).ok().unwrap();
    assert!(matches!(t.try_take_drop(key(i, g), |d| d.1 = 100), Ok(Err(_))));
    assert_eq!(p.1, 1, "not updated while pinned");
    drop(p);
    assert!(matches!(t.try_take_drop(key(i, g), |d| d.1 = 10), Ok(Ok(()))));
    assert_eq!(drops.load(Relaxed), 10, "updated, then dropped once");
    assert!(matches!(t.try_take_drop(key(i, g), |_| unreachable!()), Err(Miss::Stale)));
    assert_eq!(t.pin(key(i, g)).err(), Some(Miss::Stale));
    for _ in 0..200 {
        let (i, g) = t.insert(D(drops.clone(), 0), [0, 0]).ok().unwrap();
        let wins: u32 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(move || matches!(t.try_take_drop(key(i, g), |d| d.1 = 1), Ok(Ok(()))) as u32)
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(wins, 1);
    }
    assert_eq!(drops.load(Relaxed), 10 + 200);
}
