/*
 * test_fa2_cuda.c: the host side of kernels-src/flash-attn2's CUDA glue
 * (issue 19 item 2) on the fake driver (tests/fake_cuda), which runs no
 * kernel: the glue is built as a test plugin (tests/plugins, kc_flash_attn)
 * and loaded with its real CUDA source and a stand-in PTX as artifacts.
 *
 *   - split-K for decode shapes (at most 8 query rows) and the prefill
 *     tiles otherwise: launch names and grids, the split count and its
 *     caps (64 splits, the partials' budget), the keys the last row sees;
 *   - the partials' scratch: one buffer per stream, sized for the shape's
 *     worst case at its first use, so a growing context never regrows it;
 *     replaced after a drain for a larger shape; freed when its stream
 *     ends (stream_end) or with the plugin, and never handed to another
 *     stream while its own lives;
 *   - that scratch inside a CUDA graph capture (what forward_graph.c does
 *     to a decode step): no synchronisation, the capture survives; and
 *     what happens when a larger shape arrives mid-capture;
 *   - the kernels compiled at load (a fake NVRTC): split-K and the tiles
 *     from one module per shape, the merge from the build;
 *   - the refusals, with their status and message.
 * The numbers are tools/gpu-check.sh's (step 6, test_gpu_ops).
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda.h"
#include "plugin_artifacts.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"

/* ======================================================================== */
/* The fake driver and the glue                                             */
/* ======================================================================== */

static long (*fake_stat)(const char *);
static const char *(*launch_name)(long);
static int (*launch_dims)(long, unsigned *);
static unsigned long long (*launch_arg0)(long);
static char tmp[128]; /* this case's folder: the stand-in PTX, the JIT cache, NVRTC's log */

static void cleanup(void)
{
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", tmp);
}

/* The fake driver (sm_90), with KHUB_FAKE_CUDA_FAIL=fail; load-time
 * compilation off unless jit (then through the fake NVRTC). */
static void fake(const char *fail, bool jit)
{
    snprintf(tmp, sizeof tmp, "/tmp/khub-fa2-cuda-%d", (int)getpid());
    ASSERT(mkdir(tmp, 0700) == 0);
    atexit(cleanup);
    char path[200];
    setenv("KHUB_FAKE_CUDA", "12080:90", 1);
    setenv("KHUB_FAKE_CUDA_MEM", "200000000", 1);
    if (fail)
        setenv("KHUB_FAKE_CUDA_FAIL", fail, 1);
    else
        unsetenv("KHUB_FAKE_CUDA_FAIL");
    setenv("KHUB_CUDA_JIT", jit ? "1" : "0", 1);
    setenv("KHUB_NVRTC_LIBRARY", KHUB_BINARY_DIR "/fake-nvrtc/libnvrtc.so.13", 1);
    snprintf(path, sizeof path, "%s/cache", tmp);
    setenv("KHUB_CUDA_CACHE", path, 1);
    snprintf(path, sizeof path, "%s/nvrtc.log", tmp);
    setenv("KHUB_FAKE_NVRTC_LOG", path, 1);
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) TEST_FAIL_("the fake driver: %s", dlerror());
    fake_stat = (long (*)(const char *))dlsym(h, "khub_fake_cuda_stat");
    launch_name = (const char *(*)(long))dlsym(h, "khub_fake_cuda_launch_name");
    launch_dims = (int (*)(long, unsigned *))dlsym(h, "khub_fake_cuda_launch_dims");
    launch_arg0 = (unsigned long long (*)(long))dlsym(h, "khub_fake_cuda_launch_arg0");
    ASSERT(fake_stat && launch_name && launch_dims && launch_arg0);
}

static long stat_of(const char *what) { return fake_stat(what); }

/* Launch i had this name, grid and block. */
static void launched(long i, const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx)
{
    unsigned d[7]; /* grid, block, shared bytes */
    ASSERT(launch_dims(i, d));
    ASSERT_STR_EQ(launch_name(i), name);
    ASSERT_EQ(d[0], gx);
    ASSERT_EQ(d[1], gy);
    ASSERT_EQ(d[2], gz);
    ASSERT_EQ(d[3], bx);
}

