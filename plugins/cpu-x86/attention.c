/*
 * attention.c: scaled dot-product attention, tiled with an online softmax
 * (the flash-attention recurrence) over strided f32 or f16 K/V views.
 *
 * A work item is one KV head g and a block of QB queries. Its rows are the
 * QB queries times the G = n_heads / n_kv_heads query heads that share g
 * (GQA), so each K/V tile, read once (and converted from f16 once), serves
 * all QB * G rows while it sits in L1. Per row the recurrence keeps the
 * running max m, the running sum l and the unnormalised output acc:
 *     s_j = cap(scale q.k_j) + mask_j,  m' = max(m, max_j s_j),
 *     l = l e^(m - m') + sum_j e^(s_j - m'),  acc = acc e^(m - m') + sum_j e^(s_j - m') v_j,
 * and out = acc / l at the end. Nothing of size n_kv is materialised.
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

#define KT       32  /* keys per tile */
#define MAX_ROWS 16  /* query rows per work item */
#define MAX_HD   256 /* plugin.c rejects larger head dims */

typedef struct job {
    const kx_attn *a;
    int64_t group; /* G: query heads per KV head */
    int64_t qb;    /* queries per work item */
    int64_t n_qblk;
    atomic_int nomem;
    kx_state *s;
} job;

/* Per-worker scratch: K and V tiles as f32 [KT][hd], rows' q, acc [R][hd]. */
typedef struct scratch {
    float *k, *v, *q, *acc;
} scratch;

/* Copies keys [j0, j0 + nk) of head g of a K or V view into dst [nk][hd] f32. */
static void load_tile(const void *base, int f16, int64_t st, int64_t sh, int64_t g, int64_t j0,
                      int64_t nk, int64_t hd, float *dst)
{
    for (int64_t j = 0; j < nk; j++) {
        int64_t off = (j0 + j) * st + g * sh;
        float *o = dst + j * hd;
        if (!f16) {
            memcpy(o, (const float *)base + off, (size_t)hd * sizeof(float));
            continue;
        }
        const uint16_t *src = (const uint16_t *)base + off;
        int64_t d = 0;
        for (; d + 8 <= hd; d += 8)
            _mm256_storeu_ps(o + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + d))));
        for (; d < hd; d++) o[d] = kx_f16_to_f32(src[d]);
    }
}

/* Scores of one row against a tile, with visibility; returns the tile max. */
static float tile_scores(const kx_attn *a, const float *q, const float *kt, int64_t i, int64_t j0,
                         int64_t nk, float *sc)
{
    const int64_t pos = a->q_pos0 + i;
    float mx = -INFINITY;
    for (int64_t j = 0; j < nk; j++) {
        int64_t kj = j0 + j;
        int hidden = (a->causal && kj > pos) || (a->window > 0 && pos - kj >= a->window);
        float s = -INFINITY;
        if (!hidden) {
            s = dot(q, kt + j * a->hd, a->hd);
            if (a->softcap > 0.0f) s = a->softcap * tanhf(s / a->softcap);
            if (a->mask) s += a->mask[i * a->smask + kj];
        }
        sc[j] = s;
        if (s > mx) mx = s;
    }
    return mx;
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
    const int64_t hd = a->hd, G = jb->group, R = (i1 - i0) * G;
    float m[MAX_ROWS], l[MAX_ROWS], p[KT];
    for (int64_t r = 0; r < R; r++) {
        int64_t i = i0 + r / G, h = g * G + r % G;
        const float *q = a->q + i * a->sq_t + h * a->sq_h;
        for (int64_t d = 0; d < hd; d++) sc->q[r * hd + d] = q[d] * a->scale;
        memset(sc->acc + r * hd, 0, (size_t)hd * sizeof(float));
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    int64_t lo, hi;
    key_range(a, i0, i1, &lo, &hi);
    for (int64_t j0 = lo; j0 < hi; j0 += KT) {
        int64_t nk = hi - j0 < KT ? hi - j0 : KT;
        load_tile(a->k, a->kv_f16, a->sk_t, a->sk_h, g, j0, nk, hd, sc->k);
        load_tile(a->v, a->kv_f16, a->sv_t, a->sv_h, g, j0, nk, hd, sc->v);
        for (int64_t r = 0; r < R; r++) {
            float mt = tile_scores(a, sc->q + r * hd, sc->k, i0 + r / G, j0, nk, p);
            if (mt == -INFINITY) continue;
            float mn = mt > m[r] ? mt : m[r];
            float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
            l[r] = l[r] * corr + exp_scores(p, nk, mn);
            rescale_axpy(sc->acc + r * hd, corr, p, sc->v, nk, hd);
            m[r] = mn;
        }
    }
    for (int64_t r = 0; r < R; r++) {
        int64_t i = i0 + r / G, h = g * G + r % G;
        float *o = a->out + i * a->so_t + h * a->so_h;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < hd; d++) o[d] = sc->acc[r * hd + d] * inv;
    }
}

static void items_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    job *jb = ud;
    const khub_host_api *h = jb->s->host;
    const size_t hd = (size_t)jb->a->hd;
    float *buf = h->alloc(h->host_ctx, (2 * KT + 2 * MAX_ROWS) * hd * sizeof(float));
    if (!buf) {
        atomic_store(&jb->nomem, 1);
        return;
    }
    scratch sc = {buf, buf + KT * hd, buf + 2 * KT * hd, buf + (2 * KT + MAX_ROWS) * hd};
    for (int64_t it = begin; it < end; it++) run_item(jb, &sc, it);
    h->free(h->host_ctx, buf);
}

khub_status KX(attention_run)(kx_state *s, const kx_attn *a)
{
    job jb = {.a = a, .s = s, .group = a->n_heads / a->n_kv_heads};
    jb.qb = MAX_ROWS / jb.group > 0 ? MAX_ROWS / jb.group : 1;
    if (jb.qb > a->n_q) jb.qb = a->n_q;
    atomic_init(&jb.nomem, 0);
    if (jb.group > MAX_ROWS)
        return KX_FAIL(s, KHUB_STATUS_UNSUPPORTED,
                       "attention: %lld query heads per KV head, this kernel serves at most %d",
                       (long long)jb.group, MAX_ROWS);
    if (a->n_q == 0) return KHUB_STATUS_OK;
    jb.n_qblk = (a->n_q + jb.qb - 1) / jb.qb;
    s->host->parallel_for(s->host->host_ctx, jb.n_qblk * a->n_kv_heads, items_range, &jb);
    if (atomic_load(&jb.nomem))
        return KX_FAIL(s, KHUB_STATUS_NOMEM, "attention: no memory for the K/V tile buffers");
    return KHUB_STATUS_OK;
}
