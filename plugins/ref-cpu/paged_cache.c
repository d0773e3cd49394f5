/*
 * paged_cache.c: the reference paged KV cache (op "paged_cache", the
 * built-in behind `--cache paged`; issue 13), vLLM's PagedAttention memory
 * model: K and V live in a pool of fixed-size blocks shared by every
 * sequence, and each sequence holds a row of a block table naming its
 * blocks in order.
 *
 * Layout KHUB_KV_LAYOUT_PAGED_HTD: per layer, a K pool and a V pool
 * [n_blocks, n_kv_heads, block_size, head_dim] in the config's dtype (f32 or
 * f16; writes take f32 and round to nearest even). Block b of a sequence is
 * the same block id in every layer, so the table is one for all layers.
 *
 * Memory. The pools are allocated once, at create, and never move: growth
 * takes a block from the free list, so nothing is ever copied and a view
 * stays valid while sequences grow. Pages of a pool the allocator maps but
 * nobody writes cost address space, not memory; free blocks are handed out
 * lowest id first (a LIFO stack refilled in order) so a lightly used pool
 * touches a compact prefix. Sizing (config, 1.4 fields): n_blocks if set;
 * else as many blocks as max_bytes holds; else enough for every sequence at
 * max_tokens (the dense cache's worst case, so nothing that ran dense runs
 * out of blocks).
 *
 * Blocks are taken by reserve (or by a write that needs them) and given
 * back by release; truncate keeps them. An empty pool is KHUB_STATUS_KV_FULL
 * with the numbers, never a crash, and takes nothing.
 *
 * There is no dense view: view returns UNSUPPORTED and the executor reads
 * the cache through a paged_attention op of the same layout (paged_view).
 * Threading: none inside; calls on one cache are serialised by the caller.
 */
#include "ref_cpu.h"

#if KHUB_PLUGIN_TARGET_MINOR >= \
    4 /* paged ops are ABI 1.4: a build for an older minor leaves them out */

#define PC_DEFAULT_BLOCK 16
#define OPN              "paged_cache"
#define PC_CONFIG_1_0    40 /* sizeof(khub_kv_cache_config) in ABI 1.0-1.3 */

typedef struct pc_layer {
    uint8_t *k, *v;     /* pools, [n_blocks][H][bs][D] elements of esize bytes */
    khub_tensor kt, vt; /* the pools as tensors (paged_view) */
    int64_t shape[4];   /* [n_blocks, H, bs, D], shared by kt and vt */
} pc_layer;

typedef struct paged_cache {
    khub_kv_cache_config cfg;
    size_t esize;      /* 4 (f32) or 2 (f16) */
    int32_t bs;        /* tokens per block */
    int32_t n_blocks;  /* blocks in the pool */
    int32_t row;       /* block table entries per sequence */
    int32_t n_free;    /* entries of free_ids in use */
    int32_t *free_ids; /* [n_blocks] stack of free block ids, top = lowest id */
    int32_t *table;    /* [n_seqs][row] block ids, -1 = none */
    int32_t *held;     /* [n_seqs] blocks each sequence holds */
    int64_t *len;      /* [n_layers][n_seqs] positions written */
    pc_layer *layers;  /* [n_layers] */
} paged_cache;

static paged_cache *pc_of(khub_kv_cache *c) { return (paged_cache *)(void *)c; }

static size_t pc_block_bytes(const paged_cache *pc)
{
    return (size_t)pc->cfg.n_kv_heads * (size_t)pc->bs * (size_t)pc->cfg.head_dim * pc->esize;
}

/* ------------------------------------------------------------------------ */
/* create / destroy                                                         */
/* ------------------------------------------------------------------------ */

