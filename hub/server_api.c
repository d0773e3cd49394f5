/*
 * server_api.c: the public face of the local hub server (khub/khub_server.h)
 * over khub__server_* (server.c). The server's own error message is kept
 * by server_util.c, below every server file.
 *
 * The server is a library of its own, libkhub_server, linked on top of
 * libkhub: libkhub's internal khub__fail and the thread-local message behind
 * khub_last_error() are hidden inside libkhub.so, so the server keeps its
 * message (server_util.c) and khub_server_start hands it to the caller's
 * buffer.
 * (Rejected: exporting an internal setter from libkhub, which would put a
 * non-API symbol in its ABI; and a second khub_last_error, which would
 * shadow libkhub's.)
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app_struct.h"
#include "khub/khub_server.h"
#include "server_impl.h"

/* ======================================================================== */
/* Public API                                                               */
/* ======================================================================== */

/* The public handle wraps the internal one, so the two names never alias. */
struct khub_server {
    khub__server *s;
    FILE *log_file; /* 0.1's log_path, when no log callback is given */
};

/* 0.1's log_path: the access log through the same callback, into a file
 * this wrapper owns. (New callers pass their own callback: the library
 * itself writes no log file.) */
static void log_to_file(void *ud, khub_log_level level, const char *msg)
{
    (void)level;
    FILE *f = ud;
    fprintf(f, "%s\n", msg);
    fflush(f);
}

static khub_status start_fail(khub_status st, char *errbuf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static khub_status start_fail(khub_status st, char *errbuf, size_t size, const char *fmt, ...)
{
    if (fmt) {
        char msg[KHUB_ERROR_SIZE];
        va_list ap;
        va_start(ap, fmt);
        khub__verrbuf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        khub__srv_fail(st, "%s", msg);
    }
    if (errbuf && size) snprintf(errbuf, size, "%s", khub__server_errmsg());
    return st;
}

khub_status khub_server_start(const khub_server_opts *opts, khub_server **out, char *errbuf,
                              size_t errbuf_size)
{
    khub__srv_clear_error();
    if (out) *out = NULL;
    if (!opts || !out)
        return start_fail(KHUB_STATUS_MISUSE, errbuf, errbuf_size, "khub_server_start: %s is NULL",
                          opts ? "out" : "opts");
    /* Only what the caller's struct has: a 0.1 caller's is shorter. */
    khub_server_opts so;
    char msg[KHUB_ERROR_SIZE];
    khub_status st = khub__app_read(&so, sizeof so, opts, KHUB__SIZE_TO(khub_server_opts, max_body),
                                    "khub_server_start", "opts", msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return start_fail(st, errbuf, errbuf_size, "%s", msg);
    khub__server_opts o = {.dir = so.dir,
                           .host = so.host,
                           .port = so.port,
                           .page_size = so.page_size,
                           .faults = so.faults,
                           .log = so.log,
                           .log_ud = so.log_ud,
                           .token = so.token,
                           .max_connections = so.max_connections,
                           .max_per_ip = so.max_per_ip,
                           .idle_timeout_s = so.idle_timeout_s,
                           .max_body = so.max_body};
    khub_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return start_fail(KHUB_STATUS_NOMEM, errbuf, errbuf_size,
                          "khub_server_start: out of memory");
    if (!o.log && so.log_path) {
        if (!(srv->log_file = fopen(so.log_path, "a"))) {
            int e = errno;
            free(srv);
            return start_fail(KHUB_STATUS_IO, errbuf, errbuf_size, "serve: cannot open log %s: %s",
                              so.log_path, strerror(e));
        }
        o.log = log_to_file;
        o.log_ud = srv->log_file;
    }
    st = khub__server_start(&o, &srv->s);
    if (st != KHUB_STATUS_OK) {
        if (srv->log_file) fclose(srv->log_file);
        free(srv);
        return start_fail(st, errbuf, errbuf_size, NULL);
    }
    if (errbuf && errbuf_size) errbuf[0] = '\0';
    *out = srv;
    return KHUB_STATUS_OK;
}

uint16_t khub_server_port(const khub_server *srv) { return srv ? khub__server_port(srv->s) : 0; }

uint64_t khub_server_request_count(const khub_server *srv)
{
    return srv ? khub__server_requests(srv->s) : 0;
}

uint64_t khub_server_connection_count(const khub_server *srv)
{
    return srv ? khub__server_connections(srv->s) : 0;
}

void khub_server_stop(khub_server *srv)
{
    if (!srv) return;
    khub__server_stop(srv->s);
    if (srv->log_file) fclose(srv->log_file);
    free(srv);
}
