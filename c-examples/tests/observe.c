/*
 * observe.c: statistics as text and the event and log callbacks through
 * the host C API, on the reference CPU plugin.
 *
 *   1. The text buffer protocol of memplug_host_stats_json (and of the pool
 *      and Prometheus variants): a size query with a NULL buffer, a buffer
 *      one byte short (BUFFER_TOO_SMALL, nothing written, the capacity
 *      needed), the exact size (the text, its NUL, its length), a NULL
 *      `written`; the JSON carries the schema version and the pool's
 *      figures, the Prometheus text the pool's used bytes per class.
 *   2. The event callback: a GRANT per allocation with the pool's id and
 *      name, the class and the bytes; OUT_OF_BUDGET naming the short pool;
 *      CONTEXT_LOST on a declared loss; destroying the manager from inside
 *      the callback is refused as re-entrant; nothing arrives once the
 *      callback is removed.
 *   3. The log callback: the plugin's message of a refused allocation, as
 *      a WARN from "memplug-cpu/cpu".
 *
 *   observe PATH/TO/libmemplug_plugin_cpu.so
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

#define NKINDS 8

struct recorder {
    MemplugHostManager manager;
    int kinds[NKINDS];
    uint64_t last_pool_id, last_bytes, first_bytes, lost_bytes, lost_count;
    uint32_t last_class;
    char last_pool[64];
    char short_pool[64];
    char lost_context[64];
    MemplugHostStatus destroy_inside;
    int bad_struct;
};

static void copy_text(char *dst, size_t cap, const char *src, size_t len) {
    size_t n = len < cap - 1 ? len : cap - 1;
    if (src == NULL) n = 0;
    else memcpy(dst, src, n);
    dst[n] = '\0';
}

static void on_event(void *userdata, const MemplugHostEvent *e) {
    struct recorder *r = (struct recorder *)userdata;
    if (e->struct_size < sizeof *e || (e->pool_name != NULL && strlen(e->pool_name) != e->pool_name_len)) {
        r->bad_struct++;
    }
    if (e->kind < NKINDS) r->kinds[e->kind]++;
    switch (e->kind) {
    case MEMPLUG_HOST_EVENT_GRANT:
        r->last_pool_id = e->pool_id;
        r->last_bytes = e->bytes;
        if (r->first_bytes == 0) r->first_bytes = e->bytes;
        r->last_class = e->alloc_class;
        copy_text(r->last_pool, sizeof r->last_pool, e->pool_name, e->pool_name_len);
        /* Not allowed from inside: must be refused, never done. */
        r->destroy_inside = memplug_host_manager_destroy(r->manager);
        break;
    case MEMPLUG_HOST_EVENT_OUT_OF_BUDGET:
        copy_text(r->short_pool, sizeof r->short_pool, e->detail, e->detail_len);
        break;
    case MEMPLUG_HOST_EVENT_CONTEXT_LOST:
        r->lost_bytes += e->bytes;
        r->lost_count += e->count;
        copy_text(r->lost_context, sizeof r->lost_context, e->detail, e->detail_len);
        break;
    default:
        break;
    }
}

struct log_seen {
    int count;
    uint32_t level;
    char source[64];
    char message[256];
};

static void on_log(void *userdata, uint32_t level, const char *source, size_t source_len, const char *message,
                   size_t message_len) {
    struct log_seen *l = (struct log_seen *)userdata;
    l->count++;
    l->level = level;
    copy_text(l->source, sizeof l->source, source, source_len);
    copy_text(l->message, sizeof l->message, message, message_len);
}

typedef MemplugHostStatus (*manager_text_fn)(MemplugHostManager, char *, size_t, size_t *);

