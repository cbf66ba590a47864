//! What a vendor writing a plugin in Rust implements: safe traits, one per
//! capability. The export layer ([`crate::export`]) turns them into vtables; no
//! vendor code is `unsafe extern "C"`.

use crate::abi::{self, MemplugDevice, MemplugObjectRef};
use crate::status::Status;
use core::ffi::c_void;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

/// A failure a plugin reports: a status code (never `Ok`) and a message the
/// host receives through its sink.
///
/// Build one with the helper named after its code
/// ([`PluginError::unknown_allocation`], [`PluginError::wrong_device`], …);
/// there is one for every failure code of [`Status`]. The message is the
/// host's only explanation: say what was refused and why, with the values
/// involved. It is formatted only on the failure path, so a hot path that
/// succeeds pays nothing for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    /// The code the slot returns (never `Status::Ok`).
    pub status: Status,
    /// What the host's message sink receives (nothing is sent when empty).
    pub message: String,
}

impl PluginError {
    /// A failure with `status`; an `Ok` status is turned into `Internal`,
    /// because an error that says "success" is a contradiction.
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        let status = if status == Status::Ok { Status::Internal } else { status };
        PluginError { status, message: message.into() }
    }
    /// `MEMPLUG_STATUS_UNSUPPORTED`: the operation is not provided (never
    /// for something that was done).
    pub fn unsupported(m: impl Into<String>) -> Self {
        Self::new(Status::Unsupported, m)
    }
    /// `MEMPLUG_STATUS_INVALID_ARGUMENT`: a malformed argument. The SDK
    /// already refuses the ones the ABI lists (NULL pointers, short
    /// structs, zero sizes, bad alignments, unknown flags and access bits,
    /// negative descriptors); use it for what only the mechanism knows, such
    /// as a descriptor it cannot use.
    pub fn invalid_argument(m: impl Into<String>) -> Self {
        Self::new(Status::InvalidArgument, m)
    }
    /// `MEMPLUG_STATUS_OUT_OF_MEMORY`: the device has no memory for the
    /// request, including sizes no object could have.
    pub fn out_of_memory(m: impl Into<String>) -> Self {
        Self::new(Status::OutOfMemory, m)
    }
    /// `MEMPLUG_STATUS_WRONG_MECHANISM`: the object was made by another
    /// mechanism. The SDK refuses references whose `mechanism_id` is not
    /// this mechanism's before your trait is called; you need this only for
    /// identities the SDK cannot see.
    pub fn wrong_mechanism(m: impl Into<String>) -> Self {
        Self::new(Status::WrongMechanism, m)
    }
    /// `MEMPLUG_STATUS_WRONG_DEVICE`: the object or request names a device
    /// this mechanism does not serve. The SDK refuses requests and
    /// references naming another device than the mechanism's before your
    /// trait is called.
    pub fn wrong_device(m: impl Into<String>) -> Self {
        Self::new(Status::WrongDevice, m)
    }
    /// `MEMPLUG_STATUS_UNKNOWN_ALLOCATION`: the handle names no live object
    /// of this mechanism and kind, or the reference's `object_id`, `addr`
    /// or `size` contradict the object's. Only the mechanism can tell: the
    /// SDK never checks handles.
    pub fn unknown_allocation(m: impl Into<String>) -> Self {
        Self::new(Status::UnknownAllocation, m)
    }
    /// `MEMPLUG_STATUS_DEVICE_UNAVAILABLE`: the device or its driver cannot
    /// be reached (absent, lost, not initialised).
    pub fn device_unavailable(m: impl Into<String>) -> Self {
        Self::new(Status::DeviceUnavailable, m)
    }
    /// `MEMPLUG_STATUS_INTERNAL`: the plugin failed internally. A panic in
    /// a trait method is reported with this code by the SDK.
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(Status::Internal, m)
    }
    /// `MEMPLUG_STATUS_OUT_OF_RANGE`: a range lies outside its object. The
    /// SDK refuses empty, unaligned and overflowing ranges; the bounds
    /// against your object's size are yours to check.
    pub fn out_of_range(m: impl Into<String>) -> Self {
        Self::new(Status::OutOfRange, m)
    }
    /// `MEMPLUG_STATUS_INVALID_STATE`: the object is in the wrong state
    /// (committing committed pages, mapping over a mapping, …).
    pub fn invalid_state(m: impl Into<String>) -> Self {
        Self::new(Status::InvalidState, m)
    }
    /// `MEMPLUG_STATUS_VERSION_MISMATCH`: the versions do not overlap. The
    /// SDK's negotiation reports it; a slot has no use for it.
    pub fn version_mismatch(m: impl Into<String>) -> Self {
        Self::new(Status::VersionMismatch, m)
    }
    /// `MEMPLUG_STATUS_NOT_READY`: a fence has not completed. A
    /// [`StreamSync::fence_query`] that returns [`FenceState::Pending`] gets
    /// this code with no message; you rarely need it directly.
    pub fn not_ready(m: impl Into<String>) -> Self {
        Self::new(Status::NotReady, m)
    }
    /// `MEMPLUG_STATUS_TIMEOUT`: a wait ran out of time. A
    /// [`StreamSync::fence_wait`] that returns [`FenceState::Pending`] gets
    /// this code with no message; you rarely need it directly.
    pub fn timeout(m: impl Into<String>) -> Self {
        Self::new(Status::Timeout, m)
    }
    /// `MEMPLUG_STATUS_BUSY`: the request cannot be carried out now without
    /// breaking something in use (for example a stream destroyed from one
    /// of its own host functions).
    pub fn busy(m: impl Into<String>) -> Self {
        Self::new(Status::Busy, m)
    }
    /// `MEMPLUG_STATUS_DEVICE_LOST` (ABI 1.2): the device or context is
    /// gone. Prefer [`HostLink::report_device_lost`](crate::HostLink),
    /// which also makes every later slot of the mechanism answer this and
    /// tells the host at once.
    pub fn device_lost(m: impl Into<String>) -> Self {
        Self::new(Status::DeviceLost, m)
    }
}

