/*
 * norm.c: reference RMS and layer norm with an optional fused residual add
 * (op "rms_norm", kind KHUB_OP_NORM).
 *
 * Per row i, with r = x[i] when residual is NULL, else
 *     r = x[i] + residual[i]   and residual[i] := r   (written back first)
 * the output is
 *     RMS:    y[i, j] = (float)(r_j / sqrt(mean(r^2) + eps)) * w_j
 *     LAYER:  y[i, j] = (float)((r_j - mean(r)) / sqrt(var(r) + eps)) * w_j
 * (var is the biased variance; khub_norm_args has no bias term). The cast to
 * f32 before the weight multiply follows Transformers' LlamaRMSNorm. Means
 * accumulate in double. y may alias x (each element is read before the
 * same element is written); y may not alias residual, which must keep r.
 */
#include <math.h>

#include "ref_cpu.h"

#define OP "rms_norm"

typedef struct norm_job {
    const khub_norm_args *a;
    int64_t dim;
    int64_t sx[2], sr[2], sw[1], sy[2];
    const float *x, *w;
    float *res, *y;
} norm_job;

static void norm_row(const norm_job *j, int64_t i)
{
    int64_t n = j->dim;
    if (j->res) {
        for (int64_t k = 0; k < n; k++) {
            float *r = &j->res[i * j->sr[0] + k * j->sr[1]];
            *r = j->x[i * j->sx[0] + k * j->sx[1]] + *r; /* an f32 add, as in Transformers */
        }
    }
    /* From here r is read from residual (already summed) or from x. */
    const float *src = j->res ? j->res : j->x;
    const int64_t *ss = j->res ? j->sr : j->sx;
    double mean = 0.0, sq = 0.0;
    for (int64_t k = 0; k < n; k++) mean += src[i * ss[0] + k * ss[1]];
    mean /= (double)n;
    for (int64_t k = 0; k < n; k++) {
        double r = src[i * ss[0] + k * ss[1]];
        double c = j->a->norm_type == KHUB_NORM_LAYER ? r - mean : r;
        sq += c * c;
    }
    double center = j->a->norm_type == KHUB_NORM_LAYER ? mean : 0.0;
    double inv = 1.0 / sqrt(sq / (double)n + (double)j->a->eps);
    for (int64_t k = 0; k < n; k++) {
        double r = src[i * ss[0] + k * ss[1]];
        float normed = (float)((r - center) * inv);
        j->y[i * j->sy[0] + k * j->sy[1]] = normed * j->w[k * j->sw[0]];
    }
}

static void norm_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    for (int64_t i = begin; i < end; i++) norm_row(ud, i);
}

static khub_status norm_check(const khub_host_api *host, const khub_norm_args *a)
{
    const uint64_t f32 = KHUB_REF_BIT_F32;
    void *c = host->host_ctx;
    if (a->norm_type != KHUB_NORM_RMS && a->norm_type != KHUB_NORM_LAYER)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": norm_type (got %u, want 1 (RMS) or 2 (LAYER))",
                          (unsigned)a->norm_type);
    if (!(a->eps >= 0.0f) || !isfinite(a->eps))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": eps (got %g, want finite >= 0)",
                          (double)a->eps);
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "x", a->x, 2, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "weight", a->weight, 1, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "y", a->y, 2, f32, KHUB_DEVICE_CPU));
    int64_t n = a->x->shape[0], dim = a->x->shape[1];
    if (dim < 1)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": x.shape[1] (dim) (got %lld, want >= 1)",
                          (long long)dim);
    KHUB_PU_TRY(khub_pu_dim_check(host, OP, "weight", a->weight, 0, dim, "dim"));
    KHUB_PU_TRY(khub_pu_dim_check(host, OP, "y", a->y, 0, n, "n"));
    KHUB_PU_TRY(khub_pu_dim_check(host, OP, "y", a->y, 1, dim, "dim"));
    if (a->residual) {
        KHUB_PU_TRY(
            khub_pu_tensor_check(host, OP, "residual", a->residual, 2, f32, KHUB_DEVICE_CPU));
        KHUB_PU_TRY(khub_pu_dim_check(host, OP, "residual", a->residual, 0, n, "n"));
        KHUB_PU_TRY(khub_pu_dim_check(host, OP, "residual", a->residual, 1, dim, "dim"));
        if (a->residual->data == a->y->data && a->residual->byte_offset == a->y->byte_offset)
            return host->fail(
                c, KHUB_STATUS_INVALID_ARG,
                OP ": y aliases residual (want y separate; residual keeps x + residual)");
    }
    return KHUB_STATUS_OK;
}

static khub_status ref_norm(void *state, const void *args)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(khub_pu_args_check(host, OP, args, sizeof(khub_norm_args)));
    const khub_norm_args *a = args;
    KHUB_PU_TRY(norm_check(host, a));
    norm_job j = {.a = a, .dim = a->x->shape[1]};
    khub_pu_strides(a->x, j.sx);
    khub_pu_strides(a->weight, j.sw);
    khub_pu_strides(a->y, j.sy);
    j.x = khub_pu_base(a->x);
    j.w = khub_pu_base(a->weight);
    j.y = khub_pu_base(a->y);
    if (a->residual) {
        khub_pu_strides(a->residual, j.sr);
        j.res = khub_pu_base(a->residual);
    }
    if (a->x->shape[0] > 0) host->parallel_for(host->host_ctx, a->x->shape[0], norm_range, &j);
    return KHUB_STATUS_OK;
}

static const khub_op_caps norm_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32,
    .flags = KHUB_CAP_RESIDUAL,
};

const khub_op_desc khub_ref__norm_op = {
    KHUB_STRUCT_INIT(khub_op_desc),
    .name = "rms_norm",
    .kind = KHUB_OP_NORM,
    .caps = &norm_caps,
    .run = ref_norm,
};
