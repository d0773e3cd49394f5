/*
 * tokenizer_impl.h: what the runtime/tokenizer*.c files share and no other
 * file sees: the loaded tokenizer's layout, encode's per-call state, and the
 * helpers one tokenizer file calls in another. Everyone else includes
 * tokenizer.h.
 *
 *   tokenizer.c          byte-level mapping, storage (strings, vocab and
 *                        merge hashes), building a tokenizer, queries
 *   tokenizer_json.c     loading tokenizer.json (+ tokenizer_config.json)
 *   tokenizer_json_spm.c which SentencePiece-style pipeline a tokenizer.json has
 *   tokenizer_spec.c     building from a khub_tokenizer_spec (GGUF's form)
 *   tokenizer_gguf.c     filling that spec from an open GGUF
 *   tokenizer_pretok.c   the pre-tokenizer split patterns
 *   tokenizer_bpe.c      the BPE merge loop over one piece
 *   tokenizer_unigram.c  the Unigram model of a tokenizer.json (Viterbi)
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

/* Where an spm tokenizer puts a "\u2581" before a stretch of text (the text
 * between added tokens), as the file says. */
typedef enum spm_prefix_kind {
    SPM_PREFIX_NONE = 0,   /* Gemma; Metaspace prepend_scheme "never" */
    SPM_PREFIX_START,      /* GGUF add_space_prefix: before the stretch at offset 0 */
    SPM_PREFIX_EACH,       /* normalizer Prepend: before every non-empty stretch */
    SPM_PREFIX_META_FIRST, /* Metaspace "first": before the stretch at offset 0 unless
                              it starts with " " or "\u2581" */
    SPM_PREFIX_META_ALWAYS /* Metaspace "always": before every stretch, same exception */
} spm_prefix_kind;

/* What an spm tokenizer's decoder drops at the start of the text. */
typedef enum spm_strip_kind {
    SPM_STRIP_NONE = 0,
    SPM_STRIP_SPACE,      /* one leading space of the whole text (decoder Strip after
                             Fuse; GGUF add_space_prefix) */
    SPM_STRIP_FIRST_TOKEN /* every "\u2581" of the first token decoded (decoder Metaspace,
                             prepend_scheme not "never") */
} spm_strip_kind;

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
    bool spm;           /* SentencePiece BPE (tokenizer_spm.c) instead of byte-level */
    uint8_t spm_prefix; /* spm_prefix_kind: where a "\u2581" goes before a stretch */
    uint8_t spm_strip;  /* spm_strip_kind: what decoding drops at the start */
    bool spm_split;     /* Metaspace split: merges never cross into a "\u2581" */
    bool spm_raw_bytes; /* decoder without ByteFallback: "<0xXX>" decodes as its text */
    bool unigram;       /* spm with a Unigram model (tokenizer_unigram.c), not BPE */
    bool uni_byte_fallback;
    double *uni_scores;   /* unigram: [n_entries] piece scores, as the file has them */
    double uni_unk_score; /* unigram: min score - 10 */
    uint64_t *uni_prefix; /* unigram: [uni_prefix_cap] hashes of piece prefixes */
    size_t uni_prefix_cap;
    float *scores;   /* spm: [n_entries] merge priority, higher merges first */
    bool spm_merges; /* spm from tokenizer.json: a pair merges only when it is in
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

/* One end position of a Unigram lattice (tokenizer_unigram.c). */
typedef struct uni_node {
    double score;  /* best path score ending here */
    int32_t start; /* where that path's last piece starts; -1 = not reached */
    int32_t id;    /* that piece, or the unk id */
    int32_t path;  /* scratch: the k-th end position of the path, read backwards */
} uni_node;

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
    uni_node *unodes; /* unigram: one per byte of the piece, + 1 */
    size_t unodes_cap;
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

/* ------------------------------------------------------------------------ */
/* SentencePiece-style tokenizer.json shapes (tokenizer_json_spm.c)         */
/* ------------------------------------------------------------------------ */

typedef struct spm_shape {
    bool spm;       /* a SentencePiece-style pipeline (else byte-level) */
    uint8_t prefix; /* spm_prefix_kind */
    uint8_t strip;  /* spm_strip_kind */
    bool split;     /* Metaspace split */
    bool raw_bytes; /* decoder without ByteFallback */
} spm_shape;

struct cJSON;
/* Reads root's normalizer, pre_tokenizer and decoder into *sh; a shape khub
 * does not run exactly as tokenizers does is TOKENIZER, naming the field. */
KHUB_INTERNAL khub_status khub__tok_json_spm_shape(khub_runtime *rt, const struct cJSON *root,
                                                   spm_shape *sh);

/* ------------------------------------------------------------------------ */
/* Unigram (tokenizer_unigram.c)                                            */
/* ------------------------------------------------------------------------ */

/* Checks a Unigram model.vocab (a list of [piece, score]) and counts it. */
KHUB_INTERNAL khub_status khub__tok_unigram_count(khub_runtime *rt, const struct cJSON *vocab,
                                                  size_t *n_pieces);
/* Loads model.vocab (ids = positions), the scores, unk_id and the prefix
 * set into tok (spm already set; n_entries covers the vocab). */
KHUB_INTERNAL khub_status khub__tok_unigram_load(khub_tokenizer *tok, const struct cJSON *model);
/* Segments st->buf[off..off+n) (escaped text) and emits its ids. */
KHUB_INTERNAL khub_status khub__tok_unigram_piece(const khub_tokenizer *tok, enc_state *st,
                                                  size_t off, size_t n);

#endif /* KHUB_RUNTIME_TOKENIZER_IMPL_H */
