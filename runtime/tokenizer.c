/*
 * tokenizer.c: byte-level BPE, as Hugging Face tokenizers runs it for the
 * GPT-2 family (SmolLM2, Llama-3, Qwen2).
 *
 * Encoding a text is four steps, each the same as tokenizers' own:
 *   1. split on added tokens (leftmost-longest, honouring lstrip/rstrip);
 *   2. pre-tokenize each stretch between them with the model's pattern
 *      (matched by hand below: no regex library, and the exact alternation
 *      order of each pattern is what decides the pieces);
 *   3. map each piece's bytes to their byte-level symbols;
 *   4. merge symbols by rank (a min-heap of candidate pairs ordered by rank,
 *      then position, with stale entries skipped on pop: tokenizers' Word::
 *      merge_all, so ties break the same way).
 *
 * Decoding maps byte-level symbols back to bytes; the streaming detokenizer
 * holds back the incomplete tail of a UTF-8 sequence between tokens.
 *
 * Everything loaded is hostile: ids are bounded and checked, lengths come
 * from the file and never index past it, and each refusal names the field.
 */
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

#define TOK_MAX_IDS       (1u << 24) /* refuse ids at or above this */
#define TOK_MAX_TOKEN_LEN (1u << 16) /* bytes of one token string */
#define TOK_MAX_FILE      (1u << 30) /* bytes of tokenizer.json */

typedef enum pre_kind {
    PRE_GPT2 = 0, /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    PRE_SMOLLM,   /* Digits(individual) then GPT-2's pattern on the stretches between */
    PRE_LLAMA3,   /* the Llama-3 pattern, \p{N}{1,3} */
    PRE_QWEN2     /* the Llama-3 pattern with single digits, \p{N} */
} pre_kind;

static const char *const pre_names[] = {"gpt2", "smollm", "llama3", "qwen2"};

/* The Split regexes of tokenizer.json files, exactly as Transformers writes them. */
static const char re_llama3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char re_qwen2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct tok_entry {
    uint32_t text_off, text_len;   /* vocab string in strings[] (byte-level form) */
    uint32_t bytes_off, bytes_len; /* what the token decodes to, in strings[] */
    uint8_t type;                  /* khub_token_type; KHUB_TOKEN_UNDEFINED = unused id */
    uint8_t in_vocab;              /* text is a BPE vocab string */
    uint8_t eog;                   /* ends generation */
} tok_entry;

typedef struct added_tok {
    int32_t id;
    uint32_t off, len; /* content in strings[] */
    bool special, lstrip, rstrip;
} added_tok;

typedef struct pair_slot {
    uint64_t key; /* (left + 1) << 32 | right; 0 = empty */
    int32_t rank;
    int32_t id; /* the merged token */
} pair_slot;

struct khub_tokenizer {
    khub_runtime *rt;
    pre_kind pre;
    bool ignore_merges;
    bool fuse_unk;

    tok_entry *entries; /* [n_entries], index = id */
    size_t n_entries;

    char *strings; /* every token's text and bytes */
    size_t strings_len, strings_cap;

    uint32_t *vocab_map; /* [vocab_cap] id + 1, 0 = empty; hashed on text */
    size_t vocab_cap;

    pair_slot *pairs; /* [pairs_cap] merges by (left, right) */
    size_t pairs_cap;

    added_tok *added; /* [n_added], sorted by first byte, then longest first */
    size_t n_added;
    uint32_t added_start[257]; /* added[added_start[b] .. added_start[b+1]) start with b */

    int32_t byte_id[256]; /* token of each single byte, -1 = none */
    int32_t unk, bos, eos, pad;
    bool add_bos;
    char *chat_template;
};

/* ------------------------------------------------------------------------ */
/* Byte-level mapping (GPT-2's bytes_to_unicode)                            */
/* ------------------------------------------------------------------------ */

