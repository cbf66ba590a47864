/*
 * bad_input.c: the host C API refuses every kind of bad input with a
 * status — never a crash, never undefined behaviour:
 *
 *   NULL arguments, zero / stale / double-freed / forged / wrong-kind
 *   handles, handles of another (or a destroyed) manager, overflowing
 *   sizes, short struct_size, unknown enum values, non-UTF-8 strings, and
 *   callbacks that answer nonsense or re-enter the API.
 *
 *   bad_input PATH/TO/libmemplug_plugin_cpu.so
 *
 * Built with -Wall -Wextra -Wpedantic -Werror; also run under
 * AddressSanitizer + UndefinedBehaviorSanitizer and under valgrind (see
 * CMakeLists.txt). Prints "N passed, N failed" and exits non-zero on any
 * failure.
 */
#include "memplug_host.h"

#include "expect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


struct env {
    MemplugHostManager m;
    MemplugHostMechanism mech;
    MemplugHostPool pool;
    MemplugHostBinding binding;
};

static struct env env_new(const char *plugin, uint64_t capacity) {
    struct env e;
    MemplugDevice cpu0;
    memset(&e, 0, sizeof e);
    cpu0.kind = MEMPLUG_DEVICE_CPU;
    cpu0.ordinal = 0;
    EXPECT_OK(memplug_host_manager_create(&e.m));
    EXPECT_OK(memplug_host_manager_load_plugin(e.m, plugin));
    EXPECT_OK(memplug_host_manager_select(e.m, cpu0, MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING,
                                          &e.mech));
    EXPECT_OK(memplug_host_pool_create(e.m, "pool", capacity, &e.pool));
    EXPECT_OK(memplug_host_binding_create(e.m, e.mech, e.pool, NULL, &e.binding));
    return e;
}

/* ---- NULL arguments ------------------------------------------------------ */

