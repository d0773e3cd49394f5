/*
 * khub_server.h: the local hub server, the library behind `khub serve`
 * (libkhub_server, linked on top of libkhub; it alone links libmicrohttpd).
 * It serves a folder of kernel repos with the read and upload endpoints of
 * the Hugging Face Hub protocol, so khub, huggingface_hub and the kernels
 * library use it through HF_ENDPOINT. docs/hub-server.md describes the
 * folder layout, the endpoints, the limits and the test faults.
 *
 *     khub_server_opts so = {KHUB_APP_INIT(khub_server_opts), .dir = "repos"};
 *     khub_server *srv = NULL;
 *     char err[KHUB_ERROR_SIZE];
 *     if (khub_server_start(&so, &srv, err, sizeof err) != KHUB_STATUS_OK)
 *         return fprintf(stderr, "%s\n", err), 1;
 *     printf("HF_ENDPOINT=http://127.0.0.1:%u\n", khub_server_port(srv));
 *     ...                                          // serves in its own threads
 *     khub_server_stop(srv);
 *
 * Link with -lkhub_server -lkhub.
 *
 * Errors: khub_server_start is the only fallible function; its one-line
 * message goes into the caller's buffer (libkhub_server keeps no error state
 * of its own, and khub_last_error() belongs to libkhub).
 *
 * Threading: the server answers requests in threads of its own (one per
 * connection). The query functions may be called from any thread while it
 * runs; khub_server_stop must not race with them.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_SERVER_H
#define KHUB_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What to serve and how. Strings are copied or used during
 * khub_server_start only. Zero means the default for every number. */
typedef struct khub_server_opts {
    KHUB_STRUCT_HEADER;
    const char *dir;  /* required: the repos folder, <dir>/<org>/<name>/refs.json and
                         commits/<sha>/ (docs/hub-server.md) */
    const char *host; /* IPv4 address to bind; NULL or "localhost" = 127.0.0.1 */
    uint16_t port;    /* 0 = a free ephemeral port (khub_server_port says which) */
    uint16_t reserved0;
    uint32_t page_size;   /* tree entries per listing page; 0 = 1000 */
    const char *token;    /* writes need "Authorization: Bearer <token>" (reads stay open);
                             NULL or "" = writes are open to anyone who can connect */
    const char *log_path; /* 0.1: the access log appended to this file, when log is NULL;
                             new code sets log (the library writes no file of its own
                             then) */
    /* Test faults, "drop-body=1,ignore-range" (the table in docs/hub-server.md):
     * NULL = $KHUB_SERVE_FAULTS, "" = none. For testing clients only. */
    const char *faults;
    uint32_t max_connections; /* open connections in all; 0 = 512 */
    uint32_t max_per_ip;      /* open connections per client address; 0 = 64 */
    uint32_t idle_timeout_s;  /* a connection silent this long is closed, s; 0 = 15 */
    uint32_t reserved1;
    uint64_t max_body; /* bytes of an authenticated write's body (over: 413); 0 = 64 MiB */
    /* End of 0.1. */
    /* The access log: one line per request, "GET /api/kernels/org/name
     * auth=yes|no range=<Range or -> ua=<User-Agent or ->" (no newline), at
     * KHUB_LOG_INFO, called from the server's threads one call at a time
     * until khub_server_stop returns. NULL = no access log (or log_path's
     * file). Added in 0.2. */
    khub_log_fn log;
    void *log_ud;
} khub_server_opts;

typedef struct khub_server khub_server;

/* Starts serving opts->dir in background threads and returns at once. Only
 * the first opts->struct_size bytes of opts are read. On failure *out is
 * NULL and, when errbuf is not NULL, its errbuf_size bytes (KHUB_ERROR_SIZE
 * always suffice) get the message. Statuses: NOT_FOUND (dir is not a
 * directory), INVALID_ARG (host is not an IPv4 address, an unknown fault or
 * a fault without its value), IO (log_path cannot be opened, the address
 * cannot be bound: "serve: cannot listen on 127.0.0.1:8080 (port in
 * use?)"), STRUCT_SIZE (opts older than 0.1), NOMEM, MISUSE (opts or out
 * NULL). Since 0.1. */
KHUB_API khub_status khub_server_start(const khub_server_opts *opts, khub_server **out,
                                       char *errbuf, size_t errbuf_size);
/* The TCP port the server listens on (the chosen one when opts.port was 0). */
KHUB_API uint16_t khub_server_port(const khub_server *srv);
/* Requests answered so far, all endpoints. Since 0.1. */
KHUB_API uint64_t khub_server_request_count(const khub_server *srv);
/* TCP connections accepted so far (a client that reuses connections opens
 * few). Since 0.1. */
KHUB_API uint64_t khub_server_connection_count(const khub_server *srv);
/* Stops accepting, waits for the requests in flight, frees srv. Accepts
 * NULL. Since 0.1. */
KHUB_API void khub_server_stop(khub_server *srv);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_SERVER_H */
