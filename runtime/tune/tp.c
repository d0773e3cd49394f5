/*
 * tp.c: the parallelism lever: tensor parallelism measured on the same
 * workload as every other candidate (issue 17).
 *
 * A tp configuration runs as N processes over a communicator, so the
 * measuring child cannot load it itself as it does every other row. It
 * writes the job's spec (the model, the configuration, the workload) as
 * JSON into the run's temporary folder and runs
 *
 *     mpirun -np N PROG tune-rank --tp N SPEC
 *
 * where PROG is the rank program the embedder names (khub_tune_opts.
 * tp_rank_program; the khub CLI gives itself, `khub tune-rank` being its
 * hidden command on tools/cli/tp_job.c's lifecycle). Every rank calls
 * khub_tune_rank_load (the model loaded with the job's communicator, and
 * the rank's pid written beside the result, so rank 0 can read every
 * rank's peak RSS from /proc: the ranks run on this machine); ranks > 0
 * then follow rank 0's steps (khub_model_tp_serve), and rank 0 calls
 * khub_tune_rank_measure: the workload and the perplexity exactly as a
 * one-process child measures them, then a result file (a tune_meas behind
 * a magic and its size: the same library writes and reads it) that the
 * measuring child hands to the parent through its pipe as usual. The
 * budget's kill reaches mpirun and its ranks through their process group
 * (measure.c). Memory is per rank: the peak RSS is the largest rank's,
 * with the sum beside it.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tune_impl.h"

enum { TP_MAX = 64 };

typedef struct tp_result_hdr {
    char magic[8];  /* "KHUBTP1\0" */
    uint32_t size;  /* sizeof(tune_meas) */
    uint32_t ranks; /* tp size */
} tp_result_hdr;

static const char tp_magic[8] = "KHUBTP1";

/* ------------------------------------------------------------------------ */
/* Compatibility, checked before anything runs                              */
/* ------------------------------------------------------------------------ */

/* The executor's split rules (runtime/executor/tp_plan.c) on the probe's
 * numbers: whole GQA groups per rank when there are as many KV heads as
 * ranks, else a rank count that is a multiple of the KV heads and divides
 * the query heads; the FFN and the vocabulary split evenly. */
