/*
 * khub_batch.h: continuous batching over one loaded model: requests join
 * and leave the running batch at every step, prefill is chunked and mixed
 * with decode in the same forward call, and each request has its own
 * sampling settings, stop strings, streaming and cancellation. The
 * equivalent of Transformers' generate_batch with a ContinuousBatchingConfig,
 * or of vLLM's engine step loop.
 *
 * Offline, all at once:
 *
 *     khub_model *m = NULL;
 *     khub_model_load(rt, "SmolLM2-135M-Instruct.Q4_1.gguf", NULL, &m);
 *     khub_batch_request reqs[2] = {{KHUB_APP_INIT(khub_batch_request), .prompt = "Hi"},
 *                                   {KHUB_APP_INIT(khub_batch_request), .prompt = "2+2="}};
 *     khub_batch_result res[2] = {{KHUB_APP_INIT(khub_batch_result)},
 *                                 {KHUB_APP_INIT(khub_batch_result)}};
 *     if (khub_generate_batch(m, reqs, 2, NULL, res) == KHUB_STATUS_OK)
 *         printf("%s | %s\n", res[0].text, res[1].text);
 *     khub_batch_results_free(m, res, 2);
 *     khub_model_free(m);
 *
 * As a server: one thread runs the loop, any thread submits and cancels:
 *
 *     khub_model *m = NULL;
 *     khub_model_load(rt, "SmolLM2-135M-Instruct.Q4_1.gguf", NULL, &m);
 *     khub_batch *b = NULL;
 *     khub_batch_new(m, NULL, &b);
 *     // loop thread:      khub_batch_run(b, 1);   (returns after khub_batch_stop)
 *     // request threads:  uint64_t id; khub_batch_submit(b, &req, &id);
 *     //                   khub_batch_cancel(b, id);
 *     khub_batch_free(b);
 *     khub_model_free(m);
 *
 * Scheduling, at every step: the running requests that decode get one token
 * each, then running prefills continue, then waiting requests are admitted
 * first come first served, while the step has tokens (max_batch_tokens),
 * sequence slots (max_seqs) and KV capacity left. A request that finishes
 * gives its KV back at once; when the KV cache runs out, the request
 * admitted last is preempted: its KV is freed and it waits at the head of
 * the queue, to be recomputed (prompt and output so far) when there is room.
 * A request is never failed for lack of room unless it could not fit alone.
 *
 * Greedy output of each request does not depend on its neighbours when the
 * model's kernels compute each row of a batch the same way whatever the
 * batch holds (docs/batching.md says which do).
 *
 * Threading: khub_batch_submit, khub_batch_cancel, khub_batch_stop and
 * khub_batch_stats_get may be called from any thread at any time;
 * khub_batch_step and khub_batch_run from one thread at a time, which is
 * also where every callback runs. While a batch exists it owns its model:
 * do not call other khub_model_* functions on it from other threads.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_BATCH_H
#define KHUB_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "khub_model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct khub_batch khub_batch;

/* Engine limits. Zero fields take the defaults. */
typedef struct khub_batch_config {
    KHUB_STRUCT_HEADER;
    int32_t max_batch_tokens; /* tokens per forward step, 0 = the model's max_batch;
                                 at most max_batch (khub_model_opts) */
    int32_t max_seqs;         /* requests running together, 0 = the model's max_seqs;
                                 at most max_seqs */
    int64_t max_kv_tokens;    /* KV tokens all running requests hold together, 0 = the
                                 whole cache (max_seqs x max_context) */
    int32_t max_queue;        /* waiting requests before submit says BUSY, 0 = no limit */
    uint32_t reserved;
    /* End of 0.1. */
} khub_batch_config;

typedef struct khub_batch_result khub_batch_result;

/* A request's text as it is produced: text[len] is the next complete UTF-8
 * piece (borrowed, valid during the call, not NUL-terminated). Return 0 to
 * go on, nonzero to stop this request (stop reason CALLBACK). */
