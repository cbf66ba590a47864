/*
 * contract_violations.c: a compact plugin with every capability of ABI 1.1
 * (allocator, virtual backing, shared mapping with export/import, sync),
 * correct when built plainly, with one planted violation of a rule of
 * include/memplug.h per -DVIOLATE_<NAME> variant. The conformance kit's
 * contract tests (abi-tests/tests/kit_contract.rs) build each variant and
 * check that exactly the kit check named for it fails.
 *
 *   cc -std=c99 -shared -fPIC -fvisibility=hidden -I include \
 *      [-DVIOLATE_<NAME>] abi-tests/c/contract_violations.c -o libcv.so -lpthread
 *
 * Variant                     The planted bug                         Caught by
 * --------------------------- --------------------------------------- ----------------------------------
 * VIOLATE_EXPORT_OWN_FD       export_fd hands out the object's own    shared_mapping.export_is_fresh_fd
 *                             memfd (and closes it at release)
 * VIOLATE_EXPORT_KEPT_DUP     export_fd hands out a new dup each      shared_mapping.export_is_fresh_fd
 *                             time, but keeps it and closes it when
 *                             the object goes
 * VIOLATE_RELEASE_KEEPS_MAPS  releasing a reservation drops its       virtual_backing.release_drops_mappings
 *                             mappings but not their references
 * VIOLATE_DESTROY_FENCES      stream_destroy destroys the fences      sync.fence_after_stream_destroy
 *                             recorded on the stream
 * VIOLATE_WAIT_FOREVER        fence_wait computes now + timeout_ns    sync.wait_forever
 *                             in 64 bits: UINT64_MAX wraps, TIMEOUT
 * VIOLATE_FENCE_REGRESS       a complete fence answers fence_query    sync.fence_monotonic
 *                             NOT_READY after its third report
 * VIOLATE_PHYS_IDENTITY       physical-object calls look at the       shared_mapping.physical_identity
 *                             handle only (no mechanism, device,
 *                             object id or size check)
 * VIOLATE_EXPORT_AT_1_0       a host that agreed on 1.0 gets the 1.1  descriptor.minor_0_is_1_0
 *                             descriptor (MEMPLUG_CAP_SHARED_EXPORT)
 * VIOLATE_BLOCK_SIZE          allocate reports 2^62 bytes             allocator.block_size_sane
 * VIOLATE_SAME_ADDRESS        with 48 allocations live, a request     identity.no_overlap
 *                             that fits in the newest block gets
 *                             that block's address again
 * VIOLATE_RUN_REFUSED         enqueue_host_fn on stream 0 runs the    sync.enqueue_refusal
 *                             function ("default stream") yet
 *                             returns UNKNOWN_ALLOCATION
 * VIOLATE_COUNTS_MAPPED       committed_bytes also counts the bytes   shared_mapping.mapped_not_committed
 *                             mapped into the reservation
 * VIOLATE_MAP_TRYLOCK         map takes its lock with trylock and     concurrency.shared_mapping
 *                             refuses (INTERNAL) when another map
 *                             holds it
 * VIOLATE_DESTROY_DROPS_WORK  stream_destroy throws away the work     sync.streams (the work was dropped,
 *                             queued on the stream instead of         not run late)
 *                             running it
 * VIOLATE_DESTROY_EARLY       stream_destroy returns at once; the     sync.streams (returned before the
 *                             worker runs the queue afterwards        work ran, which ran later)
 * VIOLATE_EXPORT_KIT_FD       export_fd answers descriptor 3 (the     shared_mapping.export_is_fresh_fd
 *                             number its first memfd had in the       (the kit's own descriptor, named)
 *                             plugin author's test program), which
 *                             is not its own
 *
 * The planted bugs are built so that they never make the kit touch memory
 * that is not its own: the duplicated address is never freed twice, the
 * plugin's own descriptor (or a kept duplicate) is closed only while it
 * still names the object's memfd, a refused host function is run before
 * the call returns.
 *
 * One global lock guards every table; it is never held across a call into
 * the host (messages are delivered, host functions run, after unlocking).
 */

#define _GNU_SOURCE 1

#include "memplug.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if (defined(VIOLATE_EXPORT_OWN_FD) + defined(VIOLATE_EXPORT_KEPT_DUP) + defined(VIOLATE_RELEASE_KEEPS_MAPS) + \
     defined(VIOLATE_DESTROY_FENCES) + defined(VIOLATE_WAIT_FOREVER) + defined(VIOLATE_FENCE_REGRESS) +         \
     defined(VIOLATE_PHYS_IDENTITY) + defined(VIOLATE_EXPORT_AT_1_0) + defined(VIOLATE_BLOCK_SIZE) +             \
     defined(VIOLATE_SAME_ADDRESS) + defined(VIOLATE_RUN_REFUSED) + defined(VIOLATE_MAP_TRYLOCK) +               \
     defined(VIOLATE_COUNTS_MAPPED) + defined(VIOLATE_DESTROY_DROPS_WORK) + defined(VIOLATE_DESTROY_EARLY) +      \
     defined(VIOLATE_EXPORT_KIT_FD)) > 1
#error "define at most one VIOLATE_* variant"
#endif

#define CV_MECHANISM_ID 5u
#define CV_MIN_ALIGNMENT ((uint64_t)16)
#define CV_MAX_ALIGNMENT ((uint64_t)4096)
/* Largest object made at all: larger requests are OUT_OF_MEMORY. */
#define CV_MAX_SIZE ((uint64_t)1 << 40)

#define CV_ALLOCS 1024u
#define CV_RESERVATIONS 256u
#define CV_PHYSICAL 256u
#define CV_MAPPINGS 1024u
#define CV_STREAMS 64u
#define CV_FENCES 1024u

#if defined(__GNUC__) || defined(__clang__)
#define CV_UNUSED __attribute__((unused))
#else
#define CV_UNUSED
#endif

/* ------------------------------------------------------------------------ */
/* Messages, locks                                                          */
/* ------------------------------------------------------------------------ */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* Broadcast when a fence completes or a stream's queue changes. */
static pthread_cond_t g_cv;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint64_t g_live;

static void init_cv(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cv, &a);
    pthread_condattr_destroy(&a);
}

static void lock(void)
{
    pthread_once(&g_once, init_cv);
    pthread_mutex_lock(&g_lock);
}

static void unlock(void)
{
    pthread_mutex_unlock(&g_lock);
}

