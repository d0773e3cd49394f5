/*
 * batch.c: the khub_batch API (khub_batch.h): requests copied at submit
 * into the waiting queue, cancellation, the step and run loops, stats, and
 * the end of a request (result, on_done, KV given back). The scheduling
 * itself, one forward step, is scheduler.c. See batch_impl.h for what the
 * lock guards.
 */
#include <string.h>
#include <time.h>

#include "app_struct.h"
#include "batch_impl.h"

double khub__batch_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ======================================================================== */
/* Requests                                                                 */
/* ======================================================================== */

static void breq_free(khub_batch *b, khub__breq *r)
{
    khub_runtime *rt = b->m->rt;
    khub__gen_seq_free(b->m, &r->seq);
    khub__strfree(rt, r->prompt);
    khub__strfree(rt, r->system);
    for (uint32_t k = 0; r->stops && k < r->o.n_stop; k++) khub__strfree(rt, r->stops[k]);
    khub__free(rt, r->stops, r->stops ? r->o.n_stop * sizeof *r->stops : 0);
    khub__free(rt, r->tokens, r->tokens ? r->n_tokens * sizeof *r->tokens : 0);
    khub__free(rt, r, sizeof *r);
}

/* Checks req (messages to the thread's last error: submit may run on any
 * thread, the runtime's message belongs to the loop). */
static khub_status check_request(const khub_batch *b, const khub_batch_request *req)
{
    KHUB__APP_CHECK(NULL, req, KHUB__SIZE_TO(khub_batch_request, ud), "khub_batch_submit", "req");
    KHUB_RETURN_IF(NULL, !req->prompt == !req->tokens, KHUB_STATUS_INVALID_ARG,
                   "khub_batch_submit: a request needs a prompt or tokens (not both)");
    KHUB_RETURN_IF(NULL, req->tokens && req->n_tokens == 0, KHUB_STATUS_INVALID_ARG,
                   "khub_batch_submit: tokens with n_tokens 0");
    int32_t vocab = (int32_t)b->m->cfg.vocab_size;
    for (size_t i = 0; req->tokens && i < req->n_tokens; i++)
        KHUB_RETURN_IF(NULL, req->tokens[i] < 0 || req->tokens[i] >= vocab, KHUB_STATUS_INVALID_ARG,
                       "khub_batch_submit: token %zu is %d, outside the vocabulary [0, %d)", i,
                       (int)req->tokens[i], (int)vocab);
    return KHUB_STATUS_OK;
}

/* Copies what req points to into r. */
static khub_status copy_request(khub_batch *b, const khub_batch_request *req, khub__breq *r)
{
    khub_runtime *rt = b->m->rt;
    KHUB_FORWARD_IF_ERROR(NULL, khub__gen_read_opts(NULL, "khub_batch_submit", req->opts, &r->o));
    r->o.callback = NULL;
    r->o.callback_ud = NULL;
    bool ok = true;
    if (req->prompt) ok = (r->prompt = khub__strdup(rt, req->prompt)) != NULL;
    if (req->tokens) {
        r->tokens = khub__calloc(rt, req->n_tokens, sizeof *r->tokens);
        if ((ok = r->tokens != NULL)) memcpy(r->tokens, req->tokens, req->n_tokens * 4);
        r->n_tokens = req->n_tokens;
    }
    if (ok && r->o.system) ok = (r->system = khub__strdup(rt, r->o.system)) != NULL;
    r->o.system = r->system;
    uint32_t n_stop = r->o.n_stop;
    r->o.n_stop = 0; /* counts the copies made, for breq_free */
    if (ok && n_stop) ok = (r->stops = khub__calloc(rt, n_stop, sizeof *r->stops)) != NULL;
    for (uint32_t k = 0; ok && k < n_stop; k++, r->o.n_stop++)
        ok = (r->stops[k] = khub__strdup(rt, r->o.stop[k])) != NULL;
    if (!r->stops) r->o.n_stop = n_stop; /* none were to be copied */
    r->o.stop = (const char *const *)r->stops;
    KHUB_RETURN_IF(NULL, !ok, KHUB_STATUS_NOMEM, "khub_batch_submit: no memory for a request");
    return KHUB_STATUS_OK;
}

