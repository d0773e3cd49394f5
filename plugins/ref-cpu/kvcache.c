/*
 * kvcache.c: the reference KV caches (methods only): the dynamic one (op
 * "kv_cache") and the static one (op "static_cache", the built-in behind
 * `--cache static`, like Transformers' StaticCache).
 *
 * One slot per (layer, sequence) holds K and V for positions [0, len). A
 * slot's storage starts empty and grows by doubling (from 16 tokens) up to
 * the config's max_tokens; writing past max_tokens is KHUB_STATUS_CONTEXT_FULL.
 * Storage is head-major, [n_kv_heads][cap][head_dim] in the config's dtype
 * (f32 or f16; writes take f32 and round to nearest even for f16), like
 * Transformers' [batch, heads, seq, dim] cache tensors, so views are genuinely
 * strided: shape [n, n_kv_heads, head_dim], strides [head_dim, cap * head_dim,
 * 1] elements.
 *
 * The static cache differs in one thing: a slot's first write allocates its
 * whole capacity (max_tokens), so its storage and the views' strides never
 * change afterwards and decoding never allocates. Unlike StaticCache it does
 * not allocate at create: a sequence never written costs nothing.
 *
 * Writes must not leave gaps (pos <= len); rewriting earlier positions is
 * allowed and keeps len = max(len, pos + n). A view's data stays valid until
 * the next write or truncate of that sequence (growth moves the storage).
 * Threading: none inside; calls on one cache must be serialised by the
 * caller, calls on different caches are independent.
 */
#include "kvcache_strategy.h"

#define KV_MIN_CAP 16

typedef struct kv_slot {
    uint8_t *k, *v; /* [n_kv_heads][cap][head_dim] elements of esize bytes, or NULL */
    int64_t cap;    /* tokens of storage */
    int64_t len;    /* tokens written, <= cap */
} kv_slot;

struct khub_kv_cache {
    khub_kv_cache_config cfg;
    bool fixed;     /* static: a slot's first write allocates max_tokens */
    size_t esize;   /* 4 (f32) or 2 (f16) */
    kv_slot *slots; /* [n_layers * n_seqs], layer-major */
};

static kv_slot *kv_slot_at(khub_kv_cache *c, int32_t layer, int32_t seq)
{
    return &c->slots[(int64_t)layer * c->cfg.n_seqs + seq];
}

static bool kv_is_f16(const khub_kv_cache *c) { return c->esize == 2; }

/* ------------------------------------------------------------------------ */
/* create / destroy                                                         */
/* ------------------------------------------------------------------------ */

static khub_status kv_create(void *state, const khub_kv_cache_config *cfg, bool fixed,
                             khub_kv_cache **out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    void *c = host->host_ctx;
    if (!out) return host->fail(c, KHUB_STATUS_INVALID_ARG, "kv_cache.create: out is NULL");
    *out = NULL;
    size_t esize = 0;
    KHUB_PU_TRY(khub_ref__kv_config_check(host, "kv_cache.create", cfg, &esize));
    size_t n_slots = (size_t)cfg->n_layers * (size_t)cfg->n_seqs; /* < 2^62: int32 x int32 */
    khub_kv_cache *kc = host->alloc(c, sizeof *kc);
    kv_slot *slots = host->alloc(c, n_slots * sizeof *slots);
    if (!kc || !slots) {
        host->free(c, kc);
        host->free(c, slots);
        return host->fail(c, KHUB_STATUS_NOMEM, "kv_cache.create: out of memory for %zu slots",
                          n_slots);
    }
    memset(slots, 0, n_slots * sizeof *slots);
    khub_pu_kv_config_copy(&kc->cfg, cfg);
    kc->fixed = fixed;
    kc->esize = esize;
    kc->slots = slots;
    *out = kc;
    return KHUB_STATUS_OK;
}

static khub_status ref_kv_create(void *state, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    return kv_create(state, cfg, false, out);
}

static khub_status ref_static_create(void *state, const khub_kv_cache_config *cfg,
                                     khub_kv_cache **out)
{
    return kv_create(state, cfg, true, out);
}

static void ref_kv_destroy(void *state, khub_kv_cache *kc)
{
    if (!kc) return;
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    int64_t n_slots = (int64_t)kc->cfg.n_layers * kc->cfg.n_seqs;
    for (int64_t i = 0; i < n_slots; i++) {
        host->free(host->host_ctx, kc->slots[i].k);
        host->free(host->host_ctx, kc->slots[i].v);
    }
    host->free(host->host_ctx, kc->slots);
    host->free(host->host_ctx, kc);
}

