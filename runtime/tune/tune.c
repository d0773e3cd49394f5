/*
 * tune.c: khub_tune_run, the advisor's procedure (docs/tune.md): a probe
 * load for the model's facts and the memory check, the baseline measured
 * baseline_runs times (their spread is the noise), then the candidates, each
 * one change to the baseline checked for compatibility before it runs, then
 * the winners together, all in the same workload; recommend.c picks.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app_struct.h"
#include "khub/khub_hub.h"
#include "tune_impl.h"

static void fail_msg(char *errbuf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_msg(char *errbuf, size_t n, const char *fmt, ...)
{
    if (!errbuf || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, n, fmt, ap);
    va_end(ap);
}

static tune_row *add_row(khub_tune_report *r, const char *lever, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tune_row *add_row(khub_tune_report *r, const char *lever, const char *fmt, ...)
{
    if (r->n_rows == TUNE_MAX_ROWS) return NULL;
    tune_row *row = &r->rows[r->n_rows++];
    memset(row, 0, sizeof *row);
    row->cfg = r->rows[0].cfg; /* the baseline's */
    snprintf(row->lever, sizeof row->lever, "%s", lever);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(row->name, sizeof row->name, fmt, ap);
    va_end(ap);
    return row;
}

/* An incompatible candidate: not run, with the reason (row may be NULL
 * when the table is full). */
#define skip(row, ...) \
    do { \
        tune_row *row_ = (row); \
        if (row_) khub__tune_set_state(row_, TUNE_SKIPPED, __VA_ARGS__); \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Compatibility: what the plugins and this CPU can serve                   */
/* ------------------------------------------------------------------------ */

static void cpu_names(uint32_t bits, char *buf, size_t n)
{
    static const struct {
        uint32_t bit;
        const char *name;
    } f[] = {{KHUB_CPU_AVX2, "avx2"},
             {KHUB_CPU_FMA, "fma"},
             {KHUB_CPU_F16C, "f16c"},
             {KHUB_CPU_AVX512F, "avx512f"},
             {KHUB_CPU_AVX512VNNI, "avx512vnni"},
             {KHUB_CPU_AVX512BF16, "avx512bf16"},
             {KHUB_CPU_AVXVNNI, "avxvnni"}};
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (bits & f[i].bit)
            snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", buf[0] ? "," : "", f[i].name);
    if (!buf[0]) snprintf(buf, n, "none beyond x86-64");
}

/* The op of kind in p, or NULL. */
static const khub_op_desc *op_of_kind(const khub_plugin *p, uint32_t kind)
{
    for (uint32_t i = 0; i < khub_plugin_op_count(p); i++) {
        const khub_op_desc *d = khub_plugin_op(p, i);
        if (d && d->kind == kind) return d;
    }
    return NULL;
}

static int serves_head_dim(const khub_op_caps *c, int32_t hd)
{
    if (!c->head_dims) return 1;
    for (uint32_t i = 0; i < c->n_head_dims; i++)
        if (c->head_dims[i] == hd) return 1;
    return 0;
}

/* One row per attention plugin: measured when it can run here, else
 * skipped with the reason (the CPU features it lacks, the head size). */
static void attention_candidates(khub_tune_report *r, const khub_runtime *rt, int32_t head_dim)
{
    uint32_t have = khub_cpu_features();
    for (size_t i = 0; i < khub_plugin_count(rt); i++) {
        const khub_plugin *p = khub_plugin_at(rt, i);
        const khub_op_desc *d = op_of_kind(p, KHUB_OP_ATTENTION);
        if (!d || !d->caps) continue;
        tune_row *row = add_row(r, "attention", "attn=%s", khub_plugin_id(p));
        if (!row) return;
        snprintf(row->cfg.attn, sizeof row->cfg.attn, "%s", khub_plugin_id(p));
        char need[128];
        cpu_names(d->caps->cpu_features & ~have, need, sizeof need);
        if (d->caps->cpu_features & ~have)
            skip(row, "needs CPU features %s, which this CPU lacks", need);
        else if (!serves_head_dim(d->caps, head_dim))
            skip(row, "does not serve head size %d", (int)head_dim);
    }
}

static int any_op(const khub_runtime *rt, uint32_t kind)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++)
        if (op_of_kind(khub_plugin_at(rt, i), kind)) return 1;
    return 0;
}

