/*
 * kernel_swap.c: a role's kernel swapped in a loaded model (issue 16 item
 * 4): khub_kernel_swap_prepare resolves, fetches, verifies, loads and
 * self-tests the new kernel; khub_model_kernel_swap switches the model's
 * bindings of the role to it (runtime/executor/model_rebind.c).
 *
 * Prepare never falls back: at model load a kernel with no variant for
 * this machine gives way to the reference plugin with a warning, but an
 * operator who asks a running server for a kernel wants that kernel or a
 * refusal. Its failure message is left on the calling thread
 * (khub_last_error) as well as on the runtime, because a server prepares on
 * one thread while its engine thread uses the same runtime.
 *
 * A model placed on a CUDA device (issue 19): khub_model_kernel_swap_prepare
 * knows the model, and for a role that runs on the device it resolves a Hub
 * ID through the load's own path (khub__kernel_resolve_role with the
 * device: model_kernels.c's fetch_placed, kernel_load.c's variant choice
 * for that GPU, then the same digest, trust, lock and quarantine checks).
 * Without a CUDA variant for the GPU, strict refuses it there (the load's
 * NO_VARIANT); else its CPU variant is loaded as the load would, and the
 * switch refuses it (NO_KERNEL, nothing changed): a swap never moves a
 * role off the device.
 *
 * The prepared plugin (sw->plugin) is borrowed. While a swap holds it
 * (below), khub_plugin_unload and khub_plugin_reload of it answer BUSY, so
 * it stays readable until the switch. A swap that holds nothing can find
 * it gone: released unswitched (khub_kernel_swap_release), a 0.1 struct,
 * or one filled by hand, whose plugin the caller unloaded or reloaded, or
 * another swap's failure or switch unloaded. So the switch first holds
 * sw->plugin in the same step that checks it is still loaded in the
 * model's runtime as the same load (sw->plugin_load, the runtime's number
 * for it, never reused: a plugin loaded later at the freed address is
 * another load), refuses a stale one with MISUSE without touching it, and
 * keeps that hold until it returns: an unload on another thread during
 * the switch answers BUSY instead of freeing the plugin the switch reads.
 * A khub_kernel_swap filled by hand (plugin_load 0) is checked by address.
 * A 0.1 struct has no plugin_load: its prepare writes a 32-bit tag of the
 * load's number in the struct's 0.1 `reserved` slot instead (since session
 * 16), and its switch holds the plugin at sw->plugin only when that load's
 * tag matches, so that a plugin loaded later at the address of one that
 * was unloaded meanwhile (by the caller, or by another swap's release or
 * switch, since a 0.1 swap holds nothing between its prepare and its
 * switch) is refused as stale (MISUSE) instead of being switched in. A 0.1
 * struct filled by hand (reserved 0) is checked by address. Rejected: a
 * 0.1 prepare that holds its plugin until the switch (a 0.1 caller has no
 * khub_kernel_swap_release, so a swap it abandons would keep the plugin
 * BUSY for good), and a table of 0.1 swaps in the runtime (unbounded, or
 * forgetting, and a struct may be copied).
 * The prepare holds the plugin from its resolve on, so the selftest too
 * runs on a plugin no other thread can unload.
 *
 * Ownership of what a prepare loads: a prepared swap holds its plugin
 * (counted on the plugin) until khub_model_kernel_swap or
 * khub_kernel_swap_release ends it, or a prepare into the same struct
 * replaces it. When the hold ends, a plugin that a prepare loaded (it was
 * not loaded before) is unloaded if nothing else uses it: no binding of any
 * model (a switch that succeeded made some) and no other prepared swap. So a
 * refused switch, a selftest that fails, or a server that prepared and could
 * not switch leaves the runtime's plugins as they were, and a plugin the
 * caller loaded itself, or that was loaded before, is never unloaded here.
 * The same holds after a switch that succeeded: the plugin that served
 * before is unloaded as the switch drops its last binding
 * (model_rebind.c), when a swap's prepare loaded it and nothing else uses
 * it, so swaps back and forth between two Hub kernels keep the runtime's
 * plugin count constant.
 * Rejected: unloading in the prepare's refusal alone (a non-strict prepare
 * for a placed model succeeds with a CPU variant that only the switch can
 * refuse), and unloading without counting the holds (a second prepared swap
 * of the same kernel would dangle).
 */
#include <stdio.h>
#include <string.h>

#include "app_struct.h"
#include "executor.h"
#include "kernel_load.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "placement.h"
#include "runtime_impl.h"

