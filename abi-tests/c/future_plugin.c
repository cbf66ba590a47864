/*
 * future_plugin.c: a plugin from the future, for the compatibility matrix
 * (abi-tests/tests/compat_matrix.rs).
 *
 * It speaks ABI 1.0..=1.2, where "1.2" is a minor no host here knows: every
 * struct it publishes is longer than any header describes (fields and slots
 * appended after the 1.1 layout, struct_size set to the longer size), its
 * mechanism sets capability bits no minor defines, and it knows a longer
 * MemplugBlock than hosts do (so it must write host out-structs only up to
 * the host's struct_size). A correct host of 1.0 or 1.1 reads each struct as
 * the prefix it knows, ignores the unknown bits, never calls a slot it does
 * not know, and agrees on its own newest minor.
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
 * In the first two the shared mapping table is published (flag and pointer
 * agree) but its slots refuse every call: no check reaches them.
 */

/* The example, with its entry symbol renamed and not exported. */
#define MEMPLUG_EXPORT static
#define memplug_plugin_v1 future_inner_entry_v1
#include "../../c-examples/plugin/example_plugin.c"
#undef memplug_plugin_v1
#undef MEMPLUG_EXPORT
#define MEMPLUG_EXPORT __attribute__((visibility("default")))

#if MEMPLUG_ABI_MINOR < 1
#error "future_plugin.c is compiled against the current header (1.1 or newer)"
#endif

#define FUTURE_MIN_MINOR 0u
#define FUTURE_MAX_MINOR 2u
/* Capability bits of "1.2" and of a vendor extension: no header defines
 * them. */
#define FUTURE_CAP_BITS ((uint32_t)1 << 9 | (uint32_t)1 << 20)

#if defined(FUTURE_EXPORT_AT_1_0) || defined(FUTURE_SHORT_EXPORT)
#define FUTURE_BROKEN_TABLE 1 /* publishes a shared mapping table */
#endif

/* ---- the longer structs of "1.2" ---- */

typedef MemplugStatus (*future_slot_fn)(void *ctx, uint64_t arg, const MemplugMessageSink *sink);

typedef struct {
    MemplugPlugin base;
    uint64_t plugin_flags_1_2;
    const void *extension_1_2;
} FuturePlugin;

typedef struct {
    MemplugMechanism base;
    const void *future_table_1_2; /* the sub-vtable of a capability 1.2 adds */
    uint64_t numa_node_1_2;
} FutureMechanism;

typedef struct {
    MemplugAllocator base;
    future_slot_fn allocate_hinted_1_2;
    future_slot_fn trim_1_2;
} FutureAllocator;

typedef struct {
    MemplugVirtualBacking base;
    future_slot_fn commit_huge_1_2;
} FutureVirtualBacking;

typedef struct {
    MemplugSharedMapping base; /* 1.1 layout, export/import included */
    future_slot_fn export_handle_1_2;
} FutureSharedMapping;

/* What this plugin thinks a block is. */
typedef struct {
    MemplugBlock base;
    uint64_t numa_node_1_2;
} FutureBlock;

/* A slot no host knows: it must never be called. */
static MemplugStatus future_slot(void *ctx, uint64_t arg, const MemplugMessageSink *sink)
{
    (void)ctx;
    (void)arg;
    fprintf(stderr, "future_plugin: a host called a 1.2 slot it cannot know\n");
    abort();
    return say(sink, MEMPLUG_STATUS_INTERNAL, "unreachable");
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
    local.numa_node_1_2 = 0;
    write_prefix(out, &local, sizeof local);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus future_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                     const MemplugMessageSink *sink)
{
    return future_make(ex_allocate, ctx, request, out, sink);
}

static MemplugStatus future_reserve(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                    const MemplugMessageSink *sink)
{
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

static const FutureSharedMapping g_future_shared = {
    .base =
        {
#ifdef FUTURE_SHORT_EXPORT
            .struct_size = MEMPLUG_SHARED_MAPPING_SIZE_1_0,
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
        },
    .export_handle_1_2 = future_slot,
};
#endif

/* ---- descriptors, one per agreed minor ---- */

static const FutureAllocator g_future_allocator = {
    .base =
        {
            .struct_size = sizeof(FutureAllocator),
            .properties = ex_properties,
            .allocate = future_allocate,
            .deallocate = ex_deallocate,
            .memory_info = ex_memory_info,
        },
    .allocate_hinted_1_2 = future_slot,
    .trim_1_2 = future_slot,
};

static const FutureVirtualBacking g_future_virtual_backing = {
    .base =
        {
            .struct_size = sizeof(FutureVirtualBacking),
            .reserve = future_reserve,
            .commit = ex_commit,
            .decommit = ex_decommit,
            .committed_bytes = ex_committed_bytes,
            .release = ex_release,
        },
    .commit_huge_1_2 = future_slot,
};

static const uint64_t g_future_table[4] = {0x1202, 0, 0, 0};

static uint32_t capabilities_for(uint32_t minor)
{
    uint32_t caps = MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING | FUTURE_CAP_BITS;

    (void)minor;
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
        m->base.ctx = NULL;
        m->base.allocator = &g_future_allocator.base;
        m->base.virtual_backing = &g_future_virtual_backing.base;
#ifdef FUTURE_BROKEN_TABLE
        m->base.shared_mapping = &g_future_shared.base;
#else
        m->base.shared_mapping = NULL;
#endif
        m->base.sync = NULL;
        m->future_table_1_2 = g_future_table;
        m->numa_node_1_2 = 0;
        g_future_mechanism_lists[minor][0] = &m->base;

        p->base.struct_size = sizeof *p;
        p->base.abi_major = 1;
        p->base.min_minor = FUTURE_MIN_MINOR;
        p->base.max_minor = FUTURE_MAX_MINOR;
        p->base.name = "memplug-future";
        p->base.version = "1.2.0-simulated";
        p->base.ctx = NULL;
        p->base.mechanism_count = 1;
        p->base.mechanisms = g_future_mechanism_lists[minor];
        p->base.live_objects = ex_live_objects;
        p->base.unload = NULL;
        p->plugin_flags_1_2 = 0x12;
        p->extension_1_2 = g_future_table;
    }
}

/* "1.2" hosts send a longer host info: read the prefix this plugin knows. */
typedef struct {
    MemplugHostInfo base;
    uint64_t host_flags_1_2;
} FutureHostInfo;

typedef struct {
    MemplugNegotiation base;
    uint64_t negotiation_flags_1_2;
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
    memset(&answer, 0, sizeof answer);
    answer.base.agreed_minor = hi;
    answer.base.plugin = &g_future_plugins[hi].base;
    answer.negotiation_flags_1_2 = 0x12;
    write_prefix(out, &answer, sizeof answer);
    return MEMPLUG_STATUS_OK;
}
