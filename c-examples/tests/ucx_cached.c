/*
 * ucx_cached.c: cached blocks and parts of allocations on the wire through
 * the host C API (memplug_host_ucx_register_cached_allocation[_range],
 * _register_allocation_range, _peer_pull_into_cached_allocation,
 * _peer_push_from_cached_allocation), between two processes (this one and
 * a forked child) over UCX's TCP transport on loopback, on the reference
 * CPU plugin:
 *  - the owner registers a part of a cached 1 MiB block, then all of it,
 *    offers it and frees it on stream 1 at once: the handle is stale, and
 *    a request on stream 1, one on no stream and one from another thread
 *    each get a different block while the registration lives; trim gives
 *    nothing back; the pool is exact (three blocks);
 *  - the child pulls the range into a cached block of its own and frees
 *    that block on stream 1 with the get in flight (the owner stalls):
 *    stream 1 gets another block; once the get is done the block serves
 *    stream 1 again, holding the owner's bytes; it pushes a changed page
 *    back from that block, releases the range;
 *  - the owner sees the page in its freed, registered block, deregisters,
 *    and only then does the block serve stream 1 again; both pools end 0;
 *  - refusals, out-params untouched: a part of length 0, past the block or
 *    the allocation, or overflowing; a freed block; a cached block's
 *    handle where an allocation's belongs; a pull past the block.
 * Skipped (exit 77, with the reason) when UCX is not installed.
 *
 *   ucx_cached PATH/TO/libmemplug_plugin_cpu.so
 */
#define _POSIX_C_SOURCE 200809L

#include "memplug_host.h"

#include "expect.h"
#include "ucx_pair.h"

#include <pthread.h>
#include <time.h>

#define PAGE 4096u
#define STREAM 1u

static MemplugHostCacheStats stats_of(MemplugHostCache cache) {
    MemplugHostCacheStats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_OK(memplug_host_cache_stats(cache, &s));
    return s;
}

/* A cache over the env's pool with no idle cap. */
static MemplugHostCache open_cache(struct env *e) {
    MemplugHostCache cache = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCacheOptions copts;
    memset(&copts, 0, sizeof copts);
    copts.struct_size = sizeof copts;
    copts.max_idle_bytes = UINT64_MAX;
    EXPECT_OK(memplug_host_cache_create(e->m, e->mech, e->pool, NULL, "wire-cache", &copts, &cache));
    return cache;
}

/* Frees `a` on STREAM behind a fence that already completed: without a
 * pin, the next request on STREAM would take the block at once. */
static void free_on_stream(MemplugHostManager m, MemplugHostCachedAllocation a) {
    struct hand_fence done = {1};
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT;
    EXPECT_OK(memplug_host_fence_from_callbacks(m, "kernel that ran", hand_fence_query, hand_fence_wait, NULL, &done, &f));
    EXPECT_OK(memplug_host_cached_free_on(a, STREAM, &f, 1));
    EXPECT_OK(memplug_host_fence_release(f));
}

struct request {
    MemplugHostCache cache;
    MemplugHostCachedAllocation out;
    uint64_t addr;
};

static void *allocate_elsewhere(void *arg) {
    struct request *r = (struct request *)arg;
    EXPECT_OK(memplug_host_cache_allocate(r->cache, MIB, PAGE, 0, &r->out, &r->addr));
    return NULL;
}

/* Another thread's request for the size class; returns the block. */
static struct request from_another_thread(MemplugHostCache cache) {
    struct request r;
    pthread_t t;
    memset(&r, 0, sizeof r);
    r.cache = cache;
    EXPECT(pthread_create(&t, NULL, allocate_elsewhere, &r) == 0);
    EXPECT(pthread_join(t, NULL) == 0);
    return r;
}

