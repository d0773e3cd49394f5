/*
 * server_write.c: the write side of `khub serve`: auth and routing of
 * POST, PUT and DELETE, and the small writes (repos/create, branches,
 * tags, preupload, validate-yaml). Commits are in server_commit.c, LFS in
 * server_lfs.c. Writes run one at a time under the server's write lock,
 * because each one is a read-modify-write of refs.json.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "server_impl.h"

/* ======================================================================== */
/* Checks                                                                   */
/* ======================================================================== */

/* Branch and tag names: [A-Za-z0-9._-] segments joined by '/', each safe. */
static int ref_name_ok(const char *n)
{
    if (!n || !n[0] || strlen(n) > KHUB_HUB_REV_MAX || !khub__path_is_safe(n) || n[0] == '-')
        return 0;
    for (const char *p = n; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-/", *p)) return 0;
    return !khub__is_commit_hex(n) && !strstr(n, "..");
}

/* ======================================================================== */
/* Repos, refs, preupload                                                   */
/* ======================================================================== */

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
    khub__srv_new_commit_id(NULL, "initial commit", c0);
    snprintf(refs, sizeof refs, "{\"branches\":{\"main\":\"%s\"},\"tags\":{}}", c0);
    int ok = KHUB__PATHF(p, "%s/commits/%s", tmp, c0) && khub__srv_mkdirs_under(tmp, "commits") &&
             mkdir(p, 0755) == 0 && KHUB__PATHF(p, "%s/commits/%s/.gitattributes", tmp, c0) &&
             khub__srv_write_atomic(p, gitattributes, strlen(gitattributes)) &&
             KHUB__PATHF(p, "%s/refs.json", tmp) && khub__srv_write_atomic(p, refs, strlen(refs));
    if (ok && rename(tmp, dst) == 0) return khub__srv_fsync_path(odir), 1;
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
        ret = khub__srv_send_error(c, 400, NULL, NULL,
                                   "repos/create needs \"name\" and \"organization\" "
                                   "(khub serve has no user namespace)");
    } else if (type && (!cJSON_IsString(type) || (strcmp(type->valuestring, "kernel") &&
                                                  strcmp(type->valuestring, "model")))) {
        ret = khub__srv_send_error(c, 400, NULL, NULL,
                                   "khub serve holds kernel and model repos only");
    } else if (snprintf(text, sizeof text, "%s/%s", org->valuestring, name->valuestring) >=
                   (int)sizeof text ||
               khub_hub_id_parse(text, &id, NULL, 0) != KHUB_STATUS_OK || id.rev_kind) {
        ret = khub__srv_send_error(c, 400, NULL, NULL, "invalid repo name");
    } else {
        int made = repo_create_on_disk(s, id.org, id.name, err, sizeof err);
        int kernel = !type || !strcmp(type->valuestring, "kernel");
        khub__srv_self_url(c, base, sizeof base);
        snprintf(url, sizeof url, "%s/%s%s/%s", base, kernel ? "kernels/" : "", id.org, id.name);
        if (made < 0) {
            ret = khub__srv_send_error(c, 500, NULL, NULL, err);
        } else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "url", url);
            cJSON_AddStringToObject(o, "name", text);
            if (!made) cJSON_AddStringToObject(o, "error", "You already created this repo");
            ret = khub__srv_send_json(c, made ? 200 : 409, o, NULL, NULL);
        }
    }
    cJSON_Delete(j);
    return ret;
}

/* POST/DELETE .../branch/{b}: create from startingPoint (default main) or
 * delete. 409 when it exists, 404 when it does not. */
