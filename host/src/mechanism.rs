//! Safe wrappers over a validated mechanism's vtables.
//!
//! Every call builds a stack sink, calls the slot, and maps the status: a
//! success costs a compare; a failure becomes a [`CallError`] carrying the
//! plugin's message. Objects are checked against the host's key of the
//! mechanism before the plugin sees them (DESIGN.md §2, invariant 1), and the
//! plugin checks them again.

use crate::error::{CallError, ObjectKind, ReleaseError};
use crate::governor::AllocationClass;
use crate::objects::*;
use crate::plugin::PluginShared;
use crate::sink::Capture;
use memplug_sdk::abi::*;
use memplug_sdk::Status;
use std::ffi::c_void;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Capability flags of a mechanism (the ABI 1.1 bits, plus any unknown bits
/// a newer plugin set, which the host ignores).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities(pub u32);

impl Capabilities {
    pub fn allocator(self) -> bool {
        self.0 & MEMPLUG_CAP_ALLOCATOR != 0
    }
    pub fn virtual_backing(self) -> bool {
        self.0 & MEMPLUG_CAP_VIRTUAL_BACKING != 0
    }
    pub fn shared_mapping(self) -> bool {
        self.0 & MEMPLUG_CAP_SHARED_MAPPING != 0
    }
    pub fn sync(self) -> bool {
        self.0 & MEMPLUG_CAP_SYNC != 0
    }
    /// Shared mapping across processes (`export_fd`/`import_fd`, ABI 1.1).
    /// Set only on mechanisms of plugins that agreed on 1.1 or newer: the
    /// loader refuses the bit at 1.0.
    pub fn shared_export(self) -> bool {
        self.0 & MEMPLUG_CAP_SHARED_EXPORT != 0
    }
    /// Bits this host does not know (from a newer minor); ignored.
    pub fn unknown_bits(self) -> u32 {
        self.0 & !MEMPLUG_CAP_ALL_1_1
    }
    /// Names of the known capabilities present.
    pub fn names(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.allocator() {
            v.push("allocator");
        }
        if self.virtual_backing() {
            v.push("virtual_backing");
        }
        if self.shared_mapping() {
            v.push("shared_mapping");
        }
        if self.sync() {
            v.push("sync");
        }
        if self.shared_export() {
            v.push("shared_export");
        }
        v
    }
}

impl fmt::Debug for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.names().join("|"))?;
        if self.unknown_bits() != 0 {
            write!(f, "|unknown({:#x})", self.unknown_bits())?;
        }
        Ok(())
    }
}

/// A device as the host shows it; unknown kinds are kept, never guessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device(pub MemplugDevice);

impl Device {
    pub fn kind_name(self) -> String {
        match self.0.kind {
            MEMPLUG_DEVICE_CPU => "cpu".into(),
            MEMPLUG_DEVICE_CUDA => "cuda".into(),
            k => format!("unknown({k})"),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind_name(), self.0.ordinal)
    }
}

/// Static properties reported by the mechanism at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Properties {
    pub min_alignment: u64,
    pub max_alignment: u64,
    pub granularity: u64,
}

/// The `MEMPLUG_CLASS_*` tag of a governor class (ABI 1.1): the plugin sees
/// what the memory is for.
#[inline]
pub const fn class_tag(class: AllocationClass) -> u32 {
    match class {
        AllocationClass::Weights => MEMPLUG_CLASS_WEIGHTS,
        AllocationClass::Kv => MEMPLUG_CLASS_KV,
        AllocationClass::Activations => MEMPLUG_CLASS_ACTIVATIONS,
        AllocationClass::Workspace => MEMPLUG_CLASS_WORKSPACE,
        AllocationClass::Other => MEMPLUG_CLASS_OTHER,
    }
}

/// Free and total bytes of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

