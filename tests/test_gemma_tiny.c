/*
 * test_gemma_tiny.c: a Gemma3ForCausalLM Hugging Face folder (issue 15)
 * against Transformers, on the tiny random model tools/make-gemma-tiny.py
 * commits (tests/fixtures/gemma3_tiny and gemma3_tiny_reference.json): its
 * config.json (head_dim 256, query_pre_attn_scalar 64, five sliding layers
 * with a 4-token window then a global one, two RoPE bases, (1 + w) norms),
 * its SentencePiece-style tokenizer.json, the logits and greedy tokens, the
 * explain listing, and the tokenizer.json shapes khub refuses. Needs no
 * model download, so it also runs under the sanitizers.
 */
#include <cjson/cJSON.h>
#include <math.h>

#include <unistd.h>

#include "executor.h"
#include "plugins/tp_util.h"
#include "json_fixture.h"
#include "runner.h"
#include "tokenizer.h"

#define FOLDER  KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny"
#define FIXTURE KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny_reference.json"

static cJSON *fixture(void) { return fx_json_file(FIXTURE); }

static khub_runtime *new_rt(void)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    return rt;
}

static khub_model *load(khub_runtime *rt)
{
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts)};
    khub_model *m = NULL;
    khub_status st = khub_model_load(rt, FOLDER, &o, &m);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    return m;
}

/* The folder's config as khub reads it, and the ops it names. */
TEST_IMPL(gemma3_tiny_config_and_explain)
{
    khub_runtime *rt = new_rt();
    khub_model *m = load(rt);
    const khub_model_config *c = &m->cfg;
    ASSERT_EQ(c->arch, KHUB_ARCH_GEMMA3);
    ASSERT_EQ(c->head_dim, 256);
    ASSERT_EQ(c->n_layers, 6);
    ASSERT_EQ(c->sliding_window, 4);
    ASSERT_EQ(c->sliding_pattern, 6);
    ASSERT(fabs(c->attn_scale - 0.125) < 1e-12);
    ASSERT(c->rope_theta == 1000000.0 && c->rope_theta_local == 10000.0);
    ASSERT(c->norm_plus_one && c->post_norms && c->qk_norm && c->tie_word_embeddings);
    ASSERT_EQ(m->layers[0].window, 4);
    ASSERT_EQ(m->layers[5].window, 0); /* the global layer */
    ASSERT_EQ(c->n_eos, 2);
    const char *ex = khub_model_explain(m);
    fprintf(stderr, "%s", ex);
    ASSERT_CONTAINS(ex, "gelu_tanh_and_mul[f32]: ");
    ASSERT(strstr(ex, "silu_and_mul[") == NULL);
    khub_model_info info = {KHUB_STRUCT_INIT(khub_model_info)};
    ASSERT_OK(khub_model_info_get(m, &info));
    ASSERT_STR_EQ(info.arch, "gemma3");
    ASSERT_STR_EQ(info.format, "safetensors");
    khub_model_free(m);
    khub_runtime_free(rt);
}

/* tokenizer.json (SentencePiece-style BPE) gives Transformers' ids and text. */
TEST_IMPL(gemma3_tiny_tokenizer_matches_transformers)
{
    cJSON *fx = fixture();
    khub_runtime *rt = new_rt();
    khub_tokenizer *tok = NULL;
    khub_status st = khub__tokenizer_from_json(rt, FOLDER "/tokenizer.json", &tok);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    ASSERT_STR_EQ(khub__tokenizer_pre_name(tok), "spm");
    ASSERT_EQ(khub__tokenizer_bos(tok), 2);
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "tokenizer"))
    {
        const char *s = cJSON_GetObjectItem(c, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(c, "ids");
        int32_t *ids = NULL;
        size_t k = 0;
        ASSERT_OK(khub__tokenizer_encode(tok, s, strlen(s),
                                         KHUB_TOK_PARSE_SPECIAL | KHUB_TOK_ADD_SPECIAL, &ids, &k));
        bool same = k == (size_t)cJSON_GetArraySize(want);
        for (size_t i = 0; same && i < k; i++)
            same = ids[i] == cJSON_GetArrayItem(want, (int)i)->valueint;
        if (!same) {
            fprintf(stderr, "  ids differ for \"%s\": khub", s);
            for (size_t i = 0; i < k; i++) fprintf(stderr, " %d", ids[i]);
            char *w = cJSON_PrintUnformatted(want);
            fprintf(stderr, ", Transformers %s\n", w);
            free(w);
        }
        ASSERT(same);
        char *txt = NULL;
        size_t tl = 0;
        ASSERT_OK(khub__tokenizer_decode(tok, ids + 1, k - 1, KHUB_DETOK_SPECIAL, &txt, &tl));
        ASSERT_STR_EQ(txt, cJSON_GetObjectItem(c, "decoded")->valuestring);
        khub__tokenizer_free_text(tok, txt, tl);
        khub__tokenizer_free_ids(tok, ids, k);
        n++;
    }
    ASSERT(n >= 10);
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
    cJSON_Delete(fx);
}

