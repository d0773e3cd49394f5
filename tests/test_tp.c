/*
 * test_tp.c: tensor parallelism (issue 18; runtime/executor/tp*.c) with the
 * ranks as threads of this process (tests/tp_thread_comm.h), on tiny random
 * Hugging Face models written here. tests/t_tp_mpi.sh runs the same through
 * mpirun and the CLI on SmolLM2.
 *
 * Why logits are compared within 1e-4 and not bit for bit: under the
 * reduce plan a rowwise projection (o_proj, down_proj) sums its dot
 * products in two halves that the all-reduce then adds, where one process
 * adds them in one run; float addition is not associative, so the last bits
 * differ. The gather plan sums nothing across ranks: its tests compare the
 * bytes where the kernels allow (khub/ref-cpu). Greedy tokens are compared
 * exactly.
 */
#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "executor.h"
#include "khub/khub_kernels.h"
#include "plugins/tp_util.h"
#include "runner.h"
#include "tiny_llama.h"
#include "tp_thread_comm.h"

/* ======================================================================== */
/* Tiny models                                                              */
/* ======================================================================== */

typedef struct tiny {
    int heads, kv, ffn, vocab;
    int qwen2;    /* q/k/v biases */
    uint64_t rng; /* weight seed */
} tiny;

enum { HID = 64, HD = 16, LAYERS = 2, MAXT = 64 };

/* Writes dir/config.json and dir/model.safetensors (F32) for t. */
static void tiny_write(const char *dir, const tiny *t)
{
    tiny_llama m = {.hidden = HID,
                    .ffn = t->ffn,
                    .layers = LAYERS,
                    .heads = t->heads,
                    .kv_heads = t->kv,
                    .head_dim = HD,
                    .vocab = t->vocab,
                    .qwen2 = t->qwen2 != 0,
                    .seed = t->rng};
    tiny_llama_write(dir, &m);
}

static void tiny_rm(const char *dir) { tiny_llama_rm(dir); }

/* ======================================================================== */
/* Ranks as threads                                                         */
/* ======================================================================== */

static const int32_t PROMPT[13] = {1, 17, 200, 3, 99, 45, 45, 45, 250, 7, 8, 128, 64};
enum { NEW = 16 };

typedef struct rank_job {
    tc_group *g;
    tc_rank r;
    int rank, size;
    const char *dir;
    const char *quant; /* quantize-at-load scheme or NULL */
    int real;          /* SmolLM2, the fixtures' last logits: 1 default kernels, 2 ref-cpu */
    khub_status load_st, serve_st;
    char msg[KHUB_ERROR_SIZE];
    float logits[256];   /* rank 0: the prompt's last logits */
    float all[13 * 256]; /* rank 0: every position's (khub_model_logits_all) */
    int32_t greedy[NEW];
    char explain[4096];
    uint64_t weight_bytes;
    char act[192];       /* the activation binding's name */
    uint64_t act_calls;  /* and its calls */
    khub_status swap_st; /* rank 0's kernel swap (swap_mode) */
    char swap_msg[KHUB_ERROR_SIZE];
} rank_job;

/* When set, every rank loads the test plugin "comm" and rank 0 swaps the
 * activation to it after the load and before driving (its op calls the
 * job's collectives, so a rank left on the old kernel would not meet the
 * others); 1: the other ranks follow with khub_model_tp_serve_kernels, 2:
 * with plain khub_model_tp_serve (which refuses swaps). */
static int swap_mode;

/* When set, every rank loads the test plugin "comm" (tests/plugins/comm.c)
 * and runs the model's activation on it: it calls the host's collectives
 * (ABI 1.5) at each call and fails unless every rank's met. */
static int with_comm_plugin;

/* Every rank's khub_model_opts.tp_plan (KHUB_TP_PLAN_REDUCE unless a test
 * sets it). */
static int32_t plan_opt;

