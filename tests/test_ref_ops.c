/*
 * test_ref_ops.c: the ref-cpu plugin against double-precision oracles.
 *
 * The plugin is dlopened from the build (KHUB_PLUGIN_DIR_BUILD/ref-cpu.so)
 * and driven through a small host table built here: parallel_for runs inline
 * but in three chunks (so a body that ignores begin/end fails), alloc counts
 * live blocks (so leaks fail), fail records the message for ASSERT_CONTAINS.
 * Every op is compared with tests/ref_oracle.h on fixed-seed random inputs;
 * NMSE is printed and bounded. The GGUF and NF4 dequantizers are checked
 * bit for bit against hand-built blocks and the oracle's loop-order
 * dequantizers. Every INVALID_ARG path asserts the status and the message.
 */
#include "gguf.h"
#include "kv_host.h"
#include "ref_oracle.h"

/* ------------------------------------------------------------------------ */
/* The fake host and tensors are kv_host.h's; this file adds these          */
/* ------------------------------------------------------------------------ */

static khub_status run(const char *name, const void *args)
{
    g_err[0] = '\0';
    return op(name)->run(g_desc.state, args);
}

/* Gives s explicit element strides. */
static khub_tensor *strided(tens *s, int64_t s0, int64_t s1, int64_t s2)
{
    s->strides[0] = s0, s->strides[1] = s1, s->strides[2] = s2;
    s->t.strides = s->strides;
    return &s->t;
}

static double *dbuf(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    ASSERT(p != NULL);
    return p;
}

/* ------------------------------------------------------------------------ */
/* Plugin descriptor                                                        */
/* ------------------------------------------------------------------------ */

TEST_IMPL(descriptor)
{
    setup();
    ASSERT_STR_EQ(g_desc.id, "khub/ref-cpu");
    ASSERT_STR_EQ(g_desc.version, "0.1.0");
    /* quantized caches, paged_cache, paged_attention, sliding_cache and
     * offloaded_cache (1.4), embedding (1.5) */
    ASSERT_EQ(g_desc.n_ops, 15);
    static const struct {
        const char *name;
        uint32_t kind;
        uint32_t flags;
    } want[] = {
        {"attention", KHUB_OP_ATTENTION,
         KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_MASK | KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16 |
             KHUB_CAP_SLIDING},
        {"linear", KHUB_OP_LINEAR, KHUB_CAP_BIAS},
        {"qlinear", KHUB_OP_QLINEAR, KHUB_CAP_BIAS},
        {"kv_cache", KHUB_OP_KV_CACHE, KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16},
        {"rms_norm", KHUB_OP_NORM, KHUB_CAP_RESIDUAL},
        {"silu_and_mul", KHUB_OP_ACTIVATION, 0},
        {"rotary", KHUB_OP_ROTARY, 0},
        {"static_cache", KHUB_OP_KV_CACHE, KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16},
        {"quantized_cache", KHUB_OP_KV_CACHE, KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16},
        {"quantized_cache_int4", KHUB_OP_KV_CACHE, KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16},
        {"paged_cache", KHUB_OP_KV_CACHE, KHUB_CAP_KV_F16},
        {"paged_attention", KHUB_OP_PAGED_ATTENTION,
         KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING},
        {"sliding_cache", KHUB_OP_KV_CACHE, KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16},
        {"offloaded_cache", KHUB_OP_KV_CACHE, KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16},
        {"embedding", KHUB_OP_EMBEDDING, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const khub_op_desc *d = op(want[i].name);
        ASSERT_EQ(d->kind, want[i].kind);
        ASSERT_EQ(d->caps->flags, want[i].flags);
        ASSERT_EQ(d->caps->device_type, KHUB_DEVICE_CPU);
        ASSERT_EQ(d->caps->cpu_features, 0);
        ASSERT(d->caps->head_dims == NULL);
        ASSERT_EQ(d->run == NULL, want[i].kind == KHUB_OP_KV_CACHE);
    }
    ASSERT(op("qlinear")->methods != NULL);
    ASSERT(op("kv_cache")->methods != NULL);
    ASSERT(op("static_cache")->methods != NULL);
    ASSERT_EQ(op("kv_cache")->caps->priority, 0);
    ASSERT_EQ(op("static_cache")->caps->priority, -1); /* only when named */
    ASSERT_EQ(op("paged_cache")->caps->priority, -1);  /* only when named */
    ASSERT_EQ(op("sliding_cache")->caps->priority, -1);
    ASSERT_EQ(op("offloaded_cache")->caps->priority, -1);
    ASSERT_EQ(op("paged_cache")->caps->kv_layouts, KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD));
    ASSERT_EQ(op("kv_cache")->caps->kv_layouts, 0); /* dense */
    for (int f = 1; f < KHUB_QFORMAT__COUNT; f++) {
        ASSERT(op("qlinear")->caps->dtypes & KHUB_DTYPE_BIT_Q(f));
        ASSERT(op("embedding")->caps->dtypes & KHUB_DTYPE_BIT_Q(f));
    }
    ASSERT_EQ(op("embedding")->caps->kind_flags, KHUB_EMBEDDING_SCALE | KHUB_EMBEDDING_STRIDED_OUT);
    ASSERT(g_desc.score(g_desc.state) > 0);
    char eb[128] = "";
    ASSERT_OK(g_desc.selftest(g_desc.state, eb, sizeof eb));
    ASSERT_STR_EQ(eb, "");
    g_desc.shutdown(g_desc.state);
    ASSERT_EQ(g_live, 0);
}

TEST_IMPL(init_rejects_short_host)
{
    khub_plugin_init_fn init = load_entry();
    khub_host_api short_host = g_host;
    short_host.struct_size = offsetof(khub_host_api, parallel_for);
    khub_plugin_desc d = {.struct_size = sizeof d};
    char eb[256] = "";
    ASSERT_STATUS(init(&short_host, &d, eb, sizeof eb), KHUB_STATUS_STRUCT_SIZE);
    ASSERT_CONTAINS(eb, "host table lacks");
    g_fail_allocs = 1;
    ASSERT_STATUS(init(&g_host, &d, eb, sizeof eb), KHUB_STATUS_NOMEM);
    ASSERT_CONTAINS(eb, "out of memory");
}

/* ------------------------------------------------------------------------ */
/* Half precision                                                           */
/* ------------------------------------------------------------------------ */

