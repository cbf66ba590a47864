//! Safe wrappers over a validated mechanism's vtables.
//!
//! Every call goes through one door (`call.rs`): it builds a stack sink,
//! calls the slot, and maps the status — a success costs a compare; a
//! failure becomes a [`CallError`] carrying the plugin's message. Objects
//! are checked against the host's key of the mechanism before the plugin
//! sees them (invariant 1), and the plugin checks them again.
//!
//! The capabilities that produce memory (allocator, virtual backing, shared
//! mapping) are reachable only inside this crate, through a binding that
//! charges the governor first. The one exception is
//! [`Mechanism::ungoverned`], an `unsafe` door for plugin test harnesses.

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

mod allocator;
mod blocks;
mod call;
mod copy;
mod live;
mod queued;
mod shared_mapping;
mod sync;
mod typed_export;
mod virtual_backing;

pub use allocator::AllocatorApi;
pub use queued::{accepted_unfenced, PeerAccessApi};
pub use shared_mapping::SharedMappingApi;
pub use sync::stray_host_fn_calls;
pub use sync::SyncApi;
pub use virtual_backing::VirtualBackingApi;

use crate::error::{CallError, ObjectKind};
use crate::governor::AllocationClass;
use crate::library::LoadedLibrary;
use crate::tokens::{next_mechanism_key, next_object_id, RawObject};
use blocks::{BlockIndex, Conflict};
use memplug_sdk::abi::*;
pub use memplug_sdk::Access;
use memplug_sdk::Status;
pub use memplug_sdk::{CopyKinds, Descriptor, DeviceIdentity, Handle, HandleRef, Location};
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

/// Capability flags of a mechanism (the ABI 1.1 bits, plus any unknown bits
/// a newer plugin set, which the host ignores).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities(pub u32);

