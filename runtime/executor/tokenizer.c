/*
 * tokenizer.c: the loaded tokenizer itself: GPT-2's byte-level mapping, the
 * storage (one string arena, the vocab hash, the merge hash), building it
 * (shared by the tokenizer.json and GGUF loaders) and the queries.
 *
 * The tokenizer runs byte-level BPE as Hugging Face tokenizers does for the
 * GPT-2 family (SmolLM2, Llama-3, Qwen2). Encoding a text is four steps,
 * each the same as tokenizers' own:
 *   1. split on added tokens (leftmost-longest, honouring lstrip/rstrip;
 *      tokenizer_encode.c);
 *   2. pre-tokenize each stretch between them with the model's pattern
 *      (tokenizer_pretok.c, matched by hand: no regex library, and the exact
 *      alternation order of each pattern is what decides the pieces);
 *   3. map each piece's bytes to their byte-level symbols (tokenizer_bpe.c);
 *   4. merge symbols by rank (tokenizer_bpe.c: a min-heap of candidate pairs
 *      ordered by rank, then position, with stale entries skipped on pop:
 *      tokenizers' Word::merge_all, so ties break the same way).
 *
 * Decoding (tokenizer_decode.c) maps byte-level symbols back to bytes; the
 * streaming detokenizer holds back the incomplete tail of a UTF-8 sequence
 * between tokens.
 *
 * Everything loaded (tokenizer_json.c, tokenizer_spec.c) is hostile: ids are
 * bounded and checked, lengths come from the file and never index past it,
 * and each refusal names the field.
 */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const pre_names[] = {"gpt2", "smollm", "llama3", "qwen2"};

/* ------------------------------------------------------------------------ */
/* Byte-level mapping (GPT-2's bytes_to_unicode)                            */
/* ------------------------------------------------------------------------ */

/* Printable Latin-1 bytes stand for themselves; the 68 others (0x00-0x20,
 * 0x7F-0xA0, 0xAD) are shifted to U+0100..U+0143 in byte order. */
uint32_t khub__tok_byte_to_cp(unsigned b)
{
    if (b <= 0x20) return 256 + b;
    if (b >= 0x7F && b <= 0xA0) return 256 + 33 + (b - 0x7F);
    if (b == 0xAD) return 256 + 67;
    return b;
}

/* The inverse; -1 for a code point no byte maps to. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 256) return khub__tok_byte_to_cp(cp) == cp ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 0x7F);
    return cp == 256 + 67 ? 0xAD : -1;
}

/* ------------------------------------------------------------------------ */
/* Storage: strings, the vocab hash, the merge hash                         */
/* ------------------------------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

khub_status khub__tok_put_string(khub_tokenizer *tok, const char *s, size_t n, uint32_t *off)
{
    khub_runtime *rt = tok->rt;
    size_t need;
    KHUB_RETURN_IF(rt, !khub__add_ok(tok->strings_len, n, &need) || need > UINT32_MAX,
                   KHUB_STATUS_OVERFLOW, "tokenizer: token strings exceed 4 GiB");
    if (need > tok->strings_cap) {
        size_t cap = tok->strings_cap ? tok->strings_cap : 1 << 16;
        while (cap < need) cap *= 2;
        char *p = khub__realloc(rt, tok->strings, tok->strings_cap, cap);
        KHUB_RETURN_IF(rt, !p, KHUB_STATUS_NOMEM,
                       "tokenizer: out of memory for %zu bytes of "
                       "token strings",
                       cap);
        tok->strings = p;
        tok->strings_cap = cap;
    }
    if (n && s) memcpy(tok->strings + tok->strings_len, s, n); /* s NULL: reserve only */
    *off = (uint32_t)tok->strings_len;
    tok->strings_len = need;
    return KHUB_STATUS_OK;
}

static const char *entry_text(const khub_tokenizer *tok, const tok_entry *e)
{
    return tok->strings + e->text_off;
}

