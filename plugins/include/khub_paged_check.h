/*
 * khub_paged_check.h: argument checks of a paged_attention op (ABI 1.4,
 * khub_paged_attention_args), shared by the plugins of this tree
 * (plugins/ref-cpu/paged_attention.c, plugins/cpu-x86/plugin.c) so both
 * refuse the same input with the same message. Static inline, like
 * khub_plugin_util.h, which it needs; not installed and not API.
 *
 *     khub_pu_paged p;
 *     KHUB_PU_TRY(khub_pu_paged_check(host, "paged_attention", args,
 *                                     KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD), &p));
 *     // p.q[t * p.n_heads * p.hd + h * p.hd + d], key j of sequence s in block
 *     // p.block_row(s)[j / p.bs], K element ((blk * p.n_kv_heads + g) * p.bs + slot) * p.hd + d
 *
 * What it guarantees when it returns OK: q and out are compact f32 [total_q,
 * n_heads, hd] and distinct; the pools are compact [n_blocks, n_kv_heads, bs,
 * hd] of the layout's dtype (f32/f16 for PAGED_HTD, int8 for PAGED_HTD_Q8,
 * then with compact f32 scales [n_blocks, n_kv_heads]); n_heads is a multiple
 * of n_kv_heads; cu_seqlens_q starts at 0, never decreases and ends at
 * total_q; every sequence has q_pos0 >= 0 and 0 <= kv_len <= the keys its
 * block-table row can hold; and every block id a sequence's first kv_len
 * keys use lies in [0, n_blocks).
 */
#ifndef KHUB_PAGED_CHECK_H
#define KHUB_PAGED_CHECK_H

#include <math.h>

#include "khub_plugin_util.h"

/* The checked call, flattened. */
typedef struct khub_pu_paged {
    const khub_paged_attention_args *a;
    int64_t total_q, n_heads, n_kv_heads, hd, n_blocks, bs;
    int kv_id;            /* KHUB_DTYPE_ID_F32, _F16 or _I8 */
    const float *q;       /* [total_q, n_heads, hd] */
    float *out;           /* [total_q, n_heads, hd] */
    const void *k, *v;    /* [n_blocks, n_kv_heads, bs, hd] */
    const float *ks, *vs; /* [n_blocks, n_kv_heads] (Q8), else NULL */
    float softcap;        /* the args' softcap (ABI 1.5), 0 = none or an older host */
} khub_pu_paged;

/* Sequence s's row of the block table. */
static inline const int32_t *khub_pu_paged_row(const khub_pu_paged *p, int64_t s)
{
    int64_t r = p->a->seq_rows ? p->a->seq_rows[s] : s;
    return p->a->block_table + r * p->a->block_table_stride;
}