/* The runtime with the glue loaded: its artifacts are the real
 * flash_attn.cu and a stand-in flash_attn.sm_90.ptx (the fake driver loads
 * any image). */
static khub_runtime *runtime_with_glue(void)
{
    static const char text[] = ".version 7.0\n.target sm_90\n.address_size 64\n";
    static char ptx[200], sums[2][65];
    snprintf(ptx, sizeof ptx, "%s/flash_attn.sm_90.ptx", tmp);
    FILE *f = fopen(ptx, "wb");
    ASSERT(f);
    ASSERT_EQ(fwrite(text, 1, sizeof text, f), sizeof text); /* with its NUL */
    ASSERT_EQ(fclose(f), 0);
    const char *cu = KHUB_SOURCE_DIR "/kernels-src/flash-attn2/flash_attn.cu";
    ASSERT_OK(khub__sha256_file_hex(cu, sums[0]));
    ASSERT_OK(khub__sha256_file_hex(ptx, sums[1]));
    khub__artifact_file files[2] = {{"flash_attn.cu", cu, sums[0]},
                                    {"flash_attn.sm_90.ptx", ptx, sums[1]}};
    khub_runtime *rt = tp_runtime(1);
    const char *so = TP("kc_flash_attn");
    khub_status st = khub__plugin_load_verified(rt, so, TP_SHA(so), files, 2, NULL);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("loading the glue: %s", khub_runtime_errmsg(rt));
    return rt;
}

static khub_binding *attention_op(khub_runtime *rt, int32_t hd)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),         .kind = KHUB_OP_ATTENTION,
                       .device_type = KHUB_DEVICE_CUDA,         .dtype_id = KHUB_DTYPE_ID_F32,
                       .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA, .head_dim = hd};
    khub_binding *b = NULL;
    if (khub_registry_select(rt, &q, &b) != KHUB_STATUS_OK)
        TEST_FAIL_("no CUDA attention: %s", khub_runtime_errmsg(rt));
    return b;
}

/* ======================================================================== */
/* One call                                                                 */
/* ======================================================================== */

/* A call of nq rows of nh query heads (hd) at q_pos0 over nkv cached keys
 * in nkvh KV heads, K/V rows 256 + nkvh x hd floats apart (a cache's).
 * The fake runs no kernel, so the tensors are small device buffers whose
 * shapes say more than they hold. */
typedef struct call {
    int64_t nq, nh, nkvh, hd, nkv, q_pos0;
    void *stream;
    int64_t window;
    float softcap;
    bool head_major; /* K strides [hd, nkv x hd, 1]: not rows of [nkvh, hd] */
} call;

static uint64_t buf[4];

static call shape(int64_t nq, int64_t nh, int64_t nkvh, int64_t hd, int64_t nkv, int64_t q_pos0,
                  void *stream)
{
    return (call){
        .nq = nq, .nh = nh, .nkvh = nkvh, .hd = hd, .nkv = nkv, .q_pos0 = q_pos0, .stream = stream};
}

static void alloc_bufs(void)
{
    for (int i = 0; i < 4; i++)
        if (!buf[i]) ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, 4096, &buf[i]));
}

static khub_status run_call(khub_binding *op, const call *c)
{
    alloc_bufs();
    int64_t qs[3] = {c->nq, c->nh, c->hd}, ks[3] = {c->nkv, c->nkvh, c->hd};
    int64_t kst[3] = {256 + c->nkvh * c->hd, c->hd, 1}, hm[3] = {c->hd, c->nkv * c->hd, 1};
    khub_tensor t[4];
    for (int i = 0; i < 4; i++)
        t[i] = (khub_tensor){.data = (void *)(uintptr_t)buf[i],
                             .device = {KHUB_DEVICE_CUDA, 0},
                             .ndim = 3,
                             .dtype = KHUB_DTYPE_F32,
                             .shape = i == 1 || i == 2 ? ks : qs,
                             .strides = i == 1   ? (c->head_major ? hm : kst)
                                        : i == 2 ? kst
                                                 : NULL};
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .stream = c->stream,
                             .q = &t[0],
                             .k = &t[1],
                             .v = &t[2],
                             .out = &t[3],
                             .scale = 0.125f,
                             .causal = 1,
                             .q_pos0 = c->q_pos0,
                             .window = c->window,
                             .softcap = c->softcap};
    return khub_binding_call(op, &a);
}