/* 0.1's khub_kernel_swap ended with now_serving; prepare and switch accept
 * any size from there (the fields after it are read and written only when
 * the caller's struct_size covers them). */
#define SWAP_0_1 KHUB__SIZE_TO(khub_kernel_swap, now_serving)

/* Whether role can be swapped while the model runs (model_rebind.c decides
 * the same; checked here first so that nothing is fetched in vain). */
static int swappable(khub_kernel_role role)
{
    return role == KHUB_KERNEL_ROLE_ATTENTION || role == KHUB_KERNEL_ROLE_NORM ||
           role == KHUB_KERNEL_ROLE_ACTIVATION || role == KHUB_KERNEL_ROLE_ROTARY;
}

/* The resolution line of role in rep (the last line that names it). */
static void copy_line(const khub_model_kernels_report *rep, char *out, size_t n)
{
    const char *t = rep->text;
    size_t len = strlen(t);
    while (len && t[len - 1] == '\n') len--;
    const char *start = t + len;
    while (start > t && start[-1] != '\n') start--;
    snprintf(out, n, "%.*s", (int)(t + len - start), start);
}

/* Whether sw has 0.2's hold fields (plugin_load, held). */
static bool has_hold(const khub_kernel_swap *sw)
{
    return sw->struct_size >= offsetof(khub_kernel_swap, reserved2) + sizeof sw->reserved2;
}

/* What a 0.1 struct's prepare writes in its `reserved` slot: a tag of the
 * load's number (never 0, which means "filled by hand: by address"), so
 * that its switch refuses another load at the same address. */
static uint32_t load_tag(uint64_t load) { return (uint32_t)(load % UINT32_MAX) + 1; }

/* Ends sw's hold on its plugin, if it has one (see the top of this file). */
static void release(khub_runtime *rt, khub_kernel_swap *sw)
{
    if (!has_hold(sw) || !sw->held) return;
    sw->held = 0;
    khub__plugin_release(rt, sw->plugin, sw->plugin_load);
}

void khub_kernel_swap_release(khub_runtime *rt, khub_kernel_swap *sw)
{
    if (rt && sw) release(rt, sw);
}

/* khub_kernel_swap_prepare for a role that runs where target says (NULL:
 * the CPU). */
static khub_status prepare(khub_hub *hub, khub_runtime *rt, khub_kernel_role role, const char *name,
                           const khub_model_kernels *policy, const khub__kernel_target *target,
                           khub_kernel_swap *out)
{
    khub__clear(rt);
    KHUB__APP_CHECK(rt, out, SWAP_0_1, "khub_kernel_swap_prepare", "out");
    const uint32_t size = out->struct_size;
    release(rt, out);                  /* a prepare into a struct that held another plugin */
    khub__app_clear(out, sizeof *out); /* the caller's header kept (ABI.md rule 5) */
    out->role = (int32_t)role;
    KHUB_RETURN_IF(rt, (int)role < 0 || role >= KHUB_KERNEL_ROLE__COUNT, KHUB_STATUS_INVALID_ARG,
                   "kernel swap: role %d is not a kernel role", (int)role);
    const char *rname = khub_kernel_role_name(role);
    KHUB_RETURN_IF(rt, !swappable(role), KHUB_STATUS_UNSUPPORTED,
                   "kernel swap: the %s kernel cannot be swapped in a running model (%s); load "
                   "the model again with it",
                   rname,
                   role == KHUB_KERNEL_ROLE_CACHE
                       ? "the KV cache holds the running sequences in its plugin's own format"
                       : "the weights were laid out for their op at load");
    KHUB_RETURN_IF(rt, !name[0], KHUB_STATUS_INVALID_ARG,
                   "kernel swap: the %s kernel's name is "
                   "empty (want a Hub ID " KHUB__HUB_ID_FORM " or a loaded plugin's id)",
                   rname);
    khub_model_kernels k = {KHUB_STRUCT_INIT(khub_model_kernels)};
    if (policy) {
        k.lock_path = policy->lock_path;
        k.policy_path = policy->policy_path;
        k.allow_unsigned = policy->allow_unsigned;
    }
    k.strict = 1; /* no fallback to the reference plugin */
    khub_model_kernels_report rep;
    rep.text[0] = '\0';
    char impl[256];
    khub_plugin *p = NULL;
    uint64_t mark = khub__plugin_load_mark(rt);
    khub_status st =
        khub__kernel_resolve_role(hub, rt, role, name, &k, target, impl, sizeof impl, &p, &rep);
    if (st == KHUB_STATUS_OK && !p)
        st = khub__fail(rt, KHUB_STATUS_NOT_FOUND,
                        "%s kernel %s: resolved to %s, which is not "
                        "loaded",
                        rname, name, impl);
    if (st != KHUB_STATUS_OK) {
        char why[KHUB_ERROR_SIZE];
        khub__copy_error(rt, why, sizeof why);
        khub__clear(rt);
        return khub__fail(rt, st, "%s", why); /* also this thread's khub_last_error */
    }
    /* Held from here, so that no unload or reload on another thread frees
     * it under the selftest (it answers BUSY); the hold fails only when one
     * came between the load and this line. */
    uint64_t load = khub__plugin_hold(rt, p, 0, mark);
    KHUB_RETURN_IF(rt, !load, KHUB_STATUS_BUSY,
                   "%s kernel %s: %s was unloaded while it was being prepared (another thread); "
                   "nothing changed",
                   rname, name, impl);
    const char *colon = strchr(impl, ':');
    snprintf(out->op_name, sizeof out->op_name, "%s", colon ? colon + 1 : "");
    copy_line(&rep, out->resolved, sizeof out->resolved);
    char err[KHUB_ERROR_SIZE] = "";
    st = khub_plugin_selftest(p, err, sizeof err);
    if (st != KHUB_STATUS_OK) {
        khub__plugin_release(rt, p, load); /* unloaded when the prepare loaded it, unused */
        khub__clear(rt);
        return khub__fail(rt, st, "%s kernel %s: %s; refusing it, the old kernel keeps serving",
                          rname, name, err);
    }
    snprintf(out->selftest, sizeof out->selftest, "%s", p->desc.selftest ? "passed" : "none");
    if (size >= offsetof(khub_kernel_swap, name) + sizeof out->name)
        snprintf(out->name, sizeof out->name, "%s", name);
    out->plugin = p;
    if (has_hold(out)) {
        out->plugin_load = load;
        out->held = 1;
    } else {
        out->reserved = load_tag(load);   /* its switch checks the load by this */
        khub__plugin_unhold(rt, p, load); /* a 0.1 swap holds nothing */
    }
    return KHUB_STATUS_OK;
}