static inline khub_status khub_pu__paged_pools(const khub_host_api *host, const char *op,
                                               const khub_paged_attention_args *a, khub_pu_paged *p)
{
    void *c = host->host_ctx;
    bool q8 = a->layout == KHUB_KV_LAYOUT_PAGED_HTD_Q8;
    uint64_t kvbits = q8 ? KHUB_DTYPE_BIT(KHUB_DTYPE_ID_I8)
                         : KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16);
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "k_pool", a->k_pool, 4, kvbits, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "v_pool", a->v_pool, 4, kvbits, KHUB_DEVICE_CPU));
    if (!khub_pu_is_compact(a->k_pool) || !khub_pu_is_compact(a->v_pool))
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: k_pool/v_pool have strides (want "
                          "compact pools in the layout's shape)",
                          op);
    p->n_blocks = a->k_pool->shape[0];
    p->n_kv_heads = a->k_pool->shape[1];
    p->kv_id = khub_dtype_id_of(a->k_pool->dtype);
    for (int d = 0; d < 4; d++)
        KHUB_PU_TRY(
            khub_pu_dim_check(host, op, "v_pool", a->v_pool, d, a->k_pool->shape[d], "k_pool's"));
    if (khub_dtype_id_of(a->v_pool->dtype) != p->kv_id)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: v_pool.dtype (got %s, want k_pool's %s)",
                          op, khub_pu_dtype_name(a->v_pool->dtype),
                          khub_pu_dtype_name(a->k_pool->dtype));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "k_pool", a->k_pool, 2, a->block_size, "block_size"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "k_pool", a->k_pool, 3, p->hd, "head_dim"));
    if (p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads != 0)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: k_pool.shape[1] (n_kv_heads) (got %lld, want a divisor of n_heads "
                          "%lld)",
                          op, (long long)p->n_kv_heads, (long long)p->n_heads);
    p->k = khub_pu_base(a->k_pool);
    p->v = khub_pu_base(a->v_pool);
    p->ks = p->vs = NULL;
    if (!q8) return KHUB_STATUS_OK;
    const uint64_t f32 = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32);
    const khub_tensor *sc[2] = {a->k_scales, a->v_scales};
    const char *names[2] = {"k_scales", "v_scales"};
    for (int i = 0; i < 2; i++) {
        KHUB_PU_TRY(khub_pu_tensor_check(host, op, names[i], sc[i], 2, f32, KHUB_DEVICE_CPU));
        KHUB_PU_TRY(khub_pu_dim_check(host, op, names[i], sc[i], 0, p->n_blocks, "n_blocks"));
        KHUB_PU_TRY(khub_pu_dim_check(host, op, names[i], sc[i], 1, p->n_kv_heads, "n_kv_heads"));
        if (!khub_pu_is_compact(sc[i]))
            return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: %s has strides (want compact)", op,
                              names[i]);
    }
    p->ks = khub_pu_base(a->k_scales);
    p->vs = khub_pu_base(a->v_scales);
    return KHUB_STATUS_OK;
}

/* The sequences: cu_seqlens_q, positions, lengths and the block ids used. */
static inline khub_status khub_pu__paged_seqs(const khub_host_api *host, const char *op,
                                              const khub_paged_attention_args *a,
                                              const khub_pu_paged *p)
{
    void *c = host->host_ctx;
    if (!a->cu_seqlens_q || !a->q_pos0 || !a->kv_lens || !a->block_table)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: cu_seqlens_q, q_pos0, kv_lens or block_table is NULL", op);
    if (a->cu_seqlens_q[0] != 0 || a->cu_seqlens_q[a->n_seqs] != p->total_q)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: cu_seqlens_q (got [0] = %d, [n_seqs] = %d, want 0 and total_q "
                          "%lld)",
                          op, (int)a->cu_seqlens_q[0], (int)a->cu_seqlens_q[a->n_seqs],
                          (long long)p->total_q);
    int64_t cap = a->block_table_stride * a->block_size; /* both checked >= 1, < 2^31 */
    for (int32_t s = 0; s < a->n_seqs; s++) {
        int32_t n_q = a->cu_seqlens_q[s + 1] - a->cu_seqlens_q[s], kv = a->kv_lens[s];
        if (n_q < 0 || a->q_pos0[s] < 0 || kv < 0 || kv > cap ||
            (a->seq_rows && a->seq_rows[s] < 0))
            return host->fail(c, KHUB_STATUS_INVALID_ARG,
                              "%s: sequence %d (got %d queries at position %d, kv_len %d%s; want "
                              "cu_seqlens_q ascending, q_pos0 >= 0, 0 <= kv_len <= %lld = "
                              "block_table_stride x block_size)",
                              op, (int)s, (int)n_q, (int)a->q_pos0[s], (int)kv,
                              a->seq_rows && a->seq_rows[s] < 0 ? ", a negative seq_rows entry"
                                                                : "",
                              (long long)cap);
        const int32_t *row = khub_pu_paged_row(p, s);
        for (int64_t b = 0; b < (kv + a->block_size - 1) / a->block_size; b++)
            if (row[b] < 0 || row[b] >= p->n_blocks)
                return host->fail(c, KHUB_STATUS_INVALID_ARG,
                                  "%s: sequence %d: block_table entry %lld (got %d, want "
                                  "0..%lld: its first %d keys need it)",
                                  op, (int)s, (long long)b, (int)row[b], (long long)p->n_blocks - 1,
                                  (int)kv);
    }
    return KHUB_STATUS_OK;
}

