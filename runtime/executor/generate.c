/*
 * generate.c: the calls that run a whole batch of prompts to the end:
 * khub_model_generate (khub_model.h), khub_generate_batch (khub_batch.h),
 * and khub_model_logits. Both generators are the continuous-batching
 * scheduler (batch.c, scheduler.c) run until it is idle, so there is one
 * generation path.
 *
 * khub_model_generate keeps its contract: prompts are tokenized (and
 * checked) before anything runs, so a bad prompt fails the whole call with
 * its message; prompt i is request i + 1 of a fresh batch; every prompt has
 * its own sampler with the caller's seed, so a prompt's output does not
 * depend on its neighbours.
 */
#include <string.h>

#include "app_struct.h"
#include "batch_impl.h"

/* The caller's arrays (app_struct.h): elements xs[0].struct_size bytes
 * apart, at least the struct's 0.1 size, all of one size. These are the
 * 0.1 sizes. */
#define BATCH_REQUEST_0_1 KHUB__SIZE_TO(khub_batch_request, ud)
#define BATCH_RESULT_0_1  KHUB__SIZE_TO(khub_batch_result, error)

/* ======================================================================== */
/* khub_model_generate                                                      */
/* ======================================================================== */

typedef struct gen_call {
    khub_model *m;
    const khub_generate_opts *o;
    khub_generate_result *results;
    khub_status st; /* first failure of a request */
    char msg[256];
} gen_call;

static int gen_text(void *ud, uint64_t id, const char *text, size_t len)
{
    gen_call *g = ud;
    return g->o->callback(g->o->callback_ud, (int32_t)(id - 1), text, len);
}

/* results[i] of the caller's array; every field written below is a 0.1
 * field, which the checked struct_size covers (a field appended later is
 * written only when KHUB__APP_HAS says the caller's struct has it). */
static khub_generate_result *gen_result_at(khub_generate_result *results, size_t i)
{
    return khub__app_at(results, i);
}

static void gen_done(void *ud, uint64_t id, const khub_batch_result *br)
{
    gen_call *g = ud;
    khub_generate_result *r = gen_result_at(g->results, (size_t)(id - 1));
    khub_runtime *rt = g->m->rt;
    if (br->status != KHUB_STATUS_OK) {
        if (g->st == KHUB_STATUS_OK) {
            g->st = br->status;
            snprintf(g->msg, sizeof g->msg, "%s", br->error);
        }
        return;
    }
    r->text = khub__malloc(rt, br->text_len + 1);
    r->tokens = khub__calloc(rt, br->n_tokens ? (size_t)br->n_tokens : 1, sizeof *r->tokens);
    if (!r->text || !r->tokens) {
        if (g->st == KHUB_STATUS_OK) g->st = KHUB_STATUS_NOMEM;
        snprintf(g->msg, sizeof g->msg, "no memory for results");
        return;
    }
    memcpy(r->text, br->text, br->text_len);
    r->text[br->text_len] = '\0';
    r->text_len = br->text_len;
    memcpy(r->tokens, br->tokens, (size_t)br->n_tokens * sizeof *r->tokens);
    r->n_tokens = br->n_tokens;
    r->n_prompt_tokens = br->n_prompt_tokens;
    r->stop_reason = br->stop_reason;
}

/* Tokenizes every prompt (so a bad one fails the call before any runs)
 * and submits them as requests 1..n. */
static khub_status submit_prompts(khub_batch *b, gen_call *g, const char *const *prompts, size_t n,
                                  const khub_generate_opts *o)
{
    khub_model *m = g->m;
    khub_generate_opts ro = *o;
    ro.chat = 0; /* the template is applied here */
    for (size_t i = 0; i < n; i++) {
        KHUB_RETURN_IF(m->rt, !prompts[i], KHUB_STATUS_MISUSE, "prompt %zu is NULL", i);
        char label[32];
        snprintf(label, sizeof label, "prompt %zu", i);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        KHUB_FORWARD_IF_ERROR(m->rt, khub__gen_prompt_ids(m, label, prompts[i], (int)o->chat,
                                                          o->system, &ids, &n_ids));
        khub_batch_request req = {KHUB_APP_INIT(khub_batch_request),
                                  .tokens = ids,
                                  .n_tokens = n_ids,
                                  .opts = &ro,
                                  .on_text = o->callback ? gen_text : NULL,
                                  .on_done = gen_done,
                                  .ud = g};
        khub_status st = khub_batch_submit(b, &req, NULL);
        khub__tokenizer_free_ids(m->tok, ids, n_ids);
        if (st != KHUB_STATUS_OK) return khub__fail(m->rt, st, "%s", khub_last_error());
    }
    return KHUB_STATUS_OK;
}

