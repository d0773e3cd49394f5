/*
 * kv_cache_cuda.c: kernels-community/kv-cache-cuda, a static KV cache in
 * device memory (host glue).
 *
 * As kernels-community/kv-cache on the CPU (Transformers' StaticCache):
 * create() allocates, per sequence, one device block of
 * [n_layers][2][max_tokens][n_kv_heads][head_dim] elements (f32 or f16) up
 * front, so the decode loop never allocates and the K/V addresses never move
 * (what CUDA graph capture needs); write() appends n tokens of f32 K/V
 * device rows with one launch (kv_append.cu, rounding to f16 for f16
 * storage); view() describes positions [0, n) in place as device tensors
 * [n, n_kv_heads, head_dim] with a token stride of n_kv_heads x head_dim
 * elements. Writing past max_tokens is KHUB_STATUS_CONTEXT_FULL.
 *
 * write() appends on the stream the host names in the args' ctx (ABI 1.5):
 * the model's stream, so the append is ordered after the projection that
 * produced K/V and before the attention that reads them, and a CUDA graph
 * the host captures on that stream records it (a launch on the legacy
 * default stream during a capture would invalidate the capture). Without a
 * ctx (a host that sends none) it launches on the legacy default stream,
 * which every stream khub creates (blocking streams, cuStreamCreate flags
 * 0) waits for and is waited by: ordered too, but never inside a graph.
 * The cache lives on the device of the config's ctx (ABI 1.5; cuda:0
 * without one), and its append kernel is that device's module: modules
 * and kernels are kept per device in all three ops (a CUfunction launches
 * only on the device its module was loaded on).
 *
 * The plugin's other two ops are the paged cache (paged_cuda.c) and the
 * paged attention that reads it (paged_attention_cuda.c), layout
 * PAGED_HTD. This file also loads the package's modules for all three
 * (khub_kvc__module, kv_cache_cuda.h).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <khub/khub_plugin.h>

#include "kv_cache_cuda.h"

/* ======================================================================== */
/* The package's modules (kv_cache_cuda.h)                                  */
/* ======================================================================== */

static const int ccs[] = {90, 80, 75}; /* kernel.json's capabilities, highest first */

/* Each module once per device and plugin load: the static cache loads
 * kv_append, the paged cache and the paged attention share paged_attn. */
static const char *const stems[2] = {"kv_append", "paged_attn"};

static struct {
    pthread_mutex_t lock;
    khub_cuda_module *mod[KHUB_CG_MAX_DEVICES][2]; /* [device][stems index] */
} g_mods = {.lock = PTHREAD_MUTEX_INITIALIZER};

static khub_status module_locked(const khub_host_api *host, int device, const char *stem,
                                 const char *who, khub_cuda_module **mod)
{
    size_t slot = 0;
    while (slot < 2 && strcmp(stems[slot], stem) != 0) slot++;
    if (slot == 2 || device < 0 || device >= KHUB_CG_MAX_DEVICES) /* callers' bug */
        return host->fail(host->host_ctx, KHUB_STATUS_INTERNAL, "%s: module %s on cuda:%d", who,
                          stem, device);
    if (g_mods.mod[device][slot]) {
        *mod = g_mods.mod[device][slot];
        return KHUB_STATUS_OK;
    }
    int cc = 0;
    KHUB_CG_TRY(host->cuda_device_cc(host->host_ctx, device, &cc));
    KHUB_CG_TRY(
        khub_cg_load_ptx(host, device, cc, stem, ccs, sizeof ccs / sizeof ccs[0], who, mod));
    g_mods.mod[device][slot] = *mod;
    return KHUB_STATUS_OK;
}

khub_status khub_kvc__module(const khub_host_api *host, int device, const char *stem,
                             const char *who, khub_cuda_module **mod)
{
    pthread_mutex_lock(&g_mods.lock);
    khub_status st = module_locked(host, device, stem, who, mod);
    pthread_mutex_unlock(&g_mods.lock);
    return st;
}

