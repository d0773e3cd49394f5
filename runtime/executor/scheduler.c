/*
 * scheduler.c: one step of continuous batching (khub_batch_step): which
 * requests get how many tokens in the next forward call, the call, and what
 * follows it (sampling, streaming, ends). Issue 13 item 3.
 *
 * Prefill and decode are one thing here: a running request has fed
 * seq.hist[0..ctx) to its KV and needs hist[ctx..n_hist); when a step feeds
 * it up to n_hist, the step's logits for its last token give the next token.
 * Decode is the case of one token left; a preempted request (ctx back to 0)
 * recomputes its prompt and output so far the same way.
 *
 * Order within a step (vLLM's): running requests that decode, then running
 * prefills, both in admission order, then waiting requests first come first
 * served while the step has tokens (max_batch_tokens), segments (max_seqs)
 * and KV left; a new request is admitted only when the KV has room for what
 * it has to feed, so it does not evict others at once. When a running
 * request cannot grow, the request admitted last that is not in this step
 * is preempted (its KV freed, back to the head of the queue); a request
 * that cannot grow even alone ends with KHUB_STOP_CONTEXT.
 */
#include <string.h>

#include "batch_impl.h"

typedef struct plan {
    int n_segs;
    int64_t n_tokens;
    int any_prefill; /* a segment of more than one token, or a first chunk */
} plan;

/* ======================================================================== */
/* Cancellations                                                            */
/* ======================================================================== */

/* Ends the requests cancelled since the last step. */
static void reap_cancelled(khub_batch *b)
{
    for (;;) {
        pthread_mutex_lock(&b->mu);
        khub__breq *r = b->n_cancels ? b->live : NULL;
        while (r && !r->cancelled) r = r->next;
        if (r && r->state == KHUB__BREQ_WAITING) {
            khub__breq **p = &b->q_head;
            while (*p != r) p = &(*p)->qnext;
            *p = r->qnext;
            if (b->q_tail == r) {
                khub__breq *t = b->q_head;
                while (t && t->qnext) t = t->qnext;
                b->q_tail = t;
            }
            b->n_queued--;
        }
        pthread_mutex_unlock(&b->mu);
        if (!r) return;
        khub__batch_end(b, r, KHUB_STATUS_OK, NULL, KHUB_STOP_CANCELLED);
    }
}

/* ======================================================================== */
/* Planning                                                                 */
/* ======================================================================== */

static bool in_plan(const khub_batch *b, const plan *p, const khub__breq *r)
{
    for (int k = 0; k < p->n_segs; k++)
        if (b->seg_req[k] == r) return true;
    return false;
}

/* The request admitted last that is running, not r and not in this step,
 * if it was admitted after r; else NULL. */
static khub__breq *victim(khub_batch *b, const plan *p, const khub__breq *r)
{
    for (int i = b->n_run - 1; i >= 0; i--) {
        khub__breq *v = b->running[i];
        if (v == r || in_plan(b, p, v)) continue;
        return v->order > r->order ? v : NULL;
    }
    return NULL;
}

static void add_seg(khub_batch *b, plan *p, khub__breq *r, int64_t take)
{
    memcpy(b->tokens + p->n_tokens, r->seq.hist + r->ctx, (size_t)take * sizeof *b->tokens);
    b->segs[p->n_segs] = (khub__seg){r->slot, 0, r->ctx, take};
    b->seg_req[p->n_segs++] = r;
    p->n_tokens += take;
    if (take > 1 || r->ctx == 0) p->any_prefill = 1;
}

/* Grows r's KV for as much of its pending tokens as the step and the cache
 * allow, preempting later requests when it must, and plans it. Returns
 * false when r was ended or preempted (the running list changed). */
static bool plan_running(khub_batch *b, plan *p, khub__breq *r)
{
    khub_model *m = b->m;
    if ((int64_t)r->seq.n_hist > khub__kv_limit_tokens(m)) {
        /* Its next token needs more KV than the batch has at all. */
        khub__batch_end(b, r, KHUB_STATUS_OK, NULL, KHUB_STOP_CONTEXT);
        return false;
    }
    int64_t want = (int64_t)r->seq.n_hist - r->ctx;
    if (want > b->max_batch_tokens - p->n_tokens) want = b->max_batch_tokens - p->n_tokens;
    if (want <= 0 || p->n_segs == b->max_seqs) return true;
    for (;;) {
        if (khub__kv_can_grow(m, r->slot, r->ctx + want)) break;
        int64_t avail = khub__kv_free_tokens(m);
        if (avail > 0 && avail < want) {
            want = avail; /* a prefill takes what is free */
            continue;
        }
        khub__breq *v = victim(b, p, r);
        if (v) {
            khub__batch_preempt(b, v);
            continue;
        }
        if (p->n_segs > 0) return true; /* wait for this step's requests */
        if (b->n_run > 1) {             /* older ones hold the cache: yield to them */
            khub__batch_preempt(b, r);
            return false;
        }
        khub__batch_end(b, r, KHUB_STATUS_OK, NULL, KHUB_STOP_CONTEXT);
        return false;
    }
    if (khub__kv_grow(m, r->slot, r->ctx + want) != KHUB_STATUS_OK) return true;
    add_seg(b, p, r, want);
    return true;
}

