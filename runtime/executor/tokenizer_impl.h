/*
 * tokenizer_impl.h: what the runtime/tokenizer*.c files share and no other
 * file sees: the loaded tokenizer's layout, encode's per-call state, and the
 * helpers one tokenizer file calls in another. Everyone else includes
 * tokenizer.h.
 *
 *   tokenizer.c          byte-level mapping, storage (strings, vocab and
 *                        merge hashes), building a tokenizer, queries
 *   tokenizer_json.c     loading tokenizer.json (+ tokenizer_config.json)
 *   tokenizer_spec.c     building from a khub_tokenizer_spec (GGUF's form)
 *   tokenizer_gguf.c     filling that spec from an open GGUF
 *   tokenizer_pretok.c   the pre-tokenizer split patterns
 *   tokenizer_bpe.c      the BPE merge loop over one piece
 *   tokenizer_spm.c      SentencePiece BPE (GGUF "llama"): merges by score,
 *                        "\u2581" for spaces, byte fallback
 *   tokenizer_encode.c   encode: added tokens, then pre-tokenizer and BPE
 *   tokenizer_decode.c   decode and the streaming detokenizer
 *
 * Internal to libkhub (not API; see abi/khub/ for what is).
 */
#ifndef KHUB_RUNTIME_TOKENIZER_IMPL_H
#define KHUB_RUNTIME_TOKENIZER_IMPL_H

#include "tokenizer.h"
#include "unicode.h"

/* ------------------------------------------------------------------------ */
/* The loaded tokenizer                                                     */
/* ------------------------------------------------------------------------ */

#define TOK_MAX_IDS       (1u << 24) /* refuse ids at or above this */
#define TOK_MAX_TOKEN_LEN (1u << 16) /* bytes of one token string */

typedef enum pre_kind {
    PRE_GPT2 = 0, /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    PRE_SMOLLM,   /* Digits(individual) then GPT-2's pattern on the stretches between */
    PRE_LLAMA3,   /* the Llama-3 pattern, \p{N}{1,3} */
    PRE_QWEN2     /* the Llama-3 pattern with single digits, \p{N} */
} pre_kind;

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
    bool spm;              /* SentencePiece BPE (tokenizer_spm.c) instead of byte-level */
    bool add_space_prefix; /* spm: a space is put before the text (and stripped on decode) */
    float *scores;         /* spm: [n_entries] merge priority, higher merges first */
    bool spm_merges;       /* spm from tokenizer.json: a pair merges only when it is in
                              model.merges, lowest rank first (pairs), not by score */

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
/* Byte-level mapping and storage (tokenizer.c)                             */
/* ------------------------------------------------------------------------ */

/* The code point byte b stands for in GPT-2's bytes_to_unicode. */
KHUB_INTERNAL uint32_t khub__tok_byte_to_cp(unsigned b);
/* Id of the vocab string s[0..n), -1 if absent. */
KHUB_INTERNAL int32_t khub__tok_vocab_lookup(const khub_tokenizer *tok, const char *s, size_t n);
/* The merge of the pair (left, right), NULL if there is none. */
KHUB_INTERNAL const pair_slot *khub__tok_pair_lookup(const khub_tokenizer *tok, int32_t left,
                                                     int32_t right);
/* Grows *p, an array of *cap elements of elem bytes, to hold at least need
 * (doubling *cap, or 64); false on overflow or OOM, with *p and *cap unchanged. */
KHUB_INTERNAL bool khub__tok_grow(khub_runtime *rt, void **p, size_t *cap, size_t need,
                                  size_t elem);

/* ------------------------------------------------------------------------ */
/* Building (tokenizer.c; called by tokenizer_json.c and tokenizer_spec.c)  */
/* ------------------------------------------------------------------------ */

/* A tokenizer of n_entries ids, none set yet, with room for n_merges merges.
 * *out is set as soon as the struct exists, so on failure the caller frees
 * it with khub__tokenizer_free. */
KHUB_INTERNAL khub_status khub__tok_new(khub_runtime *rt, size_t n_entries, size_t n_merges,
                                        khub_tokenizer **out);
/* Sets vocab entry id to text s[0..n) of the given type. With dup_ok a text
 * seen before takes over its hash slot (the last wins); without, it is
 * refused. where names the field for messages. */
