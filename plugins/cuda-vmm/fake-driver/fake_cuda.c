/*
 * fake_cuda.c -- a FAKE CUDA driver library, for tests only.
 *
 * THIS IS NOT NVIDIA'S DRIVER. It implements, on host memory, the few
 * driver-API entry points the memplug CUDA VMM plugin calls, with the rules
 * of the real driver that the plugin depends on, so the plugin can be
 * tested on machines without a GPU. Tests build it with
 *
 *     gcc -std=gnu11 -shared -fPIC -pthread -Wl,-soname,libcuda.so.1 \
 *         fake_cuda.c -o libcuda.so.1
 *
 * (the fake_cuda_*.inc files beside it are parts of this one translation
 * unit, included at its end) and point the plugin at it with
 * MEMPLUG_CUDA_DRIVER=/path/libcuda.so.1
 * (or put it first on LD_LIBRARY_PATH, where cudarc's loader finds it).
 *
 * The model:
 *   - devices: MEMPLUG_FAKE_CUDA_DEVICES (default 1), each with a fixed
 *     capacity of MEMPLUG_FAKE_CUDA_MEM_MIB MiB (default 1024) that
 *     cuMemGetInfo reports, dropping as physical memory is created
 *     (cuMemAlloc, cuMemCreate) and rising as it is freed;
 *   - fresh physical memory holds a pattern (0xa5), not zeros;
 *   - granularity 2 MiB; cuMemAddressReserve = mmap(PROT_NONE);
 *     cuMemCreate = a memfd; cuMemMap = mmap(MAP_SHARED|MAP_FIXED) with no
 *     access; cuMemSetAccess = mprotect; cuMemUnmap puts PROT_NONE back;
 *     physical memory goes when it is both released and unmapped;
 *   - primary contexts are reference counted (retain and release calls are
 *     counted too: fake_cuda_primary_ctx_calls); a live context takes
 *     MEMPLUG_FAKE_CUDA_CTX_MIB (default 16) MiB off cuMemGetInfo's free; calls that need a current
 *     context check the calling thread's context stack; when the last
 *     reference goes the context is destroyed, and its streams, events and
 *     allocations with it (using them afterwards is
 *     CUDA_ERROR_CONTEXT_IS_DESTROYED, even once the context is retained
 *     anew, as the real driver then makes a new one);
 *   - a stream is a worker thread running host functions, memsets and
 *     event records in order; an event completes when the worker reaches
 *     the place it was recorded at;
 *   - shareable handles: a cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_
 *     DESCRIPTOR in requestedHandleTypes is a sealed memfd named
 *     "fake-cuda-shareable"; only such a handle exports
 *     (cuMemExportToShareableHandle: a dup the caller owns; any other is
 *     CUDA_ERROR_INVALID_VALUE), and cuMemImportFromShareableHandle takes
 *     only such a descriptor (from any process; else INVALID_VALUE) as a new
 *     handle of the same memory, counted once in cuMemGetInfo;
 *     cuMemGetAllocationPropertiesFromHandle answers; the device attribute
 *     HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED (103) is 1; cuMemMap of
 *     any handle only at offset 0 (see "shareable handles" below);
 *   - pinned host memory: cuMemHostAlloc (a current context needed, flags
 *     PORTABLE|DEVICEMAP|WRITECOMBINED only, size 0 refused) is real host
 *     memory the caller reads and writes directly, filled with the pattern,
 *     within MEMPLUG_FAKE_CUDA_HOST_MIB MiB (default 1024) in all, mapped
 *     for every device at its host address (unified addressing) and
 *     tracked; cuMemFreeHost of anything else (never allocated, already
 *     freed, inside a block) is CUDA_ERROR_INVALID_VALUE. A copy range that
 *     meets a pinned block must lie inside it (see copyable_locked);
 *   - CUDA's "API synchronization behavior": cuMemcpyAsync with pageable
 *     host memory returns when the copy is done; cuMemFree and
 *     cuMemFreeHost synchronise the device (sync_device);
 *   - peer access enforced for device work (accessible_locked); stream
 *     capture (see "stream capture"); cuPointerGetAttribute (memory type,
 *     device ordinal); the granularity depends on the properties (gran_of).
 *
 * Switches for tests: MEMPLUG_FAKE_CUDA_NO_READ_ONLY=1 (read at the first
 * cuInit) or fake_cuda_set_no_read_only(1) make cuMemSetAccess refuse
 * read-only access (CU_MEM_ACCESS_FLAGS_PROT_READ) with
 * CUDA_ERROR_NOT_SUPPORTED (801) and change nothing, as a driver or device
 * without read-only mappings may. fake_cuda_inject_sticky_fault(code)
 * kills device 0's context now: every later call made in it (but the
 * context-stack ones) returns that sticky code, as a real driver does after
 * an illegal address, while other devices' contexts keep working;
 * FAKE_CUDA_STICKY_FAULT_AFTER=N (read at the first cuInit) does the same
 * with 700 after N calls, and MEMPLUG_FAKE_CUDA_STICKY_CODE=C makes that
 * code C instead. MEMPLUG_FAKE_CUDA_NO_POSIX_FD=1 (read at the first cuInit)
 * takes POSIX-fd shareable handles away: attribute 103 is 0, and creating,
 * exporting or importing them is CUDA_ERROR_NOT_SUPPORTED.
 *
 * Variants for tests: -DFAKE_CUDA_OMIT_VMM leaves out the VMM entry points
 * (an old driver); -DFAKE_CUDA_OMIT_HOST_ALLOC leaves out cuMemHostAlloc and
 * cuMemFreeHost; -DFAKE_CUDA_OMIT_EVENT_QUERY leaves out cuEventQuery (a
 * broken one); -DFAKE_STUB makes cuInit answer CUDA_ERROR_STUB_LIBRARY (34),
 * as the CUDA toolkit's stub libcuda.so does. fake_cuda_* functions let tests look inside.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef unsigned int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct fake_ctx *CUcontext;
typedef struct fake_stream *CUstream;
typedef struct fake_event *CUevent;
typedef void (*CUhostFn)(void *);

typedef struct {
    unsigned int type;
    int id;
} CUmemLocation;

typedef struct {
    unsigned int type;
    unsigned int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
} CUmemAllocationProp;

typedef struct {
    CUmemLocation location;
    unsigned int flags;
} CUmemAccessDesc;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
    CUDA_ERROR_INVALID_PC = 718,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
};

#define GRAN (2ull << 20)
/* What fresh physical memory (cuMemCreate, cuMemAlloc) holds. */
#define FAKE_GARBAGE 0xa5
#define MAX_DEVICES 8
#define ATTR_VMM_SUPPORTED 102

