/*
 * test_kv_strategies.c: the cache strategies of ref-cpu (issue 13 item 4)
 * through the same fake host as test_ref_ops (leaks and every message
 * checked): the quantized caches' write/view/truncate semantics, their
 * round-trip error bounds against the group scales, the residual window
 * kept exact, memory per token, and refused options.
 */
#include <dlfcn.h>
#include <stdarg.h>

#include <khub/khub_plugin.h>

#include "../plugins/include/khub_plugin_util.h"
#include <khub/khub.h>
#include "gguf.h"
#include "ref_oracle.h"
#include "runner.h"

/* ------------------------------------------------------------------------ */
/* The fake host                                                            */
/* ------------------------------------------------------------------------ */

static char g_err[1024];
static int g_live;        /* blocks allocated and not freed */
static int g_fail_allocs; /* when > 0, the g_fail_allocs-th alloc from now fails */
static int g_live_base;   /* g_live after setup (the plugin state) */

#define ASSERT_NO_LEAKS() ASSERT_EQ(g_live, g_live_base)

static void th_log(void *ctx, khub_log_level lv, const char *fmt, ...)
{
    (void)ctx, (void)lv, (void)fmt;
}

static khub_status th_fail(void *ctx, khub_status st, const char *fmt, ...)
{
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return st;
}

static void *th_alloc(void *ctx, size_t n)
{
    (void)ctx;
    if (g_fail_allocs > 0 && --g_fail_allocs == 0) return NULL;
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    if (p) g_live++;
    return p;
}

static void th_free(void *ctx, void *p)
{
    (void)ctx;
    if (p) g_live--;
    free(p);
}

static void th_parallel_for(void *ctx, int64_t n, khub_range_fn fn, void *ud)
{
    (void)ctx;
    int64_t a = n / 3, b = 2 * n / 3;
    if (a > 0) fn(ud, 0, a, 0);
    if (b > a) fn(ud, a, b, 1);
    if (n > b) fn(ud, b, n, 2);
}

static int th_n_threads(void *ctx) { return (void)ctx, 3; }
static uint32_t th_cpu(void *ctx) { return (void)ctx, 0u; }

static khub_host_api g_host = {
    KHUB_STRUCT_INIT(khub_host_api),
    .log = th_log,
    .fail = th_fail,
    .alloc = th_alloc,
    .free = th_free,
    .parallel_for = th_parallel_for,
    .n_threads = th_n_threads,
    .cpu_features = th_cpu,
};

static khub_plugin_desc g_desc;

