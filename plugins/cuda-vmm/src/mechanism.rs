//! One mechanism per CUDA device (`cuda0-vmm`, `cuda1-vmm`, …): its identity,
//! the tables of everything it has handed out, and the checks every call
//! makes before it believes a reference (same discipline as the CPU
//! plugin: mechanism, then device, then the handle against its table).

use crate::allocator::Allocation;
use crate::context::DeviceContext;
use crate::driver::{DeviceInfo, Driver, Vmm};
use crate::handles::Table;
use crate::loss::LossLine;
use crate::shared::Physical;
use crate::streams::{FenceEntry, StreamEntry, Waiters};
use crate::virtual_backing::Reservation;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CUDA};
use memplug_sdk::{ObjectRef, PluginError, PluginResult, Request, Status};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// Alignment every allocation has: what `cuMemAlloc` guarantees.
pub const MIN_ALIGNMENT: u64 = 256;
/// Largest alignment `allocate` honours (by over-allocating).
pub const MAX_ALIGNMENT: u64 = 2 << 20;

/// The name of the mechanism of device `ordinal`.
pub fn mechanism_name(ordinal: u32) -> String {
    format!("cuda{ordinal}-vmm")
}

/// The id of the mechanism of device `ordinal` (never zero).
pub fn mechanism_id(ordinal: u32) -> u64 {
    u64::from(ordinal) + 1
}

/// State of one device's mechanism.
pub struct CudaMechanism {
    /// Declared first, so dropped (its threads joined) first, at unload.
    pub(crate) waiters: Waiters,
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) device: MemplugDevice,
    pub(crate) driver: &'static Driver,
    /// The VMM entry points, when the device supports VMM.
    pub(crate) vmm: Option<Vmm>,
    /// VMM granularity (zero without VMM).
    pub(crate) granularity: u64,
    pub(crate) ctx: Arc<DeviceContext>,
    pub(crate) allocations: Table<Allocation>,
    pub(crate) reservations: Table<Arc<Reservation>>,
    pub(crate) physical: Table<Physical>,
    pub(crate) streams: Table<Arc<StreamEntry>>,
    pub(crate) fences: Table<FenceEntry>,
    serial: AtomicU32,
    /// Whether one `cuMemUnmap` may cover several adjacent granule
    /// mappings; cleared the first time the driver refuses that (and then
    /// takes the granules one by one).
    pub(crate) batch_unmap: AtomicBool,
}

impl CudaMechanism {
    /// The mechanism of one device, nothing alive; `loss` is the plugin
    /// instance's line to its hosts.
    pub fn new(driver: &'static Driver, info: &DeviceInfo, loss: Arc<LossLine>) -> Self {
        let vmm = info.vmm_granularity.and(driver.vmm);
        CudaMechanism {
            waiters: Waiters::default(),
            id: mechanism_id(info.ordinal),
            name: mechanism_name(info.ordinal),
            device: MemplugDevice { kind: MEMPLUG_DEVICE_CUDA, ordinal: info.ordinal },
            driver,
            vmm,
            granularity: if vmm.is_some() { info.vmm_granularity.unwrap_or(0) } else { 0 },
            ctx: DeviceContext::new(driver, info.device, info.ordinal, mechanism_id(info.ordinal), loss),
            allocations: Table::default(),
            reservations: Table::default(),
            physical: Table::default(),
            streams: Table::default(),
            fences: Table::default(),
            serial: AtomicU32::new(1),
            batch_unmap: AtomicBool::new(true),
        }
    }

    /// Whether virtual backing and shared mapping are published.
    pub fn has_vmm(&self) -> bool {
        self.vmm.is_some()
    }

    /// Allocations + reservations + physical objects (until their memory is
    /// gone) + streams + fences alive now.
    pub fn live_objects(&self) -> u64 {
        (self.allocations.len()
            + self.reservations.len()
            + self.physical.len()
            + self.streams.len()
            + self.fences.len()) as u64
    }

    /// A fresh serial number for a stream or fence handle.
    pub(crate) fn serial(&self) -> u32 {
        self.serial.fetch_add(1, Ordering::Relaxed)
    }

    /// The VMM entry points, or `UNSUPPORTED` (the slots are not published
    /// then; this only guards against a caller that ignores that).
    pub(crate) fn vmm(&self, call: &str) -> PluginResult<Vmm> {
        self.vmm.ok_or_else(|| {
            PluginError::unsupported(format!(
                "{call}: device {} does not support CUDA virtual memory management",
                self.device.ordinal
            ))
        })
    }

    fn is_ours(&self, d: &MemplugDevice) -> bool {
        *d == self.device
    }

    /// Refuses a reference made by another mechanism (`WRONG_MECHANISM`) or
    /// naming another device (`WRONG_DEVICE`), in that order.
    pub(crate) fn check_owner(&self, obj: &ObjectRef, what: &str) -> PluginResult<()> {
        if obj.mechanism_id != self.id {
            return Err(PluginError::new(
                Status::WrongMechanism,
                format!(
                    "{what} belongs to mechanism {}, not to \"{}\" (id {})",
                    obj.mechanism_id, self.name, self.id
                ),
            ));
        }
        if !self.is_ours(&obj.device) {
            return Err(self.wrong_device(what, &obj.device));
        }
        Ok(())
    }

