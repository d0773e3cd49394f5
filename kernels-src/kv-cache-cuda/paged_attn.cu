// paged_attn.cu: kernels-community/kv-cache-cuda, the paged KV cache's
// device side (layout PAGED_HTD), compiled to PTX by NVRTC:
//
//   - khub_pkv_write_{f32,f16}: n tokens of f32 K/V rows [n, H, D] into the
//     pools [n_blocks, H, bs, D] at positions [pos, pos + n) of a sequence,
//     block ids from the device block table (rounded to f16 for f16 pools).
//   - khub_pa_hd{64,128}_{f32,f16}: paged attention, prefill tiles (as
//     flash-attn2's khub_fa2_hd*): one block of BR threads per (tile of BR
//     query rows of one sequence, query head); K/V tiles of BC keys staged
//     in shared memory; online softmax. grid.z is the sequence.
//   - khub_pa_decode_hd{64,128}_{f32,f16} and khub_pa_merge_hd{64,128}:
//     split-K for decode rows (as flash-attn2's khub_fa2_decode_hd*): one
//     block of DW warps per (split of `chunk` keys, head, packed query row);
//     warps over keys, lanes over head_dim; partial max, sum and output per
//     split, merged by the second kernel (or written directly with one split).
//
// Every call serves a packed batch: sequence s owns query rows
// [cu[s], cu[s + 1]), its query i sits at position q_pos0[s] + i and sees
// keys j < kv_lens[s] with j <= position (causal) and position - j < window
// (window > 0); key j is in block table[row(s) * stride + j / bs], slot j % bs.
// Scores are scale * q.k, soft-capped (softcap * tanh(s / softcap)) when
// softcap > 0. A query that sees no key gets zeros. A block id outside the
// pool reads as zeros (the host checks the table it uploads; this keeps a
// bad id from reading outside the pool).

#define BR 64
#define BC 32
#define DW 4
#define NEG_INF (__int_as_float(0xff800000)) // -inf without math.h (NVRTC)

__device__ __forceinline__ unsigned short f2h(float f)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float ld(const float *p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const unsigned short *p, long long i)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i]));
    return f;
}

// ---------------------------------------------------------------------------
// Append
// ---------------------------------------------------------------------------

// grid (ceil(n * H * D / 256), 2): blockIdx.y 0 writes K, 1 writes V.
template <typename T>
__device__ void pkv_write(const int *row, const float *k, const float *v, T *kp, T *vp,
                          long long pos, long long n, int H, int D, int bs)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long per = (long long)H * D;
    if (i >= n * per) return;
    const long long t = i / per, h = (i / D) % H, d = i % D, p = pos + t;
    const long long blk = row[p / bs], slot = p % bs;
    const long long at = ((blk * H + h) * bs + slot) * D + d;
    const float x = (blockIdx.y ? v : k)[i];
    T *dst = blockIdx.y ? vp : kp;
    if (sizeof(T) == 2)
        ((unsigned short *)dst)[at] = f2h(x);
    else
        ((float *)dst)[at] = x;
}

// The first argument is the sequence's row of the device block table.
extern "C" __global__ void khub_pkv_write_f32(const int *row, const float *k, const float *v,
                                              float *kp, float *vp, long long pos, long long n,
                                              int H, int D, int bs)
{
    pkv_write<float>(row, k, v, kp, vp, pos, n, H, D, bs);
}

extern "C" __global__ void khub_pkv_write_f16(const int *row, const float *k, const float *v,
                                              unsigned short *kp, unsigned short *vp, long long pos,
                                              long long n, int H, int D, int bs)
{
    pkv_write<unsigned short>(row, k, v, kp, vp, pos, n, H, D, bs);
}

// ---------------------------------------------------------------------------
// The batch: where a sequence's keys are
// ---------------------------------------------------------------------------

struct Batch {
    const int *cu, *q_pos0, *kv_lens, *table, *seq_rows;
    long long stride;
    int n_seqs, nh, nkvh, bs, n_blocks;
    float scale, softcap;
    int causal;
    long long window;
};

// Element offset of (key, KV head g) in a pool, -1 for a block outside it.
template <int HD>
__device__ __forceinline__ long long key_at(const Batch &b, const int *row, long long key, int g)
{
    const int blk = row[key / b.bs];
    if (blk < 0 || blk >= b.n_blocks) return -1;
    return (((long long)blk * b.nkvh + g) * b.bs + key % b.bs) * HD;
}

__device__ __forceinline__ const int *table_row(const Batch &b, int s)
{
    return b.table + (long long)(b.seq_rows ? b.seq_rows[s] : s) * b.stride;
}

