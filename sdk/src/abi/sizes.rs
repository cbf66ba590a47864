//! Each growable struct's size in every minor (`MEMPLUG_*_SIZE_1_<n>`),
//! and the same per minor as `size_1_<n>::NAME`.

/// Sizes of each growable struct as ABI 1.0 defined it: a reader refuses a
/// struct whose `struct_size` is below these. Frozen: they never change, and
/// each is a prefix of the current struct.
pub const MEMPLUG_HOST_INFO_SIZE_1_0: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_NEGOTIATION_SIZE_1_0: u32 = 16;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_PLUGIN_SIZE_1_0: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_MECHANISM_SIZE_1_0: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_PROPERTIES_SIZE_1_0: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_MEMORY_INFO_SIZE_1_0: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_REQUEST_SIZE_1_0: u32 = 40;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_BLOCK_SIZE_1_0: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_OBJECT_REF_SIZE_1_0: u32 = 56;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_ALLOCATOR_SIZE_1_0: u32 = 40;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_VIRTUAL_BACKING_SIZE_1_0: u32 = 48;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_SHARED_MAPPING_SIZE_1_0: u32 = 48;
/// See `MEMPLUG_HOST_INFO_SIZE_1_0`.
pub const MEMPLUG_SYNC_SIZE_1_0: u32 = 72;

/// Rust-side short names for the 1.0 sizes.
pub mod size_1_0 {
    pub use super::{
        MEMPLUG_ALLOCATOR_SIZE_1_0 as ALLOCATOR, MEMPLUG_BLOCK_SIZE_1_0 as BLOCK,
        MEMPLUG_HOST_INFO_SIZE_1_0 as HOST_INFO, MEMPLUG_MECHANISM_SIZE_1_0 as MECHANISM,
        MEMPLUG_MEMORY_INFO_SIZE_1_0 as MEMORY_INFO, MEMPLUG_NEGOTIATION_SIZE_1_0 as NEGOTIATION,
        MEMPLUG_OBJECT_REF_SIZE_1_0 as OBJECT_REF, MEMPLUG_PLUGIN_SIZE_1_0 as PLUGIN,
        MEMPLUG_PROPERTIES_SIZE_1_0 as PROPERTIES, MEMPLUG_REQUEST_SIZE_1_0 as REQUEST,
        MEMPLUG_SHARED_MAPPING_SIZE_1_0 as SHARED_MAPPING, MEMPLUG_SYNC_SIZE_1_0 as SYNC,
        MEMPLUG_VIRTUAL_BACKING_SIZE_1_0 as VIRTUAL_BACKING,
    };
}

/// Sizes of each growable struct as ABI 1.1 defines it (the current
/// `sizeof`). A writer of 1.1 that sets `struct_size` to these publishes the
/// 1.1 fields; a reader finds a 1.1 field only in a struct at least this
/// long. Grown in 1.1: `MemplugRequest` (`class_tag`) and
/// `MemplugSharedMapping` (`export_fd`, `import_fd`).
pub const MEMPLUG_HOST_INFO_SIZE_1_1: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_NEGOTIATION_SIZE_1_1: u32 = 16;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_PLUGIN_SIZE_1_1: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_MECHANISM_SIZE_1_1: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_PROPERTIES_SIZE_1_1: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_MEMORY_INFO_SIZE_1_1: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_REQUEST_SIZE_1_1: u32 = 48;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_BLOCK_SIZE_1_1: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_OBJECT_REF_SIZE_1_1: u32 = 56;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_ALLOCATOR_SIZE_1_1: u32 = 40;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_VIRTUAL_BACKING_SIZE_1_1: u32 = 48;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_SHARED_MAPPING_SIZE_1_1: u32 = 64;
/// See `MEMPLUG_HOST_INFO_SIZE_1_1`.
pub const MEMPLUG_SYNC_SIZE_1_1: u32 = 72;

