/*
 * paged_attention.c: batched attention over a paged KV cache (op
 * "paged_attention", kind KHUB_OP_PAGED_ATTENTION, layout PAGED_HTD; issue
 * 13), the flash-attention recurrence of attention.c over keys found
 * through a block table.
 *
 * A work item is one sequence s, a block of up to QB of s's queries and a
 * run of up to HC consecutive KV heads g; for each g its rows are those
 * queries times the G query heads that share g (GQA), so each K/V tile
 * serves QB * G rows. The item walks the keys tile by tile and feeds each
 * tile to its heads in turn, asking for the next head's (or tile's) K/V
 * lines while it computes (prefetch_tile): a pool block holds all heads'
 * keys contiguously (bs * hd elements per head), so the heads' reads of a
 * tile are one run of memory, where an item per head made one pass over the
 * sequence's blocks per head, each pass reading 1 / n_kv_heads of every
 * block (docs/performance.md, session 15: the decode attention's CPU time
 * 0.72x). Each head's rows see the same tiles in the same order either way,
 * so the bits do not depend on HC. In layout PAGED_HTD
 * key j of head g is hd contiguous elements at
 * pool + ((row[j / bs] * n_kv_heads + g) * bs + j % bs) * hd. A tile is the
 * dense op's: 32 keys from the first key the rows may see, across block
 * boundaries, given to kx_attn_tile.h as row pointers (f32 read in place;
 * f16 read in place at decode, at most KX_ATT_F16_DIRECT_ROWS rows, else
 * converted once into scratch: kx_attn_tile_f16), so every row gets the bits
 * the dense op gives the same sequence (the solo run's), whatever the block
 * size. Nothing of size kv_len is materialised and sequences of any length
 * share one call. Visibility is the reference's: key j < kv_lens[s], j <= p
 * when causal, p - j < window when window > 0 (p = q_pos0[s] + i); a row
 * that sees nothing gets zeros. A softcap > 0 (ABI 1.5) caps each scaled
 * score as attention.c does. Items are ordered by sequence and claimed one
 * at a time by the pool's threads (lanes_range), each of which allocates
 * its tile buffers once per call.
 */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../include/khub_paged_check.h"
#include "kx_attn_tile.h"

/* Rows (KV heads x QB x G) per work item: decode's 1 query x 3 query heads
 * per KV head gives SmolLM2's 3 KV heads one item per sequence, prefill's
 * QB = 5 queries x 3 too. */
#define KX_PAGED_ITEM_ROWS 48
#define KX_PAGED_MAX_HEADS 16 /* HC: KV heads per item */

typedef struct pjob {
    const khub_pu_paged *p;
    int64_t group;     /* G */
    int64_t qb;        /* queries per work item */
    int64_t hc;        /* KV heads per work item */
    int64_t nhc;       /* head runs per query block: ceil(n_kv_heads / hc) */
    int64_t *first;    /* [n_seqs + 1] first item of each sequence */
    atomic_llong next; /* the next item to claim */
    atomic_int nomem;
    kx_state *s;
} pjob;

typedef struct pscratch {
    float *k, *v;   /* [KX_ATT_KT][hd] each: f16 tiles of many rows, converted */
    float *q, *acc; /* [KX_PAGED_ITEM_ROWS][hd] each: the item's rows, head by head */
} pscratch;

/* Element offsets of keys [j0, j0 + nk) of head g of a sequence (block
 * table row `row`) in a pool, into at[]. */
static void tile_offsets(const khub_pu_paged *p, const int32_t *row, int64_t g, int64_t j0,
                         int64_t nk, size_t *at)
{
    const int64_t bs = p->bs, H = p->n_kv_heads, hd = p->hd;
    for (int64_t j = 0; j < nk;) {
        int64_t key = j0 + j, slot = key % bs, run = bs - slot;
        if (run > nk - j) run = nk - j;
        size_t first = (size_t)(((row[key / bs] * H + g) * bs + slot) * hd);
        for (int64_t t = 0; t < run; t++, j++) at[j] = first + (size_t)(t * hd);
    }
}

/* Feeds keys [j0, j0 + nk) of head g of a sequence to w: f32 read in
 * place, f16 through kx_attn_tile_f16 (in place or converted into the
 * scratch's tiles). */
