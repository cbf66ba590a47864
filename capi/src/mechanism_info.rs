//! What C reads about a mechanism (`memplug/host/manager.h`, beside
//! `manager.rs`): its information, its memory descriptor and device
//! identity, and the memory needs a selection asks for. Every struct starts
//! with `uint32_t struct_size`; later minors only append.

use crate::common::MEMPLUG_HOST_NAME_MAX;
use core::ffi::c_char;
use memplug_sdk::abi::MemplugDevice;

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

/// Size of `MemplugHostMechanismInfo` in API 1.0.
pub const MEMPLUG_HOST_MECHANISM_INFO_SIZE_1_0: u32 = 176;

/// Size of `MemplugHostDescriptor` in API 1.1, where it first appeared.
pub const MEMPLUG_HOST_DESCRIPTOR_SIZE_1_1: u32 = 48;

/// Size of `MemplugHostDeviceIdentity` in API 1.1, where it first appeared.
pub const MEMPLUG_HOST_DEVICE_IDENTITY_SIZE_1_1: u32 = 48;

/// Size of `MemplugHostMemoryNeeds` in API 1.1, where it first appeared.
pub const MEMPLUG_HOST_MEMORY_NEEDS_SIZE_1_1: u32 = 24;
