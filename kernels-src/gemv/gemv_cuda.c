/*
 * gemv_cuda.c: host glue of kernels-community/gemv for CUDA: the ops
 * "linear" (f32 and f16 weights) and "qlinear" (Q8_0, Q4_0, Q4_1, Q4_K and
 * Q6_K weights, stored as GGUF blocks, dequantized in registers), both with
 * an optional f32 bias.
 *
 * Loads the best PTX artifact for the device (the highest sm at or below its
 * compute capability) on the first call, under a lock (ops may be called
 * from several threads), and launches the format's kernel: WARPS (4) output
 * rows per block, NT (8) x rows per grid row (gemv.cu). Every tensor is
 * compact device memory; a strided or offset one is refused. Without a CUDA
 * driver the plugin initialises and scores 0.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75}; /* kernel.json's capabilities, highest first */

enum { WARPS = 4, NT = 8 }; /* gemv.cu's */

/* The kernels, in gemv.cu's format order. */
enum { K_F32, K_F16, K_Q8_0, K_Q4_0, K_Q4_1, K_Q4_K, K_Q6_K, K_COUNT };
static const char *const fn_names[K_COUNT] = {"khub_gemv_f32",  "khub_gemv_f16",  "khub_gemv_q8_0",
                                              "khub_gemv_q4_0", "khub_gemv_q4_1", "khub_gemv_q4_k",
                                              "khub_gemv_q6_k"};

typedef struct gemv_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded;
    void *fn[K_COUNT]; /* CUfunction */
} gemv_state;

static gemv_state g_state = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int32_t score(void *sp)
{
    const khub_host_api *host = ((gemv_state *)sp)->host;
    int n = 0;
    return host->cuda_device_count(host->host_ctx, &n) == KHUB_STATUS_OK && n > 0 ? 1 : 0;
}

static khub_status load_locked(gemv_state *s)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    khub_status st = host->cuda_device_cc(host->host_ctx, 0, &cc);
    if (st != KHUB_STATUS_OK) return st;
    for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
        char name[64];
        const void *img = NULL;
        size_t n = 0;
        snprintf(name, sizeof name, "gemv.sm_%d.ptx", ccs[i]);
        if (ccs[i] > cc || host->artifact(host->host_ctx, name, &img, &n) != KHUB_STATUS_OK)
            continue;
        khub_cuda_module *mod = NULL;
        if ((st = host->cuda_module_load(host->host_ctx, 0, img, n, &mod)) != KHUB_STATUS_OK)
            return st;
        for (int f = 0; f < K_COUNT && st == KHUB_STATUS_OK; f++)
            st = host->cuda_module_function(host->host_ctx, mod, fn_names[f], &s->fn[f]);
        s->loaded = st == KHUB_STATUS_OK;
        return st;
    }
    return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                      "gemv: no PTX for compute capability %d.%d", cc / 10, cc % 10);
}

