/*
 * rmsnorm.c: kernels-community/rmsnorm for the CPU.
 *
 * y = x' / sqrt(mean(x'^2) + eps) * weight, where x' = x + residual when a
 * residual is given (and x' is written back into residual), else x. Built
 * once per feature level; with AVX2 the row loops use 8-wide FMA, otherwise
 * they are plain C the compiler may vectorise.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include <khub/khub_plugin.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RMS_LEVEL "avx2"
#else
#define RMS_LEVEL "generic"
#endif

typedef struct row_job {
    const float *x;
    float *res;
    const float *w;
    float *y;
    int64_t dim;
    float eps;
} row_job;

static float sum_squares(const float *v, int64_t n)
{
    int64_t i = 0;
    float acc = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 s = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(v + i);
        s = _mm256_fmadd_ps(a, a, s);
    }
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    acc = _mm_cvtss_f32(lo);
#endif
    for (; i < n; i++) acc += v[i] * v[i];
    return acc;
}

static void rows(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const row_job *j = ud;
    for (int64_t r = begin; r < end; r++) {
        const float *x = j->x + r * j->dim;
        float *y = j->y + r * j->dim;
        const float *src = x;
        if (j->res) {
            float *res = j->res + r * j->dim;
            for (int64_t i = 0; i < j->dim; i++) res[i] += x[i];
            src = res;
        }
        float scale = 1.0f / sqrtf(sum_squares(src, j->dim) / (float)j->dim + j->eps);
        for (int64_t i = 0; i < j->dim; i++) y[i] = src[i] * scale * j->w[i];
    }
}

static int is_f32_2d(const khub_tensor *t, int64_t rows_n, int64_t dim)
{
    return t && t->ndim == 2 && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           t->shape[0] == rows_n && t->shape[1] == dim && !t->strides;
}

static khub_status rms_norm(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_norm_args *a = args;
    if (!a || a->struct_size < sizeof(khub_norm_args) || a->norm_type != KHUB_NORM_RMS)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "rms_norm: needs khub_norm_args with KHUB_NORM_RMS");
    if (!a->x || a->x->ndim != 2)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "rms_norm: x must be [n, dim]");
    int64_t n = a->x->shape[0], dim = a->x->shape[1];
    if (!is_f32_2d(a->x, n, dim) || !is_f32_2d(a->y, n, dim) ||
        (a->residual && !is_f32_2d(a->residual, n, dim)) || !a->weight || a->weight->ndim != 1 ||
        a->weight->shape[0] != dim)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "rms_norm: x, y, residual must be compact f32 [%lld, %lld] and weight "
                          "[%lld]",
                          (long long)n, (long long)dim, (long long)dim);
    row_job j = {(const float *)((char *)a->x->data + a->x->byte_offset),
                 a->residual ? (float *)((char *)a->residual->data + a->residual->byte_offset)
                             : NULL,
                 (const float *)((char *)a->weight->data + a->weight->byte_offset),
                 (float *)((char *)a->y->data + a->y->byte_offset),
                 dim,
                 a->eps};
    host->parallel_for(host->host_ctx, n, rows, &j);
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
#if defined(__AVX2__) && defined(__FMA__)
    .cpu_features = KHUB_CPU_AVX2 | KHUB_CPU_FMA,
    .priority = 20,
#else
    .priority = 10,
#endif
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
    .flags = KHUB_CAP_RESIDUAL,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "rms_norm", .kind = KHUB_OP_NORM, .caps = &caps,
     .run = rms_norm},
};

khub_status khub_rmsnorm_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                              size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/rmsnorm",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = (void *)h};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_rmsnorm_init, "kernels-community/rmsnorm", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_NORM))
