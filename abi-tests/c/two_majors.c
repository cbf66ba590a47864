/*
 * two_majors.c: one library serving two ABI majors, for the compatibility
 * matrix (abi-tests/tests/compat_matrix.rs).
 *
 * It exports memplug_plugin_v1 (the C example plugin, c-examples/plugin/
 * example_plugin.c, included below) and memplug_plugin_v2, the entry of a
 * hypothetical major 2 (ARCHITECTURE.md section 3: the major is part of the entry
 * symbol, so one library can serve two). A host of major 1 must find and use
 * memplug_plugin_v1, the newest major it knows; it must never call the v2
 * entry, whose contract it cannot know. This v2 entry refuses anything that
 * is not a major-2 host, and writes "called" to stderr so a host that calls
 * it by mistake shows up in the test's output.
 *
 * Compiled against the current include/memplug.h.
 */

#include "../../c-examples/plugin/example_plugin.c"

/* The major-2 descriptor this library would give a major-2 host: the same
 * memory, described by a descriptor that says major 2 (a major-1 host that
 * read it would have to refuse it). */
static const MemplugPlugin g_plugin_v2 = {
    .struct_size = sizeof(MemplugPlugin),
    .abi_major = 2,
    .min_minor = 0,
    .max_minor = 0,
    .name = "memplug-two-majors (major 2)",
    .version = EX_PLUGIN_VERSION,
    .ctx = NULL,
    .mechanism_count = (uint32_t)(sizeof g_mechanisms / sizeof g_mechanisms[0]),
    .mechanisms = g_mechanisms,
    .live_objects = ex_live_objects,
    .unload = NULL,
};

/* Hypothetical: the signature of a future major is that major's business;
 * this one reuses major 1's for simplicity. */
MEMPLUG_EXPORT MemplugStatus memplug_plugin_v2(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink);

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v2(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink)
{
    MemplugHostInfo h;
    MemplugNegotiation answer;
    MemplugStatus st;

    fprintf(stderr, "two_majors: memplug_plugin_v2 called\n");
    st = read_prefix(&h, sizeof h, host, MEMPLUG_HOST_INFO_SIZE_1_0, "host info", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    st = check_out(out, MEMPLUG_NEGOTIATION_SIZE_1_0, "out negotiation", sink);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    if (h.abi_major != 2u) {
        return say(sink, MEMPLUG_STATUS_VERSION_MISMATCH,
                   "memplug_plugin_v2 serves major 2; the host speaks major %u (use memplug_plugin_v1)",
                   (unsigned)h.abi_major);
    }
    memset(&answer, 0, sizeof answer);
    answer.agreed_minor = 0;
    answer.plugin = &g_plugin_v2;
    write_prefix(out, &answer, sizeof answer);
    return MEMPLUG_STATUS_OK;
}
