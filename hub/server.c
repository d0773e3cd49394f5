/*
 * server.c: `khub serve`, a read-only Hub on libmicrohttpd for a folder of
 * kernel repos (layout in docs/hub-server.md):
 *
 *   <dir>/<org>/<name>/refs.json          {"branches":{"main":"<sha>"},"tags":{},"lfs":[globs]}
 *   <dir>/<org>/<name>/commits/<sha>/...  the files of each commit
 *
 * It answers, for the "kernels/" and model ("") prefixes, the read subset of
 * the protocol that huggingface_hub needs: repo info at a revision, refs,
 * tree listings (recursive or not, paginated with self-pointing Link
 * headers), paths-info (a POST with a form or JSON body), and HEAD/GET on
 * resolve URLs with X-Repo-Commit, ETag, X-Linked-Etag/X-Linked-Size for
 * LFS files, Range, and X-Error-Code on every error. It never advertises
 * xet. Faults for the tests are injected by name (docs/hub-server.md).
 *
 * Writes (section "Writes") are the upload subset: repos/create,
 * preupload, the LFS batch API with basic transfers to capability URLs,
 * verify, NDJSON or JSON commits, branches, tags, validate-yaml. A commit
 * is built in a temp directory and renamed into commits/, then refs.json
 * is replaced by rename, so a crash leaves the old state.
 *
 * URLs are split into segments before percent-decoding (a revision such as
 * refs%2Fpr%2F1 is one segment), so libmicrohttpd's own unescaping is
 * replaced by an identity callback.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>
#include <openssl/evp.h>

#include "server.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_RESULT;
#else
typedef enum MHD_Result MHD_RESULT;
#endif

enum {
    F_DROP = 1 << 0,
    F_SHORT = 1 << 1,
    F_EXTRA = 1 << 2,
    F_WRONG_HASH = 1 << 3,
    F_429 = 1 << 4,
    F_503 = 1 << 5,
    F_LOOP = 1 << 6,
    F_CROSS_HOST = 1 << 7,
    F_IGNORE_RANGE = 1 << 8,
};

struct khub__server {
    struct MHD_Daemon *d;
    char *dir;
    uint16_t port;
    uint32_t page_size;
    unsigned faults;
    atomic_int budget_drop, budget_429, budget_503;
    atomic_ullong n_requests;
    FILE *log;
    pthread_mutex_t log_lock;
    char *token;                /* writes need "Bearer <token>"; NULL = open */
    char secret[65];            /* keys the upload capabilities */
    pthread_mutex_t write_lock; /* one write at a time: refs.json read-modify-write */
    struct digest_cache *dc;    /* file digests by path and stat fingerprint */
};

/* ======================================================================== */
/* Small helpers                                                            */
/* ======================================================================== */

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Percent-decodes s in place; returns 0 on a bad escape or an embedded NUL. */
static int pct_decode(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p == '%') {
            int h = hexval((unsigned char)p[1]), l = h < 0 ? -1 : hexval((unsigned char)p[2]);
            if (h < 0 || l < 0 || (h == 0 && l == 0)) return 0;
            *o++ = (char)(h * 16 + l);
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    return 1;
}

static char *read_file(const char *path, size_t *n_out, size_t max)
{
    FILE *f = fopen(path, "rb");
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

static MHD_RESULT send_json(struct MHD_Connection *c, unsigned code, cJSON *j, const char *err_code,
                            const char *commit)
{
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (err_code) MHD_add_response_header(r, "X-Error-Code", err_code);
    if (commit) MHD_add_response_header(r, "X-Repo-Commit", commit);
    MHD_RESULT ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static MHD_RESULT send_error(struct MHD_Connection *c, unsigned code, const char *err_code,
                             const char *commit, const char *msg)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "error", msg);
    struct MHD_Response *r;
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (err_code) MHD_add_response_header(r, "X-Error-Code", err_code);
    if (commit) MHD_add_response_header(r, "X-Repo-Commit", commit);
    MHD_add_response_header(r, "X-Error-Message", msg);
    MHD_RESULT ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* ======================================================================== */
/* Digest cache                                                             */
/* ======================================================================== */

/* Listings, HEADs, GETs and preuploads all need a file's SHA-256 (and git
 * blob SHA-1). Hashing on every request made a HEAD of a 100 MiB file cost
 * a full read (docs/performance.md "Hub"), so digests are kept per path
 * with the stat fingerprint they were computed under (device, inode, size,
 * mtime and ctime in ns) and reused only while all of it is unchanged. A
 * rewrite in place moves mtime/ctime, a rename-over moves the inode. The
 * fingerprint is taken before and after hashing and the result is kept
 * only when both agree, so a file changing mid-hash is never cached, and
 * only for a file whose ctime is 2 s old: timestamps come from a coarse
 * clock, so a younger file could still change under the same fingerprint
 * (git's "racily clean" entries). The
 * table is direct-mapped: a colliding path evicts the old one (a re-hash,
 * never a wrong answer, because the path is compared too). */

typedef struct file_ids {
    char sha1[41];   /* git blob id of what git stores: content or LFS pointer */
    char sha256[65]; /* of the content */
    size_t pointer_size;
} file_ids;

typedef struct fprint {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns;
} fprint;

typedef struct digest_slot {
    char *path; /* NULL = empty */
    int lfs;
    fprint fp;
    file_ids ids;
} digest_slot;

#define DIGEST_SLOTS 4096u

typedef struct digest_cache {
    pthread_mutex_t lock;
    digest_slot slot[DIGEST_SLOTS];
} digest_cache;

static digest_cache *digest_cache_new(void)
{
    digest_cache *dc = calloc(1, sizeof *dc);
    if (dc) pthread_mutex_init(&dc->lock, NULL);
    return dc;
}

static void digest_cache_free(digest_cache *dc)
{
    if (!dc) return;
    for (unsigned i = 0; i < DIGEST_SLOTS; i++) free(dc->slot[i].path);
    pthread_mutex_destroy(&dc->lock);
    free(dc);
}

static int fprint_of(const char *path, fprint *fp)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    *fp = (fprint){(uint64_t)sb.st_dev, (uint64_t)sb.st_ino, (uint64_t)sb.st_size,
                   (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec,
                   (int64_t)sb.st_ctim.tv_sec * 1000000000 + sb.st_ctim.tv_nsec};
    return 1;
}

static int fprint_eq(const fprint *a, const fprint *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns;
}

static unsigned path_slot(const char *path)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) h = (h ^ *p) * 16777619u;
    return h % DIGEST_SLOTS;
}

static int digest_lookup(digest_cache *dc, const char *path, int lfs, const fprint *fp,
                         file_ids *ids)
{
    if (!dc) return 0;
    digest_slot *e = &dc->slot[path_slot(path)];
    pthread_mutex_lock(&dc->lock);
    int hit = e->path && e->lfs == lfs && !strcmp(e->path, path) && fprint_eq(&e->fp, fp);
    if (hit) *ids = e->ids;
    pthread_mutex_unlock(&dc->lock);
    return hit;
}

static void digest_store(digest_cache *dc, const char *path, int lfs, const fprint *fp,
                         const file_ids *ids)
{
    char *copy = dc ? strdup(path) : NULL;
    if (!copy) return;
    digest_slot *e = &dc->slot[path_slot(path)];
    pthread_mutex_lock(&dc->lock);
    free(e->path);
    *e = (digest_slot){copy, lfs, *fp, *ids};
    pthread_mutex_unlock(&dc->lock);
}

static int hash_ids(const char *path, int lfs, uint64_t size, file_ids *ids)
{
    if (khub__sha256_file_hex(path, ids->sha256) != KHUB_STATUS_OK) return 0;
    if (!lfs) return khub__git_blob_sha1_file(path, ids->sha1) == KHUB_STATUS_OK;
    char ptr[256];
    int n = snprintf(ptr, sizeof ptr,
                     "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %llu\n",
                     ids->sha256, (unsigned long long)size);
    ids->pointer_size = (size_t)n;
    return khub__git_blob_sha1_buf(ptr, (size_t)n, ids->sha1) == KHUB_STATUS_OK;
}

/* The digests of path, from the cache when its fingerprint is unchanged. */
static int file_ids_of(digest_cache *dc, const char *path, int lfs, file_ids *ids)
{
    fprint before, after;
    if (!fprint_of(path, &before)) return 0;
    if (digest_lookup(dc, path, lfs, &before, ids)) return 1;
    if (!hash_ids(path, lfs, before.size, ids)) return 0;
    struct timespec now;
    int settled = clock_gettime(CLOCK_REALTIME, &now) == 0 &&
                  before.ctime_ns + 2000000000LL <= (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
    if (settled && fprint_of(path, &after) && fprint_eq(&before, &after))
        digest_store(dc, path, lfs, &before, ids);
    return 1;
}

/* ======================================================================== */
/* Repos                                                                    */
/* ======================================================================== */

typedef struct repo {
    char org[KHUB_HUB_NAME_MAX + 1], name[KHUB_HUB_NAME_MAX + 1];
    char root[KHUB__PATH_MAX]; /* <dir>/<org>/<name> */
    cJSON *refs;
    struct digest_cache *dc; /* the server's, borrowed */
} repo;

static int repo_open(const khub__server *s, const char *org, const char *name, repo *r)
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
    char *json = read_file(path, NULL, 1 << 20);
    if (!json) return 0;
    r->refs = cJSON_Parse(json);
    free(json);
    return r->refs != NULL;
}

static void repo_close(repo *r) { cJSON_Delete(r->refs); }

/* Branch, tag, or an existing commit directory; 0 when unknown. */
static int repo_resolve(const repo *r, const char *rev, char commit[41])
{
    const char *kinds[] = {"branches", "tags"};
    for (int k = 0; k < 2; k++) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(r->refs, kinds[k]);
        cJSON *v = cJSON_GetObjectItemCaseSensitive(t, rev);
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

static int repo_is_lfs(const repo *r, const char *path)
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

/* ======================================================================== */
/* Files of a commit                                                        */
/* ======================================================================== */

typedef struct fentry {
    char *path;
    int is_dir;
    uint64_t size;
} fentry;

typedef struct flist {
    fentry *v;
    size_t n, cap;
} flist;

static void flist_free(flist *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->v[i].path);
    free(l->v);
}

