/*
 * attention.c: scaled dot-product attention, tiled with an online softmax
 * (the flash-attention recurrence) over strided f32 or f16 K/V views.
 *
 * A work item is one KV head g and a block of QB queries. Its rows are the
 * QB queries times the G = n_heads / n_kv_heads query heads that share g
 * (GQA), so each tile of 32 keys serves all QB * G rows while it sits in
 * L1: f32 read in place; f16 read in place too, each vector converted once
 * in registers for all rows, when the item has at most
 * KX_ATT_F16_DIRECT_ROWS rows (decode), else converted once into the
 * worker's scratch (kx_attn_tile_f16). The online-softmax
 * recurrence is kx_attn_tile.h's, shared with paged_attention.c, so the two
 * ops give the same bits. Nothing of size n_kv is materialised.
 * cap(s) is s, or softcap * tanh(s / softcap) when the call's softcap > 0
 * (ABI 1.5; a scalar tanhf per score, paid only by models that cap).
 *
 * Visibility of key j to query i (position p = q_pos0 + i): j <= p when
 * causal; p - j < window when window > 0 (the window counts the query's own
 * position); and mask[i][j] is added (a -inf entry hides the key). A row that
 * sees no key at all gets zeros. Work items go to host->parallel_for; each
 * worker allocates its tile buffers once per call.
 */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kx_attn_tile.h"

typedef struct job {
    const kx_attn *a;
    int64_t group; /* G: query heads per KV head */
    int64_t qb;    /* queries per work item */
    int64_t n_qblk;
    atomic_int nomem;
    kx_state *s;
} job;

/* Per-worker scratch: f16 K and V tiles converted to f32 [KX_ATT_KT][hd]
 * (items of more than KX_ATT_F16_DIRECT_ROWS rows), the rows' q and acc
 * [R][hd]. */
typedef struct scratch {
    float *k, *v, *q, *acc;
} scratch;

/* Row pointers of keys [j0, j0 + nk) of head g of an f32 or an f16 K or V
 * view (strides in elements). */
static void rows_f32(const float *base, int64_t st, int64_t sh, int64_t g, int64_t j0, int64_t nk,
                     const float **rows)
{
    for (int64_t j = 0; j < nk; j++) rows[j] = base + (j0 + j) * st + g * sh;
}

static void rows_f16(const uint16_t *base, int64_t st, int64_t sh, int64_t g, int64_t j0,
                     int64_t nk, const uint16_t **rows)
{
    for (int64_t j = 0; j < nk; j++) rows[j] = base + (j0 + j) * st + g * sh;
}

/* The keys any row of queries [i0, i1) may see: [*lo, *hi). */
static void key_range(const kx_attn *a, int64_t i0, int64_t i1, int64_t *lo, int64_t *hi)
{
    int64_t h = a->n_kv, l = 0;
    if (a->causal && a->q_pos0 + i1 < h) h = a->q_pos0 + i1; /* last query sees p itself */
    if (a->window > 0 && a->q_pos0 + i0 - a->window + 1 > 0) l = a->q_pos0 + i0 - a->window + 1;
    *lo = l < 0 ? 0 : l;
    *hi = h < 0 ? 0 : h;
}

/* Item `item` is KV head item % n_kv_heads of query block zigzag(item /
 * n_kv_heads), zigzag(k) = k / 2 for even k, n_qblk - 1 - k / 2 for odd k:
 * blocks taken from both ends in turn. A causal block's cost grows with its
 * position, and parallel_for gives each thread one contiguous range of
 * items, so in block order the last thread got the costly end (with two
 * threads a 1.25 : 1.75 split of a 512-token prefill); in this order every
 * contiguous range mixes cheap and costly blocks. Each item's rows are
 * computed the same way whatever the order, so the results are the same
 * bits. */
