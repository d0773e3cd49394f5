// @NAME@: Q8_0 linear y = x W^T (+ bias) on CUDA, one thread per output.
static __device__ float f16_at(const unsigned char *p)
{
    unsigned short h = (unsigned short)(p[0] | p[1] << 8);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

extern "C" __global__ void TEMPLATE_CNAME_qlinear(const float *x, const unsigned char *w, const float *b,
                                             float *y, long long n, int in, int out)
{
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * out) return;
    long long r = t / out;
    int o = (int)(t % out);
    const unsigned char *blk = w + (long long)o * (in / 32) * 34;
    float acc = 0.0f;
    for (int i = 0; i < in; i += 32, blk += 34) {
        float dot = 0.0f;
        for (int l = 0; l < 32; l++) dot += (float)(signed char)blk[2 + l] * x[r * in + i + l];
        acc += f16_at(blk) * dot;
    }
    y[t] = acc + (b ? b[o] : 0.0f);
}
