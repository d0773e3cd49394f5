/*
 * paged_cuda.c: kernels-community/kv-cache-cuda's paged KV cache in device
 * memory (op "paged_cache"), the cache of layout KHUB_KV_LAYOUT_PAGED_HTD
 * that paged_attention_cuda.c's attention reads, as khub/ref-cpu's
 * paged_cache is on the CPU (vLLM's PagedAttention memory model;
 * docs/gpu.md, docs/batching.md).
 *
 * One device block holds every layer's K and V pools,
 * [n_layers][2][n_blocks][n_kv_heads][block_size][head_dim] in f32 or f16;
 * block b of a sequence is the same block id in every layer. The block
 * table is kept twice: on the host (the truth, with the free list and the
 * blocks each sequence holds) and in device memory ([n_seqs][row] int32,
 * -1 = none), which the attention and the append kernels read; reserve and
 * release copy the entries they change up at once, on the stream of the
 * config's ctx (ABI 1.5: the model's stream, the one the host captures
 * decode steps on as CUDA graphs; a kernel queued on it before the copy
 * reads the old entries, one queued after the new ones, and no other
 * stream is touched, so a capture anywhere holds), a write that takes
 * blocks on its own ctx's stream. Without a ctx (a host of 1.4) they copy
 * on the legacy default stream, which every blocking stream is ordered
 * with, but which a capture in progress on any stream cannot hold. The
 * copies read the host table, pageable memory: the driver stages it before
 * the call returns, so the table may change at once. They are never made
 * inside a capture: the host reserves before a step, and a write inside
 * one finds its blocks taken.
 * paged_view describes device tensors and the DEVICE table: the host must
 * not read block_table through it (n_free and n_blocks are host values).
 * Sizing is ref-cpu's: n_blocks if set; else as many blocks as max_bytes
 * holds; else every sequence at max_tokens; block_size 16 unless set.
 * Reserve takes blocks lowest id first and fails with KHUB_STATUS_KV_FULL,
 * taking nothing, when the pool is short; write takes what it needs the
 * same way. There is no dense view (view: UNSUPPORTED). The pool, the
 * device table and the append kernel are the config ctx's device's
 * (cuda:0 without a ctx).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <khub/khub_plugin.h>

#include "kv_cache_cuda.h"

#define PG_DEFAULT_BLOCK 16

#define PG_TRY(x) \
    do { \
        khub_status st_ = (x); \
        if (st_ != KHUB_STATUS_OK) return st_; \
    } while (0)

static struct {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded[KHUB_CG_MAX_DEVICES];
    void *write[KHUB_CG_MAX_DEVICES][2]; /* CUfunction per device: append to f32, to f16 pools */
} g_pg = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define FAIL(st, ...) g_pg.host->fail(g_pg.host->host_ctx, (st), __VA_ARGS__)

/* dev's append kernels, from the module the attention shares. */
static khub_status load_write(int dev)
{
    const khub_host_api *host = g_pg.host;
    khub_status st = KHUB_STATUS_OK;
    pthread_mutex_lock(&g_pg.lock);
    if (!g_pg.loaded[dev]) {
        khub_cuda_module *mod = NULL;
        st = khub_kvc__module(host, dev, "paged_attn", "paged_cache (cuda)", &mod);
        if (st == KHUB_STATUS_OK)
            st = host->cuda_module_function(host->host_ctx, mod, "khub_pkv_write_f32",
                                            &g_pg.write[dev][0]);
        if (st == KHUB_STATUS_OK)
            st = host->cuda_module_function(host->host_ctx, mod, "khub_pkv_write_f16",
                                            &g_pg.write[dev][1]);
        g_pg.loaded[dev] = st == KHUB_STATUS_OK;
    }
    pthread_mutex_unlock(&g_pg.lock);
    return st;
}

/* ======================================================================== */
/* The cache                                                                */
/* ======================================================================== */

