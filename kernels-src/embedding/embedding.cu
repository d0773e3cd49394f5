// embedding.cu: kernels-community/embedding on CUDA, compiled to PTX by NVRTC.
//
// y[i, k] = value(table, ids[i], k) * scale for i < n, k < hidden: one block
// per token, its threads striding over the row. The table is [vocab,
// hidden] in its stored format: f32, f16, bf16, or GGUF blocks (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q6_K) decoded in registers. y rows are
// y_stride floats apart (values contiguous).
//
// Bit for bit khub/ref-cpu (plugins/ref-cpu/quant.c, embedding.c): every
// product and sum is rounded on its own (__fmul_rn, __fadd_rn, __fsub_rn),
// so the compiler cannot contract a*b+c into one fma that the CPU
// reference does not do; the scale is one more rounded multiply, skipped
// when it is 0 or 1. An id outside [0, vocab) never reads the table: its
// row is NaN (the host checks ids before it uploads them; a kernel has no
// status to return).
//
// Specialisation: the table format is a template parameter (one kernel per
// format; block sizes and layouts are compile-time constants).

enum { F_F32, F_F16, F_BF16, F_Q8_0, F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q4_K, F_Q6_K };

__device__ __forceinline__ float h2f(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short ld16(const unsigned char *p)
{
    return (unsigned short)(p[0] | (p[1] << 8));
}

__device__ __forceinline__ float ldh(const unsigned char *p) { return h2f(ld16(p)); }

// Weight l (0..31) of a 16-byte nibble array: low nibbles first, then high.
__device__ __forceinline__ int nib(const unsigned char *qs, int l)
{
    return l < 16 ? qs[l] & 0xf : qs[l - 16] >> 4;
}

// The 5-bit code of weight l from qh[4] (bit l) and qs[16].
__device__ __forceinline__ int q5(const unsigned char *qh, const unsigned char *qs, int l)
{
    return nib(qs, l) | (((qh[l / 8] >> (l % 8)) & 1) << 4);
}

// Value k of a row, as khub_ref__dequantize_row computes it.
template <int F> __device__ __forceinline__ float value(const unsigned char *row, int k)
{
    if (F == F_F32) return ((const float *)row)[k];
    if (F == F_F16) return ldh(row + 2 * k);
    if (F == F_BF16) return __uint_as_float((unsigned)ld16(row + 2 * k) << 16);
    const int l = k % 32;
    if (F == F_Q8_0) {
        const unsigned char *b = row + (k / 32) * 34;
        return __fmul_rn((float)(signed char)b[2 + l], ldh(b));
    }
    if (F == F_Q4_0) {
        const unsigned char *b = row + (k / 32) * 18;
        return __fmul_rn((float)(nib(b + 2, l) - 8), ldh(b));
    }
    if (F == F_Q4_1) {
        const unsigned char *b = row + (k / 32) * 20;
        return __fadd_rn(__fmul_rn((float)nib(b + 4, l), ldh(b)), ldh(b + 2));
    }
    if (F == F_Q5_0) {
        const unsigned char *b = row + (k / 32) * 22;
        return __fmul_rn((float)(q5(b + 2, b + 6, l) - 16), ldh(b));
    }
    if (F == F_Q5_1) {
        const unsigned char *b = row + (k / 32) * 24;
        return __fadd_rn(__fmul_rn((float)q5(b + 4, b + 8, l), ldh(b)), ldh(b + 2));
    }
    const int e = k % 256;
    if (F == F_Q4_K) {
        const unsigned char *b = row + (k / 256) * 144, *sc12 = b + 4;
        const int s = e / 32;
        int sc, mn;
        if (s < 4) {
            sc = sc12[s] & 63;
            mn = sc12[s + 4] & 63;
        } else {
            sc = (sc12[s + 4] & 0xf) | ((sc12[s - 4] >> 6) << 4);
            mn = (sc12[s + 4] >> 4) | ((sc12[s] >> 6) << 4);
        }
        const float ds = __fmul_rn(ldh(b), (float)sc), dm = __fmul_rn(ldh(b + 2), (float)mn);
        const unsigned char *q = b + 16 + 32 * (s / 2);
        return __fsub_rn(__fmul_rn(ds, (float)((q[l] >> ((s & 1) ? 4 : 0)) & 0xf)), dm);
    }
    // Q6_K
    const unsigned char *b = row + (k / 256) * 210, *ql = b, *qh = b + 128;
    const signed char *scales = (const signed char *)(b + 192);
    const int h = e / 128, t = (e % 128) / 32;
    const unsigned char lo_byte = ql[64 * h + 32 * (t & 1) + l];
    const int lo = t >= 2 ? lo_byte >> 4 : lo_byte & 0xf;
    const int hi = (qh[32 * h + l] >> (2 * t)) & 3;
    return __fmul_rn(__fmul_rn(ldh(b + 208), (float)scales[8 * h + 2 * t + l / 16]),
                     (float)((lo | (hi << 4)) - 32));
}

template <int F>
__device__ void embed(const unsigned char *table, const int *ids, float *y, int hidden,
                      long long vocab, long long row_bytes, long long y_stride, float scale)
{
    const long long i = blockIdx.x;
    const int id = ids[i];
    float *dst = y + i * y_stride;
    if (id < 0 || id >= vocab) {
        for (int k = threadIdx.x; k < hidden; k += blockDim.x) dst[k] = __int_as_float(0x7fc00000);
        return;
    }
    const unsigned char *row = table + (long long)id * row_bytes;
    const bool scaled = scale != 0.0f && scale != 1.0f;
    for (int k = threadIdx.x; k < hidden; k += blockDim.x) {
        const float v = value<F>(row, k);
        dst[k] = scaled ? __fmul_rn(v, scale) : v;
    }
}

#define EMBED(name, F) \
    extern "C" __global__ void name(const unsigned char *table, const int *ids, float *y, \
                                    int hidden, long long vocab, long long row_bytes, \
                                    long long y_stride, float scale) \
    { \
        embed<F>(table, ids, y, hidden, vocab, row_bytes, y_stride, scale); \
    }
EMBED(khub_embed_f32, F_F32)
EMBED(khub_embed_f16, F_F16)
EMBED(khub_embed_bf16, F_BF16)
EMBED(khub_embed_q8_0, F_Q8_0)
EMBED(khub_embed_q4_0, F_Q4_0)
EMBED(khub_embed_q4_1, F_Q4_1)
EMBED(khub_embed_q5_0, F_Q5_0)
EMBED(khub_embed_q5_1, F_Q5_1)
EMBED(khub_embed_q4_k, F_Q4_K)
EMBED(khub_embed_q6_k, F_Q6_K)
