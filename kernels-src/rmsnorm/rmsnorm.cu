// rmsnorm.cu: kernels-community/rmsnorm on CUDA, compiled to PTX by NVRTC.
// One block per row; the block reduces the sum of squares in shared memory.
// With a residual, residual += x first and the sum runs over residual.

extern "C" __global__ void khub_rms_norm_f32(const float *x, float *residual, const float *w,
                                             float *y, int dim, float eps)
{
    extern __shared__ float partial[];
    const int row = blockIdx.x;
    const float *xr = x + (long long)row * dim;
    float *yr = y + (long long)row * dim;
    float *rr = residual ? residual + (long long)row * dim : 0;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (rr) {
            v += rr[i];
            rr[i] = v;
        }
        acc += v * v;
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
        __syncthreads();
    }
    const float scale = rsqrtf(partial[0] / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = rr ? rr[i] : xr[i];
        yr[i] = v * scale * w[i];
    }
}