khub_status khub_batch_submit(khub_batch *b, const khub_batch_request *req, uint64_t *id)
{
    KHUB_API_CHECK(NULL, b && req);
    khub__clear(NULL);
    KHUB_FORWARD_IF_ERROR(NULL, check_request(b, req));
    khub__breq *r = khub__calloc(b->m->rt, 1, sizeof *r);
    KHUB_RETURN_IF(NULL, !r, KHUB_STATUS_NOMEM, "khub_batch_submit: no memory for a request");
    r->slot = -1;
    r->on_text = req->on_text;
    r->on_done = req->on_done;
    r->ud = req->ud;
    r->t_submit = khub__batch_now_ms();
    khub_status st = copy_request(b, req, r);
    if (st != KHUB_STATUS_OK) {
        breq_free(b, r);
        return st;
    }
    pthread_mutex_lock(&b->mu);
    if (b->max_queue && b->n_queued >= b->max_queue) {
        int64_t q = b->n_queued;
        pthread_mutex_unlock(&b->mu);
        breq_free(b, r);
        return khub__fail(NULL, KHUB_STATUS_BUSY,
                          "khub_batch_submit: %lld requests are waiting (max_queue); try later",
                          (long long)q);
    }
    r->id = ++b->next_id;
    r->next = b->live;
    if (b->live) b->live->prev = r;
    b->live = r;
    if (b->q_tail)
        b->q_tail->qnext = r;
    else
        b->q_head = r;
    b->q_tail = r;
    b->n_queued++;
    b->stats.queued = b->n_queued;
    if (id) *id = r->id;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return KHUB_STATUS_OK;
}

