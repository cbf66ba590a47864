/*
 * node.c: one budget across processes from C (C API 1.3) on the reference
 * CPU plugin: an authority embedded in this program
 * (memplug_host_manager_start_node_authority) and two managers joined to
 * it (memplug_host_manager_join_node), each a member of the node as a
 * separate process would be. A grant past the held budget leases a chunk;
 * a lease that does not fit presses the other member, whose holder frees
 * its blocks (a cross-member pressure ticket); the link statistics and
 * the authority's books agree and stay exact; an authority stopped and
 * started again is rejoined and counts each byte once; an authority with
 * a quota on this process's user refuses a lease past it and names the
 * quota; bad input is refused with a status and writes no out-parameter.
 *
 *   node PATH/TO/libmemplug_plugin_cpu.so
 *
 * Built with -Wall -Wextra -Wpedantic -Werror (C99); also run under
 * AddressSanitizer + UndefinedBehaviorSanitizer. Prints "N passed, N
 * failed" and exits non-zero on any failure.
 */
#define _POSIX_C_SOURCE 200809L

#include "memplug_host.h"

#include "expect.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024u * 1024u)
#define BLOCKS 6

/* The first member's blocks, which its holder frees under pressure. */
static MemplugHostAllocation blocks[BLOCKS];
static int tickets_seen;

static uint64_t free_blocks(void *userdata, const MemplugHostPressureTicket *t) {
    uint64_t freed = 0;
    int i;
    (void)userdata;
    tickets_seen++;
    for (i = 0; i < BLOCKS && freed < t->bytes_wanted; i++) {
        if (blocks[i].id != 0) {
            if (memplug_host_allocation_free(blocks[i]) == MEMPLUG_HOST_STATUS_OK) freed += MIB;
            blocks[i].id = 0;
        }
    }
    return freed;
}

