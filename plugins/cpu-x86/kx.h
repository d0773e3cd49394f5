/*
 * kx.h: what the files of the optimized x86 CPU plugin family share.
 *
 * One set of sources builds two modules: cpu-avx2.so (AVX2, FMA, F16C) and
 * cpu-avx512.so (the same plus AVX-512 F/BW/DQ/VL and VNNI). plugin.c holds
 * the descriptor and the argument checks and is compiled WITHOUT ISA flags,
 * so the entry point and init run on any x86-64 even when the module's
 * kernels cannot; the kernel files (qlinear.c, linear.c, attention.c,
 * pointwise.c) are compiled with the module's -m flags and are only reached
 * after the feature check. KX(name) gives every non-static symbol a per-level
 * name so both levels can also be linked into one program.
 *
 * For tests only, a third build, cpu-avx512-emu.so: the KX_LEVEL_AVX512
 * logic compiled with the AVX2 flags, its AVX-512 instructions emulated by
 * kx_emu512.h (KX_AVX512_EMU), so that the AVX-512 branches run on any AVX2
 * CPU. It is never installed; the shipped modules are built without it.
 *
 * Tensors reach the kernels already validated by plugin.c: shapes agree,
 * pointers are non-NULL, strides are in elements, non-negative, and the
 * innermost stride is 1.
 */
#ifndef KHUB_CPU_X86_KX_H
#define KHUB_CPU_X86_KX_H

#include <stdint.h>
#include <string.h>

#include <khub/khub_plugin.h>

#if defined(KX_AVX512_EMU)
#define KX(name) kx_avx512emu_##name /* test-only: kx_emu512.h */
#elif defined(KX_LEVEL_AVX512)
#define KX(name) kx_avx512_##name
#else
#define KX(name) kx_avx2_##name
#endif

/* Plugin state: the host table and whether this CPU can run the kernels. */
typedef struct kx_state {
    const khub_host_api *host;
    uint32_t need; /* KHUB_CPU_* bits the kernels were compiled for */
    int runnable;  /* the host reports every bit of need */
} kx_state;

#define KX_FAIL(s, st, ...) ((s)->host->fail((s)->host->host_ctx, (st), __VA_ARGS__))

/* ------------------------------------------------------------------------ */
/* Validated argument bundles                                               */
/* ------------------------------------------------------------------------ */

/* y[n, out] = x[n, in] @ W[out, in]^T (+ bias). */
typedef struct kx_linear {
    const float *x; /* [n, in], row stride ldx elements */
    int64_t n, in, ldx;
    const uint8_t *w; /* [out] rows of w_row_bytes each */
    int64_t out;
    size_t w_row_bytes;
    int wfmt;          /* qlinear: khub_qformat; linear: khub_dtype_id */
    const float *bias; /* [out] or NULL */
    float *y;          /* [n, out], row stride ldy elements */
    int64_t ldy;
} kx_linear;

typedef struct kx_attn {
    const float *q; /* [n_q, n_heads, hd]: strides sq_t, sq_h */
    int64_t sq_t, sq_h;
    const void *k, *v; /* [n_kv, n_kv_heads, hd] f32 or f16 */
    int64_t sk_t, sk_h, sv_t, sv_h;
    int kv_f16;
    const float *mask; /* [n_q, n_kv] row stride smask, or NULL */
    int64_t smask;
    float *out; /* [n_q, n_heads, hd]: strides so_t, so_h */
    int64_t so_t, so_h;
    int64_t n_q, n_kv, n_heads, n_kv_heads, hd;
    float scale;
    int causal;
    int64_t q_pos0, window;
    float softcap; /* > 0: scores s become softcap * tanh(s / softcap) (ABI 1.5) */
} kx_attn;

typedef struct kx_norm {
    int type; /* khub_norm_type */
    float eps;
    const float *x; /* [n, dim] row stride ldx */
    float *res;     /* [n, dim] row stride ldr, or NULL */
    const float *w; /* [dim] */
    float *y;       /* [n, dim] row stride ldy */
    int64_t n, dim, ldx, ldr, ldy;
} kx_norm;

typedef struct kx_act {
    int type; /* khub_act_type */
    const float *gate, *up;
    float *y;
    int64_t n, ff, ldg, ldu, ldy;
} kx_act;

/* A quantized-activation qlinear kernel for qdriver.c: how to quantize one
 * row of x into 32-blocks, and its tiles of up to tr rows x tc tokens. */
typedef void (*kx_qrow_fn)(const float *x, int64_t in, void *out);
typedef void (*kx_qtile_fn)(const uint8_t *w, size_t wrb, const void *x, int64_t xs, int64_t nb,
                            const float *bias, float *y, int64_t ldy);
/* A batch tile (qlinear_q16.c): one output row against tb <= KX_TB tokens,
 * bit for bit what the kx_qtile_fn tiles give each (row, token), with the
 * per-block work shared by the tokens: xp holds per token (at xp + t * xps)
 * and block pair the pair's codes in the order kx_qpairs_fn lays them out;
 * dxv per token and block pair the activation scales as [dx0 dx0 dx1 dx1
 * dx0 dx0 dx1 dx1] (token t at dxv + t * dxs); sv per block the tokens'
 * exact block sums (sv[b * KX_TB + t]); x (token t at x + t * xs) is read
 * only for an odd last block. qdriver.c builds xp, dxv and sv once per call. */
typedef void (*kx_qbtile_fn)(const uint8_t *w, const void *x, int64_t xs, int64_t nb,
                             const int16_t *xp, int64_t xps, const float *dxv, int64_t dxs,
                             const float *sv, const float *bias, float *y, int64_t ldy);
