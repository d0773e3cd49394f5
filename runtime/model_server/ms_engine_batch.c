/*
 * ms_engine_batch.c: the request engine on khub_batch.h, continuous
 * batching: every request admitted shares one running batch, joining and
 * leaving it at each step (issue 16 item 3 over issue 13's scheduler).
 *
 * One thread of this engine owns the model and drives the batch with
 * khub_batch_step rather than khub_batch_run, because a request needs the
 * model before it can be submitted: its chat messages go through the
 * model's template and its prompt is tokenized (to answer a prompt longer
 * than the context with a 400 that has the numbers, and to submit token
 * ids, tokenized once). Connections hand requests to an intake list; the
 * thread takes them between steps, prepares and submits them, and sleeps
 * only when neither the intake nor the batch holds anything.
 *
 * A client that hangs up cancels its request with khub_batch_cancel, so its
 * KV is freed at the next step whether it was running or still waiting.
 */
#include <stdlib.h>
#include <string.h>

#include "khub/khub_batch.h"
#include "model_server.h"

typedef struct batch_eng {
    khub__ms_engine base;
    khub_model *m;
    khub_model_info info;
    khub_batch *b;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    khub__ms_req **intake; /* [max_queue] submitted, not yet in the batch */
    uint32_t n_intake, max_queue;
    int stopping;
    khub__ms_swap *swap; /* a kernel swap to run before the next step (ms_swap.c) */
} batch_eng;

/* ======================================================================== */
/* Callbacks (on the engine thread, inside khub_batch_step)                 */
/* ======================================================================== */

static int on_text(void *ud, uint64_t id, const char *text, size_t len)
{
    (void)id;
    return khub__ms_req_append(ud, text, len);
}

static void on_done(void *ud, uint64_t id, const khub_batch_result *res)
{
    khub__ms_req *r = ud;
    (void)id;
    if (res->stop_reason == KHUB_STOP_CANCELLED && khub__ms_req_cancelled(r))
        khub__ms_req_finish(r, 499, "cancelled", res->n_prompt_tokens, res->n_tokens,
                            KHUB_STOP_CANCELLED, "cancelled");
    else if (res->stop_reason == KHUB_STOP_CANCELLED) /* khub_batch_free at shutdown */
        khub__ms_req_finish(r, 503, "server_error", res->n_prompt_tokens, res->n_tokens,
                            KHUB_STOP_CANCELLED, "the server is shutting down");
    else if (res->status == KHUB_STATUS_CONTEXT_FULL || res->status == KHUB_STATUS_INVALID_ARG)
        khub__ms_req_finish(r, 400, "invalid_request_error", res->n_prompt_tokens, 0, 0, "%s",
                            res->error_full);
    else if (res->status != KHUB_STATUS_OK)
        khub__ms_req_finish(r, 500, "server_error", res->n_prompt_tokens, res->n_tokens, 0,
                            "generation failed: %s", res->error_full);
    else
        khub__ms_req_finish(r, 0, NULL, res->n_prompt_tokens, res->n_tokens, res->stop_reason,
                            NULL);
    khub__ms_req_unref(r); /* the engine's reference */
}

/* ======================================================================== */
/* Preparing a request (engine thread, between steps)                       */
/* ======================================================================== */

/* The prompt's token ids: the conversation through the chat template, or
 * the raw prompt, tokenized as khub_model_generate would (the model's BOS
 * when its tokenizer asks). NULL after finishing r with the error. */
static int32_t *prompt_ids(batch_eng *e, khub__ms_req *r, size_t *n)
{
    char *text = NULL;
    khub_status st = KHUB_STATUS_OK;
    if (r->chat) {
        const char *const *roles = (const char *const *)r->roles;
        const char *const *contents = (const char *const *)r->contents;
        size_t len = 0;
        st = khub_model_chat_format(e->m, roles, contents, r->n_msgs, 1, NULL, 0, &len);
        if (st == KHUB_STATUS_OVERFLOW && (text = malloc(len + 1)))
            st = khub_model_chat_format(e->m, roles, contents, r->n_msgs, 1, text, len + 1, &len);
        else if (st == KHUB_STATUS_OVERFLOW)
            st = KHUB_STATUS_NOMEM;
    }
    const char *src = r->chat ? text : r->prompt;
    int32_t *ids = NULL;
    *n = 0;
    if (st == KHUB_STATUS_OK) st = khub_model_tokenize(e->m, src, 1, NULL, 0, n);
    if (st == KHUB_STATUS_OVERFLOW && *n && (ids = malloc(*n * sizeof *ids)))
        st = khub_model_tokenize(e->m, src, 1, ids, *n, n);
    else if (st == KHUB_STATUS_OVERFLOW && *n)
        st = KHUB_STATUS_NOMEM;
    free(text);
    if (st == KHUB_STATUS_OK && *n) return ids;
    free(ids);
    if (st == KHUB_STATUS_NOMEM)
        khub__ms_req_finish(r, 500, "server_error", 0, 0, 0, "out of memory preparing the prompt");
    else if (st == KHUB_STATUS_OK || st == KHUB_STATUS_OVERFLOW)
        khub__ms_req_finish(r, 400, "invalid_request_error", 0, 0, 0,
                            "the prompt is empty (0 tokens)");
    else
        khub__ms_req_finish(r, 400, "invalid_request_error", 0, 0, 0, "%s: %s",
                            r->chat ? "messages" : "prompt",
                            khub_runtime_errmsg(khub_model_runtime(e->m)));
    return NULL;
}

