/* test_hub_paths_info.c: POST /api/{t}/{org}/{name}/paths-info/{rev} on the
 * in-process `khub serve` (form bodies as huggingface_hub sends them, JSON
 * bodies as the JS client sends them, missing and unsafe paths left out, no
 * token needed), huggingface_hub's get_paths_info against it when the
 * package is installed. */
#include <cjson/cJSON.h>

#include "hub_fixture.h"
#include "server_impl.h"

/* POSTs body to endpoint + rel; the response is parsed into *out (NULL when
 * not JSON). Returns the HTTP status. */
static long post(khub_hub *hub, const char *endpoint, const char *rel, const char *ctype,
                 const char *body, khub__http_resp *r, cJSON **out)
{
    char url[1024];
    snprintf(url, sizeof url, "%s%s", endpoint, rel);
    memset(r, 0, sizeof *r);
    khub__http_req req = {.method = "POST",
                          .url = url,
                          .what = "paths-info",
                          .body = body,
                          .body_len = strlen(body),
                          .content_type = ctype};
    ASSERT_OK(khub__http_fetch(hub, &req, r));
    *out = r->body ? cJSON_Parse(r->body) : NULL;
    return r->status;
}

static const cJSON *find_path(const cJSON *arr, const char *path)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "path");
        if (cJSON_IsString(p) && !strcmp(p->valuestring, path)) return e;
    }
    return NULL;
}

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

#define FORM "application/x-www-form-urlencoded"
#define PI   "/api/kernels/org/demo/paths-info/"

TEST_IMPL(paths_info_form)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    fx_writef(&fx, "org/demo/commits/" C1 "/docs/a b+c.md", "spaced\n");
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub__http_resp r;
    cJSON *j = NULL;
    ASSERT_EQ(post(hub, fx.endpoint, PI "main", FORM,
                   "paths=README.md&paths=weights.bin&paths=docs&paths=nope.txt&"
                   "paths=..%2Fetc%2Fpasswd&paths=docs%2Fa+b%2Bc.md&expand=false",
                   &r, &j),
              200);
    ASSERT_STR_EQ(r.repo_commit, C1);
    ASSERT(cJSON_IsArray(j));
    ASSERT_EQ(cJSON_GetArraySize(j), 4); /* nope.txt and ../etc/passwd left out */
    const cJSON *readme = find_path(j, "README.md");
    ASSERT(readme != NULL);
    ASSERT_STR_EQ(str_of(readme, "type"), "file");
    char sha1[41];
    ASSERT_OK(khub__git_blob_sha1_buf("# demo kernel\n", 14, sha1));
    ASSERT_STR_EQ(str_of(readme, "oid"), sha1);
    ASSERT(cJSON_GetObjectItemCaseSensitive(readme, "lfs") == NULL);
    const cJSON *w = find_path(j, "weights.bin");
    ASSERT(w != NULL);
    const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(w, "lfs");
    ASSERT(lfs != NULL);
    ASSERT(khub__is_sha256_hex(str_of(lfs, "oid")));
    ASSERT_EQ(cJSON_GetObjectItemCaseSensitive(w, "size")->valuedouble, 70000);
    ASSERT_STR_EQ(str_of(find_path(j, "docs"), "type"), "directory");
    ASSERT(find_path(j, "docs/a b+c.md") != NULL); /* '+' is a space, %2B a plus */
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(paths_info_json)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub__http_resp r;
    cJSON *j = NULL;
    char body[512], rel[256];
    snprintf(rel, sizeof rel, "build/%s/libk.so", fx.variant);
    snprintf(body, sizeof body, "{\"paths\":[\"%s\",\"missing\",\"/abs\"],\"expand\":true}", rel);
    ASSERT_EQ(post(hub, fx.endpoint, PI "v1.0.0", "application/json", body, &r, &j), 200);
    ASSERT_EQ(cJSON_GetArraySize(j), 1);
    const cJSON *e = find_path(j, rel);
    ASSERT(e != NULL);
    ASSERT(khub__is_sha256_hex(str_of(cJSON_GetObjectItemCaseSensitive(e, "lfs"), "oid")));
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    /* the same path at v2 (C2) does not exist */
    ASSERT_EQ(post(hub, fx.endpoint, PI "v2", "application/json", body, &r, &j), 200);
    ASSERT_EQ(cJSON_GetArraySize(j), 0);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    /* model prefix too */
    ASSERT_EQ(post(hub, fx.endpoint, "/api/models/org/demo/paths-info/" C1, FORM, "paths=README.md",
                   &r, &j),
              200);
    ASSERT_EQ(cJSON_GetArraySize(j), 1);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(paths_info_errors)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub__http_resp r;
    cJSON *j = NULL;
    ASSERT_EQ(post(hub, fx.endpoint, PI "nobranch", FORM, "paths=README.md", &r, &j), 404);
    ASSERT_STR_EQ(r.error_code, "RevisionNotFound");
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    ASSERT_EQ(post(hub, fx.endpoint, "/api/kernels/org/none/paths-info/main", FORM,
                   "paths=README.md", &r, &j),
              404);
    ASSERT_STR_EQ(r.error_code, "RepoNotFound");
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    ASSERT_EQ(post(hub, fx.endpoint, PI "main", "application/json", "{\"paths\":\"x\"}", &r, &j),
              400);
    ASSERT_CONTAINS(r.error_message, "paths-info needs a form body");
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    ASSERT_EQ(post(hub, fx.endpoint, PI "main", FORM, "paths=%zz", &r, &j), 400);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    size_t n = 10001 * 8 + 1;
    char *big = malloc(n);
    ASSERT(big != NULL);
    for (size_t i = 0; i < 10001; i++) memcpy(big + i * 8, "paths=a&", 8);
    big[n - 1] = '\0';
    ASSERT_EQ(post(hub, fx.endpoint, PI "main", FORM, big, &r, &j), 400);
    ASSERT_CONTAINS(r.error_message, "more than 10000 paths");
    free(big);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A path named many times is answered (and hashed) once: the LFS file is
 * younger than the digest cache's 2 s, so each lookup would hash it. */
