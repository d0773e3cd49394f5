/*
 * variant.c: verified build variants: a variant's files checked against
 * its metadata.json (with a sidecar of verified fingerprints), and a
 * variant fetched (archive or file by file) when it is not cached. Which
 * variant fits this host is variant_rank.c's; the listing is
 * variant_list.c's; the sidecar of fingerprints that spares a warm verify
 * the hashing is verified_files.c's.
 *
 * Nothing in a variant is reported loadable before its metadata.json digest
 * table has been checked against the bytes (khub_hub_variant_files).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dir_list.h"
#include "hub_impl.h"
#include "kernel_meta.h"
#include "parse_memo.h"
#include "real_path.h"
#include "verified_files.h"

/* ======================================================================== */
/* Verified variant files                                                   */
/* ======================================================================== */

void khub_hub_file_list_free(khub_hub_file_list *list)
{
    if (!list) return;
    for (size_t i = 0; i < list->count; i++) {
        khub__mem_free(list->items[i].rel);
        khub__mem_free(list->items[i].path);
    }
    khub__mem_free(list->items);
    khub__mem_free(list);
}

static int plain_variant_name(const char *v)
{
    return v && v[0] && khub__path_is_safe(v) && !strchr(v, '/') && strlen(v) < 128;
}

#define MAX_META_BYTES ((size_t)4 << 20)
#define MAX_SIG_BYTES  ((size_t)64 << 10)

void khub__variant_clear(khub__variant *v)
{
    if (!v) return;
    khub_hub_file_list_free(v->files);
    khub__mem_free(v->km);
    khub__mem_free(v->meta);
    khub__mem_free(v->sig);
    khub__mem_free(v->repo_dir);
    memset(v, 0, sizeof *v);
}

/* metadata.json and metadata.json.sig of dir, read once each into v (issue
 * 10: every later check runs on these bytes, never on a second read). The
 * buffers belong to v, so two handles on two threads never share one. */
static khub_status read_meta(khub_hub *hub, const char *dir, khub__variant *v, bool *incomplete)
{
    char path[KHUB__PATH_MAX], err[KHUB_ERROR_SIZE] = "";
    if (!KHUB__CONCAT(path, dir, "/metadata.json"))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "%s: path too long", dir);
    khub_status st = khub__read_file_mem(khub__hub_alloc(hub), path, MAX_META_BYTES, &v->meta,
                                         &v->meta_len, err, sizeof err);
    if (st == KHUB_STATUS_NOT_FOUND && (*incomplete = true))
        return khub__hub_fail(hub, KHUB_STATUS_METADATA_INVALID,
                              "%s: no metadata.json; a variant without a digest table is "
                              "never loadable",
                              dir);
    if (st != KHUB_STATUS_OK)
        return khub__hub_fail(hub, KHUB_STATUS_METADATA_INVALID, "%s (%s)", err,
                              khub_status_name(st));
    if (!KHUB__CONCAT(path, dir, "/metadata.json.sig"))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "%s: path too long", dir);
    st = khub__read_file_mem(khub__hub_alloc(hub), path, MAX_SIG_BYTES, &v->sig, &v->sig_len, err,
                             sizeof err);
    if (st == KHUB_STATUS_NOT_FOUND) return KHUB_STATUS_OK; /* unsigned: the policy decides */
    if (st != KHUB_STATUS_OK)
        return khub__hub_fail(hub, KHUB_STATUS_SIGNATURE_INVALID, "%s (%s)", err,
                              khub_status_name(st));
    return KHUB_STATUS_OK;
}

/* Whether nm looks like a temporary name an interrupted download of an
 * older khub left inside a variant folder ("<file>.<8hex>.tmp"). */
static bool temp_name(const char *nm)
{
    size_t n = strlen(nm);
    return n > 13 && !strcmp(nm + n - 4, ".tmp") && nm[n - 13] == '.';
}

