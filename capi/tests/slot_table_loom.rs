//! Exhaustive interleavings (loom) of the lock-free slot table behind every
//! C API handle (`capi/src/slot_table.rs`): a value is seen only after it
//! is published, a removed key is refused as stale, a value is moved out or
//! dropped exactly once and never while a reader has it pinned, an
//! exclusive use (`with_exclusive`) overlaps no reader and leaves a value
//! removed meanwhile dropped once, and inserts and removes of neighbouring
//! slots do not disturb each other.
//!
//! Built only with `--cfg loom`, in its own target dir:
//!
//! ```sh
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
//!     cargo test -p memplug-host-capi --release --test slot_table_loom
//! ```
//!
//! Under `--cfg loom` the table's atomics, free-list lock, per-thread
//! free-index caches and value cells are loom's (`capi/src/sync.rs`), so
//! loom also checks every access to a stored value against the state
//! word's ordering. The models are small enough to explore without a
//! preemption bound (all ten take well under a second).
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use loom::thread;
use memplug_host_capi::slot_table::{leak, Key, Miss, Removed, SlotTable};
use std::sync::Arc;

/// A value that counts its drops.
struct Tracked {
    id: u64,
    drops: Arc<AtomicUsize>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.drops.fetch_add(1, SeqCst);
    }
}

fn tracked(id: u64, drops: &Arc<AtomicUsize>) -> Tracked {
    Tracked { id, drops: drops.clone() }
}

fn key((index, gen): (u32, u32)) -> Key {
    Key { index, gen }
}

/// A fresh table for one execution (the table's API wants `'static`).
fn table<T: Send + Sync + 'static>(limit: u32) -> &'static SlotTable<T> {
    leak(SlotTable::new(limit))
}

fn insert(t: &'static SlotTable<Tracked>, value: Tracked, meta: [u64; 2]) -> Key {
    key(t.insert(value, meta).ok().expect("the table has room"))
}

#[test]
fn a_reader_sees_an_inserted_value_only_once_it_is_published() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        // The key travels through a relaxed atomic (0: not yet), so only the
        // table's own ordering (the release that publishes the slot, the
        // acquire of a pin) can make the value visible to the reader: loom
        // fails the test if the reader could read the value's cell before
        // the writer's write of it happened.
        let published = Arc::new(AtomicU64::new(0));
        let (p, d) = (published.clone(), drops.clone());
        let writer = thread::spawn(move || {
            let k = insert(t, tracked(7, &d), [70, 71]);
            p.store((u64::from(k.gen) << 32) | u64::from(k.index), Relaxed);
            k
        });
        let p = published.clone();
        let reader = thread::spawn(move || {
            let bits = p.load(Relaxed);
            if bits != 0 {
                let k = Key { index: bits as u32, gen: (bits >> 32) as u32 };
                // A relaxed hand-over may show the key before the slot's
                // publication; a pin then misses, but never reads early.
                if let Ok(pinned) = t.pin(k) {
                    assert_eq!(pinned.id, 7);
                    assert_eq!(t.meta(k).ok(), Some([70, 71]));
                }
            }
        });
        let k = writer.join().unwrap();
        reader.join().unwrap();
        let pinned = t.pin(k).expect("an inserted key pins");
        assert_eq!(pinned.id, 7);
        assert_eq!(t.meta(k).ok(), Some([70, 71]));
        drop(pinned);
        assert!(matches!(t.remove(k), Ok(Removed::Now(v)) if v.id == 7));
        assert_eq!(drops.load(SeqCst), 1);
    });
}

#[test]
fn a_removed_key_is_refused_as_stale() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        let k = insert(t, tracked(1, &drops), [1, 0]);
        let remover = thread::spawn(move || match t.remove(k) {
            Ok(Removed::Now(v)) => assert_eq!(v.id, 1),
            Ok(Removed::Deferred) => {} // the reader had it pinned
            Err(m) => panic!("the only remover missed: {m:?}"),
        });
        let d = drops.clone();
        let reader = thread::spawn(move || match t.pin(k) {
            Ok(p) => {
                assert_eq!(p.id, 1);
                assert_eq!(d.load(SeqCst), 0, "dropped while pinned");
            }
            Err(m) => assert_eq!(m, Miss::Stale),
        });
        remover.join().unwrap();
        reader.join().unwrap();
        assert_eq!(drops.load(SeqCst), 1);
        assert_eq!(t.pin(k).err(), Some(Miss::Stale));
        assert_eq!(t.meta(k).err(), Some(Miss::Stale));
        assert!(matches!(t.remove(k), Err(Miss::Stale)));
        // The slot's next value has the next generation; the old key stays
        // stale.
        let k2 = insert(t, tracked(2, &drops), [0, 0]);
        assert_ne!(k2, k);
        assert_eq!(t.pin(k).err(), Some(Miss::Stale));
        assert_eq!(t.pin(k2).ok().map(|p| p.id), Some(2));
    });
}