/* Prepares r and submits it to the batch; on any failure r is finished. */
static void admit(batch_eng *e, khub__ms_req *r)
{
    if (khub__ms_req_cancelled(r)) {
        khub__ms_req_finish(r, 499, "cancelled", 0, 0, KHUB_STOP_CANCELLED, "cancelled");
        return;
    }
    size_t n = 0;
    int32_t *ids = prompt_ids(e, r, &n);
    if (!ids) return;
    int64_t ctx = e->info.max_context;
    if ((int64_t)n + 1 > ctx || (r->max_tokens && (int64_t)n + r->max_tokens > ctx)) {
        khub__ms_req_finish(r, 400, "invalid_request_error", (int64_t)n, 0, 0,
                            "this model's maximum context length is %lld tokens; the request "
                            "has %zu prompt tokens and asks for %d to generate",
                            (long long)ctx, n, r->max_tokens ? (int)r->max_tokens : 1);
        free(ids);
        return;
    }
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts),
                             .max_new_tokens =
                                 r->max_tokens ? r->max_tokens : (int32_t)(ctx - (int64_t)n),
                             .temperature = r->temperature,
                             .top_p = r->top_p,
                             .seed = r->seed,
                             .stop = (const char *const *)r->stop,
                             .n_stop = r->n_stop};
    khub_batch_request br = {KHUB_APP_INIT(khub_batch_request),
                             .tokens = ids,
                             .n_tokens = n,
                             .opts = &go,
                             .on_text = on_text,
                             .on_done = on_done,
                             .ud = r};
    khub__ms_req_ref(r); /* the engine's, dropped in on_done */
    uint64_t id = 0;
    khub_status st = khub_batch_submit(e->b, &br, &id);
    free(ids);
    if (st != KHUB_STATUS_OK) {
        khub__ms_req_finish(r, st == KHUB_STATUS_INVALID_ARG ? 400 : 503,
                            st == KHUB_STATUS_INVALID_ARG ? "invalid_request_error"
                                                          : "server_error",
                            (int64_t)n, 0, 0, "%s", khub_last_error());
        khub__ms_req_unref(r);
        return;
    }
    pthread_mutex_lock(&r->mu);
    r->engine_id = id;
    int cancelled = r->cancel;
    pthread_mutex_unlock(&r->mu);
    if (cancelled) khub_batch_cancel(e->b, id); /* it hung up while we prepared */
}

/* ======================================================================== */
/* The engine thread                                                        */
/* ======================================================================== */

static void *loop(void *arg)
{
    batch_eng *e = arg;
    khub__ms_req *take[256];
    int64_t pending = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stopping && !e->n_intake && !pending && !e->swap)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stopping) break;
        if (e->swap) { /* between two steps: no forward call is in flight */
            pthread_mutex_unlock(&e->mu);
            khub__ms_swap_serve(e->m, &e->mu, &e->cv, &e->swap);
            pthread_mutex_lock(&e->mu);
        }
        uint32_t n = e->n_intake < 256 ? e->n_intake : 256;
        memcpy(take, e->intake, n * sizeof *take);
        memmove(e->intake, e->intake + n, (e->n_intake - n) * sizeof *take);
        e->n_intake -= n;
        pthread_mutex_unlock(&e->mu);
        for (uint32_t i = 0; i < n; i++) {
            admit(e, take[i]);
            khub__ms_req_unref(take[i]); /* the intake's reference */
        }
        khub_batch_step(e->b, &pending); /* a failed step fails its requests */
        pthread_mutex_lock(&e->mu);
    }
    for (uint32_t i = 0; i < e->n_intake; i++) {
        khub__ms_req_finish(e->intake[i], 503, "server_error", 0, 0, 0,
                            "the server is shutting down");
        khub__ms_req_unref(e->intake[i]);
    }
    e->n_intake = 0;
    pthread_mutex_unlock(&e->mu);
    khub_batch_free(e->b); /* ends the rest: on_done with CANCELLED */
    e->b = NULL;
    return NULL;
}

