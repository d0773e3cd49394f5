/*
 * kernel_fetch.c: a kernel named by Hub ID, fetched, verified and loaded
 * (khub_kernels.h), and the hub work behind `khub lock`, `khub sync` and
 * `khub outdated` (kernel_fetch.h).
 *
 * Order of checks, and why:
 *  1. The commit comes from the lock when there is one, so a moved branch
 *     cannot change what a locked project loads.
 *  2. A cached variant is compared with the lock before anything in it is
 *     read as data: the lock is the root of trust for content.
 *  3. The trust policy judges the exact bytes of metadata.json and its .sig
 *     before metadata.json is parsed here.
 *  4. Then the hub verifies every file against metadata.json, and the loader
 *     hashes the plugin's bytes once more as it seals them into a memfd.
 * One read of metadata.json is the single source of truth (issue 10 item
 * 1): the hub reads it once (khub__hub_variant_open), steps 2-3 judge those
 * bytes (a judge passed with the call, never stored on the shared handle,
 * run once), the hub parses those same bytes, checks the files against that
 * parse, and the loader checks the bytes it seals against the digests of
 * that parse. A writer to the cache who swaps metadata.json and a plugin
 * after the signature check gains nothing: no second read is ever trusted.
 * A variant that is not cached yet is downloaded first and judged where it
 * is staged, before it is published into the cache.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "contain.h"
#include "hub_impl.h"
#include "kernel_fetch.h"
#include "kernel_meta.h"
#include "plugin_artifacts.h"
#include "quarantine.h"
#include "variant_rank.h"

#define FALLBACK_PLUGIN "khub/ref-cpu"

/* ======================================================================== */
/* Policy                                                                   */
/* ======================================================================== */

static bool file_exists(const char *p) { return p && access(p, R_OK) == 0; }

khub_status khub__policy_find(const char *path, khub_trust_policy **out, char used[4096],
                              char *errbuf, size_t errbuf_size)
{
    used[0] = '\0';
    const char *env = getenv("KHUB_POLICY");
    char cfg[4096] = "";
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0])
        snprintf(cfg, sizeof cfg, "%s/khub/policy.json", xdg);
    else if (home && home[0])
        snprintf(cfg, sizeof cfg, "%s/.config/khub/policy.json", home);
    const char *pick = path && path[0] ? path : env && env[0] ? env : file_exists(cfg) ? cfg : NULL;
    if (!pick) return khub__trust_policy_default(out);
    snprintf(used, 4096, "%s", pick);
    char why[KHUB_ERROR_SIZE] = "";
    khub_status st = khub__trust_policy_load(pick, out, why, sizeof why);
    if (st != KHUB_STATUS_OK) khub__errbuf(errbuf, errbuf_size, "trust policy %s: %s", pick, why);
    return st;
}

/* ======================================================================== */
/* Small helpers                                                            */
/* ======================================================================== */

static void format_trace(const khub_hub_variant_list *vl, char *buf, size_t size)
{
    buf[0] = '\0';
    size_t len = 0;
    for (size_t i = 0; vl && i < vl->count && len + 1 < size; i++) {
        int w = snprintf(buf + len, size - len, "%s%s: %s", len ? "\n" : "", vl->items[i].name,
                         vl->items[i].reason);
        if (w < 0) break;
        len += (size_t)w < size - len ? (size_t)w : size - len - 1;
    }
    if (!vl || vl->count == 0) snprintf(buf, size, "(no build/ variants at this commit)");
}

/* A khub-family variant name: "khub<digits>-...". Others (torch*, tvm-ffi*)
 * are never locked: khub cannot load them. */
static bool khub_family(const char *name)
{
    return strncmp(name, "khub", 4) == 0 && name[4] >= '0' && name[4] <= '9';
}

/* ======================================================================== */
/* Ranking locked names without the network                                 */
/* ======================================================================== */

