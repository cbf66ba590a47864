//! [`ManagedTensor`]: one exported `DLManagedTensorVersioned` and what
//! keeps its memory alive, in one heap block the deleter frees.

use super::abi::*;
use super::layout::Checked;
use crate::deferred::{DeferredFreeQueue, Retire, RetireOutcome};
use crate::fence::SharedFence;
use std::ffi::c_void;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;

/// What the deleter releases: the memory's owner, and the fences its
/// release waits for (through the owner's deferred-free queue).
pub(crate) struct Keep {
    pub(crate) owner: Box<dyn Send>,
    pub(crate) fences: Vec<SharedFence>,
    pub(crate) queue: Arc<DeferredFreeQueue>,
    pub(crate) what: String,
}

/// The block behind every exported tensor: the struct the consumer sees
/// first (so a pointer to it is a pointer to the block), then the arrays
/// its pointers point into, then the owner.
#[repr(C)]
struct Block {
    tensor: DLManagedTensorVersioned,
    shape: Box<[i64]>,
    strides: Box<[i64]>,
    /// The bytes are mapped without write access (a shared prefix mapped
    /// read-only): a write through the tensor faults, whatever the flag
    /// says. Never crosses to the consumer; the producer decides with it.
    memory_read_only: bool,
    keep: Keep,
}

/// How a tensor is flagged and what its memory is.
pub(crate) struct Marks {
    /// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer is told not to write.
    pub(crate) read_only: bool,
    /// The memory itself cannot be written (implies `read_only`).
    pub(crate) memory_read_only: bool,
    /// `DLPACK_FLAG_BITMASK_IS_COPIED`: a private copy.
    pub(crate) copied: bool,
}

/// An exported tensor not yet handed to a consumer. Dropping it runs the
/// deleter; [`into_raw`](Self::into_raw) hands it over (the consumer then
/// calls the deleter, once, from any thread).
pub struct ManagedTensor(NonNull<DLManagedTensorVersioned>);

// SAFETY: the block owns everything it points to; its owner is `Send` and
// the deleter may run on any thread.
unsafe impl Send for ManagedTensor {}

impl fmt::Debug for ManagedTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.tensor();
        write!(
            f,
            "ManagedTensor({:p} on {}:{}, shape {:?}, flags {:#x})",
            t.dl_tensor.data,
            t.dl_tensor.device.device_type,
            t.dl_tensor.device.device_id,
            self.shape(),
            t.flags
        )
    }
}

