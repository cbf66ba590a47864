/*
 * full_plugin.c: a memplug plugin of ABI 1.0 to 1.3 in plain C99, written
 * against include/memplug.h only. It is the file a vendor copies to start a
 * plugin that uses every capability the header defines; example_plugin.c
 * beside it is the smallest (1.0) start.
 *
 * One mechanism, "c-full" (id 1), serving CPU device 0 with host memory:
 *
 *   allocator        mmap(MAP_ANONYMOUS), page-granular, alignments up to
 *                    2 MiB; memory_info from sysconf.
 *   virtual backing  reserve = mmap(PROT_NONE, MAP_NORESERVE); commit =
 *                    mprotect(RW); decommit = madvise(DONTNEED) +
 *                    mprotect(NONE); one state byte per page.
 *   shared mapping   a physical object is a sealed memfd; map = mmap(MAP_FIXED
 *                    | MAP_SHARED) over the reservation; unmap puts the
 *                    reservation's PROT_NONE pages back. Export/import as a
 *                    file descriptor (1.1) and as a typed MEMPLUG_HANDLE_MEMFD
 *                    handle (1.2).
 *   sync             a stream is a worker thread running a queue in order
 *                    (host functions, copies, queued unmaps); a fence is a
 *                    point in that queue. stream_wait_fence (1.2).
 *   queued binding   commit_on, decommit_on, map_on, unmap_on (1.2).
 *   copy             stream-ordered memcpy between the mechanism's memory and
 *                    host memory (1.3, copy_kinds DEVICE | HOST).
 *   descriptor       the 1.2 memory descriptor (attributes it really has),
 *                    the device identity, copy_kinds (1.3).
 *   loss             the host's services table (1.2); a device-loss test
 *                    trigger the conformance kit knows.
 *
 * Build (only the entry symbol and the test trigger are exported):
 *   cc -std=c99 -Wall -Wextra -Wpedantic -Werror -shared -fPIC \
 *      -fvisibility=hidden -I include c-examples/plugin/full_plugin.c \
 *      -o libmemplug_full_plugin.so -lpthread
 *   memplug conformance ./libmemplug_full_plugin.so
 *
 * How the file is laid out, in the order a vendor meets each part:
 *   1. identity and limits, messages, prefixes (as in example_plugin.c);
 *   2. the load: what one host's negotiation owns (VENDORS.md, "One
 *      library, several hosts"), with its lock and its handle table;
 *   3. the slots, one section per table;
 *   4. the descriptor of each agreed minor, negotiation, unload;
 *   5. the device-loss test trigger.
 *
 * Threads: every slot may be called from any thread at once. Each load has
 * one mutex (`lock`) around its table, its streams' queues and its lost
 * flag; it is never held across a call into the host (a message, a host
 * function, a service): a failure found under the lock is formatted there
 * (`note`) and delivered after unlocking (`deliver`).
 */

/* memfd_create, MFD_*, F_ADD_SEALS, MAP_ANONYMOUS, MAP_NORESERVE and
 * madvise are Linux/glibc extensions. */
#define _GNU_SOURCE 1

#include "memplug.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ======================================================================== */
/* 1. Identity, limits, messages, prefixes                                  */
/* ======================================================================== */

#define FP_PLUGIN_NAME "memplug-c-full"
#define FP_PLUGIN_VERSION "0.1.0"
#define FP_MECHANISM_NAME "c-full"
#define FP_MECHANISM_ID 1u
#define FP_DEVICE_KIND MEMPLUG_DEVICE_CPU
#define FP_DEVICE_ORDINAL 0u

/* The minors this file implements, as numbers: never MEMPLUG_ABI_MINOR,
 * which is the header's newest minor (see its warning). Rebuilt against a
 * 1.4 header this plugin still says 1.3, and stays right. */
#define FP_ABI_MAJOR 1u
#define FP_MIN_MINOR 0u
#define FP_MAX_MINOR 3u

#define FP_MAX_ALIGNMENT ((uint64_t)2 * 1024 * 1024)
/* Live objects of one load (allocations, reservations, physical objects,
 * streams, fences); the table grows up to this. */
#define FP_MAX_OBJECTS (1u << 20)

/* What memory of this mechanism is like: only what every object has (the
 * conformance kit checks each claim). Anonymous and memfd pages are zero when
 * new, host-visible and coherent (it is host memory), and a read-only view
 * is mapped without PROT_WRITE. Not PINNED: nothing is mlocked. */
#define FP_ATTRIBUTES                                                                         \
    (MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT | MEMPLUG_ATTR_READ_ONLY_ENFORCED | \
     MEMPLUG_ATTR_ZERO_FILLED)
#define FP_EXPORT_TYPES MEMPLUG_HANDLE_MEMFD
#define FP_COPY_KINDS (MEMPLUG_COPY_DEVICE | MEMPLUG_COPY_HOST)

/* A failure message formatted under the lock and delivered after it. */
struct fp_message {
    char text[256];
    size_t len;
};

#if defined(__GNUC__) || defined(__clang__)
#    define FP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#    define FP_PRINTF(a, b)
#endif

static void format_into(struct fp_message *m, const char *fmt, va_list ap)
{
    int n = vsnprintf(m->text, sizeof m->text, fmt, ap);
    if (n < 0) {
        n = 0;
    }
    m->len = (size_t)n < sizeof m->text ? (size_t)n : sizeof m->text - 1;
}

/* Formats into `m`; returns `status` (`return note(m, STATUS, ...)`). */
FP_PRINTF(3, 4)
static MemplugStatus note(struct fp_message *m, MemplugStatus status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    format_into(m, fmt, ap);
    va_end(ap);
    return status;
}

/* Hands a message to the host's sink: on the calling thread, before the
 * slot returns, never with the lock held. Returns `status`. */
static MemplugStatus deliver(const MemplugMessageSink *sink, const struct fp_message *m,
                             MemplugStatus status)
{
    if (status != MEMPLUG_STATUS_OK && sink != NULL && sink->write != NULL && m->len > 0) {
        sink->write(sink->ctx, m->text, m->len);
    }
    return status;
}

/* note + deliver, for failures found without the lock held. */
FP_PRINTF(3, 4)
static MemplugStatus say(const MemplugMessageSink *sink, MemplugStatus status, const char *fmt, ...)
{
    struct fp_message m;
    va_list ap;
    va_start(ap, fmt);
    format_into(&m, fmt, ap);
    va_end(ap);
    return deliver(sink, &m, status);
}

/* Copies a host struct into a zeroed local of `local_size` bytes:
 * min(struct_size, limit) bytes, where `limit` (at most `local_size`) is
 * what the agreed minor defines (a longer struct's tail belongs to a newer
 * minor and is ignored; what it does not reach reads as zero). Shorter than
 * 1.0 is malformed. */
static MemplugStatus read_prefix_upto(void *local, size_t local_size, size_t limit, const void *src,
                                      uint32_t size_1_0, const char *what, const MemplugMessageSink *sink)
{
    uint32_t declared;
    memset(local, 0, local_size);
    if (src == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "%s is NULL", what);
    }
    memcpy(&declared, src, sizeof declared);
    if (declared < size_1_0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "%s.struct_size is %u, shorter than the %u bytes of ABI 1.0", what,
                   (unsigned)declared, (unsigned)size_1_0);
    }
    memcpy(local, src, declared < limit ? declared : limit);
    return MEMPLUG_STATUS_OK;
}

/* read_prefix_upto as far as the local struct reaches. */
static MemplugStatus read_prefix(void *local, size_t local_size, const void *src, uint32_t size_1_0,
                                 const char *what, const MemplugMessageSink *sink)
{
    return read_prefix_upto(local, local_size, local_size, src, size_1_0, what, sink);
}

/* An out-struct must hold at least its 1.0 fields; checked before anything
 * is made, so that nothing can fail after it. */
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

/* Writes `value` into an out-struct passed through check_out: the bytes
 * after struct_size up to min(struct_size, limit); struct_size stays the
 * host's, nothing past it is touched. */
static void write_prefix(void *out, const void *value, size_t limit)
{
    uint32_t declared;
    size_t n;
    memcpy(&declared, out, sizeof declared);
    n = declared < limit ? declared : limit;
    memcpy((unsigned char *)out + sizeof declared, (const unsigned char *)value + sizeof declared,
           n - sizeof declared);
}

static uint64_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096u;
}

/* Rounds up to the page; 0 when that overflows (callers refuse it). */
static uint64_t round_to_page(uint64_t n)
{
    uint64_t p = page_size();
    return n > UINT64_MAX - p ? 0 : (n + p - 1u) / p * p;
}

/* Each growable struct's size at each minor: the agreed minor is a
 * ceiling, nothing a later minor defines is read or written. */
static size_t request_size(uint32_t minor)
{
    return minor >= 2 ? MEMPLUG_REQUEST_SIZE_1_2 : minor == 1 ? MEMPLUG_REQUEST_SIZE_1_1 : MEMPLUG_REQUEST_SIZE_1_0;
}

static size_t properties_size(uint32_t minor)
{
    return minor >= 3   ? MEMPLUG_PROPERTIES_SIZE_1_3
           : minor == 2 ? MEMPLUG_PROPERTIES_SIZE_1_2
                        : MEMPLUG_PROPERTIES_SIZE_1_0;
}

/* ======================================================================== */
/* 2. The load: what one host's negotiation owns                            */
/* ======================================================================== */

/* Page states of a reservation. DRAINING: given up by decommit_on or
 * unmap_on, still there until the stream's worker reaches it (a later call
 * sees it gone; it cannot be committed or mapped before then). */
enum fp_page { PAGE_FREE = 0, PAGE_COMMITTED, PAGE_MAPPED, PAGE_DRAINING };

enum fp_kind { FP_SLOT_FREE = 0, FP_ALLOCATION, FP_RESERVATION, FP_OBJECT, FP_STREAM, FP_FENCE };

static const char *const kind_name[] = {"free slot", "allocation", "reservation",
                                        "physical object", "stream", "fence"};

/* One shared mapping inside a reservation. */
struct fp_mapping {
    uint64_t offset, len;
    uint64_t object;   /* handle of the physical object it holds a reference on */
    uint32_t access;
    int draining;      /* unmap_on queued, not run yet */
};

struct fp_stream;

