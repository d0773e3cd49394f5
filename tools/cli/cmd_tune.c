/*
 * cmd_tune.c: `khub tune`, the optimization advisor: a thin shell over
 * khub_tune.h (libkhub_tune). It parses the flags, reads the workload,
 * draws the progress line, prints the report and saves the khub.json; when
 * that names kernels by Hub ID, it also pins them in a khub.lock beside it
 * (khub_project.h, as `khub lock` does), so the recommendation runs from
 * verified, pinned builds.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "khub/khub_project.h"
#include "khub/khub_tune.h"

static const khub_cli_cmd tune_cmd;

typedef struct tune_args {
    khub_tune_opts o;
    const char *workload, *save;
    int json, markdown;
} tune_args;

/* SIZE: bytes, or a number with K, M, G (binary units, optional "iB"). */
static int size_arg(const char *v, uint64_t *out)
{
    char *end = NULL;
    double x = v ? strtod(v, &end) : -1;
    double mul = 1;
    if (end && (*end == 'K' || *end == 'k'))
        mul = 1024, end++;
    else if (end && (*end == 'M' || *end == 'm'))
        mul = 1048576, end++;
    else if (end && (*end == 'G' || *end == 'g'))
        mul = 1073741824, end++;
    if (end && mul > 1 && !strcmp(end, "iB")) end += 2;
    if (!v || !*v || !end || *end || !(x > 0 && x * mul <= 1e18)) /* NaN fails too */
        return khub_cli_usage(&tune_cmd, "--max-memory needs a size such as 512M or 2G, got '%s'",
                              v ? v : "");
    *out = (uint64_t)(x * mul);
    return 0;
}

static int num_arg(const char *f, const char *v, double lo, double hi, double *out)
{
    char *end = NULL;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || !(x >= lo && x <= hi)) /* NaN fails too */
        return khub_cli_usage(&tune_cmd, "%s needs a number in [%g, %g], got '%s'", f, lo, hi,
                              v ? v : "");
    *out = x;
    return 0;
}

static int parse(int argc, char **argv, tune_args *a)
{
    memset(a, 0, sizeof *a);
    a->o = (khub_tune_opts){KHUB_APP_INIT(khub_tune_opts), .goal = KHUB_TUNE_GOAL_LATENCY};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d = 0;
        int rc = 0;
        if (!strcmp(f, "--json") || !strcmp(f, "--markdown")) {
            *(f[2] == 'j' ? &a->json : &a->markdown) = 1;
            continue;
        }
        if (!v) return khub_cli_usage(&tune_cmd, "%s needs a value", f);
        if (!strcmp(f, "--model"))
            a->o.model = v;
        else if (!strcmp(f, "--workload"))
            a->workload = v;
        else if (!strcmp(f, "--save"))
            a->save = v;
        else if (!strcmp(f, "--kernels-from"))
            a->o.kernels_from = v;
        else if (!strcmp(f, "--levers"))
            a->o.levers = v;
        else if (!strcmp(f, "--inject-failure"))
            a->o.fail_candidate = v;
        else if (!strcmp(f, "--goal")) {
            if (!strcmp(v, "latency"))
                a->o.goal = KHUB_TUNE_GOAL_LATENCY;
            else if (!strcmp(v, "throughput"))
                a->o.goal = KHUB_TUNE_GOAL_THROUGHPUT;
            else if (!strcmp(v, "memory"))
                a->o.goal = KHUB_TUNE_GOAL_MEMORY;
            else
                return khub_cli_usage(&tune_cmd,
                                      "--goal is latency, throughput or memory, got '%s'", v);
        } else if (!strcmp(f, "--max-memory"))
            rc = size_arg(v, &a->o.max_memory);
        else if (!strcmp(f, "--min-quality"))
            rc = num_arg(f, v, 0, 1, &a->o.min_quality);
        else if (!strcmp(f, "--time-budget"))
            rc = num_arg(f, v, 1, 86400, &a->o.time_budget_s);
        else if (!strcmp(f, "--baseline-runs")) {
            rc = num_arg(f, v, 2, 20, &d);
            a->o.baseline_runs = (int32_t)d;
        } else if (!strcmp(f, "--tp")) {
            rc = num_arg(f, v, 2, 64, &d);
            a->o.tp_size = (int32_t)d;
        } else
            return khub_cli_usage(&tune_cmd, "unknown option '%s'", f);
        if (rc) return rc;
        i++;
    }
    if (!a->o.model) return khub_cli_usage(&tune_cmd, "--model PATH is required");
    if (a->json && a->markdown)
        return khub_cli_usage(&tune_cmd, "--json and --markdown exclude each other");
    return 0;
}

