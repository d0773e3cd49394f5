/*
 * kx_attn_tile.h: the inner loops of the flash-attention recurrence shared
 * by attention.c (dense, strided K/V views) and paged_attention.c (K/V in
 * the blocks of a paged pool): a row's dot product with a key, the
 * rescale-and-accumulate of a tile of values, and the masked exponentials of
 * a tile's scores. Included only by kernel files (module ISA flags).
 * dot_wide and rescale_axpy_wide are 16-lane in the AVX-512 module
 * (KX_LEVEL_AVX512, as kx_simd.h dispatches) and the 8-lane ones otherwise.
 */
#ifndef KHUB_CPU_X86_KX_ATTN_TILE_H
#define KHUB_CPU_X86_KX_ATTN_TILE_H

#include <math.h>

#include "kx_simd.h"

static inline float dot(const float *a, const float *b, int64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = kx_hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* acc = acc * c + sum_j p[j] v[j] over nk keys. Each element adds its
 * terms in the order j = 0, 1, ...; 64 elements (8 vectors) at a time are
 * kept in registers while j runs, so the 8 FMA chains are independent (one
 * chain per vector was bound by the FMA latency). */
static inline void rescale_axpy(float *acc, float c, const float *p, const float *v, int64_t nk,
                                int64_t n)
{
    int64_t i = 0;
    const __m256 vc = _mm256_set1_ps(c);
    for (; i + 64 <= n; i += 64) {
        __m256 s[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) s[u] = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 8 * u), vc);
        for (int64_t j = 0; j < nk; j++) {
            const __m256 b = _mm256_set1_ps(p[j]);
            const float *vj = v + j * n + i;
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++)
                s[u] = _mm256_fmadd_ps(b, _mm256_loadu_ps(vj + 8 * u), s[u]);
        }
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(acc + i + 8 * u, s[u]);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc);
        for (int64_t j = 0; j < nk; j++)
            s = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * n + i), s);
        _mm256_storeu_ps(acc + i, s);
    }
    for (; i < n; i++) {
        float s = acc[i] * c;
        for (int64_t j = 0; j < nk; j++) s += p[j] * v[j * n + i];
        acc[i] = s;
    }
}

/* The same two in the module's widest vectors: 16 lanes with masked tails
 * in the AVX-512 module, the 8-lane ones above in the AVX2 module.
 * paged_attention.c uses these; attention.c keeps the 8-lane ones. */
#if defined(KX_LEVEL_AVX512)
static inline float dot_wide(const float *a, const float *b, int64_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    if (i + 16 <= n) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        i += 16;
    }
    if (i < n) { /* the tail under a mask: no scalar loop */
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* acc = acc * c + sum_j p[j] v[j] over nk keys, in the same order per
 * element as rescale_axpy; 64 elements (4 vectors) in registers at a time. */
static inline void rescale_axpy_wide(float *acc, float c, const float *p, const float *v,
                                     int64_t nk, int64_t n)
{
    const __m512 vc = _mm512_set1_ps(c);
    int64_t i0 = 0;
    for (; i0 + 64 <= n; i0 += 64) {
        __m512 s[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) s[u] = _mm512_mul_ps(_mm512_loadu_ps(acc + i0 + 16 * u), vc);
        for (int64_t j = 0; j < nk; j++) {
            const __m512 b = _mm512_set1_ps(p[j]);
            const float *vj = v + j * n + i0;
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                s[u] = _mm512_fmadd_ps(b, _mm512_loadu_ps(vj + 16 * u), s[u]);
        }
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) _mm512_storeu_ps(acc + i0 + 16 * u, s[u]);
    }
    for (int64_t i = i0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, acc + i), vc);
        for (int64_t j = 0; j < nk; j++)
            s = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(m, v + j * n + i), s);
        _mm512_mask_storeu_ps(acc + i, m, s);
    }
}
#else
#define dot_wide          dot
#define rescale_axpy_wide rescale_axpy
#endif

/* p[j] = exp(s[j] - m), exactly 0 where s[j] = -inf; returns the sum. */
static inline float exp_scores(float *sc, int64_t nk, float m)
{
    const __m256 vm = _mm256_set1_ps(m), ninf = _mm256_set1_ps(-INFINITY);
    __m256 sum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) {
        __m256 s = _mm256_loadu_ps(sc + j);
        __m256 p = KX(exp8)(_mm256_sub_ps(s, vm));
        p = _mm256_and_ps(p, _mm256_cmp_ps(s, ninf, _CMP_NEQ_OQ));
        _mm256_storeu_ps(sc + j, p);
        sum = _mm256_add_ps(sum, p);
    }
    float t = kx_hsum8(sum);
    for (; j < nk; j++) {
        sc[j] = sc[j] == -INFINITY ? 0.0f : expf(sc[j] - m);
        t += sc[j];
    }
    return t;
}

#endif /* KHUB_CPU_X86_KX_ATTN_TILE_H */
