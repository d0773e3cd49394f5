/*
 * ms_kernels.c: the model server's kernel endpoints (issue 16 item 4):
 * GET /v1/kernels (which op serves each role, the resolution report, the
 * swaps so far), POST /v1/kernels/reload (a live kernel swap, ms_swap.c),
 * and the per-kernel call counts of GET /metrics.
 *
 * The reload endpoint needs the API key, always: a server started without
 * one answers it 403, because swapping the code that runs in the server is
 * more than asking it for text, and an open server is one anybody on the
 * machine (or the network, with --host) can reach. An embedder swaps
 * through khub_model_server_reload without HTTP.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_strict.h"
#include "model_server.h"

/* ======================================================================== */
/* GET /v1/kernels                                                          */
/* ======================================================================== */

/* Each role of the explain table ("role[dtype]: plugin version :: op"
 * lines, the trace indented below them) as {"role", "binding"}. The table
 * is text, not an API: this reads only the lines of that shape. */
static void add_roles(cJSON *data, const char *explain)
{
    for (const char *line = explain; *line;) {
        const char *end = strchr(line, '\n'), *colon;
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)(n < sizeof buf ? n : sizeof buf - 1), line);
        /* a role's line names a plugin's op ("id version :: op"); other
         * top-level lines (the KV cache's bytes per token) stay in explain */
        if (buf[0] != ' ' && buf[0] != '\t' && (colon = strstr(buf, ": ")) &&
            strstr(colon, " :: ")) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "binding", colon + 2);
            buf[colon - buf] = '\0';
            cJSON_AddStringToObject(e, "role", buf);
            cJSON_AddItemToArray(data, e);
        }
        line += n + (end != NULL);
    }
}

static cJSON *reload_object(const khub__ms_reload_rec *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "at", (double)r->at);
    cJSON_AddStringToObject(o, "role", r->role);
    cJSON_AddStringToObject(o, "kernel", r->kernel);
    cJSON_AddStringToObject(o, "previous", r->previous);
    cJSON_AddStringToObject(o, "binding", r->now);
    cJSON_AddStringToObject(o, "resolved", r->resolved);
    cJSON_AddStringToObject(o, "selftest", r->selftest);
    cJSON_AddNumberToObject(o, "prepare_ms", (double)(int64_t)(r->prepare_ms * 10) / 10);
    cJSON_AddNumberToObject(o, "switch_ms", (double)(int64_t)(r->switch_ms * 10) / 10);
    return o;
}

MHD_RESULT khub__ms_kernels(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k)
{
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(o, "model", s->model_id);
    pthread_mutex_lock(&s->kmu);
    add_roles(data, s->explain);
    cJSON_AddStringToObject(o, "explain", s->explain);
    cJSON_AddNumberToObject(o, "reloads", (double)s->n_reloads);
    cJSON *hist = cJSON_AddArrayToObject(o, "reload_history");
    uint64_t first = s->n_reloads > KHUB__MS_MAX_RELOADS ? s->n_reloads - KHUB__MS_MAX_RELOADS : 0;
    for (uint64_t i = first; i < s->n_reloads; i++)
        cJSON_AddItemToArray(hist, reload_object(&s->reloads[i % KHUB__MS_MAX_RELOADS]));
    pthread_mutex_unlock(&s->kmu);
    cJSON_AddNumberToObject(o, "reload_failures", (double)atomic_load(&s->n_reload_failures));
    if (s->kernels_report)
        cJSON_AddStringToObject(o, "resolved", s->kernels_report);
    else
        cJSON_AddNullToObject(o, "resolved");
    return khub__ms_send_json(c, k, 200, o);
}

/* ======================================================================== */
/* POST /v1/kernels/reload                                                  */
/* ======================================================================== */

/* The HTTP status for a refused swap, by khub status. */
static unsigned http_status(khub_status st)
{
    switch (st) {
    case KHUB_STATUS_INVALID_ARG:
    case KHUB_STATUS_BAD_ID: return 400;
    case KHUB_STATUS_NOT_FOUND:
    case KHUB_STATUS_REPO_NOT_FOUND:
    case KHUB_STATUS_REVISION_NOT_FOUND:
    case KHUB_STATUS_ENTRY_NOT_FOUND: return 404;
    case KHUB_STATUS_UNSUPPORTED: return 409;
    case KHUB_STATUS_NETWORK:
    case KHUB_STATUS_HTTP:
    case KHUB_STATUS_UNAUTHORIZED:
    case KHUB_STATUS_GATED_REPO:
    case KHUB_STATUS_RATE_LIMITED:
    case KHUB_STATUS_OFFLINE:
    case KHUB_STATUS_TIMEOUT: return 502;
    case KHUB_STATUS_BUSY: return 503;
    case KHUB_STATUS_NOMEM:
    case KHUB_STATUS_INTERNAL:
    case KHUB_STATUS_IO: return 500;
    default: return 422; /* verification, loading, selftest, NO_KERNEL, NO_VARIANT */
    }
}

/* A required string field of j; NULL after answering 400. */
static const char *field(const cJSON *j, const char *name, const char *what, MHD_RESULT *ret,
                         khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k)
{
    (void)s;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, name);
    if (cJSON_IsString(f) && f->valuestring[0]) return f->valuestring;
    *ret = khub__ms_send_error(c, k, 400, "invalid_request_error", name, 0,
                               "'%s' must be a non-empty string: %s", name, what);
    return NULL;
}