static int32_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* Whole last-position logits within 1e-4 of max|logit| (f32 weights; the
 * issue's bound is 1e-3), and the greedy
 * tokens (KV cache, EOS not special) equal, on every prompt. */
TEST_IMPL(gemma3_tiny_matches_transformers)
{
    cJSON *fx = fixture();
    khub_runtime *rt = new_rt();
    khub_model *m = load(rt);
    int64_t V = m->cfg.vocab_size;
    float *got = malloc((size_t)V * sizeof *got);
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "cases"))
    {
        const cJSON *in = cJSON_GetObjectItem(c, "input_ids");
        const cJSON *want = cJSON_GetObjectItem(c, "logits");
        ASSERT_EQ(cJSON_GetArraySize(want), V);
        int64_t n = cJSON_GetArraySize(in);
        int32_t ids[512];
        ASSERT(n + 64 <= 512);
        for (int64_t i = 0; i < n; i++) ids[i] = cJSON_GetArrayItem(in, (int)i)->valueint;
        ASSERT_OK(khub_model_logits(m, ids, (size_t)n, got));
        double err = 0, max_abs = cJSON_GetObjectItem(c, "max_abs")->valuedouble;
        for (int64_t v = 0; v < V; v++) {
            double e = fabs((double)got[v] - cJSON_GetArrayItem(want, (int)v)->valuedouble);
            err = e > err ? e : err;
        }
        err /= max_abs;
        /* greedy with the cache: prefill, then one token at a time */
        const cJSON *g = cJSON_GetObjectItem(c, "greedy_ids");
        int steps = cJSON_GetArraySize(g), equal = 0;
        ASSERT_OK(khub__forward_reset(m, 0));
        khub__seg seg = {0, 0, 0, n};
        ASSERT_OK(khub__forward(m, ids, &seg, 1));
        for (int s = 0; s < steps; s++) {
            ids[n + s] = argmax(m->logits, V);
            if (ids[n + s] != cJSON_GetArrayItem(g, s)->valueint) break;
            equal++;
            seg = (khub__seg){0, 0, n + s, 1};
            if (s + 1 < steps) ASSERT_OK(khub__forward(m, &ids[n + s], &seg, 1));
        }
        fprintf(stderr, "  %-10s %3lld tokens: logits max rel err %.2e, greedy equal %d of %d\n",
                cJSON_GetObjectItem(c, "name")->valuestring, (long long)n, err, equal, steps);
        ASSERT_LE(err, 1e-4);
        ASSERT_EQ(equal, steps);
        n_cases++;
    }
    ASSERT(n_cases >= 4);
    free(got);
    khub_model_free(m);
    khub_runtime_free(rt);
    cJSON_Delete(fx);
}

/* tokenizer.json shapes around the SentencePiece-style one that khub would
 * tokenize differently from Transformers: refused, naming the field. */
