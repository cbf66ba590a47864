//! The ABI's numbers: its major and minor, status codes, capability bits,
//! allocation classes, device kinds, memory attributes, locations, hints,
//! handle kinds, property and identity flags, copy kinds, access flags, the
//! longest message.

// For the documentation's links only.
#[cfg(doc)]
use super::MemplugMessageSink;

/// The major version this header describes. It is also the suffix of the
/// entry symbol (`memplug_plugin_v1`).
pub const MEMPLUG_ABI_MAJOR: u32 = 1;
/// The newest minor version this header describes. Items added after 1.0
/// say "Since 1.1", "Since 1.2" or "Since 1.3" (docs/ABI-CHANGELOG.md lists
/// them).
///
/// Warning: this is the header's newest minor, not your plugin's. Do not
/// declare it as your descriptor's `max_minor` or agree on it: rebuilt
/// against a newer header, the plugin would claim a minor whose additions
/// it does not implement (a host then reads tables and fields it did not
/// write, or refuses it). Give your plugin its own constant for the newest
/// minor it implements.
pub const MEMPLUG_ABI_MINOR: u32 = 3;

/// Result of every fallible slot. `MEMPLUG_STATUS_OK` (zero) is success; every
/// other value is a failure, optionally explained through the call's
/// [`MemplugMessageSink`]. Values are never renumbered; a reader maps a value
/// it does not know to `MEMPLUG_STATUS_INTERNAL`.
pub type MemplugStatus = u32;

/// Success.
pub const MEMPLUG_STATUS_OK: MemplugStatus = 0;
/// The capability or operation is not provided by this mechanism. Never
/// returned for something that was done.
pub const MEMPLUG_STATUS_UNSUPPORTED: MemplugStatus = 1;
/// An argument is malformed: NULL where a pointer is required, a size of
/// zero, a zero or non-power-of-two alignment, an alignment above the
/// mechanism's `max_alignment`, unknown flag bits, a `struct_size` shorter
/// than the 1.0 size, an access other than read or read|write, a negative
/// file descriptor or one the mechanism cannot use.
pub const MEMPLUG_STATUS_INVALID_ARGUMENT: MemplugStatus = 2;
/// The device (or the process) has no memory for the request.
pub const MEMPLUG_STATUS_OUT_OF_MEMORY: MemplugStatus = 3;
/// The object was created by a different mechanism.
pub const MEMPLUG_STATUS_WRONG_MECHANISM: MemplugStatus = 4;
/// The object or request names a device this mechanism does not serve.
pub const MEMPLUG_STATUS_WRONG_DEVICE: MemplugStatus = 5;
/// The handle does not name a live object of this mechanism (never created,
/// already released, or forged), or names one of another kind (an
/// allocation passed as a reservation), or the reference's `object_id`,
/// `addr` or `size` contradict those of the object its handle names. A
/// reference naming another mechanism or device gets
/// `MEMPLUG_STATUS_WRONG_MECHANISM` or `MEMPLUG_STATUS_WRONG_DEVICE` first.
pub const MEMPLUG_STATUS_UNKNOWN_ALLOCATION: MemplugStatus = 6;
/// The device or its driver cannot be reached (absent, lost, not initialised).
pub const MEMPLUG_STATUS_DEVICE_UNAVAILABLE: MemplugStatus = 7;
/// The plugin failed internally; a caught panic or C++ exception reports this.
pub const MEMPLUG_STATUS_INTERNAL: MemplugStatus = 8;
/// A range is empty (`len` zero), lies outside its object, is not aligned to
/// the granularity, or `offset + len` overflows.
pub const MEMPLUG_STATUS_OUT_OF_RANGE: MemplugStatus = 9;
/// The object is in the wrong state for the request: committing pages that
/// are already committed, decommitting pages that are not, mapping over a
/// mapped range.
pub const MEMPLUG_STATUS_INVALID_STATE: MemplugStatus = 10;
/// The version ranges of host and plugin do not overlap.
pub const MEMPLUG_STATUS_VERSION_MISMATCH: MemplugStatus = 11;
/// A fence has not completed yet (returned by `fence_query`).
pub const MEMPLUG_STATUS_NOT_READY: MemplugStatus = 12;
/// A wait ran out of time before the fence completed.
pub const MEMPLUG_STATUS_TIMEOUT: MemplugStatus = 13;
/// The request cannot be carried out now without breaking something still
/// in use: for example `stream_destroy` called from one of that stream's own
/// host functions (waiting for the stream's work from inside it would
/// deadlock). A stream with pending work is not busy: `stream_destroy` waits
/// for the work.
pub const MEMPLUG_STATUS_BUSY: MemplugStatus = 14;
/// Since 1.2. The device or the context behind this mechanism is gone (a
/// sticky fault, a reset, a device off the bus): every later call of every
/// slot of the mechanism fails the same way, and every object it made went
/// with it. The host settles those objects without calling the plugin.
/// A plugin that agreed on a minor below 1.2 never returns it (the host
/// treats it as `MEMPLUG_STATUS_INTERNAL` there).
pub const MEMPLUG_STATUS_DEVICE_LOST: MemplugStatus = 15;

