/*
 * paged_attention.c: batched attention over a paged KV cache (op
 * "paged_attention", kind KHUB_OP_PAGED_ATTENTION, layout PAGED_HTD; issue
 * 13), the flash-attention recurrence of attention.c walked block by block.
 *
 * A work item is one sequence s, one KV head g and a block of up to QB of
 * s's queries; its rows are those queries times the G query heads that
 * share g (GQA), so each K/V tile serves QB * G rows. In layout PAGED_HTD the
 * keys of head g in one block are bs rows of hd contiguous elements, so a
 * tile never crosses a block: it is [nk][hd] at
 * pool + ((blk * n_kv_heads + g) * bs + slot) * hd, read in place when f32
 * and converted once into scratch when f16. Per row the recurrence keeps
 * the running max, sum and unnormalised output (kx_attn_tile.h; 16-lane
 * dot products and accumulates in the AVX-512 module), so
 * nothing of size kv_len is materialised and sequences of any length share
 * one call. Visibility is the reference's: key j < kv_lens[s], j <= p when
 * causal, p - j < window when window > 0 (p = q_pos0[s] + i); a row that
 * sees nothing gets zeros. A softcap > 0 (ABI 1.5) caps each scaled score
 * as attention.c does. Items go to host->parallel_for, ordered by
 * sequence; each worker allocates its tile buffers once per call.
 */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../include/khub_paged_check.h"
#include "kx_attn_tile.h"

#define KT       32 /* keys per tile, at most */
#define MAX_ROWS 16 /* query rows per work item */

typedef struct pjob {
    const khub_pu_paged *p;
    int64_t group;  /* G */
    int64_t qb;     /* queries per work item */
    int64_t *first; /* [n_seqs + 1] first item of each sequence */
    atomic_int nomem;
    kx_state *s;
} pjob;

typedef struct pscratch {
    float *k, *v, *q, *acc; /* [KT][hd] x2 (f16 only), [R][hd] x2 */
} pscratch;

/* Keys [j0, j0 + nk) of head g of a sequence, within one block: a pointer to
 * nk rows of hd f32, converted into buf when the pool is f16. */
static const float *tile(const khub_pu_paged *p, const void *pool, const int32_t *row, int64_t g,
                         int64_t j0, int64_t nk, float *buf)
{
    int64_t blk = row[j0 / p->bs], at = ((blk * p->n_kv_heads + g) * p->bs + j0 % p->bs) * p->hd;
    if (p->kv_id == KHUB_DTYPE_ID_F32) return (const float *)pool + at;
    const uint16_t *src = (const uint16_t *)pool + at;
    int64_t n = nk * p->hd, d = 0;
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(buf + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + d))));
    for (; d < n; d++) buf[d] = kx_f16_to_f32(src[d]);
    return buf;
}

