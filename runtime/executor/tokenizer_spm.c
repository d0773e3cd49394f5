/*
 * tokenizer_spm.c: SentencePiece BPE, the tokenizer GGUF files mark
 * tokenizer.ggml.model = "llama" (Llama 2, Mistral 7B v0.1, TinyLlama,
 * Gemma). It runs as llama.cpp's llm_tokenizer_spm does, which is also what
 * Transformers' converted tokenizer (BPE with merges ranked by the same
 * scores, byte_fallback) computes when the scores are distinct:
 *   1. every space becomes "\u2581" (U+2581), and one is put in front of the
 *      stretch as the file says (spm_prefix_kind: GGUF add_space_prefix before
 *      the first stretch; a tokenizer.json Prepend before each, Metaspace's
 *      "first" / "always" unless the stretch starts with a space); a
 *      Metaspace with split then cuts the text before every "\u2581" and
 *      merges each piece on its own;
 *   2. the text is split into UTF-8 characters, a linked list of symbols;
 *   3. each neighbouring pair whose concatenation is a vocab token is a
 *      candidate with that token's score (from a tokenizer.json: each pair
 *      model.merges lists, with minus its rank as the score); the best (highest score, then the
 *      leftmost) is merged, its new neighbours become candidates, and stale
 *      candidates (a side already merged into something else) are skipped;
 *   4. each remaining symbol is its token, or (a character the vocab lacks)
 *      one <0xXX> byte token per UTF-8 byte, or unk when there are none.
 * Added tokens (CONTROL, USER_DEFINED) were split out before, in
 * tokenizer_encode.c, on the raw text.
 *
 * Decoding: "\u2581" is a space, a BYTE token is its byte, and the streaming
 * detokenizer reassembles multi-byte characters across byte tokens as it does
 * for byte-level BPE (tokenizer_decode.c).
 */
#include "tokenizer_impl.h"

#include <string.h>

#define SPACE_MARK   "\xE2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */
#define SPACE_MARK_N 3

typedef struct spm_sym {
    uint32_t off, n;    /* bytes of the escaped text; n = 0 once merged away */
    int32_t prev, next; /* -1 = none */
} spm_sym;

typedef struct spm_bigram {
    float score;
    int32_t left, right;
    uint32_t n; /* bytes of the merged text, to spot stale candidates */
} spm_bigram;

/* ------------------------------------------------------------------------ */
/* Loading: what a piece decodes to                                         */
/* ------------------------------------------------------------------------ */