khub_status khub__kernel_rank_locked(const khub_hub_id *id, const khub_lock_entry *e,
                                     khub_hub_variant_list **out)
{
    (void)id;
    *out = NULL;
    khub__rank_host h;
    khub__rank_host_detect(&h);
    khub__rank_input in[KHUB_LOCK_MAX_VARIANTS];
    const char *files[KHUB_LOCK_MAX_VARIANTS][KHUB_LOCK_MAX_FILES];
    size_t n = 0;
    for (size_t i = 0; i < e->n_variants && n < KHUB_LOCK_MAX_VARIANTS; i++) {
        const khub_lock_variant *v = &e->variants[i];
        /* The names a cached variant folder could have (what the listing
         * of the cache sees), and for the judge the locked file names: it
         * matches a CUDA variant's sm_XY PTX and cubin names against this
         * host's GPUs. */
        if (!khub__path_is_safe(v->name) || strchr(v->name, '/') || strchr(v->name, '.')) continue;
        in[n] = (khub__rank_input){v->name, files[n], 0};
        for (size_t j = 0; j < v->n_files && in[n].n_files < KHUB_LOCK_MAX_FILES; j++) {
            const char *nm = v->files[j].name;
            if (khub__path_is_safe(nm) && !strchr(nm, '/') && nm[0] != '.')
                files[n][in[n].n_files++] = nm;
        }
        n++;
    }
    khub_status st = khub__rank_variants(in, n, &h, out);
    if (st != KHUB_STATUS_OK)
        khub__fail(NULL, st, "ranking locked variants: %s", khub_last_error());
    return st;
}

/* ======================================================================== */
/* khub_kernel_fetch                                                        */
/* ======================================================================== */

typedef struct fetch {
    khub_hub *hub;
    khub_runtime *rt;
    khub_hub_id id;
    khub_kernel_opts o;
    khub_kernel_result *r;
    khub_trust_policy *policy;
    khub_lock *lock;
    const khub_lock_entry *entry; /* in lock, or NULL */
    khub_hub_variant_list *vl;
    khub__variant v;    /* metadata.json read once, its parse, the verified files */
    khub_status judged; /* what fetch_judge returned (its message is on rt) */
} fetch;

static void fetch_free(fetch *f)
{
    khub__trust_policy_free(f->policy);
    khub__lock_free(f->lock);
    khub_hub_variant_list_free(f->vl);
    khub__variant_clear(&f->v);
}

/* Carries a hub failure into the runtime's message. */
static khub_status hub_failed(fetch *f, khub_status st, const char *step)
{
    return khub__fail(f->rt, st, "%s %s: %s", step, f->r->repo, khub_hub_errmsg(f->hub));
}

static khub_status fetch_setup(fetch *f, const char *text)
{
    char err[KHUB_ERROR_SIZE], used[4096];
    khub_status st = khub_hub_id_parse(text, &f->id, err, sizeof err);
    if (st != KHUB_STATUS_OK) return khub__fail(f->rt, st, "%s", err);
    snprintf(f->r->repo, sizeof f->r->repo, "%s/%s", f->id.org, f->id.name);
    snprintf(f->r->op_name, sizeof f->r->op_name, "%s", f->id.symbol);
    st = khub__policy_find(f->o.policy_path, &f->policy, used, err, sizeof err);
    if (st != KHUB_STATUS_OK) return khub__fail(f->rt, st, "%s", err);
    if (!f->o.lock_path) return KHUB_STATUS_OK;
    st = khub__lock_load(f->o.lock_path, &f->lock, err, sizeof err);
    if (st != KHUB_STATUS_OK)
        return khub__fail(f->rt, st, "%s%s", err,
                          st == KHUB_STATUS_NOT_FOUND ? "; run khub lock to create it" : "");
    f->entry = khub__lock_find(f->lock, f->r->repo);
    KHUB_RETURN_IF(f->rt, !f->entry, KHUB_STATUS_NOT_FOUND,
                   "%s is not in %s; add it to khub.json and run khub lock", f->r->repo,
                   f->o.lock_path);
    KHUB_RETURN_IF(f->rt,
                   f->id.rev_kind == KHUB_HUB_REV_COMMIT &&
                       strcmp(f->id.revision, f->entry->commit) != 0,
                   KHUB_STATUS_LOCK_MISMATCH,
                   "%s: the ID names commit %.12s but %s locks %.12s; run khub update %s",
                   f->r->repo, f->id.revision, f->o.lock_path, f->entry->commit, f->r->repo);
    return KHUB_STATUS_OK;
}

/* Commit and ranked variants: from the lock without any request, else from
 * the hub. */
