/*
 * kv_budget.c: how much KV cache each running sequence may hold: the one
 * question the batch scheduler (scheduler.c) asks before it grows a
 * sequence, and the place that frees a sequence's cache when it leaves.
 *
 * This is the dense implementation: the cache plugin holds max_seqs slots of
 * max_context tokens each, so a sequence can grow to max_context, and a
 * release truncates its slot to 0. On top of that a limit on the tokens all
 * sequences hold together (khub__kv_set_limit; 0 = every slot full) lets a
 * batch run in less KV than the slots add up to, and is what makes the
 * scheduler preempt. A paged pool (issue 13 item 2) answers the same calls
 * from its free blocks instead; the scheduler does not change.
 *
 * Reservations are in tokens per sequence (m->kv_held[seq]): the scheduler
 * grows a sequence before the forward call that writes its new positions,
 * so the cache never holds more than it was granted.
 */
#include <string.h>

#include "executor.h"

khub_status khub__kv_budget_init(khub_model *m)
{
    m->kv_held = khub__calloc(m->rt, (size_t)m->max_seqs, sizeof *m->kv_held);
    KHUB_RETURN_IF(m->rt, !m->kv_held, KHUB_STATUS_NOMEM, "%s: no memory for the KV budget",
                   m->file);
    m->kv_held_total = 0;
    m->kv_limit = khub__kv_capacity_tokens(m);
    return KHUB_STATUS_OK;
}

void khub__kv_budget_free(khub_model *m)
{
    khub__free(m->rt, m->kv_held, m->kv_held ? (size_t)m->max_seqs * sizeof *m->kv_held : 0);
    m->kv_held = NULL;
}

int64_t khub__kv_capacity_tokens(const khub_model *m)
{
    return (int64_t)m->max_seqs * m->max_context;
}

khub_status khub__kv_set_limit(khub_model *m, int64_t tokens)
{
    int64_t cap = khub__kv_capacity_tokens(m);
    KHUB_RETURN_IF(m->rt, tokens < 0 || tokens > cap, KHUB_STATUS_INVALID_ARG,
                   "%s: a KV limit of %lld tokens is outside [0, %lld] (%d sequences of %lld)",
                   m->file, (long long)tokens, (long long)cap, (int)m->max_seqs,
                   (long long)m->max_context);
    m->kv_limit = tokens ? tokens : cap;
    return KHUB_STATUS_OK;
}

int64_t khub__kv_limit_tokens(const khub_model *m) { return m->kv_limit; }

bool khub__kv_can_grow(const khub_model *m, int32_t seq, int64_t n)
{
    if (seq < 0 || seq >= m->max_seqs || n < 0 || n > m->max_context) return false;
    int64_t held = m->kv_held[seq];
    return n <= held || m->kv_held_total - held + n <= m->kv_limit;
}

khub_status khub__kv_grow(khub_model *m, int32_t seq, int64_t n)
{
    KHUB_RETURN_IF(m->rt, !khub__kv_can_grow(m, seq, n), KHUB_STATUS_CONTEXT_FULL,
                   "%s: sequence %d cannot grow to %lld KV tokens (%lld of %lld held, %lld per "
                   "sequence)",
                   m->file, (int)seq, (long long)n, (long long)m->kv_held_total,
                   (long long)m->kv_limit, (long long)m->max_context);
    if (n > m->kv_held[seq]) {
        m->kv_held_total += n - m->kv_held[seq];
        m->kv_held[seq] = n;
    }
    return KHUB_STATUS_OK;
}

khub_status khub__kv_release(khub_model *m, int32_t seq)
{
    KHUB_RETURN_IF(m->rt, seq < 0 || seq >= m->max_seqs, KHUB_STATUS_INVALID_ARG,
                   "kv_budget: sequence %d outside [0, %d)", (int)seq, (int)m->max_seqs);
    m->kv_held_total -= m->kv_held[seq];
    m->kv_held[seq] = 0;
    return khub__forward_reset(m, seq);
}

int64_t khub__kv_free_tokens(const khub_model *m) { return m->kv_limit - m->kv_held_total; }

int64_t khub__kv_used_tokens(const khub_model *m) { return m->kv_held_total; }
