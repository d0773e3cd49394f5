/*
 * paged_attn.c: a paged_attention op (kind 8, layout PAGED_HTD, f32 or f16
 * pools) written plainly, one row at a time, for the runtime cross-check
 * (KHUB_OPT_VERIFY_KERNELS, test_verify.c). Built twice:
 *   khub-test/paged-attn        right: the mathematics of khub/ref-cpu's op
 *   khub-test/paged-attn-wrong  PA_WRONG: right for one sequence, but on a
 *                               batch (n_seqs > 1) every output is doubled,
 *                               as a kernel tested only on single sequences
 *                               might be; the NMSE against the reference is
 *                               then 1
 *   khub-test/paged-attn-scribble PA_SCRIBBLE: right, but before it reads
 *                               the pools it adds 1 to the first V value
 *                               of the last block the first sequence
 *                               reaches (the pools are read-only to the
 *                               op): its output equals the reference's on
 *                               the pools it left, and the cache is wrong
 *                               for every later step
 */
#include <math.h>

#include "../../plugins/include/khub_paged_check.h"

#define OP "paged_attention"

static const khub_host_api *the_host;

static double load(const khub_pu_paged *p, const void *pool, int64_t at)
{
    if (p->kv_id == KHUB_DTYPE_ID_F16) return khub_pu_f16_to_f32(((const uint16_t *)pool)[at]);
    return ((const float *)pool)[at];
}

/* Query t, head h, of sequence s: softmax(q k^T * scale) v over the keys it sees. */
static void row(const khub_pu_paged *p, int64_t s, int64_t t, int64_t h, double *scores)
{
    const khub_paged_attention_args *a = p->a;
    int64_t g = h / (p->n_heads / p->n_kv_heads), D = p->hd;
    int64_t pos = a->q_pos0[s] + (t - a->cu_seqlens_q[s]), n_kv = a->kv_lens[s];
    const int32_t *blocks = khub_pu_paged_row(p, s);
    const float *q = p->q + (t * p->n_heads + h) * D;
    float *o = p->out + (t * p->n_heads + h) * D;
    double maxs = -INFINITY, denom = 0.0;
    for (int64_t j = 0; j < n_kv; j++) {
        scores[j] = -INFINITY;
        if ((a->causal && j > pos) || (a->window > 0 && pos - j >= a->window)) continue;
        int64_t base = ((blocks[j / p->bs] * p->n_kv_heads + g) * p->bs + j % p->bs) * D;
        double dot = 0.0;
        for (int64_t d = 0; d < D; d++) dot += (double)q[d] * load(p, p->k, base + d);
        scores[j] = (double)a->scale * dot;
        if (p->softcap > 0) scores[j] = p->softcap * tanh(scores[j] / p->softcap);
        if (scores[j] > maxs) maxs = scores[j];
    }
    for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
    for (int64_t j = 0; j < n_kv && maxs != -INFINITY; j++)
        if (scores[j] != -INFINITY) denom += exp(scores[j] - maxs);
    for (int64_t d = 0; d < D && denom > 0.0; d++) {
        double acc = 0.0;
        for (int64_t j = 0; j < n_kv; j++) {
            if (scores[j] == -INFINITY) continue;
            int64_t base = ((blocks[j / p->bs] * p->n_kv_heads + g) * p->bs + j % p->bs) * D;
            acc += exp(scores[j] - maxs) * load(p, p->v, base + d);
        }
        o[d] = (float)(acc / denom);
#ifdef PA_WRONG
        if (a->n_seqs > 1) o[d] *= 2.0f;
#endif
    }
}

#ifdef PA_SCRIBBLE
/* Adds 1 to V value 0 of the last block sequence 0 reads (head 0, slot 0). */
static void scribble(const khub_pu_paged *p)
{
    const int32_t *blocks = khub_pu_paged_row(p, 0);
    int64_t at = (int64_t)blocks[(p->a->kv_lens[0] - 1) / p->bs] * p->n_kv_heads * p->bs * p->hd;
    if (p->kv_id == KHUB_DTYPE_ID_F16) {
        uint16_t *v = (uint16_t *)(uintptr_t)p->v; /* const cast away: the bug */
        v[at] = khub_pu_f32_to_f16(khub_pu_f16_to_f32(v[at]) + 1.0f);
    } else {
        ((float *)(uintptr_t)p->v)[at] += 1.0f;
    }
}
#endif

static khub_status run(void *state, const void *args)
{
    (void)state;
    khub_pu_paged p;
    KHUB_PU_TRY(
        khub_pu_paged_check(the_host, OP, args, KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD), &p));
#ifdef PA_SCRIBBLE
    scribble(&p);
#endif
    int64_t max_kv = 1;
    for (int32_t s = 0; s < p.a->n_seqs; s++)
        if (p.a->kv_lens[s] > max_kv) max_kv = p.a->kv_lens[s];
    double *scores = the_host->alloc(the_host->host_ctx, (size_t)max_kv * sizeof *scores);
    if (!scores) return the_host->fail(the_host->host_ctx, KHUB_STATUS_NOMEM, OP ": no memory");
    for (int32_t s = 0; s < p.a->n_seqs; s++)
        for (int64_t t = p.a->cu_seqlens_q[s]; t < p.a->cu_seqlens_q[s + 1]; t++)
            for (int64_t h = 0; h < p.n_heads; h++) row(&p, s, t, h, scores);
    the_host->free(the_host->host_ctx, scores);
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING,
    .kind_flags = KHUB_ATTN_SOFTCAP,
    .kv_layouts = KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD)};

static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = OP,
                                    .kind = KHUB_OP_PAGED_ATTENTION, .caps = &caps, .run = run}};

static khub_status init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    the_host = h;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = TP_ID, .version = "1.0.0",
                          .n_ops = 1, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, TP_ID, "1.0.0")
