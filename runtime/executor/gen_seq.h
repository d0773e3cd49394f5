/*
 * gen_seq.h: one sequence being generated (runtime/executor/gen_seq.c):
 * its prompt and output ids, sampler, incremental detokenizer, stop strings
 * with the streaming hold-back, and why it stopped. What khub_model_generate
 * and the batch scheduler share; neither writes these steps itself.
 *
 *     int32_t *ids; size_t n;
 *     khub__gen_prompt_ids(m, "prompt 0", text, chat, system, &ids, &n);
 *     khub__gen_seq s;
 *     khub__gen_seq_init(m, &s, ids, n, &opts);      // copies ids
 *     khub__tokenizer_free_ids(m->tok, ids, n);
 *     ... forward, then khub__gen_sample(m, &s, logits_row) until !s.live
 *     khub__gen_finish(m, &s, &text, &len);          // flushes, streams the rest
 *     khub__gen_seq_free(m, &s);
 *
 * Streaming: text that could still turn out to be the start of a stop string
 * is held back from emit until it cannot, so a stop string never reaches
 * the stream. Internal to runtime/executor.
 */
#ifndef KHUB_RUNTIME_GEN_SEQ_H
#define KHUB_RUNTIME_GEN_SEQ_H

#include "app_struct.h"
#include "executor.h"
#include "sampler.h"
#include "tokenizer.h"

/* khub_generate_result's 0.1 size: the least struct_size khub_model_generate
 * and khub_session_generate accept (app_struct.h). */
#define KHUB__GEN_RESULT_0_1 KHUB__SIZE_TO(khub_generate_result, decode_tok_s)

/* Where a sequence's text goes as it is produced: return nonzero to stop. */
typedef int (*khub__gen_emit_fn)(void *ud, const char *text, size_t len);

typedef struct khub__gen_seq {
    int32_t *hist; /* owned; [cap] prompt ids then generated ids */
    size_t n_hist, n_prompt, cap;
    int live;          /* still generating */
    uint32_t stop;     /* khub_stop_reason */
    size_t streamed;   /* bytes of text handed to emit */
    size_t cut;        /* text length after a stop string was cut, or SIZE_MAX */
    khub_detok *detok; /* owned */
    khub__sampler sampler;
    /* Settings, from khub_generate_opts (stop strings borrowed: they must
     * outlive the sequence). */
    int32_t max_new_tokens;
    int ignore_eos;
    const char *const *stops;
    uint32_t n_stop;
    size_t max_stop;        /* longest stop string */
    khub__gen_emit_fn emit; /* NULL = no streaming */
    void *emit_ud;
} khub__gen_seq;

/* Checks and completes generation options (NULL = defaults: 128 new
 * tokens); who names the caller in messages. rt may be NULL (the message then
 * goes to the thread's khub_last_error). STRUCT_SIZE or INVALID_ARG naming
 * the value. */
KHUB_INTERNAL khub_status khub__gen_read_opts(khub_runtime *rt, const char *who,
                                              const khub_generate_opts *in, khub_generate_opts *o);
/* Tokenizes prompt (after the chat template with system, when chat) into
 * *ids[*n] (free with khub__tokenizer_free_ids); label names it in messages
 * ("prompt 0"). INVALID_ARG when empty, CONTEXT_FULL when it leaves no room
 * for one new token in max_context, TOKENIZER. */
KHUB_INTERNAL khub_status khub__gen_prompt_ids(khub_model *m, const char *label, const char *prompt,
                                               int chat, const char *system, int32_t **ids,
                                               size_t *n);
/* Makes s for ids[n] (copied) with o's settings. */
KHUB_INTERNAL khub_status khub__gen_seq_init(khub_model *m, khub__gen_seq *s, const int32_t *ids,
                                             size_t n, const khub_generate_opts *o);
/* Samples s's next token from logits_row[vocab] (scratch: modified) and
 * takes it: EOS, stop strings, limits, streaming. */
KHUB_INTERNAL khub_status khub__gen_sample(khub_model *m, khub__gen_seq *s, float *logits_row);
/* Ends s with reason why (the first reason wins). */
KHUB_INTERNAL void khub__gen_end(khub__gen_seq *s, uint32_t why);
/* Flushes the detokenizer, streams what is left and gives the final text
 * (borrowed from s, stop string cut). */
KHUB_INTERNAL khub_status khub__gen_finish(khub_model *m, khub__gen_seq *s, const char **text,
                                           size_t *len);
/* Frees what s owns; accepts a zeroed s. */
KHUB_INTERNAL void khub__gen_seq_free(khub_model *m, khub__gen_seq *s);

#endif /* KHUB_RUNTIME_GEN_SEQ_H */
