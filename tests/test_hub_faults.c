/* test_hub_faults.c: every injected server fault ends in either a verified
 * blob or a specific error with nothing published; kill -9 mid-download and
 * 8 concurrent processes on one blob. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "hub_fixture.h"

static int blob_files(const fixture *fx, int incomplete)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/kernels--org--demo/blobs", fx->cache);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        n += (strstr(de->d_name, ".incomplete") != NULL) == incomplete;
    }
    if (d) closedir(d);
    return n;
}

/* Downloads `name` of org/demo@main; a stored copy must hash like the
 * served file. */
static khub_status get_file(const fixture *fx, const char *name, khub_hub **hub_out)
{
    khub_hub *hub = fx_hub(fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    khub_status st = khub_hub_download_file(hub, &id, C1, name, &p);
    if (st == KHUB_STATUS_OK) {
        char served[1024], want[65], got[65];
        snprintf(served, sizeof served, "%s/org/demo/commits/" C1 "/%s", fx->repos, name);
        ASSERT_OK(khub__sha256_file_hex(served, want));
        ASSERT_OK(khub__sha256_file_hex(p, got));
        ASSERT_STR_EQ(got, want);
    }
    free(p);
    if (hub_out)
        *hub_out = hub;
    else
        khub_hub_free(hub);
    return st;
}

static khub_status get_weights(const fixture *fx, khub_hub **hub_out)
{
    return get_file(fx, "weights.bin", hub_out);
}

/* big.bin: large enough for the three-thread download (hub/blob_sink.c:
 * 4 MiB and up, 8 chunks of 1 MiB in flight), with a tail that is not a
 * multiple of the O_DIRECT block. */
#define BIG_SIZE ((16u << 20) + 1234u)
static void fx_add_big(const fixture *fx)
{
    unsigned char *big = malloc(BIG_SIZE);
    ASSERT(big != NULL);
    uint32_t x = 12345;
    for (size_t i = 0; i < BIG_SIZE; i++) {
        x = x * 1103515245u + 12345u;
        big[i] = (unsigned char)(x >> 24);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/org/demo/commits/" C1 "/big.bin", fx->repos);
    fx_write(path, big, BIG_SIZE);
    free(big);
}

static void expect_fail_on(const char *name, const char *fault, khub_status want, const char *msg)
{
    fixture fx;
    fx_init(&fx, fault, 0);
    if (strcmp(name, "big.bin") == 0) fx_add_big(&fx);
    khub_hub *hub = NULL;
    ASSERT_STATUS(get_file(&fx, name, &hub), want);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), msg);
    ASSERT_EQ(blob_files(&fx, 0), 0);
    ASSERT_EQ(blob_files(&fx, 1), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

static void expect_ok_on(const char *name, const char *fault, const char *log_needle)
{
    fixture fx;
    fx_init(&fx, fault, 0);
    if (strcmp(name, "big.bin") == 0) fx_add_big(&fx);
    ASSERT_OK(get_file(&fx, name, NULL));
    ASSERT_EQ(blob_files(&fx, 0), 1);
    ASSERT_EQ(blob_files(&fx, 1), 0);
    char *log = fx_log(&fx);
    if (log_needle) ASSERT_CONTAINS(log, log_needle);
    free(log);
    fx_done(&fx);
}

static void expect_fail(const char *fault, khub_status want, const char *msg)
{
    expect_fail_on("weights.bin", fault, want, msg);
}

static void expect_ok(const char *fault, const char *log_needle)
{
    expect_ok_on("weights.bin", fault, log_needle);
}

TEST_IMPL(drop_mid_body_resumes_with_range) { expect_ok("drop-body=1", "range=bytes=35000-"); }
TEST_IMPL(ignore_range_restarts) { expect_ok("drop-body=1,ignore-range", "range=bytes="); }
TEST_IMPL(short_body_rejected)
{
    expect_fail("short-body", KHUB_STATUS_TRUNCATED, "of 70000 bytes");
}
TEST_IMPL(extra_bytes_rejected) { expect_fail("extra-bytes", KHUB_STATUS_OVERFLOW, "more than"); }
/* A regular (non-LFS) file is checked against its git blob SHA-1. */
TEST_IMPL(wrong_git_sha1_rejected)
{
    expect_fail_on("README.md", "wrong-hash", KHUB_STATUS_DIGEST_MISMATCH,
                   "README.md: content git blob SHA-1 is");
}
TEST_IMPL(wrong_hash_rejected)
{
    expect_fail("wrong-hash", KHUB_STATUS_DIGEST_MISMATCH, "but the hub announced");
}
TEST_IMPL(redirect_loop_stops) { expect_fail("redirect-loop", KHUB_STATUS_HTTP, "redirect loop"); }
TEST_IMPL(twice_503_then_ok) { expect_ok("503=2", NULL); }
TEST_IMPL(timeout_408_then_ok) { expect_ok("408=1", NULL); }
TEST_IMPL(gated_repo_refused) { expect_fail("gated", KHUB_STATUS_GATED_REPO, "GatedRepo"); }

/* A malicious server's tree listing names a path outside the repo: the
 * whole listing is refused, for the variant list and the download, and
 * nothing is written (no listing cache, no blob, no snapshot entry). */
static void expect_hostile_tree(const char *fault, const char *bad)
{
    fixture fx;
    fx_init(&fx, fault, 0);
    khub_hub *hub = fx_hub(&fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    khub_hub_variant_list *vl = NULL;
    ASSERT_STATUS(khub_hub_variants(hub, &id, C1, &vl), KHUB_STATUS_UNSAFE_PATH);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), bad);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "is not a safe relative path; refusing the listing");
    khub_hub_file_list *fl = NULL;
    ASSERT_STATUS(khub_hub_download_variant(hub, &id, C1, fx.variant, &fl),
                  KHUB_STATUS_UNSAFE_PATH);
    khub_hub_free(hub);
    char path[700];
    snprintf(path, sizeof path, "%s/kernels--org--demo/trees/" C1 ".json", fx.cache);
    ASSERT(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/kernels--org--demo/snapshots", fx.cache);
    ASSERT(access(path, F_OK) != 0);
    snprintf(path, sizeof path, "%s/escape.so", fx.root);
    ASSERT(access(path, F_OK) != 0);
    ASSERT_EQ(blob_files(&fx, 0) + blob_files(&fx, 1), 0);
    fx_done(&fx);
}

/* A HEAD whose X-Repo-Commit is not the commit asked for: not a Hub
 * answering for that commit, so nothing is fetched. */
TEST_IMPL(wrong_repo_commit_refused)
{
    expect_fail("wrong-commit", KHUB_STATUS_HTTP,
                "X-Repo-Commit is \"0000000000000000000000000000000000000000\", not the "
                "commit asked for");
}

TEST_IMPL(tree_dotdot_entry_refused)
{
    expect_hostile_tree("tree-dotdot", "build/../../escape.so");
}
TEST_IMPL(tree_absolute_entry_refused) { expect_hostile_tree("tree-absolute", "/tmp/escape.so"); }

/* Seconds a successful download of `name` takes under `fault`. */
static double seconds_ok(const char *name, const char *fault)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    expect_ok_on(name, fault, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
}

/* Retry-After: 1 beats the 50 ms backoff. */
TEST_IMPL(retry_after_429_honoured) { ASSERT_LE(1.0, seconds_ok("weights.bin", "429=1")); }

/* A 429 whose RateLimit header says the window is used up (r=0;t=0) and
 * no Retry-After: the client waits t + 1 s, not its 50 ms backoff. */
TEST_IMPL(ratelimit_window_honoured) { ASSERT_LE(1.0, seconds_ok("weights.bin", "ratelimit=1")); }

/* The header's forms: only an exhausted window (r=0) asks for a wait. */
TEST_IMPL(ratelimit_header_parsed)
{
    ASSERT_EQ(khub__http_ratelimit_wait("\"api\";r=0;t=55"), 56);
    ASSERT_EQ(khub__http_ratelimit_wait("\"resolvers\"; r=0; t=0"), 1);
    ASSERT_EQ(khub__http_ratelimit_wait("\"api\";r=12;t=55"), -1);
    ASSERT_EQ(khub__http_ratelimit_wait("\"api\";t=55"), -1);
    ASSERT_EQ(khub__http_ratelimit_wait("\"api\";r=0"), -1);
    ASSERT_EQ(khub__http_ratelimit_wait("\"api\";r=0;t=x"), -1);
    ASSERT_EQ(khub__http_ratelimit_wait("\"api\";r=0;t=999999999"), 86400);
    ASSERT_EQ(khub__http_ratelimit_wait(""), -1);
}

/* Values that end in ';' or "; ": the key and '=' are looked at before any
 * number, so nothing after the NUL is read (the values are exact-size heap
 * copies, so ASan sees a read past one; found by fuzz_requests' reading). */
TEST_IMPL(ratelimit_header_ends_early)
{
    const char *vals[] = {";", "\"api\";", "\"api\"; ", "\"api\";r", "\"api\";r=", ";t"};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        char *v = strdup(vals[i]);
        ASSERT(v != NULL);
        ASSERT_EQ(khub__http_ratelimit_wait(v), -1);
        free(v);
    }
}