/* ---- global state, all under g_lock ---- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized;
static int g_device_count = 1;
static unsigned long long g_capacity = 1024ull << 20;
static unsigned long long g_used[MAX_DEVICES];
/* Device memory a live context takes (MEMPLUG_FAKE_CUDA_CTX_MIB, default
 * 16), as a real context's own allocations do: cuMemGetInfo's free drops by
 * it while the device's primary context exists. */
static unsigned long long g_ctx_overhead = 16ull << 20;
/* cuDevicePrimaryCtxRetain / Release calls per device (context churn). */
static unsigned long g_retain_calls[MAX_DEVICES], g_release_calls[MAX_DEVICES];

struct fake_ctx {
    int device;
    int refs;
    unsigned long gen; /* bumped each time the context is created anew */
};
static struct fake_ctx g_ctx[MAX_DEVICES];

struct alloc {
    struct alloc *next;
    CUdeviceptr ptr;
    size_t len;
    int device;
    unsigned long gen;
};
static struct alloc *g_allocs;

/* A cuMemHostAlloc block. Not tied to its context's life here: the plugin
 * keeps its primary context retained while any block lives. */
struct host_alloc {
    struct host_alloc *next;
    CUdeviceptr ptr;
    size_t len;
    unsigned int flags;
    int device; /* of the context it was made in (cuPointerGetAttribute) */
};
static struct host_alloc *g_host_allocs;
static unsigned long long g_host_capacity = 1024ull << 20;
/* Unused with FAKE_CUDA_OMIT_HOST_ALLOC. */
static unsigned long long g_host_used __attribute__((unused));

