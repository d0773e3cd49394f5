/*
 * ref_oracle.h: naive double-precision math that plugin tests compare
 * against, plus GGUF/bnb dequantizers in their published loop order.
 *
 * Everything takes compact row-major f32 arrays and writes doubles, so a test
 * reads: make inputs with oracle_fill, run the op, run the oracle, then
 * ASSERT_LE(oracle_nmse(got, want, n), tol). The formulas are written
 * independently of plugins/ref-cpu (loop orders and case splits differ on
 * purpose) so the two check each other.
 *
 * Header-only (static inline); any tests/test_*.c may include it.
 */
#ifndef KHUB_TESTS_REF_ORACLE_H
#define KHUB_TESTS_REF_ORACLE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Random inputs (splitmix64; fixed seeds give the same data everywhere)    */
/* ------------------------------------------------------------------------ */

typedef struct oracle_rng {
    uint64_t s;
} oracle_rng;

static inline uint64_t oracle_next(oracle_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline float oracle_uniform(oracle_rng *r, float lo, float hi)
{
    double u = (double)(oracle_next(r) >> 11) * 0x1p-53;
    return (float)(lo + (hi - lo) * u);
}

static inline void oracle_fill(oracle_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) x[i] = oracle_uniform(r, lo, hi);
}

/* ------------------------------------------------------------------------ */
/* Error measures                                                           */
/* ------------------------------------------------------------------------ */

/* Normalised mean squared error sum (got - want)^2 / sum want^2 (the
 * denominator floored at 1e-30, so an all-zero want still compares). */
static inline double oracle_nmse(const float *got, const double *want, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

static inline double oracle_nmse_ff(const float *got, const float *want, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

/* ------------------------------------------------------------------------ */
/* Ops                                                                      */
/* ------------------------------------------------------------------------ */

/* out[n_q][H][D] = attention over q[n_q][H][D], k/v[n_kv][Hkv][D],
 * mask[n_q][n_kv] (or NULL); see khub_attention_args. A query with no
 * visible key gets zeros. Uses two passes over a score row of n_kv doubles
 * in `scratch` (caller provides n_kv doubles). */
static inline void oracle_attention(const float *q, const float *k, const float *v,
                                    const float *mask, int64_t n_q, int64_t n_kv, int64_t H,
                                    int64_t Hkv, int64_t D, double scale, int causal,
                                    int64_t q_pos0, int64_t window, double *scratch, double *out)
{
    int64_t group = H / Hkv;
    for (int64_t i = 0; i < n_q; i++) {
        for (int64_t h = 0; h < H; h++) {
            int64_t g = h / group, qp = q_pos0 + i;
            double m = -INFINITY;
            for (int64_t j = 0; j < n_kv; j++) {
                int ok = (!causal || j <= qp) && (window <= 0 || j > qp - window);
                double s = -INFINITY;
                if (ok) {
                    s = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        s += (double)q[(i * H + h) * D + d] * (double)k[(j * Hkv + g) * D + d];
                    s = s * scale + (mask ? (double)mask[i * n_kv + j] : 0.0);
                }
                scratch[j] = s;
                if (s > m) m = s;
            }
            double z = 0.0;
            for (int64_t j = 0; j < n_kv; j++) {
                scratch[j] = m == -INFINITY ? 0.0 : exp(scratch[j] - m);
                z += scratch[j];
            }
            for (int64_t d = 0; d < D; d++) {
                double acc = 0.0;
                for (int64_t j = 0; j < n_kv; j++)
                    acc += scratch[j] * (double)v[(j * Hkv + g) * D + d];
                out[(i * H + h) * D + d] = z > 0.0 ? acc / z : 0.0;
            }
        }
    }
}

/* y[n][out] = x[n][in] w[out][in]^T + bias[out] (bias may be NULL). */
static inline void oracle_linear(const float *x, const float *w, const float *bias, int64_t n,
                                 int64_t in, int64_t out, double *y)
{
    for (int64_t i = 0; i < n; i++) {
        for (int64_t o = 0; o < out; o++) {
            double acc = bias ? (double)bias[o] : 0.0;
            for (int64_t k = 0; k < in; k++) acc += (double)x[i * in + k] * (double)w[o * in + k];
            y[i * out + o] = acc;
        }
    }
}

/* RMS (layer = 0) or layer norm (layer = 1) of r = x (+ res) per row,
 * times w; res_out (may be NULL) receives r rounded to f32 as the op
 * writes it back. */
static inline void oracle_norm(const float *x, const float *res, const float *w, int64_t n,
                               int64_t dim, double eps, int layer, double *y, float *res_out)
{
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + i * dim;
        double mean = 0.0, var = 0.0;
        for (int64_t k = 0; k < dim; k++) {
            float r = res ? xr[k] + res[i * dim + k] : xr[k];
            if (res_out) res_out[i * dim + k] = r;
            mean += r;
        }
        mean /= (double)dim;
        for (int64_t k = 0; k < dim; k++) {
            float r = res ? xr[k] + res[i * dim + k] : xr[k];
            double c = layer ? r - mean : r;
            var += c * c;
        }
        double rs = sqrt(var / (double)dim + eps);
        for (int64_t k = 0; k < dim; k++) {
            float r = res ? xr[k] + res[i * dim + k] : xr[k];
            y[i * dim + k] = ((layer ? r - mean : r) / rs) * (double)w[k];
        }
    }
}

/* y = act(gate) * up; gelu = 0 for SiLU, 1 for tanh-GELU. */
static inline void oracle_act(const float *gate, const float *up, size_t n, int gelu, double *y)
{
    for (size_t i = 0; i < n; i++) {
        double g = gate[i], a;
        if (gelu)
            a = 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * pow(g, 3.0))));
        else
            a = g * (1.0 / (1.0 + exp(-g)));
        y[i] = a * (double)up[i];
    }
}

