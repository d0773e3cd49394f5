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

#endif /* KHUB_CPU_X86_KX_SIMD_H */
