/*
 * qlinear_q16.c: y = x @ W^T for block-quantized W (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0) with the activations rounded to int16 per 32-block and integer dot
 * products.
 *
 * Why int16. Rounding x to int8 per block (qlinear.c) costs an NMSE of about
 * 1e-4 per matmul on real hidden states with outlier channels, enough to
 * change greedy tokens over 30 layers; keeping x in f32 (qlinear_f32.c)
 * needs four int-to-float conversions and four FMAs per 32 weights. With
 * d_x = max|x| / 32767 the rounding error is 256 times smaller than int8's
 * (NMSE below 1e-8 even with a 32x outlier in the block), and the dot is
 * two vpmaddwd (AVX2) or two vpdpwssd (AVX-512 VNNI) per block.
 *
 * The math per block of 32: w_i = d_w q_i + c, c = m (Q4_1, Q5_1), -8 d_w
 * (Q4_0), 0 (Q8_0); x_i ~= d_x p_i. So sum_i w_i x_i ~= d_w d_x sum_i q_i
 * p_i + c * sum_i x_i, where the block sum of x is the exact f32 sum (the
 * offset term adds no rounding). Q5_0 has no offset term: its int16 codes
 * are the signed 16 (q - 16), built as cheaply as the unsigned ones (see
 * q5_0_codes), and its activation scale is d_x / 16. No int32 lane can
 * overflow: a lane sums four products of |q| <= 256 (Q5_0's 16 (q - 16);
 * 128 for the others) and |p| <= 32767, below 2^25. The Q5 codes are
 * the Q4 nibbles with bit 4 taken from the block's 32-bit qh mask,
 * expanded to bytes by a shuffle and a compare.
 *
 * Float work per block (scale, convert, accumulate) is what bounds the
 * decode GEMV, so blocks go in pairs as in qlinear.c: the two blocks' int32
 * lanes are folded into one vector (hadd) and scaled with one FMA.
 *
 * Calls of KX_GEMM_MIN_N tokens or more (KX_GEMM_MIN_N_K for Q4_K / Q6_K:
 * prefill) go to qgemm.c instead (kx.h says why there), and Q4_K / Q6_K
 * weights to qlinear_q16k.c (same activations, same pair step).
 *
 * Work split: host->parallel_for over tiles of TR output rows. A call of
 * one or two tokens (decode) runs the TR x Q16_TC tiles: each token streams
 * TR rows with TR independent accumulators, and two tokens share each
 * unpacked weight block. Calls of KX_BATCH_MIN_N tokens or more run the
 * batch tiles (one row x up to KX_TB tokens, below).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kx_q16.h"

#define QK 32

/* ------------------------------------------------------------------------ */
/* Activation quantization                                                  */
/* ------------------------------------------------------------------------ */

