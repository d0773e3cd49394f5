/*
 * qgemm.c: the prefill case of qlinear (many tokens): y = x @ W^T with the
 * block-quantized W (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K) dequantized, one
 * panel of output rows at a time, into f32 and multiplied with f32 x by a register-tiled GEMM.
 *
 * Why. The per-block dot products (qlinear_q16.c) spend most of their work
 * on each block's scale: convert, scale, accumulate, for every (row, token,
 * block). Dequantizing a panel once (exact: f16 scale times a small integer
 * is exact in f32) and reusing it for every token moves that cost out of the
 * inner loop, which becomes pure FMAs; and the result is the f32 math itself,
 * not an approximation of it.
 *
 * Layout. A panel holds PW consecutive output rows, transposed: p[k * PW + j]
 * is W[r0 + j][k], so one vector load at k gives PW / VL rows' weights
 * (VL = 16 lanes with AVX-512, 8 with AVX2). The micro-kernel keeps
 * RN tokens x (PW / VL) vectors of accumulators in registers; per k it loads
 * PW / VL weight vectors, broadcasts RN activations and issues
 * RN * PW / VL FMAs. Rows past `out` in the last panel are zero and their
 * results are not stored.
 *
 * Threads: host->parallel_for over panels; each pool thread packs into its
 * own panel of scratch (PW * in floats, 64-byte aligned), allocated by the
 * caller before the loop.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kx_simd.h"

#define QK 32

#if defined(KX_LEVEL_AVX512)
#define VL 16
typedef __m512 vf;
#define VLOAD(p)      _mm512_load_ps(p)
#define VBCAST(p)     _mm512_set1_ps(*(p))
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VZERO()       _mm512_setzero_ps()
#define VSTOREU(p, v) _mm512_storeu_ps(p, v)
#else
#define VL            8
typedef __m256 vf;
#define VLOAD(p)      _mm256_load_ps(p)
#define VBCAST(p)     _mm256_broadcast_ss(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VZERO()       _mm256_setzero_ps()
#define VSTOREU(p, v) _mm256_storeu_ps(p, v)
#endif
#define RN 6 /* tokens per micro-kernel call (12 accumulators) */
#define NV 2 /* weight vectors per k: the panel is NV * VL rows wide */
#define PW (NV * VL)

/* ------------------------------------------------------------------------ */
/* Packing                                                                  */
/* ------------------------------------------------------------------------ */

/* One block's values (32, or 256 for Q4_K / Q6_K), exactly: each is an f16
 * scale times small integers, at most 24 significant bits. */
