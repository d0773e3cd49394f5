/*
 * tokenizer_spec.c: building a tokenizer from a khub_tokenizer_spec, the
 * form GGUF metadata takes (tokenizer_gguf.c fills one from a file). The
 * spec's pre names the pre-tokenizer as llama.cpp does; tokens of type
 * CONTROL and USER_DEFINED also become added tokens. Model "llama" is
 * SentencePiece BPE (tokenizer_spm.c): scores instead of merges, no
 * pre-tokenizer, byte pieces "<0xXX>".
 */
#include "tokenizer_impl.h"

#include <string.h>

#define GG "gguf: "

static size_t spec_len(const char *const *s, const size_t *lens, size_t i)
{
    return lens ? lens[i] : strlen(s[i]);
}

static khub_status spec_pre(khub_runtime *rt, const char *pre, pre_kind *out, bool *ignore_merges)
{
    static const struct {
        const char *name;
        pre_kind kind;
        bool ignore_merges;
    } names[] = {{"default", PRE_GPT2, false},    {"gpt2", PRE_GPT2, false},
                 {"smollm", PRE_SMOLLM, false},   {"starcoder", PRE_SMOLLM, false},
                 {"llama-bpe", PRE_LLAMA3, true}, {"llama3", PRE_LLAMA3, true},
                 {"qwen2", PRE_QWEN2, false}};
    if (!pre) pre = "default";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(pre, names[i].name) == 0) {
            *out = names[i].kind;
            *ignore_merges = names[i].ignore_merges;
            return KHUB_STATUS_OK;
        }
    }
    return khub__fail(rt, KHUB_STATUS_TOKENIZER,
                      GG "tokenizer.ggml.pre \"%.40s\" is not a "
                         "pre-tokenizer khub implements (default, gpt2, smollm, starcoder, "
                         "llama-bpe, qwen2)",
                      pre);
}

static khub_status spec_tokens(khub_tokenizer *tok, const khub_tokenizer_spec *spec)
{
    khub_runtime *rt = tok->rt;
    for (size_t i = 0; i < spec->n_tokens; i++) {
        KHUB_RETURN_IF(rt, !spec->tokens[i], KHUB_STATUS_TOKENIZER,
                       GG "tokenizer.ggml.tokens[%zu] is missing", i);
        int32_t type = spec->token_types ? spec->token_types[i] : KHUB_TOKEN_NORMAL;
        KHUB_RETURN_IF(rt, type < KHUB_TOKEN_NORMAL || type > KHUB_TOKEN_BYTE,
                       KHUB_STATUS_TOKENIZER,
                       GG "tokenizer.ggml.token_type[%zu] is %ld, not "
                          "1..6",
                       i, (long)type);
        size_t n = spec_len(spec->tokens, spec->token_lens, i);
        KHUB_FORWARD_IF_ERROR(rt, khub__tok_set_vocab(tok, (int32_t)i, spec->tokens[i], n,
                                                      KHUB_TOKEN_NORMAL, true,
                                                      GG "tokenizer.ggml.tokens"));
        if (type == KHUB_TOKEN_CONTROL || type == KHUB_TOKEN_USER_DEFINED)
            KHUB_FORWARD_IF_ERROR(rt, khub__tok_add_added(tok, (int32_t)i, spec->tokens[i], n,
                                                          type == KHUB_TOKEN_CONTROL, false, false,
                                                          GG "tokenizer.ggml.tokens"));
        else
            tok->entries[i].type = (uint8_t)type;
    }
    return KHUB_STATUS_OK;
}

static khub_status spec_merges(khub_tokenizer *tok, const khub_tokenizer_spec *spec)
{
    khub_runtime *rt = tok->rt;
    for (size_t i = 0; i < spec->n_merges; i++) {
        const char *m = spec->merges[i];
        size_t n = m ? spec_len(spec->merges, spec->merge_lens, i) : 0;
        const char *sp = m ? memchr(m, ' ', n) : NULL;
        size_t rn = sp ? (size_t)(m + n - sp - 1) : 0;
        KHUB_RETURN_IF(rt, !sp || sp == m || rn == 0 || memchr(sp + 1, ' ', rn),
                       KHUB_STATUS_TOKENIZER,
                       GG "tokenizer.ggml.merges[%zu] is not \"left "
                          "right\"",
                       i);
        KHUB_FORWARD_IF_ERROR(rt, khub__tok_add_merge(tok, m, (size_t)(sp - m), sp + 1, rn,
                                                      (int32_t)i, GG "tokenizer.ggml.merges"));
    }
    return KHUB_STATUS_OK;
}

