/*
 * embedding_cuda.c: host glue of kernels-community/embedding for CUDA: the
 * op "embedding" (kind KHUB_OP_EMBEDDING, ABI 1.5) over a table of f32,
 * f16, bf16 or GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K rows.
 *
 * Loads the best PTX artifact for a device (the highest sm at or below
 * its compute capability) on the first call there (one module per device,
 * the one y lives on), under a lock (ops may be called from several
 * threads), and launches the format's kernel: one
 * block of 256 threads per token, on the call context's stream. Every
 * pointer is device memory, the token ids too; the table is compact (a
 * byte offset is allowed), y has any row stride and byte offset with a
 * row's values contiguous (KHUB_EMBEDDING_STRIDED_OUT). The op cannot see
 * the ids (they are on the device): an id outside the vocabulary gives a
 * NaN row, never a read outside the table. Without a CUDA driver the
 * plugin initialises and scores 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <khub/helpers/khub_cuda_glue.h>
#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75}; /* kernel.json's capabilities, highest first */

enum { THREADS = 256 };

/* The kernels, in embedding.cu's format order. */
enum { K_F32, K_F16, K_BF16, K_Q8_0, K_Q4_0, K_Q4_1, K_Q5_0, K_Q5_1, K_Q4_K, K_Q6_K, K_COUNT };
static const char *const fn_names[K_COUNT] = {
    "khub_embed_f32",  "khub_embed_f16",  "khub_embed_bf16", "khub_embed_q8_0", "khub_embed_q4_0",
    "khub_embed_q4_1", "khub_embed_q5_0", "khub_embed_q5_1", "khub_embed_q4_k", "khub_embed_q6_k"};

typedef struct embed_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded[KHUB_CG_MAX_DEVICES];
    void *fn[KHUB_CG_MAX_DEVICES][K_COUNT]; /* CUfunction per device */
} embed_state;

static embed_state g_state = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int32_t score(void *sp)
{
    const khub_host_api *host = ((embed_state *)sp)->host;
    int n = 0;
    return host->cuda_device_count(host->host_ctx, &n) == KHUB_STATUS_OK && n > 0 ? 1 : 0;
}

static khub_status load_locked(embed_state *s, int dev)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    khub_cuda_module *mod = NULL;
    KHUB_CG_TRY(host->cuda_device_cc(host->host_ctx, dev, &cc));
    KHUB_CG_TRY(khub_cg_load_ptx(host, dev, cc, "embedding", ccs, sizeof ccs / sizeof ccs[0],
                                 "embedding", &mod));
    khub_status st = KHUB_STATUS_OK;
    for (int f = 0; f < K_COUNT && st == KHUB_STATUS_OK; f++)
        st = host->cuda_module_function(host->host_ctx, mod, fn_names[f], &s->fn[dev][f]);
    s->loaded[dev] = st == KHUB_STATUS_OK;
    return st;
}

static khub_status load(embed_state *s, int dev)
{
    pthread_mutex_lock(&s->lock);
    khub_status st = s->loaded[dev] ? KHUB_STATUS_OK : load_locked(s, dev);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The kernel for a table dtype, and the bytes of one row of `hidden`
 * values; -1 when the op does not serve the dtype. */
static int kernel_for(khub_dtype dt, int64_t hidden, int64_t *row_bytes)
{
    int id = khub_dtype_id_of(dt);
    if (id == KHUB_DTYPE_ID_F32) return *row_bytes = hidden * 4, K_F32;
    if (id == KHUB_DTYPE_ID_F16) return *row_bytes = hidden * 2, K_F16;
    if (id == KHUB_DTYPE_ID_BF16) return *row_bytes = hidden * 2, K_BF16;
    if (dt.code != KHUB_DL_BLOCKQ) return -1;
    khub_qformat f = (khub_qformat)dt.bits;
    int64_t be = khub_qformat_block_elems(f);
    if (!be || hidden % be) return -1;
    *row_bytes = khub_qformat_row_bytes(f, hidden);
    switch (f) {
    case KHUB_QFORMAT_Q8_0: return K_Q8_0;
    case KHUB_QFORMAT_Q4_0: return K_Q4_0;
    case KHUB_QFORMAT_Q4_1: return K_Q4_1;
    case KHUB_QFORMAT_Q5_0: return K_Q5_0;
    case KHUB_QFORMAT_Q5_1: return K_Q5_1;
    case KHUB_QFORMAT_Q4_K: return K_Q4_K;
    case KHUB_QFORMAT_Q6_K: return K_Q6_K;
    default: return -1;
    }
}

static khub_status bad(const khub_host_api *host, const char *what)
{
    return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "embedding (cuda): %s", what);
}

