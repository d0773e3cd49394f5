/*
 * ms_request.c: one generation request, shared by the connection that
 * asked for it and the engine that runs it. The engine appends text and
 * finishes it; the connection waits for text, reads it, and cancels it when
 * its client hangs up. Two references (connection, engine) keep it alive
 * until both are done with it, whichever order they finish in.
 *
 * Hang-ups are noticed by polling the client's socket for POLLRDHUP while
 * waiting: libmicrohttpd notices a closed connection only when it next
 * writes, which for a queued or slow request could be minutes later, and a
 * cancelled request must free its place at once (issue 16 item 3).
 */
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_server.h"

khub__ms_req *khub__ms_req_new(void)
{
    khub__ms_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->refs = 1;
    r->top_p = 1.0f;
    clock_gettime(CLOCK_MONOTONIC, &r->t_sub);
    return r;
}

void khub__ms_req_ref(khub__ms_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->refs++;
    pthread_mutex_unlock(&r->mu);
}

static void req_free(khub__ms_req *r)
{
    for (size_t i = 0; i < r->n_msgs; i++) {
        free(r->roles[i]);
        free(r->contents[i]);
    }
    free(r->roles);
    free(r->contents);
    free(r->prompt);
    for (uint32_t i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->text);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void khub__ms_req_unref(khub__ms_req *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (last) req_free(r);
}

int khub__ms_req_append(khub__ms_req *r, const char *text, size_t len)
{
    pthread_mutex_lock(&r->mu);
    size_t need;
    if (!r->cancel && khub__add_ok(r->len, len, &need) && khub__add_ok(need, 1, &need)) {
        if (need > r->cap) {
            size_t cap = r->cap ? r->cap : 256;
            while (cap < need) cap *= 2;
            char *p = realloc(r->text, cap);
            if (p) {
                r->text = p;
                r->cap = cap;
            } else {
                r->cancel = 1; /* out of memory: stop; finish reports it */
            }
        }
        if (!r->cancel) {
            memcpy(r->text + r->len, text, len);
            r->len += len;
            r->text[r->len] = '\0';
            pthread_cond_broadcast(&r->cv);
        }
    }
    int stop = r->cancel;
    pthread_mutex_unlock(&r->mu);
    return stop;
}

int khub__ms_req_cancelled(khub__ms_req *r)
{
    pthread_mutex_lock(&r->mu);
    int c = r->cancel;
    pthread_mutex_unlock(&r->mu);
    return c;
}

void khub__ms_req_finish(khub__ms_req *r, unsigned status, const char *type, int64_t n_prompt,
                         int64_t n_completion, uint32_t stop, const char *fmt, ...)
{
    pthread_mutex_lock(&r->mu);
    r->err_status = status;
    r->err_type = type;
    r->n_prompt = n_prompt;
    r->n_completion = n_completion;
    r->stop_reason = stop;
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        khub__verrbuf(r->err_msg, sizeof r->err_msg, fmt, ap);
        va_end(ap);
    }
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void khub__ms_req_cancel(khub__ms_req *r)
{
    pthread_mutex_lock(&r->mu);
    r->cancel = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Whether the peer of fd closed its side (or the socket failed). */
static int hung_up(int fd)
{
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

khub__ms_wait khub__ms_req_wait(khub__ms_req *r, size_t have, int fd, unsigned max_ms)
{
    pthread_mutex_lock(&r->mu);
    /* The peer is looked at after every wake-up, not only after a quiet
     * 200 ms: a plain request that waits for its whole answer is woken by
     * each of its tokens, and tokens come faster than that. */
    for (unsigned waited = 0; r->len <= have && !r->done;) {
        if (max_ms && waited >= max_ms) {
            pthread_mutex_unlock(&r->mu);
            return KHUB__MS_IDLE;
        }
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        t.tv_nsec += 200 * 1000000L;
        if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
        if (pthread_cond_timedwait(&r->cv, &r->mu, &t) != 0) waited += 200;
        if (hung_up(fd)) {
            r->cancel = 1;
            pthread_mutex_unlock(&r->mu);
            return KHUB__MS_GONE;
        }
    }
    khub__ms_wait w = r->len > have ? KHUB__MS_MORE : KHUB__MS_DONE;
    pthread_mutex_unlock(&r->mu);
    return w;
}