static inline __m256i round_i32(__m256 x, __m256 id)
{
    return _mm256_cvtps_epi32(
        _mm256_round_ps(_mm256_mul_ps(x, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* packs_epi32 interleaves per 128-bit lane; one 64-bit permute restores order. */
static inline __m256i pack16(__m256i a, __m256i b)
{
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);
}

/* One 32-block of x. q5: store the codes in the Q5 order (elements 0..7,
 * 16..23, 8..15, 24..31; see q5_codes), else in element order. The block
 * sum is stored times smul (1, or the -8 of the Q4_0 offset, see
 * offset_factor), the scale times dmul (1, or the 1/16 of the Q5_0 codes,
 * see q5_0_codes; exact, a power of two). */
static inline __attribute__((always_inline)) void quantize_blk(const float *p, q16blk *o,
                                                               const int q5, const float smul,
                                                               const float dmul, const int dd)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
    __m256 v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    float amax = kx_hmax8(m);
    /* A NaN or inf in x gives a NaN scale and NaN outputs, as f32 would. */
    __m256 id = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    __m256i r0 = round_i32(v0, id), r1 = round_i32(v1, id);
    __m256i r2 = round_i32(v2, id), r3 = round_i32(v3, id);
    _mm256_storeu_si256((__m256i *)o->p, pack16(r0, q5 ? r2 : r1));
    _mm256_storeu_si256((__m256i *)(o->p + 16), pack16(q5 ? r1 : r2, r3));
    o->d = amax / 32767.0f * dmul;
    o->s = dd ? o->d : smul * kx_hsum8(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
}

void KX(q16_quantize_row)(const float *x, int64_t in, void *out_)
{
    q16blk *out = out_;
    for (int64_t b = 0; b < in / QK; b++) quantize_blk(x + b * QK, &out[b], 0, 1.0f, 1.0f, 0);
}

void KX(q16_quantize_row_dd)(const float *x, int64_t in, void *out_)
{
    q16blk *out = out_;
    for (int64_t b = 0; b < in / QK; b++) quantize_blk(x + b * QK, &out[b], 0, 1.0f, 1.0f, 1);
}

/* The row quantizer of the Q5_1 tiles: the codes in the Q5 order. */
static void quantize_row_q5(const float *x, int64_t in, void *out_)
{
    q16blk *out = out_;
    for (int64_t b = 0; b < in / QK; b++) quantize_blk(x + b * QK, &out[b], 1, 1.0f, 1.0f, 0);
}

/* Q4_0: the offset factor folded into the block sums (-8 s), see
 * offset_factor. */
static void quantize_row_q4_0(const float *x, int64_t in, void *out_)
{
    q16blk *out = out_;
    for (int64_t b = 0; b < in / QK; b++) quantize_blk(x + b * QK, &out[b], 0, -8.0f, 1.0f, 0);
}

/* Q5_0: the Q5 order, and d_x / 16 against the codes 16 (q - 16) of
 * q5_0_codes, stored twice (d and s) for kx_q16_pair_dd. */
static void quantize_row_q5_0(const float *x, int64_t in, void *out_)
{
    q16blk *out = out_;
    for (int64_t b = 0; b < in / QK; b++)
        quantize_blk(x + b * QK, &out[b], 1, 1.0f, 1.0f / 16.0f, 1);
}

/* ------------------------------------------------------------------------ */
/* Block dot products                                                       */
/* ------------------------------------------------------------------------ */

static inline size_t blk_bytes(int fmt)
{
    switch (fmt) {
    case KHUB_QFORMAT_Q8_0: return 34;
    case KHUB_QFORMAT_Q4_0: return 18;
    case KHUB_QFORMAT_Q5_0: return 22;
    case KHUB_QFORMAT_Q5_1: return 24;
    default: return 20; /* Q4_1 */
    }
}

static inline int is_q5(int fmt) { return fmt == KHUB_QFORMAT_Q5_0 || fmt == KHUB_QFORMAT_Q5_1; }

/* Whether a block has an additive term c (Q8_0 and the signed Q5_0 codes
 * do not): the tiles skip its accumulation. */
static inline int has_offset(int fmt)
{
    return fmt != KHUB_QFORMAT_Q8_0 && fmt != KHUB_QFORMAT_Q5_0;
}

/* Byte offset of the nibbles qs[16] in a Q4 block (q5_codes finds its own). */
static inline int qs_offset(int fmt) { return fmt == KHUB_QFORMAT_Q4_0 ? 2 : 4; }

/* The 32 codes (0..31) of a Q5 block as two vectors of 16 int16 in the Q5
 * order: lo holds elements 0..7, 16..23, hi 8..15, 24..31, which is what
 * unpacking one 256-bit vector of the codes (0..15 in lane 0, 16..31 in
 * lane 1) against zero gives; the Q5 row quantizers store x to match. Bit 4 of
 * code l is bit l of the little-endian u32 qh. Shuffles are what the old
 * per-16-codes expansion ran out of (docs/performance.md, Q5_0 and Q5_1):
 * this costs one shuffle for all 32 bits (AVX2) or none (AVX-512: qh is
 * the byte mask of a masked add), plus the two unpacks Q4's widening pays
 * as two zero-extends. */
static inline __attribute__((always_inline)) void q5_codes(const int fmt, const uint8_t *blk,
                                                           __m256i *lo, __m256i *hi)
{
    const uint8_t *qh = blk + (fmt == KHUB_QFORMAT_Q5_0 ? 2 : 4);
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(qh + 4)));
    __m256i n = _mm256_and_si256(_mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4)),
                                 _mm256_set1_epi8(0x0f));
    uint32_t h;
    memcpy(&h, qh, 4);
