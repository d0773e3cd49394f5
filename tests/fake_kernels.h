/*
 * fake_kernels.h: host bodies for the kernels of the test plugin
 * khub-test/cuda-all (tests/plugins/cuda_ops.c, whose launches name their
 * argument lists), so a pass on the fake driver (tests/fake_cuda) computes:
 * khub_fake_cuda_kernel runs a body whenever a launch of its kernel runs,
 * at once or inside a graph launch, on the parameters as they were at the
 * launch or capture. test_cuda_graphs.c and test_graphs_paged.c compare
 * such passes bit for bit (graphs on and off). Include after
 * device_fixture.h.
 */
#ifndef KHUB_TESTS_FAKE_KERNELS_H
#define KHUB_TESTS_FAKE_KERNELS_H

typedef unsigned long long u64;

static float *F(u64 p) { return (float *)(uintptr_t)p; }
static double DBL(u64 u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* y, x, residual, weight, rows, dim, eps: residual += x, y = rms(residual) w */
static void k_norm(const u64 *p)
{
    float *y = F(p[0]), *x = F(p[1]), *r = F(p[2]), *w = F(p[3]);
    int64_t rows = (int64_t)p[4], dim = (int64_t)p[5];
    for (int64_t i = 0; i < rows; i++) {
        float *src = x + i * dim, *yi = y + i * dim;
        if (r) {
            for (int64_t d = 0; d < dim; d++) r[i * dim + d] += src[d];
            src = r + i * dim;
        }
        double ss = 0;
        for (int64_t d = 0; d < dim; d++) ss += (double)src[d] * src[d];
        float sc = (float)(1.0 / sqrt(ss / (double)dim + DBL(p[6])));
        for (int64_t d = 0; d < dim; d++) yi[d] = src[d] * sc * w[d];
    }
}

/* y, x, weight [out, in], bias, rows, in, out */
static void k_linear(const u64 *p)
{
    float *y = F(p[0]), *x = F(p[1]), *w = F(p[2]), *b = F(p[3]);
    int64_t rows = (int64_t)p[4], in = (int64_t)p[5], out = (int64_t)p[6];
    for (int64_t i = 0; i < rows; i++)
        for (int64_t o = 0; o < out; o++) {
            float acc = b ? b[o] : 0.0f;
            for (int64_t k = 0; k < in; k++) acc += x[i * in + k] * w[o * in + k];
            y[i * out + o] = acc;
        }
}

/* y, gate, up, elements */
static void k_act(const u64 *p)
{
    float *y = F(p[0]), *g = F(p[1]), *u = F(p[2]);
    for (u64 i = 0; i < p[3]; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* x [n, heads, hd] in place, positions, n, heads, hd, theta (NEOX pairs) */
static void k_rotary(const u64 *p)
{
    float *x = F(p[0]);
    const int32_t *pos = (const int32_t *)(uintptr_t)p[1];
    int64_t n = (int64_t)p[2], heads = (int64_t)p[3], hd = (int64_t)p[4], half = hd / 2;
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + (t * heads + h) * hd;
            for (int64_t i = 0; i < half; i++) {
                double a = pos[t] * pow(DBL(p[5]), -2.0 * (double)i / (double)hd);
                float c = (float)cos(a), s = (float)sin(a), x0 = v[i], x1 = v[i + half];
                v[i] = x0 * c - x1 * s;
                v[i + half] = x0 * s + x1 * c;
            }
        }
}

/* out, q, k, v, n, heads, kv_heads, hd, kv_stride, q_pos0, kv_len, scale */
static void k_attention(const u64 *p)
{
    float *out = F(p[0]), *q = F(p[1]), *k = F(p[2]), *v = F(p[3]);
    int64_t n = (int64_t)p[4], heads = (int64_t)p[5], kvh = (int64_t)p[6], hd = (int64_t)p[7],
            stride = (int64_t)p[8], q0 = (int64_t)p[9], len = (int64_t)p[10];
    float sc[64 * 4];
    for (int64_t t = 0; t < n; t++)
        for (int64_t h = 0; h < heads; h++) {
            const float *qi = q + (t * heads + h) * hd;
            int64_t g = h / (heads / kvh), upto = q0 + t + 1 < len ? q0 + t + 1 : len;
            float mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < upto; j++) {
                float d = 0;
                for (int64_t e = 0; e < hd; e++) d += qi[e] * k[j * stride + g * hd + e];
                sc[j] = d * (float)DBL(p[11]);
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int64_t j = 0; j < upto; j++) sum += sc[j] = expf(sc[j] - mx);
            float *o = out + (t * heads + h) * hd;
            for (int64_t e = 0; e < hd; e++) {
                float acc = 0;
                for (int64_t j = 0; j < upto; j++) acc += sc[j] * v[j * stride + g * hd + e];
                o[e] = acc / sum;
            }
        }
}

/* y, table [vocab, hidden] f32, ids (int32), n, hidden: y's rows are the
 * ids' rows of the table (cuda-embed's embedding) */
static void k_embedding(const u64 *p)
{
    const int32_t *ids = (const int32_t *)(uintptr_t)p[2];
    int64_t n = (int64_t)p[3], h = (int64_t)p[4];
    for (int64_t i = 0; i < n; i++) memcpy(F(p[0]) + i * h, F(p[1]) + ids[i] * h, (size_t)h * 4);
}

/* K destination, V destination, k, v, floats each */
static void k_kv_write(const u64 *p)
{
    memcpy(F(p[0]), F(p[2]), (size_t)p[4] * 4);
    memcpy(F(p[1]), F(p[3]), (size_t)p[4] * 4);
}

static inline void computing_kernels(void)
{
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*kernel)(const char *, int, void (*)(const u64 *)) =
        h ? (int (*)(const char *, int, void (*)(const u64 *)))dlsym(h, "khub_fake_cuda_kernel")
          : NULL;
    ASSERT(kernel != NULL);
    ASSERT_EQ(kernel("khub_test_norm", 7, k_norm), 0);
    ASSERT_EQ(kernel("khub_test_linear", 7, k_linear), 0);
    ASSERT_EQ(kernel("khub_test_act", 4, k_act), 0);
    ASSERT_EQ(kernel("khub_test_rotary", 6, k_rotary), 0);
    ASSERT_EQ(kernel("khub_test_attention", 12, k_attention), 0);
    ASSERT_EQ(kernel("khub_test_kv_write", 5, k_kv_write), 0);
    ASSERT_EQ(kernel("khub_test_embedding", 5, k_embedding), 0);
    launch_log();
}

#endif /* KHUB_TESTS_FAKE_KERNELS_H */
