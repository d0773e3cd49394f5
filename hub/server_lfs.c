/*
 * server_lfs.c: the Git LFS side of uploads to `khub serve`: the batch API
 * (basic transfers only), the upload URLs it hands out, and verify. An
 * upload URL carries a capability instead of a header; its PUT body streams
 * into a temp file and becomes lfs/<oid> only when size and SHA-256 match.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_impl.h"

#define LFS_JSON "application/vnd.git-lfs+json"

/* ======================================================================== */
/* Batch                                                                    */
/* ======================================================================== */

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

static int lfs_have(const repo *r, const char *oid, uint64_t size)
{
    char obj[KHUB__PATH_MAX];
    struct stat sb;
    return KHUB__PATHF(obj, "%s/lfs/%s", r->root, oid) && lstat(obj, &sb) == 0 &&
           S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == size;
}

MHD_RESULT khub__srv_api_lfs_batch(khub__server *s, struct MHD_Connection *c, const repo *r,
                                   conn *k)
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
        return khub__srv_send_typed(c, 422, e, LFS_JSON);
    }
    char base[300];
    khub__srv_self_url(c, base, sizeof base);
    cJSON *out = cJSON_CreateObject(), *arr;
    cJSON_AddStringToObject(out, "transfer", "basic");
    arr = cJSON_AddArrayToObject(out, "objects");
    cJSON_ArrayForEach(o, objs)
    {
        const cJSON *oid = cJSON_GetObjectItemCaseSensitive(o, "oid");
        uint64_t size = 0;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, e);
        int ok_oid = cJSON_IsString(oid) && khub__srv_is_sha256_lower(oid->valuestring);
        cJSON_AddStringToObject(e, "oid", ok_oid ? oid->valuestring : "");
        if (!ok_oid || !khub__srv_json_size(cJSON_GetObjectItemCaseSensitive(o, "size"),
                                            MAX_LFS_OBJECT, &size)) {
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
    return khub__srv_send_typed(c, 200, out, LFS_JSON);
}

/* ======================================================================== */
/* Upload and verify                                                        */
/* ======================================================================== */

/* The first call of PUT /lfs-upload/<org>/<name>/<oid>/<size>/<token>:
 * checks the capability and opens the temp file the body streams into. */
void khub__srv_put_begin(khub__server *s, conn *k, char **seg, int n)
{
    k->put_code = 404;
    snprintf(k->put_err, sizeof k->put_err, "no such upload URL");
    repo r;
    char tok[65], *end;
    if (n != 6 || !khub__srv_repo_open(s, seg[1], seg[2], &r)) {
        if (n == 6) khub__srv_repo_close(&r);
        return;
    }
    unsigned long long size = strtoull(seg[4], &end, 10);
    int ok = khub__srv_is_sha256_lower(seg[3]) && *end == '\0' &&
             isdigit((unsigned char)seg[4][0]) && size <= MAX_LFS_OBJECT;
    if (ok) upload_token(s, r.org, r.name, seg[3], size, tok);
    if (!ok || !tok[0] || strlen(seg[5]) != 64 || !khub__digest_eq(tok, seg[5])) {
        k->put_code = 403;
        snprintf(k->put_err, sizeof k->put_err, "the upload URL is not valid for this object");
        khub__srv_repo_close(&r);
        return;
    }
    char dir[KHUB__PATH_MAX];
    if (KHUB__PATHF(dir, "%s/lfs", r.root) && (mkdir(dir, 0755) == 0 || errno == EEXIST) &&
        KHUB__PATHF(k->put_tmp, "%s/.tmp-XXXXXX", dir) &&
        KHUB__PATHF(k->put_dest, "%s/%s", dir, seg[3])) {
        k->put_fd = mkstemp(k->put_tmp);
        if (k->put_fd < 0) k->put_tmp[0] = '\0';
    }
    khub__srv_repo_close(&r);
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

void khub__srv_put_data(conn *k, const char *data, size_t n)
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
MHD_RESULT khub__srv_put_end(struct MHD_Connection *c, conn *k)
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
    if (k->put_code) return khub__srv_send_error(c, k->put_code, NULL, NULL, k->put_err);
    k->put_tmp[0] = '\0';
    return khub__srv_send_json(c, 200, cJSON_CreateObject(), NULL, NULL);
}

MHD_RESULT khub__srv_api_lfs_verify(struct MHD_Connection *c, const repo *r, conn *k)
{
    cJSON *j = cJSON_Parse(k->body ? k->body : "");
    const cJSON *oid = cJSON_GetObjectItemCaseSensitive(j, "oid");
    uint64_t size = 0;
    int ok =
        cJSON_IsString(oid) && khub__srv_is_sha256_lower(oid->valuestring) &&
        khub__srv_json_size(cJSON_GetObjectItemCaseSensitive(j, "size"), MAX_LFS_OBJECT, &size) &&
        lfs_have(r, oid->valuestring, size);
    cJSON_Delete(j);
    return ok ? khub__srv_send_json(c, 200, cJSON_CreateObject(), NULL, NULL)
              : khub__srv_send_error(c, 404, NULL, NULL,
                                     "object not stored with that oid and size");
}