static void null_arguments(const struct env *e) {
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegionInfo ri;
    EXPECT_STATUS(memplug_host_manager_create(NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_load_plugin(e->m, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_unload_plugin(e->m, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_mechanism_count(e->m, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_mechanism(e->m, 0, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_find_mechanism(e->m, NULL, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_mechanism_info(e->mech, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_pool_create(e->m, NULL, 1, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_pool_stats(e->pool, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_holder_register(e->pool, NULL, 0, NULL, NULL, NULL),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_binding_create(e->m, e->mech, e->pool, NULL, NULL),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_allocate(e->binding, 64, 16, NULL, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_allocation_info(a, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_region_reserve(e->binding, 4096, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_prefix_create(e->binding, 4096, NULL, NULL, NULL),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_fence_from_callbacks(e->m, "f", NULL, NULL, NULL, NULL, NULL),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_get_version(NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    /* fences == NULL with a count: refused before anything is freed. */
    EXPECT_OK(memplug_host_allocate(e->binding, 64, 16, &a, NULL));
    EXPECT_STATUS(memplug_host_allocation_free_after(a, NULL, 1), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_OK(memplug_host_allocation_free(a));
    /* Out-params stay untouched on failure. */
    memset(&ri, 0x5a, sizeof ri);
    ri.struct_size = 4;
    EXPECT_STATUS(memplug_host_region_info((MemplugHostRegion){e->binding.id}, &ri),
                  MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT(ri.addr == 0x5a5a5a5a5a5a5a5aull);
}

/* ---- zero, stale, double-freed, forged and wrong-kind handles ------------ */

static void bad_handles(const struct env *e) {
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT, zero_a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT, zero_b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocationInfo info;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int i, ok_count = 0;

    /* The zero handle: freeing is a no-op, using is refused. */
    EXPECT_OK(memplug_host_allocation_free(zero_a));
    EXPECT_OK(memplug_host_binding_destroy(zero_b));
    EXPECT_OK(memplug_host_manager_destroy((MemplugHostManager){0}));
    EXPECT_STATUS(memplug_host_allocate(zero_b, 64, 16, &a, NULL), MEMPLUG_HOST_STATUS_INVALID_HANDLE);

    /* Double free. */
    EXPECT_OK(memplug_host_allocate(e->binding, 64, 16, &a, NULL));
    EXPECT_OK(memplug_host_allocation_free(a));
    EXPECT_STATUS(memplug_host_allocation_free(a), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_STATUS(memplug_host_allocation_info(a, &info), MEMPLUG_HOST_STATUS_STALE_HANDLE);

    /* Use after destroy. */
    EXPECT_OK(memplug_host_binding_create(e->m, e->mech, e->pool, NULL, &b));
    EXPECT_OK(memplug_host_binding_destroy(b));
    EXPECT_STATUS(memplug_host_allocate(b, 64, 16, &a, NULL), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_STATUS(memplug_host_binding_destroy(b), MEMPLUG_HOST_STATUS_STALE_HANDLE);

    /* Wrong kind: a pool handle is not a binding, a binding not a manager. */
    EXPECT_STATUS(memplug_host_allocate((MemplugHostBinding){e->pool.id}, 64, 16, &a, NULL),
                  MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_STATUS(memplug_host_manager_destroy((MemplugHostManager){e->binding.id}),
                  MEMPLUG_HOST_STATUS_INVALID_HANDLE);

    /* Forged: flipped bits of a live handle, and pseudo-random values. */
    EXPECT_STATUS(memplug_host_allocate((MemplugHostBinding){e->binding.id ^ (1ull << 30)}, 64, 16, &a, NULL),
                  MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_STATUS(memplug_host_allocate((MemplugHostBinding){e->binding.id + 1000000}, 64, 16, &a, NULL),
                  MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    for (i = 0; i < 100000; i++) {
        MemplugHostAllocation f;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        f.id = x;
        if (memplug_host_allocation_free(f) == MEMPLUG_HOST_STATUS_OK) ok_count++;
        if (memplug_host_allocation_info(f, &info) == MEMPLUG_HOST_STATUS_OK) ok_count++;
    }
    EXPECT(ok_count == 0);
    EXPECT(pool_used(e->pool) == 0);
}

/* ---- other managers, destroyed managers ---------------------------------- */

static bool always_done(void *userdata) {
    (void)userdata;
    return true;
}

static void wrong_manager(const char *plugin, const struct env *e) {
    struct env o = env_new(plugin, 1u << 20);
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPrefix p = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT;

    EXPECT_STATUS(memplug_host_binding_create(e->m, o.mech, e->pool, NULL, &b), MEMPLUG_HOST_STATUS_WRONG_MANAGER);
    EXPECT_STATUS(memplug_host_binding_create(e->m, e->mech, o.pool, NULL, &b), MEMPLUG_HOST_STATUS_WRONG_MANAGER);
    EXPECT(b.id == 0);
    EXPECT_OK(memplug_host_region_reserve(e->binding, 1u << 20, &r));
    EXPECT_OK(memplug_host_prefix_create(o.binding, 4096, NULL, NULL, &p));
    EXPECT_STATUS(memplug_host_region_map_prefix(r, p), MEMPLUG_HOST_STATUS_WRONG_MANAGER);
    EXPECT_OK(memplug_host_allocate(e->binding, 64, 16, &a, NULL));
    EXPECT_OK(memplug_host_fence_from_callbacks(o.m, "foreign", always_done, NULL, NULL, NULL, &f));
    EXPECT_STATUS(memplug_host_allocation_free_after(a, &f, 1), MEMPLUG_HOST_STATUS_WRONG_MANAGER);
    EXPECT_OK(memplug_host_fence_release(f));

    /* Destroy the other manager with objects alive: every handle goes stale. */
    EXPECT_OK(memplug_host_manager_destroy(o.m));
    EXPECT_STATUS(memplug_host_manager_destroy(o.m), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_STATUS(memplug_host_allocate(o.binding, 64, 16, &a, NULL), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_STATUS(memplug_host_prefix_release(p), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_STATUS(memplug_host_pool_stats(o.pool, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_mechanism_release(o.mech), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_allocation_free(a));
    EXPECT_OK(memplug_host_region_free(r));
}

/* ---- sizes, struct sizes, enums, strings ---------------------------------- */

static void bad_values(const struct env *e) {
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPrefix p = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBindingOptions opts;
    MemplugHostPoolStats ps;
    MemplugHostClassStats cs;
    MemplugDevice dev;
    char buf[8];
    const char bad_utf8[] = {'p', (char)0xff, (char)0xfe, 0};

    EXPECT_STATUS(memplug_host_allocate(e->binding, UINT64_MAX, 16, &a, NULL), MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    EXPECT_STATUS(memplug_host_allocate(e->binding, UINT64_MAX - 4095, 4096, &a, NULL),
                  MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    EXPECT(memplug_host_allocate(e->binding, 64, 3, &a, NULL) != MEMPLUG_HOST_STATUS_OK); /* alignment */
    EXPECT(memplug_host_allocate(e->binding, 64, 0, &a, NULL) != MEMPLUG_HOST_STATUS_OK);
    EXPECT(memplug_host_allocate(e->binding, 64, 1ull << 63, &a, NULL) != MEMPLUG_HOST_STATUS_OK);
    EXPECT(a.id == 0);
    EXPECT(memplug_host_region_reserve(e->binding, UINT64_MAX, &r) != MEMPLUG_HOST_STATUS_OK);
    EXPECT(r.id == 0);
    EXPECT(memplug_host_prefix_create(e->binding, UINT64_MAX, NULL, NULL, &p) != MEMPLUG_HOST_STATUS_OK);
    EXPECT(memplug_host_prefix_create(e->binding, UINT64_MAX - 100, NULL, NULL, &p) != MEMPLUG_HOST_STATUS_OK);
    EXPECT(p.id == 0);
    EXPECT_OK(memplug_host_region_reserve(e->binding, 1u << 20, &r));
    EXPECT_STATUS(memplug_host_region_grow(r, UINT64_MAX, NULL, NULL), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_region_grow(r, (1u << 20) + 1, NULL, NULL), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(memplug_host_region_shrink(r, UINT64_MAX, NULL, 0)); /* at or above: a no-op */
    EXPECT_OK(memplug_host_region_free(r));
    EXPECT_STATUS(memplug_host_pool_create(e->m, "huge", UINT64_MAX, &pool), MEMPLUG_HOST_STATUS_OUT_OF_RANGE);
    EXPECT_STATUS(memplug_host_pool_create(e->m, "pool", 1, &pool), MEMPLUG_HOST_STATUS_ALREADY_EXISTS);
    EXPECT_STATUS(memplug_host_pool_create(e->m, bad_utf8, 1, &pool), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT(pool.id == 0);

    /* struct_size shorter than 1.0 is refused, the struct left alone. */
    memset(&ps, 0, sizeof ps);
    ps.struct_size = 8;
    EXPECT_STATUS(memplug_host_pool_stats(e->pool, &ps), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT(ps.capacity == 0 && ps.struct_size == 8);
    memset(&opts, 0, sizeof opts);
    opts.struct_size = 3;
    EXPECT_STATUS(memplug_host_binding_create(e->m, e->mech, e->pool, &opts, &b),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    /* Unknown class, unknown capability bits, unknown holder. */
    opts.struct_size = sizeof opts;
    opts.alloc_class = 77;
    EXPECT_STATUS(memplug_host_binding_create(e->m, e->mech, e->pool, &opts, &b),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    opts.alloc_class = MEMPLUG_HOST_CLASS_KV;
    opts.holder.id = e->pool.id;
    EXPECT_STATUS(memplug_host_binding_create(e->m, e->mech, e->pool, &opts, &b),
                  MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT(b.id == 0);
    memset(&cs, 0, sizeof cs);
    cs.struct_size = sizeof cs;
    EXPECT_STATUS(memplug_host_pool_class_stats(e->pool, MEMPLUG_HOST_CLASS_COUNT, &cs),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    dev.kind = MEMPLUG_DEVICE_CPU;
    dev.ordinal = 0;
    EXPECT_STATUS(memplug_host_manager_select(e->m, dev, 1u << 20, &mech), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    dev.kind = 999;
    EXPECT_STATUS(memplug_host_manager_select(e->m, dev, 0, &mech), MEMPLUG_HOST_STATUS_NOT_FOUND);
    EXPECT_STATUS(memplug_host_manager_mechanism(e->m, 12345, &mech), MEMPLUG_HOST_STATUS_NOT_FOUND);
    EXPECT(mech.id == 0);
    EXPECT_STATUS(memplug_host_manager_start_reaper(e->m, 0), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);

    /* Plugins that are not plugins. */
    EXPECT_STATUS(memplug_host_manager_load_plugin(e->m, "/nonexistent/libnothing.so"),
                  MEMPLUG_HOST_STATUS_LOAD_FAILED);
    EXPECT_STATUS(memplug_host_manager_load_plugin(e->m, "/etc/passwd"), MEMPLUG_HOST_STATUS_LOAD_FAILED);
    EXPECT_STATUS(memplug_host_manager_unload_plugin(e->m, "no-such-plugin"), MEMPLUG_HOST_STATUS_NOT_FOUND);

    /* Messages: snprintf-like truncation, statuses by name. */
    EXPECT(memplug_host_last_error_message(buf, sizeof buf) > sizeof buf);
    EXPECT(buf[sizeof buf - 1] == '\0');
    EXPECT(memplug_host_last_error_message(NULL, 0) > 0);
    EXPECT(strcmp(memplug_host_status_name(MEMPLUG_HOST_STATUS_STALE_HANDLE), "MEMPLUG_HOST_STATUS_STALE_HANDLE") == 0);
    EXPECT(strcmp(memplug_host_status_name(123456), "MEMPLUG_HOST_STATUS_UNKNOWN") == 0);
    EXPECT_STATUS(memplug_host_check_api(MEMPLUG_HOST_API_MAJOR + 1, 0), MEMPLUG_HOST_STATUS_VERSION_MISMATCH);
    EXPECT(memplug_host_last_error_status() == MEMPLUG_HOST_STATUS_VERSION_MISMATCH);
    EXPECT(pool_used(e->pool) == 0);
}

/* ---- callbacks: nonsense answers and re-entry ------------------------------ */

struct cb_state {
    MemplugHostManager m;
    MemplugHostRegion region;
    MemplugHostAllocation victim;
    MemplugHostStatus seen;
    int mode;
};

enum { LIE, DESTROY_MANAGER, FREE_VICTIM, DRAIN };

static uint64_t pressure(void *userdata, const MemplugHostPressureTicket *t) {
    struct cb_state *s = (struct cb_state *)userdata;
    (void)t;
    switch (s->mode) {
    case LIE:
        return UINT64_MAX;
    case DESTROY_MANAGER:
        s->seen = memplug_host_manager_destroy(s->m);
        return 0;
    case DRAIN:
        s->seen = memplug_host_manager_drain(s->m, 0, NULL);
        return 0;
    default: {
        MemplugHostAllocationInfo info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        if (memplug_host_allocation_info(s->victim, &info) != MEMPLUG_HOST_STATUS_OK) return 0;
        s->seen = memplug_host_allocation_free(s->victim);
        return info.size;
    }
    }
}

static bool regrow_same(void *userdata, uint64_t addr, uint64_t len) {
    struct cb_state *s = (struct cb_state *)userdata;
    MemplugHostRegionInfo ri;
    (void)addr;
    memset(&ri, 0, sizeof ri);
    ri.struct_size = sizeof ri;
    s->seen = memplug_host_region_grow(s->region, len * 2, NULL, NULL);
    if (memplug_host_region_info(s->region, &ri) != MEMPLUG_HOST_STATUS_REENTRANT) s->seen = MEMPLUG_HOST_STATUS_OK;
    if (memplug_host_region_free(s->region) != MEMPLUG_HOST_STATUS_REENTRANT) s->seen = MEMPLUG_HOST_STATUS_OK;
    return true;
}

static bool query_destroys(void *userdata) {
    struct cb_state *s = (struct cb_state *)userdata;
    s->seen = memplug_host_manager_destroy(s->m);
    return true;
}

static void callbacks(const char *plugin) {
    struct env e = env_new(plugin, 64u * 1024);
    struct cb_state s;
    MemplugHostHolder h = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostHolderStats hs;
    MemplugHostAllocation fill = MEMPLUG_HOST_NULL_HANDLE_INIT, a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegionInfo ri;

    memset(&s, 0, sizeof s);
    s.m = e.m;
    EXPECT_OK(memplug_host_holder_register(e.pool, "h", 0, pressure, &s, &h));
    EXPECT_OK(memplug_host_allocate(e.binding, 60u * 1024, 64, &fill, NULL));

    /* Nonsense: "released" 2^64-1 bytes. Clamped, counted, never refunded. */
    s.mode = LIE;
    EXPECT_STATUS(memplug_host_allocate(e.binding, 8u * 1024, 64, &a, NULL), MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    memset(&hs, 0, sizeof hs);
    hs.struct_size = sizeof hs;
    EXPECT_OK(memplug_host_holder_stats(h, &hs));
    EXPECT(hs.nonsense_answers == 1 && hs.bytes_answered <= 64u * 1024);
    EXPECT(pool_used(e.pool) == 60u * 1024);

    /* Re-entry: destroying the manager or draining is refused... */
    s.mode = DESTROY_MANAGER;
    EXPECT_STATUS(memplug_host_allocate(e.binding, 8u * 1024, 64, &a, NULL), MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    EXPECT(s.seen == MEMPLUG_HOST_STATUS_REENTRANT);
    s.mode = DRAIN;
    EXPECT_STATUS(memplug_host_allocate(e.binding, 8u * 1024, 64, &a, NULL), MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    EXPECT(s.seen == MEMPLUG_HOST_STATUS_REENTRANT);
    /* ...freeing through the API is what a holder is for. */
    s.mode = FREE_VICTIM;
    s.victim = fill;
    EXPECT_OK(memplug_host_allocate(e.binding, 8u * 1024, 64, &a, NULL));
    EXPECT(s.seen == MEMPLUG_HOST_STATUS_OK);
    EXPECT_STATUS(memplug_host_allocation_free(fill), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_allocation_free(a));

    /* A grow update re-entering its own region: refused, not a deadlock. */
    EXPECT_OK(memplug_host_region_reserve(e.binding, 1u << 20, &r));
    s.region = r;
    s.seen = MEMPLUG_HOST_STATUS_OK;
    EXPECT_OK(memplug_host_region_grow(r, 4096, regrow_same, &s));
    EXPECT(s.seen == MEMPLUG_HOST_STATUS_REENTRANT);
    memset(&ri, 0, sizeof ri);
    ri.struct_size = sizeof ri;
    EXPECT_OK(memplug_host_region_info(r, &ri));
    EXPECT(ri.committed == 4096);

    /* A fence query re-entering to destroy the manager: refused. */
    EXPECT_OK(memplug_host_fence_from_callbacks(e.m, "evil", query_destroys, NULL, NULL, &s, &f));
    EXPECT_OK(memplug_host_region_free(r));
    EXPECT_OK(memplug_host_allocate(e.binding, 4096, 64, &a, NULL));
    s.seen = MEMPLUG_HOST_STATUS_OK;
    EXPECT_OK(memplug_host_allocation_free_after(a, &f, 1)); /* queries the fence now */
    EXPECT(s.seen == MEMPLUG_HOST_STATUS_REENTRANT);
    EXPECT_OK(memplug_host_fence_release(f));
    EXPECT_OK(memplug_host_holder_unregister(h));
    EXPECT(pool_used(e.pool) == 0);
    EXPECT_OK(memplug_host_manager_destroy(e.m));
}

int main(int argc, char **argv) {
    struct env e;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    e = env_new(argv[1], 1u << 24);
    null_arguments(&e);
    bad_handles(&e);
    wrong_manager(argv[1], &e);
    bad_values(&e);
    callbacks(argv[1]);
    EXPECT_OK(memplug_host_manager_destroy(e.m));
    printf("bad_input: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