int khub__tune_tp_unfit(const tune_meas *p, int32_t tp, char *why, size_t n)
{
    if (p->n_kv_heads < tp && (tp % p->n_kv_heads != 0 || p->n_heads % tp != 0))
        return snprintf(why, n,
                        "tp %d cannot split the model: %d KV heads (%d query heads) over %d "
                        "ranks needs at least %d KV heads, or a rank count that is a multiple "
                        "of the KV heads and divides the query heads",
                        (int)tp, (int)p->n_kv_heads, (int)p->n_heads, (int)tp, (int)tp),
               1;
    if (p->ffn % tp != 0)
        return snprintf(why, n,
                        "tp %d cannot split the model: intermediate size %d is not a multiple "
                        "of %d",
                        (int)tp, (int)p->ffn, (int)tp),
               1;
    if (p->vocab % tp != 0)
        return snprintf(why, n,
                        "tp %d cannot split the model: vocabulary %d is not a multiple of %d",
                        (int)tp, (int)p->vocab, (int)tp),
               1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The job's spec                                                           */
/* ------------------------------------------------------------------------ */

static int write_spec(const char *path, const tune_run_ctx *ctx, const tune_config *c,
                      const char *result)
{
    cJSON *o = cJSON_CreateObject(), *cfg = cJSON_AddObjectToObject(o, "config");
    cJSON *wl = cJSON_AddObjectToObject(o, "workload");
    cJSON *reqs = wl ? cJSON_AddArrayToObject(wl, "requests") : NULL;
    if (!o || !cfg || !reqs) return cJSON_Delete(o), -1;
    cJSON_AddStringToObject(o, "model", ctx->model);
    cJSON_AddStringToObject(o, "mapping", ctx->empty_mapping);
    cJSON_AddStringToObject(o, "result", result);
    cJSON_AddNumberToObject(o, "tp", c->tp);
    cJSON_AddStringToObject(cfg, "attn", c->attn);
    cJSON_AddStringToObject(cfg, "quant", c->quant);
    cJSON_AddStringToObject(cfg, "cache", c->cache);
    cJSON_AddNumberToObject(cfg, "threads", c->threads);
    cJSON_AddNumberToObject(cfg, "max_batch", c->max_batch);
    cJSON_AddStringToObject(cfg, "kernels", c->kernels);
    cJSON_AddStringToObject(cfg, "hub_attn", c->hub_attn);
    cJSON_AddStringToObject(cfg, "endpoint", c->endpoint);
    cJSON_AddNumberToObject(wl, "concurrency", ctx->w->concurrency);
    for (size_t i = 0; i < ctx->w->n; i++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "prompt", ctx->w->req[i].prompt);
        cJSON_AddNumberToObject(r, "max_tokens", ctx->w->req[i].max_tokens);
        cJSON_AddItemToArray(reqs, r);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    FILE *f = text ? fopen(path, "w") : NULL;
    int rc = f && fputs(text, f) >= 0 ? 0 : -1;
    if (f && fclose(f) != 0) rc = -1;
    free(text);
    return rc;
}

typedef struct tp_spec {
    char model[1024], mapping[1024], result[1024];
    int32_t tp;
    tune_config cfg;
    khub_tune_workload *w;
} tp_spec;

static void str_at(const cJSON *o, const char *key, char *buf, size_t n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    snprintf(buf, n, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static int32_t int_at(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? (int32_t)v->valuedouble : 0;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && n < (64L << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n)
        buf[n] = '\0';
    else
        free(buf), buf = NULL;
    fclose(f);
    return buf;
}

/* Reads the spec khub__tune_tp_measure wrote; -1 with why. */
static int read_spec(const char *path, tp_spec *s, char *why, size_t n)
{
    memset(s, 0, sizeof *s);
    char *text = slurp(path);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(o, "config");
    const cJSON *wl = cJSON_GetObjectItemCaseSensitive(o, "workload");
    const cJSON *reqs = cJSON_GetObjectItemCaseSensitive(wl, "requests"), *r;
    if (!cJSON_IsObject(cfg) || !cJSON_IsArray(reqs) || khub__tune_workload_new(&s->w)) {
        cJSON_Delete(o);
        return snprintf(why, n, "%s: not a tune-rank spec (khub tune writes it)", path), -1;
    }
    str_at(o, "model", s->model, sizeof s->model);
    str_at(o, "mapping", s->mapping, sizeof s->mapping);
    str_at(o, "result", s->result, sizeof s->result);
    s->tp = int_at(o, "tp");
    str_at(cfg, "attn", s->cfg.attn, sizeof s->cfg.attn);
    str_at(cfg, "quant", s->cfg.quant, sizeof s->cfg.quant);
    str_at(cfg, "cache", s->cfg.cache, sizeof s->cfg.cache);
    str_at(cfg, "kernels", s->cfg.kernels, sizeof s->cfg.kernels);
    str_at(cfg, "hub_attn", s->cfg.hub_attn, sizeof s->cfg.hub_attn);
    str_at(cfg, "endpoint", s->cfg.endpoint, sizeof s->cfg.endpoint);
    s->cfg.threads = int_at(cfg, "threads");
    s->cfg.max_batch = int_at(cfg, "max_batch");
    s->cfg.tp = s->tp;
    s->w->concurrency = int_at(wl, "concurrency");
    int bad = s->tp < 2 || s->tp > TP_MAX || !s->model[0] || !s->result[0] || s->w->concurrency < 1;
    cJSON_ArrayForEach(r, reqs)
    {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "prompt");
        if (bad || s->w->n == TUNE_MAX_REQUESTS || !cJSON_IsString(p)) {
            bad = 1;
            break;
        }
        tune_request *q = &s->w->req[s->w->n++];
        q->prompt = strdup(p->valuestring);
        q->max_tokens = int_at(r, "max_tokens");
        bad |= !q->prompt || q->max_tokens < 1 || q->max_tokens > TUNE_MAX_TOKENS;
    }
    cJSON_Delete(o);
    if (!bad && s->w->n) return 0;
    khub_tune_workload_free(s->w);
    s->w = NULL;
    return snprintf(why, n, "%s: not a tune-rank spec (khub tune writes it)", path), -1;
}

/* ------------------------------------------------------------------------ */
/* Rank 0's result                                                          */
/* ------------------------------------------------------------------------ */

static void write_result(const tp_spec *s, const tune_meas *m)
{
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->result);
    tp_result_hdr h = {.size = sizeof *m, .ranks = (uint32_t)s->tp};
    memcpy(h.magic, tp_magic, sizeof h.magic);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(&h, sizeof h, 1, f) == 1 && fwrite(m, sizeof *m, 1, f) == 1;
    if (f && fclose(f) != 0) ok = 0;
    if (ok) rename(tmp, s->result); /* whole or absent */
}

static int read_result(const char *path, tune_meas *m)
{
    tp_result_hdr h;
    FILE *f = fopen(path, "rb");
    int ok = f && fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, tp_magic, sizeof h.magic) &&
             h.size == sizeof *m && fread(m, sizeof *m, 1, f) == 1;
    if (f) fclose(f);
    return ok ? 0 : -1;
}

