// gemv.cu: kernels-community/gemv on CUDA, compiled to PTX by NVRTC: the
// linear layers y = x W^T (+ bias), a GEMV for decode and a tensor-core GEMM
// (mma.sync) for prefill.
//
// x [n, in] f32 with rows sx floats apart, y [n, out] f32 with rows sy floats
// apart (both with unit inner stride; the glue adds any byte offset), bias
// [out] f32 or NULL, W [out, in] compact in its stored format: f32, f16, bf16,
// or the blocks Q8_0, Q4_0, Q4_1, Q4_K, Q6_K (GGUF layouts bit for bit) and
// NF4 (64 weights: f32 absmax | 32 bytes of codes, weight 2t in the HIGH
// nibble of byte t, as khub/ref-cpu and bitsandbytes pack them).
//
// Weights are decoded 16 at a time ("pieces": elements 16p .. 16p + 15 of a
// row), in registers, by piece<F>(); both kernels use it, so they decode the
// same numbers as ref-cpu (the same f32 expressions).
//
// GEMV (khub_gemv_*): one warp per output row, lane l takes pieces l, l + 32,
// ... of the row and dots each with up to NT rows of x; the warp sums by
// shuffles. More than NT rows run ceil(n / NT) row tiles (grid.y). Exact f32
// arithmetic: only the summation order differs from ref-cpu.
//
// GEMM (khub_gemm_*): a BM x BN tile of y per block of 4 warps (2 x 2, each
// 32 x 32 = 2 x 4 mma tiles of 16 x 8), K in steps of BK = 32 through double
// buffered shared memory: x converted to f16 (to bf16 for bf16 weights) as it
// is staged, W copied (f16/bf16) or decoded by piece<F>() and converted to
// f16; mma.sync m16n8k16 (f16, bf16; sm_80+) or two m16n8k8 (f16 on sm_75)
// with f32 accumulation. What that costs: each x (and each decoded weight)
// is rounded to f16 (11-bit significand, relative error <= 2^-11) or to bf16
// (8 bits, <= 2^-8) before the products; f16 staging saturates |v| > 65504 to
// +-65504 (NaN stays NaN). Sums are f32. Rows past n, columns past out and
// (dense formats) K past in are zero-filled / not written.
//
// Specialisation: the weight format is a template parameter (one kernel per
// format and path: block layout and sizes are compile-time constants); NT,
// WARPS, BM, BN, BK and the warp layout are compile-time constants. bf16
// GEMM needs sm_80: the sm_75 PTX has no khub_gemm_bf16 (the glue runs bf16
// there through the GEMV).

#define NT    8  // GEMV: x rows per pass
#define WARPS 4  // GEMV: output rows (warps) per block
#define BM    64 // GEMM: x rows per block tile
#define BN    64 // GEMM: output columns per block tile
#define BK    32 // GEMM: K per step
#define SK    40 // GEMM: shared row stride in 16-bit elements (BK + 8: conflict-free)

enum { F_F32, F_F16, F_BF16, F_Q8_0, F_Q4_0, F_Q4_1, F_Q4_K, F_Q6_K, F_NF4 };

