/*
 * tokenizer_json.c: loading a Hugging Face tokenizer.json, plus
 * tokenizer_config.json from the same directory for the chat template, the
 * bos/eos/pad tokens and add_bos_token. Two families:
 *   - byte-level BPE: no normalizer, a ByteLevel decoder, and a
 *     pre-tokenizer recognised by its exact shape (ByteLevel; Digits +
 *     ByteLevel; Split with the Llama-3 or Qwen2 regex + ByteLevel);
 *   - SentencePiece-style: the normalizer / pre-tokenizer / decoder shapes
 *     tokenizer_json_spm.c reads (Gemma's Replace, Llama's Prepend or
 *     Metaspace), over byte-fallback BPE (merges by rank, tokenizer_spm.c)
 *     or a Unigram model (tokenizer_unigram.c).
 * Any other shape, and every model option khub does not implement, is
 * refused with a message naming the field.
 */
#include "tokenizer_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define TOK_MAX_FILE (1u << 30) /* bytes of tokenizer.json */

#define TJ "tokenizer.json: "

/* The Split regexes of tokenizer.json files, exactly as Transformers writes them. */
static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const cJSON *jget(const cJSON *o, const char *key)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static bool jnull(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* Optional boolean: absent or null gives dflt. */
static khub_status jbool(khub_runtime *rt, const cJSON *o, const char *key, bool dflt, bool *out,
                         const char *where)
{
    const cJSON *v = jget(o, key);
    if (jnull(v)) {
        *out = dflt;
        return KHUB_STATUS_OK;
    }
    KHUB_RETURN_IF(rt, !cJSON_IsBool(v), KHUB_STATUS_TOKENIZER, "%s%s must be true or false", where,
                   key);
    *out = cJSON_IsTrue(v);
    return KHUB_STATUS_OK;
}

static khub_status jid(khub_runtime *rt, const cJSON *v, int32_t *out, const char *where,
                       const char *name)
{
    KHUB_RETURN_IF(rt, !cJSON_IsNumber(v), KHUB_STATUS_TOKENIZER, "%s%s: the id must be a number",
                   where, name);
    double d = v->valuedouble;
    KHUB_RETURN_IF(rt, !(d >= 0 && d < TOK_MAX_IDS) || d != (double)(int32_t)d,
                   KHUB_STATUS_TOKENIZER, "%s%s: id %.17g is not an integer in 0..%u", where, name,
                   d, TOK_MAX_IDS - 1);
    *out = (int32_t)d;
    return KHUB_STATUS_OK;
}

/* A ByteLevel step: add_prefix_space must be false; use_regex as given. */
static bool is_bytelevel(const cJSON *p, bool use_regex)
{
    const cJSON *t = jget(p, "type"), *aps = jget(p, "add_prefix_space");
    const cJSON *ur = jget(p, "use_regex");
    if (!cJSON_IsString(t) || strcmp(t->valuestring, "ByteLevel") != 0) return false;
    if (!cJSON_IsFalse(aps)) return false;
    bool r = jnull(ur) ? true : cJSON_IsTrue(ur);
    return r == use_regex;
}

static khub_status detect_pre(khub_runtime *rt, const cJSON *pre, pre_kind *out)
{
    const cJSON *t = jget(pre, "type");
    KHUB_RETURN_IF(rt, !cJSON_IsString(t), KHUB_STATUS_TOKENIZER,
                   TJ "pre_tokenizer.type is missing; khub needs a byte-level pre-tokenizer");
    if (is_bytelevel(pre, true)) {
        *out = PRE_GPT2;
        return KHUB_STATUS_OK;
    }
    const cJSON *list = jget(pre, "pretokenizers");
    if (strcmp(t->valuestring, "Sequence") == 0 && cJSON_GetArraySize(list) == 2) {
        const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
        const cJSON *at = jget(a, "type");
        if (cJSON_IsString(at) && strcmp(at->valuestring, "Digits") == 0 &&
            cJSON_IsTrue(jget(a, "individual_digits")) && is_bytelevel(b, true)) {
            *out = PRE_SMOLLM;
            return KHUB_STATUS_OK;
        }
        const cJSON *re = jget(jget(a, "pattern"), "Regex"), *beh = jget(a, "behavior");
        if (cJSON_IsString(at) && strcmp(at->valuestring, "Split") == 0 && cJSON_IsString(re) &&
            cJSON_IsString(beh) && strcmp(beh->valuestring, "Isolated") == 0 &&
            !cJSON_IsTrue(jget(a, "invert")) && is_bytelevel(b, false)) {
            if (strcmp(re->valuestring, re_llama3) == 0)
                *out = PRE_LLAMA3;
            else if (strcmp(re->valuestring, re_qwen2) == 0)
                *out = PRE_QWEN2;
            else
                return khub__fail(rt, KHUB_STATUS_TOKENIZER,
                                  TJ "pre_tokenizer: Split regex "
                                     "\"%.80s\" is not one khub implements (GPT-2, SmolLM2, "
                                     "Llama-3, Qwen2)",
                                  re->valuestring);
            return KHUB_STATUS_OK;
        }
    }
    return khub__fail(rt, KHUB_STATUS_TOKENIZER,
                      TJ "pre_tokenizer of type \"%.40s\" is not a "
                         "pattern khub implements (ByteLevel, Digits+ByteLevel, Split(Llama-3 or "
                         "Qwen2 regex)+ByteLevel, all without add_prefix_space)",
                      t->valuestring);
}

/* Refuses model options that change BPE in ways khub does not implement. */
static khub_status check_model(khub_tokenizer *tok, const cJSON *model)
{
    khub_runtime *rt = tok->rt;
    const cJSON *t = jget(model, "type");
    KHUB_RETURN_IF(rt, !cJSON_IsObject(model), KHUB_STATUS_TOKENIZER,
                   TJ "model is missing or not an object");
    KHUB_RETURN_IF(rt, !jnull(t) && !(cJSON_IsString(t) && strcmp(t->valuestring, "BPE") == 0),
                   KHUB_STATUS_TOKENIZER, TJ "model.type \"%.40s\" is not supported (only BPE)",
                   cJSON_IsString(t) ? t->valuestring : "?");
    const cJSON *dropout = jget(model, "dropout");
    KHUB_RETURN_IF(rt, !jnull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0),
                   KHUB_STATUS_TOKENIZER,
                   TJ "model.dropout is set; BPE dropout is training-only "
                      "and not supported");
    static const char *const empty_keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *v = jget(model, empty_keys[i]);
        KHUB_RETURN_IF(rt, !jnull(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'),
                       KHUB_STATUS_TOKENIZER,
                       TJ "model.%s is set; not supported for byte-level "
                          "BPE",
                       empty_keys[i]);
    }
    bool byte_fallback;
    KHUB_FORWARD_IF_ERROR(rt,
                          jbool(rt, model, "byte_fallback", false, &byte_fallback, TJ "model."));
    KHUB_RETURN_IF(rt, byte_fallback != tok->spm, KHUB_STATUS_TOKENIZER,
                   tok->spm ? TJ "model.byte_fallback is false; khub's SentencePiece-style BPE "
                                 "(normalizer Replace \" \" -> \"\u2581\") needs it true"
                            : TJ "model.byte_fallback is true; not supported for byte-level BPE");
    KHUB_FORWARD_IF_ERROR(
        rt, jbool(rt, model, "ignore_merges", false, &tok->ignore_merges, TJ "model."));
    KHUB_RETURN_IF(rt, tok->spm && tok->ignore_merges, KHUB_STATUS_TOKENIZER,
                   TJ "model.ignore_merges is true; not supported for SentencePiece-style BPE");
    KHUB_FORWARD_IF_ERROR(rt, jbool(rt, model, "fuse_unk", false, &tok->fuse_unk, TJ "model."));
    return KHUB_STATUS_OK;
}

