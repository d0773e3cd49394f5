/*
 * test_cuda_graphs.c: the decode step of a placed model as a CUDA graph
 * (runtime/executor/forward_graph.c, issue 19 item 3) and the fake
 * driver's graphs under it (tests/fake_cuda/fake_graph.c), without a GPU.
 *
 * khub-test/cuda-all serves every role on the device. Its kernels are
 * given host bodies here (khub_fake_cuda_kernel: the fake runs them when a
 * launch runs, at once or inside a graph launch), so the pass computes:
 * a graph that replayed stale parameters (the K/V slot of an earlier step,
 * the old number of cached positions) or ran its nodes out of order would
 * give other logits than plain launches. Every case is its own process,
 * with a fresh fake driver.
 *
 * khub-test/cuda-embed adds the embedding on the device, whose launch a
 * decode step's graph holds, reading the ids uploaded before it.
 *
 * The steps (graph_steps.h's run_steps): a prefill of 3 and 2 tokens into sequences 0 and
 * 1 (plain launches), three decode steps of both (the first captures and
 * instantiates, the next two update in place), two of sequence 0 alone (a
 * new batch shape: instantiated again, then updated), and one of both
 * (instantiated again).
 */
#include "cuda.h"
#include "device_fixture.h"
#include "khub/khub_kernels.h"
#include "executor.h"
#include "placement.h"

#include "fake_kernels.h"
#include "graph_steps.h"

/* ======================================================================== */
/* The steps (graph_steps.h)                                                */
/* ======================================================================== */

/* The kernel launches of one step with n_seqs sequences: per layer norm,
 * q, k, v, rotary q and k, a cache write and attention per sequence, o,
 * norm, gate, up, act, down; then the final norm and lm_head. */
static long launches_per_step(int n_seqs) { return LAYERS * (12 + 2 * n_seqs) + 2; }

/* A fixture with cuda_all and graphs on (graphs 1) or KHUB_CUDA_GRAPHS=0;
 * the same random weights every time. */
static void load_all(fixture *f, bool graphs, const char *plugin)
{
    if (graphs)
        unsetenv("KHUB_CUDA_GRAPHS");
    else
        setenv("KHUB_CUDA_GRAPHS", "0", 1);
    ASSERT_OK(load(f, cuda0, plugin, false));
}

static void assert_freed(fixture *f)
{
    khub_model_free(f->m);
    f->m = NULL;
    ASSERT_EQ(stat_of("graphs_live"), 0);
    ASSERT_EQ(stat_of("graph_execs_live"), 0);
    ASSERT_EQ(stat_of("allocs_live"), 0);
    ASSERT_EQ(stat_of("streams_live"), 0);
    ASSERT_EQ(stat_of("busy_destroyed"), 0);
    unload(f);
}

static char log_lines[4096];
static void capture_log(void *ud, khub_log_level level, const char *msg)
{
    (void)ud;
    size_t len = strlen(log_lines);
    if (level == KHUB_LOG_WARN) snprintf(log_lines + len, sizeof log_lines - len, "%s\n", msg);
}

/* ======================================================================== */
/* Graphs on                                                                */
/* ======================================================================== */

/* The first decode step captures and instantiates, the next of the same
 * shape update in place and launch; a new shape instantiates again; each
 * graph step runs exactly a plain step's launches and synchronises once. */
