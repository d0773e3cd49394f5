/*
 * server_faults.c: the faults `khub serve` injects for the tests, by name
 * (--fault or $KHUB_SERVE_FAULTS; their table is in docs/hub-server.md):
 * the names and budgets, the injected 503 and 429 answers, and the
 * reshaped GET bodies. redirect-loop, cross-host and ignore-range are one
 * branch each where they act (server_read.c). A budget is an atomic count:
 * each request takes one unit or none.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server_impl.h"

/* ======================================================================== */
/* Names and budgets                                                        */
/* ======================================================================== */

khub_status khub__srv_parse_faults(khub__server *s, const char *list)
{
    static const struct {
        const char *name;
        unsigned bit;
        int def;
    } names[] = {{"drop-body", F_DROP, 1},
                 {"short-body", F_SHORT, 0},
                 {"extra-bytes", F_EXTRA, 0},
                 {"wrong-hash", F_WRONG_HASH, 0},
                 {"429", F_429, 1},
                 {"503", F_503, 2},
                 {"redirect-loop", F_LOOP, 0},
                 {"cross-host", F_CROSS_HOST, 0},
                 {"ignore-range", F_IGNORE_RANGE, 0},
                 {"rate", F_RATE, 0},
                 {"ratelimit", F_RATELIMIT, 1},
                 {"408", F_408, 1},
                 {"gated", F_GATED, 0},
                 {"moved", F_MOVED, 0},
                 {"tree-dotdot", F_TREE_DOTDOT, 0},
                 {"tree-absolute", F_TREE_ABS, 0},
                 {"wrong-commit", F_WRONG_COMMIT, 0},
                 {"link-away", F_LINK_AWAY, 0},
                 {"link-userinfo", F_LINK_USERINFO, 0},
                 {"trickle", F_TRICKLE, 0}};
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list ? list : "");
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        char *eq = strchr(t, '=');
        int count = -1;
        if (eq) {
            *eq = '\0';
            count = atoi(eq + 1);
        }
        size_t i;
        for (i = 0; i < sizeof names / sizeof names[0]; i++)
            if (!strcmp(t, names[i].name)) break;
        if (i == sizeof names / sizeof names[0])
            return khub__srv_fail(
                KHUB_STATUS_INVALID_ARG,
                "unknown fault \"%s\"; known: drop-body[=N], short-body, "
                "extra-bytes, wrong-hash, 429[=N], 503[=N], redirect-loop, "
                "cross-host, ignore-range, rate=MIB_PER_S, ratelimit[=N], 408[=N], gated, "
                "moved, tree-dotdot, tree-absolute, wrong-commit, link-away, link-userinfo, "
                "trickle=BYTES_PER_S",
                t);
        if (names[i].bit == F_RATE && (count < 1 || count > 1000000))
            return khub__srv_fail(KHUB_STATUS_INVALID_ARG,
                                  "fault rate needs a speed in MiB/s, 1..1000000 (rate=500)");
        if (names[i].bit == F_TRICKLE && (count < 1 || count > 1000000))
            return khub__srv_fail(KHUB_STATUS_INVALID_ARG,
                                  "fault trickle needs a speed in bytes/s, 1..1000000 (trickle=2)");
        s->faults |= names[i].bit;
        int c = count >= 0 ? count : names[i].def;
        if (names[i].bit == F_DROP) atomic_store(&s->budget_drop, c);
        if (names[i].bit == F_429) atomic_store(&s->budget_429, c);
        if (names[i].bit == F_503) atomic_store(&s->budget_503, c);
        if (names[i].bit == F_RATELIMIT) atomic_store(&s->budget_ratelimit, c);
        if (names[i].bit == F_408) atomic_store(&s->budget_408, c);
        if (names[i].bit == F_RATE) s->rate = (uint64_t)c << 20;
        if (names[i].bit == F_TRICKLE) s->trickle = (uint64_t)c;
    }
    return KHUB_STATUS_OK;
}

static int take(atomic_int *budget)
{
    int v = atomic_load(budget);
    while (v > 0)
        if (atomic_compare_exchange_weak(budget, &v, v - 1)) return 1;
    return 0;
}

