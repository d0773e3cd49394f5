/*
 * measure.c: one configuration measured in a child process of its own.
 *
 * Why a child per configuration: the peak RSS the report gives must be the
 * configuration's own (ru_maxrss of one process only grows, so in-process
 * runs would all report the largest so far); a configuration that crashes
 * or is killed for memory must cost only its own row, reported with the
 * reason; and the time budget is enforced by killing a child that runs past
 * it, which no in-process measurement could do safely. The child loads the
 * model exactly as `khub run` would with the configuration's flags
 * (khub_model_load_hub with the same role names), and writes one fixed-size
 * tune_meas back through a pipe.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "khub/khub_batch.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "tune_impl.h"

#define PREFILL_SHORT 24  /* tokens of the diagnosis' short prefill */
#define PREFILL_LONG  160 /* and of its long one (held-out text permitting) */
#define PPL_MAX       512 /* held-out tokens evaluated at most */

double khub__tune_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------------ */
/* In the child                                                             */
/* ------------------------------------------------------------------------ */

/* Resets the kernel's peak-RSS mark (VmHWM) so it counts from here; older
 * kernels without clear_refs "5" keep the fork's value, which is only the
 * parent's small footprint. */
static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

uint64_t khub__tune_peak_rss(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, pid ? "/proc/%d/status" : "/proc/self/status", pid);
    FILE *f = fopen(path, "r");
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    if (!kib && !pid) {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0) kib = (unsigned long long)ru.ru_maxrss;
    }
    return (uint64_t)kib * 1024;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of v[n] (sorted in place); 0 for n == 0. */
static double quantile(double *v, size_t n, double q)
{
    if (!n) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return v[(size_t)(q * (double)(n - 1) + 0.5)];
}

static int pool_threads(const khub_runtime *rt)
{
    const khub_feature *f = NULL;
    size_t n = 0;
    if (khub_runtime_features(rt, &f, &n) != KHUB_STATUS_OK) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(f[i].name, "threads")) return atoi(f[i].value);
    return 0;
}

static void quiet_log(void *ud, khub_log_level level, const char *msg)
{
    (void)ud, (void)level, (void)msg; /* the row's reason carries what matters */
}

/* One prefill of ids[n] (khub_model_logits) and its wall time in ms. */
static int timed_prefill(khub_model *m, const int32_t *ids, size_t n, float *logits, double *ms)
{
    double t0 = khub__tune_now();
    if (khub_model_logits(m, ids, n, logits) != KHUB_STATUS_OK) return -1;
    *ms = (khub__tune_now() - t0) * 1e3;
    return 0;
}

/* Perplexity on every position of the held-out text (one
 * khub_model_logits_all: row i predicts token i + 1), and the prefill time
 * of its first PREFILL_SHORT and PREFILL_LONG tokens for the diagnosis.
 * Run after the workload's peak RSS was read: the [tokens, vocab] logits
 * (33 MiB for SmolLM2) are the evaluation's, not the configuration's. */
int khub__tune_perplexity(khub_model *m, tune_meas *out)
{
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    if (khub_model_info_get(m, &info) != KHUB_STATUS_OK)
        return snprintf(out->why, sizeof out->why, "perplexity: %s",
                        khub_runtime_errmsg(khub_model_runtime(m))),
               -1;
    int32_t vocab = info.vocab;
    static int32_t ids[2048];
    size_t n = 0;
    if (khub_model_tokenize(m, khub__tune_heldout_text, 1, ids, 2048, &n) != KHUB_STATUS_OK ||
        n < PREFILL_SHORT + 2)
        return snprintf(out->why, sizeof out->why, "held-out text: %s",
                        khub_runtime_errmsg(khub_model_runtime(m))),
               -1;
    if (n > PPL_MAX) n = PPL_MAX;
    if ((int64_t)n > info.max_context) n = (size_t)info.max_context;
    size_t long_len = n < PREFILL_LONG ? n : PREFILL_LONG;
    float *logits = malloc(sizeof *logits * (size_t)vocab * n);
    if (!logits) return snprintf(out->why, sizeof out->why, "out of memory for logits"), -1;
    int rc = timed_prefill(m, ids, PREFILL_SHORT, logits, &out->prefill_short_ms) ||
             timed_prefill(m, ids, long_len, logits, &out->prefill_long_ms) ||
             khub_model_logits_all(m, ids, n, logits) != KHUB_STATUS_OK;
    if (rc) {
        snprintf(out->why, sizeof out->why, "perplexity: %s",
                 khub_runtime_errmsg(khub_model_runtime(m)));
        free(logits);
        return -1;
    }
    out->short_len = PREFILL_SHORT, out->long_len = (int32_t)long_len;
    double nll = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const float *row = logits + i * (size_t)vocab;
        float mx = row[0];
        for (int32_t v = 1; v < vocab; v++) mx = row[v] > mx ? row[v] : mx;
        double sum = 0;
        for (int32_t v = 0; v < vocab; v++) sum += exp((double)(row[v] - mx));
        nll -= (double)(row[ids[i + 1]] - mx) - log(sum);
    }
    free(logits);
    out->ppl_positions = (int32_t)(n - 1);
    out->ppl = exp(nll / (double)(n - 1));
    return 0;
}