/* Whether real (an absolute path without links) lies strictly inside root. */
static bool inside(const char *real, const char *root)
{
    size_t n = strlen(root);
    return !strncmp(real, root, n) && real[n] == '/';
}

/* The real path of dir/name into real: rdir/name when dir/name is a
 * regular file (rdir is dir's real path: nothing left to resolve), else
 * realpath() of it (a snapshot's link to its blob). One realpath of the
 * folder instead of one per file: each walks every component of a long
 * cache path with a system call. false when it does not exist. *plain:
 * whether it was a regular file, *sb its lstat then (the same file as
 * real: the fingerprint needs no stat of its own). */
static bool real_file(const char *dir, const char *rdir, const char *name,
                      char path[KHUB__PATH_MAX], char real[KHUB__PATH_MAX], struct stat *sb,
                      bool *plain)
{
    *plain = false;
    if (!khub__concat(path, KHUB__PATH_MAX, (const char *const[]){dir, "/", name, NULL}) ||
        lstat(path, sb) != 0)
        return false;
    if (!S_ISREG(sb->st_mode) || strchr(name, '/')) return realpath(path, real) != NULL;
    *plain = khub__concat(real, KHUB__PATH_MAX, (const char *const[]){rdir, "/", name, NULL});
    return *plain;
}

/* The first name of dir (listed: its names listed before, NULL = list it
 * now) that m does not list, metadata.json and its .sig aside, refused. */
static khub_status check_unlisted(khub_hub *hub, const char *dir, const khub__dir_list *listed,
                                  const khub_kmeta *m)
{
    khub__dir_list own;
    if (!listed && khub__dir_list_read(khub__hub_alloc(hub), dir, &own) != KHUB_STATUS_OK)
        return KHUB_STATUS_OK; /* as before: a folder that cannot be listed has no extra name */
    const khub__dir_list *l = listed ? listed : &own;
    khub_status st = KHUB_STATUS_OK;
    for (size_t i = 0; st == KHUB_STATUS_OK && i < l->count; i++) {
        const char *nm = khub__dir_list_name(l, i);
        if (!strcmp(nm, "metadata.json") || !strcmp(nm, "metadata.json.sig") ||
            khub__kmeta_digest(m, nm))
            continue;
        st =
            khub__hub_fail(hub, KHUB_STATUS_METADATA_INVALID,
                           "%s: %s is not listed in metadata.json; refusing the variant%s", dir, nm,
                           temp_name(nm) ? " (a temporary name an interrupted download left: "
                                           "khub cache prune removes it)"
                                         : "");
    }
    if (!listed) khub__dir_list_free(&own);
    return st;
}

/* Every file km lists is in dir, inside the cache, and matches its digest;
 * the list goes to l. verified: the sidecar of this directory, NULL = neither
 * read nor write one (an archive being unpacked, verified before it is
 * renamed). listed (may be NULL): dir's names, listed when the verification
 * began (dir_list.h). */
