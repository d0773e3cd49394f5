/*
 * ms_routes.c: the model server's endpoints. Completions are parsed on the
 * connection's thread, submitted to the engine, and answered when done
 * (plain) or as server-sent events while the text comes (stream: true).
 *
 * A stream's status line waits for the request's first text or its end, so
 * that an error found before generation starts (a prompt longer than the
 * context, a template that refuses the roles) is still a plain 400 with an
 * error object rather than an event inside a 200. An error after text has
 * been sent comes as one "data: {"error": ...}" event before [DONE].
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_strict.h"
#include "model_server.h"

/* Counts a finished request into the server's totals, once. */
static void account(khub__ms *s, khub__ms_req *r)
{
    pthread_mutex_lock(&r->mu);
    int cancelled = !r->done || r->err_status == 499;
    int64_t np = r->n_prompt, nc = r->n_completion;
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(cancelled ? &s->n_cancelled : &s->n_completions, 1);
    atomic_fetch_add(&s->prompt_tokens, (unsigned long long)(np > 0 ? np : 0));
    atomic_fetch_add(&s->completion_tokens, (unsigned long long)(nc > 0 ? nc : 0));
}

static void make_id(khub__ms *s, int chat, char *id, size_t size)
{
    unsigned long long n = atomic_fetch_add(&s->next_id, 1);
    snprintf(id, size, "%s-%llx%08llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)s->created,
             n);
}

/* ======================================================================== */
/* Streams                                                                  */
/* ======================================================================== */

typedef struct stream {
    khub__ms *s;
    khub__ms_req *r;
    khub__ms_params p;
    char id[48];
    time_t created;
    int fd;
    char *out; /* the event being sent */
    size_t out_n, out_off;
    size_t have; /* bytes of r->text sent */
    int phase;   /* 0 opening, 1 text, 2 ended */
} stream;

/* Queues "data: <j>\n\n" (j consumed) after what is pending. */
static int put_event(stream *st, cJSON *j, const char *raw)
{
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    const char *body = s ? s : raw;
    if (!body) return -1;
    size_t n = strlen(body) + 8, keep = st->out_n - st->out_off;
    char *o = malloc(keep + n + 1);
    if (o) {
        if (keep) memcpy(o, st->out + st->out_off, keep);
        snprintf(o + keep, n + 1, "data: %s\n\n", body);
    }
    free(s);
    free(st->out);
    st->out = o;
    st->out_off = 0;
    st->out_n = o ? keep + strlen(o + keep) : 0;
    return o ? 0 : -1;
}

/* An SSE comment, which clients skip: sent after a second without text
 * (a long prefill, a slow step), so that the connection's idle timeout
 * measures a client that stopped reading, not a model that is thinking. */
static int put_comment(stream *st)
{
    static const char ka[] = ": keep-alive\n\n";
    size_t keep = st->out_n - st->out_off;
    char *o = malloc(keep + sizeof ka);
    if (!o) return -1;
    if (keep) memcpy(o, st->out + st->out_off, keep);
    memcpy(o + keep, ka, sizeof ka);
    free(st->out);
    st->out = o;
    st->out_off = 0;
    st->out_n = keep + sizeof ka - 1;
    return 0;
}

/* The events after the last text: the finish chunk, usage, [DONE]. */
static int put_end(stream *st)
{
    khub__ms_req *r = st->r;
    pthread_mutex_lock(&r->mu);
    unsigned status = r->err_status;
    char msg[KHUB_ERROR_SIZE];
    snprintf(msg, sizeof msg, "%s", r->err_msg);
    const char *type = r->err_type ? r->err_type : "server_error";
    const char *fin = khub__ms_finish_reason(r->stop_reason);
    int64_t np = r->n_prompt, nc = r->n_completion;
    pthread_mutex_unlock(&r->mu);
    int rc = 0;
    if (status) {
        cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
        cJSON_AddStringToObject(e, "message", msg);
        cJSON_AddStringToObject(e, "type", type);
        cJSON_AddNullToObject(e, "param");
        cJSON_AddNullToObject(e, "code");
        rc |= put_event(st, j, NULL);
    } else {
        rc |= put_event(
            st, khub__ms_chunk(st->s, &st->p, st->id, st->created, NULL, 0, fin ? fin : "stop"),
            NULL);
        if (st->p.include_usage) {
            cJSON *u = khub__ms_chunk(st->s, &st->p, st->id, st->created, NULL, 0, "stop");
            cJSON_DeleteItemFromObject(u, "choices");
            cJSON_AddArrayToObject(u, "choices");
            cJSON_ReplaceItemInObject(u, "usage", khub__ms_usage(np, nc));
            rc |= put_event(st, u, NULL);
        }
    }
    return rc | put_event(st, NULL, "[DONE]");
}

