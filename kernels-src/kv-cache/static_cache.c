/*
 * static_cache.c: kernels-community/kv-cache, a static KV cache.
 *
 * Like Transformers' StaticCache: create() allocates, for every sequence,
 * one slab of [n_layers][2][max_tokens][n_kv_heads][head_dim] elements up
 * front, so the decode loop never allocates and the K/V addresses never move
 * (which is what makes graph capture possible on GPUs). write() converts the
 * f32 K/V rows to the storage dtype (f16 with F16C in the AVX2 build,
 * round to nearest even either way); view() describes positions [0, n) in
 * place as [n, n_kv_heads, head_dim] tensors with a token stride of
 * n_kv_heads * head_dim elements. Capacity is fixed: writing past max_tokens
 * is KHUB_STATUS_CONTEXT_FULL.
 */
#include <stdint.h>
#include <string.h>

#include <khub/khub_plugin.h>

#if defined(__F16C__) && defined(__AVX2__)
#include <immintrin.h>
#define KV_F16C 1
#else
#define KV_F16C 0
#endif

struct khub_kv_cache {
    khub_kv_cache_config cfg;
    int elem;             /* 2 (f16) or 4 (f32) */
    int64_t row;          /* elements per token: n_kv_heads * head_dim */
    int64_t *len;         /* [n_seqs] positions held */
    unsigned char **slab; /* [n_seqs] */
    int64_t shape[2][3];  /* view shapes handed out (k, v) */
};

/* f32 -> f16, round to nearest even (matches F16C's default rounding). */
static uint16_t to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        if (ax < 0x33000000u) return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static void store_row(unsigned char *dst, const float *src, int64_t n, int elem)
{
    if (elem == 4) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    uint16_t *h = (uint16_t *)dst;
    int64_t i = 0;
#if KV_F16C
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) h[i] = to_f16(src[i]);
}

static unsigned char *kv_at(const khub_kv_cache *c, int32_t seq, int32_t layer, int which,
                            int64_t pos)
{
    int64_t per_tensor = c->cfg.max_tokens * c->row;
    return c->slab[seq] + ((int64_t)layer * 2 + which) * per_tensor * c->elem +
           pos * c->row * c->elem;
}

static khub_status create(void *state, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    const khub_host_api *host = state;
    *out = NULL;
    int f16 = cfg && cfg->dtype.code == KHUB_DL_FLOAT && cfg->dtype.bits == 16;
    int f32 = cfg && cfg->dtype.code == KHUB_DL_FLOAT && cfg->dtype.bits == 32;
    if (!cfg || cfg->struct_size < sizeof *cfg || (!f16 && !f32) || cfg->n_layers < 1 ||
        cfg->n_kv_heads < 1 || cfg->head_dim < 1 || cfg->n_seqs < 1 || cfg->n_seqs > 4096 ||
        cfg->max_tokens < 1 || cfg->max_tokens > (INT64_C(1) << 24))
        return host->fail(
            host->host_ctx, KHUB_STATUS_INVALID_ARG,
            "static_cache: config needs f16 or f32, positive sizes, max_tokens <= 2^24");
    khub_kv_cache *c = host->alloc(host->host_ctx, sizeof *c);
    if (!c) return host->fail(host->host_ctx, KHUB_STATUS_NOMEM, "static_cache: out of memory");
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    c->elem = f16 ? 2 : 4;
    c->row = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    unsigned __int128 bytes = (unsigned __int128)cfg->n_layers * 2 * (uint64_t)cfg->max_tokens *
                              (uint64_t)c->row * (uint64_t)c->elem;
    c->len = host->alloc(host->host_ctx, sizeof(int64_t) * (size_t)cfg->n_seqs);
    c->slab = host->alloc(host->host_ctx, sizeof(unsigned char *) * (size_t)cfg->n_seqs);
    if (!c->len || !c->slab || bytes > ((unsigned __int128)1 << 40)) goto oom;
    memset(c->slab, 0, sizeof(unsigned char *) * (size_t)cfg->n_seqs);
    for (int32_t s = 0; s < cfg->n_seqs; s++) {
        c->len[s] = 0;
        c->slab[s] = host->alloc(host->host_ctx, (size_t)bytes);
        if (!c->slab[s]) goto oom;
    }
    *out = c;
    return KHUB_STATUS_OK;
oom:
    for (int32_t s = 0; c->slab && s < cfg->n_seqs; s++) host->free(host->host_ctx, c->slab[s]);
    host->free(host->host_ctx, c->slab);
    host->free(host->host_ctx, c->len);
    host->free(host->host_ctx, c);
    return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                      "static_cache: cannot allocate %d x %lld tokens of K/V", cfg->n_seqs,
                      (long long)cfg->max_tokens);
}

static void destroy(void *state, khub_kv_cache *c)
{
    const khub_host_api *host = state;
    if (!c) return;
    for (int32_t s = 0; s < c->cfg.n_seqs; s++) host->free(host->host_ctx, c->slab[s]);
    host->free(host->host_ctx, c->slab);
    host->free(host->host_ctx, c->len);
    host->free(host->host_ctx, c);
}

