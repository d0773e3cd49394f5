/*
 * test_graphs_paged.c: CUDA graphs for the decode step of a model whose KV
 * cache is paged in device memory (issue 19 item 3 with item 2's paged
 * cache: runtime/executor/forward_graph.c, kernels-src/kv-cache-cuda), on
 * the fake driver (tests/fake_cuda).
 *
 * The fake runs host bodies of the kernels when their launches run (at once
 * or inside a graph launch): khub-test/cuda-all's (fake_kernels.h) for the
 * dense roles and, here, kv-cache-cuda's append and split-K decode
 * attention, which read the pools, the block table and the step's int32
 * arrays from the fake's device memory at that moment. A graph that read a
 * stale block table or stale sequence lengths therefore gives other logits
 * than plain launches.
 *
 * The steps (graph_steps.h), in blocks of 4 tokens: a prefill of 3 and 2
 * tokens into sequences 0 and 1 (plain launches; 5 rows of 2 sequences go
 * through the decode kernel), then decode steps of 2, 2, 2, 1, 1 and 2
 * sequences. Sequence 0 takes a new block at steps 2 and 6 (positions 4
 * and 8), sequence 1 at step 3 (position 4): reserved before the step and
 * seen by its graph.
 *
 * The kv-cache-cuda glue is built as a test plugin and loaded with
 * stand-in PTX artifacts (device_fixture.h's load_kv_cache_cuda).
 */
#define DEVICE_FIXTURE_DIMS
enum { HID = 128, HEADS = 2, KVH = 1, HD = 64, FFN = 256, VOCAB = 128, LAYERS = 2 };

#include "cuda.h"
#include "device_fixture.h"
#include "executor.h"
#include "placement.h"

#include "fake_kernels.h"
#include "graph_steps.h"

/* ======================================================================== */
/* Host bodies of kv-cache-cuda's kernels (argument lists: paged_attn.cu)   */
/* ======================================================================== */

enum { MAX_KEYS = 64 }; /* max_context */