/* Lays out the block pairs of one quantized row (nb blocks) for the batch
 * tiles: (nb / 2) * KX_PAIR_CODES int16 at xp. */
typedef void (*kx_qpairs_fn)(const void *xrow, int64_t nb, int16_t *xp);
#define KX_TB         8
#define KX_PAIR_CODES 64
typedef struct kx_qkernel {
    int tr, tc;       /* tile rows and tokens */
    size_t blk_bytes; /* bytes of one quantized 32-block of x */
    kx_qrow_fn quantize_row;
    const kx_qtile_fn *tiles; /* [tr][tc] flattened: tiles[(rows - 1) * tc + tokens - 1] */
    /* Batch tiles [tb - 1], or NULL: used for calls of at least
     * KX_BATCH_MIN_N tokens. x's blocks must then start with float d, s. */
    const kx_qbtile_fn *btiles;
    kx_qpairs_fn pairs; /* with btiles: the pair layout their xp holds */
} kx_qkernel;

/* Row-wise work of up to this many elements (rows x row length: a decode
 * step's activations to quantize, its norms and its gated activation at a
 * few sequences) runs on the calling thread: it takes microseconds, less
 * than one fork/join of the pool, which on a busy machine also waits for a
 * core. Which thread computes a row does not change its bits. */
#define KX_INLINE_ELEMS 16384

/* Kernels (kernel files, compiled with the module's ISA flags). They return
 * NOMEM when scratch memory cannot be had, else OK. */
khub_status KX(qdriver_run)(kx_state *s, const kx_linear *a, const kx_qkernel *k);
khub_status KX(qlinear_run)(kx_state *s, const kx_linear *a);     /* int8 activations */
khub_status KX(qlinear_f32_run)(kx_state *s, const kx_linear *a); /* f32 activations */
khub_status KX(qlinear_q16_run)(kx_state *s, const kx_linear *a); /* int16 activations */
/* The Q4_K / Q6_K tiles of qlinear_q16_run (in a multiple of 256, n small). */
khub_status KX(qlinear_q16k_run)(kx_state *s, const kx_linear *a);
/* qlinear_q16_run hands calls of at least KX_GEMM_MIN_N tokens (Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0) or KX_GEMM_MIN_N_K tokens (Q4_K, Q6_K) to qgemm_run:
 * weights dequantized per panel, f32 GEMM (the f32 math, exact). Below, the
 * int16 tiles, which give each token bit for bit its one-token result. Chosen
 * by measurement (docs/performance.md, "Batched decode" and session 15): the
 * batch tiles (from KX_BATCH_MIN_N) cost the same per token from 8 to 256
 * tokens, the GEMM's panel packing is paid once per call, so the GEMM wins
 * from the row count where the packing is amortized. For SmolLM2's Q4_1
 * layers and Q8_0 head on Zen 2 (AVX2, weights hot, 1 thread) the tiles are
 * 1.2x faster at 64 rows, tie at 96-112 and lose from 128 on (the head
 * alone, 49152 rows, keeps winning to 128); in a 64-sequence batch, weights
 * streamed from memory, the packing was 25 % of the decode steps. 48 until
 * session 15 (chosen against the older 4 x 2 tiles). The k-quants' tiles are
 * slower: 32, measured on Zen 3. The AVX-512 build uses the same values,
 * unmeasured. */
#define KX_GEMM_MIN_N   128
#define KX_GEMM_MIN_N_K 32
/* From this many tokens the 32-block formats' int16 path runs the batch
 * tiles (one row x up to KX_TB tokens, kx_qbtile_fn) instead of the
 * KX_TR x 2 tiles: the same results, less work per token. Those tiles
 * therefore stop at 2 tokens in both modules (qlinear_q16.c). */
#define KX_BATCH_MIN_N 3
khub_status KX(qgemm_run)(kx_state *s, const kx_linear *a);
khub_status KX(linear_run)(kx_state *s, const kx_linear *a);
khub_status KX(attention_run)(kx_state *s, const kx_attn *a);
/* paged_attention.c: the checked call of khub_paged_check.h, layout PAGED_HTD. */
struct khub_pu_paged;
khub_status KX(paged_attention_run)(kx_state *s, const struct khub_pu_paged *p);
khub_status KX(norm_run)(kx_state *s, const kx_norm *a);
khub_status KX(act_run)(kx_state *s, const kx_act *a);

/* ------------------------------------------------------------------------ */
/* Scalar helpers                                                           */
/* ------------------------------------------------------------------------ */

/* IEEE half to float, exact, without F16C (used by the scalar tails too). */
static inline float kx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float kx_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t kx_rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The sixteen 6-bit numbers packed in a Q4_K block's scales[12]
 * (ref-cpu's quant.c describes the packing): out[0..7] = the sub-block
 * scales, out[8..15] = the mins. Bytes 0-3 / 4-7 hold scale / min 0..3 in
 * their low 6 bits and bits 4-5 of scale / min 4..7 in their top 2 bits;
 * bytes 8-11 hold bits 0-3 of scale 4..7 (low nibble) and min 4..7 (high). */
static inline void kx_q4k_scales(const uint8_t *sc12, uint8_t out[16])
{
    uint32_t u[3], v[4];
    memcpy(u, sc12, 12);
    v[0] = u[0] & 0x3f3f3f3fu;
    v[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
    v[2] = u[1] & 0x3f3f3f3fu;
    v[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
    memcpy(out, v, 16);
}

#endif /* KHUB_CPU_X86_KX_H */
