/*
 * test_nvrtc.c: NVRTC opened at run time compiles CUDA C to PTX and cubin
 * without a GPU; skipped with a message where no NVRTC library exists.
 */
#include <stdlib.h>
#include <string.h>

#include "elf_gate.h"
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
    if (st == KHUB_STATUS_UNSUPPORTED) TEST_SKIP("%s", err);
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

TEST_IMPL(missing_library_is_reported)
{
    setenv("KHUB_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
    /* The explicit path fails but the default names may still be found; the
     * message of a failed open must name a reason either way. */
    khub_nvrtc *nv = NULL;
    char err[KHUB_ERROR_SIZE] = "";
    khub_status st = khub__nvrtc_open(&nv, err, sizeof err);
    if (st == KHUB_STATUS_OK)
        khub__nvrtc_close(nv);
    else {
        ASSERT_STATUS(st, KHUB_STATUS_UNSUPPORTED);
        ASSERT_CONTAINS(err, "NVRTC not found");
    }
}

#define TEST_LIST(X) \
    X(ptx_for_sm80) \
    X(cubin_for_sm90) \
    X(compile_error_has_log) \
    X(missing_library_is_reported)
TEST_MAIN(TEST_LIST)