khub_status khub_kernel_swap_prepare(khub_hub *hub, khub_runtime *rt, khub_kernel_role role,
                                     const char *name, const khub_model_kernels *policy,
                                     khub_kernel_swap *out)
{
    KHUB_API_CHECK(rt, hub && rt && name && out);
    return prepare(hub, rt, role, name, policy, NULL, out);
}

/* Whether kernel role `role` of placed model m runs on the device (its
 * bindings' CUDA ops; the load fixed which side, a swap never changes it). */
static bool on_device(const khub__place *pl, int32_t role)
{
    switch (role) {
    case KHUB_KERNEL_ROLE_ATTENTION:
        return pl->cuda[KHUB__ROLE_ATTENTION] || pl->cuda[KHUB__ROLE_PAGED_ATTENTION];
    case KHUB_KERNEL_ROLE_NORM: return pl->cuda[KHUB__ROLE_NORM] != NULL;
    case KHUB_KERNEL_ROLE_ACTIVATION: return pl->cuda[KHUB__ROLE_ACT] != NULL;
    case KHUB_KERNEL_ROLE_ROTARY: return pl->cuda[KHUB__ROLE_ROTARY] != NULL;
    default: return false;
    }
}

khub_status khub_model_kernel_swap_prepare(khub_hub *hub, const khub_model *m,
                                           khub_kernel_role role, const char *name,
                                           const khub_model_kernels *policy, khub_kernel_swap *out)
{
    KHUB_API_CHECK(m ? m->rt : NULL, hub && m && name && out);
    const khub__place *pl = m->place; /* set at load, freed with m */
    khub__kernel_target t = {0};
    bool dev = false;
    if (pl) {
        khub_model *mm = (khub_model *)m; /* the lock only: a rebind writes pl->cuda[] */
        pthread_mutex_lock(&mm->bind_lock);
        dev = on_device(pl, (int32_t)role);
        pthread_mutex_unlock(&mm->bind_lock);
        t = (khub__kernel_target){pl->device, pl->cc, policy && policy->strict};
    }
    return prepare(hub, m->rt, role, name, policy, dev ? &t : NULL, out);
}

/* ======================================================================== */
/* Every rank together (tensor parallelism, issue 18 item 4)                */
/* ======================================================================== */

/* The op serving role: on a placed model the device's when the role runs
 * there (its CPU binding is then the fallback that runs nothing). */