/* Scores of one row (position pos) against a tile; returns the tile max. */
static float scores(const khub_paged_attention_args *a, float cap, const float *q, const float *kt,
                    int64_t hd, int64_t pos, int64_t j0, int64_t nk, float *sc)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < nk; j++) {
        int64_t kj = j0 + j;
        int hidden = (a->causal && kj > pos) || (a->window > 0 && pos - kj >= a->window);
        float s = hidden ? -INFINITY : dot_wide(q, kt + j * hd, hd);
        if (!hidden && cap > 0.0f) s = cap * tanhf(s / cap);
        sc[j] = s;
        if (sc[j] > mx) mx = sc[j];
    }
    return mx;
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
    const int64_t local = it - jb->first[s], g = local % H, i0 = (local / H) * jb->qb;
    const int64_t n_q = a->cu_seqlens_q[s + 1] - a->cu_seqlens_q[s], t0 = a->cu_seqlens_q[s];
    const int64_t i1 = i0 + jb->qb < n_q ? i0 + jb->qb : n_q, R = (i1 - i0) * G;
    const int64_t pos0 = a->q_pos0[s], kv = a->kv_lens[s];
    const int32_t *row = khub_pu_paged_row(p, s);
    float m[MAX_ROWS], l[MAX_ROWS], pw[KT];
    for (int64_t r = 0; r < R; r++) {
        const float *q = p->q + ((t0 + i0 + r / G) * p->n_heads + g * G + r % G) * hd;
        for (int64_t d = 0; d < hd; d++) sc->q[r * hd + d] = q[d] * a->scale;
        memset(sc->acc + r * hd, 0, (size_t)hd * sizeof(float));
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    /* Keys any of the rows may see: [lo, hi). */
    int64_t hi = kv, lo = 0;
    if (a->causal && pos0 + i1 < hi) hi = pos0 + i1;
    if (a->window > 0 && pos0 + i0 - a->window + 1 > 0) lo = pos0 + i0 - a->window + 1;
    for (int64_t j0 = lo; j0 < hi;) {
        int64_t room = p->bs - j0 % p->bs, nk = hi - j0;
        if (nk > room) nk = room;
        if (nk > KT) nk = KT;
        const float *kt = tile(p, p->k, row, g, j0, nk, sc->k);
        const float *vt = tile(p, p->v, row, g, j0, nk, sc->v);
        for (int64_t r = 0; r < R; r++) {
            float mt = scores(a, p->softcap, sc->q + r * hd, kt, hd, pos0 + i0 + r / G, j0, nk, pw);
            if (mt == -INFINITY) continue;
            float mn = mt > m[r] ? mt : m[r];
            float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
            l[r] = l[r] * corr + exp_scores(pw, nk, mn);
            rescale_axpy_wide(sc->acc + r * hd, corr, pw, vt, nk, hd);
            m[r] = mn;
        }
        j0 += nk;
    }
    for (int64_t r = 0; r < R; r++) {
        float *o = p->out + ((t0 + i0 + r / G) * p->n_heads + g * G + r % G) * hd;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < hd; d++) o[d] = sc->acc[r * hd + d] * inv;
    }
}

static void items_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    pjob *jb = ud;
    const khub_host_api *h = jb->s->host;
    const size_t hd = (size_t)jb->p->hd;
    float *buf = h->alloc(h->host_ctx, (2 * KT + 2 * MAX_ROWS) * hd * sizeof(float));
    if (!buf) {
        atomic_store(&jb->nomem, 1);
        return;
    }
    pscratch sc = {buf, buf + KT * hd, buf + 2 * KT * hd, buf + (2 * KT + MAX_ROWS) * hd};
    for (int64_t it = begin; it < end; it++) run_item(jb, &sc, it);
    h->free(h->host_ctx, buf);
}

khub_status KX(paged_attention_run)(kx_state *s, const khub_pu_paged *p)
{
    const khub_paged_attention_args *a = p->a;
    pjob jb = {.p = p, .s = s, .group = p->n_heads / p->n_kv_heads};
    if (jb.group > MAX_ROWS)
        return KX_FAIL(s, KHUB_STATUS_UNSUPPORTED,
                       "paged_attention: %lld query heads per KV head, this kernel serves at most "
                       "%d",
                       (long long)jb.group, MAX_ROWS);
    jb.qb = MAX_ROWS / jb.group;
    const khub_host_api *h = s->host;
    jb.first = h->alloc(h->host_ctx, (size_t)(a->n_seqs + 1) * sizeof(int64_t));
    if (!jb.first) return KX_FAIL(s, KHUB_STATUS_NOMEM, "paged_attention: no memory for the items");
    jb.first[0] = 0;
    for (int32_t q = 0; q < a->n_seqs; q++) {
        int64_t n_q = a->cu_seqlens_q[q + 1] - a->cu_seqlens_q[q];
        jb.first[q + 1] = jb.first[q] + (n_q + jb.qb - 1) / jb.qb * p->n_kv_heads;
    }
    atomic_init(&jb.nomem, 0);
    if (jb.first[a->n_seqs] > 0)
        h->parallel_for(h->host_ctx, jb.first[a->n_seqs], items_range, &jb);
    h->free(h->host_ctx, jb.first);
    if (atomic_load(&jb.nomem))
        return KX_FAIL(s, KHUB_STATUS_NOMEM, "paged_attention: no memory for the K/V tile buffers");
    return KHUB_STATUS_OK;
}
