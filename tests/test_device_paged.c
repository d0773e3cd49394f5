/*
 * test_device_paged.c: the host side of attention on a CUDA device (issue
 * 19 item 2) on the fake driver (tests/fake_cuda), which runs no kernel:
 *
 *   - kernels-src/kv-cache-cuda's paged_attention op: split-K for decode
 *     batches, tiles for prefill batches, its refusals.
 *   - a model placed on the device with a paged KV cache (that plugin's
 *     paged_cache and paged_attention, test/cuda-all for the other roles):
 *     each layer appends K/V and makes one paged_attention call whose first
 *     argument is the device block table, which holds each sequence's
 *     blocks; reserve before layer 0 and KV_FULL with its message before
 *     anything runs; a continuous batch with cancellations gives every
 *     block back (the pool drained); the mixed sides refused; and 40
 *     models in a row, each one's split-K scratch freed with its stream.
 * Numbers are tools/gpu-check.sh's (step 6): nothing here computes.
 *
 * The kv-cache-cuda glue is built as a test plugin (tests/plugins) and
 * loaded with stand-in PTX artifacts (device_fixture.h's
 * load_kv_cache_cuda): the fake driver loads any image.
 */
/* A tiny random Llama with head_dim 64 (what kv-cache-cuda's attention
 * serves), device_fixture.h's model with these sizes. */
#define DEVICE_FIXTURE_DIMS
enum { HID = 128, HEADS = 2, KVH = 1, HD = 64, FFN = 256, VOCAB = 128, LAYERS = 2 };

#include "cuda.h"
#include "device_fixture.h"
#include "executor.h"
#include "khub/khub_batch.h"

/* ======================================================================== */
/* The fake driver and the kernels-src glue                                 */
/* ======================================================================== */

static unsigned long long (*launch_arg0)(long);
static int (*launch_dims)(long, unsigned *);

/* The fake driver (sm_90) with `mem` bytes of device memory, and its
 * launch log. */
static void fake_mem(const char *fail, const char *mem)
{
    fake("12080:90", mem, fail);
    launch_log();
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ASSERT(h != NULL);
    launch_arg0 = (unsigned long long (*)(long))dlsym(h, "khub_fake_cuda_launch_arg0");
    launch_dims = (int (*)(long, unsigned *))dlsym(h, "khub_fake_cuda_launch_dims");
    ASSERT(launch_arg0 && launch_dims);
}

static void fake_paged(const char *fail) { fake_mem(fail, "200000000"); }

/* Launch i had this name, grid and block. */
static void launched(long i, const char *name, unsigned gx, unsigned gy, unsigned gz, unsigned bx)
{
    unsigned d[7]; /* grid, block, shared bytes */
    ASSERT(launch_dims(i, d));
    ASSERT_STR_EQ(launch_name(i), name);
    ASSERT_EQ(d[0], gx);
    ASSERT_EQ(d[1], gy);
    ASSERT_EQ(d[2], gz);
    ASSERT_EQ(d[3], bx);
}

/* A device buffer of n floats (never read: nothing computes). */
static khub_tensor dev_tensor(uint64_t *d, int nd, int64_t *shape, size_t n, int bits)
{
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, n * (size_t)bits / 8, d));
    return (khub_tensor){.data = (void *)(uintptr_t)*d,
                         .device = {KHUB_DEVICE_CUDA, 0},
                         .ndim = nd,
                         .dtype = {KHUB_DL_FLOAT, (uint8_t)bits, 1},
                         .shape = shape};
}

static khub_binding *cuda_op(khub_runtime *rt, uint32_t kind, uint32_t flags, int32_t hd,
                             uint32_t layout)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = kind,
                       .device_type = KHUB_DEVICE_CUDA,
                       .dtype_id = KHUB_DTYPE_ID_F32,
                       .flags = flags,
                       .head_dim = hd,
                       .kv_layout = layout};
    khub_binding *b = NULL;
    if (khub_registry_select(rt, &q, &b) != KHUB_STATUS_OK)
        TEST_FAIL_("no CUDA op: %s", khub_runtime_errmsg(rt));
    return b;
}

/* ======================================================================== */
/* kv-cache-cuda's paged_attention: split-K for decode batches              */
/* ======================================================================== */

typedef struct pa_bench {
    khub_binding *op;
    uint64_t dq, dout, dk, dv, dints;
    int64_t qs[3], ps[4];
    khub_tensor q, out, k, v;
    khub_call_ctx ctx;
    khub_paged_attention_args a;
} pa_bench;

