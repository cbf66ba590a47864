//! Heap storage for what a descriptor points at: owned by the built plugin,
//! freed with it, and never moved or reborrowed uniquely while the host may
//! read it.
//!
//! A `Box` would do the freeing, but moving a `Box` asserts it is the only
//! way to its contents, which the host's raw pointers contradict; keeping
//! the allocation as a raw pointer from [`Box::into_raw`] makes no such
//! claim.

use core::ptr::NonNull;

/// One heap value, freed on drop; what [`Owned::ptr`] returns stays valid
/// (and the value unmoved) until then.
pub(super) struct Owned<T: ?Sized>(NonNull<T>);

impl<T> Owned<T> {
    pub(super) fn new(value: T) -> Self {
        Owned(NonNull::from(Box::leak(Box::new(value))))
    }
}

impl<T: ?Sized> Owned<T> {
    /// Takes a boxed value (for slices).
    pub(super) fn from_box(b: Box<T>) -> Self {
        Owned(NonNull::from(Box::leak(b)))
    }

    pub(super) fn ptr(&self) -> *mut T {
        self.0.as_ptr()
    }
}

impl<T: ?Sized> Drop for Owned<T> {
    fn drop(&mut self) {
        // SAFETY: made from a `Box` in the constructors and freed only here.
        unsafe { drop(Box::from_raw(self.0.as_ptr())) }
    }
}

// SAFETY: `Owned<T>` is a `Box<T>` that does not claim uniqueness; it is
// sent and shared exactly as the value would be.
unsafe impl<T: ?Sized + Send> Send for Owned<T> {}
unsafe impl<T: ?Sized + Sync> Sync for Owned<T> {}