static khub_status load(gemv_state *s)
{
    pthread_mutex_lock(&s->lock);
    khub_status st = s->loaded ? KHUB_STATUS_OK : load_locked(s);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The kernel for a weight dtype, and the bytes of one W row of `in`
 * weights; -1 when the op does not serve the dtype. */
static int kernel_for(khub_dtype dt, int64_t in, int64_t *row_bytes)
{
    int id = khub_dtype_id_of(dt);
    if (id == KHUB_DTYPE_ID_F32) return *row_bytes = in * 4, K_F32;
    if (id == KHUB_DTYPE_ID_F16) return *row_bytes = in * 2, K_F16;
    if (dt.code != KHUB_DL_BLOCKQ) return -1;
    khub_qformat f = (khub_qformat)dt.bits;
    int64_t be = khub_qformat_block_elems(f);
    if (!be || in % be) return -1;
    *row_bytes = khub_qformat_row_bytes(f, in);
    switch (f) {
    case KHUB_QFORMAT_Q8_0: return K_Q8_0;
    case KHUB_QFORMAT_Q4_0: return K_Q4_0;
    case KHUB_QFORMAT_Q4_1: return K_Q4_1;
    case KHUB_QFORMAT_Q4_K: return K_Q4_K;
    case KHUB_QFORMAT_Q6_K: return K_Q6_K;
    default: return -1;
    }
}

static bool compact_cuda(const khub_tensor *t, int ndim)
{
    return t && t->ndim == ndim && !t->strides && !t->byte_offset &&
           t->device.device_type == KHUB_DEVICE_CUDA;
}

static khub_status run(void *sp, const void *args, const char *op)
{
    gemv_state *s = sp;
    const khub_host_api *host = s->host;
    const khub_linear_args *a = args;
    if (!a || a->struct_size < sizeof *a || !compact_cuda(a->x, 2) || !compact_cuda(a->weight, 2) ||
        !compact_cuda(a->y, 2) || (a->bias && !compact_cuda(a->bias, 1)))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): needs compact CUDA tensors x [n, in], weight [out, in], "
                          "y [n, out] and bias [out] or none",
                          op);
    int64_t n = a->x->shape[0], in = a->x->shape[1], out = a->weight->shape[0], row_bytes = 0;
    int k = kernel_for(a->weight->dtype, in, &row_bytes);
    if (k < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "%s (cuda): weight dtype (code %u, bits %u) with %lld columns is not "
                          "served (f32, f16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K in whole blocks)",
                          op, a->weight->dtype.code, a->weight->dtype.bits, (long long)in);
    if (a->weight->shape[1] != in || a->y->shape[0] != n || a->y->shape[1] != out ||
        (a->bias && a->bias->shape[0] != out) || n <= 0 || in <= 0 || out <= 0 || in > 0x7fffffff ||
        (out + WARPS - 1) / WARPS > 0x7fffffff || (n + NT - 1) / NT > 65535)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): shapes x [%lld, %lld], weight [%lld, %lld], y [%lld, %lld] "
                          "do not agree (or exceed the grid)",
                          op, (long long)n, (long long)in, (long long)out,
                          (long long)a->weight->shape[1], (long long)a->y->shape[0],
                          (long long)a->y->shape[1]);
    khub_status st = load(s);
    if (st != KHUB_STATUS_OK) return st;
    const void *x = a->x->data, *w = a->weight->data, *bias = a->bias ? a->bias->data : NULL;
    void *y = a->y->data;
    int32_t n32 = (int32_t)n, in32 = (int32_t)in, out32 = (int32_t)out;
    long long rb = row_bytes;
    void *params[] = {&x, &w, &bias, &y, &n32, &in32, &out32, &rb};
    khub_cuda_launch_cfg cfg = {
        KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
        .grid = {(uint32_t)((out + WARPS - 1) / WARPS), (uint32_t)((n + NT - 1) / NT), 1},
        .block = {32 * WARPS, 1, 1}, .stream = a->stream};
    return host->cuda_launch(host->host_ctx, s->fn[k], &cfg, params);
}

static khub_status linear(void *sp, const void *args) { return run(sp, args, "linear"); }
static khub_status qlinear(void *sp, const void *args) { return run(sp, args, "qlinear"); }

static const khub_op_caps linear_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .flags = KHUB_CAP_BIAS,
    .cc_min = 75,
    .priority = 30,
};

static const khub_op_caps qlinear_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_0) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_1) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_K) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q6_K),
    .flags = KHUB_CAP_BIAS,
    .cc_min = 75,
    .priority = 30,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "linear", .kind = KHUB_OP_LINEAR, .caps = &linear_caps,
     .run = linear},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "qlinear", .kind = KHUB_OP_QLINEAR,
     .caps = &qlinear_caps, .run = qlinear},
};

khub_status khub_gemv_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_state.host = h;
    g_state.loaded = 0;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/gemv",
                          .version = "1.0.0",
                          .n_ops = 2,
                          .ops = ops,
                          .state = &g_state,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_gemv_cuda_init, "kernels-community/gemv", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_LINEAR) | KHUB_KIND_BIT(KHUB_OP_QLINEAR))