pub(crate) struct MechanismInner {
    pub(crate) key: u64,
    pub(crate) id: u64,
    pub(crate) name: String,
    /// `plugin/mechanism`, for messages.
    pub(crate) label: String,
    pub(crate) device: MemplugDevice,
    pub(crate) caps: Capabilities,
    /// The minor agreed with the plugin.
    pub(crate) minor: u32,
    /// `struct_size` of the requests sent: the 1.1 size (with the class
    /// tag) when the agreed minor is at least 1, else the 1.0 size.
    pub(crate) request_size: u32,
    pub(crate) ctx: *mut c_void,
    pub(crate) props: Properties,
    pub(crate) allocator: MemplugAllocator,
    pub(crate) virtual_backing: Option<MemplugVirtualBacking>,
    pub(crate) shared_mapping: Option<MemplugSharedMapping>,
    pub(crate) sync: Option<MemplugSync>,
    pub(crate) live: [AtomicU64; 5],
    // Last field: dropped after everything above, so the library outlives
    // every pointer into it.
    pub(crate) plugin: Arc<PluginShared>,
}

// SAFETY: `ctx` and the vtables are the plugin's; the ABI requires every
// slot to be callable from any thread concurrently (DESIGN.md §3, Threads).
unsafe impl Send for MechanismInner {}
unsafe impl Sync for MechanismInner {}

/// A validated mechanism of a loaded plugin. Cheap to clone; keeps its
/// plugin's library loaded while any clone is alive. Thread-safe.
#[derive(Clone)]
pub struct Mechanism {
    pub(crate) inner: Arc<MechanismInner>,
}

impl fmt::Debug for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mechanism")
            .field("name", &self.inner.label)
            .field("id", &self.inner.id)
            .field("device", &Device(self.inner.device).to_string())
            .field("capabilities", &self.inner.caps)
            .finish()
    }
}

/// Fetches a slot validated at load. A `None` here would be a host bug:
/// the loader refuses plugins whose required slots are NULL.
macro_rules! slot {
    ($e:expr) => {
        match $e {
            Some(f) => f,
            None => unreachable!("required slot validated at load"),
        }
    };
}

impl MechanismInner {
    #[inline]
    fn kind(&self, k: ObjectKind) -> &AtomicU64 {
        &self.live[k as usize]
    }

