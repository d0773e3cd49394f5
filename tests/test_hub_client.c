/* test_hub_client.c: resolve, download and the cache against an in-process
 * `khub serve` on loopback; offline mode; the token policy. */
#include <dirent.h>

#include "hub_fixture.h"

static int count_blobs(const fixture *fx, const char *suffix)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/kernels--org--demo/blobs", fx->cache);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        size_t l = strlen(de->d_name), sl = strlen(suffix);
        if (!suffix[0] ? !strchr(de->d_name, '.')
                       : (l >= sl && !strcmp(de->d_name + l - sl, suffix)))
            n++;
    }
    if (d) closedir(d);
    return n;
}

static void read_text(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = '\0';
    fclose(f);
}

/* Counts occurrences of needle in the server log. */
static int log_count(const fixture *fx, const char *needle)
{
    char *log = fx_log(fx);
    int n = 0;
    for (const char *q = log; (q = strstr(q, needle)); q++) n++;
    free(log);
    return n;
}

TEST_IMPL(resolve_forms)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    char commit[41];
    khub_hub_id id = fx_id("org/demo@main");
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, C1);
    id = fx_id("org/demo@version=2");
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, C2);
    id = fx_id("org/demo");
    ASSERT_OK(khub_hub_resolve(hub, &id, commit)); /* highest v<N> */
    ASSERT_STR_EQ(commit, C2);
    id = fx_id("org/demo@v1.0.0");
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, C1);
    /* refs/<rev>: exactly 40 hex digits, no newline */
    char path[512], text[64];
    snprintf(path, sizeof path, "%s/kernels--org--demo/refs/v2", fx.cache);
    read_text(path, text, sizeof text);
    ASSERT_STR_EQ(text, C2);
    uint64_t before = khub_hub_request_count(hub);
    id = fx_id("org/demo@" C1);
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_EQ(khub_hub_request_count(hub), before); /* a commit costs no request */
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(resolve_errors)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    char commit[41];
    khub_hub_id id = fx_id("org/demo@nope");
    ASSERT_STATUS(khub_hub_resolve(hub, &id, commit), KHUB_STATUS_REVISION_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "RevisionNotFound");
    id = fx_id("org/demo@version=7");
    ASSERT_STATUS(khub_hub_resolve(hub, &id, commit), KHUB_STATUS_REVISION_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "available: v1, v2");
    id = fx_id("org/missing@main");
    ASSERT_STATUS(khub_hub_resolve(hub, &id, commit), KHUB_STATUS_REPO_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "RepoNotFound");
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(download_regular_and_lfs)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "README.md", &p));
    char text[128];
    read_text(p, text, sizeof text);
    ASSERT_STR_EQ(text, "# demo kernel\n");
    /* a relative link to the blob named by the git blob id */
    char link[512];
    ssize_t n = readlink(p, link, sizeof link - 1);
    ASSERT(n > 0);
    link[n] = '\0';
    ASSERT(strncmp(link, "../../blobs/", 12) == 0);
    char want[41];
    ASSERT_OK(khub__git_blob_sha1_file(p, want));
    ASSERT_STR_EQ(link + 12, want);
    free(p);
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "weights.bin", &p));
    char sha[65];
    ASSERT_OK(khub__sha256_file_hex(p, sha));
    n = readlink(p, link, sizeof link - 1);
    link[n] = '\0';
    ASSERT_STR_EQ(link + 12, sha); /* LFS: named by SHA-256 */
    free(p);
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "docs/page1.md", &p));
    n = readlink(p, link, sizeof link - 1);
    ASSERT(n > 0);
    link[n] = '\0';
    ASSERT(strncmp(link, "../../../blobs/", 15) == 0); /* relative from a nested entry too */
    free(p);
    ASSERT_EQ(count_blobs(&fx, ".incomplete"), 0);
    /* cached: no request at all */
    uint64_t before = khub_hub_request_count(hub);
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "weights.bin", &p));
    free(p);
    ASSERT_EQ(khub_hub_request_count(hub), before);
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C1, "nope.txt", &p),
                  KHUB_STATUS_ENTRY_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "EntryNotFound");
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C1, "../etc/passwd", &p),
                  KHUB_STATUS_UNSAFE_PATH);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "refusing repo path");
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(offline_uses_cache_only)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@version=1");
    char commit[41], *p = NULL;
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "README.md", &p));
    free(p);
    khub_hub_free(hub);
    uint64_t served = khub__server_requests(fx.srv);
    khub__server_stop(fx.srv); /* nothing to connect to */
    fx.srv = NULL;
    hub = fx_hub(&fx, 1, NULL);
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, C1);
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "README.md", &p));
    free(p);
    ASSERT_STATUS(khub_hub_download_file(hub, &id, commit, "weights.bin", &p), KHUB_STATUS_OFFLINE);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "not cached");
    id = fx_id("org/demo@version=2");
    ASSERT_STATUS(khub_hub_resolve(hub, &id, commit), KHUB_STATUS_OFFLINE);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "not cached");
    ASSERT_EQ(khub_hub_request_count(hub), 0);
    (void)served;
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(fallback_to_refs_when_unreachable)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    char commit[41];
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    khub_hub_free(hub);
    khub__server_stop(fx.srv);
    fx.srv = NULL;
    hub = fx_hub(&fx, 0, NULL);
    memset(commit, 0, sizeof commit);
    ASSERT_OK(khub_hub_resolve(hub, &id, commit)); /* connection refused -> refs/main */
    ASSERT_STR_EQ(commit, C1);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(token_sent_to_hub_only)
{
    fixture fx;
    fx_init(&fx, "cross-host", 0);
    khub_hub *hub = fx_hub(&fx, 0, "hf_secret");
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "weights.bin", &p));
    free(p);
    char *log = fx_log(&fx);
    ASSERT_CONTAINS(log, "HEAD /kernels/org/demo/resolve/" C1 "/weights.bin auth=yes");
    ASSERT_CONTAINS(log, "GET /cdn/org/demo/" C1 "/weights.bin auth=no");
    ASSERT_CONTAINS(log, "ua=khub/");
    free(log);
    khub_hub_free(hub);
    fx_done(&fx);
}

