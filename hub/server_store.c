/*
 * server_store.c: the repos folder of `khub serve` on disk (layout in
 * docs/hub-server.md):
 *
 *   <dir>/<org>/<name>/refs.json          {"branches":{"main":"<sha>"},"tags":{},"lfs":[globs],
 *                                          "type"?: "kernel" or "model"}
 *   <dir>/<org>/<name>/commits/<sha>/...  the files of each commit
 *   <dir>/<org>/<name>/lfs/<sha256>       uploaded LFS objects
 *   <dir>/<org>/<name>/log/<sha>.json     a commit made by the server: parent,
 *                                          title, message, date, and the paths
 *                                          stored through LFS ("lfs")
 *   <dir>/<org>/.org.json                 optional organisation overview
 *                                          ({"trustedKernelPublisher": true})
 *
 * Reading it (a repo, a revision, the LFS globs) and changing it: every
 * file is replaced by a temp file, fsync and rename, never written in
 * place, so a crash leaves the old state and hard links between commits
 * stay safe.
 */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server_impl.h"

/* ======================================================================== */
/* Repos                                                                    */
/* ======================================================================== */

char *khub__srv_read_file(const char *path, size_t *n_out, size_t max)
{
    FILE *f = khub__fopen_regular(path, NULL, 0); /* a FIFO in DIR hangs no thread */
    if (!f) return NULL;
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (buf && fread(buf, 1, n, f) != n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (n_out) *n_out = n;
    return buf;
}

int khub__srv_repo_open(const khub__server *s, const char *org, const char *name, repo *r)
{
    char text[2 * KHUB_HUB_NAME_MAX + 2];
    khub_hub_id id;
    memset(r, 0, sizeof *r);
    if (snprintf(text, sizeof text, "%s/%s", org, name) >= (int)sizeof text) return 0;
    if (khub_hub_id_parse(text, &id, NULL, 0) != KHUB_STATUS_OK || id.rev_kind || id.symbol[0])
        return 0;
    snprintf(r->org, sizeof r->org, "%s", id.org);
    snprintf(r->name, sizeof r->name, "%s", id.name);
    snprintf(r->root, sizeof r->root, "%s/%s/%s", s->dir, id.org, id.name);
    r->dc = s->dc;
    char path[KHUB__PATH_MAX];
    if (!KHUB__PATHF(path, "%s/refs.json", r->root)) return 0;
    char *json = khub__srv_read_file(path, NULL, 1 << 20);
    if (!json) return 0;
    r->refs = cJSON_Parse(json);
    free(json);
    r->memo = calloc(1, sizeof *r->memo);
    return r->refs != NULL && r->memo != NULL;
}

void khub__srv_repo_close(repo *r)
{
    cJSON_Delete(r->refs);
    if (r->memo) {
        cJSON_Delete(r->memo->log);
        khub__srv_path_set_free(&r->memo->lfs_at);
    }
    free(r->memo);
    r->memo = NULL;
}

int khub__srv_repo_is_type(const repo *r, const char *type)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r->refs, "type");
    return !t || (cJSON_IsString(t) && !strcmp(t->valuestring, type));
}

/* Branch, tag, or an existing commit directory; 0 when unknown. A full
 * ref name (refs/heads/v1, refs/tags/v1.0.0), as the refs listing's "ref"
 * gives it and the kernels library passes it back, names only that kind. */
int khub__srv_repo_resolve(const repo *r, const char *rev, char commit[41])
{
    const char *kinds[] = {"branches", "tags"}, *full[] = {"refs/heads/", "refs/tags/"};
    for (int k = 0; k < 2; k++) {
        const char *name = rev;
        size_t fl = strlen(full[k]);
        if (!strncmp(rev, full[k], fl))
            name = rev + fl;
        else if (!strncmp(rev, "refs/", 5))
            continue;
        cJSON *t = cJSON_GetObjectItemCaseSensitive(r->refs, kinds[k]);
        cJSON *v = cJSON_GetObjectItemCaseSensitive(t, name);
        if (cJSON_IsString(v) && khub__is_commit_hex(v->valuestring)) {
            memcpy(commit, v->valuestring, 41);
            return 1;
        }
    }
    if (!khub__is_commit_hex(rev)) return 0;
    char path[KHUB__PATH_MAX];
    struct stat sb;
    if (!KHUB__PATHF(path, "%s/commits/%s", r->root, rev)) return 0;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    memcpy(commit, rev, 41);
    return 1;
}

int khub__srv_repo_is_lfs(const repo *r, const char *path)
{
    static const char *defaults[] = {"*.so",  "*.tar.gz",      "*.cubin", "*.ptx",
                                     "*.bin", "*.safetensors", "*.gguf"};
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    cJSON *l = cJSON_GetObjectItemCaseSensitive(r->refs, "lfs"), *g;
    if (cJSON_IsArray(l)) {
        cJSON_ArrayForEach(g, l) if (cJSON_IsString(g) &&
                                     fnmatch(g->valuestring, base, 0) == 0) return 1;
        return 0;
    }
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (fnmatch(defaults[i], base, 0) == 0) return 1;
    return 0;
}

/* Indexes the memo's log's LFS marks by path: a tree listing or paths-info
 * asks about each of up to 10,000 paths, and walking up to 100,000 marks by
 * name for each (anyone may ask) was O(paths x marks). */
static void memo_index_marks(repo_memo *m)
{
    khub__srv_path_set_free(&m->lfs_at);
    m->indexed = 1;
    const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(m->log, "lfs"), *e;
    if (!cJSON_IsObject(lfs)) return;
    cJSON_ArrayForEach(e, lfs)
    {
        if (e->string && khub__srv_path_set_add(&m->lfs_at, e->string, (void *)e) < 0) {
            khub__srv_path_set_free(&m->lfs_at);
            m->indexed = 0;
            return;
        }
    }
}