/* The pool's block count from the config: see the file comment. */
static khub_status pc_size(const khub_host_api *host, const khub_kv_cache_config *cfg, size_t esize,
                           int32_t bs, int32_t *n_blocks)
{
    void *c = host->host_ctx;
    int64_t per_seq = (cfg->max_tokens + bs - 1) / bs;
    bool v14 = KHUB_HAS_FIELD(cfg, khub_kv_cache_config, max_bytes);
    int64_t n = v14 ? cfg->n_blocks : 0;
    if (n < 0)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OPN ".create: n_blocks (got %lld, want >= 0)",
                          (long long)n);
    /* bytes of one block in every layer, K and V: < 2^62 (int32 products) */
    size_t per_block =
        2 * (size_t)cfg->n_layers * (size_t)cfg->n_kv_heads * (size_t)bs * (size_t)cfg->head_dim;
    per_block *= esize;
    if (n == 0 && v14 && cfg->max_bytes > 0) {
        n = (int64_t)(cfg->max_bytes / per_block);
        if (n < 1)
            return host->fail(c, KHUB_STATUS_INVALID_ARG,
                              OPN ".create: a memory budget of %llu bytes holds no block (one "
                                  "block of %d tokens takes %zu bytes over %d layers; raise the "
                                  "budget or lower the block size)",
                              (unsigned long long)cfg->max_bytes, (int)bs, per_block,
                              (int)cfg->n_layers);
    }
    if (n == 0) n = per_seq * cfg->n_seqs;
    size_t total;
    if (n > INT32_MAX / 2 || __builtin_mul_overflow((size_t)n, per_block, &total) ||
        total > (size_t)INT64_MAX / 2)
        return host->fail(c, KHUB_STATUS_OVERFLOW,
                          OPN ".create: %lld blocks of %zu bytes overflow (lower n_blocks or "
                              "max_tokens)",
                          (long long)n, per_block);
    *n_blocks = (int32_t)n;
    return KHUB_STATUS_OK;
}

static khub_status pc_check(const khub_host_api *host, const khub_kv_cache_config *cfg,
                            size_t *esize, int32_t *bs)
{
    void *c = host->host_ctx;
    KHUB_PU_TRY(khub_pu_args_check(host, OPN ".create", cfg, PC_CONFIG_1_0));
    if (cfg->n_layers < 1 || cfg->n_kv_heads < 1 || cfg->head_dim < 1 || cfg->n_seqs < 1 ||
        cfg->max_tokens < 1 || cfg->max_tokens > INT32_MAX)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OPN ".create: config (got n_layers %d, n_kv_heads %d, head_dim %d, "
                              "n_seqs %d, max_tokens %lld; want all >= 1, max_tokens < 2^31)",
                          (int)cfg->n_layers, (int)cfg->n_kv_heads, (int)cfg->head_dim,
                          (int)cfg->n_seqs, (long long)cfg->max_tokens);
    int id = khub_dtype_id_of(cfg->dtype);
    if (id != KHUB_DTYPE_ID_F32 && id != KHUB_DTYPE_ID_F16)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OPN ".create: dtype (got %s, want f32 or "
                              "f16)",
                          khub_pu_dtype_name(cfg->dtype));
    *esize = id == KHUB_DTYPE_ID_F32 ? 4 : 2;
    *bs = KHUB_HAS_FIELD(cfg, khub_kv_cache_config, block_size) && cfg->block_size
              ? cfg->block_size
              : PC_DEFAULT_BLOCK;
    if (*bs < 1 || *bs > 65536)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OPN ".create: block_size (got %d, want 1..65536)", (int)*bs);
    return KHUB_STATUS_OK;
}

static void pc_destroy(void *state, khub_kv_cache *kc)
{
    if (!kc) return;
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    void *c = host->host_ctx;
    paged_cache *pc = pc_of(kc);
    for (int32_t l = 0; pc->layers && l < pc->cfg.n_layers; l++) {
        host->free(c, pc->layers[l].k);
        host->free(c, pc->layers[l].v);
    }
    host->free(c, pc->layers);
    host->free(c, pc->free_ids);
    host->free(c, pc->table);
    host->free(c, pc->held);
    host->free(c, pc->len);
    host->free(c, pc);
}

/* Fills layer l's pool tensors (their shape array is the layer's own). */
static void pc_tensors(paged_cache *pc, pc_layer *ly)
{
    ly->shape[0] = pc->n_blocks;
    ly->shape[1] = pc->cfg.n_kv_heads;
    ly->shape[2] = pc->bs;
    ly->shape[3] = pc->cfg.head_dim;
    khub_tensor t = {NULL, {KHUB_DEVICE_CPU, 0}, 4, pc->cfg.dtype, ly->shape, NULL, 0};
    ly->kt = t;
    ly->vt = t;
    ly->kt.data = ly->k;
    ly->vt.data = ly->v;
}