TEST_IMPL(tree_paging_and_hostile_entries)
{
    fixture fx;
    fx_init(&fx, NULL, 2);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    khub__tree t = {0};
    ASSERT_OK(khub__list_tree(hub, &id, C1, "", 1, &t));
    int files = 0;
    for (size_t i = 0; i < t.count; i++) files += !t.items[i].is_dir;
    ASSERT_EQ(files, 10);
    khub__tree_free(&t);
    char *log = fx_log(&fx);
    int pages = 0;
    for (const char *q = log; (q = strstr(q, "GET /api/kernels/org/demo/tree/")); q++) pages++;
    ASSERT_LE(5, pages); /* 2 entries a page: followed the Link headers */
    free(log);
    const char *bad = "[{\"type\":\"file\",\"path\":\"../../x\",\"size\":1,"
                      "\"oid\":\"" C1 "\"}]";
    ASSERT_STATUS(khub__tree_parse(hub, bad, strlen(bad), &t), KHUB_STATUS_UNSAFE_PATH);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "not a safe relative path");
    khub__tree_free(&t);
    khub__hub_clear(hub);
    const char *abs = "[{\"type\":\"file\",\"path\":\"/etc/x\",\"size\":1,\"oid\":\"" C1 "\"}]";
    ASSERT_STATUS(khub__tree_parse(hub, abs, strlen(abs), &t), KHUB_STATUS_UNSAFE_PATH);
    khub__tree_free(&t);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A next-page link to another host than the endpoint is refused: the
 * token would follow it, and a listing is the Hub's to give. */
TEST_IMPL(tree_next_page_off_endpoint_refused)
{
    fixture fx;
    fx_init(&fx, "link-away", 2);
    khub_hub *hub = fx_hub(&fx, 0, "hf_secret");
    khub_hub_id id = fx_id("org/demo@main");
    khub__tree t = {0};
    ASSERT_STATUS(khub__list_tree(hub, &id, C1, "", 1, &t), KHUB_STATUS_HTTP);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "the next-page link http://localhost:");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "; refusing it");
    khub__tree_free(&t);
    ASSERT_EQ(log_count(&fx, "GET /api/kernels/org/demo/tree/"), 1);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A 404 EntryNotFound for a commit leaves huggingface_hub's empty marker
 * .no_exist/<commit>/<path>; after it the same question costs no request,
 * online or offline. Only that commit's marker counts. */