static void fill_timings(const khub_batch *b, khub_generate_result *results, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        khub_generate_result *r = gen_result_at(results, i);
        r->load_ms = b->m->info.load_ms;
        r->prefill_ms = b->prefill_ms;
        r->decode_ms = b->decode_ms;
        r->prefill_tok_s = b->prefill_ms > 0 ? (double)b->prefill_tokens * 1e3 / b->prefill_ms : 0;
        r->decode_tok_s = b->decode_ms > 0 ? (double)b->decode_tokens * 1e3 / b->decode_ms : 0;
    }
}

khub_status khub_model_generate(khub_model *m, const char *const *prompts, size_t n,
                                const khub_generate_opts *opts, khub_generate_result *results)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && prompts && results && n > 0);
    khub__clear(m->rt);
    /* The caller's element size, 0.1's at least (since session 17; it
     * asked for this header's sizeof and indexed by it). */
    char msg[KHUB_ERROR_SIZE];
    khub_status cst = khub__app_array_check(results, n, KHUB__GEN_RESULT_0_1, "khub_model_generate",
                                            "results", msg, sizeof msg);
    if (cst != KHUB_STATUS_OK) return khub__fail(m->rt, cst, "%s", msg);
    KHUB_RETURN_IF(m->rt, n > (size_t)m->max_seqs, KHUB_STATUS_INVALID_ARG,
                   "khub_model_generate: %zu prompts, the model was loaded for at most %d "
                   "(raise max_seqs)",
                   n, (int)m->max_seqs);
    KHUB_RETURN_IF(m->rt, !m->tok, KHUB_STATUS_TOKENIZER,
                   "%s: the model has no tokenizer, so text prompts cannot be encoded", m->file);
    khub_generate_opts o;
    KHUB_FORWARD_IF_ERROR(m->rt, khub__gen_read_opts(m->rt, "khub_model_generate", opts, &o));
    gen_call g = {.m = m, .o = &o, .results = results};
    khub_batch *b = NULL;
    KHUB_FORWARD_IF_ERROR(m->rt, khub_batch_new(m, NULL, &b));
    khub_status st = submit_prompts(b, &g, prompts, n, &o);
    if (st == KHUB_STATUS_OK) st = khub_batch_run(b, 0);
    if (st == KHUB_STATUS_OK && g.st != KHUB_STATUS_OK) st = khub__fail(m->rt, g.st, "%s", g.msg);
    if (st == KHUB_STATUS_OK) fill_timings(b, results, n);
    char keep[KHUB_ERROR_SIZE];
    snprintf(keep, sizeof keep, "%s", khub_runtime_errmsg(m->rt));
    khub_batch_free(b); /* ends what a failure left, without a message */
    if (st != KHUB_STATUS_OK) {
        khub__clear(m->rt);
        khub__fail(m->rt, st, "%s", keep);
    }
    return st;
}

/* Elements that khub_model_generate would refuse (below 0.1, another size
 * than results[0]'s) were never written: they and the rest stay as they are. */
void khub_generate_results_free(khub_model *m, khub_generate_result *results, size_t n)
{
    if (!m || !results || !n || results[0].struct_size < KHUB__GEN_RESULT_0_1) return;
    for (size_t i = 0; i < n; i++) {
        khub_generate_result *r = gen_result_at(results, i);
        if (r->struct_size != results[0].struct_size) break;
        khub__free(m->rt, r->text, r->text ? r->text_len + 1 : 0);
        khub__free(m->rt, r->tokens,
                   r->tokens ? (r->n_tokens ? (size_t)r->n_tokens : 1) * sizeof *r->tokens : 0);
        khub__app_clear(r, sizeof *r); /* the caller's header stays as the caller wrote it */
    }
}