static khub_status fetch_variants(fetch *f)
{
    khub_status st;
    if (f->entry) {
        memcpy(f->r->commit, f->entry->commit, 41);
        st = khub__kernel_rank_locked(&f->id, f->entry, &f->vl);
        if (st != KHUB_STATUS_OK)
            return khub__fail(f->rt, st, "%s: %s", f->r->repo, khub_last_error());
        f->r->locked = 1;
    } else {
        st = khub_hub_resolve(f->hub, &f->id, f->r->commit);
        if (st != KHUB_STATUS_OK) return hub_failed(f, st, "resolving");
        st = khub_hub_variants(f->hub, &f->id, f->r->commit, &f->vl);
        if (st != KHUB_STATUS_OK) return hub_failed(f, st, "listing the variants of");
    }
    format_trace(f->vl, f->r->trace, sizeof f->r->trace);
    return KHUB_STATUS_OK;
}

/* No variant fits: the reference plugin serves the role, or strict fails. */
static khub_status fetch_fallback(fetch *f)
{
    char one_line[1024];
    snprintf(one_line, sizeof one_line, "%s", f->r->trace);
    for (char *p = one_line; *p; p++)
        if (*p == '\n') *p = ';';
    KHUB_RETURN_IF(f->rt, f->o.strict, KHUB_STATUS_NO_VARIANT,
                   "%s@%.12s: no build variant fits this machine (strict): %s", f->r->repo,
                   f->r->commit, one_line);
    khub__log(f->rt, KHUB_LOG_WARN,
              "%s@%.12s: no build variant fits this machine, falling back "
              "to %s: %s",
              f->r->repo, f->r->commit, FALLBACK_PLUGIN, one_line);
    f->r->fell_back = 1;
    snprintf(f->r->plugin_id, sizeof f->r->plugin_id, "%s", FALLBACK_PLUGIN);
    f->r->op_name[0] = '\0';
    snprintf(f->r->trust, sizeof f->r->trust, "nothing loaded (fallback)");
    return KHUB_STATUS_OK;
}

/* The locked content check, on the directory and on meta, the bytes of
 * metadata.json that will be parsed: the lock pins them (their digest is
 * among the locked files), so the table they hold is the locked one. */
static khub_status fetch_check_lock(fetch *f, const char *dir, const char *meta, size_t meta_len)
{
    if (!f->entry) return KHUB_STATUS_OK;
    const khub_lock_variant *v = khub__lock_variant(f->entry, f->r->variant);
    char err[KHUB_ERROR_SIZE], label[300], got[65];
    snprintf(label, sizeof label, "%s@%.12s", f->r->repo, f->r->commit);
    KHUB_RETURN_IF(f->rt, !v, KHUB_STATUS_LOCK_MISMATCH, "%s: variant %s is not in %s", label,
                   f->r->variant, f->o.lock_path);
    khub_status st = khub__lock_check_dir(v, dir, label, err, sizeof err);
    if (st != KHUB_STATUS_OK) return khub__fail(f->rt, st, "%s", err);
    const char *want = NULL;
    for (size_t i = 0; i < v->n_files && !want; i++)
        if (!strcmp(v->files[i].name, "metadata.json")) want = v->files[i].sha256;
    KHUB_FORWARD_IF_ERROR(f->rt, khub__sha256_hex(meta, meta_len, got));
    KHUB_RETURN_IF(f->rt, !want || !khub__digest_eq(got, want), KHUB_STATUS_LOCK_MISMATCH,
                   "%s variant %s: the metadata.json read for verification has SHA-256 %s, "
                   "khub.lock says %s; the cached copy changed while it was checked: delete it "
                   "and run khub sync",
                   label, f->r->variant, got, want ? want : "(not locked)");
    return KHUB_STATUS_OK;
}

/* Trust on the exact bytes, before metadata.json is parsed anywhere. */
static khub_status fetch_trust(fetch *f, const char *meta, size_t meta_len, const char *sig,
                               size_t sig_len)
{
    char err[KHUB_ERROR_SIZE] = "";
    khub_status st = khub__trust_decide(f->policy, f->id.org, meta, meta_len, sig, sig_len,
                                        f->o.allow_unsigned, err, sizeof err);
    if (st != KHUB_STATUS_OK)
        return khub__fail(f->rt, st, "refusing %s@%.12s variant %s: %s", f->r->repo, f->r->commit,
                          f->r->variant, err);
    char key_id[KHUB_KEY_ID_LEN + 1];
    unsigned char raw[64];
    if (sig && khub__sig_parse(sig, sig_len, key_id, raw) == KHUB_STATUS_OK)
        snprintf(f->r->trust, sizeof f->r->trust,
                 "metadata.json signed with key %s, accepted "
                 "by the policy",
                 key_id);
    else
        snprintf(f->r->trust, sizeof f->r->trust, "unsigned, accepted by opt-in (%s)",
                 f->o.allow_unsigned ? "--allow-unsigned" : "allow_unsigned in the policy");
    return KHUB_STATUS_OK;
}