impl Capabilities {
    /// `allocate`/`deallocate` (`MEMPLUG_CAP_ALLOCATOR`). Always set on a
    /// loaded mechanism: the loader refuses one without it.
    pub fn allocator(self) -> bool {
        self.0 & MEMPLUG_CAP_ALLOCATOR != 0
    }
    /// Address space reserved, then committed and decommitted in granules
    /// (`MEMPLUG_CAP_VIRTUAL_BACKING`): what a [`Region`](crate::Region)
    /// needs.
    pub fn virtual_backing(self) -> bool {
        self.0 & MEMPLUG_CAP_VIRTUAL_BACKING != 0
    }
    /// Physical objects mapped into reservations, possibly into several at
    /// once (`MEMPLUG_CAP_SHARED_MAPPING`): what a
    /// [`SharedPrefix`](crate::SharedPrefix) needs.
    pub fn shared_mapping(self) -> bool {
        self.0 & MEMPLUG_CAP_SHARED_MAPPING != 0
    }
    /// Streams and fences (`MEMPLUG_CAP_SYNC`): [`Mechanism::sync`] is
    /// `Some`.
    pub fn sync(self) -> bool {
        self.0 & MEMPLUG_CAP_SYNC != 0
    }
    /// Shared mapping across processes (`export_fd`/`import_fd`, ABI 1.1).
    /// Set only on mechanisms of plugins that agreed on 1.1 or newer: the
    /// loader refuses the bit at 1.0.
    pub fn shared_export(self) -> bool {
        self.0 & MEMPLUG_CAP_SHARED_EXPORT != 0
    }
    /// Typed handles chosen at create (`export_handle`/`import_handle`,
    /// ABI 1.2). Set only on mechanisms of plugins that agreed on 1.2 or
    /// newer: the loader refuses the bit below.
    pub fn typed_export(self) -> bool {
        self.0 & MEMPLUG_CAP_TYPED_EXPORT != 0
    }
    /// Peer access (ABI 1.2): other devices can be given access.
    pub fn peer_access(self) -> bool {
        self.0 & MEMPLUG_CAP_PEER_ACCESS != 0
    }
    /// Queue-ordered binding (ABI 1.2): `commit_on`, `decommit_on` (and
    /// `map_on`, `unmap_on` with a shared mapping).
    pub fn queued_binding(self) -> bool {
        self.0 & MEMPLUG_CAP_QUEUED_BINDING != 0
    }
    /// Bits this host does not know (from a newer minor); ignored.
    pub fn unknown_bits(self) -> u32 {
        self.0 & !MEMPLUG_CAP_ALL_1_2
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
        if self.typed_export() {
            v.push("typed_export");
        }
        if self.peer_access() {
            v.push("peer_access");
        }
        if self.queued_binding() {
            v.push("queued_binding");
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
    /// The kind's name (DLPack's device types, ABI 1.2); a number in the
    /// vendor range is shown as `vendor(N)`, any other unknown one as
    /// `unknown(N)`, never guessed.
    pub fn kind_name(self) -> String {
        let k = self.0.kind;
        match memplug_sdk::facts::device_kind_name(k) {
            Some(name) => name.into(),
            None if memplug_sdk::facts::is_vendor_device_kind(k) => format!("vendor({k:#x})"),
            None => format!("unknown({k})"),
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
    /// Alignment every allocation has at least, in bytes (a power of two).
    pub min_alignment: u64,
    /// Largest alignment `allocate` honours, in bytes (a power of two, at
    /// least `min_alignment`); asking for more is refused.
    pub max_alignment: u64,
    /// Bytes per granule of virtual ranges and physical objects (a power of
    /// two): regions grow, shrink and map in multiples of it, and shared
    /// prefixes are rounded up to it. Zero when the mechanism has neither
    /// virtual backing nor shared mapping.
    pub granularity: u64,
    /// The memory descriptor (ABI 1.2); all "not said" for a plugin that
    /// agreed on an older minor.
    pub descriptor: Descriptor,
    /// The address spaces [`SyncApi::copy`] copies between (ABI 1.3); none
    /// for a plugin that agreed on an older minor or publishes no copy.
    pub copy_kinds: CopyKinds,
}

/// How a binding wants its memory made (ABI 1.2 request fields): hints,
/// page size, location, export kinds. A plugin that agreed on an older
/// minor is sent none of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// `MEMPLUG_HINT_*` bits (`MEMPLUG_HINT_UNINITIALIZED_OK` only when the
    /// binding says its memory need not be zeroed).
    pub hints: u32,
    /// Zero (the mechanism's choice) or a page size it publishes.
    pub page_size: u64,
    /// Where the memory should live; [`Location::ANY`] (the default) leaves
    /// it to the mechanism.
    pub location: Location,
    /// `MEMPLUG_HANDLE_*` kinds the memory will be exported as.
    pub export_types: u32,
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
    /// Bytes the device could still give out, as the plugin reads them
    /// (the driver's or kernel's figure, shared with every other user of
    /// the device; not this host's budget).
    pub free_bytes: u64,
    /// The device's total memory, in bytes.
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
    /// Peer access (ABI 1.2), when published.
    pub(crate) peer_access: Option<MemplugPeerAccess>,
    /// The device's identity (ABI 1.2), when the plugin published one.
    pub(crate) identity: Option<DeviceIdentity>,
    /// Objects alive per kind, striped (`live.rs`).
    pub(crate) live: live::LiveCounts,
    /// Live blocks by address, when `LoadOptions::check_overlaps` checks
    /// any kind for this mechanism (`blocks.rs`).
    pub(crate) blocks: Option<Box<BlockIndex>>,
    /// Whether allocations go into `blocks` too (reservations always do
    /// when it exists).
    pub(crate) blocks_allocations: bool,
    /// The context's life: its state and the operation gate every call
    /// passes (`crate::lifecycle`).
    pub(crate) life: crate::lifecycle::Lifecycle,
    // Last field: dropped after everything above, so the library outlives
    // every pointer into it.
    pub(crate) plugin: Arc<LoadedLibrary>,
}

impl crate::lifecycle::LossReceiver for MechanismInner {
    fn receive_loss(&self, reason: String) -> bool {
        self.life.report_lost(reason)
    }
}

// SAFETY: `ctx` and the vtables are the plugin's; the ABI requires every
// slot to be callable from any thread concurrently (ARCHITECTURE.md §3, Threads).
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

impl MechanismInner {
    /// A mechanism over tables the loader validated.
    ///
    /// # Safety
    /// `ctx` and the tables are those of one mechanism descriptor of the
    /// plugin whose library is `plugin`; every required slot of each table
    /// present is non-NULL, and 1.1 slots are set only when the agreed
    /// `minor` is at least 1 and the capability is claimed.
    /// `check_overlaps` says which blocks an index of live blocks by
    /// address checks (`LoadOptions::check_overlaps`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn new(
        id: u64,
        name: String,
        device: MemplugDevice,
        caps: Capabilities,
        minor: u32,
        ctx: *mut c_void,
        allocator: MemplugAllocator,
        virtual_backing: Option<MemplugVirtualBacking>,
        shared_mapping: Option<MemplugSharedMapping>,
        sync: Option<MemplugSync>,
        peer_access: Option<MemplugPeerAccess>,
        check_overlaps: crate::load_options::OverlapCheck,
        plugin: Arc<LoadedLibrary>,
    ) -> MechanismInner {
        MechanismInner {
            key: next_mechanism_key(),
            id,
            label: format!("{}/{}", plugin.name, name),
            name,
            device,
            caps,
            minor,
            request_size: match minor {
                0 => MEMPLUG_REQUEST_SIZE_1_0,
                1 => MEMPLUG_REQUEST_SIZE_1_1,
                _ => MEMPLUG_REQUEST_SIZE_1_2,
            },
            ctx,
            props: Properties::default(),
            allocator,
            virtual_backing,
            shared_mapping,
            sync,
            peer_access,
            identity: None,
            live: Default::default(),
            blocks: check_overlaps.reservations().then(Box::default),
            blocks_allocations: check_overlaps.allocations(device.kind),
            life: Default::default(),
            plugin,
        }
    }

    /// Whether blocks of `kind` go into the index of live blocks (when
    /// there is one).
    #[inline(always)]
    pub(crate) fn indexes(&self, kind: ObjectKind) -> bool {
        kind != ObjectKind::Allocation || self.blocks_allocations
    }

    #[inline]
    fn born(&self, k: ObjectKind) {
        self.live.born(k);
    }

    /// The properties as the plugin writes them (the loader judges them).
    pub(crate) fn read_properties(&self) -> Result<MemplugProperties, CallError> {
        AllocatorApi { m: self, held: call::Held::No }.read_properties()
    }

    /// At termination (the gate closed and quiet): the objects the host
    /// still counts went with the context; forget them, so nothing waits
    /// for frees that will never be asked for. Returns how many there were.
    pub(crate) fn forget_objects(&self) -> u64 {
        if let Some(ix) = &self.blocks {
            ix.clear();
        }
        self.live.forget()
    }

    #[inline]
    pub(crate) fn died(&self, k: ObjectKind) {
        self.live.died(k);
    }

    /// A request tagged with `class_tag` and placed by `p`. A plugin of an
    /// older minor gets that minor's `struct_size` and so never reads the
    /// newer fields; the cost is the same either way (the size is a field
    /// loaded, each field a store).
    #[inline]
    fn request(&self, size: u64, alignment: u64, class_tag: u32, p: &Placement) -> MemplugRequest {
        MemplugRequest {
            struct_size: self.request_size,
            flags: 0,
            size,
            alignment,
            object_id: next_object_id(),
            device: self.device,
            class_tag,
            reserved0: 0,
            hints: p.hints,
            export_types: p.export_types,
            page_size: p.page_size,
            location_kind: p.location.kind,
            location_id: p.location.id,
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

    /// Admits a new block (an allocation or a reservation) into the index
    /// of live blocks, when the mechanism keeps one: a block that overlaps
    /// a live one of this mechanism, or runs past the end of the address
    /// space, is refused as the plugin's internal failure, and is then not
    /// counted, not charged, not used and not freed (freeing a bogus block
    /// could do more harm).
    #[inline(always)]
    fn admit_block(
        &self,
        slot: &'static str,
        kind: ObjectKind,
        req: &MemplugRequest,
        b: &MemplugBlock,
    ) -> Result<(), CallError> {
        match &self.blocks {
            Some(ix) if self.indexes(kind) => {
                self.admit_indexed(ix, slot, kind, req.object_id, b.addr, b.size)
            }
            _ => Ok(()),
        }
    }

    // Out of line and marked cold: only a mechanism loaded with
    // `check_overlaps` goes here, and the unchecked path stays as it was.
    #[cold]
    #[inline(never)]
    fn admit_indexed(
        &self,
        ix: &BlockIndex,
        slot: &'static str,
        kind: ObjectKind,
        id: u64,
        addr: u64,
        size: u64,
    ) -> Result<(), CallError> {
        ix.admit(kind, id, addr, size).map_err(|c| self.block_refusal(slot, kind, id, addr, size, c))
    }

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn block_refusal(
        &self,
        slot: &'static str,
        kind: ObjectKind,
        id: u64,
        addr: u64,
        size: u64,
        c: Conflict,
    ) -> CallError {
        let new = format!("{} object {id} at {addr:#x} ({size} bytes)", kind.singular());
        let why = match c {
            Conflict::Wraps => "which runs past the end of the address space".to_string(),
            Conflict::Overlaps { object_id, addr, size, kind } => format!(
                "which overlaps live {} object {object_id} at {addr:#x} ({size} bytes) of this mechanism",
                kind.singular()
            ),
        };
        self.refuse(
            slot,
            Status::Internal,
            format!(
                "plugin reported success but returned {new}, {why}; the new block is not used, not charged \
                 and not freed"
            ),
        )
    }
}

impl Mechanism {
    /// Wraps a mechanism whose properties (and identity) the loader judged.
    pub(crate) fn new(
        mut inner: MechanismInner,
        props: Properties,
        identity: Option<DeviceIdentity>,
    ) -> Mechanism {
        inner.props = props;
        inner.identity = identity;
        Mechanism { inner: Arc::new(inner) }
    }

    /// Handles to this mechanism other than this one (bindings, contexts,
    /// fences): each keeps the plugin loaded.
    pub(crate) fn handles_elsewhere(&self) -> usize {
        Arc::strong_count(&self.inner) - 1
    }

    /// Free and total memory of the device, or `None` when the plugin does
    /// not publish the slot. Public: it reports, it makes nothing.
    pub fn memory_info(&self) -> Option<Result<MemoryInfo, CallError>> {
        self.allocator().memory_info()
    }

    /// The mechanism's name as its plugin published it (escaped: safe to
    /// print), unique within the plugin.
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
    /// The device its memory is on.
    pub fn device(&self) -> Device {
        Device(self.inner.device)
    }
    /// What it can do, as checked at load (a capability whose slots were
    /// missing would have refused the load).
    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }
    /// Its alignments, granularity and (ABI 1.2) memory descriptor, read
    /// once at load.
    pub fn properties(&self) -> Properties {
        self.inner.props
    }
    /// The device's identity (ABI 1.2: UUID, PCI address, sub-device, NUMA
    /// node), when the plugin published one.
    pub fn identity(&self) -> Option<DeviceIdentity> {
        self.inner.identity
    }
    /// Name of the plugin that published this mechanism.
    pub fn plugin_name(&self) -> &str {
        &self.inner.plugin.name
    }
    /// Objects of `kind` the host gave out and has not seen released.
    pub fn live(&self, kind: ObjectKind) -> u64 {
        self.inner.live.of(kind)
    }
    /// Whether the host checks new blocks of `kind` (an allocation or a
    /// reservation) of this mechanism against its live ones
    /// (`LoadOptions::check_overlaps`).
    pub fn checks_overlaps(&self, kind: ObjectKind) -> bool {
        self.inner.blocks.is_some() && self.inner.indexes(kind)
    }
    /// Where the mechanism's context is in its life (`Active` until it is
    /// retired or lost; see [`crate::lifecycle`]).
    pub fn life_state(&self) -> crate::lifecycle::LifeState {
        self.inner.life.state()
    }
    /// Why the context left `Active`, when it did.
    pub fn life_reason(&self) -> Option<String> {
        self.inner.life.reason()
    }
    /// True when both handles name the same loaded mechanism.
    pub fn same_as(&self, other: &Mechanism) -> bool {
        self.inner.key == other.inner.key
    }

    /// The required allocator. Crate-private: outside the host, memory
    /// comes only through a binding, which charges the governor first.
    #[inline]
    pub(crate) fn allocator(&self) -> AllocatorApi<'_> {
        AllocatorApi { m: &self.inner, held: call::Held::No }
    }
    /// The allocator, for a caller holding `token`, a token of this
    /// mechanism's gate (a binding transaction): its calls take no token
    /// of their own.
    #[inline]
    pub(crate) fn allocator_under<'t>(&'t self, token: &'t crate::lifecycle::Token<'t>) -> AllocatorApi<'t> {
        debug_assert!(self.inner.life.gate.owns(token), "a token of another mechanism's gate");
        AllocatorApi { m: &self.inner, held: call::Held::Yes(token) }
    }
    /// The virtual backing, or `None` when the mechanism has none.
    /// Crate-private, as [`allocator`](Self::allocator).
    pub(crate) fn virtual_backing(&self) -> Option<VirtualBackingApi<'_>> {
        self.inner.virtual_backing.as_ref().map(|vt| VirtualBackingApi { m: &self.inner, vt })
    }
    /// The shared mapping capability, or `None`. Crate-private, as
    /// [`allocator`](Self::allocator).
    pub(crate) fn shared_mapping(&self) -> Option<SharedMappingApi<'_>> {
        self.inner.shared_mapping.as_ref().map(|vt| SharedMappingApi { m: &self.inner, vt })
    }
    /// Peer access (ABI 1.2), or `None`. Public: it grants access to memory
    /// that exists; it makes none.
    pub fn peer_access(&self) -> Option<PeerAccessApi<'_>> {
        self.inner.peer_access.as_ref().map(|vt| PeerAccessApi { m: &self.inner, vt })
    }
    /// Streams and fences, or `None`. Public: streams and fences order
    /// work; they make no memory.
    pub fn sync(&self) -> Option<SyncApi<'_>> {
        self.inner.sync.as_ref().map(|vt| SyncApi { m: &self.inner, vt })
    }

    /// The mechanism's memory-making capabilities with no governor in
    /// between, for harnesses that test a plugin itself (its refusals, its
    /// accounting, what the host does with a lying answer).
    ///
    /// ```compile_fail,E0624
    /// // Outside the host there is no way to memory without a charge:
    /// fn raw(m: &memplug_host::Mechanism) {
    ///     let _ = m.allocator();
    /// }
    /// ```
    ///
    /// ```compile_fail,E0133
    /// // The door is `unsafe`: safe code cannot open it.
    /// fn raw(m: &memplug_host::Mechanism) {
    ///     let _ = m.ungoverned().allocator();
    /// }
    /// ```
    ///
    /// # Safety
    /// Not a memory-safety contract (the host still checks every object and
    /// range): nobody gets a raw allocator (ARCHITECTURE.md §1). Memory
    /// made here is charged to no pool, so a runtime that uses it defeats
    /// every budget. The caller gives every object back to this mechanism
    /// and never hands this door to code that serves requests.
    pub unsafe fn ungoverned(&self) -> Ungoverned<'_> {
        Ungoverned { m: self }
    }
}

/// The memory-making capabilities of a mechanism without a governor (see
/// [`Mechanism::ungoverned`]).
#[derive(Clone, Copy)]
pub struct Ungoverned<'m> {
    m: &'m Mechanism,
}

impl<'m> Ungoverned<'m> {
    /// The required allocator.
    pub fn allocator(&self) -> AllocatorApi<'m> {
        self.m.allocator()
    }
    /// The virtual backing, or `None`.
    pub fn virtual_backing(&self) -> Option<VirtualBackingApi<'m>> {
        self.m.virtual_backing()
    }
    /// The shared mapping capability, or `None`.
    pub fn shared_mapping(&self) -> Option<SharedMappingApi<'m>> {
        self.m.shared_mapping()
    }
}
