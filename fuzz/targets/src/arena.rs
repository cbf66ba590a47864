//! Fuzz-owned memory with a guard page after every buffer.
//!
//! Each buffer is placed so that it ends exactly where an inaccessible page
//! begins (as far as its alignment allows): a host that reads one byte past
//! a struct or a string the plugin published faults at once, with or
//! without AddressSanitizer (which does not watch `mmap`ed memory).

use rustix::mm::{mmap_anonymous, mprotect, munmap, MapFlags, MprotectFlags, ProtFlags};
use std::ffi::c_void;

/// Where a buffer starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Aligned to `align`, ending as close to the guard page as that allows.
    Aligned(usize),
    /// At an odd address (misaligned for any type wider than a byte),
    /// ending at most one byte before the guard page.
    Odd,
}

/// Buffers with guard pages, unmapped when the arena drops. Not `Send`:
/// it hands out raw pointers.
pub struct GuardedArena {
    page: usize,
    maps: Vec<(*mut c_void, usize)>,
}

impl Default for GuardedArena {
    fn default() -> Self {
        Self::new()
    }
}

impl GuardedArena {
    pub fn new() -> Self {
        GuardedArena { page: rustix::param::page_size(), maps: Vec::new() }
    }

    /// A zero-filled buffer of `len` bytes (at least one) that the next
    /// byte after it cannot be read.
    pub fn alloc(&mut self, len: usize, placement: Placement) -> *mut u8 {
        let len = len.max(1);
        let slack = match placement {
            Placement::Aligned(a) => a.max(1),
            Placement::Odd => 16,
        };
        let rw = (len + slack).div_ceil(self.page) * self.page;
        let total = rw + self.page;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to
        // the range. The guard page is the last page of it.
        let base = unsafe {
            let base = mmap_anonymous(
                std::ptr::null_mut(),
                total,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
            .expect("mmap for the fuzz arena");
            mprotect(base.cast::<u8>().add(rw).cast(), self.page, MprotectFlags::empty())
                .expect("mprotect the guard page");
            base
        };
        self.maps.push((base, total));
        let guard = base as usize + rw;
        let start = match placement {
            Placement::Aligned(a) => (guard - len) & !(a.max(1) - 1),
            Placement::Odd => (guard - len - 1) | 1,
        };
        start as *mut u8
    }

    /// Copies `bytes` into a fresh buffer.
    pub fn bytes(&mut self, bytes: &[u8], placement: Placement) -> *mut u8 {
        let p = self.alloc(bytes.len(), placement);
        // SAFETY: `p` has room for `bytes.len()` bytes (alloc's contract).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
        p
    }
}

impl Drop for GuardedArena {
    fn drop(&mut self) {
        for &(p, len) in &self.maps {
            // SAFETY: mapped by `alloc`, unmapped once, here.
            let _ = unsafe { munmap(p, len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_end_at_their_guard_page() {
        let mut a = GuardedArena::new();
        let page = rustix::param::page_size();
        for len in [1usize, 4, 7, 72, 4096, 5000] {
            let p = a.alloc(len, Placement::Aligned(8)) as usize;
            assert_eq!(p % 8, 0);
            let end = (p + len).div_ceil(page) * page;
            assert!(end - (p + len) < 8, "len {len}: {} bytes of slack", end - (p + len));
            let q = a.alloc(len, Placement::Odd) as usize;
            assert_eq!(q % 2, 1);
            let end = (q + len).div_ceil(page) * page;
            assert!(end - (q + len) <= 1);
        }
    }
}
