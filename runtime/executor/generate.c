/*
 * generate.c: khub_model_generate and khub_model_logits: prompts to tokens
 * (with the chat template when asked), a batched prefill, then batched
 * decode steps until each prompt stops (EOS, max_new_tokens, a stop string,
 * the callback, or a full KV cache).
 *
 * Batching: prompt i is KV sequence i. Prefill packs the prompts' tokens into
 * forward calls of up to max_batch tokens (a long prompt spans several
 * calls; short ones share one); each decode step is one forward call with
 * one token per live sequence. Every prompt has its own sampler with the
 * caller's seed, so a prompt's output does not depend on its neighbours.
 *
 * Stop strings and streaming: text that could still turn out to be the start
 * of a stop string is held back from the callback until it cannot, so a stop
 * string never reaches the stream.
 */
#include <string.h>
#include <time.h>

#include "chat.h"
#include "executor.h"
#include "sampler.h"
#include "tokenizer.h"

typedef struct gen_seq {
    int32_t *hist; /* owned; [cap] prompt ids then generated ids */
    size_t n_hist, n_prompt, cap;
    size_t prefilled;  /* prompt tokens already in the cache */
    int32_t next;      /* token to feed at the next decode step */
    int live;          /* still generating */
    uint32_t stop;     /* khub_stop_reason */
    size_t streamed;   /* bytes of text handed to the callback */
    size_t cut;        /* text length after a stop string was cut, or SIZE_MAX */
    khub_detok *detok; /* owned */
    khub__sampler sampler;
} gen_seq;

typedef struct gen_ctx {
    khub_model *m;
    khub_generate_opts o;
    gen_seq *seqs; /* owned; [n] */
    size_t n;
    size_t max_stop; /* longest stop string */
    double prefill_ms, decode_ms;
    int64_t prefill_tokens, decode_tokens;
} gen_ctx;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ======================================================================== */
/* Prompts                                                                  */
/* ======================================================================== */

/* The model's chat template; for a file without one whose vocab has Gemma's
 * turn tokens (the Gemma 3 base GGUFs), Gemma 3's own template. */
static const char *chat_template(const khub_model *m)
{
    const char *t = khub__tokenizer_chat_template(m->tok);
    int32_t id;
    if (!t && khub__tokenizer_find(m->tok, "<start_of_turn>", 15, &id) == KHUB_STATUS_OK &&
        khub__tokenizer_find(m->tok, "<end_of_turn>", 13, &id) == KHUB_STATUS_OK)
        t = khub__chat_gemma_template;
    return t;
}

/* Tokenizes prompt i (after the chat template, when asked) into s->hist with
 * room for max_new_tokens more ids. */
