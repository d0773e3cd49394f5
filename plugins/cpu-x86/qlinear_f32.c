/*
 * qlinear_f32.c: y = x @ W^T for block-quantized W (Q4_0, Q4_1, Q8_0) with
 * f32 activations: the default qlinear of the optimized plugins.
 *
 * Why not int8 activations (qlinear.c): rounding x to 8 bits per 32-block
 * costs an NMSE of about 1e-4 per matmul on SmolLM2's real hidden states
 * (which have outlier channels), and over 30 layers that moved the logits by
 * ~5% and changed greedy tokens against Transformers. Here the weights are
 * dequantized exactly (f16 scale times integer code is exact in f32) and
 * multiplied with f32 x, so the only difference from the reference is f32
 * summation order.
 *
 * The math per block of 32: w_i = d q_i + c with c = m (Q4_1), -8 d (Q4_0),
 * 0 (Q8_0); so sum_i w_i x_i = d * sum_i q_i x_i + c * sum_i x_i. The block
 * sums of x are computed once per token and shared by every row; per (row,
 * token) the codes become f32 lanes (vpmovzxbd / vpmovsxbd + vcvtdq2ps)
 * and four FMAs accumulate q.x, then one FMA scales by d. Work split as in
 * qlinear.c: tiles of TR rows x TC tokens, so decode streams TR rows with
 * independent accumulators and prefill reuses each converted block TC times.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kx_simd.h"

#define QK 32
#define TR 4
#define TC 2

static inline size_t blk_bytes(int fmt)
{
    return fmt == KHUB_QFORMAT_Q8_0 ? 34 : fmt == KHUB_QFORMAT_Q4_0 ? 18 : 20;
}

/* The 32 codes of a block as four vectors of f32 in element order; d and c
 * receive the block's scale and additive term. */
static inline __attribute__((always_inline)) void codes(const int fmt, const uint8_t *blk,
                                                        __m256 q[4], float *d, float *c)
{
    *d = _cvtsh_ss(kx_rd16(blk));
    if (fmt == KHUB_QFORMAT_Q8_0) {
        *c = 0.0f;
        const int8_t *s = (const int8_t *)(blk + 2);
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + 8 * k))));
        return;
    }
    const uint8_t *qs = blk + (fmt == KHUB_QFORMAT_Q4_1 ? 4 : 2);
    *c = fmt == KHUB_QFORMAT_Q4_1 ? _cvtsh_ss(kx_rd16(blk + 2)) : -8.0f * *d;
    __m128i r = _mm_loadu_si128((const __m128i *)qs);
    __m128i lo = _mm_and_si128(r, _mm_set1_epi8(0x0f));                    /* elements 0..15 */
    __m128i hi = _mm_and_si128(_mm_srli_epi16(r, 4), _mm_set1_epi8(0x0f)); /* elements 16..31 */
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

/* One tr x tc tile (tr <= TR, tc <= TC, constants after inlining). */
static inline __attribute__((always_inline)) void tile(const int fmt, const int tr, const int tc,
                                                       const uint8_t *w, size_t wrb, const float *x,
                                                       int64_t ldx, const float *xsum, int64_t nb,
                                                       const float *bias, float *y, int64_t ldy)
{
    __m256 acc[TR][TC];
    float cor[TR][TC];
    const size_t bb = blk_bytes(fmt);
    for (int r = 0; r < tr; r++)
        for (int c = 0; c < tc; c++) {
            acc[r][c] = _mm256_setzero_ps();
            cor[r][c] = 0.0f;
        }
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < tr; r++) {
            __m256 q[4];
            float d, cc;
            codes(fmt, w + (size_t)r * wrb + (size_t)b * bb, q, &d, &cc);
            const __m256 vd = _mm256_set1_ps(d);
            for (int c = 0; c < tc; c++) {
                const float *xb = x + c * ldx + b * QK;
                __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
                t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), t);
                t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), t);
                t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), t);
                acc[r][c] = _mm256_fmadd_ps(t, vd, acc[r][c]);
                cor[r][c] += cc * xsum[c * nb + b];
            }
        }
    }
    for (int c = 0; c < tc; c++)
        for (int r = 0; r < tr; r++)
            y[c * ldy + r] = kx_hsum8(acc[r][c]) + cor[r][c] + (bias ? bias[r] : 0.0f);
}

typedef void (*tile_fn)(const uint8_t *w, size_t wrb, const float *x, int64_t ldx,
                        const float *xsum, int64_t nb, const float *bias, float *y, int64_t ldy);

