/*
 * kernel_fetch.c: the hub work behind `khub lock`, `khub sync` and
 * `khub outdated` (kernel_fetch.h): the trust policy lookup, ranking locked
 * variants, pinning a kernel into a lock entry, syncing one into the
 * cache, the versions of a repo. Fetching, verifying and loading a kernel
 * by Hub ID (khub_kernel_fetch) is runtime/kernels/kernel_load.c, above
 * the hub and the loader: the hub never loads code.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "hub_impl.h"
#include "kernel_fetch.h"
#include "kernel_meta.h"
#include "variant_rank.h"

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
    /* why names the file already ("PATH: cannot open: ...", "PATH: policy: ...") */
    if (st != KHUB_STATUS_OK) khub__errbuf(errbuf, errbuf_size, "trust policy %s", why);
    return st;
}

/* ======================================================================== */
/* Small helpers                                                            */
/* ======================================================================== */

/* A khub-family variant name: "khub<digits>-...". Others (torch*, tvm-ffi*)
 * are never locked: khub cannot load them. */
static bool khub_family(const char *name)
{
    return strncmp(name, "khub", 4) == 0 && name[4] >= '0' && name[4] <= '9';
}

/* ======================================================================== */
/* Ranking locked names without the network                                 */
/* ======================================================================== */

khub_status khub__kernel_rank_locked(khub_hub *hub, const khub_lock_entry *e, int gpu,
                                     khub_hub_variant_list **out)
{
    *out = NULL;
    khub__rank_host h;
    khub__rank_host_detect(&h);
    khub__rank_host_only_gpu(&h, gpu);
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
    khub_status st = khub__rank_variants(khub__hub_alloc(hub), in, n, &h, out);
    if (st != KHUB_STATUS_OK)
        khub__fail(NULL, st, "ranking locked variants: %s", khub_last_error());
    return st;
}

/* ======================================================================== */
/* Locking, syncing, versions                                               */
/* ======================================================================== */