/* ------------------------------------------------------------------------ */
/* write                                                                    */
/* ------------------------------------------------------------------------ */

/* Grows slot s to hold at least `need` tokens (need <= max_tokens), moving
 * positions [0, len) into the new head-major storage. */
static khub_status kv_grow(const khub_host_api *host, khub_kv_cache *kc, kv_slot *s, int64_t need)
{
    int64_t cap = s->cap ? s->cap : KV_MIN_CAP;
    while (cap < need) cap *= 2;
    if (cap > kc->cfg.max_tokens) cap = kc->cfg.max_tokens;
    int64_t H = kc->cfg.n_kv_heads, D = kc->cfg.head_dim;
    size_t bytes = (size_t)cap * (size_t)H * (size_t)D * kc->esize; /* checked at create */
    uint8_t *k = host->alloc(host->host_ctx, bytes), *v = host->alloc(host->host_ctx, bytes);
    if (!k || !v) {
        host->free(host->host_ctx, k);
        host->free(host->host_ctx, v);
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          "kv_cache.write: out of memory growing a slot to %lld tokens (%zu bytes)",
                          (long long)cap, bytes);
    }
    size_t row = (size_t)D * kc->esize;
    for (int64_t h = 0; h < H && s->len > 0; h++) {
        memcpy(k + (size_t)(h * cap) * row, s->k + (size_t)(h * s->cap) * row,
               (size_t)s->len * row);
        memcpy(v + (size_t)(h * cap) * row, s->v + (size_t)(h * s->cap) * row,
               (size_t)s->len * row);
    }
    host->free(host->host_ctx, s->k);
    host->free(host->host_ctx, s->v);
    s->k = k;
    s->v = v;
    s->cap = cap;
    return KHUB_STATUS_OK;
}

/* Copies t ([n, H, D] f32, strided) into slot storage dst at position pos. */
static void kv_store(const khub_kv_cache *kc, const kv_slot *s, uint8_t *dst, const khub_tensor *t,
                     int64_t pos)
{
    int64_t st[3], n = t->shape[0], H = kc->cfg.n_kv_heads, D = kc->cfg.head_dim;
    khub_pu_strides(t, st);
    const float *src = khub_pu_base(t);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t h = 0; h < H; h++) {
            const float *x = src + i * st[0] + h * st[1];
            int64_t at = (h * s->cap + pos + i) * D;
            for (int64_t d = 0; d < D; d++) {
                float val = x[d * st[2]];
                if (kv_is_f16(kc))
                    ((uint16_t *)dst)[at + d] = khub_pu_f32_to_f16(val);
                else
                    ((float *)dst)[at + d] = val;
            }
        }
    }
}

static khub_status kv_locate(const khub_host_api *host, const char *op, khub_kv_cache *kc,
                             int32_t layer, int32_t seq)
{
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    return khub_ref__kv_locate(host, op, &kc->cfg, layer, seq);
}

static khub_status kv_write_check(const khub_host_api *host, khub_kv_cache *kc,
                                  const khub_kv_write_args *a)
{
    const char *op = "kv_cache.write";
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    KHUB_PU_TRY(khub_pu_args_check(host, op, a, sizeof(khub_kv_write_args)));
    KHUB_PU_TRY(kv_locate(host, op, kc, a->layer, a->seq));
    const kv_slot *s = kv_slot_at(kc, a->layer, a->seq);
    return khub_ref__kv_write_check(host, op, &kc->cfg, a, 0, s->len);
}

static khub_status ref_kv_write(void *state, khub_kv_cache *kc, const khub_kv_write_args *a)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(kv_write_check(host, kc, a));
    kv_slot *s = kv_slot_at(kc, a->layer, a->seq);
    int64_t n = a->k->shape[0], end = a->pos + n;
    if (n == 0) return KHUB_STATUS_OK;
    if (end > s->cap) KHUB_PU_TRY(kv_grow(host, kc, s, kc->fixed ? kc->cfg.max_tokens : end));
    kv_store(kc, s, s->k, a->k, a->pos);
    kv_store(kc, s, s->v, a->v, a->pos);
    if (end > s->len) s->len = end;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* view / truncate                                                          */
/* ------------------------------------------------------------------------ */

