/* test_blob_sink.c: the download sink (hub/blob_sink.c) driven directly,
 * without HTTP: bodies in uneven pieces through the one-thread and the
 * three-thread paths, a restart from offset 0 while chunks are still in
 * flight, a resumed file, an overflow and a failing write. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub_impl.h"
#include "runner.h"

typedef struct body {
    unsigned char *bytes;
    size_t n;
    char sha256[65];
} body;

static body make_body(size_t n, uint32_t seed)
{
    body b = {malloc(n ? n : 1), n, ""};
    ASSERT(b.bytes != NULL);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        b.bytes[i] = (unsigned char)(seed >> 24);
    }
    ASSERT_OK(khub__sha256_hex(b.bytes, n, b.sha256));
    return b;
}

typedef struct rig {
    char dir[64], path[128];
    int fd;
    khub_hub *hub;
} rig;

static void rig_open(rig *r, int flags)
{
    snprintf(r->dir, sizeof r->dir, "/tmp/khub-sink-XXXXXX");
    ASSERT(mkdtemp(r->dir) != NULL);
    snprintf(r->path, sizeof r->path, "%s/blob.incomplete", r->dir);
    int fd = open(r->path, O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT(fd >= 0);
    close(fd);
    r->fd = open(r->path, flags | O_APPEND);
    ASSERT(r->fd >= 0);
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .cache_dir = r->dir, .offline = 1};
    ASSERT_OK(khub_hub_new(&o, &r->hub));
}

static void rig_close(rig *r)
{
    close(r->fd);
    khub_hub_free(r->hub);
    khub__rmtree(r->dir);
}

/* Feeds bytes [from, to) in pieces of 1..max bytes; false when the sink
 * refused one. */
static bool feed(const khub__sink *k, const body *b, size_t from, size_t to, size_t max)
{
    uint32_t x = 7;
    for (size_t at = from; at < to;) {
        x = x * 1103515245u + 12345u;
        size_t piece = 1 + (x >> 8) % max;
        if (piece > to - at) piece = to - at;
        if (k->write(k->ud, b->bytes + at, piece) != piece) return false;
        at += piece;
    }
    return true;
}

static void file_sha(const char *path, char hex[65])
{
    ASSERT_OK(khub__sha256_file_hex(path, hex));
}

/* Finishes s (not a git blob) and checks it: the running digest is
 * want_streamed ("" = none), and the file holds exactly the body. Frees s,
 * the rig and b. */
static void finish_and_check(khub__blob_sink *s, rig *r, body *b, const char *want_streamed)
{
    char streamed[65], sha256[65], got[65];
    ASSERT_OK(khub__blob_sink_finish(s, streamed, sha256));
    ASSERT_STR_EQ(streamed, want_streamed);
    ASSERT_STR_EQ(sha256, ""); /* only git blobs get a second digest */
    khub__blob_sink_free(s);
    file_sha(r->path, got);
    ASSERT_STR_EQ(got, b->sha256);
    rig_close(r);
    free(b->bytes);
}

/* The whole body in one response from offset 0: the running digest and the
 * file both match it. */
static void whole_body(size_t n, size_t max_piece)
{
    body b = make_body(n, (uint32_t)n);
    rig r;
    rig_open(&r, O_RDWR);
    khub__blob_sink *s = NULL;
    ASSERT_OK(khub__blob_sink_new(r.hub, r.fd, 0, n, "blob", 0, &s));
    const khub__sink *k = khub__blob_sink_sink(s);
    ASSERT_OK(k->start(k->ud, 200, -1));
    ASSERT(feed(k, &b, 0, n, max_piece));
    ASSERT_EQ(k->offset(k->ud), n);
    finish_and_check(s, &r, &b, b.sha256);
}

TEST_IMPL(small_body_one_thread) { whole_body(70000, 4096); }
TEST_IMPL(large_body_three_threads) { whole_body((20u << 20) + 777, 600000); }
TEST_IMPL(large_body_tiny_pieces) { whole_body((5u << 20) + 3, 3000); }

/* A 200 after 5 MiB (the server ignored Range): the queue is drained and
 * the file truncated before the body starts again, with no pause in which
 * the workers could catch up on their own. */
TEST_IMPL(restart_drains_in_flight_chunks)
{
    size_t n = (24u << 20) + 99;
    body b = make_body(n, 99);
    rig r;
    rig_open(&r, O_RDWR);
    khub__blob_sink *s = NULL;
    ASSERT_OK(khub__blob_sink_new(r.hub, r.fd, 0, n, "blob", 0, &s));
    const khub__sink *k = khub__blob_sink_sink(s);
    ASSERT_OK(k->start(k->ud, 200, -1));
    ASSERT(feed(k, &b, 0, (5u << 20) + 12345, 1 << 20));
    ASSERT_OK(k->start(k->ud, 200, -1));
    ASSERT_EQ(k->offset(k->ud), 0);
    ASSERT(feed(k, &b, 0, n, 1 << 20));
    finish_and_check(s, &r, &b, b.sha256);
}