    #[cold]
    fn wrong_device(&self, what: &str, d: &MemplugDevice) -> PluginError {
        PluginError::new(
            Status::WrongDevice,
            format!(
                "{what} names device (kind {}, ordinal {}); mechanism \"{}\" serves only CUDA device {}",
                d.kind, d.ordinal, self.name, self.device.ordinal
            ),
        )
    }

    /// The `UNKNOWN_ALLOCATION` failure for a reference no table accepted.
    #[cold]
    pub(crate) fn unknown(&self, obj: &ObjectRef, what: &str) -> PluginError {
        PluginError::unknown_allocation(format!(
            "{what} (handle {}, object_id {}, addr {:#x}, size {}) does not name a live {what} of mechanism \
             \"{}\": never made, already freed, being freed, or altered",
            obj.handle, obj.object_id, obj.addr, obj.size, self.name
        ))
    }

    /// What `allocate`, `reserve` and `create` check first: the device, no
    /// flag bits (ABI 1.0 defines none), a non-zero size.
    pub(crate) fn check_request(&self, r: &Request, what: &str) -> PluginResult<()> {
        if !self.is_ours(&r.device) {
            return Err(self.wrong_device(what, &r.device));
        }
        if r.flags != 0 {
            return Err(PluginError::invalid_argument(format!(
                "{what}: request flags {:#x} are unknown (ABI 1.0 defines none)",
                r.flags
            )));
        }
        if r.size == 0 {
            return Err(PluginError::invalid_argument(format!("{what}: size is zero")));
        }
        Ok(())
    }

    /// `size` rounded up to the granularity; `OUT_OF_MEMORY` when that
    /// does not fit in 64 bits or in the address space.
    pub(crate) fn round_up(&self, size: u64, what: &str) -> PluginResult<u64> {
        size.checked_next_multiple_of(self.granularity).filter(|&s| usize::try_from(s).is_ok()).ok_or_else(
            || {
                PluginError::out_of_memory(format!(
                    "{what}: {size} bytes cannot be rounded to whole granules of {:#x} bytes",
                    self.granularity
                ))
            },
        )
    }

    /// Checks `[offset, offset + len)` inside an object of `limit` bytes:
    /// non-empty, granularity-aligned, no overflow, in bounds (all
    /// `OUT_OF_RANGE`). Returns the end.
    pub(crate) fn check_range(&self, offset: u64, len: u64, limit: u64, what: &str) -> PluginResult<u64> {
        let g = self.granularity;
        let fail = |why: String| {
            Err(PluginError::out_of_range(format!("{what} range (offset {offset:#x}, len {len:#x}) {why}")))
        };
        if len == 0 {
            return fail("is empty".into());
        }
        if offset % g != 0 || len % g != 0 {
            return fail(format!("is not aligned to the granularity of {g:#x} bytes"));
        }
        let Some(end) = offset.checked_add(len) else {
            return fail("overflows: offset + len exceeds 2^64".into());
        };
        if end > limit {
            return fail(format!("ends past the {limit:#x} bytes of the object"));
        }
        Ok(end)
    }
}

/// One slot call in progress (see [`CudaMechanism::slot`]): when it ends, a
/// sticky driver error seen on this thread marks the context dead (and
/// reports the loss, before the slot returns), and the thread's status for
/// sticky errors is put back.
pub(crate) struct Slot<'a> {
    m: &'a CudaMechanism,
    sticky_status: Status,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        crate::driver::set_sticky_status(self.sticky_status);
        if let Some(e) = crate::driver::take_sticky() {
            self.m.ctx.mark_dead(&e);
        }
    }
}

impl CudaMechanism {
    /// What every slot does first: refuse a call made from inside a host
    /// function this plugin launched (`BUSY`: CUDA forbids any driver call
    /// there, and the driver may run the host functions of every stream on
    /// one thread, so waiting there can deadlock), and refuse everything
    /// once the context is dead (the first sticky error's message, no
    /// driver call). A dead context, and a sticky error met during the
    /// slot, is `DEVICE_LOST` once a 1.2 host holds the instance and
    /// `DEVICE_UNAVAILABLE` before (see `loss.rs`). The answer is held for
    /// the slot's duration.
    #[inline]
    pub(crate) fn slot(&self, call: &str) -> PluginResult<Slot<'_>> {
        if crate::streams::in_host_fn() {
            return Err(PluginError::new(
                Status::Busy,
                format!(
                    "{call}: called from inside a host function; CUDA forbids driver calls there (and may run \
                     every stream's host functions on one thread, so waiting there could deadlock): call it \
                     from another thread"
                ),
            ));
        }
        let status = self.ctx.loss().lost_status();
        if let Some(why) = self.ctx.dead() {
            // Reported now if the context died before a 1.2 host came.
            self.ctx.notice_loss();
            return Err(PluginError::new(status, format!("{call}: {why}")));
        }
        // Nothing noted on this thread belongs to this slot yet.
        let _ = crate::driver::take_sticky();
        Ok(Slot { m: self, sticky_status: crate::driver::set_sticky_status(status) })
    }
}

/// `INVALID_STATE`, saying nothing was changed.
#[cold]
pub(crate) fn wrong_state(msg: String) -> PluginError {
    PluginError::invalid_state(format!("{msg}; nothing was changed"))
}