    #[inline]
    fn born(&self, k: ObjectKind) {
        self.kind(k).fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    fn died(&self, k: ObjectKind) {
        self.kind(k).fetch_sub(1, Ordering::Relaxed);
    }

    #[inline]
    fn check(&self, slot: &'static str, raw: MemplugStatus, cap: &mut Capture) -> Result<(), CallError> {
        if raw == MEMPLUG_STATUS_OK {
            Ok(())
        } else {
            Err(self.failure(slot, raw, cap.take()))
        }
    }

    #[cold]
    pub(crate) fn failure(
        &self,
        slot: &'static str,
        raw: MemplugStatus,
        message: Option<String>,
    ) -> CallError {
        let status = Status::from_raw_conservative(raw);
        CallError {
            status,
            raw,
            slot,
            mechanism: self.label.clone(),
            message: message.unwrap_or_else(|| "the plugin gave no message".into()),
        }
    }

    #[cold]
    pub(crate) fn refuse(&self, slot: &'static str, status: Status, message: String) -> CallError {
        CallError { status, raw: status.raw(), slot, mechanism: self.label.clone(), message }
    }

    /// Refuses, before the plugin sees it, a range that is empty, not
    /// granularity-aligned, overflowing, or past the end of its object: the
    /// host knows the object's size and the granularity, so a plugin that
    /// forgets a check cannot be handed an address outside what it made.
    #[inline]
    fn range(
        &self,
        slot: &'static str,
        what: &str,
        size: u64,
        offset: u64,
        len: u64,
    ) -> Result<(), CallError> {
        let g = self.props.granularity.max(1);
        let fits = offset.checked_add(len).is_some_and(|end| end <= size);
        if len != 0 && offset % g == 0 && len % g == 0 && fits {
            return Ok(());
        }
        Err(self.bad_range(slot, what, size, offset, len))
    }

    #[cold]
    fn bad_range(&self, slot: &'static str, what: &str, size: u64, offset: u64, len: u64) -> CallError {
        let g = self.props.granularity;
        self.refuse(
            slot,
            Status::OutOfRange,
            format!(
                "range +{offset:#x} len {len:#x} of the {what} ({size:#x} bytes) is empty, not aligned to \
                 the granularity {g:#x}, overflowing, or out of bounds"
            ),
        )
    }

    #[inline]
    fn own(&self, slot: &'static str, raw: &RawObject) -> Result<MemplugObjectRef, CallError> {
        if raw.mechanism_key != self.key {
            return Err(self.refuse(
                slot,
                Status::WrongMechanism,
                format!(
                    "object {} was made by another mechanism (plugin id {}), not by this one",
                    raw.object_id, raw.mechanism_id
                ),
            ));
        }
        Ok(raw.abi_ref())
    }

    #[inline]
    fn own_handle(&self, slot: &'static str, key: u64, what: &str) -> Result<(), CallError> {
        if key != self.key {
            return Err(self.refuse(
                slot,
                Status::WrongMechanism,
                format!("{what} belongs to another mechanism"),
            ));
        }
        Ok(())
    }

    /// A request tagged with `class_tag`. A 1.0 plugin gets the 1.0
    /// `struct_size` and so never reads the tag; the cost is the same
    /// either way (the size is a field loaded, the tag a store).
    #[inline]
    fn request(&self, size: u64, alignment: u64, class_tag: u32) -> MemplugRequest {
        MemplugRequest {
            struct_size: self.request_size,
            flags: 0,
            size,
            alignment,
            object_id: next_object_id(),
            device: self.device,
            class_tag,
            reserved0: 0,
        }
    }

    #[inline]
    fn empty_block() -> MemplugBlock {
        MemplugBlock { struct_size: MEMPLUG_BLOCK_SIZE_1_0, ..Default::default() }
    }

    #[inline]
    fn object(&self, req: &MemplugRequest, b: &MemplugBlock) -> RawObject {
        RawObject {
            mechanism_key: self.key,
            mechanism_id: self.id,
            device: self.device,
            object_id: req.object_id,
            addr: b.addr,
            size: b.size,
            handle: b.handle,
        }
    }
}

impl Mechanism {
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// `plugin/mechanism`, as errors name it.
    pub fn label(&self) -> &str {
        &self.inner.label
    }
    /// An error for a call the host refused on this mechanism's behalf
    /// (the plugin was not called).
    #[cold]
    pub(crate) fn refusal(&self, slot: &'static str, status: Status, message: String) -> CallError {
        self.inner.refuse(slot, status, message)
    }
    /// The plugin's id of this mechanism.
    pub fn id(&self) -> u64 {
        self.inner.id
    }
    /// Host-unique key; objects carry it so a foreign object is refused.
    pub fn key(&self) -> u64 {
        self.inner.key
    }
    pub fn device(&self) -> Device {
        Device(self.inner.device)
    }
    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }
    pub fn properties(&self) -> Properties {
        self.inner.props
    }
    /// Name of the plugin that published this mechanism.
    pub fn plugin_name(&self) -> &str {
        &self.inner.plugin.name
    }
    /// Objects of `kind` the host gave out and has not seen released.
    pub fn live(&self, kind: ObjectKind) -> u64 {
        self.inner.kind(kind).load(Ordering::Relaxed)
    }
    /// True when both handles name the same loaded mechanism.
    pub fn same_as(&self, other: &Mechanism) -> bool {
        self.inner.key == other.inner.key
    }

    /// The required allocator.
    #[inline]
    pub fn allocator(&self) -> AllocatorApi<'_> {
        AllocatorApi { m: &self.inner }
    }
    /// The virtual backing, or `None` when the mechanism has none.
    pub fn virtual_backing(&self) -> Option<VirtualBackingApi<'_>> {
        self.inner.virtual_backing.as_ref().map(|vt| VirtualBackingApi { m: &self.inner, vt })
    }
    /// The shared mapping capability, or `None`.
    pub fn shared_mapping(&self) -> Option<SharedMappingApi<'_>> {
        self.inner.shared_mapping.as_ref().map(|vt| SharedMappingApi { m: &self.inner, vt })
    }
    /// Streams and fences, or `None`.
    pub fn sync(&self) -> Option<SyncApi<'_>> {
        self.inner.sync.as_ref().map(|vt| SyncApi { m: &self.inner, vt })
    }
}

