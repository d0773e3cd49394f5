/*
 * plugin_list.c: the runtime's plugins: a plugin object's life (new,
 * retire after quiesce and shutdown, dlclose), the registry's list of
 * loaded plugins, hot reload (the new plugin takes over every binding of
 * the old one), unload when idle, and the public accessors.
 */
#include <dlfcn.h>
#include <link.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loader_impl.h"
#include "plugin_artifacts.h"

/* ======================================================================== */
/* Plugin objects                                                           */
/* ======================================================================== */

khub_plugin *khub__plugin_new(khub_runtime *rt)
{
    khub_plugin *p = khub__calloc(rt, 1, sizeof *p);
    if (!p) return NULL;
    p->rt = rt;
    p->memfd = -1;
    p->score = 1;
    atomic_init(&p->inflight, 0);
    pthread_mutex_init(&p->mod_lock, NULL);
    return p;
}

static int find_loaded(struct dl_phdr_info *info, size_t size, void *ud)
{
    (void)size;
    return info->dlpi_name && strcmp(info->dlpi_name, (const char *)ud) == 0;
}

bool khub__fd_path_loaded(const char *fdpath)
{
    return dl_iterate_phdr(find_loaded, (void *)fdpath) != 0;
}

/* dlclose, then check that the library really left the process. If it did
 * not (a NODELETE object), the memfd is deliberately kept open: closing it
 * would let a later load reuse the fd number and get this library back. */
void khub__plugin_dlclose(khub_plugin *p)
{
    if (!p->dl) return;
    char fdpath[32];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", p->memfd);
    dlclose(p->dl);
    p->dl = NULL;
    if (khub__fd_path_loaded(fdpath)) {
        khub__log(p->rt, KHUB_LOG_WARN, "plugin %s %s: still mapped after dlclose; keeping %s open",
                  p->id, p->version, fdpath);
        p->memfd = -1;
    }
}

void khub__plugin_free(khub_plugin *p)
{
    if (!p) return;
    khub_runtime *rt = p->rt;
    for (uint32_t i = 0; p->ops && i < p->n_ops; i++) khub__strfree(rt, (char *)p->ops[i].name);
    khub__free(rt, p->ops, sizeof *p->ops * p->ops_cap);
    khub__free(rt, p->caps, sizeof *p->caps * p->ops_cap);
    khub__free(rt, p->dims, sizeof *p->dims * p->n_dims);
    /* A verified load's sealed copy, no longer mapped (dlclose checked it),
     * is offered to sealed_memo.h for the next load of the same file. */
    if (p->memfd >= 0 && !(p->keep_sealed && !p->dl &&
                           khub__sealed_memo_put(p->path, p->sha256, &p->source, p->memfd,
                                                 p->memfd_size, p->memfd_name)))
        close(p->memfd);
    khub__strfree(rt, p->id);
    khub__strfree(rt, p->version);
    khub__strfree(rt, p->path);
    khub__artifacts_free(rt, p->artifacts);
    khub__strfree(rt, p->quarantine);
    pthread_mutex_destroy(&p->mod_lock);
    khub__free(rt, p, sizeof *p);
}

/* Retirement: quiesce, shutdown, CUDA modules, dlclose, memory. The caller
 * has made sure no call is in flight. */
void khub__plugin_retire(khub_plugin *p)
{
    if (!p) return;
    if (p->desc.quiesce) {
        khub_status st = p->desc.quiesce(p->desc.state);
        if (st != KHUB_STATUS_OK)
            khub__log(p->rt, KHUB_LOG_WARN, "plugin %s %s: quiesce returned %s", p->id, p->version,
                      khub_status_name(st));
    }
    if (p->desc.shutdown) p->desc.shutdown(p->desc.state);
    khub__cuda_unload_modules(p);
    khub__plugin_dlclose(p);
    khub__plugin_free(p);
}

