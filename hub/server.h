/*
 * server.h: the local hub server behind `khub serve` (libmicrohttpd). It
 * serves a folder of kernel repos with the read and upload endpoints of
 * the Hub protocol; docs/hub-server.md describes the folder layout and the fault
 * injection used by the tests. Internal: behind khub/khub_server.h
 * (hub/server_api.c) and used by tests. All of hub/server*.c is
 * libkhub_server, not libkhub.
 */
#ifndef KHUB_HUB_SERVER_H
#define KHUB_HUB_SERVER_H

#include <stdint.h>

#include "hub_impl.h"

typedef struct khub__server khub__server;

typedef struct khub__server_opts {
    const char *dir;    /* the repos folder: <dir>/<org>/<name>/refs.json, commits/<sha>/ */
    const char *host;   /* IPv4 address to bind, NULL = 127.0.0.1 */
    uint16_t port;      /* 0 = an ephemeral port */
    uint32_t page_size; /* tree entries per page, 0 = 1000 */
    const char *faults; /* "drop-body=1,ignore-range", NULL = $KHUB_SERVE_FAULTS */
    khub_log_fn log;    /* one line per request at INFO, one call at a time; NULL = none */
    void *log_ud;
    const char *token; /* writes need "Authorization: Bearer <token>"; NULL = open */
    /* Resource limits (docs/hub-server.md, "Limits"); 0 = the default. */
    uint32_t max_connections; /* open connections in all, KHUB__SRV_MAX_CONNECTIONS */
    uint32_t max_per_ip;      /* open connections per client address, KHUB__SRV_MAX_PER_IP */
    uint32_t idle_timeout_s;  /* a connection silent this long is closed, KHUB__SRV_IDLE_S */
    uint64_t max_body;        /* bytes of an authenticated write's body, KHUB__SRV_MAX_BODY */
} khub__server_opts;

#define KHUB__SRV_MAX_CONNECTIONS 512u
#define KHUB__SRV_MAX_PER_IP      64u
#define KHUB__SRV_IDLE_S          15u
#define KHUB__SRV_MAX_BODY        (64ull << 20)

/* Starts serving in background threads. Statuses: INVALID_ARG (bad host or
 * fault name), NOT_FOUND (dir), IO (bind). Message in khub__server_errmsg():
 * the server is its own library (libkhub_server), which cannot reach
 * libkhub's khub_last_error(). */
KHUB_INTERNAL khub_status khub__server_start(const khub__server_opts *o, khub__server **out);
KHUB_INTERNAL uint16_t khub__server_port(const khub__server *s);
/* Requests served so far (all endpoints). */
KHUB_INTERNAL uint64_t khub__server_requests(const khub__server *s);
/* TCP connections accepted so far. */
KHUB_INTERNAL uint64_t khub__server_connections(const khub__server *s);
KHUB_INTERNAL void khub__server_stop(khub__server *s);
/* This thread's message of the last failed khub__server_start, "" if none
 * (thread-local, valid until the next failure on the thread). */
KHUB_INTERNAL const char *khub__server_errmsg(void);

#endif /* KHUB_HUB_SERVER_H */
