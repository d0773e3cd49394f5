/* test_admin_api.c: the public cache administration (khub/khub_cache.h) and
 * hub server (khub/khub_server.h) APIs, used as an application would: a
 * khub_server_start on the fixture's repos folder, downloads through
 * khub_hub, then scan, verify, prune and the quarantine markers, and every
 * error a caller can meet with its status and message. */
#include <pthread.h>
#include <stddef.h>
#include <sys/stat.h>

#include "hub_fixture.h"
#include "khub/khub_cache.h"
#include "khub/khub_server.h"

typedef struct pub_fixture {
    fixture fx; /* root, repos, cache, variant; fx.srv unused */
    khub_server *srv;
} pub_fixture;

static khub_server_opts server_opts(const char *dir)
{
    khub_server_opts so = {KHUB_APP_INIT(khub_server_opts), .dir = dir, .faults = ""};
    return so;
}

/* The fixture's repos, served through the public API. */
static void pub_init(pub_fixture *p, const char *token)
{
    memset(p, 0, sizeof *p);
    fixture *fx = &p->fx;
    snprintf(fx->root, sizeof fx->root, "/tmp/khub-adminapi-XXXXXX");
    ASSERT(mkdtemp(fx->root) != NULL);
    snprintf(fx->repos, sizeof fx->repos, "%s/repos", fx->root);
    snprintf(fx->cache, sizeof fx->cache, "%s/cache", fx->root);
    snprintf(fx->log, sizeof fx->log, "%s/server.log", fx->root);
    mkdir(fx->repos, 0755);
    fx_make_repos(fx);
    khub_server_opts so = server_opts(fx->repos);
    so.token = token;
    so.log_path = fx->log;
    char err[KHUB_ERROR_SIZE] = "unchanged";
    ASSERT_OK(khub_server_start(&so, &p->srv, err, sizeof err));
    ASSERT_STR_EQ(err, "");
    ASSERT(khub_server_port(p->srv) != 0);
    snprintf(fx->endpoint, sizeof fx->endpoint, "http://127.0.0.1:%u", khub_server_port(p->srv));
}

static void pub_done(pub_fixture *p)
{
    khub_server_stop(p->srv);
    khub__rmtree(p->fx.root);
}

/* README.md and weights.bin at main (C1), README.md at v2 (C2). */
static khub_hub *fill_cache(pub_fixture *p)
{
    khub_hub *hub = fx_hub(&p->fx, 0, NULL);
    const char *ids[] = {"org/demo@main", "org/demo@main", "org/demo@version=2"};
    const char *files[] = {"README.md", "weights.bin", "README.md"};
    for (int i = 0; i < 3; i++) {
        khub_hub_id id = fx_id(ids[i]);
        char commit[41], *path = NULL;
        ASSERT_OK(khub_hub_resolve(hub, &id, commit));
        ASSERT_OK(khub_hub_download_file(hub, &id, commit, files[i], &path));
        free(path);
    }
    return hub;
}

/* ======================================================================== */
/* Server                                                                   */
/* ======================================================================== */

TEST_IMPL(server_serves_counts_and_stops)
{
    pub_fixture p;
    pub_init(&p, "s3cret");
    ASSERT_EQ(khub_server_request_count(p.srv), 0);
    khub_hub *hub = fill_cache(&p);
    ASSERT_LE(3, khub_server_request_count(p.srv));
    ASSERT_LE(1, khub_server_connection_count(p.srv));
    ASSERT(khub_server_connection_count(p.srv) <= khub_server_request_count(p.srv));
    char *log = fx_log(&p.fx); /* opts.log_path: one line per request */
    ASSERT_CONTAINS(log, "README.md");
    free(log);
    khub_hub_free(hub);
    pub_done(&p);
    khub_server_stop(NULL); /* accepted */
    ASSERT_EQ(khub_server_port(NULL), 0);
}

/* The access log through khub_server_opts.log (issue 12): one call per
 * request at INFO, one line each, and no file of the library's own. */
typedef struct log_seen {
    pthread_mutex_t mu;
    int calls, bad_level, newline;
    char text[8192];
} log_seen;

static void collect_log(void *ud, khub_log_level level, const char *msg)
{
    log_seen *ls = ud;
    pthread_mutex_lock(&ls->mu);
    ls->calls++;
    ls->bad_level += level != KHUB_LOG_INFO;
    ls->newline += strchr(msg, '\n') != NULL;
    size_t n = strlen(ls->text);
    snprintf(ls->text + n, sizeof ls->text - n, "%s|", msg);
    pthread_mutex_unlock(&ls->mu);
}

