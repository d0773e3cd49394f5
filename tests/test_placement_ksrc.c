/*
 * test_placement_ksrc.c: a model placed on cuda:1 with the in-tree CUDA
 * kernels bound to every role (issue 19: cuda:N, N > 0, with the
 * kernels-src glues), on the fake driver with two GPUs (tests/fake_cuda).
 *
 * The fake keeps a context per device and refuses, with
 * CUDA_ERROR_INVALID_HANDLE as a real driver does, a launch whose function
 * (its module), stream or device memory is another device's than the
 * current context's; it counts launches, allocations and module loads per
 * device. So a glue that loaded its module (or allocated its scratch) on
 * cuda:0 for a model on cuda:1 fails these tests, and a pass means every
 * launch, module and allocation went to cuda:1:
 *   - the dense path: embedding, rmsnorm, gemv (every projection and the
 *     head), rotary and flash-attn2 (both specialised at load through the
 *     fake NVRTC, on cuda:1), activation, kv-cache-cuda's static cache;
 *   - the paged path: kv-cache-cuda's paged cache and paged attention;
 *   - the fake's own refusals, and a device past the glues' tables.
 * Nothing computes (the fake runs no kernel); the glues are built as test
 * plugins (tests/plugins) and loaded with stand-in PTX artifacts.
 */
#define DEVICE_FIXTURE_DIMS
enum { HID = 128, HEADS = 2, KVH = 1, HD = 64, FFN = 256, VOCAB = 128, LAYERS = 2 };

#include <khub/helpers/khub_cuda_glue.h>

#include "cuda.h"
#include "device_fixture.h"
#include "executor.h"
#include "plugin_artifacts.h"

static const khub_device cuda1 = {KHUB_DEVICE_CUDA, 1};

static char tmp[128]; /* stand-in artifacts, the JIT cache, the fake NVRTC's log */

static void cleanup(void)
{
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", tmp);
}

/* Two sm_90 GPUs, with load-time compilation through the fake NVRTC. */
static void two_gpus(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/khub-ksrc-XXXXXX");
    ASSERT(mkdtemp(tmp) != NULL);
    atexit(cleanup);
    char path[200];
    setenv("KHUB_CUDA_JIT", "1", 1);
    setenv("KHUB_NVRTC_LIBRARY", KHUB_BINARY_DIR "/fake-nvrtc/libnvrtc.so.13", 1);
    snprintf(path, sizeof path, "%s/cache", tmp);
    setenv("KHUB_CUDA_CACHE", path, 1);
    snprintf(path, sizeof path, "%s/nvrtc.log", tmp);
    setenv("KHUB_FAKE_NVRTC_LOG", path, 1);
    fake("12080:90,90", "200000000", NULL);
    launch_log();
}

/* Test plugin `so` (a kernels-src glue) loaded verified, with artifacts:
 * for each name a stand-in PTX file (the fake loads any image), or for a
 * .cu name the real source in kernels-src/dir (load-time compilation reads
 * it). */
static void load_ksrc(khub_runtime *rt, const char *so, const char *dir, const char *const *names,
                      int n)
{
    static const char text[] = ".version 7.0\n.target sm_90\n.address_size 64\n";
    static char paths[16][300], sums[16][65];
    static int used;
    khub__artifact_file files[4];
    ASSERT(n <= 4 && used + n <= 16);
    for (int i = 0; i < n; i++, used++) {
        if (strstr(names[i], ".cu") && !strstr(names[i], ".ptx")) {
            snprintf(paths[used], sizeof paths[used], "%s/kernels-src/%s/%s", KHUB_SOURCE_DIR, dir,
                     names[i]);
        } else {
            snprintf(paths[used], sizeof paths[used], "%s/%s", tmp, names[i]);
            FILE *f = fopen(paths[used], "wb");
            ASSERT(f);
            ASSERT_EQ(fwrite(text, 1, sizeof text, f), sizeof text); /* with its NUL */
            ASSERT_EQ(fclose(f), 0);
        }
        ASSERT_OK(khub__sha256_file_hex(paths[used], sums[used]));
        files[i] = (khub__artifact_file){names[i], paths[used], sums[used]};
    }
    const char *path = TP(so);
    if (khub__plugin_load_verified(rt, path, TP_SHA(path), files, (size_t)n, NULL) !=
        KHUB_STATUS_OK)
        TEST_FAIL_("loading %s: %s", so, khub_runtime_errmsg(rt));
}

