/*
 * cache.c: huggingface_hub's cache layout, written so that a crash or a
 * concurrent writer never leaves a visible partial file.
 *
 *   <root>/<type>s--<org>--<name>/blobs/<etag>           verified content
 *                                 blobs/<etag>.<8hex>.incomplete   in flight
 *                                 refs/<rev>              40 hex, no newline
 *                                 snapshots/<commit>/<path> -> ../../blobs/<etag>
 *                                 trees/<commit>.json     format_version 1
 *                                 .no_exist/<commit>/<path>   empty: path is not there
 *                                 .khub-tmp/<pid>.<8hex>  temporaries, renamed into place
 *   <root>/.locks/<repo folder>/<etag>.lock               per-blob flock
 *
 * Every visible name appears by rename(2) of a fully written, fsync'ed temp
 * file; the directory is fsync'ed after. Orphaned .incomplete files (a
 * killed download) are only touched while holding the blob's lock.
 * Snapshot links and unpacked archives are built in .khub-tmp/ and renamed
 * into their folder, so a folder another process verifies never shows a
 * temporary name (issue 10 item 7); `khub cache prune` clears debris there.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "hub_impl.h"

/* ======================================================================== */
/* Paths                                                                    */
/* ======================================================================== */

/* KHUB_CACHE, then huggingface_hub's order: HF_HUB_CACHE,
 * HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub,
 * ~/.cache/huggingface/hub; each value expanded as huggingface_hub expands
 * it ("~", "$VAR": hf_env.c), so both tools land in the same folder. */
khub_status khub__cache_default_dir(khub_hub *hub, char **out)
{
    static const struct {
        const char *var, *suffix;
    } order[] = {{"KHUB_CACHE", ""},
                 {"HF_HUB_CACHE", ""},
                 {"HUGGINGFACE_HUB_CACHE", ""},
                 {"HF_HOME", "/hub"},
                 {"XDG_CACHE_HOME", "/huggingface/hub"},
                 {"HOME", "/.cache/huggingface/hub"}};
    char val[KHUB__PATH_MAX], buf[KHUB__PATH_MAX];
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        int got = khub__env_path(order[i].var, val, sizeof val);
        if (got < 0 || (got && !KHUB__PATHF(buf, "%s%s", val, order[i].suffix)))
            return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "%s: the cache path is too long",
                                  order[i].var);
        if (!got) continue;
        *out = khub__mem_strdup(khub__hub_alloc(hub), buf);
        return *out ? KHUB_STATUS_OK : khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
    }
    return khub__hub_fail(hub, KHUB_STATUS_NOT_FOUND,
                          "no cache directory: set KHUB_CACHE, HF_HUB_CACHE or HOME");
}

khub_status khub__cache_repo_folder(khub_hub *hub, const khub_hub_id *id, char *buf, size_t size)
{
    if (!khub__concat(buf, size,
                      (const char *const[]){khub__repo_api_type(hub, id), "--", id->org, "--",
                                            id->name, NULL}))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "repo folder name too long");
    return KHUB_STATUS_OK;
}

khub_status khub__cache_repo_dir(khub_hub *hub, const khub_hub_id *id, char *buf, size_t size)
{
    char folder[256];
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_repo_folder(hub, id, folder, sizeof folder));
    if (!khub__concat(buf, size, (const char *const[]){hub->cache_dir, "/", folder, NULL}))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "cache path too long: %s", folder);
    return KHUB_STATUS_OK;
}

khub_status khub__mkdirs(khub_hub *hub, const char *path)
{
    char buf[KHUB__PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "path too long: %.100s...", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot create directory %s: %s", buf,
                                      strerror(errno));
            *p = c;
            if (c == '\0') break;
        }
    }
    return KHUB_STATUS_OK;
}