static khub_plugin_init_fn load_entry(void)
{
    void *h = dlopen(KHUB_PLUGIN_DIR_BUILD "/ref-cpu.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) TEST_FAIL_("dlopen ref-cpu.so: %s", dlerror());
    khub_plugin_init_fn init = (khub_plugin_init_fn)(uintptr_t)dlsym(h, KHUB_PLUGIN_ENTRY);
    ASSERT(init != NULL);
    return init;
}

static void setup(void)
{
    khub_plugin_init_fn init = load_entry();
    memset(&g_desc, 0, sizeof g_desc);
    g_desc.struct_size = sizeof g_desc;
    char eb[256] = "";
    ASSERT_OK(init(&g_host, &g_desc, eb, sizeof eb));
    g_live_base = g_live;
}

static const khub_op_desc *op(const char *name)
{
    for (uint32_t i = 0; i < g_desc.n_ops; i++)
        if (strcmp(g_desc.ops[i].name, name) == 0) return &g_desc.ops[i];
    TEST_FAIL_("op %s not found", name);
}

/* Asserts the status and that the message names the problem. */
#define ASSERT_FAILS(expr, st, needle) \
    do { \
        g_err[0] = '\0'; \
        ASSERT_STATUS((expr), (st)); \
        ASSERT_CONTAINS(g_err, (needle)); \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct tens {
    khub_tensor t;
    int64_t shape[4];
    int64_t strides[4];
} tens;

/* A compact (strides NULL) tensor of up to 3 dims; unused dims are 0. */
static khub_tensor *mk(tens *s, void *data, khub_dtype dt, int ndim, int64_t d0, int64_t d1,
                       int64_t d2)
{
    memset(s, 0, sizeof *s);
    s->shape[0] = d0, s->shape[1] = d1, s->shape[2] = d2;
    s->t = (khub_tensor){
        .data = data, .device = {KHUB_DEVICE_CPU, 0}, .ndim = ndim, .dtype = dt, .shape = s->shape};
    return &s->t;
}

static float *fbuf(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    ASSERT(p != NULL);
    return p;
}

static khub_kv_cache *cache_new(const char *name, int32_t layers, int32_t H, int32_t D,
                                int32_t seqs, int64_t max_tokens, khub_dtype dt,
                                const char *options)
{
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = layers,
                                .n_kv_heads = H,
                                .head_dim = D,
                                .n_seqs = seqs,
                                .max_tokens = max_tokens,
                                .dtype = dt,
                                .options = options};
    khub_kv_cache *c = NULL;
    const khub_kv_cache_methods *m = op(name)->methods;
    ASSERT_OK(m->create(g_desc.state, &cfg, &c));
    ASSERT(c != NULL);
    return c;
}

static khub_status put(const char *name, khub_kv_cache *c, int32_t layer, int32_t seq, int64_t pos,
                       float *k, float *v, int64_t n, int64_t H, int64_t D)
{
    tens tk, tv;
    khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                            .layer = layer,
                            .seq = seq,
                            .pos = pos,
                            .k = mk(&tk, k, KHUB_DTYPE_F32, 3, n, H, D),
                            .v = mk(&tv, v, KHUB_DTYPE_F32, 3, n, H, D)};
    g_err[0] = '\0';
    const khub_kv_cache_methods *m = op(name)->methods;
    return m->write(g_desc.state, c, &w);
}

static float view_at(const khub_tensor *t, int64_t i, int64_t h, int64_t d)
{
    int64_t off = i * t->strides[0] + h * t->strides[1] + d * t->strides[2];
    const void *base = khub_pu_base(t);
    if (t->dtype.bits == 32) return ((const float *)base)[off];
    return khub_pu_f16_to_f32(((const uint16_t *)base)[off]);
}

/* The largest error a group of G values of x may get: half a step of the
 * group's scale (int8: absmax / 127; int4: (max - min) / 15), plus f16
 * rounding of the stored scale and minimum. */
static double group_bound(const float *x, int64_t G, int bits)
{
    float lo = x[0], hi = x[0], amax = 0;
    for (int64_t i = 0; i < G; i++) {
        lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
        amax = fmaxf(amax, fabsf(x[i]));
    }
    double step = bits == 8 ? amax / 127.0 : (hi - lo) / 15.0;
    double mnerr = bits == 8 ? 0 : fabs(lo) / 1024.0;
    return 0.5 * step * 1.01 + mnerr + (bits == 8 ? 128 : 16) * step / 1024.0;
}

/* int8 and int4, f32 and f16 views: 50 tokens written as 7 + 43 with a
 * residual window of 8 and groups of 4 along head_dim 8: positions 0..41
 * are quantized within their groups' bounds (and not all exact), 42..49
 * are bit-exact; truncate and rewrite keep the semantics of the dense
 * cache; memory reports the record size per token. */