typedef int (*khub_batch_text_fn)(void *ud, uint64_t id, const char *text, size_t len);
/* A request ended (finished, failed or cancelled): r and everything it
 * points to are borrowed, valid during the call. Called exactly once per
 * accepted request. */
typedef void (*khub_batch_done_fn)(void *ud, uint64_t id, const khub_batch_result *r);

typedef struct khub_batch_request {
    KHUB_STRUCT_HEADER;
    const char *prompt;    /* borrowed during submit (copied); or NULL with tokens */
    const int32_t *tokens; /* borrowed during submit (copied); prompt ids as given */
    size_t n_tokens;
    /* Sampling and stopping: max_new_tokens, temperature, top_k, top_p,
     * repetition_penalty, seed, stop[n_stop], chat, system, ignore_eos, as
     * khub_model_generate takes them (copied during submit; its callback
     * fields are not used: see on_text). NULL = the defaults. */
    const khub_generate_opts *opts;
    khub_batch_text_fn on_text; /* NULL = no streaming */
    khub_batch_done_fn on_done; /* NULL = no completion call */
    void *ud;                   /* passed to both */
    /* End of 0.1. */
} khub_batch_request;

/* One request's outcome. From on_done: borrowed. From khub_generate_batch:
 * text and tokens owned, freed by khub_batch_results_free. */
struct khub_batch_result {
    KHUB_STRUCT_HEADER;
    uint64_t id;
    khub_status status;   /* OK, or why this request failed (CONTEXT_FULL: it does not
                             fit the cache; TOKENIZER; INVALID_ARG: an empty prompt; op
                             failures); the others are not affected */
    uint32_t stop_reason; /* khub_stop_reason; KHUB_STOP_CANCELLED after a cancel */
    char *text;           /* generated text, NUL-terminated (stop string cut) */
    size_t text_len;
    int32_t *tokens; /* [n_tokens] generated ids (EOS excluded) */
    int64_t n_tokens;
    int64_t n_prompt_tokens; /* after templating and tokenizing */
    int32_t n_preempted;     /* times its KV was taken back and recomputed */
    uint32_t reserved;
    double queue_ms;     /* submit to first admission */
    double ttft_ms;      /* submit to first generated token */
    double total_ms;     /* submit to end */
    double decode_tok_s; /* generated tokens after the first / their time */
    char error[256];     /* status's message, "" when OK; cut at 255 bytes: the whole one is
                            error_full */
    /* End of 0.1. */
    /* Added in 0.2 (session 16): status's whole message, NUL-terminated (at
     * most KHUB_ERROR_SIZE - 1 bytes, as khub_runtime_errmsg), "" when OK;
     * error holds only its first 255 bytes, which a long Hub ID or model
     * path can pass. From on_done: borrowed, valid during the call. From
     * khub_generate_batch: owned by the result, freed by
     * khub_batch_results_free (NULL only when copying it ran out of memory,
     * which the call returns as NOMEM). Read and written only when the
     * caller's struct_size covers it. */
    const char *error_full;
};

/* What the engine holds now. */
typedef struct khub_batch_stats {
    KHUB_STRUCT_HEADER;
    int64_t queued;          /* submitted (or preempted), waiting */
    int64_t running;         /* admitted, holding a sequence slot */
    int64_t kv_tokens_used;  /* KV tokens granted to running requests */
    int64_t kv_tokens_limit; /* KV tokens they may hold together */
    int64_t kv_blocks_used;  /* KV blocks (dense cache: sequence slots) in use */
    int64_t kv_blocks_total;
    int64_t steps;            /* forward steps run */
    int64_t completed;        /* requests ended, all reasons */
    int64_t preemptions;      /* requests preempted, counted each time */
    int64_t prompt_tokens;    /* prompt tokens computed (recomputation included) */
    int64_t generated_tokens; /* tokens generated */
    /* End of 0.1. */
} khub_batch_stats;

/* Makes an engine over m (which it uses, does not own: free the batch
 * first). cfg may be NULL. INVALID_ARG for a negative field or one over the
 * model's limits (the message names it and the limit); STRUCT_SIZE for a
 * cfg below 0.1's size (since 0.2; a smaller one was read as zeros). Since
 * 0.1. */
