// @NAME@: causal GQA attention on CUDA, one thread per (query, head):
// simple and correct; replace with a tiled flash-attention kernel. cap > 0
// soft-caps the scaled scores (cap * tanh(s / cap), ABI 1.5).
extern "C" __global__ void TEMPLATE_CNAME_attention(const float *q, const float *k, const float *v,
                                               float *out, int nq, int nh, int nkv, int nkvh,
                                               int hd, long long ks0, long long ks1,
                                               long long vs0, long long vs1, float scale,
                                               long long q_pos0, float cap)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nq * nh) return;
    int i = t / nh, h = t % nh, g = h / (nh / nkvh);
    long long last = q_pos0 + i < nkv - 1 ? q_pos0 + i : nkv - 1;
    const float *qi = q + ((long long)i * nh + h) * hd;
    float mx = -1e30f, sum = 0.0f;
    float *o = out + ((long long)i * nh + h) * hd;
    for (int d = 0; d < hd; d++) o[d] = 0.0f;
    for (long long j = 0; j <= last; j++) {
        const float *kj = k + j * ks0 + (long long)g * ks1;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s += qi[d] * kj[d];
        s *= scale;
        if (cap > 0.0f) s = cap * tanhf(s / cap);
        float m2 = s > mx ? s : mx, c = __expf(mx - m2), p = __expf(s - m2);
        sum = sum * c + p;
        const float *vj = v + j * vs0 + (long long)g * vs1;
        for (int d = 0; d < hd; d++) o[d] = o[d] * c + p * vj[d];
        mx = m2;
    }
    for (int d = 0; d < hd; d++) o[d] = sum > 0 ? o[d] / sum : 0.0f;
}
