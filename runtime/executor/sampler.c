/*
 * sampler.c: the next-token sampler (see sampler.h for the contract).
 *
 * Greedy, temperature, top-k, top-p and the CTRL repetition penalty, in
 * Transformers' order so that a fixed seed gives reproducible runs and greedy
 * output matches generate(do_sample=False) token for token.
 *
 * The generator is xoshiro256** seeded through splitmix64: small, fast, and
 * the same sequence on every platform (rand() is neither).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

/* ======================================================================== */
/* Random numbers                                                           */
/* ======================================================================== */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double khub__sampler_uniform(khub__sampler *s)
{
    return (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

/* ======================================================================== */
/* Set-up                                                                   */
/* ======================================================================== */

khub_status khub__sampler_init(khub_runtime *rt, khub__sampler *s, const khub__sampler_params *p,
                               int64_t n_vocab)
{
    memset(s, 0, sizeof *s);
    KHUB_RETURN_IF(rt, n_vocab < 1 || n_vocab > INT32_MAX, KHUB_STATUS_INVALID_ARG,
                   "sampler: vocabulary size %lld is out of range", (long long)n_vocab);
    s->rt = rt;
    s->p = *p;
    s->n_vocab = n_vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->cand = khub__calloc(rt, (size_t)n_vocab, sizeof *s->cand);
    s->seen = khub__calloc(rt, (size_t)n_vocab, 1);
    if (!s->cand || !s->seen) {
        khub__sampler_free(s);
        return khub__fail(rt, KHUB_STATUS_NOMEM, "sampler: out of memory for %lld candidates",
                          (long long)n_vocab);
    }
    return KHUB_STATUS_OK;
}

void khub__sampler_free(khub__sampler *s)
{
    if (!s) return;
    khub__free(s->rt, s->cand, s->cand ? (size_t)s->n_vocab * sizeof *s->cand : 0);
    khub__free(s->rt, s->seen, s->seen ? (size_t)s->n_vocab : 0);
    s->cand = NULL;
    s->seen = NULL;
}

/* ======================================================================== */
/* Steps                                                                    */
/* ======================================================================== */

/* CTRL penalty, once per distinct id: positive logits are divided by the
 * penalty, negative ones multiplied (Transformers'
 * RepetitionPenaltyLogitsProcessor). */
static void apply_penalty(khub__sampler *s, float *logits, const int32_t *hist, size_t n)
{
    float pen = s->p.repetition_penalty;
    if (pen <= 0.0f || pen == 1.0f || !hist) return;
    for (size_t i = 0; i < n; i++) {
        int32_t id = hist[i];
        if (id < 0 || id >= s->n_vocab || s->seen[id]) continue;
        s->seen[id] = 1;
        logits[id] = logits[id] > 0.0f ? logits[id] / pen : logits[id] * pen;
    }
    for (size_t i = 0; i < n; i++)
        if (hist[i] >= 0 && hist[i] < s->n_vocab) s->seen[hist[i]] = 0;
}

/* Largest logit, lowest id on ties; NaN never wins. */
static int32_t argmax(const float *logits, int64_t n)
{
    int32_t best = 0;
    float bv = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (logits[i] > bv) {
            bv = logits[i];
            best = (int32_t)i;
        }
    }
    return best;
}

/* Descending by logit, then ascending id (a total order: stable results). */
static int cand_cmp(const void *a, const void *b)
{
    const khub__sampler_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Moves the k largest candidates to the front (quickselect, Hoare style).
 * Only their membership matters here; the caller sorts them. */
static void select_top_k(khub__sampler_cand *c, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        khub__sampler_cand pivot = c[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (cand_cmp(&c[i], &pivot) < 0) i++;
            while (cand_cmp(&c[j], &pivot) > 0) j--;
            if (i <= j) {
                khub__sampler_cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* Softmax of the n candidates in place (logit becomes probability). */
static void softmax(khub__sampler_cand *c, int64_t n)
{
    float mx = c[0].logit;
    for (int64_t i = 1; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float e = expf(c[i].logit - mx);
        c[i].logit = e;
        sum += e;
    }
    for (int64_t i = 0; i < n; i++) c[i].logit = (float)(c[i].logit / sum);
}

int32_t khub__sampler_sample(khub__sampler *s, float *logits, const int32_t *history,
                             size_t n_history)
{
    apply_penalty(s, logits, history, n_history);
    if (s->p.temperature <= 0.0f || s->p.top_k == 1) return argmax(logits, s->n_vocab);

    /* Candidates: finite logits only (a NaN or -inf can never be drawn). */
    int64_t n = 0;
    float inv_t = 1.0f / s->p.temperature;
    for (int64_t i = 0; i < s->n_vocab; i++) {
        if (!isfinite(logits[i])) continue;
        s->cand[n].logit = logits[i] * inv_t;
        s->cand[n].id = (int32_t)i;
        n++;
    }
    if (n == 0) return argmax(logits, s->n_vocab);

    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top_k(s->cand, n, s->p.top_k);
        n = s->p.top_k;
    }
    int top_p = s->p.top_p > 0.0f && s->p.top_p < 1.0f;
    if (top_p || n <= 4096) qsort(s->cand, (size_t)n, sizeof *s->cand, cand_cmp);
    softmax(s->cand, n);
    if (top_p) {
        /* Keep the most probable tokens while the mass before each is below
         * top_p (Transformers' TopPLogitsWarper, seen from the top), at
         * least one. */
        double cum = 0.0;
        int64_t keep = 0;
        while (keep < n && (keep == 0 || cum < s->p.top_p)) cum += s->cand[keep++].logit;
        n = keep;
        for (int64_t i = 0; i < n; i++) s->cand[i].logit = (float)(s->cand[i].logit / cum);
    }
    double r = khub__sampler_uniform(s), acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
        acc += s->cand[i].logit;
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[n - 1].id; /* rounding left r above the last sum */
}
