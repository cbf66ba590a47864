/*
 * ucx_alloc.c: allocations on the wire through the host C API
 * (memplug_host_ucx_register_allocation, _peer_pull_into_allocation,
 * _peer_push_from_allocation), between two processes (this one and a
 * forked child) over UCX's TCP transport on loopback, on the reference
 * CPU plugin:
 *  - the owner registers a 1 MiB allocation (pinned) and offers it, then
 *    frees it at once: the free returns, the handle is stale, and the
 *    bytes stay allocated and charged while registered (residency);
 *  - the child pulls the range into an allocation of its own, checks every
 *    byte, pushes one changed page back into the owner's (freed, pinned)
 *    allocation, starts a second pull and frees its allocation with the
 *    pull in flight (that free waits for the transfer), releases the range;
 *  - the owner sees the changed page, deregisters, and only then its pool
 *    goes back to 0; every pool is exact at the end;
 *  - refusals, out-params untouched: a bad access, a destination or
 *    source past the allocation, a length of 0, a freed allocation, a
 *    handle of another kind.
 * Skipped (exit 77, with the reason) when UCX is not installed.
 *
 *   ucx_alloc PATH/TO/libmemplug_plugin_cpu.so
 */
#define _POSIX_C_SOURCE 200809L

#include "memplug_host.h"

#include "expect.h"
#include "ucx_pair.h"

#include <time.h>

#define PAGE 4096u

/* Runs the manager's deferred frees until the pool uses `want` bytes or
 * the deadline passes; returns the use seen last. */
static uint64_t poll_until(struct env *e, uint64_t want) {
    struct timespec pause = {0, 1000 * 1000};
    uint64_t used = pool_used(e->pool);
    int i;
    for (i = 0; i < 10000 && used != want; i++) {
        EXPECT_OK(memplug_host_manager_poll(e->m, NULL));
        used = pool_used(e->pool);
        if (used != want) nanosleep(&pause, NULL);
    }
    return used;
}