static khub_model_opts ref_opts(void)
{
    const char *r = "khub/ref-cpu";
    return (khub_model_opts){KHUB_APP_INIT(khub_model_opts),
                             .attn_impl = r,
                             .quant = r,
                             .cache_impl = r,
                             .norm_impl = r,
                             .act_impl = r,
                             .rotary_impl = r,
                             .linear_impl = r,
                             .max_batch = 32};
}

static int32_t argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int32_t)i;
    return best;
}

/* Rank 0's work: the prompt's logits (one prefill), then NEW greedy tokens
 * one decode step at a time through the KV cache, then every position's
 * logits (the other ranks follow khub_model_logits_all's steps too). */
static khub_status drive(khub_model *m, rank_job *j)
{
    int64_t V = m->cfg.vocab_size;
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_reset(m, 0));
    khub__seg seg = {0, 0, 0, 13};
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward(m, PROMPT, &seg, 1));
    memcpy(j->logits, m->logits, (size_t)V * sizeof(float));
    for (int i = 0; i < NEW; i++) {
        j->greedy[i] = argmax(m->logits, V);
        khub__seg s = {0, 0, 13 + i, 1};
        KHUB_FORWARD_IF_ERROR(m->rt, khub__forward(m, &j->greedy[i], &s, 1));
    }
    return khub_model_logits_all(m, PROMPT, 13, j->all);
}

/* The fixture prompts of tests/fixtures/smollm2_greedy.json: ids and count. */
enum { N_CASES = 10, MAX_IDS = 256, SMOL_V = 49152 };
static int32_t case_ids[N_CASES][MAX_IDS];
static int case_n[N_CASES], n_cases;
static float *case_logits[TC_MAX]; /* [rank 0 of each run][N_CASES * SMOL_V] */

static void read_cases(void)
{
    FILE *f = fopen(KHUB_SOURCE_DIR "/tests/fixtures/smollm2_greedy.json", "rb");
    ASSERT(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf), *c;
    ASSERT(root);
    n_cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases"))
    {
        cJSON *ids = cJSON_GetObjectItem(c, "input_ids"), *id;
        int k = 0;
        cJSON_ArrayForEach(id, ids) if (k < MAX_IDS) case_ids[n_cases][k++] = id->valueint;
        case_n[n_cases++] = k;
        if (n_cases == N_CASES) break;
    }
    cJSON_Delete(root);
}

/* Rank 0 on SmolLM2: every case's last-position logits (khub_model_logits,
 * whose sequence resets and prefills go to the other ranks too). */
static khub_status drive_real(khub_model *m, float *out)
{
    for (int i = 0; i < n_cases; i++)
        KHUB_FORWARD_IF_ERROR(
            m->rt, khub_model_logits(m, case_ids[i], (size_t)case_n[i], out + (size_t)i * SMOL_V));
    return KHUB_STATUS_OK;
}

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    if (khub_runtime_new(&ro, &rt) != KHUB_STATUS_OK || khub_plugin_load_builtin(rt)) abort();
    if (with_comm_plugin || swap_mode) (void)tp_load(rt, "comm");
    khub_comm comm = tc_comm(j->g, &j->r, j->rank);
    khub_model_opts o =
        j->real == 1 ? (khub_model_opts){KHUB_APP_INIT(khub_model_opts)} : ref_opts();
    o.max_batch = 256;
    o.max_context = 512;
    o.max_seqs = 1;
    o.tp_size = j->size;
    o.tp_plan = plan_opt;
    o.comm = j->size > 1 ? &comm : NULL;
    if (j->quant) o.quant = j->quant;
    if (with_comm_plugin) o.act_impl = "khub-test/comm";
    khub_model *m = NULL;
    j->load_st = khub_model_load(rt, j->dir, &o, &m);
    snprintf(j->msg, sizeof j->msg, "%s", khub_runtime_errmsg(rt));
    if (m) {
        const char *ex = strstr(khub_model_explain(m), "tp plan: rank");
        snprintf(j->explain, sizeof j->explain, "%s", ex ? ex : "");
        j->weight_bytes = m->info.weight_bytes;
        khub_hub *hub = NULL;
        if (swap_mode && khub_hub_new(NULL, &hub) != KHUB_STATUS_OK) abort();
        if (swap_mode && j->rank == 0) {
            khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
            j->swap_st = khub_kernel_swap_prepare(hub, rt, KHUB_KERNEL_ROLE_ACTIVATION,
                                                  "khub-test/comm", NULL, &sw);
            if (j->swap_st == KHUB_STATUS_OK) j->swap_st = khub_model_kernel_swap(m, &sw);
            snprintf(j->swap_msg, sizeof j->swap_msg, "%s", khub_runtime_errmsg(rt));
        }
        j->serve_st = j->rank != 0 ? (swap_mode == 1 ? khub_model_tp_serve_kernels(m, hub, NULL)
                                                     : khub_model_tp_serve(m))
                      : j->real    ? drive_real(m, case_logits[j->size])
                                   : drive(m, j);
        khub_hub_free(hub);
        if (j->serve_st != KHUB_STATUS_OK)
            snprintf(j->msg, sizeof j->msg, "%s", khub_runtime_errmsg(rt));
        snprintf(j->act, sizeof j->act, "%s", khub_binding_name(m->act));
        j->act_calls = khub_binding_calls(m->act);
    }
    khub_model_free(m);
    khub_runtime_free(rt);
    return NULL;
}