static void sleep_ms(long ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

static MemplugHostNodeLinkStats link_stats(MemplugHostNodeLink link) {
    MemplugHostNodeLinkStats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_OK(memplug_host_node_link_stats(link, &s));
    return s;
}

/* The authority's books as JSON into `buf` (the size asked first). */
static void books(MemplugHostNodeAuthority a, char *buf, size_t cap) {
    size_t need = 0, written = 0;
    EXPECT_STATUS(memplug_host_node_authority_status(a, MEMPLUG_HOST_NODE_STATUS_JSON, NULL, 0, &need),
                  MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL);
    EXPECT(need > 1 && need <= cap);
    buf[0] = 0;
    EXPECT_OK(memplug_host_node_authority_status(a, MEMPLUG_HOST_NODE_STATUS_JSON, buf, cap, &written));
}

int main(int argc, char **argv) {
    MemplugHostManager m1 = MEMPLUG_HOST_NULL_HANDLE_INIT, m2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism c1 = MEMPLUG_HOST_NULL_HANDLE_INIT, c2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool p1 = MEMPLUG_HOST_NULL_HANDLE_INIT, p2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostHolder h1 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b1 = MEMPLUG_HOST_NULL_HANDLE_INIT, b2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation big = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostNodeAuthority a = MEMPLUG_HOST_NULL_HANDLE_INIT, untouched_a = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostNodeLink l1 = MEMPLUG_HOST_NULL_HANDLE_INIT, l2 = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostNodeLink untouched = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostNodeCapacity cap;
    MemplugHostNodeAuthorityOptions ao;
    MemplugHostNodeDevice dev;
    MemplugHostBindingOptions bo;
    MemplugHostNodeLinkStats s;
    uint64_t addr = 0;
    char path[108], missing[120], text[8192];
    size_t written = 0;
    const char *tmp = getenv("TMPDIR");
    int i;
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    /* A socket path must fit in sun_path: a long TMPDIR falls back to /tmp. */
    if (tmp == NULL || strlen(tmp) > 60) tmp = "/tmp";
    snprintf(path, sizeof path, "%s/memplug-node-c-%ld.sock", tmp, (long)getpid());
    snprintf(missing, sizeof missing, "%s/memplug-node-c-%ld.none", tmp, (long)getpid());

    EXPECT_OK(MEMPLUG_HOST_CHECK_API());
    EXPECT_OK(memplug_host_manager_create(&m1));
    EXPECT_OK(memplug_host_manager_create(&m2));
    EXPECT_OK(memplug_host_manager_load_plugin(m1, argv[1]));
    EXPECT_OK(memplug_host_manager_load_plugin(m2, argv[1]));
    EXPECT_OK(memplug_host_manager_find_mechanism(m1, "memplug-cpu/cpu", &c1));
    EXPECT_OK(memplug_host_manager_find_mechanism(m2, "memplug-cpu/cpu", &c2));

    /* The authority: 8 MiB of "cpu0" in 1 MiB chunks. */
    cap.device = "cpu0";
    cap.capacity = 8 * MIB;
    memset(&ao, 0, sizeof ao);
    ao.struct_size = sizeof ao;
    ao.chunk = MIB;
    ao.ticket_timeout_ns = 2000000000ull;
    EXPECT_STATUS(memplug_host_manager_start_node_authority(m1, path, &cap, 0, &ao, &untouched_a),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    ao.mode = 01777;
    EXPECT_STATUS(memplug_host_manager_start_node_authority(m1, path, &cap, 1, &ao, &untouched_a),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    ao.mode = 0;
    EXPECT_OK(memplug_host_manager_start_node_authority(m1, path, &cap, 1, &ao, &a));
    EXPECT_STATUS(memplug_host_manager_start_node_authority(m2, path, &cap, 1, &ao, &untouched_a),
                  MEMPLUG_HOST_STATUS_ALREADY_EXISTS);
    EXPECT(untouched_a.id == 0);

    /* The first member: a pool with nothing leased yet, its blocks held by
     * a holder that frees them when asked. */
    EXPECT_OK(memplug_host_pool_create(m1, "cpu0", 0, &p1));
    EXPECT_OK(memplug_host_holder_register(p1, "blocks", 0, free_blocks, NULL, &h1));
    memset(&bo, 0, sizeof bo);
    bo.struct_size = sizeof bo;
    bo.alloc_class = MEMPLUG_HOST_CLASS_KV;
    bo.holder = h1;
    bo.wait_ns = 2000000000ull;
    EXPECT_OK(memplug_host_binding_create(m1, c1, p1, &bo, &b1));

    /* Bad input: refused, nothing written, the pool as it was. */
    dev.device = "cpu0";
    dev.pool = p1;
    dev.priority = 0;
    dev.classes = 1u << MEMPLUG_HOST_CLASS_KV; /* its blocks are KV */
    EXPECT_STATUS(memplug_host_manager_join_node(m1, NULL, &dev, 1, NULL, &untouched),
                  MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_join_node(m1, path, &dev, 1, NULL, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_join_node(m1, path, &dev, 0, NULL, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_STATUS(memplug_host_manager_join_node(m1, missing, &dev, 1, NULL, &untouched),
                  MEMPLUG_HOST_STATUS_NOT_FOUND);
    EXPECT_MESSAGE("could not join the node");
    EXPECT_STATUS(memplug_host_manager_join_node(m2, path, &dev, 1, NULL, &untouched),
                  MEMPLUG_HOST_STATUS_WRONG_MANAGER);
    dev.device = "cuda7";
    EXPECT_STATUS(memplug_host_manager_join_node(m1, path, &dev, 1, NULL, &untouched),
                  MEMPLUG_HOST_STATUS_CALLBACK_REFUSED);
    EXPECT_MESSAGE("cuda7");
    dev.device = "cpu0";
    dev.classes = MEMPLUG_HOST_NODE_ALL_CLASSES + 1; /* a bit past the last class */
    EXPECT_STATUS(memplug_host_manager_join_node(m1, path, &dev, 1, NULL, &untouched),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    dev.classes = 1u << MEMPLUG_HOST_CLASS_KV;
    EXPECT(untouched.id == 0);

    EXPECT_OK(memplug_host_manager_join_node(m1, path, &dev, 1, NULL, &l1));
    EXPECT_STATUS(memplug_host_manager_join_node(m1, path, &dev, 1, NULL, &untouched),
                  MEMPLUG_HOST_STATUS_ALREADY_EXISTS);
    EXPECT_STATUS(memplug_host_node_link_stats(untouched, &s), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
    s = link_stats(l1);
    EXPECT(s.connected == 1 && s.chunk == MIB && s.held == 0 && s.joins == 1);

    /* Grants past the held budget lease chunks; inside it, none. */
    for (i = 0; i < BLOCKS; i++) EXPECT_OK(memplug_host_allocate(b1, MIB, 64, &blocks[i], &addr));
    s = link_stats(l1);
    EXPECT(s.used == BLOCKS * MIB && s.held >= BLOCKS * MIB && s.leases_granted >= 1);
    EXPECT(s.bytes_leased >= BLOCKS * MIB);

    /* The second member: 5 MiB do not fit in what is free (at most 2 MiB):
     * the authority presses the first, whose holder frees blocks. */
    EXPECT_OK(memplug_host_pool_create(m2, "cpu0", 0, &p2));
    memset(&bo, 0, sizeof bo);
    bo.struct_size = sizeof bo;
    bo.wait_ns = 3000000000ull;
    /* KV: the first member declared KV memory only, so only a KV request
     * presses it. */
    bo.alloc_class = MEMPLUG_HOST_CLASS_KV;
    EXPECT_OK(memplug_host_binding_create(m2, c2, p2, &bo, &b2));
    dev.pool = p2;
    dev.priority = 5;
    dev.classes = 0; /* any class */
    EXPECT_OK(memplug_host_manager_join_node(m2, path, &dev, 1, NULL, &l2));
    EXPECT_OK(memplug_host_allocate(b2, 5 * MIB, 64, &big, &addr));
    EXPECT(tickets_seen >= 1);
    s = link_stats(l1);
    /* What the holder freed is the ticket's answer (the link's idle return
     * leaves a device alone while a ticket is answered on it). */
    EXPECT(s.tickets_answered >= 1 && s.bytes_released >= 3 * MIB && s.used <= 3 * MIB);
    if (!(s.tickets_answered >= 1 && s.bytes_released >= 3 * MIB && s.used <= 3 * MIB))
        fprintf(stderr, "  first member: %llu tickets answered, %llu B released, %llu B returned, %llu B used\n",
                (unsigned long long)s.tickets_answered, (unsigned long long)s.bytes_released,
                (unsigned long long)s.bytes_returned, (unsigned long long)s.used);
    books(a, text, sizeof text);
    EXPECT(strstr(text, "\"books_exact\":true") != NULL);
    EXPECT(strstr(text, "\"tickets_sent\":") != NULL);

    /* The books through a link, both formats, and the text protocol. */
    EXPECT_STATUS(memplug_host_node_link_status(l2, 7, 1000000000ull, text, sizeof text, &written),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(memplug_host_node_link_status(l2, MEMPLUG_HOST_NODE_STATUS_PROMETHEUS, 1000000000ull, text,
                                            sizeof text, &written));
    EXPECT(strstr(text, "memplug_node_leased_bytes{device=\"cpu0\"}") != NULL && written == strlen(text));
    EXPECT_STATUS(memplug_host_node_link_last_error(l2, NULL, 0, &written), MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL);

    /* A node link is not an authority, and the other way round. */
    {
        MemplugHostNodeAuthority as_authority;
        MemplugHostNodeLink as_link;
        as_authority.id = l1.id;
        as_link.id = a.id;
        EXPECT_STATUS(memplug_host_node_authority_stop(as_authority), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
        EXPECT_STATUS(memplug_host_node_link_stats(as_link, &s), MEMPLUG_HOST_STATUS_INVALID_HANDLE);
        EXPECT_MESSAGE("not a node link");
    }

    /* The authority restarts: the links keep what they hold, rejoin, and
     * the new authority counts each byte once. */
    EXPECT_OK(memplug_host_node_authority_stop(a));
    for (i = 0; i < 100 && link_stats(l1).connected; i++) sleep_ms(10);
    EXPECT(link_stats(l1).connected == 0);
    EXPECT_OK(memplug_host_allocation_free(big)); /* while no authority: kept, idle */
    EXPECT_OK(memplug_host_manager_start_node_authority(m2, path, &cap, 1, &ao, &a));
    for (i = 0; i < 300 && (link_stats(l1).joins < 2 || link_stats(l2).joins < 2); i++) sleep_ms(10);
    EXPECT(link_stats(l1).joins == 2 && link_stats(l2).joins == 2);
    /* Idle chunks past the one kept go back on the link's tick. */
    for (i = 0; i < 300 && link_stats(l2).held > MIB; i++) sleep_ms(10);
    s = link_stats(l2);
    EXPECT(s.held <= MIB && s.used == 0 && s.bytes_returned >= 4 * MIB);
    books(a, text, sizeof text);
    EXPECT(strstr(text, "\"books_exact\":true") != NULL);
    {
        /* The authority's leased bytes are what the two links hold, once
         * the last Return sent has been read (a message may be in flight). */
        char want[64];
        int found = 0;
        for (i = 0; i < 300 && !found; i++) {
            uint64_t held = link_stats(l1).held + link_stats(l2).held;
            snprintf(want, sizeof want, "\"leased\":%llu", (unsigned long long)held);
            books(a, text, sizeof text);
            found = strstr(text, want) != NULL;
            if (!found) sleep_ms(10);
        }
        EXPECT(found);
    }

    /* Quotas (as memplug node serve --quota UID=BYTES): a bad list is
     * refused and serves nothing; this process's user may lease 1 MiB, so
     * a 2 MiB grant is refused and the link's last error names the quota. */
    {
        MemplugHostNodeQuota q[2];
        MemplugHostNodeAuthority qa = MEMPLUG_HOST_NULL_HANDLE_INIT;
        MemplugHostNodeLink ql = MEMPLUG_HOST_NULL_HANDLE_INIT;
        MemplugHostPool p3 = MEMPLUG_HOST_NULL_HANDLE_INIT;
        MemplugHostBinding b3 = MEMPLUG_HOST_NULL_HANDLE_INIT;
        MemplugHostAllocation small = MEMPLUG_HOST_NULL_HANDLE_INIT, over = MEMPLUG_HOST_NULL_HANDLE_INIT;
        char qpath[108], want[64];
        snprintf(qpath, sizeof qpath, "%s/memplug-node-cq-%ld.sock", tmp, (long)getpid());
        q[0].kind = MEMPLUG_HOST_NODE_QUOTA_USER;
        q[0].id = (uint32_t)geteuid();
        q[0].bytes = MIB;
        q[1] = q[0];
        ao.quotas = q;
        ao.quota_count = 2; /* the same user twice */
        EXPECT_STATUS(memplug_host_manager_start_node_authority(m2, qpath, &cap, 1, &ao, &qa),
                      MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
        EXPECT_MESSAGE("has a quota already");
        q[1].kind = 9;
        EXPECT_STATUS(memplug_host_manager_start_node_authority(m2, qpath, &cap, 1, &ao, &qa),
                      MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
        ao.quotas = NULL;
        EXPECT_STATUS(memplug_host_manager_start_node_authority(m2, qpath, &cap, 1, &ao, &qa),
                      MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
        EXPECT(qa.id == 0 && access(qpath, F_OK) != 0);
        ao.quotas = q;
        ao.quota_count = 1;
        EXPECT_OK(memplug_host_manager_start_node_authority(m2, qpath, &cap, 1, &ao, &qa));
        EXPECT_OK(memplug_host_pool_create(m2, "cpu0-quota", 0, &p3));
        memset(&bo, 0, sizeof bo);
        bo.struct_size = sizeof bo;
        EXPECT_OK(memplug_host_binding_create(m2, c2, p3, &bo, &b3));
        dev.pool = p3;
        dev.priority = 0;
        EXPECT_OK(memplug_host_manager_join_node(m2, qpath, &dev, 1, NULL, &ql));
        EXPECT_OK(memplug_host_allocate(b3, MIB / 2, 64, &small, &addr));
        EXPECT_STATUS(memplug_host_allocate(b3, MIB, 64, &over, &addr), MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
        EXPECT(over.id == 0);
        snprintf(want, sizeof want, "user %u's quota leaves", (unsigned)geteuid());
        EXPECT_OK(memplug_host_node_link_last_error(ql, text, sizeof text, &written));
        EXPECT(strstr(text, want) != NULL);
        if (strstr(text, want) == NULL) fprintf(stderr, "  the refusal: %s\n", text);
        EXPECT_OK(memplug_host_allocation_free(small));
        EXPECT_OK(memplug_host_node_link_leave(ql));
        EXPECT_OK(memplug_host_binding_destroy(b3));
        EXPECT_OK(memplug_host_pool_release(p3));
        EXPECT_OK(memplug_host_node_authority_stop(qa));
        ao.quotas = NULL;
        ao.quota_count = 0;
    }

    /* Leaving: the handle goes stale; the zero handle is a no-op. */
    EXPECT_OK(memplug_host_node_link_leave(l2));
    EXPECT_STATUS(memplug_host_node_link_stats(l2, &s), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_node_link_leave(untouched));
    EXPECT_OK(memplug_host_node_authority_stop(untouched_a));

    for (i = 0; i < BLOCKS; i++) EXPECT_OK(memplug_host_allocation_free(blocks[i]));
    EXPECT_OK(memplug_host_binding_destroy(b1));
    EXPECT_OK(memplug_host_binding_destroy(b2));
    EXPECT_OK(memplug_host_holder_unregister(h1));
    EXPECT_OK(memplug_host_pool_release(p1));
    EXPECT_OK(memplug_host_pool_release(p2));
    EXPECT_OK(memplug_host_mechanism_release(c1));
    EXPECT_OK(memplug_host_mechanism_release(c2));
    /* l1 and the second authority go with their managers. */
    EXPECT_OK(memplug_host_manager_destroy(m1));
    EXPECT_OK(memplug_host_manager_destroy(m2));
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
