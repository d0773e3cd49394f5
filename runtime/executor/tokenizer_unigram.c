/*
 * tokenizer_unigram.c: the Unigram model of a tokenizer.json (model.type
 * "Unigram": vocab of [piece, score] pairs, unk_id, byte_fallback), as the
 * tokenizers library's Unigram::encode_optimized segments a piece of text
 * (SentencePiece's unigram_model.cc, Viterbi):
 *
 *   best[0] = 0; for each character start s, in order, and each vocab piece
 *   p that the text at s starts with: best[s + |p|] takes best[s] +
 *   score(p) when nothing reached that end before or the sum is strictly
 *   greater (so on a tie the earliest start wins); when no piece is exactly
 *   the one character at s, the character alone reaches s + its length with
 *   best[s] + min(score) - 10 as unk. The path is read back from the end;
 *   neighbouring unk characters fuse into one string. Each string of the
 *   path is then its vocab id, or (byte_fallback) its UTF-8 bytes as
 *   <0xXX> pieces when all of them exist, or unk_id.
 *
 * Scores are doubles, summed in the library's order, so ties and near-ties
 * come out the same. Pieces that the text starts with are found through a
 * set of 64-bit hashes of every prefix of every piece (FNV-1a, extended one
 * byte at a time): extension stops at the first prefix that no piece has, and
 * a hash that says "whole piece" is confirmed by the exact vocab lookup, so
 * a hash collision costs a lookup, never a wrong token.
 */
#include "tokenizer_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define TJ          "tokenizer.json: "
#define UNK_PENALTY 10.0 /* tokenizers' K_UNK_PENALTY */
/* bytes of all pieces together: the prefix set takes at most 32 bytes per
 * byte (a power of two >= twice the bytes, 8 bytes a slot): 256 MiB at this
 * cap for a hostile file; XLM-R's 250k pieces are about 2 MB */
#define MAX_VOCAB_BYTES (8u << 20)
#define FNV_BASIS       14695981039346656037ull
#define FNV_PRIME       1099511628211ull

/* ------------------------------------------------------------------------ */
/* The prefix set                                                           */
/* ------------------------------------------------------------------------ */

static uint64_t fnv_step(uint64_t h, unsigned char b) { return (h ^ b) * FNV_PRIME; }

/* Slot of key h (never 0: keys are stored with the low bit forced). */
static uint64_t *prefix_slot(uint64_t *set, size_t cap, uint64_t key)
{
    size_t mask = cap - 1;
    for (size_t i = (size_t)(key ^ (key >> 29)) & mask;; i = (i + 1) & mask)
        if (set[i] == 0 || (set[i] & ~(uint64_t)2) == key) return &set[i];
}

/* key: the hash with bit 0 set; bit 1 of a stored key marks a whole piece. */
static uint64_t key_of(uint64_t h) { return (h | 1) & ~(uint64_t)2; }

