/*
 * test_fuse.c: a layer's q/k/v and gate/up as one op call each
 * (runtime/executor/model_fuse.c) give the same logits, bit for bit, as the
 * separate calls (KHUB_JOIN_PROJ=0): in prefill, decode and a batch of
 * several sequences, on tiny random models (tiny_llama.h) with the default
 * kernels (dense and quantized at load: one-token tiles, batch tiles, GEMM)
 * and with khub/ref-cpu, with biases, with row counts that split the
 * kernels' row tiles across q/k/v, and where one layer cannot join.
 * khub_model_explain says which ran as one call. SmolLM2 is
 * test_fuse_smollm2.c (label slow).
 */
#include <unistd.h>

#include "fuse_compare.h"
#include "tiny_llama.h"

static const char *tiny_dir(const tiny_llama *t)
{
    static char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-fuse-%d", (int)getpid());
    tiny_llama_write(dir, t);
    return dir;
}

/* 2 layers, hidden 64, 4 heads of 16 (2 KV heads), ffn 128, vocab 256. */
static tiny_llama tiny(void)
{
    return (tiny_llama){.hidden = 64,
                        .ffn = 128,
                        .layers = 2,
                        .heads = 4,
                        .kv_heads = 2,
                        .head_dim = 16,
                        .vocab = 256};
}

/* Compares t loaded with opts joined and apart; returns the joined
 * explain (caller frees). */
static char *check(const tiny_llama *t, const khub_model_opts *opts, int qkv_layers, int gu_layers)
{
    const char *dir = tiny_dir(t);
    char *ex = fc_compare(dir, opts, qkv_layers, gu_layers);
    tiny_llama_rm(dir);
    return ex;
}

TEST_IMPL(fuse_tiny_f32_same_bits)
{
    tiny_llama t = tiny();
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts)};
    char *ex = check(&t, &o, 2, 2);
    ASSERT_CONTAINS(ex, "qkv_proj[f32]: ");
    ASSERT_CONTAINS(ex, "    q_proj, k_proj, v_proj as one call (a joined weight of 128 rows) "
                        "in 2 of 2 layers\n");
    ASSERT_CONTAINS(ex, "    gate_proj, up_proj as one call (a joined weight of 256 rows) in 2 "
                        "of 2 layers\n");
    free(ex);
}

/* Quantized at load: the cpu-x86 int16 tiles, batch tiles and GEMM. */
TEST_IMPL(fuse_tiny_q4_0_same_bits)
{
    tiny_llama t = tiny();
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts), .quant = "q4_0"};
    char *ex = check(&t, &o, 2, 2);
    ASSERT_CONTAINS(ex, "qkv_proj[q4_0]: ");
    ASSERT_CONTAINS(ex, "q_proj, k_proj, v_proj as one call (a joined weight of 128 rows)");
    free(ex);
}

TEST_IMPL(fuse_tiny_q8_0_same_bits)
{
    tiny_llama t = tiny();
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts), .quant = "q8_0"};
    free(check(&t, &o, 2, 2));
}

/* Everything on khub/ref-cpu, quantized at load with it. */
TEST_IMPL(fuse_tiny_ref_cpu_same_bits)
{
    tiny_llama t = tiny();
    const char *r = "khub/ref-cpu";
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts),
                         .attn_impl = r,
                         .quant = r,
                         .norm_impl = r,
                         .act_impl = r,
                         .rotary_impl = r,
                         .linear_impl = r};
    char *ex = check(&t, &o, 2, 2);
    ASSERT_CONTAINS(ex, "qkv_proj[f32]: khub/ref-cpu");
    ASSERT_CONTAINS(ex, "q_proj, k_proj, v_proj as one call");
    free(ex);
    o.quant = "khub/ref-cpu:q8_0";
    free(check(&t, &o, 2, 2));
}

/* Qwen2's q/k/v biases are joined with their rows. */
TEST_IMPL(fuse_tiny_qwen2_biases_same_bits)
{
    tiny_llama t = tiny();
    t.qwen2 = true;
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts)};
    free(check(&t, &o, 2, 2));
    o.quant = "q4_0";
    free(check(&t, &o, 2, 2));
}

