/*
 * future_plugin.c: a plugin from the future, for the compatibility matrix
 * (abi-tests/tests/compat_matrix.rs).
 *
 * It speaks ABI 1.0..=1.4, where "1.4" is a minor no host here knows: every
 * struct it publishes is longer than any header describes (fields and slots
 * appended after the current layout, struct_size set to the longer size), its
 * mechanism sets capability bits no minor defines (in the views of 1.2 and
 * newer only: a plugin answers a 1.0 or 1.1 host, which knows every bit of
 * its minor, with that minor's descriptor; a host of 1.2 or newer ignores
 * bits it does not know), and it knows a longer
 * MemplugBlock than hosts do (so it must write host out-structs only up to
 * the host's struct_size). A correct host of 1.0, 1.1, 1.2 or 1.3 reads each
 * struct as the prefix it knows, ignores the unknown bits, never calls a
 * slot it does not know, and agrees on its own newest minor. It also does
 * what 1.2 asks of a plugin that loses its device, through a test trigger
 * the conformance kit knows ("device loss" below): reports through the
 * services of every 1.2 host, DEVICE_LOST from every slot at 1.2, and
 * DEVICE_UNAVAILABLE (never DEVICE_LOST) below 1.2.
 *
 * It also publishes what 1.2 lets a mechanism say about its memory and its
 * device (the memory descriptor in its properties, the device identity in
 * its mechanism: FUTURE_* values below, asserted by the matrix), in every
 * view: a host that agreed on 1.0 or 1.1 must be seen to read none of it
 * (the properties are written only as far as the host's struct_size
 * reaches, the identity pointer is past the mechanism's 1.1 prefix).
 *
 * The memory work is the C example plugin's (c-examples/plugin/
 * example_plugin.c, included below with its entry renamed and hidden): this
 * file only wraps the example's vtables in the longer structs, per agreed
 * minor. It is compiled against the current include/memplug.h.
 *
 * Variants (-D), each a way of breaking the 1.1 rules that a 1.1 host must
 * refuse at load with a message (tests in compat_matrix.rs):
 *   FUTURE_EXPORT_AT_1_0   claims MEMPLUG_CAP_SHARED_EXPORT even when the
 *                          agreed minor is 0 (and publishes a shared mapping
 *                          table with the export slots)
 *   FUTURE_SHORT_EXPORT    claims MEMPLUG_CAP_SHARED_EXPORT at 1.1 with a
 *                          shared mapping table of the 1.0 size
 *   FUTURE_EXPORT_ALONE    claims MEMPLUG_CAP_SHARED_EXPORT without
 *                          MEMPLUG_CAP_SHARED_MAPPING
 * and the same for 1.2's MEMPLUG_CAP_TYPED_EXPORT, which a 1.2 host must
 * refuse likewise:
 *   FUTURE_TYPED_AT_1_1    claims MEMPLUG_CAP_TYPED_EXPORT from 1.1 on (with
 *                          a full shared mapping table, export_fd/import_fd
 *                          and export_handle/import_handle included): within
 *                          the rules at 1.2, above the agreed minor at 1.1
 *   FUTURE_SHORT_TYPED     claims it at 1.2 with a shared mapping table of
 *                          the 1.1 size (no export_handle/import_handle)
 *   FUTURE_TYPED_ALONE     claims it at 1.2 without MEMPLUG_CAP_SHARED_MAPPING
 *   FUTURE_TYPED_SLOTS     publishes export_handle/import_handle in a 1.2
 *                          table at 1.2 without claiming the bit
 * In these the shared mapping table, when there is one, is published (flag
 * and pointer agree) but its slots refuse every call: no check reaches
 * them. And one variant that breaks the prefix rule itself, to show the C
 * hosts of the matrix catch it:
 *   FUTURE_PEEK_SERVICES   reads the host info's 1.2 `services` field
 *                          whatever the host's struct_size (a 1.0 or 1.1
 *                          host's info ends before it)
 */

/* The example, with its entry symbol renamed and not exported. */
#define MEMPLUG_EXPORT static
#define memplug_plugin_v1 future_inner_entry_v1
#include "../../c-examples/plugin/example_plugin.c"
#undef memplug_plugin_v1
#undef MEMPLUG_EXPORT
#define MEMPLUG_EXPORT __attribute__((visibility("default")))

