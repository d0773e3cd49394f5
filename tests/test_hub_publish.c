/* test_hub_publish.c: khub__publish against an in-process `khub serve`
 * with a write token: a round trip through khub_hub_download_variant with
 * digests equal to the build, republishing (no-op, changed, new major),
 * auth failures, and the server's write endpoints refusing hostile or
 * stale requests without changing what is on disk. */
#include <dirent.h>

#include <cjson/cJSON.h>

#include "hub_fixture.h"
#include "kernel_build.h"
#include "publish.h"

#define TOKEN "hf_write_token"

typedef struct kdir {
    char dir[400], vdir[600];
} kdir;

/* A built-looking kernel tree: kernel.json, build/<variant>/{libk.so,
 * metadata.json} and build/<variant>.tar.gz (packed by khub build's code). */
static void make_kernel(const fixture *fx, kdir *k, int major, const char *version,
                        const char *so_text)
{
    char path[900], meta[2048], sha[65], err[KHUB_ERROR_SIZE];
    snprintf(k->dir, sizeof k->dir, "%s/kernel", fx->root);
    snprintf(k->vdir, sizeof k->vdir, "%s/build/%s", k->dir, fx->variant);
    snprintf(path, sizeof path, "%s/build", k->dir);
    khub__rmtree(path);
    snprintf(path, sizeof path, "%s/kernel.json", k->dir);
    snprintf(meta, sizeof meta,
             "{\"repo\": \"acme/k\", \"major\": %d, \"version\": \"%s\", \"ops\": [{\"name\": "
             "\"rms_norm\", \"kind\": \"norm\"}], \"sources\": {\"cpu\": [\"k.c\"]}, "
             "\"variants\": {\"cpu\": [{\"level\": \"generic\"}]}}",
             major, version);
    fx_write(path, meta, strlen(meta));
    snprintf(path, sizeof path, "%s/libk.so", k->vdir);
    fx_write(path, so_text, strlen(so_text));
    ASSERT_OK(khub__sha256_hex(so_text, strlen(so_text), sha));
    snprintf(meta, sizeof meta,
             "{\"format\":1,\"name\":\"acme/k\",\"version\":\"%s\",\"major\":%d,"
             "\"variant\":\"%s\",\"abi\":{\"major\":1,\"minor\":0},"
             "\"backend\":{\"type\":\"cpu\",\"archs\":[\"%s\"]},"
             "\"plugins\":[{\"file\":\"libk.so\",\"level\":\"generic\",\"cpu_features\":[]}],"
             "\"files\":{\"libk.so\":\"%s\"},"
             "\"provenance\":{\"source_commit\":\"unknown\",\"dirty\":false}}",
             version, major, fx->variant, fx_arch(), sha);
    snprintf(path, sizeof path, "%s/metadata.json", k->vdir);
    fx_write(path, meta, strlen(meta));
    snprintf(path, sizeof path, "%s/build", k->dir);
    ASSERT_OK(khub__variant_pack(path, fx->variant, err, sizeof err));
}

/* The fixture's server, restarted with a write token. */
static void start_with_token(fixture *fx)
{
    fx_init(fx, NULL, 0);
    khub__server_stop(fx->srv);
    khub__server_opts so = {
        .dir = fx->repos, .log = fx_log_line, .log_ud = fx->log_file, .token = TOKEN};
    ASSERT_OK(khub__server_start(&so, &fx->srv));
    snprintf(fx->endpoint, sizeof fx->endpoint, "http://127.0.0.1:%u", khub__server_port(fx->srv));
}

