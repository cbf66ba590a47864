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
 * and point the plugin at it with MEMPLUG_CUDA_DRIVER=/path/libcuda.so.1
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

/* ---- plain allocations ---- */

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    int dev = current_device();
    size_t len;
    void *p;
    struct alloc *a;
    CUresult r;
    CHECK_INIT();
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (dptr == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = prohibited_during_capture()) != CUDA_SUCCESS)
        return r;
    len = (size + 4095) & ~(size_t)4095;
    pthread_mutex_lock(&g_lock);
    if (len > available_locked(dev)) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    a = p == MAP_FAILED ? NULL : malloc(sizeof *a);
    if (a == NULL) {
        if (p != MAP_FAILED)
            munmap(p, len);
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(p, FAKE_GARBAGE, len); /* not zeros, as on a GPU */
    a->ptr = (CUdeviceptr)(uintptr_t)p;
    a->len = len;
    a->device = dev;
    a->gen = g_ctx[dev].gen;
    a->next = g_allocs;
    g_allocs = a;
    g_used[dev] += len;
    pthread_mutex_unlock(&g_lock);
    *dptr = a->ptr;
    return CUDA_SUCCESS;
}

API CUresult cuMemFree_v2(CUdeviceptr dptr) {
    CUresult r;
    int dev = -1;
    CHECK_INIT();
    if ((r = prohibited_during_capture()) != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_lock);
    for (struct alloc *a = g_allocs; a; a = a->next)
        if (a->ptr == dptr)
            dev = a->device;
    pthread_mutex_unlock(&g_lock);
    if (dev >= 0)
        sync_device(dev);
    pthread_mutex_lock(&g_lock);
    for (struct alloc **pp = &g_allocs; *pp; pp = &(*pp)->next) {
        struct alloc *a = *pp;
        if (a->ptr == dptr) {
            if (g_ctx[a->device].refs == 0 || g_ctx[a->device].gen != a->gen) {
                pthread_mutex_unlock(&g_lock);
                return CUDA_ERROR_CONTEXT_IS_DESTROYED;
            }
            *pp = a->next;
            munmap((void *)(uintptr_t)a->ptr, a->len);
            g_used[a->device] -= a->len;
            pthread_mutex_unlock(&g_lock);
            free(a);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    int dev = current_device();
    CHECK_INIT_COUNTED(N_MEM_GET_INFO);
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (free_bytes == NULL || total_bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    *free_bytes = (size_t)available_locked(dev);
    *total_bytes = (size_t)g_capacity;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* ---- pinned host memory ---- */

#define CU_MEMHOSTALLOC_KNOWN 7u /* PORTABLE 1 | DEVICEMAP 2 | WRITECOMBINED 4 */

#ifndef FAKE_CUDA_OMIT_HOST_ALLOC
/* The driver's documentation says nothing of a zero size; it is refused as
 * cuMemAlloc documents for itself (the stricter reading). */
API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    int dev = current_device();
    size_t len;
    void *p;
    struct host_alloc *h;
    CUresult r;
    CHECK_INIT_COUNTED(N_MEM_HOST_ALLOC);
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = prohibited_during_capture()) != CUDA_SUCCESS)
        return r;
    if (pp == NULL || bytesize == 0 || (flags & ~CU_MEMHOSTALLOC_KNOWN) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    len = (bytesize + 4095) & ~(size_t)4095;
    if (len < bytesize)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    if (len > g_host_capacity - g_host_used) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* Page-locked, as the driver's memory is: never paged out (the kit's
     * claims.pinned_locked reads it). A process that may not lock this much
     * (RLIMIT_MEMLOCK without CAP_IPC_LOCK) gets an out-of-memory answer,
     * as a driver that cannot pin the pages would give. */
    if (p != MAP_FAILED && mlock(p, len) != 0) {
        munmap(p, len);
        p = MAP_FAILED;
    }
    h = p == MAP_FAILED ? NULL : malloc(sizeof *h);
    if (h == NULL) {
        if (p != MAP_FAILED)
            munmap(p, len);
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(p, FAKE_GARBAGE, len); /* the driver promises nothing of the bytes */
    h->ptr = (CUdeviceptr)(uintptr_t)p;
    h->len = len;
    h->flags = flags;
    h->device = dev;
    h->next = g_host_allocs;
    g_host_allocs = h;
    g_host_used += len;
    pthread_mutex_unlock(&g_lock);
    *pp = p;
    return CUDA_SUCCESS;
}

API CUresult cuMemFreeHost(void *p) {
    CUresult r;
    CHECK_INIT_COUNTED(N_MEM_FREE_HOST);
    if ((r = prohibited_during_capture()) != CUDA_SUCCESS)
        return r;
    sync_device(-1);
    pthread_mutex_lock(&g_lock);
    for (struct host_alloc **pp = &g_host_allocs; *pp; pp = &(*pp)->next) {
        struct host_alloc *h = *pp;
        if (h->ptr == (CUdeviceptr)(uintptr_t)p) {
            *pp = h->next;
            munmap(p, h->len);
            g_host_used -= h->len;
            pthread_mutex_unlock(&g_lock);
            free(h);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_INVALID_VALUE;
}
#endif /* FAKE_CUDA_OMIT_HOST_ALLOC */

/* ---- copies and fills (synchronous) ---- */

/* Synchronous copies and fills run on the legacy default stream: they wait
 * for its earlier work (and, through it, the blocking streams'). */
static CUresult legacy_sync(void);

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    CUresult r;
    CHECK_INIT();
    if (current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = legacy_sync()) != CUDA_SUCCESS)
        return r;
    if (!accessible(dst, n, 1))
        return fault();
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    CUresult r;
    CHECK_INIT();
    if (current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = legacy_sync()) != CUDA_SUCCESS)
        return r;
    if (!accessible(src, n, 0))
        return fault();
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    CUresult r;
    CHECK_INIT();
    if (current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = legacy_sync()) != CUDA_SUCCESS)
        return r;
    if (!accessible(dst, n, 1) || !accessible(src, n, 0))
        return fault();
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
    CUresult r;
    CHECK_INIT();
    if (current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = legacy_sync()) != CUDA_SUCCESS)
        return r;
    if (!accessible(dst, n, 1))
        return fault();
    memset((void *)(uintptr_t)dst, value, n);
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void);

/* ---- streams and events ---- */

enum op_kind { OP_HOST_FN, OP_EVENT, OP_MEMSET, OP_COPY, OP_WAIT, OP_EVENT_WAIT, OP_NOP };

struct fake_stream;

/* What an OP_WAIT waits for: `stream` to have finished its op `seq`. */
struct wait_target {
    struct fake_stream *stream;
    unsigned long long seq;
};

struct op {
    struct op *next;
    enum op_kind kind;
    unsigned long long seq; /* its place on its stream, from 1 */
    CUhostFn fn;
    void *data;
    CUevent event;
    unsigned long long gen;
    CUdeviceptr ptr;
    CUdeviceptr src; /* OP_COPY: from `src` to `ptr` */
    size_t n;
    unsigned char value;
    struct wait_target *waits; /* OP_WAIT */
    int nwaits;
};

/* Stream priorities, as on recent GPUs: 0 is the least, -5 the greatest. */
#define LEAST_PRIORITY 0
#define GREATEST_PRIORITY (-5)
#define CU_STREAM_NON_BLOCKING 1u

struct fake_stream {
    struct fake_stream *next_registered;
    CUcontext ctx;
    unsigned long gen;
    unsigned int flags; /* CU_STREAM_NON_BLOCKING or 0 (synchronises with the legacy stream) */
    int priority;
    int legacy; /* the context's legacy default stream (NULL, CU_STREAM_LEGACY) */
    pthread_t thread;
    pthread_mutex_t m;
    pthread_cond_t cv;
    struct op *head, *tail;
    /* Ops enqueued and ops finished, in order (m). */
    unsigned long long submitted, completed;
    int busy;
    int stop;
    int refs; /* the handle, plus one per pending OP_WAIT naming the stream (g_lock) */
    /* Stream capture (g_lock): CAPTURE_NONE/ACTIVE/INVALIDATED, the mode
     * it began with and the thread that began it. */
    int capture_status, capture_mode;
    pthread_t capture_thread;
};

/* The legacy default stream of each device's primary context: made at its
 * first use and kept (it is not counted among the live streams). */
static struct fake_stream *g_legacy[MAX_DEVICES];
/* Async memsets per stream priority (index -priority). g_lock. */
static long g_memsets_at_priority[1 - GREATEST_PRIORITY];
/* cuEventSynchronize calls on blocking-sync events and on the others, and
 * the threads inside cuEventSynchronize now. */
static long g_event_syncs_blocking, g_event_syncs_spinning, g_in_event_sync;

#define CU_EVENT_BLOCKING_SYNC 1u

struct fake_event {
    CUcontext ctx;
    unsigned long gen;
    unsigned int flags;
    pthread_mutex_t m;
    pthread_cond_t cv;
    unsigned long long recorded, completed;
    int refs; /* the user's handle + one per pending record */
    int captured; /* last recorded during a stream capture (m) */
};