static khub_status kv_fill_view(const khub_host_api *host, const khub_kv_cache *kc,
                                const kv_slot *s, int64_t n, uint8_t *data, khub_tensor *t,
                                const char *name)
{
    if (!t || !t->shape || !t->strides)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "kv_cache.view: %s, %s->shape or %s->strides is NULL (want caller "
                          "arrays of 3)",
                          name, name, name);
    t->data = data;
    t->device = (khub_device){KHUB_DEVICE_CPU, 0};
    t->ndim = 3;
    t->dtype = kc->cfg.dtype;
    t->byte_offset = 0;
    t->shape[0] = n;
    t->shape[1] = kc->cfg.n_kv_heads;
    t->shape[2] = kc->cfg.head_dim;
    t->strides[0] = kc->cfg.head_dim;
    t->strides[1] = s->cap * kc->cfg.head_dim;
    t->strides[2] = 1;
    return KHUB_STATUS_OK;
}

/* k and v describe positions [0, n); data is NULL while the slot has never
 * been written. */
static khub_status ref_kv_view(void *state, khub_kv_cache *kc, int32_t layer, int32_t seq,
                               int64_t n, khub_tensor *k, khub_tensor *v)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(kv_locate(host, "kv_cache.view", kc, layer, seq));
    const kv_slot *s = kv_slot_at(kc, layer, seq);
    if (n < 0 || n > s->len)
        return host->fail(
            host->host_ctx, KHUB_STATUS_INVALID_ARG,
            "kv_cache.view: n (got %lld, want 0..%lld, the length of layer %d seq %d)",
            (long long)n, (long long)s->len, (int)layer, (int)seq);
    KHUB_PU_TRY(kv_fill_view(host, kc, s, n, s->k, k, "k"));
    return kv_fill_view(host, kc, s, n, s->v, v, "v");
}

static khub_status ref_kv_truncate(void *state, khub_kv_cache *kc, int32_t seq, int64_t n)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(kv_locate(host, "kv_cache.truncate", kc, 0, seq));
    if (n < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "kv_cache.truncate: n (got %lld, want >= 0)", (long long)n);
    for (int32_t l = 0; l < kc->cfg.n_layers; l++) {
        kv_slot *s = kv_slot_at(kc, l, seq);
        if (s->len > n) s->len = n;
    }
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* memory                                                                   */
/* ------------------------------------------------------------------------ */

static khub_status ref_kv_memory(void *state, khub_kv_cache *kc, khub_kv_cache_memory *out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(kv_locate(host, "kv_cache.memory", kc, 0, 0));
    KHUB_PU_TRY(khub_pu_args_check(host, "kv_cache.memory", out, sizeof *out));
    uint64_t row = (uint64_t)kc->cfg.n_kv_heads * (uint64_t)kc->cfg.head_dim * kc->esize * 2;
    uint64_t total = 0;
    int64_t used = 0;
    for (int32_t q = 0; q < kc->cfg.n_seqs; q++) {
        int64_t longest = 0;
        for (int32_t l = 0; l < kc->cfg.n_layers; l++) {
            const kv_slot *s = kv_slot_at(kc, l, q);
            total += (uint64_t)s->cap * row;
            if (s->len > longest) longest = s->len;
        }
        used += longest;
    }
    out->bytes_total = total;
    out->bytes_per_token = row * (uint64_t)kc->cfg.n_layers;
    out->tokens_capacity = kc->cfg.max_tokens;
    out->tokens_used = used;
    return KHUB_STATUS_OK;
}

static const khub_kv_cache_methods kv_methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = ref_kv_create,
    .destroy = ref_kv_destroy,
    .write = ref_kv_write,
    .view = ref_kv_view,
    .truncate = ref_kv_truncate,
    .memory = ref_kv_memory,
};

static const khub_op_caps kv_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16,
    .flags = KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16,
};

const khub_op_desc khub_ref__kv_cache_op = {
    KHUB_STRUCT_INIT(khub_op_desc),
    .name = "kv_cache",
    .kind = KHUB_OP_KV_CACHE,
    .caps = &kv_caps,
    .run = NULL,
    .methods = &kv_methods,
};

static const khub_kv_cache_methods static_methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = ref_static_create,
    .destroy = ref_kv_destroy,
    .write = ref_kv_write,
    .view = ref_kv_view,
    .truncate = ref_kv_truncate,
    .memory = ref_kv_memory,
};

/* Priority -1: served only when named (`--cache static`,
 * "khub/ref-cpu:static_cache"); the dynamic cache stays the default. */
static const khub_op_caps static_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16,
    .flags = KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16,
    .priority = -1,
};

const khub_op_desc khub_ref__static_cache_op = {
    KHUB_STRUCT_INIT(khub_op_desc),
    .name = "static_cache",
    .kind = KHUB_OP_KV_CACHE,
    .caps = &static_caps,
    .run = NULL,
    .methods = &static_methods,
};
