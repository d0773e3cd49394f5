/*
 * cache_admin.c: `khub cache ls|verify|prune` over huggingface_hub's cache
 * layout (cache_admin.h). The walkers never follow a symlink out of a
 * repo folder: sizes of snapshot files come from the blobs they link to,
 * and only links that resolve inside the repo's own blobs/ count as
 * references. Removal goes through unlink and khub__rmtree (which does
 * not follow links) on names built under the cache root.
 *
 * A prune racing a download in another process could remove a blob that
 * was published but not yet linked; run prune when nothing downloads
 * (as with `hf cache delete`).
 *
 * The debris of interrupted downloads that verify reports and prune removes
 * is found by cache_debris.c.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_admin.h"

#define MAX_DEPTH 64

/* ======================================================================== */
/* Helpers                                                                  */
/* ======================================================================== */

static const struct {
    const char *prefix, *type;
} kinds[] = {{"kernels--", "kernel"},
             {"models--", "model"},
             {"datasets--", "dataset"},
             {"spaces--", "space"}};

/* "kernels--org--name" -> type and "org/name"; 0 when not a repo folder. */
static int parse_folder(const char *folder, char *type, size_t tsize, char *id, size_t isize)
{
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t pl = strlen(kinds[k].prefix);
        if (strncmp(folder, kinds[k].prefix, pl) != 0 || !folder[pl]) continue;
        const char *rest = folder + pl, *sep = strstr(rest, "--");
        snprintf(type, tsize, "%s", kinds[k].type);
        if (!sep)
            snprintf(id, isize, "%s", rest);
        else
            snprintf(id, isize, "%.*s/%s", (int)(sep - rest), rest, sep + 2);
        return 1;
    }
    return 0;
}

/* Opens the cache folder into *d: NULL and OK when there is none (an empty
 * cache), NULL and IO (on the hub) when it cannot be read. */
static khub_status cache_open(khub_hub *hub, DIR **d)
{
    *d = opendir(hub->cache_dir);
    if (*d || errno == ENOENT) return KHUB_STATUS_OK;
    return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot read the cache %s: %s", hub->cache_dir,
                          strerror(errno));
}

/* The name of the next entry of the cache folder d that is a repo's folder
 * (parse_folder's forms; a symlinked one is not walked); NULL at the end. */
static const char *next_repo_folder(const khub_hub *hub, DIR *d)
{
    struct dirent *de;
    while ((de = readdir(d))) {
        char type[16], id[200], path[KHUB__PATH_MAX];
        struct stat sb;
        if (parse_folder(de->d_name, type, sizeof type, id, sizeof id) &&
            KHUB__PATHF(path, "%s/%s", hub->cache_dir, de->d_name) && lstat(path, &sb) == 0 &&
            S_ISDIR(sb.st_mode))
            return de->d_name;
    }
    return NULL;
}

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[n] == '\0';
}

/* Bytes of the regular files under path (lstat: links are not followed). */
uint64_t khub__cache_du(const char *path, int depth)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return 0;
    if (S_ISREG(sb.st_mode)) return (uint64_t)sb.st_size;
    if (!S_ISDIR(sb.st_mode) || depth > MAX_DEPTH) return 0;
    DIR *d = opendir(path);
    uint64_t total = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char child[KHUB__PATH_MAX];
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (KHUB__PATHF(child, "%s/%s", path, de->d_name))
            total += khub__cache_du(child, depth + 1);
    }
    if (d) closedir(d);
    return total;
}

static void warn(khub_cache_repo *r, const char *fmt, const char *arg)
{
    size_t n = strlen(r->warnings);
    if (n + 8 >= sizeof r->warnings) return;
    snprintf(r->warnings + n, sizeof r->warnings - n, "%s", n ? "; " : "");
    n = strlen(r->warnings);
    snprintf(r->warnings + n, sizeof r->warnings - n, fmt, arg);
}

/* A string set (blob names, commits): sorted on demand. */
typedef struct strset {
    char **v;
    size_t n, cap;
    int sorted;
    const khub_allocator *a; /* the hub's (khub__hub_alloc) */
} strset;