/* Header lines as curl hands them over (no NUL after them): the status line
 * is read within its length, and the fields keep their meaning. */
TEST_IMPL(http_header_lines_parsed)
{
    khub__http_resp r;
    memset(&r, 0, sizeof r);
    const char *lines[] = {"HTTP/1.1 404",
                           "HTTP/2  206 Partial\r\n",
                           "X-Linked-Size: 77\r\n",
                           "ETag: W/\"abc\"\r\n",
                           "Content-Range: bytes 10-20/30\r\n",
                           "RateLimit: \"api\";r=0;t=4;\r\n",
                           "no colon here"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        size_t n = strlen(lines[i]);
        char *line = malloc(n); /* exact size: no terminator */
        ASSERT(line != NULL);
        memcpy(line, lines[i], n);
        khub__http_header(&r, line, n);
        free(line);
        if (i == 0) ASSERT_EQ(r.status, 404);
    }
    ASSERT_EQ(r.status, 206);
    ASSERT_EQ(r.linked_size, 77);
    ASSERT_STR_EQ(r.etag, "abc");
    ASSERT_EQ(r.range_start, 10);
    ASSERT_EQ(r.ratelimit_wait, 5);
}

/* The same faults on the three-thread path: the resume offset counts the
 * bytes still queued (the drop is at half the file, inside a chunk), a
 * restart drains the queue before truncating, and the digests come from
 * the hasher thread. */