/* SentencePiece: the scores (checked finite), unk and the space prefix. */
static khub_status spec_spm(khub_tokenizer *tok, const khub_tokenizer_spec *spec)
{
    khub_runtime *rt = tok->rt;
    tok->spm = true;
    tok->spm_prefix = spec->add_space_prefix ? SPM_PREFIX_START : SPM_PREFIX_NONE;
    tok->spm_strip = spec->add_space_prefix ? SPM_STRIP_SPACE : SPM_STRIP_NONE;
    tok->unk = spec->unk_id;
    tok->scores = khub__calloc(rt, spec->n_tokens, sizeof *tok->scores);
    KHUB_RETURN_IF(rt, !tok->scores, KHUB_STATUS_NOMEM, "tokenizer: out of memory for %zu scores",
                   spec->n_tokens);
    for (size_t i = 0; i < spec->n_tokens; i++) {
        float v = spec->scores[i];
        KHUB_RETURN_IF(rt, !(v == v) || v > 3.4e38f || v < -3.4e38f, KHUB_STATUS_TOKENIZER,
                       GG "tokenizer.ggml.scores[%zu] is not a finite number", i);
        tok->scores[i] = v;
    }
    return KHUB_STATUS_OK;
}

static khub_status spec_id(khub_runtime *rt, int32_t id, size_t n, const char *key)
{
    KHUB_RETURN_IF(rt, id < -1 || (id >= 0 && (size_t)id >= n), KHUB_STATUS_TOKENIZER,
                   GG "tokenizer.ggml.%s %ld is outside the %zu tokens", key, (long)id, n);
    return KHUB_STATUS_OK;
}

static khub_status build_spec(khub_runtime *rt, const khub_tokenizer_spec *spec,
                              khub_tokenizer **out)
{
    bool spm = spec->model && strcmp(spec->model, "llama") == 0;
    KHUB_RETURN_IF(rt, !spec->model || (!spm && strcmp(spec->model, "gpt2") != 0),
                   KHUB_STATUS_TOKENIZER,
                   GG "tokenizer.ggml.model \"%.40s\" is not supported (supported: gpt2, "
                      "byte-level BPE; llama, SentencePiece BPE)",
                   spec->model ? spec->model : "(missing)");
    KHUB_RETURN_IF(rt, spm && !spec->scores, KHUB_STATUS_TOKENIZER,
                   GG "tokenizer.ggml.model is llama but tokenizer.ggml.scores is missing; a "
                      "SentencePiece vocab needs one score per token");
    KHUB_RETURN_IF(rt, spec->n_tokens == 0 || spec->n_tokens >= TOK_MAX_IDS || !spec->tokens,
                   KHUB_STATUS_TOKENIZER,
                   GG "tokenizer.ggml.tokens has %zu entries (must be "
                      "1..%u)",
                   spec->n_tokens, TOK_MAX_IDS - 1);
    KHUB_RETURN_IF(rt, spec->n_merges >= INT32_MAX || (spec->n_merges && !spec->merges),
                   KHUB_STATUS_TOKENIZER, GG "tokenizer.ggml.merges is missing or too long");
    pre_kind pre = PRE_GPT2;
    bool ignore_merges = false;
    /* SentencePiece has no pre-tokenizer: llama.cpp ignores tokenizer.ggml.pre for it. */
    if (!spm) KHUB_FORWARD_IF_ERROR(rt, spec_pre(rt, spec->pre, &pre, &ignore_merges));
    KHUB_FORWARD_IF_ERROR(rt, spec_id(rt, spec->bos_id, spec->n_tokens, "bos_token_id"));
    KHUB_FORWARD_IF_ERROR(rt, spec_id(rt, spec->eos_id, spec->n_tokens, "eos_token_id"));
    KHUB_FORWARD_IF_ERROR(rt, spec_id(rt, spec->pad_id, spec->n_tokens, "padding_token_id"));
    KHUB_FORWARD_IF_ERROR(rt, spec_id(rt, spec->unk_id, spec->n_tokens, "unknown_token_id"));
    KHUB_FORWARD_IF_ERROR(rt, khub__tok_new(rt, spec->n_tokens, spm ? 0 : spec->n_merges, out));
    khub_tokenizer *tok = *out;
    tok->pre = pre;
    tok->ignore_merges = ignore_merges;
    if (spm) KHUB_FORWARD_IF_ERROR(rt, spec_spm(tok, spec));
    KHUB_FORWARD_IF_ERROR(rt, spec_tokens(tok, spec));
    if (!spm) KHUB_FORWARD_IF_ERROR(rt, spec_merges(tok, spec));
    tok->bos = spec->bos_id;
    tok->eos = spec->eos_id;
    tok->pad = spec->pad_id;
    tok->add_bos = spec->add_bos == 1;
    if (spec->chat_template) {
        tok->chat_template = khub__strdup(rt, spec->chat_template);
        KHUB_RETURN_IF(rt, !tok->chat_template, KHUB_STATUS_NOMEM, "tokenizer: out of memory");
    }
    return khub__tok_finish(tok);
}

khub_status khub__tokenizer_from_vocab(khub_runtime *rt, const khub_tokenizer_spec *spec,
                                       khub_tokenizer **out)
{
    KHUB_API_CHECK(rt, spec && out);
    *out = NULL;
    khub_tokenizer *tok = NULL;
    khub_status st = build_spec(rt, spec, &tok);
    if (st != KHUB_STATUS_OK) {
        khub__tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return KHUB_STATUS_OK;
}