struct reservation {
    struct reservation *next;
    CUdeviceptr base;
    size_t size;
};
static struct reservation *g_reservations;

struct phys {
    int fd;
    int device;
    int released;
    size_t size;
    long maps;
    /* Shareable handles (see "shareable handles" below): made with
     * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in requestedHandleTypes, or
     * imported; only these export. */
    int shareable;
    /* Whether this handle's pages are the ones counted in g_used (an
     * imported handle of memory another live handle of this process holds
     * is not: the memory counts once). */
    int counted;
    /* The memfd's inode: handles of one memory share it. */
    unsigned long long ino;
};
static struct phys *g_phys;
static size_t g_phys_len;

struct mapping {
    struct mapping *next;
    CUdeviceptr addr;
    size_t size;
    CUmemGenericAllocationHandle handle;
    int prot;                    /* the owning device's access (mprotect) */
    int peer_prot[MAX_DEVICES];  /* other devices' access (enforced for device work, see accessible_locked) */
};
static struct mapping *g_mappings;

static long g_live_streams;
static long g_live_events;
static struct fake_stream *g_streams;

static __thread CUcontext t_stack[64];
static __thread int t_depth;

/* Set on the callback thread (see host functions below): CUDA forbids any
 * driver call from a host function, so every call made there is refused. */
static __thread int t_in_callback;
/* The sticky error, once one happened: every later call fails with it, as
 * with a real context after an illegal address. Set by a bad access the
 * fake detects, by fake_cuda_inject_sticky_fault (or fake_cuda_sticky_fault),
 * or after FAKE_CUDA_STICKY_FAULT_AFTER=N calls (with
 * MEMPLUG_FAKE_CUDA_STICKY_CODE, default 700). */
static unsigned int g_sticky[MAX_DEVICES]; /* per device's primary context */
static long g_calls;
static long g_fault_after = -1;
static unsigned int g_fault_after_code = CUDA_ERROR_ILLEGAL_ADDRESS;
/* MEMPLUG_FAKE_CUDA_NO_POSIX_FD: no POSIX-fd shareable handles (see
 * "shareable handles" below). */
static int g_no_posix_fd;
/* MEMPLUG_FAKE_CUDA_NO_READ_ONLY / fake_cuda_set_no_read_only. */
static int g_no_read_only;
/* MEMPLUG_FAKE_CUDA_UNMAP_ONE_MAPPING / fake_cuda_set_unmap_one_mapping:
 * cuMemUnmap takes exactly one mapping per call (a stricter driver). */
static int g_unmap_one_mapping;
/* cuMemCreate calls so far (valid ones), and the call number that fails
 * with CUDA_ERROR_OUT_OF_MEMORY (0: none): MEMPLUG_FAKE_CUDA_FAIL_CREATE_AT=k
 * (the k-th of the process) or fake_cuda_fail_create_at(k) (the k-th from
 * then on). g_lock. */
static long g_create_calls, g_fail_create_at, g_create_failures;
/* Calls refused because they were made from the callback thread. */
static long g_callback_refused;

/* ---- per-entry-point counts and the blocking hook (for tests) ---- */

