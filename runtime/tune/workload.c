/*
 * workload.c: the workload `khub tune` measures (khub_tune.h): a JSONL file
 * of requests and a concurrency level, or the built-in mixed workload.
 * Every mistake in a file names the file and the line, and an unknown key
 * is an error, so that a typo ("max_token") is never silently ignored.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tune_impl.h"

khub_status khub__tune_workload_new(khub_tune_workload **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return KHUB_STATUS_NOMEM;
    (*out)->concurrency = 1;
    return KHUB_STATUS_OK;
}

size_t khub_tune_workload_count(const khub_tune_workload *w) { return w ? w->n : 0; }

int32_t khub_tune_workload_concurrency(const khub_tune_workload *w)
{
    return w ? w->concurrency : 0;
}

void khub_tune_workload_free(khub_tune_workload *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->req[i].prompt);
    free(w);
}

static khub_status add(khub_tune_workload *w, const char *prompt, int32_t max_tokens)
{
    char *p = strdup(prompt);
    if (!p) return KHUB_STATUS_NOMEM;
    w->req[w->n].prompt = p;
    w->req[w->n].max_tokens = max_tokens;
    w->n++;
    return KHUB_STATUS_OK;
}

/* Short questions with short answers, and long passages with long
 * continuations, as a chat service sees both; four at once. */
khub_status khub_tune_workload_builtin(khub_tune_workload **out)
{
    static const struct {
        const char *prompt;
        int32_t max_tokens;
    } reqs[] = {
        {"The capital of France is", 16},
        {"Explain gravity in one sentence.", 32},
        {"Write a short story about a lighthouse keeper who finds a message in a bottle. "
         "The keeper has lived alone on the island for twenty years, and the message is "
         "addressed to him by name, in handwriting he recognises from long ago.",
         64},
        {"List three uses of copper.", 24},
        {"The history of the printing press begins with movable type, paper and ink. In the "
         "fifteenth century, Johannes Gutenberg combined these with a screw press adapted from "
         "wine making, and within fifty years presses were working in more than two hundred "
         "cities across Europe. Summarise the consequences for science and religion:",
         64},
        {"Translate to Spanish: good morning, how are you?", 16},
    };
    khub_status st = khub__tune_workload_new(out);
    for (size_t i = 0; st == KHUB_STATUS_OK && i < sizeof reqs / sizeof reqs[0]; i++)
        st = add(*out, reqs[i].prompt, reqs[i].max_tokens);
    if (st != KHUB_STATUS_OK) {
        khub_tune_workload_free(*out);
        *out = NULL;
        return st;
    }
    (*out)->concurrency = 4;
    (*out)->builtin = 1;
    return KHUB_STATUS_OK;
}

typedef struct reader {
    const char *path;
    long line;
    char *err;
    size_t err_n;
} reader;

static khub_status bad(const reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static khub_status bad(const reader *r, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->err && r->err_n) snprintf(r->err, r->err_n, "%s:%ld: %s", r->path, r->line, msg);
    return KHUB_STATUS_PARSE;
}

/* An integer member within [lo, hi] into *out. */
static khub_status integer(const reader *r, const cJSON *v, int lo, int hi, int32_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return bad(r, "\"%s\" must be an integer in [%d, %d]", v->string, lo, hi);
    *out = (int32_t)v->valuedouble;
    return KHUB_STATUS_OK;
}

static khub_status parse_line(reader *r, khub_tune_workload *w, const char *text, int *seen_conc)
{
    cJSON *o = cJSON_Parse(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return bad(r, "not a JSON object (want {\"prompt\": \"...\", \"max_tokens\": N} or "
                      "{\"concurrency\": N})");
    }
    const char *prompt = NULL;
    int32_t max_tokens = 64, conc = 0;
    int has_max = 0;
    khub_status st = KHUB_STATUS_OK;
    for (const cJSON *v = o->child; v && st == KHUB_STATUS_OK; v = v->next) {
        if (!strcmp(v->string, "prompt")) {
            if (!cJSON_IsString(v) || !v->valuestring[0])
                st = bad(r, "\"prompt\" must be a non-empty string");
            else
                prompt = v->valuestring;
        } else if (!strcmp(v->string, "max_tokens")) {
            st = integer(r, v, 1, TUNE_MAX_TOKENS, &max_tokens);
            has_max = 1;
        } else if (!strcmp(v->string, "concurrency"))
            st = integer(r, v, 1, 256, &conc);
        else
            st =
                bad(r, "unknown key \"%.60s\" (known: prompt, max_tokens, concurrency)", v->string);
    }
    if (st == KHUB_STATUS_OK && conc && (prompt || has_max))
        st = bad(r, "\"concurrency\" goes on a line of its own");
    else if (st == KHUB_STATUS_OK && conc && (*seen_conc)++)
        st = bad(r, "\"concurrency\" is given twice");
    else if (st == KHUB_STATUS_OK && !conc && !prompt)
        st = bad(r, "a request needs \"prompt\"");
    else if (st == KHUB_STATUS_OK && prompt && w->n == TUNE_MAX_REQUESTS)
        st = bad(r, "more than %d requests", TUNE_MAX_REQUESTS);
    if (st == KHUB_STATUS_OK && conc) w->concurrency = conc;
    if (st == KHUB_STATUS_OK && prompt) st = add(w, prompt, max_tokens);
    cJSON_Delete(o);
    return st;
}

khub_status khub_tune_workload_read(const char *path, khub_tune_workload **out, char *errbuf,
                                    size_t errbuf_size)
{
    reader r = {path ? path : "", 0, errbuf, errbuf_size};
    if (errbuf && errbuf_size) errbuf[0] = '\0';
    if (!path || !out) {
        if (errbuf && errbuf_size) snprintf(errbuf, errbuf_size, "workload: no path given");
        return KHUB_STATUS_INVALID_ARG;
    }
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errbuf && errbuf_size)
            snprintf(errbuf, errbuf_size, "%s: cannot open: %s", path, strerror(errno));
        return KHUB_STATUS_IO;
    }
    khub_tune_workload *w = NULL;
    khub_status st = khub__tune_workload_new(&w);
    char *line = NULL;
    size_t cap = 0;
    int seen_conc = 0;
    while (st == KHUB_STATUS_OK && getline(&line, &cap, f) > 0) {
        r.line++;
        const char *p = line + strspn(line, " \t\r\n");
        if (!*p || *p == '#') continue;
        st = parse_line(&r, w, p, &seen_conc);
    }
    free(line);
    fclose(f);
    if (st == KHUB_STATUS_OK && w->n == 0) { /* no line is at fault: the file is named */
        if (errbuf && errbuf_size)
            snprintf(errbuf, errbuf_size,
                     "%s: no requests (want JSON lines {\"prompt\": \"...\", \"max_tokens\": N})",
                     path);
        st = KHUB_STATUS_PARSE;
    }
    if (st != KHUB_STATUS_OK) {
        khub_tune_workload_free(w);
        return st;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    *out = w;
    return KHUB_STATUS_OK;
}
