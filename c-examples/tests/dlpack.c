/*
 * dlpack.c: DLPack export through the host C API (API 1.3) on the
 * reference CPU plugin.
 *
 *   1. An allocation exported as a float32 matrix: the tensor's data is the
 *      allocation's address (no copy), the device is kDLCPU:0, the shape and
 *      row-major strides are those asked; the handle is consumed; the
 *      deleter frees it (the pool back at zero).
 *   2. The deleter waits for the export's fence, and runs after the manager
 *      is destroyed.
 *   3. A region with a shared prefix: a view over the prefix is read-only
 *      (DLPACK_FLAG_BITMASK_READ_ONLY), a view over the private part is not.
 *   4. A cached allocation: the deleter gives the block back to its cache.
 *   5. Refusals leave the handle usable: a layout past the end (OUT_OF_RANGE),
 *      a negative extent, a sub-byte dtype, unknown flags (INVALID_ARGUMENT),
 *      a NULL shape, a stale handle.
 *
 *   dlpack PATH/TO/libmemplug_plugin_cpu.so
 *
 * Built with -Wall -Wextra -Wpedantic -Werror (C99); also run under
 * AddressSanitizer + UndefinedBehaviorSanitizer and valgrind. Prints
 * "N passed, N failed" and exits non-zero on any failure.
 */
#include "memplug_host.h"

#include "expect.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define MIB (1024u * 1024u)

static MemplugHostTensorSpec spec_of(uint32_t ndim, const int64_t *shape, uint8_t code, uint8_t bits) {
    MemplugHostTensorSpec s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.ndim = ndim;
    s.shape = shape;
    s.dtype.code = code;
    s.dtype.bits = bits;
    s.dtype.lanes = 1;
    return s;
}

static void release(DLManagedTensorVersioned *t) {
    t->deleter(t);
}

static void allocation(MemplugHostBinding b, MemplugHostPool pool) {
    static const int64_t shape[2] = {256, 1024};
    MemplugHostTensorSpec spec = spec_of(2, shape, kDLFloat, 32);
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    DLManagedTensorVersioned *t = NULL;
    uint64_t addr = 0;
    EXPECT_OK(memplug_host_allocate(b, MIB, 256, &a, &addr));
    EXPECT_OK(memplug_host_allocation_to_dlpack(a, &spec, NULL, 0, &t));
    if (t == NULL) {
        return;
    }
    EXPECT((uint64_t)(uintptr_t)t->dl_tensor.data == addr);
    EXPECT(t->version.major == DLPACK_MAJOR_VERSION && t->flags == 0);
    EXPECT(t->dl_tensor.device.device_type == kDLCPU && t->dl_tensor.device.device_id == 0);
    EXPECT(t->dl_tensor.ndim == 2 && t->dl_tensor.shape[0] == 256 && t->dl_tensor.shape[1] == 1024);
    EXPECT(t->dl_tensor.strides[0] == 1024 && t->dl_tensor.strides[1] == 1);
    EXPECT(t->dl_tensor.dtype.code == kDLFloat && t->dl_tensor.dtype.bits == 32);
    ((float *)t->dl_tensor.data)[1000] = 7.5f;
    EXPECT(((const float *)(uintptr_t)addr)[1000] == 7.5f);
    /* The handle went with the export. */
    EXPECT_STATUS(memplug_host_allocation_free(a), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT(pool_used(pool) == MIB);
    release(t);
    EXPECT(pool_used(pool) == 0);
}

static void refusals(MemplugHostBinding b, MemplugHostPool pool) {
    static const int64_t too_long[1] = {1025}, negative[1] = {-1}, fits[1] = {1024};
    MemplugHostTensorSpec spec = spec_of(1, too_long, kDLFloat, 32);
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    DLManagedTensorVersioned *t = NULL;
    EXPECT_OK(memplug_host_allocate(b, 4096, 64, &a, NULL));
    EXPECT_STATUS(memplug_host_allocation_to_dlpack(a, &spec, NULL, 0, &t), MEMPLUG_HOST_STATUS_OUT_OF_RANGE);
    EXPECT_MESSAGE("4100 B");
    spec.shape = negative;
    EXPECT_STATUS(memplug_host_allocation_to_dlpack(a, &spec, NULL, 0, &t), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    spec = spec_of(1, fits, kDLFloat, 4);
    EXPECT_STATUS(memplug_host_allocation_to_dlpack(a, &spec, NULL, 0, &t), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    spec = spec_of(1, fits, kDLFloat, 32);
    spec.flags = 0x80;
    EXPECT_STATUS(memplug_host_allocation_to_dlpack(a, &spec, NULL, 0, &t), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    spec = spec_of(1, NULL, kDLFloat, 32);
    EXPECT_STATUS(memplug_host_allocation_to_dlpack(a, &spec, NULL, 0, &t), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_allocation_to_dlpack(a, NULL, NULL, 0, &t), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT(t == NULL);
    /* Still the caller's: it frees, once. */
    EXPECT(pool_used(pool) == 4096);
    EXPECT_OK(memplug_host_allocation_free(a));
    spec = spec_of(1, fits, kDLFloat, 32);
    EXPECT_STATUS(memplug_host_allocation_to_dlpack(a, &spec, NULL, 0, &t), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT(t == NULL && pool_used(pool) == 0);
}

static void fenced_after_the_manager(const char *plugin) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence fence = MEMPLUG_HOST_NULL_HANDLE_INIT;
    DLManagedTensorVersioned *t = NULL, *late = NULL;
    MemplugHostTensorSpec spec;
    static const int64_t shape[1] = {MIB};
    struct hand_fence g = {0};
    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, plugin));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &mech));
    EXPECT_OK(memplug_host_pool_create(m, "fenced", 64 * MIB, &pool));
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, NULL, &b));
    spec = spec_of(1, shape, kDLUInt, 8);
    EXPECT_OK(memplug_host_fence_from_callbacks(m, "kernel", hand_fence_query, hand_fence_wait, NULL, &g, &fence));
    EXPECT_OK(memplug_host_allocate(b, MIB, 256, &a, NULL));
    EXPECT_OK(memplug_host_allocation_to_dlpack(a, &spec, &fence, 1, &t));
    EXPECT_OK(memplug_host_allocate(b, MIB, 256, &a, NULL));
    EXPECT_OK(memplug_host_allocation_to_dlpack(a, &spec, NULL, 0, &late));
    if (t != NULL) {
        release(t);
    }
    EXPECT_OK(memplug_host_manager_poll(m, NULL));
    EXPECT(pool_used(pool) == 2 * MIB); /* the kernel may still read it */
    g.done = 1;
    EXPECT_OK(memplug_host_manager_poll(m, NULL));
    EXPECT(pool_used(pool) == MIB);
    EXPECT_OK(memplug_host_fence_release(fence));
    EXPECT_OK(memplug_host_binding_destroy(b));
    EXPECT_OK(memplug_host_pool_release(pool));
    EXPECT_OK(memplug_host_mechanism_release(mech));
    EXPECT_OK(memplug_host_manager_destroy(m));
    /* The tensor keeps what it needs: its deleter still frees. */
    if (late != NULL) {
        release(late);
    }
}

