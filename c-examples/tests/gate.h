/*
 * gate.h: a gate a stream's worker waits at, for the C tests that check
 * ordering behind stream work: gate_hold, enqueued as a host function,
 * holds the stream until the test calls gate_open; gate_mark, enqueued
 * later (on any stream), records that it ran.
 */
#ifndef MEMPLUG_C_TESTS_GATE_H
#define MEMPLUG_C_TESTS_GATE_H

#include <pthread.h>
#include <string.h>

struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, open, ran;
};

static inline void gate_init(struct gate *g) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
}

static inline void gate_destroy(struct gate *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

/* A host function: holds its stream until gate_open. */
static inline void gate_hold(void *userdata) {
    struct gate *g = (struct gate *)userdata;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* A host function: records that it ran. */
static inline void gate_mark(void *userdata) {
    struct gate *g = (struct gate *)userdata;
    pthread_mutex_lock(&g->mu);
    g->ran = 1;
    pthread_mutex_unlock(&g->mu);
}

/* Waits until gate_hold holds its stream. */
static inline void gate_wait_entered(struct gate *g) {
    pthread_mutex_lock(&g->mu);
    while (!g->entered) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* Whether gate_mark has run. */
static inline int gate_ran(struct gate *g) {
    int ran;
    pthread_mutex_lock(&g->mu);
    ran = g->ran;
    pthread_mutex_unlock(&g->mu);
    return ran;
}

/* Lets gate_hold return; returns whether gate_mark had run before. */
static inline int gate_open(struct gate *g) {
    int ran;
    pthread_mutex_lock(&g->mu);
    ran = g->ran;
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    return ran;
}

#endif
