/*
 * qlinear_q16k.c: y = x @ W^T for the GGUF k-quant weights Q4_K and Q6_K
 * (ggml's block layouts, described in plugins/ref-cpu/quant.c) with the
 * activations rounded to int16 per 32-block, as qlinear_q16.c does for the
 * 32-weight formats. Same activation blocks, same pair step (kx_q16.h),
 * same driver (qdriver.c); only the unpacking of a 256-weight super-block
 * into eight 32-blocks of int16 codes and their scales is new.
 *
 * Q4_K. Sub-block j (32 weights) holds w = (d sc_j) q - (dmin mn_j), q a
 * nibble, sc and mn 6-bit. That is the Q4_1 form per 32-block with
 * s = d sc_j and c = -dmin mn_j, both exact in f32 (11-bit f16 mantissa
 * times 6 bits), so a Q4_K super-block is four block pairs for the pair
 * step; the offset term meets the exact f32 sum of x as for Q4_1.
 *
 * Q6_K. Sub-blocks of 16 weights hold w = d sc (q - 32) with a signed 8-bit
 * sc, so a 32-block of x meets two scales. Folding sc into the codes keeps
 * one float scale per 32-block: code = sc (q - 32) is an exact int16
 * (|.| <= 128 * 32 = 4096) and the block is the Q8_0 form with s = d (and,
 * as Q8_0, takes kx_q16_pair_dd and its activation blocks). The
 * int32 lanes stay far from overflow: the pair step sums at most 8
 * products of 4096 * 32767 per lane (~1.07e9 < 2^31). Above 2^24 their
 * int-to-float conversion rounds, relative error 2^-24, far below the
 * int16 rounding of x.
 *
 * Rows are walked one super-block at a time: its scales are decoded once
 * per row and shared by every token of the tile.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kx_q16.h"

#define QKK 256 /* weights per super-block */

/* ------------------------------------------------------------------------ */
/* Q4_K: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]  (144 bytes)          */
/* ------------------------------------------------------------------------ */

/* sw[k] = [s, c, s, c] of sub-blocks 2k and 2k + 1. */
static inline void q4k_pair_scales(const uint8_t *blk, __m128 sw[4])
{
    uint8_t sm[16];
    kx_q4k_scales(blk + 4, sm);
    const __m128i v = _mm_loadu_si128((const __m128i *)sm);
    const __m128 d = _mm_set1_ps(_cvtsh_ss(kx_rd16(blk)));
    const __m128 m = _mm_set1_ps(-_cvtsh_ss(kx_rd16(blk + 2)));
    __m128 s0 = _mm_mul_ps(d, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(v)));
    __m128 s1 = _mm_mul_ps(d, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_srli_si128(v, 4))));
    __m128 m0 = _mm_mul_ps(m, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_srli_si128(v, 8))));
    __m128 m1 = _mm_mul_ps(m, _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_srli_si128(v, 12))));
    sw[0] = _mm_unpacklo_ps(s0, m0);
    sw[1] = _mm_unpackhi_ps(s0, m0);
    sw[2] = _mm_unpacklo_ps(s1, m1);
    sw[3] = _mm_unpackhi_ps(s1, m1);
}

/* One Q4_K super-block of one row against tc tokens' 8 blocks x[c * xs]. */
static inline __attribute__((always_inline)) void
q4k_sblock(const int tc, const uint8_t *blk, const q16blk *x, int64_t xs, __m256 *acc, __m128 *cor)
{
    __m128 sw[4];
    q4k_pair_scales(blk, sw);
    const __m256i m4 = _mm256_set1_epi16(0x0f);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        /* 32 bytes: sub-block 2k in the low nibbles, 2k + 1 in the high.
         * Each half widened to int16 by a zero-extending load holds both
         * sub-blocks' codes of 16 elements (low nibble: 2k, high: 2k + 1),
         * split by an AND and a shift, as codes16 does for Q4_0 / Q4_1: 6
         * instructions per 64 codes where masking the bytes, then
         * extracting and widening each half took 9. The same int16 codes. */
        const uint8_t *q = blk + 16 + 32 * k;
        const __m256i v0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)q));
        const __m256i v1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q + 16)));
        const __m256i w0l = _mm256_and_si256(v0, m4), w0h = _mm256_and_si256(v1, m4);
        const __m256i w1l = _mm256_srli_epi16(v0, 4), w1h = _mm256_srli_epi16(v1, 4);
#pragma GCC unroll 4
        for (int c = 0; c < tc; c++)
            kx_q16_pair(w0l, w0h, w1l, w1h, sw[k], x + c * xs + 2 * k, &acc[c], &cor[c]);
    }
}

/* ------------------------------------------------------------------------ */
/* Q6_K: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d  (210 bytes)         */
/* ------------------------------------------------------------------------ */

/* q - 32 of elements 16 e .. 16 e + 15 of the four 32-blocks of half h
 * as int16, built from zero-extending loads (no widening shuffles; see
 * q4k_sblock): c[t] is block t (ql low nibbles of bytes 0-31 / 32-63, then
 * their high nibbles; qh bit pairs 0-1, 2-3, 4-5, 6-7). */
static inline __attribute__((always_inline)) void q6k_half16(const uint8_t *blk, int h, int e,
                                                             __m256i c[4])
{
    const __m256i m4 = _mm256_set1_epi16(0x0f), m30 = _mm256_set1_epi16(0x30);
    const __m256i k32 = _mm256_set1_epi16(32);
    const uint8_t *ql = blk + 64 * h + 16 * e, *qh = blk + 128 + 32 * h + 16 * e;
    const __m256i l0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)ql));
    const __m256i l1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ql + 32)));
    const __m256i hb = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)qh));
    c[0] =
        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
    c[1] =
        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
    c[2] = _mm256_or_si256(_mm256_srli_epi16(l0, 4), _mm256_and_si256(hb, m30));
    c[3] =
        _mm256_or_si256(_mm256_srli_epi16(l1, 4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) c[t] = _mm256_sub_epi16(c[t], k32);
}

