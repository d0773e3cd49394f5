/*
 * kvcache_common.c: what every ref-cpu KV cache checks the same way (config,
 * layer and sequence, write arguments), view filling, and the
 * "key=value[,key=value...]" options of the cache strategies
 * (khub_kv_cache_config.options, ABI 1.4), as Transformers' cache_config
 * dict. Every key must be one the cache declares; a value is a non-negative
 * decimal integer or, for a string key, any text without a comma. Refusals
 * name the cache op, the key and what it accepts.
 */
#include <errno.h>
#include <stdlib.h>

#include "kvcache_strategy.h"

static const khub_ref_kv_opt *opt_find(const khub_ref_kv_opt *opts, int n, const char *key,
                                       size_t klen)
{
    for (int i = 0; i < n; i++)
        if (strlen(opts[i].key) == klen && memcmp(opts[i].key, key, klen) == 0) return &opts[i];
    return NULL;
}

static void opt_list(const khub_ref_kv_opt *opts, int n, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len + 1 < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", opts[i].key);
        if (w < 0) break;
        len += (size_t)w;
    }
}

static khub_status opt_set(const khub_host_api *host, const char *op, const khub_ref_kv_opt *o,
                           const char *val, size_t vlen)
{
    void *c = host->host_ctx;
    if (o->sval) {
        if (vlen == 0 || vlen >= o->scap)
            return host->fail(c, KHUB_STATUS_INVALID_ARG,
                              "%s: option %s (got %zu characters, want 1..%zu)", op, o->key, vlen,
                              o->scap - 1);
        memcpy(o->sval, val, vlen);
        o->sval[vlen] = '\0';
        return KHUB_STATUS_OK;
    }
    char num[32];
    bool digits = vlen > 0 && vlen < sizeof num;
    for (size_t i = 0; digits && i < vlen; i++) digits = val[i] >= '0' && val[i] <= '9';
    if (!digits)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: option %s (got \"%.*s\", want a non-negative integer)", op, o->key,
                          (int)(vlen < 40 ? vlen : 40), val);
    memcpy(num, val, vlen);
    num[vlen] = '\0';
    errno = 0;
    long long v = strtoll(num, NULL, 10);
    if (errno == ERANGE)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: option %s (got %s, too large)", op,
                          o->key, num);
    *o->ival = v;
    return KHUB_STATUS_OK;
}

khub_status khub_ref__kv_opts_parse(const khub_host_api *host, const char *op,
                                    const khub_kv_cache_config *cfg, const khub_ref_kv_opt *opts,
                                    int n_opts)
{
    if (!KHUB_HAS_FIELD(cfg, khub_kv_cache_config, options) || !cfg->options) return KHUB_STATUS_OK;
    const char *p = cfg->options;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        char known[256];
        opt_list(opts, n_opts, known, sizeof known);
        if (!eq)
            return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                              "%s: option \"%.*s\" is not key=value (keys: %s)", op,
                              (int)(len < 60 ? len : 60), p, known);
        const khub_ref_kv_opt *o = opt_find(opts, n_opts, p, (size_t)(eq - p));
        if (!o)
            return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                              "%s: unknown option \"%.*s\" (keys: %s)", op,
                              (int)(eq - p < 60 ? eq - p : 60), p, n_opts ? known : "none");
        KHUB_PU_TRY(opt_set(host, op, o, eq + 1, len - (size_t)(eq + 1 - p)));
        p += len;
        if (*p == ',') p++;
    }
    return KHUB_STATUS_OK;
}

khub_status khub_ref__kv_locate(const khub_host_api *host, const char *op,
                                const khub_kv_cache_config *cfg, int32_t layer, int32_t seq)
{
    void *c = host->host_ctx;
    if (layer < 0 || layer >= cfg->n_layers)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: layer (got %d, want 0..%d)", op,
                          (int)layer, (int)cfg->n_layers - 1);
    if (seq < 0 || seq >= cfg->n_seqs)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: seq (got %d, want 0..%d)", op, (int)seq,
                          (int)cfg->n_seqs - 1);
    return KHUB_STATUS_OK;
}