/* The progress line on a terminal: which run of how many, and what. */
static void on_progress(void *ud, int32_t done, int32_t total, const char *label)
{
    (void)ud;
    int width = 20, fill = total > 0 ? (int)((int64_t)done * width / total) : width;
    fprintf(stderr, "\rtune [%.*s%*s] %d/%d %-40.40s", fill, "####################", width - fill,
            "", (int)done, (int)total, label);
    if (done >= total) fputs("\r\033[K", stderr);
    fflush(stderr);
}

static int save(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        if (f) fclose(f);
        return khub_cli_fail("tune", "cannot write %s", path);
    }
    return 0;
}

/* The lock beside the saved khub.json: NAME.json -> NAME.lock, else
 * PATH.lock. */
static void lock_path(const char *json, char *buf, size_t n)
{
    size_t len = strlen(json);
    if (len > 5 && !strcmp(json + len - 5, ".json"))
        snprintf(buf, n, "%.*s.lock", (int)(len - 5), json);
    else
        snprintf(buf, n, "%s.lock", json);
}

/* Whether a kernel the saved khub.json names ("org/name[@REV][:op]") is a
 * built-in plugin (attention=khub/cpu-avx2 can win): loaded, never
 * fetched, so nothing to pin. */
static int names_builtin(const char *text)
{
    khub_hub_id id;
    char repo[200];
    if (khub_hub_id_parse(text, &id, NULL, 0) != KHUB_STATUS_OK) return 0;
    snprintf(repo, sizeof repo, "%s/%s", id.org, id.name);
    return khub_cli_is_builtin_plugin(repo);
}

/* Pins every Hub kernel that the saved khub.json at path names into its
 * lock (khub_lock_kernel: resolved, downloaded and every file's digest
 * recorded), through the hub at endpoint (NULL = HF_ENDPOINT's or the
 * default). Nothing is written when it names none but built-in plugins.
 * Exit code. */