typedef struct pg_cache {
    khub_kv_cache_config cfg;
    int device;           /* the CUDA ordinal of the pool and the device table */
    int esize;            /* 4 (f32) or 2 (f16) */
    int32_t bs;           /* tokens per block */
    int32_t n_blocks;     /* blocks in the pool */
    int32_t row;          /* block table entries per sequence */
    int32_t n_free;       /* entries of free_ids in use */
    int32_t *free_ids;    /* [n_blocks] free block ids, top = lowest id */
    int32_t *table;       /* [n_seqs][row] block ids, -1 = none (host) */
    int32_t *held;        /* [n_seqs] blocks each sequence holds */
    int64_t *len;         /* [n_layers][n_seqs] positions written */
    uint64_t pool;        /* device: every layer's K and V pools */
    uint64_t dtable;      /* device: [n_seqs][row] int32, the table's copy */
    void *stream;         /* the config's ctx->stream (ABI 1.5), NULL = legacy */
    int64_t shape[4];     /* [n_blocks, n_kv_heads, bs, head_dim] */
    khub_tensor *kt, *vt; /* [n_layers] the pools as tensors (paged_view) */
} pg_cache;

static pg_cache *pg_of(khub_kv_cache *c) { return (pg_cache *)(void *)c; }

static uint64_t pg_pool_bytes(const pg_cache *c) /* one pool: one layer's K or V */
{
    return (uint64_t)c->n_blocks * (uint64_t)c->cfg.n_kv_heads * (uint64_t)c->bs *
           (uint64_t)c->cfg.head_dim * (uint64_t)c->esize;
}

static uint64_t pg_pool_at(const pg_cache *c, int32_t layer, int which)
{
    return c->pool + ((uint64_t)layer * 2 + (uint64_t)which) * pg_pool_bytes(c);
}

static void pg_destroy(void *sp, khub_kv_cache *kc)
{
    (void)sp;
    const khub_host_api *host = g_pg.host;
    if (!kc) return;
    pg_cache *c = pg_of(kc);
    if (c->pool) host->cuda_mem_free(host->host_ctx, c->pool);
    if (c->dtable) host->cuda_mem_free(host->host_ctx, c->dtable);
    host->free(host->host_ctx, c->free_ids);
    host->free(host->host_ctx, c->table);
    host->free(host->host_ctx, c->held);
    host->free(host->host_ctx, c->len);
    host->free(host->host_ctx, c->kt);
    host->free(host->host_ctx, c->vt);
    host->free(host->host_ctx, c);
}

/* Copies the config (an older host's is shorter), checks it and sizes the
 * pool: the file comment's rule. */
static khub_status pg_config(pg_cache *c, const khub_kv_cache_config *cfg)
{
    const char *op = "paged_cache (cuda) create";
    if (!cfg || cfg->struct_size < offsetof(khub_kv_cache_config, reserved))
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: no config", op);
    size_t n = cfg->struct_size < sizeof c->cfg ? cfg->struct_size : sizeof c->cfg;
    memcpy(&c->cfg, cfg, n);
    c->cfg.struct_size = sizeof c->cfg;
    const khub_call_ctx *ctx = KHUB_HAS_FIELD(cfg, khub_kv_cache_config, ctx) ? cfg->ctx : NULL;
    c->cfg.ctx = NULL; /* borrowed for the call: only its stream and device are kept */
    PG_TRY(khub_kvc__config_device(g_pg.host, op, cfg, &c->device));
    c->stream = ctx ? ctx->stream : NULL;
    int f16 = cfg->dtype.code == KHUB_DL_FLOAT && cfg->dtype.bits == 16;
    int f32 = cfg->dtype.code == KHUB_DL_FLOAT && cfg->dtype.bits == 32;
    if ((!f16 && !f32) || cfg->n_layers < 1 || cfg->n_kv_heads < 1 || cfg->head_dim < 1 ||
        cfg->n_seqs < 1 || cfg->max_tokens < 1 || cfg->max_tokens > INT32_MAX)
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: config (want f16 or f32, n_layers, n_kv_heads, head_dim, n_seqs, "
                    "max_tokens >= 1, max_tokens < 2^31)",
                    op);
    c->esize = f16 ? 2 : 4;
    int v14 = KHUB_HAS_FIELD(cfg, khub_kv_cache_config, max_bytes);
    c->bs = v14 && cfg->block_size ? cfg->block_size : PG_DEFAULT_BLOCK;
    if (c->bs < 1 || c->bs > 65536)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: block_size (got %d, want 1..65536)", op,
                    (int)c->bs);
    int64_t per_seq = (cfg->max_tokens + c->bs - 1) / c->bs, blocks = v14 ? cfg->n_blocks : 0;
    uint64_t per_block = 2 * (uint64_t)cfg->n_layers * (uint64_t)cfg->n_kv_heads * (uint64_t)c->bs *
                         (uint64_t)cfg->head_dim * (uint64_t)c->esize;
    if (blocks < 0)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: n_blocks (got %lld, want >= 0)", op,
                    (long long)blocks);
    if (blocks == 0 && v14 && cfg->max_bytes > 0) {
        blocks = (int64_t)(cfg->max_bytes / per_block);
        if (blocks < 1)
            return FAIL(KHUB_STATUS_INVALID_ARG,
                        "%s: a memory budget of %llu bytes holds no block (one block of %d "
                        "tokens takes %llu bytes over %d layers; raise the budget or lower the "
                        "block size)",
                        op, (unsigned long long)cfg->max_bytes, (int)c->bs,
                        (unsigned long long)per_block, (int)cfg->n_layers);
    }
    if (blocks == 0) blocks = per_seq * cfg->n_seqs;
    if (blocks > INT32_MAX / 2 || (uint64_t)blocks > (UINT64_C(1) << 40) / per_block)
        return FAIL(KHUB_STATUS_OVERFLOW,
                    "%s: %lld blocks of %llu bytes are more than 1 TiB (lower n_blocks or "
                    "max_tokens)",
                    op, (long long)blocks, (unsigned long long)per_block);
    c->n_blocks = (int32_t)blocks;
    c->row = (int32_t)per_seq;
    return KHUB_STATUS_OK;
}