/* Runs `size` ranks on dirs[rank] (dirs[0] for all when dirs[1] is NULL). */
static void run_ranks_(int size, const char *const *dirs, const char *quant, int real,
                       rank_job *jobs)
{
    tc_group g;
    tc_init(&g, size);
    pthread_t th[TC_MAX];
    for (int r = 0; r < size; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].g = &g;
        jobs[r].rank = r;
        jobs[r].size = size;
        jobs[r].dir = dirs[1] ? dirs[r] : dirs[0];
        jobs[r].quant = quant;
        jobs[r].real = real;
        ASSERT_EQ(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    tc_destroy(&g);
}

static void run_ranks(int size, const char *const *dirs, const char *quant, rank_job *jobs)
{
    run_ranks_(size, dirs, quant, 0, jobs);
}

static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        num = d > num ? d : num;
        den = fabs((double)b[i]) > den ? fabs((double)b[i]) : den;
    }
    return den > 0 ? num / den : num;
}

/* tp `size` gives tp 1's greedy tokens and logits within 1e-4. */
static void check_matches(const tiny *t, int size, const char *quant)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-tp-%d", (int)getpid());
    tiny_write(dir, t);
    const char *dirs[2] = {dir, NULL};
    rank_job one[1], many[TC_MAX];
    run_ranks(1, dirs, quant, one);
    ASSERT_OK(one[0].load_st);
    ASSERT_OK(one[0].serve_st);
    run_ranks(size, dirs, quant, many);
    for (int r = 0; r < size; r++) {
        if (many[r].load_st || many[r].serve_st) fprintf(stderr, "rank %d: %s\n", r, many[r].msg);
        ASSERT_OK(many[r].load_st);
        ASSERT_OK(many[r].serve_st);
        ASSERT_CONTAINS(many[r].explain, "tp plan: rank");
        /* Each rank holds less than the whole model's weights. */
        ASSERT(many[r].weight_bytes < one[0].weight_bytes);
    }
    double e = rel_err(many[0].logits, one[0].logits, t->vocab);
    printf("tp %d (%s plan): logits rel err %.3g\n", size, plan_opt ? "gather" : "reduce", e);
    ASSERT_LE(e, 1e-4);
    /* The gather plan sums nothing across ranks: with khub/ref-cpu (whose
     * rows do not depend on which rows a call computes) the logits are tp
     * 1's bit for bit. */
    if (plan_opt == KHUB_TP_PLAN_GATHER && !quant) {
        ASSERT_EQ(memcmp(many[0].logits, one[0].logits, sizeof one[0].logits), 0);
        ASSERT_EQ(memcmp(many[0].all, one[0].all, 13 * (size_t)t->vocab * sizeof(float)), 0);
    }
    for (int i = 0; i < NEW; i++) ASSERT_EQ(many[0].greedy[i], one[0].greedy[i]);
    /* Every position's logits: tp's against tp 1's, and the last row against
     * the prompt's last logits of the same ranks. */
    double ea = rel_err(many[0].all, one[0].all, 13 * t->vocab);
    double el = rel_err(many[0].all + 12 * t->vocab, many[0].logits, t->vocab);
    printf("tp %d: all-positions logits rel err %.3g, last row vs last logits %.3g\n", size, ea,
           el);
    ASSERT_LE(ea, 1e-4);
    ASSERT_LE(el, 1e-5);
    tiny_rm(dir);
}

