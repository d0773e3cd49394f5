/*
 * hub_fixture.h: a throw-away repos folder and cache for the hub tests, and
 * an in-process `khub serve` on an ephemeral loopback port.
 *
 * Repo "org/demo": branch main and v1 -> C1, v2 -> C2, tag v1.0.0 -> C1.
 * C1 holds README.md (regular), weights.bin (LFS), build/khub1-cpu-<arch>-linux/
 * {metadata.json, libk.so} and a few nested files for tree paging.
 */
#ifndef KHUB_TESTS_HUB_FIXTURE_H
#define KHUB_TESTS_HUB_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "hub_impl.h"
#include "runner.h"
#include "server.h"

#define C1 "1111111111111111111111111111111111111111"
#define C2 "2222222222222222222222222222222222222222"

typedef struct fixture {
    char root[256];  /* temp dir */
    char repos[300]; /* served folder */
    char cache[300];
    char log[300];
    char endpoint[64];
    char variant[64];
    khub__server *srv;
    FILE *log_file; /* the access log, through the server's log callback */
} fixture;

/* The server's access log callback: one line per call into fx->log. */
static inline void fx_log_line(void *ud, khub_log_level level, const char *msg)
{
    (void)level;
    fprintf((FILE *)ud, "%s\n", msg);
    fflush((FILE *)ud);
}

static inline void fx_write(const char *path, const void *data, size_t n)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(data, 1, n, f), n);
    fclose(f);
}

static inline void fx_writef(const fixture *fx, const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", fx->repos, rel);
    fx_write(path, text, strlen(text));
}

static inline const char *fx_arch(void)
{
    static struct utsname u;
    uname(&u);
    return strcmp(u.machine, "arm64") == 0 ? "aarch64" : u.machine;
}

/* Writes the repos folder; the variant's metadata.json lists libk.so. */
static inline void fx_make_repos(fixture *fx)
{
    snprintf(fx->variant, sizeof fx->variant, "khub1-cpu-%s-linux", fx_arch());
    fx_writef(fx, "org/demo/refs.json",
              "{\"branches\":{\"main\":\"" C1 "\",\"v1\":\"" C1 "\",\"v2\":\"" C2 "\"},"
              "\"tags\":{\"v1.0.0\":\"" C1 "\"}}");
    fx_writef(fx, "org/demo/commits/" C1 "/README.md", "# demo kernel\n");
    char big[70000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (char)('a' + (i * 7) % 26);
    char path[1024];
    snprintf(path, sizeof path, "%s/org/demo/commits/" C1 "/weights.bin", fx->repos);
    fx_write(path, big, sizeof big);
    for (int i = 0; i < 5; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "org/demo/commits/" C1 "/docs/page%d.md", i);
        fx_writef(fx, rel, "page\n");
    }
    char rel[512], sha[65], meta[1024];
    const char so[] = "\x7f"
                      "ELF not really a library, but bytes to verify";
    snprintf(rel, sizeof rel, "%s/org/demo/commits/" C1 "/build/%s/libk.so", fx->repos,
             fx->variant);
    fx_write(rel, so, sizeof so - 1);
    ASSERT_OK(khub__sha256_hex(so, sizeof so - 1, sha));
    snprintf(meta, sizeof meta,
             "{\"format\":1,\"name\":\"org/demo\",\"version\":\"1.0.0\",\"major\":1,"
             "\"variant\":\"%s\",\"abi\":{\"major\":1,\"minor\":0},"
             "\"backend\":{\"type\":\"cpu\",\"archs\":[\"%s\"]},"
             "\"plugins\":[{\"file\":\"libk.so\",\"level\":\"generic\",\"cpu_features\":[]}],"
             "\"files\":{\"libk.so\":\"%s\"},"
             "\"provenance\":{\"source_commit\":\"unknown\",\"dirty\":false}}",
             fx->variant, fx_arch(), sha);
    snprintf(rel, sizeof rel, "org/demo/commits/" C1 "/build/%s/metadata.json", fx->variant);
    fx_writef(fx, rel, meta);
    snprintf(rel, sizeof rel,
             "org/demo/commits/" C1 "/build/torch212-cxx11-cu130-x86_64-linux/"
             "__init__.py");
    fx_writef(fx, rel, "# torch variant\n");
    fx_writef(fx, "org/demo/commits/" C2 "/README.md", "# demo kernel v2\n");
}

static inline void fx_init(fixture *fx, const char *faults, uint32_t page_size)
{
    memset(fx, 0, sizeof *fx);
    snprintf(fx->root, sizeof fx->root, "/tmp/khub-hubtest-XXXXXX");
    ASSERT(mkdtemp(fx->root) != NULL);
    snprintf(fx->repos, sizeof fx->repos, "%s/repos", fx->root);
    snprintf(fx->cache, sizeof fx->cache, "%s/cache", fx->root);
    snprintf(fx->log, sizeof fx->log, "%s/server.log", fx->root);
    mkdir(fx->repos, 0755);
    fx_make_repos(fx);
    ASSERT((fx->log_file = fopen(fx->log, "a")) != NULL);
    khub__server_opts so = {.dir = fx->repos,
                            .faults = faults ? faults : "",
                            .page_size = page_size,
                            .log = fx_log_line,
                            .log_ud = fx->log_file};
    ASSERT_OK(khub__server_start(&so, &fx->srv));
    snprintf(fx->endpoint, sizeof fx->endpoint, "http://127.0.0.1:%u", khub__server_port(fx->srv));
}

static inline khub_hub *fx_hub(const fixture *fx, int offline, const char *token)
{
    khub_hub_opts o = {KHUB_STRUCT_INIT(khub_hub_opts),
                       .endpoint = fx->endpoint,
                       .cache_dir = fx->cache,
                       .token = token ? token : "",
                       .offline = offline,
                       .backoff_ms = 50,
                       .max_tries = 4};
    khub_hub *hub = NULL;
    ASSERT_OK(khub_hub_new(&o, &hub));
    return hub;
}

static inline khub_hub_id fx_id(const char *text)
{
    khub_hub_id id;
    ASSERT_OK(khub_hub_id_parse(text, &id, NULL, 0));
    return id;
}

/* The server log as one string (caller frees). */
static inline char *fx_log(const fixture *fx)
{
    FILE *f = fopen(fx->log, "rb");
    if (!f) return strdup("");
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

static inline void fx_done(fixture *fx)
{
    khub__server_stop(fx->srv);
    if (fx->log_file) fclose(fx->log_file);
    khub__rmtree(fx->root);
}

#endif /* KHUB_TESTS_HUB_FIXTURE_H */
