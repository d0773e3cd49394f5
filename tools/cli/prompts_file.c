/*
 * prompts_file.c: reading `khub run --prompts-file FILE` (prompts_file.h).
 * Every mistake names the file and the line: a malformed JSON object, a
 * setting of the wrong type or out of range, an unknown setting (so a typo
 * is not silently ignored), a setting given twice, a missing prompt, an
 * empty file.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "prompts_file.h"

typedef struct reader {
    const char *path;
    long line;
} reader;

static int bad(const reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const reader *r, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return khub_cli_fail("run", "%s:%ld: %s", r->path, r->line, msg);
}

static char *dup_str(const char *s)
{
    char *d = strdup(s);
    if (!d) abort(); /* the CLI is a program: out of memory ends it */
    return d;
}

/* A number member within [lo, hi] (integer when whole is set) into *out. */
static int number(const reader *r, const cJSON *v, double lo, double hi, int whole, double *out)
{
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0;
    if (!cJSON_IsNumber(v) || d < lo || d > hi || (whole && d != (double)(long long)d))
        return bad(r, "\"%s\" must be %s in [%.15g, %.15g]", v->string,
                   whole ? "an integer" : "a number", lo, hi);
    *out = d;
    return 0;
}

static int stops_of(const reader *r, const cJSON *v, cli_prompt *p)
{
    const cJSON *e;
    int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (n < 0 || n > 16) return bad(r, "\"stop\" must be a string or an array of at most 16");
    p->stops = calloc((size_t)n + 1, sizeof *p->stops);
    if (!p->stops) abort();
    if (cJSON_IsString(v)) {
        if (!*v->valuestring) return bad(r, "\"stop\" strings must not be empty");
        p->stops[p->n_stops++] = dup_str(v->valuestring);
    }
    const cJSON *arr = cJSON_IsArray(v) ? v : NULL;
    cJSON_ArrayForEach(e, arr)
    {
        if (!cJSON_IsString(e) || !*e->valuestring)
            return bad(r, "\"stop\" must hold non-empty strings");
        p->stops[p->n_stops++] = dup_str(e->valuestring);
    }
    p->gen.stop = (const char *const *)p->stops;
    p->gen.n_stop = (uint32_t)p->n_stops;
    return 0;
}