/* Regular files and directories only; symlinks and specials are not served. */
static void walk(const char *base, const char *rel, flist *l, int depth, int recurse)
{
    char path[KHUB__PATH_MAX];
    snprintf(path, sizeof path, "%s%s%s", base, rel[0] ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d || depth > 32) {
        if (d) closedir(d);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || !strcmp(de->d_name, ".."))) continue;
        char child[KHUB__PATH_MAX], full[KHUB__PATH_MAX];
        snprintf(child, sizeof child, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name);
        if (!KHUB__PATHF(full, "%s/%s", base, child)) continue;
        struct stat sb;
        if (lstat(full, &sb) != 0 || !(S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode))) continue;
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 64;
            fentry *v = realloc(l->v, cap * sizeof *v);
            if (!v) break;
            l->v = v;
            l->cap = cap;
        }
        l->v[l->n++] = (fentry){strdup(child), S_ISDIR(sb.st_mode), (uint64_t)sb.st_size};
        if (S_ISDIR(sb.st_mode) && recurse) walk(base, child, l, depth + 1, 1);
    }
    closedir(d);
}

static int cmp_fentry(const void *a, const void *b)
{
    return strcmp(((const fentry *)a)->path, ((const fentry *)b)->path);
}

static void commit_dir(const repo *r, const char *commit, char *buf, size_t size)
{
    if (snprintf(buf, size, "%s/commits/%s", r->root, commit) >= (int)size) buf[0] = '\0';
}

static cJSON *entry_json(const repo *r, const char *cdir, const fentry *e)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", e->is_dir ? "directory" : "file");
    cJSON_AddStringToObject(j, "path", e->path);
    if (e->is_dir) {
        char oid[41];
        khub__git_blob_sha1_buf(e->path, strlen(e->path), oid); /* stable, not a git tree id */
        cJSON_AddStringToObject(j, "oid", oid);
        cJSON_AddNumberToObject(j, "size", 0);
        return j;
    }
    char full[KHUB__PATH_MAX];
    if (!KHUB__PATHF(full, "%s/%s", cdir, e->path)) {
        cJSON_Delete(j);
        return NULL;
    }
    int lfs = repo_is_lfs(r, e->path);
    file_ids ids;
    if (!file_ids_of(r->dc, full, lfs, &ids)) {
        cJSON_Delete(j);
        return NULL;
    }
    cJSON_AddNumberToObject(j, "size", (double)e->size);
    cJSON_AddStringToObject(j, "oid", ids.sha1);
    if (lfs) {
        cJSON *o = cJSON_AddObjectToObject(j, "lfs");
        cJSON_AddStringToObject(o, "oid", ids.sha256);
        cJSON_AddNumberToObject(o, "size", (double)e->size);
        cJSON_AddNumberToObject(o, "pointerSize", (double)ids.pointer_size);
    }
    return j;
}

/* ======================================================================== */
/* API endpoints                                                            */
/* ======================================================================== */

static MHD_RESULT api_info(khub__server *s, struct MHD_Connection *c, const repo *r,
                           const char *commit)
{
    char cdir[KHUB__PATH_MAX], id[256], when[32];
    commit_dir(r, commit, cdir, sizeof cdir);
    flist l = {0};
    walk(cdir, "", &l, 0, 1);
    qsort(l.v, l.n, sizeof *l.v, cmp_fentry);
    struct stat sb;
    time_t t = stat(cdir, &sb) == 0 ? sb.st_mtime : 0;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
    snprintf(id, sizeof id, "%s/%s", r->org, r->name);
    cJSON *j = cJSON_CreateObject(), *sib = cJSON_CreateArray();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "author", r->org);
    cJSON_AddStringToObject(j, "sha", commit);
    cJSON_AddStringToObject(j, "lastModified", when);
    cJSON_AddFalseToObject(j, "private");
    cJSON_AddFalseToObject(j, "gated");
    cJSON_AddFalseToObject(j, "disabled");
    cJSON_AddNumberToObject(j, "downloads", 0);
    cJSON_AddNumberToObject(j, "likes", 0);
    cJSON_AddItemToObject(j, "tags", cJSON_CreateArray());
    for (size_t i = 0; i < l.n; i++) {
        if (l.v[i].is_dir) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "rfilename", l.v[i].path);
        cJSON_AddItemToArray(sib, o);
    }
    cJSON_AddItemToObject(j, "siblings", sib);
    flist_free(&l);
    (void)s;
    return send_json(c, 200, j, NULL, NULL);
}

static MHD_RESULT api_refs(struct MHD_Connection *c, const repo *r)
{
    cJSON *j = cJSON_CreateObject();
    const char *kinds[] = {"branches", "tags"}, *prefix[] = {"refs/heads/", "refs/tags/"};
    for (int k = 0; k < 2; k++) {
        cJSON *arr = cJSON_AddArrayToObject(j, kinds[k]), *v;
        cJSON *t = cJSON_GetObjectItemCaseSensitive(r->refs, kinds[k]);
        cJSON_ArrayForEach(v, t)
        {
            if (!cJSON_IsString(v) || !khub__is_commit_hex(v->valuestring)) continue;
            char ref[512];
            snprintf(ref, sizeof ref, "%s%s", prefix[k], v->string);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", v->string);
            cJSON_AddStringToObject(o, "ref", ref);
            cJSON_AddStringToObject(o, "targetCommit", v->valuestring);
            cJSON_AddItemToArray(arr, o);
        }
    }
    cJSON_AddArrayToObject(j, "converts");
    const char *prs = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "include_prs");
    if (prs && strcmp(prs, "1") == 0) cJSON_AddArrayToObject(j, "pullRequests");
    return send_json(c, 200, j, NULL, NULL);
}

static int arg_true(struct MHD_Connection *c, const char *key)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    return v && (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1"));
}