TEST_IMPL(server_access_log_goes_to_the_callback)
{
    pub_fixture p;
    memset(&p, 0, sizeof p);
    fixture *fx = &p.fx;
    snprintf(fx->root, sizeof fx->root, "/tmp/khub-adminapi-XXXXXX");
    ASSERT(mkdtemp(fx->root) != NULL);
    snprintf(fx->repos, sizeof fx->repos, "%s/repos", fx->root);
    snprintf(fx->cache, sizeof fx->cache, "%s/cache", fx->root);
    mkdir(fx->repos, 0755);
    fx_make_repos(fx);
    log_seen ls = {.mu = PTHREAD_MUTEX_INITIALIZER};
    khub_server_opts so = server_opts(fx->repos);
    so.log = collect_log;
    so.log_ud = &ls;
    so.log_path = "/nonexistent/dir/server.log"; /* not opened: log wins */
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub_server_start(&so, &p.srv, err, sizeof err));
    snprintf(fx->endpoint, sizeof fx->endpoint, "http://127.0.0.1:%u", khub_server_port(p.srv));
    khub_hub *hub = fill_cache(&p);
    khub_hub_free(hub);
    uint64_t served = khub_server_request_count(p.srv);
    khub_server_stop(p.srv);
    ASSERT_LE(3, served);
    ASSERT_EQ((uint64_t)ls.calls, served);
    ASSERT_EQ(ls.bad_level, 0);
    ASSERT_EQ(ls.newline, 0);
    ASSERT_CONTAINS(ls.text, "/resolve/" C1 "/README.md auth=no range=- ua=khub/");
    khub__rmtree(fx->root);
}

/* A 0.1 caller's khub_server_opts ends at max_body: nothing after it is
 * read (the bytes there are garbage that would crash as a log callback). */
TEST_IMPL(server_reads_only_struct_size)
{
    const size_t size_0_1 = offsetof(khub_server_opts, max_body) + sizeof(uint64_t);
    ASSERT(size_0_1 < sizeof(khub_server_opts));
    unsigned char raw[sizeof(khub_server_opts) + 64];
    memset(raw, 0xA5, sizeof raw);
    khub_server_opts so = server_opts("/tmp");
    memcpy(raw, &so, size_0_1);
    ((khub_server_opts *)(void *)raw)->struct_size = (uint32_t)size_0_1;
    khub_server *srv = NULL;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_OK(khub_server_start((const khub_server_opts *)(void *)raw, &srv, err, sizeof err));
    khub_hub_opts ho = {KHUB_APP_INIT(khub_hub_opts), .token = "", .max_tries = 1};
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%u", khub_server_port(srv));
    ho.endpoint = endpoint;
    ho.cache_dir = "/nonexistent/khub-cache";
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&ho, &hub));
    khub_hub_id id = fx_id("org/none@main");
    char commit[41];
    (void)khub_hub_resolve(hub, &id, commit); /* a request: the log would be called */
    ASSERT_LE(1, khub_server_request_count(srv));
    khub_hub_free(hub);
    khub_server_stop(srv);
}

static void expect_start_error(const khub_server_opts *so, khub_status want, const char *msg)
{
    khub_server *srv = (khub_server *)1;
    char err[KHUB_ERROR_SIZE] = "";
    ASSERT_STATUS(khub_server_start(so, &srv, err, sizeof err), want);
    ASSERT(srv == NULL);
    ASSERT_CONTAINS(err, msg);
    ASSERT(!strchr(err, '\n'));
}

TEST_IMPL(server_start_errors)
{
    khub_server_opts so = server_opts("/nonexistent/khub-repos");
    expect_start_error(&so, KHUB_STATUS_NOT_FOUND,
                       "serve: /nonexistent/khub-repos is not a directory of repos");
    so = server_opts("/tmp");
    so.host = "999.0.0.1";
    expect_start_error(&so, KHUB_STATUS_INVALID_ARG,
                       "serve: host 999.0.0.1 (khub_server_opts.host) is not an IPv4 address");
    so = server_opts("/tmp");
    so.faults = "drop-body,nope";
    expect_start_error(&so, KHUB_STATUS_INVALID_ARG, "unknown fault \"nope\"; known: drop-body");
    so = server_opts("/tmp");
    so.log_path = "/nonexistent/dir/server.log";
    expect_start_error(&so, KHUB_STATUS_IO, "serve: cannot open log /nonexistent/dir/server.log");
    so = server_opts("/tmp");
    so.struct_size = 8;
    expect_start_error(&so, KHUB_STATUS_STRUCT_SIZE,
                       "khub_server_start: opts.struct_size 8 is smaller than 0.1's");
    expect_start_error(NULL, KHUB_STATUS_MISUSE, "khub_server_start: opts is NULL");
    /* a port in use */
    pub_fixture p;
    pub_init(&p, NULL);
    so = server_opts("/tmp");
    so.port = khub_server_port(p.srv);
    char want[96];
    snprintf(want, sizeof want, "serve: cannot listen on 127.0.0.1:%u (port in use?)", so.port);
    expect_start_error(&so, KHUB_STATUS_IO, want);
    /* no buffer: the status alone */
    khub_server *srv = NULL;
    ASSERT_STATUS(khub_server_start(&so, &srv, NULL, 0), KHUB_STATUS_IO);
    pub_done(&p);
}