static int set_add(strset *s, const char *x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        char **v = khub__mem_realloc(s->a, s->v, cap * sizeof *v);
        if (!v) return 0;
        s->v = v;
        s->cap = cap;
    }
    if (!(s->v[s->n] = khub__mem_strdup(s->a, x))) return 0;
    s->n++;
    s->sorted = 0;
    return 1;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int set_has(strset *s, const char *x)
{
    if (s->n == 0) return 0;
    if (!s->sorted) qsort(s->v, s->n, sizeof *s->v, cmp_str), s->sorted = 1;
    return bsearch(&x, s->v, s->n, sizeof *s->v, cmp_str) != NULL;
}

static void set_free(strset *s)
{
    for (size_t i = 0; i < s->n; i++) khub__mem_free(s->v[i]);
    khub__mem_free(s->v);
    *s = (strset){.a = s->a};
}

/* ======================================================================== */
/* Refs and snapshots                                                       */
/* ======================================================================== */

/* Collects refs/ (recursively: refs/refs/pr/1) as "name=commit" pairs. */
static int read_refs(const char *dir, const char *rel, strset *out, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return 1; /* no refs/ */
    int ok = depth < MAX_DEPTH;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        char path[KHUB__PATH_MAX], name[512];
        struct stat sb;
        if (de->d_name[0] == '.' || !KHUB__PATHF(path, "%s/%s", dir, de->d_name) ||
            !KHUB__PATHF(name, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name) ||
            lstat(path, &sb) != 0)
            continue;
        if (S_ISDIR(sb.st_mode)) {
            ok = read_refs(path, name, out, depth + 1);
            continue;
        }
        if (!S_ISREG(sb.st_mode) || sb.st_size != 40 || strstr(de->d_name, ".tmp")) continue;
        char commit[41] = "", pair[600];
        FILE *f = khub__fopen_regular(path, NULL, 0);
        size_t got = f ? fread(commit, 1, 40, f) : 0;
        if (f) fclose(f);
        commit[got] = '\0';
        if (got != 40 || !is_hex(commit, 40)) continue;
        snprintf(pair, sizeof pair, "%s=%s", commit, name);
        ok = set_add(out, pair);
    }
    closedir(d);
    return ok;
}

/* "dev:ino" of a file: how a snapshot entry that is a hard link
 * (HF_HUB_DISABLE_SYMLINKS) is matched with the blob it shares bytes with. */
static void ino_key(const struct stat *sb, char out[48])
{
    snprintf(out, 48, "%llx:%llx", (unsigned long long)sb->st_dev, (unsigned long long)sb->st_ino);
}

typedef struct snap_walk {
    char blobs_real[PATH_MAX]; /* realpath of the repo's blobs/, "" if none */
    strset *linked;            /* blob names linked (NULL = not collected) */
    strset *inodes;            /* "dev:ino" of regular entries (NULL = not collected) */
    strset *blob_inodes;       /* of the blobs: entries that are not one are copies */
    uint64_t n_files, size;
    uint64_t copy_bytes; /* bytes of entries that are copies, not blob links */
    int broken;
} snap_walk;

/* Counts a snapshot's files; a link counts (and names a blob) only when it
 * resolves inside the repo's blobs/. */
static int walk_snapshot(snap_walk *w, const char *dir, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return 1;
    int ok = depth < MAX_DEPTH;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        char path[KHUB__PATH_MAX], real[PATH_MAX];
        struct stat sb;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            !KHUB__PATHF(path, "%s/%s", dir, de->d_name) || lstat(path, &sb) != 0)
            continue;
        if (S_ISDIR(sb.st_mode)) {
            ok = walk_snapshot(w, path, depth + 1);
        } else if (S_ISREG(sb.st_mode)) { /* HF_HUB_DISABLE_SYMLINKS: a link or a copy */
            char key[48];
            ino_key(&sb, key);
            w->n_files++;
            w->size += (uint64_t)sb.st_size;
            /* not a hard link to a blob: a copy (huggingface_hub moves a new
             * blob into the snapshot when symlinks are off, and copies it
             * into the next one), whose bytes are on disk once more */
            if (w->blob_inodes && !set_has(w->blob_inodes, key))
                w->copy_bytes += (uint64_t)sb.st_size;
            if (w->inodes) ok = set_add(w->inodes, key);
        } else if (S_ISLNK(sb.st_mode)) {
            size_t bl = strlen(w->blobs_real);
            struct stat tb;
            if (!bl || !realpath(path, real) || strncmp(real, w->blobs_real, bl) != 0 ||
                real[bl] != '/' || strchr(real + bl + 1, '/') || stat(real, &tb) != 0 ||
                !S_ISREG(tb.st_mode)) {
                w->broken++;
                continue;
            }
            w->n_files++;
            w->size += (uint64_t)tb.st_size;
            if (w->linked) ok = set_add(w->linked, real + bl + 1);
        }
    }
    closedir(d);
    return ok;
}