/* The judge the hub runs once, on the bytes of metadata.json it then
 * parses: the lock check, then the trust policy. */
static khub_status fetch_judge(void *ud, const char *dir, const char *meta, size_t meta_len,
                               const char *sig, size_t sig_len)
{
    fetch *f = ud;
    f->judged = fetch_check_lock(f, dir, meta, meta_len);
    if (f->judged == KHUB_STATUS_OK) f->judged = fetch_trust(f, meta, meta_len, sig, sig_len);
    return f->judged;
}

/* The variant, downloaded when not cached, judged and verified in one pass
 * of the hub over one read of its metadata.json (f->v). */
static khub_status fetch_variant_files(fetch *f)
{
    khub__variant_judge judge = {fetch_judge, f};
    f->judged = KHUB_STATUS_OK;
    khub_status st =
        khub__hub_variant_open(f->hub, &f->id, f->r->commit, f->r->variant, true, &judge, &f->v);
    if (f->judged != KHUB_STATUS_OK) return f->judged; /* rt holds the judge's message */
    KHUB_RETURN_IF(f->rt, st == KHUB_STATUS_NOT_FOUND && f->entry && f->hub->offline,
                   KHUB_STATUS_OFFLINE,
                   "%s@%.12s: locked variant %s is not cached and the hub is offline "
                   "(HF_HUB_OFFLINE); run khub sync while online",
                   f->r->repo, f->r->commit, f->r->variant);
    if (st != KHUB_STATUS_OK) return hub_failed(f, st, "verifying");
    return KHUB_STATUS_OK;
}

static const khub_hub_file *file_named(const khub_hub_file_list *l, const char *rel)
{
    for (size_t i = 0; l && i < l->count; i++)
        if (strcmp(l->items[i].rel, rel) == 0) return &l->items[i];
    return NULL;
}

/* The signed metadata.json names the kernel and variant asked for: a hub
 * must not serve another kernel's validly signed build (issue 10). */
static khub_status fetch_bind(fetch *f)
{
    char err[KHUB_ERROR_SIZE] = "";
    const khub_kmeta *km = f->v.km;
    khub_trust_subject want = {f->r->repo, NULL, f->r->variant};
    khub_trust_subject got = {km->name, km->version, km->variant};
    khub_status st = khub__trust_bind(&want, &got, f->v.sig, f->v.sig_len, err, sizeof err);
    if (st == KHUB_STATUS_NAME_MISMATCH && f->o.allow_name_mismatch) {
        char *refusing = strstr(err, "; refusing it");
        if (refusing) *refusing = '\0';
        khub__log(f->rt, KHUB_LOG_WARN, "%s; loading it anyway (--allow-name-mismatch)", err);
    } else if (st != KHUB_STATUS_OK)
        return khub__fail(f->rt, st, "refusing %s@%.12s: %s", f->r->repo, f->r->commit, err);
    return KHUB_STATUS_OK;
}

/* Loads the plugin the parse of the judged metadata.json picks, with the
 * digest that parse states: the loader hashes the bytes it seals against
 * it. */