TEST_IMPL(quantized_round_trip_and_residual)
{
    setup();
    const int64_t H = 2, D = 8, N = 50, R = 8, G = 4;
    for (int bits = 4; bits <= 8; bits += 4) {
        for (int f16 = 0; f16 < 2; f16++) {
            const char *name = bits == 8 ? "quantized_cache" : "quantized_cache_int4";
            const khub_kv_cache_methods *m = op(name)->methods;
            khub_kv_cache *c = cache_new(name, 2, (int32_t)H, (int32_t)D, 2, 64,
                                         f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32,
                                         "q_group_size=4,residual_length=8");
            float *k = fbuf((size_t)(N * H * D)), *v = fbuf((size_t)(N * H * D));
            oracle_rng r = {7};
            oracle_fill(&r, k, (size_t)(N * H * D), -3, 3);
            oracle_fill(&r, v, (size_t)(N * H * D), -1, 2);
            ASSERT_OK(put(name, c, 1, 0, 0, k, v, 7, H, D));
            ASSERT_OK(put(name, c, 1, 0, 7, k + 7 * H * D, v + 7 * H * D, N - 7, H, D));
            int64_t ks[3], kst[3], vs[3], vst[3];
            khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
            ASSERT_OK(m->view(g_desc.state, c, 1, 0, N, &kt, &vt));
            ASSERT_EQ(ks[0], N);
            ASSERT_EQ(ks[1], H);
            ASSERT_EQ(ks[2], D);
            ASSERT_EQ(kt.dtype.bits, f16 ? 16 : 32);
            int inexact = 0;
            double worst = 0;
            for (int64_t i = 0; i < N * H * D; i++) {
                int64_t t = i / (H * D), h = (i / D) % H, d = i % D;
                const float *kg = k + (i / G) * G, *vg = v + (i / G) * G;
                float gk = view_at(&kt, t, h, d), gv = view_at(&vt, t, h, d);
                if (t >= N - R) { /* the residual window: exact (f16: rounded once) */
                    float wk = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(k[i])) : k[i];
                    float wv = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(v[i])) : v[i];
                    ASSERT(gk == wk && gv == wv);
                    continue;
                }
                double f16e = f16 ? 3.0 / 1024 : 0; /* the view's own f16 rounding */
                double ek = fabs(gk - k[i]), ev = fabs(gv - v[i]);
                ASSERT(ek <= group_bound(kg, G, bits) + f16e);
                ASSERT(ev <= group_bound(vg, G, bits) + f16e);
                inexact += ek > 0 || ev > 0;
                worst = fmax(worst, ek);
            }
            ASSERT(inexact > 0); /* the old positions really are quantized */
            printf("  int%d %s: worst K error %.4f\n", bits, f16 ? "f16" : "f32", worst);
            khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
            ASSERT_OK(m->memory(g_desc.state, c, &mem));
            /* per token and layer: codes H*D*bits/8, then per group of 4 an
             * f16 scale (int8) or scale and minimum (int4); K and V */
            uint64_t rec = (uint64_t)(H * D * bits / 8 + (H * D / G) * (bits == 8 ? 2 : 4));
            ASSERT_EQ(mem.bytes_per_token, rec * 2 * 2);
            ASSERT_EQ(mem.tokens_used, N);
            ASSERT_EQ(mem.tokens_capacity, 64);
            /* truncate into the quantized part, then rewrite: gaps refused */
            ASSERT_OK(m->truncate(g_desc.state, c, 0, 20));
            ASSERT_FAILS(put(name, c, 1, 0, 21, k, v, 1, H, D), KHUB_STATUS_INVALID_ARG,
                         "pos (got 21, want 0..20");
            ASSERT_FAILS(m->view(g_desc.state, c, 1, 0, 21, &kt, &vt), KHUB_STATUS_INVALID_ARG,
                         "n (got 21, want 0..20, the length of layer 1 seq 0)");
            ASSERT_OK(put(name, c, 1, 0, 20, k, v, 1, H, D)); /* position 20 = token 0 */
            ASSERT_OK(m->view(g_desc.state, c, 1, 0, 21, &kt, &vt));
            float w0 = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(k[3])) : k[3];
            ASSERT(view_at(&kt, 20, 0, 3) == w0); /* newest: in the residual, exact */
            m->destroy(g_desc.state, c);
            free(k), free(v);
        }
    }
    ASSERT_NO_LEAKS();
}

/* residual_length 0 quantizes every token at once; a rewrite below the
 * quantized boundary requantizes in place; the default group is 64. */