/* Number of ids: one past the largest id of model.vocab and added_tokens. */
static khub_status count_ids(khub_runtime *rt, const cJSON *vocab, const cJSON *added, size_t *n)
{
    int32_t max = -1, id;
    size_t count = 0;
    for (const cJSON *v = vocab->child; v; v = v->next, count++) {
        KHUB_FORWARD_IF_ERROR(rt, jid(rt, v, &id, TJ "model.vocab.", v->string));
        if (id > max) max = id;
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, count++) {
        KHUB_FORWARD_IF_ERROR(rt, jid(rt, jget(a, "id"), &id, TJ "added_tokens", "[].id"));
        if (id > max) max = id;
    }
    /* Holes are tolerated, a vocab mostly made of them is not: it would make a
     * hostile file cost memory for ids nobody uses. */
    KHUB_RETURN_IF(rt, (size_t)max + 1 > 2 * count + 256, KHUB_STATUS_TOKENIZER,
                   TJ "model.vocab: id %ld is far beyond the %zu entries; the file is corrupt",
                   (long)max, count);
    *n = (size_t)max + 1;
    return KHUB_STATUS_OK;
}

static khub_status load_vocab(khub_tokenizer *tok, const cJSON *vocab)
{
    for (const cJSON *v = vocab->child; v; v = v->next) {
        int32_t id = (int32_t)v->valuedouble; /* checked by count_ids */
        KHUB_FORWARD_IF_ERROR(tok->rt,
                              khub__tok_set_vocab(tok, id, v->string, strlen(v->string),
                                                  KHUB_TOKEN_NORMAL, false, TJ "model.vocab"));
    }
    return KHUB_STATUS_OK;
}