impl core::fmt::Display for PluginError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for PluginError {}

/// What every trait method returns.
pub type PluginResult<T> = Result<T, PluginError>;

/// A request as the plugin sees it: the prefix the host sent, zero-extended,
/// after the SDK's checks.
///
/// By the time a trait method sees it, the SDK has refused (before calling
/// you) every request whose `flags` has a bit no ABI minor defines, whose
/// `size` is zero, or whose `device` is not the mechanism's, so `flags` is
/// zero, `size` is at least 1 and `device` is the one given to
/// [`MechanismBuilder::new`](crate::MechanismBuilder::new). For
/// [`Allocator::allocate`] the alignment is checked too (see
/// [`Request::alignment`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// `MEMPLUG_REQUEST` flags: none is defined up to ABI 1.1, and the SDK
    /// refuses unknown bits, so this is zero when you see it.
    pub flags: u32,
    /// Bytes wanted; never zero when you see it.
    pub size: u64,
    /// For [`Allocator::allocate`]: a power of two, at most the
    /// mechanism's `max_alignment` (both checked by the SDK) and at least
    /// its `min_alignment` — a smaller request is raised to `min_alignment`
    /// by the SDK, so aligning to exactly this value honours both the
    /// request and the promise `min_alignment` makes. For `reserve`,
    /// `create` and `import_fd` the ABI says the field is ignored (they
    /// align to the granularity): it is passed as the host sent it,
    /// unchecked.
    pub alignment: u64,
    /// Host-assigned identifier of the object to be made, unique for the
    /// life of the host process. Remember it: a later reference whose
    /// `object_id` differs is `UNKNOWN_ALLOCATION`.
    pub object_id: u64,
    /// The device the host believes it is talking to; always the
    /// mechanism's device when you see it.
    pub device: MemplugDevice,
    /// The raw `MEMPLUG_CLASS_*` tag (ABI 1.1); `MEMPLUG_CLASS_OTHER` when
    /// the host sent a 1.0 request. Read it through [`Request::class`],
    /// which maps values this SDK does not know to `Other`.
    pub class_tag: u32,
    /// `MEMPLUG_HINT_*` bits (ABI 1.2; zero from an older host). Hints
    /// never make a request fail: ignore bits you do not know.
    pub hints: u32,
    /// `MEMPLUG_HANDLE_*` kinds the caller will export the object as (ABI
    /// 1.2; zero from an older host). Refuse with `UNSUPPORTED` what you
    /// cannot make exportable that way.
    pub export_types: u32,
    /// The page size wanted (ABI 1.2): zero (your choice), or one your
    /// [`Descriptor::page_sizes`](crate::Descriptor) lists — the SDK has
    /// refused any other with `INVALID_ARGUMENT`.
    pub page_size: u64,
    /// Where the memory should live (ABI 1.2; `Location::ANY` from an
    /// older host). Refuse with `UNSUPPORTED` a place you cannot use.
    pub location: crate::Location,
}

impl Request {
    /// Whether the caller accepts uninitialised memory
    /// (`MEMPLUG_HINT_UNINITIALIZED_OK`): a zero-filling mechanism may skip
    /// the fill.
    #[inline]
    pub fn uninitialized_ok(&self) -> bool {
        self.hints & abi::MEMPLUG_HINT_UNINITIALIZED_OK != 0
    }

    /// What the memory is for; unknown tags are `Other` (ABI rule).
    #[inline]
    pub fn class(&self) -> RequestClass {
        RequestClass::from_tag(self.class_tag)
    }
}

