/*
 * kx_simd.h: vector helpers shared by the kernel files. Included only by
 * files compiled with the module's ISA flags (never by plugin.c).
 */
#ifndef KHUB_CPU_X86_KX_SIMD_H
#define KHUB_CPU_X86_KX_SIMD_H

#include <immintrin.h>

#include "kx.h"

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
