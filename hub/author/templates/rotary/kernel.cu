// @NAME@: rotary embedding on CUDA, in place, one thread per (token, head, pair).
extern "C" __global__ void TEMPLATE_CNAME_rotary(float *x, const int *pos, long long n, int nh, int hd,
                                            int rd, int neox, float theta, float inv_factor)
{
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int half = rd / 2;
    if (t >= n * nh * half) return;
    int j = (int)(t % half);
    long long row = t / half; // token * nh + head
    float ang = (float)pos[row / nh] * powf(theta, -2.0f * j / rd) * inv_factor, s, c;
    sincosf(ang, &s, &c);
    float *xh = x + row * hd;
    int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
    float xa = xh[ia], xb = xh[ib];
    xh[ia] = xa * c - xb * s;
    xh[ib] = xb * c + xa * s;
}