static void fsync_dir_of(const char *path)
{
    char dir[KHUB__PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return;
    *slash = '\0';
    int fd = open(dir[0] ? dir : "/", O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static void random_hex8(char out[9])
{
    unsigned char r[4] = {0};
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        unsigned v = (unsigned)getpid() ^ (unsigned)(uintptr_t)out;
        memcpy(r, &v, sizeof r);
    }
    snprintf(out, 9, "%02x%02x%02x%02x", r[0], r[1], r[2], r[3]);
}

static mode_t file_mode(void)
{
    mode_t m = umask(0);
    umask(m);
    return 0666 & ~m;
}

khub_status khub__atomic_write(khub_hub *hub, const char *path, const void *data, size_t n)
{
    char tmp[KHUB__PATH_MAX], hex[9];
    random_hex8(hex);
    if (snprintf(tmp, sizeof tmp, "%s.%s.tmp", path, hex) >= (int)sizeof tmp)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "path too long: %.100s...", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot create %s: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) goto fail;
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || fchmod(fd, file_mode()) != 0) goto fail;
    close(fd);
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot rename %s to %s: %s", tmp, path,
                              strerror(e));
    }
    fsync_dir_of(path);
    return KHUB_STATUS_OK;
fail:;
    int e = errno;
    close(fd);
    unlink(tmp);
    return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot write %s: %s", tmp, strerror(e));
}

/* ======================================================================== */
/* Refs                                                                     */
/* ======================================================================== */

static khub_status ref_path(khub_hub *hub, const char *repo_dir, const char *rev, char *buf,
                            size_t size)
{
    if (!khub__path_is_safe(rev))
        return khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH, "revision \"%s\" is not a safe name",
                              rev);
    if (snprintf(buf, size, "%s/refs/%s", repo_dir, rev) >= (int)size)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "ref path too long for %s", rev);
    return KHUB_STATUS_OK;
}

khub_status khub__cache_read_ref(khub_hub *hub, const char *repo_dir, const char *rev,
                                 char commit[41])
{
    char path[KHUB__PATH_MAX];
    KHUB_FORWARD_IF_ERROR(NULL, ref_path(hub, repo_dir, rev, path, sizeof path));
    FILE *f = khub__fopen_regular(path, NULL, 0); /* a FIFO planted there hangs nothing */
    if (!f) return KHUB_STATUS_NOT_FOUND;         /* the caller words the "not cached" message */
    char buf[64];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (n != 40 || !khub__is_commit_hex(buf))
        return khub__hub_fail(hub, KHUB_STATUS_PARSE,
                              "%s: a ref file must hold exactly 40 lowercase hex digits; delete "
                              "it and resolve again online",
                              path);
    memcpy(commit, buf, 41);
    return KHUB_STATUS_OK;
}

khub_status khub__cache_write_ref(khub_hub *hub, const char *repo_dir, const char *rev,
                                  const char *commit)
{
    KHUB_ASSERT(khub__is_commit_hex(commit));
    char path[KHUB__PATH_MAX], old[41];
    KHUB_FORWARD_IF_ERROR(NULL, ref_path(hub, repo_dir, rev, path, sizeof path));
    int saved = hub->err_set;
    hub->err_set = 1; /* a malformed old ref is simply replaced */
    khub_status rs = khub__cache_read_ref(hub, repo_dir, rev, old);
    hub->err_set = saved;
    if (rs == KHUB_STATUS_OK && strcmp(old, commit) == 0) return KHUB_STATUS_OK;
    char dir[KHUB__PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    KHUB_FORWARD_IF_ERROR(NULL, khub__mkdirs(hub, dir));
    return khub__atomic_write(hub, path, commit, 40);
}

void khub__cache_tag(khub_hub *hub)
{
    char path[KHUB__PATH_MAX];
    snprintf(path, sizeof path, "%s/CACHEDIR.TAG", hub->cache_dir);
    if (access(path, F_OK) == 0) return;
    static const char tag[] = "Signature: 8a477f597d28d172789f06886806bc55\n"
                              "# This file is a cache directory tag created by khub.\n"
                              "# For information about cache directory tags, see:\n"
                              "#\thttps://bford.info/cachedir/\n";
    int saved = hub->err_set;
    hub->err_set = 1; /* best effort */
    khub__atomic_write(hub, path, tag, sizeof tag - 1);
    hub->err_set = saved;
}

/* ======================================================================== */
/* Blobs                                                                    */
/* ======================================================================== */

khub_status khub__cache_lock(khub_hub *hub, const char *folder, const char *etag, int *fd_out)
{
    char dir[KHUB__PATH_MAX], path[KHUB__PATH_MAX];
    snprintf(dir, sizeof dir, "%s/.locks/%s", hub->cache_dir, folder);
    KHUB_FORWARD_IF_ERROR(NULL, khub__mkdirs(hub, dir));
    if (snprintf(path, sizeof path, "%s/%s.lock", dir, etag) >= (int)sizeof path)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "lock path too long");
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0664);
    if (fd < 0)
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot open lock %s: %s", path,
                              strerror(errno));
    while (flock(fd, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        int e = errno;
        close(fd);
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot lock %s: %s", path, strerror(e));
    }
    *fd_out = fd;
    return KHUB_STATUS_OK;
}

