/*
 * copy.c: the plugin ABI 1.3 stream-ordered copy through the host C API
 * (C API 1.3) on the reference CPU plugin: the mechanism's copy kinds; a
 * copy ordered after a host function that writes its source (so it copies
 * what the function wrote, not what was there when the copy was queued);
 * a fence recorded after it completes after it; overlapping ranges, a
 * range past the address space and a destroyed stream refused; len 0 a
 * no-op.
 *
 *   copy PATH/TO/libmemplug_plugin_cpu.so
 *
 * Built with -Wall -Wextra -Wpedantic -Werror (C99); also run under
 * AddressSanitizer + UndefinedBehaviorSanitizer and valgrind. Prints
 * "N passed, N failed" and exits non-zero on any failure.
 */
#include "memplug_host.h"

#include "expect.h"

#include <stdint.h>
#include <stdio.h>

#define LEN 4096u

struct fill {
    unsigned char *at;
    unsigned char byte;
};

/* Runs on the stream's worker, before the copy queued after it. */
static void write_source(void *userdata) {
    struct fill *f = (struct fill *)userdata;
    memset(f->at, f->byte, LEN);
}

static int all(const unsigned char *p, unsigned char byte, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (p[i] != byte) return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation src = MEMPLUG_HOST_NULL_HANDLE_INIT, dst = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostStream s = MEMPLUG_HOST_NULL_HANDLE_INIT, gone = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostFence f = MEMPLUG_HOST_NULL_HANDLE_INIT;
    uint64_t src_addr = 0, dst_addr = 0;
    uint32_t kinds = 0;
    bool done = false;
    struct fill fill;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    EXPECT_OK(MEMPLUG_HOST_CHECK_API());
    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, argv[1]));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &mech));
    EXPECT_OK(memplug_host_mechanism_copy_kinds(mech, &kinds));
    EXPECT((kinds & MEMPLUG_COPY_HOST) != 0 && (kinds & MEMPLUG_COPY_DEVICE) != 0);
    EXPECT_STATUS(memplug_host_mechanism_copy_kinds(mech, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_OK(memplug_host_pool_create(m, "copy", 1u << 20, &pool));
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, NULL, &b));
    EXPECT_OK(memplug_host_allocate(b, LEN, 64, &src, &src_addr));
    EXPECT_OK(memplug_host_allocate(b, LEN, 64, &dst, &dst_addr));
    EXPECT_OK(memplug_host_stream_create(mech, &s));
    if (failed == 0) {
        memset((void *)(uintptr_t)src_addr, 0x11, LEN);
        memset((void *)(uintptr_t)dst_addr, 0x00, LEN);
        fill.at = (unsigned char *)(uintptr_t)src_addr;
        fill.byte = 0x5a;
        /* Queued in this order: the copy sees what the host function wrote. */
        EXPECT_OK(memplug_host_stream_enqueue(s, write_source, &fill));
        EXPECT_OK(memplug_host_stream_copy(s, dst_addr, src_addr, LEN));
        EXPECT_OK(memplug_host_fence_record(s, &f));
        EXPECT_OK(memplug_host_fence_wait(f, 10ull * 1000 * 1000 * 1000, &done));
        EXPECT(done);
        EXPECT(all((const unsigned char *)(uintptr_t)dst_addr, 0x5a, LEN));

        /* Refusals, before the plugin sees them; nothing is written. */
        EXPECT_STATUS(memplug_host_stream_copy(s, src_addr + 8, src_addr, 64), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
        EXPECT_MESSAGE("overlap");
        EXPECT_STATUS(memplug_host_stream_copy(s, UINT64_MAX - 4, src_addr, 64), MEMPLUG_HOST_STATUS_OUT_OF_RANGE);
        EXPECT_OK(memplug_host_stream_copy(s, dst_addr, src_addr, 0));
        EXPECT_OK(memplug_host_stream_create(mech, &gone));
        {
            MemplugHostStream stale = gone;
            EXPECT_OK(memplug_host_stream_destroy(gone));
            EXPECT_STATUS(memplug_host_stream_copy(stale, dst_addr, src_addr, 64), MEMPLUG_HOST_STATUS_STALE_HANDLE);
        }
        EXPECT(all((const unsigned char *)(uintptr_t)src_addr, 0x5a, LEN));
    }
    EXPECT_OK(memplug_host_fence_release(f));
    EXPECT_OK(memplug_host_stream_destroy(s));
    EXPECT_OK(memplug_host_allocation_free(src));
    EXPECT_OK(memplug_host_allocation_free(dst));
    EXPECT_OK(memplug_host_binding_destroy(b));
    EXPECT_OK(memplug_host_pool_release(pool));
    EXPECT_OK(memplug_host_mechanism_release(mech));
    EXPECT_OK(memplug_host_manager_destroy(m));
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
