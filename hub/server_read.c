/*
 * server_read.c: the read endpoints of `khub serve`, for the "kernels/" and
 * model ("") prefixes: the subset of the protocol that huggingface_hub
 * needs. Repo info at a revision, refs, tree listings (recursive or not,
 * paginated with self-pointing Link headers), paths-info (a POST with a
 * form or JSON body), and HEAD/GET on resolve URLs with X-Repo-Commit,
 * ETag, X-Linked-Etag/X-Linked-Size for LFS files, Range, and X-Error-Code
 * on every error. It never advertises xet.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server_impl.h"

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

static cJSON *entry_json(const repo *r, const char *commit, const char *cdir, const fentry *e,
                         ids_memo *memo)
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
    int lfs = khub__srv_is_lfs_at(r, commit, e->path);
    file_ids ids;
    /* hashed from the file reached without links, as it is served */
    struct stat sb;
    int fd = khub__srv_open_in(cdir, e->path, &sb);
    int ok = fd >= 0 && S_ISREG(sb.st_mode) &&
             khub__srv_file_ids_memo(r->dc, memo, full, fd, &sb, lfs, &ids);
    if (fd >= 0) close(fd);
    if (!ok) {
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
    khub__srv_commit_dir(r, commit, cdir, sizeof cdir);
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
    return khub__srv_send_json(c, 200, j, NULL, NULL);
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
    return khub__srv_send_json(c, 200, j, NULL, NULL);
}

static int arg_true(struct MHD_Connection *c, const char *key)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, key);
    return v && (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1"));
}

/* Appends key[=value] (still percent-encoded: the server does not unescape)
 * to the query in cls, except the cursor; a pair that does not fit is left
 * out rather than cut. */
static MHD_RESULT keep_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    char *q = cls;
    size_t n = strlen(q), cap = 2048 - 40; /* room for the cursor */
    if (!strcmp(key, "cursor")) return MHD_YES;
    int w = snprintf(q + n, cap - n, "%s%s%s%s", n ? "&" : "", key, value ? "=" : "",
                     value ? value : "");
    if (w < 0 || (size_t)w >= cap - n) q[n] = '\0';
    return MHD_YES;
}

static MHD_RESULT api_tree(khub__server *s, struct MHD_Connection *c, const repo *r,
                           const char *commit, const char *sub, const char *raw_url)
{
    char cdir[KHUB__PATH_MAX], base[KHUB__PATH_MAX];
    khub__srv_commit_dir(r, commit, cdir, sizeof cdir);
    int recursive = arg_true(c, "recursive");
    if (sub[0]) {
        struct stat sb;
        if (!KHUB__PATHF(base, "%s/%s", cdir, sub) || khub__srv_stat_in(cdir, sub, &sb) != 0 ||
            !S_ISDIR(sb.st_mode))
            return khub__srv_send_error(c, 404, "EntryNotFound", commit,
                                        "path not found at revision");
    }
    flist l = {0};
    walk(cdir, sub, &l, 0, recursive);
    qsort(l.v, l.n, sizeof *l.v, cmp_fentry);
    const char *cur = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
    size_t from = cur ? strtoull(cur, NULL, 10) : 0, end = from + s->page_size;
    if (end > l.n) end = l.n;
    cJSON *arr = cJSON_CreateArray();
    ids_memo memo = {0};
    for (size_t i = from; i < end; i++) {
        cJSON *e = entry_json(r, commit, cdir, &l.v[i], &memo);
        if (e) cJSON_AddItemToArray(arr, e);
    }
    khub__srv_ids_memo_free(&memo);
    if ((s->faults & (F_TREE_DOTDOT | F_TREE_ABS)) && from == 0) { /* a malicious server */
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "file");
        cJSON_AddStringToObject(
            e, "path", s->faults & F_TREE_DOTDOT ? "build/../../escape.so" : "/tmp/escape.so");
        cJSON_AddNumberToObject(e, "size", 1);
        cJSON_AddStringToObject(e, "oid", "0123456789abcdef0123456789abcdef01234567");
        cJSON_AddItemToArray(arr, e);
    }
    char *text = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (end < l.n) {
        const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
        char away[96], query[2048] = "", link[4096];
        snprintf(away, sizeof away, "localhost:%u", s->port);
        if (s->faults & F_LINK_USERINFO) /* the endpoint as a prefix; the host is localhost */
            snprintf(away, sizeof away, "127.0.0.1:%u@localhost:%u", s->port, s->port);
        if (s->faults & (F_LINK_AWAY | F_LINK_USERINFO)) host = away; /* on another host */
        /* The request's own parameters, as sent, with the cursor replaced:
         * a client follows the link as given (expand=true stays true). */
        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, keep_arg, query);
        size_t ql = strlen(query);
        snprintf(query + ql, sizeof query - ql, "%scursor=%zu", ql ? "&" : "", end);
        snprintf(link, sizeof link, "<http://%s%s?%s>; rel=\"next\"",
                 host && !strpbrk(host, "/\\\"<> ") ? host : "127.0.0.1", raw_url, query);
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

