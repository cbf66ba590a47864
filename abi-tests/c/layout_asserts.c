/*
 * layout_asserts.c: the frozen layout of ABI 1.0, written down by hand.
 *
 * A released minor's layout never changes: later minors only append. These
 * numbers are the 1.0 contract (LP64: x86-64 and aarch64 Linux), checked
 * against include/memplug.h at compile time. Compiled as C11 by ctest
 * (layout_asserts_c11) and by tests/c_layout.rs. If this file stops
 * compiling, the header broke the 1.0 ABI: fix the header, not this file.
 *
 * tests/c_layout.rs also generates the same kind of asserts from the Rust
 * types (sdk/src/abi.rs), which catches the header and the Rust types
 * drifting apart; this file catches both drifting together.
 */
#include "memplug.h"
#include "memplug.h"

#include <stddef.h>
#include <stdint.h>

#define MEMPLUG_CHECK(cond) _Static_assert(cond, #cond)

/* ---- The MEMPLUG_*_SIZE_1_0 constants are the 1.0 sizes: the current sizes
 *      for structs later minors left alone, a prefix of the ones they grew. ---- */

MEMPLUG_CHECK(sizeof(MemplugHostInfo) >= MEMPLUG_HOST_INFO_SIZE_1_0); /* grown in 1.2 */
MEMPLUG_CHECK(sizeof(MemplugNegotiation) == MEMPLUG_NEGOTIATION_SIZE_1_0);
MEMPLUG_CHECK(sizeof(MemplugPlugin) == MEMPLUG_PLUGIN_SIZE_1_0);
MEMPLUG_CHECK(sizeof(MemplugMechanism) >= MEMPLUG_MECHANISM_SIZE_1_0); /* grown in 1.2 */
MEMPLUG_CHECK(sizeof(MemplugProperties) >= MEMPLUG_PROPERTIES_SIZE_1_0); /* grown in 1.2 */
MEMPLUG_CHECK(sizeof(MemplugMemoryInfo) == MEMPLUG_MEMORY_INFO_SIZE_1_0);
MEMPLUG_CHECK(sizeof(MemplugRequest) >= MEMPLUG_REQUEST_SIZE_1_0); /* grown in 1.1 */
MEMPLUG_CHECK(sizeof(MemplugBlock) == MEMPLUG_BLOCK_SIZE_1_0);
MEMPLUG_CHECK(sizeof(MemplugObjectRef) == MEMPLUG_OBJECT_REF_SIZE_1_0);
MEMPLUG_CHECK(sizeof(MemplugAllocator) == MEMPLUG_ALLOCATOR_SIZE_1_0);
MEMPLUG_CHECK(sizeof(MemplugVirtualBacking) >= MEMPLUG_VIRTUAL_BACKING_SIZE_1_0); /* grown in 1.2 */
MEMPLUG_CHECK(sizeof(MemplugSharedMapping) >= MEMPLUG_SHARED_MAPPING_SIZE_1_0); /* grown in 1.1 and 1.2 */
MEMPLUG_CHECK(sizeof(MemplugSync) >= MEMPLUG_SYNC_SIZE_1_0); /* grown in 1.2 */

