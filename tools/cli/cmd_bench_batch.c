/*
 * cmd_bench_batch.c: `khub bench-batch`: continuous-batching throughput
 * (issue 13 item 8) through the public khub_batch.h API, after llama.cpp's
 * llama-batched-bench: for each count N, N requests of P prompt tokens and G
 * generated tokens (ignore_eos, greedy) are submitted at once to one batch
 * and run to the end. One JSON object per N goes to stdout: total generated
 * tokens per second by the wall clock (and by the process CPU clock divided
 * by the pool size, since a shared machine's wall clock also counts waiting
 * for a core), time to first token (mean, median, max), steps, the decode
 * phase alone (the steps that compute no prompt token: llama-batched-bench's
 * S_TG; see run_steps), and the peak RSS of the process so far (ru_maxrss
 * only grows: it is the largest N's).
 *
 * Prompts are distinct per request (token ids of a repeated text, shifted),
 * so no two requests share work. The model is loaded once with N's largest
 * value as max_seqs and P + G + 1 tokens of context, on the paged KV cache
 * unless --cache names another (or --tp runs it: then dynamic), with f16
 * K/V unless --kv-type f32: llama-batched-bench's default cache type
 * (-ctk/-ctv f16), as bench-model matches llama-bench's.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "khub/khub_batch.h"
#include "model_flags.h"
#include "tp_job.h"

#define MAX_COUNTS 8

static const khub_cli_cmd bench_batch_cmd;

typedef struct bb_args {
    const char *model;
    int counts[MAX_COUNTS], n_counts;
    int prompt_tokens, gen_tokens, threads, max_batch_tokens;
    int tp;              /* --tp N: ranks of an mpirun job (tp_job.h); 0 = one process */
    const char *cache;   /* --cache: "dynamic", "paged" or a plugin id ("org/name:op"); NULL =
                            paged, dynamic under --tp (khub run --prompts-file's choice) */
    khub_dtype kv_dtype; /* --kv-type; f16 by default (llama-batched-bench's) */
} bb_args;

static int int_arg(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi)
        return khub_cli_usage(&bench_batch_cmd, "%s needs an integer in [%d, %d], got '%s'", flag,
                              lo, hi, v ? v : "");
    *out = (int)x;
    return 0;
}

static int counts_arg(const char *v, bb_args *a)
{
    a->n_counts = 0;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", v ? v : "");
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (a->n_counts == MAX_COUNTS)
            return khub_cli_usage(&bench_batch_cmd, "--seqs takes at most %d counts", MAX_COUNTS);
        int rc = int_arg("--seqs", t, 1, 256, &a->counts[a->n_counts++]);
        if (rc) return rc;
    }
    return a->n_counts ? 0 : khub_cli_usage(&bench_batch_cmd, "--seqs needs a value");
}

static int parse(int argc, char **argv, bb_args *a)
{
    *a = (bb_args){.counts = {1, 8, 32, 64},
                   .n_counts = 4,
                   .prompt_tokens = 128,
                   .gen_tokens = 128,
                   .kv_dtype = KHUB_DTYPE_F16};
    for (int i = 1; i < argc; i += 2) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc;
        if (!v) return khub_cli_usage(&bench_batch_cmd, "%s needs a value", f);
        if (!strcmp(f, "--model")) {
            a->model = v;
            rc = 0;
        } else if (!strcmp(f, "--seqs"))
            rc = counts_arg(v, a);
        else if (!strcmp(f, "--prompt-tokens"))
            rc = int_arg(f, v, 1, 8192, &a->prompt_tokens);
        else if (!strcmp(f, "--gen-tokens"))
            rc = int_arg(f, v, 1, 8192, &a->gen_tokens);
        else if (!strcmp(f, "--threads"))
            rc = int_arg(f, v, 0, 1024, &a->threads);
        else if (!strcmp(f, "--max-batch-tokens"))
            rc = int_arg(f, v, 1, 65536, &a->max_batch_tokens);
        else if (!strcmp(f, "--tp"))
            rc = int_arg(f, v, 1, 4096, &a->tp);
        else if (!strcmp(f, "--cache")) {
            a->cache = v;
            rc = 0;
        } else if (!strcmp(f, "--kv-type"))
            rc = cli_kv_type(&bench_batch_cmd, v, &a->kv_dtype);
        else
            return khub_cli_usage(&bench_batch_cmd, "unknown option '%s'", f);
        if (rc) return rc;
    }
    if (!a->model) return khub_cli_usage(&bench_batch_cmd, "--model PATH is required");
    return 0;
}

