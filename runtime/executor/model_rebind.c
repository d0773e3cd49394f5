/*
 * model_rebind.c: a loaded model's kernel role switched to another plugin
 * (a live kernel swap, issue 16 item 4), and the bindings with their call
 * counts as the public khub_model_binding_get lists them.
 *
 * Why a rebind and not khub_plugin_reload: a reload swaps every binding of
 * one plugin to a new build of the same plugin, which cannot move the
 * attention role from khub/ref-cpu (which also serves the KV cache, norms
 * and projections) to kernels-community/flash-attn2, and a reload of the
 * plugin that made the KV cache breaks the model (forward.c refuses it).
 * A rebind selects new bindings for the role's queries from one named
 * plugin and swaps the model's pointers; the old bindings are listed as
 * retired with their names and final counts, and released (below).
 *
 * Ordering: the model is one thread's at a time, so a rebind made between
 * two forward calls on that thread switches whole forward calls: a step
 * runs every layer on the old kernel or every layer on the new one, never
 * a mix. What can be swapped: ops without state or weights (attention,
 * norm, activation, rotary). The KV cache holds every running sequence's
 * keys and values in its plugin's own format, and the projections' weights
 * were laid out (quantized, repacked) for their op at load: those roles are
 * refused; they change with a new load.
 *
 * A model placed on a CUDA device (issue 19): a role that runs on the
 * device is switched to the plugin's CUDA op, a role on the CPU to its CPU
 * op; a plugin without an op on the role's side is refused (moving a role
 * across would change the copies and the memory the load planned). Before
 * the switch the model's stream is drained, so no launch of the old op is
 * still queued, and the decode step's executable graph, which holds the
 * old op's kernels, is destroyed: the next decode step captures the new
 * op. The old op's plugin keeps its modules until it is unloaded.
 *
 * Releasing the old bindings (issue 19): once the pointers are switched,
 * nothing can call an old binding any more. The model's thread is the only
 * one that runs its steps, and it is here, between two of them; on a
 * placed model the stream was drained and the graph holding the old
 * kernels destroyed before the switch. So each old binding is dropped from
 * the runtime right after the switch (its name and count kept for
 * khub_model_binding_get), and khub_plugin_unload of its plugin succeeds
 * when no other binding uses it. Until the switch it answers BUSY: a
 * server's prepared kernel waiting for the engine thread leaves the old
 * one serving, and bound. Rejected: keeping the binding and not counting
 * it, which would leave a binding whose plugin pointer dangles after the
 * unload, for a reload's scan of the bindings to trip on.
 *
 * Unloading the swapped-out plugin (session 15): the drop also unloads the
 * old binding's plugin when a swap's prepare loaded it and nothing uses it
 * any more (no binding of any model, no prepared swap), as a failed switch
 * unloads the plugin its prepare loaded: a server that swaps kernels again
 * and again keeps only what serves. A plugin the caller loaded
 * (khub_plugin_load, _load_static, _reload; the built-in ones) or a model
 * load fetched is never unloaded here: it stays the caller's to unload.
 */
#include <stdio.h>
#include <string.h>

#include "app_struct.h"
#include "cuda.h"
#include "khub/khub_kernels.h"
#include "model_impl.h"
#include "placement.h"
#include "runtime_impl.h"

/* khub.json's name of each kernel role ("attention"), from the one list. */
static const char *kernel_role_name(int role)
{
#define ROLE_NAME(NAME, name, flag, field) [KHUB_KERNEL_ROLE_##NAME] = #name,
    static const char *const names[KHUB_KERNEL_ROLE__COUNT] = {KHUB_KERNEL_ROLES(ROLE_NAME)};
#undef ROLE_NAME
    return role >= 0 && role < KHUB_KERNEL_ROLE__COUNT ? names[role] : "unknown";
}