#if defined(KX_LEVEL_AVX512)
    n = _mm256_mask_add_epi8(n, (__mmask32)h, n, _mm256_set1_epi8(0x10)); /* bit 4 is 0 in n */
#else
    /* byte l: the qh byte holding bit l (lane 0: bytes 0, 1; lane 1: 2, 3),
     * tested against 1 << (l % 8). */
    const __m256i sel =
        _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sel), bit);
    b = _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
    n = _mm256_or_si256(n, b);
#endif
    *lo = _mm256_unpacklo_epi8(n, _mm256_setzero_si256());
    *hi = _mm256_unpackhi_epi8(n, _mm256_setzero_si256());
}

/* The 32 codes of a Q5_0 block as 16 (q - 16) in two vectors of 16 int16,
 * in the Q5 order of q5_codes. The signed codes carry the block's offset
 * -16 d, so the tiles spend nothing on an offset term (as for Q8_0), and
 * they cost fewer instructions than the unsigned ones: an int16 lane made
 * by unpacking byte a (low) with byte b (high) is a + 256 b, so with a =
 * 16 n (the nibble n shifted into the byte's high half, which the shift
 * that splits the nibbles does anyway) and b = 0xff (-1) where bit 4 is 0,
 * else 0, it is 16 n - 256 (1 - bit4) = 16 (q - 16). Against q5_codes that
 * drops the AND with 0x10 and the OR that merged bit 4 into the byte (AVX2:
 * 7 vector instructions per block, was 9), and the offset term's add per
 * row and block pair. |16 (q - 16)| <= 256, so no int32 lane can overflow.
 * The activation scale is d_x / 16 (quantize_row_q5_0): d_w (d_x / 16) is
 * d_w d_x / 16 exactly. */
static inline __attribute__((always_inline)) void q5_0_codes(const uint8_t *blk, __m256i *lo,
                                                             __m256i *hi)
{
    const uint8_t *qh = blk + 2;
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(qh + 4)));
    /* lane 0: the low nibbles shifted up by 4 (64-bit shifts carry the next
     * byte's high nibble in, the AND drops it); lane 1: the high nibbles. */
    const __m256i n = _mm256_and_si256(_mm256_sllv_epi64(q, _mm256_setr_epi64x(4, 4, 0, 0)),
                                       _mm256_set1_epi8((char)0xf0));
    uint32_t h;
    memcpy(&h, qh, 4);
#if defined(KX_LEVEL_AVX512)
    const __m256i m = _mm256_movm_epi8((__mmask32)~h); /* 0xff where bit 4 is 0 */
#else
    /* byte l: the qh byte holding bit l (as in q5_codes), tested against
     * 1 << (l % 8); 0xff where the bit is 0. */
    const __m256i sel =
        _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i m = _mm256_cmpeq_epi8(
        _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sel), bit),
        _mm256_setzero_si256());
#endif
    *lo = _mm256_unpacklo_epi8(n, m);
    *hi = _mm256_unpackhi_epi8(n, m);
}

/* The block's 32 codes as two vectors of 16 int16: elements 0..15 and
 * 16..31, or the Q5 order of q5_codes (Q5_0: the signed codes of
 * q5_0_codes). */
static inline __attribute__((always_inline)) void codes16(const int fmt, const uint8_t *blk,
                                                          __m256i *lo, __m256i *hi)
{
    if (fmt == KHUB_QFORMAT_Q8_0) {
        *lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 2)));
        *hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 18)));
        return;
    }
    if (fmt == KHUB_QFORMAT_Q5_0) {
        q5_0_codes(blk, lo, hi);
        return;
    }
    if (is_q5(fmt)) {
        q5_codes(fmt, blk, lo, hi);
        return;
    }
    /* One zero-extending load widens the 16 code bytes to int16 lanes that
     * hold both nibbles (element i low, i + 16 high); an AND and a shift
     * split them: three instructions where masking and widening each half
     * apart took six. The same int16 codes, so the same results. */
    const __m256i v =
        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(blk + qs_offset(fmt))));
    *lo = _mm256_and_si256(v, _mm256_set1_epi16(0x0f));
    *hi = _mm256_srli_epi16(v, 4);
}