TEST_IMPL(half_conversions)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = khub_pu_f16_to_f32((uint16_t)h);
        ASSERT_EQ(f == f, !(((h >> 10) & 31) == 31 && (h & 1023)));
        if (f == f)
            ASSERT_EQ(khub_pu_f32_to_f16(f), h);
        else
            ASSERT(khub_pu_f16_to_f32(khub_pu_f32_to_f16(f)) != f); /* NaN stays NaN */
        ASSERT((double)f == (double)oracle_f16((const uint8_t[]){h & 255, h >> 8}) || f != f);
    }
    ASSERT_EQ(khub_pu_f32_to_f16(65519.0f), 0x7bff);
    ASSERT_EQ(khub_pu_f32_to_f16(65520.0f), 0x7c00);            /* tie to even: inf */
    ASSERT_EQ(khub_pu_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie to even: down */
    ASSERT_EQ(khub_pu_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie to even: up */
    ASSERT_EQ(khub_pu_f32_to_f16(0x1p-25f), 0x0000);            /* tie between 0 and 2^-24 */
    ASSERT_EQ(khub_pu_f32_to_f16(0x1.01p-25f), 0x0001);
    ASSERT_EQ(khub_pu_f32_to_f16(-0x1.8p-24f), 0x8002);  /* subnormal tie to even */
    ASSERT_EQ(khub_pu_f32_to_f16(0x1.ffcp-15f), 0x0400); /* rounds up into the normals */
    ASSERT_EQ(khub_pu_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    ASSERT_EQ(khub_pu_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    ASSERT_EQ(khub_pu_f32_to_bf16(NAN) & 0x7fc0, 0x7fc0);
    /* Random floats round to the nearest half: the error is at most half an
     * ulp of the result. */
    oracle_rng r = {7};
    for (int i = 0; i < 100000; i++) {
        float x = oracle_uniform(&r, -70000.0f, 70000.0f) * powf(2.0f, (float)(i % 40 - 30));
        uint16_t h = khub_pu_f32_to_f16(x);
        float y = khub_pu_f16_to_f32(h);
        if (isinf(y)) {
            ASSERT_LE(65520.0, fabs((double)x));
            continue;
        }
        /* the spacing on x's side of y (it halves below a power of two) */
        uint16_t nb = fabs((double)x) > fabs((double)y) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
        double ulp = (h & 0x7fff) == 0 ? 0x1p-24 : fabs((double)khub_pu_f16_to_f32(nb) - y);
        ASSERT_LE(fabs((double)x - y), ulp / 2 * (1 + 1e-12));
    }
}

/* ------------------------------------------------------------------------ */
/* Attention                                                                */
/* ------------------------------------------------------------------------ */

typedef struct attn_case {
    int64_t n_q, n_kv, H, Hkv, D, q_pos0, window;
    int causal, use_mask, strided_q;
} attn_case;

/* Runs the op and the oracle on case c with f32 K/V; returns the NMSE. */
static double attn_nmse(const attn_case *c, uint64_t seed)
{
    oracle_rng r = {seed};
    int64_t nq = c->n_q * c->H * c->D, nk = c->n_kv * c->Hkv * c->D;
    /* q lives inside a wider row (as in a fused qkv buffer) when strided_q. */
    int64_t qrow = c->H * c->D + (c->strided_q ? 3 * c->D + 5 : 0);
    float *qbig = fbuf((size_t)(c->n_q * qrow)), *q = fbuf((size_t)nq);
    float *k = fbuf((size_t)nk), *v = fbuf((size_t)nk), *out = fbuf((size_t)nq);
    float *mask = fbuf((size_t)(c->n_q * c->n_kv));
    oracle_fill(&r, qbig, (size_t)(c->n_q * qrow), -1.0f, 1.0f);
    oracle_fill(&r, k, (size_t)nk, -1.0f, 1.0f);
    oracle_fill(&r, v, (size_t)nk, -1.0f, 1.0f);
    for (int64_t i = 0; i < c->n_q * c->n_kv; i++)
        mask[i] = (oracle_next(&r) % 5 == 0) ? -INFINITY : oracle_uniform(&r, -2.0f, 0.5f);
    for (int64_t i = 0; i < c->n_q; i++)
        memcpy(q + i * c->H * c->D, qbig + i * qrow, (size_t)(c->H * c->D) * sizeof(float));
    tens tq, tk, tv, tm, to;
    mk(&tq, c->strided_q ? qbig : q, KHUB_DTYPE_F32, 3, c->n_q, c->H, c->D);
    if (c->strided_q) strided(&tq, qrow, c->D, 1);
    khub_attention_args a = {
        KHUB_STRUCT_INIT(khub_attention_args),
        .q = &tq.t,
        .k = mk(&tk, k, KHUB_DTYPE_F32, 3, c->n_kv, c->Hkv, c->D),
        .v = mk(&tv, v, KHUB_DTYPE_F32, 3, c->n_kv, c->Hkv, c->D),
        .mask = c->use_mask ? mk(&tm, mask, KHUB_DTYPE_F32, 2, c->n_q, c->n_kv, 0) : NULL,
        .out = mk(&to, out, KHUB_DTYPE_F32, 3, c->n_q, c->H, c->D),
        .scale = 1.0f / sqrtf((float)c->D),
        .causal = (uint32_t)c->causal,
        .q_pos0 = c->q_pos0,
        .window = c->window};
    ASSERT_OK(run("attention", &a));
    double *want = dbuf((size_t)nq), *scratch = dbuf((size_t)c->n_kv);
    oracle_attention(q, k, v, c->use_mask ? mask : NULL, c->n_q, c->n_kv, c->H, c->Hkv, c->D,
                     (double)a.scale, c->causal, c->q_pos0, c->window, scratch, want);
    double e = oracle_nmse(out, want, (size_t)nq);
    free(qbig), free(q), free(k), free(v), free(out), free(mask), free(want), free(scratch);
    ASSERT_NO_LEAKS();
    return e;
}

TEST_IMPL(attention_vs_oracle)
{
    setup();
    static const attn_case cases[] = {
        /* n_q n_kv  H Hkv  D  pos0 win causal mask strided_q */
        {1, 37, 9, 3, 64, 36, 0, 1, 0, 0},  /* SmolLM2 decode */
        {6, 6, 9, 3, 64, 0, 0, 1, 0, 1},    /* SmolLM2 prefill, q inside qkv rows */
        {5, 19, 4, 2, 128, 14, 0, 1, 0, 0}, /* head_dim 128, chunked prefill */
        {7, 23, 6, 2, 32, 16, 0, 1, 1, 0},  /* additive mask with -inf */
        {7, 23, 6, 6, 32, 16, 8, 1, 0, 0},  /* sliding window 8, MHA */
        {4, 11, 2, 1, 16, 0, 0, 0, 1, 1},   /* non-causal with mask, MQA */
        {3, 40, 8, 2, 80, 37, 5, 1, 1, 0},  /* everything */
        {2, 9, 3, 3, 7, 3, 0, 1, 0, 0},     /* odd head dim */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double e = attn_nmse(&cases[i], 100 + i);
        fprintf(stderr, "  attention case %zu: nmse %.3g\n", i, e);
        ASSERT_LE(e, 1e-12);
    }
}

/* A query whose visible keys are all masked with -inf gets zeros; the
 * causal bound hides future keys (changing them changes nothing). */
TEST_IMPL(attention_edges)
{
    setup();
    float q[2 * 4] = {1, 2, 3, 4, -1, 0.5f, 0, 2}, k[3 * 4], v[3 * 4], out[2 * 4];
    float mask[2 * 3] = {-INFINITY, -INFINITY, -INFINITY, 0, 0, 0};
    oracle_rng r = {3};
    oracle_fill(&r, k, 12, -1, 1);
    oracle_fill(&r, v, 12, -1, 1);
    tens tq, tk, tv, tm, to;
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = mk(&tq, q, KHUB_DTYPE_F32, 3, 2, 1, 4),
                             .k = mk(&tk, k, KHUB_DTYPE_F32, 3, 3, 1, 4),
                             .v = mk(&tv, v, KHUB_DTYPE_F32, 3, 3, 1, 4),
                             .mask = mk(&tm, mask, KHUB_DTYPE_F32, 2, 2, 3, 0),
                             .out = mk(&to, out, KHUB_DTYPE_F32, 3, 2, 1, 4),
                             .scale = 0.5f,
                             .causal = 1,
                             .q_pos0 = 1};
    ASSERT_OK(run("attention", &a));
    for (int d = 0; d < 4; d++) ASSERT_EQ(out[d], 0.0f);
    float keep = out[4];
    k[2 * 4] += 5.0f, v[2 * 4] += 5.0f; /* key 2 is visible to query 1 (pos 2) */
    ASSERT_OK(run("attention", &a));
    ASSERT(out[4] != keep);
    a.q_pos0 = 0; /* now query 1 sits at pos 1 and key 2 is in its future */
    ASSERT_OK(run("attention", &a));
    keep = out[4];
    k[2 * 4] -= 9.0f, v[2 * 4] -= 9.0f;
    ASSERT_OK(run("attention", &a));
    ASSERT_EQ(out[4], keep);
    /* an empty key sequence: every output is zero */
    tk.shape[0] = tv.shape[0] = 0;
    a.mask = NULL;
    out[0] = 7;
    ASSERT_OK(run("attention", &a));
    ASSERT_EQ(out[0], 0.0f);
}

TEST_IMPL(attention_invalid_args)
{
    setup();
    float q[4 * 8 * 2], k[3 * 2 * 8], v[3 * 2 * 8], out[4 * 8 * 2], mask[12];
    memset(q, 0, sizeof q), memset(k, 0, sizeof k), memset(v, 0, sizeof v);
    memset(mask, 0, sizeof mask);
    tens tq, tk, tv, tm, to;
#define ATTN_RESET() \
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args), \
                             .q = mk(&tq, q, KHUB_DTYPE_F32, 3, 4, 4, 2), \
                             .k = mk(&tk, k, KHUB_DTYPE_F32, 3, 3, 2, 2), \
                             .v = mk(&tv, v, KHUB_DTYPE_F32, 3, 3, 2, 2), \
                             .mask = mk(&tm, mask, KHUB_DTYPE_F32, 2, 4, 3, 0), \
                             .out = mk(&to, out, KHUB_DTYPE_F32, 3, 4, 4, 2), \
                             .scale = 1.0f, \
                             .causal = 1}
    {
        ATTN_RESET();
        ASSERT_OK(run("attention", &a));
        a.struct_size = 8;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: args.struct_size (got 8, want >= ");
    }
    {
        ATTN_RESET();
        tk.shape[1] = 3, tv.shape[1] = 3;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "k.shape[1] (n_kv_heads) (got 3, want a divisor of n_heads 4)");
    }
    {
        ATTN_RESET();
        tv.shape[0] = 2;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: v.shape[0] (n_kv) (got 2, want 3)");
    }
    {
        ATTN_RESET();
        tk.shape[2] = 3;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: k.shape[2] (head_dim) (got 3, want 2)");
    }
    {
        ATTN_RESET();
        tq.t.ndim = 2;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: q.ndim (got 2, want 3)");
    }
    {
        ATTN_RESET();
        tk.t.dtype = KHUB_DTYPE_BF16;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG, "attention: k.dtype (got bf16");
    }
    {
        ATTN_RESET();
        tm.shape[1] = 4;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: mask.shape[1] (n_kv) (got 4, want 3)");
    }
    {
        ATTN_RESET();
        to.shape[1] = 2;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: out.shape[1] (n_heads) (got 2, want 4)");
    }
    {
        ATTN_RESET();
        a.q_pos0 = -1;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: q_pos0 -1 / window 0 (want both >= 0)");
    }
    {
        ATTN_RESET();
        a.causal = 2;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: causal (got 2, want 0 or 1)");
    }
    {
        ATTN_RESET();
        a.v = NULL;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: v is NULL (want a tensor)");
    }
    {
        ATTN_RESET();
        tv.t.data = NULL;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG, "attention: v.data is NULL");
    }
    {
        ATTN_RESET();
        tq.t.device.device_type = KHUB_DEVICE_CUDA;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: q.device_type (got 2, want 1)");
    }
    {
        ATTN_RESET();
        tk.shape[0] = -3;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: k.shape[0] (got -3, want >= 0)");
    }
    {
        ATTN_RESET();
        strided(&tk, INT64_MAX / 2, 2, 1);
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_OVERFLOW,
                     "attention: k spans more than 2^63");
    }
    {
        ATTN_RESET();
        a.out = &tq.t;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG, "attention: out aliases q");
    }
    {
        ATTN_RESET();
        a.scale = NAN;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_INVALID_ARG,
                     "attention: scale (got nan, want a finite number)");
    }
    {
        ATTN_RESET();
        g_fail_allocs = 1;
        ASSERT_FAILS(run("attention", &a), KHUB_STATUS_NOMEM, "attention: out of memory");
    }
#undef ATTN_RESET
    ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------------ */
/* KV cache and attention over its views                                    */
/* ------------------------------------------------------------------------ */

/* The default cache ("kv_cache") through kv_host.h's helpers. */
static khub_kv_cache *kv_new(khub_dtype dt, int32_t layers, int32_t H, int32_t D, int32_t seqs,
                             int64_t max_tokens)
{
    return cache_new("kv_cache", layers, H, D, seqs, max_tokens, dt, NULL);
}

static khub_status kv_put(khub_kv_cache *c, int32_t layer, int32_t seq, int64_t pos, float *k,
                          float *v, int64_t n, int64_t H, int64_t D)
{
    return put("kv_cache", c, layer, seq, pos, k, v, n, H, D);
}

TEST_IMPL(kv_cache_grow_view_truncate)
{
    setup();
    const int64_t H = 3, D = 8, N = 37;
    for (int f16 = 0; f16 < 2; f16++) {
        khub_kv_cache *c = kv_new(f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32, 2, 3, 8, 2, 100);
        float *k = fbuf((size_t)(N * H * D)), *v = fbuf((size_t)(N * H * D));
        oracle_rng r = {11};
        oracle_fill(&r, k, (size_t)(N * H * D), -3, 3);
        oracle_fill(&r, v, (size_t)(N * H * D), -3, 3);
        /* 5 + 20 + 12 tokens: storage grows 16 -> 32 -> 64 */
        ASSERT_OK(kv_put(c, 1, 1, 0, k, v, 5, H, D));
        ASSERT_OK(kv_put(c, 1, 1, 5, k + 5 * H * D, v + 5 * H * D, 20, H, D));
        ASSERT_OK(kv_put(c, 1, 1, 25, k + 25 * H * D, v + 25 * H * D, 12, H, D));
        int64_t ks[3], kst[3], vs[3], vst[3];
        khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
        ASSERT_OK(kvm("kv_cache")->view(g_desc.state, c, 1, 1, N, &kt, &vt));
        ASSERT_EQ(kt.ndim, 3);
        ASSERT_EQ(ks[0], N);
        ASSERT_EQ(ks[1], H);
        ASSERT_EQ(ks[2], D);
        ASSERT_EQ(kst[0], D);
        ASSERT_EQ(kst[1], 64 * D);
        ASSERT_EQ(kst[2], 1);
        ASSERT_EQ(kt.dtype.bits, f16 ? 16 : 32);
        /* memory (ABI 1.4): one slot of 64 tokens allocated, 37 used */
        khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
        uint64_t es = f16 ? 2 : 4;
        ASSERT_OK(kvm("kv_cache")->memory(g_desc.state, c, &mem));
        ASSERT_EQ(mem.bytes_per_token, 2 * H * D * es * 2); /* 2 layers, K and V */
        ASSERT_EQ(mem.bytes_total, 64 * H * D * es * 2);
        ASSERT_EQ(mem.tokens_capacity, 100);
        ASSERT_EQ(mem.tokens_used, N);
        for (int64_t i = 0; i < N * H * D; i++) {
            int64_t t = i / (H * D), h = (i / D) % H, d = i % D;
            float wk = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(k[i])) : k[i];
            float wv = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(v[i])) : v[i];
            ASSERT(view_at(&kt, t, h, d) == wk);
            ASSERT(view_at(&vt, t, h, d) == wv);
        }
        /* the other slots are untouched and empty */
        ASSERT_FAILS(kvm("kv_cache")->view(g_desc.state, c, 0, 1, 1, &kt, &vt),
                     KHUB_STATUS_INVALID_ARG,
                     "kv_cache.view: n (got 1, want 0..0, the length of layer 0 seq 1)");
        /* truncate, then rewrite from the cut */
        ASSERT_OK(kvm("kv_cache")->truncate(g_desc.state, c, 1, 10));
        ASSERT_FAILS(kvm("kv_cache")->view(g_desc.state, c, 1, 1, 11, &kt, &vt),
                     KHUB_STATUS_INVALID_ARG, "want 0..10");
        ASSERT_FAILS(kv_put(c, 1, 1, 11, k, v, 1, H, D), KHUB_STATUS_INVALID_ARG,
                     "kv_cache.write: pos (got 11, want 0..10");
        ASSERT_OK(kv_put(c, 1, 1, 10, k, v, 1, H, D));
        ASSERT_OK(kvm("kv_cache")->view(g_desc.state, c, 1, 1, 11, &kt, &vt));
        ASSERT(view_at(&kt, 10, 2, 7) ==
               (f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(k[2 * D + 7])) : k[2 * D + 7]));
        kvm("kv_cache")->destroy(g_desc.state, c);
        free(k), free(v);
    }
    kvm("kv_cache")->destroy(g_desc.state, NULL);
    ASSERT_NO_LEAKS();
}