/* The owner: a 1 MiB allocation, registered read-write, offered, freed. */
static void owner(const char *plugin, int fd) {
    struct env e;
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT, gone = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxRegistration reg = MEMPLUG_HOST_NULL_HANDLE_INIT, untouched = {42};
    MemplugHostUcxPeer peer = MEMPLUG_HOST_NULL_HANDLE_INIT;
    uint64_t addr = 0, i, id = 0;
    uint8_t *p;
    bool left = false;
    int ok = 1;

    open_env(&e, plugin, 16 * MIB);
    EXPECT_OK(memplug_host_allocate(e.b, MIB, PAGE, &a, &addr));
    p = (uint8_t *)(uintptr_t)addr;
    for (i = 0; i < MIB; i++) p[i] = byte_at(i, 3);

    /* Refusals: out-params untouched. */
    EXPECT_STATUS(memplug_host_ucx_register_allocation(e.ucx, e.mech, a, 9, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("neither MEMPLUG_HOST_UCX_ACCESS_READ");
    EXPECT_STATUS(memplug_host_ucx_register_allocation(e.ucx, e.mech, a, MEMPLUG_HOST_UCX_ACCESS_READ, NULL),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_OK(memplug_host_allocate(e.b, PAGE, PAGE, &gone, NULL));
    EXPECT_OK(memplug_host_allocation_free(gone));
    EXPECT_STATUS(memplug_host_ucx_register_allocation(e.ucx, e.mech, gone, MEMPLUG_HOST_UCX_ACCESS_READ, &untouched),
                  MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_MESSAGE("was freed");
    {
        /* A binding's handle where an allocation's belongs. */
        MemplugHostAllocation wrong = {e.b.id};
        EXPECT_STATUS(
            memplug_host_ucx_register_allocation(e.ucx, e.mech, wrong, MEMPLUG_HOST_UCX_ACCESS_READ, &untouched),
            MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    }
    EXPECT(untouched.id == 42);
    EXPECT(pool_used(e.pool) == MIB);

    EXPECT_OK(memplug_host_ucx_register_allocation(e.ucx, e.mech, a, MEMPLUG_HOST_UCX_ACCESS_READ_WRITE, &reg));
    EXPECT_OK(memplug_host_ucx_peer_connect(e.ucx, fd, MEMPLUG_HOST_UCX_ERRORS_PEER, WAIT_NS, &peer));
    EXPECT_OK(memplug_host_ucx_peer_offer(peer, reg, 91, &id));
    /* Residency: the free returns and the handle is stale, but the bytes
     * stay allocated and charged while the range is registered. */
    EXPECT_OK(memplug_host_allocation_free(a));
    EXPECT_STATUS(memplug_host_allocation_free(a), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_manager_poll(e.m, NULL));
    EXPECT(pool_used(e.pool) == MIB);
    /* The child pulls, pushes a page back, releases and leaves (TCP needs
     * this side's progress for its reads and writes). */
    EXPECT_OK(memplug_host_ucx_peer_serve(peer, WAIT_NS, &left));
    EXPECT(left);
    for (i = 0; i < MIB; i++) {
        uint8_t want = i < PAGE ? (uint8_t)~byte_at(i, 3) : byte_at(i, 3);
        if (p[i] != want) ok = 0;
    }
    EXPECT(ok); /* the pushed page landed in the pinned allocation */
    EXPECT_OK(memplug_host_manager_poll(e.m, NULL));
    EXPECT(pool_used(e.pool) == MIB); /* still registered: still charged */
    EXPECT_OK(memplug_host_ucx_deregister(reg));
    EXPECT(poll_until(&e, 0) == 0); /* freed once deregistered */
    EXPECT_OK(memplug_host_ucx_peer_destroy(peer));
    close_env(&e);
}

/* The child: pulls the offered MiB into an allocation of its own. */
static void puller(const char *plugin, int fd) {
    struct env e;
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT, gone = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxPeer peer = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxRemoteRange range;
    MemplugHostUcxTransfer t = MEMPLUG_HOST_NULL_HANDLE_INIT, none = {9};
    uint64_t addr = 0, i;
    uint8_t *p;
    int ok = 1;

    open_env(&e, plugin, 2 * MIB);
    /* The receiving side's charge is the allocation, made before any byte. */
    EXPECT_OK(memplug_host_allocate(e.b, MIB, PAGE, &a, &addr));
    EXPECT(pool_used(e.pool) == MIB);
    EXPECT_OK(memplug_host_ucx_peer_connect(e.ucx, fd, MEMPLUG_HOST_UCX_ERRORS_PEER, WAIT_NS, &peer));
    memset(&range, 0, sizeof range);
    EXPECT_OK(memplug_host_ucx_peer_next_offer(peer, WAIT_NS, &range));
    EXPECT(range.len == MIB && range.tag == 91 && range.writable == 1);

    /* Refusals, nothing moved, out-params untouched. */
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_allocation(peer, a, 1, &range, 0, MIB, &none),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not inside the allocation");
    EXPECT_STATUS(memplug_host_ucx_peer_push_from_allocation(peer, a, MIB - PAGE, &range, 0, 2 * PAGE, &none),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("source +");
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_allocation(peer, a, 0, &range, 0, 0, &none),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_allocation(peer, a, 0, &range, 1, MIB, &none),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_allocation(peer, a, 0, NULL, 0, MIB, &none),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_OK(memplug_host_allocate(e.b, PAGE, PAGE, &gone, NULL));
    EXPECT_OK(memplug_host_allocation_free(gone));
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_allocation(peer, gone, 0, &range, 0, PAGE, &none),
                  MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_MESSAGE("was freed");
    EXPECT(none.id == 9);

    EXPECT_OK(memplug_host_ucx_peer_pull_into_allocation(peer, a, 0, &range, 0, MIB, &t));
    EXPECT_OK(memplug_host_ucx_transfer_wait(t, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_transfer_release(t));
    p = (uint8_t *)(uintptr_t)addr;
    for (i = 0; i < MIB; i++) {
        if (p[i] != byte_at(i, 3)) ok = 0;
    }
    EXPECT(ok);
    EXPECT(pool_used(e.pool) == MIB); /* nothing charged beyond the allocation */

    for (i = 0; i < PAGE; i++) p[i] = (uint8_t)~p[i];
    EXPECT_OK(memplug_host_ucx_peer_push_from_allocation(peer, a, 0, &range, 0, PAGE, &t));
    EXPECT_OK(memplug_host_ucx_transfer_wait(t, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_transfer_release(t));
    /* A pull still in flight when the allocation is freed: the free
     * returns, and the bytes go only once the transfer is done. */
    EXPECT_OK(memplug_host_ucx_peer_pull_into_allocation(peer, a, PAGE, &range, PAGE, MIB - PAGE, &t));
    EXPECT_OK(memplug_host_allocation_free(a));
    EXPECT_OK(memplug_host_ucx_transfer_wait(t, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_transfer_release(t));
    EXPECT(poll_until(&e, 0) == 0);
    EXPECT_OK(memplug_host_ucx_peer_release(peer, &range, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_peer_destroy(peer));
    EXPECT(pool_used(e.pool) == 0);
    close_env(&e);
}

int main(int argc, char **argv) { return run_pair(argc, argv, owner, puller); }
