/*
 * offload.c: offload/restore at the same address and copy-on-write of a
 * shared prefix through the host C API (C API 1.3) on the reference CPU
 * plugin: a region's bytes moved to a host pool and back with the address,
 * the bytes and both pools' use exact; the restore's fence really after
 * the copies (held behind a host function) and usable by another stream;
 * the last granule of a prefix privatised in one region while another
 * keeps reading the shared bytes, then offloaded and restored with it;
 * and every refusal (wrong, stale, zero and other-manager handles, NULL
 * and short outs, already offloaded, not offloaded, unaligned or repeated
 * privatise, no room in either pool, work not done in time, a stream of
 * another mechanism) leaving the region, its bytes and the pools as they
 * were.
 *
 *   offload PATH/TO/libmemplug_plugin_cpu.so
 *
 * Built with -Wall -Wextra -Wpedantic -Werror (C99); also run under
 * AddressSanitizer + UndefinedBehaviorSanitizer and valgrind. Prints
 * "N passed, N failed" and exits non-zero on any failure.
 */
#define _POSIX_C_SOURCE 200809L

#include "memplug_host.h"

#include "expect.h"
#include "gate.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define WAIT_NS (10ull * 1000 * 1000 * 1000)
#define MIB (1024u * 1024u)

struct env {
    MemplugHostManager m;
    MemplugHostMechanism mech;
    MemplugHostPool dev_pool, host_pool;
    MemplugHostBinding dev, host;
    MemplugHostStream s;
    uint64_t g; /* the granularity */
};

static uint8_t byte_at(uint64_t i, uint8_t seed) { return (uint8_t)((i * 31u + seed) & 0xffu); }

static void fill(uint64_t addr, uint64_t len, uint8_t seed) {
    uint8_t *p = (uint8_t *)(uintptr_t)addr;
    uint64_t i;
    for (i = 0; i < len; i++) p[i] = byte_at(i, seed);
}

static int holds(uint64_t addr, uint64_t len, uint8_t seed) {
    const uint8_t *p = (const uint8_t *)(uintptr_t)addr;
    uint64_t i;
    for (i = 0; i < len; i++) {
        if (p[i] != byte_at(i, seed)) return 0;
    }
    return 1;
}

static MemplugHostResidence residence(MemplugHostRegion r) {
    MemplugHostResidence out;
    memset(&out, 0xee, sizeof out);
    out.struct_size = sizeof out;
    expect_status(memplug_host_region_residence(r, &out), MEMPLUG_HOST_STATUS_OK, "memplug_host_region_residence",
                  __LINE__);
    return out;
}

static int on_device(MemplugHostRegion r) {
    MemplugHostResidence where = residence(r);
    return where.kind == MEMPLUG_HOST_RESIDENCE_DEVICE && where.host_addr == 0 && where.host_bytes == 0;
}

static uint64_t region_addr(MemplugHostRegion r) {
    MemplugHostRegionInfo info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    expect_status(memplug_host_region_info(r, &info), MEMPLUG_HOST_STATUS_OK, "memplug_host_region_info", __LINE__);
    return info.addr;
}

/* A report the library has not written: every field a sentinel. */
static MemplugHostOffloadReport unwritten_report(void) {
    MemplugHostOffloadReport r;
    r.struct_size = sizeof r;
    r.ranges_kept = 99;
    r.released = 99;
    r.kept = 99;
    return r;
}

static int untouched(const MemplugHostOffloadReport *r) {
    return r->ranges_kept == 99 && r->released == 99 && r->kept == 99;
}

static int waited(MemplugHostFence f) {
    bool done = false;
    expect_status(memplug_host_fence_wait(f, WAIT_NS, &done), MEMPLUG_HOST_STATUS_OK, "memplug_host_fence_wait",
                  __LINE__);
    return done ? 1 : 0;
}

static void poll_frees(const struct env *e) { EXPECT_OK(memplug_host_manager_poll(e->m, NULL)); }

/* ---- a round trip ----------------------------------------------------------- */