/* The executor roles a kernel role covers; 0 when it cannot be swapped. */
static int roles_of(int role, khub__role out[2])
{
    switch (role) {
    case KHUB_KERNEL_ROLE_ATTENTION:
        out[0] = KHUB__ROLE_ATTENTION, out[1] = KHUB__ROLE_PAGED_ATTENTION;
        return 2;
    case KHUB_KERNEL_ROLE_NORM:
        out[0] = KHUB__ROLE_NORM, out[1] = KHUB__ROLE_NORM_RESIDUAL;
        return 2;
    case KHUB_KERNEL_ROLE_ACTIVATION: out[0] = KHUB__ROLE_ACT; return 1;
    case KHUB_KERNEL_ROLE_ROTARY: out[0] = KHUB__ROLE_ROTARY; return 1;
    default: return 0;
    }
}

/* The query the load made for bound role r (model_bind.c's), for plugin. */
static khub_op_query query_of(const khub_model *m, const khub__bound *b, const char *op_name)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .device_type = KHUB_DEVICE_CPU,
                       .dtype_id = b->dtype_id, .op_name = op_name && *op_name ? op_name : NULL};
    switch (b->role) {
    case KHUB__ROLE_ATTENTION:
        q.kind = KHUB_OP_ATTENTION;
        q.head_dim = (int32_t)m->cfg.head_dim;
        q.kind_flags = khub__model_attn_flags(m);
        q.flags = (uint32_t)(q.kind_flags & 0xff);
        break;
    case KHUB__ROLE_PAGED_ATTENTION:
        q.kind = KHUB_OP_PAGED_ATTENTION;
        q.head_dim = (int32_t)m->cfg.head_dim;
        q.kind_flags = khub__model_attn_flags(m) & ~KHUB_ATTN_STRIDED_KV;
        q.flags = (uint32_t)(q.kind_flags & 0xff);
        q.kv_layout = m->kv_layout;
        break;
    case KHUB__ROLE_NORM_RESIDUAL: q.kind = KHUB_OP_NORM, q.flags = KHUB_CAP_RESIDUAL; break;
    case KHUB__ROLE_NORM: q.kind = KHUB_OP_NORM; break;
    case KHUB__ROLE_ACT: q.kind = KHUB_OP_ACTIVATION; break;
    default: q.kind = KHUB_OP_ROTARY; break;
    }
    return q;
}

/* The model's pointer that serves executor role r. */
static khub_binding **slot_of(khub_model *m, khub__role r)
{
    switch (r) {
    case KHUB__ROLE_ATTENTION: return &m->attention;
    case KHUB__ROLE_PAGED_ATTENTION: return &m->paged_attn;
    case KHUB__ROLE_NORM: return &m->norm;
    case KHUB__ROLE_NORM_RESIDUAL: return &m->norm_res;
    case KHUB__ROLE_ACT: return &m->act;
    default: return &m->rotary;
    }
}