/* The offset term of Q4_0 is c sum(x) with c = -8 d. The factor rides on
 * the activation block sums instead (its quantizer stores s = -8 sum(x)),
 * so c here is d itself and the tiles spend no multiply on it: d (-8 s) and
 * (-8 d) s are the same exact product (a power of two scales exactly),
 * rounded once, so the results are the same bits as with c = -8 d, unless
 * -8 sum(x) overflows f32 (|sum(x)| > 4e37). */
static inline int offset_factor(int fmt) { return fmt == KHUB_QFORMAT_Q4_0 ? -8 : 1; }

/* [d0, c0, d1, c1] of blocks blk and blk + bb (c = additive term factor;
 * for Q4_0 c = d, see offset_factor). Q8_0 and Q5_0 have no offset term and
 * their tiles never read lanes 1 and 3 (they hold d0, d1 too): masking them to
 * zero cost an instruction per block pair and row for nothing. */
static inline __m128 scales2(const int fmt, const uint8_t *blk, size_t bb)
{
    uint32_t h0, h1;
    memcpy(&h0, blk, 4);
    memcpy(&h1, blk + bb, 4);
    /* vmovd zeroes lanes 1-3 and vcvtph2ps reads lanes 0-1 only: no
     * zeroing move is needed (_mm_setr_epi32(h0, h1, 0, 0) made one). */
    __m128 f = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)h0), (int)h1, 1));
    if (fmt == KHUB_QFORMAT_Q4_1 || fmt == KHUB_QFORMAT_Q5_1) return f; /* d0 m0 d1 m1 */
    return _mm_shuffle_ps(f, f, _MM_SHUFFLE(2, 2, 0, 0));               /* d0 d0 d1 d1 */
}

/* One tr x tc tile: rows w[0..tr) (stride wrb bytes) against token block
 * rows x[c * xs]; writes y[c * ldy + r]. Constant fmt/tr/tc after inlining. */
static inline __attribute__((always_inline)) void tile(const int fmt, const int tr, const int tc,
                                                       const uint8_t *w, size_t wrb,
                                                       const q16blk *x, int64_t xs, int64_t nb,
                                                       const float *bias, float *y, int64_t ldy)
{
    /* The loops over r and c are unrolled explicitly (-O2 does not): rolled,
     * acc[][] lives in memory and every block pays loads and stores. */
    __m256 acc[TR][TC];
    __m128 cor[TR][TC]; /* lanes 1 and 3 collect c * sum(x) */
    const size_t bb = blk_bytes(fmt);
    kx_q16_zero(tr, tc, acc, cor);
    /* The tile's rows are adjacent, so its weights are one region of
     * tr * wrb bytes, of which a pair step reads tr * 2 * bb. That region
     * is prefetched as one stream, KX_PF_DIST ahead at the pace it is read,
     * instead of each row's stream on its own: with four per-row streams
     * the cold Q8_0 GEMV (the tied output heads) read 7-9 GB/s where one
     * core streams 13-15 (docs/performance.md, "The Q8_0 decode tile: one
     * prefetch stream per tile"); SmolLM2's Q4_1 decode gained 1.04-1.18x
     * more; the Q4_0 and Q5 GEMVs 1.1-1.7x in bench-ops, a 1.05x tie in
     * decode-ab ("Q4_0, Q8_0 and Q4_K_M files"). Prefetches only. */
    const int seq_pf = fmt == KHUB_QFORMAT_Q8_0 || fmt == KHUB_QFORMAT_Q4_1 ||
                       fmt == KHUB_QFORMAT_Q4_0 || is_q5(fmt);
    const int step = tr * 2 * (int)bb;
    const char *pf = (const char *)w + KX_PF_DIST;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        if (seq_pf) {
#pragma GCC unroll 8
            for (int k = 0; k < (step + 63) / 64; k++) _mm_prefetch(pf + 64 * k, _MM_HINT_T0);
            pf += step;
        }
#pragma GCC unroll 4
        for (int r = 0; r < tr; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + (size_t)b * bb;
            if (!seq_pf) _mm_prefetch((const char *)blk + KX_PF_DIST, _MM_HINT_T0);
            __m256i w0l, w0h, w1l, w1h;
            codes16(fmt, blk, &w0l, &w0h);
            codes16(fmt, blk + bb, &w1l, &w1h);
            const __m128 sw = scales2(fmt, blk, bb);
#pragma GCC unroll 4
            for (int c = 0; c < tc; c++)
                if (has_offset(fmt))
                    kx_q16_pair(w0l, w0h, w1l, w1h, sw, x + c * xs + b, &acc[r][c], &cor[r][c]);
                else
                    kx_q16_pair_dd(w0l, w0h, w1l, w1h, sw, x + c * xs + b, &acc[r][c]);
        }
    }
    float cs[TR][TC];