/// Capability flag: the mechanism has an allocator (required of every
/// mechanism).
pub const MEMPLUG_CAP_ALLOCATOR: u32 = 1 << 0;
/// Capability flag: the mechanism has a virtual backing sub-vtable.
pub const MEMPLUG_CAP_VIRTUAL_BACKING: u32 = 1 << 1;
/// Capability flag: the mechanism has a shared mapping sub-vtable.
pub const MEMPLUG_CAP_SHARED_MAPPING: u32 = 1 << 2;
/// Capability flag: the mechanism has a sync (streams and fences) sub-vtable.
pub const MEMPLUG_CAP_SYNC: u32 = 1 << 3;
/// Every capability flag defined by ABI 1.0. A reader treats other bits as
/// belonging to a newer minor and ignores them.
pub const MEMPLUG_CAP_ALL_1_0: u32 =
    MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING | MEMPLUG_CAP_SYNC;
/// Since 1.1. Capability flag: the shared mapping sub-vtable publishes
/// `export_fd` and `import_fd` (sharing physical objects across processes
/// as file descriptors). Valid only together with
/// `MEMPLUG_CAP_SHARED_MAPPING`, only when the agreed minor is at least 1,
/// and only with a `MemplugSharedMapping` whose `struct_size` is at least
/// `MEMPLUG_SHARED_MAPPING_SIZE_1_1`; a host refuses a mechanism that
/// breaks any of the three. It has no sub-vtable of its own: the slots live
/// at the end of `MemplugSharedMapping`.
pub const MEMPLUG_CAP_SHARED_EXPORT: u32 = 1 << 4;
/// Every capability flag defined by ABI 1.1.
pub const MEMPLUG_CAP_ALL_1_1: u32 = MEMPLUG_CAP_ALL_1_0 | MEMPLUG_CAP_SHARED_EXPORT;
/// Since 1.2. Capability flag: the shared mapping sub-vtable publishes
/// `export_handle` and `import_handle` (typed handles, chosen at create).
/// Valid only together with `MEMPLUG_CAP_SHARED_MAPPING`, only when the
/// agreed minor is at least 2, and only with a `MemplugSharedMapping` whose
/// `struct_size` is at least `MEMPLUG_SHARED_MAPPING_SIZE_1_2`.
pub const MEMPLUG_CAP_TYPED_EXPORT: u32 = 1 << 5;
/// Since 1.2. Capability flag: the mechanism has a peer access sub-vtable
/// (`MemplugMechanism::peer_access`): other devices can be given access to
/// its memory. Only when the agreed minor is at least 2.
pub const MEMPLUG_CAP_PEER_ACCESS: u32 = 1 << 6;
/// Since 1.2. Capability flag: mapping is also a queue operation — the
/// virtual backing publishes `commit_on`/`decommit_on` (and a shared
/// mapping, if present, `map_on`/`unmap_on`), which enqueue the change on a
/// stream and return a fence, for devices whose binding is ordered by the
/// device (Vulkan sparse binding, Metal heaps). The synchronous slots stay
/// required (such a plugin implements them by waiting). Valid only with
/// `MEMPLUG_CAP_VIRTUAL_BACKING` and `MEMPLUG_CAP_SYNC`, at an agreed minor
/// of at least 2, with tables long enough for the slots.
pub const MEMPLUG_CAP_QUEUED_BINDING: u32 = 1 << 7;
/// Every capability flag defined by ABI 1.2.
pub const MEMPLUG_CAP_ALL_1_2: u32 =
    MEMPLUG_CAP_ALL_1_1 | MEMPLUG_CAP_TYPED_EXPORT | MEMPLUG_CAP_PEER_ACCESS | MEMPLUG_CAP_QUEUED_BINDING;