/* Tokenizes r and makes its sequence (once: a preempted request keeps it). */
static khub_status prepare(khub_batch *b, khub__breq *r)
{
    khub_model *m = b->m;
    if (r->prepared) return KHUB_STATUS_OK;
    char label[48];
    snprintf(label, sizeof label, "request %llu", (unsigned long long)r->id);
    int32_t *ids = r->tokens;
    size_t n = r->n_tokens;
    khub_status st = KHUB_STATUS_OK;
    if (r->prompt)
        st = khub__gen_prompt_ids(m, label, r->prompt, (int)r->o.chat, r->system, &ids, &n);
    else if (n + 1 > (size_t)m->max_context)
        st = khub__fail(m->rt, KHUB_STATUS_CONTEXT_FULL,
                        "%s has %zu tokens; the KV cache holds %lld per sequence "
                        "(raise max_context)",
                        label, n, (long long)m->max_context);
    if (st == KHUB_STATUS_OK && (int64_t)n + 1 > khub__kv_limit_tokens(m))
        st = khub__fail(m->rt, KHUB_STATUS_CONTEXT_FULL,
                        "%s has %zu tokens; the batch's KV cache holds %lld in all "
                        "(raise max_kv_tokens)",
                        label, n, (long long)khub__kv_limit_tokens(m));
    if (st == KHUB_STATUS_OK) st = khub__gen_seq_init(m, &r->seq, ids, n, &r->o);
    if (r->prompt && ids) khub__tokenizer_free_ids(m->tok, ids, n);
    if (st != KHUB_STATUS_OK) return st;
    r->seq.emit = NULL;
    r->prepared = 1;
    return KHUB_STATUS_OK;
}

static int32_t free_slot(const khub_batch *b)
{
    for (int32_t s = 0; s < b->m->max_seqs; s++)
        if (!b->slot_used[s]) return s;
    return -1;
}

/* Takes the queue's head r out of the queue (the loop alone removes from
 * the head, so it is still r). */
static void unqueue_head(khub_batch *b, khub__breq *r, bool running)
{
    pthread_mutex_lock(&b->mu);
    b->q_head = r->qnext;
    if (!b->q_head) b->q_tail = NULL;
    r->qnext = NULL;
    b->n_queued--;
    if (running) {
        r->state = KHUB__BREQ_RUNNING;
        b->n_running++;
    }
    pthread_mutex_unlock(&b->mu);
}

static int emit_text(void *ud, const char *text, size_t len)
{
    khub__breq *r = ud;
    return r->on_text ? r->on_text(r->ud, r->id, text, len) : 0;
}

/* Admits waiting requests in order while the step and the cache have room. */
static void admit(khub_batch *b, plan *p)
{
    khub_model *m = b->m;
    while (p->n_segs < b->max_seqs && b->n_run < b->max_seqs && p->n_tokens < b->max_batch_tokens) {
        pthread_mutex_lock(&b->mu);
        khub__breq *r = b->q_head;
        pthread_mutex_unlock(&b->mu);
        if (!r) return;
        khub_status st = prepare(b, r);
        if (st != KHUB_STATUS_OK) {
            unqueue_head(b, r, false);
            khub__batch_end(b, r, st, khub_runtime_errmsg(m->rt), KHUB_STOP_NONE);
            khub__clear(m->rt);
            continue;
        }
        r->seq.emit = emit_text;
        r->seq.emit_ud = r;
        if ((int64_t)r->seq.n_hist > khub__kv_limit_tokens(m)) {
            /* Preempted when its next token needed more than the limit. */
            unqueue_head(b, r, false);
            khub__batch_end(b, r, KHUB_STATUS_OK, NULL, KHUB_STOP_CONTEXT);
            continue;
        }
        int32_t slot = free_slot(b);
        if (slot < 0 || (int64_t)r->seq.n_hist > khub__kv_free_tokens(m)) return;
        unqueue_head(b, r, true);
        b->slot_used[slot] = 1;
        r->slot = slot;
        r->ctx = 0;
        r->order = ++b->order;
        if (!r->t_admit) r->t_admit = khub__batch_now_ms();
        b->running[b->n_run++] = r;
        /* The slot may hold another user's tokens (khub_model_logits). */
        if (khub__kv_release(m, slot) != KHUB_STATUS_OK) {
            khub__batch_end(b, r, KHUB_STATUS_INTERNAL, khub_runtime_errmsg(m->rt), KHUB_STOP_NONE);
            khub__clear(m->rt);
            continue;
        }
        if (!plan_running(b, p, r)) return;
    }
}