enum { RANGE_NONE, RANGE_OK, RANGE_UNSAT };

/* A Range header against a file of n bytes (RFC 9110 14.1.2):
 * "bytes=a-b", "bytes=a-" and the suffix "bytes=-k" (the last k bytes) give
 * RANGE_OK and [*off, *off + *len); a first byte at or past the end, or a
 * zero suffix, RANGE_UNSAT (416). Anything else is RANGE_NONE, answered
 * with the whole file (200) as the RFC allows: a syntax we do not read,
 * and a multi-range request ("bytes=0-1,5-6"), which the Hub's storage
 * (S3) answers the same way instead of a multipart/byteranges body. */
static int range_of(const char *h, uint64_t n, uint64_t *off, uint64_t *len)
{
    if (!h || strncmp(h, "bytes=", 6) != 0 || strchr(h, ',')) return RANGE_NONE;
    const char *p = h + 6;
    char *end;
    if (*p == '-') {
        if (!isdigit((unsigned char)p[1])) return RANGE_NONE;
        uint64_t k = strtoull(p + 1, &end, 10);
        if (*end) return RANGE_NONE;
        if (k == 0 || n == 0) return RANGE_UNSAT;
        if (k > n) k = n;
        *off = n - k;
        *len = k;
        return RANGE_OK;
    }
    if (!isdigit((unsigned char)*p)) return RANGE_NONE;
    uint64_t a = strtoull(p, &end, 10), b = UINT64_MAX;
    if (*end != '-') return RANGE_NONE;
    if (end[1]) {
        const char *q = end + 1;
        if (!isdigit((unsigned char)*q)) return RANGE_NONE;
        b = strtoull(q, &end, 10);
        if (*end || b < a) return RANGE_NONE;
    }
    if (a >= n) return RANGE_UNSAT;
    *off = a;
    *len = (b < n ? b : n - 1) - a + 1;
    return RANGE_OK;
}

/* The Content-Type of a served file, by its extension. */
static const char *content_type_of(const char *path)
{
    static const struct {
        const char *ext, *type;
    } types[] = {{".json", "application/json"},
                 {".md", "text/markdown; charset=utf-8"},
                 {".txt", "text/plain; charset=utf-8"},
                 {".py", "text/x-python; charset=utf-8"},
                 {".toml", "text/plain; charset=utf-8"},
                 {".yaml", "text/yaml; charset=utf-8"},
                 {".yml", "text/yaml; charset=utf-8"},
                 {".gitattributes", "text/plain; charset=utf-8"},
                 {".ptx", "text/plain; charset=utf-8"},
                 {".sig", "application/octet-stream"},
                 {".gz", "application/gzip"}};
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t bl = strlen(base);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        size_t el = strlen(types[i].ext);
        if (bl >= el && !strcmp(base + bl - el, types[i].ext)) return types[i].type;
    }
    return "application/octet-stream";
}