/// The allocation class a host tagged a request with (ABI 1.1,
/// `MEMPLUG_CLASS_*`). A hint for placement and accounting; it never
/// changes whether a call succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestClass {
    /// `MEMPLUG_CLASS_OTHER`, and every tag this SDK does not know.
    Other,
    /// `MEMPLUG_CLASS_WEIGHTS`.
    Weights,
    /// `MEMPLUG_CLASS_KV`.
    Kv,
    /// `MEMPLUG_CLASS_ACTIVATIONS`.
    Activations,
    /// `MEMPLUG_CLASS_WORKSPACE`.
    Workspace,
}

impl RequestClass {
    /// Every class, in tag order (`ALL[c.tag()] == c`).
    pub const ALL: [RequestClass; 5] = [
        RequestClass::Other,
        RequestClass::Weights,
        RequestClass::Kv,
        RequestClass::Activations,
        RequestClass::Workspace,
    ];

    /// Decodes a tag; unknown values are `Other`, the most conservative
    /// meaning.
    #[inline]
    pub const fn from_tag(tag: u32) -> RequestClass {
        match tag {
            abi::MEMPLUG_CLASS_WEIGHTS => RequestClass::Weights,
            abi::MEMPLUG_CLASS_KV => RequestClass::Kv,
            abi::MEMPLUG_CLASS_ACTIVATIONS => RequestClass::Activations,
            abi::MEMPLUG_CLASS_WORKSPACE => RequestClass::Workspace,
            _ => RequestClass::Other,
        }
    }

    /// The `MEMPLUG_CLASS_*` value.
    #[inline]
    pub const fn tag(self) -> u32 {
        match self {
            RequestClass::Other => abi::MEMPLUG_CLASS_OTHER,
            RequestClass::Weights => abi::MEMPLUG_CLASS_WEIGHTS,
            RequestClass::Kv => abi::MEMPLUG_CLASS_KV,
            RequestClass::Activations => abi::MEMPLUG_CLASS_ACTIVATIONS,
            RequestClass::Workspace => abi::MEMPLUG_CLASS_WORKSPACE,
        }
    }
}

/// An object a plugin made: address (zero for a physical object), actual
/// size, and the plugin's own handle. The SDK writes it into the host's
/// `MemplugBlock` only when the method returns `Ok`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Block {
    /// Device address of the first byte; zero for a physical object.
    pub addr: u64,
    /// Bytes actually obtained: at least the bytes requested (for
    /// reservations and physical objects, rounded up to the granularity).
    pub size: u64,
    /// Your handle for the object, opaque to the host, which sends it back
    /// in every [`ObjectRef`] to this object.
    pub handle: u64,
}

/// The host's name for an object the plugin made earlier.
///
/// Untrusted, but partly checked: before any trait method sees one, the
/// SDK has refused references whose `mechanism_id` is not the mechanism's
/// (`WRONG_MECHANISM`) or whose `device` is not the mechanism's
/// (`WRONG_DEVICE`), in that order. What only you can check is left to you:
/// that `handle` names a live object of yours of the kind the method takes
/// (an allocation passed as a reservation is `UNKNOWN_ALLOCATION`), and that
/// `object_id`, `addr` and `size` are those of that object. Compare `size`
/// with what you recorded, never trust it as a bound.
pub type ObjectRef = MemplugObjectRef;

/// Static properties of a mechanism, as [`Allocator::properties`] reports
/// them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Properties {
    /// Alignment every allocation has at least (a power of two).
    pub min_alignment: u64,
    /// Largest alignment `allocate` honours (a power of two, at least
    /// `min_alignment`); the SDK refuses larger requests.
    pub max_alignment: u64,
    /// Granularity of virtual ranges and physical objects (a power of
    /// two); zero when the mechanism has neither capability. The SDK
    /// refuses ranges that are not multiples of it.
    pub granularity: u64,
}

/// Free and total memory of the device, as it reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    /// Bytes free on the device.
    pub free_bytes: u64,
    /// Bytes the device has in all (non-zero, at least `free_bytes`).
    pub total_bytes: u64,
}

/// Whether a fence has completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceState {
    /// The work recorded before the fence has run.
    Complete,
    /// It has not yet.
    Pending,
}

/// A host function to run on a stream. Sending it to another thread is what
/// the ABI asks for; the host promises `userdata` may be used from there.
#[derive(Clone, Copy, Debug)]
pub struct HostFn {
    func: unsafe extern "C" fn(*mut c_void),
    userdata: *mut c_void,
}

// SAFETY: the ABI requires a host function and its userdata to be callable
// from any plugin thread (ARCHITECTURE.md §3, Sync).
unsafe impl Send for HostFn {}

impl HostFn {
    /// # Safety
    /// `func(userdata)` must be callable once from any thread.
    pub unsafe fn new(func: unsafe extern "C" fn(*mut c_void), userdata: *mut c_void) -> Self {
        HostFn { func, userdata }
    }

    /// Runs the function. Host functions must not unwind (the ABI forbids
    /// it), so nothing is caught here.
    pub fn call(self) {
        // SAFETY: guaranteed by the constructor's contract.
        unsafe { (self.func)(self.userdata) }
    }
}

