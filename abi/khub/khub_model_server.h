/*
 * khub_model_server.h: an OpenAI-compatible HTTP server for a loaded model,
 * the library behind `khub serve-model` (libkhub_model_server, linked on
 * top of libkhub; it links libmicrohttpd). It answers POST
 * /v1/chat/completions (streaming as server-sent events), POST
 * /v1/completions, GET /v1/models, GET /v1/kernels, POST /v1/kernels/reload
 * (a live kernel swap), GET /health and GET /metrics; docs/model-server.md
 * lists the fields, the errors and the limits.
 *
 *     khub_model *m = NULL;                       // or khub_model_load_hub
 *     if (khub_model_load(rt, "SmolLM2-135M-Instruct.Q4_1.gguf", NULL, &m) != KHUB_STATUS_OK)
 *         return fprintf(stderr, "%s\n", khub_runtime_errmsg(rt)), 1;
 *     khub_model_server_opts so = {KHUB_APP_INIT(khub_model_server_opts),
 *                                  .model = m, .model_id = "smollm2"};
 *     khub_model_server *srv = NULL;
 *     char err[KHUB_ERROR_SIZE];
 *     if (khub_model_server_start(&so, &srv, err, sizeof err) != KHUB_STATUS_OK)
 *         return fprintf(stderr, "%s\n", err), 1;
 *     printf("OPENAI_BASE_URL=http://127.0.0.1:%u/v1\n", khub_model_server_port(srv));
 *     ...                                         // serves in its own threads
 *     khub_model_server_stop(srv);
 *     khub_model_free(m);
 *
 * Link with -lkhub_model_server -lkhub.
 *
 * Requests: every request is treated as hostile (strict JSON, a body limit,
 * connection limits and an idle timeout); generation requests wait in a
 * bounded queue and run with continuous batching (khub_batch.h): many
 * clients share one running batch, up to the model's max_seqs
 * (khub_model_opts), and a client that hangs up has its request cancelled
 * and its KV freed at the next step.
 *
 * Errors: khub_model_server_start and khub_model_server_reload put their
 * one-line message into the caller's buffer.
 *
 * Threading: the server answers in threads of its own (one per connection)
 * and generates in one more; from start to stop it alone uses the model
 * (the caller must not call khub_model_* on it meanwhile, except the
 * thread-safe khub_model_binding_get). The query functions and
 * khub_model_server_reload may be called from any thread while it runs;
 * khub_model_server_stop must not race with them.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_MODEL_SERVER_H
#define KHUB_MODEL_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"
#include "khub_hub.h"
#include "khub_model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What to serve and how. Strings are copied during khub_model_server_start.
 * Zero means the default for every number. */
typedef struct khub_model_server_opts {
    KHUB_STRUCT_HEADER;
    khub_model *model;    /* required, borrowed: used only by the server until stop */
    const char *model_id; /* the model's name in /v1/models and every answer;
                             NULL = "khub-model" */
    const char *host;     /* IPv4 address to bind; NULL or "localhost" = 127.0.0.1 */
    uint16_t port;        /* 0 = a free ephemeral port (khub_model_server_port says which) */
    uint16_t reserved0;
    uint32_t max_queue;         /* generation requests waiting to run; more: 503 with
                                   Retry-After; 0 = 64 */
    const char *api_key;        /* every /v1 request needs "Authorization: Bearer <key>";
                                   NULL or "" = open (then listen on loopback only) */
    const char *kernels_report; /* text shown at GET /v1/kernels as "resolved" (the
                                   khub_model_kernels_report of khub_model_load_hub);
                                   NULL = none */
    uint32_t max_connections;   /* open connections in all; 0 = 256 */
    uint32_t max_per_ip;        /* open connections per client address; 0 = 64 */
    uint32_t idle_timeout_s;    /* a connection silent this long is closed, s; 0 = 30 */
    uint32_t reserved1;
    uint64_t max_body;        /* bytes of a request body (over: 413); 0 = 1 MiB */
    int32_t max_batch_tokens; /* tokens per batched forward step (khub_batch_config);
                                 0 = the model's max_batch */
    uint32_t serial;          /* 1 = no batching: one request at a time through
                                 khub_model_generate (the reference engine) */
    /* End of 0.1. */
    /* Since 0.2 (issue 16 item 4): live kernel swaps, POST /v1/kernels/reload
     * and khub_model_server_reload. hub: the handle that fetches the Hub IDs
     * a swap names (borrowed, used only by the server, one swap at a time,
     * until stop); NULL = the server opens its own with khub_hub_new(NULL)
     * at the first swap. The policy a swap follows, as at load: lock_path
     * (a named ID must be in the lock; its commit and hashes apply),
     * policy_path (trust policy; NULL = the default lookup) and
     * allow_unsigned; strings copied at start. */
    khub_hub *hub;
    const char *lock_path;
    const char *policy_path;
    int32_t allow_unsigned;
    uint32_t reserved2;
} khub_model_server_opts;

