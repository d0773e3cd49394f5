/* test_hub_trees.c: trees/<commit>.json, huggingface_hub's tree cache. The
 * first listing of a commit fetches the full listing once and keeps it;
 * later listings (any directory, recursive or not, online or offline) come
 * from it with no request; an unusable file is ignored; huggingface_hub
 * reads the file khub writes, and khub reads the one it writes. */
#include <cjson/cJSON.h>

#include "hub_fixture.h"

static int tree_gets(const fixture *fx)
{
    char *log = fx_log(fx);
    int n = 0;
    for (const char *q = log; (q = strstr(q, "GET /api/kernels/org/demo/tree/")); q++) n++;
    free(log);
    return n;
}

static void tree_path(const fixture *fx, const char *commit, char *buf, size_t n)
{
    snprintf(buf, n, "%s/kernels--org--demo/trees/%s.json", fx->cache, commit);
}

static cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return cJSON_Parse(buf);
}

static int has_entry(const khub__tree *t, const char *path, int is_dir)
{
    for (size_t i = 0; i < t->count; i++)
        if (!strcmp(t->items[i].path, path) && t->items[i].is_dir == is_dir) return 1;
    return 0;
}

TEST_IMPL(trees_written_once_then_reused)
{
    fixture fx;
    fx_init(&fx, NULL, 3); /* pages of 3: the full listing follows Link headers */
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, C1, "build", 0, &t));
    ASSERT_EQ(t.count, 2); /* the two variant directories */
    char v[128];
    snprintf(v, sizeof v, "build/%s", fx.variant);
    ASSERT(has_entry(&t, v, 1));
    ASSERT(has_entry(&t, "build/torch212-cxx11-cu130-x86_64-linux", 1));
    khub__tree_free(&t);
    int gets = tree_gets(&fx);
    ASSERT_LE(2, gets); /* one paginated full listing */

    char path[512];
    tree_path(&fx, C1, path, sizeof path);
    cJSON *j = read_json(path);
    ASSERT(j != NULL);
    ASSERT_EQ(cJSON_GetObjectItemCaseSensitive(j, "format_version")->valuedouble, 1);
    cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    ASSERT_EQ(cJSON_GetArraySize(files), 10); /* files only, no directories */
    cJSON *readme = cJSON_GetObjectItemCaseSensitive(files, "README.md");
    char sha1[41];
    ASSERT_OK(khub__git_blob_sha1_buf("# demo kernel\n", 14, sha1));
    ASSERT_STR_EQ(cJSON_GetObjectItemCaseSensitive(readme, "blob_id")->valuestring, sha1);
    ASSERT(cJSON_GetObjectItemCaseSensitive(readme, "lfs_sha256") == NULL);
    cJSON *w = cJSON_GetObjectItemCaseSensitive(files, "weights.bin");
    ASSERT(khub__is_sha256_hex(cJSON_GetObjectItemCaseSensitive(w, "lfs_sha256")->valuestring));
    ASSERT_EQ(cJSON_GetObjectItemCaseSensitive(w, "lfs_size")->valuedouble, 70000);
    cJSON_Delete(j);

    /* every later listing of C1 is answered from the file */
    uint64_t before = khub_hub_request_count(hub);
    ASSERT_OK(khub__list_tree(hub, &id, C1, "docs", 1, &t));
    ASSERT_EQ(t.count, 5);
    ASSERT(has_entry(&t, "docs/page3.md", 0));
    khub__tree_free(&t);
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 0, &t));
    ASSERT(has_entry(&t, "README.md", 0) && has_entry(&t, "build", 1) && has_entry(&t, "docs", 1));
    ASSERT_EQ(t.count, 4);
    khub__tree_free(&t);
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 1, &t));
    ASSERT_EQ(t.count, 10 + 4); /* files, and build, docs and the two variant dirs */
    khub__tree_free(&t);
    ASSERT_STATUS(khub__list_tree(hub, &id, C1, "nope", 0, &t), KHUB_STATUS_ENTRY_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "no such directory at that commit");
    khub__tree_free(&t);
    ASSERT_EQ(khub_hub_request_count(hub), before);
    ASSERT_EQ(tree_gets(&fx), gets);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(trees_offline)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, C1, "build", 0, &t));
    khub__tree_free(&t);
    khub_hub_free(hub);
    hub = fx_hub(&fx, 1, NULL);
    char sub[128];
    snprintf(sub, sizeof sub, "build/%s", fx.variant);
    ASSERT_OK(khub__list_tree(hub, &id, C1, sub, 1, &t));
    ASSERT_EQ(t.count, 2);
    char rel[256];
    snprintf(rel, sizeof rel, "%s/metadata.json", sub);
    ASSERT(has_entry(&t, rel, 0));
    khub__tree_free(&t);
    /* C2 was never listed */
    khub_hub_id id2 = fx_id("org/demo@" C2);
    ASSERT_STATUS(khub__list_tree(hub, &id2, C2, "", 1, &t), KHUB_STATUS_OFFLINE);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "no cached listing");
    khub__tree_free(&t);
    ASSERT_EQ(khub_hub_request_count(hub), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A hostile or stale file is ignored and replaced by a fresh listing. */
TEST_IMPL(trees_unusable_file_ignored)
{
    static const char *bad[] = {
        "not json",
        "{\"format_version\":2,\"files\":{}}",
        "{\"format_version\":1,\"files\":{\"../../etc/x\":{\"size\":1,\"blob_id\":"
        "\"" C1 "\"}}}",
        "{\"format_version\":1,\"files\":{\"a\":{\"size\":-1,\"blob_id\":\"" C1 "\"}}}",
        "{\"format_version\":1,\"files\":{\"a\":{\"size\":1,\"blob_id\":\"zz\"}}}",
        "{\"format_version\":1,\"files\":{\"a\":{\"size\":1,\"blob_id\":\"" C1 "\","
        "\"lfs_sha256\":\"short\"}}}",
    };
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    char path[512];
    tree_path(&fx, C1, path, sizeof path);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fx_write(path, bad[i], strlen(bad[i]));
        int gets = tree_gets(&fx);
        khub__tree t = {0};
        ASSERT_OK(khub__list_tree(hub, &id, C1, "", 0, &t));
        ASSERT(has_entry(&t, "README.md", 0));
        ASSERT(!has_entry(&t, "a", 0));
        khub__tree_free(&t);
        ASSERT_EQ(tree_gets(&fx), gets + 1);
        cJSON *j = read_json(path); /* rewritten */
        ASSERT(j != NULL);
        ASSERT_EQ(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "files")), 10);
        cJSON_Delete(j);
    }
    khub_hub_free(hub);
    fx_done(&fx);
}

