//! [`private_copy`]: a tensor's bytes copied into memory of its own, for a
//! consumer that must be able to write whatever it was shown (PyTorch
//! ignores DLPack's read-only flag, so a zero-copy view of a prefix mapped
//! read-only would fault on its first write).

use super::abi::*;
use super::layout::Checked;
use super::tensor::{Keep, Marks};
use super::{ExportError, ManagedTensor};
use std::alloc::{alloc, dealloc, Layout};

/// Alignment of a copy: a cache line, at least what any dtype needs.
const ALIGN: usize = 64;

/// The copy's bytes: process memory (the consumer's, as a copy it made
/// itself would be), not charged to any pool.
struct Buffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by the buffer alone.
unsafe impl Send for Buffer {}

impl Buffer {
    fn new(len: usize) -> Option<Buffer> {
        if len == 0 {
            return Some(Buffer { ptr: std::ptr::null_mut(), len: 0 });
        }
        let layout = Layout::from_size_align(len, ALIGN).ok()?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { alloc(layout) };
        (!ptr.is_null()).then_some(Buffer { ptr, len })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated by `new` with this layout.
            unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, ALIGN)) }
        }
    }
}

/// A private copy of what `t` shows: the same shape, dtype and strides over
/// a new buffer holding the bytes the tensor reaches, flagged
/// `DLPACK_FLAG_BITMASK_IS_COPIED`, writable unless `read_only`. The copy
/// is ordinary process memory, not charged to any pool (like a copy the
/// consumer makes itself), and its deleter frees it. `t` stays as it was.
///
/// Only CPU memory is copied ([`ExportError::NotCopyable`] otherwise): the
/// host reads it with the CPU. The caller waits for device work that may
/// still write the bytes first, as for any export to the host.
pub fn private_copy(t: &ManagedTensor, read_only: bool) -> Result<ManagedTensor, ExportError> {
    let d = &t.tensor().dl_tensor;
    if d.device.device_type != K_DL_CPU {
        return Err(ExportError::NotCopyable {
            device: format!("{}:{}", d.device.device_type, d.device.device_id),
        });
    }
    let item = u64::from(d.dtype.bits) * u64::from(d.dtype.lanes) / 8;
    let (shape, strides) = (t.shape().to_vec(), t.strides().to_vec());
    let empty = d.data.is_null() || shape.contains(&0);
    // Elements before and after element 0 the strides reach (the export
    // checked that the whole range is inside its memory).
    let (mut lo, mut hi) = (0i64, 0i64);
    if !empty {
        for (&e, &s) in shape.iter().zip(&strides) {
            let reach = (e - 1) * s;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
    }
    let item = item as i64;
    let len = if empty { 0 } else { ((hi - lo + 1) * item) as usize };
    let buf =
        Buffer::new(len).ok_or_else(|| ExportError::Layout(format!("cannot allocate {len} B for a copy")))?;
    if len != 0 {
        // SAFETY: the export checked that `[data + lo*item, data +
        // (hi+1)*item)` lies in its memory, which `t` keeps alive and the
        // CPU can read (kDLCPU); the buffer is new and `len` long.
        unsafe {
            let from = d.data.cast::<u8>().offset((lo * item) as isize);
            std::ptr::copy_nonoverlapping(from, buf.ptr, len);
        }
    }
    let checked = Checked { strides, start: 0, end: len as u64, first: (-lo * item) as u64, empty };
    let addr = buf.ptr as u64;
    let keep = Keep {
        owner: Box::new(buf),
        fences: Vec::new(),
        queue: t.queue(),
        what: format!("private copy of {len} B at {addr:#x}"),
    };
    let marks = Marks { read_only, memory_read_only: false, copied: true };
    Ok(ManagedTensor::new(addr, d.device, d.dtype, &shape, checked, marks, keep))
}
