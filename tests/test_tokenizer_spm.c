/*
 * test_tokenizer_spm.c: SentencePiece-style tokenizer.json files of the
 * shapes Transformers writes for Llama 2, Mistral 7B v0.1 and TinyLlama
 * (normalizer Prepend + Replace; or a Metaspace pre-tokenizer with each
 * prepend_scheme and split; decoders with Strip, or Metaspace) against the
 * tokenizers library (issue 15). tools/make-tokenizer-fixture.py --spm-only
 * trained the vocab and recorded, for every corpus string and shape, the
 * library's ids and decoded text (tests/fixtures/tokenizer/spm); the same
 * for Unigram models (trained, and a hand-made vocab for the Viterbi's tie,
 * unk-penalty and unk-node rules). Also the shapes khub refuses, with their
 * messages.
 */
#include <cjson/cJSON.h>

#include "budget_alloc.h"
#include "json_fixture.h"
#include "runner.h"
#include "tokenizer.h"

#define SPM KHUB_SOURCE_DIR "/tests/fixtures/tokenizer/spm"

static khub_runtime *new_rt(void)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts)};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    return rt;
}

static bool same_ids(const int32_t *ids, size_t n, const cJSON *want)
{
    if ((size_t)cJSON_GetArraySize(want) != n) return false;
    size_t i = 0;
    for (const cJSON *v = want->child; v; v = v->next, i++)
        if (v->valueint != ids[i]) return false;
    return true;
}

/* decode(ids) with flags and the streaming detokenizer: both must give want.
 * Returns 1 (and prints) when either differs. */
static int check_decode(const khub_tokenizer *tok, const int32_t *ids, size_t n, uint32_t flags,
                        const char *want, const char *shape, const char *s)
{
    char *txt = NULL;
    size_t tl = 0;
    ASSERT_OK(khub__tokenizer_decode(tok, ids, n, flags, &txt, &tl));
    khub_detok *d = NULL;
    ASSERT_OK(khub__detok_new(tok, flags, &d));
    const char *piece;
    size_t pl;
    for (size_t i = 0; i < n; i++) ASSERT_OK(khub__detok_push(d, ids[i], &piece, &pl));
    ASSERT_OK(khub__detok_flush(d, &piece, &pl));
    int bad = tl != strlen(want) || memcmp(txt, want, tl) != 0 ||
              strcmp(khub__detok_text(d, NULL), txt) != 0;
    if (bad)
        fprintf(stderr,
                "  %s: decode%s of \"%.50s\": \"%.60s\" (stream \"%.60s\"), want \"%.60s\"\n",
                shape, flags ? " (specials kept)" : "", s, txt, khub__detok_text(d, NULL), want);
    khub__detok_free(d);
    khub__tokenizer_free_text(tok, txt, tl);
    return bad;
}

