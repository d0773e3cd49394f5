/*
 * kx_attn_tile.h: the flash-attention recurrence shared by attention.c
 * (dense, strided K/V views) and paged_attention.c (K/V in the blocks of a
 * paged pool). Both walk a work item's keys in tiles of KX_ATT_KT keys
 * starting at the first key any of its rows may see, and hand each tile to
 * kx_attn_tile() as row pointers (f32 K/V read in place), or to
 * kx_attn_tile_f16() (f16 K/V: read in place for items of few rows, else
 * converted once per tile). So one sequence's attention is the same float
 * operations in the same order whichever op computes it, whatever the paged
 * cache's block size and whether its K/V are f32 or f16 (holding the same
 * values): a batch on the paged cache gives each row the bits of its solo run
 * on the dense cache (tests/test_paged.c `paged_bits_equal_dense_cpu_x86`).
 * Included only by kernel files (module ISA flags).
 */
#ifndef KHUB_CPU_X86_KX_ATTN_TILE_H
#define KHUB_CPU_X86_KX_ATTN_TILE_H

#include <math.h>

#include "kx_simd.h"

#define KX_ATT_KT       32  /* keys per tile */
#define KX_ATT_MAX_ROWS 16  /* query rows per work item */
#define KX_ATT_MAX_HD   256 /* plugin.c rejects larger head dims */

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

/* acc = acc * c + sum_j p[j] v[j] over nk keys (value row j at v[j]). Each
 * element adds its terms in the order j = 0, 1, ...; 64 elements (8
 * vectors) at a time are kept in registers while j runs, so the 8 FMA
 * chains are independent (one chain per vector was bound by the FMA
 * latency). */
static inline void rescale_axpy(float *acc, float c, const float *p, const float *const *v,
                                int64_t nk, int64_t n)
{
    int64_t i = 0;
    const __m256 vc = _mm256_set1_ps(c);
    for (; i + 64 <= n; i += 64) {
        __m256 s[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++) s[u] = _mm256_mul_ps(_mm256_loadu_ps(acc + i + 8 * u), vc);
        for (int64_t j = 0; j < nk; j++) {
            const __m256 b = _mm256_set1_ps(p[j]);
            const float *vj = v[j] + i;
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
            s = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v[j] + i), s);
        _mm256_storeu_ps(acc + i, s);
    }
    for (; i < n; i++) {
        float s = acc[i] * c;
        for (int64_t j = 0; j < nk; j++) s += p[j] * v[j][i];
        acc[i] = s;
    }
}

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

/* The rows of one work item: R = queries x G query heads sharing a KV head;
 * row r is query r / G, at position pos0 + r / G. Per row the recurrence
 * keeps the running max m, the running sum l and the unnormalised output
 * acc:
 *     s_j = cap(scale q.k_j) + mask_j,  m' = max(m, max_j s_j),
 *     l = l e^(m - m') + sum_j e^(s_j - m'),  acc = acc e^(m - m') + sum_j e^(s_j - m') v_j,
 * and out = acc / l at the end. Key j is visible to position p when j <= p
 * (causal) and p - j < window (window > 0), and mask[q][j] (row stride
 * smask; NULL: none) is added. */
typedef struct kx_att_rows {
    int64_t R, G, hd;
    float *q, *acc; /* [R][hd]: the rows' queries times scale; their outputs */
    float m[KX_ATT_MAX_ROWS], l[KX_ATT_MAX_ROWS];
    int64_t pos0, window;
    int causal;
    float softcap; /* > 0: s = softcap * tanh(s / softcap) (ABI 1.5) */
    const float *mask;
    int64_t smask;
} kx_att_rows;

/* Whether key kj is hidden from position pos (causal, window). */
static inline int kx_att_hidden(const kx_att_rows *w, int64_t pos, int64_t kj)
{
    return (w->causal && kj > pos) || (w->window > 0 && pos - kj >= w->window);
}

/* A visible key's score from its dot product d with query qi: capped, then
 * masked. */
static inline float kx_att_score(const kx_att_rows *w, int64_t qi, int64_t kj, float d)
{
    if (w->softcap > 0.0f) d = w->softcap * tanhf(d / w->softcap);
    if (w->mask) d += w->mask[qi * w->smask + kj];
    return d;
}