/* ======================================================================== */
/* khub_generate_batch                                                      */
/* ======================================================================== */

typedef struct batch_call {
    khub_model *m;
    const khub_batch_request *reqs;
    khub_batch_result *results;
    uint64_t first_id;
    khub_status st; /* NOMEM copying a result */
} batch_call;

/* reqs[i] and results[i] of the caller's arrays: their elements are the
 * caller's structs, struct_size bytes apart (element 0's; 360 for a 0.1
 * result, more since error_full), not this header's sizeof, so a caller
 * built against an older (or newer) header gets its own elements. */
static const khub_batch_request *request_at(const khub_batch_request *reqs, size_t i)
{
    return khub__app_at_const(reqs, i);
}

static khub_batch_result *result_at(khub_batch_result *results, size_t i)
{
    return khub__app_at(results, i);
}

static int batch_text(void *ud, uint64_t id, const char *text, size_t len)
{
    batch_call *c = ud;
    const khub_batch_request *q = request_at(c->reqs, (size_t)(id - c->first_id));
    return q->on_text ? q->on_text(q->ud, id, text, len) : 0;
}

/* Whether the caller's result has 0.2's error_full. */
static bool has_error_full(const khub_batch_result *r)
{
    return KHUB__APP_HAS(r, khub_batch_result, error_full);
}

static void batch_done(void *ud, uint64_t id, const khub_batch_result *br)
{
    batch_call *c = ud;
    size_t i = (size_t)(id - c->first_id);
    const khub_batch_request *q = request_at(c->reqs, i);
    if (q->on_done) q->on_done(q->ud, id, br);
    khub_batch_result *r = result_at(c->results, i);
    khub__app_copy_out(r, br, sizeof *br); /* no further than the caller's struct_size */
    r->text = khub__malloc(c->m->rt, br->text_len + 1);
    r->tokens = khub__calloc(c->m->rt, br->n_tokens ? (size_t)br->n_tokens : 1, sizeof *r->tokens);
    if (has_error_full(r)) r->error_full = khub__strdup(c->m->rt, br->error_full);
    if (!r->text || !r->tokens || (has_error_full(r) && !r->error_full)) {
        c->st = KHUB_STATUS_NOMEM;
        return;
    }
    memcpy(r->text, br->text, br->text_len);
    r->text[br->text_len] = '\0';
    if (br->n_tokens) memcpy(r->tokens, br->tokens, (size_t)br->n_tokens * sizeof *r->tokens);
}

khub_status khub_generate_batch(khub_model *m, const khub_batch_request *reqs, size_t n,
                                const khub_batch_config *cfg, khub_batch_result *results)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && reqs && results && n > 0);
    khub__clear(m->rt);
    /* 0.1's size at least, the same for every element (the array's
     * stride): a caller built before error_full was appended gets the rest
     * of its results (since session 16; before, the check asked for this
     * header's size), and its requests (since session 17; they were
     * indexed by this header's sizeof). */
    char msg[KHUB_ERROR_SIZE];
    khub_status cst = khub__app_array_check(reqs, n, BATCH_REQUEST_0_1, "khub_generate_batch",
                                            "reqs", msg, sizeof msg);
    if (cst == KHUB_STATUS_OK)
        cst = khub__app_array_check(results, n, BATCH_RESULT_0_1, "khub_generate_batch", "results",
                                    msg, sizeof msg);
    if (cst != KHUB_STATUS_OK) return khub__fail(m->rt, cst, "%s", msg);
    batch_call c = {.m = m, .reqs = reqs, .results = results, .first_id = 1};
    khub_batch *b = NULL;
    KHUB_FORWARD_IF_ERROR(m->rt, khub_batch_new(m, cfg, &b));
    khub_status st = KHUB_STATUS_OK;
    for (size_t i = 0; i < n && st == KHUB_STATUS_OK; i++) {
        khub_batch_request q; /* read no further than the caller's struct_size */
        khub__app_copy_in(&q, sizeof q, request_at(reqs, i));
        q.on_text = batch_text;
        q.on_done = batch_done;
        q.ud = &c;
        st = khub_batch_submit(b, &q, NULL);
        if (st != KHUB_STATUS_OK)
            st = khub__fail(m->rt, st, "request %zu: %s", i, khub_last_error());
    }
    if (st == KHUB_STATUS_OK) st = khub_batch_run(b, 0);
    if (st == KHUB_STATUS_OK && c.st != KHUB_STATUS_OK)
        st = khub__fail(m->rt, c.st, "khub_generate_batch: no memory for results");
    char keep[KHUB_ERROR_SIZE];
    snprintf(keep, sizeof keep, "%s", khub_runtime_errmsg(m->rt));
    khub_batch_free(b);
    if (st != KHUB_STATUS_OK) {
        khub__clear(m->rt);
        khub__fail(m->rt, st, "%s", keep);
    }
    return st;
}

