/*
 * test_fuse_smollm2.c: SmolLM2-135M-Instruct Q4_1 (tools/fetch-model.sh;
 * skipped without it) with its q/k/v and gate/up joined gives the same
 * logits, bit for bit, as with them apart (KHUB_JOIN_PROJ=0): prefill,
 * decode and a batch of four sequences (fuse_compare.h), with the default
 * kernels, the file mapped and (where the kernel gives them) in huge pages. The tiny fixtures are
 * test_fuse.c. Label slow.
 */
#include <sys/stat.h>

#include "fuse_compare.h"

TEST_IMPL(fuse_smollm2_same_bits)
{
    char path[512];
    const char *d = getenv("KHUB_MODEL_DIR");
    if (d)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", d);
    else
        snprintf(path, sizeof path, "%s/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    struct stat sb;
    if (stat(path, &sb) != 0) TEST_SKIP("%s not found (run tools/fetch-model.sh)", path);
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts)};
    /* The file mapped (KHUB_HUGE_PAGES=0): q/k/v (stored k, o, q, v) are
     * copied and their pages given back, gate/up (adjacent) are a view. */
    ASSERT_EQ(setenv("KHUB_HUGE_PAGES", "0", 1), 0);
    char *ex = fc_compare(path, &o, 30, 30);
    ASSERT_CONTAINS(ex, "q_proj, k_proj, v_proj as one call (a joined weight of 960 rows) in 30 "
                        "of 30 layers\n");
    ASSERT_CONTAINS(ex, "gate_proj, up_proj as one call (a joined weight of 3072 rows) in 30 of "
                        "30 layers\n");
    free(ex);
#ifndef KHUB_SANITIZER_BUILD
    /* The default: read into huge pages where the kernel gives them; then
     * q/k/v stay apart (a copy would hold their bytes twice), gate/up are
     * still a view. Not under a sanitizer: each compare is two runs of four
     * 140-row prefills through cpu-x86's f32 GEMM, which at -O0 with ASan
     * took past the runner's 300 s for both compares (session 19, load 4-11);
     * the rows must pass KX_GEMM_MIN_N (128) to reach the GEMM at all. */
    ASSERT_EQ(unsetenv("KHUB_HUGE_PAGES"), 0);
    free(fc_compare(path, &o, -30, 30));
#endif
}

#define TEST_LIST(X) X(fuse_smollm2_same_bits)
TEST_MAIN(TEST_LIST)
