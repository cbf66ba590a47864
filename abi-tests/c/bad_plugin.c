/*
 * bad_plugin.c: one C source for deliberately misbehaving plugins, for the
 * host's loader tests and the conformance kit's tests. Build one variant at
 * a time:
 *
 *   cc -std=c99 -shared -fPIC -fvisibility=hidden -I include -DBAD_WRONG_MAJOR \
 *      abi-tests/c/bad_plugin.c -o libbad.so -lpthread
 *
 * From Rust: memplug_abi_tests::bad_plugin(Some("BAD_WRONG_MAJOR")), or
 * bad_plugin(None) for the default. At most one BAD_* macro may be defined.
 *
 * With no BAD_* macro this is a correct minimal plugin: one mechanism
 * "bad-plugin" (id 7) on CPU 0 with an allocator (malloc-backed, identity
 * checked, exact live_objects), and nothing else. A correct host loads it.
 *
 * The variants marked [full] also publish a correct virtual backing (mmap
 * PROT_NONE reservations, mprotect commits, MADV_DONTNEED decommits), a
 * correct shared mapping (memfd objects mapped MAP_SHARED|MAP_FIXED) and a
 * correct sync capability (one worker thread per stream, fences as counts),
 * with the one misbehaviour the variant is named after. abi-tests/
 * MISBEHAVIOURS.md lists, for every variant, the host's response and the
 * conformance check (memplug conformance) that catches it.
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
 * BAD_LONG_STRUCTS          plugin, mechanism and allocator loads and works: only the 1.0
 *                           struct_size larger than 1.0,    prefix is read (no identity:
 *                           garbage after the prefix (the   1.2's field is not read at 1.0)
 *                           mechanism's 1.2 identity too)
 * BAD_CAPS_ABOVE_MINOR      a 1.0-only plugin sets bit 4    refuses: MEMPLUG_CAP_SHARED_EXPORT
 *                           (MEMPLUG_CAP_SHARED_EXPORT,     lies above the agreed minor 1.0
 *                           defined by ABI 1.1)
 * BAD_UNKNOWN_ACCESS        [full] map accepts access bits  loads; the host can only send READ
 *                           other than READ, READ|WRITE     or READ|WRITE (Access is closed)
 * BAD_MESSAGE_UNTERMINATED  messages end at an unreadable   reads exactly len bytes (no
 *                           page, no NUL, with a 0xff byte  over-read), invalid UTF-8 and the
 *                           and an ESC                      control character replaced
 * BAD_MESSAGE_OVERLONG      messages are 65536 bytes long   keeps the first MEMPLUG_MESSAGE_MAX
 *                                                           bytes
 * BAD_NULL_BLOCK            allocate says OK with address 0 refuses the block (INTERNAL),
 *                           (and allocates nothing)         counts nothing live
 * BAD_MISALIGNED_BLOCK      allocations aligned to 32 or    refuses the block (INTERNAL) and
 *                           more come back 16 bytes off     never frees it; unload is refused
 *                                                           while the plugin reports it
 * BAD_RANGE_UNCHECKED       [full] commit/decommit accept   refuses ranges outside the
 *                           ranges outside the reservation  reservation itself (OUT_OF_RANGE)
 *                           and count them in               before the plugin sees them
 *                           committed_bytes
 * BAD_COMMITTED_LIES        [full] committed_bytes reports  passes the count on; its charges
 *                           one granule more than committed follow the bytes it committed
 * BAD_FORGED_FENCE          [full] fence_query/fence_wait   trusts fences (the plugin is their
 *                           say OK for any handle, done or  only witness): only conformance
 *                           not, recorded or not            can tell
 * BAD_FENCE_NEVER           [full] fences never complete    waits time out; drain reports what
 *                                                           it could not retire
 * BAD_DUPLICATE_NAME        two mechanisms (ids 7 and 8)    refuses: names must be unique
 *                           named "bad-plugin"
 * BAD_SINK_TWICE            every refusal writes two        keeps the last message
 *                           messages through the sink
 * BAD_SINK_OTHER_THREAD     messages are written from       keeps the message (the writer is
 *                           another thread (joined before   joined before the call returns)
 *                           the slot returns)
 * BAD_REENTRANT_ENTRY       allocate calls the plugin's own unaffected: allocations work
 *                           entry point before allocating
 * BAD_LIVE_ZERO             live_objects always returns 0   refuses to unload from its own
 *                                                           counts while an allocation is live
 * BAD_DEALLOC_ANY           deallocate ignores the          refuses another mechanism's
 *                           mechanism id and device         object itself, before the plugin
 *                                                           sees it
 * BAD_DOUBLE_FREE_OK        deallocate of a freed slot says never sends a second free
 *                           OK                              (deallocate consumes the handle)
 * BAD_WRITES_OUT_ON_FAILURE allocate scribbles over its     ignores the output of a failed
 *                           output when it refuses          call
 * BAD_NEGOTIATE_LAX         entry accepts any major, range  loads; refuses on its own when the
 *                           and struct size, always agrees  ranges do not meet
 *                           on 1.0, writes 16 bytes of
 *                           answer whatever its size
 * BAD_READ_ONLY_WRITABLE    [full] read-only mappings are   cannot see it (it never writes
 *                           made read-write                 through a read-only view)
 * BAD_HOST_FN_TWICE         [full] the stream worker runs   runs the host's closure once; the
 *                           every host function twice       second run is counted as stray
 * BAD_HOST_FN_REFUSED_RUNS  [full] enqueue_host_fn runs the the closure ran once (before the
 *                           function inline, then fails     failure); nothing runs after it
 * BAD_HOST_FN_LATE          [full] enqueue_host_fn fails    drops the closure on the failure;
 *                           but keeps the function and runs the late run is counted as stray
 *                           it from the worker when the     and runs nothing
 *                           stream is destroyed
 * BAD_OVERLAPPING_BLOCKS    [full] while an allocation (a   refuses the new block (INTERNAL,
 *                           reservation) is live, a new one naming both objects); it is not
 *                           is reported at the address of   counted, charged, used or freed
 *                           the oldest live one
 * BAD_EXPORT_FD_STDIN       [full, ABI 1.1] export_fd       refuses fd 0 and leaves it open
 *                           returns 0 (the host's stdin)
 * BAD_EXPORT_FD_CLOSED      [full, ABI 1.1] export_fd       refuses a number that is not open
 *                           returns a number it has closed
 * BAD_EXPORT_FD_PIPE        [full, ABI 1.1] export_fd       refuses a pipe (cannot carry
 *                           returns the read end of a pipe  memory) and, as the call opened
 *                                                           it, closes it (no leak)
 * BAD_IMPORT_CLOSES_FD      [full, ABI 1.1] import_fd       lends a duplicate, so the caller's
 *                           closes the descriptor it was    descriptor stays open; refuses the
 *                           given                           import (INTERNAL)
 * BAD_ESCAPES_IN_NAMES      plugin name, version and        shows every control character
 *                           mechanism name carry terminal   escaped (\x1b, \r, \x07, ...),
 *                           escapes, CR, BEL, C1 and bidi   never raw
 *                           controls
 * BAD_DOUBLE_FREE_WITNESS   deallocate of a freed or stale  never sends a second free (the
 *                           handle says OK and remembers:   plugin's count stays 0 and
 *                           live_objects counts it forever  allocate keeps working)
 *                           and allocate refuses after it
 * BAD_SINK_LATE             keeps every sink it is given    drops every late write and counts
 *                           (a copy and the pointer); the   it (late_sink_writes), keeps each
 *                           next refusal first writes into  call's own message, survives
 *                           the previous call's, and a
 *                           detached thread writes into it
 *                           again and again after the slot
 *                           returned
 * BAD_MESSAGE_LEN_LIES      messages claim 4096 bytes more  keeps what is readable, says the
 *                           than there are, running into an message was cut, counts it
 *                           unreadable page                 (unreadable_plugin_messages)
 * BAD_OVERSIZED_BLOCK       [full] allocate, reserve and    refuses each block (INTERNAL, both
 *                           create report 2^62 bytes for    sizes in the message): not
 *                           any request                     counted, charged or freed
 * BAD_EXPORT_NOT_MEMFD      [full, ABI 1.1] export_fd       refuses both (INTERNAL, naming the
 *                           returns /proc/self/status       slot and what the fd is); closes
 *                           opened anew, then (next call)   the new file, leaves the old
 *                           a descriptor it made in the     number open
 *                           call before
 *
 * None of the variants crashes the host when called the way the ABI says;
 * a host that crashes on one of them has a bug.
 */

/* memfd_create, MAP_ANONYMOUS and madvise are not POSIX. */
#define _GNU_SOURCE 1

