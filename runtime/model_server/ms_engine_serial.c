/*
 * ms_engine_serial.c: the request engine that runs one request at a time
 * through khub_model_generate, in a thread of its own, with a bounded FIFO
 * of waiting requests: the simple reference beside the continuous-batching
 * engine (ms_engine_batch.c), chosen with khub_model_server_opts.serial.
 *
 * Only this thread touches the model: it formats chat messages with the
 * model's template, counts the prompt's tokens against the context (a 400
 * with the numbers rather than a generation that cannot start), and
 * generates, streaming each piece into the request. A request cancelled
 * while queued is finished without running; one cancelled while running
 * stops at its next token (the stream callback returns nonzero).
 */
#include <stdlib.h>
#include <string.h>

#include "model_server.h"

typedef struct serial {
    khub__ms_engine base;
    khub_model *m;
    khub_model_info info;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    khub__ms_req **q; /* ring of [max_queue] */
    uint32_t max_queue, head, n;
    int stopping, idle;
    khub__ms_req *running;
    uint64_t kv_tokens;  /* the running request's prompt plus pieces streamed */
    khub__ms_swap *swap; /* a kernel swap to run before the next request (ms_swap.c) */
} serial;

/* ======================================================================== */
/* One request                                                              */
/* ======================================================================== */

typedef struct run_ctx {
    serial *e;
    khub__ms_req *r;
} run_ctx;

static int on_text(void *ud, int32_t prompt, const char *text, size_t len)
{
    run_ctx *x = ud;
    (void)prompt;
    pthread_mutex_lock(&x->e->mu);
    x->e->kv_tokens++;
    int stop = x->e->stopping;
    pthread_mutex_unlock(&x->e->mu);
    return khub__ms_req_append(x->r, text, len) || stop;
}

/* The prompt text: the conversation through the chat template, or the raw
 * prompt. NULL after finishing r with the error. */
static char *prompt_text(serial *e, khub__ms_req *r)
{
    if (!r->chat) return strdup(r->prompt);
    size_t len = 0;
    const char *const *roles = (const char *const *)r->roles;
    const char *const *contents = (const char *const *)r->contents;
    khub_status st = khub_model_chat_format(e->m, roles, contents, r->n_msgs, 1, NULL, 0, &len);
    char *buf = st == KHUB_STATUS_OVERFLOW ? malloc(len + 1) : NULL;
    if (buf) st = khub_model_chat_format(e->m, roles, contents, r->n_msgs, 1, buf, len + 1, &len);
    if (st == KHUB_STATUS_OK) return buf;
    free(buf);
    if (st == KHUB_STATUS_OVERFLOW || st == KHUB_STATUS_NOMEM)
        khub__ms_req_finish(r, 500, "server_error", 0, 0, 0, "out of memory formatting messages");
    else
        khub__ms_req_finish(r, 400, "invalid_request_error", 0, 0, 0, "messages: %s",
                            khub_runtime_errmsg(khub_model_runtime(e->m)));
    return NULL;
}

/* Counts the prompt's tokens and checks them, with max_tokens, against the
 * context; 0 with *max set, or -1 after finishing r with a 400. */
static int fit_context(serial *e, khub__ms_req *r, const char *text, int32_t *max)
{
    size_t n = 0;
    khub_status st = khub_model_tokenize(e->m, text, 1, NULL, 0, &n);
    if (st != KHUB_STATUS_OK && st != KHUB_STATUS_OVERFLOW) {
        khub__ms_req_finish(r, 400, "invalid_request_error", 0, 0, 0, "prompt: %s",
                            khub_runtime_errmsg(khub_model_runtime(e->m)));
        return -1;
    }
    int64_t ctx = e->info.max_context;
    if (n == 0) {
        khub__ms_req_finish(r, 400, "invalid_request_error", 0, 0, 0,
                            "the prompt is empty (0 tokens)");
        return -1;
    }
    /* generate needs room for one generated position after the prompt */
    if ((int64_t)n + 1 > ctx || (r->max_tokens && (int64_t)n + r->max_tokens > ctx)) {
        khub__ms_req_finish(r, 400, "invalid_request_error", (int64_t)n, 0, 0,
                            "this model's maximum context length is %lld tokens; the request "
                            "has %zu prompt tokens and asks for %d to generate",
                            (long long)ctx, n, r->max_tokens ? (int)r->max_tokens : 1);
        return -1;
    }
    *max = r->max_tokens ? r->max_tokens : (int32_t)(ctx - (int64_t)n);
    pthread_mutex_lock(&e->mu);
    e->kv_tokens = n;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static void run_one(serial *e, khub__ms_req *r)
{
    if (khub__ms_req_cancelled(r)) {
        khub__ms_req_finish(r, 499, "cancelled", 0, 0, KHUB_STOP_CALLBACK, "cancelled");
        return;
    }
    char *text = prompt_text(e, r);
    int32_t max = 0;
    if (!text) return;
    if (fit_context(e, r, text, &max) != 0) {
        free(text);
        return;
    }
    run_ctx x = {e, r};
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts),
                             .max_new_tokens = max,
                             .temperature = r->temperature,
                             .top_p = r->top_p,
                             .seed = r->seed,
                             .stop = (const char *const *)r->stop,
                             .n_stop = r->n_stop,
                             .callback = on_text,
                             .callback_ud = &x};
    khub_generate_result res = {KHUB_APP_INIT(khub_generate_result)};
    const char *prompts[] = {text};
    khub_status st = khub_model_generate(e->m, prompts, 1, &go, &res);
    free(text);
    if (st != KHUB_STATUS_OK)
        khub__ms_req_finish(r, 500, "server_error", res.n_prompt_tokens, res.n_tokens, 0,
                            "generation failed: %s", khub_runtime_errmsg(khub_model_runtime(e->m)));
    else
        khub__ms_req_finish(r, 0, NULL, res.n_prompt_tokens, res.n_tokens, res.stop_reason, NULL);
    khub_generate_results_free(e->m, &res, 1);
}

