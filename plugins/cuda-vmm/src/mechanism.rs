//! Two mechanisms per CUDA device — `cuda<N>-vmm` (device memory) and
//! `cuda<N>-host` (page-locked host memory, see `pinned.rs`) — sharing the
//! device's primary context: their identity, the tables of everything each
//! has handed out, and the checks every call makes before it believes a
//! reference (same discipline as the CPU plugin: mechanism, then device,
//! then the handle against its table).

use crate::allocator::Allocation;
use crate::context::DeviceContext;
use crate::driver::{DeviceInfo, Driver, HostAlloc, Vmm};
use crate::handles::Table;
use crate::loss::LossLine;
use crate::shared::Physical;
use crate::streams::{FenceEntry, StreamEntry, Waiters};
use crate::virtual_backing::Reservation;
use memplug_sdk::abi::{MemplugDevice, MEMPLUG_DEVICE_CUDA, MEMPLUG_DEVICE_CUDA_HOST};
use memplug_sdk::{MechanismState, ObjectRef, PluginError, PluginResult, Request, Status};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// Alignment every allocation has: what `cuMemAlloc` guarantees (the CUDA
/// programming guide: any address returned by the driver's or runtime's
/// allocation routines is aligned to at least 256 bytes; the pinned
/// mechanism checks each block it gets against it, see `pinned.rs`).
pub const MIN_ALIGNMENT: u64 = 256;
/// Largest alignment `allocate` honours (by over-allocating), on both
/// mechanisms of a device (the device mechanism: or its granularity, when
/// larger).
pub const MAX_ALIGNMENT: u64 = 2 << 20;

/// Which memory a mechanism hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MechanismKind {
    /// Device memory: `cuda<N>-vmm`, device `MEMPLUG_DEVICE_CUDA` N.
    Device,
    /// Page-locked host memory: `cuda<N>-host`, device
    /// `MEMPLUG_DEVICE_CUDA_HOST` N.
    PinnedHost,
}

/// Where the ids of pinned-host mechanisms start: above every id a device
/// mechanism can have (ordinals are `u32`, so those end at 2^32).
const PINNED_ID_BASE: u64 = 1 << 32;

/// The id of the mechanism of `kind` for device `ordinal`: the one place
/// the scheme is written. Never zero; device mechanisms have 1..=2^32,
/// pinned-host ones 2^32+1..=2^33, so no two mechanisms of a plugin share
/// one.
pub fn mechanism_id_of(kind: MechanismKind, ordinal: u32) -> u64 {
    let base = match kind {
        MechanismKind::Device => 0,
        MechanismKind::PinnedHost => PINNED_ID_BASE,
    };
    base + u64::from(ordinal) + 1
}

/// The name of the mechanism of `kind` for device `ordinal`.
pub fn mechanism_name_of(kind: MechanismKind, ordinal: u32) -> String {
    match kind {
        MechanismKind::Device => format!("cuda{ordinal}-vmm"),
        MechanismKind::PinnedHost => format!("cuda{ordinal}-host"),
    }
}

/// The name of the device mechanism of device `ordinal`.
pub fn mechanism_name(ordinal: u32) -> String {
    mechanism_name_of(MechanismKind::Device, ordinal)
}

/// The id of the device mechanism of device `ordinal` (never zero).
pub fn mechanism_id(ordinal: u32) -> u64 {
    mechanism_id_of(MechanismKind::Device, ordinal)
}

/// The name of the pinned-host mechanism of device `ordinal`.
pub fn pinned_mechanism_name(ordinal: u32) -> String {
    mechanism_name_of(MechanismKind::PinnedHost, ordinal)
}

/// The id of the pinned-host mechanism of device `ordinal` (never zero,
/// never a device mechanism's).
pub fn pinned_mechanism_id(ordinal: u32) -> u64 {
    mechanism_id_of(MechanismKind::PinnedHost, ordinal)
}

/// What a mechanism knows of the other mechanism of its device, to judge
/// copy ranges in the other's memory (`copy.rs`).
pub(crate) enum Sibling {
    /// A device mechanism without a pinned one (the driver lacks
    /// `cuMemHostAlloc`).
    None,
    /// On a device mechanism: its pinned sibling's blocks (a table, not the
    /// mechanism, so the two hold no cycle and both are freed at unload).
    PinnedBlocks(Arc<Table<Allocation>>),
    /// On a pinned mechanism: the device mechanism.
    Device(MechanismState<CudaMechanism>),
}

