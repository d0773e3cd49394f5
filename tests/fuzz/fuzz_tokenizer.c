/* fuzz_tokenizer.c: libFuzzer target for the tokenizer.json loader, BPE
 * encoding, decoding and the streaming detokenizer.
 *
 * The first input byte picks the mode:
 *   even: the rest is a tokenizer.json (any input may be refused, none may
 *         crash); what loads encodes a few fixed strings and decodes them;
 *   odd:  the rest (its first 1 KiB) is text, encoded with one fixture
 *         tokenizer (tests/fixtures/tokenizer), the one (first byte / 2) mod 8
 *         picks; decode(encode(text)) must equal the text when it is valid
 *         UTF-8 (byte-level ones: a SentencePiece-style pipeline adds and
 *         strips spaces), and the streaming detokenizer must agree with
 *         decode. A mismatch aborts (a bug, found).
 * Session 18: text went through all 8 tokenizers, up to 4 KiB of it: ~41 ms
 * of CPU per input under ASan and coverage, 23 inputs/s in session 17's
 * run (its text seeds are 400 KB files). One tokenizer per input and 1 KiB
 * keep every tokenizer and long pre-tokens in reach at ~30x the rate. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode.h"

/* The first N_BYTE_LEVEL round-trip exactly; the SentencePiece-style ones
 * (a Prepend, a Metaspace split with its decoder, two Unigram) need not. */
#define N_BYTE_LEVEL 4
#define N_FIXTURES   8
static const char *const kinds[N_FIXTURES] = {"gpt2/tokenizer.json",    "smollm/tokenizer.json",
                                              "llama3/tokenizer.json",  "qwen2/tokenizer.json",
                                              "spm/legacy.json",        "spm/always_split.json",
                                              "spm/unigram_bytes.json", "spm/unigram_edges.json"};
static khub_tokenizer *fixtures[N_FIXTURES];

static void load_fixtures(void)
{
    static int done;
    if (done) return;
    done = 1;
    for (int i = 0; i < N_FIXTURES; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/%s", KHUB_SOURCE_DIR, kinds[i]);
        if (khub__tokenizer_from_json(NULL, path, &fixtures[i]) != KHUB_STATUS_OK) abort();
    }
}

static bool valid_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += khub__utf8_decode(s + i, n - i, &cp);
        if (cp == KHUB__UNI_INVALID) return false;
    }
    return true;
}

/* Encodes, decodes, streams; checks the round trip when check is set. */
static void round_trip(const khub_tokenizer *tok, const char *s, size_t n, bool check)
{
    int32_t *ids = NULL;
    size_t k = 0;
    if (khub__tokenizer_encode(tok, s, n, KHUB_TOK_PARSE_SPECIAL, &ids, &k) != KHUB_STATUS_OK)
        return;
    char *back = NULL;
    size_t blen = 0;
    if (khub__tokenizer_decode(tok, ids, k, KHUB_DETOK_SPECIAL, &back, &blen) == KHUB_STATUS_OK) {
        if (check && (blen != n || memcmp(back, s, n) != 0)) abort();
        khub_detok *d = NULL;
        if (khub__detok_new(tok, KHUB_DETOK_SPECIAL, &d) == KHUB_STATUS_OK) {
            const char *t;
            size_t tl;
            for (size_t i = 0; i < k; i++) (void)khub__detok_push(d, ids[i], &t, &tl);
            (void)khub__detok_flush(d, &t, &tl);
            size_t all;
            const char *txt = khub__detok_text(d, &all);
            if (all != blen || memcmp(txt, back, blen) != 0) abort();
            khub__detok_free(d);
        }
        khub__tokenizer_free_text(tok, back, blen);
    }
    khub__tokenizer_free_ids(tok, ids, k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        /* Text past 1 KiB finds nothing new in the encoder (pieces are
         * local; a 1 KiB pre-token is already a long merge chain) but costs
         * linear time: capped, so the run tries far more inputs per second. */
        if (n > 1024) n = 1024;
        load_fixtures();
        int i = (data[0] >> 1) % N_FIXTURES;
        round_trip(fixtures[i], rest, n, i < N_BYTE_LEVEL && valid_utf8(data + 1, n));
        return 0;
    }
    khub_tokenizer *tok = NULL;
    if (khub__tokenizer_from_json_mem(NULL, rest, n, NULL, 0, &tok) != KHUB_STATUS_OK) return 0;
    static const char *const probes[] = {"Hello world", "I'm 12345 \n\n  x", "<|endoftext|>a",
                                         " \u2581a  b<s>c\u00fc"};
    for (size_t i = 0; i < 4; i++) round_trip(tok, probes[i], strlen(probes[i]), false);
    int32_t ids[4] = {0, 1, -1, 1 << 30};
    char *out;
    size_t len;
    for (size_t i = 0; i < 4; i++)
        if (khub__tokenizer_decode(tok, &ids[i], 1, 0, &out, &len) == KHUB_STATUS_OK)
            khub__tokenizer_free_text(tok, out, len);
    khub__tokenizer_free(tok);
    return 0;
}
