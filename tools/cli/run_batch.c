/*
 * run_batch.c: `khub run --prompts-file FILE`: every prompt of the file is a
 * request of one khub_batch (continuous batching, khub_batch.h); results are
 * printed in file order when all have ended, as text ("--- prompt N ---")
 * or, with --json, one object with per-request timings and totals. Prompts
 * are numbered from 1 in file order, as the batch numbers its requests
 * (khub_batch_submit's ids), so "prompt 2" and "request 2" are one request. A
 * progress bar goes to stderr on a terminal.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "prompts_file.h"

typedef struct done {
    int ended;
    khub_batch_result r; /* text and tokens owned (malloc) */
} done;

typedef struct run_state {
    const cli_prompts *ps;
    done *d; /* [ps->n] */
    size_t n_ended;
} run_state;

static void on_done(void *ud, uint64_t id, const khub_batch_result *r)
{
    run_state *s = ud;
    done *d = &s->d[id - 1];
    d->r = *r;
    d->r.text = malloc(r->text_len + 1);
    d->r.tokens = malloc((size_t)(r->n_tokens ? r->n_tokens : 1) * sizeof *r->tokens);
    d->r.error_full = strdup(r->error_full); /* borrowed for the call only */
    if (!d->r.text || !d->r.tokens || !d->r.error_full) abort();
    memcpy(d->r.text, r->text ? r->text : "", r->text_len);
    d->r.text[r->text_len] = '\0';
    if (r->n_tokens) memcpy(d->r.tokens, r->tokens, (size_t)r->n_tokens * sizeof *r->tokens);
    d->ended = 1;
    s->n_ended++;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void progress(const run_state *s, double t0, int last)
{
    size_t n = s->ps->n, e = s->n_ended;
    int width = 30, fill = (int)(e * (size_t)width / n);
    double secs = (now_ms() - t0) / 1e3;
    fprintf(stderr, "\r[%.*s%*s] %zu/%zu requests, %.1f s", fill, "##############################",
            width - fill, "", e, n, secs);
    if (last) fputs("\r\033[K", stderr);
    fflush(stderr);
}

static const char *stop_name(uint32_t r)
{
    static const char *const names[] = {"none",     "eos",     "max_tokens", "stop_string",
                                        "callback", "context", "cancelled"};
    return r < sizeof names / sizeof names[0] ? names[r] : "?";
}

static cJSON *result_json(const cli_prompt *p, size_t i, const khub_batch_result *r)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "index", (double)(i + 1));
    cJSON_AddNumberToObject(e, "line", (double)p->line);
    cJSON_AddStringToObject(e, "status",
                            r->status == KHUB_STATUS_OK ? "ok" : khub_status_name(r->status));
    if (r->status != KHUB_STATUS_OK) cJSON_AddStringToObject(e, "error", r->error_full);
    cJSON_AddStringToObject(e, "text", r->text);
    cJSON *toks = cJSON_AddArrayToObject(e, "tokens");
    for (int64_t t = 0; t < r->n_tokens; t++)
        cJSON_AddItemToArray(toks, cJSON_CreateNumber(r->tokens[t]));
    cJSON_AddNumberToObject(e, "n_prompt_tokens", (double)r->n_prompt_tokens);
    cJSON_AddStringToObject(e, "stop_reason", stop_name(r->stop_reason));
    cJSON_AddNumberToObject(e, "preempted", r->n_preempted);
    cJSON *t = cJSON_AddObjectToObject(e, "timings");
    cJSON_AddNumberToObject(t, "queue_ms", r->queue_ms);
    cJSON_AddNumberToObject(t, "ttft_ms", r->ttft_ms);
    cJSON_AddNumberToObject(t, "total_ms", r->total_ms);
    cJSON_AddNumberToObject(t, "decode_tok_s", r->decode_tok_s);
    return e;
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : -1; /* KiB on Linux */
}

