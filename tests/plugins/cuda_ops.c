/*
 * cuda_ops.c: CUDA plugins for the host-side tests of device placement and
 * of the device forward pass (tests/test_placement.c,
 * tests/test_device_forward.c), run against the fake driver
 * (tests/fake_cuda).
 *   - khub-test/cuda-ops: rms_norm (with the fused residual), dense f32
 *     linear (with bias) and silu_and_mul.
 *   - khub-test/cuda-all (built with CUDA_OPS_ALL): the same, plus rotary,
 *     attention (causal, GQA, strided K/V) and a kv_cache op keeping its
 *     K/V in device memory (host->cuda_mem_alloc; views are device
 *     tensors), so every role of a Llama can sit on the device.
 *   - khub-test/cuda-embed (CUDA_OPS_ALL and CUDA_OPS_EMBED): cuda-all
 *     plus the embedding lookup of an f32 table (ABI 1.5), so the
 *     embedding sits on the device too (test_placement).
 *   - khub-test/cuda-all-1-4 (CUDA_OPS_ALL, TARGET_MINOR 4): cuda-all
 *     built for ABI 1.4, whose cache writes get no stream (ctx is 1.5) and
 *     launch on the legacy default stream.
 * Each op launches its own kernel name (khub_test_<op>) from one PTX module
 * loaded on the first call, on the call's stream (the cache write: on the
 * stream of the args' ctx, 1.5), with its arguments by value, 8 bytes each
 * (pointers, integers, doubles), the address of its first output first;
 * the fake driver logs the name and that address (khub_fake_cuda_launch_name
 * / _arg0). The kernels compute nothing unless a test gives them host
 * bodies through the fake driver (khub_fake_cuda_kernel;
 * tests/fake_kernels.h does, with the argument lists written next to each
 * op below). Without a driver the plugin still initialises and
 * scores 0.
 */
#include <stdint.h>
#include <string.h>

#include <khub/khub_plugin.h>

#if KHUB_PLUGIN_TARGET_MINOR == 4
/* A 1.4 target sees the config without ctx (1.5), so the host's 1.5 config
 * reaches it cut to what it reads. */
_Static_assert(sizeof(khub_kv_cache_config) == 72, "the 1.4 kv cache config");
#endif

#define ENTRY(name) ".visible .entry " name "(.param .u64 a)\n{\n  ret;\n}\n"
static const char ptx[] = ".version 7.0\n.target sm_52\n.address_size 64\n" ENTRY("khub_test_norm")
    ENTRY("khub_test_linear") ENTRY("khub_test_act") ENTRY("khub_test_rotary")
        ENTRY("khub_test_attention") ENTRY("khub_test_kv_write") ENTRY("khub_test_embedding");

static const khub_host_api *g_host;
static khub_cuda_module *g_mod;

static int32_t score(void *s)
{
    (void)s;
    int count = 0;
    return g_host->cuda_device_count(g_host->host_ctx, &count) == KHUB_STATUS_OK && count > 0;
}

/* Launches khub_test_<what> on stream with the n 8-byte arguments a. */
static khub_status launch(const char *what, void *stream, uint64_t *a, int n)
{
    if (!g_mod) {
        khub_status st = g_host->cuda_module_load(g_host->host_ctx, 0, ptx, sizeof ptx, &g_mod);
        if (st != KHUB_STATUS_OK) return st;
    }
    char name[64] = "khub_test_";
    strncat(name, what, sizeof name - strlen(name) - 1);
    void *fn = NULL;
    khub_status st = g_host->cuda_module_function(g_host->host_ctx, g_mod, name, &fn);
    if (st != KHUB_STATUS_OK) return st;
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .grid = {1, 1, 1},
                                .block = {32, 1, 1}, .stream = stream};
    void *params[16];
    for (int i = 0; i < n && i < 16; i++) params[i] = &a[i];
    return g_host->cuda_launch(g_host->host_ctx, fn, &cfg, params);
}