static MHD_RESULT api_tree(khub__server *s, struct MHD_Connection *c, const repo *r,
                           const char *commit, const char *sub, const char *raw_url)
{
    char cdir[KHUB__PATH_MAX], base[KHUB__PATH_MAX];
    commit_dir(r, commit, cdir, sizeof cdir);
    int recursive = arg_true(c, "recursive");
    if (sub[0]) {
        struct stat sb;
        if (!KHUB__PATHF(base, "%s/%s", cdir, sub) || !khub__path_is_safe(sub) ||
            lstat(base, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return send_error(c, 404, "EntryNotFound", commit, "path not found at revision");
    }
    flist l = {0};
    walk(cdir, sub, &l, 0, recursive);
    qsort(l.v, l.n, sizeof *l.v, cmp_fentry);
    const char *cur = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
    size_t from = cur ? strtoull(cur, NULL, 10) : 0, end = from + s->page_size;
    if (end > l.n) end = l.n;
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = from; i < end; i++) {
        cJSON *e = entry_json(r, cdir, &l.v[i]);
        if (e) cJSON_AddItemToArray(arr, e);
    }
    char *text = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (end < l.n) {
        const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
        char link[4096];
        snprintf(link, sizeof link,
                 "<http://%s%s?recursive=%s&expand=false&cursor=%zu>; "
                 "rel=\"next\"",
                 host ? host : "127.0.0.1", raw_url, recursive ? "true" : "false", end);
        MHD_add_response_header(resp, "Link", link);
    }
    flist_free(&l);
    MHD_RESULT ret = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ======================================================================== */
/* File content                                                             */
/* ======================================================================== */

/* A body read from the file as MHD asks for it, never buffered whole.
 * The fault knobs shape it: extra trailing bytes, a flipped first byte,
 * and a stop point after which the connection fails. Without faults a
 * body goes out through MHD_create_response_from_fd (sendfile). */
typedef struct body {
    int fd;
    uint64_t off, len; /* the file's bytes [off, off + len) */
    uint64_t n, stop;  /* n: body size (len + extra); stop: bytes before failing */
    int flip;          /* XOR the first byte (wrong-hash) */
} body;

static ssize_t body_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    body *b = cls;
    if (pos >= b->stop) return MHD_CONTENT_READER_END_WITH_ERROR;
    uint64_t want = b->stop - pos;
    size_t n = want < max ? (size_t)want : max;
    size_t from_file = pos < b->len ? (size_t)(b->len - pos < n ? b->len - pos : n) : 0;
    size_t got = 0;
    while (got < from_file) {
        ssize_t r = pread(b->fd, buf + got, from_file - got, (off_t)(b->off + pos + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return MHD_CONTENT_READER_END_WITH_ERROR; /* the file shrank */
        got += (size_t)r;
    }
    memset(buf + from_file, 'X', n - from_file);
    if (b->flip && pos == 0 && n > 0) buf[0] ^= 0x5a;
    return (ssize_t)n;
}

static void body_free(void *cls)
{
    body *b = cls;
    close(b->fd);
    free(b);
}

static int take(atomic_int *budget)
{
    int v = atomic_load(budget);
    while (v > 0)
        if (atomic_compare_exchange_weak(budget, &v, v - 1)) return 1;
    return 0;
}

/* Parses "bytes=a-" or "bytes=a-b"; 0 when absent or not understood. */
static int parse_range(const char *h, uint64_t *a, uint64_t *b, int *has_b)
{
    if (!h || strncmp(h, "bytes=", 6) != 0 || !isdigit((unsigned char)h[6])) return 0;
    char *end;
    *a = strtoull(h + 6, &end, 10);
    if (*end != '-') return 0;
    *has_b = isdigit((unsigned char)end[1]);
    *b = *has_b ? strtoull(end + 1, NULL, 10) : 0;
    return !*has_b || *b >= *a;
}

static MHD_RESULT serve_file(khub__server *s, struct MHD_Connection *c, const repo *r,
                             const char *commit, const char *path, int head, int via_cdn)
{
    char cdir[KHUB__PATH_MAX], full[KHUB__PATH_MAX];
    commit_dir(r, commit, cdir, sizeof cdir);
    struct stat sb;
    if (!KHUB__PATHF(full, "%s/%s", cdir, path) || !khub__path_is_safe(path) ||
        lstat(full, &sb) != 0 || !S_ISREG(sb.st_mode))
        return send_error(c, 404, "EntryNotFound", commit, "Entry not found");
    int lfs = repo_is_lfs(r, path);
    file_ids ids;
    if (!file_ids_of(r->dc, full, lfs, &ids))
        return send_error(c, 500, NULL, commit, "cannot hash the file");
    const char *etag = lfs ? ids.sha256 : ids.sha1;
    char quoted[80], size_s[32];
    snprintf(quoted, sizeof quoted, "\"%s\"", etag);
    snprintf(size_s, sizeof size_s, "%llu", (unsigned long long)sb.st_size);

    if (!via_cdn && (s->faults & F_CROSS_HOST) && lfs) {
        char loc[KHUB__PATH_MAX];
        snprintf(loc, sizeof loc, "http://localhost:%u/cdn/%s/%s/%s/%s", s->port, r->org, r->name,
                 commit, path);
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Location", loc);
        MHD_add_response_header(resp, "X-Repo-Commit", commit);
        MHD_add_response_header(resp, "X-Linked-Etag", quoted);
        MHD_add_response_header(resp, "X-Linked-Size", size_s);
        MHD_RESULT ret = MHD_queue_response(c, 302, resp);
        MHD_destroy_response(resp);
        return ret;
    }

    int fd = open(full, O_RDONLY | O_CLOEXEC);
    struct stat fsb;
    if (fd < 0 || fstat(fd, &fsb) != 0 || !S_ISREG(fsb.st_mode)) {
        if (fd >= 0) close(fd);
        return send_error(c, 500, NULL, commit, "cannot read the file");
    }
    uint64_t n = (uint64_t)fsb.st_size;
    uint64_t a = 0, bnd = 0;
    int has_b = 0, ranged = !(s->faults & F_IGNORE_RANGE) &&
                            parse_range(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"),
                                        &a, &bnd, &has_b);
    unsigned code = 200;
    char crange[96] = "";
    uint64_t off = 0, len = n;
    if (ranged) {
        if (a >= n) {
            close(fd);
            snprintf(crange, sizeof crange, "bytes */%llu", (unsigned long long)n);
            struct MHD_Response *resp =
                MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(resp, "Content-Range", crange);
            MHD_add_response_header(resp, "X-Repo-Commit", commit);
            MHD_RESULT ret = MHD_queue_response(c, 416, resp);
            MHD_destroy_response(resp);
            return ret;
        }
        uint64_t last = has_b && bnd < n ? bnd : n - 1;
        off = a;
        len = last - a + 1;
        code = 206;
        snprintf(crange, sizeof crange, "bytes %llu-%llu/%llu", (unsigned long long)off,
                 (unsigned long long)(off + len - 1), (unsigned long long)n);
    }
    struct MHD_Response *resp = NULL;
    unsigned body_faults = F_EXTRA | F_WRONG_HASH | F_SHORT | F_DROP;
    if (head || !(s->faults & body_faults)) {
        resp = MHD_create_response_from_fd_at_offset64(len, fd, off); /* owns fd */
        if (!resp) close(fd);
    } else {
        body *b = calloc(1, sizeof *b);
        if (!b) {
            close(fd);
            return send_error(c, 500, NULL, commit, "out of memory");
        }
        *b = (body){fd, off, len, len, len, 0};
        if (s->faults & F_EXTRA) b->n = b->stop = len + 16;
        b->flip = (s->faults & F_WRONG_HASH) && len > 0;
        if (s->faults & F_SHORT) b->n = b->stop = len / 2;
        if ((s->faults & F_DROP) && len > 1 && take(&s->budget_drop)) b->stop = len / 2;
        resp = MHD_create_response_from_callback(b->n, 256 * 1024, body_read, b, body_free);
        if (!resp) body_free(b);
    }
    if (!resp) return send_error(c, 500, NULL, commit, "cannot create the response");
    MHD_add_response_header(resp, "X-Repo-Commit", commit);
    MHD_add_response_header(resp, "ETag", quoted);
    MHD_add_response_header(resp, "Accept-Ranges", "bytes");
    if (lfs) {
        MHD_add_response_header(resp, "X-Linked-Etag", quoted);
        MHD_add_response_header(resp, "X-Linked-Size", size_s);
    }
    if (crange[0]) MHD_add_response_header(resp, "Content-Range", crange);
    MHD_RESULT ret = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ======================================================================== */
/* Writes: request bodies, auth, the on-disk commit                         */
/* ======================================================================== */

/* Request bodies are hostile: JSON and NDJSON bodies are buffered up to
 * MAX_JSON_BODY; an LFS object streams to a temp file and may not exceed
 * the size its batch call declared (itself at most MAX_LFS_OBJECT). */
#define MAX_JSON_BODY  (64u << 20)
#define MAX_LFS_OBJECT (16ull << 30)
#define MAX_COMMIT_OPS 100000

typedef struct conn {
    char *body;
    size_t n, cap;
    int too_big;
    /* PUT /lfs-upload/...: streamed to tmp, checked against oid and want */
    int put_fd;
    char put_tmp[KHUB__PATH_MAX], put_dest[KHUB__PATH_MAX], put_oid[65];
    uint64_t put_got, put_want;
    char put_err[160];
    unsigned put_code;
} conn;

static void conn_free(conn *k)
{
    if (!k) return;
    if (k->put_fd > 0) close(k->put_fd);
    if (k->put_tmp[0]) unlink(k->put_tmp);
    free(k->body);
    free(k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)c, (void)toe;
    conn_free(*con_cls);
    *con_cls = NULL;
}

static void conn_append(conn *k, const char *data, size_t n)
{
    size_t need;
    if (k->too_big || !khub__add_ok(k->n, n + 1, &need) || need > MAX_JSON_BODY) {
        k->too_big = 1;
        return;
    }
    if (need > k->cap) {
        size_t cap = k->cap ? k->cap : 4096;
        while (cap < need) cap *= 2;
        char *b = realloc(k->body, cap);
        if (!b) {
            k->too_big = 1;
            return;
        }
        k->body = b;
        k->cap = cap;
    }
    memcpy(k->body + k->n, data, n);
    k->n += n;
    k->body[k->n] = '\0';
}

/* With --token T every write needs "Authorization: Bearer T"; reads stay
 * open. The compare is constant-time over the expected length. */
static int write_allowed(const khub__server *s, struct MHD_Connection *c)
{
    if (!s->token) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *t = h + 7;
    size_t n = strlen(s->token);
    if (strlen(t) != n) return 0;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(t[i] ^ s->token[i]);
    return diff == 0;
}

static void self_url(struct MHD_Connection *c, char *buf, size_t size)
{
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    snprintf(buf, size, "http://%s",
             host && host[0] && !strpbrk(host, "/\\\"<> ") ? host : "127.0.0.1");
}

/* The capability in an upload href: sha256(secret, repo, oid, size). It
 * needs no header, so the client sends none (as huggingface_hub does). */
static void upload_token(const khub__server *s, const char *org, const char *name, const char *oid,
                         uint64_t size, char hex[65])
{
    char text[512];
    snprintf(text, sizeof text, "%s\n%s/%s\n%s\n%llu", s->secret, org, name, oid,
             (unsigned long long)size);
    if (khub__sha256_hex(text, strlen(text), hex) != KHUB_STATUS_OK) hex[0] = '\0';
}

static int is_sha256_lower(const char *s)
{
    if (!khub__is_sha256_hex(s)) return 0;
    for (const char *p = s; *p; p++)
        if (*p >= 'A' && *p <= 'F') return 0;
    return 1;
}

/* A JSON number that is a whole byte count in [0, max]. */
static int json_size(const cJSON *v, uint64_t max, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > (double)max ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

/* Branch and tag names: [A-Za-z0-9._-] segments joined by '/', each safe. */
static int ref_name_ok(const char *n)
{
    if (!n || !n[0] || strlen(n) > KHUB_HUB_REV_MAX || !khub__path_is_safe(n) || n[0] == '-')
        return 0;
    for (const char *p = n; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-/", *p)) return 0;
    return !khub__is_commit_hex(n) && !strstr(n, "..");
}

static int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    int ok = fsync(fd) == 0;
    close(fd);
    return ok;
}

/* Writes data to path via a temp file in the same directory, fsync, rename. */
static int write_atomic(const char *path, const void *data, size_t n)
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
        if (slash) *slash = '\0', fsync_path(dir);
        return 1;
    }
    unlink(tmp);
    return 0;
}

static int refs_save(const repo *r)
{
    char path[KHUB__PATH_MAX];
    char *text = cJSON_PrintUnformatted(r->refs);
    int ok = text && KHUB__PATHF(path, "%s/refs.json", r->root) &&
             write_atomic(path, text, strlen(text));
    free(text);
    return ok;
}

static cJSON *refs_table(const repo *r, const char *kind)
{
    cJSON *t = cJSON_GetObjectItemCaseSensitive(r->refs, kind);
    if (!cJSON_IsObject(t)) {
        cJSON_DeleteItemFromObjectCaseSensitive(r->refs, kind);
        t = cJSON_AddObjectToObject(r->refs, kind);
    }
    return t;
}

static void refs_set(const repo *r, const char *kind, const char *name, const char *commit)
{
    cJSON *t = refs_table(r, kind);
    cJSON_DeleteItemFromObjectCaseSensitive(t, name);
    cJSON_AddStringToObject(t, name, commit);
}

static const char *branch_head(const repo *r, const char *branch)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(r->refs, "branches"), branch);
    return cJSON_IsString(v) && khub__is_commit_hex(v->valuestring) ? v->valuestring : NULL;
}

static void random_hex(char *out, size_t n_bytes)
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
static void new_commit_id(const char *parent, const char *summary, char id[41])
{
    char text[1024], rnd[33], hex[65];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    random_hex(rnd, 16);
    snprintf(text, sizeof text, "%s\n%.500s\n%lld.%09ld\n%s", parent ? parent : "", summary,
             (long long)ts.tv_sec, ts.tv_nsec, rnd);
    khub__sha256_hex(text, strlen(text), hex);
    memcpy(id, hex, 40);
    id[40] = '\0';
}

/* Copies the tree src into dst (which exists): directories are made, files
 * hard-linked (they are never modified in place: every write replaces the
 * name by rename), or copied where linking fails. */
static int tree_clone(const char *src, const char *dst, int depth)
{
    DIR *d = opendir(src);
    if (!d) return 0;
    int ok = depth < 64;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char a[KHUB__PATH_MAX], b[KHUB__PATH_MAX];
        struct stat sb;
        if (!KHUB__PATHF(a, "%s/%s", src, de->d_name) ||
            !KHUB__PATHF(b, "%s/%s", dst, de->d_name) || lstat(a, &sb) != 0) {
            ok = 0;
        } else if (S_ISDIR(sb.st_mode)) {
            ok = mkdir(b, 0755) == 0 && tree_clone(a, b, depth + 1);
        } else if (S_ISREG(sb.st_mode) && link(a, b) != 0) {
            size_t n = 0;
            char *data = read_file(a, &n, SIZE_MAX / 2);
            ok = data && write_atomic(b, data, n);
            free(data);
        }
    }
    closedir(d);
    return ok;
}