struct fp_slot {
    enum fp_kind kind;
    uint32_t generation;
    uint32_t next_free;     /* index + 1 of the next free slot; 0 ends the list */
    uint64_t object_id;     /* host-assigned, checked on every use */
    unsigned char *base;    /* allocation, reservation: address given out */
    uint64_t size;          /* size given out */
    /* Reservation. */
    unsigned char *pages;   /* one enum fp_page per page */
    uint64_t committed_bytes;
    struct fp_mapping *maps;
    uint32_t nmaps, cap_maps;
    /* Physical object. */
    int fd;
    uint64_t refs;          /* the host's: create/import + retains - releases */
    uint64_t mapped;        /* live mappings of it; it goes when both are 0 */
    /* Stream (its queue), fence (the stream it waits on and where). */
    struct fp_stream *stream;
    uint64_t seq;
};

/* Everything one successful negotiation made. dlopen gives every host in a
 * process the same copy of this library, so nothing a host owns lives in a
 * static: each load has its own agreed minor, services, lost flag, handles
 * and live count. The descriptor's and the mechanism's ctx point here. */
struct fp_load {
    pthread_mutex_t lock;
    pthread_cond_t progress;   /* broadcast when a stream's work advances */
    uint32_t agreed_minor;
    const MemplugHostServices *services; /* NULL below 1.2 */
    int lost;
    unsigned reporting;        /* trigger calls using `services` right now */
    pthread_cond_t reported;   /* signalled when `reporting` drops to 0 */
    struct fp_slot *slots;
    uint32_t cap, free_head, never_used;
    uint64_t live;
    struct fp_load *next;      /* the list the loss trigger walks */
    /* The descriptor of the agreed minor (section 4). */
    MemplugPlugin plugin;
    MemplugMechanism mechanism;
    const MemplugMechanism *mechanisms[1];
};

static pthread_mutex_t g_loads_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fp_load *g_loads;

/* Latched by a loss: DEVICE_LOST is 1.2's, a host that agreed on less reads
 * it as INTERNAL, so it is told DEVICE_UNAVAILABLE. */
static MemplugStatus lost_status(const struct fp_load *l)
{
    return l->agreed_minor >= 2 ? MEMPLUG_STATUS_DEVICE_LOST : MEMPLUG_STATUS_DEVICE_UNAVAILABLE;
}

/* Locks the load; refuses (unlocked, message delivered) when the device is
 * lost. Every slot starts here. */
static MemplugStatus enter(struct fp_load *l, const char *slot, const MemplugMessageSink *sink)
{
    MemplugStatus st;
    pthread_mutex_lock(&l->lock);
    if (!l->lost) {
        return MEMPLUG_STATUS_OK;
    }
    st = lost_status(l);
    pthread_mutex_unlock(&l->lock);
    return say(sink, st, "%s: the device of \"" FP_MECHANISM_NAME "\" is lost", slot);
}

/* Unlocks and delivers the message of a failure. */
static MemplugStatus leave(struct fp_load *l, const MemplugMessageSink *sink,
                           const struct fp_message *m, MemplugStatus st)
{
    pthread_mutex_unlock(&l->lock);
    return deliver(sink, m, st);
}

/* A handle is (generation << 32) | (slot index + 1): never zero, and stale
 * once its slot is freed, because freeing bumps the generation. */
static uint64_t make_handle(uint32_t index, uint32_t generation)
{
    return ((uint64_t)generation << 32) | (uint64_t)(index + 1u);
}

/* Takes a free slot; returns its index + 1, or 0 when the table cannot
 * grow. Lock held. */
static uint32_t slot_take(struct fp_load *l, enum fp_kind kind, uint64_t object_id)
{
    uint32_t index;
    struct fp_slot *s;
    if (l->free_head != 0) {
        index = l->free_head - 1u;
        l->free_head = l->slots[index].next_free;
    } else {
        if (l->never_used == l->cap) {
            uint32_t cap = l->cap == 0 ? 64u : l->cap * 2u;
            struct fp_slot *grown;
            if (cap > FP_MAX_OBJECTS) {
                return 0;
            }
            grown = realloc(l->slots, (size_t)cap * sizeof *grown);
            if (grown == NULL) {
                return 0;
            }
            memset(grown + l->cap, 0, (size_t)(cap - l->cap) * sizeof *grown);
            l->slots = grown;
            l->cap = cap;
        }
        index = l->never_used++;
    }
    s = &l->slots[index];
    s->kind = kind;
    s->next_free = 0;
    s->object_id = object_id;
    s->fd = -1;
    l->live++;
    return index + 1u;
}

static uint64_t slot_handle(const struct fp_load *l, uint32_t taken)
{
    return make_handle(taken - 1u, l->slots[taken - 1u].generation);
}

/* Frees a slot; its handle becomes stale. Lock held. */
static void slot_free(struct fp_load *l, struct fp_slot *s)
{
    uint32_t generation = s->generation + 1u;
    uint32_t index = (uint32_t)(s - l->slots);
    memset(s, 0, sizeof *s);
    s->generation = generation;
    s->fd = -1;
    s->next_free = l->free_head;
    l->free_head = index + 1u;
    l->live--;
}

/* The live slot of kind `kind` a handle names, or NULL. Lock held. */
static struct fp_slot *slot_of(struct fp_load *l, uint64_t handle, enum fp_kind kind)
{
    uint64_t low = handle & 0xffffffffu;
    struct fp_slot *s;
    if (low == 0 || low > l->never_used) {
        return NULL;
    }
    s = &l->slots[low - 1u];
    return s->kind == kind && s->generation == (uint32_t)(handle >> 32) ? s : NULL;
}

/* Checks what needs no lock in an object reference: well formed, made by
 * this mechanism, on this device. */
static MemplugStatus read_ref(const MemplugObjectRef *object, MemplugObjectRef *local,
                              const char *what, const MemplugMessageSink *sink)
{
    MemplugStatus st = read_prefix(local, sizeof *local, object, MEMPLUG_OBJECT_REF_SIZE_1_0, what, sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (local->mechanism_id != FP_MECHANISM_ID) {
        return say(sink, MEMPLUG_STATUS_WRONG_MECHANISM,
                   "%s was made by mechanism %llu, not by \"" FP_MECHANISM_NAME "\" (id %u)", what,
                   (unsigned long long)local->mechanism_id, FP_MECHANISM_ID);
    }
    if (local->device.kind != FP_DEVICE_KIND || local->device.ordinal != FP_DEVICE_ORDINAL) {
        return say(sink, MEMPLUG_STATUS_WRONG_DEVICE,
                   "%s lives on device (kind %u, ordinal %u); this mechanism serves CPU 0", what,
                   (unsigned)local->device.kind, (unsigned)local->device.ordinal);
    }
    return MEMPLUG_STATUS_OK;
}

/* The live slot a reference names; everything the host sent must match
 * what this plugin gave out (handle, kind, object id, address, size).
 * Lock held. */
static MemplugStatus lookup(struct fp_load *l, const MemplugObjectRef *ref, enum fp_kind kind,
                            struct fp_slot **out, const char *what, struct fp_message *m)
{
    struct fp_slot *s = slot_of(l, ref->handle, kind);
    if (s != NULL && kind == FP_OBJECT && s->refs == 0) {
        s = NULL; /* released by the host; only its mappings keep the memory */
    }
    if (s == NULL) {
        return note(m, MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
                    "%s: handle %#llx (object %llu) is not a live %s of this mechanism: never made, "
                    "already released, or another kind",
                    what, (unsigned long long)ref->handle, (unsigned long long)ref->object_id,
                    kind_name[kind]);
    }
    if (s->object_id != ref->object_id || (uint64_t)(uintptr_t)s->base != ref->addr || s->size != ref->size) {
        return note(m, MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
                    "%s: handle %#llx does not match object %llu at %#llx (%llu bytes)", what,
                    (unsigned long long)ref->handle, (unsigned long long)ref->object_id,
                    (unsigned long long)ref->addr, (unsigned long long)ref->size);
    }
    *out = s;
    return MEMPLUG_STATUS_OK;
}

/* Reads and checks a request (allocate, reserve, create, import), as far
 * as the agreed minor defines it. `exportable`: whether the object made can
 * be exported (physical objects only). */
static MemplugStatus read_request(const struct fp_load *l, const MemplugRequest *request,
                                  MemplugRequest *r, int exportable, const MemplugMessageSink *sink)
{
    MemplugStatus st = read_prefix_upto(r, sizeof *r, request_size(l->agreed_minor), request,
                                        MEMPLUG_REQUEST_SIZE_1_0, "request", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (r->flags != 0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "request.flags %#x has bits no minor defines",
                   (unsigned)r->flags);
    }
    if (r->device.kind != FP_DEVICE_KIND || r->device.ordinal != FP_DEVICE_ORDINAL) {
        return say(sink, MEMPLUG_STATUS_WRONG_DEVICE,
                   "request names device (kind %u, ordinal %u); this mechanism serves CPU 0",
                   (unsigned)r->device.kind, (unsigned)r->device.ordinal);
    }
    if (r->size == 0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "request.size is zero");
    }
    /* 1.2's fields are zero below 1.2 (read_prefix stopped before them). */
    if (r->page_size != 0 && r->page_size != page_size()) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "request.page_size %llu is not a page size this mechanism publishes (%llu only)",
                   (unsigned long long)r->page_size, (unsigned long long)page_size());
    }
    if (r->location_kind != MEMPLUG_LOCATION_ANY && r->location_kind != MEMPLUG_LOCATION_HOST) {
        return say(sink, MEMPLUG_STATUS_UNSUPPORTED,
                   "request.location_kind %u: this mechanism places memory in host memory on no "
                   "particular node only",
                   (unsigned)r->location_kind);
    }
    if (r->export_types != 0 && (!exportable || (r->export_types & ~(uint32_t)FP_EXPORT_TYPES) != 0)) {
        return say(sink, MEMPLUG_STATUS_UNSUPPORTED,
                   "request.export_types %#x: %s", (unsigned)r->export_types,
                   exportable ? "only MEMPLUG_HANDLE_MEMFD is offered"
                              : "allocations and reservations are not exportable");
    }
    if (round_to_page(r->size) == 0 || r->size > (uint64_t)SIZE_MAX / 2) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "request.size %llu is larger than any mapping",
                   (unsigned long long)r->size);
    }
    return MEMPLUG_STATUS_OK;
}

/* ======================================================================== */
/* 3a. Allocator                                                            */
/* ======================================================================== */

