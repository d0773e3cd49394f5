/*
 * test_gpu_paged.c (CTest label gpu): kernels-community/kv-cache-cuda's
 * paged cache and paged attention on a GPU against khub/ref-cpu's dense
 * attention over the same keys (issue 19 item 2; tools/gpu-check.sh step
 * 6). Each case fills a device paged cache (blocks of 16 tokens, reserved
 * in reverse sequence order so no sequence's blocks are in order) through
 * its write method, runs one paged_attention call over a packed batch, and
 * compares each sequence's rows with ref-cpu's attention of that sequence
 * alone (the last n_q positions as queries, causal):
 *   - decode batches (split-K: one split per sequence, and several),
 *     several rows per sequence, and prefill batches (the tiles);
 *   - f32 and f16 pools (the reference then reads the f16-rounded values);
 *   - a sliding window and the soft-cap (Gemma 2/3's).
 * SmolLM2-135M's heads: 9 query and 3 KV heads of 64. On the fake driver
 * the calls run (uploads, launches, downloads) and nothing is compared.
 */
#include <math.h>

#include "../plugins/include/khub_plugin_util.h" /* f32 <-> f16 */
#include "gpu_bench.h"

enum { NH = 9, NKV = 3, HD = 64, BS = 16, MAXS = 4 };

typedef struct pcase {
    int n_seqs;
    int len[MAXS], nq[MAXS]; /* keys of each sequence; its last nq positions query */
    int f16;
    int64_t window;
    float softcap;
} pcase;

/* Rounds v[n] to f16 and back: what an f16 pool holds. */
static void round_f16(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) v[i] = khub_pu_f16_to_f32(khub_pu_f32_to_f16(v[i]));
}

/* ref-cpu's dense attention of sequence s: q rows [nq, NH, HD] over k/v
 * [len, NKV, HD] (host), into want. */
static void dense_ref(khub_binding *ref, const pcase *c, int s, const float *q, const float *k,
                      const float *v, float *want)
{
    int64_t qs[3] = {c->nq[s], NH, HD}, ks[3] = {c->len[s], NKV, HD};
    khub_tensor tq = {.data = (void *)q,
                      .device = {KHUB_DEVICE_CPU, 0},
                      .ndim = 3,
                      .dtype = KHUB_DTYPE_F32,
                      .shape = qs},
                tk = tq, tv = tq, to = tq;
    tk.data = (void *)k, tk.shape = ks;
    tv.data = (void *)v, tv.shape = ks;
    to.data = want;
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = &tq,
                             .k = &tk,
                             .v = &tv,
                             .out = &to,
                             .scale = 0.125f,
                             .causal = 1,
                             .q_pos0 = c->len[s] - c->nq[s],
                             .window = c->window,
                             .softcap = c->softcap};
    ASSERT_OK(khub_binding_call(ref, &a));
}