static const khub_binding *serving(const khub_model *m, int32_t role)
{
    const khub__place *pl = m->place;
    if (pl && role == KHUB_KERNEL_ROLE_ATTENTION && on_device(pl, role))
        return pl->cuda[KHUB__ROLE_PAGED_ATTENTION] ? pl->cuda[KHUB__ROLE_PAGED_ATTENTION]
                                                    : pl->cuda[KHUB__ROLE_ATTENTION];
    khub__role r = role == KHUB_KERNEL_ROLE_NORM         ? KHUB__ROLE_NORM
                   : role == KHUB_KERNEL_ROLE_ACTIVATION ? KHUB__ROLE_ACT
                   : role == KHUB_KERNEL_ROLE_ROTARY     ? KHUB__ROLE_ROTARY
                                                         : KHUB__ROLE__COUNT;
    if (pl && r != KHUB__ROLE__COUNT && pl->cuda[r]) return pl->cuda[r];
    if (role == KHUB_KERNEL_ROLE_ATTENTION) return m->paged_attn ? m->paged_attn : m->attention;
    if (role == KHUB_KERNEL_ROLE_NORM) return m->norm;
    if (role == KHUB_KERNEL_ROLE_ACTIVATION) return m->act;
    if (role == KHUB_KERNEL_ROLE_ROTARY) return m->rotary;
    return NULL;
}

/* Two rounds on every rank: all prepared (and the same bytes), then all
 * switched; a rank whose switch failed makes the others switch back to
 * what served before, so every rank runs the same kernels after it. prep
 * is this rank's preparation (its message on m->rt when failed). */
static khub_status tp_switch(khub_model *m, int32_t role, khub_plugin *p, const char *op,
                             khub_status prep)
{
    KHUB_FORWARD_IF_ERROR(m->rt,
                          khub__tp_agree_swap(m, prep, prep == KHUB_STATUS_OK ? p->sha256 : NULL));
    const khub_binding *before = serving(m, role);
    khub_plugin *old_p = before ? before->plugin : NULL;
    char old_op[128] = "";
    if (old_p && before->op_index < old_p->n_ops)
        snprintf(old_op, sizeof old_op, "%s", old_p->ops[before->op_index].name);
    khub_status st = khub__model_rebind(m, role, p, op);
    khub_status all = khub__tp_agree_swap(m, st, NULL);
    if (all != KHUB_STATUS_OK && st == KHUB_STATUS_OK && old_p && !m->tp.broken) {
        char why[KHUB_ERROR_SIZE];
        khub__copy_error(m->rt, why, sizeof why);
        if (khub__model_rebind(m, role, old_p, old_op) != KHUB_STATUS_OK)
            KHUB_LOG_E(m->rt, "kernel swap: switching back failed: %s", khub_runtime_errmsg(m->rt));
        khub__clear(m->rt);
        khub__fail(m->rt, all, "%s", why);
    }
    return all;
}

typedef struct follow_ctx {
    khub_hub *hub;
    const khub_model_kernels *policy;
} follow_ctx;

static khub_status follow_swap(void *ud, khub_model *m, int32_t role, const char *name)
{
    follow_ctx *f = ud;
    khub_kernel_swap sw = {KHUB_APP_INIT(khub_kernel_swap)};
    khub_status st =
        khub_model_kernel_swap_prepare(f->hub, m, (khub_kernel_role)role, name, f->policy, &sw);
    khub_status all = tp_switch(m, role, sw.plugin, sw.op_name, st);
    release(m->rt, &sw); /* a switch that failed leaves nothing loaded */
    if (all == KHUB_STATUS_OK)
        KHUB_LOG_I(m->rt, "%s: tp rank %d: %s kernel swapped to %s", m->file, (int)m->tp.rank,
                   khub_kernel_role_name((khub_kernel_role)role), name);
    return all;
}

khub_status khub_model_tp_serve_kernels(khub_model *m, khub_hub *hub,
                                        const khub_model_kernels *policy)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && hub);
    follow_ctx f = {hub, policy};
    m->tp.on_swap = follow_swap;
    m->tp.on_swap_ud = &f;
    khub_status st = khub_model_tp_serve(m);
    m->tp.on_swap = NULL;
    m->tp.on_swap_ud = NULL;
    return st;
}

static khub_status switch_to(khub_model *m, khub_kernel_swap *sw);

