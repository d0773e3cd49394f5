/*
 * activation_cpu.c: kernels-community/activation for the CPU.
 *
 * y = act(gate) * up with act = SiLU (x / (1 + e^-x)) or GELU-tanh
 * (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))). The AVX2 build
 * evaluates e^x 8 lanes at a time: x = n ln2 + r with |r| <= ln2/2, e^r by a
 * degree-6 polynomial (relative error below 2e-7 over that range), times 2^n
 * built in the exponent bits; inputs are clamped to [-88, 88] so 2^n never
 * overflows. GELU and the scalar tails use libm.
 */
#include <math.h>
#include <stdint.h>

#include <khub/khub_plugin.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define ACT_SIMD 1
#else
#define ACT_SIMD 0
#endif

#if ACT_SIMD
static __m256 exp8(__m256 x)
{
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* r = x - n ln2, with ln2 split in two for accuracy (Cody-Waite) */
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

typedef struct job {
    const float *g, *u;
    float *y;
    int64_t n;
    uint32_t act;
} job;

static float gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

static void chunk(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const job *j = ud;
    /* items are blocks of 1024 elements */
    int64_t lo = begin * 1024, hi = end * 1024 < j->n ? end * 1024 : j->n;
    int64_t i = lo;
    if (j->act == KHUB_ACT_GELU_TANH) {
        for (; i < hi; i++) j->y[i] = gelu_tanh(j->g[i]) * j->u[i];
        return;
    }
#if ACT_SIMD
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= hi; i += 8) {
        __m256 g = _mm256_loadu_ps(j->g + i);
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, g))));
        _mm256_storeu_ps(j->y + i, _mm256_mul_ps(s, _mm256_loadu_ps(j->u + i)));
    }
#endif
    for (; i < hi; i++) j->y[i] = j->g[i] / (1.0f + expf(-j->g[i])) * j->u[i];
}

static int f32_like(const khub_tensor *t, const khub_tensor *ref)
{
    return t && t->ndim == 2 && !t->strides && t->dtype.code == KHUB_DL_FLOAT &&
           t->dtype.bits == 32 && t->shape[0] == ref->shape[0] && t->shape[1] == ref->shape[1];
}

static khub_status silu_and_mul(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_activation_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->gate || a->gate->ndim != 2 ||
        (a->act_type != KHUB_ACT_SILU && a->act_type != KHUB_ACT_GELU_TANH))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "silu_and_mul: needs SILU or GELU_TANH and gate [n, ff]");
    if (!f32_like(a->gate, a->gate) || !f32_like(a->up, a->gate) || !f32_like(a->y, a->gate))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "silu_and_mul: gate, up and y must be compact f32 [%lld, %lld]",
                          (long long)a->gate->shape[0], (long long)a->gate->shape[1]);
    job j = {(const float *)((const char *)a->gate->data + a->gate->byte_offset),
             (const float *)((const char *)a->up->data + a->up->byte_offset),
             (float *)((char *)a->y->data + a->y->byte_offset),
             a->gate->shape[0] * a->gate->shape[1], a->act_type};
    host->parallel_for(host->host_ctx, (j.n + 1023) / 1024, chunk, &j);
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
#if ACT_SIMD
    .cpu_features = KHUB_CPU_AVX2 | KHUB_CPU_FMA,
    .priority = 40,
#else
    .priority = 15,
#endif
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "silu_and_mul", .kind = KHUB_OP_ACTIVATION,
     .caps = &caps, .run = silu_and_mul},
};

khub_status khub_activation_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                                 size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/activation",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = (void *)host};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_activation_init, "kernels-community/activation", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_ACTIVATION))
