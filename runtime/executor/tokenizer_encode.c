/*
 * tokenizer_encode.c: encoding a text. Added tokens are found first
 * (leftmost-longest, honouring lstrip/rstrip; special ones only with
 * KHUB_TOK_PARSE_SPECIAL); each stretch between them is pre-tokenized (for
 * SmolLM2, each digit is split off first) and every piece goes through BPE,
 * or, for a SentencePiece tokenizer, the stretch goes whole to
 * tokenizer_spm.c (the space prefix, when the tokenizer has one, only before
 * a stretch at the very start of the text).
 *
 * Invalid UTF-8 in the text is replaced with U+FFFD first, one per maximal
 * invalid subpart, and the first bad byte's offset is logged (WARN). This is
 * what Transformers' text path tokenizes: a Python str cannot hold invalid
 * UTF-8, and bytes.decode(errors="replace") makes the same replacements.
 * Refusing was the alternative; replacing keeps a prompt read from a file
 * in a legacy encoding usable, and the warning still says where it broke.
 * (Before issue 11 such bytes vanished without a word.)
 */
#include "tokenizer_impl.h"

#include <string.h>

/* Pre-tokenizes one stretch between added tokens and encodes each piece. */
static khub_status encode_stretch(const khub_tokenizer *tok, enc_state *st, span t)
{
    size_t i = 0;
    while (i < t.n) {
        span lim = t;
        if (tok->pre == PRE_SMOLLM) {
            /* Digits(individual_digits) isolates every \p{N} code point first;
             * the regex then sees each stretch between them on its own. */
            uint32_t c;
            size_t cl = khub__tok_cp_at(t, i, &c);
            if (khub__uni_is_number(c)) {
                KHUB_FORWARD_IF_ERROR(st->rt, khub__tok_bpe_piece(tok, st, (span){t.s + i, cl}));
                i += cl;
                continue;
            }
            size_t e = i;
            while (e < t.n) {
                size_t l = khub__tok_cp_at(t, e, &c);
                if (khub__uni_is_number(c)) break;
                e += l;
            }
            lim.n = e;
        }
        while (i < lim.n) {
            size_t e = khub__tok_match_piece(tok->pre, lim, i);
            KHUB_FORWARD_IF_ERROR(st->rt, khub__tok_bpe_piece(tok, st, (span){t.s + i, e - i}));
            i = e;
        }
    }
    return KHUB_STATUS_OK;
}

/* Leftmost-longest added token at or after pos; returns its index or -1. */
static ptrdiff_t next_added(const khub_tokenizer *tok, span t, size_t pos, bool special, size_t *at)
{
    for (size_t i = pos; i < t.n; i++) {
        unsigned b = t.s[i];
        for (uint32_t k = tok->added_start[b]; k < tok->added_start[b + 1]; k++) {
            const added_tok *a = &tok->added[k];
            if (a->special && !special) continue;
            if (a->len <= t.n - i && memcmp(tok->strings + a->off, t.s + i, a->len) == 0) {
                *at = i;
                return (ptrdiff_t)k;
            }
        }
    }
    return -1;
}

/* Whitespace (char::is_whitespace) before end / after start, for lstrip / rstrip. */
static size_t strip_left(span t, size_t from, size_t end)
{
    while (end > from) {
        size_t s = end - 1;
        while (s > from && (t.s[s] & 0xC0) == 0x80) s--;
        uint32_t c;
        khub__tok_cp_at(t, s, &c);
        if (!khub__uni_is_space(c)) break;
        end = s;
    }
    return end;
}

static size_t strip_right(span t, size_t start)
{
    return khub__tok_run_end(t, start, khub__uni_is_space);
}

/* Bytes t takes with each maximal invalid subpart as U+FFFD (3 bytes);
 * *first is the offset of the first invalid byte (t.n when none) and *bad
 * the number of replacements. */
static size_t lossy_size(span t, size_t *first, size_t *bad)
{
    size_t i = 0, out = 0;
    *first = t.n;
    *bad = 0;
    while (i < t.n) {
        uint32_t cp;
        size_t l = khub__utf8_decode(t.s + i, t.n - i, &cp);
        if (cp != KHUB__UNI_INVALID) {
            i += l, out += l;
            continue;
        }
        if (*first == t.n) *first = i;
        (*bad)++;
        i += khub__utf8_invalid_len(t.s + i, t.n - i);
        out += 3; /* at most 3x the input: no overflow below SIZE_MAX / 3 */
    }
    return out;
}

/* When t holds invalid UTF-8: *out (out_n bytes, caller frees with
 * khub__free) is t with U+FFFD in place of each invalid subpart; else *out
 * stays NULL. */
