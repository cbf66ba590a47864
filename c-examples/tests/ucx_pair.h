/*
 * ucx_pair.h: what the two-process UCX tests (ucx.c, ucx_alloc.c) share:
 * a manager with the CPU plugin, a pool, a binding and a UCX context over
 * TCP on loopback (open_env / close_env), the byte pattern both sides
 * check, and the main that skips without UCX, forks the child (the
 * puller) with a socket pair between the two, runs the owner here and
 * counts the child's result in.
 * Include after "memplug_host.h" and "expect.h".
 */
#ifndef MEMPLUG_C_TESTS_UCX_PAIR_H
#define MEMPLUG_C_TESTS_UCX_PAIR_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define WAIT_NS (20ull * 1000 * 1000 * 1000)
#define MIB (1024u * 1024u)
#define SETTINGS "TLS=tcp;NET_DEVICES=lo"

struct env {
    MemplugHostManager m;
    MemplugHostMechanism mech;
    MemplugHostPool pool;
    MemplugHostBinding b;
    MemplugHostUcx ucx;
};

static inline uint8_t byte_at(uint64_t i, uint8_t seed) { return (uint8_t)((i * 131u + seed) & 0xffu); }

static inline void open_env(struct env *e, const char *plugin, uint64_t budget) {
    memset(e, 0, sizeof *e);
    EXPECT_OK(memplug_host_manager_create(&e->m));
    EXPECT_OK(memplug_host_manager_load_plugin(e->m, plugin));
    EXPECT_OK(memplug_host_manager_find_mechanism(e->m, "memplug-cpu/cpu", &e->mech));
    EXPECT_OK(memplug_host_pool_create(e->m, "wire", budget, &e->pool));
    EXPECT_OK(memplug_host_binding_create(e->m, e->mech, e->pool, NULL, &e->b));
    EXPECT_OK(memplug_host_ucx_create(SETTINGS, &e->ucx));
}

static inline void close_env(struct env *e) {
    EXPECT_OK(memplug_host_ucx_destroy(e->ucx));
    EXPECT_OK(memplug_host_binding_destroy(e->b));
    EXPECT_OK(memplug_host_pool_release(e->pool));
    EXPECT_OK(memplug_host_mechanism_release(e->mech));
    EXPECT_OK(memplug_host_manager_destroy(e->m));
}

/* The test's main: `owner` runs here and `puller` in a forked child, each
 * with the plugin's path and its end of a socket pair. Exit 77 (skip, with
 * the reason) when UCX is not usable, 2 on bad usage, 1 when either side
 * failed. */
static inline int run_pair(int argc, char **argv, void (*owner)(const char *, int),
                           void (*puller)(const char *, int)) {
    int sv[2], status = 0;
    pid_t child;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    if (memplug_host_ucx_available() != MEMPLUG_HOST_STATUS_OK) {
        char why[512];
        memplug_host_last_error_message(why, sizeof why);
        printf("SKIP: UCX is not usable here: %s\n", why);
        return 77;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("socketpair");
        return 1;
    }
    fflush(NULL);
    child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        close(sv[0]);
        puller(argv[1], sv[1]);
        printf("child: %d passed, %d failed\n", passed, failed);
        fflush(NULL);
        _exit(failed == 0 ? 0 : 1);
    }
    close(sv[1]);
    owner(argv[1], sv[0]);
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "FAIL: the child failed (status %d)\n", status);
        failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}

#endif
