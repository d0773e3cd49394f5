/*
 * paged_cuda.c: kernels-community/kv-cache-cuda's paged KV cache in device
 * memory (op "paged_cache") and the attention that reads it (op
 * "paged_attention"), the pair of layout KHUB_KV_LAYOUT_PAGED_HTD, as
 * khub/ref-cpu's paged_cache and paged_attention are on the CPU (vLLM's
 * PagedAttention memory model; docs/gpu.md, docs/batching.md).
 *
 * The cache. One device block holds every layer's K and V pools,
 * [n_layers][2][n_blocks][n_kv_heads][block_size][head_dim] in f32 or f16;
 * block b of a sequence is the same block id in every layer. The block
 * table is kept twice: on the host (the truth, with the free list and the
 * blocks each sequence holds) and in device memory ([n_seqs][row] int32,
 * -1 = none), which the attention and the append kernels read; reserve and
 * release copy the entries they change up at once (on the legacy stream:
 * their args carry no stream; the model's blocking stream is ordered with
 * it, so a kernel queued before the copy reads the old entries and one
 * queued after the new), a write that takes blocks on its ctx's stream.
 * paged_view describes device tensors and the DEVICE table: the host must
 * not read block_table through it (n_free and n_blocks are host values).
 * Sizing is ref-cpu's: n_blocks if set; else as many blocks as max_bytes
 * holds; else every sequence at max_tokens; block_size 16 unless set.
 * Reserve takes blocks lowest id first and fails with KHUB_STATUS_KV_FULL,
 * taking nothing, when the pool is short; write takes what it needs the
 * same way. There is no dense view (view: UNSUPPORTED).
 *
 * The attention. q and out are compact f32 device tensors [total_q,
 * n_heads, head_dim] (head_dim 64 or 128); every pointer of the args
 * (cu_seqlens_q, q_pos0, kv_lens, block_table, seq_rows) is device memory
 * and is not read here, so the launch shapes come from what the host knows:
 * with total_q <= 8 x n_seqs (decode rows, a few per sequence) the split-K
 * kernels run: one block per (split, head, packed row) over splits of the
 * key range a sequence can reach (block_table_stride x block_size keys,
 * the same for every step, so a captured grid stays valid), ceil(keys /
 * 256) splits, at most 64 and at most what the partials' budget (4 Mi
 * floats) allows, then merged (one split writes out directly); with more
 * rows per sequence, the prefill tiles: one block per (64 rows of a
 * sequence, head), grid.z the sequence. Both are causal or not, with GQA,
 * a sliding window and the soft-cap (ABI 1.5). The partials' scratch is
 * this plugin's, one buffer per stream (as flash-attn2's).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75}; /* kernel.json's capabilities, highest first */

#define PG_DEFAULT_BLOCK 16
#define PG_DECODE_ROWS   8 /* rows per sequence, on average, for split-K */
#define PG_SPLIT_KEYS    256
#define PG_MAX_SPLITS    64
#define PG_PART_BUDGET   (4u << 20) /* floats of partials per call */
#define PG_STREAMS       16

#define PG_TRY(x) \
    do { \
        khub_status st_ = (x); \
        if (st_ != KHUB_STATUS_OK) return st_; \
    } while (0)

typedef struct pg_scratch {
    void *stream;
    uint64_t dptr;
    size_t bytes;
    int used;
} pg_scratch;

typedef struct pg_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded;
    void *write[2];      /* CUfunction: append to f32, to f16 pools */
    void *attn[2][2][2]; /* [head dim 64/128][f32/f16][tiles/decode] */
    void *merge[2];      /* [head dim 64/128] */
    pg_scratch scratch[PG_STREAMS];
} pg_state;

static pg_state g_pg = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define FAIL(st, ...) g_pg.host->fail(g_pg.host->host_ctx, (st), __VA_ARGS__)

/* ======================================================================== */
/* The module and the scratch                                               */
/* ======================================================================== */

