/*
 * test_full_plugin.c: a small C host that loads full_plugin.c's library with
 * dlopen and checks what a vendor would change first: each minor's
 * descriptor, one state per load (two hosts in one process), memory through
 * every table, streams and their order, the copy slot, queued binding,
 * typed export and import, the loss and what each load is told, and eight
 * threads at once.
 *
 *   test_full_plugin PATH/TO/libmemplug_full_plugin.so
 *
 * Exit status 0 when every check passed; each failure is printed. Run by
 * ctest (also under ASan+UBSan) and by `cargo test -p memplug-abi-tests`.
 * `memplug conformance` checks the rest of the contract.
 */

#define _GNU_SOURCE 1

#include "memplug.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_failures;
static int g_checks;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        g_checks++;                                                                  \
        if (!(cond)) {                                                               \
            g_failures++;                                                            \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define EXPECT(call, want)                                                                         \
    do {                                                                                           \
        MemplugStatus got_ = (call);                                                               \
        g_checks++;                                                                                \
        if (got_ != (MemplugStatus)(want)) {                                                       \
            g_failures++;                                                                          \
            fprintf(stderr, "%s:%d: %s: got status %u, expected %u\n", __FILE__, __LINE__, #call, \
                    (unsigned)got_, (unsigned)(want));                                             \
        }                                                                                          \
    } while (0)

/* ---- the host side: services, a sink, one load per negotiation ---------- */

static unsigned g_reports;
static uint64_t g_reported_id;

static MemplugStatus report_device_lost(void *ctx, uint64_t mechanism_id, const char *reason, size_t len)
{
    (void)ctx;
    (void)reason;
    (void)len;
    __atomic_fetch_add(&g_reports, 1u, __ATOMIC_SEQ_CST);
    g_reported_id = mechanism_id;
    return MEMPLUG_STATUS_OK;
}

static const MemplugHostServices g_services = {sizeof(MemplugHostServices), 0, NULL, report_device_lost};

static void ignore(void *ctx, const char *msg, size_t len)
{
    (void)ctx;
    (void)msg;
    (void)len;
}

static const MemplugMessageSink g_sink = {NULL, ignore};

struct load {
    uint32_t minor;
    const MemplugPlugin *plugin;
    const MemplugMechanism *m;
};

static MemplugEntryV1 g_entry;

static struct load negotiate(uint32_t max_minor)
{
    MemplugHostInfo info;
    MemplugNegotiation out;
    struct load l;
    memset(&info, 0, sizeof info);
    memset(&out, 0, sizeof out);
    memset(&l, 0, sizeof l);
    /* A host of 1.0 or 1.1 sends the 24-byte host info, without services. */
    info.struct_size = max_minor >= 2 ? MEMPLUG_HOST_INFO_SIZE_1_2 : MEMPLUG_HOST_INFO_SIZE_1_0;
    info.abi_major = 1;
    info.max_minor = max_minor;
    info.services = max_minor >= 2 ? &g_services : NULL;
    out.struct_size = sizeof out;
    EXPECT(g_entry(&info, &out, &g_sink), MEMPLUG_STATUS_OK);
    l.minor = out.agreed_minor;
    l.plugin = out.plugin;
    l.m = out.plugin != NULL ? out.plugin->mechanisms[0] : NULL;
    return l;
}

static MemplugRequest request(const struct load *l, uint64_t size)
{
    MemplugRequest r;
    static uint64_t next_id = 1;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.size = size;
    r.alignment = 4096;
    r.object_id = __atomic_fetch_add(&next_id, 1u, __ATOMIC_SEQ_CST);
    r.device = l->m->device;
    return r;
}

static MemplugObjectRef ref_of(const struct load *l, const MemplugRequest *r, const MemplugBlock *b)
{
    MemplugObjectRef o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.mechanism_id = l->m->mechanism_id;
    o.device = l->m->device;
    o.object_id = r->object_id;
    o.addr = b->addr;
    o.size = b->size;
    o.handle = b->handle;
    return o;
}

static uint64_t live(const struct load *l)
{
    return l->plugin->live_objects(l->plugin->ctx);
}

/* ---- the checks ---------------------------------------------------------- */

/* Each minor gets its own descriptor: no capability bit a later minor
 * defines; properties written no further than the host asked. */
static void descriptors_per_minor(void)
{
    struct load l0 = negotiate(0), l1 = negotiate(1), l3 = negotiate(3);
    MemplugProperties p;
    CHECK(l0.minor == 0 && l1.minor == 1 && l3.minor == 3);
    CHECK((l0.m->capabilities & ~(uint32_t)MEMPLUG_CAP_ALL_1_0) == 0);
    CHECK(l1.m->capabilities & MEMPLUG_CAP_SHARED_EXPORT);
    CHECK(!(l1.m->capabilities & MEMPLUG_CAP_TYPED_EXPORT));
    CHECK(l3.m->capabilities & MEMPLUG_CAP_QUEUED_BINDING && l3.m->capabilities & MEMPLUG_CAP_TYPED_EXPORT);
    CHECK(l0.plugin != l3.plugin); /* one state per load */

    memset(&p, 0xAB, sizeof p);
    p.struct_size = MEMPLUG_PROPERTIES_SIZE_1_0;
    EXPECT(l0.m->allocator->properties(l0.m->ctx, &p, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(p.attributes == 0xABABABABu && p.copy_kinds == 0xABABABABu); /* nothing past 1.0's size */
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    EXPECT(l3.m->allocator->properties(l3.m->ctx, &p, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(p.copy_kinds == (MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST));
    CHECK(p.export_types == MEMPLUG_HANDLE_MEMFD && (p.attributes & MEMPLUG_ATTR_ZERO_FILLED));
    l0.plugin->unload(l0.plugin->ctx);
    l1.plugin->unload(l1.plugin->ctx);
    l3.plugin->unload(l3.plugin->ctx);
}

static void set_flag(void *flag)
{
    __atomic_store_n((int *)flag, 1, __ATOMIC_SEQ_CST);
}

/* Blocks its stream until *gate is set: what the kit's checks call holding
 * a stream. */
static void hold(void *gate)
{
    while (!__atomic_load_n((int *)gate, __ATOMIC_SEQ_CST)) {
        usleep(1000);
    }
}

/* Memory through every table, in stream order. */
static void memory_and_streams(const struct load *l)
{
    const MemplugMechanism *m = l->m;
    void *ctx = m->ctx;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), stream = 0, fence = 0, bytes = 0;
    MemplugRequest ra = request(l, 100), rr = request(l, 4 * page), ro = request(l, page);
    MemplugBlock a, r, o, imported;
    MemplugObjectRef ar, rref, oref, iref;
    MemplugHandle h;
    MemplugRequest ri;
    int gate = 0, ran = 0;
    unsigned char *p;

    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    r = o = imported = a;
    EXPECT(m->allocator->allocate(ctx, &ra, &a, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->virtual_backing->reserve(ctx, &rr, &r, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->shared_mapping->create(ctx, &ro, &o, &g_sink), MEMPLUG_STATUS_OK);
    ar = ref_of(l, &ra, &a);
    rref = ref_of(l, &rr, &r);
    oref = ref_of(l, &ro, &o);
    CHECK(live(l) == 3);
    EXPECT(m->sync->stream_create(ctx, &stream, &g_sink), MEMPLUG_STATUS_OK);

    /* Queued commit is usable by its fence; a copy from host memory lands
     * in it in stream order, behind a host function holding the stream. */
    EXPECT(m->virtual_backing->commit_on(ctx, &rref, 0, page, stream, &fence, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->sync->fence_wait(ctx, fence, UINT64_MAX, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->sync->fence_destroy(ctx, fence, &g_sink), MEMPLUG_STATUS_OK);
    memset((void *)(uintptr_t)a.addr, 7, 100);
    EXPECT(m->sync->enqueue_host_fn(ctx, stream, hold, &gate, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->sync->copy(ctx, stream, r.addr + 10, a.addr, 100, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->sync->fence_record(ctx, stream, &fence, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->sync->fence_query(ctx, fence, &g_sink), MEMPLUG_STATUS_NOT_READY);
    EXPECT(m->sync->fence_wait(ctx, fence, 1000000, &g_sink), MEMPLUG_STATUS_TIMEOUT);
    p = (unsigned char *)(uintptr_t)r.addr;
    CHECK(p[10] == 0); /* nothing copied while the stream is held */
    set_flag(&gate);
    EXPECT(m->sync->fence_wait(ctx, fence, UINT64_MAX, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(p[9] == 0 && p[10] == 7 && p[109] == 7 && p[110] == 0);
    EXPECT(m->sync->fence_destroy(ctx, fence, &g_sink), MEMPLUG_STATUS_OK);
    /* Copies the header refuses, each before anything is enqueued. */
    EXPECT(m->sync->copy(ctx, stream, a.addr + 50, a.addr, 100, &g_sink), MEMPLUG_STATUS_INVALID_ARGUMENT);
    EXPECT(m->sync->copy(ctx, stream, r.addr + page - 8, a.addr, 16, &g_sink), MEMPLUG_STATUS_OUT_OF_RANGE);
    EXPECT(m->sync->copy(ctx, stream, r.addr, a.addr, 0, &g_sink), MEMPLUG_STATUS_OK);

    /* Shared mapping, typed export and import (the lent fd stays ours). */
    EXPECT(m->shared_mapping->map(ctx, &oref, 0, &rref, 2 * page, page, MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE,
                                  &g_sink),
           MEMPLUG_STATUS_OK);
    p[2 * page] = 42;
    memset(&h, 0, sizeof h);
    h.struct_size = sizeof h;
    EXPECT(m->shared_mapping->export_handle(ctx, &oref, MEMPLUG_HANDLE_DMABUF_FD, &h, &g_sink),
           MEMPLUG_STATUS_UNSUPPORTED);
    EXPECT(m->shared_mapping->export_handle(ctx, &oref, MEMPLUG_HANDLE_MEMFD, &h, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(h.handle_type == MEMPLUG_HANDLE_MEMFD && h.fd > 2);
    ri = request(l, page);
    EXPECT(m->shared_mapping->import_handle(ctx, &h, &ri, &imported, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(fcntl(h.fd, F_GETFD) >= 0); /* the caller's descriptor is still open */
    close(h.fd);
    iref = ref_of(l, &ri, &imported);
    EXPECT(m->shared_mapping->map(ctx, &iref, 0, &rref, 3 * page, page, MEMPLUG_ACCESS_READ, &g_sink),
           MEMPLUG_STATUS_OK);
    CHECK(p[3 * page] == 42); /* the same memory */
    EXPECT(m->shared_mapping->release(ctx, &iref, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->shared_mapping->release(ctx, &iref, &g_sink), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);

    /* Queued unmap and decommit wait for the work before them. */
    gate = 0;
    EXPECT(m->sync->enqueue_host_fn(ctx, stream, hold, &gate, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->shared_mapping->unmap_on(ctx, &rref, 3 * page, page, stream, &fence, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(p[3 * page] == 42); /* still mapped while the stream is held */
    EXPECT(m->virtual_backing->decommit_on(ctx, &rref, 0, page, stream, &bytes, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(p[10] == 7); /* still committed while the stream is held */
    EXPECT(m->virtual_backing->commit(ctx, &rref, 0, page, &g_sink), MEMPLUG_STATUS_INVALID_STATE);
    set_flag(&gate);
    EXPECT(m->sync->fence_wait(ctx, bytes, UINT64_MAX, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->sync->fence_destroy(ctx, fence, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->sync->fence_destroy(ctx, bytes, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->virtual_backing->committed_bytes(ctx, &rref, &bytes, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(bytes == 0);
    EXPECT(m->virtual_backing->commit(ctx, &rref, 0, page, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(p[10] == 0); /* recommitted pages read as zero */

    /* Destroy waits for the stream's work; its host functions run once. */
    EXPECT(m->sync->enqueue_host_fn(ctx, stream, set_flag, &ran, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->sync->stream_destroy(ctx, stream, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(ran == 1);
    EXPECT(m->sync->stream_destroy(ctx, stream, &g_sink), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);

    EXPECT(m->virtual_backing->release(ctx, &rref, &g_sink), MEMPLUG_STATUS_OK); /* drops its mapping */
    EXPECT(m->shared_mapping->release(ctx, &oref, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(m->allocator->deallocate(ctx, &ar, &g_sink), MEMPLUG_STATUS_OK);
    CHECK(live(l) == 0);
}

/* Eight threads allocating, committing and freeing at once. */
struct worker_arg {
    const struct load *l;
    int errors;
};

static void *worker(void *p)
{
    struct worker_arg *w = p;
    const MemplugMechanism *m = w->l->m;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    int i;
    for (i = 0; i < 200; i++) {
        MemplugRequest ra = request(w->l, 64), rr = request(w->l, 2 * page);
        MemplugBlock a, r;
        MemplugObjectRef ar, rref;
        memset(&a, 0, sizeof a);
        a.struct_size = sizeof a;
        r = a;
        if (m->allocator->allocate(m->ctx, &ra, &a, &g_sink) != MEMPLUG_STATUS_OK ||
            m->virtual_backing->reserve(m->ctx, &rr, &r, &g_sink) != MEMPLUG_STATUS_OK) {
            w->errors++;
            continue;
        }
        ar = ref_of(w->l, &ra, &a);
        rref = ref_of(w->l, &rr, &r);
        *(volatile unsigned char *)(uintptr_t)a.addr = 1;
        w->errors += m->virtual_backing->commit(m->ctx, &rref, page, page, &g_sink) != MEMPLUG_STATUS_OK;
        w->errors += m->virtual_backing->release(m->ctx, &rref, &g_sink) != MEMPLUG_STATUS_OK;
        w->errors += m->allocator->deallocate(m->ctx, &ar, &g_sink) != MEMPLUG_STATUS_OK;
    }
    return NULL;
}

static void threads(const struct load *l)
{
    pthread_t t[8];
    struct worker_arg w[8];
    int i;
    for (i = 0; i < 8; i++) {
        w[i].l = l;
        w[i].errors = 0;
        CHECK(pthread_create(&t[i], NULL, worker, &w[i]) == 0);
    }
    for (i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].errors == 0);
    }
    CHECK(live(l) == 0);
}

/* A loss reaches every load: reported through each 1.2 host's services,
 * DEVICE_LOST from every slot there, DEVICE_UNAVAILABLE to the 1.1 host
 * (which reads 15 as INTERNAL); accepted host functions still run. */
static void loss(void *lib, const struct load *l3)
{
    MemplugStatus (*trigger)(uint64_t);
    void *sym = dlsym(lib, "memplug_test_trigger_device_lost");
    struct load l1 = negotiate(1);
    MemplugRequest ra = request(l3, 64);
    MemplugBlock a;
    uint64_t stream = 0, fence = 0;
    int gate = 0, ran = 0;
    CHECK(sym != NULL);
    if (sym == NULL) {
        return;
    }
    memcpy(&trigger, &sym, sizeof trigger); /* -Wpedantic: no cast from void * */
    EXPECT(l3->m->sync->stream_create(l3->m->ctx, &stream, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(l3->m->sync->enqueue_host_fn(l3->m->ctx, stream, hold, &gate, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(l3->m->sync->enqueue_host_fn(l3->m->ctx, stream, set_flag, &ran, &g_sink), MEMPLUG_STATUS_OK);
    EXPECT(trigger(99), MEMPLUG_STATUS_WRONG_MECHANISM);
    CHECK(g_reports == 0);
    EXPECT(trigger(l3->m->mechanism_id), MEMPLUG_STATUS_OK);
    CHECK(g_reports == 1 && g_reported_id == l3->m->mechanism_id); /* the 1.1 host has no services */
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    EXPECT(l3->m->allocator->allocate(l3->m->ctx, &ra, &a, &g_sink), MEMPLUG_STATUS_DEVICE_LOST);
    EXPECT(l3->m->sync->fence_record(l3->m->ctx, stream, &fence, &g_sink), MEMPLUG_STATUS_DEVICE_LOST);
    ra = request(&l1, 64);
    EXPECT(l1.m->allocator->allocate(l1.m->ctx, &ra, &a, &g_sink), MEMPLUG_STATUS_DEVICE_UNAVAILABLE);
    set_flag(&gate);
    while (!__atomic_load_n(&ran, __ATOMIC_SEQ_CST)) {
        usleep(1000); /* the host function accepted before the loss runs */
    }
    l1.plugin->unload(l1.plugin->ctx);
}

int main(int argc, char **argv)
{
    void *lib, *sym;
    struct load l;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_full_plugin.so\n", argv[0]);
        return 2;
    }
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    sym = dlsym(lib, MEMPLUG_ENTRY_SYMBOL_V1);
    if (sym == NULL) {
        fprintf(stderr, "no %s in %s\n", MEMPLUG_ENTRY_SYMBOL_V1, argv[1]);
        return 2;
    }
    memcpy(&g_entry, &sym, sizeof g_entry);

    descriptors_per_minor();
    l = negotiate(3);
    memory_and_streams(&l);
    threads(&l);
    loss(lib, &l);
    l.plugin->unload(l.plugin->ctx); /* joins the stream left after the loss */
    dlclose(lib);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