static MHD_RESULT api_branch(struct MHD_Connection *c, repo *r, const char *b, int del, conn *k)
{
    if (!ref_name_ok(b)) return khub__srv_send_error(c, 400, NULL, NULL, "invalid branch name");
    if (del) {
        if (!strcmp(b, "main"))
            return khub__srv_send_error(c, 403, NULL, NULL, "cannot delete main");
        if (!khub__srv_branch_head(r, b))
            return khub__srv_send_error(c, 404, "RevisionNotFound", NULL,
                                        "Invalid rev id: no such branch");
        cJSON_DeleteItemFromObjectCaseSensitive(khub__srv_refs_table(r, "branches"), b);
        return khub__srv_refs_save(r)
                   ? khub__srv_send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
                   : khub__srv_send_error(c, 500, NULL, NULL, "cannot update refs.json");
    }
    if (khub__srv_branch_head(r, b))
        return khub__srv_send_error(c, 409, NULL, NULL, "Reference already exists");
    cJSON *j = k->n ? cJSON_Parse(k->body) : NULL;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(j, "startingPoint");
    char commit[41];
    int ok = khub__srv_repo_resolve(r, cJSON_IsString(sp) ? sp->valuestring : "main", commit);
    cJSON_Delete(j);
    if (!ok)
        return khub__srv_send_error(c, 404, "RevisionNotFound", NULL,
                                    "Invalid rev id: startingPoint");
    khub__srv_refs_set(r, "branches", b, commit);
    return khub__srv_refs_save(r)
               ? khub__srv_send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
               : khub__srv_send_error(c, 500, NULL, NULL, "cannot update refs.json");
}

/* POST .../tag/{rev} {"tag": T}; DELETE .../tag/{T}. */
static MHD_RESULT api_tag(struct MHD_Connection *c, repo *r, const char *seg, int del, conn *k)
{
    cJSON *tags = khub__srv_refs_table(r, "tags");
    if (del) {
        if (!cJSON_GetObjectItemCaseSensitive(tags, seg))
            return khub__srv_send_error(c, 404, "RevisionNotFound", NULL,
                                        "Invalid rev id: no such tag");
        cJSON_DeleteItemFromObjectCaseSensitive(tags, seg);
        return khub__srv_refs_save(r)
                   ? khub__srv_send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
                   : khub__srv_send_error(c, 500, NULL, NULL, "cannot update refs.json");
    }
    cJSON *j = cJSON_Parse(k->body ? k->body : "");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tag");
    char commit[41], name[KHUB_HUB_REV_MAX + 1] = "";
    if (cJSON_IsString(t)) snprintf(name, sizeof name, "%s", t->valuestring);
    cJSON_Delete(j);
    if (!ref_name_ok(name))
        return khub__srv_send_error(c, 400, NULL, NULL, "missing or invalid \"tag\"");
    if (!khub__srv_repo_resolve(r, seg, commit))
        return khub__srv_send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id");
    if (cJSON_GetObjectItemCaseSensitive(tags, name))
        return khub__srv_send_error(c, 409, NULL, NULL, "Tag already exists");
    khub__srv_refs_set(r, "tags", name, commit);
    return khub__srv_refs_save(r)
               ? khub__srv_send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
               : khub__srv_send_error(c, 500, NULL, NULL, "cannot update refs.json");
}

/* The Hub's classification: LFS for the LFS globs, files over 10 MB and
 * binary samples (a NUL byte); empty files are regular. */
static int upload_is_lfs(const repo *r, const char *path, uint64_t size, const char *sample)
{
    if (size == 0) return 0;
    if (khub__srv_repo_is_lfs(r, path) || size > 10u * 1000 * 1000) return 1;
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
    if (!khub__srv_repo_resolve(r, rev, commit))
        return khub__srv_send_error(c, 404, "RevisionNotFound", NULL, "Invalid rev id");
    khub__srv_commit_dir(r, commit, cdir, sizeof cdir);
    cJSON *j = cJSON_Parse(k->body ? k->body : "");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files"), *f;
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) > 1000) {
        cJSON_Delete(j);
        return khub__srv_send_error(c, 400, NULL, NULL, "preupload needs \"files\" (at most 1000)");
    }
    cJSON *out = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(out, "files");
    cJSON_ArrayForEach(f, files)
    {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(f, "path");
        const cJSON *sm = cJSON_GetObjectItemCaseSensitive(f, "sample");
        uint64_t size = 0;
        if (!cJSON_IsString(p) || !khub__path_is_safe(p->valuestring) ||
            !khub__srv_json_size(cJSON_GetObjectItemCaseSensitive(f, "size"), MAX_LFS_OBJECT,
                                 &size)) {
            cJSON_Delete(j), cJSON_Delete(out);
            return khub__srv_send_error(c, 400, NULL, NULL,
                                        "preupload: each file needs a safe \"path\" "
                                        "and a \"size\"");
        }
        int lfs =
            upload_is_lfs(r, p->valuestring, size, cJSON_IsString(sm) ? sm->valuestring : "") ||
            (size > 0 && khub__srv_is_lfs_at(r, commit, p->valuestring));
        char full[KHUB__PATH_MAX];
        struct stat sb;
        file_ids ids;
        /* the file reached without a link on the way, and hashed from that
         * fd: lstat of the joined path followed a linked folder (out ->
         * /etc) and told the client the digest of a file outside DIR */
        int fd = KHUB__PATHF(full, "%s/%s", cdir, p->valuestring)
                     ? khub__srv_open_in(cdir, p->valuestring, &sb)
                     : -1;
        int have =
            fd >= 0 && S_ISREG(sb.st_mode) && khub__srv_file_ids_of_fd(r->dc, full, fd, lfs, &ids);
        if (fd >= 0) close(fd);
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
    return khub__srv_send_json(c, 200, out, NULL, NULL);
}

