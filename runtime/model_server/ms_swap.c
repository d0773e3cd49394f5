/*
 * ms_swap.c: a live kernel swap in a serving model (issue 16 item 4), for
 * POST /v1/kernels/reload and khub_model_server_reload.
 *
 * Two threads, two steps. The asking thread (a connection's, or the
 * embedder's) does the slow and fallible part with
 * khub_model_kernel_swap_prepare: resolve the name under the server's
 * policy and lock (for a role on a CUDA device, its CUDA variant), fetch, verify
 * (digests, signature, lock hashes), load, selftest; meanwhile the engine
 * keeps generating. Then it hands the prepared kernel to the engine thread,
 * which alone may touch the model, and which switches it with
 * khub_model_kernel_swap between two steps: a step runs wholly on the old
 * kernel or wholly on the new one, so no call is cut off and no request
 * fails. A refused kernel changes nothing; the old one keeps serving.
 *
 * Swaps run one at a time (reload_mu): the hub handle is one thread's at a
 * time, and two swaps of one role racing would leave the loser's report
 * wrong. Messages come from khub_last_error(), this thread's, because the
 * engine thread shares the runtime's message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_server.h"

/* ======================================================================== */
/* The hand-off to the engine thread                                        */
/* ======================================================================== */

void khub__ms_swap_serve(khub_model *m, pthread_mutex_t *mu, pthread_cond_t *cv,
                         khub__ms_swap **slot)
{
    pthread_mutex_lock(mu);
    khub__ms_swap *box = *slot;
    if (box) box->taken = 1;
    pthread_mutex_unlock(mu);
    if (!box) return;
    box->st = khub_model_kernel_swap(m, box->sw);
    if (box->st != KHUB_STATUS_OK)
        snprintf(box->err, sizeof box->err, "%s", khub_last_error());
    else
        box->explain = strdup(khub_model_explain(m));
    pthread_mutex_lock(mu);
    box->done = 1;
    *slot = NULL;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
}

void khub__ms_swap_wait(pthread_mutex_t *mu, pthread_cond_t *cv, khub__ms_swap **slot,
                        const int *stopping, khub__ms_swap *box)
{
    pthread_mutex_lock(mu);
    /* One swap at a time is the server's rule (reload_mu); a slot still
     * busy here would be a bug, so wait it out rather than overwrite it. */
    while (*slot && !*stopping) pthread_cond_wait(cv, mu);
    if (!*stopping) {
        *slot = box;
        pthread_cond_broadcast(cv);
    }
    /* Once taken, the engine finishes it even while stopping: box lives on
     * this stack until then. */
    while (!box->done && (box->taken || !*stopping)) pthread_cond_wait(cv, mu);
    if (!box->done) {
        if (*slot == box) *slot = NULL;
        box->st = KHUB_STATUS_BUSY;
        snprintf(box->err, sizeof box->err,
                 "the server is shutting down; the kernel was not swapped");
    }
    pthread_mutex_unlock(mu);
}

/* ======================================================================== */
/* A swap                                                                   */
/* ======================================================================== */

/* The hub handle for fetching: the embedder's, or one of the server's own
 * (made on first use, with the process's environment: HF_ENDPOINT, the
 * cache folder, tokens). */
static khub_status hub_of(khub__ms *s, char *err, size_t n)
{
    if (s->hub) return KHUB_STATUS_OK;
    khub_status st = khub_hub_new(NULL, &s->hub);
    if (st != KHUB_STATUS_OK) {
        snprintf(err, n, "kernel swap: cannot open the hub: %s", khub_last_error());
        return st;
    }
    s->own_hub = 1;
    return KHUB_STATUS_OK;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void remember(khub__ms *s, const char *role, const char *name, const khub_kernel_swap *sw,
                     char *explain, double prepare_ms, double switch_ms)
{
    pthread_mutex_lock(&s->kmu);
    khub__ms_reload_rec *r = &s->reloads[s->n_reloads % KHUB__MS_MAX_RELOADS];
    r->at = time(NULL);
    snprintf(r->role, sizeof r->role, "%s", role);
    snprintf(r->kernel, sizeof r->kernel, "%s", name);
    snprintf(r->previous, sizeof r->previous, "%s", sw->previous);
    snprintf(r->now, sizeof r->now, "%s", sw->now_serving);
    snprintf(r->resolved, sizeof r->resolved, "%s", sw->resolved);
    snprintf(r->selftest, sizeof r->selftest, "%s", sw->selftest);
    r->prepare_ms = prepare_ms;
    r->switch_ms = switch_ms;
    s->n_reloads++;
    if (explain) {
        free(s->explain);
        s->explain = explain;
    }
    pthread_mutex_unlock(&s->kmu);
}

khub_status khub__ms_reload(khub__ms *s, const char *role, const char *name, char *err,
                            size_t err_size)
{
    khub_kernel_role kr = khub_kernel_role_from_name(role);
    if (kr == KHUB_KERNEL_ROLE__COUNT) {
        char list[160] = "";
        for (int r = 0; r < KHUB_KERNEL_ROLE__COUNT; r++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", r ? ", " : "",
                     khub_kernel_role_name((khub_kernel_role)r));
        snprintf(err, err_size, "unknown kernel role '%.64s' (roles: %s)", role, list);
        atomic_fetch_add(&s->n_reload_failures, 1);
        return KHUB_STATUS_INVALID_ARG;
    }
    pthread_mutex_lock(&s->reload_mu);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    khub_model_kernels policy = {KHUB_APP_INIT(khub_model_kernels), .lock_path = s->lock_path,
                                 .policy_path = s->policy_path,
                                 .allow_unsigned = s->allow_unsigned};
    double t0 = now_ms(), t1 = t0;
    khub_status st = hub_of(s, err, err_size);
    if (st == KHUB_STATUS_OK) {
        st = khub_model_kernel_swap_prepare(s->hub, s->model, kr, name, &policy, &sw);
        if (st != KHUB_STATUS_OK) snprintf(err, err_size, "%s", khub_last_error());
    }
    khub__ms_swap box = {.sw = &sw};
    if (st == KHUB_STATUS_OK) {
        t1 = now_ms();
        s->eng->vt->swap(s->eng, &box);
        st = box.st;
        if (st != KHUB_STATUS_OK) snprintf(err, err_size, "%s", box.err);
    }
    /* A kernel prepared and never switched (the server stopping first) is
     * released here; the switch released its own, and unloaded a refused
     * one, so failed reloads do not pile plugins up in the runtime. */
    khub_kernel_swap_release(khub_model_runtime(s->model), &sw);
    if (st == KHUB_STATUS_OK)
        remember(s, khub_kernel_role_name(kr), name, &sw, box.explain, t1 - t0, now_ms() - t1);
    else
        free(box.explain), atomic_fetch_add(&s->n_reload_failures, 1);
    pthread_mutex_unlock(&s->reload_mu);
    return st;
}

void khub__ms_reload_free(khub__ms *s)
{
    if (s->own_hub) khub_hub_free(s->hub);
    s->hub = NULL;
    free(s->lock_path);
    free(s->policy_path);
}
