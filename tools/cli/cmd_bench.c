/*
 * cmd_bench.c: two benchmarks of a kernel.
 *
 * `khub bench ID|DIR`: each op of a kernel next to khub/ref-cpu's op of the
 * same kind, on the kernel's declared self-test shapes (kernel.json
 * "selftests" for a built source tree DIR) or, for a Hub ID, one shape per
 * kind. The inputs are the self-tests' and the clock a median of 15 short
 * rounds (khub_op_bench, khub_check.h). A DIR's variant for this machine is
 * verified against its metadata.json and loaded with its digest
 * (khub_kernel_dir_load); an ID goes through khub_kernel_fetch (resolve,
 * verify, trust, load).
 *
 * `khub bench --latency ID`: the cost of getting a cached, pinned kernel
 * ready to load: khub_hub_resolve plus khub_hub_variant_files (every file
 * of the chosen variant checked against metadata.json, by its recorded
 * fingerprint when it has one), timed in-process over N iterations. This
 * is what every khub_kernel_fetch pays before dlopen when the cache is warm.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "khub/khub_check.h"
#include "khub/khub_hub.h"
#include "khub/khub_kernels.h"

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
        rc = khub_cli_fail("bench",
                           "%s has no %svariant for this machine (download it "
                           "first: khub download %s; see khub variants)",
                           a->id_text, khub_hub_is_offline(hub) ? "cached " : "", a->id_text);
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
            rc = khub_cli_fail("bench",
                               "iteration %ld: %s (download it first: khub download "
                               "%s)",
                               i, khub_hub_errmsg(hub), a->id_text);
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
        if (a->json) {
            printf("{\"what\":\"hub_latency\",\"id\":");
            khub_cli_json_str(a->id_text);
            printf(",\"commit\":\"%s\",\"variant\":", commit);
            khub_cli_json_str(vl->best);
            printf(",\"iterations\":%zu,\"files\":%zu,\"bytes_hashed\":%llu,\"median_us\":%.1f,"
                   "\"p90_us\":%.1f,\"resolve_median_us\":%.2f,\"requests\":%llu}\n",
                   n, n_files, (unsigned long long)bytes, quantile(t, n, 0.5), quantile(t, n, 0.9),
                   quantile(tr, n, 0.5), (unsigned long long)reqs);
        } else
            printf("%s @%.12s %s: %zu iterations, %zu files, %llu bytes verified per call\n"
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

/* ======================================================================== */
/* Op micro-benchmarks against khub/ref-cpu                                 */
/* ======================================================================== */

typedef struct ops_args {
    const char *target; /* DIR or ID */
    int threads;        /* 0 = one per CPU */
    double time_s;      /* per op and plugin */
    int json;
    const char *policy; /* ID: trust policy file, NULL = the default one */
    int allow_unsigned; /* ID: accept unsigned kernels of unlisted organisations */
} ops_args;

/* A quantized op's benchmark format: the first of these its caps accept
 * (a bitsandbytes-style kernel serves int8_row and nf4, not q8_0). */
static const char *qlinear_dtype(const khub_op_desc *op)
{
    static const int q[] = {KHUB_QFORMAT_Q8_0, KHUB_QFORMAT_Q4_0,     KHUB_QFORMAT_Q4_1,
                            KHUB_QFORMAT_Q5_0, KHUB_QFORMAT_INT8_ROW, KHUB_QFORMAT_NF4};
    for (size_t i = 0; op->caps && i < sizeof q / sizeof q[0]; i++)
        if (op->caps->dtypes & KHUB_DTYPE_BIT_Q(q[i]))
            return khub_dtype_id_name(KHUB_DTYPE_ID_QBASE + q[i]);
    return NULL;
}

/* For a Hub ID: one shape per kind, as selftest.h lays them out; 0 when
 * there is none for the op's kind (or formats). */
