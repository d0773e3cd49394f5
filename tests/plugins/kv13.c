/*
 * kv13.c: a KV cache plugin of the ABI 1.3 era (built with today's header
 * for target minor 3, khub_add_plugin TARGET_MINOR 3): its
 * khub_kv_cache_methods end at truncate (48 bytes: no memory, view_from,
 * reserve, release or paged_view) and its khub_kv_cache_config is the 1.0
 * one (40 bytes: no options, layer_window or pool fields). A 1.4 host must
 * load it and run a model with it (test_kv_cache_model), reading nothing
 * past 1.3. One dense f32 slot per (layer, sequence), token-major, the
 * whole max_tokens allocated at the first write.
 */
#include <stdlib.h>
#include <string.h>

#include <khub/khub_plugin.h>

_Static_assert(sizeof(khub_kv_cache_methods) == 48, "a 1.3 target sees the 1.0 methods only");
_Static_assert(sizeof(khub_kv_cache_config) == 40, "a 1.3 target sees the 1.0 config only");

static const khub_host_api *g_host;

typedef struct slot {
    float *k, *v; /* [max_tokens][H * D], or NULL */
    int64_t len;
} slot;

struct khub_kv_cache {
    khub_kv_cache_config cfg;
    slot *slots; /* [n_layers * n_seqs] */
};

static khub_status kv_create(void *st, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    (void)st;
    if (!cfg || cfg->struct_size < sizeof *cfg || cfg->n_layers < 1 || cfg->n_seqs < 1 ||
        cfg->dtype.bits != 32)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG, "kv13.create: bad config");
    khub_kv_cache *c = calloc(1, sizeof *c);
    if (c) c->slots = calloc((size_t)cfg->n_layers * (size_t)cfg->n_seqs, sizeof *c->slots);
    if (!c || !c->slots) {
        free(c);
        return KHUB_STATUS_NOMEM;
    }
    memcpy(&c->cfg, cfg, sizeof c->cfg); /* the 1.0 bytes only */
    *out = c;
    return KHUB_STATUS_OK;
}

static void kv_destroy(void *st, khub_kv_cache *c)
{
    (void)st;
    if (!c) return;
    for (int64_t i = 0; i < (int64_t)c->cfg.n_layers * c->cfg.n_seqs; i++)
        free(c->slots[i].k), free(c->slots[i].v);
    free(c->slots);
    free(c);
}

static slot *at(khub_kv_cache *c, int32_t layer, int32_t seq)
{
    if (layer < 0 || layer >= c->cfg.n_layers || seq < 0 || seq >= c->cfg.n_seqs) return NULL;
    return &c->slots[(int64_t)layer * c->cfg.n_seqs + seq];
}

static khub_status kv_write(void *st, khub_kv_cache *c, const khub_kv_write_args *a)
{
    (void)st;
    slot *s = at(c, a->layer, a->seq);
    int64_t n = a->k->shape[0], hd = (int64_t)c->cfg.n_kv_heads * c->cfg.head_dim;
    if (!s || a->pos < 0 || a->pos > s->len || a->pos + n > c->cfg.max_tokens)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG, "kv13.write: bad position");
    if (!s->k) {
        s->k = malloc((size_t)(c->cfg.max_tokens * hd) * sizeof(float));
        s->v = malloc((size_t)(c->cfg.max_tokens * hd) * sizeof(float));
        if (!s->k || !s->v) return KHUB_STATUS_NOMEM;
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < c->cfg.n_kv_heads; h++)
            for (int64_t d = 0; d < c->cfg.head_dim; d++) {
                const khub_tensor *t[2] = {a->k, a->v};
                float *dst[2] = {s->k, s->v};
                for (int j = 0; j < 2; j++) {
                    const int64_t *sd = t[j]->strides;
                    int64_t off = sd ? i * sd[0] + h * sd[1] + d * sd[2]
                                     : (i * c->cfg.n_kv_heads + h) * c->cfg.head_dim + d;
                    const float *src =
                        (const float *)((const char *)t[j]->data + t[j]->byte_offset);
                    dst[j][(a->pos + i) * hd + h * c->cfg.head_dim + d] = src[off];
                }
            }
    if (a->pos + n > s->len) s->len = a->pos + n;
    return KHUB_STATUS_OK;
}

static void fill(khub_tensor *t, float *data, const khub_kv_cache_config *cfg, int64_t n)
{
    t->data = data;
    t->device = (khub_device){KHUB_DEVICE_CPU, 0};
    t->ndim = 3;
    t->dtype = KHUB_DTYPE_F32;
    t->byte_offset = 0;
    t->shape[0] = n, t->shape[1] = cfg->n_kv_heads, t->shape[2] = cfg->head_dim;
    t->strides[0] = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    t->strides[1] = cfg->head_dim, t->strides[2] = 1;
}

static khub_status kv_view(void *st, khub_kv_cache *c, int32_t layer, int32_t seq, int64_t n,
                           khub_tensor *k, khub_tensor *v)
{
    (void)st;
    slot *s = at(c, layer, seq);
    if (!s || n < 0 || n > s->len)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG, "kv13.view: bad n");
    fill(k, s->k, &c->cfg, n);
    fill(v, s->v, &c->cfg, n);
    return KHUB_STATUS_OK;
}

static khub_status kv_truncate(void *st, khub_kv_cache *c, int32_t seq, int64_t n)
{
    (void)st;
    for (int32_t l = 0; l < c->cfg.n_layers; l++) {
        slot *s = at(c, l, seq);
        if (!s) return KHUB_STATUS_INVALID_ARG;
        if (s->len > n) s->len = n;
    }
    return KHUB_STATUS_OK;
}

static const khub_kv_cache_methods methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = kv_create,
    .destroy = kv_destroy,
    .write = kv_write,
    .view = kv_view,
    .truncate = kv_truncate,
};
static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
                                  .flags = KHUB_CAP_STRIDED_KV};
static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "kv_cache",
                                    .kind = KHUB_OP_KV_CACHE, .caps = &caps, .methods = &methods}};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_host = host;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = "khub-test/kv-1-3",
                          .version = "1.3.0", .n_ops = 1, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(init, "khub-test/kv-1-3", "1.3.0", KHUB_KIND_BIT(KHUB_OP_KV_CACHE))
