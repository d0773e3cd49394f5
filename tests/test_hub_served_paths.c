/* test_hub_served_paths.c: what the in-process `khub serve` will not serve
 * from its folder, however the request names it: a file or folder reached
 * through a symlink inside a served commit (a folder linked to a place
 * outside DIR, found by the session-17 review: lstat of the joined path
 * checked only its last component), and ".." spelled plainly, as %2e%2e or
 * inside a segment as ..%2F.., which curl sends as is. Every one is 404
 * EntryNotFound (a tree: 404 EntryNotFound; paths-info leaves it out), and
 * the file beside the link is still served. Also: the digests behind a
 * served file's ETag are those of the bytes it sends (its open fd), not of
 * what its name holds by the time they are computed. */
#include <cjson/cJSON.h>
#include <fcntl.h>

#include "hub_fixture.h"
#include "server_impl.h"

/* GETs endpoint + rel into r; returns the HTTP status. */
static long get(khub_hub *hub, const fixture *fx, const char *rel, khub__http_resp *r)
{
    char url[1024];
    snprintf(url, sizeof url, "%s%s", fx->endpoint, rel);
    memset(r, 0, sizeof *r);
    khub__http_req req = {.method = "GET", .url = url, .what = "served path"};
    ASSERT_OK(khub__http_fetch(hub, &req, r));
    return r->status;
}

/* DIR's commit holds out -> a folder outside DIR, and secret.md -> a file
 * outside DIR; both hold "secret". */
static void link_out(const fixture *fx)
{
    char outside[512], path[1024];
    snprintf(outside, sizeof outside, "%s/outside/secret.md", fx->root);
    fx_write(outside, "secret\n", 7);
    snprintf(outside, sizeof outside, "%s/outside", fx->root);
    snprintf(path, sizeof path, "%s/org/demo/commits/" C1 "/out", fx->repos);
    ASSERT_EQ(symlink(outside, path), 0);
    snprintf(outside, sizeof outside, "%s/outside/secret.md", fx->root);
    snprintf(path, sizeof path, "%s/org/demo/commits/" C1 "/docs/secret.md", fx->repos);
    ASSERT_EQ(symlink(outside, path), 0);
}

static void expect_not_found(khub_hub *hub, const fixture *fx, const char *rel)
{
    khub__http_resp r;
    long st = get(hub, fx, rel, &r);
    if (st != 404 || strcmp(r.error_code, "EntryNotFound") != 0)
        fprintf(stderr, "%s: status %ld, error code '%s', body %s\n", rel, st, r.error_code,
                r.body ? r.body : "");
    ASSERT_EQ(st, 404);
    ASSERT_STR_EQ(r.error_code, "EntryNotFound");
    ASSERT(r.body == NULL || strstr(r.body, "secret") == NULL);
    khub__http_resp_free(&r);
}