static double now_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct bb_run {
    double ttft_ms[256];
    int n_done, failed;
    char error[KHUB_ERROR_SIZE];
} bb_run;

static void on_done(void *ud, uint64_t id, const khub_batch_result *r)
{
    (void)id;
    bb_run *s = ud;
    if (r->status != KHUB_STATUS_OK && !s->failed++)
        snprintf(s->error, sizeof s->error, "%s", r->error_full);
    s->ttft_ms[s->n_done++] = r->ttft_ms;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* The decode phase, llama-batched-bench's S_TG: the steps that compute no
 * prompt token (the tokens they generate, their wall and process CPU time).
 * A step that computes prompt tokens belongs to the prefill with the decode
 * rows it also carries (continuous batching mixes them): each request's
 * first token at least, as llama-batched-bench's prompt pass gives it. */
typedef struct bb_decode {
    int64_t steps, tokens;
    double wall_s, cpu_s;
} bb_decode;

/* khub_batch_run(b, 0), one step at a time, timing the steps without
 * prompt tokens into *dec. Returns the first failing step's status and
 * goes on after it, as khub_batch_run does. */
static khub_status run_steps(khub_batch *b, bb_decode *dec)
{
    khub_status first = KHUB_STATUS_OK;
    khub_batch_stats s0 = {KHUB_APP_INIT(khub_batch_stats)}, s1 = s0;
    khub_batch_stats_get(b, &s0);
    for (int64_t pending = 1; pending > 0; s0 = s1) {
        double w = now_s(CLOCK_MONOTONIC), c = now_s(CLOCK_PROCESS_CPUTIME_ID);
        khub_status st = khub_batch_step(b, &pending);
        w = now_s(CLOCK_MONOTONIC) - w, c = now_s(CLOCK_PROCESS_CPUTIME_ID) - c;
        if (st != KHUB_STATUS_OK && first == KHUB_STATUS_OK) first = st;
        khub_batch_stats_get(b, &s1);
        if (s1.prompt_tokens != s0.prompt_tokens || s1.generated_tokens == s0.generated_tokens)
            continue;
        dec->steps++;
        dec->tokens += s1.generated_tokens - s0.generated_tokens;
        dec->wall_s += w;
        dec->cpu_s += c;
    }
    return first;
}

/* N requests at once; prints one JSON line. */
static int run_count(khub_runtime *rt, khub_model *m, const bb_args *a, const int32_t *ids,
                     size_t n_ids, int n, int threads)
{
    khub_generate_opts o = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = a->gen_tokens,
                            .ignore_eos = 1};
    khub_batch_config cfg = {KHUB_APP_INIT(khub_batch_config), .max_seqs = n,
                             .max_batch_tokens = a->max_batch_tokens};
    khub_batch *b = NULL;
    if (khub_batch_new(m, &cfg, &b) != KHUB_STATUS_OK)
        return khub_cli_fail("bench-batch", "%s", khub_runtime_errmsg(rt));
    static bb_run s;
    memset(&s, 0, sizeof s);
    int32_t *p = malloc((size_t)a->prompt_tokens * sizeof *p);
    if (!p) abort();
    double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < a->prompt_tokens; k++) p[k] = ids[((size_t)k + (size_t)i) % n_ids];
        khub_batch_request q = {KHUB_APP_INIT(khub_batch_request),
                                .tokens = p,
                                .n_tokens = (size_t)a->prompt_tokens,
                                .opts = &o,
                                .on_done = on_done,
                                .ud = &s};
        if (khub_batch_submit(b, &q, NULL) != KHUB_STATUS_OK) {
            free(p);
            khub_batch_free(b);
            return khub_cli_fail("bench-batch", "%s", khub_last_error());
        }
    }
    free(p);
    bb_decode dec = {0};
    khub_status st = run_steps(b, &dec);
    double wall = now_s(CLOCK_MONOTONIC) - w0, cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    khub_batch_stats bs = {KHUB_APP_INIT(khub_batch_stats)};
    khub_batch_stats_get(b, &bs);
    khub_batch_free(b);
    if (st != KHUB_STATUS_OK || s.failed)
        return khub_cli_fail("bench-batch", "%d requests: %s", n,
                             s.failed ? s.error : "the run failed");
    qsort(s.ttft_ms, (size_t)s.n_done, sizeof s.ttft_ms[0], cmp_double);
    double sum = 0;
    for (int i = 0; i < s.n_done; i++) sum += s.ttft_ms[i];
    struct rusage ru;
    long rss = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
    double gen = (double)bs.generated_tokens;
    printf("{\"seqs\": %d, \"prompt_tokens\": %d, \"gen_tokens\": %d, \"threads\": %d, "
           "\"kv_type\": \"%s\", \"wall_s\": %.3f, \"gen_tok_s\": %.2f, \"gen_tok_s_cpu\": %.2f, "
           "\"total_tok_s\": %.2f, \"ttft_ms_mean\": %.1f, \"ttft_ms_median\": %.1f, "
           "\"ttft_ms_max\": %.1f, \"steps\": %lld, \"decode_steps\": %lld, "
           "\"decode_tokens\": %lld, \"decode_tok_s\": %.2f, \"decode_tok_s_cpu\": %.2f, "
           "\"peak_rss_kib\": %ld}\n",
           n, a->prompt_tokens, a->gen_tokens, threads,
           khub_dtype_id_of(a->kv_dtype) == KHUB_DTYPE_ID_F16 ? "f16" : "f32", wall, gen / wall,
           cpu > 0 ? gen / (cpu / threads) : 0, (gen + (double)bs.prompt_tokens) / wall,
           sum / s.n_done, s.ttft_ms[s.n_done / 2], s.ttft_ms[s.n_done - 1], (long long)bs.steps,
           (long long)dec.steps, (long long)dec.tokens,
           dec.wall_s > 0 ? (double)dec.tokens / dec.wall_s : 0,
           dec.cpu_s > 0 ? (double)dec.tokens / (dec.cpu_s / threads) : 0, rss);
    fflush(stdout);
    return 0;
}

