// @NAME@: dense linear y = x W^T (+ bias) on CUDA, one thread per output.
extern "C" __global__ void TEMPLATE_CNAME_linear(const float *x, const float *w, const float *b,
                                            float *y, long long n, int in, int out)
{
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n * out) return;
    long long r = t / out;
    int o = (int)(t % out);
    float acc = b ? b[o] : 0.0f;
    for (int i = 0; i < in; i++) acc += x[r * in + i] * w[(long long)o * in + i];
    y[t] = acc;
}
