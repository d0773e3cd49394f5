/* test_hub_limits.c: resource limits of `khub serve` and of the hub client
 * (issue 10, item 6). Server: a write without the token is answered at its
 * headers, bodies over their limit are refused before they are read or cut
 * while they arrive, idle and numerous connections do not lock a real
 * client out. Client: a next-page Link to another origin is refused, a
 * trickled download ends, an announced size over the limit is refused
 * before the GET. All on loopback, each case a few seconds at most. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include "hub_fixture.h"

/* ======================================================================== */
/* Helpers                                                                  */
/* ======================================================================== */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Restarts the fixture's server with o (dir and log filled in). */
static void fx_restart(fixture *fx, khub__server_opts o)
{
    khub__server_stop(fx->srv);
    o.dir = fx->repos;
    o.log = fx_log_line;
    o.log_ud = fx->log_file;
    if (!o.faults) o.faults = "";
    ASSERT_OK(khub__server_start(&o, &fx->srv));
    snprintf(fx->endpoint, sizeof fx->endpoint, "http://127.0.0.1:%u", khub__server_port(fx->srv));
}

/* A TCP connection to the server from the loopback address src (the whole
 * of 127/8 is local on Linux, so a second client address needs no set-up),
 * with receive and send timeouts of timeout_s. */
static int connect_from(const fixture *fx, const char *src, double timeout_s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    ASSERT_EQ(inet_pton(AF_INET, src, &a.sin_addr), 1);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons(khub__server_port(fx->srv))};
    inet_pton(AF_INET, "127.0.0.1", &s.sin_addr);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&s, sizeof s), 0);
    return fd;
}

