/*
 * paged_attention.c: reference batched attention over a paged KV cache (op
 * "paged_attention", kind KHUB_OP_PAGED_ATTENTION, ABI 1.4; issue 13).
 *
 * The same mathematics as attention.c, row by row in double, for every
 * sequence of a packed batch: query t of sequence s (rows cu_seqlens_q[s]
 * .. cu_seqlens_q[s + 1]) at position p = q_pos0[s] + (t - cu_seqlens_q[s])
 * sees key j < kv_lens[s] when causal allows (j <= p) and the window does
 * (p - j < window), and key j is read from block row[j / block_size], slot
 * j % block_size of the pools. Layouts: PAGED_HTD (f32 or f16 pools) and
 * PAGED_HTD_Q8 (int8 pools times a per-(block, KV head) f32 scale), both
 * [n_blocks, n_kv_heads, block_size, head_dim]. With softcap > 0 (ABI 1.5)
 * each scaled score s becomes softcap * tanh(s / softcap) before the
 * softmax, as attention.c. A query that sees nothing
 * gets zeros. Work is split over (query row, head) pairs.
 */
#include "ref_cpu.h"

#if KHUB_PLUGIN_TARGET_MINOR >= \
    4 /* paged ops are ABI 1.4: a build for an older minor leaves them out */
#include <math.h>

#include "../include/khub_paged_check.h"

#define OP "paged_attention"

typedef struct pa_job {
    const khub_host_api *host;
    khub_pu_paged p;
    int64_t max_kv; /* longest kv_len: the score scratch */
    atomic_int nomem;
} pa_job;

/* Element d of key/value slot (blk, g, slot) of a pool as f32. */
static double pa_load(const khub_pu_paged *p, const void *pool, const float *scales, int64_t blk,
                      int64_t g, int64_t slot, int64_t d)
{
    int64_t at = ((blk * p->n_kv_heads + g) * p->bs + slot) * p->hd + d;
    switch (p->kv_id) {
    case KHUB_DTYPE_ID_F32: return ((const float *)pool)[at];
    case KHUB_DTYPE_ID_F16: return khub_pu_f16_to_f32(((const uint16_t *)pool)[at]);
    default: return (double)((const int8_t *)pool)[at] * scales[blk * p->n_kv_heads + g];
    }
}

/* The sequence owning packed query row t (cu_seqlens_q is ascending). */
static int64_t pa_seq_of(const khub_paged_attention_args *a, int64_t t)
{
    int64_t lo = 0, hi = a->n_seqs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (a->cu_seqlens_q[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static void pa_row(const pa_job *j, int64_t t, int64_t h, double *scores, double *acc)
{
    const khub_pu_paged *p = &j->p;
    const khub_paged_attention_args *a = p->a;
    int64_t s = pa_seq_of(a, t), g = h / (p->n_heads / p->n_kv_heads), D = p->hd;
    int64_t pos = a->q_pos0[s] + (t - a->cu_seqlens_q[s]), n_kv = a->kv_lens[s];
    const int32_t *row = khub_pu_paged_row(p, s);
    const float *q = p->q + (t * p->n_heads + h) * D;
    double maxs = -INFINITY;
    for (int64_t key = 0; key < n_kv; key++) {
        scores[key] = -INFINITY;
        if ((a->causal && key > pos) || (a->window > 0 && pos - key >= a->window)) continue;
        int64_t blk = row[key / p->bs], slot = key % p->bs;
        double dot = 0.0;
        for (int64_t d = 0; d < D; d++)
            dot += (double)q[d] * pa_load(p, p->k, p->ks, blk, g, slot, d);
        scores[key] = (double)a->scale * dot;
        if (p->softcap > 0) scores[key] = p->softcap * tanh(scores[key] / p->softcap);
        if (scores[key] > maxs) maxs = scores[key];
    }
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0;
    double denom = 0.0;
    for (int64_t key = 0; key < n_kv && maxs != -INFINITY; key++) {
        if (scores[key] == -INFINITY) continue;
        double w = exp(scores[key] - maxs);
        denom += w;
        int64_t blk = row[key / p->bs], slot = key % p->bs;
        for (int64_t d = 0; d < D; d++) acc[d] += w * pa_load(p, p->v, p->vs, blk, g, slot, d);
    }
    float *o = p->out + (t * p->n_heads + h) * D;
    for (int64_t d = 0; d < D; d++) o[d] = denom > 0.0 ? (float)(acc[d] / denom) : 0.0f;
}

static void pa_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    pa_job *j = ud;
    size_t n = (size_t)(j->max_kv + j->p.hd) * sizeof(double);
    double *scratch = j->host->alloc(j->host->host_ctx, n);
    if (!scratch) {
        atomic_store(&j->nomem, 1);
        return;
    }
    for (int64_t r = begin; r < end; r++)
        pa_row(j, r / j->p.n_heads, r % j->p.n_heads, scratch, scratch + j->max_kv);
    j->host->free(j->host->host_ctx, scratch);
}

static khub_status ref_paged_attention(void *state, const void *args)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    pa_job j = {.host = host};
    KHUB_PU_TRY(khub_pu_paged_check(host, OP, args,
                                    KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD) |
                                        KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD_Q8),
                                    &j.p));
    for (int32_t s = 0; s < j.p.a->n_seqs; s++)
        if (j.p.a->kv_lens[s] > j.max_kv) j.max_kv = j.p.a->kv_lens[s];
    atomic_init(&j.nomem, 0);
    int64_t rows = j.p.total_q * j.p.n_heads;
    if (rows > 0) host->parallel_for(host->host_ctx, rows, pa_range, &j);
    if (atomic_load(&j.nomem))
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          OP ": out of memory for %lld-key score scratch", (long long)j.max_kv);
    return KHUB_STATUS_OK;
}

static const khub_op_caps paged_attention_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16 | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_I8),
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING,
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    .kind_flags = KHUB_ATTN_SOFTCAP,
#endif
    .kv_layouts = KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD) |
                  KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD_Q8),
};

const khub_op_desc khub_ref__paged_attention_op = {
    KHUB_STRUCT_INIT(khub_op_desc), .name = "paged_attention",  .kind = KHUB_OP_PAGED_ATTENTION,
    .caps = &paged_attention_caps,  .run = ref_paged_attention,
};

#endif