static void blobs_real_of(const char *repo_dir, char out[PATH_MAX])
{
    char b[KHUB__PATH_MAX];
    out[0] = '\0';
    if (KHUB__PATHF(b, "%s/blobs", repo_dir) && !realpath(b, out)) out[0] = '\0';
}

/* ======================================================================== */
/* Scan                                                                     */
/* ======================================================================== */

static int cmp_rev(const void *a, const void *b)
{
    return strcmp(((const khub_cache_rev *)a)->commit, ((const khub_cache_rev *)b)->commit);
}

static void refs_of(strset *refs, const char *commit, char *out, size_t size)
{
    out[0] = '\0';
    for (size_t i = 0; i < refs->n; i++) {
        if (strncmp(refs->v[i], commit, 40) != 0) continue;
        size_t n = strlen(out);
        snprintf(out + n, size - n, "%s%s", n ? ", " : "", refs->v[i] + 41);
    }
}

static khub_status scan_snapshots(khub_hub *hub, const char *repo_dir, khub_cache_repo *r,
                                  strset *refs, strset *blob_inodes)
{
    char sdir[KHUB__PATH_MAX];
    snprintf(sdir, sizeof sdir, "%s/snapshots", repo_dir);
    DIR *d = opendir(sdir);
    if (!d) {
        warn(r, "%s", "no snapshots/ folder");
        return KHUB_STATUS_OK;
    }
    snap_walk w;
    memset(&w, 0, sizeof w);
    blobs_real_of(repo_dir, w.blobs_real);
    w.blob_inodes = blob_inodes;
    struct dirent *de;
    khub_status st = KHUB_STATUS_OK;
    while (st == KHUB_STATUS_OK && (de = readdir(d))) {
        char path[KHUB__PATH_MAX];
        struct stat sb;
        if (de->d_name[0] == '.' || !KHUB__PATHF(path, "%s/%s", sdir, de->d_name) ||
            lstat(path, &sb) != 0)
            continue;
        if (!S_ISDIR(sb.st_mode) || !is_hex(de->d_name, 40)) {
            warn(r, "snapshots/%s is not a commit folder", de->d_name);
            continue;
        }
        khub_cache_rev *v =
            khub__mem_realloc(khub__hub_alloc(hub), r->revs, (r->n_revs + 1) * sizeof *v);
        if (!v) {
            st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "cache scan: out of memory");
            break;
        }
        r->revs = v;
        khub_cache_rev *rev = &r->revs[r->n_revs++];
        memset(rev, 0, sizeof *rev);
        snprintf(rev->commit, sizeof rev->commit, "%s", de->d_name);
        w.n_files = w.size = 0;
        walk_snapshot(&w, path, 0);
        rev->n_files = w.n_files;
        rev->size = w.size;
        refs_of(refs, rev->commit, rev->refs, sizeof rev->refs);
    }
    closedir(d);
    r->size += w.copy_bytes;
    if (w.broken) warn(r, "%s broken or outside links in snapshots/", w.broken > 1 ? "some" : "a");
    if (r->n_revs) qsort(r->revs, r->n_revs, sizeof *r->revs, cmp_rev);
    for (size_t i = 0; i < refs->n; i++) {
        khub_cache_rev key;
        snprintf(key.commit, sizeof key.commit, "%.40s", refs->v[i]);
        if (!r->n_revs || !bsearch(&key, r->revs, r->n_revs, sizeof *r->revs, cmp_rev))
            warn(r, "ref %s points to a commit with no snapshot", refs->v[i] + 41);
    }
    return st;
}