/* total rows of 9 heads of 64 in n_seqs sequences over pools of 8 blocks
 * of 16 tokens (f32 or f16), block tables of `stride` entries. */
static void pa_setup(pa_bench *b, khub_runtime *rt, int32_t total, int32_t n_seqs, int64_t stride,
                     int bits)
{
    memset(b, 0, sizeof *b);
    b->op = cuda_op(rt, KHUB_OP_PAGED_ATTENTION, KHUB_CAP_CAUSAL | KHUB_CAP_GQA, 64,
                    KHUB_KV_LAYOUT_PAGED_HTD);
    b->qs[0] = total, b->qs[1] = 9, b->qs[2] = 64;
    b->ps[0] = 8, b->ps[1] = 3, b->ps[2] = 16, b->ps[3] = 64;
    b->q = dev_tensor(&b->dq, 3, b->qs, (size_t)total * 9 * 64, 32);
    b->out = dev_tensor(&b->dout, 3, b->qs, (size_t)total * 9 * 64, 32);
    b->k = dev_tensor(&b->dk, 4, b->ps, 8 * 3 * 16 * 64, bits);
    b->v = dev_tensor(&b->dv, 4, b->ps, 8 * 3 * 16 * 64, bits);
    /* cu_seqlens_q, q_pos0, kv_lens, seq_rows, then the table: device
     * memory the op never reads on the host */
    ASSERT_OK(khub__cuda_host_mem_alloc(NULL, 0, (size_t)(4 * n_seqs + 1 + n_seqs * stride) * 4,
                                        &b->dints));
    const int32_t *ints = (const int32_t *)(uintptr_t)b->dints;
    b->ctx = (khub_call_ctx){KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CUDA, 0}};
    b->a = (khub_paged_attention_args){KHUB_STRUCT_INIT(khub_paged_attention_args),
                                       .ctx = &b->ctx,
                                       .layout = KHUB_KV_LAYOUT_PAGED_HTD,
                                       .n_seqs = n_seqs,
                                       .q = &b->q,
                                       .out = &b->out,
                                       .k_pool = &b->k,
                                       .v_pool = &b->v,
                                       .cu_seqlens_q = ints,
                                       .q_pos0 = ints + n_seqs + 1,
                                       .kv_lens = ints + 2 * n_seqs + 1,
                                       .seq_rows = ints + 3 * n_seqs + 1,
                                       .block_table = ints + 4 * n_seqs + 1,
                                       .block_table_stride = stride,
                                       .block_size = 16,
                                       .scale = 0.125f,
                                       .causal = 1};
}

static void pa_free(pa_bench *b)
{
    uint64_t bufs[] = {b->dq, b->dout, b->dk, b->dv, b->dints};
    for (int i = 0; i < 5; i++) ASSERT_OK(khub__cuda_host_mem_free(NULL, bufs[i]));
}

TEST_IMPL(paged_attention_split_k_for_decode_batches)
{
    fake_paged(NULL);
    khub_runtime *rt = tp_runtime(1);
    load_kv_cache_cuda(rt);
    pa_bench b;
    /* 4 sequences, one row each, 8 x 16 = 128 keys reachable: one split,
     * written directly; the first argument is the block table */
    pa_setup(&b, rt, 4, 4, 8, 32);
    long i = stat_of("launches");
    if (khub_binding_call(b.op, &b.a) != KHUB_STATUS_OK)
        TEST_FAIL_("paged_attention: %s", khub_runtime_errmsg(rt));
    launched(i, "khub_pa_decode_hd64_f32", 1, 9, 4, 128);
    ASSERT_EQ(launch_arg0(i), (unsigned long long)(uintptr_t)b.a.block_table);
    ASSERT_EQ(stat_of("launches"), i + 1);
    pa_free(&b);
    /* 64 x 16 = 1024 keys reachable: 4 splits, then the merge */
    pa_setup(&b, rt, 4, 4, 64, 32);
    i = stat_of("launches");
    ASSERT_OK(khub_binding_call(b.op, &b.a));
    launched(i, "khub_pa_decode_hd64_f32", 4, 9, 4, 128);
    launched(i + 1, "khub_pa_merge_hd64", 36, 1, 1, 64);
    pa_free(&b);
    /* f16 pools, 16 rows in 2 sequences (8 each on average): still decode */
    pa_setup(&b, rt, 16, 2, 8, 16);
    i = stat_of("launches");
    ASSERT_OK(khub_binding_call(b.op, &b.a));
    launched(i, "khub_pa_decode_hd64_f16", 1, 9, 16, 128);
    pa_free(&b);
    /* 40 rows in 2 sequences: a prefill, the tiles, grid.z the sequence */
    pa_setup(&b, rt, 40, 2, 8, 32);
    i = stat_of("launches");
    ASSERT_OK(khub_binding_call(b.op, &b.a));
    launched(i, "khub_pa_hd64_f32", 1, 9, 2, 64);
    ASSERT_EQ(launch_arg0(i), (unsigned long long)(uintptr_t)b.a.block_table);
    ASSERT_EQ(stat_of("launches"), i + 1);
    pa_free(&b);
    khub_runtime_free(rt);
}

