/*
 * bad_plugin.c: one C source for deliberately misbehaving plugins, for the
 * host's loader tests. Build one variant at a time:
 *
 *   cc -std=c99 -shared -fPIC -fvisibility=hidden -I include -DBAD_WRONG_MAJOR \
 *      abi-tests/c/bad_plugin.c -o libbad.so
 *
 * From Rust: memplug_abi_tests::bad_plugin(Some("BAD_WRONG_MAJOR")), or
 * bad_plugin(None) for the default. At most one BAD_* macro may be defined.
 *
 * With no BAD_* macro this is a correct minimal plugin: one mechanism
 * "bad-plugin" (id 7) on CPU 0 with an allocator (malloc-backed, identity
 * checked, exact live_objects), and nothing else. A correct host loads it.
 *
 * Variant                   What the plugin does            What a correct host does
 * ------------------------- ------------------------------- ------------------------------------
 * BAD_NO_ENTRY              exports `memplug_plugin` instead refuses: no `memplug_plugin_v1`
 *                           of `memplug_plugin_v1`          symbol (message names the symbol)
 * BAD_WRONG_MAJOR           plugin descriptor abi_major = 2 refuses: wrong major in descriptor
 * BAD_VERSION_REFUSE        entry returns VERSION_MISMATCH  refuses, passing on the plugin's
 *                           with a message                  message ("bad_plugin refuses ...")
 * BAD_AGREED_MINOR          answers agreed_minor 7, above   refuses: the answer contradicts both
 *                           both sides' maxima              ranges
 * BAD_SHORT_PLUGIN          plugin struct_size 16           refuses: shorter than ABI 1.0 (72)
 * BAD_SHORT_MECHANISM       mechanism struct_size 8         refuses: shorter than ABI 1.0 (72)
 * BAD_SHORT_ALLOCATOR       allocator struct_size 12        refuses: shorter than ABI 1.0 (40)
 * BAD_NULL_ALLOCATE         allocator.allocate NULL         refuses: required slot missing
 * BAD_NULL_ALLOCATOR        mechanism.allocator NULL        refuses: allocator is required
 * BAD_FLAG_WITHOUT_POINTER  MEMPLUG_CAP_VIRTUAL_BACKING     refuses: flag without pointer,
 *                           set, virtual_backing NULL       message says which
 * BAD_POINTER_WITHOUT_FLAG  sync pointer set,               refuses: pointer without flag,
 *                           MEMPLUG_CAP_SYNC clear          message says which
 * BAD_UNKNOWN_STATUS        allocate returns 777 with a     loads; that allocate fails as
 *                           message                         INTERNAL (unknown code mapped, the
 *                                                           raw 777 and the message kept)
 * BAD_ZERO_MECHANISMS       mechanism_count 0               refuses: no mechanism
 * BAD_NULL_NAME             mechanism name NULL             refuses: name required
 * BAD_DUPLICATE_ID          two mechanisms, same id 7       refuses: ids must be unique
 * BAD_ENTRY_FAILS           entry returns INTERNAL, message refuses, passing on
 *                           "init failed: no device"        "init failed: no device"
 * BAD_NO_LIVE_OBJECTS       live_objects NULL               refuses: live_objects required
 * BAD_LIVE_FOREVER          live_objects always returns 3   loads; unload is refused while the
 *                                                           plugin reports 3 live objects
 * BAD_NULL_PLUGIN           entry returns OK, plugin NULL   refuses: OK without a descriptor
 * BAD_UNKNOWN_CAPS          capabilities also has bit 31    loads: unknown bits belong to a
 *                           (a future capability)           newer minor and are ignored
 * BAD_UNKNOWN_DEVICE_KIND   device kind 99                  loads: the device is shown as
 *                                                           unknown, never guessed at
 *
 * None of the variants crashes the host when called the way the ABI says;
 * a host that crashes on one of them has a bug.
 */

#define _POSIX_C_SOURCE 200809L