/* The commit's log entry (log/<commit>.json), read once per request; NULL
 * for a commit the server did not make (a folder written by hand). */
const cJSON *khub__srv_commit_log(const repo *r, const char *commit)
{
    if (!r->memo || !khub__is_commit_hex(commit)) return NULL;
    if (strcmp(r->memo->commit, commit) != 0) {
        char path[KHUB__PATH_MAX];
        cJSON_Delete(r->memo->log);
        r->memo->log = NULL;
        snprintf(r->memo->commit, sizeof r->memo->commit, "%s", commit);
        char *text = KHUB__PATHF(path, "%s/log/%s.json", r->root, commit)
                         ? khub__srv_read_file(path, NULL, 64u << 20)
                         : NULL;
        r->memo->log = text ? cJSON_Parse(text) : NULL;
        free(text);
        memo_index_marks(r->memo);
    }
    return r->memo->log;
}

int khub__srv_is_lfs_at(const repo *r, const char *commit, const char *path)
{
    if (khub__srv_repo_is_lfs(r, path)) return 1;
    const cJSON *log = khub__srv_commit_log(r, commit); /* reads and indexes it once */
    if (r->memo && r->memo->indexed)
        return cJSON_IsTrue((const cJSON *)khub__srv_path_set_get(&r->memo->lfs_at, path));
    return cJSON_IsTrue(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(log, "lfs"), path));
}

void khub__srv_commit_dir(const repo *r, const char *commit, char *buf, size_t size)
{
    if (snprintf(buf, size, "%s/commits/%s", r->root, commit) >= (int)size) buf[0] = '\0';
}

/* ======================================================================== */
/* Atomic changes                                                           */
/* ======================================================================== */

int khub__srv_fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    int ok = fsync(fd) == 0;
    close(fd);
    return ok;
}

/* Writes data to path via a temp file in the same directory, fsync, rename. */
int khub__srv_write_atomic(const char *path, const void *data, size_t n)
{
    char tmp[KHUB__PATH_MAX];
    if (!KHUB__PATHF(tmp, "%s.tmp-XXXXXX", path)) return 0;
    int fd = mkstemp(tmp);
    if (fd < 0) return 0;
    const char *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w <= 0) break;
        p += w;
        left -= (size_t)w;
    }
    int ok = left == 0 && fchmod(fd, 0644) == 0 && fsync(fd) == 0;
    close(fd);
    if (ok && rename(tmp, path) == 0) {
        char dir[KHUB__PATH_MAX];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0', khub__srv_fsync_path(dir);
        return 1;
    }
    unlink(tmp);
    return 0;
}

int khub__srv_mkdirs_under(const char *root, const char *rel_dir)
{
    char path[KHUB__PATH_MAX];
    if (!KHUB__PATHF(path, "%s/%s", root, rel_dir)) return 0;
    for (char *p = path + strlen(root) + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            struct stat sb;
            if (mkdir(path, 0755) != 0 &&
                (errno != EEXIST || lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)))
                return 0;
            if (!c) return 1;
            *p = c;
        }
    }
}

int khub__srv_refs_save(const repo *r)
{
    char path[KHUB__PATH_MAX];
    char *text = cJSON_PrintUnformatted(r->refs);
    int ok = text && KHUB__PATHF(path, "%s/refs.json", r->root) &&
             khub__srv_write_atomic(path, text, strlen(text));
    free(text);
    return ok;
}

cJSON *khub__srv_refs_table(const repo *r, const char *kind)
{
    cJSON *t = cJSON_GetObjectItemCaseSensitive(r->refs, kind);
    if (!cJSON_IsObject(t)) {
        cJSON_DeleteItemFromObjectCaseSensitive(r->refs, kind);
        t = cJSON_AddObjectToObject(r->refs, kind);
    }
    return t;
}

void khub__srv_refs_set(const repo *r, const char *kind, const char *name, const char *commit)
{
    cJSON *t = khub__srv_refs_table(r, kind);
    cJSON_DeleteItemFromObjectCaseSensitive(t, name);
    cJSON_AddStringToObject(t, name, commit);
}

const char *khub__srv_branch_head(const repo *r, const char *branch)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(r->refs, "branches"), branch);
    return cJSON_IsString(v) && khub__is_commit_hex(v->valuestring) ? v->valuestring : NULL;
}

/* ======================================================================== */
/* Commit ids                                                               */
/* ======================================================================== */

void khub__srv_random_hex(char *out, size_t n_bytes)
{
    static const char d[] = "0123456789abcdef";
    unsigned char b[64];
    if (n_bytes > sizeof b) n_bytes = sizeof b;
    if (getrandom(b, n_bytes, 0) != (ssize_t)n_bytes) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        for (size_t i = 0; i < n_bytes; i++) b[i] = (unsigned char)((ts.tv_nsec >> (i % 24)) ^ i);
    }
    for (size_t i = 0; i < n_bytes; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n_bytes] = '\0';
}

/* A fresh 40-hex commit id: sha1-sized, from the parent, the message, the
 * time and 16 random bytes (not a git commit hash: there is no git here). */
void khub__srv_new_commit_id(const char *parent, const char *summary, char id[41])
{
    char text[1024], rnd[33], hex[65];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    khub__srv_random_hex(rnd, 16);
    snprintf(text, sizeof text, "%s\n%.500s\n%lld.%09ld\n%s", parent ? parent : "", summary,
             (long long)ts.tv_sec, ts.tv_nsec, rnd);
    khub__sha256_hex(text, strlen(text), hex);
    memcpy(id, hex, 40);
    id[40] = '\0';
}