khub_status khub_batch_cancel(khub_batch *b, uint64_t id)
{
    KHUB_API_CHECK(NULL, b);
    khub__clear(NULL);
    pthread_mutex_lock(&b->mu);
    khub__breq *r = b->live;
    while (r && r->id != id) r = r->next;
    if (r && !r->cancelled) {
        r->cancelled = 1;
        b->n_cancels++;
        pthread_cond_signal(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    KHUB_RETURN_IF(NULL, !r, KHUB_STATUS_NOT_FOUND,
                   "khub_batch_cancel: no request %llu (unknown, or it has ended)",
                   (unsigned long long)id);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* End, release, preemption                                                 */
/* ======================================================================== */

void khub__batch_release(khub_batch *b, khub__breq *r)
{
    if (r->slot < 0) return;
    /* Truncating a dense slot cannot fail for a valid slot; a plugin that
     * fails is logged and the slot is reset again when it is next used. */
    if (khub__kv_release(b->m, r->slot) != KHUB_STATUS_OK)
        KHUB_LOG_W(b->m->rt, "releasing KV sequence %d: %s", (int)r->slot,
                   khub_runtime_errmsg(b->m->rt));
    b->slot_used[r->slot] = 0;
    r->slot = -1;
    r->ctx = 0;
    int j = 0;
    for (int i = 0; i < b->n_run; i++)
        if (b->running[i] != r) b->running[j++] = b->running[i];
    b->n_run = j;
}

void khub__batch_preempt(khub_batch *b, khub__breq *r)
{
    khub__batch_release(b, r);
    r->n_preempted++;
    pthread_mutex_lock(&b->mu);
    r->state = KHUB__BREQ_WAITING;
    r->qnext = b->q_head;
    b->q_head = r;
    if (!b->q_tail) b->q_tail = r;
    b->n_running--;
    b->n_queued++;
    b->stats.preemptions++;
    pthread_mutex_unlock(&b->mu);
}

static double rate(int64_t n, double ms) { return ms > 0 ? (double)n * 1e3 / ms : 0; }

void khub__batch_end(khub_batch *b, khub__breq *r, khub_status st, const char *msg, uint32_t why)
{
    khub_model *m = b->m;
    /* The whole message, copied before anything below can overwrite the
     * runtime's (msg is often khub_runtime_errmsg): at most KHUB_ERROR_SIZE - 1
     * bytes, as every message; error keeps its first 255. */
    char full[KHUB_ERROR_SIZE];
    snprintf(full, sizeof full, "%s", msg && *msg ? msg : khub_status_str(st));
    khub__gen_end(&r->seq, why);
    const char *text = "";
    size_t len = 0;
    if (r->prepared && st == KHUB_STATUS_OK) {
        st = khub__gen_finish(m, &r->seq, &text, &len);
        if (st != KHUB_STATUS_OK) snprintf(full, sizeof full, "%s", khub_runtime_errmsg(m->rt));
    }
    khub__batch_release(b, r);
    double now = khub__batch_now_ms();
    int64_t n_gen = r->prepared ? (int64_t)(r->seq.n_hist - r->seq.n_prompt) : 0;
    khub_batch_result res = {KHUB_APP_INIT(khub_batch_result)};
    res.id = r->id;
    res.status = st;
    res.stop_reason = r->prepared ? r->seq.stop : why;
    res.text = (char *)text;
    res.text_len = len;
    res.tokens = r->prepared ? r->seq.hist + r->seq.n_prompt : NULL;
    res.n_tokens = n_gen;
    res.n_prompt_tokens = r->prepared ? (int64_t)r->seq.n_prompt : 0;
    res.n_preempted = r->n_preempted;
    res.queue_ms = (r->t_admit ? r->t_admit : now) - r->t_submit;
    res.ttft_ms = r->t_first ? r->t_first - r->t_submit : 0;
    res.total_ms = now - r->t_submit;
    res.decode_tok_s = n_gen > 1 ? rate(n_gen - 1, r->t_last - r->t_first) : 0;
    res.error_full = st != KHUB_STATUS_OK ? full : "";
    if (st != KHUB_STATUS_OK) snprintf(res.error, sizeof res.error, "%s", full);
    if (r->on_done) r->on_done(r->ud, r->id, &res);
    pthread_mutex_lock(&b->mu);
    if (r->prev)
        r->prev->next = r->next;
    else
        b->live = r->next;
    if (r->next) r->next->prev = r->prev;
    if (r->cancelled) b->n_cancels--;
    if (r->state == KHUB__BREQ_RUNNING) b->n_running--;
    b->stats.completed++;
    pthread_mutex_unlock(&b->mu);
    breq_free(b, r);
}

/* ======================================================================== */
/* Engine                                                                   */
/* ======================================================================== */

static khub_status read_config(khub_model *m, const khub_batch_config *in, khub_batch_config *c)
{
    memset(c, 0, sizeof *c);
    if (in) {
        /* 0.1's size (before session 18 anything from 12 bytes was read,
         * the rest as zeros) */
        KHUB__APP_CHECK(m->rt, in, KHUB__SIZE_TO(khub_batch_config, reserved), "khub_batch_new",
                        "cfg");
        khub__app_copy_in(c, sizeof *c, in);
    }
    int64_t cap = khub__kv_capacity_tokens(m);
    KHUB_RETURN_IF(m->rt, c->max_batch_tokens < 0 || c->max_batch_tokens > m->max_batch,
                   KHUB_STATUS_INVALID_ARG,
                   "khub_batch_new: max_batch_tokens %d is outside [1, %d] (the model's max_batch)",
                   (int)c->max_batch_tokens, (int)m->max_batch);
    KHUB_RETURN_IF(m->rt, c->max_seqs < 0 || c->max_seqs > m->max_seqs, KHUB_STATUS_INVALID_ARG,
                   "khub_batch_new: max_seqs %d is outside [1, %d] (the model's max_seqs)",
                   (int)c->max_seqs, (int)m->max_seqs);
    KHUB_RETURN_IF(m->rt, c->max_kv_tokens < 0 || c->max_kv_tokens > cap, KHUB_STATUS_INVALID_ARG,
                   "khub_batch_new: max_kv_tokens %lld is outside [1, %lld] (the KV cache)",
                   (long long)c->max_kv_tokens, (long long)cap);
    KHUB_RETURN_IF(m->rt, c->max_queue < 0, KHUB_STATUS_INVALID_ARG,
                   "khub_batch_new: max_queue %d is negative", (int)c->max_queue);
    if (!c->max_batch_tokens) c->max_batch_tokens = m->max_batch;
    if (!c->max_seqs) c->max_seqs = m->max_seqs;
    return KHUB_STATUS_OK;
}

khub_status khub_batch_new(khub_model *m, const khub_batch_config *cfg, khub_batch **out)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && out);
    khub__clear(m->rt);
    *out = NULL;
    khub_batch_config c;
    KHUB_FORWARD_IF_ERROR(m->rt, read_config(m, cfg, &c));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__kv_set_limit(m, c.max_kv_tokens));
    khub_batch *b = khub__calloc(m->rt, 1, sizeof *b);
    KHUB_RETURN_IF(m->rt, !b, KHUB_STATUS_NOMEM, "khub_batch_new: out of memory");
    b->m = m;
    b->max_batch_tokens = c.max_batch_tokens;
    b->max_seqs = c.max_seqs;
    b->max_queue = c.max_queue;
    b->running = khub__calloc(m->rt, (size_t)c.max_seqs, sizeof *b->running);
    b->tokens = khub__calloc(m->rt, (size_t)c.max_batch_tokens, sizeof *b->tokens);
    b->segs = khub__calloc(m->rt, (size_t)c.max_seqs, sizeof *b->segs);
    b->seg_req = khub__calloc(m->rt, (size_t)c.max_seqs, sizeof *b->seg_req);
    b->slot_used = khub__calloc(m->rt, (size_t)m->max_seqs, 1);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->stats = (khub_batch_stats){KHUB_APP_INIT(khub_batch_stats)};
    if (!b->running || !b->tokens || !b->segs || !b->seg_req || !b->slot_used) {
        khub_batch_free(b);
        return khub__fail(m->rt, KHUB_STATUS_NOMEM, "khub_batch_new: out of memory");
    }
    *out = b;
    return KHUB_STATUS_OK;
}