static khub_status publish(const fixture *fx, const kdir *k, const char *token,
                           khub_publish_result *res, khub_hub **hub_out)
{
    khub_hub *hub = fx_hub(fx, 0, token);
    khub_publish_opts o = {.dir = k->dir};
    khub_status st = khub__publish(hub, &o, res);
    if (hub_out)
        *hub_out = hub;
    else
        khub_hub_free(hub);
    return st;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

TEST_IMPL(publish_round_trip)
{
    fixture fx;
    start_with_token(&fx);
    kdir k;
    make_kernel(&fx, &k, 1, "1.0.0",
                "\x7f"
                "ELF library bytes, version one");
    khub_publish_result res;
    khub_hub *hub = NULL;
    ASSERT_OK(publish(&fx, &k, TOKEN, &res, &hub));
    ASSERT_EQ(res.changed, 1);
    ASSERT_EQ(res.created_repo, 1);
    ASSERT_EQ(res.created_branch, 1);
    ASSERT_EQ(res.n_files, 3);
    ASSERT_EQ(res.n_uploaded, 2); /* libk.so and the archive go through LFS */
    ASSERT_STR_EQ(res.branch, "v1");
    ASSERT(khub__is_commit_hex(res.commit));
    ASSERT_CONTAINS(res.url, "/kernels/acme/k/commit/");
    /* the LFS PUTs carried no credentials; the API calls did */
    char *log = fx_log(&fx);
    ASSERT_CONTAINS(log, "PUT /lfs-upload/acme/k/");
    int puts = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "PUT /lfs-upload/", 16) != 0) continue;
        ASSERT_CONTAINS(line, " auth=no ");
        puts++;
    }
    ASSERT_EQ(puts, 2);
    free(log);
    log = fx_log(&fx);
    ASSERT_CONTAINS(log, "POST /api/kernels/acme/k/commit/v1 auth=yes");
    free(log);

    khub_hub_id id = fx_id("acme/k@version=1");
    char commit[41];
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, res.commit);
    khub_hub_file_list *fl = NULL;
    ASSERT_OK(khub_hub_download_variant(hub, &id, commit, fx.variant, &fl));
    ASSERT_EQ(fl->count, 1);
    char local[700], sha[65];
    snprintf(local, sizeof local, "%s/libk.so", k.vdir);
    ASSERT_OK(khub__sha256_file_hex(local, sha));
    ASSERT_STR_EQ(fl->items[0].sha256, sha);
    ASSERT_OK(khub__sha256_file_hex(fl->items[0].path, sha));
    ASSERT_STR_EQ(fl->items[0].sha256, sha);
    ASSERT_CONTAINS(fl->items[0].path, "/khub-variants/"); /* from the unpacked archive */
    khub_hub_file_list_free(fl);
    khub_hub_free(hub);
    /* one request for the variant's files: the archive, not file by file */
    log = fx_log(&fx);
    int gets = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "GET /kernels/acme/k/resolve/", 28) != 0) continue;
        char want[300];
        snprintf(want, sizeof want, "/build/%s.tar.gz ", fx.variant);
        ASSERT_CONTAINS(line, want);
        gets++;
    }
    ASSERT_EQ(gets, 1);
    free(log);

    /* the same build again: nothing to commit, the head stands */
    char first[41];
    memcpy(first, res.commit, 41);
    ASSERT_OK(publish(&fx, &k, TOKEN, &res, NULL));
    ASSERT_EQ(res.changed, 0);
    ASSERT_EQ(res.n_unchanged, 3);
    ASSERT_STR_EQ(res.commit, first);

    /* a changed v1 with a stale file: a new commit on v1, the file deleted */
    make_kernel(&fx, &k, 1, "1.0.1",
                "\x7f"
                "ELF library bytes, version one point one");
    ASSERT_OK(publish(&fx, &k, TOKEN, &res, NULL));
    ASSERT_EQ(res.changed, 1);
    ASSERT_EQ(res.n_deleted, 0);
    ASSERT(strcmp(res.commit, first) != 0);
    /* an extra file on the branch (as a manual upload would leave) */
    char extra_dir[900];
    snprintf(extra_dir, sizeof extra_dir, "%s/repos/acme/k/commits/%s/build/%s/old.txt", fx.root,
             res.commit, fx.variant);
    fx_write(extra_dir, "old\n", 4);
    make_kernel(&fx, &k, 1, "1.0.2",
                "\x7f"
                "ELF library bytes, one point two");
    ASSERT_OK(publish(&fx, &k, TOKEN, &res, NULL));
    ASSERT_EQ(res.n_deleted, 1);
    char path[1000];
    snprintf(path, sizeof path, "%s/repos/acme/k/commits/%s/build/%s/old.txt", fx.root, res.commit,
             fx.variant);
    ASSERT(access(path, F_OK) != 0);
    ASSERT(access(extra_dir, F_OK) == 0); /* the parent commit is untouched */

    /* v2: its own branch; v1 stays */
    char v1[41];
    memcpy(v1, res.commit, 41);
    make_kernel(&fx, &k, 2, "2.0.0",
                "\x7f"
                "ELF library bytes, two");
    ASSERT_OK(publish(&fx, &k, TOKEN, &res, NULL));
    ASSERT_STR_EQ(res.branch, "v2");
    ASSERT_EQ(res.created_branch, 1);
    ASSERT_EQ(res.created_repo, 0);
    snprintf(path, sizeof path, "%s/acme/k/refs.json", fx.repos);
    char *refs = read_all(path);
    ASSERT_CONTAINS(refs, v1);
    ASSERT_CONTAINS(refs, res.commit);
    fx_done(&fx);
}