/// Required capability: plain allocations.
///
/// Every method is called through the SDK's slot functions, which run it
/// behind a panic boundary (a panic is `MEMPLUG_STATUS_INTERNAL` with its
/// message), turn `Err` into its code and message, and write the host's
/// out-params only on `Ok`. Before calling you they read the host's structs
/// as untrusted prefixes (NULL and short structs refused), check the
/// out-param can be written, and check what the mechanism's facts decide
/// (see each method). Methods are called from any thread, concurrently.
///
/// A minimal mechanism: a bump arena that cuts blocks from one buffer and
/// starts over when the last block is freed, exported as a plugin and used
/// through the host.
///
/// ```
/// use memplug_sdk::{abi, Allocator, Block, ExportedPlugin, MechanismBuilder, ObjectRef};
/// use memplug_sdk::{PluginBuilder, PluginError, PluginResult, Properties, Request};
/// use std::alloc::{alloc_zeroed, dealloc, Layout};
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// const ARENA: Layout = match Layout::from_size_align(1 << 20, 4096) {
///     Ok(l) => l,
///     Err(_) => panic!("a valid layout"),
/// };
///
/// struct Arena {
///     base: u64,
///     carved: Mutex<Carved>,
/// }
///
/// #[derive(Default)]
/// struct Carved {
///     /// Offset of the first byte not yet handed out.
///     next: u64,
///     last_handle: u64,
///     /// handle → (object_id, addr, size), to check references against.
///     live: HashMap<u64, (u64, u64, u64)>,
/// }
///
/// impl Arena {
///     fn new() -> Arena {
///         // SAFETY: ARENA is not zero-sized.
///         let p = unsafe { alloc_zeroed(ARENA) };
///         assert!(!p.is_null(), "no memory for the arena");
///         Arena { base: p as u64, carved: Mutex::default() }
///     }
/// }
///
/// impl Drop for Arena {
///     fn drop(&mut self) {
///         // SAFETY: allocated in `new` with ARENA; the host unloads the
///         // plugin (and so drops this) only when no block is live.
///         unsafe { dealloc(self.base as *mut u8, ARENA) }
///     }
/// }
///
/// impl Allocator for Arena {
///     fn properties(&self) -> Properties {
///         Properties { min_alignment: 16, max_alignment: 4096, granularity: 0 }
///     }
///
///     // Size 0, a bad alignment or another device never get here.
///     fn allocate(&self, r: &Request) -> PluginResult<Block> {
///         let mut c = self.carved.lock().unwrap();
///         let end_of_arena = self.base + ARENA.size() as u64;
///         let addr = (self.base + c.next).next_multiple_of(r.alignment);
///         let end = addr.checked_add(r.size).filter(|&e| e <= end_of_arena);
///         let end = end.ok_or_else(|| PluginError::out_of_memory(format!("{} B do not fit", r.size)))?;
///         c.next = end - self.base;
///         c.last_handle += 1;
///         let handle = c.last_handle;
///         c.live.insert(handle, (r.object_id, addr, r.size));
///         Ok(Block { addr, size: r.size, handle })
///     }
///
///     // Another mechanism's or device's reference never gets here; whether
///     // the handle is a live block of ours is ours to check.
///     fn deallocate(&self, o: &ObjectRef) -> PluginResult<()> {
///         let mut c = self.carved.lock().unwrap();
///         if c.live.get(&o.handle) != Some(&(o.object_id, o.addr, o.size)) {
///             return Err(PluginError::unknown_allocation(format!("handle {} is no live block", o.handle)));
///         }
///         c.live.remove(&o.handle);
///         if c.live.is_empty() {
///             c.next = 0;
///         }
///         Ok(())
///     }
/// }
///
/// const CPU0: abi::MemplugDevice = abi::MemplugDevice { kind: abi::MEMPLUG_DEVICE_CPU, ordinal: 0 };
///
/// fn arena_plugin() -> ExportedPlugin {
///     let arena = MechanismBuilder::new("arena", 1, CPU0, Arena::new());
///     let state = arena.state(); // freed with the plugin at unload
///     PluginBuilder::new("arena-plugin", "0.1.0")
///         .mechanism(arena.build())
///         .live_objects(move || state.carved.lock().unwrap().live.len() as u64)
///         .build()
/// }
/// // In a cdylib: `memplug_sdk::export_plugin!(arena_plugin);`. Linked in:
/// memplug_sdk::declare_entry!(arena_entry, arena_plugin);
///
/// // The host's side.
/// use memplug_host::{governor::AllocationClass, *};
///
/// let mgr = ProcessMemoryManager::new();
/// // SAFETY: the entry is the SDK's, for the plugin above.
/// mgr.register_plugin(unsafe { Plugin::from_entry(arena_entry, "arena", &LoadOptions::default()) }?)?;
/// let ctx = mgr.select(CPU0, Requirements::ALLOCATOR_ONLY)?;
/// let pool = mgr.create_pool("arena", 1 << 20)?;
/// let b = mgr.bind(&ctx, &pool, BindingSpec::new(AllocationClass::Other))?;
///
/// let x = b.allocate(1000, 8)?;
/// assert_eq!(x.addr() % 16, 0); // raised to min_alignment
/// let y = b.allocate(64, 64)?;
/// assert!(y.addr() >= x.addr() + 1000);
/// let refused = b.allocate(64, 3).unwrap_err(); // not a power of two: refused before the arena
/// assert!(matches!(refused, BindingError::Plugin(e) if e.status == Status::InvalidArgument));
///
/// drop((x, y, b, ctx));
/// mgr.unload_plugin("arena-plugin")?; // nothing live: the arena is freed
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Allocator: Send + Sync + 'static {
    /// Whether `memory_info` is published; when false the slot is NULL and
    /// the host reports the absence.
    const HAS_MEMORY_INFO: bool = false;

    /// The mechanism's properties. Called once, by
    /// [`MechanismBuilder::new`](crate::MechanismBuilder::new): the SDK
    /// answers the `properties` slot with that copy and checks every request
    /// and range against it, so it must not change afterwards. The host
    /// refuses a mechanism whose alignments are not powers of two with
    /// `min_alignment <= max_alignment`, or whose granularity is not a power
    /// of two while it publishes virtual backing or shared mapping.
    fn properties(&self) -> Properties;

    /// The memory descriptor (ABI 1.2): page sizes, attributes, export
    /// kinds, location. Called once, at build time, like
    /// [`Allocator::properties`]; published only to hosts that agreed on
    /// 1.2. Default: nothing said.
    fn descriptor(&self) -> crate::Descriptor {
        crate::Descriptor::default()
    }

    /// Makes an allocation of at least `request.size` bytes aligned to
    /// `request.alignment`.
    ///
    /// Already checked by the SDK: no unknown flag bits, `size` non-zero,
    /// `alignment` a power of two no larger than `max_alignment` (all
    /// `INVALID_ARGUMENT`), `device` the mechanism's (`WRONG_DEVICE`), and
    /// the host's out block writable. `alignment` is at least
    /// `min_alignment` (the SDK raises smaller requests).
    ///
    /// Yours: sizes you cannot serve (`OUT_OF_MEMORY`, also for sizes no
    /// object could have, such as 2^63), and remembering `object_id` with
    /// the block so that [`Allocator::deallocate`] can check references.
    fn allocate(&self, request: &Request) -> PluginResult<Block>;

    /// Frees an allocation made by [`Allocator::allocate`].
    ///
    /// Already checked by the SDK: `object.mechanism_id`
    /// (`WRONG_MECHANISM`) and `object.device` (`WRONG_DEVICE`).
    ///
    /// Yours: that `object.handle` names a live allocation of this
    /// mechanism (not a reservation or physical object, not already freed)
    /// whose `object_id`, `addr` and `size` are those in the reference —
    /// `UNKNOWN_ALLOCATION` otherwise, changing nothing.
    fn deallocate(&self, object: &ObjectRef) -> PluginResult<()>;

    /// Free and total bytes of the device. Called only when
    /// `HAS_MEMORY_INFO` is true; must then not answer `UNSUPPORTED`.
    fn memory_info(&self) -> PluginResult<MemoryInfo> {
        Err(PluginError::unsupported("memory_info is not published"))
    }
}