void khub__plugin_wait_idle(khub_plugin *p)
{
    for (unsigned spins = 0; atomic_load(&p->inflight) != 0; spins++) {
        if (spins < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ======================================================================== */
/* The registry's plugin list                                               */
/* ======================================================================== */

static khub_status list_append(khub_runtime *rt, khub_plugin *p)
{
    khub__plugin_list *l = &rt->plugins;
    if (l->count == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        khub_plugin **items =
            khub__realloc(rt, l->items, l->cap * sizeof *items, cap * sizeof *items);
        if (!items) return KHUB_STATUS_NOMEM;
        l->items = items;
        l->cap = cap;
    }
    l->items[l->count++] = p;
    p->load_no = ++rt->plugin_load_no;
    return KHUB_STATUS_OK;
}

/* Index of p in the list, or SIZE_MAX. */
static size_t list_find(const khub_runtime *rt, const khub_plugin *p)
{
    for (size_t i = 0; i < rt->plugins.count; i++)
        if (rt->plugins.items[i] == p) return i;
    return SIZE_MAX;
}

khub_status khub__plugin_register(khub_runtime *rt, khub_plugin *p, khub_plugin **out)
{
    pthread_rwlock_wrlock(&rt->reg_lock);
    khub_status st = list_append(rt, p);
    pthread_rwlock_unlock(&rt->reg_lock);
    if (st != KHUB_STATUS_OK) {
        khub__plugin_retire(p);
        return khub__fail(rt, st, "registering a plugin: out of memory");
    }
    khub__log(rt, KHUB_LOG_INFO, "loaded plugin %s %s (%u ops) from %s", p->id, p->version,
              (unsigned)p->n_ops, p->path);
    if (out) *out = p;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Hot reload and unload                                                    */
/* ======================================================================== */

/* Index of the op of old's op `name` and `kind` in p, or UINT32_MAX. */
static uint32_t op_named(const khub_plugin *p, const char *name, uint32_t kind)
{
    for (uint32_t i = 0; i < p->n_ops; i++)
        if (p->ops[i].kind == kind && strcmp(p->ops[i].name, name) == 0) return i;
    return UINT32_MAX;
}

/* Under the write lock: checks that np serves every binding of old, then
 * swaps them all and puts np in old's slot. */
static khub_status swap_bindings(khub_runtime *rt, khub_plugin *old, khub_plugin *np, size_t slot,
                                 char *msg, size_t n)
{
    for (size_t i = 0; i < rt->bindings.count; i++) {
        const khub_binding *b = rt->bindings.items[i];
        if (b->plugin != old) continue;
        const khub_op_desc *op = &old->ops[b->op_index];
        if (op_named(np, op->name, op->kind) == UINT32_MAX) {
            khub__errbuf(msg, n,
                         "reload %s %s -> %s %s: the new plugin has no %s op \"%s\", "
                         "which a binding uses; nothing changed",
                         old->id, old->version, np->id, np->version, khub__op_kind_name(op->kind),
                         op->name);
            return KHUB_STATUS_NO_KERNEL;
        }
    }
    for (size_t i = 0; i < rt->bindings.count; i++) {
        khub_binding *b = rt->bindings.items[i];
        if (b->plugin != old) continue;
        b->op_index = op_named(np, old->ops[b->op_index].name, b->kind);
        b->plugin = np;
        khub__binding_set_name(b);
    }
    np->seq = old->seq;
    np->load_no = ++rt->plugin_load_no; /* another build: a swap prepared on old is stale */
    rt->plugins.items[slot] = np;
    return KHUB_STATUS_OK;
}

khub_status khub_plugin_reload(khub_runtime *rt, khub_plugin *old, const char *path,
                               const char *sha256_hex, khub_plugin **out)
{
    KHUB_API_CHECK(NULL, rt != NULL && old != NULL);
    khub__clear(rt);
    if (out) *out = NULL;
    KHUB_FORWARD_IF_ERROR(rt, khub__plugin_check_args(rt, path, sha256_hex));
    KHUB_RETURN_IF(rt, khub__pinned_here(old), KHUB_STATUS_BUSY,
                   "reload %s %s: this thread holds a khub_binding_acquire pin on it, so it "
                   "could never go idle; release the pin first; nothing changed",
                   old->id, old->version);
    KHUB_FORWARD_IF_ERROR(rt, khub__plugin_isolated_init(rt, path, sha256_hex));
    char msg[KHUB_ERROR_SIZE];
    khub_plugin *np = NULL;
    khub_status st = khub__plugin_prepare(rt, path, sha256_hex, NULL, &np, msg, sizeof msg);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", msg);
    np->by_caller = true; /* the caller's now, even when a swap loaded old */

    pthread_rwlock_wrlock(&rt->reg_lock);
    size_t slot = list_find(rt, old);
    if (slot == SIZE_MAX) {
        snprintf(msg, sizeof msg, "reload %s: the old plugin is not loaded in this runtime", path);
        st = KHUB_STATUS_MISUSE;
    } else if (old->swap_holds) {
        /* a switch may be reading it right now (kernel_swap.c) */
        snprintf(msg, sizeof msg,
                 "reload %s %s: %u prepared kernel swap(s) hold it; switch them "
                 "(khub_model_kernel_swap) or release them (khub_kernel_swap_release) first; "
                 "nothing changed",
                 old->id, old->version, (unsigned)old->swap_holds);
        st = KHUB_STATUS_BUSY;
    } else {
        st = swap_bindings(rt, old, np, slot, msg, sizeof msg);
    }
    pthread_rwlock_unlock(&rt->reg_lock);
    if (st != KHUB_STATUS_OK) {
        khub__plugin_retire(np);
        return khub__fail(rt, st, "%s", msg);
    }
    khub__log(rt, KHUB_LOG_INFO, "reloaded plugin %s %s -> %s", old->id, old->version, np->version);
    /* No new call can reach old now; wait out the ones that pinned it. */
    khub__plugin_wait_idle(old);
    khub__plugin_retire(old);
    if (out) *out = np;
    return KHUB_STATUS_OK;
}

khub_status khub_plugin_unload(khub_runtime *rt, khub_plugin *p)
{
    KHUB_API_CHECK(NULL, rt != NULL && p != NULL);
    khub__clear(rt);
    KHUB_RETURN_IF(rt, khub__pinned_here(p), KHUB_STATUS_BUSY,
                   "unload %s %s: this thread holds a khub_binding_acquire pin on it; release "
                   "the pin first",
                   p->id, p->version);
    pthread_rwlock_wrlock(&rt->reg_lock);
    size_t slot = list_find(rt, p);
    size_t callers = 0, users = slot == SIZE_MAX ? 0 : khub__registry_bindings_of(rt, p, &callers);
    uint32_t holds = slot == SIZE_MAX ? 0 : p->swap_holds;
    if (slot != SIZE_MAX && users == 0 && holds == 0) {
        khub__plugin_list *l = &rt->plugins;
        memmove(l->items + slot, l->items + slot + 1, (l->count - slot - 1) * sizeof *l->items);
        l->count--;
    }
    pthread_rwlock_unlock(&rt->reg_lock);
    KHUB_RETURN_IF(rt, slot == SIZE_MAX, KHUB_STATUS_MISUSE,
                   "unload: the plugin is not loaded in this runtime");
    /* A model's bindings go with the model (khub_model_free) or a swap;
     * khub_registry_select's stay until khub_runtime_free. */
    KHUB_RETURN_IF(rt, users > 0 && callers == 0, KHUB_STATUS_BUSY,
                   "unload %s %s: %zu binding(s) of loaded models use it; free those models or "
                   "swap it out of them (khub_model_kernel_swap), or reload it instead",
                   p->id, p->version, users);
    KHUB_RETURN_IF(rt, users > 0, KHUB_STATUS_BUSY,
                   "unload %s %s: %zu binding(s) use it, %zu from khub_registry_select, which "
                   "last until khub_runtime_free; reload it instead, or free the runtime",
                   p->id, p->version, users, callers);
    KHUB_RETURN_IF(rt, holds > 0, KHUB_STATUS_BUSY,
                   "unload %s %s: %u prepared kernel swap(s) hold it; switch them "
                   "(khub_model_kernel_swap) or release them (khub_kernel_swap_release) first",
                   p->id, p->version, (unsigned)holds);
    khub__plugin_wait_idle(p);
    khub__plugin_retire(p);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Prepared kernel swaps' holds                                             */
/* ======================================================================== */

uint64_t khub__plugin_load_mark(khub_runtime *rt)
{
    pthread_rwlock_rdlock(&rt->reg_lock);
    uint64_t mark = rt->plugin_load_no;
    pthread_rwlock_unlock(&rt->reg_lock);
    return mark;
}

/* Under reg_lock: p's slot when it is loaded as load_no (0: any), else
 * SIZE_MAX. p is not dereferenced unless it is in the list. */
static size_t find_load(const khub_runtime *rt, const khub_plugin *p, uint64_t load_no)
{
    size_t slot = list_find(rt, p);
    return slot != SIZE_MAX && (!load_no || p->load_no == load_no) ? slot : SIZE_MAX;
}

uint64_t khub__plugin_load_of(khub_runtime *rt, const khub_plugin *p)
{
    pthread_rwlock_rdlock(&rt->reg_lock);
    size_t slot = list_find(rt, p);
    uint64_t load_no = slot == SIZE_MAX ? 0 : rt->plugins.items[slot]->load_no;
    pthread_rwlock_unlock(&rt->reg_lock);
    return load_no;
}

uint64_t khub__plugin_hold(khub_runtime *rt, const khub_plugin *cp, uint64_t load_no, uint64_t mark)
{
    uint64_t held = 0;
    pthread_rwlock_wrlock(&rt->reg_lock);
    size_t slot = find_load(rt, cp, load_no);
    if (slot != SIZE_MAX) {
        khub_plugin *p = rt->plugins.items[slot];
        p->swap_holds++;
        /* loaded since the mark, and not by the caller's own load (one
         * that ran on another thread meanwhile) */
        if (p->load_no > mark && !p->by_caller) p->swap_loaded = true;
        held = p->load_no;
    }
    pthread_rwlock_unlock(&rt->reg_lock);
    return held;
}

/* Under the write lock: takes the plugin at slot out of the list when a
 * swap's prepare loaded it and nothing uses it (no prepared swap, no
 * binding, no pin of this thread's), and returns it; else NULL. The
 * caller retires it after the lock. */
static khub_plugin *take_if_unused(khub_runtime *rt, size_t slot)
{
    khub_plugin *p = rt->plugins.items[slot];
    if (!p->swap_loaded || p->swap_holds || khub__registry_bindings_of(rt, p, NULL) ||
        khub__pinned_here(p))
        return NULL;
    khub__plugin_list *l = &rt->plugins;
    memmove(l->items + slot, l->items + slot + 1, (l->count - slot - 1) * sizeof *l->items);
    l->count--;
    return p;
}

/* Retires p, taken out of the list by take_if_unused; why ends the log line. */
static void unload_taken(khub_runtime *rt, khub_plugin *p, const char *why)
{
    khub__log(rt, KHUB_LOG_INFO, "kernel swap: unloaded %s %s, %s", p->id, p->version, why);
    khub__plugin_wait_idle(p);
    khub__plugin_retire(p);
}

/* Drops a hold; then, when may_unload, unloads the plugin if unused. */
static bool drop_hold(khub_runtime *rt, const khub_plugin *cp, uint64_t load_no, bool may_unload)
{
    khub_plugin *p = NULL;
    pthread_rwlock_wrlock(&rt->reg_lock);
    size_t slot = load_no ? find_load(rt, cp, load_no) : SIZE_MAX;
    if (slot != SIZE_MAX) {
        khub_plugin *held = rt->plugins.items[slot];
        if (held->swap_holds) held->swap_holds--;
        if (may_unload) p = take_if_unused(rt, slot);
    }
    pthread_rwlock_unlock(&rt->reg_lock);
    if (!p) return false;
    unload_taken(rt, p, "loaded for a swap that did not happen");
    return true;
}

bool khub__plugin_release(khub_runtime *rt, const khub_plugin *p, uint64_t load_no)
{
    return drop_hold(rt, p, load_no, true);
}

void khub__plugin_unhold(khub_runtime *rt, const khub_plugin *p, uint64_t load_no)
{
    drop_hold(rt, p, load_no, false);
}

bool khub__plugin_swapped_out(khub_runtime *rt, const khub_plugin *cp, uint64_t load_no)
{
    khub_plugin *p = NULL;
    pthread_rwlock_wrlock(&rt->reg_lock);
    size_t slot = find_load(rt, cp, load_no);
    if (slot != SIZE_MAX) p = take_if_unused(rt, slot);
    pthread_rwlock_unlock(&rt->reg_lock);
    if (!p) return false;
    unload_taken(rt, p, "swapped out, and nothing uses it");
    return true;
}

void khub__registry_teardown(khub_runtime *rt)
{
    if (!rt) return;
    for (size_t i = rt->plugins.count; i-- > 0;) {
        khub__plugin_wait_idle(rt->plugins.items[i]);
        khub__plugin_retire(rt->plugins.items[i]);
    }
    khub__free(rt, rt->plugins.items, rt->plugins.cap * sizeof *rt->plugins.items);
    rt->plugins = (khub__plugin_list){0};
    khub__bindings_free(rt);
    khub__runtime_host_free(rt);
}

/* ======================================================================== */
/* The end of a stream                                                      */
/* ======================================================================== */

/* Under the read lock, so that no plugin is retired during its call (reload
 * and unload take the write lock before they retire one); the calls are
 * short (a cuMemFree each) and take no registry lock themselves. */
void khub__plugins_stream_end(khub_runtime *rt, void *stream)
{
    if (!rt || !stream) return;
    pthread_rwlock_rdlock(&rt->reg_lock);
    for (size_t i = 0; i < rt->plugins.count; i++) {
        khub_plugin *p = rt->plugins.items[i];
        if (!p->desc.stream_end) continue;
        khub__plugin_msg_clear();
        atomic_fetch_add(&p->inflight, 1);
        p->desc.stream_end(p->desc.state, stream);
        atomic_fetch_sub(&p->inflight, 1);
        if (khub__plugin_msg()[0])
            khub__log(rt, KHUB_LOG_WARN, "plugin %s %s: at the end of stream %p: %s", p->id,
                      p->version, stream, khub__plugin_msg());
    }
    pthread_rwlock_unlock(&rt->reg_lock);
}

/* ======================================================================== */
/* Accessors                                                                */
/* ======================================================================== */

size_t khub_plugin_count(const khub_runtime *rt)
{
    if (!rt) return 0;
    khub_runtime *w = (khub_runtime *)rt; /* the lock is not part of rt's value */
    pthread_rwlock_rdlock(&w->reg_lock);
    size_t n = rt->plugins.count;
    pthread_rwlock_unlock(&w->reg_lock);
    return n;
}

const khub_plugin *khub_plugin_at(const khub_runtime *rt, size_t i)
{
    if (!rt) return NULL;
    khub_runtime *w = (khub_runtime *)rt;
    pthread_rwlock_rdlock(&w->reg_lock);
    const khub_plugin *p = i < rt->plugins.count ? rt->plugins.items[i] : NULL;
    pthread_rwlock_unlock(&w->reg_lock);
    return p;
}

const char *khub_plugin_id(const khub_plugin *p) { return p ? p->id : NULL; }
const char *khub_plugin_version(const khub_plugin *p) { return p ? p->version : NULL; }
const char *khub_plugin_path(const khub_plugin *p) { return p ? p->path : NULL; }
const char *khub_plugin_sha256(const khub_plugin *p) { return p ? p->sha256 : NULL; }
uint32_t khub_plugin_op_count(const khub_plugin *p) { return p ? p->n_ops : 0; }

void khub_plugin_abi(const khub_plugin *p, uint16_t *major, uint16_t *minor)
{
    if (major) *major = p ? p->abi_major : 0;
    if (minor) *minor = p ? p->abi_minor : 0;
}

const khub_op_desc *khub_plugin_op(const khub_plugin *p, uint32_t i)
{
    return p && i < p->n_ops ? &p->ops[i] : NULL;
}

khub_status khub_plugin_selftest(khub_plugin *p, char *errbuf, size_t errbuf_size)
{
    KHUB_API_CHECK(NULL, p != NULL);
    khub__clear(p->rt);
    khub__errbuf(errbuf, errbuf_size, "%s", "");
    if (!p->desc.selftest) return KHUB_STATUS_OK;
    char buf[KHUB_ERROR_SIZE] = "";
    khub__plugin_msg_clear();
    atomic_fetch_add(&p->inflight, 1);
    khub_status st = p->desc.selftest(p->desc.state, buf, sizeof buf);
    atomic_fetch_sub(&p->inflight, 1);
    buf[sizeof buf - 1] = '\0';
    if (st == KHUB_STATUS_OK) return st;
    const char *why = buf[0] ? buf : khub__plugin_msg()[0] ? khub__plugin_msg() : "(no message)";
    khub__fail(p->rt, st, "plugin %s %s: selftest failed with %s: %s", p->id, p->version,
               khub_status_name(st), why);
    khub__copy_error(p->rt, errbuf, errbuf_size);
    return st;
}