/* Id of the vocab string s[0..n), -1 if absent. */
int32_t khub__tok_vocab_lookup(const khub_tokenizer *tok, const char *s, size_t n)
{
    if (!tok->vocab_cap) return -1;
    size_t mask = tok->vocab_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        uint32_t v = tok->vocab_map[i];
        if (!v) return -1;
        const tok_entry *e = &tok->entries[v - 1];
        if (e->text_len == n && memcmp(entry_text(tok, e), s, n) == 0) return (int32_t)(v - 1);
    }
}

/* Inserts id under its text; returns the id already there, or -1. With
 * replace, a duplicate takes over the slot (the last one wins, as a Python
 * dict built from the list would). */
static int32_t vocab_insert(khub_tokenizer *tok, int32_t id, bool replace)
{
    const tok_entry *e = &tok->entries[id];
    size_t mask = tok->vocab_cap - 1;
    for (size_t i = hash_bytes(entry_text(tok, e), e->text_len) & mask;; i = (i + 1) & mask) {
        uint32_t v = tok->vocab_map[i];
        if (!v) {
            tok->vocab_map[i] = (uint32_t)id + 1;
            return -1;
        }
        const tok_entry *o = &tok->entries[v - 1];
        if (o->text_len == e->text_len &&
            memcmp(entry_text(tok, o), entry_text(tok, e), e->text_len) == 0) {
            if (replace) tok->vocab_map[i] = (uint32_t)id + 1;
            return (int32_t)(v - 1);
        }
    }
}

const pair_slot *khub__tok_pair_lookup(const khub_tokenizer *tok, int32_t left, int32_t right)
{
    if (!tok->pairs_cap) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)(left + 1) << 32) | (uint32_t)right;
    size_t mask = tok->pairs_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        const pair_slot *p = &tok->pairs[i];
        if (p->key == key) return p;
        if (!p->key) return NULL;
    }
}

