/*
 * tp_thread_comm.h: a khub_comm (khub_comm.h) whose ranks are threads of
 * one process, for tests of tensor parallelism without MPI. Header-only,
 * test code only. Sums add the ranks' values in rank order, as Open MPI's
 * allreduce does for two ranks, so every rank gets the same bits.
 *
 *     tc_group g;
 *     tc_init(&g, 2);
 *     khub_comm c = tc_comm(&g, rank);    // in each rank's thread
 *     ...
 *     tc_destroy(&g);
 */
#ifndef KHUB_TESTS_TP_THREAD_COMM_H
#define KHUB_TESTS_TP_THREAD_COMM_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "khub/khub_comm.h"

#define TC_MAX 8

typedef struct tc_group {
    int size;
    pthread_barrier_t bar;
    const void *post[TC_MAX]; /* each rank's buffer of the current collective */
} tc_group;

typedef struct tc_rank {
    tc_group *g;
    int rank;
} tc_rank;

static inline void tc_init(tc_group *g, int size)
{
    memset(g, 0, sizeof *g);
    g->size = size;
    pthread_barrier_init(&g->bar, NULL, (unsigned)size);
}

static inline void tc_destroy(tc_group *g) { pthread_barrier_destroy(&g->bar); }

static inline khub_status tc_all_reduce(void *ud, float *buf, int64_t n, char *e, size_t es)
{
    (void)e, (void)es;
    tc_rank *r = ud;
    tc_group *g = r->g;
    float *sum = malloc((size_t)(n ? n : 1) * sizeof *sum);
    if (!sum) return KHUB_STATUS_NOMEM;
    g->post[r->rank] = buf;
    pthread_barrier_wait(&g->bar);
    for (int64_t i = 0; i < n; i++) {
        float s = ((const float *)g->post[0])[i];
        for (int k = 1; k < g->size; k++) s += ((const float *)g->post[k])[i];
        sum[i] = s;
    }
    pthread_barrier_wait(&g->bar); /* every rank has read every buffer */
    memcpy(buf, sum, (size_t)n * sizeof *sum);
    free(sum);
    return KHUB_STATUS_OK;
}

static inline khub_status tc_all_gather(void *ud, const void *send, size_t bytes, void *recv,
                                        char *e, size_t es)
{
    (void)e, (void)es;
    tc_rank *r = ud;
    tc_group *g = r->g;
    g->post[r->rank] = send;
    pthread_barrier_wait(&g->bar);
    for (int k = 0; k < g->size; k++) memcpy((char *)recv + (size_t)k * bytes, g->post[k], bytes);
    pthread_barrier_wait(&g->bar);
    return KHUB_STATUS_OK;
}

static inline khub_status tc_broadcast(void *ud, void *buf, size_t bytes, int32_t root, char *e,
                                       size_t es)
{
    (void)e, (void)es;
    tc_rank *r = ud;
    tc_group *g = r->g;
    g->post[r->rank] = buf;
    pthread_barrier_wait(&g->bar);
    if (r->rank != root) memcpy(buf, g->post[root], bytes);
    pthread_barrier_wait(&g->bar);
    return KHUB_STATUS_OK;
}

static inline khub_status tc_barrier(void *ud, char *e, size_t es)
{
    (void)e, (void)es;
    tc_rank *r = ud;
    pthread_barrier_wait(&r->g->bar);
    return KHUB_STATUS_OK;
}

/* The table of rank `rank`; r must outlive the model. */
static inline khub_comm tc_comm(tc_group *g, tc_rank *r, int rank)
{
    r->g = g;
    r->rank = rank;
    return (khub_comm){KHUB_APP_INIT(khub_comm),
                       .rank = rank,
                       .size = g->size,
                       .ud = r,
                       .all_reduce_sum_f32 = tc_all_reduce,
                       .all_gather = tc_all_gather,
                       .broadcast = tc_broadcast,
                       .barrier = tc_barrier};
}

#endif /* KHUB_TESTS_TP_THREAD_COMM_H */
