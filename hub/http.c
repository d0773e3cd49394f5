/*
 * http.c: khub's libcurl wrapper: one request with hand-followed redirects,
 * the token policy, retries with backoff, and typed errors.
 *
 * Redirects are followed by hand (CURLOPT_FOLLOWLOCATION off) so that the
 * Authorization rule is ours, not libcurl's: the token goes only to the
 * scheme, host and port it was meant for; a redirect anywhere else (a CDN, a
 * presigned URL) gets no token. CURLOPT_UNRESTRICTED_AUTH is never set.
 * Content encoding is never negotiated: sizes and Range offsets must be
 * byte offsets of the file.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "hub_impl.h"

#ifdef KHUB_WITH_CURL
#include <curl/curl.h>
#endif

#define MAX_REDIRECTS  10
#define MAX_BODY       (16u << 20)
#define MAX_ERROR_BODY (64u << 10)

khub_status khub__url_quote(khub_hub *hub, const char *s, int keep_slash, char *buf, size_t size)
{
    static const char hexd[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int keep = isalnum(*p) || strchr("-._~", *p) || (keep_slash && *p == '/');
        if (o + 4 > size)
            return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "URL too long for %.60s...", s);
        if (keep) {
            buf[o++] = (char)*p;
        } else {
            buf[o++] = '%';
            buf[o++] = hexd[*p >> 4];
            buf[o++] = hexd[*p & 15];
        }
    }
    buf[o] = '\0';
    return KHUB_STATUS_OK;
}

void khub__http_resp_free(khub__http_resp *resp)
{
    if (!resp) return;
    khub__mem_free(resp->body);
    resp->body = NULL;
    resp->body_len = resp->body_cap = 0;
}

static const struct {
    const char *code;
    khub_status st;
} error_codes[] = {
    {"RepoNotFound", KHUB_STATUS_REPO_NOT_FOUND},
    {"RevisionNotFound", KHUB_STATUS_REVISION_NOT_FOUND},
    {"EntryNotFound", KHUB_STATUS_ENTRY_NOT_FOUND},
    {"GatedRepo", KHUB_STATUS_GATED_REPO},
};

khub_status khub__http_error(khub_hub *hub, const khub__http_resp *r, const char *what)
{
    const char *msg = r->error_message[0] ? r->error_message : "";
    for (size_t i = 0; i < sizeof error_codes / sizeof error_codes[0]; i++)
        if (strcmp(r->error_code, error_codes[i].code) == 0)
            return khub__hub_fail(hub, error_codes[i].st, "%s: %s (HTTP %ld)%s%s", what,
                                  r->error_code, r->status, msg[0] ? ": " : "", msg);
    if (r->status == 401 || r->status == 403)
        return khub__hub_fail(hub, KHUB_STATUS_UNAUTHORIZED,
                              "%s: HTTP %ld: authentication required or token rejected; set "
                              "HF_TOKEN or check its permissions",
                              what, r->status);
    if (r->status == 429)
        return khub__hub_fail(hub, KHUB_STATUS_RATE_LIMITED,
                              "%s: HTTP 429 rate limited after %d tries; retry later or pin a "
                              "commit to avoid requests",
                              what, hub->max_tries);
    return khub__hub_fail(hub, KHUB_STATUS_HTTP, "%s: unexpected HTTP %ld%s%s", what, r->status,
                          msg[0] ? ": " : "", msg);
}

#ifndef KHUB_WITH_CURL

khub_status khub__http_fetch(khub_hub *hub, const khub__http_req *req, khub__http_resp *resp)
{
    (void)resp;
    if (hub->offline)
        return khub__hub_fail(hub, KHUB_STATUS_OFFLINE,
                              "%s: offline mode (HF_HUB_OFFLINE) forbids the network", req->what);
    return khub__hub_fail(hub, KHUB_STATUS_UNSUPPORTED,
                          "%s: khub was built without libcurl (KHUB_WITH_CURL=OFF)", req->what);
}

bool khub__url_same_origin(const char *a, const char *b)
{
    (void)a;
    (void)b;
    return false; /* without libcurl nothing is sent anyway */
}

