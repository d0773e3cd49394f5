/*
 * kvcache_sliding.c: the sliding-window KV cache, op "sliding_cache", behind
 * `--cache sliding` (Transformers' SlidingWindowCache for Mistral / Qwen2
 * layers with a sliding_window, and its HybridCache for Gemma 3's mix of
 * sliding and global layers; issue 13 item 4).
 *
 * A layer whose window is W > 0 (khub_kv_cache_config.layer_window, ABI
 * 1.4) attends only to the W newest positions up to each query
 * (q - key < W), so once a write at pos is done, positions below
 * pos + 1 - W are never read again: the cache drops them. A layer with
 * window 0 (or a config without layer_window) keeps every position, as the
 * dynamic cache does. Memory per sequence of a windowed layer is bounded by
 * max(2W, W - 1 + the longest single write) tokens, whatever the length.
 *
 * Storage of a (layer, sequence) slot: one buffer of rows, token-major
 * [cap][n_kv_heads * head_dim] in the config's dtype, holding positions
 * [base, len) at rows [0, len - base). A write that does not fit first
 * drops the positions no query can read any more (moving the kept rows to
 * the front), and grows the buffer only when that is not enough (or while
 * it is below 2W, so compaction runs at most once per W tokens: amortized
 * O(1) per token, where a ring of exactly W tokens would copy into a view
 * at every step). Rejected: a ring buffer of W rows. A prefill chunk of n
 * tokens needs W - 1 + n positions at once (the queries of the chunk reach
 * back W - 1 before its first position), which a ring of W cannot hold, and
 * its view would wrap around the ring's end and need a copy.
 *
 * Views come through view_from (ABI 1.4): positions [base, n) as
 * [n - base, H, D] with strides [H * D, D, 1], read in place; the host
 * passes attention q_pos0 relative to base, and the window mask leaves out
 * the kept positions older than the window, so attention sees exactly the
 * keys it sees over the dense cache, in the same order. view (1.0) works
 * while nothing was dropped (base 0) and is otherwise UNSUPPORTED.
 *
 * Writes take pos in [lo, len]: lo is 0 while nothing was dropped, else
 * base + W - 1 (a write at pos needs positions from pos + 1 - W). truncate
 * to 0 empties a sequence; truncating to n > 0 is refused, changing
 * nothing, when a layer already dropped positions a write at n would need.
 * Threading: none inside; calls on one cache are serialised by the caller.
 */
#include "kvcache_strategy.h"

#define OPN        "sliding_cache"
#define SW_MIN_CAP 16

typedef struct sw_slot {
    uint8_t *k, *v; /* [cap][H * D] rows of esize-byte elements, or NULL */
    int64_t base;   /* position of row 0 */
    int64_t cap;    /* rows of storage */
    int64_t len;    /* positions written: [base, len) are held */
} sw_slot;

typedef struct sw_cache {
    khub_kv_cache_config cfg;
    size_t esize;   /* 4 (f32) or 2 (f16) */
    size_t row;     /* bytes of one position of K (or V) */
    int64_t *win;   /* [n_layers] window, 0 = keeps every position */
    sw_slot *slots; /* [n_layers * n_seqs], layer-major */
} sw_cache;

static sw_cache *sw_of(khub_kv_cache *c) { return (sw_cache *)(void *)c; }

static sw_slot *sw_slot_at(sw_cache *c, int32_t layer, int32_t seq)
{
    return &c->slots[(int64_t)layer * c->cfg.n_seqs + seq];
}

static khub_status sw_locate(const khub_host_api *host, const char *op, khub_kv_cache *kc,
                             int32_t layer, int32_t seq)
{
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    return khub_ref__kv_locate(host, op, &sw_of(kc)->cfg, layer, seq);
}

/* ------------------------------------------------------------------------ */
/* create / destroy                                                         */
/* ------------------------------------------------------------------------ */

/* The windows from cfg->layer_window (absent or NULL: none slides). */
static khub_status sw_windows(const khub_host_api *host, const khub_kv_cache_config *cfg,
                              int64_t *win)
{
    const int64_t *w =
        KHUB_HAS_FIELD(cfg, khub_kv_cache_config, layer_window) ? cfg->layer_window : NULL;
    for (int32_t l = 0; l < cfg->n_layers; l++) {
        win[l] = w ? w[l] : 0;
        if (win[l] < 0)
            return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                              OPN ".create: layer_window[%d] (got %lld, want >= 0; 0 = no window)",
                              (int)l, (long long)win[l]);
    }
    return KHUB_STATUS_OK;
}

