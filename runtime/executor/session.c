/*
 * session.c: khub_session (khub_session.h), a conversation that keeps its
 * KV cache between generate calls (issue 16 item 5, `khub chat`).
 *
 * The session owns one KV sequence (the model's last, so that
 * khub_model_generate with fewer prompts than max_seqs leaves it alone) and
 * the ids whose K/V it holds, ids[0..n_ids). A generate call tokenizes the
 * whole prompt, keeps the longest common prefix with ids (at most all but
 * the prompt's last token: the last one must be fed to get logits),
 * truncates the cache there, and then runs the one-sequence loop that
 * khub_model_logits runs for a prompt: chunks of max_batch tokens through
 * khub__forward, then one token per step, sampling and streaming through
 * gen_seq.c exactly as the batch scheduler does. Comparing token ids, not
 * text, is what makes the reuse safe: an answer that the template's text
 * tokenizes differently (a BPE merge across the answer's end) simply
 * reuses less.
 *
 * Someone else's use of the sequence (the batch scheduler resets a slot
 * before it admits a request into it; khub_model_logits resets sequence
 * 0) bumps m->seq_resets[seq]; the session compares it with the count
 * after its own last change and forgets its ids when they differ.
 * Rejected: a single-sequence khub_batch kept alive between turns. The
 * batch frees a request's KV when it ends, and a request that outlives its
 * answer would need a new request state that only this caller wants.
 */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "app_struct.h"
#include "gen_seq.h"
#include "khub/khub_session.h"
#include "timing.h"

#define SESSION_INFO_0_1 KHUB__SIZE_TO(khub_session_info, n_prefilled)

struct khub_session {
    khub_model *m;
    int32_t seq;  /* its KV sequence */
    int32_t *ids; /* owned, [cap]: ids[0..n_ids) have K/V in seq */
    size_t n_ids, cap;
    uint64_t resets; /* m->seq_resets[seq] after the session's last truncate */
    int64_t n_reused, n_prefilled;
    /* Set by khub_session_cancel from any thread or a signal handler (a
     * lock-free atomic store is async-signal-safe); run() reads it before
     * every forward call and clears it when a generate call returns. */
    atomic_int cancel;
};

/* ======================================================================== */
/* Lifetime                                                                 */
/* ======================================================================== */

khub_status khub_session_new(khub_model *m, khub_session **out)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && out);
    khub_runtime *rt = m->rt;
    khub__clear(rt);
    *out = NULL;
    KHUB_RETURN_IF(rt, m->session, KHUB_STATUS_BUSY,
                   "khub_session_new: %s already has a session (one per model: free it first)",
                   m->file);
    khub_session *s = khub__calloc(rt, 1, sizeof *s);
    KHUB_RETURN_IF(rt, !s, KHUB_STATUS_NOMEM, "khub_session_new: no memory");
    s->m = m;
    s->seq = m->max_seqs - 1;
    s->resets = m->seq_resets[s->seq] - 1; /* not ours yet: the first call resets it */
    m->session = s;
    *out = s;
    return KHUB_STATUS_OK;
}

void khub_session_free(khub_session *s)
{
    if (!s) return;
    khub_model *m = s->m;
    if (s->resets == m->seq_resets[s->seq] && khub__kv_release(m, s->seq) != KHUB_STATUS_OK)
        KHUB_LOG_W(m->rt, "khub_session_free: releasing KV sequence %d: %s", (int)s->seq,
                   khub_runtime_errmsg(m->rt));
    m->session = NULL;
    khub__free(m->rt, s->ids, s->cap * sizeof *s->ids);
    khub__free(m->rt, s, sizeof *s);
}

/* Empties the sequence and makes it the session's again. */
static khub_status forget(khub_session *s)
{
    s->n_ids = 0;
    khub_status st = khub__kv_release(s->m, s->seq);
    s->resets = s->m->seq_resets[s->seq];
    return st;
}

khub_status khub_session_reset(khub_session *s)
{
    KHUB_API_CHECK(s ? s->m->rt : NULL, s);
    khub__clear(s->m->rt);
    s->n_reused = s->n_prefilled = 0;
    return forget(s);
}