/* A decode-like call (q_pos0 = nkv - nq) that must succeed; the index of
 * its first launch. */
static long ok_call(khub_runtime *rt, khub_binding *op, int64_t nq, int64_t nh, int64_t nkvh,
                    int64_t hd, int64_t nkv)
{
    long first = stat_of("launches");
    call c = shape(nq, nh, nkvh, hd, nkv, nkv - nq, NULL);
    khub_status st = run_call(op, &c);
    if (st != KHUB_STATUS_OK)
        TEST_FAIL_("attention: %s: %s", khub_status_name(st), khub_runtime_errmsg(rt));
    return first;
}

static void free_bufs(void)
{
    for (int i = 0; i < 4; i++)
        if (buf[i]) ASSERT_OK(khub__cuda_host_mem_free(NULL, buf[i]));
    memset(buf, 0, sizeof buf);
}

/* The scratch a shape gets: 8 rows x 64 splits of its heads' records
 * (head_dim + 2 floats), within the 4 Mi float budget. */
static long shape_max(long nh, long hd)
{
    long floats = 8 * nh * 64 * (hd + 2);
    return 4 * (floats < (4l << 20) ? floats : (4l << 20));
}

/* ======================================================================== */
/* The cases                                                                */
/* ======================================================================== */

TEST_IMPL(split_k_for_decode_tiles_for_prefill)
{
    fake(NULL, false);
    khub_runtime *rt = runtime_with_glue();
    khub_binding *op = attention_op(rt, 64);
    long allocs0 = stat_of("allocs_live") + 4, bytes0 = stat_of("bytes_live") + 4 * 4096;
    /* a decode step over 300 keys: 2 splits of 160 (ceil(300 / 2) rounded
     * up to 32), then the merge of 9 rows x heads; the scratch sized for 9
     * heads of 64 at their worst (8 rows x 64 splits) */
    long i = ok_call(rt, op, 1, 9, 3, 64, 300);
    launched(i, "khub_fa2_decode_hd64", 2, 9, 1, 128);
    launched(i + 1, "khub_fa2_merge_hd64", 9, 1, 1, 64);
    ASSERT_EQ(stat_of("launches"), i + 2);
    ASSERT_EQ(stat_of("allocs_live"), allocs0 + 1);
    ASSERT_EQ(stat_of("bytes_live"), bytes0 + shape_max(9, 64));
    /* 200 keys: one split, written directly, one launch */
    i = ok_call(rt, op, 1, 9, 3, 64, 200);
    launched(i, "khub_fa2_decode_hd64", 1, 9, 1, 128);
    ASSERT_EQ(stat_of("launches"), i + 1);
    /* the keys the last row sees, not the view's length: row 0 at position
     * 99 of a 4096-row cache view sees 100 keys (one split) */
    call c = shape(1, 9, 3, 64, 4096, 99, NULL);
    i = stat_of("launches");
    ASSERT_OK(run_call(op, &c));
    launched(i, "khub_fa2_decode_hd64", 1, 9, 1, 128);
    /* 8 rows over 5000 keys: 20 splits of 256; no new buffer, no drain */
    long syncs = stat_of("stream_syncs");
    i = ok_call(rt, op, 8, 9, 3, 64, 5000);
    launched(i, "khub_fa2_decode_hd64", 20, 9, 8, 128);
    launched(i + 1, "khub_fa2_merge_hd64", 72, 1, 1, 64);
    ASSERT_EQ(stat_of("stream_syncs"), syncs);
    ASSERT_EQ(stat_of("bytes_live"), bytes0 + shape_max(9, 64));
    /* a long context: at most 64 splits (of 320 keys here); at head_dim
     * 128 its 64 x 9 records of 130 floats still fit: the same buffer */
    op = attention_op(rt, 128);
    i = ok_call(rt, op, 1, 9, 3, 128, 20480);
    launched(i, "khub_fa2_decode_hd128", 64, 9, 1, 128);
    launched(i + 1, "khub_fa2_merge_hd128", 9, 1, 1, 128);
    ASSERT_EQ(stat_of("stream_syncs"), syncs);
    ASSERT_EQ(stat_of("bytes_live"), bytes0 + shape_max(9, 64));
    /* 64 heads of 128 (GQA 8) x 8 rows: the budget caps the splits at 63,
     * chunks of ceil(20480 / 63) = 326 -> 352 keys, so 59 splits; their
     * 15 MB do not fit, so the buffer is replaced, after its stream
     * drained, by the shape's worst case: the whole budget (16 MiB) */
    i = ok_call(rt, op, 8, 64, 8, 128, 20480);
    launched(i, "khub_fa2_decode_hd128", 59, 64, 8, 128);
    launched(i + 1, "khub_fa2_merge_hd128", 512, 1, 1, 128);
    ASSERT_EQ(stat_of("stream_syncs"), syncs + 1);
    ASSERT_EQ(stat_of("allocs_live"), allocs0 + 1);
    ASSERT_EQ(stat_of("bytes_live"), bytes0 + shape_max(64, 128));
    ASSERT_EQ(shape_max(64, 128), 16l << 20);
    /* the most a stream's scratch can be, declared for the host's memory
     * check (caps.stream_bytes) */
    void *state = NULL;
    ASSERT_EQ(khub_binding_acquire(op, &state)->caps->stream_bytes, (uint64_t)shape_max(64, 128));
    khub_binding_release(op);
    /* 9 rows, and a prefill: the tiles, one block per 64 rows and head */
    op = attention_op(rt, 64);
    i = ok_call(rt, op, 9, 9, 3, 64, 300);
    launched(i, "khub_fa2_hd64", 1, 9, 1, 64);
    ASSERT_EQ(stat_of("launches"), i + 1);
    op = attention_op(rt, 128);
    i = ok_call(rt, op, 130, 9, 3, 128, 130);
    launched(i, "khub_fa2_hd128", 3, 9, 1, 64);
    ASSERT_EQ(stat_of("allocs_live"), allocs0 + 1);
    free_bufs();
    khub_runtime_free(rt); /* the plugin's shutdown frees the scratch */
    ASSERT_EQ(stat_of("allocs_live"), allocs0 - 4);
    ASSERT_EQ(stat_of("bytes_live"), bytes0 - 4 * 4096);
}

