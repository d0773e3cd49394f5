/*
 * batch_impl.h: the inside of a khub_batch (khub_batch.h), shared by
 * batch.c (the API: requests, queue, locking, completion) and scheduler.c
 * (one step: admission, preemption, the forward call, sampling).
 *
 * Locking: mu guards what other threads touch (the live list, the waiting
 * queue, cancel flags, counts and stats); everything marked "loop" belongs
 * to the thread in khub_batch_step and is read without the lock. Callbacks
 * run on the loop thread with mu released, so they may submit or cancel.
 * Internal to runtime/executor.
 */
#ifndef KHUB_RUNTIME_BATCH_IMPL_H
#define KHUB_RUNTIME_BATCH_IMPL_H

#include <pthread.h>

#include "gen_seq.h"
#include "khub/khub_batch.h"

typedef enum khub__breq_state {
    KHUB__BREQ_WAITING, /* in the queue (new or preempted) */
    KHUB__BREQ_RUNNING  /* holds a sequence slot */
} khub__breq_state;

typedef struct khub__breq khub__breq;
struct khub__breq {
    uint64_t id;
    khub__breq *prev, *next; /* mu: the live list */
    khub__breq *qnext;       /* mu: the waiting queue */
    khub__breq_state state;  /* mu */
    int cancelled;           /* mu: khub_batch_cancel was called */
    /* The request, copied at submit (all owned). */
    char *prompt;
    int32_t *tokens;
    size_t n_tokens;
    char *system;
    char **stops;         /* [n_stop] */
    khub_generate_opts o; /* its stop / system point at the copies */
    khub_batch_text_fn on_text;
    khub_batch_done_fn on_done;
    void *ud;
    /* Loop. */
    int prepared;      /* seq made (tokenized) */
    khub__gen_seq seq; /* prompt and output ids, sampler, text */
    int32_t slot;      /* KV sequence while running, else -1 */
    int64_t ctx;       /* tokens of seq.hist in its KV */
    int64_t order;     /* admission counter: higher = admitted later */
    int32_t n_preempted;
    double t_submit, t_admit, t_first, t_last; /* ms, 0 = not yet */
};

struct khub_batch {
    khub_model *m;
    int32_t max_batch_tokens, max_seqs, max_queue;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* mu */
    khub__breq *live;            /* every request not ended */
    khub__breq *q_head, *q_tail; /* waiting; preempted ones go back to the head */
    int64_t n_queued, n_running, n_cancels;
    uint64_t next_id;
    int stop;
    khub_batch_stats stats;
    /* loop */
    khub__breq **running; /* [max_seqs] in admission order */
    int n_run;
    int32_t *tokens;      /* [max_batch_tokens] */
    khub__seg *segs;      /* [max_seqs] */
    khub__breq **seg_req; /* [max_seqs] */
    uint8_t *slot_used;   /* [model's max_seqs] */
    int64_t order;
    /* For khub_model_generate's timings. */
    double prefill_ms, decode_ms;
    int64_t prefill_tokens, decode_tokens;
};

KHUB_INTERNAL double khub__batch_now_ms(void);
/* Ends r: final text and streaming, on_done with status st (message msg,
 * may be NULL) and stop reason why, its slot released, r unlinked and
 * freed. Loop thread, mu not held. */
KHUB_INTERNAL void khub__batch_end(khub_batch *b, khub__breq *r, khub_status st, const char *msg,
                                   uint32_t why);
/* Takes r's KV back and queues it at the head to be recomputed. Loop. */
KHUB_INTERNAL void khub__batch_preempt(khub_batch *b, khub__breq *r);
/* Gives back r's slot and KV (no-op without one). Loop. */
KHUB_INTERNAL void khub__batch_release(khub_batch *b, khub__breq *r);

/* ---- scheduler.c ----------------------------------------------------- */

/* One step (see khub_batch_step). */
KHUB_INTERNAL khub_status khub__sched_step(khub_batch *b);

#endif /* KHUB_RUNTIME_BATCH_IMPL_H */