TEST_IMPL(paths_info_names_a_path_once)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub__http_resp r;
    cJSON *j = NULL;
    enum { COPIES = 10000 };
    static const char one[] = "paths=weights.bin&";
    size_t len = (sizeof one - 1) * COPIES;
    char *body = malloc(len + 1);
    ASSERT(body != NULL);
    for (size_t i = 0; i < COPIES; i++) memcpy(body + i * (sizeof one - 1), one, sizeof one - 1);
    body[len - 1] = '\0'; /* the last '&' */
    ASSERT_EQ(post(hub, fx.endpoint, PI "main", FORM, body, &r, &j), 200);
    free(body);
    ASSERT_EQ(cJSON_GetArraySize(j), 1);
    ASSERT(find_path(j, "weights.bin") != NULL);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    ASSERT_EQ(post(hub, fx.endpoint, PI "main", "application/json",
                   "{\"paths\":[\"README.md\",\"docs\",\"README.md\",\"docs\"]}", &r, &j),
              200);
    ASSERT_EQ(cJSON_GetArraySize(j), 2);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* Hard links of one fresh file (as every path of a commit that names one
 * LFS object is) are hashed once per request, for each way they are
 * answered: LFS (*.bin) or not (*.txt, whose git id is the content's). */
TEST_IMPL(paths_info_hashes_a_linked_file_once)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    char src[1024], dst[1024];
    snprintf(src, sizeof src, "%s/org/demo/commits/" C1 "/weights.bin", fx.repos);
    static const char *links[] = {"w2.bin", "docs/w3.bin", "w4.txt"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(dst, sizeof dst, "%s/org/demo/commits/" C1 "/%s", fx.repos, links[i]);
        ASSERT_EQ(link(src, dst), 0); /* the file's ctime is now: fresh, not cached */
    }
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub__http_resp r;
    cJSON *j = NULL;
    uint64_t before = khub__srv_digest_hashed();
    ASSERT_EQ(post(hub, fx.endpoint, PI "main", FORM,
                   "paths=weights.bin&paths=w2.bin&paths=docs/w3.bin&paths=w4.txt", &r, &j),
              200);
    ASSERT_EQ(khub__srv_digest_hashed() - before, 2);
    ASSERT_EQ(cJSON_GetArraySize(j), 4);
    const char *bin_oid =
        cJSON_GetObjectItemCaseSensitive(find_path(j, "weights.bin"), "oid")->valuestring;
    for (size_t i = 0; i < 2; i++) {
        const cJSON *e = find_path(j, links[i]);
        ASSERT_STR_EQ(cJSON_GetObjectItemCaseSensitive(e, "oid")->valuestring, bin_oid);
        ASSERT(cJSON_GetObjectItemCaseSensitive(e, "lfs") != NULL);
    }
    const cJSON *txt = find_path(j, "w4.txt");
    ASSERT(cJSON_GetObjectItemCaseSensitive(txt, "lfs") == NULL);
    ASSERT(strcmp(cJSON_GetObjectItemCaseSensitive(txt, "oid")->valuestring, bin_oid) != 0);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* paths-info is a read: a server with --token answers it without one. */
TEST_IMPL(paths_info_needs_no_token)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub__server *srv = NULL;
    khub__server_opts so = {.dir = fx.repos, .faults = "", .token = "sekrit"};
    ASSERT_OK(khub__server_start(&so, &srv));
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%u", khub__server_port(srv));
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub__http_resp r;
    cJSON *j = NULL;
    ASSERT_EQ(post(hub, endpoint, PI "main", FORM, "paths=README.md", &r, &j), 200);
    ASSERT_EQ(cJSON_GetArraySize(j), 1);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    /* while a write without the token is still refused */
    ASSERT_EQ(
        post(hub, endpoint, "/api/kernels/org/demo/branch/x", "application/json", "{}", &r, &j),
        401);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    khub__server_stop(srv);
    fx_done(&fx);
}