typedef struct logged {
    int n_warn;
    char last[1024];
} logged;

static void capture(void *ud, khub_log_level level, const char *msg)
{
    logged *l = ud;
    if (level != KHUB_LOG_WARN) return;
    l->n_warn++;
    snprintf(l->last, sizeof l->last, "%s", msg);
}

/* A hub handed a runtime (khub_hub_set_runtime) logs through the runtime's
 * callback, not stderr: the unusable tree cache's warning arrives there,
 * once, naming the file; unset again, the callback hears nothing. */
TEST_IMPL(hub_warnings_go_to_the_runtime_log)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    logged lg = {0};
    khub_runtime_opts ro = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1, .log = capture,
                            .log_ud = &lg};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&ro, &rt));
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_set_runtime(hub, rt);
    khub_hub_id id = fx_id("org/demo@" C1);
    char path[512];
    tree_path(&fx, C1, path, sizeof path);
    fx_write(path, "not json", 8);
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 0, &t));
    khub__tree_free(&t);
    ASSERT_EQ(lg.n_warn, 1);
    ASSERT_CONTAINS(lg.last, "ignoring the unusable tree cache ");
    ASSERT_CONTAINS(lg.last, "/trees/" C1 ".json");
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 0, &t)); /* rewritten: no warning */
    khub__tree_free(&t);
    ASSERT_EQ(lg.n_warn, 1);
    khub_hub_set_runtime(hub, NULL);
    fx_write(path, "not json", 8);
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 0, &t));
    khub__tree_free(&t);
    ASSERT_EQ(lg.n_warn, 1);
    khub_hub_free(hub);
    khub_runtime_free(rt);
    fx_done(&fx);
}

/* A cache where trees/ cannot be written still lists (the write is best
 * effort): here trees is a file, which works as root too. */
