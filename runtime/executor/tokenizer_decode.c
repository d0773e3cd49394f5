/*
 * tokenizer_decode.c: ids back to text. Decoding concatenates each token's
 * bytes (the byte-level mapping was undone at load) and replaces invalid
 * UTF-8 with U+FFFD, as Transformers' decode does; the streaming
 * detokenizer holds back the incomplete tail of a UTF-8 sequence between
 * tokens, so what it emits adds up to what decode returns.
 */
#include "tokenizer_impl.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct dbuf {
    char *p; /* NUL-terminated after n bytes once anything was appended */
    size_t n, cap;
} dbuf;

static bool dbuf_put(khub_runtime *rt, dbuf *b, const void *s, size_t n)
{
    size_t need;
    if (!khub__add_ok(b->n, n, &need) || !khub__add_ok(need, 1, &need)) return false;
    if (!khub__tok_grow(rt, (void **)&b->p, &b->cap, need, 1)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

static void dbuf_free(khub_runtime *rt, dbuf *b)
{
    khub__free(rt, b->p, b->cap);
    *b = (dbuf){0};
}

/* Appends s[0..n) to out with each maximal invalid subpart replaced by
 * U+FFFD. Unless final, an incomplete sequence at the end is not consumed;
 * returns the number of bytes consumed, or SIZE_MAX on OOM. */
static size_t put_lossy(khub_runtime *rt, dbuf *out, const unsigned char *s, size_t n, bool final)
{
    static const unsigned char fffd[3] = {0xEF, 0xBF, 0xBD};
    size_t i = 0, run = 0; /* run: start of the pending valid bytes */
    while (i < n) {
        uint32_t cp;
        size_t l = khub__utf8_decode(s + i, n - i, &cp);
        if (cp != KHUB__UNI_INVALID) {
            i += l;
            continue;
        }
        if (!final && khub__utf8_incomplete_tail(s + i, n - i)) break;
        if (!dbuf_put(rt, out, s + run, i - run) || !dbuf_put(rt, out, fffd, 3)) return SIZE_MAX;
        i += khub__utf8_invalid_len(s + i, n - i);
        run = i;
    }
    if (!dbuf_put(rt, out, s + run, i - run)) return SIZE_MAX;
    return i;
}

/* 1 when the text starts with the space a SentencePiece decoder strips
 * (Strip after Fuse; GGUF add_space_prefix), else 0. */
static size_t strip_prefix(const khub_tokenizer *tok, const char *p, size_t n)
{
    return tok->spm && tok->spm_strip == SPM_STRIP_SPACE && n > 0 && p[0] == ' ';
}

/* Appends the first decoded token of a Metaspace decoder (prepend_scheme
 * not "never"): its text without any "\u2581" (tokenizers drops them all
 * from token 0, not only a leading one). False on OOM. */
static bool put_first_token(const khub_tokenizer *tok, dbuf *out, int32_t id)
{
    const tok_entry *e = &tok->entries[id];
    const char *s = tok->strings + e->text_off;
    size_t run = 0, n = e->text_len;
    for (size_t i = 0; i + 3 <= n; i++) {
        if (memcmp(s + i, "\xE2\x96\x81", 3) != 0) continue;
        if (!dbuf_put(tok->rt, out, s + run, i - run)) return false;
        run = i + 3;
        i += 2;
    }
    return dbuf_put(tok->rt, out, s + run, n - run);
}

/* Whether token id is the first of the text and decodes by put_first_token. */
static bool first_token_rule(const khub_tokenizer *tok, bool first)
{
    return first && tok->spm && tok->spm_strip == SPM_STRIP_FIRST_TOKEN;
}

static bool skip_token(const khub_tokenizer *tok, int32_t id, uint32_t flags)
{
    return tok->entries[id].type == KHUB_TOKEN_CONTROL && !(flags & KHUB_DETOK_SPECIAL);
}

khub_status khub__tokenizer_token_bytes(const khub_tokenizer *tok, int32_t id, const char **ptr,
                                        size_t *len)
{
    khub_runtime *rt = tok ? tok->rt : NULL;
    KHUB_API_CHECK(rt, tok && ptr && len);
    KHUB_RETURN_IF(
        rt, id < 0 || (size_t)id >= tok->n_entries || tok->entries[id].type == KHUB_TOKEN_UNDEFINED,
        KHUB_STATUS_TOKENIZER, "tokenizer: token id %ld is not in the vocab (%zu ids)", (long)id,
        tok->n_entries);
    *ptr = tok->strings + tok->entries[id].bytes_off;
    *len = tok->entries[id].bytes_len;
    return KHUB_STATUS_OK;
}

khub_status khub__tokenizer_decode(const khub_tokenizer *tok, const int32_t *ids, size_t n,
                                   uint32_t flags, char **out, size_t *len)
{
    khub_runtime *rt = tok ? tok->rt : NULL;
    KHUB_API_CHECK(rt, tok && out && len && (ids || n == 0));
    *out = NULL;
    *len = 0;
    dbuf raw = {0}, txt = {0};
    khub_status st = KHUB_STATUS_NOMEM;
    bool first_done = false;
    for (size_t i = 0; i < n; i++) {
        const char *p = NULL; /* set on OK; initialised for -O3's flow analysis */
        size_t l = 0;
        if ((st = khub__tokenizer_token_bytes(tok, ids[i], &p, &l)) != KHUB_STATUS_OK) goto fail;
        st = KHUB_STATUS_NOMEM;
        if (skip_token(tok, ids[i], flags)) continue;
        bool ok = first_token_rule(tok, !first_done) ? put_first_token(tok, &raw, ids[i])
                                                     : dbuf_put(rt, &raw, p, l);
        if (!ok) goto fail;
        first_done = true;
    }
    /* raw.p is NULL when every token was skipped: no pointer arithmetic on it */
    if (!dbuf_put(rt, &txt, "", 0) || !dbuf_put(rt, &raw, "", 0)) goto fail;
    size_t skip = strip_prefix(tok, raw.p, raw.n);
    if (put_lossy(rt, &txt, (const unsigned char *)raw.p + skip, raw.n - skip, true) == SIZE_MAX)
        goto fail;
    dbuf_free(rt, &raw);
    char *exact = khub__realloc(rt, txt.p, txt.cap, txt.n + 1); /* free_text passes n + 1 */
    if (!exact) goto fail;
    *out = exact;
    *len = txt.n;
    return KHUB_STATUS_OK;
fail:
    dbuf_free(rt, &raw);
    dbuf_free(rt, &txt);
    if (st == KHUB_STATUS_NOMEM)
        return khub__fail(rt, st, "tokenizer: out of memory decoding %zu ids", n);
    return st;
}

void khub__tokenizer_free_text(const khub_tokenizer *tok, char *s, size_t len)
{
    if (tok && s) khub__free(tok->rt, s, len + 1);
}

/* ------------------------------------------------------------------------ */
/* Streaming detokenizer                                                    */
/* ------------------------------------------------------------------------ */

struct khub_detok {
    const khub_tokenizer *tok;
    uint32_t flags;
    unsigned char held[4]; /* incomplete UTF-8 tail carried to the next token */
    size_t n_held;
    bool started; /* some bytes were emitted (the space prefix is stripped before) */
    dbuf raw;     /* held bytes + the new token's bytes */
    dbuf delta;   /* text completed by the last call */
    dbuf all;     /* everything emitted since the last reset */
    dbuf first;   /* the first token's text under a Metaspace decoder */
};

khub_status khub__detok_new(const khub_tokenizer *tok, uint32_t flags, khub_detok **out)
{
    khub_runtime *rt = tok ? tok->rt : NULL;
    KHUB_API_CHECK(rt, tok && out);
    *out = khub__calloc(rt, 1, sizeof **out);
    KHUB_RETURN_IF(rt, !*out, KHUB_STATUS_NOMEM, "tokenizer: out of memory for a detokenizer");
    (*out)->tok = tok;
    (*out)->flags = flags;
    return KHUB_STATUS_OK;
}

void khub__detok_free(khub_detok *d)
{
    if (!d) return;
    khub_runtime *rt = d->tok->rt;
    dbuf_free(rt, &d->raw);
    dbuf_free(rt, &d->delta);
    dbuf_free(rt, &d->all);
    dbuf_free(rt, &d->first);
    khub__free(rt, d, sizeof *d);
}

void khub__detok_reset(khub_detok *d)
{
    if (!d) return;
    d->n_held = 0;
    d->started = false;
    d->delta.n = d->all.n = 0;
    if (d->delta.p) d->delta.p[0] = '\0';
    if (d->all.p) d->all.p[0] = '\0';
}

/* Converts held + bytes, keeping an incomplete tail unless final. */
static khub_status detok_run(khub_detok *d, const char *bytes, size_t n, bool final,
                             const char **text, size_t *len)
{
    khub_runtime *rt = d->tok->rt;
    d->raw.n = 0;
    d->delta.n = 0;
    bool ok = dbuf_put(rt, &d->raw, d->held, d->n_held) && dbuf_put(rt, &d->raw, bytes, n) &&
              dbuf_put(rt, &d->delta, "", 0);
    size_t used =
        ok ? put_lossy(rt, &d->delta, (const unsigned char *)d->raw.p, d->raw.n, final) : SIZE_MAX;
    ok = used != SIZE_MAX && dbuf_put(rt, &d->all, d->delta.p, d->delta.n);
    KHUB_RETURN_IF(rt, !ok, KHUB_STATUS_NOMEM, "tokenizer: out of memory detokenizing");
    d->n_held = d->raw.n - used; /* < 4: only an incomplete sequence is held */
    memcpy(d->held, d->raw.p + used, d->n_held);
    *text = d->delta.p;
    *len = d->delta.n;
    return KHUB_STATUS_OK;
}

khub_status khub__detok_push(khub_detok *d, int32_t id, const char **text, size_t *len)
{
    khub_runtime *rt = d ? d->tok->rt : NULL;
    KHUB_API_CHECK(rt, d && text && len);
    const char *p = NULL; /* set on OK; initialised for -O3's flow analysis */
    size_t l = 0;
    KHUB_FORWARD_IF_ERROR(rt, khub__tokenizer_token_bytes(d->tok, id, &p, &l));
    if (skip_token(d->tok, id, d->flags)) return detok_run(d, "", 0, false, text, len);
    if (first_token_rule(d->tok, !d->started)) {
        d->started = true;
        d->first.n = 0;
        KHUB_RETURN_IF(rt,
                       !dbuf_put(rt, &d->first, "", 0) || !put_first_token(d->tok, &d->first, id),
                       KHUB_STATUS_NOMEM, "tokenizer: out of memory detokenizing");
        return detok_run(d, d->first.p, d->first.n, false, text, len);
    }
    if (!d->started && l > 0) {
        size_t skip = strip_prefix(d->tok, p, l);
        p += skip;
        l -= skip;
        d->started = true;
    }
    return detok_run(d, p, l, false, text, len);
}

khub_status khub__detok_flush(khub_detok *d, const char **text, size_t *len)
{
    khub_runtime *rt = d ? d->tok->rt : NULL;
    KHUB_API_CHECK(rt, d && text && len);
    return detok_run(d, "", 0, true, text, len);
}

const char *khub__detok_text(const khub_detok *d, size_t *len)
{
    if (len) *len = d->all.n;
    return d->all.p ? d->all.p : "";
}
