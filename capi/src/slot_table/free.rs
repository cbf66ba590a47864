//! A slot table's free indices: the list all threads share (behind a
//! lock) and each thread's caches of it (a vector per table, refilled and
//! spilled in batches, and the one index it released last), so that an
//! allocation and a free take no lock. Apart from `slot_table.rs` to keep
//! that file short; its atomics, lock and thread-local come from
//! `crate::sync` as the table's do, so the loom models cover it too.

use crate::sync::{self, thread_local, AtomicU32, Mutex, MutexGuard};
use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering::Release;

/// Indices a table may hand out, shared by all threads.
pub(super) struct FreeList {
    inner: Mutex<FreeInner>,
    /// One past the highest index ever handed out (sweeps stop there).
    pub(super) high: AtomicU32,
    /// Process-unique number of this list: its place in the per-thread
    /// caches.
    pub(super) id: usize,
}

struct FreeInner {
    free: Vec<u32>,
    fresh: u32,
    limit: u32,
}

pub(super) const BATCH: usize = 32;
pub(super) const LOCAL_MAX: usize = 2 * BATCH;

impl FreeList {
    pub(super) fn new(limit: u32) -> Self {
        FreeList {
            inner: Mutex::new(FreeInner { free: Vec::new(), fresh: 0, limit }),
            high: AtomicU32::new(0),
            id: sync::next_list_id(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FreeInner> {
        sync::lock(&self.inner)
    }

    /// Moves up to `n` free indices into `out` (out of line: it takes the
    /// lock, once every `BATCH` allocations of a thread).
    #[cold]
    #[inline(never)]
    pub(super) fn refill(&self, out: &mut Vec<u32>, n: usize) {
        let mut g = self.lock();
        let take = g.free.len().min(n);
        let at = g.free.len() - take;
        out.extend(g.free.drain(at..));
        while out.len() < n && g.fresh <= g.limit {
            out.push(g.fresh);
            g.fresh += 1;
        }
        self.high.store(g.fresh, Release);
    }

    /// Moves a batch of a thread's cached indices back to the shared list
    /// (out of line: once every `BATCH` releases).
    #[cold]
    #[inline(never)]
    pub(super) fn spill(&self, v: &mut Vec<u32>) {
        let at = v.len() - BATCH;
        self.give_back(v.drain(at..));
    }

    /// An index released by a thread whose cache is gone (its exit).
    #[cold]
    #[inline(never)]
    pub(super) fn give_back_one(&self, index: u32) {
        self.give_back([index]);
    }

    fn give_back(&self, idx: impl IntoIterator<Item = u32>) {
        self.lock().free.extend(idx);
    }
}

/// Per-thread caches of free indices: `lists`, indexed by
/// [`FreeList::id`], and `stash`, the one index this thread released last
/// (of any list). An allocation of the stash's list takes it first, so an
/// insert + remove pair of one table (an allocate + free through the C API)
/// moves its index through a `Cell` — a compare and two stores — rather
/// than a vector behind a `RefCell` (callgrind: about 45 instructions a
/// pair less). The stash is given back with the rest when the thread ends.
struct LocalCaches {
    stash: Cell<Option<Stashed>>,
    lists: RefCell<Lists>,
}

/// The stashed index, its list, and the address of its slot in the table
/// that owns the list, so that the next allocation need not find the slot
/// again (callgrind: the segment lookup cost ~18 instructions a pair).
#[derive(Clone, Copy)]
struct Stashed {
    list: &'static FreeList,
    index: u32,
    slot: *const (),
}

/// A thread's vectors of free indices, indexed by [`FreeList::id`].
type Lists = Vec<Option<(&'static FreeList, Vec<u32>)>>;

impl Drop for LocalCaches {
    fn drop(&mut self) {
        if let Some(s) = self.stash.take() {
            s.list.give_back([s.index]);
        }
        for (list, idx) in self.lists.get_mut().drain(..).flatten() {
            list.give_back(idx);
        }
    }
}

// (loom's `thread_local!` takes no `const { }` initialiser.)
#[cfg(not(loom))]
thread_local! {
    static LOCAL: LocalCaches = const { LocalCaches { stash: Cell::new(None), lists: RefCell::new(Vec::new()) } };
}
#[cfg(loom)]
thread_local! {
    static LOCAL: LocalCaches = LocalCaches { stash: Cell::new(None), lists: RefCell::new(Vec::new()) };
}

/// Takes this thread's stashed index, and the slot address stashed with
/// it, if it is of `list`.
#[inline]
pub(super) fn take_stash(list: &'static FreeList) -> Option<(u32, *const ())> {
    LOCAL
        .try_with(|c| match c.stash.get() {
            Some(s) if std::ptr::eq(s.list, list) => {
                c.stash.set(None);
                Some((s.index, s.slot))
            }
            _ => None,
        })
        .ok()
        .flatten()
}

/// Stashes `index` of `list`, with the address of its slot, if the stash
/// is empty; false if not (or this thread's caches are gone).
#[inline]
pub(super) fn put_stash(list: &'static FreeList, index: u32, slot: *const ()) -> bool {
    LOCAL
        .try_with(|c| {
            if c.stash.get().is_some() {
                return false;
            }
            c.stash.set(Some(Stashed { list, index, slot }));
            true
        })
        .unwrap_or(false)
}

#[inline]
pub(super) fn with_local<R>(list: &'static FreeList, f: impl FnOnce(&mut Vec<u32>) -> R) -> Option<R> {
    LOCAL
        .try_with(|c| {
            let mut c = c.lists.try_borrow_mut().ok()?;
            // Making this thread's cache of `list` is out of line: inline,
            // its code cost every release_index a larger frame.
            let v = match c.get_mut(list.id) {
                Some(Some((_, v))) => v,
                _ => first_local(&mut c, list),
            };
            Some(f(v))
        })
        .ok()
        .flatten()
}

/// This thread's first use of `list`: its cache of free indices.
#[cold]
#[inline(never)]
fn first_local<'a>(c: &'a mut Lists, list: &'static FreeList) -> &'a mut Vec<u32> {
    if c.len() <= list.id {
        c.resize_with(list.id + 1, || None);
    }
    let (_, v) = c[list.id].get_or_insert_with(|| (list, Vec::with_capacity(LOCAL_MAX + 1)));
    v
}