static const int32_t *I32(u64 p) { return (const int32_t *)(uintptr_t)p; }
static float F32(u64 u)
{
    uint32_t b = (uint32_t)u;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static int odd_launches; /* paged launches the bodies below do not model */

/* row, k, v, kp, vp, pos, n, H, D, bs (khub_pkv_write_f32): n tokens into
 * the blocks the sequence's table row names. */
static void k_pkv_write(const u64 *p)
{
    const int32_t *row = I32(p[0]);
    const float *k = F(p[1]), *v = F(p[2]);
    float *kp = F(p[3]), *vp = F(p[4]);
    int64_t pos = (int64_t)p[5], n = (int64_t)p[6], H = (int32_t)p[7], D = (int32_t)p[8],
            bs = (int32_t)p[9];
    for (int64_t t = 0; t < n; t++) {
        int64_t blk = row[(pos + t) / bs], slot = (pos + t) % bs;
        if (blk < 0) {
            odd_launches++;
            return;
        }
        for (int64_t i = 0; i < H * D; i++) {
            int64_t at = ((blk * H + i / D) * bs + slot) * D + i % D;
            kp[at] = k[t * H * D + i];
            vp[at] = v[t * H * D + i];
        }
    }
}

/* table, q, kp, vp, out, cu_seqlens_q, q_pos0, kv_lens, seq_rows, stride,
 * n_seqs, nh, nkvh, bs, n_blocks, scale, softcap, causal, window, part,
 * nsplit, chunk (khub_pa_decode_hd64_f32) with one split (the 64 keys a
 * sequence reaches here make one): each query row's causal attention over
 * the keys it sees, through the device block table. A key in no block (a
 * stale table) is left out, so it shows in the logits. */
static void k_pa_decode(const u64 *p)
{
    const int32_t *table = I32(p[0]), *cu = I32(p[5]), *q0 = I32(p[6]), *kl = I32(p[7]),
                  *rows = I32(p[8]);
    const float *q = F(p[1]), *kp = F(p[2]), *vp = F(p[3]);
    float *out = F(p[4]);
    int64_t stride = (int64_t)p[9], n_seqs = (int32_t)p[10], nh = (int32_t)p[11],
            nkvh = (int32_t)p[12], bs = (int32_t)p[13], n_blocks = (int32_t)p[14];
    if ((int32_t)p[20] != 1 || (int64_t)p[18] != 0 || F32(p[16]) != 0.0f || !p[17]) {
        odd_launches++;
        return;
    }
    for (int64_t s = 0; s < n_seqs; s++)
        for (int64_t r = cu[s]; r < cu[s + 1]; r++) {
            int64_t pos = q0[s] + (r - cu[s]), upto = pos + 1 < kl[s] ? pos + 1 : kl[s];
            const int32_t *row = table + (int64_t)rows[s] * stride;
            if (upto > MAX_KEYS) {
                odd_launches++;
                return;
            }
            for (int64_t h = 0; h < nh; h++) {
                const float *qi = q + (r * nh + h) * HD, *key[MAX_KEYS] = {NULL}, *val[MAX_KEYS];
                float sc[MAX_KEYS], mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < upto; j++) {
                    int64_t blk = row[j / bs], g = h / (nh / nkvh);
                    if (blk < 0 || blk >= n_blocks) continue;
                    key[j] = kp + ((blk * nkvh + g) * bs + j % bs) * HD;
                    val[j] = vp + ((blk * nkvh + g) * bs + j % bs) * HD;
                    float d = 0;
                    for (int e = 0; e < HD; e++) d += qi[e] * key[j][e];
                    sc[j] = d * F32(p[15]);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (int64_t j = 0; j < upto; j++)
                    if (key[j]) sum += sc[j] = expf(sc[j] - mx);
                float *o = out + (r * nh + h) * HD;
                for (int e = 0; e < HD; e++) {
                    float acc = 0;
                    for (int64_t j = 0; j < upto; j++)
                        if (key[j]) acc += sc[j] * val[j][e];
                    o[e] = acc / sum;
                }
            }
        }
}

static void paged_kernels(void)
{
    computing_kernels();
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*sized)(const char *, const char *, void (*)(const u64 *)) =
        h ? (int (*)(const char *, const char *, void (*)(const u64 *)))dlsym(
                h, "khub_fake_cuda_kernel_sized")
          : NULL;
    ASSERT(sized != NULL);
    ASSERT_EQ(sized("khub_pkv_write_f32", "8888888444", k_pkv_write), 0);
    ASSERT_EQ(sized("khub_pa_decode_hd64_f32", "8888888888444444448844", k_pa_decode), 0);
}

/* ======================================================================== */
/* Loading                                                                  */
/* ======================================================================== */

/* The tiny model on cuda:0 with a paged cache of 32 blocks of 4 tokens (64
 * positions, 2 sequences), khub-test/cuda-all for the other roles, graphs on
 * or off (KHUB_CUDA_GRAPHS=0), the same random weights every time
 * (tiny_llama.h seeds each model alike). With as_1_4 kv-cache-cuda is
 * stamped ABI 1.4 before the model binds it, as a build of it for 1.4 would
 * be (it cannot be built so: it reads 1.5 fields): the host then sends it
 * 1.4 args and a config without ctx. */
static void load_paged(fixture *f, bool graphs, bool as_1_4)
{
    if (graphs)
        unsetenv("KHUB_CUDA_GRAPHS");
    else
        setenv("KHUB_CUDA_GRAPHS", "0", 1);
    memset(f, 0, sizeof *f);
    f->rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(f->rt));
    tp_load(f->rt, "cuda_all");
    khub_plugin *p = load_kv_cache_cuda(f->rt);
    if (as_1_4) p->abi_minor = 4;
    f->dir = tiny_model();
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts),
                         .device = cuda0,
                         .cache_impl = "khub/ref-cpu:paged_cache",
                         .max_context = MAX_KEYS,
                         .max_seqs = 2,
                         .max_batch = 16,
                         .kv_block_size = 4,
                         .kv_num_blocks = 32};
    if (khub_model_load(f->rt, f->dir, &o, &f->m) != KHUB_STATUS_OK)
        TEST_FAIL_("loading the model: %s", khub_runtime_errmsg(f->rt));
}