static int default_spec(const khub_op_desc *op, khub_op_test *s)
{
    static const struct {
        uint32_t kind;
        int64_t shape[5];
        size_t ndim;
        const char *dtype;
    } d[] = {
        {KHUB_OP_NORM, {16, 2048}, 2, "f32"},
        {KHUB_OP_ACTIVATION, {16, 8192}, 2, "f32"},
        {KHUB_OP_ATTENTION, {1, 32, 8, 64, 1024}, 5, "f32"}, /* a decode step */
        {KHUB_OP_ROTARY, {16, 32, 64}, 3, "f32"},
        {KHUB_OP_LINEAR, {1, 2048, 2048}, 3, "f32"},
        {KHUB_OP_QLINEAR, {1, 2048, 2048}, 3, "q8_0"}, /* or see qlinear_dtype */
        {KHUB_OP_KV_CACHE, {2, 8, 64, 256}, 4, "f32"},
    };
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        if (d[i].kind != op->kind) continue;
        const char *dtype = op->kind == KHUB_OP_QLINEAR ? qlinear_dtype(op) : d[i].dtype;
        if (!dtype) return 0;
        *s = (khub_op_test){KHUB_STRUCT_INIT(khub_op_test), .ndim = (uint32_t)d[i].ndim};
        snprintf(s->op, sizeof s->op, "%s", op->name);
        snprintf(s->dtype, sizeof s->dtype, "%s", dtype);
        memcpy(s->shape, d[i].shape, sizeof d[i].shape);
        return 1;
    }
    return 0;
}

static void shape_text(const khub_op_test *s, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < s->ndim && len < n; i++)
        len +=
            (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)s->shape[i]);
}

/* Times one spec and prints its line; 0 or the exit status. */
static int bench_one(khub_runtime *rt, const char *pid, const khub_op_test *s, const ops_args *a)
{
    char shape[96];
    shape_text(s, shape, sizeof shape);
    khub_op_bench_result r = {KHUB_STRUCT_INIT(khub_op_bench_result)};
    if (khub_op_bench(rt, pid, s, a->time_s, &r) != KHUB_STATUS_OK)
        return khub_cli_fail("bench", "%s [%s] %s: %s", s->op, shape, s->dtype,
                             khub_runtime_errmsg(rt));
    double us = r.us, ref = r.ref_us, work = r.work;
    int flops = r.is_flops;
    double rate = us > 0 ? work / us * 1e-3 : 0, rate_ref = ref > 0 ? work / ref * 1e-3 : 0;
    const char *unit = flops ? "GFLOP/s" : "GB/s";
    if (a->json) {
        printf("{\"what\":\"op_bench\",\"plugin\":");
        khub_cli_json_str(pid);
        printf(",\"op\":");
        khub_cli_json_str(s->op);
        printf(",\"shape\":[%s],\"dtype\":\"%s\",\"us\":%.3f,\"ref_us\":%.3f,\"speedup\":%.3f,"
               "\"unit\":\"%s\",\"rate\":%.3f,\"ref_rate\":%.3f}\n",
               shape, s->dtype, us, ref, us > 0 ? ref / us : 0, unit, rate, rate_ref);
    } else
        printf("%s [%s] %s: %.2f us (%.2f %s), ref-cpu %.2f us (%.2f %s), speedup %.2fx\n", s->op,
               shape, s->dtype, us, rate, unit, ref, rate_ref, unit, us > 0 ? ref / us : 0);
    return 0;
}

static void header(const ops_args *a, const char *pid, const char *what, size_t n)
{
    if (!a->json)
        printf("%s (%s): %zu op benchmark%s against khub/ref-cpu, %.2f s each, %d thread%s\n", pid,
               what, n, n == 1 ? "" : "s", a->time_s, a->threads, a->threads == 1 ? "" : "s");
}

static khub_status new_runtime(const ops_args *a, khub_runtime **rt)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = a->threads,
                           .log = khub_cli_log};
    khub_status st = khub_runtime_new(&o, rt);
    if (st == KHUB_STATUS_OK) st = khub_plugin_load_builtin(*rt); /* khub/ref-cpu */
    return st;
}

