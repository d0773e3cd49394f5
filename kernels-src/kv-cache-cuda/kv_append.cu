// kv_append.cu: kernels-community/kv-cache-cuda, the append of a static KV
// cache in device memory, compiled to PTX by NVRTC.
//
// Copies n tokens of K (blockIdx.y 0) and V (blockIdx.y 1), `count` = n x
// n_kv_heads x head_dim f32 values each, into the cache at element offset
// dst_k / dst_v: as they are (f32 storage) or rounded to nearest even to f16
// (f16 storage). One thread per value.

__device__ __forceinline__ unsigned short f2h(float f)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

template <bool F16>
__device__ void append(const float *k, const float *v, void *dk, void *dv, long long count)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float *src = blockIdx.y ? v : k;
    void *dst = blockIdx.y ? dv : dk;
    if (F16)
        ((unsigned short *)dst)[i] = f2h(src[i]);
    else
        ((float *)dst)[i] = src[i];
}

extern "C" __global__ void khub_kv_append_f32(const float *k, const float *v, void *dk, void *dv,
                                              long long count)
{
    append<false>(k, v, dk, dv, count);
}

extern "C" __global__ void khub_kv_append_f16(const float *k, const float *v, void *dk, void *dv,
                                              long long count)
{
    append<true>(k, v, dk, dv, count);
}
