/*
 * plugin_1_1.c: a plugin released when 1.1 was the newest minor, for the
 * compatibility matrix (abi-tests/tests/compat_matrix.rs).
 *
 * Compiled against the frozen 1.1 header (abi-tests/frozen/1.1/memplug.h),
 * never against the current one: it is what a vendor shipped with 1.1 and
 * never rebuilt. Its MemplugHostInfo is the 24-byte one (no `services`), so
 * a 1.2 host's longer host info is read as its 1.1 prefix, and it knows no
 * status past MEMPLUG_STATUS_BUSY. It speaks 1.0..=1.1 and answers with the
 * newest common minor.
 *
 * The memory work is the C example plugin's (c-examples/plugin/
 * example_plugin.c, included below with its entry renamed and hidden): an
 * allocator and a virtual backing, which 1.1 did not change (the request's
 * class tag, 1.1's other addition, is a hint it may ignore; the example
 * reads requests as prefixes, so 48-byte 1.1 requests are accepted).
 */

/* The example, with its entry symbol renamed and not exported. */
#define MEMPLUG_EXPORT static
#define memplug_plugin_v1 plugin_1_1_inner_entry_v1
#include "../../c-examples/plugin/example_plugin.c"
#undef memplug_plugin_v1
#undef MEMPLUG_EXPORT
#define MEMPLUG_EXPORT __attribute__((visibility("default")))

#if MEMPLUG_ABI_MINOR != 1
#error "plugin_1_1.c is compiled against the frozen 1.1 header (abi-tests/frozen/1.1)"
#endif

#define P11_MIN_MINOR 0u
#define P11_MAX_MINOR 1u

/* 1.1 added no capability this plugin claims: one descriptor serves 1.0
 * and 1.1 (only the plugin's own range differs from the example's). */
static const MemplugMechanism g_p11_mechanism = {
    .struct_size = sizeof(MemplugMechanism),
    .capabilities = MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING,
    .mechanism_id = EX_MECHANISM_ID,
    .name = "c-1.1",
    .device = {.kind = EX_DEVICE_KIND, .ordinal = EX_DEVICE_ORDINAL},
    .ctx = NULL,
    .allocator = &g_allocator,
    .virtual_backing = &g_virtual_backing,
    .shared_mapping = NULL,
    .sync = NULL,
};

static const MemplugMechanism *const g_p11_mechanisms[] = {&g_p11_mechanism};

static const MemplugPlugin g_p11_plugin = {
    .struct_size = sizeof(MemplugPlugin),
    .abi_major = 1,
    .min_minor = P11_MIN_MINOR,
    .max_minor = P11_MAX_MINOR,
    .name = "memplug-c-1.1",
    .version = "1.1.0",
    .ctx = NULL,
    .mechanism_count = 1,
    .mechanisms = g_p11_mechanisms,
    .live_objects = ex_live_objects,
    .unload = NULL,
};

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink);

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink)
{
    MemplugHostInfo h; /* 24 bytes: everything 1.1 knows of a host */
    MemplugNegotiation answer;
    uint32_t lo, hi;
    MemplugStatus st;

    (void)plugin_1_1_inner_entry_v1; /* the example's own entry is not used */
    (void)g_plugin;
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
    lo = max_u32(h.min_minor, P11_MIN_MINOR);
    hi = min_u32(h.max_minor, P11_MAX_MINOR);
    if (lo > hi) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH,
                   "no common minor: host speaks 1.%u..1.%u, plugin speaks 1.%u..1.%u", (unsigned)h.min_minor,
                   (unsigned)h.max_minor, P11_MIN_MINOR, P11_MAX_MINOR);
    }
    memset(&answer, 0, sizeof answer);
    answer.agreed_minor = hi;
    answer.plugin = &g_p11_plugin;
    write_prefix(out, &answer, sizeof answer);
    return MEMPLUG_STATUS_OK;
}
