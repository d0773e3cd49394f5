/*
 * model_server.h: what the files of `khub serve-model` share (private to
 * runtime/model_server/, built into libkhub_model_server). Calls go down
 * this list, never up:
 *
 *   ms_api.c       the public khub_model_server_* (khub/khub_model_server.h)
 *   ms_http.c      the daemon: start/stop, request bodies and limits, the API
 *                  key, routing, error replies
 *   ms_routes.c    the endpoints: completions (plain and streamed), models,
 *                  health, metrics
 *   ms_kernels.c   the kernel endpoints: GET /v1/kernels, POST
 *                  /v1/kernels/reload, and the per-kernel call counts of
 *                  /metrics
 *   ms_swap.c      a live kernel swap: prepared on the caller's thread,
 *                  switched on the engine thread between two steps
 *   ms_openai.c    OpenAI request bodies read into a request, and the answer
 *                  and chunk objects written from one
 *   ms_engine_batch.c   the request engine on khub_batch.h: continuous
 *                  batching, many requests in one running batch (default)
 *   ms_engine_serial.c  the request engine that runs one request at a time
 *                  through khub_model_generate (the simple reference)
 *   ms_request.c   one generation request shared by its connection and the
 *                  engine: text produced so far, waits, cancellation
 *
 * The engine is an interface (khub__ms_engine_vt) so that the HTTP layer
 * does not care how requests are scheduled: the continuous-batching
 * scheduler (khub_batch.h, issue 13) by default, or one at a time.
 * Only the engine thread touches the model (khub_model is one thread's at
 * a time); the HTTP threads see requests only.
 */
#ifndef KHUB_MODEL_SERVER_IMPL_H
#define KHUB_MODEL_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "internal.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "khub/khub_model_server.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_RESULT;
#else
typedef enum MHD_Result MHD_RESULT;
#endif

#define KHUB__MS_MAX_STOP     4          /* stop strings per request, as OpenAI allows */
#define KHUB__MS_MAX_MESSAGES 1024       /* messages per chat request */
#define KHUB__MS_MAX_BODY     (1u << 20) /* default body limit, bytes */

/* ------------------------------------------------------------------------ */
/* A generation request (ms_request.c)                                      */
/* ------------------------------------------------------------------------ */

typedef struct khub__ms_req {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the connection's and the engine's; freed at 0 */
    /* Input, set before submit and read-only afterwards. Either a
     * conversation (chat: the engine formats it with the model's template)
     * or a raw prompt. */
    int chat;
    char **roles, **contents; /* [n_msgs], owned */
    size_t n_msgs;
    char *prompt;             /* owned; !chat */
    int32_t max_tokens;       /* 0 = up to the context */
    float temperature, top_p; /* top_p 1 = off */
    uint64_t seed;
    char *stop[KHUB__MS_MAX_STOP]; /* owned */
    uint32_t n_stop;
    /* Output, under mu: written by the engine, read by the connection. */
    char *text; /* generated so far, NUL-terminated */
    size_t len, cap;
    int done;            /* finished: no more text comes */
    int cancel;          /* the client went away, or the server stops */
    unsigned err_status; /* 0 = generated; else the HTTP status of the error */
    char err_msg[KHUB_ERROR_SIZE];
    const char *err_type;  /* OpenAI error type, static */
    int64_t n_prompt;      /* prompt tokens (after the template) */
    int64_t n_completion;  /* generated tokens */
    uint32_t stop_reason;  /* khub_stop_reason */
    struct timespec t_sub; /* submitted */
    uint64_t engine_id;    /* the engine's id for it (khub_batch), 0 = none yet */
} khub__ms_req;

/* A request with one reference (the caller's); NULL when out of memory. */
KHUB_INTERNAL khub__ms_req *khub__ms_req_new(void);
KHUB_INTERNAL void khub__ms_req_ref(khub__ms_req *r);
/* Drops a reference; the last one frees. Accepts NULL. */
KHUB_INTERNAL void khub__ms_req_unref(khub__ms_req *r);
/* The engine: appends generated text; returns nonzero when the request is
 * cancelled (or out of memory) and generation must stop. */