/* One shape over the whole corpus; returns the number of strings that differ. */
static int check_shape(const cJSON *fx, const cJSON *shape, const cJSON **prev_ids,
                       const char **prev_dec)
{
    const char *name = cJSON_GetObjectItem(shape, "name")->valuestring;
    char path[512];
    snprintf(path, sizeof path, SPM "/%s.json", name);
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = NULL;
    khub_status st = khub__tokenizer_from_json(rt, path, &tok);
    if (st) fprintf(stderr, "  %s: %s\n", name, khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    ASSERT_STR_EQ(khub__tokenizer_pre_name(tok), "spm");
    ASSERT_EQ(khub__tokenizer_bos(tok), 1);
    const cJSON *strings = cJSON_GetObjectItem(fx, "strings");
    const cJSON *ids_w = cJSON_GetObjectItem(shape, "ids");
    const cJSON *dec_w = cJSON_GetObjectItem(shape, "decoded");
    const cJSON *dsp_w = cJSON_GetObjectItem(shape, "decoded_special");
    ASSERT_EQ(cJSON_GetArraySize(ids_w), cJSON_GetArraySize(strings));
    ASSERT_EQ(cJSON_GetArraySize(dec_w), cJSON_GetArraySize(strings));
    int bad = 0, k = 0, n_special = 0;
    const cJSON *s = strings->child, *w = ids_w->child, *dw = dec_w->child;
    for (; s; s = s->next, w = w->next, dw = dw->next, k++) {
        if (!cJSON_IsNull(w)) prev_ids[k] = w; /* null: the previous shape's ids */
        const cJSON *want = prev_ids[k];
        ASSERT(want != NULL);
        if (!cJSON_IsNull(dw)) prev_dec[k] = dw->valuestring; /* null: the previous one */
        int32_t *ids = NULL;
        size_t n = 0;
        ASSERT_OK(khub__tokenizer_encode(tok, s->valuestring, strlen(s->valuestring),
                                         KHUB_TOK_PARSE_SPECIAL | KHUB_TOK_ADD_SPECIAL, &ids, &n));
        int b = !same_ids(ids, n, want);
        if (b && bad < 5) {
            fprintf(stderr, "  %s: ids of \"%.60s\": khub", name, s->valuestring);
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            char *ws = cJSON_PrintUnformatted(want);
            fprintf(stderr, ", tokenizers %s\n", ws);
            free(ws);
        }
        if (!b) { /* the library's decode of its own ids */
            const char *dec = prev_dec[k] ? prev_dec[k] : s->valuestring;
            b |= check_decode(tok, ids, n, 0, dec, name, s->valuestring);
            char key[16];
            snprintf(key, sizeof key, "%d", k);
            const cJSON *sp = cJSON_GetObjectItem(dsp_w, key);
            if (sp) {
                b |= check_decode(tok, ids, n, KHUB_DETOK_SPECIAL, sp->valuestring, name,
                                  s->valuestring);
                n_special++;
            }
        }
        bad += b;
        khub__tokenizer_free_ids(tok, ids, n);
    }
    fprintf(stderr, "  %-14s %d strings (%d with specials kept): %d differ\n", name, k, n_special,
            bad);
    ASSERT(n_special >= 30);
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
    return bad;
}

/* Every shape gives the library's ids and decoded text on every string. */
TEST_IMPL(spm_json_shapes_match_tokenizers)
{
    cJSON *fx = fx_json_file(SPM "/corpus.json");
    const cJSON *strings = cJSON_GetObjectItem(fx, "strings");
    int n = cJSON_GetArraySize(strings), shapes = 0, bad = 0;
    ASSERT(n >= 750);
    const cJSON **prev = calloc((size_t)n, sizeof *prev);
    const char **prev_dec = calloc((size_t)n, sizeof *prev_dec);
    const cJSON *sh;
    cJSON_ArrayForEach(sh, cJSON_GetObjectItem(fx, "shapes"))
    {
        if (shapes == 0) { /* the first shape lists every string's ids */
            const cJSON *w;
            int k = 0;
            cJSON_ArrayForEach(w, cJSON_GetObjectItem(sh, "ids"))
            {
                ASSERT(!cJSON_IsNull(w));
                k++;
            }
            ASSERT_EQ(k, n);
        }
        bad += check_shape(fx, sh, prev, prev_dec);
        shapes++;
    }
    ASSERT_EQ(shapes, 9);
    ASSERT_EQ(bad, 0);
    free(prev);
    free(prev_dec);
    cJSON_Delete(fx);
}

TEST_IMPL(spm_json_refusals)
{
#define DEC_SEQ \
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{" \
    "\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}"
#define DEC_OK DEC_SEQ "]}"
#define PREPEND \
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":" \
    "\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]}"
#define META(x) "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\"" x "}"
#define MODEL \
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}," \
    "\"merges\":[\"a b\"]}"
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{" PREPEND "," DEC_OK "," MODEL ",\"added_tokens\":[{\"id\":1,\"content\":\"b\"}]}",
         "tokenizer.json: added_tokens[0]: \"b\" is a normalized added token beside a Prepend "
         "normalizer; not supported (only normalized: false)"},
        {"{\"normalizer\":{\"type\":\"NFKC\"}," DEC_OK "," MODEL "}",
         "tokenizer.json: normalizer \"NFKC\" is not supported (supported: none; Replace \" \" "
         "-> \"\u2581\"; Sequence [Prepend \"\u2581\", Replace \" \" -> \"\u2581\"])"},
        {"{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"_\"}," DEC_OK "," MODEL "}",
         "tokenizer.json: pre_tokenizer.replacement is not \"\u2581\"; khub's "
         "SentencePiece-style tokenizers use only that one"},
        {"{" META(",\"prepend_scheme\":\"sometimes\"") "," DEC_OK "," MODEL "}",
         "tokenizer.json: pre_tokenizer.prepend_scheme \"sometimes\" is not first, always or "
         "never"},
        {"{" META(",\"prepend_scheme\":\"first\",\"add_prefix_space\":false") "," DEC_OK "," MODEL
                                                                              "}",
         "tokenizer.json: pre_tokenizer: add_prefix_space false does not match prepend_scheme "
         "\"first\""},
        {"{" META(",\"split\":1") "," DEC_OK "," MODEL "}",
         "tokenizer.json: pre_tokenizer.split must be true or false"},
        {"{" META("") "," DEC_SEQ
                      ",{\"type\":\"Strip\",\"content\":\" \",\"start\":2,\"stop\":0}]}," MODEL "}",
         "tokenizer.json: decoder is not Sequence [Replace \"\u2581\" -> \" \", ByteFallback, "
         "Fuse] (optionally + Strip \" \" start 1 stop 0) or Metaspace, which a "
         "SentencePiece-style tokenizer needs"},
        {"{" META("") ",\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
                      "\"prepend_scheme\":\"last\"}," MODEL "}",
         "tokenizer.json: decoder.prepend_scheme \"last\" is not first, always or never"},
        {"{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
         "\"WhitespaceSplit\"},{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\"}]}," DEC_OK
         "," MODEL "}",
         "tokenizer.json: pre_tokenizer of type \"Sequence\" is not a pattern khub implements "
         "(ByteLevel, Digits+ByteLevel, Split(Llama-3 or Qwen2 regex)+ByteLevel, all without "
         "add_prefix_space)"},
#define UNIGRAM(x) "\"model\":{\"type\":\"Unigram\"" x "}"
        {"{" META("") "," DEC_OK "," UNIGRAM(",\"vocab\":[[\"a\",-1.0]],\"unk_id\":null") "}",
         "tokenizer.json: model.unk_id is missing or not an index of model.vocab (1 pieces); khub "
         "needs the unk piece of a Unigram model"},
        {"{" META("") "," DEC_OK "," UNIGRAM(",\"vocab\":[[\"a\",-1.0]],\"unk_id\":1") "}",
         "tokenizer.json: model.unk_id is missing or not an index of model.vocab (1 pieces); khub "
         "needs the unk piece of a Unigram model"},
        {"{" META("") "," DEC_OK "," UNIGRAM(",\"vocab\":[[\"<unk>\",0],[\"a\",\"x\"]]") "}",
         "tokenizer.json: model.vocab[1] is not [\"piece\", finite score]"},
        {"{" META("") "," DEC_OK "," UNIGRAM(",\"vocab\":{\"a\":0}") "}",
         "tokenizer.json: model.vocab of a Unigram model is missing, empty or not a list"},
        {"{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":"
         "{\"type\":\"ByteLevel\"}," UNIGRAM(",\"vocab\":[[\"<unk>\",0]],\"unk_id\":0") "}",
         "tokenizer.json: model.type \"Unigram\" needs a SentencePiece-style pipeline (a "
         "Metaspace pre-tokenizer or a \"\u2581\" normalizer); this file has neither"},
        {"{" META("") "," DEC_OK ",\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}",
         "tokenizer.json: model.type \"WordPiece\" is not supported (only BPE and Unigram)"},
    };
    khub_runtime *rt = new_rt();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        khub_tokenizer *tok = NULL;
        khub_status st =
            khub__tokenizer_from_json_mem(rt, cases[i].json, strlen(cases[i].json), NULL, 0, &tok);
        if (st != KHUB_STATUS_TOKENIZER || strcmp(khub_runtime_errmsg(rt), cases[i].msg) != 0)
            fprintf(stderr, "  case %zu: %s: %s\n", i, khub_status_name(st),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(st, KHUB_STATUS_TOKENIZER);
        ASSERT_STR_EQ(khub_runtime_errmsg(rt), cases[i].msg);
        ASSERT(tok == NULL);
        khub__clear(rt);
    }
    /* the accepted neighbours of those shapes load: normalized false beside
     * Prepend; a Metaspace with the older add_prefix_space true; split absent */
    static const char *const ok[] = {
        "{" PREPEND "," DEC_OK "," MODEL
        ",\"added_tokens\":[{\"id\":1,\"content\":\"b\",\"normalized\":false}]}",
        "{" META(",\"add_prefix_space\":true") "," DEC_OK "," MODEL "}",
        "{" META(",\"prepend_scheme\":\"never\",\"add_prefix_space\":false") "," DEC_OK "," MODEL
                                                                             "}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        khub_tokenizer *tok = NULL;
        khub_status st = khub__tokenizer_from_json_mem(rt, ok[i], strlen(ok[i]), NULL, 0, &tok);
        if (st) fprintf(stderr, "  ok %zu: %s\n", i, khub_runtime_errmsg(rt));
        ASSERT_OK(st);
        khub__tokenizer_free(tok);
    }
    khub_runtime_free(rt);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ASSERT(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Load, encode, decode and stream once under an allocation budget of k;
 * returns the first status that is not OK. */
static khub_status run_budget(khub_runtime *rt, const char *json, size_t len)
{
    static const char text[] = "<s> Caf\u00e9  p\u00fc\u00f6q \U0001F600 the lazy dog</s>x";
    khub_tokenizer *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0, tl = 0;
    char *txt = NULL;
    khub_detok *d = NULL;
    khub_status st = khub__tokenizer_from_json_mem(rt, json, len, NULL, 0, &tok);
    if (!st) st = khub__tokenizer_encode(tok, text, strlen(text), KHUB_TOK_PARSE_SPECIAL, &ids, &n);
    if (!st) st = khub__tokenizer_decode(tok, ids, n, 0, &txt, &tl);
    if (!st) st = khub__detok_new(tok, 0, &d);
    for (size_t i = 0; !st && i < n; i++) {
        const char *p;
        size_t pl;
        st = khub__detok_push(d, ids[i], &p, &pl);
    }
    khub__detok_free(d);
    khub__tokenizer_free_text(tok, txt, tl);
    khub__tokenizer_free_ids(tok, ids, n);
    khub__tokenizer_free(tok);
    return st;
}

/* Every allocation of loading a Prepend, a Metaspace-split and a Unigram
 * file, encoding, decoding and streaming may fail: NOMEM, nothing leaked. */
TEST_IMPL(spm_json_out_of_memory)
{
    static const char *const shapes[] = {"legacy", "first_split", "unigram_bytes", "unigram"};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        char path[512];
        snprintf(path, sizeof path, SPM "/%s.json", shapes[s]);
        size_t len = 0;
        char *json = slurp(path, &len);
        long k = 0;
        for (;; k++) {
            budget bu = {-1, 0};
            khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts),
                                   .allocator = {budget_realloc, &bu}};
            khub_runtime *rt = NULL;
            ASSERT_OK(khub_runtime_new(&o, &rt));
            long long base = bu.live;
            bu.allocs_left = k;
            khub_status st = run_budget(rt, json, len);
            ASSERT_EQ(bu.live, base);
            khub_runtime_free(rt);
            if (st == KHUB_STATUS_OK) break;
            ASSERT_STATUS(st, KHUB_STATUS_NOMEM);
        }
        fprintf(stderr, "  %-14s every one of %ld allocations failed in turn: NOMEM, no leak\n",
                shapes[s], k);
        ASSERT(k >= 10);
        free(json);
    }
}

#define TEST_LIST(X) \
    X(spm_json_shapes_match_tokenizers) \
    X(spm_json_refusals) \
    X(spm_json_out_of_memory)
TEST_MAIN(TEST_LIST)
