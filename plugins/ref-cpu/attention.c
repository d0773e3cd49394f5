/*
 * attention.c: reference scaled dot-product attention (op "attention").
 *
 * For query i, head h (kv head g = h / (n_heads / n_kv_heads)) and the keys
 * j it may see:
 *     s_j   = cap(scale * q[i,h] . k[j,g]) + mask[i,j]
 *     out   = sum_j softmax(s)_j v[j,g]
 * with cap(s) = softcap * tanh(s / softcap) when the args' softcap (ABI 1.5)
 * is > 0, else s (Gemma 2's attn_logit_softcapping, applied as Transformers'
 * eager attention does: after the scale, before the mask and the softmax).
 * Key j is visible when
 *     causal:  j <= q_pos0 + i
 *     window:  (q_pos0 + i) - j < window     (window > 0; HF's sliding rule,
 *              the query itself counts as one of the `window` tokens)
 * A query that sees no key, or whose visible scores are all -inf, gets a zero
 * output (there is no distribution to average over).
 *
 * Dot products, the softmax denominator and the output accumulate in double;
 * the softmax subtracts the row maximum before exp. K and V are f32 or f16
 * with arbitrary element strides (KV-cache views); q, mask and out may be
 * strided too. Work is split over (query, head) pairs.
 */
#include <math.h>

#include "ref_cpu.h"

#define OP "attention"

typedef struct attn_job {
    const khub_host_api *host;
    const khub_attention_args *a;
    double softcap; /* 0 = none */
    int64_t n_q, n_kv, n_heads, n_kv_heads, head_dim;
    int64_t sq[3], sk[3], sv[3], so[3], sm[2];
    const float *q, *mask;
    const void *k, *v;
    float *out;
    atomic_int nomem;
} attn_job;

static bool attn_visible(const attn_job *j, int64_t i, int64_t key)
{
    int64_t qpos = j->a->q_pos0 + i;
    if (j->a->causal && key > qpos) return false;
    if (j->a->window > 0 && qpos - key >= j->a->window) return false;
    return true;
}

/* One (query i, head h) row; scores and acc are scratch of n_kv and
 * head_dim doubles. */
static void attn_row(const attn_job *j, int64_t i, int64_t h, double *scores, double *acc)
{
    int64_t g = h / (j->n_heads / j->n_kv_heads), D = j->head_dim;
    const float *q = j->q + i * j->sq[0] + h * j->sq[1];
    khub_dtype kdt = j->a->k->dtype, vdt = j->a->v->dtype;
    double maxs = -INFINITY;
    for (int64_t key = 0; key < j->n_kv; key++) {
        scores[key] = -INFINITY;
        if (!attn_visible(j, i, key)) continue;
        const char *kb =
            (const char *)j->k + (key * j->sk[0] + g * j->sk[1]) * (int64_t)(kdt.bits / 8);
        double dot = 0.0;
        for (int64_t d = 0; d < D; d++)
            dot += (double)q[d * j->sq[2]] * (double)khub_ref__load(kb, kdt, d * j->sk[2]);
        double s = (double)j->a->scale * dot;
        if (j->softcap > 0) s = j->softcap * tanh(s / j->softcap);
        if (j->mask) s += (double)j->mask[i * j->sm[0] + key * j->sm[1]];
        scores[key] = s;
        if (s > maxs) maxs = s;
    }
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0;
    double denom = 0.0;
    if (maxs != -INFINITY) {
        for (int64_t key = 0; key < j->n_kv; key++) {
            if (scores[key] == -INFINITY) continue;
            double p = exp(scores[key] - maxs);
            denom += p;
            const char *vb =
                (const char *)j->v + (key * j->sv[0] + g * j->sv[1]) * (int64_t)(vdt.bits / 8);
            for (int64_t d = 0; d < D; d++)
                acc[d] += p * (double)khub_ref__load(vb, vdt, d * j->sv[2]);
        }
    }
    float *o = j->out + i * j->so[0] + h * j->so[1];
    for (int64_t d = 0; d < D; d++) o[d * j->so[2]] = denom > 0.0 ? (float)(acc[d] / denom) : 0.0f;
}

static void attn_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    attn_job *j = ud;
    size_t n = (size_t)(j->n_kv + j->head_dim) * sizeof(double);
    double *scratch = j->host->alloc(j->host->host_ctx, n ? n : 1);
    if (!scratch) {
        atomic_store(&j->nomem, 1);
        return;
    }
    for (int64_t r = begin; r < end; r++)
        attn_row(j, r / j->n_heads, r % j->n_heads, scratch, scratch + j->n_kv);
    j->host->free(j->host->host_ctx, scratch);
}