KHUB_INTERNAL int khub__ms_req_append(khub__ms_req *r, const char *text, size_t len);
/* Whether the request was cancelled. */
KHUB_INTERNAL int khub__ms_req_cancelled(khub__ms_req *r);
/* The engine: the request is over. status 0 with its counts, or an HTTP
 * error status with an OpenAI error type and a message. */
KHUB_INTERNAL void khub__ms_req_finish(khub__ms_req *r, unsigned status, const char *type,
                                       int64_t n_prompt, int64_t n_completion, uint32_t stop,
                                       const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* The connection: the client went away; the engine stops at its next step. */
KHUB_INTERNAL void khub__ms_req_cancel(khub__ms_req *r);

typedef enum khub__ms_wait {
    KHUB__MS_MORE = 0, /* text beyond `have` is there */
    KHUB__MS_DONE = 1, /* finished, and nothing beyond `have` */
    KHUB__MS_GONE = 2, /* the client hung up (the request is cancelled) */
    KHUB__MS_IDLE = 3  /* max_ms passed with neither */
} khub__ms_wait;
/* Waits until the request has more than `have` bytes of text or is done,
 * checking every 200 ms whether the client on socket fd (-1 = unknown)
 * hung up; after max_ms (0 = no limit) without either, KHUB__MS_IDLE. */
KHUB_INTERNAL khub__ms_wait khub__ms_req_wait(khub__ms_req *r, size_t have, int fd,
                                              unsigned max_ms);

/* ------------------------------------------------------------------------ */
/* Request engines (ms_engine_serial.c)                                     */
/* ------------------------------------------------------------------------ */

typedef struct khub__ms_engine khub__ms_engine;

typedef struct khub__ms_engine_stats {
    uint32_t queued, running;
    uint64_t kv_tokens, kv_capacity;
} khub__ms_engine_stats;

/* A kernel swap handed to the engine thread (ms_swap.c): the thread that
 * asks fills sw, the engine thread runs khub_model_kernel_swap between two
 * steps and fills the rest. Under the engine's mutex: taken, done. */
typedef struct khub__ms_swap {
    khub_kernel_swap *sw;
    khub_status st;
    char err[KHUB_ERROR_SIZE];
    char *explain; /* malloc'd: the model's explain table after the swap */
    int taken, done;
} khub__ms_swap;

/* The engine thread, between steps, with *slot read under mu: runs the
 * swap waiting there, if any, and wakes its waiter (cv). Call without mu
 * held. */
KHUB_INTERNAL void khub__ms_swap_serve(khub_model *m, pthread_mutex_t *mu, pthread_cond_t *cv,
                                       khub__ms_swap **slot);
/* The asking thread: puts box in *slot and waits (on cv, under mu) until
 * the engine has run it, or the engine stops first (then box->st is BUSY).
 * *stopping is read under mu. */
KHUB_INTERNAL void khub__ms_swap_wait(pthread_mutex_t *mu, pthread_cond_t *cv, khub__ms_swap **slot,
                                      const int *stopping, khub__ms_swap *box);

typedef struct khub__ms_engine_vt {
    /* Takes a reference to r and queues it; 0 when the queue is full (r
     * untouched), 1 when taken. Any thread. */
    int (*submit)(khub__ms_engine *e, khub__ms_req *r);
    /* r's client went away (r is already marked cancelled): free its place
     * in the engine now rather than at its next token. Any thread. */
    void (*cancel)(khub__ms_engine *e, khub__ms_req *r);
    void (*stats)(khub__ms_engine *e, khub__ms_engine_stats *out);
    /* Cancels everything queued or running (finished with 503) and refuses
     * new requests; returns when the engine thread is idle. */
    void (*shutdown)(khub__ms_engine *e);
    void (*free)(khub__ms_engine *e);
    /* Runs box's kernel swap on the engine thread between two steps (the
     * batch engine: between forward calls; the serial one: between
     * requests) and returns when it ran or the engine stopped. */
    void (*swap)(khub__ms_engine *e, khub__ms_swap *box);
} khub__ms_engine_vt;

struct khub__ms_engine {
    const khub__ms_engine_vt *vt;
};

/* An engine that runs requests one at a time through khub_model_generate
 * in a thread of its own, max_queue waiting. NULL when out of memory or
 * when the thread cannot start. */
KHUB_INTERNAL khub__ms_engine *khub__ms_engine_serial_new(khub_model *m, uint32_t max_queue);
/* The continuous-batching engine (ms_engine_batch.c, khub_batch.h): every
 * admitted request shares one running batch; max_queue wait (in its intake
 * and the batch's queue together); max_batch_tokens per step, 0 = the
 * model's max_batch. NULL with the reason in err. */
KHUB_INTERNAL khub__ms_engine *khub__ms_engine_batch_new(khub_model *m, uint32_t max_queue,
                                                         int32_t max_batch_tokens, char *err,
                                                         size_t err_size);

/* ------------------------------------------------------------------------ */
/* The server (ms_http.c) and its endpoints (ms_routes.c)                   */
/* ------------------------------------------------------------------------ */

#define KHUB__MS_MAX_RELOADS 16 /* reloads remembered for GET /v1/kernels */

/* One live kernel swap as GET /v1/kernels shows it. */
typedef struct khub__ms_reload_rec {
    time_t at;
    char role[24];
    char kernel[256];    /* the name asked for */
    char previous[192];  /* the op that served before */
    char now[192];       /* the op serving after */
    char resolved[1024]; /* the resolution line: commit, variant, trust decision */
    char selftest[32];
    double prepare_ms; /* resolve, fetch, verify, load, selftest (the asking thread) */
    double switch_ms;  /* handed to the engine until switched (waits out a step) */
} khub__ms_reload_rec;

typedef struct khub__ms {
    struct MHD_Daemon *d;
    khub_model *model;
    khub_runtime *rt; /* the model's */
    khub__ms_engine *eng;
    char *model_id, *api_key, *kernels_report; /* owned */
    /* Live kernel swaps (ms_swap.c): one at a time under reload_mu; the
     * hub handle (borrowed from the options, or made at the first swap
     * that needs one and owned) is used only under it. kmu guards explain
     * and the history, which the endpoints read. */
    pthread_mutex_t reload_mu, kmu;
    khub_hub *hub;
    int own_hub;
    char *lock_path, *policy_path; /* owned copies of the reload policy, NULL = none */
    int allow_unsigned;
    char *explain; /* owned, under kmu: the model's table, refreshed after a swap */
    khub__ms_reload_rec reloads[KHUB__MS_MAX_RELOADS]; /* under kmu, a ring */
    uint64_t n_reloads;                                /* under kmu */
    atomic_ullong n_reload_failures;
    int64_t max_context, context_length;
    uint64_t max_body;
    unsigned idle_s; /* connection idle timeout, s */
    uint16_t port;
    time_t created;
    atomic_ullong n_requests, n_errors, n_completions, n_cancelled;
    atomic_ullong prompt_tokens, completion_tokens, next_id;
} khub__ms;

/* One request's state between libmicrohttpd's calls (ms_http.c). */
typedef struct khub__ms_conn {
    char *body;
    size_t n, cap;
    uint64_t got;  /* body bytes received, kept or not */
    int too_big;   /* over the limit: the body is dropped and answered 413 */
    int answered;  /* refused at the headers: no body is read */
    unsigned code; /* the status queued, for the error count */
} khub__ms_conn;

KHUB_INTERNAL khub_status khub__ms_start(khub__ms *s, const char *host, uint16_t port,
                                         const khub_model_server_opts *o, char *err,
                                         size_t err_size);
KHUB_INTERNAL void khub__ms_stop(khub__ms *s);

/* Replies. The error object is OpenAI's: {"error": {"message", "type",
 * "param", "code"}}; retry_after > 0 adds Retry-After. */
KHUB_INTERNAL MHD_RESULT khub__ms_send_json(struct MHD_Connection *c, khub__ms_conn *k,
                                            unsigned code, cJSON *j);
KHUB_INTERNAL MHD_RESULT khub__ms_send_text(struct MHD_Connection *c, khub__ms_conn *k,
                                            unsigned code, const char *type, const char *text);
KHUB_INTERNAL MHD_RESULT khub__ms_send_error(struct MHD_Connection *c, khub__ms_conn *k,
                                             unsigned code, const char *type, const char *param,
                                             unsigned retry_after, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* The socket of connection c, -1 when unknown. */
KHUB_INTERNAL int khub__ms_conn_fd(struct MHD_Connection *c);

/* Endpoints. path has no query. */
KHUB_INTERNAL MHD_RESULT khub__ms_route(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k,
                                        const char *method, const char *path);
/* The error object with "code" set (a khub status name, NULL = null). */
KHUB_INTERNAL MHD_RESULT khub__ms_send_error_code(struct MHD_Connection *c, khub__ms_conn *k,
                                                  unsigned code, const char *type,
                                                  const char *param, const char *err_code,
                                                  const char *msg);

/* ms_kernels.c: GET /v1/kernels, POST /v1/kernels/reload, and the kernel
 * lines of /metrics appended to text (a malloc'd string, grown; NULL when
 * out of memory). */
KHUB_INTERNAL MHD_RESULT khub__ms_kernels(khub__ms *s, struct MHD_Connection *c, khub__ms_conn *k);
KHUB_INTERNAL MHD_RESULT khub__ms_reload_route(khub__ms *s, struct MHD_Connection *c,
                                               khub__ms_conn *k);
KHUB_INTERNAL char *khub__ms_kernel_metrics(khub__ms *s, char *text);

/* ms_swap.c: swaps role's kernel for the one called name (both from the
 * caller); one at a time. On failure the message goes to err. */
KHUB_INTERNAL khub_status khub__ms_reload(khub__ms *s, const char *role, const char *name,
                                          char *err, size_t err_size);
KHUB_INTERNAL void khub__ms_reload_free(khub__ms *s);

/* ------------------------------------------------------------------------ */
/* OpenAI bodies (ms_openai.c)                                              */
/* ------------------------------------------------------------------------ */

typedef struct khub__ms_params {
    int chat;          /* /v1/chat/completions, else /v1/completions */
    int stream;        /* "stream": true */
    int include_usage; /* "stream_options": {"include_usage": true} */
    char param[32];    /* the field an error names ("" = none) */
    char why[KHUB_ERROR_SIZE];
} khub__ms_params;

/* Reads body j into r's input and p. 0 on success, else -1 with p->why
 * (and p->param) to answer 400 with. */
KHUB_INTERNAL int khub__ms_parse(const cJSON *j, khub__ms_req *r, khub__ms_params *p);
/* "stop", "length" (also for a full KV cache), or NULL while running. */
KHUB_INTERNAL const char *khub__ms_finish_reason(uint32_t stop_reason);
/* The whole answer of a finished request r (chat.completion or
 * text_completion), usage included. */
KHUB_INTERNAL cJSON *khub__ms_answer(const khub__ms *s, const khub__ms_params *p,
                                     const khub__ms_req *r, const char *id, time_t created);
/* One streamed chunk: text (may be NULL: the opening role chunk of a chat,
 * or the final chunk with finish), finish ("stop", "length" or NULL). */
KHUB_INTERNAL cJSON *khub__ms_chunk(const khub__ms *s, const khub__ms_params *p, const char *id,
                                    time_t created, const char *text, size_t len,
                                    const char *finish);
/* {"prompt_tokens", "completion_tokens", "total_tokens"} */
KHUB_INTERNAL cJSON *khub__ms_usage(int64_t prompt, int64_t completion);

#endif /* KHUB_MODEL_SERVER_IMPL_H */