static void prefix_add(khub_tokenizer *tok, const char *s, size_t n)
{
    uint64_t h = FNV_BASIS;
    for (size_t i = 0; i < n; i++) {
        h = fnv_step(h, (unsigned char)s[i]);
        uint64_t k = key_of(h), *slot = prefix_slot(tok->uni_prefix, tok->uni_prefix_cap, k);
        *slot = (*slot ? *slot : k) | (i + 1 == n ? 2 : 0);
    }
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                  */
/* ------------------------------------------------------------------------ */

khub_status khub__tok_unigram_count(khub_runtime *rt, const cJSON *vocab, size_t *n_pieces)
{
    KHUB_RETURN_IF(rt, !cJSON_IsArray(vocab) || !vocab->child, KHUB_STATUS_TOKENIZER,
                   TJ "model.vocab of a Unigram model is missing, empty or not a list");
    size_t n = 0, bytes = 0;
    for (const cJSON *v = vocab->child; v; v = v->next, n++) {
        const cJSON *p = cJSON_GetArrayItem(v, 0), *sc = cJSON_GetArrayItem(v, 1);
        KHUB_RETURN_IF(rt,
                       cJSON_GetArraySize(v) != 2 || !cJSON_IsString(p) || !cJSON_IsNumber(sc) ||
                           !isfinite(sc->valuedouble),
                       KHUB_STATUS_TOKENIZER,
                       TJ "model.vocab[%zu] is not [\"piece\", finite score]", n);
        bytes += strlen(p->valuestring);
        KHUB_RETURN_IF(rt, n >= TOK_MAX_IDS || bytes > MAX_VOCAB_BYTES, KHUB_STATUS_TOKENIZER,
                       TJ "model.vocab is over %u pieces or %u bytes", TOK_MAX_IDS,
                       MAX_VOCAB_BYTES);
    }
    *n_pieces = n;
    return KHUB_STATUS_OK;
}

khub_status khub__tok_unigram_load(khub_tokenizer *tok, const cJSON *model)
{
    khub_runtime *rt = tok->rt;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_id");
    size_t n = (size_t)cJSON_GetArraySize(vocab), bytes = 0;
    KHUB_RETURN_IF(rt,
                   !cJSON_IsNumber(unk) || !(unk->valuedouble >= 0) ||
                       unk->valuedouble >= (double)n || unk->valuedouble != floor(unk->valuedouble),
                   KHUB_STATUS_TOKENIZER,
                   TJ "model.unk_id is missing or not an index of model.vocab (%zu pieces); khub "
                      "needs the unk piece of a Unigram model",
                   n);
    tok->uni_scores = khub__calloc(rt, tok->n_entries, sizeof *tok->uni_scores);
    KHUB_RETURN_IF(rt, !tok->uni_scores, KHUB_STATUS_NOMEM,
                   "tokenizer: out of memory for %zu scores", n);
    double min = INFINITY;
    size_t id = 0;
    for (const cJSON *v = vocab->child; v; v = v->next, id++) {
        const char *p = v->child->valuestring;
        size_t len = strlen(p);
        /* duplicates: the last id wins, as the library's map does */
        KHUB_FORWARD_IF_ERROR(rt, khub__tok_set_vocab(tok, (int32_t)id, p, len, KHUB_TOKEN_NORMAL,
                                                      true, TJ "model.vocab"));
        tok->uni_scores[id] = v->child->next->valuedouble;
        min = tok->uni_scores[id] < min ? tok->uni_scores[id] : min;
        bytes += len;
    }
    tok->unk = (int32_t)unk->valuedouble;
    tok->uni_unk_score = min - UNK_PENALTY;
    size_t cap = 64;
    while (cap < 2 * bytes) cap *= 2; /* bytes <= 8 MiB: no overflow */
    tok->uni_prefix = khub__calloc(rt, cap, sizeof *tok->uni_prefix);
    KHUB_RETURN_IF(rt, !tok->uni_prefix, KHUB_STATUS_NOMEM,
                   "tokenizer: out of memory for the prefixes of %zu pieces", n);
    tok->uni_prefix_cap = cap;
    for (const cJSON *v = vocab->child; v; v = v->next)
        prefix_add(tok, v->child->valuestring, strlen(v->child->valuestring));
    tok->unigram = true;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static void reach(uni_node *to, double score, int32_t start, int32_t id)
{
    if (to->start < 0 || score > to->score) *to = (uni_node){score, start, id, 0};
}

/* Emits the string s[0..n) of the path: its piece, its bytes, or unk. */
static khub_status emit_string(const khub_tokenizer *tok, enc_state *st, const char *s, size_t n)
{
    int32_t id = khub__tok_vocab_lookup(tok, s, n);
    if (id >= 0) return khub__tok_emit(st, id);
    bool bytes = tok->uni_byte_fallback;
    for (size_t i = 0; bytes && i < n; i++) bytes = tok->byte_id[(unsigned char)s[i]] >= 0;
    if (!bytes) return khub__tok_emit(st, tok->unk);
    for (size_t i = 0; i < n; i++)
        KHUB_FORWARD_IF_ERROR(st->rt, khub__tok_emit(st, tok->byte_id[(unsigned char)s[i]]));
    return KHUB_STATUS_OK;
}

khub_status khub__tok_unigram_piece(const khub_tokenizer *tok, enc_state *st, size_t off, size_t n)
{
    khub_runtime *rt = st->rt;
    const char *s = st->buf + off;
    KHUB_RETURN_IF(rt,
                   n >= INT32_MAX || !khub__tok_grow(rt, (void **)&st->unodes, &st->unodes_cap,
                                                     n + 1, sizeof *st->unodes),
                   KHUB_STATUS_NOMEM, "tokenizer: out of memory for a %zu-byte text", n);
    uni_node *node = st->unodes;
    for (size_t i = 0; i <= n; i++) node[i] = (uni_node){0, -1, -1, 0};
    node[0].start = 0;
    for (size_t b = 0; b < n;) {
        uint32_t cp;
        size_t mblen = khub__utf8_decode((const unsigned char *)s + b, n - b, &cp);
        bool single = false;
        uint64_t h = FNV_BASIS;
        for (size_t e = b; e < n; e++) {
            h = fnv_step(h, (unsigned char)s[e]);
            uint64_t k = key_of(h), v = *prefix_slot(tok->uni_prefix, tok->uni_prefix_cap, k);
            if (!v) break; /* no piece starts with s[b..e] */
            if (!(v & 2)) continue;
            int32_t id = khub__tok_vocab_lookup(tok, s + b, e + 1 - b);
            if (id < 0) continue; /* a hash collision */
            reach(&node[e + 1], tok->uni_scores[id] + node[b].score, (int32_t)b, id);
            single |= e + 1 - b == mblen;
        }
        if (!single)
            reach(&node[b + mblen], tok->uni_unk_score + node[b].score, (int32_t)b, tok->unk);
        b += mblen;
    }
    /* the path's end positions, last first */
    size_t k = 0;
    for (int32_t e = (int32_t)n; e > 0; e = node[e].start) node[k++].path = e;
    /* forward: pieces, with neighbouring unk characters fused */
    int32_t from = 0;
    while (k > 0) {
        int32_t e = node[--k].path;
        if (node[e].id == tok->unk) /* the library fuses every unk node, even "<unk>" itself */
            while (k > 0 && node[node[k - 1].path].id == tok->unk) e = node[--k].path;
        KHUB_FORWARD_IF_ERROR(rt, emit_string(tok, st, s + from, (size_t)(e - from)));
        from = e;
    }
    return KHUB_STATUS_OK;
}
