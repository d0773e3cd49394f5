// @NAME@: SiLU-and-mul on CUDA (y = silu(gate) * up), one thread per element.
extern "C" __global__ void TEMPLATE_CNAME_silu_and_mul(const float *g, const float *u, float *y,
                                                  long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = g[i] / (1.0f + __expf(-g[i])) * u[i];
}
