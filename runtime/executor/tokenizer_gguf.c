/*
 * tokenizer_gguf.c: fills a khub_tokenizer_spec from GGUF metadata (the keys
 * llama.cpp's converter writes) and builds the tokenizer from it.
 *
 * GGUF strings are not NUL-terminated, so the spec carries pointers into the
 * mapping plus lengths; only the small scalar strings are copied. Gemma
 * files get the two fixes Transformers applies (gemma_fixups).
 */
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

typedef struct gguf_strs {
    const char **ptr; /* [n] borrowed from the mapping */
    size_t *len;      /* [n] */
    size_t n;
} gguf_strs;

static void strs_free(khub_runtime *rt, gguf_strs *s)
{
    if (!s->ptr && !s->len) return;
    khub__free(rt, s->ptr, (s->n + 1) * sizeof *s->ptr);
    khub__free(rt, s->len, (s->n + 1) * sizeof *s->len);
}

static khub_status read_strs(khub_runtime *rt, const khub_gguf *g, const char *key, bool required,
                             gguf_strs *out)
{
    const khub_gguf_kv *kv = khub__gguf_find(g, key);
    if (!kv && !required) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, !kv || kv->type != KHUB_GGUF_ARRAY || kv->elem != KHUB_GGUF_STRING,
                   KHUB_STATUS_TOKENIZER, "%s: %s is %s; it must be an array of strings",
                   khub__gguf_path(g), key, kv ? "of another type" : "missing");
    KHUB_RETURN_IF(rt, kv->count >= (1u << 24) * 8ull, KHUB_STATUS_TOKENIZER,
                   "%s: %s has %llu entries, too many", khub__gguf_path(g), key,
                   (unsigned long long)kv->count);
    size_t n = (size_t)kv->count;
    out->ptr = khub__calloc(rt, n + 1, sizeof *out->ptr);
    out->len = khub__calloc(rt, n + 1, sizeof *out->len);
    out->n = n;
    KHUB_RETURN_IF(rt, !out->ptr || !out->len, KHUB_STATUS_NOMEM,
                   "tokenizer: out of memory for %zu strings of %s", n, key);
    for (size_t i = 0; i < n; i++)
        KHUB_FORWARD_IF_ERROR(rt, khub__gguf_arr_str(g, kv, i, &out->ptr[i], &out->len[i]));
    return KHUB_STATUS_OK;
}

/* An optional integer id key; -1 when absent. */
static khub_status read_id(khub_runtime *rt, const khub_gguf *g, const char *key, int32_t *id)
{
    *id = -1;
    if (!khub__gguf_find(g, key)) return KHUB_STATUS_OK;
    uint32_t v;
    KHUB_FORWARD_IF_ERROR(rt, khub__gguf_get_u32(g, key, &v));
    KHUB_RETURN_IF(rt, v > INT32_MAX, KHUB_STATUS_TOKENIZER, "%s: %s %u is out of range",
                   khub__gguf_path(g), key, v);
    *id = (int32_t)v;
    return KHUB_STATUS_OK;
}

/* An optional string key, copied NUL-terminated (NULL when absent). */
static khub_status read_str(khub_runtime *rt, const khub_gguf *g, const char *key, char **out)
{
    *out = NULL;
    if (!khub__gguf_find(g, key)) return KHUB_STATUS_OK;
    const char *p;
    size_t n;
    KHUB_FORWARD_IF_ERROR(rt, khub__gguf_get_str(g, key, &p, &n));
    KHUB_RETURN_IF(rt, memchr(p, '\0', n) != NULL, KHUB_STATUS_TOKENIZER,
                   "%s: %s contains a NUL byte", khub__gguf_path(g), key);
    *out = khub__malloc(rt, n + 1);
    KHUB_RETURN_IF(rt, !*out, KHUB_STATUS_NOMEM, "tokenizer: out of memory for %s", key);
    memcpy(*out, p, n);
    (*out)[n] = '\0';
    return KHUB_STATUS_OK;
}

