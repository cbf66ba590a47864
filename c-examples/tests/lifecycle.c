/*
 * lifecycle.c: mechanism lives through the host C API.
 *
 *   1. A loss declared by the runtime on the reference CPU plugin: the
 *      subscriber is told LOST (during memplug_host_mechanism_declare_lost,
 *      on this thread) with one loss notice naming the pool, the holder, the
 *      class, the objects and their bytes; new work fails with
 *      MEMPLUG_HOST_STATUS_DEVICE_LOST; the next poll terminates the context
 *      and tells TERMINATED with a settlement of exactly the bytes that were
 *      allocated; destroying the allocation handles afterwards succeeds and
 *      refunds nothing twice (the pool's use stays 0). From inside the
 *      callback, a poll is refused as re-entrant.
 *   2. Retirement and replacement: the CPU plugin's mechanism replaced by
 *      the C example plugin's (both serve CPU 0; two copies of the CPU
 *      plugin cannot be loaded into one manager, their plugin name being the
 *      same — that refusal is checked too): a binding asked of the old
 *      mechanism is made on the new one, the old one's objects keep working,
 *      and once its last is freed a poll terminates it and unloads its plugin.
 *
 *   lifecycle PATH/TO/libmemplug_plugin_cpu.so PATH/TO/libmemplug_example_plugin.so
 *
 * Built with -Wall -Wextra -Wpedantic -Werror (C99); also run under
 * AddressSanitizer + UndefinedBehaviorSanitizer and valgrind. Prints
 * "N passed, N failed" and exits non-zero on any failure.
 */
#include "memplug_host.h"

#include "expect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- what the subscriber saw ------------------------------------------- */

#define MAX_SEEN 8

struct seen {
    MemplugHostLifeState from, to;
    MemplugHostSubscription subscription;
    char context[64];
    char reason[256];
    int has_reason;
    size_t notice_count;
    /* The first notice. */
    char pool[64];
    uint64_t holder_id, objects, bytes, quarantined;
    uint32_t alloc_class;
    int has_settlement;
    MemplugHostSettlement settlement;
    MemplugHostStatus poll_inside;
};

struct recorder {
    MemplugHostManager manager;
    int count;
    struct seen seen[MAX_SEEN];
};