TEST_IMPL(graphs_decode_steps_capture_update_launch)
{
    fake("12080:90", "100000000", NULL);
    computing_kernels();
    fixture f;
    load_all(&f, true, "cuda_all");
    ASSERT_CONTAINS(khub_model_explain(f.m),
                    "CUDA graphs: yes (decode steps: captured each step, instantiated once per "
                    "batch shape, then updated in place with cuGraphExecUpdate; prefill runs "
                    "plain launches)\n");
    static run r;
    run_steps(f.m, &r, N_STEPS, NULL);
    /* captures, instantiations, updates, graph launches per step */
    static const long want[N_STEPS][4] = {{0, 0, 0, 0}, {1, 1, 0, 1}, {1, 0, 1, 1}, {1, 0, 1, 1},
                                          {1, 1, 0, 1}, {1, 0, 1, 1}, {1, 1, 0, 1}};
    for (int s = 0; s < N_STEPS; s++) {
        ASSERT_EQ(r.step[s].captures, want[s][0]);
        ASSERT_EQ(r.step[s].instantiations, want[s][1]);
        ASSERT_EQ(r.step[s].updates, want[s][2]);
        ASSERT_EQ(r.step[s].graph_launches, want[s][3]);
        ASSERT_EQ(r.step[s].launches, launches_per_step(step_seqs[s]));
        ASSERT_EQ(r.step[s].syncs, 1); /* reading the logits */
    }
    const khub__graph *g = &f.m->place->graph;
    ASSERT(g->on);
    ASSERT_EQ((long)g->captures, 6);
    ASSERT_EQ((long)g->instantiations, 3);
    ASSERT_EQ((long)g->updates, 3);
    ASSERT_EQ((long)g->launches, 6);
    ASSERT_EQ(stat_of("graphs_live"), 0);      /* each capture freed after use */
    ASSERT_EQ(stat_of("graph_execs_live"), 1); /* the last shape's */
    assert_freed(&f);
}

/* The same steps with KHUB_CUDA_GRAPHS=0 and with graphs: the same kernels
 * in the same order each step, and the same logits bit for bit (the
 * kernels compute here, so stale parameters would show). */
TEST_IMPL(graphs_same_launches_and_logits_as_plain)
{
    fake("12080:90", "100000000", NULL);
    computing_kernels();
    static run plain, graphed;
    fixture f;
    load_all(&f, false, "cuda_all");
    ASSERT_CONTAINS(khub_model_explain(f.m), "CUDA graphs: no (KHUB_CUDA_GRAPHS=0)\n");
    run_steps(f.m, &plain, N_STEPS, NULL);
    ASSERT_EQ(stat_of("graph_captures"), 0);
    assert_freed(&f);
    load_all(&f, true, "cuda_all");
    run_steps(f.m, &graphed, N_STEPS, NULL);
    ASSERT_EQ(stat_of("graph_launches"), N_STEPS - 1);
    for (int s = 0; s < N_STEPS; s++) {
        ASSERT_EQ(graphed.step[s].launches, plain.step[s].launches);
        for (long i = 0; i < plain.step[s].launches; i++)
            ASSERT_STR_EQ(launch_name(graphed.step[s].first_launch + i),
                          launch_name(plain.step[s].first_launch + i));
        ASSERT_EQ(memcmp(graphed.logits[s], plain.logits[s],
                         (size_t)step_seqs[s] * VOCAB * sizeof(float)),
                  0);
    }
    /* The logits are computed, not left-over memory: they move from step to
     * step and are finite. */
    ASSERT(memcmp(plain.logits[1][0], plain.logits[2][0], VOCAB * sizeof(float)) != 0);
    ASSERT(memcmp(plain.logits[4][0], plain.logits[5][0], VOCAB * sizeof(float)) != 0);
    for (int i = 0; i < VOCAB; i++) ASSERT(isfinite(plain.logits[6][1][i]));
    assert_freed(&f);
}

/* khub-test/cuda-embed adds the embedding to cuda-all's device roles: a
 * decode step's graph holds the embedding launch (the body's first node:
 * one node more than the step's other launches and last-row gathers), the
 * step copies up only the ids and positions (4 + 4 B per sequence, before
 * the capture, into fixed device buffers), and the logits equal plain
 * launches' and those of cuda-all's host lookup (an f32 row copied either
 * way) bit for bit at every step. The ids change each step, so a graph
 * reading stale ids would give other logits. */
