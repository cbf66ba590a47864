//! One pool's capacity word: charging, refunding, waiting for room and
//! changing the capacity — the lock-free core every level of a tree of
//! pools runs on its own. The tree (charging every ancestor) is in
//! `tree.rs`.
//!
//! # The word
//!
//! The word holds `used + (MAX_CAPACITY - capacity)` plus the [`WAITERS`]
//! bit. A charge fits exactly when the byte part stays at or below
//! [`MAX_CAPACITY`], so a grant is one compare-exchange that needs no other
//! word (not even the capacity), and a capacity change is one
//! read-modify-write of the same word: every charge is ordered before or
//! after it, none can slip under a capacity that was just lowered, and no
//! level is ever over its capacity, even for an instant.
//!
//! Reading `used` needs the offset the word holds: it is kept beside the
//! word, stored right after a change's read-modify-write, and the two are
//! read consistently through `epoch` (odd while a change is between its two
//! stores; a reader that sees it move retries, and one that finds it odd
//! waits on the change's lock). `free` is the word alone. Changes are
//! serialised by a lock no charge or refund ever takes.

use super::pool::Pool;
use crate::sync::{self, lock, AtomicU64, Condvar, Mutex};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;
use std::time::Instant;

/// Top bit of the capacity word: set while some thread waits for room.
pub(super) const WAITERS: u64 = 1 << 63;
/// The byte count in the capacity word.
pub(super) const BYTES: u64 = WAITERS - 1;

/// Largest capacity a pool can have (2^63 - 1 bytes).
pub const MAX_CAPACITY: u64 = BYTES;

/// The word every grant and refund touches, alone on its cache line with
/// the (rarely written) peak, offset and epoch.
#[repr(align(64))]
struct Hot {
    /// `used + offset`, plus [`WAITERS`].
    word: AtomicU64,
    /// The highest byte part the word has had, in the frame of the current
    /// offset (`peak used + offset`): a charge compares its new word with
    /// it as it is, and a capacity change moves it with the offset.
    peak: AtomicU64,
    /// `BYTES - capacity`: the offset in the word, as of the latest
    /// capacity change (see the module docs).
    offset: AtomicU64,
    /// Even: no capacity change between its two stores; odd: one is.
    epoch: AtomicU64,
    /// The pool above (read with the word by every charge and refund, so
    /// kept on its cache line).
    parent: Option<Arc<Pool>>,
}

/// Why a capacity could not be lowered: the bytes live then, and the
/// capacity kept.
#[derive(Debug)]
pub(super) struct BelowLive {
    pub live: u64,
    pub capacity: u64,
}

/// One pool's budget: the capacity word, what waits on it, and the pool
/// above (whose level every charge must also pass).
pub(super) struct Level {
    hot: Hot,
    /// Threads waiting for room (see [`wait_on`](Self::wait_on)).
    wait: Mutex<usize>,
    room: Condvar,
    /// Serialises capacity changes; held only while one runs (a few atomic
    /// operations; never by a charge, a refund or a callback).
    resize: Mutex<()>,
}

impl Level {
    /// A level of `capacity` bytes (at most [`MAX_CAPACITY`]).
    pub fn new(capacity: u64, parent: Option<Arc<Pool>>) -> Level {
        debug_assert!(capacity <= MAX_CAPACITY);
        Level {
            hot: Hot {
                word: AtomicU64::new(BYTES - capacity),
                peak: AtomicU64::new(BYTES - capacity),
                offset: AtomicU64::new(BYTES - capacity),
                epoch: AtomicU64::new(0),
                parent,
            },
            wait: Mutex::new(0),
            room: Condvar::new(),
            resize: Mutex::new(()),
        }
    }

    /// The pool above, if any.
    #[inline(always)]
    pub fn parent(&self) -> Option<&Arc<Pool>> {
        self.hot.parent.as_ref()
    }

    /// `(used, capacity)` at one moment. Exact; waits only while a
    /// capacity change is between its two stores.
    pub fn read(&self) -> (u64, u64) {
        loop {
            let e = self.hot.epoch.load(Acquire);
            if e & 1 == 0 {
                let w = self.hot.word.load(Acquire) & BYTES;
                let offset = self.hot.offset.load(Acquire);
                if self.hot.epoch.load(Relaxed) == e {
                    return (w - offset, BYTES - offset);
                }
            }
            // A change is between its stores: its lock ends when it is done.
            drop(lock(&self.resize));
        }
    }

    /// Bytes it may charge in all (the latest change's). Exact.
    #[inline]
    pub fn capacity(&self) -> u64 {
        BYTES - self.hot.offset.load(Acquire)
    }

