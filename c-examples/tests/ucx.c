/*
 * ucx.c: memory on the wire through the host C API (memplug_host_ucx_*),
 * between two processes (this one and a forked child) over UCX's TCP
 * transport on loopback, on the reference CPU plugin:
 *  - the owner registers 1 MiB of a region (pinned) and offers it; while
 *    the child holds it, deregistering is BUSY;
 *  - the child pulls it into a region of its own at its own address (the
 *    region grows first, charged to its pool: exact afterwards), checks
 *    every byte, pushes one changed page back, releases the range;
 *  - the owner sees the changed page, and deregisters;
 *  - a second range whose handle the owner releases at once (the child
 *    still holds it) stays registered until the child gives it back: the
 *    child still reads it, and the owner's region frees afterwards;
 *  - a pull beyond the child's budget is OUT_OF_BUDGET with nothing
 *    charged; bad access, empty ranges, a released range, forged and zero
 *    handles, a descriptor that is no socket: each a status, out-params
 *    untouched.
 * Skipped (exit 77, with the reason) when UCX is not installed.
 *
 *   ucx PATH/TO/libmemplug_plugin_cpu.so
 */
#define _POSIX_C_SOURCE 200809L

#include "memplug_host.h"

#include "expect.h"
#include "ucx_pair.h"

static uint64_t region_addr(MemplugHostRegion r) {
    MemplugHostRegionInfo info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_OK(memplug_host_region_info(r, &info));
    return info.addr;
}