TEST_IMPL(graphs_hold_the_embedding_launch)
{
    fake("12080:90", "100000000", NULL);
    computing_kernels();
    static run host, plain, graphed;
    fixture f;
    load_all(&f, false, "cuda_embed");
    run_steps(f.m, &plain, N_STEPS, NULL);
    ASSERT_EQ(stat_of("graph_captures"), 0);
    assert_freed(&f);
    load_all(&f, true, "cuda_all");
    run_steps(f.m, &host, N_STEPS, NULL);
    assert_freed(&f);
    load_all(&f, true, "cuda_embed");
    const char *ex = khub_model_explain(f.m);
    ASSERT_CONTAINS(ex, "  embedding[f32]: cuda:0, khub-test/cuda-embed 1.0.0 :: embedding\n");
    ASSERT_CONTAINS(ex, "CUDA graphs: yes (decode steps: ");
    run_steps(f.m, &graphed, N_STEPS, NULL);
    for (int s = 0; s < N_STEPS; s++) {
        int q = step_seqs[s];
        long toks = s == 0 ? 5 : q; /* step 0 prefills 3 + 2 */
        ASSERT_EQ(graphed.step[s].launches, launches_per_step(q) + 1);
        ASSERT_EQ(plain.step[s].launches, graphed.step[s].launches);
        ASSERT_STR_EQ(launch_name(graphed.step[s].first_launch), "khub_test_embedding");
        ASSERT_STR_EQ(launch_name(plain.step[s].first_launch), "khub_test_embedding");
        ASSERT_EQ(graphed.step[s].htod, toks * (4 + 4)); /* ids, positions */
        ASSERT_EQ(graphed.step[s].graph_launches, (s == 0 ? 0 : 1));
        ASSERT_EQ(graphed.step[s].nodes, (s == 0 ? 0 : launches_per_step(q) + 1 + q));
        ASSERT_EQ(memcmp(graphed.logits[s], plain.logits[s], (size_t)q * VOCAB * sizeof(float)), 0);
        ASSERT_EQ(memcmp(graphed.logits[s], host.logits[s], (size_t)q * VOCAB * sizeof(float)), 0);
    }
    ASSERT(memcmp(plain.logits[2][0], plain.logits[3][0], VOCAB * sizeof(float)) != 0);
    for (int i = 0; i < VOCAB; i++) ASSERT(isfinite(plain.logits[6][1][i]));
    assert_freed(&f);
}

/* ======================================================================== */
/* Graphs off, with the reason                                              */
/* ======================================================================== */

/* A role on the CPU synchronises mid-step: no graphs, and a decode step
 * captures nothing. */
TEST_IMPL(graphs_off_with_a_cpu_role)
{
    fake("12080:90", "100000000", NULL);
    fixture f;
    ASSERT_OK(load(&f, cuda0, "cuda_ops", false));
    ASSERT_CONTAINS(khub_model_explain(f.m),
                    "CUDA graphs: no (3 roles on the CPU (first: rotary), whose copies "
                    "synchronise the stream mid-step)\n");
    static run r;
    run_steps(f.m, &r, 2, NULL);
    ASSERT_EQ(r.step[1].captures, 0);
    ASSERT_EQ(stat_of("graph_captures"), 0);
    assert_freed(&f);
}

/* A device cache of ABI 1.4 gets no stream (ctx is 1.5) and appends on the
 * legacy stream, which a capture cannot hold: no graphs, said why. */
TEST_IMPL(graphs_off_for_a_cache_of_abi_1_4)
{
    fake("12080:90", "100000000", NULL);
    fixture f;
    ASSERT_OK(load(&f, cuda0, "cuda_all_1_4", false));
    ASSERT_CONTAINS(khub_model_explain(f.m),
                    "CUDA graphs: no (the device KV cache khub-test/cuda-all-1-4 1.0.0 :: "
                    "static_cache targets ABI 1.4: it appends on the legacy default stream, "
                    "which a capture cannot hold (1.5 passes the stream))\n");
    static run r;
    run_steps(f.m, &r, 2, NULL);
    ASSERT_EQ(stat_of("graph_captures"), 0);
    assert_freed(&f);
}

TEST_IMPL(graphs_off_on_a_driver_before_12_0)
{
    fake("11080:90", "100000000", NULL);
    fixture f;
    ASSERT_OK(load(&f, cuda0, "cuda_all", false));
    ASSERT_CONTAINS(khub_model_explain(f.m),
                    "CUDA graphs: no (CUDA driver 11.8 is older than 12.0, whose "
                    "cuGraphExecUpdate khub calls)\n");
    assert_freed(&f);
}

/* ======================================================================== */
/* Failures                                                                 */
/* ======================================================================== */

/* A failure of the graph machinery at the first decode step: one warning,
 * graphs off from then on, and every step computes what plain launches
 * compute. */
