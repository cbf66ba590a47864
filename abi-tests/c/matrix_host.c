/*
 * matrix_host.c: a memplug host frozen at a released minor, for the
 * compatibility matrix (abi-tests/tests/compat_matrix.rs).
 *
 * Compiled against a frozen header (abi-tests/frozen/1.0/memplug.h or
 * abi-tests/frozen/1.1/memplug.h), never against the current one: it is
 * what a runtime built when that minor was the newest does with any
 * plugin, old or new. HOST_MINOR is the header's MEMPLUG_ABI_MINOR. It loads
 * the plugin given on the command line (dlopen, RTLD_NOW | RTLD_LOCAL),
 * negotiates 1.0..=1.HOST_MINOR, expects the newest common minor, reads
 * every plugin struct as a prefix (min(struct_size, sizeof) into a zeroed
 * local), ignores capability bits the agreed minor does not define, and
 * runs the checks that minor allows on each mechanism (1.1: export/import
 * across descriptors, class-tagged 48-byte requests). One line per check on
 * stdout:
 *
 *     check<TAB>name<TAB>pass|fail|skip|degraded<TAB>detail
 *
 * and a last line "summary<TAB>pass|fail<TAB>...". Exit status 0 when no
 * check failed. The host info it negotiates with and the requests it sends
 * end right before a PROT_NONE page, so a plugin reading past the host's
 * struct_size (a 1.2 plugin looking for `services` in a 24-byte host info,
 * a 1.1 plugin reading a class tag from a 40-byte request) crashes the run
 * (and fails the cell) instead of going unnoticed; out-structs are followed
 * by guard bytes a plugin must not write. Neither frozen minor has host
 * services: the "services" line says so.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE 1

#include "memplug.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if MEMPLUG_ABI_MINOR > 1
#error "matrix_host.c must be compiled against a frozen header (abi-tests/frozen/1.0 or 1.1)"
#endif
#define HOST_MINOR MEMPLUG_ABI_MINOR

#define GUARD 0xA5
#define GUARD_BYTES 32

static int g_failed;
static int g_checks;
static uint64_t g_next_object_id = 1000;
/* The minor agreed with the plugin (set once negotiation succeeded). */
static uint32_t g_agreed;

/* ---- output ---- */

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static void report(const char *name, const char *outcome, const char *fmt, ...)
{
    va_list ap;

    printf("check\t%s\t%s\t", name, outcome);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    g_checks++;
    if (strcmp(outcome, "fail") == 0) {
        g_failed++;
    }
}

/* ---- the message sink: keeps the last message ---- */

struct capture {
    char text[MEMPLUG_MESSAGE_MAX + 1];
};

static void capture_write(void *ctx, const char *msg, size_t len)
{
    struct capture *c = (struct capture *)ctx;

    if (len > MEMPLUG_MESSAGE_MAX) {
        len = MEMPLUG_MESSAGE_MAX;
    }
    memcpy(c->text, msg, len);
    c->text[len] = '\0';
}

static struct capture g_capture;
static const MemplugMessageSink g_sink = {&g_capture, capture_write};

static const char *last_message(void)
{
    return g_capture.text[0] != '\0' ? g_capture.text : "(no message)";
}

static void clear_message(void)
{
    g_capture.text[0] = '\0';
}

/* ---- prefix reads of plugin structs ---- */

static int read_prefix(void *local, size_t local_size, const void *src, uint32_t size_1_0)
{
    uint32_t declared;

    memset(local, 0, local_size);
    if (src == NULL) {
        return 0;
    }
    memcpy(&declared, src, sizeof declared);
    if (declared < size_1_0) {
        return 0;
    }
    memcpy(local, src, declared < local_size ? declared : local_size);
    return 1;
}

/* ---- host-owned structs ---- */

/* The end of a read-write page followed by a PROT_NONE page: a struct
 * placed so that its last byte is the last byte before the PROT_NONE page
 * faults whoever reads past it. */
static unsigned char *fenced_page_end(void)
{
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *p = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED || mprotect(p + page, (size_t)page, PROT_NONE) != 0) {
        return NULL;
    }
    return p + page;
}