static void run_item(job *jb, const scratch *sc, int64_t item)
{
    const kx_attn *a = jb->a;
    const int64_t k = item / a->n_kv_heads, g = item % a->n_kv_heads;
    const int64_t qblk = k % 2 == 0 ? k / 2 : jb->n_qblk - 1 - k / 2;
    const int64_t i0 = qblk * jb->qb;
    const int64_t i1 = i0 + jb->qb < a->n_q ? i0 + jb->qb : a->n_q;
    const int64_t hd = a->hd, G = jb->group;
    kx_att_rows w = {.R = (i1 - i0) * G,
                     .G = G,
                     .hd = hd,
                     .q = sc->q,
                     .acc = sc->acc,
                     .pos0 = a->q_pos0 + i0,
                     .window = a->window,
                     .causal = a->causal,
                     .softcap = a->softcap,
                     .mask = a->mask ? a->mask + i0 * a->smask : NULL,
                     .smask = a->smask};
    for (int64_t r = 0; r < w.R; r++)
        kx_att_row_init(&w, r, a->q + (i0 + r / G) * a->sq_t + (g * G + r % G) * a->sq_h, a->scale);
    int64_t lo, hi;
    key_range(a, i0, i1, &lo, &hi);
    for (int64_t j0 = lo; j0 < hi; j0 += KX_ATT_KT) {
        int64_t nk = hi - j0 < KX_ATT_KT ? hi - j0 : KX_ATT_KT;
        if (a->kv_f16) {
            const uint16_t *kr[KX_ATT_KT], *vr[KX_ATT_KT];
            rows_f16(a->k, a->sk_t, a->sk_h, g, j0, nk, kr);
            rows_f16(a->v, a->sv_t, a->sv_h, g, j0, nk, vr);
            kx_attn_tile_f16(&w, kr, vr, j0, nk, sc->k, sc->v);
        } else {
            const float *kr[KX_ATT_KT], *vr[KX_ATT_KT];
            rows_f32(a->k, a->sk_t, a->sk_h, g, j0, nk, kr);
            rows_f32(a->v, a->sv_t, a->sv_h, g, j0, nk, vr);
            kx_attn_tile(&w, kr, vr, j0, nk);
        }
    }
    for (int64_t r = 0; r < w.R; r++)
        kx_att_row_out(&w, r, a->out + (i0 + r / G) * a->so_t + (g * G + r % G) * a->so_h);
}

static void items_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    job *jb = ud;
    const khub_host_api *h = jb->s->host;
    const size_t hd = (size_t)jb->a->hd;
    float *buf = h->alloc(h->host_ctx, (2 * KX_ATT_KT + 2 * KX_ATT_MAX_ROWS) * hd * sizeof(float));
    if (!buf) {
        atomic_store(&jb->nomem, 1);
        return;
    }
    scratch sc = {buf, buf + KX_ATT_KT * hd, buf + 2 * KX_ATT_KT * hd,
                  buf + (2 * KX_ATT_KT + KX_ATT_MAX_ROWS) * hd};
    for (int64_t it = begin; it < end; it++) run_item(jb, &sc, it);
    h->free(h->host_ctx, buf);
}

khub_status KX(attention_run)(kx_state *s, const kx_attn *a)
{
    job jb = {.a = a, .s = s, .group = a->n_heads / a->n_kv_heads};
    jb.qb = KX_ATT_MAX_ROWS / jb.group > 0 ? KX_ATT_MAX_ROWS / jb.group : 1;
    if (jb.qb > a->n_q) jb.qb = a->n_q;
    atomic_init(&jb.nomem, 0);
    if (jb.group > KX_ATT_MAX_ROWS)
        return KX_FAIL(s, KHUB_STATUS_UNSUPPORTED,
                       "attention: %lld query heads per KV head, this kernel serves at most %d",
                       (long long)jb.group, KX_ATT_MAX_ROWS);
    if (a->n_q == 0) return KHUB_STATUS_OK;
    jb.n_qblk = (a->n_q + jb.qb - 1) / jb.qb;
    s->host->parallel_for(s->host->host_ctx, jb.n_qblk * a->n_kv_heads, items_range, &jb);
    if (atomic_load(&jb.nomem))
        return KX_FAIL(s, KHUB_STATUS_NOMEM, "attention: no memory for the K/V tile buffers");
    return KHUB_STATUS_OK;
}