static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *at = strstr(hay, needle); at; at = strstr(at + 1, needle)) n++;
    return n;
}

static void falls_back(const char *fail, const char *why)
{
    /* The plain run first: it makes no graph call, so `fail` (the first
     * such call) hits the run with graphs. */
    fake("12080:90", "100000000", fail);
    computing_kernels();
    static run plain, failed;
    fixture f;
    load_all(&f, false, "cuda_all");
    run_steps(f.m, &plain, N_STEPS, NULL);
    assert_freed(&f);
    load_all(&f, true, "cuda_all");
    log_lines[0] = '\0';
    khub_log_set(f.rt, capture_log, NULL);
    run_steps(f.m, &failed, N_STEPS, NULL);
    char want[512];
    snprintf(want, sizeof want,
             ": cuda:0: CUDA graphs turned off: %s; decode steps run plain stream launches "
             "from now on\n",
             why);
    ASSERT_CONTAINS(log_lines, want);
    ASSERT_EQ(count(log_lines, "CUDA graphs turned off"), 1);
    snprintf(want, sizeof want, "turned off: %s", why);
    ASSERT_STR_EQ(f.m->place->graph.why, want);
    ASSERT(!f.m->place->graph.on);
    ASSERT_EQ((long)f.m->place->graph.fallbacks, 1);
    ASSERT_EQ(failed.step[1].graph_launches, 0);
    for (int s = 2; s < N_STEPS; s++) ASSERT_EQ(failed.step[s].captures, 0);
    for (int s = 0; s < N_STEPS; s++) {
        ASSERT_EQ(failed.step[s].launches, plain.step[s].launches);
        ASSERT_EQ(
            memcmp(failed.logits[s], plain.logits[s], (size_t)step_seqs[s] * VOCAB * sizeof(float)),
            0);
    }
    assert_freed(&f);
}

TEST_IMPL(graphs_capture_failure_falls_back)
{
    falls_back("cuStreamEndCapture@1",
               "capturing the decode step failed: cuStreamEndCapture failed: "
               "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)");
}

TEST_IMPL(graphs_instantiate_failure_falls_back)
{
    falls_back("cuGraphInstantiateWithFlags@1",
               "instantiating the decode step's graph failed: cuGraphInstantiateWithFlags "
               "failed: CUDA_ERROR_OUT_OF_MEMORY (2)");
}

/* An update the driver refuses is not a failure: the step instantiates
 * anew and graphs stay on (no warning). */
TEST_IMPL(graphs_update_refused_instantiates_again)
{
    fake("12080:90", "100000000", "cuGraphExecUpdate@1");
    computing_kernels();
    fixture f;
    load_all(&f, true, "cuda_all");
    log_lines[0] = '\0';
    khub_log_set(f.rt, capture_log, NULL);
    static run r;
    run_steps(f.m, &r, 4, NULL);
    ASSERT_EQ(r.step[2].updates, 0);
    ASSERT_EQ(r.step[2].instantiations, 1);
    ASSERT_EQ(r.step[2].graph_launches, 1);
    ASSERT_EQ(r.step[3].updates, 1);
    ASSERT_EQ(stat_of("graph_update_failures"), 1);
    ASSERT_STR_EQ(log_lines, "");
    ASSERT(f.m->place->graph.on);
    assert_freed(&f);
}

/* A graph launch that fails is the step's error, named like a launch
 * failure; the model stays usable and graphs stay on. */
TEST_IMPL(graphs_launch_failure_is_an_error)
{
    fake("12080:90", "100000000", "cuGraphLaunch@1");
    fixture f;
    load_all(&f, true, "cuda_all");
    static run r;
    run_steps(f.m, &r, 1, NULL);
    khub__seg segs[2] = {{.seq = 0, .pos0 = 3, .n = 1}, {.seq = 1, .pos0 = 2, .n = 1}};
    int32_t toks[2] = {7, 9};
    ASSERT_STATUS(khub__forward(f.m, toks, segs, 2), KHUB_STATUS_CUDA);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": cuda:0: launching the decode step's graph (2 sequences): cuGraphLaunch "
                    "failed: CUDA_ERROR_LAUNCH_FAILED (719)");
    khub__clear(f.rt);
    ASSERT_OK(khub__forward(f.m, toks, segs, 2)); /* @1 fails once */
    ASSERT_EQ(stat_of("graph_launches"), 1);
    ASSERT(f.m->place->graph.on);
    assert_freed(&f);
}