/* The verified variant of DIR for this machine, loaded into rt. */
static int load_dir_plugin(khub_runtime *rt, const char *dir, char *what, size_t n,
                           khub_plugin **out)
{
    khub_kernel_dir_plugin dp = {KHUB_STRUCT_INIT(khub_kernel_dir_plugin)};
    if (khub_kernel_dir_load(rt, dir, &dp) != KHUB_STATUS_OK)
        return khub_cli_fail("bench", "%s", khub_runtime_errmsg(rt));
    snprintf(what, n, "%s, %s", dp.file, dp.variant);
    *out = dp.plugin;
    return 0;
}

static int bench_dir(const ops_args *a)
{
    char err[KHUB_ERROR_SIZE] = "", what[512];
    khub_op_test tests[16] = {{KHUB_STRUCT_INIT(khub_op_test)}};
    size_t n_tests = 0;
    khub_runtime *rt = NULL;
    khub_plugin *p = NULL;
    int rc = 0;
    if (khub_kernel_dir_tests(a->target, tests, 16, &n_tests, err, sizeof err) != KHUB_STATUS_OK)
        rc = khub_cli_fail("bench", "%s", err);
    else if (n_tests == 0)
        rc = khub_cli_fail("bench",
                           "%s/kernel.json declares no \"selftests\": nothing to time "
                           "(add shapes, see docs/kernel-format.md)",
                           a->target);
    else if (new_runtime(a, &rt) != KHUB_STATUS_OK)
        rc = khub_cli_fail("bench", "%s", rt ? khub_runtime_errmsg(rt) : khub_last_error());
    else
        rc = load_dir_plugin(rt, a->target, what, sizeof what, &p);
    if (rc == 0) header(a, khub_plugin_id(p), what, n_tests);
    for (size_t i = 0; rc == 0 && i < n_tests; i++)
        rc = bench_one(rt, khub_plugin_id(p), &tests[i], a);
    khub_runtime_free(rt);
    return rc;
}

static int bench_id(const ops_args *a)
{
    khub_hub *hub = NULL;
    khub_runtime *rt = NULL;
    khub_kernel_result kr = {KHUB_STRUCT_INIT(khub_kernel_result)};
    int rc = 0;
    if (khub_hub_new(NULL, &hub) != KHUB_STATUS_OK)
        rc = khub_cli_fail("bench", "%s", khub_last_error());
    else if (new_runtime(a, &rt) != KHUB_STATUS_OK)
        rc = khub_cli_fail("bench", "%s", rt ? khub_runtime_errmsg(rt) : khub_last_error());
    khub_kernel_opts ko = {KHUB_STRUCT_INIT(khub_kernel_opts), .policy_path = a->policy,
                           .allow_unsigned = a->allow_unsigned};
    if (rc == 0 && khub_kernel_fetch(hub, rt, a->target, &ko, &kr) != KHUB_STATUS_OK)
        rc = khub_cli_fail("bench", "%s", khub_runtime_errmsg(rt));
    else if (kr.fell_back)
        rc = khub_cli_fail("bench",
                           "%s has no variant for this machine; nothing to time "
                           "(see khub variants %s)",
                           a->target, a->target);
    uint32_t n_ops = rc == 0 ? khub_plugin_op_count(kr.plugin) : 0, n = 0;
    for (uint32_t i = 0; i < n_ops; i++) {
        khub_op_test s;
        n += (uint32_t)default_spec(khub_plugin_op(kr.plugin, i), &s);
    }
    if (rc == 0) {
        char what[600];
        snprintf(what, sizeof what, "%s@%.12s, %s, %s", kr.repo, kr.commit, kr.file, kr.variant);
        header(a, kr.plugin_id, what, n);
    }
    for (uint32_t i = 0; rc == 0 && i < n_ops; i++) {
        khub_op_test s;
        const khub_op_desc *op = khub_plugin_op(kr.plugin, i);
        if (default_spec(op, &s))
            rc = bench_one(rt, kr.plugin_id, &s, a);
        else if (!a->json)
            printf("%s: no benchmark shape for this kind of op (or its formats)\n", op->name);
    }
    khub_runtime_free(rt);
    khub_hub_free(hub);
    return rc;
}