#pragma GCC unroll 4
    for (int r = 0; r < tr; r++)
#pragma GCC unroll 4
        for (int c = 0; c < tc; c++) {
            cs[r][c] = has_offset(fmt) ? kx_q16_cor(cor[r][c]) : 0.0f;
        }
    for (; b < nb; b++) { /* odd block count: the last block alone */
#pragma GCC unroll 4
        for (int r = 0; r < tr; r++) {
            const uint8_t *blk = w + (size_t)r * wrb + (size_t)b * bb;
            __m256i wl, wh;
            codes16(fmt, blk, &wl, &wh);
            float dw = _cvtsh_ss(kx_rd16(blk));
            float cw = fmt == KHUB_QFORMAT_Q4_1 || fmt == KHUB_QFORMAT_Q5_1
                           ? _cvtsh_ss(kx_rd16(blk + 2))
                       : offset_factor(fmt) != 1 ? dw
                                                 : 0.0f;
#pragma GCC unroll 4
            for (int c = 0; c < tc; c++) {
                const q16blk *xb = x + c * xs + b;
                __m256 d = _mm256_cvtepi32_ps(kx_q16_dot(wl, wh, xb->p));
                acc[r][c] = _mm256_fmadd_ps(d, _mm256_set1_ps(dw * xb->d), acc[r][c]);
                cs[r][c] += cw * xb->s;
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < tc; c++)
#pragma GCC unroll 4
        for (int r = 0; r < tr; r++)
            y[c * ldy + r] = kx_hsum8(acc[r][c]) + cs[r][c] + (bias ? bias[r] : 0.0f);
}

/* The tiles reach at most 2 tokens: qdriver.c sends calls of KX_BATCH_MIN_N
 * (3) tokens or more to the batch tiles. So both modules make only the
 * shapes up to TR x 2; the AVX-512 build's KX_TC of 4 would add 3- and
 * 4-token shapes that no call reaches (they had been dead since the batch
 * tiles came, 8fb92cd; removed in session 19). tile()'s arrays keep TC
 * columns, of which it uses tc. */
#define Q16_TC 2
_Static_assert(KX_BATCH_MIN_N == Q16_TC + 1 && Q16_TC <= TC,
               "the tiles must cover every call below KX_BATCH_MIN_N tokens");
KX_TILES_W(2, KX_QTILE_DEF, q4_0, KHUB_QFORMAT_Q4_0)
KX_TILES_W(2, KX_QTILE_DEF, q4_1, KHUB_QFORMAT_Q4_1)
KX_TILES_W(2, KX_QTILE_DEF, q8_0, KHUB_QFORMAT_Q8_0)
KX_TILES_W(2, KX_QTILE_DEF, q5_0, KHUB_QFORMAT_Q5_0)
KX_TILES_W(2, KX_QTILE_DEF, q5_1, KHUB_QFORMAT_Q5_1)

static const kx_qtile_fn tiles_q4_0[TR][Q16_TC] = KX_TILE_PTRS_W(2, q4_0);
static const kx_qtile_fn tiles_q4_1[TR][Q16_TC] = KX_TILE_PTRS_W(2, q4_1);
static const kx_qtile_fn tiles_q8_0[TR][Q16_TC] = KX_TILE_PTRS_W(2, q8_0);
static const kx_qtile_fn tiles_q5_0[TR][Q16_TC] = KX_TILE_PTRS_W(2, q5_0);
static const kx_qtile_fn tiles_q5_1[TR][Q16_TC] = KX_TILE_PTRS_W(2, q5_1);

/* ------------------------------------------------------------------------ */
/* Batch tiles: one row x up to KX_TB tokens                                */
/* ------------------------------------------------------------------------ */

/* a * b, never fused into a following add: the tiles above add the product
 * of the offset term to cor with a separate rounding (their product has a
 * second use), and a batch tile must round the same way. GCC 12 at -O2 does
 * not fuse it here even without the empty asm (checked: the test still
 * passes without it); the asm keeps it so under -ffp-contract=fast. */
static inline __m256 mul_unfused(__m256 a, __m256 b)
{
    __m256 p = _mm256_mul_ps(a, b);
    __asm__("" : "+x"(p));
    return p;
}

/* The pair layout of the batch tiles. kx_q16_pair folds the dot products
 * of two blocks with a vphaddd, whose lanes are, per 128-bit half h,
 * [A(4h) + A(4h+1), A(4h+2) + A(4h+3), B(4h) + B(4h+1), B(4h+2) + B(4h+3)]
 * for the int32 madd lanes A of the first block and B of the second (lane j
 * of A: the products of int16 pairs j of the low and of the high code
 * vector). Taking the even and the odd int32 pairs of the two blocks' low
 * vectors (and of their high vectors) with one shufps each gives four
 * vectors whose madd lanes, summed, are those same integers: the same
 * values (integer sums are exact, |lane| < 2^26), without the vphaddd, the
 * tile's slowest instruction per token. The weights are shuffled once per
 * row and pair and shared by the tokens; the activations once per call. */
static inline __attribute__((always_inline)) void perm4(__m256i l0, __m256i h0, __m256i l1,
                                                        __m256i h1, __m256i v[4])
{
#define SHUF(a, b, i) \
    _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), i))
    v[0] = SHUF(l0, l1, _MM_SHUFFLE(2, 0, 2, 0));
    v[1] = SHUF(l0, l1, _MM_SHUFFLE(3, 1, 3, 1));
    v[2] = SHUF(h0, h1, _MM_SHUFFLE(2, 0, 2, 0));
    v[3] = SHUF(h0, h1, _MM_SHUFFLE(3, 1, 3, 1));