static int mkdirs_under(const char *root, const char *rel_dir)
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

/* ------------------------------------------------------------------------ */
/* One commit                                                               */
/* ------------------------------------------------------------------------ */

typedef struct commit_ctx {
    const repo *r;
    char tree[KHUB__PATH_MAX]; /* the new commit's tree while it is built */
    unsigned code;             /* error answer: 400, 404, 409, 413, 422 */
    char err[300];
    const char *err_code;
} commit_ctx;

static int cfail(commit_ctx *x, unsigned code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int cfail(commit_ctx *x, unsigned code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, sizeof x->err, fmt, ap);
    va_end(ap);
    x->code = code;
    return 0;
}

/* Places bytes (or, with from set, the file from) at rel in the new tree. */
static int put_file(commit_ctx *x, const char *rel, const void *data, size_t n, const char *from)
{
    if (!khub__path_is_safe(rel) || !strcmp(rel, "refs.json"))
        return cfail(x, 400, "refusing path \"%.200s\": not a safe repo-relative path", rel);
    char full[KHUB__PATH_MAX], dir[KHUB__PATH_MAX];
    if (!KHUB__PATHF(full, "%s/%s", x->tree, rel)) return cfail(x, 400, "path too long");
    snprintf(dir, sizeof dir, "%s", rel);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        if (!mkdirs_under(x->tree, dir))
            return cfail(x, 409, "cannot create %.200s: a file of that name is in the way", dir);
    }
    struct stat sb;
    if (lstat(full, &sb) == 0 && !S_ISREG(sb.st_mode))
        return cfail(x, 409, "cannot write %.200s: a directory of that name exists", rel);
    if (from) {
        char tmp[KHUB__PATH_MAX];
        if (!KHUB__PATHF(tmp, "%s.lnk-%d", full, (int)getpid()))
            return cfail(x, 400, "path too long");
        unlink(tmp);
        if (link(from, tmp) != 0) {
            size_t m = 0;
            char *buf = read_file(from, &m, SIZE_MAX / 2);
            int ok = buf && write_atomic(full, buf, m);
            free(buf);
            return ok ? 1 : cfail(x, 500, "cannot store %.200s", rel);
        }
        if (rename(tmp, full) != 0) {
            unlink(tmp);
            return cfail(x, 500, "cannot store %.200s: %s", rel, strerror(errno));
        }
        return 1;
    }
    return write_atomic(full, data, n) ? 1 : cfail(x, 500, "cannot write %.200s", rel);
}

static int op_file(commit_ctx *x, const cJSON *v)
{
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(v, "path");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(v, "content");
    const cJSON *enc = cJSON_GetObjectItemCaseSensitive(v, "encoding");
    if (!cJSON_IsString(path) || !cJSON_IsString(content))
        return cfail(x, 400, "a \"file\" operation needs string \"path\" and \"content\"");
    if (cJSON_IsString(enc) && strcmp(enc->valuestring, "base64") != 0 &&
        strcmp(enc->valuestring, "utf-8") != 0)
        return cfail(x, 400, "file %.200s: unknown encoding \"%.40s\" (base64 or utf-8)",
                     path->valuestring, enc->valuestring);
    const char *text = content->valuestring;
    size_t tn = strlen(text);
    if (!cJSON_IsString(enc) || strcmp(enc->valuestring, "base64") != 0)
        return put_file(x, path->valuestring, text, tn, NULL);
    size_t cap = tn / 4 * 3 + 3;
    unsigned char *out = malloc(cap + 1);
    if (!out) return cfail(x, 413, "file %.200s: too large", path->valuestring);
    int n = tn ? EVP_DecodeBlock(out, (const unsigned char *)text, (int)tn) : 0;
    if (n < 0 || tn % 4 != 0 || tn > INT32_MAX) {
        free(out);
        return cfail(x, 400, "file %.200s: content is not valid base64", path->valuestring);
    }
    if (tn >= 1 && text[tn - 1] == '=') n--; /* EVP_DecodeBlock counts padding as bytes */
    if (tn >= 2 && text[tn - 2] == '=') n--;
    int ok = put_file(x, path->valuestring, out, (size_t)n, NULL);
    free(out);
    return ok;
}

static int op_lfs_file(commit_ctx *x, const cJSON *v)
{
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(v, "path");
    const cJSON *oid = cJSON_GetObjectItemCaseSensitive(v, "oid");
    const cJSON *algo = cJSON_GetObjectItemCaseSensitive(v, "algo");
    if (!cJSON_IsString(path) || !cJSON_IsString(oid) || !is_sha256_lower(oid->valuestring))
        return cfail(x, 400, "an \"lfsFile\" operation needs \"path\" and a 64-hex \"oid\"");
    if (cJSON_IsString(algo) && strcmp(algo->valuestring, "sha256") != 0)
        return cfail(x, 400, "lfsFile %.200s: algo \"%.40s\" is not sha256", path->valuestring,
                     algo->valuestring);
    char obj[KHUB__PATH_MAX];
    struct stat sb;
    if (!KHUB__PATHF(obj, "%s/lfs/%s", x->r->root, oid->valuestring) || lstat(obj, &sb) != 0 ||
        !S_ISREG(sb.st_mode))
        return cfail(x, 422,
                     "lfsFile %.200s: LFS object %s was not uploaded (call the LFS "
                     "batch API and PUT it first)",
                     path->valuestring, oid->valuestring);
    uint64_t size;
    const cJSON *sz = cJSON_GetObjectItemCaseSensitive(v, "size");
    if (sz && (!json_size(sz, MAX_LFS_OBJECT, &size) || size != (uint64_t)sb.st_size))
        return cfail(x, 422, "lfsFile %.200s: size does not match the stored object",
                     path->valuestring);
    return put_file(x, path->valuestring, NULL, 0, obj);
}

static int op_delete(commit_ctx *x, const cJSON *v, int folder)
{
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(v, "path");
    if (!cJSON_IsString(path)) return cfail(x, 400, "a delete operation needs a string \"path\"");
    char rel[KHUB__PATH_MAX], full[KHUB__PATH_MAX];
    snprintf(rel, sizeof rel, "%s", path->valuestring);
    size_t n = strlen(rel);
    while (folder && n > 0 && rel[n - 1] == '/') rel[--n] = '\0';
    if (!khub__path_is_safe(rel) || !KHUB__PATHF(full, "%s/%s", x->tree, rel))
        return cfail(x, 400, "refusing path \"%.200s\": not a safe repo-relative path", rel);
    struct stat sb;
    if (lstat(full, &sb) != 0 || (folder ? !S_ISDIR(sb.st_mode) : !S_ISREG(sb.st_mode))) {
        x->err_code = "EntryNotFound";
        return cfail(x, 404, "A %s with this name doesn't exist: %.200s",
                     folder ? "folder" : "file", rel);
    }
    if (folder) {
        khub__rmtree(full);
        return 1;
    }
    return unlink(full) == 0 ? 1 : cfail(x, 500, "cannot delete %.200s", rel);
}

static int apply_op(commit_ctx *x, const char *key, const cJSON *value)
{
    if (!strcmp(key, "file")) return op_file(x, value);
    if (!strcmp(key, "lfsFile")) return op_lfs_file(x, value);
    if (!strcmp(key, "deletedFile")) return op_delete(x, value, 0);
    if (!strcmp(key, "deletedFolder")) return op_delete(x, value, 1);
    return cfail(x, 400,
                 "unknown commit operation \"%.60s\" (file, lfsFile, deletedFile, "
                 "deletedFolder)",
                 key);
}

/* The operations of a commit body as {key, value} pairs: NDJSON lines, or
 * the JSON form {"summary", "description", "parentCommit", "files",
 * "lfsFiles", "deletedFiles", "deletedFolders"}. The header comes back in
 * *header (borrowed from *ops_out, which the caller frees). */
static int parse_commit_body(commit_ctx *x, char *text, size_t n, int ndjson, cJSON **ops_out,
                             const cJSON **header)
{
    cJSON *ops = cJSON_CreateArray();
    *ops_out = ops;
    *header = NULL;
    if (ndjson) {
        for (char *line = text, *next; line && line < text + n; line = next) {
            next = strchr(line, '\n');
            if (next) *next++ = '\0';
            if (!line[strspn(line, " \t\r")]) continue;
            cJSON *o = cJSON_Parse(line);
            const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "key");
            const cJSON *val = cJSON_GetObjectItemCaseSensitive(o, "value");
            if (!cJSON_IsString(k) || !cJSON_IsObject(val)) {
                cJSON_Delete(o);
                return cfail(x, 400, "commit body: a line is not {\"key\": ..., \"value\": {...}}");
            }
            if (cJSON_GetArraySize(ops) >= MAX_COMMIT_OPS) {
                cJSON_Delete(o);
                return cfail(x, 413, "commit body: more than %d operations", MAX_COMMIT_OPS);
            }
            cJSON_AddItemToArray(ops, o);
            if (!strcmp(k->valuestring, "header") && !*header)
                *header = cJSON_GetObjectItemCaseSensitive(o, "value");
        }
    } else {
        cJSON *j = cJSON_Parse(text);
        if (!cJSON_IsObject(j)) {
            cJSON_Delete(j);
            return cfail(x, 400, "commit body: not a JSON object");
        }
        static const struct {
            const char *list, *key;
        } kinds[] = {{"files", "file"},
                     {"lfsFiles", "lfsFile"},
                     {"deletedFiles", "deletedFile"},
                     {"deletedFolders", "deletedFolder"}};
        cJSON *h = cJSON_CreateObject();
        cJSON_AddItemToObject(h, "key", cJSON_CreateString("header"));
        cJSON_AddItemToObject(h, "value", cJSON_Duplicate(j, 0));
        cJSON_AddItemToArray(ops, h);
        cJSON *hv = cJSON_GetObjectItemCaseSensitive(h, "value");
        const char *copy[] = {"summary", "description", "parentCommit"};
        for (size_t i = 0; i < 3; i++) {
            cJSON *f = cJSON_GetObjectItemCaseSensitive(j, copy[i]);
            if (f) cJSON_AddItemToObject(hv, copy[i], cJSON_Duplicate(f, 1));
        }
        *header = hv;
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, kinds[i].list), *e;
            cJSON_ArrayForEach(e, arr)
            {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddItemToObject(o, "key", cJSON_CreateString(kinds[i].key));
                cJSON_AddItemToObject(o, "value", cJSON_Duplicate(e, 1));
                cJSON_AddItemToArray(ops, o);
            }
        }
        cJSON_Delete(j);
    }
    if (!*header) return cfail(x, 400, "commit body: no \"header\" line");
    return 1;
}

