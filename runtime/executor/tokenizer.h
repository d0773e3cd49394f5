/*
 * tokenizer.h: byte-level BPE tokenizers (GPT-2 family: SmolLM2, Llama-3,
 * Qwen2), loaded from a Hugging Face tokenizer.json or from GGUF metadata,
 * and SentencePiece BPE tokenizers from GGUF metadata (tokenizer.ggml.model
 * "llama": Llama 2, Mistral v0.1, TinyLlama, Gemma; tokenizer_spm.c) or from
 * a tokenizer.json (byte-fallback BPE, merges by rank; or a Unigram model,
 * tokenizer_unigram.c) of the shapes Transformers writes for them: Gemma's
 * Replace " " -> "\u2581" normalizer,
 * the legacy Llama Sequence [Prepend "\u2581", Replace], or a Metaspace
 * pre-tokenizer (prepend_scheme first/always/never, split), with the decoders
 * Replace + ByteFallback + Fuse (+ Strip) or Metaspace (tokenizer_json_spm.c),
 * with a streaming detokenizer that never emits a split UTF-8 sequence.
 *
 *     khub_tokenizer *tok = NULL;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__tokenizer_from_json(rt, "dir/tokenizer.json", &tok));
 *     int32_t *ids = NULL;
 *     size_t n = 0;
 *     khub__tokenizer_encode(tok, prompt, strlen(prompt), KHUB_TOK_PARSE_SPECIAL, &ids, &n);
 *     khub_detok *d = NULL;
 *     khub__detok_new(tok, 0, &d);
 *     for each generated id: khub__detok_push(d, id, &txt, &len); write(txt, len)
 *     khub__detok_flush(d, &txt, &len); khub__detok_free(d);
 *     khub__tokenizer_free_ids(tok, ids, n);
 *     khub__tokenizer_free(tok);
 *
 * What is matched: Transformers' (tokenizers') output, id for id, for the
 * pre-tokenizers khub recognises (GPT-2's, Llama-3's and SmolLM2's, Qwen2's),
 * and, for SentencePiece GGUFs, Transformers' reading of the same file
 * (checked on Gemma 3 270M: test_gemma), and for the SentencePiece-style
 * tokenizer.json shapes the tokenizers library's output (test_gemma_tiny,
 * test_tokenizer_spm); an unknown pre-tokenizer or model type is refused
 * with KHUB_STATUS_TOKENIZER naming it, never approximated.
 *
 * Errors: every loader failure is KHUB_STATUS_TOKENIZER (or NOMEM / IO /
 * NOT_FOUND for the file) with a one-line message on rt naming the field,
 * e.g. "tokenizer.json: model.merges[17]: \"x\" is not in the vocab; the
 * merges do not belong to this vocab". Input files are treated as hostile.
 * Not implemented (refused by name): normalizers other than Replace " " ->
 * "\u2581" and Sequence [Prepend "\u2581", Replace] (Qwen2's tokenizer.json
 * has NFC; its GGUF form, which has none, loads), ByteLevel's
 * add_prefix_space, single_word added tokens, normalized added tokens beside
 * a Prepend normalizer, BPE dropout, Metaspace replacements other than
 * "\u2581", and Unigram models without an unk_id (the library fails only on
 * a text with an unknown character; khub refuses the file).
 *
 * Threading: a loaded tokenizer is immutable; encode, decode and the queries
 * may run concurrently on one tokenizer. A khub_detok belongs to one thread.
 *
 * Internal to libkhub (not API; see abi/khub/ for what is).
 */
#ifndef KHUB_RUNTIME_TOKENIZER_H
#define KHUB_RUNTIME_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

typedef struct khub_tokenizer khub_tokenizer;
typedef struct khub_detok khub_detok;

/* Token kinds; the values are GGUF's tokenizer.ggml.token_type values. */
typedef enum khub_token_type {
    KHUB_TOKEN_UNDEFINED = 0,
    KHUB_TOKEN_NORMAL = 1, /* an ordinary vocab entry (byte-level string) */
    KHUB_TOKEN_UNKNOWN = 2,
    KHUB_TOKEN_CONTROL = 3,      /* special: <|im_start|>, <|endoftext|>, ... */
    KHUB_TOKEN_USER_DEFINED = 4, /* added token that is not special */
    KHUB_TOKEN_UNUSED = 5,
    KHUB_TOKEN_BYTE = 6
} khub_token_type;

/* The tokenizer as GGUF metadata describes it. All pointers are borrowed for
 * the duration of khub__tokenizer_from_vocab only (everything is copied). */