#include "memplug.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if (defined(BAD_NO_ENTRY) + defined(BAD_WRONG_MAJOR) + defined(BAD_VERSION_REFUSE) +          \
     defined(BAD_AGREED_MINOR) + defined(BAD_SHORT_PLUGIN) + defined(BAD_SHORT_MECHANISM) +    \
     defined(BAD_SHORT_ALLOCATOR) + defined(BAD_NULL_ALLOCATE) + defined(BAD_NULL_ALLOCATOR) + \
     defined(BAD_FLAG_WITHOUT_POINTER) + defined(BAD_POINTER_WITHOUT_FLAG) +                   \
     defined(BAD_UNKNOWN_STATUS) + defined(BAD_ZERO_MECHANISMS) + defined(BAD_NULL_NAME) +     \
     defined(BAD_DUPLICATE_ID) + defined(BAD_ENTRY_FAILS) + defined(BAD_NO_LIVE_OBJECTS) +     \
     defined(BAD_LIVE_FOREVER) + defined(BAD_NULL_PLUGIN) + defined(BAD_UNKNOWN_CAPS) +        \
     defined(BAD_UNKNOWN_DEVICE_KIND)) > 1
#error "define at most one BAD_* variant"
#endif

#define BAD_MECHANISM_ID 7u
#define BAD_MAX_LIVE 256u

#ifdef BAD_UNKNOWN_DEVICE_KIND
#define BAD_DEVICE_KIND 99u
#else
#define BAD_DEVICE_KIND MEMPLUG_DEVICE_CPU
#endif

static void say(const MemplugMessageSink *sink, const char *msg)
{
    if (sink != NULL && sink->write != NULL) {
        sink->write(sink->ctx, msg, strlen(msg));
    }
}

static uint32_t struct_size_of(const void *p)
{
    uint32_t n;
    memcpy(&n, p, sizeof n);
    return n;
}

/* ---- a correct minimal allocator --------------------------------------- */

