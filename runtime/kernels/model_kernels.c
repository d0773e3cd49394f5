/*
 * model_kernels.c: loading a model with kernels named by Hub ID, the C
 * equivalent of from_pretrained(..., attn_implementation="org/name").
 *
 * This sits above the executor on purpose (DESIGN.md: the executor never
 * knows where a kernel came from): each role's name is resolved here, the
 * kernel is fetched, verified and loaded through khub_kernel_fetch, and the
 * executor only receives the loaded plugin's id ("org/name" or
 * "org/name:op") in khub_model_opts.
 *
 * Where a role's name comes from, first match wins: the caller's
 * khub_model_kernels field (the command line), then the mapping file
 * (khub.json: the caller's path, else next to the model, else in the
 * current directory). The caller's lock applies to every role; without
 * one, a khub.lock next to the mapping file pins the roles the mapping
 * names (a project's lock is used whenever its khub.json is), and names
 * from the caller are loaded unlocked. A name is one of
 *   - a built-in alias: attention "eager" or "sdpa" (khub/ref-cpu), cache
 *     "dynamic", "static", "quantized" (= "quantized-int8"), "quantized-int4":
 *     khub/ref-cpu's kv_cache, static_cache, quantized_cache,
 *     quantized_cache_int4, "paged" (paged_cache; attention by its KV
 *     layout), "sliding" (= "sliding_window", sliding_cache) and "offloaded"
 *     (offloaded_cache); a cache name may end in ",key=value,..." options
 *     for the cache's create (docs/caches.md),
 *     quantization schemes "int8", "nf4", "q8_0", "q4_0". A built-in name
 *     never touches the network; the Hub's static cache is named by its ID
 *     (kernels-community/kv-cache:static_cache);
 *   - the id of a plugin the embedder loaded itself (khub_plugin_load,
 *     _load_static, _load_builtin, khub_plugin_reload), alone or as
 *     "id:op" for one of its ops (used as is, never fetched);
 *   - a Hub ID, fetched and judged at every call, also when an earlier
 *     fetch loaded it (caller_plugin says why); for quantization
 *     "org/name:scheme" names the plugin and the scheme to quantize with.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app_struct.h"
#include "cuda.h"
#include "hub_impl.h"
#include "kernel_load.h"
#include "kernel_mapping.h"
#include "khub/khub_kernels.h"
#include "khub/khub_model.h"
#include "placement.h"
#include "runtime_impl.h"

/* khub_model_kernels has one field per role of 0.1, in the table's order,
 * later roles' fields after strict, and khub_model_opts one string per
 * role: their layouts are frozen, so the table is checked against them
 * rather than generating them. */