#if MEMPLUG_ABI_MINOR < 2
#error "future_plugin.c is compiled against the current header (1.2 or newer)"
#endif

#define FUTURE_MIN_MINOR 0u
#define FUTURE_MAX_MINOR 4u
#if MEMPLUG_ABI_MINOR >= 4
#error "FUTURE_MAX_MINOR must stay above the newest minor the header describes: bump it"
#endif
/* Capability bits of "1.4" and of a vendor extension: no header defines
 * them. */
#define FUTURE_CAP_BITS ((uint32_t)1 << 9 | (uint32_t)1 << 20)

#if defined(FUTURE_EXPORT_AT_1_0) || defined(FUTURE_SHORT_EXPORT) || defined(FUTURE_TYPED_AT_1_1) ||             \
    defined(FUTURE_SHORT_TYPED) || defined(FUTURE_TYPED_SLOTS)
#define FUTURE_BROKEN_TABLE 1 /* publishes a shared mapping table */
#endif
#if defined(FUTURE_TYPED_AT_1_1) || defined(FUTURE_TYPED_SLOTS)
#define FUTURE_TYPED_TABLE 1 /* ... with export_handle and import_handle */
#endif

/* What the 1.2 (and newer) views say of the memory and the device. The
 * memory is the example's: host memory (malloc'd allocations, mmap'd
 * reservations), not bound to a NUMA node, read and written by the host
 * directly; nothing about it is pinned, zeroed or enforced, so nothing
 * more is claimed. The recommended granularity is a power-of-two multiple
 * of the granularity (the page size). */
#define FUTURE_ATTRIBUTES (MEMPLUG_ATTR_HOST_VISIBLE | MEMPLUG_ATTR_HOST_COHERENT)
#define FUTURE_RECOMMENDED_PAGES 16u
/* The 16 bytes of its UUID: "memplug-future!!" */
#define FUTURE_UUID {'m', 'e', 'm', 'p', 'l', 'u', 'g', '-', 'f', 'u', 't', 'u', 'r', 'e', '!', '!'}
/* An identity bit of "1.4": a 1.2 host drops it. */
#define FUTURE_IDENTITY_BIT_1_4 ((uint32_t)1 << 9)

/* ---- the longer structs of "1.4" ---- */

typedef MemplugStatus (*future_slot_fn)(void *ctx, uint64_t arg, const MemplugMessageSink *sink);

typedef struct {
    MemplugPlugin base;
    uint64_t plugin_flags_1_4;
    const void *extension_1_4;
} FuturePlugin;

typedef struct {
    MemplugMechanism base;
    const void *future_table_1_4; /* the sub-vtable of a capability 1.4 adds */
    uint64_t numa_node_1_4;
} FutureMechanism;

typedef struct {
    MemplugAllocator base;
    future_slot_fn allocate_hinted_1_4;
    future_slot_fn trim_1_4;
} FutureAllocator;

typedef struct {
    MemplugVirtualBacking base;
    future_slot_fn commit_huge_1_4;
} FutureVirtualBacking;

typedef struct {
    MemplugSharedMapping base; /* 1.1 layout, export/import included */
    future_slot_fn export_handle_1_4;
} FutureSharedMapping;

/* What this plugin thinks properties and an identity are. */
typedef struct {
    MemplugProperties base;
    uint64_t numa_mask_1_4;
} FutureProperties;

typedef struct {
    MemplugDeviceIdentity base;
    uint64_t pci_segment_1_4;
} FutureIdentity;

static const FutureIdentity g_future_identity = {
    .base =
        {
            .struct_size = sizeof(FutureIdentity),
            .valid = MEMPLUG_IDENTITY_UUID | MEMPLUG_IDENTITY_NUMA_NODE | FUTURE_IDENTITY_BIT_1_4,
            .uuid = FUTURE_UUID,
            .numa_node = 0,
        },
    .pci_segment_1_4 = 0x14,
};

/* What this plugin thinks a block is. */
typedef struct {
    MemplugBlock base;
    uint64_t numa_node_1_4;
} FutureBlock;

/* A slot no host knows: it must never be called. */
static MemplugStatus future_slot(void *ctx, uint64_t arg, const MemplugMessageSink *sink)
{
    (void)ctx;
    (void)arg;
    fprintf(stderr, "future_plugin: a host called a 1.4 slot it cannot know\n");
    abort();
    return say(sink, MEMPLUG_STATUS_INTERNAL, "unreachable");
}

