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
 * headers), and HEAD/GET on resolve URLs with X-Repo-Commit, ETag,
 * X-Linked-Etag/X-Linked-Size for LFS files, Range, and X-Error-Code on
 * every error. It never advertises xet. Faults for the tests are injected
 * by name (docs/hub-server.md).
 *
 * URLs are split into segments before percent-decoding (a revision such as
 * refs%2Fpr%2F1 is one segment), so libmicrohttpd's own unescaping is
 * replaced by an identity callback.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

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

static MHD_RESULT send_json(struct MHD_Connection *c, unsigned code, cJSON *j,
                            const char *err_code, const char *commit)
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
/* Repos                                                                    */
/* ======================================================================== */

typedef struct repo {
    char org[KHUB_HUB_NAME_MAX + 1], name[KHUB_HUB_NAME_MAX + 1];
    char root[KHUB__PATH_MAX]; /* <dir>/<org>/<name> */
    cJSON *refs;
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
    static const char *defaults[] = {"*.so", "*.tar.gz", "*.cubin", "*.ptx", "*.bin",
                                     "*.safetensors", "*.gguf"};
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    cJSON *l = cJSON_GetObjectItemCaseSensitive(r->refs, "lfs"), *g;
    if (cJSON_IsArray(l)) {
        cJSON_ArrayForEach(g, l) if (cJSON_IsString(g) && fnmatch(g->valuestring, base, 0) == 0)
            return 1;
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

typedef struct file_ids {
    char sha1[41];    /* git blob id of what git stores: content or LFS pointer */
    char sha256[65];  /* of the content */
    size_t pointer_size;
} file_ids;

static int file_ids_of(const char *path, int lfs, uint64_t size, file_ids *ids)
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
    if (!file_ids_of(full, lfs, e->size, &ids)) {
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
        if (!KHUB__PATHF(base, "%s/%s", cdir, sub) || !khub__path_is_safe(sub) || lstat(base, &sb) != 0 || !S_ISDIR(sb.st_mode))
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
        snprintf(link, sizeof link, "<http://%s%s?recursive=%s&expand=false&cursor=%zu>; "
                 "rel=\"next\"", host ? host : "127.0.0.1", raw_url,
                 recursive ? "true" : "false", end);
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

typedef struct body {
    char *data;
    size_t n, stop; /* stop: bytes to send before failing the connection */
} body;

static ssize_t body_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    body *b = cls;
    if (pos >= b->stop) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = b->stop - (size_t)pos;
    if (n > max) n = max;
    memcpy(buf, b->data + pos, n);
    return (ssize_t)n;
}

static void body_free(void *cls)
{
    body *b = cls;
    free(b->data);
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
    if (!KHUB__PATHF(full, "%s/%s", cdir, path) || !khub__path_is_safe(path) || lstat(full, &sb) != 0 || !S_ISREG(sb.st_mode))
        return send_error(c, 404, "EntryNotFound", commit, "Entry not found");
    int lfs = repo_is_lfs(r, path);
    file_ids ids;
    if (!file_ids_of(full, lfs, (uint64_t)sb.st_size, &ids))
        return send_error(c, 500, NULL, commit, "cannot hash the file");
    const char *etag = lfs ? ids.sha256 : ids.sha1;
    char quoted[80], size_s[32];
    snprintf(quoted, sizeof quoted, "\"%s\"", etag);
    snprintf(size_s, sizeof size_s, "%llu", (unsigned long long)sb.st_size);

    if (!via_cdn && (s->faults & F_CROSS_HOST) && lfs) {
        char loc[KHUB__PATH_MAX];
        snprintf(loc, sizeof loc, "http://localhost:%u/cdn/%s/%s/%s/%s", s->port, r->org,
                 r->name, commit, path);
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Location", loc);
        MHD_add_response_header(resp, "X-Repo-Commit", commit);
        MHD_add_response_header(resp, "X-Linked-Etag", quoted);
        MHD_add_response_header(resp, "X-Linked-Size", size_s);
        MHD_RESULT ret = MHD_queue_response(c, 302, resp);
        MHD_destroy_response(resp);
        return ret;
    }

    size_t n = 0;
    char *data = read_file(full, &n, SIZE_MAX / 2);
    if (!data) return send_error(c, 500, NULL, commit, "cannot read the file");
    uint64_t a = 0, bnd = 0;
    int has_b = 0, ranged = !(s->faults & F_IGNORE_RANGE) &&
                            parse_range(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"),
                                        &a, &bnd, &has_b);
    unsigned code = 200;
    char crange[96] = "";
    size_t off = 0, len = n;
    if (ranged) {
        if (a >= n) {
            free(data);
            snprintf(crange, sizeof crange, "bytes */%zu", n);
            struct MHD_Response *resp =
                MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(resp, "Content-Range", crange);
            MHD_add_response_header(resp, "X-Repo-Commit", commit);
            MHD_RESULT ret = MHD_queue_response(c, 416, resp);
            MHD_destroy_response(resp);
            return ret;
        }
        uint64_t last = has_b && bnd < n ? bnd : n - 1;
        off = (size_t)a;
        len = (size_t)(last - a + 1);
        code = 206;
        snprintf(crange, sizeof crange, "bytes %zu-%zu/%zu", off, off + len - 1, n);
    }
    body *b = calloc(1, sizeof *b);
    size_t extra = (!head && (s->faults & F_EXTRA)) ? 16 : 0;
    b->data = malloc(len + extra + 1);
    memcpy(b->data, data + off, len);
    memset(b->data + len, 'X', extra);
    free(data);
    b->n = len + extra;
    b->stop = b->n;
    if (!head && (s->faults & F_WRONG_HASH) && len > 0) b->data[0] ^= 0x5a;
    if (!head && (s->faults & F_SHORT)) b->n = b->stop = len / 2;
    if (!head && (s->faults & F_DROP) && len > 1 && take(&s->budget_drop)) b->stop = len / 2;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(b->n, 32 * 1024, body_read, b, body_free);
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

static MHD_RESULT route(khub__server *s, struct MHD_Connection *c, const char *url,
                        const char *method)
{
    int head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0)
        return send_error(c, 405, NULL, NULL, "this server is read-only (GET and HEAD)");
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
    if (snprintf(buf, sizeof buf, "%s", url) >= (int)sizeof buf)
        return send_error(c, 414, NULL, NULL, "URL too long");
    char *q = strchr(buf, '?');
    if (q) *q = '\0';
    char *seg[MAX_SEGS];
    int n = 0;
    for (char *p = strtok(buf, "/"); p && n < MAX_SEGS; p = strtok(NULL, "/")) seg[n++] = p;
    for (int i = 0; i < n; i++)
        if (!pct_decode(seg[i])) return send_error(c, 400, NULL, NULL, "bad percent-escape");

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
        ret = repo_resolve(&r, "main", commit) ? api_info(s, c, &r, commit)
                                               : send_error(c, 404, "RevisionNotFound", NULL,
                                                            "Invalid rev id: main");
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
    if (*con_cls == NULL) { /* first call: headers only */
        *con_cls = s;
        return MHD_YES;
    }
    if (*upload_size) { /* discard request bodies */
        *upload_size = 0;
        return MHD_YES;
    }
    atomic_fetch_add(&s->n_requests, 1);
    log_request(s, c, method, url);
    return route(s, c, url, method);
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
    } names[] = {{"drop-body", F_DROP, 1},       {"short-body", F_SHORT, 0},
                 {"extra-bytes", F_EXTRA, 0},    {"wrong-hash", F_WRONG_HASH, 0},
                 {"429", F_429, 1},              {"503", F_503, 2},
                 {"redirect-loop", F_LOOP, 0},   {"cross-host", F_CROSS_HOST, 0},
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
                              "cross-host, ignore-range", t);
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
    pthread_mutex_init(&s->log_lock, NULL);
    s->dir = realpath(o->dir, NULL);
    s->page_size = o->page_size ? o->page_size : 1000;
    khub_status st = parse_faults(s, o->faults ? o->faults : getenv("KHUB_SERVE_FAULTS"));
    if (st != KHUB_STATUS_OK) goto fail;
    if (o->log_path && !(s->log = fopen(o->log_path, "a"))) {
        st = khub__fail(NULL, KHUB_STATUS_IO, "serve: cannot open log %s: %s", o->log_path,
                        strerror(errno));
        goto fail;
    }
    s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION,
                            0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &sa,
                            MHD_OPTION_UNESCAPE_CALLBACK, keep_escaped, NULL,
                            MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_END);
    if (!s->d) {
        st = khub__fail(NULL, KHUB_STATUS_IO, "serve: cannot listen on %s:%u (port in use?)",
                        host, o->port);
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
    pthread_mutex_destroy(&s->log_lock);
    free(s->dir);
    free(s);
}