/* Runs the workload with continuous batching, concurrency requests at once,
 * greedy and past EOS so every configuration generates the same count. */
/* Tests of the recommendation: the workload's wall time (throughput's
 * denominator) is made slow_s longer; the requests' own times are not. */
/* 3 s, not 1: on a loaded 2-core machine a candidate's own workload was
 * measured 0.9 s against a baseline's 0.2 s, and 1 s left its win inside
 * the baselines' spread (t_tune_hub failed with +25.7% against 32.2%). */
#define TUNE_SLOW_S 3.0

static void sleep_s(double slow_s)
{
    struct timespec d = {(time_t)slow_s, (long)((slow_s - (double)(time_t)slow_s) * 1e9)};
    while (nanosleep(&d, &d) != 0) continue;
}

int khub__tune_run_workload(khub_model *m, const khub_tune_workload *w, const tune_config *c,
                            double slow_s, tune_meas *out)
{
    static khub_generate_opts go[TUNE_MAX_REQUESTS];
    static khub_batch_request rq[TUNE_MAX_REQUESTS];
    static khub_batch_result res[TUNE_MAX_REQUESTS];
    for (size_t i = 0; i < w->n; i++) {
        go[i] = (khub_generate_opts){KHUB_APP_INIT(khub_generate_opts),
                                     .max_new_tokens = w->req[i].max_tokens, .ignore_eos = 1};
        rq[i] = (khub_batch_request){KHUB_APP_INIT(khub_batch_request), .prompt = w->req[i].prompt,
                                     .opts = &go[i]};
        res[i] = (khub_batch_result){KHUB_APP_INIT(khub_batch_result)};
    }
    khub_batch_config bc = {KHUB_APP_INIT(khub_batch_config), .max_seqs = w->concurrency,
                            .max_batch_tokens = c->max_batch};
    double t0 = khub__tune_now();
    khub_status st = khub_generate_batch(m, rq, w->n, &bc, res);
    if (slow_s > 0) sleep_s(slow_s);
    out->wall_ms = (khub__tune_now() - t0) * 1e3;
    int rc = 0;
    if (st != KHUB_STATUS_OK) {
        snprintf(out->why, sizeof out->why, "workload: %s",
                 khub_runtime_errmsg(khub_model_runtime(m)));
        rc = -1;
    }
    double ttft[TUNE_MAX_REQUESTS], total[TUNE_MAX_REQUESTS], tok[TUNE_MAX_REQUESTS], q = 0;
    size_t n_tok = 0;
    for (size_t i = 0; !rc && i < w->n; i++) {
        const khub_batch_result *r = &res[i];
        if (r->status != KHUB_STATUS_OK) {
            snprintf(out->why, sizeof out->why, "workload request %zu: %s", i + 1, r->error_full);
            rc = -1;
            break;
        }
        ttft[i] = r->ttft_ms, total[i] = r->total_ms, q += r->queue_ms;
        if (r->n_tokens > 1 && r->decode_tok_s > 0) tok[n_tok++] = 1e3 / r->decode_tok_s;
        out->gen_tokens += r->n_tokens;
        out->prompt_tokens += r->n_prompt_tokens;
        out->n_tokens[i] = (int32_t)(r->n_tokens < 256 ? r->n_tokens : 256);
        memcpy(out->tokens[i], r->tokens, sizeof(int32_t) * (size_t)out->n_tokens[i]);
    }
    if (!rc) {
        out->queue_ms = q / (double)w->n;
        out->latency_ms = quantile(total, w->n, 0.5);
        out->ttft_p90_ms = quantile(ttft, w->n, 0.9);
        out->ttft_ms = quantile(ttft, w->n, 0.5);
        out->token_ms = quantile(tok, n_tok, 0.5);
        out->throughput = (double)out->gen_tokens / (out->wall_ms / 1e3);
    }
    khub_batch_results_free(m, res, w->n);
    return rc;
}

