/*
 * qlinear.c: y = x @ W^T for block-quantized W (Q4_0, Q4_1, Q8_0, in ggml's
 * block layouts) with integer dot products.
 *
 * The math. A weight block holds 32 codes q_i with scale d_w (and, for Q4_1,
 * a min m_w); its values are w_i = d_w (q_i - 8) for Q4_0, d_w q_i + m_w for
 * Q4_1 and d_w q_i for Q8_0. Each 32-block of a row of x is quantized to
 * int8 with its own f32 scale: p_i = round(x_i / d_x), d_x = max|x| / 127,
 * and we keep s_x = d_x * sum_i p_i. Then
 *     sum_i w_i x_i ~= d_w d_x sum_i q_i p_i + c,
 * with c = -8 d_w s_x (Q4_0), m_w s_x (Q4_1), 0 (Q8_0). The integer sum is
 * computed 32 lanes at a time: unsigned nibbles times signed p with
 * vpmaddubsw + vpmaddwd (AVX2) or vpdpbusd (AVX-512 VNNI); for Q8_0 the
 * signed weights become |q| with their sign moved onto p (vpsignb). No i16
 * sum can saturate: 2 * 15 * 127 and 2 * 128 * 127 are below 32767.
 *
 * The d_x and s_x are f32 (ggml's q8_1 keeps f16), so the only error against
 * an f32 reference is the rounding of x to 8 bits: relative error about
 * 1/(127 * sqrt(3)) per element, which the tests bound.
 *
 * Work split: host->parallel_for over tiles of TR output rows. Within a tile
 * every group of TC tokens is processed at once, so each unpacked weight block
 * serves TC tokens and each activation block TR rows (the prefill case);
 * with one token (decode) the tile is TR rows x 1 token, TR independent
 * accumulator chains, and the loop streams weights at memory speed.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kx_simd.h"

#define QK 32

/* One 32-block of a quantized activation row. */
typedef struct q8blk {
    float d;      /* scale d_x */
    float s;      /* d_x * sum(q) */
    int8_t q[QK]; /* codes */
} q8blk;

#define TR_MAX KX_TR
#define TC_MAX KX_TC

/* ------------------------------------------------------------------------ */
/* Activation quantization                                                  */
/* ------------------------------------------------------------------------ */

static int32_t hsum8i(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* x * id rounded to the nearest integer (ties to even), as int32 lanes. */
static inline __m256i round_i32(__m256 x, __m256 id)
{
    return _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(x, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* Quantizes one row of in (a multiple of 32) floats into in/32 blocks. */
static void quantize_row(const float *x, int64_t in, q8blk *out)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < in / QK; b++) {
        const float *p = x + b * QK;
        __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
        __m256 v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
        __m256 m =
            _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                          _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        float amax = kx_hmax8(m);
        /* A NaN or inf in x gives a NaN scale and NaN outputs, as f32 would. */
        float d = amax / 127.0f;
        __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i i0 = round_i32(v0, id), i1 = round_i32(v1, id);
        __m256i i2 = round_i32(v2, id), i3 = round_i32(v3, id);
        int32_t sum = hsum8i(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
        /* packs works per 128-bit lane: fix the order with one permute. */
        __m256i w01 = _mm256_packs_epi32(i0, i1), w23 = _mm256_packs_epi32(i2, i3);
        __m256i b8 = _mm256_packs_epi16(w01, w23);
        b8 = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)out[b].q, b8);
        out[b].d = d;
        out[b].s = d * (float)sum;
    }
}

/* ------------------------------------------------------------------------ */
/* Block dot products                                                       */
/* ------------------------------------------------------------------------ */