TEST_IMPL(entry_not_found_leaves_no_exist_marker)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C1, "docs/nope.md", &p),
                  KHUB_STATUS_ENTRY_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "EntryNotFound");
    char marker[512];
    snprintf(marker, sizeof marker, "%s/kernels--org--demo/.no_exist/" C1 "/docs/nope.md",
             fx.cache);
    struct stat sb;
    ASSERT_EQ(lstat(marker, &sb), 0);
    ASSERT(S_ISREG(sb.st_mode) && sb.st_size == 0);
    uint64_t before = khub_hub_request_count(hub);
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C1, "docs/nope.md", &p),
                  KHUB_STATUS_ENTRY_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "docs/nope.md is not in that commit");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "no request made");
    ASSERT_EQ(khub_hub_request_count(hub), before);
    khub_hub_free(hub);
    hub = fx_hub(&fx, 1, NULL); /* offline: the marker, not "not cached" */
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C1, "docs/nope.md", &p),
                  KHUB_STATUS_ENTRY_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "is not in that commit");
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C2, "docs/nope.md", &p), KHUB_STATUS_OFFLINE);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "is not cached and HF_HUB_OFFLINE");
    khub_hub_free(hub);
    fx_done(&fx);
}

/* Downloads weights.bin with HF_HUB_DISABLE_SYMLINKS set: the snapshot
 * entry is a regular file; *snap and *blob get its stat and that of the
 * blob named by its SHA-256 in blob_dir. */
static void download_unlinked(khub_hub *hub, const char *blob_dir, struct stat *snap,
                              struct stat *blob)
{
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL, sha[65], bpath[700];
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "weights.bin", &p));
    ASSERT_EQ(lstat(p, snap), 0);
    ASSERT(S_ISREG(snap->st_mode));
    ASSERT_OK(khub__sha256_file_hex(p, sha));
    snprintf(bpath, sizeof bpath, "%s/%s", blob_dir, sha);
    ASSERT_EQ(stat(bpath, blob), 0);
    free(p);
}

/* HF_HUB_DISABLE_SYMLINKS=1: snapshot entries are regular files with the
 * blob's bytes (a hard link here: same inode), and a second download of
 * the same blob places it again without a request. */
TEST_IMPL(symlinks_disabled_places_regular_files)
{
    setenv("HF_HUB_DISABLE_SYMLINKS", "1", 1);
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    char blobs[512];
    snprintf(blobs, sizeof blobs, "%s/kernels--org--demo/blobs", fx.cache);
    struct stat snap, blob;
    download_unlinked(hub, blobs, &snap, &blob);
    ASSERT_EQ(snap.st_ino, blob.st_ino);
    uint64_t before = khub_hub_request_count(hub);
    download_unlinked(hub, blobs, &snap, &blob);
    ASSERT_EQ(khub_hub_request_count(hub), before);
    khub_hub_free(hub);
    fx_done(&fx);
    unsetenv("HF_HUB_DISABLE_SYMLINKS");
}

/* HF_HUB_DISABLE_SYMLINKS where a hard link cannot be made: blobs/ on
 * another file system (a link to a folder on /dev/shm), so link() fails
 * with EXDEV and the blob is copied: a regular file of its own inode with
 * the same bytes. */
TEST_IMPL(symlinks_disabled_copies_across_file_systems)
{
    struct stat shm, tmp;
    if (stat("/dev/shm", &shm) != 0 || access("/dev/shm", W_OK) != 0 || stat("/tmp", &tmp) != 0 ||
        shm.st_dev == tmp.st_dev)
        TEST_SKIP("no writable /dev/shm on another file system than /tmp");
    setenv("HF_HUB_DISABLE_SYMLINKS", "1", 1);
    fixture fx;
    fx_init(&fx, NULL, 0);
    char far[] = "/dev/shm/khub-blobs-XXXXXX", repo[512], blobs[600];
    ASSERT(mkdtemp(far) != NULL);
    snprintf(repo, sizeof repo, "%s/kernels--org--demo", fx.cache);
    ASSERT_OK(khub__mkdirs(NULL, repo));
    snprintf(blobs, sizeof blobs, "%s/blobs", repo);
    ASSERT_EQ(symlink(far, blobs), 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    struct stat snap, blob;
    download_unlinked(hub, far, &snap, &blob); /* the blob is on /dev/shm ... */
    ASSERT(snap.st_dev != blob.st_dev);        /* ... and the snapshot entry a copy */
    ASSERT_EQ(snap.st_size, blob.st_size);
    khub_hub_free(hub);
    fx_done(&fx);
    khub__rmtree(far);
    unsetenv("HF_HUB_DISABLE_SYMLINKS");
}

/* The requests of one handle share a keep-alive connection: resolving,
 * the listing and the files of a download cost one TCP connect. */
TEST_IMPL(requests_share_one_connection)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    char commit[41], *p = NULL;
    uint64_t before = khub__server_connections(fx.srv);
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "README.md", &p));
    free(p);
    ASSERT_OK(khub_hub_download_file(hub, &id, commit, "weights.bin", &p));
    free(p);
    ASSERT_LE(4, khub__server_requests(fx.srv));
    ASSERT_EQ(khub__server_connections(fx.srv) - before, 1);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* An implicit hub (opts.token NULL: HF_TOKEN and the token file apply). */