/* What the executor does to a decode step with CUDA graphs on: the op is
 * called with its stream capturing (relaxed mode). The context growing
 * from 200 to 5000 keys changes the split count and adds the merge, but
 * never synchronises the stream (which would invalidate the capture): the
 * scratch is allocated once, in the capture, at its shape's size. */
TEST_IMPL(split_k_inside_a_graph_capture)
{
    fake(NULL, false);
    khub_runtime *rt = runtime_with_glue();
    khub_binding *op = attention_op(rt, 64);
    void *stream = NULL;
    ASSERT_OK(khub__cuda_stream_new(rt, 0, &stream));
    long allocs0 = stat_of("allocs_live"), syncs = stat_of("stream_syncs");
    alloc_bufs();
    ASSERT_OK(khub__cuda_capture_begin(stream));
    long n0 = stat_of("graph_nodes_recorded");
    int64_t keys[] = {200, 257, 300, 1000, 4096, 5000};
    for (int i = 0; i < 6; i++) {
        int64_t nq = i == 5 ? 8 : 1;
        call c = shape(nq, 9, 3, 64, keys[i], keys[i] - nq, stream);
        ASSERT_OK(run_call(op, &c));
    }
    void *graph = NULL;
    ASSERT_OK(khub__cuda_capture_end(stream, &graph));
    ASSERT(graph != NULL);
    /* 1 + 2 x 5 launches recorded, none run; one allocation, no drain */
    ASSERT_EQ(stat_of("graph_nodes_recorded"), n0 + 11);
    ASSERT_EQ(stat_of("graph_captures_invalidated"), 0);
    ASSERT_EQ(stat_of("stream_syncs"), syncs);
    ASSERT_EQ(stat_of("allocs_live"), allocs0 + 4 + 1);
    khub__cuda_graph_free(graph);
    /* A larger shape on the same stream mid-capture (two models sharing a
     * stream; the executor gives each model its own): replacing the
     * buffer needs the stream drained, which breaks the capture; the
     * executor then turns graphs off with a warning and reruns the step
     * plainly (forward_graph.c). */
    ASSERT_OK(khub__cuda_capture_begin(stream));
    op = attention_op(rt, 128);
    call c = shape(8, 64, 8, 128, 20480, 20472, stream);
    ASSERT_STATUS(run_call(op, &c), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "kernels-community/flash-attn2 1.0.0 :: flash_attn: cuStreamSynchronize "
                    "failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)");
    ASSERT_EQ(stat_of("graph_captures_invalidated"), 1);
    ASSERT(khub__cuda_capture_end(stream, &graph) != KHUB_STATUS_OK);
    /* outside a capture the same call replaces it */
    ASSERT_OK(run_call(op, &c));
    ASSERT_EQ(stat_of("allocs_live"), allocs0 + 4 + 1);
    free_bufs();
    ASSERT_OK(khub__cuda_stream_free(rt, 0, stream));
    khub_runtime_free(rt);
    ASSERT_EQ(stat_of("allocs_live"), allocs0);
}