khub_status khub__tune_open(const char *model, const tune_config *c, const char *empty_mapping,
                            int32_t max_seqs, const khub_comm *comm, khub_runtime **rtp,
                            khub_model **mp, tune_meas *out)
{
    *rtp = NULL, *mp = NULL;
    khub_runtime_opts ro = {KHUB_APP_INIT(khub_runtime_opts), .n_threads = c->threads,
                            .log = quiet_log};
    khub_runtime *rt = NULL;
    if (khub_runtime_new(&ro, &rt) != KHUB_STATUS_OK) {
        snprintf(out->why, sizeof out->why, "runtime: %s", khub_last_error());
        return out->status = KHUB_STATUS_NOMEM;
    }
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts),
                        .endpoint = c->endpoint[0] ? c->endpoint : NULL, .max_tries = 1,
                        .timeout_s = 5};
    khub_hub *hub = NULL;
    khub_model *m = NULL;
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts),
                          .max_batch = c->max_batch,
                          .max_seqs = max_seqs,
                          .strict = 1,
                          .tp_size = comm ? comm->size : 0,
                          .comm = comm};
    khub_model_kernels mk = {KHUB_APP_INIT(khub_model_kernels),
                             .attn = c->hub_attn[0] ? c->hub_attn
                                     : c->attn[0]   ? c->attn
                                                    : NULL,
                             .quant = c->quant[0] ? c->quant : NULL,
                             .cache = c->cache[0] ? c->cache : NULL,
                             .mapping_path = c->kernels[0] ? c->kernels : empty_mapping,
                             .strict = 1};
    double t0 = khub__tune_now();
    khub_status st = khub_plugin_load_builtin(rt);
    if (st == KHUB_STATUS_OK) st = khub_hub_new(&ho, &hub);
    if (st == KHUB_STATUS_OK) st = khub_model_load_hub(hub, rt, model, &mo, &mk, &m, NULL);
    if (st == KHUB_STATUS_OK) st = khub_model_info_get(m, &info);
    if (st != KHUB_STATUS_OK) {
        out->status = st;
        snprintf(out->why, sizeof out->why, "load: %s",
                 hub ? khub_runtime_errmsg(rt) : khub_last_error());
        khub_model_free(m);
        khub_hub_free(hub);
        khub_runtime_free(rt);
        return st;
    }
    khub_hub_free(hub); /* the kernels are in rt; the hub only resolved them */
    out->load_ms = (khub__tune_now() - t0) * 1e3;
    out->weight_bytes = info.weight_bytes;
    out->n_params = info.n_params;
    out->kv_bytes_per_token = info.kv_bytes_per_token;
    out->head_dim = info.head_dim;
    out->n_kv_heads = info.n_kv_heads;
    out->n_heads = info.n_heads;
    out->ffn = info.ffn;
    out->vocab = info.vocab;
    out->n_layers = info.n_layers;
    out->threads = pool_threads(rt);
    *rtp = rt, *mp = m;
    return KHUB_STATUS_OK;
}

static void child_run(const tune_run_ctx *ctx, const tune_row *row, int probe, tune_meas *out)
{
    const tune_config *c = &row->cfg;
    reset_peak();
    /* Tests of the report: "NAME" crashes, "NAME:hang" never ends,
     * "NAME:slow" (or "baseline:slow": every baseline run) takes
     * TUNE_SLOW_S more for the workload. */
    const char *fc = ctx->fail_candidate;
    size_t nl = strlen(row->name);
    if (fc && !strncmp(fc, row->name, nl) && (!fc[nl] || !strcmp(fc + nl, ":hang"))) {
        while (fc[nl]) pause();
        abort();
    }
    if (!probe && c->tp > 1) {
        khub__tune_tp_measure(ctx, row, out);
        return;
    }
    int slow = fc && ((!strncmp(fc, row->name, nl) && !strcmp(fc + nl, ":slow")) ||
                      (!strcmp(fc, "baseline:slow") && !strncmp(row->name, "baseline#", 9)));
    khub_runtime *rt = NULL;
    khub_model *m = NULL;
    if (khub__tune_open(ctx->model, c, ctx->empty_mapping, ctx->w->concurrency, NULL, &rt, &m,
                        out) != KHUB_STATUS_OK)
        return;
    if (!probe && khub__tune_run_workload(m, ctx->w, c, slow ? TUNE_SLOW_S : 0, out)) goto done;
    out->peak_rss = khub__tune_peak_rss(0); /* the configuration's, before the evaluation's */
    if (!probe && khub__tune_perplexity(m, out)) goto done;
    out->ok = 1;
done:
    khub_model_free(m);
    khub_runtime_free(rt);
}

