/*
 * gemv_cuda.c: host glue of kernels-community/gemv for CUDA: the ops
 * "linear" (f32, f16 and bf16 weights) and "qlinear" (Q8_0, Q4_0, Q4_1,
 * Q4_K, Q6_K stored as GGUF blocks, and NF4), both with an optional f32 bias.
 *
 * Loads the best PTX artifact for a device (the highest sm at or below its
 * compute capability) on the first call there, under a lock (ops may be
 * called from several threads), and looks each kernel up the first time it
 * is launched there: module, capability and kernels are kept per device
 * (x's device id picks it; a CUfunction launches only on its module's). A call runs one of two
 * kernels of gemv.cu for the weight format:
 *   - the GEMM (khub_gemm_<format>, tensor cores through mma.sync; x staged
 *     as f16, or bf16 for bf16 weights) when x has more than GEMM_ABOVE rows
 *     and the device has the format's GEMM (compute capability 7.5 for f16
 *     and the block formats, 8.0 for bf16; f32 weights have none): a block of
 *     128 threads per BM x BN tile of y;
 *   - else the GEMV (khub_gemv_<format>, f32 arithmetic): WARPS (4) output
 *     rows per block, NT (8) x rows per grid row.
 * GEMM_ABOVE (32) is a first guess that no device has measured yet
 * (tools/gpu-check.sh step 6 times both paths).
 *
 * x and y may be row-strided (inner stride 1) and start at any 4-byte
 * aligned byte offset, as the executor's scratch views do; the weight is
 * compact (block formats always are) and the bias has unit stride. Without a
 * CUDA driver the plugin initialises and scores 0.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <khub/helpers/khub_cuda_glue.h>
#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75}; /* kernel.json's capabilities, highest first */

enum { WARPS = 4, NT = 8, BM = 64, BN = 64, THREADS = 128 }; /* gemv.cu's */
enum { GEMM_ABOVE = 32 };                                    /* x rows; see above */

/* Weight formats, in gemv.cu's order: the kernels' name suffix and the lowest
 * compute capability with a GEMM for the format (0: none). */
enum { F_F32, F_F16, F_BF16, F_Q8_0, F_Q4_0, F_Q4_1, F_Q4_K, F_Q6_K, F_NF4, F_COUNT };
static const struct {
    const char *suffix;
    int gemm_cc;
} fmts[F_COUNT] = {
    [F_F32] = {"f32", 0},    [F_F16] = {"f16", 75},   [F_BF16] = {"bf16", 80},
    [F_Q8_0] = {"q8_0", 75}, [F_Q4_0] = {"q4_0", 75}, [F_Q4_1] = {"q4_1", 75},
    [F_Q4_K] = {"q4_k", 75}, [F_Q6_K] = {"q6_k", 75}, [F_NF4] = {"nf4", 75},
};

enum { P_GEMV, P_GEMM };

/* One device's module and kernels. */
typedef struct gemv_dev {
    khub_cuda_module *mod; /* NULL until the first call there loads it */
    int cc;                /* the device's compute capability, 10 x major + minor */
    void *fn[2][F_COUNT];  /* CUfunction per path and format, looked up on first use */
} gemv_dev;

typedef struct gemv_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    gemv_dev dev[KHUB_CG_MAX_DEVICES];
} gemv_state;

static gemv_state g_state = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int32_t score(void *sp)
{
    const khub_host_api *host = ((gemv_state *)sp)->host;
    int n = 0;
    return host->cuda_device_count(host->host_ctx, &n) == KHUB_STATUS_OK && n > 0 ? 1 : 0;
}

static khub_status load_locked(gemv_state *s, int dev)
{
    const khub_host_api *host = s->host;
    gemv_dev *d = &s->dev[dev];
    int cc = 0;
    KHUB_CG_TRY(host->cuda_device_cc(host->host_ctx, dev, &cc));
    KHUB_CG_TRY(
        khub_cg_load_ptx(host, dev, cc, "gemv", ccs, sizeof ccs / sizeof ccs[0], "gemv", &d->mod));
    d->cc = cc;
    return KHUB_STATUS_OK;
}

/* The path for n x rows of format f on device dev (loading the module on
 * the first call there: the path depends on the device's capability) and
 * its kernel, looked up on first use. */
