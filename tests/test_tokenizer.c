/*
 * test_tokenizer.c: byte-level BPE against Hugging Face tokenizers' own ids.
 *
 * Fixtures (tools/make-tokenizer-fixture.py): one small trained tokenizer per
 * pre-tokenizer khub implements and a corpus with tokenizers' ids for each.
 * The real SmolLM2-135M-Instruct files (tools/fetch-model.sh) are used when
 * present, skipped with a message when not.
 */
#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <time.h>

#include "chat.h"
#include "gguf.h"
#include "runner.h"
#include "tokenizer.h"
#include "unicode.h"

#define FIX KHUB_SOURCE_DIR "/tests/fixtures/tokenizer"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ASSERT(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    buf[n] = '\0';
    if (len) *len = (size_t)n;
    return buf;
}

static khub_runtime *new_rt(void)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    return rt;
}

static khub_tokenizer *load_fixture(khub_runtime *rt, const char *kind)
{
    char path[512];
    snprintf(path, sizeof path, FIX "/%s/tokenizer.json", kind);
    khub_tokenizer *tok = NULL;
    khub_status st = khub__tokenizer_from_json(rt, path, &tok);
    if (st != KHUB_STATUS_OK) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    return tok;
}

/* Encodes s and compares with want (a JSON list of ids); returns 0 on match
 * and prints the first difference otherwise. */
static int check_ids(const khub_tokenizer *tok, const char *s, const cJSON *want, uint32_t flags)
{
    int32_t *ids = NULL;
    size_t n = 0;
    ASSERT_OK(khub__tokenizer_encode(tok, s, strlen(s), flags, &ids, &n));
    int bad = (size_t)cJSON_GetArraySize(want) != n;
    for (size_t i = 0; !bad && i < n; i++)
        bad = cJSON_GetArrayItem(want, (int)i)->valueint != ids[i];
    if (bad) {
        fprintf(stderr, "  mismatch on \"%s\": got", s);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "; want");
        for (const cJSON *v = want->child; v; v = v->next) fprintf(stderr, " %d", v->valueint);
        fprintf(stderr, "\n");
    }
    /* decode(encode(s)) == s, special tokens included. */
    char *back = NULL;
    size_t blen = 0;
    ASSERT_OK(khub__tokenizer_decode(tok, ids, n, KHUB_DETOK_SPECIAL, &back, &blen));
    if (blen != strlen(s) || memcmp(back, s, blen) != 0) {
        fprintf(stderr, "  round trip of \"%s\" gave \"%s\"\n", s, back);
        bad = 1;
    }
    khub__tokenizer_free_text(tok, back, blen);
    khub__tokenizer_free_ids(tok, ids, n);
    return bad;
}

static void run_corpus(const khub_tokenizer *tok, const char *kind)
{
    char *text = slurp(FIX "/corpus.json", NULL);
    ASSERT(text);
    cJSON *c = cJSON_Parse(text);
    ASSERT(c);
    const cJSON *strings = cJSON_GetObjectItem(c, "strings");
    const cJSON *ids = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "ids"), kind);
    ASSERT(cJSON_GetArraySize(strings) > 200);
    ASSERT_EQ(cJSON_GetArraySize(strings), cJSON_GetArraySize(ids));
    int bad = 0;
    const cJSON *w = ids->child;
    for (const cJSON *s = strings->child; s; s = s->next, w = w->next)
        bad += check_ids(tok, s->valuestring, w, KHUB_TOK_PARSE_SPECIAL);
    ASSERT_EQ(bad, 0);
    cJSON_Delete(c);
    free(text);
}

/* Rebuilds a tokenizer.json's vocab as GGUF metadata would carry it. */
typedef struct spec_store {
    khub_tokenizer_spec spec;
    char **tokens;
    int32_t *types;
    char **merges;
} spec_store;

static void spec_from_json(const char *path, const char *pre, spec_store *ss)
{
    char *text = slurp(path, NULL);
    ASSERT(text);
    cJSON *root = cJSON_Parse(text);
    const cJSON *model = cJSON_GetObjectItem(root, "model");
    const cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItem(model, "merges");
    const cJSON *added = cJSON_GetObjectItem(root, "added_tokens");
    size_t n = (size_t)cJSON_GetArraySize(vocab);
    for (const cJSON *a = added->child; a; a = a->next)
        if ((size_t)cJSON_GetObjectItem(a, "id")->valueint >= n) n++;
    ss->tokens = calloc(n, sizeof *ss->tokens);
    ss->types = calloc(n, sizeof *ss->types);
    for (const cJSON *v = vocab->child; v; v = v->next) {
        ss->tokens[v->valueint] = strdup(v->string);
        ss->types[v->valueint] = KHUB_TOKEN_NORMAL;
    }
    for (const cJSON *a = added->child; a; a = a->next) {
        int id = cJSON_GetObjectItem(a, "id")->valueint;
        free(ss->tokens[id]);
        ss->tokens[id] = strdup(cJSON_GetObjectItem(a, "content")->valuestring);
        ss->types[id] = cJSON_IsTrue(cJSON_GetObjectItem(a, "special")) ? KHUB_TOKEN_CONTROL
                                                                        : KHUB_TOKEN_USER_DEFINED;
    }
    size_t nm = (size_t)cJSON_GetArraySize(merges);
    ss->merges = calloc(nm, sizeof *ss->merges);
    size_t i = 0;
    for (const cJSON *m = merges->child; m; m = m->next, i++) {
        const char *l = m->child->valuestring, *r = m->child->next->valuestring;
        ss->merges[i] = malloc(strlen(l) + strlen(r) + 2);
        sprintf(ss->merges[i], "%s %s", l, r);
    }
    khub_tokenizer_spec sp = KHUB_TOKENIZER_SPEC_INIT;
    sp.model = "gpt2";
    sp.pre = pre;
    sp.tokens = (const char *const *)ss->tokens;
    sp.n_tokens = n;
    sp.token_types = ss->types;
    sp.merges = (const char *const *)ss->merges;
    sp.n_merges = nm;
    sp.eos_id = 0;
    ss->spec = sp;
    cJSON_Delete(root);
    free(text);
}