static khub_status scan_repo(khub_hub *hub, const char *folder, khub_cache_repo *r)
{
    char dir[KHUB__PATH_MAX], blobs[KHUB__PATH_MAX], refs_dir[KHUB__PATH_MAX];
    memset(r, 0, sizeof *r);
    snprintf(r->folder, sizeof r->folder, "%s", folder);
    parse_folder(folder, r->type, sizeof r->type, r->id, sizeof r->id);
    if (!KHUB__PATHF(dir, "%s/%s", hub->cache_dir, folder) ||
        !KHUB__PATHF(blobs, "%s/blobs", dir) || !KHUB__PATHF(refs_dir, "%s/refs", dir))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "cache scan: path too long: %s", folder);
    DIR *d = opendir(blobs);
    struct dirent *de;
    int incomplete = 0, ok = 1;
    strset blob_inodes = {.a = khub__hub_alloc(hub)};
    while (d && (de = readdir(d))) {
        char path[KHUB__PATH_MAX], key[48];
        struct stat sb;
        if (de->d_name[0] == '.' || !KHUB__PATHF(path, "%s/%s", blobs, de->d_name) ||
            lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (strstr(de->d_name, ".incomplete"))
            incomplete++;
        else
            r->n_blobs++;
        r->size += (uint64_t)sb.st_size;
        ino_key(&sb, key);
        ok = ok && set_add(&blob_inodes, key);
    }
    if (d) closedir(d);
    if (incomplete) warn(r, "%s partial download(s) in blobs/", incomplete > 1 ? "some" : "a");
    char kv[KHUB__PATH_MAX];
    if (KHUB__PATHF(kv, "%s/khub-variants", dir)) r->size += khub__cache_du(kv, 0);
    strset refs = {.a = khub__hub_alloc(hub)};
    if (!ok || !read_refs(refs_dir, "", &refs, 0)) {
        set_free(&refs);
        set_free(&blob_inodes);
        return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "cache scan: out of memory");
    }
    khub_status st = scan_snapshots(hub, dir, r, &refs, &blob_inodes);
    set_free(&refs);
    set_free(&blob_inodes);
    return st;
}

static int cmp_repo(const void *a, const void *b)
{
    return strcmp(((const khub_cache_repo *)a)->folder, ((const khub_cache_repo *)b)->folder);
}

khub_status khub__cache_scan(khub_hub *hub, khub_cache_report **out)
{
    khub__hub_clear(hub);
    *out = khub__mem_calloc(khub__hub_alloc(hub), 1, sizeof **out);
    if (!*out) return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "cache scan: out of memory");
    khub_cache_report *rep = *out;
    rep->struct_size = sizeof *rep;
    rep->abi_major = KHUB_API_VERSION_MAJOR; /* an application struct */
    rep->abi_minor = KHUB_API_VERSION_MINOR;
    DIR *d = NULL;
    khub_status st = cache_open(hub, &d);
    const char *name;
    while (d && st == KHUB_STATUS_OK && (name = next_repo_folder(hub, d))) {
        khub_cache_repo *v =
            khub__mem_realloc(khub__hub_alloc(hub), rep->repos, (rep->n_repos + 1) * sizeof *v);
        if (!v) {
            st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "cache scan: out of memory");
            break;
        }
        rep->repos = v;
        st = scan_repo(hub, name, &rep->repos[rep->n_repos]);
        rep->size += rep->repos[rep->n_repos].size;
        rep->n_repos++;
    }
    if (d) closedir(d);
    if (rep->n_repos) qsort(rep->repos, rep->n_repos, sizeof *rep->repos, cmp_repo);
    return st;
}

void khub__cache_report_free(khub_cache_report *r)
{
    if (!r) return;
    for (size_t i = 0; i < r->n_repos; i++) khub__mem_free(r->repos[i].revs);
    khub__mem_free(r->repos);
    khub__mem_free(r);
}