static uint64_t P(const void *p) { return (uint64_t)(uintptr_t)p; }
static uint64_t T(const khub_tensor *t) { return t ? P(t->data) : 0; }
static uint64_t D(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

/* A CUDA op refuses host tensors: a test that passes one fails here. */
static khub_status dev(const khub_tensor *t, const char *what)
{
    if (t && t->device.device_type == KHUB_DEVICE_CUDA) return KHUB_STATUS_OK;
    return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG,
                        "cuda-ops %s: a tensor is not on the device", what);
}

#define TRY(x) \
    do { \
        khub_status st_ = (x); \
        if (st_ != KHUB_STATUS_OK) return st_; \
    } while (0)

static khub_status norm(void *s, const void *args)
{
    (void)s;
    const khub_norm_args *a = args;
    TRY(dev(a->x, "norm"));
    TRY(dev(a->weight, "norm"));
    TRY(dev(a->y, "norm"));
    /* y, x, residual (0 = none), weight, rows, dim, eps (double) */
    uint64_t p[] = {T(a->y),
                    T(a->x),
                    T(a->residual),
                    T(a->weight),
                    (uint64_t)a->x->shape[0],
                    (uint64_t)a->x->shape[1],
                    D(a->eps)};
    return launch("norm", a->stream, p, 7);
}

static khub_status linear(void *s, const void *args)
{
    (void)s;
    const khub_linear_args *a = args;
    TRY(dev(a->x, "linear"));
    TRY(dev(a->weight, "linear"));
    TRY(dev(a->y, "linear"));
    /* y, x, weight [out, in] f32, bias (0 = none), rows, in, out */
    uint64_t p[] = {T(a->y),
                    T(a->x),
                    T(a->weight),
                    T(a->bias),
                    (uint64_t)a->x->shape[0],
                    (uint64_t)a->x->shape[1],
                    (uint64_t)a->y->shape[1]};
    return launch("linear", a->stream, p, 7);
}

static khub_status act(void *s, const void *args)
{
    (void)s;
    const khub_activation_args *a = args;
    TRY(dev(a->gate, "act"));
    TRY(dev(a->y, "act"));
    /* y, gate, up, elements: y = silu(gate) * up */
    uint64_t p[] = {T(a->y), T(a->gate), T(a->up),
                    (uint64_t)(a->gate->shape[0] * a->gate->shape[1])};
    return launch("act", a->stream, p, 4);
}

static const khub_op_caps norm_caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .flags = KHUB_CAP_RESIDUAL};
static const khub_op_caps linear_caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .flags = KHUB_CAP_BIAS};
static const khub_op_caps act_caps = {KHUB_STRUCT_INIT(khub_op_caps),
                                      .device_type = KHUB_DEVICE_CUDA,
                                      .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)};

#ifdef CUDA_OPS_ALL
static khub_status rotary(void *s, const void *args)
{
    (void)s;
    const khub_rotary_args *a = args;
    TRY(dev(a->x, "rotary"));
    /* x [n, heads, head_dim] in place, positions (int32, device), n, heads,
     * head_dim, theta (double): NEOX pairs (i, i + head_dim / 2) */
    uint64_t p[] = {T(a->x),
                    P(a->positions),
                    (uint64_t)a->x->shape[0],
                    (uint64_t)a->x->shape[1],
                    (uint64_t)a->x->shape[2],
                    D(a->theta)};
    return launch("rotary", a->stream, p, 6);
}

