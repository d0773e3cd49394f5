/*
 * cmd_bench.c: `khub bench --latency ID`, the cost of getting a cached,
 * pinned kernel ready to load: khub_hub_resolve plus khub_hub_variant_files
 * (every file of the chosen variant re-hashed against metadata.json), timed
 * in-process over N iterations. This is what every khub_kernel_fetch pays
 * before dlopen when the cache is warm.
 *
 * Not done here yet: the op micro-benchmarks of a kernel repo against
 * khub/ref-cpu (`khub bench ID|DIR`); `khub bench-ops` covers the built-in
 * plugins.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "khub/khub_hub.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of sorted v by the nearest rank. */
static double quantile(const double *v, size_t n, double q)
{
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

typedef struct lat_args {
    const char *id_text;
    long iterations;
    int json;
} lat_args;

/* Times resolve + variant_files `iterations` times; prints the summary. */
static int bench_latency(const lat_args *a)
{
    char err[KHUB_ERROR_SIZE], commit[41];
    khub_hub_id id;
    khub_hub *hub = NULL;
    if (khub_hub_id_parse(a->id_text, &id, err, sizeof err) != KHUB_STATUS_OK)
        return khub_cli_fail("bench", "%s", err);
    if (khub_hub_new(NULL, &hub) != KHUB_STATUS_OK)
        return khub_cli_fail("bench", "%s", khub_last_error());
    khub_hub_variant_list *vl = NULL;
    int rc = 0;
    if (khub_hub_resolve(hub, &id, commit) != KHUB_STATUS_OK ||
        khub_hub_variants(hub, &id, commit, &vl) != KHUB_STATUS_OK) {
        rc = khub_cli_fail("bench", "%s", khub_hub_errmsg(hub));
        goto done;
    }
    if (!vl->best) {
        rc = khub_cli_fail("bench", "%s has no %svariant for this machine (download it "
                           "first: khub download %s; see khub variants)", a->id_text,
                           khub_hub_is_offline(hub) ? "cached " : "", a->id_text);
        goto done;
    }
    double *t = calloc((size_t)a->iterations, sizeof *t);
    double *tr = calloc((size_t)a->iterations, sizeof *tr);
    uint64_t bytes = 0, reqs0 = khub_hub_request_count(hub);
    size_t n_files = 0;
    for (long i = 0; t && tr && i < a->iterations; i++) {
        khub_hub_file_list *fl = NULL;
        double t0 = now_s();
        khub_status st = khub_hub_resolve(hub, &id, commit);
        double t1 = now_s();
        if (st == KHUB_STATUS_OK) st = khub_hub_variant_files(hub, &id, commit, vl->best, &fl);
        double t2 = now_s();
        if (st != KHUB_STATUS_OK) {
            rc = khub_cli_fail("bench", "iteration %ld: %s (download it first: khub download "
                               "%s)", i, khub_hub_errmsg(hub), a->id_text);
            break;
        }
        if (i == 0) {
            n_files = fl->count;
            for (size_t k = 0; k < fl->count; k++) {
                struct stat sb;
                if (stat(fl->items[k].path, &sb) == 0) bytes += (uint64_t)sb.st_size;
            }
        }
        khub_hub_file_list_free(fl);
        t[i] = (t2 - t0) * 1e6;
        tr[i] = (t1 - t0) * 1e6;
    }
    if (!t || !tr) rc = khub_cli_fail("bench", "out of memory");
    if (rc == 0) {
        size_t n = (size_t)a->iterations;
        qsort(t, n, sizeof *t, cmp_double);
        qsort(tr, n, sizeof *tr, cmp_double);
        uint64_t reqs = khub_hub_request_count(hub) - reqs0;
        if (a->json)
            printf("{\"what\":\"hub_latency\",\"id\":\"%s\",\"commit\":\"%s\",\"variant\":\"%s\","
                   "\"iterations\":%zu,\"files\":%zu,\"bytes_hashed\":%llu,\"median_us\":%.1f,"
                   "\"p90_us\":%.1f,\"resolve_median_us\":%.2f,\"requests\":%llu}\n",
                   a->id_text, commit, vl->best, n, n_files, (unsigned long long)bytes,
                   quantile(t, n, 0.5), quantile(t, n, 0.9), quantile(tr, n, 0.5),
                   (unsigned long long)reqs);
        else
            printf("%s @%.12s %s: %zu iterations, %zu files, %llu bytes hashed per call\n"
                   "resolve + verify: median %.1f us, p90 %.1f us (resolve alone: median "
                   "%.2f us); %llu requests\n",
                   a->id_text, commit, vl->best, n, n_files, (unsigned long long)bytes,
                   quantile(t, n, 0.5), quantile(t, n, 0.9), quantile(tr, n, 0.5),
                   (unsigned long long)reqs);
    }
    free(t);
    free(tr);
done:
    khub_hub_variant_list_free(vl);
    khub_hub_free(hub);
    return rc;
}

static const khub_cli_cmd bench_cmd;

static int run_bench(int argc, char **argv)
{
    if (khub_cli_wants_help(&bench_cmd, argc, argv)) return 0;
    lat_args a = {NULL, 1000, 0};
    int latency = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--latency")) latency = 1;
        else if (!strcmp(argv[i], "--json")) a.json = 1;
        else if ((!strcmp(argv[i], "-n") || !strcmp(argv[i], "--iterations")) && i + 1 < argc)
            a.iterations = strtol(argv[++i], NULL, 10);
        else if (argv[i][0] == '-') return khub_cli_usage(&bench_cmd, "unknown option %s", argv[i]);
        else if (!a.id_text) a.id_text = argv[i];
        else return khub_cli_usage(&bench_cmd, "unexpected argument %s", argv[i]);
    }
    if (!a.id_text) return khub_cli_usage(&bench_cmd, "missing Hub ID (org/name[@rev])");
    if (a.iterations < 1 || a.iterations > 10000000)
        return khub_cli_usage(&bench_cmd, "-n must be between 1 and 10000000");
    if (!latency)
        return khub_cli_usage(&bench_cmd, "op micro-benchmarks of a kernel repo are not "
                                          "implemented yet; use --latency, or khub bench-ops "
                                          "for the built-in plugins");
    return bench_latency(&a);
}

static const khub_cli_cmd bench_cmd = {
    "bench", "time resolving and verifying a cached kernel (--latency)",
    "usage: khub bench --latency ID [-n N] [--json]\n\n"
    "Times khub_hub_resolve + khub_hub_variant_files (every file of the best\n"
    "variant re-hashed against metadata.json) N times (default 1000) on a kernel\n"
    "already in the cache, and prints the median and p90 in microseconds. Pin the\n"
    "commit (org/name@<40hex>) to time what a locked load pays; a branch costs a\n"
    "request per iteration unless HF_HUB_OFFLINE=1.\n",
    run_bench};
KHUB_CLI_COMMAND(bench_cmd)