static void dequant_block(int fmt, const uint8_t *blk, float *v)
{
    if (fmt == KHUB_QFORMAT_Q4_K) {
        uint8_t sm[16];
        kx_q4k_scales(blk + 4, sm);
        float d = _cvtsh_ss(kx_rd16(blk)), dmin = _cvtsh_ss(kx_rd16(blk + 2));
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = blk + 16 + 32 * (j / 2);
            int shift = (j & 1) * 4;
            float ds = d * (float)sm[j], dm = dmin * (float)sm[8 + j];
            for (int l = 0; l < QK; l++) v[QK * j + l] = ds * (float)((q[l] >> shift) & 15) - dm;
        }
        return;
    }
    if (fmt == KHUB_QFORMAT_Q6_K) {
        /* 16 weights per 8-bit scale: value = (d sc) (q - 32). */
        const int8_t *sc = (const int8_t *)(blk + 192);
        float d = _cvtsh_ss(kx_rd16(blk + 208));
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            kx_q6k_half(blk, h, q);
            for (int t = 0; t < 4; t++) {
                float *o = v + 128 * h + 32 * t;
                __m128i b[2] = {_mm256_castsi256_si128(q[t]), _mm256_extracti128_si256(q[t], 1)};
                for (int u = 0; u < 2; u++) {
                    __m256 s = _mm256_set1_ps(d * (float)sc[8 * h + 2 * t + u]);
                    __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b[u]));
                    __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b[u], 8)));
                    _mm256_storeu_ps(o + 16 * u, _mm256_mul_ps(s, lo));
                    _mm256_storeu_ps(o + 16 * u + 8, _mm256_mul_ps(s, hi));
                }
            }
        }
        return;
    }
    float d = _cvtsh_ss(kx_rd16(blk));
    if (fmt == KHUB_QFORMAT_Q8_0) {
        for (int i = 0; i < QK; i++) v[i] = d * (float)(int8_t)blk[2 + i];
        return;
    }
    if (fmt == KHUB_QFORMAT_Q5_0 || fmt == KHUB_QFORMAT_Q5_1) {
        /* code i = nibble | bit i of the little-endian u32 qh as bit 4 */
        const int q51 = fmt == KHUB_QFORMAT_Q5_1;
        uint32_t qh;
        memcpy(&qh, blk + (q51 ? 4 : 2), 4);
        const uint8_t *qs = blk + (q51 ? 8 : 6);
        float c = q51 ? _cvtsh_ss(kx_rd16(blk + 2)) : -16.0f * d;
        for (int i = 0; i < QK / 2; i++) {
            v[i] = d * (float)((qs[i] & 15) | (((qh >> i) & 1u) << 4)) + c;
            v[i + QK / 2] = d * (float)((qs[i] >> 4) | (((qh >> (i + 16)) & 1u) << 4)) + c;
        }
        return;
    }
    const uint8_t *qs = blk + (fmt == KHUB_QFORMAT_Q4_1 ? 4 : 2);
    float c = fmt == KHUB_QFORMAT_Q4_1 ? _cvtsh_ss(kx_rd16(blk + 2)) : -8.0f * d;
    for (int i = 0; i < QK / 2; i++) {
        v[i] = d * (float)(qs[i] & 15) + c;
        v[i + QK / 2] = d * (float)(qs[i] >> 4) + c;
    }
}

