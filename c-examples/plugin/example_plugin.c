/*
 * example_plugin.c: a memplug plugin written in plain C99 against
 * include/memplug.h only. It is the model a vendor copies.
 *
 * One mechanism, "c-example" (id 1), serving CPU device 0:
 *
 *   - allocator:       posix_memalign/free, any size, alignments from 16 bytes
 *                      to 2 MiB; memory_info from sysconf.
 *   - virtual backing: reserve = mmap(PROT_NONE, MAP_NORESERVE),
 *                      commit = mprotect(RW),
 *                      decommit = madvise(MADV_DONTNEED) + mprotect(NONE),
 *                      release = munmap. One bit per page tracks what is
 *                      committed, so committed_bytes is exact and double
 *                      commits / decommits of uncommitted pages are refused.
 *
 * Build (only the entry symbol is exported):
 *   cc -std=c99 -shared -fPIC -fvisibility=hidden -I include \
 *      c-examples/plugin/example_plugin.c -o libmemplug_example_plugin.so -lpthread
 *
 * What every vendor plugin must do, and where this file does it:
 *   - Negotiate both ways (memplug_plugin_v1): check the host's major and
 *     minor range, agree on min(maxima) provided it is >= max(minima).
 *   - Read host structs as prefixes by their struct_size (read_prefix) and
 *     write answers never past the host's struct_size (write_prefix).
 *   - Check the identity of every object the host names (lookup_object):
 *     mechanism id, device, handle, generation, object id, address, size.
 *   - Explain every failure through the host's message sink (say).
 *   - Be callable from any thread (one mutex guards the handle table; it is
 *     never held while calling into the host).
 *   - Let nothing but memplug_plugin_v1 be visible (MEMPLUG_EXPORT plus
 *     -fvisibility=hidden), and never let a C++ exception or longjmp leave a
 *     slot (plain C: nothing to catch).
 */

/* posix_memalign and pthreads are POSIX; MAP_ANONYMOUS, MAP_NORESERVE and
 * madvise are not (glibc shows them under _DEFAULT_SOURCE). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE 1

#include "memplug.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Identity and limits                                                      */
/* ------------------------------------------------------------------------ */

#define EX_PLUGIN_NAME "memplug-c-example"
#define EX_PLUGIN_VERSION "0.1.0"
#define EX_MECHANISM_NAME "c-example"
#define EX_MECHANISM_ID 1u
#define EX_DEVICE_KIND MEMPLUG_DEVICE_CPU
#define EX_DEVICE_ORDINAL 0u

/* The ABI version this file implements: major 1 (the entry symbol is
 * memplug_plugin_v1), minors 0 to 0. Written as numbers on purpose, not as
 * MEMPLUG_ABI_MAJOR / MEMPLUG_ABI_MINOR: rebuilding against a newer header
 * must not make the plugin claim a minor whose additions it does not
 * implement. Raise EX_MAX_MINOR when you implement a newer minor. */
#define EX_ABI_MAJOR 1u
#define EX_MIN_MINOR 0u
#define EX_MAX_MINOR 0u

/* Alignment every allocation has (glibc malloc gives 16 on 64-bit). */
#define EX_MIN_ALIGNMENT ((uint64_t)16)
/* Largest alignment `allocate` honours. */
#define EX_MAX_ALIGNMENT ((uint64_t)2 * 1024 * 1024)

/* Live objects (allocations plus reservations) at one time. */
#define EX_MAX_OBJECTS 4096u

/* ------------------------------------------------------------------------ */
/* Messages                                                                 */
/* ------------------------------------------------------------------------ */

/* A failure message, formatted where the failure is found and delivered to
 * the host's sink later: code that holds the table lock formats into one of
 * these, and the message is sent only after the lock is released, because
 * the sink is a call into the host. */
struct ex_message {
    char text[256];
    size_t len;
};

