/*
 * kx_q16.h: what the two int16-activation qlinear files share
 * (qlinear_q16.c: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; qlinear_q16k.c: Q4_K, Q6_K): the
 * quantized activation block, the row quantizer, the step that folds two
 * 32-blocks of integer dot products into the accumulators.
 *
 * Included only by files compiled with the module's ISA flags.
 */
#ifndef KHUB_CPU_X86_KX_Q16_H
#define KHUB_CPU_X86_KX_Q16_H

#include "kx_simd.h"

/* Software prefetch distance, bytes ahead of the block being read. The
 * hardware prefetcher alone left the cold decode GEMV at ~5.5 GB/s here;
 * 1536 B gave ~7.3, 3072-6144 B ~8 GB/s (docs/performance.md). Prefetch
 * never faults, so running past the end of the weights is harmless. */
#define KX_PF_DIST 4096
/* Tile shape: output rows x tokens. */
#define TR KX_TR
#define TC KX_TC

/* One 32-block of an activation row. d and s must stay adjacent and first:
 * the pair step loads [d0 s0] and [d1 s1] as two 8-byte halves. */
typedef struct q16blk {
    float d;       /* scale d_x */
    float s;       /* exact f32 sum of the block's 32 values */
    int16_t p[32]; /* codes, element order */
} q16blk;

/* Rounds x[0, in) (in a multiple of 32) to in / 32 q16blk at out:
 * d_x = max|x| / 32767 per block, codes to nearest even (qlinear_q16.c). */
void KX(q16_quantize_row)(const float *x, int64_t in, void *out);
/* The same for the tiles of kx_q16_pair_dd: s holds d_x again, not the sum. */
void KX(q16_quantize_row_dd)(const float *x, int64_t in, void *out);

/* sum over one 32-block of codes times p, as 8 int32 lanes; wl and wh hold
 * the codes of elements 0..15 and 16..31 as int16. */
static inline __m256i kx_q16_dot(__m256i wl, __m256i wh, const int16_t *p)
{
    const __m256i xl = _mm256_loadu_si256((const __m256i *)p);
    const __m256i xh = _mm256_loadu_si256((const __m256i *)(p + 16));
#if defined(KX_LEVEL_AVX512)
    return _mm256_dpwssd_epi32(_mm256_madd_epi16(wl, xl), wh, xh);
#else
    return _mm256_add_epi32(_mm256_madd_epi16(wl, xl), _mm256_madd_epi16(wh, xh));
#endif
}

/* Two consecutive 32-blocks of one weight row against xb[0], xb[1]. The
 * weights are w = s * code + c per block, sw = [s0, c0, s1, c1]. The two
 * blocks' int32 lanes are folded into one vector (hadd) and scaled with one
 * FMA: acc += dot * s * d_x; cor lanes 1 and 3 collect c * sum(x). */
static inline __attribute__((always_inline)) void kx_q16_pair(__m256i w0l, __m256i w0h, __m256i w1l,
                                                              __m256i w1h, __m128 sw,
                                                              const q16blk *xb, __m256 *acc,
                                                              __m128 *cor)
{
    const __m256i pick = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2);
    __m256i d = _mm256_hadd_epi32(kx_q16_dot(w0l, w0h, xb[0].p), kx_q16_dot(w1l, w1h, xb[1].p));
    __m128 sx = _mm_loadh_pi(_mm_castpd_ps(_mm_load_sd((const double *)&xb[0].d)),
                             (const __m64 *)&xb[1].d); /* dx0 s0 dx1 s1 */
    __m128 p = _mm_mul_ps(sw, sx);
    __m256 sc = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p), pick);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, *acc);
    *cor = _mm_add_ps(*cor, p);
}

/* kx_q16_pair for blocks without an offset term (Q8_0, Q5_0, Q6_K), whose
 * activation blocks hold d_x in s too (kx_q16_quantize_row_dd): the loads
 * give [dx0 dx0 dx1 dx1], sw * that is the scale of the hadd lanes of each
 * 128-bit half, and one in-lane insert makes the 256-bit scale where
 * kx_q16_pair needs a lane-crossing vpermps. The same products in the same
 * lanes, so the same bits as kx_q16_pair's acc. */
static inline __attribute__((always_inline)) void kx_q16_pair_dd(__m256i w0l, __m256i w0h,
                                                                 __m256i w1l, __m256i w1h,
                                                                 __m128 sw, const q16blk *xb,
                                                                 __m256 *acc)
{
    __m256i d = _mm256_hadd_epi32(kx_q16_dot(w0l, w0h, xb[0].p), kx_q16_dot(w1l, w1h, xb[1].p));
    __m128 sx = _mm_loadh_pi(_mm_castpd_ps(_mm_load_sd((const double *)&xb[0].d)),
                             (const __m64 *)&xb[1].d); /* dx0 dx0 dx1 dx1 */
    __m128 p = _mm_mul_ps(sw, sx);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set_m128(p, p), *acc);
}

/* Zeroes the first tr x tc accumulators of a tile (unrolled, so that they
 * can live in registers). */
static inline __attribute__((always_inline)) void
kx_q16_zero(const int tr, const int tc, __m256 acc[TR][TC], __m128 cor[TR][TC])
{
#pragma GCC unroll 4
    for (int r = 0; r < tr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < tc; c++) {
            acc[r][c] = _mm256_setzero_ps();
            cor[r][c] = _mm_setzero_ps();
        }
}

/* Lanes 1 + 3 of a cor accumulator. */
static inline float kx_q16_cor(__m128 v)
{
    return _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)) + _mm_cvtss_f32(_mm_shuffle_ps(v, v, 3));
}

#endif /* KHUB_CPU_X86_KX_Q16_H */
