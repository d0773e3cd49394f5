/*
 * test_gpu_ops.c (CTest label gpu): each in-tree CUDA op against
 * khub/ref-cpu on the tensors the executor hands it (issue 19 item 5):
 * rms_norm with the fused residual on rows that start past the start of
 * their buffer, silu_and_mul, flash attention over strided K/V views (the
 * cache's rows are wider than n_kv_heads x head_dim) for prefill (the
 * tiles) and decode steps of 1-8 rows over up to 20480 keys (split-K), GQA
 * at head_dim 64 and 128, rotary (NEOX and interleaved, two bases, Llama 3.1 scaling,
 * a partial rotary_dim), and the device KV cache (append, then views read
 * back) against the reference static cache; and SmolLM2 on the device
 * against the CPU's greedy tokens. SmolLM2-135M's shapes: hidden 576, ffn
 * 1536, 9 query and 3 KV heads of 64. The linear layers (GEMV and GEMM) are
 * test_gpu_linear.c's; the bench both use is gpu_bench.h.
 *
 * KHUB_GPU_KERNELS names a folder of kernel folders built with `khub build`
 * (tools/gpu-check.sh makes it); each CUDA variant's glue is loaded with its
 * PTX as verified artifacts. Skips without that folder or without a CUDA
 * driver. On the fake driver (tests/fake_cuda) no kernel runs: the cases
 * then check only the plumbing (uploads, launches, downloads) and say that
 * they compared nothing.
 */
#include <math.h>

#include "gpu_bench.h"
#include "khub/khub_model.h"

/* ======================================================================== */
/* The ops                                                                  */
/* ======================================================================== */

enum { HID = 576, FFN = 1536, NH = 9, NKV = 3, HD = 64, OFF = 64 };

static void norm_case(khub_runtime *rt, khub_binding *cu, khub_binding *ref, int64_t rows)
{
    size_t n = (size_t)rows * HID;
    buf x = mkbuf(OFF + n, true), res = mkbuf(n, true), w = mkbuf(HID, true), y = mkbuf(n, false);
    float *res0 = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)),
          *got_res = malloc(n * sizeof(float));
    ASSERT(res0 && got && got_res);
    memcpy(res0, res.h, n * sizeof(float));
    int64_t sh[2] = {rows, HID}, wsh[1] = {HID};
    khub_tensor dx = view(&x, true, OFF, 2, sh, NULL), dr = view(&res, true, 0, 2, sh, NULL),
                dw = view(&w, true, 0, 1, wsh, NULL), dy = view(&y, true, 0, 2, sh, NULL);
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .norm_type = KHUB_NORM_RMS,
                        .eps = 1e-5f,
                        .x = &dx,
                        .residual = &dr,
                        .weight = &dw,
                        .y = &dy};
    ASSERT_OK(khub_binding_call(cu, &a));
    download(&y, got);
    download(&res, got_res);
    khub_tensor hx = view(&x, false, OFF, 2, sh, NULL), hr = view(&res, false, 0, 2, sh, NULL),
                hw = view(&w, false, 0, 1, wsh, NULL), hy = view(&y, false, 0, 2, sh, NULL);
    a.x = &hx, a.residual = &hr, a.weight = &hw, a.y = &hy;
    ASSERT_OK(khub_binding_call(ref, &a));
    char what[64];
    snprintf(what, sizeof what, "rms_norm+residual [%lld, %d] y", (long long)rows, HID);
    compare(what, got, y.h, n, 1e-10);
    snprintf(what, sizeof what, "rms_norm+residual [%lld, %d] residual", (long long)rows, HID);
    compare(what, got_res, res.h, n, 1e-12);
    free(res0), free(got), free(got_res);
    freebuf(&x), freebuf(&res), freebuf(&w), freebuf(&y);
}

TEST_IMPL(gpu_rms_norm_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "rmsnorm");
    khub_binding *cu =
        op(rt, KHUB_OP_NORM, true, "kernels-community/rmsnorm", KHUB_CAP_RESIDUAL, 0);
    khub_binding *ref = op(rt, KHUB_OP_NORM, false, "khub/ref-cpu", KHUB_CAP_RESIDUAL, 0);
    for (int64_t rows = 1; rows <= 33; rows += 16) norm_case(rt, cu, ref, rows); /* 1, 17, 33 */
    khub_runtime_free(rt);
}