// bitsandbytes' NF4 code values (QLoRA appendix E), ref-cpu's table.
__constant__ float NF4[16] = {-1.0f,
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

__device__ __forceinline__ float h2f(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Block scales are read byte by byte: blocks of 18, 20, 34, 210 bytes are
// not aligned for wider loads.
__device__ __forceinline__ float ldh(const unsigned char *p) { return h2f(p[0] | (p[1] << 8)); }

__device__ __forceinline__ float ldf(const unsigned char *p)
{
    return __int_as_float(p[0] | (p[1] << 8) | (p[2] << 16) | (p[3] << 24));
}

// Weights per block and bytes per block of format F (dense: per 16 weights).
template <int F> struct fmt;
template <> struct fmt<F_F32> { enum { BE = 16, BB = 64 }; };
template <> struct fmt<F_F16> { enum { BE = 16, BB = 32 }; };
template <> struct fmt<F_BF16> { enum { BE = 16, BB = 32 }; };
template <> struct fmt<F_Q8_0> { enum { BE = 32, BB = 34 }; };
template <> struct fmt<F_Q4_0> { enum { BE = 32, BB = 18 }; };
template <> struct fmt<F_Q4_1> { enum { BE = 32, BB = 20 }; };
template <> struct fmt<F_Q4_K> { enum { BE = 256, BB = 144 }; };
template <> struct fmt<F_Q6_K> { enum { BE = 256, BB = 210 }; };
template <> struct fmt<F_NF4> { enum { BE = 64, BB = 36 }; };

// Piece p (elements 16p .. 16p + 15) of a W row into w[16]. Dense elements
// past `in` are 0; block formats come in whole blocks (the glue checks).
// nf4: the NF4 table in shared memory (NF4 only).
template <int F>
__device__ __forceinline__ void piece(const unsigned char *row, long long p, int in,
                                      const float *nf4, float *w)
{
    if (F == F_F32 || F == F_F16 || F == F_BF16) {
#pragma unroll
        for (int l = 0; l < 16; l++) {
            long long k = p * 16 + l;
            unsigned short h = F == F_F32 || k >= in ? 0 : ((const unsigned short *)row)[k];
            w[l] = k >= in        ? 0.0f
                 : F == F_F32     ? ((const float *)row)[k]
                 : F == F_F16     ? h2f(h)
                                  : __int_as_float((unsigned)h << 16);
        }
        return;
    }
    const int per = fmt<F>::BE / 16; // pieces per block
    const long long blk = p / per;
    const int s = (int)(p % per);
    const unsigned char *b = row + blk * fmt<F>::BB;
    if (F == F_Q8_0) {
        float d = ldh(b);
#pragma unroll
        for (int l = 0; l < 16; l++) w[l] = (float)(signed char)b[2 + 16 * s + l] * d;
    } else if (F == F_Q4_0 || F == F_Q4_1) {
        // elements 0-15 are the low nibbles of qs[0..15], 16-31 the high ones
        const unsigned char *qs = b + (F == F_Q4_0 ? 2 : 4);
        float d = ldh(b), m = F == F_Q4_1 ? ldh(b + 2) : 0.0f;
#pragma unroll
        for (int l = 0; l < 16; l++) {
            int q = s ? qs[l] >> 4 : qs[l] & 0xf;
            w[l] = F == F_Q4_0 ? (float)(q - 8) * d : (float)q * d + m;
        }
    } else if (F == F_Q4_K) {
        // sub-block sub (32 weights) of 8: 6-bit scale and min, 4-bit codes
        const int sub = s / 2;
        const unsigned char *sc12 = b + 4, *q = b + 16 + 32 * (sub / 2) + 16 * (s % 2);
        int sc, mn;
        if (sub < 4) {
            sc = sc12[sub] & 63;
            mn = sc12[sub + 4] & 63;
        } else {
            sc = (sc12[sub + 4] & 0xf) | ((sc12[sub - 4] >> 6) << 4);
            mn = (sc12[sub + 4] >> 4) | ((sc12[sub] >> 6) << 4);
        }
        float ds = ldh(b) * (float)sc, dm = ldh(b + 2) * (float)mn;
        const int shift = (sub & 1) ? 4 : 0;
#pragma unroll
        for (int l = 0; l < 16; l++) w[l] = ds * (float)((q[l] >> shift) & 0xf) - dm;
    } else if (F == F_Q6_K) {
        // element e = 16 s + l: half h = e / 128, quarter t = (e % 128) / 32,
        // lane e % 32 = 16 (s % 2) + l; one scale per 16 weights
        const unsigned char *ql = b, *qh = b + 128;
        const int h = s / 8, t = (s % 8) / 2, l0 = 16 * (s % 2);
        const float d = ldh(b + 208), sc = (float)(signed char)b[192 + 8 * h + 2 * t + (s % 2)];
#pragma unroll
        for (int l = 0; l < 16; l++) {
            unsigned char lo_byte = ql[64 * h + 32 * (t & 1) + l0 + l];
            int lo = t >= 2 ? lo_byte >> 4 : lo_byte & 0xf;
            int hi = (qh[32 * h + l0 + l] >> (2 * t)) & 3;
            w[l] = d * sc * (float)((lo | (hi << 4)) - 32);
        }
    } else { // NF4: bytes 8s .. 8s + 7 of the codes, the high nibble first
        const float amax = ldf(b);
        const unsigned char *c = b + 4 + 8 * s;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            w[2 * j] = nf4[c[j] >> 4] * amax;
            w[2 * j + 1] = nf4[c[j] & 0xf] * amax;
        }
    }
}

// ======================================================================== //
// GEMV                                                                     //
// ======================================================================== //

template <int F>
__device__ void gemv(const float *x, const unsigned char *W, const float *bias, float *y, int n,
                     int in, int out, long long row_bytes, long long sx, long long sy)
{
    __shared__ float nf4[16];
    if (F == F_NF4) {
        if (threadIdx.x < 16) nf4[threadIdx.x] = NF4[threadIdx.x];
        __syncthreads(); // before any warp leaves
    }
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int i0 = blockIdx.y * NT;
    if (o >= out) return;
    const int nt = n - i0 < NT ? n - i0 : NT;
    const unsigned char *row = W + (long long)o * row_bytes;
    const long long pieces = (in + 15) / 16;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (long long p = lane; p < pieces; p += 32) {
        float w[16];
        piece<F>(row, p, in, nf4, w);
        const int len = in - p * 16 < 16 ? (int)(in - p * 16) : 16;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            const float *xr = x + (long long)(i0 + t) * sx + p * 16;
            float s = 0.0f;
            if (len == 16) {
#pragma unroll
                for (int l = 0; l < 16; l++) s += w[l] * xr[l];
            } else {
                for (int l = 0; l < len; l++) s += w[l] * xr[l];
            }
            acc[t] += s;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        float v = acc[t];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (lane == 0) y[(long long)(i0 + t) * sy + o] = v + (bias ? bias[o] : 0.0f);
    }
}

#define GEMV(name, F) \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) \
        name(const float *x, const unsigned char *W, const float *bias, float *y, int n, int in, \
             int out, long long row_bytes, long long sx, long long sy) \
    { \
        gemv<F>(x, W, bias, y, n, in, out, row_bytes, sx, sy); \
    }
GEMV(khub_gemv_f32, F_F32)
GEMV(khub_gemv_f16, F_F16)
GEMV(khub_gemv_bf16, F_BF16)
GEMV(khub_gemv_q8_0, F_Q8_0)
GEMV(khub_gemv_q4_0, F_Q4_0)
GEMV(khub_gemv_q4_1, F_Q4_1)
GEMV(khub_gemv_q4_k, F_Q4_K)
GEMV(khub_gemv_q6_k, F_Q6_K)
GEMV(khub_gemv_nf4, F_NF4)

// ======================================================================== //
// GEMM                                                                     //
// ======================================================================== //

// f32 to the 16-bit staging type: f16 (saturating at +-65504, NaN kept) or
// bf16, round to nearest even.
template <bool BF>
__device__ __forceinline__ unsigned short to16(float v)
{
    unsigned short h;
    if (BF) {
#if __CUDA_ARCH__ >= 800
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
#else
        h = 0; // unreachable: no bf16 kernel below sm_80
#endif
    } else {
        v = fabsf(v) > 65504.0f ? copysignf(65504.0f, v) : v;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    }
    return h;
}

// d += a b for one 16 x 8 tile: a the 16 x 16 A fragment (4 registers of
// two 16-bit values), b the 16 x 8 B fragment (2 registers), f32 d.
template <bool BF>
__device__ __forceinline__ void mma(float *d, const unsigned *a, const unsigned *b)
{
#if __CUDA_ARCH__ >= 800
    if (BF)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    // sm_75: k16 as two k8 steps; registers 0-1 of a (b: 0) hold k 0-7,
    // 2-3 (b: 1) hold k 8-15, in the same row/column order
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b[0]));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#endif
}