#include "memplug.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if (defined(BAD_NO_ENTRY) + defined(BAD_WRONG_MAJOR) + defined(BAD_VERSION_REFUSE) +            \
     defined(BAD_AGREED_MINOR) + defined(BAD_SHORT_PLUGIN) + defined(BAD_SHORT_MECHANISM) +      \
     defined(BAD_SHORT_ALLOCATOR) + defined(BAD_NULL_ALLOCATE) + defined(BAD_NULL_ALLOCATOR) +   \
     defined(BAD_FLAG_WITHOUT_POINTER) + defined(BAD_POINTER_WITHOUT_FLAG) +                     \
     defined(BAD_UNKNOWN_STATUS) + defined(BAD_ZERO_MECHANISMS) + defined(BAD_NULL_NAME) +       \
     defined(BAD_DUPLICATE_ID) + defined(BAD_ENTRY_FAILS) + defined(BAD_NO_LIVE_OBJECTS) +       \
     defined(BAD_LIVE_FOREVER) + defined(BAD_NULL_PLUGIN) + defined(BAD_UNKNOWN_CAPS) +          \
     defined(BAD_UNKNOWN_DEVICE_KIND) + defined(BAD_LONG_STRUCTS) +                              \
     defined(BAD_CAPS_ABOVE_MINOR) + defined(BAD_UNKNOWN_ACCESS) +                               \
     defined(BAD_MESSAGE_UNTERMINATED) + defined(BAD_MESSAGE_OVERLONG) +                         \
     defined(BAD_NULL_BLOCK) + defined(BAD_MISALIGNED_BLOCK) + defined(BAD_RANGE_UNCHECKED) +    \
     defined(BAD_COMMITTED_LIES) + defined(BAD_FORGED_FENCE) + defined(BAD_FENCE_NEVER) +        \
     defined(BAD_DUPLICATE_NAME) + defined(BAD_SINK_TWICE) + defined(BAD_SINK_OTHER_THREAD) +    \
     defined(BAD_REENTRANT_ENTRY) + defined(BAD_LIVE_ZERO) + defined(BAD_DEALLOC_ANY) +          \
     defined(BAD_DOUBLE_FREE_OK) + defined(BAD_WRITES_OUT_ON_FAILURE) +                          \
     defined(BAD_NEGOTIATE_LAX) + defined(BAD_READ_ONLY_WRITABLE) + defined(BAD_HOST_FN_TWICE) +    \
     defined(BAD_HOST_FN_REFUSED_RUNS) + defined(BAD_HOST_FN_LATE) + defined(BAD_OVERLAPPING_BLOCKS) + \
     defined(BAD_EXPORT_FD_STDIN) + defined(BAD_EXPORT_FD_CLOSED) + defined(BAD_EXPORT_FD_PIPE) +       \
     defined(BAD_IMPORT_CLOSES_FD) + defined(BAD_ESCAPES_IN_NAMES) + defined(BAD_DOUBLE_FREE_WITNESS) + \
     defined(BAD_SINK_LATE) + defined(BAD_MESSAGE_LEN_LIES) + defined(BAD_OVERSIZED_BLOCK) +           \
     defined(BAD_EXPORT_NOT_MEMFD)) > 1
#error "define at most one BAD_* variant"
#endif

/* The variants whose misbehaviour lies in an optional capability publish
 * all of them. */
/* The variants that speak ABI 1.1 (and only 1.1) and publish the shared
 * mapping's export_fd and import_fd. */
#if defined(BAD_EXPORT_FD_STDIN) || defined(BAD_EXPORT_FD_CLOSED) || defined(BAD_EXPORT_FD_PIPE) ||        \
    defined(BAD_IMPORT_CLOSES_FD) || defined(BAD_EXPORT_NOT_MEMFD)
#define BAD_EXPORTS 1
#define BAD_MINOR 1u
#else
#define BAD_MINOR 0u
#endif

#if defined(BAD_UNKNOWN_ACCESS) || defined(BAD_RANGE_UNCHECKED) || defined(BAD_COMMITTED_LIES) ||     \
    defined(BAD_FORGED_FENCE) || defined(BAD_FENCE_NEVER) || defined(BAD_READ_ONLY_WRITABLE) ||        \
    defined(BAD_HOST_FN_TWICE) || defined(BAD_HOST_FN_REFUSED_RUNS) || defined(BAD_HOST_FN_LATE) ||    \
    defined(BAD_OVERLAPPING_BLOCKS) || defined(BAD_EXPORTS) || defined(BAD_OVERSIZED_BLOCK)
#define BAD_FULL 1
#endif

#define BAD_MECHANISM_ID 7u
#define BAD_MAX_LIVE 256u

/* Helpers some variants leave unused. */
#if defined(__GNUC__) || defined(__clang__)
#define BAD_MAYBE_UNUSED __attribute__((unused))
#else
#define BAD_MAYBE_UNUSED
#endif

#ifdef BAD_UNKNOWN_DEVICE_KIND
#define BAD_DEVICE_KIND 99u
#else
#define BAD_DEVICE_KIND MEMPLUG_DEVICE_CPU
#endif

/* ---- messages ------------------------------------------------------------ */

#ifdef BAD_SINK_OTHER_THREAD
struct bad_say {
    const MemplugMessageSink *sink;
    const char *msg;
};

static void *bad_say_thread(void *p)
{
    struct bad_say *s = (struct bad_say *)p;
    s->sink->write(s->sink->ctx, s->msg, strlen(s->msg));
    return NULL;
}
#endif

#ifdef BAD_SINK_LATE
/* The sink of the previous refusal, as a copy and as the pointer the host
 * passed (both kept past the call, against the contract). */
static pthread_mutex_t g_kept_lock = PTHREAD_MUTEX_INITIALIZER;
static MemplugMessageSink g_kept;
static const MemplugMessageSink *g_kept_ptr;
static int g_have_kept;

static void *bad_late_thread(void *p)
{
    static const char late[] = "bad_plugin: written after the slot returned";
    MemplugMessageSink copy = *(MemplugMessageSink *)p;
    struct timespec first = {0, 50000000}; /* 50 ms: the slot has returned */
    struct timespec ts = {0, 200000}; /* 0.2 ms */
    int i;
    free(p);
    (void)nanosleep(&first, NULL);
    for (i = 0; i < 20; i++) {
        (void)nanosleep(&ts, NULL);
        copy.write(copy.ctx, late, sizeof late - 1);
    }
    return NULL;
}
#endif

static void say(const MemplugMessageSink *sink, const char *msg)
{
    size_t n = strlen(msg);
    if (sink == NULL || sink->write == NULL) {
        return;
    }
#if defined(BAD_MESSAGE_UNTERMINATED)
    {
        /* The message, a 0xff byte and an ESC end exactly where readable
         * memory ends: a reader that looks for a NUL crashes. */
        long page = sysconf(_SC_PAGESIZE);
        unsigned char *two;
        unsigned char *start;
        if (page <= 0 || n + 2 > (size_t)page) {
            sink->write(sink->ctx, msg, n);
            return;
        }
        two = (unsigned char *)mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (two == MAP_FAILED) {
            sink->write(sink->ctx, msg, n);
            return;
        }
        (void)mprotect(two + page, (size_t)page, PROT_NONE);
        start = two + page - (n + 2);
        memcpy(start, msg, n);
        start[n] = 0xff;
        start[n + 1] = 0x1b;
        sink->write(sink->ctx, (const char *)start, n + 2);
        (void)munmap(two, 2 * (size_t)page);
    }
#elif defined(BAD_MESSAGE_OVERLONG)
    {
        const size_t total = 65536;
        char *big = (char *)malloc(total);
        if (big == NULL) {
            sink->write(sink->ctx, msg, n);
            return;
        }
        memcpy(big, msg, n < total ? n : total);
        if (n < total) {
            memset(big + n, '.', total - n);
        }
        sink->write(sink->ctx, big, total);
        free(big);
    }
#elif defined(BAD_MESSAGE_LEN_LIES)
    {
        /* The message ends where readable memory ends, and its length says
         * 4096 bytes more: a reader that believes it faults. */
        long page = sysconf(_SC_PAGESIZE);
        unsigned char *two;
        unsigned char *start;
        if (page <= 0 || n > (size_t)page) {
            sink->write(sink->ctx, msg, n);
            return;
        }
        two = (unsigned char *)mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (two == MAP_FAILED) {
            sink->write(sink->ctx, msg, n);
            return;
        }
        (void)mprotect(two + page, (size_t)page, PROT_NONE);
        start = two + page - n;
        memcpy(start, msg, n);
        sink->write(sink->ctx, (const char *)start, n + 4096);
        (void)munmap(two, 2 * (size_t)page);
    }
#elif defined(BAD_SINK_LATE)
    {
        static const char stale[] = "bad_plugin: written into the sink of an earlier call";
        MemplugMessageSink *copy;
        pthread_t t;
        pthread_attr_t attr;
        pthread_mutex_lock(&g_kept_lock);
        if (g_have_kept) {
            /* Both ways a kept sink can be reached: the copy, and the
             * pointer (which a host must keep valid, or this reads a dead
             * stack). */
            g_kept.write(g_kept.ctx, stale, sizeof stale - 1);
            g_kept_ptr->write(g_kept_ptr->ctx, stale, sizeof stale - 1);
        }
        pthread_mutex_unlock(&g_kept_lock);
        sink->write(sink->ctx, msg, n);
        pthread_mutex_lock(&g_kept_lock);
        g_kept = *sink;
        g_kept_ptr = sink;
        g_have_kept = 1;
        pthread_mutex_unlock(&g_kept_lock);
        /* And a thread that keeps writing after the slot returned. */
        copy = (MemplugMessageSink *)malloc(sizeof *copy);
        if (copy != NULL) {
            *copy = *sink;
            (void)pthread_attr_init(&attr);
            (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            if (pthread_create(&t, &attr, bad_late_thread, copy) != 0) {
                free(copy);
            }
            (void)pthread_attr_destroy(&attr);
        }
    }
#elif defined(BAD_SINK_TWICE)
    {
        static const char first[] = "bad_plugin: a first message, superseded by the next";
        sink->write(sink->ctx, first, sizeof first - 1);
        sink->write(sink->ctx, msg, n);
    }
#elif defined(BAD_SINK_OTHER_THREAD)
    {
        pthread_t t;
        struct bad_say s;
        s.sink = sink;
        s.msg = msg;
        if (pthread_create(&t, NULL, bad_say_thread, &s) == 0) {
            (void)pthread_join(t, NULL);
        } else {
            sink->write(sink->ctx, msg, n);
        }
    }
#else
    sink->write(sink->ctx, msg, n);
#endif
}

static uint32_t struct_size_of(const void *p)
{
    uint32_t n;
    memcpy(&n, p, sizeof n);
    return n;
}

BAD_MAYBE_UNUSED static uint64_t bad_granularity(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096u;
}

#ifdef BAD_REENTRANT_ENTRY
MEMPLUG_EXPORT MemplugStatus memplug_plugin_v1(const MemplugHostInfo *host, MemplugNegotiation *out,
                                               const MemplugMessageSink *sink);
#endif

/* ---- a correct minimal allocator --------------------------------------- */

struct bad_slot {
    void *ptr; /* what to free; NULL when the slot is free */
    uint64_t addr; /* what was handed out */
    uint64_t object_id;
    uint64_t size;
    uint32_t generation;
};

/* Guards every table of this file but the sync ones. Never held while
 * calling the host (say() runs after it is released). */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct bad_slot g_slots[BAD_MAX_LIVE];
static uint64_t g_live;
#ifdef BAD_DOUBLE_FREE_WITNESS
/* Frees received for a handle already freed (or of a slot reused since). */
static uint64_t g_second_frees;
static uint64_t g_second_free_handle;
#endif

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
#ifdef BAD_FULL
    p.granularity = bad_granularity();
#else
    p.granularity = 0; /* no virtual backing, no shared mapping */
#endif
    memcpy((unsigned char *)out + 4, (unsigned char *)&p + 4, MEMPLUG_PROPERTIES_SIZE_1_0 - 4);
    return MEMPLUG_STATUS_OK;
}