/// The allocator of a mechanism. Every method may be called from any thread.
#[derive(Clone, Copy)]
pub struct AllocatorApi<'m> {
    m: &'m MechanismInner,
}

impl<'m> AllocatorApi<'m> {
    /// Allocates at least `size` bytes aligned to `alignment` (class
    /// `Other`).
    #[inline]
    pub fn allocate(&self, size: u64, alignment: u64) -> Result<Allocation, CallError> {
        self.allocate_tagged(size, alignment, MEMPLUG_CLASS_OTHER)
    }

    /// [`allocate`](Self::allocate), telling a 1.1 plugin what the memory
    /// is for (a 1.0 plugin is not told).
    #[inline]
    pub fn allocate_as(
        &self,
        size: u64,
        alignment: u64,
        class: AllocationClass,
    ) -> Result<Allocation, CallError> {
        self.allocate_tagged(size, alignment, class_tag(class))
    }

    #[inline]
    fn allocate_tagged(&self, size: u64, alignment: u64, tag: u32) -> Result<Allocation, CallError> {
        let m = self.m;
        let req = m.request(size, alignment, tag);
        let mut out = MechanismInner::empty_block();
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot; all pointers live for the call.
        let raw = unsafe { slot!(m.allocator.allocate)(m.ctx, &req, &mut out, &sink) };
        m.check("allocator.allocate", raw, &mut cap)?;
        if out.addr == 0 || out.addr & (alignment.max(1).wrapping_sub(1)) != 0 || out.size < size {
            return Err(self.bad_block(&req, &out));
        }
        m.born(ObjectKind::Allocation);
        Ok(Allocation(m.object(&req, &out)))
    }

    #[cold]
    fn bad_block(&self, req: &MemplugRequest, out: &MemplugBlock) -> CallError {
        // The plugin broke its contract on success; the block is not
        // trusted, not used and not freed (freeing a bogus address could do
        // more harm). It is reported as the plugin's internal failure.
        self.m.refuse(
            "allocator.allocate",
            Status::Internal,
            format!(
                "plugin reported success but returned addr {:#x} size {} for a request of {} bytes aligned to {}",
                out.addr, out.size, req.size, req.alignment
            ),
        )
    }

    /// Frees an allocation. On failure the allocation comes back in the
    /// error, still counted live.
    #[inline]
    pub fn deallocate(&self, a: Allocation) -> Result<(), ReleaseError<Allocation>> {
        let m = self.m;
        let r = match m.own("allocator.deallocate", &a.0) {
            Ok(r) => r,
            Err(error) => return Err(ReleaseError { object: a, error }),
        };
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot; pointers live for the call.
        let raw = unsafe { slot!(m.allocator.deallocate)(m.ctx, &r, &sink) };
        match m.check("allocator.deallocate", raw, &mut cap) {
            Ok(()) => {
                m.died(ObjectKind::Allocation);
                Ok(())
            }
            Err(error) => Err(ReleaseError { object: a, error }),
        }
    }

    /// Free and total memory of the device, or `None` when the plugin does
    /// not publish the slot.
    pub fn memory_info(&self) -> Option<Result<MemoryInfo, CallError>> {
        let f = self.m.allocator.memory_info?;
        let mut out = MemplugMemoryInfo { struct_size: MEMPLUG_MEMORY_INFO_SIZE_1_0, ..Default::default() };
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: published slot; pointers live for the call.
        let raw = unsafe { f(self.m.ctx, &mut out, &sink) };
        Some(
            self.m
                .check("allocator.memory_info", raw, &mut cap)
                .map(|()| MemoryInfo { free_bytes: out.free_bytes, total_bytes: out.total_bytes }),
        )
    }
}

/// Reserve/commit/decommit. Every method may be called from any thread.
#[derive(Clone, Copy)]
pub struct VirtualBackingApi<'m> {
    m: &'m MechanismInner,
    vt: &'m MemplugVirtualBacking,
}

impl<'m> VirtualBackingApi<'m> {
    /// Reserves at least `size` bytes of address space, nothing committed.
    pub fn reserve(&self, size: u64) -> Result<Reservation, CallError> {
        self.reserve_tagged(size, MEMPLUG_CLASS_OTHER)
    }