/* ======================================================================== */
/* Tests                                                                    */
/* ======================================================================== */

/* 3 KV groups over 2 ranks: 2 and 1 (SmolLM2-135M's shape of problem). */
TEST_IMPL(tp2_uneven_gqa_groups_match_tp1)
{
    tiny t = {6, 3, 128, 256, 0, 0};
    check_matches(&t, 2, NULL);
}

/* One KV head, replicated on both ranks, which split its 4 query heads. */
TEST_IMPL(tp2_replicated_kv_head_matches_tp1)
{
    tiny t = {4, 1, 128, 256, 0, 0};
    check_matches(&t, 2, NULL);
}

/* 4 ranks over 2 KV heads (each on 2 ranks), Qwen2's q/k/v biases sliced. */
TEST_IMPL(tp4_qwen2_biases_match_tp1)
{
    tiny t = {4, 2, 128, 256, 1, 0};
    check_matches(&t, 4, NULL);
}

/* Quantized at load to Q8_0 (blocks of 32): the rowwise columns split on
 * block boundaries. */
TEST_IMPL(tp2_q8_0_matches_tp1)
{
    tiny t = {4, 2, 128, 256, 0, 0};
    check_matches(&t, 2, "q8_0");
}

/* The gather plan on the shapes above: same tokens, same logits bit for
 * bit (uneven GQA groups, a replicated KV head, Qwen2's biases sliced by
 * output rows), and a Q8_0 model within 1e-4. */
TEST_IMPL(tp_gather_plan_matches_tp1)
{
    plan_opt = KHUB_TP_PLAN_GATHER;
    tiny a = {6, 3, 128, 256, 0, 0}, b = {4, 1, 64, 256, 0, 0}, c = {8, 4, 128, 256, 1, 0},
         d = {4, 2, 128, 256, 0, 0};
    check_matches(&a, 2, NULL);
    check_matches(&b, 2, NULL);
    check_matches(&c, 4, NULL);
    check_matches(&d, 2, "q8_0");
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-tp-%d", (int)getpid());
    tiny_write(dir, &a);
    const char *dirs[2] = {dir, NULL};
    rank_job jobs[2];
    run_ranks(2, dirs, NULL, jobs);
    for (int r = 0; r < 2; r++) {
        char o_line[160], d_line[160];
        snprintf(o_line, sizeof o_line,
                 "colwise   hidden rows %d-%d of 64 from the whole attention output "
                 "(all-gathered), then all-gather",
                 32 * r, 32 * r + 31);
        snprintf(d_line, sizeof d_line,
                 "colwise   hidden rows %d-%d of 64 from the whole FFN activation "
                 "(all-gathered), then all-gather",
                 32 * r, 32 * r + 31);
        ASSERT_OK(jobs[r].load_st);
        ASSERT_CONTAINS(jobs[r].explain, "(gather)");
        ASSERT_CONTAINS(jobs[r].explain, o_line);
        ASSERT_CONTAINS(jobs[r].explain, d_line);
    }
    tiny_rm(dir);
    plan_opt = KHUB_TP_PLAN_REDUCE;
}

