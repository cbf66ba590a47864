//! Types the C API shares with C: handles, option and information structs,
//! callbacks, constants. Layout rules as in the plugin ABI (ARCHITECTURE.md §3):
//! every struct that can grow starts with `uint32_t struct_size`; later
//! minors only append.

use core::ffi::{c_char, c_void};
use memplug_sdk::abi::MemplugDevice;
use memplug_sdk::prefix::{self, PrefixError, Prefixed};

/// Major version of this C API: changes only with an incompatible change.
pub const MEMPLUG_HOST_API_MAJOR: u32 = 1;
/// Minor version of this C API: grows when functions or struct fields are
/// appended.
pub const MEMPLUG_HOST_API_MINOR: u32 = 2;

/// Longest name kept in a `MemplugHostMechanismInfo`, NUL included; longer
/// names are truncated.
pub const MEMPLUG_HOST_NAME_MAX: usize = 64;

/// Allocation class: anything else. The numbers of the classes are those
/// of the plugin ABI's `MEMPLUG_CLASS_*` (memplug.h), so a class means the
/// same number on both sides; a number this library does not know is
/// refused where it is an input.
pub const MEMPLUG_HOST_CLASS_OTHER: u32 = 0;
/// Allocation class: model weights (long-lived).
pub const MEMPLUG_HOST_CLASS_WEIGHTS: u32 = 1;
/// Allocation class: key/value cache (evictable by its holder).
pub const MEMPLUG_HOST_CLASS_KV: u32 = 2;
/// Allocation class: activations of in-flight work.
pub const MEMPLUG_HOST_CLASS_ACTIVATIONS: u32 = 3;
/// Allocation class: short-lived scratch space.
pub const MEMPLUG_HOST_CLASS_WORKSPACE: u32 = 4;
/// Number of allocation classes of this version.
pub const MEMPLUG_HOST_CLASS_COUNT: u32 = 5;

/// Lowest holder priority: asked first under pressure.
pub const MEMPLUG_HOST_PRIORITY_LOWEST: u32 = 0;
/// Highest holder priority; also the priority of a request made on behalf
/// of no holder.
pub const MEMPLUG_HOST_PRIORITY_HIGHEST: u32 = u32::MAX;

/// A process memory manager: plugins, pools, holders, bindings, and every
/// object issued through them. Create with `memplug_host_manager_create`,
/// destroy with `memplug_host_manager_destroy`.
///
/// Every handle type of this API is a 64-bit value in a struct, passed by
/// value. The zero handle (`{0}`) names nothing: destroying or freeing it
/// is a no-op, any other use is `MEMPLUG_HOST_STATUS_INVALID_HANDLE`. A
/// handle that was freed is refused with `MEMPLUG_HOST_STATUS_STALE_HANDLE`
/// (forever: handles are generational and never reissued), one that was
/// never issued with `MEMPLUG_HOST_STATUS_INVALID_HANDLE`, one of another
/// manager with `MEMPLUG_HOST_STATUS_WRONG_MANAGER` — never undefined
/// behaviour. Handles are plain values: copy them, pass them to any thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostManager {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A mechanism of a loaded plugin, pinned: while this handle lives the
/// plugin cannot be unloaded. Release with `memplug_host_mechanism_release`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostMechanism {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A budget pool (one physical memory domain). Release the handle with
/// `memplug_host_pool_release`; the pool itself lives while bindings use it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostPool {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A holder registered with a pool: answers pressure tickets. Unregister
/// with `memplug_host_holder_unregister`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostHolder {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A binding (mechanism + pool + holder + class): the only way to
/// allocate. Destroy with `memplug_host_binding_destroy`; what it allocated
/// stays valid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostBinding {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// An allocation made through a binding. Free with
/// `memplug_host_allocation_free` or `memplug_host_allocation_free_after`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostAllocation {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A virtual region: reserved address space at a stable base, grown and
/// shrunk in granules. Free with `memplug_host_region_free[_after]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostRegion {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A shared prefix: physical memory charged once, mapped read-only into
/// any number of regions. Release the handle with
/// `memplug_host_prefix_release`; regions mapping it keep it alive.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostPrefix {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A stream made by a mechanism's sync capability. Destroy with
/// `memplug_host_stream_destroy`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostStream {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A fence: recorded by a plugin on one of its streams, or supplied by the
/// runtime as callbacks. Release the handle with
/// `memplug_host_fence_release`; frees waiting on it keep it alive.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostFence {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// A subscription to a mechanism's lifecycle events
/// (`memplug_host_mechanism_subscribe`). End it with
/// `memplug_host_mechanism_unsubscribe`; the manager's destruction ends it
/// too.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemplugHostSubscription {
    /// Opaque; zero is the null handle.
    pub id: u64,
}

/// Where a mechanism's context is in its life
/// (`memplug_host_mechanism_state`). States only go forward:
/// `ACTIVE` → `RETIRING` → (`LOST`) → `TERMINATED`, or `ACTIVE` → `LOST` →
/// `TERMINATED`. Numbers are never reused; treat one this header does not
/// name as "not active".
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemplugHostLifeState {
    /// Serving: new bindings, allocations, regions and prefixes are made
    /// here.
    Active = 0,
    /// Ending in order (retired by the runtime, or replaced): no new
    /// binding or object; existing objects keep working and are freed as
    /// usual; it terminates once the last is gone.
    Retiring = 1,
    /// The device or context is gone (the plugin reported it, a call
    /// answered `MEMPLUG_HOST_STATUS_DEVICE_LOST`, or the runtime declared
    /// it): the host calls its plugin no more, and every object it made went
    /// with it. New work fails with `MEMPLUG_HOST_STATUS_DEVICE_LOST`.
    Lost = 2,
    /// Over: nothing in flight, every charge of the context settled exactly
    /// once (`MemplugHostSettlement`). Handles that outlive it are inert:
    /// destroying them calls no plugin and refunds nothing.
    Terminated = 3,
}