// Two 16-bit values at element e of a shared row (e even) as one register.
__device__ __forceinline__ unsigned ld2(const unsigned short *s, int e)
{
    return *(const unsigned *)(s + e);
}

// Stages K step k0: x rows m0.. (thread: rows warp + 4i, column lane) into
// sa, W rows o0.. (thread: row tid / 2, piece tid % 2) into sb.
template <int F>
__device__ __forceinline__ void stage(const float *x, const unsigned char *W, int n, int in,
                                      int out, long long row_bytes, long long sx, int m0, int o0,
                                      int k0, bool vec, const float *nf4, unsigned short *sa,
                                      unsigned short *sb)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int k = k0 + lane;
    float xv[BM / 4]; // every load issued before the first use
#pragma unroll
    for (int i = 0; i < BM / 4; i++) {
        const int r = warp + 4 * i;
        xv[i] = m0 + r < n && k < in ? x[(long long)(m0 + r) * sx + k] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < BM / 4; i++) sa[(warp + 4 * i) * SK + lane] = to16<F == F_BF16>(xv[i]);
    const int r = tid >> 1, h = tid & 1;
    unsigned v[8];
    const long long p = k0 / 16 + h;
    if (o0 + r >= out) {
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = 0;
    } else if (F == F_F16 || F == F_BF16) { // the stored bits, as they are
        const unsigned char *row = W + (long long)(o0 + r) * row_bytes;
        if (vec && p * 16 + 16 <= in) {
            const uint4 *q = (const uint4 *)(row + p * 32);
            uint4 a = q[0], b = q[1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
            v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
            const unsigned short *e = (const unsigned short *)row;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                long long k0e = p * 16 + 2 * j;
                unsigned lo = k0e < in ? e[k0e] : 0, hi = k0e + 1 < in ? e[k0e + 1] : 0;
                v[j] = lo | (hi << 16);
            }
        }
    } else {
        float w[16];
        piece<F>(W + (long long)(o0 + r) * row_bytes, p, in, nf4, w);
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = (unsigned)to16<false>(w[2 * j]) | ((unsigned)to16<false>(w[2 * j + 1]) << 16);
    }
    uint4 *d = (uint4 *)(sb + r * SK + 16 * h); // 16-byte aligned: SK * 2 = 80
    d[0] = make_uint4(v[0], v[1], v[2], v[3]);
    d[1] = make_uint4(v[4], v[5], v[6], v[7]);
}