/* Scores of row r against a tile of nk keys from key index j0; returns the
 * tile's max. */
static inline float kx_att_scores(const kx_att_rows *w, int64_t r, const float *const *k,
                                  int64_t j0, int64_t nk, float *sc)
{
    const int64_t qi = r / w->G, pos = w->pos0 + qi;
    const float *q = w->q + r * w->hd;
    float mx = -INFINITY;
    for (int64_t j = 0; j < nk; j++) {
        int64_t kj = j0 + j;
        float s =
            kx_att_hidden(w, pos, kj) ? -INFINITY : kx_att_score(w, qi, kj, dot(q, k[j], w->hd));
        sc[j] = s;
        if (s > mx) mx = s;
    }
    return mx;
}

/* Feeds a tile of nk <= KX_ATT_KT keys (key j0 + j at k[j], its value at
 * v[j]) to every row of w. */
static inline void kx_attn_tile(kx_att_rows *w, const float *const *k, const float *const *v,
                                int64_t j0, int64_t nk)
{
    float p[KX_ATT_KT];
    for (int64_t r = 0; r < w->R; r++) {
        float mt = kx_att_scores(w, r, k, j0, nk, p);
        if (mt == -INFINITY) continue;
        float mn = mt > w->m[r] ? mt : w->m[r];
        float corr = w->m[r] == -INFINITY ? 0.0f : expf(w->m[r] - mn);
        w->l[r] = w->l[r] * corr + exp_scores(p, nk, mn);
        rescale_axpy(w->acc + r * w->hd, corr, p, v, nk, w->hd);
        w->m[r] = mn;
    }
}

/* Row r's query (not yet scaled) into w, its state reset. */
static inline void kx_att_row_init(kx_att_rows *w, int64_t r, const float *q, float scale)
{
    for (int64_t d = 0; d < w->hd; d++) w->q[r * w->hd + d] = q[d] * scale;
    memset(w->acc + r * w->hd, 0, (size_t)w->hd * sizeof(float));
    w->m[r] = -INFINITY;
    w->l[r] = 0.0f;
}

/* Row r's output acc / l (zeros for a row that saw no key) into o. */
static inline void kx_att_row_out(const kx_att_rows *w, int64_t r, float *o)
{
    float inv = w->l[r] > 0.0f ? 1.0f / w->l[r] : 0.0f;
    for (int64_t d = 0; d < w->hd; d++) o[d] = w->acc[r * w->hd + d] * inv;
}

/* nk rows of hd f16 (row j at src + j * stride) into dst [nk][hd] f32, the
 * row pointers into rows[]. */
static inline void kx_att_f16_rows(const uint16_t *const *src, int64_t nk, int64_t hd, float *dst,
                                   const float **rows)
{
    for (int64_t j = 0; j < nk; j++) {
        float *o = dst + j * hd;
        int64_t d = 0;
        for (; d + 8 <= hd; d += 8)
            _mm256_storeu_ps(o + d,
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src[j] + d))));
        for (; d < hd; d++) o[d] = kx_f16_to_f32(src[j][d]);
        rows[j] = o;
    }
}

/* ------------------------------------------------------------------------ */
/* f16 K/V read in place, for tiles of few rows (decode)                    */
/* ------------------------------------------------------------------------ */

/* Rows up to which an f16 tile is read in place (kx_attn_tile_f16): each
 * 8 halves converted in registers and used by every row, so the tile is
 * neither stored as f32 nor read back. Above it the tile is converted into
 * f32 buffers once and read back by every row (prefill: 15 rows of
 * SmolLM2), where the joint loops would run out of registers. At decode (1
 * query x G rows, 3 for SmolLM2) reading in place made the op 1.5x faster
 * on a hot cache (docs/performance.md, session 14). At most 4 rows, so the
 * joint loops keep their sums in the 16 ymm registers. */
#define KX_ATT_F16_DIRECT_ROWS 4
_Static_assert(KX_ATT_F16_DIRECT_ROWS == 4, "kx_attn_tile_f16() and kx_attn_tile_f16_n() "
                                            "switch over row counts 1-4");

