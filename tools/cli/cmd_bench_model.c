/*
 * cmd_bench_model.c: `khub bench-model`: llama-bench's two tests on one
 * model through the public khub_model.h API, so the two can be compared
 * side by side (tools/bench.sh interleaves them).
 *
 *   ppN  prefill: N random token ids as one fresh sequence in one forward
 *        call (khub_model_logits; the KV cache and the ubatch both hold N,
 *        like llama-bench's -p N with -ub 512);
 *   tgN  decode: N greedy tokens, one forward step each, after a one-token
 *        prompt (khub_model_generate with ignore_eos; its decode_tok_s).
 *
 * Both are repeated --reps times after one untimed warm-up of each, as
 * llama-bench does. The KV cache is f16, as llama-bench's default. One JSON
 * object per (test, threads) goes to stdout, with every sample as tok/s by
 * the wall clock and by the process CPU clock (tokens / (CPU seconds /
 * threads)), because on a shared 2-core machine the wall clock also counts
 * the time spent waiting for a core.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "khub/khub_model.h"
#include "tp_job.h"

#define MAX_REPS    64
#define MAX_TCOUNTS 8

static const khub_cli_cmd bench_model_cmd;

typedef struct bench_args {
    const char *model;
    int pp, tg, reps;
    int threads[MAX_TCOUNTS];
    int n_threads;
    int tp; /* --tp N: ranks of an mpirun job (tp_job.h); 0 = one process */
} bench_args;

typedef struct samples {
    double wall[MAX_REPS]; /* tok/s */
    double cpu[MAX_REPS];  /* tok/s by CPU time per thread */
    int n;
    double comm_share; /* under --tp: rank 0's share of the timed reps' wall time in collectives */
} samples;

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || v < lo || v > hi)
        return khub_cli_usage(&bench_model_cmd, "%s needs an integer in [%d, %d], got '%s'", flag,
                              lo, hi, s ? s : "");
    *out = (int)v;
    return 0;
}

static int parse_threads(const char *s, bench_args *a)
{
    a->n_threads = 0;
    while (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 256 || (*end && *end != ',') || a->n_threads == MAX_TCOUNTS)
            return khub_cli_usage(&bench_model_cmd,
                                  "--threads wants up to %d counts in "
                                  "[1, 256] like 1,2; got '%s'",
                                  MAX_TCOUNTS, s);
        a->threads[a->n_threads++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return a->n_threads ? 0 : khub_cli_usage(&bench_model_cmd, "--threads needs a value");
}

static int parse(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.pp = 512, .tg = 128, .reps = 5, .threads = {1}, .n_threads = 1};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc;
        if (!v) return khub_cli_usage(&bench_model_cmd, "%s needs a value", f);
        if (!strcmp(f, "--model")) {
            a->model = v;
            rc = 0;
        } else if (!strcmp(f, "--prompt-tokens") || !strcmp(f, "-p")) {
            rc = parse_int(f, v, 0, 1 << 16, &a->pp);
        } else if (!strcmp(f, "--gen-tokens") || !strcmp(f, "-n")) {
            rc = parse_int(f, v, 0, 1 << 16, &a->tg);
        } else if (!strcmp(f, "--reps") || !strcmp(f, "-r")) {
            rc = parse_int(f, v, 1, MAX_REPS, &a->reps);
        } else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
            rc = parse_threads(v, a);
        } else if (!strcmp(f, "--tp")) {
            rc = parse_int(f, v, 1, 4096, &a->tp);
        } else {
            return khub_cli_usage(&bench_model_cmd, "unknown option '%s'", f);
        }
        if (rc) return rc;
        i++;
    }
    if (!a->model) return khub_cli_usage(&bench_model_cmd, "--model PATH is required");
    if (!a->pp && !a->tg)
        return khub_cli_usage(&bench_model_cmd, "nothing to do: --prompt-tokens and "
                                                "--gen-tokens are both 0");
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The two tests                                                            */
/* ------------------------------------------------------------------------ */

/* One prefill of ids[n]; returns 0 and the rates, or 1 after printing why. */
static int run_pp(khub_runtime *rt, khub_model *m, const int32_t *ids, int n, int threads,
                  float *logits, double *wall, double *cpu)
{
    double w0 = wall_s(), c0 = cpu_s();
    if (khub_model_logits(m, ids, (size_t)n, logits) != KHUB_STATUS_OK)
        return khub_cli_fail("bench-model", "prefill: %s", khub_runtime_errmsg(rt));
    double w = wall_s() - w0, c = cpu_s() - c0;
    *wall = n / w;
    *cpu = n / (c / threads);
    return 0;
}