TEST_IMPL(gpu_silu_and_mul_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "activation");
    khub_binding *cu = op(rt, KHUB_OP_ACTIVATION, true, "kernels-community/activation", 0, 0);
    khub_binding *ref = op(rt, KHUB_OP_ACTIVATION, false, "khub/ref-cpu", 0, 0);
    for (int64_t rows = 1; rows <= 17; rows += 16) {
        size_t n = (size_t)rows * FFN;
        buf g = mkbuf(n, true), u = mkbuf(n, true), y = mkbuf(n, false);
        float *got = malloc(n * sizeof(float));
        ASSERT(got);
        int64_t sh[2] = {rows, FFN};
        khub_tensor dg = view(&g, true, 0, 2, sh, NULL), du = view(&u, true, 0, 2, sh, NULL),
                    dy = view(&y, true, 0, 2, sh, NULL);
        khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args), .act_type = KHUB_ACT_SILU,
                                  .gate = &dg, .up = &du, .y = &dy};
        ASSERT_OK(khub_binding_call(cu, &a));
        download(&y, got);
        khub_tensor hg = view(&g, false, 0, 2, sh, NULL), hu = view(&u, false, 0, 2, sh, NULL),
                    hy = view(&y, false, 0, 2, sh, NULL);
        a.gate = &hg, a.up = &hu, a.y = &hy;
        ASSERT_OK(khub_binding_call(ref, &a));
        char what[64];
        snprintf(what, sizeof what, "silu_and_mul [%lld, %d]", (long long)rows, FFN);
        compare(what, got, y.h, n, 1e-10);
        free(got);
        freebuf(&g), freebuf(&u), freebuf(&y);
    }
    khub_runtime_free(rt);
}

/* Attention of n_q queries (nh heads of hd) at positions [n_kv - n_q,
 * n_kv) over n_kv cached positions of nkvh KV heads whose K and V rows are
 * nkvh x hd + 64 floats apart (wider than the heads, as in a cache with
 * room per row). */
static void attn_case(khub_binding *cu, khub_binding *ref, int64_t nh, int64_t nkvh, int64_t hd,
                      int64_t n_q, int64_t n_kv)
{
    const int64_t row = nkvh * hd + 64;
    size_t nq = (size_t)(n_q * nh * hd), nkv = (size_t)(n_kv * row);
    buf q = mkbuf(nq, true), k = mkbuf(nkv, true), v = mkbuf(nkv, true), o = mkbuf(nq, false);
    float *got = malloc(nq * sizeof(float));
    ASSERT(got);
    int64_t qs[3] = {n_q, nh, hd}, ks[3] = {n_kv, nkvh, hd}, kst[3] = {row, hd, 1};
    khub_tensor dq = view(&q, true, 0, 3, qs, NULL), dk = view(&k, true, 0, 3, ks, kst),
                dv = view(&v, true, 0, 3, ks, kst), dout = view(&o, true, 0, 3, qs, NULL);
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = &dq,
                             .k = &dk,
                             .v = &dv,
                             .out = &dout,
                             .scale = 1.0f / sqrtf((float)hd),
                             .causal = 1,
                             .q_pos0 = n_kv - n_q};
    ASSERT_OK(khub_binding_call(cu, &a));
    download(&o, got);
    khub_tensor hq = view(&q, false, 0, 3, qs, NULL), hk = view(&k, false, 0, 3, ks, kst),
                hv = view(&v, false, 0, 3, ks, kst), hout = view(&o, false, 0, 3, qs, NULL);
    a.q = &hq, a.k = &hk, a.v = &hv, a.out = &hout;
    ASSERT_OK(khub_binding_call(ref, &a));
    char what[112];
    snprintf(what, sizeof what,
             "attention q [%lld, %lld, %lld] over %lld strided K/V rows of %lld heads",
             (long long)n_q, (long long)nh, (long long)hd, (long long)n_kv, (long long)nkvh);
    compare(what, got, o.h, nq, 1e-6);
    free(got);
    freebuf(&q), freebuf(&k), freebuf(&v), freebuf(&o);
}

/* flash-attn2's two paths (flash_attn_cuda.c): the prefill tiles for more
 * than 8 query rows, split-K for 1-8 (one split written directly, several
 * merged, the 64-split cap, the partials' budget capping 64 heads of 128
 * at 59 splits), on SmolLM2's heads (9 over 3, head_dim 64) and a Llama
 * 3 8B's (32 over 8, head_dim 128). */
