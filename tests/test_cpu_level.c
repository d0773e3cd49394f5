/* test_cpu_level.c: KHUB_CPU_LEVEL (runtime/device/cpu.c) caps the features khub
 * uses at a level, only ever removing: khub_cpu_features(), the runtime's
 * features and host table, and the registry's choice among the built-in
 * plugins follow it; an unknown value is refused by khub_runtime_new.
 * Each case runs in its own child, so setenv does not leak between them. */
#include <stdlib.h>

#include "runner.h"
#include "runtime_impl.h"

#define AVX2_SET \
    (KHUB_CPU_SSE42 | KHUB_CPU_AVX | KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C | KHUB_CPU_BMI2)
#define AVX512_PLUGIN_NEEDS \
    (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C | KHUB_CPU_AVX512F | KHUB_CPU_AVX512VNNI)

static uint32_t at_level(const char *level)
{
    if (level)
        setenv("KHUB_CPU_LEVEL", level, 1);
    else
        unsetenv("KHUB_CPU_LEVEL");
    return khub_cpu_features();
}

static const char *feature(const khub_runtime *rt, const char *name)
{
    const khub_feature *f = NULL;
    size_t n = 0;
    ASSERT_OK(khub_runtime_features(rt, &f, &n));
    for (size_t i = 0; i < n; i++)
        if (!strcmp(f[i].name, name)) return f[i].value;
    return NULL;
}

TEST_IMPL(levels_mask_and_never_add)
{
    uint32_t host = khub__cpu_features_host();
    ASSERT_EQ(at_level(NULL), host);
    ASSERT_EQ(at_level(""), host);
    ASSERT_EQ(at_level("native"), host);
    ASSERT_EQ(at_level("avx512"), host);
    ASSERT_EQ(at_level("avx2"), host & AVX2_SET);
    ASSERT_EQ(at_level("x86-64"), 0);
    ASSERT_EQ(at_level("generic"), 0);
    /* a level above the CPU's reports the CPU's: nothing is added */
    static const char *const all[] = {"x86-64", "generic", "avx2", "avx512", "native"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ASSERT_EQ(at_level(all[i]) & ~host, 0);
    /* the mask reaches what plugins are told, from the first call on */
    ASSERT_EQ(at_level("avx2") & KHUB_CPU_AVX512F, 0);
    ASSERT_STR_EQ(khub__cpu_level_of(at_level("avx2")),
                  (host & (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C)) ==
                          (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C)
                      ? "avx2"
                      : "x86-64");
    ASSERT_STR_EQ(khub__cpu_level_of(at_level("x86-64")), "x86-64");
}

TEST_IMPL(unknown_level_is_refused)
{
    char err[160];
    setenv("KHUB_CPU_LEVEL", "avx-512", 1);
    ASSERT_EQ(khub__cpu_level_check(err, sizeof err), -1);
    ASSERT_STR_EQ(err, "KHUB_CPU_LEVEL=avx-512 is not a CPU level; use x86-64 (alias generic), "
                       "avx2, avx512 or native, or unset it");
    ASSERT_EQ(khub_cpu_features(), 0); /* removing is the safe reading */
    khub_runtime *rt = (khub_runtime *)1;
    ASSERT_STATUS(khub_runtime_new(NULL, &rt), KHUB_STATUS_INVALID_ARG);
    ASSERT(rt == NULL);
    ASSERT_STR_EQ(khub_last_error(), "khub_runtime_new: KHUB_CPU_LEVEL=avx-512 is not a CPU "
                                     "level; use x86-64 (alias generic), avx2, avx512 or "
                                     "native, or unset it");
    setenv("KHUB_CPU_LEVEL", "avx2", 1);
    ASSERT_EQ(khub__cpu_level_check(err, sizeof err), 0);
}

TEST_IMPL(runtime_reports_the_masked_features)
{
    uint32_t host = khub__cpu_features_host();
    setenv("KHUB_CPU_LEVEL", "avx2", 1);
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    ASSERT_EQ(rt->cpu_features, host & AVX2_SET);
    ASSERT_STR_EQ(feature(rt, "cpu.avx512f"), "0");
    ASSERT_STR_EQ(feature(rt, "cpu.avx2"), (host & KHUB_CPU_AVX2) ? "1" : "0");
    ASSERT_STR_EQ(feature(rt, "cpu.level"), khub__cpu_level_of(host & AVX2_SET));
    khub_runtime_free(rt);
    setenv("KHUB_CPU_LEVEL", "x86-64", 1);
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    ASSERT_EQ(rt->cpu_features, 0);
    ASSERT_STR_EQ(feature(rt, "cpu.sse42"), "0");
    ASSERT_STR_EQ(feature(rt, "cpu.level"), "x86-64");
    khub_runtime_free(rt);
}

/* The registry's choice for an RMSNorm among the built-in plugins at a level. */
static void norm_served_by(const char *level, const char *want)
{
    setenv("KHUB_CPU_LEVEL", level, 1);
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM,
                       .dtype_id = KHUB_DTYPE_ID_F32};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    ASSERT_CONTAINS(khub_binding_name(b), want);
    fprintf(stderr, "  note: KHUB_CPU_LEVEL=%s: %s\n", level, khub_binding_name(b));
    khub_runtime_free(rt);
}

TEST_IMPL(builtin_choice_follows_the_level)
{
    if (!getenv("KHUB_PLUGIN_DIR")) TEST_SKIP("KHUB_PLUGIN_DIR is not set (run through ctest)");
    uint32_t host = khub__cpu_features_host();
    if ((host & AVX512_PLUGIN_NEEDS) == AVX512_PLUGIN_NEEDS)
        norm_served_by("native", "khub/cpu-avx512 ");
    else
        fprintf(stderr, "  note: this CPU cannot run cpu-avx512.so; its case is not checked\n");
    if ((host & (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C)) ==
        (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C))
        norm_served_by("avx2", "khub/cpu-avx2 ");
    else
        fprintf(stderr, "  note: this CPU cannot run cpu-avx2.so; its case is not checked\n");
    norm_served_by("x86-64", "khub/ref-cpu ");
}

#define TEST_LIST(X) \
    X(levels_mask_and_never_add) \
    X(unknown_level_is_refused) \
    X(runtime_reports_the_masked_features) \
    X(builtin_choice_follows_the_level)
TEST_MAIN(TEST_LIST)