static khub_status pc_alloc(const khub_host_api *host, paged_cache *pc)
{
    void *c = host->host_ctx;
    const khub_kv_cache_config *cfg = &pc->cfg;
    size_t S = (size_t)cfg->n_seqs, L = (size_t)cfg->n_layers;
    pc->free_ids = host->alloc(c, (size_t)pc->n_blocks * sizeof(int32_t));
    pc->table = host->alloc(c, S * (size_t)pc->row * sizeof(int32_t));
    pc->held = host->alloc(c, S * sizeof(int32_t));
    pc->len = host->alloc(c, S * L * sizeof(int64_t));
    pc->layers = host->alloc(c, L * sizeof(pc_layer));
    if (!pc->free_ids || !pc->table || !pc->held || !pc->len || !pc->layers)
        return KHUB_STATUS_NOMEM;
    memset(pc->layers, 0, L * sizeof(pc_layer));
    size_t pool = (size_t)pc->n_blocks * pc_block_bytes(pc); /* checked by pc_size */
    for (size_t l = 0; l < L; l++) {
        pc_layer *ly = &pc->layers[l];
        ly->k = host->alloc(c, pool);
        ly->v = host->alloc(c, pool);
        if (!ly->k || !ly->v) return KHUB_STATUS_NOMEM;
        pc_tensors(pc, ly);
    }
    for (int32_t i = 0; i < pc->n_blocks; i++) pc->free_ids[i] = pc->n_blocks - 1 - i;
    pc->n_free = pc->n_blocks;
    for (size_t i = 0; i < S * (size_t)pc->row; i++) pc->table[i] = -1;
    memset(pc->held, 0, S * sizeof(int32_t));
    memset(pc->len, 0, S * L * sizeof(int64_t));
    return KHUB_STATUS_OK;
}

static khub_status pc_create(void *state, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    void *c = host->host_ctx;
    if (!out) return host->fail(c, KHUB_STATUS_INVALID_ARG, OPN ".create: out is NULL");
    *out = NULL;
    size_t esize = 0;
    int32_t bs = 0, n_blocks = 0;
    KHUB_PU_TRY(pc_check(host, cfg, &esize, &bs));
    KHUB_PU_TRY(pc_size(host, cfg, esize, bs, &n_blocks));
    paged_cache *pc = host->alloc(c, sizeof *pc);
    if (!pc) return host->fail(c, KHUB_STATUS_NOMEM, OPN ".create: out of memory");
    memset(pc, 0, sizeof *pc);
    size_t n = cfg->struct_size < sizeof pc->cfg ? cfg->struct_size : sizeof pc->cfg;
    memcpy(&pc->cfg, cfg, n);
    pc->cfg.struct_size = sizeof pc->cfg;
    pc->esize = esize;
    pc->bs = bs;
    pc->n_blocks = n_blocks;
    pc->row = (int32_t)((cfg->max_tokens + bs - 1) / bs);
    if (pc_alloc(host, pc) != KHUB_STATUS_OK) {
        size_t bytes = (size_t)n_blocks * pc_block_bytes(pc) * 2 * (size_t)cfg->n_layers;
        pc_destroy(state, (khub_kv_cache *)(void *)pc);
        return host->fail(c, KHUB_STATUS_NOMEM,
                          OPN ".create: out of memory for a pool of %d blocks of %d tokens "
                              "(%zu bytes; lower --num-blocks or the memory budget)",
                          (int)n_blocks, (int)bs, bytes);
    }
    *out = (khub_kv_cache *)(void *)pc;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* reserve / release                                                        */
/* ------------------------------------------------------------------------ */

static khub_status pc_locate(const khub_host_api *host, const char *op, khub_kv_cache *kc,
                             int32_t layer, int32_t seq)
{
    void *c = host->host_ctx;
    if (!kc) return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    const paged_cache *pc = pc_of(kc);
    if (layer < 0 || layer >= pc->cfg.n_layers)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: layer (got %d, want 0..%d)", op,
                          (int)layer, (int)pc->cfg.n_layers - 1);
    if (seq < 0 || seq >= pc->cfg.n_seqs)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: seq (got %d, want 0..%d)", op, (int)seq,
                          (int)pc->cfg.n_seqs - 1);
    return KHUB_STATUS_OK;
}