/* The buffer protocol on one text function; returns the text (malloc'd). */
static char *text_of(manager_text_fn fn, MemplugHostManager m) {
    size_t need = 0, written = 0;
    char *buf;
    EXPECT_STATUS(fn(m, NULL, 0, &need), MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL);
    EXPECT(need > 1);
    EXPECT_STATUS(fn(m, NULL, 0, NULL), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    EXPECT_STATUS(fn(m, NULL, 5, &written), MEMPLUG_HOST_STATUS_NULL_ARGUMENT);
    buf = (char *)malloc(need);
    if (buf == NULL) return NULL;
    memset(buf, 'x', need);
    written = 0;
    EXPECT_STATUS(fn(m, buf, need - 1, &written), MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL);
    EXPECT(written == need);
    EXPECT(buf[0] == 'x' && buf[need - 2] == 'x'); /* nothing written */
    EXPECT_OK(fn(m, buf, need, &written));
    EXPECT(written == need - 1);
    EXPECT(buf[need - 1] == '\0' && strlen(buf) == written);
    return buf;
}

int main(int argc, char **argv) {
    MemplugHostManager m = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostMechanism mech = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostPool pool = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBinding binding = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostAllocation a = MEMPLUG_HOST_NULL_HANDLE_INIT, b = MEMPLUG_HOST_NULL_HANDLE_INIT;
    MemplugHostBindingOptions opts;
    MemplugHostPoolInfo info;
    struct recorder *rec = (struct recorder *)calloc(1, sizeof *rec);
    struct log_seen logs;
    char *json, *prom, small[8];
    size_t written = 0;
    bool moved = false;

    if (argc < 2 || rec == NULL) {
        fprintf(stderr, "usage: %s PATH/TO/libmemplug_plugin_cpu.so\n", argv[0]);
        return 2;
    }
    memset(&logs, 0, sizeof logs);
    EXPECT_OK(memplug_host_manager_create(&m));
    EXPECT_OK(memplug_host_manager_load_plugin(m, argv[1]));
    EXPECT_OK(memplug_host_manager_find_mechanism(m, "memplug-cpu/cpu", &mech));
    EXPECT_OK(memplug_host_pool_create(m, "gpu0", 1u << 20, &pool));
    memset(&opts, 0, sizeof opts);
    opts.struct_size = sizeof opts;
    opts.alloc_class = MEMPLUG_HOST_CLASS_KV;
    EXPECT_OK(memplug_host_binding_create(m, mech, pool, &opts, &binding));
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    EXPECT_OK(memplug_host_pool_info(pool, &info));

    /* 2. Events. */
    rec->manager = m;
    EXPECT_OK(memplug_host_set_event_callback(m, on_event, rec));
    EXPECT_OK(memplug_host_allocate(binding, 4096, 64, &a, NULL));
    EXPECT(rec->kinds[MEMPLUG_HOST_EVENT_GRANT] == 1);
    EXPECT(rec->last_pool_id == info.pool_id);
    EXPECT(strcmp(rec->last_pool, "gpu0") == 0);
    EXPECT(rec->last_class == MEMPLUG_HOST_CLASS_KV);
    EXPECT(rec->last_bytes >= 4096);
    EXPECT(rec->destroy_inside == MEMPLUG_HOST_STATUS_REENTRANT);
    EXPECT_STATUS(memplug_host_allocate(binding, 2u << 20, 64, &b, NULL), MEMPLUG_HOST_STATUS_OUT_OF_BUDGET);
    EXPECT(b.id == 0);
    EXPECT(rec->kinds[MEMPLUG_HOST_EVENT_OUT_OF_BUDGET] == 1);
    EXPECT(strcmp(rec->short_pool, "gpu0") == 0);

    /* 3. Log: the SDK refuses an alignment that is not a power of two,
     * with a message; the host passes the request through. */
    EXPECT_OK(memplug_host_set_log_callback(m, on_log, &logs));
    EXPECT_STATUS(memplug_host_allocate(binding, 64, 3, &b, NULL), MEMPLUG_HOST_STATUS_INVALID_ARGUMENT);
    EXPECT(logs.count == 1);
    EXPECT(logs.level == MEMPLUG_HOST_LOG_WARN);
    /* Its grant was made (and given back) before the plugin refused. */
    EXPECT(rec->kinds[MEMPLUG_HOST_EVENT_GRANT] == 2);
    EXPECT(strcmp(logs.source, "memplug-cpu/cpu") == 0);
    EXPECT(strlen(logs.message) > 0);
    EXPECT(rec->bad_struct == 0);

    /* 1. Text. */
    json = text_of(memplug_host_stats_json, m);
    EXPECT(json != NULL && strstr(json, "\"schema_version\":1") != NULL);
    EXPECT(json != NULL && strstr(json, "\"name\":\"gpu0\"") != NULL);
    EXPECT(json != NULL && strstr(json, "\"failures\":1") != NULL);
    prom = text_of(memplug_host_stats_prometheus, m);
    EXPECT(prom != NULL && strstr(prom, "# TYPE memplug_pool_used_bytes gauge\n") != NULL);
    EXPECT(prom != NULL && strstr(prom, "memplug_pool_used_bytes{pool=\"gpu0\",class=\"kv\"} ") != NULL);
    EXPECT(prom != NULL && strstr(prom, "memplug_pool_failures_total{pool=\"gpu0\",class=\"kv\"} 1\n") != NULL);
    free(json);
    free(prom);
    EXPECT_STATUS(memplug_host_pool_stats_json(pool, small, sizeof small, &written),
                  MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL);
    EXPECT(written > sizeof small);
    EXPECT_STATUS(memplug_host_pool_stats_prometheus(pool, small, sizeof small, &written),
                  MEMPLUG_HOST_STATUS_BUFFER_TOO_SMALL);
    EXPECT(written > sizeof small);

    /* Removed and set again: nothing arrives in between. */
    EXPECT_OK(memplug_host_set_event_callback(m, NULL, NULL));
    EXPECT_OK(memplug_host_allocate(binding, 64, 64, &b, NULL));
    EXPECT_OK(memplug_host_allocation_free(b));
    EXPECT(rec->kinds[MEMPLUG_HOST_EVENT_GRANT] == 2);
    EXPECT_OK(memplug_host_set_event_callback(m, on_event, rec));

    /* A declared loss: one CONTEXT_LOST for the binding's allocation, and
     * the reason to the log. */
    EXPECT_OK(memplug_host_mechanism_declare_lost(mech, "pulled for the test", &moved));
    EXPECT(moved);
    EXPECT(rec->kinds[MEMPLUG_HOST_EVENT_CONTEXT_LOST] == 1);
    EXPECT(rec->lost_count == 1 && rec->lost_bytes == rec->first_bytes);
    EXPECT(strcmp(rec->lost_context, "memplug-cpu/cpu") == 0);
    EXPECT(logs.count == 2 && logs.level == MEMPLUG_HOST_LOG_ERROR);
    EXPECT(strstr(logs.message, "pulled for the test") != NULL);

    /* Removed: nothing more arrives. */
    EXPECT_OK(memplug_host_set_event_callback(m, NULL, NULL));
    EXPECT_OK(memplug_host_set_log_callback(m, NULL, NULL));
    EXPECT_OK(memplug_host_allocation_free(a));
    EXPECT_STATUS(memplug_host_allocate(binding, 64, 64, &b, NULL), MEMPLUG_HOST_STATUS_DEVICE_LOST);
    EXPECT(logs.count == 2);

    EXPECT_OK(memplug_host_manager_destroy(m));
    EXPECT_STATUS(memplug_host_stats_json(m, NULL, 0, &written), MEMPLUG_HOST_STATUS_STALE_HANDLE);
    free(rec);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