static khub_hub *implicit_hub(const fixture *fx)
{
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .endpoint = fx->endpoint,
                       .cache_dir = fx->cache, .offline = 0};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    return hub;
}

/* huggingface_hub's variables for the client: HF_HUB_USER_AGENT_ORIGIN
 * appends "; origin/<v>" to the User-Agent, HF_HUB_DISABLE_IMPLICIT_TOKEN
 * keeps HF_TOKEN (and the token file) from being sent unless the caller
 * passes a token, HF_HUB_DOWNLOAD_TIMEOUT sets the timeout and is refused
 * when it is not a number of seconds. */
TEST_IMPL(hf_client_variables)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    setenv("HF_TOKEN", "hf_from_env", 1);
    setenv("HF_HUB_USER_AGENT_ORIGIN", "khub-tests", 1);
    setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1", 1);
    khub_hub *hub = implicit_hub(&fx);
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "README.md", &p));
    free(p);
    khub_hub_free(hub);
    char *log = fx_log(&fx);
    ASSERT_CONTAINS(log, "/README.md auth=no");
    ASSERT_CONTAINS(log, "; origin/khub-tests");
    free(log);
    unsetenv("HF_HUB_DISABLE_IMPLICIT_TOKEN");
    hub = implicit_hub(&fx);
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "docs/page1.md", &p));
    free(p);
    khub_hub_free(hub);
    log = fx_log(&fx);
    ASSERT_CONTAINS(log, "/docs/page1.md auth=yes"); /* without it, HF_TOKEN goes out */
    free(log);

    setenv("HF_HUB_DOWNLOAD_TIMEOUT", "7", 1);
    hub = implicit_hub(&fx);
    ASSERT_EQ(hub->timeout_s, 7);
    khub_hub_free(hub);
    setenv("HF_HUB_DOWNLOAD_TIMEOUT", "ten", 1);
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .endpoint = fx.endpoint,
                       .cache_dir = fx.cache};
    ASSERT_STATUS(khub_hub_new(&o, &hub), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_last_error(),
                    "HF_HUB_DOWNLOAD_TIMEOUT=\"ten\" is not a whole number of seconds");
    o.timeout_s = 3; /* the caller's value wins: the variable is not read */
    ASSERT_OK(khub_hub_new(&o, &hub));
    ASSERT_EQ(hub->timeout_s, 3);
    khub_hub_free(hub);
    unsetenv("HF_HUB_DOWNLOAD_TIMEOUT");
    unsetenv("HF_HUB_USER_AGENT_ORIGIN");
    unsetenv("HF_TOKEN");
    fx_done(&fx);
}

/* A legacy kernel: org/legacy is served as a model repo only (refs.json
 * "type": "model"), so the kernel-type requests get RepoNotFound and the
 * handle falls back to the model type: /api/models/, bare /org/legacy/
 * file URLs and the models--org--legacy cache folder. A kernel repo never
 * asks the model endpoints; a repo that is neither is RepoNotFound naming
 * both. */