void khub__cache_unlock(int fd)
{
    if (fd >= 0) close(fd); /* releases the flock */
}

/* An orphan of etag: "<etag>.incomplete" (old huggingface_hub, shared) or
 * "<etag>.<8hex>.incomplete". */
static int is_orphan_of(const char *name, const char *etag)
{
    size_t el = strlen(etag), n = strlen(name);
    if (strncmp(name, etag, el) != 0 || name[el] != '.') return 0;
    const char *suffix = ".incomplete";
    size_t sl = strlen(suffix);
    return n >= el + sl && strcmp(name + n - sl, suffix) == 0;
}

khub_status khub__cache_blob_tmp(khub_hub *hub, const char *repo_dir, const char *etag, char *tmp,
                                 size_t size, int *fd_out, uint64_t *have)
{
    char blobs[KHUB__PATH_MAX], hex[9];
    snprintf(blobs, sizeof blobs, "%s/blobs", repo_dir);
    KHUB_FORWARD_IF_ERROR(NULL, khub__mkdirs(hub, blobs));
    random_hex8(hex);
    if (snprintf(tmp, size, "%s/%s.%s.incomplete", blobs, etag, hex) >= (int)size)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "blob path too long");
    *have = 0;
    int adopted = 0;
    DIR *d = opendir(blobs);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!is_orphan_of(de->d_name, etag)) continue;
        char path[KHUB__PATH_MAX];
        if (!KHUB__PATHF(path, "%s/%s", blobs, de->d_name)) continue;
        struct stat sb;
        if (!adopted && lstat(path, &sb) == 0 && S_ISREG(sb.st_mode) && rename(path, tmp) == 0) {
            adopted = 1;
            *have = (uint64_t)sb.st_size;
        } else {
            unlink(path);
        }
    }
    if (d) closedir(d);
    int fd = adopted ? open(tmp, O_RDWR | O_APPEND | O_NOFOLLOW | O_CLOEXEC)
                     : open(tmp, O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot create %s: %s", tmp, strerror(errno));
    *fd_out = fd;
    return KHUB_STATUS_OK;
}

khub_status khub__cache_publish_blob(khub_hub *hub, int fd, const char *tmp, const char *blob)
{
    if (fsync(fd) != 0 || fchmod(fd, file_mode()) != 0) {
        int e = errno;
        close(fd);
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot sync %s: %s", tmp, strerror(e));
    }
    close(fd);
    if (rename(tmp, blob) != 0)
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot publish %s: %s", blob, strerror(errno));
    fsync_dir_of(blob);
    return KHUB_STATUS_OK;
}

/* HF_HUB_DISABLE_SYMLINKS (truthy as huggingface_hub reads it): snapshot
 * entries are regular files instead of links, for file systems and tools
 * that cannot follow symlinks. */
static bool symlinks_disabled(void) { return khub__env_truthy("HF_HUB_DISABLE_SYMLINKS"); }