static int have_python_hub(void)
{
    return system("python3 -c 'import huggingface_hub' >/dev/null 2>&1") == 0;
}

/* The official client's get_paths_info parses our answer (form body). */
TEST_IMPL(paths_info_huggingface_hub)
{
    if (!have_python_hub()) TEST_SKIP("huggingface_hub is not installed for python3");
    fixture fx;
    fx_init(&fx, NULL, 0);
    char cmd[2048], out[300];
    snprintf(out, sizeof out, "%s/py.txt", fx.root);
    snprintf(cmd, sizeof cmd,
             "HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_CACHE=%s python3 -c '"
             "from huggingface_hub import HfApi\n"
             "from huggingface_hub.hf_api import RepoFile, RepoFolder\n"
             "api = HfApi(endpoint=\"%s\")\n"
             "for rt in (\"kernel\", \"model\"):\n"
             "  got = api.get_paths_info(\"org/demo\", [\"README.md\", \"weights.bin\", "
             "\"docs\", \"nope\"], repo_type=rt, revision=\"v1\")\n"
             "  for e in sorted(got, key=lambda e: e.path):\n"
             "    if isinstance(e, RepoFile):\n"
             "      print(rt, \"file\", e.path, e.size, e.blob_id,\n"
             "            e.lfs.sha256 if e.lfs else \"-\")\n"
             "    else:\n"
             "      assert isinstance(e, RepoFolder)\n"
             "      print(rt, \"dir\", e.path)\n"
             "' > %s 2>&1",
             fx.cache, fx.endpoint, out);
    int rc = system(cmd);
    FILE *f = fopen(out, "rb");
    ASSERT(f != NULL);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    if (rc != 0) TEST_FAIL_("get_paths_info failed: %s", text);
    char sha1[41], sha256[65], line[256];
    ASSERT_OK(khub__git_blob_sha1_buf("# demo kernel\n", 14, sha1));
    snprintf(line, sizeof line, "kernel file README.md 14 %s -", sha1);
    ASSERT_CONTAINS(text, line);
    snprintf(line, sizeof line, "%s/org/demo/commits/" C1 "/weights.bin", fx.repos);
    ASSERT_OK(khub__sha256_file_hex(line, sha256));
    snprintf(line, sizeof line, "model file weights.bin 70000 ");
    ASSERT_CONTAINS(text, line);
    ASSERT_CONTAINS(text, sha256);
    ASSERT_CONTAINS(text, "kernel dir docs");
    ASSERT(strstr(text, "nope") == NULL);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(paths_info_form) \
    X(paths_info_json) \
    X(paths_info_errors) \
    X(paths_info_names_a_path_once) \
    X(paths_info_hashes_a_linked_file_once) \
    X(paths_info_needs_no_token) \
    X(paths_info_huggingface_hub)
TEST_MAIN(TEST_LIST)