/// Versions of the library (`memplug_host_get_version`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostVersion {
    /// Set by the caller to `sizeof(MemplugHostVersion)`; set by the
    /// library to the bytes it wrote.
    pub struct_size: u32,
    /// Library version (semantic versioning).
    pub major: u32,
    /// Library minor version.
    pub minor: u32,
    /// Library patch version.
    pub patch: u32,
    /// C API version the library implements (compare with
    /// `MEMPLUG_HOST_API_MAJOR` / `MEMPLUG_HOST_API_MINOR` of the header).
    pub api_major: u32,
    /// C API minor version the library implements (a library serves every
    /// header of its major with a minor up to this).
    pub api_minor: u32,
    /// Plugin ABI major the host loads (`MEMPLUG_ABI_MAJOR`).
    pub abi_major: u32,
    /// Oldest plugin ABI minor the host negotiates.
    pub abi_min_minor: u32,
    /// Newest plugin ABI minor the host negotiates (see `abi_min_minor`).
    pub abi_max_minor: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
}

/// What a mechanism is and can do (`memplug_host_mechanism_info`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostMechanismInfo {
    /// Set by the caller to `sizeof(MemplugHostMechanismInfo)`; set by the
    /// library to the bytes it wrote.
    pub struct_size: u32,
    /// `MEMPLUG_CAP_*` flags (memplug.h) as the plugin published them.
    /// Bits of later ABI minors are set only for a plugin that agreed on
    /// that minor: `MEMPLUG_CAP_SHARED_EXPORT` (1.1),
    /// `MEMPLUG_CAP_TYPED_EXPORT` (1.2: physical objects exported as typed
    /// handles of the kinds in its descriptor's `export_types`; shared
    /// prefixes through `memplug_host_prefix_export_handle` and
    /// `memplug_host_binding_import_prefix`), `MEMPLUG_CAP_PEER_ACCESS`
    /// (1.2, bit 6: other devices may be given access to its memory;
    /// `memplug_host_mechanism_can_access_peer` says which,
    /// `memplug_host_region_set_peer_access` gives it to a region's range),
    /// `MEMPLUG_CAP_QUEUED_BINDING` (1.2, bit 7: committing and mapping can
    /// be enqueued on a stream; `memplug_host_region_grow_on` enqueues a
    /// region's grow, and this API enqueues nothing else: shrinks and
    /// frees decommit on the host once their fences complete). Ignore
    /// bits memplug.h does not name.
    pub capabilities: u32,
    /// The device it serves.
    pub device: MemplugDevice,
    /// The plugin's id of the mechanism.
    pub mechanism_id: u64,
    /// Alignment every allocation has at least, in bytes (a power of two).
    pub min_alignment: u64,
    /// Largest alignment an allocation may ask for, in bytes (a power of
    /// two); more is refused.
    pub max_alignment: u64,
    /// Granule of virtual regions and shared prefixes (0: none).
    pub granularity: u64,
    /// Mechanism name, NUL-terminated (truncated to fit).
    pub name: [c_char; MEMPLUG_HOST_NAME_MAX],
    /// Name of the plugin that published it, NUL-terminated.
    pub plugin_name: [c_char; MEMPLUG_HOST_NAME_MAX],
}

/// Options of a binding (`memplug_host_binding_create`); NULL means all
/// defaults (class OTHER, no holder, no waiting, no placement).
///
/// Since API 1.1 the struct ends with the binding's placement: how its
/// memory is asked for (the plugin ABI 1.2 request fields: hints, page
/// size, location, export kinds). They are read only when `struct_size`
/// reaches them: a caller built against API 1.0 (`struct_size` =
/// `MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0`) asks for no placement. A
/// mechanism whose plugin agreed on an older ABI minor is sent none of it.
/// A library older than API 1.1 reads only the 1.0 fields (and so ignores
/// the placement): `MEMPLUG_HOST_CHECK_API()` refuses such a library.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostBindingOptions {
    /// `sizeof(MemplugHostBindingOptions)`.
    pub struct_size: u32,
    /// One of `MEMPLUG_HOST_CLASS_*`.
    pub alloc_class: u32,
    /// The holder allocations are charged to; the zero handle for none. It
    /// must be registered with the binding's pool.
    pub holder: MemplugHostHolder,
    /// How long an allocation may wait for pressure to free room, in
    /// nanoseconds; 0 fails at once after the pressure tickets.
    pub wait_ns: u64,
    /// Since API 1.1. `MEMPLUG_HINT_*` bits (memplug.h):
    /// `MEMPLUG_HINT_UNINITIALIZED_OK` when the binding's memory need not
    /// be zeroed (only for memory the caller overwrites before reading).
    /// Unknown bits are refused (`MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`).
    pub hints: u32,
    /// Since API 1.1. `MEMPLUG_HANDLE_*` kinds the memory will be exported
    /// as (0: none). A plugin that does not offer one of them refuses the
    /// binding's allocations and prefixes with
    /// `MEMPLUG_HOST_STATUS_UNSUPPORTED`. Unknown bits are refused.
    pub export_types: u32,
    /// Since API 1.1. Pages of this many bytes: a power of two (else
    /// refused here) the mechanism publishes in its descriptor's
    /// `page_sizes` (a plugin refuses another when asked to allocate, with
    /// `MEMPLUG_HOST_STATUS_INVALID_ARGUMENT`); 0: the mechanism's choice.
    pub page_size: u64,
    /// Since API 1.1. Where the memory should live: a `MEMPLUG_LOCATION_*`
    /// kind (`MEMPLUG_LOCATION_ANY`, 0: no preference) and the NUMA node or
    /// tier it names (else 0; an unknown kind, or an id with a kind that
    /// names no node or tier, is refused). A plugin that cannot place it
    /// there refuses.
    pub location_kind: u32,
    /// The NUMA node or tier `location_kind` names; 0 for a kind that names
    /// none.
    pub location_id: u32,
}