/* Holds sw->plugin for the switch, in the step that checks it is loaded in
 * m's runtime (as the load prepared), so that no unload or reload frees it
 * while the switch reads it; refuses one that is not (or no longer) loaded
 * before anything reads it (see the top of this file). *held: the load
 * number the switch holds, for khub__plugin_release after it. */
static khub_status hold_loaded(khub_model *m, khub_kernel_swap *sw, uint64_t *held)
{
    uint64_t load = has_hold(sw) ? sw->plugin_load : 0;
    if (!has_hold(sw) && sw->reserved) {
        /* 0.1: the load at that address now, held only if it is the one
         * prepared (a hold by its exact number: one that came between the
         * two steps is another load, and not held) */
        uint64_t now = khub__plugin_load_of(m->rt, sw->plugin);
        load = now && load_tag(now) == sw->reserved ? now : UINT64_MAX;
    }
    *held = load == UINT64_MAX ? 0 : khub__plugin_hold(m->rt, sw->plugin, load, UINT64_MAX);
    if (*held) return KHUB_STATUS_OK;
    if (has_hold(sw)) sw->held = 0; /* its plugin is gone: nothing to release */
    bool named = sw->struct_size >= offsetof(khub_kernel_swap, name) + sizeof sw->name &&
                 memchr(sw->name, '\0', sizeof sw->name) && sw->name[0];
    const char *role = sw->role >= 0 && sw->role < KHUB_KERNEL_ROLE__COUNT
                           ? khub_kernel_role_name((khub_kernel_role)sw->role)
                           : "?";
    return khub__fail(m->rt, KHUB_STATUS_MISUSE,
                      "%s: kernel swap: the plugin prepared for the %s role%s%s%s is not loaded "
                      "in this model's runtime (unloaded or reloaded since it was prepared, or "
                      "another runtime's); prepare it again; nothing changed",
                      m->file, role, named ? " (" : "", named ? sw->name : "", named ? ")" : "");
}

khub_status khub_model_kernel_swap(khub_model *m, khub_kernel_swap *sw)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && sw && sw->plugin);
    khub__clear(m->rt);
    KHUB__APP_CHECK(m->rt, sw, SWAP_0_1, "khub_model_kernel_swap", "sw");
    uint64_t held = 0;
    KHUB_FORWARD_IF_ERROR(m->rt, hold_loaded(m, sw, &held));
    khub_status st = switch_to(m, sw);
    /* bound now, or unloaded when a failed switch leaves it unused */
    khub__plugin_release(m->rt, sw->plugin, held);
    release(m->rt, sw);
    return st;
}

static khub_status switch_to(khub_model *m, khub_kernel_swap *sw)
{
    /* Under tp every rank switches at the same step, or the ranks' halves
     * of a layer would come from different kernels: rank 0 (this call)
     * sends the name, and every rank prepares, agrees and switches. */
    KHUB_RETURN_IF(m->rt, m->tp.size > 1 && m->tp.rank != 0, KHUB_STATUS_MISUSE,
                   "kernel swap: %s is tp rank %d; rank 0 swaps for every rank", m->file,
                   (int)m->tp.rank);
    KHUB_RETURN_IF(m->rt,
                   m->tp.size > 1 && sw->struct_size < offsetof(khub_kernel_swap, name) + 1024,
                   KHUB_STATUS_UNSUPPORTED,
                   "kernel swap: %s runs tensor-parallel over %d ranks, and this khub_kernel_swap "
                   "(0.1, %u bytes) has no name to send to the other ranks",
                   m->file, (int)m->tp.size, (unsigned)sw->struct_size);
    const khub_binding *before = serving(m, sw->role);
    char prev[192];
    snprintf(prev, sizeof prev, "%s", before ? khub_binding_name(before) : "");
    khub_status st;
    if (m->tp.size > 1) {
        st = khub__tp_lead_swap(m, sw->role, sw->name);
        if (st == KHUB_STATUS_OK) st = tp_switch(m, sw->role, sw->plugin, sw->op_name, st);
    } else {
        st = khub__model_rebind(m, sw->role, sw->plugin, sw->op_name);
    }
    if (st != KHUB_STATUS_OK) {
        char why[KHUB_ERROR_SIZE];
        khub__copy_error(m->rt, why, sizeof why);
        khub__clear(m->rt);
        return khub__fail(m->rt, st, "%s", why);
    }
    const khub_binding *now = serving(m, sw->role);
    snprintf(sw->previous, sizeof sw->previous, "%s", prev);
    snprintf(sw->now_serving, sizeof sw->now_serving, "%s", khub_binding_name(now));
    return KHUB_STATUS_OK;
}