#undef SHUF
}

/* kx_qpairs_fn: each block pair's activation codes through perm4. */
static void q16_pairs(const void *xrow, int64_t nb, int16_t *xp)
{
    const q16blk *x = xrow;
    for (int64_t b = 0; b + 2 <= nb; b += 2, xp += KX_PAIR_CODES) {
        __m256i v[4];
        perm4(_mm256_loadu_si256((const __m256i *)x[b].p),
              _mm256_loadu_si256((const __m256i *)(x[b].p + 16)),
              _mm256_loadu_si256((const __m256i *)x[b + 1].p),
              _mm256_loadu_si256((const __m256i *)(x[b + 1].p + 16)), v);
        for (int i = 0; i < 4; i++) _mm256_storeu_si256((__m256i *)(xp + 16 * i), v[i]);
    }
}

/* The int32 lanes of kx_q16_pair's hadd for weights wv (perm4) against one
 * token's pair xp (q16_pairs). */
static inline __attribute__((always_inline)) __m256i pair_dot(const __m256i wv[4],
                                                              const int16_t *xp)
{
    const __m256i *x = (const __m256i *)xp;
#if defined(KX_LEVEL_AVX512)
    __m256i d = _mm256_madd_epi16(wv[0], _mm256_loadu_si256(x));
    d = _mm256_dpwssd_epi32(d, wv[1], _mm256_loadu_si256(x + 1));
    d = _mm256_dpwssd_epi32(d, wv[2], _mm256_loadu_si256(x + 2));
    return _mm256_dpwssd_epi32(d, wv[3], _mm256_loadu_si256(x + 3));
#else
    return _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(wv[0], _mm256_loadu_si256(x)),
                                             _mm256_madd_epi16(wv[1], _mm256_loadu_si256(x + 1))),
                            _mm256_add_epi32(_mm256_madd_epi16(wv[2], _mm256_loadu_si256(x + 2)),
                                             _mm256_madd_epi16(wv[3], _mm256_loadu_si256(x + 3))));