khub_status khub_kvc__config_device(const khub_host_api *host, const char *who,
                                    const khub_kv_cache_config *cfg, int *device)
{
    const khub_call_ctx *ctx = KHUB_HAS_FIELD(cfg, khub_kv_cache_config, ctx) ? cfg->ctx : NULL;
    *device = 0;
    if (!ctx) return KHUB_STATUS_OK;
    if (ctx->struct_size < offsetof(khub_call_ctx, stream) + sizeof ctx->stream ||
        ctx->device.device_type != KHUB_DEVICE_CUDA)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: ctx must name the CUDA device and the stream", who);
    return khub_cg_device(host, who, ctx->device, device);
}

/* ======================================================================== */
/* The static cache                                                         */
/* ======================================================================== */

typedef struct kv_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded[KHUB_CG_MAX_DEVICES];
    void *fn[KHUB_CG_MAX_DEVICES][2]; /* CUfunction per device: append to f32, to f16 */
} kv_state;

static kv_state g_state = {.lock = PTHREAD_MUTEX_INITIALIZER};

struct khub_kv_cache {
    khub_kv_cache_config cfg;
    int device;      /* the CUDA ordinal the blocks live on */
    int elem;        /* 2 (f16) or 4 (f32) */
    int64_t row;     /* elements per token: n_kv_heads * head_dim */
    int64_t *len;    /* [n_seqs] positions held */
    uint64_t *block; /* [n_seqs] device pointers */
};

static int32_t score(void *sp)
{
    const khub_host_api *host = ((kv_state *)sp)->host;
    int n = 0;
    return host->cuda_device_count(host->host_ctx, &n) == KHUB_STATUS_OK && n > 0 ? 1 : 0;
}

static khub_status load_locked(kv_state *s, int dev)
{
    const khub_host_api *host = s->host;
    khub_cuda_module *mod = NULL;
    khub_status st = khub_kvc__module(host, dev, "kv_append", "static_cache (cuda)", &mod);
    if (st == KHUB_STATUS_OK)
        st = host->cuda_module_function(host->host_ctx, mod, "khub_kv_append_f32", &s->fn[dev][0]);
    if (st == KHUB_STATUS_OK)
        st = host->cuda_module_function(host->host_ctx, mod, "khub_kv_append_f16", &s->fn[dev][1]);
    s->loaded[dev] = st == KHUB_STATUS_OK;
    return st;
}

static khub_status load(kv_state *s, int dev)
{
    pthread_mutex_lock(&s->lock);
    khub_status st = s->loaded[dev] ? KHUB_STATUS_OK : load_locked(s, dev);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static void destroy(void *sp, khub_kv_cache *c)
{
    const khub_host_api *host = ((kv_state *)sp)->host;
    if (!c) return;
    for (int32_t s = 0; c->block && s < c->cfg.n_seqs; s++)
        if (c->block[s]) host->cuda_mem_free(host->host_ctx, c->block[s]);
    host->free(host->host_ctx, c->block);
    host->free(host->host_ctx, c->len);
    host->free(host->host_ctx, c);
}

static khub_status create(void *sp, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    const khub_host_api *host = ((kv_state *)sp)->host;
    *out = NULL;
    int f16 = cfg && cfg->dtype.code == KHUB_DL_FLOAT && cfg->dtype.bits == 16;
    int f32 = cfg && cfg->dtype.code == KHUB_DL_FLOAT && cfg->dtype.bits == 32;
    if (!cfg || cfg->struct_size < sizeof *cfg || (!f16 && !f32) || cfg->n_layers < 1 ||
        cfg->n_kv_heads < 1 || cfg->head_dim < 1 || cfg->n_seqs < 1 || cfg->n_seqs > 4096 ||
        cfg->max_tokens < 1 || cfg->max_tokens > (INT64_C(1) << 24))
        return host->fail(
            host->host_ctx, KHUB_STATUS_INVALID_ARG,
            "static_cache (cuda): config needs f16 or f32, positive sizes, max_tokens <= 2^24");
    int dev = 0;
    KHUB_CG_TRY(khub_kvc__config_device(host, "static_cache (cuda) create", cfg, &dev));
    khub_kv_cache *c = host->alloc(host->host_ctx, sizeof *c);
    if (!c)
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM, "static_cache (cuda): out of memory");
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    c->cfg.ctx = NULL; /* borrowed for the call */
    c->device = dev;
    c->elem = f16 ? 2 : 4;
    c->row = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    unsigned __int128 bytes = (unsigned __int128)cfg->n_layers * 2 * (uint64_t)cfg->max_tokens *
                              (uint64_t)c->row * (uint64_t)c->elem;
    c->len = host->alloc(host->host_ctx, sizeof(int64_t) * (size_t)cfg->n_seqs);
    c->block = host->alloc(host->host_ctx, sizeof(uint64_t) * (size_t)cfg->n_seqs);
    if (!c->len || !c->block || bytes > ((unsigned __int128)1 << 40)) {
        destroy(sp, c);
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM, "static_cache (cuda): out of memory");
    }
    memset(c->len, 0, sizeof(int64_t) * (size_t)cfg->n_seqs);
    memset(c->block, 0, sizeof(uint64_t) * (size_t)cfg->n_seqs);
    for (int32_t s = 0; s < cfg->n_seqs; s++) {
        khub_status st = host->cuda_mem_alloc(host->host_ctx, dev, (size_t)bytes, &c->block[s]);
        if (st != KHUB_STATUS_OK) {
            c->block[s] = 0;
            destroy(sp, c);
            return st; /* the driver layer's message names the call and the error */
        }
    }
    *out = c;
    return KHUB_STATUS_OK;
}

