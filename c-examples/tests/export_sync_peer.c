/*
 * export_sync_peer.c: more of C API 1.1 through memplug_host.h, against the
 * reference CPU plugin (plugin ABI 1.2):
 *
 *   1. Typed export of shared prefixes: a prefix made by a binding of one
 *      pool (export kinds MEMFD) exported as a MEMPLUG_HANDLE_MEMFD
 *      (memplug_host_prefix_export_handle; the fd is the caller's),
 *      imported by a binding of another pool
 *      (memplug_host_binding_import_prefix), mapped into a region: the same
 *      bytes. Each pool charged once, both back to 0 once released. An
 *      unoffered kind is UNSUPPORTED; malformed kinds and handles
 *      INVALID_ARGUMENT; nothing written on failure.
 *   2. memplug_host_stream_wait_fence: a stream ordered behind another
 *      stream's fence does not complete while the first stream is held,
 *      and does once it is released. A runtime (callback) fence is refused.
 *   3. memplug_host_mechanism_can_access_peer and
 *      memplug_host_region_set_peer_access: the CPU plugin has no peer
 *      access (no MEMPLUG_CAP_PEER_ACCESS): UNSUPPORTED, saying so.
 *      memplug_host_region_grow_on: without MEMPLUG_CAP_QUEUED_BINDING
 *      UNSUPPORTED, the region's figures, the pool's charge and the
 *      out-fence unchanged (with it: charged at once, the fence
 *      completes). memplug_host_stream_adopt_typed: the CPU
 *      plugin adopts no native stream: UNSUPPORTED, nothing written.
 *
 *   export_sync_peer PATH/TO/libmemplug_plugin_cpu.so
 *
 * Built with -Wall -Wextra -Wpedantic -Werror (C99); also run under
 * AddressSanitizer + UndefinedBehaviorSanitizer. Prints "N passed, N
 * failed" and exits non-zero on any failure.
 */
#define _POSIX_C_SOURCE 200809L

#include "memplug_host.h"

#include "expect.h"
#include "gate.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#define STATIC_CHECK(name, cond) typedef char name[(cond) ? 1 : -1]
STATIC_CHECK(handle_size, sizeof(MemplugHostHandle) == MEMPLUG_HOST_HANDLE_SIZE_1_1);
STATIC_CHECK(handle_like_the_abi, sizeof(MemplugHostHandle) == sizeof(MemplugHandle));
STATIC_CHECK(handle_blob, offsetof(MemplugHostHandle, blob) == offsetof(MemplugHandle, blob));

static MemplugHostHandle empty_handle(void) {
    MemplugHostHandle h;
    memset(&h, 0, sizeof h);
    h.struct_size = sizeof h;
    h.fd = -1;
    return h;
}

static uint64_t used(MemplugHostPool p) {
    MemplugHostPoolStats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_OK(memplug_host_pool_stats(p, &s));
    return s.used;
}

static uint8_t pattern(uint64_t i) { return (uint8_t)((i % 251u) ^ 0x5au); }

static void fill(void *userdata, uint64_t addr, uint64_t len) {
    uint8_t *p = (uint8_t *)(uintptr_t)addr;
    uint64_t i;
    (void)userdata;
    for (i = 0; i < len; i++) p[i] = pattern(i);
}

static MemplugHostBinding make_binding(MemplugHostManager m, MemplugHostMechanism mech, MemplugHostPool p,
                               uint32_t export_types) {
    MemplugHostBindingOptions o;
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.alloc_class = MEMPLUG_HOST_CLASS_WEIGHTS;
    o.export_types = export_types;
    EXPECT_OK(memplug_host_binding_create(m, mech, p, &o, &b));
    return b;
}