static void feed_tile(const khub_pu_paged *p, const pscratch *sc, kx_att_rows *w,
                      const int32_t *row, int64_t g, int64_t j0, int64_t nk)
{
    size_t at[KX_ATT_KT];
    tile_offsets(p, row, g, j0, nk, at);
    if (p->kv_id == KHUB_DTYPE_ID_F32) {
        const float *kr[KX_ATT_KT], *vr[KX_ATT_KT];
        for (int64_t j = 0; j < nk; j++)
            kr[j] = (const float *)p->k + at[j], vr[j] = (const float *)p->v + at[j];
        kx_attn_tile(w, kr, vr, j0, nk);
    } else {
        const uint16_t *kr[KX_ATT_KT], *vr[KX_ATT_KT];
        for (int64_t j = 0; j < nk; j++)
            kr[j] = (const uint16_t *)p->k + at[j], vr[j] = (const uint16_t *)p->v + at[j];
        kx_attn_tile_f16(w, kr, vr, j0, nk, sc->k, sc->v);
    }
}

/* Asks for the cache lines of keys [j0, j0 + nk) of head g (K and V) ahead
 * of their use: a decode step reads every sequence's cache once, from
 * memory, and without this the first load of each K and V row stalls (40 %
 * of the op's samples sat on them). Prefetches change no result. */
static void prefetch_tile(const khub_pu_paged *p, const int32_t *row, int64_t g, int64_t j0,
                          int64_t nk)
{
    size_t at[KX_ATT_KT];
    tile_offsets(p, row, g, j0, nk, at);
    const size_t es = p->kv_id == KHUB_DTYPE_ID_F32 ? 4 : 2, rb = (size_t)p->hd * es;
    for (int64_t j = 0; j < nk; j++) {
        const char *k = (const char *)p->k + at[j] * es, *v = (const char *)p->v + at[j] * es;
        for (size_t b = 0; b < rb; b += 64) {
            _mm_prefetch(k + b, _MM_HINT_T0);
            _mm_prefetch(v + b, _MM_HINT_T0);
        }
    }
}

/* The sequence of item `it` (first[] ascending). */
static int64_t seq_of(const pjob *jb, int64_t it)
{
    int64_t lo = 0, hi = jb->p->a->n_seqs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (jb->first[mid] <= it)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void run_item(const pjob *jb, const pscratch *sc, int64_t it)
{
    const khub_pu_paged *p = jb->p;
    const khub_paged_attention_args *a = p->a;
    const int64_t s = seq_of(jb, it), H = p->n_kv_heads, G = jb->group, hd = p->hd;
    const int64_t local = it - jb->first[s], g0 = (local % jb->nhc) * jb->hc;
    const int64_t i0 = (local / jb->nhc) * jb->qb, g1 = g0 + jb->hc < H ? g0 + jb->hc : H;
    const int64_t n_q = a->cu_seqlens_q[s + 1] - a->cu_seqlens_q[s], t0 = a->cu_seqlens_q[s];
    const int64_t i1 = i0 + jb->qb < n_q ? i0 + jb->qb : n_q, R = (i1 - i0) * G;
    const int64_t pos0 = a->q_pos0[s], kv = a->kv_lens[s];
    const int32_t *row = khub_pu_paged_row(p, s);
    kx_att_rows w[KX_PAGED_MAX_HEADS];
    for (int64_t g = g0; g < g1; g++) {
        kx_att_rows *wg = &w[g - g0];
        *wg = (kx_att_rows){.R = R,
                            .G = G,
                            .hd = hd,
                            .q = sc->q + (g - g0) * R * hd,
                            .acc = sc->acc + (g - g0) * R * hd,
                            .pos0 = pos0 + i0,
                            .window = a->window,
                            .causal = a->causal,
                            .softcap = p->softcap,
                            .mask = NULL,
                            .smask = 0};
        for (int64_t r = 0; r < R; r++)
            kx_att_row_init(wg, r, p->q + ((t0 + i0 + r / G) * p->n_heads + g * G + r % G) * hd,
                            a->scale);
    }
    /* Keys any of the rows may see: [lo, hi), as attention.c's key_range. */
    int64_t hi = kv, lo = 0;
    if (a->causal && pos0 + i1 < hi) hi = pos0 + i1;
    if (a->window > 0 && pos0 + i0 - a->window + 1 > 0) lo = pos0 + i0 - a->window + 1;
    if (lo < hi) prefetch_tile(p, row, g0, lo, hi - lo < KX_ATT_KT ? hi - lo : KX_ATT_KT);
    for (int64_t j0 = lo; j0 < hi; j0 += KX_ATT_KT) {
        int64_t nk = hi - j0 < KX_ATT_KT ? hi - j0 : KX_ATT_KT;
        for (int64_t g = g0; g < g1; g++) {
            /* the next head's tile, or the first head's next tile */
            int64_t ng = g + 1 < g1 ? g + 1 : g0, nj = g + 1 < g1 ? j0 : j0 + KX_ATT_KT;
            if (nj < hi) prefetch_tile(p, row, ng, nj, hi - nj < KX_ATT_KT ? hi - nj : KX_ATT_KT);
            feed_tile(p, sc, &w[g - g0], row, g, j0, nk);
        }
    }
    for (int64_t g = g0; g < g1; g++)
        for (int64_t r = 0; r < R; r++)
            kx_att_row_out(&w[g - g0], r,
                           p->out + ((t0 + i0 + r / G) * p->n_heads + g * G + r % G) * hd);
}

/* One lane per pool thread: it claims items one at a time until none is
 * left, so the threads end together whatever the items cost (the older
 * sequences' longer caches, an odd count of sequences, a thread that
 * started late). An item's rows are computed the same way whoever claims
 * it, so the bits do not depend on the split. */
static void lanes_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)begin, (void)end, (void)thread;
    pjob *jb = ud;
    const khub_host_api *h = jb->s->host;
    const size_t hd = (size_t)jb->p->hd;
    float *buf =
        h->alloc(h->host_ctx, (2 * KX_ATT_KT + 2 * KX_PAGED_ITEM_ROWS) * hd * sizeof(float));
    if (!buf) {
        atomic_store(&jb->nomem, 1);
        return;
    }
    pscratch sc = {buf, buf + KX_ATT_KT * hd, buf + 2 * KX_ATT_KT * hd,
                   buf + (2 * KX_ATT_KT + KX_PAGED_ITEM_ROWS) * hd};
    const int64_t n = jb->first[jb->p->a->n_seqs];
    for (int64_t it; (it = atomic_fetch_add_explicit(&jb->next, 1, memory_order_relaxed)) < n;)
        run_item(jb, &sc, it);
    h->free(h->host_ctx, buf);
}