static int pool_size(const khub_runtime *rt)
{
    const khub_feature *f = NULL;
    size_t n = 0;
    if (khub_runtime_features(rt, &f, &n) != KHUB_STATUS_OK) return 1;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(f[i].name, "threads")) return atoi(f[i].value);
    return 1;
}

/* The KV cache op of --cache: khub run's built-in names dynamic (the
 * executor's default, NULL) and paged, or a loaded plugin's id as given;
 * without --cache what `khub run --prompts-file` picks (docs/batching.md). */
static const char *cache_impl(const char *name, int tp)
{
    if (!name) name = tp > 1 ? "dynamic" : "paged";
    if (!strcmp(name, "dynamic")) return NULL;
    if (!strcmp(name, "paged")) return "khub/ref-cpu:paged_cache";
    return name;
}

/* --cache ID must name a loaded plugin (and, with ":op", one of its ops):
 * the library would warn and fall back to the dense cache, and the run
 * would time another cache than the one asked for. 0 when it does. */
static int check_cache_id(khub_runtime *rt, const char *id)
{
    if (!id || !strcmp(id, "khub/ref-cpu:paged_cache")) return 0;
    const char *colon = strchr(id, ':');
    size_t plen = colon ? (size_t)(colon - id) : strlen(id);
    for (size_t i = 0; i < khub_plugin_count(rt); i++) {
        const khub_plugin *p = khub_plugin_at(rt, i);
        const char *pid = khub_plugin_id(p);
        if (strlen(pid) != plen || strncmp(pid, id, plen)) continue;
        if (!colon) return 0;
        for (uint32_t k = 0; k < khub_plugin_op_count(p); k++)
            if (!strcmp(khub_plugin_op(p, k)->name, colon + 1)) return 0;
        return khub_cli_fail("bench-batch", "--cache %s: plugin %.*s has no op \"%s\"", id,
                             (int)plen, id, colon + 1);
    }
    return khub_cli_fail("bench-batch",
                         "--cache %s: no loaded plugin has that id; use dynamic, paged or a "
                         "loaded plugin's id (khub plugins lists them)",
                         id);
}