/* Host arrays, the pool and the device table (all -1). */
static khub_status pg_alloc(pg_cache *c)
{
    const khub_host_api *host = g_pg.host;
    void *hc = host->host_ctx;
    size_t S = (size_t)c->cfg.n_seqs, L = (size_t)c->cfg.n_layers, R = (size_t)c->row;
    c->free_ids = host->alloc(hc, (size_t)c->n_blocks * sizeof(int32_t));
    c->table = host->alloc(hc, S * R * sizeof(int32_t));
    c->held = host->alloc(hc, S * sizeof(int32_t));
    c->len = host->alloc(hc, S * L * sizeof(int64_t));
    c->kt = host->alloc(hc, L * sizeof(khub_tensor));
    c->vt = host->alloc(hc, L * sizeof(khub_tensor));
    if (!c->free_ids || !c->table || !c->held || !c->len || !c->kt || !c->vt)
        return FAIL(KHUB_STATUS_NOMEM, "paged_cache (cuda) create: out of host memory");
    for (int32_t i = 0; i < c->n_blocks; i++) c->free_ids[i] = c->n_blocks - 1 - i;
    c->n_free = c->n_blocks;
    for (size_t i = 0; i < S * R; i++) c->table[i] = -1;
    memset(c->held, 0, S * sizeof(int32_t));
    memset(c->len, 0, S * L * sizeof(int64_t));
    c->shape[0] = c->n_blocks, c->shape[1] = c->cfg.n_kv_heads;
    c->shape[2] = c->bs, c->shape[3] = c->cfg.head_dim;
    /* on failure the driver layer's message names the call */
    khub_status st =
        host->cuda_mem_alloc(hc, c->device, (size_t)(pg_pool_bytes(c) * 2 * L), &c->pool);
    if (st != KHUB_STATUS_OK) {
        c->pool = 0;
        return st;
    }
    st = host->cuda_mem_alloc(hc, c->device, S * R * sizeof(int32_t), &c->dtable);
    if (st != KHUB_STATUS_OK) {
        c->dtable = 0;
        return st;
    }
    st = host->cuda_memcpy_htod(hc, c->dtable, c->table, S * R * sizeof(int32_t), c->stream);
    if (st != KHUB_STATUS_OK) return st;
    for (size_t l = 0; l < L; l++) {
        khub_tensor t = {NULL, {KHUB_DEVICE_CUDA, c->device}, 4, c->cfg.dtype, c->shape, NULL, 0};
        c->kt[l] = c->vt[l] = t;
        c->kt[l].data = (void *)(uintptr_t)pg_pool_at(c, (int32_t)l, 0);
        c->vt[l].data = (void *)(uintptr_t)pg_pool_at(c, (int32_t)l, 1);
    }
    return KHUB_STATUS_OK;
}