static khub_status check_files(khub_hub *hub, const char *repo_dir, const char *dir,
                               const khub__dir_list *listed, const char *verified,
                               const khub_kmeta *m, const char *pinned_by, khub_hub_file_list *l,
                               bool *incomplete)
{
    char path[KHUB__PATH_MAX], rroot[KHUB__PATH_MAX], rdir[KHUB__PATH_MAX];
    if (!khub__real_dirs(repo_dir, dir, rroot, rdir))
        return khub__hub_fail(hub, KHUB_STATUS_NOT_FOUND, "%s is not cached", dir);
    khub_status st = KHUB_STATUS_OK;
    const khub_allocator *a = khub__hub_alloc(hub);
    char *known = verified ? khub__verified_read(a, verified) : NULL, *lines = NULL;
    size_t lines_len = 0;
    bool record = verified && khub__verified_add(a, &lines, &lines_len, "khub-verified 1\n"),
         hashed = false;
    for (size_t i = 0; st == KHUB_STATUS_OK && i < m->n_files; i++) {
        char real[KHUB__PATH_MAX], line[KHUB__PATH_MAX + 200], probe[KHUB__PATH_MAX + 202];
        const char *name = m->files[i].name, *want = m->files[i].sha256;
        struct stat sb;
        bool plain;
        if (!real_file(dir, rdir, name, path, real, &sb, &plain)) {
            *incomplete = true;
            st = khub__hub_fail(hub, KHUB_STATUS_NOT_FOUND, "%s: listed file %s is missing", dir,
                                name);
            break;
        }
        if (!inside(real, rroot)) {
            st = khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH,
                                "%s: %s resolves outside the "
                                "cache (%s)",
                                dir, name, real);
            break;
        }
        bool trusted =
            known &&
            khub__verified_line(real, plain ? &sb : NULL, name, want, line, sizeof line, NULL) &&
            KHUB__CONCAT(probe, "\n", line) && strstr(known, probe);
        long long ct = 0;
        if (!trusted && khub__hub_is_fresh(hub, real, want)) {
            trusted = hashed = true; /* hashed by this handle: record it once settled */
            if (!khub__verified_line(real, NULL, name, want, line, sizeof line, &ct) ||
                !khub__verified_settled(ct))
                line[0] = '\0';
        }
        if (!trusted) {
            st = khub__verified_hash_check(hub, dir, name, real, want, pinned_by, line, sizeof line,
                                           !verified);
            hashed = true;
        }
        if (st != KHUB_STATUS_OK) break;
        record = record && line[0] && khub__verified_add(a, &lines, &lines_len, line);
        khub_hub_file *e = &l->items[l->count++];
        e->rel = khub__mem_strdup(a, name);
        e->path = khub__mem_strdup(a, real);
        memcpy(e->sha256, want, 65);
        if (!e->rel || !e->path) st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
    }
    khub__mem_free(known);
    if (st == KHUB_STATUS_OK) st = check_unlisted(hub, dir, listed, m);
    if (st == KHUB_STATUS_OK && record && hashed) khub__verified_write(hub, verified, lines);
    khub__mem_free(lines);
    return st;
}

/* The parse of metadata.json's bytes, kept per process (parse_memo.h):
 * khub_kmeta is flat, so the memo keeps a copy made by one memcpy. */
static void *kmeta_keep(const void *parsed)
{
    khub_kmeta *c = khub__mem_alloc(NULL, sizeof *c);
    if (c) memcpy(c, parsed, sizeof *c);
    return c;
}

/* The caller's copy: the fields and the used entries of the three tables
 * (a few hundred bytes for a CPU variant), not all 25 KB of the struct;
 * the unused entries are never read (every reader stops at its n_). */
static bool kmeta_give(const void *kept, void *out)
{
    const khub_kmeta *k = kept;
    khub_kmeta *o = out;
    _Static_assert(offsetof(khub_kmeta, n_files) + sizeof(size_t) ==
                       offsetof(khub_kmeta, source_commit),
                   "kmeta_give copies the tail from source_commit on");
    memcpy(o, k, offsetof(khub_kmeta, plugins));
    memcpy(o->plugins, k->plugins, k->n_plugins * sizeof *k->plugins);
    o->n_plugins = k->n_plugins;
    memcpy(o->artifacts, k->artifacts, k->n_artifacts * sizeof *k->artifacts);
    o->n_artifacts = k->n_artifacts;
    memcpy(o->files, k->files, k->n_files * sizeof *k->files);
    o->n_files = k->n_files;
    memcpy(o->source_commit, k->source_commit, sizeof *o - offsetof(khub_kmeta, source_commit));
    return true;
}

static const khub__memo_kind kmeta_memo = {"metadata.json", kmeta_keep, kmeta_give, khub__mem_free};

/* khub__kmeta_parse, or the parse of the same bytes made before in this
 * process. Runs where the parse ran: after the judge, on the bytes judged. */