/// Optional capability: reserve address ranges, commit and decommit
/// physical memory in them, release them.
///
/// Already checked by the SDK for every method, before it is called: each
/// reservation reference's `mechanism_id` (`WRONG_MECHANISM`) and `device`
/// (`WRONG_DEVICE`), and for `commit` and `decommit` that the range
/// `(offset, len)` is non-empty, a multiple of the granularity at both ends
/// and that `offset + len` does not overflow (all `OUT_OF_RANGE`). The SDK
/// cannot know a reservation's real size, so the bound `offset + len <=
/// size` (`OUT_OF_RANGE`) is yours, against the size you recorded.
pub trait VirtualBacking: Send + Sync + 'static {
    /// Reserves `request.size` bytes rounded up to the granularity, nothing
    /// committed, at a granularity-aligned address. The request is checked
    /// as for [`Allocator::allocate`] except the alignment, which the ABI
    /// says is ignored and is passed unchecked. Yours: rounding (a size
    /// that cannot be rounded is `OUT_OF_MEMORY`) and remembering
    /// `object_id`.
    fn reserve(&self, request: &Request) -> PluginResult<Block>;
    /// Makes `[offset, offset + len)` usable. Yours: the handle names a live
    /// reservation (`UNKNOWN_ALLOCATION`), the range is within it
    /// (`OUT_OF_RANGE`), no page of it is committed or mapped
    /// (`INVALID_STATE`); on failure nothing is committed.
    fn commit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    /// Gives the memory of `[offset, offset + len)` back; it reads as zeros
    /// after a later commit. Yours: as for `commit`, with every page
    /// committed (`INVALID_STATE` otherwise).
    fn decommit(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    /// Bytes committed by `commit` and not decommitted (mapped ranges do
    /// not count). Yours: the handle (`UNKNOWN_ALLOCATION`).
    fn committed_bytes(&self, reservation: &ObjectRef) -> PluginResult<u64>;
    /// Decommits everything, unmaps every shared mapping in the reservation
    /// (dropping their references) and gives the range back. Yours: the
    /// handle (`UNKNOWN_ALLOCATION`).
    fn release(&self, reservation: &ObjectRef) -> PluginResult<()>;

    /// Whether binding is also a queue operation (ABI 1.2,
    /// `MEMPLUG_CAP_QUEUED_BINDING`): `commit_on`/`decommit_on` (and, with
    /// a shared mapping, its `map_on`/`unmap_on`, which must then be
    /// implemented too) are published to 1.2 hosts. Needs the sync
    /// capability: the stream and the fence returned are yours.
    const CAN_QUEUE: bool = false;

    /// `commit` enqueued on `stream` after its earlier work; returns a fence
    /// that completes once the range is usable. The reservation and range
    /// are checked as for `commit`; the stream is yours to check.
    fn commit_on(
        &self,
        _reservation: &ObjectRef,
        _offset: u64,
        _len: u64,
        _stream: u64,
    ) -> PluginResult<u64> {
        Err(PluginError::unsupported("commit_on is not published"))
    }

    /// `decommit` enqueued on `stream`, as [`commit_on`](Self::commit_on).
    fn decommit_on(
        &self,
        _reservation: &ObjectRef,
        _offset: u64,
        _len: u64,
        _stream: u64,
    ) -> PluginResult<u64> {
        Err(PluginError::unsupported("decommit_on is not published"))
    }
}