    /// [`reserve`](Self::reserve), telling a 1.1 plugin what the range is
    /// for.
    pub fn reserve_as(&self, size: u64, class: AllocationClass) -> Result<Reservation, CallError> {
        self.reserve_tagged(size, class_tag(class))
    }

    fn reserve_tagged(&self, size: u64, tag: u32) -> Result<Reservation, CallError> {
        let m = self.m;
        let req = m.request(size, m.props.granularity, tag);
        let mut out = MechanismInner::empty_block();
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.reserve)(m.ctx, &req, &mut out, &sink) };
        m.check("virtual_backing.reserve", raw, &mut cap)?;
        if out.addr == 0 || out.size < size {
            return Err(m.refuse(
                "virtual_backing.reserve",
                Status::Internal,
                format!(
                    "plugin reported success but returned addr {:#x} size {} for {size} bytes",
                    out.addr, out.size
                ),
            ));
        }
        m.born(ObjectKind::Reservation);
        Ok(Reservation(m.object(&req, &out)))
    }

    /// Commits `[offset, offset + len)`.
    #[inline]
    pub fn commit(&self, r: &Reservation, offset: u64, len: u64) -> Result<(), CallError> {
        let o = self.m.own("virtual_backing.commit", &r.0)?;
        self.m.range("virtual_backing.commit", "reservation", r.0.size, offset, len)?;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.commit)(self.m.ctx, &o, offset, len, &sink) };
        self.m.check("virtual_backing.commit", raw, &mut cap)
    }

    /// Decommits `[offset, offset + len)`: the pages go back to the device.
    #[inline]
    pub fn decommit(&self, r: &Reservation, offset: u64, len: u64) -> Result<(), CallError> {
        let o = self.m.own("virtual_backing.decommit", &r.0)?;
        self.m.range("virtual_backing.decommit", "reservation", r.0.size, offset, len)?;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.decommit)(self.m.ctx, &o, offset, len, &sink) };
        self.m.check("virtual_backing.decommit", raw, &mut cap)
    }

    /// Exact committed bytes of the reservation.
    pub fn committed_bytes(&self, r: &Reservation) -> Result<u64, CallError> {
        let o = self.m.own("virtual_backing.committed_bytes", &r.0)?;
        let mut out = 0u64;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.committed_bytes)(self.m.ctx, &o, &mut out, &sink) };
        self.m.check("virtual_backing.committed_bytes", raw, &mut cap).map(|()| out)
    }

    /// Releases the reservation and everything committed or mapped in it.
    pub fn release(&self, r: Reservation) -> Result<(), ReleaseError<Reservation>> {
        let o = match self.m.own("virtual_backing.release", &r.0) {
            Ok(o) => o,
            Err(error) => return Err(ReleaseError { object: r, error }),
        };
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.release)(self.m.ctx, &o, &sink) };
        match self.m.check("virtual_backing.release", raw, &mut cap) {
            Ok(()) => {
                self.m.died(ObjectKind::Reservation);
                Ok(())
            }
            Err(error) => Err(ReleaseError { object: r, error }),
        }
    }
}

/// Physical objects mapped into reservations.
#[derive(Clone, Copy)]
pub struct SharedMappingApi<'m> {
    m: &'m MechanismInner,
    vt: &'m MemplugSharedMapping,
}

/// Access of a shared mapping.
pub use memplug_sdk::Access;

impl<'m> SharedMappingApi<'m> {
    /// Creates a zero-filled physical object of at least `size` bytes.
    pub fn create(&self, size: u64) -> Result<PhysicalObject, CallError> {
        self.create_tagged(size, MEMPLUG_CLASS_OTHER)
    }

    /// [`create`](Self::create), telling a 1.1 plugin what the object is
    /// for.
    pub fn create_as(&self, size: u64, class: AllocationClass) -> Result<PhysicalObject, CallError> {
        self.create_tagged(size, class_tag(class))
    }