TEST_IMPL(gpu_flash_attention_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "flash-attn2");
    uint32_t flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_STRIDED_KV;
    const char *fa = "kernels-community/flash-attn2";
    khub_binding *cu = op(rt, KHUB_OP_ATTENTION, true, fa, flags, HD);
    khub_binding *ref = op(rt, KHUB_OP_ATTENTION, false, "khub/ref-cpu", flags, HD);
    attn_case(cu, ref, NH, NKV, HD, 37, 37);   /* prefill: the tiles */
    attn_case(cu, ref, NH, NKV, HD, 9, 9);     /* 9 rows: the tiles */
    attn_case(cu, ref, NH, NKV, HD, 1, 200);   /* decode: one split, one launch */
    attn_case(cu, ref, NH, NKV, HD, 1, 300);   /* 2 splits and the merge */
    attn_case(cu, ref, NH, NKV, HD, 1, 4096);  /* 16 splits */
    attn_case(cu, ref, NH, NKV, HD, 8, 2000);  /* 8 rows, 8 splits */
    attn_case(cu, ref, NH, NKV, HD, 1, 20480); /* 64 splits of 320 */
    cu = op(rt, KHUB_OP_ATTENTION, true, fa, flags, 128);
    ref = op(rt, KHUB_OP_ATTENTION, false, "khub/ref-cpu", flags, 128);
    attn_case(cu, ref, 32, 8, 128, 37, 37);
    attn_case(cu, ref, 32, 8, 128, 1, 4096);
    attn_case(cu, ref, 32, 8, 128, 4, 1000);
    attn_case(cu, ref, 64, 8, 128, 8, 20480); /* the budget: 59 splits of 352 */
    khub_runtime_free(rt);
}

/* ======================================================================== */
/* Rotary, linear layers and the KV cache                                   */
/* ======================================================================== */

/* Rotary in place on x [n, NH, HD] at positions 7, 7 + 13, ... (a device
 * int32 array for the CUDA op, the same host array for ref-cpu). */
static void rope_case(khub_binding *cu, khub_binding *ref, int64_t n, uint32_t style,
                      uint32_t scaling, float theta, int32_t rotary_dim)
{
    size_t nx = (size_t)n * NH * HD;
    buf x = mkbuf(nx, true), pos = mkbuf((size_t)n, false);
    int32_t *p = (int32_t *)pos.h;
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(7 + 13 * i);
    upload(&pos);
    float *got = malloc(nx * sizeof(float));
    ASSERT(got);
    int64_t sh[3] = {n, NH, HD};
    khub_tensor dx = view(&x, true, 0, 3, sh, NULL);
    khub_rotary_args a = {KHUB_STRUCT_INIT(khub_rotary_args),
                          .x = &dx,
                          .positions = (const int32_t *)(uintptr_t)pos.d,
                          .style = style,
                          .scaling = scaling,
                          .theta = theta,
                          .factor = 8.0f,
                          .low_freq_factor = 1.0f,
                          .high_freq_factor = 4.0f,
                          .original_max_pos = 8192,
                          .rotary_dim = rotary_dim};
    ASSERT_OK(khub_binding_call(cu, &a));
    download(&x, got);
    khub_tensor hx = view(&x, false, 0, 3, sh, NULL);
    a.x = &hx, a.positions = p;
    ASSERT_OK(khub_binding_call(ref, &a));
    char what[128];
    snprintf(what, sizeof what, "rotary %s%s theta %g rotary_dim %d [%lld, %d, %d]",
             style == KHUB_ROPE_NEOX ? "neox" : "interleaved",
             scaling == KHUB_ROPE_SCALING_LLAMA3 ? " llama3" : "", theta, rotary_dim, (long long)n,
             NH, HD);
    compare(what, got, x.h, nx, 1e-12);
    free(got);
    freebuf(&x), freebuf(&pos);
}

TEST_IMPL(gpu_rotary_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "rotary");
    khub_binding *cu = op(rt, KHUB_OP_ROTARY, true, "kernels-community/rotary", 0, 0);
    khub_binding *ref = op(rt, KHUB_OP_ROTARY, false, "khub/ref-cpu", 0, 0);
    /* the kernel specialised for 32 pairs, both pair layouts, two bases (a
     * model with a base per layer passes each), a decode row and a prefill */
    rope_case(cu, ref, 1, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_NONE, 10000.0f, 0);
    rope_case(cu, ref, 37, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_NONE, 1e6f, 0);
    rope_case(cu, ref, 37, KHUB_ROPE_INTERLEAVED, KHUB_ROPE_SCALING_NONE, 10000.0f, 0);
    rope_case(cu, ref, 17, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_LLAMA3, 500000.0f, 0);
    /* a partial rotary_dim: the generic kernel (16 pairs) */
    rope_case(cu, ref, 17, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_NONE, 10000.0f, 32);
    khub_runtime_free(rt);
}