/// Optional capability (ABI 1.2, `MEMPLUG_CAP_PEER_ACCESS`): giving other
/// devices access to this mechanism's memory. The SDK checks the
/// reservation reference and the range as for `commit`, and the access
/// bits (`INVALID_ARGUMENT` for unknown bits); the peer device is yours to
/// judge.
pub trait PeerAccess: Send + Sync + 'static {
    /// `MEMPLUG_ACCESS_*` bits `peer` can be given (zero: none).
    fn can_access_peer(&self, peer: MemplugDevice) -> PluginResult<u32>;
    /// Sets what `peer` may do with the range (`access` zero revokes).
    fn set_peer_access(
        &self,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        peer: MemplugDevice,
        access: u32,
    ) -> PluginResult<()>;
}

/// Access of a shared mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `MEMPLUG_ACCESS_READ`: writes through the mapping fault.
    ReadOnly,
    /// `MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE`.
    ReadWrite,
}

impl Access {
    /// Decodes `MEMPLUG_ACCESS_*` bits; anything but read or read|write is
    /// refused rather than guessed at.
    pub fn from_bits(bits: u32) -> Option<Access> {
        match bits {
            abi::MEMPLUG_ACCESS_READ => Some(Access::ReadOnly),
            b if b == abi::MEMPLUG_ACCESS_READ | abi::MEMPLUG_ACCESS_WRITE => Some(Access::ReadWrite),
            _ => None,
        }
    }
    /// The `MEMPLUG_ACCESS_*` bits.
    pub fn bits(self) -> u32 {
        match self {
            Access::ReadOnly => abi::MEMPLUG_ACCESS_READ,
            Access::ReadWrite => abi::MEMPLUG_ACCESS_READ | abi::MEMPLUG_ACCESS_WRITE,
        }
    }
}