/* ======================================================================== */
/* The engine thread and its queue                                          */
/* ======================================================================== */

static void *loop(void *arg)
{
    serial *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->n && !e->stopping && !e->swap) {
            e->idle = 1;
            pthread_cond_broadcast(&e->cv);
            pthread_cond_wait(&e->cv, &e->mu);
        }
        if (e->swap && !e->stopping) { /* between requests: the model is idle */
            pthread_mutex_unlock(&e->mu);
            khub__ms_swap_serve(e->m, &e->mu, &e->cv, &e->swap);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        if (!e->n && e->stopping) break;
        e->idle = 0;
        khub__ms_req *r = e->q[e->head];
        e->head = (e->head + 1) % e->max_queue;
        e->n--;
        e->running = r;
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping)
            khub__ms_req_finish(r, 503, "server_error", 0, 0, 0, "the server is shutting down");
        else
            run_one(e, r);
        khub__ms_req_unref(r);
        pthread_mutex_lock(&e->mu);
        e->running = NULL;
        e->kv_tokens = 0;
    }
    e->idle = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static int serial_submit(khub__ms_engine *base, khub__ms_req *r)
{
    serial *e = (serial *)base;
    pthread_mutex_lock(&e->mu);
    int ok = !e->stopping && e->n < e->max_queue;
    if (ok) {
        khub__ms_req_ref(r);
        e->q[(e->head + e->n) % e->max_queue] = r;
        e->n++;
        e->idle = 0;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return ok;
}

/* The running request stops at its next token (on_text sees the flag); a
 * queued one is finished when its turn comes, without running. */
static void serial_cancel(khub__ms_engine *base, khub__ms_req *r) { (void)base, (void)r; }

static void serial_stats(khub__ms_engine *base, khub__ms_engine_stats *out)
{
    serial *e = (serial *)base;
    pthread_mutex_lock(&e->mu);
    out->queued = e->n;
    out->running = e->running != NULL;
    out->kv_tokens = e->kv_tokens;
    out->kv_capacity = (uint64_t)e->info.max_context;
    pthread_mutex_unlock(&e->mu);
}

static void serial_shutdown(khub__ms_engine *base)
{
    serial *e = (serial *)base;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_broadcast(&e->cv);
    while (e->started && !e->idle) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

static void serial_free(khub__ms_engine *base)
{
    serial *e = (serial *)base;
    if (!e) return;
    serial_shutdown(base);
    if (e->started) pthread_join(e->thread, NULL);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e->q);
    free(e);
}

static void serial_swap(khub__ms_engine *base, khub__ms_swap *box)
{
    serial *e = (serial *)base;
    khub__ms_swap_wait(&e->mu, &e->cv, &e->swap, &e->stopping, box);
}

static const khub__ms_engine_vt serial_vt = {serial_submit,   serial_cancel, serial_stats,
                                             serial_shutdown, serial_free,   serial_swap};

khub__ms_engine *khub__ms_engine_serial_new(khub_model *m, uint32_t max_queue)
{
    serial *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->base.vt = &serial_vt;
    e->m = m;
    e->info = (khub_model_info){KHUB_APP_INIT(khub_model_info)};
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->max_queue = max_queue;
    e->q = calloc(max_queue, sizeof *e->q);
    if (!e->q || khub_model_info_get(m, &e->info) != KHUB_STATUS_OK ||
        pthread_create(&e->thread, NULL, loop, e) != 0) {
        serial_free(&e->base);
        return NULL;
    }
    e->started = 1;
    return &e->base;
}