static void event_unref(CUevent e) {
    int last;
    pthread_mutex_lock(&e->m);
    last = --e->refs == 0;
    pthread_mutex_unlock(&e->m);
    if (last) {
        pthread_mutex_destroy(&e->m);
        pthread_cond_destroy(&e->cv);
        free(e);
        pthread_mutex_lock(&g_lock);
        g_live_events--;
        pthread_mutex_unlock(&g_lock);
    }
}

static void event_complete(CUevent e, unsigned long long gen) {
    pthread_mutex_lock(&e->m);
    if (gen > e->completed)
        e->completed = gen;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->m);
}

/* Drops a reference to a stream (g_lock held): the last frees it. */
static void stream_unref_locked(struct fake_stream *s) {
    if (--s->refs == 0) {
        pthread_mutex_destroy(&s->m);
        pthread_cond_destroy(&s->cv);
        free(s);
    }
}

/* Host functions: all of them, of every stream, run on ONE callback thread,
 * one at a time, as the real driver may do; the stream whose turn it is
 * waits until its host function returns. Driver calls made on that thread
 * are refused (CUDA_ERROR_NOT_PERMITTED). */
struct cb_job {
    struct cb_job *next;
    struct op *op;
    int done;
};
static pthread_mutex_t g_cb_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cb_cv = PTHREAD_COND_INITIALIZER;
static struct cb_job *g_cb_head, *g_cb_tail;
static int g_cb_started;

static void *callback_thread(void *arg) {
    (void)arg;
    t_in_callback = 1;
    pthread_mutex_lock(&g_cb_lock);
    for (;;) {
        struct cb_job *j;
        while (g_cb_head == NULL)
            pthread_cond_wait(&g_cb_cv, &g_cb_lock);
        j = g_cb_head;
        g_cb_head = j->next;
        if (g_cb_head == NULL)
            g_cb_tail = NULL;
        pthread_mutex_unlock(&g_cb_lock);
        j->op->fn(j->op->data);
        pthread_mutex_lock(&g_cb_lock);
        j->done = 1;
        pthread_cond_broadcast(&g_cb_cv);
    }
    return NULL;
}

static void run_host_fn(struct op *o) {
    struct cb_job j = {NULL, o, 0};
    pthread_mutex_lock(&g_cb_lock);
    if (!g_cb_started) {
        pthread_t t;
        if (pthread_create(&t, NULL, callback_thread, NULL) != 0) {
            pthread_mutex_unlock(&g_cb_lock);
            o->fn(o->data); /* cannot happen in tests; run it somewhere */
            return;
        }
        pthread_detach(t);
        g_cb_started = 1;
    }
    if (g_cb_tail)
        g_cb_tail->next = &j;
    else
        g_cb_head = &j;
    g_cb_tail = &j;
    pthread_cond_broadcast(&g_cb_cv);
    while (!j.done)
        pthread_cond_wait(&g_cb_cv, &g_cb_lock);
    pthread_mutex_unlock(&g_cb_lock);
}

static int copyable_locked(CUdeviceptr p, size_t n, int need_write);

/* A copy whose memory was unmapped or freed after it was submitted faults
 * the way a GPU does: a sticky illegal address, nothing copied. */
static void run_copy(struct op *o) {
    int ok;
    pthread_mutex_lock(&g_lock);
    ok = copyable_locked(o->ptr, o->n, 1) && copyable_locked(o->src, o->n, 0);
    pthread_mutex_unlock(&g_lock);
    if (!ok) {
        (void)fault();
        return;
    }
    memcpy((void *)(uintptr_t)o->ptr, (const void *)(uintptr_t)o->src, o->n);
}

static void run_op(struct op *o) {
    switch (o->kind) {
    case OP_HOST_FN: run_host_fn(o); break;
    case OP_EVENT:
        event_complete(o->event, o->gen);
        event_unref(o->event);
        break;
    case OP_MEMSET: memset((void *)(uintptr_t)o->ptr, o->value, o->n); break;
    case OP_COPY: run_copy(o); break;
    case OP_WAIT:
        /* The implicit synchronisation of the legacy default stream: wait
         * until each named stream has finished the work it had when this
         * op was submitted. */
        for (int i = 0; i < o->nwaits; i++) {
            struct fake_stream *t = o->waits[i].stream;
            pthread_mutex_lock(&t->m);
            while (t->completed < o->waits[i].seq)
                pthread_cond_wait(&t->cv, &t->m);
            pthread_mutex_unlock(&t->m);
            pthread_mutex_lock(&g_lock);
            stream_unref_locked(t);
            pthread_mutex_unlock(&g_lock);
        }
        free(o->waits);
        break;
    case OP_EVENT_WAIT:
        /* cuStreamWaitEvent: later work waits for the record the event
         * had when the wait was submitted. */
        pthread_mutex_lock(&o->event->m);
        while (o->event->completed < o->gen)
            pthread_cond_wait(&o->event->cv, &o->event->m);
        pthread_mutex_unlock(&o->event->m);
        event_unref(o->event);
        break;
    case OP_NOP: break;
    }
}

static void *stream_worker(void *arg) {
    struct fake_stream *s = arg;
    t_access_dev = s->ctx->device;
    pthread_mutex_lock(&s->m);
    for (;;) {
        struct op *o;
        unsigned long long seq;
        while (s->head == NULL && !s->stop)
            pthread_cond_wait(&s->cv, &s->m);
        if (s->head == NULL)
            break;
        o = s->head;
        s->head = o->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->busy = 1;
        seq = o->seq;
        pthread_mutex_unlock(&s->m);
        run_op(o);
        free(o);
        pthread_mutex_lock(&s->m);
        s->busy = 0;
        s->completed = seq;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->m);
    return NULL;
}

/* A new stream of context `c` with its worker thread; a legacy one is not
 * registered (nor counted live). */
static struct fake_stream *stream_new(CUcontext c, unsigned int flags, int priority, int legacy) {
    struct fake_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->ctx = c;
    s->gen = ctx_gen(c);
    s->flags = flags;
    s->priority = priority;
    s->legacy = legacy;
    s->refs = 1;
    pthread_mutex_init(&s->m, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, stream_worker, s) != 0) {
        pthread_mutex_destroy(&s->m);
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    if (!legacy) {
        pthread_mutex_lock(&g_lock);
        s->next_registered = g_streams;
        g_streams = s;
        g_live_streams++;
        pthread_mutex_unlock(&g_lock);
    }
    return s;
}

/* The legacy default stream of context `c`, made at its first use. */
static struct fake_stream *legacy_of(CUcontext c) {
    struct fake_stream *l;
    pthread_mutex_lock(&g_lock);
    l = g_legacy[c->device];
    pthread_mutex_unlock(&g_lock);
    if (l != NULL)
        return l;
    l = stream_new(c, 0, LEAST_PRIORITY, 1);
    if (l == NULL)
        return NULL;
    pthread_mutex_lock(&g_lock);
    if (g_legacy[c->device] == NULL) {
        g_legacy[c->device] = l;
        l = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    if (l != NULL) { /* another thread made it first */
        pthread_mutex_lock(&l->m);
        l->stop = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->m);
        pthread_join(l->thread, NULL);
        pthread_mutex_lock(&g_lock);
        stream_unref_locked(l);
        pthread_mutex_unlock(&g_lock);
    }
    pthread_mutex_lock(&g_lock);
    l = g_legacy[c->device];
    pthread_mutex_unlock(&g_lock);
    return l;
}

static int stream_registered(CUstream s) {
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (struct fake_stream *p = g_streams; p; p = p->next_registered)
        if (p == s)
            found = 1;
    pthread_mutex_unlock(&g_lock);
    return found;
}

/* The stream a handle names: NULL and CU_STREAM_LEGACY (0x1) are the
 * legacy default stream of the current context; CU_STREAM_PER_THREAD (0x2)
 * is not modelled. */
static CUresult resolve_stream(CUstream in, struct fake_stream **out) {
    if (in == NULL || in == (CUstream)0x1) {
        CUcontext c = current();
        if (!ctx_alive(c))
            return CUDA_ERROR_INVALID_CONTEXT;
        *out = legacy_of(c);
        return *out != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!stream_registered(in))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_same(in->ctx, in->gen))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = in;
    return CUDA_SUCCESS;
}

/* Adds `t`, unless it has nothing pending, to the targets of a wait being
 * built. g_lock held. */
static void add_wait_locked(struct wait_target *w, int *n, struct fake_stream *t) {
    pthread_mutex_lock(&t->m);
    if (t->submitted > t->completed) {
        w[*n].stream = t;
        w[*n].seq = t->submitted;
        t->refs++;
        (*n)++;
    }
    pthread_mutex_unlock(&t->m);
}