/* A refusal of allocate, once `out` is known to be writable. */
BAD_MAYBE_UNUSED static MemplugStatus bad_refuse(MemplugBlock *out, MemplugStatus status)
{
#ifdef BAD_WRITES_OUT_ON_FAILURE
    memset((unsigned char *)out + 4, 0xee, MEMPLUG_BLOCK_SIZE_1_0 - 4);
#else
    (void)out;
#endif
    return status;
}

BAD_MAYBE_UNUSED static void write_block(MemplugBlock *out, uint64_t addr, uint64_t size, uint64_t handle)
{
    MemplugBlock b;
    memset(&b, 0, sizeof b);
    b.addr = addr;
#ifdef BAD_OVERSIZED_BLOCK
    /* Every block claims 2^62 bytes, whatever was asked and made. */
    (void)size;
    size = (uint64_t)1 << 62;
#endif
    b.size = size;
    b.handle = handle;
    memcpy((unsigned char *)out + 4, (unsigned char *)&b + 4, MEMPLUG_BLOCK_SIZE_1_0 - 4);
}

/* Checks what allocate, reserve and create have in common. */
BAD_MAYBE_UNUSED static MemplugStatus check_request(const MemplugRequest *request, MemplugBlock *out,
                                                    MemplugRequest *r, const char **why)
{
    if (request == NULL || out == NULL || struct_size_of(request) < MEMPLUG_REQUEST_SIZE_1_0 ||
        struct_size_of(out) < MEMPLUG_BLOCK_SIZE_1_0) {
        *why = "bad_plugin: request or out is NULL or short";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memcpy(r, request, sizeof *r);
    if (r->device.kind != BAD_DEVICE_KIND || r->device.ordinal != 0) {
        *why = "bad_plugin: wrong device";
        return MEMPLUG_STATUS_WRONG_DEVICE;
    }
    if (r->flags != 0 || r->size == 0) {
        *why = "bad_plugin: unknown flags or zero size";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
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
    void *p = NULL;
    uint32_t i;
    uint64_t align;
    uint64_t addr;
    uint64_t extra = 0;
    const char *why = NULL;
    MemplugStatus st;

    (void)ctx;
#ifdef BAD_REENTRANT_ENTRY
    {
        /* Calls back into its own entry point in the middle of a slot. */
        MemplugHostInfo again;
        MemplugNegotiation answer;
        memset(&again, 0, sizeof again);
        again.struct_size = sizeof again;
        again.abi_major = 1;
        again.host_name = "bad_plugin, re-entered";
        memset(&answer, 0, sizeof answer);
        answer.struct_size = sizeof answer;
        if (memplug_plugin_v1(&again, &answer, NULL) != MEMPLUG_STATUS_OK || answer.plugin == NULL) {
            say(sink, "bad_plugin: allocate: re-entering the entry point failed");
            return MEMPLUG_STATUS_INTERNAL;
        }
    }
#endif
    st = check_request(request, out, &r, &why);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
        if (out != NULL && struct_size_of(out) >= MEMPLUG_BLOCK_SIZE_1_0) {
            return bad_refuse(out, st);
        }
        return st;
    }
    if (r.alignment == 0 || (r.alignment & (r.alignment - 1)) != 0 || r.alignment > 4096) {
        say(sink, "bad_plugin: allocate: bad flags, size or alignment");
        return bad_refuse(out, MEMPLUG_STATUS_INVALID_ARGUMENT);
    }
#ifdef BAD_NULL_BLOCK
    /* Claims success without allocating anything. */
    write_block(out, 0, r.size, 0);
    return MEMPLUG_STATUS_OK;
#endif
    align = r.alignment < 16 ? 16 : r.alignment;
#ifdef BAD_MISALIGNED_BLOCK
    /* Anything aligned to more than 16 comes back 16 bytes off. */
    if (align > 16) {
        extra = 16;
    }
#endif
    if ((uint64_t)(size_t)r.size != r.size || r.size > UINT64_MAX - extra ||
        posix_memalign(&p, (size_t)align, (size_t)(r.size + extra)) != 0) {
        say(sink, "bad_plugin: allocate: out of memory");
        return bad_refuse(out, MEMPLUG_STATUS_OUT_OF_MEMORY);
    }
    addr = (uint64_t)(uintptr_t)p + extra;
    pthread_mutex_lock(&g_lock);
#ifdef BAD_DOUBLE_FREE_WITNESS
    if (g_second_frees != 0) {
        /* Tells whoever looks that the host sent a second free. */
        static char seen[160];
        (void)snprintf(seen, sizeof seen,
                       "bad_plugin: the host sent %llu second free(s), the last for handle %#llx",
                       (unsigned long long)g_second_frees, (unsigned long long)g_second_free_handle);
        pthread_mutex_unlock(&g_lock);
        free(p);
        say(sink, seen);
        return bad_refuse(out, MEMPLUG_STATUS_INTERNAL);
    }
#endif
    for (i = 0; i < BAD_MAX_LIVE && g_slots[i].ptr != NULL; i++) {
        /* find a free slot */
    }
    if (i == BAD_MAX_LIVE) {
        pthread_mutex_unlock(&g_lock);
        free(p);
        say(sink, "bad_plugin: allocate: too many live allocations");
        return bad_refuse(out, MEMPLUG_STATUS_OUT_OF_MEMORY);
    }
    g_slots[i].ptr = p;
    g_slots[i].addr = addr;
    g_slots[i].object_id = r.object_id;
    g_slots[i].size = r.size;
    g_live++;
#ifdef BAD_OVERLAPPING_BLOCKS
    {
        /* Reports the address of the oldest other live allocation (its own
         * bookkeeping keeps the real one, so a free of that block would
         * never match). */
        uint32_t j;
        for (j = 0; j < BAD_MAX_LIVE; j++) {
            if (j != i && g_slots[j].ptr != NULL) {
                addr = g_slots[j].addr;
                break;
            }
        }
    }
#endif
    write_block(out, addr, r.size, ((uint64_t)g_slots[i].generation << 32) | (i + 1u));
    pthread_mutex_unlock(&g_lock);
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
#ifndef BAD_DEALLOC_ANY
    if (o.mechanism_id != BAD_MECHANISM_ID) {
        say(sink, "bad_plugin: deallocate: made by another mechanism");
        return MEMPLUG_STATUS_WRONG_MECHANISM;
    }
    if (o.device.kind != BAD_DEVICE_KIND || o.device.ordinal != 0) {
        say(sink, "bad_plugin: deallocate: wrong device");
        return MEMPLUG_STATUS_WRONG_DEVICE;
    }
#endif
    index = (o.handle & 0xffffffffu);
    pthread_mutex_lock(&g_lock);
    s = (index >= 1 && index <= BAD_MAX_LIVE) ? &g_slots[index - 1] : NULL;
#ifdef BAD_DOUBLE_FREE_OK
    /* A slot already free: "freed" again, successfully. */
    if (s != NULL && s->ptr == NULL) {
        pthread_mutex_unlock(&g_lock);
        return MEMPLUG_STATUS_OK;
    }
#endif
#ifdef BAD_DOUBLE_FREE_WITNESS
    /* A slot already free, or reused since the handle was given out: a
     * second free, "successful", and remembered. */
    if (s != NULL && (s->ptr == NULL || s->generation != (uint32_t)(o.handle >> 32))) {
        g_second_frees++;
        g_second_free_handle = o.handle;
        pthread_mutex_unlock(&g_lock);
        return MEMPLUG_STATUS_OK;
    }
#endif
    if (s == NULL || s->ptr == NULL || s->generation != (uint32_t)(o.handle >> 32) ||
        s->object_id != o.object_id || s->addr != o.addr || s->size != o.size) {
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

#ifdef BAD_FULL
/* ---- [full] virtual backing and shared mapping --------------------------- */

#define BAD_MAX_RESERVATIONS 64u
#define BAD_MAX_PHYSICAL 64u
#define BAD_MAX_MAPPINGS 128u
/* Handles: generation << 32 | kind << 24 | (index + 1). */
#define BAD_KIND_RESERVATION 1u
#define BAD_KIND_PHYSICAL 2u
#define BAD_KIND_STREAM 3u
#define BAD_KIND_FENCE 4u
/* Page states of a reservation. */
#define BAD_PAGE_FREE 0u
#define BAD_PAGE_COMMITTED 1u
#define BAD_PAGE_MAPPED 2u
/* Largest reservation or physical object attempted. */
#define BAD_MAX_BYTES ((uint64_t)1 << 40)

struct bad_reservation {
    int live;
    uint32_t generation;
    uint64_t object_id;
    uint64_t addr;
    uint64_t size;
    unsigned char *pages; /* BAD_PAGE_* per granule */
    uint64_t phantom; /* BAD_RANGE_UNCHECKED: bytes "committed" out of range */
};

struct bad_physical {
    int live;
    uint32_t generation;
    uint64_t object_id;
    uint64_t size;
    uint64_t host_refs;
    uint64_t mapping_refs;
    int fd;
};

struct bad_mapping {
    int live;
    uint32_t reservation;
    uint32_t physical;
    uint64_t offset;
    uint64_t len;
};

static struct bad_reservation g_res[BAD_MAX_RESERVATIONS];
static struct bad_physical g_phys[BAD_MAX_PHYSICAL];
static struct bad_mapping g_maps[BAD_MAX_MAPPINGS];
static uint64_t g_res_live;
static uint64_t g_phys_live;

static uint64_t make_handle(uint32_t generation, uint32_t kind, uint32_t index)
{
    return ((uint64_t)generation << 32) | ((uint64_t)kind << 24) | (index + 1u);
}

/* The index a handle of `kind` names, or `limit` when it names none. */
static uint32_t handle_index(uint64_t handle, uint32_t kind, uint32_t limit)
{
    uint32_t low = (uint32_t)handle;
    uint32_t index;
    if ((low >> 24) != kind || (low & 0xffffffu) == 0) {
        return limit;
    }
    index = (low & 0xffffffu) - 1u;
    return index < limit ? index : limit;
}

/* Copies `object` and checks its owner; the status, and `why` on failure. */
static MemplugStatus read_ref(const MemplugObjectRef *object, MemplugObjectRef *o, const char **why)
{
    if (object == NULL || struct_size_of(object) < MEMPLUG_OBJECT_REF_SIZE_1_0) {
        *why = "bad_plugin: object reference is NULL or short";
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memcpy(o, object, sizeof *o);
    if (o->mechanism_id != BAD_MECHANISM_ID) {
        *why = "bad_plugin: the object was made by another mechanism";
        return MEMPLUG_STATUS_WRONG_MECHANISM;
    }
    if (o->device.kind != BAD_DEVICE_KIND || o->device.ordinal != 0) {
        *why = "bad_plugin: the object names another device";
        return MEMPLUG_STATUS_WRONG_DEVICE;
    }
    return MEMPLUG_STATUS_OK;
}

/* Under g_lock: the live reservation `object` names. */
static MemplugStatus find_reservation(const MemplugObjectRef *object, uint32_t *index, const char **why)
{
    MemplugObjectRef o;
    uint32_t i;
    MemplugStatus st = read_ref(object, &o, why);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    i = handle_index(o.handle, BAD_KIND_RESERVATION, BAD_MAX_RESERVATIONS);
    if (i == BAD_MAX_RESERVATIONS || !g_res[i].live || g_res[i].generation != (uint32_t)(o.handle >> 32) ||
        g_res[i].object_id != o.object_id || g_res[i].addr != o.addr || g_res[i].size != o.size) {
        *why = "bad_plugin: no such reservation (never made, released, or altered)";
        return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
    }
    *index = i;
    return MEMPLUG_STATUS_OK;
}

/* Under g_lock: the physical object `object` names, while the host holds a
 * reference to it. */
static MemplugStatus find_physical(const MemplugObjectRef *object, uint32_t *index, const char **why)
{
    MemplugObjectRef o;
    uint32_t i;
    MemplugStatus st = read_ref(object, &o, why);
    if (st != MEMPLUG_STATUS_OK) {
        return st;
    }
    i = handle_index(o.handle, BAD_KIND_PHYSICAL, BAD_MAX_PHYSICAL);
    if (i == BAD_MAX_PHYSICAL || !g_phys[i].live || g_phys[i].host_refs == 0 ||
        g_phys[i].generation != (uint32_t)(o.handle >> 32) || g_phys[i].object_id != o.object_id ||
        o.addr != 0 || g_phys[i].size != o.size) {
        *why = "bad_plugin: no such physical object (never made, released, or altered)";
        return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
    }
    *index = i;
    return MEMPLUG_STATUS_OK;
}

/* A range `[offset, offset + len)` of an object of `limit` bytes. */
static MemplugStatus check_range(uint64_t offset, uint64_t len, uint64_t limit, const char **why)
{
    uint64_t g = bad_granularity();
    if (len == 0) {
        *why = "bad_plugin: empty range";
        return MEMPLUG_STATUS_OUT_OF_RANGE;
    }
    if (offset % g != 0 || len % g != 0) {
        *why = "bad_plugin: range not aligned to the granularity";
        return MEMPLUG_STATUS_OUT_OF_RANGE;
    }
    if (offset > UINT64_MAX - len) {
        *why = "bad_plugin: offset + length overflows";
        return MEMPLUG_STATUS_OUT_OF_RANGE;
    }
    if (offset + len > limit) {
        *why = "bad_plugin: range lies past the end of its object";
        return MEMPLUG_STATUS_OUT_OF_RANGE;
    }
    return MEMPLUG_STATUS_OK;
}

/* Under g_lock: true when every granule of the range is in `state`. */
static int pages_are(const struct bad_reservation *r, uint64_t offset, uint64_t len, unsigned state)
{
    uint64_t g = bad_granularity();
    uint64_t p;
    for (p = offset / g; p < (offset + len) / g; p++) {
        if (r->pages[p] != state) {
            return 0;
        }
    }
    return 1;
}

static void set_pages(struct bad_reservation *r, uint64_t offset, uint64_t len, unsigned state)
{
    uint64_t g = bad_granularity();
    memset(r->pages + offset / g, (int)state, (size_t)(len / g));
}

/* Under g_lock: drops one reference of physical object `i`. */
static void drop_physical(uint32_t i, int mapping_ref)
{
    struct bad_physical *p = &g_phys[i];
    if (mapping_ref) {
        p->mapping_refs--;
    } else {
        p->host_refs--;
    }
    if (p->host_refs == 0 && p->mapping_refs == 0) {
        close(p->fd);
        p->live = 0;
        p->generation++;
        g_phys_live--;
    }
}

/* Rounds a request's size up to the granularity; 0 when impossible. */
static uint64_t rounded(uint64_t size)
{
    uint64_t g = bad_granularity();
    if (size > BAD_MAX_BYTES) {
        return 0;
    }
    return (size + g - 1) / g * g;
}

static MemplugStatus bad_reserve(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                 const MemplugMessageSink *sink)
{
    MemplugRequest r;
    const char *why = NULL;
    uint64_t size;
    void *addr;
    unsigned char *pages;
    uint32_t i;
    MemplugStatus st = check_request(request, out, &r, &why);

    (void)ctx;
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
        return st;
    }
    size = rounded(r.size);
    if (size == 0) {
        say(sink, "bad_plugin: reserve: too large");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    addr = mmap(NULL, (size_t)size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (addr == MAP_FAILED) {
        say(sink, "bad_plugin: reserve: mmap failed");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    pages = (unsigned char *)calloc((size_t)(size / bad_granularity()), 1);
    if (pages == NULL) {
        munmap(addr, (size_t)size);
        say(sink, "bad_plugin: reserve: out of memory");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&g_lock);
    for (i = 0; i < BAD_MAX_RESERVATIONS && g_res[i].live; i++) {
        /* find a free slot */
    }
    if (i == BAD_MAX_RESERVATIONS) {
        pthread_mutex_unlock(&g_lock);
        free(pages);
        munmap(addr, (size_t)size);
        say(sink, "bad_plugin: reserve: too many reservations");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    g_res[i].live = 1;
    g_res[i].object_id = r.object_id;
    g_res[i].addr = (uint64_t)(uintptr_t)addr;
    g_res[i].size = size;
    g_res[i].pages = pages;
    g_res[i].phantom = 0;
    g_res_live++;
#ifdef BAD_OVERLAPPING_BLOCKS
    {
        /* Reports the address of the oldest other live reservation; its
         * own bookkeeping keeps the real one. */
        uint32_t j;
        for (j = 0; j < BAD_MAX_RESERVATIONS; j++) {
            if (j != i && g_res[j].live) {
                write_block(out, g_res[j].addr, size, make_handle(g_res[i].generation, BAD_KIND_RESERVATION, i));
                pthread_mutex_unlock(&g_lock);
                return MEMPLUG_STATUS_OK;
            }
        }
    }
#endif
    write_block(out, g_res[i].addr, size, make_handle(g_res[i].generation, BAD_KIND_RESERVATION, i));
    pthread_mutex_unlock(&g_lock);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus bad_commit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                                const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t i;
    struct bad_reservation *r;
    MemplugStatus st;

    (void)ctx;
    pthread_mutex_lock(&g_lock);
    st = find_reservation(reservation, &i, &why);
    if (st != MEMPLUG_STATUS_OK) {
        goto out;
    }
    r = &g_res[i];
    st = check_range(offset, len, r->size, &why);
    if (st != MEMPLUG_STATUS_OK) {
#ifdef BAD_RANGE_UNCHECKED
        /* "Committed", and counted. */
        r->phantom += len;
        st = MEMPLUG_STATUS_OK;
#endif
        goto out;
    }
    if (!pages_are(r, offset, len, BAD_PAGE_FREE)) {
        why = "bad_plugin: commit: part of the range is committed or mapped";
        st = MEMPLUG_STATUS_INVALID_STATE;
        goto out;
    }
    if (mprotect((void *)(uintptr_t)(r->addr + offset), (size_t)len, PROT_READ | PROT_WRITE) != 0) {
        why = "bad_plugin: commit: mprotect failed";
        st = MEMPLUG_STATUS_OUT_OF_MEMORY;
        goto out;
    }
    set_pages(r, offset, len, BAD_PAGE_COMMITTED);
out:
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
    }
    return st;
}

static MemplugStatus bad_decommit(void *ctx, const MemplugObjectRef *reservation, uint64_t offset,
                                  uint64_t len, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t i;
    struct bad_reservation *r;
    void *p;
    MemplugStatus st;

    (void)ctx;
    pthread_mutex_lock(&g_lock);
    st = find_reservation(reservation, &i, &why);
    if (st != MEMPLUG_STATUS_OK) {
        goto out;
    }
    r = &g_res[i];
    st = check_range(offset, len, r->size, &why);
    if (st != MEMPLUG_STATUS_OK) {
#ifdef BAD_RANGE_UNCHECKED
        r->phantom -= len < r->phantom ? len : r->phantom;
        st = MEMPLUG_STATUS_OK;
#endif
        goto out;
    }
    if (!pages_are(r, offset, len, BAD_PAGE_COMMITTED)) {
        why = "bad_plugin: decommit: part of the range is not committed";
        st = MEMPLUG_STATUS_INVALID_STATE;
        goto out;
    }
    p = (void *)(uintptr_t)(r->addr + offset);
    if (madvise(p, (size_t)len, MADV_DONTNEED) != 0 || mprotect(p, (size_t)len, PROT_NONE) != 0) {
        why = "bad_plugin: decommit: madvise or mprotect failed";
        st = MEMPLUG_STATUS_INTERNAL;
        goto out;
    }
    set_pages(r, offset, len, BAD_PAGE_FREE);
out:
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
    }
    return st;
}

static MemplugStatus bad_committed_bytes(void *ctx, const MemplugObjectRef *reservation, uint64_t *out_bytes,
                                         const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t i;
    uint64_t p;
    uint64_t n = 0;
    uint64_t g = bad_granularity();
    MemplugStatus st;

    (void)ctx;
    if (out_bytes == NULL) {
        say(sink, "bad_plugin: committed_bytes: out_bytes is NULL");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&g_lock);
    st = find_reservation(reservation, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        for (p = 0; p < g_res[i].size / g; p++) {
            n += g_res[i].pages[p] == BAD_PAGE_COMMITTED ? g : 0;
        }
        n += g_res[i].phantom;
#ifdef BAD_COMMITTED_LIES
        n += g;
#endif
    }
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
        return st;
    }
    *out_bytes = n;
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus bad_release_reservation(void *ctx, const MemplugObjectRef *reservation,
                                             const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t i;
    uint32_t m;
    MemplugStatus st;

    (void)ctx;
    pthread_mutex_lock(&g_lock);
    st = find_reservation(reservation, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        for (m = 0; m < BAD_MAX_MAPPINGS; m++) {
            if (g_maps[m].live && g_maps[m].reservation == i) {
                g_maps[m].live = 0;
                drop_physical(g_maps[m].physical, 1);
            }
        }
        munmap((void *)(uintptr_t)g_res[i].addr, (size_t)g_res[i].size);
        free(g_res[i].pages);
        g_res[i].pages = NULL;
        g_res[i].live = 0;
        g_res[i].generation++;
        g_res_live--;
    }
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
    }
    return st;
}

/* Records a new physical object of `size` bytes backed by `fd` (taken
 * over: closed on failure) and writes its block. */
static MemplugStatus add_physical(int fd, uint64_t size, uint64_t object_id, MemplugBlock *out,
                                  const MemplugMessageSink *sink)
{
    uint32_t i;
    pthread_mutex_lock(&g_lock);
    for (i = 0; i < BAD_MAX_PHYSICAL && g_phys[i].live; i++) {
        /* find a free slot */
    }
    if (i == BAD_MAX_PHYSICAL) {
        pthread_mutex_unlock(&g_lock);
        close(fd);
        say(sink, "bad_plugin: too many physical objects");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    g_phys[i].live = 1;
    g_phys[i].object_id = object_id;
    g_phys[i].size = size;
    g_phys[i].host_refs = 1;
    g_phys[i].mapping_refs = 0;
    g_phys[i].fd = fd;
    g_phys_live++;
    write_block(out, 0, size, make_handle(g_phys[i].generation, BAD_KIND_PHYSICAL, i));
    pthread_mutex_unlock(&g_lock);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus bad_create(void *ctx, const MemplugRequest *request, MemplugBlock *out,
                                const MemplugMessageSink *sink)
{
    MemplugRequest r;
    const char *why = NULL;
    uint64_t size;
    int fd;
    MemplugStatus st = check_request(request, out, &r, &why);

    (void)ctx;
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
        return st;
    }
    size = rounded(r.size);
    if (size == 0) {
        say(sink, "bad_plugin: create: too large");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    fd = memfd_create("memplug-bad-plugin", MFD_CLOEXEC);
    if (fd < 0) {
        say(sink, "bad_plugin: create: memfd_create failed");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        say(sink, "bad_plugin: create: ftruncate failed");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    return add_physical(fd, size, r.object_id, out, sink);
}

#ifdef BAD_EXPORTS
/* ABI 1.1: a new descriptor of the object's memfd (correct apart from the
 * variant's one misbehaviour). */
static MemplugStatus bad_export_fd(void *ctx, const MemplugObjectRef *object, int32_t *out_fd,
                                   const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t i;
    int fd = -1;
    MemplugStatus st;

    (void)ctx;
    if (out_fd == NULL) {
        say(sink, "bad_plugin: export_fd: out_fd is NULL");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&g_lock);
    st = find_physical(object, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        fd = fcntl(g_phys[i].fd, F_DUPFD_CLOEXEC, 3);
        if (fd < 0) {
            why = "bad_plugin: export_fd: cannot duplicate the memfd";
            st = MEMPLUG_STATUS_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
        return st;
    }
#if defined(BAD_EXPORT_FD_STDIN)
    /* The host's standard input, as if it were new. */
    close(fd);
    *out_fd = 0;
#elif defined(BAD_EXPORT_FD_CLOSED)
    /* A number it has just closed. */
    close(fd);
    *out_fd = fd;
#elif defined(BAD_EXPORT_FD_PIPE)
    {
        /* A pipe, which carries no memory. */
        int p[2];
        close(fd);
        if (pipe2(p, O_CLOEXEC) != 0) {
            say(sink, "bad_plugin: export_fd: pipe failed");
            return MEMPLUG_STATUS_INTERNAL;
        }
        close(p[1]);
        *out_fd = p[0];
    }
#elif defined(BAD_EXPORT_NOT_MEMFD)
    {
        /* Odd calls: a regular file that is not memory, opened anew. Even
         * calls: the duplicate made by the call before, which was open
         * before this call (not a new descriptor). */
        static int g_previous = -1;
        static unsigned g_calls;
        pthread_mutex_lock(&g_lock);
        g_calls++;
        if (g_calls % 2 == 1) {
            g_previous = fd;
            fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
        } else {
            close(fd);
            fd = g_previous;
            g_previous = -1;
        }
        pthread_mutex_unlock(&g_lock);
        if (fd < 0) {
            say(sink, "bad_plugin: export_fd: open failed");
            return MEMPLUG_STATUS_INTERNAL;
        }
        *out_fd = fd;
    }
#else
    *out_fd = fd;
#endif
    return MEMPLUG_STATUS_OK;
}

/* ABI 1.1: a physical object over the memory `fd` names; keeps a
 * duplicate. */
static MemplugStatus bad_import_fd(void *ctx, int32_t fd, const MemplugRequest *request, MemplugBlock *out,
                                   const MemplugMessageSink *sink)
{
    MemplugRequest r;
    const char *why = NULL;
    struct stat st_buf;
    uint64_t size;
    int kept;
    MemplugStatus st = check_request(request, out, &r, &why);

    (void)ctx;
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
        return st;
    }
    size = rounded(r.size);
    if (size == 0 || fstat(fd, &st_buf) != 0 || st_buf.st_size < 0 || (uint64_t)st_buf.st_size < size) {
        say(sink, "bad_plugin: import_fd: the descriptor is unusable or smaller than asked");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    kept = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (kept < 0) {
        say(sink, "bad_plugin: import_fd: cannot duplicate the descriptor");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
#ifdef BAD_IMPORT_CLOSES_FD
    /* Closes the caller's descriptor (it should only have duplicated it). */
    close(fd);
#endif
    return add_physical(kept, size, r.object_id, out, sink);
}
#define BAD_EXPORT_FD bad_export_fd
#define BAD_IMPORT_FD bad_import_fd
#else
#define BAD_EXPORT_FD NULL
#define BAD_IMPORT_FD NULL
#endif

static MemplugStatus bad_map(void *ctx, const MemplugObjectRef *object, uint64_t object_offset,
                             const MemplugObjectRef *reservation, uint64_t offset, uint64_t len, uint32_t access,
                             const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t pi;
    uint32_t ri;
    uint32_t m;
    int prot;
    void *at;
    MemplugStatus st;

    (void)ctx;
#ifdef BAD_UNKNOWN_ACCESS
    /* Unknown bits are dropped, no access at all is read. */
    access &= MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE;
    access |= MEMPLUG_ACCESS_READ;
#else
    if (access != MEMPLUG_ACCESS_READ && access != (MEMPLUG_ACCESS_READ | MEMPLUG_ACCESS_WRITE)) {
        say(sink, "bad_plugin: map: access must be READ or READ|WRITE");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
#endif
    pthread_mutex_lock(&g_lock);
    st = find_physical(object, &pi, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = find_reservation(reservation, &ri, &why);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(object_offset, len, g_phys[pi].size, &why);
    }
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(offset, len, g_res[ri].size, &why);
    }
    if (st != MEMPLUG_STATUS_OK) {
        goto out;
    }
    if (!pages_are(&g_res[ri], offset, len, BAD_PAGE_FREE)) {
        why = "bad_plugin: map: part of the range is committed or mapped";
        st = MEMPLUG_STATUS_INVALID_STATE;
        goto out;
    }
    for (m = 0; m < BAD_MAX_MAPPINGS && g_maps[m].live; m++) {
        /* find a free slot */
    }
    if (m == BAD_MAX_MAPPINGS) {
        why = "bad_plugin: map: too many mappings";
        st = MEMPLUG_STATUS_OUT_OF_MEMORY;
        goto out;
    }
    prot = PROT_READ | ((access & MEMPLUG_ACCESS_WRITE) ? PROT_WRITE : 0);
#ifdef BAD_READ_ONLY_WRITABLE
    prot = PROT_READ | PROT_WRITE;
#endif
    at = mmap((void *)(uintptr_t)(g_res[ri].addr + offset), (size_t)len, prot, MAP_SHARED | MAP_FIXED,
              g_phys[pi].fd, (off_t)object_offset);
    if (at == MAP_FAILED) {
        why = "bad_plugin: map: mmap failed";
        st = MEMPLUG_STATUS_OUT_OF_MEMORY;
        goto out;
    }
    set_pages(&g_res[ri], offset, len, BAD_PAGE_MAPPED);
    g_maps[m].live = 1;
    g_maps[m].reservation = ri;
    g_maps[m].physical = pi;
    g_maps[m].offset = offset;
    g_maps[m].len = len;
    g_phys[pi].mapping_refs++;
out:
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
    }
    return st;
}

static MemplugStatus bad_unmap(void *ctx, const MemplugObjectRef *reservation, uint64_t offset, uint64_t len,
                               const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t ri;
    uint32_t m;
    void *at;
    MemplugStatus st;

    (void)ctx;
    pthread_mutex_lock(&g_lock);
    st = find_reservation(reservation, &ri, &why);
    if (st == MEMPLUG_STATUS_OK) {
        st = check_range(offset, len, g_res[ri].size, &why);
    }
    if (st != MEMPLUG_STATUS_OK) {
        goto out;
    }
    for (m = 0; m < BAD_MAX_MAPPINGS; m++) {
        if (g_maps[m].live && g_maps[m].reservation == ri && g_maps[m].offset == offset &&
            g_maps[m].len == len) {
            break;
        }
    }
    if (m == BAD_MAX_MAPPINGS) {
        why = "bad_plugin: unmap: no mapping is exactly that range";
        st = MEMPLUG_STATUS_INVALID_STATE;
        goto out;
    }
    at = mmap((void *)(uintptr_t)(g_res[ri].addr + offset), (size_t)len, PROT_NONE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED) {
        why = "bad_plugin: unmap: mmap failed";
        st = MEMPLUG_STATUS_INTERNAL;
        goto out;
    }
    set_pages(&g_res[ri], offset, len, BAD_PAGE_FREE);
    g_maps[m].live = 0;
    drop_physical(g_maps[m].physical, 1);
out:
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
    }
    return st;
}

static MemplugStatus bad_retain(void *ctx, const MemplugObjectRef *object, const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t i;
    MemplugStatus st;

    (void)ctx;
    pthread_mutex_lock(&g_lock);
    st = find_physical(object, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        g_phys[i].host_refs++;
    }
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
    }
    return st;
}

static MemplugStatus bad_release_object(void *ctx, const MemplugObjectRef *object,
                                        const MemplugMessageSink *sink)
{
    const char *why = NULL;
    uint32_t i;
    MemplugStatus st;

    (void)ctx;
    pthread_mutex_lock(&g_lock);
    st = find_physical(object, &i, &why);
    if (st == MEMPLUG_STATUS_OK) {
        drop_physical(i, 0);
    }
    pthread_mutex_unlock(&g_lock);
    if (st != MEMPLUG_STATUS_OK) {
        say(sink, why);
    }
    return st;
}

/* ---- [full] sync: one worker thread per stream --------------------------- */

#define BAD_MAX_STREAMS 32u
#define BAD_MAX_FENCES 256u
#define BAD_STREAM_FREE 0
#define BAD_STREAM_LIVE 1
#define BAD_STREAM_CLOSING 2

struct bad_job {
    MemplugHostFn func;
    void *userdata;
    struct bad_job *next;
};

struct bad_stream {
    int state;
    uint32_t generation;
    pthread_t thread;
    struct bad_job *head;
    struct bad_job *tail;
    /* BAD_HOST_FN_LATE: functions whose enqueue was refused, kept to be
     * run when the stream is destroyed. */
    struct bad_job *limbo;
    uint64_t submitted;
    uint64_t completed;
};

struct bad_fence {
    int live;
    uint32_t generation;
    uint32_t stream;
    uint32_t stream_generation;
    uint64_t target;
    int done;
};

/* Guards streams and fences; every change is broadcast on g_sync_cv. */
static pthread_mutex_t g_sync_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_sync_cv = PTHREAD_COND_INITIALIZER;
static struct bad_stream g_streams[BAD_MAX_STREAMS];
static struct bad_fence g_fences[BAD_MAX_FENCES];
static uint64_t g_streams_live;
static uint64_t g_fences_live;

static void *bad_worker(void *arg)
{
    struct bad_stream *s = &g_streams[(uintptr_t)arg];
    struct bad_job *job;

    pthread_mutex_lock(&g_sync_lock);
    for (;;) {
        while (s->head == NULL && s->state == BAD_STREAM_LIVE) {
            pthread_cond_wait(&g_sync_cv, &g_sync_lock);
        }
        if (s->head == NULL) {
            break; /* closing, and nothing left */
        }
        job = s->head;
        s->head = job->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        pthread_mutex_unlock(&g_sync_lock);
        job->func(job->userdata);
#ifdef BAD_HOST_FN_TWICE
        /* Once more, as if the first run had not happened. */
        job->func(job->userdata);
#endif
        free(job);
        pthread_mutex_lock(&g_sync_lock);
        s->completed++;
        pthread_cond_broadcast(&g_sync_cv);
    }
    pthread_mutex_unlock(&g_sync_lock);
    return NULL;
}

/* Under g_sync_lock: the live stream `handle` names, or BAD_MAX_STREAMS. */
static uint32_t find_stream(uint64_t handle)
{
    uint32_t i = handle_index(handle, BAD_KIND_STREAM, BAD_MAX_STREAMS);
    if (i == BAD_MAX_STREAMS || g_streams[i].state != BAD_STREAM_LIVE ||
        g_streams[i].generation != (uint32_t)(handle >> 32)) {
        return BAD_MAX_STREAMS;
    }
    return i;
}

/* Under g_sync_lock: the live fence `handle` names, or BAD_MAX_FENCES. */
static uint32_t find_fence(uint64_t handle)
{
    uint32_t i = handle_index(handle, BAD_KIND_FENCE, BAD_MAX_FENCES);
    if (i == BAD_MAX_FENCES || !g_fences[i].live || g_fences[i].generation != (uint32_t)(handle >> 32)) {
        return BAD_MAX_FENCES;
    }
    return i;
}

/* Under g_sync_lock: whether fence `i` has completed. */
BAD_MAYBE_UNUSED static int fence_done(uint32_t i)
{
    struct bad_fence *f = &g_fences[i];
    struct bad_stream *s = &g_streams[f->stream];
    if (!f->done && s->state != BAD_STREAM_FREE && s->generation == f->stream_generation &&
        s->completed >= f->target) {
        f->done = 1;
    }
    return f->done;
}

static MemplugStatus bad_stream_create(void *ctx, uint64_t *out_stream, const MemplugMessageSink *sink)
{
    uint32_t i;

    (void)ctx;
    if (out_stream == NULL) {
        say(sink, "bad_plugin: stream_create: out_stream is NULL");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&g_sync_lock);
    for (i = 0; i < BAD_MAX_STREAMS && g_streams[i].state != BAD_STREAM_FREE; i++) {
        /* find a free slot */
    }
    if (i == BAD_MAX_STREAMS) {
        pthread_mutex_unlock(&g_sync_lock);
        say(sink, "bad_plugin: stream_create: too many streams");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    g_streams[i].state = BAD_STREAM_LIVE;
    g_streams[i].head = NULL;
    g_streams[i].tail = NULL;
    g_streams[i].limbo = NULL;
    g_streams[i].submitted = 0;
    g_streams[i].completed = 0;
    if (pthread_create(&g_streams[i].thread, NULL, bad_worker, (void *)(uintptr_t)i) != 0) {
        g_streams[i].state = BAD_STREAM_FREE;
        pthread_mutex_unlock(&g_sync_lock);
        say(sink, "bad_plugin: stream_create: cannot start a thread");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    g_streams_live++;
    *out_stream = make_handle(g_streams[i].generation, BAD_KIND_STREAM, i);
    pthread_mutex_unlock(&g_sync_lock);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus bad_stream_destroy(void *ctx, uint64_t stream, const MemplugMessageSink *sink)
{
    uint32_t i;
    uint32_t f;
    pthread_t thread;

    (void)ctx;
    pthread_mutex_lock(&g_sync_lock);
    i = find_stream(stream);
    if (i == BAD_MAX_STREAMS) {
        pthread_mutex_unlock(&g_sync_lock);
        say(sink, "bad_plugin: stream_destroy: no such stream");
        return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
    }
    /* Refused functions it kept (BAD_HOST_FN_LATE): run by the worker now,
     * long after their enqueue failed. */
    while (g_streams[i].limbo != NULL) {
        struct bad_job *late = g_streams[i].limbo;
        g_streams[i].limbo = late->next;
        late->next = NULL;
        if (g_streams[i].tail != NULL) {
            g_streams[i].tail->next = late;
        } else {
            g_streams[i].head = late;
        }
        g_streams[i].tail = late;
        g_streams[i].submitted++;
    }
    g_streams[i].state = BAD_STREAM_CLOSING;
    thread = g_streams[i].thread;
    pthread_cond_broadcast(&g_sync_cv);
    pthread_mutex_unlock(&g_sync_lock);
    /* The worker runs what was submitted, then leaves. */
    pthread_join(thread, NULL);
    pthread_mutex_lock(&g_sync_lock);
    for (f = 0; f < BAD_MAX_FENCES; f++) {
        if (g_fences[f].live && g_fences[f].stream == i && g_fences[f].stream_generation == g_streams[i].generation) {
            g_fences[f].done = 1;
        }
    }
    g_streams[i].state = BAD_STREAM_FREE;
    g_streams[i].generation++;
    g_streams_live--;
    pthread_cond_broadcast(&g_sync_cv);
    pthread_mutex_unlock(&g_sync_lock);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus bad_enqueue(void *ctx, uint64_t stream, MemplugHostFn func, void *userdata,
                                 const MemplugMessageSink *sink)
{
    uint32_t i;
    struct bad_job *job;

    (void)ctx;
    if (func == NULL) {
        say(sink, "bad_plugin: enqueue_host_fn: func is NULL");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
#ifdef BAD_HOST_FN_REFUSED_RUNS
    /* Runs the function here and now, then reports failure. */
    (void)stream;
    (void)job;
    (void)i;
    func(userdata);
    say(sink, "bad_plugin: enqueue_host_fn: refused (after running the function)");
    return MEMPLUG_STATUS_INTERNAL;
#else
    job = (struct bad_job *)malloc(sizeof *job);
    if (job == NULL) {
        say(sink, "bad_plugin: enqueue_host_fn: out of memory");
        return MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    job->func = func;
    job->userdata = userdata;
    job->next = NULL;
    pthread_mutex_lock(&g_sync_lock);
    i = find_stream(stream);
    if (i == BAD_MAX_STREAMS) {
        pthread_mutex_unlock(&g_sync_lock);
        free(job);
        say(sink, "bad_plugin: enqueue_host_fn: no such stream");
        return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
    }
#ifdef BAD_HOST_FN_LATE
    /* Refuses, and keeps the function anyway. */
    job->next = g_streams[i].limbo;
    g_streams[i].limbo = job;
    pthread_mutex_unlock(&g_sync_lock);
    say(sink, "bad_plugin: enqueue_host_fn: refused (the function is kept for later)");
    return MEMPLUG_STATUS_INTERNAL;
#else
    if (g_streams[i].tail != NULL) {
        g_streams[i].tail->next = job;
    } else {
        g_streams[i].head = job;
    }
    g_streams[i].tail = job;
    g_streams[i].submitted++;
    pthread_cond_broadcast(&g_sync_cv);
    pthread_mutex_unlock(&g_sync_lock);
    return MEMPLUG_STATUS_OK;
#endif
#endif
}

static MemplugStatus bad_fence_record(void *ctx, uint64_t stream, uint64_t *out_fence,
                                      const MemplugMessageSink *sink)
{
    uint32_t i;
    uint32_t f;

    (void)ctx;
    if (out_fence == NULL) {
        say(sink, "bad_plugin: fence_record: out_fence is NULL");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    pthread_mutex_lock(&g_sync_lock);
    i = find_stream(stream);
    for (f = 0; f < BAD_MAX_FENCES && g_fences[f].live; f++) {
        /* find a free slot */
    }
    if (i == BAD_MAX_STREAMS || f == BAD_MAX_FENCES) {
        pthread_mutex_unlock(&g_sync_lock);
        say(sink, i == BAD_MAX_STREAMS ? "bad_plugin: fence_record: no such stream"
                                       : "bad_plugin: fence_record: too many fences");
        return i == BAD_MAX_STREAMS ? MEMPLUG_STATUS_UNKNOWN_ALLOCATION : MEMPLUG_STATUS_OUT_OF_MEMORY;
    }
    g_fences[f].live = 1;
    g_fences[f].stream = i;
    g_fences[f].stream_generation = g_streams[i].generation;
    g_fences[f].target = g_streams[i].submitted;
    g_fences[f].done = g_streams[i].completed >= g_streams[i].submitted;
    g_fences_live++;
    *out_fence = make_handle(g_fences[f].generation, BAD_KIND_FENCE, f);
    pthread_mutex_unlock(&g_sync_lock);
    return MEMPLUG_STATUS_OK;
}

static MemplugStatus bad_fence_query(void *ctx, uint64_t fence, const MemplugMessageSink *sink)
{
#ifdef BAD_FORGED_FENCE
    /* Every fence, recorded or not, done or not, is "complete". */
    (void)ctx;
    (void)fence;
    (void)sink;
    return MEMPLUG_STATUS_OK;
#else
    uint32_t f;
    int done;

    (void)ctx;
    pthread_mutex_lock(&g_sync_lock);
    f = find_fence(fence);
    done = f != BAD_MAX_FENCES && fence_done(f);
    pthread_mutex_unlock(&g_sync_lock);
    if (f == BAD_MAX_FENCES) {
        say(sink, "bad_plugin: fence_query: no such fence");
        return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
    }
#ifdef BAD_FENCE_NEVER
    (void)done;
    return MEMPLUG_STATUS_NOT_READY;
#else
    return done ? MEMPLUG_STATUS_OK : MEMPLUG_STATUS_NOT_READY;
#endif
#endif
}

static MemplugStatus bad_fence_wait(void *ctx, uint64_t fence, uint64_t timeout_ns,
                                    const MemplugMessageSink *sink)
{
#ifdef BAD_FORGED_FENCE
    (void)ctx;
    (void)fence;
    (void)timeout_ns;
    (void)sink;
    return MEMPLUG_STATUS_OK;
#else
    uint64_t ns;
    uint32_t f;

    (void)ctx;
    /* At most a day: a longer wait is as good as forever here. */
    ns = timeout_ns < (uint64_t)86400 * 1000000000u ? timeout_ns : (uint64_t)86400 * 1000000000u;
    pthread_mutex_lock(&g_sync_lock);
    f = find_fence(fence);
    if (f == BAD_MAX_FENCES) {
        pthread_mutex_unlock(&g_sync_lock);
        say(sink, "bad_plugin: fence_wait: no such fence");
        return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
    }
#ifdef BAD_FENCE_NEVER
    {
        /* Never completes: sleeps the whole timeout (at most 5 s). */
        struct timespec nap;
        uint64_t sleep_ns = ns < (uint64_t)5000000000u ? ns : (uint64_t)5000000000u;
        pthread_mutex_unlock(&g_sync_lock);
        nap.tv_sec = (time_t)(sleep_ns / 1000000000u);
        nap.tv_nsec = (long)(sleep_ns % 1000000000u);
        while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
            /* keep sleeping */
        }
        return MEMPLUG_STATUS_TIMEOUT;
    }
#else
    {
        struct timespec deadline;
        int done = 0;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += (time_t)(ns / 1000000000u);
        deadline.tv_nsec += (long)(ns % 1000000000u);
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
        for (;;) {
            f = find_fence(fence);
            if (f == BAD_MAX_FENCES) {
                break; /* destroyed while waited on */
            }
            done = fence_done(f);
            if (done || pthread_cond_timedwait(&g_sync_cv, &g_sync_lock, &deadline) == ETIMEDOUT) {
                done = done || fence_done(f);
                break;
            }
        }
        pthread_mutex_unlock(&g_sync_lock);
        if (f == BAD_MAX_FENCES) {
            say(sink, "bad_plugin: fence_wait: the fence was destroyed while waited on");
            return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
        }
        return done ? MEMPLUG_STATUS_OK : MEMPLUG_STATUS_TIMEOUT;
    }
#endif
#endif
}

static MemplugStatus bad_fence_destroy(void *ctx, uint64_t fence, const MemplugMessageSink *sink)
{
    uint32_t f;

    (void)ctx;
    pthread_mutex_lock(&g_sync_lock);
    f = find_fence(fence);
    if (f != BAD_MAX_FENCES) {
        g_fences[f].live = 0;
        g_fences[f].generation++;
        g_fences_live--;
    }
    pthread_mutex_unlock(&g_sync_lock);
    if (f == BAD_MAX_FENCES) {
        say(sink, "bad_plugin: fence_destroy: no such fence");
        return MEMPLUG_STATUS_UNKNOWN_ALLOCATION;
    }
    return MEMPLUG_STATUS_OK;
}

static const MemplugVirtualBacking g_virtual_backing = {
    .struct_size = sizeof(MemplugVirtualBacking),
    .reserve = bad_reserve,
    .commit = bad_commit,
    .decommit = bad_decommit,
    .committed_bytes = bad_committed_bytes,
    .release = bad_release_reservation,
};

static const MemplugSharedMapping g_shared_mapping = {
    .struct_size = sizeof(MemplugSharedMapping),
    .create = bad_create,
    .map = bad_map,
    .unmap = bad_unmap,
    .retain = bad_retain,
    .release = bad_release_object,
    .export_fd = BAD_EXPORT_FD,
    .import_fd = BAD_IMPORT_FD,
};

static const MemplugSync g_full_sync = {
    .struct_size = sizeof(MemplugSync),
    .stream_create = bad_stream_create,
    .stream_adopt = NULL,
    .stream_destroy = bad_stream_destroy,
    .enqueue_host_fn = bad_enqueue,
    .fence_record = bad_fence_record,
    .fence_query = bad_fence_query,
    .fence_wait = bad_fence_wait,
    .fence_destroy = bad_fence_destroy,
};
#endif /* BAD_FULL */

static uint64_t bad_live_objects(void *ctx)
{
    uint64_t n;
    (void)ctx;
#if defined(BAD_LIVE_FOREVER)
    n = 3;
#elif defined(BAD_LIVE_ZERO)
    n = 0;
#else
    pthread_mutex_lock(&g_lock);
    n = g_live;
#ifdef BAD_DOUBLE_FREE_WITNESS
    /* Each second free is a ghost no host can release. */
    n += g_second_frees;
#endif
#ifdef BAD_FULL
    n += g_res_live + g_phys_live;
#endif
    pthread_mutex_unlock(&g_lock);
#ifdef BAD_FULL
    pthread_mutex_lock(&g_sync_lock);
    n += g_streams_live + g_fences_live;
    pthread_mutex_unlock(&g_sync_lock);
#endif
#endif
    return n;
}

/* ---- descriptors -------------------------------------------------------- */

/* BAD_LONG_STRUCTS: each descriptor sits in a larger struct whose tail is
 * garbage, and declares the larger size. */
#ifdef BAD_LONG_STRUCTS
#define BAD_TAIL "garbage after the ABI 1.0 prefix: a 1.0 reader never looks here!"
#else
#define BAD_TAIL ""
#endif

struct bad_allocator_storage {
    MemplugAllocator a;
    char tail[sizeof BAD_TAIL];
};

struct bad_mechanism_storage {
    MemplugMechanism m;
    char tail[sizeof BAD_TAIL];
};

struct bad_plugin_storage {
    MemplugPlugin p;
    char tail[sizeof BAD_TAIL];
};

/* Otherwise each descriptor says the size of the minor the plugin speaks
 * (1.0, or 1.1 for the BAD_EXPORTS variants: the same sizes for these
 * three), not sizeof: the current header's structs grow with every minor
 * (MemplugMechanism grew `identity` in 1.2), and a plugin that speaks 1.0
 * publishes 1.0 descriptors however new the header it is built with. */
#ifdef BAD_LONG_STRUCTS
#define BAD_STRUCT_SIZE(storage, size_1_0) ((uint32_t)sizeof(storage))
#else
#define BAD_STRUCT_SIZE(storage, size_1_0) ((uint32_t)(size_1_0))
#endif

#ifdef BAD_LONG_STRUCTS
/* Garbage where the 1.2 `identity` pointer lies, just past the 1.0 prefix
 * of the mechanism: readable bytes that are no identity a plugin would
 * publish (every `valid` bit set, a struct_size of 0xffffffff). A host
 * that agreed on 1.0 never reads the field; one that did would report an
 * identity this plugin never gave. */
static const struct {
    uint32_t words[sizeof(MemplugDeviceIdentity) / 4];
} g_garbage_identity = {{0xffffffffu, 0xffffffffu, 0x62726167u, 0x21656761u, 0x62726167u, 0x21656761u}};
#define BAD_IDENTITY ((const MemplugDeviceIdentity *)(const void *)&g_garbage_identity)
#else
#define BAD_IDENTITY NULL
#endif

static const struct bad_allocator_storage g_allocator = {
    .a =
        {
#ifdef BAD_SHORT_ALLOCATOR
            .struct_size = 12,
#else
            .struct_size = BAD_STRUCT_SIZE(struct bad_allocator_storage, MEMPLUG_ALLOCATOR_SIZE_1_0),
#endif
            .properties = bad_properties,
#ifdef BAD_NULL_ALLOCATE
            .allocate = NULL,
#else
            .allocate = bad_allocate,
#endif
            .deallocate = bad_deallocate,
            .memory_info = NULL,
        },
    .tail = BAD_TAIL,
};

#ifdef BAD_POINTER_WITHOUT_FLAG
/* A sync vtable published without MEMPLUG_CAP_SYNC. Its slots are never
 * called by a correct host, which refuses the plugin first. */
static const MemplugSync g_sync = {.struct_size = sizeof(MemplugSync)};
#define BAD_SYNC (&g_sync)
#elif defined(BAD_FULL)
#define BAD_SYNC (&g_full_sync)
#else
#define BAD_SYNC NULL
#endif

#ifdef BAD_FULL
#define BAD_BASE_CAPS                                                                                  \
    (MEMPLUG_CAP_ALLOCATOR | MEMPLUG_CAP_VIRTUAL_BACKING | MEMPLUG_CAP_SHARED_MAPPING | MEMPLUG_CAP_SYNC)
#define BAD_VIRTUAL_BACKING (&g_virtual_backing)
#define BAD_SHARED_MAPPING (&g_shared_mapping)
#else
#define BAD_BASE_CAPS MEMPLUG_CAP_ALLOCATOR
#define BAD_VIRTUAL_BACKING NULL
#define BAD_SHARED_MAPPING NULL
#endif

#if defined(BAD_FLAG_WITHOUT_POINTER)
#define BAD_CAPS (BAD_BASE_CAPS | MEMPLUG_CAP_VIRTUAL_BACKING)
#elif defined(BAD_UNKNOWN_CAPS)
#define BAD_CAPS (BAD_BASE_CAPS | 0x80000000u)
#elif defined(BAD_EXPORTS)
#define BAD_CAPS (BAD_BASE_CAPS | MEMPLUG_CAP_SHARED_EXPORT)
#elif defined(BAD_CAPS_ABOVE_MINOR)
/* Bit 4, MEMPLUG_CAP_SHARED_EXPORT: defined by ABI 1.1, which this plugin
 * does not speak (and it has no shared mapping either). */
#define BAD_CAPS (BAD_BASE_CAPS | (1u << 4))
#else
#define BAD_CAPS BAD_BASE_CAPS
#endif

static const struct bad_mechanism_storage g_mechanism = {
    .m =
        {
#ifdef BAD_SHORT_MECHANISM
            .struct_size = 8,
#else
            .struct_size = BAD_STRUCT_SIZE(struct bad_mechanism_storage, MEMPLUG_MECHANISM_SIZE_1_0),
#endif
            .capabilities = BAD_CAPS,
            .mechanism_id = BAD_MECHANISM_ID,
#if defined(BAD_NULL_NAME)
            .name = NULL,
#elif defined(BAD_ESCAPES_IN_NAMES)
            /* ESC [1m (bold), a line feed, DEL. */
            .name = "bad-\x1b[1mplugin\n\x7f",
#else
            .name = "bad-plugin",
#endif
            .device = {.kind = BAD_DEVICE_KIND, .ordinal = 0},
            .ctx = NULL,
#ifdef BAD_NULL_ALLOCATOR
            .allocator = NULL,
#else
            .allocator = &g_allocator.a,
#endif
            .virtual_backing = BAD_VIRTUAL_BACKING,
            .shared_mapping = BAD_SHARED_MAPPING,
            .sync = BAD_SYNC,
            .identity = BAD_IDENTITY,
        },
    .tail = BAD_TAIL,
};

#if defined(BAD_DUPLICATE_ID) || defined(BAD_DUPLICATE_NAME)
/* BAD_DUPLICATE_ID: same id as g_mechanism, another name.
 * BAD_DUPLICATE_NAME: another id, the same name. */
static const MemplugMechanism g_twin = {
    .struct_size = sizeof(MemplugMechanism),
    .capabilities = MEMPLUG_CAP_ALLOCATOR,
#ifdef BAD_DUPLICATE_ID
    .mechanism_id = BAD_MECHANISM_ID,
    .name = "bad-plugin-twin",
#else
    .mechanism_id = BAD_MECHANISM_ID + 1u,
    .name = "bad-plugin",
#endif
    .device = {.kind = BAD_DEVICE_KIND, .ordinal = 0},
    .allocator = &g_allocator.a,
};
static const MemplugMechanism *const g_mechanisms[] = {&g_mechanism.m, &g_twin};
#else
static const MemplugMechanism *const g_mechanisms[] = {&g_mechanism.m};
#endif

static const struct bad_plugin_storage g_plugin = {
    .p =
        {
#ifdef BAD_SHORT_PLUGIN
            .struct_size = 16,
#else
            .struct_size = BAD_STRUCT_SIZE(struct bad_plugin_storage, MEMPLUG_PLUGIN_SIZE_1_0),
#endif
#ifdef BAD_WRONG_MAJOR
            .abi_major = 2,
#else
            .abi_major = 1,
#endif
            .min_minor = BAD_MINOR,
            .max_minor = BAD_MINOR,
#ifdef BAD_ESCAPES_IN_NAMES
            /* Clear screen, set the terminal title (OSC ... BEL), a carriage
             * return over the line; red, a C1 CSI (U+009B) and a
             * right-to-left override (U+202E). */
            .name = "memplug-bad-\x1b[2J\x1b]0;owned\x07plugin\r",
            .version = "0.0.0\x1b[31m\xc2\x9b\xe2\x80\xae",
#else
            .name = "memplug-bad-plugin",
            .version = "0.0.0",
#endif
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
        },
    .tail = BAD_TAIL,
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

#ifdef BAD_NEGOTIATE_LAX
    /* Reads a whole host info and writes a whole answer whatever sizes they
     * declare, checks no version, agrees on 1.0. */
    (void)declared;
    if (host == NULL || out == NULL) {
        say(sink, "bad_plugin: host info or out negotiation is NULL");
        return MEMPLUG_STATUS_INVALID_ARGUMENT;
    }
    memcpy(&h, host, sizeof h);
    (void)h;
    memset(&answer, 0, sizeof answer);
    answer.agreed_minor = 0;
    answer.plugin = &g_plugin.p;
    memcpy((unsigned char *)out + 4, (unsigned char *)&answer + 4, sizeof answer - 4);
    return MEMPLUG_STATUS_OK;
#else
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
    /* This file implements ABI 1.0 exactly, or (BAD_EXPORTS) 1.1 exactly. */
    if (h.abi_major != 1 || h.min_minor > h.max_minor || h.min_minor > BAD_MINOR) {
        say(sink, "bad_plugin: no common ABI version with the host");
        return MEMPLUG_STATUS_VERSION_MISMATCH;
    }
#ifdef BAD_EXPORTS
    if (h.max_minor < 1) {
        say(sink, "bad_plugin: this variant speaks only ABI 1.1");
        return MEMPLUG_STATUS_VERSION_MISMATCH;
    }
#endif
#ifdef BAD_AGREED_MINOR
    answer.agreed_minor = 7;
#else
    answer.agreed_minor = BAD_MINOR; /* the one minor both speak */
#endif
#ifdef BAD_NULL_PLUGIN
    answer.plugin = NULL;
#else
    answer.plugin = &g_plugin.p;
#endif
    memcpy((unsigned char *)out + 4, (unsigned char *)&answer + 4, MEMPLUG_NEGOTIATION_SIZE_1_0 - 4);
    return MEMPLUG_STATUS_OK;
#endif
#endif
}