static int rows_ok(const khub_tensor *t, const khub_kv_cache *c, int64_t n)
{
    return t && t->ndim == 3 && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           !t->strides && !t->byte_offset && t->device.device_type == KHUB_DEVICE_CUDA &&
           t->shape[0] == n && t->shape[1] == c->cfg.n_kv_heads && t->shape[2] == c->cfg.head_dim;
}

/* Device address of (seq, layer, K or V, pos). */
static uint64_t kv_at(const khub_kv_cache *c, int32_t seq, int32_t layer, int which, int64_t pos)
{
    uint64_t per_tensor = (uint64_t)c->cfg.max_tokens * (uint64_t)c->row * (uint64_t)c->elem;
    return c->block[seq] + ((uint64_t)layer * 2 + (uint64_t)which) * per_tensor +
           (uint64_t)pos * (uint64_t)c->row * (uint64_t)c->elem;
}

static khub_status write(void *sp, khub_kv_cache *c, const khub_kv_write_args *a)
{
    kv_state *s = sp;
    const khub_host_api *host = s->host;
    /* the 1.0 layout at least; ctx (1.5) is read only when the args hold it */
    if (!c || !a || a->struct_size < offsetof(khub_kv_write_args, ctx) || !a->k || a->layer < 0 ||
        a->layer >= c->cfg.n_layers || a->seq < 0 || a->seq >= c->cfg.n_seqs || a->pos < 0 ||
        a->k->ndim != 3)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "static_cache (cuda) write: layer, seq or pos out of range");
    int64_t n = a->k->shape[0];
    if (!rows_ok(a->k, c, n) || !rows_ok(a->v, c, n))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "static_cache (cuda) write: k and v must be compact f32 CUDA tensors "
                          "[n, %d, %d]",
                          c->cfg.n_kv_heads, c->cfg.head_dim);
    if (a->pos > c->len[a->seq] || a->pos + n > c->cfg.max_tokens)
        return host->fail(
            host->host_ctx,
            a->pos + n > c->cfg.max_tokens ? KHUB_STATUS_CONTEXT_FULL : KHUB_STATUS_INVALID_ARG,
            "static_cache (cuda) write: positions [%lld, %lld) with %lld held, capacity %lld",
            (long long)a->pos, (long long)(a->pos + n), (long long)c->len[a->seq],
            (long long)c->cfg.max_tokens);
    khub_status st = load(s, c->device);
    if (st != KHUB_STATUS_OK) return st;
    const void *k = a->k->data, *v = a->v->data;
    void *dk = (void *)(uintptr_t)kv_at(c, a->seq, a->layer, 0, a->pos);
    void *dv = (void *)(uintptr_t)kv_at(c, a->seq, a->layer, 1, a->pos);
    long long count = (long long)(n * c->row);
    void *params[] = {&k, &v, &dk, &dv, &count};
    void *stream = KHUB_HAS_FIELD(a, khub_kv_write_args, ctx) && a->ctx ? a->ctx->stream : NULL;
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)((count + 255) / 256), 2, 1},
                                .block = {256, 1, 1}, .stream = stream};
    if (count > 0)
        st = host->cuda_launch(host->host_ctx, s->fn[c->device][c->elem == 2], &cfg, params);
    if (st != KHUB_STATUS_OK) return st;
    /* the sequence holds positions up to the furthest one written in any layer */
    if (a->pos + n > c->len[a->seq]) c->len[a->seq] = a->pos + n;
    return KHUB_STATUS_OK;
}