/* ---- device loss (1.2), through the host's services ----
 *
 * A test trigger, exported under the name the conformance kit looks for
 * (memplug_conformance::LOSS_TRIGGERS):
 *
 *     MemplugStatus memplug_test_trigger_device_lost(uint64_t mechanism_id);
 *
 * reports the plugin's mechanism lost the way a device plugin reports a
 * dead device: from then on every slot of it fails, and every host that
 * agreed on 1.2 or newer and published a services table long enough for
 * report_device_lost is told, after the trigger took the lock off. What a
 * slot answers depends on the minor of the descriptor it was reached
 * through (each view's mechanism ctx carries it): MEMPLUG_STATUS_DEVICE_LOST
 * through a 1.2 (or newer) view, MEMPLUG_STATUS_DEVICE_UNAVAILABLE through a
 * 1.0 or 1.1 one (a plugin that agreed below 1.2 never returns DEVICE_LOST).
 * An id the plugin does not publish is WRONG_MECHANISM, and nothing
 * happens. When the last host holding the plugin calls `unload`, the loss
 * and the hosts are forgotten (the next load starts afresh, as a rebuilt
 * plugin would). Below 1.2, or with a host info too short to carry
 * `services`, the plugin never touches a services table. */
#define FUTURE_MAX_HOSTS 8u

static pthread_mutex_t g_future_loss_lock = PTHREAD_MUTEX_INITIALIZER;
static MemplugHostServices g_future_hosts[FUTURE_MAX_HOSTS];
static uint32_t g_future_host_count;
static uint32_t g_future_holds;
static int g_future_lost;

/* The minor of the view a slot was reached through (ctx = minor + 1). */
static uint32_t future_view_minor(void *ctx)
{
    return (uint32_t)((uintptr_t)ctx - 1u);
}

static MemplugStatus future_lost(void *ctx, const MemplugMessageSink *sink)
{
    int lost;

    pthread_mutex_lock(&g_future_loss_lock);
    lost = g_future_lost;
    pthread_mutex_unlock(&g_future_loss_lock);
    if (!lost) {
        return MEMPLUG_STATUS_OK;
    }
    if (future_view_minor(ctx) >= 2u) {
        return say(sink, MEMPLUG_STATUS_DEVICE_LOST, "future_plugin: the device is lost (test trigger)");
    }
    return say(sink, MEMPLUG_STATUS_DEVICE_UNAVAILABLE,
               "future_plugin: the device is gone (test trigger; DEVICE_LOST is not a 1.%u status)",
               (unsigned)future_view_minor(ctx));
}

#define FUTURE_UNLESS_LOST(ctx, sink)                                                                          \
    do {                                                                                                       \
        MemplugStatus lost_ = future_lost((ctx), (sink));                                                      \
        if (lost_ != MEMPLUG_STATUS_OK) {                                                                      \
            return lost_;                                                                                      \
        }                                                                                                      \
    } while (0)

/* A successful negotiation: one more hold, and the host's services kept
 * when they are 1.2's to use. */
static void future_hold(const MemplugHostInfo *h, uint32_t agreed)
{
    MemplugHostServices s;
    uint32_t declared = 0;

    memset(&s, 0, sizeof s);
    if (agreed >= 2u && h->struct_size >= MEMPLUG_HOST_INFO_SIZE_1_2 && h->services != NULL) {
        memcpy(&declared, h->services, sizeof declared);
        if (declared >= MEMPLUG_HOST_SERVICES_SIZE_1_2) {
            memcpy(&s, h->services, declared < sizeof s ? declared : sizeof s);
        }
    }
    pthread_mutex_lock(&g_future_loss_lock);
    g_future_holds++;
    if (s.report_device_lost != NULL && g_future_host_count < FUTURE_MAX_HOSTS) {
        g_future_hosts[g_future_host_count++] = s;
    }
    pthread_mutex_unlock(&g_future_loss_lock);
}

static void future_unload(void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&g_future_loss_lock);
    if (g_future_holds > 0) {
        g_future_holds--;
    }
    if (g_future_holds == 0) {
        g_future_lost = 0;
        g_future_host_count = 0;
    }
    pthread_mutex_unlock(&g_future_loss_lock);
}

MEMPLUG_EXPORT MemplugStatus memplug_test_trigger_device_lost(uint64_t mechanism_id);