static void copy_text(char *dst, size_t cap, const char *src, size_t len) {
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void on_event(void *userdata, const MemplugHostLifecycleEvent *e) {
    struct recorder *r = (struct recorder *)userdata;
    struct seen *s;
    if (r->count >= MAX_SEEN) return;
    s = &r->seen[r->count++];
    memset(s, 0, sizeof *s);
    s->from = e->from;
    s->to = e->to;
    s->subscription = e->subscription;
    copy_text(s->context, sizeof s->context, e->context, e->context_len);
    if (e->reason != NULL) {
        s->has_reason = 1;
        copy_text(s->reason, sizeof s->reason, e->reason, e->reason_len);
    }
    s->notice_count = e->notice_count;
    if (e->notice_count > 0) {
        /* Stepped by notice_size, as the header asks (here: the first). */
        const MemplugHostLossNotice *n = (const MemplugHostLossNotice *)(const void *)((const char *)e->notices);
        copy_text(s->pool, sizeof s->pool, n->pool_name, n->pool_name_len);
        s->holder_id = n->holder_id;
        s->objects = n->objects;
        s->bytes = n->bytes;
        s->quarantined = n->quarantined_bytes;
        s->alloc_class = n->alloc_class;
    }
    if (e->settlement != NULL) {
        s->has_settlement = 1;
        s->settlement = *e->settlement;
    }
    /* Delivering events from inside a lifecycle callback is refused. */
    s->poll_inside = memplug_host_manager_poll(r->manager, NULL);
}

/* ---- helpers ----------------------------------------------------------- */

static uint64_t allocation_size(MemplugHostAllocation a) {
    MemplugHostAllocationInfo i;
    memset(&i, 0, sizeof i);
    i.struct_size = sizeof i;
    EXPECT_OK(memplug_host_allocation_info(a, &i));
    return i.size;
}

static MemplugHostLifeState state_of(MemplugHostMechanism m) {
    MemplugHostLifeState s = MEMPLUG_HOST_LIFE_STATE_ACTIVE;
    EXPECT_OK(memplug_host_mechanism_state(m, &s));
    return s;
}

static MemplugHostMechanismInfo binding_mechanism(MemplugHostBinding b) {
    MemplugHostMechanismInfo i;
    memset(&i, 0, sizeof i);
    i.struct_size = sizeof i;
    EXPECT_OK(memplug_host_binding_mechanism_info(b, &i));
    return i;
}

/* ---- 1. a declared loss -------------------------------------------------- */

static void declared_loss(const char *cpu_plugin) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostHolder holder = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding binding = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding refused = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostSubscription sub = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation a[3] = {MEMPLUG_HOST_NULL_HANDLE_INIT, MEMPLUG_HOST_NULL_HANDLE_INIT,
                                  MEMPLUG_HOST_NULL_HANDLE_INIT};
    MemplugHostAllocation none = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBindingOptions opts;
    MemplugHostSettlement settled;
    struct recorder *rec = (struct recorder *)calloc(1, sizeof *rec);
    static const uint64_t sizes[3] = {1000, 5000, 64};
    uint64_t holder_id = 0, charged = 0;
    bool moved = false, lost = false;
    char reason[256];
    size_t reason_len = 0;
    int i;

    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, cpu_plugin));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &mech));
    EXPECT_OK(memplug_host_pool_create(m, "gpu0", 1u << 24, &pool));
    EXPECT_OK(memplug_host_holder_register(pool, "kv", 1, NULL, NULL, &holder));
    EXPECT_OK(memplug_host_holder_id(holder, &holder_id));
    EXPECT(holder_id != 0);
    memset(&opts, 0, sizeof opts);
    opts.struct_size = sizeof opts;
    opts.alloc_class = MEMPLUG_HOST_CLASS_KV;
    opts.holder = holder;
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, &opts, &binding));

    rec->manager = m;
    EXPECT_STATUS(memplug_host_mechanism_subscribe(mech, NULL, rec, &sub), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT(sub.id == 0);
    EXPECT_OK(memplug_host_mechanism_subscribe(mech, on_event, rec, &sub));
    EXPECT(sub.id != 0);
    EXPECT(state_of(mech) == MEMPLUG_HOST_LIFE_STATE_ACTIVE);

    for (i = 0; i < 3; i++) {
        EXPECT_OK(memplug_host_allocate(binding, sizes[i], 64, &a[i], NULL));
        charged += allocation_size(a[i]);
    }
    EXPECT(charged >= 1000 + 5000 + 64);
    EXPECT(pool_used(pool) == charged);
    EXPECT_OK(memplug_host_allocation_is_lost(a[0], &lost));
    EXPECT(!lost);

    /* The loss, told at once with its notice. */
    EXPECT_OK(memplug_host_mechanism_declare_lost(mech, "illegal address in kernel 7", &moved));
    EXPECT(moved);
    EXPECT(state_of(mech) == MEMPLUG_HOST_LIFE_STATE_LOST);
    EXPECT(rec->count == 1);
    EXPECT(rec->seen[0].from == MEMPLUG_HOST_LIFE_STATE_ACTIVE && rec->seen[0].to == MEMPLUG_HOST_LIFE_STATE_LOST);
    EXPECT(rec->seen[0].subscription.id == sub.id);
    EXPECT(strcmp(rec->seen[0].context, "memplug-cpu/cpu") == 0);
    EXPECT(rec->seen[0].has_reason && strstr(rec->seen[0].reason, "illegal address in kernel 7") != NULL);
    EXPECT(rec->seen[0].notice_count == 1);
    EXPECT(strcmp(rec->seen[0].pool, "gpu0") == 0);
    EXPECT(rec->seen[0].holder_id == holder_id);
    EXPECT(rec->seen[0].alloc_class == MEMPLUG_HOST_CLASS_KV);
    EXPECT(rec->seen[0].objects == 3);
    EXPECT(rec->seen[0].bytes == charged);
    EXPECT(rec->seen[0].quarantined == 0);
    EXPECT(!rec->seen[0].has_settlement);
    EXPECT(rec->seen[0].poll_inside == MEMPLUG_HOST_STATUS_REENTRANT);
    EXPECT_OK(memplug_host_mechanism_reason(mech, reason, sizeof reason, &reason_len));
    EXPECT(reason_len > 0 && strstr(reason, "illegal address in kernel 7") != NULL);
    EXPECT_OK(memplug_host_mechanism_declare_lost(mech, "again", &moved));
    EXPECT(!moved);
    EXPECT(rec->count == 1);

    /* No new work; the objects went with the device. */
    EXPECT_STATUS(memplug_host_allocate(binding, 64, 64, &none, NULL), MEMPLUG_HOST_STATUS_DEVICE_LOST);
    EXPECT(none.id == 0);
    EXPECT_STATUS(memplug_host_binding_create(m, mech, pool, NULL, &refused), MEMPLUG_HOST_STATUS_DEVICE_LOST);
    EXPECT_OK(memplug_host_allocation_is_lost(a[1], &lost));
    EXPECT(lost);
    memset(&settled, 0, sizeof settled);
    settled.struct_size = sizeof settled;
    EXPECT_STATUS(memplug_host_mechanism_settlement(mech, &settled), MEMPLUG_HOST_STATUS_NOT_READY);
    EXPECT(pool_used(pool) == charged);

    /* The poll terminates it and settles exactly what was charged. */
    EXPECT_OK(memplug_host_manager_poll(m, NULL));
    EXPECT(state_of(mech) == MEMPLUG_HOST_LIFE_STATE_TERMINATED);
    EXPECT(rec->count == 2);
    EXPECT(rec->seen[1].from == MEMPLUG_HOST_LIFE_STATE_LOST && rec->seen[1].to == MEMPLUG_HOST_LIFE_STATE_TERMINATED);
    EXPECT(rec->seen[1].notice_count == 0);
    EXPECT(rec->seen[1].has_settlement);
    EXPECT(rec->seen[1].settlement.after_loss == 1);
    EXPECT(rec->seen[1].settlement.bytes == charged);
    EXPECT(rec->seen[1].settlement.leases == 3);
    EXPECT(rec->seen[1].settlement.bindings == 1);
    EXPECT_OK(memplug_host_mechanism_settlement(mech, &settled));
    EXPECT(settled.bytes == charged && settled.after_loss == 1);
    EXPECT(pool_used(pool) == 0);

    /* Destroying the handles afterwards: fine, and nothing refunded twice. */
    for (i = 0; i < 3; i++) EXPECT_OK(memplug_host_allocation_free(a[i]));
    EXPECT(pool_used(pool) == 0);
    EXPECT_STATUS(memplug_host_manager_terminate(m, mech, 0, NULL), MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT_OK(memplug_host_manager_poll(m, NULL));
    EXPECT(rec->count == 2);

    EXPECT_OK(memplug_host_mechanism_unsubscribe(sub));
    EXPECT_STATUS(memplug_host_mechanism_unsubscribe(sub), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    EXPECT_OK(memplug_host_binding_destroy(binding));
    EXPECT_OK(memplug_host_holder_unregister(holder));
    EXPECT_OK(memplug_host_pool_release(pool));
    EXPECT_OK(memplug_host_mechanism_release(mech));
    EXPECT_OK(memplug_host_manager_destroy(m));
    free(rec);
}

/* ---- 2. retirement and replacement --------------------------------------- */

static void replacement(const char *cpu_plugin, const char *example_plugin, const char *cpu_copy) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism old_mech = MEMPLUG_HOST_NULL_HANDLE_INIT, new_mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism selected = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding b_old = MEMPLUG_HOST_NULL_HANDLE_INIT, b_new = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation kept = MEMPLUG_HOST_NULL_HANDLE_INIT, fresh = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation none = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostSubscription sub = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanismInfo info;
    MemplugHostSettlement s;
    MemplugDevice cpu0;
    struct recorder *rec = (struct recorder *)calloc(1, sizeof *rec);
    uint64_t kept_size, fresh_size;
    size_t mechanisms = 0;
    bool lost = true;

    cpu0.kind = MEMPLUG_DEVICE_CPU;
    cpu0.ordinal = 0;
    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, cpu_plugin));
    /* A private copy of the CPU plugin is the same plugin name: refused. */
    if (cpu_copy != NULL) {
        EXPECT_STATUS(memplug_host_manager_load_plugin(m, cpu_copy), MEMPLUG_HOST_STATUS_ALREADY_EXISTS);
    }
    EXPECT_OK(memplug_host_manager_load_plugin(m, example_plugin));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &old_mech));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-c-example/c-example", &new_mech));
    EXPECT_OK(memplug_host_pool_create(m, "cpu0", 1u << 24, &pool));
    EXPECT_OK(memplug_host_binding_create(m, old_mech, pool, NULL, &b_old));
    EXPECT_OK(memplug_host_allocate(b_old, 4096, 64, &kept, NULL));
    kept_size = allocation_size(kept);
    rec->manager = m;
    EXPECT_OK(memplug_host_mechanism_subscribe(old_mech, on_event, rec, &sub));

    EXPECT_STATUS(memplug_host_manager_replace(m, old_mech, old_mech, "itself", false),
                  MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT(state_of(old_mech) == MEMPLUG_HOST_LIFE_STATE_ACTIVE);
    EXPECT_OK(memplug_host_manager_replace(m, old_mech, new_mech, "driver upgrade", true));
    EXPECT(state_of(old_mech) == MEMPLUG_HOST_LIFE_STATE_RETIRING);
    EXPECT(state_of(new_mech) == MEMPLUG_HOST_LIFE_STATE_ACTIVE);
    EXPECT(rec->count == 1);
    EXPECT(rec->seen[0].to == MEMPLUG_HOST_LIFE_STATE_RETIRING);
    EXPECT(rec->seen[0].has_reason && strstr(rec->seen[0].reason, "driver upgrade") != NULL);

    /* The old binding makes nothing new; a new binding asked of the old
     * mechanism is made on the new one. */
    EXPECT_STATUS(memplug_host_allocate(b_old, 64, 64, &none, NULL), MEMPLUG_HOST_STATUS_INVALID_STATE);
    EXPECT_OK(memplug_host_allocation_is_lost(kept, &lost));
    EXPECT(!lost);
    EXPECT_OK(memplug_host_binding_create(m, old_mech, pool, NULL, &b_new));
    info = binding_mechanism(b_new);
    EXPECT(strcmp(info.plugin_name, "memplug-c-example") == 0);
    EXPECT(strcmp(info.name, "c-example") == 0);
    info = binding_mechanism(b_old);
    EXPECT(strcmp(info.plugin_name, "memplug-cpu") == 0);
    EXPECT_OK(memplug_host_allocate(b_new, 4096, 64, &fresh, NULL));
    fresh_size = allocation_size(fresh);
    EXPECT_OK(memplug_host_manager_select(m, cpu0, 0, &selected));
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_OK(memplug_host_mechanism_info(selected, &info));
    EXPECT(strcmp(info.plugin_name, "memplug-c-example") == 0);
    EXPECT_OK(memplug_host_mechanism_release(selected));

    /* Retiring with a live object: terminate is BUSY, poll waits. */
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    EXPECT_STATUS(memplug_host_manager_terminate(m, old_mech, 10000000u, &s), MEMPLUG_HOST_STATUS_BUSY);
    EXPECT_OK(memplug_host_manager_poll(m, NULL));
    EXPECT(state_of(old_mech) == MEMPLUG_HOST_LIFE_STATE_RETIRING);
    EXPECT(pool_used(pool) == kept_size + fresh_size);

    /* The last old object freed (refunded as usual): the next poll
     * terminates the old context and unloads its plugin. */
    EXPECT_OK(memplug_host_allocation_free(kept));
    EXPECT(pool_used(pool) == fresh_size);
    EXPECT_OK(memplug_host_manager_poll(m, NULL));
    EXPECT(state_of(old_mech) == MEMPLUG_HOST_LIFE_STATE_TERMINATED);
    EXPECT(rec->count == 2);
    EXPECT(rec->seen[1].to == MEMPLUG_HOST_LIFE_STATE_TERMINATED && rec->seen[1].has_settlement);
    EXPECT(rec->seen[1].settlement.after_loss == 0 && rec->seen[1].settlement.bytes == 0);
    EXPECT_OK(memplug_host_manager_mechanism_count(m, &mechanisms));
    EXPECT(mechanisms == 1);

    EXPECT_OK(memplug_host_allocation_free(fresh));
    EXPECT(pool_used(pool) == 0);
    EXPECT_OK(memplug_host_mechanism_unsubscribe(sub));
    EXPECT_OK(memplug_host_binding_destroy(b_new));
    EXPECT_OK(memplug_host_binding_destroy(b_old));
    EXPECT_OK(memplug_host_mechanism_release(new_mech));
    EXPECT_OK(memplug_host_mechanism_release(old_mech));
    EXPECT_OK(memplug_host_pool_release(pool));
    EXPECT_OK(memplug_host_manager_destroy(m));
    free(rec);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so PATH/TO/libmemplug_example_plugin.so "
                        "[PATH/TO/a-copy-of-the-cpu-plugin.so]\n",
                argv[0]);
        return 2;
    }
    EXPECT(strcmp(memplug_host_life_state_name(MEMPLUG_HOST_LIFE_STATE_LOST), "MEMPLUG_HOST_LIFE_STATE_LOST") == 0);
    EXPECT(strcmp(memplug_host_life_state_name(77), "MEMPLUG_HOST_LIFE_STATE_UNKNOWN") == 0);
    declared_loss(argv[1]);
    replacement(argv[1], argv[2], argc > 3 ? argv[3] : NULL);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
