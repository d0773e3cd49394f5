// gemv.cu: kernels-community/gemv on CUDA, compiled to PTX by NVRTC.
//
// y[i, o] = sum_k x[i, k] W[o, k] (+ bias[o]) for x [n, in] f32, W [out, in]
// in its stored format (f32, f16, or the GGUF block formats Q8_0, Q4_0, Q4_1,
// Q4_K, Q6_K bit for bit, dequantized in registers), y [n, out] f32; all
// compact. A decode-first GEMV: one warp per output row, lane l takes the
// 32-weight chunks l, l + 32, ... of the row, turns a chunk into 32 floats
// once and dots it with up to NT rows of x, then the warp sums by shuffles.
// Prefill (n > NT) runs ceil(n / NT) row tiles (grid.y), re-reading W from
// L2 for each: correct, not fast (a tensor-core GEMM is not built yet).
//
// Specialisation: the weight format is a template parameter (one kernel per
// format, its block layout and sizes compile-time constants); NT (x rows per
// pass) and WARPS (output rows per block) are compile-time constants.

#define NT    8
#define WARPS 4

enum { F_F32, F_F16, F_Q8_0, F_Q4_0, F_Q4_1, F_Q4_K, F_Q6_K };

__device__ __forceinline__ float h2f(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float ldh(const unsigned char *p) { return h2f(p[0] | (p[1] << 8)); }

// Weights per block and bytes per block of format F (dense: per 32 weights).
template <int F> struct fmt;
template <> struct fmt<F_F32> { enum { BE = 32, BB = 128 }; };
template <> struct fmt<F_F16> { enum { BE = 32, BB = 64 }; };
template <> struct fmt<F_Q8_0> { enum { BE = 32, BB = 34 }; };
template <> struct fmt<F_Q4_0> { enum { BE = 32, BB = 18 }; };
template <> struct fmt<F_Q4_1> { enum { BE = 32, BB = 20 }; };
template <> struct fmt<F_Q4_K> { enum { BE = 256, BB = 144 }; };
template <> struct fmt<F_Q6_K> { enum { BE = 256, BB = 210 }; };

// Chunk c (32 weights) of a row into w[32]; dense chunks past `in` are 0.
template <int F>
__device__ __forceinline__ void chunk(const unsigned char *row, long long c, int in, float *w)
{
    if (F == F_F32 || F == F_F16) {
        for (int l = 0; l < 32; l++) {
            long long k = c * 32 + l;
            w[l] = k >= in ? 0.0f
                 : F == F_F32 ? ((const float *)row)[k] : ldh(row + 2 * k);
        }
        return;
    }
    const long long blk = c / (fmt<F>::BE / 32);
    const int sub = (int)(c % (fmt<F>::BE / 32));
    const unsigned char *b = row + blk * fmt<F>::BB;
    if (F == F_Q8_0) {
        float d = ldh(b);
        for (int l = 0; l < 32; l++) w[l] = (float)(signed char)b[2 + l] * d;
    } else if (F == F_Q4_0 || F == F_Q4_1) {
        const unsigned char *qs = b + (F == F_Q4_0 ? 2 : 4);
        float d = ldh(b), m = F == F_Q4_1 ? ldh(b + 2) : 0.0f;
        for (int l = 0; l < 16; l++) {
            int lo = qs[l] & 0xf, hi = qs[l] >> 4;
            w[l] = F == F_Q4_0 ? (float)(lo - 8) * d : (float)lo * d + m;
            w[l + 16] = F == F_Q4_0 ? (float)(hi - 8) * d : (float)hi * d + m;
        }
    } else if (F == F_Q4_K) {
        const unsigned char *sc12 = b + 4, *q = b + 16 + 32 * (sub / 2);
        int sc, mn, s = sub;
        if (s < 4) {
            sc = sc12[s] & 63;
            mn = sc12[s + 4] & 63;
        } else {
            sc = (sc12[s + 4] & 0xf) | ((sc12[s - 4] >> 6) << 4);
            mn = (sc12[s + 4] >> 4) | ((sc12[s] >> 6) << 4);
        }
        float ds = ldh(b) * (float)sc, dm = ldh(b + 2) * (float)mn;
        int shift = (s & 1) ? 4 : 0;
        for (int l = 0; l < 32; l++) w[l] = ds * (float)((q[l] >> shift) & 0xf) - dm;
    } else { // Q6_K: sub = e / 32 of elements e = 32 sub + l
        const unsigned char *ql = b, *qh = b + 128;
        const signed char *scales = (const signed char *)(b + 192);
        float d = ldh(b + 208);
        int h = sub / 4, t = sub % 4;
        for (int l = 0; l < 32; l++) {
            unsigned char lo_byte = ql[64 * h + 32 * (t & 1) + l];
            int lo = t >= 2 ? lo_byte >> 4 : lo_byte & 0xf;
            int hi = (qh[32 * h + l] >> (2 * t)) & 3;
            w[l] = d * (float)scales[8 * h + 2 * t + l / 16] * (float)((lo | (hi << 4)) - 32);
        }
    }
}

template <int F>
__device__ void gemv(const float *x, const unsigned char *W, const float *bias, float *y, int n,
                     int in, int out, long long row_bytes)
{
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int i0 = blockIdx.y * NT;
    if (o >= out) return;
    const int nt = n - i0 < NT ? n - i0 : NT;
    const unsigned char *row = W + (long long)o * row_bytes;
    const long long chunks = (in + 31) / 32;
    float acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (long long c = lane; c < chunks; c += 32) {
        float w[32];
        chunk<F>(row, c, in, w);
        for (int t = 0; t < nt; t++) {
            const float *xr = x + (long long)(i0 + t) * in + c * 32;
            float s = 0.0f;
            for (int l = 0; l < 32; l++)
                if (c * 32 + l < in) s += w[l] * xr[l];
            acc[t] += s;
        }
    }
    for (int t = 0; t < nt; t++) {
        float v = acc[t];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (lane == 0) y[(long long)(i0 + t) * out + o] = v + (bias ? bias[o] : 0.0f);
    }
}

#define GEMV(name, F) \
    extern "C" __global__ void name(const float *x, const unsigned char *W, const float *bias, \
                                    float *y, int n, int in, int out, long long row_bytes) \
    { \
        gemv<F>(x, W, bias, y, n, in, out, row_bytes); \
    }
GEMV(khub_gemv_f32, F_F32)
GEMV(khub_gemv_f16, F_F16)
GEMV(khub_gemv_q8_0, F_Q8_0)
GEMV(khub_gemv_q4_0, F_Q4_0)
GEMV(khub_gemv_q4_1, F_Q4_1)
GEMV(khub_gemv_q4_k, F_Q4_K)
GEMV(khub_gemv_q6_k, F_Q6_K)