static khub_status run(void *sp, const void *args)
{
    embed_state *s = sp;
    const khub_host_api *host = s->host;
    const khub_embedding_args *a = args;
    if (!a || a->struct_size < sizeof *a) return bad(host, "args are not ABI 1.5's");
    const khub_tensor *t = a->table, *y = a->y;
    if (!t || t->ndim != 2 || t->strides || t->device.device_type != KHUB_DEVICE_CUDA || !y ||
        y->ndim != 2 || y->device.device_type != KHUB_DEVICE_CUDA ||
        khub_dtype_id_of(y->dtype) != KHUB_DTYPE_ID_F32)
        return bad(host, "needs a compact CUDA table [vocab, hidden] and CUDA f32 y [n, hidden]");
    int64_t vocab = t->shape[0], hidden = t->shape[1], row_bytes = 0;
    int64_t y_stride = y->strides ? y->strides[0] : hidden;
    if (y->shape[1] != hidden || a->n < 0 || a->n > y->shape[0] || a->n > 0x7fffffff ||
        hidden <= 0 || hidden > 0x7fffffff || y_stride < hidden ||
        (y->strides && hidden > 1 && y->strides[1] != 1) || (a->n > 0 && !a->ids))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "embedding (cuda): table [%lld, %lld], y [%lld, %lld] (row stride "
                          "%lld, values contiguous), %lld ids do not agree",
                          (long long)vocab, (long long)hidden, (long long)y->shape[0],
                          (long long)y->shape[1], (long long)y_stride, (long long)a->n);
    int k = kernel_for(t->dtype, hidden, &row_bytes);
    if (k < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "embedding (cuda): table dtype (code %u, bits %u) with %lld columns is "
                          "not served (f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K "
                          "in whole blocks)",
                          t->dtype.code, t->dtype.bits, (long long)hidden);
    if (a->n == 0) return KHUB_STATUS_OK;
    int dev = 0;
    KHUB_CG_TRY(khub_cg_device(host, "embedding (cuda)", y->device, &dev));
    KHUB_CG_TRY(load(s, dev));
    const void *table = (const char *)t->data + t->byte_offset, *ids = a->ids;
    void *out = (char *)y->data + y->byte_offset;
    int32_t h32 = (int32_t)hidden;
    long long v = vocab, rb = row_bytes, ys = y_stride;
    float scale = a->scale;
    void *params[] = {&table, &ids, &out, &h32, &v, &rb, &ys, &scale};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)a->n, 1, 1}, .block = {THREADS, 1, 1},
                                .stream = a->ctx ? a->ctx->stream : NULL};
    return host->cuda_launch(host->host_ctx, s->fn[dev][k], &cfg, params);
}

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16) |
              KHUB_DTYPE_BIT(KHUB_DTYPE_ID_BF16) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_1) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q5_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q5_1) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_K) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q6_K),
    .cc_min = 75,
    .priority = 30,
    .kind_flags = KHUB_EMBEDDING_SCALE | KHUB_EMBEDDING_STRIDED_OUT,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "embedding", .kind = KHUB_OP_EMBEDDING, .caps = &caps,
     .run = run},
};

khub_status khub_embedding_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                     size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_state.host = h;
    memset(g_state.loaded, 0, sizeof g_state.loaded);
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/embedding",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = &g_state,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_embedding_cuda_init, "kernels-community/embedding", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_EMBEDDING))