static void fill_prefix(void *userdata, uint64_t addr, uint64_t len) {
    (void)userdata;
    memset((void *)(uintptr_t)addr, 42, (size_t)len);
}

static void region(MemplugHostBinding b, MemplugHostPool pool) {
    static const int64_t shape[1] = {MIB};
    MemplugHostPrefix prefix = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion r1 = MEMPLUG_HOST_NULL_HANDLE_INIT, r2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    DLManagedTensorVersioned *shared = NULL, *own = NULL;
    MemplugHostTensorSpec spec = spec_of(1, shape, kDLUInt, 8);
    EXPECT_OK(memplug_host_prefix_create(b, MIB, fill_prefix, NULL, &prefix));
    EXPECT_OK(memplug_host_region_reserve(b, 16 * MIB, &r1));
    EXPECT_OK(memplug_host_region_reserve(b, 16 * MIB, &r2));
    EXPECT_OK(memplug_host_region_map_prefix(r1, prefix));
    EXPECT_OK(memplug_host_region_map_prefix(r2, prefix));
    EXPECT_OK(memplug_host_region_grow(r1, 2 * MIB, NULL, NULL));
    EXPECT_OK(memplug_host_region_grow(r2, 2 * MIB, NULL, NULL));
    EXPECT_OK(memplug_host_prefix_release(prefix));
    EXPECT_OK(memplug_host_region_to_dlpack(r1, &spec, NULL, 0, &shared));
    spec.byte_offset = MIB;
    EXPECT_OK(memplug_host_region_to_dlpack(r2, &spec, NULL, 0, &own));
    if (shared != NULL && own != NULL) {
        EXPECT((shared->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
        EXPECT(((const uint8_t *)shared->dl_tensor.data)[0] == 42);
        EXPECT((own->flags & DLPACK_FLAG_BITMASK_READ_ONLY) == 0);
        ((uint8_t *)own->dl_tensor.data)[0] = 1;
        release(shared);
        release(own);
    }
    EXPECT(pool_used(pool) == 0);
}

static void cached(MemplugHostManager m, MemplugHostMechanism mech, MemplugHostPool pool) {
    static const int64_t shape[1] = {1000};
    MemplugHostCache cache = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCachedAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCacheStats s;
    DLManagedTensorVersioned *t = NULL;
    MemplugHostTensorSpec spec = spec_of(1, shape, kDLUInt, 8);
    uint64_t addr = 0, again = 0;
    EXPECT_OK(memplug_host_cache_create(m, mech, pool, NULL, NULL, NULL, &cache));
    EXPECT_OK(memplug_host_cache_allocate(cache, 1000, 64, 0, &a, &addr));
    EXPECT_OK(memplug_host_cached_to_dlpack(a, &spec, NULL, 0, &t));
    if (t != NULL) {
        EXPECT((uint64_t)(uintptr_t)t->dl_tensor.data == addr);
        release(t);
    }
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_OK(memplug_host_cache_stats(cache, &s));
    EXPECT(s.idle_blocks == 1 && s.in_use_blocks == 0);
    EXPECT_OK(memplug_host_cache_allocate(cache, 1000, 64, 0, &a, &again));
    EXPECT(again == addr);
    EXPECT_OK(memplug_host_cached_free(a));
    EXPECT_OK(memplug_host_cache_destroy(cache));
}

int main(int argc, char **argv) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    EXPECT_OK(MEMPLUG_HOST_CHECK_API());
    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, argv[1]));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &mech));
    EXPECT_OK(memplug_host_pool_create(m, "device", 64 * MIB, &pool));
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, NULL, &b));
    if (failed == 0) {
        allocation(b, pool);
        refusals(b, pool);
        region(b, pool);
        cached(m, mech, pool);
    }
    EXPECT_OK(memplug_host_binding_destroy(b));
    EXPECT(pool_used(pool) == 0);
    EXPECT_OK(memplug_host_pool_release(pool));
    EXPECT_OK(memplug_host_mechanism_release(mech));
    EXPECT_OK(memplug_host_manager_destroy(m));
    if (failed == 0) {
        fenced_after_the_manager(argv[1]);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
