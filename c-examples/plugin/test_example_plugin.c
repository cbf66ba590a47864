/*
 * test_example_plugin.c: a small C host that loads the example plugin with
 * dlopen and checks its contract: negotiation, prefix reading and writing,
 * identity and range checks, messages, exact live_objects, thread safety.
 *
 *   test_example_plugin PATH/TO/libmemplug_example_plugin.so
 *
 * Exit status 0 when every check passed; each failure is printed. Run by
 * ctest (CMakeLists.txt) and by `cargo test -p memplug-abi-tests`.
 */

#define _POSIX_C_SOURCE 200809L

#include "memplug.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- checking ---------------------------------------------------------- */

static int g_failures;
static int g_checks;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        g_checks++;                                                                    \
        if (!(cond)) {                                                                 \
            g_failures++;                                                              \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
        }                                                                              \
    } while (0)

/* The sink keeps the last message of the current call. */
struct last_message {
    char text[MEMPLUG_MESSAGE_MAX + 1];
    size_t len;
    int count;
};

static const MemplugPlugin *g_plugin;

/* Records the message. It also calls back into the plugin: a plugin that
 * held its own lock while writing to the sink would deadlock here (the ABI
 * forbids holding a lock across a call into the other side). */
static void record(void *ctx, const char *msg, size_t len)
{
    struct last_message *m = (struct last_message *)ctx;
    if (g_plugin != NULL) {
        (void)g_plugin->live_objects(g_plugin->ctx);
    }
    if (len > MEMPLUG_MESSAGE_MAX) {
        len = MEMPLUG_MESSAGE_MAX;
    }
    memcpy(m->text, msg, len);
    m->text[len] = '\0';
    m->len = len;
    m->count++;
}

static struct last_message g_msg;
static MemplugMessageSink g_sink = {&g_msg, record};

static const MemplugMessageSink *fresh_sink(void)
{
    memset(&g_msg, 0, sizeof g_msg);
    return &g_sink;
}

