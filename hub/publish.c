/*
 * publish.c: `khub publish DIR` over the Hub's write protocol (publish.h
 * lists the sequence; shared/reference/hub-protocol.md section 5 the
 * protocol).
 *
 * Ordering: every object is uploaded before the commit that names it, and
 * the commit carries parentCommit = the head the publish read, so a
 * concurrent push makes the server answer 412 instead of silently
 * dropping someone's files. The same guard makes a retried commit POST
 * (http.c retries 5xx) harmless: if the first one landed, the retry gets
 * 412 and a rerun of publish finds nothing to change.
 *
 * What is uploaded: build/<variant>/ (every regular file, recursively) for
 * each variant directory holding a metadata.json, and build/<variant>.tar.gz
 * next to it. Anything else under DIR is not published. A symlink or a name
 * that is not a safe repo path fails the publish: the build is expected to
 * be plain files. Collecting those files is publish_collect.c's.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "kernel_manifest.h"
#include "publish_impl.h"

#define PREUPLOAD_BATCH 256
#define LFS_BATCH       100
#define MAX_INLINE      (64u << 20)

/* ======================================================================== */
/* HTTP                                                                     */
/* ======================================================================== */

/* 401/403 get the publishing hint, 409 EXISTS, 412 the moved-branch hint;
 * the rest as http.c maps them. */
static khub_status pub_error(khub__pub *p, const khub__http_resp *r, const char *what)
{
    khub_hub *hub = p->hub;
    if (r->status == 401 || r->status == 403)
        return khub__hub_fail(hub, KHUB_STATUS_UNAUTHORIZED,
                              "%s: HTTP %ld: token %s; publishing needs a token with write "
                              "access to %s (set HF_TOKEN or khub_hub_opts.token)%s",
                              what, r->status,
                              hub->token ? "rejected or it lacks write access" : "missing",
                              p->id.org,
                              r->status == 403 && !strcmp(p->type, "kernels")
                                  ? "; kernel repos also need kernel-creation access"
                                  : "");
    if (r->status == 409)
        return khub__hub_fail(hub, KHUB_STATUS_EXISTS, "%s: HTTP 409 conflict%s%s", what,
                              r->error_message[0] ? ": " : "", r->error_message);
    if (r->status == 412)
        return khub__hub_fail(hub, KHUB_STATUS_HTTP,
                              "%s: HTTP 412: branch %s moved since this publish read it "
                              "(%.12s); someone else pushed: rerun khub publish",
                              what, p->res->branch, p->head);
    return khub__http_error(hub, r, what);
}

/* One request with a JSON (or NDJSON) body; r holds the answer, whatever
 * its status. */
static khub_status send_body(khub__pub *p, const char *method, const char *url, const char *ctype,
                             const char *body, size_t n, const char *what, khub__http_resp *r)
{
    int lfs = ctype && strstr(ctype, "git-lfs") != NULL;
    khub__http_req req = {.method = method,
                          .url = url,
                          .auth = 1,
                          .what = what,
                          .body = body,
                          .body_len = n,
                          .content_type = ctype,
                          .accept = lfs ? ctype : NULL};
    return khub__http_fetch(p->hub, &req, r);
}

static khub_status send_json_obj(khub__pub *p, const char *method, const char *url, cJSON *j,
                                 const char *ctype, const char *what, khub__http_resp *r)
{
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return khub__hub_fail(p->hub, KHUB_STATUS_NOMEM, "%s: out of memory", what);
    khub_status st =
        send_body(p, method, url, ctype ? ctype : "application/json", text, strlen(text), what, r);
    cJSON_free(text);
    return st;
}

static int ok2xx(const khub__http_resp *r) { return r->status >= 200 && r->status < 300; }