static void check_refused(const tiny *t, int size, const char *quant, khub_status want,
                          const char *msg)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-tp-%d", (int)getpid());
    tiny_write(dir, t);
    const char *dirs[2] = {dir, NULL};
    rank_job jobs[TC_MAX];
    run_ranks(size, dirs, quant, jobs);
    for (int r = 0; r < size; r++) {
        char want_msg[512];
        snprintf(want_msg, sizeof want_msg, msg, 32 * r, 32 * r + 31); /* the rank's columns */
        ASSERT_STATUS(jobs[r].load_st, want);
        ASSERT_CONTAINS(jobs[r].msg, want_msg);
    }
    tiny_rm(dir);
}

TEST_IMPL(tp3_kv_heads_not_dividing_refused)
{
    tiny t = {4, 2, 120, 255, 0, 0};
    check_refused(&t, 3, NULL, KHUB_STATUS_INVALID_ARG,
                  "tp_size 3 cannot split 'model.layers.0.self_attn.k_proj.weight': 2 KV heads "
                  "(4 query heads) over 3 ranks");
}

TEST_IMPL(tp3_ffn_not_dividing_refused)
{
    tiny t = {6, 3, 128, 255, 0, 0};
    check_refused(&t, 3, NULL, KHUB_STATUS_INVALID_ARG,
                  "tp_size 3 cannot split 'model.layers.0.mlp.gate_proj.weight': intermediate "
                  "size 128 is not a multiple of 3");
}

/* The gather plan splits the hidden rows: 64 over 3 ranks cannot. */
TEST_IMPL(tp3_gather_plan_hidden_not_dividing_refused)
{
    plan_opt = KHUB_TP_PLAN_GATHER;
    tiny t = {6, 3, 129, 255, 0, 0};
    check_refused(&t, 3, NULL, KHUB_STATUS_INVALID_ARG,
                  "tp_size 3 with the gather plan cannot split "
                  "'model.layers.0.self_attn.o_proj.weight': hidden size 64 is not a multiple "
                  "of 3");
    plan_opt = KHUB_TP_PLAN_REDUCE;
}

TEST_IMPL(tp3_vocab_not_dividing_refused)
{
    tiny t = {6, 3, 129, 256, 0, 0};
    check_refused(&t, 3, NULL, KHUB_STATUS_INVALID_ARG,
                  "tp_size 3 cannot split 'model.embed_tokens.weight': vocabulary 256");
}

/* NF4 blocks are 64 wide; rank 1's o_proj columns start at 32. */
TEST_IMPL(tp2_split_inside_a_quant_block_refused)
{
    tiny t = {4, 2, 128, 256, 0, 0};
    check_refused(&t, 2, "nf4", KHUB_STATUS_INVALID_ARG,
                  "tp_size 2 cannot split 'model.layers.0.self_attn.o_proj.weight' (nf4, 64 "
                  "columns): columns %d-%d do not fall on its block boundaries");
}

/* Rank 1 holds different weights of the same shapes: both ranks refuse
 * before any token, naming the rank. */