int khub__srv_fault_reply(khub__server *s, struct MHD_Connection *c, MHD_RESULT *ret)
{
    if ((s->faults & F_503) && take(&s->budget_503)) {
        *ret = khub__srv_send_error(c, 503, NULL, NULL, "injected 503");
        return 1;
    }
    if (s->faults & F_GATED) {
        *ret = khub__srv_send_error(c, 403, "GatedRepo", NULL,
                                    "Access to this repo is restricted. You must have access to "
                                    "it and be authenticated to access it.");
        return 1;
    }
    if ((s->faults & F_408) && take(&s->budget_408)) {
        *ret = khub__srv_send_error(c, 408, NULL, NULL, "injected 408");
        return 1;
    }
    if ((s->faults & F_RATELIMIT) && take(&s->budget_ratelimit)) {
        /* The window is used up and ends now: the client waits t + 1 = 1 s. */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "RateLimit", "\"resolvers\";r=0;t=0");
        MHD_add_response_header(r, "RateLimit-Policy",
                                "\"fixed window\";\"resolvers\";q=3000;w=300");
        *ret = MHD_queue_response(c, 429, r);
        MHD_destroy_response(r);
        return 1;
    }
    if ((s->faults & F_429) && take(&s->budget_429)) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Retry-After", "1");
        *ret = MHD_queue_response(c, 429, r);
        MHD_destroy_response(r);
        return 1;
    }
    return 0;
}

/* ======================================================================== */
/* Bodies                                                                   */
/* ======================================================================== */

/* A body read from the file as MHD asks for it, never buffered whole.
 * The fault knobs shape it: extra trailing bytes, a flipped first byte,
 * a stop point after which the connection fails, a pace (rate: a link of
 * that speed, for benchmarks). Without faults a body goes out through
 * MHD_create_response_from_fd (sendfile). */
typedef struct body {
    int fd;
    uint64_t off, len; /* the file's bytes [off, off + len) */
    uint64_t n, stop;  /* n: body size (len + extra); stop: bytes before failing */
    int flip;          /* XOR the first byte (wrong-hash) */
    uint64_t rate;     /* bytes per second, 0 = as fast as it goes */
    size_t piece;      /* trickle: at most this many bytes per read, 0 = any */
    double t0;         /* when the first byte was asked for (rate) */
} body;

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Sleeps until sending up to byte `end` keeps the body at its rate. */
static void pace(body *b, uint64_t pos, uint64_t end)
{
    if (!b->rate) return;
    if (pos == 0 || b->t0 == 0) b->t0 = mono_s();
    double wait = b->t0 + (double)end / (double)b->rate - mono_s();
    if (wait <= 0) return;
    struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static ssize_t body_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    body *b = cls;
    if (pos >= b->stop) return MHD_CONTENT_READER_END_WITH_ERROR;
    uint64_t want = b->stop - pos;
    size_t n = want < max ? (size_t)want : max;
    if (b->piece && n > b->piece) n = b->piece;
    pace(b, pos, pos + n);
    size_t from_file = pos < b->len ? (size_t)(b->len - pos < n ? b->len - pos : n) : 0;
    size_t got = 0;
    while (got < from_file) {
        ssize_t r = pread(b->fd, buf + got, from_file - got, (off_t)(b->off + pos + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return MHD_CONTENT_READER_END_WITH_ERROR; /* the file shrank */
        got += (size_t)r;
    }
    memset(buf + from_file, 'X', n - from_file);
    if (b->flip && pos == 0 && n > 0) buf[0] ^= 0x5a;
    return (ssize_t)n;
}

static void body_free(void *cls)
{
    body *b = cls;
    close(b->fd);
    free(b);
}

int khub__srv_body_faults(const khub__server *s)
{
    return (s->faults & (F_EXTRA | F_WRONG_HASH | F_SHORT | F_DROP | F_RATE | F_TRICKLE)) != 0;
}

struct MHD_Response *khub__srv_fault_body(khub__server *s, int fd, uint64_t off, uint64_t len,
                                          const char **why)
{
    body *b = calloc(1, sizeof *b);
    if (!b) {
        close(fd);
        *why = "out of memory";
        return NULL;
    }
    *b = (body){fd, off, len, len, len, 0, s->faults & F_RATE ? s->rate : 0, 0, 0};
    if (s->faults & F_TRICKLE) { /* a few bytes at a time, 4 pieces a second */
        b->rate = s->trickle;
        b->piece = s->trickle >= 4 ? (size_t)(s->trickle / 4) : 1;
    }
    if (s->faults & F_EXTRA) b->n = b->stop = len + 16;
    b->flip = (s->faults & F_WRONG_HASH) && len > 0;
    if (s->faults & F_SHORT) b->n = b->stop = len / 2;
    if ((s->faults & F_DROP) && len > 1 && take(&s->budget_drop)) b->stop = len / 2;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(b->n, 256 * 1024, body_read, b, body_free);
    if (!resp) {
        body_free(b);
        *why = "cannot create the response";
    }
    return resp;
}