/* Printable Latin-1 bytes stand for themselves; the 68 others (0x00-0x20,
 * 0x7F-0xA0, 0xAD) are shifted to U+0100..U+0143 in byte order. */
static uint32_t byte_to_cp(unsigned b)
{
    if (b <= 0x20) return 256 + b;
    if (b >= 0x7F && b <= 0xA0) return 256 + 33 + (b - 0x7F);
    if (b == 0xAD) return 256 + 67;
    return b;
}

/* The inverse; -1 for a code point no byte maps to. */
static int cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_to_cp(cp) == cp ? (int)cp : -1;
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

static khub_status put_string(khub_tokenizer *tok, const char *s, size_t n, uint32_t *off)
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
static int32_t vocab_lookup(const khub_tokenizer *tok, const char *s, size_t n)
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

static const pair_slot *pair_lookup(const khub_tokenizer *tok, int32_t left, int32_t right)
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

/* ------------------------------------------------------------------------ */
/* Building (shared by tokenizer.json and GGUF)                             */
/* ------------------------------------------------------------------------ */

static khub_status tok_new(khub_runtime *rt, size_t n_entries, size_t n_merges,
                           khub_tokenizer **out)
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
    khub__strfree(rt, tok->chat_template);
    khub__free(rt, tok, sizeof *tok);
}

/* Undoes the byte-level mapping of text into tok->strings; a string with a
 * character outside the mapping decodes to its own UTF-8, as tokenizers'
 * ByteLevel decoder does. */
static khub_status store_bytes(khub_tokenizer *tok, tok_entry *e)
{
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
    KHUB_FORWARD_IF_ERROR(tok->rt, put_string(tok, NULL, n, &off));
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
static khub_status set_vocab(khub_tokenizer *tok, int32_t id, const char *s, size_t n, uint8_t type,
                             bool dup_ok, const char *where)
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
    KHUB_FORWARD_IF_ERROR(rt, put_string(tok, s, n, &e->text_off));
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
static khub_status add_added(khub_tokenizer *tok, int32_t id, const char *s, size_t n, bool special,
                             bool lstrip, bool rstrip, const char *where)
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
    KHUB_FORWARD_IF_ERROR(rt, put_string(tok, s, n, &t->off));
    tok_entry *e = &tok->entries[id];
    if (e->type == KHUB_TOKEN_UNDEFINED) {
        e->text_off = t->off;
        e->text_len = t->len;
    }
    e->type = special ? KHUB_TOKEN_CONTROL : KHUB_TOKEN_USER_DEFINED;
    e->bytes_off = t->off;
    e->bytes_len = t->len;
    return KHUB_STATUS_OK;
}

/* Merge rank of "left right" (or the pair left, right). */
static khub_status add_merge(khub_tokenizer *tok, const char *l, size_t ln, const char *r,
                             size_t rn, int32_t rank, const char *where)
{
    khub_runtime *rt = tok->rt;
    int32_t li = vocab_lookup(tok, l, ln), ri = vocab_lookup(tok, r, rn);
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
    int32_t mi = vocab_lookup(tok, buf, ln + rn);
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
    static const char *const names[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",
                                        "<|end_of_text|>", "<|eom_id|>"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && memcmp(names[i], s, n) == 0) return true;
    return false;
}

