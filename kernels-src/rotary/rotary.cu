// rotary.cu: kernels-community/rotary on CUDA, compiled to PTX by NVRTC.
//
// In place on x [n, n_heads, head_dim] (compact), at the positions of a
// device array. With rd = rotary_dim and j in [0, rd/2): inv_freq[j] =
// theta^(-2j/rd), scaled (LINEAR: / factor; LLAMA3: Llama 3.1's rule), angle
// = position * inv_freq[j], and the pair (x[j], x[j + rd/2]) (NEOX) or
// (x[2j], x[2j+1]) (INTERLEAVED) rotates by the angle. Frequencies, angles,
// sin and cos are computed in double, as khub/ref-cpu does, so the two agree
// to float rounding at any position. theta is a call argument: a model with
// a base per layer (Gemma 3's local/global layers) passes each layer's.
//
// One block per (token, head); thread j owns pair j. Specialised at build
// time on the number of pairs: HALF = 32, 64 and 128 (head_dim 64, 128, 256
// rotated whole) are template instantiations with the pair count a
// compile-time constant (one pass, no loop); any other rotary_dim takes the
// generic kernel (HALF = 0), which loops over pairs.
//
// Specialised at load (rotary_cuda.c): when the host can compile (ABI 1.5
// host->cuda_module_compile), the glue has this file compiled once per shape
// set with KHUB_ROPE_HALF (pairs), KHUB_ROPE_HEAD_DIM, KHUB_ROPE_STYLE and
// KHUB_ROPE_SCALING defined, and launches khub_rope_f32_spec: any pair count
// up to 1024 runs one pair per thread, the row stride is a constant and the
// branches on the pair layout and the scaling rule fold away.

#define SCALING_LINEAR 1
#define SCALING_LLAMA3 2
#define STYLE_NEOX     1

struct rope_params {
    double theta, factor, low_freq_factor, high_freq_factor, original_max_pos;
    int scaling, style, n_heads, head_dim, half;
};

__device__ double rope_inv_freq(const rope_params &p, int j, int half)
{
    double f = pow(p.theta, -(double)(2 * j) / (double)(2 * half));
    if (p.scaling == SCALING_LINEAR) f /= p.factor;
    if (p.scaling == SCALING_LLAMA3) {
        const double pi = 3.14159265358979323846;
        double omp = p.original_max_pos, lf = p.low_freq_factor, hf = p.high_freq_factor;
        double wavelen = 2.0 * pi / f;
        if (wavelen < omp / hf) return f;
        if (wavelen > omp / lf) return f / p.factor;
        double s = (omp / wavelen - lf) / (hf - lf);
        return (1.0 - s) * f / p.factor + s * f;
    }
    return f;
}

template <int HALF>
__device__ void rope(float *x, const int *positions, rope_params p)
{
    const int half = HALF ? HALF : p.half;
    const int token = blockIdx.x, head = blockIdx.y;
    float *row = x + ((long long)token * p.n_heads + head) * p.head_dim;
    const double pos = positions[token];
    const bool neox = p.style == STYLE_NEOX;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        double s, c;
        sincos(pos * rope_inv_freq(p, j, half), &s, &c);
        int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
        double a = row[ia], b = row[ib];
        row[ia] = (float)(a * c - b * s);
        row[ib] = (float)(b * c + a * s);
        if (HALF) break; // blockDim.x == HALF: one pair per thread
    }
}

extern "C" __global__ void khub_rope_f32_half32(float *x, const int *pos, rope_params p)
{
    rope<32>(x, pos, p);
}
extern "C" __global__ void khub_rope_f32_half64(float *x, const int *pos, rope_params p)
{
    rope<64>(x, pos, p);
}
extern "C" __global__ void khub_rope_f32_half128(float *x, const int *pos, rope_params p)
{
    rope<128>(x, pos, p);
}
extern "C" __global__ void khub_rope_f32(float *x, const int *pos, rope_params p)
{
    rope<0>(x, pos, p);
}

#ifdef KHUB_ROPE_HALF
extern "C" __global__ void khub_rope_f32_spec(float *x, const int *pos, rope_params p)
{
    p.head_dim = KHUB_ROPE_HEAD_DIM; // constants from here on: the compiler folds them
    p.style = KHUB_ROPE_STYLE;
    p.scaling = KHUB_ROPE_SCALING;
    p.half = KHUB_ROPE_HALF;
    rope<KHUB_ROPE_HALF>(x, pos, p);
}
#endif