/* The blob as a regular file at link: a hard link where the file system
 * has them (no second copy of the bytes), else a copy; through tmp and a
 * rename either way, so the entry never appears half written. */
static khub_status place_copy(khub_hub *hub, const char *repo_dir, const char *etag,
                              const char *tmp, const char *dst)
{
    char blob[KHUB__PATH_MAX];
    if (!KHUB__PATHF(blob, "%s/blobs/%s", repo_dir, etag))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "blob path too long");
    struct stat cur, src;
    if (stat(dst, &cur) == 0 && stat(blob, &src) == 0 && cur.st_ino == src.st_ino &&
        cur.st_dev == src.st_dev)
        return KHUB_STATUS_OK; /* already this blob */
    khub_status st = KHUB_STATUS_OK;
    if (link(blob, tmp) != 0) {
        int in = khub__open_regular(blob, NULL, 0);
        int out = in < 0 ? -1 : open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, file_mode());
        char buf[1 << 16];
        ssize_t r = 0;
        while (out >= 0 && (r = read(in, buf, sizeof buf)) > 0)
            if (write(out, buf, (size_t)r) != r) {
                r = -1;
                break;
            }
        if (in < 0 || out < 0 || r < 0 || fsync(out) != 0)
            st = khub__hub_fail(hub, KHUB_STATUS_IO, "cannot copy %s to %s: %s", blob, tmp,
                                strerror(errno));
        if (in >= 0) close(in);
        if (out >= 0) close(out);
    }
    if (st == KHUB_STATUS_OK && rename(tmp, dst) != 0)
        st = khub__hub_fail(hub, KHUB_STATUS_IO, "cannot place %s: %s", dst, strerror(errno));
    if (st != KHUB_STATUS_OK) unlink(tmp);
    return st;
}

khub_status khub__cache_tmp_path(khub_hub *hub, const char *repo_dir, char *out, size_t size)
{
    char dir[KHUB__PATH_MAX], hex[9];
    if (!KHUB__PATHF(dir, "%s/" KHUB__TMP_DIR, repo_dir))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "cache path too long: %.100s", repo_dir);
    KHUB_FORWARD_IF_ERROR(NULL, khub__mkdirs(hub, dir));
    random_hex8(hex);
    if (snprintf(out, size, "%s/%d.%s", dir, (int)getpid(), hex) >= (int)size)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "cache path too long: %.100s", repo_dir);
    return KHUB_STATUS_OK;
}

bool khub__cache_tmp_stale(const char *path, const char *name)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return false;
    time_t age = time(NULL) - sb.st_mtime;
    char *end = NULL;
    long pid = strtol(name, &end, 10);
    bool owner_gone =
        end != name && *end == '.' && pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    return (owner_gone && age >= 60) || age >= KHUB__TMP_STALE_S;
}

/* .no_exist/<commit>/<rel>: huggingface_hub's empty marker for "rel is not
 * in that commit", written after a 404 EntryNotFound. A commit never
 * changes, so the marker stays true. */
static bool absent_path(const char *repo_dir, const char *commit, const char *rel,
                        char out[KHUB__PATH_MAX])
{
    return khub__path_is_safe(rel) && snprintf(out, KHUB__PATH_MAX, "%s/.no_exist/%s/%s", repo_dir,
                                               commit, rel) < KHUB__PATH_MAX;
}

bool khub__cache_is_absent(const char *repo_dir, const char *commit, const char *rel)
{
    char path[KHUB__PATH_MAX];
    struct stat sb;
    return absent_path(repo_dir, commit, rel, path) && lstat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

void khub__cache_mark_absent(khub_hub *hub, const char *repo_dir, const char *commit,
                             const char *rel)
{
    char path[KHUB__PATH_MAX], dir[KHUB__PATH_MAX];
    if (!khub__is_commit_hex(commit) || !absent_path(repo_dir, commit, rel, path)) return;
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    /* Best effort: a read-only cache just gets no marker (and the caller's
     * error, set first, stays the one reported). */
    if (khub__mkdirs(hub, dir) != KHUB_STATUS_OK) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, file_mode());
    if (fd >= 0) close(fd);
}