static MHD_RESULT serve_file(khub__server *s, struct MHD_Connection *c, const repo *r,
                             const char *commit, const char *path, int head, int via_cdn)
{
    char cdir[KHUB__PATH_MAX], full[KHUB__PATH_MAX];
    khub__srv_commit_dir(r, commit, cdir, sizeof cdir);
    struct stat sb;
    /* fd: the file reached without a link on the way (server_impl.h) */
    int fd = KHUB__PATHF(full, "%s/%s", cdir, path) ? khub__srv_open_in(cdir, path, &sb) : -1;
    if (fd >= 0 && !S_ISREG(sb.st_mode)) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) return khub__srv_send_error(c, 404, "EntryNotFound", commit, "Entry not found");
    int lfs = khub__srv_is_lfs_at(r, commit, path);
    file_ids ids;
    /* the digests of what fd holds: a file renamed over path since the open
     * must not lend its ETag to fd's bytes */
    if (!khub__srv_file_ids_of_fd(r->dc, full, fd, lfs, &ids)) {
        close(fd);
        return khub__srv_send_error(c, 500, NULL, commit, "cannot hash the file");
    }
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
        close(fd);
        return ret;
    }

    uint64_t n = (uint64_t)sb.st_size;
    uint64_t off = 0, len = n;
    int ranged =
        s->faults & F_IGNORE_RANGE
            ? RANGE_NONE
            : range_of(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range"), n, &off, &len);
    unsigned code = 200;
    char crange[96] = "";
    if (ranged != RANGE_NONE) {
        if (ranged == RANGE_UNSAT) {
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
        code = 206;
        snprintf(crange, sizeof crange, "bytes %llu-%llu/%llu", (unsigned long long)off,
                 (unsigned long long)(off + len - 1), (unsigned long long)n);
    }
    struct MHD_Response *resp = NULL;
    const char *why = "cannot create the response";
    if (head || !khub__srv_body_faults(s)) {
        /* sendfile; a faulted body is read by a callback (server_faults.c) */
        resp = MHD_create_response_from_fd_at_offset64(len, fd, off); /* owns fd */
        if (!resp) close(fd);
    } else {
        resp = khub__srv_fault_body(s, fd, off, len, &why);
    }
    if (!resp) return khub__srv_send_error(c, 500, NULL, commit, why);
    MHD_add_response_header(resp, "X-Repo-Commit",
                            s->faults & F_WRONG_COMMIT ? "0000000000000000000000000000000000000000"
                                                       : commit);
    MHD_add_response_header(resp, "ETag", quoted);
    MHD_add_response_header(resp, "Accept-Ranges", "bytes");
    MHD_add_response_header(resp, "Content-Type", content_type_of(path));
    if (lfs) {
        MHD_add_response_header(resp, "X-Linked-Etag", quoted);
        MHD_add_response_header(resp, "X-Linked-Size", size_s);
    }
    if (crange[0]) MHD_add_response_header(resp, "Content-Range", crange);
    MHD_RESULT ret = MHD_queue_response(c, code, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ------------------------------------------------------------------------ */
/* paths-info: a read that is a POST                                        */
/* ------------------------------------------------------------------------ */

#define MAX_PATHS_INFO 10000

/* What one paths-info request has answered: the paths it named, and the
 * digests it computed (ids_memo). */
typedef struct answered {
    path_set paths;
    ids_memo ids;
} answered;

/* Appends the entry of one requested path when it exists (files and
 * directories) and was not named before; unknown or unsafe paths are left
 * out, as the Hub does. Called at most MAX_PATHS_INFO times per request.
 * A path named twice is answered once (seen holds the request's own
 * strings, alive while it is answered): anyone may POST paths-info, and a
 * file younger than the digest cache's 2 s is hashed each time it is looked
 * up, so 10,000 copies of one large fresh path would otherwise cost 10,000
 * hashes of it. */
static void paths_info_add(const repo *r, const char *commit, const char *cdir, const char *path,
                           cJSON *arr, answered *seen)
{
    char full[KHUB__PATH_MAX];
    struct stat sb;
    if (khub__srv_path_set_add(&seen->paths, path, (void *)path) == 0) return; /* -1: OOM */
    if (!KHUB__PATHF(full, "%s/%s", cdir, path) || khub__srv_stat_in(cdir, path, &sb) != 0 ||
        !(S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode)))
        return;
    fentry e = {(char *)path, S_ISDIR(sb.st_mode), (uint64_t)sb.st_size};
    cJSON *j = entry_json(r, commit, cdir, &e, &seen->ids);
    if (j) cJSON_AddItemToArray(arr, j);
}

/* A form body (huggingface_hub: "paths=a&paths=b&expand=false", '+' for a
 * space) into arr; -1 on a bad escape, else the number of paths. */
static int paths_info_form(const repo *r, const char *commit, const char *cdir, char *text,
                           cJSON *arr, answered *seen)
{
    int n = 0;
    char *save = NULL;
    for (char *kv = strtok_r(text, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) continue;
        *eq = '\0';
        for (char *p = eq + 1; *p; p++)
            if (*p == '+') *p = ' ';
        if (!khub__srv_pct_decode(kv) || !khub__srv_pct_decode(eq + 1)) return -1;
        if (strcmp(kv, "paths") != 0) continue;
        if (++n > MAX_PATHS_INFO) return n;
        paths_info_add(r, commit, cdir, eq + 1, arr, seen);
    }
    return n;
}

/* A JSON body (the JS client: {"paths":[...],"expand":bool}); -1 when it
 * is not that shape, else the number of paths. */
static int paths_info_json(const repo *r, const char *commit, const char *cdir, const char *text,
                           size_t len, cJSON *arr, answered *seen)
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
        paths_info_add(r, commit, cdir, p->valuestring, arr, seen);
    }
    cJSON_Delete(j);
    return n;
}