/// What a mechanism says of its memory (`memplug_host_mechanism_descriptor`):
/// the plugin ABI 1.2 memory descriptor (memplug.h). Every field is zero
/// ("not said") for a mechanism whose plugin agreed on an older minor.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostDescriptor {
    /// `sizeof(MemplugHostDescriptor)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// The granularity the device works best at: 0 (same as the
    /// granularity) or a power-of-two multiple of it.
    pub recommended_granularity: u64,
    /// Page sizes that can back its memory: bit `k` set means pages of
    /// `2^k` bytes (`page_sizes & page_size` tests a power of two). 0: not
    /// said.
    pub page_sizes: u64,
    /// `MEMPLUG_ATTR_*` bits every object of the mechanism has.
    pub attributes: u32,
    /// `MEMPLUG_HANDLE_*` kinds its physical objects can be exported as.
    pub export_types: u32,
    /// Where its memory lives: `MEMPLUG_LOCATION_*` (0: not said), and the
    /// NUMA node or tier that kind names (else 0).
    pub location_kind: u32,
    /// The NUMA node or tier `location_kind` names; 0 for a kind that names
    /// none.
    pub location_id: u32,
    /// 1 when its physical objects map at any granularity-aligned offset
    /// (`MEMPLUG_PROP_MAPS_AT_OFFSETS`), else 0.
    pub maps_at_offsets: u32,
    /// Padding, always written as 0.
    pub reserved1: u32,
}

/// The identity of a mechanism's device (`memplug_host_mechanism_identity`):
/// the plugin ABI 1.2 `MemplugDeviceIdentity` fields (memplug.h), for
/// matching the device with the same device seen through another API.
/// Fields not named in `valid` are zero and meaningless.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostDeviceIdentity {
    /// `sizeof(MemplugHostDeviceIdentity)`; set to the bytes written.
    pub struct_size: u32,
    /// `MEMPLUG_IDENTITY_*` bits: which fields below are meaningful.
    pub valid: u32,
    /// The device's UUID as its driver reports it (`MEMPLUG_IDENTITY_UUID`).
    pub uuid: [u8; 16],
    /// PCI domain, bus, device and function (`MEMPLUG_IDENTITY_PCI`).
    pub pci_domain: u32,
    /// PCI bus (`MEMPLUG_IDENTITY_PCI`).
    pub pci_bus: u32,
    /// PCI device (`MEMPLUG_IDENTITY_PCI`).
    pub pci_device: u32,
    /// PCI function (`MEMPLUG_IDENTITY_PCI`).
    pub pci_function: u32,
    /// Index of the sub-device (tile, partition, MIG instance) within the
    /// device (`MEMPLUG_IDENTITY_SUB_DEVICE`).
    pub sub_device: u32,
    /// The NUMA node closest to the device; for a CPU, its node
    /// (`MEMPLUG_IDENTITY_NUMA_NODE`).
    pub numa_node: u32,
}

/// A typed handle to memory (the plugin ABI 1.2 `MemplugHandle`): what
/// `memplug_host_prefix_export_handle` writes and
/// `memplug_host_binding_import_prefix` reads. One kind per handle:
///
/// * `MEMPLUG_HANDLE_OPAQUE_FD`, `_DMABUF_FD`, `_MEMFD`: `fd` is a file
///   descriptor (else -1). One written by an export is new and the
///   caller's: close it when done (it keeps the memory alive for whoever
///   imports it, in this process or another one it is passed to). Import
///   only borrows it (the plugin keeps a duplicate if it needs one).
/// * `MEMPLUG_HANDLE_WIN32`: `win32` is a Windows NT handle, owned as an
///   fd is (else 0).
/// * `MEMPLUG_HANDLE_VENDOR_BLOB`: the first `blob_len` bytes of `blob`
///   (at most `MEMPLUG_HANDLE_BLOB_MAX`) are a vendor's opaque bytes.
///
/// Set `struct_size` to `sizeof(MemplugHostHandle)` (at least
/// `MEMPLUG_HOST_HANDLE_SIZE_1_1`) before either call. Since API 1.1.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemplugHostHandle {
    /// `sizeof(MemplugHostHandle)`; set to the bytes written.
    pub struct_size: u32,
    /// One `MEMPLUG_HANDLE_*` bit (memplug.h).
    pub kind: u32,
    /// The descriptor of the fd kinds; -1 otherwise.
    pub fd: i32,
    /// Zero.
    pub reserved0: u32,
    /// The handle of `MEMPLUG_HANDLE_WIN32`; zero otherwise.
    pub win32: u64,
    /// Bytes of `blob` used (`MEMPLUG_HANDLE_VENDOR_BLOB`); zero otherwise.
    pub blob_len: u32,
    /// Zero.
    pub reserved1: u32,
    /// A vendor blob's bytes.
    pub blob: [u8; 64],
}

impl Default for MemplugHostHandle {
    fn default() -> Self {
        MemplugHostHandle {
            struct_size: MEMPLUG_HOST_HANDLE_SIZE_1_1,
            kind: 0,
            fd: -1,
            reserved0: 0,
            win32: 0,
            blob_len: 0,
            reserved1: 0,
            blob: [0; 64],
        }
    }
}