void khub__http_close(khub_hub *hub) { (void)hub; }

#else

/* ======================================================================== */
/* One exchange                                                             */
/* ======================================================================== */

typedef struct xfer {
    khub__http_resp *resp;
    const khub__sink *sink;
    CURL *curl;
    int started; /* sink->start called for this response */
    khub_status sink_st;
    int overflow;
    const khub_allocator *alloc; /* the hub's, for a buffered body */
} xfer;

static void trim_copy(char *dst, size_t size, const char *src, size_t n)
{
    while (n > 0 && isspace((unsigned char)*src)) src++, n--;
    while (n > 0 && isspace((unsigned char)src[n - 1])) n--;
    if (n >= size) n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ETag normalisation as huggingface_hub's _normalize_etag: W/ and quotes go. */
static void normalize_etag(char *s)
{
    char *p = s;
    if (strncmp(p, "W/", 2) == 0) p += 2;
    size_t n = strlen(p);
    if (n >= 2 && p[0] == '"' && p[n - 1] == '"') {
        p++;
        n -= 2;
    }
    memmove(s, p, n);
    s[n] = '\0';
}

static int64_t parse_i64(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    return (end == s || v < 0) ? -1 : (int64_t)v;
}

/* Link: <url>; rel="next" */
static void parse_link_next(char *dst, size_t size, const char *v)
{
    const char *p = v;
    while ((p = strchr(p, '<'))) {
        const char *e = strchr(p, '>');
        if (!e) return;
        if (strstr(e, "rel=\"next\"") &&
            (!strchr(e + 1, '<') || strstr(e, "rel=\"next\"") < strchr(e + 1, '<'))) {
            trim_copy(dst, size, p + 1, (size_t)(e - p - 1));
            return;
        }
        p = e;
    }
}

/* The IETF draft header the Hub sends, `"api";r=0;t=55`: with no requests
 * left (r=0) in the window, the wait is the window's remaining t seconds
 * plus one, as huggingface_hub waits; -1 when requests remain or the value
 * is not understood. */
long khub__http_ratelimit_wait(const char *val)
{
    long r = -1, t = -1;
    for (const char *p = val; (p = strchr(p, ';')); p++) {
        const char *q = p + 1;
        while (*q == ' ') q++;
        /* the key before its number: a value ending in ';' has nothing
         * after its NUL to read */
        if ((*q != 'r' && *q != 't') || q[1] != '=') continue;
        char *end = NULL;
        long v = strtol(q + 2, &end, 10);
        if (end == q + 2 || v < 0) continue;
        if (*q == 'r')
            r = v;
        else
            t = v;
    }
    if (r != 0 || t < 0) return -1;
    return t >= 86400 ? 86400 : t + 1;
}

/* The status of a status line "HTTP/x SSS ..." of n bytes (not
 * NUL-terminated), 0 when it names none. */
static long status_of(const char *data, size_t n)
{
    const char *sp = memchr(data, ' ', n);
    size_t i = sp ? (size_t)(sp - data) : n;
    while (i < n && data[i] == ' ') i++; /* as strtol skipped them */
    long st = 0;
    for (; i < n && st < 1000; i++) {
        if (data[i] < '0' || data[i] > '9') break;
        st = st * 10 + (data[i] - '0');
    }
    return st;
}

void khub__http_header(khub__http_resp *r, const char *data, size_t n)
{
    const char *colon = memchr(data, ':', n);
    if (n > 5 && strncmp(data, "HTTP/", 5) == 0) {
        r->status = status_of(data, n);
        return;
    }
    if (!colon) return;
    size_t kn = (size_t)(colon - data);
    char val[2048];
    trim_copy(val, sizeof val, colon + 1, n - kn - 1);
#define IS(name) (kn == strlen(name) && strncasecmp(data, name, kn) == 0)
    if (IS("X-Repo-Commit")) {
        trim_copy(r->repo_commit, sizeof r->repo_commit, val, strlen(val));
    } else if (IS("ETag")) {
        trim_copy(r->etag, sizeof r->etag, val, strlen(val));
        normalize_etag(r->etag);
    } else if (IS("X-Linked-Etag")) {
        trim_copy(r->linked_etag, sizeof r->linked_etag, val, strlen(val));
        normalize_etag(r->linked_etag);
    } else if (IS("X-Linked-Size")) {
        r->linked_size = parse_i64(val);
    } else if (IS("Content-Length")) {
        r->content_length = parse_i64(val);
    } else if (IS("Content-Range")) {
        if (strncmp(val, "bytes ", 6) == 0) r->range_start = parse_i64(val + 6);
    } else if (IS("Retry-After")) {
        int64_t v = parse_i64(val);
        r->retry_after = v > 86400 ? 86400 : (long)v;
    } else if (IS("RateLimit")) {
        r->ratelimit_wait = khub__http_ratelimit_wait(val);
    } else if (IS("Location")) {
        trim_copy(r->location, sizeof r->location, val, strlen(val));
    } else if (IS("X-Error-Code")) {
        trim_copy(r->error_code, sizeof r->error_code, val, strlen(val));
    } else if (IS("X-Error-Message")) {
        trim_copy(r->error_message, sizeof r->error_message, val, strlen(val));
    } else if (IS("Link")) {
        parse_link_next(r->link_next, sizeof r->link_next, val);
    }
#undef IS
}

static size_t on_header(char *data, size_t sz, size_t nitems, void *ud)
{
    xfer *x = ud;
    khub__http_header(x->resp, data, sz * nitems);
    return sz * nitems;
}

static size_t buffer_body(const khub_allocator *a, khub__http_resp *r, const void *data, size_t n,
                          size_t max)
{
    size_t need;
    if (!khub__add_ok(r->body_len, n + 1, &need) || need > max) return 0;
    if (need > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < need) cap *= 2;
        char *b = khub__mem_realloc(a, r->body, cap);
        if (!b) return 0;
        r->body = b;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return n;
}

static size_t on_body(char *data, size_t sz, size_t nitems, void *ud)
{
    xfer *x = ud;
    size_t n = sz * nitems;
    long st = x->resp->status;
    if (!x->sink || st < 200 || st >= 300) {
        size_t w = buffer_body(x->alloc, x->resp, data, n, x->sink ? MAX_ERROR_BODY : MAX_BODY);
        if (w != n) x->overflow = 1;
        return w;
    }
    if (!x->started) {
        x->started = 1;
        x->sink_st = x->sink->start(x->sink->ud, st, x->resp->range_start);
        if (x->sink_st != KHUB_STATUS_OK) return 0;
    }
    return x->sink->write(x->sink->ud, data, n);
}

static void reset_resp(khub__http_resp *r)
{
    khub__mem_free(r->body);
    memset(r, 0, sizeof *r);
    r->linked_size = r->content_length = r->range_start = -1;
    r->retry_after = r->ratelimit_wait = -1;
}

/* The method and body of a POST, PUT or DELETE: from memory, or streamed
 * from req->upload_path (opened afresh for every try, so a retry resends
 * the whole file). "Expect:" turns off 100-continue, which only adds a
 * round trip (and a one-second stall against servers that ignore it). */
static khub_status set_body(khub_hub *hub, const khub__http_req *req, CURL *c,
                            struct curl_slist **hdrs, FILE **up)
{
    if (!strcmp(req->method, "GET") || !strcmp(req->method, "HEAD")) return KHUB_STATUS_OK;
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
    *hdrs = curl_slist_append(*hdrs, "Expect:");
    if (req->upload_path) {
        struct stat sb;
        char why[KHUB_ERROR_SIZE];
        *up = khub__fopen_regular(req->upload_path, why, sizeof why);
        if (!*up || fstat(fileno(*up), &sb) != 0)
            return khub__hub_fail(hub, KHUB_STATUS_IO, "%s: %s", req->what, why);
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(c, CURLOPT_READDATA, *up);
        curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)sb.st_size);
        return KHUB_STATUS_OK;
    }
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body ? (const char *)req->body : "");
    return KHUB_STATUS_OK;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One request, no redirect, no retry. Transport errors are NETWORK, with
 * *transient 1 (2: cut for being slower than hub->min_rate); a request
 * still running at deadline (CLOCK_MONOTONIC seconds, 0 = none) is cut
 * and TIMEOUT. */
