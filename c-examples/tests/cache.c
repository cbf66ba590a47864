/*
 * cache.c: caching bindings through the host C API (API 1.2) on the
 * reference CPU plugin.
 *
 *   1. A freed block serves the next request of its size class at the same
 *      address, without the plugin; idle bytes stay charged to the pool
 *      and are reported as idle.
 *   2. Stream-ordered reuse: a block freed on stream 1 behind a runtime
 *      fence is reused at once on stream 1, by stream 2 and the host only
 *      once the fence completes.
 *   3. Pressure: an allocation of another binding that needs room gets the
 *      cache's idle bytes; the block in use is kept.
 *   4. Trim, statistics, and refusals: a holder in the binding options, a
 *      stale handle freed twice, a cache handle passed as a block, a short
 *      stats struct — each a status, nothing changed.
 *   5. The idle policy (API 1.3): a cap on idle bytes holds at every free,
 *      memplug_host_cache_collect gives back what the usage threshold asks
 *      for, and a threshold outside (0, 1] is refused.
 *
 *   cache PATH/TO/libmemplug_plugin_cpu.so
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

static MemplugHostCacheStats stats_of(MemplugHostCache cache) {
    MemplugHostCacheStats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_OK(memplug_host_cache_stats(cache, &s));
    return s;
}

static void reuse(MemplugHostCache cache, MemplugHostPool pool) {
    MemplugHostCachedAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT, b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocationInfo info;
    MemplugHostCacheStats s;
    uint64_t addr = 0, again = 0;
    EXPECT_OK(memplug_host_cache_allocate(cache, 1000, 64, 0, &a, &addr));
    EXPECT(addr != 0 && addr % 256 == 0);
    memset((void *)(uintptr_t)addr, 0x5a, 1000);
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_OK(memplug_host_cached_allocation_info(a, &info));
    EXPECT(info.addr == addr && info.size == 1000);
    EXPECT_OK(memplug_host_cached_free(a));
    /* Idle, still charged: the 1024 B class. */
    EXPECT(pool_used(pool) == 1024);
    s = stats_of(cache);
    EXPECT(s.idle_bytes == 1024 && s.idle_blocks == 1 && s.misses == 1 && s.hits == 0);
    EXPECT(s.struct_size == sizeof s && s.pinned_blocks == 0);
    /* A 1.2 caller's struct: its 96 bytes written, the 1.3 field not. */
    memset(&s, 0xee, sizeof s);
    s.struct_size = MEMPLUG_HOST_CACHE_STATS_SIZE_1_2;
    EXPECT_OK(memplug_host_cache_stats(cache, &s));
    EXPECT(s.struct_size == MEMPLUG_HOST_CACHE_STATS_SIZE_1_2 && s.idle_blocks == 1);
    EXPECT(s.pinned_blocks == 0xeeeeeeeeeeeeeeeeull);
    EXPECT(s.holder_id != 0);
    EXPECT_OK(memplug_host_cache_allocate(cache, 1024, 8, 0, &b, &again));
    EXPECT(again == addr);
    s = stats_of(cache);
    EXPECT(s.hits == 1 && s.in_use_blocks == 1 && s.idle_blocks == 0);
    /* Freed twice: the second is refused, nothing freed twice. */
    EXPECT_OK(memplug_host_cached_free(b));
    EXPECT_STATUS(memplug_host_cached_free(b), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT(stats_of(cache).idle_blocks == 1);
}