typedef struct khub_tokenizer_spec {
    const char *model;         /* tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama"
                                  (SentencePiece BPE: scores, byte fallback, "\u2581") */
    const char *pre;           /* tokenizer.ggml.pre: "smollm", "gpt2", "llama-bpe",
                                  "qwen2", ...; NULL = "default" (GPT-2's) */
    const char *const *tokens; /* [n_tokens] tokenizer.ggml.tokens, id = index */
    const size_t *token_lens;  /* [n_tokens] byte lengths, NULL = NUL-terminated */
    size_t n_tokens;
    const int32_t *token_types; /* [n_tokens] khub_token_type, NULL = all NORMAL */
    const char *const *merges;  /* [n_merges] "left right", rank = index */
    const size_t *merge_lens;   /* [n_merges] byte lengths, NULL = NUL-terminated */
    size_t n_merges;
    int32_t bos_id, eos_id, pad_id; /* -1 = none */
    int32_t add_bos;                /* 1 = encode adds bos with KHUB_TOK_ADD_SPECIAL */
    const char *chat_template;      /* tokenizer.chat_template, NULL = none */
    const float *scores;            /* [n_tokens] tokenizer.ggml.scores; "llama" needs them */
    int32_t unk_id;                 /* tokenizer.ggml.unknown_token_id, -1 = none */
    int32_t add_space_prefix;       /* "llama": 1 = a leading space is added to the text
                                       (SentencePiece's default), 0 = not (Gemma) */
} khub_tokenizer_spec;

/* A spec with every id -1 and every pointer NULL. */
#define KHUB_TOKENIZER_SPEC_INIT \
    { \
        NULL, NULL, NULL, NULL, 0, NULL, NULL, NULL, 0, -1, -1, -1, 0, NULL, NULL, -1, 1 \
    }

/* Loads a Hugging Face tokenizer.json (model.type "BPE", byte-level) at path,
 * plus tokenizer_config.json from the same directory when present (for
 * chat_template, bos/eos/pad token strings and add_bos_token). On failure
 * *out is NULL and the message is on rt. Free with khub__tokenizer_free. */
KHUB_INTERNAL khub_status khub__tokenizer_from_json(khub_runtime *rt, const char *path,
                                                    khub_tokenizer **out);
/* The same from an in-memory tokenizer.json (len bytes, need not be NUL-
 * terminated) and an optional tokenizer_config.json (config may be NULL). */
KHUB_INTERNAL khub_status khub__tokenizer_from_json_mem(khub_runtime *rt, const char *json,
                                                        size_t len, const char *config,
                                                        size_t config_len, khub_tokenizer **out);
/* Builds a tokenizer from GGUF-style metadata (see khub_tokenizer_spec).
 * Tokens of type CONTROL and USER_DEFINED are matched as whole added tokens
 * before BPE (CONTROL ones only with KHUB_TOK_PARSE_SPECIAL). */
KHUB_INTERNAL khub_status khub__tokenizer_from_vocab(khub_runtime *rt,
                                                     const khub_tokenizer_spec *spec,
                                                     khub_tokenizer **out);
/* Accepts NULL. */
KHUB_INTERNAL void khub__tokenizer_free(khub_tokenizer *tok);

/* Encode flags. */
#define KHUB_TOK_PARSE_SPECIAL \
    1u                          /* "<|im_start|>" in text becomes the special id \
                                   (Transformers' default); else it is plain text */
#define KHUB_TOK_ADD_SPECIAL 2u /* add bos when the tokenizer says so (add_bos) */
#define KHUB_TOK_ADD_BOS     4u /* always prepend bos (fails if there is none) */

/* Encodes len bytes of UTF-8 text (invalid UTF-8 is encoded byte by byte, as
 * byte-level BPE does). *ids is allocated with the runtime's allocator (NULL
 * when *n is 0); free it with khub__tokenizer_free_ids(tok, *ids, *n).
 * Returns OK, NOMEM, OVERFLOW, or TOKENIZER (ADD_BOS without a bos). */
KHUB_INTERNAL khub_status khub__tokenizer_encode(const khub_tokenizer *tok, const char *text,
                                                 size_t len, uint32_t flags, int32_t **ids,
                                                 size_t *n);
/* Frees what khub__tokenizer_encode returned (n as returned; NULL ok). */
KHUB_INTERNAL void khub__tokenizer_free_ids(const khub_tokenizer *tok, int32_t *ids, size_t n);

/* Decode flags. */
#define KHUB_DETOK_SPECIAL 1u /* emit special (CONTROL) tokens' text; default skips them */

/* Decodes ids into one UTF-8 string (invalid sequences become U+FFFD, as
 * Transformers' decode does), NUL-terminated after *len bytes; the text may
 * itself hold NUL bytes (token "\u0100" is byte 0). Free with
 * khub__tokenizer_free_text(tok, *out, *len). Ids outside the vocab fail with
 * TOKENIZER. */
