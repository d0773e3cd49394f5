/*
 * report.c: the tune report as a terminal table, Markdown or JSON, and the
 * recommended configuration as a khub.json and as `khub run` flags.
 * Measured columns and estimated ones are kept apart: every number in the
 * table comes from a run of this session; the estimates (KV memory at the
 * workload's peak) are in the diagnosis and say so.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tune_impl.h"

#define MIB(x) ((double)(x) / 1048576.0)

static const char *state_name(tune_state s)
{
    return s == TUNE_MEASURED ? "measured" : s == TUNE_SKIPPED ? "skipped" : "unverified";
}

static const char *goal_str(uint32_t g)
{
    return g == KHUB_TUNE_GOAL_THROUGHPUT ? "throughput"
           : g == KHUB_TUNE_GOAL_MEMORY   ? "memory"
                                          : "latency";
}

/* The roles object of the khub.json at path (a --kernels-from mapping),
 * or NULL when it cannot be read: the candidate's load would have failed,
 * and no row that failed is recommended. */
static cJSON *mapping_roles(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char text[65536];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    cJSON *doc = cJSON_Parse(text);
    cJSON *roles = cJSON_DetachItemFromObject(doc, "roles");
    cJSON_Delete(doc);
    if (roles && !cJSON_IsObject(roles)) {
        cJSON_Delete(roles);
        return NULL;
    }
    return roles;
}

static void put_role(cJSON *roles, const char *role, const char *value)
{
    if (!value[0]) return;
    cJSON_DeleteItemFromObject(roles, role); /* the flag overrides the mapping, as in khub run */
    cJSON_AddStringToObject(roles, role, value);
}

void khub__tune_config_json(const tune_config *c, char *buf, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "format", 1);
    /* A configuration from a --kernels-from khub.json keeps that file's
     * roles (Hub IDs included), so the saved khub.json is what was
     * measured; the one-role changes go on top, as their flags do. */
    cJSON *roles = c->kernels[0] ? mapping_roles(c->kernels) : NULL;
    if (roles)
        cJSON_AddItemToObject(o, "roles", roles);
    else
        roles = cJSON_AddObjectToObject(o, "roles");
    put_role(roles, "attention", c->hub_attn[0] ? c->hub_attn : c->attn);
    put_role(roles, "quantization", c->quant);
    put_role(roles, "cache", c->cache);
    char *s = cJSON_Print(o);
    snprintf(buf, n, "%s\n", s ? s : "{\"format\": 1}");
    cJSON_free(s);
    cJSON_Delete(o);
}

void khub__tune_config_flags(const tune_config *c, char *buf, size_t n)
{
    buf[0] = '\0';
#define ADD(...) snprintf(buf + strlen(buf), n - strlen(buf), __VA_ARGS__)
    const char *attn = c->hub_attn[0] ? c->hub_attn : c->attn;
    if (c->kernels[0]) ADD(" --kernels %s", c->kernels);
    if (attn[0]) ADD(" --attn %s", attn);
    if (c->quant[0]) ADD(" --quant %s", c->quant);
    if (c->cache[0]) ADD(" --cache %s", c->cache);
    if (c->threads) ADD(" --threads %d", (int)c->threads);
    if (c->max_batch) ADD(" --max-batch-tokens %d", (int)c->max_batch);
    if (c->tp > 1) ADD(" --tp %d", (int)c->tp); /* under mpirun -np N */
#undef ADD
    if (!buf[0]) snprintf(buf, n, " (none: the defaults)");
    memmove(buf, buf + 1, strlen(buf)); /* the leading space */
}

