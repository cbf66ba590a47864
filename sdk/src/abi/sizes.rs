//! The frozen sizes of every growable struct, per minor: a reader refuses a
//! struct shorter than its 1.0 size and finds a field of minor N only in a
//! struct at least its 1.N size. Part of the ABI (`include/memplug.h` is
//! generated from here too).

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
/// `MemplugHostInfo` (`services`); new in 1.2: `MemplugHostServices`
/// (`report_device_lost`). 1.2 is not frozen yet: it may still grow
/// before its header is frozen (docs/ABI-CHANGELOG.md).
pub const MEMPLUG_HOST_INFO_SIZE_1_2: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_HOST_SERVICES_SIZE_1_2: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_NEGOTIATION_SIZE_1_2: u32 = 16;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_PLUGIN_SIZE_1_2: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_MECHANISM_SIZE_1_2: u32 = 72;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_PROPERTIES_SIZE_1_2: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_MEMORY_INFO_SIZE_1_2: u32 = 24;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_REQUEST_SIZE_1_2: u32 = 48;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_BLOCK_SIZE_1_2: u32 = 32;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_OBJECT_REF_SIZE_1_2: u32 = 56;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_ALLOCATOR_SIZE_1_2: u32 = 40;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_VIRTUAL_BACKING_SIZE_1_2: u32 = 48;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_SHARED_MAPPING_SIZE_1_2: u32 = 64;
/// See `MEMPLUG_HOST_INFO_SIZE_1_2`.
pub const MEMPLUG_SYNC_SIZE_1_2: u32 = 72;

/// Rust-side short names for the 1.2 sizes.
pub mod size_1_2 {
    pub use super::{
        MEMPLUG_ALLOCATOR_SIZE_1_2 as ALLOCATOR, MEMPLUG_BLOCK_SIZE_1_2 as BLOCK,
        MEMPLUG_HOST_INFO_SIZE_1_2 as HOST_INFO, MEMPLUG_HOST_SERVICES_SIZE_1_2 as HOST_SERVICES,
        MEMPLUG_MECHANISM_SIZE_1_2 as MECHANISM, MEMPLUG_MEMORY_INFO_SIZE_1_2 as MEMORY_INFO,
        MEMPLUG_NEGOTIATION_SIZE_1_2 as NEGOTIATION, MEMPLUG_OBJECT_REF_SIZE_1_2 as OBJECT_REF,
        MEMPLUG_PLUGIN_SIZE_1_2 as PLUGIN, MEMPLUG_PROPERTIES_SIZE_1_2 as PROPERTIES,
        MEMPLUG_REQUEST_SIZE_1_2 as REQUEST, MEMPLUG_SHARED_MAPPING_SIZE_1_2 as SHARED_MAPPING,
        MEMPLUG_SYNC_SIZE_1_2 as SYNC, MEMPLUG_VIRTUAL_BACKING_SIZE_1_2 as VIRTUAL_BACKING,
    };
}