TEST_IMPL(publish_auth_failures)
{
    fixture fx;
    start_with_token(&fx);
    kdir k;
    make_kernel(&fx, &k, 1, "1.0.0", "bytes");
    khub_publish_result res;
    khub_hub *hub = NULL;
    ASSERT_STATUS(publish(&fx, &k, NULL, &res, &hub), KHUB_STATUS_UNAUTHORIZED);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "creating repo acme/k: HTTP 401: token missing");
    khub_hub_free(hub);
    ASSERT_STATUS(publish(&fx, &k, "hf_wrong", &res, &hub), KHUB_STATUS_UNAUTHORIZED);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "HTTP 401: token rejected or it lacks write access");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "needs a token with write access to acme");
    khub_hub_free(hub);
    char path[600];
    snprintf(path, sizeof path, "%s/acme/k", fx.repos);
    ASSERT(access(path, F_OK) != 0); /* nothing was created */
    /* reads stay open without a token */
    hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    char commit[41];
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(publish_local_errors)
{
    fixture fx;
    start_with_token(&fx);
    kdir k;
    make_kernel(&fx, &k, 1, "1.0.0", "bytes");
    char path[700];
    snprintf(path, sizeof path, "%s/link.so", k.vdir);
    ASSERT_EQ(symlink("/etc/passwd", path), 0);
    khub_publish_result res;
    khub_hub *hub = NULL;
    ASSERT_STATUS(publish(&fx, &k, TOKEN, &res, &hub), KHUB_STATUS_UNSAFE_PATH);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "link.so is not a regular file");
    khub_hub_free(hub);
    snprintf(path, sizeof path, "%s/build", k.dir);
    khub__rmtree(path);
    ASSERT_STATUS(publish(&fx, &k, TOKEN, &res, &hub), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "has no build/ directory; run 'khub build");
    khub_hub_free(hub);
    fx_done(&fx);
}

/* ------------------------------------------------------------------------ */
/* The server's write endpoints, spoken to directly                          */
/* ------------------------------------------------------------------------ */

static long request(khub_hub *hub, const char *method, const char *url, const char *ctype,
                    const char *body, khub__http_resp *r)
{
    khub__http_req req = {.method = method,
                          .url = url,
                          .auth = 1,
                          .what = "test",
                          .body = body,
                          .body_len = body ? strlen(body) : 0,
                          .content_type = ctype};
    memset(r, 0, sizeof *r);
    ASSERT_OK(khub__http_fetch(hub, &req, r));
    return r->status;
}

static int count_commits(const fixture *fx)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/org/demo/commits", fx->repos);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) n += de->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