static int save_lock(const char *path, const char *endpoint)
{
    char err[KHUB_ERROR_SIZE], lpath[4096];
    khub_mapping *m = NULL;
    if (khub_mapping_load(path, &m, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("tune", "the saved %s: %s", path, err);
    lock_path(path, lpath, sizeof lpath);
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .endpoint = endpoint};
    khub_hub *hub = NULL;
    khub_lock *lock = NULL;
    int rc = 0;
    size_t n = 0; /* Hub kernels pinned */
    if (khub_hub_new(&ho, &hub) != KHUB_STATUS_OK || khub_lock_new(&lock) != KHUB_STATUS_OK)
        rc = khub_cli_fail("tune", "locking %s: %s", path, khub_last_error());
    for (size_t i = 0; i < khub_mapping_kernel_count(m) && !rc; i++) {
        const char *text = khub_mapping_kernel(m, i);
        khub_hub_id id;
        khub_lock_opts lo = {KHUB_APP_INIT(khub_lock_opts)};
        khub_lock_result lr = {KHUB_APP_INIT(khub_lock_result)};
        if (names_builtin(text)) continue;
        if (khub_hub_id_parse(text, &id, err, sizeof err) != KHUB_STATUS_OK)
            rc = khub_cli_fail("tune", "locking %s: %s", path, err);
        else if (khub_lock_kernel(hub, lock, &id, &lo, &lr) != KHUB_STATUS_OK)
            rc = khub_cli_fail("tune",
                               "locking %s: %s: %s (the khub.json is saved, the lock is "
                               "not)",
                               path, text, khub_hub_errmsg(hub));
        else {
            fprintf(stderr, "tune: locked %s -> %s\n", lr.pin.repo, lr.pin.commit);
            n++;
        }
    }
    if (!rc && n && khub_lock_save(lock, lpath, err, sizeof err) != KHUB_STATUS_OK)
        rc = khub_cli_fail("tune", "%s", err);
    if (!rc && n) fprintf(stderr, "tune: wrote %s (%zu kernel%s)\n", lpath, n, n == 1 ? "" : "s");
    khub_lock_free(lock);
    khub_hub_free(hub);
    khub_mapping_free(m);
    return rc;
}

/* The parallelism lever's rank program: this khub (`khub tune-rank`, on
 * tp_job.c's lifecycle) when it was built with MPI. */
static void tp_program(khub_tune_opts *o, char *buf, size_t n)
{
#ifdef KHUB_WITH_MPI
    ssize_t len = readlink("/proc/self/exe", buf, n - 1);
    if (len > 0) {
        buf[len] = '\0';
        o->tp_rank_program = buf;
        return;
    }
    o->tp_unavailable = "the path of this khub (/proc/self/exe) is unreadable, so mpirun cannot "
                        "start it as the ranks";
#else
    (void)buf, (void)n;
    o->tp_unavailable = "this khub was built without MPI (install libopenmpi-dev, "
                        "tools/install-deps.sh, and configure again)";
#endif
}

static int tune(int argc, char **argv)
{
    if (khub_cli_wants_help(&tune_cmd, argc, argv)) return 0;
    tune_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    char err[KHUB_ERROR_SIZE];
    khub_tune_workload *w = NULL;
    if (a.workload && khub_tune_workload_read(a.workload, &w, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("tune", "%s", err);
    a.o.workload = w;
    if (isatty(2)) a.o.progress = on_progress;
    char self[4096];
    tp_program(&a.o, self, sizeof self);
    khub_tune_report *r = NULL;
    khub_status st = khub_tune_run(&a.o, &r, err, sizeof err);
    khub_tune_workload_free(w);
    if (st != KHUB_STATUS_OK) return khub_cli_fail("tune", "%s", err);
    const char *text = khub_tune_report_render(r, a.json       ? KHUB_TUNE_FORMAT_JSON
                                                  : a.markdown ? KHUB_TUNE_FORMAT_MARKDOWN
                                                               : KHUB_TUNE_FORMAT_TEXT);
    if (!text)
        rc = khub_cli_fail("tune", "out of memory rendering the report");
    else
        fputs(text, stdout);
    if (!rc && a.save) rc = save(a.save, khub_tune_report_khub_json(r));
    const char *from = a.o.kernels_from;
    if (!rc && a.save) rc = save_lock(a.save, from && strstr(from, "://") ? from : NULL);
    khub_tune_report_free(r);
    return rc;
}

static const khub_cli_cmd tune_cmd = {
    "tune", "measure one change at a time on a workload and recommend a configuration",
    "usage: khub tune --model PATH [options]\n"
    "\n"
    "Measures a baseline (twice or more: its spread is the noise), names the\n"
    "bottleneck, then tries each compatible change alone on the same workload\n"
    "(attention plugin, quantization at load, KV cache, threads, batch tokens,\n"
    "kernels from --kernels-from, --tp ranks under mpirun), then the winners\n"
    "together, each in a child process of its own. Reports peak RSS (per rank\n"
    "for --tp), time to first token, per-token latency, throughput, greedy token\n"
    "agreement with the baseline and perplexity on a held-out text, and\n"
    "recommends only measured changes (docs/tune.md).\n"
    "\n"
    "Options:\n"
    "  --model PATH           .gguf file or Hugging Face model folder\n"
    "  --workload FILE        JSONL: {\"prompt\": \"...\", \"max_tokens\": N} per line and\n"
    "                         one {\"concurrency\": N} (default: a built-in mixed workload)\n"
    "  --goal G               latency (default), throughput or memory\n"
    "  --max-memory SIZE      peak RSS allowed, e.g. 512M, 2G\n"
    "  --min-quality X        least greedy token agreement, 0..1 (default 0.9)\n"
    "  --kernels-from SRC     a khub.json, or a hub endpoint URL to try Hub kernels from\n"
    "  --time-budget S        seconds for the whole run (default 600)\n"
    "  --baseline-runs N      baseline repetitions for the noise (default 2)\n"
    "  --tp N                 ranks for the parallelism lever, measured under mpirun\n"
    "                         (default 2)\n"
    "  --levers LIST          only these levers, comma-separated: attention,\n"
    "                         quantization, cache, threads, batching, kernels,\n"
    "                         parallelism (default: all)\n"
    "  --save FILE            write the recommended khub.json to FILE; when it names\n"
    "                         Hub kernels, also pin them in FILE's .lock (khub lock)\n"
    "  --json, --markdown     the report as JSON or Markdown (default: a table)\n"
    "  --inject-failure NAME  make candidate NAME crash, hang with NAME:hang, or its\n"
    "                         workload 3 s slower with NAME:slow or baseline:slow (tests)\n"
    "  --help                 print this help\n",
    tune};

KHUB_CLI_COMMAND(tune_cmd)