static khub_status kmeta_parse_memo(const char *meta, size_t n, khub_kmeta *km, char *err,
                                    size_t err_size)
{
    if (khub__parse_memo_find(&kmeta_memo, meta, n, km)) return KHUB_STATUS_OK;
    khub_status st = khub__kmeta_parse(meta, n, km, err, err_size);
    if (st == KHUB_STATUS_OK) khub__parse_memo_add(&kmeta_memo, meta, n, km);
    return st;
}

/* Reads metadata.json and its .sig once, lets judge (may be NULL) decide on
 * those bytes, parses them, and checks the directory's files against that
 * parse. Fills out; on failure clears it. *why (may be NULL) tells a
 * refusal by the judge (REFUSED) from a folder still being filled by
 * another process (INCOMPLETE: metadata.json or a listed file missing). */
typedef enum { VERIFY_FAILED, VERIFY_REFUSED, VERIFY_INCOMPLETE } verify_why;

static khub_status verify_dir(khub_hub *hub, const char *repo_dir, const char *dir,
                              const struct stat *dir_sb, const char *verified,
                              const khub__variant_judge *judge, khub__variant *out, verify_why *why)
{
    char err[KHUB_ERROR_SIZE] = "";
    bool incomplete = false;
    memset(out, 0, sizeof *out);
    /* One listing for the judge's name check and check_files' (dir_list.h),
     * kept for the next load while dir_sb, the folder's stat taken before
     * it, stays the same (NULL: a staging folder, listed afresh); a folder
     * that cannot be listed is left to each check, as before. */
    khub__dir_list names;
    const khub__dir_list *listed =
        khub__dir_list_kept(khub__hub_alloc(hub), dir, dir_sb, &names) == KHUB_STATUS_OK ? &names
                                                                                         : NULL;
    khub_status st = read_meta(hub, dir, out, &incomplete);
    if (st == KHUB_STATUS_OK && judge && judge->fn) {
        st = judge->fn(judge->ud, dir, listed, out->meta, out->meta_len, out->sig, out->sig_len);
        if (st != KHUB_STATUS_OK && why) *why = VERIFY_REFUSED;
        if (st != KHUB_STATUS_OK) {
            khub__dir_list_free(&names);
            khub__variant_clear(out);
            return st;
        }
    }
    if (st == KHUB_STATUS_OK) {
        /* not zeroed: the parse and the memo's copy (kmeta_give) fill it */
        out->km = khub__mem_alloc(khub__hub_alloc(hub), sizeof *out->km);
        out->files = khub__mem_calloc(khub__hub_alloc(hub), 1, sizeof *out->files);
        st = (!out->km || !out->files)
                 ? khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory")
                 : kmeta_parse_memo(out->meta, out->meta_len, out->km, err, sizeof err);
        if (st != KHUB_STATUS_OK && !hub->err_set) khub__hub_fail(hub, st, "%s: %s", dir, err);
    }
    if (st == KHUB_STATUS_OK) {
        snprintf(out->files->dir, sizeof out->files->dir, "%s", dir);
        out->files->items = khub__mem_calloc(
            khub__hub_alloc(hub), out->km->n_files ? out->km->n_files : 1, sizeof(khub_hub_file));
        if (!out->files->items) st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
    }
    if (st == KHUB_STATUS_OK && judge && judge->table) {
        st = judge->table(judge->ud, out->km);
        if (st != KHUB_STATUS_OK) {
            if (why) *why = VERIFY_REFUSED;
            khub__dir_list_free(&names);
            khub__variant_clear(out);
            return st;
        }
    }
    if (st == KHUB_STATUS_OK)
        st = check_files(hub, repo_dir, dir, listed, verified, out->km,
                         judge ? judge->pinned_by : NULL, out->files, &incomplete);
    if (st == KHUB_STATUS_OK && !(out->repo_dir = khub__mem_strdup(khub__hub_alloc(hub), repo_dir)))
        st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
    khub__dir_list_free(&names);
    if (st != KHUB_STATUS_OK) khub__variant_clear(out);
    if (why) *why = incomplete ? VERIFY_INCOMPLETE : VERIFY_FAILED;
    return st;
}