static int run_commit(commit_ctx *x, const cJSON *ops)
{
    const cJSON *o;
    cJSON_ArrayForEach(o, ops)
    {
        const char *key = cJSON_GetObjectItemCaseSensitive(o, "key")->valuestring;
        if (!strcmp(key, "header")) continue;
        if (!apply_op(x, key, cJSON_GetObjectItemCaseSensitive(o, "value"))) return 0;
    }
    return 1;
}

/* POST .../commit/{branch}: builds commits/<new> from the branch head plus
 * the operations in a temp directory, renames it into place, then moves the
 * branch in refs.json (itself replaced by rename): a crash at any point
 * leaves either the old state or an unreferenced commit directory. */
static MHD_RESULT api_commit(khub__server *s, struct MHD_Connection *c, repo *r, const char *branch,
                             const char *api_type, conn *k)
{
    const char *pr = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "create_pr");
    if (pr && strcmp(pr, "0") && strcmp(pr, "false"))
        return send_error(c, 400, NULL, NULL, "pull requests are not supported by khub serve");
    const char *head = branch_head(r, branch);
    if (!head)
        return send_error(c, 404, "RevisionNotFound", NULL,
                          "Invalid rev id: commits go to an existing branch");
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    int ndjson = !ct || strncmp(ct, "application/json", 16) != 0;
    commit_ctx x = {.r = r};
    cJSON *ops = NULL;
    const cJSON *hdr = NULL;
    char parent[41], id[41], cdir[KHUB__PATH_MAX], final[KHUB__PATH_MAX];
    memcpy(parent, head, 41);
    if (!parse_commit_body(&x, k->body ? k->body : (char *)"", k->n, ndjson, &ops, &hdr)) goto fail;
    const cJSON *pc = cJSON_GetObjectItemCaseSensitive(hdr, "parentCommit");
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(hdr, "summary");
    if (cJSON_IsString(pc) && pc->valuestring[0] && strcmp(pc->valuestring, parent) != 0) {
        cJSON_Delete(ops);
        return send_error(c, 412, NULL, NULL,
                          "parentCommit is not the head of the branch (it moved); fetch the "
                          "new head and retry");
    }
    new_commit_id(parent, cJSON_IsString(sum) ? sum->valuestring : "", id);
    commit_dir(r, parent, cdir, sizeof cdir);
    if (!KHUB__PATHF(x.tree, "%s/commits/.tmp-%s", r->root, id) ||
        !KHUB__PATHF(final, "%s/commits/%s", r->root, id) || mkdir(x.tree, 0755) != 0 ||
        !tree_clone(cdir, x.tree, 0)) {
        cfail(&x, 500, "cannot prepare the commit's tree");
        goto fail;
    }
    if (!run_commit(&x, ops)) goto fail;
    if (rename(x.tree, final) != 0) {
        cfail(&x, 500, "cannot publish the commit: %s", strerror(errno));
        goto fail;
    }
    fsync_path(final);
    refs_set(r, "branches", branch, id);
    if (!refs_save(r)) {
        khub__rmtree(final);
        cJSON_Delete(ops);
        return send_error(c, 500, NULL, NULL, "cannot update refs.json");
    }
    cJSON_Delete(ops);
    char base[300], url[1024];
    self_url(c, base, sizeof base);
    snprintf(url, sizeof url, "%s/%s%s/%s/commit/%s", base,
             strcmp(api_type, "models") ? "kernels/" : "", r->org, r->name, id);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddTrueToObject(j, "success");
    cJSON_AddStringToObject(j, "commitOid", id);
    cJSON_AddStringToObject(j, "commitUrl", url);
    cJSON_AddStringToObject(j, "hookOutput", "");
    (void)s;
    return send_json(c, 200, j, NULL, NULL);
fail:
    if (x.tree[0]) khub__rmtree(x.tree);
    cJSON_Delete(ops);
    return send_error(c, x.code ? x.code : 400, x.err_code, NULL, x.err);
}

/* ------------------------------------------------------------------------ */
/* Repos, refs, preupload                                                   */
/* ------------------------------------------------------------------------ */

static const char *gitattributes =
    "*.so filter=lfs diff=lfs merge=lfs -text\n*.tar.gz filter=lfs diff=lfs merge=lfs -text\n"
    "*.cubin filter=lfs diff=lfs merge=lfs -text\n*.ptx filter=lfs diff=lfs merge=lfs -text\n"
    "*.bin filter=lfs diff=lfs merge=lfs -text\n"
    "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    "*.gguf filter=lfs diff=lfs merge=lfs -text\n";

/* Makes <dir>/<org>/<name> in a temp directory and renames it into place,
 * so a concurrent create or a crash never leaves half a repo. 0 = exists. */
static int repo_create_on_disk(const khub__server *s, const char *org, const char *name, char *err,
                               size_t err_size)
{
    char odir[KHUB__PATH_MAX], tmp[KHUB__PATH_MAX], dst[KHUB__PATH_MAX], p[KHUB__PATH_MAX];
    char c0[41], refs[256];
    struct stat sb;
    if (!KHUB__PATHF(odir, "%s/%s", s->dir, org) || !KHUB__PATHF(dst, "%s/%s", odir, name) ||
        !KHUB__PATHF(tmp, "%s/.tmp-%s-XXXXXX", odir, name))
        return snprintf(err, err_size, "repo name too long"), -1;
    if (lstat(dst, &sb) == 0) return 0;
    if (mkdir(odir, 0755) != 0 && errno != EEXIST)
        return snprintf(err, err_size, "cannot create %s: %s", org, strerror(errno)), -1;
    if (!mkdtemp(tmp)) return snprintf(err, err_size, "cannot create a temp dir"), -1;
    new_commit_id(NULL, "initial commit", c0);
    snprintf(refs, sizeof refs, "{\"branches\":{\"main\":\"%s\"},\"tags\":{}}", c0);
    int ok = KHUB__PATHF(p, "%s/commits/%s", tmp, c0) && mkdirs_under(tmp, "commits") &&
             mkdir(p, 0755) == 0 && KHUB__PATHF(p, "%s/commits/%s/.gitattributes", tmp, c0) &&
             write_atomic(p, gitattributes, strlen(gitattributes)) &&
             KHUB__PATHF(p, "%s/refs.json", tmp) && write_atomic(p, refs, strlen(refs));
    if (ok && rename(tmp, dst) == 0) return fsync_path(odir), 1;
    int exists = errno == EEXIST || errno == ENOTEMPTY;
    khub__rmtree(tmp);
    if (ok && exists) return 0;
    return snprintf(err, err_size, "cannot create the repo on disk"), -1;
}

static MHD_RESULT api_repo_create(khub__server *s, struct MHD_Connection *c, conn *k)
{
    cJSON *j = cJSON_Parse(k->body ? k->body : "");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *org = cJSON_GetObjectItemCaseSensitive(j, "organization");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    char text[256], err[200] = "", base[300], url[600];
    khub_hub_id id;
    MHD_RESULT ret;
    if (!cJSON_IsString(name) || !cJSON_IsString(org)) {
        ret = send_error(c, 400, NULL, NULL,
                         "repos/create needs \"name\" and \"organization\" "
                         "(khub serve has no user namespace)");
    } else if (type && (!cJSON_IsString(type) || (strcmp(type->valuestring, "kernel") &&
                                                  strcmp(type->valuestring, "model")))) {
        ret = send_error(c, 400, NULL, NULL, "khub serve holds kernel and model repos only");
    } else if (snprintf(text, sizeof text, "%s/%s", org->valuestring, name->valuestring) >=
                   (int)sizeof text ||
               khub_hub_id_parse(text, &id, NULL, 0) != KHUB_STATUS_OK || id.rev_kind) {
        ret = send_error(c, 400, NULL, NULL, "invalid repo name");
    } else {
        int made = repo_create_on_disk(s, id.org, id.name, err, sizeof err);
        int kernel = !type || !strcmp(type->valuestring, "kernel");
        self_url(c, base, sizeof base);
        snprintf(url, sizeof url, "%s/%s%s/%s", base, kernel ? "kernels/" : "", id.org, id.name);
        if (made < 0) {
            ret = send_error(c, 500, NULL, NULL, err);
        } else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "url", url);
            cJSON_AddStringToObject(o, "name", text);
            if (!made) cJSON_AddStringToObject(o, "error", "You already created this repo");
            ret = send_json(c, made ? 200 : 409, o, NULL, NULL);
        }
    }
    cJSON_Delete(j);
    return ret;
}

/* POST/DELETE .../branch/{b}: create from startingPoint (default main) or
 * delete. 409 when it exists, 404 when it does not. */
static MHD_RESULT api_branch(struct MHD_Connection *c, repo *r, const char *b, int del, conn *k)
{
    if (!ref_name_ok(b)) return send_error(c, 400, NULL, NULL, "invalid branch name");
    if (del) {
        if (!strcmp(b, "main")) return send_error(c, 403, NULL, NULL, "cannot delete main");
        if (!branch_head(r, b))
            return send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id: no such branch");
        cJSON_DeleteItemFromObjectCaseSensitive(refs_table(r, "branches"), b);
        return refs_save(r) ? send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
                            : send_error(c, 500, NULL, NULL, "cannot update refs.json");
    }
    if (branch_head(r, b)) return send_error(c, 409, NULL, NULL, "Reference already exists");
    cJSON *j = k->n ? cJSON_Parse(k->body) : NULL;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "startingPoint");
    char commit[41];
    int ok = repo_resolve(r, cJSON_IsString(sp) ? sp->valuestring : "main", commit);
    cJSON_Delete(j);
    if (!ok) return send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id: startingPoint");
    refs_set(r, "branches", b, commit);
    return refs_save(r) ? send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
                        : send_error(c, 500, NULL, NULL, "cannot update refs.json");
}