/* Final indexes: byte tokens, added-token buckets, end-of-generation marks. */
static khub_status tok_finish(khub_tokenizer *tok)
{
    khub_runtime *rt = tok->rt;
    for (unsigned b = 0; b < 256; b++) {
        unsigned char u[4];
        size_t n = khub__utf8_encode(byte_to_cp(b), u);
        tok->byte_id[b] = vocab_lookup(tok, (const char *)u, n);
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
static int32_t find_any(const khub_tokenizer *tok, const char *s, size_t n)
{
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && memcmp(tok->strings + tok->added[i].off, s, n) == 0)
            return tok->added[i].id;
    return vocab_lookup(tok, s, n);
}

/* ------------------------------------------------------------------------ */
/* Pre-tokenizers                                                           */
/* ------------------------------------------------------------------------ */

typedef struct span {
    const unsigned char *s;
    size_t n;
} span;

static size_t cp_at(span t, size_t i, uint32_t *cp)
{
    return khub__utf8_decode(t.s + i, t.n - i, cp);
}

static bool is_other(uint32_t c)
{
    return !khub__uni_is_letter(c) && !khub__uni_is_number(c) && !khub__uni_is_space(c);
}

/* End of the run of code points from i for which cls holds. */
static size_t run_end(span t, size_t i, bool (*cls)(uint32_t))
{
    while (i < t.n) {
        uint32_t c;
        size_t l = cp_at(t, i, &c);
        if (!cls(c)) break;
        i += l;
    }
    return i;
}

static bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* Length of 's|'t|'re|'ve|'m|'ll|'d at i (case-insensitive with ci, where
 * U+017F LONG S folds to s as in Oniguruma's case folding), or 0. */
static size_t contraction(span t, size_t i, bool ci)
{
    if (t.s[i] != '\'' || i + 1 >= t.n) return 0;
    unsigned char a = t.s[i + 1];
    unsigned char al = ci ? (unsigned char)(a | 0x20) : a;
    if (ci && a == 0xC5 && i + 2 < t.n && t.s[i + 2] == 0xBF) return 3;
    if (al == 's' || al == 't' || al == 'm' || al == 'd') return 2;
    if (i + 2 >= t.n) return 0;
    unsigned char b = t.s[i + 2];
    unsigned char bl = ci ? (unsigned char)(b | 0x20) : b;
    if ((al == 'r' && bl == 'e') || (al == 'v' && bl == 'e') || (al == 'l' && bl == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at i, where i starts a whitespace run. */
static size_t match_spaces(span t, size_t i)
{
    size_t e = run_end(t, i, khub__uni_is_space);
    if (e == t.n) return e;
    size_t last = e - 1;
    while (last > i && (t.s[last] & 0xC0) == 0x80) last--; /* start of the last code point */
    return last > i ? last : e;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t match_gpt2(span t, size_t i)
{
    size_t l = contraction(t, i, false);
    if (l) return i + l;
    uint32_t c, c2 = KHUB__UNI_INVALID;
    size_t cl = cp_at(t, i, &c);
    bool sp = c == ' ' && i + 1 < t.n;
    if (sp) cp_at(t, i + 1, &c2);
    if (sp && khub__uni_is_letter(c2)) return run_end(t, i + 1, khub__uni_is_letter);
    if (khub__uni_is_letter(c)) return run_end(t, i + cl, khub__uni_is_letter);
    if (sp && khub__uni_is_number(c2)) return run_end(t, i + 1, khub__uni_is_number);
    if (khub__uni_is_number(c)) return run_end(t, i + cl, khub__uni_is_number);
    if (sp && is_other(c2)) return run_end(t, i + 1, is_other);
    if (is_other(c)) return run_end(t, i + cl, is_other);
    return match_spaces(t, i);
}

/* Llama-3 and Qwen2 (max_digits 3 and 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t match_llama3(span t, size_t i, int max_digits)
{
    size_t l = contraction(t, i, true);
    if (l) return i + l;
    uint32_t c, c2 = KHUB__UNI_INVALID;
    size_t cl = cp_at(t, i, &c);
    bool has2 = i + cl < t.n;
    if (has2) cp_at(t, i + cl, &c2);
    bool lead = !is_crlf(c) && !khub__uni_is_letter(c) && !khub__uni_is_number(c);
    if (lead && khub__uni_is_letter(c2)) return run_end(t, i + cl, khub__uni_is_letter);
    if (khub__uni_is_letter(c)) return run_end(t, i + cl, khub__uni_is_letter);
    if (khub__uni_is_number(c)) {
        size_t e = i + cl;
        for (int k = 1; k < max_digits && e < t.n; k++) {
            size_t dl = cp_at(t, e, &c2);
            if (!khub__uni_is_number(c2)) break;
            e += dl;
        }
        return e;
    }
    size_t start = c == ' ' && has2 && is_other(c2) ? i + 1 : i;
    uint32_t c0 = start == i ? c : c2;
    if (is_other(c0)) {
        size_t e = run_end(t, start, is_other);
        while (e < t.n && (t.s[e] == '\r' || t.s[e] == '\n')) e++;
        return e;
    }
    size_t e = run_end(t, i, khub__uni_is_space); /* c is whitespace here */
    for (size_t p = e; p > i; p--)
        if (t.s[p - 1] == '\r' || t.s[p - 1] == '\n') return p;
    return match_spaces(t, i);
}

static size_t match_piece(pre_kind pre, span t, size_t i)
{
    switch (pre) {
    case PRE_LLAMA3: return match_llama3(t, i, 3);
    case PRE_QWEN2: return match_llama3(t, i, 1);
    default: return match_gpt2(t, i);
    }
}

/* ------------------------------------------------------------------------ */
/* BPE                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct merge_cand {
    int32_t rank;
    uint32_t pos;
    int32_t id;
} merge_cand;

typedef struct sym {
    int32_t id;
    int32_t prev, next; /* -1 = none */
    uint32_t alive;
} sym;

/* Per-call buffers (encode stays reentrant on a shared tokenizer). */
typedef struct enc_state {
    khub_runtime *rt;
    int32_t *ids;
    size_t n, cap;
    sym *syms;
    size_t syms_cap;
    merge_cand *heap;
    size_t heap_n, heap_cap;
    char *buf; /* byte-level form of a piece, for ignore_merges */
    size_t buf_cap;
} enc_state;

static bool grow(khub_runtime *rt, void **p, size_t *cap, size_t need, size_t elem)
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

static khub_status emit(enc_state *st, int32_t id)
{
    if (!grow(st->rt, (void **)&st->ids, &st->cap, st->n + 1, sizeof *st->ids))
        return khub__fail(st->rt, KHUB_STATUS_NOMEM, "tokenizer: out of memory for %zu ids",
                          st->n + 1);
    st->ids[st->n++] = id;
    return KHUB_STATUS_OK;
}

static bool cand_less(const merge_cand *a, const merge_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(enc_state *st, merge_cand c)
{
    size_t i = st->heap_n++;
    st->heap[i] = c;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&st->heap[i], &st->heap[p])) break;
        merge_cand t = st->heap[p];
        st->heap[p] = st->heap[i];
        st->heap[i] = t;
        i = p;
    }
}

static merge_cand heap_pop(enc_state *st)
{
    merge_cand top = st->heap[0];
    st->heap[0] = st->heap[--st->heap_n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < st->heap_n && cand_less(&st->heap[l], &st->heap[m])) m = l;
        if (r < st->heap_n && cand_less(&st->heap[r], &st->heap[m])) m = r;
        if (m == i) break;
        merge_cand t = st->heap[m];
        st->heap[m] = st->heap[i];
        st->heap[i] = t;
        i = m;
    }
    return top;
}