static void nvrtc_log(char *out, size_t n)
{
    char path[200];
    snprintf(path, sizeof path, "%s/nvrtc.log", tmp);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t len = fread(out, 1, n - 1, f);
    out[len] = '\0';
    fclose(f);
}

/* Compiled at load (the fake NVRTC): one module per (head_dim, heads, KV
 * heads) holds the tiles and split-K; the merge is the build's. */
TEST_IMPL(split_k_specialised_at_load)
{
    fake(NULL, true);
    khub_runtime *rt = runtime_with_glue();
    khub_binding *op = attention_op(rt, 64);
    long i = ok_call(rt, op, 1, 9, 3, 64, 300);
    launched(i, "khub_fa2_decode_spec", 2, 9, 1, 128);
    launched(i + 1, "khub_fa2_merge_hd64", 9, 1, 1, 64);
    i = ok_call(rt, op, 37, 9, 3, 64, 37);
    launched(i, "khub_fa2_spec", 1, 9, 1, 64);
    i = ok_call(rt, op, 1, 9, 3, 64, 100);
    launched(i, "khub_fa2_decode_spec", 1, 9, 1, 128);
    char log[1024];
    nvrtc_log(log, sizeof log);
    ASSERT_STR_EQ(log, "compile flash_attn.cu --gpu-architecture=sm_90 --std=c++17 "
                       "-default-device -DKHUB_FA2_GROUP=3 -DKHUB_FA2_HD=64 "
                       "-DKHUB_FA2_HEADS=9\n");
    /* another shape: its own module */
    op = attention_op(rt, 128);
    i = ok_call(rt, op, 4, 8, 2, 128, 1000);
    launched(i, "khub_fa2_decode_spec", 4, 8, 4, 128);
    launched(i + 1, "khub_fa2_merge_hd128", 32, 1, 1, 128);
    nvrtc_log(log, sizeof log);
    ASSERT_CONTAINS(log, "\ncompile flash_attn.cu --gpu-architecture=sm_90 --std=c++17 "
                         "-default-device -DKHUB_FA2_GROUP=4 -DKHUB_FA2_HD=128 "
                         "-DKHUB_FA2_HEADS=8\n");
    free_bufs();
    khub_runtime_free(rt);
}

#define REFUSED \
    "flash_attn (cuda): causal f32 CUDA tensors, head dim 64 or 128, no mask, window or " \
    "soft-cap, K/V rows [n_kv_heads, head_dim] contiguous"

