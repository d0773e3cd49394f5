/*
 * registry.c: op selection and bindings.
 *
 * khub_registry_select walks every loaded plugin's ops of the asked kind,
 * accepts or rejects each with a reason, and ranks the accepted ones by
 * (matches the preferred plugin/op, caps.priority, earlier load). Every
 * decision goes into the binding's trace, so "why did I get this kernel?"
 * always has an answer.
 *
 * A binding names (plugin, op index). khub_binding_call takes the registry
 * lock for reading only long enough to pin the plugin (an atomic in-flight
 * count), so a reload, which swaps bindings under the write lock and then
 * waits for the old plugin's count to drain, never frees code a call is
 * running in. Pins taken by khub_binding_acquire are remembered per thread,
 * so the matching release unpins the plugin that was pinned even if the
 * binding has moved on to a reloaded one in between.
 *
 * Who owns a binding: one of khub_registry_select is the caller's and lives
 * until khub_runtime_free (khub.h). One a model selected for itself
 * (khub__registry_select_for, _select_in) names the model as its owner, and
 * khub_model_free drops it (khub__registry_drop_owned): only that model's
 * pointers reach it, and while it stays listed khub_plugin_unload counts it
 * as a user of its plugin (BUSY), so a model server that loads and frees
 * models would pile up bindings and keep their plugins loaded for good.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "app_struct.h"
#include "contain.h"
#include "cuda.h"
#include "runtime_impl.h"

#define MAX_PINS 16 /* khub_binding_acquire nesting per thread */

static const char *device_name(uint32_t d)
{
    switch (d) {
    case KHUB_DEVICE_CPU: return "cpu";
    case KHUB_DEVICE_CUDA: return "cuda";
    case KHUB_DEVICE_CUDA_HOST: return "cuda_host";
    default: return "unknown";
    }
}

const char *khub__dtype_id_name(int id)
{
    static const char *const base[] = {"f32", "f16", "bf16", "i8", "i32"};
    static const char *const q[KHUB_QFORMAT__COUNT] = {NULL,   "q8_0",     "q4_0", "q4_1", "q4_k",
                                                       "q6_k", "int8_row", "nf4",  "q5_0", "q5_1"};
    if (id >= 0 && id < 5) return base[id];
    if (id >= KHUB_DTYPE_ID_QBASE && id < KHUB_DTYPE_ID_QBASE + KHUB_QFORMAT__COUNT)
        return q[id - KHUB_DTYPE_ID_QBASE];
    return NULL;
}

static void dtype_name(char *buf, size_t n, int id)
{
    const char *name = khub__dtype_id_name(id);
    if (name)
        snprintf(buf, n, "%s", name);
    else
        snprintf(buf, n, "dtype%d", id);
}

static void dtypes_of(char *buf, size_t n, uint64_t mask)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int id = 0; id < 64 && used < n; id++) {
        if (!(mask & KHUB_DTYPE_BIT(id))) continue;
        char one[24];
        dtype_name(one, sizeof one, id);
        used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? " " : "", one);
    }
}

/* ======================================================================== */
/* Acceptance rules                                                         */
/* ======================================================================== */

static bool serves_head_dim(const khub_op_caps *c, int32_t d)
{
    if (!c->head_dims) return true;
    for (uint32_t i = 0; i < c->n_head_dims; i++)
        if (c->head_dims[i] == d) return true;
    return false;
}

static bool reject_cuda(khub_runtime *rt, const khub_op_caps *c, char *why, size_t n)
{
    if (!c->cc_min && !c->cc_max) return false;
    int cc = 0;
    if (khub__cuda_device_cc(rt, 0, &cc) != KHUB_STATUS_OK) {
        snprintf(why, n, "no CUDA device: %s", khub_runtime_errmsg(rt));
        khub__clear(rt);
        return true;
    }
    if ((c->cc_min && cc < c->cc_min) || (c->cc_max && cc > c->cc_max)) {
        char hi[16] = "any";
        if (c->cc_max) snprintf(hi, sizeof hi, "%d.%d", c->cc_max / 10, c->cc_max % 10);
        snprintf(why, n, "needs compute capability %d.%d-%s, device 0 has %d.%d", c->cc_min / 10,
                 c->cc_min % 10, hi, cc / 10, cc % 10);
        return true;
    }
    return false;
}