#define ROLES_0_1 (KHUB_KERNEL_ROLE_LINEAR + 1)
#define CHECK_FIELDS(NAME, name, flag, field) \
    _Static_assert(KHUB_KERNEL_ROLE_##NAME >= ROLES_0_1 || \
                       offsetof(khub_model_kernels, flag) == \
                           offsetof(khub_model_kernels, attn) + \
                               KHUB_KERNEL_ROLE_##NAME * sizeof(const char *), \
                   "khub_model_kernels." #flag " is not role " #NAME "'s slot"); \
    _Static_assert(KHUB_KERNEL_ROLE_##NAME < ROLES_0_1 || \
                       offsetof(khub_model_kernels, flag) > offsetof(khub_model_kernels, strict), \
                   "khub_model_kernels." #flag " of a role after 0.1 is not appended"); \
    _Static_assert(sizeof(((khub_model_opts *)0)->field) == sizeof(const char *), \
                   "khub_model_opts." #field " is not a string");
KHUB_KERNEL_ROLES(CHECK_FIELDS)
#undef CHECK_FIELDS
_Static_assert(offsetof(khub_model_kernels, mapping_path) ==
                   offsetof(khub_model_kernels, attn) + ROLES_0_1 * sizeof(const char *),
               "khub_model_kernels has a 0.1 role field the table lacks");
/* embed is the first role field after 0.1's end */
_Static_assert(sizeof(khub_model_kernels) ==
                   offsetof(khub_model_kernels, embed) +
                       (KHUB_KERNEL_ROLE__COUNT - ROLES_0_1) * sizeof(const char *),
               "khub_model_kernels has a later role field the table lacks");

#define NAME_OF(name, op) name,
static const char *const quant_schemes[] = {KHUB__BUILTIN_QUANT(NAME_OF)};
static const char *const builtin_attention[] = {KHUB__BUILTIN_ATTENTION(NAME_OF)};
#undef NAME_OF

/* Whether name is one of list[n]. */
static bool in_list(const char *name, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(name, list[i]) == 0) return true;
    return false;
}

static int is_scheme(const char *s)
{
    return in_list(s, quant_schemes, sizeof quant_schemes / sizeof quant_schemes[0]);
}

/* The built-in cache strategies (Transformers' cache_implementation names,
 * kernel_mapping.h's table) and the khub/ref-cpu op behind each ("" = the
 * plugin's default cache); NULL when name is none of them. */
static const char *builtin_cache(const char *name)
{
#define ROW(name, op) {name, op},
    static const char *const map[][2] = {KHUB__BUILTIN_CACHE(ROW)};
#undef ROW
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(name, map[i][0]) == 0) return map[i][1];
    return NULL;
}

/* The first loaded plugin called id (the one a selection by id ranks
 * first among equals), or NULL. */
static khub_plugin *loaded_plugin(khub_runtime *rt, const char *id)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++)
        if (strcmp(khub_plugin_id(khub_plugin_at(rt, i)), id) == 0)
            return (khub_plugin *)khub_plugin_at(rt, i); /* the registry's handle */
    return NULL;
}

/* The first loaded plugin called id that the embedder loaded itself
 * (khub_plugin_load, _load_static, _load_builtin, khub_plugin_reload), or
 * NULL. A plugin that an earlier fetch by Hub ID loaded is not found here:
 * naming it fetches it again, so this call's trust policy, lock and
 * quarantine marker judge it (before session 19 its id alone was taken as
 * is: a kernel loaded unsigned by opt-in, unlocked, or before its build was
 * quarantined served a later strict, locked or refused load). The fetch
 * reuses the loaded copy when the file and digest are the same
 * (kernel_load.c). */
static khub_plugin *caller_plugin(khub_runtime *rt, const char *id)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++) {
        khub_plugin *p = (khub_plugin *)khub_plugin_at(rt, i); /* the registry's handle */
        if (p->by_caller && strcmp(khub_plugin_id(p), id) == 0) return p;
    }
    return NULL;
}

/* Whether fetched plugins p and q are builds of one commit of one kernel:
 * their quarantine markers (<repo folder>/khub-quarantine/<commit>/<variant>,
 * set by every fetch) lie in one folder. */
static bool same_commit(const khub_plugin *p, const khub_plugin *q)
{
    const char *a = p->quarantine, *b = q->quarantine;
    const char *sa = a ? strrchr(a, '/') : NULL, *sb = b ? strrchr(b, '/') : NULL;
    return sa && sb && sa - a == sb - b && !strncmp(a, b, (size_t)(sa - a));
}

/* Another loaded plugin than p with p's id and other bytes that is not a
 * variant of p's commit, or NULL. A model binds a role's plugin by its id
 * (khub_model_opts), and the registry ranks plugins of one id by priority,
 * then load order: with another build of that id loaded (another commit of
 * the kernel, or another kernel's or the caller's plugin that calls itself
 * so), the role could be served by it rather than by p, the build this
 * call verified. The CPU and CUDA variants of one commit, which a model
 * placed on a GPU and one on the CPU load side by side, are left alone. */
static const khub_plugin *other_build(khub_runtime *rt, const khub_plugin *p)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++) {
        const khub_plugin *q = khub_plugin_at(rt, i);
        if (q != p && !strcmp(khub_plugin_id(q), khub_plugin_id(p)) &&
            !khub__digest_eq(khub_plugin_sha256(q), khub_plugin_sha256(p)) && !same_commit(p, q))
            return q;
    }
    return NULL;
}

/* The mapping file: the caller's, else <model dir>/khub.json, else
 * ./khub.json; NULL when none exists. */