static void paged_case(khub_runtime *rt, const pcase *c)
{
    /* the paged cache: the layout names it (the static cache would win a
     * query without one) */
    khub_op_query cq = {KHUB_STRUCT_INIT(khub_op_query),
                        .kind = KHUB_OP_KV_CACHE,
                        .device_type = KHUB_DEVICE_CUDA,
                        .dtype_id = c->f16 ? KHUB_DTYPE_ID_F16 : KHUB_DTYPE_ID_F32,
                        .kv_layout = KHUB_KV_LAYOUT_PAGED_HTD,
                        .plugin_id = "kernels-community/kv-cache-cuda"};
    khub_binding *cache = NULL;
    if (khub_registry_select(rt, &cq, &cache) != KHUB_STATUS_OK)
        TEST_FAIL_("paged_cache: %s", khub_runtime_errmsg(rt));
    khub_binding *ref = op(rt, KHUB_OP_ATTENTION, false, "khub/ref-cpu",
                           KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_SLIDING, HD);
    khub_op_query pq = {KHUB_STRUCT_INIT(khub_op_query),
                        .kind = KHUB_OP_PAGED_ATTENTION,
                        .device_type = KHUB_DEVICE_CUDA,
                        .dtype_id = c->f16 ? KHUB_DTYPE_ID_F16 : KHUB_DTYPE_ID_F32,
                        .head_dim = HD,
                        .kv_layout = KHUB_KV_LAYOUT_PAGED_HTD,
                        .plugin_id = "kernels-community/kv-cache-cuda"};
    khub_binding *pa = NULL;
    if (khub_registry_select(rt, &pq, &pa) != KHUB_STATUS_OK)
        TEST_FAIL_("paged_attention: %s", khub_runtime_errmsg(rt));
    void *cs = NULL;
    const khub_op_desc *cd = khub_binding_acquire(cache, &cs);
    const khub_kv_cache_methods *km = cd->methods;
    int max_len = 0, total = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        max_len = c->len[s] > max_len ? c->len[s] : max_len;
        total += c->nq[s];
    }
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 1,
                                .n_kv_heads = NKV,
                                .head_dim = HD,
                                .n_seqs = c->n_seqs,
                                .max_tokens = max_len,
                                .dtype = c->f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32,
                                .block_size = BS};
    khub_kv_cache *kc = NULL;
    khub__plugin_msg_clear();
    if (km->create(cs, &cfg, &kc) != KHUB_STATUS_OK) TEST_FAIL_("create: %s", khub__plugin_msg());
    for (int s = c->n_seqs - 1; s >= 0; s--) ASSERT_OK(km->reserve(cs, kc, s, c->len[s]));
    /* K/V per sequence on both sides; the queries packed */
    buf k[MAXS], v[MAXS], q = mkbuf((size_t)total * NH * HD, true);
    buf ints = mkbuf((size_t)(4 * c->n_seqs + 1), false);
    int32_t *cu = (int32_t *)ints.h, *pos0 = cu + c->n_seqs + 1, *lens = pos0 + c->n_seqs,
            *rows = lens + c->n_seqs;
    cu[0] = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        size_t n = (size_t)c->len[s] * NKV * HD;
        k[s] = mkbuf(n, true), v[s] = mkbuf(n, true);
        int64_t sh[3] = {c->len[s], NKV, HD};
        khub_tensor dk = view(&k[s], true, 0, 3, sh, NULL), dv = view(&v[s], true, 0, 3, sh, NULL);
        khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                                .layer = 0,
                                .seq = s,
                                .pos = 0,
                                .k = &dk,
                                .v = &dv};
        khub__plugin_msg_clear();
        if (km->write(cs, kc, &w) != KHUB_STATUS_OK) TEST_FAIL_("write: %s", khub__plugin_msg());
        if (c->f16) round_f16(k[s].h, n), round_f16(v[s].h, n);
        cu[s + 1] = cu[s] + c->nq[s];
        pos0[s] = c->len[s] - c->nq[s];
        lens[s] = c->len[s];
        rows[s] = s;
    }
    upload(&ints);
    khub_kv_paged_view pv = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    ASSERT_OK(km->paged_view(cs, kc, 0, &pv));
    buf out = mkbuf((size_t)total * NH * HD, false);
    int64_t qs[3] = {total, NH, HD};
    khub_tensor dq = view(&q, true, 0, 3, qs, NULL), dout = view(&out, true, 0, 3, qs, NULL);
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CUDA, 0}};
    const int32_t *dints = (const int32_t *)(uintptr_t)ints.d;
    khub_paged_attention_args a = {KHUB_STRUCT_INIT(khub_paged_attention_args),
                                   .ctx = &ctx,
                                   .layout = pv.layout,
                                   .n_seqs = c->n_seqs,
                                   .q = &dq,
                                   .out = &dout,
                                   .k_pool = pv.k_pool,
                                   .v_pool = pv.v_pool,
                                   .cu_seqlens_q = dints,
                                   .q_pos0 = dints + c->n_seqs + 1,
                                   .kv_lens = dints + 2 * c->n_seqs + 1,
                                   .seq_rows = dints + 3 * c->n_seqs + 1,
                                   .block_table = pv.block_table,
                                   .block_table_stride = pv.block_table_stride,
                                   .block_size = pv.block_size,
                                   .scale = 0.125f,
                                   .causal = 1,
                                   .window = c->window,
                                   .softcap = c->softcap};
    ASSERT_OK(khub_binding_call(pa, &a));
    float *got = malloc((size_t)total * NH * HD * sizeof(float));
    ASSERT(got);
    download(&out, got);
    for (int s = 0; s < c->n_seqs; s++) {
        size_t n = (size_t)c->nq[s] * NH * HD, at = (size_t)cu[s] * NH * HD;
        float *want = malloc(n * sizeof(float));
        ASSERT(want);
        dense_ref(ref, c, s, q.h + at, k[s].h, v[s].h, want);
        char what[160];
        snprintf(what, sizeof what,
                 "paged attention %s, %d of %d rows of sequence %d (%d keys, window %lld, "
                 "softcap %g) vs dense",
                 c->f16 ? "f16" : "f32", c->nq[s], total, s, c->len[s], (long long)c->window,
                 (double)c->softcap);
        compare(what, got + at, want, n, 1e-6);
        free(want);
        freebuf(&k[s]), freebuf(&v[s]);
    }
    free(got);
    freebuf(&q), freebuf(&ints), freebuf(&out);
    km->destroy(cs, kc);
    khub_binding_release(cache);
}

TEST_IMPL(gpu_paged_attention_vs_dense)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "kv-cache-cuda");
    static const pcase cases[] = {
        /* decode: one row per sequence; 1000 keys reachable, so 4 splits */
        {3, {300, 1000, 37}, {1, 1, 1}, 0, 0, 0.0f},
        /* a few rows per sequence: still split-K */
        {2, {500, 64}, {8, 3}, 0, 0, 0.0f},
        /* prefill: the tiles */
        {2, {37, 130}, {37, 100}, 0, 0, 0.0f},
        /* f16 pools, decode and prefill */
        {3, {300, 1000, 37}, {1, 1, 1}, 1, 0, 0.0f},
        {2, {37, 130}, {37, 100}, 1, 0, 0.0f},
        /* a sliding window and the soft-cap, decode and prefill */
        {3, {300, 1000, 37}, {1, 2, 1}, 0, 100, 30.0f},
        {2, {37, 200}, {37, 150}, 0, 64, 30.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) paged_case(rt, &cases[i]);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) X(gpu_paged_attention_vs_dense)
TEST_MAIN(TEST_LIST)