/// Since 1.1. Allocation classes a host tags requests with
/// (`MemplugRequest::class_tag`), so a plugin can place or account memory
/// by what it holds. A hint only: it never changes what a call does or
/// whether it succeeds. A plugin treats a value it does not know as
/// `MEMPLUG_CLASS_OTHER`, and a 1.0 request (no `class_tag`) as
/// `MEMPLUG_CLASS_OTHER`.
pub const MEMPLUG_CLASS_OTHER: u32 = 0;
/// Since 1.1. Model parameters: long-lived, rarely evictable.
pub const MEMPLUG_CLASS_WEIGHTS: u32 = 1;
/// Since 1.1. Key/value cache: large, evictable by its holder.
pub const MEMPLUG_CLASS_KV: u32 = 2;
/// Since 1.1. Activations of in-flight work.
pub const MEMPLUG_CLASS_ACTIVATIONS: u32 = 3;
/// Since 1.1. Short-lived scratch space.
pub const MEMPLUG_CLASS_WORKSPACE: u32 = 4;

/// Device kind of a mechanism. The numbers are DLPack's `DLDeviceType`
/// numbers (since 1.2 every kind DLPack names has its number here; 1.0's
/// two already agreed), so a tensor's device and a mechanism's device
/// compare without a table. Kinds no standard numbers take a number in
/// `MEMPLUG_DEVICE_VENDOR_FIRST..=MEMPLUG_DEVICE_VENDOR_LAST`. Unknown
/// values are displayed as unknown and never guessed at.
pub type MemplugDeviceKind = u32;
/// Host (CPU) memory. The ordinal of a CPU device is its NUMA node (0 on a
/// machine without NUMA); a mechanism not bound to one node says so with
/// `MEMPLUG_LOCATION_HOST` in its properties.
pub const MEMPLUG_DEVICE_CPU: MemplugDeviceKind = 1;
/// An NVIDIA CUDA device (ordinal: the CUDA device ordinal).
pub const MEMPLUG_DEVICE_CUDA: MemplugDeviceKind = 2;
/// Since 1.2. CUDA pinned host memory.
pub const MEMPLUG_DEVICE_CUDA_HOST: MemplugDeviceKind = 3;
/// Since 1.2. An OpenCL device.
pub const MEMPLUG_DEVICE_OPENCL: MemplugDeviceKind = 4;
/// Since 1.2. A Vulkan device.
pub const MEMPLUG_DEVICE_VULKAN: MemplugDeviceKind = 7;
/// Since 1.2. A Metal device.
pub const MEMPLUG_DEVICE_METAL: MemplugDeviceKind = 8;
/// Since 1.2. A Verilog simulator buffer (DLPack's VPI).
pub const MEMPLUG_DEVICE_VPI: MemplugDeviceKind = 9;
/// Since 1.2. An AMD ROCm / HIP device.
pub const MEMPLUG_DEVICE_ROCM: MemplugDeviceKind = 10;
/// Since 1.2. ROCm pinned host memory.
pub const MEMPLUG_DEVICE_ROCM_HOST: MemplugDeviceKind = 11;
/// Since 1.2. DLPack's reserved extension device.
pub const MEMPLUG_DEVICE_EXT_DEV: MemplugDeviceKind = 12;
/// Since 1.2. CUDA managed (unified) memory.
pub const MEMPLUG_DEVICE_CUDA_MANAGED: MemplugDeviceKind = 13;
/// Since 1.2. An Intel oneAPI / Level Zero device.
pub const MEMPLUG_DEVICE_ONEAPI: MemplugDeviceKind = 14;
/// Since 1.2. A WebGPU device.
pub const MEMPLUG_DEVICE_WEBGPU: MemplugDeviceKind = 15;
/// Since 1.2. A Qualcomm Hexagon DSP.
pub const MEMPLUG_DEVICE_HEXAGON: MemplugDeviceKind = 16;
/// Since 1.2. A Microsoft MAIA device.
pub const MEMPLUG_DEVICE_MAIA: MemplugDeviceKind = 17;
/// Since 1.2. First number of the range vendors take for kinds no standard
/// numbers (a vendor picks one and documents it; memplug never assigns
/// numbers in this range).
pub const MEMPLUG_DEVICE_VENDOR_FIRST: MemplugDeviceKind = 0x1_0000;
/// Since 1.2. Last number of the vendor range.
pub const MEMPLUG_DEVICE_VENDOR_LAST: MemplugDeviceKind = 0x1_ffff;

