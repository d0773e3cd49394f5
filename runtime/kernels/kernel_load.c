/*
 * kernel_load.c: a kernel named by Hub ID, fetched, verified and loaded
 * (khub_kernel_fetch, khub_kernels.h). The glue layer above the hub and
 * the loader (docs/architecture.md): the hub resolves, downloads and
 * verifies (it never loads code); the loader verifies the bytes once more
 * and loads them; this file joins the two.
 *
 * Order of checks, and why:
 *  1. The commit comes from the lock when there is one, so a moved branch
 *     cannot change what a locked project loads.
 *  2. A cached variant is compared with the lock before anything in it is
 *     read as data: the lock is the root of trust for content. Its file
 *     names are the locked ones, and the digest of the metadata.json bytes
 *     read is the locked one, so the table they hold is the locked table.
 *  3. The trust policy judges the exact bytes of metadata.json and its .sig
 *     before metadata.json is parsed here.
 *  4. After the parse, the table must state the lock's digest for every
 *     file (it does unless the lock was edited). Then the hub checks every
 *     file against it (a mismatch on a locked load is LOCK_MISMATCH naming
 *     khub.lock), and the loader hashes the plugin's bytes as it seals them
 *     into a memfd: each byte that runs or is read is hashed once, against
 *     the lock's digest (session 10; before, the lock check hashed every
 *     file from disk as well).
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
#include <stdio.h>
#include <string.h>

#include "app_struct.h"
#include "contain.h"
#include "hub_impl.h"
#include "kernel_fetch.h"
#include "kernel_load.h"
#include "kernel_meta.h"
#include "parse_memo.h"
#include "plugin_artifacts.h"
#include "quarantine.h"
#include "runtime_impl.h"
#include "variant_rank.h"

#define FALLBACK_PLUGIN "khub/ref-cpu"

/* The hub's ranking of the variants, one line each, for the result's trace. */
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
    khub_sig sig;       /* the judged metadata.json.sig, parsed once (format 0: none) */
    int gpu;            /* CUDA variants judged for this ordinal alone, -1 = every GPU */
    bool strict_cuda;   /* with gpu >= 0: no CUDA variant for it is NO_VARIANT */
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
        st = khub__kernel_rank_locked(f->hub, f->entry, f->gpu, &f->vl);
        if (st != KHUB_STATUS_OK)
            return khub__fail(f->rt, st, "%s: %s", f->r->repo, khub_last_error());
        f->r->locked = 1;
    } else {
        st = khub_hub_resolve(f->hub, &f->id, f->r->commit);
        if (st != KHUB_STATUS_OK) return hub_failed(f, st, "resolving");
        st = khub__hub_variants_gpu(f->hub, &f->id, f->r->commit, f->gpu, &f->vl);
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

/* The locked content check before the parse, on the directory and on
 * meta_sha256, the digest of the bytes of metadata.json that will be
 * parsed: the lock pins them (their digest is among the locked files), so
 * the table they hold is the locked one (fetch_table then checks that it
 * states the lock's digests). metadata.json itself is judged by that digest
 * of the bytes read, never by a second read of the file. The other files
 * are not hashed here: the hub checks each against that table next, the
 * loader hashes the sealed plugin against it, and an artifact is hashed
 * when it is read; a file nobody reads is never trusted for anything. */
static khub_status fetch_check_lock(fetch *f, const char *dir, const struct khub__dir_list *listed,
                                    const char *meta_sha256)
{
    if (!f->entry) return KHUB_STATUS_OK;
    const khub_lock_variant *v = khub__lock_variant(f->entry, f->r->variant);
    char err[KHUB_ERROR_SIZE], label[300];
    snprintf(label, sizeof label, "%s@%.12s", f->r->repo, f->r->commit);
    KHUB_RETURN_IF(f->rt, !v, KHUB_STATUS_LOCK_MISMATCH, "%s: variant %s is not in %s", label,
                   f->r->variant, f->o.lock_path);
    khub_status st = khub__lock_check_names(v, dir, listed, meta_sha256, label, err, sizeof err);
    if (st != KHUB_STATUS_OK) return khub__fail(f->rt, st, "%s", err);
    bool locked_meta = false;
    for (size_t i = 0; i < v->n_files && !locked_meta; i++)
        locked_meta = !strcmp(v->files[i].name, "metadata.json");
    KHUB_RETURN_IF(f->rt, !locked_meta, KHUB_STATUS_LOCK_MISMATCH,
                   "%s variant %s: khub.lock pins no metadata.json; run khub lock again", label,
                   f->r->variant);
    return KHUB_STATUS_OK;
}

/* Trust on the exact bytes, before metadata.json is parsed anywhere; the
 * signature is parsed once, into f->sig, for the binding check. */
static khub_status fetch_trust(fetch *f, const khub_trust_input *in)
{
    char err[KHUB_ERROR_SIZE] = "";
    khub_status st = khub__trust_decide_ex(f->policy, f->id.org, in, f->o.allow_unsigned, &f->sig,
                                           err, sizeof err);
    if (st != KHUB_STATUS_OK)
        return khub__fail(f->rt, st, "refusing %s@%.12s variant %s: %s", f->r->repo, f->r->commit,
                          f->r->variant, err);
    if (f->sig.format)
        snprintf(f->r->trust, sizeof f->r->trust,
                 "metadata.json signed with key %s, accepted "
                 "by the policy",
                 f->sig.key_id);
    else
        snprintf(f->r->trust, sizeof f->r->trust, "unsigned, accepted by opt-in (%s)",
                 f->o.allow_unsigned ? "khub_kernel_opts.allow_unsigned"
                                     : "allow_unsigned in the policy");
    return KHUB_STATUS_OK;
}

/* The judge the hub runs once, on the bytes of metadata.json it then
 * parses: the lock check, then the trust policy. */
static khub_status fetch_judge(void *ud, const char *dir, const struct khub__dir_list *listed,
                               const char *meta, size_t meta_len, const char *sig, size_t sig_len)
{
    fetch *f = ud;
    /* hashed once: the lock and the signed statement both name it; the same
     * bytes hashed before in this process are answered by parse_memo.h */
    char meta_sha[65];
    f->judged = khub__parse_memo_sha256(meta, meta_len, meta_sha);
    if (f->judged != KHUB_STATUS_OK)
        return khub__fail(f->rt, f->judged, "hashing metadata.json of %s", f->r->repo);
    f->judged = fetch_check_lock(f, dir, listed, meta_sha);
    khub_trust_input in = {meta, meta_len, meta_sha, sig, sig_len};
    if (f->judged == KHUB_STATUS_OK) f->judged = fetch_trust(f, &in);
    return f->judged;
}

/* After the parse of the judged bytes, before any file is checked against
 * them: on a locked load the table states the lock's digest for every file,
 * so a file that matches the table matches the lock. */
static khub_status fetch_table(void *ud, const khub_kmeta *km)
{
    fetch *f = ud;
    if (!f->entry) return KHUB_STATUS_OK;
    const khub_lock_variant *v = khub__lock_variant(f->entry, f->r->variant);
    char err[KHUB_ERROR_SIZE], label[300];
    snprintf(label, sizeof label, "%s@%.12s", f->r->repo, f->r->commit);
    KHUB_ASSERT(v != NULL); /* fetch_check_lock refused a variant the lock lacks */
    f->judged = khub__lock_check_table(v, km, label, err, sizeof err);
    if (f->judged != KHUB_STATUS_OK) return khub__fail(f->rt, f->judged, "%s", err);
    return KHUB_STATUS_OK;
}

/* The variant, downloaded when not cached, judged and verified in one pass
 * of the hub over one read of its metadata.json (f->v). */
static khub_status fetch_variant_files(fetch *f)
{
    khub__variant_judge judge = {.fn = fetch_judge,
                                 .ud = f,
                                 .table = fetch_table,
                                 .pinned_by = f->entry ? "khub.lock" : NULL};
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
    khub_status st =
        khub__trust_bind_sig(&want, &got, f->sig.format ? &f->sig : NULL, err, sizeof err);
    if (st == KHUB_STATUS_NAME_MISMATCH && f->o.allow_name_mismatch) {
        char *refusing = strstr(err, "; refusing it");
        if (refusing) *refusing = '\0';
        khub__log(f->rt, KHUB_LOG_WARN,
                  "%s; loading it anyway (khub_kernel_opts.allow_name_mismatch)", err);
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
    if (khub__quarantine_path(f->hub, f->v.repo_dir, f->r->commit, f->r->variant, qpath,
                              sizeof qpath) != KHUB_STATUS_OK)
        return hub_failed(f, KHUB_STATUS_BAD_ID, "quarantine marker of");
    KHUB_FORWARD_IF_ERROR(
        f->rt, khub__quarantine_gate(f->rt, f->r->repo, f->r->commit, f->r->variant, qpath));
    khub_plugin *p = NULL;
    /* The same file of the same cached variant already loaded by a
     * verified load (a second model with the same kernel): use it rather
     * than a second copy. Not a copy the embedder loaded from that file
     * itself (khub_plugin_load: no artifacts, and no ABI gate ran on it):
     * taking it returned a plugin the gate would refuse (session 19). */
    for (size_t i = 0; i < khub_plugin_count(f->rt) && !p; i++) {
        const khub_plugin *q = khub_plugin_at(f->rt, i);
        if (q->artifacts && !strcmp(khub_plugin_path(q), pf->path) &&
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

/* Whether name is a khub CUDA build ("khub1-cu130-x86_64-linux"). */
static bool is_cuda_variant(const char *name)
{
    int abi = 0, digits = 0;
    return sscanf(name, "khub%d-cu%d", &abi, &digits) == 2;
}

/* The first (best ranked) accepted CPU variant, for callers that run on
 * the CPU; notes the choice in the trace when it is not the overall best. */
static void prefer_cpu(fetch *f, const char *why)
{
    khub_hub_variant_list *l = f->vl;
    const char *cpu = NULL;
    for (size_t i = 0; i < l->count && !cpu; i++)
        if (l->items[i].accepted && strstr(l->items[i].name, "-cpu-")) cpu = l->items[i].name;
    if (l->best && cpu != l->best) {
        size_t n = strlen(f->r->trace);
        snprintf(f->r->trace + n, sizeof f->r->trace - n, "%s%s passed over: %s\n",
                 n && f->r->trace[n - 1] != '\n' ? "\n" : "", l->best, why);
    }
    l->best = cpu;
}

/* For a model placed on CUDA device gpu (the ranking judged the CUDA
 * variants against that GPU alone): the best CUDA variant. Without one,
 * strict fails; else the best CPU variant serves the role on the CPU, and
 * cpu_why says why in one line (the CUDA variants' verdicts). */
static khub_status prefer_cuda(fetch *f, int gpu, char *cpu_why, size_t n)
{
    khub_hub_variant_list *l = f->vl;
    char verdicts[1024] = "";
    size_t len = 0;
    for (size_t i = 0; i < l->count; i++) {
        if (!is_cuda_variant(l->items[i].name)) continue;
        if (l->items[i].accepted) {
            l->best = l->items[i].name;
            return KHUB_STATUS_OK;
        }
        int w = snprintf(verdicts + len, sizeof verdicts - len, "%s%s: %s", len ? "; " : "",
                         l->items[i].name, l->items[i].reason);
        if (w > 0) len = len + (size_t)w < sizeof verdicts ? len + (size_t)w : sizeof verdicts - 1;
    }
    if (!len) snprintf(verdicts, sizeof verdicts, "it has no CUDA variant");
    KHUB_RETURN_IF(f->rt, f->strict_cuda, KHUB_STATUS_NO_VARIANT,
                   "%s@%.12s: no CUDA variant runs on cuda:%d (strict): %s", f->r->repo,
                   f->r->commit, gpu, verdicts);
    snprintf(cpu_why, n, "%s@%.12s has no CUDA variant that runs on cuda:%d (%s)", f->r->repo,
             f->r->commit, gpu, verdicts);
    char over[64];
    snprintf(over, sizeof over, "no CUDA variant runs on cuda:%d", gpu);
    prefer_cpu(f, over);
    return KHUB_STATUS_OK;
}

/* target: KERNEL_ANY (the best variant for this host), KERNEL_CPU (the
 * best CPU variant), or a CUDA ordinal (prefer_cuda; cpu_why as there). */
enum { KERNEL_ANY = -2, KERNEL_CPU = -1 };

static khub_status kernel_fetch(khub_hub *hub, khub_runtime *rt, const char *id,
                                const khub_kernel_opts *opts, int target, bool strict_cuda,
                                khub_kernel_result *out, char *cpu_why, size_t why_n)
{
    KHUB_API_CHECK(NULL, hub != NULL && rt != NULL && id != NULL && out != NULL);
    khub__clear(rt);
    /* 0.1's size (before session 18 a struct_size of 0 meant the whole
     * struct, and any other was read, the rest as zeros) */
    if (opts)
        KHUB__APP_CHECK(rt, opts, KHUB__SIZE_TO(khub_kernel_opts, allow_name_mismatch),
                        "khub_kernel_fetch", "opts");
    uint32_t want = out->struct_size;
    memset(out, 0, sizeof *out);
    out->struct_size = want ? want : sizeof *out;
    if (cpu_why && why_n) cpu_why[0] = '\0';
    fetch f = {.hub = hub,
               .rt = rt,
               .r = out,
               .gpu = target >= 0 ? target : -1,
               .strict_cuda = strict_cuda};
    f.o = (khub_kernel_opts){KHUB_STRUCT_INIT(khub_kernel_opts)};
    if (opts) khub__app_copy_in(&f.o, sizeof f.o, opts);
    khub_status st = fetch_setup(&f, id);
    if (st == KHUB_STATUS_OK) st = fetch_variants(&f);
    if (st == KHUB_STATUS_OK && target == KERNEL_CPU)
        prefer_cpu(&f, "the executor runs on the CPU");
    if (st == KHUB_STATUS_OK && target >= 0) st = prefer_cuda(&f, target, cpu_why, why_n);
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

/* The caller's result is filled through a whole one of this header's size
 * and copied out up to its struct_size (since session 17: kernel_fetch
 * cleared sizeof bytes of it and wrote its fields in place, so a result
 * grown after 0.1 would have been written past a 0.1 caller's struct). */
khub_status khub_kernel_fetch(khub_hub *hub, khub_runtime *rt, const char *id,
                              const khub_kernel_opts *opts, khub_kernel_result *out)
{
    KHUB_API_CHECK(NULL, hub != NULL && rt != NULL && id != NULL && out != NULL);
    khub__clear(rt);
    KHUB__APP_CHECK(rt, out, KHUB__SIZE_TO(khub_kernel_result, trace), "khub_kernel_fetch", "out");
    khub_kernel_result r = {.struct_size = sizeof r};
    khub_status st = kernel_fetch(hub, rt, id, opts, KERNEL_ANY, false, &r, NULL, 0);
    khub__app_copy_out(out, &r, sizeof r);
    return st;
}

khub_status khub__kernel_fetch_cpu(khub_hub *hub, khub_runtime *rt, const char *id,
                                   const khub_kernel_opts *opts, khub_kernel_result *out)
{
    return kernel_fetch(hub, rt, id, opts, KERNEL_CPU, false, out, NULL, 0);
}

khub_status khub__kernel_fetch_gpu(khub_hub *hub, khub_runtime *rt, const char *id,
                                   const khub_kernel_opts *opts, int gpu, bool strict_cuda,
                                   khub_kernel_result *out, char *cpu_why, size_t why_n)
{
    return kernel_fetch(hub, rt, id, opts, gpu, strict_cuda, out, cpu_why, why_n);
}
