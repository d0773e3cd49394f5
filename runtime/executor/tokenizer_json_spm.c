/*
 * tokenizer_json_spm.c: which SentencePiece-style pipeline a tokenizer.json
 * describes, read from its normalizer, pre_tokenizer and decoder, exactly as
 * the tokenizers library runs them (issue 15). The shapes Transformers and
 * tokenizers write for Llama 2, Mistral 7B v0.1, TinyLlama and Gemma:
 *
 *   normalizer                      pre_tokenizer              prefix
 *   Replace " " -> "\u2581"         none, or Split " "         none (Gemma)
 *   Sequence [Prepend "\u2581",     none                       before every stretch
 *             Replace " " -> ...]                              between added tokens
 *   none                            Metaspace "\u2581",        "first": at offset 0 only,
 *                                   prepend_scheme, split      "always": every stretch,
 *                                                              "never"; both skip a
 *                                                              stretch that starts with " "
 *
 *   decoder: Sequence [Replace "\u2581" -> " ", ByteFallback, Fuse] with or
 *   without a final Strip " " (start 1, stop 0), which drops one leading
 *   space of the text; or Metaspace, which turns "\u2581" into " " but drops
 *   every one of the first token (prepend_scheme not "never") and leaves
 *   "<0xXX>" pieces as they are written (it has no byte fallback).
 *
 * Prepend is a normalizer, so tokenizers runs it on each piece of text
 * between the added tokens it matches before normalizing (normalized: false
 * ones); a normalized added token would be matched after the "\u2581" was
 * put in, which khub (matching on the raw text) does not do: tokenizer_json.c
 * refuses such tokens with Prepend. Anything else is refused by name.
 */
#include "tokenizer_impl.h"

#include <cjson/cJSON.h>
#include <string.h>

#define TJ         "tokenizer.json: "
#define SPACE_MARK "\xE2\x96\x81" /* U+2581, SentencePiece's space */