__device__ __forceinline__ float cap(const Batch &b, float s)
{
    return b.softcap > 0.0f ? b.softcap * tanhf(s / b.softcap) : s;
}

// Keys [*k0, *k1) that the query at position pos of a sequence with kv keys sees.
__device__ __forceinline__ void visible(const Batch &b, long long pos, long long kv, long long *k0,
                                        long long *k1)
{
    *k1 = b.causal && pos + 1 < kv ? pos + 1 : kv;
    *k0 = b.window > 0 && pos - b.window + 1 > 0 ? pos - b.window + 1 : 0;
}

// ---------------------------------------------------------------------------
// Prefill tiles
// ---------------------------------------------------------------------------

template <int HD, typename T>
__device__ void pa_tiles(const float *__restrict__ q, const T *__restrict__ kp,
                         const T *__restrict__ vp, float *__restrict__ out, Batch b)
{
    __shared__ float kt[BC][HD];
    __shared__ float vt[BC][HD];
    const int s = blockIdx.z, h = blockIdx.y, g = h / (b.nh / b.nkvh);
    const int qs = b.cu[s], nq = b.cu[s + 1] - qs, tile = blockIdx.x;
    if (tile * BR >= nq) return; // the whole block: nothing of this sequence here
    const int i = tile * BR + threadIdx.x;
    const bool active = i < nq;
    const long long pos0 = b.q_pos0[s], kv = b.kv_lens[s];
    const int *row = table_row(b, s);
    float qr[HD], acc[HD];
    float m = NEG_INF, l = 0.0f;
    for (int d = 0; d < HD; d++) {
        qr[d] = active ? q[((long long)(qs + i) * b.nh + h) * HD + d] * b.scale : 0.0f;
        acc[d] = 0.0f;
    }
    // The tile's keys: from what its first row sees to what its last row sees.
    const int last = tile * BR + BR - 1 < nq ? tile * BR + BR - 1 : nq - 1;
    long long lo, hi, my0, my1, unused;
    visible(b, pos0 + tile * BR, kv, &lo, &unused);
    visible(b, pos0 + last, kv, &unused, &hi);
    visible(b, pos0 + i, kv, &my0, &my1);
    for (long long k0 = lo / BC * BC; k0 < hi; k0 += BC) {
        for (int t = threadIdx.x; t < BC * HD; t += blockDim.x) {
            const int r = t / HD, d = t % HD;
            const long long key = k0 + r, at = key < hi ? key_at<HD>(b, row, key, g) : -1;
            kt[r][d] = at >= 0 ? ld(kp, at + d) : 0.0f;
            vt[r][d] = at >= 0 ? ld(vp, at + d) : 0.0f;
        }
        __syncthreads();
        if (active) {
            for (int r = 0; r < BC; r++) {
                const long long key = k0 + r;
                if (key >= my1) break;
                if (key < my0) continue;
                float sc = 0.0f;
#pragma unroll 16
                for (int d = 0; d < HD; d++) sc += qr[d] * kt[r][d];
                sc = cap(b, sc);
                const float m2 = fmaxf(m, sc);
                const float c = m == NEG_INF ? 0.0f : __expf(m - m2), p = __expf(sc - m2);
                l = l * c + p;
#pragma unroll 16
                for (int d = 0; d < HD; d++) acc[d] = acc[d] * c + p * vt[r][d];
                m = m2;
            }
        }
        __syncthreads();
    }
    if (active) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int d = 0; d < HD; d++) out[((long long)(qs + i) * b.nh + h) * HD + d] = acc[d] * inv;
    }
}

