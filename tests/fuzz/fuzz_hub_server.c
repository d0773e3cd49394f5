/* fuzz_hub_server.c: libFuzzer target for what a client sends `khub serve`
 * (hub/server*.c, compiled in with coverage): the bodies of its write
 * endpoints and of paths-info, and any request line. The server runs in
 * this process on a loopback port, with no token (every write allowed), on
 * a folder holding one repo, org/demo (main = C1: README.md, w.bin, an
 * uploaded LFS object); each input is sent as one HTTP/1.1 request on a
 * fresh connection and the answer read to its end.
 *
 * The first input byte (mod 9) picks the request; the rest is its body:
 *   0 POST .../preupload/main              5 POST .../paths-info/main (form)
 *   1 POST .../commit/main (NDJSON)        6 POST .../paths-info/main (JSON)
 *   2 POST .../commit/main (JSON)          7 POST /api/repos/create
 *   3 POST /org/demo.git/info/lfs/objects/batch
 *   4 POST /lfs-verify/org/demo
 *   8 the input's first line is "METHOD TARGET" (branches, tags, DELETE,
 *     PUT lfs-upload, every GET route), the rest the body
 * Every answer to 0-7 must be a whole HTTP response. After a write that can
 * change the folder is answered 2xx, the folder is written afresh, so inputs do not
 * depend on the ones before. Any input may be refused; none may crash,
 * leak, hang or read out of bounds. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "server.h"

#define C1 "1111111111111111111111111111111111111111"
/* sha256("lfs object"): the object uploaded in lfs/ */
#define LFS_OID "781f1a15e191cad9de5075c2b566ba2b9bd286e33f2d5d4f1511d411e67aeb23"

static char root[64], repos[128];
static uint16_t port;

static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", repos, rel);
    for (char *p = path + strlen(repos) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text)) abort();
    fclose(f);
}

/* The folder as the target starts it. */
static void make_repos(void)
{
    khub__rmtree(repos);
    mkdir(repos, 0755);
    put("org/demo/refs.json",
        "{\"branches\":{\"main\":\"" C1 "\",\"v1\":\"" C1 "\"},\"tags\":{\"t\":\"" C1 "\"},"
        "\"lfs\":[\"*.bin\"]}");
    put("org/demo/commits/" C1 "/README.md", "# demo\n");
    put("org/demo/commits/" C1 "/w.bin", "weights");
    put("org/demo/commits/" C1 "/docs/a.md", "a\n");
    put("org/demo/lfs/" LFS_OID, "lfs object");
}

static void start(void)
{
    snprintf(root, sizeof root, "/tmp/khub-fuzz-serve-XXXXXX");
    if (!mkdtemp(root)) abort();
    snprintf(repos, sizeof repos, "%s/repos", root);
    make_repos();
    /* the limits of khub serve's defaults, except the connections: each
     * input is one, and closed ones linger in libmicrohttpd for a moment */
    khub__server_opts o = {.dir = repos, .faults = "", .max_connections = 4096, .max_per_ip = 4096};
    khub__server *srv = NULL;
    if (khub__server_start(&o, &srv) != KHUB_STATUS_OK) abort();
    port = khub__server_port(srv); /* left running: the process ends with the fuzzer */
}

static int send_all(int fd, const void *p, size_t n)
{
    for (size_t at = 0; at < n;) {
        ssize_t w = send(fd, (const char *)p + at, n - at, MSG_NOSIGNAL);
        if (w <= 0) return 0;
        at += (size_t)w;
    }
    return 1;
}

/* Sends one request; the answer's status, 0 when the connection closed
 * before a whole status line came. */
static int request(const char *method, const char *target, const char *ctype, const char *body,
                   size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) abort();
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return 0;
    }
    char head[1024];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                      "Content-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                      method, target, ctype, n);
    int status = 0;
    if (hn > 0 && (size_t)hn < sizeof head && send_all(fd, head, (size_t)hn) &&
        send_all(fd, body, n)) {
        char buf[4096];
        size_t got = 0;
        ssize_t r;
        while ((r = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0) {
            got += (size_t)r;
            if (got == sizeof buf - 1) got = 16; /* keep the status line */
        }
        buf[got] = '\0';
        int code;
        if (got >= 12 && sscanf(buf, "HTTP/1.1 %3d", &code) == 1) status = code;
    }
    close(fd);
    return status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!port) start();
    if (size == 0) return 0;
    const char *body = (const char *)data + 1;
    size_t n = size - 1;
    static const struct {
        const char *target, *ctype;
    } fixed[] = {
        {"/api/kernels/org/demo/preupload/main", "application/json"},
        {"/api/kernels/org/demo/commit/main", "application/x-ndjson"},
        {"/api/kernels/org/demo/commit/main", "application/json"},
        {"/org/demo.git/info/lfs/objects/batch", "application/vnd.git-lfs+json"},
        {"/lfs-verify/org/demo", "application/vnd.git-lfs+json"},
        {"/api/kernels/org/demo/paths-info/main", "application/x-www-form-urlencoded"},
        {"/api/kernels/org/demo/paths-info/main", "application/json"},
        {"/api/repos/create", "application/json"},
    };
    unsigned pick = data[0] % 9;
    int status;
    if (pick < 8) {
        status = request("POST", fixed[pick].target, fixed[pick].ctype, body, n);
        if (status == 0) { /* once more: a loaded machine can drop a connection */
            fprintf(stderr, "fuzz_hub_server: no answer to %s (%s); trying again\n",
                    fixed[pick].target, strerror(errno));
            usleep(200000);
            status = request("POST", fixed[pick].target, fixed[pick].ctype, body, n);
        }
        if (status == 0) { /* a whole request without a whole answer, twice */
            fprintf(stderr, "fuzz_hub_server: no answer to %s (%s)\n", fixed[pick].target,
                    strerror(errno));
            abort();
        }
    } else {
        /* "METHOD TARGET\n" then the body; a line the HTTP parser refuses
         * is libmicrohttpd's to answer or drop */
        const char *nl = memchr(body, '\n', n);
        size_t ln = nl ? (size_t)(nl - body) : n;
        char line[600];
        if (ln >= sizeof line) return 0;
        memcpy(line, body, ln);
        line[ln] = '\0';
        char *sp = strchr(line, ' ');
        if (!sp || memchr(line, '\r', ln) || memchr(line, '\0', ln)) return 0;
        *sp = '\0';
        size_t skip = nl ? ln + 1 : n;
        status = request(line, sp + 1, "application/json", body + skip, n - skip);
        if (!strcmp(line, "GET") || !strcmp(line, "HEAD")) return 0;
    }
    /* the writes that can change the folder: commits, repo creation,
     * branches, tags, uploads */
    if (status >= 200 && status < 300 && (pick == 1 || pick == 2 || pick >= 7)) make_repos();
    return 0;
}