TEST_IMPL(big_download_verified) { expect_ok_on("big.bin", NULL, NULL); }
TEST_IMPL(big_drop_mid_body_resumes_with_range)
{
    char needle[64];
    snprintf(needle, sizeof needle, "range=bytes=%u-", BIG_SIZE / 2);
    expect_ok_on("big.bin", "drop-body=1", needle);
}
TEST_IMPL(big_ignore_range_restarts) { expect_ok_on("big.bin", "drop-body=1,ignore-range", NULL); }
TEST_IMPL(big_short_body_rejected)
{
    expect_fail_on("big.bin", "short-body", KHUB_STATUS_TRUNCATED, "of 16778450 bytes");
}
TEST_IMPL(big_extra_bytes_rejected)
{
    expect_fail_on("big.bin", "extra-bytes", KHUB_STATUS_OVERFLOW, "more than");
}
TEST_IMPL(big_wrong_hash_rejected)
{
    expect_fail_on("big.bin", "wrong-hash", KHUB_STATUS_DIGEST_MISMATCH, "but the hub announced");
}

/* rate=64: bodies paced to 64 MiB/s (the benchmark's stand-in for a real
 * link), still verified; a rate needs a number. */
TEST_IMPL(rate_paces_bodies)
{
    /* 16 MiB at 64 MiB/s: a quarter second at least */
    ASSERT_LE(16.0 / 64 * 0.95, seconds_ok("big.bin", "rate=64"));
    khub__server *srv = NULL;
    khub__server_opts so = {.dir = "/tmp", .faults = "rate"};
    ASSERT_STATUS(khub__server_start(&so, &srv), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__server_errmsg(), "fault rate needs a speed in MiB/s");
}

/* A cache on tmpfs (no O_DIRECT on older kernels): the writer falls back to
 * the page cache. */
TEST_IMPL(big_download_on_tmpfs)
{
    struct stat sb;
    if (stat("/dev/shm", &sb) != 0 || !S_ISDIR(sb.st_mode) || access("/dev/shm", W_OK) != 0)
        TEST_SKIP("no writable /dev/shm");
    fixture fx;
    fx_init(&fx, NULL, 0);
    fx_add_big(&fx);
    char shm[] = "/dev/shm/khub-cache-XXXXXX";
    ASSERT(mkdtemp(shm) != NULL);
    snprintf(fx.cache, sizeof fx.cache, "%s", shm);
    ASSERT_OK(get_file(&fx, "big.bin", NULL));
    ASSERT_EQ(blob_files(&fx, 0), 1);
    khub__rmtree(shm);
    fx_done(&fx);
}

/* Kills the process once more than *(uint64_t *)ud bytes arrived. */
static void die_mid_download(void *ud, const char *path, uint64_t done, uint64_t total)
{
    (void)path;
    if (done > *(const uint64_t *)ud && done < total) raise(SIGKILL);
}

