/*
 * kv_cache.c: a C runtime embedding the memplug host through its C API.
 *
 *   kv_cache PATH/TO/libmemplug_plugin_cpu.so
 *
 * It plays a tiny inference server on the reference CPU plugin:
 *   1. loads the plugin and picks a mechanism with virtual backing, shared
 *      mapping and sync;
 *   2. sets a 64 MiB budget (a pool) and registers the KV cache as a holder
 *      that answers pressure tickets by evicting a sequence;
 *   3. creates a shared prompt prefix once and maps it into two sequences'
 *      KV regions, then grows each region at a stable address;
 *   4. frees a scratch buffer only after a fence recorded behind in-flight
 *      "kernel" work on a plugin stream;
 *   5. loads weights that do not fit until the holder evicts;
 *   6. prints the pool and holder statistics, and tears everything down.
 *
 * C99, compiled with -Wall -Wextra -Wpedantic -Werror. Exits non-zero on
 * the first unexpected result (it runs as a ctest test).
 */
/* nanosleep */
#define _POSIX_C_SOURCE 200809L

#include "memplug_host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB (1024u * 1024u)

static void die(const char *what, MemplugHostStatus s) {
    char msg[512];
    memplug_host_last_error_message(msg, sizeof msg);
    fprintf(stderr, "kv_cache: %s failed: %s: %s\n", what, memplug_host_status_name(s), msg);
    exit(1);
}