/* ------------------------------------------------------------------------ */
/* Text and Markdown                                                        */
/* ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0 || !b) return;
    if (b->n + (size_t)need + 1 > b->cap) {
        size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)need;
        char *p = realloc(b->p, cap);
        if (!p) return;
        b->p = p, b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)need;
}

static void row_cells(sbuf *b, const tune_row *w, int md)
{
    const char *sep = md ? " | " : "  ";
    const tune_meas *m = &w->m;
    if (md) put(b, "| ");
    put(b, md ? "%s%s%s" : "%-34.34s%s%-10s", w->name, sep, state_name(w->state));
    if (w->state == TUNE_MEASURED)
        put(b,
            md ? "%s%.1f%s%.1f%s%.2f%s%.1f%s%.0f%%%s%.2f%s%llu%s"
               : "%s%8.1f%s%8.1f%s%7.2f%s%8.1f%s%5.0f%%%s%7.2f%s%7llu%s",
            sep, MIB(m->peak_rss), sep, m->ttft_ms, sep, m->token_ms, sep, m->throughput, sep,
            w->agreement * 100, sep, m->ppl, sep, (unsigned long long)m->kv_bytes_per_token, sep);
    else
        put(b, md ? "%s-%s-%s-%s-%s-%s-%s-%s" : "%s%8s%s%8s%s%7s%s%8s%s%6s%s%7s%s%7s%s", sep, "-",
            sep, "-", sep, "-", sep, "-", sep, "-", sep, "-", sep, "-", sep);
    put(b, "%s%s\n", w->state == TUNE_MEASURED ? w->verdict : w->reason, md ? " |" : "");
}

static void render_table(sbuf *b, const khub_tune_report *r, int md)
{
    if (md)
        put(b,
            "| configuration | state | peak RSS MiB | TTFT ms | ms/token | tok/s | agreement "
            "| perplexity | KV B/token | verdict |\n|---|---|---|---|---|---|---|---|---|---|\n");
    else
        put(b, "%-34s  %-10s  %8s  %8s  %7s  %8s  %6s  %7s  %7s  %s\n", "configuration", "state",
            "peak MiB", "TTFT ms", "ms/tok", "tok/s", "agree", "ppl", "KV B/t", "verdict");
    for (int i = 0; i < r->n_rows; i++) row_cells((sbuf *)b, &r->rows[i], md);
}

static void render_prose(sbuf *b, const khub_tune_report *r, int md)
{
    const char *h = md ? "## " : "", *li = md ? "- " : "  ";
    const tune_row *rec = &r->rows[r->recommended];
    put(b, "%sWorkload and assumptions\n\n", h);
    char wl[4200];
    if (r->builtin_workload)
        snprintf(wl, sizeof wl, "the built-in mixed workload (no workload file given)");
    else
        snprintf(wl, sizeof wl, "workload file%s%s", r->workload_path[0] ? " " : "",
                 r->workload_path);
    put(b, "%smodel %s; goal %s; %s: %zu requests, concurrency %d; greedy, past EOS\n", li,
        r->model, goal_str(r->goal), wl, r->n_requests, (int)r->concurrency);
    put(b, "%sCPU features seen: %s; no GPU is used (khub's executor runs on the CPU)\n", li,
        r->cpu);
    put(b,
        "%snot detected, assumed: the model's revision (the file as given), library versions "
        "other than khub %s, GPU and VRAM (none used), CPU RAM beyond the memory limit%s\n",
        li, khub_version_str(), r->max_memory ? "" : " (none given: no limit)");
    put(b,
        "%squality: greedy token agreement with baseline run 1 (minimum %.0f%%) and "
        "perplexity on all %d predicted positions of the held-out text: %s\n",
        li, r->min_quality * 100, (int)r->rows[0].m.ppl_positions, khub__tune_heldout_source);
    put(b, "%skernels: %s\n", li, r->kernels_note);
    put(b,
        "%snoise (spread of %d baseline runs): latency %.1f%%, throughput %.1f%%, peak RSS "
        "%.1f%%, TTFT %.1f%%; time %.0f s of a %.0f s budget\n\n",
        li, r->n_baseline, r->noise[0] * 100, r->noise[1] * 100, r->noise[2] * 100,
        r->noise[3] * 100, r->elapsed_s, r->budget_s);
    put(b, "%sDiagnosis (baseline run 1)\n\n%s\n", h, r->bottleneck);
    put(b, "%sMeasured (one change at a time, same workload)\n\n", h);
    render_table(b, r, md);
    put(b, "\n%sRecommendation\n\n", h);
    if (r->recommended == 0)
        put(b, "Keep the baseline: no measured change beat the noise within the constraints.\n");
    else
        put(b, "%s (measured: %s)\n", rec->name, rec->verdict);
    put(b, "\nkhub.json:\n%s%s%s", md ? "```json\n" : "", r->khub_json, md ? "```\n" : "");
    put(b, "khub run flags: %s\n", r->run_flags);
    if (r->tradeoffs[0]) put(b, "\n%sTrade-offs (measured)\n\n%s", h, r->tradeoffs);
    put(b, "\n%sOpen questions\n\n", h);
    /* Each row that leaves a question, by name (docs/tune.md: skipped and
     * unverified rows are listed here as unknown). */
    int open = 0;
    for (int i = 0; i < r->n_rows; i++) {
        const tune_row *w = &r->rows[i];
        if (w->state != TUNE_MEASURED) {
            put(b, "%s%s (%s): not measured here, so its effect is unknown: %s\n", li, w->name,
                state_name(w->state), w->reason);
            open++;
        } else if (w->m.tp_ranks > 1) {
            put(b,
                "%s%s: measured with its %d ranks on this one machine, sharing its cores; "
                "across machines or devices the collectives cost differently\n",
                li, w->name, (int)w->m.tp_ranks);
            open++;
        }
    }
    if (!open) put(b, "%snone: every configuration tried was measured here\n", li);
    char mpirun[32] = "";
    if (rec->cfg.tp > 1) snprintf(mpirun, sizeof mpirun, "mpirun -np %d ", (int)rec->cfg.tp);
    /* Run again on the same workload: the file tuned on (the built-in one
     * is what no --workload gives). */
    const char *wflag = r->workload_path[0] ? " --workload " : "";
    put(b,
        "\n%sValidation\n\n%s%s%skhub run --model %s --kernels khub.json %s%s--prompt "
        "\"...\" --json\n%skhub tune --model %s --goal %s%s%s (again: the same "
        "recommendation when margins exceed the noise)\n%s",
        h, md ? "```\n" : "", li, mpirun, r->model, r->run_flags[0] == '(' ? "" : r->run_flags,
        r->run_flags[0] == '(' ? "" : " ", li, r->model, goal_str(r->goal), wflag, r->workload_path,
        md ? "```\n" : "");
}