/* Checks a status, and that a failure came with a message. */
#define EXPECT(call, expected)                                                              \
    do {                                                                                    \
        MemplugStatus got_ = (call);                                                        \
        g_checks++;                                                                         \
        if (got_ != (MemplugStatus)(expected)) {                                            \
            g_failures++;                                                                   \
            fprintf(stderr, "%s:%d: %s returned %u, expected %s (%u); message: %s\n",       \
                    __FILE__, __LINE__, #call, (unsigned)got_, #expected,                   \
                    (unsigned)(expected), g_msg.text);                                      \
        } else if (got_ != MEMPLUG_STATUS_OK && g_msg.len == 0) {                           \
            g_failures++;                                                                   \
            fprintf(stderr, "%s:%d: %s failed with %s but wrote no message\n", __FILE__,    \
                    __LINE__, #call, #expected);                                            \
        }                                                                                   \
    } while (0)

/* ---- the plugin under test --------------------------------------------- */

static MemplugEntryV1 g_entry;
static const MemplugMechanism *g_mech;
static const MemplugAllocator *g_alloc;
static const MemplugVirtualBacking *g_vb;
static uint64_t g_page;
static uint64_t g_next_object_id = 1000;
static pthread_mutex_t g_id_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t next_object_id(void)
{
    uint64_t id;
    pthread_mutex_lock(&g_id_lock);
    id = g_next_object_id++;
    pthread_mutex_unlock(&g_id_lock);
    return id;
}

static MemplugHostInfo host_info(uint32_t major, uint32_t min_minor, uint32_t max_minor)
{
    MemplugHostInfo h;
    memset(&h, 0, sizeof h);
    h.struct_size = sizeof h;
    h.abi_major = major;
    h.min_minor = min_minor;
    h.max_minor = max_minor;
    h.host_name = "test_example_plugin";
    return h;
}

static MemplugRequest request(uint64_t size, uint64_t alignment)
{
    MemplugRequest r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.size = size;
    r.alignment = alignment;
    r.object_id = next_object_id();
    r.device.kind = MEMPLUG_DEVICE_CPU;
    r.device.ordinal = 0;
    return r;
}

static MemplugBlock empty_block(void)
{
    MemplugBlock b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    return b;
}

static MemplugObjectRef ref_of(const MemplugRequest *r, const MemplugBlock *b)
{
    MemplugObjectRef o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.mechanism_id = g_mech->mechanism_id;
    o.device = r->device;
    o.object_id = r->object_id;
    o.addr = b->addr;
    o.size = b->size;
    o.handle = b->handle;
    return o;
}

static uint64_t live(void)
{
    return g_plugin->live_objects(g_plugin->ctx);
}

/* ---- negotiation ------------------------------------------------------- */

static void test_negotiation(void)
{
    MemplugHostInfo h;
    MemplugNegotiation n;
    unsigned char buf[64];
    struct {
        MemplugHostInfo info;
        uint64_t future_field;
    } longer;

    /* The ordinary case. */
    h = host_info(1, 0, MEMPLUG_ABI_MINOR);
    memset(&n, 0, sizeof n);
    n.struct_size = sizeof n;
    EXPECT(g_entry(&h, &n, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(n.struct_size == sizeof n);
    CHECK(n.agreed_minor == 0);
    CHECK(n.plugin != NULL);
    if (n.plugin == NULL) {
        fprintf(stderr, "no plugin descriptor; cannot go on\n");
        exit(1);
    }
    g_plugin = n.plugin;

    /* A newer host: the agreed minor is the smaller maximum. */
    h = host_info(1, 0, 5);
    EXPECT(g_entry(&h, &n, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(n.agreed_minor == 0);

    /* Wrong major, disjoint minor ranges: refused, with a message. */
    h = host_info(2, 0, 0);
    EXPECT(g_entry(&h, &n, fresh_sink()), MEMPLUG_STATUS_VERSION_MISMATCH);
    h = host_info(1, 1, 3);
    EXPECT(g_entry(&h, &n, fresh_sink()), MEMPLUG_STATUS_VERSION_MISMATCH);
    CHECK(strstr(g_msg.text, "1.1") != NULL);
    /* A host contradicting itself. */
    h = host_info(1, 3, 1);
    EXPECT(g_entry(&h, &n, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    /* Short or missing structs. */
    h = host_info(1, 0, 0);
    h.struct_size = MEMPLUG_HOST_INFO_SIZE_1_0 - 8;
    EXPECT(g_entry(&h, &n, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    EXPECT(g_entry(NULL, &n, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    h = host_info(1, 0, 0);
    EXPECT(g_entry(&h, NULL, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    /* No sink: still refused, nothing written. */
    h = host_info(2, 0, 0);
    CHECK(g_entry(&h, &n, NULL) == MEMPLUG_STATUS_VERSION_MISMATCH);

    /* A longer host struct (a future minor) is read as its 1.0 prefix. */
    memset(&longer, 0xee, sizeof longer);
    longer.info = host_info(1, 0, 9);
    longer.info.struct_size = sizeof longer;
    EXPECT(g_entry(&longer.info, &n, fresh_sink()), MEMPLUG_STATUS_OK);

    /* The answer is never written past out->struct_size. */
    memset(buf, 0xaa, sizeof buf);
    {
        uint32_t size = MEMPLUG_NEGOTIATION_SIZE_1_0;
        size_t i;
        int intact = 1;
        memcpy(buf, &size, sizeof size);
        h = host_info(1, 0, 0);
        EXPECT(g_entry(&h, (MemplugNegotiation *)(void *)buf, fresh_sink()), MEMPLUG_STATUS_OK);
        for (i = MEMPLUG_NEGOTIATION_SIZE_1_0; i < sizeof buf; i++) {
            intact &= buf[i] == 0xaa;
        }
        CHECK(intact);
        memcpy(&size, buf, sizeof size);
        CHECK(size == MEMPLUG_NEGOTIATION_SIZE_1_0);

        /* A short out struct is refused and left alone. */
        memset(buf, 0xaa, sizeof buf);
        size = 12;
        memcpy(buf, &size, sizeof size);
        EXPECT(g_entry(&h, (MemplugNegotiation *)(void *)buf, fresh_sink()),
               MEMPLUG_STATUS_INVALID_ARGUMENT);
        intact = 1;
        for (i = sizeof size; i < sizeof buf; i++) {
            intact &= buf[i] == 0xaa;
        }
        CHECK(intact);
    }
}

static void test_descriptors(void)
{
    CHECK(g_plugin->struct_size >= MEMPLUG_PLUGIN_SIZE_1_0);
    CHECK(g_plugin->abi_major == 1);
    CHECK(g_plugin->min_minor <= g_plugin->max_minor);
    CHECK(g_plugin->name != NULL && g_plugin->version != NULL);
    CHECK(g_plugin->live_objects != NULL);
    CHECK(g_plugin->mechanism_count == 1);
    g_mech = g_plugin->mechanisms[0];
    CHECK(g_mech->struct_size >= MEMPLUG_MECHANISM_SIZE_1_0);
    CHECK(strcmp(g_mech->name, "c-example") == 0);
    CHECK(g_mech->mechanism_id == 1);
    CHECK(g_mech->device.kind == MEMPLUG_DEVICE_CPU && g_mech->device.ordinal == 0);
    CHECK(g_mech->capabilities == (MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING));
    CHECK(g_mech->shared_mapping == NULL && g_mech->sync == NULL);
    g_alloc = g_mech->allocator;
    g_vb = g_mech->virtual_backing;
    CHECK(g_alloc != NULL && g_vb != NULL);
    if (g_alloc == NULL || g_vb == NULL) {
        exit(1);
    }
    CHECK(g_alloc->struct_size >= MEMPLUG_ALLOCATOR_SIZE_1_0);
    CHECK(g_vb->struct_size >= MEMPLUG_VIRTUAL_BACKING_SIZE_1_0);
    CHECK(live() == 0);
}

/* ---- allocator --------------------------------------------------------- */

static void test_allocator(void)
{
    MemplugProperties p;
    MemplugMemoryInfo mi;
    MemplugRequest r, r2;
    MemplugBlock b, b2;
    MemplugObjectRef o, bad;
    uint64_t align;

    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    EXPECT(g_alloc->properties(g_mech->ctx, &p, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(p.min_alignment == 16);
    CHECK(p.max_alignment == 2u * 1024 * 1024);
    CHECK(p.granularity == (uint64_t)sysconf(_SC_PAGESIZE));
    g_page = p.granularity;

    CHECK(g_alloc->memory_info != NULL);
    memset(&mi, 0, sizeof mi);
    mi.struct_size = sizeof mi;
    EXPECT(g_alloc->memory_info(g_mech->ctx, &mi, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(mi.total_bytes > 0 && mi.free_bytes <= mi.total_bytes);

    /* Every alignment from 1 to the maximum is honoured, odd sizes too. */
    for (align = 1; align <= p.max_alignment; align *= 2) {
        r = request(align * 3 + 1, align);
        b = empty_block();
        EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_OK);
        CHECK(b.addr % align == 0 && b.addr % p.min_alignment == 0);
        CHECK(b.size >= r.size && b.handle != 0);
        memset((void *)(uintptr_t)b.addr, 0x5a, (size_t)b.size);
        CHECK(live() == 1);
        o = ref_of(&r, &b);
        EXPECT(g_alloc->deallocate(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_OK);
        CHECK(live() == 0);
    }

    /* Malformed requests. */
    b = empty_block();
    r = request(64, 3);
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    r = request(64, 0);
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    r = request(64, p.max_alignment * 2);
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    r = request(0, 8);
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    r = request(64, 8);
    r.flags = 1;
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    r = request(64, 8);
    r.struct_size = MEMPLUG_REQUEST_SIZE_1_0 - 8;
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    r = request(64, 8);
    r.device.kind = MEMPLUG_DEVICE_CUDA;
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_WRONG_DEVICE);
    r = request(64, 8);
    r.device.ordinal = 1;
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_WRONG_DEVICE);
    r = request(64, 8);
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, NULL, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    EXPECT(g_alloc->allocate(g_mech->ctx, NULL, &b, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    r = request((uint64_t)1 << 62, 8);
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_OUT_OF_MEMORY);
    CHECK(live() == 0);

    /* Identity: every wrong field is refused with its own code, and the
     * allocation survives every refusal. */
    r = request(100, 16);
    b = empty_block();
    EXPECT(g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_OK);
    o = ref_of(&r, &b);
    bad = o;
    bad.mechanism_id = 2;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_WRONG_MECHANISM);
    bad = o;
    bad.device.kind = MEMPLUG_DEVICE_CUDA;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_WRONG_DEVICE);
    bad = o;
    bad.device.ordinal = 3;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_WRONG_DEVICE);
    bad = o;
    bad.handle = 0;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    bad = o;
    bad.handle = 0xffffffffffffffffu;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    bad = o;
    bad.handle += (uint64_t)1 << 32; /* right slot, wrong generation */
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    bad = o;
    bad.object_id += 1;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    bad = o;
    bad.addr += 16;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    bad = o;
    bad.size += 1;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    bad = o;
    bad.struct_size = 8;
    EXPECT(g_alloc->deallocate(g_mech->ctx, &bad, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    EXPECT(g_alloc->deallocate(g_mech->ctx, NULL, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    CHECK(live() == 1);
    EXPECT(g_alloc->deallocate(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(live() == 0);
    /* Double free. */
    EXPECT(g_alloc->deallocate(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    /* A stale handle stays stale after its slot is reused. */
    r2 = request(100, 16);
    b2 = empty_block();
    EXPECT(g_alloc->allocate(g_mech->ctx, &r2, &b2, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(b2.handle != b.handle);
    EXPECT(g_alloc->deallocate(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    CHECK(live() == 1);
    o = ref_of(&r2, &b2);
    EXPECT(g_alloc->deallocate(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(live() == 0);

    /* The out block is never written past its struct_size. */
    {
        unsigned char buf[64];
        uint32_t size = MEMPLUG_BLOCK_SIZE_1_0;
        MemplugBlock got;
        size_t i;
        int intact = 1;
        memset(buf, 0xaa, sizeof buf);
        memcpy(buf, &size, sizeof size);
        r = request(10, 8);
        EXPECT(g_alloc->allocate(g_mech->ctx, &r, (MemplugBlock *)(void *)buf, fresh_sink()),
               MEMPLUG_STATUS_OK);
        for (i = MEMPLUG_BLOCK_SIZE_1_0; i < sizeof buf; i++) {
            intact &= buf[i] == 0xaa;
        }
        CHECK(intact);
        memcpy(&got, buf, sizeof got);
        o = ref_of(&r, &got);
        EXPECT(g_alloc->deallocate(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_OK);
        /* A short one is refused before anything is allocated. */
        size = 8;
        memcpy(buf, &size, sizeof size);
        EXPECT(g_alloc->allocate(g_mech->ctx, &r, (MemplugBlock *)(void *)buf, fresh_sink()),
               MEMPLUG_STATUS_INVALID_ARGUMENT);
        CHECK(live() == 0);
    }

    /* The table is finite; running out is OUT_OF_MEMORY, not a crash. */
    {
        enum { MAX_TRY = 10000 };
        static MemplugObjectRef refs[MAX_TRY];
        int n = 0, i;
        MemplugStatus st = MEMPLUG_STATUS_OK;
        while (n < MAX_TRY) {
            r = request(8, 8);
            b = empty_block();
            st = g_alloc->allocate(g_mech->ctx, &r, &b, fresh_sink());
            if (st != MEMPLUG_STATUS_OK) {
                break;
            }
            refs[n++] = ref_of(&r, &b);
        }
        CHECK(st == MEMPLUG_STATUS_OUT_OF_MEMORY && g_msg.len > 0);
        CHECK(live() == (uint64_t)n);
        for (i = 0; i < n; i++) {
            EXPECT(g_alloc->deallocate(g_mech->ctx, &refs[i], fresh_sink()), MEMPLUG_STATUS_OK);
        }
        CHECK(live() == 0);
    }
}

/* ---- virtual backing --------------------------------------------------- */

/* Returns 1 when writing to `p` in a child process faults. */
static int write_faults(volatile unsigned char *p)
{
    int status = 0;
    pid_t pid = fork();
    if (pid == 0) {
        *p = 1;
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        return 0;
    }
    /* Killed by SIGSEGV, or (under a sanitizer) exited reporting it. */
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static uint64_t committed(const MemplugObjectRef *o)
{
    uint64_t n = 12345;
    EXPECT(g_vb->committed_bytes(g_mech->ctx, o, &n, fresh_sink()), MEMPLUG_STATUS_OK);
    return n;
}

static void test_virtual_backing(void)
{
    MemplugRequest r, ra;
    MemplugBlock b, ba;
    MemplugObjectRef o, oa, bad;
    const uint64_t pg = g_page;
    unsigned char *base;
    uint64_t n;

    r = request(16 * pg + 1, 0); /* alignment is ignored by reserve */
    b = empty_block();
    EXPECT(g_vb->reserve(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(b.size == 17 * pg);
    CHECK(b.addr % pg == 0);
    CHECK(live() == 1);
    o = ref_of(&r, &b);
    base = (unsigned char *)(uintptr_t)b.addr;
    CHECK(committed(&o) == 0);
    CHECK(write_faults(base));

    /* Commit two pages, use them. */
    EXPECT(g_vb->commit(g_mech->ctx, &o, 0, 2 * pg, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(committed(&o) == 2 * pg);
    memset(base, 0x77, (size_t)(2 * pg));
    CHECK(base[2 * pg - 1] == 0x77);
    CHECK(write_faults(base + 2 * pg));

    /* Double commit (overlapping) and decommit of uncommitted pages. */
    EXPECT(g_vb->commit(g_mech->ctx, &o, pg, 2 * pg, fresh_sink()), MEMPLUG_STATUS_INVALID_STATE);
    EXPECT(g_vb->commit(g_mech->ctx, &o, 0, pg, fresh_sink()), MEMPLUG_STATUS_INVALID_STATE);
    EXPECT(g_vb->decommit(g_mech->ctx, &o, pg, 2 * pg, fresh_sink()), MEMPLUG_STATUS_INVALID_STATE);
    EXPECT(g_vb->decommit(g_mech->ctx, &o, 4 * pg, pg, fresh_sink()), MEMPLUG_STATUS_INVALID_STATE);
    CHECK(committed(&o) == 2 * pg);
    CHECK(base[pg] == 0x77); /* a refused decommit changed nothing */

    /* Ranges: unaligned, empty, out of bounds, overflowing. */
    EXPECT(g_vb->commit(g_mech->ctx, &o, 1, pg, fresh_sink()), MEMPLUG_STATUS_OUT_OF_RANGE);
    EXPECT(g_vb->commit(g_mech->ctx, &o, 4 * pg, pg + 1, fresh_sink()), MEMPLUG_STATUS_OUT_OF_RANGE);
    EXPECT(g_vb->commit(g_mech->ctx, &o, 4 * pg, 0, fresh_sink()), MEMPLUG_STATUS_OUT_OF_RANGE);
    EXPECT(g_vb->commit(g_mech->ctx, &o, 16 * pg, 2 * pg, fresh_sink()), MEMPLUG_STATUS_OUT_OF_RANGE);
    EXPECT(g_vb->commit(g_mech->ctx, &o, 17 * pg, pg, fresh_sink()), MEMPLUG_STATUS_OUT_OF_RANGE);
    EXPECT(g_vb->commit(g_mech->ctx, &o, 4 * pg, (uint64_t)0 - pg, fresh_sink()),
           MEMPLUG_STATUS_OUT_OF_RANGE);
    EXPECT(g_vb->decommit(g_mech->ctx, &o, (uint64_t)0 - pg, 2 * pg, fresh_sink()),
           MEMPLUG_STATUS_OUT_OF_RANGE);
    CHECK(committed(&o) == 2 * pg);

    /* The last page, exactly in bounds. */
    EXPECT(g_vb->commit(g_mech->ctx, &o, 16 * pg, pg, fresh_sink()), MEMPLUG_STATUS_OK);
    base[17 * pg - 1] = 1;
    CHECK(committed(&o) == 3 * pg);

    /* Decommit one page: inaccessible, reads as zeros after re-commit. */
    EXPECT(g_vb->decommit(g_mech->ctx, &o, pg, pg, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(committed(&o) == 2 * pg);
    CHECK(write_faults(base + pg));
    CHECK(base[0] == 0x77);
    EXPECT(g_vb->commit(g_mech->ctx, &o, pg, pg, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(base[pg] == 0 && base[2 * pg - 1] == 0);
    CHECK(committed(&o) == 3 * pg);

    /* Identity on reservations. */
    bad = o;
    bad.mechanism_id = 9;
    EXPECT(g_vb->commit(g_mech->ctx, &bad, 4 * pg, pg, fresh_sink()), MEMPLUG_STATUS_WRONG_MECHANISM);
    bad = o;
    bad.device.kind = 99;
    EXPECT(g_vb->decommit(g_mech->ctx, &bad, 0, pg, fresh_sink()), MEMPLUG_STATUS_WRONG_DEVICE);
    bad = o;
    bad.handle ^= 0x4;
    EXPECT(g_vb->committed_bytes(g_mech->ctx, &bad, &n, fresh_sink()),
           MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    EXPECT(g_vb->committed_bytes(g_mech->ctx, &o, NULL, fresh_sink()),
           MEMPLUG_STATUS_INVALID_ARGUMENT);
    /* An allocation is not a reservation, and the other way round. */
    ra = request(64, 8);
    ba = empty_block();
    EXPECT(g_alloc->allocate(g_mech->ctx, &ra, &ba, fresh_sink()), MEMPLUG_STATUS_OK);
    oa = ref_of(&ra, &ba);
    EXPECT(g_vb->commit(g_mech->ctx, &oa, 0, pg, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    EXPECT(g_vb->release(g_mech->ctx, &oa, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    EXPECT(g_alloc->deallocate(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    CHECK(live() == 2);
    EXPECT(g_alloc->deallocate(g_mech->ctx, &oa, fresh_sink()), MEMPLUG_STATUS_OK);

    /* Release with pages still committed, then it is gone. */
    EXPECT(g_vb->release(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_OK);
    CHECK(live() == 0);
    EXPECT(g_vb->release(g_mech->ctx, &o, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    EXPECT(g_vb->commit(g_mech->ctx, &o, 0, pg, fresh_sink()), MEMPLUG_STATUS_UNKNOWN_ALLOCATION);
    EXPECT(g_vb->committed_bytes(g_mech->ctx, &o, &n, fresh_sink()),
           MEMPLUG_STATUS_UNKNOWN_ALLOCATION);

    /* Malformed reserve requests. */
    b = empty_block();
    r = request(0, 0);
    EXPECT(g_vb->reserve(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_INVALID_ARGUMENT);
    r = request(pg, 0);
    r.device.ordinal = 2;
    EXPECT(g_vb->reserve(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_WRONG_DEVICE);
    r = request((uint64_t)0 - 1, 0);
    EXPECT(g_vb->reserve(g_mech->ctx, &r, &b, fresh_sink()), MEMPLUG_STATUS_OUT_OF_MEMORY);
    CHECK(live() == 0);
}

/* ---- threads ------------------------------------------------------------ */

#define THREADS 8
#define ROUNDS 500

static void *worker(void *arg)
{
    int i;
    MemplugRequest r;
    MemplugBlock b;
    MemplugObjectRef o;
    long bad = 0;

    (void)arg;
    for (i = 0; i < ROUNDS; i++) {
        r = request((uint64_t)(i % 97 + 1) * 8, 64);
        b = empty_block();
        if (g_alloc->allocate(g_mech->ctx, &r, &b, NULL) != MEMPLUG_STATUS_OK) {
            bad++;
            continue;
        }
        memset((void *)(uintptr_t)b.addr, i, (size_t)b.size);
        o = ref_of(&r, &b);
        bad += g_alloc->deallocate(g_mech->ctx, &o, NULL) != MEMPLUG_STATUS_OK;
        bad += g_alloc->deallocate(g_mech->ctx, &o, NULL) != MEMPLUG_STATUS_UNKNOWN_ALLOCATION;

        r = request(4 * g_page, 0);
        b = empty_block();
        if (g_vb->reserve(g_mech->ctx, &r, &b, NULL) != MEMPLUG_STATUS_OK) {
            bad++;
            continue;
        }
        o = ref_of(&r, &b);
        bad += g_vb->commit(g_mech->ctx, &o, g_page, 2 * g_page, NULL) != MEMPLUG_STATUS_OK;
        ((unsigned char *)(uintptr_t)b.addr)[g_page] = 1;
        bad += g_vb->decommit(g_mech->ctx, &o, g_page, g_page, NULL) != MEMPLUG_STATUS_OK;
        bad += g_vb->release(g_mech->ctx, &o, NULL) != MEMPLUG_STATUS_OK;
    }
    return (void *)(intptr_t)bad;
}

static void test_threads(void)
{
    pthread_t t[THREADS];
    int i;
    for (i = 0; i < THREADS; i++) {
        CHECK(pthread_create(&t[i], NULL, worker, NULL) == 0);
    }
    for (i = 0; i < THREADS; i++) {
        void *bad = NULL;
        pthread_join(t[i], &bad);
        CHECK(bad == NULL);
    }
    CHECK(live() == 0);
}

int main(int argc, char **argv)
{
    void *lib;
    void *sym;

    if (argc != 2) {
        fprintf(stderr, "usage: %s PLUGIN.so\n", argv[0]);
        return 2;
    }
    /* A deadlock or a hang fails the test instead of stalling it. */
    alarm(120);
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    sym = dlsym(lib, MEMPLUG_ENTRY_SYMBOL_V1);
    if (sym == NULL) {
        fprintf(stderr, "no %s: %s\n", MEMPLUG_ENTRY_SYMBOL_V1, dlerror());
        return 1;
    }
    /* ISO C forbids casting void * to a function pointer; copy the bits. */
    memcpy(&g_entry, &sym, sizeof g_entry);

    test_negotiation();
    test_descriptors();
    test_allocator();
    test_virtual_backing();
    test_threads();

    dlclose(lib);
    if (g_failures != 0) {
        fprintf(stderr, "%d of %d checks failed\n", g_failures, g_checks);
        return 1;
    }
    printf("all %d checks passed\n", g_checks);
    return 0;
}