/* One decode of n tokens. The CPU time of the call is split between its
 * one-token prefill and the decode by their wall times. */
static int run_tg(khub_runtime *rt, khub_model *m, int n, int threads, double *wall, double *cpu)
{
    static const char *const prompt[1] = {"Hello"};
    khub_generate_opts go = {KHUB_STRUCT_INIT(khub_generate_opts), .max_new_tokens = n,
                             .ignore_eos = 1};
    khub_generate_result r = {KHUB_STRUCT_INIT(khub_generate_result)};
    double c0 = cpu_s();
    khub_status st = khub_model_generate(m, prompt, 1, &go, &r);
    double c = cpu_s() - c0;
    int rc = 0;
    if (st != KHUB_STATUS_OK || r.decode_ms <= 0) {
        rc = khub_cli_fail("bench-model", "decode: %s",
                           st != KHUB_STATUS_OK ? khub_runtime_errmsg(rt)
                                                : "no decode steps were timed");
    } else {
        *wall = r.decode_tok_s;
        double share = r.decode_ms / (r.decode_ms + r.prefill_ms);
        *cpu = r.decode_tok_s * (r.decode_ms / 1000.0) / (c * share / threads);
    }
    khub_generate_results_free(m, &r, 1);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Output                                                                   */
/* ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double s[MAX_REPS];
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

static void print_list(const char *key, const double *v, int n)
{
    printf(",\"%s\":[", key);
    for (int i = 0; i < n; i++) printf("%s%.3f", i ? "," : "", v[i]);
    printf("]");
}

static void print_result(const char *test, int n_tok, int threads, const samples *s, double load_ms,
                         const khub_model_info *info)
{
    struct rusage ru;
    long rss = getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1;
    /* Shape figures for the physical bounds: multiply-adds per token in the
     * layers' projections (the lm_head runs once per sequence step), and the
     * f16 K+V bytes one cached position adds. */
    double hd = info->head_dim, q = info->n_heads * hd, kv = info->n_kv_heads * hd;
    double layer_macs =
        info->hidden * (q + 2 * kv) + q * info->hidden + 3.0 * info->hidden * info->ffn;
    printf("{\"impl\":\"khub\",\"test\":\"%s%d\",\"threads\":%d,\"n_tokens\":%d,"
           "\"median_ts\":%.3f,\"median_cpu_ts\":%.3f,\"load_ms\":%.1f,"
           "\"weight_bytes\":%llu,\"n_params\":%llu,\"layer_macs_per_token\":%.0f,"
           "\"head_macs\":%.0f,\"attn_macs_per_pair\":%.0f,\"kv_bytes_per_pos\":%.0f,"
           "\"peak_rss_kib\":%ld",
           test, n_tok, threads, n_tok, median(s->wall, s->n), median(s->cpu, s->n), load_ms,
           (unsigned long long)info->weight_bytes, (unsigned long long)info->n_params,
           layer_macs * info->n_layers, (double)info->hidden * info->vocab,
           2.0 * info->n_heads * hd * info->n_layers, 2.0 * 2 * kv * info->n_layers, rss);
    if (info->tp_size > 1) /* the shape figures above are then rank 0's part */
        printf(",\"tp\":%d,\"tp_comm_share\":%.4f", (int)info->tp_size, s->comm_share);
    print_list("samples_ts", s->wall, s->n);
    print_list("samples_cpu_ts", s->cpu, s->n);
    printf("}\n");
    fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* Driver                                                                   */
/* ------------------------------------------------------------------------ */

/* Rank 0's time in collectives so far, in seconds (0 without --tp). */
static double comm_s(const khub_model *m)
{
    khub_model_info i = {KHUB_STRUCT_INIT(khub_model_info)};
    return khub_model_info_get(m, &i) == KHUB_STATUS_OK ? (double)i.tp_comm_ns / 1e9 : 0;
}

/* The timed reps of one test (ids: prefill, NULL: decode); the warm-up has run. */
static int time_test(khub_runtime *rt, khub_model *m, const bench_args *a, const int32_t *ids,
                     int threads, float *logits, samples *s)
{
    int rc = 0;
    double w0 = wall_s(), c0 = comm_s(m);
    for (s->n = 0; !rc && s->n < a->reps; s->n++)
        rc = ids ? run_pp(rt, m, ids, a->pp, threads, logits, &s->wall[s->n], &s->cpu[s->n])
                 : run_tg(rt, m, a->tg, threads, &s->wall[s->n], &s->cpu[s->n]);
    s->comm_share = (comm_s(m) - c0) / (wall_s() - w0);
    return rc;
}

static int bench_threads(const bench_args *a, const cli_tp_job *job, int threads)
{
    khub_runtime *rt = khub_cli_runtime("bench-model", threads);
    if (!rt) return 1;
    int pp = a->pp > 0 ? a->pp : 1;
    khub_model_opts mo = {KHUB_STRUCT_INIT(khub_model_opts),
                          .kv_dtype = KHUB_DTYPE_F16,
                          .max_batch = pp < 16 ? 16 : pp,
                          .max_seqs = 1,
                          .max_context = (int64_t)pp + a->tg + 16,
                          .tp_size = a->tp,
                          .comm = cli_tp_comm(job)};
    khub_model *m = NULL;
    khub_model_info info = {KHUB_STRUCT_INIT(khub_model_info)};
    int32_t *ids = NULL;
    float *logits = NULL;
    int rc = 0;
    if (khub_model_load(rt, a->model, &mo, &m) != KHUB_STATUS_OK ||
        khub_model_info_get(m, &info) != KHUB_STATUS_OK) {
        rc = khub_cli_fail("bench-model", "%s", khub_runtime_errmsg(rt));
        goto done;
    }
    if (job->comm.rank != 0) return cli_tp_follow(job, rt, m);
    ids = malloc(sizeof *ids * (size_t)pp);
    logits = malloc(sizeof *logits * (size_t)info.vocab);
    if (!ids || !logits) {
        rc = khub_cli_fail("bench-model", "out of memory for %d ids and %d logits", pp,
                           (int)info.vocab);
        goto done;
    }
    uint32_t x = 12345u; /* fixed pseudo-random ids, like llama-bench's rand() % vocab */
    for (int i = 0; i < pp; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)((x >> 8) % (uint32_t)info.vocab);
    }
    samples s;
    double w, c;
    if (a->pp) {
        rc = run_pp(rt, m, ids, a->pp, threads, logits, &w, &c); /* warm-up */
        if (!rc) rc = time_test(rt, m, a, ids, threads, logits, &s);
        if (!rc) print_result("pp", a->pp, threads, &s, info.load_ms, &info);
    }
    if (a->tg && !rc) {
        rc = run_tg(rt, m, a->tg, threads, &w, &c);
        if (!rc) rc = time_test(rt, m, a, NULL, threads, logits, &s);
        if (!rc) print_result("tg", a->tg, threads, &s, info.load_ms, &info);
    }
done:
    cli_tp_abort_if(job, rc);
    free(ids);
    free(logits);
    khub_model_free(m);
    khub_runtime_free(rt);
    return rc;
}