    /// `capacity - used`: the word alone. Exact.
    #[inline]
    pub fn free(&self) -> u64 {
        BYTES - (self.hot.word.load(Acquire) & BYTES)
    }

    /// Highest `used` ever reached.
    pub fn peak(&self) -> u64 {
        loop {
            let e = self.hot.epoch.load(Acquire);
            if e & 1 == 0 {
                let p = self.hot.peak.load(Acquire);
                let offset = self.hot.offset.load(Acquire);
                if self.hot.epoch.load(Relaxed) == e {
                    // A charge racing a capacity change may have noted a
                    // word of the other frame (see `note_peak`).
                    return p.saturating_sub(offset);
                }
            }
            drop(lock(&self.resize));
        }
    }

    /// Charges `bytes` if they fit now (a fresh read, then the loop) and
    /// notes the peak.
    #[cfg(test)]
    pub fn try_charge(&self, bytes: u64) -> bool {
        self.charge(self.load(), true, bytes).map(|w| self.note_peak(w)).is_some()
    }

    /// The word now (a fresh read for [`charge`](Self::charge)).
    #[inline(always)]
    pub fn load(&self) -> u64 {
        self.hot.word.load(Relaxed)
    }

    /// The compare-exchange loop, starting from `expected`: a fresh read
    /// when `fresh`, else a guess (the thread's last seen value). Returns
    /// the new word. A refusal is only ever decided on a fresh read — a
    /// load or a failed compare-exchange — never on a guess. The bytes in
    /// the word never exceed [`BYTES`], i.e. `used` never exceeds the
    /// capacity. The caller notes the peak ([`note_peak`](Self::note_peak))
    /// once the charge is final (its ancestors took it too).
    #[inline(always)]
    pub fn charge(&self, expected: u64, fresh: bool, bytes: u64) -> Option<u64> {
        let word = &self.hot.word;
        let (mut cur, mut fresh) = (expected, fresh);
        loop {
            let held = cur & BYTES;
            if bytes > BYTES - held {
                if fresh {
                    return None;
                }
                cur = word.load(Relaxed);
                fresh = true;
                continue;
            }
            // held + bytes <= BYTES: the waiters bit is untouched.
            match word.compare_exchange_weak(cur, cur + bytes, AcqRel, Relaxed) {
                Ok(_) => return Some(cur + bytes),
                Err(seen) => {
                    cur = seen;
                    fresh = true;
                }
            }
        }
    }

    /// Raises the peak to the `used` a charge produced (`word`: the word
    /// its compare-exchange wrote): one compare on the common path, as the
    /// peak is kept in the word's own frame. A charge that runs at the
    /// very moment of a capacity change may note a word of the frame
    /// before it; then the figure may be off by that change.
    #[inline(always)]
    pub fn note_peak(&self, word: u64) {
        // The waiters bit makes any word look higher: sorted out there.
        if word > self.hot.peak.load(Relaxed) {
            self.raise_peak(word & BYTES);
        }
    }

    #[cold]
    #[inline(never)]
    fn raise_peak(&self, held: u64) {
        self.hot.peak.fetch_max(held, Relaxed);
    }

    /// Returns `bytes` (a token held them, so the word cannot go below its
    /// offset) and wakes waiters if any announced themselves. Returns the
    /// word as it was.
    #[inline(always)]
    pub fn refund(&self, bytes: u64) -> u64 {
        let prev = self.take(bytes);
        self.after_refund(prev, bytes);
        prev
    }

    /// The first half of [`refund`](Self::refund): takes `bytes` out of the
    /// word and returns it as it was; [`after_refund`](Self::after_refund)
    /// must follow.
    #[inline(always)]
    pub fn take(&self, bytes: u64) -> u64 {
        self.hot.word.fetch_sub(bytes, AcqRel)
    }