/* Inverse frequency j of rd/2 with Transformers' rope scaling written the
 * way its llama3 init function reads (a chain of where()s). scaling: 0 none,
 * 1 linear, 2 llama3. */
static inline double oracle_inv_freq(int64_t j, int64_t rd, double theta, int scaling,
                                     double factor, double lo_ff, double hi_ff, double omp)
{
    double inv = 1.0 / pow(theta, (double)(2 * j) / (double)rd);
    if (scaling == 1) return inv / factor;
    if (scaling != 2) return inv;
    double low_wl = omp / lo_ff, high_wl = omp / hi_ff, wl = 2.0 * M_PI / inv;
    double llama = wl > low_wl ? inv / factor : inv;
    double smooth = (omp / wl - lo_ff) / (hi_ff - lo_ff);
    double smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
    int medium = !(wl < high_wl) && !(wl > low_wl);
    return medium ? smoothed : llama;
}

/* Rotary embedding of x[n][H][D] (not in place: y gets the result).
 * neox = 1 rotates halves, 0 adjacent pairs; rd = rotated dims. Written as
 * a complex multiplication (a + ib) e^{i angle}. */
static inline void oracle_rotary(const float *x, const int32_t *pos, int64_t n, int64_t H,
                                 int64_t D, int neox, int64_t rd, double theta, int scaling,
                                 double factor, double lo_ff, double hi_ff, double omp, double *y)
{
    for (int64_t i = 0; i < n * H * D; i++) y[i] = x[i];
    for (int64_t t = 0; t < n; t++) {
        for (int64_t h = 0; h < H; h++) {
            const float *xv = x + (t * H + h) * D;
            double *yv = y + (t * H + h) * D;
            for (int64_t j = 0; j < rd / 2; j++) {
                double ang = (double)pos[t] *
                             oracle_inv_freq(j, rd, theta, scaling, factor, lo_ff, hi_ff, omp);
                int64_t ia = neox ? j : 2 * j, ib = neox ? j + rd / 2 : 2 * j + 1;
                double re = xv[ia], im = xv[ib], c = cos(ang), s = sin(ang);
                yv[ia] = re * c - im * s;
                yv[ib] = re * s + im * c;
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Dequantizers in the published loop order (for bit-exact comparison;      */
/* float arithmetic in the same order as ggml / bitsandbytes)               */
/* ------------------------------------------------------------------------ */

static inline float oracle_f16(const uint8_t *p)
{
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

/* Q4_K: 4 chunks of 64; scale/min pairs j = 2c and 2c+1. */
static inline void oracle_deq_q4_k(const uint8_t *b, float *y)
{
    float d = oracle_f16(b), dmin = oracle_f16(b + 2);
    const uint8_t *s = b + 4, *q = b + 16;
    for (int c = 0; c < 4; c++) {
        int sc[2], mn[2];
        for (int u = 0; u < 2; u++) {
            int j = 2 * c + u;
            if (j < 4) {
                sc[u] = s[j] & 63;
                mn[u] = s[j + 4] & 63;
            } else {
                sc[u] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                mn[u] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            }
        }
        float d1 = d * sc[0], m1 = dmin * mn[0], d2 = d * sc[1], m2 = dmin * mn[1];
        for (int l = 0; l < 32; l++) y[64 * c + l] = d1 * (q[32 * c + l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) y[64 * c + 32 + l] = d2 * (q[32 * c + l] >> 4) - m2;
    }
}

/* Q6_K: 2 halves of 128; per lane l, four weights l, l+32, l+64, l+96. */
static inline void oracle_deq_q6_k(const uint8_t *b, float *y)
{
    float d = oracle_f16(b + 208);
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * half);
        float *yy = y + 128 * half;
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            yy[l] = d * sc[is + 0] * q1;
            yy[l + 32] = d * sc[is + 2] * q2;
            yy[l + 64] = d * sc[is + 4] * q3;
            yy[l + 96] = d * sc[is + 6] * q4;
        }
    }
}

static inline void oracle_deq_q8_0(const uint8_t *b, float *y)
{
    float d = oracle_f16(b);
    for (int j = 0; j < 32; j++) y[j] = (int8_t)b[2 + j] * d;
}

/* Q4_0 (m = NULL offset -8) and Q4_1 share the nibble order. */
static inline void oracle_deq_q4_0(const uint8_t *b, float *y)
{
    float d = oracle_f16(b);
    for (int j = 0; j < 16; j++) {
        y[j] = ((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = ((b[2 + j] >> 4) - 8) * d;
    }
}

static inline void oracle_deq_q4_1(const uint8_t *b, float *y)
{
    float d = oracle_f16(b), m = oracle_f16(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (b[4 + j] & 0xF) * d + m;
        y[j + 16] = (b[4 + j] >> 4) * d + m;
    }
}

/* Q5_0 / Q5_1: qh read as one little-endian u32; weight j (j < 16) takes
 * bit j as its bit 4, weight j + 16 bit j + 16 (ggml's dequantize_row_q5_x
 * order: both halves of qs[j] at once). */
static inline uint32_t oracle_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void oracle_deq_q5_0(const uint8_t *b, float *y)
{
    float d = oracle_f16(b);
    uint32_t qh = oracle_u32le(b + 2);
    for (int j = 0; j < 16; j++) {
        int hi0 = (int)((qh >> j) & 1u) << 4, hi1 = (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = (((b[6 + j] & 0xF) | hi0) - 16) * d;
        y[j + 16] = (((b[6 + j] >> 4) | hi1) - 16) * d;
    }
}

static inline void oracle_deq_q5_1(const uint8_t *b, float *y)
{
    float d = oracle_f16(b), m = oracle_f16(b + 2);
    uint32_t qh = oracle_u32le(b + 4);
    for (int j = 0; j < 16; j++) {
        int hi0 = (int)((qh >> j) & 1u) << 4, hi1 = (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = ((b[8 + j] & 0xF) | hi0) * d + m;
        y[j + 16] = ((b[8 + j] >> 4) | hi1) * d + m;
    }
}

/* bitsandbytes' NF4 table (float32 values of functional.py's nf4 code). */
static const float oracle_nf4_code[16] = {-1.0f,
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

/* NF4 block of 64: f32 absmax, then codes, even weight in the high nibble. */
static inline void oracle_deq_nf4(const uint8_t *b, float *y)
{
    float absmax;
    memcpy(&absmax, b, 4);
    for (int i = 0; i < 64; i++) {
        int c = (i % 2 == 0) ? b[4 + i / 2] >> 4 : b[4 + i / 2] & 0xF;
        y[i] = oracle_nf4_code[c] * absmax;
    }
}

#endif /* KHUB_TESTS_REF_ORACLE_H */