static void round_trip(const struct env *e) {
    const uint64_t g = e->g;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostOffloadReport rep = unwritten_report(), again = unwritten_report();
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT, none = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostResidence where;
    uint64_t base;

    EXPECT_OK(memplug_host_region_reserve(e->dev, 64 * g, &r));
    EXPECT_OK(memplug_host_region_grow(r, 5 * g, NULL, NULL));
    base = region_addr(r);
    fill(base, 5 * g, 7);
    EXPECT(on_device(r));

    EXPECT_OK(memplug_host_region_offload(r, e->host, e->s, WAIT_NS, &rep));
    EXPECT(rep.struct_size == sizeof rep && rep.released == 5 * g && rep.kept == 0 && rep.ranges_kept == 0);
    EXPECT(pool_used(e->dev_pool) == 0);
    EXPECT(pool_used(e->host_pool) == 5 * g);
    where = residence(r);
    EXPECT(where.kind == MEMPLUG_HOST_RESIDENCE_HOST && where.host_bytes == 5 * g && where.host_addr != 0);
    if (where.kind == MEMPLUG_HOST_RESIDENCE_HOST && where.host_addr != 0) EXPECT(holds(where.host_addr, 5 * g, 7));
    EXPECT(region_addr(r) == base);

    /* Nothing that would touch the device range while it is offloaded. */
    EXPECT_STATUS(memplug_host_region_offload(r, e->host, e->s, WAIT_NS, &again), MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT_MESSAGE("already offloaded");
    EXPECT(untouched(&again));
    EXPECT_STATUS(memplug_host_region_grow(r, 8 * g, NULL, NULL), MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT_MESSAGE("offloaded");
    EXPECT_STATUS(memplug_host_region_shrink(r, g, NULL, 0), MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT_STATUS(memplug_host_region_privatise(r, 0, g, e->s, WAIT_NS, &f), MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT(f.id == 0);
    EXPECT(pool_used(e->dev_pool) == 0 && pool_used(e->host_pool) == 5 * g);
    EXPECT(residence(r).host_bytes == 5 * g);

    EXPECT_OK(memplug_host_region_restore(r, e->s, &f));
    EXPECT(f.id != 0);
    EXPECT(waited(f));
    EXPECT(region_addr(r) == base);
    EXPECT(on_device(r));
    EXPECT(holds(base, 5 * g, 7));
    EXPECT(pool_used(e->dev_pool) == 5 * g);
    poll_frees(e);
    EXPECT(pool_used(e->host_pool) == 0);

    EXPECT_STATUS(memplug_host_region_restore(r, e->s, &none), MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT_MESSAGE("not offloaded");
    EXPECT(none.id == 0);
    EXPECT(pool_used(e->dev_pool) == 5 * g);

    /* The region works as before and goes away exactly. */
    EXPECT_OK(memplug_host_region_grow(r, 6 * g, NULL, NULL));
    EXPECT_OK(memplug_host_fence_release(f));
    EXPECT_OK(memplug_host_region_free(r));
    poll_frees(e);
    EXPECT(pool_used(e->dev_pool) == 0 && pool_used(e->host_pool) == 0);
}

/* An offloaded region freed frees its host copy. */
static void free_offloaded(const struct env *e) {
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostOffloadReport rep = unwritten_report();
    EXPECT_OK(memplug_host_region_reserve(e->dev, 8 * e->g, &r));
    EXPECT_OK(memplug_host_region_grow(r, 3 * e->g, NULL, NULL));
    EXPECT_OK(memplug_host_region_offload(r, e->host, e->s, WAIT_NS, &rep));
    EXPECT(pool_used(e->host_pool) == 3 * e->g);
    EXPECT_OK(memplug_host_region_free(r));
    poll_frees(e);
    EXPECT(pool_used(e->dev_pool) == 0 && pool_used(e->host_pool) == 0);
}

/* ---- the restore's fence ---------------------------------------------------- */

static void restore_fence(const struct env *e) {
    const uint64_t g = e->g;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostStream other = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostOffloadReport rep = unwritten_report();
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT, after = MEMPLUG_HOST_NULL_HANDLE_INIT;
    struct timespec pause = {0, 20 * 1000 * 1000};
    struct gate gt;
    bool done = true;
    uint64_t base;

    gate_init(&gt);
    EXPECT_OK(memplug_host_stream_create(e->mech, &other));
    EXPECT_OK(memplug_host_region_reserve(e->dev, 8 * g, &r));
    EXPECT_OK(memplug_host_region_grow(r, 2 * g, NULL, NULL));
    base = region_addr(r);
    fill(base, 2 * g, 3);
    EXPECT_OK(memplug_host_region_offload(r, e->host, e->s, WAIT_NS, &rep));

    /* The copies back queue behind a host function that holds the stream. */
    EXPECT_OK(memplug_host_stream_enqueue(e->s, gate_hold, &gt));
    EXPECT_OK(memplug_host_region_restore(r, e->s, &f));
    EXPECT_OK(memplug_host_stream_wait_fence(other, f));
    EXPECT_OK(memplug_host_stream_enqueue(other, gate_mark, &gt));
    EXPECT_OK(memplug_host_fence_record(other, &after));
    gate_wait_entered(&gt);
    nanosleep(&pause, NULL);
    EXPECT_OK(memplug_host_fence_query(f, &done));
    EXPECT(!done);
    /* Recommitted and charged, not yet copied; the host copy stays. */
    EXPECT(!holds(base, g, 3));
    EXPECT(pool_used(e->dev_pool) == 2 * g);
    poll_frees(e);
    EXPECT(pool_used(e->host_pool) == 2 * g);
    EXPECT(!gate_open(&gt));

    EXPECT(waited(f));
    EXPECT(holds(base, 2 * g, 3));
    EXPECT(waited(after));
    EXPECT(gate_ran(&gt));
    poll_frees(e);
    EXPECT(pool_used(e->host_pool) == 0);

    EXPECT_OK(memplug_host_fence_release(f));
    EXPECT_OK(memplug_host_fence_release(after));
    EXPECT_OK(memplug_host_stream_destroy(other));
    EXPECT_OK(memplug_host_region_free(r));
    poll_frees(e);
    EXPECT(pool_used(e->dev_pool) == 0);
    gate_destroy(&gt);
}

/* ---- copy-on-write ---------------------------------------------------------- */

static void fill_prefix(void *userdata, uint64_t addr, uint64_t len) {
    (void)userdata;
    fill(addr, len, 9);
}

static void privatise(const struct env *e) {
    const uint64_t g = e->g;
    MemplugHostPrefix p = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion a = MEMPLUG_HOST_NULL_HANDLE_INIT, b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion plain = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT, none = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostOffloadReport rep = unwritten_report();
    uint64_t aa, ba;
    size_t i;
    /* (offset, len) refused as INVALID_ARGUMENT: unaligned, empty, past
     * the prefix, across it. */
    const uint64_t bad[4][2] = {{1, g}, {0, 0}, {4 * g, g}, {2 * g, 3 * g}};

    EXPECT_OK(memplug_host_prefix_create(e->dev, 4 * g, fill_prefix, NULL, &p));
    EXPECT_OK(memplug_host_region_reserve(e->dev, 16 * g, &a));
    EXPECT_OK(memplug_host_region_reserve(e->dev, 16 * g, &b));
    EXPECT_OK(memplug_host_region_map_prefix(a, p));
    EXPECT_OK(memplug_host_region_map_prefix(b, p));
    EXPECT_OK(memplug_host_prefix_release(p)); /* the regions keep it */
    aa = region_addr(a);
    ba = region_addr(b);
    EXPECT(pool_used(e->dev_pool) == 4 * g);

    /* The prefix's last block, private to `a`. */
    EXPECT_OK(memplug_host_region_privatise(a, 3 * g, g, e->s, WAIT_NS, &f));
    EXPECT(waited(f));
    EXPECT(pool_used(e->dev_pool) == 5 * g); /* the prefix once, the copy once */
    EXPECT(holds(aa, 4 * g, 9));
    fill(aa + 3 * g, g, 42);
    EXPECT(holds(aa + 3 * g, g, 42));
    EXPECT(holds(ba, 4 * g, 9)); /* the other region reads the shared bytes */
    EXPECT(holds(aa, 3 * g, 9));
    EXPECT(on_device(a));

    /* Refusals: nothing charged, no fence handed out. */
    EXPECT_STATUS(memplug_host_region_privatise(a, 3 * g, g, e->s, WAIT_NS, &none), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("already private");
    for (i = 0; i < 4; i++) {
        EXPECT_STATUS(memplug_host_region_privatise(a, bad[i][0], bad[i][1], e->s, WAIT_NS, &none),
                      MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    }
    EXPECT_STATUS(memplug_host_region_privatise(a, 0, g, e->s, WAIT_NS, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_OK(memplug_host_region_reserve(e->dev, 4 * g, &plain));
    EXPECT_STATUS(memplug_host_region_privatise(plain, 0, g, e->s, WAIT_NS, &none), MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT_MESSAGE("no shared prefix");
    EXPECT(none.id == 0);
    EXPECT(pool_used(e->dev_pool) == 5 * g);
    EXPECT(holds(aa + 3 * g, g, 42) && holds(ba, 4 * g, 9) && holds(aa, 3 * g, 9));

    /* The private block goes to host memory and back; the prefix stays. */
    EXPECT_OK(memplug_host_region_offload(a, e->host, e->s, WAIT_NS, &rep));
    EXPECT(rep.released == g && rep.kept == 0);
    EXPECT(pool_used(e->dev_pool) == 4 * g);
    EXPECT(residence(a).host_bytes == g);
    EXPECT(holds(ba, 4 * g, 9));
    EXPECT_OK(memplug_host_fence_release(f));
    EXPECT_OK(memplug_host_region_restore(a, e->s, &f));
    EXPECT(waited(f));
    EXPECT(holds(aa + 3 * g, g, 42) && holds(aa, 3 * g, 9));
    EXPECT(pool_used(e->dev_pool) == 5 * g);

    EXPECT_OK(memplug_host_fence_release(f));
    EXPECT_OK(memplug_host_region_free(plain));
    EXPECT_OK(memplug_host_region_free(a));
    EXPECT_OK(memplug_host_region_free(b));
    poll_frees(e);
    EXPECT(pool_used(e->dev_pool) == 0 && pool_used(e->host_pool) == 0);
}

/* ---- refusals --------------------------------------------------------------- */

/* The region still on the device with its bytes, both pools as given. */
static void unchanged(const struct env *e, MemplugHostRegion r, uint64_t len, uint8_t seed, int line) {
    expect_true(on_device(r), "the region is still on the device", line);
    expect_true(holds(region_addr(r), len, seed), "the region's bytes are intact", line);
    expect_true(pool_used(e->dev_pool) == len, "the device pool's use is unchanged", line);
    expect_true(pool_used(e->host_pool) == 0, "the host pool's use is unchanged", line);
}
#define UNCHANGED(r, len, seed) unchanged(e, (r), (len), (seed), __LINE__)

static void bad_handles(const struct env *e, const char *plugin) {
    const uint64_t g = e->g;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT, gone = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion zero = MEMPLUG_HOST_NULL_HANDLE_INIT, as_region;
    MemplugHostBinding as_binding;
    MemplugHostStream as_stream, dead = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostStream foreign = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostManager m2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostOffloadReport rep = unwritten_report();
    MemplugHostResidence where;
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT;

    EXPECT_OK(memplug_host_region_reserve(e->dev, 8 * g, &r));
    EXPECT_OK(memplug_host_region_grow(r, 2 * g, NULL, NULL));
    fill(region_addr(r), 2 * g, 5);
    as_region.id = e->host.id;
    as_binding.id = r.id;
    as_stream.id = e->host.id;

    /* Wrong kinds and the zero handle. */
    EXPECT_STATUS(memplug_host_region_offload(as_region, e->host, e->s, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_STATUS(memplug_host_region_offload(r, as_binding, e->s, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_MESSAGE("not a valid binding handle");
    EXPECT_STATUS(memplug_host_region_offload(r, e->host, as_stream, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_STATUS(memplug_host_region_offload(zero, e->host, e->s, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_STATUS(memplug_host_region_restore(as_region, e->s, &f), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_STATUS(memplug_host_region_restore(r, as_stream, &f), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_STATUS(memplug_host_region_privatise(r, 0, g, as_stream, WAIT_NS, &f), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_STATUS(memplug_host_region_residence(as_region, &where), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT(untouched(&rep) && f.id == 0);
    UNCHANGED(r, 2 * g, 5);

    /* NULL and short outs. */
    EXPECT_STATUS(memplug_host_region_offload(r, e->host, e->s, WAIT_NS, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    rep.struct_size = 4;
    EXPECT_STATUS(memplug_host_region_offload(r, e->host, e->s, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("struct_size");
    rep.struct_size = sizeof rep;
    EXPECT(untouched(&rep));
    EXPECT_STATUS(memplug_host_region_restore(r, e->s, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_region_residence(r, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    memset(&where, 0xee, sizeof where);
    where.struct_size = 4;
    EXPECT_STATUS(memplug_host_region_residence(r, &where), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT(where.host_bytes == 0xeeeeeeeeeeeeeeeeull);
    UNCHANGED(r, 2 * g, 5);

    /* Stale handles: a freed region, a destroyed stream. */
    EXPECT_OK(memplug_host_region_reserve(e->dev, 8 * g, &gone));
    EXPECT_OK(memplug_host_region_free(gone));
    EXPECT_STATUS(memplug_host_region_offload(gone, e->host, e->s, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_STATUS(memplug_host_region_residence(gone, &where), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_stream_create(e->mech, &dead));
    EXPECT_OK(memplug_host_stream_destroy(dead));
    EXPECT_STATUS(memplug_host_region_offload(r, e->host, dead, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_STATUS(memplug_host_region_privatise(r, 0, g, dead, WAIT_NS, &f), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT(untouched(&rep) && f.id == 0);
    UNCHANGED(r, 2 * g, 5);

    /* A stream of another manager. */
    EXPECT_OK(memplug_host_manager_create(&m2));
    EXPECT_OK(memplug_host_manager_load_plugin(m2, plugin));
    EXPECT_OK(memplug_host_manager_find_mechanism(m2, "memplug-cpu/cpu", &mech2));
    EXPECT_OK(memplug_host_stream_create(mech2, &foreign));
    EXPECT_STATUS(memplug_host_region_offload(r, e->host, foreign, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_WRONG_MANAGER);
    EXPECT_STATUS(memplug_host_region_privatise(r, 0, g, foreign, WAIT_NS, &f), MEMPLUG_HOST_STATUS_WRONG_MANAGER);
    EXPECT(untouched(&rep) && f.id == 0);
    UNCHANGED(r, 2 * g, 5);
    EXPECT_OK(memplug_host_stream_destroy(foreign));
    EXPECT_OK(memplug_host_manager_destroy(m2));

    EXPECT_OK(memplug_host_region_free(r));
    poll_frees(e);
}

static void no_room_and_busy(const struct env *e) {
    const uint64_t g = e->g;
    MemplugHostPool tiny = MEMPLUG_HOST_NULL_HANDLE_INIT, small = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding tiny_host = MEMPLUG_HOST_NULL_HANDLE_INIT, small_dev = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT, s2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation squat = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostOffloadReport rep = unwritten_report();
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT, late = MEMPLUG_HOST_NULL_HANDLE_INIT;
    struct hand_fence hf = {0};
    MemplugHostResidence where;
    uint64_t addr;

    /* A host pool without room for the copy. */
    EXPECT_OK(memplug_host_pool_create(e->m, "tiny-host", g, &tiny));
    EXPECT_OK(memplug_host_binding_create(e->m, e->mech, tiny, NULL, &tiny_host));
    EXPECT_OK(memplug_host_region_reserve(e->dev, 8 * g, &r));
    EXPECT_OK(memplug_host_region_grow(r, 3 * g, NULL, NULL));
    fill(region_addr(r), 3 * g, 1);
    EXPECT_STATUS(memplug_host_region_offload(r, tiny_host, e->s, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    EXPECT(untouched(&rep));
    EXPECT(pool_used(tiny) == 0);
    UNCHANGED(r, 3 * g, 1);

    /* Work on the region not done in time: BUSY, then fine once done. */
    EXPECT_OK(memplug_host_fence_from_callbacks(e->m, "kernel", hand_fence_query, hand_fence_wait, NULL, &hf, &late));
    EXPECT_OK(memplug_host_region_grow(r, 4 * g, NULL, NULL));
    fill(region_addr(r), 4 * g, 1);
    EXPECT_OK(memplug_host_region_shrink(r, 3 * g, &late, 1)); /* the tail waits for `late` */
    EXPECT_STATUS(memplug_host_region_offload(r, e->host, e->s, 1000 * 1000, &rep), MEMPLUG_HOST_STATUS_BUSY);
    EXPECT_MESSAGE("did not complete");
    EXPECT(untouched(&rep));
    EXPECT(on_device(r) && holds(region_addr(r), 3 * g, 1));
    EXPECT(pool_used(e->dev_pool) == 4 * g && pool_used(e->host_pool) == 0);
    hf.done = 1;
    poll_frees(e);
    UNCHANGED(r, 3 * g, 1);

    /* A device pool without room for the restore: stays offloaded. */
    EXPECT_OK(memplug_host_pool_create(e->m, "small-dev", 4 * g, &small));
    EXPECT_OK(memplug_host_binding_create(e->m, e->mech, small, NULL, &small_dev));
    EXPECT_OK(memplug_host_region_reserve(small_dev, 8 * g, &s2));
    EXPECT_OK(memplug_host_region_grow(s2, 3 * g, NULL, NULL));
    addr = region_addr(s2);
    fill(addr, 3 * g, 8);
    EXPECT_OK(memplug_host_region_offload(s2, e->host, e->s, WAIT_NS, &rep));
    EXPECT_OK(memplug_host_allocate(small_dev, 2 * g, 64, &squat, NULL));
    EXPECT_STATUS(memplug_host_region_restore(s2, e->s, &f), MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    EXPECT(f.id == 0);
    where = residence(s2);
    EXPECT(where.kind == MEMPLUG_HOST_RESIDENCE_HOST && where.host_bytes == 3 * g);
    if (where.host_addr != 0) EXPECT(holds(where.host_addr, 3 * g, 8));
    EXPECT(pool_used(small) == 2 * g && pool_used(e->host_pool) == 3 * g);
    EXPECT_OK(memplug_host_allocation_free(squat));
    EXPECT_OK(memplug_host_region_restore(s2, e->s, &f));
    EXPECT(waited(f));
    EXPECT(region_addr(s2) == addr && holds(addr, 3 * g, 8));
    EXPECT(pool_used(small) == 3 * g);

    EXPECT_OK(memplug_host_fence_release(f));
    EXPECT_OK(memplug_host_fence_release(late));
    EXPECT_OK(memplug_host_region_free(s2));
    EXPECT_OK(memplug_host_region_free(r));
    poll_frees(e);
    EXPECT(pool_used(e->dev_pool) == 0 && pool_used(e->host_pool) == 0 && pool_used(small) == 0);
    EXPECT_OK(memplug_host_binding_destroy(small_dev));
    EXPECT_OK(memplug_host_binding_destroy(tiny_host));
    EXPECT_OK(memplug_host_pool_release(small));
    EXPECT_OK(memplug_host_pool_release(tiny));
}

/* A second mechanism of the plugin (a NUMA node's, where the machine has
 * one): its memory as the offload's target works; its stream is refused
 * by offload and restore with nothing changed. */
static void other_mechanism(const struct env *e) {
    const uint64_t g = e->g;
    MemplugHostMechanism node = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool node_pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding node_host = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostStream ns = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostOffloadReport rep = unwritten_report();
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostResidence where;

    if (memplug_host_manager_find_mechanism(e->m, "memplug-cpu/cpu-node0", &node) != MEMPLUG_HOST_STATUS_OK) {
        printf("skipped: no memplug-cpu/cpu-node0 mechanism on this machine (other_mechanism)\n");
        return;
    }
    EXPECT_OK(memplug_host_pool_create(e->m, "node-host", 16 * MIB, &node_pool));
    EXPECT_OK(memplug_host_binding_create(e->m, node, node_pool, NULL, &node_host));
    EXPECT_OK(memplug_host_stream_create(node, &ns));
    EXPECT_OK(memplug_host_region_reserve(e->dev, 8 * g, &r));
    EXPECT_OK(memplug_host_region_grow(r, 2 * g, NULL, NULL));
    fill(region_addr(r), 2 * g, 4);

    EXPECT_STATUS(memplug_host_region_offload(r, e->host, ns, WAIT_NS, &rep), MEMPLUG_HOST_STATUS_WRONG_MECHANISM);
    EXPECT(untouched(&rep));
    UNCHANGED(r, 2 * g, 4);

    EXPECT_OK(memplug_host_region_offload(r, node_host, e->s, WAIT_NS, &rep));
    EXPECT(rep.released == 2 * g);
    EXPECT(pool_used(node_pool) == 2 * g && pool_used(e->dev_pool) == 0);
    EXPECT_STATUS(memplug_host_region_restore(r, ns, &f), MEMPLUG_HOST_STATUS_WRONG_MECHANISM);
    EXPECT(f.id == 0);
    where = residence(r);
    EXPECT(where.kind == MEMPLUG_HOST_RESIDENCE_HOST && where.host_bytes == 2 * g);
    EXPECT(pool_used(node_pool) == 2 * g && pool_used(e->dev_pool) == 0);
    EXPECT_OK(memplug_host_region_restore(r, e->s, &f));
    EXPECT(waited(f));
    poll_frees(e);
    UNCHANGED(r, 2 * g, 4);
    EXPECT(pool_used(node_pool) == 0);

    EXPECT_OK(memplug_host_fence_release(f));
    EXPECT_OK(memplug_host_region_free(r));
    EXPECT_OK(memplug_host_stream_destroy(ns));
    EXPECT_OK(memplug_host_binding_destroy(node_host));
    EXPECT_OK(memplug_host_pool_release(node_pool));
    EXPECT_OK(memplug_host_mechanism_release(node));
    poll_frees(e);
}

int main(int argc, char **argv) {
    struct env e;
    MemplugHostMechanismInfo info;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    memset(&e, 0, sizeof e);
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_OK(MEMPLUG_HOST_CHECK_API());
    EXPECT_OK(memplug_host_manager_create(&e.m));
    EXPECT_OK(memplug_host_manager_load_plugin(e.m, argv[1]));
    EXPECT_OK(memplug_host_manager_find_mechanism(e.m, "memplug-cpu/cpu", &e.mech));
    EXPECT_OK(memplug_host_mechanism_info(e.mech, &info));
    e.g = info.granularity;
    EXPECT_OK(memplug_host_pool_create(e.m, "device", 64 * MIB, &e.dev_pool));
    EXPECT_OK(memplug_host_pool_create(e.m, "host", 64 * MIB, &e.host_pool));
    EXPECT_OK(memplug_host_binding_create(e.m, e.mech, e.dev_pool, NULL, &e.dev));
    EXPECT_OK(memplug_host_binding_create(e.m, e.mech, e.host_pool, NULL, &e.host));
    EXPECT_OK(memplug_host_stream_create(e.mech, &e.s));
    if (failed == 0 && e.g != 0) {
        round_trip(&e);
        free_offloaded(&e);
        restore_fence(&e);
        privatise(&e);
        bad_handles(&e, argv[1]);
        no_room_and_busy(&e);
        other_mechanism(&e);
    }
    EXPECT_OK(memplug_host_stream_destroy(e.s));
    EXPECT_OK(memplug_host_binding_destroy(e.dev));
    EXPECT_OK(memplug_host_binding_destroy(e.host));
    EXPECT_OK(memplug_host_pool_release(e.dev_pool));
    EXPECT_OK(memplug_host_pool_release(e.host_pool));
    EXPECT_OK(memplug_host_mechanism_release(e.mech));
    EXPECT_OK(memplug_host_manager_destroy(e.m));
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