/* True (with a reason) when op of p cannot serve q on this machine. */
static bool rejects(khub_runtime *rt, const khub_op_query *q, const khub_plugin *p,
                    const khub_op_desc *op, char *why, size_t n)
{
    const khub_op_caps *c = op->caps;
    uint32_t want_dev = q->device_type ? q->device_type : KHUB_DEVICE_CPU;
    char list[160];
    if (c->device_type != want_dev) {
        snprintf(why, n, "device %s, wants %s", device_name(c->device_type), device_name(want_dev));
        return true;
    }
    uint32_t missing = c->cpu_features & ~rt->cpu_features;
    if (missing) {
        khub__cpu_feature_list(missing, " ", list, sizeof list);
        snprintf(why, n, "needs cpu %s", list);
        return true;
    }
    if (q->dtype_id >= 0 && q->dtype_id < 64 && c->dtypes &&
        !(c->dtypes & KHUB_DTYPE_BIT(q->dtype_id))) {
        char want[24];
        dtype_name(want, sizeof want, q->dtype_id);
        dtypes_of(list, sizeof list, c->dtypes);
        snprintf(why, n, "dtype %s not in caps (serves %s)", want, list);
        return true;
    }
    if (q->head_dim > 0 && !serves_head_dim(c, q->head_dim)) {
        size_t used = 0;
        list[0] = '\0';
        for (uint32_t i = 0; i < c->n_head_dims && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", used ? " " : "",
                                     (int)c->head_dims[i]);
        snprintf(why, n, "head dim %d not served (serves %s)", (int)q->head_dim, list);
        return true;
    }
    /* c is the host's copy: kind_flags holds the 1.0 word too, act_dtypes
     * is never 0 (loader.c copy_caps). */
    bool v13 = KHUB_HAS_FIELD(q, khub_op_query, act_dtype_id);
    uint64_t lacking = ((uint64_t)q->flags | (v13 ? q->kind_flags : 0)) & ~c->kind_flags;
    if (lacking) {
        khub__cap_flag_names(q->kind, lacking, " ", list, sizeof list);
        snprintf(why, n, "missing flag %s", list);
        return true;
    }
    int act = v13 ? q->act_dtype_id : KHUB_DTYPE_ID_F32;
    if (act >= 0 && act < 64 && !(c->act_dtypes & KHUB_DTYPE_BIT(act))) {
        char want[24];
        dtype_name(want, sizeof want, act);
        dtypes_of(list, sizeof list, c->act_dtypes);
        snprintf(why, n, "activation dtype %s not in caps (takes %s)", want, list);
        return true;
    }
    uint32_t layout = KHUB_HAS_FIELD(q, khub_op_query, kv_layout) ? q->kv_layout : 0;
    if (layout && (layout >= 64 || !(c->kv_layouts & KHUB_KV_LAYOUT_BIT(layout)))) {
        khub__kv_layouts_list(c->kv_layouts, list, sizeof list);
        snprintf(why, n, "KV layout %s not in caps (serves %s)", khub__kv_layout_name(layout),
                 list);
        return true;
    }
    if (want_dev == KHUB_DEVICE_CUDA && reject_cuda(rt, c, why, n)) return true;
    if (p->score == 0) {
        snprintf(why, n, "score 0: unsupported on this machine");
        return true;
    }
    return false;
}

/* ======================================================================== */
/* Selection                                                                */
/* ======================================================================== */

typedef struct choice {
    khub_plugin *p;
    uint32_t op;
    bool preferred;
} choice;

static bool is_preferred(const khub_op_query *q, const khub_plugin *p, const khub_op_desc *op)
{
    if (!q->plugin_id && !q->op_name) return false;
    if (q->plugin_id && strcmp(p->id, q->plugin_id) != 0) return false;
    return !q->op_name || strcmp(op->name, q->op_name) == 0;
}

/* a ranks before b: preferred, then priority, then earlier load. */
static bool better(const choice *a, const choice *b)
{
    if (!b->p) return true;
    if (a->preferred != b->preferred) return a->preferred;
    int32_t pa = a->p->caps[a->op].priority, pb = b->p->caps[b->op].priority;
    if (pa != pb) return pa > pb;
    return a->p->seq < b->p->seq;
}

typedef struct walk {
    const khub_plugin *only; /* khub__registry_select_in: the one plugin that may win */
    choice best;
    size_t n_seen, n_accepted;
    char pref_why[256]; /* why the preferred plugin/op did not win */
    char first_reject[256];
} walk;