/* The static cache (--cache static): a slot's first write allocates all of
 * max_tokens, so the view's storage and strides never change afterwards
 * (decoding never allocates); the dynamic cache's grow from 16. */
TEST_IMPL(static_cache_allocates_once)
{
    setup();
    const khub_kv_cache_methods *sm = op("static_cache")->methods;
    const int64_t H = 2, D = 4, MAX = 50;
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 2,
                                .n_kv_heads = (int32_t)H,
                                .head_dim = (int32_t)D,
                                .n_seqs = 2,
                                .max_tokens = MAX,
                                .dtype = KHUB_DTYPE_F32};
    khub_kv_cache *c = NULL;
    ASSERT_OK(sm->create(g_desc.state, &cfg, &c));
    ASSERT_EQ(g_live, g_live_base + 2); /* the cache and its slot table, no storage yet */
    float k[50 * 2 * 4], v[50 * 2 * 4];
    for (int i = 0; i < 50 * 2 * 4; i++) k[i] = (float)i, v[i] = -(float)i;
    tens tk, tv;
    khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                            .layer = 1,
                            .seq = 0,
                            .pos = 0,
                            .k = mk(&tk, k, KHUB_DTYPE_F32, 3, 3, H, D),
                            .v = mk(&tv, v, KHUB_DTYPE_F32, 3, 3, H, D)};
    ASSERT_OK(sm->write(g_desc.state, c, &w));
    int64_t ks[3], kst[3], vs[3], vst[3];
    khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
    ASSERT_OK(sm->view(g_desc.state, c, 1, 0, 3, &kt, &vt));
    ASSERT_EQ(kst[1], MAX * D); /* the whole capacity at once */
    void *kdata = kt.data, *vdata = vt.data;
    int live = g_live;
    for (int64_t pos = 3; pos < MAX; pos++) { /* decode one token at a time */
        w.pos = pos;
        w.k = mk(&tk, k + pos * H * D, KHUB_DTYPE_F32, 3, 1, H, D);
        w.v = mk(&tv, v + pos * H * D, KHUB_DTYPE_F32, 3, 1, H, D);
        ASSERT_OK(sm->write(g_desc.state, c, &w));
    }
    ASSERT_EQ(g_live, live); /* no allocation after the first write */
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    ASSERT_OK(sm->memory(g_desc.state, c, &mem));
    ASSERT_EQ(mem.bytes_total, MAX * H * D * 4 * 2); /* one slot, its whole capacity */
    ASSERT_EQ(mem.bytes_per_token, 2 * H * D * 4 * 2);
    ASSERT_EQ(mem.tokens_used, MAX);
    ASSERT_OK(sm->view(g_desc.state, c, 1, 0, MAX, &kt, &vt));
    ASSERT(kt.data == kdata && vt.data == vdata);
    ASSERT_EQ(kst[1], MAX * D);
    for (int64_t i = 0; i < MAX * H * D; i++) {
        int64_t t = i / (H * D), h = (i / D) % H, d = i % D;
        ASSERT(view_at(&kt, t, h, d) == k[i]);
        ASSERT(view_at(&vt, t, h, d) == v[i]);
    }
    w.pos = MAX;
    g_err[0] = '\0';
    ASSERT_STATUS(sm->write(g_desc.state, c, &w), KHUB_STATUS_CONTEXT_FULL);
    ASSERT_CONTAINS(g_err, "kv_cache.write: positions 50..50 exceed max_tokens 50");
    /* truncate keeps the storage in place */
    ASSERT_OK(sm->truncate(g_desc.state, c, 0, 10));
    w.pos = 10;
    ASSERT_OK(sm->write(g_desc.state, c, &w));
    ASSERT_OK(sm->view(g_desc.state, c, 1, 0, 11, &kt, &vt));
    ASSERT(kt.data == kdata);
    sm->destroy(g_desc.state, c);
    ASSERT_NO_LEAKS();
}

TEST_IMPL(kv_cache_context_full)
{
    setup();
    float k[40 * 2 * 4] = {0}, v[40 * 2 * 4] = {0};
    khub_kv_cache *c = kv_new(KHUB_DTYPE_F32, 1, 2, 4, 1, 40);
    ASSERT_OK(kv_put(c, 0, 0, 0, k, v, 17, 2, 4));
    ASSERT_OK(kv_put(c, 0, 0, 17, k, v, 23, 2, 4)); /* exactly max_tokens */
    int64_t s[3], st[3], s2[3], st2[3];
    khub_tensor kt = {.shape = s, .strides = st}, vt = {.shape = s2, .strides = st2};
    ASSERT_OK(kvm("kv_cache")->view(g_desc.state, c, 0, 0, 40, &kt, &vt));
    ASSERT_EQ(st[1], 40 * 4); /* growth stopped at max_tokens, not 64 */
    ASSERT_FAILS(kv_put(c, 0, 0, 40, k, v, 1, 2, 4), KHUB_STATUS_CONTEXT_FULL,
                 "kv_cache.write: positions 40..40 exceed max_tokens 40");
    ASSERT_OK(kvm("kv_cache")->truncate(g_desc.state, c, 0, 0));
    ASSERT_OK(kv_put(c, 0, 0, 0, k, v, 40, 2, 4));
    kvm("kv_cache")->destroy(g_desc.state, c);
    ASSERT_NO_LEAKS();
}