TEST_IMPL(legacy_model_repo_fallback)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    fx_writef(&fx, "org/legacy/refs.json",
              "{\"branches\":{\"main\":\"" C1 "\"},\"tags\":{},\"type\":\"model\"}");
    fx_writef(&fx, "org/legacy/commits/" C1 "/README.md", "# legacy kernel\n");
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/legacy@main");
    char commit[41], *p = NULL, path[600], text[64];
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, C1);
    ASSERT_EQ(log_count(&fx, "GET /api/kernels/org/legacy/revision/main "), 1);
    ASSERT_EQ(log_count(&fx, "GET /api/models/org/legacy/revision/main "), 1);
    snprintf(path, sizeof path, "%s/models--org--legacy/refs/main", fx.cache);
    read_text(path, text, sizeof text);
    ASSERT_STR_EQ(text, C1);
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "README.md", &p));
    ASSERT_CONTAINS(p, "/models--org--legacy/snapshots/" C1 "/README.md");
    free(p);
    ASSERT_EQ(log_count(&fx, "/kernels/org/legacy/resolve/"), 0); /* remembered: one probe */
    ASSERT_EQ(log_count(&fx, "HEAD /org/legacy/resolve/" C1 "/README.md "), 1);
    khub_hub_free(hub);

    /* a fresh handle: the cache folder says model repo, no request at all */
    hub = fx_hub(&fx, 0, NULL);
    khub_hub_id pinned = fx_id("org/legacy@" C1);
    ASSERT_OK(khub_hub_download_file(hub, &pinned, C1, "README.md", &p));
    free(p);
    ASSERT_EQ(khub_hub_request_count(hub), 0);
    khub_hub_free(hub);
    hub = fx_hub(&fx, 1, NULL); /* offline: refs from models--org--legacy */
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_STR_EQ(commit, C1);
    khub_hub_free(hub);

    /* commit-pinned, empty cache: the first request (a HEAD) falls back */
    khub__rmtree(fx.cache);
    hub = fx_hub(&fx, 0, NULL);
    ASSERT_OK(khub_hub_download_file(hub, &pinned, C1, "README.md", &p));
    ASSERT_CONTAINS(p, "/models--org--legacy/");
    free(p);
    ASSERT_EQ(log_count(&fx, "HEAD /kernels/org/legacy/resolve/" C1 "/README.md "), 1);

    /* a kernel repo stays one; neither type: both named */
    khub_hub_id demo = fx_id("org/demo@main");
    ASSERT_OK(khub_hub_resolve(hub, &demo, commit));
    ASSERT_EQ(log_count(&fx, "/api/models/org/demo/"), 0);
    khub_hub_id none = fx_id("org/none@main");
    ASSERT_STATUS(khub_hub_resolve(hub, &none, commit), KHUB_STATUS_REPO_NOT_FOUND);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "resolving org/none@main: RepoNotFound (HTTP 404)");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "not a model repo either (/api/models/org/none)");
    ASSERT_EQ(log_count(&fx, "GET /api/models/org/none/revision/main "), 1);
    khub_hub_free(hub);

    /* repo_type MODEL: straight to the model endpoints */
    khub__rmtree(fx.cache);
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts),
                       .endpoint = fx.endpoint,
                       .cache_dir = fx.cache,
                       .token = "",
                       .offline = 0,
                       .repo_type = KHUB_HUB_REPO_MODEL};
    ASSERT_OK(khub_hub_new(&o, &hub));
    int kernel_asks = log_count(&fx, "/api/kernels/org/legacy/");
    ASSERT_OK(khub_hub_resolve(hub, &id, commit));
    ASSERT_EQ(log_count(&fx, "/api/kernels/org/legacy/"), kernel_asks);
    ASSERT_STATUS(khub_hub_resolve(hub, &none, commit), KHUB_STATUS_REPO_NOT_FOUND);
    ASSERT(strstr(khub_hub_errmsg(hub), "model repo either") == NULL);
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A relative redirect (same host: a renamed repo on the Hub) keeps the
 * token, on the HEAD and on the GET; a cross-host one drops it
 * (token_sent_to_hub_only). */
TEST_IMPL(relative_redirect_keeps_token)
{
    fixture fx;
    fx_init(&fx, "moved", 0);
    khub_hub *hub = fx_hub(&fx, 0, "hf_secret");
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "README.md", &p));
    free(p);
    khub_hub_free(hub);
    ASSERT_EQ(log_count(&fx, "/kernels/org/demo/resolve/" C1 "/README.md auth=yes"), 4);
    ASSERT_EQ(log_count(&fx, "auth=no"), 0);
    fx_done(&fx);
}

static void write_token(const char *path, const char *text) { fx_write(path, text, strlen(text)); }

/* The token as implicit_hub finds it ("" for none). */
static void expect_token(const fixture *fx, const char *want)
{
    khub_hub *hub = implicit_hub(fx);
    ASSERT_STR_EQ(hub->token ? hub->token : "", want);
    khub_hub_free(hub);
}

