/*
 * ms_http.c: the model server's daemon on libmicrohttpd: start and stop,
 * per-request state, request bodies under a limit, the API key, replies.
 * The endpoints are ms_routes.c's.
 *
 * Every request is hostile until proven otherwise:
 *  - a body announced over the limit is answered 413 at the headers, before
 *    a byte of it is read; a chunked one that grows past it is dropped as
 *    it comes and answered 413 after (cut off at 16 times the limit);
 *  - a /v1 request without the key has its body (within the limit) read
 *    and dropped and is answered 401 (answering first and closing with the
 *    body unread can reset the connection before the client reads its 401);
 *  - connections are capped in all and per address, a silent one is closed
 *    after the idle timeout, and libmicrohttpd's per-connection memory
 *    limit answers an oversized header block (10k headers) itself.
 * Thread per connection: a completion request blocks its thread while it
 * waits in the engine's queue and runs, so the connection cap also caps
 * the threads.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_server.h"

/* ======================================================================== */
/* Replies                                                                  */
/* ======================================================================== */

static MHD_RESULT queue(struct MHD_Connection *c, khub__ms_conn *k, unsigned code, const char *type,
                        char *body, unsigned retry_after)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    if (retry_after) {
        char ra[16];
        snprintf(ra, sizeof ra, "%u", retry_after);
        MHD_add_response_header(resp, "Retry-After", ra);
    }
    if (k) k->code = code;
    MHD_RESULT r = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    return r;
}

MHD_RESULT khub__ms_send_text(struct MHD_Connection *c, khub__ms_conn *k, unsigned code,
                              const char *type, const char *text)
{
    char *body = strdup(text);
    return body ? queue(c, k, code, type, body, 0) : MHD_NO;
}

static MHD_RESULT send_json_ra(struct MHD_Connection *c, khub__ms_conn *k, unsigned code, cJSON *j,
                               unsigned retry_after)
{
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!s) return MHD_NO;
    /* cJSON's allocator is the C library's (never replaced here): free() is
     * what MHD_RESPMEM_MUST_FREE calls. */
    return queue(c, k, code, "application/json", s, retry_after);
}

MHD_RESULT khub__ms_send_json(struct MHD_Connection *c, khub__ms_conn *k, unsigned code, cJSON *j)
{
    return send_json_ra(c, k, code, j, 0);
}

static MHD_RESULT send_error_obj(struct MHD_Connection *c, khub__ms_conn *k, unsigned code,
                                 const char *type, const char *param, const char *err_code,
                                 unsigned retry_after, const char *msg)
{
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param && *param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (err_code)
        cJSON_AddStringToObject(e, "code", err_code);
    else
        cJSON_AddNullToObject(e, "code");
    return send_json_ra(c, k, code, j, retry_after);
}

MHD_RESULT khub__ms_send_error(struct MHD_Connection *c, khub__ms_conn *k, unsigned code,
                               const char *type, const char *param, unsigned retry_after,
                               const char *fmt, ...)
{
    char msg[KHUB_ERROR_SIZE];
    va_list ap;
    va_start(ap, fmt);
    khub__verrbuf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return send_error_obj(c, k, code, type, param, NULL, retry_after, msg);
}

MHD_RESULT khub__ms_send_error_code(struct MHD_Connection *c, khub__ms_conn *k, unsigned code,
                                    const char *type, const char *param, const char *err_code,
                                    const char *msg)
{
    char one[KHUB_ERROR_SIZE];
    khub__errbuf(one, sizeof one, "%s", msg);
    return send_error_obj(c, k, code, type, param, err_code, 0, one);
}

int khub__ms_conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ======================================================================== */
/* Requests                                                                 */
/* ======================================================================== */

/* Whether the request carries "Authorization: Bearer <key>"; always when the
 * server has no key. Constant-time in the key. */