static khub_status pc_grow(const khub_host_api *host, paged_cache *pc, const char *op, int32_t seq,
                           int64_t n_tokens)
{
    void *c = host->host_ctx;
    if (n_tokens < 0)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: n_tokens (got %lld, want >= 0)", op,
                          (long long)n_tokens);
    if (n_tokens > pc->cfg.max_tokens)
        return host->fail(c, KHUB_STATUS_CONTEXT_FULL,
                          "%s: sequence %d needs %lld positions, max_tokens is %lld (raise "
                          "max_context)",
                          op, (int)seq, (long long)n_tokens, (long long)pc->cfg.max_tokens);
    int32_t need = (int32_t)((n_tokens + pc->bs - 1) / pc->bs), *held = &pc->held[seq];
    if (need <= *held) return KHUB_STATUS_OK;
    if (need - *held > pc->n_free)
        return host->fail(c, KHUB_STATUS_KV_FULL,
                          "%s: sequence %d needs %d more blocks of %d tokens for %lld tokens, "
                          "the pool has %d of %d free (release finished sequences, or raise "
                          "--num-blocks or the KV memory budget)",
                          op, (int)seq, (int)(need - *held), (int)pc->bs, (long long)n_tokens,
                          (int)pc->n_free, (int)pc->n_blocks);
    int32_t *row = pc->table + (size_t)seq * (size_t)pc->row;
    while (*held < need) row[(*held)++] = pc->free_ids[--pc->n_free];
    return KHUB_STATUS_OK;
}

static khub_status pc_reserve(void *state, khub_kv_cache *kc, int32_t seq, int64_t n_tokens)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(pc_locate(host, OPN ".reserve", kc, 0, seq));
    return pc_grow(host, pc_of(kc), OPN ".reserve", seq, n_tokens);
}

static khub_status pc_release(void *state, khub_kv_cache *kc, int32_t seq)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(pc_locate(host, OPN ".release", kc, 0, seq));
    paged_cache *pc = pc_of(kc);
    int32_t *row = pc->table + (size_t)seq * (size_t)pc->row;
    /* Pushed last block first, so the sequence's first block is on top. */
    while (pc->held[seq] > 0) {
        int32_t b = row[--pc->held[seq]];
        row[pc->held[seq]] = -1;
        pc->free_ids[pc->n_free++] = b;
    }
    for (int32_t l = 0; l < pc->cfg.n_layers; l++)
        pc->len[(size_t)l * (size_t)pc->cfg.n_seqs + (size_t)seq] = 0;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* write / view / truncate / paged_view                                     */
/* ------------------------------------------------------------------------ */

/* f16 of x[0..D) (contiguous) into y, the bits of khub_pu_f32_to_f16.
 * The cache's write sat at 1.5 % of a 32-sequence decode step's CPU with
 * the helper called per element (session 15), while the other thread
 * waited. Here groups of 8 run the helper's normal-range branch with no
 * branch of their own, and note whether any value left that range (zero,
 * f16 subnormals, overflow, inf, NaN); a row that had one is redone with
 * the helper, so every value gets exactly the helper's bits. Plain C: with
 * `restrict` and the fixed group, GCC 12 -O2 vectorizes the group loop
 * with 16-byte (SSE2) vectors, 7x the helper's rate on Zen 2 (session 16). */
static void pc_row_f16(uint16_t *restrict y, const float *restrict x, int64_t D)
{
    uint32_t odd = 0;
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
        for (int i = 0; i < 8; i++) {
            uint32_t b;
            memcpy(&b, &x[d + i], sizeof b);
            uint32_t ax = b & 0x7fffffffu, h = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
            h += (uint32_t)(rem > 0x1000u) | ((uint32_t)(rem == 0x1000u) & h);
            y[d + i] = (uint16_t)(((b >> 16) & 0x8000u) | h);
            odd |= (uint32_t)(ax - 0x38800000u >= 0x477ff000u - 0x38800000u);
        }
    }
    if (odd) d = 0;
    for (; d < D; d++) y[d] = khub_pu_f32_to_f16(x[d]);
}

