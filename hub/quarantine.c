/*
 * quarantine.c: markers of kernel builds that crashed or exited during a
 * call, checked before a cached build is loaded and listed or cleared by
 * `khub cache` (quarantine.h).
 *
 * The marker lives in the cache because the cache is what the next process
 * loads from: the host that crashed cannot refuse anything any more. It is
 * a plain file a person can read and delete; `khub cache unquarantine`
 * does that for them. A marker is advice about a build, not a trust
 * decision: it is not signed, and anyone who can write the cache can
 * remove it (as they can remove the build).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "quarantine.h"

#define QDIR "khub-quarantine"

khub_status khub__quarantine_path(khub_hub *hub, const char *repo_dir, const char *commit,
                                  const char *variant, char *buf, size_t size)
{
    if (NEVER(!repo_dir)) /* a verified variant always has its folder */
        return khub__hub_fail(hub, KHUB_STATUS_NOT_FOUND, "quarantine marker: no cache folder");
    if (!khub__is_commit_hex(commit) || !khub__path_is_safe(variant) || strchr(variant, '/'))
        return khub__hub_fail(hub, KHUB_STATUS_BAD_ID,
                              "quarantine marker: commit %.48s or variant %.128s is not a name",
                              commit, variant);
    if (!khub__concat(buf, size,
                      (const char *const[]){repo_dir, "/" QDIR "/", commit, "/", variant, NULL}))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "quarantine marker path too long");
    return KHUB_STATUS_OK;
}

/* The marker's first line into why ("" when empty); false when absent.
 * One open (which fails on the usual absent marker) and one read, without
 * a stdio stream (docs/performance.md, "Warm load, session 16"). */
static bool read_marker(const char *path, char *why, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t got = read(fd, why, n - 1);
    close(fd);
    why[got > 0 ? got : 0] = '\0';
    why[strcspn(why, "\r\n")] = '\0';
    for (char *c = why; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?'; /* printed on a terminal */
    return true;
}

khub_status khub__quarantine_gate(khub_runtime *rt, const char *repo, const char *commit,
                                  const char *variant, const char *path)
{
    char why[512];
    if (!read_marker(path, why, sizeof why)) return KHUB_STATUS_OK;
    int64_t allow = 0;
    khub_runtime_get_option(rt, KHUB_OPT_ALLOW_QUARANTINED, &allow);
    if (allow) {
        khub__log(rt, KHUB_LOG_WARN,
                  "%s@%.12s variant %s is quarantined (%s); loading it anyway as allowed", repo,
                  commit, variant, why[0] ? why : "no detail");
        return KHUB_STATUS_OK;
    }
    return khub__fail(rt, KHUB_STATUS_QUARANTINED,
                      "%s@%.12s variant %s is quarantined: it ended a process before (%s). Clear "
                      "it with khub_cache_quarantine_clear on %s to retry, or load it anyway "
                      "with KHUB_OPT_ALLOW_QUARANTINED",
                      repo, commit, variant, why[0] ? why : "no detail", repo);
}

/* "kernels--org--name" -> "org/name"; false for other folder names. */
static bool repo_of_folder(const char *folder, char *repo, size_t n)
{
    static const char *const types[] = {"kernels--", "models--"};
    for (size_t t = 0; t < 2; t++) {
        size_t len = strlen(types[t]);
        if (strncmp(folder, types[t], len) != 0) continue;
        const char *org = folder + len, *sep = strstr(org, "--");
        if (!sep || sep == org || !sep[2]) return false;
        return snprintf(repo, n, "%.*s/%s", (int)(sep - org), org, sep + 2) < (int)n;
    }
    return false;
}

typedef struct walk {
    khub_hub *hub;
    int clear;
    khub_quarantine_fn fn;
    void *ud;
    size_t count;
    khub_status st;
} walk;

/* Every marker of one commit folder. */
static void walk_commit(walk *w, const char *repo, const char *cdir, const char *commit)
{
    DIR *d = opendir(cdir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[KHUB__PATH_MAX], why[512];
        if (e->d_name[0] == '.' || !KHUB__PATHF(path, "%s/%s", cdir, e->d_name)) continue;
        if (!read_marker(path, why, sizeof why)) continue;
        w->count++;
        if (w->fn) w->fn(w->ud, repo, commit, e->d_name, why);
        if (w->clear && unlink(path) != 0 && w->st == KHUB_STATUS_OK)
            w->st = khub__hub_fail(w->hub, KHUB_STATUS_IO, "cannot remove %s: %s", path,
                                   strerror(errno));
    }
    closedir(d);
    if (w->clear) rmdir(cdir); /* only when empty */
}

static void walk_repo(walk *w, const char *repo, const char *repo_dir)
{
    char qdir[KHUB__PATH_MAX];
    if (!KHUB__PATHF(qdir, "%s/" QDIR, repo_dir)) return;
    DIR *d = opendir(qdir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char cdir[KHUB__PATH_MAX];
        if (!khub__is_commit_hex(e->d_name) || !KHUB__PATHF(cdir, "%s/%s", qdir, e->d_name))
            continue;
        walk_commit(w, repo, cdir, e->d_name);
    }
    closedir(d);
    if (w->clear) rmdir(qdir);
}

khub_status khub__quarantine_walk(khub_hub *hub, const char *repo, int clear, khub_quarantine_fn fn,
                                  void *ud, size_t *count)
{
    walk w = {.hub = hub, .clear = clear, .fn = fn, .ud = ud};
    *count = 0;
    DIR *d = opendir(hub->cache_dir);
    if (!d) return KHUB_STATUS_OK; /* no cache, no markers */
    struct dirent *e;
    while ((e = readdir(d))) {
        char name[2 * KHUB_HUB_NAME_MAX + 2], dir[KHUB__PATH_MAX];
        if (!repo_of_folder(e->d_name, name, sizeof name)) continue;
        if (repo && strcmp(repo, name) != 0) continue;
        if (!KHUB__PATHF(dir, "%s/%s", hub->cache_dir, e->d_name)) continue;
        walk_repo(&w, name, dir);
    }
    closedir(d);
    *count = w.count;
    return w.st;
}