static khub_status prompt_ids(gen_ctx *g, size_t i, const char *prompt, gen_seq *s)
{
    khub_model *m = g->m;
    khub_runtime *rt = m->rt;
    char *text = NULL;
    uint32_t flags = KHUB_TOK_PARSE_SPECIAL;
    if (g->o.chat) {
        khub_chat_msg msgs[2];
        size_t nm = 0;
        if (g->o.system) msgs[nm++] = (khub_chat_msg){"system", g->o.system};
        msgs[nm++] = (khub_chat_msg){"user", prompt};
        KHUB_FORWARD_IF_ERROR(rt, khub__chat_format(rt, chat_template(m), msgs, nm, true, &text));
    } else {
        flags |= KHUB_TOK_ADD_SPECIAL;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    const char *src = text ? text : prompt;
    khub_status st = khub__tokenizer_encode(m->tok, src, strlen(src), flags, &ids, &n);
    khub__strfree(rt, text);
    KHUB_FORWARD_IF_ERROR(rt, st);
    if (n == 0 || n + 1 > (size_t)m->max_context) {
        khub__tokenizer_free_ids(m->tok, ids, n);
        KHUB_RETURN_IF(rt, n == 0, KHUB_STATUS_INVALID_ARG, "prompt %zu is empty", i);
        return khub__fail(rt, KHUB_STATUS_CONTEXT_FULL,
                          "prompt %zu has %zu tokens; the KV cache holds %lld per sequence "
                          "(raise max_context)",
                          i, n, (long long)m->max_context);
    }
    s->cap = n + (size_t)g->o.max_new_tokens + 1;
    s->hist = khub__calloc(rt, s->cap, sizeof *s->hist);
    if (s->hist) memcpy(s->hist, ids, n * sizeof *ids);
    khub__tokenizer_free_ids(m->tok, ids, n);
    KHUB_RETURN_IF(rt, !s->hist, KHUB_STATUS_NOMEM, "no memory for prompt %zu", i);
    s->n_hist = s->n_prompt = n;
    return KHUB_STATUS_OK;
}

static khub_status setup(gen_ctx *g, const char *const *prompts)
{
    khub_model *m = g->m;
    khub__sampler_params sp = {g->o.temperature, g->o.top_k, g->o.top_p, g->o.repetition_penalty,
                               g->o.seed};
    for (size_t i = 0; i < g->n; i++) {
        gen_seq *s = &g->seqs[i];
        s->cut = SIZE_MAX;
        KHUB_RETURN_IF(m->rt, !prompts[i], KHUB_STATUS_MISUSE, "prompt %zu is NULL", i);
        KHUB_FORWARD_IF_ERROR(m->rt, prompt_ids(g, i, prompts[i], s));
        KHUB_FORWARD_IF_ERROR(m->rt,
                              khub__sampler_init(m->rt, &s->sampler, &sp, m->cfg.vocab_size));
        KHUB_FORWARD_IF_ERROR(m->rt, khub__detok_new(m->tok, 0, &s->detok));
        KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_reset(m, (int32_t)i));
        s->live = 1;
    }
    for (uint32_t k = 0; k < g->o.n_stop; k++) {
        KHUB_RETURN_IF(m->rt, !g->o.stop[k] || !*g->o.stop[k], KHUB_STATUS_INVALID_ARG,
                       "stop string %u is NULL or empty", k);
        size_t l = strlen(g->o.stop[k]);
        if (l > g->max_stop) g->max_stop = l;
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* One new token                                                            */
/* ======================================================================== */

static bool is_eos(const khub_model *m, int32_t id)
{
    for (int i = 0; i < m->cfg.n_eos; i++)
        if (m->cfg.eos_token_ids[i] == id) return true;
    return m->tok && khub__tokenizer_is_eog(m->tok, id);
}

/* Bytes at the end of text[0..len) that are a proper prefix of a stop string
 * (they may still become one, so they are not streamed yet). */
static size_t held_back(const gen_ctx *g, const char *text, size_t len)
{
    size_t best = 0;
    for (uint32_t k = 0; k < g->o.n_stop; k++) {
        size_t sl = strlen(g->o.stop[k]);
        for (size_t h = sl - 1; h > best; h--)
            if (h <= len && memcmp(text + len - h, g->o.stop[k], h) == 0) {
                best = h;
                break;
            }
    }
    return best;
}

/* Ends s with reason why (the first reason wins). */
static void finish(gen_seq *s, uint32_t why)
{
    if (!s->live) return;
    s->live = 0;
    s->stop = why;
}

/* Streams what is safe to stream of s's text; `final` streams everything
 * left (up to a cut). */
static void stream(gen_ctx *g, size_t i, gen_seq *s, bool final)
{
    size_t len;
    const char *text = khub__detok_text(s->detok, &len);
    if (s->cut != SIZE_MAX)
        len = s->cut;
    else if (!final)
        len -= held_back(g, text, len);
    if (!g->o.callback || len <= s->streamed) return;
    int stop = g->o.callback(g->o.callback_ud, (int32_t)i, text + s->streamed, len - s->streamed);
    s->streamed = len;
    if (stop) finish(s, KHUB_STOP_CALLBACK);
}

/* Takes the token sampled for s: checks EOS, appends it, detokenizes,
 * checks stop strings and limits, streams. */
static khub_status accept(gen_ctx *g, size_t i, int32_t id)
{
    gen_seq *s = &g->seqs[i];
    khub_model *m = g->m;
    if (!g->o.ignore_eos && is_eos(m, id)) {
        finish(s, KHUB_STOP_EOS);
        return KHUB_STATUS_OK;
    }
    s->hist[s->n_hist++] = id;
    s->next = id;
    const char *piece;
    size_t plen, len;
    KHUB_FORWARD_IF_ERROR(m->rt, khub__detok_push(s->detok, id, &piece, &plen));
    const char *text = khub__detok_text(s->detok, &len);
    if (g->o.n_stop && plen) {
        /* Only a match that ends in the new piece is new. */
        size_t from = len - plen >= g->max_stop ? len - plen - g->max_stop + 1 : 0;
        for (uint32_t k = 0; k < g->o.n_stop; k++) {
            const char *hit = strstr(text + from, g->o.stop[k]);
            if (hit && (size_t)(hit - text) < s->cut) s->cut = (size_t)(hit - text);
        }
        if (s->cut != SIZE_MAX) finish(s, KHUB_STOP_STRING);
    }
    if (s->n_hist - s->n_prompt >= (size_t)g->o.max_new_tokens)
        finish(s, KHUB_STOP_MAX_TOKENS);
    else if ((int64_t)s->n_hist >= m->max_context)
        finish(s, KHUB_STOP_CONTEXT);
    stream(g, i, s, !s->live);
    return KHUB_STATUS_OK;
}

static khub_status sample_into(gen_ctx *g, size_t i, float *logits_row)
{
    gen_seq *s = &g->seqs[i];
    /* The sampler modifies the row; logits rows are scratch of this step. */
    int32_t id = khub__sampler_sample(&s->sampler, logits_row, s->hist, s->n_hist);
    return accept(g, i, id);
}

/* ======================================================================== */
/* Prefill and decode                                                       */
/* ======================================================================== */

static khub_status prefill(gen_ctx *g)
{
    khub_model *m = g->m;
    size_t idx[256];
    khub__seg segs[256];
    int32_t *tokens = khub__calloc(m->rt, (size_t)m->max_batch, sizeof *tokens);
    KHUB_RETURN_IF(m->rt, !tokens, KHUB_STATUS_NOMEM, "no memory for a prefill batch");
    khub_status st = KHUB_STATUS_OK;
    for (;;) {
        int n_segs = 0;
        int64_t n = 0;
        for (size_t i = 0; i < g->n && n < m->max_batch && n_segs < m->max_seqs; i++) {
            gen_seq *s = &g->seqs[i];
            if (s->prefilled == s->n_prompt) continue;
            int64_t take = (int64_t)(s->n_prompt - s->prefilled);
            if (take > m->max_batch - n) take = m->max_batch - n;
            memcpy(tokens + n, s->hist + s->prefilled, (size_t)take * sizeof *tokens);
            segs[n_segs] = (khub__seg){(int32_t)i, 0, (int64_t)s->prefilled, take};
            idx[n_segs++] = i;
            n += take;
        }
        if (n_segs == 0) break;
        double t0 = now_ms();
        st = khub__forward(m, tokens, segs, n_segs);
        g->prefill_ms += now_ms() - t0;
        if (st != KHUB_STATUS_OK) break;
        g->prefill_tokens += n;
        for (int k = 0; k < n_segs && st == KHUB_STATUS_OK; k++) {
            gen_seq *s = &g->seqs[idx[k]];
            s->prefilled += (size_t)segs[k].n;
            if (s->prefilled == s->n_prompt)
                st = sample_into(g, idx[k], m->logits + (size_t)k * (size_t)m->cfg.vocab_size);
        }
        if (st != KHUB_STATUS_OK) break;
    }
    khub__free(m->rt, tokens, (size_t)m->max_batch * sizeof *tokens);
    return st;
}

static khub_status decode(gen_ctx *g)
{
    khub_model *m = g->m;
    int32_t tokens[256];
    size_t idx[256];
    khub__seg segs[256];
    for (;;) {
        int n_segs = 0;
        for (size_t i = 0; i < g->n; i++) {
            gen_seq *s = &g->seqs[i];
            if (!s->live) continue;
            tokens[n_segs] = s->next;
            segs[n_segs] = (khub__seg){(int32_t)i, 0, (int64_t)s->n_hist - 1, 1};
            idx[n_segs++] = i;
        }
        if (n_segs == 0) return KHUB_STATUS_OK;
        double t0 = now_ms();
        KHUB_FORWARD_IF_ERROR(m->rt, khub__forward(m, tokens, segs, n_segs));
        g->decode_ms += now_ms() - t0;
        g->decode_tokens += n_segs;
        for (int k = 0; k < n_segs; k++)
            KHUB_FORWARD_IF_ERROR(
                m->rt, sample_into(g, idx[k], m->logits + (size_t)k * (size_t)m->cfg.vocab_size));
    }
}

/* ======================================================================== */
/* Results                                                                  */
/* ======================================================================== */

static khub_status fill_result(gen_ctx *g, size_t i, khub_generate_result *r)
{
    khub_model *m = g->m;
    gen_seq *s = &g->seqs[i];
    const char *piece;
    size_t plen, len;
    if (s->cut == SIZE_MAX)
        KHUB_FORWARD_IF_ERROR(m->rt, khub__detok_flush(s->detok, &piece, &plen));
    stream(g, i, s, true);
    const char *text = khub__detok_text(s->detok, &len);
    if (s->cut != SIZE_MAX && s->cut < len) len = s->cut;
    size_t n_gen = s->n_hist - s->n_prompt;
    r->text = khub__malloc(m->rt, len + 1);
    r->tokens = khub__calloc(m->rt, n_gen ? n_gen : 1, sizeof *r->tokens);
    KHUB_RETURN_IF(m->rt, !r->text || !r->tokens, KHUB_STATUS_NOMEM, "no memory for results");
    memcpy(r->text, text, len);
    r->text[len] = '\0';
    r->text_len = len;
    memcpy(r->tokens, s->hist + s->n_prompt, n_gen * sizeof *r->tokens);
    r->n_tokens = (int64_t)n_gen;
    r->n_prompt_tokens = (int64_t)s->n_prompt;
    r->stop_reason = s->stop;
    r->load_ms = m->info.load_ms;
    r->prefill_ms = g->prefill_ms;
    r->decode_ms = g->decode_ms;
    r->prefill_tok_s = g->prefill_ms > 0 ? (double)g->prefill_tokens * 1e3 / g->prefill_ms : 0;
    r->decode_tok_s = g->decode_ms > 0 ? (double)g->decode_tokens * 1e3 / g->decode_ms : 0;
    return KHUB_STATUS_OK;
}

static void free_ctx(gen_ctx *g)
{
    for (size_t i = 0; g->seqs && i < g->n; i++) {
        gen_seq *s = &g->seqs[i];
        khub__free(g->m->rt, s->hist, s->hist ? s->cap * sizeof *s->hist : 0);
        khub__detok_free(s->detok);
        khub__sampler_free(&s->sampler);
    }
    khub__free(g->m->rt, g->seqs, g->seqs ? g->n * sizeof *g->seqs : 0);
}

static khub_status read_gen_opts(khub_model *m, const khub_generate_opts *in, khub_generate_opts *o)
{
    memset(o, 0, sizeof *o);
    if (in) {
        KHUB_RETURN_IF(m->rt, in->struct_size < offsetof(khub_generate_opts, max_new_tokens) + 4,
                       KHUB_STATUS_STRUCT_SIZE,
                       "khub_model_generate: opts.struct_size %u is "
                       "too small",
                       (unsigned)in->struct_size);
        memcpy(o, in, in->struct_size < sizeof *o ? in->struct_size : sizeof *o);
    }
    if (o->max_new_tokens == 0) o->max_new_tokens = 128;
    KHUB_RETURN_IF(m->rt,
                   o->max_new_tokens < 0 || o->top_k < 0 || o->temperature < 0 || o->top_p < 0 ||
                       o->repetition_penalty < 0 || (o->n_stop && !o->stop),
                   KHUB_STATUS_INVALID_ARG,
                   "khub_model_generate: max_new_tokens %d, top_k %d, "
                   "temperature %g, top_p %g or repetition_penalty %g is negative, or stop is NULL",
                   (int)o->max_new_tokens, (int)o->top_k, (double)o->temperature, (double)o->top_p,
                   (double)o->repetition_penalty);
    return KHUB_STATUS_OK;
}

khub_status khub_model_generate(khub_model *m, const char *const *prompts, size_t n,
                                const khub_generate_opts *opts, khub_generate_result *results)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && prompts && results && n > 0);
    khub__clear(m->rt);
    for (size_t i = 0; i < n; i++)
        KHUB_RETURN_IF(m->rt, results[i].struct_size < sizeof(khub_generate_result),
                       KHUB_STATUS_STRUCT_SIZE,
                       "khub_model_generate: results[%zu].struct_size "
                       "%u is smaller than %zu",
                       i, (unsigned)results[i].struct_size, sizeof(khub_generate_result));
    KHUB_RETURN_IF(m->rt, n > (size_t)m->max_seqs, KHUB_STATUS_INVALID_ARG,
                   "khub_model_generate: %zu prompts, the model was loaded for at most %d "
                   "(raise max_seqs)",
                   n, (int)m->max_seqs);
    KHUB_RETURN_IF(m->rt, !m->tok, KHUB_STATUS_TOKENIZER,
                   "%s: the model has no tokenizer, so text prompts cannot be encoded", m->file);
    gen_ctx g = {.m = m, .n = n};
    KHUB_FORWARD_IF_ERROR(m->rt, read_gen_opts(m, opts, &g.o));
    g.seqs = khub__calloc(m->rt, n, sizeof *g.seqs);
    KHUB_RETURN_IF(m->rt, !g.seqs, KHUB_STATUS_NOMEM, "no memory for %zu prompts", n);
    khub_status st = setup(&g, prompts);
    if (st == KHUB_STATUS_OK) st = prefill(&g);
    if (st == KHUB_STATUS_OK) st = decode(&g);
    for (size_t i = 0; i < n && st == KHUB_STATUS_OK; i++) st = fill_result(&g, i, &results[i]);
    free_ctx(&g);
    return st;
}

void khub_generate_results_free(khub_model *m, khub_generate_result *results, size_t n)
{
    if (!m || !results) return;
    for (size_t i = 0; i < n; i++) {
        khub_generate_result *r = &results[i];
        khub__free(m->rt, r->text, r->text ? r->text_len + 1 : 0);
        khub__free(m->rt, r->tokens,
                   r->tokens ? (r->n_tokens ? (size_t)r->n_tokens : 1) * sizeof *r->tokens : 0);
        /* The caller's header stays as the caller wrote it. */
        uint32_t size = r->struct_size;
        uint16_t major = r->abi_major, minor = r->abi_minor;
        memset(r, 0, sizeof *r);
        r->struct_size = size;
        r->abi_major = major;
        r->abi_minor = minor;
    }
}

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