static void quant_candidates(khub_tune_report *r, const tune_meas *probe)
{
    static const char *const schemes[] = {"q8_0", "q4_0", "nf4"};
    double bits = probe->n_params ? 8.0 * (double)probe->weight_bytes / (double)probe->n_params : 0;
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        tune_row *row = add_row(r, "quantization", "quant=%s", schemes[i]);
        if (!row) return;
        snprintf(row->cfg.quant, sizeof row->cfg.quant, "%s", schemes[i]);
        if (bits > 0 && bits < 9.0)
            skip(row,
                 "the weights are already quantized (%.2f bits per weight as loaded); "
                 "quantize-at-load converts float tensors only",
                 bits);
    }
}

static void cache_candidates(khub_tune_report *r, const khub_runtime *rt)
{
    static const char *const caches[] = {"quantized", "quantized-int4", "static", "paged",
                                         "offloaded"};
    for (size_t i = 0; i < sizeof caches / sizeof caches[0]; i++) {
        tune_row *row = add_row(r, "cache", "cache=%s", caches[i]);
        if (!row) return;
        snprintf(row->cfg.cache, sizeof row->cfg.cache, "%s", caches[i]);
        if (!strcmp(caches[i], "paged") && !any_op(rt, KHUB_OP_PAGED_ATTENTION))
            skip(row, "no loaded plugin has a paged_attention op");
    }
}

static void thread_candidates(khub_tune_report *r)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int counts[2] = {1, (int)(cores / 2)}, n = cores >= 4 ? 2 : 1;
    for (int i = 0; i < n; i++) {
        tune_row *row = add_row(r, "threads", "threads=%d", counts[i]);
        if (!row) return;
        row->cfg.threads = counts[i];
        if (cores <= 1) skip(row, "this machine has one core: no other thread count to try");
    }
}

static void batch_candidates(khub_tune_report *r)
{
    static const int sizes[] = {64, 512};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        tune_row *row = add_row(r, "batching", "max-batch-tokens=%d", sizes[i]);
        if (!row) return;
        row->cfg.max_batch = sizes[i];
    }
}

/* Kernels from a khub.json (one candidate: its roles) or a hub endpoint
 * (the known Hub kernels, when the endpoint answers). */
static void kernel_candidates(khub_tune_report *r, const char *from)
{
    static const char *const known[] = {"kernels-community/flash-attn2"};
    if (!from) {
        snprintf(r->kernels_note, sizeof r->kernels_note,
                 "no kernel source given (kernels_from): no Hub kernel was tried");
        return;
    }
    if (!strstr(from, "://")) {
        tune_row *row = add_row(r, "kernels", "kernels=%s", from);
        if (row) snprintf(row->cfg.kernels, sizeof row->cfg.kernels, "%s", from);
        snprintf(r->kernels_note, sizeof r->kernels_note, "kernels from the mapping %s", from);
        return;
    }
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .endpoint = from, .max_tries = 1,
                        .timeout_s = 5};
    khub_hub *hub = NULL;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        tune_row *row = add_row(r, "kernels", "attn=%s", known[i]);
        if (!row) break;
        snprintf(row->cfg.hub_attn, sizeof row->cfg.hub_attn, "%s", known[i]);
        snprintf(row->cfg.endpoint, sizeof row->cfg.endpoint, "%s", from);
        khub_hub_id id;
        char commit[41], why[KHUB_ERROR_SIZE];
        if (!hub && khub_hub_new(&ho, &hub) != KHUB_STATUS_OK) {
            skip(row, "kernel candidates skipped: %s", khub_last_error());
            continue;
        }
        if (khub_hub_id_parse(known[i], &id, why, sizeof why) != KHUB_STATUS_OK ||
            khub_hub_resolve(hub, &id, commit) != KHUB_STATUS_OK) {
            skip(row, "kernel candidates skipped: endpoint %s unreachable or without %s: %s", from,
                 known[i], khub_hub_errmsg(hub));
            snprintf(r->kernels_note, sizeof r->kernels_note, "%s", row->reason);
        }
    }
    if (!r->kernels_note[0])
        snprintf(r->kernels_note, sizeof r->kernels_note, "kernels from the hub at %s", from);
    khub_hub_free(hub);
}

