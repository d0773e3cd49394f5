/*
 * kx_simd.h: vector helpers shared by the kernel files. Included only by
 * files compiled with the module's ISA flags (never by plugin.c).
 */
#ifndef KHUB_CPU_X86_KX_SIMD_H
#define KHUB_CPU_X86_KX_SIMD_H

#include <immintrin.h>

#include "kx.h"

/* Register tiles of the GEMV kernels (linear.c, qlinear.c, qlinear_q16*.c):
 * up to KX_TR output rows x KX_TC tokens per call of one tile function. */
#define KX_TR 4
#if defined(KX_LEVEL_AVX512)
#define KX_TC 4
#else
#define KX_TC 2
#endif

/* One tile function per shape: the file defines DEF(F, K, R, C) to make
 * tile_<F>_<R>x<C>, with K its format or dtype; KX_TILES(DEF, F, K) makes
 * every shape up to KX_TR x KX_TC and KX_TILE_PTRS(F) is their table,
 * indexed [rows - 1][tokens - 1]. KX_TILES_W(W, ...) and KX_TILE_PTRS_W(W, F)
 * do the same for W tokens (a literal 2 or 4) in either module, for a file
 * whose calls of more tokens go elsewhere (qlinear_q16.c). */
#define KX_TILE_ROW_2(DEF, F, K, R) DEF(F, K, R, 1) DEF(F, K, R, 2)
#define KX_TILE_ROW_4(DEF, F, K, R) KX_TILE_ROW_2(DEF, F, K, R) DEF(F, K, R, 3) DEF(F, K, R, 4)
#define KX_TILE_PTRS_ROW_2(F, R) \
    { \
        tile_##F##_##R##x1, tile_##F##_##R##x2 \
    }
#define KX_TILE_PTRS_ROW_4(F, R) \
    { \
        tile_##F##_##R##x1, tile_##F##_##R##x2, tile_##F##_##R##x3, tile_##F##_##R##x4 \
    }
#define KX_TILES_W(W, DEF, F, K) \
    KX_TILE_ROW_##W(DEF, F, K, 1) KX_TILE_ROW_##W(DEF, F, K, 2) KX_TILE_ROW_##W(DEF, F, K, 3) \
        KX_TILE_ROW_##W(DEF, F, K, 4)
#define KX_TILE_PTRS_W(W, F) \
    { \
        KX_TILE_PTRS_ROW_##W(F, 1), KX_TILE_PTRS_ROW_##W(F, 2), KX_TILE_PTRS_ROW_##W(F, 3), \
            KX_TILE_PTRS_ROW_##W(F, 4) \
    }
#if KX_TC == 4
#define KX_TILES(DEF, F, K) KX_TILES_W(4, DEF, F, K)
#define KX_TILE_PTRS(F)     KX_TILE_PTRS_W(4, F)
#else
#define KX_TILES(DEF, F, K) KX_TILES_W(2, DEF, F, K)
#define KX_TILE_PTRS(F)     KX_TILE_PTRS_W(2, F)
#endif

/* DEF for the quantized-activation kernels: the kx_qtile_fn of shape R x C
 * for format K, calling the file's own static always-inline tile() (whose
 * x parameter is that file's activation block type). */
#define KX_QTILE_DEF(F, K, R, C) \
    static void tile_##F##_##R##x##C(const uint8_t *w, size_t wrb, const void *x, int64_t xs, \
                                     int64_t nb, const float *bias, float *y, int64_t ldy) \
    { \
        tile(K, R, C, w, wrb, x, xs, nb, bias, y, ldy); \
    }

/* exp(x) in 8 lanes, relative error a few ulp on [-87, 88]; inputs outside
 * are clamped there, and a NaN input becomes -87 (pointwise.c). */
__m256 KX(exp8)(__m256 x);

static inline float kx_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float kx_hmax8(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The 128 six-bit codes of half h (0, 1) of a Q6_K block as q - 32 in int8,
 * q[t] = elements 128h + 32t .. +31 (layout in ref-cpu's quant.c): lane l of
 * block t takes its low 4 bits from a nibble of ql[64h + 32(t & 1) + l]
 * (low for t < 2) and its high 2 bits from bits 2t, 2t + 1 of qh[32h + l]. */
static inline void kx_q6k_half(const uint8_t *blk, int h, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i k32 = _mm256_set1_epi8(32);
    const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
    const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    /* 16-bit shifts: bits crossing into the next byte are masked off. */
    q[0] =
        _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    q[1] =
        _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    q[2] =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) q[t] = _mm256_sub_epi8(q[t], k32);
}

#endif /* KHUB_CPU_X86_KX_SIMD_H */
