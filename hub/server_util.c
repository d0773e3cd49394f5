/*
 * server_util.c: the helpers every endpoint of `khub serve` uses, below
 * the route files (server_impl.h draws the layers): JSON replies and error
 * replies, the server's own error message, percent-decoding, the
 * server's own URL, the write token check and the checks of request
 * bodies. Nothing here calls another server file.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include "server_impl.h"

/* ======================================================================== */
/* Errors                                                                   */
/* ======================================================================== */

/* The server is a library of its own (libkhub_server) on top of libkhub,
 * whose khub__fail and khub_last_error() message are hidden inside
 * libkhub.so: the server keeps its own thread's message here. */
static _Thread_local char tls_server_error[KHUB_ERROR_SIZE];

khub_status khub__srv_fail(khub_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    khub__verrbuf(tls_server_error, sizeof tls_server_error, fmt, ap);
    va_end(ap);
    return st;
}

void khub__srv_clear_error(void) { tls_server_error[0] = '\0'; }

const char *khub__server_errmsg(void) { return tls_server_error; }

/* ======================================================================== */
/* Replies                                                                  */
/* ======================================================================== */

/* The one place a JSON body becomes a response: Content-Type type, then
 * the optional X-Error-Code, X-Repo-Commit and X-Error-Message headers. */
static MHD_RESULT send_body(struct MHD_Connection *c, unsigned code, cJSON *j, const char *type,
                            const char *err_code, const char *commit, const char *msg)
{
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    if (err_code) MHD_add_response_header(r, "X-Error-Code", err_code);
    if (commit) MHD_add_response_header(r, "X-Repo-Commit", commit);
    if (msg) MHD_add_response_header(r, "X-Error-Message", msg);
    MHD_RESULT ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

MHD_RESULT khub__srv_send_json(struct MHD_Connection *c, unsigned code, cJSON *j,
                               const char *err_code, const char *commit)
{
    return send_body(c, code, j, "application/json", err_code, commit, NULL);
}

MHD_RESULT khub__srv_send_typed(struct MHD_Connection *c, unsigned code, cJSON *j,
                                const char *content_type)
{
    return send_body(c, code, j, content_type, NULL, NULL, NULL);
}

MHD_RESULT khub__srv_send_error(struct MHD_Connection *c, unsigned code, const char *err_code,
                                const char *commit, const char *msg)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "error", msg);
    return send_body(c, code, j, "application/json", err_code, commit, msg);
}

void khub__srv_self_url(struct MHD_Connection *c, char *buf, size_t size)
{
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    snprintf(buf, size, "http://%s",
             host && host[0] && !strpbrk(host, "/\\\"<> ") ? host : "127.0.0.1");
}

/* ======================================================================== */
/* Request helpers                                                          */
/* ======================================================================== */

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Percent-decodes s in place; returns 0 on a bad escape or an embedded NUL. */
int khub__srv_pct_decode(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p == '%') {
            int h = hexval((unsigned char)p[1]), l = h < 0 ? -1 : hexval((unsigned char)p[2]);
            if (h < 0 || l < 0 || (h == 0 && l == 0)) return 0;
            *o++ = (char)(h * 16 + l);
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return 1;
}

/* With --token T every write needs "Authorization: Bearer T"; reads stay
 * open unless they carry another token (khub__srv_read_auth). The compare is constant-time over the
 * expected length. server.c asks at the headers, before any of the body is read; route_write asks
 * again (the same answer) so that no write path depends on that order. */
int khub__srv_write_allowed(const khub__server *s, struct MHD_Connection *c)
{
    if (!s->token) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *t = h + 7;
    size_t n = strlen(s->token);
    if (strlen(t) != n) return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(t[i] ^ s->token[i]);
    return diff == 0;
}

int khub__srv_is_sha256_lower(const char *s)
{
    if (!khub__is_sha256_hex(s)) return 0;
    for (const char *p = s; *p; p++)
        if (*p >= 'A' && *p <= 'F') return 0;
    return 1;
}

/* A JSON number that is a whole byte count in [0, max]. */
int khub__srv_json_size(const cJSON *v, uint64_t max, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > (double)max ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

/* ======================================================================== */
/* Paths inside a commit                                                    */
/* ======================================================================== */

/* Walks rel below dir one component at a time with O_NOFOLLOW: a symlink
 * anywhere on the way (a folder of DIR linked to /etc, say) ends the walk,
 * where lstat of the joined path would check the last component only and
 * follow the others out of DIR. */
int khub__srv_open_in(const char *dir, const char *rel, struct stat *sb)
{
    if (!khub__path_is_safe(rel)) return -1;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (const char *p = rel; fd >= 0;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        char name[256];
        if (n >= sizeof name) {
            close(fd);
            return -1;
        }
        memcpy(name, p, n);
        name[n] = '\0';
        /* O_NONBLOCK: a FIFO opens without waiting for a writer (and is
         * then refused by the caller's S_ISREG) */
        int next = openat(fd, name,
                          O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY |
                              (slash ? O_DIRECTORY : 0));
        close(fd);
        fd = next;
        if (!slash) break;
        p = slash + 1;
    }
    if (fd >= 0 && fstat(fd, sb) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int khub__srv_stat_in(const char *dir, const char *rel, struct stat *sb)
{
    int fd = khub__srv_open_in(dir, rel, sb);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}