/* huggingface_hub's token order: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, then
 * the file at HF_TOKEN_PATH, else $HF_HOME/token, else
 * $XDG_CACHE_HOME/huggingface/token, else ~/.cache/huggingface/token;
 * surrounding whitespace is stripped and an empty file is no token. */
TEST_IMPL(token_sources)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    char path[600], home[600], xdg[600], hfhome[600];
    snprintf(home, sizeof home, "%s/home", fx.root);
    snprintf(xdg, sizeof xdg, "%s/xdg", fx.root);
    snprintf(hfhome, sizeof hfhome, "%s/hfhome", fx.root);
    unsetenv("HF_TOKEN");
    unsetenv("HUGGING_FACE_HUB_TOKEN");
    unsetenv("HF_TOKEN_PATH");
    unsetenv("HF_HOME");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HF_HUB_DISABLE_IMPLICIT_TOKEN");
    setenv("HOME", home, 1);
    expect_token(&fx, "");
    snprintf(path, sizeof path, "%s/.cache/huggingface/token", home);
    write_token(path, "hf_home\n");
    expect_token(&fx, "hf_home");
    setenv("XDG_CACHE_HOME", xdg, 1);
    expect_token(&fx, ""); /* XDG_CACHE_HOME moves the default, no token there */
    snprintf(path, sizeof path, "%s/huggingface/token", xdg);
    write_token(path, "hf_xdg");
    expect_token(&fx, "hf_xdg");
    setenv("HF_HOME", hfhome, 1);
    snprintf(path, sizeof path, "%s/token", hfhome);
    write_token(path, "  hf_hfhome \r\n");
    expect_token(&fx, "hf_hfhome");
    snprintf(path, sizeof path, "%s/elsewhere", fx.root);
    write_token(path, "hf_path\n");
    setenv("HF_TOKEN_PATH", path, 1);
    expect_token(&fx, "hf_path");
    write_token(path, " \n");
    expect_token(&fx, ""); /* an empty file: no token, no fallback to HF_HOME */
    write_token(path, "hf_path\n");
    setenv("HUGGING_FACE_HUB_TOKEN", "hf_old_name", 1);
    expect_token(&fx, "hf_old_name");
    setenv("HF_TOKEN", "hf_env", 1);
    expect_token(&fx, "hf_env");
    /* the file's token is sent like HF_TOKEN's */
    unsetenv("HF_TOKEN");
    unsetenv("HUGGING_FACE_HUB_TOKEN");
    khub_hub *hub = implicit_hub(&fx);
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "README.md", &p));
    free(p);
    khub_hub_free(hub);
    ASSERT_EQ(log_count(&fx, "/README.md auth=yes"), 2);
    unsetenv("HF_TOKEN_PATH");
    unsetenv("HF_HOME");
    unsetenv("XDG_CACHE_HOME");
    fx_done(&fx);
}

/* An offline handle never sends a request (hub->offline is fixed at
 * khub_hub_new), so it looks for no token: neither HF_TOKEN nor the token
 * file is taken; a token the caller passes is kept as given, and an
 * online handle still finds both (token_sources). */
TEST_IMPL(offline_hub_reads_no_token)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    char home[600], path[700];
    snprintf(home, sizeof home, "%s/home", fx.root);
    snprintf(path, sizeof path, "%s/.cache/huggingface/token", home);
    unsetenv("HF_TOKEN_PATH");
    unsetenv("HF_HOME");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HF_HUB_DISABLE_IMPLICIT_TOKEN");
    setenv("HOME", home, 1);
    write_token(path, "hf_file\n");
    setenv("HF_TOKEN", "hf_env", 1);
    for (int from_env = 0; from_env < 2; from_env++) {
        if (!from_env) unsetenv("HF_TOKEN");
        khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .endpoint = fx.endpoint,
                           .cache_dir = fx.cache, .offline = 1};
        khub_hub *hub = NULL;
        ASSERT_OK(khub_hub_new(&o, &hub));
        ASSERT(hub->token == NULL);
        khub_hub_free(hub);
        o.offline = 0;
        ASSERT_OK(khub_hub_new(&o, &hub));
        ASSERT_STR_EQ(hub->token ? hub->token : "", from_env ? "hf_env" : "hf_file");
        khub_hub_free(hub);
        o.offline = 1;
        o.token = "hf_given";
        ASSERT_OK(khub_hub_new(&o, &hub));
        ASSERT_STR_EQ(hub->token ? hub->token : "", "hf_given");
        khub_hub_free(hub);
        setenv("HF_TOKEN", "hf_env", 1);
    }
    unsetenv("HF_TOKEN");
    fx_done(&fx);
}