static void spec_free(spec_store *ss)
{
    for (size_t i = 0; i < ss->spec.n_tokens; i++) free(ss->tokens[i]);
    for (size_t i = 0; i < ss->spec.n_merges; i++) free(ss->merges[i]);
    free(ss->tokens);
    free(ss->types);
    free(ss->merges);
}

/* ------------------------------------------------------------------------ */
/* Against tokenizers, on the fixtures                                      */
/* ------------------------------------------------------------------------ */

#define CORPUS_TEST(kind) \
    TEST_IMPL(corpus_##kind) \
    { \
        khub_runtime *rt = new_rt(); \
        khub_tokenizer *tok = load_fixture(rt, #kind); \
        ASSERT_STR_EQ(khub__tokenizer_pre_name(tok), #kind); \
        run_corpus(tok, #kind); \
        khub__tokenizer_free(tok); \
        khub_runtime_free(rt); \
    }
CORPUS_TEST(gpt2)
CORPUS_TEST(smollm)
CORPUS_TEST(llama3)
CORPUS_TEST(qwen2)

TEST_IMPL(corpus_from_vocab_spec)
{
    static const char *const kinds[][2] = {
        {"gpt2", "gpt2"}, {"smollm", "smollm"}, {"llama3", "llama-bpe"}, {"qwen2", "qwen2"}};
    khub_runtime *rt = new_rt();
    for (size_t k = 0; k < 4; k++) {
        char path[512];
        snprintf(path, sizeof path, FIX "/%s/tokenizer.json", kinds[k][0]);
        spec_store ss;
        spec_from_json(path, kinds[k][1], &ss);
        khub_tokenizer *tok = NULL;
        khub_status st = khub__tokenizer_from_vocab(rt, &ss.spec, &tok);
        if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
        ASSERT_OK(st);
        ASSERT_STR_EQ(khub__tokenizer_pre_name(tok), kinds[k][0]);
        run_corpus(tok, kinds[k][0]);
        khub__tokenizer_free(tok);
        spec_free(&ss);
    }
    khub_runtime_free(rt);
}

TEST_IMPL(special_tokens_and_flags)
{
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = load_fixture(rt, "smollm");
    int32_t im_start, im_end, tool;
    ASSERT_OK(khub__tokenizer_find(tok, "<|im_start|>", 12, &im_start));
    ASSERT_OK(khub__tokenizer_find(tok, "<|im_end|>", 10, &im_end));
    ASSERT_OK(khub__tokenizer_find(tok, "<tool>", 6, &tool));
    ASSERT_STATUS(khub__tokenizer_find(tok, "<nope>", 6, &tool), KHUB_STATUS_NOT_FOUND);
    ASSERT(khub__tokenizer_is_special(tok, im_start));
    ASSERT(!khub__tokenizer_is_special(tok, tool));
    ASSERT(khub__tokenizer_is_eog(tok, im_end));
    ASSERT(!khub__tokenizer_is_eog(tok, im_start));
    /* from tokenizer_config.json */
    ASSERT_EQ(khub__tokenizer_eos(tok), im_end);
    ASSERT_EQ(khub__tokenizer_bos(tok), im_start);
    ASSERT_CONTAINS(khub__tokenizer_chat_template(tok), "<|im_start|>");

    const char *s = "<|im_start|>hi";
    int32_t *ids = NULL;
    size_t n = 0;
    ASSERT_OK(khub__tokenizer_encode(tok, s, strlen(s), KHUB_TOK_PARSE_SPECIAL, &ids, &n));
    ASSERT_EQ(ids[0], im_start);
    khub__tokenizer_free_ids(tok, ids, n);
    /* Without PARSE_SPECIAL the special text is ordinary text; <tool> (not
     * special) is still matched. */
    ASSERT_OK(khub__tokenizer_encode(tok, s, strlen(s), 0, &ids, &n));
    ASSERT(n > 2);
    for (size_t i = 0; i < n; i++) ASSERT_NE(ids[i], im_start);
    khub__tokenizer_free_ids(tok, ids, n);
    ASSERT_OK(khub__tokenizer_encode(tok, "a<tool>", 7, 0, &ids, &n));
    ASSERT_EQ(ids[n - 1], tool);
    khub__tokenizer_free_ids(tok, ids, n);
    /* ADD_BOS prepends bos; decode skips specials unless asked. */
    ASSERT_OK(khub__tokenizer_encode(tok, "hi", 2, KHUB_TOK_ADD_BOS, &ids, &n));
    ASSERT_EQ(ids[0], im_start);
    char *out = NULL;
    size_t len = 0;
    ASSERT_OK(khub__tokenizer_decode(tok, ids, n, 0, &out, &len));
    ASSERT_STR_EQ(out, "hi");
    khub__tokenizer_free_text(tok, out, len);
    khub__tokenizer_free_ids(tok, ids, n);
    /* Empty text: no ids, no allocation. */
    ASSERT_OK(khub__tokenizer_encode(tok, "", 0, 0, &ids, &n));
    ASSERT_EQ(n, 0);
    ASSERT(ids == NULL);
    khub__tokenizer_free(tok);

    /* A tokenizer without bos refuses ADD_BOS with a message. */
    tok = load_fixture(rt, "gpt2");
    ASSERT_STATUS(khub__tokenizer_encode(tok, "hi", 2, KHUB_TOK_ADD_BOS, &ids, &n),
                  KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "no bos token");
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Streaming decoding                                                       */
/* ------------------------------------------------------------------------ */

/* Byte tokens for each byte of s, so multi-byte characters arrive split. */
static size_t byte_ids(const khub_tokenizer *tok, const char *s, int32_t *ids)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned b = *p;
        /* GPT-2's byte-to-unicode mapping (inverse of the decoder's). */
        unsigned cp = b;
        if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
            unsigned k = 0;
            for (unsigned c = 0; c < b; c++)
                if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) k++;
            cp = 256 + k;
        }
        unsigned char u[4];
        size_t l = khub__utf8_encode(cp, u);
        ASSERT_OK(khub__tokenizer_find(tok, (const char *)u, l, &ids[n]));
        n++;
    }
    return n;
}

TEST_IMPL(detok_never_splits_utf8)
{
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = load_fixture(rt, "gpt2");
    const char *s = "a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80z"; /* a é 你 😀 z */
    int32_t ids[32];
    size_t n = byte_ids(tok, s, ids);
    ASSERT_EQ(n, 11);
    khub_detok *d = NULL;
    ASSERT_OK(khub__detok_new(tok, 0, &d));
    const char *txt;
    size_t len;
    /* Expected deltas after each byte token. */
    static const char *const want[] = {"a", "", "\xC3\xA9",         "", "", "\xE4\xBD\xA0", "",
                                       "",  "", "\xF0\x9F\x98\x80", "z"};
    for (size_t i = 0; i < n; i++) {
        ASSERT_OK(khub__detok_push(d, ids[i], &txt, &len));
        ASSERT_STR_EQ(txt, want[i]);
        ASSERT_EQ(len, strlen(want[i]));
    }
    ASSERT_OK(khub__detok_flush(d, &txt, &len));
    ASSERT_EQ(len, 0);
    ASSERT_STR_EQ(khub__detok_text(d, NULL), s);

    /* An incomplete tail at flush becomes U+FFFD; a stray continuation byte
     * becomes U+FFFD at once; specials are skipped by default. */
    khub__detok_reset(d);
    int32_t e9[4];
    ASSERT_EQ(byte_ids(tok, "\xE4\xBD", e9), 2);
    ASSERT_OK(khub__detok_push(d, e9[0], &txt, &len));
    ASSERT_OK(khub__detok_push(d, e9[1], &txt, &len));
    ASSERT_EQ(len, 0);
    ASSERT_OK(khub__detok_flush(d, &txt, &len));
    ASSERT_STR_EQ(txt, "\xEF\xBF\xBD");
    khub__detok_reset(d);
    ASSERT_OK(khub__detok_push(d, e9[1], &txt, &len)); /* 0xBD alone */
    ASSERT_STR_EQ(txt, "\xEF\xBF\xBD");
    int32_t eot;
    ASSERT_OK(khub__tokenizer_find(tok, "<|endoftext|>", 13, &eot));
    ASSERT_OK(khub__detok_push(d, eot, &txt, &len));
    ASSERT_EQ(len, 0);
    khub__clear(rt);
    ASSERT_STATUS(khub__detok_push(d, 999999, &txt, &len), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "999999");
    khub__detok_free(d);

    ASSERT_OK(khub__detok_new(tok, KHUB_DETOK_SPECIAL, &d));
    ASSERT_OK(khub__detok_push(d, eot, &txt, &len));
    ASSERT_STR_EQ(txt, "<|endoftext|>");
    khub__detok_free(d);
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
}

/* Invalid UTF-8 in a text is encoded as U+FFFD, one per maximal invalid
 * subpart, as Transformers tokenizes bytes.decode(errors="replace"), and
 * the first bad byte is named in a warning (issue 11: it vanished). */
static char warned[1024];
static void keep_warning(void *ud, khub_log_level level, const char *msg)
{
    (void)ud;
    if (level == KHUB_LOG_WARN) snprintf(warned, sizeof warned, "%s", msg);
}

static void same_ids(const khub_tokenizer *tok, const char *bad, const char *want_text)
{
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    ASSERT_OK(khub__tokenizer_encode(tok, bad, strlen(bad), 0, &a, &na));
    ASSERT_OK(khub__tokenizer_encode(tok, want_text, strlen(want_text), 0, &b, &nb));
    ASSERT_EQ(na, nb);
    for (size_t i = 0; i < na; i++) ASSERT_EQ(a[i], b[i]);
    char *out = NULL;
    size_t len = 0;
    ASSERT_OK(khub__tokenizer_decode(tok, a, na, 0, &out, &len));
    ASSERT_STR_EQ(out, want_text);
    khub__tokenizer_free_text(tok, out, len);
    khub__tokenizer_free_ids(tok, a, na);
    khub__tokenizer_free_ids(tok, b, nb);
}

TEST_IMPL(invalid_utf8_becomes_fffd)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1,
                           .log = keep_warning};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    static const char *const kinds[] = {"gpt2", "smollm", "llama3"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        khub_tokenizer *tok = load_fixture(rt, kinds[k]);
        warned[0] = '\0';
        same_ids(tok, "caf\xE9 ok", "caf\xEF\xBF\xBD ok"); /* a Latin-1 byte */
        ASSERT_STR_EQ(warned, "tokenizer: the text is not valid UTF-8 at byte 3; 1 invalid "
                              "sequence replaced with U+FFFD");
        /* a truncated 4-byte sequence is one subpart; C0 and a lone
         * continuation byte are one each; a truncated tail at the end */
        warned[0] = '\0';
        same_ids(tok,
                 "a\xF0\x9F\x98 b\xC0\x80"
                 "c\xE4\xBD",
                 "a\xEF\xBF\xBD b\xEF\xBF\xBD\xEF\xBF\xBD"
                 "c\xEF\xBF\xBD");
        ASSERT_STR_EQ(warned, "tokenizer: the text is not valid UTF-8 at byte 1; 4 invalid "
                              "sequences replaced with U+FFFD");
        /* valid text is untouched and not warned about */
        warned[0] = '\0';
        same_ids(tok, "a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80z",
                 "a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80z");
        ASSERT_STR_EQ(warned, "");
        khub__tokenizer_free(tok);
    }
    khub_runtime_free(rt);
}

