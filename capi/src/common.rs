//! What every topic of the C API names (`memplug/host/common.h`): the
//! handle of each kind of object, the allocation classes and the length of
//! a name field. Layout rules as in the plugin ABI (ARCHITECTURE.md §3).

use core::ffi::c_char;

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