enum counted {
    N_MEM_CREATE,
    N_MEM_RELEASE,
    N_MEM_MAP,
    N_MEM_UNMAP,
    N_MEM_SET_ACCESS,
    N_EVENT_CREATE,
    N_EVENT_DESTROY,
    N_EVENT_RECORD,
    N_EVENT_QUERY,
    N_EVENT_SYNC,
    N_STREAM_CREATE,
    N_STREAM_CREATE_PRIO,
    N_STREAM_DESTROY,
    N_STREAM_SYNC,
    N_LAUNCH_HOST_FUNC,
    N_MEMSET_ASYNC,
    N_PRIORITY_RANGE,
    N_MEM_GET_INFO,
    N_MEM_EXPORT,
    N_MEM_IMPORT,
    N_MEMCPY_ASYNC,
    N_MEM_HOST_ALLOC,
    N_MEM_FREE_HOST,
    N_COUNTED
};
static const char *const g_counted_names[N_COUNTED] = {
    "cuMemCreate",     "cuMemRelease",       "cuMemMap",
    "cuMemUnmap",      "cuMemSetAccess",     "cuEventCreate",
    "cuEventDestroy",  "cuEventRecord",      "cuEventQuery",
    "cuEventSynchronize", "cuStreamCreate",  "cuStreamCreateWithPriority",
    "cuStreamDestroy", "cuStreamSynchronize", "cuLaunchHostFunc",
    "cuMemsetD8Async", "cuCtxGetStreamPriorityRange", "cuMemGetInfo",
    "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemcpyAsync",
    "cuMemHostAlloc",  "cuMemFreeHost",
};
static long g_counts[N_COUNTED];

/* The hook: fake_cuda_block_next_call(name) makes the next call of that
 * entry point (from any thread) wait, before it does anything, until
 * fake_cuda_release_blocked(); a test sees it waiting with
 * fake_cuda_wait_blocked. */
static pthread_mutex_t g_hook_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_hook_cv = PTHREAD_COND_INITIALIZER;
static int g_block_idx = -1;
static int g_blocked;
static unsigned long g_release_gen;

static void entered(enum counted idx) {
    __atomic_add_fetch(&g_counts[idx], 1, __ATOMIC_RELAXED);
    if (__atomic_load_n(&g_block_idx, __ATOMIC_ACQUIRE) != (int)idx)
        return;
    pthread_mutex_lock(&g_hook_lock);
    if (g_block_idx == (int)idx) {
        unsigned long gen = g_release_gen;
        g_block_idx = -1; /* the next call only */
        g_blocked++;
        pthread_cond_broadcast(&g_hook_cv);
        while (g_release_gen == gen)
            pthread_cond_wait(&g_hook_cv, &g_hook_lock);
        g_blocked--;
        pthread_cond_broadcast(&g_hook_cv);
    }
    pthread_mutex_unlock(&g_hook_lock);
}

static int counted_index(const char *name) {
    if (name == NULL)
        return -1;
    for (int i = 0; i < N_COUNTED; i++)
        if (strcmp(name, g_counted_names[i]) == 0)
            return i;
    return -1;
}

/* The device whose context a call works in: the calling thread's current
 * context (no lock: the thread's own stack); -1 for calls made with none
 * (device queries, retaining a primary context), which no fault stops. A
 * real driver's sticky error belongs to the context that faulted; other
 * contexts keep working. */
static int sticky_device(void) {
    return t_depth > 0 && t_stack[t_depth - 1] != NULL ? t_stack[t_depth - 1]->device : -1;
}

