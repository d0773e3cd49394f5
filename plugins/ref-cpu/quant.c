/*
 * quant.c: reference block-quantization formats and the "qlinear" op.
 *
 * Layouts (khub_tensor.h names the formats; all multi-byte fields are
 * little-endian, blocks are packed with no padding, a row is a whole number
 * of blocks). The GGUF formats are ggml's block layouts bit for bit, written
 * here from the published layout description, not from ggml's code:
 *
 *   Q8_0   (32 w, 34 B)  f16 d | i8 q[32]                    w = q * d
 *   Q4_0   (32 w, 18 B)  f16 d | u8 qs[16]                   w = (q - 8) * d
 *   Q4_1   (32 w, 20 B)  f16 d | f16 m | u8 qs[16]           w = q * d + m
 *          (both: weight l < 16 is the low nibble of qs[l], weight l >= 16
 *          the high nibble of qs[l - 16])
 *   Q5_0   (32 w, 22 B)  f16 d | u8 qh[4] | u8 qs[16]        w = (q - 16) * d
 *   Q5_1   (32 w, 24 B)  f16 d | f16 m | u8 qh[4] | u8 qs[16]  w = q * d + m
 *          (both: q is a 5-bit code; its low 4 bits are weight l's nibble of
 *          qs as in Q4_0, its bit 4 is bit l of qh read as a little-endian
 *          u32, so weights 0..15 take their top bits from qh[0..1] and
 *          weights 16..31 from qh[2..3])
 *   Q4_K   (256 w, 144 B) f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
 *          8 sub-blocks of 32 weights, each with a 6-bit scale sc and 6-bit
 *          min mn:  w = (d * sc) * q - (dmin * mn).
 *          The 64 weights of chunk c (0..3) share qs[32c .. 32c+31]: sub-block
 *          2c takes the low nibbles, sub-block 2c+1 the high nibbles.
 *          scales[12] packs the sixteen 6-bit numbers: bytes 0-3 hold sc[0..3]
 *          in their low 6 bits, bytes 4-7 hold mn[0..3] likewise; the top two
 *          bits of bytes 0-3 / 4-7 are bits 4-5 of sc[4..7] / mn[4..7]; bytes
 *          8-11 hold bits 0-3 of sc[4..7] (low nibble) and of mn[4..7] (high).
 *   Q6_K   (256 w, 210 B) u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
 *          16 sub-blocks of 16 weights with a signed 8-bit scale each;
 *          w = (d * scale) * (q - 32) with q a 6-bit number: 4 low bits from
 *          ql, 2 high bits from qh. Weight e sits in half h = e / 128,
 *          quarter t = (e % 128) / 32, lane l = e % 32:
 *            low bits  = nibble (t >= 2 ? high : low) of ql[64h + 32(t & 1) + l]
 *            high bits = (qh[32h + l] >> 2t) & 3
 *            scale     = scales[8h + 2t + l / 16]
 *   INT8_ROW (per row) f32 scale | i8 q[n]                   w = q * scale
 *          (LLM.int8-style weights: scale = row absmax / 127)
 *   NF4    (64 w, 36 B)  f32 absmax | u8 codes[32]           w = NF4[c] * absmax
 *          weight 2t is the HIGH nibble of codes[t], weight 2t+1 the low one
 *          (bitsandbytes' packing).
 *
 * Quantizers exist for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, INT8_ROW and NF4 and follow the
 * usual round-to-nearest rules of ggml's and bitsandbytes' reference
 * quantizers (described at each function). Q4_K and Q6_K are dequantize-only
 * here: their quantizers are search-based and belong to GGUF tools.
 */
#include <math.h>
#include <string.h>

#include "ref_cpu.h"

/*
 * The 16 NF4 code values: bitsandbytes' normal-float table (QLoRA, Dettmers
 * et al. 2023, Appendix E; bitsandbytes functional.py get_4bit_type("nf4")),
 * as float32. shared/reference/transformers-internals.md section 4.1 lists
 * the same table to four digits.
 */