khub_status khub_session_info_get(const khub_session *s, khub_session_info *info)
{
    KHUB_API_CHECK(s ? s->m->rt : NULL, s && info);
    khub__clear(s->m->rt); /* its own message, not an earlier call's */
    /* 0.1's size at least (since session 17; it asked for this header's
     * sizeof): every field written here is a 0.1 field. */
    KHUB__APP_CHECK(s->m->rt, info, SESSION_INFO_0_1, "khub_session_info_get", "info");
    bool ours = s->resets == s->m->seq_resets[s->seq];
    info->n_cached = ours ? (int64_t)s->n_ids : 0;
    info->max_context = s->m->max_context;
    info->n_reused = s->n_reused;
    info->n_prefilled = s->n_prefilled;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Reuse                                                                    */
/* ======================================================================== */

/* Keeps the cached prefix that ids[n] starts with (never all of ids: its
 * last token is fed again for its logits) and truncates the rest. */
static khub_status keep_prefix(khub_session *s, const int32_t *ids, size_t n)
{
    khub_model *m = s->m;
    if (s->resets != m->seq_resets[s->seq]) return forget(s); /* another user's now */
    size_t keep = 0;
    while (keep < s->n_ids && keep + 1 < n && s->ids[keep] == ids[keep]) keep++;
    if (keep == s->n_ids) return KHUB_STATUS_OK;
    if (keep == 0) return forget(s);
    khub_status st = khub__forward_truncate(m, s->seq, (int64_t)keep);
    s->resets = m->seq_resets[s->seq];
    if (st != KHUB_STATUS_OK) {
        /* A cache that dropped older positions (a sliding window) cannot go
         * back: start the sequence over. */
        khub__clear(m->rt);
        return forget(s);
    }
    s->n_ids = keep;
    return KHUB_STATUS_OK;
}

/* Records g's fed ids hist[0..n) as the session's. */
static khub_status remember(khub_session *s, const khub__gen_seq *g, size_t n)
{
    khub_runtime *rt = s->m->rt;
    if (n > s->cap) {
        int32_t *p = khub__realloc(rt, s->ids, s->cap * sizeof *p, n * sizeof *p);
        KHUB_RETURN_IF(rt, !p, KHUB_STATUS_NOMEM, "khub_session_generate: no memory for %zu ids",
                       n);
        s->ids = p;
        s->cap = n;
    }
    memcpy(s->ids, g->hist, n * sizeof *s->ids);
    s->n_ids = n;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Generation                                                               */
/* ======================================================================== */

typedef struct emit_ctx {
    const khub_generate_opts *o;
} emit_ctx;

static int emit(void *ud, const char *text, size_t len)
{
    const emit_ctx *e = ud;
    return e->o->callback(e->o->callback_ud, 0, text, len);
}

static double now_ms(void) { return khub__time_now(CLOCK_MONOTONIC) * 1e3; }

/* Feeds g.hist[s->n_ids..) and samples until g ends; s->n_ids follows the
 * sequence's length. Times into r. */
static khub_status run(khub_session *s, khub__gen_seq *g, khub_generate_result *r)
{
    khub_model *m = s->m;
    double t0 = now_ms(), t_first = 0;
    int64_t decoded = 0;
    while (g->live) {
        /* Checked before each prefill chunk and each decode step: a cancel
         * takes effect within one forward call (max_batch prompt tokens,
         * or one token). What was computed stays cached. */
        if (atomic_load_explicit(&s->cancel, memory_order_relaxed)) {
            khub__gen_end(g, KHUB_STOP_CANCELLED);
            break;
        }
        size_t ctx = (size_t)m->seq_len[s->seq];
        int64_t take = (int64_t)(g->n_hist - ctx);
        if (take > m->max_batch) take = m->max_batch;
        KHUB_FORWARD_IF_ERROR(m->rt, khub__kv_grow(m, s->seq, (int64_t)ctx + take));
        khub__seg seg = {s->seq, 0, (int64_t)ctx, take};
        KHUB_FORWARD_IF_ERROR(m->rt, khub__forward(m, g->hist + ctx, &seg, 1));
        if (ctx + (size_t)take < g->n_hist) continue; /* a prefill chunk */
        if (!t_first)
            t_first = now_ms();
        else
            decoded++;
        KHUB_FORWARD_IF_ERROR(m->rt, khub__gen_sample(m, g, m->logits));
    }
    double t1 = now_ms();
    r->prefill_ms = (t_first ? t_first : t1) - t0;
    r->decode_ms = t_first ? t1 - t_first : 0;
    r->prefill_tok_s = r->prefill_ms > 0 ? (double)s->n_prefilled * 1e3 / r->prefill_ms : 0;
    r->decode_tok_s = r->decode_ms > 0 ? (double)decoded * 1e3 / r->decode_ms : 0;
    return KHUB_STATUS_OK;
}

/* Copies g's answer into r (owned by r). */
static khub_status fill_result(khub_model *m, khub__gen_seq *g, khub_generate_result *r)
{
    const char *text;
    size_t len;
    KHUB_FORWARD_IF_ERROR(m->rt, khub__gen_finish(m, g, &text, &len));
    size_t n_out = g->n_hist - g->n_prompt;
    r->text = khub__malloc(m->rt, len + 1);
    r->tokens = khub__calloc(m->rt, n_out ? n_out : 1, sizeof *r->tokens);
    KHUB_RETURN_IF(m->rt, !r->text || !r->tokens, KHUB_STATUS_NOMEM,
                   "khub_session_generate: no memory for the result");
    memcpy(r->text, text, len);
    r->text[len] = '\0';
    r->text_len = len;
    memcpy(r->tokens, g->hist + g->n_prompt, n_out * sizeof *r->tokens);
    r->n_tokens = (int64_t)n_out;
    r->n_prompt_tokens = (int64_t)g->n_prompt;
    r->stop_reason = g->stop;
    r->load_ms = m->info.load_ms;
    return KHUB_STATUS_OK;
}

khub_status khub_session_generate(khub_session *s, const char *prompt,
                                  const khub_generate_opts *opts, khub_generate_result *result)
{
    KHUB_API_CHECK(s ? s->m->rt : NULL, s && prompt && result);
    khub_model *m = s->m;
    khub_runtime *rt = m->rt;
    khub__clear(rt);
    /* 0.1's size at least (since session 17; it asked for this header's
     * sizeof): fill_result writes 0.1's fields only. */
    KHUB__APP_CHECK(rt, result, KHUB__GEN_RESULT_0_1, "khub_session_generate", "result");
    khub_generate_opts o;
    KHUB_FORWARD_IF_ERROR(rt, khub__gen_read_opts(rt, "khub_session_generate", opts, &o));
    int32_t *ids = NULL;
    size_t n = 0;
    KHUB_FORWARD_IF_ERROR(rt, khub__gen_prompt_ids(m, "khub_session_generate: the prompt", prompt,
                                                   (int)o.chat, o.system, &ids, &n));
    khub__gen_seq g;
    memset(&g, 0, sizeof g);
    emit_ctx e = {&o};
    khub_status st = keep_prefix(s, ids, n);
    if (st == KHUB_STATUS_OK) st = khub__gen_seq_init(m, &g, ids, n, &o);
    khub__tokenizer_free_ids(m->tok, ids, n);
    if (st == KHUB_STATUS_OK) {
        s->n_reused = (int64_t)s->n_ids;
        s->n_prefilled = (int64_t)(n - s->n_ids);
        g.emit = o.callback ? emit : NULL;
        g.emit_ud = &e;
        st = run(s, &g, result);
    }
    /* What the sequence holds now: the prompt and the answer but its last
     * token (fed only when the next turn starts with it). */
    if (st == KHUB_STATUS_OK) st = remember(s, &g, (size_t)m->seq_len[s->seq]);
    if (st == KHUB_STATUS_OK) st = fill_result(m, &g, result);
    if (st != KHUB_STATUS_OK) {
        char keep[256];
        snprintf(keep, sizeof keep, "%s", khub_runtime_errmsg(rt));
        forget(s); /* the cache may hold part of a failed call */
        khub__clear(rt);
        khub__fail(rt, st, "%s", keep);
    }
    khub__gen_seq_free(m, &g);
    /* A cancel is for the call in flight (or, sent just before it, the
     * next one): consumed here whatever stopped the call. */
    atomic_store(&s->cancel, 0);
    return st;
}

void khub_session_cancel(khub_session *s)
{
    if (s) atomic_store(&s->cancel, 1);
}