/* POST .../tag/{rev} {"tag": T}; DELETE .../tag/{T}. */
static MHD_RESULT api_tag(struct MHD_Connection *c, repo *r, const char *seg, int del, conn *k)
{
    cJSON *tags = refs_table(r, "tags");
    if (del) {
        if (!cJSON_GetObjectItemCaseSensitive(tags, seg))
            return send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id: no such tag");
        cJSON_DeleteItemFromObjectCaseSensitive(tags, seg);
        return refs_save(r) ? send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
                            : send_error(c, 500, NULL, NULL, "cannot update refs.json");
    }
    cJSON *j = cJSON_Parse(k->body ? k->body : "");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tag");
    char commit[41], name[KHUB_HUB_REV_MAX + 1] = "";
    if (cJSON_IsString(t)) snprintf(name, sizeof name, "%s", t->valuestring);
    cJSON_Delete(j);
    if (!ref_name_ok(name)) return send_error(c, 400, NULL, NULL, "missing or invalid \"tag\"");
    if (!repo_resolve(r, seg, commit))
        return send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id");
    if (cJSON_GetObjectItemCaseSensitive(tags, name))
        return send_error(c, 409, NULL, NULL, "Tag already exists");
    refs_set(r, "tags", name, commit);
    return refs_save(r) ? send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
                        : send_error(c, 500, NULL, NULL, "cannot update refs.json");
}

/* The Hub's classification: LFS for the LFS globs, files over 10 MB and
 * binary samples (a NUL byte); empty files are regular. */
static int upload_is_lfs(const repo *r, const char *path, uint64_t size, const char *sample)
{
    if (size == 0) return 0;
    if (repo_is_lfs(r, path) || size > 10u * 1000 * 1000) return 1;
    size_t tn = sample ? strlen(sample) : 0;
    if (tn == 0 || tn > 4096 || tn % 4) return 0;
    unsigned char buf[3 * 1024 + 3];
    int n = EVP_DecodeBlock(buf, (const unsigned char *)sample, (int)tn);
    if (n > 0 && sample[tn - 1] == '=') n--;
    if (n > 0 && sample[tn - 2] == '=') n--;
    return n > 0 && memchr(buf, 0, (size_t)n) != NULL;
}

static MHD_RESULT api_preupload(struct MHD_Connection *c, repo *r, const char *rev, conn *k)
{
    char commit[41], cdir[KHUB__PATH_MAX];
    if (!repo_resolve(r, rev, commit))
        return send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id");
    commit_dir(r, commit, cdir, sizeof cdir);
    cJSON *j = cJSON_Parse(k->body ? k->body : "");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files"), *f;
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) > 1000) {
        cJSON_Delete(j);
        return send_error(c, 400, NULL, NULL, "preupload needs \"files\" (at most 1000)");
    }
    cJSON *out = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(out, "files");
    cJSON_ArrayForEach(f, files)
    {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(f, "path");
        const cJSON *sm = cJSON_GetObjectItemCaseSensitive(f, "sample");
        uint64_t size = 0;
        if (!cJSON_IsString(p) || !khub__path_is_safe(p->valuestring) ||
            !json_size(cJSON_GetObjectItemCaseSensitive(f, "size"), MAX_LFS_OBJECT, &size)) {
            cJSON_Delete(j), cJSON_Delete(out);
            return send_error(c, 400, NULL, NULL,
                              "preupload: each file needs a safe \"path\" "
                              "and a \"size\"");
        }
        int lfs = upload_is_lfs(r, p->valuestring, size, cJSON_IsString(sm) ? sm->valuestring : "");
        char full[KHUB__PATH_MAX];
        struct stat sb;
        file_ids ids;
        int have = KHUB__PATHF(full, "%s/%s", cdir, p->valuestring) && lstat(full, &sb) == 0 &&
                   S_ISREG(sb.st_mode) && file_ids_of(r->dc, full, lfs, &ids);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", p->valuestring);
        cJSON_AddStringToObject(o, "uploadMode", lfs ? "lfs" : "regular");
        cJSON_AddFalseToObject(o, "shouldIgnore");
        if (have)
            cJSON_AddStringToObject(o, "oid", lfs ? ids.sha256 : ids.sha1);
        else
            cJSON_AddNullToObject(o, "oid");
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_Delete(j);
    return send_json(c, 200, out, NULL, NULL);
}

/* ------------------------------------------------------------------------ */
/* LFS: batch, upload, verify                                               */
/* ------------------------------------------------------------------------ */

static MHD_RESULT send_lfs(struct MHD_Connection *c, unsigned code, cJSON *j)
{
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/vnd.git-lfs+json");
    MHD_RESULT ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static int lfs_have(const repo *r, const char *oid, uint64_t size)
{
    char obj[KHUB__PATH_MAX];
    struct stat sb;
    return KHUB__PATHF(obj, "%s/lfs/%s", r->root, oid) && lstat(obj, &sb) == 0 &&
           S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == size;
}

static MHD_RESULT api_lfs_batch(khub__server *s, struct MHD_Connection *c, const repo *r, conn *k)
{
    cJSON *j = cJSON_Parse(k->body ? k->body : "");
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(j, "operation");
    const cJSON *algo = cJSON_GetObjectItemCaseSensitive(j, "hash_algo");
    const cJSON *objs = cJSON_GetObjectItemCaseSensitive(j, "objects"), *o;
    const char *bad = NULL;
    if (!cJSON_IsString(op) || strcmp(op->valuestring, "upload") != 0)
        bad = "only the \"upload\" operation is served";
    else if (algo && (!cJSON_IsString(algo) || (strcmp(algo->valuestring, "sha256") &&
                                                strcmp(algo->valuestring, "sha_256"))))
        bad = "hash_algo must be sha256";
    else if (!cJSON_IsArray(objs) || cJSON_GetArraySize(objs) > 10000)
        bad = "\"objects\" must be an array of at most 10000";
    if (bad) {
        cJSON_Delete(j);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "message", bad);
        return send_lfs(c, 422, e);
    }
    char base[300];
    self_url(c, base, sizeof base);
    cJSON *out = cJSON_CreateObject(), *arr;
    cJSON_AddStringToObject(out, "transfer", "basic");
    arr = cJSON_AddArrayToObject(out, "objects");
    cJSON_ArrayForEach(o, objs)
    {
        const cJSON *oid = cJSON_GetObjectItemCaseSensitive(o, "oid");
        uint64_t size = 0;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, e);
        int ok_oid = cJSON_IsString(oid) && is_sha256_lower(oid->valuestring);
        cJSON_AddStringToObject(e, "oid", ok_oid ? oid->valuestring : "");
        if (!ok_oid ||
            !json_size(cJSON_GetObjectItemCaseSensitive(o, "size"), MAX_LFS_OBJECT, &size)) {
            cJSON *err = cJSON_AddObjectToObject(e, "error");
            cJSON_AddNumberToObject(err, "code", 422);
            cJSON_AddStringToObject(err, "message",
                                    "oid must be 64 lowercase hex digits and "
                                    "size a byte count up to 16 GiB");
            continue;
        }
        cJSON_AddNumberToObject(e, "size", (double)size);
        if (lfs_have(r, oid->valuestring, size)) continue; /* stored: no actions */
        char tok[65], href[1024];
        upload_token(s, r->org, r->name, oid->valuestring, size, tok);
        cJSON *act = cJSON_AddObjectToObject(e, "actions");
        snprintf(href, sizeof href, "%s/lfs-upload/%s/%s/%s/%llu/%s", base, r->org, r->name,
                 oid->valuestring, (unsigned long long)size, tok);
        cJSON_AddStringToObject(cJSON_AddObjectToObject(act, "upload"), "href", href);
        snprintf(href, sizeof href, "%s/lfs-verify/%s/%s", base, r->org, r->name);
        cJSON_AddStringToObject(cJSON_AddObjectToObject(act, "verify"), "href", href);
    }
    cJSON_Delete(j);
    return send_lfs(c, 200, out);
}

/* The first call of PUT /lfs-upload/<org>/<name>/<oid>/<size>/<token>:
 * checks the capability and opens the temp file the body streams into. */
static void put_begin(khub__server *s, conn *k, char **seg, int n)
{
    k->put_code = 404;
    snprintf(k->put_err, sizeof k->put_err, "no such upload URL");
    repo r;
    char tok[65], *end;
    if (n != 6 || !repo_open(s, seg[1], seg[2], &r)) {
        if (n == 6) repo_close(&r);
        return;
    }
    unsigned long long size = strtoull(seg[4], &end, 10);
    int ok = is_sha256_lower(seg[3]) && *end == '\0' && isdigit((unsigned char)seg[4][0]) &&
             size <= MAX_LFS_OBJECT;
    if (ok) upload_token(s, r.org, r.name, seg[3], size, tok);
    if (!ok || !tok[0] || strlen(seg[5]) != 64 || !khub__digest_eq(tok, seg[5])) {
        k->put_code = 403;
        snprintf(k->put_err, sizeof k->put_err, "the upload URL is not valid for this object");
        repo_close(&r);
        return;
    }
    char dir[KHUB__PATH_MAX];
    if (KHUB__PATHF(dir, "%s/lfs", r.root) && (mkdir(dir, 0755) == 0 || errno == EEXIST) &&
        KHUB__PATHF(k->put_tmp, "%s/.tmp-XXXXXX", dir) &&
        KHUB__PATHF(k->put_dest, "%s/%s", dir, seg[3])) {
        k->put_fd = mkstemp(k->put_tmp);
        if (k->put_fd < 0) k->put_tmp[0] = '\0';
    }
    repo_close(&r);
    if (k->put_fd <= 0) {
        k->put_code = 500;
        snprintf(k->put_err, sizeof k->put_err, "cannot store the object");
        return;
    }
    snprintf(k->put_oid, sizeof k->put_oid, "%s", seg[3]);
    k->put_want = size;
    k->put_code = 0;
    k->put_err[0] = '\0';
}

static void put_data(conn *k, const char *data, size_t n)
{
    if (k->put_code) return;
    if (k->put_got + n > k->put_want) {
        k->put_code = 400;
        snprintf(k->put_err, sizeof k->put_err, "body is larger than the declared size %llu",
                 (unsigned long long)k->put_want);
        return;
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = write(k->put_fd, data + off, n - off);
        if (w <= 0) {
            k->put_code = 500;
            snprintf(k->put_err, sizeof k->put_err, "cannot store the object");
            return;
        }
        off += (size_t)w;
    }
    k->put_got += n;
}