static int batch_submit(khub__ms_engine *base, khub__ms_req *r)
{
    batch_eng *e = (batch_eng *)base;
    khub_batch_stats bs = {KHUB_APP_INIT(khub_batch_stats)};
    pthread_mutex_lock(&e->mu);
    int ok = !e->stopping && e->b && khub_batch_stats_get(e->b, &bs) == KHUB_STATUS_OK &&
             e->n_intake + (uint64_t)bs.queued < e->max_queue;
    if (ok) {
        khub__ms_req_ref(r);
        e->intake[e->n_intake++] = r;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return ok;
}

static void batch_cancel(khub__ms_engine *base, khub__ms_req *r)
{
    batch_eng *e = (batch_eng *)base;
    pthread_mutex_lock(&r->mu);
    uint64_t id = r->engine_id;
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&e->mu);
    if (id && e->b && !e->stopping) khub_batch_cancel(e->b, id); /* NOT_FOUND once it ended */
    pthread_mutex_unlock(&e->mu);
}

static void batch_stats(khub__ms_engine *base, khub__ms_engine_stats *out)
{
    batch_eng *e = (batch_eng *)base;
    khub_batch_stats bs = {KHUB_APP_INIT(khub_batch_stats)};
    pthread_mutex_lock(&e->mu);
    if (!e->stopping && e->b) khub_batch_stats_get(e->b, &bs);
    out->queued = e->n_intake + (uint32_t)bs.queued;
    pthread_mutex_unlock(&e->mu);
    out->running = (uint32_t)bs.running;
    out->kv_tokens = (uint64_t)bs.kv_tokens_used;
    out->kv_capacity = (uint64_t)bs.kv_tokens_limit;
}

static void batch_shutdown(khub__ms_engine *base)
{
    batch_eng *e = (batch_eng *)base;
    pthread_mutex_lock(&e->mu);
    int join = e->started && !e->stopping;
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (join) pthread_join(e->thread, NULL);
}

static void batch_free_engine(khub__ms_engine *base)
{
    batch_eng *e = (batch_eng *)base;
    if (!e) return;
    batch_shutdown(base);
    khub_batch_free(e->b); /* only when the thread never started */
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e->intake);
    free(e);
}

static void batch_swap(khub__ms_engine *base, khub__ms_swap *box)
{
    batch_eng *e = (batch_eng *)base;
    khub__ms_swap_wait(&e->mu, &e->cv, &e->swap, &e->stopping, box);
}

static const khub__ms_engine_vt batch_vt = {batch_submit,   batch_cancel,      batch_stats,
                                            batch_shutdown, batch_free_engine, batch_swap};

khub__ms_engine *khub__ms_engine_batch_new(khub_model *m, uint32_t max_queue,
                                           int32_t max_batch_tokens, char *err, size_t err_size)
{
    batch_eng *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->base.vt = &batch_vt;
    e->m = m;
    e->info = (khub_model_info){KHUB_APP_INIT(khub_model_info)};
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->max_queue = max_queue;
    e->intake = calloc(max_queue, sizeof *e->intake);
    khub_batch_config cfg = {KHUB_APP_INIT(khub_batch_config),
                             .max_batch_tokens = max_batch_tokens};
    khub_status st = KHUB_STATUS_NOMEM;
    if (!e->intake || khub_model_info_get(m, &e->info) != KHUB_STATUS_OK ||
        (st = khub_batch_new(m, &cfg, &e->b)) != KHUB_STATUS_OK ||
        pthread_create(&e->thread, NULL, loop, e) != 0) {
        khub__errbuf(err, err_size, "serve-model: cannot start the batching engine: %s",
                     st == KHUB_STATUS_OK ? "no thread"
                     : *khub_runtime_errmsg(khub_model_runtime(m))
                         ? khub_runtime_errmsg(khub_model_runtime(m))
                         : khub_last_error());
        batch_free_engine(&e->base);
        return NULL;
    }
    pthread_mutex_lock(&e->mu);
    e->started = 1;
    pthread_mutex_unlock(&e->mu);
    return &e->base;
}