static void walk_candidates(khub_runtime *rt, const khub_op_query *q, khub__text *trace, walk *w)
{
    for (size_t i = 0; i < rt->plugins.count; i++) {
        khub_plugin *p = rt->plugins.items[i];
        for (uint32_t j = 0; j < p->n_ops; j++) {
            const khub_op_desc *op = &p->ops[j];
            if (op->kind != q->kind) continue;
            w->n_seen++;
            char why[224];
            bool pref = w->only ? p == w->only && (!q->op_name || !strcmp(op->name, q->op_name))
                                : is_preferred(q, p, op);
            choice c = {p, j, pref};
            if (rejects(rt, q, p, op, why, sizeof why)) {
                khub__text_add(trace, "reject %s %s :: %s: %s\n", p->id, p->version, op->name, why);
                if (!w->first_reject[0])
                    snprintf(w->first_reject, sizeof w->first_reject, "%s :: %s: %s", p->id,
                             op->name, why);
                if (c.preferred && !w->pref_why[0])
                    snprintf(w->pref_why, sizeof w->pref_why, "rejected: %s", why);
                continue;
            }
            w->n_accepted++;
            khub__text_add(trace, "accept %s %s :: %s (priority %d)\n", p->id, p->version, op->name,
                           (int)p->caps[j].priority);
            if (better(&c, &w->best)) w->best = c;
        }
    }
}

/* Whether msg is a fallback warning not logged before by this runtime
 * (call under reg_lock for writing). The trace records every fallback; the
 * log says each one once. Past the table's size every warning is new. */
static bool first_warning(khub_runtime *rt, const char *msg)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++)
        h = (h ^ *c) * 1099511628211ull;
    for (size_t i = 0; i < rt->n_warned; i++)
        if (rt->warned[i] == h) return false;
    if (rt->n_warned < sizeof rt->warned / sizeof rt->warned[0]) rt->warned[rt->n_warned++] = h;
    return true;
}

/* Why no preferred candidate was seen at all. */
static void explain_absent(const khub_runtime *rt, const khub_op_query *q, walk *w)
{
    if (w->pref_why[0]) return;
    bool loaded = false;
    for (size_t i = 0; q->plugin_id && i < rt->plugins.count; i++)
        loaded = loaded || strcmp(rt->plugins.items[i]->id, q->plugin_id) == 0;
    if (q->plugin_id && !loaded)
        snprintf(w->pref_why, sizeof w->pref_why, "not loaded");
    else
        snprintf(w->pref_why, sizeof w->pref_why, "unusable: it has no %s op%s%s",
                 khub__op_kind_name(q->kind), q->op_name ? " named " : "",
                 q->op_name ? q->op_name : "");
}

static khub_status add_binding(khub_runtime *rt, const choice *c, const void *owner,
                               khub__text *trace, khub_binding **out)
{
    khub__binding_list *l = &rt->bindings;
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        khub_binding **items =
            khub__realloc(rt, l->items, l->cap * sizeof *items, cap * sizeof *items);
        if (!items) return KHUB_STATUS_NOMEM;
        l->items = items;
        l->cap = cap;
    }
    khub_binding *b = khub__calloc(rt, 1, sizeof *b);
    if (!b) return KHUB_STATUS_NOMEM;
    b->rt = rt;
    b->owner = owner;
    b->plugin = c->p;
    b->op_index = c->op;
    b->kind = c->p->ops[c->op].kind;
    b->trace = trace->s;
    b->trace_cap = trace->cap;
    trace->s = NULL;
    trace->cap = 0;
    khub__binding_set_name(b);
    l->items[l->count++] = b;
    *out = b;
    return KHUB_STATUS_OK;
}