khub_status khub_ref__kv_view_fill(const khub_host_api *host, const char *op, khub_tensor *t,
                                   const char *name, void *data, khub_dtype dtype, int64_t n,
                                   int64_t H, int64_t D, int64_t stride0, int64_t stride1)
{
    if (!t || !t->shape || !t->strides)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: %s, %s->shape or %s->strides is NULL (want caller arrays of 3)", op,
                          name, name, name);
    t->data = data;
    t->device = (khub_device){KHUB_DEVICE_CPU, 0};
    t->ndim = 3;
    t->dtype = dtype;
    t->byte_offset = 0;
    t->shape[0] = n;
    t->shape[1] = H;
    t->shape[2] = D;
    t->strides[0] = stride0;
    t->strides[1] = stride1;
    t->strides[2] = 1;
    return KHUB_STATUS_OK;
}

khub_status khub_ref__kv_config_check(const khub_host_api *host, const char *op,
                                      const khub_kv_cache_config *cfg, size_t *esize)
{
    void *c = host->host_ctx;
    KHUB_PU_TRY(khub_pu_args_check(host, op, cfg, KHUB_PU_KV_CONFIG_1_0_SIZE));
    if (cfg->n_layers < 1 || cfg->n_kv_heads < 1 || cfg->head_dim < 1 || cfg->n_seqs < 1 ||
        cfg->max_tokens < 1)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: config (got n_layers %d, n_kv_heads %d, head_dim %d, n_seqs %d, "
                          "max_tokens %lld; want all >= 1)",
                          op, (int)cfg->n_layers, (int)cfg->n_kv_heads, (int)cfg->head_dim,
                          (int)cfg->n_seqs, (long long)cfg->max_tokens);
    int id = khub_dtype_id_of(cfg->dtype);
    if (id != KHUB_DTYPE_ID_F32 && id != KHUB_DTYPE_ID_F16)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: dtype (got %s, want f32 or f16)", op,
                          khub_pu_dtype_name(cfg->dtype));
    *esize = id == KHUB_DTYPE_ID_F32 ? 4 : 2;
    size_t bytes;
    if (__builtin_mul_overflow((size_t)cfg->max_tokens, (size_t)cfg->n_kv_heads, &bytes) ||
        __builtin_mul_overflow(bytes, (size_t)cfg->head_dim * 4, &bytes) ||
        bytes > (size_t)INT64_MAX / 2)
        return host->fail(c, KHUB_STATUS_OVERFLOW,
                          "%s: max_tokens %lld x n_kv_heads %d x head_dim %d overflows a slot "
                          "(lower max_tokens)",
                          op, (long long)cfg->max_tokens, (int)cfg->n_kv_heads, (int)cfg->head_dim);
    return KHUB_STATUS_OK;
}

khub_status khub_ref__kv_write_check(const khub_host_api *host, const char *op,
                                     const khub_kv_cache_config *cfg, const khub_kv_write_args *a,
                                     int64_t lo, int64_t len)
{
    void *c = host->host_ctx;
    KHUB_PU_TRY(khub_pu_args_check(host, op, a, sizeof(khub_kv_write_args)));
    KHUB_PU_TRY(khub_ref__kv_locate(host, op, cfg, a->layer, a->seq));
    const uint64_t f32 = KHUB_REF_BIT_F32;
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "k", a->k, 3, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "v", a->v, 3, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "k", a->k, 1, cfg->n_kv_heads, "n_kv_heads"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "k", a->k, 2, cfg->head_dim, "head_dim"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "v", a->v, 0, a->k->shape[0], "n"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "v", a->v, 1, cfg->n_kv_heads, "n_kv_heads"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "v", a->v, 2, cfg->head_dim, "head_dim"));
    if (a->pos < lo || a->pos > len)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: pos (got %lld, want %lld..%lld, the length of layer %d seq %d; "
                          "positions are written without gaps)",
                          op, (long long)a->pos, (long long)lo, (long long)len, (int)a->layer,
                          (int)a->seq);
    if (a->k->shape[0] > cfg->max_tokens - a->pos)
        return host->fail(c, KHUB_STATUS_CONTEXT_FULL,
                          "%s: positions %lld..%lld exceed max_tokens %lld (truncate the sequence "
                          "or create a larger cache)",
                          op, (long long)a->pos, (long long)(a->pos + a->k->shape[0] - 1),
                          (long long)cfg->max_tokens);
    return KHUB_STATUS_OK;
}
