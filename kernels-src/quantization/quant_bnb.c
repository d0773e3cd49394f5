/*
 * quant_bnb.c: kernels-community/quantization, bitsandbytes-style
 * weight-only formats for the CPU (the BitsAndBytesConfig equivalents):
 *
 *   INT8_ROW  per output row: f32 scale | int8 q[in]       w = q * scale
 *             (scale = row absmax / 127), like load_in_8bit's weights;
 *   NF4       per block of 64: f32 absmax | 32 bytes        w = NF4[c] * absmax
 *             (two codes per byte, the even element in the high nibble),
 *             like load_in_4bit with bnb_4bit_quant_type="nf4", blocksize 64.
 *
 * Layouts and code values equal khub/ref-cpu's (khub_tensor.h), so weights
 * quantized by either are read by both. The matmul y = x W^T dequantizes
 * each weight row once per call into f32 and reuses it for every token of
 * the batch (prefill); the AVX2 build widens int8 with vpmovsxbd and maps NF4
 * nibbles through the 16-entry table with two vpermps and a blend.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <khub/khub_plugin.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QB_SIMD 1
#else
#define QB_SIMD 0
#endif

#define MAX_IN 65536

/* bitsandbytes' NF4 code table (QLoRA, appendix E), ascending. */
static const float nf4[16] = {-1.0f,
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
                              1.0f};

/* ======================================================================== */
/* Row dequantization                                                       */
/* ======================================================================== */

static void deq_int8_row(const uint8_t *row, int64_t n, float *out)
{
    float scale;
    memcpy(&scale, row, 4);
    const int8_t *q = (const int8_t *)(row + 4);
    int64_t i = 0;
#if QB_SIMD
    __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(w), s));
    }
#endif
    for (; i < n; i++) out[i] = q[i] * scale;
}

static void deq_nf4_row(const uint8_t *row, int64_t n, float *out)
{
    for (int64_t b = 0; b < n / 64; b++, row += 36, out += 64) {
        float absmax;
        memcpy(&absmax, row, 4);
        const uint8_t *c = row + 4;
#if QB_SIMD
        const __m256 lo_tab = _mm256_loadu_ps(nf4), hi_tab = _mm256_loadu_ps(nf4 + 8);
        const __m256 am = _mm256_set1_ps(absmax);
        for (int t = 0; t < 32; t += 4) {
            /* 4 bytes -> 8 codes in element order: hi nibble first */
            int32_t codes[8];
            for (int k = 0; k < 4; k++) {
                codes[2 * k] = c[t + k] >> 4;
                codes[2 * k + 1] = c[t + k] & 15;
            }
            __m256i idx = _mm256_loadu_si256((const __m256i *)codes);
            __m256 a = _mm256_permutevar8x32_ps(lo_tab, idx);
            __m256 b2 = _mm256_permutevar8x32_ps(hi_tab, idx);
            __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)); /* bit 3 -> sign */
            _mm256_storeu_ps(out + 2 * t, _mm256_mul_ps(_mm256_blendv_ps(a, b2, hi), am));
        }
#else
        for (int t = 0; t < 32; t++) {
            out[2 * t] = nf4[c[t] >> 4] * absmax;
            out[2 * t + 1] = nf4[c[t] & 15] * absmax;
        }
#endif
    }
}

static void deq_row(uint32_t fmt, const uint8_t *row, int64_t n, float *out)
{
    if (fmt == KHUB_QFORMAT_INT8_ROW)
        deq_int8_row(row, n, out);
    else
        deq_nf4_row(row, n, out);
}

/* ======================================================================== */
/* Quantization                                                             */
/* ======================================================================== */