/// What a caller needs of a mechanism's memory, beyond capabilities
/// (`memplug_host_manager_select_needing`), judged against each
/// mechanism's descriptor (`MemplugHostDescriptor`). A mechanism whose
/// plugin agreed on an older ABI minor says nothing of its memory, so it
/// meets no need but the empty one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostMemoryNeeds {
    /// `sizeof(MemplugHostMemoryNeeds)`.
    pub struct_size: u32,
    /// `MEMPLUG_ATTR_*` bits the mechanism must claim, all of them (0:
    /// none). Unknown bits are refused.
    pub attributes: u32,
    /// Where its memory must live: exactly this `MEMPLUG_LOCATION_*` kind
    /// and id (the NUMA node or tier the kind names, else 0);
    /// `MEMPLUG_LOCATION_ANY` (0): anywhere. An unknown kind, or an id with
    /// a kind that names no node or tier, is refused.
    pub location_kind: u32,
    /// The NUMA node or tier `location_kind` names; 0 for a kind that names
    /// none.
    pub location_id: u32,
    /// A page size (a power of two) the mechanism must publish; 0: any.
    pub page_size: u64,
}

/// An allocation's address and size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostAllocationInfo {
    /// `sizeof(MemplugHostAllocationInfo)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Device address (a host pointer for CPU mechanisms).
    pub addr: u64,
    /// Bytes the mechanism provided (at least the size asked), all charged.
    pub size: u64,
}

/// A region's figures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostRegionInfo {
    /// `sizeof(MemplugHostRegionInfo)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Base address; never changes for the region's life.
    pub addr: u64,
    /// Bytes of address space reserved.
    pub capacity: u64,
    /// Usable bytes: the mapped prefix plus the committed private part.
    pub len: u64,
    /// Private bytes committed and charged.
    pub committed: u64,
    /// Bytes of the read-only shared prefix at the start (0: none).
    pub prefix_len: u64,
}

/// A shared prefix's figures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostPrefixInfo {
    /// `sizeof(MemplugHostPrefixInfo)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Bytes (a multiple of the granularity).
    pub len: u64,
    /// Bytes charged to the pool (once, however many regions map it).
    pub charged: u64,
}

/// A request for room, given to a holder's pressure callback.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostPressureTicket {
    /// `sizeof(MemplugHostPressureTicket)` of the library; read only fields
    /// that fit.
    pub struct_size: u32,
    /// Class of the request (`MEMPLUG_HOST_CLASS_*`).
    pub alloc_class: u32,
    /// Bytes still missing when the ticket was issued.
    pub bytes_wanted: u64,
    /// Priority of the requester (`MEMPLUG_HOST_PRIORITY_HIGHEST` for a
    /// request made on behalf of no holder).
    pub requester_priority: u32,
    /// 1 when the request was made on behalf of a holder, else 0.
    pub has_requester: u32,
    /// Time left before the requester gives up, in nanoseconds; 0: release
    /// what can be released at once, do not block.
    pub timeout_ns: u64,
    /// The pool that needs room (the handle the holder registered with).
    pub pool: MemplugHostPool,
    /// The holder being asked.
    pub holder: MemplugHostHolder,
}

/// Figures of one allocation class (`memplug_host_pool_class_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostClassStats {
    /// `sizeof(MemplugHostClassStats)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Bytes held by reservations (granted, not yet committed).
    pub reserved: u64,
    /// Bytes charged to live leases.
    pub leased: u64,
    /// Bytes quarantined: charged for good because a release failed.
    pub quarantined: u64,
    /// Live leases.
    pub leases: u64,
    /// Reservations granted, cumulative.
    pub grants: u64,
    /// Reservation requests refused, cumulative.
    pub failures: u64,
    /// Quarantine events, cumulative.
    pub quarantines: u64,
    /// Leases dropped without release (a bug somewhere), cumulative.
    pub leaked_leases: u64,
    /// Bytes of those leaked leases, cumulative (they stay charged).
    pub leaked_bytes: u64,
}

/// A pool's figures (`memplug_host_pool_stats`). `used`, `free`,
/// `capacity` and `peak` are exact; the sums are exact when no operation
/// on the pool is in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostPoolStats {
    /// `sizeof(MemplugHostPoolStats)`; set to the bytes written.
    pub struct_size: u32,
    /// Holders registered now.
    pub holders: u32,
    /// Bytes the pool may charge in all.
    pub capacity: u64,
    /// Bytes charged: reservations, leases and quarantine.
    pub used: u64,
    /// `capacity - used`.
    pub free: u64,
    /// Highest `used` ever.
    pub peak: u64,
    /// Of `used`, bytes held by reservations (granted, not committed), in
    /// the pool's own accounts (summed over classes).
    pub reserved: u64,
    /// Bytes charged to live leases, in the pool's own accounts.
    pub leased: u64,
    /// Bytes quarantined, in the pool's own accounts.
    pub quarantined: u64,
    /// Pressure tickets this pool issued, and their sums.
    pub tickets: u64,
    /// Bytes the tickets asked for, summed.
    pub bytes_wanted: u64,
    /// Bytes the holders said they released in answer, summed (clamped).
    pub bytes_answered: u64,
    /// Tickets answered with 0 bytes.
    pub zero_answers: u64,
    /// Requests that waited for room, and those whose deadline passed.
    pub waits: u64,
    /// Requests whose wait for room ended at their deadline, refused.
    pub wait_timeouts: u64,
}