MEMPLUG_EXPORT MemplugStatus memplug_test_trigger_device_lost(uint64_t mechanism_id)
{
    static const char reason[] = "future_plugin: test trigger";
    MemplugHostServices hosts[FUTURE_MAX_HOSTS];
    uint32_t n, i;

    if (mechanism_id != EX_MECHANISM_ID) {
        return MEMPLUG_STATUS_WRONG_MECHANISM;
    }
    pthread_mutex_lock(&g_future_loss_lock);
    g_future_lost = 1;
    n = g_future_host_count;
    memcpy(hosts, g_future_hosts, sizeof hosts);
    pthread_mutex_unlock(&g_future_loss_lock);
    /* No lock of ours is held while a host is called. */
    for (i = 0; i < n; i++) {
        hosts[i].report_device_lost(hosts[i].ctx, mechanism_id, reason, sizeof reason - 1);
    }
    return MEMPLUG_STATUS_OK;
}

/* Every slot of the mechanism fails once it is lost. The properties carry
 * the memory descriptor (and a "1.4" field after it), written only as far
 * as the host's struct reaches, whatever the view: a host that agreed
 * below 1.2 passes a struct too short for it, or does not read it. */
static MemplugStatus future_properties(void *ctx, MemplugProperties *out, const MemplugMessageSink *sink)
{
    FutureProperties p;
    MemplugStatus st;

    FUTURE_UNLESS_LOST(ctx, sink);
    st = check_out(out, MEMPLUG_PROPERTIES_SIZE_1_0, "out properties", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    memset(&p, 0, sizeof p);
    p.base.struct_size = sizeof(MemplugProperties);
    st = ex_properties(ctx, &p.base, sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    p.base.recommended_granularity = FUTURE_RECOMMENDED_PAGES * p.base.granularity;
    p.base.page_sizes = p.base.granularity; /* one page size: bit log2(page) */
    p.base.attributes = FUTURE_ATTRIBUTES;
    p.base.export_types = 0;
    p.base.location_kind = MEMPLUG_LOCATION_HOST;
    p.base.location_id = 0;
    p.base.flags = 0;
    p.numa_mask_1_4 = 1;
    write_prefix(out, &p, sizeof p);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus future_deallocate(void *ctx, const MemplugObjectRef *object, const MemplugMessageSink *sink)
{
    FUTURE_UNLESS_LOST(ctx, sink);
    return ex_deallocate(ctx, object, sink);
}

static MemplugStatus future_memory_info(void *ctx, MemplugMemoryInfo *out, const MemplugMessageSink *sink)
{
    FUTURE_UNLESS_LOST(ctx, sink);
    return ex_memory_info(ctx, out, sink);
}

static MemplugStatus future_commit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                                   const MemplugMessageSink *sink)
{
    FUTURE_UNLESS_LOST(ctx, sink);
    return ex_commit(ctx, reservation, offset, len, sink);
}

static MemplugStatus future_decommit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset,
                                     uint64_t len, const MemplugMessageSink *sink)
{
    FUTURE_UNLESS_LOST(ctx, sink);
    return ex_decommit(ctx, reservation, offset, len, sink);
}

static MemplugStatus future_committed_bytes(void *ctx, const MemplugObjectRef *reservation, uint64_t *out,
                                            const MemplugMessageSink *sink)
{
    FUTURE_UNLESS_LOST(ctx, sink);
    return ex_committed_bytes(ctx, reservation, out, sink);
}

static MemplugStatus future_release(void *ctx, const MemplugObjectRef *reservation, const MemplugMessageSink *sink)
{
    FUTURE_UNLESS_LOST(ctx, sink);
    return ex_release(ctx, reservation, sink);
}

/* ---- a 1.2 request's placement, checked as 1.2 asks ----
 *
 * Through a 1.2 (or newer) view, a request long enough to carry them has
 * its 1.2 fields honoured or refused: a page size other than the one this
 * mechanism publishes (the base page) is INVALID_ARGUMENT; export kinds
 * (it offers none) and a place other than host memory (a NUMA node, a
 * tier, a kind it does not know) are UNSUPPORTED. Hints are ignored. */
static MemplugStatus future_placement(void *ctx, const MemplugRequest *request, const MemplugMessageSink *sink)
{
    MemplugRequest r;
    uint32_t declared;

    if (future_view_minor(ctx) < 2u || request == NULL) {
        return MEMPLUG_STATUS_OK; /* the inner slot judges the rest */
    }
    memcpy(&declared, request, sizeof declared);
    if (declared < MEMPLUG_REQUEST_SIZE_1_2) {
        return MEMPLUG_STATUS_OK;
    }
    memcpy(&r, request, sizeof r);
    if (r.page_size != 0 && r.page_size != page_size()) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT,
                   "request.page_size %llu is not one this mechanism publishes (only %llu)",
                   (unsigned long long)r.page_size, (unsigned long long)page_size());
    }
    if (r.export_types != 0) {
        return say(sink, MEMPLUG_STATUS_UNSUPPORTED,
                   "request.export_types %#x: this mechanism exports no handle kind", (unsigned)r.export_types);
    }
    if (r.location_kind != MEMPLUG_LOCATION_ANY && r.location_kind != MEMPLUG_LOCATION_DEVICE &&
        r.location_kind != MEMPLUG_LOCATION_HOST) {
        return say(sink, MEMPLUG_STATUS_UNSUPPORTED,
                   "request.location %u:%u: this mechanism's memory is host memory on no particular node",
                   (unsigned)r.location_kind, (unsigned)r.location_id);
    }
    return MEMPLUG_STATUS_OK;
}