/* ======================================================================== */
/* The fake driver's capture, as the driver layer sees it                   */
/* ======================================================================== */

/* Work on the legacy stream or a synchronisation breaks a capture with the
 * real driver's errors; a capture that holds records launches and copies
 * without running them, and its graph runs them when launched. */
TEST_IMPL(fake_capture_breaks_and_replays_like_a_driver)
{
    fake("12080:90", "65536", NULL);
    khub_runtime *rt = tp_runtime(1);
    khub_plugin *p = tp_load(rt, "cuda_ops");
    const khub_host_api *h = &p->host;
    void *stream = NULL, *graph = NULL, *exec = NULL, *fn = NULL;
    ASSERT_OK(khub__cuda_stream_new(rt, 0, &stream));
    khub__plugin_msg_clear();
    ASSERT_OK(khub__cuda_capture_begin(stream));
    ASSERT_STATUS(nop_launch(h, NULL, &fn), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "cuLaunchKernel failed: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (906)");
    ASSERT_STATUS(khub__cuda_capture_end(stream, &graph), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)");
    ASSERT(graph == NULL);
    ASSERT_OK(khub__cuda_capture_begin(stream));
    ASSERT_STATUS(h->cuda_stream_sync(h->host_ctx, stream), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "cuStreamSynchronize failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900)");
    ASSERT_STATUS(nop_launch(h, stream, &fn), KHUB_STATUS_CUDA);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "cuLaunchKernel failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)");
    ASSERT_STATUS(khub__cuda_capture_end(stream, &graph), KHUB_STATUS_CUDA);
    ASSERT_EQ(stat_of("graph_captures_invalidated"), 2);
    /* A capture that holds: recorded, not run, until the graph runs. */
    uint64_t d = 0;
    float src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8] = {0};
    ASSERT_OK(h->cuda_mem_alloc(h->host_ctx, 0, sizeof src, &d));
    long launches = stat_of("launches"), htod = stat_of("htod_bytes");
    ASSERT_OK(khub__cuda_capture_begin(stream));
    ASSERT_OK(h->cuda_memcpy_htod(h->host_ctx, d, src, sizeof src, stream));
    ASSERT_OK(nop_launch(h, stream, &fn));
    ASSERT_OK(khub__cuda_capture_end(stream, &graph));
    ASSERT(graph != NULL);
    ASSERT_EQ(stat_of("launches"), launches);
    ASSERT_EQ(stat_of("htod_bytes"), htod);
    ASSERT_OK(khub__cuda_graph_instantiate(graph, &exec));
    ASSERT_OK(khub__cuda_graph_launch(exec, stream));
    ASSERT_EQ(stat_of("launches"), launches + 1);
    ASSERT_EQ(stat_of("htod_bytes"), htod + (long)sizeof src);
    ASSERT_OK(h->cuda_memcpy_dtoh(h->host_ctx, back, d, sizeof back, stream));
    ASSERT_EQ(memcmp(src, back, sizeof src), 0);
    /* The same graph again updates in place; one with more nodes does not. */
    bool reshaped = true;
    ASSERT_OK(khub__cuda_graph_update(exec, graph, &reshaped));
    ASSERT(!reshaped);
    void *bigger = NULL;
    ASSERT_OK(khub__cuda_capture_begin(stream));
    for (int i = 0; i < 3; i++) ASSERT_OK(nop_launch(h, stream, &fn));
    ASSERT_OK(khub__cuda_capture_end(stream, &bigger));
    ASSERT_STATUS(khub__cuda_graph_update(exec, bigger, &reshaped), KHUB_STATUS_CUDA);
    ASSERT(reshaped);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "cuGraphExecUpdate failed: "
                  "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE (910) (update result 2)");
    khub__cuda_graph_free(bigger);
    khub__cuda_graph_free(graph);
    khub__cuda_graph_exec_free(exec);
    ASSERT_EQ(stat_of("graphs_live"), 0);
    ASSERT_EQ(stat_of("graph_execs_live"), 0);
    ASSERT_OK(h->cuda_mem_free(h->host_ctx, d));
    ASSERT_OK(khub__cuda_stream_free(rt, 0, stream));
    khub_runtime_free(rt);
}