/* Delivers a static message on the calling thread; returns `st`. */
static MemplugStatus say(const MemplugMessageSink *sink, MemplugStatus st, const char *msg)
{
    if (sink != NULL && sink->write != NULL && msg != NULL) {
        sink->write(sink->ctx, msg, strlen(msg));
    }
    return st;
}

/* ------------------------------------------------------------------------ */
/* Handles and host structs                                                 */
/* ------------------------------------------------------------------------ */

enum cv_kind { K_ALLOC = 1, K_RES, K_PHYS, K_STREAM, K_FENCE };

static uint64_t make_handle(enum cv_kind kind, uint32_t index, uint32_t gen)
{
    return (uint64_t)gen << 32 | (uint64_t)kind << 24 | (uint64_t)(index + 1u);
}

/* The slot index a handle of `kind` names, or -1. */
static long handle_index(uint64_t h, enum cv_kind kind, uint32_t limit)
{
    uint64_t low = h & 0xffffffu;
    if (((h >> 24) & 0xffu) != (uint64_t)kind || low == 0 || low > limit) {
        return -1;
    }
    return (long)(low - 1u);
}

static uint32_t handle_gen(uint64_t h)
{
    return (uint32_t)(h >> 32);
}

static uint64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096u;
}

/* Copies a host struct of at least `min` bytes into a zeroed local. */
static MemplugStatus read_prefix(void *local, size_t local_size, const void *src, uint32_t min, const char **why)
{
    uint32_t declared;
    if (src == NULL) {
        *why = "contract_violations: a required struct is NULL";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memcpy(&declared, src, sizeof declared);
    if (declared < min) {
        *why = "contract_violations: struct_size is shorter than ABI 1.0's";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memset(local, 0, local_size);
    memcpy(local, src, declared < local_size ? declared : local_size);
    return MEMPLUG_STATUS_OK;
}

/* An out-struct able to hold at least `min` bytes. */
static MemplugStatus check_out(const void *out, uint32_t min, const char **why)
{
    uint32_t declared;
    if (out == NULL) {
        *why = "contract_violations: the output is NULL";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memcpy(&declared, out, sizeof declared);
    if (declared < min) {
        *why = "contract_violations: the output's struct_size is shorter than ABI 1.0's";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    return MEMPLUG_STATUS_OK;
}

/* Writes `value` after the host's struct_size field, never past it. */
static void write_prefix(void *out, const void *value, size_t value_size)
{
    uint32_t declared;
    size_t n;
    memcpy(&declared, out, sizeof declared);
    n = declared < value_size ? declared : value_size;
    memcpy((unsigned char *)out + 4, (const unsigned char *)value + 4, n - 4);
}

static void write_block(MemplugBlock *out, uint64_t addr, uint64_t size, uint64_t handle)
{
    MemplugBlock b;
    memset(&b, 0, sizeof b);
    b.addr = addr;
    b.size = size;
    b.handle = handle;
    write_prefix(out, &b, sizeof b);
}

static int is_our_device(MemplugDevice d)
{
    return d.kind == MEMPLUG_DEVICE_CPU && d.ordinal == 0;
}

/* A request for allocate/reserve/create/import_fd. */
static MemplugStatus check_request(const MemplugRequest *request, MemplugRequest *r, const char **why)
{
    MemplugStatus st = read_prefix(r, sizeof *r, request, MEMPLUG_REQUEST_SIZE_1_0, why);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (!is_our_device(r->device)) {
        *why = "contract_violations: the request names a device other than CPU 0";
        return MEMPLUG_STATUS_WRONG_DEVICE;
    }
    if (r->flags != 0) {
        *why = "contract_violations: unknown request flags";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    if (r->size == 0) {
        *why = "contract_violations: size is zero";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    if (r->size > CV_MAX_SIZE) {
        *why = "contract_violations: no memory for that size";
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    return MEMPLUG_STATUS_OK;
}

/* Reads a reference and checks mechanism and device. */
static MemplugStatus check_ref(const MemplugObjectRef *object, MemplugObjectRef *ref, const char **why)
{
    MemplugStatus st = read_prefix(ref, sizeof *ref, object, MEMPLUG_OBJECT_REF_SIZE_1_0, why);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (ref->mechanism_id != CV_MECHANISM_ID) {
        *why = "contract_violations: the object belongs to another mechanism";
        return MEMPLUG_STATUS_WRONG_MECHANISM;
    }
    if (!is_our_device(ref->device)) {
        *why = "contract_violations: the object lives on another device";
        return MEMPLUG_STATUS_WRONG_DEVICE;
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus unknown(const char **why, const char *msg)
{
    *why = msg;
    return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
}

/* Checks (offset, len) inside an object of `limit` bytes. */
static MemplugStatus check_range(uint64_t offset, uint64_t len, uint64_t limit, const char **why)
{
    uint64_t g = page_size();
    if (len == 0) {
        *why = "contract_violations: empty range";
        return MEMPLUG_STATUS_OUT_OF_RANGE;
    }
    if (offset % g != 0 || len % g != 0) {
        *why = "contract_violations: range not aligned to the granularity";
        return MEMPLUG_STATUS_OUT_OF_RANGE;
    }
    if (offset > UINT64_MAX - len) {
        *why = "contract_violations: offset + len overflows";
        return MEMPLUG_STATUS_OUT_OF_RANGE;
    }
    if (offset + len > limit) {
        *why = "contract_violations: range lies past the end of its object";
        return MEMPLUG_STATUS_OUT_OF_RANGE;
    }
    return MEMPLUG_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Allocator                                                                 */
/* ------------------------------------------------------------------------ */

struct cv_alloc {
    int used;
    uint32_t gen;
    uint64_t object_id, addr, size;
    void *mem; /* NULL for an alias (VIOLATE_SAME_ADDRESS): never freed */
};

static struct cv_alloc g_allocs[CV_ALLOCS];
static uint32_t g_alloc_live;
static CV_UNUSED long g_newest_alloc = -1;

static MemplugStatus cv_properties(void *ctx, MemplugProperties *out, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugProperties p;
    (void)ctx;
    if (check_out(out, MEMPLUG_PROPERTIES_SIZE_1_0, &why) != MEMPLUG_STATUS_OK) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, why);
    }
    memset(&p, 0, sizeof p);
    p.min_alignment = CV_MIN_ALIGNMENT;
    p.max_alignment = CV_MAX_ALIGNMENT;
    p.granularity = page_size();
    write_prefix(out, &p, sizeof p);
    return MEMPLUG_STATUS_OK;
}

static long free_slot_alloc(void)
{
    uint32_t i;
    for (i = 0; i < CV_ALLOCS; i++) {
        if (!g_allocs[i].used) {
            return (long)i;
        }
    }
    return -1;
}

static MemplugStatus cv_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                 const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugRequest r;
    MemplugStatus st;
    void *mem = NULL;
    uint64_t align, addr, reported;
    long i;
    (void)ctx;
    st = check_request(request, &r, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, &why);
    }
    if (st == MEMPLUG_STATUS_OK && (r.alignment == 0 || (r.alignment & (r.alignment - 1u)) != 0)) {
        why = "contract_violations: alignment is not a power of two";
        st = MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    if (st == MEMPLUG_STATUS_OK && r.alignment > CV_MAX_ALIGNMENT) {
        why = "contract_violations: alignment above max_alignment";
        st = MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    align = r.alignment < CV_MIN_ALIGNMENT ? CV_MIN_ALIGNMENT : r.alignment;
    lock();
    i = free_slot_alloc();
    if (i < 0) {
        unlock();
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: allocation table full");
    }
#ifdef VIOLATE_SAME_ADDRESS
    /* Planted: past 48 live allocations the plugin "reuses" the newest
     * block for a request that fits in it, while that block is still live. */
    if (g_alloc_live >= 48 && g_newest_alloc >= 0 && g_allocs[g_newest_alloc].used &&
        g_allocs[g_newest_alloc].size >= r.size) {
        addr = g_allocs[g_newest_alloc].addr;
    } else
#endif
    {
        if (posix_memalign(&mem, (size_t)align, (size_t)r.size) != 0 || mem == NULL) {
            unlock();
            return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: posix_memalign failed");
        }
        addr = (uint64_t)(uintptr_t)mem;
    }
    reported = r.size;
#ifdef VIOLATE_BLOCK_SIZE
    /* Planted: the block claims 2^62 bytes, whatever was asked. */
    reported = (uint64_t)1 << 62;
#endif
    g_allocs[i].used = 1;
    g_allocs[i].object_id = r.object_id;
    g_allocs[i].addr = addr;
    g_allocs[i].size = reported;
    g_allocs[i].mem = mem;
    g_newest_alloc = i;
    g_alloc_live++;
    g_live++;
    write_block(out, addr, reported, make_handle(K_ALLOC, (uint32_t)i, g_allocs[i].gen));
    unlock();
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus find_alloc(const MemplugObjectRef *ref, long *out, const char **why)
{
    long i = handle_index(ref->handle, K_ALLOC, CV_ALLOCS);
    struct cv_alloc *a;
    if (i < 0) {
        return unknown(why, "contract_violations: the handle names no allocation");
    }
    a = &g_allocs[i];
    if (!a->used || a->gen != handle_gen(ref->handle)) {
        return unknown(why, "contract_violations: the allocation is not live (freed?)");
    }
    if (a->object_id != ref->object_id || a->addr != ref->addr || a->size != ref->size) {
        return unknown(why, "contract_violations: the reference contradicts the allocation");
    }
    *out = i;
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_deallocate(void *ctx, const MemplugObjectRef *object, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef ref;
    MemplugStatus st;
    void *mem = NULL;
    long i = -1;
    (void)ctx;
    st = check_ref(object, &ref, &why);
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    lock();
    st = find_alloc(&ref, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        mem = g_allocs[i].mem;
        g_allocs[i].used = 0;
        g_allocs[i].gen++;
        g_allocs[i].mem = NULL;
        g_alloc_live--;
        g_live--;
    }
    unlock();
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    free(mem);
    return MEMPLUG_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Virtual backing                                                           */
/* ------------------------------------------------------------------------ */

enum { PAGE_FREE = 0, PAGE_COMMITTED = 1, PAGE_MAPPED = 2 };

struct cv_res {
    int used;
    uint32_t gen;
    uint64_t object_id, addr, size, committed;
    unsigned char *pages;
};

struct cv_phys {
    int used;
    uint32_t gen;
    uint64_t object_id, size, host_refs, map_refs;
    int fd;
    dev_t dev;
    ino_t ino;
    /* VIOLATE_EXPORT_KEPT_DUP: the descriptors handed out, kept. */
    int kept[8];
    uint32_t nkept;
};

struct cv_map {
    int used;
    uint32_t res, phys;
    uint64_t offset, len;
};

static struct cv_res g_res[CV_RESERVATIONS];
static struct cv_phys g_phys[CV_PHYSICAL];
static struct cv_map g_maps[CV_MAPPINGS];

static MemplugStatus find_res(const MemplugObjectRef *ref, long *out, const char **why)
{
    long i = handle_index(ref->handle, K_RES, CV_RESERVATIONS);
    struct cv_res *r;
    if (i < 0) {
        return unknown(why, "contract_violations: the handle names no reservation");
    }
    r = &g_res[i];
    if (!r->used || r->gen != handle_gen(ref->handle)) {
        return unknown(why, "contract_violations: the reservation is not live (released?)");
    }
    if (r->object_id != ref->object_id || r->addr != ref->addr || r->size != ref->size) {
        return unknown(why, "contract_violations: the reference contradicts the reservation");
    }
    *out = i;
    return MEMPLUG_STATUS_OK;
}

static int pages_are(const struct cv_res *r, uint64_t offset, uint64_t len, unsigned char state)
{
    uint64_t g = page_size(), p;
    for (p = offset / g; p < (offset + len) / g; p++) {
        if (r->pages[p] != state) {
            return 0;
        }
    }
    return 1;
}

static void set_pages(struct cv_res *r, uint64_t offset, uint64_t len, unsigned char state)
{
    uint64_t g = page_size();
    memset(r->pages + offset / g, state, (size_t)(len / g));
}

static MemplugStatus cv_reserve(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugRequest r;
    MemplugStatus st;
    uint64_t g = page_size(), size;
    unsigned char *pages;
    void *base;
    uint32_t i;
    (void)ctx;
    st = check_request(request, &r, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, &why);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    size = (r.size + g - 1u) / g * g;
    pages = calloc((size_t)(size / g), 1);
    if (pages == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: no memory for the page map");
    }
    base = mmap(NULL, (size_t)size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        free(pages);
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: mmap of the reservation failed");
    }
    lock();
    for (i = 0; i < CV_RESERVATIONS && g_res[i].used; i++) {
    }
    if (i == CV_RESERVATIONS) {
        unlock();
        munmap(base, (size_t)size);
        free(pages);
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: reservation table full");
    }
    g_res[i].used = 1;
    g_res[i].object_id = r.object_id;
    g_res[i].addr = (uint64_t)(uintptr_t)base;
    g_res[i].size = size;
    g_res[i].committed = 0;
    g_res[i].pages = pages;
    g_live++;
    write_block(out, g_res[i].addr, size, make_handle(K_RES, i, g_res[i].gen));
    unlock();
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus change_commit(const MemplugObjectRef *reservation, uint64_t offset, uint64_t len, int commit,
                                   const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef ref;
    MemplugStatus st;
    struct cv_res *r;
    void *p;
    long i = -1;
    st = check_ref(reservation, &ref, &why);
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    lock();
    st = find_res(&ref, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        r = &g_res[i];
        st = check_range(offset, len, r->size, &why);
        if (st == MEMPLUG_STATUS_OK && !pages_are(r, offset, len, commit ? PAGE_FREE : PAGE_COMMITTED)) {
            why = commit ? "contract_violations: commit: part of the range is committed or mapped"
                         : "contract_violations: decommit: part of the range is not committed";
            st = MEMPLUG_STATUS_INVALID_STATE;
        }
        if (st == MEMPLUG_STATUS_OK) {
            p = (void *)(uintptr_t)(r->addr + offset);
            if (commit) {
                if (mprotect(p, (size_t)len, PROT_READ | PROT_WRITE) != 0) {
                    why = "contract_violations: commit: mprotect failed";
                    st = MEMPLUG_STATUS_OUT_OF_MEMORY;
                }
            } else if (madvise(p, (size_t)len, MADV_DONTNEED) != 0 || mprotect(p, (size_t)len, PROT_NONE) != 0) {
                why = "contract_violations: decommit: madvise or mprotect failed";
                st = MEMPLUG_STATUS_INTERNAL;
            }
        }
        if (st == MEMPLUG_STATUS_OK) {
            set_pages(r, offset, len, commit ? PAGE_COMMITTED : PAGE_FREE);
            r->committed = commit ? r->committed + len : r->committed - len;
        }
    }
    unlock();
    return st == MEMPLUG_STATUS_OK ? st : say(sink, st, why);
}

static MemplugStatus cv_commit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                               const MemplugMessageSink *sink)
{
    (void)ctx;
    return change_commit(reservation, offset, len, 1, sink);
}

static MemplugStatus cv_decommit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                                 const MemplugMessageSink *sink)
{
    (void)ctx;
    return change_commit(reservation, offset, len, 0, sink);
}

static MemplugStatus cv_committed_bytes(void *ctx, const MemplugObjectRef *reservation, uint64_t *out_bytes,
                                        const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef ref;
    MemplugStatus st;
    long i = -1;
    (void)ctx;
    if (out_bytes == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "contract_violations: out_bytes is NULL");
    }
    st = check_ref(reservation, &ref, &why);
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    lock();
    st = find_res(&ref, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        *out_bytes = g_res[i].committed;
#ifdef VIOLATE_COUNTS_MAPPED
        {
            uint32_t m;
            for (m = 0; m < CV_MAPPINGS; m++) {
                if (g_maps[m].used && g_maps[m].res == (uint32_t)i) {
                    *out_bytes += g_maps[m].len;
                }
            }
        }
#endif
    }
    unlock();
    return st == MEMPLUG_STATUS_OK ? st : say(sink, st, why);
}

/* Closes the object's memfd if it still names the object's memory (under
 * VIOLATE_EXPORT_OWN_FD the host may already have closed it). */
static void close_if_memfd(int fd, const struct cv_phys *p)
{
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_dev == p->dev && st.st_ino == p->ino) {
        close(fd);
    }
}

static void close_phys_fd(const struct cv_phys *p)
{
    uint32_t k;
    close_if_memfd(p->fd, p);
    for (k = 0; k < p->nkept; k++) {
        /* Planted under VIOLATE_EXPORT_KEPT_DUP: the caller's descriptors. */
        close_if_memfd(p->kept[k], p);
    }
}

/* Under g_lock: drops a physical object whose last reference went; the
 * memfd to close afterwards, or -1. */
static void phys_maybe_free(struct cv_phys *p, struct cv_phys *closed)
{
    if (p->host_refs == 0 && p->map_refs == 0) {
        *closed = *p;
        p->used = 0;
        p->gen++;
        p->fd = -1;
        g_live--;
    }
}

static MemplugStatus cv_release_reservation(void *ctx, const MemplugObjectRef *reservation,
                                            const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef ref;
    MemplugStatus st;
    struct cv_phys closed[CV_PHYSICAL];
    uint32_t nclosed = 0, m, c;
    long i = -1;
    void *base = NULL;
    uint64_t size = 0;
    unsigned char *pages = NULL;
    (void)ctx;
    st = check_ref(reservation, &ref, &why);
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    lock();
    st = find_res(&ref, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        base = (void *)(uintptr_t)g_res[i].addr;
        size = g_res[i].size;
        pages = g_res[i].pages;
        /* munmap below removes the shared mappings with the range. */
        munmap(base, (size_t)size);
        for (m = 0; m < CV_MAPPINGS; m++) {
            if (g_maps[m].used && g_maps[m].res == (uint32_t)i) {
                g_maps[m].used = 0;
#ifndef VIOLATE_RELEASE_KEEPS_MAPS
                /* (Planted under VIOLATE_RELEASE_KEEPS_MAPS: this reference
                 * is never dropped, so the object leaks.) */
                g_phys[g_maps[m].phys].map_refs--;
                phys_maybe_free(&g_phys[g_maps[m].phys], &closed[nclosed]);
                if (!g_phys[g_maps[m].phys].used) {
                    nclosed++;
                }
#endif
            }
        }
        g_res[i].used = 0;
        g_res[i].gen++;
        g_res[i].pages = NULL;
        g_live--;
    }
    unlock();
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    for (c = 0; c < nclosed; c++) {
        close_phys_fd(&closed[c]);
    }
    free(pages);
    return MEMPLUG_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Shared mapping                                                            */
/* ------------------------------------------------------------------------ */

#ifdef VIOLATE_MAP_TRYLOCK
static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;
#endif

static MemplugStatus find_phys(const MemplugObjectRef *ref, long *out, const char **why)
{
    long i = handle_index(ref->handle, K_PHYS, CV_PHYSICAL);
    struct cv_phys *p;
    if (i < 0) {
        return unknown(why, "contract_violations: the handle names no physical object");
    }
    p = &g_phys[i];
    if (!p->used || p->gen != handle_gen(ref->handle) || p->host_refs == 0) {
        return unknown(why, "contract_violations: the physical object is not live (released?)");
    }
#ifndef VIOLATE_PHYS_IDENTITY
    if (p->object_id != ref->object_id || ref->addr != 0 || p->size != ref->size) {
        return unknown(why, "contract_violations: the reference contradicts the physical object");
    }
#endif
    *out = i;
    return MEMPLUG_STATUS_OK;
}

/* Reads a physical object reference: mechanism and device are checked
 * (except under VIOLATE_PHYS_IDENTITY, where only the handle counts). */
static MemplugStatus check_phys_ref(const MemplugObjectRef *object, MemplugObjectRef *ref, const char **why)
{
#ifdef VIOLATE_PHYS_IDENTITY
    return read_prefix(ref, sizeof *ref, object, MEMPLUG_OBJECT_REF_SIZE_1_0, why);
#else
    return check_ref(object, ref, why);
#endif
}

static MemplugStatus insert_phys(uint64_t object_id, uint64_t size, int fd, MemplugBlock *out, const char **why)
{
    struct stat st;
    uint32_t i;
    if (fstat(fd, &st) != 0) {
        *why = "contract_violations: fstat of the memfd failed";
        return MEMPLUG_STATUS_INTERNAL;
    }
    lock();
    for (i = 0; i < CV_PHYSICAL && g_phys[i].used; i++) {
    }
    if (i == CV_PHYSICAL) {
        unlock();
        *why = "contract_violations: physical object table full";
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    g_phys[i].used = 1;
    g_phys[i].object_id = object_id;
    g_phys[i].size = size;
    g_phys[i].host_refs = 1;
    g_phys[i].map_refs = 0;
    g_phys[i].fd = fd;
    g_phys[i].dev = st.st_dev;
    g_phys[i].ino = st.st_ino;
    g_phys[i].nkept = 0;
    g_live++;
    write_block(out, 0, size, make_handle(K_PHYS, i, g_phys[i].gen));
    unlock();
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_create(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                               const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugRequest r;
    MemplugStatus st;
    uint64_t g = page_size(), size;
    int fd;
    (void)ctx;
    st = check_request(request, &r, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, &why);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    size = (r.size + g - 1u) / g * g;
    fd = memfd_create("memplug-contract-violations", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: memfd_create failed");
    }
    if (ftruncate(fd, (off_t)size) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
        close(fd);
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: sizing the memfd failed");
    }
    st = insert_phys(r.object_id, size, fd, out, &why);
    if (st != MEMPLUG_STATUS_OK) {
        close(fd);
        return say(sink, st, why);
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_map(void *ctx, const MemplugObjectRef *object, uint64_t object_offset,
                            const MemplugObjectRef *reservation, uint64_t offset, uint64_t len, uint32_t access,
                            const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef oref, rref;
    MemplugStatus st;
    struct cv_res *r;
    struct cv_phys *p;
    long pi = -1, ri = -1;
    uint32_t m;
    int prot;
    (void)ctx;
    st = check_phys_ref(object, &oref, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_ref(reservation, &rref, &why);
    }
    if (st == MEMPLUG_STATUS_OK && access != MEMPLUG_ACCESS_READ &&
        access != (MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE)) {
        why = "contract_violations: access must be READ or READ|WRITE";
        st = MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
#ifdef VIOLATE_MAP_TRYLOCK
    /* Planted: a second concurrent map is refused instead of waiting. */
    if (pthread_mutex_trylock(&g_map_lock) != 0) {
        return say(sink, MEMPLUG_STATUS_INTERNAL, "contract_violations: map: another map is in progress");
    }
#endif
    lock();
    st = find_phys(&oref, &pi, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = find_res(&rref, &ri, &why);
    }
    if (st == MEMPLUG_STATUS_OK) {
        p = &g_phys[pi];
        r = &g_res[ri];
        st = check_range(offset, len, r->size, &why);
        if (st == MEMPLUG_STATUS_OK) {
            st = check_range(object_offset, len, p->size, &why);
        }
        if (st == MEMPLUG_STATUS_OK && !pages_are(r, offset, len, PAGE_FREE)) {
            why = "contract_violations: map: the range is committed or mapped";
            st = MEMPLUG_STATUS_INVALID_STATE;
        }
        for (m = 0; st == MEMPLUG_STATUS_OK && m < CV_MAPPINGS && g_maps[m].used; m++) {
        }
        if (st == MEMPLUG_STATUS_OK && m == CV_MAPPINGS) {
            why = "contract_violations: mapping table full";
            st = MEMPLUG_STATUS_OUT_OF_MEMORY;
        }
        if (st == MEMPLUG_STATUS_OK) {
            prot = access & MEMPLUG_ACCESS_WRITE ? PROT_READ | PROT_WRITE : PROT_READ;
            if (mmap((void *)(uintptr_t)(r->addr + offset), (size_t)len, prot, MAP_SHARED | MAP_FIXED, p->fd,
                     (off_t)object_offset) == MAP_FAILED) {
                why = "contract_violations: map: mmap failed";
                st = MEMPLUG_STATUS_OUT_OF_MEMORY;
            }
        }
        if (st == MEMPLUG_STATUS_OK) {
            g_maps[m].used = 1;
            g_maps[m].res = (uint32_t)ri;
            g_maps[m].phys = (uint32_t)pi;
            g_maps[m].offset = offset;
            g_maps[m].len = len;
            p->map_refs++;
            set_pages(r, offset, len, PAGE_MAPPED);
        }
    }
    unlock();
#ifdef VIOLATE_MAP_TRYLOCK
    {
        /* ... and the page-table work is slow. */
        struct timespec ts = {0, 300000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_unlock(&g_map_lock);
#endif
    return st == MEMPLUG_STATUS_OK ? st : say(sink, st, why);
}

static MemplugStatus cv_unmap(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                              const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef rref;
    MemplugStatus st;
    struct cv_phys closed;
    int was_freed = 0;
    long ri = -1;
    uint32_t m;
    (void)ctx;
    st = check_ref(reservation, &rref, &why);
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    lock();
    st = find_res(&rref, &ri, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(offset, len, g_res[ri].size, &why);
    }
    if (st == MEMPLUG_STATUS_OK) {
        for (m = 0; m < CV_MAPPINGS; m++) {
            if (g_maps[m].used && g_maps[m].res == (uint32_t)ri && g_maps[m].offset == offset &&
                g_maps[m].len == len) {
                break;
            }
        }
        if (m == CV_MAPPINGS) {
            why = "contract_violations: unmap: no mapping is exactly that range";
            st = MEMPLUG_STATUS_INVALID_STATE;
        } else if (mmap((void *)(uintptr_t)(g_res[ri].addr + offset), (size_t)len, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
            why = "contract_violations: unmap: mmap failed";
            st = MEMPLUG_STATUS_INTERNAL;
        } else {
            g_maps[m].used = 0;
            set_pages(&g_res[ri], offset, len, PAGE_FREE);
            g_phys[g_maps[m].phys].map_refs--;
            phys_maybe_free(&g_phys[g_maps[m].phys], &closed);
            was_freed = !g_phys[g_maps[m].phys].used;
        }
    }
    unlock();
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    if (was_freed) {
        close_phys_fd(&closed);
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_retain(void *ctx, const MemplugObjectRef *object, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef ref;
    MemplugStatus st;
    long i = -1;
    (void)ctx;
    st = check_phys_ref(object, &ref, &why);
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    lock();
    st = find_phys(&ref, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        g_phys[i].host_refs++;
    }
    unlock();
    return st == MEMPLUG_STATUS_OK ? st : say(sink, st, why);
}

static MemplugStatus cv_release(void *ctx, const MemplugObjectRef *object, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef ref;
    MemplugStatus st;
    struct cv_phys closed;
    int was_freed = 0;
    long i = -1;
    (void)ctx;
    st = check_phys_ref(object, &ref, &why);
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    lock();
    st = find_phys(&ref, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        g_phys[i].host_refs--;
        phys_maybe_free(&g_phys[i], &closed);
        was_freed = !g_phys[i].used;
    }
    unlock();
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    if (was_freed) {
        close_phys_fd(&closed);
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_export_fd(void *ctx, const MemplugObjectRef *object, int32_t *out_fd,
                                  const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugObjectRef ref;
    MemplugStatus st;
    long i = -1;
    int fd = -1;
    (void)ctx;
    if (out_fd == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "contract_violations: out_fd is NULL");
    }
    st = check_phys_ref(object, &ref, &why);
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    lock();
    st = find_phys(&ref, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
#if defined(VIOLATE_EXPORT_OWN_FD)
        /* Planted: the caller gets the object's own descriptor, which the
         * plugin closes when the object goes. */
        fd = g_phys[i].fd;
#elif defined(VIOLATE_EXPORT_KIT_FD)
        /* Planted: a number that was never the plugin's. */
        fd = 3;
#else
        fd = fcntl(g_phys[i].fd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0) {
            why = "contract_violations: export_fd: fcntl(F_DUPFD_CLOEXEC) failed";
            st = MEMPLUG_STATUS_OUT_OF_MEMORY;
        }
#ifdef VIOLATE_EXPORT_KEPT_DUP
        /* Planted: the plugin keeps the caller's descriptor, to close it
         * when the object goes. */
        if (fd >= 0 && g_phys[i].nkept < 8) {
            g_phys[i].kept[g_phys[i].nkept++] = fd;
        }
#endif
#endif
    }
    unlock();
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    *out_fd = fd;
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_import_fd(void *ctx, int32_t fd, const MemplugRequest *request, MemplugBlock *out,
                                  const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugRequest r;
    MemplugStatus st;
    struct stat sb;
    uint64_t g = page_size(), size;
    int seals, kept;
    (void)ctx;
    st = check_request(request, &r, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, &why);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "contract_violations: import_fd: not a memory file");
    }
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "contract_violations: import_fd: the memfd is not sealed against shrinking");
    }
    size = (r.size + g - 1u) / g * g;
    if ((uint64_t)sb.st_size < size) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_RANGE,
                   "contract_violations: import_fd: the memory behind the descriptor is too small");
    }
    kept = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (kept < 0) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: import_fd: dup failed");
    }
    st = insert_phys(r.object_id, size, kept, out, &why);
    if (st != MEMPLUG_STATUS_OK) {
        close(kept);
        return say(sink, st, why);
    }
    return MEMPLUG_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Sync: a stream is a worker thread draining a queue; a fence is a flag.   */
/* ------------------------------------------------------------------------ */

struct cv_item {
    struct cv_item *next;
    MemplugHostFn fn; /* NULL: a fence signal */
    void *userdata;
    uint32_t fence, fence_gen;
};

struct cv_queue {
    pthread_t worker;
    struct cv_item *head, *tail;
    int closing;
};

struct cv_stream {
    int used;
    uint32_t gen;
    struct cv_queue *q;
};

struct cv_fence {
    int used;
    uint32_t gen;
    int done;
    unsigned reports;
    uint32_t stream, stream_gen;
};

static struct cv_stream g_streams[CV_STREAMS];
static struct cv_fence g_fences[CV_FENCES];

static void *worker_main(void *arg)
{
    struct cv_queue *q = arg;
    struct cv_item *it;
    lock();
    for (;;) {
        while (q->head == NULL && !q->closing) {
            pthread_cond_wait(&g_cv, &g_lock);
        }
        if (q->head == NULL) {
            break;
        }
        it = q->head;
        q->head = it->next;
        if (q->head == NULL) {
            q->tail = NULL;
        }
        if (it->fn != NULL) {
            unlock();
            it->fn(it->userdata);
            lock();
        } else if (g_fences[it->fence].used && g_fences[it->fence].gen == it->fence_gen) {
            g_fences[it->fence].done = 1;
            pthread_cond_broadcast(&g_cv);
        }
        free(it);
    }
    unlock();
#ifdef VIOLATE_DESTROY_EARLY
    free(q); /* detached by stream_destroy: nobody joins it */
#endif
    return NULL;
}

static MemplugStatus find_stream(uint64_t h, long *out, const char **why)
{
    long i = handle_index(h, K_STREAM, CV_STREAMS);
    if (i < 0 || !g_streams[i].used || g_streams[i].gen != handle_gen(h)) {
        return unknown(why, "contract_violations: the handle names no live stream");
    }
    *out = i;
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus find_fence(uint64_t h, long *out, const char **why)
{
    long i = handle_index(h, K_FENCE, CV_FENCES);
    if (i < 0 || !g_fences[i].used || g_fences[i].gen != handle_gen(h)) {
        return unknown(why, "contract_violations: the handle names no live fence");
    }
    *out = i;
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_stream_create(void *ctx, uint64_t *out_stream, const MemplugMessageSink *sink)
{
    struct cv_queue *q;
    uint32_t i;
    (void)ctx;
    if (out_stream == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "contract_violations: out_stream is NULL");
    }
    q = calloc(1, sizeof *q);
    if (q == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: no memory for a stream");
    }
    lock();
    for (i = 0; i < CV_STREAMS && g_streams[i].used; i++) {
    }
    if (i == CV_STREAMS || pthread_create(&q->worker, NULL, worker_main, q) != 0) {
        unlock();
        free(q);
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: cannot start a stream");
    }
    g_streams[i].used = 1;
    g_streams[i].q = q;
    g_live++;
    *out_stream = make_handle(K_STREAM, i, g_streams[i].gen);
    unlock();
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_stream_destroy(void *ctx, uint64_t stream, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugStatus st;
    struct cv_queue *q = NULL;
    long i = -1;
    CV_UNUSED uint32_t gen = 0, f;
    CV_UNUSED pthread_t worker;
    (void)ctx;
    lock();
    st = find_stream(stream, &i, &why);
    if (st == MEMPLUG_STATUS_OK && pthread_equal(pthread_self(), g_streams[i].q->worker)) {
        why = "contract_violations: stream_destroy from one of the stream's own host functions";
        st = MEMPLUG_STATUS_BUSY;
    }
    if (st == MEMPLUG_STATUS_OK) {
        q = g_streams[i].q;
        gen = g_streams[i].gen;
        g_streams[i].used = 0;
        g_streams[i].gen++;
        g_streams[i].q = NULL;
        g_live--;
        q->closing = 1;
        worker = q->worker;
        pthread_cond_broadcast(&g_cv);
    }
#ifdef VIOLATE_DESTROY_DROPS_WORK
    /* Planted: the queued work is thrown away, never run. */
    while (q != NULL && q->head != NULL) {
        struct cv_item *dropped = q->head;
        q->head = dropped->next;
        free(dropped);
    }
    if (q != NULL) {
        q->tail = NULL;
    }
#endif
    unlock();
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
#ifdef VIOLATE_DESTROY_EARLY
    /* Planted: the caller is not kept waiting; the worker runs the queue
     * after destroy returned (and frees the queue itself, so only the
     * thread id read under the lock is used here). */
    pthread_detach(worker);
#else
    pthread_join(q->worker, NULL);
    free(q);
#endif
#ifdef VIOLATE_DESTROY_FENCES
    /* Planted: the stream takes its fences with it. */
    lock();
    for (f = 0; f < CV_FENCES; f++) {
        if (g_fences[f].used && g_fences[f].stream == (uint32_t)i && g_fences[f].stream_gen == gen) {
            g_fences[f].used = 0;
            g_fences[f].gen++;
            g_live--;
        }
    }
    unlock();
#endif
    return MEMPLUG_STATUS_OK;
}

static void push(struct cv_queue *q, struct cv_item *it)
{
    it->next = NULL;
    if (q->tail != NULL) {
        q->tail->next = it;
    } else {
        q->head = it;
    }
    q->tail = it;
    pthread_cond_broadcast(&g_cv);
}

static MemplugStatus cv_enqueue_host_fn(void *ctx, uint64_t stream, MemplugHostFn func, void *userdata,
                                        const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugStatus st;
    struct cv_item *it;
    long i = -1;
    (void)ctx;
    if (func == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "contract_violations: func is NULL");
    }
#ifdef VIOLATE_RUN_REFUSED
    /* Planted: 0 is taken for "the default stream": the function runs, but
     * the lookup's failure is what the caller hears. */
    if (stream == 0) {
        func(userdata);
        return say(sink, MEMPLUG_STATUS_UNKNOWN_ALLOCATION, "contract_violations: stream 0 names no stream");
    }
#endif
    it = calloc(1, sizeof *it);
    if (it == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: no memory for the work item");
    }
    it->fn = func;
    it->userdata = userdata;
    lock();
    st = find_stream(stream, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        push(g_streams[i].q, it);
    }
    unlock();
    if (st != MEMPLUG_STATUS_OK) {
        free(it);
        return say(sink, st, why);
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_fence_record(void *ctx, uint64_t stream, uint64_t *out_fence,
                                     const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugStatus st;
    struct cv_item *it;
    long i = -1;
    uint32_t f = 0;
    (void)ctx;
    if (out_fence == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "contract_violations: out_fence is NULL");
    }
    it = calloc(1, sizeof *it);
    if (it == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "contract_violations: no memory for the fence");
    }
    lock();
    st = find_stream(stream, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        for (f = 0; f < CV_FENCES && g_fences[f].used; f++) {
        }
        if (f == CV_FENCES) {
            why = "contract_violations: fence table full";
            st = MEMPLUG_STATUS_OUT_OF_MEMORY;
        }
    }
    if (st == MEMPLUG_STATUS_OK) {
        g_fences[f].used = 1;
        g_fences[f].done = 0;
        g_fences[f].reports = 0;
        g_fences[f].stream = (uint32_t)i;
        g_fences[f].stream_gen = g_streams[i].gen;
        g_live++;
        it->fence = f;
        it->fence_gen = g_fences[f].gen;
        push(g_streams[i].q, it);
        *out_fence = make_handle(K_FENCE, f, g_fences[f].gen);
    }
    unlock();
    if (st != MEMPLUG_STATUS_OK) {
        free(it);
        return say(sink, st, why);
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus cv_fence_query(void *ctx, uint64_t fence, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugStatus st;
    long i = -1;
    (void)ctx;
    lock();
    st = find_fence(fence, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = g_fences[i].done ? MEMPLUG_STATUS_OK : MEMPLUG_STATUS_NOT_READY;
        if (st == MEMPLUG_STATUS_OK) {
            g_fences[i].reports++;
#ifdef VIOLATE_FENCE_REGRESS
            /* Planted: a completion is reported three times at most. */
            if (g_fences[i].reports > 3) {
                st = MEMPLUG_STATUS_NOT_READY;
            }
#endif
        }
        unlock();
        return st;
    }
    unlock();
    return say(sink, st, why);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static MemplugStatus cv_fence_wait(void *ctx, uint64_t fence, uint64_t timeout_ns, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugStatus st;
    struct timespec ts;
    uint64_t start = now_ns(), deadline;
    int forever;
    long i = -1;
    (void)ctx;
#ifdef VIOLATE_WAIT_FOREVER
    /* Planted: the deadline is computed in 64 bits, so UINT64_MAX wraps
     * into the past. */
    deadline = start + timeout_ns;
    forever = 0;
#else
    forever = timeout_ns > UINT64_MAX - start;
    deadline = forever ? UINT64_MAX : start + timeout_ns;
#endif
    lock();
    st = find_fence(fence, &i, &why);
    while (st == MEMPLUG_STATUS_OK && !g_fences[i].done) {
        if (forever) {
            pthread_cond_wait(&g_cv, &g_lock);
        } else {
            if (now_ns() >= deadline) {
                st = MEMPLUG_STATUS_TIMEOUT;
                break;
            }
            ts.tv_sec = (time_t)(deadline / 1000000000u);
            ts.tv_nsec = (long)(deadline % 1000000000u);
            pthread_cond_timedwait(&g_cv, &g_lock, &ts);
        }
        if (!g_fences[i].used || g_fences[i].gen != handle_gen(fence)) {
            st = unknown(&why, "contract_violations: the fence was destroyed during the wait");
        }
    }
    if (st == MEMPLUG_STATUS_OK) {
        g_fences[i].reports++;
    }
    unlock();
    return st == MEMPLUG_STATUS_OK || st == MEMPLUG_STATUS_TIMEOUT ? st : say(sink, st, why);
}

static MemplugStatus cv_fence_destroy(void *ctx, uint64_t fence, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugStatus st;
    long i = -1;
    (void)ctx;
    lock();
    st = find_fence(fence, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        g_fences[i].used = 0;
        g_fences[i].gen++;
        g_live--;
    }
    unlock();
    return st == MEMPLUG_STATUS_OK ? st : say(sink, st, why);
}

/* ------------------------------------------------------------------------ */
/* Descriptors, one per minor                                               */
/* ------------------------------------------------------------------------ */

static const MemplugAllocator g_allocator = {
    .struct_size = sizeof(MemplugAllocator),
    .properties = cv_properties,
    .allocate = cv_allocate,
    .deallocate = cv_deallocate,
    .memory_info = NULL,
};

static const MemplugVirtualBacking g_virtual_backing = {
    .struct_size = sizeof(MemplugVirtualBacking),
    .reserve = cv_reserve,
    .commit = cv_commit,
    .decommit = cv_decommit,
    .committed_bytes = cv_committed_bytes,
    .release = cv_release_reservation,
};

static const MemplugSharedMapping g_shared_1_1 = {
    .struct_size = MEMPLUG_SHARED_MAPPING_SIZE_1_1,
    .create = cv_create,
    .map = cv_map,
    .unmap = cv_unmap,
    .retain = cv_retain,
    .release = cv_release,
    .export_fd = cv_export_fd,
    .import_fd = cv_import_fd,
};

static CV_UNUSED const MemplugSharedMapping g_shared_1_0 = {
    .struct_size = MEMPLUG_SHARED_MAPPING_SIZE_1_0,
    .create = cv_create,
    .map = cv_map,
    .unmap = cv_unmap,
    .retain = cv_retain,
    .release = cv_release,
};

static const MemplugSync g_sync = {
    .struct_size = sizeof(MemplugSync),
    .stream_create = cv_stream_create,
    .stream_adopt = NULL,
    .stream_destroy = cv_stream_destroy,
    .enqueue_host_fn = cv_enqueue_host_fn,
    .fence_record = cv_fence_record,
    .fence_query = cv_fence_query,
    .fence_wait = cv_fence_wait,
    .fence_destroy = cv_fence_destroy,
};

#define CV_MECHANISM(caps_, shared_)                                                                        \
    {                                                                                                       \
        .struct_size = sizeof(MemplugMechanism), .capabilities = (caps_), .mechanism_id = CV_MECHANISM_ID, \
        .name = "contract-violations", .device = {.kind = MEMPLUG_DEVICE_CPU, .ordinal = 0}, .ctx = NULL,  \
        .allocator = &g_allocator, .virtual_backing = &g_virtual_backing, .shared_mapping = (shared_),     \
        .sync = &g_sync,                                                                                    \
    }

static const MemplugMechanism g_mechanism_1_1 = CV_MECHANISM(MEMPLUG_CAP_ALL_1_1, &g_shared_1_1);
static CV_UNUSED const MemplugMechanism g_mechanism_1_0 = CV_MECHANISM(MEMPLUG_CAP_ALL_1_0, &g_shared_1_0);
static const MemplugMechanism *const g_mechanisms_1_1[] = {&g_mechanism_1_1};
static CV_UNUSED const MemplugMechanism *const g_mechanisms_1_0[] = {&g_mechanism_1_0};

static uint64_t cv_live_objects(void *ctx)
{
    uint64_t n;
    (void)ctx;
    lock();
    n = g_live;
    unlock();
    return n;
}

#define CV_PLUGIN(mechanisms_)                                                                             \
    {                                                                                                      \
        .struct_size = sizeof(MemplugPlugin), .abi_major = 1, .min_minor = 0, .max_minor = 1,              \
        .name = "memplug-contract-violations", .version = "0.1.0", .ctx = NULL, .mechanism_count = 1,      \
        .mechanisms = (mechanisms_), .live_objects = cv_live_objects, .unload = NULL,                      \
    }

static const MemplugPlugin g_plugin_1_1 = CV_PLUGIN(g_mechanisms_1_1);
static CV_UNUSED const MemplugPlugin g_plugin_1_0 = CV_PLUGIN(g_mechanisms_1_0);

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink)
{
    const char *why = NULL;
    MemplugHostInfo h;
    MemplugNegotiation answer;
    uint32_t lo, hi;
    MemplugStatus st = read_prefix(&h, sizeof h, host, MEMPLUG_HOST_INFO_SIZE_1_0, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_NEGOTIATION_SIZE_1_0, &why);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return say(sink, st, why);
    }
    if (h.abi_major != 1) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH, "contract_violations: this entry serves major 1 only");
    }
    if (h.min_minor > h.max_minor) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "contract_violations: the host's minor range is empty");
    }
    lo = h.min_minor;
    hi = h.max_minor < 1u ? h.max_minor : 1u;
    if (lo > hi) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH, "contract_violations: no common minor (1.0..=1.1)");
    }
    memset(&answer, 0, sizeof answer);
    answer.agreed_minor = hi;
#ifdef VIOLATE_EXPORT_AT_1_0
    /* Planted: every host gets the 1.1 descriptor. */
    answer.plugin = &g_plugin_1_1;
#else
    answer.plugin = hi >= 1u ? &g_plugin_1_1 : &g_plugin_1_0;
#endif
    write_prefix(out, &answer, sizeof answer);
    return MEMPLUG_STATUS_OK;
}