/* The last call: size and SHA-256 must match before the object is named. */
static MHD_RESULT put_end(struct MHD_Connection *c, conn *k)
{
    if (!k->put_code && k->put_got != k->put_want) {
        k->put_code = 400;
        snprintf(k->put_err, sizeof k->put_err, "body has %llu bytes, the object %llu",
                 (unsigned long long)k->put_got, (unsigned long long)k->put_want);
    }
    char hex[65];
    if (!k->put_code && (fsync(k->put_fd) != 0 || fchmod(k->put_fd, 0644) != 0 ||
                         khub__sha256_file_hex(k->put_tmp, hex) != KHUB_STATUS_OK)) {
        k->put_code = 500;
        snprintf(k->put_err, sizeof k->put_err, "cannot hash the object");
    }
    if (!k->put_code && !khub__digest_eq(hex, k->put_oid)) {
        k->put_code = 400;
        snprintf(k->put_err, sizeof k->put_err, "content SHA-256 %.64s is not the oid", hex);
    }
    if (!k->put_code && rename(k->put_tmp, k->put_dest) != 0) {
        k->put_code = 500;
        snprintf(k->put_err, sizeof k->put_err, "cannot store the object");
    }
    if (k->put_code) return send_error(c, k->put_code, NULL, NULL, k->put_err);
    k->put_tmp[0] = '\0';
    return send_json(c, 200, cJSON_CreateObject(), NULL, NULL);
}

static MHD_RESULT api_lfs_verify(struct MHD_Connection *c, const repo *r, conn *k)
{
    cJSON *j = cJSON_Parse(k->body ? k->body : "");
    const cJSON *oid = cJSON_GetObjectItemCaseSensitive(j, "oid");
    uint64_t size = 0;
    int ok = cJSON_IsString(oid) && is_sha256_lower(oid->valuestring) &&
             json_size(cJSON_GetObjectItemCaseSensitive(j, "size"), MAX_LFS_OBJECT, &size) &&
             lfs_have(r, oid->valuestring, size);
    cJSON_Delete(j);
    return ok ? send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
              : send_error(c, 404, NULL, NULL, "object not stored with that oid and size");
}

/* ------------------------------------------------------------------------ */
/* paths-info: a read that is a POST                                        */
/* ------------------------------------------------------------------------ */

#define MAX_PATHS_INFO 10000

/* Appends the entry of one requested path when it exists (files and
 * directories); unknown or unsafe paths are left out, as the Hub does. */
static void paths_info_add(const repo *r, const char *cdir, const char *path, cJSON *arr)
{
    char full[KHUB__PATH_MAX];
    struct stat sb;
    if (!khub__path_is_safe(path) || !KHUB__PATHF(full, "%s/%s", cdir, path) ||
        lstat(full, &sb) != 0 || !(S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode)))
        return;
    fentry e = {(char *)path, S_ISDIR(sb.st_mode), (uint64_t)sb.st_size};
    cJSON *j = entry_json(r, cdir, &e);
    if (j) cJSON_AddItemToArray(arr, j);
}

/* A form body (huggingface_hub: "paths=a&paths=b&expand=false", '+' for a
 * space) into arr; -1 on a bad escape, else the number of paths. */
static int paths_info_form(const repo *r, const char *cdir, char *text, cJSON *arr)
{
    int n = 0;
    char *save = NULL;
    for (char *kv = strtok_r(text, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = '\0';
        for (char *p = eq + 1; *p; p++)
            if (*p == '+') *p = ' ';
        if (!pct_decode(kv) || !pct_decode(eq + 1)) return -1;
        if (strcmp(kv, "paths") != 0) continue;
        if (++n > MAX_PATHS_INFO) return n;
        paths_info_add(r, cdir, eq + 1, arr);
    }
    return n;
}

/* A JSON body (the JS client: {"paths":[...],"expand":bool}); -1 when it
 * is not that shape, else the number of paths. */
static int paths_info_json(const repo *r, const char *cdir, const char *text, size_t len,
                           cJSON *arr)
{
    cJSON *j = cJSON_ParseWithLength(text, len);
    const cJSON *paths = cJSON_GetObjectItemCaseSensitive(j, "paths"), *p;
    int n = cJSON_IsArray(paths) ? cJSON_GetArraySize(paths) : -1;
    if (n > MAX_PATHS_INFO) {
        cJSON_Delete(j);
        return n;
    }
    cJSON_ArrayForEach(p, paths)
    {
        if (!cJSON_IsString(p)) {
            n = -1;
            break;
        }
        paths_info_add(r, cdir, p->valuestring, arr);
    }
    cJSON_Delete(j);
    return n;
}

static MHD_RESULT api_paths_info(struct MHD_Connection *c, const repo *r, const char *rev, conn *k)
{
    char commit[41], cdir[KHUB__PATH_MAX];
    if (k->too_big) return send_error(c, 413, NULL, NULL, "request body over 64 MiB");
    if (!repo_resolve(r, rev, commit))
        return send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id");
    commit_dir(r, commit, cdir, sizeof cdir);
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    int json = ct && strncasecmp(ct, "application/json", 16) == 0;
    cJSON *arr = cJSON_CreateArray();
    int n = !k->body ? 0
            : json   ? paths_info_json(r, cdir, k->body, k->n, arr)
                     : paths_info_form(r, cdir, k->body, arr);
    if (n < 0 || n > MAX_PATHS_INFO) {
        cJSON_Delete(arr);
        return send_error(c, 400, NULL, NULL,
                          n < 0 ? "paths-info needs a form body (paths=...) or JSON "
                                  "{\"paths\":[...]}"
                                : "paths-info: more than 10000 paths in one request");
    }
    return send_json(c, 200, arr, NULL, commit);
}

static int is_paths_info(char **seg, int n)
{
    return n == 6 && !strcmp(seg[0], "api") &&
           (!strcmp(seg[1], "kernels") || !strcmp(seg[1], "models")) &&
           !strcmp(seg[4], "paths-info");
}

/* Answered like a GET: no token, no write lock. */
static MHD_RESULT route_paths_info(khub__server *s, struct MHD_Connection *c, char **seg, conn *k)
{
    repo r;
    if (!repo_open(s, seg[2], seg[3], &r)) {
        repo_close(&r);
        return send_error(c, 404, "RepoNotFound", NULL, "Repository not found");
    }
    MHD_RESULT ret = api_paths_info(c, &r, seg[5], k);
    repo_close(&r);
    return ret;
}

/* ------------------------------------------------------------------------ */
/* Write routing                                                            */
/* ------------------------------------------------------------------------ */

static MHD_RESULT route_write(khub__server *s, struct MHD_Connection *c, const char *method,
                              char **seg, int n, conn *k)
{
    int del = !strcmp(method, "DELETE");
    if (!strcmp(method, "PUT"))
        return n > 0 && !strcmp(seg[0], "lfs-upload")
                   ? put_end(c, k)
                   : send_error(c, 405, NULL, NULL, "PUT is only for LFS upload URLs");
    if (strcmp(method, "POST") && !del) return send_error(c, 405, NULL, NULL, "method not allowed");
    if (!write_allowed(s, c))
        return send_error(c, 401, NULL, NULL,
                          "Invalid credentials in Authorization header: "
                          "writes need the server's token");
    if (k->too_big) return send_error(c, 413, NULL, NULL, "request body over 64 MiB");
    if (n == 2 && !strcmp(seg[0], "api") && !strcmp(seg[1], "validate-yaml"))
        return send_json(c, 200, cJSON_Parse("{\"errors\":[],\"warnings\":[]}"), NULL, NULL);
    if (n == 3 && !strcmp(seg[0], "api") && !strcmp(seg[1], "repos") && !strcmp(seg[2], "create"))
        return api_repo_create(s, c, k);
    /* repo-scoped: /api/{t}/{org}/{name}/{verb}/{x}, /lfs-verify/{org}/{name},
     * /[kernels/]{org}/{name}.git/info/lfs/objects/batch */
    int api = n >= 6 && !strcmp(seg[0], "api") &&
              (!strcmp(seg[1], "kernels") || !strcmp(seg[1], "models"));
    int verify = n == 3 && !strcmp(seg[0], "lfs-verify");
    int k0 = n > 0 && !strcmp(seg[0], "kernels") ? 1 : 0;
    int batch = n == k0 + 6 && !strcmp(seg[k0 + 2], "info") && !strcmp(seg[k0 + 3], "lfs") &&
                !strcmp(seg[k0 + 4], "objects") && !strcmp(seg[k0 + 5], "batch");
    if (!api && !verify && !batch) return send_error(c, 404, NULL, NULL, "unknown endpoint");
    int o = api ? 2 : verify ? 1 : k0;
    char name[KHUB_HUB_NAME_MAX + 8];
    snprintf(name, sizeof name, "%s", seg[o + 1]);
    size_t nl = strlen(name);
    if (batch && (nl < 5 || strcmp(name + nl - 4, ".git") != 0))
        return send_error(c, 404, NULL, NULL, "unknown endpoint");
    if (batch) name[nl - 4] = '\0';
    repo r;
    if (!repo_open(s, seg[o], name, &r)) {
        repo_close(&r);
        return send_error(c, 404, "RepoNotFound", NULL, "Repository not found");
    }
    MHD_RESULT ret;
    const char *verb = api ? seg[4] : "";
    if (verify)
        ret = api_lfs_verify(c, &r, k);
    else if (batch)
        ret = api_lfs_batch(s, c, &r, k);
    else if (n != 6)
        ret = send_error(c, 404, NULL, NULL, "unknown endpoint");
    else if (!strcmp(verb, "commit") && !del)
        ret = api_commit(s, c, &r, seg[5], seg[1], k);
    else if (!strcmp(verb, "preupload") && !del)
        ret = api_preupload(c, &r, seg[5], k);
    else if (!strcmp(verb, "branch"))
        ret = api_branch(c, &r, seg[5], del, k);
    else if (!strcmp(verb, "tag"))
        ret = api_tag(c, &r, seg[5], del, k);
    else
        ret = send_error(c, 404, NULL, NULL, "unknown endpoint");
    repo_close(&r);
    return ret;
}

/* ======================================================================== */
/* Routing                                                                  */
/* ======================================================================== */

#define MAX_SEGS 64

static void log_request(khub__server *s, struct MHD_Connection *c, const char *method,
                        const char *url)
{
    if (!s->log) return;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    const char *ua = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "User-Agent");
    pthread_mutex_lock(&s->log_lock);
    fprintf(s->log, "%s %s auth=%s range=%s ua=%s\n", method, url, auth ? "yes" : "no",
            range ? range : "-", ua ? ua : "-");
    fflush(s->log);
    pthread_mutex_unlock(&s->log_lock);
}

/* Splits the path of url into percent-decoded segments (in buf); -1 when
 * too long, -2 on a bad escape. */