static khub_status exchange(khub_hub *hub, const khub__http_req *req, const char *url, int auth,
                            double deadline, khub__http_resp *resp, int *transient)
{
    pthread_once(&curl_once, curl_init_once);
    reset_resp(resp);
    *transient = 0;
    /* One easy handle per hub, reset between requests: its connection
     * cache survives the reset, so the requests of a download (revision,
     * listing, files) share one keep-alive connection (one TLS handshake
     * with the real Hub instead of one per request). */
    if (hub->curl)
        curl_easy_reset(hub->curl);
    else if (!(hub->curl = curl_easy_init()))
        return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "%s: curl_easy_init failed", req->what);
    CURL *c = hub->curl;
    struct curl_slist *hdrs = NULL;
    char line[4200];
    if (auth && hub->token) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", hub->token);
        hdrs = curl_slist_append(hdrs, line);
    }
    uint64_t from = 0;
    if (req->sink && strcmp(req->method, "GET") == 0) from = req->sink->offset(req->sink->ud);
    if (from > 0) {
        snprintf(line, sizeof line, "Range: bytes=%llu-", (unsigned long long)from);
        hdrs = curl_slist_append(hdrs, line);
    }
    hdrs = curl_slist_append(hdrs, "Accept-Encoding: identity");
    if (req->content_type) {
        snprintf(line, sizeof line, "Content-Type: %s", req->content_type);
        hdrs = curl_slist_append(hdrs, line);
    }
    if (req->accept) {
        snprintf(line, sizeof line, "Accept: %s", req->accept);
        hdrs = curl_slist_append(hdrs, line);
    }
    FILE *up = NULL;
    khub_status bst = set_body(hub, req, c, &hdrs, &up);
    if (bst != KHUB_STATUS_OK) {
        curl_slist_free_all(hdrs);
        return bst;
    }
    xfer x = {.resp = resp, .sink = req->sink, .curl = c, .alloc = khub__hub_alloc(hub)};
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_USERAGENT, hub->user_agent);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)hub->timeout_s);
    /* A real minimum rate, not 1 byte/s: a body trickled at 2 bytes/s
     * passed the old check and never ended (issue 10). */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, (long)hub->min_rate);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)hub->timeout_s);
    if (deadline > 0) {
        double left = deadline - mono_s();
        if (left < 0.001) left = 0.001;
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(left * 1000));
    }
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    /* Streamed downloads: 512 KiB receive buffer (libcurl's maximum) instead
     * of 16 KiB, so 32x fewer read/write/hash rounds per byte. */
    if (req->sink) curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    if (strcmp(req->method, "HEAD") == 0) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    hub->n_requests++;
    CURLcode cc = curl_easy_perform(c);
    char *eff = NULL;
    curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &eff);
    snprintf(resp->final_url, sizeof resp->final_url, "%s", eff ? eff : url);
    curl_slist_free_all(hdrs);
    if (up) fclose(up);
    if (x.sink_st != KHUB_STATUS_OK) return x.sink_st; /* the sink set the message */
    if (x.overflow)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "%s: response body over %u bytes",
                              req->what, MAX_BODY);
    if (cc == CURLE_WRITE_ERROR && x.started)
        return khub__hub_fail(hub, KHUB_STATUS_IO, "%s: the download was aborted", req->what);
    if (cc == CURLE_OPERATION_TIMEDOUT && deadline > 0 && mono_s() >= deadline)
        return khub__hub_fail(hub, KHUB_STATUS_TIMEOUT,
                              "%s: not done by its deadline (HF_HUB_DOWNLOAD_TIMEOUT=%d s plus the "
                              "expected size at KHUB_DOWNLOAD_MIN_RATE=%llu bytes/s); the hub "
                              "sends too slowly (%s)",
                              req->what, hub->timeout_s, (unsigned long long)hub->min_rate, url);
    if (cc != CURLE_OK) {
        *transient = cc == CURLE_OPERATION_TIMEDOUT ? 2 : 1;
        return khub__hub_fail(hub, KHUB_STATUS_NETWORK, "%s: %s (%s)", req->what,
                              errbuf[0] ? errbuf : curl_easy_strerror(cc), url);
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Redirects                                                                */
/* ======================================================================== */

/* Resolves loc against base into out; *same_origin says whether scheme,
 * host and port are unchanged. */
static khub_status resolve_location(khub_hub *hub, const char *base, const char *loc, char *out,
                                    size_t size, int *same_origin)
{
    CURLU *u = curl_url(), *b = curl_url();
    char *s = NULL, *bs = NULL, *bh = NULL, *bp = NULL, *us = NULL, *uh = NULL, *up = NULL;
    khub_status st = KHUB_STATUS_OK;
    if (!u || !b || curl_url_set(b, CURLUPART_URL, base, 0) != CURLUE_OK ||
        curl_url_set(u, CURLUPART_URL, base, 0) != CURLUE_OK ||
        curl_url_set(u, CURLUPART_URL, loc, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_URL, &s, 0) != CURLUE_OK) {
        st = khub__hub_fail(hub, KHUB_STATUS_HTTP, "bad redirect Location \"%.200s\"", loc);
        goto done;
    }
    curl_url_get(b, CURLUPART_SCHEME, &bs, 0);
    curl_url_get(b, CURLUPART_HOST, &bh, 0);
    curl_url_get(b, CURLUPART_PORT, &bp, CURLU_DEFAULT_PORT);
    curl_url_get(u, CURLUPART_SCHEME, &us, 0);
    curl_url_get(u, CURLUPART_HOST, &uh, 0);
    curl_url_get(u, CURLUPART_PORT, &up, CURLU_DEFAULT_PORT);
    *same_origin = bs && us && bh && uh && bp && up && !strcasecmp(bs, us) && !strcasecmp(bh, uh) &&
                   !strcmp(bp, up);
    if (us && strcasecmp(us, "http") && strcasecmp(us, "https")) {
        st = khub__hub_fail(hub, KHUB_STATUS_HTTP, "redirect to a non-HTTP URL refused: %.200s",
                            loc);
        goto done;
    }
    if (snprintf(out, size, "%s", s) >= (int)size)
        st = khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "redirect URL too long");
done:
    curl_free(s);
    curl_free(bs), curl_free(bh), curl_free(bp), curl_free(us), curl_free(uh), curl_free(up);
    curl_url_cleanup(u);
    curl_url_cleanup(b);
    return st;
}