TEST_IMPL(kv_cache_invalid_args)
{
    setup();
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 2,
                                .n_kv_heads = 2,
                                .head_dim = 4,
                                .n_seqs = 1,
                                .max_tokens = 8,
                                .dtype = KHUB_DTYPE_BF16};
    khub_kv_cache *c = (khub_kv_cache *)&cfg;
    ASSERT_FAILS(kvm("kv_cache")->create(g_desc.state, &cfg, &c), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.create: dtype (got bf16, want f32 or f16)");
    ASSERT(c == NULL);
    cfg.dtype = KHUB_DTYPE_F16;
    cfg.head_dim = 0;
    ASSERT_FAILS(kvm("kv_cache")->create(g_desc.state, &cfg, &c), KHUB_STATUS_INVALID_ARG,
                 "head_dim 0, n_seqs 1, max_tokens 8; want all >= 1");
    cfg.head_dim = 1 << 30;
    cfg.n_kv_heads = 1 << 30;
    cfg.max_tokens = INT64_C(1) << 40;
    ASSERT_FAILS(kvm("kv_cache")->create(g_desc.state, &cfg, &c), KHUB_STATUS_OVERFLOW,
                 "overflows a slot (lower max_tokens)");
    cfg.head_dim = 4, cfg.n_kv_heads = 2, cfg.max_tokens = 8;
    cfg.struct_size = 4;
    ASSERT_FAILS(kvm("kv_cache")->create(g_desc.state, &cfg, &c), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.create: args.struct_size (got 4");
    cfg.struct_size = sizeof cfg;
    g_fail_allocs = 2;
    ASSERT_FAILS(kvm("kv_cache")->create(g_desc.state, &cfg, &c), KHUB_STATUS_NOMEM,
                 "out of memory");
    c = kv_new(KHUB_DTYPE_F16, 2, 2, 4, 1, 8);
    float k[3 * 2 * 4] = {0}, v[3 * 2 * 4] = {0};
    ASSERT_FAILS(kv_put(c, 2, 0, 0, k, v, 1, 2, 4), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.write: layer (got 2, want 0..1)");
    ASSERT_FAILS(kv_put(c, 0, -1, 0, k, v, 1, 2, 4), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.write: seq (got -1, want 0..0)");
    ASSERT_FAILS(kv_put(c, 0, 0, 0, k, v, 1, 3, 4), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.write: k.shape[1] (n_kv_heads) (got 3, want 2)");
    ASSERT_FAILS(kv_put(c, 0, 0, 0, k, v, 1, 2, 5), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.write: k.shape[2] (head_dim) (got 5, want 4)");
    g_fail_allocs = 1;
    ASSERT_FAILS(kv_put(c, 0, 0, 0, k, v, 1, 2, 4), KHUB_STATUS_NOMEM,
                 "kv_cache.write: out of memory growing a slot to 8 tokens");
    int64_t s[3], s2[3], st2[3];
    khub_tensor kt = {.shape = s, .strides = NULL}, vt = {.shape = s2, .strides = st2};
    ASSERT_FAILS(kvm("kv_cache")->view(g_desc.state, c, 0, 0, 0, &kt, &vt), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.view: k, k->shape or k->strides is NULL");
    ASSERT_FAILS(kvm("kv_cache")->truncate(g_desc.state, c, 0, -1), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.truncate: n (got -1, want >= 0)");
    ASSERT_FAILS(kvm("kv_cache")->truncate(g_desc.state, c, 1, 0), KHUB_STATUS_INVALID_ARG,
                 "kv_cache.truncate: seq (got 1, want 0..0)");
    kvm("kv_cache")->destroy(g_desc.state, c);
    ASSERT_NO_LEAKS();
}

/* Decode steps over f16 and f32 cache views (strided, head-major) against
 * the oracle on the rounded K/V. */
TEST_IMPL(attention_over_cache_views)
{
    setup();
    const int64_t H = 9, Hkv = 3, D = 64, N = 29;
    for (int f16 = 0; f16 < 2; f16++) {
        khub_kv_cache *c =
            kv_new(f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32, 1, (int32_t)Hkv, (int32_t)D, 1, 256);
        float *k = fbuf((size_t)(N * Hkv * D)), *v = fbuf((size_t)(N * Hkv * D));
        float *kr = fbuf((size_t)(N * Hkv * D)), *vr = fbuf((size_t)(N * Hkv * D));
        float *q = fbuf((size_t)(4 * H * D)), *out = fbuf((size_t)(4 * H * D));
        double *want = dbuf((size_t)(4 * H * D)), *scratch = dbuf((size_t)N);
        oracle_rng r = {21 + (uint64_t)f16};
        oracle_fill(&r, k, (size_t)(N * Hkv * D), -1, 1);
        oracle_fill(&r, v, (size_t)(N * Hkv * D), -1, 1);
        oracle_fill(&r, q, (size_t)(4 * H * D), -1, 1);
        for (int64_t i = 0; i < N * Hkv * D; i++) {
            kr[i] = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(k[i])) : k[i];
            vr[i] = f16 ? khub_pu_f16_to_f32(khub_pu_f32_to_f16(v[i])) : v[i];
        }
        /* prefill 25 tokens, then 4 decode steps of one token each */
        ASSERT_OK(kv_put(c, 0, 0, 0, k, v, 25, Hkv, D));
        for (int64_t step = 0; step < 4; step++) {
            int64_t n = 25 + step + 1;
            ASSERT_OK(
                kv_put(c, 0, 0, n - 1, k + (n - 1) * Hkv * D, v + (n - 1) * Hkv * D, 1, Hkv, D));
            int64_t ks[3], kst[3], vs[3], vst[3];
            khub_tensor kt = {.shape = ks, .strides = kst}, vt = {.shape = vs, .strides = vst};
            ASSERT_OK(kvm("kv_cache")->view(g_desc.state, c, 0, 0, n, &kt, &vt));
            ASSERT(!khub_pu_is_compact(&kt));
            tens tq, to;
            const float *qs = q + step * H * D;
            khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                                     .q = mk(&tq, (void *)qs, KHUB_DTYPE_F32, 3, 1, H, D),
                                     .k = &kt,
                                     .v = &vt,
                                     .out = mk(&to, out, KHUB_DTYPE_F32, 3, 1, H, D),
                                     .scale = 0.125f,
                                     .causal = 1,
                                     .q_pos0 = n - 1};
            ASSERT_OK(run("attention", &a));
            oracle_attention(qs, kr, vr, NULL, 1, n, H, Hkv, D, 0.125, 1, n - 1, 0, scratch, want);
            double e = oracle_nmse(out, want, (size_t)(H * D));
            fprintf(stderr, "  cache %s step %lld: nmse %.3g\n", f16 ? "f16" : "f32",
                    (long long)step, e);
            ASSERT_LE(e, 1e-12);
        }
        kvm("kv_cache")->destroy(g_desc.state, c);
        free(k), free(v), free(kr), free(vr), free(q), free(out), free(want), free(scratch);
    }
    ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------------ */
/* Linear                                                                   */
/* ------------------------------------------------------------------------ */

TEST_IMPL(linear_dtypes_vs_oracle)
{
    setup();
    const int64_t shapes[][3] = {{1, 70, 45}, {3, 64, 33}, {5, 576, 20}};
    for (size_t si = 0; si < 3; si++) {
        int64_t n = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
        float *x = fbuf((size_t)(n * in)), *w = fbuf((size_t)(out * in)), *b = fbuf((size_t)out);
        float *wr = fbuf((size_t)(out * in)), *y = fbuf((size_t)(n * out));
        uint16_t *wh = calloc((size_t)(out * in), 2);
        double *want = dbuf((size_t)(n * out));
        oracle_rng r = {31 + si};
        oracle_fill(&r, x, (size_t)(n * in), -1, 1);
        oracle_fill(&r, w, (size_t)(out * in), -0.5f, 0.5f);
        oracle_fill(&r, b, (size_t)out, -1, 1);
        for (int dt = 0; dt < 3; dt++) {
            khub_dtype wdt = dt == 0 ? KHUB_DTYPE_F32 : dt == 1 ? KHUB_DTYPE_F16 : KHUB_DTYPE_BF16;
            for (int64_t i = 0; i < out * in; i++) {
                if (dt == 1) wh[i] = khub_pu_f32_to_f16(w[i]), wr[i] = khub_pu_f16_to_f32(wh[i]);
                if (dt == 2) wh[i] = khub_pu_f32_to_bf16(w[i]), wr[i] = khub_pu_bf16_to_f32(wh[i]);
                if (dt == 0) wr[i] = w[i];
            }
            tens tx, tw, tb, ty;
            khub_linear_args a = {
                KHUB_STRUCT_INIT(khub_linear_args), .x = mk(&tx, x, KHUB_DTYPE_F32, 2, n, in, 0),
                .weight = mk(&tw, dt ? (void *)wh : w, wdt, 2, out, in, 0),
                .bias = (si != 1) ? mk(&tb, b, KHUB_DTYPE_F32, 1, out, 0, 0) : NULL,
                .y = mk(&ty, y, KHUB_DTYPE_F32, 2, n, out, 0)};
            ASSERT_OK(run("linear", &a));
            oracle_linear(x, wr, si != 1 ? b : NULL, n, in, out, want);
            double e = oracle_nmse(y, want, (size_t)(n * out));
            fprintf(stderr, "  linear %lldx%lldx%lld %s: nmse %.3g\n", (long long)n, (long long)in,
                    (long long)out, khub_pu_dtype_name(wdt), e);
            ASSERT_LE(e, 1e-13);
        }
        free(x), free(w), free(b), free(wr), free(y), free(wh), free(want);
    }
    ASSERT_NO_LEAKS();
}

TEST_IMPL(linear_invalid_args)
{
    setup();
    float x[2 * 8] = {0}, w[3 * 8] = {0}, b[3] = {0}, y[2 * 3];
    tens tx, tw, tb, ty;
#define LIN_RESET() \
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), \
                          .x = mk(&tx, x, KHUB_DTYPE_F32, 2, 2, 8, 0), \
                          .weight = mk(&tw, w, KHUB_DTYPE_F32, 2, 3, 8, 0), \
                          .bias = mk(&tb, b, KHUB_DTYPE_F32, 1, 3, 0, 0), \
                          .y = mk(&ty, y, KHUB_DTYPE_F32, 2, 2, 3, 0)}
    {
        LIN_RESET();
        ASSERT_OK(run("linear", &a));
        tw.shape[1] = 7;
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_INVALID_ARG,
                     "linear: weight.shape[1] (in) (got 7, want 8)");
    }
    {
        LIN_RESET();
        tb.shape[0] = 4;
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_INVALID_ARG,
                     "linear: bias.shape[0] (out) (got 4, want 3)");
    }
    {
        LIN_RESET();
        ty.shape[1] = 2;
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_INVALID_ARG,
                     "linear: y.shape[1] (out) (got 2, want 3)");
    }
    {
        LIN_RESET();
        strided(&tw, 16, 1, 0);
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_INVALID_ARG,
                     "linear: weight has strides (want compact [out, in] rows)");
    }
    {
        LIN_RESET();
        tw.t.dtype = KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0);
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_INVALID_ARG, "linear: weight.dtype (got q8_0");
    }
    {
        LIN_RESET();
        ASSERT_FAILS(run("qlinear", &a), KHUB_STATUS_INVALID_ARG, "qlinear: weight.dtype (got f32");
    }
    {
        LIN_RESET();
        tw.t.dtype = KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_0);
        ASSERT_FAILS(run("qlinear", &a), KHUB_STATUS_INVALID_ARG,
                     "qlinear: weight.shape[1] (in) (got 8, want a positive multiple of q4_0's "
                     "block of 32)");
    }
    {
        /* a Q8_0 weight whose logical size fits in int64 but whose bytes do not */
        LIN_RESET();
        tw.t.dtype = KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0);
        tw.shape[0] = ty.shape[1] = INT64_C(1) << 32;
        tw.shape[1] = tx.shape[1] = (INT64_C(1) << 31) - 32;
        a.bias = NULL;
        ASSERT_FAILS(run("qlinear", &a), KHUB_STATUS_OVERFLOW,
                     "qlinear: weight of 4294967296 rows x 2281701342 bytes overflows");
    }
    {
        LIN_RESET();
        a.y = &tx.t;
        tx.shape[1] = 3;
        tw.shape[1] = 3;
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_INVALID_ARG, "linear: y aliases x");
    }
    {
        LIN_RESET();
        tx.t.dtype = KHUB_DTYPE_F16;
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_INVALID_ARG, "linear: x.dtype (got f16");
    }
    {
        LIN_RESET();
        a.struct_size = sizeof a - 8;
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_INVALID_ARG, "linear: args.struct_size");
    }
    {
        LIN_RESET();
        g_fail_allocs = 1;
        ASSERT_FAILS(run("linear", &a), KHUB_STATUS_NOMEM, "linear: out of memory");
    }
#undef LIN_RESET
    ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------------------ */
/* Quantization                                                             */
/* ------------------------------------------------------------------------ */

static const khub_qlinear_methods *qm(void) { return op("qlinear")->methods; }

static khub_status quant_call(int quantize, khub_qformat f, int64_t rows, int64_t cols,
                              const void *src, void *dst)
{
    khub_quant_args a = {KHUB_STRUCT_INIT(khub_quant_args),
                         .format = f,
                         .n_rows = rows,
                         .n_cols = cols,
                         .src = src,
                         .dst = dst};
    g_err[0] = '\0';
    return quantize ? qm()->quantize(g_desc.state, &a) : qm()->dequantize(g_desc.state, &a);
}

/* The scale that bounds one block's error, per format (see quant.c). */
static double block_err_bound(khub_qformat f, const float *x, int64_t n)
{
    double amax = 0, lo = x[0], hi = x[0];
    for (int64_t i = 0; i < n; i++) {
        amax = fmax(amax, fabs(x[i]));
        lo = fmin(lo, x[i]);
        hi = fmax(hi, x[i]);
    }
    const double h = 0x1p-11; /* relative rounding of an f16 scale */
    switch (f) {
    case KHUB_QFORMAT_Q8_0: return amax / 127 * (0.5 + 127 * h) + 1e-7;
    case KHUB_QFORMAT_Q4_0: return amax / 8 * (1.0 + 8 * h) + 1e-7; /* one side clamps at 15 */
    case KHUB_QFORMAT_Q4_1: return (hi - lo) / 15 * (0.5 + 15 * h) + fabs(lo) * h + 1e-7;
    case KHUB_QFORMAT_Q5_0: return amax / 16 * (1.0 + 16 * h) + 1e-7; /* one side clamps at 31 */
    case KHUB_QFORMAT_Q5_1: return (hi - lo) / 31 * (0.5 + 31 * h) + fabs(lo) * h + 1e-7;
    case KHUB_QFORMAT_INT8_ROW: return amax / 127 * 0.5 * (1 + 1e-5) + 1e-9;
    case KHUB_QFORMAT_NF4: return amax * (1.0 - 0.6961928009986877) / 2 * (1 + 1e-6) + 1e-9;
    default: return 0;
    }
}