TEST_IMPL(quantized_no_residual_and_rewrite)
{
    setup();
    const int64_t H = 1, D = 64, N = 5;
    const char *name = "quantized_cache_int4";
    const khub_kv_cache_methods *m = op(name)->methods;
    khub_kv_cache *c = cache_new(name, 1, 1, 64, 1, 16, KHUB_DTYPE_F32, "residual_length=0");
    float k[5 * 64], v[5 * 64];
    for (int i = 0; i < N * D; i++) k[i] = (float)(i % 16), v[i] = (float)(i % 16) - 8;
    ASSERT_OK(put(name, c, 0, 0, 0, k, v, N, H, D));
    int64_t ks[3], kst[3], vs[3], vst[3];
    khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
    ASSERT_OK(m->view(g_desc.state, c, 0, 0, N, &kt, &vt));
    /* 0..15 in a group: min 0, step 1, exactly representable */
    for (int i = 0; i < N * D; i++) ASSERT(view_at(&kt, i / D, 0, i % D) == k[i]);
    float k2[64], v2[64];
    for (int i = 0; i < D; i++) k2[i] = 100.0f, v2[i] = -100.0f;
    ASSERT_OK(put(name, c, 0, 0, 2, k2, v2, 1, H, D)); /* rewrite position 2 */
    ASSERT_OK(m->view(g_desc.state, c, 0, 0, N, &kt, &vt));
    ASSERT(view_at(&kt, 2, 0, 5) == 100.0f && view_at(&vt, 2, 0, 5) == -100.0f);
    ASSERT(view_at(&kt, 3, 0, 5) == k[3 * 64 + 5]);
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    ASSERT_OK(m->memory(g_desc.state, c, &mem));
    ASSERT_EQ(mem.bytes_per_token, (64 / 2 + 4) * 2); /* one group of 64: 36 bytes, K and V */
    m->destroy(g_desc.state, c);
    ASSERT_NO_LEAKS();
}

/* Bad options are refused with the cache, the key and what it accepts. */
TEST_IMPL(quantized_bad_options)
{
    setup();
    const khub_kv_cache_methods *m = op("quantized_cache")->methods;
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 1,
                                .n_kv_heads = 2,
                                .head_dim = 8,
                                .n_seqs = 1,
                                .max_tokens = 8,
                                .dtype = KHUB_DTYPE_F32};
    khub_kv_cache *c = NULL;
    static const struct {
        const char *opts, *msg;
    } bad[] = {
        {"q_group_size=0", "quantized_cache.create: q_group_size (got 0, want a divisor of "
                           "head_dim 8)"},
        {"q_group_size=3", "q_group_size (got 3, want a divisor of head_dim 8)"},
        {"q_group_size=1", "q_group_size (got 1, want an even number)"},
        {"q_group_size=-4", "option q_group_size (got \"-4\", want a non-negative integer)"},
        {"group=4", "quantized_cache.create: unknown option \"group\" (keys: q_group_size, "
                    "residual_length)"},
        {"residual_length", "option \"residual_length\" is not key=value"},
        {"residual_length=99999999999999999999", "option residual_length (got 9999"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg.options = bad[i].opts;
        ASSERT_FAILS(m->create(g_desc.state, &cfg, &c), KHUB_STATUS_INVALID_ARG, bad[i].msg);
        ASSERT(c == NULL);
    }
    /* a 1.3 host's config (40 bytes) has no options: defaults apply */
    cfg.options = "q_group_size=0";
    cfg.struct_size = 40;
    ASSERT_OK(m->create(g_desc.state, &cfg, &c));
    m->destroy(g_desc.state, c);
    ASSERT_NO_LEAKS();
}

#define TEST_LIST(X) \
    X(quantized_round_trip_and_residual) \
    X(quantized_no_residual_and_rewrite) \
    X(quantized_bad_options)
TEST_MAIN(TEST_LIST)
