/*
 * gen_seq.c: one sequence being generated, shared by khub_model_generate
 * (generate.c) and the batch scheduler (scheduler.c): prompt to ids (with
 * the chat template when asked), sampling a token and taking it (EOS, stop
 * strings, limits), streaming with the stop-string hold-back, and the final
 * text. See gen_seq.h.
 */
#include <string.h>

#include "app_struct.h"
#include "chat.h"
#include "gen_seq.h"

/* ======================================================================== */
/* Options and prompts                                                      */
/* ======================================================================== */

khub_status khub__gen_read_opts(khub_runtime *rt, const char *who, const khub_generate_opts *in,
                                khub_generate_opts *o)
{
    memset(o, 0, sizeof *o);
    if (in) {
        /* 0.1's size (before session 18 anything from 12 bytes was read,
         * the rest as zeros) */
        KHUB__APP_CHECK(rt, in, KHUB__SIZE_TO(khub_generate_opts, reserved), who, "opts");
        khub__app_copy_in(o, sizeof *o, in);
    }
    if (o->max_new_tokens == 0) o->max_new_tokens = 128;
    KHUB_RETURN_IF(rt,
                   o->max_new_tokens < 0 || o->top_k < 0 || o->temperature < 0 || o->top_p < 0 ||
                       o->repetition_penalty < 0 || (o->n_stop && !o->stop),
                   KHUB_STATUS_INVALID_ARG,
                   "%s: max_new_tokens %d, top_k %d, "
                   "temperature %g, top_p %g or repetition_penalty %g is negative, or stop is NULL",
                   who, (int)o->max_new_tokens, (int)o->top_k, (double)o->temperature,
                   (double)o->top_p, (double)o->repetition_penalty);
    for (uint32_t k = 0; k < o->n_stop; k++)
        KHUB_RETURN_IF(rt, !o->stop[k] || !*o->stop[k], KHUB_STATUS_INVALID_ARG,
                       "stop string %u is NULL or empty", k);
    return KHUB_STATUS_OK;
}

khub_status khub__gen_prompt_ids(khub_model *m, const char *label, const char *prompt, int chat,
                                 const char *system, int32_t **ids, size_t *n)
{
    khub_runtime *rt = m->rt;
    KHUB_RETURN_IF(rt, !m->tok, KHUB_STATUS_TOKENIZER,
                   "%s: the model has no tokenizer, so text prompts cannot be encoded", m->file);
    char *text = NULL;
    uint32_t flags = KHUB_TOK_PARSE_SPECIAL;
    if (chat) {
        khub_chat_msg msgs[2];
        size_t nm = 0;
        if (system) msgs[nm++] = (khub_chat_msg){"system", system};
        msgs[nm++] = (khub_chat_msg){"user", prompt};
        KHUB_FORWARD_IF_ERROR(
            rt, khub__chat_format(rt, khub__model_chat_template(m), msgs, nm, true, &text));
    } else {
        flags |= KHUB_TOK_ADD_SPECIAL;
    }
    *ids = NULL;
    *n = 0;
    const char *src = text ? text : prompt;
    khub_status st = khub__tokenizer_encode(m->tok, src, strlen(src), flags, ids, n);
    khub__strfree(rt, text);
    KHUB_FORWARD_IF_ERROR(rt, st);
    if (*n == 0 || *n + 1 > (size_t)m->max_context) {
        size_t got = *n;
        khub__tokenizer_free_ids(m->tok, *ids, *n);
        *ids = NULL;
        *n = 0;
        KHUB_RETURN_IF(rt, got == 0, KHUB_STATUS_INVALID_ARG, "%s is empty", label);
        return khub__fail(rt, KHUB_STATUS_CONTEXT_FULL,
                          "%s has %zu tokens; the KV cache holds %lld per sequence "
                          "(raise max_context)",
                          label, got, (long long)m->max_context);
    }
    return KHUB_STATUS_OK;
}

khub_status khub__gen_seq_init(khub_model *m, khub__gen_seq *s, const int32_t *ids, size_t n,
                               const khub_generate_opts *o)
{
    khub_runtime *rt = m->rt;
    memset(s, 0, sizeof *s);
    s->cut = SIZE_MAX;
    s->max_new_tokens = o->max_new_tokens;
    s->ignore_eos = o->ignore_eos;
    s->stops = o->stop;
    s->n_stop = o->n_stop;
    for (uint32_t k = 0; k < o->n_stop; k++) {
        size_t l = strlen(o->stop[k]);
        if (l > s->max_stop) s->max_stop = l;
    }
    s->cap = n + (size_t)o->max_new_tokens + 1;
    s->hist = khub__calloc(rt, s->cap, sizeof *s->hist);
    KHUB_RETURN_IF(rt, !s->hist, KHUB_STATUS_NOMEM, "no memory for a prompt of %zu tokens", n);
    memcpy(s->hist, ids, n * sizeof *ids);
    s->n_hist = s->n_prompt = n;
    khub__sampler_params sp = {o->temperature, o->top_k, o->top_p, o->repetition_penalty, o->seed};
    KHUB_FORWARD_IF_ERROR(rt, khub__sampler_init(rt, &s->sampler, &sp, m->cfg.vocab_size));
    if (m->tok) KHUB_FORWARD_IF_ERROR(rt, khub__detok_new(m->tok, 0, &s->detok));
    s->live = 1;
    return KHUB_STATUS_OK;
}