/* 1 when an executable NAME is in one of PATH's folders. */
static int on_path(const char *name)
{
    const char *path = getenv("PATH");
    for (const char *p = path ? path : ""; *p;) {
        size_t len = strcspn(p, ":");
        char full[4096];
        snprintf(full, sizeof full, "%.*s/%s", (int)len, len ? p : ".", name);
        if (access(full, X_OK) == 0) return 1;
        p += len + (p[len] == ':');
    }
    return 0;
}

/* Tensor parallelism (`khub run --tp N` under mpirun, issue 18): one
 * candidate, measured as a job of N ranks (tp.c) when a rank program and
 * mpirun are there and the model splits over N. */
static void parallelism_candidates(khub_tune_report *r, const khub_tune_opts *o,
                                   const tune_meas *probe)
{
    int32_t tp = o->tp_size ? o->tp_size : 2;
    tune_row *row = add_row(r, "parallelism", "tp=%d", (int)tp);
    if (!row) return;
    row->cfg.tp = tp;
    char why[400];
    if (!o->tp_rank_program)
        skip(row, "unavailable: %s",
             o->tp_unavailable ? o->tp_unavailable
                               : "no rank program (khub_tune_opts.tp_rank_program): tensor "
                                 "parallelism runs one process per rank under mpirun");
    else if (!on_path("mpirun"))
        skip(row,
             "unavailable: mpirun is not on PATH (tensor parallelism runs one process per rank "
             "under it; tools/install-deps.sh installs Open MPI's openmpi-bin)");
    else if (khub__tune_tp_unfit(probe, tp, why, sizeof why))
        skip(row, "unavailable: %s", why);
}

/* ------------------------------------------------------------------------ */
/* The procedure                                                            */
/* ------------------------------------------------------------------------ */

typedef struct tune_run {
    khub_tune_report *r;
    const khub_tune_opts *o;
    tune_run_ctx ctx;
    int done, total;
    double run_s; /* a baseline run's wall time: the estimate of one more */
} tune_run;

static void progress(tune_run *t, const char *label)
{
    if (t->o->progress) t->o->progress(t->o->progress_ud, t->done, t->total, label);
}

static void measure(tune_run *t, tune_row *row, int probe)
{
    progress(t, row->name);
    double t0 = khub__tune_now();
    khub__tune_measure(&t->ctx, row, probe);
    t->done++;
    if (!probe && row->state == TUNE_MEASURED && !t->run_s) t->run_s = khub__tune_now() - t0;
}

/* A run the budget may not hold is not started: unverified, with numbers. */
static int fits_budget(tune_run *t, tune_row *row, double reserve_s)
{
    double left = t->ctx.deadline - khub__tune_now() - reserve_s;
    if (left >= t->run_s * 1.2) return 1;
    snprintf(row->reason, sizeof row->reason,
             "not run: %.1f s of the time budget left, a run takes about %.1f s (the baseline's)",
             left > 0 ? left : 0, t->run_s);
    row->state = TUNE_UNVERIFIED;
    t->done++;
    return 0;
}