/* The split-K partials' scratch is allocated once per stream at the
 * plan's budget (16 MiB) and never grows: a bigger decode batch on the same
 * stream neither allocates nor synchronises, so a capture of the stream
 * holds (a growth would wait for the stream, which breaks the capture). */
TEST_IMPL(paged_attention_scratch_fixed_under_capture)
{
    fake_paged(NULL);
    khub_runtime *rt = tp_runtime(1);
    load_kv_cache_cuda(rt);
    void *stream = NULL, *graph = NULL;
    ASSERT_OK(khub__cuda_stream_new(rt, 0, &stream));
    long base = stat_of("allocs_live");
    pa_bench small, big;
    pa_setup(&small, rt, 4, 4, 64, 32); /* 4 splits: 4 x 9 x 4 x 66 floats */
    pa_setup(&big, rt, 64, 8, 64, 32);  /* 64 rows, 4 splits: 16x the partials */
    small.ctx.stream = big.ctx.stream = stream;
    long allocs = stat_of("allocs_live"), bytes = stat_of("bytes_live"),
         syncs = stat_of("stream_syncs"), broken = stat_of("graph_captures_invalidated");
    ASSERT_OK(khub__cuda_capture_begin(stream));
    ASSERT_OK(khub_binding_call(small.op, &small.a));
    ASSERT_EQ(stat_of("allocs_live"), allocs + 1);
    ASSERT_EQ(stat_of("bytes_live"), bytes + (16l << 20));
    ASSERT_OK(khub_binding_call(big.op, &big.a));
    ASSERT_OK(khub_binding_call(small.op, &small.a));
    ASSERT_EQ(stat_of("allocs_live"), allocs + 1);
    ASSERT_EQ(stat_of("stream_syncs"), syncs);
    ASSERT_OK(khub__cuda_capture_end(stream, &graph));
    ASSERT(graph != NULL);
    ASSERT_EQ(stat_of("graph_captures_invalidated"), broken);
    khub__cuda_graph_free(graph);
    pa_free(&small);
    pa_free(&big);
    ASSERT_OK(khub__cuda_stream_free(rt, 0, stream));
    khub_runtime_free(rt);
    ASSERT_EQ(stat_of("allocs_live"), base); /* the scratch went with the plugin */
}

TEST_IMPL(paged_attention_refusals)
{
    fake_paged(NULL);
    khub_runtime *rt = tp_runtime(1);
    load_kv_cache_cuda(rt);
    pa_bench b;
    pa_setup(&b, rt, 4, 4, 8, 32);
    long n = stat_of("launches");
    b.a.ctx = NULL;
    ASSERT_STATUS(khub_binding_call(b.op, &b.a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "paged_attention (cuda): ctx must name the CUDA device and the stream");
    b.a.ctx = &b.ctx;
    b.a.layout = KHUB_KV_LAYOUT_PAGED_HTD_Q8;
    ASSERT_STATUS(khub_binding_call(b.op, &b.a), KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "paged_attention (cuda): KV layout 2 is not served here");
    b.a.layout = KHUB_KV_LAYOUT_PAGED_HTD;
    b.a.block_size = 8; /* the pools' blocks hold 16 */
    ASSERT_STATUS(khub_binding_call(b.op, &b.a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "paged_attention (cuda): k_pool/v_pool must be compact f32 or f16 CUDA "
                    "tensors [n_blocks, n_kv_heads (a divisor of n_heads), block_size, "
                    "head_dim], alike");
    ASSERT_EQ(stat_of("launches"), n);
    pa_free(&b);
    khub_runtime_free(rt);
}

/* ======================================================================== */
/* A model placed on the device with a paged cache                          */
/* ======================================================================== */

/* The tiny model on cuda:0 with a paged cache of n_blocks blocks of 4
 * tokens (64 positions per sequence, 4 sequences), test/cuda-all for the
 * other roles, and kv-cache-cuda (its paged cache and attention) unless
 * `no_pair`. */
static khub_status load_paged(fixture *f, int32_t n_blocks, bool no_pair)
{
    memset(f, 0, sizeof *f);
    f->rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(f->rt));
    tp_load(f->rt, "cuda_all");
    if (!no_pair) load_kv_cache_cuda(f->rt);
    f->dir = tiny_model();
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts),
                         .device = {KHUB_DEVICE_CUDA, 0},
                         .cache_impl = "khub/ref-cpu:paged_cache",
                         .max_context = 64,
                         .max_seqs = 4,
                         .max_batch = 32,
                         .kv_block_size = 4,
                         .kv_num_blocks = n_blocks};
    khub_status st = khub_model_load(f->rt, f->dir, &o, &f->m);
    if (st != KHUB_STATUS_OK) fprintf(stderr, "  load: %s\n", khub_runtime_errmsg(f->rt));
    return st;
}