static void sw_destroy(void *state, khub_kv_cache *kc)
{
    if (!kc) return;
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    sw_cache *c = sw_of(kc);
    int64_t n_slots = (int64_t)c->cfg.n_layers * c->cfg.n_seqs;
    for (int64_t i = 0; c->slots && i < n_slots; i++) {
        host->free(host->host_ctx, c->slots[i].k);
        host->free(host->host_ctx, c->slots[i].v);
    }
    host->free(host->host_ctx, c->slots);
    host->free(host->host_ctx, c->win);
    host->free(host->host_ctx, c);
}

static khub_status sw_create(void *state, const khub_kv_cache_config *cfg, khub_kv_cache **out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    void *hc = host->host_ctx;
    if (!out) return host->fail(hc, KHUB_STATUS_INVALID_ARG, OPN ".create: out is NULL");
    *out = NULL;
    size_t esize = 0;
    KHUB_PU_TRY(khub_ref__kv_config_check(host, OPN ".create", cfg, &esize));
    KHUB_PU_TRY(khub_ref__kv_opts_parse(host, OPN ".create", cfg, NULL, 0));
    size_t n_slots = (size_t)cfg->n_layers * (size_t)cfg->n_seqs; /* < 2^62: int32 x int32 */
    sw_cache *c = host->alloc(hc, sizeof *c);
    if (!c) return host->fail(hc, KHUB_STATUS_NOMEM, OPN ".create: out of memory");
    memset(c, 0, sizeof *c);
    c->win = host->alloc(hc, (size_t)cfg->n_layers * sizeof *c->win);
    c->slots = host->alloc(hc, n_slots * sizeof *c->slots);
    if (!c->win || !c->slots) {
        sw_destroy(state, (khub_kv_cache *)(void *)c);
        return host->fail(hc, KHUB_STATUS_NOMEM, OPN ".create: out of memory for %zu slots",
                          n_slots);
    }
    memset(c->slots, 0, n_slots * sizeof *c->slots);
    khub_status st = sw_windows(host, cfg, c->win);
    if (st != KHUB_STATUS_OK) {
        sw_destroy(state, (khub_kv_cache *)(void *)c);
        return st;
    }
    khub_pu_kv_config_copy(&c->cfg, cfg);
    c->esize = esize;
    c->row = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * esize;
    *out = (khub_kv_cache *)(void *)c;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* write                                                                    */
/* ------------------------------------------------------------------------ */

/* The oldest position a write may start at (see the file comment). */
static int64_t sw_lo(const sw_slot *s, int64_t w) { return s->base == 0 ? 0 : s->base + w - 1; }

/* Makes room for positions up to end (exclusive) after dropping those
 * below drop: moves the kept rows [drop, len) to the front and grows the
 * buffer when they and the new ones do not fit (or, for a windowed slot,
 * while it is below 2W). On NOMEM nothing changed. */
static khub_status sw_room(const khub_host_api *host, sw_cache *c, sw_slot *s, int64_t w,
                           int64_t drop, int64_t end)
{
    if (end - s->base <= s->cap) return KHUB_STATUS_OK;
    int64_t keep = s->len - drop, need = end - drop, nc = s->cap;
    if (need > s->cap || (w > 0 && s->cap < 2 * w)) {
        nc = s->cap ? s->cap : SW_MIN_CAP;
        while (nc < need || (w > 0 && nc < 2 * w && nc < c->cfg.max_tokens)) nc *= 2;
        if (nc > c->cfg.max_tokens) nc = c->cfg.max_tokens; /* need <= max_tokens */
    }
    if (nc == s->cap) { /* compaction in place */
        memmove(s->k, s->k + (size_t)(drop - s->base) * c->row, (size_t)keep * c->row);
        memmove(s->v, s->v + (size_t)(drop - s->base) * c->row, (size_t)keep * c->row);
        s->base = drop;
        return KHUB_STATUS_OK;
    }
    size_t bytes = (size_t)nc * c->row; /* max_tokens x H x D x 4 checked at create */
    uint8_t *k = host->alloc(host->host_ctx, bytes), *v = host->alloc(host->host_ctx, bytes);
    if (!k || !v) {
        host->free(host->host_ctx, k);
        host->free(host->host_ctx, v);
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          OPN ".write: out of memory growing a slot to %lld tokens (%zu bytes)",
                          (long long)nc, bytes);
    }
    if (keep > 0) {
        memcpy(k, s->k + (size_t)(drop - s->base) * c->row, (size_t)keep * c->row);
        memcpy(v, s->v + (size_t)(drop - s->base) * c->row, (size_t)keep * c->row);
    }
    host->free(host->host_ctx, s->k);
    host->free(host->host_ctx, s->v);
    s->k = k, s->v = v, s->cap = nc, s->base = drop;
    return KHUB_STATUS_OK;
}