/* Sequence seq's row of the device block table (the fake's device memory is
 * host memory). */
static const int32_t *table_row(khub_model *m, int seq)
{
    khub__place *pl = m->place;
    khub_kv_paged_view pv = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    ASSERT_OK(pl->dkv->paged_view(pl->dkv_state, pl->dcache, 0, &pv));
    return pv.block_table + (int64_t)seq * pv.block_table_stride;
}

/* ======================================================================== */
/* The steps                                                                */
/* ======================================================================== */

/* Each sequence's first 3 block-table entries after each step. */
static void record_rows(khub_model *m, run *out, int step)
{
    for (int q = 0; q < 2; q++) memcpy(out->rows[step][q], table_row(m, q), 3 * sizeof(int32_t));
}

static void run_paged(khub_model *m, run *out) { run_steps(m, out, N_STEPS, record_rows); }

static void assert_freed(fixture *f)
{
    khub_model_free(f->m);
    f->m = NULL;
    ASSERT_EQ(stat_of("graphs_live"), 0);
    ASSERT_EQ(stat_of("graph_execs_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    unload(f);
}

/* ======================================================================== */
/* Graphs on with a paged device cache                                      */
/* ======================================================================== */

/* Graphs on and off: the same kernels and the same logits bit for bit each
 * step, though blocks are taken mid-run (steps 2, 3 and 6) and the batch
 * shape changes (steps 4 and 6: instantiated again); every reserve's copy
 * on the model's stream, none on the legacy one. */
TEST_IMPL(graphs_paged_same_logits_as_plain)
{
    fake("12080:90", "100000000", NULL);
    paged_kernels();
    static run plain, graphed;
    fixture f;
    load_paged(&f, false, false);
    ASSERT_CONTAINS(khub_model_explain(f.m), "CUDA graphs: no (KHUB_CUDA_GRAPHS=0)\n");
    run_paged(f.m, &plain);
    ASSERT_EQ(stat_of("graph_captures"), 0);
    assert_freed(&f);
    load_paged(&f, true, false);
    ASSERT_CONTAINS(khub_model_explain(f.m),
                    "CUDA graphs: yes (decode steps: captured each step, instantiated once per "
                    "batch shape, then updated in place with cuGraphExecUpdate; prefill runs "
                    "plain launches; the paged KV cache's blocks are reserved and its block "
                    "table copied on the model's stream before each step, outside the graph)\n");
    run_paged(f.m, &graphed);
    static const long want[N_STEPS][4] = {{0, 0, 0, 0}, {1, 1, 0, 1}, {1, 0, 1, 1}, {1, 0, 1, 1},
                                          {1, 1, 0, 1}, {1, 0, 1, 1}, {1, 1, 0, 1}};
    for (int s = 0; s < N_STEPS; s++) {
        ASSERT_EQ(graphed.step[s].captures, want[s][0]);
        ASSERT_EQ(graphed.step[s].instantiations, want[s][1]);
        ASSERT_EQ(graphed.step[s].updates, want[s][2]);
        ASSERT_EQ(graphed.step[s].graph_launches, want[s][3]);
        ASSERT_EQ(graphed.step[s].legacy_copies, 0);
        ASSERT_EQ(graphed.step[s].launches, plain.step[s].launches);
        for (long i = 0; i < plain.step[s].launches; i++)
            ASSERT_STR_EQ(launch_name(graphed.step[s].first_launch + i),
                          launch_name(plain.step[s].first_launch + i));
        ASSERT_EQ(memcmp(graphed.logits[s], plain.logits[s],
                         (size_t)step_seqs[s] * VOCAB * sizeof(float)),
                  0);
        ASSERT_EQ(memcmp(graphed.rows[s], plain.rows[s], sizeof plain.rows[s]), 0);
    }
    ASSERT_EQ(odd_launches, 0);
    ASSERT(f.m->place->graph.on);
    /* Blocks taken mid-run, lowest free id first: sequence 0 holds 0, 2, 4
     * (positions 0-3, 4-7, 8), sequence 1 holds 1, 3. */
    ASSERT_EQ(graphed.rows[1][0][1], -1);
    ASSERT_EQ(graphed.rows[2][0][1], 2);
    ASSERT_EQ(graphed.rows[2][1][1], -1);
    ASSERT_EQ(graphed.rows[3][1][1], 3);
    ASSERT_EQ(graphed.rows[5][0][2], -1);
    ASSERT_EQ(graphed.rows[6][0][2], 4);
    /* The logits are computed: they move from step to step and are finite. */
    ASSERT(memcmp(plain.logits[1][0], plain.logits[2][0], VOCAB * sizeof(float)) != 0);
    ASSERT(memcmp(plain.logits[4][0], plain.logits[5][0], VOCAB * sizeof(float)) != 0);
    for (int i = 0; i < VOCAB; i++) ASSERT(isfinite(plain.logits[6][1][i]));
    assert_freed(&f);
}

/* A cache of ABI 1.4 gets no stream: it appends, reserves and releases on
 * the legacy stream (the copies_legacy count shows them), so graphs stay
 * off, said why; it still computes what the 1.5 cache does. */
TEST_IMPL(graphs_off_for_a_paged_cache_of_abi_1_4)
{
    fake("12080:90", "100000000", NULL);
    paged_kernels();
    static run now, old;
    fixture f;
    load_paged(&f, true, false);
    run_paged(f.m, &now);
    assert_freed(&f);
    long captures = stat_of("graph_captures");
    load_paged(&f, true, true);
    ASSERT_CONTAINS(khub_model_explain(f.m),
                    "CUDA graphs: no (the paged device KV cache kernels-community/kv-cache-cuda "
                    "1.0.0 :: paged_cache targets ABI 1.4: it appends, reserves and releases "
                    "blocks on the legacy default stream, which a capture cannot hold (1.5 gives "
                    "the cache the model's stream))\n");
    run_paged(f.m, &old);
    ASSERT_EQ(stat_of("graph_captures"), captures);
    ASSERT(old.step[2].legacy_copies > 0); /* sequence 0's new block */
    ASSERT(old.step[3].legacy_copies > 0); /* sequence 1's */
    for (int s = 0; s < N_STEPS; s++)
        ASSERT_EQ(
            memcmp(old.logits[s], now.logits[s], (size_t)step_seqs[s] * VOCAB * sizeof(float)), 0);
    ASSERT_EQ(odd_launches, 0);
    assert_freed(&f);
}

/* ======================================================================== */
/* The cache's own copies under another stream's capture                    */
/* ======================================================================== */

/* A paged cache given a stream (the config's ctx) reserves and releases on
 * it, so a capture in progress on another stream (another model's decode
 * step) holds; without one the copy goes to the legacy stream, which the
 * driver refuses during any capture and which breaks that capture. */
TEST_IMPL(paged_reserve_on_its_stream_keeps_another_capture)
{
    fake("12080:90", "100000000", NULL);
    khub_runtime *rt = tp_runtime(1);
    load_kv_cache_cuda(rt);
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_KV_CACHE,
                       .device_type = KHUB_DEVICE_CUDA, .dtype_id = KHUB_DTYPE_ID_F32,
                       .kv_layout = KHUB_KV_LAYOUT_PAGED_HTD};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    void *state = NULL;
    const khub_kv_cache_methods *kv = khub_binding_acquire(b, &state)->methods;
    void *mine = NULL, *other = NULL, *graph = NULL;
    ASSERT_OK(khub__cuda_stream_new(rt, 0, &mine));
    ASSERT_OK(khub__cuda_stream_new(rt, 0, &other));
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CUDA, 0},
                         .stream = mine};
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 2,
                                .n_kv_heads = 1,
                                .head_dim = HD,
                                .n_seqs = 2,
                                .max_tokens = 64,
                                .dtype = KHUB_DTYPE_F32,
                                .block_size = 4,
                                .ctx = &ctx};
    khub_kv_cache *c = NULL, *legacy = NULL;
    ASSERT_OK(kv->create(state, &cfg, &c));
    cfg.ctx = NULL;
    ASSERT_OK(kv->create(state, &cfg, &legacy));
    long legacy_copies = stat_of("copies_legacy"), broken = stat_of("graph_captures_invalidated");
    ASSERT_OK(khub__cuda_capture_begin(other));
    ASSERT_OK(kv->reserve(state, c, 1, 9)); /* 3 blocks */
    ASSERT_OK(kv->release(state, c, 1));
    ASSERT_OK(kv->reserve(state, c, 0, 5)); /* 2 blocks */
    ASSERT_EQ(stat_of("copies_legacy"), legacy_copies);
    ASSERT_OK(khub__cuda_capture_end(other, &graph));
    ASSERT(graph != NULL);
    ASSERT_EQ(stat_of("graph_captures_invalidated"), broken);
    khub__cuda_graph_free(graph);
    khub_kv_paged_view pv = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    ASSERT_OK(kv->paged_view(state, c, 0, &pv));
    ASSERT_EQ(pv.block_table[0], 0); /* on the device table, lowest ids first */
    ASSERT_EQ(pv.block_table[1], 1);
    ASSERT_EQ(pv.block_table[2], -1);
    ASSERT_EQ(pv.block_table[pv.block_table_stride], -1); /* sequence 1's, released */
    /* The cache without a stream: refused by the capture, which it breaks. */
    ASSERT_OK(khub__cuda_capture_begin(other));
    khub__plugin_msg_clear();
    ASSERT_STATUS(kv->reserve(state, legacy, 0, 5), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "cuMemcpyHtoDAsync failed: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (906)");
    ASSERT_EQ(stat_of("copies_legacy"), legacy_copies + 1);
    ASSERT_STATUS(khub__cuda_capture_end(other, &graph), KHUB_STATUS_CUDA);
    ASSERT_EQ(stat_of("graph_captures_invalidated"), broken + 1);
    kv->destroy(state, c);
    kv->destroy(state, legacy);
    khub_binding_release(b);
    ASSERT_OK(khub__cuda_stream_free(rt, 0, mine));
    ASSERT_OK(khub__cuda_stream_free(rt, 0, other));
    khub_runtime_free(rt);
}