/* Both caches get the same writes (a prefill of 37 tokens, then one decode
 * token, in layer 1 of sequence 1); the CUDA cache's views are read back
 * row by row through their strides and compared with the reference's. */
static void kv_case(khub_binding *cu, khub_binding *ref, khub_dtype dt)
{
    enum { LAYERS = 2, SEQS = 2, CAP = 64, N0 = 37, ROWF = NKV * HD };
    void *cs = NULL, *rs = NULL;
    const khub_kv_cache_methods *cm = khub_binding_methods(cu, &cs);
    const khub_kv_cache_methods *rm = khub_binding_methods(ref, &rs);
    ASSERT(cm && rm);
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = LAYERS,
                                .n_kv_heads = NKV,
                                .head_dim = HD,
                                .n_seqs = SEQS,
                                .max_tokens = CAP,
                                .dtype = dt};
    khub_kv_cache *cc = NULL, *rc = NULL;
    khub__plugin_msg_clear();
    if (cm->create(cs, &cfg, &cc) != KHUB_STATUS_OK)
        TEST_FAIL_("CUDA cache create: %s", khub__plugin_msg());
    ASSERT_OK(rm->create(rs, &cfg, &rc));
    int64_t written = 0;
    for (int step = 0; step < 2; step++) {
        int64_t n = step ? 1 : N0;
        buf k = mkbuf((size_t)(n * ROWF), true), v = mkbuf((size_t)(n * ROWF), true);
        int64_t sh[3] = {n, NKV, HD};
        khub_tensor dk = view(&k, true, 0, 3, sh, NULL), dv = view(&v, true, 0, 3, sh, NULL);
        khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                                .layer = 1,
                                .seq = 1,
                                .pos = written,
                                .k = &dk,
                                .v = &dv};
        khub__plugin_msg_clear();
        if (cm->write(cs, cc, &w) != KHUB_STATUS_OK)
            TEST_FAIL_("CUDA cache write: %s", khub__plugin_msg());
        khub_tensor hk = view(&k, false, 0, 3, sh, NULL), hv = view(&v, false, 0, 3, sh, NULL);
        w.k = &hk, w.v = &hv;
        ASSERT_OK(rm->write(rs, rc, &w));
        written += n;
        khub__cuda_host_stream_sync(NULL, NULL);
        freebuf(&k), freebuf(&v);
    }
    int64_t n = written, shape[4][3], strides[4][3];
    khub_tensor t[4]; /* CUDA k, v; reference k, v */
    for (int i = 0; i < 4; i++) t[i] = (khub_tensor){.shape = shape[i], .strides = strides[i]};
    khub__plugin_msg_clear();
    if (cm->view(cs, cc, 1, 1, n, &t[0], &t[1]) != KHUB_STATUS_OK)
        TEST_FAIL_("CUDA cache view: %s", khub__plugin_msg());
    ASSERT_OK(rm->view(rs, rc, 1, 1, n, &t[2], &t[3]));
    ASSERT_EQ(t[0].device.device_type, KHUB_DEVICE_CUDA);
    ASSERT_EQ(t[0].dtype.bits, t[2].dtype.bits);
    ASSERT_EQ(strides[0][2], 1);
    ASSERT_EQ(strides[2][2], 1);
    size_t elem = t[0].dtype.bits / 8;
    for (int which = 0; which < 2; which++) {
        const khub_tensor *c = &t[which], *r = &t[2 + which];
        float *got = calloc((size_t)(n * ROWF), sizeof(float)),
              *want = calloc((size_t)(n * ROWF), sizeof(float));
        uint8_t *row = malloc((size_t)HD * elem);
        ASSERT(got && want && row);
        for (int64_t p = 0; p < n; p++)
            for (int64_t h = 0; h < NKV; h++) {
                uint64_t src = (uint64_t)(uintptr_t)c->data + c->byte_offset +
                               (uint64_t)(p * c->strides[0] + h * c->strides[1]) * elem;
                khub__plugin_msg_clear();
                if (khub__cuda_host_memcpy_dtoh(NULL, row, src, (size_t)HD * elem, NULL) !=
                        KHUB_STATUS_OK ||
                    khub__cuda_host_stream_sync(NULL, NULL) != KHUB_STATUS_OK)
                    TEST_FAIL_("reading the view: %s", khub__plugin_msg());
                const uint8_t *hr = (const uint8_t *)r->data + r->byte_offset +
                                    (size_t)(p * r->strides[0] + h * r->strides[1]) * elem;
                for (int64_t d = 0; d < HD; d++) {
                    got[(p * NKV + h) * HD + d] = load_elem(row, elem, d);
                    want[(p * NKV + h) * HD + d] = load_elem(hr, elem, d);
                }
            }
        char what[96];
        snprintf(what, sizeof what, "kv cache %s %s view of %lld positions",
                 dt.bits == 16 ? "f16" : "f32", which ? "V" : "K", (long long)n);
        compare(what, got, want, (size_t)(n * ROWF), 0.0);
        free(got), free(want), free(row);
    }
    cm->destroy(cs, cc);
    rm->destroy(rs, rc);
}