template <int F>
__device__ void gemm(const float *x, const unsigned char *W, const float *bias, float *y, int n,
                     int in, int out, long long row_bytes, long long sx, long long sy)
{
    constexpr bool BF = F == F_BF16;
    __shared__ __align__(16) unsigned short sa[2][BM * SK];
    __shared__ __align__(16) unsigned short sb[2][BN * SK];
    __shared__ float nf4[16];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;           // the mma fragments' group and thread
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32; // this warp's 32 x 32 of the tile
    const int m0 = blockIdx.y * BM, o0 = blockIdx.x * BN;
    if (F == F_NF4) {
        if (tid < 16) nf4[tid] = NF4[tid];
        __syncthreads();
    }
    // 16-byte loads of f16/bf16 rows: rows and base 16-byte aligned
    const bool vec = ((unsigned long long)W & 15) == 0 && (row_bytes & 15) == 0;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = 0.0f;
    const int steps = (in + BK - 1) / BK;
    for (int kt = 0; kt < steps; kt++) {
        // Two buffers: step kt + 1 is written while slow warps may still read
        // step kt; the one barrier per step orders writes of kt + 2 after
        // every read of kt.
        unsigned short *A = sa[kt & 1], *B = sb[kt & 1];
        stage<F>(x, W, n, in, out, row_bytes, sx, m0, o0, kt * BK, vec, nf4, A, B);
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            unsigned a[2][4], b[4][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const unsigned short *r0 = A + (wm + 16 * i + g) * SK, *r8 = r0 + 8 * SK;
                a[i][0] = ld2(r0, ks + 2 * t);
                a[i][1] = ld2(r8, ks + 2 * t);
                a[i][2] = ld2(r0, ks + 2 * t + 8);
                a[i][3] = ld2(r8, ks + 2 * t + 8);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned short *c = B + (wn + 8 * j + g) * SK;
                b[j][0] = ld2(c, ks + 2 * t);
                b[j][1] = ld2(c, ks + 2 * t + 8);
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) mma<BF>(acc[i][j], a[i], b[j]);
        }
    }
    // d0, d1: row g, columns 2t, 2t + 1; d2, d3: row g + 8
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int m = m0 + wm + 16 * i + g + 8 * (c >> 1);
                const int o = o0 + wn + 8 * j + 2 * t + (c & 1);
                if (m < n && o < out)
                    y[(long long)m * sy + o] = acc[i][j][c] + (bias ? bias[o] : 0.0f);
            }
}

#define GEMM(name, F) \
    extern "C" __global__ void __launch_bounds__(128) \
        name(const float *x, const unsigned char *W, const float *bias, float *y, int n, int in, \
             int out, long long row_bytes, long long sx, long long sy) \
    { \
        gemm<F>(x, W, bias, y, n, in, out, row_bytes, sx, sy); \
    }
GEMM(khub_gemm_f16, F_F16)
#if __CUDA_ARCH__ >= 800
GEMM(khub_gemm_bf16, F_BF16)
#endif
GEMM(khub_gemm_q8_0, F_Q8_0)
GEMM(khub_gemm_q4_0, F_Q4_0)
GEMM(khub_gemm_q4_1, F_Q4_1)
GEMM(khub_gemm_q4_k, F_Q4_K)
GEMM(khub_gemm_q6_k, F_Q6_K)
GEMM(khub_gemm_nf4, F_NF4)