/* A kernel swap on a placed model (khub_model_kernel_swap, issue 19): the
 * activation moves from khub-test/cuda-all's CUDA op to acme/act's
 * (tests/plugins/hub_act.c, kernel khub_hub_act). A plugin with no CUDA op
 * for the role is refused with nothing changed. The swap waits for a
 * launch still queued on the model's stream, destroys the decode step's
 * executable graph (it holds the old kernel), and the next decode step
 * captures and instantiates anew, launching the new kernel in place of
 * the old one. */
TEST_IMPL(graphs_swap_on_a_placed_model)
{
    fake("12080:90", "100000000", NULL);
    computing_kernels();
    fixture f;
    load_all(&f, true, "cuda_all");
    khub_plugin *act = tp_load(f.rt, "hub_act_cuda"), *cpu = tp_load(f.rt, "hub_act_cpu");
    static run r;
    run_steps(f.m, &r, 3, NULL); /* a prefill, then two decode steps: one graph */
    ASSERT_EQ(stat_of("graph_execs_live"), 1);
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap), .role = KHUB_KERNEL_ROLE_ACTIVATION,
                           .plugin = cpu};
    ASSERT_STATUS(khub_model_kernel_swap(f.m, &sw), KHUB_STATUS_NO_KERNEL);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    ": acme/act cannot serve silu_and_mul on cuda:0: acme/act 1.0.0 for "
                    "activation is rejected: ");
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "; nothing changed");
    ASSERT_EQ(stat_of("graph_execs_live"), 1);
    /* a launch still queued on the model's stream */
    void *fn = NULL;
    ASSERT_OK(nop_launch(&act->host, f.m->place->stream, &fn));
    long syncs = stat_of("stream_syncs");
    sw.plugin = act;
    ASSERT_OK(khub_model_kernel_swap(f.m, &sw));
    ASSERT_EQ(stat_of("stream_syncs"), syncs + 1);
    ASSERT_EQ(stat_of("graph_execs_live"), 0);
    ASSERT_STR_EQ(sw.previous, "khub-test/cuda-all 1.0.0 :: silu_and_mul");
    ASSERT_STR_EQ(sw.now_serving, "acme/act 1.0.0 :: silu_and_mul");
    ASSERT_CONTAINS(khub_model_explain(f.m),
                    "  swapped: silu_and_mul[f32]: on the device, acme/act 1.0.0 :: silu_and_mul "
                    "(was khub-test/cuda-all 1.0.0 :: silu_and_mul)\n");
    ASSERT_OK(khub__forward_reset(f.m, 0));
    ASSERT_OK(khub__forward_reset(f.m, 1));
    long first = stat_of("launches");
    run_steps(f.m, &r, 3, NULL);
    ASSERT_EQ(r.step[1].instantiations, 1); /* captured anew, not updated */
    ASSERT_EQ(r.step[2].updates, 1);
    long hub = 0, old = 0;
    for (long i = first; i < stat_of("launches"); i++) {
        hub += !strcmp(launch_name(i), "khub_hub_act");
        old += !strcmp(launch_name(i), "khub_test_act");
    }
    ASSERT_EQ(hub, 3 * LAYERS); /* each layer of each step */
    ASSERT_EQ(old, 0);
    assert_freed(&f);
}

#define TEST_LIST(X) \
    X(graphs_decode_steps_capture_update_launch) \
    X(graphs_same_launches_and_logits_as_plain) \
    X(graphs_hold_the_embedding_launch) \
    X(graphs_off_with_a_cpu_role) \
    X(graphs_off_for_a_cache_of_abi_1_4) \
    X(graphs_off_on_a_driver_before_12_0) \
    X(graphs_capture_failure_falls_back) \
    X(graphs_instantiate_failure_falls_back) \
    X(graphs_update_refused_instantiates_again) \
    X(graphs_launch_failure_is_an_error) \
    X(graphs_swap_on_a_placed_model) \
    X(fake_capture_breaks_and_replays_like_a_driver)
TEST_MAIN(TEST_LIST)