/* Copies t ([n, H, D] f32, strided) into layer pool dst at positions
 * [pos, pos + n) of the sequence whose block row is row. */
static void pc_store(const paged_cache *pc, const int32_t *row, uint8_t *dst, const khub_tensor *t,
                     int64_t pos)
{
    int64_t st[3], n = t->shape[0], H = pc->cfg.n_kv_heads, D = pc->cfg.head_dim, bs = pc->bs;
    khub_pu_strides(t, st);
    const float *src = khub_pu_base(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t p = pos + i, blk = row[p / bs], slot = p % bs;
        for (int64_t h = 0; h < H; h++) {
            const float *x = src + i * st[0] + h * st[1];
            int64_t at = ((blk * H + h) * bs + slot) * D;
            if (pc->esize == 2 && st[2] == 1)
                pc_row_f16((uint16_t *)dst + at, x, D);
            else if (pc->esize == 2)
                for (int64_t d = 0; d < D; d++)
                    ((uint16_t *)dst)[at + d] = khub_pu_f32_to_f16(x[d * st[2]]);
            else
                for (int64_t d = 0; d < D; d++) ((float *)dst)[at + d] = x[d * st[2]];
        }
    }
}

static khub_status pc_write_check(const khub_host_api *host, khub_kv_cache *kc,
                                  const khub_kv_write_args *a)
{
    const char *op = OPN ".write";
    KHUB_PU_TRY(khub_pu_args_check(host, op, a, sizeof(khub_kv_write_args)));
    KHUB_PU_TRY(pc_locate(host, op, kc, a->layer, a->seq));
    const paged_cache *pc = pc_of(kc);
    const uint64_t f32 = KHUB_REF_BIT_F32;
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "k", a->k, 3, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "v", a->v, 3, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "k", a->k, 1, pc->cfg.n_kv_heads, "n_kv_heads"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "k", a->k, 2, pc->cfg.head_dim, "head_dim"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "v", a->v, 0, a->k->shape[0], "n"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "v", a->v, 1, pc->cfg.n_kv_heads, "n_kv_heads"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "v", a->v, 2, pc->cfg.head_dim, "head_dim"));
    int64_t len = pc->len[(size_t)a->layer * (size_t)pc->cfg.n_seqs + (size_t)a->seq];
    if (a->pos < 0 || a->pos > len)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: pos (got %lld, want 0..%lld, the length of layer %d seq %d; "
                          "positions are written without gaps)",
                          op, (long long)a->pos, (long long)len, (int)a->layer, (int)a->seq);
    return KHUB_STATUS_OK;
}

/* Takes the blocks it needs first (KV_FULL when the pool is short). */
static khub_status pc_write(void *state, khub_kv_cache *kc, const khub_kv_write_args *a)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(pc_write_check(host, kc, a));
    paged_cache *pc = pc_of(kc);
    int64_t n = a->k->shape[0], end = a->pos + n;
    if (n == 0) return KHUB_STATUS_OK;
    KHUB_PU_TRY(pc_grow(host, pc, OPN ".write", a->seq, end));
    const int32_t *row = pc->table + (size_t)a->seq * (size_t)pc->row;
    pc_layer *ly = &pc->layers[a->layer];
    pc_store(pc, row, ly->k, a->k, a->pos);
    pc_store(pc, row, ly->v, a->v, a->pos);
    int64_t *len = &pc->len[(size_t)a->layer * (size_t)pc->cfg.n_seqs + (size_t)a->seq];
    if (end > *len) *len = end;
    return KHUB_STATUS_OK;
}

static khub_status pc_view(void *state, khub_kv_cache *kc, int32_t layer, int32_t seq, int64_t n,
                           khub_tensor *k, khub_tensor *v)
{
    (void)kc, (void)layer, (void)seq, (void)n, (void)k, (void)v;
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                      OPN ".view: a paged cache has no dense view; read it with a "
                          "paged_attention op of layout paged_htd (paged_view)");
}