static khub_status kernel(gemv_state *s, int dev, int f, int64_t n, int *p, void **fn)
{
    pthread_mutex_lock(&s->lock);
    gemv_dev *d = &s->dev[dev];
    khub_status st = d->mod ? KHUB_STATUS_OK : load_locked(s, dev);
    if (st == KHUB_STATUS_OK) {
        *p = n > GEMM_ABOVE && fmts[f].gemm_cc && d->cc >= fmts[f].gemm_cc ? P_GEMM : P_GEMV;
        if (!d->fn[*p][f]) {
            char name[32];
            snprintf(name, sizeof name, "khub_%s_%s", *p == P_GEMM ? "gemm" : "gemv",
                     fmts[f].suffix);
            st = s->host->cuda_module_function(s->host->host_ctx, d->mod, name, &d->fn[*p][f]);
        }
        *fn = d->fn[*p][f];
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The format of a weight dtype, and the bytes of one W row of `in` weights;
 * -1 when the op does not serve the dtype. */
static int format_of(khub_dtype dt, int64_t in, int64_t *row_bytes)
{
    int id = khub_dtype_id_of(dt);
    if (id == KHUB_DTYPE_ID_F32) return *row_bytes = in * 4, F_F32;
    if (id == KHUB_DTYPE_ID_F16) return *row_bytes = in * 2, F_F16;
    if (id == KHUB_DTYPE_ID_BF16) return *row_bytes = in * 2, F_BF16;
    if (dt.code != KHUB_DL_BLOCKQ) return -1;
    khub_qformat f = (khub_qformat)dt.bits;
    int64_t be = khub_qformat_block_elems(f);
    if (!be || in % be) return -1;
    *row_bytes = khub_qformat_row_bytes(f, in);
    switch (f) {
    case KHUB_QFORMAT_Q8_0: return F_Q8_0;
    case KHUB_QFORMAT_Q4_0: return F_Q4_0;
    case KHUB_QFORMAT_Q4_1: return F_Q4_1;
    case KHUB_QFORMAT_Q4_K: return F_Q4_K;
    case KHUB_QFORMAT_Q6_K: return F_Q6_K;
    case KHUB_QFORMAT_NF4: return F_NF4;
    default: return -1;
    }
}

static bool on_cuda(const khub_tensor *t, int ndim)
{
    return t && t->ndim == ndim && t->shape && t->device.device_type == KHUB_DEVICE_CUDA;
}

static uint64_t addr_of(const khub_tensor *t)
{
    return (uint64_t)(uintptr_t)t->data + t->byte_offset;
}

/* A 2-D f32 CUDA tensor whose rows are contiguous (inner stride 1, rows at
 * least a row apart) at a 4-byte aligned address: its row stride in floats. */
static bool f32_rows(const khub_tensor *t, int64_t *ld)
{
    if (!on_cuda(t, 2) || khub_dtype_id_of(t->dtype) != KHUB_DTYPE_ID_F32 || (addr_of(t) & 3))
        return false;
    *ld = t->shape[1];
    if (!t->strides) return true;
    if (t->strides[1] != 1) return false;
    if (t->shape[0] > 1) *ld = t->strides[0];
    return *ld >= t->shape[1];
}

/* One call's arguments for the kernels, checked. */
typedef struct lin_call {
    uint64_t x, w, bias, y; /* device addresses of element 0 */
    int64_t n, in, out, row_bytes, sx, sy;
    int f; /* format */
} lin_call;

static khub_status check_args(const khub_host_api *host, const char *op, const khub_linear_args *a,
                              lin_call *c)
{
    void *hc = host->host_ctx;
    if (!a || a->struct_size < sizeof *a)
        return host->fail(hc, KHUB_STATUS_INVALID_ARG, "%s (cuda): args too small", op);
    if (!f32_rows(a->x, &c->sx))
        return host->fail(hc, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): x must be a 2-D f32 CUDA tensor [n, in] with contiguous "
                          "rows (strides none or [s >= in, 1]) at a 4-byte aligned address",
                          op);
    if (!f32_rows(a->y, &c->sy))
        return host->fail(hc, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): y must be a 2-D f32 CUDA tensor [n, out] with contiguous "
                          "rows (strides none or [s >= out, 1]) at a 4-byte aligned address",
                          op);
    if (!on_cuda(a->weight, 2) || a->weight->strides)
        return host->fail(hc, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): weight must be a compact 2-D CUDA tensor [out, in]", op);
    if (a->bias && (!on_cuda(a->bias, 1) || khub_dtype_id_of(a->bias->dtype) != KHUB_DTYPE_ID_F32 ||
                    (a->bias->strides && a->bias->strides[0] != 1) || (addr_of(a->bias) & 3)))
        return host->fail(hc, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): bias must be a 1-D f32 CUDA tensor [out] with unit stride "
                          "at a 4-byte aligned address, or none",
                          op);
    c->n = a->x->shape[0], c->in = a->x->shape[1], c->out = a->weight->shape[0];
    c->f = format_of(a->weight->dtype, c->in, &c->row_bytes);
    if (c->f < 0)
        return host->fail(hc, KHUB_STATUS_UNSUPPORTED,
                          "%s (cuda): weight dtype (code %u, bits %u) with %lld columns is not "
                          "served (f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, NF4 in whole "
                          "blocks)",
                          op, a->weight->dtype.code, a->weight->dtype.bits, (long long)c->in);
    if (a->weight->shape[1] != c->in || a->y->shape[0] != c->n || a->y->shape[1] != c->out ||
        (a->bias && a->bias->shape[0] != c->out) || c->n <= 0 || c->in <= 0 || c->out <= 0 ||
        c->in > 0x7fffffff || c->out > 0x7fffffff || c->n > 0x7fffffff)
        return host->fail(hc, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): shapes x [%lld, %lld], weight [%lld, %lld], y [%lld, %lld] "
                          "do not agree (or exceed 2^31 - 1)",
                          op, (long long)c->n, (long long)c->in, (long long)c->out,
                          (long long)a->weight->shape[1], (long long)a->y->shape[0],
                          (long long)a->y->shape[1]);
    c->x = addr_of(a->x), c->y = addr_of(a->y), c->w = addr_of(a->weight);
    c->bias = a->bias ? addr_of(a->bias) : 0;
    int elem = c->f == F_F32 ? 4 : c->f == F_F16 || c->f == F_BF16 ? 2 : 1;
    if (c->w % (uint64_t)elem)
        return host->fail(hc, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): weight address 0x%llx is not aligned to its %d-byte elements",
                          op, (unsigned long long)c->w, elem);
    if (c->x == c->y)
        return host->fail(hc, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): y aliases x (want separate "
                          "memory)",
                          op);
    return KHUB_STATUS_OK;
}