KHUB_INTERNAL khub_status khub__tokenizer_decode(const khub_tokenizer *tok, const int32_t *ids,
                                                 size_t n, uint32_t flags, char **out, size_t *len);
/* Frees what khub__tokenizer_decode returned (NULL ok). */
KHUB_INTERNAL void khub__tokenizer_free_text(const khub_tokenizer *tok, char *text, size_t len);

/* Queries. ids are int32_t; -1 means none. */
KHUB_INTERNAL size_t khub__tokenizer_n_vocab(const khub_tokenizer *tok);
KHUB_INTERNAL int32_t khub__tokenizer_bos(const khub_tokenizer *tok);
KHUB_INTERNAL int32_t khub__tokenizer_eos(const khub_tokenizer *tok);
/* True for CONTROL tokens (special added tokens). False for ids outside. */
KHUB_INTERNAL bool khub__tokenizer_is_special(const khub_tokenizer *tok, int32_t id);
/* True for the eos id and for the end-of-turn/end-of-text tokens that stop
 * generation: "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>",
 * "<|eom_id|>" when present in the vocab. */
KHUB_INTERNAL bool khub__tokenizer_is_eog(const khub_tokenizer *tok, int32_t id);
/* The raw bytes a token stands for (byte-level mapping undone; a special
 * token's own text). *ptr is owned by tok, valid while tok lives, not NUL-
 * terminated. TOKENIZER for an id outside the vocab. */
KHUB_INTERNAL khub_status khub__tokenizer_token_bytes(const khub_tokenizer *tok, int32_t id,
                                                      const char **ptr, size_t *len);
/* Id of the token whose vocab string (byte-level form for normal tokens, the
 * literal text for added tokens) is exactly s[0..len); NOT_FOUND if none
 * (no message is set). */
KHUB_INTERNAL khub_status khub__tokenizer_find(const khub_tokenizer *tok, const char *s, size_t len,
                                               int32_t *id);
/* The chat template string (tokenizer_config.json "chat_template" or GGUF
 * tokenizer.chat_template), owned by tok; NULL if none. */
KHUB_INTERNAL const char *khub__tokenizer_chat_template(const khub_tokenizer *tok);
/* The pre-tokenizer khub recognised: "gpt2", "llama3", "smollm", "qwen2", or
 * "spm" for every SentencePiece-style tokenizer (BPE or Unigram). */
KHUB_INTERNAL const char *khub__tokenizer_pre_name(const khub_tokenizer *tok);

/* Streaming detokenizer: push one id at a time, get back the UTF-8 text that
 * became complete. Bytes of an incomplete multi-byte sequence are held until
 * a later token completes it (or flush replaces them with U+FFFD); bytes
 * that can never be valid are replaced with U+FFFD at once. The concatenation
 * of all pushes and the flush equals khub__tokenizer_decode of the same ids.
 * flags: KHUB_DETOK_SPECIAL. tok must outlive the detokenizer. */
KHUB_INTERNAL khub_status khub__detok_new(const khub_tokenizer *tok, uint32_t flags,
                                          khub_detok **out);
/* *text and *len: the newly completed text (possibly empty), owned by d, valid
 * until the next call on d; NUL-terminated. TOKENIZER for an id outside the
 * vocab (d is unchanged). */
KHUB_INTERNAL khub_status khub__detok_push(khub_detok *d, int32_t id, const char **text,
                                           size_t *len);
/* Emits what is still held (incomplete bytes become U+FFFD); pushes may
 * continue afterwards. */
KHUB_INTERNAL khub_status khub__detok_flush(khub_detok *d, const char **text, size_t *len);
/* All text emitted since creation or the last reset, NUL-terminated, owned by
 * d, valid until the next call on d. len may be NULL. */
KHUB_INTERNAL const char *khub__detok_text(const khub_detok *d, size_t *len);
/* Drops held bytes and the accumulated text (a new stream). */
KHUB_INTERNAL void khub__detok_reset(khub_detok *d);
/* Accepts NULL. */
KHUB_INTERNAL void khub__detok_free(khub_detok *d);

#endif /* KHUB_RUNTIME_TOKENIZER_H */

/* ------------------------------------------------------------------------ */
/* From an open GGUF (runtime/executor/tokenizer_gguf.c)                             */
/* ------------------------------------------------------------------------ */

typedef struct khub_gguf khub_gguf;

/* Builds the tokenizer from g's tokenizer.ggml.* keys (model, pre, tokens,
 * token_type, merges, bos/eos/padding_token_id, add_bos_token) and
 * tokenizer.chat_template, via khub__tokenizer_from_vocab. g may be closed
 * afterwards. Missing required keys: TOKENIZER naming the key. */
KHUB_INTERNAL khub_status khub__tokenizer_from_gguf(khub_runtime *rt, const khub_gguf *g,
                                                    khub_tokenizer **out);