static int rows_ok(const khub_tensor *t, const khub_kv_cache *c, int64_t n)
{
    return t && t->ndim == 3 && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           !t->strides && t->shape[0] == n && t->shape[1] == c->cfg.n_kv_heads &&
           t->shape[2] == c->cfg.head_dim;
}

static khub_status write(void *state, khub_kv_cache *c, const khub_kv_write_args *a)
{
    const khub_host_api *host = state;
    if (!c || !a || a->struct_size < sizeof *a || !a->k || a->layer < 0 ||
        a->layer >= c->cfg.n_layers || a->seq < 0 || a->seq >= c->cfg.n_seqs || a->pos < 0 ||
        a->k->ndim != 3)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "static_cache write: layer, seq or pos out of range");
    int64_t n = a->k->shape[0];
    if (!rows_ok(a->k, c, n) || !rows_ok(a->v, c, n))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "static_cache write: k and v must be compact f32 [n, %d, %d]",
                          c->cfg.n_kv_heads, c->cfg.head_dim);
    if (a->pos > c->len[a->seq] || a->pos + n > c->cfg.max_tokens)
        return host->fail(
            host->host_ctx,
            a->pos + n > c->cfg.max_tokens ? KHUB_STATUS_CONTEXT_FULL : KHUB_STATUS_INVALID_ARG,
            "static_cache write: positions [%lld, %lld) with %lld held, capacity %lld",
            (long long)a->pos, (long long)(a->pos + n), (long long)c->len[a->seq],
            (long long)c->cfg.max_tokens);
    const float *k = (const float *)((const char *)a->k->data + a->k->byte_offset);
    const float *v = (const float *)((const char *)a->v->data + a->v->byte_offset);
    store_row(kv_at(c, a->seq, a->layer, 0, a->pos), k, n * c->row, c->elem);
    store_row(kv_at(c, a->seq, a->layer, 1, a->pos), v, n * c->row, c->elem);
    /* the sequence holds positions up to the furthest one written in any layer */
    if (a->pos + n > c->len[a->seq]) c->len[a->seq] = a->pos + n;
    return KHUB_STATUS_OK;
}

static void describe(khub_tensor *t, unsigned char *base, const khub_kv_cache *c, int64_t n)
{
    t->data = base;
    t->device = (khub_device){KHUB_DEVICE_CPU, 0};
    t->ndim = 3;
    t->dtype = (khub_dtype){KHUB_DL_FLOAT, (uint8_t)(c->elem * 8), 1};
    t->byte_offset = 0;
    t->shape[0] = n;
    t->shape[1] = c->cfg.n_kv_heads;
    t->shape[2] = c->cfg.head_dim;
    t->strides[0] = c->row;
    t->strides[1] = c->cfg.head_dim;
    t->strides[2] = 1;
}

static khub_status view(void *state, khub_kv_cache *c, int32_t layer, int32_t seq, int64_t n,
                        khub_tensor *k, khub_tensor *v)
{
    const khub_host_api *host = state;
    if (!c || layer < 0 || layer >= c->cfg.n_layers || seq < 0 || seq >= c->cfg.n_seqs || n < 0 ||
        n > c->len[seq] || !k || !v || !k->shape || !k->strides || !v->shape || !v->strides)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "static_cache view: layer %d, seq %d or n %lld out of range (positions "
                          "held: see write), or no shape/stride arrays",
                          layer, seq, (long long)n);
    describe(k, kv_at(c, seq, layer, 0, 0), c, n);
    describe(v, kv_at(c, seq, layer, 1, 0), c, n);
    return KHUB_STATUS_OK;
}

static khub_status truncate_seq(void *state, khub_kv_cache *c, int32_t seq, int64_t n)
{
    const khub_host_api *host = state;
    if (!c || seq < 0 || seq >= c->cfg.n_seqs || n < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "static_cache truncate: seq %d or n %lld out of range", seq,
                          (long long)n);
    if (n < c->len[seq]) c->len[seq] = n;
    return KHUB_STATUS_OK;
}

static const khub_kv_cache_methods methods = {KHUB_STRUCT_INIT(khub_kv_cache_methods),
                                              .create = create,
                                              .destroy = destroy,
                                              .write = write,
                                              .view = view,
                                              .truncate = truncate_seq};

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
#if KV_F16C
    .cpu_features = KHUB_CPU_AVX2 | KHUB_CPU_F16C,
    .priority = 40,
#else
    .priority = 15,
#endif
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .flags = KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "static_cache", .kind = KHUB_OP_KV_CACHE,
     .caps = &caps, .methods = &methods},
};

khub_status khub_static_cache_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                                   size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/kv-cache",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = (void *)host};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_static_cache_init, "kernels-community/kv-cache", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_KV_CACHE))
