/* @NAME@: a static KV cache for the CPU (a methods table, no run function).
 * create() allocates every slot for max_tokens up front, so K/V never move;
 * they are stored in f32 as [n_layers][n_seqs][2][max_tokens][n_kv_heads *
 * head_dim], and view() describes positions [0, n) of a slot in place.
 * Writes may not leave gaps; past max_tokens they are KHUB_STATUS_CONTEXT_FULL.
 * Add f16 storage (and KHUB_DTYPE_ID_F16 to the caps) to halve the memory. */
#include <string.h>

#include <khub/khub_plugin.h>

struct khub_kv_cache {
    khub_kv_cache_config cfg;
    int64_t row;  /* floats per token: n_kv_heads * head_dim */
    int64_t *len; /* [n_layers * n_seqs] positions held per slot */
    float *data;
};

static float *slot(const khub_kv_cache *c, int32_t layer, int32_t seq, int which)
{
    int64_t i = ((int64_t)layer * c->cfg.n_seqs + seq) * 2 + which;
    return c->data + i * c->cfg.max_tokens * c->row;
}

static int in_range(const khub_kv_cache *c, int32_t layer, int32_t seq)
{
    return c && layer >= 0 && layer < c->cfg.n_layers && seq >= 0 && seq < c->cfg.n_seqs;
}

static khub_status kv_create(void *state, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    const khub_host_api *host = state;
    size_t bytes = 0;
    if (!cfg || !out || cfg->struct_size < sizeof *cfg || cfg->n_layers < 1 ||
        cfg->n_kv_heads < 1 || cfg->head_dim < 1 || cfg->n_seqs < 1 || cfg->max_tokens < 1 ||
        cfg->dtype.code != KHUB_DL_FLOAT || cfg->dtype.bits != 32 ||
        __builtin_mul_overflow((size_t)cfg->n_layers * (size_t)cfg->n_seqs * 2,
                               (size_t)cfg->max_tokens, &bytes) ||
        __builtin_mul_overflow(bytes, (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * 4, &bytes))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: needs an f32 config, every count >= 1, of addressable size");
    size_t n_slots = (size_t)cfg->n_layers * (size_t)cfg->n_seqs;
    khub_kv_cache *c = host->alloc(host->host_ctx, sizeof *c);
    int64_t *len = host->alloc(host->host_ctx, n_slots * sizeof *len);
    float *data = host->alloc(host->host_ctx, bytes);
    if (!c || !len || !data) {
        host->free(host->host_ctx, c);
        host->free(host->host_ctx, len);
        host->free(host->host_ctx, data);
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          "@NAME@: out of memory for %zu bytes of K/V", bytes);
    }
    memset(len, 0, n_slots * sizeof *len);
    *c = (khub_kv_cache){*cfg, (int64_t)cfg->n_kv_heads * cfg->head_dim, len, data};
    *out = c;
    return KHUB_STATUS_OK;
}

static void kv_destroy(void *state, khub_kv_cache *c)
{
    const khub_host_api *host = state;
    if (!c) return;
    host->free(host->host_ctx, c->data);
    host->free(host->host_ctx, c->len);
    host->free(host->host_ctx, c);
}

/* True when t is f32 [n, n_kv_heads, head_dim]. */
static int fits(const khub_kv_cache *c, const khub_tensor *t, int64_t n)
{
    return t && t->ndim == 3 && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           t->shape[0] == n && t->shape[1] == c->cfg.n_kv_heads && t->shape[2] == c->cfg.head_dim;
}

/* Copies t (any strides) into dst, one row of n_kv_heads * head_dim per token. */
static void store(float *dst, const khub_tensor *t)
{
    int64_t nh = t->shape[1], hd = t->shape[2];
    int64_t s0 = t->strides ? t->strides[0] : nh * hd, s1 = t->strides ? t->strides[1] : hd;
    int64_t s2 = t->strides ? t->strides[2] : 1;
    const float *src = (const float *)((const char *)t->data + t->byte_offset);
    for (int64_t i = 0; i < t->shape[0]; i++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t d = 0; d < hd; d++) *dst++ = src[i * s0 + h * s1 + d * s2];
}