static MemplugStatus fp_properties(void *ctx, MemplugProperties *out, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugProperties p;
    MemplugStatus st = check_out(out, MEMPLUG_PROPERTIES_SIZE_1_0, "out properties", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = enter(l, "properties", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    memset(&p, 0, sizeof p);
    p.min_alignment = page_size();
    p.max_alignment = FP_MAX_ALIGNMENT;
    p.granularity = page_size();
    /* 1.2: the memory descriptor. */
    p.recommended_granularity = 0;
    p.page_sizes = page_size(); /* bit k set: pages of 2^k bytes; the page is a power of two */
    p.attributes = FP_ATTRIBUTES;
    p.export_types = FP_EXPORT_TYPES;
    p.location_kind = MEMPLUG_LOCATION_HOST;
    p.location_id = 0;
    p.flags = MEMPLUG_PROP_MAPS_AT_OFFSETS;
    /* 1.3: what the copy slot copies between. */
    p.copy_kinds = FP_COPY_KINDS;
    write_prefix(out, &p, properties_size(l->agreed_minor));
    pthread_mutex_unlock(&l->lock);
    return MEMPLUG_STATUS_OK;
}

/* An anonymous mapping of `size` bytes aligned to `alignment`: the extra
 * head and tail of a larger mapping are given back. */
static unsigned char *map_aligned(uint64_t size, uint64_t alignment, int prot, int flags)
{
    uint64_t extra = alignment > page_size() ? alignment : 0;
    unsigned char *raw = mmap(NULL, (size_t)(size + extra), prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    unsigned char *p;
    if (raw == MAP_FAILED) {
        return NULL;
    }
    if (extra == 0) {
        return raw;
    }
    p = (unsigned char *)(((uintptr_t)raw + (uintptr_t)alignment - 1u) & ~((uintptr_t)alignment - 1u));
    if (p > raw) {
        munmap(raw, (size_t)(p - raw));
    }
    if (raw + extra > p) {
        munmap(p + size, (size_t)(raw + extra - p));
    }
    return p;
}

static MemplugStatus fp_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                 const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugRequest r;
    MemplugBlock b;
    struct fp_message m;
    unsigned char *p;
    uint64_t size;
    uint32_t taken;
    MemplugStatus st = read_request(l, request, &r, 0, sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, "out block", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (r.alignment == 0 || (r.alignment & (r.alignment - 1u)) != 0 || r.alignment > FP_MAX_ALIGNMENT) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "request.alignment %llu is not a power of two up to %llu",
                   (unsigned long long)r.alignment, (unsigned long long)FP_MAX_ALIGNMENT);
    }
    size = round_to_page(r.size);
    p = map_aligned(size, r.alignment, PROT_READ | PROT_WRITE, 0);
    if (p == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "allocate: mmap of %llu bytes failed: %s",
                   (unsigned long long)size, strerror(errno));
    }
    st = enter(l, "allocate", sink);
    if (st != MEMPLUG_STATUS_OK) {
        munmap(p, (size_t)size);
        return st;
    }
    taken = slot_take(l, FP_ALLOCATION, r.object_id);
    if (taken == 0) {
        munmap(p, (size_t)size);
        return leave(l, sink, &m, note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "allocate: handle table full"));
    }
    l->slots[taken - 1u].base = p;
    l->slots[taken - 1u].size = size;
    memset(&b, 0, sizeof b);
    b.addr = (uint64_t)(uintptr_t)p;
    b.size = size;
    b.handle = slot_handle(l, taken);
    pthread_mutex_unlock(&l->lock);
    write_prefix(out, &b, sizeof b);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_deallocate(void *ctx, const MemplugObjectRef *object, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef ref;
    struct fp_message m;
    struct fp_slot *s = NULL;
    void *p;
    size_t size;
    MemplugStatus st = read_ref(object, &ref, "allocation", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "deallocate", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = lookup(l, &ref, FP_ALLOCATION, &s, "deallocate", &m);
    if (st != MEMPLUG_STATUS_OK) {
        return leave(l, sink, &m, st);
    }
    p = s->base;
    size = (size_t)s->size;
    slot_free(l, s);
    pthread_mutex_unlock(&l->lock);
    munmap(p, size);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_memory_info(void *ctx, MemplugMemoryInfo *out, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugMemoryInfo info;
    long total = sysconf(_SC_PHYS_PAGES);
    long avail = sysconf(_SC_AVPHYS_PAGES);
    MemplugStatus st = check_out(out, MEMPLUG_MEMORY_INFO_SIZE_1_0, "out memory info", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "memory_info", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    pthread_mutex_unlock(&l->lock);
    if (total <= 0 || avail < 0) {
        return say(sink, MEMPLUG_STATUS_DEVICE_UNAVAILABLE, "sysconf cannot tell physical memory");
    }
    memset(&info, 0, sizeof info);
    info.total_bytes = (uint64_t)total * page_size();
    info.free_bytes = (uint64_t)avail * page_size();
    write_prefix(out, &info, sizeof info);
    return MEMPLUG_STATUS_OK;
}

/* ======================================================================== */
/* 3b. Virtual backing (and the queued forms of 1.2)                        */
/* ======================================================================== */

/* (offset, len) against a reservation: non-empty, page-aligned, no
 * overflow, in bounds. */
static MemplugStatus check_range(const struct fp_slot *s, uint64_t offset, uint64_t len, const char *what,
                                 struct fp_message *m)
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
        return note(m, MEMPLUG_STATUS_OUT_OF_RANGE, "%s: offset %llu + length %llu overflows", what,
                    (unsigned long long)offset, (unsigned long long)len);
    }
    if (offset + len > s->size) {
        return note(m, MEMPLUG_STATUS_OUT_OF_RANGE, "%s: range [%llu, %llu) lies outside the %llu-byte %s",
                    what, (unsigned long long)offset, (unsigned long long)(offset + len),
                    (unsigned long long)s->size, kind_name[s->kind]);
    }
    return MEMPLUG_STATUS_OK;
}

/* Every page of the range is in state `want`, else INVALID_STATE. */
static MemplugStatus check_pages(const struct fp_slot *s, uint64_t offset, uint64_t len, enum fp_page want,
                                 const char *what, struct fp_message *m)
{
    static const char *const page_name[] = {"not committed or mapped", "committed", "mapped",
                                            "being given up by a queued decommit or unmap"};
    uint64_t page = page_size(), i;
    for (i = offset / page; i < (offset + len) / page; i++) {
        if (s->pages[i] != want) {
            return note(m, MEMPLUG_STATUS_INVALID_STATE,
                        "%s: the page at offset %llu is %s (it must be %s); nothing was changed", what,
                        (unsigned long long)(i * page), page_name[s->pages[i]], page_name[want]);
        }
    }
    return MEMPLUG_STATUS_OK;
}

static void set_pages(struct fp_slot *s, uint64_t offset, uint64_t len, enum fp_page state)
{
    memset(s->pages + offset / page_size(), (int)state, (size_t)(len / page_size()));
}

/* Puts the reservation's own inaccessible pages back over a range (after a
 * decommit or an unmap): fresh anonymous pages, so a later commit reads
 * zero. */
static int restore_reserved(struct fp_slot *s, uint64_t offset, uint64_t len)
{
    void *p = mmap(s->base + offset, (size_t)len, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    return p == MAP_FAILED ? -1 : 0;
}

static MemplugStatus fp_reserve(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugRequest r;
    MemplugBlock b;
    struct fp_message m;
    unsigned char *base, *pages;
    uint64_t size;
    uint32_t taken;
    MemplugStatus st = read_request(l, request, &r, 0, sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, "out block", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    /* request.alignment is ignored: reservations align to the granularity. */
    size = round_to_page(r.size);
    pages = calloc((size_t)(size / page_size()), 1);
    base = pages == NULL ? NULL : map_aligned(size, page_size(), PROT_NONE, MAP_NORESERVE);
    if (base == NULL) {
        free(pages);
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "reserve: no room for %llu bytes of address space",
                   (unsigned long long)size);
    }
    st = enter(l, "reserve", sink);
    if (st != MEMPLUG_STATUS_OK) {
        munmap(base, (size_t)size);
        free(pages);
        return st;
    }
    taken = slot_take(l, FP_RESERVATION, r.object_id);
    if (taken == 0) {
        munmap(base, (size_t)size);
        free(pages);
        return leave(l, sink, &m, note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "reserve: handle table full"));
    }
    l->slots[taken - 1u].base = base;
    l->slots[taken - 1u].size = size;
    l->slots[taken - 1u].pages = pages;
    memset(&b, 0, sizeof b);
    b.addr = (uint64_t)(uintptr_t)base;
    b.size = size;
    b.handle = slot_handle(l, taken);
    pthread_mutex_unlock(&l->lock);
    write_prefix(out, &b, sizeof b);
    return MEMPLUG_STATUS_OK;
}

/* The checks commit and commit_on share, then the commit. Lock held. The
 * mapping changes under the lock so that the page states and the mapping
 * change together (a vendor with heavy concurrent growth would lock per
 * reservation instead). */
static MemplugStatus commit_locked(struct fp_load *l, const MemplugObjectRef *ref, uint64_t offset,
                                   uint64_t len, const char *what, struct fp_message *m)
{
    struct fp_slot *s = NULL;
    MemplugStatus st = lookup(l, ref, FP_RESERVATION, &s, what, m);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(s, offset, len, what, m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = check_pages(s, offset, len, PAGE_FREE, what, m);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (mprotect(s->base + offset, (size_t)len, PROT_READ | PROT_WRITE) != 0) {
        mprotect(s->base + offset, (size_t)len, PROT_NONE); /* it may have changed part of it */
        return note(m, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: mprotect of %llu bytes failed", what,
                    (unsigned long long)len);
    }
    set_pages(s, offset, len, PAGE_COMMITTED);
    s->committed_bytes += len;
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_commit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                               const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef ref;
    struct fp_message m;
    MemplugStatus st = read_ref(reservation, &ref, "reservation", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "commit", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    return leave(l, sink, &m, commit_locked(l, &ref, offset, len, "commit", &m));
}

/* The checks decommit and decommit_on share. Lock held. */
static MemplugStatus check_decommit(struct fp_load *l, const MemplugObjectRef *ref, uint64_t offset,
                                    uint64_t len, struct fp_slot **out, const char *what, struct fp_message *m)
{
    MemplugStatus st = lookup(l, ref, FP_RESERVATION, out, what, m);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(*out, offset, len, what, m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = check_pages(*out, offset, len, PAGE_COMMITTED, what, m);
    }
    return st;
}

static MemplugStatus fp_decommit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset,
                                 uint64_t len, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef ref;
    struct fp_message m;
    struct fp_slot *s = NULL;
    MemplugStatus st = read_ref(reservation, &ref, "reservation", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "decommit", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = check_decommit(l, &ref, offset, len, &s, "decommit", &m);
    if (st == MEMPLUG_STATUS_OK) {
        if (restore_reserved(s, offset, len) != 0) {
            st = note(&m, MEMPLUG_STATUS_INTERNAL, "decommit: mmap over %llu bytes failed: %s",
                      (unsigned long long)len, strerror(errno));
        } else {
            set_pages(s, offset, len, PAGE_FREE);
            s->committed_bytes -= len;
        }
    }
    return leave(l, sink, &m, st);
}

static MemplugStatus fp_committed_bytes(void *ctx, const MemplugObjectRef *reservation, uint64_t *out_bytes,
                                        const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef ref;
    struct fp_message m;
    struct fp_slot *s = NULL;
    MemplugStatus st;
    if (out_bytes == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "committed_bytes: out_bytes is NULL");
    }
    st = read_ref(reservation, &ref, "reservation", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "committed_bytes", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = lookup(l, &ref, FP_RESERVATION, &s, "committed_bytes", &m);
    if (st == MEMPLUG_STATUS_OK) {
        *out_bytes = s->committed_bytes;
    }
    return leave(l, sink, &m, st);
}

static void object_unref(struct fp_load *l, uint64_t handle, int mapping);

/* Releases a reservation's slot: its mappings drop their references
 * (draining ones too: their queued job finds the reservation gone and does
 * nothing), its pages go. Lock held. */
static void reservation_free(struct fp_load *l, struct fp_slot *s)
{
    unsigned char *base = s->base;
    size_t size = (size_t)s->size;
    struct fp_mapping *maps = s->maps;
    uint32_t i, n = s->nmaps;
    free(s->pages);
    slot_free(l, s); /* first: the loop below frees other slots */
    for (i = 0; i < n; i++) {
        object_unref(l, maps[i].object, 1);
    }
    free(maps);
    munmap(base, size);
}

static MemplugStatus fp_release(void *ctx, const MemplugObjectRef *reservation, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef ref;
    struct fp_message m;
    struct fp_slot *s = NULL;
    MemplugStatus st = read_ref(reservation, &ref, "reservation", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "release", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = lookup(l, &ref, FP_RESERVATION, &s, "release", &m);
    if (st == MEMPLUG_STATUS_OK) {
        reservation_free(l, s);
    }
    return leave(l, sink, &m, st);
}

/* ======================================================================== */
/* 3c. Streams and fences                                                   */
/* ======================================================================== */

/* One step of a stream's queue. */
enum fp_op { OP_HOST_FN, OP_COPY, OP_WAIT_FENCE, OP_DECOMMIT, OP_UNMAP };

struct fp_item {
    enum fp_op op;
    MemplugHostFn func;          /* OP_HOST_FN */
    void *userdata;
    uint64_t dst, src, len;      /* OP_COPY */
    struct fp_stream *waits_on;  /* OP_WAIT_FENCE: that stream reaching `seq` */
    uint64_t seq;
    uint64_t reservation;        /* OP_DECOMMIT, OP_UNMAP: handle, offset, len */
    uint64_t offset;
    struct fp_item *next;
};

/* A stream: a queue and the thread that runs it. `submitted` counts items
 * ever queued, `done` items run; a fence recorded when `submitted` was n
 * completes once `done` reaches n. The struct outlives stream_destroy
 * while fences (and waits on other streams) still point at it: `refs`
 * counts the stream's handle and each of those. */
struct fp_stream {
    struct fp_load *load;
    pthread_t thread;
    pthread_cond_t work;         /* signalled when an item is queued or closing is set */
    struct fp_item *head, *tail;
    uint64_t submitted, done;
    int closing;                 /* stream_destroy: run what is queued, then exit */
    unsigned refs;
};

static void stream_unref(struct fp_stream *s)
{
    if (--s->refs == 0) {
        pthread_cond_destroy(&s->work);
        free(s);
    }
}

static int fence_done(const struct fp_stream *s, uint64_t seq)
{
    return s->done >= seq;
}

static void run_queued_release(struct fp_load *l, const struct fp_item *it);

/* The stream's worker: runs items in order, each without the lock (a host
 * function may call back into the plugin), then counts it done. */
static void *stream_worker(void *arg)
{
    struct fp_stream *s = arg;
    struct fp_load *l = s->load;
    struct fp_item *it;

    pthread_mutex_lock(&l->lock);
    for (;;) {
        while (s->head == NULL && !s->closing) {
            pthread_cond_wait(&s->work, &l->lock);
        }
        if (s->head == NULL) {
            break; /* closing, and everything queued has run */
        }
        it = s->head;
        switch (it->op) {
        case OP_WAIT_FENCE:
            while (!fence_done(it->waits_on, it->seq)) {
                pthread_cond_wait(&l->progress, &l->lock);
            }
            stream_unref(it->waits_on);
            break;
        case OP_DECOMMIT:
        case OP_UNMAP:
            run_queued_release(l, it); /* under the lock: it changes page states */
            break;
        case OP_HOST_FN:
            pthread_mutex_unlock(&l->lock);
            it->func(it->userdata);
            pthread_mutex_lock(&l->lock);
            break;
        case OP_COPY:
            pthread_mutex_unlock(&l->lock);
            memcpy((void *)(uintptr_t)it->dst, (const void *)(uintptr_t)it->src, (size_t)it->len);
            pthread_mutex_lock(&l->lock);
            break;
        }
        s->head = it->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        free(it);
        s->done++;
        pthread_cond_broadcast(&l->progress);
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

/* Queues an item on a stream. Lock held. */
static void stream_push(struct fp_stream *s, struct fp_item *it)
{
    it->next = NULL;
    if (s->tail != NULL) {
        s->tail->next = it;
    } else {
        s->head = it;
    }
    s->tail = it;
    s->submitted++;
    pthread_cond_signal(&s->work);
}

/* The stream a handle names, or a message. Lock held. */
static MemplugStatus stream_of(struct fp_load *l, uint64_t handle, struct fp_stream **out, const char *what,
                               struct fp_message *m)
{
    struct fp_slot *s = slot_of(l, handle, FP_STREAM);
    if (s == NULL) {
        return note(m, MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
                    "%s: stream %#llx is not a live stream of this mechanism (never made or destroyed)",
                    what, (unsigned long long)handle);
    }
    *out = s->stream;
    return MEMPLUG_STATUS_OK;
}

/* Records a fence at the stream's current end. Lock held. */
static MemplugStatus fence_at_end(struct fp_load *l, struct fp_stream *s, uint64_t *out_fence, const char *what,
                                  struct fp_message *m)
{
    uint32_t taken = slot_take(l, FP_FENCE, 0);
    if (taken == 0) {
        return note(m, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: handle table full, no fence", what);
    }
    l->slots[taken - 1u].stream = s;
    l->slots[taken - 1u].seq = s->submitted;
    s->refs++;
    *out_fence = slot_handle(l, taken);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_stream_create(void *ctx, uint64_t *out_stream, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_stream *s;
    uint32_t taken;
    int err;
    MemplugStatus st;
    if (out_stream == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "stream_create: out_stream is NULL");
    }
    s = calloc(1, sizeof *s);
    if (s == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "stream_create: no memory");
    }
    s->load = l;
    s->refs = 1; /* the stream's handle */
    pthread_cond_init(&s->work, NULL);
    st = enter(l, "stream_create", sink);
    if (st != MEMPLUG_STATUS_OK) {
        stream_unref(s);
        return st;
    }
    taken = slot_take(l, FP_STREAM, 0);
    if (taken == 0) {
        stream_unref(s);
        return leave(l, sink, &m, note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "stream_create: handle table full"));
    }
    err = pthread_create(&s->thread, NULL, stream_worker, s);
    if (err != 0) {
        slot_free(l, &l->slots[taken - 1u]);
        stream_unref(s);
        return leave(l, sink, &m,
                     note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "stream_create: no thread: %s", strerror(err)));
    }
    l->slots[taken - 1u].stream = s;
    *out_stream = slot_handle(l, taken);
    pthread_mutex_unlock(&l->lock);
    return MEMPLUG_STATUS_OK;
}

/* Closes a stream whose slot is already freed: lets its worker run what is
 * queued, joins it. Called without the lock. */
static void stream_close(struct fp_load *l, struct fp_stream *s)
{
    pthread_mutex_lock(&l->lock);
    s->closing = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&l->lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&l->lock);
    stream_unref(s);
    pthread_mutex_unlock(&l->lock);
}

static MemplugStatus fp_stream_destroy(void *ctx, uint64_t stream, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_stream *s = NULL;
    MemplugStatus st = enter(l, "stream_destroy", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = stream_of(l, stream, &s, "stream_destroy", &m);
    if (st != MEMPLUG_STATUS_OK) {
        return leave(l, sink, &m, st);
    }
    if (pthread_equal(pthread_self(), s->thread)) {
        /* Waiting for the stream's work from inside it would never end. */
        return leave(l, sink, &m,
                     note(&m, MEMPLUG_STATUS_BUSY,
                          "stream_destroy: called from one of the stream's own host functions; nothing "
                          "was destroyed"));
    }
    slot_free(l, slot_of(l, stream, FP_STREAM)); /* the handle is stale from here */
    pthread_mutex_unlock(&l->lock);
    stream_close(l, s); /* waits for the work already submitted: the header says destroy blocks */
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_enqueue_host_fn(void *ctx, uint64_t stream, MemplugHostFn func, void *userdata,
                                        const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_stream *s = NULL;
    struct fp_item *it;
    MemplugStatus st;
    if (func == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "enqueue_host_fn: func is NULL");
    }
    it = calloc(1, sizeof *it);
    if (it == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "enqueue_host_fn: no memory");
    }
    it->op = OP_HOST_FN;
    it->func = func;
    it->userdata = userdata;
    st = enter(l, "enqueue_host_fn", sink);
    if (st != MEMPLUG_STATUS_OK) {
        free(it); /* refused: it never runs */
        return st;
    }
    st = stream_of(l, stream, &s, "enqueue_host_fn", &m);
    if (st != MEMPLUG_STATUS_OK) {
        free(it);
        return leave(l, sink, &m, st);
    }
    stream_push(s, it); /* accepted: the worker runs it exactly once, loss or not */
    pthread_mutex_unlock(&l->lock);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_fence_record(void *ctx, uint64_t stream, uint64_t *out_fence,
                                     const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_stream *s = NULL;
    MemplugStatus st;
    if (out_fence == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "fence_record: out_fence is NULL");
    }
    st = enter(l, "fence_record", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = stream_of(l, stream, &s, "fence_record", &m);
    if (st == MEMPLUG_STATUS_OK) {
        st = fence_at_end(l, s, out_fence, "fence_record", &m);
    }
    return leave(l, sink, &m, st);
}

/* The fence a handle names, or a message. Lock held. */
static MemplugStatus fence_of(struct fp_load *l, uint64_t fence, struct fp_slot **out, const char *what,
                              struct fp_message *m)
{
    *out = slot_of(l, fence, FP_FENCE);
    if (*out == NULL) {
        return note(m, MEMPLUG_STATUS_UNKNOWN_ALLOCATION,
                    "%s: fence %#llx is not a live fence of this mechanism (never recorded or destroyed)",
                    what, (unsigned long long)fence);
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_fence_query(void *ctx, uint64_t fence, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_slot *f = NULL;
    MemplugStatus st = enter(l, "fence_query", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = fence_of(l, fence, &f, "fence_query", &m);
    if (st == MEMPLUG_STATUS_OK && !fence_done(f->stream, f->seq)) {
        st = MEMPLUG_STATUS_NOT_READY; /* not a failure: no message */
        m.len = 0;
    }
    return leave(l, sink, &m, st);
}

/* now + ns on CLOCK_MONOTONIC (the clock `progress` waits on); 0 when it
 * does not fit, which the caller reads as "wait without limit". */
static int deadline_after(uint64_t ns, struct timespec *out)
{
    struct timespec now;
    uint64_t sec = ns / 1000000000u;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (sec > (uint64_t)0x7fffffff) {
        return 0;
    }
    out->tv_sec = now.tv_sec + (time_t)sec;
    out->tv_nsec = now.tv_nsec + (long)(ns % 1000000000u);
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
    return 1;
}

static MemplugStatus fp_fence_wait(void *ctx, uint64_t fence, uint64_t timeout_ns, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_slot *f = NULL;
    struct fp_stream *s;
    struct timespec deadline;
    uint64_t seq;
    int bounded = timeout_ns != UINT64_MAX && deadline_after(timeout_ns, &deadline);
    MemplugStatus st = enter(l, "fence_wait", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = fence_of(l, fence, &f, "fence_wait", &m);
    if (st != MEMPLUG_STATUS_OK) {
        return leave(l, sink, &m, st);
    }
    /* The fence's slot may be destroyed or moved while we wait: keep its
     * stream (and a reference on it) and its point. */
    s = f->stream;
    seq = f->seq;
    s->refs++;
    while (!fence_done(s, seq) && st == MEMPLUG_STATUS_OK) {
        if (!bounded) {
            pthread_cond_wait(&l->progress, &l->lock);
        } else if (pthread_cond_timedwait(&l->progress, &l->lock, &deadline) == ETIMEDOUT &&
                   !fence_done(s, seq)) {
            st = note(&m, MEMPLUG_STATUS_TIMEOUT, "fence_wait: fence %#llx did not complete within %llu ns",
                      (unsigned long long)fence, (unsigned long long)timeout_ns);
        }
    }
    stream_unref(s);
    return leave(l, sink, &m, st);
}

static MemplugStatus fp_fence_destroy(void *ctx, uint64_t fence, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_slot *f = NULL;
    MemplugStatus st = enter(l, "fence_destroy", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = fence_of(l, fence, &f, "fence_destroy", &m);
    if (st == MEMPLUG_STATUS_OK) {
        stream_unref(f->stream);
        slot_free(l, f);
    }
    return leave(l, sink, &m, st);
}

static MemplugStatus fp_stream_wait_fence(void *ctx, uint64_t stream, uint64_t fence,
                                          const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_stream *s = NULL;
    struct fp_slot *f = NULL;
    struct fp_item *it = calloc(1, sizeof *it);
    MemplugStatus st;
    if (it == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "stream_wait_fence: no memory");
    }
    st = enter(l, "stream_wait_fence", sink);
    if (st != MEMPLUG_STATUS_OK) {
        free(it);
        return st;
    }
    st = stream_of(l, stream, &s, "stream_wait_fence", &m);
    if (st == MEMPLUG_STATUS_OK) {
        st = fence_of(l, fence, &f, "stream_wait_fence", &m);
    }
    if (st != MEMPLUG_STATUS_OK) {
        free(it);
        return leave(l, sink, &m, st);
    }
    it->op = OP_WAIT_FENCE;
    it->waits_on = f->stream;
    it->seq = f->seq;
    f->stream->refs++; /* dropped by the worker once the wait is over */
    stream_push(s, it);
    pthread_mutex_unlock(&l->lock);
    return MEMPLUG_STATUS_OK;
}

/* ======================================================================== */
/* 3d. The copy slot (1.3)                                                   */
/* ======================================================================== */

/* Where a range lies: in the mechanism's memory it must lie wholly in one
 * allocation or in the committed or mapped pages of one reservation; a
 * range touching none of them is host memory (COPY_HOST: the caller's to
 * keep valid, as for memcpy). A vendor with many objects would keep an
 * address-ordered index; the table scan keeps this file short. Lock held. */
static MemplugStatus check_copy_range(struct fp_load *l, uint64_t addr, uint64_t len, int writes,
                                      const char *which, struct fp_message *m)
{
    uint32_t i;
    for (i = 0; i < l->never_used; i++) {
        const struct fp_slot *s = &l->slots[i];
        uint64_t base = (uint64_t)(uintptr_t)s->base, p, page = page_size();
        if ((s->kind != FP_ALLOCATION && s->kind != FP_RESERVATION) || addr >= base + s->size ||
            addr + len <= base) {
            continue;
        }
        if (addr < base || addr + len > base + s->size) {
            return note(m, MEMPLUG_STATUS_OUT_OF_RANGE,
                        "copy: the %s range [%#llx, %#llx) runs outside the %s [%#llx, %#llx) it starts or "
                        "ends in; nothing was enqueued",
                        which, (unsigned long long)addr, (unsigned long long)(addr + len), kind_name[s->kind],
                        (unsigned long long)base, (unsigned long long)(base + s->size));
        }
        if (s->kind == FP_ALLOCATION) {
            return MEMPLUG_STATUS_OK;
        }
        for (p = (addr - base) / page; p <= (addr + len - 1u - base) / page; p++) {
            uint32_t k;
            if (s->pages[p] != PAGE_COMMITTED && s->pages[p] != PAGE_MAPPED) {
                return note(m, MEMPLUG_STATUS_OUT_OF_RANGE,
                            "copy: the %s range [%#llx, %#llx) reaches the page at offset %llu of a "
                            "reservation, which is neither committed nor mapped; nothing was enqueued",
                            which, (unsigned long long)addr, (unsigned long long)(addr + len),
                            (unsigned long long)(p * page));
            }
            for (k = 0; writes && s->pages[p] == PAGE_MAPPED && k < s->nmaps; k++) {
                const struct fp_mapping *mp = &s->maps[k];
                if (p * page >= mp->offset && p * page < mp->offset + mp->len &&
                    !(mp->access & MEMPLUG_ACCESS_WRITE)) {
                    return note(m, MEMPLUG_STATUS_INVALID_ARGUMENT,
                                "copy: the destination reaches a read-only mapping at offset %llu",
                                (unsigned long long)mp->offset);
                }
            }
        }
        return MEMPLUG_STATUS_OK;
    }
    return MEMPLUG_STATUS_OK; /* host memory */
}

static MemplugStatus fp_copy(void *ctx, uint64_t stream, uint64_t dst, uint64_t src, uint64_t len,
                             const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    struct fp_message m;
    struct fp_stream *s = NULL;
    struct fp_item *it = calloc(1, sizeof *it);
    MemplugStatus st;
    if (it == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "copy: no memory");
    }
    st = enter(l, "copy", sink);
    if (st != MEMPLUG_STATUS_OK) {
        free(it);
        return st;
    }
    /* Every check before anything is enqueued; each refusal changes nothing. */
    st = stream_of(l, stream, &s, "copy", &m);
    if (st == MEMPLUG_STATUS_OK && len != 0) {
        if (dst + len < dst || src + len < src) {
            st = note(&m, MEMPLUG_STATUS_OUT_OF_RANGE, "copy: a range of %llu bytes wraps around the address space",
                      (unsigned long long)len);
        } else if (dst < src + len && src < dst + len) {
            st = note(&m, MEMPLUG_STATUS_INVALID_ARGUMENT,
                      "copy: [%#llx, +%llu) and [%#llx, +%llu) overlap (copy has no memmove semantics)",
                      (unsigned long long)dst, (unsigned long long)len, (unsigned long long)src,
                      (unsigned long long)len);
        } else {
            st = check_copy_range(l, src, len, 0, "source", &m);
            if (st == MEMPLUG_STATUS_OK) {
                st = check_copy_range(l, dst, len, 1, "destination", &m);
            }
        }
    }
    if (st != MEMPLUG_STATUS_OK || len == 0) {
        free(it);
        return leave(l, sink, &m, st);
    }
    it->op = OP_COPY;
    it->dst = dst;
    it->src = src;
    it->len = len;
    stream_push(s, it);
    pthread_mutex_unlock(&l->lock);
    return MEMPLUG_STATUS_OK;
}

/* ======================================================================== */
/* 3e. Shared mapping: physical objects, export and import                  */
/* ======================================================================== */

/* Drops a mapping's (`mapping`) or the host's reference of a physical
 * object; the last of both closes its memfd. Lock held. */
static void object_unref(struct fp_load *l, uint64_t handle, int mapping)
{
    struct fp_slot *o = slot_of(l, handle, FP_OBJECT);
    if (o == NULL) {
        return;
    }
    if (mapping) {
        o->mapped--;
    } else {
        o->refs--;
    }
    if (o->refs == 0 && o->mapped == 0) {
        close(o->fd);
        slot_free(l, o);
    }
}

/* Makes a physical object's slot around a memfd `fd` (taken over). */
static MemplugStatus object_insert(struct fp_load *l, int fd, uint64_t size, uint64_t object_id,
                                   MemplugBlock *out, const char *what, const MemplugMessageSink *sink)
{
    struct fp_message m;
    MemplugBlock b;
    uint32_t taken;
    MemplugStatus st = enter(l, what, sink);
    if (st != MEMPLUG_STATUS_OK) {
        close(fd);
        return st;
    }
    taken = slot_take(l, FP_OBJECT, object_id);
    if (taken == 0) {
        close(fd);
        return leave(l, sink, &m, note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: handle table full", what));
    }
    l->slots[taken - 1u].fd = fd;
    l->slots[taken - 1u].size = size;
    l->slots[taken - 1u].refs = 1;
    memset(&b, 0, sizeof b);
    b.addr = 0; /* a physical object has no address until it is mapped */
    b.size = size;
    b.handle = slot_handle(l, taken);
    pthread_mutex_unlock(&l->lock);
    write_prefix(out, &b, sizeof b);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_create(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                               const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugRequest r;
    uint64_t size;
    int fd;
    MemplugStatus st = read_request(l, request, &r, 1, sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, "out block", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    size = round_to_page(r.size);
    /* Sealed against shrinking and growing: an importer may rely on the
     * size, and pages cannot vanish under a mapping. */
    fd = memfd_create("memplug-c-full", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int err = errno;
        if (fd >= 0) {
            close(fd);
        }
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "create: memfd of %llu bytes failed: %s",
                   (unsigned long long)size, strerror(err));
    }
    return object_insert(l, fd, size, r.object_id, out, "create", sink);
}

/* The checks map and map_on share, then the mapping. Lock held. */
static MemplugStatus map_locked(struct fp_load *l, const MemplugObjectRef *obj, uint64_t object_offset,
                                const MemplugObjectRef *res, uint64_t offset, uint64_t len, uint32_t access,
                                const char *what, struct fp_message *m)
{
    struct fp_slot *o = NULL, *s = NULL;
    struct fp_mapping *maps;
    int prot = access == MEMPLUG_ACCESS_READ ? PROT_READ : PROT_READ | PROT_WRITE;
    MemplugStatus st = lookup(l, obj, FP_OBJECT, &o, what, m);
    if (st == MEMPLUG_STATUS_OK) {
        st = lookup(l, res, FP_RESERVATION, &s, what, m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(s, offset, len, what, m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(o, object_offset, len, what, m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = check_pages(s, offset, len, PAGE_FREE, what, m);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (s->nmaps == s->cap_maps) {
        uint32_t cap = s->cap_maps == 0 ? 4u : s->cap_maps * 2u;
        maps = realloc(s->maps, (size_t)cap * sizeof *maps);
        if (maps == NULL) {
            return note(m, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: no memory", what);
        }
        s->maps = maps;
        s->cap_maps = cap;
    }
    if (mmap(s->base + offset, (size_t)len, prot, MAP_SHARED | MAP_FIXED, o->fd, (off_t)object_offset) ==
        MAP_FAILED) {
        int err = errno;
        restore_reserved(s, offset, len);
        return note(m, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: mmap of the object failed: %s", what, strerror(err));
    }
    s->maps[s->nmaps].offset = offset;
    s->maps[s->nmaps].len = len;
    s->maps[s->nmaps].object = obj->handle;
    s->maps[s->nmaps].access = access;
    s->maps[s->nmaps].draining = 0;
    s->nmaps++;
    set_pages(s, offset, len, PAGE_MAPPED);
    o->mapped++; /* a mapping holds the memory */
    return MEMPLUG_STATUS_OK;
}

/* Reads the two references of map/map_on and checks the access. */
static MemplugStatus read_map_args(const MemplugObjectRef *object, MemplugObjectRef *obj,
                                   const MemplugObjectRef *reservation, MemplugObjectRef *res, uint32_t access,
                                   const MemplugMessageSink *sink)
{
    MemplugStatus st = read_ref(object, obj, "physical object", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = read_ref(reservation, res, "reservation", sink);
    }
    if (st == MEMPLUG_STATUS_OK && access != MEMPLUG_ACCESS_READ &&
        access != (MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE)) {
        st = say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "map: access %#x is neither read nor read|write",
                 (unsigned)access);
    }
    return st;
}

static MemplugStatus fp_map(void *ctx, const MemplugObjectRef *object, uint64_t object_offset,
                            const MemplugObjectRef *reservation, uint64_t offset, uint64_t len, uint32_t access,
                            const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef obj, res;
    struct fp_message m;
    MemplugStatus st = read_map_args(object, &obj, reservation, &res, access, sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "map", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    return leave(l, sink, &m, map_locked(l, &obj, object_offset, &res, offset, len, access, "map", &m));
}

/* The mapping that starts at `offset` and spans `len`, not being given up
 * already. Lock held. */
static MemplugStatus find_mapping(struct fp_slot *s, uint64_t offset, uint64_t len, uint32_t *out,
                                  const char *what, struct fp_message *m)
{
    uint32_t i;
    for (i = 0; i < s->nmaps; i++) {
        if (s->maps[i].offset == offset && s->maps[i].len == len && !s->maps[i].draining) {
            *out = i;
            return MEMPLUG_STATUS_OK;
        }
    }
    return note(m, MEMPLUG_STATUS_INVALID_STATE,
                "%s: no mapping starts at offset %llu with %llu bytes; nothing was changed", what,
                (unsigned long long)offset, (unsigned long long)len);
}

/* Removes mapping `i` (its pages become reserved again) and drops its
 * object reference. Lock held. */
static void unmap_index(struct fp_load *l, struct fp_slot *s, uint32_t i)
{
    struct fp_mapping mp = s->maps[i];
    restore_reserved(s, mp.offset, mp.len);
    set_pages(s, mp.offset, mp.len, PAGE_FREE);
    s->maps[i] = s->maps[--s->nmaps];
    object_unref(l, mp.object, 1);
}

static MemplugStatus fp_unmap(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                              const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef res;
    struct fp_message m;
    struct fp_slot *s = NULL;
    uint32_t i = 0;
    MemplugStatus st = read_ref(reservation, &res, "reservation", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "unmap", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = lookup(l, &res, FP_RESERVATION, &s, "unmap", &m);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(s, offset, len, "unmap", &m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = find_mapping(s, offset, len, &i, "unmap", &m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        unmap_index(l, s, i);
    }
    return leave(l, sink, &m, st);
}

/* retain and release share everything but the direction. */
static MemplugStatus change_refs(struct fp_load *l, const MemplugObjectRef *object, int up, const char *what,
                                 const MemplugMessageSink *sink)
{
    MemplugObjectRef obj;
    struct fp_message m;
    struct fp_slot *o = NULL;
    MemplugStatus st = read_ref(object, &obj, "physical object", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, what, sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = lookup(l, &obj, FP_OBJECT, &o, what, &m);
    if (st == MEMPLUG_STATUS_OK) {
        if (up) {
            o->refs++;
        } else {
            object_unref(l, obj.handle, 0);
        }
    }
    return leave(l, sink, &m, st);
}

static MemplugStatus fp_retain(void *ctx, const MemplugObjectRef *object, const MemplugMessageSink *sink)
{
    return change_refs(ctx, object, 1, "retain", sink);
}

static MemplugStatus fp_object_release(void *ctx, const MemplugObjectRef *object, const MemplugMessageSink *sink)
{
    return change_refs(ctx, object, 0, "release (physical object)", sink);
}

/* A new descriptor of an object's memfd for the caller: made for this
 * call, never 0, 1 or 2, close-on-exec. */
static MemplugStatus dup_object_fd(struct fp_load *l, const MemplugObjectRef *object, int *out_fd,
                                   const char *what, const MemplugMessageSink *sink)
{
    MemplugObjectRef obj;
    struct fp_message m;
    struct fp_slot *o = NULL;
    MemplugStatus st = read_ref(object, &obj, "physical object", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, what, sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = lookup(l, &obj, FP_OBJECT, &o, what, &m);
    if (st == MEMPLUG_STATUS_OK) {
        *out_fd = fcntl(o->fd, F_DUPFD_CLOEXEC, 3);
        if (*out_fd < 0) {
            st = note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: dup failed: %s", what, strerror(errno));
        }
    }
    return leave(l, sink, &m, st);
}

static MemplugStatus fp_export_fd(void *ctx, const MemplugObjectRef *object, int32_t *out_fd,
                                  const MemplugMessageSink *sink)
{
    int fd = -1;
    MemplugStatus st;
    if (out_fd == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "export_fd: out_fd is NULL");
    }
    st = dup_object_fd(ctx, object, &fd, "export_fd", sink);
    if (st == MEMPLUG_STATUS_OK) {
        *out_fd = fd;
    }
    return st;
}

/* Imports a descriptor the caller lends: only a memfd sealed against
 * shrinking (what export made; an ordinary file or a pipe is not memory
 * this mechanism can rely on), at least `size` bytes. The plugin keeps a
 * dup and never closes the caller's descriptor. */
static MemplugStatus import_lent_fd(struct fp_load *l, int fd, const MemplugRequest *request, MemplugBlock *out,
                                    const char *what, const MemplugMessageSink *sink)
{
    MemplugRequest r;
    struct stat st_buf;
    uint64_t size;
    int seals, kept;
    MemplugStatus st = read_request(l, request, &r, 1, sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, "out block", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (fd < 0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "%s: descriptor %d is negative", what, fd);
    }
    if (fstat(fd, &st_buf) != 0 || !S_ISREG(st_buf.st_mode)) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "%s: descriptor %d is not a memfd (not a memory file)",
                   what, fd);
    }
    seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "%s: descriptor %d is %s; only a memfd sealed against shrinking (what export_fd and "
                   "export_handle give) is imported",
                   what, fd, seals < 0 ? "not a memfd (an ordinary file?)" : "a memfd not sealed against shrinking");
    }
    size = round_to_page(r.size);
    if ((uint64_t)st_buf.st_size < size) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "%s: %llu bytes asked of a memfd of %llu bytes", what,
                   (unsigned long long)size, (unsigned long long)st_buf.st_size);
    }
    kept = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (kept < 0) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: dup failed: %s", what, strerror(errno));
    }
    return object_insert(l, kept, size, r.object_id, out, what, sink);
}

static MemplugStatus fp_import_fd(void *ctx, int32_t fd, const MemplugRequest *request, MemplugBlock *out,
                                  const MemplugMessageSink *sink)
{
    return import_lent_fd(ctx, fd, request, out, "import_fd", sink);
}

static MemplugStatus fp_export_handle(void *ctx, const MemplugObjectRef *object, uint32_t handle_type,
                                      MemplugHandle *out, const MemplugMessageSink *sink)
{
    MemplugHandle h;
    int fd = -1;
    MemplugStatus st;
    if (handle_type != MEMPLUG_HANDLE_MEMFD) {
        return say(sink, MEMPLUG_STATUS_UNSUPPORTED,
                   "export_handle: handle kind %#x is not offered (MEMPLUG_HANDLE_MEMFD only)", (unsigned)handle_type);
    }
    st = check_out(out, MEMPLUG_HANDLE_SIZE_1_2, "out handle", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = dup_object_fd(ctx, object, &fd, "export_handle", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    memset(&h, 0, sizeof h);
    h.handle_type = MEMPLUG_HANDLE_MEMFD;
    h.fd = fd;
    write_prefix(out, &h, sizeof h);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus fp_import_handle(void *ctx, const MemplugHandle *handle, const MemplugRequest *request,
                                      MemplugBlock *out, const MemplugMessageSink *sink)
{
    MemplugHandle h;
    MemplugStatus st = read_prefix(&h, sizeof h, handle, MEMPLUG_HANDLE_SIZE_1_2, "handle", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    /* An absence first: a kind this mechanism does not import, before what
     * the descriptor is. */
    if (h.handle_type != MEMPLUG_HANDLE_MEMFD) {
        return say(sink, MEMPLUG_STATUS_UNSUPPORTED,
                   "import_handle: handle kind %#x is not imported (MEMPLUG_HANDLE_MEMFD only)",
                   (unsigned)h.handle_type);
    }
    return import_lent_fd(ctx, h.fd, request, out, "import_handle", sink);
}

/* ---- queued binding (1.2) ----------------------------------------------- */

/* Making a range usable cannot hurt work already queued (that work may not
 * touch a range that was not usable), so commit_on and map_on change the
 * mapping at once and return a fence at the stream's end. Giving a range
 * up must wait for the work before it: decommit_on and unmap_on mark the
 * pages DRAINING at once and queue the change itself for the worker. */

static MemplugStatus fp_commit_on(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                                  uint64_t stream, uint64_t *out_fence, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef ref;
    struct fp_message m;
    struct fp_stream *s = NULL;
    uint32_t spare;
    MemplugStatus st;
    if (out_fence == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "commit_on: out_fence is NULL");
    }
    st = read_ref(reservation, &ref, "reservation", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "commit_on", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = stream_of(l, stream, &s, "commit_on", &m);
    /* Take the fence's slot first, so nothing can fail after the commit. */
    spare = st == MEMPLUG_STATUS_OK ? slot_take(l, FP_FENCE, 0) : 0;
    if (st == MEMPLUG_STATUS_OK && spare == 0) {
        st = note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "commit_on: handle table full, no fence");
    }
    if (st == MEMPLUG_STATUS_OK) {
        slot_free(l, &l->slots[spare - 1u]);
        st = commit_locked(l, &ref, offset, len, "commit_on", &m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = fence_at_end(l, s, out_fence, "commit_on", &m); /* reuses the slot just freed */
    }
    return leave(l, sink, &m, st);
}

static MemplugStatus fp_map_on(void *ctx, const MemplugObjectRef *object, uint64_t object_offset,
                               const MemplugObjectRef *reservation, uint64_t offset, uint64_t len, uint32_t access,
                               uint64_t stream, uint64_t *out_fence, const MemplugMessageSink *sink)
{
    struct fp_load *l = ctx;
    MemplugObjectRef obj, res;
    struct fp_message m;
    struct fp_stream *s = NULL;
    uint32_t spare;
    MemplugStatus st;
    if (out_fence == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "map_on: out_fence is NULL");
    }
    st = read_map_args(object, &obj, reservation, &res, access, sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = enter(l, "map_on", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = stream_of(l, stream, &s, "map_on", &m);
    spare = st == MEMPLUG_STATUS_OK ? slot_take(l, FP_FENCE, 0) : 0;
    if (st == MEMPLUG_STATUS_OK && spare == 0) {
        st = note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "map_on: handle table full, no fence");
    }
    if (st == MEMPLUG_STATUS_OK) {
        slot_free(l, &l->slots[spare - 1u]);
        st = map_locked(l, &obj, object_offset, &res, offset, len, access, "map_on", &m);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = fence_at_end(l, s, out_fence, "map_on", &m);
    }
    return leave(l, sink, &m, st);
}

/* The worker's half of decommit_on and unmap_on: the reservation may have
 * been released meanwhile (its addresses may be someone else's now), so
 * the job does nothing then; release already dropped the mapping's
 * reference. Lock held. */
static void run_queued_release(struct fp_load *l, const struct fp_item *it)
{
    struct fp_slot *s = slot_of(l, it->reservation, FP_RESERVATION);
    uint32_t i;
    if (s == NULL) {
        return;
    }
    if (it->op == OP_DECOMMIT) {
        restore_reserved(s, it->offset, it->len);
        set_pages(s, it->offset, it->len, PAGE_FREE);
        return;
    }
    for (i = 0; i < s->nmaps; i++) {
        if (s->maps[i].offset == it->offset && s->maps[i].draining) {
            unmap_index(l, s, i);
            return;
        }
    }
}

/* decommit_on and unmap_on: the checks of their synchronous forms, then
 * the pages are DRAINING and the change is queued, with a fence behind
 * it. */
static MemplugStatus queue_release(struct fp_load *l, const MemplugObjectRef *reservation, uint64_t offset,
                                   uint64_t len, uint64_t stream, uint64_t *out_fence, enum fp_op op,
                                   const char *what, const MemplugMessageSink *sink)
{
    MemplugObjectRef ref;
    struct fp_message m;
    struct fp_stream *str = NULL;
    struct fp_slot *s = NULL;
    struct fp_item *it;
    uint32_t i = 0, spare = 0;
    MemplugStatus st;
    if (out_fence == NULL) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "%s: out_fence is NULL", what);
    }
    st = read_ref(reservation, &ref, "reservation", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    it = calloc(1, sizeof *it);
    if (it == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: no memory", what);
    }
    st = enter(l, what, sink);
    if (st != MEMPLUG_STATUS_OK) {
        free(it);
        return st;
    }
    st = stream_of(l, stream, &str, what, &m);
    if (st == MEMPLUG_STATUS_OK) {
        st = op == OP_DECOMMIT ? check_decommit(l, &ref, offset, len, &s, what, &m)
                               : lookup(l, &ref, FP_RESERVATION, &s, what, &m);
    }
    if (st == MEMPLUG_STATUS_OK && op == OP_UNMAP) {
        st = check_range(s, offset, len, what, &m);
        if (st == MEMPLUG_STATUS_OK) {
            st = find_mapping(s, offset, len, &i, what, &m);
        }
    }
    if (st == MEMPLUG_STATUS_OK) {
        spare = slot_take(l, FP_FENCE, 0); /* may move the table: look s up again below */
        if (spare == 0) {
            st = note(&m, MEMPLUG_STATUS_OUT_OF_MEMORY, "%s: handle table full, no fence", what);
        }
    }
    if (st != MEMPLUG_STATUS_OK) {
        free(it);
        return leave(l, sink, &m, st);
    }
    slot_free(l, &l->slots[spare - 1u]);
    s = slot_of(l, ref.handle, FP_RESERVATION);
    set_pages(s, offset, len, PAGE_DRAINING);
    if (op == OP_DECOMMIT) {
        s->committed_bytes -= len; /* gone for every later call already */
    } else {
        s->maps[i].draining = 1;
    }
    it->op = op;
    it->reservation = ref.handle;
    it->offset = offset;
    it->len = len;
    stream_push(str, it);
    st = fence_at_end(l, str, out_fence, what, &m); /* the slot freed above: cannot fail */
    return leave(l, sink, &m, st);
}

static MemplugStatus fp_decommit_on(void *ctx, const MemplugObjectRef *reservation, uint64_t offset,
                                    uint64_t len, uint64_t stream, uint64_t *out_fence, const MemplugMessageSink *sink)
{
    return queue_release(ctx, reservation, offset, len, stream, out_fence, OP_DECOMMIT, "decommit_on", sink);
}

static MemplugStatus fp_unmap_on(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                                 uint64_t stream, uint64_t *out_fence, const MemplugMessageSink *sink)
{
    return queue_release(ctx, reservation, offset, len, stream, out_fence, OP_UNMAP, "unmap_on", sink);
}

/* ======================================================================== */
/* 4. Descriptors, negotiation, unload                                      */
/* ======================================================================== */

/* The tables are the same for every load and minor: their struct_size is
 * sizeof at every minor. From the header's rules:
 * Table length at an older minor: a table or struct a plugin publishes may
 * be longer than the agreed minor defines, so the sizeof of the plugin's
 * own struct is right at every minor; the host reads and calls nothing past
 * the size the agreed minor defines (its SIZE_1_N constant), and a
 * capability bit still needs every slot the minor that defines it brings.
 */
static const MemplugAllocator g_allocator = {
    .struct_size = sizeof(MemplugAllocator),
    .properties = fp_properties,
    .allocate = fp_allocate,
    .deallocate = fp_deallocate,
    .memory_info = fp_memory_info,
};

static const MemplugVirtualBacking g_virtual_backing = {
    .struct_size = sizeof(MemplugVirtualBacking),
    .reserve = fp_reserve,
    .commit = fp_commit,
    .decommit = fp_decommit,
    .committed_bytes = fp_committed_bytes,
    .release = fp_release,
    .commit_on = fp_commit_on,     /* 1.2, MEMPLUG_CAP_QUEUED_BINDING */
    .decommit_on = fp_decommit_on, /* 1.2, MEMPLUG_CAP_QUEUED_BINDING */
};

static const MemplugSharedMapping g_shared_mapping = {
    .struct_size = sizeof(MemplugSharedMapping),
    .create = fp_create,
    .map = fp_map,
    .unmap = fp_unmap,
    .retain = fp_retain,
    .release = fp_object_release,
    .export_fd = fp_export_fd,         /* 1.1, MEMPLUG_CAP_SHARED_EXPORT */
    .import_fd = fp_import_fd,         /* 1.1, MEMPLUG_CAP_SHARED_EXPORT */
    .export_handle = fp_export_handle, /* 1.2, MEMPLUG_CAP_TYPED_EXPORT */
    .import_handle = fp_import_handle, /* 1.2, MEMPLUG_CAP_TYPED_EXPORT */
    .map_on = fp_map_on,               /* 1.2, MEMPLUG_CAP_QUEUED_BINDING */
    .unmap_on = fp_unmap_on,           /* 1.2, MEMPLUG_CAP_QUEUED_BINDING */
};

static const MemplugSync g_sync = {
    .struct_size = sizeof(MemplugSync),
    .stream_create = fp_stream_create,
    .stream_adopt = NULL, /* a CPU queue has no native stream to adopt */
    .stream_destroy = fp_stream_destroy,
    .enqueue_host_fn = fp_enqueue_host_fn,
    .fence_record = fp_fence_record,
    .fence_query = fp_fence_query,
    .fence_wait = fp_fence_wait,
    .fence_destroy = fp_fence_destroy,
    .stream_wait_fence = fp_stream_wait_fence, /* 1.2 */
    .stream_adopt_typed = NULL,
    .copy = fp_copy, /* 1.3; properties say copy_kinds */
};

/* The device's identity: the same for every host, plugin-owned, immutable
 * until unload. A CPU has no UUID or PCI address. */
static const MemplugDeviceIdentity g_identity = {
    .struct_size = sizeof(MemplugDeviceIdentity),
    .valid = MEMPLUG_IDENTITY_NUMA_NODE,
    .numa_node = 0,
};

/* The capability bits of each agreed minor: nothing a later minor defines
 * (a 1.0 host knows every bit of 1.0 and must not see 1.1's). */
static uint32_t capabilities_at(uint32_t minor)
{
    uint32_t caps =
        MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING | MEMPLUG_CAP_SYNC;
    if (minor >= 1) {
        caps |= MEMPLUG_CAP_SHARED_EXPORT;
    }
    if (minor >= 2) {
        caps |= MEMPLUG_CAP_TYPED_EXPORT | MEMPLUG_CAP_QUEUED_BINDING;
    }
    return caps; /* 1.3 adds no bit: the copy slot and copy_kinds say it */
}

static uint64_t fp_live_objects(void *ctx)
{
    struct fp_load *l = ctx;
    uint64_t n;
    pthread_mutex_lock(&l->lock);
    n = l->live;
    pthread_mutex_unlock(&l->lock);
    return n;
}

/* Called once per load, after the host's last call. Frees what this load
 * made (a host unloads with live_objects at 0, so normally nothing) and
 * takes the load off the loss trigger's list, waiting for a report in
 * progress: the services table is the host's only until this returns. */
static void fp_unload(void *ctx)
{
    struct fp_load *l = ctx;
    struct fp_load **p;
    uint32_t i;

    pthread_mutex_lock(&g_loads_lock);
    for (p = &g_loads; *p != NULL; p = &(*p)->next) {
        if (*p == l) {
            *p = l->next;
            break;
        }
    }
    while (l->reporting > 0) {
        pthread_cond_wait(&l->reported, &g_loads_lock);
    }
    pthread_mutex_unlock(&g_loads_lock);

    for (i = 0; i < l->never_used; i++) {
        struct fp_slot *s = &l->slots[i];
        struct fp_stream *str = s->stream;
        if (s->kind == FP_STREAM) {
            pthread_mutex_lock(&l->lock);
            slot_free(l, s);
            pthread_mutex_unlock(&l->lock);
            stream_close(l, str);
        }
    }
    pthread_mutex_lock(&l->lock);
    for (i = 0; i < l->never_used; i++) {
        struct fp_slot *s = &l->slots[i];
        if (s->kind == FP_ALLOCATION) {
            munmap(s->base, (size_t)s->size);
        } else if (s->kind == FP_RESERVATION) {
            munmap(s->base, (size_t)s->size);
            free(s->pages);
            free(s->maps);
        } else if (s->kind == FP_OBJECT) {
            close(s->fd);
        } else if (s->kind == FP_FENCE) {
            stream_unref(s->stream);
        }
    }
    pthread_mutex_unlock(&l->lock);
    free(l->slots);
    pthread_cond_destroy(&l->reported);
    pthread_cond_destroy(&l->progress);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

/* A new load for one negotiation, its descriptor that of `minor`. */
static struct fp_load *load_new(uint32_t minor, const MemplugHostServices *services)
{
    pthread_condattr_t attr;
    struct fp_load *l = calloc(1, sizeof *l);
    if (l == NULL) {
        return NULL;
    }
    pthread_mutex_init(&l->lock, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* fence_wait's timeouts */
    pthread_cond_init(&l->progress, &attr);
    pthread_condattr_destroy(&attr);
    pthread_cond_init(&l->reported, NULL);
    l->agreed_minor = minor;
    l->services = services;

    l->mechanism.struct_size = sizeof l->mechanism;
    l->mechanism.capabilities = capabilities_at(minor);
    l->mechanism.mechanism_id = FP_MECHANISM_ID;
    l->mechanism.name = FP_MECHANISM_NAME;
    l->mechanism.device.kind = FP_DEVICE_KIND;
    l->mechanism.device.ordinal = FP_DEVICE_ORDINAL;
    l->mechanism.ctx = l;
    l->mechanism.allocator = &g_allocator;
    l->mechanism.virtual_backing = &g_virtual_backing;
    l->mechanism.shared_mapping = &g_shared_mapping;
    l->mechanism.sync = &g_sync;
    l->mechanism.identity = &g_identity; /* 1.2; past a 1.0/1.1 host's prefix */
    l->mechanism.peer_access = NULL;     /* no MEMPLUG_CAP_PEER_ACCESS: a CPU has no peers */
    l->mechanisms[0] = &l->mechanism;

    l->plugin.struct_size = sizeof l->plugin;
    l->plugin.abi_major = FP_ABI_MAJOR;
    l->plugin.min_minor = FP_MIN_MINOR;
    l->plugin.max_minor = FP_MAX_MINOR;
    l->plugin.name = FP_PLUGIN_NAME;
    l->plugin.version = FP_PLUGIN_VERSION;
    l->plugin.ctx = l;
    l->plugin.mechanism_count = 1;
    l->plugin.mechanisms = l->mechanisms;
    l->plugin.live_objects = fp_live_objects;
    l->plugin.unload = fp_unload;
    return l;
}

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink)
{
    MemplugHostInfo h;
    MemplugNegotiation answer;
    MemplugHostServices services;
    const MemplugHostServices *kept = NULL;
    struct fp_load *l;
    uint32_t lo, hi;
    MemplugStatus st = read_prefix(&h, sizeof h, host, MEMPLUG_HOST_INFO_SIZE_1_0, "host info", sink);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_out(out, MEMPLUG_NEGOTIATION_SIZE_1_0, "out negotiation", sink);
    }
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (h.abi_major != FP_ABI_MAJOR) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH, "host speaks ABI major %u; this entry serves major %u",
                   (unsigned)h.abi_major, FP_ABI_MAJOR);
    }
    if (h.min_minor > h.max_minor) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "host minor range 1.%u..1.%u is empty",
                   (unsigned)h.min_minor, (unsigned)h.max_minor);
    }
    /* Agreed minor: the smaller maximum, provided it is at least the
     * larger minimum. */
    lo = h.min_minor > FP_MIN_MINOR ? h.min_minor : FP_MIN_MINOR;
    hi = h.max_minor < FP_MAX_MINOR ? h.max_minor : FP_MAX_MINOR;
    if (lo > hi) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH,
                   "no common minor: host speaks 1.%u..1.%u, plugin speaks 1.%u..1.%u", (unsigned)h.min_minor,
                   (unsigned)h.max_minor, FP_MIN_MINOR, FP_MAX_MINOR);
    }
    /* The services (1.2) are used only at an agreed 1.2 or newer, and only
     * with the slot they need (read_prefix left `services` NULL for a 1.0
     * or 1.1 host info). */
    if (hi >= 2 && h.services != NULL) {
        read_prefix(&services, sizeof services, h.services, MEMPLUG_HOST_SERVICES_SIZE_1_2, "host services",
                    NULL);
        if (services.report_device_lost != NULL) {
            kept = h.services;
        }
    }
    l = load_new(hi, kept);
    if (l == NULL) {
        return say(sink, MEMPLUG_STATUS_OUT_OF_MEMORY, "no memory for this load's state");
    }
    pthread_mutex_lock(&g_loads_lock);
    l->next = g_loads;
    g_loads = l;
    pthread_mutex_unlock(&g_loads_lock);

    memset(&answer, 0, sizeof answer);
    answer.agreed_minor = hi;
    answer.plugin = &l->plugin;
    write_prefix(out, &answer, sizeof answer);
    return MEMPLUG_STATUS_OK;
}

/* ======================================================================== */
/* 5. Device loss: the conformance kit's test trigger                       */
/* ======================================================================== */

/* A real plugin learns of a loss from its driver (a sticky error, a reset
 * event) and does what this does: latch every load's mechanism (each slot
 * then answers DEVICE_LOST, DEVICE_UNAVAILABLE below 1.2), and report it to
 * every host that agreed on 1.2 or newer through its own services, with
 * no lock of ours held. Work already accepted (host functions) still runs
 * exactly once. The conformance kit calls this symbol to provoke a loss; a
 * product build may leave it out with -DFP_NO_TEST_TRIGGER. */
#ifndef FP_NO_TEST_TRIGGER
MEMPLUG_EXPORT MemplugStatus memplug_test_trigger_device_lost(uint64_t mechanism_id);

MEMPLUG_EXPORT MemplugStatus memplug_test_trigger_device_lost(uint64_t mechanism_id)
{
    static const char reason[] = "the conformance kit's test trigger";
    struct fp_load *l, **reports;
    size_t n = 0, i;

    if (mechanism_id != FP_MECHANISM_ID) {
        return MEMPLUG_STATUS_WRONG_MECHANISM; /* nothing latched, nothing reported */
    }
    pthread_mutex_lock(&g_loads_lock);
    for (l = g_loads; l != NULL; l = l->next) {
        n++;
    }
    reports = calloc(n + 1u, sizeof *reports);
    n = 0;
    for (l = g_loads; l != NULL; l = l->next) {
        pthread_mutex_lock(&l->lock);
        l->lost = 1;
        pthread_mutex_unlock(&l->lock);
        if (reports != NULL && l->services != NULL) {
            l->reporting++; /* unload waits for it */
            reports[n++] = l;
        }
    }
    pthread_mutex_unlock(&g_loads_lock);

    for (i = 0; i < n; i++) {
        l = reports[i];
        l->services->report_device_lost(l->services->ctx, FP_MECHANISM_ID, reason, sizeof reason - 1u);
        pthread_mutex_lock(&g_loads_lock);
        if (--l->reporting == 0) {
            pthread_cond_broadcast(&l->reported);
        }
        pthread_mutex_unlock(&g_loads_lock);
    }
    free(reports);
    return MEMPLUG_STATUS_OK;
}
#endif