/* ------------------------------------------------------------------------ */
/* JSON                                                                     */
/* ------------------------------------------------------------------------ */

static void meas_json(cJSON *o, const tune_row *w)
{
    const tune_meas *m = &w->m;
    cJSON *x = cJSON_AddObjectToObject(o, "measured");
    cJSON_AddNumberToObject(x, "peak_rss_bytes", (double)m->peak_rss);
    if (m->tp_ranks > 1) { /* per rank: the largest rank's, and all of them */
        cJSON_AddNumberToObject(x, "tp_ranks", m->tp_ranks);
        cJSON_AddNumberToObject(x, "peak_rss_all_ranks_bytes", (double)m->peak_rss_total);
    }
    cJSON_AddNumberToObject(x, "weight_bytes", (double)m->weight_bytes);
    cJSON_AddNumberToObject(x, "kv_bytes_per_token", (double)m->kv_bytes_per_token);
    cJSON_AddNumberToObject(x, "load_ms", m->load_ms);
    cJSON_AddNumberToObject(x, "ttft_ms", m->ttft_ms);
    cJSON_AddNumberToObject(x, "ttft_p90_ms", m->ttft_p90_ms);
    cJSON_AddNumberToObject(x, "token_ms", m->token_ms);
    cJSON_AddNumberToObject(x, "latency_ms", m->latency_ms);
    cJSON_AddNumberToObject(x, "queue_ms", m->queue_ms);
    cJSON_AddNumberToObject(x, "throughput_tok_s", m->throughput);
    cJSON_AddNumberToObject(x, "prefill_short_ms", m->prefill_short_ms);
    cJSON_AddNumberToObject(x, "prefill_short_tokens", m->short_len);
    cJSON_AddNumberToObject(x, "prefill_long_ms", m->prefill_long_ms);
    cJSON_AddNumberToObject(x, "prefill_long_tokens", m->long_len);
    cJSON_AddNumberToObject(x, "perplexity", m->ppl);
    cJSON_AddNumberToObject(x, "perplexity_positions", m->ppl_positions);
    cJSON_AddNumberToObject(x, "token_agreement", w->agreement);
    cJSON_AddNumberToObject(x, "threads", m->threads);
    cJSON_AddNumberToObject(x, "generated_tokens", (double)m->gen_tokens);
}