/* What the server has done so far (GET /metrics shows the same numbers). */
typedef struct khub_model_server_stats {
    KHUB_STRUCT_HEADER;
    uint64_t requests;          /* HTTP requests answered, every endpoint */
    uint64_t errors;            /* of which answered with a 4xx or 5xx status */
    uint64_t completions;       /* generation requests finished (also when cut short) */
    uint64_t cancelled;         /* generation requests whose client went away */
    uint64_t prompt_tokens;     /* prompt tokens of the finished requests */
    uint64_t completion_tokens; /* generated tokens of the finished requests */
    uint32_t queued;            /* generation requests waiting now */
    uint32_t running;           /* generation requests running now (the batch) */
    uint64_t kv_tokens;         /* KV cache positions in use now (all running requests) */
    uint64_t kv_capacity;       /* KV cache positions the running batch may use */
    /* End of 0.1. */
    /* Since 0.2 (issue 16 item 4); filled when struct_size covers them. */
    uint64_t reloads;         /* kernel swaps done */
    uint64_t reload_failures; /* kernel swaps refused (the old kernel kept serving) */
} khub_model_server_stats;

typedef struct khub_model_server khub_model_server;

/* Starts serving opts->model in background threads and returns at once. On
 * failure *out is NULL and, when errbuf is not NULL, its errbuf_size bytes
 * (KHUB_ERROR_SIZE always suffice) get the message. Statuses: INVALID_ARG
 * (host is not an IPv4 address, model is NULL), IO (the address cannot be
 * bound: "serve-model: cannot listen on 127.0.0.1:8080 (port in use?)"),
 * STRUCT_SIZE (opts older than 0.1), NOMEM, MISUSE (opts or out NULL).
 * Since 0.1. */
KHUB_API khub_status khub_model_server_start(const khub_model_server_opts *opts,
                                             khub_model_server **out, char *errbuf,
                                             size_t errbuf_size);
/* The TCP port the server listens on (the chosen one when opts.port was 0);
 * 0 for NULL. Since 0.1. */
KHUB_API uint16_t khub_model_server_port(const khub_model_server *srv);
/* Fills *out up to its struct_size (set by the caller; the header's
 * struct_size and stamp are left as the caller wrote them). Statuses:
 * MISUSE (srv or out NULL), STRUCT_SIZE (out smaller than 0.1's 80 bytes,
 * up to kv_capacity). On failure khub_last_error() (khub.h) says why, e.g.
 * "khub_model_server_stats_get: out.struct_size 8 is smaller than 0.1's 80"
 * (since session 19; before, no message). Thread-safe. Since 0.1. */
KHUB_API khub_status khub_model_server_stats_get(const khub_model_server *srv,
                                                 khub_model_server_stats *out);
/* Swaps the kernel serving `role` ("attention", "norm", "activation",
 * "rotary"; khub_kernels.h's role names) for the one called `kernel` (a Hub
 * ID "org/name[@REV|@version=N][:symbol]" fetched and verified under the server's
 * policy and lock, a loaded plugin's id, or "eager"/"sdpa" for attention),
 * as POST /v1/kernels/reload does but without HTTP or its API key: the
 * kernel is prepared on the calling thread (khub_kernel_swap_prepare:
 * fetch, verify, load, selftest) while requests keep running, then switched
 * on the engine thread between two steps (khub_model_kernel_swap), so every
 * request in flight goes on and none fails. On failure nothing changed, the
 * old kernel keeps serving, and errbuf gets the message. Statuses:
 * INVALID_ARG (an unknown role, named in the message with the list),
 * UNSUPPORTED (cache, linear, quantization: not swappable in a running
 * model), those of khub_kernel_swap_prepare (fetch and verification) and
 * khub_model_kernel_swap (NO_KERNEL: the kernel cannot serve this model's
 * role), BUSY (the server is stopping), MISUSE. Blocks until done; swaps
 * run one at a time. Since 0.1. */
KHUB_API khub_status khub_model_server_reload(khub_model_server *srv, const char *role,
                                              const char *kernel, char *errbuf, size_t errbuf_size);
/* Stops accepting, cancels the queued and running requests, waits for the
 * connections in flight, frees srv (not the model). Accepts NULL.
 * Since 0.1. */
KHUB_API void khub_model_server_stop(khub_model_server *srv);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_MODEL_SERVER_H */