static void streams(MemplugHostManager m, MemplugHostCache cache) {
    struct hand_fence g = {0};
    MemplugHostFence fence = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCachedAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT, other = MEMPLUG_HOST_NULL_HANDLE_INIT,
                                host = MEMPLUG_HOST_NULL_HANDLE_INIT, same = MEMPLUG_HOST_NULL_HANDLE_INIT;
    uint64_t addr = 0, other_addr = 0, host_addr = 0, same_addr = 0;
    EXPECT_OK(memplug_host_fence_from_callbacks(m, "kernel on stream 1", hand_fence_query, hand_fence_wait, NULL, &g, &fence));
    EXPECT_OK(memplug_host_cache_allocate(cache, 4096, 256, 1, &a, &addr));
    EXPECT_OK(memplug_host_cached_free_on(a, 1, &fence, 1));
    EXPECT(stats_of(cache).pending_blocks == 1);
    EXPECT_OK(memplug_host_cache_allocate(cache, 4096, 256, 2, &other, &other_addr));
    EXPECT_OK(memplug_host_cache_allocate(cache, 4096, 256, 0, &host, &host_addr));
    EXPECT(other_addr != addr && host_addr != addr);
    EXPECT_OK(memplug_host_cache_allocate(cache, 4096, 256, 1, &same, &same_addr));
    EXPECT(same_addr == addr);
    /* Behind the fence again; the host may take it only once it completes. */
    EXPECT_OK(memplug_host_cached_free_on(same, 1, &fence, 1));
    EXPECT_OK(memplug_host_cached_free(other));
    EXPECT_OK(memplug_host_cached_free(host));
    g.done = 1;
    {
        MemplugHostCachedAllocation t[3];
        uint64_t at[3];
        int found = 0, i;
        for (i = 0; i < 3; i++) {
            EXPECT_OK(memplug_host_cache_allocate(cache, 4096, 256, 0, &t[i], &at[i]));
            found |= at[i] == addr;
        }
        EXPECT(found);
        for (i = 0; i < 3; i++) EXPECT_OK(memplug_host_cached_free(t[i]));
    }
    EXPECT(stats_of(cache).pending_blocks == 0);
    EXPECT_OK(memplug_host_fence_release(fence));
}

static void pressure(MemplugHostManager m, MemplugHostMechanism mech) {
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCache cache = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding other = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCachedAllocation kept = MEMPLUG_HOST_NULL_HANDLE_INIT, idle[2];
    MemplugHostAllocation big = MEMPLUG_HOST_NULL_HANDLE_INIT;
    uint64_t kept_addr = 0, released = 0;
    MemplugHostCacheStats s;
    MemplugHostCacheOptions copts;
    EXPECT_OK(memplug_host_pool_create(m, "small", 4 * MIB, &pool));
    /* No idle cap (the default is a quarter of the pool): this is about
     * pressure. */
    memset(&copts, 0, sizeof copts);
    copts.struct_size = sizeof copts;
    copts.max_idle_bytes = UINT64_MAX;
    EXPECT_OK(memplug_host_cache_create(m, mech, pool, NULL, "activations", &copts, &cache));
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, NULL, &other));
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, 4096, 0, &kept, &kept_addr));
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, 4096, 0, &idle[0], NULL));
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, 4096, 0, &idle[1], NULL));
    EXPECT_OK(memplug_host_cached_free(idle[0]));
    EXPECT_OK(memplug_host_cached_free(idle[1]));
    EXPECT(pool_used(pool) == 3 * MIB);
    /* 2 MiB for another binding: 1 MiB free, the cache's idle 2 MiB asked. */
    EXPECT_OK(memplug_host_allocate(other, 2 * MIB, 4096, &big, NULL));
    s = stats_of(cache);
    EXPECT(s.pressure_bytes >= MIB && s.in_use_bytes == MIB);
    memset((void *)(uintptr_t)kept_addr, 0xa5, MIB);
    EXPECT_OK(memplug_host_allocation_free(big));
    EXPECT_OK(memplug_host_cached_free(kept));
    EXPECT_OK(memplug_host_cache_trim(cache, UINT64_MAX, &released));
    EXPECT(released >= MIB);
    EXPECT(pool_used(pool) == 0);
    EXPECT(stats_of(cache).trimmed_bytes == released);
    EXPECT_OK(memplug_host_binding_destroy(other));
    EXPECT_OK(memplug_host_cache_destroy(cache));
    EXPECT_OK(memplug_host_pool_release(pool));
}