khub_status khub__refs_versions(khub_hub *hub, const char *what, const char *json, size_t n,
                                int32_t *newest, char commit[41], int32_t *all, size_t cap,
                                size_t *n_all)
{
    *newest = -1;
    if (n_all) *n_all = 0;
    commit[0] = '\0';
    cJSON *root = cJSON_ParseWithLength(json, n);
    const cJSON *br = cJSON_GetObjectItemCaseSensitive(root, "branches"), *b;
    khub_status st = KHUB_STATUS_OK;
    if (!cJSON_IsArray(br))
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
    return st;
}

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
    if (st == KHUB_STATUS_OK)
        st = khub__refs_versions(hub, what, r.body ? r.body : "", r.body ? r.body_len : 0, newest,
                                 commit, all, cap, n_all);
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
    if (commit_pin) memcpy(e->commit, commit_pin, 41);
    if (id->rev_kind == KHUB_HUB_REV_DEFAULT) {
        /* No version asked: the newest v<N> branch and its commit; a repo
         * without one pins its default branch. */
        int32_t newest;
        char c[41];
        KHUB_FORWARD_IF_ERROR(NULL, khub__kernel_newest_version(hub, id, &newest, c));
        e->version = newest;
        if (newest >= 0) {
            if (!commit_pin) memcpy(e->commit, c, 41);
            khub__log(hub->rt, KHUB_LOG_WARN,
                      "%s: no version given; pinned to v%d (the newest), commit %.12s", e->repo,
                      (int)newest, e->commit);
        } else {
            snprintf(e->revision, sizeof e->revision, "main");
            if (!commit_pin) KHUB_FORWARD_IF_ERROR(NULL, khub_hub_resolve(hub, id, e->commit));
            khub__log(hub->rt, KHUB_LOG_WARN,
                      "%s: no version given and no v<N> branch; pinned to main, commit %.12s",
                      e->repo, e->commit);
        }
    } else {
        if (!commit_pin) KHUB_FORWARD_IF_ERROR(NULL, khub_hub_resolve(hub, id, e->commit));
        if (id->rev_kind == KHUB_HUB_REV_NAME || id->rev_kind == KHUB_HUB_REV_COMMIT)
            snprintf(e->revision, sizeof e->revision, "%s", id->revision);
    }
    khub_hub_variant_list *vl = NULL;
    KHUB_FORWARD_IF_ERROR(NULL, khub_hub_variants(hub, id, e->commit, &vl));
    e->variants =
        khub__mem_calloc(khub__hub_alloc(hub), vl->count ? vl->count : 1, sizeof *e->variants);
    if (!e->variants) st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
    for (size_t i = 0; st == KHUB_STATUS_OK && i < vl->count; i++) {
        const char *name = vl->items[i].name;
        if (!khub_family(name) || e->n_variants >= KHUB_LOCK_MAX_VARIANTS) continue;
        khub_hub_file_list *fl = NULL;
        char err[KHUB_ERROR_SIZE];
        st = khub_hub_download_variant(hub, id, e->commit, name, &fl);
        if (st == KHUB_STATUS_OK) {
            st = khub__lock_variant_from_dir(khub__hub_alloc(hub), name, fl->dir,
                                             &e->variants[e->n_variants], err, sizeof err);
            /* for khub update's downgrade check; unparsable metadata fails at load */
            if (st == KHUB_STATUS_OK && !e->kernel_version[0])
                (void)khub__lock_version_from_dir(khub__hub_alloc(hub), fl->dir, e->kernel_version,
                                                  NULL, 0);
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

static khub_status sync_judge_fn(void *ud, const char *dir, const struct khub__dir_list *listed,
                                 const char *meta, size_t meta_len, const char *sig, size_t sig_len)
{
    (void)listed, (void)sig, (void)sig_len; /* khub sync hashes every file and lists dir itself */
    const sync_judge *sj = ud;
    char err[KHUB_ERROR_SIZE], meta_sha[65];
    KHUB_FORWARD_IF_ERROR(NULL, khub__sha256_hex(meta, meta_len, meta_sha));
    khub_status st = khub__lock_check_dir(sj->v, dir, meta_sha, sj->label, err, sizeof err);
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
        KHUB_FORWARD_IF_ERROR(NULL, khub__kernel_rank_locked(hub, e, -1, &vl));
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
        khub__variant_judge judge = {.fn = sync_judge_fn, .ud = &sj};
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
static void newer_in_variants(const khub_allocator *a, const char *dir, const char *commit,
                              char best[32], char best_commit[41])
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        char vdir[4096], version[32];
        bool comparable = false;
        if (de->d_name[0] == '.' || !KHUB__PATHF(vdir, "%s/%s", dir, de->d_name)) continue;
        if (khub__lock_version_from_dir(a, vdir, version, NULL, 0) != KHUB_STATUS_OK) continue;
        if (khub__lock_version_cmp(version, best, &comparable) <= 0 || !comparable) continue;
        snprintf(best, 32, "%s", version);
        snprintf(best_commit, 41, "%s", commit);
    }
    closedir(d);
}

/* Walks root/<commit>/<sub> for every commit folder but skip. */
static void newer_in_commits(const khub_allocator *a, const char *root, const char *sub,
                             const char *skip, char best[32], char best_commit[41])
{
    DIR *d = opendir(root);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        char dir[4096];
        if (strlen(de->d_name) != 40 || !strcmp(de->d_name, skip)) continue;
        if (KHUB__PATHF(dir, "%s/%s%s", root, de->d_name, sub))
            newer_in_variants(a, dir, de->d_name, best, best_commit);
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
        newer_in_commits(khub__hub_alloc(hub), root, "/build", e->commit, best, best_commit);
    if (KHUB__PATHF(root, "%s/khub-variants", repo_dir))
        newer_in_commits(khub__hub_alloc(hub), root, "", e->commit, best, best_commit);
    if (best_commit[0]) {
        snprintf(version, 32, "%s", best);
        snprintf(commit, 41, "%s", best_commit);
    }
    return KHUB_STATUS_OK;
}
