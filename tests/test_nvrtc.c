/*
 * test_nvrtc.c: NVRTC opened at run time compiles CUDA C to PTX and cubin
 * without a GPU; skipped with a message where no NVRTC library exists
 * (missing_library_is_reported runs everywhere).
 */
#include <stdlib.h>
#include <string.h>

#include "elf_gate.h"
#include "internal.h"
#include "nvrtc.h"
#include "runner.h"

static const char *kernel_src = "extern \"C\" __global__ void scale(float *x, float s, int n) {\n"
                                "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                                "    if (i < n) x[i] *= s;\n"
                                "}\n";

static khub_nvrtc *open_or_skip(void)
{
    khub_nvrtc *nv = NULL;
    char err[KHUB_ERROR_SIZE];
    khub_status st = khub__nvrtc_open(&nv, err, sizeof err);
    if (st == KHUB_STATUS_NO_NVRTC) TEST_SKIP("%s", err);
    ASSERT_OK(st);
    return nv;
}

TEST_IMPL(ptx_for_sm80)
{
    khub_nvrtc *nv = open_or_skip();
    int maj, min;
    khub__nvrtc_version(nv, &maj, &min);
    ASSERT(maj >= 11);
    char *ptx = NULL, err[KHUB_ERROR_SIZE];
    size_t n = 0;
    ASSERT_OK(khub__nvrtc_compile(nv, kernel_src, "scale.cu", 80, KHUB_NVRTC_PTX, NULL, 0, &ptx, &n,
                                  err, sizeof err));
    ASSERT_EQ(strlen(ptx), n);
    ASSERT_CONTAINS(ptx, ".visible .entry scale");
    int isa, sm;
    char suffix;
    ASSERT_OK(khub__ptx_inspect(ptx, n, &isa, &sm, &suffix));
    ASSERT_EQ(sm, 80);
    ASSERT(isa >= 70);
    free(ptx);
    khub__nvrtc_close(nv);
}

TEST_IMPL(cubin_for_sm90)
{
    khub_nvrtc *nv = open_or_skip();
    char *cubin = NULL, err[KHUB_ERROR_SIZE];
    size_t n = 0;
    ASSERT_OK(khub__nvrtc_compile(nv, kernel_src, "scale.cu", 90, KHUB_NVRTC_CUBIN, NULL, 0, &cubin,
                                  &n, err, sizeof err));
    ASSERT(n > 64);
    ASSERT(memcmp(cubin, "\177ELF", 4) == 0);
    int sm = 0;
    ASSERT_OK(khub__cubin_inspect((const unsigned char *)cubin, n, &sm));
    ASSERT_EQ(sm, 90);
    free(cubin);
    khub__nvrtc_close(nv);
}

TEST_IMPL(compile_error_has_log)
{
    khub_nvrtc *nv = open_or_skip();
    char *ptx = NULL, err[KHUB_ERROR_SIZE];
    size_t n = 0;
    ASSERT_STATUS(khub__nvrtc_compile(nv, "extern \"C\" __global__ void k() { undeclared(); }",
                                      "bad.cu", 80, KHUB_NVRTC_PTX, NULL, 0, &ptx, &n, err,
                                      sizeof err),
                  KHUB_STATUS_ERROR);
    ASSERT(ptx == NULL);
    ASSERT_CONTAINS(err, "bad.cu: NVRTC:");
    ASSERT_CONTAINS(err, "undeclared");
    ASSERT_STATUS(
        khub__nvrtc_compile(nv, "", "x.cu", 5, KHUB_NVRTC_PTX, NULL, 0, &ptx, &n, err, sizeof err),
        KHUB_STATUS_INVALID_ARG);
    khub__nvrtc_close(nv);
}

/* The sources the in-tree glues have compiled at load (docs/gpu.md) build
 * as the host builds them (a cubin for the device, the shape as -D
 * constants, no include path) and hold their _spec kernels (entries, up to
 * a NULL): what test_cuda_jit cannot show with its fake NVRTC. */
static void spec_compiles(const char *rel, const char *const *defs, size_t n,
                          const char *const *entries)
{
    khub_nvrtc *nv = open_or_skip();
    char path[512], *src = NULL, *cubin = NULL, err[KHUB_ERROR_SIZE];
    size_t src_n = 0, cubin_n = 0;
    snprintf(path, sizeof path, "%s/kernels-src/%s", KHUB_SOURCE_DIR, rel);
    ASSERT_OK(khub__read_file(path, 1 << 20, &src, &src_n, NULL, 0));
    khub_status st = khub__nvrtc_compile(nv, src, rel, 90, KHUB_NVRTC_CUBIN, defs, n, &cubin,
                                         &cubin_n, err, sizeof err);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("%s: %s", rel, err);
    ASSERT(memcmp(cubin, "\177ELF", 4) == 0);
    for (const char *const *e = entries; *e; e++) /* in its symbol names */
        if (!memmem(cubin, cubin_n, *e, strlen(*e) + 1)) TEST_FAIL_("%s: no %s", rel, *e);
    free(src), free(cubin);
    khub__nvrtc_close(nv);
}

TEST_IMPL(kernels_src_specialise_at_load)
{
    const char *rope[] = {"-DKHUB_ROPE_HALF=24", "-DKHUB_ROPE_HEAD_DIM=64", "-DKHUB_ROPE_SCALING=2",
                          "-DKHUB_ROPE_STYLE=1"};
    const char *const rope_k[] = {"khub_rope_f32_spec", NULL};
    spec_compiles("rotary/rotary.cu", rope, 4, rope_k);
    const char *fa[] = {"-DKHUB_FA2_GROUP=3", "-DKHUB_FA2_HD=64", "-DKHUB_FA2_HEADS=9"};
    const char *const fa_k[] = {"khub_fa2_spec", "khub_fa2_decode_spec", NULL};
    spec_compiles("flash-attn2/flash_attn.cu", fa, 3, fa_k);
}

TEST_IMPL(missing_library_is_reported)
{
    /* A named library is the only one tried: the toolkit's libnvrtc, which
     * this machine may have, is not taken in its place. */
    setenv("KHUB_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so", 1);
    khub_nvrtc *nv = NULL;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_STATUS(khub__nvrtc_open(&nv, err, sizeof err), KHUB_STATUS_NO_NVRTC);
    ASSERT(nv == NULL);
    ASSERT_STR_EQ(err, "NVRTC not found (/nonexistent/libnvrtc.so: cannot open shared object "
                       "file: No such file or directory); install the CUDA toolkit's NVRTC or "
                       "set KHUB_NVRTC_LIBRARY to its libnvrtc.so");
    /* the older name, read when KHUB_NVRTC_LIBRARY is not set */
    unsetenv("KHUB_NVRTC_LIBRARY");
    setenv("KHUB_NVRTC_PATH", "/nonexistent/libnvrtc.so.12", 1);
    ASSERT_STATUS(khub__nvrtc_open(&nv, err, sizeof err), KHUB_STATUS_NO_NVRTC);
    ASSERT_STR_EQ(err, "NVRTC not found (/nonexistent/libnvrtc.so.12: cannot open shared object "
                       "file: No such file or directory); install the CUDA toolkit's NVRTC or "
                       "set KHUB_NVRTC_LIBRARY to its libnvrtc.so");
}

#define TEST_LIST(X) \
    X(ptx_for_sm80) \
    X(cubin_for_sm90) \
    X(compile_error_has_log) \
    X(kernels_src_specialise_at_load) \
    X(missing_library_is_reported)
TEST_MAIN(TEST_LIST)