static void refusals(MemplugHostManager m, MemplugHostMechanism mech, MemplugHostPool pool, MemplugHostCache cache) {
    MemplugHostHolder holder = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBindingOptions opts;
    MemplugHostCacheOptions copts;
    MemplugHostCache out = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCachedAllocation forged;
    MemplugHostCacheStats s;
    EXPECT_OK(memplug_host_holder_register(pool, "mine", 0, NULL, NULL, &holder));
    memset(&opts, 0, sizeof opts);
    opts.struct_size = sizeof opts;
    opts.alloc_class = MEMPLUG_HOST_CLASS_ACTIVATIONS;
    opts.holder = holder;
    EXPECT_STATUS(memplug_host_cache_create(m, mech, pool, &opts, NULL, NULL, &out),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("registers its own holder");
    EXPECT(out.id == 0);
    memset(&copts, 0, sizeof copts);
    copts.struct_size = sizeof copts;
    copts.min_alignment = 48;
    EXPECT_STATUS(memplug_host_cache_create(m, mech, pool, NULL, NULL, &copts, &out),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("min_alignment 48");
    /* A cache handle is not a block. */
    forged.id = cache.id;
    EXPECT_STATUS(memplug_host_cached_free(forged), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    memset(&s, 0, sizeof s);
    s.struct_size = 4;
    EXPECT_STATUS(memplug_host_cache_stats(cache, &s), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT(s.hits == 0);
    EXPECT_STATUS(memplug_host_cache_allocate(cache, 64, 64, 0, NULL, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_OK(memplug_host_holder_unregister(holder));
}

static void idle_policy(MemplugHostManager m, MemplugHostMechanism mech) {
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCache cache = MEMPLUG_HOST_NULL_HANDLE_INIT, out = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding other = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation weights = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCachedAllocation blocks[6];
    MemplugHostCacheOptions copts;
    uint64_t released = 0;
    size_t i;
    EXPECT_OK(memplug_host_pool_create(m, "idle", 16 * MIB, &pool));
    memset(&copts, 0, sizeof copts);
    copts.struct_size = sizeof copts;
    copts.max_idle_bytes = 3 * MIB;
    copts.gc_threshold = 0.5;
    EXPECT_OK(memplug_host_cache_create(m, mech, pool, NULL, "capped", &copts, &cache));
    for (i = 0; i < 6; i++) {
        EXPECT_OK(memplug_host_cache_allocate(cache, MIB, 64, 0, &blocks[i], NULL));
    }
    for (i = 0; i < 6; i++) {
        EXPECT_OK(memplug_host_cached_free(blocks[i]));
        EXPECT(stats_of(cache).idle_bytes <= 3 * MIB);
    }
    EXPECT(pool_used(pool) == 3 * MIB);
    EXPECT(stats_of(cache).trimmed_bytes == 3 * MIB);
    /* 6 MiB outside the cache: the pool is at 9 MiB, past half of 16 MiB;
     * collect gives 1 MiB of idle blocks back. */
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, NULL, &other));
    EXPECT_OK(memplug_host_allocate(other, 6 * MIB, 64, &weights, NULL));
    EXPECT_OK(memplug_host_cache_collect(cache, &released));
    EXPECT(released == MIB);
    EXPECT(pool_used(pool) == 8 * MIB);
    EXPECT_OK(memplug_host_allocation_free(weights));
    EXPECT_OK(memplug_host_binding_destroy(other));
    EXPECT_OK(memplug_host_cache_destroy(cache));
    EXPECT(pool_used(pool) == 0);
    copts.gc_threshold = 1.5;
    EXPECT_STATUS(memplug_host_cache_create(m, mech, pool, NULL, NULL, &copts, &out),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("gc_threshold 1.5");
    EXPECT(out.id == 0);
    EXPECT_OK(memplug_host_pool_release(pool));
}

int main(int argc, char **argv) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCache cache = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBindingOptions opts;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    EXPECT_OK(MEMPLUG_HOST_CHECK_API());
    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, argv[1]));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &mech));
    EXPECT_OK(memplug_host_pool_create(m, "device", 64 * MIB, &pool));
    memset(&opts, 0, sizeof opts);
    opts.struct_size = sizeof opts;
    opts.alloc_class = MEMPLUG_HOST_CLASS_WORKSPACE;
    EXPECT_OK(memplug_host_cache_create(m, mech, pool, &opts, NULL, NULL, &cache));
    if (failed == 0) {
        reuse(cache, pool);
        streams(m, cache);
        refusals(m, mech, pool, cache);
        pressure(m, mech);
        idle_policy(m, mech);
    }
    EXPECT_OK(memplug_host_cache_destroy(cache));
    EXPECT(pool_used(pool) == 0);
    EXPECT_OK(memplug_host_pool_release(pool));
    EXPECT_OK(memplug_host_mechanism_release(mech));
    EXPECT_OK(memplug_host_manager_destroy(m));
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