TEST_IMPL(server_refuses_bad_commits)
{
    fixture fx;
    start_with_token(&fx);
    khub_hub *hub = fx_hub(&fx, 0, TOKEN);
    char url[256], refs_before[4096], path[600];
    snprintf(path, sizeof path, "%s/org/demo/refs.json", fx.repos);
    snprintf(refs_before, sizeof refs_before, "%s", read_all(path));
    int commits = count_commits(&fx);
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/commit/main", fx.endpoint);
    static const struct {
        const char *body;
        long code;
        const char *msg;
    } cases[] = {
        {"{\"key\":\"header\",\"value\":{\"summary\":\"x\",\"parentCommit\":\"" C2 "\"}}\n", 412,
         "parentCommit is not the head"},
        {"{\"key\":\"header\",\"value\":{\"summary\":\"x\"}}\n{\"key\":\"file\",\"value\":"
         "{\"path\":\"../escape.txt\",\"content\":\"eA==\",\"encoding\":\"base64\"}}\n",
         400, "not a safe repo-relative path"},
        {"{\"key\":\"header\",\"value\":{\"summary\":\"x\"}}\n{\"key\":\"lfsFile\",\"value\":"
         "{\"path\":\"a.so\",\"algo\":\"sha256\",\"oid\":\"" C1 "aaaaaaaaaaaaaaaaaaaaaaaa\","
         "\"size\":3}}\n",
         422, "was not uploaded"},
        {"{\"key\":\"header\",\"value\":{\"summary\":\"x\"}}\n{\"key\":\"deletedFile\",\"value\":"
         "{\"path\":\"nope.txt\"}}\n",
         404, "doesn't exist"},
        {"{\"key\":\"header\",\"value\":{\"summary\":\"x\"}}\n{\"key\":\"file\",\"value\":"
         "{\"path\":\"ok.txt\",\"content\":\"!!!!\",\"encoding\":\"base64\"}}\n",
         400, "not valid base64"},
        {"not json\n", 400, "is not {\"key\""},
        {"{\"key\":\"file\",\"value\":{\"path\":\"a\",\"content\":\"\"}}\n", 400,
         "no \"header\" line"},
    };
    khub__http_resp r;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ASSERT_EQ(request(hub, "POST", url, "application/x-ndjson", cases[i].body, &r),
                  cases[i].code);
        ASSERT_CONTAINS(r.error_message, cases[i].msg);
        khub__http_resp_free(&r);
    }
    /* 100,000 operations at most (the header counts), in either form: the
     * JSON form had no limit, and the NDJSON form's count walked the list
     * of operations for every line (quadratic in the body) */
    enum { OPS = 100000 };
    static const char del_line[] = "{\"key\":\"deletedFile\",\"value\":{\"path\":\"x\"}}\n";
    char *big = malloc(64 + (size_t)OPS * sizeof del_line), *at = big;
    ASSERT(big != NULL);
    at = stpcpy(at, "{\"key\":\"header\",\"value\":{\"summary\":\"x\"}}\n");
    for (int i = 0; i < OPS; i++) at = stpcpy(at, del_line);
    ASSERT_EQ(request(hub, "POST", url, "application/x-ndjson", big, &r), 413);
    ASSERT_STR_EQ(r.error_message, "commit body: more than 100000 operations");
    khub__http_resp_free(&r);
    at = stpcpy(big, "{\"summary\":\"x\",\"deletedFiles\":[");
    for (int i = 0; i < OPS; i++) at = stpcpy(at, i ? ",{\"path\":\"x\"}" : "{\"path\":\"x\"}");
    stpcpy(at, "]}");
    ASSERT_EQ(request(hub, "POST", url, "application/json", big, &r), 413);
    ASSERT_STR_EQ(r.error_message, "commit body: more than 100000 operations");
    khub__http_resp_free(&r);
    free(big);
    /* a failed commit leaves refs.json and commits/ as they were */
    ASSERT_STR_EQ(read_all(path), refs_before);
    ASSERT_EQ(count_commits(&fx), commits);
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/commit/nobranch", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/x-ndjson", cases[0].body, &r), 404);
    ASSERT_STR_EQ(r.error_code, "RevisionNotFound");
    khub__http_resp_free(&r);

    /* the JSON form commits; the file is served at the new head */
    snprintf(url, sizeof url, "%s/api/models/org/demo/commit/main", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/json",
                      "{\"summary\":\"json\",\"parentCommit\":\"" C1 "\",\"files\":[{\"path\":"
                      "\"notes/a.txt\",\"content\":\"aGVsbG8=\",\"encoding\":\"base64\"}]}",
                      &r),
              200);
    cJSON *j = cJSON_Parse(r.body);
    const char *oid = cJSON_GetObjectItemCaseSensitive(j, "commitOid")->valuestring;
    ASSERT(khub__is_commit_hex(oid));
    ASSERT_CONTAINS(cJSON_GetObjectItemCaseSensitive(j, "commitUrl")->valuestring,
                    "/org/demo/commit/");
    snprintf(path, sizeof path, "%s/org/demo/commits/%s/notes/a.txt", fx.repos, oid);
    ASSERT_STR_EQ(read_all(path), "hello");
    snprintf(path, sizeof path, "%s/org/demo/commits/%s/README.md", fx.repos, oid);
    ASSERT_STR_EQ(read_all(path), "# demo kernel\n"); /* the parent's files carried over */
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(server_lfs_upload_checks)
{
    fixture fx;
    start_with_token(&fx);
    khub_hub *hub = fx_hub(&fx, 0, TOKEN);
    const char *data = "lfs object bytes";
    char sha[65], url[256], body[512];
    ASSERT_OK(khub__sha256_hex(data, strlen(data), sha));
    snprintf(url, sizeof url, "%s/kernels/org/demo.git/info/lfs/objects/batch", fx.endpoint);
    snprintf(body, sizeof body,
             "{\"operation\":\"upload\",\"transfers\":[\"basic\"],"
             "\"hash_algo\":\"sha_256\",\"objects\":[{\"oid\":\"%s\",\"size\":%zu},"
             "{\"oid\":\"../x\",\"size\":1}]}",
             sha, strlen(data));
    khub__http_resp r;
    ASSERT_EQ(request(hub, "POST", url, "application/vnd.git-lfs+json", body, &r), 200);
    cJSON *j = cJSON_Parse(r.body);
    khub__http_resp_free(&r);
    cJSON *objs = cJSON_GetObjectItemCaseSensitive(j, "objects");
    ASSERT_STR_EQ(cJSON_GetObjectItemCaseSensitive(j, "transfer")->valuestring, "basic");
    ASSERT(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(objs, 1), "error") != NULL);
    cJSON *act = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(objs, 0), "actions");
    char href[1024];
    snprintf(
        href, sizeof href, "%s",
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(act, "upload"), "href")
            ->valuestring);
    cJSON_Delete(j);
    /* wrong bytes, then a forged capability, then the real upload */
    khub__http_req put = {.method = "PUT",
                          .url = href,
                          .what = "put",
                          .body = "lfs object BYTES",
                          .body_len = strlen(data)};
    memset(&r, 0, sizeof r);
    ASSERT_OK(khub__http_fetch(hub, &put, &r));
    ASSERT_EQ(r.status, 400);
    ASSERT_CONTAINS(r.error_message, "is not the oid");
    khub__http_resp_free(&r);
    char forged[1024];
    snprintf(forged, sizeof forged, "%s", href);
    forged[strlen(forged) - 1] ^= 1;
    put.url = forged;
    put.body = data;
    ASSERT_OK(khub__http_fetch(hub, &put, &r));
    ASSERT_EQ(r.status, 403);
    ASSERT_CONTAINS(r.error_message, "not valid for this object");
    khub__http_resp_free(&r);
    put.url = href;
    ASSERT_OK(khub__http_fetch(hub, &put, &r));
    ASSERT_EQ(r.status, 200);
    khub__http_resp_free(&r);
    /* verify, and a second batch now says "stored" (no actions) */
    snprintf(body, sizeof body, "{\"oid\":\"%s\",\"size\":%zu}", sha, strlen(data));
    snprintf(url, sizeof url, "%s/lfs-verify/org/demo", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/vnd.git-lfs+json", body, &r), 200);
    khub__http_resp_free(&r);
    snprintf(url, sizeof url, "%s/kernels/org/demo.git/info/lfs/objects/batch", fx.endpoint);
    snprintf(body, sizeof body,
             "{\"operation\":\"upload\",\"objects\":[{\"oid\":\"%s\","
             "\"size\":%zu}]}",
             sha, strlen(data));
    ASSERT_EQ(request(hub, "POST", url, "application/vnd.git-lfs+json", body, &r), 200);
    ASSERT(strstr(r.body, "actions") == NULL);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A commit's NDJSON body from its operation lines ('|' between lines): the
 * new commit's id into id. */
#define OID          "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define LFS(p)       "{\"key\":\"lfsFile\",\"value\":{\"path\":\"" p "\",\"oid\":\"" OID "\"}}\n"
#define FILE_OP(p)   "{\"key\":\"file\",\"value\":{\"path\":\"" p "\",\"content\":\"x\"}}\n"
#define DEL(kind, p) "{\"key\":\"deleted" kind "\",\"value\":{\"path\":\"" p "\"}}\n"
#define HEADER       "{\"key\":\"header\",\"value\":{\"summary\":\"marks\"}}\n"

static void commit_ops(khub_hub *hub, const fixture *fx, const char *body, char id[41])
{
    char url[256];
    khub__http_resp r;
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/commit/main", fx->endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/x-ndjson", body, &r), 200);
    cJSON *j = cJSON_Parse(r.body);
    snprintf(id, 41, "%s", cJSON_GetObjectItemCaseSensitive(j, "commitOid")->valuestring);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
}