static khub_status load_added(khub_tokenizer *tok, const cJSON *added)
{
    khub_runtime *rt = tok->rt;
    int i = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, i++) {
        char where[48];
        snprintf(where, sizeof where, TJ "added_tokens[%d]", i);
        const cJSON *content = jget(a, "content");
        KHUB_RETURN_IF(rt, !cJSON_IsString(content), KHUB_STATUS_TOKENIZER,
                       "%s.content is missing or not a string", where);
        bool special, lstrip, rstrip, single;
        KHUB_FORWARD_IF_ERROR(rt, jbool(rt, a, "special", false, &special, where));
        KHUB_FORWARD_IF_ERROR(rt, jbool(rt, a, "lstrip", false, &lstrip, where));
        KHUB_FORWARD_IF_ERROR(rt, jbool(rt, a, "rstrip", false, &rstrip, where));
        KHUB_FORWARD_IF_ERROR(rt, jbool(rt, a, "single_word", false, &single, where));
        KHUB_RETURN_IF(rt, single, KHUB_STATUS_TOKENIZER,
                       "%s: single_word added tokens are not supported", where);
        bool normalized;
        KHUB_FORWARD_IF_ERROR(rt, jbool(rt, a, "normalized", true, &normalized, where));
        /* tokenizers matches such a token after Prepend put a "\u2581" before its
         * piece; khub matches added tokens on the raw text (tokenizer_json_spm.c) */
        KHUB_RETURN_IF(rt, normalized && tok->spm_prefix == SPM_PREFIX_EACH, KHUB_STATUS_TOKENIZER,
                       "%s: \"%.40s\" is a normalized added token beside a Prepend normalizer; "
                       "not supported (only normalized: false)",
                       where, content->valuestring);
        int32_t id = (int32_t)jget(a, "id")->valuedouble; /* checked by count_ids */
        KHUB_FORWARD_IF_ERROR(rt, khub__tok_add_added(tok, id, content->valuestring,
                                                      strlen(content->valuestring), special, lstrip,
                                                      rstrip, where));
    }
    return KHUB_STATUS_OK;
}

static khub_status load_merges(khub_tokenizer *tok, const cJSON *merges)
{
    khub_runtime *rt = tok->rt;
    int32_t rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *l = NULL, *r = NULL;
        size_t ln = 0, rn = 0;
        if (cJSON_IsString(m)) { /* "left right" */
            const char *sp = strchr(m->valuestring, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                l = m->valuestring;
                ln = (size_t)(sp - l);
                r = sp + 1;
                rn = strlen(r);
            }
        } else if (cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) { /* ["left", "right"] */
            l = m->child->valuestring;
            r = m->child->next->valuestring;
            ln = strlen(l);
            rn = strlen(r);
        }
        KHUB_RETURN_IF(rt, !l || !ln || !rn, KHUB_STATUS_TOKENIZER,
                       TJ "model.merges[%ld] is neither \"left right\" nor [\"left\", \"right\"]",
                       (long)rank);
        KHUB_FORWARD_IF_ERROR(rt, khub__tok_add_merge(tok, l, ln, r, rn, rank, TJ "model.merges"));
    }
    return KHUB_STATUS_OK;
}