/* The cached folder of a variant (the unpacked archive first, then the
 * snapshot), its stat into *sb, and its sidecar path; NOT_FOUND when
 * neither is there. */
static khub_status cached_dir(khub_hub *hub, const khub_hub_id *id, const char *commit,
                              const char *variant, char repo_dir[KHUB__PATH_MAX],
                              char dir[KHUB__PATH_MAX], char verified[KHUB__PATH_MAX],
                              struct stat *sb)
{
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_repo_dir(hub, id, repo_dir, KHUB__PATH_MAX));
    if (!khub__concat(
            verified, KHUB__PATH_MAX,
            (const char *const[]){repo_dir, "/khub-verified/", commit, "/", variant, NULL}))
        verified[0] = '\0';
    if (khub__concat(
            dir, KHUB__PATH_MAX,
            (const char *const[]){repo_dir, "/khub-variants/", commit, "/", variant, NULL}) &&
        stat(dir, sb) == 0)
        return KHUB_STATUS_OK;
    if (snprintf(dir, KHUB__PATH_MAX, "%s/snapshots/%s/build/%s", repo_dir, commit, variant) <
            KHUB__PATH_MAX &&
        stat(dir, sb) == 0)
        return KHUB_STATUS_OK;
    return khub__hub_fail(hub, KHUB_STATUS_NOT_FOUND,
                          "%s/%s@%.12s variant %s is not cached; run khub download", id->org,
                          id->name, commit, variant);
}

/* The cached variant, verified (judge as khub__hub_variant_open). */
static khub_status open_cached(khub_hub *hub, const khub_hub_id *id, const char *commit,
                               const char *variant, const khub__variant_judge *judge,
                               khub__variant *out)
{
    char repo_dir[KHUB__PATH_MAX], dir[KHUB__PATH_MAX], verified[KHUB__PATH_MAX];
    struct stat sb;
    memset(out, 0, sizeof *out);
    KHUB_FORWARD_IF_ERROR(NULL, cached_dir(hub, id, commit, variant, repo_dir, dir, verified, &sb));
    return verify_dir(hub, repo_dir, dir, &sb, verified[0] ? verified : NULL, judge, out, NULL);
}

khub_status khub_hub_variant_files(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                   const char *variant, khub_hub_file_list **out)
{
    if (!hub || !id || !commit || !out)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_variant_files: NULL argument");
    *out = NULL;
    if (!khub__is_commit_hex(commit) || !plain_variant_name(variant))
        return khub__hub_fail(hub, KHUB_STATUS_INVALID_ARG, "bad commit or variant name");
    khub__variant v;
    KHUB_FORWARD_IF_ERROR(NULL, open_cached(hub, id, commit, variant, NULL, &v));
    *out = v.files;
    v.files = NULL;
    khub__variant_clear(&v);
    return KHUB_STATUS_OK;
}

/* Downloads build/<variant>.tar.gz, unpacks it into a staging folder
 * outside khub-variants/ (khub__cache_tmp_path), verifies it there (judge
 * included) and publishes it by one rename. When another process published
 * the variant first, that copy is verified (and judged) instead. */