static khub_status api_url(khub__pub *p, char *buf, size_t size, const char *verb, const char *arg)
{
    char q[600] = "";
    if (arg) KHUB_FORWARD_IF_ERROR(NULL, khub__url_quote(p->hub, arg, 0, q, sizeof q));
    if (snprintf(buf, size, "%s/api/%s/%s/%s/%s%s%s", p->hub->endpoint, p->type, p->id.org,
                 p->id.name, verb, arg ? "/" : "", q) >= (int)size)
        return khub__hub_fail(p->hub, KHUB_STATUS_OVERFLOW, "URL too long for %s", verb);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Repo and branch                                                          */
/* ======================================================================== */

static khub_status create_repo(khub__pub *p)
{
    char url[1024], what[300];
    snprintf(url, sizeof url, "%s/api/repos/create", p->hub->endpoint);
    snprintf(what, sizeof what, "creating repo %s/%s", p->id.org, p->id.name);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", p->id.name);
    cJSON_AddStringToObject(j, "organization", p->id.org);
    cJSON_AddStringToObject(j, "type", strcmp(p->type, "kernels") ? "model" : "kernel");
    cJSON_AddFalseToObject(j, "private");
    khub__http_resp r = {0};
    khub_status st = send_json_obj(p, "POST", url, j, NULL, what, &r);
    if (st == KHUB_STATUS_OK && r.status != 409 && !ok2xx(&r)) st = pub_error(p, &r, what);
    p->res->created_repo = st == KHUB_STATUS_OK && r.status != 409;
    khub__http_resp_free(&r);
    return st;
}

/* Reads branch `branch`'s head into head ("" when the branch is absent). */
static khub_status read_head(khub__pub *p, const char *branch, char head[41])
{
    char url[1024], what[300];
    KHUB_FORWARD_IF_ERROR(NULL, api_url(p, url, sizeof url, "refs", NULL));
    snprintf(what, sizeof what, "reading the refs of %s/%s", p->id.org, p->id.name);
    khub__http_resp r = {0};
    khub__http_req req = {.method = "GET", .url = url, .auth = 1, .what = what};
    khub_status st = khub__http_fetch(p->hub, &req, &r);
    if (st == KHUB_STATUS_OK && !ok2xx(&r)) st = pub_error(p, &r, what);
    head[0] = '\0';
    if (st == KHUB_STATUS_OK) {
        cJSON *j = cJSON_Parse(r.body ? r.body : "");
        cJSON *br = cJSON_GetObjectItemCaseSensitive(j, "branches"), *b;
        if (!cJSON_IsArray(br))
            st = khub__hub_fail(p->hub, KHUB_STATUS_PARSE, "%s: no \"branches\" array", what);
        cJSON_ArrayForEach(b, br)
        {
            cJSON *n = cJSON_GetObjectItemCaseSensitive(b, "name");
            cJSON *t = cJSON_GetObjectItemCaseSensitive(b, "targetCommit");
            if (cJSON_IsString(n) && !strcmp(n->valuestring, branch) && cJSON_IsString(t) &&
                khub__is_commit_hex(t->valuestring))
                memcpy(head, t->valuestring, 41);
        }
        cJSON_Delete(j);
    }
    khub__http_resp_free(&r);
    return st;
}

static khub_status ensure_branch(khub__pub *p)
{
    const char *branch = p->res->branch;
    KHUB_FORWARD_IF_ERROR(NULL, read_head(p, branch, p->head));
    if (p->head[0]) return KHUB_STATUS_OK;
    char url[1024], what[300];
    KHUB_FORWARD_IF_ERROR(NULL, api_url(p, url, sizeof url, "branch", branch));
    snprintf(what, sizeof what, "creating branch %s of %s/%s", branch, p->id.org, p->id.name);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "startingPoint", "main");
    khub__http_resp r = {0};
    khub_status st = send_json_obj(p, "POST", url, j, NULL, what, &r);
    if (st == KHUB_STATUS_OK && r.status != 409 && !ok2xx(&r)) st = pub_error(p, &r, what);
    p->res->created_branch = st == KHUB_STATUS_OK && r.status != 409;
    khub__http_resp_free(&r);
    KHUB_FORWARD_IF_ERROR(NULL, st);
    KHUB_FORWARD_IF_ERROR(NULL, read_head(p, branch, p->head));
    if (!p->head[0])
        return khub__hub_fail(p->hub, KHUB_STATUS_PARSE,
                              "%s: the server accepted it but the refs do not list it", what);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Classification and LFS                                                   */
/* ======================================================================== */

static char *b64(const khub_allocator *a, const void *data, size_t n)
{
    size_t out;
    if (!khub__mul_ok((n + 2) / 3, 4, &out) || out > INT32_MAX - 1) return NULL;
    char *s = khub__mem_alloc(a, out + 1);
    if (s) EVP_EncodeBlock((unsigned char *)s, data, (int)n);
    if (s) s[out] = '\0';
    return s;
}

static char *sample_b64(const khub_allocator *a, const char *path)
{
    unsigned char buf[512];
    FILE *f = khub__fopen_regular(path, NULL, 0);
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    return b64(a, buf, n);
}

/* p->files is sorted by rel (khub__publish_collect). */
static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const khub__pub_file *)a)->rel, ((const khub__pub_file *)b)->rel);
}