/* ======================================================================== */
/* Write routing                                                            */
/* ======================================================================== */

MHD_RESULT khub__srv_route_write(khub__server *s, struct MHD_Connection *c, const char *method,
                                 char **seg, int n, conn *k)
{
    int del = !strcmp(method, "DELETE");
    if (!strcmp(method, "PUT"))
        return n > 0 && !strcmp(seg[0], "lfs-upload")
                   ? khub__srv_put_end(c, k)
                   : khub__srv_send_error(c, 405, NULL, NULL, "PUT is only for LFS upload URLs");
    if (strcmp(method, "POST") && !del)
        return khub__srv_send_error(c, 405, NULL, NULL, "method not allowed");
    if (!khub__srv_write_allowed(s, c))
        return khub__srv_send_error(c, 401, NULL, NULL,
                                    "Invalid credentials in Authorization header: "
                                    "writes need the server's token");
    if (k->too_big)
        return khub__srv_send_error(c, 413, NULL, NULL,
                                    "request body over the server's max_body limit");
    if (n == 2 && !strcmp(seg[0], "api") && !strcmp(seg[1], "validate-yaml"))
        return khub__srv_send_json(c, 200, cJSON_Parse("{\"errors\":[],\"warnings\":[]}"), NULL,
                                   NULL);
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
    if (!api && !verify && !batch)
        return khub__srv_send_error(c, 404, NULL, NULL, "unknown endpoint");
    int o = api ? 2 : verify ? 1 : k0;
    char name[KHUB_HUB_NAME_MAX + 8];
    snprintf(name, sizeof name, "%s", seg[o + 1]);
    size_t nl = strlen(name);
    if (batch && (nl < 5 || strcmp(name + nl - 4, ".git") != 0))
        return khub__srv_send_error(c, 404, NULL, NULL, "unknown endpoint");
    if (batch) name[nl - 4] = '\0';
    repo r;
    if (!khub__srv_repo_open(s, seg[o], name, &r) ||
        (api && !khub__srv_repo_is_type(&r, strcmp(seg[1], "kernels") ? "model" : "kernel"))) {
        khub__srv_repo_close(&r);
        return khub__srv_send_error(c, 404, "RepoNotFound", NULL, "Repository not found");
    }
    MHD_RESULT ret;
    const char *verb = api ? seg[4] : "";
    if (verify)
        ret = khub__srv_api_lfs_verify(c, &r, k);
    else if (batch)
        ret = khub__srv_api_lfs_batch(s, c, &r, k);
    else if (n != 6)
        ret = khub__srv_send_error(c, 404, NULL, NULL, "unknown endpoint");
    else if (!strcmp(verb, "commit") && !del)
        ret = khub__srv_api_commit(s, c, &r, seg[5], seg[1], k);
    else if (!strcmp(verb, "preupload") && !del)
        ret = api_preupload(c, &r, seg[5], k);
    else if (!strcmp(verb, "branch"))
        ret = api_branch(c, &r, seg[5], del, k);
    else if (!strcmp(verb, "tag"))
        ret = api_tag(c, &r, seg[5], del, k);
    else
        ret = khub__srv_send_error(c, 404, NULL, NULL, "unknown endpoint");
    khub__srv_repo_close(&r);
    return ret;
}