#define CHECK(call)                                                                                 \
    do {                                                                                            \
        MemplugHostStatus s_ = (call);                                                              \
        if (s_ != MEMPLUG_HOST_STATUS_OK) die(#call, s_);                                           \
    } while (0)

#define EXPECT(cond)                                                                                \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            fprintf(stderr, "kv_cache: expectation failed: %s (line %d)\n", #cond, __LINE__);       \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

/* ---- the KV cache: two sequences, each a region starting with the prefix ---- */

struct sequence {
    const char *name;
    MemplugHostRegion region;
    uint64_t prefix_len;
    int evicted;
};

struct kv_cache {
    struct sequence seq[2];
    unsigned tickets;
};

static MemplugHostRegionInfo region_info(MemplugHostRegion r) {
    MemplugHostRegionInfo info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(memplug_host_region_info(r, &info));
    return info;
}

/* Pressure callback: the governor never picks victims; the KV cache does.
 * It evicts the private part of the last sequence not yet evicted (the
 * shared prefix stays) and answers with the bytes it released. */
static uint64_t on_pressure(void *userdata, const MemplugHostPressureTicket *t) {
    struct kv_cache *kv = (struct kv_cache *)userdata;
    int i;
    kv->tickets++;
    printf("  ticket: pool wants %llu bytes more (class %u, requester priority %u)\n",
           (unsigned long long)t->bytes_wanted, t->alloc_class, t->requester_priority);
    for (i = 1; i >= 0; i--) {
        struct sequence *s = &kv->seq[i];
        MemplugHostRegionInfo before;
        if (s->evicted) continue;
        before = region_info(s->region);
        /* No fence: nothing in flight uses this sequence any more. */
        CHECK(memplug_host_region_shrink(s->region, s->prefix_len, NULL, 0));
        s->evicted = 1;
        printf("  evicted sequence %s: released %llu bytes\n", s->name,
               (unsigned long long)before.committed);
        return before.committed;
    }
    return 0; /* a holder may legitimately release nothing */
}

/* Fills the shared prefix once, through a temporary writable view. */
static void fill_prefix(void *userdata, uint64_t addr, uint64_t len) {
    const char *prompt = (const char *)userdata;
    char *p = (char *)(uintptr_t)addr;
    memset(p, 0, (size_t)len);
    memcpy(p, prompt, strlen(prompt) + 1);
    printf("  prefix filled: %llu bytes at %#llx\n", (unsigned long long)len, (unsigned long long)addr);
}

/* The runtime's step of a grow: here it only records the new view. */
static bool on_grow(void *userdata, uint64_t addr, uint64_t len) {
    struct sequence *s = (struct sequence *)userdata;
    printf("  %s: view is now %llu bytes at %#llx\n", s->name, (unsigned long long)len,
           (unsigned long long)addr);
    return true;
}

/* A "kernel" run on the plugin's stream: it writes the scratch buffer. */
struct kernel {
    unsigned char *scratch;
    size_t len;
};

static void run_kernel(void *userdata) {
    struct kernel *k = (struct kernel *)userdata;
    struct timespec ts;
    ts.tv_sec = 0;
    ts.tv_nsec = 30 * 1000 * 1000;
    nanosleep(&ts, NULL);
    memset(k->scratch, 0x42, k->len);
}

static MemplugHostPoolStats pool_stats(MemplugHostPool p) {
    MemplugHostPoolStats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK(memplug_host_pool_stats(p, &st));
    return st;
}

int main(int argc, char **argv) {
    MemplugHostVersion v;
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanismInfo mi;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostHolder holder = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBindingOptions kv_opts;
    MemplugHostBinding kv_binding = MEMPLUG_HOST_NULL_HANDLE_INIT, weights = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPrefix prefix = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPrefixInfo pi;
    MemplugHostStream stream = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence fence = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation scratch = MEMPLUG_HOST_NULL_HANDLE_INIT, w = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPollReport poll;
    MemplugHostHolderStats hs;
    MemplugHostPoolStats ps;
    MemplugDevice cpu0;
    struct kv_cache kv;
    struct kernel k;
    uint64_t scratch_addr = 0, left = 1;
    bool done = false;
    int i;
    static const char prompt[] = "You are a helpful assistant. Answer briefly.";

    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }

    CHECK(MEMPLUG_HOST_CHECK_API()); /* the library is at least as new as this header */
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    CHECK(memplug_host_get_version(&v));
    printf("memplug host %s (C API %u.%u, plugin ABI %u.%u-%u)\n", memplug_host_version_string(),
           v.api_major, v.api_minor, v.abi_major, v.abi_min_minor, v.abi_max_minor);

    /* 1. Plugin and mechanism. */
    CHECK(memplug_host_manager_create(&m));
    CHECK(memplug_host_manager_load_plugin(m, argv[1]));
    cpu0.kind = MEMPLUG_DEVICE_CPU;
    cpu0.ordinal = 0;
    CHECK(memplug_host_manager_select(
        m, cpu0, MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING | MEMPLUG_CAP_SYNC, &mech));
    memset(&mi, 0, sizeof mi);
    mi.struct_size = sizeof mi;
    CHECK(memplug_host_mechanism_info(mech, &mi));
    printf("mechanism %s/%s: caps %#x, granularity %llu\n", mi.plugin_name, mi.name, mi.capabilities,
           (unsigned long long)mi.granularity);

    /* 2. Budget and holder. */
    CHECK(memplug_host_pool_create(m, "host-memory", 64u * MIB, &pool));
    memset(&kv, 0, sizeof kv);
    kv.seq[0].name = "A";
    kv.seq[1].name = "B";
    CHECK(memplug_host_holder_register(pool, "kv-cache", MEMPLUG_HOST_PRIORITY_LOWEST, on_pressure, &kv,
                                       &holder));
    memset(&kv_opts, 0, sizeof kv_opts);
    kv_opts.struct_size = sizeof kv_opts;
    kv_opts.alloc_class = MEMPLUG_HOST_CLASS_KV;
    kv_opts.holder = holder;
    CHECK(memplug_host_binding_create(m, mech, pool, &kv_opts, &kv_binding));
    CHECK(memplug_host_binding_create(m, mech, pool, NULL, &weights));
    printf("budget: 64 MiB; holder kv-cache registered\n");

    /* 3. Shared prefix, mapped into two sequences, then growth. */
    CHECK(memplug_host_prefix_create(kv_binding, 1 * MIB, fill_prefix, (void *)prompt, &prefix));
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    CHECK(memplug_host_prefix_info(prefix, &pi));
    for (i = 0; i < 2; i++) {
        struct sequence *s = &kv.seq[i];
        MemplugHostRegionInfo ri;
        CHECK(memplug_host_region_reserve(kv_binding, 32u * MIB, &s->region));
        CHECK(memplug_host_region_map_prefix(s->region, prefix));
        s->prefix_len = pi.len;
        ri = region_info(s->region);
        EXPECT(strcmp((const char *)(uintptr_t)ri.addr, prompt) == 0);
        printf("sequence %s: region at %#llx reads the shared prompt \"%.20s...\"\n", s->name,
               (unsigned long long)ri.addr, (const char *)(uintptr_t)ri.addr);
        CHECK(memplug_host_region_grow(s->region, pi.len + 8u * MIB, on_grow, s));
        CHECK(memplug_host_region_grow(s->region, pi.len + 16u * MIB, on_grow, s));
        EXPECT(region_info(s->region).addr == ri.addr); /* the base never moves */
        memset((void *)(uintptr_t)(ri.addr + pi.len), i + 1, 16u * MIB);
    }
    ps = pool_stats(pool);
    printf("after growth: used %llu of %llu bytes (prefix charged once: %llu)\n",
           (unsigned long long)ps.used, (unsigned long long)ps.capacity, (unsigned long long)pi.charged);
    EXPECT(ps.used == pi.charged + 32u * MIB);
    CHECK(memplug_host_prefix_release(prefix)); /* the regions keep it alive */

    /* 4. A free ordered after in-flight work. */
    CHECK(memplug_host_allocate(weights, 1 * MIB, 64, &scratch, &scratch_addr));
    CHECK(memplug_host_stream_create(mech, &stream));
    k.scratch = (unsigned char *)(uintptr_t)scratch_addr;
    k.len = 1 * MIB;
    CHECK(memplug_host_stream_enqueue(stream, run_kernel, &k));
    CHECK(memplug_host_fence_record(stream, &fence));
    CHECK(memplug_host_allocation_free_after(scratch, &fence, 1));
    memset(&poll, 0, sizeof poll);
    poll.struct_size = sizeof poll;
    CHECK(memplug_host_manager_poll(m, &poll));
    printf("scratch freed after a fence: %llu free(s) pending while the kernel runs\n",
           (unsigned long long)poll.pending);
    EXPECT(poll.pending == 1);
    CHECK(memplug_host_fence_wait(fence, 5000000000ull, &done));
    EXPECT(done);
    CHECK(memplug_host_manager_poll(m, &poll));
    printf("kernel done: %llu retired, %llu pending\n", (unsigned long long)poll.retired,
           (unsigned long long)poll.pending);
    EXPECT(poll.pending == 0);
    CHECK(memplug_host_fence_release(fence));
    CHECK(memplug_host_stream_destroy(stream));

    /* 5. Weights that only fit once the KV cache gives memory back. */
    printf("loading 40 MiB of weights (free: %llu bytes)\n", (unsigned long long)pool_stats(pool).free);
    CHECK(memplug_host_allocate(weights, 40u * MIB, 4096, &w, NULL));
    EXPECT(kv.tickets == 1 && kv.seq[1].evicted);
    printf("weights loaded after %u pressure ticket(s)\n", kv.tickets);

    /* 6. Statistics and teardown. */
    ps = pool_stats(pool);
    memset(&hs, 0, sizeof hs);
    hs.struct_size = sizeof hs;
    CHECK(memplug_host_holder_stats(holder, &hs));
    printf("pool: used %llu, peak %llu, tickets %llu; kv-cache: leased %llu, answered %llu\n",
           (unsigned long long)ps.used, (unsigned long long)ps.peak, (unsigned long long)ps.tickets,
           (unsigned long long)hs.leased, (unsigned long long)hs.bytes_answered);
    EXPECT(hs.bytes_answered == 16u * MIB && hs.nonsense_answers == 0);

    CHECK(memplug_host_allocation_free(w));
    CHECK(memplug_host_allocation_free(w) == MEMPLUG_HOST_STATUS_STALE_HANDLE ? MEMPLUG_HOST_STATUS_OK
                                                                               : MEMPLUG_HOST_STATUS_INTERNAL);
    for (i = 0; i < 2; i++) CHECK(memplug_host_region_free(kv.seq[i].region));
    CHECK(memplug_host_binding_destroy(kv_binding));
    CHECK(memplug_host_binding_destroy(weights));
    CHECK(memplug_host_holder_unregister(holder));
    EXPECT(pool_stats(pool).used == 0);
    CHECK(memplug_host_manager_drain(m, 1000000000ull, &left));
    EXPECT(left == 0);
    CHECK(memplug_host_pool_release(pool));
    CHECK(memplug_host_mechanism_release(mech));
    CHECK(memplug_host_manager_unload_plugin(m, "memplug-cpu"));
    CHECK(memplug_host_manager_destroy(m));
    printf("done: every byte returned, plugin unloaded\n");
    return 0;
}