TEST_IMPL(gpu_kv_cache_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "kv-cache-cuda");
    uint32_t flags = KHUB_CAP_STRIDED_KV;
    khub_binding *cu = op(rt, KHUB_OP_KV_CACHE, true, "kernels-community/kv-cache-cuda", flags, 0);
    khub_binding *ref = op(rt, KHUB_OP_KV_CACHE, false, "khub/ref-cpu", flags, 0);
    kv_case(cu, ref, KHUB_DTYPE_F32);
    khub_binding *cu16 = op_dt(rt, KHUB_OP_KV_CACHE, true, "kernels-community/kv-cache-cuda",
                               KHUB_DTYPE_ID_F16, flags | KHUB_CAP_KV_F16, 0);
    khub_binding *ref16 = op_dt(rt, KHUB_OP_KV_CACHE, false, "khub/ref-cpu", KHUB_DTYPE_ID_F16,
                                flags | KHUB_CAP_KV_F16, 0);
    kv_case(cu16, ref16, KHUB_DTYPE_F16);
    khub_runtime_free(rt);
}

/* ======================================================================== */
/* SmolLM2 on the device                                                    */
/* ======================================================================== */

/* Greedy text of SmolLM2-135M Q4_1 for a prompt, n_new tokens, loaded for
 * device (its placement printed when explain) with the KV cache cache_impl
 * names (NULL: the dense default; "khub/ref-cpu:paged_cache": a paged
 * cache, kv-cache-cuda's on the device), and the decode tok/s. */
static char *smollm2_run_cache(khub_runtime *rt, const char *gguf, khub_device device,
                               const char *cache_impl, bool explain, int n_new,
                               double *decode_tok_s)
{
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts), .device = device, .max_context = 256,
                         .cache_impl = cache_impl};
    khub_model *m = NULL;
    if (khub_model_load(rt, gguf, &o, &m) != KHUB_STATUS_OK)
        TEST_FAIL_("loading %s: %s", gguf, khub_runtime_errmsg(rt));
    if (explain) printf("%s", strstr(khub_model_explain(m), "placement:"));
    const char *prompts[] = {"The capital of France is"};
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = n_new};
    khub_generate_result res = {KHUB_APP_INIT(khub_generate_result)};
    if (khub_model_generate(m, prompts, 1, &go, &res) != KHUB_STATUS_OK)
        TEST_FAIL_("generating: %s", khub_runtime_errmsg(rt));
    if (decode_tok_s) *decode_tok_s = res.decode_tok_s;
    char *text = strdup(res.text);
    khub_generate_results_free(m, &res, 1);
    khub_model_free(m);
    return text;
}

static char *smollm2_run(khub_runtime *rt, const char *gguf, khub_device device, bool explain,
                         int n_new, double *decode_tok_s)
{
    return smollm2_run_cache(rt, gguf, device, NULL, explain, n_new, decode_tok_s);
}

/* The in-tree CUDA kernels (gpu-check.sh step 5 built them), so every role
 * of SmolLM2, the embedding's included, runs on the device. */
static void load_every_cuda_kernel(khub_runtime *rt)
{
    static const char *const kernels[] = {"rmsnorm", "activation",    "flash-attn2", "rotary",
                                          "gemv",    "kv-cache-cuda", "embedding"};
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        load_cuda_variant(rt, kernels[i]);
}

/* Every in-tree CUDA kernel loaded, SmolLM2 placed on the device with every
 * role there, and its greedy tokens against the CPU's. On the fake driver
 * the pass runs (launches, copies) but computes nothing: not compared. */