static int flag(const reader *r, const cJSON *v, uint32_t *out)
{
    if (!cJSON_IsBool(v)) return bad(r, "\"%s\" must be true or false", v->string);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

/* The settings a JSON line may give, each at most once (cJSON keeps a
 * repeated key, and a second "stop" or "prompt" would otherwise leak, or
 * overrun the first one's array). max_new_tokens is max_tokens. */
static const char *const known[] = {"prompt", "system", "max_tokens",     "temperature",
                                    "top_k",  "top_p",  "repeat_penalty", "seed",
                                    "stop",   "chat",   "ignore_eos",     "max_new_tokens"};
enum { N_KNOWN = sizeof known / sizeof known[0], MAX_NEW_TOKENS = N_KNOWN - 1 };

/* One setting of a JSON line into p; *seen has a bit per known setting. */
static int setting(const reader *r, const cJSON *v, cli_prompt *p, unsigned *seen)
{
    const char *k = v->string;
    double d = 0;
    uint32_t u = 0;
    int rc = 0, i = 0;
    while (i < N_KNOWN && strcmp(k, known[i]) != 0) i++;
    if (i == N_KNOWN)
        return bad(r,
                   "unknown setting \"%s\" (known: prompt, max_tokens, temperature, top_k, "
                   "top_p, repeat_penalty, seed, stop, chat, system, ignore_eos)",
                   k);
    if (i == MAX_NEW_TOKENS) i = 2; /* max_tokens */
    if (*seen & (1u << i)) return bad(r, "\"%s\": this line already sets it", k);
    *seen |= 1u << i;
    if (!strcmp(k, "prompt")) {
        if (!cJSON_IsString(v)) return bad(r, "\"prompt\" must be a string");
        p->prompt = dup_str(v->valuestring);
    } else if (!strcmp(k, "system")) {
        if (!cJSON_IsString(v)) return bad(r, "\"system\" must be a string");
        p->system = dup_str(v->valuestring);
        p->gen.system = p->system;
    } else if (!strcmp(k, "max_tokens") || !strcmp(k, "max_new_tokens")) {
        if (!(rc = number(r, v, 1, 1 << 20, 1, &d))) p->gen.max_new_tokens = (int32_t)d;
    } else if (!strcmp(k, "temperature")) {
        if (!(rc = number(r, v, 0, 100, 0, &d))) p->gen.temperature = (float)d;
    } else if (!strcmp(k, "top_k")) {
        if (!(rc = number(r, v, 0, 1 << 24, 1, &d))) p->gen.top_k = (int32_t)d;
    } else if (!strcmp(k, "top_p")) {
        if (!(rc = number(r, v, 0, 1, 0, &d))) p->gen.top_p = (float)d;
    } else if (!strcmp(k, "repeat_penalty")) {
        if (!(rc = number(r, v, 0, 100, 0, &d))) p->gen.repetition_penalty = (float)d;
    } else if (!strcmp(k, "seed")) {
        if (!(rc = number(r, v, 0, 9007199254740992.0, 1, &d))) p->gen.seed = (uint64_t)d;
    } else if (!strcmp(k, "stop")) {
        rc = stops_of(r, v, p);
    } else if (!strcmp(k, "chat")) {
        if (!(rc = flag(r, v, &u))) p->gen.chat = u;
    } else {
        if (!(rc = flag(r, v, &u))) p->gen.ignore_eos = (int32_t)u;
    }
    return rc;
}

static int json_line(const reader *r, const char *text, cli_prompt *p)
{
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithOpts(text, &end, 1);
    if (!o || !cJSON_IsObject(o)) {
        long col = o ? 1 : (long)((end ? end : text) - text) + 1;
        cJSON_Delete(o);
        return bad(r, "malformed JSON object near column %ld", col);
    }
    int rc = 0;
    unsigned seen = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, o)
    {
        if ((rc = setting(r, v, p, &seen))) break;
    }
    cJSON_Delete(o);
    if (!rc && !p->prompt) rc = bad(r, "no \"prompt\"");
    return rc;
}

static cli_prompt *append(cli_prompts *ps)
{
    if (ps->n == ps->cap) {
        ps->cap = ps->cap ? ps->cap * 2 : 64;
        ps->p = realloc(ps->p, ps->cap * sizeof *ps->p);
        if (!ps->p) abort();
    }
    cli_prompt *p = &ps->p[ps->n++];
    memset(p, 0, sizeof *p);
    return p;
}

static int blank(const char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    return *s == '\0';
}

int cli_prompts_read(const char *path, const khub_generate_opts *defaults, cli_prompts *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return khub_cli_fail("run", "%s: %s", path, strerror(errno));
    reader r = {path, 0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        r.line++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if ((size_t)len != strlen(line)) {
            rc = bad(&r, "a NUL byte in the line");
            break;
        }
        if (blank(line)) continue;
        cli_prompt *p = append(out);
        p->line = r.line;
        p->gen = *defaults;
        if (line[0] == '{')
            rc = json_line(&r, line, p);
        else
            p->prompt = dup_str(line);
    }
    if (!rc && ferror(f)) rc = khub_cli_fail("run", "%s: read error", path);
    free(line);
    fclose(f);
    if (!rc && out->n == 0) rc = khub_cli_fail("run", "%s: no prompts (every line is blank)", path);
    if (rc) cli_prompts_free(out);
    return rc;
}

void cli_prompts_free(cli_prompts *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        cli_prompt *p = &ps->p[i];
        free(p->prompt);
        free(p->system);
        for (int k = 0; k < p->n_stops; k++) free(p->stops[k]);
        free(p->stops);
    }
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}