TEST_IMPL(detok_matches_decode_on_corpus)
{
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = load_fixture(rt, "llama3");
    char *text = slurp(FIX "/corpus.json", NULL);
    cJSON *c = cJSON_Parse(text);
    khub_detok *d = NULL;
    ASSERT_OK(khub__detok_new(tok, KHUB_DETOK_SPECIAL, &d));
    for (const cJSON *s = cJSON_GetObjectItem(c, "strings")->child; s; s = s->next) {
        int32_t *ids = NULL;
        size_t n = 0;
        const char *str = s->valuestring;
        ASSERT_OK(khub__tokenizer_encode(tok, str, strlen(str), KHUB_TOK_PARSE_SPECIAL, &ids, &n));
        khub__detok_reset(d);
        const char *txt;
        size_t len;
        for (size_t i = 0; i < n; i++) {
            ASSERT_OK(khub__detok_push(d, ids[i], &txt, &len));
            /* never a split sequence: every delta is valid UTF-8 on its own */
            for (size_t j = 0; j < len;) {
                uint32_t cp;
                j += khub__utf8_decode((const unsigned char *)txt + j, len - j, &cp);
                ASSERT(cp != KHUB__UNI_INVALID);
            }
        }
        ASSERT_OK(khub__detok_flush(d, &txt, &len));
        ASSERT_STR_EQ(khub__detok_text(d, NULL), str);
        khub__tokenizer_free_ids(tok, ids, n);
    }
    khub__detok_free(d);
    cJSON_Delete(c);
    free(text);
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Hostile tokenizer.json                                                   */
/* ------------------------------------------------------------------------ */

#define BL  "\"decoder\":{\"type\":\"ByteLevel\"},"
#define PRE "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},"

static void expect_bad(const char *json, const char *needle)
{
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = (khub_tokenizer *)1;
    ASSERT_STATUS(khub__tokenizer_from_json_mem(rt, json, strlen(json), NULL, 0, &tok),
                  KHUB_STATUS_TOKENIZER);
    ASSERT(tok == NULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), needle);
    khub_runtime_free(rt);
}