/* What it cannot compute is refused before any launch, never read as if. */
TEST_IMPL(refusals_name_what_is_wrong)
{
    fake(NULL, false);
    khub_runtime *rt = runtime_with_glue();
    khub_binding *op = attention_op(rt, 64);
    call bad[] = {
        {.nq = 1, .nh = 9, .nkvh = 3, .hd = 64, .nkv = 10, .q_pos0 = 9, .head_major = true},
        {.nq = 1, .nh = 9, .nkvh = 3, .hd = 64, .nkv = 10, .q_pos0 = 9, .window = 4},
        {.nq = 1, .nh = 9, .nkvh = 3, .hd = 64, .nkv = 10, .q_pos0 = 9, .softcap = 30.0f},
        {.nq = 1, .nh = 9, .nkvh = 2, .hd = 64, .nkv = 10, .q_pos0 = 9}, /* 9 heads over 2 */
        {.nq = 1, .nh = 9, .nkvh = 3, .hd = 96, .nkv = 10, .q_pos0 = 9},
        {.nq = 1, .nh = 9, .nkvh = 3, .hd = 64, .nkv = 10, .q_pos0 = -1},
    };
    long n = stat_of("launches");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        khub__clear(rt);
        ASSERT_STATUS(run_call(op, &bad[i]), KHUB_STATUS_INVALID_ARG);
        ASSERT_CONTAINS(khub_runtime_errmsg(rt), REFUSED);
    }
    ASSERT_EQ(stat_of("launches"), n);
    /* a scratch per stream for 16 live streams; a 17th is refused (the
     * first 16 keep working) until one of them ends */
    void *streams[17];
    for (int s = 0; s < 17; s++) ASSERT_OK(khub__cuda_stream_new(rt, 0, &streams[s]));
    for (int s = 0; s < 17; s++) {
        call c = shape(1, 9, 3, 64, 300, 299, streams[s]);
        khub__clear(rt);
        ASSERT_STATUS(run_call(op, &c), s < 16 ? KHUB_STATUS_OK : KHUB_STATUS_NOMEM);
    }
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "flash_attn (cuda): split-K scratch is kept for 16 live streams; this call "
                    "is on another one (free a model placed on the device first)");
    call c = shape(1, 9, 3, 64, 300, 299, streams[3]);
    ASSERT_OK(run_call(op, &c));
    ASSERT_OK(khub__cuda_stream_free(rt, 0, streams[0]));
    c = shape(1, 9, 3, 64, 300, 299, streams[16]);
    ASSERT_OK(run_call(op, &c));
    for (int s = 1; s < 17; s++) ASSERT_OK(khub__cuda_stream_free(rt, 0, streams[s]));
    free_bufs();
    khub_runtime_free(rt);
}

/* The scratch's allocation failing: the driver's error, nothing launched;
 * the next call allocates again. */
TEST_IMPL(scratch_allocation_failure)
{
    fake("cuMemAlloc@5", false); /* after the call's four tensors */
    khub_runtime *rt = runtime_with_glue();
    khub_binding *op = attention_op(rt, 64);
    long n = stat_of("launches"), allocs0 = stat_of("allocs_live");
    call c = shape(1, 9, 3, 64, 300, 299, NULL);
    ASSERT_STATUS(run_call(op, &c), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "kernels-community/flash-attn2 1.0.0 :: flash_attn: cuMemAlloc failed: "
                    "CUDA_ERROR_OUT_OF_MEMORY (2)");
    ASSERT_EQ(stat_of("launches"), n);
    ASSERT_EQ(stat_of("allocs_live"), allocs0 + 4);
    khub__clear(rt);
    ASSERT_OK(run_call(op, &c));
    ASSERT_EQ(stat_of("launches"), n + 2);
    ASSERT_EQ(stat_of("allocs_live"), allocs0 + 5);
    free_bufs();
    khub_runtime_free(rt);
}