static void q_int8_row(const float *x, int64_t n, uint8_t *dst)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float scale = amax / 127.0f, inv = scale > 0 ? 1.0f / scale : 0.0f;
    memcpy(dst, &scale, 4);
    for (int64_t i = 0; i < n; i++) {
        float v = roundf(x[i] * inv);
        ((int8_t *)(dst + 4))[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
}

static int nf4_nearest(float v)
{
    int best = 0;
    float bd = fabsf(v - nf4[0]);
    for (int c = 1; c < 16; c++) {
        float d = fabsf(v - nf4[c]);
        if (d < bd) bd = d, best = c;
    }
    return best;
}

static void q_nf4_row(const float *x, int64_t n, uint8_t *dst)
{
    for (int64_t b = 0; b < n / 64; b++, x += 64, dst += 36) {
        float amax = 0.0f;
        for (int i = 0; i < 64; i++) amax = fmaxf(amax, fabsf(x[i]));
        float inv = amax > 0 ? 1.0f / amax : 0.0f;
        memcpy(dst, &amax, 4);
        for (int t = 0; t < 32; t++)
            dst[4 + t] =
                (uint8_t)((nf4_nearest(x[2 * t] * inv) << 4) | nf4_nearest(x[2 * t + 1] * inv));
    }
}

/* ======================================================================== */
/* Ops                                                                      */
/* ======================================================================== */

static int fmt_ok(uint32_t f) { return f == KHUB_QFORMAT_INT8_ROW || f == KHUB_QFORMAT_NF4; }

static khub_status check_quant_args(const khub_host_api *host, const khub_quant_args *a,
                                    const char *what)
{
    if (!a || a->struct_size < sizeof *a || !fmt_ok(a->format) || !a->src || !a->dst ||
        a->n_rows < 0 || a->n_cols <= 0 || a->n_cols > MAX_IN ||
        khub_qformat_row_bytes((khub_qformat)a->format, a->n_cols) < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "qlinear_bnb %s: format must be INT8_ROW or NF4 with n_cols a whole "
                          "number of blocks (<= %d)",
                          what, MAX_IN);
    return KHUB_STATUS_OK;
}

static khub_status quantize(void *state, const khub_quant_args *a)
{
    khub_status st = check_quant_args(state, a, "quantize");
    if (st != KHUB_STATUS_OK) return st;
    int64_t rb = khub_qformat_row_bytes((khub_qformat)a->format, a->n_cols);
    for (int64_t r = 0; r < a->n_rows; r++) {
        const float *x = (const float *)a->src + r * a->n_cols;
        uint8_t *d = (uint8_t *)a->dst + r * rb;
        if (a->format == KHUB_QFORMAT_INT8_ROW)
            q_int8_row(x, a->n_cols, d);
        else
            q_nf4_row(x, a->n_cols, d);
    }
    return KHUB_STATUS_OK;
}

static khub_status dequantize(void *state, const khub_quant_args *a)
{
    khub_status st = check_quant_args(state, a, "dequantize");
    if (st != KHUB_STATUS_OK) return st;
    int64_t rb = khub_qformat_row_bytes((khub_qformat)a->format, a->n_cols);
    for (int64_t r = 0; r < a->n_rows; r++)
        deq_row(a->format, (const uint8_t *)a->src + r * rb, a->n_cols,
                (float *)a->dst + r * a->n_cols);
    return KHUB_STATUS_OK;
}

static float dot(const float *a, const float *b, int64_t n)
{
#if QB_SIMD
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
#else
    float r = 0.0f;
    for (int64_t i = 0; i < n; i++) r += a[i] * b[i];
    return r;
#endif
}

typedef struct mm_job {
    const khub_host_api *host;
    uint32_t fmt;
    const uint8_t *w;
    int64_t row_bytes, n, in, out;
    const float *x, *bias;
    float *y;
    int failed;
} mm_job;

static void mm_rows(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    mm_job *j = ud;
    float *wrow = j->host->alloc(j->host->host_ctx, sizeof(float) * (size_t)j->in);
    if (!wrow) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t o = begin; o < end; o++) {
        deq_row(j->fmt, j->w + o * j->row_bytes, j->in, wrow);
        float b = j->bias ? j->bias[o] : 0.0f;
        for (int64_t t = 0; t < j->n; t++)
            j->y[t * j->out + o] = dot(wrow, j->x + t * j->in, j->in) + b;
    }
    j->host->free(j->host->host_ctx, wrow);
}

static khub_status qlinear(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_linear_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->x || !a->weight || !a->y || a->x->ndim != 2 ||
        a->weight->ndim != 2 || a->y->ndim != 2 || a->weight->dtype.code != KHUB_DL_BLOCKQ ||
        !fmt_ok(a->weight->dtype.bits) || a->x->dtype.bits != 32 || a->x->strides || a->y->strides)
        return host->fail(
            host->host_ctx, KHUB_STATUS_INVALID_ARG,
            "qlinear_bnb: needs f32 x [n, in], INT8_ROW or NF4 weight [out, in], f32 y");
    int64_t n = a->x->shape[0], in = a->x->shape[1], out = a->weight->shape[0];
    int64_t rb = khub_qformat_row_bytes((khub_qformat)a->weight->dtype.bits, in);
    if (a->weight->shape[1] != in || a->y->shape[0] != n || a->y->shape[1] != out || rb < 0 ||
        in > MAX_IN || (a->bias && (a->bias->ndim != 1 || a->bias->shape[0] != out)))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "qlinear_bnb: shapes x [%lld, %lld], weight [%lld, %lld], y [%lld, %lld] "
                          "do not match",
                          (long long)n, (long long)in, (long long)out,
                          (long long)a->weight->shape[1], (long long)a->y->shape[0],
                          (long long)a->y->shape[1]);
    mm_job j = {host,
                a->weight->dtype.bits,
                (const uint8_t *)a->weight->data + a->weight->byte_offset,
                rb,
                n,
                in,
                out,
                (const float *)((const char *)a->x->data + a->x->byte_offset),
                a->bias ? (const float *)((const char *)a->bias->data + a->bias->byte_offset)
                        : NULL,
                (float *)((char *)a->y->data + a->y->byte_offset),
                0};
    host->parallel_for(host->host_ctx, out, mm_rows, &j);
    if (j.failed)
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM, "qlinear_bnb: out of memory");
    return KHUB_STATUS_OK;
}

static const khub_qlinear_methods methods = {KHUB_STRUCT_INIT(khub_qlinear_methods),
                                             .quantize = quantize, .dequantize = dequantize};

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
#if QB_SIMD
    .cpu_features = KHUB_CPU_AVX2 | KHUB_CPU_FMA,
    .priority = 40,
#else
    .priority = 15,
#endif
    .dtypes = KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_INT8_ROW) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_NF4),
    .flags = KHUB_CAP_BIAS,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "qlinear_bnb", .kind = KHUB_OP_QLINEAR, .caps = &caps,
     .run = qlinear, .methods = &methods},
};

khub_status khub_quant_bnb_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                                size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/quantization",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = (void *)host};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_quant_bnb_init, "kernels-community/quantization", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_QLINEAR))