void khub_batch_free(khub_batch *b)
{
    if (!b) return;
    khub_model *m = b->m;
    while (b->live) {
        khub__breq *r = b->live;
        if (r->state == KHUB__BREQ_WAITING) { /* out of the queue first */
            khub__breq **p = &b->q_head;
            while (*p != r) p = &(*p)->qnext;
            *p = r->qnext;
        }
        khub__batch_end(b, r, KHUB_STATUS_OK, NULL, KHUB_STOP_CANCELLED);
    }
    khub__kv_set_limit(m, 0);
    khub__free(m->rt, b->running, b->running ? (size_t)b->max_seqs * sizeof *b->running : 0);
    khub__free(m->rt, b->tokens, b->tokens ? (size_t)b->max_batch_tokens * sizeof *b->tokens : 0);
    khub__free(m->rt, b->segs, b->segs ? (size_t)b->max_seqs * sizeof *b->segs : 0);
    khub__free(m->rt, b->seg_req, b->seg_req ? (size_t)b->max_seqs * sizeof *b->seg_req : 0);
    khub__free(m->rt, b->slot_used, b->slot_used ? (size_t)m->max_seqs : 0);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    khub__free(m->rt, b, sizeof *b);
}

/* ======================================================================== */
/* Loop                                                                     */
/* ======================================================================== */

static int64_t pending_locked(const khub_batch *b) { return b->n_queued + b->n_running; }

khub_status khub_batch_step(khub_batch *b, int64_t *pending)
{
    KHUB_API_CHECK(b ? b->m->rt : NULL, b);
    khub__clear(b->m->rt);
    khub_status st = khub__sched_step(b);
    pthread_mutex_lock(&b->mu);
    if (pending) *pending = pending_locked(b);
    pthread_mutex_unlock(&b->mu);
    return st;
}

khub_status khub_batch_run(khub_batch *b, int wait)
{
    KHUB_API_CHECK(b ? b->m->rt : NULL, b);
    khub_status first = KHUB_STATUS_OK;
    for (;;) {
        int64_t left = 0;
        khub_status st = khub_batch_step(b, &left);
        if (first == KHUB_STATUS_OK) first = st;
        pthread_mutex_lock(&b->mu);
        if (b->stop) {
            b->stop = 0;
            pthread_mutex_unlock(&b->mu);
            return first;
        }
        if (pending_locked(b) == 0) {
            if (!wait) {
                pthread_mutex_unlock(&b->mu);
                return first;
            }
            while (!b->stop && pending_locked(b) == 0) pthread_cond_wait(&b->cv, &b->mu);
        }
        pthread_mutex_unlock(&b->mu);
    }
}

void khub_batch_stop(khub_batch *b)
{
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

khub_status khub_batch_stats_get(khub_batch *b, khub_batch_stats *stats)
{
    KHUB_API_CHECK(NULL, b && stats);
    KHUB__APP_CHECK(NULL, stats, KHUB__SIZE_TO(khub_batch_stats, generated_tokens),
                    "khub_batch_stats_get", "stats");
    pthread_mutex_lock(&b->mu);
    khub_batch_stats s = b->stats;
    s.queued = b->n_queued;
    s.running = b->n_running;
    pthread_mutex_unlock(&b->mu);
    /* up to its struct_size, the caller's header kept (ABI.md rule 5; before
     * session 18 the library's stamp was written over the caller's) */
    khub__app_copy_out(stats, &s, sizeof s);
    return KHUB_STATUS_OK;
}