TEST_IMPL(served_links_not_followed)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    link_out(&fx);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    expect_not_found(hub, &fx, "/kernels/org/demo/resolve/main/out/secret.md");
    expect_not_found(hub, &fx, "/kernels/org/demo/resolve/main/docs/secret.md");
    expect_not_found(hub, &fx, "/api/kernels/org/demo/tree/main/out");
    /* the folder listing leaves both links out */
    khub__http_resp r;
    ASSERT_EQ(get(hub, &fx, "/api/kernels/org/demo/tree/main/docs", &r), 200);
    ASSERT(strstr(r.body, "page0.md") != NULL);
    ASSERT(strstr(r.body, "secret") == NULL);
    khub__http_resp_free(&r);
    ASSERT_EQ(get(hub, &fx, "/kernels/org/demo/resolve/main/docs/page0.md", &r), 200);
    ASSERT_STR_EQ(r.body, "page\n");
    khub__http_resp_free(&r);
    /* paths-info: answered, with neither link in it */
    char url[1024];
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/paths-info/main", fx.endpoint);
    const char *form = "paths=out%2Fsecret.md&paths=docs%2Fsecret.md&paths=out&paths=README.md";
    khub__http_req req = {.method = "POST",
                          .url = url,
                          .what = "paths-info",
                          .body = form,
                          .body_len = strlen(form),
                          .content_type = "application/x-www-form-urlencoded"};
    memset(&r, 0, sizeof r);
    ASSERT_OK(khub__http_fetch(hub, &req, &r));
    ASSERT_EQ(r.status, 200);
    cJSON *j = cJSON_Parse(r.body);
    ASSERT(cJSON_IsArray(j));
    ASSERT_EQ(cJSON_GetArraySize(j), 1); /* README.md only */
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    /* preupload: no digest of a file reached through a link (session 18:
     * lstat of the joined path followed out/ and gave secret.md's oid) */
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/preupload/main", fx.endpoint);
    const char *pre = "{\"files\":[{\"path\":\"out/secret.md\",\"size\":7,\"sample\":\"\"},"
                      "{\"path\":\"docs/secret.md\",\"size\":7,\"sample\":\"\"},"
                      "{\"path\":\"README.md\",\"size\":14,\"sample\":\"\"}]}";
    req = (khub__http_req){.method = "POST",
                           .url = url,
                           .auth = 1,
                           .what = "preupload",
                           .body = pre,
                           .body_len = strlen(pre),
                           .content_type = "application/json"};
    memset(&r, 0, sizeof r);
    ASSERT_OK(khub__http_fetch(hub, &req, &r));
    ASSERT_EQ(r.status, 200);
    j = cJSON_Parse(r.body);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    ASSERT_EQ(cJSON_GetArraySize(files), 3);
    ASSERT(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(files, 0), "oid")));
    ASSERT(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(files, 1), "oid")));
    ASSERT(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(files, 2), "oid")));
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(served_dotdot_refused)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    /* refs.json lies two folders above the commit's files */
    expect_not_found(hub, &fx, "/kernels/org/demo/resolve/main/%2e%2e/%2e%2e/refs.json");
    expect_not_found(hub, &fx, "/kernels/org/demo/resolve/main/..%2F..%2Frefs.json");
    expect_not_found(hub, &fx, "/kernels/org/demo/resolve/main/docs%2F..%2F..%2F..%2Frefs.json");
    expect_not_found(hub, &fx, "/kernels/org/demo/resolve/main/%2Fetc%2Fpasswd");
    expect_not_found(hub, &fx, "/api/kernels/org/demo/tree/main/%2e%2e");
    khub_hub_free(hub);
    fx_done(&fx);
}

/* serve_file opens the file, then computes the ETag: a file renamed over
 * the name in between (a commit of the same path lands) must not lend its
 * digests to the body, which is read from the fd opened first. The swap is
 * done before the call, the widest the window can be. */
TEST_IMPL(served_etag_is_of_the_open_file)
{
    char dir[] = "/tmp/khub-etag-XXXXXX", path[64], next[64];
    ASSERT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/weights.bin", dir);
    snprintf(next, sizeof next, "%s/.tmp-next", dir);
    fx_write(path, "old bytes", 9);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ASSERT(fd >= 0);
    fx_write(next, "new bytes, longer", 17);
    ASSERT_EQ(rename(next, path), 0);

    struct digest_cache *dc = khub__srv_digest_cache_new();
    ASSERT(dc != NULL);
    file_ids served, named;
    char sha1[41], sha256[65];
    ASSERT_OK(khub__git_blob_sha1_buf("old bytes", 9, sha1));
    ASSERT_OK(khub__sha256_hex("old bytes", 9, sha256));
    for (int lfs = 0; lfs <= 1; lfs++) {
        ASSERT(
            khub__srv_file_ids_of(dc, path, lfs, &named)); /* the new file's, in the cache's way */
        ASSERT(khub__srv_file_ids_of_fd(dc, path, fd, lfs, &served));
        ASSERT_STR_EQ(served.sha256, sha256);
        if (!lfs) ASSERT_STR_EQ(served.sha1, sha1);
        ASSERT(strcmp(named.sha256, sha256) != 0);
        ASSERT_EQ(lseek(fd, 0, SEEK_CUR), 0); /* sendfile starts where the fd is */
    }
    khub__srv_digest_cache_free(dc);
    close(fd);
    unlink(path);
    rmdir(dir);
}

#define TEST_LIST(X) \
    X(served_links_not_followed) \
    X(served_dotdot_refused) \
    X(served_etag_is_of_the_open_file)
TEST_MAIN(TEST_LIST)
