/*
 * sampler.h: picking the next token from a row of logits (runtime/executor/sampler.c).
 *
 * The order of the steps is Transformers' (generate's logits processors,
 * then its warpers): repetition penalty, then temperature, top-k, top-p,
 * then a draw. temperature <= 0 is greedy (argmax after the penalty; ties go
 * to the lowest id, as torch.argmax does).
 *
 *     khub__sampler s;
 *     khub__sampler_init(rt, &s, &params, n_vocab);
 *     int32_t id = khub__sampler_sample(&s, logits, history, n_history);
 *     khub__sampler_free(&s);
 */
#ifndef KHUB_RUNTIME_SAMPLER_H
#define KHUB_RUNTIME_SAMPLER_H

#include "internal.h"

typedef struct khub__sampler_params {
    float temperature;        /* <= 0: greedy */
    int32_t top_k;            /* <= 0: all */
    float top_p;              /* <= 0 or >= 1: off */
    float repetition_penalty; /* <= 0 or == 1: off */
    uint64_t seed;
} khub__sampler_params;

typedef struct khub__sampler_cand {
    float logit; /* after penalty and temperature; then the probability */
    int32_t id;
} khub__sampler_cand;

typedef struct khub__sampler {
    khub_runtime *rt;
    khub__sampler_params p;
    int64_t n_vocab;
    uint64_t rng[4];          /* xoshiro256** state */
    khub__sampler_cand *cand; /* owned; [n_vocab] scratch */
    uint8_t *seen;            /* owned; [n_vocab] penalty marks, all 0 between calls */
} khub__sampler;

/* Prepares s for rows of n_vocab logits; NOMEM or INVALID_ARG (n_vocab < 1). */
KHUB_INTERNAL khub_status khub__sampler_init(khub_runtime *rt, khub__sampler *s,
                                             const khub__sampler_params *p, int64_t n_vocab);
/* Frees the scratch; accepts a zeroed s. */
KHUB_INTERNAL void khub__sampler_free(khub__sampler *s);
/* Picks a token from logits[n_vocab], which it modifies (penalty applied in
 * place). history[n_history] are the ids the penalty applies to (prompt and
 * output so far); ids outside [0, n_vocab) are ignored. Never fails. */
KHUB_INTERNAL int32_t khub__sampler_sample(khub__sampler *s, float *logits, const int32_t *history,
                                           size_t n_history);
/* Uniform double in [0, 1) from s's generator (exposed for tests). */
KHUB_INTERNAL double khub__sampler_uniform(khub__sampler *s);

#endif /* KHUB_RUNTIME_SAMPLER_H */