/* Post-processor: nothing, ByteLevel, or a TemplateProcessing that only puts a
 * special token (bos) before the text. */
static khub_status load_post(khub_tokenizer *tok, const cJSON *post)
{
    khub_runtime *rt = tok->rt;
    if (jnull(post)) return KHUB_STATUS_OK;
    const cJSON *t = jget(post, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "?";
    if (strcmp(type, "Sequence") == 0) {
        for (const cJSON *p = jget(post, "processors") ? jget(post, "processors")->child : NULL; p;
             p = p->next)
            KHUB_FORWARD_IF_ERROR(rt, load_post(tok, p));
        return KHUB_STATUS_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, strcmp(type, "TemplateProcessing") != 0, KHUB_STATUS_TOKENIZER,
                   TJ "post_processor \"%.40s\" is not supported", type);
    const cJSON *single = jget(post, "single");
    int k = 0;
    for (const cJSON *item = single ? single->child : NULL; item; item = item->next, k++) {
        const cJSON *sp = jget(jget(item, "SpecialToken"), "id");
        if (!sp) continue;
        KHUB_RETURN_IF(rt, k != 0 || !cJSON_IsString(sp), KHUB_STATUS_TOKENIZER,
                       TJ "post_processor.single adds a token after the text; only a leading "
                          "bos is supported");
        int32_t id = khub__tok_find_any(tok, sp->valuestring, strlen(sp->valuestring));
        KHUB_RETURN_IF(rt, id < 0, KHUB_STATUS_TOKENIZER,
                       TJ "post_processor.single names \"%.60s\", which is not a token",
                       sp->valuestring);
        tok->bos = id;
        tok->add_bos = true;
    }
    return KHUB_STATUS_OK;
}

/* A token named in tokenizer_config.json: a string, {"content": ...} or null. */
static khub_status cfg_token(khub_tokenizer *tok, const cJSON *cfg, const char *key, int32_t *id)
{
    const cJSON *v = jget(cfg, key);
    if (cJSON_IsObject(v)) v = jget(v, "content");
    if (jnull(v)) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(tok->rt, !cJSON_IsString(v), KHUB_STATUS_TOKENIZER,
                   "tokenizer_config.json: %s must be a string", key);
    int32_t f = khub__tok_find_any(tok, v->valuestring, strlen(v->valuestring));
    KHUB_RETURN_IF(tok->rt, f < 0, KHUB_STATUS_TOKENIZER,
                   "tokenizer_config.json: %s \"%.60s\" is not a token of tokenizer.json", key,
                   v->valuestring);
    *id = f;
    return KHUB_STATUS_OK;
}

static khub_status load_config(khub_tokenizer *tok, const char *cfg_text, size_t cfg_len)
{
    khub_runtime *rt = tok->rt;
    cJSON *cfg = cJSON_ParseWithLength(cfg_text, cfg_len);
    KHUB_RETURN_IF(rt, !cJSON_IsObject(cfg), (cJSON_Delete(cfg), KHUB_STATUS_TOKENIZER),
                   "tokenizer_config.json: not a JSON object; re-download it or remove it");
    khub_status st = KHUB_STATUS_OK;
    const cJSON *ct = jget(cfg, "chat_template");
    if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": "..."}, ...] */
        const cJSON *pick = NULL;
        for (const cJSON *c = ct->child; c; c = c->next) {
            const cJSON *name = jget(c, "name");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0) pick = c;
        }
        ct = pick ? jget(pick, "template") : NULL;
    }
    if (cJSON_IsString(ct)) {
        tok->chat_template = khub__strdup(rt, ct->valuestring);
        if (!tok->chat_template) st = khub__fail(rt, KHUB_STATUS_NOMEM, "tokenizer: out of memory");
    } else if (!jnull(ct)) {
        st = khub__fail(rt, KHUB_STATUS_TOKENIZER,
                        "tokenizer_config.json: chat_template is "
                        "neither a string nor a list with a \"default\" entry");
    }
    if (st == KHUB_STATUS_OK) st = cfg_token(tok, cfg, "bos_token", &tok->bos);
    if (st == KHUB_STATUS_OK) st = cfg_token(tok, cfg, "eos_token", &tok->eos);
    if (st == KHUB_STATUS_OK) st = cfg_token(tok, cfg, "pad_token", &tok->pad);
    if (st == KHUB_STATUS_OK && jget(cfg, "add_bos_token"))
        st = jbool(rt, cfg, "add_bos_token", false, &tok->add_bos, "tokenizer_config.json: ");
    cJSON_Delete(cfg);
    return st;
}