TEST_IMPL(tp2_mismatched_model_on_one_rank_refused)
{
    char d0[128], d1[128];
    snprintf(d0, sizeof d0, "/tmp/khub-test-tp-%d-a", (int)getpid());
    snprintf(d1, sizeof d1, "/tmp/khub-test-tp-%d-b", (int)getpid());
    tiny a = {4, 2, 128, 256, 0, 0}, b = {4, 2, 128, 256, 0, 12345};
    tiny_write(d0, &a);
    tiny_write(d1, &b);
    const char *dirs[2] = {d0, d1};
    rank_job jobs[2];
    run_ranks(2, dirs, NULL, jobs);
    for (int r = 0; r < 2; r++) {
        ASSERT_STATUS(jobs[r].load_st, KHUB_STATUS_MODEL_INVALID);
        ASSERT_CONTAINS(jobs[r].msg, "tp rank 1 loaded different model bytes than rank 0");
    }
    /* A rank whose file is missing stops the others with its reason. */
    tiny_rm(d1);
    run_ranks(2, dirs, NULL, jobs);
    ASSERT_STATUS(jobs[1].load_st, KHUB_STATUS_NOT_FOUND);
    ASSERT_STATUS(jobs[0].load_st, KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(jobs[0].msg, "tp rank 1 failed to load: ");
    ASSERT_CONTAINS(jobs[0].msg, "no such file or folder");
    tiny_rm(d0);
}

/* Prompts of the default kernels' check: all 10, or under AddressSanitizer
 * (which checks memory, not numbers) the first 4, so the five passes fit
 * the runner's per-case limit on a busy machine. */
#if defined(__SANITIZE_ADDRESS__)
enum { SMOL_CASES_DEFAULT = 4 };
#else
enum { SMOL_CASES_DEFAULT = N_CASES };
#endif

/* One run of check_smollm2: tp size, plan, and the bound of its logits. */
typedef struct smol_run {
    int T;
    int32_t plan;
    double tol;
} smol_run;

/* SmolLM2-135M-Instruct Q4_1 (tools/fetch-model.sh): tp 2 (3 KV groups:
 * 2 and 1) and tp 3 against tp 1, last-position logits of every fixture
 * prompt. With khub/ref-cpu (f32 throughout) within 1e-4. With the default
 * kernels measured 4.5e-4 (tp 2), 5.2e-4 (tp 3), so 1e-3 there (the bound
 * the Transformers comparison of this model uses), and the same argmax.
 * Why (issue 18 item 5, docs/parallelism.md "Correctness"): calls of fewer
 * than KX_GEMM_MIN_N tokens (48 when these were measured, 128 since session
 * 15) round each 32-block of the activations to int16
 * (cpu-avx2's qlinear_q16.c), and the all-reduce's other float order moves
 * a few values across a rounding step. Measured on tp 2: with qlinear_f32
 * (f32 activations) everywhere the gap is 2.5e-6; the prompts of 73+
 * tokens (prefill on the f32 GEMM) give 1e-5, those of 1-43 tokens
 * 2.2e-4-4.5e-4; and at tp 1 the int16 path differs from qlinear_f32 by
 * 2.5e-4-7.1e-4 on those prompts: the gap is that path's own rounding
 * noise. f32 activations would halve the decode speed, so 1e-4 is not the
 * reduce plan's bound here; the gather plan, which sums nothing across
 * ranks, is held to 1e-4 with the same kernels.
 * Greedy tokens over 64 steps: tests/t_tp_mpi.sh, through mpirun.
 * Skipped when the model is absent. */
static void check_smollm2(int kernels, int n_runs, const smol_run *runs, int max_cases)
{
    const char *md = getenv("KHUB_MODEL_DIR");
    char path[512];
    if (md)
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", md);
    else
        snprintf(path, sizeof path, "%s/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "/root");
    if (access(path, R_OK) != 0) TEST_SKIP("%s absent (run tools/fetch-model.sh)", path);
    read_cases();
    if (n_cases > max_cases) n_cases = max_cases;
    const char *dirs[2] = {path, NULL};
    float *one = NULL; /* tp 1's logits: runs[0] */
    for (int k = 0; k < n_runs; k++) {
        int T = runs[k].T;
        case_logits[T] = malloc((size_t)N_CASES * SMOL_V * sizeof(float));
        ASSERT(case_logits[T]);
        plan_opt = runs[k].plan;
        rank_job jobs[TC_MAX];
        run_ranks_(T, dirs, NULL, kernels, jobs);
        plan_opt = KHUB_TP_PLAN_REDUCE;
        for (int r = 0; r < T; r++) {
            if (jobs[r].load_st || jobs[r].serve_st)
                fprintf(stderr, "rank %d: %s\n", r, jobs[r].msg);
            ASSERT_OK(jobs[r].load_st);
            ASSERT_OK(jobs[r].serve_st);
        }
        if (T == 1) {
            one = case_logits[1];
            continue;
        }
        ASSERT(one);
        double worst = 0;
        for (int i = 0; i < n_cases; i++) {
            const float *a = case_logits[T] + (size_t)i * SMOL_V;
            const float *b = one + (size_t)i * SMOL_V;
            double e = rel_err(a, b, SMOL_V);
            worst = e > worst ? e : worst;
            ASSERT_LE(e, runs[k].tol);
            ASSERT_EQ(argmax(a, SMOL_V), argmax(b, SMOL_V));
        }
        printf("%s kernels, tp %d, %s plan: %d prompts, worst last-position logits rel err %.3g\n",
               kernels == 1 ? "default" : "ref-cpu", T,
               runs[k].plan == KHUB_TP_PLAN_GATHER ? "gather" : "reduce", n_cases, worst);
        free(case_logits[T]);
        case_logits[T] = NULL;
    }
    free(one);
    case_logits[1] = NULL;
}

TEST_IMPL(tp_smollm2_ref_logits_match_tp1)
{
    smol_run runs[2] = {{1, 0, 0}, {2, KHUB_TP_PLAN_REDUCE, 1e-4}};
    check_smollm2(2, 2, runs, 3); /* ref-cpu is slow: the three short prompts */
}

/* The default kernels: the reduce plan within the Transformers comparison's
 * 1e-3 (the comment above check_smollm2 says why not 1e-4); the gather plan
 * sums nothing across ranks, so that amplified rounding does not arise:
 * within 1e-4 (measured: 0). */
TEST_IMPL(tp_smollm2_logits_match_tp1)
{
    smol_run runs[5] = {{1, 0, 0},
                        {2, KHUB_TP_PLAN_REDUCE, 1e-3},
                        {3, KHUB_TP_PLAN_REDUCE, 1e-3},
                        {2, KHUB_TP_PLAN_GATHER, 1e-4},
                        {3, KHUB_TP_PLAN_GATHER, 1e-4}};
    check_smollm2(1, 5, runs, SMOL_CASES_DEFAULT);
}

TEST_IMPL(tp_options_checked)
{
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    khub_model_opts o = ref_opts();
    o.tp_size = 2;
    khub_model *m = NULL;
    ASSERT_STATUS(khub_model_load(rt, "/nonexistent", &o, &m), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "tp_size 2 needs a communicator (khub_model_opts.comm)");
    tc_group g;
    tc_init(&g, 3);
    tc_rank r;
    khub_comm c = tc_comm(&g, &r, 0);
    o.comm = &c;
    ASSERT_STATUS(khub_model_load(rt, "/nonexistent", &o, &m), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "tp_size 2 but the communicator has rank 0 of 3");
    tc_destroy(&g);
    /* Without tp, serving is a misuse named as such. */
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-tp-%d", (int)getpid());
    tiny t = {4, 2, 128, 256, 0, 0};
    tiny_write(dir, &t);
    o = ref_opts();
    ASSERT_OK(khub_model_load(rt, dir, &o, &m));
    ASSERT_STATUS(khub_model_tp_serve(m), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt), "only ranks other than 0");
    khub_model_free(m);
    /* A plan that is not one is refused, with or without tp. */
    o.tp_plan = 7;
    ASSERT_STATUS(khub_model_load(rt, dir, &o, &m), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(rt),
                    "khub_model_load: tp_plan 7 is not a plan (want 0 = KHUB_TP_PLAN_REDUCE or "
                    "1 = KHUB_TP_PLAN_GATHER)");
    ASSERT(m == NULL);
    tiny_rm(dir);
    khub_runtime_free(rt);
}

/* A plugin's activation calls the job's collectives through the host (ABI
 * 1.5) at every call on every rank: tp 2 still gives tp 1's tokens, and the
 * calls all went through it (it fails any call whose collectives disagree). */
TEST_IMPL(tp2_plugin_collectives_through_the_host)
{
    tiny t = {6, 3, 128, 256, 0, 0};
    with_comm_plugin = 1;
    check_matches(&t, 2, NULL);
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-tp-comm-%d", (int)getpid());
    tiny_write(dir, &t);
    const char *dirs[2] = {dir, NULL};
    rank_job jobs[2];
    run_ranks(2, dirs, NULL, jobs);
    with_comm_plugin = 0;
    tiny_rm(dir);
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(jobs[r].serve_st);
        ASSERT_CONTAINS(jobs[r].act, "khub-test/comm 1.0.0 :: silu_and_mul");
        /* a prefill, NEW decode steps and khub_model_logits_all's prefill,
         * once per layer each */
        ASSERT_EQ(jobs[r].act_calls, (uint64_t)(2 + NEW) * LAYERS);
    }
}