/// Since 1.2. Memory attribute (`MemplugProperties::attributes`, what
/// memory of a mechanism is like; a mechanism claims only what every object
/// it makes has, and the conformance kit checks what it can of each claim):
/// local to the device (fast for it).
pub const MEMPLUG_ATTR_DEVICE_LOCAL: u32 = 1 << 0;
/// Since 1.2. The host can map and read it.
pub const MEMPLUG_ATTR_HOST_VISIBLE: u32 = 1 << 1;
/// Since 1.2. Host and device see each other's writes without explicit
/// flushes.
pub const MEMPLUG_ATTR_HOST_COHERENT: u32 = 1 << 2;
/// Since 1.2. Pinned: never paged out or moved.
pub const MEMPLUG_ATTR_PINNED: u32 = 1 << 3;
/// Since 1.2. Compressed by the device.
pub const MEMPLUG_ATTR_COMPRESSED: u32 = 1 << 4;
/// Since 1.2. Registered for RDMA (network cards can reach it).
pub const MEMPLUG_ATTR_RDMA: u32 = 1 << 5;
/// Since 1.2. A read-only mapping really refuses writes.
pub const MEMPLUG_ATTR_READ_ONLY_ENFORCED: u32 = 1 << 6;
/// Since 1.2. New memory (allocations, committed ranges, physical objects)
/// reads as zero — unless the request carried
/// `MEMPLUG_HINT_UNINITIALIZED_OK`.
pub const MEMPLUG_ATTR_ZERO_FILLED: u32 = 1 << 7;

/// Since 1.2. Where memory lives (`location_kind` of properties and
/// requests). In a request: no preference.
pub const MEMPLUG_LOCATION_ANY: u32 = 0;
/// Since 1.2. On the mechanism's device (`location_id`: 0).
pub const MEMPLUG_LOCATION_DEVICE: u32 = 1;
/// Since 1.2. In host memory, on no particular NUMA node.
pub const MEMPLUG_LOCATION_HOST: u32 = 2;
/// Since 1.2. In host memory on NUMA node `location_id`.
pub const MEMPLUG_LOCATION_NUMA_NODE: u32 = 3;
/// Since 1.2. In memory tier `location_id` (0 the fastest; e.g. CXL
/// memory behind local DRAM).
pub const MEMPLUG_LOCATION_TIER: u32 = 4;