void khub__gen_seq_free(khub_model *m, khub__gen_seq *s)
{
    khub__free(m->rt, s->hist, s->hist ? s->cap * sizeof *s->hist : 0);
    khub__detok_free(s->detok);
    khub__sampler_free(&s->sampler);
    memset(s, 0, sizeof *s);
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
static size_t held_back(const khub__gen_seq *s, const char *text, size_t len)
{
    size_t best = 0;
    for (uint32_t k = 0; k < s->n_stop; k++) {
        size_t sl = strlen(s->stops[k]);
        for (size_t h = sl - 1; h > best; h--)
            if (h <= len && memcmp(text + len - h, s->stops[k], h) == 0) {
                best = h;
                break;
            }
    }
    return best;
}

void khub__gen_end(khub__gen_seq *s, uint32_t why)
{
    if (!s->live) return;
    s->live = 0;
    s->stop = why;
}

/* Streams what is safe to stream of s's text; `final` streams everything
 * left (up to a cut). */
static void stream(khub__gen_seq *s, bool final)
{
    if (!s->detok) return;
    size_t len;
    const char *text = khub__detok_text(s->detok, &len);
    if (s->cut != SIZE_MAX)
        len = s->cut;
    else if (!final)
        len -= held_back(s, text, len);
    if (!s->emit || len <= s->streamed) return;
    int stop = s->emit(s->emit_ud, text + s->streamed, len - s->streamed);
    s->streamed = len;
    if (stop) khub__gen_end(s, KHUB_STOP_CALLBACK);
}

/* Finds a stop string that ends in the newest piece (plen bytes). */
static void check_stops(khub__gen_seq *s, size_t plen)
{
    size_t len;
    const char *text = khub__detok_text(s->detok, &len);
    size_t from = len - plen >= s->max_stop ? len - plen - s->max_stop + 1 : 0;
    for (uint32_t k = 0; k < s->n_stop; k++) {
        const char *hit = strstr(text + from, s->stops[k]);
        if (hit && (size_t)(hit - text) < s->cut) s->cut = (size_t)(hit - text);
    }
    if (s->cut != SIZE_MAX) khub__gen_end(s, KHUB_STOP_STRING);
}

/* Takes the token sampled for s: checks EOS, appends it, detokenizes,
 * checks stop strings and limits, streams. */
static khub_status accept(khub_model *m, khub__gen_seq *s, int32_t id)
{
    if (!s->ignore_eos && is_eos(m, id)) {
        khub__gen_end(s, KHUB_STOP_EOS);
        return KHUB_STATUS_OK;
    }
    s->hist[s->n_hist++] = id;
    if (s->detok) {
        const char *piece;
        size_t plen;
        KHUB_FORWARD_IF_ERROR(m->rt, khub__detok_push(s->detok, id, &piece, &plen));
        if (s->n_stop && plen) check_stops(s, plen);
    }
    if (s->n_hist - s->n_prompt >= (size_t)s->max_new_tokens)
        khub__gen_end(s, KHUB_STOP_MAX_TOKENS);
    else if ((int64_t)s->n_hist >= m->max_context)
        khub__gen_end(s, KHUB_STOP_CONTEXT);
    stream(s, !s->live);
    return KHUB_STATUS_OK;
}

khub_status khub__gen_sample(khub_model *m, khub__gen_seq *s, float *logits_row)
{
    /* The sampler modifies the row; logits rows are scratch of this step. */
    int32_t id = khub__sampler_sample(&s->sampler, logits_row, s->hist, s->n_hist);
    return accept(m, s, id);
}

khub_status khub__gen_finish(khub_model *m, khub__gen_seq *s, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    if (!s->detok) return KHUB_STATUS_OK;
    const char *piece;
    size_t plen;
    if (s->cut == SIZE_MAX)
        KHUB_FORWARD_IF_ERROR(m->rt, khub__detok_flush(s->detok, &piece, &plen));
    stream(s, true);
    *text = khub__detok_text(s->detok, len);
    if (s->cut != SIZE_MAX && s->cut < *len) *len = s->cut;
    return KHUB_STATUS_OK;
}