/* ---- Every growable struct starts with uint32_t struct_size. ---- */
MEMPLUG_CHECK(offsetof(MemplugHostInfo, struct_size) == 0 && sizeof(((const MemplugHostInfo *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugNegotiation, struct_size) == 0 && sizeof(((const MemplugNegotiation *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugPlugin, struct_size) == 0 && sizeof(((const MemplugPlugin *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugMechanism, struct_size) == 0 && sizeof(((const MemplugMechanism *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugProperties, struct_size) == 0 && sizeof(((const MemplugProperties *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugMemoryInfo, struct_size) == 0 && sizeof(((const MemplugMemoryInfo *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugRequest, struct_size) == 0 && sizeof(((const MemplugRequest *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugBlock, struct_size) == 0 && sizeof(((const MemplugBlock *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, struct_size) == 0 && sizeof(((const MemplugObjectRef *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugAllocator, struct_size) == 0 && sizeof(((const MemplugAllocator *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugVirtualBacking, struct_size) == 0 && sizeof(((const MemplugVirtualBacking *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugSharedMapping, struct_size) == 0 && sizeof(((const MemplugSharedMapping *)0)->struct_size) == 4);
MEMPLUG_CHECK(offsetof(MemplugSync, struct_size) == 0 && sizeof(((const MemplugSync *)0)->struct_size) == 4);

/* ---- The numbers of 1.0 (LP64). ---- */
MEMPLUG_CHECK(sizeof(void *) == 8 && sizeof(size_t) == 8);
MEMPLUG_CHECK(sizeof(MemplugStatus) == 4 && sizeof(MemplugDeviceKind) == 4);
MEMPLUG_CHECK(sizeof(MemplugHostFn) == 8 && sizeof(MemplugEntryV1) == 8);

MEMPLUG_CHECK(sizeof(MemplugDevice) == 8);
MEMPLUG_CHECK(_Alignof(MemplugDevice) == 4);
MEMPLUG_CHECK(offsetof(MemplugDevice, kind) == 0);
MEMPLUG_CHECK(offsetof(MemplugDevice, ordinal) == 4);

MEMPLUG_CHECK(sizeof(MemplugMessageSink) == 16);
MEMPLUG_CHECK(_Alignof(MemplugMessageSink) == 8);
MEMPLUG_CHECK(offsetof(MemplugMessageSink, ctx) == 0);
MEMPLUG_CHECK(offsetof(MemplugMessageSink, write) == 8);

MEMPLUG_CHECK(MEMPLUG_HOST_INFO_SIZE_1_0 == 24 && sizeof(MemplugHostInfo) >= 24);
MEMPLUG_CHECK(_Alignof(MemplugHostInfo) == 8);
MEMPLUG_CHECK(offsetof(MemplugHostInfo, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugHostInfo, abi_major) == 4);
MEMPLUG_CHECK(offsetof(MemplugHostInfo, min_minor) == 8);
MEMPLUG_CHECK(offsetof(MemplugHostInfo, max_minor) == 12);
MEMPLUG_CHECK(offsetof(MemplugHostInfo, host_name) == 16);

MEMPLUG_CHECK(sizeof(MemplugNegotiation) == 16);
MEMPLUG_CHECK(_Alignof(MemplugNegotiation) == 8);
MEMPLUG_CHECK(offsetof(MemplugNegotiation, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugNegotiation, agreed_minor) == 4);
MEMPLUG_CHECK(offsetof(MemplugNegotiation, plugin) == 8);

MEMPLUG_CHECK(sizeof(MemplugPlugin) == 72);
MEMPLUG_CHECK(_Alignof(MemplugPlugin) == 8);
MEMPLUG_CHECK(offsetof(MemplugPlugin, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugPlugin, abi_major) == 4);
MEMPLUG_CHECK(offsetof(MemplugPlugin, min_minor) == 8);
MEMPLUG_CHECK(offsetof(MemplugPlugin, max_minor) == 12);
MEMPLUG_CHECK(offsetof(MemplugPlugin, name) == 16);
MEMPLUG_CHECK(offsetof(MemplugPlugin, version) == 24);
MEMPLUG_CHECK(offsetof(MemplugPlugin, ctx) == 32);
MEMPLUG_CHECK(offsetof(MemplugPlugin, mechanism_count) == 40);
MEMPLUG_CHECK(offsetof(MemplugPlugin, reserved0) == 44);
MEMPLUG_CHECK(offsetof(MemplugPlugin, mechanisms) == 48);
MEMPLUG_CHECK(offsetof(MemplugPlugin, live_objects) == 56);
MEMPLUG_CHECK(offsetof(MemplugPlugin, unload) == 64);

MEMPLUG_CHECK(MEMPLUG_MECHANISM_SIZE_1_0 == 72 && sizeof(MemplugMechanism) >= 72);
MEMPLUG_CHECK(_Alignof(MemplugMechanism) == 8);
MEMPLUG_CHECK(offsetof(MemplugMechanism, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugMechanism, capabilities) == 4);
MEMPLUG_CHECK(offsetof(MemplugMechanism, mechanism_id) == 8);
MEMPLUG_CHECK(offsetof(MemplugMechanism, name) == 16);
MEMPLUG_CHECK(offsetof(MemplugMechanism, device) == 24);
MEMPLUG_CHECK(offsetof(MemplugMechanism, ctx) == 32);
MEMPLUG_CHECK(offsetof(MemplugMechanism, allocator) == 40);
MEMPLUG_CHECK(offsetof(MemplugMechanism, virtual_backing) == 48);
MEMPLUG_CHECK(offsetof(MemplugMechanism, shared_mapping) == 56);
MEMPLUG_CHECK(offsetof(MemplugMechanism, sync) == 64);

MEMPLUG_CHECK(MEMPLUG_PROPERTIES_SIZE_1_0 == 32 && sizeof(MemplugProperties) >= 32);
MEMPLUG_CHECK(_Alignof(MemplugProperties) == 8);
MEMPLUG_CHECK(offsetof(MemplugProperties, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugProperties, reserved0) == 4);
MEMPLUG_CHECK(offsetof(MemplugProperties, min_alignment) == 8);
MEMPLUG_CHECK(offsetof(MemplugProperties, max_alignment) == 16);
MEMPLUG_CHECK(offsetof(MemplugProperties, granularity) == 24);

MEMPLUG_CHECK(sizeof(MemplugMemoryInfo) == 24);
MEMPLUG_CHECK(_Alignof(MemplugMemoryInfo) == 8);
MEMPLUG_CHECK(offsetof(MemplugMemoryInfo, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugMemoryInfo, reserved0) == 4);
MEMPLUG_CHECK(offsetof(MemplugMemoryInfo, free_bytes) == 8);
MEMPLUG_CHECK(offsetof(MemplugMemoryInfo, total_bytes) == 16);

MEMPLUG_CHECK(MEMPLUG_REQUEST_SIZE_1_0 == 40 && sizeof(MemplugRequest) >= 40);
MEMPLUG_CHECK(_Alignof(MemplugRequest) == 8);
MEMPLUG_CHECK(offsetof(MemplugRequest, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugRequest, flags) == 4);
MEMPLUG_CHECK(offsetof(MemplugRequest, size) == 8);
MEMPLUG_CHECK(offsetof(MemplugRequest, alignment) == 16);
MEMPLUG_CHECK(offsetof(MemplugRequest, object_id) == 24);
MEMPLUG_CHECK(offsetof(MemplugRequest, device) == 32);

MEMPLUG_CHECK(sizeof(MemplugBlock) == 32);
MEMPLUG_CHECK(_Alignof(MemplugBlock) == 8);
MEMPLUG_CHECK(offsetof(MemplugBlock, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugBlock, reserved0) == 4);
MEMPLUG_CHECK(offsetof(MemplugBlock, addr) == 8);
MEMPLUG_CHECK(offsetof(MemplugBlock, size) == 16);
MEMPLUG_CHECK(offsetof(MemplugBlock, handle) == 24);

MEMPLUG_CHECK(sizeof(MemplugObjectRef) == 56);
MEMPLUG_CHECK(_Alignof(MemplugObjectRef) == 8);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, reserved0) == 4);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, mechanism_id) == 8);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, device) == 16);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, object_id) == 24);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, addr) == 32);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, size) == 40);
MEMPLUG_CHECK(offsetof(MemplugObjectRef, handle) == 48);

MEMPLUG_CHECK(sizeof(MemplugAllocator) == 40);
MEMPLUG_CHECK(_Alignof(MemplugAllocator) == 8);
MEMPLUG_CHECK(offsetof(MemplugAllocator, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugAllocator, reserved0) == 4);
MEMPLUG_CHECK(offsetof(MemplugAllocator, properties) == 8);
MEMPLUG_CHECK(offsetof(MemplugAllocator, allocate) == 16);
MEMPLUG_CHECK(offsetof(MemplugAllocator, deallocate) == 24);
MEMPLUG_CHECK(offsetof(MemplugAllocator, memory_info) == 32);

MEMPLUG_CHECK(MEMPLUG_VIRTUAL_BACKING_SIZE_1_0 == 48 && sizeof(MemplugVirtualBacking) >= 48);
MEMPLUG_CHECK(_Alignof(MemplugVirtualBacking) == 8);
MEMPLUG_CHECK(offsetof(MemplugVirtualBacking, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugVirtualBacking, reserved0) == 4);
MEMPLUG_CHECK(offsetof(MemplugVirtualBacking, reserve) == 8);
MEMPLUG_CHECK(offsetof(MemplugVirtualBacking, commit) == 16);
MEMPLUG_CHECK(offsetof(MemplugVirtualBacking, decommit) == 24);
MEMPLUG_CHECK(offsetof(MemplugVirtualBacking, committed_bytes) == 32);
MEMPLUG_CHECK(offsetof(MemplugVirtualBacking, release) == 40);

MEMPLUG_CHECK(MEMPLUG_SHARED_MAPPING_SIZE_1_0 == 48 && sizeof(MemplugSharedMapping) >= 48);
MEMPLUG_CHECK(_Alignof(MemplugSharedMapping) == 8);
MEMPLUG_CHECK(offsetof(MemplugSharedMapping, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugSharedMapping, reserved0) == 4);
MEMPLUG_CHECK(offsetof(MemplugSharedMapping, create) == 8);
MEMPLUG_CHECK(offsetof(MemplugSharedMapping, map) == 16);
MEMPLUG_CHECK(offsetof(MemplugSharedMapping, unmap) == 24);
MEMPLUG_CHECK(offsetof(MemplugSharedMapping, retain) == 32);
MEMPLUG_CHECK(offsetof(MemplugSharedMapping, release) == 40);

MEMPLUG_CHECK(MEMPLUG_SYNC_SIZE_1_0 == 72 && sizeof(MemplugSync) >= 72);
MEMPLUG_CHECK(_Alignof(MemplugSync) == 8);
MEMPLUG_CHECK(offsetof(MemplugSync, struct_size) == 0);
MEMPLUG_CHECK(offsetof(MemplugSync, reserved0) == 4);
MEMPLUG_CHECK(offsetof(MemplugSync, stream_create) == 8);
MEMPLUG_CHECK(offsetof(MemplugSync, stream_adopt) == 16);
MEMPLUG_CHECK(offsetof(MemplugSync, stream_destroy) == 24);
MEMPLUG_CHECK(offsetof(MemplugSync, enqueue_host_fn) == 32);
MEMPLUG_CHECK(offsetof(MemplugSync, fence_record) == 40);
MEMPLUG_CHECK(offsetof(MemplugSync, fence_query) == 48);
MEMPLUG_CHECK(offsetof(MemplugSync, fence_wait) == 56);
MEMPLUG_CHECK(offsetof(MemplugSync, fence_destroy) == 64);

/* ---- Constants: never renumbered. ---- */
MEMPLUG_CHECK(MEMPLUG_ABI_MAJOR == 1);
MEMPLUG_CHECK(MEMPLUG_STATUS_OK == 0);
MEMPLUG_CHECK(MEMPLUG_STATUS_UNSUPPORTED == 1);
MEMPLUG_CHECK(MEMPLUG_STATUS_INVALID_ARGUMENT == 2);
MEMPLUG_CHECK(MEMPLUG_STATUS_OUT_OF_MEMORY == 3);
MEMPLUG_CHECK(MEMPLUG_STATUS_WRONG_MECHANISM == 4);
MEMPLUG_CHECK(MEMPLUG_STATUS_WRONG_DEVICE == 5);
MEMPLUG_CHECK(MEMPLUG_STATUS_UNKNOWN_ALLOCATION == 6);
MEMPLUG_CHECK(MEMPLUG_STATUS_DEVICE_UNAVAILABLE == 7);
MEMPLUG_CHECK(MEMPLUG_STATUS_INTERNAL == 8);
MEMPLUG_CHECK(MEMPLUG_STATUS_OUT_OF_RANGE == 9);
MEMPLUG_CHECK(MEMPLUG_STATUS_INVALID_STATE == 10);
MEMPLUG_CHECK(MEMPLUG_STATUS_VERSION_MISMATCH == 11);
MEMPLUG_CHECK(MEMPLUG_STATUS_NOT_READY == 12);
MEMPLUG_CHECK(MEMPLUG_STATUS_TIMEOUT == 13);
MEMPLUG_CHECK(MEMPLUG_STATUS_BUSY == 14);
MEMPLUG_CHECK(MEMPLUG_CAP_ALLOCATOR == 1);
MEMPLUG_CHECK(MEMPLUG_CAP_VIRTUAL_BACKING == 2);
MEMPLUG_CHECK(MEMPLUG_CAP_SHARED_MAPPING == 4);
MEMPLUG_CHECK(MEMPLUG_CAP_SYNC == 8);
MEMPLUG_CHECK(MEMPLUG_CAP_ALL_1_0 == 15);
MEMPLUG_CHECK(MEMPLUG_DEVICE_CPU == 1);
MEMPLUG_CHECK(MEMPLUG_DEVICE_CUDA == 2);
MEMPLUG_CHECK(MEMPLUG_ACCESS_READ == 1);
MEMPLUG_CHECK(MEMPLUG_ACCESS_WRITE == 2);
MEMPLUG_CHECK(MEMPLUG_MESSAGE_MAX == 1024);

/* ISO C forbids an empty translation unit. */
typedef int memplug_layout_asserts_nonempty;