    /// Checks and wake-up after `bytes` left a word that was `prev`.
    #[inline(always)]
    pub fn after_refund(&self, prev: u64, bytes: u64) {
        debug_assert!(
            prev & BYTES >= bytes,
            "governor refund of {bytes} B exceeds the {} B in the word",
            prev & BYTES
        );
        if prev & WAITERS != 0 {
            self.wake_waiters();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_waiters(&self) {
        let _g = lock(&self.wait);
        // Waiters re-announce themselves (under this lock) if still short.
        self.hot.word.fetch_and(!WAITERS, AcqRel);
        self.room.notify_all();
    }

    /// Sleeps until a refund or a capacity raise at this level may have
    /// made room for `bytes`, or `deadline` passes (then `false`, at once
    /// if it already has). Does not charge: the caller retries.
    ///
    /// The protocol: under the wait lock, set [`WAITERS`] with an atomic
    /// OR and look at the value it returns — every refund or raise ordered
    /// after the OR sees the bit and takes the wait lock to notify, so no
    /// wake-up is lost; one ordered before it is visible in the returned
    /// value (then no sleep).
    pub fn wait_on(&self, bytes: u64, deadline: Instant) -> bool {
        let mut waiting = lock(&self.wait);
        *waiting += 1;
        let seen = self.hot.word.fetch_or(WAITERS, AcqRel);
        let mut in_time = true;
        if bytes > BYTES - (seen & BYTES) {
            let now = Instant::now();
            if now >= deadline {
                in_time = false;
            } else {
                waiting = sync::wait_timeout(&self.room, waiting, deadline - now);
            }
        }
        *waiting -= 1;
        if *waiting == 0 {
            self.hot.word.fetch_and(!WAITERS, AcqRel);
        }
        in_time
    }

    /// Sets the capacity to `new` (at most [`MAX_CAPACITY`]) in one
    /// read-modify-write of the word: a raise always succeeds (and wakes
    /// waiters); a lowering succeeds only if what is live fits in `new`,
    /// else nothing changes. No charge or refund waits for it.
    pub fn set_capacity(&self, new: u64) -> Result<(), BelowLive> {
        debug_assert!(new <= MAX_CAPACITY);
        let _one_change = lock(&self.resize);
        let old = BYTES - self.hot.offset.load(Relaxed);
        if new == old {
            return Ok(());
        }
        let e = self.hot.epoch.load(Relaxed);
        // Odd: readers retry. The word's update below is a release, so no
        // reader can see it without seeing this store too.
        self.hot.epoch.store(e + 1, Relaxed);
        let word = &self.hot.word;
        let outcome = if new < old {
            let delta = old - new;
            let mut cur = word.load(Relaxed);
            loop {
                if delta > BYTES - (cur & BYTES) {
                    break Err(BelowLive { live: (cur & BYTES) - (BYTES - old), capacity: old });
                }
                match word.compare_exchange_weak(cur, cur + delta, AcqRel, Relaxed) {
                    Ok(_) => break Ok(0),
                    Err(seen) => cur = seen,
                }
            }
        } else {
            // The offset shrinks by the raise; `used` stays <= old < new.
            Ok(word.fetch_sub(new - old, AcqRel))
        };
        if outcome.is_ok() {
            self.hot.offset.store(BYTES - new, Release);
            // The peak lives in the word's frame: it moves as the word did.
            if new < old {
                self.hot.peak.fetch_add(old - new, AcqRel);
            } else {
                self.hot.peak.fetch_sub(new - old, AcqRel);
            }
        }
        self.hot.epoch.store(e + 2, Release);
        let prev = outcome?;
        if prev & WAITERS != 0 {
            self.wake_waiters();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_holds_used_plus_the_offset_of_the_capacity() {
        let l = Level::new(100, None);
        assert_eq!(l.read(), (0, 100));
        assert!(l.try_charge(60));
        assert_eq!((l.read(), l.free(), l.peak()), ((60, 100), 40, 60));
        assert!(!l.try_charge(41));
        assert!(l.set_capacity(50).is_err());
        assert_eq!(l.read(), (60, 100));
        l.set_capacity(60).unwrap();
        assert_eq!((l.read(), l.free()), ((60, 60), 0));
        assert!(!l.try_charge(1));
        l.set_capacity(200).unwrap();
        assert!(l.try_charge(140));
        assert_eq!((l.read(), l.peak()), ((200, 200), 200));
        l.refund(200);
        assert_eq!(l.read(), (0, 200));
        l.set_capacity(0).unwrap();
        assert_eq!((l.read(), l.free()), ((0, 0), 0));
        assert!(l.try_charge(0) && !l.try_charge(1));
        l.set_capacity(MAX_CAPACITY).unwrap();
        assert!(l.try_charge(MAX_CAPACITY));
        assert_eq!(l.read(), (MAX_CAPACITY, MAX_CAPACITY));
    }

    #[test]
    fn a_refused_lowering_says_what_is_live() {
        let l = Level::new(100, None);
        assert!(l.try_charge(70));
        let e = l.set_capacity(10).unwrap_err();
        assert_eq!((e.live, e.capacity), (70, 100));
        assert_eq!(l.capacity(), 100);
    }
}