struct bad_slot {
    void *ptr; /* NULL when free */
    uint64_t object_id;
    uint64_t size;
    uint32_t generation;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct bad_slot g_slots[BAD_MAX_LIVE];
static uint64_t g_live;

static MemplugStatus bad_properties(void *ctx, MemplugProperties *out, const MemplugMessageSink *sink)
{
    MemplugProperties p;
    (void)ctx;
    if (out == NULL || struct_size_of(out) < MEMPLUG_PROPERTIES_SIZE_1_0) {
        say(sink, "bad_plugin: properties: out is NULL or short");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memset(&p, 0, sizeof p);
    p.min_alignment = 16;
    p.max_alignment = 4096;
    p.granularity = 0; /* no virtual backing, no shared mapping */
    memcpy((unsigned char *)out + 4, (unsigned char *)&p + 4, MEMPLUG_PROPERTIES_SIZE_1_0 - 4);
    return MEMPLUG_STATUS_OK;
}

#if defined(BAD_UNKNOWN_STATUS)
/* Fails with a code no version of the ABI defines. */
static MemplugStatus bad_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                  const MemplugMessageSink *sink)
{
    (void)ctx;
    (void)request;
    (void)out;
    say(sink, "bad_plugin: status 777 is not a memplug status");
    return 777;
}
#elif !defined(BAD_NULL_ALLOCATE)
static MemplugStatus bad_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                  const MemplugMessageSink *sink)
{
    MemplugRequest r;
    MemplugBlock b;
    void *p = NULL;
    uint32_t i;
    uint64_t align;

    (void)ctx;
    if (request == NULL || out == NULL || struct_size_of(request) < MEMPLUG_REQUEST_SIZE_1_0 ||
        struct_size_of(out) < MEMPLUG_BLOCK_SIZE_1_0) {
        say(sink, "bad_plugin: allocate: request or out is NULL or short");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memcpy(&r, request, sizeof r);
    if (r.device.kind != BAD_DEVICE_KIND || r.device.ordinal != 0) {
        say(sink, "bad_plugin: allocate: wrong device");
        return MEMPLUG_STATUS_WRONG_DEVICE;
    }
    if (r.flags != 0 || r.size == 0 || r.alignment == 0 || (r.alignment & (r.alignment - 1)) != 0 ||
        r.alignment > 4096) {
        say(sink, "bad_plugin: allocate: bad flags, size or alignment");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    align = r.alignment < 16 ? 16 : r.alignment;
    if ((uint64_t)(size_t)r.size != r.size || posix_memalign(&p, (size_t)align, (size_t)r.size) != 0) {
        say(sink, "bad_plugin: allocate: out of memory");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&g_lock);
    for (i = 0; i < BAD_MAX_LIVE && g_slots[i].ptr != NULL; i++) {
        /* find a free slot */
    }
    if (i == BAD_MAX_LIVE) {
        pthread_mutex_unlock(&g_lock);
        free(p);
        say(sink, "bad_plugin: allocate: too many live allocations");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    g_slots[i].ptr = p;
    g_slots[i].object_id = r.object_id;
    g_slots[i].size = r.size;
    g_live++;
    memset(&b, 0, sizeof b);
    b.addr = (uint64_t)(uintptr_t)p;
    b.size = r.size;
    b.handle = ((uint64_t)g_slots[i].generation << 32) | (i + 1u);
    pthread_mutex_unlock(&g_lock);
    memcpy((unsigned char *)out + 4, (unsigned char *)&b + 4, MEMPLUG_BLOCK_SIZE_1_0 - 4);
    return MEMPLUG_STATUS_OK;
}
#endif

static MemplugStatus bad_deallocate(void *ctx, const MemplugObjectRef *object,
                                    const MemplugMessageSink *sink)
{
    MemplugObjectRef o;
    uint64_t index;
    struct bad_slot *s;
    void *p;

    (void)ctx;
    if (object == NULL || struct_size_of(object) < MEMPLUG_OBJECT_REF_SIZE_1_0) {
        say(sink, "bad_plugin: deallocate: object is NULL or short");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memcpy(&o, object, sizeof o);
    if (o.mechanism_id != BAD_MECHANISM_ID) {
        say(sink, "bad_plugin: deallocate: made by another mechanism");
        return MEMPLUG_STATUS_WRONG_MECHANISM;
    }
    if (o.device.kind != BAD_DEVICE_KIND || o.device.ordinal != 0) {
        say(sink, "bad_plugin: deallocate: wrong device");
        return MEMPLUG_STATUS_WRONG_DEVICE;
    }
    index = (o.handle & 0xffffffffu);
    pthread_mutex_lock(&g_lock);
    s = (index >= 1 && index <= BAD_MAX_LIVE) ? &g_slots[index - 1] : NULL;
    if (s == NULL || s->ptr == NULL || s->generation != (uint32_t)(o.handle >> 32) ||
        s->object_id != o.object_id || (uint64_t)(uintptr_t)s->ptr != o.addr || s->size != o.size) {
        pthread_mutex_unlock(&g_lock);
        say(sink, "bad_plugin: deallocate: unknown or already freed allocation");
        return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
    }
    p = s->ptr;
    s->ptr = NULL;
    s->generation++;
    g_live--;
    pthread_mutex_unlock(&g_lock);
    free(p);
    return MEMPLUG_STATUS_OK;
}

static uint64_t bad_live_objects(void *ctx)
{
    uint64_t n;
    (void)ctx;
#ifdef BAD_LIVE_FOREVER
    n = 3;
#else
    pthread_mutex_lock(&g_lock);
    n = g_live;
    pthread_mutex_unlock(&g_lock);
#endif
    return n;
}

/* ---- descriptors -------------------------------------------------------- */

static const MemplugAllocator g_allocator = {
#ifdef BAD_SHORT_ALLOCATOR
    .struct_size = 12,
#else
    .struct_size = sizeof(MemplugAllocator),
#endif
    .properties = bad_properties,
#ifdef BAD_NULL_ALLOCATE
    .allocate = NULL,
#else
    .allocate = bad_allocate,
#endif
    .deallocate = bad_deallocate,
    .memory_info = NULL,
};

#ifdef BAD_POINTER_WITHOUT_FLAG
/* A sync vtable published without MEMPLUG_CAP_SYNC. Its slots are never
 * called by a correct host, which refuses the plugin first. */
static const MemplugSync g_sync = {.struct_size = sizeof(MemplugSync)};
#define BAD_SYNC (&g_sync)
#else
#define BAD_SYNC NULL
#endif

#if defined(BAD_FLAG_WITHOUT_POINTER)
#define BAD_CAPS (MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING)
#elif defined(BAD_UNKNOWN_CAPS)
#define BAD_CAPS (MEMPLUG_CAP_ALLOCATOR | 0x80000000u)
#else
#define BAD_CAPS MEMPLUG_CAP_ALLOCATOR
#endif

static const MemplugMechanism g_mechanism = {
#ifdef BAD_SHORT_MECHANISM
    .struct_size = 8,
#else
    .struct_size = sizeof(MemplugMechanism),
#endif
    .capabilities = BAD_CAPS,
    .mechanism_id = BAD_MECHANISM_ID,
#ifdef BAD_NULL_NAME
    .name = NULL,
#else
    .name = "bad-plugin",
#endif
    .device = {.kind = BAD_DEVICE_KIND, .ordinal = 0},
    .ctx = NULL,
#ifdef BAD_NULL_ALLOCATOR
    .allocator = NULL,
#else
    .allocator = &g_allocator,
#endif
    .virtual_backing = NULL,
    .shared_mapping = NULL,
    .sync = BAD_SYNC,
};

#ifdef BAD_DUPLICATE_ID
/* Same id as g_mechanism, another name. */
static const MemplugMechanism g_twin = {
    .struct_size = sizeof(MemplugMechanism),
    .capabilities = MEMPLUG_CAP_ALLOCATOR,
    .mechanism_id = BAD_MECHANISM_ID,
    .name = "bad-plugin-twin",
    .device = {.kind = BAD_DEVICE_KIND, .ordinal = 0},
    .allocator = &g_allocator,
};
static const MemplugMechanism *const g_mechanisms[] = {&g_mechanism, &g_twin};
#else
static const MemplugMechanism *const g_mechanisms[] = {&g_mechanism};
#endif

static const MemplugPlugin g_plugin = {
#ifdef BAD_SHORT_PLUGIN
    .struct_size = 16,
#else
    .struct_size = sizeof(MemplugPlugin),
#endif
#ifdef BAD_WRONG_MAJOR
    .abi_major = 2,
#else
    .abi_major = 1,
#endif
    .min_minor = 0,
    .max_minor = 0,
    .name = "memplug-bad-plugin",
    .version = "0.0.0",
    .ctx = NULL,
#ifdef BAD_ZERO_MECHANISMS
    .mechanism_count = 0,
#else
    .mechanism_count = (uint32_t)(sizeof g_mechanisms / sizeof g_mechanisms[0]),
#endif
    .mechanisms = g_mechanisms,
#ifdef BAD_NO_LIVE_OBJECTS
    .live_objects = NULL,
#else
    .live_objects = bad_live_objects,
#endif
    .unload = NULL,
};

/* ---- entry --------------------------------------------------------------- */

#ifdef BAD_NO_ENTRY
#define BAD_ENTRY memplug_plugin
#else
#define BAD_ENTRY memplug_plugin_v1
#endif

MEMPLUG_EXPORT MemplugStatus BAD_ENTRY(const MemplugHostInfo *host, MemplugNegotiation *out,
                                       const MemplugMessageSink *sink);

MEMPLUG_EXPORT MemplugStatus BAD_ENTRY(const MemplugHostInfo *host, MemplugNegotiation *out,
                                       const MemplugMessageSink *sink)
{
    MemplugHostInfo h;
    MemplugNegotiation answer;
    uint32_t declared;

    /* Some variants leave one of these unpublished; they stay "used". */
    (void)&g_allocator;
    (void)&g_plugin;
    (void)&bad_live_objects;

    if (host == NULL || out == NULL || struct_size_of(host) < MEMPLUG_HOST_INFO_SIZE_1_0 ||
        struct_size_of(out) < MEMPLUG_NEGOTIATION_SIZE_1_0) {
        say(sink, "bad_plugin: host info or out negotiation is NULL or short");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memset(&h, 0, sizeof h);
    declared = struct_size_of(host);
    memcpy(&h, host, declared < sizeof h ? declared : sizeof h);
    memset(&answer, 0, sizeof answer);

#if defined(BAD_VERSION_REFUSE)
    say(sink, "bad_plugin refuses every host version");
    return MEMPLUG_STATUS_VERSION_MISMATCH;
#elif defined(BAD_ENTRY_FAILS)
    say(sink, "init failed: no device");
    return MEMPLUG_STATUS_INTERNAL;
#else
    /* This file implements ABI 1.0 exactly. */
    if (h.abi_major != 1 || h.min_minor > h.max_minor || h.min_minor > 0) {
        say(sink, "bad_plugin: no common ABI version with the host");
        return MEMPLUG_STATUS_VERSION_MISMATCH;
    }
#ifdef BAD_AGREED_MINOR
    answer.agreed_minor = 7;
#else
    answer.agreed_minor = 0; /* min(host max, plugin max 0) */
#endif
#ifdef BAD_NULL_PLUGIN
    answer.plugin = NULL;
#else
    answer.plugin = &g_plugin;
#endif
    memcpy((unsigned char *)out + 4, (unsigned char *)&answer + 4, MEMPLUG_NEGOTIATION_SIZE_1_0 - 4);
    return MEMPLUG_STATUS_OK;
#endif
}