static khub_status pg_create(void *sp, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    const khub_host_api *host = g_pg.host;
    if (!out) return FAIL(KHUB_STATUS_INVALID_ARG, "paged_cache (cuda) create: out is NULL");
    *out = NULL;
    pg_cache *c = host->alloc(host->host_ctx, sizeof *c);
    if (!c) return FAIL(KHUB_STATUS_NOMEM, "paged_cache (cuda) create: out of host memory");
    memset(c, 0, sizeof *c);
    khub_status st = pg_config(c, cfg);
    if (st == KHUB_STATUS_OK) st = pg_alloc(c);
    if (st != KHUB_STATUS_OK) {
        pg_destroy(sp, (khub_kv_cache *)(void *)c);
        return st;
    }
    *out = (khub_kv_cache *)(void *)c;
    return KHUB_STATUS_OK;
}

static khub_status pg_locate(const char *op, khub_kv_cache *kc, int32_t layer, int32_t seq)
{
    if (!kc) return FAIL(KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    const pg_cache *c = pg_of(kc);
    if (layer < 0 || layer >= c->cfg.n_layers)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: layer (got %d, want 0..%d)", op, (int)layer,
                    (int)c->cfg.n_layers - 1);
    if (seq < 0 || seq >= c->cfg.n_seqs)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: seq (got %d, want 0..%d)", op, (int)seq,
                    (int)c->cfg.n_seqs - 1);
    return KHUB_STATUS_OK;
}

/* Copies entries [from, to) of seq's table row to the device, on stream
 * (NULL: the legacy stream; the file comment says which). */
static khub_status pg_sync_row(pg_cache *c, int32_t seq, int32_t from, int32_t to, void *stream)
{
    if (to <= from) return KHUB_STATUS_OK;
    size_t at = (size_t)seq * (size_t)c->row + (size_t)from;
    return g_pg.host->cuda_memcpy_htod(g_pg.host->host_ctx, c->dtable + at * sizeof(int32_t),
                                       c->table + at, (size_t)(to - from) * sizeof(int32_t),
                                       stream);
}

/* Gives seq's blocks from index `keep` on back to the pool (last first, so
 * the lowest ids end on top), in the host table only. */
static void pg_drop(pg_cache *c, int32_t seq, int32_t keep)
{
    int32_t *row = c->table + (size_t)seq * (size_t)c->row;
    while (c->held[seq] > keep) {
        int32_t b = row[--c->held[seq]];
        row[c->held[seq]] = -1;
        c->free_ids[c->n_free++] = b;
    }
}

static khub_status pg_grow(pg_cache *c, const char *op, int32_t seq, int64_t n_tokens, void *stream)
{
    if (n_tokens < 0)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: n_tokens (got %lld, want >= 0)", op,
                    (long long)n_tokens);
    if (n_tokens > c->cfg.max_tokens)
        return FAIL(KHUB_STATUS_CONTEXT_FULL,
                    "%s: sequence %d needs %lld positions, max_tokens is %lld (raise "
                    "max_context)",
                    op, (int)seq, (long long)n_tokens, (long long)c->cfg.max_tokens);
    int32_t need = (int32_t)((n_tokens + c->bs - 1) / c->bs), had = c->held[seq];
    if (need <= had) return KHUB_STATUS_OK;
    if (need - had > c->n_free)
        return FAIL(KHUB_STATUS_KV_FULL,
                    "%s: sequence %d needs %d more blocks of %d tokens for %lld tokens, the pool "
                    "has %d of %d free (release finished sequences, or raise --num-blocks or the "
                    "KV memory budget)",
                    op, (int)seq, (int)(need - had), (int)c->bs, (long long)n_tokens,
                    (int)c->n_free, (int)c->n_blocks);
    int32_t *row = c->table + (size_t)seq * (size_t)c->row;
    while (c->held[seq] < need) row[c->held[seq]++] = c->free_ids[--c->n_free];
    khub_status st = pg_sync_row(c, seq, had, need, stream);
    if (st != KHUB_STATUS_OK) pg_drop(c, seq, had); /* nothing taken */
    return st;
}

static khub_status pg_reserve(void *sp, khub_kv_cache *kc, int32_t seq, int64_t n_tokens)
{
    (void)sp;
    khub_status st = pg_locate("paged_cache (cuda) reserve", kc, 0, seq);
    return st != KHUB_STATUS_OK
               ? st
               : pg_grow(pg_of(kc), "paged_cache (cuda) reserve", seq, n_tokens, pg_of(kc)->stream);
}