/* ======================================================================== */
/* Cache                                                                    */
/* ======================================================================== */

typedef struct items {
    int n;
    char kind[16][16];
    char path[16][600];
} items;

static void on_item(void *ud, const char *kind, const char *path, const char *detail)
{
    items *it = ud;
    ASSERT(detail && detail[0]);
    if (it->n < 16) {
        snprintf(it->kind[it->n], sizeof it->kind[0], "%s", kind);
        snprintf(it->path[it->n], sizeof it->path[0], "%s", path);
    }
    it->n++;
}

TEST_IMPL(cache_scan_verify_prune)
{
    pub_fixture p;
    pub_init(&p, NULL);
    khub_hub *hub = fill_cache(&p);
    khub_cache_report *r = NULL;
    ASSERT_OK(khub_cache_scan(hub, &r));
    ASSERT_EQ(r->struct_size, sizeof *r);
    ASSERT_EQ(r->abi_major, KHUB_API_VERSION_MAJOR);
    ASSERT_EQ(r->n_repos, 1);
    ASSERT_STR_EQ(r->repos[0].id, "org/demo");
    ASSERT_STR_EQ(r->repos[0].type, "kernel");
    ASSERT_EQ(r->repos[0].n_revs, 2);
    ASSERT_STR_EQ(r->repos[0].revs[0].refs, "main");
    ASSERT_EQ(r->size, r->repos[0].size);
    khub_cache_report_free(r);
    khub_cache_report_free(NULL);

    uint64_t checked = 9, bad = 9, freed = 9;
    items it = {0};
    ASSERT_OK(khub_cache_verify(hub, "org/demo", on_item, &it, &checked, &bad));
    ASSERT_EQ(checked, 3);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(it.n, 0);
    ASSERT_STATUS(khub_cache_verify(hub, "org/other", NULL, NULL, &checked, &bad),
                  KHUB_STATUS_NOT_FOUND);
    char want[600];
    snprintf(want, sizeof want, "cache verify: no repo org/other in %s (see khub cache ls)",
             p.fx.cache);
    ASSERT_STR_EQ(khub_hub_errmsg(hub), want);

    /* detach v2's snapshot: prune removes it and its blob, dry run first */
    char ref[600];
    snprintf(ref, sizeof ref, "%s/kernels--org--demo/refs/v2", p.fx.cache);
    ASSERT_EQ(unlink(ref), 0);
    ASSERT_OK(khub_cache_prune(hub, 1, on_item, &it, &freed));
    ASSERT_EQ(freed, strlen("# demo kernel v2\n"));
    ASSERT(it.n >= 2);
    ASSERT_STR_EQ(it.kind[0], "snapshot");
    ASSERT_CONTAINS(it.path[0], C2);
    ASSERT_OK(khub_cache_scan(hub, &r));
    ASSERT_EQ(r->repos[0].n_revs, 2); /* dry run: nothing went */
    khub_cache_report_free(r);
    ASSERT_OK(khub_cache_prune(hub, 0, NULL, NULL, &freed));
    ASSERT_EQ(freed, strlen("# demo kernel v2\n"));
    ASSERT_OK(khub_cache_scan(hub, &r));
    ASSERT_EQ(r->repos[0].n_revs, 1);
    khub_cache_report_free(r);

    /* a flipped byte in the LFS blob */
    char snap[600], blob[600];
    snprintf(snap, sizeof snap, "%s/kernels--org--demo/snapshots/" C1 "/weights.bin", p.fx.cache);
    ASSERT(realpath(snap, blob) != NULL);
    FILE *f = fopen(blob, "r+b");
    ASSERT(f != NULL);
    fputc('#', f);
    fclose(f);
    memset(&it, 0, sizeof it);
    ASSERT_STATUS(khub_cache_verify(hub, NULL, on_item, &it, &checked, &bad),
                  KHUB_STATUS_DIGEST_MISMATCH);
    ASSERT_EQ(checked, 2);
    ASSERT_EQ(bad, 1);
    ASSERT_EQ(it.n, 1);
    ASSERT_STR_EQ(it.kind[0], "corrupt");
    ASSERT_STR_EQ(it.path[0], blob);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), "cache verify: 1 of 2 files are corrupt (first: ");
    khub_hub_free(hub);
    pub_done(&p);
}