/* ======================================================================== */
/* Verify                                                                   */
/* ======================================================================== */

typedef struct verifier {
    khub_cache_item_fn fn;
    void *ud;
    uint64_t *checked, *bad, unchecked;
    char *first;             /* KHUB__PATH_MAX: the first corrupt path */
    const khub_allocator *a; /* the hub's */
} verifier;

/* Hashes path (SHA-256, else the git blob SHA-1), compares with want and
 * reports a mismatch. */
static void verify_one(verifier *v, const char *path, const char *want, int sha256)
{
    char got[65], detail[200];
    khub_status hs =
        sha256 ? khub__sha256_file_hex(path, got) : khub__git_blob_sha1_file(path, got);
    (*v->checked)++;
    if (hs == KHUB_STATUS_OK && khub__digest_eq(got, want)) return;
    (*v->bad)++;
    if (hs == KHUB_STATUS_OK)
        snprintf(detail, sizeof detail, "%s is %s, not %s", sha256 ? "SHA-256" : "git SHA-1", got,
                 want);
    else
        snprintf(detail, sizeof detail, "cannot read it");
    if (!v->first[0]) snprintf(v->first, KHUB__PATH_MAX, "%s", path);
    if (v->fn) v->fn(v->ud, "corrupt", path, detail);
}

/* Reports the copies under dir (rel inside the snapshot) that no tree
 * entry named: nothing on disk says what their bytes should be. */
static void copies_untreed(verifier *v, const char *dir, const char *rel, strset *blob_ino,
                           strset *done, int depth)
{
    DIR *d = depth < MAX_DEPTH ? opendir(dir) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char path[KHUB__PATH_MAX], sub[KHUB__PATH_MAX], key[48];
        struct stat sb;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            !KHUB__PATHF(path, "%s/%s", dir, de->d_name) ||
            !KHUB__PATHF(sub, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name) ||
            lstat(path, &sb) != 0)
            continue;
        if (S_ISDIR(sb.st_mode)) {
            copies_untreed(v, path, sub, blob_ino, done, depth + 1);
            continue;
        }
        ino_key(&sb, key);
        if (!S_ISREG(sb.st_mode) || set_has(blob_ino, key) || set_has(done, sub)) continue;
        v->unchecked++;
        if (v->fn)
            v->fn(v->ud, "unchecked", path,
                  "a copy (HF_HUB_DISABLE_SYMLINKS) that no blob or trees/ entry names a hash for");
    }
    if (d) closedir(d);
}

/* The snapshot entries of commit that are copies, not hard links to a blob
 * (huggingface_hub with HF_HUB_DISABLE_SYMLINKS moves or copies the bytes
 * there, so no blob holds them): each is checked against the hash that
 * trees/<commit>.json gives its path; one the tree does not name cannot be
 * checked and is reported as "unchecked". */
static void verify_copies(verifier *v, const char *repo_dir, const char *commit, strset *blob_ino)
{
    char tpath[KHUB__PATH_MAX], sdir[KHUB__PATH_MAX];
    khub__tree tree = {0};
    if (!KHUB__PATHF(tpath, "%s/trees/%s.json", repo_dir, commit) ||
        !KHUB__PATHF(sdir, "%s/snapshots/%s", repo_dir, commit))
        return;
    int have_tree = khub__tree_read_cache(v->a, tpath, &tree);
    strset done = {.a = v->a}; /* the paths the tree named */
    for (size_t i = 0; have_tree && i < tree.count; i++) {
        const khub__tree_entry *e = &tree.items[i];
        char path[KHUB__PATH_MAX], key[48];
        struct stat sb;
        if (e->is_dir || !KHUB__PATHF(path, "%s/%s", sdir, e->path) || lstat(path, &sb) != 0 ||
            !S_ISREG(sb.st_mode))
            continue;
        ino_key(&sb, key);
        set_add(&done, e->path);
        if (set_has(blob_ino, key)) continue; /* a hard link: its blob is checked */
        verify_one(v, path, e->lfs_sha256[0] ? e->lfs_sha256 : e->oid, e->lfs_sha256[0] != 0);
    }
    khub__tree_free(&tree);
    copies_untreed(v, sdir, "", blob_ino, &done, 0);
    set_free(&done);
}