/// A pool's place in a tree of pools (`memplug_host_pool_info`): its
/// identity, its parent, its capacity and the share of its use that comes
/// from the pools below it. `capacity`, `used` and `free` are one
/// consistent reading; `children_used` sums the children's use, read one
/// after the other (exact when no operation is in flight).
///
/// The pool and parent ids are the governor's: unique in the process,
/// never reused, the same number whatever handle names the pool (so a
/// child's `parent_id` equals its parent's `pool_id`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostPoolInfo {
    /// `sizeof(MemplugHostPoolInfo)`; set to the bytes written.
    pub struct_size: u32,
    /// Ancestors above the pool: 0 for a pool made with
    /// `memplug_host_pool_create`, 1 for its children, and so on.
    pub depth: u32,
    /// The pool's id.
    pub pool_id: u64,
    /// The parent's id; 0 for a pool without a parent
    /// (`memplug_host_pool_parent` gives a handle to the parent).
    pub parent_id: u64,
    /// Bytes the pool may charge in all (`memplug_host_pool_set_capacity`);
    /// a parent's smaller capacity may bind first.
    pub capacity: u64,
    /// Bytes charged at this level, the pools below it included (as in
    /// `MemplugHostPoolStats`).
    pub used: u64,
    /// `capacity - used`.
    pub free: u64,
    /// Of `used`, the bytes charged through the pools below this one.
    pub children_used: u64,
    /// Pools created directly under this one, alive now.
    pub children: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// The pool's name, NUL-terminated (truncated to fit).
    pub name: [c_char; MEMPLUG_HOST_NAME_MAX],
    /// The parent's name, NUL-terminated; empty for a pool without a parent.
    pub parent_name: [c_char; MEMPLUG_HOST_NAME_MAX],
}

/// A holder's figures (`memplug_host_holder_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostHolderStats {
    /// `sizeof(MemplugHostHolderStats)`; set to the bytes written.
    pub struct_size: u32,
    /// The priority given at registration: the holder is asked only by
    /// requests of at least this priority.
    pub priority: u32,
    /// 1 while registered.
    pub registered: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Sums over every class of what is charged to the holder.
    pub reserved: u64,
    /// Bytes charged to its live leases.
    pub leased: u64,
    /// Bytes of its quarantined charges.
    pub quarantined: u64,
    /// Its live leases (charged objects).
    pub leases: u64,
    /// Tickets received, and their sums.
    pub tickets: u64,
    /// Bytes those tickets asked for, summed.
    pub bytes_wanted: u64,
    /// Sum of the (clamped) answers.
    pub bytes_answered: u64,
    /// Tickets it answered with 0 bytes.
    pub zero_answers: u64,
    /// Answers larger than the pool's whole use when the ticket was issued:
    /// nonsense, clamped to that figure and counted here.
    pub nonsense_answers: u64,
}

/// What a poll of the deferred-free queue did (`memplug_host_manager_poll`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugHostPollReport {
    /// `sizeof(MemplugHostPollReport)`; set to the bytes written.
    pub struct_size: u32,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// Frees retired by this poll.
    pub retired: u64,
    /// Frees the plugin refused (quarantined) during this poll.
    pub quarantined: u64,
    /// Frees still waiting for fences.
    pub pending: u64,
}

/// What a context's termination settled, once
/// (`memplug_host_manager_terminate`, `memplug_host_mechanism_settlement`,
/// and the `TERMINATED` lifecycle event): the charges its bindings still
/// held, discharged from their pools by exactly the bytes that were
/// charged — never from a guess, never twice.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugHostSettlement {
    /// `sizeof(MemplugHostSettlement)`; set to the bytes written.
    pub struct_size: u32,
    /// 1 when the context was lost (its objects went with the device), 0
    /// when it retired in order.
    pub after_loss: u32,
    /// Bytes discharged from the pools: live charges plus quarantined ones.
    pub bytes: u64,
    /// Of `bytes`, those that were quarantined (releases the plugin had
    /// refused before).
    pub quarantined_bytes: u64,
    /// Leases (charged objects) discharged.
    pub leases: u64,
    /// Bindings whose ledger held anything and was settled.
    pub bindings: u64,
    /// Objects the host still counted alive and forgot (they went with the
    /// device); 0 after an orderly end.
    pub objects_forgotten: u64,
}

/// What one binding of a lost context held when the loss was delivered
/// (an element of `MemplugHostLifecycleEvent::notices`). Everything it made
/// through the context went with the device; its handles
/// (`memplug_host_allocation_is_lost` ...) say so, and destroying them is
/// still the caller's job (it calls no plugin and refunds nothing; the
/// charges are settled when the context terminates).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostLossNotice {
    /// `sizeof(MemplugHostLossNotice)` of the library.
    pub struct_size: u32,
    /// The binding's class (`MEMPLUG_HOST_CLASS_*`).
    pub alloc_class: u32,
    /// The holder the binding charges, as `memplug_host_holder_id` gives
    /// it; 0 for a binding made without a holder.
    pub holder_id: u64,
    /// Charged objects (leases) the binding held.
    pub objects: u64,
    /// Their charged bytes.
    pub bytes: u64,
    /// Bytes quarantined by earlier refused releases (settled too).
    pub quarantined_bytes: u64,
    /// The name of the pool the binding charges (unique per manager):
    /// `pool_name_len` bytes of UTF-8, then a NUL. Valid only during the
    /// callback.
    pub pool_name: *const c_char,
    /// Length of `pool_name` in bytes, without the NUL.
    pub pool_name_len: usize,
}