static khub_status fetch_load(fetch *f)
{
    const khub_kmeta *km = f->v.km;
    const khub_hub_file_list *files = f->v.files;
    KHUB_FORWARD_IF_ERROR(f->rt, fetch_bind(f));
    const khub_kmeta_plugin *pl = khub__kmeta_pick_plugin(km, khub_cpu_features());
    KHUB_RETURN_IF(f->rt, !pl, KHUB_STATUS_NO_VARIANT,
                   "%s@%.12s variant %s: none of its %zu plugin files fits this CPU's features",
                   f->r->repo, f->r->commit, f->r->variant, km->n_plugins);
    const khub_hub_file *pf = file_named(files, pl->file);
    KHUB_RETURN_IF(f->rt, !pf, KHUB_STATUS_METADATA_INVALID,
                   "%s variant %s: plugin file %s is not among its verified files", f->r->repo,
                   f->r->variant, pl->file);
    snprintf(f->r->file, sizeof f->r->file, "%s", pl->file);
    khub__artifact_file arts[KHUB_KMETA_MAX_FILES];
    size_t n = 0;
    for (size_t i = 0; i < files->count && n < KHUB_KMETA_MAX_FILES; i++)
        arts[n++] = (khub__artifact_file){files->items[i].rel, files->items[i].path,
                                          files->items[i].sha256};
    /* A build that ended a process before is refused unless allowed; the
     * marker path goes to the plugin, whose crash would write it. */
    char qpath[KHUB__PATH_MAX];
    if (khub__quarantine_path(f->hub, &f->id, f->r->commit, f->r->variant, qpath, sizeof qpath) !=
        KHUB_STATUS_OK)
        return hub_failed(f, KHUB_STATUS_BAD_ID, "quarantine marker of");
    KHUB_FORWARD_IF_ERROR(
        f->rt, khub__quarantine_gate(f->rt, f->r->repo, f->r->commit, f->r->variant, qpath));
    khub_plugin *p = NULL;
    /* The same file of the same cached variant already loaded (a second
     * model with the same kernel): use it rather than a second copy. */
    for (size_t i = 0; i < khub_plugin_count(f->rt) && !p; i++) {
        const khub_plugin *q = khub_plugin_at(f->rt, i);
        if (!strcmp(khub_plugin_path(q), pf->path) &&
            khub__digest_eq(khub_plugin_sha256(q), pf->sha256))
            p = (khub_plugin *)q; /* the registry's handle, as khub__plugin_load_verified gives */
    }
    if (!p)
        KHUB_FORWARD_IF_ERROR(f->rt,
                              khub__plugin_load_verified(f->rt, pf->path, pf->sha256, arts, n, &p));
    KHUB_RETURN_IF(f->rt, khub__plugin_set_quarantine(p, qpath) != KHUB_STATUS_OK,
                   KHUB_STATUS_NOMEM, "out of memory");
    f->r->plugin = p;
    snprintf(f->r->plugin_id, sizeof f->r->plugin_id, "%s", khub_plugin_id(p));
    if (strcmp(khub_plugin_id(p), f->r->repo) != 0)
        khub__log(f->rt, KHUB_LOG_WARN, "%s: the plugin calls itself %s", f->r->repo,
                  khub_plugin_id(p));
    return KHUB_STATUS_OK;
}

/* The first (best ranked) accepted CPU variant, for callers that run on
 * the CPU; notes the choice in the trace when it is not the overall best. */
static void prefer_cpu(fetch *f)
{
    khub_hub_variant_list *l = f->vl;
    const char *cpu = NULL;
    for (size_t i = 0; i < l->count && !cpu; i++)
        if (l->items[i].accepted && strstr(l->items[i].name, "-cpu-")) cpu = l->items[i].name;
    if (l->best && cpu != l->best) {
        size_t n = strlen(f->r->trace);
        snprintf(f->r->trace + n, sizeof f->r->trace - n,
                 "%s%s passed over: the executor runs on the CPU\n",
                 n && f->r->trace[n - 1] != '\n' ? "\n" : "", l->best);
    }
    l->best = cpu;
}

static khub_status kernel_fetch(khub_hub *hub, khub_runtime *rt, const char *id,
                                const khub_kernel_opts *opts, int cpu_only, khub_kernel_result *out)
{
    KHUB_API_CHECK(NULL, hub != NULL && rt != NULL && id != NULL && out != NULL);
    khub__clear(rt);
    uint32_t want = out->struct_size;
    memset(out, 0, sizeof *out);
    out->struct_size = want ? want : sizeof *out;
    fetch f = {.hub = hub, .rt = rt, .r = out};
    f.o = (khub_kernel_opts){KHUB_STRUCT_INIT(khub_kernel_opts)};
    if (opts)
        memcpy(&f.o, opts,
               opts->struct_size && opts->struct_size < sizeof f.o ? opts->struct_size
                                                                   : sizeof f.o);
    khub_status st = fetch_setup(&f, id);
    if (st == KHUB_STATUS_OK) st = fetch_variants(&f);
    if (st == KHUB_STATUS_OK && cpu_only) prefer_cpu(&f);
    if (st == KHUB_STATUS_OK && !f.vl->best) {
        st = fetch_fallback(&f);
        fetch_free(&f);
        return st;
    }
    if (st == KHUB_STATUS_OK) snprintf(out->variant, sizeof out->variant, "%s", f.vl->best);
    if (st == KHUB_STATUS_OK) st = fetch_variant_files(&f);
    if (st == KHUB_STATUS_OK) st = fetch_load(&f);
    fetch_free(&f);
    if (st == KHUB_STATUS_OK)
        khub__log(rt, KHUB_LOG_INFO, "%s@%.12s: loaded %s from %s (%s%s)", out->repo, out->commit,
                  out->file, out->variant, out->trust, out->locked ? ", lock verified" : "");
    return st;
}