/* ---- allocate and reserve write a longer block, within the host's size ---- */

static MemplugStatus future_make(MemplugStatus (*inner)(void *, const MemplugRequest *, MemplugBlock *,
                                                        const MemplugMessageSink *),
                                 void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                 const MemplugMessageSink *sink)
{
    FutureBlock local;
    MemplugStatus st;

    /* The host's struct first: nothing is made that it cannot receive. */
    st = check_out(out, MEMPLUG_BLOCK_SIZE_1_0, "out block", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    memset(&local, 0, sizeof local);
    local.base.struct_size = sizeof local;
    st = inner(ctx, request, &local.base, sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    local.numa_node_1_4 = 0;
    write_prefix(out, &local, sizeof local);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus future_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                     const MemplugMessageSink *sink)
{
    MemplugStatus st;

    FUTURE_UNLESS_LOST(ctx, sink);
    st = future_placement(ctx, request, sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    return future_make(ex_allocate, ctx, request, out, sink);
}

static MemplugStatus future_reserve(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                    const MemplugMessageSink *sink)
{
    MemplugStatus st;

    FUTURE_UNLESS_LOST(ctx, sink);
    st = future_placement(ctx, request, sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    return future_make(ex_reserve, ctx, request, out, sink);
}

/* ---- the broken variants' shared mapping: published, never usable ---- */

#ifdef FUTURE_BROKEN_TABLE
static MemplugStatus nope_make(void *ctx, const MemplugRequest *r, MemplugBlock *o, const MemplugMessageSink *s)
{
    (void)ctx, (void)r, (void)o;
    return say(s, MEMPLUG_STATUS_UNSUPPORTED, "future_plugin: broken variant");
}
static MemplugStatus nope_map(void *ctx, const MemplugObjectRef *o, uint64_t oo, const MemplugObjectRef *r,
                              uint64_t off, uint64_t len, uint32_t acc, const MemplugMessageSink *s)
{
    (void)ctx, (void)o, (void)oo, (void)r, (void)off, (void)len, (void)acc;
    return say(s, MEMPLUG_STATUS_UNSUPPORTED, "future_plugin: broken variant");
}
static MemplugStatus nope_unmap(void *ctx, const MemplugObjectRef *r, uint64_t off, uint64_t len,
                                const MemplugMessageSink *s)
{
    (void)ctx, (void)r, (void)off, (void)len;
    return say(s, MEMPLUG_STATUS_UNSUPPORTED, "future_plugin: broken variant");
}
static MemplugStatus nope_ref(void *ctx, const MemplugObjectRef *o, const MemplugMessageSink *s)
{
    (void)ctx, (void)o;
    return say(s, MEMPLUG_STATUS_UNSUPPORTED, "future_plugin: broken variant");
}
static MemplugStatus nope_export(void *ctx, const MemplugObjectRef *o, int32_t *fd, const MemplugMessageSink *s)
{
    (void)ctx, (void)o, (void)fd;
    return say(s, MEMPLUG_STATUS_UNSUPPORTED, "future_plugin: broken variant");
}
static MemplugStatus nope_import(void *ctx, int32_t fd, const MemplugRequest *r, MemplugBlock *o,
                                 const MemplugMessageSink *s)
{
    (void)ctx, (void)fd, (void)r, (void)o;
    return say(s, MEMPLUG_STATUS_UNSUPPORTED, "future_plugin: broken variant");
}

#ifdef FUTURE_TYPED_TABLE
static MemplugStatus nope_export_handle(void *ctx, const MemplugObjectRef *o, uint32_t kind, MemplugHandle *out,
                                        const MemplugMessageSink *s)
{
    (void)ctx, (void)o, (void)kind, (void)out;
    return say(s, MEMPLUG_STATUS_UNSUPPORTED, "future_plugin: broken variant");
}
static MemplugStatus nope_import_handle(void *ctx, const MemplugHandle *h, const MemplugRequest *r,
                                        MemplugBlock *o, const MemplugMessageSink *s)
{
    (void)ctx, (void)h, (void)r, (void)o;
    return say(s, MEMPLUG_STATUS_UNSUPPORTED, "future_plugin: broken variant");
}
#endif

static const FutureSharedMapping g_future_shared = {
    .base =
        {
#if defined(FUTURE_SHORT_EXPORT)
            .struct_size = MEMPLUG_SHARED_MAPPING_SIZE_1_0,
#elif defined(FUTURE_SHORT_TYPED)
            .struct_size = MEMPLUG_SHARED_MAPPING_SIZE_1_1,
#else
            .struct_size = sizeof(FutureSharedMapping),
#endif
            .create = nope_make,
            .map = nope_map,
            .unmap = nope_unmap,
            .retain = nope_ref,
            .release = nope_ref,
            .export_fd = nope_export,
            .import_fd = nope_import,
#ifdef FUTURE_TYPED_TABLE
            .export_handle = nope_export_handle,
            .import_handle = nope_import_handle,
#endif
        },
    .export_handle_1_4 = future_slot,
};
#endif

/* ---- descriptors, one per agreed minor ---- */

static const FutureAllocator g_future_allocator = {
    .base =
        {
            .struct_size = sizeof(FutureAllocator),
            .properties = future_properties,
            .allocate = future_allocate,
            .deallocate = future_deallocate,
            .memory_info = future_memory_info,
        },
    .allocate_hinted_1_4 = future_slot,
    .trim_1_4 = future_slot,
};

static const FutureVirtualBacking g_future_virtual_backing = {
    .base =
        {
            .struct_size = sizeof(FutureVirtualBacking),
            .reserve = future_reserve,
            .commit = future_commit,
            .decommit = future_decommit,
            .committed_bytes = future_committed_bytes,
            .release = future_release,
        },
    .commit_huge_1_4 = future_slot,
};

static const uint64_t g_future_table[4] = {0x1202, 0, 0, 0};

static uint32_t capabilities_for(uint32_t minor)
{
    uint32_t caps = MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING;

    if (minor >= 2) {
        caps |= FUTURE_CAP_BITS;
    }
#ifdef FUTURE_BROKEN_TABLE
    caps |= MEMPLUG_CAP_SHARED_MAPPING;
#endif
#if defined(FUTURE_EXPORT_AT_1_0)
    caps |= MEMPLUG_CAP_SHARED_EXPORT;
#elif defined(FUTURE_SHORT_EXPORT)
    if (minor >= 1) {
        caps |= MEMPLUG_CAP_SHARED_EXPORT;
    }
#elif defined(FUTURE_EXPORT_ALONE)
    if (minor >= 1) {
        caps |= MEMPLUG_CAP_SHARED_EXPORT;
    }
#elif defined(FUTURE_TYPED_AT_1_1)
    if (minor >= 1) {
        caps |= MEMPLUG_CAP_SHARED_EXPORT | MEMPLUG_CAP_TYPED_EXPORT;
    }
#elif defined(FUTURE_SHORT_TYPED)
    if (minor >= 1) {
        caps |= MEMPLUG_CAP_SHARED_EXPORT;
    }
    if (minor >= 2) {
        caps |= MEMPLUG_CAP_TYPED_EXPORT;
    }
#elif defined(FUTURE_TYPED_ALONE)
    if (minor >= 2) {
        caps |= MEMPLUG_CAP_TYPED_EXPORT;
    }
#elif defined(FUTURE_TYPED_SLOTS)
    if (minor >= 1) {
        caps |= MEMPLUG_CAP_SHARED_EXPORT;
    }
#endif
    return caps;
}

#define FUTURE_VIEWS (FUTURE_MAX_MINOR + 1u)

static FutureMechanism g_future_mechanisms[FUTURE_VIEWS];
static const MemplugMechanism *g_future_mechanism_lists[FUTURE_VIEWS][1];
static FuturePlugin g_future_plugins[FUTURE_VIEWS];
static pthread_once_t g_future_once = PTHREAD_ONCE_INIT;

static void future_build(void)
{
    uint32_t minor;

    for (minor = 0; minor < FUTURE_VIEWS; minor++) {
        FutureMechanism *m = &g_future_mechanisms[minor];
        FuturePlugin *p = &g_future_plugins[minor];

        m->base.struct_size = sizeof *m;
        m->base.capabilities = capabilities_for(minor);
        m->base.mechanism_id = EX_MECHANISM_ID;
        m->base.name = "future";
        m->base.device.kind = EX_DEVICE_KIND;
        m->base.device.ordinal = EX_DEVICE_ORDINAL;
        m->base.ctx = (void *)(uintptr_t)(minor + 1u); /* the view's minor, for future_lost */
        m->base.allocator = &g_future_allocator.base;
        m->base.virtual_backing = &g_future_virtual_backing.base;
#ifdef FUTURE_BROKEN_TABLE
        m->base.shared_mapping = &g_future_shared.base;
#else
        m->base.shared_mapping = NULL;
#endif
        m->base.sync = NULL;
        /* In every view: a host that agreed below 1.2 must not read it. */
        m->base.identity = &g_future_identity.base;
        m->future_table_1_4 = g_future_table;
        m->numa_node_1_4 = 0;
        g_future_mechanism_lists[minor][0] = &m->base;

        p->base.struct_size = sizeof *p;
        p->base.abi_major = 1;
        p->base.min_minor = FUTURE_MIN_MINOR;
        p->base.max_minor = FUTURE_MAX_MINOR;
        p->base.name = "memplug-future";
        p->base.version = "1.4.0-simulated";
        p->base.ctx = NULL;
        p->base.mechanism_count = 1;
        p->base.mechanisms = g_future_mechanism_lists[minor];
        p->base.live_objects = ex_live_objects;
        p->base.unload = future_unload;
        p->plugin_flags_1_4 = 0x14;
        p->extension_1_4 = g_future_table;
    }
}

/* "1.4" hosts send a longer host info: read the prefix this plugin knows. */
typedef struct {
    MemplugHostInfo base;
    uint64_t host_flags_1_4;
} FutureHostInfo;

typedef struct {
    MemplugNegotiation base;
    uint64_t negotiation_flags_1_4;
} FutureNegotiation;

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink);

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink)
{
    FutureHostInfo h;
    FutureNegotiation answer;
    uint32_t lo, hi;
    MemplugStatus st;

    (void)future_inner_entry_v1; /* the example's own entry is not used */
#ifdef FUTURE_PEEK_SERVICES
    {
        /* Wrong on purpose: past a 24-byte host info. */
        const void *volatile peek = host->services;
        (void)peek;
    }
#endif
    st = read_prefix(&h, sizeof h, host, MEMPLUG_HOST_INFO_SIZE_1_0, "host info", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = check_out(out, MEMPLUG_NEGOTIATION_SIZE_1_0, "out negotiation", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (h.base.abi_major != 1u) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH, "host speaks ABI major %u; this entry serves major 1",
                   (unsigned)h.base.abi_major);
    }
    lo = max_u32(h.base.min_minor, FUTURE_MIN_MINOR);
    hi = min_u32(h.base.max_minor, FUTURE_MAX_MINOR);
    if (h.base.min_minor > h.base.max_minor || lo > hi) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH,
                   "no common minor: host speaks 1.%u..1.%u, plugin speaks 1.%u..1.%u",
                   (unsigned)h.base.min_minor, (unsigned)h.base.max_minor, FUTURE_MIN_MINOR, FUTURE_MAX_MINOR);
    }
    pthread_once(&g_future_once, future_build);
    future_hold(&h.base, hi);
    memset(&answer, 0, sizeof answer);
    answer.base.agreed_minor = hi;
    answer.base.plugin = &g_future_plugins[hi].base;
    answer.negotiation_flags_1_4 = 0x14;
    write_prefix(out, &answer, sizeof answer);
    return MEMPLUG_STATUS_OK;
}
