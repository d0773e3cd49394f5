// activation.cu: kernels-community/activation on CUDA: y = silu(gate) * up
// (act 1) or gelu_tanh(gate) * up (act 2), one thread per element.
extern "C" __global__ void khub_act_and_mul(const float *g, const float *u, float *y,
                                            long long n, int act)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = g[i], a;
    if (act == 2)
        a = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    else
        a = x / (1.0f + __expf(-x));
    y[i] = a * u[i];
}