static void pid_path(const char *result, int rank, char *buf, size_t n)
{
    snprintf(buf, n, "%s.pid%d", result, rank);
}

/* Every rank's peak RSS from /proc (their pids beside the result). */
static int rank_peaks(const tp_spec *s, tune_meas *m)
{
    for (int r = 0; r < s->tp; r++) {
        char path[1100];
        pid_path(s->result, r, path, sizeof path);
        FILE *f = fopen(path, "r");
        int pid = 0;
        if (!f || fscanf(f, "%d", &pid) != 1) pid = 0;
        if (f) fclose(f);
        uint64_t peak = pid > 0 ? khub__tune_peak_rss(pid) : 0;
        if (!peak)
            return snprintf(m->why, sizeof m->why,
                            "peak RSS of tp rank %d (pid %d) is unreadable in /proc", r, pid),
                   -1;
        m->peak_rss = peak > m->peak_rss ? peak : m->peak_rss;
        m->peak_rss_total += peak;
    }
    m->tp_ranks = s->tp;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The rank program's side (khub_tune.h)                                    */
/* ------------------------------------------------------------------------ */

static void set_err(char *errbuf, size_t n, const char *msg)
{
    if (errbuf && n) snprintf(errbuf, n, "%s", msg);
}

khub_status khub_tune_rank_load(const char *spec_path, const khub_comm *comm, khub_runtime **rt,
                                khub_model **m, char *errbuf, size_t errbuf_size)
{
    static tune_meas meas; /* 70 KiB: not on the stack */
    tp_spec s;
    char why[512];
    if (rt) *rt = NULL;
    if (m) *m = NULL;
    if (!spec_path || !comm || !rt || !m) {
        set_err(errbuf, errbuf_size, "khub_tune_rank_load: NULL spec, comm, rt or m");
        return KHUB_STATUS_INVALID_ARG;
    }
    if (read_spec(spec_path, &s, why, sizeof why)) {
        set_err(errbuf, errbuf_size, why);
        return KHUB_STATUS_PARSE;
    }
    if (comm->size != s.tp) {
        snprintf(why, sizeof why,
                 "khub_tune_rank_load: the spec is for tp %d, the job has %d ranks", (int)s.tp,
                 (int)comm->size);
        set_err(errbuf, errbuf_size, why);
        khub_tune_workload_free(s.w);
        return KHUB_STATUS_INVALID_ARG;
    }
    char path[1100];
    pid_path(s.result, (int)comm->rank, path, sizeof path);
    FILE *f = fopen(path, "w");
    if (f) fprintf(f, "%d\n", (int)getpid()), fclose(f);
    memset(&meas, 0, sizeof meas);
    khub_status st =
        khub__tune_open(s.model, &s.cfg, s.mapping, s.w->concurrency, comm, rt, m, &meas);
    if (st != KHUB_STATUS_OK) {
        set_err(errbuf, errbuf_size, meas.why);
        if (comm->rank == 0) write_result(&s, &meas);
    }
    khub_tune_workload_free(s.w);
    return st;
}

khub_status khub_tune_rank_measure(const char *spec_path, khub_model *m, char *errbuf,
                                   size_t errbuf_size)
{
    static tune_meas meas;
    tp_spec s;
    char why[512];
    if (!spec_path || !m) {
        set_err(errbuf, errbuf_size, "khub_tune_rank_measure: NULL spec or model");
        return KHUB_STATUS_INVALID_ARG;
    }
    if (read_spec(spec_path, &s, why, sizeof why)) {
        set_err(errbuf, errbuf_size, why);
        return KHUB_STATUS_PARSE;
    }
    memset(&meas, 0, sizeof meas);
    khub_model_info info = {KHUB_APP_INIT(khub_model_info)};
    khub_status st = khub_model_info_get(m, &info);
    if (st == KHUB_STATUS_OK) {
        meas.load_ms = info.load_ms;
        meas.weight_bytes = info.weight_bytes; /* rank 0's shards */
        meas.n_params = info.n_params;
        meas.kv_bytes_per_token = info.kv_bytes_per_token;
        meas.head_dim = info.head_dim;
        meas.n_kv_heads = info.n_kv_heads;
        meas.n_heads = info.n_heads;
        meas.n_layers = info.n_layers;
        meas.threads = s.cfg.threads;
        if (khub__tune_run_workload(m, s.w, &s.cfg, 0, &meas) || rank_peaks(&s, &meas) ||
            khub__tune_perplexity(m, &meas))
            st = KHUB_STATUS_IO;
        else
            meas.ok = 1;
    } else
        snprintf(meas.why, sizeof meas.why, "%s", khub_runtime_errmsg(khub_model_runtime(m)));
    if (st != KHUB_STATUS_OK) set_err(errbuf, errbuf_size, meas.why);
    write_result(&s, &meas);
    khub_tune_workload_free(s.w);
    return st;
}

/* ------------------------------------------------------------------------ */
/* The measuring child's side                                               */
/* ------------------------------------------------------------------------ */

/* The last non-empty line of the job's output, for a failure's reason. */
static void last_line(const char *path, char *buf, size_t n)
{
    char *text = slurp(path);
    buf[0] = '\0';
    if (!text) return;
    char *end = text + strlen(text);
    while (end > text && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' ')) *--end = '\0';
    char *start = strrchr(text, '\n');
    snprintf(buf, n, "%s", start ? start + 1 : text);
    free(text);
}