TEST_IMPL(gemma3_tokenizer_json_refusals)
{
#define DEC_OK \
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{" \
    "\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}"
#define NORM_OK \
    "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}"
#define MODEL(bf) \
    "\"model\":{\"type\":\"BPE\",\"byte_fallback\":" bf ",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}," \
    "\"merges\":[\"a b\"]}"
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{" NORM_OK "," DEC_OK "," MODEL("false") "}",
         "tokenizer.json: model.byte_fallback is false; khub's SentencePiece-style BPE"},
        {"{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\","
         "\"prepend\":\"\\u2581\"}]}," DEC_OK "," MODEL("true") "}",
         "tokenizer.json: normalizer \"Sequence\" is not supported (supported: none"},
        {"{" NORM_OK ",\"pre_tokenizer\":{\"type\":\"Metaspace\"}," DEC_OK "," MODEL("true") "}",
         "tokenizer.json: pre_tokenizer \"Metaspace\" is set with a \"\u2581\" normalizer"},
        {"{" NORM_OK ",\"decoder\":{\"type\":\"ByteLevel\"}," MODEL("true") "}",
         "tokenizer.json: decoder is not Sequence [Replace"},
        {"{" NORM_OK "," DEC_OK ",\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}",
         "tokenizer.json: model.unk_id is missing or not an index of model.vocab (1 pieces)"},
    };
    khub_runtime *rt = new_rt();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        khub_tokenizer *tok = NULL;
        khub_status st =
            khub__tokenizer_from_json_mem(rt, cases[i].json, strlen(cases[i].json), NULL, 0, &tok);
        if (st != KHUB_STATUS_TOKENIZER || !strstr(khub_runtime_errmsg(rt), cases[i].msg))
            fprintf(stderr, "  case %zu: %s: %s\n", i, khub_status_name(st),
                    khub_runtime_errmsg(rt));
        ASSERT_STATUS(st, KHUB_STATUS_TOKENIZER);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), cases[i].msg);
        ASSERT(tok == NULL);
        khub__clear(rt);
    }
    /* the accepted shapes load (Transformers' Gemma conversion adds a Split
     * on " ", a no-op after the normalizer), merging by the listed merge */
    const char *split = "{" NORM_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{"
                        "\"String\":\" \"},\"behavior\":\"MergedWithPrevious\",\"invert\":"
                        "false}," DEC_OK "," MODEL("true") "}";
    khub_tokenizer *tok = NULL;
    ASSERT_OK(khub__tokenizer_from_json_mem(rt, split, strlen(split), NULL, 0, &tok));
    khub__tokenizer_free(tok);
    const char *ok = "{" NORM_OK "," DEC_OK "," MODEL("true") "}";
    tok = NULL;
    ASSERT_OK(khub__tokenizer_from_json_mem(rt, ok, strlen(ok), NULL, 0, &tok));
    int32_t *ids = NULL;
    size_t k = 0;
    ASSERT_OK(khub__tokenizer_encode(tok, "aba", 3, 0, &ids, &k));
    ASSERT_EQ(k, 2);
    ASSERT_EQ(ids[0], 2);
    ASSERT_EQ(ids[1], 0);
    khub__tokenizer_free_ids(tok, ids, k);
    khub__tokenizer_free(tok);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* Logit soft-capping (Gemma 2's knobs on the tiny Gemma 3)                 */
/* ------------------------------------------------------------------------ */

#define SOFTCAP_FIXTURE KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny_softcap_reference.json"

static const char *const softcap_files[] = {"model.safetensors", "tokenizer.json",
                                            "tokenizer_config.json", "generation_config.json"};

/* A copy of the tiny folder in dir (weights and tokenizer linked) whose
 * config.json carries the fixture's two soft-caps. */
static void softcap_folder(char *dir, const cJSON *caps)
{
    ASSERT(mkdtemp(dir) != NULL);
    char from[512], to[512];
    for (size_t i = 0; i < sizeof softcap_files / sizeof softcap_files[0]; i++) {
        snprintf(from, sizeof from, "%s/%s", FOLDER, softcap_files[i]);
        snprintf(to, sizeof to, "%s/%s", dir, softcap_files[i]);
        ASSERT(symlink(from, to) == 0);
    }
    cJSON *cfg = fx_json_file(FOLDER "/config.json");
    const cJSON *c;
    cJSON_ArrayForEach(c, caps)
    {
        cJSON_DeleteItemFromObject(cfg, c->string);
        cJSON_AddNumberToObject(cfg, c->string, c->valuedouble);
    }
    char *text = cJSON_Print(cfg);
    snprintf(to, sizeof to, "%s/config.json", dir);
    FILE *f = fopen(to, "w");
    ASSERT(f != NULL);
    ASSERT(fputs(text, f) >= 0);
    ASSERT(fclose(f) == 0);
    free(text);
    cJSON_Delete(cfg);
}

static void softcap_folder_free(const char *dir)
{
    char path[512];
    for (size_t i = 0; i < sizeof softcap_files / sizeof softcap_files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, softcap_files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* One case: khub's last-position logits against the fixture's (the largest
 * error, and how far the attention cap alone moves the reference, both over
 * max|logit|) and
 * the greedy tokens with the cache; returns the tokens equal. */
static int softcap_case(khub_model *m, const cJSON *c, float *got, double *err, double *moved)
{
    int64_t V = m->cfg.vocab_size;
    const cJSON *in = cJSON_GetObjectItem(c, "input_ids");
    const cJSON *want = cJSON_GetObjectItem(c, "logits");
    const cJSON *plain = cJSON_GetObjectItem(c, "uncapped_logits");
    ASSERT_EQ(cJSON_GetArraySize(want), V);
    int64_t n = cJSON_GetArraySize(in);
    int32_t ids[512];
    ASSERT(n + 64 <= 512);
    for (int64_t i = 0; i < n; i++) ids[i] = cJSON_GetArrayItem(in, (int)i)->valueint;
    ASSERT_OK(khub_model_logits(m, ids, (size_t)n, got));
    double max_abs = cJSON_GetObjectItem(c, "max_abs")->valuedouble;
    double fcap = m->cfg.final_softcap;
    *err = *moved = 0;
    for (int64_t v = 0; v < V; v++) {
        double w = cJSON_GetArrayItem(want, (int)v)->valuedouble;
        double u = cJSON_GetArrayItem(plain, (int)v)->valuedouble;
        double e = fabs((double)got[v] - w) / max_abs;
        /* how far the reference is from the uncapped logits with only the
         * head's cap: what the attention cap alone moves */
        double d = fabs(fcap * tanh(u / fcap) - w) / max_abs;
        *err = e > *err ? e : *err;
        *moved = d > *moved ? d : *moved;
    }
    const cJSON *g = cJSON_GetObjectItem(c, "greedy_ids");
    int steps = cJSON_GetArraySize(g), equal = 0;
    ASSERT_OK(khub__forward_reset(m, 0));
    khub__seg seg = {0, 0, 0, n};
    ASSERT_OK(khub__forward(m, ids, &seg, 1));
    for (int s = 0; s < steps; s++) {
        ids[n + s] = argmax(m->logits, V);
        if (ids[n + s] != cJSON_GetArrayItem(g, s)->valueint) break;
        equal++;
        seg = (khub__seg){0, 0, n + s, 1};
        if (s + 1 < steps) ASSERT_OK(khub__forward(m, &ids[n + s], &seg, 1));
    }
    return equal;
}

/* One load of the capped folder with attention and cache preferences, over
 * every case: logits within 1e-4 of max|logit|, greedy tokens equal. */
static void softcap_run(const char *dir, const cJSON *fx, const char *attn, const char *cache,
                        const char *want_attn)
{
    khub_runtime *rt = new_rt();
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts), .attn_impl = attn, .cache_impl = cache};
    khub_model *m = NULL;
    khub_status st = khub_model_load(rt, dir, &o, &m);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(rt));
    ASSERT_OK(st);
    ASSERT(m->cfg.attn_softcap == 1.0 && m->cfg.final_softcap == 1.5);
    ASSERT_CONTAINS(khub_model_explain(m), want_attn);
    float *got = malloc((size_t)m->cfg.vocab_size * sizeof *got);
    int n_cases = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "cases"))
    {
        double err, moved;
        int equal = softcap_case(m, c, got, &err, &moved);
        int steps = cJSON_GetArraySize(cJSON_GetObjectItem(c, "greedy_ids"));
        fprintf(stderr,
                "  %s %-10s logits max rel err %.2e (the attention cap moves them %.2f), greedy "
                "equal "
                "%d of %d\n",
                want_attn, cJSON_GetObjectItem(c, "name")->valuestring, err, moved, equal, steps);
        ASSERT(moved > 0.1); /* the attention cap matters: a run without it fails */
        ASSERT_LE(err, 1e-4);
        ASSERT_EQ(equal, steps);
        n_cases++;
    }
    ASSERT(n_cases >= 4);
    free(got);
    khub_model_free(m);
    khub_runtime_free(rt);
}