static int bench_model(int argc, char **argv)
{
    if (khub_cli_wants_help(&bench_model_cmd, argc, argv)) return 0;
    bench_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    cli_tp_job job;
    if ((rc = cli_tp_begin(&job, "bench-model", a.tp, 0)) != 0) return rc;
    /* Every rank loads the model once per thread count, in the same order. */
    for (int t = 0; !rc && t < a.n_threads; t++) rc = bench_threads(&a, &job, a.threads[t]);
    return cli_tp_end(&job, rc);
}

static const khub_cli_cmd bench_model_cmd = {
    "bench-model", "time prefill and decode of a model (llama-bench's pp/tg tests)",
    "usage: khub bench-model --model PATH [options]\n"
    "\n"
    "Times llama-bench's two tests through khub's model API: ppN, one prefill of N\n"
    "random token ids, and tgN, N greedy decode steps after a one-token prompt.\n"
    "Each runs once untimed, then --reps times. The KV cache is f16. Prints one\n"
    "JSON object per test and thread count: median and samples in tokens/s by the\n"
    "wall clock and by CPU time per thread, load time, weight bytes, peak RSS.\n"
    "\n"
    "Options:\n"
    "  --model PATH             .gguf file or Hugging Face model folder\n"
    "  -p, --prompt-tokens N    prefill length (default 512; 0 = skip)\n"
    "  -n, --gen-tokens N       decode length (default 128; 0 = skip)\n"
    "  -t, --threads LIST       thread counts, e.g. 1,2 (default 1)\n"
    "  -r, --reps N             timed repetitions (default 5)\n"
    "  --tp N                   tensor parallelism over N MPI ranks: mpirun -np N khub\n"
    "                           bench-model --tp N ...; rank 0 prints, adding \"tp\" and\n"
    "                           \"tp_comm_share\" (its share of the timed wall time in\n"
    "                           collectives) (docs/parallelism.md)\n"
    "  --help                   print this help\n",
    bench_model};

KHUB_CLI_COMMAND(bench_model_cmd)
