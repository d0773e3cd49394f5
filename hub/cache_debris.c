/*
 * cache_debris.c: the debris of interrupted downloads in a repo folder of
 * the cache, which `khub cache verify` reports and `khub cache prune`
 * removes (cache_admin.h, khub__cache_debris_walk).
 */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_admin.h"

#define MAX_DEPTH 64

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[n] == '\0';
}

/* ======================================================================== */
/* Temporary names                                                          */
/* ======================================================================== */

/* Debris of interrupted downloads (issue 10 item 7). khub makes its
 * temporaries in <repo>/.khub-tmp/ (khub__cache_tmp_path), where nothing
 * verifies; there only a stale one is debris (an in-flight one is not).
 * Older versions made them inside the folders: a "<file>.<8hex>.tmp" link
 * in a snapshot folder, a ".<variant>.<pid>.tmp" folder in
 * khub-variants/<commit>/. Nothing makes those any more, so each one is
 * debris, and one inside a variant folder keeps that variant from
 * verifying for good. */

static void tmp_found(khub__tmp_walk *w, const char *path, const char *why)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    uint64_t bytes = khub__cache_du(path, 0);
    char detail[200];
    snprintf(detail, sizeof detail, "%s; %llu bytes", why, (unsigned long long)bytes);
    if (!w->n++) snprintf(w->first, sizeof w->first, "%s", path);
    w->bytes += bytes;
    if (w->fn) w->fn(w->ud, w->kind, path, detail);
    if (!w->remove || w->dry_run) return;
    if (S_ISDIR(sb.st_mode))
        khub__rmtree(path);
    else
        unlink(path);
}

/* "<name>.<8hex>.tmp", the snapshot temporaries of older versions. */
static int legacy_snapshot_tmp(const char *nm)
{
    size_t n = strlen(nm);
    if (n < 14 || strcmp(nm + n - 4, ".tmp") || nm[n - 13] != '.') return 0;
    char hex[9];
    memcpy(hex, nm + n - 12, 8);
    hex[8] = '\0';
    return is_hex(hex, 8);
}

static void tmp_walk_snapshot(khub__tmp_walk *w, const char *dir, int depth)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && depth < MAX_DEPTH && (de = readdir(d))) {
        char path[KHUB__PATH_MAX];
        struct stat sb;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            !KHUB__PATHF(path, "%s/%s", dir, de->d_name) || lstat(path, &sb) != 0)
            continue;
        if (S_ISDIR(sb.st_mode))
            tmp_walk_snapshot(w, path, depth + 1);
        else if (legacy_snapshot_tmp(de->d_name))
            tmp_found(w, path,
                      "temporary link left inside a snapshot by an interrupted download; the "
                      "folder holding it does not verify");
    }
    if (d) closedir(d);
}

void khub__cache_debris_walk(khub__tmp_walk *w, const char *repo_dir)
{
    char dir[KHUB__PATH_MAX];
    DIR *d = KHUB__PATHF(dir, "%s/" KHUB__TMP_DIR, repo_dir) ? opendir(dir) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char path[KHUB__PATH_MAX];
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
            KHUB__PATHF(path, "%s/%s", dir, de->d_name) && khub__cache_tmp_stale(path, de->d_name))
            tmp_found(w, path, "temporary left by an interrupted download");
    }
    if (d) closedir(d);
    if (KHUB__PATHF(dir, "%s/snapshots", repo_dir)) tmp_walk_snapshot(w, dir, 0);
    d = KHUB__PATHF(dir, "%s/khub-variants", repo_dir) ? opendir(dir) : NULL;
    while (d && (de = readdir(d))) {
        char cdir[KHUB__PATH_MAX], path[KHUB__PATH_MAX];
        if (!is_hex(de->d_name, 40) || !KHUB__PATHF(cdir, "%s/%s", dir, de->d_name)) continue;
        DIR *c = opendir(cdir);
        struct dirent *ce;
        while (c && (ce = readdir(c))) {
            size_t n = strlen(ce->d_name);
            if (ce->d_name[0] == '.' && n > 5 && !strcmp(ce->d_name + n - 4, ".tmp") &&
                KHUB__PATHF(path, "%s/%s", cdir, ce->d_name))
                tmp_found(w, path, "archive unpacked by an interrupted download");
        }
        if (c) closedir(c);
    }
    if (d) closedir(d);
}