#endif
}

/* Row w against tokens t < tb: for every (row, token) the same float
 * operations in the same order as tile() (kx_q16_pair) on the same
 * integers (pair_dot), so the same bits. What the tokens share is done
 * once per block pair: unpacking and shuffling the codes, the weight
 * scales in the lane order of the pair step ([d0 d0 d1 d1 d0 d0 d1 d1],
 * times the token's dxv gives kx_q16_pair's sc). The offset term runs in a
 * second pass over the row's scales, vectorised over the tokens (lanes =
 * tokens, sv), so that the main loop holds only the 4 code vectors, the
 * scales, tb accumulators and two temporaries: 15 of AVX2's 16 registers,
 * no spills (with the offset term inside it kept 4 accumulators on the
 * stack). */
static inline __attribute__((always_inline)) void
btile(const int fmt, const int tb, const uint8_t *w, const q16blk *x, int64_t xs, int64_t nb,
      const int16_t *xp, int64_t xps, const float *dxv, int64_t dxs, const float *sv,
      const float *bias, float *y, int64_t ldy)
{
    const __m256i pick = _mm256_setr_epi32(0, 0, 2, 2, 0, 0, 2, 2);
    const size_t bb = blk_bytes(fmt);
    __m256 acc[KX_TB];
#pragma GCC unroll 8
    for (int t = 0; t < tb; t++) acc[t] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *blk = w + (size_t)b * bb;
        _mm_prefetch((const char *)blk + KX_PF_DIST, _MM_HINT_T0);
        __m256i w0l, w0h, w1l, w1h, wv[4];
        codes16(fmt, blk, &w0l, &w0h);
        codes16(fmt, blk + bb, &w1l, &w1h);
        perm4(w0l, w0h, w1l, w1h, wv);
        const __m128 sw = scales2(fmt, blk, bb);
        const __m256 dw = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(sw), pick);
        const int16_t *xpb = xp + (b / 2) * KX_PAIR_CODES;
        const float *dxb = dxv + (b / 2) * 8;
#pragma GCC unroll 8
        for (int t = 0; t < tb; t++) {
            __m256i d = pair_dot(wv, xpb + t * xps);
            __m256 sc = _mm256_mul_ps(dw, _mm256_loadu_ps(dxb + t * dxs));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc, acc[t]);
        }
    }
    float cs[KX_TB]; /* kx_q16_cor: lane 1 + lane 3 of each token */
    __m256 cor1 = _mm256_setzero_ps(), cor3 = _mm256_setzero_ps();
    if (has_offset(fmt))
        for (int64_t b2 = 0; b2 + 2 <= nb; b2 += 2) {
            const __m128 sw = scales2(fmt, w + (size_t)b2 * bb, bb);
            const __m256 c0 = _mm256_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(sw, sw, 1)));
            const __m256 c1 = _mm256_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(sw, sw, 3)));
            cor1 = _mm256_add_ps(cor1, mul_unfused(c0, _mm256_loadu_ps(sv + b2 * KX_TB)));
            cor3 = _mm256_add_ps(cor3, mul_unfused(c1, _mm256_loadu_ps(sv + (b2 + 1) * KX_TB)));
        }
    _mm256_storeu_ps(cs, _mm256_add_ps(cor1, cor3));
    for (; b < nb; b++) { /* odd block count: the last block alone, as tile() */
        const uint8_t *blk = w + (size_t)b * bb;
        __m256i wl, wh;
        codes16(fmt, blk, &wl, &wh);
        float dw = _cvtsh_ss(kx_rd16(blk));
        float cw = fmt == KHUB_QFORMAT_Q4_1 || fmt == KHUB_QFORMAT_Q5_1
                       ? _cvtsh_ss(kx_rd16(blk + 2))
                   : offset_factor(fmt) != 1 ? dw
                                             : 0.0f;
#pragma GCC unroll 8
        for (int t = 0; t < tb; t++) {
            const q16blk *xb = x + t * xs + b;
            __m256 d = _mm256_cvtepi32_ps(kx_q16_dot(wl, wh, xb->p));
            acc[t] = _mm256_fmadd_ps(d, _mm256_set1_ps(dw * xb->d), acc[t]);
            cs[t] += cw * xb->s;
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < tb; t++) y[t * ldy] = kx_hsum8(acc[t]) + cs[t] + (bias ? bias[0] : 0.0f);
}