// ---------------------------------------------------------------------------
// Split-K decode
// ---------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// The sequence owning packed row t (cu ascending).
__device__ int seq_of(const Batch &b, int t)
{
    int lo = 0, hi = b.n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (b.cu[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// grid (nsplit, nh, total_q), DW * 32 threads. part: [total_q][nh][nsplit]
// records of HD + 2 floats (output, max, sum); unused when nsplit == 1.
template <int HD, typename T>
__device__ void pa_decode(const float *__restrict__ q, const T *__restrict__ kp,
                          const T *__restrict__ vp, float *__restrict__ out,
                          float *__restrict__ part, Batch b, int nsplit, int chunk)
{
    constexpr int PER = HD / 32;
    __shared__ float sm_m[DW], sm_l[DW], sm_acc[DW][HD];
    const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z, g = h / (b.nh / b.nkvh);
    const int s = seq_of(b, t);
    const int *row = table_row(b, s);
    long long k0, k1;
    visible(b, b.q_pos0[s] + (t - b.cu[s]), b.kv_lens[s], &k0, &k1);
    const long long c0 = (long long)split * chunk, c1 = c0 + chunk;
    if (k0 < c0) k0 = c0;
    if (k1 > c1) k1 = c1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long qrow = ((long long)t * b.nh + h) * HD;
    float qr[PER], acc[PER];
    for (int j = 0; j < PER; j++) {
        qr[j] = q[qrow + lane + 32 * j] * b.scale;
        acc[j] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (long long key = k0 + warp; key < k1; key += DW) {
        const long long at = key_at<HD>(b, row, key, g);
        float sc = 0.0f;
        for (int j = 0; j < PER; j++) sc += qr[j] * (at >= 0 ? ld(kp, at + lane + 32 * j) : 0.0f);
        sc = cap(b, warp_sum(sc));
        const float m2 = fmaxf(m, sc);
        const float c = m == NEG_INF ? 0.0f : __expf(m - m2), p = __expf(sc - m2);
        l = l * c + p;
        for (int j = 0; j < PER; j++)
            acc[j] = acc[j] * c + p * (at >= 0 ? ld(vp, at + lane + 32 * j) : 0.0f);
        m = m2;
    }
    for (int j = 0; j < PER; j++) sm_acc[warp][lane + 32 * j] = acc[j];
    if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
    __syncthreads();
    const int d = threadIdx.x;
    if (d >= HD) return;
    float M = NEG_INF, L = 0.0f, A = 0.0f;
    for (int w = 0; w < DW; w++) M = fmaxf(M, sm_m[w]);
    for (int w = 0; w < DW; w++) {
        const float c = sm_m[w] == NEG_INF ? 0.0f : __expf(sm_m[w] - M);
        L += c * sm_l[w];
        A += c * sm_acc[w][d];
    }
    if (nsplit == 1) {
        out[qrow + d] = L > 0.0f ? A / L : 0.0f;
        return;
    }
    float *rec = part + (((long long)t * b.nh + h) * nsplit + split) * (HD + 2);
    rec[d] = A;
    if (d == 0) rec[HD] = M, rec[HD + 1] = L;
}

// grid (total_q * nh), HD threads.
template <int HD>
__device__ void pa_merge(const float *part, float *out, int nsplit)
{
    const long long r = blockIdx.x;
    const int d = threadIdx.x;
    const float *rec = part + r * nsplit * (HD + 2);
    float M = NEG_INF, L = 0.0f, A = 0.0f;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, rec[s * (HD + 2) + HD]);
    for (int s = 0; s < nsplit; s++) {
        const float *x = rec + s * (HD + 2);
        const float c = x[HD] == NEG_INF ? 0.0f : __expf(x[HD] - M);
        L += c * x[HD + 1];
        A += c * x[d];
    }
    out[r * HD + d] = L > 0.0f ? A / L : 0.0f;
}

// ---------------------------------------------------------------------------
// Entry points: head dims 64 and 128, f32 and f16 pools
// ---------------------------------------------------------------------------

// The block table first (the fake driver's launch log records arg 0).
#define PA_ARGS \
    const int *table, const float *q, const void *kp, const void *vp, float *out, const int *cu, \
        const int *q_pos0, const int *kv_lens, const int *seq_rows, long long stride, int n_seqs, \
        int nh, int nkvh, int bs, int n_blocks, float scale, float softcap, int causal, \
        long long window
#define PA_BATCH \
    Batch b = {cu,     q_pos0, kv_lens, table, seq_rows, stride, n_seqs, nh, nkvh, bs, n_blocks, \
               scale, softcap, causal,  window}

#define PA_ENTRIES(HD, NAME, T) \
    extern "C" __global__ void __launch_bounds__(BR) khub_pa_hd##HD##_##NAME(PA_ARGS) \
    { \
        PA_BATCH; \
        pa_tiles<HD, T>(q, (const T *)kp, (const T *)vp, out, b); \
    } \
    extern "C" __global__ void __launch_bounds__(DW * 32) \
        khub_pa_decode_hd##HD##_##NAME(PA_ARGS, float *part, int nsplit, int chunk) \
    { \
        PA_BATCH; \
        pa_decode<HD, T>(q, (const T *)kp, (const T *)vp, out, part, b, nsplit, chunk); \
    }

PA_ENTRIES(64, f32, float)
PA_ENTRIES(64, f16, unsigned short)
PA_ENTRIES(128, f32, float)
PA_ENTRIES(128, f16, unsigned short)

extern "C" __global__ void __launch_bounds__(64) khub_pa_merge_hd64(const float *part, float *out,
                                                                     int nsplit)
{
    pa_merge<64>(part, out, nsplit);
}

extern "C" __global__ void __launch_bounds__(128) khub_pa_merge_hd128(const float *part,
                                                                       float *out, int nsplit)
{
    pa_merge<128>(part, out, nsplit);
}