static khub_status check_memory(const khub_tune_opts *o, const tune_meas *p, char *errbuf, size_t n)
{
    /* The least any configuration here can hold: the weights as loaded, or
     * at q4_0's 4.5 bits per weight when they are floats. */
    double bits = p->n_params ? 8.0 * (double)p->weight_bytes / (double)p->n_params : 0;
    double least = bits >= 9.0 ? (double)p->n_params * 4.5 / 8 : (double)p->weight_bytes;
    if (!o->max_memory || (double)o->max_memory >= least) return KHUB_STATUS_OK;
    fail_msg(errbuf, n,
             "max memory %.1f MiB is below the model's weights: %.1f MiB as loaded, at least "
             "%.1f MiB in any configuration tried (%s); nothing can fit, so nothing was measured",
             (double)o->max_memory / 1048576, (double)p->weight_bytes / 1048576, least / 1048576,
             bits >= 9.0 ? "4-bit q4_0 at 4.5 bits per weight" : "already quantized");
    return KHUB_STATUS_INVALID_ARG;
}

/* The winners' changes merged into one configuration; 0 when fewer than two. */
static int combine(khub_tune_report *r, tune_config *c)
{
    *c = r->rows[0].cfg;
    int n = 0;
    for (int i = r->n_baseline; i < r->n_rows; i++) {
        const tune_row *w = &r->rows[i];
        if (!w->winner || !strcmp(w->lever, "combination")) continue;
        const tune_config *x = &w->cfg;
        int better = 0; /* the best winner of each lever only */
        for (int j = r->n_baseline; j < r->n_rows; j++)
            better |= j != i && r->rows[j].winner && !strcmp(r->rows[j].lever, w->lever) &&
                      (r->rows[j].gain > w->gain || (r->rows[j].gain == w->gain && j < i));
        if (better) continue;
        if (x->attn[0]) memcpy(c->attn, x->attn, sizeof c->attn);
        if (x->quant[0]) memcpy(c->quant, x->quant, sizeof c->quant);
        if (x->cache[0]) memcpy(c->cache, x->cache, sizeof c->cache);
        if (x->threads) c->threads = x->threads;
        if (x->max_batch) c->max_batch = x->max_batch;
        if (x->tp) c->tp = x->tp;
        if (x->kernels[0]) memcpy(c->kernels, x->kernels, sizeof c->kernels);
        if (x->hub_attn[0]) {
            memcpy(c->hub_attn, x->hub_attn, sizeof c->hub_attn);
            memcpy(c->endpoint, x->endpoint, sizeof c->endpoint);
        }
        n++;
    }
    return n >= 2;
}

/* ------------------------------------------------------------------------ */
/* Levers                                                                   */
/* ------------------------------------------------------------------------ */

static const char *const lever_names[] = {"attention", "threads", "quantization", "batching",
                                          "cache",     "kernels", "parallelism"};

/* 1 when lever is in the comma-separated list (NULL or "" = all). */
static int lever_in(const char *list, const char *lever)
{
    if (!list || !*list) return 1;
    size_t n = strlen(lever);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, lever, n)) return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

/* The first name in list that is no lever, into bad; 0 when all are. */
static int bad_lever(const char *list, char *bad, size_t n)
{
    for (const char *p = list ? list : ""; *p;) {
        size_t len = strcspn(p, ","), k = 0;
        while (k < sizeof lever_names / sizeof lever_names[0] &&
               (strlen(lever_names[k]) != len || strncmp(p, lever_names[k], len)))
            k++;
        if (k == sizeof lever_names / sizeof lever_names[0]) {
            snprintf(bad, n, "%.*s", (int)len, p);
            return 1;
        }
        p += len + (p[len] == ',');
    }
    return 0;
}