static khub_status select_locked(khub_runtime *rt, const khub_op_query *q, const khub_plugin *only,
                                 const void *owner, khub__text *trace, khub_binding **out)
{
    walk w = {.only = only};
    walk_candidates(rt, q, trace, &w);
    bool asked = q->plugin_id || q->op_name || only;
    char pref[160];
    snprintf(pref, sizeof pref, "%s%s%s", q->plugin_id ? q->plugin_id : "",
             q->op_name ? " :: " : "", q->op_name ? q->op_name : "");
    if (!w.best.p) {
        if (w.n_seen == 0)
            return khub__fail(rt, KHUB_STATUS_NO_KERNEL,
                              "no plugin serves %s ops (%zu plugins loaded); load one that does",
                              khub__op_kind_name(q->kind), rt->plugins.count);
        return khub__fail(rt, KHUB_STATUS_NO_KERNEL,
                          "no %s op fits: all %zu candidates rejected (first: %s)",
                          khub__op_kind_name(q->kind), w.n_seen, w.first_reject);
    }
    const khub_plugin *bp = w.best.p;
    const char *bop = bp->ops[w.best.op].name;
    if (asked && !w.best.preferred) {
        explain_absent(rt, q, &w);
        if (only)
            return khub__fail(rt, KHUB_STATUS_NO_KERNEL, "%s %s%s%s for %s is %s", only->id,
                              only->version, q->op_name ? " :: " : "", q->op_name ? q->op_name : "",
                              khub__op_kind_name(q->kind), w.pref_why);
        if (rt->strict)
            return khub__fail(rt, KHUB_STATUS_NO_KERNEL,
                              "preferred %s for %s is %s, and KHUB_OPT_STRICT forbids falling "
                              "back to %s %s :: %s",
                              pref, khub__op_kind_name(q->kind), w.pref_why, bp->id, bp->version,
                              bop);
        char msg[KHUB_ERROR_SIZE];
        snprintf(msg, sizeof msg, "preferred %s for %s is %s; falling back to %s %s :: %s", pref,
                 khub__op_kind_name(q->kind), w.pref_why, bp->id, bp->version, bop);
        if (first_warning(rt, msg)) khub__log(rt, KHUB_LOG_WARN, "%s", msg);
        khub__text_add(trace, "chose %s %s :: %s (fallback: preferred %s is %s)", bp->id,
                       bp->version, bop, pref, w.pref_why);
    } else {
        khub__text_add(trace, "chose %s %s :: %s (%s, priority %d, %zu of %zu accepted)", bp->id,
                       bp->version, bop, w.best.preferred ? "preferred" : "best ranked",
                       (int)bp->caps[w.best.op].priority, w.n_accepted, w.n_seen);
    }
    if (trace->oom) return khub__fail(rt, KHUB_STATUS_NOMEM, "selection trace: out of memory");
    KHUB_RETURN_IF(rt, add_binding(rt, &w.best, owner, trace, out) != KHUB_STATUS_OK,
                   KHUB_STATUS_NOMEM, "registering a binding: out of memory");
    return KHUB_STATUS_OK;
}

/* khub_registry_select for owner (NULL: the caller). */
static khub_status select_for(khub_runtime *rt, const khub_op_query *q, const void *owner,
                              khub_binding **out)
{
    khub__clear(rt);
    *out = NULL;
    KHUB__APP_CHECK(rt, q, KHUB__SIZE_TO(khub_op_query, op_name), "khub_registry_select", "q");
    KHUB_RETURN_IF(rt, q->kind == 0 || q->kind >= KHUB_OP_KIND__COUNT, KHUB_STATUS_INVALID_ARG,
                   "khub_op_query: unknown op kind %u", (unsigned)q->kind);
    khub__text trace = {.rt = rt};
    pthread_rwlock_wrlock(&rt->reg_lock);
    khub_status st = select_locked(rt, q, NULL, owner, &trace, out);
    pthread_rwlock_unlock(&rt->reg_lock);
    khub__text_free(&trace);
    return st;
}

khub_status khub_registry_select(khub_runtime *rt, const khub_op_query *q, khub_binding **out)
{
    KHUB_API_CHECK(NULL, rt != NULL && q != NULL && out != NULL);
    return select_for(rt, q, NULL, out);
}

khub_status khub__registry_select_for(khub_runtime *rt, const khub_op_query *q, const void *owner,
                                      khub_binding **out)
{
    KHUB_ASSERT(rt && q && owner && out);
    return select_for(rt, q, owner, out);
}

khub_status khub__registry_select_in(khub_runtime *rt, const khub_op_query *q,
                                     const khub_plugin *plugin, const void *owner,
                                     khub_binding **out)
{
    KHUB_ASSERT(rt && q && plugin && out);
    khub__clear(rt);
    *out = NULL;
    khub__text trace = {.rt = rt};
    pthread_rwlock_wrlock(&rt->reg_lock);
    khub_status st = select_locked(rt, q, plugin, owner, &trace, out);
    pthread_rwlock_unlock(&rt->reg_lock);
    khub__text_free(&trace);
    return st;
}

