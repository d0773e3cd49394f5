/*
 * test_gpu_embedding.c (CTest label gpu): kernels-community/embedding's
 * CUDA op against khub/ref-cpu's embedding op, bit for bit, for every table
 * format it serves (f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
 * Q6_K; SmolLM2's hidden 576, 512 for the 256-value K blocks), 17 token ids
 * spread over a 1000-row table (its first and last rows included), y
 * written with a row stride wider than hidden at a byte offset (as the
 * executor could pass a view), with and without Gemma's sqrt(hidden)
 * scale; and an id outside the table, which the kernel turns into a NaN
 * row without reading past the table (the executor refuses such ids before
 * they go up).
 *
 * KHUB_GPU_KERNELS names a folder of kernel folders built with `khub build`
 * (tools/gpu-check.sh makes it). Skips without it or without a CUDA driver;
 * on the fake driver (tests/fake_cuda) no kernel runs, so the cases check
 * the plumbing only and say that they compared nothing.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>

#include "cuda.h"
#include "cuda_variant.h"
#include "plugin_artifacts.h"
#include "runtime_impl.h"
#include "runner.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint8_t rbyte(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint8_t)(rng >> 56);
}

enum { VOCAB = 1000, N = 17, PAD = 32, OFF = 64 };

/* Device memory holding n bytes of src. */
static uint64_t up(const void *src, size_t n)
{
    uint64_t d = 0;
    khub__plugin_msg_clear();
    if (khub__cuda_host_mem_alloc(NULL, 0, n, &d) != KHUB_STATUS_OK ||
        khub__cuda_host_memcpy_htod(NULL, d, src, n, NULL) != KHUB_STATUS_OK)
        TEST_FAIL_("device copy of %zu bytes: %s", n, khub__plugin_msg());
    return d;
}

/* A table of dt with `hidden` values per row: dense values in (-1, 1),
 * block codes random with every scale (and min) a small f16. */
static uint8_t *table_of(khub_dtype dt, int64_t hidden, size_t *bytes)
{
    int id = khub_dtype_id_of(dt);
    int64_t rb = dt.code == KHUB_DL_BLOCKQ ? khub_qformat_row_bytes(dt.bits, hidden)
                                           : hidden * (dt.bits / 8);
    if (rb <= 0 || rb > (1 << 20)) TEST_FAIL_("row bytes %lld", (long long)rb);
    *bytes = (size_t)rb * VOCAB;
    uint8_t *t = malloc(*bytes);
    ASSERT(t);
    for (size_t i = 0; i < *bytes; i++) t[i] = rbyte();
    if (id == KHUB_DTYPE_ID_F32)
        for (size_t i = 0; i < *bytes / 4; i++) {
            float v = (float)rbyte() / 128.0f - 1.0f;
            memcpy(t + 4 * i, &v, 4);
        }
    else if (id == KHUB_DTYPE_ID_F16 || id == KHUB_DTYPE_ID_BF16)
        for (size_t i = 0; i < *bytes / 2; i++) /* finite: clear the top exponent bit */
            t[2 * i + 1] &= id == KHUB_DTYPE_ID_F16 ? 0xbb : 0xbf;
    if (dt.code != KHUB_DL_BLOCKQ) return t;
    int64_t bb = khub_qformat_block_bytes(dt.bits);
    int offs[2] = {dt.bits == KHUB_QFORMAT_Q6_K ? 208 : 0, -1};
    if (dt.bits == KHUB_QFORMAT_Q4_1 || dt.bits == KHUB_QFORMAT_Q5_1 ||
        dt.bits == KHUB_QFORMAT_Q4_K)
        offs[1] = 2;
    for (size_t b = 0; b < *bytes / (size_t)bb; b++)
        for (int f = 0; f < 2; f++)
            if (offs[f] >= 0) {
                uint16_t h = (uint16_t)(0x2000 + rbyte() * 8); /* ~0.008 .. 0.03 */
                if (rbyte() & 1) h |= 0x8000;
                memcpy(t + b * (size_t)bb + (size_t)offs[f], &h, 2);
            }
    return t;
}

static bool fake_driver;

static khub_binding *op(khub_runtime *rt, bool cuda, int dtype_id)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = KHUB_OP_EMBEDDING,
                       .device_type = cuda ? KHUB_DEVICE_CUDA : KHUB_DEVICE_CPU,
                       .dtype_id = dtype_id,
                       .kind_flags = KHUB_EMBEDDING_SCALE | KHUB_EMBEDDING_STRIDED_OUT,
                       .plugin_id = cuda ? "kernels-community/embedding" : "khub/ref-cpu"};
    khub_binding *b = NULL;
    if (khub_registry_select(rt, &q, &b) != KHUB_STATUS_OK)
        TEST_FAIL_("embedding op: %s", khub_runtime_errmsg(rt));
    return b;
}

/* One format: the CUDA op's y against ref-cpu's, bit for bit, row by row
 * (the padding between rows and before the first untouched). */
