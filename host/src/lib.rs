//! memplug host: loads plugins, validates them, wraps their mechanisms in
//! safe Rust types, and governs them: budgets, pressure, fence-ordered
//! frees.
//!
//! * [`Plugin`] — a loaded, validated plugin (by path, or an in-process
//!   entry function through the same checks); refuses to unload while
//!   anything it made is alive.
//! * [`Mechanism`] — one mechanism: its identity, properties and
//!   capabilities, and [`Mechanism::sync`] (streams and fences, `None` when
//!   absent). Its memory-making capabilities are reachable only through a
//!   binding (or, for plugin test harnesses, the `unsafe`
//!   [`Mechanism::ungoverned`] door).
//! * [`CallError`] / [`LoadError`] — every failure carries the status code
//!   and the plugin's message.
//! * [`ProcessMemoryManager`] → [`MemoryBinding`] — the only way to
//!   allocate: governor charge, fence-ordered deferred free, rollback on any
//!   failure.

#![deny(missing_docs)]
#![warn(rustdoc::broken_intra_doc_links)]
// Errors carry the plugin's message and the mechanism's name; they are the
// cold path, and returning them by value keeps the success path free of
// allocation.
#![allow(clippy::result_large_err)]

pub mod binding;
pub mod cache;
pub mod context;
pub mod deferred;
pub mod dlpack;
pub mod error;
// What every layer emits (named for users through `observe`).
mod events;
pub mod fence;
pub mod governor;
// The keys of charges and events (named for users through `governor`).
mod ids;
mod library;
pub mod lifecycle;
mod load_options;
mod reentry;
pub use faults::{plugin_faults, PluginFaults};
pub use reentry::inside_plugin_call;
pub use sink::{late_sink_writes, unreadable_plugin_messages};
pub mod manager;
pub mod mechanism;
pub mod observe;
pub mod plugin;
pub mod policy;
pub mod registry;
mod services;
pub use services::ServiceStats;
mod faults;
mod sink;
/// `std` or `loom` synchronisation, chosen in one place.
pub(crate) mod sync;
pub mod tokens;

pub use binding::{
    BindingError, GrowError, MemoryBinding, OffloadReport, OwnedAllocation, Region, RegionView, Residence,
    SharedPrefix,
};
pub use cache::{CacheConfig, CacheStats, CachedAllocation, CachingBinding, IdlePolicy, StreamKey};
pub use context::{
    Context, LifecycleError, LifecycleEvent, LossNotice, SettledBinding, Settlement, SubscriptionId,
    TerminateError,
};
pub use deferred::{DeferredFreeQueue, DrainReport, PollReport, QueueStats, Retire, RetireOutcome};
pub use error::{CallError, LoadError, ObjectKind, ReleaseError};
pub use fence::{FenceSource, FnFence, PluginFence, SharedFence};
pub use lifecycle::LifeState;
pub use load_options::OverlapCheck;
pub use manager::{BindingSpec, ManagerError, ProcessMemoryManager};
pub use mechanism::{
    accepted_unfenced, Access, AllocatorApi, Capabilities, CopyKinds, Descriptor, Device, DeviceIdentity,
    Handle, HandleRef, Location, Mechanism, MemoryInfo, PeerAccessApi, Placement, Properties,
    SharedMappingApi, SyncApi, Ungoverned, VirtualBackingApi,
};
pub use memplug_sdk::Status;
pub use plugin::{LiveReport, LoadOptions, Plugin, UnloadRefused, HOST_MAX_MINOR, HOST_MIN_MINOR};
pub use registry::{MemoryNeeds, Registry, RegistryError, Requirements};
pub use tokens::{Allocation, Fence, PhysicalObject, RawObject, Reservation, Stream};