/* Every CUDA glue of kernels-src. */
static void load_all_glues(khub_runtime *rt)
{
    static const char *const act[] = {"activation.sm_90.ptx"};
    static const char *const rms[] = {"rmsnorm.sm_90.ptx"};
    static const char *const emb[] = {"embedding.sm_90.ptx"};
    static const char *const gemv[] = {"gemv.sm_90.ptx"};
    static const char *const rope[] = {"rotary.sm_90.ptx", "rotary.cu"};
    static const char *const fa[] = {"flash_attn.sm_90.ptx", "flash_attn.cu"};
    static const char *const kv[] = {"kv_append.sm_90.ptx", "paged_attn.sm_90.ptx"};
    load_ksrc(rt, "kc_activation", "activation", act, 1);
    load_ksrc(rt, "kc_rmsnorm", "rmsnorm", rms, 1);
    load_ksrc(rt, "kc_embedding", "embedding", emb, 1);
    load_ksrc(rt, "gemv_cuda", "gemv", gemv, 1);
    load_ksrc(rt, "kc_rotary", "rotary", rope, 2);
    load_ksrc(rt, "kc_flash_attn", "flash-attn2", fa, 2);
    load_ksrc(rt, "ksrc_kv_cache_cuda", "kv-cache-cuda", kv, 2);
}

enum { PREFILL = 270, MAX_CTX = 512 }; /* run_steps' */

/* The tiny model on cuda:1, strict (every role on the device or the load
 * fails), with the dense or the paged KV cache. */
static void load_on_cuda1(fixture *f, bool paged)
{
    memset(f, 0, sizeof *f);
    f->rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(f->rt));
    load_all_glues(f->rt);
    f->dir = tiny_model();
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts),
                         .device = cuda1,
                         .strict = true,
                         .cache_impl = paged ? "khub/ref-cpu:paged_cache" : NULL,
                         .max_context = MAX_CTX,
                         .max_seqs = 2,
                         .max_batch = 16,
                         .kv_block_size = paged ? 4 : 0,
                         .kv_num_blocks = paged ? 128 : 0};
    if (khub_model_load(f->rt, f->dir, &o, &f->m) != KHUB_STATUS_OK)
        TEST_FAIL_("loading the model on cuda:1: %s", khub_runtime_errmsg(f->rt));
}

/* A prefill of PREFILL tokens in steps of 16 (flash-attn2's and the paged
 * attention's tiles), then 3 decode steps, on sequence 0: their split-K
 * over more than 256 keys (2 splits) uses each glue's scratch. */
static void run_steps(khub_model *m)
{
    int32_t toks[16];
    for (int64_t pos = 0; pos < PREFILL + 3;) {
        int64_t n = pos >= PREFILL ? 1 : PREFILL - pos < 16 ? PREFILL - pos : 16;
        for (int64_t i = 0; i < n; i++) toks[i] = (int32_t)((pos + i) * 7 % VOCAB);
        khub__seg seg = {.seq = 0, .pos0 = pos, .n = n};
        if (khub__forward(m, toks, &seg, 1) != KHUB_STATUS_OK)
            TEST_FAIL_("step at position %lld on cuda:1: %s", (long long)pos,
                       khub_runtime_errmsg(m->rt));
        pos += n;
    }
}

/* Whether a kernel whose name starts with prefix ran. */
static bool ran(const char *prefix)
{
    long n = stat_of("launches");
    for (long i = 0; i < n && i < 16384; i++)
        if (!strncmp(launch_name(i), prefix, strlen(prefix))) return true;
    return false;
}

/* Nothing of the run on cuda:0; launches, modules and allocations on
 * cuda:1; and after the model and the runtime are gone, every module and
 * allocation freed (the glues' per-device scratch at their shutdown). */
static void all_on_cuda1(fixture *f, const char *const *kernels, int n)
{
    ASSERT(stat_of("launches") > 0);
    ASSERT_EQ(stat_of("launches_on_1"), stat_of("launches"));
    ASSERT_EQ(stat_of("launches_on_0"), 0);
    ASSERT_EQ(stat_of("modules_on_0"), 0);
    ASSERT_EQ(stat_of("allocs_on_0"), 0);
    ASSERT(stat_of("modules_on_1") >= 7);
    ASSERT(stat_of("allocs_on_1") > 0);
    for (int i = 0; i < n; i++)
        if (!ran(kernels[i])) TEST_FAIL_("no launch of %s*", kernels[i]);
    unload(f);
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("modules_live"), 0);
}

/* ======================================================================== */
/* A model on cuda:1                                                        */
/* ======================================================================== */

/* The dense cache: every glue's kernel runs, all of it on cuda:1. */
TEST_IMPL(in_tree_kernels_run_on_cuda1)
{
    two_gpus();
    fixture f;
    load_on_cuda1(&f, false);
    ASSERT_CONTAINS(khub_model_explain(f.m), "placement: cuda:1 (sm_90, driver 12.8): ");
    ASSERT_CONTAINS(khub_model_explain(f.m), " on the device, 0 on the CPU\n");
    run_steps(f.m);
    static const char *const kernels[] = {
        "khub_embed_f32",  "khub_rms_norm_f32", "khub_gemv_f32",        "khub_rope_f32_spec",
        "khub_kv_append_", "khub_fa2_spec",     "khub_fa2_decode_spec", "khub_fa2_merge_hd",
        "khub_act_and_mul"}; /* merge: split-K with its scratch */
    all_on_cuda1(&f, kernels, 9);
}

