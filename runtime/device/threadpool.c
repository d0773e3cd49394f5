/*
 * threadpool.c: the runtime's persistent worker pool behind
 * host->parallel_for.
 *
 * A job is published by bumping `generation`; workers spin briefly on it
 * (decode issues hundreds of small jobs per token, and a futex round trip
 * per job costs more than the job), then sleep on the condition variable.
 *
 * A job is n contiguous chunks, chunk t passed to fn as `thread` t, each
 * exactly the range it always had (so results never depend on who ran it).
 * The caller runs chunk 0 itself; chunks 1..n-1 are claimed from `claim`
 * by whichever thread asks first: the workers, and the caller once its own
 * chunk is done. A worker that is late (yielding, asleep, or descheduled by
 * another process on a shared machine) thus costs the caller its chunk's
 * time instead of a wait: session 15 measured the caller's join loop at
 * 5 % of a 32-sequence decode step's CPU, the worker's waits at 1 %. Each
 * `thread` value still runs once per job and never twice at once, so
 * per-thread scratch indexed by it stays private; thread 0 is always the
 * caller. The caller then waits only for chunks a worker is running
 * (`done`). A worker reads the job (fn, ud, total) only after a successful
 * claim, and the job cannot finish before that chunk is done, so a worker
 * woken for an older job can never run a stale one: its claim either
 * fails (the old job's chunks are all taken) or is a chunk of the current
 * job, published before `claim` was reset.
 *
 * Jobs are serialised by `submit_lock`; a parallel_for called from inside a
 * job (any worker, or the submitting thread) runs inline instead of
 * deadlocking. The workers start with the first job, not with the pool: a
 * runtime that only loads, checks or lists plugins never creates a thread
 * (a warm kernel load paid a clone, a join and a spinning worker for
 * nothing); if they cannot start, every job runs on the caller.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "contain.h"
#include "internal.h"

#define SPIN_ITERS 20000

struct khub_pool {
    khub_runtime *rt;
    int n;              /* threads including the caller */
    pthread_t *threads; /* [n - 1] */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_mutex_t submit_lock;
    atomic_uint generation; /* bumped per job */
    atomic_uint claim;      /* next chunk of the current job to hand out; >= n: none */
    atomic_int done;        /* chunks 1..n-1 of the current job finished */
    atomic_int stop;
    int n_started;
    int start_failed; /* the workers could not all start: jobs run inline */
    /* the current job */
    khub_range_fn fn;
    void *ud;
    int64_t total;
    /* The submitting thread's plugin call, lent to the workers for the job
     * so that a crash or exit() in a worker names it (contain.h). */
    const khub__inflight *inflight;
};

static _Thread_local int tls_in_job;

static void run_chunk(khub_pool *p, int idx)
{
    int64_t per = p->total / p->n, rem = p->total % p->n;
    int64_t begin = idx * per + (idx < rem ? idx : rem);
    int64_t end = begin + per + (idx < rem ? 1 : 0);
    if (begin < end) p->fn(p->ud, begin, end, idx);
}

/* Runs chunks of the current job while any is unclaimed; a worker lends
 * itself the submitting thread's plugin call for them (adopt). */
static void run_claimed(khub_pool *p, int adopt)
{
    for (;;) {
        unsigned c = atomic_fetch_add_explicit(&p->claim, 1, memory_order_acq_rel);
        if (c >= (unsigned)p->n) return;
        if (adopt) khub__inflight_adopt(p->inflight);
        run_chunk(p, (int)c);
        if (adopt) khub__inflight_adopt(NULL);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *worker_main(void *arg)
{
    khub_pool *p = arg;
    unsigned seen = 0;
    tls_in_job = 1;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop) && spins < SPIN_ITERS) {
            spins++;
            if ((spins & 63) == 0) sched_yield();
        }
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->lock);
            while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            pthread_mutex_unlock(&p->lock);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        run_claimed(p, 1);
    }
    return NULL;
}

khub_status khub__pool_new(khub_runtime *rt, int n_threads, khub_pool **out)
{
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    khub_pool *p = khub__calloc(rt, 1, sizeof *p);
    if (!p) return KHUB_STATUS_NOMEM;
    p->rt = rt;
    p->n = n_threads;
    p->n_started = 0;
    atomic_init(&p->claim, (unsigned)n_threads); /* no job yet: nothing to claim */
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_mutex_init(&p->submit_lock, NULL);
    if (n_threads > 1) {
        p->threads = khub__calloc(rt, (size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            khub__pool_free(p);
            return KHUB_STATUS_NOMEM;
        }
    }
    *out = p;
    return KHUB_STATUS_OK;
}

/* Under submit_lock, before the first job is published (generation is
 * still 0, which every worker starts out having seen). */
static int start_workers(khub_pool *p)
{
    while (!p->start_failed && p->n_started < p->n - 1) {
        int i = p->n_started;
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            p->start_failed = 1;
            khub__log(p->rt, KHUB_LOG_WARN,
                      "could not start worker thread %d of %d; running on one thread", i + 1,
                      p->n - 1);
        } else
            p->n_started++;
    }
    return !p->start_failed;
}

void khub__pool_free(khub_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    khub_runtime *rt = p->rt;
    if (p->n > 1) {
        khub__free(rt, p->threads, sizeof(pthread_t) * (size_t)(p->n - 1));
    }
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->submit_lock);
    khub__free(rt, p, sizeof *p);
}

int khub__pool_size(const khub_pool *p) { return p ? p->n : 1; }

void khub__pool_for(khub_pool *p, int64_t n, khub_range_fn fn, void *ud)
{
    if (n <= 0) return;
    if (!p || p->n == 1 || n == 1 || tls_in_job) {
        fn(ud, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->submit_lock);
    if (!start_workers(p)) {
        pthread_mutex_unlock(&p->submit_lock);
        fn(ud, 0, n, 0);
        return;
    }
    tls_in_job = 1;
    p->fn = fn;
    p->ud = ud;
    p->total = n;
    p->inflight = khub__inflight_now();
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, 1, memory_order_release);
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    run_chunk(p, 0);
    run_claimed(p, 0);
    while (atomic_load_explicit(&p->done, memory_order_acquire) < p->n - 1) sched_yield();
    tls_in_job = 0;
    pthread_mutex_unlock(&p->submit_lock);
}
