//! The lock of a cache shard: a futex lock without poisoning.
//!
//! Why not `std::sync::Mutex`: a cache hit takes and a free puts back under
//! a shard's lock, and std's poisoning checks whether the thread is
//! panicking on every lock and unlock (~20 of the ~280 instructions of a
//! hit + free pair, callgrind `cached`). The host ignores poison anyway
//! (`crate::sync::lock`: its bookkeeping is consistent at every unlock
//! point), so this lock keeps only what the shard needs: the same
//! compare-exchange to lock and swap to unlock as std's futex mutex, a
//! short spin, then a sleep on the futex that the unlock wakes.
//!
//! Under loom it is loom's mutex (the cache is not one of the modelled
//! protocols, but the crate must build).

#[cfg(not(loom))]
pub(crate) use futex::ShardLock;
#[cfg(loom)]
pub(crate) use modelled::ShardLock;

#[cfg(not(loom))]
mod futex {
    use std::cell::UnsafeCell;
    use std::ops::{Deref, DerefMut};
    use std::sync::atomic::{
        AtomicU32,
        Ordering::{Acquire, Relaxed, Release},
    };

    const UNLOCKED: u32 = 0;
    const LOCKED: u32 = 1;
    /// Locked, and a waiter may be asleep on the futex: the unlock wakes one.
    const CONTENDED: u32 = 2;

    pub(crate) struct ShardLock<T> {
        state: AtomicU32,
        value: UnsafeCell<T>,
    }

    // SAFETY: the value is reached only through a guard, and one guard at
    // a time exists (the state word's compare-exchange and swap, Acquire
    // and Release, order each holder's accesses after the last one's).
    unsafe impl<T: Send> Send for ShardLock<T> {}
    // SAFETY: as above: `&ShardLock` gives `&mut T` to one thread at a time.
    unsafe impl<T: Send> Sync for ShardLock<T> {}

    pub(crate) struct ShardGuard<'a, T> {
        lock: &'a ShardLock<T>,
    }

    impl<T> ShardLock<T> {
        pub(crate) fn new(value: T) -> Self {
            ShardLock { state: AtomicU32::new(UNLOCKED), value: UnsafeCell::new(value) }
        }

        #[inline]
        pub(crate) fn lock(&self) -> ShardGuard<'_, T> {
            if self.state.compare_exchange(UNLOCKED, LOCKED, Acquire, Relaxed).is_err() {
                self.lock_contended();
            }
            ShardGuard { lock: self }
        }

        #[inline]
        pub(crate) fn try_lock(&self) -> Option<ShardGuard<'_, T>> {
            self.state
                .compare_exchange(UNLOCKED, LOCKED, Acquire, Relaxed)
                .ok()
                .map(|_| ShardGuard { lock: self })
        }

        #[cold]
        #[inline(never)]
        fn lock_contended(&self) {
            // A shard's critical sections are a few list operations: a
            // short spin usually finds it free.
            for _ in 0..100 {
                if self.state.load(Relaxed) == UNLOCKED
                    && self.state.compare_exchange(UNLOCKED, LOCKED, Acquire, Relaxed).is_ok()
                {
                    return;
                }
                std::hint::spin_loop();
            }
            // Marked contended before sleeping, so the holder's unlock
            // wakes this thread; taken while contended, it stays marked (a
            // spurious wake at most).
            while self.state.swap(CONTENDED, Acquire) != UNLOCKED {
                wait(&self.state, CONTENDED);
            }
        }
    }

    impl<T> Deref for ShardGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            // SAFETY: this guard is the one holder (see the Sync impl).
            unsafe { &*self.lock.value.get() }
        }
    }

    impl<T> DerefMut for ShardGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: as above.
            unsafe { &mut *self.lock.value.get() }
        }
    }

    impl<T> Drop for ShardGuard<'_, T> {
        #[inline]
        fn drop(&mut self) {
            if self.lock.state.swap(UNLOCKED, Release) == CONTENDED {
                wake_one(&self.lock.state);
            }
        }
    }

    /// Sleeps while `*word == expected`. Returns on a wake, on a changed
    /// value (`EAGAIN`) or on a signal (`EINTR`): the caller checks again.
    /// The sleep ends when the holder unlocks (it wakes one sleeper).
    fn wait(word: &AtomicU32, expected: u32) {
        // SAFETY: FUTEX_WAIT on a live, aligned u32 of this process, with
        // no timeout; it reads the word and sleeps, writing nothing.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                std::ptr::null::<libc::timespec>(),
            );
        }
    }

    fn wake_one(word: &AtomicU32) {
        // SAFETY: FUTEX_WAKE on a live, aligned u32 of this process.
        unsafe {
            libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1);
        }
    }
}

#[cfg(loom)]
mod modelled {
    pub(crate) type ShardGuard<'a, T> = crate::sync::MutexGuard<'a, T>;

    pub(crate) struct ShardLock<T>(crate::sync::Mutex<T>);

    impl<T> ShardLock<T> {
        pub(crate) fn new(value: T) -> Self {
            ShardLock(crate::sync::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> ShardGuard<'_, T> {
            crate::sync::lock(&self.0)
        }
        pub(crate) fn try_lock(&self) -> Option<ShardGuard<'_, T>> {
            self.0.try_lock().ok()
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::ShardLock;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    /// Four threads add under the lock far longer than a spin lasts (some
    /// sleep on the futex): no increment is lost, and `try_lock` fails
    /// exactly while another holds it.
    #[test]
    fn increments_under_contention_are_exact_and_try_lock_sees_the_holder() {
        let lock = ShardLock::new(0u64);
        let slept = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..20_000u64 {
                        let mut g = lock.lock();
                        let v = *g;
                        if i % 1000 == 0 {
                            // Held long enough that the others give up spinning.
                            std::thread::sleep(std::time::Duration::from_micros(200));
                            slept.store(true, Relaxed);
                        }
                        *g = v + 1;
                    }
                });
            }
        });
        assert_eq!(*lock.lock(), 80_000);
        assert!(slept.load(Relaxed));
        let held = lock.lock();
        std::thread::scope(|s| {
            s.spawn(|| assert!(lock.try_lock().is_none(), "taken while held"));
        });
        drop(held);
        assert!(lock.try_lock().is_some());
    }
}