static khub__pub_file *find_file(khub__pub *p, const char *rel)
{
    khub__pub_file key;
    snprintf(key.rel, sizeof key.rel, "%s", rel);
    return bsearch(&key, p->files, p->n, sizeof *p->files, cmp_file);
}

/* POST preupload in batches: uploadMode per file, and unchanged when the
 * server's oid is ours (SHA-256 for LFS, the git blob id for regular). */
static khub_status preupload(khub__pub *p)
{
    char url[1024], what[300];
    KHUB_FORWARD_IF_ERROR(NULL, api_url(p, url, sizeof url, "preupload", p->res->branch));
    snprintf(what, sizeof what, "preupload to %s/%s@%s", p->id.org, p->id.name, p->res->branch);
    for (size_t from = 0; from < p->n; from += PREUPLOAD_BATCH) {
        size_t to = from + PREUPLOAD_BATCH < p->n ? from + PREUPLOAD_BATCH : p->n;
        cJSON *j = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(j, "files");
        for (size_t i = from; i < to; i++) {
            char *s = sample_b64(khub__hub_alloc(p->hub), p->files[i].path);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "path", p->files[i].rel);
            cJSON_AddStringToObject(o, "sample", s ? s : "");
            cJSON_AddNumberToObject(o, "size", (double)p->files[i].size);
            cJSON_AddItemToArray(arr, o);
            khub__mem_free(s);
        }
        khub__http_resp r = {0};
        khub_status st = send_json_obj(p, "POST", url, j, NULL, what, &r);
        if (st == KHUB_STATUS_OK && !ok2xx(&r)) st = pub_error(p, &r, what);
        cJSON *ans = st == KHUB_STATUS_OK ? cJSON_Parse(r.body ? r.body : "") : NULL;
        cJSON *files = cJSON_GetObjectItemCaseSensitive(ans, "files"), *o;
        if (st == KHUB_STATUS_OK && !cJSON_IsArray(files))
            st = khub__hub_fail(p->hub, KHUB_STATUS_PARSE, "%s: no \"files\" in the answer", what);
        cJSON_ArrayForEach(o, files)
        {
            cJSON *path = cJSON_GetObjectItemCaseSensitive(o, "path");
            cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "uploadMode");
            cJSON *oid = cJSON_GetObjectItemCaseSensitive(o, "oid");
            khub__pub_file *f = cJSON_IsString(path) ? find_file(p, path->valuestring) : NULL;
            if (!f || !cJSON_IsString(mode) ||
                (strcmp(mode->valuestring, "lfs") && strcmp(mode->valuestring, "regular"))) {
                st = khub__hub_fail(p->hub, KHUB_STATUS_PARSE,
                                    "%s: an answer names an unknown path or uploadMode", what);
                break;
            }
            f->lfs = !strcmp(mode->valuestring, "lfs");
            f->unchanged =
                cJSON_IsString(oid) && !strcmp(oid->valuestring, f->lfs ? f->sha256 : f->sha1);
        }
        cJSON_Delete(ans);
        khub__http_resp_free(&r);
        KHUB_FORWARD_IF_ERROR(NULL, st);
    }
    for (size_t i = 0; i < p->n; i++) p->res->n_unchanged += p->files[i].unchanged;
    return KHUB_STATUS_OK;
}

