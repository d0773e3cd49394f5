/* fake_nccl.c: a stand-in libnccl.so.2 for tests on machines without a GPU
 * (test_nccl), found through KHUB_NCCL_LIBRARY. Its ranks are threads of
 * one process and its device memory is the fake driver's (tests/fake_cuda:
 * device pointers are host memory), so its collectives really sum and
 * gather:
 *   - ncclGetUniqueId makes an id that names a group; ncclCommInitRank
 *     joins the group of that id and waits (up to 10 s, then
 *     ncclSystemError) until nranks ranks have joined it, so ranks that
 *     were given different ids never meet;
 *   - ncclAllReduce (ncclFloat32, ncclSum only) and ncclAllGather (any
 *     type) wait for every rank of the communicator, add in rank order or
 *     copy in rank order, and write every rank's recvbuff.
 * KHUB_FAKE_NCCL_FAIL="ncclName=R" makes every call of ncclName return the
 * ncclResult_t R (without waiting for the other ranks, so a failure on
 * every rank never hangs). ncclGetErrorString gives the real library's
 * strings (NCCL 2.28).
 *
 * Tests read what each rank's last call was through
 * khub_fake_nccl_last(rank, "field") (dlsym): calls (of every function),
 * inits, all_reduces, all_gathers, destroys, count, datatype, op, stream
 * (the CUstream, as a long), send, recv (pointers, as longs), nranks; and
 * khub_fake_nccl_groups() counts the ids ever joined.
 *
 * Built twice: as fake-nccl/libnccl.so.2, and with FAKE_NCCL_NO_ALLGATHER
 * as fake-nccl-noallgather/libnccl.so.2, a library that lacks a symbol. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT      __attribute__((visibility("default")))
#define FAKE_RANKS  8
#define FAKE_GROUPS 16

typedef struct {
    char internal[128];
} fake_id;

typedef struct group {
    uint64_t key; /* from the id; 0 = free slot */
    int nranks, joined;
    /* a generation barrier over the communicator's ranks */
    int arrived;
    unsigned long gen;
    const void *send[FAKE_RANKS];
    void *recv[FAKE_RANKS];
} group;

typedef struct fake_comm {
    group *g;
    int rank;
} fake_comm;

typedef struct last_call {
    long calls, inits, all_reduces, all_gathers, destroys;
    long count, datatype, op, stream, send, recv, nranks;
} last_call;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static group groups[FAKE_GROUPS];
static int n_groups;
static uint64_t next_key = 0x6b68756200000001ull;
static last_call last[FAKE_RANKS];

/* ---- failure injection ---------------------------------------------------- */

static int fail_result(const char *name)
{
    const char *f = getenv("KHUB_FAKE_NCCL_FAIL");
    size_t n = strlen(name);
    if (!f || strncmp(f, name, n) != 0 || f[n] != '=') return 0;
    return atoi(f + n + 1);
}

