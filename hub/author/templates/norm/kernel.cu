// @NAME@: RMSNorm on CUDA (one block of 256 threads per row).
extern "C" __global__ void TEMPLATE_CNAME_rms_norm(const float *x, float *res, const float *w,
                                              float *y, int dim, float eps)
{
    __shared__ float part[256];
    const float *xr = x + (long long)blockIdx.x * dim;
    float *yr = y + (long long)blockIdx.x * dim;
    float *rr = res ? res + (long long)blockIdx.x * dim : 0;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i];
        if (rr) v = (rr[i] += v);
        acc += v * v;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    float scale = rsqrtf(part[0] / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (rr ? rr[i] : xr[i]) * scale * w[i];
}