static const float nf4_code[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

/* ------------------------------------------------------------------------ */
/* Dequantization, one block                                                */
/* ------------------------------------------------------------------------ */

static void deq_q8_0(const uint8_t *b, float *y)
{
    float d = khub_pu_load_f16le(b);
    for (int l = 0; l < 32; l++) y[l] = (float)(int8_t)b[2 + l] * d;
}

static int q4_nibble(const uint8_t *qs, int l) { return l < 16 ? qs[l] & 0xf : qs[l - 16] >> 4; }

static void deq_q4_0(const uint8_t *b, float *y)
{
    float d = khub_pu_load_f16le(b);
    for (int l = 0; l < 32; l++) y[l] = (float)(q4_nibble(b + 2, l) - 8) * d;
}

static void deq_q4_1(const uint8_t *b, float *y)
{
    float d = khub_pu_load_f16le(b), m = khub_pu_load_f16le(b + 2);
    for (int l = 0; l < 32; l++) y[l] = (float)q4_nibble(b + 4, l) * d + m;
}

/* The 5-bit code of weight l from qh[4] (bit l, little-endian) and qs[16]. */
static int q5_code(const uint8_t *qh, const uint8_t *qs, int l)
{
    return q4_nibble(qs, l) | (((qh[l / 8] >> (l % 8)) & 1) << 4);
}

static void deq_q5_0(const uint8_t *b, float *y)
{
    float d = khub_pu_load_f16le(b);
    for (int l = 0; l < 32; l++) y[l] = (float)(q5_code(b + 2, b + 6, l) - 16) * d;
}

static void deq_q5_1(const uint8_t *b, float *y)
{
    float d = khub_pu_load_f16le(b), m = khub_pu_load_f16le(b + 2);
    for (int l = 0; l < 32; l++) y[l] = (float)q5_code(b + 4, b + 8, l) * d + m;
}

/* The 6-bit scale and min of Q4_K sub-block s (0..7) from scales[12]. */
static void q4k_scale_min(const uint8_t *sc12, int s, int *sc, int *mn)
{
    if (s < 4) {
        *sc = sc12[s] & 63;
        *mn = sc12[s + 4] & 63;
    } else {
        *sc = (sc12[s + 4] & 0xf) | ((sc12[s - 4] >> 6) << 4);
        *mn = (sc12[s + 4] >> 4) | ((sc12[s] >> 6) << 4);
    }
}

static void deq_q4_k(const uint8_t *b, float *y)
{
    float d = khub_pu_load_f16le(b), dmin = khub_pu_load_f16le(b + 2);
    const uint8_t *sc12 = b + 4, *qs = b + 16;
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        q4k_scale_min(sc12, s, &sc, &mn);
        float ds = d * (float)sc, dm = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = (s & 1) ? 4 : 0;
        for (int l = 0; l < 32; l++) y[32 * s + l] = ds * (float)((q[l] >> shift) & 0xf) - dm;
    }
}

static void deq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    float d = khub_pu_load_f16le(b + 208);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, t = (e % 128) / 32, l = e % 32;
        uint8_t lo_byte = ql[64 * h + 32 * (t & 1) + l];
        int lo = t >= 2 ? lo_byte >> 4 : lo_byte & 0xf;
        int hi = (qh[32 * h + l] >> (2 * t)) & 3;
        int q = (lo | (hi << 4)) - 32;
        y[e] = d * (float)scales[8 * h + 2 * t + l / 16] * (float)q;
    }
}

static void deq_nf4(const uint8_t *b, float *y)
{
    float absmax = khub_pu_load_f32(b);
    for (int t = 0; t < 32; t++) {
        y[2 * t] = nf4_code[b[4 + t] >> 4] * absmax;
        y[2 * t + 1] = nf4_code[b[4 + t] & 0xf] * absmax;
    }
}