/// One transition of a mechanism's context, given to a
/// `MemplugHostLifecycleFn`. The struct and everything it points to belong
/// to the library and are valid only during the callback: copy what you
/// keep.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugHostLifecycleEvent {
    /// `sizeof(MemplugHostLifecycleEvent)` of the library; read only fields
    /// that fit.
    pub struct_size: u32,
    /// The state before and after the transition.
    pub from: MemplugHostLifeState,
    /// The state entered; `MEMPLUG_HOST_LIFE_STATE_TERMINATED` is the last event
    /// of a context.
    pub to: MemplugHostLifeState,
    /// Padding, always written as 0.
    pub reserved0: u32,
    /// The subscription this call is for.
    pub subscription: MemplugHostSubscription,
    /// `"plugin/mechanism"` of the context: `context_len` bytes, then a
    /// NUL.
    pub context: *const c_char,
    /// Length of `context` in bytes, without the NUL.
    pub context_len: usize,
    /// Why the context left `ACTIVE` (the runtime's reason, the plugin's
    /// sanitised report, or the host's), `reason_len` bytes, then a NUL;
    /// NULL (and 0) when none was given.
    pub reason: *const c_char,
    /// Length of `reason` in bytes, without the NUL; 0 when `reason` is
    /// NULL.
    pub reason_len: usize,
    /// On entering `LOST`: one notice per binding that held something,
    /// `notice_count` of them, `notice_size` bytes apart (step by
    /// `notice_size`, not by your `sizeof`, so that a later library with a
    /// longer notice still works). NULL when `notice_count` is 0.
    pub notices: *const MemplugHostLossNotice,
    /// How many notices `notices` points to.
    pub notice_count: usize,
    /// Distance between two notices, in bytes (at least the 1.0
    /// `sizeof(MemplugHostLossNotice)`).
    pub notice_size: usize,
    /// On entering `TERMINATED`: what was settled; NULL otherwise.
    pub settlement: *const MemplugHostSettlement,
}

/// A holder's answer to a pressure ticket: the bytes it released (or
/// queued for release after fences), through the normal paths
/// (`memplug_host_allocation_free*`, `memplug_host_region_shrink`...).
/// Zero is a legal answer. Answers are recorded, never trusted as refunds;
/// an answer larger than the pool's use is clamped and counted as nonsense.
///
/// Called on the thread whose request needs room, with no host lock held,
/// possibly on several threads at once. It may call the C API (free, shrink,
/// allocate — a request made from inside a callback sends no tickets of its
/// own), except `memplug_host_manager_destroy` and operations on a region
/// whose grow is running on this thread (`MEMPLUG_HOST_STATUS_REENTRANT`).
/// It must not unwind (no C++ exception may leave it).
pub type MemplugHostPressureFn =
    Option<unsafe extern "C" fn(userdata: *mut c_void, ticket: *const MemplugHostPressureTicket) -> u64>;

/// The caller's step of a region grow: the region's usable bytes are now
/// `[addr, addr + len)`; return true to accept, false to refuse (the grow
/// is then undone and `memplug_host_region_grow` returns
/// `MEMPLUG_HOST_STATUS_CALLBACK_REFUSED`). Called once, on the calling
/// thread, before the call returns. Must not unwind.
pub type MemplugHostGrowFn = Option<unsafe extern "C" fn(userdata: *mut c_void, addr: u64, len: u64) -> bool>;

/// Fills a new shared prefix through a temporary writable view of `len`
/// bytes at `addr`. Called once, on the calling thread. Must not unwind.
pub type MemplugHostPrefixInitFn = Option<unsafe extern "C" fn(userdata: *mut c_void, addr: u64, len: u64)>;

/// A runtime fence's query: true when the work before it has completed.
/// Never blocks. Called from any thread (the caller of a free, a poll, the
/// reaper), possibly concurrently. Must not unwind.
pub type MemplugHostFenceQueryFn = Option<unsafe extern "C" fn(userdata: *mut c_void) -> bool>;

/// A runtime fence's wait: blocks up to `timeout_ns`; true when complete.
/// Same threading rules as the query.
pub type MemplugHostFenceWaitFn =
    Option<unsafe extern "C" fn(userdata: *mut c_void, timeout_ns: u64) -> bool>;

/// Called exactly once when the host drops its last reference to a
/// runtime fence, on whichever thread drops it, so the runtime may free
/// what `userdata` points to. Must not unwind.
pub type MemplugHostReleaseFn = Option<unsafe extern "C" fn(userdata: *mut c_void)>;

/// A host function run on a stream after the work submitted before it
/// (`memplug_host_stream_enqueue`). Runs once, on the stream's thread. Must
/// not unwind.
pub type MemplugHostStreamFn = Option<unsafe extern "C" fn(userdata: *mut c_void)>;

/// A mechanism's lifecycle callback (`memplug_host_mechanism_subscribe`):
/// called once per transition of its context, in order for each
/// subscription, with the `userdata` given at subscription.
///
/// Thread: whichever delivers the transition — the thread calling
/// `memplug_host_mechanism_retire`, `_declare_lost`,
/// `memplug_host_manager_replace`, `_terminate` or `_poll`, or the
/// manager's reaper thread; never a plugin's or a driver's thread, and
/// never from inside a plugin call. Two transitions of one context may be
/// delivered on two threads. No host lock is held.
///
/// From inside it, calls that deliver lifecycle events or wait for them are
/// refused with `MEMPLUG_HOST_STATUS_REENTRANT`
/// (`memplug_host_manager_poll`, `_terminate`, `_replace`, `_drain`,
/// `_destroy`, `memplug_host_mechanism_retire`, `_declare_lost`): note what
/// to do and do it after returning. Everything else may be called: freeing
/// the lost objects' handles, making a new binding (which goes to the
/// successor), unsubscribing (this subscription too). It must not unwind
/// (no C++ exception may leave it).
pub type MemplugHostLifecycleFn =
    Option<unsafe extern "C" fn(userdata: *mut c_void, event: *const MemplugHostLifecycleEvent)>;