static void refusals(struct env *e, MemplugHostCachedAllocation a) {
    MemplugHostUcxRegistration untouched = {42};
    MemplugHostCachedAllocation gone = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation plain = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostCache cache = MEMPLUG_HOST_NULL_HANDLE_INIT;
    const uint32_t r = MEMPLUG_HOST_UCX_ACCESS_READ;
    EXPECT_STATUS(memplug_host_ucx_register_cached_allocation_range(e->ucx, e->mech, a, 0, 0, r, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not inside the allocation");
    EXPECT_STATUS(memplug_host_ucx_register_cached_allocation_range(e->ucx, e->mech, a, MIB - PAGE, 2 * PAGE, r, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_ucx_register_cached_allocation_range(e->ucx, e->mech, a, PAGE, UINT64_MAX, r, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(memplug_host_allocate(e->b, MIB, PAGE, &plain, NULL));
    EXPECT_STATUS(memplug_host_ucx_register_allocation_range(e->ucx, e->mech, plain, MIB, 1, r, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not inside the allocation");
    EXPECT_STATUS(memplug_host_ucx_register_allocation_range(e->ucx, e->mech, plain, 0, 0, r, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(memplug_host_ucx_register_allocation_range(e->ucx, e->mech, plain, PAGE, PAGE, r, &untouched));
    EXPECT_OK(memplug_host_ucx_deregister(untouched));
    untouched.id = 42;
    EXPECT_OK(memplug_host_allocation_free(plain));
    {
        /* A cached block's handle where an allocation's belongs. */
        MemplugHostAllocation wrong = {a.id};
        EXPECT_STATUS(memplug_host_ucx_register_allocation(e->ucx, e->mech, wrong, r, &untouched),
                      MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    }
    cache = open_cache(e);
    EXPECT_OK(memplug_host_cache_allocate(cache, PAGE, PAGE, 0, &gone, NULL));
    EXPECT_OK(memplug_host_cached_free(gone));
    EXPECT_STATUS(memplug_host_ucx_register_cached_allocation(e->ucx, e->mech, gone, r, &untouched),
                  MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_MESSAGE("was freed");
    EXPECT_OK(memplug_host_cache_trim(cache, UINT64_MAX, NULL));
    EXPECT_OK(memplug_host_cache_destroy(cache));
    EXPECT(untouched.id == 42);
}

/* The owner: a cached MiB, registered read-write, offered, freed. */
static void owner(const char *plugin, int fd) {
    struct env e;
    MemplugHostCache cache;
    MemplugHostCachedAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT, same = MEMPLUG_HOST_NULL_HANDLE_INIT,
                                host = MEMPLUG_HOST_NULL_HANDLE_INIT, back = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxRegistration reg = MEMPLUG_HOST_NULL_HANDLE_INIT, part = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxPeer peer = MEMPLUG_HOST_NULL_HANDLE_INIT;
    struct timespec stall = {1, 0};
    struct request other;
    uint64_t addr = 0, same_addr = 0, host_addr = 0, back_addr = 0, i, id = 0, released = 1;
    uint8_t *p;
    bool left = false;
    int ok = 1;

    open_env(&e, plugin, 16 * MIB);
    cache = open_cache(&e);
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, PAGE, STREAM, &a, &addr));
    p = (uint8_t *)(uintptr_t)addr;
    for (i = 0; i < MIB; i++) p[i] = byte_at(i, 5);
    refusals(&e, a);

    EXPECT_OK(memplug_host_ucx_register_cached_allocation_range(e.ucx, e.mech, a, PAGE, 2 * PAGE,
                                                                MEMPLUG_HOST_UCX_ACCESS_READ, &part));
    EXPECT_OK(memplug_host_ucx_deregister(part));
    EXPECT_OK(memplug_host_ucx_register_cached_allocation(e.ucx, e.mech, a, MEMPLUG_HOST_UCX_ACCESS_READ_WRITE, &reg));
    EXPECT_OK(memplug_host_ucx_peer_connect(e.ucx, fd, MEMPLUG_HOST_UCX_ERRORS_PEER, WAIT_NS, &peer));
    EXPECT_OK(memplug_host_ucx_peer_offer(peer, reg, 93, &id));
    /* Freed while registered: stale at once, handed to nobody. */
    free_on_stream(e.m, a);
    EXPECT_STATUS(memplug_host_cached_free(a), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, PAGE, STREAM, &same, &same_addr));
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, PAGE, 0, &host, &host_addr));
    other = from_another_thread(cache);
    EXPECT(same_addr != addr && host_addr != addr && other.addr != addr);
    EXPECT_OK(memplug_host_cache_trim(cache, UINT64_MAX, &released));
    EXPECT(released == 0);
    EXPECT(pool_used(e.pool) == 4 * MIB && stats_of(cache).in_use_blocks == 4);
    EXPECT(stats_of(cache).pinned_blocks == 1); /* the freed, registered one */

    /* Stall so the child's pull stays in flight while it frees its block;
     * then serve its reads and its push until it leaves. */
    nanosleep(&stall, NULL);
    EXPECT_OK(memplug_host_ucx_peer_serve(peer, WAIT_NS, &left));
    EXPECT(left);
    for (i = 0; i < MIB; i++) {
        uint8_t want = i < PAGE ? (uint8_t)~byte_at(i, 5) : byte_at(i, 5);
        if (p[i] != want) ok = 0;
    }
    EXPECT(ok); /* the pushed page landed in the freed, registered block */
    EXPECT_OK(memplug_host_manager_poll(e.m, NULL));
    EXPECT(pool_used(e.pool) == 4 * MIB);
    EXPECT_OK(memplug_host_ucx_deregister(reg));
    /* Deregistered: the block serves stream 1 again. */
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, PAGE, STREAM, &back, &back_addr));
    EXPECT(back_addr == addr);
    EXPECT(stats_of(cache).pinned_blocks == 0);
    EXPECT(pool_used(e.pool) == 4 * MIB);
    EXPECT_OK(memplug_host_cached_free(back));
    EXPECT_OK(memplug_host_cached_free(same));
    EXPECT_OK(memplug_host_cached_free(host));
    EXPECT_OK(memplug_host_cached_free(other.out));
    EXPECT_OK(memplug_host_cache_trim(cache, UINT64_MAX, &released));
    EXPECT(released == 4 * MIB);
    EXPECT_OK(memplug_host_manager_poll(e.m, NULL));
    EXPECT(pool_used(e.pool) == 0);
    EXPECT_OK(memplug_host_cache_destroy(cache));
    EXPECT_OK(memplug_host_ucx_peer_destroy(peer));
    close_env(&e);
}

/* The child: pulls the offered MiB into a cached block of its own. */
static void puller(const char *plugin, int fd) {
    struct env e;
    MemplugHostCache cache;
    MemplugHostCachedAllocation pa = MEMPLUG_HOST_NULL_HANDLE_INIT, same = MEMPLUG_HOST_NULL_HANDLE_INIT,
                                back = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxPeer peer = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxRemoteRange range;
    MemplugHostUcxTransfer t = MEMPLUG_HOST_NULL_HANDLE_INIT, none = {9};
    uint64_t addr = 0, same_addr = 0, back_addr = 0, i;
    uint8_t *p;
    int ok = 1;

    open_env(&e, plugin, 4 * MIB);
    cache = open_cache(&e);
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, PAGE, STREAM, &pa, &addr));
    EXPECT_OK(memplug_host_ucx_peer_connect(e.ucx, fd, MEMPLUG_HOST_UCX_ERRORS_PEER, WAIT_NS, &peer));
    memset(&range, 0, sizeof range);
    EXPECT_OK(memplug_host_ucx_peer_next_offer(peer, WAIT_NS, &range));
    EXPECT(range.len == MIB && range.tag == 93 && range.writable == 1);
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_cached_allocation(peer, pa, 1, &range, 0, MIB, &none),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not inside the allocation");
    EXPECT(none.id == 9);

    /* The owner stalls: the get is in flight when the block is freed. */
    EXPECT_OK(memplug_host_ucx_peer_pull_into_cached_allocation(peer, pa, 0, &range, 0, MIB, &t));
    free_on_stream(e.m, pa);
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, PAGE, STREAM, &same, &same_addr));
    EXPECT(same_addr != addr); /* not the block the get writes into */
    EXPECT(pool_used(e.pool) == 2 * MIB);
    EXPECT_OK(memplug_host_ucx_transfer_wait(t, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_transfer_release(t));
    EXPECT_OK(memplug_host_cache_allocate(cache, MIB, PAGE, STREAM, &back, &back_addr));
    EXPECT(back_addr == addr); /* done: the block serves again */
    p = (uint8_t *)(uintptr_t)addr;
    for (i = 0; i < MIB; i++) {
        if (p[i] != byte_at(i, 5)) ok = 0;
    }
    EXPECT(ok);
    for (i = 0; i < PAGE; i++) p[i] = (uint8_t)~p[i];
    EXPECT_OK(memplug_host_ucx_peer_push_from_cached_allocation(peer, back, 0, &range, 0, PAGE, &t));
    EXPECT_OK(memplug_host_ucx_transfer_wait(t, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_transfer_release(t));
    EXPECT_OK(memplug_host_ucx_peer_release(peer, &range, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_peer_destroy(peer));
    EXPECT_OK(memplug_host_cached_free(back));
    EXPECT_OK(memplug_host_cached_free(same));
    EXPECT_OK(memplug_host_cache_trim(cache, UINT64_MAX, NULL));
    EXPECT_OK(memplug_host_manager_poll(e.m, NULL));
    EXPECT(pool_used(e.pool) == 0);
    EXPECT_OK(memplug_host_cache_destroy(cache));
    close_env(&e);
}

int main(int argc, char **argv) { return run_pair(argc, argv, owner, puller); }