/* PUT the bytes to href (no credentials: it is a presigned URL), then POST
 * verify when the server asked for it. */
static khub_status upload_one(khub__pub *p, khub__pub_file *f, const char *href, const char *verify)
{
    char what[1200];
    snprintf(what, sizeof what, "uploading %s", f->rel);
    if (p->hub->progress) p->hub->progress(p->hub->progress_ud, f->rel, 0, f->size);
    khub__http_resp r = {0};
    khub__http_req req = {.method = "PUT",
                          .url = href,
                          .auth = 0,
                          .what = what,
                          .upload_path = f->path,
                          .content_type = "application/octet-stream"};
    khub_status st = khub__http_fetch(p->hub, &req, &r);
    if (st == KHUB_STATUS_OK && !ok2xx(&r)) st = pub_error(p, &r, what);
    khub__http_resp_free(&r);
    KHUB_FORWARD_IF_ERROR(NULL, st);
    if (p->hub->progress) p->hub->progress(p->hub->progress_ud, f->rel, f->size, f->size);
    p->res->n_uploaded++;
    if (!verify) return KHUB_STATUS_OK;
    snprintf(what, sizeof what, "verifying the upload of %s", f->rel);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "oid", f->sha256);
    cJSON_AddNumberToObject(j, "size", (double)f->size);
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return khub__hub_fail(p->hub, KHUB_STATUS_NOMEM, "%s: out of memory", what);
    /* the token only to the endpoint's own origin */
    khub__http_req v = {.method = "POST",
                        .url = verify,
                        .what = what,
                        .body = text,
                        .body_len = strlen(text),
                        .auth = khub__url_same_origin(p->hub->endpoint, verify),
                        .content_type = "application/vnd.git-lfs+json",
                        .accept = "application/vnd.git-lfs+json"};
    st = khub__http_fetch(p->hub, &v, &r);
    cJSON_free(text);
    if (st == KHUB_STATUS_OK && !ok2xx(&r)) st = pub_error(p, &r, what);
    khub__http_resp_free(&r);
    return st;
}

static const char *href_of(const cJSON *actions, const char *name)
{
    cJSON *a = cJSON_GetObjectItemCaseSensitive(actions, name);
    cJSON *h = cJSON_GetObjectItemCaseSensitive(a, "href");
    return cJSON_IsString(h) && (!strncmp(h->valuestring, "http://", 7) ||
                                 !strncmp(h->valuestring, "https://", 8))
               ? h->valuestring
               : NULL;
}