static void push_pair(const khub_tokenizer *tok, enc_state *st, int32_t pos)
{
    int32_t next = st->syms[pos].next;
    if (next < 0) return;
    const pair_slot *p = pair_lookup(tok, st->syms[pos].id, st->syms[next].id);
    if (p) heap_push(st, (merge_cand){p->rank, (uint32_t)pos, p->id});
}

/* Whole-piece lookup for ignore_merges: the piece's byte-level form. */
static int32_t whole_piece(const khub_tokenizer *tok, enc_state *st, span p)
{
    size_t need;
    if (!khub__mul_ok(p.n, 2, &need) || !grow(st->rt, (void **)&st->buf, &st->buf_cap, need, 1))
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < p.n; i++)
        k += khub__utf8_encode(byte_to_cp(p.s[i]), (unsigned char *)st->buf + k);
    return vocab_lookup(tok, st->buf, k);
}

static khub_status bpe_piece(const khub_tokenizer *tok, enc_state *st, span p)
{
    khub_runtime *rt = st->rt;
    if (tok->ignore_merges) {
        int32_t id = whole_piece(tok, st, p);
        if (id >= 0) return emit(st, id);
    }
    size_t hcap;
    KHUB_RETURN_IF(rt,
                   !grow(rt, (void **)&st->syms, &st->syms_cap, p.n, sizeof *st->syms) ||
                       !khub__mul_ok(p.n, 3, &hcap) ||
                       !grow(rt, (void **)&st->heap, &st->heap_cap, hcap, sizeof *st->heap),
                   KHUB_STATUS_NOMEM, "tokenizer: out of memory for a %zu-byte piece", p.n);
    int32_t n = 0;
    for (size_t i = 0; i < p.n; i++) {
        int32_t id = tok->byte_id[p.s[i]];
        if (id < 0) {
            /* tokenizers drops a symbol missing from the vocab when there is
             * no unk token, and fuses consecutive unks with fuse_unk. */
            if (tok->unk < 0) continue;
            if (tok->fuse_unk && n > 0 && st->syms[n - 1].id == tok->unk) continue;
            id = tok->unk;
        }
        st->syms[n] = (sym){id, n - 1, -1, 1};
        if (n > 0) st->syms[n - 1].next = n;
        n++;
    }
    st->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(tok, st, i);
    while (st->heap_n) {
        merge_cand top = heap_pop(st);
        sym *s = &st->syms[top.pos];
        if (!s->alive || s->next < 0) continue;
        sym *r = &st->syms[s->next];
        const pair_slot *pp = pair_lookup(tok, s->id, r->id);
        if (!pp || pp->id != top.id) continue; /* a stale candidate */
        s->id = top.id;
        r->alive = 0;
        s->next = r->next;
        if (s->next >= 0) st->syms[s->next].prev = (int32_t)top.pos;
        if (s->prev >= 0) push_pair(tok, st, s->prev);
        push_pair(tok, st, (int32_t)top.pos);
    }
    for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = st->syms[i].next)
        KHUB_FORWARD_IF_ERROR(rt, emit(st, st->syms[i].id));
    return KHUB_STATUS_OK;
}

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
            size_t cl = cp_at(t, i, &c);
            if (khub__uni_is_number(c)) {
                KHUB_FORWARD_IF_ERROR(st->rt, bpe_piece(tok, st, (span){t.s + i, cl}));
                i += cl;
                continue;
            }
            size_t e = i;
            while (e < t.n) {
                size_t l = cp_at(t, e, &c);
                if (khub__uni_is_number(c)) break;
                e += l;
            }
            lim.n = e;
        }
        while (i < lim.n) {
            size_t e = match_piece(tok->pre, lim, i);
            KHUB_FORWARD_IF_ERROR(st->rt, bpe_piece(tok, st, (span){t.s + i, e - i}));
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
        cp_at(t, s, &c);
        if (!khub__uni_is_space(c)) break;
        end = s;
    }
    return end;
}