/* The cache root as huggingface_hub picks it, KHUB_CACHE first:
 * KHUB_CACHE, HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, $HF_HOME/hub,
 * $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub. */
TEST_IMPL(cache_dir_order)
{
    static const char *vars[] = {"KHUB_CACHE", "HF_HUB_CACHE",   "HUGGINGFACE_HUB_CACHE",
                                 "HF_HOME",    "XDG_CACHE_HOME", "HOME"};
    static const char *want[] = {
        "/k", "/hc", "/hhc", "/hh/hub", "/x/huggingface/hub", "/h/.cache/huggingface/hub"};
    static const char *vals[] = {"/k", "/hc", "/hhc", "/hh", "/x", "/h"};
    for (size_t i = 0; i < 6; i++) setenv(vars[i], vals[i], 1);
    for (size_t i = 0; i < 6; i++) {
        khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .token = "", .offline = 1};
        khub_hub *hub = NULL;
        ASSERT_OK(khub_hub_new(&o, &hub));
        ASSERT_STR_EQ(khub_hub_cache_dir(hub), want[i]);
        khub_hub_free(hub);
        setenv(vars[i], "", 1); /* empty counts as unset, as in huggingface_hub */
    }
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .token = "", .offline = 1};
    khub_hub *hub = NULL;
    ASSERT_STATUS(khub_hub_new(&o, &hub), KHUB_STATUS_NOT_FOUND);
    ASSERT_CONTAINS(khub_last_error(), "no cache directory: set KHUB_CACHE, HF_HUB_CACHE or HOME");
    o.cache_dir = "/given"; /* the caller's directory beats them all */
    setenv("KHUB_CACHE", "/k", 1);
    ASSERT_OK(khub_hub_new(&o, &hub));
    ASSERT_STR_EQ(khub_hub_cache_dir(hub), "/given");
    khub_hub_free(hub);
}

static const char *cache_dir_now(void)
{
    static char got[1024];
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .token = "", .offline = 1};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    snprintf(got, sizeof got, "%s", khub_hub_cache_dir(hub));
    khub_hub_free(hub);
    return got;
}

/* "~" and "$VAR" in the cache and token variables are expanded as
 * huggingface_hub expands them (expanduser, then expandvars; an unset
 * variable stays as written), so both tools share one cache (issue 11). */
TEST_IMPL(cache_and_token_paths_expand)
{
    static const char *vars[] = {"KHUB_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME",
                                 "XDG_CACHE_HOME"};
    for (size_t i = 0; i < 5; i++) unsetenv(vars[i]);
    setenv("HOME", "/home/u", 1);
    setenv("KHUB_T_DIR", "/data", 1);
    unsetenv("KHUB_T_UNSET");
    setenv("HF_HOME", "~/hf", 1);
    ASSERT_STR_EQ(cache_dir_now(), "/home/u/hf/hub");
    setenv("HF_HOME", "$KHUB_T_DIR/hf", 1);
    ASSERT_STR_EQ(cache_dir_now(), "/data/hf/hub");
    setenv("HF_HUB_CACHE", "${KHUB_T_DIR}/c/$KHUB_T_UNSET/x", 1);
    ASSERT_STR_EQ(cache_dir_now(), "/data/c/$KHUB_T_UNSET/x");
    setenv("HF_HUB_CACHE", "~", 1);
    ASSERT_STR_EQ(cache_dir_now(), "/home/u");
    setenv("HF_HUB_CACHE", "~root/c", 1); /* ~user, from the password database */
    ASSERT_STR_EQ(cache_dir_now(), "/root/c");
    setenv("HF_HUB_CACHE", "~no-such-user-khub/c", 1);
    ASSERT_STR_EQ(cache_dir_now(), "~no-such-user-khub/c");
    setenv("HF_HUB_CACHE", "/a/~/b$", 1); /* '~' only leads; a lone '$' stays */
    ASSERT_STR_EQ(cache_dir_now(), "/a/~/b$");
    setenv("KHUB_CACHE", "~/k", 1);
    ASSERT_STR_EQ(cache_dir_now(), "/home/u/k");
    unsetenv("KHUB_CACHE");
    unsetenv("HF_HUB_CACHE");
    unsetenv("HF_HOME");
    setenv("XDG_CACHE_HOME", "$HOME/xdg", 1);
    ASSERT_STR_EQ(cache_dir_now(), "/home/u/xdg/huggingface/hub");
    unsetenv("XDG_CACHE_HOME");
    /* HF_TOKEN_PATH and HF_HOME's token file too */
    fixture fx;
    fx_init(&fx, NULL, 0);
    char path[600];
    snprintf(path, sizeof path, "%s/tok", fx.root);
    write_token(path, "hf_expanded\n");
    unsetenv("HF_TOKEN");
    unsetenv("HUGGING_FACE_HUB_TOKEN");
    unsetenv("HF_HUB_DISABLE_IMPLICIT_TOKEN");
    setenv("HOME", fx.root, 1);
    setenv("HF_TOKEN_PATH", "~/tok", 1);
    expect_token(&fx, "hf_expanded");
    setenv("KHUB_T_DIR", fx.root, 1);
    setenv("HF_TOKEN_PATH", "${KHUB_T_DIR}/tok", 1);
    expect_token(&fx, "hf_expanded");
    unsetenv("HF_TOKEN_PATH");
    snprintf(path, sizeof path, "%s/hh/token", fx.root);
    write_token(path, "hf_in_home\n");
    setenv("HF_HOME", "~/hh", 1);
    expect_token(&fx, "hf_in_home");
    unsetenv("HF_HOME");
    fx_done(&fx);
}