/* A later duplicate overwrites an earlier one, as tokenizers' HashMap does. */
static void pair_insert(khub_tokenizer *tok, int32_t left, int32_t right, int32_t rank, int32_t id)
{
    uint64_t key = ((uint64_t)(uint32_t)(left + 1) << 32) | (uint32_t)right;
    size_t mask = tok->pairs_cap - 1;
    for (size_t i = hash_u64(key) & mask;; i = (i + 1) & mask) {
        pair_slot *p = &tok->pairs[i];
        if (!p->key || p->key == key) {
            *p = (pair_slot){key, rank, id};
            return;
        }
    }
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

bool khub__tok_grow(khub_runtime *rt, void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    size_t bytes, old;
    if (!khub__mul_ok(c, elem, &bytes) || !khub__mul_ok(*cap, elem, &old)) return false;
    void *q = khub__realloc(rt, *p, old, bytes);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Building (shared by tokenizer.json and GGUF)                             */
/* ------------------------------------------------------------------------ */

khub_status khub__tok_new(khub_runtime *rt, size_t n_entries, size_t n_merges, khub_tokenizer **out)
{
    khub_tokenizer *tok = khub__calloc(rt, 1, sizeof *tok);
    KHUB_RETURN_IF(rt, !tok, KHUB_STATUS_NOMEM, "tokenizer: out of memory");
    tok->rt = rt;
    tok->unk = tok->bos = tok->eos = tok->pad = -1;
    *out = tok;
    tok->n_entries = n_entries;
    tok->entries = khub__calloc(rt, n_entries ? n_entries : 1, sizeof *tok->entries);
    tok->vocab_cap = pow2_at_least(n_entries * 2);
    tok->vocab_map = khub__calloc(rt, tok->vocab_cap, sizeof *tok->vocab_map);
    tok->pairs_cap = pow2_at_least(n_merges * 2);
    tok->pairs = khub__calloc(rt, tok->pairs_cap, sizeof *tok->pairs);
    KHUB_RETURN_IF(rt, !tok->entries || !tok->vocab_map || !tok->pairs, KHUB_STATUS_NOMEM,
                   "tokenizer: out of memory for %zu tokens and %zu merges", n_entries, n_merges);
    return KHUB_STATUS_OK;
}

void khub__tokenizer_free(khub_tokenizer *tok)
{
    if (!tok) return;
    khub_runtime *rt = tok->rt;
    khub__free(rt, tok->entries, (tok->n_entries ? tok->n_entries : 1) * sizeof *tok->entries);
    khub__free(rt, tok->strings, tok->strings_cap);
    khub__free(rt, tok->vocab_map, tok->vocab_cap * sizeof *tok->vocab_map);
    khub__free(rt, tok->pairs, tok->pairs_cap * sizeof *tok->pairs);
    khub__free(rt, tok->added, tok->n_added * sizeof *tok->added);
    if (tok->scores) khub__free(rt, tok->scores, tok->n_entries * sizeof *tok->scores);
    if (tok->uni_scores) khub__free(rt, tok->uni_scores, tok->n_entries * sizeof *tok->uni_scores);
    khub__free(rt, tok->uni_prefix, tok->uni_prefix_cap * sizeof *tok->uni_prefix);
    khub__strfree(rt, tok->chat_template);
    khub__free(rt, tok, sizeof *tok);
}

/* Undoes the byte-level mapping of text into tok->strings; a string with a
 * character outside the mapping decodes to its own UTF-8, as tokenizers'
 * ByteLevel decoder does. */
static khub_status store_bytes(khub_tokenizer *tok, tok_entry *e)
{
    if (tok->spm) return khub__tok_spm_store_bytes(tok, e);
    const unsigned char *s = (const unsigned char *)entry_text(tok, e);
    size_t n = 0;
    for (size_t i = 0; i < e->text_len; n++) {
        uint32_t cp;
        i += khub__utf8_decode(s + i, e->text_len - i, &cp);
        if (cp == KHUB__UNI_INVALID || cp_to_byte(cp) < 0) { /* not byte-level: raw text */
            e->bytes_off = e->text_off;
            e->bytes_len = e->text_len;
            return KHUB_STATUS_OK;
        }
    }
    /* Reserve n bytes, then write them (the arena may move: re-read s). */
    uint32_t off;
    KHUB_FORWARD_IF_ERROR(tok->rt, khub__tok_put_string(tok, NULL, n, &off));
    s = (const unsigned char *)entry_text(tok, e);
    unsigned char *out = (unsigned char *)tok->strings + off;
    for (size_t i = 0, k = 0; i < e->text_len; k++) {
        uint32_t cp;
        i += khub__utf8_decode(s + i, e->text_len - i, &cp);
        out[k] = (unsigned char)cp_to_byte(cp);
    }
    e->bytes_off = off;
    e->bytes_len = (uint32_t)n;
    return KHUB_STATUS_OK;
}

/* Sets vocab entry id to text s[0..n). where names the field for messages. */
khub_status khub__tok_set_vocab(khub_tokenizer *tok, int32_t id, const char *s, size_t n,
                                uint8_t type, bool dup_ok, const char *where)
{
    khub_runtime *rt = tok->rt;
    KHUB_RETURN_IF(rt, id < 0 || (size_t)id >= tok->n_entries, KHUB_STATUS_TOKENIZER,
                   "%s: id %ld is outside 0..%zu; the vocab is inconsistent", where, (long)id,
                   tok->n_entries - 1);
    KHUB_RETURN_IF(rt, n == 0 || n > TOK_MAX_TOKEN_LEN, KHUB_STATUS_TOKENIZER,
                   "%s: token %ld has length %zu (must be 1..%u bytes)", where, (long)id, n,
                   TOK_MAX_TOKEN_LEN);
    tok_entry *e = &tok->entries[id];
    KHUB_RETURN_IF(rt, e->type != KHUB_TOKEN_UNDEFINED, KHUB_STATUS_TOKENIZER,
                   "%s: id %ld is given to two tokens; remove the duplicate", where, (long)id);
    KHUB_FORWARD_IF_ERROR(rt, khub__tok_put_string(tok, s, n, &e->text_off));
    e->text_len = (uint32_t)n;
    e->type = type;
    e->in_vocab = 1;
    KHUB_FORWARD_IF_ERROR(rt, store_bytes(tok, e));
    int32_t other = vocab_insert(tok, id, dup_ok);
    KHUB_RETURN_IF(rt, other >= 0 && !dup_ok, KHUB_STATUS_TOKENIZER,
                   "%s: token \"%.*s\" appears twice (ids %ld and %ld); remove the duplicate",
                   where, (int)(n > 64 ? 64 : n), s, (long)other, (long)id);
    return KHUB_STATUS_OK;
}

/* Registers an added token (matched whole in the input before BPE). */
khub_status khub__tok_add_added(khub_tokenizer *tok, int32_t id, const char *s, size_t n,
                                bool special, bool lstrip, bool rstrip, const char *where)
{
    khub_runtime *rt = tok->rt;
    KHUB_RETURN_IF(rt, id < 0 || (size_t)id >= tok->n_entries, KHUB_STATUS_TOKENIZER,
                   "%s: id %ld is outside 0..%zu", where, (long)id, tok->n_entries - 1);
    KHUB_RETURN_IF(rt, n == 0 || n > TOK_MAX_TOKEN_LEN, KHUB_STATUS_TOKENIZER,
                   "%s: content of token %ld has length %zu (must be 1..%u bytes)", where, (long)id,
                   n, TOK_MAX_TOKEN_LEN);
    for (size_t i = 0; i < tok->n_added; i++)
        KHUB_RETURN_IF(rt, tok->added[i].id == id, KHUB_STATUS_TOKENIZER,
                       "%s: id %ld is listed twice; remove the duplicate", where, (long)id);
    size_t old = tok->n_added * sizeof *tok->added;
    added_tok *a = khub__realloc(rt, tok->added, old, old + sizeof *a);
    KHUB_RETURN_IF(rt, !a, KHUB_STATUS_NOMEM, "tokenizer: out of memory for added tokens");
    tok->added = a;
    added_tok *t = &a[tok->n_added++];
    *t = (added_tok){id, 0, (uint32_t)n, special, lstrip, rstrip};
    KHUB_FORWARD_IF_ERROR(rt, khub__tok_put_string(tok, s, n, &t->off));
    tok_entry *e = &tok->entries[id];
    if (e->type == KHUB_TOKEN_UNDEFINED) {
        e->text_off = t->off;
        e->text_len = t->len;
    }
    e->type = special ? KHUB_TOKEN_CONTROL : KHUB_TOKEN_USER_DEFINED;
    e->bytes_off = t->off;
    e->bytes_len = t->len;
    /* an spm decoder's Replace/ByteFallback (or Metaspace) runs on added tokens too */
    if (tok->spm) return khub__tok_spm_store_bytes(tok, e);
    return KHUB_STATUS_OK;
}

/* Merge rank of "left right" (or the pair left, right). */
khub_status khub__tok_add_merge(khub_tokenizer *tok, const char *l, size_t ln, const char *r,
                                size_t rn, int32_t rank, const char *where)
{
    khub_runtime *rt = tok->rt;
    int32_t li = khub__tok_vocab_lookup(tok, l, ln), ri = khub__tok_vocab_lookup(tok, r, rn);
    size_t bad_len = li < 0 ? ln : rn;
    KHUB_RETURN_IF(rt, li < 0 || ri < 0, KHUB_STATUS_TOKENIZER,
                   "%s[%ld]: \"%.*s\" is not in the vocab; the merges do not belong to this "
                   "vocab",
                   where, (long)rank, (int)(bad_len > 64 ? 64 : bad_len), li < 0 ? l : r);
    char small[512];
    char *buf = ln + rn <= sizeof small ? small : khub__malloc(rt, ln + rn);
    KHUB_RETURN_IF(rt, !buf, KHUB_STATUS_NOMEM, "tokenizer: out of memory");
    memcpy(buf, l, ln);
    memcpy(buf + ln, r, rn);
    int32_t mi = khub__tok_vocab_lookup(tok, buf, ln + rn);
    if (buf != small) khub__free(rt, buf, ln + rn);
    KHUB_RETURN_IF(rt, mi < 0, KHUB_STATUS_TOKENIZER,
                   "%s[%ld]: the merge of \"%.*s\" and \"%.*s\" is not in the vocab; the merges "
                   "do not belong to this vocab",
                   where, (long)rank, (int)(ln > 64 ? 64 : ln), l, (int)(rn > 64 ? 64 : rn), r);
    pair_insert(tok, li, ri, rank, mi);
    return KHUB_STATUS_OK;
}

static int cmp_added(const void *pa, const void *pb, void *ud)
{
    const khub_tokenizer *tok = ud;
    const added_tok *a = pa, *b = pb;
    unsigned char fa = (unsigned char)tok->strings[a->off];
    unsigned char fb = (unsigned char)tok->strings[b->off];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static bool name_is_eog(const char *s, size_t n)
{
    static const char *const names[] = {"<|im_end|>",      "<|endoftext|>", "<|eot_id|>",
                                        "<|end_of_text|>", "<|eom_id|>",    "<end_of_turn>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return true;
    return false;
}

/* Final indexes: byte tokens, added-token buckets, end-of-generation marks. */
khub_status khub__tok_finish(khub_tokenizer *tok)
{
    khub_runtime *rt = tok->rt;
    for (unsigned b = 0; b < 256; b++) {
        char u[8];
        size_t n;
        if (tok->spm) /* SentencePiece's byte pieces are "<0x0A>", upper-case hex */
            n = (size_t)snprintf(u, sizeof u, "<0x%02X>", b);
        else
            n = khub__utf8_encode(khub__tok_byte_to_cp(b), (unsigned char *)u);
        tok->byte_id[b] = khub__tok_vocab_lookup(tok, u, n);
    }
    if (tok->n_added) qsort_r(tok->added, tok->n_added, sizeof *tok->added, cmp_added, tok);
    size_t j = 0;
    for (unsigned b = 0; b < 257; b++) {
        while (j < tok->n_added && (unsigned char)tok->strings[tok->added[j].off] < b) j++;
        tok->added_start[b] = (uint32_t)j;
    }
    tok->added_start[256] = (uint32_t)tok->n_added;
    for (size_t i = 0; i < tok->n_entries; i++) {
        tok_entry *e = &tok->entries[i];
        if (e->type != KHUB_TOKEN_UNDEFINED && e->type != KHUB_TOKEN_NORMAL &&
            name_is_eog(tok->strings + e->bytes_off, e->bytes_len))
            e->eog = 1;
    }
    if (tok->eos >= 0) tok->entries[tok->eos].eog = 1;
    KHUB_RETURN_IF(rt, tok->add_bos && tok->bos < 0, KHUB_STATUS_TOKENIZER,
                   "tokenizer: add_bos is set but no bos token is defined");
    return KHUB_STATUS_OK;
}

/* Id of a token by its text (added content or vocab string). */
int32_t khub__tok_find_any(const khub_tokenizer *tok, const char *s, size_t n)
{
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && memcmp(tok->strings + tok->added[i].off, s, n) == 0)
            return tok->added[i].id;
    return khub__tok_vocab_lookup(tok, s, n);
}

/* ------------------------------------------------------------------------ */
/* Queries                                                                  */
/* ------------------------------------------------------------------------ */

size_t khub__tokenizer_n_vocab(const khub_tokenizer *tok) { return tok->n_entries; }
int32_t khub__tokenizer_bos(const khub_tokenizer *tok) { return tok->bos; }
int32_t khub__tokenizer_eos(const khub_tokenizer *tok) { return tok->eos; }
const char *khub__tokenizer_chat_template(const khub_tokenizer *tok) { return tok->chat_template; }
const char *khub__tokenizer_pre_name(const khub_tokenizer *tok)
{
    return tok->spm ? "spm" : pre_names[tok->pre];
}

bool khub__tokenizer_is_special(const khub_tokenizer *tok, int32_t id)
{
    return id >= 0 && (size_t)id < tok->n_entries && tok->entries[id].type == KHUB_TOKEN_CONTROL;
}

bool khub__tokenizer_is_eog(const khub_tokenizer *tok, int32_t id)
{
    return id >= 0 && (size_t)id < tok->n_entries && tok->entries[id].eog;
}

khub_status khub__tokenizer_find(const khub_tokenizer *tok, const char *s, size_t len, int32_t *id)
{
    int32_t v = khub__tok_find_any(tok, s, len);
    if (v < 0) return KHUB_STATUS_NOT_FOUND;
    *id = v;
    return KHUB_STATUS_OK;
}
