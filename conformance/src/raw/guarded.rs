//! Guarded output buffers: an output struct inside a larger buffer of
//! filler bytes, so a write past `struct_size` or on failure shows.

use crate::sink::Log;
use memplug_sdk::abi::*;

/// Filler of guarded output buffers.
pub(crate) const FILL: u8 = 0xa5;
/// Bytes of a guarded output buffer (every ABI 1.0 output fits well inside).
const GUARDED: usize = 128;

/// An output struct inside a larger buffer whose other bytes are `FILL`:
/// after the call, a byte past `struct_size` that changed is an overrun.
#[repr(C, align(8))]
pub(crate) struct Guarded {
    bytes: [u8; GUARDED],
    declared: u32,
}

impl Guarded {
    pub(crate) fn new(declared: u32) -> Self {
        let mut g = Guarded { bytes: [FILL; GUARDED], declared };
        g.bytes[..4].copy_from_slice(&declared.to_ne_bytes());
        g
    }

    pub(crate) fn ptr<T>(&mut self) -> *mut T {
        self.bytes.as_mut_ptr().cast()
    }

    /// The struct as written (fields past `struct_size` read as `FILL`).
    pub(crate) fn read<T: Copy>(&self) -> T {
        assert!(core::mem::size_of::<T>() <= GUARDED);
        // SAFETY: in bounds (checked), and every ABI output is plain data.
        unsafe { self.bytes.as_ptr().cast::<T>().read_unaligned() }
    }

    /// True when no byte past `struct_size` changed.
    pub(crate) fn tail_intact(&self) -> bool {
        let from = (self.declared as usize).min(GUARDED);
        self.bytes[from..].iter().all(|&b| b == FILL)
    }

    /// True when no byte of `[from, to)` changed (fields the writer left
    /// as the kit filled them).
    pub(crate) fn untouched_in(&self, from: usize, to: usize) -> bool {
        self.bytes[from.min(GUARDED)..to.min(GUARDED)].iter().all(|&b| b == FILL)
    }

    /// True when nothing at all changed (the output of a failed call).
    pub(crate) fn untouched(&self) -> bool {
        self.bytes[..4] == self.declared.to_ne_bytes() && self.bytes[4..].iter().all(|&b| b == FILL)
    }

    /// Logs what the call did to the buffer that it must not have done.
    pub(super) fn audit(&self, log: &Log, slot: &'static str, status: MemplugStatus) {
        if !self.tail_intact() {
            log.overrun(slot, format!("wrote past struct_size {} of its output", self.declared));
        }
        if status != MEMPLUG_STATUS_OK && !self.untouched() {
            log.wrote_on_failure(slot, status);
        }
    }
}