static khub_status pg_release(void *sp, khub_kv_cache *kc, int32_t seq)
{
    (void)sp;
    PG_TRY(pg_locate("paged_cache (cuda) release", kc, 0, seq));
    pg_cache *c = pg_of(kc);
    int32_t had = c->held[seq];
    pg_drop(c, seq, 0);
    for (int32_t l = 0; l < c->cfg.n_layers; l++)
        c->len[(size_t)l * (size_t)c->cfg.n_seqs + (size_t)seq] = 0;
    return pg_sync_row(c, seq, 0, had, c->stream); /* the device table forgets them too */
}

static int rows_ok(const khub_tensor *t, const pg_cache *c, int64_t n)
{
    return t && t->ndim == 3 && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           !t->strides && !t->byte_offset && t->device.device_type == KHUB_DEVICE_CUDA &&
           t->shape[0] == n && t->shape[1] == c->cfg.n_kv_heads && t->shape[2] == c->cfg.head_dim;
}

/* Appends n tokens of K/V (device rows) at pos with one launch on the
 * stream of the args' ctx (ABI 1.5; without one the config's, else the
 * legacy stream, as kv_cache_cuda.c's write), taking the blocks it needs
 * first (their table entries go up on that stream too). */
static khub_status pg_write(void *sp, khub_kv_cache *kc, const khub_kv_write_args *a)
{
    (void)sp;
    const char *op = "paged_cache (cuda) write";
    /* the 1.0 layout at least; ctx (1.5) is read only when the args hold it */
    if (!a || a->struct_size < offsetof(khub_kv_write_args, ctx) || !a->k || a->k->ndim != 3)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: args", op);
    PG_TRY(pg_locate(op, kc, a->layer, a->seq));
    pg_cache *c = pg_of(kc);
    int64_t n = a->k->shape[0];
    int64_t *len = &c->len[(size_t)a->layer * (size_t)c->cfg.n_seqs + (size_t)a->seq];
    if (!rows_ok(a->k, c, n) || !rows_ok(a->v, c, n))
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: k and v must be compact f32 CUDA tensors [n, %d, %d]", op,
                    (int)c->cfg.n_kv_heads, (int)c->cfg.head_dim);
    if (a->pos < 0 || a->pos > *len)
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: pos (got %lld, want 0..%lld, the length of layer %d seq %d; positions "
                    "are written without gaps)",
                    op, (long long)a->pos, (long long)*len, (int)a->layer, (int)a->seq);
    if (n == 0) return KHUB_STATUS_OK;
    void *stream =
        KHUB_HAS_FIELD(a, khub_kv_write_args, ctx) && a->ctx ? a->ctx->stream : c->stream;
    PG_TRY(pg_grow(c, op, a->seq, a->pos + n, stream));
    PG_TRY(load_write(c->device));
    void *row = (void *)(uintptr_t)(c->dtable + (uint64_t)a->seq * (uint64_t)c->row * 4u);
    const void *k = a->k->data, *v = a->v->data;
    void *kp = (void *)(uintptr_t)pg_pool_at(c, a->layer, 0);
    void *vp = (void *)(uintptr_t)pg_pool_at(c, a->layer, 1);
    long long pos = a->pos, cnt = n;
    int H = c->cfg.n_kv_heads, D = c->cfg.head_dim, bs = c->bs;
    void *params[] = {&row, &k, &v, &kp, &vp, &pos, &cnt, &H, &D, &bs};
    long long total = cnt * H * D;
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)((total + 255) / 256), 2, 1},
                                .block = {256, 1, 1}, .stream = stream};
    PG_TRY(g_pg.host->cuda_launch(g_pg.host->host_ctx, g_pg.write[c->device][c->esize == 2], &cfg,
                                  params));
    if (a->pos + n > *len) *len = a->pos + n;
    return KHUB_STATUS_OK;
}

static khub_status pg_view(void *sp, khub_kv_cache *kc, int32_t layer, int32_t seq, int64_t n,
                           khub_tensor *k, khub_tensor *v)
{
    (void)sp, (void)kc, (void)layer, (void)seq, (void)n, (void)k, (void)v;
    return FAIL(KHUB_STATUS_UNSUPPORTED,
                "paged_cache (cuda) view: a paged cache has no dense view; read it with a "
                "paged_attention op of layout paged_htd (paged_view)");
}