/* Sum over 4-byte groups of u8 a times s8 b, as 8 int32 lanes. */
static inline __m256i dot_u8s8(__m256i a, __m256i b)
{
#if defined(KX_LEVEL_AVX512)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

static inline __m256i unpack_nibbles(const uint8_t *qs)
{
    __m128i r = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(r, 4), r);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

static inline float ld_f16(const uint8_t *p) { return _cvtsh_ss(kx_rd16(p)); }

/* Bytes of one block, and where its codes start. */
static inline size_t blk_bytes(int fmt)
{
    return fmt == KHUB_QFORMAT_Q8_0 ? 34 : fmt == KHUB_QFORMAT_Q4_0 ? 18 : 20;
}

/* One TR x TC tile: rows w[0..TR) (stride wrb bytes) against token blocks
 * x[c * xs] for c < TC; writes y[c * ldy + r]. always_inline with constant
 * fmt/TR/TC, so each instantiation keeps its accumulators in registers. */
static inline __attribute__((always_inline)) void tile(const int fmt, const int TR, const int TC,
                                                       const uint8_t *w, size_t wrb, const q8blk *x,
                                                       int64_t xs, int64_t nb, const float *bias,
                                                       float *y, int64_t ldy)
{
    __m256 acc[TR_MAX][TC_MAX];
    float cor[TR_MAX][TC_MAX];
    const size_t bb = blk_bytes(fmt);
    for (int r = 0; r < TR; r++)
        for (int c = 0; c < TC; c++) {
            acc[r][c] = _mm256_setzero_ps();
            cor[r][c] = 0.0f;
        }
    /* Pairs of blocks: the two blocks' int32 lanes are folded into one
     * vector (hadd: lanes 0-1 of each half from block b, 2-3 from b + 1) and
     * scaled by [dw dx] of each block with one FMA; the Q4 correction terms
     * ride in lanes 1 and 3 of a 4-lane accumulator. This halves the float
     * work per block, which otherwise bounds the decode GEMV. */
    __m128 cor4[TR_MAX][TC_MAX];
    for (int r = 0; r < TR; r++)
        for (int c = 0; c < TC; c++) cor4[r][c] = _mm_setzero_ps();
    const __m256i pick = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        __m256i w0[TR_MAX], w1[TR_MAX];
        __m128 sw[TR_MAX]; /* [d0, c0, d1, c1]: scale and correction factor per block */
        for (int r = 0; r < TR; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + (size_t)b * bb;
            uint32_t h0, h1;
            memcpy(&h0, blk, 4);
            memcpy(&h1, blk + bb, 4);
            __m128 f = _mm_cvtph_ps(_mm_setr_epi32((int)h0, (int)h1, 0, 0)); /* d0 ? d1 ? */
            if (fmt == KHUB_QFORMAT_Q4_1) {
                sw[r] = _mm_shuffle_ps(f, f, _MM_SHUFFLE(3, 2, 1, 0)); /* d0 m0 d1 m1 */
                w0[r] = unpack_nibbles(blk + 4);
                w1[r] = unpack_nibbles(blk + bb + 4);
            } else if (fmt == KHUB_QFORMAT_Q4_0) {
                sw[r] = _mm_mul_ps(_mm_shuffle_ps(f, f, _MM_SHUFFLE(2, 2, 0, 0)),
                                   _mm_setr_ps(1.0f, -8.0f, 1.0f, -8.0f));
                w0[r] = unpack_nibbles(blk + 2);
                w1[r] = unpack_nibbles(blk + bb + 2);
            } else {
                sw[r] = _mm_and_ps(_mm_shuffle_ps(f, f, _MM_SHUFFLE(2, 2, 0, 0)),
                                   _mm_castsi128_ps(_mm_setr_epi32(-1, 0, -1, 0)));
                w0[r] = _mm256_loadu_si256((const __m256i *)(blk + 2));
                w1[r] = _mm256_loadu_si256((const __m256i *)(blk + bb + 2));
            }
        }
        for (int c = 0; c < TC; c++) {
            const q8blk *xb = x + c * xs + b;
            __m256i x0 = _mm256_loadu_si256((const __m256i *)xb[0].q);
            __m256i x1 = _mm256_loadu_si256((const __m256i *)xb[1].q);
            __m128 sx = _mm_loadh_pi(_mm_castpd_ps(_mm_load_sd((const double *)&xb[0].d)),
                                     (const __m64 *)&xb[1].d); /* dx0 sx0 dx1 sx1 */
            for (int r = 0; r < TR; r++) {
                __m256i d0, d1;
                if (fmt == KHUB_QFORMAT_Q8_0) {
                    d0 = dot_u8s8(_mm256_sign_epi8(w0[r], w0[r]), _mm256_sign_epi8(x0, w0[r]));
                    d1 = dot_u8s8(_mm256_sign_epi8(w1[r], w1[r]), _mm256_sign_epi8(x1, w1[r]));
                } else {
                    d0 = dot_u8s8(w0[r], x0);
                    d1 = dot_u8s8(w1[r], x1);
                }
                __m128 p = _mm_mul_ps(sw[r], sx);
                __m256 sc = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p), pick);
                acc[r][c] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_hadd_epi32(d0, d1)), sc, acc[r][c]);
                cor4[r][c] = _mm_add_ps(cor4[r][c], p);
            }
        }
    }
    for (int r = 0; r < TR; r++)
        for (int c = 0; c < TC; c++) {
            __m128 v = cor4[r][c];
            if (fmt != KHUB_QFORMAT_Q8_0)
                cor[r][c] =
                    _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)) + _mm_cvtss_f32(_mm_shuffle_ps(v, v, 3));
        }
    for (; b < nb; b++) {
        __m256i wv[TR_MAX];
        float dw[TR_MAX], mw[TR_MAX];
        for (int r = 0; r < TR; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + (size_t)b * bb;
            dw[r] = ld_f16(blk);
            if (fmt == KHUB_QFORMAT_Q8_0) {
                wv[r] = _mm256_loadu_si256((const __m256i *)(blk + 2));
                mw[r] = 0.0f;
            } else if (fmt == KHUB_QFORMAT_Q4_0) {
                wv[r] = unpack_nibbles(blk + 2);
                mw[r] = -8.0f * dw[r];
            } else {
                mw[r] = ld_f16(blk + 2);
                wv[r] = unpack_nibbles(blk + 4);
            }
        }
        for (int c = 0; c < TC; c++) {
            const q8blk *xb = x + c * xs + b;
            __m256i xv = _mm256_loadu_si256((const __m256i *)xb->q);
            for (int r = 0; r < TR; r++) {
                __m256i d;
                if (fmt == KHUB_QFORMAT_Q8_0)
                    d = dot_u8s8(_mm256_sign_epi8(wv[r], wv[r]), _mm256_sign_epi8(xv, wv[r]));
                else
                    d = dot_u8s8(wv[r], xv);
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(dw[r] * xb->d),
                                            acc[r][c]);
                if (fmt != KHUB_QFORMAT_Q8_0) cor[r][c] += mw[r] * xb->s;
            }
        }
    }
    for (int c = 0; c < TC; c++)
        for (int r = 0; r < TR; r++)
            y[c * ldy + r] = kx_hsum8(acc[r][c]) + cor[r][c] + (bias ? bias[r] : 0.0f);
}

