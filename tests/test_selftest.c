/*
 * test_selftest.c: the numeric self-test harness against khub/ref-cpu:
 * every kind passes for the built-in optimized plugins (where the CPU has
 * their features), a deliberately wrong kernel fails with its NMSE in the
 * message, shapes that do not fit the kind are refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runner.h"
#include "selftest.h"

static khub_runtime *runtime_with_builtins(void)
{
    khub_runtime *rt = NULL;
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&o, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    return rt;
}

static int loaded(khub_runtime *rt, const char *id)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++)
        if (strcmp(khub_plugin_id(khub_plugin_at(rt, i)), id) == 0) return 1;
    return 0;
}

TEST_IMPL(ref_against_itself_is_exact)
{
    khub_runtime *rt = runtime_with_builtins();
    khub_selftest_spec s = {"rms_norm", {3, 64}, 2, "f32", 1e-12};
    double e = -1;
    char rep[256];
    ASSERT_OK(khub__selftest_run(rt, "khub/ref-cpu", &s, &e, rep, sizeof rep));
    ASSERT_EQ(e, 0);
    ASSERT_CONTAINS(rep, "rms_norm [3, 64] f32: NMSE 0 <=");
    khub_runtime_free(rt);
}

TEST_IMPL(optimized_plugin_every_kind)
{
    khub_runtime *rt = runtime_with_builtins();
    const char *id = "khub/cpu-avx2";
    if (!loaded(rt, id) ||
        (khub_cpu_features() & (KHUB_CPU_AVX2 | KHUB_CPU_FMA)) != (KHUB_CPU_AVX2 | KHUB_CPU_FMA))
        TEST_SKIP("khub/cpu-avx2 not usable on this CPU");
    const khub_selftest_spec specs[] = {
        {"rms_norm", {5, 576}, 2, "f32", 1e-10},      {"silu_and_mul", {3, 1536}, 2, "f32", 1e-10},
        {"attention", {7, 9, 3, 64}, 4, "f32", 1e-8}, {"linear", {4, 576, 192}, 3, "f32", 1e-10},
        {"linear", {2, 576, 64}, 3, "f16", 1e-8},     {"qlinear", {3, 576, 96}, 3, "q4_1", 1e-3},
        {"qlinear", {1, 576, 96}, 3, "q8_0", 1e-3},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        double e = -1;
        char rep[512];
        khub_status st = khub__selftest_run(rt, id, &specs[i], &e, rep, sizeof rep);
        fprintf(stderr, "  %s\n", rep);
        ASSERT_OK(st);
        ASSERT(e >= 0 && e <= specs[i].tolerance);
    }
    khub_runtime_free(rt);
}

/* A norm kernel that forgets to normalise: y = x * w. */
static const char *bad_src =
    "#include <khub/khub_plugin.h>\n"
    "static khub_status run(void *s, const void *args) { (void)s;\n"
    "  const khub_norm_args *a = args; const float *x = a->x->data, *w = a->weight->data;\n"
    "  float *y = a->y->data; long n = a->x->shape[0], d = a->x->shape[1];\n"
    "  float *r = a->residual ? a->residual->data : 0;\n"
    "  for (long i = 0; i < n * d; i++) { float v = x[i] + (r ? r[i] : 0); if (r) r[i] = v;\n"
    "    y[i] = v * w[i % d]; }\n"
    "  return KHUB_STATUS_OK; }\n"
    "static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = 1,\n"
    "  .dtypes = 1, .flags = KHUB_CAP_RESIDUAL};\n"
    "static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = \"rms_norm\",\n"
    "  .kind = KHUB_OP_NORM, .caps = &caps, .run = run}};\n"
    "static khub_status init(const khub_host_api *h, khub_plugin_desc *o, char *e, size_t n)\n"
    "{ (void)h; (void)e; (void)n; khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),\n"
    "  .id = \"t/badnorm\", .version = \"1.0.0\", .n_ops = 1, .ops = ops};\n"
    "  return khub_plugin_desc_put(o, &d); }\n"
    "KHUB_PLUGIN_DEFINE(init, \"t/badnorm\", \"1.0.0\")\n";