#[test]
fn two_threads_removing_one_key_free_it_exactly_once() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        let k = insert(t, tracked(3, &drops), [0, 0]);
        // One thread moves the value out, the other drops it in place.
        let by_remove = thread::spawn(move || match t.remove(k) {
            Ok(Removed::Now(v)) => {
                assert_eq!(v.id, 3);
                1
            }
            Ok(Removed::Deferred) => panic!("nobody pins it"),
            Err(m) => {
                assert_eq!(m, Miss::Stale);
                0
            }
        });
        let by_remove_drop = thread::spawn(move || match t.remove_drop(k) {
            Ok(()) => 1,
            Err(m) => {
                assert_eq!(m, Miss::Stale);
                0
            }
        });
        let wins = by_remove.join().unwrap() + by_remove_drop.join().unwrap();
        assert_eq!(wins, 1, "exactly one remover wins");
        assert_eq!(drops.load(SeqCst), 1, "the value is dropped exactly once");
        assert_eq!(t.pin(k).err(), Some(Miss::Stale));
    });
}

#[test]
fn a_pinned_value_is_dropped_only_after_the_last_unpin() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        let k = insert(t, tracked(4, &drops), [0, 0]);
        // This thread holds a pin from before the remove until after it.
        let held = t.pin(k).expect("live");
        let remover = thread::spawn(move || match t.remove(k) {
            Ok(Removed::Deferred) => {}
            Ok(Removed::Now(_)) => panic!("taken while pinned"),
            Err(m) => panic!("the only remover missed: {m:?}"),
        });
        let d = drops.clone();
        let reader = thread::spawn(move || {
            if let Ok(p) = t.pin(k) {
                assert_eq!(p.id, 4);
                assert_eq!(d.load(SeqCst), 0, "dropped while pinned");
            }
        });
        remover.join().unwrap();
        assert_eq!(held.id, 4);
        assert_eq!(drops.load(SeqCst), 0, "dropped while pinned");
        // The last unpin (this one or the reader's) drops it.
        drop(held);
        reader.join().unwrap();
        assert_eq!(drops.load(SeqCst), 1, "dropped once, by the last reader");
        assert_eq!(t.pin(k).err(), Some(Miss::Stale));
    });
}

#[test]
fn try_take_never_takes_a_pinned_value_and_takes_it_once_the_reader_leaves() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        let k = insert(t, tracked(5, &drops), [0, 0]);
        let d = drops.clone();
        let reader = thread::spawn(move || {
            if let Ok(p) = t.pin(k) {
                assert_eq!(p.id, 5);
                assert_eq!(d.load(SeqCst), 0, "dropped while pinned");
            }
        });
        // The taker retries while the reader holds it; it alone owns the
        // value once taken (no reader drops it, so it can be handed on).
        let taken = loop {
            match t.try_take(k) {
                Ok(Some(v)) => break v,
                Ok(None) => thread::yield_now(),
                Err(m) => panic!("the only taker missed: {m:?}"),
            }
        };
        assert_eq!(taken.id, 5);
        reader.join().unwrap();
        assert_eq!(drops.load(SeqCst), 0, "nobody dropped the taken value");
        drop(taken);
        assert_eq!(drops.load(SeqCst), 1);
        assert_eq!(t.pin(k).err(), Some(Miss::Stale));
        assert!(matches!(t.try_take(k), Err(Miss::Stale)));
    });
}