khub_status khub_kernel_fetch(khub_hub *hub, khub_runtime *rt, const char *id,
                              const khub_kernel_opts *opts, khub_kernel_result *out)
{
    return kernel_fetch(hub, rt, id, opts, 0, out);
}

khub_status khub__kernel_fetch_cpu(khub_hub *hub, khub_runtime *rt, const char *id,
                                   const khub_kernel_opts *opts, khub_kernel_result *out)
{
    return kernel_fetch(hub, rt, id, opts, 1, out);
}

/* ======================================================================== */
/* Locking, syncing, versions                                               */
/* ======================================================================== */

/* all (may be NULL): every v<N> branch's N, in the order listed, up to cap
 * of them in *n_all. */
static khub_status newest_version_once(khub_hub *hub, const khub_hub_id *id, int32_t *newest,
                                       char commit[41], int32_t *all, size_t cap, size_t *n_all)
{
    *newest = -1;
    if (n_all) *n_all = 0;
    commit[0] = '\0';
    char url[KHUB__PATH_MAX], what[300];
    if (!KHUB__PATHF(url, "%s/api/%s/%s/%s/refs", hub->endpoint, khub__repo_api_type(hub, id),
                     id->org, id->name))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "URL too long");
    snprintf(what, sizeof what, "listing the versions of %s/%s", id->org, id->name);
    khub__http_resp r = {0};
    khub__http_req req = {.method = "GET", .url = url, .auth = 1, .what = what};
    khub_status st = khub__http_fetch(hub, &req, &r);
    if (st == KHUB_STATUS_OK && (r.status < 200 || r.status >= 300))
        st = khub__http_error(hub, &r, what);
    cJSON *root = st == KHUB_STATUS_OK ? cJSON_Parse(r.body ? r.body : "") : NULL;
    const cJSON *br = cJSON_GetObjectItemCaseSensitive(root, "branches"), *b;
    if (st == KHUB_STATUS_OK && !cJSON_IsArray(br))
        st = khub__hub_fail(hub, KHUB_STATUS_PARSE, "%s: no \"branches\" array", what);
    const cJSON *list = st == KHUB_STATUS_OK ? br : NULL;
    cJSON_ArrayForEach(b, list)
    {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(b, "name");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "targetCommit");
        if (!cJSON_IsString(nm) || !cJSON_IsString(t) || !khub__is_commit_hex(t->valuestring) ||
            nm->valuestring[0] != 'v')
            continue;
        char *end;
        long v = strtol(nm->valuestring + 1, &end, 10);
        if (end == nm->valuestring + 1 || *end || v < 0 || v > 1000000) continue;
        if (all && *n_all < cap) all[(*n_all)++] = (int32_t)v;
        if (v <= *newest) continue;
        *newest = (int32_t)v;
        memcpy(commit, t->valuestring, 41);
    }
    cJSON_Delete(root);
    khub__http_resp_free(&r);
    return st;
}

khub_status khub__kernel_newest_version(khub_hub *hub, const khub_hub_id *id, int32_t *newest,
                                        char commit[41])
{
    khub_status st = newest_version_once(hub, id, newest, commit, NULL, 0, NULL);
    if (khub__repo_fallback_begin(hub, id, st))
        st = khub__repo_fallback_end(hub, id,
                                     newest_version_once(hub, id, newest, commit, NULL, 0, NULL));
    return st;
}