static int split_url(const char *url, char *buf, size_t size, char **seg)
{
    if (snprintf(buf, size, "%s", url) >= (int)size) return -1;
    char *q = strchr(buf, '?'), *save = NULL;
    if (q) *q = '\0';
    int n = 0;
    for (char *p = strtok_r(buf, "/", &save); p && n < MAX_SEGS; p = strtok_r(NULL, "/", &save))
        seg[n++] = p;
    for (int i = 0; i < n; i++)
        if (!pct_decode(seg[i])) return -2;
    return n;
}

static MHD_RESULT route(khub__server *s, struct MHD_Connection *c, const char *url,
                        const char *method, conn *kc)
{
    int head = strcmp(method, "HEAD") == 0;
    if ((s->faults & F_503) && take(&s->budget_503))
        return send_error(c, 503, NULL, NULL, "injected 503");
    if ((s->faults & F_429) && take(&s->budget_429)) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Retry-After", "1");
        MHD_RESULT ret = MHD_queue_response(c, 429, r);
        MHD_destroy_response(r);
        return ret;
    }
    char buf[8192];
    char *seg[MAX_SEGS];
    int n = split_url(url, buf, sizeof buf, seg);
    if (n == -1) return send_error(c, 414, NULL, NULL, "URL too long");
    if (n < 0) return send_error(c, 400, NULL, NULL, "bad percent-escape");
    if (!strcmp(method, "POST") && is_paths_info(seg, n)) return route_paths_info(s, c, seg, kc);
    if (!head && strcmp(method, "GET") != 0) {
        pthread_mutex_lock(&s->write_lock);
        MHD_RESULT ret = route_write(s, c, method, seg, n, kc);
        pthread_mutex_unlock(&s->write_lock);
        return ret;
    }

    int api = n > 0 && strcmp(seg[0], "api") == 0;
    int k = api ? 1 : 0;
    if (api && (n < 2 || (strcmp(seg[1], "kernels") && strcmp(seg[1], "models"))))
        return send_error(c, 404, NULL, NULL, "unknown endpoint");
    if (api) k = 2;
    int cdn = !api && n > 0 && strcmp(seg[0], "cdn") == 0;
    if (cdn) {
        if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))
            return send_error(c, 400, NULL, NULL, "Authorization sent to the CDN host");
        k = 1;
    } else if (!api && n > 0 && strcmp(seg[0], "kernels") == 0) {
        k = 1;
    }
    if (n < k + 2) return send_error(c, 404, "RepoNotFound", NULL, "Repository not found");
    repo r;
    if (!repo_open(s, seg[k], seg[k + 1], &r)) {
        repo_close(&r);
        return send_error(c, 404, "RepoNotFound", NULL, "Repository not found");
    }
    MHD_RESULT ret;
    char commit[41];
    const char *verb = n > k + 2 ? seg[k + 2] : "";
    char sub[KHUB__PATH_MAX] = "";
    int rest_from = cdn ? k + 3 : k + 4;
    for (int i = rest_from; i < n; i++) {
        size_t l = strlen(sub);
        snprintf(sub + l, sizeof sub - l, "%s%s", l ? "/" : "", seg[i]);
    }
    if (cdn) {
        ret = n > k + 3 && khub__is_commit_hex(seg[k + 2])
                  ? serve_file(s, c, &r, seg[k + 2], sub, head, 1)
                  : send_error(c, 404, NULL, NULL, "not found");
    } else if (api && !verb[0]) {
        ret = repo_resolve(&r, "main", commit)
                  ? api_info(s, c, &r, commit)
                  : send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id: main");
    } else if (api && !strcmp(verb, "refs")) {
        ret = api_refs(c, &r);
    } else if ((api && (!strcmp(verb, "revision") || !strcmp(verb, "tree"))) ||
               (!api && !strcmp(verb, "resolve"))) {
        if (n < k + 4) {
            ret = send_error(c, 404, NULL, NULL, "missing revision");
        } else if (!repo_resolve(&r, seg[k + 3], commit)) {
            ret = send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id");
        } else if (!strcmp(verb, "revision")) {
            ret = api_info(s, c, &r, commit);
        } else if (!strcmp(verb, "tree")) {
            ret = api_tree(s, c, &r, commit, sub, url);
        } else if (s->faults & F_LOOP) {
            struct MHD_Response *resp =
                MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(resp, "Location", url);
            ret = MHD_queue_response(c, 302, resp);
            MHD_destroy_response(resp);
        } else {
            ret = serve_file(s, c, &r, commit, sub, head, 0);
        }
    } else {
        ret = send_error(c, 404, NULL, NULL, "unknown endpoint");
    }
    repo_close(&r);
    return ret;
}

static MHD_RESULT on_request(void *cls, struct MHD_Connection *c, const char *url,
                             const char *method, const char *version, const char *upload,
                             size_t *upload_size, void **con_cls)
{
    khub__server *s = cls;
    conn *k = *con_cls;
    if (k == NULL) { /* first call: headers only */
        if (!(k = calloc(1, sizeof *k))) return MHD_NO;
        *con_cls = k;
        if (!strcmp(method, "PUT")) {
            char buf[8192], *seg[MAX_SEGS];
            int n = split_url(url, buf, sizeof buf, seg);
            if (n > 0 && !strcmp(seg[0], "lfs-upload")) put_begin(s, k, seg, n);
        }
        return MHD_YES;
    }
    if (*upload_size) { /* a chunk of the body */
        if (k->put_fd > 0 || k->put_code)
            put_data(k, upload, *upload_size);
        else
            conn_append(k, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    atomic_fetch_add(&s->n_requests, 1);
    log_request(s, c, method, url);
    return route(s, c, url, method, k);
}

static size_t keep_escaped(void *cls, struct MHD_Connection *c, char *uri)
{
    (void)cls;
    (void)c;
    return strlen(uri);
}

/* ======================================================================== */
/* Lifecycle                                                                */
/* ======================================================================== */

static khub_status parse_faults(khub__server *s, const char *list)
{
    static const struct {
        const char *name;
        unsigned bit;
        int def;
    } names[] = {{"drop-body", F_DROP, 1},
                 {"short-body", F_SHORT, 0},
                 {"extra-bytes", F_EXTRA, 0},
                 {"wrong-hash", F_WRONG_HASH, 0},
                 {"429", F_429, 1},
                 {"503", F_503, 2},
                 {"redirect-loop", F_LOOP, 0},
                 {"cross-host", F_CROSS_HOST, 0},
                 {"ignore-range", F_IGNORE_RANGE, 0}};
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list ? list : "");
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        char *eq = strchr(t, '=');
        int count = -1;
        if (eq) {
            *eq = '\0';
            count = atoi(eq + 1);
        }
        size_t i;
        for (i = 0; i < sizeof names / sizeof names[0]; i++)
            if (!strcmp(t, names[i].name)) break;
        if (i == sizeof names / sizeof names[0])
            return khub__fail(NULL, KHUB_STATUS_INVALID_ARG,
                              "unknown fault \"%s\"; known: drop-body[=N], short-body, "
                              "extra-bytes, wrong-hash, 429[=N], 503[=N], redirect-loop, "
                              "cross-host, ignore-range",
                              t);
        s->faults |= names[i].bit;
        int c = count >= 0 ? count : names[i].def;
        if (names[i].bit == F_DROP) atomic_store(&s->budget_drop, c);
        if (names[i].bit == F_429) atomic_store(&s->budget_429, c);
        if (names[i].bit == F_503) atomic_store(&s->budget_503, c);
    }
    return KHUB_STATUS_OK;
}

khub_status khub__server_start(const khub__server_opts *o, khub__server **out)
{
    *out = NULL;
    struct stat sb;
    if (!o->dir || stat(o->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return khub__fail(NULL, KHUB_STATUS_NOT_FOUND,
                          "serve: %s is not a directory of repos (see docs/hub-server.md)",
                          o->dir ? o->dir : "(null)");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(o->port)};
    const char *host = o->host ? o->host : "127.0.0.1";
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return khub__fail(NULL, KHUB_STATUS_INVALID_ARG,
                          "serve: --host %s is not an IPv4 address (use 127.0.0.1)", host);
    khub__server *s = calloc(1, sizeof *s);
    if (!s) return khub__fail(NULL, KHUB_STATUS_NOMEM, "serve: out of memory");
    khub_status st = KHUB_STATUS_OK;
    pthread_mutex_init(&s->log_lock, NULL);
    pthread_mutex_init(&s->write_lock, NULL);
    s->dir = realpath(o->dir, NULL);
    if (!(s->dc = digest_cache_new())) {
        st = khub__fail(NULL, KHUB_STATUS_NOMEM, "serve: out of memory");
        goto fail;
    }
    random_hex(s->secret, 32);
    if (o->token && o->token[0] && !(s->token = strdup(o->token))) {
        st = khub__fail(NULL, KHUB_STATUS_NOMEM, "serve: out of memory");
        goto fail;
    }
    s->page_size = o->page_size ? o->page_size : 1000;
    st = parse_faults(s, o->faults ? o->faults : getenv("KHUB_SERVE_FAULTS"));
    if (st != KHUB_STATUS_OK) goto fail;
    if (o->log_path && !(s->log = fopen(o->log_path, "a"))) {
        st = khub__fail(NULL, KHUB_STATUS_IO, "serve: cannot open log %s: %s", o->log_path,
                        strerror(errno));
        goto fail;
    }
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0,
                            NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &sa,
                            MHD_OPTION_UNESCAPE_CALLBACK, keep_escaped, NULL,
                            MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_NOTIFY_COMPLETED,
                            on_completed, NULL, MHD_OPTION_END);
    if (!s->d) {
        st = khub__fail(NULL, KHUB_STATUS_IO, "serve: cannot listen on %s:%u (port in use?)", host,
                        o->port);
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : o->port;
    *out = s;
    return KHUB_STATUS_OK;
fail:
    khub__server_stop(s);
    return st;
}

uint16_t khub__server_port(const khub__server *s) { return s->port; }
uint64_t khub__server_requests(const khub__server *s) { return atomic_load(&s->n_requests); }

void khub__server_stop(khub__server *s)
{
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d);
    if (s->log) fclose(s->log);
    digest_cache_free(s->dc);
    pthread_mutex_destroy(&s->log_lock);
    pthread_mutex_destroy(&s->write_lock);
    if (s->token) memset(s->token, 0, strlen(s->token));
    free(s->token);
    free(s->dir);
    free(s);
}