TEST_IMPL(hostile_json)
{
    expect_bad("{", "not valid JSON");
    expect_bad("[]", "not a JSON object");
    expect_bad("{" BL PRE "\"model\":{\"type\":\"BPE\",\"merges\":[]}}", "model.vocab is missing");
    expect_bad("{" BL PRE "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}",
               "model.merges is missing");
    expect_bad("{" BL PRE "\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0},\"merges\":[]}}",
               "model.type \"WordPiece\"");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":\"x\"},\"merges\":[]}}",
               "model.vocab.a: the id must be a number");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":-1},\"merges\":[]}}", "id -1");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0.5},\"merges\":[]}}", "id 0.5");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":99999999},\"merges\":[]}}", "id 99999999");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0,\"b\":4000},\"merges\":[]}}",
               "far beyond");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}}",
               "id 0 is given to two tokens");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0,\"a\":1},\"merges\":[]}}",
               "token \"a\" appears twice");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}",
               "model.merges[0]: \"c\" is not in the vocab");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}}",
               "model.merges[0]: the merge of \"a\" and \"b\" is not in the vocab");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"ab\"]}}",
               "model.merges[0] is neither");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0,\"b\":1},\"merges\":[7]}}",
               "model.merges[0] is neither");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0},\"merges\":[],\"byte_fallback\":true}}",
               "byte_fallback");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.1}}",
               "dropout");
    expect_bad("{" BL PRE "\"added_tokens\":{},\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}",
               "added_tokens must be a list");
    expect_bad("{" BL PRE "\"added_tokens\":[{\"id\":1}],\"model\":{\"vocab\":{\"a\":0},"
               "\"merges\":[]}}",
               "added_tokens[0].content is missing");
    expect_bad("{" BL PRE "\"added_tokens\":[{\"id\":1,\"content\":\"<x>\",\"special\":1}],"
               "\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}",
               "special must be true or false");
    expect_bad("{" BL PRE "\"added_tokens\":[{\"id\":1,\"content\":\"x\"},{\"id\":1,\"content\":"
               "\"y\"}],\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}",
               "id 1 is listed twice");
    expect_bad("{" BL "\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"vocab\":"
               "{\"a\":0},\"merges\":[]}}",
               "pre_tokenizer of type \"Whitespace\"");
    expect_bad("{" BL "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
               "\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},\"behavior\":\"Isolated\"},{\"type\":"
               "\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},\"model\":"
               "{\"vocab\":{\"a\":0},\"merges\":[]}}",
               "Split regex \"\\s+\"");
    expect_bad("{" BL "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true},"
               "\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}",
               "pre_tokenizer of type");
    expect_bad("{" BL PRE "\"normalizer\":{\"type\":\"NFKC\"},\"model\":{\"vocab\":{\"a\":0},"
               "\"merges\":[]}}",
               "normalizer \"NFKC\"");
    expect_bad("{\"decoder\":{\"type\":\"WordPiece\"}," PRE "\"model\":{\"vocab\":{\"a\":0},"
               "\"merges\":[]}}",
               "decoder \"WordPiece\"");
    expect_bad("{" BL PRE "\"model\":{\"vocab\":{\"a\":0},\"merges\":[]},\"post_processor\":"
               "{\"type\":\"BertProcessing\"}}",
               "post_processor \"BertProcessing\"");

    /* tokenizer_config.json naming a token that is not there. */
    khub_runtime *rt = new_rt();
    const char *ok = "{" BL PRE "\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}";
    const char *cfg = "{\"eos_token\":\"</s>\"}";
    khub_tokenizer *tok = NULL;
    ASSERT_STATUS(khub__tokenizer_from_json_mem(rt, ok, strlen(ok), cfg, strlen(cfg), &tok),
                  KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "eos_token \"</s>\" is not a token");
    ASSERT_OK(khub__tokenizer_from_json_mem(rt, ok, strlen(ok), NULL, 0, &tok));
    khub__tokenizer_free(tok);
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_json(rt, "/nonexistent/tokenizer.json", &tok),
                  KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "/nonexistent/tokenizer.json");
    khub_runtime_free(rt);
}

