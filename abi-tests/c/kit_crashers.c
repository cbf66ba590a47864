/*
 * kit_crashers.c: plugins that do what kills the process calling them, or
 * answer negotiation malformed, for the conformance kit's isolation tests
 * (cli/tests/conformance.rs). Each is the C example plugin
 * (c-examples/plugin/example_plugin.c, included below with its entry
 * renamed and hidden) behind a wrapper entry that hands out copies of its
 * descriptors with one slot or one answer field replaced. Build one
 * variant at a time (at most one KIT_* macro):
 *
 *   cc -std=c99 -shared -fPIC -fvisibility=hidden -I include -DKIT_ABORT_MEMORY_INFO \
 *      abi-tests/c/kit_crashers.c -o libkit.so -lpthread
 *
 * Variant                  What the plugin does
 * ------------------------ ----------------------------------------------------------
 * KIT_SEGV_ALLOCATE        allocate writes through a NULL pointer (SIGSEGV), every call
 * KIT_ABORT_MEMORY_INFO    memory_info calls abort() (SIGABRT)
 * KIT_HANG_MEMORY_INFO     memory_info never returns
 * KIT_EXIT_MEMORY_INFO     memory_info calls _exit(3)
 * KIT_NOISY_MEMORY_INFO    memory_info prints to stdout and stderr, terminal escape
 *                          sequences included, then writes through NULL
 * KIT_UNWRITTEN_ANSWER     the entry returns OK without writing its answer
 * KIT_MISALIGNED_ANSWER    the answer's descriptor pointer is one byte off
 * KIT_UNMAPPED_ANSWER      the answer's descriptor pointer names an unmapped page
 * KIT_MINOR_ANSWER         the answer's agreed_minor is 77 (outside both ranges)
 * KIT_STRUCT_SIZE_ANSWER   the entry overwrites the answer's struct_size (the host's)
 * KIT_ESCAPE_NAMES         plugin name, version and mechanism name carry terminal
 *                          escape sequences and control characters
 * KIT_SINK_AFTER_RETURN    allocate keeps the sink of a call it refused and writes
 *                          into it at its next call, after the first returned
 *
 * With no KIT_* macro it is the example plugin, unchanged but for the copy.
 */

/* As example_plugin.c sets them, before any system header. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE 1

#include "memplug.h"

#include <signal.h>
#include <stdint.h>

#if (defined(KIT_SEGV_ALLOCATE) + defined(KIT_ABORT_MEMORY_INFO) + defined(KIT_HANG_MEMORY_INFO) +          \
     defined(KIT_EXIT_MEMORY_INFO) + defined(KIT_NOISY_MEMORY_INFO) + defined(KIT_UNWRITTEN_ANSWER) +      \
     defined(KIT_MISALIGNED_ANSWER) + defined(KIT_UNMAPPED_ANSWER) + defined(KIT_MINOR_ANSWER) +           \
     defined(KIT_STRUCT_SIZE_ANSWER) + defined(KIT_ESCAPE_NAMES) + defined(KIT_SINK_AFTER_RETURN)) > 1
#error "define at most one KIT_* variant"
#endif

/* The example's entry becomes a hidden function of this library. */
#undef MEMPLUG_EXPORT
#define MEMPLUG_EXPORT
#define memplug_plugin_v1 kit_example_entry
#include "../../c-examples/plugin/example_plugin.c"
#undef memplug_plugin_v1
#undef MEMPLUG_EXPORT
#define MEMPLUG_EXPORT __attribute__((visibility("default")))

#if defined(KIT_SEGV_ALLOCATE) || defined(KIT_NOISY_MEMORY_INFO)
/* Read at run time, so no compiler sees the NULL write coming. */
static int *volatile g_kit_null;
#endif

#if defined(KIT_SEGV_ALLOCATE)
static MemplugStatus kit_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                  const MemplugMessageSink *sink)
{
    *g_kit_null = 1;
    return ex_allocate(ctx, request, out, sink);
}
#endif

#if defined(KIT_SINK_AFTER_RETURN)
/* The sink of the last refused allocate: kept past its call (the bug). */
static pthread_mutex_t g_kit_kept_lock = PTHREAD_MUTEX_INITIALIZER;
static MemplugMessageSink g_kit_kept;
static int g_kit_have_kept;