TEST_IMPL(wrong_kernel_fails_with_score)
{
    char dir[] = "/tmp/khub-selftest-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char src[128], so[128], cmd[1024];
    snprintf(src, sizeof src, "%s/bad.c", dir);
    snprintf(so, sizeof so, "%s/bad.so", dir);
    FILE *f = fopen(src, "w");
    fputs(bad_src, f);
    fclose(f);
    snprintf(
        cmd, sizeof cmd,
        "cc -std=gnu11 -shared -fPIC -fvisibility=hidden -DKHUB_PLUGIN_MODULE -I%s/abi %s -o %s",
        KHUB_SOURCE_DIR, src, so);
    if (system(cmd) != 0) TEST_SKIP("no C compiler for the fixture");
    khub_runtime *rt = runtime_with_builtins();
    char hex[65];
    ASSERT_OK(khub__sha256_file_hex(so, hex));
    ASSERT_OK(khub_plugin_load(rt, so, hex, NULL));
    khub_selftest_spec s = {"rms_norm", {4, 128}, 2, "f32", 1e-6};
    char rep[512];
    double e = 0;
    ASSERT_STATUS(khub__selftest_run(rt, "t/badnorm", &s, &e, rep, sizeof rep), KHUB_STATUS_ERROR);
    ASSERT_CONTAINS(rep, "rms_norm [4, 128] f32: NMSE ");
    ASSERT_CONTAINS(rep, "> 1e-06");
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "self-test failed");
    khub_runtime_free(rt);
}

/* Attention that claims strided K/V (KHUB_CAP_STRIDED_KV) but reads K and
 * V as compact [n_kv, n_kv_heads, head_dim] from data (no strides, no byte
 * offset): right on compact inputs, wrong on the cache views generation
 * passes. */
static const char *nostride_src =
    "#include <math.h>\n"
    "#include <khub/khub_plugin.h>\n"
    "static khub_status run(void *s, const void *args) { (void)s;\n"
    "  const khub_attention_args *a = args;\n"
    "  long nq = a->q->shape[0], nh = a->q->shape[1], hd = a->q->shape[2];\n"
    "  long nkv = a->k->shape[0], g = a->k->shape[1];\n"
    "  const float *q = a->q->data, *k = a->k->data, *v = a->v->data;\n"
    "  float *o = a->out->data, w[1024];\n"
    "  if (nkv > 1024) return KHUB_STATUS_UNSUPPORTED;\n"
    "  for (long i = 0; i < nq; i++) for (long h = 0; h < nh; h++) {\n"
    "    long gi = h / (nh / g), last = a->q_pos0 + i; float mx = -1e30f, sum = 0;\n"
    "    for (long j = 0; j <= last; j++) { float d = 0;\n"
    "      for (long e = 0; e < hd; e++) d += q[(i * nh + h) * hd + e] * k[(j * g + gi) * hd + "
    "e];\n"
    "      w[j] = d * a->scale; if (w[j] > mx) mx = w[j]; }\n"
    "    for (long j = 0; j <= last; j++) sum += (w[j] = expf(w[j] - mx));\n"
    "    for (long e = 0; e < hd; e++) { float acc = 0;\n"
    "      for (long j = 0; j <= last; j++) acc += w[j] * v[(j * g + gi) * hd + e];\n"
    "      o[(i * nh + h) * hd + e] = acc / sum; } }\n"
    "  return KHUB_STATUS_OK; }\n"
    "static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = 1,\n"
    "  .dtypes = 1,\n"
    "#ifdef KIND_FLAGS /* ABI 1.3: the claim in the attention kind's own word */\n"
    "  .kind_flags = KHUB_ATTN_CAUSAL | KHUB_ATTN_GQA | KHUB_ATTN_STRIDED_KV};\n"
    "#else\n"
    "  .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_STRIDED_KV};\n"
    "#endif\n"
    "static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = \"attn\",\n"
    "  .kind = KHUB_OP_ATTENTION, .caps = &caps, .run = run}};\n"
    "static khub_status init(const khub_host_api *h, khub_plugin_desc *o, char *e, size_t n)\n"
    "{ (void)h; (void)e; (void)n; khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),\n"
    "  .id = \"t/nostride\", .version = \"1.0.0\", .n_ops = 1, .ops = ops};\n"
    "  return khub_plugin_desc_put(o, &d); }\n"
    "KHUB_PLUGIN_DEFINE(init, \"t/nostride\", \"1.0.0\")\n";