/* Every prefix of a real tokenizer.json is refused cleanly (never a crash). */
TEST_IMPL(hostile_truncations)
{
    size_t len;
    char *json = slurp(FIX "/gpt2/tokenizer.json", &len);
    ASSERT(json);
    khub_runtime *rt = new_rt();
    for (size_t cut = 0; cut < len; cut += 1 + cut / 7) {
        khub_tokenizer *tok = NULL;
        khub_status st = khub__tokenizer_from_json_mem(rt, json, cut, NULL, 0, &tok);
        ASSERT_STATUS(st, KHUB_STATUS_TOKENIZER);
        ASSERT(tok == NULL);
    }
    free(json);
    khub_runtime_free(rt);
}

TEST_IMPL(hostile_spec)
{
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = NULL;
    const char *toks[] = {"a", "b", "ab"};
    const char *merges[] = {"a b", "a x", "ab"};
    khub_tokenizer_spec sp = KHUB_TOKENIZER_SPEC_INIT;
    sp.tokens = toks;
    sp.n_tokens = 3;
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "tokenizer.ggml.model \"(missing)\"");
    sp.model = "bert";
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "tokenizer.ggml.model \"bert\" is not supported");
    sp.model = "llama"; /* SentencePiece needs its scores */
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "tokenizer.ggml.model is llama but "
                                             "tokenizer.ggml.scores is missing");
    sp.model = "gpt2";
    sp.pre = "deepseek-coder";
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "tokenizer.ggml.pre \"deepseek-coder\"");
    sp.pre = "smollm";
    sp.eos_id = 3;
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "eos_token_id 3");
    sp.eos_id = 1;
    int32_t types[] = {1, 1, 9};
    sp.token_types = types;
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "token_type[2] is 9");
    sp.token_types = NULL;
    sp.merges = merges;
    sp.n_merges = 2;
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "tokenizer.ggml.merges[1]: \"x\" is not in the vocab");
    sp.merges = merges + 2;
    sp.n_merges = 1;
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "merges[0] is not \"left right\"");
    size_t lens[] = {1, 0, 2};
    sp.merges = merges;
    sp.n_merges = 1;
    sp.token_lens = lens;
    khub__clear(rt);
    ASSERT_STATUS(khub__tokenizer_from_vocab(rt, &sp, &tok), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "has length 0");
    sp.token_lens = NULL;
    ASSERT_OK(khub__tokenizer_from_vocab(rt, &sp, &tok));
    int32_t *ids;
    size_t n;
    ASSERT_OK(khub__tokenizer_encode(tok, "ab", 2, 0, &ids, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(ids[0], 2);
    khub__tokenizer_free_ids(tok, ids, n);
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Speed                                                                    */
/* ------------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* SentencePiece BPE (GGUF "llama")                                         */
/* ------------------------------------------------------------------------ */

/* A small SentencePiece vocab: <unk> <s> </s>, the 256 byte pieces, and
 * pieces whose scores order the merges of "hello". */
#define SPM_N (3 + 256 + 10)
static khub_tokenizer *spm_tok(khub_runtime *rt, int add_space_prefix)
{
    static char bytes[256][8];
    static const char *toks[SPM_N];
    static float scores[SPM_N];
    static int32_t types[SPM_N];
    static const char *const normal[] = {"\xE2\x96\x81", "h",  "e",   "l",     "o",
                                         "ll",           "he", "llo", "hello", "\xE2\x96\x81hello"};
    static const float nscore[] = {-100, -100, -100, -100, -100, -1, -2, -3, -4, -5};
    const char *specials[] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) toks[i] = specials[i], types[i] = i ? 3 : 2;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[3 + b] = bytes[b];
        types[3 + b] = 6;
    }
    for (int i = 0; i < 10; i++)
        toks[259 + i] = normal[i], scores[259 + i] = nscore[i], types[259 + i] = 1;
    khub_tokenizer_spec sp = KHUB_TOKENIZER_SPEC_INIT;
    sp.model = "llama";
    sp.tokens = toks;
    sp.n_tokens = SPM_N;
    sp.token_types = types;
    sp.scores = scores;
    sp.bos_id = 1;
    sp.eos_id = 2;
    sp.unk_id = 0;
    sp.add_bos = 1;
    sp.add_space_prefix = add_space_prefix;
    khub_tokenizer *tok = NULL;
    khub_status st = khub__tokenizer_from_vocab(rt, &sp, &tok);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    return tok;
}