static unsigned char *g_request_end;
static unsigned char *g_host_info_end;

/* Size of the requests this host sends: 1.0's 40 bytes, or at agreed 1.1
 * the 1.1 request (48 bytes, with a class tag). */
static uint32_t request_size(void)
{
#if HOST_MINOR >= 1
    if (g_agreed >= 1) {
        return (uint32_t)sizeof(MemplugRequest);
    }
#endif
    return MEMPLUG_REQUEST_SIZE_1_0;
}

/* A request of request_size() bytes ending at the PROT_NONE page. Only the
 * fields within its struct_size are written. */
static const MemplugRequest *request(const MemplugMechanism *m, uint64_t size, uint64_t alignment)
{
    uint32_t n = request_size();
    MemplugRequest *r = (MemplugRequest *)(void *)(g_request_end - n);

    memset(r, 0, n);
    r->struct_size = n;
    r->size = size;
    r->alignment = alignment;
    r->object_id = g_next_object_id++;
    r->device = m->device;
#if HOST_MINOR >= 1
    if (n >= MEMPLUG_REQUEST_SIZE_1_1) {
        r->class_tag = MEMPLUG_CLASS_KV;
    }
#endif
    return r;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* Capability bits the agreed minor defines. */
static uint32_t known_caps(void)
{
#if HOST_MINOR >= 1
    if (g_agreed >= 1) {
        return MEMPLUG_CAP_ALL_1_1;
    }
#endif
    return MEMPLUG_CAP_ALL_1_0;
}

/* An out-block followed by guard bytes. */
struct guarded_block {
    MemplugBlock block;
    unsigned char guard[GUARD_BYTES];
};

static void guarded_init(struct guarded_block *g)
{
    memset(g, GUARD, sizeof *g);
    g->block.struct_size = sizeof(MemplugBlock);
}

static int guard_intact(const unsigned char *guard)
{
    int i;

    for (i = 0; i < GUARD_BYTES; i++) {
        if (guard[i] != GUARD) {
            return 0;
        }
    }
    return 1;
}

static MemplugObjectRef object_ref(const MemplugMechanism *m, uint64_t object_id, const MemplugBlock *b)
{
    MemplugObjectRef r;

    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.mechanism_id = m->mechanism_id;
    r.device = m->device;
    r.object_id = object_id;
    r.addr = b->addr;
    r.size = b->size;
    r.handle = b->handle;
    return r;
}

/* ---- checks ---- */

static void check_allocator(const MemplugMechanism *m, const MemplugAllocator *a, int cpu)
{
    struct guarded_block out;
    MemplugObjectRef r;
    MemplugStatus st;
    uint64_t id;

    guarded_init(&out);
    clear_message();
    id = g_next_object_id;
    st = a->allocate(m->ctx, request(m, 64, 16), &out.block, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("allocator", "fail", "allocate(64, 16) returned %u: %s", (unsigned)st, last_message());
        return;
    }
    if (out.block.addr == 0 || out.block.addr % 16 != 0 || out.block.size < 64 ||
        out.block.struct_size != sizeof(MemplugBlock)) {
        report("allocator", "fail", "allocate wrote addr %#llx size %llu struct_size %u",
               (unsigned long long)out.block.addr, (unsigned long long)out.block.size,
               (unsigned)out.block.struct_size);
        return;
    }
    if (!guard_intact(out.guard)) {
        report("structs.writes_within_size", "fail", "allocate wrote past the 1.0 MemplugBlock");
    } else {
        report("structs.writes_within_size", "pass", "nothing written past struct_size %u",
               (unsigned)sizeof(MemplugBlock));
    }
    if (cpu) {
        memset((void *)(uintptr_t)out.block.addr, 0x5A, 64);
    }
    r = object_ref(m, id, &out.block);
    st = a->deallocate(m->ctx, &r, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("allocator", "fail", "deallocate returned %u: %s", (unsigned)st, last_message());
        return;
    }
    clear_message();
    st = a->deallocate(m->ctx, &r, &g_sink);
    if (st != MEMPLUG_STATUS_UNKNOWN_ALLOCATION) {
        report("allocator", "fail", "a double free returned %u, not UNKNOWN_ALLOCATION", (unsigned)st);
        return;
    }
    report("allocator", "pass",
           "allocate/free with a %u-byte request ending at a PROT_NONE page; double free refused (%s)",
           (unsigned)request_size(), last_message());
}

static void check_virtual_backing(const MemplugMechanism *m, const MemplugVirtualBacking *v, uint64_t g, int cpu)
{
    struct guarded_block out;
    MemplugObjectRef r;
    MemplugStatus st;
    uint64_t id, committed = 0;

    guarded_init(&out);
    id = g_next_object_id;
    st = v->reserve(m->ctx, request(m, 4 * g, g), &out.block, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("virtual_backing", "fail", "reserve returned %u: %s", (unsigned)st, last_message());
        return;
    }
    r = object_ref(m, id, &out.block);
    st = v->commit(m->ctx, &r, g, g, &g_sink);
    if (st == MEMPLUG_STATUS_OK && cpu) {
        memset((void *)(uintptr_t)(r.addr + g), 0x5A, (size_t)g);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = v->committed_bytes(m->ctx, &r, &committed, &g_sink);
    }
    if (st == MEMPLUG_STATUS_OK && committed != g) {
        report("virtual_backing", "fail", "committed_bytes is %llu after committing %llu",
               (unsigned long long)committed, (unsigned long long)g);
        v->release(m->ctx, &r, &g_sink);
        return;
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = v->decommit(m->ctx, &r, g, g, &g_sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        report("virtual_backing", "fail", "commit/committed_bytes/decommit returned %u: %s", (unsigned)st,
               last_message());
        v->release(m->ctx, &r, &g_sink);
        return;
    }
    st = v->release(m->ctx, &r, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("virtual_backing", "fail", "release returned %u: %s", (unsigned)st, last_message());
        return;
    }
    report("virtual_backing", "pass", "reserve, commit, committed_bytes, decommit, release");
}

static void check_shared_mapping(const MemplugMechanism *m, const MemplugVirtualBacking *v,
                                 const MemplugSharedMapping *s, uint64_t g, int cpu)
{
    struct guarded_block out;
    MemplugObjectRef obj, res;
    MemplugStatus st;
    uint64_t id;

    if (v == NULL) {
        report("shared_mapping", "skip", "no virtual backing to map into");
        return;
    }
    guarded_init(&out);
    id = g_next_object_id;
    st = s->create(m->ctx, request(m, g, g), &out.block, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("shared_mapping", "fail", "create returned %u: %s", (unsigned)st, last_message());
        return;
    }
    obj = object_ref(m, id, &out.block);
    guarded_init(&out);
    id = g_next_object_id;
    st = v->reserve(m->ctx, request(m, 2 * g, g), &out.block, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("shared_mapping", "fail", "reserve returned %u: %s", (unsigned)st, last_message());
        s->release(m->ctx, &obj, &g_sink);
        return;
    }
    res = object_ref(m, id, &out.block);
    st = s->map(m->ctx, &obj, 0, &res, 0, g, MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE, &g_sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = s->map(m->ctx, &obj, 0, &res, g, g, MEMPLUG_ACCESS_READ, &g_sink);
    }
    if (st == MEMPLUG_STATUS_OK && cpu) {
        *(volatile unsigned char *)(uintptr_t)(res.addr + 7) = 0x77;
        if (*(volatile unsigned char *)(uintptr_t)(res.addr + g + 7) != 0x77) {
            report("shared_mapping", "fail", "a write through one view is not seen through the other");
            v->release(m->ctx, &res, &g_sink);
            s->release(m->ctx, &obj, &g_sink);
            return;
        }
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = s->unmap(m->ctx, &res, g, g, &g_sink);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = s->unmap(m->ctx, &res, 0, g, &g_sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        report("shared_mapping", "fail", "map/unmap returned %u: %s", (unsigned)st, last_message());
    }
    if (v->release(m->ctx, &res, &g_sink) != MEMPLUG_STATUS_OK ||
        s->release(m->ctx, &obj, &g_sink) != MEMPLUG_STATUS_OK) {
        report("shared_mapping", "fail", "release failed: %s", last_message());
        return;
    }
    if (st == MEMPLUG_STATUS_OK) {
        report("shared_mapping", "pass", "create, map read-write and read-only, coherent views, unmap, release");
    }
}

#if HOST_MINOR >= 1
/* 1.1: create -> map read-write -> write -> export_fd -> import_fd -> map
 * the import read-only -> read the bytes back -> unmap, release. */
static void check_export_import(const MemplugMechanism *m, const MemplugVirtualBacking *v,
                                const MemplugSharedMapping *s, uint64_t g, int cpu)
{
    struct guarded_block out;
    MemplugObjectRef a, b, res;
    MemplugStatus st;
    int32_t fd = -1;
    uint64_t id;
    int ok = 1;

    guarded_init(&out);
    id = g_next_object_id;
    st = s->create(m->ctx, request(m, g, g), &out.block, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("export_import", "fail", "create returned %u: %s", (unsigned)st, last_message());
        return;
    }
    a = object_ref(m, id, &out.block);
    guarded_init(&out);
    id = g_next_object_id;
    st = v->reserve(m->ctx, request(m, 2 * g, g), &out.block, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("export_import", "fail", "reserve returned %u: %s", (unsigned)st, last_message());
        s->release(m->ctx, &a, &g_sink);
        return;
    }
    res = object_ref(m, id, &out.block);
    st = s->map(m->ctx, &a, 0, &res, 0, g, MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE, &g_sink);
    if (st == MEMPLUG_STATUS_OK && cpu) {
        memcpy((void *)(uintptr_t)res.addr, "matrix", 6);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = s->export_fd(m->ctx, &a, &fd, &g_sink);
        if (st == MEMPLUG_STATUS_OK && fd <= 2) {
            report("export_import", "fail", "export_fd returned descriptor %d", (int)fd);
            ok = 0;
        }
    }
    memset(&b, 0, sizeof b);
    if (st == MEMPLUG_STATUS_OK && ok) {
        guarded_init(&out);
        id = g_next_object_id;
        st = s->import_fd(m->ctx, fd, request(m, g, g), &out.block, &g_sink);
        close(fd);
        if (st == MEMPLUG_STATUS_OK) {
            b = object_ref(m, id, &out.block);
            st = s->map(m->ctx, &b, 0, &res, g, g, MEMPLUG_ACCESS_READ, &g_sink);
            if (st == MEMPLUG_STATUS_OK && cpu && memcmp((const void *)(uintptr_t)(res.addr + g), "matrix", 6) != 0) {
                report("export_import", "fail", "the imported object does not read what was written to the exported one");
                ok = 0;
            }
            if (st == MEMPLUG_STATUS_OK) {
                st = s->unmap(m->ctx, &res, g, g, &g_sink);
            }
        }
    }
    if (st != MEMPLUG_STATUS_OK && ok) {
        report("export_import", "fail", "map/export_fd/import_fd/unmap returned %u: %s", (unsigned)st,
               last_message());
        ok = 0;
    }
    if (s->unmap(m->ctx, &res, 0, g, &g_sink) != MEMPLUG_STATUS_OK ||
        v->release(m->ctx, &res, &g_sink) != MEMPLUG_STATUS_OK ||
        s->release(m->ctx, &a, &g_sink) != MEMPLUG_STATUS_OK ||
        (b.handle != 0 && s->release(m->ctx, &b, &g_sink) != MEMPLUG_STATUS_OK)) {
        if (ok) {
            report("export_import", "fail", "unmap or release failed: %s", last_message());
        }
        return;
    }
    if (ok) {
        report("export_import", "pass",
               "create, export_fd, import_fd in this process, the import reads what the export wrote");
    }
}
#endif

static volatile int g_host_fn_ran;

static void host_fn(void *userdata)
{
    (void)userdata;
    g_host_fn_ran = 1;
}

static void check_sync(const MemplugMechanism *m, const MemplugSync *y)
{
    uint64_t stream = 0, fence = 0;
    MemplugStatus st;

    g_host_fn_ran = 0;
    st = y->stream_create(m->ctx, &stream, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("sync", "fail", "stream_create returned %u: %s", (unsigned)st, last_message());
        return;
    }
    st = y->enqueue_host_fn(m->ctx, stream, host_fn, NULL, &g_sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = y->fence_record(m->ctx, stream, &fence, &g_sink);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = y->fence_wait(m->ctx, fence, 5000000000ull, &g_sink);
    }
    if (st == MEMPLUG_STATUS_OK && !g_host_fn_ran) {
        report("sync", "fail", "the fence completed before the host function ran");
        return;
    }
    if (fence != 0 && y->fence_destroy(m->ctx, fence, &g_sink) != MEMPLUG_STATUS_OK) {
        st = MEMPLUG_STATUS_INTERNAL;
    }
    if (y->stream_destroy(m->ctx, stream, &g_sink) != MEMPLUG_STATUS_OK) {
        st = MEMPLUG_STATUS_INTERNAL;
    }
    if (st != MEMPLUG_STATUS_OK) {
        report("sync", "fail", "sync calls returned %u: %s", (unsigned)st, last_message());
        return;
    }
    report("sync", "pass", "stream, host function, fence wait, destroy");
}

static void check_mechanism(const MemplugMechanism *p, unsigned index)
{
    MemplugMechanism m;
    MemplugAllocator a;
    MemplugVirtualBacking v;
    MemplugSharedMapping s;
    MemplugSync y;
    MemplugProperties props[2];
    uint32_t unknown;
    int cpu, have_v = 0, have_s = 0;
    MemplugStatus st;

    if (!read_prefix(&m, sizeof m, p, MEMPLUG_MECHANISM_SIZE_1_0)) {
        report("descriptor.mechanism", "fail", "mechanism #%u is NULL or shorter than 1.0", index);
        return;
    }
    unknown = m.capabilities & ~known_caps();
    report("descriptor.mechanism", "pass", "'%s' struct_size %u (this host knows %u), caps %#x",
           m.name != NULL ? m.name : "?", (unsigned)m.struct_size, (unsigned)sizeof m,
           (unsigned)(m.capabilities & known_caps()));
    if (unknown != 0) {
        report("capabilities.unknown_bits", "degraded", "ignored bits %#x that 1.%u does not define",
               (unsigned)unknown, (unsigned)g_agreed);
    }
    cpu = m.device.kind == MEMPLUG_DEVICE_CPU;
    if (!read_prefix(&a, sizeof a, m.allocator, MEMPLUG_ALLOCATOR_SIZE_1_0) || a.properties == NULL ||
        a.allocate == NULL || a.deallocate == NULL) {
        report("allocator", "fail", "allocator missing, short or without required slots");
        return;
    }
    memset(props, GUARD, sizeof props);
    props[0].struct_size = sizeof(MemplugProperties);
    st = a.properties(m.ctx, &props[0], &g_sink);
    if (st != MEMPLUG_STATUS_OK || !guard_intact((const unsigned char *)&props[1])) {
        report("properties", "fail", "status %u or a write past struct_size", (unsigned)st);
        return;
    }
    report("properties", "pass", "min_alignment %llu, granularity %llu",
           (unsigned long long)props[0].min_alignment, (unsigned long long)props[0].granularity);
    check_allocator(&m, &a, cpu);

    if ((m.capabilities & MEMPLUG_CAP_VIRTUAL_BACKING) != 0) {
        if (read_prefix(&v, sizeof v, m.virtual_backing, MEMPLUG_VIRTUAL_BACKING_SIZE_1_0)) {
            have_v = 1;
            check_virtual_backing(&m, &v, props[0].granularity, cpu);
        } else {
            report("virtual_backing", "fail", "flag set, table NULL or short");
        }
    } else {
        report("virtual_backing", "skip", "not published");
    }
    if ((m.capabilities & MEMPLUG_CAP_SHARED_MAPPING) != 0) {
        if (read_prefix(&s, sizeof s, m.shared_mapping, MEMPLUG_SHARED_MAPPING_SIZE_1_0)) {
            have_s = 1;
            check_shared_mapping(&m, have_v ? &v : NULL, &s, props[0].granularity, cpu);
            if (s.struct_size > sizeof s) {
                report("shared_mapping.longer_table", "degraded",
                       "table of %u bytes read as its %u-byte 1.0 prefix", (unsigned)s.struct_size,
                       (unsigned)sizeof s);
            }
        } else {
            report("shared_mapping", "fail", "flag set, table NULL or short");
        }
    } else {
        report("shared_mapping", "skip", "not published");
    }
    if ((m.capabilities & MEMPLUG_CAP_SYNC) != 0) {
        if (read_prefix(&y, sizeof y, m.sync, MEMPLUG_SYNC_SIZE_1_0)) {
            check_sync(&m, &y);
        } else {
            report("sync", "fail", "flag set, table NULL or short");
        }
    } else {
        report("sync", "skip", "not published");
    }
#if HOST_MINOR >= 1
    if (g_agreed == 0) {
        report("export_import", "degraded", "unavailable: the plugin agreed on 1.0 (sharing across processes is 1.1)");
    } else if ((m.capabilities & MEMPLUG_CAP_SHARED_EXPORT) == 0) {
        report("export_import", "skip", "MEMPLUG_CAP_SHARED_EXPORT not published");
    } else if (!have_s || !have_v || s.struct_size < MEMPLUG_SHARED_MAPPING_SIZE_1_1 || s.export_fd == NULL ||
               s.import_fd == NULL) {
        report("export_import", "fail", "MEMPLUG_CAP_SHARED_EXPORT set without a 1.1 shared mapping table "
                                        "(or without a virtual backing to map into)");
    } else {
        check_export_import(&m, &v, &s, props[0].granularity, cpu);
    }
#else
    (void)have_s;
    report("export_import", "degraded", "unavailable: this host speaks 1.0 (sharing across processes is 1.1)");
#endif
    if (request_size() > MEMPLUG_REQUEST_SIZE_1_0) {
        report("class_tag", "pass", "%u-byte 1.1 requests with class_tag KV accepted", (unsigned)request_size());
    } else if (HOST_MINOR >= 1) {
        report("class_tag", "degraded", "not sent: the plugin agreed on 1.0 (40-byte requests)");
    } else {
        report("class_tag", "degraded", "not sent: 1.0 requests have no class_tag");
    }
}

int main(int argc, char **argv)
{
    void *lib, *sym;
    MemplugEntryV1 entry;
    MemplugHostInfo *host;
    uint32_t expected;
    char host_name[32];
    struct {
        MemplugNegotiation n;
        unsigned char guard[GUARD_BYTES];
    } out;
    MemplugPlugin plugin;
    uint64_t live_before, live_after;
    MemplugStatus st;
    uint32_t i;

    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
        return 2;
    }
    g_request_end = fenced_page_end();
    g_host_info_end = fenced_page_end();
    if (g_request_end == NULL || g_host_info_end == NULL) {
        fprintf(stderr, "cannot map the fenced pages\n");
        return 2;
    }
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        report("load", "fail", "dlopen: %s", dlerror());
        printf("summary\tfail\t%d checks, %d failed\n", g_checks, g_failed);
        return 1;
    }
    sym = dlsym(lib, MEMPLUG_ENTRY_SYMBOL_V1);
    if (sym == NULL) {
        report("load", "fail", "no %s", MEMPLUG_ENTRY_SYMBOL_V1);
        printf("summary\tfail\t%d checks, %d failed\n", g_checks, g_failed);
        return 1;
    }
    memcpy(&entry, &sym, sizeof entry); /* -pedantic: no object-to-function cast */
    report("load", "pass", "%s found (this host knows major 1 only)", MEMPLUG_ENTRY_SYMBOL_V1);

    /* The host info this minor knows (24 bytes in 1.0 and 1.1), ending at
     * the PROT_NONE page: there is nothing after host_name to read. */
    host = (MemplugHostInfo *)(void *)(g_host_info_end - sizeof(MemplugHostInfo));
    memset(host, 0, sizeof *host);
    host->struct_size = sizeof *host;
    host->abi_major = MEMPLUG_ABI_MAJOR;
    host->min_minor = 0;
    host->max_minor = HOST_MINOR;
    snprintf(host_name, sizeof host_name, "matrix-host-1.%u", (unsigned)HOST_MINOR);
    host->host_name = host_name;
    memset(&out, GUARD, sizeof out);
    out.n.struct_size = sizeof out.n;
    clear_message();
    st = entry(host, &out.n, &g_sink);
    if (st != MEMPLUG_STATUS_OK) {
        report("negotiate", "fail", "status %u: %s", (unsigned)st, last_message());
        printf("summary\tfail\t%d checks, %d failed\n", g_checks, g_failed);
        return 1;
    }
    if (out.n.agreed_minor > HOST_MINOR || !guard_intact(out.guard) ||
        !read_prefix(&plugin, sizeof plugin, out.n.plugin, MEMPLUG_PLUGIN_SIZE_1_0)) {
        report("negotiate", "fail", "agreed 1.%u (this host speaks up to 1.%u), wrote past the answer, or no valid descriptor",
               (unsigned)out.n.agreed_minor, (unsigned)HOST_MINOR);
        printf("summary\tfail\t%d checks, %d failed\n", g_checks, g_failed);
        return 1;
    }
    expected = min_u32(plugin.max_minor, HOST_MINOR);
    if (out.n.agreed_minor != expected || out.n.agreed_minor < plugin.min_minor) {
        report("negotiate", "fail", "agreed 1.%u; the newest minor both speak is 1.%u (plugin 1.%u..=1.%u)",
               (unsigned)out.n.agreed_minor, (unsigned)expected, (unsigned)plugin.min_minor,
               (unsigned)plugin.max_minor);
        printf("summary\tfail\t%d checks, %d failed\n", g_checks, g_failed);
        return 1;
    }
    g_agreed = out.n.agreed_minor;
    report("negotiate", "pass", "agreed 1.%u with '%s' %s (plugin speaks 1.%u..=1.%u), descriptor %u bytes",
           (unsigned)out.n.agreed_minor, plugin.name != NULL ? plugin.name : "?",
           plugin.version != NULL ? plugin.version : "?", (unsigned)plugin.min_minor,
           (unsigned)plugin.max_minor, (unsigned)plugin.struct_size);
    if (plugin.max_minor > HOST_MINOR) {
        report("negotiate.newer_plugin", "degraded", "plugin speaks up to 1.%u; used as 1.%u",
               (unsigned)plugin.max_minor, (unsigned)HOST_MINOR);
    }
    report("services", "degraded",
           "not offered: 1.%u has no host services; the %u-byte host info ended at a PROT_NONE page and the "
           "plugin read nothing past it",
           (unsigned)HOST_MINOR, (unsigned)sizeof *host);
    if (plugin.live_objects == NULL || plugin.mechanisms == NULL || plugin.mechanism_count == 0) {
        report("descriptor", "fail", "live_objects, mechanisms or mechanism_count missing");
        printf("summary\tfail\t%d checks, %d failed\n", g_checks, g_failed);
        return 1;
    }
    live_before = plugin.live_objects(plugin.ctx);
    for (i = 0; i < plugin.mechanism_count; i++) {
        check_mechanism(plugin.mechanisms[i], i);
    }
    live_after = plugin.live_objects(plugin.ctx);
    report("live_objects", live_after == live_before ? "pass" : "fail", "%llu before, %llu after",
           (unsigned long long)live_before, (unsigned long long)live_after);
    printf("summary\t%s\t%d checks, %d failed\n", g_failed == 0 ? "pass" : "fail", g_checks, g_failed);
    /* The library stays loaded: a plugin may keep threads until exit. */
    return g_failed == 0 ? 0 : 1;
}
