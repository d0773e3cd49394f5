/*
 * device_kv.c: a paged KV cache in device memory, as the rest of the
 * executor sees it (issue 19 item 2): the pool's set-up after its CUDA op
 * created it, its reserve and release, and what the scheduler's budget
 * (kv_budget.c) asks of it. forward_device.c's pass reads it per layer.
 *
 * Why the blocks each sequence holds are counted here: the cache's
 * paged_view describes its block table in device memory (what the
 * paged_attention kernels read), which the host does not read; reserve is
 * the only way the executor gives a sequence blocks (the pass reserves
 * before it writes), so counting what reserve took is exact.
 */
#include "placement.h"
#include "runtime_impl.h"

/* A paged device cache: its 1.4 methods, the layout its caps named (the
 * model's, placement.c matched them) and its pool; the scheduler's budget
 * counts in the pool's tokens, so a pool sized otherwise than the host's
 * moves the budget with it. */
khub_status khub__device_pool_init(khub_model *m)
{
    khub__place *pl = m->place;
    const char *name = khub_binding_name(pl->cuda[KHUB__ROLE_KV_CACHE]);
    KHUB_RETURN_IF(m->rt,
                   !KHUB_HAS_FIELD(pl->dkv, khub_kv_cache_methods, paged_view) ||
                       !pl->dkv->reserve || !pl->dkv->release || !pl->dkv->paged_view,
                   KHUB_STATUS_PLUGIN_INVALID, "%s: %s lacks the paged cache methods", m->file,
                   name);
    pl->dheld = khub__calloc(m->rt, (size_t)m->max_seqs, sizeof *pl->dheld);
    KHUB_RETURN_IF(m->rt, !pl->dheld, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
    khub_kv_paged_view pv = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    khub__plugin_msg_clear();
    khub_status st = pl->dkv->paged_view(pl->dkv_state, pl->dcache, 0, &pv);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: cuda:%d: paged_view of %s failed: %s",
                   m->file, (int)pl->device, name, khub__plugin_msg());
    KHUB_RETURN_IF(m->rt, pv.layout != m->kv_layout || pv.block_size < 1,
                   KHUB_STATUS_PLUGIN_INVALID,
                   "%s: %s's paged_view gives KV layout %u in blocks of %d, the model's cache "
                   "layout is %u",
                   m->file, name, (unsigned)pv.layout, (int)pv.block_size, (unsigned)m->kv_layout);
    pl->dblock = pv.block_size;
    int64_t tokens = (int64_t)pv.n_blocks * pv.block_size;
    if (tokens != m->kv_pool_tokens) {
        m->kv_pool_tokens = tokens;
        m->kv_limit = khub__kv_capacity_tokens(m);
    }
    return KHUB_STATUS_OK;
}

bool khub__forward_device_paged(const khub_model *m)
{
    return m->place && m->place->dcache && m->kv_layout;
}

/* A device cache method's failure, named (the plugin's message after it). */
static khub_status kv_failed(khub_model *m, khub_status st, const char *what)
{
    return khub__fail(m->rt, st, "%s: cuda:%d: device kv_cache %s failed in %s: %s", m->file,
                      (int)m->place->device, what,
                      khub_binding_name(m->place->cuda[KHUB__ROLE_KV_CACHE]),
                      khub__plugin_msg()[0] ? khub__plugin_msg() : khub_status_str(st));
}

khub_status khub__forward_device_reserve(khub_model *m, int32_t seq, int64_t n)
{
    khub__place *pl = m->place;
    khub__plugin_msg_clear();
    khub_status st = pl->dkv->reserve(pl->dkv_state, pl->dcache, seq, n);
    if (st != KHUB_STATUS_OK) return kv_failed(m, st, "reserve");
    int32_t blocks = (int32_t)((n + pl->dblock - 1) / pl->dblock);
    if (blocks > pl->dheld[seq]) pl->dheld[seq] = blocks;
    return KHUB_STATUS_OK;
}

/* The pool's free blocks come from its view (host values); the blocks seq
 * holds are counted here, as reserve took them: the view's block table is
 * device memory, which the host does not read. */
bool khub__forward_device_pool(const khub_model *m, int32_t seq, int64_t *n_free, int64_t *bs,
                               int64_t *held)
{
    if (!khub__forward_device_paged(m)) return false;
    khub__place *pl = m->place;
    khub_kv_paged_view pv = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    if (pl->dkv->paged_view(pl->dkv_state, pl->dcache, 0, &pv) != KHUB_STATUS_OK) return false;
    *n_free = pv.n_free;
    *bs = pv.block_size;
    *held = seq >= 0 ? pl->dheld[seq] : 0;
    return true;
}

khub_status khub__forward_device_truncate(khub_model *m, int32_t seq, int64_t n)
{
    khub__place *pl = m->place;
    if (!pl || !pl->dcache) return KHUB_STATUS_OK;
    khub__plugin_msg_clear();
    /* A paged cache gives the sequence's blocks back on a reset. */
    if (m->kv_layout && n == 0) {
        khub_status st = pl->dkv->release(pl->dkv_state, pl->dcache, seq);
        if (st != KHUB_STATUS_OK) return kv_failed(m, st, "release");
        pl->dheld[seq] = 0;
        return KHUB_STATUS_OK;
    }
    khub_status st = pl->dkv->truncate(pl->dkv_state, pl->dcache, seq, n);
    return st == KHUB_STATUS_OK ? st : kv_failed(m, st, "truncate");
}
