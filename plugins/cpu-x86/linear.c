/*
 * linear.c: y = x @ W^T for dense W in f32, f16 (converted with F16C) or
 * bf16 (a 16-bit shift), accumulated in f32 with FMA.
 *
 * Register blocking: a tile of TR weight rows x TC tokens keeps TR * TC
 * vector accumulators; each step loads 8 weights of every row and 8 inputs of
 * every token and does TR * TC FMAs, so a weight load serves TC tokens. With
 * one token (decode) it is TR independent dot products streaming W. The row
 * length need not be a multiple of 8: the tail is scalar. Threads split the
 * output rows (host->parallel_for over tiles of TR rows).
 *
 * Rejected: packing W into panels first (what BLAS does). For the model sizes
 * here the rows of a tile stay in L1 across all tokens, and a pack per call
 * would cost a full extra pass over W in decode.
 */
#include <immintrin.h>
#include <stdint.h>

#include "kx_simd.h"

#define TR_MAX KX_TR
#define TC_MAX KX_TC

static inline __m256 load8(const int wt, const uint8_t *row, int64_t k)
{
    if (wt == KHUB_DTYPE_ID_F32) return _mm256_loadu_ps((const float *)row + k);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    if (wt == KHUB_DTYPE_ID_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float load1(const int wt, const uint8_t *row, int64_t k)
{
    if (wt == KHUB_DTYPE_ID_F32) return ((const float *)row)[k];
    uint16_t h = kx_rd16(row + 2 * k);
    return wt == KHUB_DTYPE_ID_F16 ? kx_f16_to_f32(h) : kx_bf16_to_f32(h);
}

static inline __attribute__((always_inline)) void tile(const int wt, const int TR, const int TC,
                                                       const kx_linear *a, int64_t r0, int64_t c0)
{
    /* Every loop over r and c is unrolled explicitly (-O2 does not, and
     * TR, TC are constants only after inlining): rolled, the converted
     * weights and acc[][] lived on the stack and every 8 weights paid a store
     * and a reload per row (the prefill GEMM's problem, c72e56e). Same
     * operations in the same order, so the same results. */
    __m256 acc[TR_MAX][TC_MAX];
    const uint8_t *w[TR_MAX];
    const float *x[TC_MAX];
#pragma GCC unroll 4
    for (int r = 0; r < TR; r++) w[r] = a->w + (size_t)(r0 + r) * a->w_row_bytes;
#pragma GCC unroll 4
    for (int c = 0; c < TC; c++) x[c] = a->x + (c0 + c) * a->ldx;
#pragma GCC unroll 4
    for (int r = 0; r < TR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < TC; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= a->in; k += 8) {
        __m256 wv[TR_MAX];
#pragma GCC unroll 4
        for (int r = 0; r < TR; r++) wv[r] = load8(wt, w[r], k);
#pragma GCC unroll 4
        for (int c = 0; c < TC; c++) {
            __m256 xv = _mm256_loadu_ps(x[c] + k);
#pragma GCC unroll 4
            for (int r = 0; r < TR; r++) acc[r][c] = _mm256_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < TC; c++)
#pragma GCC unroll 4
        for (int r = 0; r < TR; r++) {
            float sum = kx_hsum8(acc[r][c]);
            for (int64_t t = k; t < a->in; t++) sum += load1(wt, w[r], t) * x[c][t];
            if (a->bias) sum += a->bias[r0 + r];
            a->y[(c0 + c) * a->ldy + r0 + r] = sum;
        }
}

typedef void (*tile_fn)(const kx_linear *a, int64_t r0, int64_t c0);

#define TILE_DEF(F, WT, R, C) \
    static void tile_##F##_##R##x##C(const kx_linear *a, int64_t r0, int64_t c0) \
    { \
        tile(WT, R, C, a, r0, c0); \
    }
KX_TILES(TILE_DEF, f32, KHUB_DTYPE_ID_F32)
KX_TILES(TILE_DEF, f16, KHUB_DTYPE_ID_F16)
KX_TILES(TILE_DEF, bf16, KHUB_DTYPE_ID_BF16)

static const tile_fn tiles_f32[TR_MAX][TC_MAX] = KX_TILE_PTRS(f32);
static const tile_fn tiles_f16[TR_MAX][TC_MAX] = KX_TILE_PTRS(f16);
static const tile_fn tiles_bf16[TR_MAX][TC_MAX] = KX_TILE_PTRS(bf16);

typedef struct job {
    const kx_linear *a;
    const tile_fn (*tiles)[TC_MAX];
} job;

/* Items are tiles of TR_MAX output rows. */
static void rows_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const job *j = ud;
    const kx_linear *a = j->a;
    for (int64_t rt = begin; rt < end; rt++) {
        int64_t r0 = rt * TR_MAX;
        int tr = (int)(a->out - r0 < TR_MAX ? a->out - r0 : TR_MAX);
        for (int64_t c0 = 0; c0 < a->n; c0 += TC_MAX) {
            int tc = (int)(a->n - c0 < TC_MAX ? a->n - c0 : TC_MAX);
            j->tiles[tr - 1][tc - 1](a, r0, c0);
        }
    }
}

khub_status KX(linear_run)(kx_state *s, const kx_linear *a)
{
    job j = {.a = a};
    switch (a->wfmt) {
    case KHUB_DTYPE_ID_F32: j.tiles = tiles_f32; break;
    case KHUB_DTYPE_ID_F16: j.tiles = tiles_f16; break;
    case KHUB_DTYPE_ID_BF16: j.tiles = tiles_bf16; break;
    default:
        return KX_FAIL(s, KHUB_STATUS_INTERNAL, "linear: dtype %d reached the kernel", a->wfmt);
    }
    s->host->parallel_for(s->host->host_ctx, (a->out + TR_MAX - 1) / TR_MAX, rows_range, &j);
    return KHUB_STATUS_OK;
}