static khub_status load_locked(void)
{
    const khub_host_api *host = g_pg.host;
    int cc = 0;
    khub_status st = host->cuda_device_cc(host->host_ctx, 0, &cc);
    if (st != KHUB_STATUS_OK) return st;
    for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
        char name[64];
        const void *img = NULL;
        size_t n = 0;
        snprintf(name, sizeof name, "paged_attn.sm_%d.ptx", ccs[i]);
        if (ccs[i] > cc || host->artifact(host->host_ctx, name, &img, &n) != KHUB_STATUS_OK)
            continue;
        khub_cuda_module *mod = NULL;
        if ((st = host->cuda_module_load(host->host_ctx, 0, img, n, &mod)) != KHUB_STATUS_OK)
            return st;
        static const char *const dt[2] = {"f32", "f16"};
        static const int hds[2] = {64, 128};
        for (int d = 0; d < 2 && st == KHUB_STATUS_OK; d++) {
            snprintf(name, sizeof name, "khub_pkv_write_%s", dt[d]);
            st = host->cuda_module_function(host->host_ctx, mod, name, &g_pg.write[d]);
        }
        for (int h = 0; h < 2 && st == KHUB_STATUS_OK; h++) {
            snprintf(name, sizeof name, "khub_pa_merge_hd%d", hds[h]);
            st = host->cuda_module_function(host->host_ctx, mod, name, &g_pg.merge[h]);
            for (int d = 0; d < 2 && st == KHUB_STATUS_OK; d++) {
                snprintf(name, sizeof name, "khub_pa_hd%d_%s", hds[h], dt[d]);
                st = host->cuda_module_function(host->host_ctx, mod, name, &g_pg.attn[h][d][0]);
                snprintf(name, sizeof name, "khub_pa_decode_hd%d_%s", hds[h], dt[d]);
                if (st == KHUB_STATUS_OK)
                    st = host->cuda_module_function(host->host_ctx, mod, name, &g_pg.attn[h][d][1]);
            }
        }
        g_pg.loaded = st == KHUB_STATUS_OK;
        return st;
    }
    return FAIL(KHUB_STATUS_UNSUPPORTED, "paged_cache (cuda): no PTX for compute capability %d.%d",
                cc / 10, cc % 10);
}

/* The partials' scratch of stream, at least bytes long (flash-attn2's rule:
 * a buffer that grows is replaced after its stream drained). */
static khub_status scratch_locked(void *stream, size_t bytes, uint64_t *out)
{
    const khub_host_api *host = g_pg.host;
    pg_scratch *e = NULL, *free_slot = NULL;
    for (int i = 0; i < PG_STREAMS && !e; i++)
        if (g_pg.scratch[i].used && g_pg.scratch[i].stream == stream)
            e = &g_pg.scratch[i];
        else if (!g_pg.scratch[i].used && !free_slot)
            free_slot = &g_pg.scratch[i];
    if (!e && !free_slot)
        return FAIL(KHUB_STATUS_NOMEM,
                    "paged_attention (cuda): split-K scratch is kept for %d streams; this call "
                    "is on another one",
                    PG_STREAMS);
    if (!e) *(e = free_slot) = (pg_scratch){.stream = stream, .used = 1};
    if (e->bytes < bytes) {
        khub_status st = KHUB_STATUS_OK;
        if (e->dptr) {
            st = host->cuda_stream_sync(host->host_ctx, stream);
            if (st == KHUB_STATUS_OK) st = host->cuda_mem_free(host->host_ctx, e->dptr);
            if (st != KHUB_STATUS_OK) return st;
            e->dptr = 0, e->bytes = 0;
        }
        size_t want = bytes < 2 * e->bytes ? 2 * e->bytes : bytes;
        st = host->cuda_mem_alloc(host->host_ctx, 0, want, &e->dptr);
        if (st != KHUB_STATUS_OK) {
            e->dptr = 0;
            return st;
        }
        e->bytes = want;
    }
    *out = e->dptr;
    return KHUB_STATUS_OK;
}