static khub_status run(void *sp, const void *args, const char *op)
{
    gemv_state *s = sp;
    const khub_host_api *host = s->host;
    const khub_linear_args *a = args;
    lin_call c;
    khub_status st = check_args(host, op, a, &c);
    if (st != KHUB_STATUS_OK) return st;
    void *fn = NULL;
    int p = P_GEMV, dev = 0;
    KHUB_CG_TRY(khub_cg_device(host, op, a->x->device, &dev));
    if ((st = kernel(s, dev, c.f, c.n, &p, &fn)) != KHUB_STATUS_OK) return st;
    int64_t rows_per = p == P_GEMM ? BM : NT, cols_per = p == P_GEMM ? BN : WARPS;
    if ((c.n + rows_per - 1) / rows_per > 65535)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s (cuda): %lld x rows exceed the grid (%lld rows per call on this "
                          "path)",
                          op, (long long)c.n, (long long)(65535 * rows_per));
    const void *x = (const void *)(uintptr_t)c.x, *w = (const void *)(uintptr_t)c.w,
               *bias = (const void *)(uintptr_t)c.bias;
    void *y = (void *)(uintptr_t)c.y;
    int32_t n32 = (int32_t)c.n, in32 = (int32_t)c.in, out32 = (int32_t)c.out;
    long long rb = c.row_bytes, sx = c.sx, sy = c.sy;
    void *params[] = {&x, &w, &bias, &y, &n32, &in32, &out32, &rb, &sx, &sy};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)((c.out + cols_per - 1) / cols_per),
                                         (uint32_t)((c.n + rows_per - 1) / rows_per), 1},
                                .block = {THREADS, 1, 1}, .stream = a->stream};
    return host->cuda_launch(host->host_ctx, fn, &cfg, params);
}

static khub_status linear(void *sp, const void *args) { return run(sp, args, "linear"); }
static khub_status qlinear(void *sp, const void *args) { return run(sp, args, "qlinear"); }

static const khub_op_caps linear_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16) |
              KHUB_DTYPE_BIT(KHUB_DTYPE_ID_BF16),
    .flags = KHUB_CAP_BIAS,
    .cc_min = 75,
    .priority = 30,
};

static const khub_op_caps qlinear_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_0) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_1) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_K) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q6_K) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_NF4),
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
    pthread_mutex_lock(&g_state.lock);
    g_state.host = h;
    memset(g_state.dev, 0, sizeof g_state.dev);
    pthread_mutex_unlock(&g_state.lock);
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/gemv",
                          .version = "1.1.0",
                          .n_ops = 2,
                          .ops = ops,
                          .state = &g_state,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_gemv_cuda_init, "kernels-community/gemv", "1.1.0",
                         KHUB_KIND_BIT(KHUB_OP_LINEAR) | KHUB_KIND_BIT(KHUB_OP_QLINEAR))