static void embed_case(khub_runtime *rt, khub_dtype dt, int64_t hidden, float scale,
                       const int32_t *ids, bool expect_nan_row)
{
    size_t bytes, rs = (size_t)(hidden + PAD), ny = OFF + N * rs;
    uint8_t *table = table_of(dt, hidden, &bytes);
    float *want = malloc(ny * sizeof(float)), *got = malloc(ny * sizeof(float));
    ASSERT(want && got);
    for (size_t i = 0; i < ny; i++) want[i] = got[i] = -7.0f;
    uint64_t dt_table = up(table, bytes), d_ids = up(ids, N * sizeof(int32_t)),
             d_y = up(got, ny * sizeof(float));
    int64_t ts[2] = {VOCAB, hidden}, ys[2] = {N, hidden}, st[2] = {(int64_t)rs, 1};
    khub_tensor t = {.data = (void *)(uintptr_t)dt_table,
                     .device = {KHUB_DEVICE_CUDA, 0},
                     .ndim = 2,
                     .dtype = dt,
                     .shape = ts};
    khub_tensor y = {.data = (void *)(uintptr_t)d_y,
                     .device = {KHUB_DEVICE_CUDA, 0},
                     .ndim = 2,
                     .dtype = KHUB_DTYPE_F32,
                     .shape = ys,
                     .strides = st,
                     .byte_offset = OFF * sizeof(float)};
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CUDA, 0}};
    khub_embedding_args a = {KHUB_STRUCT_INIT(khub_embedding_args),
                             .ctx = &ctx,
                             .table = &t,
                             .ids = (const int32_t *)(uintptr_t)d_ids,
                             .y = &y,
                             .n = N,
                             .scale = scale};
    if (khub_binding_call(op(rt, true, khub_dtype_id_of(dt)), &a) != KHUB_STATUS_OK)
        TEST_FAIL_("the CUDA op: %s", khub_runtime_errmsg(rt));
    khub__plugin_msg_clear();
    if (khub__cuda_host_stream_sync(NULL, NULL) != KHUB_STATUS_OK ||
        khub__cuda_host_memcpy_dtoh(NULL, got, d_y, ny * sizeof(float), NULL) != KHUB_STATUS_OK ||
        khub__cuda_host_stream_sync(NULL, NULL) != KHUB_STATUS_OK)
        TEST_FAIL_("reading y: %s", khub__plugin_msg());
    khub__cuda_host_mem_free(NULL, dt_table), khub__cuda_host_mem_free(NULL, d_ids);
    khub__cuda_host_mem_free(NULL, d_y);
    char what[96];
    snprintf(what, sizeof what, "embedding %s [%d ids of %d x %lld] scale %g%s",
             khub__dtype_id_name(khub_dtype_id_of(dt)), N, VOCAB, (long long)hidden, (double)scale,
             expect_nan_row ? ", id 1000 (outside)" : "");
    if (fake_driver) {
        printf("  %s: fake driver, nothing compared\n", what);
    } else {
        int32_t ref_ids[N];
        for (int i = 0; i < N; i++) ref_ids[i] = ids[i] >= 0 && ids[i] < VOCAB ? ids[i] : 0;
        t.data = table, t.device.device_type = KHUB_DEVICE_CPU;
        y.data = want, y.device.device_type = KHUB_DEVICE_CPU;
        a.ctx = NULL, a.ids = ref_ids;
        ASSERT_OK(khub_binding_call(op(rt, false, khub_dtype_id_of(dt)), &a));
        long differ = 0;
        for (size_t i = 0; i < ny; i++) {
            bool bad_row = i >= OFF && ids[(i - OFF) / rs] != ref_ids[(i - OFF) / rs] &&
                           (i - OFF) % rs < (size_t)hidden;
            if (bad_row ? !isnan(got[i]) : memcmp(&got[i], &want[i], 4) != 0) differ++;
        }
        printf("  %s: %ld of %zu values differ from khub/ref-cpu (bit for bit)\n", what, differ,
               ny);
        if (differ) TEST_FAIL_("%s: %ld values differ", what, differ);
    }
    free(table), free(want), free(got);
}

TEST_IMPL(gpu_embedding_vs_ref_cpu)
{
    if (khub__cuda_info(NULL, NULL, NULL) != KHUB_STATUS_OK)
        TEST_SKIP("no CUDA driver on this machine");
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    fake_driver = h && dlsym(h, "khub_fake_cuda_stat");
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    load_cuda_variant(rt, "embedding");
    int32_t ids[N] = {0, VOCAB - 1};
    for (int i = 2; i < N; i++) ids[i] = (int32_t)((i * 7919) % VOCAB);
    const khub_dtype dts[] = {KHUB_DTYPE_F32,
                              KHUB_DTYPE_F16,
                              KHUB_DTYPE_BF16,
                              KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0),
                              KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_0),
                              KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1),
                              KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_0),
                              KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_1),
                              KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_K),
                              KHUB_DTYPE_Q(KHUB_QFORMAT_Q6_K)};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        bool k = dts[i].code == KHUB_DL_BLOCKQ &&
                 (dts[i].bits == KHUB_QFORMAT_Q4_K || dts[i].bits == KHUB_QFORMAT_Q6_K);
        int64_t hidden = k ? 512 : 576;
        embed_case(rt, dts[i], hidden, 1.0f, ids, false);
        embed_case(rt, dts[i], hidden, (float)sqrt((double)hidden), ids, false);
    }
    ids[5] = VOCAB; /* outside: a NaN row, the others exact */
    embed_case(rt, KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), 576, 1.0f, ids, true);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) X(gpu_embedding_vs_ref_cpu)
TEST_MAIN(TEST_LIST)