/* One step of 5 tokens: each layer's launches in forward order, the K/V
 * append into sequence 0's blocks and one paged_attention call reading the
 * device block table, which holds blocks 0 and 1 for the 5 positions. */
TEST_IMPL(device_paged_launches_per_layer)
{
    fake_paged(NULL);
    fixture f;
    ASSERT_OK(load_paged(&f, 32, false));
    const char *ex = khub_model_explain(f.m);
    ASSERT_CONTAINS(ex, " roles on the device, 0 on the CPU\n");
    ASSERT_CONTAINS(ex, "  kv_cache[f32]: cuda:0, kernels-community/kv-cache-cuda 1.0.0 :: "
                        "paged_cache\n");
    ASSERT_CONTAINS(ex, "  paged_attention[f32]: cuda:0, kernels-community/kv-cache-cuda 1.0.0 "
                        ":: paged_attention\n");
    ASSERT_CONTAINS(ex, "CUDA graphs: yes (decode steps: captured each step, instantiated once "
                        "per batch shape, then updated in place with cuGraphExecUpdate; prefill "
                        "runs plain launches; the paged KV cache's blocks are reserved and its "
                        "block table copied on the model's stream before each step, outside the "
                        "graph)\n");
    /* its paged attention's split-K partials, 16 MiB kept for the stream */
    ASSERT_CONTAINS(ex, " MiB, the ops' own scratch 16.0 MiB (kernels-community/kv-cache-cuda "
                        "1.0.0 :: paged_attention 16.0 MiB, kept for the model's stream) = ");
    long i = stat_of("launches");
    float logits[VOCAB];
    int32_t ids[] = {1, 5, 9, 13, 17};
    ASSERT_OK(khub_model_logits(f.m, ids, 5, logits));
    static const char *const layer[] = {
        "khub_test_norm",   "khub_test_linear", "khub_test_linear",   "khub_test_linear",
        "khub_test_rotary", "khub_test_rotary", "khub_pkv_write_f32", "khub_pa_decode_hd64_f32",
        "khub_test_linear", "khub_test_norm",   "khub_test_linear",   "khub_test_linear",
        "khub_test_act",    "khub_test_linear"};
    unsigned long long table = 0;
    for (int L = 0; L < LAYERS; L++)
        for (size_t k = 0; k < sizeof layer / sizeof layer[0]; k++, i++) {
            ASSERT_STR_EQ(launch_name(i), layer[k]);
            if (k == 6) table = launch_arg0(i); /* sequence 0's row */
            if (k == 7) ASSERT_EQ(launch_arg0(i), table);
        }
    launched(i - 7, "khub_pa_decode_hd64_f32", 1, HEADS, 5, 128); /* 16 x 4 keys: one split */
    ASSERT_STR_EQ(launch_name(i++), "khub_test_norm");
    ASSERT_STR_EQ(launch_name(i++), "khub_test_linear");
    ASSERT_EQ(stat_of("launches"), i);
    const int32_t *row = (const int32_t *)(uintptr_t)table; /* the fake's device memory */
    ASSERT_EQ(row[0], 0);
    ASSERT_EQ(row[1], 1);
    ASSERT_EQ(row[2], -1);
    /* khub_model_logits resets sequence 0 first: its blocks went back to
     * the pool and the same two, lowest first, are taken again */
    ASSERT_OK(khub_model_logits(f.m, ids, 5, logits));
    ASSERT_EQ(row[0], 0);
    ASSERT_EQ(row[1], 1);
    ASSERT_EQ(row[2], -1);
    khub_model_free(f.m);
    f.m = NULL;
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    unload(&f);
}