static khub_status fetch_archive(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                 const char *variant, const char *repo_dir,
                                 const khub__variant_judge *judge, khub__variant *out)
{
    char rel[256], final[KHUB__PATH_MAX], tmp[KHUB__PATH_MAX], parent[KHUB__PATH_MAX];
    snprintf(rel, sizeof rel, "build/%s.tar.gz", variant);
    char blob[KHUB__PATH_MAX];
    KHUB_FORWARD_IF_ERROR(NULL, khub_hub_download_path(hub, id, commit, rel, blob, sizeof blob));
    khub_status st = KHUB_STATUS_OK;
    if (!KHUB__PATHF(parent, "%s/khub-variants/%s", repo_dir, commit) ||
        !KHUB__PATHF(final, "%s/%s", parent, variant))
        st = khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "variant path too long");
    if (st == KHUB_STATUS_OK) st = khub__mkdirs(hub, parent);
    if (st == KHUB_STATUS_OK) st = khub__cache_tmp_path(hub, repo_dir, tmp, sizeof tmp);
    if (st == KHUB_STATUS_OK) st = khub__archive_unpack(hub, blob, tmp, NULL);
    /* khub build packs entries as <variant>/<file> (kernel_build.h); an
     * archive with the files at its root is accepted too. */
    char root[KHUB__PATH_MAX], probe[KHUB__PATH_MAX];
    struct stat sb;
    snprintf(root, sizeof root, "%s", tmp);
    if (st == KHUB_STATUS_OK && KHUB__PATHF(probe, "%s/metadata.json", tmp) &&
        lstat(probe, &sb) != 0 && KHUB__PATHF(probe, "%s/%s", tmp, variant) &&
        lstat(probe, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(root, sizeof root, "%s", probe);
    if (st == KHUB_STATUS_OK) st = verify_dir(hub, repo_dir, root, NULL, NULL, judge, out, NULL);
    bool raced = false;
    if (st == KHUB_STATUS_OK && rename(root, final) != 0) {
        raced = errno == ENOTEMPTY || errno == EEXIST;
        if (!raced)
            st = khub__hub_fail(hub, KHUB_STATUS_IO, "cannot publish %s: %s", final,
                                strerror(errno));
    }
    khub__rmtree(tmp); /* what is left: nothing, or a copy another process beat */
    if (st == KHUB_STATUS_OK && !raced) {
        /* Same inodes, new folder: the verified paths move with the rename. */
        khub_hub_file_list *l = out->files;
        snprintf(l->dir, sizeof l->dir, "%s", final);
        for (size_t i = 0; st == KHUB_STATUS_OK && i < l->count; i++) {
            char *p =
                khub__mem_alloc(khub__hub_alloc(hub), strlen(final) + strlen(l->items[i].rel) + 2);
            if (!p) {
                st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
                break;
            }
            sprintf(p, "%s/%s", final, l->items[i].rel);
            khub__mem_free(l->items[i].path);
            l->items[i].path = p;
        }
    }
    if (st == KHUB_STATUS_OK && raced) {
        khub__variant_clear(out);
        st = open_cached(hub, id, commit, variant, judge, out);
    }
    if (st != KHUB_STATUS_OK) khub__variant_clear(out);
    return st;
}

/* Fetches a variant that is not (or not correctly) cached and verifies it,
 * judge included, once. */
static khub_status fetch_variant(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                 const char *variant, const khub__variant_judge *judge,
                                 khub__variant *out)
{
    char repo_dir[KHUB__PATH_MAX], archive[256], sub[256];
    khub__tree t = {0};
    KHUB_FORWARD_IF_ERROR(NULL, khub__list_tree(hub, id, commit, "build", 0, &t));
    /* after the listing: it may have found a model repo (the cache folder) */
    khub_status rd = khub__cache_repo_dir(hub, id, repo_dir, sizeof repo_dir);
    if (rd != KHUB_STATUS_OK) khub__tree_free(&t);
    KHUB_FORWARD_IF_ERROR(NULL, rd);
    snprintf(archive, sizeof archive, "build/%s.tar.gz", variant);
    int has_archive = 0, has_dir = 0;
    snprintf(sub, sizeof sub, "build/%s", variant);
    for (size_t i = 0; i < t.count; i++) {
        has_archive |= !t.items[i].is_dir && !strcmp(t.items[i].path, archive);
        has_dir |= t.items[i].is_dir && !strcmp(t.items[i].path, sub);
    }
    khub__tree_free(&t);
    if (has_archive) return fetch_archive(hub, id, commit, variant, repo_dir, judge, out);
    if (!has_dir)
        return khub__hub_fail(hub, KHUB_STATUS_NO_VARIANT, "%s/%s@%.12s has no variant %s", id->org,
                              id->name, commit, variant);
    /* metadata.json is linked last, by every process: a folder that shows
     * it holds every other file of the variant (links are never removed),
     * so a process that finds it never judges a variant whose .sig is
     * still on its way as unsigned. */
    khub_status st = khub__list_tree(hub, id, commit, sub, 1, &t);
    char meta_rel[300];
    snprintf(meta_rel, sizeof meta_rel, "%s/metadata.json", sub);
    for (int last = 0; last < 2; last++)
        for (size_t i = 0; st == KHUB_STATUS_OK && i < t.count; i++) {
            int is_meta = strcmp(t.items[i].path, meta_rel) == 0;
            if (t.items[i].is_dir || is_meta != last) continue;
            char p[KHUB__PATH_MAX];
            st = khub_hub_download_path(hub, id, commit, t.items[i].path, p, sizeof p);
        }
    khub__tree_free(&t);
    KHUB_FORWARD_IF_ERROR(NULL, st);
    return open_cached(hub, id, commit, variant, judge, out);
}

khub_status khub__hub_variant_open(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                   const char *variant, bool download,
                                   const khub__variant_judge *judge, khub__variant *out)
{
    memset(out, 0, sizeof *out);
    khub__hub_clear(hub);
    if (!khub__is_commit_hex(commit) || !plain_variant_name(variant))
        return khub__hub_fail(hub, KHUB_STATUS_INVALID_ARG, "bad commit or variant name");
    if (!download || hub->offline) return open_cached(hub, id, commit, variant, judge, out);
    /* A cached copy that verifies costs no request, and the judge's verdict
     * on it is final. A folder another process is still filling (a file by
     * file download: metadata.json or a listed file not linked yet) is
     * fetched here too, and what is then read is judged. */
    char repo_dir[KHUB__PATH_MAX], dir[KHUB__PATH_MAX], verified[KHUB__PATH_MAX];
    struct stat sb;
    int saved = hub->err_set;
    hub->err_set = 1; /* a miss here is not the error to report */
    khub_status st = cached_dir(hub, id, commit, variant, repo_dir, dir, verified, &sb);
    hub->err_set = saved;
    if (st != KHUB_STATUS_OK) return fetch_variant(hub, id, commit, variant, judge, out);
    verify_why why = VERIFY_FAILED;
    st = verify_dir(hub, repo_dir, dir, &sb, verified[0] ? verified : NULL, judge, out, &why);
    if (st == KHUB_STATUS_OK || why != VERIFY_INCOMPLETE) return st;
    khub__hub_clear(hub);
    return fetch_variant(hub, id, commit, variant, judge, out);
}

khub_status khub_hub_download_variant(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                      const char *variant, khub_hub_file_list **out)
{
    if (!hub || !id || !commit || !out)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_download_variant: NULL argument");
    *out = NULL;
    khub__hub_clear(hub);
    if (!khub__is_commit_hex(commit) || !plain_variant_name(variant))
        return khub__hub_fail(hub, KHUB_STATUS_INVALID_ARG, "bad commit or variant name");
    khub__variant v;
    khub_hub_file_list *l = NULL;
    int saved = hub->err_set;
    hub->err_set = 1;
    khub_status cached = open_cached(hub, id, commit, variant, NULL, &v);
    hub->err_set = saved;
    if (cached == KHUB_STATUS_OK || hub->offline) {
        if (cached != KHUB_STATUS_OK) /* again, for its message */
            KHUB_FORWARD_IF_ERROR(NULL, open_cached(hub, id, commit, variant, NULL, &v));
        l = v.files;
        v.files = NULL;
        khub__variant_clear(&v);
        *out = l;
        return KHUB_STATUS_OK; /* verified from the cache: no request */
    }
    KHUB_FORWARD_IF_ERROR(NULL, fetch_variant(hub, id, commit, variant, NULL, &v));
    *out = v.files;
    v.files = NULL;
    khub__variant_clear(&v);
    return KHUB_STATUS_OK;
}