static void describe(khub_tensor *t, uint64_t base, const khub_kv_cache *c, int64_t n)
{
    t->data = (void *)(uintptr_t)base;
    t->device = (khub_device){KHUB_DEVICE_CUDA, c->device};
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

static khub_status view(void *sp, khub_kv_cache *c, int32_t layer, int32_t seq, int64_t n,
                        khub_tensor *k, khub_tensor *v)
{
    const khub_host_api *host = ((kv_state *)sp)->host;
    if (!c || layer < 0 || layer >= c->cfg.n_layers || seq < 0 || seq >= c->cfg.n_seqs || n < 0 ||
        n > c->len[seq] || !k || !v || !k->shape || !k->strides || !v->shape || !v->strides)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "static_cache (cuda) view: layer %d, seq %d or n %lld out of range, or "
                          "no shape/stride arrays",
                          layer, seq, (long long)n);
    describe(k, kv_at(c, seq, layer, 0, 0), c, n);
    describe(v, kv_at(c, seq, layer, 1, 0), c, n);
    return KHUB_STATUS_OK;
}

static khub_status truncate_seq(void *sp, khub_kv_cache *c, int32_t seq, int64_t n)
{
    const khub_host_api *host = ((kv_state *)sp)->host;
    if (!c || seq < 0 || seq >= c->cfg.n_seqs || n < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "static_cache (cuda) truncate: seq %d or n %lld out of range", seq,
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
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .flags = KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16,
    .cc_min = 75,
    .priority = 30,
};

static khub_op_desc ops[3];

static void kv_shutdown(void *sp)
{
    (void)sp;
    khub_kvc__paged_shutdown();
    khub_kvc__attention_shutdown();
    memset(g_mods.mod, 0, sizeof g_mods.mod); /* the host unloads the modules */
    memset(g_state.loaded, 0, sizeof g_state.loaded);
}

/* Only the paged attention keeps device memory per stream (its split-K
 * scratch). */
static void kv_stream_end(void *sp, void *stream)
{
    (void)sp;
    khub_kvc__attention_stream_end(stream);
}

khub_status khub_kv_cache_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                    size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_state.host = h;
    memset(g_state.loaded, 0, sizeof g_state.loaded);
    memset(g_mods.mod, 0, sizeof g_mods.mod);
    khub_kvc__paged_init(h);
    khub_kvc__attention_init(h);
    ops[0] = (khub_op_desc){KHUB_STRUCT_INIT(khub_op_desc), .name = "static_cache",
                            .kind = KHUB_OP_KV_CACHE, .caps = &caps, .methods = &methods};
    ops[1] = khub_kvc__paged_cache_op;
    ops[2] = khub_kvc__paged_attention_op;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/kv-cache-cuda",
                          .version = "1.0.0",
                          .n_ops = 3,
                          .ops = ops,
                          .state = &g_state,
                          .score = score,
                          .shutdown = kv_shutdown,
                          .stream_end = kv_stream_end};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_kv_cache_cuda_init, "kernels-community/kv-cache-cuda", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_KV_CACHE) | KHUB_KIND_BIT(KHUB_OP_PAGED_ATTENTION))