khub_status KX(paged_attention_run)(kx_state *s, const khub_pu_paged *p)
{
    const khub_paged_attention_args *a = p->a;
    pjob jb = {.p = p, .s = s, .group = p->n_heads / p->n_kv_heads};
    if (jb.group > KX_ATT_MAX_ROWS)
        return KX_FAIL(s, KHUB_STATUS_UNSUPPORTED,
                       "paged_attention: %lld query heads per KV head, this kernel serves at most "
                       "%d",
                       (long long)jb.group, KX_ATT_MAX_ROWS);
    jb.qb = KX_ATT_MAX_ROWS / jb.group;
    jb.hc = KX_PAGED_ITEM_ROWS / (jb.qb * jb.group);
    if (jb.hc > KX_PAGED_MAX_HEADS) jb.hc = KX_PAGED_MAX_HEADS;
    if (jb.hc > p->n_kv_heads) jb.hc = p->n_kv_heads;
    jb.nhc = (p->n_kv_heads + jb.hc - 1) / jb.hc;
    const khub_host_api *h = s->host;
    jb.first = h->alloc(h->host_ctx, (size_t)(a->n_seqs + 1) * sizeof(int64_t));
    if (!jb.first) return KX_FAIL(s, KHUB_STATUS_NOMEM, "paged_attention: no memory for the items");
    jb.first[0] = 0;
    for (int32_t q = 0; q < a->n_seqs; q++) {
        int64_t n_q = a->cu_seqlens_q[q + 1] - a->cu_seqlens_q[q];
        jb.first[q + 1] = jb.first[q] + (n_q + jb.qb - 1) / jb.qb * jb.nhc;
    }
    atomic_init(&jb.nomem, 0);
    atomic_init(&jb.next, 0);
    int64_t items = jb.first[a->n_seqs], lanes = h->n_threads(h->host_ctx);
    if (items > 0) h->parallel_for(h->host_ctx, lanes < items ? lanes : items, lanes_range, &jb);
    h->free(h->host_ctx, jb.first);
    if (atomic_load(&jb.nomem))
        return KX_FAIL(s, KHUB_STATUS_NOMEM, "paged_attention: no memory for the K/V tile buffers");
    return KHUB_STATUS_OK;
}
