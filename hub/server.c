/*
 * server.c: `khub serve`, a local Hub on libmicrohttpd for a folder of
 * kernel repos (layout in docs/hub-server.md; on disk: server_store.c).
 *
 * It answers, for the "kernels/" and model ("") prefixes, the read subset
 * of the protocol that huggingface_hub needs (server_read.c) and the upload
 * subset: repos/create, preupload, the LFS batch API with basic transfers
 * to capability URLs, verify, NDJSON or JSON commits, branches, tags,
 * validate-yaml (server_write.c, server_commit.c, server_lfs.c). Faults
 * for the tests are injected by name (server_faults.c). The map of the
 * files is in server_impl.h.
 *
 * This file is the daemon: start and stop, the per-request state and its
 * buffered body, and routing. The reply helpers every endpoint uses are
 * server_util.c's, below the route files, which never call back here.
 *
 * URLs are split into segments before percent-decoding (a revision such as
 * refs%2Fpr%2F1 is one segment), so libmicrohttpd's own unescaping is
 * replaced by an identity callback.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_impl.h"

/* ======================================================================== */
/* Request bodies                                                           */
/* ======================================================================== */

static void conn_free(conn *k)
{
    if (!k) return;
    if (k->put_fd > 0) close(k->put_fd);
    if (k->put_tmp[0]) unlink(k->put_tmp);
    free(k->body);
    free(k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    conn_free(*con_cls);
    *con_cls = NULL;
}

static void conn_append(conn *k, const char *data, size_t n)
{
    size_t need;
    if (k->too_big || !khub__add_ok(k->n, n + 1, &need) || need > k->limit + 1) {
        k->too_big = 1;
        return;
    }
    if (need > k->cap) {
        size_t cap = k->cap ? k->cap : 4096;
        while (cap < need) cap *= 2;
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

/* ======================================================================== */
/* Routing                                                                  */
/* ======================================================================== */

#define MAX_SEGS 64

/* Splits the path of url into percent-decoded segments (in buf); -1 when
 * too long, -2 on a bad escape. */
static int split_url(const char *url, char *buf, size_t size, char **seg)
{
    if (snprintf(buf, size, "%s", url) >= (int)size) return -1;
    char *q = strchr(buf, '?'), *save = NULL;
    if (q) *q = '\0';
    int n = 0;
    for (char *p = strtok_r(buf, "/", &save); p && n < MAX_SEGS; p = strtok_r(NULL, "/", &save))
        seg[n++] = p;
    for (int i = 0; i < n; i++)
        if (!khub__srv_pct_decode(seg[i])) return -2;
    return n;
}

static void log_request(khub__server *s, struct MHD_Connection *c, const char *method,
                        const char *url)
{
    if (!s->log) return;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    const char *ua = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "User-Agent");
    char line[KHUB_ERROR_SIZE * 2];
    snprintf(line, sizeof line, "%s %s auth=%s range=%s ua=%s", method, url, auth ? "yes" : "no",
             range ? range : "-", ua ? ua : "-");
    for (char *p = line; *p; p++) /* one line: a client's header holds no newline */
        if (*p == '\n' || *p == '\r') *p = ' ';
    pthread_mutex_lock(&s->log_lock);
    s->log(s->log_ud, KHUB_LOG_INFO, line);
    pthread_mutex_unlock(&s->log_lock);
}

static MHD_RESULT route(khub__server *s, struct MHD_Connection *c, const char *url,
                        const char *method, conn *kc)
{
    int head = strcmp(method, "HEAD") == 0;
    MHD_RESULT ret;
    if (khub__srv_fault_reply(s, c, &ret)) return ret;
    char buf[8192];
    char *seg[MAX_SEGS];
    int n = split_url(url, buf, sizeof buf, seg);
    if (n == -1) return khub__srv_send_error(c, 414, NULL, NULL, "URL too long");
    if (n < 0) return khub__srv_send_error(c, 400, NULL, NULL, "bad percent-escape");
    if (!strcmp(method, "POST") && khub__srv_is_paths_info(seg, n))
        return khub__srv_route_paths_info(s, c, seg, kc);
    if (!head && strcmp(method, "GET") != 0) {
        pthread_mutex_lock(&s->write_lock);
        ret = khub__srv_route_write(s, c, method, seg, n, kc);
        pthread_mutex_unlock(&s->write_lock);
        return ret;
    }
    return khub__srv_route_read(s, c, url, head, seg, n);
}

/* The body limit of a request, from its method and path: an LFS capability
 * PUT may send the size its URL declares, a write --max-body, anything else
 * (paths-info, a stray body on a GET) MAX_READ_BODY. */
static uint64_t body_limit(const khub__server *s, const conn *k, int write)
{
    if (k->put_fd > 0) return k->put_want;
    return write ? s->max_body : MAX_READ_BODY;
}

/* The first call, with the headers and none of the body: a write without
 * the token gets its 401 and a body announced over the limit its 413 now,
 * so that no byte of either is read (issue 10: 16 unauthenticated uploads
 * used to be buffered whole, 900 MB, before the 401). A queued answer makes
 * libmicrohttpd skip the body of a POST or PUT and close the connection.
 * 1 and *ret set when it answered. */
static int answer_at_headers(khub__server *s, struct MHD_Connection *c, const char *url,
                             const char *method, conn *k, MHD_RESULT *ret)
{
    char buf[8192], *seg[MAX_SEGS];
    int read = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    int n = read ? 0 : split_url(url, buf, sizeof buf, seg);
    int put = !strcmp(method, "PUT") && n > 0 && !strcmp(seg[0], "lfs-upload");
    int write = !read && !put && !(!strcmp(method, "POST") && khub__srv_is_paths_info(seg, n));
    if (put) {
        khub__srv_put_begin(s, k, seg, n);
        if (k->put_code) {
            *ret = khub__srv_send_error(c, k->put_code, NULL, NULL, k->put_err);
            return 1;
        }
    }
    k->unauth = write && !khub__srv_write_allowed(s, c);
    k->limit = k->unauth ? MAX_UNAUTH_BODY : body_limit(s, k, write);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    char *end = NULL;
    unsigned long long len = cl ? strtoull(cl, &end, 10) : 0;
    int over = cl && (end == cl || *end || len > k->limit);
    /* A small body without the token is read, dropped, and answered 401
     * after it (route_write): answering first and closing with the body
     * unread can reset the connection before the client reads the 401.
     * A large or chunked one is answered now. */
    if (k->unauth && (over || !cl)) {
        *ret = khub__srv_send_error(c, 401, NULL, NULL,
                                    "Invalid credentials in Authorization header: "
                                    "writes need the server's token");
        return 1;
    }
    if (over) {
        char msg[160];
        snprintf(msg, sizeof msg, "request body of %s bytes is over this request's limit of %llu",
                 cl, (unsigned long long)k->limit);
        *ret = khub__srv_send_error(c, 413, NULL, NULL, msg);
        return 1;
    }
    return 0;
}

static MHD_RESULT on_request(void *cls, struct MHD_Connection *c, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **con_cls)
{
    khub__server *s = cls;
    conn *k = *con_cls;
    (void)version;
    if (k == NULL) { /* first call: headers only */
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *con_cls = k;
        MHD_RESULT ret;
        if (!answer_at_headers(s, c, url, method, k, &ret)) return MHD_YES;
        k->answered = 1;
        atomic_fetch_add(&s->n_requests, 1);
        log_request(s, c, method, url);
        return ret;
    }
    if (*upload_size) { /* a chunk of the body */
        /* A body past its limit (chunked, or longer than its
         * Content-Length said) is cut: the connection closes. */
        if (k->answered || *upload_size > k->limit - k->got) return MHD_NO;
        k->got += *upload_size;
        if (k->put_fd > 0 || k->put_code)
            khub__srv_put_data(k, upload, *upload_size);
        else if (!k->unauth) /* dropped: route_write answers 401 */
            conn_append(k, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (k->answered) return MHD_YES;
    atomic_fetch_add(&s->n_requests, 1);
    log_request(s, c, method, url);
    return route(s, c, url, method, k);
}

static size_t keep_escaped(void *cls, struct MHD_Connection *c, char *uri)
{
    (void)cls;
    (void)c;
    return strlen(uri);
}

/* ======================================================================== */
/* Lifecycle                                                                */
/* ======================================================================== */

/* Counts accepted connections (tests check that a client reuses one). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code)
{
    (void)c;
    (void)socket_ctx;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add(&((khub__server *)cls)->n_connections, 1);
}

khub_status khub__server_start(const khub__server_opts *o, khub__server **out)
{
    *out = NULL;
    khub__srv_clear_error();
    struct stat sb;
    if (!o->dir || stat(o->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return khub__srv_fail(KHUB_STATUS_NOT_FOUND,
                              "serve: %s is not a directory of repos (see docs/hub-server.md)",
                              o->dir ? o->dir : "(null)");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(o->port)};
    const char *host = o->host ? o->host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return khub__srv_fail(KHUB_STATUS_INVALID_ARG,
                              "serve: host %s (khub_server_opts.host) is not an IPv4 address "
                              "(use 127.0.0.1)",
                              host);
    khub__server *s = calloc(1, sizeof *s);
    if (!s) return khub__srv_fail(KHUB_STATUS_NOMEM, "serve: out of memory");
    khub_status st = KHUB_STATUS_OK;
    pthread_mutex_init(&s->log_lock, NULL);
    pthread_mutex_init(&s->write_lock, NULL);
    s->dir = realpath(o->dir, NULL);
    if (!(s->dc = khub__srv_digest_cache_new())) {
        st = khub__srv_fail(KHUB_STATUS_NOMEM, "serve: out of memory");
        goto fail;
    }
    khub__srv_random_hex(s->secret, 32);
    if (o->token && o->token[0] && !(s->token = strdup(o->token))) {
        st = khub__srv_fail(KHUB_STATUS_NOMEM, "serve: out of memory");
        goto fail;
    }
    s->page_size = o->page_size ? o->page_size : 1000;
    st = khub__srv_parse_faults(s, o->faults ? o->faults : getenv("KHUB_SERVE_FAULTS"));
    if (st != KHUB_STATUS_OK) goto fail;
    s->log = o->log;
    s->log_ud = o->log_ud;
    s->max_body = o->max_body ? o->max_body : KHUB__SRV_MAX_BODY;
    /* Thread per connection (the handlers block: the write lock, hashing a
     * commit, the paced fault bodies), polled with poll() so that no
     * FD_SETSIZE caps it; the limits bound the threads and memory a client
     * can hold: at most max_connections * max_body bytes of bodies, and
     * MAX_READ_BODY for a client without the token. An idle connection
     * (headers trickled, a body that stops, a reader that stops reading)
     * is closed after idle_timeout_s. */
    unsigned max_conn = o->max_connections ? o->max_connections : KHUB__SRV_MAX_CONNECTIONS;
    unsigned per_ip = o->max_per_ip ? o->max_per_ip : KHUB__SRV_MAX_PER_IP;
    unsigned idle = o->idle_timeout_s ? o->idle_timeout_s : KHUB__SRV_IDLE_S;
    s->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL, 0, NULL,
        NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_UNESCAPE_CALLBACK, keep_escaped,
        NULL, MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_CONNECTION_LIMIT, max_conn,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_END);
    if (!s->d) {
        st = khub__srv_fail(KHUB_STATUS_IO, "serve: cannot listen on %s:%u (port in use?)", host,
                            o->port);
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : o->port;
    *out = s;
    return KHUB_STATUS_OK;
fail:
    khub__server_stop(s);
    return st;
}

uint16_t khub__server_port(const khub__server *s) { return s->port; }
uint64_t khub__server_requests(const khub__server *s) { return atomic_load(&s->n_requests); }
uint64_t khub__server_connections(const khub__server *s) { return atomic_load(&s->n_connections); }

void khub__server_stop(khub__server *s)
{
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d);
    khub__srv_digest_cache_free(s->dc);
    pthread_mutex_destroy(&s->log_lock);
    pthread_mutex_destroy(&s->write_lock);
    if (s->token) memset(s->token, 0, strlen(s->token));
    free(s->token);
    free(s->dir);
    free(s);
}