/* ======================================================================== */
/* Calls                                                                    */
/* ======================================================================== */

/* Pins b's current plugin and returns it with the index of the bound op in
 * it (the registry lock is released). Both are read under the lock: a
 * reload rewrites plugin and op_index together, and the new plugin may list
 * its ops in another order. */
static khub_plugin *pin(khub_binding *b, uint32_t *op_index)
{
    pthread_rwlock_rdlock(&b->rt->reg_lock);
    khub_plugin *p = b->plugin;
    *op_index = b->op_index;
    atomic_fetch_add(&p->inflight, 1);
    pthread_rwlock_unlock(&b->rt->reg_lock);
    return p;
}

static void unpin(khub_plugin *p) { atomic_fetch_sub(&p->inflight, 1); }

khub_status khub_binding_call(khub_binding *b, const void *args)
{
    KHUB_API_CHECK(NULL, b != NULL);
    uint32_t idx;
    khub_plugin *p = pin(b, &idx);
    atomic_fetch_add_explicit(&b->calls, 1, memory_order_relaxed);
    const khub_op_desc *op = &p->ops[idx];
    if (!op->run) {
        khub_status st = khub__fail(b->rt, KHUB_STATUS_UNSUPPORTED,
                                    "%s %s :: %s: a %s op has methods, not run; use "
                                    "khub_binding_acquire",
                                    p->id, p->version, op->name, khub__op_kind_name(op->kind));
        unpin(p);
        return st;
    }
    khub__plugin_msg_clear();
    khub__args_buf cut;
    const void *sent = khub__args_for_minor(op->kind, p->abi_minor, args, &cut);
    khub__inflight rec;
    khub__inflight_enter(&rec, p, op);
    khub_status st = op->run(p->desc.state, sent);
    khub__inflight_leave(&rec);
    if (st != KHUB_STATUS_OK) {
        /* Formatted while still pinned: the strings belong to p. */
        const char *why = khub__plugin_msg()[0] ? khub__plugin_msg() : khub_status_str(st);
        khub__clear(b->rt);
        khub__fail(b->rt, st, "%s %s :: %s: %s", p->id, p->version, op->name, why);
    }
    unpin(p);
    return st;
}

static _Thread_local struct {
    const khub_binding *b;
    khub_plugin *p;
    uint32_t op; /* the op index pinned */
} tls_pins[MAX_PINS];
static _Thread_local int tls_n_pins;

const khub_op_desc *khub_binding_acquire(khub_binding *b, void **plugin_state)
{
    if (plugin_state) *plugin_state = NULL;
    if (!b) return NULL;
    if (tls_n_pins >= MAX_PINS) {
        khub__fail(b->rt, KHUB_STATUS_BUSY,
                   "khub_binding_acquire: more than %d nested pins on "
                   "this thread; release some first",
                   MAX_PINS);
        return NULL;
    }
    uint32_t idx;
    khub_plugin *p = pin(b, &idx);
    tls_pins[tls_n_pins].b = b;
    tls_pins[tls_n_pins].p = p;
    tls_pins[tls_n_pins].op = idx;
    tls_n_pins++;
    if (plugin_state) *plugin_state = p->desc.state;
    return &p->ops[idx];
}

void khub__binding_enter(khub_binding *b, khub__inflight *r)
{
    if (b) atomic_fetch_add_explicit(&b->calls, 1, memory_order_relaxed);
    for (int i = tls_n_pins - 1; i >= 0; i--) {
        if (tls_pins[i].b != b) continue;
        khub__inflight_enter(r, tls_pins[i].p, &tls_pins[i].p->ops[tls_pins[i].op]);
        return;
    }
    /* Not pinned on this thread (a caller bug): record nothing, but keep
     * enter/leave paired. */
    *r = (khub__inflight){.prev = khub__inflight_now(), .layer = -1};
    r->plugin = NULL;
}

void khub__binding_leave(khub__inflight *r)
{
    if (r->plugin) khub__inflight_leave(r);
}

bool khub__pinned_here(const khub_plugin *p)
{
    for (int i = 0; i < tls_n_pins; i++)
        if (tls_pins[i].p == p) return true;
    return false;
}

void khub_binding_release(khub_binding *b)
{
    for (int i = tls_n_pins - 1; i >= 0; i--) {
        if (tls_pins[i].b != b) continue;
        unpin(tls_pins[i].p);
        memmove(&tls_pins[i], &tls_pins[i + 1], (size_t)(tls_n_pins - 1 - i) * sizeof tls_pins[0]);
        tls_n_pins--;
        return;
    }
}