/* The byte of a "<0xXX>" piece, -1 when s is not one. */
static int byte_piece(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

khub_status khub__tok_spm_store_bytes(khub_tokenizer *tok, tok_entry *e)
{
    const char *s = tok->strings + e->text_off;
    int b = tok->spm_raw_bytes ? -1 : byte_piece(s, e->text_len);
    size_t marks = 0;
    for (size_t i = 0; i + SPACE_MARK_N <= e->text_len; i++)
        if (memcmp(s + i, SPACE_MARK, SPACE_MARK_N) == 0) marks++, i += SPACE_MARK_N - 1;
    if (b < 0 && marks == 0) { /* decodes to its own text */
        e->bytes_off = e->text_off;
        e->bytes_len = e->text_len;
        return KHUB_STATUS_OK;
    }
    size_t n = b >= 0 ? 1 : e->text_len - 2 * marks;
    uint32_t off;
    KHUB_FORWARD_IF_ERROR(tok->rt, khub__tok_put_string(tok, NULL, n, &off));
    s = tok->strings + e->text_off; /* the arena may have moved */
    char *out = tok->strings + off;
    if (b >= 0) {
        out[0] = (char)b;
    } else {
        size_t k = 0;
        for (size_t i = 0; i < e->text_len; i++) {
            if (i + SPACE_MARK_N <= e->text_len && memcmp(s + i, SPACE_MARK, SPACE_MARK_N) == 0) {
                out[k++] = ' ';
                i += SPACE_MARK_N - 1;
            } else {
                out[k++] = s[i];
            }
        }
    }
    e->bytes_off = off;
    e->bytes_len = (uint32_t)n;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* The candidate heap: best score first, then the leftmost                  */
/* ------------------------------------------------------------------------ */

static bool better(const spm_bigram *a, const spm_bigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static khub_status heap_push(enc_state *st, spm_bigram c)
{
    if (!khub__tok_grow(st->rt, (void **)&st->bheap, &st->bheap_cap, st->bheap_n + 1,
                        sizeof *st->bheap))
        return khub__fail(st->rt, KHUB_STATUS_NOMEM, "tokenizer: out of memory for merges");
    size_t i = st->bheap_n++;
    st->bheap[i] = c;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!better(&st->bheap[i], &st->bheap[p])) break;
        spm_bigram t = st->bheap[p];
        st->bheap[p] = st->bheap[i];
        st->bheap[i] = t;
        i = p;
    }
    return KHUB_STATUS_OK;
}

static spm_bigram heap_pop(enc_state *st)
{
    spm_bigram top = st->bheap[0];
    st->bheap[0] = st->bheap[--st->bheap_n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < st->bheap_n && better(&st->bheap[l], &st->bheap[m])) m = l;
        if (r < st->bheap_n && better(&st->bheap[r], &st->bheap[m])) m = r;
        if (m == i) break;
        spm_bigram t = st->bheap[m];
        st->bheap[m] = st->bheap[i];
        st->bheap[i] = t;
        i = m;
    }
    return top;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

/* Pushes the pair (left, right) when their concatenation is a token. The
 * symbols are adjacent in the text, so the concatenation is a slice. */
static khub_status try_pair(const khub_tokenizer *tok, enc_state *st, int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return KHUB_STATUS_OK;
    const spm_sym *l = &st->ssyms[left], *r = &st->ssyms[right];
    uint32_t n = l->n + r->n;
    if (tok->spm_merges) { /* tokenizer.json: only listed merges, by rank */
        int32_t a = khub__tok_vocab_lookup(tok, st->buf + l->off, l->n);
        int32_t b = khub__tok_vocab_lookup(tok, st->buf + r->off, r->n);
        const pair_slot *p = a >= 0 && b >= 0 ? khub__tok_pair_lookup(tok, a, b) : NULL;
        if (!p) return KHUB_STATUS_OK;
        return heap_push(st, (spm_bigram){-(float)p->rank, left, right, n});
    }
    int32_t id = khub__tok_vocab_lookup(tok, st->buf + l->off, n);
    if (id < 0) return KHUB_STATUS_OK;
    return heap_push(st, (spm_bigram){tok->scores[id], left, right, n});
}

/* Emits one final symbol: its token, else its bytes as byte tokens. */
static khub_status emit_sym(const khub_tokenizer *tok, enc_state *st, const spm_sym *s)
{
    int32_t id = khub__tok_vocab_lookup(tok, st->buf + s->off, s->n);
    if (id >= 0) return khub__tok_emit(st, id);
    for (uint32_t i = 0; i < s->n; i++) {
        int32_t b = tok->byte_id[(unsigned char)st->buf[s->off + i]];
        if (b < 0) { /* no byte pieces: one unk for the character, or nothing */
            if (tok->unk >= 0) KHUB_FORWARD_IF_ERROR(st->rt, khub__tok_emit(st, tok->unk));
            return KHUB_STATUS_OK;
        }
        KHUB_FORWARD_IF_ERROR(st->rt, khub__tok_emit(st, b));
    }
    return KHUB_STATUS_OK;
}

/* Whether a "\u2581" goes before the stretch t (non-empty; first: it starts
 * at offset 0 of the text). Metaspace checks after it replaced the spaces,
 * so a stretch starting with " " or a literal "\u2581" gets none. */
static bool wants_prefix(const khub_tokenizer *tok, span t, bool first)
{
    bool marked =
        t.s[0] == ' ' || (t.n >= SPACE_MARK_N && memcmp(t.s, SPACE_MARK, SPACE_MARK_N) == 0);
    switch ((spm_prefix_kind)tok->spm_prefix) {
    case SPM_PREFIX_START: return first;
    case SPM_PREFIX_EACH: return true;
    case SPM_PREFIX_META_FIRST: return first && !marked;
    case SPM_PREFIX_META_ALWAYS: return !marked;
    case SPM_PREFIX_NONE: break;
    }
    return false;
}

/* st->buf[0..*n) = t with spaces escaped (and the prefix when asked). */
static khub_status escape(const khub_tokenizer *tok, enc_state *st, span t, bool first, size_t *n)
{
    size_t spaces = 0, need;
    for (size_t i = 0; i < t.n; i++) spaces += t.s[i] == ' ';
    bool prefix = wants_prefix(tok, t, first);
    if (!khub__add_ok(t.n, 2 * spaces + (prefix ? SPACE_MARK_N : 0), &need) ||
        !khub__tok_grow(st->rt, (void **)&st->buf, &st->buf_cap, need ? need : 1, 1))
        return khub__fail(st->rt, KHUB_STATUS_NOMEM, "tokenizer: out of memory for %zu bytes", t.n);
    size_t k = 0;
    if (prefix) memcpy(st->buf, SPACE_MARK, SPACE_MARK_N), k = SPACE_MARK_N;
    for (size_t i = 0; i < t.n; i++) {
        if (t.s[i] == ' ') {
            memcpy(st->buf + k, SPACE_MARK, SPACE_MARK_N);
            k += SPACE_MARK_N;
        } else {
            st->buf[k++] = (char)t.s[i];
        }
    }
    *n = k;
    return KHUB_STATUS_OK;
}

/* Merges the characters of st->buf[off..off+n) and emits the tokens. */
static khub_status merge_piece(const khub_tokenizer *tok, enc_state *st, size_t off, size_t n)
{
    khub_runtime *rt = st->rt;
    /* The text is valid UTF-8 here (tokenizer_encode.c replaced what was not). */
    int32_t count = 0;
    for (size_t i = off; i < off + n;) {
        uint32_t cp;
        size_t l = khub__utf8_decode((const unsigned char *)st->buf + i, off + n - i, &cp);
        st->ssyms[count] = (spm_sym){(uint32_t)i, (uint32_t)l, count - 1, -1};
        if (count > 0) st->ssyms[count - 1].next = count;
        count++;
        i += l;
    }
    st->bheap_n = 0;
    for (int32_t i = 1; i < count; i++) KHUB_FORWARD_IF_ERROR(rt, try_pair(tok, st, i - 1, i));
    while (st->bheap_n) {
        spm_bigram b = heap_pop(st);
        spm_sym *l = &st->ssyms[b.left], *r = &st->ssyms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.n) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) st->ssyms[r->next].prev = b.left;
        KHUB_FORWARD_IF_ERROR(rt, try_pair(tok, st, l->prev, b.left));
        KHUB_FORWARD_IF_ERROR(rt, try_pair(tok, st, b.left, l->next));
    }
    for (int32_t i = 0; i >= 0; i = st->ssyms[i].next)
        KHUB_FORWARD_IF_ERROR(rt, emit_sym(tok, st, &st->ssyms[i]));
    return KHUB_STATUS_OK;
}