TEST_IMPL(quant_round_trip_bounds)
{
    setup();
    static const struct {
        khub_qformat f;
        double nmse;
    } fm[] = {/* bounds ~1.7x the NMSE measured on these weights (seed 41) */
              {KHUB_QFORMAT_Q8_0, 1e-4},   {KHUB_QFORMAT_Q4_0, 2.5e-2},
              {KHUB_QFORMAT_Q4_1, 1.4e-2}, {KHUB_QFORMAT_Q5_0, 6.3e-3},
              {KHUB_QFORMAT_Q5_1, 3.4e-3}, {KHUB_QFORMAT_INT8_ROW, 7e-4},
              {KHUB_QFORMAT_NF4, 2.5e-2}};
    const int64_t rows = 12, cols = 512;
    float *w = fbuf((size_t)(rows * cols)), *back = fbuf((size_t)(rows * cols));
    uint8_t *packed = calloc((size_t)rows, 600);
    oracle_rng r = {41};
    for (int64_t i = 0; i < rows * cols; i++) /* a heavy-ish tail, like real weights */
        w[i] = oracle_uniform(&r, -1, 1) * oracle_uniform(&r, 0.1f, 1) * (i % 97 == 0 ? 6 : 1);
    for (size_t fi = 0; fi < sizeof fm / sizeof fm[0]; fi++) {
        khub_qformat f = fm[fi].f;
        ASSERT_OK(quant_call(1, f, rows, cols, w, packed));
        ASSERT_OK(quant_call(0, f, rows, cols, packed, back));
        int64_t be = f == KHUB_QFORMAT_INT8_ROW ? cols : khub_qformat_block_elems(f);
        for (int64_t b0 = 0; b0 < rows * cols; b0 += be) {
            double bound = block_err_bound(f, w + b0, be);
            for (int64_t i = b0; i < b0 + be; i++) ASSERT_LE(fabs((double)back[i] - w[i]), bound);
        }
        double e = oracle_nmse_ff(back, w, (size_t)(rows * cols));
        fprintf(stderr, "  round trip %s: nmse %.3g\n", khub_pu_dtype_name(KHUB_DTYPE_Q(f)), e);
        ASSERT_LE(e, fm[fi].nmse);
        /* a second quantize of the dequantized weights is stable (same codes) */
        uint8_t *again = calloc((size_t)rows, 600);
        ASSERT_OK(quant_call(1, f, rows, cols, back, again));
        float *back2 = fbuf((size_t)(rows * cols));
        ASSERT_OK(quant_call(0, f, rows, cols, again, back2));
        ASSERT_LE(oracle_nmse_ff(back2, back, (size_t)(rows * cols)), 1e-6);
        free(again), free(back2);
    }
    /* all-zero blocks quantize to zeros, not NaN */
    float zeros[64] = {0}, out[64];
    for (size_t fi = 0; fi < sizeof fm / sizeof fm[0]; fi++) {
        ASSERT_OK(quant_call(1, fm[fi].f, 1, 64, zeros, packed));
        ASSERT_OK(quant_call(0, fm[fi].f, 1, 64, packed, out));
        for (int i = 0; i < 64; i++) ASSERT(out[i] == 0.0f);
    }
    free(w), free(back), free(packed);
    ASSERT_NO_LEAKS();
}

static void put_f16(uint8_t *p, float f)
{
    uint16_t h = khub_pu_f32_to_f16(f);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

/* Dequantizes one row of nb blocks through the plugin. */
static void deq(khub_qformat f, const uint8_t *src, int64_t n, float *dst)
{
    ASSERT_OK(quant_call(0, f, 1, n, src, dst));
}

TEST_IMPL(quant_gguf_blocks_bit_exact)
{
    setup();
    float y[512], want[512];
    /* Q8_0: d = 0.5, q = -16..15 */
    uint8_t q8[34];
    put_f16(q8, 0.5f);
    for (int l = 0; l < 32; l++) q8[2 + l] = (uint8_t)(int8_t)(l - 16);
    deq(KHUB_QFORMAT_Q8_0, q8, 32, y);
    for (int l = 0; l < 32; l++) ASSERT(y[l] == (l - 16) * 0.5f);
    /* Q4_0: d = 2, low nibble l, high nibble 15 - l */
    uint8_t q40[18];
    put_f16(q40, 2.0f);
    for (int l = 0; l < 16; l++) q40[2 + l] = (uint8_t)(l | ((15 - l) << 4));
    deq(KHUB_QFORMAT_Q4_0, q40, 32, y);
    for (int l = 0; l < 16; l++) {
        ASSERT(y[l] == (l - 8) * 2.0f);
        ASSERT(y[16 + l] == (7 - l) * 2.0f);
    }
    /* Q4_1: d = 0.25, m = -1 */
    uint8_t q41[20];
    put_f16(q41, 0.25f), put_f16(q41 + 2, -1.0f);
    for (int l = 0; l < 16; l++) q41[4 + l] = (uint8_t)(l | ((15 - l) << 4));
    deq(KHUB_QFORMAT_Q4_1, q41, 32, y);
    ASSERT(y[0] == -1.0f);
    ASSERT(y[3] == -0.25f);
    ASSERT(y[16] == 2.75f);
    ASSERT(y[31] == -1.0f);
    /* Q5_0: d = 0.5, nibbles as Q4_0's; qh = 0x80000001 sets bit 4 of weights
     * 0 and 31 only */
    uint8_t q50[22];
    put_f16(q50, 0.5f);
    q50[2] = 0x01, q50[3] = 0x00, q50[4] = 0x00, q50[5] = 0x80;
    for (int l = 0; l < 16; l++) q50[6 + l] = (uint8_t)(l | ((15 - l) << 4));
    deq(KHUB_QFORMAT_Q5_0, q50, 32, y);
    ASSERT(y[0] == 0.0f);   /* (0 | 16) - 16 */
    ASSERT(y[1] == -7.5f);  /* 1 - 16 */
    ASSERT(y[16] == -0.5f); /* 15 - 16 */
    ASSERT(y[31] == 0.0f);  /* (0 | 16) - 16 */
    oracle_deq_q5_0(q50, want);
    ASSERT(memcmp(y, want, 32 * sizeof(float)) == 0);
    /* Q5_1: d = 0.25, m = -1, qh byte 1 bit 0 = weight 8, byte 2 bit 7 = weight 23 */
    uint8_t q51[24];
    put_f16(q51, 0.25f), put_f16(q51 + 2, -1.0f);
    q51[4] = 0x00, q51[5] = 0x01, q51[6] = 0x80, q51[7] = 0x00;
    for (int l = 0; l < 16; l++) q51[8 + l] = (uint8_t)(l | ((15 - l) << 4));
    deq(KHUB_QFORMAT_Q5_1, q51, 32, y);
    ASSERT(y[0] == -1.0f);
    ASSERT(y[8] == 5.0f);   /* (8 | 16) * 0.25 - 1 */
    ASSERT(y[9] == 1.25f);  /* 9 * 0.25 - 1 */
    ASSERT(y[23] == 5.0f);  /* ((15 - 7) | 16) * 0.25 - 1 */
    ASSERT(y[24] == 0.75f); /* 15 - 8 = 7, bit 24 clear: 7 * 0.25 - 1 */
    oracle_deq_q5_1(q51, want);
    ASSERT(memcmp(y, want, 32 * sizeof(float)) == 0);
    /* Q4_K with known 6-bit scales, packed here from the layout description */
    static const int sc[8] = {1, 2, 3, 4, 33, 40, 63, 17}, mn[8] = {0, 1, 2, 3, 48, 5, 63, 32};
    uint8_t q4k[144] = {0};
    put_f16(q4k, 1.0f), put_f16(q4k + 2, 0.5f);
    for (int i = 0; i < 4; i++) {
        q4k[4 + i] = (uint8_t)(sc[i] | ((sc[4 + i] >> 4) << 6));
        q4k[8 + i] = (uint8_t)(mn[i] | ((mn[4 + i] >> 4) << 6));
        q4k[12 + i] = (uint8_t)((sc[4 + i] & 15) | ((mn[4 + i] & 15) << 4));
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            q4k[16 + 32 * c + l] = (uint8_t)((l & 15) | (((l + c) & 15) << 4));
    deq(KHUB_QFORMAT_Q4_K, q4k, 256, y);
    for (int e = 0; e < 256; e++) {
        int s = e / 32, l = e % 32, c = s / 2;
        int q = (s & 1) ? (l + c) & 15 : l & 15;
        ASSERT(y[e] == 1.0f * sc[s] * q - 0.5f * mn[s]);
    }
    ASSERT(y[32 * 4 + 3] == 75.0f);  /* sub-block 4: 33 * 3 - 0.5 * 48 */
    ASSERT(y[32 * 7 + 5] == 120.0f); /* sub-block 7: 17 * ((5 + 3) & 15) - 0.5 * 32 */
    oracle_deq_q4_k(q4k, want);
    ASSERT(memcmp(y, want, 256 * sizeof(float)) == 0);
    /* Q6_K: d = 0.5, scales -8..7; weight e gets q = e % 64 */
    uint8_t q6k[210] = {0};
    for (int e = 0; e < 256; e++) {
        int h = e / 128, t = (e % 128) / 32, l = e % 32, q = e % 64;
        uint8_t *lo = &q6k[64 * h + 32 * (t & 1) + l];
        *lo |= (uint8_t)(t >= 2 ? (q & 15) << 4 : (q & 15));
        q6k[128 + 32 * h + l] |= (uint8_t)((q >> 4) << (2 * t));
    }
    for (int i = 0; i < 16; i++) q6k[192 + i] = (uint8_t)(int8_t)(i - 8);
    put_f16(q6k + 208, 0.5f);
    deq(KHUB_QFORMAT_Q6_K, q6k, 256, y);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, t = (e % 128) / 32, l = e % 32;
        int s = 8 * h + 2 * t + l / 16 - 8;
        ASSERT(y[e] == 0.5f * s * (e % 64 - 32));
    }
    ASSERT(y[0] == 128.0f);   /* scale -8, q 0 - 32: 0.5 * -8 * -32 */
    ASSERT(y[255] == 108.5f); /* scale 7, q 63 - 32: 0.5 * 7 * 31 */
    oracle_deq_q6_k(q6k, want);
    ASSERT(memcmp(y, want, 256 * sizeof(float)) == 0);
    /* NF4: absmax 2, even weights in the high nibble */
    uint8_t nf4[36];
    float absmax = 2.0f;
    memcpy(nf4, &absmax, 4);
    for (int t = 0; t < 32; t++) nf4[4 + t] = (uint8_t)(((t % 16) << 4) | (15 - t % 16));
    deq(KHUB_QFORMAT_NF4, nf4, 64, y);
    ASSERT(y[0] == -2.0f);
    ASSERT(y[1] == 2.0f);
    ASSERT(y[2] == oracle_nf4_code[1] * 2.0f);
    ASSERT(y[14] == 0.0f);                      /* byte 7: high nibble 7 */
    ASSERT(y[15] == oracle_nf4_code[8] * 2.0f); /* byte 7: low nibble 15 - 7 */
    oracle_deq_nf4(nf4, want);
    ASSERT(memcmp(y, want, 64 * sizeof(float)) == 0);
    /* INT8_ROW: f32 scale then int8 */
    uint8_t i8r[4 + 6];
    float scale = 0.125f;
    memcpy(i8r, &scale, 4);
    for (int i = 0; i < 6; i++) i8r[4 + i] = (uint8_t)(int8_t)(i * 50 - 127);
    deq(KHUB_QFORMAT_INT8_ROW, i8r, 6, y);
    for (int i = 0; i < 6; i++) ASSERT(y[i] == (i * 50 - 127) * 0.125f);
}

/* Random bytes (finite scales) through plugin and oracle, bit for bit. */
TEST_IMPL(quant_random_blocks_bit_exact)
{
    setup();
    oracle_rng r = {51};
    static const khub_qformat fs[] = {KHUB_QFORMAT_Q8_0, KHUB_QFORMAT_Q4_0, KHUB_QFORMAT_Q4_1,
                                      KHUB_QFORMAT_Q5_0, KHUB_QFORMAT_Q5_1, KHUB_QFORMAT_Q4_K,
                                      KHUB_QFORMAT_Q6_K, KHUB_QFORMAT_NF4};
    uint8_t blk[256 * 4];
    float y[1024], want[1024];
    for (size_t fi = 0; fi < sizeof fs / sizeof fs[0]; fi++) {
        khub_qformat f = fs[fi];
        int64_t be = khub_qformat_block_elems(f), bb = khub_qformat_block_bytes(f);
        for (int trial = 0; trial < 200; trial++) {
            for (int64_t i = 0; i < 4 * bb; i++) blk[i] = (uint8_t)oracle_next(&r);
            for (int b = 0; b < 4; b++) { /* keep scales finite and moderate */
                uint8_t *p = blk + b * bb;
                if (f == KHUB_QFORMAT_Q6_K)
                    put_f16(p + 208, oracle_uniform(&r, -2, 2));
                else if (f == KHUB_QFORMAT_NF4) {
                    float am = oracle_uniform(&r, 0, 3);
                    memcpy(p, &am, 4);
                } else {
                    put_f16(p, oracle_uniform(&r, -2, 2));
                    if (f == KHUB_QFORMAT_Q4_1 || f == KHUB_QFORMAT_Q5_1 || f == KHUB_QFORMAT_Q4_K)
                        put_f16(p + 2, oracle_uniform(&r, -2, 2));
                }
            }
            deq(f, blk, 4 * be, y);
            for (int b = 0; b < 4; b++) {
                const uint8_t *p = blk + b * bb;
                float *wb = want + b * be;
                switch (f) {
                case KHUB_QFORMAT_Q8_0: oracle_deq_q8_0(p, wb); break;
                case KHUB_QFORMAT_Q4_0: oracle_deq_q4_0(p, wb); break;
                case KHUB_QFORMAT_Q4_1: oracle_deq_q4_1(p, wb); break;
                case KHUB_QFORMAT_Q5_0: oracle_deq_q5_0(p, wb); break;
                case KHUB_QFORMAT_Q5_1: oracle_deq_q5_1(p, wb); break;
                case KHUB_QFORMAT_Q4_K: oracle_deq_q4_k(p, wb); break;
                case KHUB_QFORMAT_Q6_K: oracle_deq_q6_k(p, wb); break;
                default: oracle_deq_nf4(p, wb); break;
                }
            }
            ASSERT(memcmp(y, want, (size_t)(4 * be) * sizeof(float)) == 0);
        }
    }
}

/* tests/golden/kquants.gguf (make_golden.py): blocks of every GGUF format
 * with gguf-py's dequantization of them, the reference that Transformers
 * uses. ref-cpu and the oracle of ref_oracle.h (which test_cpu_x86 checks
 * the optimized plugins against) must give gguf-py's values bit for bit. */
TEST_IMPL(quant_blocks_match_gguf_py)
{
    setup();
    static const struct {
        const char *name;
        khub_qformat f;
        void (*oracle)(const uint8_t *, float *);
    } fs[] = {
        {"q4_k", KHUB_QFORMAT_Q4_K, oracle_deq_q4_k}, {"q6_k", KHUB_QFORMAT_Q6_K, oracle_deq_q6_k},
        {"q4_0", KHUB_QFORMAT_Q4_0, oracle_deq_q4_0}, {"q4_1", KHUB_QFORMAT_Q4_1, oracle_deq_q4_1},
        {"q5_0", KHUB_QFORMAT_Q5_0, oracle_deq_q5_0}, {"q5_1", KHUB_QFORMAT_Q5_1, oracle_deq_q5_1},
        {"q8_0", KHUB_QFORMAT_Q8_0, oracle_deq_q8_0}};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_gguf *g = NULL;
    ASSERT_OK(khub__gguf_open(rt, KHUB_SOURCE_DIR "/tests/golden/kquants.gguf", &g));
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        char fname[32];
        snprintf(fname, sizeof fname, "%s.f32", fs[i].name);
        const khub_gguf_tensor *q = khub__gguf_tensor_find(g, fs[i].name);
        const khub_gguf_tensor *w = khub__gguf_tensor_find(g, fname);
        ASSERT(q && w);
        int64_t cols = (int64_t)q->ne[0], rows = (int64_t)q->ne[1];
        ASSERT_EQ(cols, 512);
        ASSERT_EQ(rows, 3);
        ASSERT_EQ(w->nbytes, (size_t)(rows * cols) * sizeof(float));
        int64_t be = khub_qformat_block_elems(fs[i].f), bb = khub_qformat_block_bytes(fs[i].f);
        ASSERT_EQ(q->nbytes, (size_t)(rows * cols / be * bb));
        float y[3 * 512], o[3 * 512];
        const uint8_t *src = q->data;
        deq(fs[i].f, src, rows * cols, y);
        for (int64_t b = 0; b < rows * cols / be; b++) fs[i].oracle(src + b * bb, o + b * be);
        int bad_plugin = 0, bad_oracle = 0;
        for (int64_t e = 0; e < rows * cols; e++) {
            float want;
            memcpy(&want, (const uint8_t *)w->data + e * 4, 4);
            if (memcmp(&y[e], &want, 4) != 0 && bad_plugin++ == 0)
                fprintf(stderr, "  %s[%lld]: ref-cpu %.9g, gguf-py %.9g\n", fs[i].name,
                        (long long)e, y[e], want);
            if (memcmp(&o[e], &want, 4) != 0 && bad_oracle++ == 0)
                fprintf(stderr, "  %s[%lld]: oracle %.9g, gguf-py %.9g\n", fs[i].name, (long long)e,
                        o[e], want);
        }
        ASSERT_EQ(bad_plugin, 0);
        ASSERT_EQ(bad_oracle, 0);
    }
    khub__gguf_close(g);
    khub_runtime_free(rt);
}