bool khub__url_same_origin(const char *a, const char *b)
{
    char out[2048];
    int same = 0;
    khub_hub scratch;
    memset(&scratch, 0, sizeof scratch);
    scratch.err_set = 1; /* a parse failure here is an answer, not an error to report */
    if (resolve_location(&scratch, a, b, out, sizeof out, &same) != KHUB_STATUS_OK) return false;
    return same != 0;
}

static int is_redirect(long st)
{
    return st == 301 || st == 302 || st == 303 || st == 307 || st == 308;
}

/* Follows redirects for one try. */
static khub_status one_try(khub_hub *hub, const khub__http_req *req, double deadline,
                           khub__http_resp *resp, int *transient)
{
    char url[2048];
    snprintf(url, sizeof url, "%s", req->url);
    int auth = req->auth;
    for (int hop = 0;; hop++) {
        KHUB_FORWARD_IF_ERROR(NULL, exchange(hub, req, url, auth, deadline, resp, transient));
        if (!is_redirect(resp->status) || !resp->location[0]) return KHUB_STATUS_OK;
        int relative = strstr(resp->location, "://") == NULL;
        if (!relative && !req->follow_absolute) return KHUB_STATUS_OK; /* caller reads it */
        if (hop + 1 >= MAX_REDIRECTS)
            return khub__hub_fail(hub, KHUB_STATUS_HTTP,
                                  "%s: more than %d redirects (a redirect loop?) at %s", req->what,
                                  MAX_REDIRECTS, url);
        char next[2048];
        int same = 0;
        KHUB_FORWARD_IF_ERROR(NULL,
                              resolve_location(hub, url, resp->location, next, sizeof next, &same));
        if (!same) auth = 0; /* never carry the token to another origin */
        memcpy(url, next, sizeof url);
    }
}