/* One LFS batch call for files [from, to) that need it, then the PUTs. */
static khub_status lfs_batch(khub__pub *p, khub__pub_file **todo, size_t count)
{
    char url[1024], what[300];
    if (snprintf(url, sizeof url, "%s/%s%s/%s.git/info/lfs/objects/batch", p->hub->endpoint,
                 p->prefix, p->id.org, p->id.name) >= (int)sizeof url)
        return khub__hub_fail(p->hub, KHUB_STATUS_OVERFLOW, "LFS batch URL too long");
    snprintf(what, sizeof what, "LFS batch for %s/%s", p->id.org, p->id.name);
    cJSON *j = cJSON_CreateObject(), *arr;
    char ref[64];
    snprintf(ref, sizeof ref, "refs/heads/%s", p->res->branch);
    cJSON_AddStringToObject(j, "operation", "upload");
    cJSON_AddItemToObject(j, "transfers", cJSON_CreateStringArray((const char *[]){"basic"}, 1));
    arr = cJSON_AddArrayToObject(j, "objects");
    for (size_t i = 0; i < count; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "oid", todo[i]->sha256);
        cJSON_AddNumberToObject(o, "size", (double)todo[i]->size);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddStringToObject(j, "hash_algo", "sha256");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(j, "ref"), "name", ref);
    khub__http_resp r = {0};
    khub_status st = send_json_obj(p, "POST", url, j, "application/vnd.git-lfs+json", what, &r);
    if (st == KHUB_STATUS_OK && !ok2xx(&r)) st = pub_error(p, &r, what);
    cJSON *ans = st == KHUB_STATUS_OK ? cJSON_Parse(r.body ? r.body : "") : NULL;
    khub__http_resp_free(&r);
    cJSON *tr = cJSON_GetObjectItemCaseSensitive(ans, "transfer");
    cJSON *objs = cJSON_GetObjectItemCaseSensitive(ans, "objects"), *o;
    if (st == KHUB_STATUS_OK && !cJSON_IsArray(objs))
        st = khub__hub_fail(p->hub, KHUB_STATUS_PARSE, "%s: no \"objects\" in the answer", what);
    if (st == KHUB_STATUS_OK && cJSON_IsString(tr) && strcmp(tr->valuestring, "basic"))
        st = khub__hub_fail(p->hub, KHUB_STATUS_UNSUPPORTED,
                            "%s: the server chose transfer \"%.40s\"; khub speaks basic only", what,
                            tr->valuestring);
    cJSON_ArrayForEach(o, objs)
    {
        if (st != KHUB_STATUS_OK) break;
        cJSON *oid = cJSON_GetObjectItemCaseSensitive(o, "oid");
        cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
        cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "actions");
        khub__pub_file *f = NULL;
        for (size_t i = 0; cJSON_IsString(oid) && i < count && !f; i++)
            if (!strcmp(todo[i]->sha256, oid->valuestring)) f = todo[i];
        if (!f) {
            st = khub__hub_fail(p->hub, KHUB_STATUS_PARSE, "%s: answer for an unknown oid", what);
        } else if (err) {
            cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
            st = khub__hub_fail(p->hub, KHUB_STATUS_HTTP, "%s: %s refused: %.200s", what, f->rel,
                                cJSON_IsString(m) ? m->valuestring : "(no message)");
        } else if (!act) {
            p->res->n_lfs_stored++; /* the server has it */
        } else if (!href_of(act, "upload")) {
            st = khub__hub_fail(p->hub, KHUB_STATUS_PARSE, "%s: %s: no upload href", what, f->rel);
        } else if (cJSON_GetObjectItemCaseSensitive(
                       cJSON_GetObjectItemCaseSensitive(
                           cJSON_GetObjectItemCaseSensitive(act, "upload"), "header"),
                       "chunk_size")) {
            st = khub__hub_fail(p->hub, KHUB_STATUS_UNSUPPORTED,
                                "%s: %s: the server wants a multipart upload; khub speaks "
                                "basic only",
                                what, f->rel);
        } else {
            st = upload_one(p, f, href_of(act, "upload"), href_of(act, "verify"));
        }
    }
    cJSON_Delete(ans);
    return st;
}

static khub_status upload_lfs(khub__pub *p)
{
    khub__pub_file **todo =
        khub__mem_calloc(khub__hub_alloc(p->hub), p->n ? p->n : 1, sizeof *todo);
    if (!todo) return khub__hub_fail(p->hub, KHUB_STATUS_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->files[i].lfs && !p->files[i].unchanged) todo[k++] = &p->files[i];
    khub_status st = KHUB_STATUS_OK;
    for (size_t from = 0; st == KHUB_STATUS_OK && from < k; from += LFS_BATCH)
        st = lfs_batch(p, todo + from, k - from < LFS_BATCH ? k - from : LFS_BATCH);
    khub__mem_free(todo);
    return st;
}

/* ======================================================================== */
/* The commit                                                               */
/* ======================================================================== */

typedef struct ndjson {
    char *s;
    size_t n, cap;
    int oom;
    const khub_allocator *a; /* the hub's */
} ndjson;

static void nd_line(ndjson *b, const char *key, cJSON *value)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddItemToObject(o, "value", value);
    char *t = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t tn = t ? strlen(t) : 0, need;
    if (!t || !khub__add_ok(b->n, tn + 2, &need)) {
        b->oom = 1;
        cJSON_free(t);
        return;
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < need) cap *= 2;
        char *s = khub__mem_realloc(b->a, b->s, cap);
        if (!s) {
            b->oom = 1;
            cJSON_free(t);
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    memcpy(b->s + b->n, t, tn);
    b->s[b->n + tn] = '\n';
    b->n += tn + 1;
    b->s[b->n] = '\0';
    cJSON_free(t);
}

