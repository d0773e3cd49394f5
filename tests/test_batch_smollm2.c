/*
 * test_batch_smollm2.c: continuous batching on SmolLM2-135M-Instruct Q4_1
 * (tools/fetch-model.sh; skipped without it): text prompts, chat and plain,
 * a stop string, streaming; every greedy output equals the same prompt run
 * alone through khub_model_generate, with the default kernels (khub/ref-cpu
 * on the tiny model is test_batch.c: on SmolLM2 it takes minutes), and a
 * batch on the paged cache against solo runs on the dense one. Label slow.
 */
#include <sys/stat.h>

#include "khub/khub_batch.h"
#include "runner.h"

enum { NREQ = 8 };

static khub_batch_result result(void)
{
    return (khub_batch_result){KHUB_STRUCT_INIT(khub_batch_result)};
}

/* ======================================================================== */
/* SmolLM2-135M: text prompts, streaming, stop strings                      */
/* ======================================================================== */

static const char *smollm2_path(void)
{
    static char buf[512];
    const char *d = getenv("KHUB_MODEL_DIR");
    if (d)
        snprintf(buf, sizeof buf, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else
        snprintf(buf, sizeof buf, "%s/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    struct stat sb;
    if (stat(buf, &sb) != 0) TEST_SKIP("%s not found (run tools/fetch-model.sh)", buf);
    return buf;
}

typedef struct streamed {
    char text[NREQ + 1][2048];
    size_t len[NREQ + 1];
} streamed;

static int on_text(void *ud, uint64_t id, const char *text, size_t n)
{
    streamed *s = ud;
    ASSERT(id >= 1 && id <= NREQ && s->len[id] + n < sizeof s->text[0]);
    memcpy(s->text[id] + s->len[id], text, n);
    s->len[id] += n;
    return 0;
}

/* The batch runs on a model loaded with batch_cache (NULL: the same model
 * as the solo runs, the dense default cache); both store K/V as kv_dtype. */
static void check_smollm2(int ref, const char *batch_cache, khub_dtype kv_dtype)
{
    const char *path = smollm2_path();
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    const char *r = ref ? "khub/ref-cpu" : NULL;
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts),
                          .attn_impl = r,
                          .quant = r,
                          .cache_impl = r,
                          .norm_impl = r,
                          .act_impl = r,
                          .rotary_impl = r,
                          .kv_dtype = kv_dtype,
                          .linear_impl = r,
                          .max_seqs = 4,
                          .max_batch = 32,
                          .max_context = 256};
    khub_model *m = NULL, *mb = NULL;
    /* Against a paged batch the solo runs name the dense cache, whatever
     * the default of a model of several sequences is. */
    if (batch_cache && !r) mo.cache_impl = "khub/ref-cpu:kv_cache";
    ASSERT_OK(khub_model_load(rt, path, &mo, &m));
    if (batch_cache) {
        mo.cache_impl = batch_cache;
        ASSERT_OK(khub_model_load(rt, path, &mo, &mb));
        ASSERT_CONTAINS(khub_model_explain(mb), "paged_attention");
    }
    ASSERT_CONTAINS(khub_model_explain(mb ? mb : m), khub_dtype_id_of(kv_dtype) == KHUB_DTYPE_ID_F16
                                                         ? "kv_cache[f16]: "
                                                         : "kv_cache[f32]: ");
    static const char *const prompts[] = {"The capital of France is",
                                          "def fibonacci(n):",
                                          "Once upon a time, in a land far away,",
                                          "List three colours:",
                                          "2 + 2 =",
                                          "Write a haiku about the sea.",
                                          "The quick brown fox",
                                          "Translate to French: good morning"};
    enum { N = NREQ };
    static khub_generate_opts o[N];
    khub_batch_request q[N];
    const char *stops[] = {"."};
    static streamed sv;
    memset(&sv, 0, sizeof sv);
    for (int i = 0; i < N; i++) {
        o[i] = (khub_generate_opts){KHUB_STRUCT_INIT(khub_generate_opts),
                                    .max_new_tokens = 4 + (i * 3) % 12, .chat = i % 2};
        if (i == 2) {
            o[i].stop = stops;
            o[i].n_stop = 1;
        }
        q[i] = (khub_batch_request){KHUB_STRUCT_INIT(khub_batch_request), .prompt = prompts[i],
                                    .opts = &o[i], .on_text = on_text, .ud = &sv};
    }
    khub_batch_result all[N];
    for (int i = 0; i < N; i++) all[i] = result();
    khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = 32};
    ASSERT_OK(khub_generate_batch(mb ? mb : m, q, N, &cfg, all));
    for (int i = 0; i < N; i++) {
        khub_generate_result one = {KHUB_STRUCT_INIT(khub_generate_result)};
        ASSERT_OK(khub_model_generate(m, &prompts[i], 1, &o[i], &one));
        ASSERT_EQ(all[i].status, KHUB_STATUS_OK);
        ASSERT_EQ(all[i].n_prompt_tokens, one.n_prompt_tokens);
        ASSERT_EQ(all[i].stop_reason, one.stop_reason);
        ASSERT_EQ(all[i].n_tokens, one.n_tokens);
        for (int64_t t = 0; t < one.n_tokens; t++)
            if (all[i].tokens[t] != one.tokens[t])
                TEST_FAIL_("prompt %d token %lld: batched %d, alone %d", i, (long long)t,
                           (int)all[i].tokens[t], (int)one.tokens[t]);
        ASSERT_STR_EQ(all[i].text, one.text);
        /* The stream is the text, stop string held back and cut. */
        ASSERT_EQ(sv.len[i + 1], all[i].text_len);
        ASSERT(memcmp(sv.text[i + 1], all[i].text, all[i].text_len) == 0);
        ASSERT(all[i].ttft_ms > 0 && all[i].total_ms >= all[i].ttft_ms);
        khub_generate_results_free(m, &one, 1);
    }
    ASSERT_EQ(all[2].stop_reason, KHUB_STOP_STRING);
    ASSERT(strchr(all[2].text, '.') == NULL);
    khub_batch_results_free(mb ? mb : m, all, N);
    khub_model_free(mb);
    khub_model_free(m);
    khub_runtime_free(rt);
}

TEST_IMPL(batch_smollm2_default_kernels_equal_solo) { check_smollm2(0, NULL, KHUB_DTYPE_F32); }

/* A batch on the paged cache (what `khub run --prompts-file` uses by
 * default) gives every prompt the tokens of its solo run on the dense cache:
 * khub/cpu-avx2's paged and dense attention compute the same bits. */
TEST_IMPL(batch_smollm2_paged_equals_dense_solo)
{
    check_smollm2(0, "khub/ref-cpu:paged_cache", KHUB_DTYPE_F32);
}

/* The same with f16 K/V (`--kv-type f16`, bench-batch's default): a paged
 * f16 batch gives every prompt the tokens of its solo run on the dense f16
 * cache (the guarantee holds per KV type; f16 against f32 is
 * bench-kv-quality's question, docs/caches.md). */
TEST_IMPL(batch_smollm2_f16_paged_equals_f16_dense_solo)
{
    check_smollm2(0, "khub/ref-cpu:paged_cache", KHUB_DTYPE_F16);
}

#define TEST_LIST(X) \
    X(batch_smollm2_default_kernels_equal_solo) \
    X(batch_smollm2_paged_equals_dense_solo) \
    X(batch_smollm2_f16_paged_equals_f16_dense_solo)
TEST_MAIN(TEST_LIST)
