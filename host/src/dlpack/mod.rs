//! DLPack export: memplug memory handed to array libraries (NumPy, PyTorch,
//! JAX, CuPy...) as a `DLManagedTensorVersioned` (DLPack 1.x, the vendored
//! `include/dlpack/dlpack.h`), without a copy.
//!
//! * [`export`] hands over an [`OwnedAllocation`], a [`CachedAllocation`]
//!   or an `Arc` of either (several tensors over one allocation);
//!   [`SharedRegion::to_dlpack`] a view of a region's usable bytes.
//! * The device is the mechanism's: `MEMPLUG_DEVICE_*` kinds are DLPack's
//!   device types, and the ordinal is the device id. A kind in the vendor
//!   range has no DLPack number and is refused.
//! * Shape, dtype, strides and offset are the caller's ([`TensorLayout`]),
//!   checked to stay inside the memory.
//! * `DLPACK_FLAG_BITMASK_READ_ONLY` is set when asked, and always for a
//!   region view touching a shared prefix mapped read-only; such a tensor
//!   also says so ([`ManagedTensor::memory_is_read_only`]), since a
//!   consumer that ignores the flag (PyTorch) faults on its first write:
//!   the producer decides who gets it, or hands out a [`private_copy`]
//!   (CPU memory), which is writable and flagged `IS_COPIED`.
//! * The deleter owns what keeps the memory alive (the allocation itself, or
//!   a reference-counted hold on it), never a borrowed entry: it frees
//!   through memplug — after the export's fences, through the deferred-free
//!   queue, when fences were given — from any thread, at any time, also
//!   after the manager is gone. It never unwinds into the consumer.

mod abi;
mod copy;
mod layout;
mod region;
mod tensor;

pub use abi::*;
pub use copy::private_copy;
pub use layout::TensorLayout;
pub use region::{check_region, SharedRegion};
pub use tensor::ManagedTensor;

use crate::binding::BindingInner;
use crate::cache::CachedAllocation;
use crate::deferred::DeferredFreeQueue;
use crate::fence::SharedFence;
use crate::mechanism::Device;
use crate::OwnedAllocation;
use memplug_sdk::abi::{MEMPLUG_DEVICE_VENDOR_FIRST, MEMPLUG_DEVICE_VENDOR_LAST};
use std::fmt;
use std::sync::Arc;
use tensor::{Keep, Marks};

/// Why an export was refused. Nothing was exported, nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// The mechanism's device kind has no DLPack number (the vendor range).
    #[error("device {device} has no DLPack device type")]
    NotDlpackDevice {
        /// The device, as the host names it.
        device: String,
    },
    /// The memory went with a lost device.
    #[error("{what} went with a lost device: its memory is gone")]
    Lost {
        /// What was to be exported.
        what: String,
    },
    /// The layout is malformed (negative extent, sub-byte dtype, strides
    /// that do not match the shape or reach before the memory's start).
    #[error("tensor layout: {0}")]
    Layout(String),
    /// A private copy was asked of memory the host cannot read with the
    /// CPU (device memory).
    #[error(
        "device {device}: memplug copies only CPU memory; make the bytes writable first (Region.privatise \
         gives a region private pages of its prefix) or export without a copy"
    )]
    NotCopyable {
        /// The device, as DLPack numbers it (`device_type:device_id`).
        device: String,
    },
    /// The layout reaches past the memory.
    #[error("the tensor needs {needed} B from the memory's start; it has {available} B")]
    OutOfBounds {
        /// Bytes from the memory's start the layout reaches.
        needed: u64,
        /// Usable bytes of the memory.
        available: u64,
    },
}

/// A refused [`export`]: the error, and the source back, untouched.
pub struct Refused<S> {
    /// What was to be exported, as it was.
    pub source: S,
    /// Why.
    pub error: ExportError,
}

impl<S> fmt::Debug for Refused<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Refused({:?})", self.error)
    }
}

impl<S> fmt::Display for Refused<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<S> std::error::Error for Refused<S> {}

/// How an export is made beyond its layout.
#[derive(Clone, Default)]
pub struct ExportOptions {
    /// Tell the consumer not to write (`DLPACK_FLAG_BITMASK_READ_ONLY`).
    pub read_only: bool,
    /// Device work that may still use the memory when the consumer calls
    /// the deleter: the memory is released only after these fences.
    pub fences: Vec<SharedFence>,
}

impl fmt::Debug for ExportOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportOptions")
            .field("read_only", &self.read_only)
            .field("fences", &self.fences.len())
            .finish()
    }
}

/// Memory [`export`] can hand over: [`OwnedAllocation`],
/// [`CachedAllocation`], and an `Arc` of either. Sealed.
pub trait DlpackSource: sealed::Source + Send + 'static {}

mod sealed {
    /// What an exporter needs of its source.
    pub trait Source {
        fn memory(&self) -> super::Memory;
    }
}

/// The memory behind a source, as an export sees it.
#[doc(hidden)]
pub struct Memory {
    device: Device,
    addr: u64,
    len: u64,
    /// Byte ranges `[start, end)` from `addr` mapped without write access
    /// (a shared prefix mapped read-only, less its privatised parts).
    read_only: Vec<(u64, u64)>,
    lost: bool,
    queue: Arc<DeferredFreeQueue>,
    what: String,
}

