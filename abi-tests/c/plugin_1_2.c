/*
 * plugin_1_2.c: a plugin released when 1.2 was the newest minor, for the
 * compatibility matrix (abi-tests/tests/compat_matrix.rs).
 *
 * Compiled against the frozen 1.2 header (abi-tests/frozen/1.2/memplug.h),
 * never against the current one: it is what a vendor shipped with 1.2 and
 * never rebuilt. Its MemplugProperties is 72 bytes (no copy_kinds) and its
 * mechanism 88; it speaks 1.0..=1.2 and answers with the newest common
 * minor, so a 1.3 host agrees on 1.2 and must ask for 72-byte properties
 * (this plugin writes no byte past the host's struct_size, and nothing
 * past 72 whatever it is) and answer the copy itself with UNSUPPORTED.
 *
 * The memory work is the C example plugin's (c-examples/plugin/
 * example_plugin.c, included below with its entry renamed and hidden): an
 * allocator and a virtual backing. Its 1.2 memory descriptor says nothing
 * (the example leaves the fields past the 1.0 prefix zero), and it has no
 * identity.
 */

/* The example, with its entry symbol renamed and not exported. */
#define MEMPLUG_EXPORT static
#define memplug_plugin_v1 plugin_1_2_inner_entry_v1
#include "../../c-examples/plugin/example_plugin.c"
#undef memplug_plugin_v1
#undef MEMPLUG_EXPORT
#define MEMPLUG_EXPORT __attribute__((visibility("default")))

#if MEMPLUG_ABI_MINOR != 2
#error "plugin_1_2.c is compiled against the frozen 1.2 header (abi-tests/frozen/1.2)"
#endif

#define P12_MIN_MINOR 0u
#define P12_MAX_MINOR 2u

/* A 1.2 request's placement, refused as 1.2 asks of a mechanism that
 * lists no page size, exports nothing and says nothing of where its memory
 * is: any page size is INVALID_ARGUMENT, export kinds and a NUMA node or
 * tier are UNSUPPORTED; hints are ignored. Only a request long enough to
 * carry them (a host sends one only at an agreed 1.2) has these fields. */
static MemplugStatus p12_placement(const MemplugRequest *request, const MemplugMessageSink *sink)
{
    MemplugRequest r;
    uint32_t declared;

    if (request == NULL) {
        return MEMPLUG_STATUS_OK; /* the example's slot refuses it */
    }
    memcpy(&declared, request, sizeof declared);
    if (declared < MEMPLUG_REQUEST_SIZE_1_2) {
        return MEMPLUG_STATUS_OK;
    }
    memcpy(&r, request, sizeof r);
    if (r.page_size != 0) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "request.page_size %llu: this mechanism lists none",
                   (unsigned long long)r.page_size);
    }
    if (r.export_types != 0) {
        return say(sink, MEMPLUG_STATUS_UNSUPPORTED, "request.export_types %#x: it exports nothing",
                   (unsigned)r.export_types);
    }
    if (r.location_kind != MEMPLUG_LOCATION_ANY && r.location_kind != MEMPLUG_LOCATION_DEVICE &&
        r.location_kind != MEMPLUG_LOCATION_HOST) {
        return say(sink, MEMPLUG_STATUS_UNSUPPORTED, "request.location %u:%u: it places memory nowhere in particular",
                   (unsigned)r.location_kind, (unsigned)r.location_id);
    }
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus p12_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                  const MemplugMessageSink *sink)
{
    MemplugStatus st = p12_placement(request, sink);
    return st != MEMPLUG_STATUS_OK ? st : ex_allocate(ctx, request, out, sink);
}

static MemplugStatus p12_reserve(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                 const MemplugMessageSink *sink)
{
    MemplugStatus st = p12_placement(request, sink);
    return st != MEMPLUG_STATUS_OK ? st : ex_reserve(ctx, request, out, sink);
}

static const MemplugAllocator g_p12_allocator = {
    .struct_size = sizeof(MemplugAllocator),
    .properties = ex_properties,
    .allocate = p12_allocate,
    .deallocate = ex_deallocate,
    .memory_info = ex_memory_info,
};

static const MemplugVirtualBacking g_p12_virtual_backing = {
    .struct_size = MEMPLUG_VIRTUAL_BACKING_SIZE_1_0, /* no queued binding */
    .reserve = p12_reserve,
    .commit = ex_commit,
    .decommit = ex_decommit,
    .committed_bytes = ex_committed_bytes,
    .release = ex_release,
};

/* It claims no capability of 1.1 or 1.2: one descriptor serves every minor
 * it speaks (the 88-byte mechanism is read as a prefix below 1.2, and its
 * NULL identity and peer access are 1.2's "none"). */
static const MemplugMechanism g_p12_mechanism = {
    .struct_size = sizeof(MemplugMechanism),
    .capabilities = MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING,
    .mechanism_id = EX_MECHANISM_ID,
    .name = "c-1.2",
    .device = {.kind = EX_DEVICE_KIND, .ordinal = EX_DEVICE_ORDINAL},
    .ctx = NULL,
    .allocator = &g_p12_allocator,
    .virtual_backing = &g_p12_virtual_backing,
    .shared_mapping = NULL,
    .sync = NULL,
    .identity = NULL,
    .peer_access = NULL,
};

static const MemplugMechanism *const g_p12_mechanisms[] = {&g_p12_mechanism};

static const MemplugPlugin g_p12_plugin = {
    .struct_size = sizeof(MemplugPlugin),
    .abi_major = 1,
    .min_minor = P12_MIN_MINOR,
    .max_minor = P12_MAX_MINOR,
    .name = "memplug-c-1.2",
    .version = "1.2.0",
    .ctx = NULL,
    .mechanism_count = 1,
    .mechanisms = g_p12_mechanisms,
    .live_objects = ex_live_objects,
    .unload = NULL,
};

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink);

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink)
{
    MemplugHostInfo h; /* 32 bytes: everything 1.2 knows of a host */
    MemplugNegotiation answer;
    uint32_t lo, hi;
    MemplugStatus st;

    (void)plugin_1_2_inner_entry_v1; /* the example's own entry is not used */
    (void)g_plugin;
    (void)g_allocator;
    (void)g_virtual_backing;
    st = read_prefix(&h, sizeof h, host, MEMPLUG_HOST_INFO_SIZE_1_0, "host info", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = check_out(out, MEMPLUG_NEGOTIATION_SIZE_1_0, "out negotiation", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (h.abi_major != 1u) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH, "host speaks ABI major %u; this entry serves major 1",
                   (unsigned)h.abi_major);
    }
    if (h.min_minor > h.max_minor) {
        return say(sink, MEMPLUG_STATUS_INVALID_ARGUMENT, "host minor range 1.%u..1.%u is empty",
                   (unsigned)h.min_minor, (unsigned)h.max_minor);
    }
    lo = max_u32(h.min_minor, P12_MIN_MINOR);
    hi = min_u32(h.max_minor, P12_MAX_MINOR);
    if (lo > hi) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH,
                   "no common minor: host speaks 1.%u..1.%u, plugin speaks 1.%u..1.%u", (unsigned)h.min_minor,
                   (unsigned)h.max_minor, P12_MIN_MINOR, P12_MAX_MINOR);
    }
    memset(&answer, 0, sizeof answer);
    answer.agreed_minor = hi;
    answer.plugin = &g_p12_plugin;
    write_prefix(out, &answer, sizeof answer);
    return MEMPLUG_STATUS_OK;
}