static khub_status sw_write(void *state, khub_kv_cache *kc, const khub_kv_write_args *a)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    const char *op = OPN ".write";
    if (!kc) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: cache is NULL", op);
    KHUB_PU_TRY(khub_pu_args_check(host, op, a, sizeof(khub_kv_write_args)));
    sw_cache *c = sw_of(kc);
    KHUB_PU_TRY(khub_ref__kv_locate(host, op, &c->cfg, a->layer, a->seq));
    sw_slot *s = sw_slot_at(c, a->layer, a->seq);
    int64_t w = c->win[a->layer];
    KHUB_PU_TRY(khub_ref__kv_write_check(host, op, &c->cfg, a, sw_lo(s, w), s->len));
    int64_t n = a->k->shape[0], end = a->pos + n;
    if (n == 0) return KHUB_STATUS_OK;
    int64_t drop = w > 0 && a->pos + 1 - w > s->base ? a->pos + 1 - w : s->base;
    KHUB_PU_TRY(sw_room(host, c, s, w, drop, end > s->len ? end : s->len));
    khub_ref__kv_store_rows(&c->cfg, c->esize, s->k, a->k, a->pos - s->base);
    khub_ref__kv_store_rows(&c->cfg, c->esize, s->v, a->v, a->pos - s->base);
    if (end > s->len) s->len = end;
    return KHUB_STATUS_OK;
}

/* ------------------------------------------------------------------------ */
/* view / view_from / truncate / memory                                     */
/* ------------------------------------------------------------------------ */

static khub_status sw_fill(const khub_host_api *host, const char *op, const sw_cache *c,
                           const sw_slot *s, int64_t n, khub_tensor *k, khub_tensor *v)
{
    int64_t H = c->cfg.n_kv_heads, D = c->cfg.head_dim, m = n - s->base;
    KHUB_PU_TRY(khub_ref__kv_view_fill(host, op, k, "k", s->k, c->cfg.dtype, m, H, D, H * D, D));
    return khub_ref__kv_view_fill(host, op, v, "v", s->v, c->cfg.dtype, m, H, D, H * D, D);
}

static khub_status sw_view_check(const khub_host_api *host, const char *op, khub_kv_cache *kc,
                                 int32_t layer, int32_t seq, int64_t n)
{
    KHUB_PU_TRY(sw_locate(host, op, kc, layer, seq));
    sw_cache *c = sw_of(kc);
    const sw_slot *s = sw_slot_at(c, layer, seq);
    if (n < s->base || n > s->len)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "%s: n (got %lld, want %lld..%lld: layer %d seq %d holds positions "
                          "%lld..%lld)",
                          op, (long long)n, (long long)s->base, (long long)s->len, (int)layer,
                          (int)seq, (long long)s->base, (long long)s->len - 1);
    return KHUB_STATUS_OK;
}

static khub_status sw_view_from(void *state, khub_kv_cache *kc, int32_t layer, int32_t seq,
                                int64_t n, int64_t *first, khub_tensor *k, khub_tensor *v)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    const char *op = OPN ".view_from";
    KHUB_PU_TRY(sw_view_check(host, op, kc, layer, seq, n));
    if (!first) return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: first is NULL", op);
    sw_cache *c = sw_of(kc);
    const sw_slot *s = sw_slot_at(c, layer, seq);
    *first = s->base;
    return sw_fill(host, op, c, s, n, k, v);
}