static int authorized(const khub__ms *s, struct MHD_Connection *c)
{
    if (!s->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    size_t n = strlen(s->api_key), m = strlen(h);
    unsigned char d = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(s->api_key[i] ^ (i < m ? h[i] : 0));
    return d == 0;
}

static MHD_RESULT send_401(struct MHD_Connection *c, khub__ms_conn *k)
{
    return khub__ms_send_error(c, k, 401, "invalid_request_error", NULL, 0,
                               "Incorrect or missing API key: send \"Authorization: Bearer "
                               "<key>\" with the key the server was started with");
}

static MHD_RESULT send_413(const khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k,
                           const char *size)
{
    return khub__ms_send_error(c, k, 413, "invalid_request_error", NULL, 0,
                               "request body of %s bytes is over the server's limit of %llu bytes",
                               size, (unsigned long long)s->max_body);
}

static void conn_append(const khub__ms *s, khub__ms_conn *k, const char *data, size_t n)
{
    size_t need;
    if (k->too_big || !khub__add_ok(k->n, n, &need) || need > s->max_body) {
        k->too_big = 1;
        return;
    }
    if (need + 1 > k->cap) {
        size_t cap = k->cap ? k->cap : 4096;
        while (cap < need + 1) cap *= 2;
        char *b = realloc(k->body, cap);
        if (!b) {
            k->too_big = 1;
            return;
        }
        k->body = b;
        k->cap = cap;
    }
    memcpy(k->body + k->n, data, n);
    k->n += n;
    k->body[k->n] = '\0';
}

/* The first call, headers only: a body announced over the limit is
 * answered now. 1 and *ret set when it answered. */
static int answer_at_headers(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k,
                             MHD_RESULT *ret)
{
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    char *end = NULL;
    unsigned long long len = cl ? strtoull(cl, &end, 10) : 0;
    if (cl && (end == cl || *end || len > s->max_body)) {
        *ret = send_413(s, c, k, cl);
        return 1;
    }
    return 0;
}

static MHD_RESULT on_request(void *cls, struct MHD_Connection *c, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **con_cls)
{
    khub__ms *s = cls;
    khub__ms_conn *k = *con_cls;
    (void)version;
    MHD_RESULT ret;
    if (!k) { /* first call: headers only */
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *con_cls = k;
        if (!answer_at_headers(s, c, k, &ret)) return MHD_YES;
        k->answered = 1;
    } else if (*upload_size) { /* a chunk of the body */
        if (k->answered) return MHD_NO;
        k->got += *upload_size;
        if (k->got / 16 > s->max_body) return MHD_NO; /* a chunked flood: close */
        conn_append(s, k, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    } else if (k->answered) {
        return MHD_YES;
    } else if (strncmp(url, "/v1/", 4) == 0 && !authorized(s, c)) {
        ret = send_401(c, k);
    } else if (k->too_big) {
        char got[24];
        snprintf(got, sizeof got, "%llu", (unsigned long long)k->got);
        ret = send_413(s, c, k, got);
    } else {
        ret = khub__ms_route(s, c, k, method, url);
    }
    atomic_fetch_add(&s->n_requests, 1);
    if (k->code >= 400) atomic_fetch_add(&s->n_errors, 1);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    khub__ms_conn *k = *con_cls;
    if (k) free(k->body);
    free(k);
    *con_cls = NULL;
}

/* ======================================================================== */
/* Lifecycle                                                                */
/* ======================================================================== */

khub_status khub__ms_start(khub__ms *s, const char *host, uint16_t port,
                           const khub_model_server_opts *o, char *err, size_t err_size)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (!host || !strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        khub__errbuf(err, err_size,
                     "serve-model: host %s (khub_model_server_opts.host) is not an IPv4 "
                     "address (use 127.0.0.1)",
                     host);
        return KHUB_STATUS_INVALID_ARG;
    }
    unsigned max_conn = o->max_connections ? o->max_connections : 256;
    unsigned per_ip = o->max_per_ip ? o->max_per_ip : 64;
    unsigned idle = o->idle_timeout_s ? o->idle_timeout_s : 30;
    s->idle_s = idle;
    s->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL, 0, NULL,
        NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_TIMEOUT, idle,
        MHD_OPTION_CONNECTION_LIMIT, max_conn, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    if (!s->d) {
        khub__errbuf(err, err_size, "serve-model: cannot listen on %s:%u (port in use?)", host,
                     port);
        return KHUB_STATUS_IO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : port;
    return KHUB_STATUS_OK;
}

void khub__ms_stop(khub__ms *s)
{
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
}