/// Size of `MemplugHostVersion` in API 1.0.
pub const MEMPLUG_HOST_VERSION_SIZE_1_0: u32 = 40;
/// Size of `MemplugHostMechanismInfo` in API 1.0.
pub const MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0: u32 = 176;
/// Size of `MemplugHostBindingOptions` in API 1.0.
pub const MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0: u32 = 24;
/// Size of `MemplugHostAllocationInfo` in API 1.0.
pub const MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0: u32 = 24;
/// Size of `MemplugHostRegionInfo` in API 1.0.
pub const MEMPLUG_HOST_REGION_INFO_SIZE_1_0: u32 = 48;
/// Size of `MemplugHostPrefixInfo` in API 1.0.
pub const MEMPLUG_HOST_PREFIX_INFO_SIZE_1_0: u32 = 24;
/// Size of `MemplugHostPressureTicket` in API 1.0.
pub const MEMPLUG_HOST_PRESSURE_TICKET_SIZE_1_0: u32 = 48;
/// Size of `MemplugHostClassStats` in API 1.0.
pub const MEMPLUG_HOST_CLASS_STATS_SIZE_1_0: u32 = 80;
/// Size of `MemplugHostPoolStats` in API 1.0.
pub const MEMPLUG_HOST_POOL_STATS_SIZE_1_0: u32 = 112;
/// Size of `MemplugHostPoolInfo` in API 1.0.
pub const MEMPLUG_HOST_POOL_INFO_SIZE_1_0: u32 = 192;
/// Size of `MemplugHostHolderStats` in API 1.0.
pub const MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0: u32 = 88;
/// Size of `MemplugHostPollReport` in API 1.0.
pub const MEMPLUG_HOST_POLL_REPORT_SIZE_1_0: u32 = 32;

/// Size of `MemplugHostSettlement` in API 1.0.
pub const MEMPLUG_HOST_SETTLEMENT_SIZE_1_0: u32 = 48;

/// Size of `MemplugHostBindingOptions` in API 1.1 (the placement
/// appended).
pub const MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_1: u32 = 48;
/// Size of `MemplugHostDescriptor` in API 1.1, where it first appeared.
pub const MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1: u32 = 48;
/// Size of `MemplugHostDeviceIdentity` in API 1.1, where it first appeared.
pub const MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1: u32 = 48;
/// Size of `MemplugHostMemoryNeeds` in API 1.1, where it first appeared.
pub const MEMPLUG_HOST_MEMORY_NEEDS_SIZE_1_1: u32 = 24;
/// Size of `MemplugHostHandle` in API 1.1, where it first appeared.
pub const MEMPLUG_HOST_HANDLE_SIZE_1_1: u32 = 96;

// `T => FIRST` or `T => FIRST, now NOW`: FIRST is the size the struct
// had when it appeared (the shortest a reader accepts: `SIZE_1_0` of
// `Prefixed`, which is the API 1.0 size for the 1.0 structs and the 1.1
// size for those that appeared in 1.1); NOW its size in this version when
// it has grown since.
macro_rules! prefixed {
    ($($t:ty => $c:ident $(, now $now:ident)?);* $(;)?) => {
        // SAFETY: each is a `#[repr(C)]` struct whose first field is
        // `struct_size: u32`, made of integers, handles (integers), a
        // `MemplugDevice` and integer arrays: valid when zeroed.
        $(unsafe impl Prefixed for $t { const SIZE_1_0: u32 = $c; })*
        #[cfg(test)]
        #[test]
        fn sizes_match_the_constants() {
            $(
                let now = [$c $(, $now)?];
                assert_eq!(std::mem::size_of::<$t>() as u32, now[now.len() - 1], stringify!($t));
                assert!($c <= now[now.len() - 1], stringify!($t));
            )*
        }
    };
}

prefixed! {
    MemplugHostVersion => MEMPLUG_HOST_VERSION_SIZE_1_0;
    MemplugHostMechanismInfo => MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0;
    MemplugHostBindingOptions => MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0, now MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_1;
    MemplugHostAllocationInfo => MEMPLUG_HOST_ALLOCATION_INFO_SIZE_1_0;
    MemplugHostRegionInfo => MEMPLUG_HOST_REGION_INFO_SIZE_1_0;
    MemplugHostPrefixInfo => MEMPLUG_HOST_PREFIX_INFO_SIZE_1_0;
    MemplugHostPressureTicket => MEMPLUG_HOST_PRESSURE_TICKET_SIZE_1_0;
    MemplugHostClassStats => MEMPLUG_HOST_CLASS_STATS_SIZE_1_0;
    MemplugHostPoolStats => MEMPLUG_HOST_POOL_STATS_SIZE_1_0;
    MemplugHostPoolInfo => MEMPLUG_HOST_POOL_INFO_SIZE_1_0;
    MemplugHostHolderStats => MEMPLUG_HOST_HOLDER_STATS_SIZE_1_0;
    MemplugHostPollReport => MEMPLUG_HOST_POLL_REPORT_SIZE_1_0;
    MemplugHostSettlement => MEMPLUG_HOST_SETTLEMENT_SIZE_1_0;
    MemplugHostDescriptor => MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1;
    MemplugHostDeviceIdentity => MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1;
    MemplugHostMemoryNeeds => MEMPLUG_HOST_MEMORY_NEEDS_SIZE_1_1;
    MemplugHostHandle => MEMPLUG_HOST_HANDLE_SIZE_1_1;
}

