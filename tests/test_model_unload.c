/*
 * test_model_unload.c: a model's op bindings are the model's. khub_model_free
 * drops them from the runtime, so a plugin that served only freed models can
 * be unloaded (khub_plugin_unload answers OK and the plugin count falls),
 * while one that another live model or a caller's khub_registry_select
 * binding uses answers BUSY with a message that says which. On the tiny
 * Gemma 3 fixture (tests/fixtures/gemma3_tiny, no download) with the test
 * plugin khub-test/paged-attn serving the paged cache's attention.
 */
#include <stdio.h>
#include <string.h>

#include "khub/khub_check.h"
#include "khub/khub_model.h"
#include "plugins/tp_util.h"
#include "runner.h"

#define PA "khub-test/paged-attn 1.0.0"
#define MODELS_BUSY(N) \
    "unload " PA ": " #N " binding(s) of loaded models use it; free those models or swap it " \
    "out of them (khub_model_kernel_swap), or reload it instead"

static khub_runtime *runtime_with_builtins(void)
{
    khub_runtime *rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(rt));
    return rt;
}

/* The fixture with its attention (the paged cache's) served by
 * khub-test/paged-attn, which must be loaded. */
static khub_model *load_model(khub_runtime *rt)
{
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts), .max_context = 64, .max_seqs = 2,
                          .cache_impl = "khub/ref-cpu:paged_cache",
                          .attn_impl = "khub-test/paged-attn"};
    khub_model *m = NULL;
    ASSERT_OK(khub_model_load(rt, KHUB_SOURCE_DIR "/tests/fixtures/gemma3_tiny", &mo, &m));
    khub_model_binding b = {KHUB_APP_INIT(khub_model_binding)};
    bool found = false;
    for (size_t i = 0; !found && khub_model_binding_get(m, i, &b) == KHUB_STATUS_OK; i++)
        found = !strcmp(b.role, "paged_attention");
    ASSERT(found);
    ASSERT_STR_EQ(b.kernel, PA " :: paged_attention");
    return m;
}

/* 4 greedy tokens: the model still runs on its plugin. */
static void generate(khub_model *m)
{
    const char *prompt[] = {"Sliding window attention"};
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 4,
                             .ignore_eos = 1};
    khub_generate_result res = {KHUB_APP_INIT(khub_generate_result)};
    ASSERT_OK(khub_model_generate(m, prompt, 1, &go, &res));
    ASSERT_EQ(res.n_tokens, 4);
    khub_generate_results_free(m, &res, 1);
}

/* One model: once it is freed, its plugin unloads. */
TEST_IMPL(model_free_lets_its_plugin_unload)
{
    khub_runtime *rt = runtime_with_builtins();
    khub_plugin *pa = tp_load(rt, "paged_attn");
    size_t n = khub_plugin_count(rt);
    khub_model *m = load_model(rt);
    generate(m);
    ASSERT_STATUS(khub_plugin_unload(rt, pa), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), MODELS_BUSY(1));
    ASSERT_EQ(khub_plugin_count(rt), n);
    khub_model_free(m);
    ASSERT_OK(khub_plugin_unload(rt, pa));
    ASSERT_EQ(khub_plugin_count(rt), n - 1);
    /* loaded and freed again and again: nothing piles up */
    for (int i = 0; i < 3; i++) {
        pa = tp_load(rt, "paged_attn");
        khub_model_free(load_model(rt));
        ASSERT_OK(khub_plugin_unload(rt, pa));
        ASSERT_EQ(khub_plugin_count(rt), n - 1);
    }
    khub_runtime_free(rt);
}

/* Two models share the plugin: freeing one leaves the other's bindings
 * (BUSY, counted), and the other keeps running; freeing both frees it. */
TEST_IMPL(model_free_keeps_another_models_bindings)
{
    khub_runtime *rt = runtime_with_builtins();
    khub_plugin *pa = tp_load(rt, "paged_attn");
    size_t n = khub_plugin_count(rt);
    khub_model *a = load_model(rt), *b = load_model(rt);
    ASSERT_STATUS(khub_plugin_unload(rt, pa), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), MODELS_BUSY(2));
    khub_model_free(a);
    ASSERT_STATUS(khub_plugin_unload(rt, pa), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt), MODELS_BUSY(1));
    ASSERT_EQ(khub_plugin_count(rt), n);
    generate(b);
    khub_model_free(b);
    ASSERT_OK(khub_plugin_unload(rt, pa));
    ASSERT_EQ(khub_plugin_count(rt), n - 1);
    khub_runtime_free(rt);
}

/* A binding the caller selected is the caller's until khub_runtime_free:
 * freeing a model leaves it, and the message says so. */
TEST_IMPL(model_free_keeps_the_callers_bindings)
{
    khub_runtime *rt = runtime_with_builtins();
    khub_plugin *pa = tp_load(rt, "paged_attn");
    khub_op_query q = {KHUB_APP_INIT(khub_op_query), .kind = KHUB_OP_PAGED_ATTENTION,
                       .dtype_id = -1, .plugin_id = "khub-test/paged-attn"};
    khub_binding *mine = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &mine));
    ASSERT_STR_EQ(khub_binding_name(mine), PA " :: paged_attention");
    khub_model *m = load_model(rt);
    ASSERT_STATUS(khub_plugin_unload(rt, pa), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "unload " PA ": 2 binding(s) use it, 1 from khub_registry_select, which last "
                  "until khub_runtime_free; reload it instead, or free the runtime");
    khub_model_free(m);
    ASSERT_STATUS(khub_plugin_unload(rt, pa), KHUB_STATUS_BUSY);
    ASSERT_STR_EQ(khub_runtime_errmsg(rt),
                  "unload " PA ": 1 binding(s) use it, 1 from khub_registry_select, which last "
                  "until khub_runtime_free; reload it instead, or free the runtime");
    ASSERT_STR_EQ(khub_binding_name(mine), PA " :: paged_attention"); /* still valid */
    khub_runtime_free(rt);
}

/* A numeric self-test's bindings end with it (selftest.c): a plugin that
 * was only self-tested or timed (khub_op_bench, khub check, a kernel
 * swap's prepare) unloads, where they stayed the caller's until
 * khub_runtime_free. Here khub/ref-cpu's rms_norm is timed against itself
 * (the plugin under test and the reference), then ref-cpu unloads. */
TEST_IMPL(selftest_bindings_end_with_the_selftest)
{
    khub_runtime *rt = runtime_with_builtins();
    const size_t n = khub_plugin_count(rt);
    khub_plugin *ref = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(khub_plugin_id(khub_plugin_at(rt, i)), "khub/ref-cpu"))
            ref = (khub_plugin *)khub_plugin_at(rt, i);
    ASSERT(ref != NULL);
    khub_op_test t = {KHUB_APP_INIT(khub_op_test),
                      .op = "rms_norm",
                      .ndim = 2,
                      .shape = {4, 64},
                      .dtype = "f32",
                      .tolerance = 1e-6};
    khub_op_bench_result r = {KHUB_APP_INIT(khub_op_bench_result)};
    ASSERT_OK(khub_op_bench(rt, "khub/ref-cpu", &t, 0.01, &r));
    ASSERT(r.us > 0 && r.ref_us > 0);
    ASSERT_OK(khub_plugin_unload(rt, ref));
    ASSERT_EQ(khub_plugin_count(rt), n - 1);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(model_free_lets_its_plugin_unload) \
    X(model_free_keeps_another_models_bindings) \
    X(model_free_keeps_the_callers_bindings) \
    X(selftest_bindings_end_with_the_selftest)
TEST_MAIN(TEST_LIST)