static void send_text(int fd, const char *text)
{
    size_t n = strlen(text);
    ASSERT_EQ(send(fd, text, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads until the end of the headers, EOF, an error or the socket's
 * timeout; the HTTP status (0 when none came) and the text in buf. */
static int read_status(int fd, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    while (n + 1 < size && !strstr(buf, "\r\n\r\n")) {
        ssize_t r = recv(fd, buf + n, size - 1 - n, 0);
        if (r <= 0) break;
        n += (size_t)r;
        buf[n] = '\0';
    }
    int code = 0;
    if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1) code = 0;
    return code;
}

/* Sends up to n bytes of 'x' (stops at the first error: the server may
 * close a refused upload); the bytes sent. */
static size_t send_junk(int fd, size_t n)
{
    static char junk[64 << 10];
    memset(junk, 'x', sizeof junk);
    size_t sent = 0;
    while (sent < n) {
        size_t k = n - sent < sizeof junk ? n - sent : sizeof junk;
        ssize_t w = send(fd, junk, k, MSG_NOSIGNAL);
        if (w <= 0) break;
        sent += (size_t)w;
    }
    return sent;
}

/* This process's resident set in KiB (the in-process server's included). */
static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    ASSERT(f != NULL);
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

static int log_count(const fixture *fx, const char *needle)
{
    char *log = fx_log(fx);
    int n = 0;
    for (const char *q = log; (q = strstr(q, needle)); q++) n++;
    free(log);
    return n;
}

/* ======================================================================== */
/* Server: bodies                                                           */
/* ======================================================================== */

#define N_UPLOADS 16

/* 16 uploads without the token, each announcing 1 GiB: every one is
 * answered 401 after its headers alone (the old server waited for the body
 * and buffered up to 64 MiB of each before the 401), and the 4 MiB each
 * then pushes does not grow the server's memory. */
TEST_IMPL(unauthenticated_uploads_refused_at_headers)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    fx_restart(&fx, (khub__server_opts){.token = "s3cret"});
    char req[512], buf[4096];
    snprintf(req, sizeof req,
             "POST /api/kernels/org/demo/commit/main HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Content-Type: application/x-ndjson\r\nContent-Length: %llu\r\n\r\n",
             1ull << 30);
    int fd[N_UPLOADS];
    for (int i = 0; i < N_UPLOADS; i++) {
        fd[i] = connect_from(&fx, "127.0.0.1", 3.0);
        send_text(fd[i], req);
    }
    long before = rss_kib();
    for (int i = 0; i < N_UPLOADS; i++) {
        ASSERT_EQ(read_status(fd[i], buf, sizeof buf), 401);
        ASSERT_CONTAINS(buf, "writes need the server's token");
    }
    for (int i = 0; i < N_UPLOADS; i++) send_junk(fd[i], 4u << 20);
    usleep(200 * 1000);
    long grown = rss_kib() - before;
    for (int i = 0; i < N_UPLOADS; i++) close(fd[i]);
    ASSERT_LE(grown, 16 * 1024); /* KiB; whole bodies would be 64 MiB */
    /* A small body is read and dropped first, so the 401 is never lost to
     * a reset; a chunked one is answered at the headers. */
    int f = connect_from(&fx, "127.0.0.1", 3.0);
    send_text(f, "POST /api/repos/create HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n"
                 "{\"a\":\"b\"}");
    ASSERT_EQ(read_status(f, buf, sizeof buf), 401);
    close(f);
    f = connect_from(&fx, "127.0.0.1", 3.0);
    send_text(f,
              "POST /api/repos/create HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    ASSERT_EQ(read_status(f, buf, sizeof buf), 401);
    close(f);
    fx_done(&fx);
}

/* With the token, a Content-Length over --max-body is answered 413 at the
 * headers; a chunked body that passes the limit is cut (the connection
 * closes) instead of being buffered; paths-info, open to anyone, takes 1 MiB. */
TEST_IMPL(bodies_over_their_limit_refused)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    fx_restart(&fx, (khub__server_opts){.token = "s3cret", .max_body = 1u << 20});
    char buf[4096];
    int fd = connect_from(&fx, "127.0.0.1", 3.0);
    send_text(fd, "POST /api/kernels/org/demo/commit/main HTTP/1.1\r\nHost: x\r\n"
                  "Authorization: Bearer s3cret\r\nContent-Length: 2097152\r\n\r\n");
    ASSERT_EQ(read_status(fd, buf, sizeof buf), 413);
    ASSERT_CONTAINS(buf, "over this request's limit of 1048576");
    close(fd);

    fd = connect_from(&fx, "127.0.0.1", 3.0);
    send_text(fd, "POST /api/kernels/org/demo/commit/main HTTP/1.1\r\nHost: x\r\n"
                  "Authorization: Bearer s3cret\r\nTransfer-Encoding: chunked\r\n\r\n");
    size_t sent = 0;
    char chunk[64 << 10], head[32];
    memset(chunk, 'x', sizeof chunk);
    snprintf(head, sizeof head, "%zx\r\n", sizeof chunk);
    for (int i = 0; i < 1024; i++) { /* 64 MiB in all */
        if (send(fd, head, strlen(head), MSG_NOSIGNAL) <= 0 ||
            send(fd, chunk, sizeof chunk, MSG_NOSIGNAL) <= 0 ||
            send(fd, "\r\n", 2, MSG_NOSIGNAL) <= 0)
            break;
        sent += sizeof chunk;
    }
    ASSERT(sent < (32u << 20)); /* cut on the way (socket buffers hold a few MiB) */
    ASSERT_EQ(read_status(fd, buf, sizeof buf), 0);
    close(fd);
    ASSERT_EQ(log_count(&fx, "POST /api/kernels/org/demo/commit/main"), 1); /* the 413 */

    fd = connect_from(&fx, "127.0.0.1", 3.0);
    send_text(fd, "POST /api/kernels/org/demo/paths-info/main HTTP/1.1\r\nHost: x\r\n"
                  "Content-Type: application/x-www-form-urlencoded\r\n"
                  "Content-Length: 1048577\r\n\r\n");
    ASSERT_EQ(read_status(fd, buf, sizeof buf), 413);
    close(fd);
    fx_done(&fx);
}

/* An LFS upload URL whose capability is wrong is answered 403 before its
 * body; one whose Content-Length differs from the size it declares, 413. */
TEST_IMPL(lfs_put_refused_at_headers)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    char buf[4096];
    int fd = connect_from(&fx, "127.0.0.1", 3.0);
    send_text(fd, "PUT /lfs-upload/org/demo/"
                  "0000000000000000000000000000000000000000000000000000000000000000/10/"
                  "1111111111111111111111111111111111111111111111111111111111111111 HTTP/1.1\r\n"
                  "Host: x\r\nContent-Length: 1073741824\r\n\r\n");
    ASSERT_EQ(read_status(fd, buf, sizeof buf), 403);
    close(fd);
    fx_done(&fx);
}

/* ======================================================================== */
/* Server: connections                                                      */
/* ======================================================================== */

#define N_IDLE 1100

/* 1100 idle connections from one address (127.0.0.2) take at most the
 * per-address limit; a client from another address is answered at once.
 * The old server gave each one a thread until about a thousand, then
 * stopped accepting: every client was locked out for 30 s at a time. */