/* Formats into `m`; returns `status`, so checks read
 * `return note(m, STATUS, "...", ...);`. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static MemplugStatus note(struct ex_message *m, MemplugStatus status, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(m->text, sizeof m->text, fmt, ap);
    va_end(ap);
    if (n < 0) {
        n = 0;
    } else if ((size_t)n >= sizeof m->text) {
        n = (int)(sizeof m->text - 1); /* truncated, still useful */
    }
    m->len = (size_t)n;
    return status;
}

/* Hands a message to the host's sink, on the calling thread, before the slot
 * returns (the ABI's rule). A NULL sink means the host wants no messages.
 * Returns `status`. Never call it with g_lock held. */
static MemplugStatus deliver(const MemplugMessageSink *sink, const struct ex_message *m, MemplugStatus status)
{
    if (sink != NULL && sink->write != NULL && m->len > 0) {
        sink->write(sink->ctx, m->text, m->len);
    }
    return status;
}

/* note + deliver, for failures found without the lock held. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static MemplugStatus say(const MemplugMessageSink *sink, MemplugStatus status, const char *fmt, ...)
{
    struct ex_message m;
    va_list ap;
    int n;

    if (sink == NULL || sink->write == NULL) {
        return status;
    }
    va_start(ap, fmt);
    n = vsnprintf(m.text, sizeof m.text, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return status;
    }
    m.len = (size_t)n < sizeof m.text ? (size_t)n : sizeof m.text - 1;
    return deliver(sink, &m, status);
}

/* ------------------------------------------------------------------------ */
/* Reading and writing host structs as prefixes                             */
/* ------------------------------------------------------------------------ */

/* Copies a host struct into a zeroed local: min(struct_size, sizeof local)
 * bytes. A host built against a newer minor may send a longer struct (the
 * extra fields are ignored); one shorter than the 1.0 size is malformed. */
static MemplugStatus read_prefix(void *local, size_t local_size, const void *src, uint32_t size_1_0,
                                 const char *what, const MemplugMessageSink *sink)
{
    uint32_t declared;
    size_t n;

    if (src == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "%s is NULL", what);
    }
    memcpy(&declared, src, sizeof declared);
    if (declared < size_1_0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "%s.struct_size is %u, shorter than the %u bytes of ABI 1.0", what,
                   (unsigned)declared, (unsigned)size_1_0);
    }
    n = declared < local_size ? declared : local_size;
    memset(local, 0, local_size);
    memcpy(local, src, n);
    return MEMPLUG_STATUS_OK;
}

/* Checks that a host out-struct can receive at least the 1.0 fields. */
static MemplugStatus check_out(const void *out, uint32_t size_1_0, const char *what,
                               const MemplugMessageSink *sink)
{
    uint32_t declared;

    if (out == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "%s is NULL", what);
    }
    memcpy(&declared, out, sizeof declared);
    if (declared < size_1_0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "%s.struct_size is %u, shorter than the %u bytes of ABI 1.0", what,
                   (unsigned)declared, (unsigned)size_1_0);
    }
    return MEMPLUG_STATUS_OK;
}

/* Writes `value` into a host out-struct already passed through check_out:
 * every byte after struct_size, up to min(struct_size, value_size). The
 * host's struct_size stays as the host set it; nothing past it is touched. */
static void write_prefix(void *out, const void *value, size_t value_size)
{
    uint32_t declared;
    size_t n;

    memcpy(&declared, out, sizeof declared);
    n = declared < value_size ? declared : value_size;
    memcpy((unsigned char *)out + sizeof declared, (const unsigned char *)value + sizeof declared,
           n - sizeof declared);
}

/* ------------------------------------------------------------------------ */
/* The handle table                                                          */
/* ------------------------------------------------------------------------ */

/* A handle is (generation << 32) | (slot index + 1): never zero, and stale
 * as soon as the slot is freed, because freeing bumps the generation. */
enum ex_kind { EX_FREE = 0, EX_ALLOCATION, EX_RESERVATION };