    fn create_tagged(&self, size: u64, tag: u32) -> Result<PhysicalObject, CallError> {
        let m = self.m;
        let req = m.request(size, m.props.granularity, tag);
        let mut out = MechanismInner::empty_block();
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.create)(m.ctx, &req, &mut out, &sink) };
        m.check("shared_mapping.create", raw, &mut cap)?;
        if out.size < size {
            return Err(m.refuse(
                "shared_mapping.create",
                Status::Internal,
                format!("plugin reported success but returned {} bytes for {size}", out.size),
            ));
        }
        m.born(ObjectKind::PhysicalObject);
        Ok(PhysicalObject(m.object(&req, &out)))
    }

    /// Maps `[object_offset, +len)` of `object` at `[offset, +len)` of `r`.
    pub fn map(
        &self,
        object: &PhysicalObject,
        object_offset: u64,
        r: &Reservation,
        offset: u64,
        len: u64,
        access: Access,
    ) -> Result<(), CallError> {
        let o = self.m.own("shared_mapping.map", &object.0)?;
        let res = self.m.own("shared_mapping.map", &r.0)?;
        self.m.range("shared_mapping.map", "physical object", object.0.size, object_offset, len)?;
        self.m.range("shared_mapping.map", "reservation", r.0.size, offset, len)?;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe {
            slot!(self.vt.map)(self.m.ctx, &o, object_offset, &res, offset, len, access.bits(), &sink)
        };
        self.m.check("shared_mapping.map", raw, &mut cap)
    }

    /// Unmaps the mapping at `[offset, +len)` of `r`.
    pub fn unmap(&self, r: &Reservation, offset: u64, len: u64) -> Result<(), CallError> {
        let res = self.m.own("shared_mapping.unmap", &r.0)?;
        self.m.range("shared_mapping.unmap", "reservation", r.0.size, offset, len)?;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.unmap)(self.m.ctx, &res, offset, len, &sink) };
        self.m.check("shared_mapping.unmap", raw, &mut cap)
    }

    /// Takes another reference to `object`; release each one.
    pub fn retain(&self, object: &PhysicalObject) -> Result<PhysicalObject, CallError> {
        let o = self.m.own("shared_mapping.retain", &object.0)?;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.retain)(self.m.ctx, &o, &sink) };
        self.m.check("shared_mapping.retain", raw, &mut cap)?;
        self.m.born(ObjectKind::PhysicalObject);
        Ok(PhysicalObject(object.0))
    }

    /// Whether [`export_fd`](Self::export_fd) and
    /// [`import_fd`](Self::import_fd) can be called: the plugin agreed on
    /// ABI 1.1 or newer and has `MEMPLUG_CAP_SHARED_EXPORT`.
    pub fn can_export(&self) -> bool {
        self.vt.export_fd.is_some() && self.vt.import_fd.is_some()
    }

    /// Why export/import are absent (`Unsupported`, never a no-op).
    #[cold]
    fn no_export(&self, slot: &'static str) -> CallError {
        let why = if self.m.minor == 0 {
            "the plugin agreed on ABI 1.0; sharing across processes needs 1.1".to_string()
        } else {
            "the mechanism does not have MEMPLUG_CAP_SHARED_EXPORT".to_string()
        };
        self.m.refuse(slot, Status::Unsupported, why)
    }

    /// A new file descriptor for the memory of `object`, to hand to another
    /// process (for example over a Unix socket with `SCM_RIGHTS`), which
    /// imports it with [`import_fd`](Self::import_fd). The descriptor is
    /// the caller's; it holds the memory, not a counted reference, so the
    /// object is released as usual. `Unsupported` when the plugin agreed on
    /// 1.0 or lacks the capability.
    pub fn export_fd(&self, object: &PhysicalObject) -> Result<OwnedFd, CallError> {
        let Some(f) = self.vt.export_fd else {
            return Err(self.no_export("shared_mapping.export_fd"));
        };
        let o = self.m.own("shared_mapping.export_fd", &object.0)?;
        let mut fd: i32 = -1;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: a slot validated at load (capability agreed at 1.1).
        let raw = unsafe { f(self.m.ctx, &o, &mut fd, &sink) };
        self.m.check("shared_mapping.export_fd", raw, &mut cap)?;
        if fd < 0 {
            return Err(self.m.refuse(
                "shared_mapping.export_fd",
                Status::Internal,
                format!("plugin reported success but returned fd {fd}"),
            ));
        }
        // SAFETY: on success the plugin hands over a descriptor the caller
        // owns (ABI contract); nothing else owns this number.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// A physical object of this mechanism backed by the memory `fd` names
    /// (exported by [`export_fd`](Self::export_fd), here or in another
    /// process), of at least `size` bytes. `fd` stays the caller's. Release
    /// the object as one made by [`create`](Self::create). `Unsupported`
    /// when the plugin agreed on 1.0 or lacks the capability.
    pub fn import_fd(&self, fd: BorrowedFd<'_>, size: u64) -> Result<PhysicalObject, CallError> {
        let Some(f) = self.vt.import_fd else {
            return Err(self.no_export("shared_mapping.import_fd"));
        };
        let m = self.m;
        let req = m.request(size, m.props.granularity, MEMPLUG_CLASS_OTHER);
        let mut out = MechanismInner::empty_block();
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: a slot validated at load; `fd` is open for the call.
        let raw = unsafe { f(m.ctx, fd.as_raw_fd(), &req, &mut out, &sink) };
        m.check("shared_mapping.import_fd", raw, &mut cap)?;
        if out.size < size {
            return Err(m.refuse(
                "shared_mapping.import_fd",
                Status::Internal,
                format!("plugin reported success but returned {} bytes for {size}", out.size),
            ));
        }
        m.born(ObjectKind::PhysicalObject);
        Ok(PhysicalObject(m.object(&req, &out)))
    }

    /// Drops one reference.
    pub fn release(&self, object: PhysicalObject) -> Result<(), ReleaseError<PhysicalObject>> {
        let o = match self.m.own("shared_mapping.release", &object.0) {
            Ok(o) => o,
            Err(error) => return Err(ReleaseError { object, error }),
        };
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.release)(self.m.ctx, &o, &sink) };
        match self.m.check("shared_mapping.release", raw, &mut cap) {
            Ok(()) => {
                self.m.died(ObjectKind::PhysicalObject);
                Ok(())
            }
            Err(error) => Err(ReleaseError { object, error }),
        }
    }
}