/* A config's ctx that does not name a CUDA device is refused. */
TEST_IMPL(paged_cache_refuses_a_ctx_off_the_device)
{
    fake("12080:90", "100000000", NULL);
    khub_runtime *rt = tp_runtime(1);
    load_kv_cache_cuda(rt);
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_KV_CACHE,
                       .device_type = KHUB_DEVICE_CUDA, .dtype_id = KHUB_DTYPE_ID_F32,
                       .kv_layout = KHUB_KV_LAYOUT_PAGED_HTD};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    void *state = NULL;
    const khub_kv_cache_methods *kv = khub_binding_acquire(b, &state)->methods;
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CPU, 0}};
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 1,
                                .n_kv_heads = 1,
                                .head_dim = HD,
                                .n_seqs = 1,
                                .max_tokens = 8,
                                .dtype = KHUB_DTYPE_F32,
                                .ctx = &ctx};
    khub_kv_cache *c = NULL;
    long allocs = stat_of("allocs_live");
    khub__plugin_msg_clear();
    ASSERT_STATUS(kv->create(state, &cfg, &c), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "paged_cache (cuda) create: ctx must name the CUDA device and the stream");
    ASSERT(c == NULL);
    ASSERT_EQ(stat_of("allocs_live"), allocs);
    khub_binding_release(b);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(graphs_paged_same_logits_as_plain) \
    X(graphs_off_for_a_paged_cache_of_abi_1_4) \
    X(paged_reserve_on_its_stream_keeps_another_capture) \
    X(paged_cache_refuses_a_ctx_off_the_device)
TEST_MAIN(TEST_LIST)