static khub_status attention(void *s, const void *args)
{
    (void)s;
    const khub_attention_args *a = args;
    TRY(dev(a->q, "attention"));
    TRY(dev(a->k, "attention"));
    TRY(dev(a->v, "attention"));
    TRY(dev(a->out, "attention"));
    /* out, q [n, heads, hd], k, v [kv_len, kv_heads, hd] with kv_stride
     * elements per position, n, heads, kv_heads, hd, kv_stride, q_pos0,
     * kv_len, scale (double): causal GQA */
    uint64_t p[] = {T(a->out),
                    T(a->q),
                    T(a->k),
                    T(a->v),
                    (uint64_t)a->q->shape[0],
                    (uint64_t)a->q->shape[1],
                    (uint64_t)a->k->shape[1],
                    (uint64_t)a->q->shape[2],
                    (uint64_t)(a->k->strides ? a->k->strides[0] : a->k->shape[1] * a->k->shape[2]),
                    (uint64_t)a->q_pos0,
                    (uint64_t)a->k->shape[0],
                    D(a->scale)};
    return launch("attention", a->stream, p, 12);
}

/* The cache: [n_seqs][n_layers][2][max_tokens][row] f32 in one device block. */
struct khub_kv_cache {
    khub_kv_cache_config cfg;
    uint64_t block;
    int64_t row;
    int64_t len[8];
};

static uint64_t kv_at(const khub_kv_cache *c, int32_t seq, int32_t layer, int which)
{
    uint64_t per = (uint64_t)c->cfg.max_tokens * (uint64_t)c->row * 4u;
    return c->block +
           (((uint64_t)seq * (uint64_t)c->cfg.n_layers + (uint64_t)layer) * 2u + (uint64_t)which) *
               per;
}

static khub_status kv_create(void *s, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    (void)s;
    if (cfg->n_seqs > 8)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG, "cuda-all: n_seqs > 8");
    khub_kv_cache *c = g_host->alloc(g_host->host_ctx, sizeof *c);
    if (!c) return KHUB_STATUS_NOMEM;
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    c->row = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    size_t bytes = (size_t)cfg->n_seqs * (size_t)cfg->n_layers * 2u * (size_t)cfg->max_tokens *
                   (size_t)c->row * 4u;
    khub_status st = g_host->cuda_mem_alloc(g_host->host_ctx, 0, bytes, &c->block);
    if (st != KHUB_STATUS_OK) {
        g_host->free(g_host->host_ctx, c);
        return st;
    }
    *out = c;
    return KHUB_STATUS_OK;
}

static void kv_destroy(void *s, khub_kv_cache *c)
{
    (void)s;
    if (!c) return;
    g_host->cuda_mem_free(g_host->host_ctx, c->block);
    g_host->free(g_host->host_ctx, c);
}

static khub_status kv_write(void *s, khub_kv_cache *c, const khub_kv_write_args *a)
{
    (void)s;
    TRY(dev(a->k, "kv_cache write"));
    TRY(dev(a->v, "kv_cache write"));
    int64_t end = a->pos + a->k->shape[0];
    if (end > c->cfg.max_tokens) return KHUB_STATUS_CONTEXT_FULL;
    if (end > c->len[a->seq]) c->len[a->seq] = end;
    void *stream = NULL; /* before 1.5: the legacy default stream */
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    if (KHUB_HAS_FIELD(a, khub_kv_write_args, ctx) && a->ctx) stream = a->ctx->stream;
#endif
    /* K destination, V destination, k, v, floats per tensor */
    uint64_t at = (uint64_t)(a->pos * c->row) * 4u;
    uint64_t p[] = {kv_at(c, a->seq, a->layer, 0) + at, kv_at(c, a->seq, a->layer, 1) + at, T(a->k),
                    T(a->v), (uint64_t)(a->k->shape[0] * c->row)};
    return launch("kv_write", stream, p, 5);
}

static void describe(khub_tensor *t, uint64_t base, const khub_kv_cache *c, int64_t n)
{
    t->data = (void *)(uintptr_t)base;
    t->device = (khub_device){KHUB_DEVICE_CUDA, 0};
    t->ndim = 3;
    t->dtype = (khub_dtype){KHUB_DL_FLOAT, 32, 1};
    t->byte_offset = 0;
    t->shape[0] = n, t->shape[1] = c->cfg.n_kv_heads, t->shape[2] = c->cfg.head_dim;
    t->strides[0] = c->row, t->strides[1] = c->cfg.head_dim, t->strides[2] = 1;
}