static MemplugStatus kit_allocate(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                  const MemplugMessageSink *sink)
{
    static const char late[] = "written after the call returned";
    MemplugMessageSink kept;
    int have;
    MemplugStatus st;

    pthread_mutex_lock(&g_kit_kept_lock);
    kept = g_kit_kept;
    have = g_kit_have_kept;
    g_kit_have_kept = 0;
    pthread_mutex_unlock(&g_kit_kept_lock);
    if (have && kept.write != NULL) {
        kept.write(kept.ctx, late, sizeof late - 1);
    }
    st = ex_allocate(ctx, request, out, sink);
    if (st != MEMPLUG_STATUS_OK && sink != NULL) {
        pthread_mutex_lock(&g_kit_kept_lock);
        g_kit_kept = *sink;
        g_kit_have_kept = 1;
        pthread_mutex_unlock(&g_kit_kept_lock);
    }
    return st;
}
#endif

#if defined(KIT_ABORT_MEMORY_INFO) || defined(KIT_HANG_MEMORY_INFO) || defined(KIT_EXIT_MEMORY_INFO) ||     \
    defined(KIT_NOISY_MEMORY_INFO)
#define KIT_MEMORY_INFO 1
static MemplugStatus kit_memory_info(void *ctx, MemplugMemoryInfo *out, const MemplugMessageSink *sink)
{
#if defined(KIT_ABORT_MEMORY_INFO)
    abort();
#elif defined(KIT_HANG_MEMORY_INFO)
    for (;;) {
        pause();
    }
#elif defined(KIT_EXIT_MEMORY_INFO)
    _exit(3);
#else
    printf("kit-noise on stdout \x1b[31mred\x1b[0m\n");
    fflush(stdout);
    fprintf(stderr, "kit-noise on stderr \x1b]0;title\x07 \x1b[2J\n");
    *g_kit_null = 1;
#endif
    return ex_memory_info(ctx, out, sink);
}
#endif

static MemplugAllocator g_kit_allocator;
static MemplugMechanism g_kit_mechanism;
static const MemplugMechanism *g_kit_mechanisms[1];
static MemplugPlugin g_kit_plugin;
static pthread_once_t g_kit_once = PTHREAD_ONCE_INIT;

static void kit_build(void)
{
    g_kit_allocator = g_allocator;
#if defined(KIT_SEGV_ALLOCATE) || defined(KIT_SINK_AFTER_RETURN)
    g_kit_allocator.allocate = kit_allocate;
#elif defined(KIT_MEMORY_INFO)
    g_kit_allocator.memory_info = kit_memory_info;
#endif
    g_kit_mechanism = g_mechanism;
    g_kit_mechanism.allocator = &g_kit_allocator;
    g_kit_mechanisms[0] = &g_kit_mechanism;
    g_kit_plugin = g_plugin;
    g_kit_plugin.mechanisms = g_kit_mechanisms;
#if defined(KIT_ESCAPE_NAMES)
    g_kit_plugin.name = "evil\x1b[2J\x1b[31m-plugin";
    g_kit_plugin.version = "6.6.6\x07\r\x1b[1A";
    g_kit_mechanism.name = "mech\x1b]0;pwned\x07";
#endif
}

MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink)
{
#if defined(KIT_UNWRITTEN_ANSWER)
    (void)host;
    (void)out;
    (void)sink;
    pthread_once(&g_kit_once, kit_build);
    return MEMPLUG_STATUS_OK;
#else
    MemplugStatus st = kit_example_entry(host, out, sink);

    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    pthread_once(&g_kit_once, kit_build);
    out->plugin = &g_kit_plugin;
#if defined(KIT_MISALIGNED_ANSWER)
    out->plugin = (const MemplugPlugin *)(const void *)((const char *)&g_kit_plugin + 1);
#elif defined(KIT_UNMAPPED_ANSWER)
    {
        /* A page that was mapped and is not any more. */
        void *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (page != MAP_FAILED) {
            munmap(page, 4096);
            out->plugin = (const MemplugPlugin *)page;
        }
    }
#elif defined(KIT_MINOR_ANSWER)
    out->agreed_minor = 77;
#elif defined(KIT_STRUCT_SIZE_ANSWER)
    out->struct_size = 4096;
#endif
    return st;
#endif
}