struct ex_slot {
    enum ex_kind kind;
    uint32_t generation;
    uint32_t next_free;  /* index + 1 of the next free slot; 0 ends the list */
    uint64_t object_id;  /* host-assigned, checked on every use */
    void *base;          /* address returned to the host */
    uint64_t size;       /* size returned to the host */
    /* Reservations only: one bit per page, set when committed. */
    unsigned char *committed_map;
    uint64_t committed_bytes;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ex_slot g_slots[EX_MAX_OBJECTS];
static uint32_t g_free_head;     /* index + 1 of the first free slot; 0 = none */
static uint32_t g_never_used;    /* slots [g_never_used, EX_MAX_OBJECTS) never used */
static uint64_t g_live;          /* live allocations plus reservations */

static uint64_t make_handle(uint32_t index, uint32_t generation)
{
    return ((uint64_t)generation << 32) | (uint64_t)(index + 1u);
}

/* Takes a free slot and fills it; returns its handle, or 0 when the table
 * is full. Call with g_lock held. */
static uint64_t slot_insert(enum ex_kind kind, uint64_t object_id, void *base, uint64_t size,
                            unsigned char *committed_map)
{
    uint32_t index;
    struct ex_slot *s;

    if (g_free_head != 0) {
        index = g_free_head - 1u;
        g_free_head = g_slots[index].next_free;
    } else if (g_never_used < EX_MAX_OBJECTS) {
        index = g_never_used++;
    } else {
        return 0;
    }
    s = &g_slots[index];
    s->kind = kind;
    s->next_free = 0;
    s->object_id = object_id;
    s->base = base;
    s->size = size;
    s->committed_map = committed_map;
    s->committed_bytes = 0;
    g_live++;
    return make_handle(index, s->generation);
}

/* Frees a slot; its handle becomes stale. Call with g_lock held. */
static void slot_remove(struct ex_slot *s)
{
    uint32_t index = (uint32_t)(s - g_slots);

    s->kind = EX_FREE;
    s->generation++;
    s->base = NULL;
    s->committed_map = NULL;
    s->next_free = g_free_head;
    g_free_head = index + 1u;
    g_live--;
}

/* Checks the parts of an object reference that need no lock: it is well
 * formed, made by this mechanism, on this device. */
static MemplugStatus check_object_identity(const MemplugObjectRef *object, MemplugObjectRef *local,
                                           const char *what, const MemplugMessageSink *sink)
{
    MemplugStatus st =
        read_prefix(local, sizeof *local, object, MEMPLUG_OBJECT_REF_SIZE_1_0, what, sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (local->mechanism_id != EX_MECHANISM_ID) {
        return say(sink, MEMPLUG_STATUS_WRONG_MECHANISM,
                   "%s was made by mechanism %llu, not by \"" EX_MECHANISM_NAME "\" (id %u)", what,
                   (unsigned long long)local->mechanism_id, EX_MECHANISM_ID);
    }
    if (local->device.kind != EX_DEVICE_KIND || local->device.ordinal != EX_DEVICE_ORDINAL) {
        return say(sink, MEMPLUG_STATUS_WRONG_DEVICE,
                   "%s lives on device (kind %u, ordinal %u); this mechanism serves CPU 0", what,
                   (unsigned)local->device.kind, (unsigned)local->device.ordinal);
    }
    return MEMPLUG_STATUS_OK;
}

/* Finds the live slot an object reference names. Everything the host sent
 * must match what this plugin returned: handle (index and generation),
 * kind, object id, address and size. Anything else is an unknown object:
 * never made, already released, or forged. Call with g_lock held. */
static MemplugStatus lookup_object(const MemplugObjectRef *ref, enum ex_kind kind,
                                   struct ex_slot **out, const char *what, struct ex_message *m)
{
    uint64_t low = ref->handle & 0xffffffffu;
    uint32_t generation = (uint32_t)(ref->handle >> 32);
    struct ex_slot *s = NULL; /* set by lookup_object on success; gcc -O2 cannot see that */

    if (low == 0 || low > EX_MAX_OBJECTS) {
        return note(m, MEMPLUG_STATUS_UNKNOWN_ALLOCATION, "%s: handle %#llx was never issued", what,
                   (unsigned long long)ref->handle);
    }
    s = &g_slots[low - 1u];
    if (s->kind != kind || s->generation != generation) {
        return note(m, MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
                    "%s: handle %#llx (object %llu) is not a live %s; already released?", what,
                   (unsigned long long)ref->handle, (unsigned long long)ref->object_id,
                   kind == EX_ALLOCATION ? "allocation" : "reservation");
    }
    if (s->object_id != ref->object_id || (uint64_t)(uintptr_t)s->base != ref->addr ||
        s->size != ref->size) {
        return note(m, MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
                    "%s: handle %#llx does not match object %llu at %#llx (%llu bytes)", what,
                   (unsigned long long)ref->handle, (unsigned long long)ref->object_id,
                   (unsigned long long)ref->addr, (unsigned long long)ref->size);
    }
    *out = s;
    return MEMPLUG_STATUS_OK;
}

/* Reads and checks a request (allocate, reserve). */
static MemplugStatus check_request(const MemplugRequest *request, MemplugRequest *local,
                                   const MemplugMessageSink *sink)
{
    MemplugStatus st =
        read_prefix(local, sizeof *local, request, MEMPLUG_REQUEST_SIZE_1_0, "request", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (local->flags != 0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "request.flags %#x has bits ABI 1.0 does not define", (unsigned)local->flags);
    }
    if (local->device.kind != EX_DEVICE_KIND || local->device.ordinal != EX_DEVICE_ORDINAL) {
        return say(sink, MEMPLUG_STATUS_WRONG_DEVICE,
                   "request names device (kind %u, ordinal %u); this mechanism serves CPU 0",
                   (unsigned)local->device.kind, (unsigned)local->device.ordinal);
    }
    if (local->size == 0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "request.size is zero");
    }
    return MEMPLUG_STATUS_OK;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

static uint32_t max_u32(uint32_t a, uint32_t b)
{
    return a > b ? a : b;
}

static uint64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096u;
}

/* ------------------------------------------------------------------------ */
/* Allocator                                                                 */
/* ------------------------------------------------------------------------ */

static MemplugStatus ex_properties(void *ctx, MemplugProperties *out, const MemplugMessageSink *sink)
{
    MemplugProperties p;
    MemplugStatus st = check_out(out, MEMPLUG_PROPERTIES_SIZE_1_0, "out properties", sink);

    (void)ctx;
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    memset(&p, 0, sizeof p);
    p.min_alignment = EX_MIN_ALIGNMENT;
    p.max_alignment = EX_MAX_ALIGNMENT;
    p.granularity = page_size();
    write_prefix(out, &p, sizeof p);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus ex_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                 const MemplugMessageSink *sink)
{
    MemplugRequest r;
    MemplugBlock b;
    MemplugStatus st;
    uint64_t align;
    uint64_t handle;
    void *p = NULL;
    int err;

    (void)ctx;
    st = check_request(request, &r, sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    /* Check the out-struct first: once memory exists, nothing may fail. */
    st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, "out block", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (r.alignment == 0 || (r.alignment & (r.alignment - 1u)) != 0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "request.alignment %llu is not a power of two", (unsigned long long)r.alignment);
    }
    if (r.alignment > EX_MAX_ALIGNMENT) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "request.alignment %llu exceeds the largest this mechanism honours (%llu)",
                   (unsigned long long)r.alignment, (unsigned long long)EX_MAX_ALIGNMENT);
    }
    if ((uint64_t)(size_t)r.size != r.size) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "request.size %llu does not fit in size_t",
                   (unsigned long long)r.size);
    }
    align = r.alignment < EX_MIN_ALIGNMENT ? EX_MIN_ALIGNMENT : r.alignment;

    /* The system call happens outside the lock; only the table needs it. */
    err = posix_memalign(&p, (size_t)align, (size_t)r.size);
    if (err != 0 || p == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY,
                   "posix_memalign(%llu bytes, alignment %llu) failed (error %d)",
                   (unsigned long long)r.size, (unsigned long long)align, err);
    }

    pthread_mutex_lock(&g_lock);
    handle = slot_insert(EX_ALLOCATION, r.object_id, p, r.size, NULL);
    pthread_mutex_unlock(&g_lock);
    if (handle == 0) {
        free(p);
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "handle table full (%u live objects)",
                   EX_MAX_OBJECTS);
    }

    memset(&b, 0, sizeof b);
    b.addr = (uint64_t)(uintptr_t)p;
    b.size = r.size;
    b.handle = handle;
    write_prefix(out, &b, sizeof b);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus ex_deallocate(void *ctx, const MemplugObjectRef *object,
                                   const MemplugMessageSink *sink)
{
    MemplugObjectRef ref;
    struct ex_message msg;
    struct ex_slot *s = NULL; /* set by lookup_object on success; gcc -O2 cannot see that */
    void *p;
    MemplugStatus st;

    (void)ctx;
    st = check_object_identity(object, &ref, "object", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    pthread_mutex_lock(&g_lock);
    st = lookup_object(&ref, EX_ALLOCATION, &s, "deallocate", &msg);
    if (st != MEMPLUG_STATUS_OK) {
        pthread_mutex_unlock(&g_lock);
        return deliver(sink, &msg, st);
    }
    p = s->base;
    slot_remove(s);
    pthread_mutex_unlock(&g_lock);
    free(p);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus ex_memory_info(void *ctx, MemplugMemoryInfo *out, const MemplugMessageSink *sink)
{
    MemplugMemoryInfo m;
    long total = sysconf(_SC_PHYS_PAGES);
    long avail = sysconf(_SC_AVPHYS_PAGES);
    MemplugStatus st = check_out(out, MEMPLUG_MEMORY_INFO_SIZE_1_0, "out memory info", sink);

    (void)ctx;
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (total <= 0 || avail < 0) {
        return say(sink, MEMPLUG_STATUS_DEVICE_UNAVAILABLE, "sysconf cannot tell physical memory");
    }
    memset(&m, 0, sizeof m);
    m.total_bytes = (uint64_t)total * page_size();
    m.free_bytes = (uint64_t)avail * page_size();
    write_prefix(out, &m, sizeof m);
    return MEMPLUG_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Virtual backing                                                           */
/* ------------------------------------------------------------------------ */

static int page_is_committed(const struct ex_slot *s, uint64_t page)
{
    return (s->committed_map[page / 8u] >> (page % 8u)) & 1u;
}

static void set_pages(struct ex_slot *s, uint64_t first, uint64_t count, int committed)
{
    uint64_t i;
    for (i = first; i < first + count; i++) {
        if (committed) {
            s->committed_map[i / 8u] |= (unsigned char)(1u << (i % 8u));
        } else {
            s->committed_map[i / 8u] &= (unsigned char)~(1u << (i % 8u));
        }
    }
}

/* Checks (offset, len) against a reservation: non-empty, page-aligned, no
 * overflow, in bounds. */
static MemplugStatus check_range(const struct ex_slot *s, uint64_t offset, uint64_t len,
                                 const char *what, struct ex_message *m)
{
    uint64_t page = page_size();

    if (len == 0) {
        return note(m, MEMPLUG_STATUS_OUT_OF_RANGE, "%s: empty range at offset %llu", what,
                   (unsigned long long)offset);
    }
    if (offset % page != 0 || len % page != 0) {
        return note(m, MEMPLUG_STATUS_OUT_OF_RANGE,
                   "%s: range (%llu, %llu) is not aligned to the %llu-byte granularity", what,
                   (unsigned long long)offset, (unsigned long long)len, (unsigned long long)page);
    }
    if (offset + len < offset) {
        return note(m, MEMPLUG_STATUS_OUT_OF_RANGE, "%s: offset %llu + length %llu overflows",
                   what, (unsigned long long)offset, (unsigned long long)len);
    }
    if (offset + len > s->size) {
        return note(m, MEMPLUG_STATUS_OUT_OF_RANGE,
                   "%s: range [%llu, %llu) lies outside the %llu-byte reservation", what,
                   (unsigned long long)offset, (unsigned long long)(offset + len),
                   (unsigned long long)s->size);
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus ex_reserve(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                const MemplugMessageSink *sink)
{
    MemplugRequest r;
    MemplugBlock b;
    MemplugStatus st;
    uint64_t page = page_size();
    uint64_t size;
    uint64_t handle;
    unsigned char *map;
    void *base;

    (void)ctx;
    st = check_request(request, &r, sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, "out block", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    /* request.alignment is ignored: reservations align to the granularity. */
    if (r.size > (uint64_t)SIZE_MAX - page) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "cannot reserve %llu bytes",
                   (unsigned long long)r.size);
    }
    size = (r.size + page - 1u) / page * page;

    map = calloc((size_t)(size / page / 8u + 1u), 1);
    if (map == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "no memory for the commit map of %llu pages",
                   (unsigned long long)(size / page));
    }
    base = mmap(NULL, (size_t)size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        free(map);
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "mmap reserve of %llu bytes failed",
                   (unsigned long long)size);
    }

    pthread_mutex_lock(&g_lock);
    handle = slot_insert(EX_RESERVATION, r.object_id, base, size, map);
    pthread_mutex_unlock(&g_lock);
    if (handle == 0) {
        munmap(base, (size_t)size);
        free(map);
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "handle table full (%u live objects)",
                   EX_MAX_OBJECTS);
    }

    memset(&b, 0, sizeof b);
    b.addr = (uint64_t)(uintptr_t)base;
    b.size = size;
    b.handle = handle;
    write_prefix(out, &b, sizeof b);
    return MEMPLUG_STATUS_OK;
}

/* commit and decommit share everything but the direction. The lock is held
 * across mprotect/madvise so that the page map and the mapping change
 * together; a vendor with heavy concurrent growth would lock per
 * reservation instead. */
static MemplugStatus change_commit(const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                                   int commit, const MemplugMessageSink *sink)
{
    const char *what = commit ? "commit" : "decommit";
    MemplugObjectRef ref;
    struct ex_message msg;
    struct ex_slot *s = NULL; /* set by lookup_object on success; gcc -O2 cannot see that */
    uint64_t page = page_size();
    uint64_t first = 0, count = 0, i;
    unsigned char *start;
    MemplugStatus st;

    st = check_object_identity(reservation, &ref, "reservation", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    pthread_mutex_lock(&g_lock);
    st = lookup_object(&ref, EX_RESERVATION, &s, what, &msg);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(s, offset, len, what, &msg);
    }
    if (st == MEMPLUG_STATUS_OK) {
        first = offset / page;
        count = len / page;
        for (i = first; i < first + count && st == MEMPLUG_STATUS_OK; i++) {
            if (page_is_committed(s, i) == commit) {
                st = note(&msg, MEMPLUG_STATUS_INVALID_STATE, "%s: page at offset %llu is %s", what,
                          (unsigned long long)(i * page),
                          commit ? "already committed" : "not committed");
            }
        }
    }
    if (st == MEMPLUG_STATUS_OK) {
        start = (unsigned char *)s->base + offset;
        if (commit) {
            if (mprotect(start, (size_t)len, PROT_READ | PROT_WRITE) != 0) {
                /* mprotect may have changed part of the range: undo it all. */
                mprotect(start, (size_t)len, PROT_NONE);
                st = note(&msg, MEMPLUG_STATUS_OUT_OF_MEMORY, "commit: mprotect of %llu bytes failed",
                          (unsigned long long)len);
            } else {
                s->committed_bytes += len;
            }
        } else {
            /* DONTNEED gives the pages back (they read as zeros after a
             * later commit); PROT_NONE makes the range inaccessible. */
            if (madvise(start, (size_t)len, MADV_DONTNEED) != 0 ||
                mprotect(start, (size_t)len, PROT_NONE) != 0) {
                st = note(&msg, MEMPLUG_STATUS_INTERNAL,
                          "decommit: madvise/mprotect of %llu bytes failed", (unsigned long long)len);
            } else {
                s->committed_bytes -= len;
            }
        }
        if (st == MEMPLUG_STATUS_OK) {
            set_pages(s, first, count, commit);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return st == MEMPLUG_STATUS_OK ? st : deliver(sink, &msg, st);
}

static MemplugStatus ex_commit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset,
                               uint64_t len, const MemplugMessageSink *sink)
{
    (void)ctx;
    return change_commit(reservation, offset, len, 1, sink);
}

static MemplugStatus ex_decommit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset,
                                 uint64_t len, const MemplugMessageSink *sink)
{
    (void)ctx;
    return change_commit(reservation, offset, len, 0, sink);
}

static MemplugStatus ex_committed_bytes(void *ctx, const MemplugObjectRef *reservation,
                                        uint64_t *out_bytes, const MemplugMessageSink *sink)
{
    MemplugObjectRef ref;
    struct ex_message msg;
    struct ex_slot *s = NULL; /* set by lookup_object on success; gcc -O2 cannot see that */
    MemplugStatus st;

    (void)ctx;
    if (out_bytes == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "out_bytes is NULL");
    }
    st = check_object_identity(reservation, &ref, "reservation", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    pthread_mutex_lock(&g_lock);
    st = lookup_object(&ref, EX_RESERVATION, &s, "committed_bytes", &msg);
    if (st == MEMPLUG_STATUS_OK) {
        *out_bytes = s->committed_bytes;
    }
    pthread_mutex_unlock(&g_lock);
    return st == MEMPLUG_STATUS_OK ? st : deliver(sink, &msg, st);
}

static MemplugStatus ex_release(void *ctx, const MemplugObjectRef *reservation,
                                const MemplugMessageSink *sink)
{
    MemplugObjectRef ref;
    struct ex_message msg;
    struct ex_slot *s = NULL; /* set by lookup_object on success; gcc -O2 cannot see that */
    void *base;
    uint64_t size;
    unsigned char *map;
    MemplugStatus st;

    (void)ctx;
    st = check_object_identity(reservation, &ref, "reservation", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    pthread_mutex_lock(&g_lock);
    st = lookup_object(&ref, EX_RESERVATION, &s, "release", &msg);
    if (st != MEMPLUG_STATUS_OK) {
        pthread_mutex_unlock(&g_lock);
        return deliver(sink, &msg, st);
    }
    base = s->base;
    size = s->size;
    map = s->committed_map;
    slot_remove(s);
    pthread_mutex_unlock(&g_lock);

    /* munmap decommits and unmaps in one step. */
    munmap(base, (size_t)size);
    free(map);
    return MEMPLUG_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Descriptors                                                               */
/* ------------------------------------------------------------------------ */

/* struct_size is sizeof at every minor. From the header's rules:
 * Table length at an older minor: a table or struct a plugin publishes may
 * be longer than the agreed minor defines, so the sizeof of the plugin's
 * own struct is right at every minor; the host reads and calls nothing past
 * the size the agreed minor defines (its SIZE_1_N constant), and a
 * capability bit still needs every slot the minor that defines it brings.
 */
static const MemplugAllocator g_allocator = {
    .struct_size = sizeof(MemplugAllocator),
    .properties = ex_properties,
    .allocate = ex_allocate,
    .deallocate = ex_deallocate,
    .memory_info = ex_memory_info, /* optional: NULL if the device cannot tell */
};

static const MemplugVirtualBacking g_virtual_backing = {
    .struct_size = sizeof(MemplugVirtualBacking),
    .reserve = ex_reserve,
    .commit = ex_commit,
    .decommit = ex_decommit,
    .committed_bytes = ex_committed_bytes,
    .release = ex_release,
};

/* Capability flags and sub-vtable pointers must agree: the host refuses a
 * flag without a pointer and a pointer without a flag. */
static const MemplugMechanism g_mechanism = {
    .struct_size = sizeof(MemplugMechanism),
    .capabilities = MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING,
    .mechanism_id = EX_MECHANISM_ID,
    .name = EX_MECHANISM_NAME,
    .device = {.kind = EX_DEVICE_KIND, .ordinal = EX_DEVICE_ORDINAL},
    .ctx = NULL, /* this plugin keeps its state in statics */
    .allocator = &g_allocator,
    .virtual_backing = &g_virtual_backing,
    .shared_mapping = NULL, /* no MEMPLUG_CAP_SHARED_MAPPING */
    .sync = NULL,           /* no MEMPLUG_CAP_SYNC */
};

static const MemplugMechanism *const g_mechanisms[] = {&g_mechanism};

/* Exact: the host refuses to unload the plugin while this is non-zero. */
static uint64_t ex_live_objects(void *ctx)
{
    uint64_t n;

    (void)ctx;
    pthread_mutex_lock(&g_lock);
    n = g_live;
    pthread_mutex_unlock(&g_lock);
    return n;
}

static const MemplugPlugin g_plugin = {
    .struct_size = sizeof(MemplugPlugin),
    .abi_major = EX_ABI_MAJOR,
    .min_minor = EX_MIN_MINOR,
    .max_minor = EX_MAX_MINOR,
    .name = EX_PLUGIN_NAME,
    .version = EX_PLUGIN_VERSION,
    .ctx = NULL,
    .mechanism_count = (uint32_t)(sizeof g_mechanisms / sizeof g_mechanisms[0]),
    .mechanisms = g_mechanisms,
    .live_objects = ex_live_objects,
    .unload = NULL, /* optional: nothing to tear down */
};

/* ------------------------------------------------------------------------ */
/* Entry symbol: two-sided negotiation                                       */
/* ------------------------------------------------------------------------ */

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink);

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink)
{
    MemplugHostInfo h;
    MemplugNegotiation answer;
    uint32_t lo, hi;
    MemplugStatus st;

    st = read_prefix(&h, sizeof h, host, MEMPLUG_HOST_INFO_SIZE_1_0, "host info", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = check_out(out, MEMPLUG_NEGOTIATION_SIZE_1_0, "out negotiation", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (h.abi_major != EX_ABI_MAJOR) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH,
                   "host speaks ABI major %u; this entry serves major %u", (unsigned)h.abi_major,
                   EX_ABI_MAJOR);
    }
    if (h.min_minor > h.max_minor) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "host minor range 1.%u..1.%u is empty", (unsigned)h.min_minor,
                   (unsigned)h.max_minor);
    }
    /* Agreed minor: the smaller maximum, provided it is at least the larger
     * minimum. */
    lo = max_u32(h.min_minor, EX_MIN_MINOR);
    hi = min_u32(h.max_minor, EX_MAX_MINOR);
    if (lo > hi) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH,
                   "no common minor: host speaks 1.%u..1.%u, plugin speaks 1.%u..1.%u",
                   (unsigned)h.min_minor, (unsigned)h.max_minor, (unsigned)EX_MIN_MINOR,
                   (unsigned)EX_MAX_MINOR);
    }

    memset(&answer, 0, sizeof answer);
    answer.agreed_minor = hi;
    answer.plugin = &g_plugin;
    write_prefix(out, &answer, sizeof answer);
    return MEMPLUG_STATUS_OK;
}