/* A stream's scratch lives as long as the stream (issue 19): 40 streams
 * made, given a split-K call and freed in a row (what 40 models placed one
 * after another do) all succeed, each one's scratch freed when it ends, so
 * device memory does not grow; a stream alive throughout keeps its own
 * buffer, never given to another stream. The merge's first argument is the
 * partials' buffer. */
TEST_IMPL(scratch_freed_when_its_stream_ends)
{
    fake(NULL, false);
    khub_runtime *rt = runtime_with_glue();
    khub_binding *op = attention_op(rt, 64);
    alloc_bufs();
    void *kept = NULL;
    ASSERT_OK(khub__cuda_stream_new(rt, 0, &kept));
    call k = shape(1, 9, 3, 64, 300, 299, kept);
    long i = stat_of("launches");
    ASSERT_OK(run_call(op, &k));
    launched(i + 1, "khub_fa2_merge_hd64", 9, 1, 1, 64);
    unsigned long long kept_part = launch_arg0(i + 1);
    long allocs = stat_of("allocs_live"), bytes = stat_of("bytes_live");
    for (int m = 0; m < 40; m++) {
        void *s = NULL;
        ASSERT_OK(khub__cuda_stream_new(rt, 0, &s));
        call c = shape(1, 9, 3, 64, 300, 299, s);
        i = stat_of("launches");
        if (run_call(op, &c) != KHUB_STATUS_OK)
            TEST_FAIL_("stream %d: %s", m, khub_runtime_errmsg(rt));
        launched(i + 1, "khub_fa2_merge_hd64", 9, 1, 1, 64);
        ASSERT(launch_arg0(i + 1) != kept_part);
        ASSERT_EQ(stat_of("allocs_live"), allocs + 1);
        ASSERT_EQ(stat_of("bytes_live"), bytes + shape_max(9, 64));
        ASSERT_OK(khub__cuda_stream_free(rt, 0, s));
        ASSERT_EQ(stat_of("allocs_live"), allocs);
        ASSERT_EQ(stat_of("bytes_live"), bytes);
        i = stat_of("launches");
        ASSERT_OK(run_call(op, &k));
        ASSERT_EQ(launch_arg0(i + 1), kept_part);
    }
    ASSERT_EQ(stat_of("allocs_live"), allocs);
    ASSERT_OK(khub__cuda_stream_free(rt, 0, kept));
    ASSERT_EQ(stat_of("allocs_live"), allocs - 1);
    ASSERT_EQ(stat_of("bytes_live"), bytes - shape_max(9, 64));
    free_bufs();
    khub_runtime_free(rt);
}

/* A stream whose drain fails (a kernel's error surfaced there) keeps its
 * scratch: work may still be queued on the stream, so the host does not
 * call stream_end; the plugin frees the buffer at unload. */
TEST_IMPL(scratch_kept_when_the_drain_fails)
{
    fake("cuStreamSynchronize", false);
    khub_runtime *rt = runtime_with_glue();
    khub_binding *op = attention_op(rt, 64);
    long base = stat_of("allocs_live");
    void *s = NULL;
    ASSERT_OK(khub__cuda_stream_new(rt, 0, &s));
    call c = shape(1, 9, 3, 64, 300, 299, s);
    ASSERT_OK(run_call(op, &c));
    long allocs = stat_of("allocs_live");
    ASSERT_EQ(allocs, base + 4 + 1);
    ASSERT_STATUS(khub__cuda_stream_free(rt, 0, s), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "a stream: cuStreamSynchronize failed: CUDA_ERROR_LAUNCH_FAILED (719)");
    ASSERT_EQ(stat_of("allocs_live"), allocs);
    free_bufs();
    khub_runtime_free(rt);
    ASSERT_EQ(stat_of("allocs_live"), base);
}

#define TEST_LIST(X) \
    X(split_k_for_decode_tiles_for_prefill) \
    X(split_k_inside_a_graph_capture) \
    X(split_k_specialised_at_load) \
    X(refusals_name_what_is_wrong) \
    X(scratch_allocation_failure) \
    X(scratch_freed_when_its_stream_ends) \
    X(scratch_kept_when_the_drain_fails)
TEST_MAIN(TEST_LIST)