/* The paged cache: its pool, table and appends, and the paged attention's
 * kernels and scratch, on cuda:1. */
TEST_IMPL(in_tree_paged_cache_runs_on_cuda1)
{
    two_gpus();
    fixture f;
    load_on_cuda1(&f, true);
    ASSERT_CONTAINS(khub_model_explain(f.m), " on the device, 0 on the CPU\n");
    run_steps(f.m);
    static const char *const kernels[] = {"khub_pkv_write_", "khub_pa_hd64", "khub_pa_decode_hd64",
                                          "khub_pa_merge_hd64"};
    all_on_cuda1(&f, kernels, 4); /* merge: split-K with its scratch */
}

/* ======================================================================== */
/* The fake's contexts, and the glues' bound                                */
/* ======================================================================== */

/* A function of cuda:0's module launched while cuda:1 is current, and
 * cuda:1's function launched on cuda:0's memory: both refused as a real
 * driver refuses a function of another context. */
TEST_IMPL(fake_refuses_a_launch_across_devices)
{
    two_gpus();
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "cuda_ops");
    const khub_host_api *h = &p->host;
    static const char ptx[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                              ".visible .entry nop()\n{\n  ret;\n}\n";
    khub_cuda_module *m0 = NULL, *m1 = NULL;
    void *f0 = NULL, *f1 = NULL;
    uint64_t d0 = 0, d1 = 0;
    ASSERT_OK(h->cuda_module_load(h->host_ctx, 0, ptx, sizeof ptx, &m0));
    ASSERT_OK(h->cuda_module_function(h->host_ctx, m0, "nop", &f0));
    ASSERT_OK(h->cuda_mem_alloc(h->host_ctx, 0, 64, &d0));
    ASSERT_OK(h->cuda_module_load(h->host_ctx, 1, ptx, sizeof ptx, &m1)); /* cuda:1 current */
    ASSERT_OK(h->cuda_module_function(h->host_ctx, m1, "nop", &f1));
    ASSERT_OK(h->cuda_mem_alloc(h->host_ctx, 1, 64, &d1));
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .grid = {1, 1, 1},
                                .block = {32, 1, 1}};
    void *on1[] = {&d1}, *on0[] = {&d0};
    ASSERT_OK(h->cuda_launch(h->host_ctx, f1, &cfg, on1));
    khub__plugin_msg_clear();
    ASSERT_STATUS(h->cuda_launch(h->host_ctx, f0, &cfg, on1), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(), "cuLaunchKernel failed: CUDA_ERROR_INVALID_HANDLE (400)");
    khub__plugin_msg_clear();
    ASSERT_STATUS(h->cuda_launch(h->host_ctx, f1, &cfg, on0), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(), "cuLaunchKernel failed: CUDA_ERROR_INVALID_HANDLE (400)");
    ASSERT_EQ(stat_of("launches"), 1);
    ASSERT_EQ(stat_of("launches_on_1"), 1);
    ASSERT_EQ(stat_of("modules_on_0"), 1);
    ASSERT_EQ(stat_of("modules_on_1"), 1);
    ASSERT_EQ(stat_of("allocs_on_0"), 1);
    ASSERT_EQ(stat_of("allocs_on_1"), 1);
    ASSERT_OK(h->cuda_mem_free(h->host_ctx, d0));
    ASSERT_OK(h->cuda_mem_free(h->host_ctx, d1));
    khub_runtime_free(rt);
}

/* A call on a device past the glues' per-device tables is refused, named,
 * before anything is loaded. */
TEST_IMPL(a_device_past_the_glue_tables_is_refused)
{
    two_gpus();
    khub_runtime *rt = tp_runtime(1);
    static const char *const act[] = {"activation.sm_90.ptx"};
    load_ksrc(rt, "kc_activation", "activation", act, 1);
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_ACTIVATION,
                       .device_type = KHUB_DEVICE_CUDA, .dtype_id = KHUB_DTYPE_ID_F32};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    int64_t shape[2] = {1, 32};
    khub_tensor t = {.device = {KHUB_DEVICE_CUDA, KHUB_CG_MAX_DEVICES},
                     .ndim = 2,
                     .dtype = KHUB_DTYPE_F32,
                     .shape = shape};
    khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args), .gate = &t, .up = &t,
                              .y = &t};
    khub__clear(rt);
    ASSERT_STATUS(khub_binding_call(b, &a), KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "silu_and_mul (cuda): cuda:16: this kernel keeps its "
                                             "modules for cuda:0..cuda:15 only");
    ASSERT_EQ(stat_of("modules_live"), 0);
    khub_binding_release(b);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(in_tree_kernels_run_on_cuda1) \
    X(in_tree_paged_cache_runs_on_cuda1) \
    X(fake_refuses_a_launch_across_devices) \
    X(a_device_past_the_glue_tables_is_refused)
TEST_MAIN(TEST_LIST)
