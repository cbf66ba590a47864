//! What a plugin publishes about itself: the plugin and its mechanisms, the
//! peer-access table, device identity, properties and memory information.

use super::*;
use core::ffi::{c_char, c_void};

/// A plugin: a library's description of itself and of its mechanisms.
/// Plugin-owned and immutable after negotiation.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugPlugin {
    /// `sizeof(MemplugPlugin)` as the plugin knows it.
    pub struct_size: u32,
    /// Always 1.
    pub abi_major: u32,
    /// Oldest minor of major 1 the plugin can speak.
    pub min_minor: u32,
    /// Newest minor of major 1 the plugin can speak.
    pub max_minor: u32,
    /// Plugin name, NUL-terminated UTF-8; required.
    pub name: *const c_char,
    /// Plugin version, NUL-terminated UTF-8; required.
    pub version: *const c_char,
    /// Plugin context passed to `live_objects` and `unload`.
    pub ctx: *mut c_void,
    /// Number of entries in `mechanisms`; at least one.
    pub mechanism_count: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// `mechanism_count` pointers to mechanism descriptors.
    pub mechanisms: *const *const MemplugMechanism,
    /// Required. The number of objects (allocations, reservations, physical
    /// objects, streams, fences) the plugin holds alive; the host refuses to
    /// unload a plugin while this is non-zero.
    pub live_objects: Option<unsafe extern "C" fn(ctx: *mut c_void) -> u64>,
    /// Optional (may be NULL). Called once, after the last call into the
    /// plugin, before the library is closed.
    pub unload: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
}

/// A mechanism: one way of getting memory on one device. Plugin-owned and
/// immutable after negotiation; `ctx` is passed to every slot of its
/// sub-vtables.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugMechanism {
    /// `sizeof(MemplugMechanism)` as the plugin knows it.
    pub struct_size: u32,
    /// `MEMPLUG_CAP_*` flags. Each optional flag must agree with its
    /// sub-vtable pointer: a flag without a pointer, or a pointer without a
    /// flag, makes the plugin refused at load.
    pub capabilities: u32,
    /// Non-zero identifier, unique among the plugin's mechanisms.
    pub mechanism_id: u64,
    /// Name, NUL-terminated UTF-8, unique among the plugin's mechanisms.
    pub name: *const c_char,
    /// The device this mechanism serves.
    pub device: MemplugDevice,
    /// Mechanism context, passed to every slot of the sub-vtables below.
    pub ctx: *mut c_void,
    /// Required.
    pub allocator: *const MemplugAllocator,
    /// Present if and only if `MEMPLUG_CAP_VIRTUAL_BACKING` is set.
    pub virtual_backing: *const MemplugVirtualBacking,
    /// Present if and only if `MEMPLUG_CAP_SHARED_MAPPING` is set.
    pub shared_mapping: *const MemplugSharedMapping,
    /// Present if and only if `MEMPLUG_CAP_SYNC` is set.
    pub sync: *const MemplugSync,
    /// Since 1.2 (present when `struct_size` is at least
    /// `MEMPLUG_MECHANISM_SIZE_1_2`). Who the device is, beyond its kind and
    /// ordinal; may be NULL (nothing more is known). Plugin-owned,
    /// immutable, valid until unload.
    pub identity: *const MemplugDeviceIdentity,
    /// Since 1.2. Present if and only if `MEMPLUG_CAP_PEER_ACCESS` is set.
    pub peer_access: *const MemplugPeerAccess,
}

/// Since 1.2. Optional capability: letting other devices reach this
/// mechanism's memory (tensor parallelism maps one GPU's memory for
/// another).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MemplugPeerAccess {
    /// `sizeof(MemplugPeerAccess)` as the plugin knows it.
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Required. Writes to `*out_access` the `MEMPLUG_ACCESS_*` bits device
    /// `peer` can be given to this mechanism's memory (zero: none, which
    /// is a success). A device the plugin cannot judge is
    /// `MEMPLUG_STATUS_WRONG_DEVICE`.
    pub can_access_peer: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            peer: *const MemplugDevice,
            out_access: *mut u32,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
    /// Required. Sets what device `peer` may do with `[offset, offset +
    /// len)` of reservation `reservation` (a committed or mapped range):
    /// `MEMPLUG_ACCESS_*` bits, zero to revoke. More than `can_access_peer`
    /// allows is `MEMPLUG_STATUS_UNSUPPORTED`; a range outside the
    /// reservation `MEMPLUG_STATUS_OUT_OF_RANGE`. Like decommit, it must
    /// not race device work of the peer still using the range.
    pub set_peer_access: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            reservation: *const MemplugObjectRef,
            offset: u64,
            len: u64,
            peer: *const MemplugDevice,
            access: u32,
            sink: *const MemplugMessageSink,
        ) -> MemplugStatus,
    >,
}