static int matches(const khub_cache_repo *r, const char *filter)
{
    return !filter || !strcmp(filter, r->folder) || !strcmp(filter, r->id);
}

khub_status khub__cache_verify(khub_hub *hub, const char *filter, khub_cache_item_fn fn, void *ud,
                               uint64_t *checked, uint64_t *bad)
{
    khub_cache_report *rep = NULL;
    *checked = *bad = 0;
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_scan(hub, &rep));
    size_t hit = 0;
    char first[KHUB__PATH_MAX] = "";
    verifier v = {.fn = fn,
                  .ud = ud,
                  .checked = checked,
                  .bad = bad,
                  .first = first,
                  .a = khub__hub_alloc(hub)};
    khub__tmp_walk stale = {.fn = fn, .ud = ud, .kind = "stale"};
    for (size_t i = 0; i < rep->n_repos; i++) {
        if (!matches(&rep->repos[i], filter)) continue;
        hit++;
        char blobs[KHUB__PATH_MAX], repo_dir[KHUB__PATH_MAX];
        snprintf(repo_dir, sizeof repo_dir, "%s/%s", hub->cache_dir, rep->repos[i].folder);
        snprintf(blobs, sizeof blobs, "%s/blobs", repo_dir);
        strset blob_ino = {.a = khub__hub_alloc(hub)};
        DIR *d = opendir(blobs);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            char path[KHUB__PATH_MAX], key[48];
            size_t n = strlen(de->d_name);
            struct stat sb;
            if ((n != 40 && n != 64) || !is_hex(de->d_name, n) ||
                !KHUB__PATHF(path, "%s/%s", blobs, de->d_name) || lstat(path, &sb) != 0 ||
                !S_ISREG(sb.st_mode))
                continue;
            ino_key(&sb, key);
            set_add(&blob_ino, key);
            verify_one(&v, path, de->d_name, n == 64);
        }
        if (d) closedir(d);
        for (size_t k = 0; k < rep->repos[i].n_revs; k++)
            verify_copies(&v, repo_dir, rep->repos[i].revs[k].commit, &blob_ino);
        set_free(&blob_ino);
        khub__cache_debris_walk(&stale, repo_dir);
    }
    khub__cache_report_free(rep);
    if (filter && !hit)
        return khub__hub_fail(hub, KHUB_STATUS_NOT_FOUND,
                              "cache verify: no repo %s in %s (see khub cache ls)", filter,
                              hub->cache_dir);
    if (*bad)
        return khub__hub_fail(hub, KHUB_STATUS_DIGEST_MISMATCH,
                              "cache verify: %llu of %llu files are corrupt (first: %s); "
                              "delete them and download again",
                              (unsigned long long)*bad, (unsigned long long)*checked, first);
    if (stale.n)
        return khub__hub_fail(hub, KHUB_STATUS_IO,
                              "cache verify: %llu stale temporary name%s left by interrupted "
                              "downloads (first: %s); run khub cache prune to remove them",
                              (unsigned long long)stale.n, stale.n > 1 ? "s" : "", stale.first);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Prune                                                                    */
/* ======================================================================== */

typedef struct pruner {
    khub_hub *hub;
    int dry_run;
    khub_cache_item_fn fn;
    void *ud;
    uint64_t freed;
} pruner;

static void drop(pruner *p, const char *kind, const char *path, int is_dir)
{
    uint64_t bytes = khub__cache_du(path, 0);
    char detail[64];
    snprintf(detail, sizeof detail, "%llu bytes", (unsigned long long)bytes);
    if (p->fn) p->fn(p->ud, kind, path, detail);
    p->freed += bytes;
    if (p->dry_run) return;
    if (is_dir)
        khub__rmtree(path);
    else
        unlink(path);
}

static void drop_if_exists(pruner *p, const char *kind, const char *dir, const char *name,
                           const char *suffix, int is_dir)
{
    char path[KHUB__PATH_MAX];
    struct stat sb;
    if (KHUB__PATHF(path, "%s/%s%s", dir, name, suffix) && lstat(path, &sb) == 0)
        drop(p, kind, path, is_dir && S_ISDIR(sb.st_mode));
}