static void typed_export(MemplugHostManager m, MemplugHostMechanism mech) {
    MemplugHostPool pa = MEMPLUG_HOST_NULL_HANDLE_INIT, pb = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding ba, bb;
    MemplugHostPrefix prefix = MEMPLUG_HOST_NULL_HANDLE_INIT, imported = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPrefix none = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPrefixInfo pi;
    MemplugHostRegionInfo ri;
    MemplugHostHandle h = empty_handle(), h2 = empty_handle(), bad = empty_handle(), zero = empty_handle();
    const uint8_t *bytes;
    uint64_t len, i;
    int same = 1;

    EXPECT_OK(memplug_host_pool_create(m, "exporter", 64u << 20, &pa));
    EXPECT_OK(memplug_host_pool_create(m, "importer", 64u << 20, &pb));
    ba = make_binding(m, mech, pa, MEMPLUG_HANDLE_MEMFD);
    bb = make_binding(m, mech, pb, 0);
    EXPECT_OK(memplug_host_prefix_create(ba, 8192, fill, NULL, &prefix));
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    EXPECT_OK(memplug_host_prefix_info(prefix, &pi));
    len = pi.len;
    EXPECT(len >= 8192 && pi.charged == len);
    EXPECT(used(pa) == len && used(pb) == 0);

    EXPECT_OK(memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD, &h));
    EXPECT(h.struct_size == MEMPLUG_HOST_HANDLE_SIZE_1_1 && h.kind == MEMPLUG_HANDLE_MEMFD && h.fd > 2);
    EXPECT(used(pa) == len);

    EXPECT_OK(memplug_host_binding_import_prefix(bb, &h, len, &imported));
    EXPECT(used(pa) == len && used(pb) == len);
    /* The fd is the caller's: closing it leaves the import alone. */
    EXPECT(close(h.fd) == 0);

    EXPECT_OK(memplug_host_region_reserve(bb, 4 * len, &r));
    EXPECT_OK(memplug_host_region_map_prefix(r, imported));
    memset(&ri, 0, sizeof ri);
    ri.struct_size = sizeof ri;
    EXPECT_OK(memplug_host_region_info(r, &ri));
    EXPECT(ri.prefix_len == len);
    bytes = (const uint8_t *)(uintptr_t)ri.addr;
    for (i = 0; i < len; i++) {
        if (bytes[i] != pattern(i)) same = 0;
    }
    EXPECT(same);
    EXPECT(used(pa) == len && used(pb) == len);

    /* An unoffered kind; malformed ones; nothing written. */
    EXPECT_STATUS(memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_DMABUF_FD, &h2),
                  MEMPLUG_HOST_STATUS_UNSUPPORTED);
    EXPECT(h2.kind == 0 && h2.fd == -1);
    EXPECT_STATUS(memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD | MEMPLUG_HANDLE_DMABUF_FD, &h2),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not one MEMPLUG_HANDLE_* bit");
    EXPECT_STATUS(memplug_host_prefix_export_handle(prefix, 0, &h2), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    h2.struct_size = 16;
    EXPECT_STATUS(memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD, &h2),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("struct_size is 16");
    EXPECT(h2.fd == -1);
    h2 = empty_handle();
    EXPECT_STATUS(memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD, NULL),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    bad.kind = MEMPLUG_HANDLE_MEMFD;
    EXPECT_STATUS(memplug_host_binding_import_prefix(bb, &bad, len, &none), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    bad.kind = MEMPLUG_HANDLE_VENDOR_BLOB;
    bad.blob_len = MEMPLUG_HANDLE_BLOB_MAX + 1;
    EXPECT_STATUS(memplug_host_binding_import_prefix(bb, &bad, len, &none), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_binding_import_prefix(bb, &zero, len, &none), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_binding_import_prefix(bb, NULL, len, &none), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT(none.id == 0);
    EXPECT(used(pa) == len && used(pb) == len);

    /* Each pool refunded once. */
    EXPECT_OK(memplug_host_region_free(r));
    EXPECT_OK(memplug_host_prefix_release(imported));
    EXPECT(used(pa) == len && used(pb) == 0);
    EXPECT_OK(memplug_host_prefix_release(prefix));
    EXPECT(used(pa) == 0 && used(pb) == 0);
    EXPECT_STATUS(memplug_host_prefix_export_handle(prefix, MEMPLUG_HANDLE_MEMFD, &h2),
                  MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_binding_destroy(ba));
    EXPECT_OK(memplug_host_binding_destroy(bb));
    EXPECT_OK(memplug_host_pool_release(pa));
    EXPECT_OK(memplug_host_pool_release(pb));
}

static bool always(void *userdata) {
    (void)userdata;
    return true;
}

static void stream_wait(MemplugHostManager m, MemplugHostMechanism mech) {
    MemplugHostStream a = MEMPLUG_HOST_NULL_HANDLE_INIT, b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence fa = MEMPLUG_HOST_NULL_HANDLE_INIT, fb = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence rf = MEMPLUG_HOST_NULL_HANDLE_INIT, zero = MEMPLUG_HOST_NULL_HANDLE_INIT;
    struct gate g;
    struct timespec pause = {0, 20 * 1000 * 1000};
    bool done = true;

    gate_init(&g);
    EXPECT_OK(memplug_host_stream_create(mech, &a));
    EXPECT_OK(memplug_host_stream_create(mech, &b));
    EXPECT_OK(memplug_host_stream_enqueue(a, gate_hold, &g));
    EXPECT_OK(memplug_host_fence_record(a, &fa));
    EXPECT_OK(memplug_host_stream_wait_fence(b, fa));
    EXPECT_OK(memplug_host_fence_release(fa)); /* the wait keeps its own */
    EXPECT_OK(memplug_host_stream_enqueue(b, gate_mark, &g));
    EXPECT_OK(memplug_host_fence_record(b, &fb));

    gate_wait_entered(&g);
    nanosleep(&pause, NULL);
    EXPECT_OK(memplug_host_fence_query(fb, &done));
    EXPECT(!done);
    EXPECT(!gate_open(&g));
    EXPECT_OK(memplug_host_fence_wait(fb, 10ull * 1000 * 1000 * 1000, &done));
    EXPECT(done);
    EXPECT(gate_ran(&g));

    EXPECT_OK(memplug_host_fence_from_callbacks(m, "runtime", always, NULL, NULL, NULL, &rf));
    EXPECT_STATUS(memplug_host_stream_wait_fence(b, rf), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("memplug_host_fence_from_callbacks");
    EXPECT_STATUS(memplug_host_stream_wait_fence(b, fa), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_STATUS(memplug_host_stream_wait_fence(b, zero), MEMPLUG_HOST_STATUS_INVALID_HANDLE);

    EXPECT_OK(memplug_host_fence_release(fb));
    EXPECT_OK(memplug_host_fence_release(rf));
    EXPECT_OK(memplug_host_stream_destroy(a));
    EXPECT_OK(memplug_host_stream_destroy(b));
    gate_destroy(&g);
}

static void peer(MemplugHostManager m, MemplugHostMechanism mech) {
    MemplugHostMechanismInfo info;
    MemplugDevice cpu1;
    uint32_t access = 7;
    MemplugHostPool p = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostStream s = MEMPLUG_HOST_NULL_HANDLE_INIT, adopted = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostRegionInfo ri;
    uint64_t len, committed, charged;
    int native = 0;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_OK(memplug_host_mechanism_info(mech, &info));
    /* No peer access; queued binding is judged below (either way). */
    EXPECT((info.capabilities & MEMPLUG_CAP_PEER_ACCESS) == 0);
    cpu1.kind = MEMPLUG_DEVICE_CPU;
    cpu1.ordinal = 1;
    EXPECT_STATUS(memplug_host_mechanism_can_access_peer(mech, cpu1, &access), MEMPLUG_HOST_STATUS_UNSUPPORTED);
    EXPECT_MESSAGE("no peer access (MEMPLUG_CAP_PEER_ACCESS");
    EXPECT(access == 7);
    EXPECT_STATUS(memplug_host_mechanism_can_access_peer(mech, cpu1, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);

    /* A region's range: no peer access, no queued grow; nothing changes. */
    EXPECT_OK(memplug_host_pool_create(m, "peer", 64u << 20, &p));
    b = make_binding(m, mech, p, 0);
    EXPECT_OK(memplug_host_region_reserve(b, 1u << 20, &r));
    EXPECT_OK(memplug_host_region_grow(r, 64u << 10, NULL, NULL));
    memset(&ri, 0, sizeof ri);
    ri.struct_size = sizeof ri;
    EXPECT_OK(memplug_host_region_info(r, &ri));
    len = ri.len;
    committed = ri.committed;
    charged = used(p);
    EXPECT(len >= (64u << 10) && committed == len && charged == len);
    EXPECT_STATUS(memplug_host_region_set_peer_access(r, 0, 4096, cpu1, MEMPLUG_ACCESS_READ),
                  MEMPLUG_HOST_STATUS_UNSUPPORTED);
    EXPECT_MESSAGE("no peer access (MEMPLUG_CAP_PEER_ACCESS");
    EXPECT_STATUS(memplug_host_region_set_peer_access(r, 0, 4096, cpu1, MEMPLUG_ACCESS_WRITE),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("access 0x2 is not 0");
    EXPECT_OK(memplug_host_stream_create(mech, &s));
    EXPECT_STATUS(memplug_host_region_grow_on(r, 1u << 20, s, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    f.id = 0xdead;
    if ((info.capabilities & MEMPLUG_CAP_QUEUED_BINDING) == 0) {
        EXPECT_STATUS(memplug_host_region_grow_on(r, 1u << 20, s, &f), MEMPLUG_HOST_STATUS_UNSUPPORTED);
        EXPECT_MESSAGE("no queued binding (MEMPLUG_CAP_QUEUED_BINDING");
        EXPECT(f.id == 0xdead);
    } else {
        /* A CPU plugin that queues its commits: charged at once, the
         * fence completes. */
        bool complete = false;
        EXPECT_OK(memplug_host_region_grow_on(r, 1u << 20, s, &f));
        EXPECT_OK(memplug_host_fence_wait(f, 10ull * 1000 * 1000 * 1000, &complete));
        EXPECT(complete);
        EXPECT_OK(memplug_host_fence_release(f));
        len = committed = charged = 1u << 20;
    }
    memset(&ri, 0, sizeof ri);
    ri.struct_size = sizeof ri;
    EXPECT_OK(memplug_host_region_info(r, &ri));
    EXPECT(ri.len == len && ri.committed == committed);
    EXPECT(used(p) == charged);

    /* Typed adoption of a native stream: not offered by the CPU plugin. */
    EXPECT_STATUS(memplug_host_stream_adopt_typed(mech, MEMPLUG_DEVICE_CUDA, &native, &adopted),
                  MEMPLUG_HOST_STATUS_UNSUPPORTED);
    EXPECT_MESSAGE("stream_adopt_typed");
    EXPECT(adopted.id == 0);
    EXPECT_STATUS(memplug_host_stream_adopt_typed(mech, MEMPLUG_DEVICE_CUDA, &native, NULL),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);

    EXPECT_OK(memplug_host_stream_destroy(s));
    EXPECT_OK(memplug_host_region_free(r));
    EXPECT_OK(memplug_host_manager_poll(m, NULL)); /* a free behind a queued commit's fence */
    EXPECT(used(p) == 0);
    EXPECT_OK(memplug_host_binding_destroy(b));
    EXPECT_OK(memplug_host_pool_release(p));
}

int main(int argc, char **argv) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    EXPECT_OK(MEMPLUG_HOST_CHECK_API());
    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, argv[1]));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &mech));
    if (failed == 0) {
        typed_export(m, mech);
        stream_wait(m, mech);
        peer(m, mech);
    }
    EXPECT_OK(memplug_host_mechanism_release(mech));
    EXPECT_OK(memplug_host_manager_destroy(m));
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