static void print_json(const run_state *s, const khub_batch_stats *st, double wall_ms,
                       const cli_batch_args *a)
{
    cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "results");
    int64_t failed = 0;
    for (size_t i = 0; i < s->ps->n; i++) {
        cJSON_AddItemToArray(arr, result_json(&s->ps->p[i], i, &s->d[i].r));
        failed += s->d[i].r.status != KHUB_STATUS_OK;
    }
    cJSON *t = cJSON_AddObjectToObject(o, "totals");
    cJSON_AddNumberToObject(t, "requests", (double)s->ps->n);
    cJSON_AddNumberToObject(t, "failed", (double)failed);
    cJSON_AddNumberToObject(t, "prompt_tokens", (double)st->prompt_tokens);
    cJSON_AddNumberToObject(t, "generated_tokens", (double)st->generated_tokens);
    cJSON_AddNumberToObject(t, "wall_ms", wall_ms);
    cJSON_AddNumberToObject(t, "generated_tok_s",
                            wall_ms > 0 ? (double)st->generated_tokens * 1e3 / wall_ms : 0);
    cJSON_AddNumberToObject(t, "steps", (double)st->steps);
    cJSON_AddNumberToObject(t, "preemptions", (double)st->preemptions);
    cJSON_AddNumberToObject(t, "peak_rss_kib", (double)peak_rss_kib());
    cJSON_AddNumberToObject(t, "threads", a->threads);
    char *js = cJSON_PrintUnformatted(o);
    if (js) printf("%s\n", js);
    cJSON_free(js);
    cJSON_Delete(o);
}

/* Text output; returns how many requests failed (each named on stderr). */
static int print_text(const run_state *s)
{
    int failed = 0;
    for (size_t i = 0; i < s->ps->n; i++) {
        const khub_batch_result *r = &s->d[i].r;
        if (r->status != KHUB_STATUS_OK) {
            failed++;
            fflush(stdout);
            khub_cli_fail("run", "prompt %zu (line %ld): %s", i + 1, s->ps->p[i].line,
                          r->error_full);
            continue;
        }
        printf("--- prompt %zu ---\n%s\n", i + 1, r->text);
    }
    return failed;
}

static int submit_all(khub_batch *b, const cli_prompts *ps, run_state *s)
{
    for (size_t i = 0; i < ps->n; i++) {
        khub_batch_request q = {KHUB_APP_INIT(khub_batch_request), .prompt = ps->p[i].prompt,
                                .opts = &ps->p[i].gen, .on_done = on_done, .ud = s};
        if (khub_batch_submit(b, &q, NULL) != KHUB_STATUS_OK)
            return khub_cli_fail("run", "prompt %zu (line %ld): %s", i + 1, ps->p[i].line,
                                 khub_last_error());
    }
    return 0;
}

int cli_run_batch(khub_runtime *rt, khub_model *m, const cli_prompts *ps, const cli_batch_args *a)
{
    khub_batch_config cfg = {KHUB_APP_INIT(khub_batch_config),
                             .max_batch_tokens = a->max_batch_tokens, .max_seqs = a->max_seqs};
    khub_batch *b = NULL;
    if (khub_batch_new(m, &cfg, &b) != KHUB_STATUS_OK)
        return khub_cli_fail("run", "%s", khub_runtime_errmsg(rt));
    run_state s = {.ps = ps, .d = calloc(ps->n, sizeof *s.d)};
    if (!s.d) abort();
    double t0 = now_ms();
    int rc = submit_all(b, ps, &s);
    int64_t left = 1;
    double shown = 0;
    while (!rc && left > 0) {
        if (khub_batch_step(b, &left) != KHUB_STATUS_OK)
            rc = khub_cli_fail("run", "%s", khub_runtime_errmsg(rt));
        if (a->progress && now_ms() - shown > 100) {
            progress(&s, t0, 0);
            shown = now_ms();
        }
    }
    double wall = now_ms() - t0;
    if (a->progress) progress(&s, t0, 1);
    khub_batch_stats st = {KHUB_APP_INIT(khub_batch_stats)};
    khub_batch_stats_get(b, &st);
    khub_batch_free(b);
    if (!rc && a->json) {
        print_json(&s, &st, wall, a);
        for (size_t i = 0; i < ps->n; i++) rc |= s.d[i].r.status != KHUB_STATUS_OK;
    } else if (!rc) {
        rc = print_text(&s) ? 1 : 0;
        fflush(stdout);
        fprintf(stderr,
                "khub run: %zu request%s, %lld prompt and %lld generated token%s in %.1f s "
                "(%.1f generated tok/s, %lld step%s, %lld preemption%s, peak RSS %ld MiB)\n",
                ps->n, ps->n == 1 ? "" : "s", (long long)st.prompt_tokens,
                (long long)st.generated_tokens, st.generated_tokens == 1 ? "" : "s", wall / 1e3,
                wall > 0 ? (double)st.generated_tokens * 1e3 / wall : 0, (long long)st.steps,
                st.steps == 1 ? "" : "s", (long long)st.preemptions, st.preemptions == 1 ? "" : "s",
                peak_rss_kib() / 1024);
    }
    for (size_t i = 0; i < ps->n; i++) {
        free(s.d[i].r.text);
        free(s.d[i].r.tokens);
        free((char *)s.d[i].r.error_full);
    }
    free(s.d);
    return rc;
}