/* A kernel swap under tp (issue 18 item 4): every rank switches at the
 * same step and the tokens stay tp 1's; a rank that cannot follow (plain
 * khub_model_tp_serve) makes rank 0's swap fail with that rank's reason,
 * every rank keeps its kernel, and the job goes on. */
static void swap_run(int mode, const tiny *t, rank_job *jobs)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-tp-swap-%d", (int)getpid());
    tiny_write(dir, t);
    const char *dirs[2] = {dir, NULL};
    swap_mode = mode;
    run_ranks(2, dirs, NULL, jobs);
    swap_mode = 0;
    tiny_rm(dir);
}

TEST_IMPL(tp2_kernel_swap_on_every_rank)
{
    tiny t = {6, 3, 128, 256, 0, 0};
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-test-tp-swap1-%d", (int)getpid());
    tiny_write(dir, &t);
    const char *dirs[2] = {dir, NULL};
    rank_job one[1], jobs[2];
    run_ranks(1, dirs, NULL, one);
    tiny_rm(dir);
    ASSERT_OK(one[0].serve_st);
    swap_run(1, &t, jobs);
    ASSERT_OK(jobs[0].swap_st);
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(jobs[r].serve_st);
        ASSERT_STR_EQ(jobs[r].act, "khub-test/comm 1.0.0 :: silu_and_mul");
        /* every step after it: the prefill, NEW decode steps and
         * khub_model_logits_all's prefill */
        ASSERT_EQ(jobs[r].act_calls, (uint64_t)(2 + NEW) * LAYERS);
    }
    for (int i = 0; i < NEW; i++) ASSERT_EQ(jobs[0].greedy[i], one[0].greedy[i]);

    swap_run(2, &t, jobs);
    ASSERT_STATUS(jobs[0].swap_st, KHUB_STATUS_UNSUPPORTED);
    ASSERT_STR_EQ(jobs[0].swap_msg,
                  "tp rank 1: kernel swap: this rank follows with khub_model_tp_serve, which "
                  "cannot swap kernels (khub_model_tp_serve_kernels can)");
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(jobs[r].serve_st); /* the job went on */
        ASSERT_STR_EQ(jobs[r].act, "khub/ref-cpu 0.1.0 :: silu_and_mul");
    }
    for (int i = 0; i < NEW; i++) ASSERT_EQ(jobs[0].greedy[i], one[0].greedy[i]);
}

#define TEST_LIST(X) \
    X(tp2_kernel_swap_on_every_rank) \
    X(tp2_uneven_gqa_groups_match_tp1) \
    X(tp2_plugin_collectives_through_the_host) \
    X(tp2_replicated_kv_head_matches_tp1) \
    X(tp4_qwen2_biases_match_tp1) \
    X(tp2_q8_0_matches_tp1) \
    X(tp3_kv_heads_not_dividing_refused) \
    X(tp3_ffn_not_dividing_refused) \
    X(tp3_vocab_not_dividing_refused) \
    X(tp2_split_inside_a_quant_block_refused) \
    X(tp2_mismatched_model_on_one_rank_refused) \
    X(tp_smollm2_ref_logits_match_tp1) \
    X(tp_smollm2_logits_match_tp1) \
    X(tp_gather_plan_matches_tp1) \
    X(tp3_gather_plan_hidden_not_dividing_refused) \
    X(tp_options_checked)
TEST_MAIN(TEST_LIST)