/* attn_logit_softcapping and final_logit_softcapping set on the tiny model
 * (tools/make-gemma-softcap.py): Transformers' eager attention caps the
 * scaled scores, the head caps the logits. khub matches it through the
 * attention ops that declare the capability: the best ranked (cpu-x86's
 * where the CPU has AVX2, else the reference), the reference's, and the
 * paged_attention of each with a paged cache. */
TEST_IMPL(gemma3_tiny_softcap_matches_transformers)
{
    cJSON *fx = fx_json_file(SOFTCAP_FIXTURE);
    char dir[] = "/tmp/khub-softcap-XXXXXX";
    softcap_folder(dir, cJSON_GetObjectItem(fx, "config"));
    softcap_run(dir, fx, NULL, NULL, "attention[f32]: ");
    softcap_run(dir, fx, "khub/ref-cpu", NULL, "attention[f32]: khub/ref-cpu ");
    softcap_run(dir, fx, "khub/ref-cpu", "khub/ref-cpu:paged_cache",
                "paged_attention[f32]: khub/ref-cpu ");
    softcap_run(dir, fx, NULL, "khub/ref-cpu:paged_cache", "paged_attention[f32]: ");
    softcap_folder_free(dir);
    cJSON_Delete(fx);
}

/* A capped model and an attention op without the capability (a 1.4 plugin,
 * which cannot have it): with strict selection the load fails naming the
 * missing flag; without, the registry falls back to an op that caps and
 * explain's trace says why the preferred one was passed over. The same op
 * serves the uncapped folder. */