static int cmp_version(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

khub_status khub__kernel_versions(khub_hub *hub, const khub_hub_id *id, int32_t *versions,
                                  size_t cap, size_t *n)
{
    int32_t newest;
    char commit[41];
    khub_status st = newest_version_once(hub, id, &newest, commit, versions, cap, n);
    if (khub__repo_fallback_begin(hub, id, st))
        st = khub__repo_fallback_end(
            hub, id, newest_version_once(hub, id, &newest, commit, versions, cap, n));
    if (st != KHUB_STATUS_OK) return st;
    qsort(versions, *n, sizeof *versions, cmp_version);
    size_t k = 0; /* "v2" and "v02" name one version */
    for (size_t i = 0; i < *n; i++)
        if (!k || versions[i] != versions[k - 1]) versions[k++] = versions[i];
    *n = k;
    return KHUB_STATUS_OK;
}

khub_status khub__kernel_lock_entry(khub_hub *hub, const khub_hub_id *id, const char *commit_pin,
                                    khub_lock_entry *e)
{
    memset(e, 0, sizeof *e);
    snprintf(e->repo, sizeof e->repo, "%s/%s", id->org, id->name);
    e->version = id->rev_kind == KHUB_HUB_REV_VERSION ? id->version : -1;
    khub_status st = KHUB_STATUS_OK;
    if (commit_pin) {
        memcpy(e->commit, commit_pin, 41);
    } else {
        KHUB_FORWARD_IF_ERROR(NULL, khub_hub_resolve(hub, id, e->commit));
    }
    if (id->rev_kind == KHUB_HUB_REV_NAME || id->rev_kind == KHUB_HUB_REV_COMMIT) {
        snprintf(e->revision, sizeof e->revision, "%s", id->revision);
    } else if (id->rev_kind == KHUB_HUB_REV_DEFAULT) {
        int32_t newest;
        char c[41];
        st = khub__kernel_newest_version(hub, id, &newest, c);
        if (st != KHUB_STATUS_OK) return st;
        e->version = newest;
        if (newest < 0) snprintf(e->revision, sizeof e->revision, "main");
        khub__log(NULL, KHUB_LOG_WARN, "%s: no version given; pinned to %s%s", e->repo,
                  newest >= 0 ? "v" : "main", newest >= 0 ? "(newest)" : "");
    }
    khub_hub_variant_list *vl = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, khub_hub_variants(hub, id, e->commit, &vl));
    e->variants = calloc(vl->count ? vl->count : 1, sizeof *e->variants);
    if (!e->variants) st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
    for (size_t i = 0; st == KHUB_STATUS_OK && i < vl->count; i++) {
        const char *name = vl->items[i].name;
        if (!khub_family(name) || e->n_variants >= KHUB_LOCK_MAX_VARIANTS) continue;
        khub_hub_file_list *fl = NULL;
        char err[KHUB_ERROR_SIZE];
        st = khub_hub_download_variant(hub, id, e->commit, name, &fl);
        if (st == KHUB_STATUS_OK) {
            st = khub__lock_variant_from_dir(name, fl->dir, &e->variants[e->n_variants], err,
                                             sizeof err);
            /* for khub update's downgrade check; unparsable metadata fails at load */
            if (st == KHUB_STATUS_OK && !e->kernel_version[0])
                (void)khub__lock_version_from_dir(fl->dir, e->kernel_version, NULL, 0);
            if (st != KHUB_STATUS_OK)
                khub__hub_fail(hub, st, "%s", err);
            else
                e->n_variants++;
        }
        khub_hub_file_list_free(fl);
    }
    khub_hub_variant_list_free(vl);
    if (st != KHUB_STATUS_OK) khub__lock_entry_clear(e);
    return st;
}

typedef struct sync_judge {
    khub_hub *hub;
    const khub_lock_variant *v;
    const char *label;
} sync_judge;

static khub_status sync_judge_fn(void *ud, const char *dir, const char *meta, size_t meta_len,
                                 const char *sig, size_t sig_len)
{
    (void)meta, (void)meta_len, (void)sig, (void)sig_len;
    const sync_judge *sj = ud;
    char err[KHUB_ERROR_SIZE];
    khub_status st = khub__lock_check_dir(sj->v, dir, sj->label, err, sizeof err);
    return st == KHUB_STATUS_OK ? st : khub__hub_fail(sj->hub, st, "%s", err);
}