TEST_IMPL(gpu_smollm2_device_matches_cpu)
{
    const char *dir = getenv("KHUB_MODEL_DIR");
    char gguf[1024];
    snprintf(gguf, sizeof gguf, "%s%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : getenv("HOME"),
             dir ? "" : "/.cache/khub/models");
    if (access(gguf, R_OK) != 0) TEST_SKIP("%s absent (tools/fetch-model.sh)", gguf);
    khub_runtime *rt = bench_runtime();
    load_every_cuda_kernel(rt);
    char *cpu = smollm2_run(rt, gguf, (khub_device){KHUB_DEVICE_CPU, 0}, false, 16, NULL);
    char *dev = smollm2_run(rt, gguf, (khub_device){KHUB_DEVICE_CUDA, 0}, true, 16, NULL);
    printf("  cpu:  %s\n  cuda: %s\n", cpu, dev);
    if (fake_driver)
        printf("  SmolLM2 greedy tokens: fake driver, nothing compared\n");
    else if (strcmp(cpu, dev) != 0)
        TEST_FAIL_("SmolLM2's greedy text on the device differs from the CPU's");
    free(cpu), free(dev);
    khub_runtime_free(rt);
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* SmolLM2 on the device with CUDA graphs off (KHUB_CUDA_GRAPHS=0) and on,
 * three interleaved rounds of 64 greedy tokens each, with the dense device
 * cache and then the paged one: the same tokens, and the decode tok/s
 * medians and their ratio (the speedup graphs give). */
TEST_IMPL(gpu_smollm2_graphs_on_off)
{
    const char *dir = getenv("KHUB_MODEL_DIR");
    char gguf[1024];
    snprintf(gguf, sizeof gguf, "%s%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : getenv("HOME"),
             dir ? "" : "/.cache/khub/models");
    if (access(gguf, R_OK) != 0) TEST_SKIP("%s absent (tools/fetch-model.sh)", gguf);
    khub_runtime *rt = bench_runtime();
    load_every_cuda_kernel(rt);
    const khub_device cuda = {KHUB_DEVICE_CUDA, 0};
    /* The dense device cache, then the paged one (kv-cache-cuda's paged
     * cache and attention: blocks reserved on the model's stream before
     * each graph). */
    static const char *const caches[2] = {NULL, "khub/ref-cpu:paged_cache"};
    for (int c = 0; c < 2; c++) {
        double tok_s[2][3];
        char *text[2] = {NULL, NULL};
        for (int round = 0; round < 3; round++)
            for (int on = 0; on < 2; on++) {
                if (on)
                    unsetenv("KHUB_CUDA_GRAPHS");
                else
                    setenv("KHUB_CUDA_GRAPHS", "0", 1);
                char *t = smollm2_run_cache(rt, gguf, cuda, caches[c], round == 0 && on, 64,
                                            &tok_s[on][round]);
                if (!text[on])
                    text[on] = t;
                else
                    free(t);
            }
        unsetenv("KHUB_CUDA_GRAPHS");
        for (int on = 0; on < 2; on++) qsort(tok_s[on], 3, sizeof(double), by_value);
        const char *cache = c ? "paged" : "dense";
        printf("  %s cache, graphs off: %s\n  %s cache, graphs on:  %s\n", cache, text[0], cache,
               text[1]);
        printf("  %s cache, decode tok/s, median of 3 (64 tokens): graphs off %.1f, on %.1f: "
               "%.2fx\n",
               cache, tok_s[0][1], tok_s[1][1], tok_s[0][1] > 0 ? tok_s[1][1] / tok_s[0][1] : 0.0);
        if (fake_driver)
            printf("  CUDA graphs on/off, %s cache: fake driver, nothing compared\n", cache);
        else if (strcmp(text[0], text[1]) != 0)
            TEST_FAIL_("SmolLM2's greedy text differs with CUDA graphs on and off (%s cache)",
                       cache);
        free(text[0]), free(text[1]);
    }
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(gpu_rms_norm_vs_ref_cpu) \
    X(gpu_silu_and_mul_vs_ref_cpu) \
    X(gpu_flash_attention_vs_ref_cpu) \
    X(gpu_rotary_vs_ref_cpu) \
    X(gpu_kv_cache_vs_ref_cpu) \
    X(gpu_smollm2_device_matches_cpu) \
    X(gpu_smollm2_graphs_on_off)
TEST_MAIN(TEST_LIST)