EXPORT const char *ncclGetErrorString(int r)
{
    switch (r) {
    case 0: return "no error";
    case 1: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case 2: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case 3: return "internal error - please report this issue to the NCCL developers";
    case 4: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case 5: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case 6: return "remote process exited or there was a network error";
    case 7: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

EXPORT int ncclGetVersion(int *v)
{
    *v = 22809;
    return 0;
}

EXPORT long khub_fake_nccl_last(int rank, const char *what)
{
    if (rank < 0 || rank >= FAKE_RANKS) return -1;
    pthread_mutex_lock(&mu);
    const last_call *l = &last[rank];
    const struct {
        const char *name;
        long v;
    } t[] = {{"calls", l->calls},
             {"inits", l->inits},
             {"all_reduces", l->all_reduces},
             {"all_gathers", l->all_gathers},
             {"destroys", l->destroys},
             {"count", l->count},
             {"datatype", l->datatype},
             {"op", l->op},
             {"stream", l->stream},
             {"send", l->send},
             {"recv", l->recv},
             {"nranks", l->nranks}};
    long v = -1;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(what, t[i].name) == 0) v = t[i].v;
    pthread_mutex_unlock(&mu);
    return v;
}

EXPORT int khub_fake_nccl_groups(void)
{
    pthread_mutex_lock(&mu);
    int n = n_groups;
    pthread_mutex_unlock(&mu);
    return n;
}

/* ---- communicators ------------------------------------------------------- */

EXPORT int ncclGetUniqueId(fake_id *id)
{
    int r = fail_result("ncclGetUniqueId");
    if (r) return r;
    memset(id, 0, sizeof *id);
    pthread_mutex_lock(&mu);
    uint64_t key = next_key++;
    pthread_mutex_unlock(&mu);
    memcpy(id->internal, &key, sizeof key);
    return 0;
}

static void deadline(struct timespec *ts, int seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += seconds;
}

EXPORT int ncclCommInitRank(fake_comm **out, int nranks, fake_id id, int rank)
{
    int r = fail_result("ncclCommInitRank");
    if (r) return r;
    uint64_t key;
    memcpy(&key, id.internal, sizeof key);
    if (nranks < 1 || nranks > FAKE_RANKS || rank < 0 || rank >= nranks || key == 0) return 4;
    pthread_mutex_lock(&mu);
    group *g = NULL;
    for (int i = 0; i < n_groups && !g; i++)
        if (groups[i].key == key) g = &groups[i];
    if (!g && n_groups < FAKE_GROUPS) {
        g = &groups[n_groups++];
        *g = (group){.key = key, .nranks = nranks};
    }
    if (!g || g->nranks != nranks) {
        pthread_mutex_unlock(&mu);
        return 5;
    }
    g->joined++;
    last[rank].calls++;
    last[rank].inits++;
    last[rank].nranks = nranks;
    pthread_cond_broadcast(&cv);
    struct timespec ts;
    deadline(&ts, 10);
    int rc = 0;
    while (g->joined < g->nranks && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&cv, &mu, &ts);
    int ok = g->joined >= g->nranks;
    pthread_mutex_unlock(&mu);
    if (!ok) return 2; /* the others never came: a different id, or dead */
    fake_comm *c = calloc(1, sizeof *c);
    if (!c) return 2;
    *c = (fake_comm){g, rank};
    *out = c;
    return 0;
}

EXPORT int ncclCommDestroy(fake_comm *c)
{
    if (!c) return 4;
    pthread_mutex_lock(&mu);
    last[c->rank].calls++;
    last[c->rank].destroys++;
    pthread_mutex_unlock(&mu);
    free(c);
    return 0;
}

/* Every rank of c's group arrives; under mu. */
static void barrier(group *g)
{
    unsigned long gen = g->gen;
    if (++g->arrived == g->nranks) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&cv);
        return;
    }
    while (gen == g->gen) pthread_cond_wait(&cv, &mu);
}

static void record(fake_comm *c, size_t count, int type, int op, void *stream, const void *send,
                   void *recv)
{
    last_call *l = &last[c->rank];
    l->calls++;
    l->count = (long)count;
    l->datatype = type;
    l->op = op;
    l->stream = (long)(intptr_t)stream;
    l->send = (long)(intptr_t)send;
    l->recv = (long)(intptr_t)recv;
}

EXPORT int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, fake_comm *c,
                         void *stream)
{
    int r = fail_result("ncclAllReduce");
    if (r) return r;
    if (!c || type != 7 || op != 0) return 4; /* this fake sums floats only */
    group *g = c->g;
    pthread_mutex_lock(&mu);
    record(c, count, type, op, stream, send, recv);
    last[c->rank].all_reduces++;
    g->send[c->rank] = send;
    g->recv[c->rank] = recv;
    barrier(g);
    if (c->rank == 0) { /* in place is allowed: sum into a copy first */
        float *sum = malloc(count * sizeof *sum + 1);
        for (size_t i = 0; sum && i < count; i++) {
            float s = ((const float *)g->send[0])[i];
            for (int k = 1; k < g->nranks; k++) s += ((const float *)g->send[k])[i];
            sum[i] = s;
        }
        barrier(g); /* everyone's send is read */
        for (int k = 0; sum && k < g->nranks; k++) memcpy(g->recv[k], sum, count * sizeof *sum);
        free(sum);
    } else {
        barrier(g);
    }
    barrier(g); /* rank 0 wrote every recv */
    pthread_mutex_unlock(&mu);
    return 0;
}

#ifndef FAKE_NCCL_NO_ALLGATHER
static size_t type_size(int type)
{
    static const size_t sz[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return type >= 0 && type < (int)(sizeof sz / sizeof sz[0]) ? sz[type] : 0;
}

EXPORT int ncclAllGather(const void *send, void *recv, size_t count, int type, fake_comm *c,
                         void *stream)
{
    int r = fail_result("ncclAllGather");
    if (r) return r;
    size_t bytes = count * type_size(type);
    if (!c || bytes == 0) return 4;
    group *g = c->g;
    pthread_mutex_lock(&mu);
    record(c, count, type, -1, stream, send, recv);
    last[c->rank].all_gathers++;
    g->send[c->rank] = send;
    barrier(g);
    for (int k = 0; k < g->nranks; k++) memcpy((char *)recv + (size_t)k * bytes, g->send[k], bytes);
    barrier(g); /* everyone's send is read */
    pthread_mutex_unlock(&mu);
    return 0;
}
#endif