/// Since 1.2. Request hint (`MemplugRequest::hints`): the caller does not
/// need new memory zeroed, so a mechanism may skip the fill. A hint: a
/// plugin that does not know a bit ignores it (hints never make a request
/// fail, unlike `flags`). A host sends it only when the binding says so.
pub const MEMPLUG_HINT_UNINITIALIZED_OK: u32 = 1 << 0;

/// Since 1.2. Kinds of OS or driver handles a physical object can be
/// shared as (`export_types` of properties and requests): a POSIX file
/// descriptor only the exporting API can import.
pub const MEMPLUG_HANDLE_OPAQUE_FD: u32 = 1 << 0;
/// Since 1.2. A Linux dma-buf file descriptor.
pub const MEMPLUG_HANDLE_DMABUF_FD: u32 = 1 << 1;
/// Since 1.2. A Linux memfd (mappable by any process with `mmap`).
pub const MEMPLUG_HANDLE_MEMFD: u32 = 1 << 2;
/// Since 1.2. A Windows NT handle.
pub const MEMPLUG_HANDLE_WIN32: u32 = 1 << 3;
/// Since 1.2. A vendor's opaque bytes (an IPC or fabric handle).
pub const MEMPLUG_HANDLE_VENDOR_BLOB: u32 = 1 << 4;

/// Since 1.2. Property flag (`MemplugProperties::flags`): physical objects
/// map at any granularity-aligned offset. Without it, a physical object
/// maps only whole, at offset 0 (CUDA and HIP handles that were exported),
/// and the host maps such objects whole.
pub const MEMPLUG_PROP_MAPS_AT_OFFSETS: u32 = 1 << 0;

/// Since 1.2. Which fields of a `MemplugDeviceIdentity` are meaningful.
pub const MEMPLUG_IDENTITY_UUID: u32 = 1 << 0;
/// Since 1.2. See `MEMPLUG_IDENTITY_UUID`.
pub const MEMPLUG_IDENTITY_PCI: u32 = 1 << 1;
/// Since 1.2. See `MEMPLUG_IDENTITY_UUID`.
pub const MEMPLUG_IDENTITY_SUB_DEVICE: u32 = 1 << 2;
/// Since 1.2. See `MEMPLUG_IDENTITY_UUID`.
pub const MEMPLUG_IDENTITY_NUMA_NODE: u32 = 1 << 3;

/// Since 1.3. Address spaces a mechanism's `MemplugSync::copy` can copy
/// between (`MemplugProperties::copy_kinds`): a copy is accepted only when
/// each of its two ranges lies in a space the mechanism publishes. This
/// one: memory of the mechanism itself (its allocations, the committed or
/// mapped parts of its reservations), on its own device.
pub const MEMPLUG_COPY_DEVICE: u32 = 1 << 0;
/// Since 1.3. See `MEMPLUG_COPY_DEVICE`. Ordinary host memory that is not
/// the mechanism's (malloc'd, mapped, another host mechanism's), named by
/// its CPU address. The plugin cannot know every host mapping: that such a
/// range is readable (or writable) until the copy completes is the
/// caller's to ensure, as for `memcpy`.
pub const MEMPLUG_COPY_HOST: u32 = 1 << 1;
/// Since 1.3. See `MEMPLUG_COPY_DEVICE`. Memory of another device that the
/// mechanism's device can reach (a peer GPU's memory mapped for it).
pub const MEMPLUG_COPY_PEER: u32 = 1 << 2;
/// Since 1.3. Every `MEMPLUG_COPY_*` bit ABI 1.3 defines.
pub const MEMPLUG_COPY_ALL_1_3: u32 = MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST | MEMPLUG_COPY_PEER;

/// Access flag for shared mappings: the mapping can be read.
pub const MEMPLUG_ACCESS_READ: u32 = 1 << 0;
/// Access flag for shared mappings: the mapping can be written.
pub const MEMPLUG_ACCESS_WRITE: u32 = 1 << 1;

/// Longest message, in bytes, a host keeps from one call; longer messages are
/// truncated by the host.
pub const MEMPLUG_MESSAGE_MAX: u32 = 1024;