static cJSON *path_obj(const char *path)
{
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "path", path);
    return v;
}

static khub_status add_inline(khub__pub *p, ndjson *b, const khub__pub_file *f)
{
    if (f->size > MAX_INLINE)
        return khub__hub_fail(p->hub, KHUB_STATUS_OVERFLOW,
                              "%s is %llu bytes, too large to send inline; the server "
                              "should have classified it as LFS",
                              f->rel, (unsigned long long)f->size);
    FILE *in = khub__fopen_regular(f->path, NULL, 0);
    const khub_allocator *a = khub__hub_alloc(p->hub);
    char *data = khub__mem_alloc(a, f->size ? f->size : 1);
    size_t got = in && data ? fread(data, 1, f->size, in) : 0;
    if (in) fclose(in);
    char *enc = got == f->size ? b64(a, data, got) : NULL;
    khub__mem_free(data);
    if (!enc) return khub__hub_fail(p->hub, KHUB_STATUS_IO, "cannot read %s", f->path);
    cJSON *v = path_obj(f->rel);
    cJSON_AddStringToObject(v, "content", enc);
    cJSON_AddStringToObject(v, "encoding", "base64");
    khub__mem_free(enc);
    nd_line(b, "file", v);
    return KHUB_STATUS_OK;
}

/* Files the branch has under build/ that the build does not: deleted. */
static khub_status add_deletions(khub__pub *p, ndjson *b)
{
    khub__tree t = {0};
    khub_status st = khub__list_tree(p->hub, &p->id, p->head, "build", 1, &t);
    if (st == KHUB_STATUS_ENTRY_NOT_FOUND) { /* no build/ yet: nothing is stale */
        khub__hub_clear(p->hub);
        return KHUB_STATUS_OK;
    }
    for (size_t i = 0; st == KHUB_STATUS_OK && i < t.count; i++) {
        if (t.items[i].is_dir || find_file(p, t.items[i].path)) continue;
        nd_line(b, "deletedFile", path_obj(t.items[i].path));
        p->res->n_deleted++;
    }
    khub__tree_free(&t);
    return st;
}

static khub_status commit(khub__pub *p, const char *summary)
{
    ndjson b = {.a = khub__hub_alloc(p->hub)};
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "summary", summary);
    cJSON_AddStringToObject(h, "description", "");
    cJSON_AddStringToObject(h, "parentCommit", p->head);
    nd_line(&b, "header", h);
    khub_status st = add_deletions(p, &b);
    size_t changes = p->res->n_deleted;
    for (size_t i = 0; st == KHUB_STATUS_OK && i < p->n; i++) {
        khub__pub_file *f = &p->files[i];
        if (f->unchanged) continue;
        changes++;
        if (!f->lfs) {
            st = add_inline(p, &b, f);
            continue;
        }
        cJSON *v = path_obj(f->rel);
        cJSON_AddStringToObject(v, "algo", "sha256");
        cJSON_AddStringToObject(v, "oid", f->sha256);
        cJSON_AddNumberToObject(v, "size", (double)f->size);
        nd_line(&b, "lfsFile", v);
    }
    if (st == KHUB_STATUS_OK && b.oom)
        st = khub__hub_fail(p->hub, KHUB_STATUS_NOMEM, "out of memory for the commit");
    if (st != KHUB_STATUS_OK || changes == 0) { /* nothing changed: the head stands */
        memcpy(p->res->commit, p->head, 41);
        khub__mem_free(b.s);
        return st;
    }
    char url[1024], what[300];
    st = api_url(p, url, sizeof url, "commit", p->res->branch);
    snprintf(what, sizeof what, "committing to %s/%s@%s", p->id.org, p->id.name, p->res->branch);
    khub__http_resp r = {0};
    if (st == KHUB_STATUS_OK)
        st = send_body(p, "POST", url, "application/x-ndjson", b.s, b.n, what, &r);
    khub__mem_free(b.s);
    if (st == KHUB_STATUS_OK && !ok2xx(&r)) st = pub_error(p, &r, what);
    cJSON *ans = st == KHUB_STATUS_OK ? cJSON_Parse(r.body ? r.body : "") : NULL;
    khub__http_resp_free(&r);
    cJSON *oid = cJSON_GetObjectItemCaseSensitive(ans, "commitOid");
    cJSON *cu = cJSON_GetObjectItemCaseSensitive(ans, "commitUrl");
    if (st == KHUB_STATUS_OK && !(cJSON_IsString(oid) && khub__is_commit_hex(oid->valuestring)))
        st = khub__hub_fail(p->hub, KHUB_STATUS_PARSE, "%s: no 40-hex \"commitOid\" in the answer",
                            what);
    if (st == KHUB_STATUS_OK) {
        memcpy(p->res->commit, oid->valuestring, 41);
        snprintf(p->res->url, sizeof p->res->url, "%s", cJSON_IsString(cu) ? cu->valuestring : "");
        p->res->changed = 1;
    }
    cJSON_Delete(ans);
    return st;
}