TEST_IMPL(gemma3_tiny_softcap_needs_the_capability)
{
    cJSON *fx = fx_json_file(SOFTCAP_FIXTURE);
    char dir[] = "/tmp/khub-softcap-XXXXXX";
    softcap_folder(dir, cJSON_GetObjectItem(fx, "config"));
    khub_runtime *rt = new_rt();
    ASSERT_OK(khub_plugin_load_builtin(rt));
    (void)tp_load(rt, "softcap_1_4");
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts), .attn_impl = "khub-test/softcap-1-4"};
    khub_model *m = NULL;
    ASSERT_OK(khub_runtime_set_option(rt, KHUB_OPT_STRICT, 1));
    ASSERT_STATUS(khub_model_load(rt, dir, &o, &m), KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "preferred khub-test/softcap-1-4 for attention is rejected: missing flag "
                    "softcap, and KHUB_OPT_STRICT forbids falling back to");
    ASSERT(m == NULL);
    ASSERT_OK(khub_runtime_set_option(rt, KHUB_OPT_STRICT, 0));
    ASSERT_OK(khub_model_load(rt, dir, &o, &m));
    const char *ex = khub_model_explain(m);
    fprintf(stderr, "%s", ex);
    ASSERT_CONTAINS(ex, "reject khub-test/softcap-1-4 1.0.0 :: attn: missing flag softcap");
    khub_model_free(m);
    m = NULL;
    ASSERT_OK(khub_runtime_set_option(rt, KHUB_OPT_STRICT, 1));
    ASSERT_OK(khub_model_load(rt, FOLDER, &o, &m));
    ASSERT_CONTAINS(khub_model_explain(m), "attention[f32]: khub-test/softcap-1-4 1.0.0 :: attn");
    khub_model_free(m);
    khub_runtime_free(rt);
    softcap_folder_free(dir);
    cJSON_Delete(fx);
}

#define TEST_LIST(X) \
    X(gemma3_tiny_config_and_explain) \
    X(gemma3_tiny_tokenizer_matches_transformers) \
    X(gemma3_tiny_matches_transformers) \
    X(gemma3_tokenizer_json_refusals) \
    X(gemma3_tiny_softcap_matches_transformers) \
    X(gemma3_tiny_softcap_needs_the_capability)
TEST_MAIN(TEST_LIST)