static khub_status kv_view(void *s, khub_kv_cache *c, int32_t layer, int32_t seq, int64_t n,
                           khub_tensor *k, khub_tensor *v)
{
    (void)s;
    if (n > c->len[seq]) return KHUB_STATUS_INVALID_ARG;
    describe(k, kv_at(c, seq, layer, 0), c, n);
    describe(v, kv_at(c, seq, layer, 1), c, n);
    return KHUB_STATUS_OK;
}

static khub_status kv_truncate(void *s, khub_kv_cache *c, int32_t seq, int64_t n)
{
    (void)s;
    if (n < c->len[seq]) c->len[seq] = n;
    return KHUB_STATUS_OK;
}

static const khub_kv_cache_methods kv_methods = {KHUB_STRUCT_INIT(khub_kv_cache_methods),
                                                 .create = kv_create,
                                                 .destroy = kv_destroy,
                                                 .write = kv_write,
                                                 .view = kv_view,
                                                 .truncate = kv_truncate};
static const khub_op_caps attn_caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_STRIDED_KV};
static const khub_op_caps kv_caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .flags = KHUB_CAP_STRIDED_KV};
#if defined(CUDA_OPS_EMBED) && KHUB_PLUGIN_TARGET_MINOR >= 5
/* The embedding (1.5): table and y on the device, launched on the call
 * context's stream: y, table, ids, n, hidden (computes nothing). */
static khub_status embedding(void *s, const void *args)
{
    (void)s;
    const khub_embedding_args *a = args;
    TRY(dev(a->table, "embedding"));
    TRY(dev(a->y, "embedding"));
    if (!a->ctx || !a->ids)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG,
                            "cuda-embed embedding: no call context or no ids");
    uint64_t p[] = {T(a->y), T(a->table), P(a->ids), (uint64_t)a->n, (uint64_t)a->y->shape[1]};
    return launch("embedding", a->ctx->stream, p, 5);
}
static const khub_op_caps embed_caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .kind_flags = KHUB_EMBEDDING_SCALE};
#define PLUGIN_ID "khub-test/cuda-embed"
#elif KHUB_PLUGIN_TARGET_MINOR >= 5
#define PLUGIN_ID "khub-test/cuda-all"
#else
#define PLUGIN_ID "khub-test/cuda-all-1-4"
#endif
#else
#define PLUGIN_ID "khub-test/cuda-ops"
#endif

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "rms_norm", .kind = KHUB_OP_NORM, .caps = &norm_caps,
     .run = norm},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "linear", .kind = KHUB_OP_LINEAR, .caps = &linear_caps,
     .run = linear},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "silu_and_mul", .kind = KHUB_OP_ACTIVATION,
     .caps = &act_caps, .run = act},
#ifdef CUDA_OPS_ALL
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "rotary", .kind = KHUB_OP_ROTARY, .caps = &act_caps,
     .run = rotary},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "attention", .kind = KHUB_OP_ATTENTION,
     .caps = &attn_caps, .run = attention},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "static_cache", .kind = KHUB_OP_KV_CACHE,
     .caps = &kv_caps, .methods = &kv_methods},
#endif
#if defined(CUDA_OPS_EMBED) && KHUB_PLUGIN_TARGET_MINOR >= 5
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "embedding", .kind = KHUB_OP_EMBEDDING,
     .caps = &embed_caps, .run = embedding},
#endif
};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_host = host;
    g_mod = NULL;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),  .id = PLUGIN_ID, .version = "1.0.0",
                          .n_ops = sizeof ops / sizeof ops[0], .ops = ops,      .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, PLUGIN_ID, "1.0.0")