static size_t strip_right(span t, size_t start) { return run_end(t, start, khub__uni_is_space); }

khub_status khub__tokenizer_encode(const khub_tokenizer *tok, const char *str, size_t len,
                                   uint32_t flags, int32_t **ids, size_t *n)
{
    khub_runtime *rt = tok ? tok->rt : NULL;
    KHUB_API_CHECK(rt, tok && ids && n && (str || len == 0));
    *ids = NULL;
    *n = 0;
    enc_state st = {.rt = rt};
    khub_status s = KHUB_STATUS_OK;
    span t = {(const unsigned char *)str, len};
    bool bos = (flags & KHUB_TOK_ADD_BOS) || ((flags & KHUB_TOK_ADD_SPECIAL) && tok->add_bos);
    if (bos && tok->bos < 0) {
        s = khub__fail(rt, KHUB_STATUS_TOKENIZER,
                       "tokenizer: asked to add bos, but this "
                       "tokenizer has no bos token; drop KHUB_TOK_ADD_BOS");
        goto fail;
    }
    if (bos && (s = emit(&st, tok->bos)) != KHUB_STATUS_OK) goto fail;
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
        s = encode_stretch(tok, &st, (span){t.s + pos, end - pos});
        if (s == KHUB_STATUS_OK && k >= 0) s = emit(&st, tok->added[k].id);
        pos = after;
    }
    if (s != KHUB_STATUS_OK) goto fail;
    khub__free(rt, st.syms, st.syms_cap * sizeof *st.syms);
    khub__free(rt, st.heap, st.heap_cap * sizeof *st.heap);
    khub__free(rt, st.buf, st.buf_cap);
    if (st.n == 0) {
        khub__free(rt, st.ids, st.cap * sizeof *st.ids);
        return KHUB_STATUS_OK;
    }
    if (st.cap != st.n) { /* exact size, so free_ids can give it back with n */
        int32_t *p = khub__realloc(rt, st.ids, st.cap * sizeof *st.ids, st.n * sizeof *st.ids);
        if (!p) {
            s = khub__fail(rt, KHUB_STATUS_NOMEM, "tokenizer: out of memory for %zu ids", st.n);
            goto fail;
        }
        st.ids = p;
    }
    *ids = st.ids;
    *n = st.n;
    return KHUB_STATUS_OK;
