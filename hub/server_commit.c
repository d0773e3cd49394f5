/*
 * server_commit.c: one commit of `khub serve` (POST .../commit/{branch}),
 * NDJSON or JSON. The new commit's tree starts as a hard-linked copy of the
 * branch head's, the operations (file, lfsFile, deletedFile, deletedFolder)
 * replace names in it by rename, it is renamed into commits/, and then
 * refs.json is replaced by rename (server_store.c), so a crash leaves the
 * old state or at worst an unreferenced commit directory.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "server_impl.h"

#define MAX_COMMIT_OPS 100000

/* ======================================================================== */
/* Operations                                                               */
/* ======================================================================== */

typedef struct commit_ctx {
    const repo *r;
    char tree[KHUB__PATH_MAX]; /* the new commit's tree while it is built */
    unsigned code;             /* error answer: 400, 404, 409, 413, 422 */
    char err[300];
    const char *err_code;
    cJSON *lfs;      /* {path: true} for the files stored through LFS, for log/ */
    path_set lfs_at; /* each of lfs's paths -> its item (lfs's own key strings) */
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

/* ------------------------------------------------------------------------ */
/* LFS marks: the paths stored through LFS, for the commit's log           */
/* ------------------------------------------------------------------------ */

/* Forgets the LFS mark of rel: a file, or nothing. */
static void mark_forget(commit_ctx *x, const char *rel)
{
    cJSON *e = khub__srv_path_set_take(&x->lfs_at, rel);
    if (e) cJSON_Delete(cJSON_DetachItemViaPointer(x->lfs, e));
}

/* Forgets the marks of the files in the folder full (rel in the tree),
 * before it is removed. The marks name files of the tree (put_file made
 * each, and a file operation on a marked path forgets it), so this walk
 * finds every mark under rel: one lookup per file, where a walk of every
 * mark per deleted folder was quadratic. */
static void marks_forget_under(commit_ctx *x, const char *full, const char *rel, int depth)
{
    DIR *d = depth < 64 ? opendir(full) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char a[KHUB__PATH_MAX], b[KHUB__PATH_MAX];
        struct stat sb;
        if (!KHUB__PATHF(a, "%s/%s", full, de->d_name) || !KHUB__PATHF(b, "%s/%s", rel, de->d_name))
            continue;
        mark_forget(x, b);
        if (lstat(a, &sb) == 0 && S_ISDIR(sb.st_mode)) marks_forget_under(x, a, b, depth + 1);
    }
    if (d) closedir(d);
}

/* Marks rel as stored through LFS, last in the log's order (as a path
 * marked before moves there); 0 when out of memory. */
static int mark_set(commit_ctx *x, const char *rel)
{
    mark_forget(x, rel);
    cJSON *e = cJSON_CreateTrue();
    if (!e || !cJSON_AddItemToObject(x->lfs, rel, e)) {
        cJSON_Delete(e);
        return 0;
    }
    if (khub__srv_path_set_add(&x->lfs_at, e->string, e) < 0) {
        cJSON_Delete(cJSON_DetachItemViaPointer(x->lfs, e));
        return 0;
    }
    return 1;
}

/* The marks the parent's log carries, indexed (a path there twice is kept
 * once, its first); 0 when out of memory. */
static int marks_init(commit_ctx *x, const cJSON *parent_marks)
{
    x->lfs = cJSON_IsObject(parent_marks) ? cJSON_Duplicate(parent_marks, 1) : cJSON_CreateObject();
    cJSON *e = x->lfs ? x->lfs->child : NULL;
    while (e) {
        cJSON *next = e->next;
        int added = e->string ? khub__srv_path_set_add(&x->lfs_at, e->string, e) : 0;
        if (added < 0) return 0;
        if (!added) cJSON_Delete(cJSON_DetachItemViaPointer(x->lfs, e));
        e = next;
    }
    return x->lfs != NULL;
}

static void marks_free(commit_ctx *x)
{
    khub__srv_path_set_free(&x->lfs_at);
    cJSON_Delete(x->lfs);
    x->lfs = NULL;
}

/* ------------------------------------------------------------------------ */
/* The operations                                                           */
/* ------------------------------------------------------------------------ */

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
        if (!khub__srv_mkdirs_under(x->tree, dir))
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
            char *buf = khub__srv_read_file(from, &m, SIZE_MAX / 2);
            int ok = buf && khub__srv_write_atomic(full, buf, m);
            free(buf);
            return ok ? 1 : cfail(x, 500, "cannot store %.200s", rel);
        }
        if (rename(tmp, full) != 0) {
            unlink(tmp);
            return cfail(x, 500, "cannot store %.200s: %s", rel, strerror(errno));
        }
        return 1;
    }
    return khub__srv_write_atomic(full, data, n) ? 1 : cfail(x, 500, "cannot write %.200s", rel);
}

static int op_file(commit_ctx *x, const cJSON *v)
{
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(v, "path");
    if (cJSON_IsString(path)) mark_forget(x, path->valuestring);
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
    if (!cJSON_IsString(path) || !cJSON_IsString(oid) ||
        !khub__srv_is_sha256_lower(oid->valuestring))
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
    if (sz && (!khub__srv_json_size(sz, MAX_LFS_OBJECT, &size) || size != (uint64_t)sb.st_size))
        return cfail(x, 422, "lfsFile %.200s: size does not match the stored object",
                     path->valuestring);
    if (!mark_set(x, path->valuestring)) return cfail(x, 500, "out of memory");
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
        marks_forget_under(x, full, rel, 0);
        khub__rmtree(full);
        return 1;
    }
    mark_forget(x, rel);
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