/* Makes the next event; -1 when the stream must end with an error (the
 * client left, out of memory), 0 on success, 1 at the end. */
static int next_event(stream *st)
{
    if (st->phase == 2) return 1;
    if (st->phase == 0) {
        st->phase = 1;
        if (st->p.chat)
            return put_event(st, khub__ms_chunk(st->s, &st->p, st->id, st->created, NULL, 0, NULL),
                             NULL);
    }
    khub__ms_wait w = khub__ms_req_wait(st->r, st->have, st->fd, 1000);
    if (w == KHUB__MS_GONE) return -1;
    if (w == KHUB__MS_IDLE) return put_comment(st);
    if (w == KHUB__MS_DONE) {
        st->phase = 2;
        return put_end(st);
    }
    khub__ms_req *r = st->r;
    pthread_mutex_lock(&r->mu);
    size_t n = r->len - st->have;
    char *piece = malloc(n + 1);
    if (piece) memcpy(piece, r->text + st->have, n);
    st->have = r->len;
    pthread_mutex_unlock(&r->mu);
    if (!piece) return -1;
    int rc =
        put_event(st, khub__ms_chunk(st->s, &st->p, st->id, st->created, piece, n, NULL), NULL);
    free(piece);
    return rc;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream *st = cls;
    (void)pos;
    while (st->out_off == st->out_n) {
        int rc = next_event(st);
        if (rc < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (rc > 0 && st->out_off == st->out_n) return MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = st->out_n - st->out_off < max ? st->out_n - st->out_off : max;
    memcpy(buf, st->out + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

/* Called when the response is done with, sent or not: a client that left
 * cancels its request. */
static void stream_free(void *cls)
{
    stream *st = cls;
    pthread_mutex_lock(&st->r->mu);
    int done = st->r->done;
    pthread_mutex_unlock(&st->r->mu);
    if (!done) {
        khub__ms_req_cancel(st->r);
        st->s->eng->vt->cancel(st->s->eng, st->r);
    }
    account(st->s, st->r);
    khub__ms_req_unref(st->r);
    free(st->out);
    free(st);
}

static MHD_RESULT start_stream(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k,
                               khub__ms_req *r, const khub__ms_params *p, int fd)
{
    stream *st = calloc(1, sizeof *st);
    if (!st) return MHD_NO;
    st->s = s, st->r = r, st->p = *p, st->fd = fd, st->created = time(NULL);
    make_id(s, p->chat, st->id, sizeof st->id);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    k->code = 200;
    MHD_RESULT ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ======================================================================== */
/* Completions                                                              */
/* ======================================================================== */

static MHD_RESULT completion(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k, int chat)
{
    char why[KHUB_ERROR_SIZE];
    cJSON *j = khub__json_parse_strict(k->body ? k->body : "", k->n, why, sizeof why);
    if (!j)
        return khub__ms_send_error(c, k, 400, "invalid_request_error", NULL, 0,
                                   "the request body is not valid JSON: %s", why);
    khub__ms_req *r = khub__ms_req_new();
    khub__ms_params p = {.chat = chat};
    int bad = !r || khub__ms_parse(j, r, &p) != 0;
    cJSON_Delete(j);
    if (bad) {
        khub__ms_req_unref(r);
        return khub__ms_send_error(c, k, r ? 400 : 500,
                                   r ? "invalid_request_error" : "server_error", p.param, 0, "%s",
                                   r ? p.why : "out of memory");
    }
    if (!s->eng->vt->submit(s->eng, r)) {
        khub__ms_req_unref(r);
        return khub__ms_send_error(c, k, 503, "server_error", NULL, 1,
                                   "the server is busy: its queue of waiting requests is full; "
                                   "retry later");
    }
    int fd = khub__ms_conn_fd(c);
    /* Waiting in the queue and generating is not the client's idleness: no
     * timeout meanwhile (a hang-up is seen by polling fd); a stream's
     * keep-alive comments keep its connection active afterwards. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    khub__ms_wait w = khub__ms_req_wait(r, p.stream ? 0 : SIZE_MAX, fd, 0);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->idle_s);
    if (w == KHUB__MS_GONE) { /* nobody to answer: close */
        s->eng->vt->cancel(s->eng, r);
        account(s, r);
        khub__ms_req_unref(r);
        return MHD_NO;
    }
    pthread_mutex_lock(&r->mu);
    unsigned status = r->err_status;
    pthread_mutex_unlock(&r->mu);
    if (p.stream && !(w == KHUB__MS_DONE && status)) return start_stream(s, c, k, r, &p, fd);
    MHD_RESULT ret;
    if (status) {
        ret = khub__ms_send_error(c, k, status, r->err_type ? r->err_type : "server_error", NULL, 0,
                                  "%s", r->err_msg);
    } else {
        char id[48];
        make_id(s, chat, id, sizeof id);
        ret = khub__ms_send_json(c, k, 200, khub__ms_answer(s, &p, r, id, time(NULL)));
    }
    account(s, r);
    khub__ms_req_unref(r);
    return ret;
}

/* ======================================================================== */
/* Models, health, metrics                                                 */
/* ======================================================================== */

static cJSON *model_object(const khub__ms *s)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "khub");
    cJSON_AddNumberToObject(m, "max_model_len", (double)s->max_context);
    return m;
}

static MHD_RESULT models(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k, const char *one)
{
    if (one) {
        if (strcmp(one, s->model_id) != 0)
            return khub__ms_send_error(c, k, 404, "invalid_request_error", "model", 0,
                                       "The model '%.200s' does not exist; this server serves "
                                       "'%s'",
                                       one, s->model_id);
        return khub__ms_send_json(c, k, 200, model_object(s));
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), model_object(s));
    return khub__ms_send_json(c, k, 200, o);
}

static MHD_RESULT metrics(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k)
{
    khub__ms_engine_stats es = {0};
    s->eng->vt->stats(s->eng, &es);
    char text[4096];
    int n = 0;
#define METRIC(name, type, help, fmt, v) \
    n += snprintf(text + n, sizeof text - (size_t)n, \
                  "# HELP khub_" name " " help "\n# TYPE khub_" name " " type "\nkhub_" name \
                  " " fmt "\n", \
                  v)
    METRIC("http_requests_total", "counter", "HTTP requests answered.", "%llu",
           atomic_load(&s->n_requests));
    METRIC("http_errors_total", "counter", "HTTP requests answered with a 4xx or 5xx status.",
           "%llu", atomic_load(&s->n_errors));
    METRIC("completions_total", "counter", "Generation requests finished.", "%llu",
           atomic_load(&s->n_completions));
    METRIC("cancelled_total", "counter", "Generation requests whose client went away.", "%llu",
           atomic_load(&s->n_cancelled));
    METRIC("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", "%llu",
           atomic_load(&s->prompt_tokens));
    METRIC("generated_tokens_total", "counter", "Tokens generated by finished requests.", "%llu",
           atomic_load(&s->completion_tokens));
    METRIC("queue_depth", "gauge", "Generation requests waiting to run.", "%u", es.queued);
    METRIC("batch_size", "gauge", "Generation requests running now.", "%u", es.running);
    METRIC("kv_tokens_used", "gauge", "KV cache positions in use by the running requests.", "%llu",
           (unsigned long long)es.kv_tokens);
    METRIC("kv_tokens_capacity", "gauge", "KV cache positions the running batch may use.", "%llu",
           (unsigned long long)es.kv_capacity);
#undef METRIC
    char *all = khub__ms_kernel_metrics(s, strdup(text));
    if (!all) return khub__ms_send_error(c, k, 500, "server_error", NULL, 0, "out of memory");
    MHD_RESULT ret = khub__ms_send_text(c, k, 200, "text/plain; version=0.0.4", all);
    free(all);
    return ret;
}

/* ======================================================================== */
/* Routing                                                                  */
/* ======================================================================== */

MHD_RESULT khub__ms_route(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k,
                          const char *method, const char *url)
{
    char path[256];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(url, "?"), url);
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    const char *want = NULL;
    if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/v1/completions")) {
        if (post) return completion(s, c, k, path[4] == 'c' && path[5] == 'h');
        want = "POST";
    } else if (!strcmp(path, "/v1/models") || !strncmp(path, "/v1/models/", 11)) {
        if (get) return models(s, c, k, path[10] ? path + 11 : NULL);
        want = "GET";
    } else if (!strcmp(path, "/v1/kernels")) {
        if (get) return khub__ms_kernels(s, c, k);
        want = "GET";
    } else if (!strcmp(path, "/v1/kernels/reload")) {
        if (post) return khub__ms_reload_route(s, c, k);
        want = "POST";
    } else if (!strcmp(path, "/health")) {
        if (get) return khub__ms_send_text(c, k, 200, "application/json", "{\"status\":\"ok\"}");
        want = "GET";
    } else if (!strcmp(path, "/metrics")) {
        if (get) return metrics(s, c, k);
        want = "GET";
    }
    if (want)
        return khub__ms_send_error(c, k, 405, "invalid_request_error", NULL, 0, "%s %.100s: use %s",
                                   method, path, want);
    return khub__ms_send_error(c, k, 404, "invalid_request_error", NULL, 0,
                               "no endpoint %.100s %.200s (see docs/model-server.md)", method,
                               path);
}