/* One Q6_K super-block of one row against tc tokens' 8 blocks x[c * xs]. */
static inline __attribute__((always_inline)) void
q6k_sblock(const int tc, const uint8_t *blk, const q16blk *x, int64_t xs, __m256 *acc)
{
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = _cvtsh_ss(kx_rd16(blk + 208));
    const __m128 sw = _mm_set1_ps(d);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256i lo[4], hi[4];
        q6k_half16(blk, h, 0, lo);
        q6k_half16(blk, h, 1, hi);
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) {
            const int8_t *s = sc + 8 * h + 4 * k;
            const __m256i w0l = _mm256_mullo_epi16(lo[2 * k], _mm256_set1_epi16(s[0]));
            const __m256i w0h = _mm256_mullo_epi16(hi[2 * k], _mm256_set1_epi16(s[1]));
            const __m256i w1l = _mm256_mullo_epi16(lo[2 * k + 1], _mm256_set1_epi16(s[2]));
            const __m256i w1h = _mm256_mullo_epi16(hi[2 * k + 1], _mm256_set1_epi16(s[3]));
#pragma GCC unroll 4
            for (int c = 0; c < tc; c++)
                kx_q16_pair_dd(w0l, w0h, w1l, w1h, sw, x + c * xs + 4 * h + 2 * k, &acc[c]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Tiles                                                                    */
/* ------------------------------------------------------------------------ */

/* One tr x tc tile: rows w[0..tr) (stride wrb bytes) against token block
 * rows x[c * xs] of nb 32-blocks (a multiple of 8); writes y[c * ldy + r].
 * Constant fmt/tr/tc after inlining; the loops over r and c are unrolled
 * so the accumulators stay in registers (see qlinear_q16.c). */
static inline __attribute__((always_inline)) void tile(const int fmt, const int tr, const int tc,
                                                       const uint8_t *w, size_t wrb,
                                                       const q16blk *x, int64_t xs, int64_t nb,
                                                       const float *bias, float *y, int64_t ldy)
{
    __m256 acc[TR][TC];
    __m128 cor[TR][TC];
    const size_t bb = fmt == KHUB_QFORMAT_Q4_K ? 144 : 210;
    kx_q16_zero(tr, tc, acc, cor);
    /* The tile's rows are adjacent: its weights are one region of tr * wrb
     * bytes, of which a super-block step reads tr * bb. It is prefetched as
     * one stream, KX_PF_DIST ahead at the pace it is read, as qlinear_q16.c
     * does (per-row streams read the Q8_0 head at ~60 % of what one core
     * streams; docs/performance.md). Prefetches only: the same results. */
    const int step = tr * (int)bb;
    const char *pf = (const char *)w + KX_PF_DIST;
    for (int64_t sb = 0; sb < nb / 8; sb++) {
#pragma GCC unroll 8
        for (int k = 0; k < (step + 63) / 64; k++) _mm_prefetch(pf + 64 * k, _MM_HINT_T0);
        pf += step;
#pragma GCC unroll 4
        for (int r = 0; r < tr; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + (size_t)sb * bb;
            if (fmt == KHUB_QFORMAT_Q4_K)
                q4k_sblock(tc, blk, x + 8 * sb, xs, acc[r], cor[r]);
            else
                q6k_sblock(tc, blk, x + 8 * sb, xs, acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < tc; c++)
#pragma GCC unroll 4
        for (int r = 0; r < tr; r++) {
            float cs = fmt == KHUB_QFORMAT_Q4_K ? kx_q16_cor(cor[r][c]) : 0.0f;
            y[c * ldy + r] = kx_hsum8(acc[r][c]) + cs + (bias ? bias[r] : 0.0f);
        }
}

KX_TILES(KX_QTILE_DEF, q4_k, KHUB_QFORMAT_Q4_K)
KX_TILES(KX_QTILE_DEF, q6_k, KHUB_QFORMAT_Q6_K)

static const kx_qtile_fn tiles_q4_k[TR][TC] = KX_TILE_PTRS(q4_k);
static const kx_qtile_fn tiles_q6_k[TR][TC] = KX_TILE_PTRS(q6_k);

/* ------------------------------------------------------------------------ */
/* Entry (from qlinear_q16_run; the driver is qdriver.c)                    */
/* ------------------------------------------------------------------------ */

khub_status KX(qlinear_q16k_run)(kx_state *s, const kx_linear *a)
{
    kx_qkernel k = {TR, TC, sizeof(q16blk), KX(q16_quantize_row), NULL, NULL, NULL};
    if (a->in % QKK != 0)
        return KX_FAIL(s, KHUB_STATUS_INTERNAL, "qlinear: %lld inputs reached the k-quant kernel",
                       (long long)a->in);
    switch (a->wfmt) {
    case KHUB_QFORMAT_Q4_K: k.tiles = &tiles_q4_k[0][0]; break;
    case KHUB_QFORMAT_Q6_K:
        k.tiles = &tiles_q6_k[0][0];
        k.quantize_row = KX(q16_quantize_row_dd); /* for kx_q16_pair_dd */
        break;
    default:
        return KX_FAIL(s, KHUB_STATUS_INTERNAL, "qlinear: format %d reached the kernel", a->wfmt);
    }
    return KX(qdriver_run)(s, a, &k);
}