#[test]
fn try_take_drop_updates_and_drops_once_never_under_a_reader_and_one_of_two_takers_wins() {
    /// Records the id it held when dropped.
    struct Noted {
        id: u64,
        dropped_with: Arc<AtomicU64>,
    }
    impl Drop for Noted {
        fn drop(&mut self) {
            assert_eq!(self.dropped_with.swap(self.id, SeqCst), 0, "dropped twice");
        }
    }
    loom::model(|| {
        let t = table::<Noted>(1 << 20);
        let dropped_with = Arc::new(AtomicU64::new(0));
        let k = key(t.insert(Noted { id: 6, dropped_with: dropped_with.clone() }, [0, 0]).ok().unwrap());
        let reader = thread::spawn(move || {
            if let Ok(p) = t.pin(k) {
                assert_eq!(p.id, 6, "changed or dropped while pinned");
            }
        });
        // A second taker that moves it out instead.
        let remover = thread::spawn(move || match t.try_take(k) {
            Ok(Some(v)) => {
                assert_eq!(v.id, 6);
                1
            }
            Ok(None) | Err(Miss::Stale) => 0,
            Err(m) => panic!("{m:?}"),
        });
        // The update-and-drop retries while the reader holds it, and stops
        // once the other taker has it.
        let mut update = |v: &mut Noted| v.id = 60;
        let mine = loop {
            match t.try_take_drop(k, update) {
                Ok(Ok(())) => break 1,
                Ok(Err(f)) => {
                    update = f;
                    thread::yield_now();
                }
                Err(m) => {
                    assert_eq!(m, Miss::Stale);
                    break 0;
                }
            }
        };
        reader.join().unwrap();
        let theirs = remover.join().unwrap();
        assert_eq!(mine + theirs, 1, "exactly one taker wins");
        // The try_take winner's value was dropped when its thread returned.
        let want = if mine == 1 { 60 } else { 6 };
        assert_eq!(dropped_with.load(SeqCst), want, "dropped once, updated first if by try_take_drop");
        assert_eq!(t.pin(k).err(), Some(Miss::Stale));
    });
}

#[test]
fn an_exclusive_use_overlaps_no_reader() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        let k = insert(t, tracked(1, &drops), [0, 0]);
        // loom fails the model if the reader's access to the cell could
        // overlap the holder's take or write-back of the value.
        let reader = thread::spawn(move || {
            let p = t.pin(k).expect("live");
            assert!(p.id == 1 || p.id == 2, "a value mid-change: {}", p.id);
        });
        t.with_exclusive(k, |v| v.id = 2).expect("live");
        reader.join().unwrap();
        assert_eq!(t.pin(k).expect("live").id, 2);
        assert_eq!(drops.load(SeqCst), 0);
    });
}

#[test]
fn a_value_removed_during_an_exclusive_use_is_dropped_once() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        let k = insert(t, tracked(1, &drops), [0, 0]);
        let remover = thread::spawn(move || {
            t.remove(k).map(drop).expect("the only remover");
        });
        // Before the remove it changes the value; after it, the key is stale.
        match t.with_exclusive(k, |v| v.id = 2) {
            Ok(()) | Err(Miss::Stale) => {}
            Err(m) => panic!("the only holder missed: {m:?}"),
        }
        remover.join().unwrap();
        assert_eq!(drops.load(SeqCst), 1, "dropped exactly once");
        assert_eq!(t.pin(k).err(), Some(Miss::Stale));
    });
}

#[test]
fn an_insert_racing_a_remove_of_another_slot_disturbs_neither() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        let x = insert(t, tracked(5, &drops), [5, 5]);
        // The inserter takes its indices from the shared free list while
        // the remover frees `x`'s slot, in the same chunk, and (when its
        // thread exits) gives the index back to that list.
        let d = drops.clone();
        let inserter = thread::spawn(move || insert(t, tracked(6, &d), [6, 6]));
        let remover = thread::spawn(move || match t.remove(x) {
            Ok(Removed::Now(v)) => assert_eq!(v.id, 5),
            _ => panic!("the only remover of an unpinned value takes it"),
        });
        remover.join().unwrap();
        let y = inserter.join().unwrap();
        assert_ne!(y, x);
        assert_eq!(drops.load(SeqCst), 1, "only x was dropped");
        assert_eq!(t.pin(x).err(), Some(Miss::Stale));
        assert_eq!(t.pin(y).ok().map(|p| p.id), Some(6));
        assert_eq!(t.meta(y).ok(), Some([6, 6]));
        if y.index == x.index {
            assert_eq!(y.gen, x.gen + 1, "a reused slot has the next generation");
        }
    });
}

#[test]
fn two_inserts_racing_to_create_the_first_chunk_both_land() {
    loom::model(|| {
        let t = table::<Tracked>(1 << 20);
        let drops = Arc::new(AtomicUsize::new(0));
        let spawn = |id: u64| {
            let d = drops.clone();
            thread::spawn(move || insert(t, tracked(id, &d), [id, 0]))
        };
        let (a, b) = (spawn(8), spawn(9));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert_ne!(a.index, b.index);
        assert_eq!(t.pin(a).ok().map(|p| p.id), Some(8));
        assert_eq!(t.pin(b).ok().map(|p| p.id), Some(9));
        assert_eq!(drops.load(SeqCst), 0);
    });
}
