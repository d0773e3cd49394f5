// flash_attn.cu: kernels-community/flash-attn2 on CUDA (FlashAttention-2
// style), compiled to PTX by NVRTC. Two ways through one attention call,
// chosen by the host glue from the shapes (flash_attn_cuda.c says the rule):
//
// Prefill (khub_fa2_hd*): a block owns BR query rows of one query head;
// each thread owns one row and keeps its output accumulator in registers.
// K/V tiles of BC keys of the head's KV group are staged in shared memory
// and reused by all BR rows; the softmax is computed online (running max m
// and sum l), so the score matrix is never materialised.
//
// Decode, split-K (khub_fa2_decode_hd*, then khub_fa2_merge_hd*; flash-
// decoding): with few query rows the prefill grid has one live thread per
// block, so instead the key range is cut into splits and each block of
// DW warps owns one (split, head, query row): each warp takes every DW-th
// key of the split, its 32 lanes holding HD/32 dimensions each (one
// coalesced row read per key and a warp sum for the dot product), with its
// own online softmax; the warps' states merge in shared memory and the
// block writes the split's partial max, sum and unnormalised output. The
// merge kernel rescales the splits' partials to their common max and
// divides. With one split the decode kernel writes the output itself.
//
// Causal: row i (position q_pos0 + i) sees keys j <= q_pos0 + i. K/V are f32
// [n_kv, n_kv_heads, HD] with row strides ks/vs (elements), so KV-cache
// views are read in place.
//
// Built ahead for head_dim 64 and 128 (khub_fa2_hd*, khub_fa2_decode_hd*,
// khub_fa2_merge_hd*). At load, when the host can compile (ABI 1.5
// host->cuda_module_compile), the glue (flash_attn_cuda.c) has this file
// compiled once per model shape with KHUB_FA2_HD, KHUB_FA2_HEADS and
// KHUB_FA2_GROUP (query heads per KV head) defined and launches
// khub_fa2_spec (prefill) and khub_fa2_decode_spec (split-K): the KV head
// of a query head is a division by a constant and the q/out row stride a
// constant. The merge needs head_dim only, which its build-time kernels
// already have as a constant, so it is not compiled again.

#define BR 64
#define BC 32
#define DW      4                             // warps per decode block
#define NEG_INF (__int_as_float(0xff800000)) // -inf without math.h (NVRTC)

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