static const char *mapping_path(const char *given, const char *model, char *buf, size_t n)
{
    struct stat sb;
    if (given) return given;
    if (stat(model, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(buf, n, "%s/khub.json", model);
    else {
        const char *slash = strrchr(model, '/');
        if (slash)
            snprintf(buf, n, "%.*s/khub.json", (int)(slash - model), model);
        else
            snprintf(buf, n, "khub.json");
    }
    if (stat(buf, &sb) == 0) return buf;
    if (stat("khub.json", &sb) == 0) return "khub.json";
    return NULL;
}

/* The khub.lock next to the mapping file mpath, or NULL when there is none. */
static const char *lock_beside(const char *mpath, char *buf, size_t n)
{
    struct stat sb;
    const char *slash = strrchr(mpath, '/');
    if (slash)
        snprintf(buf, n, "%.*s/khub.lock", (int)(slash - mpath), mpath);
    else
        snprintf(buf, n, "khub.lock");
    return stat(buf, &sb) == 0 ? buf : NULL;
}

/* Appends one line to the report. */
static void note(khub_model_kernels_report *rep, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void note(khub_model_kernels_report *rep, const char *fmt, ...)
{
    if (!rep) return;
    size_t len = strlen(rep->text);
    if (len + 2 >= sizeof rep->text) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rep->text + len, sizeof rep->text - len, fmt, ap);
    va_end(ap);
    len = strlen(rep->text);
    if (len + 1 < sizeof rep->text) rep->text[len] = '\n', rep->text[len + 1] = '\0';
}

/* The CUDA device a model is placed on: its ordinal and capability. */
typedef struct placed {
    int gpu, cc;
    bool strict_cuda; /* no CUDA variant for it is NO_VARIANT (khub__kernel_fetch_gpu) */
    bool noted;       /* the report has its device line */
} placed;

/* A role's choice for the device of a placed model (placement.h's
 * khub__device_prefs): the plugin whose CUDA op it prefers, or why it
 * stays on the CPU; both "" when the registry's best CUDA op serves it. */
typedef struct role_dev {
    char impl[256];
    char cpu_why[1024];
} role_dev;

/* The line of the variant trace about variant ("name: accept: ..."), the
 * reason only, into buf. */
static void variant_reason(const char *trace, const char *variant, char *buf, size_t n)
{
    buf[0] = '\0';
    size_t len = strlen(variant);
    for (const char *l = trace; l && *l;) {
        const char *end = strchr(l, '\n');
        size_t line = end ? (size_t)(end - l) : strlen(l);
        if (line > len + 2 && !strncmp(l, variant, len) && !strncmp(l + len, ": ", 2)) {
            snprintf(buf, n, "%.*s", (int)(line - len - 2), l + len + 2);
            return;
        }
        l = end ? end + 1 : NULL;
    }
}

/* A Hub kernel fetched for role on a placed model (pl, dev): its CUDA
 * variant for the device, whose plugin the role's device query prefers
 * (the CPU binding keeps the registry's best: impl stays empty); or, with
 * none that runs on that GPU, its CPU variant, which serves the role on
 * the CPU (impl names it; dev->cpu_why says why). */
static khub_status fetch_placed(khub_hub *hub, khub_runtime *rt, const char *rname, const char *id,
                                const khub_kernel_opts *ko, placed *pl, char *impl, size_t n,
                                role_dev *dev, khub_model_kernels_report *rep,
                                khub_kernel_result *kr)
{
    char cpu_why[640]; /* with the words below, fits dev->cpu_why */
    if (!pl->noted)
        note(rep, "device: cuda:%d (sm_%d): Hub kernels load their CUDA variant for it", pl->gpu,
             pl->cc);
    pl->noted = true;
    khub_status st = khub__kernel_fetch_gpu(hub, rt, id, ko, pl->gpu, pl->strict_cuda, kr, cpu_why,
                                            sizeof cpu_why);
    if (st != KHUB_STATUS_OK || kr->fell_back) return st;
    char loaded[256], why[300];
    snprintf(loaded, sizeof loaded, "%s%s%s", kr->plugin_id, kr->op_name[0] ? ":" : "",
             kr->op_name);
    variant_reason(kr->trace, kr->variant, why, sizeof why);
    if (!cpu_why[0]) {
        snprintf(dev->impl, sizeof dev->impl, "%s", loaded);
        note(rep, "%s: %s -> %s commit %.12s variant %s for cuda:%d (%s) file %s%s; %s", rname, id,
             kr->plugin_id, kr->commit, kr->variant, pl->gpu, why, kr->file,
             kr->locked ? " (locked, hashes re-checked)" : "", kr->trust);
        return KHUB_STATUS_OK;
    }
    snprintf(impl, n, "%s", loaded);
    snprintf(dev->cpu_why, sizeof dev->cpu_why, "%s; its CPU variant %s serves %s on the CPU",
             cpu_why, kr->variant, rname);
    note(rep, "%s: %s -> %s commit %.12s variant %s on the CPU (%s) file %s%s; %s", rname, id,
         kr->plugin_id, kr->commit, kr->variant, cpu_why, kr->file,
         kr->locked ? " (locked, hashes re-checked)" : "", kr->trust);
    return KHUB_STATUS_OK;
}

/* Resolves one role's name into impl (the string for khub_model_opts), or
 * leaves impl empty for "no preference". For quantization, scheme receives
 * a scheme named as ":scheme" or alone. pl (NULL = the CPU): the model is
 * placed on that CUDA device, and a Hub ID is fetched for it
 * (fetch_placed, into dev); quantization is always fetched for the CPU,
 * where quantize-at-load runs. */
static khub_status resolve_name(khub_hub *hub, khub_runtime *rt, khub_role role, const char *name,
                                const khub_model_kernels *k, const char *lock, char *impl, size_t n,
                                char *scheme, size_t scheme_n, khub_model_kernels_report *rep,
                                khub_plugin **plugin, placed *pl, role_dev *dev)
{
    impl[0] = '\0';
    if (plugin) *plugin = NULL;
    if (!name || !name[0]) return KHUB_STATUS_OK;
    const char *rname = khub__role_name(role);
    if (role == KHUB_ROLE_ATTENTION &&
        in_list(name, builtin_attention, sizeof builtin_attention / sizeof builtin_attention[0])) {
        snprintf(impl, n, "khub/ref-cpu");
        note(rep, "%s: %s = khub/ref-cpu (built-in)", rname, name);
        if (plugin) *plugin = loaded_plugin(rt, impl);
        return KHUB_STATUS_OK;
    }
    char id[512];
    snprintf(id, sizeof id, "%s", name);
    const char *cache_op = role == KHUB_ROLE_CACHE ? builtin_cache(id) : NULL;
    if (cache_op) {
        snprintf(impl, n, "khub/ref-cpu%s%s", cache_op[0] ? ":" : "", cache_op);
        note(rep, "%s: %s = %s (built-in)", rname, id, impl);
        return KHUB_STATUS_OK;
    }
    if (role == KHUB_ROLE_QUANT) {
        if (is_scheme(id)) {
            snprintf(scheme, scheme_n, "%s", id);
            note(rep, "%s: scheme %s (built-in quantizers)", rname, id);
            return KHUB_STATUS_OK;
        }
        char *colon = strrchr(id, ':');
        if (colon && is_scheme(colon + 1)) {
            snprintf(scheme, scheme_n, "%s", colon + 1);
            *colon = '\0';
        }
    }
    khub_plugin *own = caller_plugin(rt, id);
    if (!strchr(id, '/') && !own) {
        const char *names = khub__builtin_names(role); /* khub.json's list too */
        char what[256];
        if (names)
            snprintf(what, sizeof what, " nor a built-in name (%s)", names);
        else
            snprintf(what, sizeof what, "; %s has no built-in names", rname);
        return khub__fail(rt, KHUB_STATUS_BAD_ID,
                          "%s kernel \"%s\": not a Hub ID (" KHUB__HUB_ID_FORM ")%s", rname, id,
                          what);
    }
    if (own) {
        snprintf(impl, n, "%s", id);
        note(rep, "%s: %s (loaded plugin)", rname, id);
        if (plugin) *plugin = own;
        return KHUB_STATUS_OK;
    }
    /* "id:op" with id a loaded plugin (no @REV): that plugin's op, as is;
     * the executor refuses an op the plugin does not have. */
    char *op = strchr(id, ':');
    if (op && !strchr(id, '@')) {
        *op = '\0';
        khub_plugin *p = caller_plugin(rt, id);
        *op = ':';
        if (p) {
            snprintf(impl, n, "%s", id);
            note(rep, "%s: %s (op %s of the loaded plugin)", rname, id, op + 1);
            if (plugin) *plugin = p;
            return KHUB_STATUS_OK;
        }
    }
    khub_kernel_opts ko = {KHUB_STRUCT_INIT(khub_kernel_opts), .policy_path = k->policy_path,
                           .lock_path = lock, .allow_unsigned = k->allow_unsigned,
                           .strict = k->strict};
    khub_kernel_result kr = {KHUB_STRUCT_INIT(khub_kernel_result)};
    /* A model on the CPU: a CUDA variant would serve nothing. */
    bool on_dev = pl && dev && role != KHUB_ROLE_QUANT;
    uint64_t mark = khub__plugin_load_mark(rt);
    khub_status st = on_dev ? fetch_placed(hub, rt, rname, id, &ko, pl, impl, n, dev, rep, &kr)
                            : khub__kernel_fetch_cpu(hub, rt, id, &ko, &kr);
    if (st != KHUB_STATUS_OK) {
        char msg[KHUB_ERROR_SIZE];
        snprintf(msg, sizeof msg, "%s", khub_runtime_errmsg(rt));
        khub__clear(rt);
        return khub__fail(rt, st, "%s kernel %s: %s", rname, id, msg);
    }
    if (kr.fell_back) {
        khub__log(rt, KHUB_LOG_WARN,
                  "%s kernel %s: no variant fits this machine; the reference plugin serves "
                  "%s instead. Variant trace: %s",
                  rname, id, rname, kr.trace);
        note(rep, "%s: %s -> fell back to khub/ref-cpu (no variant fits)\n%s", rname, id, kr.trace);
        snprintf(impl, n, "khub/ref-cpu");
        if (plugin) *plugin = loaded_plugin(rt, impl);
        if (on_dev)
            snprintf(dev->cpu_why, sizeof dev->cpu_why,
                     "%s has no variant for this machine; khub/ref-cpu serves %s on the CPU", id,
                     rname);
        return KHUB_STATUS_OK;
    }
    /* A model load binds by id (a swap binds kr.plugin itself) */
    const khub_plugin *other = !plugin && kr.plugin ? other_build(rt, kr.plugin) : NULL;
    if (other) {
        /* what this fetch loaded goes again (held and released as a swap's
         * prepare would: unloaded when it was loaded after mark, unused) */
        char msg[KHUB_ERROR_SIZE];
        snprintf(msg, sizeof msg,
                 "%s kernel %s: %s@%.12s variant %s is plugin %s, and another build of "
                 "%s is loaded in this runtime (%s, SHA-256 %.12s); a model binds a "
                 "plugin by its id, so %s could be served by that build instead of the "
                 "one verified now: unload it, or load the model in another runtime",
                 rname, id, kr.repo, kr.commit, kr.variant, khub_plugin_id(kr.plugin),
                 khub_plugin_id(other), khub_plugin_path(other), khub_plugin_sha256(other), rname);
        uint64_t load = khub__plugin_hold(rt, kr.plugin, 0, mark);
        if (load) khub__plugin_release(rt, kr.plugin, load);
        return khub__fail(rt, KHUB_STATUS_EXISTS, "%s", msg);
    }
    if (plugin) *plugin = kr.plugin;
    if (on_dev) return KHUB_STATUS_OK; /* fetch_placed set impl or dev and noted it */
    if (kr.op_name[0])
        snprintf(impl, n, "%s:%s", kr.plugin_id, kr.op_name);
    else
        snprintf(impl, n, "%s", kr.plugin_id);
    note(rep, "%s: %s -> %s commit %.12s variant %s file %s%s; %s", rname, id, kr.plugin_id,
         kr.commit, kr.variant, kr.file, kr.locked ? " (locked, hashes re-checked)" : "", kr.trust);
    return KHUB_STATUS_OK;
}

/* resolve_name, and for the cache role a name may end in the strategy's
 * options, "NAME,key=value,...": they travel after the resolved name (the
 * executor hands them to the cache's create, abi/ABI.md 1.4). */
static khub_status resolve(khub_hub *hub, khub_runtime *rt, khub_role role, const char *name,
                           const khub_model_kernels *k, const char *lock, char *impl, size_t n,
                           char *scheme, size_t scheme_n, khub_model_kernels_report *rep,
                           placed *pl, role_dev *dev)
{
    const char *comma = role == KHUB_ROLE_CACHE && name ? strchr(name, ',') : NULL;
    if (!comma)
        return resolve_name(hub, rt, role, name, k, lock, impl, n, scheme, scheme_n, rep, NULL, pl,
                            dev);
    char base[512];
    snprintf(base, sizeof base, "%.*s", (int)(comma - name), name);
    khub_status st =
        resolve_name(hub, rt, role, base, k, lock, impl, n, scheme, scheme_n, rep, NULL, pl, dev);
    if (st != KHUB_STATUS_OK) return st;
    size_t len = strlen(impl);
    if (!comma[1] || len + strlen(comma) + 1 > n)
        return khub__fail(rt, KHUB_STATUS_INVALID_ARG,
                          "cache kernel \"%s\": options after the comma are %s (want "
                          "NAME,key=value[,key=value], at most %zu characters in all)",
                          name, comma[1] ? "too long" : "empty", n - 1);
    snprintf(impl + len, n - len, "%s", comma);
    note(rep, "cache: options %s", comma + 1);
    return KHUB_STATUS_OK;
}

khub_status khub__kernel_resolve_role(khub_hub *hub, khub_runtime *rt, khub_kernel_role role,
                                      const char *name, const khub_model_kernels *k,
                                      const khub__kernel_target *target, char *impl, size_t n,
                                      khub_plugin **plugin, khub_model_kernels_report *rep)
{
    char scheme[16] = "";
    placed pl = {0};
    role_dev dev;
    memset(&dev, 0, sizeof dev);
    if (target) pl = (placed){target->gpu, target->cc, target->strict_cuda, false};
    khub_status st = resolve_name(hub, rt, (khub_role)role, name, k, k->lock_path, impl, n, scheme,
                                  sizeof scheme, rep, plugin, target ? &pl : NULL, &dev);
    /* a CUDA variant's plugin is the device query's preference (dev.impl) */
    if (st == KHUB_STATUS_OK && dev.impl[0]) snprintf(impl, n, "%s", dev.impl);
    return st;
}

/* The CUDA device base places the model on, with its capability (the
 * mapping's capability ranges and the variants are judged against it);
 * false for the CPU, or when the driver does not report that device:
 * khub_model_load then refuses it with its own message. */
static bool placed_device(const khub_model_opts *base, placed *pl)
{
    if (!base || base->struct_size < offsetof(khub_model_opts, device) + sizeof base->device ||
        base->device.device_type != KHUB_DEVICE_CUDA)
        return false;
    int driver = 0, n = 0, cc[16];
    pl->gpu = base->device.device_id;
    if (khub__cuda_probe(&driver, cc, 16, &n) != KHUB_STATUS_OK || pl->gpu < 0 || pl->gpu >= n)
        return false;
    pl->cc = cc[pl->gpu];
    return true;
}

khub_status khub_model_load_hub(khub_hub *hub, khub_runtime *rt, const char *path,
                                const khub_model_opts *base, const khub_model_kernels *k,
                                khub_model **out, khub_model_kernels_report *rep)
{
    KHUB_API_CHECK(rt, hub && rt && path && out);
    khub__clear(rt);
    *out = NULL;
    if (rep) rep->text[0] = '\0';
    /* The caller's fields up to its struct_size (a 0.1 caller's has no
     * embed); the rest stay NULL. */
    khub_model_kernels own = {KHUB_STRUCT_INIT(khub_model_kernels)};
    if (base) KHUB__APP_CHECK(rt, base, KHUB__MODEL_OPTS_0_1, "khub_model_load_hub", "base");
    if (k) {
        KHUB__APP_CHECK(rt, k, offsetof(khub_model_kernels, embed), "khub_model_load_hub",
                        "kernels");
        khub__app_copy_in(&own, sizeof own, k);
    }
    k = &own;
    const char *given[KHUB_ROLE__COUNT] = {
#define GIVEN(NAME, name, flag, field) [KHUB_ROLE_##NAME] = k->flag,
        KHUB_KERNEL_ROLES(GIVEN)
#undef GIVEN
    };
    char mbuf[KHUB__PATH_MAX], err[KHUB_ERROR_SIZE];
    const char *mpath = mapping_path(k->mapping_path, path, mbuf, sizeof mbuf);
    khub_mapping *map = NULL;
    char lbuf[KHUB__PATH_MAX];
    const char *map_lock = k->lock_path;
    if (mpath) {
        khub_status st = khub__mapping_load(mpath, &map, err, sizeof err);
        if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", err);
        note(rep, "mapping: %s", mpath);
        if (!map_lock && (map_lock = lock_beside(mpath, lbuf, sizeof lbuf)) != NULL)
            note(rep, "lock: %s (next to the mapping; pins the roles it names)", map_lock);
    }
    char impl[KHUB_ROLE__COUNT][256];
    char scheme[16] = "", quant[300];
    placed pl = {.strict_cuda = k->strict != 0};
    bool on_dev = placed_device(base, &pl);
    role_dev dev[KHUB_ROLE__COUNT];
    memset(dev, 0, sizeof dev);
    khub_status st = KHUB_STATUS_OK;
    for (int r = 0; r < KHUB_ROLE__COUNT && st == KHUB_STATUS_OK; r++) {
        const char *name = given[r], *lock = k->lock_path;
        bool rule_dev = on_dev; /* a cpu-only rule names the role's CPU kernel only */
        if (!name && map) {
            const khub_map_rule *rule =
                on_dev ? khub__mapping_pick(map, (khub_role)r, KHUB_DEVICE_CUDA, pl.cc) : NULL;
            if (!rule) {
                rule = khub__mapping_pick(map, (khub_role)r, KHUB_DEVICE_CPU, 0);
                rule_dev = false;
            }
            if (rule) name = rule->text, lock = map_lock;
        }
        st = resolve(hub, rt, (khub_role)r, name, k, lock, impl[r], sizeof impl[r], scheme,
                     sizeof scheme, rep, rule_dev ? &pl : NULL, &dev[r]);
    }
    free(map);
    khub__device_prefs dp;
    memset(&dp, 0, sizeof dp);
    for (int r = 0; r < KHUB_ROLE__COUNT; r++) {
        if (dev[r].impl[0]) dp.impl[r] = dev[r].impl;
        if (dev[r].cpu_why[0]) dp.cpu_why[r] = dev[r].cpu_why;
    }
    if (st != KHUB_STATUS_OK) return st;
    /* The caller's options up to its struct_size (checked above), the rest
     * zero; the fields set below are read whatever it was. */
    khub_model_opts o = {KHUB_STRUCT_INIT(khub_model_opts)};
    if (base) {
        khub__app_copy_in(&o, sizeof o, base);
        o.struct_size = (uint32_t)sizeof o;
    }
    /* Each role's loaded plugin into its option field; quantization joins
     * its plugin and scheme below. */
#define SET(NAME, name, flag, field) \
    if (KHUB_ROLE_##NAME != KHUB_ROLE_QUANT && impl[KHUB_ROLE_##NAME][0]) \
        o.field = impl[KHUB_ROLE_##NAME];
    KHUB_KERNEL_ROLES(SET)
#undef SET
    if (impl[KHUB_ROLE_QUANT][0] || scheme[0]) {
        if (impl[KHUB_ROLE_QUANT][0] && scheme[0])
            snprintf(quant, sizeof quant, "%s:%s", impl[KHUB_ROLE_QUANT], scheme);
        else
            snprintf(quant, sizeof quant, "%s", scheme[0] ? scheme : impl[KHUB_ROLE_QUANT]);
        o.quant = quant;
    }
    if (k->strict) o.strict = 1;
    return khub__model_load_placed(rt, path, &o, on_dev ? &dp : NULL, out);
}