TEST_IMPL(attention_ignoring_strides_fails_on_cache_view)
{
    char dir[] = "/tmp/khub-selftest-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char src[128], so[128], cmd[1024];
    snprintf(src, sizeof src, "%s/nostride.c", dir);
    FILE *f = fopen(src, "w");
    fputs(nostride_src, f);
    fclose(f);
    /* the claim in the 1.0 flags word, then in ABI 1.3's kind_flags */
    for (int v13 = 0; v13 < 2; v13++) {
        snprintf(so, sizeof so, "%s/nostride%d.so", dir, v13);
        snprintf(cmd, sizeof cmd,
                 "cc -std=gnu11 -shared -fPIC -fvisibility=hidden -DKHUB_PLUGIN_MODULE %s -I%s/abi "
                 "%s -o %s -lm",
                 v13 ? "-DKIND_FLAGS" : "", KHUB_SOURCE_DIR, src, so);
        if (system(cmd) != 0) TEST_SKIP("no C compiler for the fixture");
        khub_runtime *rt = runtime_with_builtins();
        char hex[65];
        ASSERT_OK(khub__sha256_file_hex(so, hex));
        ASSERT_OK(khub_plugin_load(rt, so, hex, NULL));
        char rep[512];
        double e = 0;
        /* decode step: one query over 10 keys */
        khub_selftest_spec s = {"attn", {1, 4, 2, 16, 10}, 5, "f32", 1e-8};
        ASSERT_STATUS(khub__selftest_run(rt, "t/nostride", &s, &e, rep, sizeof rep),
                      KHUB_STATUS_ERROR);
        fprintf(stderr, "  %s\n", rep);
        ASSERT_CONTAINS(rep, "attn [1, 4, 2, 16, 10] f32: NMSE ");
        ASSERT_CONTAINS(rep,
                        "> 1e-08 with K/V f32 khub/ref-cpu kv_cache view (strides [16, 256, 1], "
                        "byte offset 0), n_q 1, n_kv 10, head_dim 16");
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), "self-test failed");
        khub_runtime_free(rt);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT(system(cmd) == 0);
}

/* khub/ref-cpu claims every attention layout; against itself each case is
 * exact, and the report counts them. */
TEST_IMPL(attention_runs_every_claimed_layout)
{
    khub_runtime *rt = runtime_with_builtins();
    khub_selftest_spec s = {"attention", {3, 4, 2, 16, 9}, 5, "f32", 0};
    double e = -1;
    char rep[512];
    ASSERT_OK(khub__selftest_run(rt, "khub/ref-cpu", &s, &e, rep, sizeof rep));
    ASSERT_EQ(e, 0);
    /* compact; f32 and f16 x (view, padded, decode, longer chunk); mask;
     * window x 2; softcap (ABI 1.5); odd head dim in f32 and f16 */
    ASSERT_CONTAINS(rep, "attention [3, 4, 2, 16, 9] f32: NMSE 0 <= 0 over 15 layouts");
    khub_runtime_free(rt);
}

/* The built-in attention kernels (plugins/cpu-x86 at each level this CPU
 * runs) on every layout they claim, including an odd head dim: with the
 * sizes of SmolLM2 (9 heads, 3 KV heads, head_dim 64) and a decode step. */
TEST_IMPL(builtin_attention_every_layout)
{
    khub_runtime *rt = runtime_with_builtins();
    static const char *const ids[] = {"khub/cpu-avx2", "khub/cpu-avx512"};
    const khub_selftest_spec specs[] = {
        {"attention", {7, 9, 3, 64, 29}, 5, "f32", 1e-8},
        {"attention", {1, 9, 3, 64, 300}, 5, "f32", 1e-8},
        {"attention", {4, 8, 8, 15, 33}, 5, "f32", 1e-8},
    };
    int ran = 0;
    for (size_t p = 0; p < sizeof ids / sizeof ids[0]; p++) {
        if (!loaded(rt, ids[p])) continue;
        for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
            double e = -1;
            char rep[512];
            khub_status st = khub__selftest_run(rt, ids[p], &specs[i], &e, rep, sizeof rep);
            if (st == KHUB_STATUS_NO_KERNEL) break; /* not usable on this CPU */
            fprintf(stderr, "  %s: %s\n", ids[p], rep);
            ASSERT_OK(st);
            ASSERT_CONTAINS(rep, " layouts");
            ran++;
        }
    }
    if (!ran) TEST_SKIP("no optimized attention usable on this CPU");
    khub_runtime_free(rt);
}

TEST_IMPL(bad_specs)
{
    khub_runtime *rt = runtime_with_builtins();
    char rep[512];
    khub_selftest_spec s1 = {"rms_norm", {4, 5, 6}, 3, "f32", 1e-6};
    ASSERT_STATUS(khub__selftest_run(rt, "khub/ref-cpu", &s1, NULL, rep, sizeof rep),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(rep, "does not fit");
    khub_selftest_spec s2 = {"nope", {4}, 1, "f32", 1e-6};
    ASSERT_STATUS(khub__selftest_run(rt, "khub/ref-cpu", &s2, NULL, rep, sizeof rep),
                  KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(rep, "no op named nope");
    khub_selftest_spec s3 = {"qlinear", {1, 64, 8}, 3, "q9_9", 1e-3};
    ASSERT_STATUS(khub__selftest_run(rt, "khub/ref-cpu", &s3, NULL, rep, sizeof rep),
                  KHUB_STATUS_INVALID_ARG);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(ref_against_itself_is_exact) \
    X(optimized_plugin_every_kind) \
    X(wrong_kernel_fails_with_score) \
    X(attention_ignoring_strides_fails_on_cache_view) \
    X(attention_runs_every_claimed_layout) \
    X(builtin_attention_every_layout) \
    X(bad_specs)
TEST_MAIN(TEST_LIST)
