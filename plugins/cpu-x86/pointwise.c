/*
 * pointwise.c: row-wise ops, vectorised 8 floats at a time: RMS and layer
 * norm (optionally fused with the residual add of a pre-norm block) and the
 * gated MLP activations silu(gate) * up and gelu_tanh(gate) * up.
 *
 * Both activations are x * sigmoid(t): t = x for SiLU, and for the tanh GELU
 * t = 2 sqrt(2/pi) (x + 0.044715 x^3), since 0.5 (1 + tanh z) = sigmoid(2z).
 * sigmoid uses kx_exp8 (below), whose relative error is a few ulp.
 * Rows are split over threads when there are more than KX_INLINE_ELEMS
 * elements.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "kx_simd.h"

/* ------------------------------------------------------------------------ */
/* exp(x), 8 lanes                                                          */
/* ------------------------------------------------------------------------ */

/* exp(x) = 2^n e^r with n = round(x / ln 2), |r| <= ln2 / 2, e^r by its
 * degree-6 Taylor polynomial (truncation error < 2e-8 relative on that range)
 * and 2^n built in the exponent field. Inputs are clamped to [-87, 88] so
 * 2^n stays a normal float. max/min return their second operand for a NaN,
 * so a NaN input becomes -87; the activations still return NaN because they
 * multiply by x, and softmax callers never pass NaN scores below the max. */
__m256 KX(exp8)(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2 in two steps (Cody-Waite) so r keeps its low bits. */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* ------------------------------------------------------------------------ */
/* Norms                                                                    */
/* ------------------------------------------------------------------------ */

/* Normalises one row: h = x (+ res, stored back into res), then
 * y = (h - mu) * inv * w, where mu = 0 for RMS. */
static void norm_row(const kx_norm *a, int64_t t)
{
    const float *x = a->x + t * a->ldx;
    float *y = a->y + t * a->ldy;
    const float *h = x;
    const int64_t d = a->dim;
    int64_t i;
    if (a->res) {
        float *res = a->res + t * a->ldr;
        for (i = 0; i + 8 <= d; i += 8)
            _mm256_storeu_ps(res + i,
                             _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(res + i)));
        for (; i < d; i++) res[i] += x[i];
        h = res;
    }
    float mu = 0.0f;
    if (a->type == KHUB_NORM_LAYER) {
        __m256 s = _mm256_setzero_ps();
        for (i = 0; i + 8 <= d; i += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(h + i));
        float sum = kx_hsum8(s);
        for (; i < d; i++) sum += h[i];
        mu = sum / (float)d;
    }
    __m256 vmu = _mm256_set1_ps(mu), s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (i = 0; i + 16 <= d; i += 16) {
        __m256 a0 = _mm256_sub_ps(_mm256_loadu_ps(h + i), vmu);
        __m256 a1 = _mm256_sub_ps(_mm256_loadu_ps(h + i + 8), vmu);
        s0 = _mm256_fmadd_ps(a0, a0, s0);
        s1 = _mm256_fmadd_ps(a1, a1, s1);
    }
    float ss = kx_hsum8(_mm256_add_ps(s0, s1));
    for (; i < d; i++) ss += (h[i] - mu) * (h[i] - mu);
    float inv = 1.0f / sqrtf(ss / (float)d + a->eps);
    __m256 vinv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= d; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(h + i), vmu), vinv);
        _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(a->w + i)));
    }
    for (; i < d; i++) y[i] = (h[i] - mu) * inv * a->w[i];
}

static void norm_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    for (int64_t t = begin; t < end; t++) norm_row(ud, t);
}

khub_status KX(norm_run)(kx_state *s, const kx_norm *a)
{
    if (a->n * a->dim > KX_INLINE_ELEMS)
        s->host->parallel_for(s->host->host_ctx, a->n, norm_range, (void *)a);
    else
        norm_range((void *)a, 0, a->n, 0);
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* Gated activations                                                        */
/* ------------------------------------------------------------------------ */

static inline float sigmoid1(float t) { return 1.0f / (1.0f + expf(-t)); }

static void act_row(const kx_act *a, int64_t t)
{
    const float *g = a->gate + t * a->ldg, *u = a->up + t * a->ldu;
    float *y = a->y + t * a->ldy;
    const int gelu = a->type == KHUB_ACT_GELU_TANH;
    const float c0 = 1.5957691216057308f; /* 2 sqrt(2/pi) */
    const __m256 one = _mm256_set1_ps(1.0f), vc0 = _mm256_set1_ps(c0);
    const __m256 vc1 = _mm256_set1_ps(0.044715f * c0);
    int64_t i = 0;
    for (; i + 8 <= a->ff; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i), tv = x;
        if (gelu) tv = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_mul_ps(x, x), vc1, vc0));
        __m256 e = KX(exp8)(_mm256_sub_ps(_mm256_setzero_ps(), tv));
        __m256 sg = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
    for (; i < a->ff; i++) {
        float x = g[i], tv = gelu ? c0 * (x + 0.044715f * x * x * x) : x;
        y[i] = x * sigmoid1(tv) * u[i];
    }
}

static void act_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    for (int64_t t = begin; t < end; t++) act_row(ud, t);
}

khub_status KX(act_run)(kx_state *s, const kx_act *a)
{
    if (a->n * a->ff > KX_INLINE_ELEMS)
        s->host->parallel_for(s->host->host_ctx, a->n, act_range, (void *)a);
    else
        act_range((void *)a, 0, a->n, 0);
    return KHUB_STATUS_OK;
}