KX_TILES(KX_QTILE_DEF, q4_0, KHUB_QFORMAT_Q4_0)
KX_TILES(KX_QTILE_DEF, q4_1, KHUB_QFORMAT_Q4_1)
KX_TILES(KX_QTILE_DEF, q8_0, KHUB_QFORMAT_Q8_0)

static const kx_qtile_fn tiles_q4_0[TR_MAX][TC_MAX] = KX_TILE_PTRS(q4_0);
static const kx_qtile_fn tiles_q4_1[TR_MAX][TC_MAX] = KX_TILE_PTRS(q4_1);
static const kx_qtile_fn tiles_q8_0[TR_MAX][TC_MAX] = KX_TILE_PTRS(q8_0);

/* ------------------------------------------------------------------------ */
/* Entry (the driver is qdriver.c)                                          */
/* ------------------------------------------------------------------------ */

static void quantize_row_any(const float *x, int64_t in, void *out) { quantize_row(x, in, out); }

khub_status KX(qlinear_run)(kx_state *s, const kx_linear *a)
{
    kx_qkernel k = {TR_MAX, TC_MAX, sizeof(q8blk), quantize_row_any, NULL, NULL, NULL};
    switch (a->wfmt) {
    case KHUB_QFORMAT_Q4_0: k.tiles = &tiles_q4_0[0][0]; break;
    case KHUB_QFORMAT_Q4_1: k.tiles = &tiles_q4_1[0][0]; break;
    case KHUB_QFORMAT_Q8_0: k.tiles = &tiles_q8_0[0][0]; break;
    default:
        return KX_FAIL(s, KHUB_STATUS_INTERNAL, "qlinear: format %d reached the kernel", a->wfmt);
    }
    return KX(qdriver_run)(s, a, &k);
}
