/*
 * expect.h: the checks the C tests of the host API share. Each test is one
 * program: these count into its own `passed` and `failed`, print each
 * failure with its line, and main reports both counts.
 */
#ifndef MEMPLUG_C_TESTS_EXPECT_H
#define MEMPLUG_C_TESTS_EXPECT_H

#include "memplug_host.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int passed, failed;

static inline void expect_status(MemplugHostStatus got, MemplugHostStatus want, const char *what, int line) {
    if (got == want) {
        passed++;
    } else {
        char msg[512];
        memplug_host_last_error_message(msg, sizeof msg);
        fprintf(stderr, "FAIL line %d: %s: got %s, want %s (%s)\n", line, what, memplug_host_status_name(got),
                memplug_host_status_name(want), msg);
        failed++;
    }
}

static inline void expect_true(int cond, const char *what, int line) {
    if (cond) {
        passed++;
    } else {
        fprintf(stderr, "FAIL line %d: %s\n", line, what);
        failed++;
    }
}

/* The last error message contains `part`. */
static inline void expect_message(const char *part, int line) {
    char msg[1024];
    memplug_host_last_error_message(msg, sizeof msg);
    if (strstr(msg, part) != NULL) {
        passed++;
    } else {
        fprintf(stderr, "FAIL line %d: the last error \"%s\" does not contain \"%s\"\n", line, msg, part);
        failed++;
    }
}

#define EXPECT_STATUS(call, want) expect_status((call), (want), #call, __LINE__)
#define EXPECT_OK(call) expect_status((call), MEMPLUG_HOST_STATUS_OK, #call, __LINE__)
#define EXPECT(cond) expect_true((cond) ? 1 : 0, #cond, __LINE__)
#define EXPECT_MESSAGE(part) expect_message((part), __LINE__)

/* A pool's use now (memplug_host_pool_stats). */
static inline uint64_t pool_used(MemplugHostPool pool) {
    MemplugHostPoolStats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    expect_status(memplug_host_pool_stats(pool, &s), MEMPLUG_HOST_STATUS_OK, "memplug_host_pool_stats", __LINE__);
    return s.used;
}

/* A runtime fence the test completes by hand: pass hand_fence_query,
 * hand_fence_wait and a `struct hand_fence *` to
 * memplug_host_fence_from_callbacks, then set `done`. */
struct hand_fence {
    volatile int done;
};

static inline bool hand_fence_query(void *userdata) {
    return ((struct hand_fence *)userdata)->done != 0;
}

static inline bool hand_fence_wait(void *userdata, uint64_t timeout_ns) {
    (void)timeout_ns;
    return ((struct hand_fence *)userdata)->done != 0;
}

#endif