#define FT_DEF(F, FMT, R, C) \
    static void ft_##F##_##R##x##C(const uint8_t *w, size_t wrb, const float *x, int64_t ldx, \
                                   const float *xsum, int64_t nb, const float *bias, float *y, \
                                   int64_t ldy) \
    { \
        tile(FMT, R, C, w, wrb, x, ldx, xsum, nb, bias, y, ldy); \
    }
// clang-format 14 does not settle on sequences of macro calls.
// clang-format off
#define FT_FMT(F, FMT) \
    FT_DEF(F, FMT, 1, 1) FT_DEF(F, FMT, 1, 2) FT_DEF(F, FMT, 2, 1) FT_DEF(F, FMT, 2, 2) \
    FT_DEF(F, FMT, 3, 1) FT_DEF(F, FMT, 3, 2) FT_DEF(F, FMT, 4, 1) FT_DEF(F, FMT, 4, 2)
// clang-format on
#define FT_PTRS(F) \
    { \
        {ft_##F##_1x1, ft_##F##_1x2}, {ft_##F##_2x1, ft_##F##_2x2}, {ft_##F##_3x1, ft_##F##_3x2}, \
        { \
            ft_##F##_4x1, ft_##F##_4x2 \
        } \
    }

FT_FMT(q4_0, KHUB_QFORMAT_Q4_0)
FT_FMT(q4_1, KHUB_QFORMAT_Q4_1)
FT_FMT(q8_0, KHUB_QFORMAT_Q8_0)

static const tile_fn ft_q4_0[TR][TC] = FT_PTRS(q4_0);
static const tile_fn ft_q4_1[TR][TC] = FT_PTRS(q4_1);
static const tile_fn ft_q8_0[TR][TC] = FT_PTRS(q8_0);

typedef struct job {
    const kx_linear *a;
    float *xsum; /* [n][nb] block sums of x */
    int64_t nb;
    const tile_fn (*tiles)[TC];
} job;

static void sums_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const job *j = ud;
    for (int64_t t = begin; t < end; t++) {
        const float *x = j->a->x + t * j->a->ldx;
        for (int64_t b = 0; b < j->nb; b++) {
            const float *xb = x + b * QK;
            __m256 s =
                _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                              _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
            j->xsum[t * j->nb + b] = kx_hsum8(s);
        }
    }
}

static void rows_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const job *j = ud;
    const kx_linear *a = j->a;
    for (int64_t rt = begin; rt < end; rt++) {
        int64_t r0 = rt * TR;
        int tr = (int)(a->out - r0 < TR ? a->out - r0 : TR);
        const uint8_t *w = a->w + (size_t)r0 * a->w_row_bytes;
        const float *bias = a->bias ? a->bias + r0 : NULL;
        for (int64_t c0 = 0; c0 < a->n; c0 += TC) {
            int tc = (int)(a->n - c0 < TC ? a->n - c0 : TC);
            j->tiles[tr - 1][tc - 1](w, a->w_row_bytes, a->x + c0 * a->ldx, a->ldx,
                                     j->xsum + c0 * j->nb, j->nb, bias, a->y + c0 * a->ldy + r0,
                                     a->ldy);
        }
    }
}

khub_status KX(qlinear_f32_run)(kx_state *s, const kx_linear *a)
{
    const khub_host_api *h = s->host;
    job j = {.a = a, .nb = a->in / QK};
    switch (a->wfmt) {
    case KHUB_QFORMAT_Q4_0: j.tiles = ft_q4_0; break;
    case KHUB_QFORMAT_Q4_1: j.tiles = ft_q4_1; break;
    case KHUB_QFORMAT_Q8_0: j.tiles = ft_q8_0; break;
    default:
        return KX_FAIL(s, KHUB_STATUS_INTERNAL, "qlinear: format %d reached the kernel", a->wfmt);
    }
    size_t bytes = (size_t)a->n * (size_t)j.nb * sizeof(float);
    j.xsum = h->alloc(h->host_ctx, bytes);
    if (!j.xsum)
        return KX_FAIL(s, KHUB_STATUS_NOMEM, "qlinear: no memory for %zu bytes of block sums",
                       bytes);
    sums_range(&j, 0, a->n, 0);
    h->parallel_for(h->host_ctx, (a->out + TR - 1) / TR, rows_range, &j);
    h->free(h->host_ctx, j.xsum);
    return KHUB_STATUS_OK;
}