/* Offline as huggingface_hub decides it: HF_HUB_OFFLINE when it is set and
 * not empty (HF_HUB_OFFLINE=0 wins over TRANSFORMERS_OFFLINE=1), else
 * TRANSFORMERS_OFFLINE. */
TEST_IMPL(offline_precedence)
{
    static const struct {
        const char *hf, *tr; /* NULL = unset */
        int offline;
    } cases[] = {{NULL, NULL, 0}, {"1", NULL, 1},  {NULL, "1", 1},    {"0", "1", 0},
                 {"", "1", 1},    {"yes", "0", 1}, {"false", "1", 0}, {"1", "0", 1},
                 {"", "", 0},     {NULL, "ON", 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].hf)
            setenv("HF_HUB_OFFLINE", cases[i].hf, 1);
        else
            unsetenv("HF_HUB_OFFLINE");
        if (cases[i].tr)
            setenv("TRANSFORMERS_OFFLINE", cases[i].tr, 1);
        else
            unsetenv("TRANSFORMERS_OFFLINE");
        khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .token = "", .cache_dir = "/tmp",
                           .offline = -1};
        khub_hub *hub = NULL;
        ASSERT_OK(khub_hub_new(&o, &hub));
        if ((int)hub->offline != cases[i].offline)
            fprintf(stderr, "case %zu: HF_HUB_OFFLINE=%s TRANSFORMERS_OFFLINE=%s\n", i,
                    cases[i].hf ? cases[i].hf : "(unset)", cases[i].tr ? cases[i].tr : "(unset)");
        ASSERT_EQ((int)hub->offline, cases[i].offline);
        khub_hub_free(hub);
    }
    unsetenv("HF_HUB_OFFLINE");
    unsetenv("TRANSFORMERS_OFFLINE");
}

#define TEST_LIST(X) \
    X(resolve_forms) \
    X(resolve_errors) \
    X(download_regular_and_lfs) \
    X(offline_uses_cache_only) \
    X(fallback_to_refs_when_unreachable) \
    X(token_sent_to_hub_only) \
    X(tree_paging_and_hostile_entries) \
    X(tree_next_page_off_endpoint_refused) \
    X(entry_not_found_leaves_no_exist_marker) \
    X(symlinks_disabled_places_regular_files) \
    X(symlinks_disabled_copies_across_file_systems) \
    X(hf_client_variables) \
    X(requests_share_one_connection) \
    X(legacy_model_repo_fallback) \
    X(relative_redirect_keeps_token) \
    X(token_sources) \
    X(offline_hub_reads_no_token) \
    X(cache_dir_order) \
    X(cache_and_token_paths_expand) \
    X(offline_precedence)
TEST_MAIN(TEST_LIST)