static bool is_unigram(const cJSON *model)
{
    const cJSON *t = jget(model, "type");
    return cJSON_IsString(t) && strcmp(t->valuestring, "Unigram") == 0;
}

/* A Unigram model: its vocab, scores, unk and byte_fallback (the
 * pipeline around it must be SentencePiece-style). */
static khub_status build_unigram(khub_runtime *rt, const cJSON *root, const spm_shape *sh,
                                 khub_tokenizer **out)
{
    const cJSON *model = jget(root, "model"), *added = jget(root, "added_tokens");
    KHUB_RETURN_IF(rt, !sh->spm, KHUB_STATUS_TOKENIZER,
                   TJ "model.type \"Unigram\" needs a SentencePiece-style pipeline (a "
                      "Metaspace pre-tokenizer or a \"\u2581\" normalizer); this file has neither");
    size_t n_pieces = 0, n_ids = 0;
    KHUB_FORWARD_IF_ERROR(rt, khub__tok_unigram_count(rt, jget(model, "vocab"), &n_pieces));
    n_ids = n_pieces;
    for (const cJSON *a = cJSON_IsArray(added) ? added->child : NULL; a; a = a->next) {
        int32_t id;
        KHUB_FORWARD_IF_ERROR(rt, jid(rt, jget(a, "id"), &id, TJ "added_tokens", "[].id"));
        KHUB_RETURN_IF(rt, (size_t)id >= n_pieces + 256, KHUB_STATUS_TOKENIZER,
                       TJ "added_tokens: id %ld is far beyond the %zu pieces; the file is corrupt",
                       (long)id, n_pieces);
        if ((size_t)id >= n_ids) n_ids = (size_t)id + 1;
    }
    KHUB_FORWARD_IF_ERROR(rt, khub__tok_new(rt, n_ids, 0, out));
    khub_tokenizer *tok = *out;
    tok->spm = true;
    tok->spm_prefix = sh->prefix;
    tok->spm_strip = sh->strip;
    tok->spm_split = sh->split;
    tok->spm_raw_bytes = sh->raw_bytes;
    KHUB_FORWARD_IF_ERROR(
        rt, jbool(rt, model, "byte_fallback", false, &tok->uni_byte_fallback, TJ "model."));
    KHUB_FORWARD_IF_ERROR(rt, khub__tok_unigram_load(tok, model));
    KHUB_FORWARD_IF_ERROR(rt, load_added(tok, cJSON_IsArray(added) ? added : NULL));
    return load_post(tok, jget(root, "post_processor"));
}

/* A byte-level file's decoder: ByteLevel. */
static khub_status check_bytelevel_decoder(khub_runtime *rt, const cJSON *dec)
{
    const cJSON *dt = jget(dec, "type");
    KHUB_RETURN_IF(rt, !cJSON_IsString(dt) || strcmp(dt->valuestring, "ByteLevel") != 0,
                   KHUB_STATUS_TOKENIZER, TJ "decoder \"%.40s\" is not supported (only ByteLevel)",
                   cJSON_IsString(dt) ? dt->valuestring : "(missing)");
    return KHUB_STATUS_OK;
}