/* The "lfs" marks that log/<id>.json records, as unformatted JSON. */
static char *lfs_marks(const fixture *fx, const char *id)
{
    char path[700];
    snprintf(path, sizeof path, "%s/org/demo/log/%s.json", fx->repos, id);
    cJSON *j = cJSON_Parse(read_all(path));
    char *text = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(j, "lfs"));
    cJSON_Delete(j);
    return text;
}

/* Which paths a commit records as stored through LFS, in what order, after
 * operations that name a path twice, differ only in case, overwrite an LFS
 * file with a plain one (and back), and delete files and folders (a folder
 * named like a file's prefix keeps that file), across two commits. */
TEST_IMPL(server_commit_lfs_marks)
{
    fixture fx;
    start_with_token(&fx);
    khub_hub *hub = fx_hub(&fx, 0, TOKEN);
    char path[700], id[41];
    snprintf(path, sizeof path, "%s/org/demo/lfs/" OID, fx.repos);
    fx_write(path, "lfs object bytes", 16);
    commit_ops(hub, &fx,
               HEADER LFS("a.bin") LFS("B.bin") LFS("b.bin") LFS("a.bin") FILE_OP("c.txt")
                   LFS("c.txt") LFS("d.bin") FILE_OP("d.bin") LFS("dir/x.bin") LFS("dir/sub/y.bin")
                       LFS("dirx.bin") LFS("dir2/z.bin") DEL("Folder", "dir/") LFS("e.bin")
                           DEL("File", "e.bin"),
               id);
    char *marks = lfs_marks(&fx, id);
    ASSERT_STR_EQ(marks, "{\"B.bin\":true,\"b.bin\":true,\"a.bin\":true,\"c.txt\":true,"
                         "\"dirx.bin\":true,\"dir2/z.bin\":true}");
    free(marks);
    commit_ops(hub, &fx,
               HEADER LFS("dir/x.bin") DEL("File", "b.bin") FILE_OP("B.bin") LFS("f.bin")
                   DEL("Folder", "dir2"),
               id);
    marks = lfs_marks(&fx, id);
    ASSERT_STR_EQ(marks, "{\"a.bin\":true,\"c.txt\":true,\"dirx.bin\":true,\"dir/x.bin\":true,"
                         "\"f.bin\":true}");
    free(marks);
    /* served by those marks: c.txt is an LFS file by its mark alone, B.bin
     * (now a plain file) by the *.bin glob, README.md not at all */
    char url[256];
    khub__http_resp r;
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/paths-info/main", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/x-www-form-urlencoded",
                      "paths=c.txt&paths=B.bin&paths=README.md", &r),
              200);
    cJSON *j = cJSON_Parse(r.body), *e;
    int n = 0;
    cJSON_ArrayForEach(e, j)
    {
        const char *p = cJSON_GetObjectItemCaseSensitive(e, "path")->valuestring;
        ASSERT_EQ(cJSON_GetObjectItemCaseSensitive(e, "lfs") != NULL, strcmp(p, "README.md") != 0);
        n++;
    }
    ASSERT_EQ(n, 3);
    cJSON_Delete(j);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(server_branches_and_tags)
{
    fixture fx;
    start_with_token(&fx);
    khub_hub *hub = fx_hub(&fx, 0, TOKEN);
    char url[256];
    khub__http_resp r;
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/branch/dev", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/json", "{\"startingPoint\":\"v2\"}", &r), 200);
    khub__http_resp_free(&r);
    ASSERT_EQ(request(hub, "POST", url, "application/json", "{}", &r), 409);
    khub__http_resp_free(&r);
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/branch/..%%2Fx", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/json", "{}", &r), 400);
    ASSERT_CONTAINS(r.error_message, "invalid branch name");
    khub__http_resp_free(&r);
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/tag/dev", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/json", "{\"tag\":\"v2.0.0\"}", &r), 200);
    khub__http_resp_free(&r);
    ASSERT_EQ(request(hub, "POST", url, "application/json", "{\"tag\":\"v2.0.0\"}", &r), 409);
    khub__http_resp_free(&r);
    khub_hub_id id = fx_id("org/demo@v2.0.0");
    char commit[41];
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, C2);
    id = fx_id("org/demo@dev");
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, C2);
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/branch/dev", fx.endpoint);
    ASSERT_EQ(request(hub, "DELETE", url, NULL, NULL, &r), 200);
    khub__http_resp_free(&r);
    ASSERT_EQ(request(hub, "DELETE", url, NULL, NULL, &r), 404);
    khub__http_resp_free(&r);
    snprintf(url, sizeof url, "%s/api/kernels/org/demo/branch/main", fx.endpoint);
    ASSERT_EQ(request(hub, "DELETE", url, NULL, NULL, &r), 403);
    khub__http_resp_free(&r);
    snprintf(url, sizeof url, "%s/api/validate-yaml", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/json", "{\"content\":\"\"}", &r), 200);
    ASSERT_CONTAINS(r.body, "\"errors\":[]");
    khub__http_resp_free(&r);
    /* repos/create: 409 on an existing repo still names its url */
    snprintf(url, sizeof url, "%s/api/repos/create", fx.endpoint);
    ASSERT_EQ(request(hub, "POST", url, "application/json",
                      "{\"name\":\"demo\",\"organization\":\"org\",\"type\":\"kernel\"}", &r),
              409);
    ASSERT_CONTAINS(r.body, "\"url\":\"http://127.0.0.1:");
    khub__http_resp_free(&r);
    ASSERT_EQ(request(hub, "POST", url, "application/json",
                      "{\"name\":\"..\",\"organization\":\"org\"}", &r),
              400);
    khub__http_resp_free(&r);
    khub_hub_free(hub);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(publish_round_trip) \
    X(publish_auth_failures) \
    X(publish_local_errors) \
    X(server_refuses_bad_commits) \
    X(server_lfs_upload_checks) \
    X(server_commit_lfs_marks) \
    X(server_branches_and_tags)
TEST_MAIN(TEST_LIST)