static void make_plan(khub_batch *b, plan *p)
{
    memset(p, 0, sizeof *p);
    /* Decodes first, then prefills; a preemption or an end changes
     * running[], so each pass restarts until it makes no change. */
    for (int pass = 0; pass < 2; pass++) {
    again:
        for (int i = 0; i < b->n_run; i++) {
            khub__breq *r = b->running[i];
            bool decode = (int64_t)r->seq.n_hist - r->ctx == 1;
            if (decode != (pass == 0) || in_plan(b, p, r)) continue;
            if (!plan_running(b, p, r)) goto again;
        }
    }
    admit(b, p);
}

/* ======================================================================== */
/* The step                                                                 */
/* ======================================================================== */

/* After the forward call: each segment's KV is in; a request fed to its
 * last token samples its next one. */
static void take_outputs(khub_batch *b, const plan *p)
{
    khub_model *m = b->m;
    double now = khub__batch_now_ms();
    int64_t vocab = m->cfg.vocab_size, gen = 0;
    for (int k = 0; k < p->n_segs; k++) {
        khub__breq *r = b->seg_req[k];
        r->ctx += b->segs[k].n;
        if (r->ctx != (int64_t)r->seq.n_hist) continue;
        khub_status st = khub__gen_sample(m, &r->seq, m->logits + (size_t)k * (size_t)vocab);
        gen++;
        if (!r->t_first) r->t_first = now;
        r->t_last = now;
        if (st != KHUB_STATUS_OK) {
            khub__batch_end(b, r, st, khub_runtime_errmsg(m->rt), KHUB_STOP_NONE);
            khub__clear(m->rt);
        } else if (!r->seq.live) {
            khub__batch_end(b, r, KHUB_STATUS_OK, NULL, r->seq.stop);
        }
    }
    pthread_mutex_lock(&b->mu);
    b->stats.generated_tokens += gen;
    pthread_mutex_unlock(&b->mu);
}

/* The step's counts and the KV held after it. */
static void update_stats(khub_batch *b, const plan *p)
{
    khub_model *m = b->m;
    int64_t prompt = 0;
    for (int k = 0; k < p->n_segs; k++)
        if (b->segs[k].n > 1 || b->segs[k].pos0 == 0) prompt += b->segs[k].n;
    pthread_mutex_lock(&b->mu);
    b->stats.steps += p->n_segs > 0;
    b->stats.prompt_tokens += prompt;
    b->stats.kv_tokens_used = khub__kv_used_tokens(m);
    b->stats.kv_tokens_limit = khub__kv_limit_tokens(m);
    b->stats.kv_blocks_used = b->n_run;
    b->stats.kv_blocks_total = b->max_seqs;
    pthread_mutex_unlock(&b->mu);
}

/* The forward call of plan p and what follows it. */
static khub_status run_plan(khub_batch *b, const plan *p)
{
    khub_model *m = b->m;
    double t0 = khub__batch_now_ms();
    khub_status st = khub__forward(m, b->tokens, b->segs, p->n_segs);
    double ms = khub__batch_now_ms() - t0;
    if (p->any_prefill) {
        b->prefill_ms += ms;
        b->prefill_tokens += p->n_tokens;
    } else {
        b->decode_ms += ms;
        b->decode_tokens += p->n_tokens;
    }
    if (st == KHUB_STATUS_OK) {
        take_outputs(b, p);
        return KHUB_STATUS_OK;
    }
    /* The failed call may have written part of these sequences' KV: they
     * end with its status; the others are not in it and go on. */
    char msg[KHUB_ERROR_SIZE]; /* whole on the runtime; a result's error keeps 255 bytes */
    snprintf(msg, sizeof msg, "%s", khub_runtime_errmsg(m->rt));
    for (int k = 0; k < p->n_segs; k++) khub__batch_end(b, b->seg_req[k], st, msg, KHUB_STOP_NONE);
    return khub__fail(m->rt, st, "%s", msg);
}

khub_status khub__sched_step(khub_batch *b)
{
    reap_cancelled(b);
    plan p;
    make_plan(b, &p);
    if (p.n_segs == 0) {
        update_stats(b, &p);
        return KHUB_STATUS_OK;
    }
    khub_status st = run_plan(b, &p);
    update_stats(b, &p);
    return st;
}