static MHD_RESULT api_paths_info(struct MHD_Connection *c, const repo *r, const char *rev, conn *k)
{
    char commit[41], cdir[KHUB__PATH_MAX];
    if (k->too_big) return khub__srv_send_error(c, 413, NULL, NULL, "request body over 64 MiB");
    if (!khub__srv_repo_resolve(r, rev, commit))
        return khub__srv_send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id");
    khub__srv_commit_dir(r, commit, cdir, sizeof cdir);
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    int json = ct && strncasecmp(ct, "application/json", 16) == 0;
    answered seen = {0};
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return khub__srv_send_error(c, 500, NULL, commit, "out of memory");
    int n = !k->body ? 0
            : json   ? paths_info_json(r, commit, cdir, k->body, k->n, arr, &seen)
                     : paths_info_form(r, commit, cdir, k->body, arr, &seen);
    khub__srv_path_set_free(&seen.paths);
    khub__srv_ids_memo_free(&seen.ids);
    if (n < 0 || n > MAX_PATHS_INFO) {
        cJSON_Delete(arr);
        return khub__srv_send_error(c, 400, NULL, NULL,
                                    n < 0 ? "paths-info needs a form body (paths=...) or JSON "
                                            "{\"paths\":[...]}"
                                          : "paths-info: more than 10000 paths in one request");
    }
    return khub__srv_send_json(c, 200, arr, NULL, commit);
}

int khub__srv_is_paths_info(char **seg, int n)
{
    return n == 6 && !strcmp(seg[0], "api") &&
           (!strcmp(seg[1], "kernels") || !strcmp(seg[1], "models")) &&
           !strcmp(seg[4], "paths-info");
}

/* Answered like a GET: no token, no write lock. */
MHD_RESULT khub__srv_route_paths_info(khub__server *s, struct MHD_Connection *c, char **seg,
                                      conn *k)
{
    repo r;
    MHD_RESULT ret;
    if (!khub__srv_read_auth(s, c, &ret)) return ret;
    if (!khub__srv_repo_open(s, seg[2], seg[3], &r)) {
        khub__srv_repo_close(&r);
        return khub__srv_send_error(c, 404, "RepoNotFound", NULL, "Repository not found");
    }
    ret = api_paths_info(c, &r, seg[5], k);
    khub__srv_repo_close(&r);
    return ret;
}