KHUB_INTERNAL khub_status khub__tok_set_vocab(khub_tokenizer *tok, int32_t id, const char *s,
                                              size_t n, uint8_t type, bool dup_ok,
                                              const char *where);
/* Registers an added token (matched whole in the input before BPE). */
KHUB_INTERNAL khub_status khub__tok_add_added(khub_tokenizer *tok, int32_t id, const char *s,
                                              size_t n, bool special, bool lstrip, bool rstrip,
                                              const char *where);
/* Gives the merge of l[0..ln) and r[0..rn) rank; all three strings must be
 * in the vocab. where names the merges field for messages. */
KHUB_INTERNAL khub_status khub__tok_add_merge(khub_tokenizer *tok, const char *l, size_t ln,
                                              const char *r, size_t rn, int32_t rank,
                                              const char *where);
/* Final indexes: byte tokens, added-token buckets, end-of-generation marks.
 * Call once, after the vocab, added tokens, merges and bos/eos are set. */
KHUB_INTERNAL khub_status khub__tok_finish(khub_tokenizer *tok);
/* Id of a token by its text (added content or vocab string), -1 if none. */
KHUB_INTERNAL int32_t khub__tok_find_any(const khub_tokenizer *tok, const char *s, size_t n);

/* ------------------------------------------------------------------------ */
/* Pre-tokenizers (tokenizer_pretok.c)                                      */
/* ------------------------------------------------------------------------ */

typedef struct span {
    const unsigned char *s;
    size_t n;
} span;

/* Decodes the code point at t.s[i] (i < t.n) into *cp; returns its length. */
static inline size_t khub__tok_cp_at(span t, size_t i, uint32_t *cp)
{
    return khub__utf8_decode(t.s + i, t.n - i, cp);
}

/* End of the run of code points from i for which cls holds. */
KHUB_INTERNAL size_t khub__tok_run_end(span t, size_t i, bool (*cls)(uint32_t));
/* End of the piece that pre's split pattern matches at i (i < t.n). */
KHUB_INTERNAL size_t khub__tok_match_piece(pre_kind pre, span t, size_t i);

/* ------------------------------------------------------------------------ */
/* BPE (tokenizer_bpe.c)                                                    */
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
    char *buf; /* byte-level form of a piece, for ignore_merges; spm: the escaped text */
    size_t buf_cap;
    struct spm_sym *ssyms; /* spm: one per character of the stretch */
    size_t ssyms_cap;
    struct spm_bigram *bheap; /* spm: candidate merges, best score first */
    size_t bheap_n, bheap_cap;
} enc_state;

/* Appends id to st->ids. */
KHUB_INTERNAL khub_status khub__tok_emit(enc_state *st, int32_t id);
/* Encodes one pre-tokenized piece's bytes by merging their byte symbols by
 * rank, appending the resulting ids to st. */
KHUB_INTERNAL khub_status khub__tok_bpe_piece(const khub_tokenizer *tok, enc_state *st, span p);

/* ------------------------------------------------------------------------ */
/* SentencePiece BPE (tokenizer_spm.c)                                      */
/* ------------------------------------------------------------------------ */

/* Encodes one stretch of text between added tokens the SentencePiece way:
 * spaces become "\u2581" (with a leading one when first and the tokenizer
 * says add_space_prefix), characters merge by score, what is left outside
 * the vocab falls back to <0xXX> byte tokens. */
KHUB_INTERNAL khub_status khub__tok_spm_stretch(const khub_tokenizer *tok, enc_state *st, span t,
                                                bool first);
/* Frees what the spm encoder added to st. */
KHUB_INTERNAL void khub__tok_spm_free(enc_state *st);
/* What an spm vocab entry decodes to: "\u2581" as a space, "<0xXX>" of a BYTE
 * token as that byte. Sets e's bytes_off/bytes_len (in tok->strings). */
KHUB_INTERNAL khub_status khub__tok_spm_store_bytes(khub_tokenizer *tok, tok_entry *e);
/* Appends s[0..n) to tok's string arena; *off receives its offset (s NULL:
 * reserve only). */
KHUB_INTERNAL khub_status khub__tok_put_string(khub_tokenizer *tok, const char *s, size_t n,
                                               uint32_t *off);

#endif /* KHUB_RUNTIME_TOKENIZER_IMPL_H */