static CUresult check_call(int sticky_applies) {
    long n;
    int dev = sticky_device();
    if (t_in_callback) {
        __atomic_add_fetch(&g_callback_refused, 1, __ATOMIC_RELAXED);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    n = __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
    if (g_fault_after >= 0 && n > g_fault_after)
        __atomic_store_n(&g_sticky[dev < 0 ? 0 : dev], g_fault_after_code, __ATOMIC_RELAXED);
    return sticky_applies && dev >= 0 ? __atomic_load_n(&g_sticky[dev], __ATOMIC_RELAXED) : CUDA_SUCCESS;
}

/* What a call that still does its work after a sticky fault answers: the
 * fault of device `dev`'s context, if there was one (a real driver may;
 * callers must cope). */
static CUresult sticky_answer(int dev) {
    return (CUresult)__atomic_load_n(&g_sticky[dev], __ATOMIC_RELAXED);
}

static int access_device(void);

/* A bad device access: the context of the device doing the work is dead
 * from now on (the others are not). */
static CUresult fault(void) {
    int dev = access_device();
    __atomic_store_n(&g_sticky[dev < 0 ? 0 : dev], CUDA_ERROR_ILLEGAL_ADDRESS, __ATOMIC_RELAXED);
    return CUDA_ERROR_ILLEGAL_ADDRESS;
}

#define CHECK_INIT_STICKY(applies)                                                                 \
    do {                                                                                           \
        CUresult check_r_;                                                                         \
        if (!g_initialized)                                                                        \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        check_r_ = check_call(applies);                                                            \
        if (check_r_ != CUDA_SUCCESS)                                                              \
            return check_r_;                                                                       \
    } while (0)
/* Every entry point; the thread's context stack (push, pop, get current)
 * and giving a primary context back still work after a sticky fault (pop
 * and release then answer the fault: sticky_answer). */
#define CHECK_INIT() CHECK_INIT_STICKY(1)
#define CHECK_INIT_CTX_STACK() CHECK_INIT_STICKY(0)
/* CHECK_INIT, then counts the call (and maybe blocks it: the hook). */
#define CHECK_INIT_COUNTED(idx)                                                                    \
    do {                                                                                           \
        CHECK_INIT();                                                                              \
        entered(idx);                                                                              \
    } while (0)

static CUcontext current(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

/* Stream capture (see "stream capture" below). */
static CUresult prohibited_during_capture(void);
static CUresult capture_guard(CUstream s);
/* cuMemFree and cuMemFreeHost synchronise the device (-1: every device). */
static void sync_device(int dev);

/* A context usable for work: non-NULL and still retained. */
static int ctx_alive(CUcontext c) {
    int alive;
    if (c == NULL)
        return 0;
    pthread_mutex_lock(&g_lock);
    alive = c->refs > 0;
    pthread_mutex_unlock(&g_lock);
    return alive;
}

static unsigned long long env_ull(const char *name, unsigned long long dflt) {
    const char *v = getenv(name);
    char *end;
    unsigned long long x;
    if (v == NULL || *v == 0)
        return dflt;
    x = strtoull(v, &end, 10);
    return *end == 0 ? x : dflt;
}

/* ---- initialisation, devices ---- */

API CUresult cuInit(unsigned int flags) {
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
#ifdef FAKE_STUB
    /* The CUDA toolkit's stub libcuda.so: links, but is no driver. */
    return CUDA_ERROR_STUB_LIBRARY;
#endif
    pthread_mutex_lock(&g_lock);
    if (!g_initialized) {
        unsigned long long n = env_ull("MEMPLUG_FAKE_CUDA_DEVICES", 1);
        g_device_count = n > MAX_DEVICES ? MAX_DEVICES : (int)n;
        g_capacity = env_ull("MEMPLUG_FAKE_CUDA_MEM_MIB", 1024) << 20;
        g_ctx_overhead = env_ull("MEMPLUG_FAKE_CUDA_CTX_MIB", 16) << 20;
        g_host_capacity = env_ull("MEMPLUG_FAKE_CUDA_HOST_MIB", 1024) << 20;
        if (env_ull("MEMPLUG_FAKE_CUDA_NO_READ_ONLY", 0) != 0)
            __atomic_store_n(&g_no_read_only, 1, __ATOMIC_RELAXED);
        if (env_ull("MEMPLUG_FAKE_CUDA_NO_POSIX_FD", 0) != 0)
            __atomic_store_n(&g_no_posix_fd, 1, __ATOMIC_RELAXED);
        if (env_ull("MEMPLUG_FAKE_CUDA_UNMAP_ONE_MAPPING", 0) != 0)
            __atomic_store_n(&g_unmap_one_mapping, 1, __ATOMIC_RELAXED);
        g_fail_create_at = (long)env_ull("MEMPLUG_FAKE_CUDA_FAIL_CREATE_AT", 0);
        if (getenv("FAKE_CUDA_STICKY_FAULT_AFTER") != NULL)
            g_fault_after = (long)env_ull("FAKE_CUDA_STICKY_FAULT_AFTER", 0);
        {
            unsigned long long c = env_ull("MEMPLUG_FAKE_CUDA_STICKY_CODE", CUDA_ERROR_ILLEGAL_ADDRESS);
            g_fault_after_code = c == 0 || c > 0xffffffffull ? CUDA_ERROR_ILLEGAL_ADDRESS : (unsigned int)c;
        }
        if (g_ctx_overhead > g_capacity / 2)
            g_ctx_overhead = g_capacity / 2;
        for (int i = 0; i < MAX_DEVICES; i++)
            g_ctx[i].device = i;
        g_initialized = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return g_device_count == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *version) {
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 12080;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *count) {
    CHECK_INIT();
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_device_count;
    return CUDA_SUCCESS;
}

static int valid_device(int d) { return d >= 0 && d < g_device_count; }

API CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    CHECK_INIT();
    if (dev == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    CHECK_INIT();
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "memplug FAKE CUDA device %d", dev);
    return CUDA_SUCCESS;
}

/* ---- identity and peers ----
 * Each fake device has a UUID ("memplug-fake-gpu" with the ordinal in the
 * last byte), a PCI address (domain 0, bus 0x10 + ordinal, device 0) and
 * reports no GPUDirect RDMA unless MEMPLUG_FAKE_CUDA_RDMA=1 (then cuMemCreate
 * takes gpuDirectRDMACapable, refused otherwise, and counts it:
 * fake_cuda_rdma_creates). Devices can access each other as peers unless
 * MEMPLUG_FAKE_CUDA_NO_PEER=1 (read at each query); a device is not its
 * own peer (CUDA_ERROR_INVALID_DEVICE, as the real driver). */
#define ATTR_PCI_BUS_ID 33
#define ATTR_PCI_DEVICE_ID 34
#define ATTR_PCI_DOMAIN_ID 50

#define ATTR_GPU_DIRECT_RDMA_WITH_VMM 110
#define ATTR_GPU_DIRECT_RDMA 116

/* GPUDirect RDMA on VMM allocations: off unless MEMPLUG_FAKE_CUDA_RDMA=1
 * (read at each query, as a driver reports a fixed fact). */
static int rdma_supported(void) {
    const char *v = getenv("MEMPLUG_FAKE_CUDA_RDMA");
    return v != NULL && strcmp(v, "1") == 0;
}

static long g_rdma_creates; /* cuMemCreate calls with gpuDirectRDMACapable */

static void identity_attribute(unsigned int attrib, CUdevice dev, int *value) {
    switch (attrib) {
    case ATTR_GPU_DIRECT_RDMA_WITH_VMM:
    case ATTR_GPU_DIRECT_RDMA: *value = rdma_supported(); break;
    case ATTR_PCI_BUS_ID: *value = 0x10 + dev; break;
    case ATTR_PCI_DEVICE_ID: *value = 0; break;
    case ATTR_PCI_DOMAIN_ID: *value = 0; break;
    default: break;
    }
}

static int peers_allowed(void) {
    const char *v = getenv("MEMPLUG_FAKE_CUDA_NO_PEER");
    return !(v != NULL && strcmp(v, "1") == 0);
}

API CUresult cuDeviceGetUuid(unsigned char uuid[16], CUdevice dev) {
    CHECK_INIT();
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid, "memplug-fake-gpu", 16);
    uuid[15] = (unsigned char)dev;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
    CHECK_INIT();
    if (can == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev) || !valid_device(peer) || dev == peer)
        return CUDA_ERROR_INVALID_DEVICE;
    *can = peers_allowed();
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *value, unsigned int attrib, CUdevice dev) {
    CHECK_INIT();
    if (value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
#ifdef FAKE_CUDA_OMIT_VMM
    (void)attrib;
    *value = 0;
#else
    *value = attrib == ATTR_VMM_SUPPORTED ? 1 : 0;
    /* CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED (see
     * "shareable handles"). */
    if (attrib == 103)
        *value = !__atomic_load_n(&g_no_posix_fd, __ATOMIC_RELAXED);
#endif
    identity_attribute(attrib, dev, value);
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult error, const char **str) {
    if (str == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *str = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *str = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_STUB_LIBRARY: *str = "CUDA_ERROR_STUB_LIBRARY"; break;
    case CUDA_ERROR_NO_DEVICE: *str = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *str = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *str = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED: *str = "CUDA_ERROR_CONTEXT_IS_DESTROYED"; break;
    case CUDA_ERROR_INVALID_HANDLE: *str = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_READY: *str = "CUDA_ERROR_NOT_READY"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *str = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case CUDA_ERROR_LAUNCH_TIMEOUT: *str = "CUDA_ERROR_LAUNCH_TIMEOUT"; break;
    case CUDA_ERROR_HARDWARE_STACK_ERROR: *str = "CUDA_ERROR_HARDWARE_STACK_ERROR"; break;
    case CUDA_ERROR_ILLEGAL_INSTRUCTION: *str = "CUDA_ERROR_ILLEGAL_INSTRUCTION"; break;
    case CUDA_ERROR_MISALIGNED_ADDRESS: *str = "CUDA_ERROR_MISALIGNED_ADDRESS"; break;
    case CUDA_ERROR_INVALID_ADDRESS_SPACE: *str = "CUDA_ERROR_INVALID_ADDRESS_SPACE"; break;
    case CUDA_ERROR_INVALID_PC: *str = "CUDA_ERROR_INVALID_PC"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *str = "CUDA_ERROR_LAUNCH_FAILED"; break;
    case CUDA_ERROR_NOT_PERMITTED: *str = "CUDA_ERROR_NOT_PERMITTED"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *str = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_ILLEGAL_STATE: *str = "CUDA_ERROR_ILLEGAL_STATE"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: *str = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: *str = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"; break;
    case CUDA_ERROR_STREAM_CAPTURE_ISOLATION: *str = "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"; break;
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: *str = "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"; break;
    case CUDA_ERROR_CAPTURED_EVENT: *str = "CUDA_ERROR_CAPTURED_EVENT"; break;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: *str = "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"; break;
    default: *str = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */

API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    CHECK_INIT();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    g_retain_calls[dev]++;
    if (g_ctx[dev].refs++ == 0)
        g_ctx[dev].gen++;
    pthread_mutex_unlock(&g_lock);
    *ctx = &g_ctx[dev];
    return CUDA_SUCCESS;
}

/* After a sticky fault a real driver may answer the fault from here too
 * (the release still happens): a caller must not take a failure to mean
 * the context is still retained, nor treat it as fatal. */
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CUresult r = CUDA_SUCCESS;
    CHECK_INIT_CTX_STACK();
    if (!valid_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    g_release_calls[dev]++;
    if (g_ctx[dev].refs == 0)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else
        g_ctx[dev].refs--;
    pthread_mutex_unlock(&g_lock);
    return r == CUDA_SUCCESS ? sticky_answer(dev) : r;
}

API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CHECK_INIT_CTX_STACK();
    if (!ctx_alive(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == (int)(sizeof t_stack / sizeof t_stack[0]))
        return CUDA_ERROR_NOT_SUPPORTED;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

/* Pops even after a sticky fault, but answers the fault then (as
 * cuDevicePrimaryCtxRelease_v2 does). */
API CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    CHECK_INIT_CTX_STACK();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_depth--;
    if (ctx != NULL)
        *ctx = t_stack[t_depth];
    return t_stack[t_depth] != NULL ? sticky_answer(t_stack[t_depth]->device) : CUDA_SUCCESS;
}

API CUresult cuCtxGetCurrent(CUcontext *ctx) {
    CHECK_INIT_CTX_STACK();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = current();
    return CUDA_SUCCESS;
}

API CUresult cuCtxGetDevice(CUdevice *dev) {
    CUcontext c = current();
    CHECK_INIT();
    if (dev == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_alive(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->device;
    return CUDA_SUCCESS;
}

/* Whether an object made in context `c` at generation `gen` is still
 * there: its context was not destroyed since. */
static int ctx_same(CUcontext c, unsigned long gen) {
    int same;
    pthread_mutex_lock(&g_lock);
    same = c->refs > 0 && c->gen == gen;
    pthread_mutex_unlock(&g_lock);
    return same;
}

static unsigned long ctx_gen(CUcontext c) {
    unsigned long gen;
    pthread_mutex_lock(&g_lock);
    gen = c->gen;
    pthread_mutex_unlock(&g_lock);
    return gen;
}

/* The device of the calling thread's context, or -1 when there is none. */
static int current_device(void) {
    CUcontext c = current();
    return ctx_alive(c) ? c->device : -1;
}

/* ---- address checks (so a plugin bug is an error here, not a crash) ---- */

/* The device whose work this thread does: a stream worker's stream's
 * device (set when the worker starts), else the current context's (-1:
 * none known, judged as the owner). */
static __thread int t_access_dev = -1;

static int access_device(void) {
    CUcontext c = current();
    return t_access_dev >= 0 ? t_access_dev : c != NULL ? c->device : -1;
}

/* Whether [p, p+n) lies in memory the device doing the work
 * (access_device) may touch: a cuMemAlloc block, a pinned host block
 * (mapped for every device), or mappings with the access asked for, which
 * for a device other than the mapping's owner is what cuMemSetAccess
 * granted that peer (none unless granted: a peer's access without the
 * grant faults, as on a GPU). Called with g_lock held. */
static int accessible_locked(CUdeviceptr p, size_t n, int need_write) {
    CUdeviceptr end = p + n;
    int dev = access_device();
    for (struct alloc *a = g_allocs; a; a = a->next)
        if (p >= a->ptr && end <= a->ptr + a->len)
            return 1;
    for (struct host_alloc *h = g_host_allocs; h; h = h->next)
        if (p >= h->ptr && end <= h->ptr + h->len)
            return 1;
    while (p < end) {
        struct mapping *m;
        for (m = g_mappings; m; m = m->next)
            if (p >= m->addr && p < m->addr + m->size)
                break;
        if (m == NULL)
            return 0;
        {
            size_t i = (size_t)m->handle - 1;
            int owner = i < g_phys_len ? g_phys[i].device : -1;
            int prot = dev < 0 || dev == owner || dev >= MAX_DEVICES ? m->prot : m->peer_prot[dev];
            if (!(prot & PROT_READ) || (need_write && !(prot & PROT_WRITE)))
                return 0;
        }
        p = m->addr + m->size;
    }
    return 1;
}

static int accessible(CUdeviceptr p, size_t n, int need_write) {
    int ok;
    pthread_mutex_lock(&g_lock);
    ok = accessible_locked(p, n, need_write);
    pthread_mutex_unlock(&g_lock);
    return ok;
}

/* Bytes device `dev` can still give: its capacity less what is in use and
 * what its context takes while it exists. g_lock held. */
static unsigned long long available_locked(int dev) {
    unsigned long long taken = g_used[dev] + (g_ctx[dev].refs > 0 ? g_ctx_overhead : 0);
    return taken >= g_capacity ? 0 : g_capacity - taken;
}

/* The rest of the fake, in order (one translation unit: the parts share
 * this file's statics and see what comes before them). */
#include "fake_cuda_memory.inc"
#include "fake_cuda_streams.inc"
#include "fake_cuda_ordering.inc"
#include "fake_cuda_vmm.inc"
#include "fake_cuda_introspect.inc"