/* qlinear: y = x dequant(W)^T + b for every format, against the oracle on
 * the dequantized weights. */
TEST_IMPL(qlinear_vs_oracle)
{
    setup();
    const int64_t n = 3, in = 512, out = 10;
    float *x = fbuf((size_t)(n * in)), *w = fbuf((size_t)(out * in)), *b = fbuf((size_t)out);
    float *wd = fbuf((size_t)(out * in)), *y = fbuf((size_t)(n * out));
    double *want = dbuf((size_t)(n * out));
    uint8_t *packed = calloc((size_t)out, 600);
    oracle_rng r = {61};
    oracle_fill(&r, x, (size_t)(n * in), -1, 1);
    oracle_fill(&r, w, (size_t)(out * in), -1, 1);
    oracle_fill(&r, b, (size_t)out, -1, 1);
    for (int f = 1; f < KHUB_QFORMAT__COUNT; f++) {
        int64_t rb = khub_qformat_row_bytes((khub_qformat)f, in);
        if (f == KHUB_QFORMAT_Q4_K || f == KHUB_QFORMAT_Q6_K) {
            for (int64_t i = 0; i < out * rb; i++) packed[i] = (uint8_t)oracle_next(&r);
            for (int64_t blk = 0; blk < out * (in / 256); blk++) {
                uint8_t *p = packed + blk * khub_qformat_block_bytes((khub_qformat)f);
                if (f == KHUB_QFORMAT_Q6_K)
                    put_f16(p + 208, 0.01f);
                else
                    put_f16(p, 0.02f), put_f16(p + 2, 0.03f);
            }
        } else {
            ASSERT_OK(quant_call(1, (khub_qformat)f, out, in, w, packed));
        }
        ASSERT_OK(quant_call(0, (khub_qformat)f, out, in, packed, wd));
        tens tx, tw, tb, ty;
        khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args),
                              .x = mk(&tx, x, KHUB_DTYPE_F32, 2, n, in, 0),
                              .weight = mk(&tw, packed, KHUB_DTYPE_Q(f), 2, out, in, 0),
                              .bias = mk(&tb, b, KHUB_DTYPE_F32, 1, out, 0, 0),
                              .y = mk(&ty, y, KHUB_DTYPE_F32, 2, n, out, 0)};
        ASSERT_OK(run("qlinear", &a));
        oracle_linear(x, wd, b, n, in, out, want);
        double e = oracle_nmse(y, want, (size_t)(n * out));
        fprintf(stderr, "  qlinear %s: nmse %.3g\n", khub_pu_dtype_name(KHUB_DTYPE_Q(f)), e);
        ASSERT_LE(e, 1e-13);
    }
    free(x), free(w), free(b), free(wd), free(y), free(want), free(packed);
    ASSERT_NO_LEAKS();
}

TEST_IMPL(quant_invalid_args)
{
    setup();
    float w[64] = {0};
    uint8_t p[256];
    ASSERT_FAILS(quant_call(0, KHUB_QFORMAT_NONE, 1, 32, p, w), KHUB_STATUS_INVALID_ARG,
                 "qlinear.dequantize: format (got 0, want 1..9)");
    ASSERT_FAILS(quant_call(1, (khub_qformat)99, 1, 32, w, p), KHUB_STATUS_INVALID_ARG,
                 "qlinear.quantize: format (got 99, want 1..9)");
    ASSERT_FAILS(
        quant_call(1, KHUB_QFORMAT_Q8_0, 1, 33, w, p), KHUB_STATUS_INVALID_ARG,
        "qlinear.quantize: n_cols (got 33, want a positive multiple of q8_0's block of 32)");
    ASSERT_FAILS(quant_call(0, KHUB_QFORMAT_NF4, 1, 32, p, w), KHUB_STATUS_INVALID_ARG,
                 "n_cols (got 32, want a positive multiple of nf4's block of 64)");
    ASSERT_FAILS(quant_call(0, KHUB_QFORMAT_Q8_0, -1, 32, p, w), KHUB_STATUS_INVALID_ARG,
                 "qlinear.dequantize: n_rows (got -1, want >= 0)");
    ASSERT_FAILS(quant_call(1, KHUB_QFORMAT_Q4_K, 1, 256, w, p), KHUB_STATUS_UNSUPPORTED,
                 "qlinear.quantize: q4_k has no reference quantizer");
    ASSERT_FAILS(quant_call(1, KHUB_QFORMAT_Q6_K, 1, 256, w, p), KHUB_STATUS_UNSUPPORTED,
                 "q6_k has no reference quantizer");
    ASSERT_FAILS(quant_call(0, KHUB_QFORMAT_Q8_0, 1, 32, NULL, w), KHUB_STATUS_INVALID_ARG,
                 "qlinear.dequantize: src or dst is NULL");
    ASSERT_FAILS(quant_call(0, KHUB_QFORMAT_Q8_0, INT64_C(1) << 40, INT64_C(1) << 30, p, w),
                 KHUB_STATUS_OVERFLOW, "overflow the address space");
    w[37] = INFINITY;
    ASSERT_FAILS(quant_call(1, KHUB_QFORMAT_Q4_0, 2, 32, w, p), KHUB_STATUS_INVALID_ARG,
                 "qlinear.quantize: src[1][5] is inf (want finite weights)");
    khub_quant_args a = {.struct_size = 8};
    ASSERT_FAILS(qm()->dequantize(g_desc.state, &a), KHUB_STATUS_INVALID_ARG,
                 "qlinear.dequantize: args.struct_size (got 8");
    ASSERT_OK(quant_call(0, KHUB_QFORMAT_Q8_0, 0, 32, NULL, NULL)); /* no rows: nothing to do */
}