static inline __m256 kx_ld_f16x8(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Scores of rows [0, R) (R <= KX_ATT_F16_DIRECT_ROWS, a constant once
 * inlined) against a tile of nk f16 keys read in place; the tile's max per
 * row into mx[]. Each key's halves are converted once, in registers, for
 * all R rows. Per row this is dot() and kx_att_scores() on the converted
 * key, operation for operation (two FMA chains over 16 elements, one over
 * the next 8, the horizontal sum, then the scalar tail), so the same bits;
 * a hidden key's dot product is computed and dropped. */
static inline __attribute__((always_inline)) void
kx_att_scores_f16(const kx_att_rows *w, const int R, const uint16_t *const *k, int64_t j0,
                  int64_t nk, float (*sc)[KX_ATT_KT], float *mx)
{
    const int64_t hd = w->hd;
    for (int r = 0; r < R; r++) mx[r] = -INFINITY;
    for (int64_t j = 0; j < nk; j++) {
        const uint16_t *kj = k[j];
        __m256 s0[KX_ATT_F16_DIRECT_ROWS], s1[KX_ATT_F16_DIRECT_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= hd; i += 16) {
            const __m256 b0 = kx_ld_f16x8(kj + i), b1 = kx_ld_f16x8(kj + i + 8);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const float *q = w->q + r * hd + i;
                s0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q), b0, s0[r]);
                s1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8), b1, s1[r]);
            }
        }
        for (; i + 8 <= hd; i += 8) {
            const __m256 b0 = kx_ld_f16x8(kj + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                s0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w->q + r * hd + i), b0, s0[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const int64_t qi = r / w->G, pos = w->pos0 + qi;
            const float *q = w->q + r * hd;
            float d = kx_hsum8(_mm256_add_ps(s0[r], s1[r]));
            for (int64_t t = i; t < hd; t++) d += q[t] * kx_f16_to_f32(kj[t]);
            float s = kx_att_hidden(w, pos, j0 + j) ? -INFINITY : kx_att_score(w, qi, j0 + j, d);
            sc[r][j] = s;
            if (s > mx[r]) mx[r] = s;
        }
    }
}

/* rescale_axpy() for n rows at once (n <= KX_ATT_F16_DIRECT_ROWS, a
 * constant once inlined) over nk f16 value rows read in place: acc[r] =
 * acc[r] * c[r] + sum_j p[r][j] v[j]. Each element adds the same terms in
 * the same order j = 0, 1, ... as rescale_axpy (which elements share a
 * register does not change a sum), so the same bits; 8 / n vectors of 8
 * elements per row are kept in registers while j runs, each value vector
 * converted once for the n rows. */