/// Rust-side short names for the 1.1 sizes.
pub mod size_1_1 {
    pub use super::{
        MEMPLUG_ALLOCATOR_SIZE_1_1 as ALLOCATOR, MEMPLUG_BLOCK_SIZE_1_1 as BLOCK,
        MEMPLUG_HOST_INFO_SIZE_1_1 as HOST_INFO, MEMPLUG_MECHANISM_SIZE_1_1 as MECHANISM,
        MEMPLUG_MEMORY_INFO_SIZE_1_1 as MEMORY_INFO, MEMPLUG_NEGOTIATION_SIZE_1_1 as NEGOTIATION,
        MEMPLUG_OBJECT_REF_SIZE_1_1 as OBJECT_REF, MEMPLUG_PLUGIN_SIZE_1_1 as PLUGIN,
        MEMPLUG_PROPERTIES_SIZE_1_1 as PROPERTIES, MEMPLUG_REQUEST_SIZE_1_1 as REQUEST,
        MEMPLUG_SHARED_MAPPING_SIZE_1_1 as SHARED_MAPPING, MEMPLUG_SYNC_SIZE_1_1 as SYNC,
        MEMPLUG_VIRTUAL_BACKING_SIZE_1_1 as VIRTUAL_BACKING,
    };
}

/// Sizes of each growable struct as ABI 1.2 defines it. Grown in 1.2:
/// `MemplugHostInfo` (`services`), `MemplugMechanism` (`identity`),
/// `MemplugProperties` (the memory descriptor), `MemplugRequest`
/// (`hints`, `export_types`, `page_size`, location) and
/// `MemplugSharedMapping` (`export_handle`, `import_handle`, `map_on`,
/// `unmap_on`), `MemplugVirtualBacking` (`commit_on`, `decommit_on`),
/// `MemplugSync` (`stream_wait_fence`, `stream_adopt_typed`) and
/// `MemplugMechanism` (`peer_access`); new in 1.2: `MemplugHostServices`
/// (`report_device_lost`), `MemplugDeviceIdentity`, `MemplugHandle` and
/// `MemplugPeerAccess`. Frozen with the 1.2 header
/// (`abi-tests/frozen/1.2`): a later minor appends, never changes these.
pub const MEMPLUG_HOST_INFO_SIZE_1_2: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_HOST_SERVICES_SIZE_1_2: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_DEVICE_IDENTITY_SIZE_1_2: u32 = 48;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_HANDLE_SIZE_1_2: u32 = 96;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_PEER_ACCESS_SIZE_1_2: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_NEGOTIATION_SIZE_1_2: u32 = 16;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_PLUGIN_SIZE_1_2: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_MECHANISM_SIZE_1_2: u32 = 88;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_PROPERTIES_SIZE_1_2: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_MEMORY_INFO_SIZE_1_2: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_REQUEST_SIZE_1_2: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_BLOCK_SIZE_1_2: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_OBJECT_REF_SIZE_1_2: u32 = 56;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_ALLOCATOR_SIZE_1_2: u32 = 40;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_VIRTUAL_BACKING_SIZE_1_2: u32 = 64;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_SHARED_MAPPING_SIZE_1_2: u32 = 96;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_SYNC_SIZE_1_2: u32 = 88;