static khub_status prune_repo(pruner *p, const char *folder)
{
    char dir[KHUB__PATH_MAX], sdir[KHUB__PATH_MAX], sub[KHUB__PATH_MAX];
    const khub_allocator *a = khub__hub_alloc(p->hub);
    strset refs = {.a = a}, linked = {.a = a}, inodes = {.a = a};
    snprintf(dir, sizeof dir, "%s/%s", p->hub->cache_dir, folder);
    snprintf(sdir, sizeof sdir, "%s/snapshots", dir);
    snprintf(sub, sizeof sub, "%s/refs", dir);
    if (!read_refs(sub, "", &refs, 0)) goto oom;
    for (size_t i = 0; i < refs.n; i++) refs.v[i][40] = '\0'; /* keep the commit only */
    refs.sorted = 0;
    snap_walk w;
    memset(&w, 0, sizeof w);
    blobs_real_of(dir, w.blobs_real);
    w.linked = &linked;
    w.inodes = &inodes;
    DIR *d = opendir(sdir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char path[KHUB__PATH_MAX];
        struct stat sb;
        if (de->d_name[0] == '.' || !KHUB__PATHF(path, "%s/%s", sdir, de->d_name) ||
            lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        if (set_has(&refs, de->d_name)) {
            if (!walk_snapshot(&w, path, 0)) {
                closedir(d);
                goto oom;
            }
            continue;
        }
        drop(p, "snapshot", path, 1);
        char tdir[KHUB__PATH_MAX];
        snprintf(tdir, sizeof tdir, "%s/trees", dir);
        drop_if_exists(p, "tree", tdir, de->d_name, ".json", 0);
        snprintf(tdir, sizeof tdir, "%s/.no_exist", dir);
        drop_if_exists(p, "no_exist", tdir, de->d_name, "", 1);
        snprintf(tdir, sizeof tdir, "%s/khub-variants", dir);
        drop_if_exists(p, "variants", tdir, de->d_name, "", 1);
    }
    if (d) closedir(d);
    snprintf(sub, sizeof sub, "%s/blobs", dir);
    d = opendir(sub);
    while (d && (de = readdir(d))) {
        char path[KHUB__PATH_MAX], key[48];
        struct stat sb;
        if (de->d_name[0] == '.' || strchr(de->d_name, '.') || set_has(&linked, de->d_name) ||
            !KHUB__PATHF(path, "%s/%s", sub, de->d_name) || lstat(path, &sb) != 0 ||
            !S_ISREG(sb.st_mode))
            continue; /* in-flight "<etag>.<x>.incomplete" names have a '.' */
        ino_key(&sb, key);
        if (set_has(&inodes, key)) continue; /* a kept snapshot's hard link to it */
        drop(p, "blob", path, 0);
    }
    if (d) closedir(d);
    khub__tmp_walk tw = {
        .fn = p->fn, .ud = p->ud, .kind = "temporary", .remove = 1, .dry_run = p->dry_run};
    khub__cache_debris_walk(&tw, dir);
    p->freed += tw.bytes;
    set_free(&refs);
    set_free(&linked);
    set_free(&inodes);
    return KHUB_STATUS_OK;
oom:
    set_free(&refs);
    set_free(&linked);
    set_free(&inodes);
    return khub__hub_fail(p->hub, KHUB_STATUS_NOMEM, "cache prune: out of memory");
}

khub_status khub__cache_prune(khub_hub *hub, int dry_run, khub_cache_item_fn fn, void *ud,
                              uint64_t *freed)
{
    khub__hub_clear(hub);
    pruner p = {.hub = hub, .dry_run = dry_run, .fn = fn, .ud = ud};
    *freed = 0;
    DIR *d = NULL;
    khub_status st = cache_open(hub, &d);
    const char *name;
    while (d && st == KHUB_STATUS_OK && (name = next_repo_folder(hub, d)))
        st = prune_repo(&p, name);
    if (d) closedir(d);
    *freed = p.freed;
    return st;
}