/// State of one mechanism of a device.
pub struct CudaMechanism {
    /// Declared first, so dropped (its threads joined) first, at unload.
    pub(crate) waiters: Waiters,
    pub(crate) kind: MechanismKind,
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) device: MemplugDevice,
    pub(crate) driver: &'static Driver,
    /// The VMM entry points, when the device supports VMM.
    pub(crate) vmm: Option<Vmm>,
    /// VMM granularity (zero without VMM).
    pub(crate) granularity: u64,
    pub(crate) ctx: Arc<DeviceContext>,
    /// `cuMemAlloc` blocks, or on a pinned mechanism `cuMemHostAlloc`
    /// blocks (shared with the device mechanism's [`Sibling`]).
    pub(crate) allocations: Arc<Table<Allocation>>,
    /// The pinned-memory entry points (a pinned mechanism only).
    pub(crate) host_alloc: Option<HostAlloc>,
    pub(crate) sibling: Sibling,
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
    /// The device mechanism of one device, nothing alive; `loss` is the
    /// plugin instance's line to its hosts. `pinned_blocks`: the table of
    /// the device's pinned mechanism, when it has one (made next, with
    /// [`CudaMechanism::pinned`]).
    pub fn new(
        driver: &'static Driver,
        info: &DeviceInfo,
        loss: Arc<LossLine>,
        pinned_blocks: Option<Arc<Table<Allocation>>>,
    ) -> Self {
        let vmm = info.vmm_granularity.and(driver.vmm);
        let mut lost_ids = vec![mechanism_id(info.ordinal)];
        if pinned_blocks.is_some() {
            // One context, one loss: both mechanisms are reported.
            lost_ids.push(pinned_mechanism_id(info.ordinal));
        }
        let ctx = DeviceContext::new(driver, info.device, info.ordinal, lost_ids, loss);
        let granularity = if vmm.is_some() { info.vmm_granularity.unwrap_or(0) } else { 0 };
        let sibling = pinned_blocks.map_or(Sibling::None, Sibling::PinnedBlocks);
        let mut m = Self::empty(MechanismKind::Device, info.ordinal, driver, ctx, Arc::default(), sibling);
        (m.vmm, m.granularity) = (vmm, granularity);
        m
    }

    /// The pinned-host mechanism of `device`'s device: the same primary
    /// context (and so the same loss), `blocks` the table `device` was
    /// given. `None` when the driver lacks the pinned-memory entry points.
    pub(crate) fn pinned(
        device: MechanismState<CudaMechanism>,
        blocks: Arc<Table<Allocation>>,
    ) -> Option<Self> {
        let host_alloc = device.driver.host_alloc?;
        let (ordinal, driver, ctx) = (device.device.ordinal, device.driver, Arc::clone(&device.ctx));
        let mut m =
            Self::empty(MechanismKind::PinnedHost, ordinal, driver, ctx, blocks, Sibling::Device(device));
        m.host_alloc = Some(host_alloc);
        Some(m)
    }

    /// A mechanism of `kind` for device `ordinal` with nothing alive, no
    /// VMM and no pinned-memory entry points (the constructors add theirs).
    fn empty(
        kind: MechanismKind,
        ordinal: u32,
        driver: &'static Driver,
        ctx: Arc<DeviceContext>,
        allocations: Arc<Table<Allocation>>,
        sibling: Sibling,
    ) -> Self {
        let device_kind = match kind {
            MechanismKind::Device => MEMPLUG_DEVICE_CUDA,
            MechanismKind::PinnedHost => MEMPLUG_DEVICE_CUDA_HOST,
        };
        CudaMechanism {
            waiters: Waiters::default(),
            kind,
            id: mechanism_id_of(kind, ordinal),
            name: mechanism_name_of(kind, ordinal),
            device: MemplugDevice { kind: device_kind, ordinal },
            driver,
            vmm: None,
            granularity: 0,
            ctx,
            allocations,
            host_alloc: None,
            sibling,
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
                "{what} names device (kind {}, ordinal {}); mechanism \"{}\" serves only device (kind {}, \
                 ordinal {})",
                d.kind, d.ordinal, self.name, self.device.kind, self.device.ordinal
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mechanism_ids_are_never_zero_and_never_shared() {
        use MechanismKind::{Device, PinnedHost};
        let ordinals = [0, 1, 2, 7, 1 << 16, u32::MAX - 1, u32::MAX];
        let mut ids: Vec<u64> = Vec::new();
        for &n in &ordinals {
            for kind in [Device, PinnedHost] {
                let id = mechanism_id_of(kind, n);
                assert_ne!(id, 0, "{kind:?} {n}");
                ids.push(id);
            }
            // The ranges are apart: every device id below every pinned id.
            assert!(mechanism_id_of(Device, n) <= PINNED_ID_BASE, "{n}");
            assert!(mechanism_id_of(PinnedHost, n) > PINNED_ID_BASE, "{n}");
        }
        let all = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), all, "two mechanisms share an id");
        assert_eq!((mechanism_id(0), pinned_mechanism_id(0)), (1, (1 << 32) + 1));
        assert_eq!(
            (mechanism_name(3), pinned_mechanism_name(3)),
            ("cuda3-vmm".to_string(), "cuda3-host".to_string())
        );
    }
}