TEST_IMPL(idle_connections_do_not_lock_out)
{
    struct rlimit rl;
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max < 2 * N_IDLE + 100) TEST_SKIP("needs 2300 file descriptors");
    rl.rlim_cur = rl.rlim_max;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    fixture fx;
    fx_init(&fx, NULL, 0);
    static int fd[N_IDLE];
    for (int i = 0; i < N_IDLE; i++) fd[i] = connect_from(&fx, "127.0.0.2", 3.0);
    double t0 = now_s();
    int c = connect_from(&fx, "127.0.0.1", 3.0);
    char buf[4096];
    send_text(c, "GET /api/kernels/org/demo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ASSERT_EQ(read_status(c, buf, sizeof buf), 200);
    ASSERT_LE(now_s() - t0, 2.0);
    close(c);
    for (int i = 0; i < N_IDLE; i++) close(fd[i]);
    fx_done(&fx);
}

/* Past --max-per-ip, a connection is closed at once; an idle one is closed
 * after --idle-timeout (a slowloris's half-sent headers too). */
TEST_IMPL(per_ip_limit_and_idle_timeout)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    fx_restart(&fx, (khub__server_opts){.max_per_ip = 4, .idle_timeout_s = 1});
    int fd[5];
    for (int i = 0; i < 5; i++) fd[i] = connect_from(&fx, "127.0.0.2", 4.0);
    char buf[4096];
    double t0 = now_s();
    ASSERT_EQ(recv(fd[4], buf, sizeof buf, 0), 0); /* the fifth: closed */
    ASSERT_LE(now_s() - t0, 0.5);
    send_text(fd[0], "GET /api/kernels/org/demo HTTP/1.1\r\nHo"); /* and no more */
    for (int i = 0; i < 4; i++) {
        ssize_t r = recv(fd[i], buf, sizeof buf, 0);
        ASSERT(r == 0 || (r < 0 && errno == ECONNRESET));
    }
    double waited = now_s() - t0;
    ASSERT_LE(0.8, waited);
    ASSERT_LE(waited, 3.0);
    for (int i = 0; i < 5; i++) close(fd[i]);
    fx_done(&fx);
}

/* ======================================================================== */
/* Client                                                                   */
/* ======================================================================== */

/* A next-page Link that starts with the endpoint's text but names another
 * host ("http://127.0.0.1:PORT@localhost:PORT/...": user info, then the
 * host) is refused: origins are compared as for redirects. The old prefix
 * check followed it and sent the token there. */
TEST_IMPL(next_page_link_to_another_origin_refused)
{
    fixture fx;
    fx_init(&fx, "link-userinfo", 2);
    khub_hub *hub = fx_hub(&fx, 0, "hf_secret");
    khub_hub_id id = fx_id("org/demo@main");
    khub__tree t = {0};
    ASSERT_STATUS(khub__list_tree(hub, &id, C1, "", 1, &t), KHUB_STATUS_HTTP);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "@localhost:");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "; refusing it");
    khub__tree_free(&t);
    ASSERT_EQ(log_count(&fx, "GET /api/kernels/org/demo/tree/"), 1);
    khub_hub_free(hub);
    fx_done(&fx);
}

static khub_hub *hub_with(const fixture *fx, int timeout_s, int max_tries)
{
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts),
                       .endpoint = fx->endpoint,
                       .cache_dir = fx->cache,
                       .token = "",
                       .offline = 0,
                       .backoff_ms = 50,
                       .max_tries = max_tries,
                       .timeout_s = timeout_s};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    return hub;
}

/* A body trickled at 2 bytes/s (above the old 1 byte/s floor) is cut by
 * the minimum rate within HF_HUB_DOWNLOAD_TIMEOUT, and the tries it takes
 * count: the download fails in seconds instead of taking 10 hours. An
 * alarm turns the old hang into a failure. */
TEST_IMPL(trickled_download_ends)
{
    fixture fx;
    fx_init(&fx, "trickle=2", 0);
    khub_hub *hub = hub_with(&fx, 1, 2);
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    alarm(30);
    double t0 = now_s();
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C1, "weights.bin", &p), KHUB_STATUS_NETWORK);
    double took = now_s() - t0;
    alarm(0);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "downloading org/demo/weights.bin");
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "too slow");
    ASSERT_LE(took, 8.0);
    ASSERT_EQ(log_count(&fx, "GET /kernels/org/demo/resolve/"), 2); /* max_tries */
    khub_hub_free(hub);
    fx_done(&fx);
}

/* An announced size over KHUB_MAX_DOWNLOAD_SIZE is refused after the HEAD,
 * before any GET; one over the cache's free space likewise. */