static const cJSON *jget(const cJSON *o, const char *key)
{
    return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static bool jnull(const cJSON *v) { return !v || cJSON_IsNull(v); }

static bool is_type(const cJSON *o, const char *type)
{
    const cJSON *t = jget(o, "type");
    return cJSON_IsString(t) && strcmp(t->valuestring, type) == 0;
}

static const char *type_of(const cJSON *o)
{
    const cJSON *t = jget(o, "type");
    return cJSON_IsString(t) ? t->valuestring : "?";
}

/* A Replace step of the given pattern string and content. */
static bool is_replace(const cJSON *o, const char *from, const char *to)
{
    const cJSON *p = jget(jget(o, "pattern"), "String"), *c = jget(o, "content");
    return is_type(o, "Replace") && cJSON_IsString(p) && strcmp(p->valuestring, from) == 0 &&
           cJSON_IsString(c) && strcmp(c->valuestring, to) == 0;
}

static bool is_prepend(const cJSON *o)
{
    const cJSON *p = jget(o, "prepend");
    return is_type(o, "Prepend") && cJSON_IsString(p) && strcmp(p->valuestring, SPACE_MARK) == 0;
}

/* No pre-tokenizer, or a Split on the string " " (Transformers' Gemma
 * conversion writes one): after the normalizer has turned every space into
 * "\u2581" there is no " " left, so it splits nothing. */
static bool is_space_split(const cJSON *pre)
{
    if (jnull(pre)) return true;
    const cJSON *p = jget(jget(pre, "pattern"), "String"), *inv = jget(pre, "invert");
    return is_type(pre, "Split") && cJSON_IsString(p) && strcmp(p->valuestring, " ") == 0 &&
           (jnull(inv) || cJSON_IsFalse(inv));
}

/* A Metaspace step (pre-tokenizer or decoder) as tokenizers deserializes it:
 * replacement "\u2581"; prepend_scheme "first" | "always" | "never"
 * (absent: "always"); the older add_prefix_space false means "never" and
 * contradicts any other scheme; split true | false (absent: true). */
static khub_status read_metaspace(khub_runtime *rt, const cJSON *m, const char *field,
                                  spm_prefix_kind *scheme, bool *split)
{
    const cJSON *r = jget(m, "replacement"), *ps = jget(m, "prepend_scheme");
    const cJSON *aps = jget(m, "add_prefix_space"), *sp = jget(m, "split");
    KHUB_RETURN_IF(rt, !cJSON_IsString(r) || strcmp(r->valuestring, SPACE_MARK) != 0,
                   KHUB_STATUS_TOKENIZER,
                   TJ "%s.replacement is not \"\u2581\"; khub's SentencePiece-style "
                      "tokenizers use only that one",
                   field);
    const char *s = jnull(ps) ? "always" : cJSON_IsString(ps) ? ps->valuestring : "?";
    if (strcmp(s, "first") == 0)
        *scheme = SPM_PREFIX_META_FIRST;
    else if (strcmp(s, "always") == 0)
        *scheme = SPM_PREFIX_META_ALWAYS;
    else if (strcmp(s, "never") == 0)
        *scheme = SPM_PREFIX_NONE;
    else
        return khub__fail(rt, KHUB_STATUS_TOKENIZER,
                          TJ "%s.prepend_scheme \"%.40s\" is not first, always or never", field, s);
    KHUB_RETURN_IF(rt, !jnull(aps) && !cJSON_IsBool(aps), KHUB_STATUS_TOKENIZER,
                   TJ "%s.add_prefix_space must be true or false", field);
    if (cJSON_IsFalse(aps)) {
        KHUB_RETURN_IF(rt, *scheme != SPM_PREFIX_NONE, KHUB_STATUS_TOKENIZER,
                       TJ "%s: add_prefix_space false does not match prepend_scheme \"%s\"", field,
                       s);
    }
    KHUB_RETURN_IF(rt, !jnull(sp) && !cJSON_IsBool(sp), KHUB_STATUS_TOKENIZER,
                   TJ "%s.split must be true or false", field);
    *split = jnull(sp) || cJSON_IsTrue(sp);
    return KHUB_STATUS_OK;
}

/* The normalizer: none, Replace " " -> "\u2581", or Sequence [Prepend,
 * Replace] (Transformers' legacy Llama conversion). */
static khub_status read_normalizer(khub_runtime *rt, const cJSON *norm, spm_shape *sh)
{
    if (jnull(norm)) return KHUB_STATUS_OK;
    sh->spm = true;
    if (is_replace(norm, " ", SPACE_MARK)) return KHUB_STATUS_OK;
    const cJSON *list = jget(norm, "normalizers");
    if (is_type(norm, "Sequence") && cJSON_GetArraySize(list) == 2 && is_prepend(list->child) &&
        is_replace(list->child->next, " ", SPACE_MARK)) {
        sh->prefix = SPM_PREFIX_EACH;
        return KHUB_STATUS_OK;
    }
    if (is_type(norm, "Sequence") && cJSON_GetArraySize(list) == 1 &&
        is_replace(list->child, " ", SPACE_MARK))
        return KHUB_STATUS_OK;
    return khub__fail(rt, KHUB_STATUS_TOKENIZER,
                      TJ "normalizer \"%.40s\" is not supported (supported: none; Replace \" \" "
                         "-> \"\u2581\"; Sequence [Prepend \"\u2581\", Replace \" \" -> "
                         "\"\u2581\"])",
                      type_of(norm));
}

/* The decoder of an spm file (see the table above). */
static khub_status read_decoder(khub_runtime *rt, const cJSON *dec, spm_shape *sh)
{
    if (is_type(dec, "Metaspace")) {
        spm_prefix_kind scheme;
        bool split;
        KHUB_FORWARD_IF_ERROR(rt, read_metaspace(rt, dec, "decoder", &scheme, &split));
        sh->strip = scheme == SPM_PREFIX_NONE ? SPM_STRIP_NONE : SPM_STRIP_FIRST_TOKEN;
        sh->raw_bytes = true;
        return KHUB_STATUS_OK;
    }
    const cJSON *d = jget(dec, "decoders");
    int n = cJSON_GetArraySize(d);
    bool ok = is_type(dec, "Sequence") && (n == 3 || n == 4);
    if (ok) {
        const cJSON *a = d->child, *b = a->next, *c = b->next;
        ok = is_replace(a, SPACE_MARK, " ") && is_type(b, "ByteFallback") && is_type(c, "Fuse");
        if (ok && n == 4) {
            const cJSON *s = c->next, *content = jget(s, "content");
            const cJSON *start = jget(s, "start"), *stop = jget(s, "stop");
            ok = is_type(s, "Strip") && cJSON_IsString(content) &&
                 strcmp(content->valuestring, " ") == 0 && cJSON_IsNumber(start) &&
                 start->valuedouble == 1 && cJSON_IsNumber(stop) && stop->valuedouble == 0;
            sh->strip = SPM_STRIP_SPACE;
        }
    }
    KHUB_RETURN_IF(rt, !ok, KHUB_STATUS_TOKENIZER,
                   TJ "decoder is not Sequence [Replace \"\u2581\" -> \" \", ByteFallback, "
                      "Fuse] (optionally + Strip \" \" start 1 stop 0) or Metaspace, which a "
                      "SentencePiece-style tokenizer needs");
    return KHUB_STATUS_OK;
}

khub_status khub__tok_json_spm_shape(khub_runtime *rt, const cJSON *root, spm_shape *sh)
{
    *sh = (spm_shape){0};
    const cJSON *norm = jget(root, "normalizer"), *pre = jget(root, "pre_tokenizer");
    KHUB_FORWARD_IF_ERROR(rt, read_normalizer(rt, norm, sh));
    if (sh->spm) {
        KHUB_RETURN_IF(rt, !is_space_split(pre), KHUB_STATUS_TOKENIZER,
                       TJ "pre_tokenizer \"%.40s\" is set with a \"\u2581\" normalizer; khub's "
                          "SentencePiece-style BPE has none (or a Split on \" \", which "
                          "the normalizer leaves nothing to split)",
                       type_of(pre));
    } else if (is_type(pre, "Metaspace")) {
        sh->spm = true;
        spm_prefix_kind scheme;
        KHUB_FORWARD_IF_ERROR(rt, read_metaspace(rt, pre, "pre_tokenizer", &scheme, &sh->split));
        sh->prefix = (uint8_t)scheme;
    }
    if (!sh->spm) return KHUB_STATUS_OK; /* byte-level: tokenizer_json.c reads the rest */
    return read_decoder(rt, jget(root, "decoder"), sh);
}