static const khub_cli_cmd bench_cmd;

static int run_bench(int argc, char **argv)
{
    if (khub_cli_wants_help(&bench_cmd, argc, argv)) return 0;
    lat_args a = {NULL, 1000, 0};
    ops_args o = {NULL, 1, 0.2, 0, NULL, 0};
    int latency = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--latency"))
            latency = 1;
        else if (!strcmp(argv[i], "--json"))
            a.json = o.json = 1;
        else if ((!strcmp(argv[i], "-n") || !strcmp(argv[i], "--iterations")) && i + 1 < argc)
            a.iterations = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            o.threads = (int)strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--time") && i + 1 < argc)
            o.time_s = strtod(argv[++i], NULL);
        else if (!strcmp(argv[i], "--policy") && i + 1 < argc)
            o.policy = argv[++i];
        else if (!strcmp(argv[i], "--allow-unsigned"))
            o.allow_unsigned = 1;
        else if (argv[i][0] == '-')
            return khub_cli_usage(&bench_cmd, "unknown option %s", argv[i]);
        else if (!a.id_text)
            a.id_text = o.target = argv[i];
        else
            return khub_cli_usage(&bench_cmd, "unexpected argument %s", argv[i]);
    }
    if (!a.id_text)
        return khub_cli_usage(&bench_cmd, "missing a kernel: a built source DIR or a Hub ID");
    if (a.iterations < 1 || a.iterations > 10000000)
        return khub_cli_usage(&bench_cmd, "-n must be between 1 and 10000000");
    if (o.threads < 0 || o.threads > 1024)
        return khub_cli_usage(&bench_cmd, "--threads must be between 0 and 1024");
    if (!(o.time_s > 0 && o.time_s <= 600))
        return khub_cli_usage(&bench_cmd, "--time must be in (0, 600] seconds");
    if (latency) return bench_latency(&a);
    struct stat sb;
    return stat(o.target, &sb) == 0 && S_ISDIR(sb.st_mode) ? bench_dir(&o) : bench_id(&o);
}

static const khub_cli_cmd bench_cmd = {
    "bench", "time a kernel's ops against ref-cpu, or resolving a cached kernel (--latency)",
    "usage: khub bench DIR|ID [--threads N] [--time S] [--json]\n"
    "                         [--policy FILE] [--allow-unsigned]   (ID)\n"
    "       khub bench --latency ID [-n N] [--json]\n\n"
    "DIR|ID: times each op of a kernel next to khub/ref-cpu's op of the same\n"
    "kind and prints the median microseconds per call, GFLOP/s (linear, qlinear,\n"
    "attention) or GB/s (the rest), and the speedup over ref-cpu. DIR is a built\n"
    "kernel source tree (kernel.json; build/<variant>/ verified against its\n"
    "metadata.json), timed on kernel.json's \"selftests\" shapes; ID is fetched\n"
    "with khub_kernel_fetch (verified and trusted as `khub fetch` does: --policy,\n"
    "--allow-unsigned) and timed on one shape per kind. --threads sizes the\n"
    "runtime's pool (default 1; 0 = one per CPU), --time the seconds per op and\n"
    "plugin (default 0.2). Wall clock: run it on a quiet machine. --json prints one\n"
    "object per op instead: {what, plugin, op, shape, dtype, us, ref_us, speedup,\n"
    "unit, rate, ref_rate}.\n\n"
    "--latency: times khub_hub_resolve + khub_hub_variant_files (every file of\n"
    "the best variant checked against metadata.json) N times (default 1000) on a\n"
    "kernel already in the cache, and prints the median and p90 in microseconds.\n"
    "Pin the commit (org/name@<40hex>) to time what a locked load pays; a branch\n"
    "costs a request per iteration unless HF_HUB_OFFLINE=1. --json prints one object:\n"
    "{what, id, commit, variant, iterations, files, bytes_hashed, median_us, p90_us,\n"
    "resolve_median_us, requests}.\n",
    run_bench};
KHUB_CLI_COMMAND(bench_cmd)