khub_status khub__kernel_sync_entry(khub_hub *hub, const khub_lock_entry *e, int all_variants,
                                    size_t *n_checked)
{
    *n_checked = 0;
    khub_hub_id id;
    char err[KHUB_ERROR_SIZE];
    if (khub_hub_id_parse(e->repo, &id, err, sizeof err) != KHUB_STATUS_OK)
        return khub__hub_fail(hub, KHUB_STATUS_BAD_ID, "%s", err);
    const char *names[KHUB_LOCK_MAX_VARIANTS];
    size_t n = 0;
    for (size_t i = 0; i < e->n_variants && n < KHUB_LOCK_MAX_VARIANTS; i++)
        names[n++] = e->variants[i].name;
    khub_hub_variant_list *vl = NULL;
    if (!all_variants) {
        /* This host's best variant, and its best CPU variant when that is
         * another one: the model executor loads the CPU variant even where a
         * CUDA variant fits (khub__kernel_fetch_cpu), so an offline `khub run`
         * needs it. */
        KHUB_FORWARD_IF_ERROR(NULL, khub__kernel_rank_locked(&id, e, &vl));
        n = 0;
        if (vl->best) names[n++] = vl->best;
        for (size_t i = 0; i < vl->count; i++)
            if (vl->items[i].accepted && strstr(vl->items[i].name, "-cpu-")) {
                if (vl->items[i].name != vl->best) names[n++] = vl->items[i].name;
                break;
            }
    }
    khub_status st = KHUB_STATUS_OK;
    char label[300];
    snprintf(label, sizeof label, "%s@%.12s", e->repo, e->commit);
    for (size_t i = 0; st == KHUB_STATUS_OK && i < n; i++) {
        /* The lock is checked as the hub's judge, on the directory before
         * its metadata.json is parsed (strictly, since issue 10): a tampered
         * copy is named by the lock, not refused as bad JSON. */
        sync_judge sj = {hub, khub__lock_variant(e, names[i]), label};
        khub__variant_judge judge = {sync_judge_fn, &sj};
        khub__variant v;
        st = khub__hub_variant_open(hub, &id, e->commit, names[i], true, &judge, &v);
        if (st == KHUB_STATUS_OK) (*n_checked)++;
        khub__variant_clear(&v);
    }
    khub_hub_variant_list_free(vl);
    return st;
}

/* The newer of *best and the version of each variant folder under dir
 * (dir/<variant>/metadata.json), which lies in the cache at commit. */
static void newer_in_variants(const char *dir, const char *commit, char best[32],
                              char best_commit[41])
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        char vdir[4096], version[32];
        bool comparable = false;
        if (de->d_name[0] == '.' || !KHUB__PATHF(vdir, "%s/%s", dir, de->d_name)) continue;
        if (khub__lock_version_from_dir(vdir, version, NULL, 0) != KHUB_STATUS_OK) continue;
        if (khub__lock_version_cmp(version, best, &comparable) <= 0 || !comparable) continue;
        snprintf(best, 32, "%s", version);
        snprintf(best_commit, 41, "%s", commit);
    }
    closedir(d);
}

/* Walks root/<commit>/<sub> for every commit folder but skip. */
static void newer_in_commits(const char *root, const char *sub, const char *skip, char best[32],
                             char best_commit[41])
{
    DIR *d = opendir(root);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        char dir[4096];
        if (strlen(de->d_name) != 40 || !strcmp(de->d_name, skip)) continue;
        if (KHUB__PATHF(dir, "%s/%s%s", root, de->d_name, sub))
            newer_in_variants(dir, de->d_name, best, best_commit);
    }
    closedir(d);
}

khub_status khub__kernel_cached_newer(khub_hub *hub, const khub_lock_entry *e, char version[32],
                                      char commit[41])
{
    version[0] = commit[0] = '\0';
    if (!e->kernel_version[0]) return KHUB_STATUS_OK;
    khub_hub_id id;
    char err[KHUB_ERROR_SIZE], repo_dir[4096], root[4096];
    if (khub_hub_id_parse(e->repo, &id, err, sizeof err) != KHUB_STATUS_OK)
        return khub__hub_fail(hub, KHUB_STATUS_BAD_ID, "%s", err);
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_repo_dir(hub, &id, repo_dir, sizeof repo_dir));
    char best[32], best_commit[41] = "";
    snprintf(best, sizeof best, "%s", e->kernel_version);
    if (KHUB__PATHF(root, "%s/snapshots", repo_dir))
        newer_in_commits(root, "/build", e->commit, best, best_commit);
    if (KHUB__PATHF(root, "%s/khub-variants", repo_dir))
        newer_in_commits(root, "", e->commit, best, best_commit);
    if (best_commit[0]) {
        snprintf(version, 32, "%s", best);
        snprintf(commit, 41, "%s", best_commit);
    }
    return KHUB_STATUS_OK;
}
