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
 * scheduler preempt. A paged pool (issue 13 item 2, m->kv_layout set)
 * answers the same calls from its blocks as well: a sequence can grow when
 * the blocks it lacks are free, growing reserves them in the cache plugin
 * (so a granted sequence never meets KV_FULL in the forward pass), release
 * gives them back (khub__forward_reset), the free tokens are the free
 * blocks' and the capacity is the pool's. The scheduler does not change.
 * On a model placed on a CUDA device whose paged pool is in device memory
 * (placement.h), the same questions go to that pool.
 *
 * Reservations are in tokens per sequence (m->kv_held[seq]): the scheduler
 * grows a sequence before the forward call that writes its new positions,
 * so the cache never holds more than it was granted.
 */
#include <string.h>

#include "executor.h"
#include "placement.h"    /* a paged pool in device memory */
#include "runtime_impl.h" /* khub__plugin_msg: the pool's own message */

/* The pool's free blocks and block size, and how many blocks seq holds (its
 * block-table row's entries), from the paged cache's view. False when the
 * cache is dense or the view fails. */
static bool pool_state(const khub_model *m, int32_t seq, int64_t *n_free, int64_t *bs,
                       int64_t *held)
{
    if (!m->kv_layout) return false;
    if (khub__forward_device_paged(m)) return khub__forward_device_pool(m, seq, n_free, bs, held);
    void *state = NULL;
    const khub_op_desc *op = khub_binding_acquire(m->kv_op, &state);
    khub_kv_paged_view v = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    bool ok = op && op->methods == (const void *)m->kv &&
              m->kv->paged_view(m->kv_state, m->cache, 0, &v) == KHUB_STATUS_OK;
    if (ok) {
        *n_free = v.n_free;
        *bs = v.block_size;
        *held = 0;
        const int32_t *row = seq >= 0 ? v.block_table + (int64_t)seq * v.block_table_stride : NULL;
        while (row && *held < v.block_table_stride && row[*held] >= 0) (*held)++;
    }
    khub_binding_release(m->kv_op);
    return ok;
}

/* The paged cache's reserve, with the plugin pinned (a reload cannot move a
 * plugin's cache: forward.c's kv_pin says the same). */
static khub_status pool_reserve(khub_model *m, int32_t seq, int64_t n)
{
    if (khub__forward_device_paged(m)) return khub__forward_device_reserve(m, seq, n);
    void *state = NULL;
    const khub_op_desc *op = khub_binding_acquire(m->kv_op, &state);
    khub_status st = KHUB_STATUS_BUSY;
    khub__plugin_msg_clear();
    if (op && op->methods == (const void *)m->kv)
        st = m->kv->reserve(m->kv_state, m->cache, seq, n);
    const char *why = khub__plugin_msg()[0] ? khub__plugin_msg() : khub_status_str(st);
    if (st != KHUB_STATUS_OK)
        khub__fail(m->rt, st, "%s: sequence %d: %s", m->file, (int)seq,
                   st == KHUB_STATUS_BUSY && !khub__plugin_msg()[0]
                       ? "the KV cache plugin was reloaded under this model; load it again"
                       : why);
    khub_binding_release(m->kv_op);
    return st;
}

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
    int64_t slots = (int64_t)m->max_seqs * m->max_context;
    return m->kv_layout && m->kv_pool_tokens < slots ? m->kv_pool_tokens : slots;
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
    if (n > held && m->kv_held_total - held + n > m->kv_limit) return false;
    int64_t n_free, bs, blocks;
    if (!pool_state(m, seq, &n_free, &bs, &blocks)) return !m->kv_layout;
    return (n + bs - 1) / bs - blocks <= n_free;
}

khub_status khub__kv_grow(khub_model *m, int32_t seq, int64_t n)
{
    KHUB_RETURN_IF(m->rt, !khub__kv_can_grow(m, seq, n), KHUB_STATUS_CONTEXT_FULL,
                   "%s: sequence %d cannot grow to %lld KV tokens (%lld of %lld held, %lld per "
                   "sequence)",
                   m->file, (int)seq, (long long)n, (long long)m->kv_held_total,
                   (long long)m->kv_limit, (long long)m->max_context);
    if (m->kv_layout) /* take the blocks now: the forward pass then finds them */
        KHUB_FORWARD_IF_ERROR(m->rt, pool_reserve(m, seq, n));
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

int64_t khub__kv_free_tokens(const khub_model *m)
{
    int64_t left = m->kv_limit - m->kv_held_total, n_free, bs, blocks;
    if (pool_state(m, -1, &n_free, &bs, &blocks) && n_free * bs < left) left = n_free * bs;
    return left;
}

int64_t khub__kv_used_tokens(const khub_model *m) { return m->kv_held_total; }
