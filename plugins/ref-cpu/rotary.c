/*
 * rotary.c: reference rotary position embedding, in place (op "rotary").
 *
 * With rd = rotary_dim (head_dim when 0) and j in [0, rd/2):
 *     inv_freq[j] = theta^(-2j / rd), then scaled:
 *       LINEAR:  inv_freq[j] / factor   (positions divided by factor)
 *       LLAMA3:  Llama 3.1's rule. wavelen = 2 pi / inv_freq[j]; with
 *                low = original_max_pos / low_freq_factor and
 *                high = original_max_pos / high_freq_factor:
 *                  wavelen < high: unchanged (high frequencies);
 *                  wavelen > low:  inv_freq / factor (low frequencies);
 *                  otherwise:      (1 - s) inv_freq / factor + s inv_freq,
 *                                  s = (original_max_pos / wavelen - low_freq_factor)
 *                                      / (high_freq_factor - low_freq_factor).
 *     angle = position * inv_freq[j], rotating the pair (a, b) to
 *     (a cos - b sin, b cos + a sin), where the pair is
 *       NEOX:         (x[j], x[j + rd/2])     (HF Llama's rotate_half)
 *       INTERLEAVED:  (x[2j], x[2j + 1])      (GPT-J / original Llama)
 * Dimensions >= rd are left alone (partial rotary). Frequencies, angles,
 * cos and sin are computed in double.
 */
#include <math.h>

#include "ref_cpu.h"

#define OP "rotary"

typedef struct rope_job {
    const khub_rotary_args *a;
    int64_t n_heads, half;
    int64_t sx[3];
    float *x;
    const double *inv_freq; /* [half] */
} rope_job;

/* Llama 3.1 frequency-dependent scaling of one inverse frequency. */
static double rope_llama3(const khub_rotary_args *a, double inv)
{
    const double pi = 3.14159265358979323846;
    double omp = a->original_max_pos, lf = a->low_freq_factor, hf = a->high_freq_factor;
    double wavelen = 2.0 * pi / inv;
    if (wavelen < omp / hf) return inv;
    if (wavelen > omp / lf) return inv / a->factor;
    double s = (omp / wavelen - lf) / (hf - lf);
    return (1.0 - s) * inv / a->factor + s * inv;
}

static void rope_freqs(const khub_rotary_args *a, int64_t half, double *inv)
{
    for (int64_t j = 0; j < half; j++) {
        double f = pow((double)a->theta, -(double)(2 * j) / (double)(2 * half));
        if (a->scaling == KHUB_ROPE_SCALING_LINEAR) f /= a->factor;
        if (a->scaling == KHUB_ROPE_SCALING_LLAMA3) f = rope_llama3(a, f);
        inv[j] = f;
    }
}

static void rope_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const rope_job *j = ud;
    bool neox = j->a->style == KHUB_ROPE_NEOX;
    for (int64_t i = begin; i < end; i++) {
        double pos = j->a->positions[i];
        for (int64_t p = 0; p < j->half; p++) {
            double ang = pos * j->inv_freq[p], c = cos(ang), s = sin(ang);
            int64_t ia = neox ? p : 2 * p, ib = neox ? p + j->half : 2 * p + 1;
            for (int64_t h = 0; h < j->n_heads; h++) {
                float *x = j->x + i * j->sx[0] + h * j->sx[1];
                double xa = x[ia * j->sx[2]], xb = x[ib * j->sx[2]];
                x[ia * j->sx[2]] = (float)(xa * c - xb * s);
                x[ib * j->sx[2]] = (float)(xb * c + xa * s);
            }
        }
    }
}

static khub_status rope_check_scaling(const khub_host_api *host, const khub_rotary_args *a)
{
    void *c = host->host_ctx;
    if (a->scaling > KHUB_ROPE_SCALING_LLAMA3)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": scaling (got %u, want 0 (NONE), 1 (LINEAR) or 2 (LLAMA3))",
                          (unsigned)a->scaling);
    if (a->scaling != KHUB_ROPE_SCALING_NONE && !(a->factor > 0.0f && isfinite(a->factor)))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": factor (got %g, want finite > 0)",
                          (double)a->factor);
    if (a->scaling == KHUB_ROPE_SCALING_LLAMA3 &&
        (!(a->low_freq_factor > 0.0f) || !(a->high_freq_factor > a->low_freq_factor) ||
         !isfinite(a->high_freq_factor) || a->original_max_pos < 1))
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": llama3 scaling (got low_freq_factor %g, high_freq_factor %g, "
                             "original_max_pos %d; want 0 < low < high and original_max_pos >= 1)",
                          (double)a->low_freq_factor, (double)a->high_freq_factor,
                          (int)a->original_max_pos);
    return KHUB_STATUS_OK;
}

static khub_status rope_check(const khub_host_api *host, const khub_rotary_args *a, int64_t *rd)
{
    void *c = host->host_ctx;
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "x", a->x, 3, KHUB_REF_BIT_F32, KHUB_DEVICE_CPU));
    if (a->style != KHUB_ROPE_NEOX && a->style != KHUB_ROPE_INTERLEAVED)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": style (got %u, want 1 (NEOX) or 2 (INTERLEAVED))",
                          (unsigned)a->style);
    if (!(a->theta > 0.0f) || !isfinite(a->theta))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": theta (got %g, want finite > 0)",
                          (double)a->theta);
    KHUB_PU_TRY(rope_check_scaling(host, a));
    int64_t head_dim = a->x->shape[2];
    *rd = a->rotary_dim == 0 ? head_dim : a->rotary_dim;
    if (*rd < 2 || *rd % 2 != 0 || *rd > head_dim)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": rotary_dim (got %lld, want an even number in 2..head_dim %lld)",
                          (long long)*rd, (long long)head_dim);
    if (a->x->shape[0] > 0 && !a->positions)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": positions is NULL (want [%lld])",
                          (long long)a->x->shape[0]);
    return KHUB_STATUS_OK;
}

static khub_status ref_rotary(void *state, const void *args)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(khub_pu_args_check(host, OP, args, sizeof(khub_rotary_args)));
    const khub_rotary_args *a = args;
    int64_t rd = 0;
    KHUB_PU_TRY(rope_check(host, a, &rd));
    int64_t n = a->x->shape[0];
    if (n == 0 || a->x->shape[1] == 0) return KHUB_STATUS_OK;
    double *inv = host->alloc(host->host_ctx, (size_t)(rd / 2) * sizeof(double));
    if (!inv)
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          OP ": out of memory for %lld frequencies", (long long)(rd / 2));
    rope_freqs(a, rd / 2, inv);
    rope_job j = {.a = a, .n_heads = a->x->shape[1], .half = rd / 2, .inv_freq = inv};
    khub_pu_strides(a->x, j.sx);
    j.x = khub_pu_base(a->x);
    host->parallel_for(host->host_ctx, n, rope_range, &j);
    host->free(host->host_ctx, inv);
    return KHUB_STATUS_OK;
}

static const khub_op_caps rotary_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32,
};

const khub_op_desc khub_ref__rotary_op = {
    KHUB_STRUCT_INIT(khub_op_desc), .name = "rotary",  .kind = KHUB_OP_ROTARY,
    .caps = &rotary_caps,           .run = ref_rotary,
};