/* ------------------------------------------------------------------------ */
/* Norm                                                                     */
/* ------------------------------------------------------------------------ */

TEST_IMPL(norm_vs_oracle)
{
    setup();
    const int64_t n = 5, dim = 576;
    float *x = fbuf((size_t)(n * dim)), *res = fbuf((size_t)(n * dim)), *w = fbuf((size_t)dim);
    float *y = fbuf((size_t)(n * dim)), *res_want = fbuf((size_t)(n * dim));
    float *res0 = fbuf((size_t)(n * dim)), *xa = fbuf((size_t)(n * dim));
    double *want = dbuf((size_t)(n * dim));
    oracle_rng r = {71};
    oracle_fill(&r, x, (size_t)(n * dim), -2, 3);
    oracle_fill(&r, res0, (size_t)(n * dim), -1, 1);
    oracle_fill(&r, w, (size_t)dim, 0.5f, 1.5f);
    for (int layer = 0; layer < 2; layer++) {
        for (int mode = 0; mode < 3; mode++) { /* 0 plain, 1 y aliases x, 2 fused residual */
            memcpy(res, res0, (size_t)(n * dim) * sizeof(float));
            memcpy(xa, x, (size_t)(n * dim) * sizeof(float));
            tens tx, tr, tw, ty;
            khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                                .norm_type = layer ? KHUB_NORM_LAYER : KHUB_NORM_RMS,
                                .eps = 1e-5f,
                                .x = mk(&tx, xa, KHUB_DTYPE_F32, 2, n, dim, 0),
                                .residual =
                                    mode == 2 ? mk(&tr, res, KHUB_DTYPE_F32, 2, n, dim, 0) : NULL,
                                .weight = mk(&tw, w, KHUB_DTYPE_F32, 1, dim, 0, 0),
                                .y = mode == 1 ? &tx.t : mk(&ty, y, KHUB_DTYPE_F32, 2, n, dim, 0)};
            ASSERT_OK(run("rms_norm", &a));
            oracle_norm(x, mode == 2 ? res0 : NULL, w, n, dim, 1e-5, layer, want, res_want);
            double e = oracle_nmse(mode == 1 ? xa : y, want, (size_t)(n * dim));
            fprintf(stderr, "  %s mode %d: nmse %.3g\n", layer ? "layer_norm" : "rms_norm", mode,
                    e);
            ASSERT_LE(e, 1e-13);
            if (mode == 2) ASSERT(memcmp(res, res_want, (size_t)(n * dim) * sizeof(float)) == 0);
        }
    }
    free(x), free(res), free(w), free(y), free(res_want), free(res0), free(xa), free(want);
}

TEST_IMPL(norm_invalid_args)
{
    setup();
    float x[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8}, r[8] = {0}, w[4] = {1, 1, 1, 1}, y[8];
    tens tx, tr, tw, ty;
#define NORM_RESET() \
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args), \
                        .norm_type = KHUB_NORM_RMS, \
                        .eps = 1e-6f, \
                        .x = mk(&tx, x, KHUB_DTYPE_F32, 2, 2, 4, 0), \
                        .residual = mk(&tr, r, KHUB_DTYPE_F32, 2, 2, 4, 0), \
                        .weight = mk(&tw, w, KHUB_DTYPE_F32, 1, 4, 0, 0), \
                        .y = mk(&ty, y, KHUB_DTYPE_F32, 2, 2, 4, 0)}
    {
        NORM_RESET();
        ASSERT_OK(run("rms_norm", &a));
        a.norm_type = 3;
        ASSERT_FAILS(run("rms_norm", &a), KHUB_STATUS_INVALID_ARG,
                     "rms_norm: norm_type (got 3, want 1 (RMS) or 2 (LAYER))");
    }
    {
        NORM_RESET();
        tw.shape[0] = 5;
        ASSERT_FAILS(run("rms_norm", &a), KHUB_STATUS_INVALID_ARG,
                     "rms_norm: weight.shape[0] (dim) (got 5, want 4)");
    }
    {
        NORM_RESET();
        tr.shape[0] = 1;
        ASSERT_FAILS(run("rms_norm", &a), KHUB_STATUS_INVALID_ARG,
                     "rms_norm: residual.shape[0] (n) (got 1, want 2)");
    }
    {
        NORM_RESET();
        a.y = &tr.t;
        ASSERT_FAILS(run("rms_norm", &a), KHUB_STATUS_INVALID_ARG, "rms_norm: y aliases residual");
    }
    {
        NORM_RESET();
        a.eps = -1.0f;
        ASSERT_FAILS(run("rms_norm", &a), KHUB_STATUS_INVALID_ARG,
                     "rms_norm: eps (got -1, want finite >= 0)");
    }
    {
        NORM_RESET();
        tx.shape[1] = 0, ty.shape[1] = 0, tr.shape[1] = 0, tw.shape[0] = 0;
        ASSERT_FAILS(run("rms_norm", &a), KHUB_STATUS_INVALID_ARG,
                     "rms_norm: x.shape[1] (dim) (got 0, want >= 1)");
    }
    {
        NORM_RESET();
        a.weight = NULL;
        ASSERT_FAILS(run("rms_norm", &a), KHUB_STATUS_INVALID_ARG, "rms_norm: weight is NULL");
    }
#undef NORM_RESET
}

/* ------------------------------------------------------------------------ */
/* Activation                                                               */
/* ------------------------------------------------------------------------ */

TEST_IMPL(activation_vs_oracle)
{
    setup();
    const int64_t n = 4, ff = 1536;
    float *g = fbuf((size_t)(n * ff)), *u = fbuf((size_t)(n * ff)), *y = fbuf((size_t)(n * ff));
    float *ga = fbuf((size_t)(n * ff));
    double *want = dbuf((size_t)(n * ff));
    oracle_rng r = {81};
    oracle_fill(&r, g, (size_t)(n * ff), -12, 12);
    oracle_fill(&r, u, (size_t)(n * ff), -2, 2);
    for (int gelu = 0; gelu < 2; gelu++) {
        for (int alias = 0; alias < 2; alias++) {
            memcpy(ga, g, (size_t)(n * ff) * sizeof(float));
            tens tg, tu, ty;
            khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args),
                                      .act_type = gelu ? KHUB_ACT_GELU_TANH : KHUB_ACT_SILU,
                                      .gate = mk(&tg, ga, KHUB_DTYPE_F32, 2, n, ff, 0),
                                      .up = mk(&tu, u, KHUB_DTYPE_F32, 2, n, ff, 0),
                                      .y = alias ? &tg.t : mk(&ty, y, KHUB_DTYPE_F32, 2, n, ff, 0)};
            ASSERT_OK(run("silu_and_mul", &a));
            oracle_act(g, u, (size_t)(n * ff), gelu, want);
            double e = oracle_nmse(alias ? ga : y, want, (size_t)(n * ff));
            fprintf(stderr, "  %s alias %d: nmse %.3g\n", gelu ? "gelu_tanh" : "silu", alias, e);
            ASSERT_LE(e, 1e-13);
        }
    }
    /* invalid arguments */
    tens tg, tu, ty;
    khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args), .act_type = 3,
                              .gate = mk(&tg, g, KHUB_DTYPE_F32, 2, n, ff, 0),
                              .up = mk(&tu, u, KHUB_DTYPE_F32, 2, n, ff, 0),
                              .y = mk(&ty, y, KHUB_DTYPE_F32, 2, n, ff, 0)};
    ASSERT_FAILS(run("silu_and_mul", &a), KHUB_STATUS_INVALID_ARG,
                 "silu_and_mul: act_type (got 3, want 1 (SILU) or 2 (GELU_TANH))");
    a.act_type = KHUB_ACT_SILU;
    tu.shape[1] = ff - 1;
    ASSERT_FAILS(run("silu_and_mul", &a), KHUB_STATUS_INVALID_ARG,
                 "silu_and_mul: up.shape[1] (ff) (got 1535, want 1536)");
    tu.shape[1] = ff;
    ty.shape[0] = 1;
    ASSERT_FAILS(run("silu_and_mul", &a), KHUB_STATUS_INVALID_ARG,
                 "silu_and_mul: y.shape[0] (n) (got 1, want 4)");
    free(g), free(u), free(y), free(ga), free(want);
}

/* ------------------------------------------------------------------------ */
/* Rotary                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct rope_case {
    int64_t n, H, D, rd;
    uint32_t style, scaling;
    float theta, factor, lo, hi;
    int32_t omp;
} rope_case;

static void rope_run(const rope_case *c, const float *x0, const int32_t *pos, float *x)
{
    memcpy(x, x0, (size_t)(c->n * c->H * c->D) * sizeof(float));
    tens tx;
    khub_rotary_args a = {KHUB_STRUCT_INIT(khub_rotary_args),
                          .x = mk(&tx, x, KHUB_DTYPE_F32, 3, c->n, c->H, c->D),
                          .positions = pos,
                          .style = c->style,
                          .scaling = c->scaling,
                          .theta = c->theta,
                          .factor = c->factor,
                          .low_freq_factor = c->lo,
                          .high_freq_factor = c->hi,
                          .original_max_pos = c->omp,
                          .rotary_dim = (int32_t)(c->rd == c->D ? 0 : c->rd)};
    ASSERT_OK(run("rotary", &a));
}

TEST_IMPL(rotary_vs_oracle)
{
    setup();
    static const rope_case cases[] = {
        {6, 9, 64, 64, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_NONE, 100000, 0, 0, 0, 0}, /* SmolLM2 */
        {6, 4, 64, 64, KHUB_ROPE_INTERLEAVED, KHUB_ROPE_SCALING_NONE, 10000, 0, 0, 0, 0},
        {5, 3, 64, 32, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_NONE, 10000, 0, 0, 0, 0}, /* partial */
        {5, 3, 64, 16, KHUB_ROPE_INTERLEAVED, KHUB_ROPE_SCALING_LINEAR, 10000, 4, 0, 0, 0},
        {7, 8, 128, 128, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_LLAMA3, 500000, 8, 1, 4, 8192},
        {3, 2, 128, 128, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_LLAMA3, 500000, 32, 1, 4, 8192},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const rope_case *c = &cases[ci];
        size_t n = (size_t)(c->n * c->H * c->D);
        float *x0 = fbuf(n), *x = fbuf(n);
        double *want = dbuf(n);
        int32_t pos[8];
        oracle_rng r = {91 + ci};
        oracle_fill(&r, x0, n, -1, 1);
        for (int64_t t = 0; t < c->n; t++) pos[t] = (int32_t)(oracle_next(&r) % 20000);
        pos[0] = 0;
        rope_run(c, x0, pos, x);
        oracle_rotary(x0, pos, c->n, c->H, c->D, c->style == KHUB_ROPE_NEOX, c->rd, c->theta,
                      (int)c->scaling, c->factor, c->lo, c->hi, c->omp, want);
        double e = oracle_nmse(x, want, n);
        fprintf(stderr, "  rotary case %zu: nmse %.3g\n", ci, e);
        ASSERT_LE(e, 1e-13);
        /* position 0 is the identity, and dims past rotary_dim are untouched */
        ASSERT(memcmp(x, x0, (size_t)(c->H * c->D) * sizeof(float)) == 0);
        for (size_t i = 0; i < n; i++)
            if ((int64_t)(i % (size_t)c->D) >= c->rd) ASSERT(x[i] == x0[i]);
        free(x0), free(x), free(want);
    }
}