// The structs that grew, and the new ones: every field where it is said to
// be (1.0 fields never move; 1.1 fields only appended).
#[cfg(test)]
#[test]
fn api_1_1_layouts_are_frozen() {
    use std::mem::offset_of;
    type B = MemplugHostBindingOptions;
    assert_eq!(offset_of!(B, wait_ns), 16);
    assert_eq!(offset_of!(B, hints), MEMPLUG_HOST_BINDING_OPTIONS_SIZE_1_0 as usize);
    assert_eq!((offset_of!(B, export_types), offset_of!(B, page_size)), (28, 32));
    assert_eq!((offset_of!(B, location_kind), offset_of!(B, location_id)), (40, 44));
    type D = MemplugHostDescriptor;
    assert_eq!((offset_of!(D, recommended_granularity), offset_of!(D, page_sizes)), (8, 16));
    assert_eq!((offset_of!(D, attributes), offset_of!(D, export_types)), (24, 28));
    assert_eq!((offset_of!(D, location_kind), offset_of!(D, location_id)), (32, 36));
    assert_eq!(offset_of!(D, maps_at_offsets), 40);
    type I = MemplugHostDeviceIdentity;
    assert_eq!((offset_of!(I, uuid), offset_of!(I, pci_domain), offset_of!(I, numa_node)), (8, 24, 44));
    type N = MemplugHostMemoryNeeds;
    assert_eq!((offset_of!(N, location_kind), offset_of!(N, page_size)), (8, 16));
    // The typed handle is the plugin ABI's `MemplugHandle`, field for field.
    type H = MemplugHostHandle;
    type A = memplug_sdk::abi::MemplugHandle;
    assert_eq!(std::mem::size_of::<H>(), std::mem::size_of::<A>());
    assert_eq!((offset_of!(H, kind), offset_of!(H, fd)), (offset_of!(A, handle_type), offset_of!(A, fd)));
    assert_eq!(
        (offset_of!(H, win32), offset_of!(H, blob_len)),
        (offset_of!(A, win32), offset_of!(A, blob_len))
    );
    assert_eq!((offset_of!(H, win32), offset_of!(H, blob)), (16, 32));
    assert_eq!(std::mem::size_of::<[u8; 64]>(), memplug_sdk::abi::MEMPLUG_HANDLE_BLOB_MAX as usize);
}

// The structs the library hands to callbacks (never read from the
// caller; their `struct_size` is the library's `sizeof`): frozen layouts on
// 64-bit targets, so that a later minor can only append.
#[cfg(all(test, target_pointer_width = "64"))]
#[test]
fn callback_struct_layouts_are_frozen() {
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<MemplugHostLossNotice>(), 56);
    assert_eq!(offset_of!(MemplugHostLossNotice, pool_name), 40);
    assert_eq!(size_of::<MemplugHostLifecycleEvent>(), 88);
    assert_eq!(offset_of!(MemplugHostLifecycleEvent, subscription), 16);
    assert_eq!(offset_of!(MemplugHostLifecycleEvent, notices), 56);
    assert_eq!(offset_of!(MemplugHostLifecycleEvent, settlement), 80);
    assert_eq!(size_of::<MemplugHostLifeState>(), 4);
}

/// The C API's refusal of a caller's struct `what`.
fn refusal(what: &str, e: PrefixError) -> crate::error::Error {
    let message = match e {
        PrefixError::Null => format!("{what} is NULL"),
        PrefixError::Short { declared, min } => {
            format!("{what}: struct_size is {declared}, its first size is {min} (set it to sizeof)")
        }
    };
    crate::error::Error::new(crate::status::MemplugHostStatus::InvalidArgument, message)
}

/// Writes `value` into a caller's struct whose `struct_size` says how big
/// it is, by the C API's convention ([`prefix::write_setting_size`]):
/// refuses one shorter than its first size (`Prefixed::SIZE_1_0`), writes `min(struct_size, sizeof)`
/// bytes and sets `struct_size` to that.
///
/// # Safety
/// `out` must be non-NULL and writable for its `struct_size` bytes.
pub(crate) unsafe fn write_sized<T: Prefixed>(out: *mut T, value: T, what: &str) -> crate::error::Result<()> {
    // SAFETY: the caller's contract, as above.
    unsafe { prefix::write_setting_size(out, &value) }.map_err(|e| refusal(what, e))
}

/// Refuses a caller's out-struct `write_sized` would refuse, before
/// anything is made that a refusal would have to undo (a descriptor).
///
/// # Safety
/// `out` must be non-NULL and readable for its `struct_size` field.
pub(crate) unsafe fn check_out_sized<T: Prefixed>(out: *mut T, what: &str) -> crate::error::Result<()> {
    // SAFETY: the caller's contract, as above.
    unsafe { prefix::out_capacity(out) }.map(drop).map_err(|e| refusal(what, e))
}

/// Reads a caller's struct of type `T` of `struct_size` bytes into a zeroed
/// local (fields it lacks stay zero; [`prefix::read`]); refuses one shorter
/// than its first size.
///
/// # Safety
/// `p` must be non-NULL and readable for its `struct_size` bytes.
pub(crate) unsafe fn read_sized<T: Prefixed>(p: *const T, what: &str) -> crate::error::Result<T> {
    // SAFETY: the caller's contract, as above.
    unsafe { prefix::read(p) }.map_err(|e| refusal(what, e))
}

/// Copies `s` into a fixed C name field, truncated at a char boundary,
/// NUL-terminated.
pub(crate) fn name_field(s: &str) -> [c_char; MEMPLUG_HOST_NAME_MAX] {
    let mut out = [0 as c_char; MEMPLUG_HOST_NAME_MAX];
    let mut n = s.len().min(MEMPLUG_HOST_NAME_MAX - 1);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    for (o, b) in out.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *o = *b as c_char;
    }
    out
}

// The host API's class numbers are the plugin ABI's, checked here so the
// two headers can never disagree.
const _: () = {
    use memplug_sdk::abi::*;
    assert!(MEMPLUG_HOST_CLASS_OTHER == MEMPLUG_CLASS_OTHER);
    assert!(MEMPLUG_HOST_CLASS_WEIGHTS == MEMPLUG_CLASS_WEIGHTS);
    assert!(MEMPLUG_HOST_CLASS_KV == MEMPLUG_CLASS_KV);
    assert!(MEMPLUG_HOST_CLASS_ACTIVATIONS == MEMPLUG_CLASS_ACTIVATIONS);
    assert!(MEMPLUG_HOST_CLASS_WORKSPACE == MEMPLUG_CLASS_WORKSPACE);
};