static void kill9_then_rerun(const char *name, uint64_t kill_after, uint64_t min_orphan)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    if (strcmp(name, "big.bin") == 0) fx_add_big(&fx);
    pid_t pid = fork();
    if (pid == 0) {
        khub_hub *hub = fx_hub(&fx, 0, NULL);
        khub_hub_set_progress(hub, die_mid_download, &kill_after);
        khub_hub_id id = fx_id("org/demo@main");
        char *p = NULL;
        khub_hub_download_file(hub, &id, C1, name, &p);
        _exit(3); /* not reached: the progress callback kills us */
    }
    int ws = 0;
    ASSERT_EQ(waitpid(pid, &ws, 0), pid);
    ASSERT(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    ASSERT_EQ(blob_files(&fx, 0), 0); /* nothing visible */
    char snap[512];
    snprintf(snap, sizeof snap, "%s/kernels--org--demo/snapshots/" C1 "/%s", fx.cache, name);
    ASSERT(access(snap, F_OK) != 0);
    ASSERT_EQ(blob_files(&fx, 1), 1); /* the orphan: a prefix of the file */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/kernels--org--demo/blobs", fx.cache);
    DIR *d = opendir(dir);
    ASSERT(d != NULL);
    struct dirent *de;
    off_t orphan = -1;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".incomplete")) {
            char path[1024];
            struct stat sb;
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            ASSERT_EQ(stat(path, &sb), 0);
            orphan = sb.st_size;
        }
    closedir(d);
    ASSERT_LE((off_t)min_orphan, orphan);
    ASSERT_OK(get_file(&fx, name, NULL));
    ASSERT_EQ(blob_files(&fx, 0), 1);
    ASSERT_EQ(blob_files(&fx, 1), 0); /* adopted and resumed */
    char *log = fx_log(&fx);
    char needle[64];
    snprintf(needle, sizeof needle, "range=bytes=%lld-", (long long)orphan);
    ASSERT_CONTAINS(log, needle);
    free(log);
    fx_done(&fx);
}

TEST_IMPL(kill9_mid_download_then_rerun) { kill9_then_rerun("weights.bin", 0, 1); }

/* With 8 MiB in flight, at least 4 of the first 12 MiB are in the file. */
TEST_IMPL(kill9_mid_big_download_then_rerun) { kill9_then_rerun("big.bin", 12u << 20, 4u << 20); }

TEST_IMPL(eight_processes_one_blob)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    /* Every child is forked while the server thread is idle and then waits
     * on the gate: forking while that thread holds an allocator lock would
     * leave the lock held forever in the child (GCC 12's ASan allocator has
     * no fork handlers). Opening the gate also starts all eight at once. */
    int gate[2];
    ASSERT_EQ(pipe(gate), 0);
    pid_t kids[8];
    for (int i = 0; i < 8; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            close(gate[1]);
            char c;
            while (read(gate[0], &c, 1) < 0) {
            }
            _exit(get_weights(&fx, NULL) == KHUB_STATUS_OK ? 0 : 1);
        }
    }
    close(gate[0]);
    close(gate[1]); /* EOF for every child: go */
    for (int i = 0; i < 8; i++) {
        int ws = 0;
        ASSERT_EQ(waitpid(kids[i], &ws, 0), kids[i]);
        ASSERT(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    ASSERT_EQ(blob_files(&fx, 0), 1);
    ASSERT_EQ(blob_files(&fx, 1), 0);
    char *log = fx_log(&fx);
    int gets = 0;
    for (const char *q = log; (q = strstr(q, "GET /kernels/org/demo/resolve/")); q++) gets++;
    ASSERT_EQ(gets, 1); /* the lock made the others wait and reuse the blob */
    free(log);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(drop_mid_body_resumes_with_range) \
    X(ignore_range_restarts) \
    X(short_body_rejected) \
    X(extra_bytes_rejected) \
    X(wrong_git_sha1_rejected) \
    X(wrong_repo_commit_refused) \
    X(tree_dotdot_entry_refused) \
    X(tree_absolute_entry_refused) \
    X(wrong_hash_rejected) \
    X(redirect_loop_stops) \
    X(twice_503_then_ok) \
    X(timeout_408_then_ok) \
    X(gated_repo_refused) \
    X(retry_after_429_honoured) \
    X(ratelimit_window_honoured) \
    X(ratelimit_header_parsed) \
    X(ratelimit_header_ends_early) \
    X(http_header_lines_parsed) \
    X(big_download_verified) \
    X(big_drop_mid_body_resumes_with_range) \
    X(big_ignore_range_restarts) \
    X(big_short_body_rejected) \
    X(big_extra_bytes_rejected) \
    X(big_wrong_hash_rejected) \
    X(big_download_on_tmpfs) \
    X(rate_paces_bodies) \
    X(kill9_mid_download_then_rerun) \
    X(kill9_mid_big_download_then_rerun) \
    X(eight_processes_one_blob)
TEST_MAIN(TEST_LIST)