khub_status khub__cache_link(khub_hub *hub, const char *repo_dir, const char *commit,
                             const char *rel, const char *etag)
{
    if (!khub__path_is_safe(rel))
        return khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH,
                              "refusing repo path \"%.200s\": it escapes the snapshot", rel);
    char link[KHUB__PATH_MAX], target[KHUB__PATH_MAX], tmp[KHUB__PATH_MAX];
    if (snprintf(link, sizeof link, "%s/snapshots/%s/%s", repo_dir, commit, rel) >=
        (int)sizeof link)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "snapshot path too long: %.100s", rel);
    /* ../ once for snapshots/<commit>/ and once per directory inside rel. */
    size_t depth = 2, pos = 0;
    for (const char *p = rel; *p; p++) depth += *p == '/';
    target[0] = '\0';
    for (size_t i = 0; i < depth; i++) pos += (size_t)snprintf(target + pos, 4, "../");
    snprintf(target + pos, sizeof target - pos, "blobs/%s", etag);
    char dir[KHUB__PATH_MAX];
    snprintf(dir, sizeof dir, "%s", link);
    *strrchr(dir, '/') = '\0';
    KHUB_FORWARD_IF_ERROR(NULL, khub__mkdirs(hub, dir));
    char cur[KHUB__PATH_MAX];
    ssize_t cn = readlink(link, cur, sizeof cur - 1);
    if (cn >= 0) {
        cur[cn] = '\0';
        if (strcmp(cur, target) == 0) return KHUB_STATUS_OK;
    }
    /* The temporary is built outside the snapshot: a verifier listing the
     * variant folder meanwhile (another process) must never see it. The
     * link's target is relative to where it ends up, not where it is made. */
    KHUB_FORWARD_IF_ERROR(NULL, khub__cache_tmp_path(hub, repo_dir, tmp, sizeof tmp));
    if (symlinks_disabled()) return place_copy(hub, repo_dir, etag, tmp, link);
    if (symlink(target, tmp) != 0 || rename(tmp, link) != 0) {
        int e = errno;
        unlink(tmp);
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot link %s: %s", link, strerror(e));
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Tree listings                                                            */
/* ======================================================================== */

khub_status khub__cache_write_tree(khub_hub *hub, const char *repo_dir, const char *commit,
                                   const khub__tree *t)
{
    cJSON *root = cJSON_CreateObject(), *files = cJSON_CreateObject();
    if (!root || !files) {
        cJSON_Delete(root);
        cJSON_Delete(files);
        return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory writing the tree");
    }
    cJSON_AddNumberToObject(root, "format_version", 1);
    cJSON_AddItemToObject(root, "files", files);
    for (size_t i = 0; i < t->count; i++) {
        const khub__tree_entry *e = &t->items[i];
        if (e->is_dir) continue;
        cJSON *f = cJSON_CreateObject();
        cJSON_AddNumberToObject(f, "size", (double)e->size);
        cJSON_AddStringToObject(f, "blob_id", e->oid);
        if (e->lfs_sha256[0]) {
            cJSON_AddStringToObject(f, "lfs_sha256", e->lfs_sha256);
            cJSON_AddNumberToObject(f, "lfs_size", (double)e->size);
        }
        cJSON_AddItemToObject(files, e->path, f);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory writing the tree");
    char dir[KHUB__PATH_MAX], path[KHUB__PATH_MAX];
    snprintf(dir, sizeof dir, "%s/trees", repo_dir);
    khub_status st = khub__mkdirs(hub, dir);
    if (st == KHUB_STATUS_OK) {
        st = KHUB__PATHF(path, "%s/%s.json", dir, commit)
                 ? khub__atomic_write(hub, path, text, strlen(text))
                 : khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "tree path too long");
    }
    cJSON_free(text);
    return st;
}