static char *render_json(const khub_tune_report *r)
{
    cJSON *o = cJSON_CreateObject(), *rows = NULL;
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddStringToObject(o, "goal", goal_str(r->goal));
    cJSON *w = cJSON_AddObjectToObject(o, "workload");
    cJSON_AddBoolToObject(w, "builtin", r->builtin_workload);
    cJSON_AddNumberToObject(w, "requests", (double)r->n_requests);
    cJSON_AddNumberToObject(w, "concurrency", r->concurrency);
    cJSON *a = cJSON_AddObjectToObject(o, "assumptions");
    cJSON_AddStringToObject(a, "cpu_features", r->cpu);
    cJSON_AddStringToObject(a, "khub_version", khub_version_str());
    cJSON_AddStringToObject(a, "not_detected",
                            "model revision, other library versions, GPU and VRAM (none used)");
    cJSON_AddStringToObject(a, "heldout_text", khub__tune_heldout_source);
    cJSON_AddStringToObject(a, "kernels", r->kernels_note);
    cJSON *n = cJSON_AddObjectToObject(o, "noise");
    cJSON_AddNumberToObject(n, "baseline_runs", r->n_baseline);
    cJSON_AddNumberToObject(n, "latency", r->noise[0]);
    cJSON_AddNumberToObject(n, "throughput", r->noise[1]);
    cJSON_AddNumberToObject(n, "peak_rss", r->noise[2]);
    cJSON_AddNumberToObject(n, "ttft", r->noise[3]);
    cJSON_AddNumberToObject(o, "budget_s", r->budget_s);
    cJSON_AddNumberToObject(o, "elapsed_s", r->elapsed_s);
    cJSON_AddNumberToObject(o, "max_memory_bytes", (double)r->max_memory);
    cJSON_AddNumberToObject(o, "min_quality", r->min_quality);
    rows = cJSON_AddArrayToObject(o, "candidates");
    for (int i = 0; i < r->n_rows; i++) {
        const tune_row *x = &r->rows[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", x->name);
        cJSON_AddStringToObject(e, "lever", x->lever);
        cJSON_AddStringToObject(e, "state", state_name(x->state));
        char flags[1024];
        khub__tune_config_flags(&x->cfg, flags, sizeof flags);
        cJSON_AddStringToObject(e, "run_flags", flags);
        if (x->state == TUNE_MEASURED) {
            meas_json(e, x);
            cJSON_AddNumberToObject(e, "gain", x->gain);
            cJSON_AddBoolToObject(e, "winner", x->winner);
            cJSON_AddStringToObject(e, "verdict", x->verdict);
        } else
            cJSON_AddStringToObject(e, "reason", x->reason);
        cJSON_AddItemToArray(rows, e);
    }
    cJSON *e = cJSON_AddObjectToObject(o, "estimated");
    cJSON_AddStringToObject(e, "diagnosis", r->bottleneck);
    cJSON *rec = cJSON_AddObjectToObject(o, "recommendation");
    cJSON_AddStringToObject(rec, "name",
                            r->recommended ? r->rows[r->recommended].name : "baseline");
    cJSON_AddStringToObject(rec, "khub_json", r->khub_json);
    cJSON_AddStringToObject(rec, "run_flags", r->run_flags);
    cJSON_AddStringToObject(rec, "tradeoffs", r->tradeoffs);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) return NULL;
    char *copy = malloc(strlen(s) + 2); /* ours: freed with free(), not cJSON_free */
    if (copy) sprintf(copy, "%s\n", s);
    cJSON_free(s);
    return copy;
}

const char *khub_tune_report_render(khub_tune_report *r, khub_tune_format format)
{
    if (!r || (unsigned)format > KHUB_TUNE_FORMAT_JSON) return NULL;
    if (r->rendered[format]) return r->rendered[format];
    if (format == KHUB_TUNE_FORMAT_JSON) return r->rendered[format] = render_json(r);
    sbuf b = {0};
    render_prose(&b, r, format == KHUB_TUNE_FORMAT_MARKDOWN);
    return r->rendered[format] = b.p;
}

const char *khub_tune_report_khub_json(const khub_tune_report *r)
{
    return r ? r->khub_json : NULL;
}

const char *khub_tune_report_run_flags(const khub_tune_report *r)
{
    return r ? r->run_flags : NULL;
}

void khub_tune_report_free(khub_tune_report *r)
{
    if (!r) return;
    for (int i = 0; i < 3; i++) free(r->rendered[i]);
    free(r);
}