static void spm_expect(khub_tokenizer *tok, const char *text, uint32_t flags, const int32_t *want,
                       size_t n_want, const char *decoded)
{
    int32_t *ids = NULL;
    size_t n = 0;
    ASSERT_OK(khub__tokenizer_encode(tok, text, strlen(text), flags, &ids, &n));
    ASSERT_EQ(n, n_want);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(ids[i], want[i]);
    char *out = NULL;
    size_t len = 0;
    ASSERT_OK(khub__tokenizer_decode(tok, ids, n, 0, &out, &len));
    ASSERT_STR_EQ(out, decoded);
    khub_detok *d = NULL; /* the streaming detokenizer strips the prefix too */
    ASSERT_OK(khub__detok_new(tok, 0, &d));
    const char *piece;
    size_t pl;
    for (size_t i = 0; i < n; i++) ASSERT_OK(khub__detok_push(d, ids[i], &piece, &pl));
    ASSERT_OK(khub__detok_flush(d, &piece, &pl));
    ASSERT_STR_EQ(khub__detok_text(d, NULL), decoded);
    khub__detok_free(d);
    khub__tokenizer_free_text(tok, out, len);
    khub__tokenizer_free_ids(tok, ids, n);
}

/* Merges by score (ll, he, llo, hello, then the prefixed word), byte
 * fallback for a character the vocab lacks, "\u2581" for spaces, the space
 * prefix added and stripped again, bos, and special tokens split out. */
TEST_IMPL(spm_from_vocab_spec)
{
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = spm_tok(rt, 1);
    ASSERT_STR_EQ(khub__tokenizer_pre_name(tok), "spm");
    spm_expect(tok, "hello", 0, (const int32_t[]){268}, 1, "hello");
    spm_expect(tok, "hello", KHUB_TOK_ADD_SPECIAL, (const int32_t[]){1, 268}, 2, "hello");
    /* é is not a piece: its two UTF-8 bytes become <0xC3> <0xA9> */
    spm_expect(tok, "h\xC3\xA9", 0, (const int32_t[]){259, 260, 3 + 0xC3, 3 + 0xA9}, 4,
               "h\xC3\xA9");
    spm_expect(tok, "hello hello", 0, (const int32_t[]){268, 268}, 2, "hello hello");
    spm_expect(tok, "</s>hello", KHUB_TOK_PARSE_SPECIAL, (const int32_t[]){2, 267}, 2, "hello");
    khub__tokenizer_free(tok);

    tok = spm_tok(rt, 0); /* Gemma: no prefix, nothing stripped */
    spm_expect(tok, "hello", 0, (const int32_t[]){267}, 1, "hello");
    spm_expect(tok, " hello", 0, (const int32_t[]){268}, 1, " hello");
    spm_expect(tok, "a b", 0, (const int32_t[]){3 + 'a', 259, 3 + 'b'}, 3, "a b");
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
}