/// Streams and fences.
#[derive(Clone, Copy)]
pub struct SyncApi<'m> {
    m: &'m MechanismInner,
    vt: &'m MemplugSync,
}

type BoxedHostFn = Box<dyn FnOnce() + Send + 'static>;

unsafe extern "C" fn run_boxed_host_fn(userdata: *mut c_void) {
    // SAFETY: userdata is the Box leaked by `enqueue` and is run once.
    let f = Box::from_raw(userdata.cast::<BoxedHostFn>());
    // A host function must not unwind into the plugin's thread; a panic is
    // reported on stderr by the panic hook and stops here.
    let _ = catch_unwind(AssertUnwindSafe(f));
}

impl<'m> SyncApi<'m> {
    pub fn stream_create(&self) -> Result<Stream, CallError> {
        let mut out = 0u64;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.stream_create)(self.m.ctx, &mut out, &sink) };
        self.m.check("sync.stream_create", raw, &mut cap)?;
        self.m.born(ObjectKind::Stream);
        Ok(Stream { mechanism_key: self.m.key, handle: out })
    }

    /// Whether the plugin can wrap a runtime's native stream.
    pub fn can_adopt(&self) -> bool {
        self.vt.stream_adopt.is_some()
    }

    /// Wraps a native stream (e.g. a `CUstream`), not taking ownership.
    /// `Unsupported` when the plugin does not publish the slot.
    ///
    /// # Safety
    /// `native` must be a live native stream of the mechanism's device that
    /// outlives the returned `Stream`; the plugin dereferences it.
    pub unsafe fn stream_adopt(&self, native: *mut c_void) -> Result<Stream, CallError> {
        let Some(f) = self.vt.stream_adopt else {
            return Err(self.m.refuse(
                "sync.stream_adopt",
                Status::Unsupported,
                "the plugin does not publish stream_adopt".into(),
            ));
        };
        let mut out = 0u64;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: published slot.
        let raw = unsafe { f(self.m.ctx, native, &mut out, &sink) };
        self.m.check("sync.stream_adopt", raw, &mut cap)?;
        self.m.born(ObjectKind::Stream);
        Ok(Stream { mechanism_key: self.m.key, handle: out })
    }

    /// Destroys a stream after its submitted work has run.
    pub fn stream_destroy(&self, s: Stream) -> Result<(), ReleaseError<Stream>> {
        if let Err(error) = self.m.own_handle("sync.stream_destroy", s.mechanism_key, "stream") {
            return Err(ReleaseError { object: s, error });
        }
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.stream_destroy)(self.m.ctx, s.handle, &sink) };
        match self.m.check("sync.stream_destroy", raw, &mut cap) {
            Ok(()) => {
                self.m.died(ObjectKind::Stream);
                Ok(())
            }
            Err(error) => Err(ReleaseError { object: s, error }),
        }
    }

    /// Runs `f` on the stream after the work submitted before it.
    pub fn enqueue(&self, s: &Stream, f: impl FnOnce() + Send + 'static) -> Result<(), CallError> {
        self.m.own_handle("sync.enqueue_host_fn", s.mechanism_key, "stream")?;
        let boxed: Box<BoxedHostFn> = Box::new(Box::new(f));
        let userdata = Box::into_raw(boxed).cast::<c_void>();
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot; on success the plugin calls the trampoline
        // exactly once, which frees the box.
        let raw = unsafe {
            slot!(self.vt.enqueue_host_fn)(self.m.ctx, s.handle, Some(run_boxed_host_fn), userdata, &sink)
        };
        let r = self.m.check("sync.enqueue_host_fn", raw, &mut cap);
        if r.is_err() {
            // Refused: the plugin will never run it, so the box is ours.
            // SAFETY: the pointer came from Box::into_raw above.
            drop(unsafe { Box::from_raw(userdata.cast::<BoxedHostFn>()) });
        }
        r
    }

    /// Records a fence after the work submitted so far.
    pub fn fence_record(&self, s: &Stream) -> Result<Fence, CallError> {
        self.m.own_handle("sync.fence_record", s.mechanism_key, "stream")?;
        let mut out = 0u64;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.fence_record)(self.m.ctx, s.handle, &mut out, &sink) };
        self.m.check("sync.fence_record", raw, &mut cap)?;
        self.m.born(ObjectKind::Fence);
        Ok(Fence { mechanism_key: self.m.key, handle: out })
    }

    /// `true` when the fence has completed; never blocks.
    pub fn fence_query(&self, f: &Fence) -> Result<bool, CallError> {
        self.m.own_handle("sync.fence_query", f.mechanism_key, "fence")?;
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.fence_query)(self.m.ctx, f.handle, &sink) };
        if raw == MEMPLUG_STATUS_NOT_READY {
            return Ok(false);
        }
        self.m.check("sync.fence_query", raw, &mut cap).map(|()| true)
    }

    /// Waits up to `timeout`; `true` when the fence completed.
    pub fn fence_wait(&self, f: &Fence, timeout: Duration) -> Result<bool, CallError> {
        self.m.own_handle("sync.fence_wait", f.mechanism_key, "fence")?;
        let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.fence_wait)(self.m.ctx, f.handle, ns, &sink) };
        if raw == MEMPLUG_STATUS_TIMEOUT {
            return Ok(false);
        }
        self.m.check("sync.fence_wait", raw, &mut cap).map(|()| true)
    }

    pub fn fence_destroy(&self, f: Fence) -> Result<(), ReleaseError<Fence>> {
        if let Err(error) = self.m.own_handle("sync.fence_destroy", f.mechanism_key, "fence") {
            return Err(ReleaseError { object: f, error });
        }
        let mut cap = Capture::default();
        let sink = cap.sink();
        // SAFETY: validated slot.
        let raw = unsafe { slot!(self.vt.fence_destroy)(self.m.ctx, f.handle, &sink) };
        match self.m.check("sync.fence_destroy", raw, &mut cap) {
            Ok(()) => {
                self.m.died(ObjectKind::Fence);
                Ok(())
            }
            Err(error) => Err(ReleaseError { object: f, error }),
        }
    }
}