static khub_status check_top(khub_runtime *rt, const cJSON *root)
{
    KHUB_RETURN_IF(rt, !cJSON_IsObject(root), KHUB_STATUS_TOKENIZER,
                   TJ "not a JSON object; re-download the tokenizer");
    const cJSON *added = jget(root, "added_tokens");
    KHUB_RETURN_IF(rt, !jnull(added) && !cJSON_IsArray(added), KHUB_STATUS_TOKENIZER,
                   TJ "added_tokens must be a list");
    const cJSON *t = jget(jget(root, "model"), "type");
    if (is_unigram(jget(root, "model"))) return KHUB_STATUS_OK; /* tokenizer_unigram.c */
    KHUB_RETURN_IF(rt, !jnull(t) && !(cJSON_IsString(t) && strcmp(t->valuestring, "BPE") == 0),
                   KHUB_STATUS_TOKENIZER,
                   TJ "model.type \"%.40s\" is not supported (only BPE and Unigram)",
                   cJSON_IsString(t) ? t->valuestring : "?");
    const cJSON *vocab = jget(jget(root, "model"), "vocab");
    KHUB_RETURN_IF(rt, !cJSON_IsObject(vocab) || !vocab->child, KHUB_STATUS_TOKENIZER,
                   TJ "model.vocab is missing, empty or not an object");
    const cJSON *merges = jget(jget(root, "model"), "merges");
    KHUB_RETURN_IF(rt, !cJSON_IsArray(merges), KHUB_STATUS_TOKENIZER,
                   TJ "model.merges is missing or not a list");
    return KHUB_STATUS_OK;
}

static khub_status build_json(khub_runtime *rt, const cJSON *root, const char *cfg, size_t cfg_len,
                              khub_tokenizer **out)
{
    KHUB_FORWARD_IF_ERROR(rt, check_top(rt, root));
    const cJSON *model = jget(root, "model"), *vocab = jget(model, "vocab");
    const cJSON *merges = jget(model, "merges"), *added = jget(root, "added_tokens");
    pre_kind pre = PRE_GPT2;
    spm_shape sh;
    KHUB_FORWARD_IF_ERROR(rt, khub__tok_json_spm_shape(rt, root, &sh));
    if (is_unigram(model)) {
        KHUB_FORWARD_IF_ERROR(rt, build_unigram(rt, root, &sh, out));
        if (cfg) KHUB_FORWARD_IF_ERROR(rt, load_config(*out, cfg, cfg_len));
        return khub__tok_finish(*out);
    }
    bool spm = sh.spm;
    if (!spm) KHUB_FORWARD_IF_ERROR(rt, detect_pre(rt, jget(root, "pre_tokenizer"), &pre));
    if (!spm) KHUB_FORWARD_IF_ERROR(rt, check_bytelevel_decoder(rt, jget(root, "decoder")));
    /* spm ranks become float scores (tokenizer_spm.c): exact below 2^24 */
    KHUB_RETURN_IF(rt, spm && cJSON_GetArraySize(merges) >= (1 << 24), KHUB_STATUS_TOKENIZER,
                   TJ "model.merges has %d entries (at most %d)", cJSON_GetArraySize(merges),
                   (1 << 24) - 1);
    size_t n_ids = 0;
    KHUB_FORWARD_IF_ERROR(rt, count_ids(rt, vocab, cJSON_IsArray(added) ? added : NULL, &n_ids));
    KHUB_FORWARD_IF_ERROR(rt, khub__tok_new(rt, n_ids, (size_t)cJSON_GetArraySize(merges), out));
    khub_tokenizer *tok = *out;
    tok->pre = pre;
    tok->spm = tok->spm_merges = spm; /* before the vocab: spm pieces decode differently */
    tok->spm_prefix = sh.prefix;
    tok->spm_strip = sh.strip;
    tok->spm_split = sh.split;
    tok->spm_raw_bytes = sh.raw_bytes;
    KHUB_FORWARD_IF_ERROR(rt, check_model(tok, model));
    KHUB_FORWARD_IF_ERROR(rt, load_vocab(tok, vocab));
    KHUB_FORWARD_IF_ERROR(rt, load_added(tok, cJSON_IsArray(added) ? added : NULL));
    KHUB_FORWARD_IF_ERROR(rt, load_merges(tok, merges));
    const cJSON *unk = jget(model, "unk_token");
    if (cJSON_IsString(unk)) {
        tok->unk = khub__tok_find_any(tok, unk->valuestring, strlen(unk->valuestring));
        KHUB_RETURN_IF(rt, tok->unk < 0, KHUB_STATUS_TOKENIZER,
                       TJ "model.unk_token \"%.60s\" is not in the vocab", unk->valuestring);
    }
    KHUB_FORWARD_IF_ERROR(rt, load_post(tok, jget(root, "post_processor")));
    if (cfg) KHUB_FORWARD_IF_ERROR(rt, load_config(tok, cfg, cfg_len));
    return khub__tok_finish(tok);
}