/* tokenizer.ggml.scores: one f32 per token; NULL when absent. */
static khub_status read_scores(khub_runtime *rt, const khub_gguf *g, size_t n_tokens, float **out)
{
    *out = NULL;
    const khub_gguf_kv *kv = khub__gguf_find(g, "tokenizer.ggml.scores");
    if (!kv || n_tokens == 0) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, kv->type != KHUB_GGUF_ARRAY || kv->count != n_tokens, KHUB_STATUS_TOKENIZER,
                   "%s: tokenizer.ggml.scores must be an array of %zu numbers, one per token",
                   khub__gguf_path(g), n_tokens);
    *out = khub__calloc(rt, n_tokens, sizeof **out);
    KHUB_RETURN_IF(rt, !*out, KHUB_STATUS_NOMEM, "tokenizer: out of memory for token scores");
    for (size_t i = 0; i < n_tokens; i++)
        KHUB_FORWARD_IF_ERROR(rt, khub__gguf_arr_f32(g, kv, i, &(*out)[i]));
    return KHUB_STATUS_OK;
}

/* Gemma files, as Transformers reads them (integrations/gguf: gemma_tokenizer):
 * a token of spaces (whitespace with at least one space) is stored with real
 * spaces but stands for that many "\u2581", and the merge order is the order
 * of the tokens in the file, not their scores. So such tokens are respelled
 * (and become normal vocab pieces instead of user-defined added tokens), and
 * each score becomes -id. *arena (arena_n bytes, caller frees) holds the new
 * spellings; toks' pointers are redirected into it. */
static bool is_space_run(const char *s, size_t n, bool *has_space)
{
    *has_space = false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ')
            *has_space = true;
        else if (s[i] != '\t' && s[i] != '\n' && s[i] != '\r' && s[i] != '\v' && s[i] != '\f')
            return false;
    }
    return n > 0;
}

static khub_status gemma_fixups(khub_runtime *rt, gguf_strs *toks, int32_t *types, float *scores,
                                char **arena, size_t *arena_n)
{
    size_t need = 0;
    bool sp;
    for (size_t i = 0; i < toks->n; i++)
        if (is_space_run(toks->ptr[i], toks->len[i], &sp) && sp) need += 3 * toks->len[i];
    *arena = need ? khub__malloc(rt, need) : NULL;
    *arena_n = need;
    KHUB_RETURN_IF(rt, need && !*arena, KHUB_STATUS_NOMEM, "tokenizer: out of memory");
    size_t off = 0;
    for (size_t i = 0; i < toks->n; i++) {
        if (scores) scores[i] = -(float)i;
        if (!is_space_run(toks->ptr[i], toks->len[i], &sp) || !sp) continue;
        char *d = *arena + off;
        for (size_t k = 0; k < toks->len[i]; k++) memcpy(d + 3 * k, "\xE2\x96\x81", 3);
        toks->ptr[i] = d;
        toks->len[i] *= 3;
        off += toks->len[i];
        if (types && types[i] == KHUB_TOKEN_USER_DEFINED) types[i] = KHUB_TOKEN_NORMAL;
    }
    return KHUB_STATUS_OK;
}

static khub_status read_types(khub_runtime *rt, const khub_gguf *g, size_t n_tokens, int32_t **out)
{
    *out = NULL;
    const khub_gguf_kv *kv = khub__gguf_find(g, "tokenizer.ggml.token_type");
    if (!kv || n_tokens == 0) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, kv->type != KHUB_GGUF_ARRAY || kv->count != n_tokens, KHUB_STATUS_TOKENIZER,
                   "%s: tokenizer.ggml.token_type must be an array of "
                   "%zu integers, one per token",
                   khub__gguf_path(g), n_tokens);
    *out = khub__calloc(rt, n_tokens, sizeof **out);
    KHUB_RETURN_IF(rt, !*out, KHUB_STATUS_NOMEM, "tokenizer: out of memory for token types");
    for (size_t i = 0; i < n_tokens; i++) {
        int64_t v;
        KHUB_FORWARD_IF_ERROR(rt, khub__gguf_arr_i64(g, kv, i, &v));
        (*out)[i] = v < 0 || v > 255 ? 255 : (int32_t)v; /* from_vocab names the bad one */
    }
    return KHUB_STATUS_OK;
}