#define BTILE_DEF(F, K, T) \
    static void btile_##F##_##T(const uint8_t *w, const void *x, int64_t xs, int64_t nb, \
                                const int16_t *xp, int64_t xps, const float *dxv, int64_t dxs, \
                                const float *sv, const float *bias, float *y, int64_t ldy) \
    { \
        btile(K, T, w, x, xs, nb, xp, xps, dxv, dxs, sv, bias, y, ldy); \
    }
#define BTILES(F, K) \
    BTILE_DEF(F, K, 1) \
    BTILE_DEF(F, K, 2) \
    BTILE_DEF(F, K, 3) \
    BTILE_DEF(F, K, 4) \
    BTILE_DEF(F, K, 5) \
    BTILE_DEF(F, K, 6) \
    BTILE_DEF(F, K, 7) \
    BTILE_DEF(F, K, 8) \
    static const kx_qbtile_fn btiles_##F[KX_TB] = {btile_##F##_1, btile_##F##_2, btile_##F##_3, \
                                                   btile_##F##_4, btile_##F##_5, btile_##F##_6, \
                                                   btile_##F##_7, btile_##F##_8};
_Static_assert(KX_TB == 8, "BTILES makes tiles of 1 to 8 tokens");
// clang-format off
BTILES(q4_0, KHUB_QFORMAT_Q4_0)
BTILES(q4_1, KHUB_QFORMAT_Q4_1)
BTILES(q8_0, KHUB_QFORMAT_Q8_0)
BTILES(q5_0, KHUB_QFORMAT_Q5_0)
BTILES(q5_1, KHUB_QFORMAT_Q5_1)
// clang-format on

/* ------------------------------------------------------------------------ */
/* Entry (the driver is qdriver.c)                                          */
/* ------------------------------------------------------------------------ */

khub_status KX(qlinear_q16_run)(kx_state *s, const kx_linear *a)
{
    const int kq = a->wfmt == KHUB_QFORMAT_Q4_K || a->wfmt == KHUB_QFORMAT_Q6_K;
    if (a->n >= (kq ? KX_GEMM_MIN_N_K : KX_GEMM_MIN_N)) return KX(qgemm_run)(s, a);
    if (kq) return KX(qlinear_q16k_run)(s, a);
    kx_qkernel k = {TR, Q16_TC, sizeof(q16blk), KX(q16_quantize_row), NULL, NULL, q16_pairs};
    if (a->wfmt == KHUB_QFORMAT_Q8_0) k.quantize_row = KX(q16_quantize_row_dd);
    if (a->wfmt == KHUB_QFORMAT_Q5_1) k.quantize_row = quantize_row_q5;
    if (a->wfmt == KHUB_QFORMAT_Q5_0) k.quantize_row = quantize_row_q5_0;
    if (a->wfmt == KHUB_QFORMAT_Q4_0) k.quantize_row = quantize_row_q4_0;
    switch (a->wfmt) {
    case KHUB_QFORMAT_Q4_0: k.tiles = &tiles_q4_0[0][0], k.btiles = btiles_q4_0; break;
    case KHUB_QFORMAT_Q4_1: k.tiles = &tiles_q4_1[0][0], k.btiles = btiles_q4_1; break;
    case KHUB_QFORMAT_Q8_0: k.tiles = &tiles_q8_0[0][0], k.btiles = btiles_q8_0; break;
    case KHUB_QFORMAT_Q5_0: k.tiles = &tiles_q5_0[0][0], k.btiles = btiles_q5_0; break;
    case KHUB_QFORMAT_Q5_1: k.tiles = &tiles_q5_1[0][0], k.btiles = btiles_q5_1; break;
    default:
        return KX_FAIL(s, KHUB_STATUS_INTERNAL, "qlinear: format %d reached the kernel", a->wfmt);
    }
    return KX(qdriver_run)(s, a, &k);
}