static khub_status plan(tune_run *t, char *errbuf, size_t n)
{
    khub_tune_report *r = t->r;
    tune_row *probe = add_row(r, "baseline", "probe");
    measure(t, probe, 1);
    if (probe->state != TUNE_MEASURED) {
        fail_msg(errbuf, n, "the model does not load: %s", probe->reason);
        return probe->m.status ? (khub_status)probe->m.status : KHUB_STATUS_IO;
    }
    tune_meas pm = probe->m;
    r->n_rows = 0; /* the probe is not a row of the report */
    khub_status st = check_memory(t->o, &pm, errbuf, n);
    if (st != KHUB_STATUS_OK) return st;
    int runs = t->o->baseline_runs > 2 ? t->o->baseline_runs : 2;
    for (int i = 0; i < runs; i++) add_row(r, "baseline", "baseline#%d", i + 1);
    r->n_baseline = runs;
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    if (khub_runtime_new(&ro, &rt) != KHUB_STATUS_OK || khub_plugin_load_builtin(rt)) {
        fail_msg(errbuf, n, "runtime: %s", rt ? khub_runtime_errmsg(rt) : khub_last_error());
        khub_runtime_free(rt);
        return KHUB_STATUS_INVALID_ARG;
    }
    cpu_names(khub_cpu_features(), r->cpu, sizeof r->cpu);
    const char *lv = t->o->levers;
    if (lever_in(lv, "attention")) attention_candidates(r, rt, pm.head_dim);
    if (lever_in(lv, "quantization")) quant_candidates(r, &pm);
    if (lever_in(lv, "cache")) cache_candidates(r, rt);
    khub_runtime_free(rt); /* before any fork: no thread pool to inherit */
    if (lever_in(lv, "threads")) thread_candidates(r);
    if (lever_in(lv, "batching")) batch_candidates(r);
    if (lever_in(lv, "kernels"))
        kernel_candidates(r, t->o->kernels_from);
    else
        snprintf(r->kernels_note, sizeof r->kernels_note,
                 "the kernels lever was not asked for (levers): no kernel source was tried");
    if (lever_in(lv, "parallelism")) parallelism_candidates(r, t->o, &pm);
    t->total = t->done + 1; /* the combination, when there is one */
    for (int i = 0; i < r->n_rows; i++) t->total += r->rows[i].state == TUNE_MEASURED;
    return KHUB_STATUS_OK;
}

static khub_status run_all(tune_run *t, char *errbuf, size_t n)
{
    khub_tune_report *r = t->r;
    for (int i = 0; i < r->n_baseline; i++) measure(t, &r->rows[i], 0);
    if (r->rows[0].state != TUNE_MEASURED) {
        fail_msg(errbuf, n, "the baseline could not be measured: %s", r->rows[0].reason);
        return r->rows[0].reason[0] == 'r' || r->rows[0].reason[0] == 'n' ? KHUB_STATUS_TIMEOUT
                                                                          : KHUB_STATUS_IO;
    }
    for (int i = r->n_baseline; i < r->n_rows; i++) {
        tune_row *row = &r->rows[i];
        if (row->state == TUNE_SKIPPED || !fits_budget(t, row, t->run_s)) continue;
        measure(t, row, 0);
    }
    khub__tune_recommend(r);
    tune_config c;
    if (combine(r, &c)) {
        tune_row *row = add_row(r, "combination", "combination");
        if (row) {
            row->cfg = c;
            if (fits_budget(t, row, 0)) measure(t, row, 0);
            khub__tune_recommend(r);
        }
    }
    t->done = t->total;
    progress(t, "done");
    khub__tune_diagnose(r);
    return KHUB_STATUS_OK;
}

/* A khub.json with no roles, so that no khub.json next to the model or in
 * the current directory changes what is measured. */
static int empty_mapping(char *dir, size_t dn, char *path, size_t pn)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, dn, "%s/khub-tune-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, pn, "%s/khub.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs("{\"format\": 1, \"roles\": {}}\n", f);
    return fclose(f);
}