TEST_IMPL(oversize_announced_size_refused_before_get)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    setenv("KHUB_MAX_DOWNLOAD_SIZE", "64K", 1);
    khub_hub *hub = hub_with(&fx, 0, 2);
    unsetenv("KHUB_MAX_DOWNLOAD_SIZE");
    khub_hub_id id = fx_id("org/demo@main");
    char *p = NULL;
    ASSERT_STATUS(khub_hub_download_file(hub, &id, C1, "weights.bin", &p), KHUB_STATUS_OVERFLOW);
    ASSERT_CONTAINS(khub_hub_errmsg(hub),
                    "the hub announces 70000 bytes, over the 65536-byte limit; nothing was "
                    "requested");
    ASSERT_EQ(log_count(&fx, "HEAD /kernels/org/demo/resolve/"), 1);
    ASSERT_EQ(log_count(&fx, "GET /kernels/org/demo/resolve/"), 0);
    ASSERT_OK(khub_hub_download_file(hub, &id, C1, "README.md", &p)); /* 14 bytes: fine */
    free(p);

    ASSERT_STATUS(khub__download_size_ok(hub, fx.cache, 1ull << 50, 0, "big"),
                  KHUB_STATUS_OVERFLOW);
    setenv("KHUB_MAX_DOWNLOAD_SIZE", "1000T", 1);
    khub_hub *big = hub_with(&fx, 0, 2);
    unsetenv("KHUB_MAX_DOWNLOAD_SIZE");
    ASSERT_STATUS(khub__download_size_ok(big, fx.cache, 999ull << 40, 0, "big"), KHUB_STATUS_IO);
    ASSERT_CONTAINS(khub_hub_errmsg(big), "free on the cache's file system");
    khub_hub_free(big);
    setenv("KHUB_MAX_DOWNLOAD_SIZE", "12Q", 1);
    khub_hub *bad = NULL;
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts), .endpoint = fx.endpoint};
    ASSERT_STATUS(khub_hub_new(&o, &bad), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_last_error(), "KHUB_MAX_DOWNLOAD_SIZE=\"12Q\" is not a byte count");
    unsetenv("KHUB_MAX_DOWNLOAD_SIZE");
    khub_hub_free(hub);
    fx_done(&fx);
}

/* A FIFO planted in the cache (another writer to it) or in the served
 * folder hangs nothing: an offline resolve fails (it used to block in
 * open() for good), the server answers (its stat checks caught this one
 * already; every open is now non-blocking too). */
TEST_IMPL(fifo_in_served_dir_or_cache_hangs_nothing)
{
    fixture fx;
    fx_init(&fx, NULL, 0);
    char path[1024], buf[4096];
    snprintf(path, sizeof path, "%s/org/demo/commits/" C1 "/fifo.bin", fx.repos);
    ASSERT_EQ(mkfifo(path, 0600), 0);
    int fd = connect_from(&fx, "127.0.0.1", 3.0);
    send_text(fd, "GET /kernels/org/demo/resolve/main/fifo.bin HTTP/1.1\r\nHost: x\r\n\r\n");
    int code = read_status(fd, buf, sizeof buf);
    ASSERT(code >= 400);
    close(fd);

    snprintf(path, sizeof path, "%s/kernels--org--demo/refs", fx.cache);
    mkdir(fx.cache, 0755);
    snprintf(path, sizeof path, "%s/kernels--org--demo", fx.cache);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/kernels--org--demo/refs", fx.cache);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/kernels--org--demo/refs/main", fx.cache);
    ASSERT_EQ(mkfifo(path, 0600), 0);
    khub_hub *hub = fx_hub(&fx, 1, NULL);
    khub_hub_id id = fx_id("org/demo@main");
    char commit[41];
    alarm(10);
    ASSERT_STATUS(khub_hub_resolve(hub, &id, commit), KHUB_STATUS_OFFLINE);
    alarm(0);
    khub_hub_free(hub);
    fx_done(&fx);
}

#define TEST_LIST(X) \
    X(unauthenticated_uploads_refused_at_headers) \
    X(bodies_over_their_limit_refused) \
    X(lfs_put_refused_at_headers) \
    X(idle_connections_do_not_lock_out) \
    X(per_ip_limit_and_idle_timeout) \
    X(next_page_link_to_another_origin_refused) \
    X(trickled_download_ends) \
    X(oversize_announced_size_refused_before_get) \
    X(fifo_in_served_dir_or_cache_hangs_nothing)
TEST_MAIN(TEST_LIST)