static khub_status pg_truncate(void *sp, khub_kv_cache *kc, int32_t seq, int64_t n)
{
    (void)sp;
    PG_TRY(pg_locate("paged_cache (cuda) truncate", kc, 0, seq));
    if (n < 0)
        return FAIL(KHUB_STATUS_INVALID_ARG, "paged_cache (cuda) truncate: n (got %lld, want >= 0)",
                    (long long)n);
    pg_cache *c = pg_of(kc);
    for (int32_t l = 0; l < c->cfg.n_layers; l++) {
        int64_t *len = &c->len[(size_t)l * (size_t)c->cfg.n_seqs + (size_t)seq];
        if (*len > n) *len = n;
    }
    return KHUB_STATUS_OK;
}

static khub_status pg_paged_view(void *sp, khub_kv_cache *kc, int32_t layer,
                                 khub_kv_paged_view *view)
{
    (void)sp;
    PG_TRY(pg_locate("paged_cache (cuda) paged_view", kc, layer, 0));
    if (!view || view->struct_size < offsetof(khub_kv_paged_view, n_free) + sizeof view->n_free)
        return FAIL(KHUB_STATUS_INVALID_ARG, "paged_cache (cuda) paged_view: view");
    pg_cache *c = pg_of(kc);
    view->layout = KHUB_KV_LAYOUT_PAGED_HTD;
    view->block_size = c->bs;
    view->k_pool = &c->kt[layer];
    view->v_pool = &c->vt[layer];
    view->k_scales = view->v_scales = NULL;
    view->block_table = (const int32_t *)(uintptr_t)c->dtable; /* device memory */
    view->block_table_stride = c->row;
    view->n_blocks = c->n_blocks;
    view->n_free = c->n_free;
    return KHUB_STATUS_OK;
}

static khub_status pg_memory(void *sp, khub_kv_cache *kc, khub_kv_cache_memory *out)
{
    (void)sp;
    PG_TRY(pg_locate("paged_cache (cuda) memory", kc, 0, 0));
    if (!out || out->struct_size < sizeof *out)
        return FAIL(KHUB_STATUS_INVALID_ARG, "paged_cache (cuda) memory: out");
    const pg_cache *c = pg_of(kc);
    int64_t used = 0, pool_tokens = (int64_t)c->n_blocks * c->bs;
    for (int32_t s = 0; s < c->cfg.n_seqs; s++) {
        int64_t longest = 0;
        for (int32_t l = 0; l < c->cfg.n_layers; l++) {
            int64_t n = c->len[(size_t)l * (size_t)c->cfg.n_seqs + (size_t)s];
            if (n > longest) longest = n;
        }
        used += longest;
    }
    out->bytes_total = pg_pool_bytes(c) * 2 * (uint64_t)c->cfg.n_layers;
    out->bytes_per_token = (uint64_t)c->cfg.n_kv_heads * (uint64_t)c->cfg.head_dim *
                           (uint64_t)c->esize * 2 * (uint64_t)c->cfg.n_layers;
    out->tokens_capacity = pool_tokens < c->cfg.max_tokens ? pool_tokens : c->cfg.max_tokens;
    out->tokens_used = used;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* The ops                                                                  */
/* ======================================================================== */

static const khub_kv_cache_methods pg_methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = pg_create,
    .destroy = pg_destroy,
    .write = pg_write,
    .view = pg_view,
    .truncate = pg_truncate,
    .memory = pg_memory,
    .reserve = pg_reserve,
    .release = pg_release,
    .paged_view = pg_paged_view,
};

/* Priority -1, as ref-cpu's paged cache: a dense query (kv_layout 0) is
 * not refused by layout, so the static cache (30) must win it. */
static const khub_op_caps pg_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .flags = KHUB_CAP_KV_F16,
    .cc_min = 75,
    .priority = -1,
    .kv_layouts = KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD),
};

const khub_op_desc khub_kvc__paged_cache_op = {KHUB_STRUCT_INIT(khub_op_desc),
                                               .name = "paged_cache", .kind = KHUB_OP_KV_CACHE,
                                               .caps = &pg_caps, .methods = &pg_methods};

void khub_kvc__paged_init(const khub_host_api *host)
{
    g_pg.host = host;
    memset(g_pg.loaded, 0, sizeof g_pg.loaded);
}

void khub_kvc__paged_shutdown(void) { memset(g_pg.loaded, 0, sizeof g_pg.loaded); }