/* ---- stream capture ----
 *
 * cuStreamBeginCapture_v2 puts a (non-legacy) stream in capture mode: work
 * submitted to it from then on is recorded for a graph, not run (host
 * functions never run, copies and fills never happen), until
 * cuStreamEndCapture, which answers a graph handle (opaque here;
 * cuGraphDestroy frees it) or CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901).
 * As the driver documents: an event recorded on a capturing stream may not
 * be queried or waited for (CUDA_ERROR_CAPTURED_EVENT, 907) until it is
 * recorded again outside capture; synchronising a capturing stream, or the
 * context while one captures, is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
 * (900) and invalidates the capture; work on the legacy stream while a
 * blocking stream captures is CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (906) and
 * invalidates it; waiting on an event recorded outside the capture is
 * CUDA_ERROR_STREAM_CAPTURE_ISOLATION (905). "Potentially unsafe" calls
 * (here cuMemAlloc, cuMemFree, cuMemHostAlloc, cuMemFreeHost) follow the
 * capture modes: a thread whose mode (cuThreadExchangeStreamCaptureMode,
 * GLOBAL by default) is GLOBAL may not make them while it has a
 * non-RELAXED capture of its own or any thread has a GLOBAL one;
 * THREAD_LOCAL only counts its own; RELAXED is never prohibited. A
 * prohibited call is 900 and invalidates the captures that prohibited it.
 * Lenient: the VMM calls are not counted as unsafe (the documentation
 * does not list them). */
#define CAPTURE_NONE 0
#define CAPTURE_ACTIVE 1
#define CAPTURE_INVALIDATED 2
#define CAPTURE_MODE_GLOBAL 0
#define CAPTURE_MODE_THREAD_LOCAL 1
#define CAPTURE_MODE_RELAXED 2

static __thread int t_capture_mode = CAPTURE_MODE_GLOBAL;
/* What capture_submit_locked answers for an op that is not captured. */
#define SUBMIT_RUNS 0xffffffffu
static long g_captured_ops;

/* `o` on stream `s` (g_lock held): SUBMIT_RUNS when it runs as usual;
 * otherwise it is captured (CUDA_SUCCESS) or refused, and freed. */