/* Makes room for n more retired bindings and one more old explain table. */
static khub_status reserve(khub_model *m, int n)
{
    if (m->n_retired + n > m->cap_retired) {
        int cap = m->cap_retired ? 2 * m->cap_retired : 8;
        while (cap < m->n_retired + n) cap *= 2;
        khub__retired *r = khub__realloc(m->rt, m->retired, (size_t)m->cap_retired * sizeof *r,
                                         (size_t)cap * sizeof *r);
        KHUB_RETURN_IF(m->rt, !r, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
        m->retired = r;
        m->cap_retired = cap;
    }
    char **e = khub__realloc(m->rt, m->old_explain, (size_t)m->n_old_explain * sizeof *e,
                             (size_t)(m->n_old_explain + 1) * sizeof *e);
    KHUB_RETURN_IF(m->rt, !e, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
    m->old_explain = e;
    return KHUB_STATUS_OK;
}

/* A placed model's explain gets the swap's line under its placement (the
 * placement lines describe the load). */
static void note_swap(khub_model *m, const khub__bound *b, const khub_binding *old)
{
    khub__place *pl = m->place;
    char line[512];
    snprintf(line, sizeof line, "  swapped: %s[%s]: %s%s (was %s)\n",
             khub__model_role_name(m, b->role), khub__model_bound_dtype(b),
             pl->cuda_of[b - m->bound] ? "on the device, " : "on the CPU, ",
             khub_binding_name(pl->cuda_of[b - m->bound] ? pl->cuda_of[b - m->bound] : b->b),
             khub_binding_name(old));
    size_t a = pl->text ? strlen(pl->text) : 0, n = strlen(line);
    char *t = khub__realloc(m->rt, pl->text, pl->text ? a + 1 : 0, a + n + 1);
    if (!t) return; /* the swap stands; only its explain line is lost */
    memcpy(t + a, line, n + 1);
    pl->text = t;
}

/* A placed model: wait for the model's stream (launches of the old op may
 * be queued), then drop the decode step's graph (it holds them). */
static khub_status drain(khub_model *m)
{
    khub__place *pl = m->place;
    if (!pl) return KHUB_STATUS_OK;
    khub__plugin_msg_clear();
    khub_status st = khub__cuda_host_stream_sync(NULL, pl->stream);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st,
                   "%s: cuda:%d: draining the model's stream before the swap: %s; nothing changed",
                   m->file, (int)pl->device, khub__plugin_msg());
    khub__graph_free(m);
    return KHUB_STATUS_OK;
}

/* A switch that fails drops the n bindings it selected (none was switched
 * in, so nothing can call them): else they would stay users of the new
 * plugin until khub_model_free, and the swap's release could not unload
 * the plugin its prepare loaded. */
static void drop_new(khub_model *m, khub_binding *const *nb, int n)
{
    for (int k = 0; k < n; k++) khub__registry_drop(m->rt, nb[k]);
}

khub_status khub__model_rebind(khub_model *m, int role, const khub_plugin *plugin,
                               const char *op_name)
{
    khub__role roles[2];
    int n_roles = roles_of(role, roles);
    const char *rname = kernel_role_name(role);
    KHUB_RETURN_IF(m->rt, n_roles == 0, KHUB_STATUS_UNSUPPORTED,
                   "%s: the %s kernel cannot be swapped in a running model (%s); load the "
                   "model again with the new kernel",
                   m->file, rname,
                   role == KHUB_KERNEL_ROLE_CACHE
                       ? "the KV cache holds the running sequences in its plugin's own format"
                       : "the weights were laid out for their op at load");
    int idx[8], n = 0;
    khub_binding *nb[8];
    for (int i = 0; i < m->n_bound && n < 8; i++)
        if (m->bound[i].role == roles[0] || (n_roles > 1 && m->bound[i].role == roles[1]))
            idx[n++] = i;
    KHUB_RETURN_IF(m->rt, n == 0, KHUB_STATUS_NOT_FOUND, "%s: no op serves the %s role", m->file,
                   rname);
    khub__place *pl = m->place;
    for (int k = 0; k < n; k++) {
        khub_op_query q = query_of(m, &m->bound[idx[k]], op_name);
        bool dev = pl && pl->cuda_of[idx[k]];
        if (dev) q.device_type = KHUB_DEVICE_CUDA;
        khub_status st = khub__registry_select_in(m->rt, &q, plugin, m, &nb[k]);
        if (st != KHUB_STATUS_OK) {
            char why[KHUB_ERROR_SIZE], side[48] = "";
            khub__copy_error(m->rt, why, sizeof why);
            khub__clear(m->rt);
            drop_new(m, nb, k);
            if (pl) snprintf(side, sizeof side, dev ? " on cuda:%d" : " on the CPU", pl->device);
            return khub__fail(m->rt, st, "%s: %s cannot serve %s%s: %s; nothing changed", m->file,
                              khub_plugin_id(plugin),
                              khub__model_role_name(m, m->bound[idx[k]].role), side, why);
        }
    }
    khub_status drained = drain(m);
    if (drained != KHUB_STATUS_OK) drop_new(m, nb, n);
    KHUB_FORWARD_IF_ERROR(m->rt, drained);
    khub_binding *old[8] = {NULL};
    pthread_mutex_lock(&m->bind_lock);
    khub_status st = reserve(m, n);
    for (int k = 0; k < n && st == KHUB_STATUS_OK; k++) {
        khub__bound *b = &m->bound[idx[k]];
        old[k] = b->b;
        if (pl && pl->cuda_of[idx[k]]) {
            /* the CPU binding stays the role's fallback; the device op changes */
            old[k] = pl->cuda_of[idx[k]];
            pl->cuda_of[idx[k]] = pl->cuda[b->role] = nb[k];
        } else {
            b->b = nb[k];
            *slot_of(m, b->role) = nb[k];
        }
        khub__retired *r = &m->retired[m->n_retired++];
        *r = (khub__retired){b->role, b->dtype_id, "", khub_binding_calls(old[k])};
        snprintf(r->kernel, sizeof r->kernel, "%s", khub_binding_name(old[k]));
        if (pl) note_swap(m, b, old[k]);
        KHUB_LOG_I(m->rt, "%s -> %s (swapped)", khub__model_role_name(m, b->role),
                   khub_binding_name(nb[k]));
    }
    if (st == KHUB_STATUS_OK && m->explain) m->old_explain[m->n_old_explain++] = m->explain;
    if (st == KHUB_STATUS_OK) m->explain = NULL; /* rebuilt on the next khub_model_explain */
    pthread_mutex_unlock(&m->bind_lock);
    if (st != KHUB_STATUS_OK) {
        drop_new(m, nb, n);
        return st;
    }
    /* Nothing calls the old bindings now (see the top of this file). */
    for (int k = 0; k < n; k++) khub__registry_drop(m->rt, old[k]);
    return st;
}

void khub__model_rebind_free(khub_model *m)
{
    for (int i = 0; i < m->n_old_explain; i++) khub__strfree(m->rt, m->old_explain[i]);
    khub__free(m->rt, m->old_explain, (size_t)m->n_old_explain * sizeof *m->old_explain);
    khub__free(m->rt, m->retired, (size_t)m->cap_retired * sizeof *m->retired);
}

/* ======================================================================== */
/* Bindings and their counts                                                */
/* ======================================================================== */

khub_status khub_model_binding_get(const khub_model *m, size_t i, khub_model_binding *out)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && out);
    /* Any thread: the message is khub_last_error()'s (and the runtime's
     * when it holds none yet: nothing here clears it under another thread). */
    char msg[KHUB_ERROR_SIZE];
    if (khub__app_struct_check(out, KHUB__SIZE_TO(khub_model_binding, reserved),
                               "khub_model_binding_get", "out", msg, sizeof msg))
        return khub__fail(m->rt, KHUB_STATUS_STRUCT_SIZE, "%s", msg);
    khub_model *mm = (khub_model *)m; /* the lock only */
    pthread_mutex_lock(&mm->bind_lock);
    bool found = true;
    khub__bound b = {0};
    const khub__retired *r = NULL;
    if (i < (size_t)m->n_bound)
        b = m->bound[i];
    else if (i - (size_t)m->n_bound < (size_t)m->n_retired)
        r = &m->retired[i - (size_t)m->n_bound], b.role = r->role, b.dtype_id = r->dtype_id;
    else
        found = false;
    if (found) {
        snprintf(out->role, sizeof out->role, "%s", khub__model_role_name(m, b.role));
        snprintf(out->dtype, sizeof out->dtype, "%s", khub__model_bound_dtype(&b));
        snprintf(out->kernel, sizeof out->kernel, "%s", r ? r->kernel : khub_binding_name(b.b));
        out->calls = r ? r->calls : khub_binding_calls(b.b);
        out->retired = r != NULL;
        out->reserved = 0;
    }
    pthread_mutex_unlock(&mm->bind_lock);
    return found ? KHUB_STATUS_OK : KHUB_STATUS_NOT_FOUND;
}