/* Llama 3.1 scaling keeps the highest frequency (pair 0) as unscaled and
 * divides the lowest (last pair) by factor, as LINEAR does. */
TEST_IMPL(rotary_llama3_bands)
{
    setup();
    const int64_t D = 128, n = 4;
    float x0[4 * 128], xl3[4 * 128], xnone[4 * 128], xlin[4 * 128];
    int32_t pos[4] = {1, 100, 4097, 30000};
    oracle_rng r = {97};
    oracle_fill(&r, x0, (size_t)(n * D), -1, 1);
    rope_case c = {n, 1, D, D, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_LLAMA3, 500000, 8, 1, 4, 8192};
    rope_run(&c, x0, pos, xl3);
    c.scaling = KHUB_ROPE_SCALING_NONE;
    rope_run(&c, x0, pos, xnone);
    c.scaling = KHUB_ROPE_SCALING_LINEAR;
    rope_run(&c, x0, pos, xlin);
    for (int64_t t = 0; t < n; t++) {
        int64_t a = t * D, last = D / 2 - 1;
        ASSERT(xl3[a] == xnone[a] && xl3[a + D / 2] == xnone[a + D / 2]);
        ASSERT(xl3[a + last] == xlin[a + last] && xl3[a + last + D / 2] == xlin[a + last + D / 2]);
    }
    ASSERT(memcmp(xl3, xnone, sizeof xl3) != 0);
    ASSERT(memcmp(xl3, xlin, sizeof xl3) != 0);
}

TEST_IMPL(rotary_invalid_args)
{
    setup();
    float x[2 * 2 * 8] = {0};
    int32_t pos[2] = {0, 1};
    tens tx;
#define ROPE_RESET() \
    khub_rotary_args a = {KHUB_STRUCT_INIT(khub_rotary_args), \
                          .x = mk(&tx, x, KHUB_DTYPE_F32, 3, 2, 2, 8), \
                          .positions = pos, \
                          .style = KHUB_ROPE_NEOX, \
                          .theta = 10000, \
                          .factor = 8, \
                          .low_freq_factor = 1, \
                          .high_freq_factor = 4, \
                          .original_max_pos = 8192}
    {
        ROPE_RESET();
        ASSERT_OK(run("rotary", &a));
        a.style = 0;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG,
                     "rotary: style (got 0, want 1 (NEOX) or 2 (INTERLEAVED))");
    }
    {
        ROPE_RESET();
        a.rotary_dim = 5;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG,
                     "rotary: rotary_dim (got 5, want an even number in 2..head_dim 8)");
        a.rotary_dim = 10;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG, "rotary_dim (got 10");
    }
    {
        ROPE_RESET();
        a.scaling = KHUB_ROPE_SCALING_LLAMA3;
        a.high_freq_factor = 1;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG,
                     "rotary: llama3 scaling (got low_freq_factor 1, high_freq_factor 1");
    }
    {
        ROPE_RESET();
        a.scaling = KHUB_ROPE_SCALING_LINEAR;
        a.factor = 0;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG,
                     "rotary: factor (got 0, want finite > 0)");
    }
    {
        ROPE_RESET();
        a.scaling = 7;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG, "rotary: scaling (got 7");
    }
    {
        ROPE_RESET();
        a.theta = 0;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG,
                     "rotary: theta (got 0, want finite > 0)");
    }
    {
        ROPE_RESET();
        a.positions = NULL;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG,
                     "rotary: positions is NULL (want [2])");
    }
    {
        ROPE_RESET();
        tx.t.dtype = KHUB_DTYPE_F16;
        ASSERT_FAILS(run("rotary", &a), KHUB_STATUS_INVALID_ARG, "rotary: x.dtype (got f16");
    }
#undef ROPE_RESET
}

/* ------------------------------------------------------------------------ */
/* Through the real loader and registry                                     */
/* ------------------------------------------------------------------------ */

/* ref-cpu loads as a built-in (digest-checked), the registry selects its
 * rms_norm, and khub_binding_call runs it on the runtime's thread pool; a
 * bad call's message reaches khub_runtime_errmsg. */
TEST_IMPL(loader_builtin_select_call)
{
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    khub_status st = khub_plugin_load_builtin(rt);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("load_builtin: %s", khub_runtime_errmsg(rt));
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_NORM,
                       .device_type = KHUB_DEVICE_CPU,  .dtype_id = -1,
                       .flags = KHUB_CAP_RESIDUAL,      .plugin_id = "khub/ref-cpu"};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    ASSERT_CONTAINS(khub_binding_name(b), "khub/ref-cpu");
    ASSERT_CONTAINS(khub_binding_name(b), "rms_norm");
    const int64_t n = 37, dim = 64; /* more rows than pool threads */
    float *x = fbuf((size_t)(n * dim)), *w = fbuf((size_t)dim), *y = fbuf((size_t)(n * dim));
    double *want = dbuf((size_t)(n * dim));
    oracle_rng r = {5};
    oracle_fill(&r, x, (size_t)(n * dim), -1, 1);
    oracle_fill(&r, w, (size_t)dim, 0.5f, 1.5f);
    tens tx, tw, ty;
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .norm_type = KHUB_NORM_RMS,
                        .eps = 1e-6f,
                        .x = mk(&tx, x, KHUB_DTYPE_F32, 2, n, dim, 0),
                        .weight = mk(&tw, w, KHUB_DTYPE_F32, 1, dim, 0, 0),
                        .y = mk(&ty, y, KHUB_DTYPE_F32, 2, n, dim, 0)};
    ASSERT_OK(khub_binding_call(b, &a));
    oracle_norm(x, NULL, w, n, dim, 1e-6, 0, want, NULL);
    ASSERT_LE(oracle_nmse(y, want, (size_t)(n * dim)), 1e-13);
    tw.shape[0] = 3;
    ASSERT_STATUS(khub_binding_call(b, &a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "rms_norm: weight.shape[0] (dim) (got 3, want 64)");
    free(x), free(w), free(y), free(want);
    /* attention on the real pool (per-chunk scratch from several threads) */
    khub_op_query qa = {KHUB_STRUCT_INIT(khub_op_query),
                        .kind = KHUB_OP_ATTENTION,
                        .device_type = KHUB_DEVICE_CPU,
                        .dtype_id = KHUB_DTYPE_ID_F16,
                        .head_dim = 64,
                        .flags = KHUB_CAP_GQA | KHUB_CAP_KV_F16,
                        .plugin_id = "khub/ref-cpu",
                        .op_name = "attention"};
    ASSERT_OK(khub_registry_select(rt, &qa, &b));
    const int64_t nq = 13, nkv = 40, H = 9, Hkv = 3, D = 64;
    float *qv = fbuf((size_t)(nq * H * D)), *out = fbuf((size_t)(nq * H * D));
    float *k = fbuf((size_t)(nkv * Hkv * D)), *v = fbuf((size_t)(nkv * Hkv * D));
    uint16_t *kh = calloc((size_t)(nkv * Hkv * D), 2), *vh = calloc((size_t)(nkv * Hkv * D), 2);
    double *aw = dbuf((size_t)(nq * H * D)), *scratch = dbuf((size_t)nkv);
    oracle_fill(&r, qv, (size_t)(nq * H * D), -1, 1);
    oracle_fill(&r, k, (size_t)(nkv * Hkv * D), -1, 1);
    oracle_fill(&r, v, (size_t)(nkv * Hkv * D), -1, 1);
    for (int64_t i = 0; i < nkv * Hkv * D; i++) {
        kh[i] = khub_pu_f32_to_f16(k[i]), k[i] = khub_pu_f16_to_f32(kh[i]);
        vh[i] = khub_pu_f32_to_f16(v[i]), v[i] = khub_pu_f16_to_f32(vh[i]);
    }
    tens tq, tk, tv, to;
    khub_attention_args at = {KHUB_STRUCT_INIT(khub_attention_args),
                              .q = mk(&tq, qv, KHUB_DTYPE_F32, 3, nq, H, D),
                              .k = mk(&tk, kh, KHUB_DTYPE_F16, 3, nkv, Hkv, D),
                              .v = mk(&tv, vh, KHUB_DTYPE_F16, 3, nkv, Hkv, D),
                              .out = mk(&to, out, KHUB_DTYPE_F32, 3, nq, H, D),
                              .scale = 0.125f,
                              .causal = 1,
                              .q_pos0 = nkv - nq};
    ASSERT_OK(khub_binding_call(b, &at));
    oracle_attention(qv, k, v, NULL, nq, nkv, H, Hkv, D, 0.125, 1, nkv - nq, 0, scratch, aw);
    ASSERT_LE(oracle_nmse(out, aw, (size_t)(nq * H * D)), 1e-12);
    free(qv), free(out), free(k), free(v), free(kh), free(vh), free(aw), free(scratch);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(descriptor) \
    X(init_rejects_short_host) \
    X(half_conversions) \
    X(attention_vs_oracle) \
    X(attention_edges) \
    X(attention_invalid_args) \
    X(kv_cache_grow_view_truncate) \
    X(static_cache_allocates_once) \
    X(kv_cache_context_full) \
    X(kv_cache_invalid_args) \
    X(attention_over_cache_views) \
    X(linear_dtypes_vs_oracle) \
    X(linear_invalid_args) \
    X(quant_round_trip_bounds) \
    X(quant_gguf_blocks_bit_exact) \
    X(quant_random_blocks_bit_exact) \
    X(quant_blocks_match_gguf_py) \
    X(qlinear_vs_oracle) \
    X(quant_invalid_args) \
    X(norm_vs_oracle) \
    X(norm_invalid_args) \
    X(activation_vs_oracle) \
    X(rotary_vs_oracle) \
    X(rotary_llama3_bands) \
    X(rotary_invalid_args) \
    X(loader_builtin_select_call)
TEST_MAIN(TEST_LIST)