/* A pool of 2 blocks (8 tokens) and a 10-token prompt: KV_FULL with the
 * pool's numbers, before any launch of the step. */
TEST_IMPL(device_paged_kv_full)
{
    fake_paged(NULL);
    fixture f;
    ASSERT_OK(load_paged(&f, 2, false));
    long n = stat_of("launches");
    float logits[VOCAB];
    int32_t ids[10] = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37};
    ASSERT_STATUS(khub_model_logits(f.m, ids, 10, logits), KHUB_STATUS_KV_FULL);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": cuda:0: device kv_cache reserve failed in kernels-community/kv-cache-cuda "
                    "1.0.0 :: paged_cache: paged_cache (cuda) reserve: sequence 0 needs 3 more "
                    "blocks of 4 tokens for 10 tokens, the pool has 2 of 2 free (release "
                    "finished sequences, or raise --num-blocks or the KV memory budget)");
    ASSERT_EQ(stat_of("launches"), n);
    ASSERT_OK(khub_model_logits(f.m, ids, 8, logits)); /* 8 tokens fit */
    unload(&f);
}

/* A continuous batch of 6 requests over 4 sequence slots and a pool of 12
 * blocks (48 tokens, less than the slots' 256): the scheduler's budget asks
 * the device pool, requests wait, two are cancelled mid-run, and at the
 * end every block is back (the pool drained). */
TEST_IMPL(device_paged_batch_drains_the_pool)
{
    fake_paged(NULL);
    fixture f;
    ASSERT_OK(load_paged(&f, 12, false));
    ASSERT_EQ(khub__kv_capacity_tokens(f.m), 48);
    khub_generate_opts go = {KHUB_STRUCT_INIT(khub_generate_opts), .max_new_tokens = 6,
                             .ignore_eos = 1};
    int32_t ids[6][8];
    khub_batch_config cfg = {KHUB_STRUCT_INIT(khub_batch_config), .max_batch_tokens = 16};
    khub_batch *b = NULL;
    ASSERT_OK(khub_batch_new(f.m, &cfg, &b));
    uint64_t id[6];
    for (int r = 0; r < 6; r++) {
        for (int k = 0; k < 8; k++) ids[r][k] = 3 + (r * 7 + k * 5) % (VOCAB - 3);
        khub_batch_request q = {KHUB_STRUCT_INIT(khub_batch_request), .tokens = ids[r],
                                .n_tokens = 3 + r, .opts = &go};
        ASSERT_OK(khub_batch_submit(b, &q, &id[r]));
    }
    int64_t pending = 0;
    ASSERT_OK(khub_batch_step(b, &pending));
    ASSERT_OK(khub_batch_step(b, &pending));
    ASSERT(khub__kv_free_tokens(f.m) < 48); /* blocks are held */
    ASSERT_OK(khub_batch_cancel(b, id[0]));
    ASSERT_OK(khub_batch_cancel(b, id[5]));
    for (int s = 0; s < 200 && pending > 0; s++) ASSERT_OK(khub_batch_step(b, &pending));
    ASSERT_EQ(pending, 0);
    khub_batch_stats st = {KHUB_APP_INIT(khub_batch_stats)};
    ASSERT_OK(khub_batch_stats_get(b, &st));
    ASSERT_EQ(st.kv_tokens_used, 0);
    khub_batch_free(b);
    ASSERT_EQ(khub__kv_free_tokens(f.m), 48); /* every block back in the device pool */
    unload(&f);
}

/* The paged attention's 16 MiB of split-K partials (caps.stream_bytes)
 * count in the fit check too: with 10 MB of device memory the model, whose
 * own blocks take under 1 MiB, does not fit, and the message says why. */
TEST_IMPL(device_paged_fit_counts_the_ops_scratch)
{
    fake_mem(NULL, "10000000");
    fixture f;
    ASSERT_STATUS(load_paged(&f, 32, false), KHUB_STATUS_NOMEM);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    " MiB, the ops' own scratch 16.0 MiB) and 9.5 MiB of 9.5 MiB are free; lower "
                    "max_context or max_seqs, quantize the weights, or use another device");
    ASSERT_EQ(stat_of("allocs_live"), 0);
    unload(&f);
}

/* The tiny model with a context of 512 keys (block tables of 128 blocks of
 * 4): a decode call's split-K plan has 2 splits, so each paged_attention
 * call needs the partials' scratch of its stream. */