static khub_status pc_truncate(void *state, khub_kv_cache *kc, int32_t seq, int64_t n)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(pc_locate(host, OPN ".truncate", kc, 0, seq));
    if (n < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          OPN ".truncate: n (got %lld, want >= 0)", (long long)n);
    paged_cache *pc = pc_of(kc);
    for (int32_t l = 0; l < pc->cfg.n_layers; l++) {
        int64_t *len = &pc->len[(size_t)l * (size_t)pc->cfg.n_seqs + (size_t)seq];
        if (*len > n) *len = n;
    }
    return KHUB_STATUS_OK;
}

static khub_status pc_paged_view(void *state, khub_kv_cache *kc, int32_t layer,
                                 khub_kv_paged_view *view)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(pc_locate(host, OPN ".paged_view", kc, layer, 0));
    KHUB_PU_TRY(khub_pu_args_check(host, OPN ".paged_view", view, sizeof(khub_kv_paged_view)));
    paged_cache *pc = pc_of(kc);
    pc_layer *ly = &pc->layers[layer];
    view->layout = KHUB_KV_LAYOUT_PAGED_HTD;
    view->block_size = pc->bs;
    view->k_pool = &ly->kt;
    view->v_pool = &ly->vt;
    view->k_scales = NULL;
    view->v_scales = NULL;
    view->block_table = pc->table;
    view->block_table_stride = pc->row;
    view->n_blocks = pc->n_blocks;
    view->n_free = pc->n_free;
    return KHUB_STATUS_OK;
}

/* The pool is allocated whole at create: bytes_total is all of it (pages
 * never written cost address space only, see the file comment); a token
 * costs one block slot in every layer, K and V; the block table is a fixed
 * cost. A sequence holds at most max_tokens, and at most the pool. */
static khub_status pc_memory(void *state, khub_kv_cache *kc, khub_kv_cache_memory *out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(pc_locate(host, OPN ".memory", kc, 0, 0));
    KHUB_PU_TRY(khub_pu_args_check(host, OPN ".memory", out, sizeof *out));
    const paged_cache *pc = pc_of(kc);
    uint64_t L = (uint64_t)pc->cfg.n_layers,
             pool_tokens = (uint64_t)pc->n_blocks * (uint64_t)pc->bs;
    int64_t used = 0;
    for (int32_t q = 0; q < pc->cfg.n_seqs; q++) {
        int64_t longest = 0;
        for (int32_t l = 0; l < pc->cfg.n_layers; l++) {
            int64_t n = pc->len[(size_t)l * (size_t)pc->cfg.n_seqs + (size_t)q];
            if (n > longest) longest = n;
        }
        used += longest;
    }
    out->bytes_total = (uint64_t)pc->n_blocks * pc_block_bytes(pc) * 2 * L;
    out->bytes_per_token =
        (uint64_t)pc->cfg.n_kv_heads * (uint64_t)pc->cfg.head_dim * pc->esize * 2 * L;
    out->tokens_capacity =
        (int64_t)pool_tokens < pc->cfg.max_tokens ? (int64_t)pool_tokens : pc->cfg.max_tokens;
    out->tokens_used = used;
    return KHUB_STATUS_OK;
}

static const khub_kv_cache_methods paged_methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = pc_create,
    .destroy = pc_destroy,
    .write = pc_write,
    .view = pc_view,
    .truncate = pc_truncate,
    .memory = pc_memory,
    .reserve = pc_reserve,
    .release = pc_release,
    .paged_view = pc_paged_view,
};

/* Priority -1: served only when named (`--cache paged`) or when the
 * executor asks for a paged cache; the dense kv_cache stays the default. */
static const khub_op_caps paged_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16,
    .flags = KHUB_CAP_KV_F16,
    .priority = -1,
    .kv_layouts = KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD),
};

const khub_op_desc khub_ref__paged_cache_op = {
    KHUB_STRUCT_INIT(khub_op_desc),
    .name = "paged_cache",
    .kind = KHUB_OP_KV_CACHE,
    .caps = &paged_caps,
    .run = NULL,
    .methods = &paged_methods,
};

#endif