/* ------------------------------------------------------------------------ */
/* In the parent                                                            */
/* ------------------------------------------------------------------------ */

void khub__tune_set_state(tune_row *row, tune_state state, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(row->reason, sizeof row->reason, fmt, ap);
    va_end(ap);
    row->state = state;
}

#define unverified(row, ...) khub__tune_set_state(row, TUNE_UNVERIFIED, __VA_ARGS__)

/* Reads the child's result until EOF or the deadline; the bytes read, or
 * -1 when the deadline passed. */
static ssize_t read_result(int fd, tune_meas *m, double deadline)
{
    size_t got = 0;
    char *p = (char *)m;
    for (;;) {
        double left = deadline - khub__tune_now();
        if (left <= 0) return -1;
        struct pollfd pfd = {fd, POLLIN, 0};
        int pr = poll(&pfd, 1, left > 1e6 ? 1000000000 : (int)(left * 1e3) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) continue; /* re-checks the deadline */
        ssize_t r = read(fd, p + got, got < sizeof *m ? sizeof *m - got : 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return (ssize_t)got;
        got += (size_t)r;
        if (got > sizeof *m) return (ssize_t)got; /* more than a result: broken child */
    }
}

/* Runs child_run in a child process and reads its result. */
static void run_child(const tune_run_ctx *ctx, tune_row *row, int probe, int fds[2])
{
    static tune_meas m; /* 70 KiB: not on the stack */
    close(fds[0]);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC); /* not into mpirun and its ranks (tp rows) */
    memset(&m, 0, sizeof m);
    child_run(ctx, row, probe, &m);
    const char *p = (const char *)&m;
    for (size_t off = 0; off < sizeof m;) {
        ssize_t w = write(fds[1], p + off, sizeof m - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    _exit(0); /* no atexit handlers: they belong to the parent */
}

/* The row's outcome from the child's exit status and what it wrote. */
static void judge_child(tune_row *row, int status, ssize_t got, const tune_meas *m)
{
    if (WIFSIGNALED(status))
        unverified(row, "crashed: signal %d (%s)%s", WTERMSIG(status), strsignal(WTERMSIG(status)),
                   WTERMSIG(status) == SIGKILL ? ", perhaps the out-of-memory killer" : "");
    else if ((size_t)got != sizeof *m)
        unverified(row, "the measuring process ended without a result (exit status %d)",
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    else if (!m->ok) {
        row->m = *m;
        unverified(row, "%s", m->why);
    } else {
        row->m = *m;
        row->state = TUNE_MEASURED;
    }
}

void khub__tune_measure(const tune_run_ctx *ctx, tune_row *row, int probe)
{
    static tune_meas m; /* 70 KiB: not on the stack */
    memset(&row->m, 0, sizeof row->m);
    int fds[2];
    if (ctx->deadline <= khub__tune_now()) {
        unverified(row, "not run: the time budget was spent");
        return;
    }
    if (pipe(fds) != 0) {
        unverified(row, "not run: pipe: %s", strerror(errno));
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        unverified(row, "not run: fork: %s", strerror(errno));
        return;
    }
    /* A tp row's child runs mpirun and its ranks: a process group of their
     * own, so that the budget's kill reaches all of them. */
    int group = !probe && row->cfg.tp > 1;
    if (pid == 0) {
        if (group) setpgid(0, 0);
        run_child(ctx, row, probe, fds);
    }
    if (group) setpgid(pid, pid); /* both sides: whichever runs first */
    close(fds[1]);
    memset(&m, 0, sizeof m);
    double t0 = khub__tune_now();
    ssize_t got = read_result(fds[0], &m, ctx->deadline);
    close(fds[0]);
    int status = 0;
    if (got < 0) {
        if (group) kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        unverified(row, "ran past the time budget: killed after %.1f s", khub__tune_now() - t0);
        return;
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    judge_child(row, status, got, &m);
}