khub_status khub__tokenizer_from_json_mem(khub_runtime *rt, const char *json, size_t len,
                                          const char *config, size_t config_len,
                                          khub_tokenizer **out)
{
    KHUB_API_CHECK(rt, out && (json || len == 0));
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    KHUB_RETURN_IF(rt, !root, KHUB_STATUS_TOKENIZER,
                   TJ "not valid JSON (%zu bytes); re-download the tokenizer", len);
    khub_tokenizer *tok = NULL;
    khub_status st = build_json(rt, root, config, config_len, &tok);
    cJSON_Delete(root);
    if (st != KHUB_STATUS_OK) {
        khub__tokenizer_free(tok);
        return st;
    }
    *out = tok;
    return KHUB_STATUS_OK;
}

/* Reads a whole file; NOT_FOUND when it does not exist. */
static khub_status read_file(khub_runtime *rt, const char *path, char **data, size_t *len)
{
    char why[KHUB_ERROR_SIZE];
    FILE *f = khub__fopen_regular(path, why, sizeof why);
    if (!f)
        return khub__fail(rt, errno == ENOENT ? KHUB_STATUS_NOT_FOUND : KHUB_STATUS_IO,
                          "tokenizer: %s", why);
    khub_status st = KHUB_STATUS_IO;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || size > (long)TOK_MAX_FILE || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return khub__fail(rt, KHUB_STATUS_IO,
                          "tokenizer: cannot size %s (or it is over %u "
                          "bytes)",
                          path, TOK_MAX_FILE);
    }
    char *buf = khub__malloc(rt, (size_t)size + 1);
    if (!buf) {
        fclose(f);
        return khub__fail(rt, KHUB_STATUS_NOMEM, "tokenizer: out of memory reading %s", path);
    }
    if (fread(buf, 1, (size_t)size, f) == (size_t)size) st = KHUB_STATUS_OK;
    fclose(f);
    if (st != KHUB_STATUS_OK) {
        khub__free(rt, buf, (size_t)size + 1);
        return khub__fail(rt, st, "tokenizer: short read on %s", path);
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
    return KHUB_STATUS_OK;
}

khub_status khub__tokenizer_from_json(khub_runtime *rt, const char *path, khub_tokenizer **out)
{
    KHUB_API_CHECK(rt, path && out);
    *out = NULL;
    char *json = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    KHUB_FORWARD_IF_ERROR(rt, read_file(rt, path, &json, &len));
    /* tokenizer_config.json from the same directory, when there is one. */
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char cfg_path[4096];
    khub_status st = KHUB_STATUS_OK;
    if (dir + sizeof "tokenizer_config.json" <= sizeof cfg_path) {
        memcpy(cfg_path, path, dir);
        memcpy(cfg_path + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
        if (access(cfg_path, F_OK) == 0) st = read_file(rt, cfg_path, &cfg, &cfg_len);
    }
    if (st == KHUB_STATUS_OK) st = khub__tokenizer_from_json_mem(rt, json, len, cfg, cfg_len, out);
    khub__free(rt, json, len + 1);
    if (cfg) khub__free(rt, cfg, cfg_len + 1);
    return st;
}