/* ======================================================================== */
/* Entry                                                                    */
/* ======================================================================== */

khub_status khub__publish_refuse(khub_hub *hub, khub_status st, const char *msg)
{
    khub__hub_clear(hub);
    return khub__hub_fail(hub, st, "%s", msg);
}

khub_status khub__publish(khub_hub *hub, const khub_publish_opts *o, khub_publish_result *res)
{
    khub__hub_clear(hub);
    memset(res, 0, sizeof *res);
    if (!o || !o->dir) return khub__hub_fail(hub, KHUB_STATUS_MISUSE, "no DIR given");
    khub_kernel_manifest *m = khub__mem_calloc(khub__hub_alloc(hub), 1, sizeof *m);
    if (!m) return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
    char err[KHUB_ERROR_SIZE];
    khub__pub p = {.hub = hub,
                   .res = res,
                   .type = khub__repo_api_type(hub, NULL),
                   .prefix = khub__repo_url_prefix(hub, NULL)};
    khub_status st = khub__km_load(o->dir, m, err, sizeof err);
    if (st != KHUB_STATUS_OK) {
        khub__mem_free(m);
        return khub__hub_fail(hub, st, "%s", err);
    }
    const char *repo = o->repo ? o->repo : m->repo;
    if (khub_hub_id_parse(repo, &p.id, err, sizeof err) != KHUB_STATUS_OK) {
        st = khub__hub_fail(hub, KHUB_STATUS_BAD_ID, "%s", err);
    } else if (p.id.rev_kind || p.id.symbol[0]) {
        st = khub__hub_fail(hub, KHUB_STATUS_BAD_ID,
                            "repo \"%s\" must be plain org/name (the branch is "
                            "v<major> from kernel.json)",
                            repo);
    }
    if (st != KHUB_STATUS_OK) {
        khub__mem_free(m);
        return st;
    }
    snprintf(res->repo, sizeof res->repo, "%s/%s", p.id.org, p.id.name);
    snprintf(res->branch, sizeof res->branch, "v%d", m->major);
    snprintf(res->version, sizeof res->version, "%s", m->version);
    char summary[512];
    snprintf(summary, sizeof summary, "%s", o->message ? o->message : "");
    if (!o->message)
        snprintf(summary, sizeof summary, "Upload %s %s (khub publish)", res->repo, m->version);
    khub__mem_free(m);
    st = khub__publish_collect(&p, o->dir);
    if (st == KHUB_STATUS_OK) st = create_repo(&p);
    if (st == KHUB_STATUS_OK) st = ensure_branch(&p);
    if (st == KHUB_STATUS_OK) st = preupload(&p);
    if (st == KHUB_STATUS_OK) st = upload_lfs(&p);
    if (st == KHUB_STATUS_OK) st = commit(&p, summary);
    khub__mem_free(p.files);
    return st;
}