static int bench_batch(int argc, char **argv)
{
    if (khub_cli_wants_help(&bench_batch_cmd, argc, argv)) return 0;
    bb_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    int max_n = 1;
    for (int i = 0; i < a.n_counts; i++)
        if (a.counts[i] > max_n) max_n = a.counts[i];
    cli_tp_job job;
    if ((rc = cli_tp_begin(&job, "bench-batch", a.tp, 0)) != 0) return rc;
    khub_runtime *rt = khub_cli_runtime("bench-batch", a.threads);
    if (!rt) return cli_tp_end(&job, 1);
    if ((rc = check_cache_id(rt, cache_impl(a.cache, a.tp))) != 0) {
        khub_runtime_free(rt);
        return cli_tp_end(&job, rc);
    }
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts),
                          .max_seqs = max_n,
                          .max_context = a.prompt_tokens + a.gen_tokens + 1,
                          .kv_dtype = a.kv_dtype,
                          .max_batch = a.max_batch_tokens,
                          .cache_impl = cache_impl(a.cache, a.tp),
                          .tp_size = a.tp,
                          .comm = cli_tp_comm(&job)};
    khub_model *m = NULL;
    if (khub_model_load(rt, a.model, &mo, &m) != KHUB_STATUS_OK) {
        rc = khub_cli_fail("bench-batch", "%s", khub_runtime_errmsg(rt));
        khub_runtime_free(rt);
        return cli_tp_end(&job, rc);
    }
    if (job.comm.rank != 0) return cli_tp_end(&job, cli_tp_follow(&job, rt, m));
    static const char text[] = "The history of the printing press begins with movable type, "
                               "paper and ink, and the spread of books changed how people read.";
    int32_t ids[256];
    size_t n_ids = 0;
    if (khub_model_tokenize(m, text, 0, ids, 256, &n_ids) != KHUB_STATUS_OK || n_ids == 0) {
        for (n_ids = 0; n_ids < 200; n_ids++) ids[n_ids] = (int32_t)(100 + n_ids * 7);
    }
    for (int i = 0; i < a.n_counts && !rc; i++)
        rc = run_count(rt, m, &a, ids, n_ids, a.counts[i], pool_size(rt));
    cli_tp_abort_if(&job, rc);
    khub_model_free(m);
    khub_runtime_free(rt);
    return cli_tp_end(&job, rc);
}

static const khub_cli_cmd bench_batch_cmd = {
    "bench-batch", "continuous-batching throughput: N requests of P + G tokens",
    "usage: khub bench-batch --model PATH [options]\n"
    "\n"
    "Runs, for each N of --seqs, N requests of P prompt tokens and G generated tokens\n"
    "(greedy, past EOS) submitted at once to one continuous batch (khub_batch.h), as\n"
    "llama.cpp's llama-batched-bench does, and prints one JSON line per N: total\n"
    "generated tok/s over the whole run, prefill included (wall, and CPU-clock based),\n"
    "prompt+generated tok/s, time to first token (mean, median, max), forward steps and\n"
    "peak RSS, and the decode phase alone, llama-batched-bench's S_TG: decode_tok_s is\n"
    "the tokens generated by the steps that compute no prompt token over those steps'\n"
    "wall time (decode_tok_s_cpu: over their process CPU time / threads; decode_steps,\n"
    "decode_tokens: how many). A step that computes prompt tokens is prefill, with the\n"
    "decode rows it carries too (each request's first token at least). The KV cache\n"
    "stores f16 K/V, as llama-batched-bench's does by default (-ctk/-ctv f16);\n"
    "--kv-type f32 for khub run's default.\n"
    "\n"
    "Options:\n"
    "  --model PATH           .gguf file or Hugging Face folder\n"
    "  --seqs N,N,...         request counts (default 1,8,32,64)\n"
    "  --prompt-tokens P      prompt length (default 128)\n"
    "  --gen-tokens G         tokens generated per request (default 128)\n"
    "  --max-batch-tokens N   tokens per forward step (default 256)\n"
    "  --threads N            worker threads (default: all cores)\n"
    "  --cache NAME           KV cache: paged (default; dynamic with --tp), dynamic, or a\n"
    "                         loaded plugin's id (org/name:op)\n"
    "  --kv-type TYPE         K/V storage: f16 (default) or f32\n"
    "  --tp N                 tensor parallelism over N MPI ranks: mpirun -np N khub\n"
    "                         bench-batch --tp N ...; rank 0 schedules and prints\n"
    "                         (docs/parallelism.md)\n"
    "  --help                 print this help\n",
    bench_batch};

KHUB_CLI_COMMAND(bench_batch_cmd)