/* One piece of the escaped text through the model: BPE merges or Unigram. */
static khub_status piece(const khub_tokenizer *tok, enc_state *st, size_t off, size_t n)
{
    return tok->unigram ? khub__tok_unigram_piece(tok, st, off, n) : merge_piece(tok, st, off, n);
}

khub_status khub__tok_spm_stretch(const khub_tokenizer *tok, enc_state *st, span t, bool first)
{
    khub_runtime *rt = st->rt;
    if (t.n == 0) return KHUB_STATUS_OK;
    size_t n = 0;
    KHUB_FORWARD_IF_ERROR(rt, escape(tok, st, t, first, &n));
    if (n == 0) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt,
                   n > INT32_MAX || !khub__tok_grow(rt, (void **)&st->ssyms, &st->ssyms_cap, n,
                                                    sizeof *st->ssyms),
                   KHUB_STATUS_NOMEM, "tokenizer: out of memory for a %zu-byte text", n);
    if (!tok->spm_split) return piece(tok, st, 0, n);
    /* Metaspace split: a piece starts at every "\u2581" (MergedWithNext) */
    size_t start = 0;
    for (size_t i = 1; i + SPACE_MARK_N <= n; i++) {
        if (memcmp(st->buf + i, SPACE_MARK, SPACE_MARK_N) != 0) continue;
        KHUB_FORWARD_IF_ERROR(rt, piece(tok, st, start, i - start));
        start = i;
        i += SPACE_MARK_N - 1;
    }
    return piece(tok, st, start, n - start);
}

void khub__tok_spm_free(enc_state *st)
{
    khub__free(st->rt, st->ssyms, st->ssyms_cap * sizeof *st->ssyms);
    khub__free(st->rt, st->bheap, st->bheap_cap * sizeof *st->bheap);
    khub__free(st->rt, st->unodes, st->unodes_cap * sizeof *st->unodes);
    st->ssyms = NULL;
    st->bheap = NULL;
    st->unodes = NULL;
    st->ssyms_cap = st->bheap_cap = st->bheap_n = st->unodes_cap = 0;
}