/* The owner: 1 MiB of a region, registered read-write and offered. */
static void owner(const char *plugin, int fd) {
    struct env e;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxRegistration reg = MEMPLUG_HOST_NULL_HANDLE_INIT, untouched = {42};
    MemplugHostUcxRegistration tail = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxPeer peer = MEMPLUG_HOST_NULL_HANDLE_INIT;
    uint8_t *p;
    uint64_t i, id = 0;
    bool left = false;
    int ok = 1;

    open_env(&e, plugin, 16 * MIB);
    EXPECT_OK(memplug_host_region_reserve(e.b, 8 * MIB, &r));
    EXPECT_OK(memplug_host_region_grow(r, MIB, NULL, NULL));
    p = (uint8_t *)(uintptr_t)region_addr(r);
    for (i = 0; i < MIB; i++) p[i] = byte_at(i, 5);

    /* Refusals: out-params untouched. */
    EXPECT_STATUS(memplug_host_ucx_register_region(e.ucx, e.mech, r, 0, MIB, 9, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_ucx_register_region(e.ucx, e.mech, r, 0, 0, MEMPLUG_HOST_UCX_ACCESS_READ, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(
        memplug_host_ucx_register_region(e.ucx, e.mech, r, MIB, 1, MEMPLUG_HOST_UCX_ACCESS_READ, &untouched),
        MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not inside the region");
    EXPECT(untouched.id == 42);
    EXPECT_STATUS(memplug_host_ucx_register_region(e.ucx, e.mech, r, 0, MIB, MEMPLUG_HOST_UCX_ACCESS_READ, NULL),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    {
        MemplugHostUcx forged = {0xF10000001FFFFFFFull}; /* an index never issued */
        EXPECT_STATUS(memplug_host_ucx_register_region(forged, e.mech, r, 0, MIB, MEMPLUG_HOST_UCX_ACCESS_READ, &reg),
                      MEMPLUG_HOST_STATUS_INVALID_HANDLE);
        EXPECT_STATUS(memplug_host_ucx_destroy(forged), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    }
    EXPECT_OK(memplug_host_ucx_deregister(reg)); /* the zero handle: a no-op */
    {
        MemplugHostUcxPeer none = {7};
        EXPECT_STATUS(memplug_host_ucx_peer_connect(e.ucx, 0, MEMPLUG_HOST_UCX_ERRORS_PEER, 1000, &none),
                      MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
        EXPECT_MESSAGE("not a socket");
        EXPECT(none.id == 7);
    }

    EXPECT_OK(memplug_host_ucx_register_region(e.ucx, e.mech, r, 0, MIB, MEMPLUG_HOST_UCX_ACCESS_READ_WRITE, &reg));
    EXPECT_OK(memplug_host_ucx_peer_connect(e.ucx, fd, MEMPLUG_HOST_UCX_ERRORS_PEER, WAIT_NS, &peer));
    EXPECT_OK(memplug_host_ucx_peer_offer(peer, reg, 77, &id));
    /* The last page again, offered and its handle released at once: the
     * child's hold keeps it registered (and the region pinned). */
    EXPECT_OK(memplug_host_ucx_register_region(e.ucx, e.mech, r, MIB - 4096, 4096, MEMPLUG_HOST_UCX_ACCESS_READ, &tail));
    EXPECT_OK(memplug_host_ucx_peer_offer(peer, tail, 78, &id));
    EXPECT_OK(memplug_host_ucx_registration_release(tail));
    EXPECT_STATUS(memplug_host_ucx_deregister(tail), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    {
        MemplugHostUcxRegistration none = MEMPLUG_HOST_NULL_HANDLE_INIT;
        EXPECT_OK(memplug_host_ucx_registration_release(none)); /* the zero handle: a no-op */
    }
    /* Held by the peer: pinned, not deregistrable. */
    EXPECT_STATUS(memplug_host_ucx_deregister(reg), MEMPLUG_HOST_STATUS_BUSY);
    EXPECT_MESSAGE("hold the remote key");
    /* The child pulls, pushes, releases and leaves (TCP needs this side's
     * progress for its reads and writes). */
    EXPECT_OK(memplug_host_ucx_peer_serve(peer, WAIT_NS, &left));
    EXPECT(left);
    for (i = 0; i < MIB; i++) {
        uint8_t want = i < 4096 ? (uint8_t)~byte_at(i, 5) : byte_at(i, 5);
        if (p[i] != want) ok = 0;
    }
    EXPECT(ok); /* the pushed page landed; the rest is as it was */
    EXPECT_OK(memplug_host_ucx_deregister(reg));
    EXPECT_STATUS(memplug_host_ucx_deregister(reg), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_ucx_peer_destroy(peer));
    EXPECT_OK(memplug_host_region_free(r));
    EXPECT(pool_used(e.pool) == 0);
    close_env(&e);
}

/* The child: pulls the offered MiB into a region of its own. */
static void puller(const char *plugin, int fd) {
    struct env e;
    MemplugHostRegion r = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxPeer peer = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostUcxRemoteRange range, bad, last;
    MemplugHostUcxTransfer t = MEMPLUG_HOST_NULL_HANDLE_INIT, none = {9};
    uint8_t *p;
    uint64_t i;
    int ok = 1;

    /* 2 MiB of budget: the 1 MiB pull fits, a 3 MiB destination does not. */
    open_env(&e, plugin, 2 * MIB);
    EXPECT_OK(memplug_host_region_reserve(e.b, 8 * MIB, &r));
    EXPECT_OK(memplug_host_ucx_peer_connect(e.ucx, fd, MEMPLUG_HOST_UCX_ERRORS_PEER, WAIT_NS, &peer));
    memset(&range, 0, sizeof range);
    EXPECT_OK(memplug_host_ucx_peer_next_offer(peer, WAIT_NS, &range));
    EXPECT(range.len == MIB && range.tag == 77 && range.writable == 1);
    memset(&last, 0, sizeof last);
    EXPECT_OK(memplug_host_ucx_peer_next_offer(peer, WAIT_NS, &last));
    EXPECT(last.len == 4096 && last.tag == 78 && last.writable == 0);

    /* Beyond the budget: refused before any byte moves, nothing charged. */
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_region(peer, r, 2 * MIB, &range, 0, MIB, &none),
                  MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    EXPECT(none.id == 9 && pool_used(e.pool) == 0);
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_region(peer, r, 0, &range, 1, MIB, &none),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_region(peer, r, 0, NULL, 0, MIB, &none),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);

    EXPECT_OK(memplug_host_ucx_peer_pull_into_region(peer, r, 0, &range, 0, MIB, &t));
    EXPECT_OK(memplug_host_ucx_transfer_wait(t, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_transfer_release(t));
    EXPECT(pool_used(e.pool) == MIB);
    p = (uint8_t *)(uintptr_t)region_addr(r);
    for (i = 0; i < MIB; i++) {
        if (p[i] != byte_at(i, 5)) ok = 0;
    }
    EXPECT(ok);

    for (i = 0; i < 4096; i++) p[i] = (uint8_t)~p[i];
    EXPECT_OK(memplug_host_ucx_peer_push_from_region(peer, r, 0, &range, 0, 4096, &t));
    EXPECT_OK(memplug_host_ucx_transfer_wait(t, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_transfer_release(t));
    EXPECT_OK(memplug_host_ucx_peer_release(peer, &range, WAIT_NS));
    /* The range whose owner dropped its handle: still registered while held. */
    EXPECT_OK(memplug_host_ucx_peer_pull_into_region(peer, r, 2 * MIB - 4096, &last, 0, 4096, &t));
    EXPECT_OK(memplug_host_ucx_transfer_wait(t, WAIT_NS));
    EXPECT_OK(memplug_host_ucx_transfer_release(t));
    ok = 1;
    for (i = 0; i < 4096; i++) {
        if (p[2 * MIB - 4096 + i] != byte_at(MIB - 4096 + i, 5)) ok = 0;
    }
    EXPECT(ok);
    EXPECT_OK(memplug_host_ucx_peer_release(peer, &last, WAIT_NS));
    /* Released: the range is no longer usable here. */
    EXPECT_STATUS(memplug_host_ucx_peer_pull_into_region(peer, r, 0, &range, 0, 16, &none),
                  MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT_MESSAGE("released by this side");
    bad = range;
    bad.id = 999;
    EXPECT_STATUS(memplug_host_ucx_peer_release(peer, &bad, WAIT_NS), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(memplug_host_ucx_peer_destroy(peer));
    EXPECT_STATUS(memplug_host_ucx_transfer_release(none), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    EXPECT_OK(memplug_host_region_free(r));
    EXPECT(pool_used(e.pool) == 0);
    close_env(&e);
}

int main(int argc, char **argv) { return run_pair(argc, argv, owner, puller); }