static khub_status prepare(void *stream, size_t bytes, uint64_t *scratch)
{
    pthread_mutex_lock(&g_pg.lock);
    khub_status st = g_pg.loaded ? KHUB_STATUS_OK : load_locked();
    if (st == KHUB_STATUS_OK && bytes) st = scratch_locked(stream, bytes, scratch);
    pthread_mutex_unlock(&g_pg.lock);
    return st;
}

/* ======================================================================== */
/* The cache                                                                */
/* ======================================================================== */

typedef struct pg_cache {
    khub_kv_cache_config cfg;
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
    khub_status st = host->cuda_mem_alloc(hc, 0, (size_t)(pg_pool_bytes(c) * 2 * L), &c->pool);
    if (st != KHUB_STATUS_OK) {
        c->pool = 0;
        return st;
    }
    st = host->cuda_mem_alloc(hc, 0, S * R * sizeof(int32_t), &c->dtable);
    if (st != KHUB_STATUS_OK) {
        c->dtable = 0;
        return st;
    }
    st = host->cuda_memcpy_htod(hc, c->dtable, c->table, S * R * sizeof(int32_t), NULL);
    if (st != KHUB_STATUS_OK) return st;
    for (size_t l = 0; l < L; l++) {
        khub_tensor t = {NULL, {KHUB_DEVICE_CUDA, 0}, 4, c->cfg.dtype, c->shape, NULL, 0};
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
 * (NULL: the legacy stream). */
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
               : pg_grow(pg_of(kc), "paged_cache (cuda) reserve", seq, n_tokens, NULL);
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
    return pg_sync_row(c, seq, 0, had, NULL); /* the device table forgets them too */
}

static int rows_ok(const khub_tensor *t, const pg_cache *c, int64_t n)
{
    return t && t->ndim == 3 && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           !t->strides && !t->byte_offset && t->device.device_type == KHUB_DEVICE_CUDA &&
           t->shape[0] == n && t->shape[1] == c->cfg.n_kv_heads && t->shape[2] == c->cfg.head_dim;
}

/* Appends n tokens of K/V (device rows) at pos with one launch on the
 * stream of the args' ctx (ABI 1.5; without one the legacy stream, as
 * kv_cache_cuda.c's write), taking the blocks it needs first (their table
 * entries go up on that stream too). */
static khub_status pg_write(void *sp, khub_kv_cache *kc, const khub_kv_write_args *a)
{
    (void)sp;
    const char *op = "paged_cache (cuda) write";
    if (!a || a->struct_size < sizeof *a || !a->k || a->k->ndim != 3)
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
    void *stream = KHUB_HAS_FIELD(a, khub_kv_write_args, ctx) && a->ctx ? a->ctx->stream : NULL;
    PG_TRY(pg_grow(c, op, a->seq, a->pos + n, stream));
    PG_TRY(prepare(NULL, 0, NULL));
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
    PG_TRY(g_pg.host->cuda_launch(g_pg.host->host_ctx, g_pg.write[c->esize == 2], &cfg, params));
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
/* The attention                                                            */
/* ======================================================================== */

static int dev_f32(const khub_tensor *t, int nd)
{
    return t && t->data && t->ndim == nd && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           t->device.device_type == KHUB_DEVICE_CUDA && !t->strides && !t->byte_offset;
}

static int pool_ok(const khub_tensor *t, const khub_tensor *like, int64_t hd)
{
    if (!t || !t->data || t->ndim != 4 || t->device.device_type != KHUB_DEVICE_CUDA || t->strides ||
        t->byte_offset || t->dtype.code != KHUB_DL_FLOAT ||
        (t->dtype.bits != 32 && t->dtype.bits != 16) || t->shape[3] != hd)
        return 0;
    for (int d = 0; like && d < 4; d++)
        if (t->shape[d] != like->shape[d]) return 0;
    return !like || t->dtype.bits == like->dtype.bits;
}

/* What the args must be; everything the host can check without reading
 * device memory (the file comment). */
static khub_status pa_check(const khub_paged_attention_args *a, float *softcap)
{
    const char *op = "paged_attention (cuda)";
    if (!a || a->struct_size < offsetof(khub_paged_attention_args, window) + sizeof a->window)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: args", op);
    *softcap = KHUB_HAS_FIELD(a, khub_paged_attention_args, softcap) ? a->softcap : 0.0f;
    if (a->layout != KHUB_KV_LAYOUT_PAGED_HTD)
        return FAIL(KHUB_STATUS_UNSUPPORTED, "%s: KV layout %u is not served here", op,
                    (unsigned)a->layout);
    if (!a->ctx || a->ctx->struct_size < sizeof(khub_call_ctx) ||
        a->ctx->device.device_type != KHUB_DEVICE_CUDA)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: ctx must name the CUDA device and the stream",
                    op);
    if (!dev_f32(a->q, 3) || !dev_f32(a->out, 3) || a->q->data == a->out->data ||
        (a->q->shape[2] != 64 && a->q->shape[2] != 128) || a->q->shape[1] < 1 ||
        a->q->shape[0] > INT32_MAX)
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: q and out must be distinct compact f32 CUDA tensors [total_q, n_heads, "
                    "64 or 128]",
                    op);
    for (int d = 0; d < 3; d++)
        if (a->out->shape[d] != a->q->shape[d])
            return FAIL(KHUB_STATUS_INVALID_ARG, "%s: out.shape[%d] (got %lld, want q's %lld)", op,
                        d, (long long)a->out->shape[d], (long long)a->q->shape[d]);
    if (!pool_ok(a->k_pool, NULL, a->q->shape[2]) ||
        !pool_ok(a->v_pool, a->k_pool, a->q->shape[2]) || a->k_pool->shape[1] < 1 ||
        a->q->shape[1] % a->k_pool->shape[1] != 0 || a->k_pool->shape[2] != a->block_size ||
        a->k_pool->shape[0] > INT32_MAX)
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: k_pool/v_pool must be compact f32 or f16 CUDA tensors [n_blocks, "
                    "n_kv_heads (a divisor of n_heads), block_size, head_dim], alike",
                    op);
    if (a->n_seqs < 1 || a->n_seqs > 65535 || a->block_size < 1 || a->block_table_stride < 1 ||
        a->block_table_stride * (int64_t)a->block_size > INT32_MAX || a->causal > 1 ||
        a->window < 0 || !(*softcap >= 0.0f) || !a->cu_seqlens_q || !a->q_pos0 || !a->kv_lens ||
        !a->block_table)
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: n_seqs %d (want 1..65535), block_size %d, block_table_stride %lld (want "
                    ">= 1, keys per sequence < 2^31), causal %u, window %lld, softcap %g, and "
                    "the four tables",
                    op, (int)a->n_seqs, (int)a->block_size, (long long)a->block_table_stride,
                    (unsigned)a->causal, (long long)a->window, (double)*softcap);
    return KHUB_STATUS_OK;
}

/* The split-K plan of the file comment (flash-attn2's split_plan). */
static void pa_split_plan(long long rows, long long nh, long long keys, int hd, int *nsplit,
                          int *chunk)
{
    long long n = (keys + PG_SPLIT_KEYS - 1) / PG_SPLIT_KEYS;
    long long cap = (long long)PG_PART_BUDGET / (rows * nh * (hd + 2));
    if (n > PG_MAX_SPLITS) n = PG_MAX_SPLITS;
    if (n > cap) n = cap;
    if (n < 1) n = 1;
    long long c = (keys + n - 1) / n;
    c = (c + 31) / 32 * 32;
    if (c < 32) c = 32;
    *chunk = (int)c;
    n = (keys + c - 1) / c;
    *nsplit = n < 1 ? 1 : (int)n;
}

static khub_status paged_attention_cuda(void *sp, const void *args)
{
    (void)sp;
    const khub_paged_attention_args *a = args;
    float softcap = 0.0f;
    PG_TRY(pa_check(a, &softcap));
    const khub_host_api *host = g_pg.host;
    void *stream = a->ctx->stream;
    int total = (int)a->q->shape[0], nh = (int)a->q->shape[1], hd = (int)a->q->shape[2];
    int nkvh = (int)a->k_pool->shape[1], n_blocks = (int)a->k_pool->shape[0];
    int n_seqs = a->n_seqs, bs = a->block_size, causal = (int)a->causal;
    int h = hd == 128, dt = a->k_pool->dtype.bits == 16;
    long long stride = a->block_table_stride, window = a->window;
    float scale = a->scale;
    if (total == 0) return KHUB_STATUS_OK;
    int decode = total <= PG_DECODE_ROWS * (long long)n_seqs && total <= 65535;
    int nsplit = 1, chunk = 32;
    if (decode) pa_split_plan(total, nh, stride * bs, hd, &nsplit, &chunk);
    size_t bytes = decode && nsplit > 1
                       ? (size_t)total * (size_t)nh * (size_t)nsplit * (size_t)(hd + 2) * 4
                       : 0;
    uint64_t scratch = 0;
    PG_TRY(prepare(stream, bytes, &scratch));
    const void *table = a->block_table, *q = a->q->data, *kp = a->k_pool->data,
               *vp = a->v_pool->data, *cu = a->cu_seqlens_q, *p0 = a->q_pos0, *kl = a->kv_lens,
               *rows = a->seq_rows;
    void *out = a->out->data, *part = (void *)(uintptr_t)scratch;
    void *params[] = {&table,   &q,      &kp,     &vp,   &out,    &cu,   &p0,       &kl,
                      &rows,    &stride, &n_seqs, &nh,   &nkvh,   &bs,   &n_blocks, &scale,
                      &softcap, &causal, &window, &part, &nsplit, &chunk};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .stream = stream};
    if (!decode) {
        cfg.grid[0] = (uint32_t)((total + 63) / 64), cfg.grid[1] = (uint32_t)nh;
        cfg.grid[2] = (uint32_t)n_seqs, cfg.block[0] = 64;
    } else {
        cfg.grid[0] = (uint32_t)nsplit, cfg.grid[1] = (uint32_t)nh, cfg.grid[2] = (uint32_t)total;
        cfg.block[0] = 128;
    }
    cfg.block[1] = cfg.block[2] = 1;
    PG_TRY(host->cuda_launch(host->host_ctx, g_pg.attn[h][dt][decode], &cfg, params));
    if (!decode || nsplit == 1) return KHUB_STATUS_OK;
    void *mparams[] = {&part, &out, &nsplit};
    khub_cuda_launch_cfg mcfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                 .grid = {(uint32_t)(total * nh), 1, 1},
                                 .block = {(uint32_t)hd, 1, 1}, .stream = stream};
    return host->cuda_launch(host->host_ctx, g_pg.merge[h], &mcfg, mparams);
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

static const int32_t pa_head_dims[] = {64, 128};

static const khub_op_caps pa_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .head_dims = pa_head_dims,
    .n_head_dims = 2,
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING,
    .cc_min = 75,
    .priority = 50,
    .kind_flags = KHUB_ATTN_SOFTCAP,
    .kv_layouts = KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD),
};

const khub_op_desc khub_kvc__paged_ops[2] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "paged_cache", .kind = KHUB_OP_KV_CACHE,
     .caps = &pg_caps, .methods = &pg_methods},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "paged_attention", .kind = KHUB_OP_PAGED_ATTENTION,
     .caps = &pa_caps, .run = paged_attention_cuda},
};

void khub_kvc__paged_init(const khub_host_api *host)
{
    g_pg.host = host;
    g_pg.loaded = 0;
    memset(g_pg.scratch, 0, sizeof g_pg.scratch);
}

void khub_kvc__paged_shutdown(void)
{
    for (int i = 0; i < PG_STREAMS; i++)
        if (g_pg.scratch[i].dptr)
            g_pg.host->cuda_mem_free(g_pg.host->host_ctx, g_pg.scratch[i].dptr);
    memset(g_pg.scratch, 0, sizeof g_pg.scratch);
    g_pg.loaded = 0;
}