static int retryable_status(long st)
{
    return st == 408 || st == 429 || st == 500 || st == 502 || st == 503 || st == 504;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Seconds a GET or HEAD may spend transferring, over all its tries (the
 * waits between them not counted): HF_HUB_DOWNLOAD_TIMEOUT twice, plus the
 * bytes still expected at the minimum rate; a buffered answer (an API call,
 * at most MAX_BODY) gets six times the timeout, at least a minute. 0 = no
 * deadline: uploads are held to the minimum rate only. */
static double transfer_budget_s(const khub_hub *hub, const khub__http_req *req)
{
    if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "HEAD") != 0) return 0;
    if (!req->sink) return hub->timeout_s * 6.0 < 60 ? 60 : hub->timeout_s * 6.0;
    uint64_t have = req->sink->offset(req->sink->ud);
    uint64_t left = req->expect_bytes > have ? req->expect_bytes - have : 0;
    return 2.0 * hub->timeout_s + (double)left / (double)hub->min_rate;
}

khub_status khub__http_fetch(khub_hub *hub, const khub__http_req *req, khub__http_resp *resp)
{
    if (hub->offline)
        return khub__hub_fail(hub, KHUB_STATUS_OFFLINE,
                              "%s: not cached, and offline mode (HF_HUB_OFFLINE) forbids the "
                              "network; run once online or unset HF_HUB_OFFLINE",
                              req->what);
    long wait = hub->backoff_ms;
    int tries = 0, stalls = 0;
    double budget = transfer_budget_s(hub, req);
    double deadline = budget > 0 ? mono_s() + budget : 0;
    for (;;) {
        uint64_t before = req->sink ? req->sink->offset(req->sink->ud) : 0;
        int transient = 0;
        int saved = hub->err_set;
        khub_status st = one_try(hub, req, deadline, resp, &transient);
        uint64_t after = req->sink ? req->sink->offset(req->sink->ud) : 0;
        uint64_t gained = after > before ? after - before : 0; /* a restart (200) resets it */
        /* A try cut for slowness counts unless it brought a window's worth
         * at the minimum rate: a trickle is not progress. */
        int progressed =
            gained > 0 && !(transient == 2 && gained < hub->min_rate * (uint64_t)hub->timeout_s);
        tries += progressed ? 0 : 1;
        int again = (st == KHUB_STATUS_OK && retryable_status(resp->status)) ||
                    (st == KHUB_STATUS_NETWORK && transient);
        if (!again || tries >= hub->max_tries || ++stalls > 4 * hub->max_tries) return st;
        long ms = wait;
        /* A 429 whose RateLimit says the window is used up waits for the
         * window; otherwise a Retry-After is honoured. */
        long hint = st != KHUB_STATUS_OK                               ? -1
                    : resp->status == 429 && resp->ratelimit_wait >= 0 ? resp->ratelimit_wait
                                                                       : resp->retry_after;
        if (hint >= 0) {
            long ra = hint > hub->max_retry_after_s ? hub->max_retry_after_s : hint;
            if (ra * 1000 > ms) ms = ra * 1000;
        }
        khub__log(hub->rt, KHUB_LOG_INFO, "%s: %s, retrying in %ld ms", req->what,
                  st == KHUB_STATUS_OK ? "HTTP error" : hub->errmsg, ms);
        hub->err_set = saved; /* a retried failure is not the error to report */
        if (!progressed) {
            sleep_ms(ms);
            if (wait < 8L * hub->backoff_ms) wait *= 2;
            if (deadline > 0) deadline += (double)ms / 1000; /* waits are not transfer time */
        }
    }
}

void khub__http_close(khub_hub *hub)
{
    if (hub->curl) curl_easy_cleanup(hub->curl);
    hub->curl = NULL;
}

#endif /* KHUB_WITH_CURL */