/* Packs rows [r0, r0 + rows) (rows <= PW) of W into p[in][PW], zero-padded. */
static void pack_panel(const kx_linear *a, int64_t r0, int rows, float *p)
{
    const khub_qformat f = (khub_qformat)a->wfmt;
    const int64_t be = khub_qformat_block_elems(f), nb = a->in / be;
    const size_t bb = (size_t)khub_qformat_block_bytes(f);
    if (rows < PW) memset(p, 0, sizeof(float) * (size_t)(a->in * PW));
    for (int j = 0; j < rows; j++) {
        const uint8_t *row = a->w + (size_t)(r0 + j) * a->w_row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            float v[256];
            dequant_block(a->wfmt, row + (size_t)b * bb, v);
            float *dst = p + (size_t)(b * be) * PW + j;
            for (int64_t i = 0; i < be; i++) dst[(size_t)i * PW] = v[i];
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Micro-kernel                                                             */
/* ------------------------------------------------------------------------ */

/* rn tokens (rn <= RN, constant after inlining) against one packed panel:
 * y[t * ldy + j] = sum_k x[t * ldx + k] p[k * PW + j] (+ bias[j]) for
 * j < cols. */
static inline __attribute__((always_inline)) void kernel(const int rn, const float *p,
                                                         const float *x, int64_t ldx, int64_t in,
                                                         const float *bias, int cols, float *y,
                                                         int64_t ldy)
{
    /* -O2 does not unroll these loops by itself, and rolled loops over
     * acc[][] keep the accumulators in memory: unroll them explicitly. */
    vf acc[RN][NV];
#pragma GCC unroll 6
    for (int t = 0; t < rn; t++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) acc[t][v] = VZERO();
    for (int64_t k = 0; k < in; k++) {
        vf w[NV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) w[v] = VLOAD(p + k * PW + v * VL);
#pragma GCC unroll 6
        for (int t = 0; t < rn; t++) {
            vf xb = VBCAST(x + t * ldx + k);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[t][v] = VFMA(w[v], xb, acc[t][v]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < rn; t++) {
        float out[PW];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) VSTOREU(out + v * VL, acc[t][v]);
        for (int j = 0; j < cols; j++) y[t * ldy + j] = out[j] + (bias ? bias[j] : 0.0f);
    }
}

typedef void (*kern_fn)(const float *p, const float *x, int64_t ldx, int64_t in, const float *bias,
                        int cols, float *y, int64_t ldy);

#define KDEF(R) \
    static void kern_##R(const float *p, const float *x, int64_t ldx, int64_t in, \
                         const float *bias, int cols, float *y, int64_t ldy) \
    { \
        kernel(R, p, x, ldx, in, bias, cols, y, ldy); \
    }
// clang-format 14 does not settle on a sequence of definition-generating macros.
// clang-format off
KDEF(1)
KDEF(2)
KDEF(3)
KDEF(4)
KDEF(5)
KDEF(6)
// clang-format on
static const kern_fn kerns[RN] = {kern_1, kern_2, kern_3, kern_4, kern_5, kern_6};

/* ------------------------------------------------------------------------ */
/* Driver                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct job {
    const kx_linear *a;
    uint8_t *scratch; /* n_threads panels of `stride` bytes */
    size_t stride;    /* bytes per panel, a multiple of 64 */
    int n_threads;
    int failed; /* a range ran on a thread index without a panel */
} job;

static void panels_range(void *ud, int64_t begin, int64_t end, int thread)
{
    job *j = ud;
    const kx_linear *a = j->a;
    if (thread < 0 || thread >= j->n_threads) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *p = (float *)(j->scratch + (size_t)thread * j->stride);
    for (int64_t pi = begin; pi < end; pi++) {
        int64_t r0 = pi * PW;
        int rows = (int)(a->out - r0 < PW ? a->out - r0 : PW);
        pack_panel(a, r0, rows, p);
        const float *bias = a->bias ? a->bias + r0 : NULL;
        for (int64_t t0 = 0; t0 < a->n; t0 += RN) {
            int rn = (int)(a->n - t0 < RN ? a->n - t0 : RN);
            kerns[rn - 1](p, a->x + t0 * a->ldx, a->ldx, a->in, bias, rows, a->y + t0 * a->ldy + r0,
                          a->ldy);
        }
    }
}

khub_status KX(qgemm_run)(kx_state *s, const kx_linear *a)
{
    const khub_host_api *h = s->host;
    if (a->wfmt != KHUB_QFORMAT_Q4_0 && a->wfmt != KHUB_QFORMAT_Q4_1 &&
        a->wfmt != KHUB_QFORMAT_Q8_0 && a->wfmt != KHUB_QFORMAT_Q4_K &&
        a->wfmt != KHUB_QFORMAT_Q6_K && a->wfmt != KHUB_QFORMAT_Q5_0 &&
        a->wfmt != KHUB_QFORMAT_Q5_1)
        return KX_FAIL(s, KHUB_STATUS_INTERNAL, "qlinear: format %d reached the kernel", a->wfmt);
    /* One panel per pool thread, allocated here: the host allocator is only
     * called from the calling thread. in <= 2^40 was checked by plugin.c. */
    int nt = h->n_threads(h->host_ctx);
    job j = {.a = a,
             .n_threads = nt < 1 ? 1 : nt,
             .stride = (sizeof(float) * (size_t)a->in * PW + 63) & ~(size_t)63};
    size_t bytes;
    if (__builtin_mul_overflow(j.stride, (size_t)j.n_threads, &bytes) ||
        __builtin_add_overflow(bytes, (size_t)64, &bytes))
        return KX_FAIL(s, KHUB_STATUS_OVERFLOW, "qlinear: %d panels of %lld inputs overflow",
                       j.n_threads, (long long)a->in);
    void *raw = h->alloc(h->host_ctx, bytes);
    if (!raw)
        return KX_FAIL(s, KHUB_STATUS_NOMEM,
                       "qlinear: no memory for %d weight panels of %zu "
                       "bytes",
                       j.n_threads, j.stride);
    j.scratch = (uint8_t *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    h->parallel_for(h->host_ctx, (a->out + PW - 1) / PW, panels_range, &j);
    h->free(h->host_ctx, raw);
    if (j.failed)
        return KX_FAIL(s, KHUB_STATUS_INTERNAL,
                       "qlinear: the pool ran a chunk on a thread "
                       "index outside [0, %d)",
                       j.n_threads);
    return KHUB_STATUS_OK;
}