/* q 18 rows, k and v 6, gate and up 90: the 4-row tiles of the kernels
 * straddle the joins (rows of q and k in one tile). down's 90 inputs are
 * no whole number of q4_0 blocks, so it stays f32. */
TEST_IMPL(fuse_tiny_odd_rows_same_bits)
{
    tiny_llama t = {.hidden = 64,
                    .ffn = 90,
                    .layers = 2,
                    .heads = 3,
                    .kv_heads = 1,
                    .head_dim = 6,
                    .vocab = 256};
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts)};
    char *ex = check(&t, &o, 2, 2);
    ASSERT_CONTAINS(ex, "q_proj, k_proj, v_proj as one call (a joined weight of 30 rows)");
    ASSERT_CONTAINS(ex, "gate_proj, up_proj as one call (a joined weight of 180 rows)");
    free(ex);
    o.quant = "q4_0";
    free(check(&t, &o, 2, 2));
}

/* Layer 0's q_proj is F16 (its k and v F32): another op, so that layer
 * keeps three calls and layer 1 joins. */
TEST_IMPL(fuse_tiny_mixed_dtypes_join_where_they_can)
{
    tiny_llama t = tiny();
    t.f16_q0 = true;
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts)};
    char *ex = check(&t, &o, 1, 2);
    ASSERT_CONTAINS(ex, "q_proj, k_proj, v_proj as one call (a joined weight of 128 rows) in 1 "
                        "of 2 layers\n");
    free(ex);
}

/* max_batch = the prefill's rows: the joined outputs of the prefill do not
 * fit att and up, so it runs its projections apart; decode steps and the
 * batch's run joined. (Without the size check the prefill writes past
 * both buffers: ASan shows it.) */
TEST_IMPL(fuse_tiny_long_step_runs_apart)
{
    tiny_llama t = tiny();
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts), .max_batch = FC_PREFILL};
    free(check(&t, &o, 2, 2));
    o.quant = "q4_0";
    free(check(&t, &o, 2, 2));
}

/* KHUB_JOIN_PROJ=0 keeps the calls apart; anything else (or unset) joins. */
TEST_IMPL(fuse_env_turns_it_off)
{
    tiny_llama t = tiny();
    const char *dir = tiny_dir(&t);
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts)};
    fc_run off = fc_model_run(dir, &o, false);
    ASSERT_EQ(off.joined_qkv, 0);
    ASSERT_EQ(off.joined_gate_up, 0);
    ASSERT(strstr(off.explain, "as one call") == NULL);
    fc_run_free(&off);
    khub_runtime *rt = NULL;
    khub_model *m = NULL;
    ASSERT_OK(khub_runtime_new(NULL, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    ASSERT_OK(khub_model_load(rt, dir, &o, &m));
    ASSERT_EQ(khub__model_n_joined(m, true), 2);
    ASSERT_EQ(khub__model_n_joined(m, false), 2);
    /* Joined, q/k/v (gate/up) are views of the joined weight's rows. */
    const khub__layer *ly = &m->layers[1];
    const uint8_t *qkv = ly->qkv.w.t.data, *gu = ly->gate_up.w.t.data;
    ASSERT(ly->q.w.t.data == (const void *)qkv && ly->q.w.owned == NULL);
    ASSERT(ly->k.w.t.data == (const void *)(qkv + 64 * 64 * 4));
    ASSERT(ly->v.w.t.data == (const void *)(qkv + 96 * 64 * 4));
    ASSERT(ly->up.w.t.data == (const void *)(gu + 128 * 64 * 4));
    khub_model_free(m);
    khub_runtime_free(rt);
    tiny_llama_rm(dir);
}

#define TEST_LIST(X) \
    X(fuse_tiny_f32_same_bits) \
    X(fuse_tiny_q4_0_same_bits) \
    X(fuse_tiny_q8_0_same_bits) \
    X(fuse_tiny_ref_cpu_same_bits) \
    X(fuse_tiny_qwen2_biases_same_bits) \
    X(fuse_tiny_odd_rows_same_bits) \
    X(fuse_tiny_mixed_dtypes_join_where_they_can) \
    X(fuse_tiny_long_step_runs_apart) \
    X(fuse_env_turns_it_off)
TEST_MAIN(TEST_LIST)