/// Optional capability: physical objects mapped into ranges of
/// reservations of the same mechanism.
///
/// Already checked by the SDK for every method, before it is called: each
/// object and reservation reference's `mechanism_id` (`WRONG_MECHANISM`)
/// and `device` (`WRONG_DEVICE`); for `map` the access bits (read or
/// read|write, else `INVALID_ARGUMENT`) and both ranges, and for `unmap`
/// its range: non-empty, multiples of the granularity, no overflow of
/// `offset + len` (`OUT_OF_RANGE`). Yours: handles (`UNKNOWN_ALLOCATION`,
/// including a reservation passed as a physical object), bounds against the
/// sizes you recorded (`OUT_OF_RANGE`), and state (`INVALID_STATE`);
/// nothing changes on failure.
pub trait SharedMapping: Send + Sync + 'static {
    /// Creates a zero-filled physical object of `request.size` bytes
    /// rounded up to the granularity, holding one reference; `addr` is
    /// zero. The request is checked as for [`VirtualBacking::reserve`].
    fn create(&self, request: &Request) -> PluginResult<Block>;
    /// Maps `[object_offset, object_offset + len)` of `object` at
    /// `[offset, offset + len)` of `reservation`, adding a reference to the
    /// object. Yours: both handles, both bounds, and that the reservation
    /// range is neither committed nor mapped (`INVALID_STATE`).
    #[allow(clippy::too_many_arguments)]
    fn map(
        &self,
        object: &ObjectRef,
        object_offset: u64,
        reservation: &ObjectRef,
        offset: u64,
        len: u64,
        access: Access,
    ) -> PluginResult<()>;
    /// Unmaps exactly one earlier mapping that starts at `offset` of
    /// `reservation` and spans `len` bytes, dropping its reference. Yours:
    /// the handle, and that such a mapping exists.
    fn unmap(&self, reservation: &ObjectRef, offset: u64, len: u64) -> PluginResult<()>;
    /// Adds a reference to `object`. Yours: the handle.
    fn retain(&self, object: &ObjectRef) -> PluginResult<()>;
    /// Whether `map_on`/`unmap_on` are published (ABI 1.2, with the virtual
    /// backing's `CAN_QUEUE`: `MEMPLUG_CAP_QUEUED_BINDING` needs both).
    const CAN_QUEUE_MAPS: bool = false;
    /// `map` enqueued on `stream` (ABI 1.2); returns a fence that completes
    /// once the mapping is usable. Checked as for `map`.
    #[allow(clippy::too_many_arguments)]
    fn map_on(
        &self,
        _object: &ObjectRef,
        _object_offset: u64,
        _reservation: &ObjectRef,
        _offset: u64,
        _len: u64,
        _access: Access,
        _stream: u64,
    ) -> PluginResult<u64> {
        Err(PluginError::unsupported("map_on is not published"))
    }
    /// `unmap` enqueued on `stream`, as [`map_on`](Self::map_on).
    fn unmap_on(&self, _reservation: &ObjectRef, _offset: u64, _len: u64, _stream: u64) -> PluginResult<u64> {
        Err(PluginError::unsupported("unmap_on is not published"))
    }
    /// Drops a reference from `create` or `retain`; the memory goes back
    /// when the last reference (mappings included) is gone. Yours: the
    /// handle, and refusing a release too many.
    fn release(&self, object: &ObjectRef) -> PluginResult<()>;

    /// Whether `export_fd` and `import_fd` are published (ABI 1.1,
    /// `MEMPLUG_CAP_SHARED_EXPORT`). When false the slots are NULL, the
    /// flag is clear, and the two methods below are never called. Hosts
    /// that agreed on 1.0 never see them either way.
    const CAN_EXPORT: bool = false;

    /// A new descriptor for the memory of a live physical object, owned by
    /// the caller (the host, which may pass it to another process). Called
    /// only when `CAN_EXPORT` is true, with the reference checked as for
    /// the other methods and the host's `out_fd` non-NULL. Yours: the
    /// handle; make the descriptor for this call (never one you keep).
    fn export_fd(&self, _object: &ObjectRef) -> PluginResult<OwnedFd> {
        Err(PluginError::unsupported("export_fd is not published"))
    }

    /// A physical object backed by the memory `fd` names, of
    /// `request.size` bytes (rounded up to the granularity), holding one
    /// reference as from `create`. `fd` stays the caller's: duplicate what
    /// you keep. Called only when `CAN_EXPORT` is true, with `fd`
    /// non-negative and the request checked as for `create`. Yours: a
    /// descriptor you cannot use (`INVALID_ARGUMENT`), and a size larger
    /// than the memory behind it.
    fn import_fd(&self, _fd: BorrowedFd<'_>, _request: &Request) -> PluginResult<Block> {
        Err(PluginError::unsupported("import_fd is not published"))
    }

    /// Whether `export_handle` and `import_handle` are published (ABI 1.2,
    /// `MEMPLUG_CAP_TYPED_EXPORT`), to hosts that agreed on 1.2. The kinds
    /// offered are your [`Descriptor::export_types`](crate::Descriptor).
    const CAN_EXPORT_HANDLES: bool = false;

    /// A new handle of kind `handle_type` for a live physical object's
    /// memory, owned by the caller. Called only when `CAN_EXPORT_HANDLES`
    /// is true, with the reference checked, `handle_type` one kind your
    /// descriptor's `export_types` lists (else the SDK answered
    /// `UNSUPPORTED`), and the host's out struct writable. Return a handle
    /// of exactly that kind (another is refused as your internal error).
    /// Yours: an object not made exportable that way (`UNSUPPORTED`).
    fn export_handle(&self, _object: &ObjectRef, _handle_type: u32) -> PluginResult<crate::Handle> {
        Err(PluginError::unsupported("export_handle is not published"))
    }

    /// A physical object backed by `handle`'s memory, of `request.size`
    /// bytes (rounded up to the granularity), holding one reference as from
    /// `create`. The handle stays the caller's. Called only when
    /// `CAN_EXPORT_HANDLES` is true, with the handle's kind one your
    /// descriptor lists, a descriptor non-negative, a blob at most 64 bytes,
    /// and the request checked as for `create`. Yours: a handle you cannot
    /// use (`INVALID_ARGUMENT`), a size larger than the memory behind it.
    fn import_handle(&self, _handle: crate::HandleRef<'_>, _request: &Request) -> PluginResult<Block> {
        Err(PluginError::unsupported("import_handle is not published"))
    }
}

