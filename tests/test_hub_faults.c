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

static khub_status get_weights(const fixture *fx, khub_hub **hub_out)
{
    khub_hub *hub = fx_hub(fx, 0, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    khub_status st = khub_hub_download_file(hub, &id, C1, "weights.bin", &p);
    if (st == KHUB_STATUS_OK) {
        char sha[65];
        ASSERT_OK(khub__sha256_file_hex(p, sha));
        ASSERT_EQ(strlen(sha), 64);
    }
    free(p);
    if (hub_out)
        *hub_out = hub;
    else
        khub_hub_free(hub);
    return st;
}

static void expect_fail(const char *fault, khub_status want, const char *msg)
{
    fixture fx;
    fx_init(&fx, fault, 0);
    khub_hub *hub = NULL;
    ASSERT_STATUS(get_weights(&fx, &hub), want);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), msg);
    ASSERT_EQ(blob_files(&fx, 0), 0);
    ASSERT_EQ(blob_files(&fx, 1), 0);
    khub_hub_free(hub);
    fx_done(&fx);
}

static void expect_ok(const char *fault, const char *log_needle)
{
    fixture fx;
    fx_init(&fx, fault, 0);
    ASSERT_OK(get_weights(&fx, NULL));
    ASSERT_EQ(blob_files(&fx, 0), 1);
    ASSERT_EQ(blob_files(&fx, 1), 0);
    char *log = fx_log(&fx);
    if (log_needle) ASSERT_CONTAINS(log, log_needle);
    free(log);
    fx_done(&fx);
}

TEST_IMPL(drop_mid_body_resumes_with_range) { expect_ok("drop-body=1", "range=bytes=35000-"); }
TEST_IMPL(ignore_range_restarts) { expect_ok("drop-body=1,ignore-range", "range=bytes="); }
TEST_IMPL(short_body_rejected)
{
    expect_fail("short-body", KHUB_STATUS_TRUNCATED, "of 70000 bytes");
}
TEST_IMPL(extra_bytes_rejected) { expect_fail("extra-bytes", KHUB_STATUS_OVERFLOW, "more than"); }
TEST_IMPL(wrong_hash_rejected)
{
    expect_fail("wrong-hash", KHUB_STATUS_DIGEST_MISMATCH, "but the hub announced");
}
TEST_IMPL(redirect_loop_stops) { expect_fail("redirect-loop", KHUB_STATUS_HTTP, "redirect loop"); }
TEST_IMPL(twice_503_then_ok) { expect_ok("503=2", NULL); }

TEST_IMPL(retry_after_429_honoured)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    expect_ok("429=1", NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    ASSERT_LE(1.0, s); /* Retry-After: 1 beats the 50 ms backoff */
}

static void die_mid_download(void *ud, const char *path, uint64_t done, uint64_t total)
{
    (void)ud;
    (void)path;
    if (done > 0 && done < total) raise(SIGKILL);
}

TEST_IMPL(kill9_mid_download_then_rerun)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    pid_t pid = fork();
    if (pid == 0) {
        khub_hub *hub = fx_hub(&fx, 0, NULL);
        khub_hub_set_progress(hub, die_mid_download, NULL);
        khub_hub_id id = fx_id("org/demo@main");
        char *p = NULL;
        khub_hub_download_file(hub, &id, C1, "weights.bin", &p);
        _exit(3); /* not reached: the progress callback kills us */
    }
    int ws = 0;
    ASSERT_EQ(waitpid(pid, &ws, 0), pid);
    ASSERT(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    ASSERT_EQ(blob_files(&fx, 0), 0); /* nothing visible */
    char snap[512];
    snprintf(snap, sizeof snap, "%s/kernels--org--demo/snapshots/" C1 "/weights.bin", fx.cache);
    ASSERT(access(snap, F_OK) != 0);
    ASSERT_EQ(blob_files(&fx, 1), 1); /* the orphan */
    ASSERT_OK(get_weights(&fx, NULL));
    ASSERT_EQ(blob_files(&fx, 0), 1);
    ASSERT_EQ(blob_files(&fx, 1), 0); /* adopted and resumed */
    char *log = fx_log(&fx);
    ASSERT_CONTAINS(log, "range=bytes=");
    free(log);
    fx_done(&fx);
}

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
    X(wrong_hash_rejected) \
    X(redirect_loop_stops) \
    X(twice_503_then_ok) \
    X(retry_after_429_honoured) \
    X(kill9_mid_download_then_rerun) \
    X(eight_processes_one_blob)
TEST_MAIN(TEST_LIST)