/// Since 1.2. A device's identity: what lets a runtime match a mechanism's
/// device with the same device seen through another API (a UUID, a PCI
/// address) and tell sub-devices and NUMA nodes apart. Fields not named in
/// `valid` are zero and meaningless.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemplugDeviceIdentity {
    /// `sizeof(MemplugDeviceIdentity)` as the plugin knows it.
    pub struct_size: u32,
    /// `MEMPLUG_IDENTITY_*` bits: which fields below are meaningful.
    pub valid: u32,
    /// The device's UUID as its driver reports it (16 bytes).
    pub uuid: [u8; 16],
    /// PCI domain of the device.
    pub pci_domain: u32,
    /// PCI bus.
    pub pci_bus: u32,
    /// PCI device.
    pub pci_device: u32,
    /// PCI function.
    pub pci_function: u32,
    /// Index of the sub-device (tile, partition, MIG instance) within the
    /// device.
    pub sub_device: u32,
    /// The NUMA node closest to the device (for a CPU: its node).
    pub numa_node: u32,
}

/// Static properties of a mechanism, written by `MemplugAllocator::properties`
/// into host memory. The host sets `struct_size`; the plugin writes no byte
/// past it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugProperties {
    /// `sizeof(MemplugProperties)` as the host knows it (set by the host).
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Alignment every allocation has at least (a power of two).
    pub min_alignment: u64,
    /// Largest alignment `allocate` honours (a power of two).
    pub max_alignment: u64,
    /// Granularity of virtual ranges and physical objects (a power of two);
    /// zero when the mechanism has neither capability.
    pub granularity: u64,
    /// Since 1.2 (present when `struct_size` is at least
    /// `MEMPLUG_PROPERTIES_SIZE_1_2`; a host reads the 1.2 fields only when
    /// the agreed minor is at least 2). The granularity the device works
    /// best at: zero (same as `granularity`) or a power-of-two multiple of
    /// it.
    pub recommended_granularity: u64,
    /// Since 1.2. Page sizes the mechanism can back memory with: bit `k`
    /// set means pages of `2^k` bytes. Zero: not said.
    pub page_sizes: u64,
    /// Since 1.2. `MEMPLUG_ATTR_*` bits every object of the mechanism has.
    pub attributes: u32,
    /// Since 1.2. `MEMPLUG_HANDLE_*` bits: the kinds of handle its physical
    /// objects can be exported as (for 1.1's `export_fd`: which kind of
    /// descriptor it returns).
    pub export_types: u32,
    /// Since 1.2. Where its memory lives: `MEMPLUG_LOCATION_*` (zero: not
    /// said).
    pub location_kind: u32,
    /// Since 1.2. The node or tier `location_kind` names (else zero).
    pub location_id: u32,
    /// Since 1.2. `MEMPLUG_PROP_*` bits.
    pub flags: u32,
    /// Since 1.2. Explicit padding; zero.
    pub reserved1: u32,
    /// Since 1.3 (present when `struct_size` is at least
    /// `MEMPLUG_PROPERTIES_SIZE_1_3`; a host asks for it only when the agreed
    /// minor is at least 3). `MEMPLUG_COPY_*` bits: the address spaces
    /// `MemplugSync::copy` copies between. Zero exactly when the mechanism
    /// publishes no copy slot; non-zero requires it (a host refuses a
    /// mechanism that says one without the other).
    pub copy_kinds: u32,
    /// Since 1.3. Explicit padding; zero.
    pub reserved2: u32,
}

/// Free and total memory of a device, in bytes, as the device reports it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemplugMemoryInfo {
    /// `sizeof(MemplugMemoryInfo)` as the host knows it (set by the host).
    pub struct_size: u32,
    /// Explicit padding; zero.
    pub reserved0: u32,
    /// Bytes free on the device.
    pub free_bytes: u64,
    /// Bytes the device has in all.
    pub total_bytes: u64,
}