void khub_batch_results_free(khub_model *m, khub_batch_result *results, size_t n)
{
    /* nothing was written into an array khub_generate_batch refused by size */
    if (!m || !results || !n || results[0].struct_size < BATCH_RESULT_0_1) return;
    for (size_t i = 0; i < n; i++) {
        khub_batch_result *r = result_at(results, i);
        if (r->struct_size != results[0].struct_size) break; /* refused as well */
        khub__free(m->rt, r->text, r->text ? r->text_len + 1 : 0);
        khub__free(m->rt, r->tokens,
                   r->tokens ? (r->n_tokens ? (size_t)r->n_tokens : 1) * sizeof *r->tokens : 0);
        if (has_error_full(r)) khub__strfree(m->rt, (char *)r->error_full);
        khub__app_clear(r, sizeof *r); /* the caller's header stays as the caller wrote it */
    }
}

/* ======================================================================== */
/* khub_model_logits, khub_model_logits_all                                 */
/* ======================================================================== */

khub_status khub_model_logits(khub_model *m, const int32_t *ids, size_t n, float *out)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && ids && out && n > 0);
    khub__clear(m->rt);
    KHUB_RETURN_IF(m->rt, n > (size_t)m->max_context, KHUB_STATUS_CONTEXT_FULL,
                   "khub_model_logits: %zu tokens, the KV cache holds %lld", n,
                   (long long)m->max_context);
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_reset(m, 0));
    for (size_t done = 0; done < n;) {
        int64_t take = (int64_t)(n - done) < m->max_batch ? (int64_t)(n - done) : m->max_batch;
        khub__seg seg = {0, 0, (int64_t)done, take};
        KHUB_FORWARD_IF_ERROR(m->rt, khub__forward(m, ids + done, &seg, 1));
        done += (size_t)take;
    }
    memcpy(out, m->logits, (size_t)m->cfg.vocab_size * sizeof *out);
    return KHUB_STATUS_OK;
}

/* Every position's logits: the same chunks as khub_model_logits, each with
 * the LM head on all of its rows, written straight into out. */
khub_status khub_model_logits_all(khub_model *m, const int32_t *ids, size_t n, float *out)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && ids && out && n > 0);
    khub__clear(m->rt);
    KHUB_RETURN_IF(m->rt, n > (size_t)m->max_context, KHUB_STATUS_CONTEXT_FULL,
                   "khub_model_logits_all: %zu tokens, the KV cache holds %lld", n,
                   (long long)m->max_context);
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_reset(m, 0));
    size_t V = (size_t)m->cfg.vocab_size;
    for (size_t done = 0; done < n;) {
        int64_t take = (int64_t)(n - done) < m->max_batch ? (int64_t)(n - done) : m->max_batch;
        khub__seg seg = {0, 0, (int64_t)done, take};
        KHUB_FORWARD_IF_ERROR(m->rt,
                              khub__forward_rows(m, ids + done, &seg, 1, true, out + done * V));
        done += (size_t)take;
    }
    return KHUB_STATUS_OK;
}