/* ======================================================================== */
/* The body                                                                 */
/* ======================================================================== */

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
    /* counted here: cJSON_GetArraySize walks the list, which made the
     * check of every NDJSON line O(lines) and the body O(lines^2) */
    int n_ops = 0;
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
            if (n_ops++ >= MAX_COMMIT_OPS) {
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
        n_ops = 1; /* the header, as an NDJSON body's header line counts */
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, kinds[i].list), *e;
            cJSON_ArrayForEach(e, arr)
            {
                if (n_ops++ >= MAX_COMMIT_OPS) { /* the NDJSON form's limit */
                    cJSON_Delete(j);
                    return cfail(x, 413, "commit body: more than %d operations", MAX_COMMIT_OPS);
                }
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

/* ======================================================================== */
/* The commit                                                               */
/* ======================================================================== */

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
            char *data = khub__srv_read_file(a, &n, SIZE_MAX / 2);
            ok = data && khub__srv_write_atomic(b, data, n);
            free(data);
        }
    }
    closedir(d);
    return ok;
}

/* log/<id>.json: what GET .../commits/{rev} lists and which paths were
 * stored through LFS (so they are served as LFS files whatever their name). */
static int write_log(const repo *r, const char *id, const char *parent, const cJSON *hdr,
                     cJSON *lfs)
{
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(hdr, "summary");
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(hdr, "description");
    char when[32], path[KHUB__PATH_MAX];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    if (parent) cJSON_AddStringToObject(j, "parent", parent);
    cJSON_AddStringToObject(j, "title", cJSON_IsString(sum) ? sum->valuestring : "");
    cJSON_AddStringToObject(j, "message", cJSON_IsString(desc) ? desc->valuestring : "");
    cJSON_AddStringToObject(j, "date", when);
    cJSON_AddItemToObject(j, "lfs", lfs ? cJSON_Duplicate(lfs, 1) : cJSON_CreateObject());
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    int ok = text && khub__srv_mkdirs_under(r->root, "log") &&
             KHUB__PATHF(path, "%s/log/%s.json", r->root, id) &&
             khub__srv_write_atomic(path, text, strlen(text));
    free(text);
    return ok;
}

/* POST .../commit/{branch}: builds commits/<new> from the branch head plus
 * the operations in a temp directory, renames it into place, then moves the
 * branch in refs.json (itself replaced by rename): a crash at any point
 * leaves either the old state or an unreferenced commit directory. */
MHD_RESULT khub__srv_api_commit(khub__server *s, struct MHD_Connection *c, repo *r,
                                const char *branch, const char *api_type, conn *k)
{
    const char *pr = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "create_pr");
    if (pr && strcmp(pr, "0") && strcmp(pr, "false"))
        return khub__srv_send_error(c, 400, NULL, NULL,
                                    "pull requests are not supported by khub serve");
    const char *head = khub__srv_branch_head(r, branch);
    if (!head)
        return khub__srv_send_error(c, 404, "RevisionNotFound", NULL,
                                    "Invalid rev id: commits go to an existing branch");
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    int ndjson = !ct || strncmp(ct, "application/json", 16) != 0;
    commit_ctx x = {.r = r};
    cJSON *ops = NULL;
    const cJSON *hdr = NULL;
    char parent[41], id[41], cdir[KHUB__PATH_MAX], final[KHUB__PATH_MAX];
    memcpy(parent, head, 41);
    if (!marks_init(&x, cJSON_GetObjectItemCaseSensitive(khub__srv_commit_log(r, parent), "lfs"))) {
        cfail(&x, 500, "out of memory");
        goto fail;
    }
    if (!parse_commit_body(&x, k->body ? k->body : (char *)"", k->n, ndjson, &ops, &hdr)) goto fail;
    const cJSON *pc = cJSON_GetObjectItemCaseSensitive(hdr, "parentCommit");
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(hdr, "summary");
    if (cJSON_IsString(pc) && pc->valuestring[0] && strcmp(pc->valuestring, parent) != 0) {
        cJSON_Delete(ops);
        marks_free(&x);
        return khub__srv_send_error(
            c, 412, NULL, NULL,
            "parentCommit is not the head of the branch (it moved); fetch the "
            "new head and retry");
    }
    khub__srv_new_commit_id(parent, cJSON_IsString(sum) ? sum->valuestring : "", id);
    khub__srv_commit_dir(r, parent, cdir, sizeof cdir);
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
    khub__srv_fsync_path(final);
    int logged = write_log(r, id, parent, hdr, x.lfs);
    khub__srv_refs_set(r, "branches", branch, id);
    if (!logged || !khub__srv_refs_save(r)) {
        khub__rmtree(final);
        cJSON_Delete(ops);
        marks_free(&x);
        return khub__srv_send_error(c, 500, NULL, NULL,
                                    logged ? "cannot update refs.json" : "cannot write log/");
    }
    cJSON_Delete(ops);
    marks_free(&x);
    char base[300], url[1024];
    khub__srv_self_url(c, base, sizeof base);
    snprintf(url, sizeof url, "%s/%s%s/%s/commit/%s", base,
             strcmp(api_type, "models") ? "kernels/" : "", r->org, r->name, id);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddTrueToObject(j, "success");
    cJSON_AddStringToObject(j, "commitOid", id);
    cJSON_AddStringToObject(j, "commitUrl", url);
    cJSON_AddStringToObject(j, "hookOutput", "");
    (void)s;
    return khub__srv_send_json(c, 200, j, NULL, NULL);
fail:
    if (x.tree[0]) khub__rmtree(x.tree);
    cJSON_Delete(ops);
    marks_free(&x);
    return khub__srv_send_error(c, x.code ? x.code : 400, x.err_code, NULL, x.err);
}
