// flash_attn.cu: kernels-community/flash-attn2 on CUDA (FlashAttention-2
// style), compiled to PTX by NVRTC.
//
// A block owns BR query rows of one query head; each thread owns one row and
// keeps its output accumulator in registers. K/V tiles of BC keys of the
// head's KV group are staged in shared memory and reused by all BR rows; the
// softmax is computed online (running max m and sum l), so the score matrix
// is never materialised. Causal: row i (position q_pos0 + i) sees keys
// j <= q_pos0 + i. K/V are f32 [n_kv, n_kv_heads, HD] with row strides ks/vs
// (elements), so KV-cache views are read in place.
//
// Built ahead for head_dim 64 and 128 (khub_fa2_hd64, khub_fa2_hd128). At
// load, when the host can compile (ABI 1.5 host->cuda_module_compile), the
// glue (flash_attn_cuda.c) has this file compiled once per model shape with
// KHUB_FA2_HD, KHUB_FA2_HEADS and KHUB_FA2_GROUP (query heads per KV head)
// defined and launches khub_fa2_spec: the KV head of a query head is a
// division by a constant and the q/out row stride a constant.

#define BR 64
#define BC 32

template <int HD, int GROUP> // GROUP 0: nh / nkvh at run time
__device__ void fa2(const float *__restrict__ q, const float *__restrict__ k,
                    const float *__restrict__ v, float *__restrict__ out, int nq, int nh,
                    int nkv, int nkvh, long long ks, long long vs, float scale, long long q_pos0)
{
    __shared__ float kt[BC][HD];
    __shared__ float vt[BC][HD];
    const int h = blockIdx.y;
    const int g = GROUP ? h / GROUP : h / (nh / nkvh);
    const int i = blockIdx.x * BR + threadIdx.x;
    const bool active = i < nq;
    float qr[HD], acc[HD];
    float m = -1e30f, l = 0.0f;
    for (int d = 0; d < HD; d++) {
        qr[d] = active ? q[((long long)i * nh + h) * HD + d] * scale : 0.0f;
        acc[d] = 0.0f;
    }
    long long last_row = (long long)blockIdx.x * BR + BR - 1;
    long long kend = q_pos0 + (last_row < nq ? last_row : nq - 1) + 1;
    if (kend > nkv) kend = nkv;
    const long long my_last = q_pos0 + i;
    for (long long k0 = 0; k0 < kend; k0 += BC) {
        for (int t = threadIdx.x; t < BC * HD; t += blockDim.x) {
            int r = t / HD, d = t % HD;
            long long key = k0 + r;
            kt[r][d] = key < kend ? k[key * ks + (long long)g * HD + d] : 0.0f;
            vt[r][d] = key < kend ? v[key * vs + (long long)g * HD + d] : 0.0f;
        }
        __syncthreads();
        if (active) {
            for (int r = 0; r < BC; r++) {
                long long key = k0 + r;
                if (key >= kend || key > my_last) break;
                float s = 0.0f;
#pragma unroll 16
                for (int d = 0; d < HD; d++) s += qr[d] * kt[r][d];
                float m2 = fmaxf(m, s);
                float c = __expf(m - m2), p = __expf(s - m2);
                l = l * c + p;
#pragma unroll 16
                for (int d = 0; d < HD; d++) acc[d] = acc[d] * c + p * vt[r][d];
                m = m2;
            }
        }
        __syncthreads();
    }
    if (active) {
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int d = 0; d < HD; d++) out[((long long)i * nh + h) * HD + d] = acc[d] * inv;
    }
}

extern "C" __global__ void __launch_bounds__(BR)
khub_fa2_hd64(const float *q, const float *k, const float *v, float *out, int nq, int nh, int nkv,
              int nkvh, long long ks, long long vs, float scale, long long q_pos0)
{
    fa2<64, 0>(q, k, v, out, nq, nh, nkv, nkvh, ks, vs, scale, q_pos0);
}

extern "C" __global__ void __launch_bounds__(BR)
khub_fa2_hd128(const float *q, const float *k, const float *v, float *out, int nq, int nh, int nkv,
               int nkvh, long long ks, long long vs, float scale, long long q_pos0)
{
    fa2<128, 0>(q, k, v, out, nq, nh, nkv, nkvh, ks, vs, scale, q_pos0);
}

#ifdef KHUB_FA2_HD
extern "C" __global__ void __launch_bounds__(BR)
khub_fa2_spec(const float *q, const float *k, const float *v, float *out, int nq, int nh, int nkv,
              int nkvh, long long ks, long long vs, float scale, long long q_pos0)
{
    (void)nh, (void)nkvh; // the compile-time shape below
    fa2<KHUB_FA2_HD, KHUB_FA2_GROUP>(q, k, v, out, nq, KHUB_FA2_HEADS, nkv,
                                     KHUB_FA2_HEADS / KHUB_FA2_GROUP, ks, vs, scale, q_pos0);
}
#endif