TEST_IMPL(trees_unwritable_cache)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    char path[512];
    snprintf(path, sizeof path, "%s/kernels--org--demo/trees", fx.cache);
    fx_write(path, "x", 1);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, C1, "docs", 0, &t));
    ASSERT_EQ(t.count, 5);
    khub__tree_free(&t);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), ""); /* the failed write left no error behind */
    khub_hub_free(hub);
    fx_done(&fx);
}

static int have_python_hub(void)
{
    return system("python3 -c 'import huggingface_hub' >/dev/null 2>&1") == 0;
}

static void run_py(const fixture *fx, const char *script, char *text, size_t size)
{
    char cmd[4096], out[300];
    snprintf(out, sizeof out, "%s/py.txt", fx->root);
    snprintf(cmd, sizeof cmd,
             "HF_ENDPOINT=%s HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_CACHE=%s "
             "python3 -c '%s' > %s 2>&1",
             fx->endpoint, fx->cache, script, out);
    int rc = system(cmd);
    FILE *f = fopen(out, "rb");
    ASSERT(f != NULL);
    size_t n = fread(text, 1, size - 1, f);
    text[n] = '\0';
    fclose(f);
    if (rc != 0) TEST_FAIL_("python failed: %s", text);
}

/* huggingface_hub reads khub's file offline: get_cached_repo_tree lists it,
 * and snapshot_download's completeness check uses it. */
TEST_IMPL(trees_read_by_huggingface_hub)
{
    if (!have_python_hub()) TEST_SKIP("huggingface_hub is not installed for python3");
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@v1");
    char commit[41], *p = NULL;
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "README.md", &p));
    free(p);
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, commit, "docs", 0, &t));
    khub__tree_free(&t);
    khub_hub_free(hub);
    char text[8192];
    run_py(&fx,
           "import os\n"
           "os.environ[\"HF_HUB_OFFLINE\"] = \"1\"\n"
           "from huggingface_hub import get_cached_repo_tree, snapshot_download\n"
           "from huggingface_hub.errors import IncompleteSnapshotError\n"
           "fs = get_cached_repo_tree(\"org/demo\", repo_type=\"kernel\", revision=\"v1\")\n"
           "print(\"files\", len(fs), sorted(f.path for f in fs)[0])\n"
           "snapshot_download(\"org/demo\", repo_type=\"kernel\", revision=\"v1\", "
           "allow_patterns=[\"README.md\"])\n"
           "try:\n"
           "  snapshot_download(\"org/demo\", repo_type=\"kernel\", revision=\"v1\")\n"
           "  print(\"complete?\")\n"
           "except IncompleteSnapshotError as e:\n"
           "  print(\"incomplete\", str(e)[:40])\n",
           text, sizeof text);
    ASSERT_CONTAINS(text, "files 10 README.md");
    ASSERT_CONTAINS(text, "incomplete");
    fx_done(&fx);
}

/* ... and khub reads the file huggingface_hub's snapshot_download wrote. */
TEST_IMPL(trees_written_by_huggingface_hub)
{
    if (!have_python_hub()) TEST_SKIP("huggingface_hub is not installed for python3");
    fixture fx;
    fx_init(&fx, NULL, 0);
    char text[8192];
    run_py(&fx,
           "from huggingface_hub import snapshot_download\n"
           "print(snapshot_download(\"org/demo\", repo_type=\"kernel\", revision=\"v1\", "
           "allow_patterns=[\"README.md\"]))\n",
           text, sizeof text);
    char path[512];
    tree_path(&fx, C1, path, sizeof path);
    cJSON *j = read_json(path);
    ASSERT(j != NULL);
    cJSON_Delete(j);
    khub_hub *hub = fx_hub(&fx, 1, NULL);
    khub_hub_id id = fx_id("org/demo@" C1);
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, C1, "build", 0, &t));
    char v[128];
    snprintf(v, sizeof v, "build/%s", fx.variant);
    ASSERT(has_entry(&t, v, 1));
    khub__tree_free(&t);
    ASSERT_EQ(khub_hub_request_count(hub), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(trees_written_once_then_reused) \
    X(trees_offline) \
    X(trees_unusable_file_ignored) \
    X(hub_warnings_go_to_the_runtime_log) \
    X(trees_unwritable_cache) \
    X(trees_read_by_huggingface_hub) \
    X(trees_written_by_huggingface_hub)
TEST_MAIN(TEST_LIST)