/* A host without view_from (before ABI 1.4) reads [0, n): possible only
 * while the slot dropped nothing. */
static khub_status sw_view(void *state, khub_kv_cache *kc, int32_t layer, int32_t seq, int64_t n,
                           khub_tensor *k, khub_tensor *v)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    const char *op = OPN ".view";
    KHUB_PU_TRY(sw_locate(host, op, kc, layer, seq));
    sw_cache *c = sw_of(kc);
    const sw_slot *s = sw_slot_at(c, layer, seq);
    if (s->base > 0)
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "%s: layer %d seq %d dropped positions below %lld (window %lld); read "
                          "it with view_from (a host of ABI 1.4)",
                          op, (int)layer, (int)seq, (long long)s->base, (long long)c->win[layer]);
    KHUB_PU_TRY(sw_view_check(host, op, kc, layer, seq, n));
    return sw_fill(host, op, c, s, n, k, v);
}

static khub_status sw_truncate(void *state, khub_kv_cache *kc, int32_t seq, int64_t n)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    const char *op = OPN ".truncate";
    KHUB_PU_TRY(sw_locate(host, op, kc, 0, seq));
    if (n < 0)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "%s: n (got %lld, want >= 0)",
                          op, (long long)n);
    sw_cache *c = sw_of(kc);
    for (int32_t l = 0; n > 0 && l < c->cfg.n_layers; l++) { /* check every layer first */
        const sw_slot *s = sw_slot_at(c, l, seq);
        if (n < s->len && s->base > 0 && n < sw_lo(s, c->win[l]))
            return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                              "%s: seq %d to %lld tokens: layer %d keeps positions from %lld "
                              "only (window %lld), a write at %lld needs them from %lld "
                              "(truncate to 0 and recompute)",
                              op, (int)seq, (long long)n, (int)l, (long long)s->base,
                              (long long)c->win[l], (long long)n, (long long)(n + 1 - c->win[l]));
    }
    for (int32_t l = 0; l < c->cfg.n_layers; l++) {
        sw_slot *s = sw_slot_at(c, l, seq);
        if (n == 0) s->base = 0;
        if (s->len > n) s->len = n;
    }
    return KHUB_STATUS_OK;
}

/* bytes_per_token is what one more token costs once every window is full:
 * the layers without a window only. */
static khub_status sw_memory(void *state, khub_kv_cache *kc, khub_kv_cache_memory *out)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(sw_locate(host, OPN ".memory", kc, 0, 0));
    KHUB_PU_TRY(khub_pu_args_check(host, OPN ".memory", out, sizeof *out));
    sw_cache *c = sw_of(kc);
    uint64_t total = 0, per = 0;
    int64_t used = 0;
    for (int32_t l = 0; l < c->cfg.n_layers; l++)
        if (c->win[l] == 0) per += (uint64_t)c->row * 2;
    for (int32_t q = 0; q < c->cfg.n_seqs; q++) {
        int64_t longest = 0;
        for (int32_t l = 0; l < c->cfg.n_layers; l++) {
            const sw_slot *s = sw_slot_at(c, l, q);
            total += (uint64_t)s->cap * c->row * 2;
            if (s->len > longest) longest = s->len;
        }
        used += longest;
    }
    out->bytes_total = total;
    out->bytes_per_token = per;
    out->tokens_capacity = c->cfg.max_tokens;
    out->tokens_used = used;
    return KHUB_STATUS_OK;
}

static const khub_kv_cache_methods sw_methods = {
    KHUB_STRUCT_INIT(khub_kv_cache_methods),
    .create = sw_create,
    .destroy = sw_destroy,
    .write = sw_write,
    .view = sw_view,
    .truncate = sw_truncate,
    .memory = sw_memory,
    .view_from = sw_view_from,
};

/* Priority -1: served only when named (`--cache sliding`). */
static const khub_op_caps sw_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16,
    .flags = KHUB_CAP_STRIDED_KV | KHUB_CAP_KV_F16,
    .priority = -1,
};

const khub_op_desc khub_ref__sliding_cache_op = {
    KHUB_STRUCT_INIT(khub_op_desc),
    .name = "sliding_cache",
    .kind = KHUB_OP_KV_CACHE,
    .caps = &sw_caps,
    .run = NULL,
    .methods = &sw_methods,
};