impl ManagedTensor {
    pub(crate) fn new(
        data: u64,
        device: DLDevice,
        dtype: DLDataType,
        shape: &[i64],
        checked: Checked,
        marks: Marks,
        keep: Keep,
    ) -> Self {
        let flags = if marks.read_only || marks.memory_read_only { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 }
            | if marks.copied { DLPACK_FLAG_BITMASK_IS_COPIED } else { 0 };
        let mut block = Box::new(Block {
            tensor: DLManagedTensorVersioned {
                version: DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete),
                flags,
                dl_tensor: DLTensor {
                    // DLPack asks for NULL when there is no element.
                    data: if checked.empty {
                        std::ptr::null_mut()
                    } else {
                        (data + checked.first) as *mut c_void
                    },
                    device,
                    ndim: shape.len() as i32,
                    dtype,
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    // `data` points at the first element already: consumers
                    // that ignore the offset see the same tensor.
                    byte_offset: 0,
                },
            },
            shape: shape.into(),
            strides: checked.strides.into(),
            memory_read_only: marks.memory_read_only,
            keep,
        });
        // Boxed slices do not move when the box around them does.
        block.tensor.dl_tensor.shape = block.shape.as_mut_ptr();
        block.tensor.dl_tensor.strides = block.strides.as_mut_ptr();
        let raw = Box::into_raw(block);
        // SAFETY: just allocated; `tensor` is the first field of a
        // `#[repr(C)]` struct, so the pointers coincide.
        unsafe {
            (*raw).tensor.manager_ctx = raw.cast();
            ManagedTensor(NonNull::new_unchecked(raw.cast()))
        }
    }

    /// The struct as a consumer reads it.
    pub fn tensor(&self) -> &DLManagedTensorVersioned {
        // SAFETY: owned and alive until drop or `into_raw`.
        unsafe { self.0.as_ref() }
    }
    /// The first element's address (0 for a tensor of no elements).
    pub fn data(&self) -> u64 {
        self.tensor().dl_tensor.data as u64
    }
    /// Extents.
    pub fn shape(&self) -> &[i64] {
        let t = &self.tensor().dl_tensor;
        // SAFETY: `ndim` elements in the block's own array.
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }
    }
    /// Strides in elements.
    pub fn strides(&self) -> &[i64] {
        let t = &self.tensor().dl_tensor;
        // SAFETY: as `shape`.
        unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) }
    }
    /// Whether the consumer is told not to write (`DLPACK_FLAG_BITMASK_READ_ONLY`).
    pub fn is_read_only(&self) -> bool {
        self.tensor().flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0
    }
    /// Whether the memory itself is mapped without write access (a view
    /// touching a shared prefix mapped read-only): a consumer that ignores
    /// the read-only flag (PyTorch does) and writes would fault and kill
    /// the process. Hand such a tensor only to a consumer known to honour
    /// the flag, or hand out a [`private_copy`](super::private_copy).
    pub fn memory_is_read_only(&self) -> bool {
        // SAFETY: the block behind every tensor `new` made.
        unsafe { (*self.0.as_ptr().cast::<Block>()).memory_read_only }
    }
    /// Whether this is a private copy (`DLPACK_FLAG_BITMASK_IS_COPIED`).
    pub fn is_copy(&self) -> bool {
        self.tensor().flags & DLPACK_FLAG_BITMASK_IS_COPIED != 0
    }
    /// The deferred-free queue its owner is released through.
    pub(crate) fn queue(&self) -> Arc<DeferredFreeQueue> {
        // SAFETY: as `memory_is_read_only`.
        unsafe { (*self.0.as_ptr().cast::<Block>()).keep.queue.clone() }
    }
    /// Hands the tensor over: the receiver must call its `deleter` exactly
    /// once (from any thread, at any time, even after the manager is gone).
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }
    /// Takes back a tensor [`into_raw`](Self::into_raw) handed out.
    ///
    /// # Safety
    /// `p` must come from `into_raw` and its deleter must not have run.
    pub unsafe fn from_raw(p: *mut DLManagedTensorVersioned) -> Self {
        ManagedTensor(NonNull::new(p).expect("a tensor from into_raw"))
    }
}

impl Drop for ManagedTensor {
    fn drop(&mut self) {
        // SAFETY: ours; the deleter runs once.
        unsafe { delete(self.0.as_ptr()) }
    }
}

/// The deleter every exported tensor carries: releases the owner (after its
/// fences, through its deferred-free queue) and the block. Never unwinds
/// into the consumer: a panic while releasing is caught, and what it was
/// releasing stays allocated (never freed on a guess).
unsafe extern "C" fn delete(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` is a block made by `ManagedTensor::new` (the consumer's
    // contract: the deleter of the tensor it was given, called once).
    let block = unsafe { Box::from_raw(p.cast::<Block>()) };
    let _ = catch_unwind(AssertUnwindSafe(move || {
        let Block { keep, .. } = *block;
        let Keep { owner, fences, queue, what } = keep;
        if fences.is_empty() {
            drop(owner);
        } else {
            queue.release(fences, Box::new(DropOwner { owner: Some(owner), what }));
        }
    }));
}

/// The deferred-free job of an export with fences: dropping the owner frees
/// through memplug (the owner's own release does the accounting).
struct DropOwner {
    owner: Option<Box<dyn Send>>,
    what: String,
}

impl Retire for DropOwner {
    fn retire(mut self: Box<Self>) -> RetireOutcome {
        drop(self.owner.take());
        RetireOutcome::Freed { bytes: 0 }
    }
    fn describe(&self) -> String {
        format!("DLPack export of {}", self.what)
    }
}