// ---------------------------------------------------------------------------
// Split-K decode
// ---------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// One (split, head, query row): keys [k0, k1) of KV head g for the query
// row qrow (HD floats). Writes either the normalised output (pacc == 0) or
// the split's partial: pm/pl the max and sum, pacc[HD] the output before
// division (all relative to the max). Launched with DW warps.
template <int HD>
__device__ void decode_split(const float *__restrict__ qrow, const float *__restrict__ k,
                             const float *__restrict__ v, long long ks, long long vs, int g,
                             float scale, long long k0, long long k1, float *__restrict__ orow,
                             float *__restrict__ pm, float *__restrict__ pl,
                             float *__restrict__ pacc)
{
    constexpr int PER = HD / 32;
    __shared__ float sm_m[DW], sm_l[DW], sm_acc[DW][HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float qr[PER], acc[PER];
    for (int j = 0; j < PER; j++) {
        qr[j] = qrow[lane + 32 * j] * scale;
        acc[j] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (long long key = k0 + warp; key < k1; key += DW) {
        const float *kr = k + key * ks + (long long)g * HD;
        const float *vr = v + key * vs + (long long)g * HD;
        float s = 0.0f;
        for (int j = 0; j < PER; j++) s += qr[j] * kr[lane + 32 * j];
        s = warp_sum(s);
        float m2 = fmaxf(m, s);
        float c = m == NEG_INF ? 0.0f : __expf(m - m2), p = __expf(s - m2);
        l = l * c + p;
        for (int j = 0; j < PER; j++) acc[j] = acc[j] * c + p * vr[lane + 32 * j];
        m = m2;
    }
    for (int j = 0; j < PER; j++) sm_acc[warp][lane + 32 * j] = acc[j];
    if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
    __syncthreads();
    const int d = threadIdx.x;
    if (d >= HD) return;
    float M = NEG_INF;
    for (int w = 0; w < DW; w++) M = fmaxf(M, sm_m[w]);
    float L = 0.0f, A = 0.0f;
    for (int w = 0; w < DW; w++) {
        float c = sm_m[w] == NEG_INF ? 0.0f : __expf(sm_m[w] - M);
        L += c * sm_l[w];
        A += c * sm_acc[w][d];
    }
    if (!pacc) {
        orow[d] = L > 0.0f ? A / L : 0.0f;
        return;
    }
    pacc[d] = A;
    if (d == 0) *pm = M, *pl = L;
}

// grid (nsplit, nh, nq), DW * 32 threads; split s owns keys [s * chunk,
// (s + 1) * chunk). part: [nq][nh][nsplit] records of HD + 2 floats (the
// output, then the max and the sum); unused when nsplit == 1.
template <int HD, int GROUP> // GROUP 0: nh / nkvh at run time
__device__ void fa2_decode(const float *q, const float *k, const float *v, float *out,
                           float *part, int nh, int nkv, int nkvh, long long ks, long long vs,
                           float scale, long long q_pos0, int nsplit, int chunk)
{
    const int split = blockIdx.x, h = blockIdx.y, i = blockIdx.z;
    const int g = GROUP ? h / GROUP : h / (nh / nkvh);
    long long kend = q_pos0 + i + 1; // causal
    if (kend > nkv) kend = nkv;
    long long k0 = (long long)split * chunk, k1 = k0 + chunk;
    if (k1 > kend) k1 = kend;
    const long long row = (long long)i * nh + h;
    float *rec = nsplit > 1 ? part + (row * nsplit + split) * (HD + 2) : 0;
    decode_split<HD>(q + row * HD, k, v, ks, vs, g, scale, k0, k1, out + row * HD,
                     rec ? rec + HD : 0, rec ? rec + HD + 1 : 0, rec);
}

// grid (nq * nh), HD threads: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s.
template <int HD>
__device__ void fa2_merge(const float *part, float *out, int nsplit)
{
    const long long row = blockIdx.x;
    const int d = threadIdx.x;
    const float *rec = part + row * nsplit * (HD + 2);
    float M = NEG_INF;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, rec[s * (HD + 2) + HD]);
    float L = 0.0f, A = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        const float *r = rec + s * (HD + 2);
        float c = r[HD] == NEG_INF ? 0.0f : __expf(r[HD] - M);
        L += c * r[HD + 1];
        A += c * r[d];
    }
    out[row * HD + d] = L > 0.0f ? A / L : 0.0f;
}

#define DECODE(HD) \
    extern "C" __global__ void __launch_bounds__(DW * 32) khub_fa2_decode_hd##HD( \
        const float *q, const float *k, const float *v, float *out, float *part, int nh, int nkv, \
        int nkvh, long long ks, long long vs, float scale, long long q_pos0, int nsplit, \
        int chunk) \
    { \
        fa2_decode<HD, 0>(q, k, v, out, part, nh, nkv, nkvh, ks, vs, scale, q_pos0, nsplit, \
                          chunk); \
    } \
    extern "C" __global__ void __launch_bounds__(HD) khub_fa2_merge_hd##HD( \
        const float *part, float *out, int nsplit) \
    { \
        fa2_merge<HD>(part, out, nsplit); \
    }

DECODE(64)
DECODE(128)

#ifdef KHUB_FA2_HD
extern "C" __global__ void __launch_bounds__(BR)
khub_fa2_spec(const float *q, const float *k, const float *v, float *out, int nq, int nh, int nkv,
              int nkvh, long long ks, long long vs, float scale, long long q_pos0)
{
    (void)nh, (void)nkvh; // the compile-time shape below
    fa2<KHUB_FA2_HD, KHUB_FA2_GROUP>(q, k, v, out, nq, KHUB_FA2_HEADS, nkv,
                                     KHUB_FA2_HEADS / KHUB_FA2_GROUP, ks, vs, scale, q_pos0);
}

extern "C" __global__ void __launch_bounds__(DW * 32)
khub_fa2_decode_spec(const float *q, const float *k, const float *v, float *out, float *part,
                     int nh, int nkv, int nkvh, long long ks, long long vs, float scale,
                     long long q_pos0, int nsplit, int chunk)
{
    (void)nh, (void)nkvh; // the compile-time shape below
    fa2_decode<KHUB_FA2_HD, KHUB_FA2_GROUP>(q, k, v, out, part, KHUB_FA2_HEADS, nkv,
                                            KHUB_FA2_HEADS / KHUB_FA2_GROUP, ks, vs, scale,
                                            q_pos0, nsplit, chunk);
}
#endif