khub_status khub_tune_run(const khub_tune_opts *opts, khub_tune_report **out, char *errbuf,
                          size_t errbuf_size)
{
    if (errbuf && errbuf_size) errbuf[0] = '\0';
    /* 0.1's size at least (since session 17: a smaller struct read as
     * zeros); fields past the caller's struct_size (an application built
     * against 0.1 has no tp_*) read as zero. */
    khub_tune_opts copy = {0};
    char msg[KHUB_ERROR_SIZE];
    if (opts && khub__app_read(&copy, sizeof copy, opts, KHUB__SIZE_TO(khub_tune_opts, levers),
                               "khub_tune_run", "opts", msg, sizeof msg)) {
        fail_msg(errbuf, errbuf_size, "%s", msg);
        return KHUB_STATUS_STRUCT_SIZE;
    }
    const khub_tune_opts *o = opts ? &copy : NULL;
    if (!o || !out || !o->model || o->goal > KHUB_TUNE_GOAL_MEMORY || o->min_quality < 0 ||
        o->min_quality > 1 || o->time_budget_s < 0) {
        fail_msg(errbuf, errbuf_size, "khub_tune_run: %s",
                 !o || !out  ? "NULL options or out"
                 : !o->model ? "no model"
                             : "an option is "
                               "out of range");
        return KHUB_STATUS_INVALID_ARG;
    }
    *out = NULL;
    if (o->tp_size && (o->tp_size < 2 || o->tp_size > 64)) {
        fail_msg(errbuf, errbuf_size, "khub_tune_run: tp_size %d out of range (want 2..64, 0 = 2)",
                 (int)o->tp_size);
        return KHUB_STATUS_INVALID_ARG;
    }
    char bad[64];
    if (bad_lever(o->levers, bad, sizeof bad)) {
        fail_msg(errbuf, errbuf_size,
                 "khub_tune_run: unknown lever \"%s\" in levers (known: attention, quantization, "
                 "cache, threads, batching, kernels, parallelism)",
                 bad);
        return KHUB_STATUS_INVALID_ARG;
    }
    khub_tune_workload *builtin = NULL;
    const khub_tune_workload *w = o->workload;
    if (!w && khub_tune_workload_builtin(&builtin) != KHUB_STATUS_OK) return KHUB_STATUS_NOMEM;
    khub_tune_report *r = calloc(1, sizeof *r);
    if (!r) {
        khub_tune_workload_free(builtin);
        return KHUB_STATUS_NOMEM;
    }
    if (!w) w = builtin;
    char dir[512], mapping[600];
    double t0 = khub__tune_now();
    tune_run t = {.r = r, .o = o};
    t.ctx = (tune_run_ctx){.model = o->model,
                           .w = w,
                           .fail_candidate = o->fail_candidate,
                           .empty_mapping = mapping,
                           .tmp_dir = dir,
                           .tp_program = o->tp_rank_program,
                           .deadline = t0 + (o->time_budget_s > 0 ? o->time_budget_s : 600)};
    snprintf(r->model, sizeof r->model, "%s", o->model);
    r->goal = o->goal;
    r->builtin_workload = w->builtin;
    snprintf(r->workload_path, sizeof r->workload_path, "%s", w->path);
    r->n_requests = w->n;
    r->concurrency = w->concurrency;
    r->budget_s = o->time_budget_s > 0 ? o->time_budget_s : 600;
    r->max_memory = o->max_memory;
    r->min_quality = o->min_quality > 0 ? o->min_quality : 0.9;
    khub_status st = KHUB_STATUS_IO;
    if (empty_mapping(dir, sizeof dir, mapping, sizeof mapping) != 0)
        fail_msg(errbuf, errbuf_size, "cannot write a temporary file under %s", dir);
    else if ((st = plan(&t, errbuf, errbuf_size)) == KHUB_STATUS_OK)
        st = run_all(&t, errbuf, errbuf_size);
    remove(mapping);
    rmdir(dir);
    khub_tune_workload_free(builtin);
    r->elapsed_s = khub__tune_now() - t0;
    if (st != KHUB_STATUS_OK) {
        khub_tune_report_free(r);
        return st;
    }
    *out = r;
    return KHUB_STATUS_OK;
}