void khub_ref__dequantize_row(khub_qformat fmt, const uint8_t *src, int64_t n, float *dst)
{
    if (fmt == KHUB_QFORMAT_INT8_ROW) {
        float scale = khub_pu_load_f32(src);
        for (int64_t k = 0; k < n; k++) dst[k] = (float)(int8_t)src[4 + k] * scale;
        return;
    }
    int64_t be = khub_qformat_block_elems(fmt), bb = khub_qformat_block_bytes(fmt);
    for (int64_t blk = 0; blk < n / be; blk++) {
        const uint8_t *b = src + blk * bb;
        float *y = dst + blk * be;
        switch (fmt) {
        case KHUB_QFORMAT_Q8_0: deq_q8_0(b, y); break;
        case KHUB_QFORMAT_Q4_0: deq_q4_0(b, y); break;
        case KHUB_QFORMAT_Q4_1: deq_q4_1(b, y); break;
        case KHUB_QFORMAT_Q5_0: deq_q5_0(b, y); break;
        case KHUB_QFORMAT_Q5_1: deq_q5_1(b, y); break;
        case KHUB_QFORMAT_Q4_K: deq_q4_k(b, y); break;
        case KHUB_QFORMAT_Q6_K: deq_q6_k(b, y); break;
        case KHUB_QFORMAT_NF4: deq_nf4(b, y); break;
        default: break; /* unreachable: formats are checked by the callers */
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Quantization, one block (inputs are finite; checked by the caller)       */
/* ------------------------------------------------------------------------ */

static float absmax_of(const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t k = 0; k < n; k++) m = fmaxf(m, fabsf(x[k]));
    return m;
}

/* Q8_0: d = absmax / 127, q = round(x / d); d is stored as f16 (the
 * quantization itself uses the unrounded d, as ggml's reference does). */
static void qnt_q8_0(const float *x, uint8_t *b)
{
    float d = absmax_of(x, 32) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    khub_pu_store_f16le(b, d);
    for (int l = 0; l < 32; l++) {
        float q = roundf(x[l] * id);
        b[2 + l] = (uint8_t)(int8_t)fminf(127.0f, fmaxf(-127.0f, q));
    }
}

/* The value of largest magnitude of a 32-block, with its sign (the first
 * one on ties), as the Q4_0 / Q5_0 scales need it. */
static float signed_max32(const float *x)
{
    float amax = 0.0f, max = 0.0f;
    for (int l = 0; l < 32; l++) {
        if (fabsf(x[l]) > amax) {
            amax = fabsf(x[l]);
            max = x[l];
        }
    }
    return max;
}

/* The smallest and largest value of a 32-block (Q4_1 / Q5_1). */
static void min_max32(const float *x, float *lo, float *hi)
{
    *lo = *hi = x[0];
    for (int l = 1; l < 32; l++) {
        *lo = fminf(*lo, x[l]);
        *hi = fmaxf(*hi, x[l]);
    }
}

/* Q4_0: the signed value of largest magnitude maps to -8, so
 * d = max / -8 and q = clamp(trunc(x / d + 8.5), 0, 15). */
static void qnt_q4_0(const float *x, uint8_t *b)
{
    float max = signed_max32(x);
    float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    khub_pu_store_f16le(b, d);
    for (int l = 0; l < 16; l++) {
        int q0 = (int)fminf(15.0f, fmaxf(0.0f, x[l] * id + 8.5f));
        int q1 = (int)fminf(15.0f, fmaxf(0.0f, x[l + 16] * id + 8.5f));
        b[2 + l] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* Q4_1: d = (max - min) / 15, m = min, q = clamp(trunc((x - min) / d + 0.5),
 * 0, 15). */
static void qnt_q4_1(const float *x, uint8_t *b)
{
    float lo, hi;
    min_max32(x, &lo, &hi);
    float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    khub_pu_store_f16le(b, d);
    khub_pu_store_f16le(b + 2, lo);
    for (int l = 0; l < 16; l++) {
        int q0 = (int)fminf(15.0f, fmaxf(0.0f, (x[l] - lo) * id + 0.5f));
        int q1 = (int)fminf(15.0f, fmaxf(0.0f, (x[l + 16] - lo) * id + 0.5f));
        b[4 + l] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* Stores 32 5-bit codes: low nibbles into qs as Q4_0 packs them, bit 4 of
 * code l into bit l of the little-endian u32 qh. */
static void put_q5_codes(const int q[32], uint8_t *qh, uint8_t *qs)
{
    memset(qh, 0, 4);
    for (int l = 0; l < 16; l++) qs[l] = (uint8_t)((q[l] & 0xf) | ((q[l + 16] & 0xf) << 4));
    for (int l = 0; l < 32; l++) qh[l / 8] |= (uint8_t)(((q[l] >> 4) & 1) << (l % 8));
}

/* Q5_0: as Q4_0 with 32 levels: d = max / -16 (max the signed value of
 * largest magnitude), q = min(trunc(x / d + 16.5), 31). */
static void qnt_q5_0(const float *x, uint8_t *b)
{
    float max = signed_max32(x);
    float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    khub_pu_store_f16le(b, d);
    for (int l = 0; l < 32; l++) q[l] = (int)fminf(31.0f, fmaxf(0.0f, x[l] * id + 16.5f));
    put_q5_codes(q, b + 2, b + 6);
}

/* Q5_1: as Q4_1 with 32 levels: d = (max - min) / 31, m = min,
 * q = min(trunc((x - min) / d + 0.5), 31). */
static void qnt_q5_1(const float *x, uint8_t *b)
{
    float lo, hi;
    min_max32(x, &lo, &hi);
    float d = (hi - lo) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[32];
    khub_pu_store_f16le(b, d);
    khub_pu_store_f16le(b + 2, lo);
    for (int l = 0; l < 32; l++) q[l] = (int)fminf(31.0f, fmaxf(0.0f, (x[l] - lo) * id + 0.5f));
    put_q5_codes(q, b + 4, b + 8);
}

/* NF4: absmax per block of 64, each weight x / absmax mapped to the nearest
 * code value (ties to the lower code). */
static int nf4_nearest(float v)
{
    int best = 0;
    float bd = fabsf(v - nf4_code[0]);
    for (int c = 1; c < 16; c++) {
        float dc = fabsf(v - nf4_code[c]);
        if (dc < bd) {
            bd = dc;
            best = c;
        }
    }
    return best;
}

static void qnt_nf4(const float *x, uint8_t *b)
{
    float amax = absmax_of(x, 64), inv = amax != 0.0f ? 1.0f / amax : 0.0f;
    khub_pu_store_f32(b, amax);
    for (int t = 0; t < 32; t++)
        b[4 + t] = (uint8_t)((nf4_nearest(x[2 * t] * inv) << 4) | nf4_nearest(x[2 * t + 1] * inv));
}

/* INT8_ROW: scale = row absmax / 127, q = clamp(round(x / scale), -127, 127). */
static void qnt_int8_row(const float *x, int64_t n, uint8_t *dst)
{
    float scale = absmax_of(x, n) / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    khub_pu_store_f32(dst, scale);
    for (int64_t k = 0; k < n; k++)
        dst[4 + k] = (uint8_t)(int8_t)fminf(127.0f, fmaxf(-127.0f, roundf(x[k] * inv)));
}

static void quantize_row(khub_qformat fmt, const float *x, int64_t n, uint8_t *dst)
{
    if (fmt == KHUB_QFORMAT_INT8_ROW) {
        qnt_int8_row(x, n, dst);
        return;
    }
    int64_t be = khub_qformat_block_elems(fmt), bb = khub_qformat_block_bytes(fmt);
    for (int64_t blk = 0; blk < n / be; blk++) {
        const float *xb = x + blk * be;
        uint8_t *b = dst + blk * bb;
        switch (fmt) {
        case KHUB_QFORMAT_Q8_0: qnt_q8_0(xb, b); break;
        case KHUB_QFORMAT_Q4_0: qnt_q4_0(xb, b); break;
        case KHUB_QFORMAT_Q4_1: qnt_q4_1(xb, b); break;
        case KHUB_QFORMAT_Q5_0: qnt_q5_0(xb, b); break;
        case KHUB_QFORMAT_Q5_1: qnt_q5_1(xb, b); break;
        case KHUB_QFORMAT_NF4: qnt_nf4(xb, b); break;
        default: break; /* unreachable: quant_check rejects the others */
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The qlinear methods                                                      */
/* ------------------------------------------------------------------------ */

typedef struct quant_job {
    const khub_quant_args *a;
    int64_t row_bytes;
    bool quantize;
} quant_job;

static void quant_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const quant_job *j = ud;
    khub_qformat fmt = (khub_qformat)j->a->format;
    int64_t n = j->a->n_cols;
    for (int64_t r = begin; r < end; r++) {
        if (j->quantize)
            quantize_row(fmt, (const float *)j->a->src + r * n, n,
                         (uint8_t *)j->a->dst + r * j->row_bytes);
        else
            khub_ref__dequantize_row(fmt, (const uint8_t *)j->a->src + r * j->row_bytes, n,
                                     (float *)j->a->dst + r * n);
    }
}

static bool quant_has_quantizer(khub_qformat f)
{
    return f == KHUB_QFORMAT_Q8_0 || f == KHUB_QFORMAT_Q4_0 || f == KHUB_QFORMAT_Q4_1 ||
           f == KHUB_QFORMAT_Q5_0 || f == KHUB_QFORMAT_Q5_1 || f == KHUB_QFORMAT_INT8_ROW ||
           f == KHUB_QFORMAT_NF4;
}

static khub_status quant_check(const khub_host_api *host, const char *op, const khub_quant_args *a,
                               quant_job *j)
{
    void *c = host->host_ctx;
    KHUB_PU_TRY(khub_pu_args_check(host, op, a, sizeof(khub_quant_args)));
    khub_qformat fmt = (khub_qformat)a->format;
    if (a->format == 0 || a->format >= KHUB_QFORMAT__COUNT)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: format (got %u, want 1..%d)", op,
                          (unsigned)a->format, KHUB_QFORMAT__COUNT - 1);
    if (j->quantize && !quant_has_quantizer(fmt))
        return host->fail(c, KHUB_STATUS_UNSUPPORTED,
                          "%s: %s has no reference quantizer (dequantize only; make %s weights "
                          "with a GGUF tool)",
                          op, khub_pu_dtype_name(KHUB_DTYPE_Q(fmt)),
                          khub_pu_dtype_name(KHUB_DTYPE_Q(fmt)));
    if (a->n_rows < 0)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: n_rows (got %lld, want >= 0)", op,
                          (long long)a->n_rows);
    j->row_bytes = khub_qformat_row_bytes(fmt, a->n_cols);
    if (j->row_bytes < 0)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: n_cols (got %lld, want a positive multiple of %s's block of %lld)",
                          op, (long long)a->n_cols, khub_pu_dtype_name(KHUB_DTYPE_Q(fmt)),
                          (long long)khub_qformat_block_elems(fmt));
    size_t packed, floats;
    if (__builtin_mul_overflow((size_t)a->n_rows, (size_t)j->row_bytes, &packed) ||
        __builtin_mul_overflow((size_t)a->n_rows, (size_t)a->n_cols * 4u, &floats) ||
        packed > (size_t)INT64_MAX || floats > (size_t)INT64_MAX)
        return host->fail(c, KHUB_STATUS_OVERFLOW,
                          "%s: %lld rows of %lld weights overflow the address space", op,
                          (long long)a->n_rows, (long long)a->n_cols);
    if (a->n_rows > 0 && (!a->src || !a->dst))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: src or dst is NULL (want buffers)", op);
    return KHUB_STATUS_OK;
}

static khub_status ref_quantize(void *state, const khub_quant_args *a)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    quant_job j = {.a = a, .quantize = true};
    KHUB_PU_TRY(quant_check(host, "qlinear.quantize", a, &j));
    /* Non-finite weights would make the integer conversions undefined. */
    const float *x = a->src;
    for (int64_t i = 0; i < a->n_rows * a->n_cols; i++) {
        if (!isfinite(x[i]))
            return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                              "qlinear.quantize: src[%lld][%lld] is %g (want finite weights)",
                              (long long)(i / a->n_cols), (long long)(i % a->n_cols), (double)x[i]);
    }
    if (a->n_rows > 0) host->parallel_for(host->host_ctx, a->n_rows, quant_range, &j);
    return KHUB_STATUS_OK;
}

static khub_status ref_dequantize(void *state, const khub_quant_args *a)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    quant_job j = {.a = a, .quantize = false};
    KHUB_PU_TRY(quant_check(host, "qlinear.dequantize", a, &j));
    if (a->n_rows > 0) host->parallel_for(host->host_ctx, a->n_rows, quant_range, &j);
    return KHUB_STATUS_OK;
}

static const khub_qlinear_methods qlinear_methods = {
    KHUB_STRUCT_INIT(khub_qlinear_methods),
    .quantize = ref_quantize,
    .dequantize = ref_dequantize,
};

static const khub_op_caps qlinear_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_0) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_1) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_K) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q6_K) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_INT8_ROW) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_NF4) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q5_0) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q5_1),
    .flags = KHUB_CAP_BIAS,
};

const khub_op_desc khub_ref__qlinear_op = {
    KHUB_STRUCT_INIT(khub_op_desc), .name = "qlinear",
    .kind = KHUB_OP_QLINEAR,        .caps = &qlinear_caps,
    .run = khub_ref__qlinear_run,   .methods = &qlinear_methods,
};