const void *khub_binding_methods(const khub_binding *b, void **plugin_state)
{
    if (plugin_state) *plugin_state = NULL;
    if (!b) return NULL;
    pthread_rwlock_rdlock(&b->rt->reg_lock);
    const khub_plugin *p = b->plugin;
    const void *m = p->ops[b->op_index].methods;
    if (plugin_state) *plugin_state = p->desc.state;
    pthread_rwlock_unlock(&b->rt->reg_lock);
    return m;
}

const char *khub_binding_name(const khub_binding *b) { return b ? b->name : NULL; }
const char *khub_binding_trace(const khub_binding *b) { return b && b->trace ? b->trace : ""; }

/* ======================================================================== */
/* Shared with loader.c                                                     */
/* ======================================================================== */

size_t khub__registry_bindings_of(const khub_runtime *rt, const khub_plugin *p, size_t *of_callers)
{
    size_t n = 0, callers = 0;
    for (size_t i = 0; i < rt->bindings.count; i++) {
        const khub_binding *b = rt->bindings.items[i];
        n += b->plugin == p;
        callers += b->plugin == p && !b->owner;
    }
    if (of_callers) *of_callers = callers;
    return n;
}

/* Takes the first binding that is b (b non-NULL) or that owner owns out
 * of rt's list and returns it, with its plugin's load number in *load_no;
 * NULL when there is none. */
static khub_binding *take_binding(khub_runtime *rt, const khub_binding *b, const void *owner,
                                  uint64_t *load_no)
{
    khub__binding_list *l = &rt->bindings;
    khub_binding *found = NULL;
    pthread_rwlock_wrlock(&rt->reg_lock);
    for (size_t i = 0; i < l->count && !found; i++) {
        if (b ? l->items[i] != b : l->items[i]->owner != owner) continue;
        found = l->items[i];
        *load_no = found->plugin->load_no;
        memmove(l->items + i, l->items + i + 1, (l->count - i - 1) * sizeof *l->items);
        l->count--;
    }
    pthread_rwlock_unlock(&rt->reg_lock);
    return found;
}

/* Frees b, taken out of the list, then unloads its plugin when a swap's
 * prepare loaded it and nothing uses it any more. */
static void free_taken(khub_runtime *rt, khub_binding *b, uint64_t load_no)
{
    const khub_plugin *p = b->plugin;
    khub__free(rt, b->trace, b->trace_cap);
    khub__free(rt, b, sizeof *b);
    /* p is only compared until found: another thread may have unloaded it */
    khub__plugin_swapped_out(rt, p, load_no);
}

void khub__registry_drop(khub_runtime *rt, khub_binding *b)
{
    uint64_t load_no = 0;
    khub_binding *taken = take_binding(rt, b, NULL, &load_no);
    if (NEVER(!taken)) return; /* not this runtime's: leave it alone */
    free_taken(rt, taken, load_no);
}

size_t khub__registry_drop_owned(khub_runtime *rt, const void *owner)
{
    /* One at a time, each under its own lock: a model owns a few dozen
     * bindings, and the list needs no scratch memory (no allocation that
     * could fail while freeing). The plugin of the last one dropped is
     * unloaded if a swap loaded it and nothing else uses it. */
    size_t n = 0;
    uint64_t load_no = 0;
    for (khub_binding *b; owner && (b = take_binding(rt, NULL, owner, &load_no)) != NULL; n++)
        free_taken(rt, b, load_no);
    return n;
}

uint64_t khub_binding_calls(const khub_binding *b)
{
    return b ? atomic_load_explicit(&b->calls, memory_order_relaxed) : 0;
}

void khub__binding_set_name(khub_binding *b)
{
    snprintf(b->name, sizeof b->name, "%s %s :: %s", b->plugin->id, b->plugin->version,
             b->plugin->ops[b->op_index].name);
}

void khub__bindings_free(khub_runtime *rt)
{
    for (size_t i = 0; i < rt->bindings.count; i++) {
        khub_binding *b = rt->bindings.items[i];
        khub__free(rt, b->trace, b->trace_cap);
        khub__free(rt, b, sizeof *b);
    }
    khub__free(rt, rt->bindings.items, rt->bindings.cap * sizeof *rt->bindings.items);
    rt->bindings = (khub__binding_list){0};
}