fail:
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
    if (!grow(rt, (void **)&b->p, &b->cap, need, 1)) return false;
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
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        if ((st = khub__tokenizer_token_bytes(tok, ids[i], &p, &l)) != KHUB_STATUS_OK) goto fail;
        st = KHUB_STATUS_NOMEM;
        if (!skip_token(tok, ids[i], flags) && !dbuf_put(rt, &raw, p, l)) goto fail;
    }
    if (!dbuf_put(rt, &txt, "", 0)) goto fail;
    if (put_lossy(rt, &txt, (const unsigned char *)raw.p, raw.n, true) == SIZE_MAX) goto fail;
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
    dbuf raw;   /* held bytes + the new token's bytes */
    dbuf delta; /* text completed by the last call */
    dbuf all;   /* everything emitted since the last reset */
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
    khub__free(rt, d, sizeof *d);
}

void khub__detok_reset(khub_detok *d)
{
    if (!d) return;
    d->n_held = 0;
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
    const char *p;
    size_t l;
    KHUB_FORWARD_IF_ERROR(rt, khub__tokenizer_token_bytes(d->tok, id, &p, &l));
    if (skip_token(d->tok, id, d->flags)) l = 0;
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

/* ------------------------------------------------------------------------ */
/* Queries                                                                  */
/* ------------------------------------------------------------------------ */

size_t khub__tokenizer_n_vocab(const khub_tokenizer *tok) { return tok->n_entries; }
int32_t khub__tokenizer_bos(const khub_tokenizer *tok) { return tok->bos; }
int32_t khub__tokenizer_eos(const khub_tokenizer *tok) { return tok->eos; }
int32_t khub__tokenizer_pad(const khub_tokenizer *tok) { return tok->pad; }
const char *khub__tokenizer_chat_template(const khub_tokenizer *tok) { return tok->chat_template; }
const char *khub__tokenizer_pre_name(const khub_tokenizer *tok) { return pre_names[tok->pre]; }

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
    int32_t v = find_any(tok, s, len);
    if (v < 0) return KHUB_STATUS_NOT_FOUND;
    *id = v;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* tokenizer.json                                                           */
/* ------------------------------------------------------------------------ */

#define TJ "tokenizer.json: "

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
    KHUB_RETURN_IF(rt, byte_fallback, KHUB_STATUS_TOKENIZER,
                   TJ "model.byte_fallback is true; not supported for byte-level BPE");
    KHUB_FORWARD_IF_ERROR(
        rt, jbool(rt, model, "ignore_merges", false, &tok->ignore_merges, TJ "model."));
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
        KHUB_FORWARD_IF_ERROR(tok->rt, set_vocab(tok, id, v->string, strlen(v->string),
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
        int32_t id = (int32_t)jget(a, "id")->valuedouble; /* checked by count_ids */
        KHUB_FORWARD_IF_ERROR(rt,
                              add_added(tok, id, content->valuestring, strlen(content->valuestring),
                                        special, lstrip, rstrip, where));
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
        KHUB_FORWARD_IF_ERROR(rt, add_merge(tok, l, ln, r, rn, rank, TJ "model.merges"));
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
        int32_t id = find_any(tok, sp->valuestring, strlen(sp->valuestring));
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
    int32_t f = find_any(tok, v->valuestring, strlen(v->valuestring));
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

static khub_status check_top(khub_runtime *rt, const cJSON *root)
{
    KHUB_RETURN_IF(rt, !cJSON_IsObject(root), KHUB_STATUS_TOKENIZER,
                   TJ "not a JSON object; re-download the tokenizer");
    const cJSON *norm = jget(root, "normalizer");
    KHUB_RETURN_IF(rt, !jnull(norm), KHUB_STATUS_TOKENIZER,
                   TJ "normalizer \"%.40s\" is not supported (khub implements byte-level BPE "
                      "without a normalizer)",
                   cJSON_IsString(jget(norm, "type")) ? jget(norm, "type")->valuestring : "?");
    const cJSON *dec = jget(root, "decoder"), *dt = jget(dec, "type");
    KHUB_RETURN_IF(rt, !cJSON_IsString(dt) || strcmp(dt->valuestring, "ByteLevel") != 0,
                   KHUB_STATUS_TOKENIZER, TJ "decoder \"%.40s\" is not supported (only ByteLevel)",
                   cJSON_IsString(dt) ? dt->valuestring : "(missing)");
    const cJSON *added = jget(root, "added_tokens");
    KHUB_RETURN_IF(rt, !jnull(added) && !cJSON_IsArray(added), KHUB_STATUS_TOKENIZER,
                   TJ "added_tokens must be a list");
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
    KHUB_FORWARD_IF_ERROR(rt, detect_pre(rt, jget(root, "pre_tokenizer"), &pre));
    size_t n_ids = 0;
    KHUB_FORWARD_IF_ERROR(rt, count_ids(rt, vocab, cJSON_IsArray(added) ? added : NULL, &n_ids));
    KHUB_FORWARD_IF_ERROR(rt, tok_new(rt, n_ids, (size_t)cJSON_GetArraySize(merges), out));
    khub_tokenizer *tok = *out;
    tok->pre = pre;
    KHUB_FORWARD_IF_ERROR(rt, check_model(tok, model));
    KHUB_FORWARD_IF_ERROR(rt, load_vocab(tok, vocab));
    KHUB_FORWARD_IF_ERROR(rt, load_added(tok, cJSON_IsArray(added) ? added : NULL));
    KHUB_FORWARD_IF_ERROR(rt, load_merges(tok, merges));
    const cJSON *unk = jget(model, "unk_token");
    if (cJSON_IsString(unk)) {
        tok->unk = find_any(tok, unk->valuestring, strlen(unk->valuestring));
        KHUB_RETURN_IF(rt, tok->unk < 0, KHUB_STATUS_TOKENIZER,
                       TJ "model.unk_token \"%.60s\" is not in the vocab", unk->valuestring);
    }
    KHUB_FORWARD_IF_ERROR(rt, load_post(tok, jget(root, "post_processor")));
    if (cfg) KHUB_FORWARD_IF_ERROR(rt, load_config(tok, cfg, cfg_len));
    return tok_finish(tok);
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
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return khub__fail(rt, e == ENOENT ? KHUB_STATUS_NOT_FOUND : KHUB_STATUS_IO,
                          "tokenizer: cannot open %s: %s", path, strerror(e));
    }
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
        FILE *probe = fopen(cfg_path, "rb");
        if (probe) {
            fclose(probe);
            st = read_file(rt, cfg_path, &cfg, &cfg_len);
        }
    }
    if (st == KHUB_STATUS_OK) st = khub__tokenizer_from_json_mem(rt, json, len, cfg, cfg_len, out);
    khub__free(rt, json, len + 1);
    if (cfg) khub__free(rt, cfg, cfg_len + 1);
    return st;
}

/* ------------------------------------------------------------------------ */
/* GGUF metadata                                                            */
/* ------------------------------------------------------------------------ */

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
        KHUB_FORWARD_IF_ERROR(rt, set_vocab(tok, (int32_t)i, spec->tokens[i], n, KHUB_TOKEN_NORMAL,
                                            true, GG "tokenizer.ggml.tokens"));
        if (type == KHUB_TOKEN_CONTROL || type == KHUB_TOKEN_USER_DEFINED)
            KHUB_FORWARD_IF_ERROR(rt, add_added(tok, (int32_t)i, spec->tokens[i], n,
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
        KHUB_FORWARD_IF_ERROR(rt, add_merge(tok, m, (size_t)(sp - m), sp + 1, rn, (int32_t)i,
                                            GG "tokenizer.ggml.merges"));
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
    KHUB_RETURN_IF(rt, !spec->model || strcmp(spec->model, "gpt2") != 0, KHUB_STATUS_TOKENIZER,
                   GG "tokenizer.ggml.model \"%.40s\" is not supported (only gpt2, byte-level "
                      "BPE)",
                   spec->model ? spec->model : "(missing)");
    KHUB_RETURN_IF(rt, spec->n_tokens == 0 || spec->n_tokens >= TOK_MAX_IDS || !spec->tokens,
                   KHUB_STATUS_TOKENIZER,
                   GG "tokenizer.ggml.tokens has %zu entries (must be "
                      "1..%u)",
                   spec->n_tokens, TOK_MAX_IDS - 1);
    KHUB_RETURN_IF(rt, spec->n_merges >= INT32_MAX || (spec->n_merges && !spec->merges),
                   KHUB_STATUS_TOKENIZER, GG "tokenizer.ggml.merges is missing or too long");
    pre_kind pre = PRE_GPT2;
    bool ignore_merges = false;
    KHUB_FORWARD_IF_ERROR(rt, spec_pre(rt, spec->pre, &pre, &ignore_merges));
    KHUB_FORWARD_IF_ERROR(rt, spec_id(rt, spec->bos_id, spec->n_tokens, "bos_token_id"));
    KHUB_FORWARD_IF_ERROR(rt, spec_id(rt, spec->eos_id, spec->n_tokens, "eos_token_id"));
    KHUB_FORWARD_IF_ERROR(rt, spec_id(rt, spec->pad_id, spec->n_tokens, "padding_token_id"));
    KHUB_FORWARD_IF_ERROR(rt, tok_new(rt, spec->n_tokens, spec->n_merges, out));
    khub_tokenizer *tok = *out;
    tok->pre = pre;
    tok->ignore_merges = ignore_merges;
    KHUB_FORWARD_IF_ERROR(rt, spec_tokens(tok, spec));
    KHUB_FORWARD_IF_ERROR(rt, spec_merges(tok, spec));
    tok->bos = spec->bos_id;
    tok->eos = spec->eos_id;
    tok->pad = spec->pad_id;
    tok->add_bos = spec->add_bos == 1;
    if (spec->chat_template) {
        tok->chat_template = khub__strdup(rt, spec->chat_template);
        KHUB_RETURN_IF(rt, !tok->chat_template, KHUB_STATUS_NOMEM, "tokenizer: out of memory");
    }
    return tok_finish(tok);
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