static CUresult capture_submit_locked(struct fake_stream *s, struct op *o) {
    CUresult r = CUDA_SUCCESS;
    if (s->legacy) {
        for (struct fake_stream *t = g_streams; t; t = t->next_registered)
            if (t->ctx == s->ctx && !(t->flags & CU_STREAM_NON_BLOCKING) && t->capture_status == CAPTURE_ACTIVE) {
                t->capture_status = CAPTURE_INVALIDATED;
                r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
            }
        if (r == CUDA_SUCCESS)
            return SUBMIT_RUNS;
    } else if (s->capture_status == CAPTURE_NONE) {
        return SUBMIT_RUNS;
    } else if (s->capture_status == CAPTURE_INVALIDATED) {
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (o->kind == OP_EVENT_WAIT) {
        int outside;
        pthread_mutex_lock(&o->event->m);
        outside = !o->event->captured && o->gen > 0;
        pthread_mutex_unlock(&o->event->m);
        if (outside) {
            s->capture_status = CAPTURE_INVALIDATED;
            r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        }
    }
    if (r == CUDA_SUCCESS) {
        g_captured_ops++;
        if (o->kind == OP_EVENT) {
            /* Recorded into the graph: the event's last record is now a
             * captured one. The op's reference goes. */
            pthread_mutex_lock(&o->event->m);
            o->event->recorded--;
            o->event->captured = 1;
            o->event->refs--;
            pthread_mutex_unlock(&o->event->m);
        } else if (o->kind == OP_EVENT_WAIT) {
            pthread_mutex_lock(&o->event->m);
            o->event->refs--;
            pthread_mutex_unlock(&o->event->m);
        }
    }
    /* A refused op's event reference is the caller's to drop (as for any
     * refused submission). */
    free(o);
    return r;
}

/* Whether a stream is capturing now (any status but none). */
static int stream_capturing(CUstream in) {
    int c;
    if (in == NULL || in == (CUstream)0x1 || in == (CUstream)0x2 || !stream_registered(in))
        return 0;
    pthread_mutex_lock(&g_lock);
    c = in->capture_status != CAPTURE_NONE;
    pthread_mutex_unlock(&g_lock);
    return c;
}

/* What an operation on stream `in` that a capture cannot hold answers:
 * 901 once its capture is invalidated (else success). */
static CUresult capture_guard(CUstream in) {
    int bad;
    if (in == NULL || in == (CUstream)0x1 || in == (CUstream)0x2 || !stream_registered(in))
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    bad = in->capture_status == CAPTURE_INVALIDATED;
    pthread_mutex_unlock(&g_lock);
    return bad ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

/* A synchronisation of stream `one` (or, when NULL, of every stream of
 * context `c`) while it captures: 900, and the capture is invalidated. */
static CUresult capture_sync_guard(CUcontext c, struct fake_stream *one) {
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    for (struct fake_stream *t = g_streams; t; t = t->next_registered)
        if ((one == NULL ? t->ctx == c : t == one) && t->capture_status == CAPTURE_ACTIVE) {
            t->capture_status = CAPTURE_INVALIDATED;
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    pthread_mutex_unlock(&g_lock);
    return r;
}

/* A potentially unsafe call: 900 when the capture modes prohibit it on
 * this thread (see above), invalidating the captures that do. */
static CUresult prohibited_during_capture(void) {
    CUresult r = CUDA_SUCCESS;
    pthread_t self = pthread_self();
    if (t_capture_mode == CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    for (struct fake_stream *t = g_streams; t; t = t->next_registered) {
        int own = pthread_equal(t->capture_thread, self) && t->capture_mode != CAPTURE_MODE_RELAXED;
        int global = t_capture_mode == CAPTURE_MODE_GLOBAL && t->capture_mode == CAPTURE_MODE_GLOBAL;
        if (t->capture_status == CAPTURE_ACTIVE && (own || global)) {
            t->capture_status = CAPTURE_INVALIDATED;
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

API CUresult cuStreamBeginCapture_v2(CUstream in, int mode) {
    CUresult r = CUDA_SUCCESS;
    CHECK_INIT();
    if (mode < CAPTURE_MODE_GLOBAL || mode > CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (in == NULL || in == (CUstream)0x1 || in == (CUstream)0x2)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!stream_registered(in))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    if (in->capture_status != CAPTURE_NONE) {
        r = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        in->capture_status = CAPTURE_ACTIVE;
        in->capture_mode = mode;
        in->capture_thread = pthread_self();
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

API CUresult cuStreamEndCapture(CUstream in, void **graph) {
    CUresult r = CUDA_SUCCESS;
    CHECK_INIT();
    if (graph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (in == NULL || in == (CUstream)0x1 || in == (CUstream)0x2 || !stream_registered(in))
        return CUDA_ERROR_INVALID_HANDLE;
    *graph = NULL;
    pthread_mutex_lock(&g_lock);
    if (in->capture_status == CAPTURE_NONE)
        r = CUDA_ERROR_ILLEGAL_STATE;
    else if (in->capture_mode != CAPTURE_MODE_RELAXED && !pthread_equal(in->capture_thread, pthread_self()))
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    else {
        if (in->capture_status == CAPTURE_INVALIDATED)
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        in->capture_status = CAPTURE_NONE;
    }
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS && (*graph = malloc(1)) == NULL)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    return r;
}

API CUresult cuGraphDestroy(void *graph) {
    CHECK_INIT();
    if (graph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    free(graph);
    return CUDA_SUCCESS;
}

/* CU_STREAM_CAPTURE_STATUS_NONE 0, ACTIVE 1, INVALIDATED 2. The legacy
 * stream while a blocking stream of its context captures: 906. */
API CUresult cuStreamIsCapturing(CUstream in, int *status) {
    CUresult r = CUDA_SUCCESS;
    CHECK_INIT();
    if (status == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (in == NULL || in == (CUstream)0x1) {
        CUcontext c = current();
        if (!ctx_alive(c))
            return CUDA_ERROR_INVALID_CONTEXT;
        *status = CAPTURE_NONE;
        pthread_mutex_lock(&g_lock);
        for (struct fake_stream *t = g_streams; t; t = t->next_registered)
            if (t->ctx == c && !(t->flags & CU_STREAM_NON_BLOCKING) && t->capture_status == CAPTURE_ACTIVE)
                r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        pthread_mutex_unlock(&g_lock);
        return r;
    }
    if (!stream_registered(in))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    *status = in->capture_status;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

API CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    int old;
    CHECK_INIT();
    if (mode == NULL || *mode < CAPTURE_MODE_GLOBAL || *mode > CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

API long fake_cuda_captured_ops(void) {
    long n;
    pthread_mutex_lock(&g_lock);
    n = g_captured_ops;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* ---- device-wide synchronisation (cuMemFree, cuMemFreeHost) ----
 * CUDA's "API synchronization behavior": cuMemFree and cuMemFreeHost
 * synchronise the device. Here: they wait until every stream of the
 * device's context (of every device, for cuMemFreeHost), the legacy ones
 * included, has run what was submitted to it before the call; counted in
 * fake_cuda_free_syncs. */
static long g_free_syncs;

static void sync_device(int dev) {
    struct wait_target *w;
    int cap = MAX_DEVICES, n = 0;
    __atomic_add_fetch(&g_free_syncs, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_lock);
    for (struct fake_stream *t = g_streams; t; t = t->next_registered)
        cap++;
    w = calloc((size_t)cap, sizeof *w);
    if (w != NULL) {
        for (struct fake_stream *t = g_streams; t; t = t->next_registered)
            if (dev < 0 || t->ctx->device == dev)
                add_wait_locked(w, &n, t);
        for (int d = 0; d < MAX_DEVICES; d++)
            if (g_legacy[d] != NULL && (dev < 0 || d == dev))
                add_wait_locked(w, &n, g_legacy[d]);
    }
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < n; i++) {
        struct fake_stream *t = w[i].stream;
        pthread_mutex_lock(&t->m);
        while (t->completed < w[i].seq)
            pthread_cond_wait(&t->cv, &t->m);
        pthread_mutex_unlock(&t->m);
        pthread_mutex_lock(&g_lock);
        stream_unref_locked(t);
        pthread_mutex_unlock(&g_lock);
    }
    free(w);
}

API long fake_cuda_free_syncs(void) { return __atomic_load_n(&g_free_syncs, __ATOMIC_RELAXED); }


/* The wait that goes before new work on `s`, as the legacy default stream
 * demands (NULL when there is nothing to wait for): work on the legacy
 * stream waits for the earlier work of every blocking stream of the
 * context; work on a blocking stream waits for the legacy stream's earlier
 * work; a non-blocking stream waits for nothing. g_lock held. */
static struct op *implicit_wait_locked(struct fake_stream *s) {
    struct wait_target *w;
    struct op *o;
    int cap = 1, n = 0;
    if (!s->legacy && (s->flags & CU_STREAM_NON_BLOCKING))
        return NULL;
    if (s->legacy)
        for (struct fake_stream *t = g_streams; t; t = t->next_registered)
            cap++;
    w = calloc((size_t)cap, sizeof *w);
    if (w == NULL)
        return NULL;
    if (s->legacy) {
        for (struct fake_stream *t = g_streams; t; t = t->next_registered)
            if (t->ctx == s->ctx && !(t->flags & CU_STREAM_NON_BLOCKING))
                add_wait_locked(w, &n, t);
    } else if (g_legacy[s->ctx->device] != NULL) {
        add_wait_locked(w, &n, g_legacy[s->ctx->device]);
    }
    if (n == 0 || (o = calloc(1, sizeof *o)) == NULL) {
        for (int i = 0; i < n; i++)
            stream_unref_locked(w[i].stream);
        free(w);
        return NULL;
    }
    o->kind = OP_WAIT;
    o->waits = w;
    o->nwaits = n;
    return o;
}

static void enqueue_locked(struct fake_stream *s, struct op *o) {
    o->next = NULL;
    o->seq = ++s->submitted;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&s->cv);
}


/* Runs `o` on stream `in` after its earlier work (and, by the legacy
 * default stream's rules, after the work it must wait for); on a
 * capturing stream, captures it instead (capture_submit_locked). */
static CUresult submit(CUstream in, struct op *o) {
    struct fake_stream *s;
    struct op *w;
    CUresult r = resolve_stream(in, &s);
    if (r != CUDA_SUCCESS) {
        free(o);
        return r;
    }
    pthread_mutex_lock(&g_lock);
    r = capture_submit_locked(s, o);
    if (r != SUBMIT_RUNS) {
        pthread_mutex_unlock(&g_lock);
        return r;
    }
    if (o->kind == OP_EVENT) {
        pthread_mutex_lock(&o->event->m);
        o->event->captured = 0;
        pthread_mutex_unlock(&o->event->m);
    }
    w = implicit_wait_locked(s);
    if (o->kind == OP_MEMSET)
        g_memsets_at_priority[-s->priority]++;
    pthread_mutex_lock(&s->m);
    if (w != NULL)
        enqueue_locked(s, w);
    enqueue_locked(s, o);
    pthread_mutex_unlock(&s->m);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* Waits until `s` has finished what was submitted to it so far. */
static CUresult stream_sync(struct fake_stream *s) {
    unsigned long long target;
    if (pthread_equal(pthread_self(), s->thread))
        return CUDA_ERROR_NOT_PERMITTED;
    pthread_mutex_lock(&s->m);
    target = s->submitted;
    while (s->completed < target)
        pthread_cond_wait(&s->cv, &s->m);
    pthread_mutex_unlock(&s->m);
    return CUDA_SUCCESS;
}

/* What a synchronous copy or fill does first: it runs on the legacy
 * default stream, so it waits for that stream's earlier work and, through
 * it, for the blocking streams' earlier work. */
static CUresult legacy_sync(void) {
    struct fake_stream *l;
    struct op *o;
    CUresult r;
    CUcontext c = current();
    if (!ctx_alive(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    l = legacy_of(c);
    o = calloc(1, sizeof *o);
    if (l == NULL || o == NULL) {
        free(o);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    o->kind = OP_NOP;
    r = submit(NULL, o);
    return r == CUDA_SUCCESS ? stream_sync(l) : r;
}

static CUresult stream_create(CUstream *out, unsigned int flags, int priority) {
    struct fake_stream *s;
    CUcontext c = current();
    if (!ctx_alive(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (out == NULL || flags > CU_STREAM_NON_BLOCKING)
        return CUDA_ERROR_INVALID_VALUE;
    if (priority < GREATEST_PRIORITY)
        priority = GREATEST_PRIORITY;
    if (priority > LEAST_PRIORITY)
        priority = LEAST_PRIORITY;
    s = stream_new(c, flags, priority, 0);
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = s;
    return CUDA_SUCCESS;
}

API CUresult cuStreamCreate(CUstream *out, unsigned int flags) {
    CHECK_INIT_COUNTED(N_STREAM_CREATE);
    return stream_create(out, flags, LEAST_PRIORITY);
}

API CUresult cuStreamCreateWithPriority(CUstream *out, unsigned int flags, int priority) {
    CHECK_INIT_COUNTED(N_STREAM_CREATE_PRIO);
    return stream_create(out, flags, priority);
}

API CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) {
    CHECK_INIT_COUNTED(N_PRIORITY_RANGE);
    if (!ctx_alive(current()))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (least != NULL)
        *least = LEAST_PRIORITY;
    if (greatest != NULL)
        *greatest = GREATEST_PRIORITY;
    return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(CUstream in) {
    struct fake_stream *s;
    CUresult r;
    CHECK_INIT_COUNTED(N_STREAM_SYNC);
    r = resolve_stream(in, &s);
    if (r == CUDA_SUCCESS)
        r = capture_sync_guard(s->ctx, s);
    return r == CUDA_SUCCESS ? stream_sync(s) : r;
}

API CUresult cuStreamDestroy_v2(CUstream s) {
    CUresult r;
    CHECK_INIT_COUNTED(N_STREAM_DESTROY);
    if (s == NULL || s == (CUstream)0x1 || s == (CUstream)0x2)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!stream_registered(s))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_same(s->ctx, s->gen))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    r = stream_sync(s);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_lock);
    for (struct fake_stream **pp = &g_streams; *pp; pp = &(*pp)->next_registered)
        if (*pp == s) {
            *pp = s->next_registered;
            break;
        }
    g_live_streams--;
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_lock(&s->m);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->m);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&g_lock);
    stream_unref_locked(s);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

API CUresult cuStreamGetCtx(CUstream s, CUcontext *ctx) {
    CHECK_INIT();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (s == NULL || s == (CUstream)0x1) {
        if (!ctx_alive(current()))
            return CUDA_ERROR_INVALID_CONTEXT;
        *ctx = current();
        return CUDA_SUCCESS;
    }
    if (!stream_registered(s))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_same(s->ctx, s->gen))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *ctx = s->ctx;
    return CUDA_SUCCESS;
}

API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data) {
    struct op *o;
    CHECK_INIT_COUNTED(N_LAUNCH_HOST_FUNC);
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    o = calloc(1, sizeof *o);
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = OP_HOST_FN;
    o->fn = fn;
    o->data = data;
    return submit(s, o);
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
    struct op *o;
    CHECK_INIT_COUNTED(N_MEMSET_ASYNC);
    if (!accessible(dst, n, 1))
        return fault();
    o = calloc(1, sizeof *o);
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = OP_MEMSET;
    o->ptr = dst;
    o->n = n;
    o->value = value;
    return submit(s, o);
}

/* Whether [p, p+n) shares a byte with memory the driver tracks: an
 * allocation, a pinned host block, a mapping or a reservation (mapped or
 * not). g_lock held. */
static int device_space_locked(CUdeviceptr p, size_t n) {
    CUdeviceptr end = p + n;
    for (struct alloc *a = g_allocs; a; a = a->next)
        if (p < a->ptr + a->len && a->ptr < end)
            return 1;
    for (struct host_alloc *h = g_host_allocs; h; h = h->next)
        if (p < h->ptr + h->len && h->ptr < end)
            return 1;
    for (struct reservation *r = g_reservations; r; r = r->next)
        if (p < r->base + r->size && r->base < end)
            return 1;
    for (struct mapping *m = g_mappings; m; m = m->next)
        if (p < m->addr + m->size && m->addr < end)
            return 1;
    return 0;
}

/* A range cuMemcpyAsync may touch, as the driver judges it under unified
 * addressing: pageable host memory (no byte of it tracked by the driver; the
 * caller vouches for it, as on a GPU), or tracked memory wholly inside one
 * allocation, one pinned host block, or mapped (read, or written for the
 * destination) with no gap. A range meeting tracked memory any other way
 * (past an allocation or a pinned block, into an unmapped part of a
 * reservation) is CUDA_ERROR_INVALID_VALUE, checked when the copy is
 * submitted (and again when it runs, on its stream's worker: memory freed
 * meanwhile is a fault). */
static int copyable_locked(CUdeviceptr p, size_t n, int need_write) {
    return !device_space_locked(p, n) || accessible_locked(p, n, need_write);
}

/* cuMemcpyAsync calls that had a pageable side and so waited (below). */
static long g_pageable_copies;

/* CUDA's "API synchronization behavior": a cuMemcpyAsync to or from
 * pageable host memory (memory the driver does not track) is synchronous:
 * from pageable memory the stream's earlier work is waited for first, to
 * pageable memory the call returns only once the copy is done. The fake
 * does the strictest of both for either direction: it enqueues the copy
 * and returns when the stream has run it (and everything before it). */
API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    struct op *o;
    struct fake_stream *st;
    CUresult r;
    int ok, pageable;
    CHECK_INIT_COUNTED(N_MEMCPY_ASYNC);
    if (current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (n == 0)
        return CUDA_SUCCESS;
    if (dst + n < dst || src + n < src)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = capture_guard(s)) != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&g_lock);
    ok = copyable_locked(dst, n, 1) && copyable_locked(src, n, 0);
    pageable = !device_space_locked(dst, n) || !device_space_locked(src, n);
    pthread_mutex_unlock(&g_lock);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    o = calloc(1, sizeof *o);
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = OP_COPY;
    o->ptr = dst;
    o->src = src;
    o->n = n;
    r = submit(s, o);
    if (r != CUDA_SUCCESS || !pageable || stream_capturing(s))
        return r;
    __atomic_add_fetch(&g_pageable_copies, 1, __ATOMIC_RELAXED);
    r = resolve_stream(s, &st);
    return r == CUDA_SUCCESS ? stream_sync(st) : r;
}

API long fake_cuda_pageable_copies(void) { return __atomic_load_n(&g_pageable_copies, __ATOMIC_RELAXED); }

/* cuPointerGetAttribute, for the two attributes the plugin asks:
 * CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2: HOST 1 for a pinned block, DEVICE 2
 * for a cuMemAlloc block or mapped VMM memory) and
 * CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL (9). Memory the driver does not know
 * (pageable host memory, an unmapped part of a reservation) is
 * CUDA_ERROR_INVALID_VALUE, as the documentation says for a pointer not
 * allocated, mapped or registered by the driver; other attributes are not
 * modelled (CUDA_ERROR_INVALID_VALUE: stricter than the driver). */
#define PTR_ATTR_MEMORY_TYPE 2
#define PTR_ATTR_DEVICE_ORDINAL 9
API CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    unsigned int type = 0;
    int device = -1;
    CHECK_INIT();
    if (data == NULL || (attribute != PTR_ATTR_MEMORY_TYPE && attribute != PTR_ATTR_DEVICE_ORDINAL))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (struct alloc *a = g_allocs; a && !type; a = a->next)
        if (ptr >= a->ptr && ptr < a->ptr + a->len)
            type = 2, device = a->device;
    for (struct host_alloc *h = g_host_allocs; h && !type; h = h->next)
        if (ptr >= h->ptr && ptr < h->ptr + h->len)
            type = 1, device = h->device;
    for (struct mapping *m = g_mappings; m && !type; m = m->next)
        if (ptr >= m->addr && ptr < m->addr + m->size)
            type = 2, device = m->handle - 1 < g_phys_len ? g_phys[m->handle - 1].device : 0;
    pthread_mutex_unlock(&g_lock);
    if (!type)
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute == PTR_ATTR_MEMORY_TYPE)
        *(unsigned int *)data = type;
    else
        *(int *)data = device;
    return CUDA_SUCCESS;
}

API CUresult cuEventCreate(CUevent *out, unsigned int flags) {
    CUevent e;
    CUcontext c = current();
    CHECK_INIT_COUNTED(N_EVENT_CREATE);
    if (!ctx_alive(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (out == NULL || flags > 0xf)
        return CUDA_ERROR_INVALID_VALUE;
    e = calloc(1, sizeof *e);
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = c;
    e->gen = ctx_gen(c);
    e->flags = flags;
    e->refs = 1;
    pthread_mutex_init(&e->m, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_lock(&g_lock);
    g_live_events++;
    pthread_mutex_unlock(&g_lock);
    *out = e;
    return CUDA_SUCCESS;
}

API CUresult cuEventRecord(CUevent e, CUstream s) {
    struct op *o;
    CUresult r;
    CHECK_INIT_COUNTED(N_EVENT_RECORD);
    if (e == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_same(e->ctx, e->gen))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    o = calloc(1, sizeof *o);
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = OP_EVENT;
    o->event = e;
    pthread_mutex_lock(&e->m);
    o->gen = ++e->recorded;
    e->refs++;
    pthread_mutex_unlock(&e->m);
    r = submit(s, o);
    if (r != CUDA_SUCCESS) {
        /* Not recorded after all: the op (freed by submit) held a ref. */
        pthread_mutex_lock(&e->m);
        e->recorded--;
        pthread_mutex_unlock(&e->m);
        event_unref(e);
    }
    return r;
}

API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    struct op *o;
    CUresult r;
    CHECK_INIT();
    if (e == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_same(e->ctx, e->gen))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    o = calloc(1, sizeof *o);
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = OP_EVENT_WAIT;
    o->event = e;
    pthread_mutex_lock(&e->m);
    o->gen = e->recorded; /* never recorded: nothing to wait for */
    e->refs++;
    pthread_mutex_unlock(&e->m);
    r = submit(s, o);
    if (r != CUDA_SUCCESS)
        event_unref(e);
    return r;
}

#ifndef FAKE_CUDA_OMIT_EVENT_QUERY
API CUresult cuEventQuery(CUevent e) {
    CUresult r;
    CHECK_INIT_COUNTED(N_EVENT_QUERY);
    if (e == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_same(e->ctx, e->gen))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    pthread_mutex_lock(&e->m);
    r = e->captured                       ? CUDA_ERROR_CAPTURED_EVENT
        : e->completed >= e->recorded ? CUDA_SUCCESS
                                      : CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&e->m);
    return r;
}
#endif

API CUresult cuEventSynchronize(CUevent e) {
    CHECK_INIT_COUNTED(N_EVENT_SYNC);
    if (e == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_same(e->ctx, e->gen))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    /* A blocking-sync event puts the thread to sleep; any other spins (or
     * yields) on a real driver. Both are counted. */
    __atomic_add_fetch(e->flags & CU_EVENT_BLOCKING_SYNC ? &g_event_syncs_blocking : &g_event_syncs_spinning, 1,
                       __ATOMIC_RELAXED);
    pthread_mutex_lock(&e->m);
    if (e->captured) {
        pthread_mutex_unlock(&e->m);
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    __atomic_add_fetch(&g_in_event_sync, 1, __ATOMIC_RELAXED);
    while (e->completed < e->recorded)
        pthread_cond_wait(&e->cv, &e->m);
    pthread_mutex_unlock(&e->m);
    __atomic_sub_fetch(&g_in_event_sync, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

API CUresult cuEventDestroy_v2(CUevent e) {
    CHECK_INIT_COUNTED(N_EVENT_DESTROY);
    if (e == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    event_unref(e);
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void) {
    CUcontext c = current();
    CUresult r;
    CHECK_INIT();
    if (!ctx_alive(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((r = capture_sync_guard(c, NULL)) != CUDA_SUCCESS)
        return r;
    for (;;) {
        struct fake_stream *pending = NULL;
        pthread_mutex_lock(&g_lock);
        for (struct fake_stream *s = g_streams; s && !pending; s = s->next_registered) {
            pthread_mutex_lock(&s->m);
            if (s->ctx == c && s->submitted > s->completed) {
                pending = s;
                s->refs++;
            }
            pthread_mutex_unlock(&s->m);
        }
        if (pending == NULL && g_legacy[c->device] != NULL) {
            struct fake_stream *l = g_legacy[c->device];
            pthread_mutex_lock(&l->m);
            if (l->submitted > l->completed) {
                pending = l;
                l->refs++;
            }
            pthread_mutex_unlock(&l->m);
        }
        pthread_mutex_unlock(&g_lock);
        if (pending == NULL)
            return CUDA_SUCCESS;
        stream_sync(pending);
        pthread_mutex_lock(&g_lock);
        stream_unref_locked(pending);
        pthread_mutex_unlock(&g_lock);
    }
}

/* ---- virtual memory management ---- */

#ifndef FAKE_CUDA_OMIT_VMM

/* The granularity depends on the properties, as on a real driver: here
 * GPUDirect-RDMA-capable memory comes in granules twice as large (a choice
 * of this fake; real devices differ, which is the point), and cuMemCreate
 * refuses a size that is not a multiple of its properties' granularity. */
static size_t gran_of(const CUmemAllocationProp *p) { return p->gpuDirectRDMACapable ? 2 * GRAN : GRAN; }

static int valid_prop(const CUmemAllocationProp *p) {
    return p != NULL && p->type == 1 /* PINNED */ && p->location.type == 1 /* DEVICE */ &&
           valid_device(p->location.id);
}

/* ---- shareable handles (export/import) ----
 *
 * A handle made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (1) in
 * requestedHandleTypes is a sealed memfd named "fake-cuda-shareable"
 * (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL); cuMemExportToShareableHandle
 * hands out a new descriptor of it (a dup the caller owns), and
 * cuMemImportFromShareableHandle takes only such a descriptor (from this
 * process or another: the name and seals are checked, so a pipe or another
 * memfd is CUDA_ERROR_INVALID_VALUE) and makes a new handle of the same
 * memory, of the memfd's size. In one process that memory counts in
 * cuMemGetInfo once however many handles show it. A device supports this
 * unless MEMPLUG_FAKE_CUDA_NO_POSIX_FD=1 (read at the first cuInit): then
 * CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0 and
 * creating, exporting and importing such handles is CUDA_ERROR_NOT_SUPPORTED.
 * Fabric handles (CU_MEM_HANDLE_TYPE_FABRIC) are not modelled: the
 * attribute is 0 and the type is CUDA_ERROR_NOT_SUPPORTED. cuMemMap maps
 * any handle only at offset 0 (below), as the real driver does. */

#define HANDLE_TYPE_POSIX_FD 1u
#define ATTR_POSIX_FD_SUPPORTED 103
#define SHAREABLE_NAME "fake-cuda-shareable"
#define SHAREABLE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static struct phys *phys_of(CUmemGenericAllocationHandle h);

static int shareable_requested(const CUmemAllocationProp *p) {
    return (p->requestedHandleTypes & HANDLE_TYPE_POSIX_FD) != 0;
}

/* A handle-type mask cuMemCreate takes: none or POSIX fds (when offered). */
static int handle_types_ok(const CUmemAllocationProp *p) {
    if (p->requestedHandleTypes == 0)
        return 1;
    return p->requestedHandleTypes == HANDLE_TYPE_POSIX_FD && !__atomic_load_n(&g_no_posix_fd, __ATOMIC_RELAXED);
}

static unsigned long long fd_inode(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

/* A new sealed memfd of `size` bytes for a shareable handle, or -1. */
static int shareable_memfd(size_t size) {
    int fd = memfd_create(SHAREABLE_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)size) != 0 || fcntl(fd, F_ADD_SEALS, SHAREABLE_SEALS) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether `fd` is a descriptor this fake exported (here or in another
 * process): a memfd of that name, sealed so, read-write, whole granules. */
static int is_exported_memfd(int fd, size_t *size) {
    char link[64], target[256];
    struct stat st;
    ssize_t n;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || (fl & O_ACCMODE) != O_RDWR || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, target, sizeof target - 1);
    if (n < 0)
        return 0;
    target[n] = 0;
    if (strncmp(target, "/memfd:" SHAREABLE_NAME " ", strlen("/memfd:" SHAREABLE_NAME " ")) != 0)
        return 0;
    if (fcntl(fd, F_GET_SEALS) != SHAREABLE_SEALS || st.st_size <= 0 || (size_t)st.st_size % GRAN != 0)
        return 0;
    *size = (size_t)st.st_size;
    return 1;
}

/* The counting of `p`'s memory handed to another live handle of the same
 * memory, if there is one. g_lock held. */
static int pass_count_on(struct phys *p) {
    for (size_t i = 0; i < g_phys_len; i++) {
        struct phys *o = &g_phys[i];
        if (o != p && o->fd >= 0 && o->ino == p->ino && !o->counted) {
            o->counted = 1;
            return 1;
        }
    }
    return 0;
}

API CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                          unsigned int type, unsigned long long flags) {
    struct phys *p;
    int fd;
    CHECK_INIT_COUNTED(N_MEM_EXPORT);
    if (shareable == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != HANDLE_TYPE_POSIX_FD || __atomic_load_n(&g_no_posix_fd, __ATOMIC_RELAXED))
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    p = phys_of(handle);
    /* Only a handle made shareable that way exports (the driver documents
     * INVALID_VALUE, NOT_PERMITTED and NOT_SUPPORTED without saying which
     * this is; INVALID_VALUE is the one the fake answers). */
    if (p == NULL || !p->shareable) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The documentation promises neither a number above the standard
     * streams nor close-on-exec: the fake gives the lowest free number,
     * inheritable (a plain dup). */
    fd = dup(p->fd);
    pthread_mutex_unlock(&g_lock);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareable = fd;
    return CUDA_SUCCESS;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                            unsigned int type) {
    int fd = (int)(intptr_t)os_handle, mine, dev = 0;
    size_t size = 0;
    unsigned long long ino;
    struct phys *grown;
    int shown = 0;
    CHECK_INIT_COUNTED(N_MEM_IMPORT);
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != HANDLE_TYPE_POSIX_FD || __atomic_load_n(&g_no_posix_fd, __ATOMIC_RELAXED))
        return CUDA_ERROR_NOT_SUPPORTED;
    if (fd < 0 || !is_exported_memfd(fd, &size))
        return CUDA_ERROR_INVALID_VALUE;
    ino = fd_inode(fd);
    /* The caller keeps its descriptor (it closes it); the handle holds its
     * own. */
    mine = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (mine < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_phys_len; i++)
        if (g_phys[i].fd >= 0 && g_phys[i].ino == ino) {
            shown = 1;
            dev = g_phys[i].device;
            break;
        }
    /* Memory from another process lands on device 0 of this one (the fake
     * has no idea where it came from) and counts there. */
    if (!shown && size > available_locked(dev)) {
        pthread_mutex_unlock(&g_lock);
        close(mine);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    grown = realloc(g_phys, (g_phys_len + 1) * sizeof *g_phys);
    if (grown == NULL) {
        pthread_mutex_unlock(&g_lock);
        close(mine);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_phys = grown;
    g_phys[g_phys_len] = (struct phys){
        .fd = mine, .device = dev, .size = size, .shareable = 1, .counted = !shown, .ino = ino};
    g_phys_len++;
    if (!shown)
        g_used[dev] += size;
    *handle = g_phys_len;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle) {
    struct phys *p;
    CHECK_INIT();
    if (prop == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    p = phys_of(handle);
    if (p == NULL) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    memset(prop, 0, sizeof *prop);
    prop->type = 1; /* PINNED */
    prop->requestedHandleTypes = p->shareable ? HANDLE_TYPE_POSIX_FD : 0;
    prop->location.type = 1; /* DEVICE */
    prop->location.id = p->device;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* ---- end of shareable handles ---- */

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, unsigned int option) {
    CHECK_INIT();
    if (g == NULL || !valid_prop(prop) || option > 1)
        return CUDA_ERROR_INVALID_VALUE;
    *g = gran_of(prop);
    return CUDA_SUCCESS;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags) {
    size_t align = alignment == 0 ? GRAN : alignment;
    void *p;
    uintptr_t base;
    struct reservation *r;
    CHECK_INIT();
    (void)addr; /* a hint; the fake ignores it */
    if (ptr == NULL || size == 0 || size % GRAN != 0 || flags != 0 || (align & (align - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    p = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)p)
        munmap(p, base - (uintptr_t)p);
    if ((uintptr_t)p + size + align > base + size)
        munmap((void *)(base + size), (uintptr_t)p + size + align - (base + size));
    r = malloc(sizeof *r);
    if (r == NULL) {
        munmap((void *)base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->base = base;
    r->size = size;
    pthread_mutex_lock(&g_lock);
    r->next = g_reservations;
    g_reservations = r;
    pthread_mutex_unlock(&g_lock);
    *ptr = base;
    return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CHECK_INIT();
    pthread_mutex_lock(&g_lock);
    for (struct reservation **pp = &g_reservations; *pp; pp = &(*pp)->next) {
        struct reservation *r = *pp;
        if (r->base != ptr || r->size != size)
            continue;
        /* Strict: a range with mappings left is the caller's bug. */
        for (struct mapping *m = g_mappings; m; m = m->next)
            if (m->addr >= ptr && m->addr < ptr + size) {
                pthread_mutex_unlock(&g_lock);
                return CUDA_ERROR_INVALID_VALUE;
            }
        *pp = r->next;
        munmap((void *)(uintptr_t)ptr, size);
        pthread_mutex_unlock(&g_lock);
        free(r);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    int fd, dev;
    struct phys *grown;
    CHECK_INIT_COUNTED(N_MEM_CREATE);
    if (handle == NULL || size == 0 || flags != 0 || !valid_prop(prop) || size % gran_of(prop) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!handle_types_ok(prop))
        return CUDA_ERROR_NOT_SUPPORTED;
    if (prop->gpuDirectRDMACapable) {
        /* Asked of a device without RDMA on VMM: refused, as the flag is
         * documented only for devices reporting the attribute. */
        if (!rdma_supported())
            return CUDA_ERROR_INVALID_VALUE;
        __atomic_add_fetch(&g_rdma_creates, 1, __ATOMIC_RELAXED);
    }
    dev = prop->location.id;
    pthread_mutex_lock(&g_lock);
    if (++g_create_calls == g_fail_create_at) {
        /* The injected failure (MEMPLUG_FAKE_CUDA_FAIL_CREATE_AT). */
        g_create_failures++;
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (size > available_locked(dev)) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    fd = shareable_requested(prop) ? shareable_memfd(size) : memfd_create("fake-cuda-physical", MFD_CLOEXEC);
    if (fd < 0 || (!shareable_requested(prop) && ftruncate(fd, (off_t)size) != 0)) {
        if (fd >= 0)
            close(fd);
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    {
        /* Fresh device memory holds whatever was there before, as on a GPU:
         * a pattern, not zeros, so a missing zero-fill shows. */
        void *fill = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fill != MAP_FAILED) {
            memset(fill, FAKE_GARBAGE, size);
            munmap(fill, size);
        }
    }
    grown = realloc(g_phys, (g_phys_len + 1) * sizeof *g_phys);
    if (grown == NULL) {
        close(fd);
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_phys = grown;
    g_phys[g_phys_len].fd = fd;
    g_phys[g_phys_len].device = dev;
    g_phys[g_phys_len].released = 0;
    g_phys[g_phys_len].size = size;
    g_phys[g_phys_len].maps = 0;
    g_phys[g_phys_len].shareable = shareable_requested(prop);
    g_phys[g_phys_len].counted = 1;
    g_phys[g_phys_len].ino = fd_inode(fd);
    g_phys_len++;
    g_used[dev] += size;
    *handle = g_phys_len; /* index + 1: zero is never a handle */
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* The physical object a handle names, if it is live. g_lock held. */
static struct phys *phys_of(CUmemGenericAllocationHandle h) {
    if (h == 0 || h > g_phys_len || g_phys[h - 1].released)
        return NULL;
    return &g_phys[h - 1];
}

/* Frees the pages of an object that is released and no longer mapped. */
static void phys_maybe_free(struct phys *p) {
    if (p->released && p->maps == 0 && p->fd >= 0) {
        close(p->fd);
        p->fd = -1;
        /* Memory another live handle (an import) still shows stays
         * counted, now by that handle. */
        if (p->counted && !pass_count_on(p))
            g_used[p->device] -= p->size;
        p->counted = 0;
    }
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    struct phys *p;
    CHECK_INIT_COUNTED(N_MEM_RELEASE);
    pthread_mutex_lock(&g_lock);
    p = phys_of(handle);
    if (p == NULL) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    p->released = 1;
    phys_maybe_free(p);
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

static int reserved_locked(CUdeviceptr p, size_t n) {
    for (struct reservation *r = g_reservations; r; r = r->next)
        if (p >= r->base && p + n <= r->base + r->size)
            return 1;
    return 0;
}

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags) {
    struct phys *p;
    struct mapping *m;
    CHECK_INIT_COUNTED(N_MEM_MAP);
    /* As in the real driver, offset must (currently) be zero. */
    if (size == 0 || size % GRAN != 0 || ptr % GRAN != 0 || offset != 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    m = malloc(sizeof *m);
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    p = phys_of(handle);
    if (p == NULL || size > p->size || !reserved_locked(ptr, size)) {
        pthread_mutex_unlock(&g_lock);
        free(m);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (struct mapping *o = g_mappings; o; o = o->next)
        if (o->addr < ptr + size && ptr < o->addr + o->size) {
            pthread_mutex_unlock(&g_lock);
            free(m);
            return CUDA_ERROR_INVALID_VALUE;
        }
    if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, 0) == MAP_FAILED) {
        pthread_mutex_unlock(&g_lock);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->addr = ptr;
    m->size = size;
    m->handle = handle;
    m->prot = PROT_NONE;
    memset(m->peer_prot, 0, sizeof m->peer_prot);
    m->next = g_mappings;
    g_mappings = m;
    p->maps++;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* Whether mappings tile [p, p+n) with no gap. g_lock held. */
static int mapped_locked(CUdeviceptr p, size_t n) {
    CUdeviceptr end = p + n;
    while (p < end) {
        struct mapping *m;
        for (m = g_mappings; m; m = m->next)
            if (p >= m->addr && p < m->addr + m->size)
                break;
        if (m == NULL)
            return 0;
        p = m->addr + m->size;
    }
    return 1;
}

/* Whether `dev` is not the device owning the physical memory mapped at
 * `ptr` (the first mapping of the range decides; a range spans one
 * device's memory in every use the plugin makes). */
static int peer_of_range_locked(CUdeviceptr ptr, size_t size, int dev) {
    (void)size;
    for (struct mapping *m = g_mappings; m; m = m->next)
        if (ptr >= m->addr && ptr < m->addr + m->size) {
            size_t i = (size_t)m->handle - 1;
            return i < g_phys_len && g_phys[i].device != dev;
        }
    return 0;
}

API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    int prot;
    CHECK_INIT_COUNTED(N_MEM_SET_ACCESS);
    if (desc == NULL || count != 1 || size == 0 || desc->location.type != 1 ||
        !valid_device(desc->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    switch (desc->flags) {
    case 0: prot = PROT_NONE; break;
    case 1: prot = PROT_READ; break;
    case 3: prot = PROT_READ | PROT_WRITE; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    if (prot == PROT_READ && __atomic_load_n(&g_no_read_only, __ATOMIC_RELAXED))
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_lock);
    if (mapped_locked(ptr, size) && peer_of_range_locked(ptr, size, desc->location.id)) {
        /* Another device's access: recorded per mapping, never mprotect
         * (the host view is the owner's). Refused unless it is a peer. */
        CUresult r = CUDA_SUCCESS;
        if (!peers_allowed())
            r = CUDA_ERROR_INVALID_DEVICE;
        for (struct mapping *m = g_mappings; m && r == CUDA_SUCCESS; m = m->next)
            if (m->addr >= ptr && m->addr + m->size <= ptr + size)
                m->peer_prot[desc->location.id] = prot;
        pthread_mutex_unlock(&g_lock);
        return r;
    }
    if (!mapped_locked(ptr, size) || mprotect((void *)(uintptr_t)ptr, size, prot) != 0) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (struct mapping *m = g_mappings; m; m = m->next)
        if (m->addr >= ptr && m->addr + m->size <= ptr + size)
            m->prot = prot;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CUdeviceptr p = ptr, end = ptr + size;
    int whole = 0;
    CHECK_INIT_COUNTED(N_MEM_UNMAP);
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    /* The range must be made of whole mappings, with no gap (one call may
     * cover several adjacent mappings; with the UNMAP_ONE_MAPPING switch,
     * exactly one). */
    while (p < end) {
        struct mapping *m;
        for (m = g_mappings; m; m = m->next)
            if (m->addr == p)
                break;
        if (m == NULL || m->addr + m->size > end ||
            (++whole > 1 && __atomic_load_n(&g_unmap_one_mapping, __ATOMIC_RELAXED))) {
            pthread_mutex_unlock(&g_lock);
            return CUDA_ERROR_INVALID_VALUE;
        }
        p = m->addr + m->size;
    }
    if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0) == MAP_FAILED) {
        pthread_mutex_unlock(&g_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (struct mapping **pp = &g_mappings; *pp;) {
        struct mapping *m = *pp;
        if (m->addr >= ptr && m->addr < end) {
            struct phys *ph = &g_phys[m->handle - 1];
            *pp = m->next;
            ph->maps--;
            phys_maybe_free(ph);
            free(m);
        } else {
            pp = &m->next;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

#endif /* FAKE_CUDA_OMIT_VMM */

/* ---- introspection for tests (not part of any CUDA API) ---- */

API int fake_cuda_primary_ctx_refs(int dev) {
    int n;
    if (dev < 0 || dev >= MAX_DEVICES)
        return -1;
    pthread_mutex_lock(&g_lock);
    n = g_ctx[dev].refs;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* cuDevicePrimaryCtxRetain (which = 0) or cuDevicePrimaryCtxRelease_v2
 * (which = 1) calls made for device `dev` so far. */
API long fake_cuda_primary_ctx_calls(int dev, int which) {
    long n;
    if (dev < 0 || dev >= MAX_DEVICES)
        return -1;
    pthread_mutex_lock(&g_lock);
    n = (long)(which == 0 ? g_retain_calls[dev] : g_release_calls[dev]);
    pthread_mutex_unlock(&g_lock);
    return n;
}

API unsigned long long fake_cuda_used_bytes(int dev) {
    unsigned long long n;
    if (dev < 0 || dev >= MAX_DEVICES)
        return 0;
    pthread_mutex_lock(&g_lock);
    n = g_used[dev];
    pthread_mutex_unlock(&g_lock);
    return n;
}

API long fake_cuda_live_streams(void) {
    long n;
    pthread_mutex_lock(&g_lock);
    n = g_live_streams;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Makes device 0's context sticky-faulted (every later call in it returns
 * `code`, 700 when 0), as an illegal address in a kernel does. */
API void fake_cuda_sticky_fault(unsigned int code) {
    __atomic_store_n(&g_sticky[0], code == 0 ? CUDA_ERROR_ILLEGAL_ADDRESS : code, __ATOMIC_RELAXED);
}

/* Injects a sticky fault into device 0's context, as a kernel's illegal
 * address (700), a launch timeout (702) or a hardware error (714-719) does
 * on a real device: from now on every driver call made in that context but
 * the context-stack ones (push, pop, get current, primary release) returns
 * `code` (700 when `code` <= 0), for the rest of the process
 * (fake_cuda_clear_sticky excepted). Other devices' contexts keep working,
 * as on a real driver. Returns device 0's sticky code before (0: none). */
API int fake_cuda_inject_sticky_fault(int code) {
    unsigned int c = code <= 0 ? CUDA_ERROR_ILLEGAL_ADDRESS : (unsigned int)code;
    return (int)__atomic_exchange_n(&g_sticky[0], c, __ATOMIC_RELAXED);
}

/* The first sticky code in force on any device (0: none). */
API int fake_cuda_sticky_code(void) {
    for (int d = 0; d < MAX_DEVICES; d++) {
        unsigned int c = __atomic_load_n(&g_sticky[d], __ATOMIC_RELAXED);
        if (c != 0)
            return (int)c;
    }
    return 0;
}

/* The sticky code of device `dev`'s context (0: none; -1: no such device). */
API int fake_cuda_sticky_code_of(int dev) {
    return dev < 0 || dev >= MAX_DEVICES ? -1 : (int)__atomic_load_n(&g_sticky[dev], __ATOMIC_RELAXED);
}

/* Clears every sticky fault: for tests that probe a bad access on purpose
 * and go on in the same process (a real process would have to restart). */
API void fake_cuda_clear_sticky(void) {
    for (int d = 0; d < MAX_DEVICES; d++)
        __atomic_store_n(&g_sticky[d], 0, __ATOMIC_RELAXED);
}

/* Makes cuMemSetAccess refuse (on != 0) or accept (0) read-only access;
 * the refusal is CUDA_ERROR_NOT_SUPPORTED and changes nothing. Returns the
 * previous setting. */
API int fake_cuda_set_no_read_only(int on) {
    return __atomic_exchange_n(&g_no_read_only, on != 0, __ATOMIC_RELAXED);
}

/* Driver calls made so far (every entry point that checks initialisation). */
API long fake_cuda_calls(void) { return __atomic_load_n(&g_calls, __ATOMIC_RELAXED); }

/* Live driver objects of every kind, summed: allocations, pinned host
 * blocks, reservations,
 * physical objects whose pages are held, mappings, streams, events. */
API long fake_cuda_live_objects(void) {
    long n = 0;
    pthread_mutex_lock(&g_lock);
    for (struct alloc *a = g_allocs; a; a = a->next)
        n++;
    for (struct host_alloc *h = g_host_allocs; h; h = h->next)
        n++;
    for (struct reservation *r = g_reservations; r; r = r->next)
        n++;
    for (size_t i = 0; i < g_phys_len; i++)
        n += g_phys[i].fd >= 0;
    for (struct mapping *m = g_mappings; m; m = m->next)
        n++;
    n += g_live_streams + g_live_events;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Calls made so far to the entry point `name` (e.g. "cuMemUnmap"; the
 * counted ones are in g_counted_names), or -1 for a name not counted. */
API long fake_cuda_entry_calls(const char *name) {
    int i = counted_index(name);
    return i < 0 ? -1 : __atomic_load_n(&g_counts[i], __ATOMIC_RELAXED);
}

/* The next call of the counted entry point `name`, from any thread, waits
 * (before it does anything) until fake_cuda_release_blocked(). Returns 0,
 * or -1 for a name not counted. */
API int fake_cuda_block_next_call(const char *name) {
    int i = counted_index(name);
    if (i < 0)
        return -1;
    pthread_mutex_lock(&g_hook_lock);
    __atomic_store_n(&g_block_idx, i, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_hook_lock);
    return 0;
}

/* Waits until at least `n` calls are held by the hook, or `timeout_ms`
 * passed; returns how many are held. */
API int fake_cuda_wait_blocked(int n, int timeout_ms) {
    struct timespec until;
    int held;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g_hook_lock);
    while (g_blocked < n)
        if (pthread_cond_timedwait(&g_hook_cv, &g_hook_lock, &until) != 0)
            break;
    held = g_blocked;
    pthread_mutex_unlock(&g_hook_lock);
    return held;
}

/* Lets every call held by the hook go on (and disarms a pending block). */
API void fake_cuda_release_blocked(void) {
    pthread_mutex_lock(&g_hook_lock);
    __atomic_store_n(&g_block_idx, -1, __ATOMIC_RELEASE);
    g_release_gen++;
    pthread_cond_broadcast(&g_hook_cv);
    pthread_mutex_unlock(&g_hook_lock);
}

/* Makes the k-th cuMemCreate from now fail with CUDA_ERROR_OUT_OF_MEMORY
 * (once); k <= 0 disarms. Returns the cuMemCreate calls made so far. */
API long fake_cuda_fail_create_at(long k) {
    long n;
    pthread_mutex_lock(&g_lock);
    n = g_create_calls;
    g_fail_create_at = k > 0 ? n + k : 0;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* cuMemCreate calls failed on purpose so far. */
API long fake_cuda_create_failures(void) {
    long n;
    pthread_mutex_lock(&g_lock);
    n = g_create_failures;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Makes cuMemUnmap take exactly one mapping per call (on != 0), as a
 * stricter driver might; returns the previous setting. */
API int fake_cuda_set_unmap_one_mapping(int on) {
    return __atomic_exchange_n(&g_unmap_one_mapping, on != 0, __ATOMIC_RELAXED);
}

/* cuMemsetD8Async calls submitted to streams of priority `priority` (the
 * legacy stream and cuStreamCreate's have 0; the greatest is -5). */
API long fake_cuda_memsets_at_priority(int priority) {
    long n;
    if (priority > LEAST_PRIORITY || priority < GREATEST_PRIORITY)
        return -1;
    pthread_mutex_lock(&g_lock);
    n = g_memsets_at_priority[-priority];
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* cuEventSynchronize calls on blocking-sync events (blocking != 0: the
 * thread sleeps in the driver) or on the others (which spin on a GPU). */
API long fake_cuda_event_syncs(int blocking) {
    return __atomic_load_n(blocking ? &g_event_syncs_blocking : &g_event_syncs_spinning, __ATOMIC_RELAXED);
}

/* Threads inside cuEventSynchronize now. */
API long fake_cuda_threads_in_event_sync(void) { return __atomic_load_n(&g_in_event_sync, __ATOMIC_RELAXED); }

/* Events alive (created and not yet destroyed). */
API long fake_cuda_live_events(void) {
    long n;
    pthread_mutex_lock(&g_lock);
    n = g_live_events;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* Driver calls refused because a host function made them. */
API long fake_cuda_callback_refused(void) { return __atomic_load_n(&g_callback_refused, __ATOMIC_RELAXED); }

/* Device memory a live context takes off cuMemGetInfo's free figure. */
API unsigned long long fake_cuda_ctx_overhead_bytes(void) {
    unsigned long long n;
    pthread_mutex_lock(&g_lock);
    n = g_ctx_overhead;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* The access device `dev` was given to the mapping at `ptr` (PROT_* bits;
 * -1 if nothing is mapped there). For the owner, its mprotect; for a
 * peer, what cuMemSetAccess recorded. */
API int fake_cuda_access_of(unsigned long long ptr, int dev) {
    int prot = -1;
    if (dev < 0 || dev >= MAX_DEVICES)
        return -1;
    pthread_mutex_lock(&g_lock);
    for (struct mapping *m = g_mappings; m; m = m->next)
        if (ptr >= m->addr && ptr < m->addr + m->size) {
            size_t i = (size_t)m->handle - 1;
            int owner = i < g_phys_len ? g_phys[i].device : -1;
            prot = dev == owner ? m->prot : m->peer_prot[dev];
            break;
        }
    pthread_mutex_unlock(&g_lock);
    return prot;
}

/* cuMemCreate calls made with gpuDirectRDMACapable set. */
API long fake_cuda_rdma_creates(void) { return __atomic_load_n(&g_rdma_creates, __ATOMIC_RELAXED); }

/* Live cuMemHostAlloc blocks. */
API long fake_cuda_live_host_allocs(void) {
    long n = 0;
    pthread_mutex_lock(&g_lock);
    for (struct host_alloc *h = g_host_allocs; h; h = h->next)
        n++;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* The cuMemHostAlloc flags of the live pinned block holding `ptr`, or -1
 * when none does. */
API long fake_cuda_host_alloc_flags(unsigned long long ptr) {
    long flags = -1;
    pthread_mutex_lock(&g_lock);
    for (struct host_alloc *h = g_host_allocs; h; h = h->next)
        if (ptr >= h->ptr && ptr < h->ptr + h->len)
            flags = (long)h->flags;
    pthread_mutex_unlock(&g_lock);
    return flags;
}