TEST_IMPL(speed_long_prompt)
{
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = load_fixture(rt, "llama3");
    char buf[8192] = "";
    const char *para = "The quick brown fox, who'd jumped 1234 times, isn't tired!\n  ";
    while (strlen(buf) + strlen(para) < sizeof buf) strcat(buf, para);
    int32_t *ids;
    size_t n;
    double t0 = now_s();
    int reps = 20;
    for (int r = 0; r < reps; r++) {
        ASSERT_OK(khub__tokenizer_encode(tok, buf, strlen(buf), 0, &ids, &n));
        if (r + 1 < reps) khub__tokenizer_free_ids(tok, ids, n);
    }
    double per_tok = (now_s() - t0) / reps / (double)n;
    fprintf(stderr, "  %zu bytes -> %zu ids, %.2f us per token\n", strlen(buf), n, per_tok * 1e6);
    ASSERT(n > 512);
    ASSERT_LE(per_tok, 100e-6); /* far below the 1 ms budget even under sanitizers */
    khub__tokenizer_free_ids(tok, ids, n);
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* The real SmolLM2-135M-Instruct tokenizer                                 */
/* ------------------------------------------------------------------------ */

static char model_path[1024], hf_dir[1024];

/* Finds the model files (KHUB_MODEL_DIR or ~/.cache/khub/models); skips
 * the test when they are absent. */
static void need_model(void)
{
    const char *dir = getenv("KHUB_MODEL_DIR");
    char base[900];
    if (dir)
        snprintf(base, sizeof base, "%s", dir);
    else
        snprintf(base, sizeof base, "%s/.cache/khub/models", getenv("HOME") ? getenv("HOME") : "");
    snprintf(model_path, sizeof model_path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", base);
    snprintf(hf_dir, sizeof hf_dir, "%s/SmolLM2-135M-Instruct-hf", base);
    struct stat sb;
    char tj[1100];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", hf_dir);
    if (stat(model_path, &sb) != 0 || stat(tj, &sb) != 0)
        TEST_SKIP("SmolLM2 files not found under %s; run tools/fetch-model.sh --hf", base);
}

static khub_tokenizer *load_real_json(khub_runtime *rt)
{
    char tj[1100];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", hf_dir);
    khub_tokenizer *tok = NULL;
    khub_status st = khub__tokenizer_from_json(rt, tj, &tok);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    return tok;
}

static khub_tokenizer *load_real_gguf(khub_runtime *rt)
{
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open(rt, model_path, &g));
    khub_tokenizer *tok = NULL;
    khub_status st = khub__tokenizer_from_gguf(rt, g, &tok);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    khub__gguf_close(g);
    return tok;
}

TEST_IMPL(smollm2_json_and_gguf_agree)
{
    need_model();
    khub_runtime *rt = new_rt();
    khub_tokenizer *a = load_real_json(rt), *b = load_real_gguf(rt);
    ASSERT_STR_EQ(khub__tokenizer_pre_name(a), "smollm");
    ASSERT_STR_EQ(khub__tokenizer_pre_name(b), "smollm");
    ASSERT_EQ(khub__tokenizer_n_vocab(a), 49152);
    ASSERT_EQ(khub__tokenizer_n_vocab(b), 49152);
    int32_t im_end;
    ASSERT_OK(khub__tokenizer_find(a, "<|im_end|>", 10, &im_end));
    ASSERT_EQ(khub__tokenizer_eos(a), im_end);
    ASSERT(khub__tokenizer_is_eog(b, im_end));
    ASSERT(khub__tokenizer_chat_template(a) && khub__tokenizer_chat_template(b));
    ASSERT_STR_EQ(khub__tokenizer_chat_template(a), khub__tokenizer_chat_template(b));
    char *text = slurp(FIX "/corpus.json", NULL);
    cJSON *c = cJSON_Parse(text);
    int n_strings = 0;
    for (const cJSON *s = cJSON_GetObjectItem(c, "strings")->child; s; s = s->next, n_strings++) {
        const char *str = s->valuestring;
        int32_t *ia, *ib;
        size_t na, nb;
        ASSERT_OK(khub__tokenizer_encode(a, str, strlen(str), KHUB_TOK_PARSE_SPECIAL, &ia, &na));
        ASSERT_OK(khub__tokenizer_encode(b, str, strlen(str), KHUB_TOK_PARSE_SPECIAL, &ib, &nb));
        ASSERT_EQ(na, nb);
        for (size_t i = 0; i < na; i++) ASSERT_EQ(ia[i], ib[i]);
        char *back;
        size_t blen;
        ASSERT_OK(khub__tokenizer_decode(b, ib, nb, KHUB_DETOK_SPECIAL, &back, &blen));
        ASSERT_STR_EQ(back, str);
        khub__tokenizer_free_text(b, back, blen);
        khub__tokenizer_free_ids(a, ia, na);
        khub__tokenizer_free_ids(b, ib, nb);
    }
    ASSERT(n_strings > 200);
    cJSON_Delete(c);
    free(text);
    khub__tokenizer_free(a);
    khub__tokenizer_free(b);
    khub_runtime_free(rt);
}

/* Transformers' ids for the fixtures helper's corpus, from both sources. */
TEST_IMPL(smollm2_transformers_corpus)
{
    need_model();
    const char *path = KHUB_SOURCE_DIR "/tests/fixtures/smollm2_tokenizer_corpus.json";
    char *text = slurp(path, NULL);
    if (!text) TEST_SKIP("%s not found (made by tools/make-reference.py)", path);
    cJSON *c = cJSON_Parse(text);
    ASSERT(c);
    const cJSON *cases = cJSON_IsArray(c) ? c : cJSON_GetObjectItem(c, "cases");
    ASSERT(cJSON_IsArray(cases));
    khub_runtime *rt = new_rt();
    khub_tokenizer *toks[2] = {load_real_json(rt), load_real_gguf(rt)};
    int n = 0, bad = 0;
    for (const cJSON *k = cases->child; k; k = k->next, n++) {
        const cJSON *s = cJSON_GetObjectItem(k, "text"), *ids = cJSON_GetObjectItem(k, "ids");
        ASSERT(cJSON_IsString(s) && cJSON_IsArray(ids));
        for (int t = 0; t < 2; t++)
            bad += check_ids(toks[t], s->valuestring, ids, KHUB_TOK_PARSE_SPECIAL);
    }
    ASSERT(n >= 300);
    ASSERT_EQ(bad, 0);
    khub__tokenizer_free(toks[0]);
    khub__tokenizer_free(toks[1]);
    khub_runtime_free(rt);
    cJSON_Delete(c);
    free(text);
}

/* ------------------------------------------------------------------------ */
/* Chat formatting                                                          */
/* ------------------------------------------------------------------------ */

/* Every rendering of tests/fixtures/tokenizer/chat.json (made by jinja2). */
TEST_IMPL(chat_matches_jinja)
{
    char *text = slurp(FIX "/chat.json", NULL);
    ASSERT(text);
    cJSON *c = cJSON_Parse(text);
    const cJSON *tmpls = cJSON_GetObjectItem(c, "templates");
    const cJSON *convs = cJSON_GetObjectItem(c, "conversations");
    khub_runtime *rt = new_rt();
    int n = 0;
    for (const cJSON *o = cJSON_GetObjectItem(c, "out")->child; o; o = o->next, n++) {
        char key[128], *tn = key, *cn, *gen;
        snprintf(key, sizeof key, "%s", o->string);
        cn = strchr(tn, '/');
        *cn++ = '\0';
        gen = strchr(cn, '/');
        *gen++ = '\0';
        const cJSON *conv = cJSON_GetObjectItem(convs, cn);
        khub_chat_msg msgs[8];
        size_t nm = 0;
        for (const cJSON *m = conv->child; m; m = m->next, nm++) {
            msgs[nm].role = cJSON_GetObjectItem(m, "role")->valuestring;
            msgs[nm].content = cJSON_GetObjectItem(m, "content")->valuestring;
        }
        char *out = NULL;
        khub_status st = khub__chat_format(rt, cJSON_GetObjectItem(tmpls, tn)->valuestring, msgs,
                                           nm, gen[0] == '1', &out);
        if (st) fprintf(stderr, "  %s: %s\n", o->string, khub_runtime_errmsg(rt));
        ASSERT_OK(st);
        if (strcmp(out, o->valuestring) != 0) fprintf(stderr, "  case %s\n", o->string);
        ASSERT_STR_EQ(out, o->valuestring);
        khub__strfree(rt, out);
    }
    ASSERT_EQ(n, 18);
    /* Styles and the default system prompt, read from the templates. */
    khub_chat_style style;
    char *sys = NULL;
    ASSERT_OK(
        khub__chat_detect(rt, cJSON_GetObjectItem(tmpls, "smollm2")->valuestring, &style, &sys));
    ASSERT_EQ(style, KHUB_CHAT_CHATML);
    ASSERT_STR_EQ(sys, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    khub__strfree(rt, sys);
    ASSERT_OK(
        khub__chat_detect(rt, cJSON_GetObjectItem(tmpls, "llama3")->valuestring, &style, &sys));
    ASSERT_EQ(style, KHUB_CHAT_LLAMA3);
    ASSERT(sys == NULL);
    ASSERT_STR_EQ(khub__chat_end_of_turn(style), "<|eot_id|>");
    khub_runtime_free(rt);
    cJSON_Delete(c);
    free(text);
}

TEST_IMPL(chat_refuses)
{
    khub_runtime *rt = new_rt();
    khub_chat_msg msgs[] = {{"user", "hi"}};
    char *out = NULL;
    ASSERT_STATUS(khub__chat_format(rt, NULL, msgs, 1, true, &out), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "no chat template");
    khub__clear(rt);
    ASSERT_STATUS(khub__chat_format(rt,
                                    "{% for m in messages %}[INST] {{ m['content'] }} [/INST]"
                                    "{% endfor %}",
                                    msgs, 1, true, &out),
                  KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "template not recognised (starts \"{% for m in");
    khub__clear(rt);
    /* A ChatML-looking template with reasoning blocks (Qwen3) is refused. */
    ASSERT_STATUS(khub__chat_format(rt,
                                    "{{'<|im_start|>' + message['role'] + '<think>' + "
                                    "'<|im_end|>'}}",
                                    msgs, 1, true, &out),
                  KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "ChatML, Llama-3.0 and Gemma templates only");
    khub__clear(rt);
    khub_chat_msg bad[] = {{"us<er", "hi"}};
    ASSERT_STATUS(khub__chat_format(rt, "x", bad, 1, true, &out), KHUB_STATUS_TOKENIZER);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "message 0 has an empty or invalid role");
    ASSERT(out == NULL);
    khub_runtime_free(rt);
}

/* The real model's template formats, and the prompt encodes to the ids a
 * ChatML prompt must start with. */
TEST_IMPL(smollm2_chat_prompt)
{
    need_model();
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = load_real_gguf(rt);
    khub_chat_msg msgs[] = {{"user", "What is 2+2?"}};
    char *prompt = NULL;
    ASSERT_OK(khub__chat_format(rt, khub__tokenizer_chat_template(tok), msgs, 1, true, &prompt));
    ASSERT_STR_EQ(prompt, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                          "trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?"
                          "<|im_end|>\n<|im_start|>assistant\n");
    int32_t *ids;
    size_t n;
    ASSERT_OK(
        khub__tokenizer_encode(tok, prompt, strlen(prompt), KHUB_TOK_PARSE_SPECIAL, &ids, &n));
    /* tokenizers 0.23 on the model's tokenizer.json, add_special_tokens=False */
    static const int32_t want[] = {1,    9690, 198,   2683, 359,  253,  5356, 5646,  11173, 3365,
                                   3511, 308,  34519, 28,   7018, 411,  407,  19712, 8182,  2,
                                   198,  1,    4093,  198,  1780, 314,  216,  34,    27,    34,
                                   47,   2,    198,   1,    520,  9531, 198};
    ASSERT_EQ(n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < n; i++) ASSERT_EQ(ids[i], want[i]);
    khub__tokenizer_free_ids(tok, ids, n);
    khub__strfree(rt, prompt);
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(corpus_gpt2) \
    X(corpus_smollm) \
    X(corpus_llama3) \
    X(corpus_qwen2) \
    X(corpus_from_vocab_spec) \
    X(special_tokens_and_flags) \
    X(detok_never_splits_utf8) \
    X(invalid_utf8_becomes_fffd) \
    X(detok_matches_decode_on_corpus) \
    X(hostile_json) \
    X(hostile_truncations) \
    X(hostile_spec) \
    X(spm_from_vocab_spec) \
    X(speed_long_prompt) \
    X(smollm2_json_and_gguf_agree) \
    X(smollm2_transformers_corpus) \
    X(chat_matches_jinja) \
    X(chat_refuses) \
    X(smollm2_chat_prompt)
TEST_MAIN(TEST_LIST)