static inline __attribute__((always_inline)) void
kx_att_axpy_f16(float *const *acc, const float *c, const float *const *p, const int n,
                const uint16_t *const *v, int64_t nk, int64_t hd)
{
    enum { NR = KX_ATT_F16_DIRECT_ROWS };
    const int W = 8 / n; /* vectors per row per block: 8, 4, 2, 2 */
    int64_t i = 0;
    for (; i + 8 * W <= hd; i += 8 * W) {
        __m256 s[NR][8];
#pragma GCC unroll 4
        for (int r = 0; r < n; r++)
#pragma GCC unroll 8
            for (int u = 0; u < W; u++)
                s[r][u] = _mm256_mul_ps(_mm256_loadu_ps(acc[r] + i + 8 * u), _mm256_set1_ps(c[r]));
        for (int64_t j = 0; j < nk; j++) {
            __m256 b[NR];
#pragma GCC unroll 4
            for (int r = 0; r < n; r++) b[r] = _mm256_set1_ps(p[r][j]);
#pragma GCC unroll 8
            for (int u = 0; u < W; u++) {
                const __m256 x = kx_ld_f16x8(v[j] + i + 8 * u);
#pragma GCC unroll 4
                for (int r = 0; r < n; r++) s[r][u] = _mm256_fmadd_ps(b[r], x, s[r][u]);
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < n; r++)
#pragma GCC unroll 8
            for (int u = 0; u < W; u++) _mm256_storeu_ps(acc[r] + i + 8 * u, s[r][u]);
    }
    for (; i + 8 <= hd; i += 8)
        for (int r = 0; r < n; r++) {
            __m256 s = _mm256_mul_ps(_mm256_loadu_ps(acc[r] + i), _mm256_set1_ps(c[r]));
            for (int64_t j = 0; j < nk; j++)
                s = _mm256_fmadd_ps(_mm256_set1_ps(p[r][j]), kx_ld_f16x8(v[j] + i), s);
            _mm256_storeu_ps(acc[r] + i, s);
        }
    for (; i < hd; i++)
        for (int r = 0; r < n; r++) {
            float s = acc[r][i] * c[r];
            for (int64_t j = 0; j < nk; j++) s += p[r][j] * kx_f16_to_f32(v[j][i]);
            acc[r][i] = s;
        }
}

/* kx_attn_tile() for R rows (a constant once inlined) over f16 keys and
 * values read in place: the same per-row steps in the same order. Rows that
 * see no key of the tile are left as they are, the others go to the joint
 * accumulation together. */
static inline __attribute__((always_inline)) void kx_attn_tile_f16_n(kx_att_rows *w, const int R,
                                                                     const uint16_t *const *k,
                                                                     const uint16_t *const *v,
                                                                     int64_t j0, int64_t nk)
{
    enum { NR = KX_ATT_F16_DIRECT_ROWS };
    float sc[NR][KX_ATT_KT], mx[NR], c[NR];
    float *acc[NR];
    const float *p[NR];
    kx_att_scores_f16(w, R, k, j0, nk, sc, mx);
    int n = 0;
    for (int r = 0; r < R; r++) {
        if (mx[r] == -INFINITY) continue;
        float mn = mx[r] > w->m[r] ? mx[r] : w->m[r];
        c[n] = w->m[r] == -INFINITY ? 0.0f : expf(w->m[r] - mn);
        w->l[r] = w->l[r] * c[n] + exp_scores(sc[r], nk, mn);
        w->m[r] = mn;
        acc[n] = w->acc + r * w->hd, p[n] = sc[r], n++;
    }
    switch (n) { /* a constant row count for each inlined copy */
    case 1: kx_att_axpy_f16(acc, c, p, 1, v, nk, w->hd); break;
    case 2: kx_att_axpy_f16(acc, c, p, 2, v, nk, w->hd); break;
    case 3: kx_att_axpy_f16(acc, c, p, 3, v, nk, w->hd); break;
    case 4: kx_att_axpy_f16(acc, c, p, 4, v, nk, w->hd); break;
    default: break;
    }
}

/* Feeds a tile of nk <= KX_ATT_KT f16 keys (key j0 + j at k[j], its value
 * at v[j], hd halves each) to every row of w: read in place when w has at
 * most KX_ATT_F16_DIRECT_ROWS rows, else converted into kbuf and vbuf
 * ([KX_ATT_KT][hd] f32 each) and given to kx_attn_tile(). Both give the
 * bits of kx_attn_tile() on f32 rows holding the same values (the
 * conversion is exact). */
static inline void kx_attn_tile_f16(kx_att_rows *w, const uint16_t *const *k,
                                    const uint16_t *const *v, int64_t j0, int64_t nk, float *kbuf,
                                    float *vbuf)
{
    switch (w->R) {
    case 1: kx_attn_tile_f16_n(w, 1, k, v, j0, nk); return;
    case 2: kx_attn_tile_f16_n(w, 2, k, v, j0, nk); return;
    case 3: kx_attn_tile_f16_n(w, 3, k, v, j0, nk); return;
    case 4: kx_attn_tile_f16_n(w, 4, k, v, j0, nk); return;
    default: break;
    }
    const float *kr[KX_ATT_KT], *vr[KX_ATT_KT];
    kx_att_f16_rows(k, nk, w->hd, kbuf, kr);
    kx_att_f16_rows(v, nk, w->hd, vbuf, vr);
    kx_attn_tile(w, kr, vr, j0, nk);
}

#endif /* KHUB_CPU_X86_KX_ATTN_TILE_H */