/* A resumed orphan (3 MiB + 5 already in the file, written by an earlier
 * process): no running digest, the rest appended after a 206 from there. */
TEST_IMPL(resume_appends_without_digest)
{
    size_t n = (12u << 20) + 1, have = (3u << 20) + 5;
    body b = make_body(n, 5);
    rig r;
    rig_open(&r, O_RDWR);
    ASSERT_EQ(write(r.fd, b.bytes, have), (ssize_t)have);
    khub__blob_sink *s = NULL;
    ASSERT_OK(khub__blob_sink_new(r.hub, r.fd, have, n, "blob", 0, &s));
    const khub__sink *k = khub__blob_sink_sink(s);
    ASSERT_EQ(k->offset(k->ud), have);
    ASSERT_STATUS(k->start(k->ud, 206, 17), KHUB_STATUS_HTTP); /* the wrong range */
    ASSERT_CONTAINS(khub_hub_errmsg(r.hub), "asked for bytes from 3145733, got a range from 17");
    khub__blob_sink_free(s);
    ASSERT_OK(khub__blob_sink_new(r.hub, r.fd, have, n, "blob", 0, &s));
    k = khub__blob_sink_sink(s);
    ASSERT_OK(k->start(k->ud, 206, (int64_t)have));
    ASSERT(feed(k, &b, have, n, 500000));
    finish_and_check(s, &r, &b, ""); /* no running digest: the caller hashes the file */
}

/* Git blobs: the running SHA-1 over "blob <size>\0" + bytes, and SHA-256. */
TEST_IMPL(git_blob_both_digests)
{
    size_t n = (6u << 20) + 10;
    body b = make_body(n, 3);
    rig r;
    rig_open(&r, O_RDWR);
    khub__blob_sink *s = NULL;
    ASSERT_OK(khub__blob_sink_new(r.hub, r.fd, 0, n, "blob", 1, &s));
    const khub__sink *k = khub__blob_sink_sink(s);
    ASSERT(feed(k, &b, 0, n, 1 << 19));
    char streamed[65], sha256[65], want1[41];
    ASSERT_OK(khub__blob_sink_finish(s, streamed, sha256));
    khub__blob_sink_free(s);
    ASSERT_OK(khub__git_blob_sha1_file(r.path, want1));
    ASSERT_STR_EQ(streamed, want1);
    ASSERT_STR_EQ(sha256, b.sha256);
    rig_close(&r);
    free(b.bytes);
}

/* A body the sink must refuse: `sent` bytes of a file announced as `n`,
 * into a file opened with `flags`; the sink's status and message. */
static void refused(size_t n, size_t sent, int flags, const char *name, khub_status want,
                    const char *msg)
{
    body b = make_body(sent, 1);
    rig r;
    rig_open(&r, flags);
    khub__blob_sink *s = NULL;
    ASSERT_OK(khub__blob_sink_new(r.hub, r.fd, 0, n, name, 0, &s));
    const khub__sink *k = khub__blob_sink_sink(s);
    ASSERT(!feed(k, &b, 0, sent, 1 << 16));
    char streamed[65], sha256[65];
    ASSERT_STATUS(khub__blob_sink_finish(s, streamed, sha256), want);
    ASSERT_CONTAINS(khub_hub_errmsg(r.hub), msg);
    khub__blob_sink_free(s);
    rig_close(&r);
    free(b.bytes);
}

static void overflow_refused(size_t n)
{
    refused(n, n + 1, O_RDWR, "big.so", KHUB_STATUS_OVERFLOW,
            "big.so: the server sent more than the");
}

TEST_IMPL(overflow_refused_small) { overflow_refused(1000); }
TEST_IMPL(overflow_refused_large) { overflow_refused(9u << 20); }

/* The file is open read-only: every write fails. On the three-thread path
 * the writer's failure stops the transfer at the next piece and is the
 * sink's status. */
static void write_failure(size_t n)
{
    refused(n, n, O_RDONLY, "lib.so", KHUB_STATUS_IO, "lib.so: write failed: Bad file descriptor");
}

TEST_IMPL(write_failure_small) { write_failure(5000); }
TEST_IMPL(write_failure_large) { write_failure(30u << 20); }

#define TEST_LIST(X) \
    X(small_body_one_thread) \
    X(large_body_three_threads) \
    X(large_body_tiny_pieces) \
    X(restart_drains_in_flight_chunks) \
    X(resume_appends_without_digest) \
    X(git_blob_both_digests) \
    X(overflow_refused_small) \
    X(overflow_refused_large) \
    X(write_failure_small) \
    X(write_failure_large)
TEST_MAIN(TEST_LIST)