static khub_status kv_write(void *state, khub_kv_cache *c, const khub_kv_write_args *a)
{
    const khub_host_api *host = state;
    int64_t n = a && a->struct_size >= sizeof *a && a->k ? a->k->shape[0] : -1;
    if (n < 0 || !in_range(c, a->layer, a->seq) || !fits(c, a->k, n) || !fits(c, a->v, n))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: write needs a layer and seq in range and f32 k, v [n, "
                          "n_kv_heads, head_dim]");
    int64_t *len = &c->len[(int64_t)a->layer * c->cfg.n_seqs + a->seq];
    if (a->pos < 0 || a->pos > *len)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: write at %lld leaves a gap (layer %d seq %d holds %lld)",
                          (long long)a->pos, (int)a->layer, (int)a->seq, (long long)*len);
    if (n > c->cfg.max_tokens - a->pos)
        return host->fail(host->host_ctx, KHUB_STATUS_CONTEXT_FULL,
                          "@NAME@: positions %lld..%lld exceed max_tokens %lld", (long long)a->pos,
                          (long long)(a->pos + n - 1), (long long)c->cfg.max_tokens);
    store(slot(c, a->layer, a->seq, 0) + a->pos * c->row, a->k);
    store(slot(c, a->layer, a->seq, 1) + a->pos * c->row, a->v);
    if (a->pos + n > *len) *len = a->pos + n;
    return KHUB_STATUS_OK;
}

/* Describes n tokens at data as [n, n_kv_heads, head_dim] with a row per token. */
static void describe(const khub_kv_cache *c, float *data, int64_t n, khub_tensor *t)
{
    t->data = data;
    t->device = (khub_device){KHUB_DEVICE_CPU, 0};
    t->ndim = 3;
    t->dtype = c->cfg.dtype;
    t->byte_offset = 0;
    t->shape[0] = n, t->shape[1] = c->cfg.n_kv_heads, t->shape[2] = c->cfg.head_dim;
    t->strides[0] = c->row, t->strides[1] = c->cfg.head_dim, t->strides[2] = 1;
}

static khub_status kv_view(void *state, khub_kv_cache *c, int32_t layer, int32_t seq, int64_t n,
                           khub_tensor *k, khub_tensor *v)
{
    const khub_host_api *host = state;
    if (!in_range(c, layer, seq) || n < 0 || n > c->len[(int64_t)layer * c->cfg.n_seqs + seq] ||
        !k || !v || !k->shape || !k->strides || !v->shape || !v->strides)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: view of layer %d seq %d, %lld positions: out of range, or no "
                          "shape/strides arrays",
                          (int)layer, (int)seq, (long long)n);
    describe(c, slot(c, layer, seq, 0), n, k);
    describe(c, slot(c, layer, seq, 1), n, v);
    return KHUB_STATUS_OK;
}

static khub_status kv_truncate(void *state, khub_kv_cache *c, int32_t seq, int64_t n)
{
    const khub_host_api *host = state;
    if (!in_range(c, 0, seq) || n < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: truncate of seq %d to %lld: out of range", (int)seq,
                          (long long)n);
    for (int32_t l = 0; l < c->cfg.n_layers; l++) {
        int64_t *len = &c->len[(int64_t)l * c->cfg.n_seqs + seq];
        if (*len > n) *len = n;
    }
    return KHUB_STATUS_OK;
}

static const khub_kv_cache_methods methods = {KHUB_STRUCT_INIT(khub_kv_cache_methods),
                                              .create = kv_create,
                                              .destroy = kv_destroy,
                                              .write = kv_write,
                                              .view = kv_view,
                                              .truncate = kv_truncate};
static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .priority = 5};
#define OP_KIND    KHUB_OP_KV_CACHE
#define OP_NAME    "static_cache"
#define OP_RUN     NULL
#define OP_METHODS (&methods)

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = OP_NAME, .kind = OP_KIND, .caps = &caps,
     .methods = OP_METHODS, /* NULL except for a kv_cache's methods */
     .run = OP_RUN},
};

khub_status TEMPLATE_CNAME_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                                size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "@ID@",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = (void *)host};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(TEMPLATE_CNAME_init, "@ID@", "1.0.0", KHUB_KIND_BIT(OP_KIND))