KHUB_API khub_status khub_batch_new(khub_model *m, const khub_batch_config *cfg, khub_batch **out);
/* Ends every request still queued or running (on_done with stop reason
 * CANCELLED), frees their KV and the engine. Not while khub_batch_run is
 * running in another thread (stop it and join first). Accepts NULL.
 * Since 0.1. */
KHUB_API void khub_batch_free(khub_batch *b);

/* Queues a request; *id (may be NULL) receives its id (ids start at 1).
 * Checks what it can without the model: INVALID_ARG for a request with
 * neither prompt nor tokens or with both, a negative or unknown setting, an
 * empty stop string; BUSY when max_queue requests wait. Tokenizing and the
 * length check happen when it is admitted (a failure then comes through
 * on_done). Any thread; the message of a failure is in khub_last_error().
 * Since 0.1. */
KHUB_API khub_status khub_batch_submit(khub_batch *b, const khub_batch_request *req, uint64_t *id);
/* Cancels request id: at the start of the next step it ends with stop
 * reason CANCELLED and its KV is freed; the others go on undisturbed.
 * NOT_FOUND when id is unknown or has already ended. Any thread.
 * Since 0.1. */
KHUB_API khub_status khub_batch_cancel(khub_batch *b, uint64_t id);

/* Runs one step: admissions, one forward call, sampling, streaming,
 * completions. *pending (may be NULL) receives the requests still queued or
 * running. A failing forward call fails the requests in it (on_done with
 * the status) and is returned; the engine stays usable. Since 0.1. */
KHUB_API khub_status khub_batch_step(khub_batch *b, int64_t *pending);
/* Runs steps until no request is left (wait = 0), or, with wait = 1, also
 * sleeps while idle and returns only after khub_batch_stop. Returns the
 * first failing step's status (the run goes on after it). Since 0.1. */
KHUB_API khub_status khub_batch_run(khub_batch *b, int wait);
/* Makes khub_batch_run(b, 1) return after its current step. Any thread.
 * Since 0.1. */
KHUB_API void khub_batch_stop(khub_batch *b);
/* Fills stats up to its struct_size (set by the caller, at least 0.1's:
 * else STRUCT_SIZE), its header (struct_size and stamp) kept as the caller
 * wrote it (since 0.2; 0.1 wrote the library's stamp). Any thread. Since
 * 0.1. */
KHUB_API khub_status khub_batch_stats_get(khub_batch *b, khub_batch_stats *stats);

/* Runs reqs[n] to completion on m with continuous batching and fills
 * results[n] (their struct_size set by the caller, at least 0.1's; fields
 * past it are left alone) in request order. Both are the caller's arrays:
 * the elements of reqs are reqs[0].struct_size bytes apart and those of
 * results results[0].struct_size bytes apart (the caller's structs, which
 * may be older or newer than this header's, not its sizeof), every
 * element of an array has its element 0's size, at least 0.1's (64 for a
 * request, 360 for a result); else STRUCT_SIZE before anything runs, e.g.
 * "khub_generate_batch: reqs[1].struct_size 72 differs from reqs[0]'s 64
 * (the array's elements are one struct)" (reqs since 0.2: 0.1 indexed
 * them by this header's sizeof).
 * Requests' own on_text / on_done are called as they happen (ids 1..n).
 * A request that fails has its status and error in its result; the call
 * returns OK unless the engine itself failed (NOMEM, a forward call).
 * Free the results with khub_batch_results_free, also after a failure.
 * Since 0.1. */
KHUB_API khub_status khub_generate_batch(khub_model *m, const khub_batch_request *reqs, size_t n,
                                         const khub_batch_config *cfg, khub_batch_result *results);
/* Frees what khub_generate_batch put in results[n] (elements
 * results[0].struct_size bytes apart) and clears each up to its
 * struct_size; the header stays as the caller wrote it. */
KHUB_API void khub_batch_results_free(khub_model *m, khub_batch_result *results, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_BATCH_H */