/// Rust-side short names for the 1.2 sizes.
pub mod size_1_2 {
    pub use super::{
        MEMPLUG_ALLOCATOR_SIZE_1_2 as ALLOCATOR, MEMPLUG_BLOCK_SIZE_1_2 as BLOCK,
        MEMPLUG_DEVICE_IDENTITY_SIZE_1_2 as DEVICE_IDENTITY, MEMPLUG_HANDLE_SIZE_1_2 as HANDLE,
        MEMPLUG_HOST_INFO_SIZE_1_2 as HOST_INFO, MEMPLUG_HOST_SERVICES_SIZE_1_2 as HOST_SERVICES,
        MEMPLUG_MECHANISM_SIZE_1_2 as MECHANISM, MEMPLUG_MEMORY_INFO_SIZE_1_2 as MEMORY_INFO,
        MEMPLUG_NEGOTIATION_SIZE_1_2 as NEGOTIATION, MEMPLUG_OBJECT_REF_SIZE_1_2 as OBJECT_REF,
        MEMPLUG_PEER_ACCESS_SIZE_1_2 as PEER_ACCESS, MEMPLUG_PLUGIN_SIZE_1_2 as PLUGIN,
        MEMPLUG_PROPERTIES_SIZE_1_2 as PROPERTIES, MEMPLUG_REQUEST_SIZE_1_2 as REQUEST,
        MEMPLUG_SHARED_MAPPING_SIZE_1_2 as SHARED_MAPPING, MEMPLUG_SYNC_SIZE_1_2 as SYNC,
        MEMPLUG_VIRTUAL_BACKING_SIZE_1_2 as VIRTUAL_BACKING,
    };
}

/// Sizes of each growable struct as ABI 1.3 defines it (the current
/// `sizeof`; 1.3 is still open, not frozen). Grown in 1.3:
/// `MemplugProperties` (`copy_kinds`) and `MemplugSync` (`copy`); every
/// other struct keeps its 1.2 size.
pub const MEMPLUG_HOST_INFO_SIZE_1_3: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_HOST_SERVICES_SIZE_1_3: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_DEVICE_IDENTITY_SIZE_1_3: u32 = 48;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_HANDLE_SIZE_1_3: u32 = 96;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_PEER_ACCESS_SIZE_1_3: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_NEGOTIATION_SIZE_1_3: u32 = 16;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_PLUGIN_SIZE_1_3: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_MECHANISM_SIZE_1_3: u32 = 88;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_PROPERTIES_SIZE_1_3: u32 = 80;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_MEMORY_INFO_SIZE_1_3: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_REQUEST_SIZE_1_3: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_BLOCK_SIZE_1_3: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_OBJECT_REF_SIZE_1_3: u32 = 56;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_ALLOCATOR_SIZE_1_3: u32 = 40;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_VIRTUAL_BACKING_SIZE_1_3: u32 = 64;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_SHARED_MAPPING_SIZE_1_3: u32 = 96;
/// See `MEMPLUG_HOST_INFO_SIZE_1_3`.
pub const MEMPLUG_SYNC_SIZE_1_3: u32 = 96;

/// Rust-side short names for the 1.3 sizes.
pub mod size_1_3 {
    pub use super::{
        MEMPLUG_ALLOCATOR_SIZE_1_3 as ALLOCATOR, MEMPLUG_BLOCK_SIZE_1_3 as BLOCK,
        MEMPLUG_DEVICE_IDENTITY_SIZE_1_3 as DEVICE_IDENTITY, MEMPLUG_HANDLE_SIZE_1_3 as HANDLE,
        MEMPLUG_HOST_INFO_SIZE_1_3 as HOST_INFO, MEMPLUG_HOST_SERVICES_SIZE_1_3 as HOST_SERVICES,
        MEMPLUG_MECHANISM_SIZE_1_3 as MECHANISM, MEMPLUG_MEMORY_INFO_SIZE_1_3 as MEMORY_INFO,
        MEMPLUG_NEGOTIATION_SIZE_1_3 as NEGOTIATION, MEMPLUG_OBJECT_REF_SIZE_1_3 as OBJECT_REF,
        MEMPLUG_PEER_ACCESS_SIZE_1_3 as PEER_ACCESS, MEMPLUG_PLUGIN_SIZE_1_3 as PLUGIN,
        MEMPLUG_PROPERTIES_SIZE_1_3 as PROPERTIES, MEMPLUG_REQUEST_SIZE_1_3 as REQUEST,
        MEMPLUG_SHARED_MAPPING_SIZE_1_3 as SHARED_MAPPING, MEMPLUG_SYNC_SIZE_1_3 as SYNC,
        MEMPLUG_VIRTUAL_BACKING_SIZE_1_3 as VIRTUAL_BACKING,
    };
}