typedef struct markers {
    size_t n;
    char repo[64], commit[41], variant[64], why[128];
} markers;

static void on_marker(void *ud, const char *repo, const char *commit, const char *variant,
                      const char *why)
{
    markers *m = ud;
    m->n++;
    snprintf(m->repo, sizeof m->repo, "%s", repo);
    snprintf(m->commit, sizeof m->commit, "%s", commit);
    snprintf(m->variant, sizeof m->variant, "%s", variant);
    snprintf(m->why, sizeof m->why, "%s", why);
}

TEST_IMPL(cache_quarantine_list_and_clear)
{
    pub_fixture p;
    pub_init(&p, NULL);
    khub_hub *hub = fill_cache(&p);
    size_t n = 9;
    ASSERT_OK(khub_cache_quarantine_list(hub, NULL, NULL, NULL, &n));
    ASSERT_EQ(n, 0);
    char marker[700];
    snprintf(marker, sizeof marker, "%s/kernels--org--demo/khub-quarantine/" C1 "/%s", p.fx.cache,
             p.fx.variant);
    fx_write(marker, "SIGSEGV in plugin org/demo 1.0.0 :: rms_norm\n", 45);
    markers m = {0};
    ASSERT_OK(khub_cache_quarantine_list(hub, NULL, on_marker, &m, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(m.n, 1);
    ASSERT_STR_EQ(m.repo, "org/demo");
    ASSERT_STR_EQ(m.commit, C1);
    ASSERT_STR_EQ(m.variant, p.fx.variant);
    ASSERT_STR_EQ(m.why, "SIGSEGV in plugin org/demo 1.0.0 :: rms_norm");
    ASSERT_OK(khub_cache_quarantine_list(hub, "org/other", NULL, NULL, &n));
    ASSERT_EQ(n, 0);
    ASSERT_EQ(access(marker, F_OK), 0); /* listing removes nothing */
    ASSERT_OK(khub_cache_quarantine_clear(hub, "org/demo", NULL, NULL, &n));
    ASSERT_EQ(n, 1);
    ASSERT_NE(access(marker, F_OK), 0);
    ASSERT_OK(khub_cache_quarantine_list(hub, NULL, NULL, NULL, &n));
    ASSERT_EQ(n, 0);
    /* a marker that cannot be removed (a folder in its place): IO, named */
    char inner[800];
    snprintf(inner, sizeof inner, "%s/x", marker);
    fx_write(inner, "x", 1);
    ASSERT_STATUS(khub_cache_quarantine_clear(hub, NULL, NULL, NULL, &n), KHUB_STATUS_IO);
    char want[800];
    snprintf(want, sizeof want, "cannot remove %s: ", marker);
    ASSERT_CONTAINS(khub_hub_errmsg(hub), want);
    khub_hub_free(hub);
    pub_done(&p);
}

TEST_IMPL(cache_misuse)
{
    khub_cache_report *r = (khub_cache_report *)1;
    ASSERT_STATUS(khub_cache_scan(NULL, &r), KHUB_STATUS_MISUSE);
    ASSERT(r == NULL);
    ASSERT_STR_EQ(khub_last_error(), "khub_cache_scan: hub is NULL");
    khub_hub_opts o = {KHUB_APP_INIT(khub_hub_opts), .cache_dir = "/nonexistent/khub-cache",
                       .token = "", .offline = 1};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    uint64_t checked = 0;
    ASSERT_STATUS(khub_cache_verify(hub, NULL, NULL, NULL, &checked, NULL), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(khub_last_error(), "khub_cache_verify: bad is NULL");
    ASSERT_STATUS(khub_cache_prune(hub, 0, NULL, NULL, NULL), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(khub_last_error(), "khub_cache_prune: freed is NULL");
    ASSERT_STATUS(khub_cache_quarantine_clear(hub, NULL, NULL, NULL, NULL), KHUB_STATUS_MISUSE);
    ASSERT_STR_EQ(khub_last_error(), "khub_cache_quarantine_clear: count is NULL");
    /* a cache that does not exist yet: empty, not an error */
    ASSERT_OK(khub_cache_scan(hub, &r));
    ASSERT_EQ(r->n_repos, 0);
    khub_cache_report_free(r);
    size_t n = 1;
    ASSERT_OK(khub_cache_quarantine_list(hub, NULL, NULL, NULL, &n));
    ASSERT_EQ(n, 0);
    khub_hub_free(hub);
}

#define TEST_LIST(X) \
    X(server_serves_counts_and_stops) \
    X(server_start_errors) \
    X(server_access_log_goes_to_the_callback) \
    X(server_reads_only_struct_size) \
    X(cache_scan_verify_prune) \
    X(cache_quarantine_list_and_clear) \
    X(cache_misuse)
TEST_MAIN(TEST_LIST)