/* ======================================================================== */
/* Read routing                                                             */
/* ======================================================================== */

MHD_RESULT khub__srv_route_read(khub__server *s, struct MHD_Connection *c, const char *url,
                                int head, char **seg, int n)
{
    MHD_RESULT ret;
    if (!khub__srv_read_auth(s, c, &ret) || khub__srv_route_hub(s, c, seg, n, &ret)) return ret;
    int api = n > 0 && strcmp(seg[0], "api") == 0;
    int k = api ? 1 : 0;
    if (api && (n < 2 || (strcmp(seg[1], "kernels") && strcmp(seg[1], "models"))))
        return khub__srv_send_error(c, 404, NULL, NULL, "unknown endpoint");
    if (api) k = 2;
    int cdn = !api && n > 0 && strcmp(seg[0], "cdn") == 0;
    if (cdn) {
        if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))
            return khub__srv_send_error(c, 400, NULL, NULL, "Authorization sent to the CDN host");
        k = 1;
    } else if (!api && n > 0 && strcmp(seg[0], "kernels") == 0) {
        k = 1;
    }
    if (n < k + 2)
        return khub__srv_send_error(c, 404, "RepoNotFound", NULL, "Repository not found");
    /* The type the URL asks for: /api/kernels/ and /kernels/ are kernel
     * repos, /api/models/ and bare /{org}/{name}/ model repos. */
    const char *type = api ? (strcmp(seg[1], "kernels") ? "model" : "kernel")
                           : (k == 1 && !cdn ? "kernel" : "model");
    repo r;
    if (!khub__srv_repo_open(s, seg[k], seg[k + 1], &r) ||
        (!cdn && !khub__srv_repo_is_type(&r, type))) {
        khub__srv_repo_close(&r);
        return khub__srv_send_error(c, 404, "RepoNotFound", NULL, "Repository not found");
    }
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
                  : khub__srv_send_error(c, 404, NULL, NULL, "not found");
    } else if (api && !verb[0]) {
        ret = khub__srv_repo_resolve(&r, "main", commit)
                  ? api_info(s, c, &r, commit)
                  : khub__srv_send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id: main");
    } else if (api && !strcmp(verb, "refs")) {
        ret = api_refs(c, &r);
    } else if ((api &&
                (!strcmp(verb, "revision") || !strcmp(verb, "tree") || !strcmp(verb, "commits"))) ||
               (!api && !strcmp(verb, "resolve"))) {
        if (n < k + 4) {
            ret = khub__srv_send_error(c, 404, NULL, NULL, "missing revision");
        } else if (!khub__srv_repo_resolve(&r, seg[k + 3], commit)) {
            ret = khub__srv_send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id");
        } else if (!strcmp(verb, "revision")) {
            ret = api_info(s, c, &r, commit);
        } else if (!strcmp(verb, "tree")) {
            ret = api_tree(s, c, &r, commit, sub, url);
        } else if (!strcmp(verb, "commits")) {
            ret = khub__srv_api_commits(c, &r, commit);
        } else if ((s->faults & F_MOVED) &&
                   !MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "moved")) {
            /* A relative redirect on the same host, as the Hub answers for
             * a renamed repo: the client keeps its token for it. */
            char loc[KHUB__PATH_MAX];
            snprintf(loc, sizeof loc, "%s?moved=1", url);
            struct MHD_Response *resp =
                MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(resp, "Location", loc);
            ret = MHD_queue_response(c, 307, resp);
            MHD_destroy_response(resp);
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
        ret = khub__srv_send_error(c, 404, NULL, NULL, "unknown endpoint");
    }
    khub__srv_repo_close(&r);
    return ret;
}