MHD_RESULT khub__ms_reload_route(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k)
{
    if (!s->api_key)
        return khub__ms_send_error(c, k, 403, "permission_error", NULL, 0,
                                   "POST /v1/kernels/reload is disabled: the server has no API "
                                   "key; start it with one (khub_model_server_opts.api_key) to "
                                   "allow kernel swaps");
    char why[KHUB_ERROR_SIZE];
    cJSON *j = khub__json_parse_strict(k->body ? k->body : "", k->n, why, sizeof why);
    if (!j)
        return khub__ms_send_error(c, k, 400, "invalid_request_error", NULL, 0,
                                   "the request body is not valid JSON: %s", why);
    MHD_RESULT ret = MHD_NO;
    const char *role = NULL, *name = NULL;
    if (!cJSON_IsObject(j))
        ret = khub__ms_send_error(c, k, 400, "invalid_request_error", NULL, 0,
                                  "the request body must be a JSON object "
                                  "{\"role\": ..., \"kernel\": ...}");
    else if ((role = field(j, "role", "a kernel role such as \"attention\"", &ret, s, c, k)))
        name = field(j, "kernel", "a Hub ID " KHUB__HUB_ID_FORM " or a loaded plugin's id", &ret, s,
                     c, k);
    if (!name) {
        cJSON_Delete(j);
        return ret;
    }
    char err[KHUB_ERROR_SIZE] = "";
    /* Fetching and verifying may take a while: not the client's idleness. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    khub_status st = khub__ms_reload(s, role, name, err, sizeof err);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->idle_s);
    if (st != KHUB_STATUS_OK) {
        const char *param = st == KHUB_STATUS_INVALID_ARG &&
                                    khub_kernel_role_from_name(role) == KHUB_KERNEL_ROLE__COUNT
                                ? "role"
                                : "kernel";
        ret = khub__ms_send_error_code(c, k, http_status(st), "invalid_request_error", param,
                                       khub_status_name(st), err);
        cJSON_Delete(j);
        return ret;
    }
    cJSON_Delete(j);
    cJSON *o = NULL;
    pthread_mutex_lock(&s->kmu);
    o = reload_object(&s->reloads[(s->n_reloads - 1) % KHUB__MS_MAX_RELOADS]);
    cJSON_AddNumberToObject(o, "reloads", (double)s->n_reloads);
    pthread_mutex_unlock(&s->kmu);
    cJSON_AddStringToObject(o, "object", "kernel.reload");
    return khub__ms_send_json(c, k, 200, o);
}

/* ======================================================================== */
/* /metrics: calls per kernel                                               */
/* ======================================================================== */

/* Appends fmt to the growing text; NULL (text freed) when out of memory. */
static char *add(char *text, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *add(char *text, const char *fmt, ...)
{
    if (!text) return NULL;
    va_list ap;
    va_start(ap, fmt);
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t n = strlen(text), m = strlen(line);
    char *t = realloc(text, n + m + 1);
    if (!t) {
        free(text);
        return NULL;
    }
    memcpy(t + n, line, m + 1);
    return t;
}

/* A Prometheus label value: backslash, quote and newline escaped. */
static void label(char *out, size_t n, const char *v)
{
    size_t o = 0;
    for (; *v && o + 3 < n; v++) {
        if (*v == '\\' || *v == '"')
            out[o++] = '\\', out[o++] = *v;
        else if (*v == '\n')
            out[o++] = '\\', out[o++] = 'n';
        else
            out[o++] = *v;
    }
    out[o] = '\0';
}

char *khub__ms_kernel_metrics(khub__ms *s, char *text)
{
    /* One series per (role, dtype, kernel, state): a swap back and forth
     * retires two bindings of one kernel, whose counts are summed. */
    enum { MAX = 160 };
    khub_model_binding *b = calloc(MAX, sizeof *b);
    if (!b) {
        free(text);
        return NULL;
    }
    size_t n = 0;
    for (size_t i = 0; n < MAX; i++) {
        khub_model_binding one = {KHUB_APP_INIT(khub_model_binding)};
        if (khub_model_binding_get(s->model, i, &one) != KHUB_STATUS_OK) break;
        size_t j = 0;
        while (j < n && (strcmp(b[j].role, one.role) || strcmp(b[j].dtype, one.dtype) ||
                         strcmp(b[j].kernel, one.kernel) || b[j].retired != one.retired))
            j++;
        if (j < n)
            b[j].calls += one.calls;
        else
            b[n++] = one;
    }
    text =
        add(text, "# HELP khub_kernel_calls_total Calls of each kernel serving a role of the model "
                  "(state retired: replaced by a kernel swap).\n"
                  "# TYPE khub_kernel_calls_total counter\n");
    for (size_t i = 0; i < n; i++) {
        char role[64], dtype[32], kernel[400];
        label(role, sizeof role, b[i].role);
        label(dtype, sizeof dtype, b[i].dtype);
        label(kernel, sizeof kernel, b[i].kernel);
        text = add(text,
                   "khub_kernel_calls_total{role=\"%s\",dtype=\"%s\",kernel=\"%s\",state=\"%s\"} "
                   "%llu\n",
                   role, dtype, kernel, b[i].retired ? "retired" : "active",
                   (unsigned long long)b[i].calls);
    }
    free(b);
    pthread_mutex_lock(&s->kmu);
    unsigned long long reloads = s->n_reloads;
    pthread_mutex_unlock(&s->kmu);
    text = add(text,
               "# HELP khub_kernel_reloads_total Live kernel swaps done.\n"
               "# TYPE khub_kernel_reloads_total counter\nkhub_kernel_reloads_total %llu\n"
               "# HELP khub_kernel_reload_failures_total Kernel swaps refused (the old kernel "
               "kept serving).\n"
               "# TYPE khub_kernel_reload_failures_total counter\n"
               "khub_kernel_reload_failures_total %llu\n",
               reloads, (unsigned long long)atomic_load(&s->n_reload_failures));
    return text;
}