/* Validates tensors and shapes; fills the sizes of j. */
static khub_status attn_check(const khub_host_api *host, const khub_attention_args *a, attn_job *j)
{
    const uint64_t f32 = KHUB_REF_BIT_F32, kvbits = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16;
    void *c = host->host_ctx;
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "q", a->q, 3, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "k", a->k, 3, kvbits, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "v", a->v, 3, kvbits, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "out", a->out, 3, f32, KHUB_DEVICE_CPU));
    j->n_q = a->q->shape[0];
    j->n_heads = a->q->shape[1];
    j->head_dim = a->q->shape[2];
    j->n_kv = a->k->shape[0];
    j->n_kv_heads = a->k->shape[1];
    if (j->n_heads < 1 || j->head_dim < 1)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": q shape (got [%lld, %lld, %lld], want n_heads and head_dim >= 1)",
                          (long long)j->n_q, (long long)j->n_heads, (long long)j->head_dim);
    if (j->n_kv_heads < 1 || j->n_heads % j->n_kv_heads != 0)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": k.shape[1] (n_kv_heads) (got %lld, want a divisor of n_heads %lld)",
                          (long long)j->n_kv_heads, (long long)j->n_heads);
    KHUB_PU_TRY(khub_pu_dim_check(host, OP, "k", a->k, 2, j->head_dim, "head_dim"));
    KHUB_PU_TRY(khub_pu_dim_check(host, OP, "v", a->v, 0, j->n_kv, "n_kv"));
    KHUB_PU_TRY(khub_pu_dim_check(host, OP, "v", a->v, 1, j->n_kv_heads, "n_kv_heads"));
    KHUB_PU_TRY(khub_pu_dim_check(host, OP, "v", a->v, 2, j->head_dim, "head_dim"));
    for (int d = 0; d < 3; d++)
        KHUB_PU_TRY(khub_pu_dim_check(host, OP, "out", a->out, d, a->q->shape[d],
                                      d == 0   ? "n_q"
                                      : d == 1 ? "n_heads"
                                               : "head_dim"));
    if (a->mask) {
        KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "mask", a->mask, 2, f32, KHUB_DEVICE_CPU));
        KHUB_PU_TRY(khub_pu_dim_check(host, OP, "mask", a->mask, 0, j->n_q, "n_q"));
        KHUB_PU_TRY(khub_pu_dim_check(host, OP, "mask", a->mask, 1, j->n_kv, "n_kv"));
    }
    if (a->causal > 1)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": causal (got %u, want 0 or 1)",
                          (unsigned)a->causal);
    if (a->q_pos0 < 0 || a->window < 0)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": q_pos0 %lld / window %lld (want both >= 0)", (long long)a->q_pos0,
                          (long long)a->window);
    if (a->q_pos0 > INT64_MAX / 2 || j->n_q > INT64_MAX / 2)
        return host->fail(c, KHUB_STATUS_OVERFLOW, OP ": q_pos0 + n_q overflows (got %lld + %lld)",
                          (long long)a->q_pos0, (long long)j->n_q);
    if (!isfinite(a->scale))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": scale (got %g, want a finite number)",
                          (double)a->scale);
    if (a->out->data == a->q->data && a->out->byte_offset == a->q->byte_offset)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": out aliases q (want separate memory)");
    return KHUB_STATUS_OK;
}

static khub_status ref_attention(void *state, const void *args)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(khub_pu_args_check(host, OP, args, KHUB_PU_ATTN_ARGS_1_0_SIZE));
    const khub_attention_args *a = args;
    attn_job j = {.host = host, .a = a};
    KHUB_PU_TRY(attn_check(host, a, &j));
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    float cap = 0.0f;
    KHUB_PU_TRY(khub_pu_softcap(host, OP, args, offsetof(khub_attention_args, softcap), &cap));
    j.softcap = cap;
#endif
    khub_pu_strides(a->q, j.sq);
    khub_pu_strides(a->k, j.sk);
    khub_pu_strides(a->v, j.sv);
    khub_pu_strides(a->out, j.so);
    j.q = khub_pu_base(a->q);
    j.k = khub_pu_base(a->k);
    j.v = khub_pu_base(a->v);
    j.out = khub_pu_base(a->out);
    if (a->mask) {
        khub_pu_strides(a->mask, j.sm);
        j.mask = khub_pu_base(a->mask);
    }
    atomic_init(&j.nomem, 0);
    int64_t rows = j.n_q * j.n_heads;
    if (rows > 0) host->parallel_for(host->host_ctx, rows, attn_range, &j);
    if (atomic_load(&j.nomem))
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          OP ": out of memory for %lld-key score scratch", (long long)j.n_kv);
    return KHUB_STATUS_OK;
}

static const khub_op_caps attention_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16,
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_MASK | KHUB_CAP_STRIDED_KV |
             KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING,
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    .kind_flags = KHUB_ATTN_SOFTCAP,
#endif
};

const khub_op_desc khub_ref__attention_op = {
    KHUB_STRUCT_INIT(khub_op_desc), .name = "attention",  .kind = KHUB_OP_ATTENTION,
    .caps = &attention_caps,        .run = ref_attention,
};