khub_status khub__tokenizer_from_gguf(khub_runtime *rt, const khub_gguf *g, khub_tokenizer **out)
{
    KHUB_API_CHECK(rt, g && out);
    *out = NULL;
    gguf_strs toks = {0}, merges = {0};
    int32_t *types = NULL;
    float *scores = NULL;
    char *model = NULL, *pre = NULL, *tmpl = NULL, *arch = NULL, *arena = NULL;
    size_t arena_n = 0;
    bool add_bos = false, add_space = true;
    khub_tokenizer_spec sp = KHUB_TOKENIZER_SPEC_INIT;
    khub_status st;
    if ((st = read_str(rt, g, "tokenizer.ggml.model", &model)) != KHUB_STATUS_OK) goto done;
    if ((st = read_str(rt, g, "tokenizer.ggml.pre", &pre)) != KHUB_STATUS_OK) goto done;
    if ((st = read_str(rt, g, "tokenizer.chat_template", &tmpl)) != KHUB_STATUS_OK) goto done;
    if ((st = read_strs(rt, g, "tokenizer.ggml.tokens", true, &toks)) != KHUB_STATUS_OK) goto done;
    if ((st = read_strs(rt, g, "tokenizer.ggml.merges", false, &merges)) != KHUB_STATUS_OK)
        goto done;
    if ((st = read_types(rt, g, toks.n, &types)) != KHUB_STATUS_OK) goto done;
    if ((st = read_scores(rt, g, toks.n, &scores)) != KHUB_STATUS_OK) goto done;
    if ((st = read_str(rt, g, "general.architecture", &arch)) != KHUB_STATUS_OK) goto done;
    bool gemma = arch && (!strcmp(arch, "gemma") || !strcmp(arch, "gemma2") ||
                          !strcmp(arch, "gemma3")); /* Transformers' list; not gemma4 */
    if (gemma && model && strcmp(model, "llama") == 0 &&
        (st = gemma_fixups(rt, &toks, types, scores, &arena, &arena_n)) != KHUB_STATUS_OK)
        goto done;
    if ((st = read_id(rt, g, "tokenizer.ggml.bos_token_id", &sp.bos_id)) != KHUB_STATUS_OK ||
        (st = read_id(rt, g, "tokenizer.ggml.eos_token_id", &sp.eos_id)) != KHUB_STATUS_OK ||
        (st = read_id(rt, g, "tokenizer.ggml.padding_token_id", &sp.pad_id)) != KHUB_STATUS_OK ||
        (st = read_id(rt, g, "tokenizer.ggml.unknown_token_id", &sp.unk_id)) != KHUB_STATUS_OK)
        goto done;
    if (khub__gguf_find(g, "tokenizer.ggml.add_space_prefix") &&
        (st = khub__gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &add_space)) !=
            KHUB_STATUS_OK)
        goto done;
    if (khub__gguf_find(g, "tokenizer.ggml.add_bos_token") &&
        (st = khub__gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos)) != KHUB_STATUS_OK)
        goto done;
    sp.model = model;
    sp.pre = pre;
    sp.tokens = toks.ptr;
    sp.token_lens = toks.len;
    sp.n_tokens = toks.n;
    sp.token_types = types;
    sp.merges = merges.ptr;
    sp.merge_lens = merges.len;
    sp.n_merges = merges.n;
    sp.add_bos = add_bos;
    sp.chat_template = tmpl;
    sp.scores = scores;
    sp.add_space_prefix = add_space;
    st = khub__tokenizer_from_vocab(rt, &sp, out);
done:
    strs_free(rt, &toks);
    strs_free(rt, &merges);
    if (types) khub__free(rt, types, toks.n * sizeof *types);
    if (scores) khub__free(rt, scores, toks.n * sizeof *scores);
    khub__strfree(rt, model);
    khub__strfree(rt, pre);
    khub__strfree(rt, tmpl);
    khub__strfree(rt, arch);
    khub__free(rt, arena, arena_n);
    return st;
}