/* Checks args for a paged_attention op serving the layouts in `layouts`
 * (KHUB_KV_LAYOUT_BIT mask) and fills p. */
static inline khub_status khub_pu_paged_check(const khub_host_api *host, const char *op,
                                              const void *args, uint64_t layouts, khub_pu_paged *p)
{
    void *c = host->host_ctx;
    KHUB_PU_TRY(khub_pu_args_check(host, op, args, KHUB_PU_PAGED_ARGS_1_4_SIZE));
    const khub_paged_attention_args *a = args;
    memset(p, 0, sizeof *p);
    p->a = a;
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    KHUB_PU_TRY(
        khub_pu_softcap(host, op, args, offsetof(khub_paged_attention_args, softcap), &p->softcap));
#endif
    if (a->layout >= 64 || !(layouts & KHUB_KV_LAYOUT_BIT(a->layout)))
        return host->fail(c, KHUB_STATUS_UNSUPPORTED, "%s: KV layout %u is not served here", op,
                          (unsigned)a->layout);
    if (a->ctx && (a->ctx->struct_size < sizeof(khub_call_ctx) ||
                   (a->ctx->device.device_type && a->ctx->device.device_type != KHUB_DEVICE_CPU)))
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: ctx (struct_size %u, device %d; want >= %zu and the CPU)", op,
                          (unsigned)a->ctx->struct_size, (int)a->ctx->device.device_type,
                          sizeof(khub_call_ctx));
    if (a->n_seqs < 1 || a->block_size < 1 || a->block_table_stride < 1 ||
        a->block_table_stride > INT32_MAX || a->causal > 1 || a->window < 0 || !isfinite(a->scale))
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: n_seqs %d, block_size %d, block_table_stride %lld, causal %u, "
                          "window %lld, scale %g (want n_seqs, block_size, stride >= 1, causal "
                          "0/1, window >= 0, a finite scale)",
                          op, (int)a->n_seqs, (int)a->block_size, (long long)a->block_table_stride,
                          (unsigned)a->causal, (long long)a->window, (double)a->scale);
    const uint64_t f32 = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32);
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "q", a->q, 3, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "out", a->out, 3, f32, KHUB_DEVICE_CPU));
    if (!khub_pu_is_compact(a->q) || !khub_pu_is_compact(a->out))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: q/out have strides (want compact)", op);
    p->total_q = a->q->shape[0];
    p->n_heads = a->q->shape[1];
    p->hd = a->q->shape[2];
    if (p->n_heads < 1 || p->hd < 1 || p->total_q > INT32_MAX)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          "%s: q shape (got [%lld, %lld, %lld], want n_heads, head_dim >= 1)", op,
                          (long long)p->total_q, (long long)p->n_heads, (long long)p->hd);
    for (int d = 0; d < 3; d++)
        KHUB_PU_TRY(khub_pu_dim_check(host, op, "out", a->out, d, a->q->shape[d], "q's"));
    if (khub_pu_base(a->out) == khub_pu_base(a->q))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: out aliases q (want separate memory)",
                          op);
    p->q = khub_pu_base(a->q);
    p->out = khub_pu_base(a->out);
    p->bs = a->block_size;
    KHUB_PU_TRY(khub_pu__paged_pools(host, op, a, p));
    return khub_pu__paged_seqs(host, op, a, p);
}

#endif /* KHUB_PAGED_CHECK_H */