static void run_mpirun(const tune_run_ctx *ctx, int tp, const char *spec, const char *log)
{
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600), null = open("/dev/null", O_RDONLY);
    if (fd < 0 || null < 0 || dup2(null, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
    /* Open MPI: as many ranks as asked on this machine, whatever its cores
     * (an unknown variable to other MPIs), and, when tune itself runs as
     * root, ranks as root too. */
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    if (geteuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    char np[16];
    snprintf(np, sizeof np, "%d", tp);
    execlp("mpirun", "mpirun", "-np", np, ctx->tp_program, "tune-rank", "--tp", np, spec,
           (char *)NULL);
    fprintf(stderr, "exec mpirun: %s\n", strerror(errno));
    _exit(127);
}

void khub__tune_tp_measure(const tune_run_ctx *ctx, const tune_row *row, tune_meas *out)
{
    char spec[700], result[700], log[700], line[400];
    int id = (int)getpid();
    snprintf(spec, sizeof spec, "%s/tp-%d.json", ctx->tmp_dir, id);
    snprintf(result, sizeof result, "%s/tp-%d.result", ctx->tmp_dir, id);
    snprintf(log, sizeof log, "%s/tp-%d.log", ctx->tmp_dir, id);
    tune_config c = row->cfg;
    if (!c.threads) { /* the cores shared by the ranks, as one process has them all */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        c.threads = cores / c.tp > 1 ? (int32_t)(cores / c.tp) : 1;
    }
    if (write_spec(spec, ctx, &c, result)) {
        snprintf(out->why, sizeof out->why, "cannot write the tp job's spec %s", spec);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) run_mpirun(ctx, c.tp, spec, log);
    int status = 0;
    while (pid > 0 && waitpid(pid, &status, 0) < 0 && errno == EINTR) continue;
    if (pid < 0)
        snprintf(out->why, sizeof out->why, "fork for mpirun: %s", strerror(errno));
    else if (read_result(result, out) == 0) {
        if (out->ok) out->threads = c.threads;
    } else {
        memset(out, 0, sizeof *out);
        last_line(log, line, sizeof line);
        snprintf(out->why, sizeof out->why,
                 "mpirun -np %d %s tune-rank ended (%s %d) without a result%s%s", (int)c.tp,
                 ctx->tp_program, WIFSIGNALED(status) ? "signal" : "exit status",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), line[0] ? ": " : "",
                 line);
    }
    char path[800];
    for (int r = 0; r < c.tp; r++) {
        pid_path(result, r, path, sizeof path);
        remove(path);
    }
    snprintf(path, sizeof path, "%s.tmp", result);
    remove(path);
    remove(result), remove(spec), remove(log);
}