/// Optional capability: streams and fences. (Named `StreamSync` so it does
/// not shadow `std::marker::Sync`.)
///
/// Streams and fences are your own non-zero `u64` handles; the SDK cannot
/// check them, so every method that takes one must refuse a handle that
/// names no live stream or fence of this mechanism with
/// `UNKNOWN_ALLOCATION`. The SDK checks the host's out-pointers (non-NULL,
/// before calling you) and a host function's pointer, and maps
/// [`FenceState::Pending`] to `NOT_READY` (query) or `TIMEOUT` (wait)
/// without a message.
pub trait StreamSync: Send + Sync + 'static {
    /// Whether `stream_adopt` is published.
    const CAN_ADOPT: bool = false;

    /// Creates a stream owned by the plugin.
    fn stream_create(&self) -> PluginResult<u64>;
    /// Wraps a runtime's native stream without owning it. Called only when
    /// `CAN_ADOPT` is true; `native` is unchecked (refuse NULL with
    /// `INVALID_ARGUMENT`).
    fn stream_adopt(&self, _native: *mut c_void) -> PluginResult<u64> {
        Err(PluginError::unsupported("stream_adopt is not published"))
    }
    /// Destroys a stream after its submitted work has run (blocks until
    /// then); from one of the stream's own host functions it is `BUSY` and
    /// destroys nothing.
    fn stream_destroy(&self, stream: u64) -> PluginResult<()>;
    /// Runs `f` on the stream after the work submitted before it: exactly
    /// once when this returns `Ok`, never when it fails.
    fn enqueue_host_fn(&self, stream: u64, f: HostFn) -> PluginResult<()>;
    /// Records a fence that completes when the work submitted to `stream`
    /// before it has run.
    fn fence_record(&self, stream: u64) -> PluginResult<u64>;
    /// Whether the fence has completed; never blocks. Monotonic: once
    /// complete, complete until destroyed.
    fn fence_query(&self, fence: u64) -> PluginResult<FenceState>;
    /// Blocks until the fence completes or `timeout` passes. The host's
    /// `UINT64_MAX` nanoseconds (the largest `Duration` this is given)
    /// means no limit: never answer `Pending` then.
    fn fence_wait(&self, fence: u64, timeout: Duration) -> PluginResult<FenceState>;
    /// Destroys a fence handle, complete or not.
    fn fence_destroy(&self, fence: u64) -> PluginResult<()>;

    /// Whether `stream_wait_fence` is published (ABI 1.2).
    const CAN_WAIT_FENCE: bool = false;
    /// Later work on `stream` waits for `fence` (one of yours, possibly of
    /// another stream), without blocking the caller. Both handles are
    /// yours to check.
    fn stream_wait_fence(&self, _stream: u64, _fence: u64) -> PluginResult<()> {
        Err(PluginError::unsupported("stream_wait_fence is not published"))
    }

    /// Whether `stream_adopt_typed` is published (ABI 1.2).
    const CAN_ADOPT_TYPED: bool = false;
    /// [`stream_adopt`](Self::stream_adopt) with the native stream's API
    /// named by its `MEMPLUG_DEVICE_*` kind; refuse a kind you do not adopt
    /// with `UNSUPPORTED`.
    fn stream_adopt_typed(&self, _native_kind: u32, _native: *mut c_void) -> PluginResult<u64> {
        Err(PluginError::unsupported("stream_adopt_typed is not published"))
    }

    /// Whether `copy` is published (ABI 1.3). [`copy_kinds`](Self::copy_kinds)
    /// must then name at least one address space.
    const CAN_COPY: bool = false;
    /// The `MEMPLUG_COPY_*` spaces `copy` copies between, published in the
    /// properties to hosts of 1.3 (called once, when the sync capability is
    /// added to the mechanism; ignored without `CAN_COPY`).
    fn copy_kinds(&self) -> u32 {
        0
    }
    /// Enqueues on `stream` a copy of `len` bytes from `src` to `dst`, after
    /// the work before it and before the work after it; returns without
    /// waiting. The SDK has answered `len` 0 with `OK` and refused ranges
    /// that wrap or overlap ([`crate::check_copy_ranges`]), so `len > 0`
    /// and the ranges are disjoint; whether each lies in memory you can
    /// copy (inside one of your allocations or committed or mapped ranges:
    /// `OUT_OF_RANGE` past one; `UNSUPPORTED` in a space you do not
    /// publish) and the stream are yours to check, before enqueuing.
    fn copy(&self, _stream: u64, _dst: u64, _src: u64, _len: u64) -> PluginResult<()> {
        Err(PluginError::unsupported("copy is not published"))
    }
}