static khub_model *long_context_model(khub_runtime *rt, const char *dir)
{
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts),
                         .device = {KHUB_DEVICE_CUDA, 0},
                         .cache_impl = "khub/ref-cpu:paged_cache",
                         .max_context = 512,
                         .max_seqs = 1,
                         .max_batch = 8,
                         .kv_block_size = 4,
                         .kv_num_blocks = 8};
    khub_model *m = NULL;
    if (khub_model_load(rt, dir, &o, &m) != KHUB_STATUS_OK)
        TEST_FAIL_("loading the model: %s", khub_runtime_errmsg(rt));
    return m;
}

/* One step of 3 tokens, which runs the split-K kernels in every layer: the
 * partials' buffer (the merge's first argument) of each layer's call. */
static unsigned long long split_k_step(khub_model *m)
{
    long i = stat_of("launches");
    float logits[VOCAB];
    int32_t ids[] = {1, 5, 9};
    if (khub_model_logits(m, ids, 3, logits) != KHUB_STATUS_OK)
        TEST_FAIL_("a step: %s", khub_runtime_errmsg(khub_model_runtime(m)));
    unsigned long long part = 0;
    int merges = 0;
    for (long n = i; n < stat_of("launches"); n++) {
        if (strcmp(launch_name(n), "khub_pa_merge_hd64") != 0) continue;
        launched(n - 1, "khub_pa_decode_hd64_f32", 2, HEADS, 3, 128);
        ASSERT(merges == 0 || launch_arg0(n) == part); /* one buffer per stream */
        part = launch_arg0(n);
        merges++;
    }
    ASSERT_EQ(merges, LAYERS);
    return part;
}

/* 40 models placed, given a split-K step and freed in a row in one runtime
 * (issue 19): each model's stream ends with it and kv-cache-cuda frees its
 * scratch for that stream (stream_end), so every one runs though the
 * plugin keeps scratch for at most 16 live streams, and device memory does
 * not grow. A model alive throughout keeps its own buffer, never given to
 * another model's stream. */
TEST_IMPL(device_paged_scratch_freed_with_each_model)
{
    fake_paged(NULL);
    khub_runtime *rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(rt));
    tp_load(rt, "cuda_all");
    load_kv_cache_cuda(rt);
    const char *dir = tiny_model();
    khub_model *kept = long_context_model(rt, dir);
    unsigned long long kept_part = split_k_step(kept);
    long allocs = stat_of("allocs_live"), bytes = stat_of("bytes_live");
    for (int n = 0; n < 40; n++) {
        khub_model *m = long_context_model(rt, dir);
        ASSERT(split_k_step(m) != kept_part);
        khub_model_free(m);
        ASSERT_EQ(stat_of("allocs_live"), allocs);
        ASSERT_EQ(stat_of("bytes_live"), bytes);
        ASSERT_EQ(stat_of("streams_live"), 1);
    }
    ASSERT_EQ(split_k_step(kept), kept_part);
    ASSERT_EQ(stat_of("allocs_live"), allocs);
    khub_model_free(kept);
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    khub_runtime_free(rt);
    tiny_rm(dir);
}

/* Without kv-cache-cuda the paged cache and paged attention stay on the
 * CPU: the device pass refuses them, saying where each is. */
TEST_IMPL(device_paged_refuses_mixed_sides)
{
    fake_paged(NULL);
    fixture f;
    ASSERT_OK(load_paged(&f, 32, true));
    float logits[VOCAB];
    int32_t ids[] = {1, 5};
    ASSERT_STATUS(khub_model_logits(f.m, ids, 2, logits), KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": cuda:0: a paged KV cache runs on the device only with both the paged "
                    "cache and paged attention as CUDA ops (here the cache is on the CPU and "
                    "paged attention on the CPU); load kernels-community/kv-cache-cuda, or load "
                    "the model with a dense cache");
    unload(&f);
}

#define TEST_LIST(X) \
    X(paged_attention_split_k_for_decode_batches) \
    X(paged_attention_scratch_fixed_under_capture) \
    X(paged_attention_refusals) \
    X(device_paged_launches_per_layer) \
    X(device_paged_kv_full) \
    X(device_paged_batch_drains_the_pool) \
    X(device_paged_scratch_freed_with_each_model) \
    X(device_paged_fit_counts_the_ops_scratch) \
    X(device_paged_refuses_mixed_sides)
TEST_MAIN(TEST_LIST)
