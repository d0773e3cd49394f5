/*
 * test_logits_all.c: khub_model_logits_all (issue 17: perplexity on every
 * position of a text in one prefill) on the tiny random Gemma 3 folder
 * (tests/fixtures/gemma3_tiny, no download, so it also runs under the
 * sanitizers):
 *   - the last row against Transformers' last-position logits
 *     (gemma3_tiny_reference.json; the fixtures hold no other row);
 *   - every row i against khub_model_logits on the prefix ids[0..i], itself
 *     checked against Transformers elsewhere, so a wrong row, a row shifted
 *     by one, or a chunk boundary that drops the KV cache fails;
 *   - the same with prefill chunks of 3 tokens (max_batch 3);
 *   - errors: a text over the KV capacity (CONTEXT_FULL) and an id outside
 *     the vocabulary (INVALID_ARG), with their messages.
 * The tensor-parallel path (rank 0 drives, the others follow) is in
 * test_tp's check_matches.
 */
#include <cjson/cJSON.h>
#include <math.h>

#include "khub/khub_model.h"
#include "json_fixture.h"
#include "runner.h"

#define FOLDER  KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny"
#define FIXTURE KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny_reference.json"

static cJSON *fixture(void) { return fx_json_file(FIXTURE); }

static khub_model *load(khub_runtime **rt, int32_t max_batch, int64_t max_context)
{
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&ro, rt));
    ASSERT_OK(khub_plugin_load_builtin(*rt));
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts), .max_batch = max_batch,
                         .max_context = max_context, .max_seqs = 1};
    khub_model *m = NULL;
    khub_status st = khub_model_load(*rt, FOLDER, &o, &m);
    if (st) fprintf(stderr, "  %s\n", khub_runtime_errmsg(*rt));
    ASSERT_OK(st);
    return m;
}

/* max|a - b| / max|b| over n values. */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        num = d > num ? d : num;
        den = fabs((double)b[i]) > den ? fabs((double)b[i]) : den;
    }
    return den > 0 ? num / den : num;
}

/* Every fixture case: the last row against Transformers within 1e-4 of
 * max|logit| (test_gemma_tiny's bound for khub_model_logits), every row
 * against the prefix's khub_model_logits within 1e-5. */
static void check_cases(int32_t max_batch)
{
    cJSON *fx = fixture();
    khub_runtime *rt = NULL;
    khub_model *m = load(&rt, max_batch, 0);
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    ASSERT_OK(khub_model_info_get(m, &info));
    int64_t V = info.vocab;
    int cases = 0, rows = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(fx, "cases"))
    {
        const cJSON *in = cJSON_GetObjectItem(c, "input_ids");
        const cJSON *want = cJSON_GetObjectItem(c, "logits");
        int n = cJSON_GetArraySize(in);
        ASSERT(n >= 1 && n <= 512);
        int32_t ids[512];
        for (int i = 0; i < n; i++) ids[i] = cJSON_GetArrayItem(in, i)->valueint;
        float *all = malloc((size_t)n * (size_t)V * sizeof *all);
        float *one = malloc((size_t)V * sizeof *one), *ref = malloc((size_t)V * sizeof *ref);
        ASSERT(all && one && ref);
        for (int64_t v = 0; v < V; v++)
            ref[v] = (float)cJSON_GetArrayItem(want, (int)v)->valuedouble;
        ASSERT_OK(khub_model_logits_all(m, ids, (size_t)n, all));
        double hf = rel_err(all + (size_t)(n - 1) * (size_t)V, ref, V), worst = 0;
        for (int i = 0; i < n; i++) {
            ASSERT_OK(khub_model_logits(m, ids, (size_t)i + 1, one));
            double e = rel_err(all + (size_t)i * (size_t)V, one, V);
            worst = e > worst ? e : worst;
            rows++;
        }
        fprintf(stderr,
                "  max_batch %d, %-10s %3d rows: last row vs Transformers %.2e, rows vs "
                "prefix logits max %.2e\n",
                (int)max_batch, cJSON_GetObjectItem(c, "name")->valuestring, n, hf, worst);
        ASSERT_LE(hf, 1e-4);
        ASSERT_LE(worst, 1e-5);
        free(all), free(one), free(ref);
        cases++;
    }
    ASSERT(cases >= 4 && rows > cases);
    khub_model_free(m);
    khub_runtime_free(rt);
    cJSON_Delete(fx);
}

TEST_IMPL(logits_all_rows_match_prefixes_and_transformers) { check_cases(0); }

/* Chunks of 3 tokens: rows after the first chunk see the cache. */
TEST_IMPL(logits_all_chunked_prefill) { check_cases(3); }

TEST_IMPL(logits_all_errors)
{
    khub_runtime *rt = NULL;
    khub_model *m = load(&rt, 0, 8);
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    ASSERT_OK(khub_model_info_get(m, &info));
    ASSERT_EQ(info.max_context, 8);
    int32_t ids[9] = {2, 553, 424, 376, 451, 2, 553, 424, 376};
    float *out = malloc(9 * (size_t)info.vocab * sizeof *out);
    ASSERT(out != NULL);
    ASSERT_STATUS(khub_model_logits_all(m, ids, 9, out), KHUB_STATUS_CONTEXT_FULL);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), "khub_model_logits_all: 9 tokens, the KV cache holds 8");
    ids[1] = info.vocab;
    char want[160];
    snprintf(want, sizeof want, "token id %d at position 1 is outside the vocabulary [0, %d)",
             (int)info.vocab, (int)info.vocab);
    ASSERT_STATUS(khub_model_logits_all(m, ids, 4, out), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), want);
    /* The model still works after both. */
    ids[1] = 553;
    ASSERT_OK(khub_model_logits_all(m, ids, 8, out));
#ifdef NDEBUG /* KHUB_API_CHECK asserts in debug builds */
    ASSERT_STATUS(khub_model_logits_all(m, ids, 0, out), KHUB_STATUS_MISUSE);
    ASSERT_STATUS(khub_model_logits_all(m, NULL, 4, out), KHUB_STATUS_MISUSE);
    ASSERT_STATUS(khub_model_logits_all(m, ids, 4, NULL), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "khub_model_logits_all: misuse: m && ids && out && n > 0");
#endif
    free(out);
    khub_model_free(m);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(logits_all_rows_match_prefixes_and_transformers) \
    X(logits_all_chunked_prefill) \
    X(logits_all_errors)
TEST_MAIN(TEST_LIST)