static khub_status replace_invalid(khub_runtime *rt, span t, unsigned char **out, size_t *out_n)
{
    *out = NULL;
    *out_n = 0;
    size_t first, bad;
    KHUB_RETURN_IF(rt, t.n > SIZE_MAX / 3, KHUB_STATUS_OVERFLOW, "tokenizer: text of %zu bytes",
                   t.n);
    size_t n = lossy_size(t, &first, &bad);
    if (!bad) return KHUB_STATUS_OK;
    unsigned char *p = khub__malloc(rt, n); /* n >= 3: one replacement at least */
    KHUB_RETURN_IF(rt, !p, KHUB_STATUS_NOMEM, "tokenizer: out of memory for %zu bytes", n);
    size_t i = 0, o = 0;
    while (i < t.n) {
        uint32_t cp;
        size_t l = khub__utf8_decode(t.s + i, t.n - i, &cp);
        if (cp != KHUB__UNI_INVALID) {
            memcpy(p + o, t.s + i, l);
            i += l, o += l;
            continue;
        }
        memcpy(p + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += khub__utf8_invalid_len(t.s + i, t.n - i);
    }
    khub__log(rt, KHUB_LOG_WARN,
              "tokenizer: the text is not valid UTF-8 at byte %zu; %zu invalid sequence%s "
              "replaced with U+FFFD",
              first, bad, bad == 1 ? "" : "s");
    *out = p;
    *out_n = n;
    return KHUB_STATUS_OK;
}

khub_status khub__tokenizer_encode(const khub_tokenizer *tok, const char *str, size_t len,
                                   uint32_t flags, int32_t **ids, size_t *n)
{
    khub_runtime *rt = tok ? tok->rt : NULL;
    KHUB_API_CHECK(rt, tok && ids && n && (str || len == 0));
    *ids = NULL;
    *n = 0;
    enc_state st = {.rt = rt};
    span t = {(const unsigned char *)str, len};
    unsigned char *clean = NULL;
    size_t clean_n = 0;
    khub_status s = replace_invalid(rt, t, &clean, &clean_n);
    if (s != KHUB_STATUS_OK) return s;
    if (clean) t = (span){clean, clean_n}, len = clean_n;
    bool bos = (flags & KHUB_TOK_ADD_BOS) || ((flags & KHUB_TOK_ADD_SPECIAL) && tok->add_bos);
    if (bos && tok->bos < 0) {
        s = khub__fail(rt, KHUB_STATUS_TOKENIZER,
                       "tokenizer: asked to add bos, but this "
                       "tokenizer has no bos token; drop KHUB_TOK_ADD_BOS");
        goto fail;
    }
    if (bos && (s = khub__tok_emit(&st, tok->bos)) != KHUB_STATUS_OK) goto fail;
    for (size_t pos = 0; pos < len && s == KHUB_STATUS_OK;) {
        size_t at = len;
        ptrdiff_t k = next_added(tok, t, pos, flags & KHUB_TOK_PARSE_SPECIAL, &at);
        size_t end = at, after = len;
        if (k >= 0) {
            const added_tok *a = &tok->added[k];
            if (a->lstrip) end = strip_left(t, pos, at);
            after = at + a->len;
            if (a->rstrip) after = strip_right(t, after);
        }
        span piece = {t.s + pos, end - pos};
        s = tok->spm ? khub__tok_spm_stretch(tok, &st, piece, pos == 0)
                     : encode_stretch(tok, &st, piece);
        if (s == KHUB_STATUS_OK && k >= 0) s = khub__tok_emit(&st, tok->added[k].id);
        pos = after;
    }
    if (s != KHUB_STATUS_OK) goto fail;
    khub__tok_spm_free(&st);
    khub__free(rt, clean, clean_n);
    khub__free(rt, st.syms, st.syms_cap * sizeof *st.syms);
    khub__free(rt, st.heap, st.heap_cap * sizeof *st.heap);
    khub__free(rt, st.buf, st.buf_cap);
    if (st.n == 0) {
        khub__free(rt, st.ids, st.cap * sizeof *st.ids);
        return KHUB_STATUS_OK;
    }
    if (st.cap != st.n) { /* exact size, so free_ids can give it back with n */
        int32_t *p = khub__realloc(rt, st.ids, st.cap * sizeof *st.ids, st.n * sizeof *st.ids);
        if (!p) { /* the buffers above are freed already: not the fail path */
            khub__free(rt, st.ids, st.cap * sizeof *st.ids);
            return khub__fail(rt, KHUB_STATUS_NOMEM, "tokenizer: out of memory for %zu ids", st.n);
        }
        st.ids = p;
    }
    *ids = st.ids;
    *n = st.n;
    return KHUB_STATUS_OK;
fail:
    khub__tok_spm_free(&st);
    khub__free(rt, clean, clean_n);
    khub__free(rt, st.ids, st.cap * sizeof *st.ids);
    khub__free(rt, st.syms, st.syms_cap * sizeof *st.syms);
    khub__free(rt, st.heap, st.heap_cap * sizeof *st.heap);
    khub__free(rt, st.buf, st.buf_cap);
    return s;
}

void khub__tokenizer_free_ids(const khub_tokenizer *tok, int32_t *ids, size_t n)
{
    if (tok && ids) khub__free(tok->rt, ids, n * sizeof *ids);
}