impl Memory {
    fn of(b: &BindingInner, addr: u64, len: u64, lost: bool, what: String) -> Self {
        Memory {
            device: b.context.mechanism().device(),
            addr,
            len,
            read_only: Vec::new(),
            lost,
            queue: b.queue.clone(),
            what,
        }
    }
}

impl sealed::Source for OwnedAllocation {
    fn memory(&self) -> Memory {
        let what = format!("allocation at {:#x}", self.addr());
        Memory::of(self.binding_inner(), self.addr(), self.size(), self.is_lost(), what)
    }
}
impl DlpackSource for OwnedAllocation {}

impl sealed::Source for CachedAllocation {
    fn memory(&self) -> Memory {
        let what = format!("cached allocation at {:#x}", self.addr());
        Memory::of(self.block().binding_inner(), self.addr(), self.size(), self.is_lost(), what)
    }
}
impl DlpackSource for CachedAllocation {}

impl<T: DlpackSource + Sync> sealed::Source for Arc<T> {
    fn memory(&self) -> Memory {
        (**self).memory()
    }
}
impl<T: DlpackSource + Sync> DlpackSource for Arc<T> {}

/// Exports `source` as a tensor of `layout`; the tensor owns it (the
/// deleter drops it, freeing through memplug). Refused, with `source` given
/// back, when the device has no DLPack type, the memory is lost, or the
/// layout does not fit.
pub fn export<S: DlpackSource>(
    source: S,
    layout: &TensorLayout,
    options: ExportOptions,
) -> Result<ManagedTensor, Refused<S>> {
    let memory = source.memory();
    match prepare(&memory, layout, &options) {
        Ok(p) => Ok(finish(p, memory, layout, options, Box::new(source))),
        Err(error) => Err(Refused { source, error }),
    }
}

/// Whether [`export`] would accept `source` with `layout` (the same
/// checks; nothing is moved): for callers that must refuse before giving
/// the source up.
pub fn check<S: DlpackSource>(
    source: &S,
    layout: &TensorLayout,
    options: &ExportOptions,
) -> Result<(), ExportError> {
    prepare(&source.memory(), layout, options).map(drop)
}

/// The checks of an export, before anything is owned.
struct Prepared {
    device: DLDevice,
    checked: layout::Checked,
    read_only: bool,
    memory_read_only: bool,
}

fn prepare(m: &Memory, layout: &TensorLayout, options: &ExportOptions) -> Result<Prepared, ExportError> {
    if m.lost {
        return Err(ExportError::Lost { what: m.what.clone() });
    }
    let device = dl_device(m.device)?;
    let checked = layout.check(m.len)?;
    let touches_prefix =
        !checked.empty && m.read_only.iter().any(|&(s, e)| checked.start < e && s < checked.end);
    Ok(Prepared { device, read_only: options.read_only, memory_read_only: touches_prefix, checked })
}

fn finish(
    p: Prepared,
    m: Memory,
    layout: &TensorLayout,
    options: ExportOptions,
    owner: Box<dyn Send>,
) -> ManagedTensor {
    let keep = Keep { owner, fences: options.fences, queue: m.queue, what: m.what };
    let marks = Marks { read_only: p.read_only, memory_read_only: p.memory_read_only, copied: false };
    ManagedTensor::new(m.addr, p.device, layout.dtype, &layout.shape, p.checked, marks, keep)
}

/// DLPack's device for a memplug device: the same numbers, refused for the
/// vendor range (and anything that does not fit DLPack's `int32_t`s).
pub fn dl_device(d: Device) -> Result<DLDevice, ExportError> {
    let refuse = || ExportError::NotDlpackDevice { device: d.to_string() };
    let kind = d.0.kind;
    if kind == 0 || (MEMPLUG_DEVICE_VENDOR_FIRST..=MEMPLUG_DEVICE_VENDOR_LAST).contains(&kind) {
        return Err(refuse());
    }
    let device_type = i32::try_from(kind).map_err(|_| refuse())?;
    let device_id = i32::try_from(d.0.ordinal).map_err(|_| refuse())?;
    Ok(DLDevice { device_type, device_id })
}

#[cfg(test)]
mod tests {
    use super::*;
    use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CPU, MEMPLUG_DEVICE_CUDA};

    #[test]
    fn devices_map_to_dlpack_numbers() {
        let d = |kind, ordinal| Device(MemplugDevice { kind, ordinal });
        assert_eq!(dl_device(d(MEMPLUG_DEVICE_CPU, 0)), Ok(DLDevice { device_type: K_DL_CPU, device_id: 0 }));
        assert_eq!(
            dl_device(d(MEMPLUG_DEVICE_CUDA, 3)),
            Ok(DLDevice { device_type: K_DL_CUDA, device_id: 3 })
        );
        assert!(dl_device(d(MEMPLUG_DEVICE_VENDOR_FIRST + 5, 0)).is_err());
        assert!(dl_device(d(0, 0)).is_err());
        assert!(dl_device(d(MEMPLUG_DEVICE_CPU, u32::MAX)).is_err());
    }
}
