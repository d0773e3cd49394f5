/*
 * publish_collect.c: the local build `khub publish` uploads: every regular
 * file of build/<variant>/ (recursively) for each variant folder holding a
 * metadata.json, and build/<variant>.tar.gz next to it, each hashed
 * (SHA-256 and git blob SHA-1). A symlink or an unsafe name fails.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "publish_impl.h"

#define MAX_FILES 10000

static khub_status add_file(khub__pub *p, const char *rel, const char *path)
{
    khub_hub *hub = p->hub;
    struct stat sb;
    if (!khub__path_is_safe(rel))
        return khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH, "%s is not a safe repo path; rename it",
                              rel);
    if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return khub__hub_fail(hub, KHUB_STATUS_UNSAFE_PATH,
                              "%s is not a regular file (symlinks are not published); "
                              "rebuild with khub build",
                              path);
    if (p->n == MAX_FILES)
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "more than %d files in build/", MAX_FILES);
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 32;
        khub__pub_file *v = khub__mem_realloc(khub__hub_alloc(hub), p->files, cap * sizeof *v);
        if (!v) return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory");
        p->files = v;
        p->cap = cap;
    }
    khub__pub_file *f = &p->files[p->n];
    memset(f, 0, sizeof *f);
    if (!KHUB__PATHF(f->rel, "%s", rel) || !KHUB__PATHF(f->path, "%s", path))
        return khub__hub_fail(hub, KHUB_STATUS_OVERFLOW, "path too long: %s", rel);
    f->size = (uint64_t)sb.st_size;
    if (khub__sha256_file_hex(path, f->sha256) != KHUB_STATUS_OK ||
        khub__git_blob_sha1_file(path, f->sha1) != KHUB_STATUS_OK)
        return khub__hub_fail(hub, KHUB_STATUS_IO, "cannot read %s", path);
    p->n++;
    return KHUB_STATUS_OK;
}

static khub_status add_tree(khub__pub *p, const char *dir, const char *rel, int depth)
{
    DIR *d = opendir(dir);
    if (!d) return khub__hub_fail(p->hub, KHUB_STATUS_IO, "cannot open %s", dir);
    khub_status st =
        depth > 32 ? khub__hub_fail(p->hub, KHUB_STATUS_OVERFLOW, "%s is nested too deep", dir)
                   : KHUB_STATUS_OK;
    struct dirent *de;
    while (st == KHUB_STATUS_OK && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char path[KHUB__PATH_MAX], r2[1024];
        struct stat sb;
        if (!KHUB__PATHF(path, "%s/%s", dir, de->d_name) ||
            !KHUB__PATHF(r2, "%s/%s", rel, de->d_name)) {
            st = khub__hub_fail(p->hub, KHUB_STATUS_OVERFLOW, "path too long in %s", dir);
        } else if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            st = add_tree(p, path, r2, depth + 1);
        } else {
            st = add_file(p, r2, path);
        }
    }
    closedir(d);
    return st;
}

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const khub__pub_file *)a)->rel, ((const khub__pub_file *)b)->rel);
}

khub_status khub__publish_collect(khub__pub *p, const char *dir)
{
    char build[KHUB__PATH_MAX];
    if (!KHUB__PATHF(build, "%s/build", dir))
        return khub__hub_fail(p->hub, KHUB_STATUS_OVERFLOW, "path too long: %s", dir);
    DIR *d = opendir(build);
    if (!d)
        return khub__hub_fail(p->hub, KHUB_STATUS_NOT_FOUND,
                              "%s has no build/ directory; run 'khub build %s' first", dir, dir);
    khub_status st = KHUB_STATUS_OK;
    struct dirent *de;
    size_t variants = 0;
    while (st == KHUB_STATUS_OK && (de = readdir(d))) {
        char vdir[KHUB__PATH_MAX], meta[KHUB__PATH_MAX], tgz[KHUB__PATH_MAX], rel[1024];
        struct stat sb;
        if (de->d_name[0] == '.' || !KHUB__PATHF(vdir, "%s/%s", build, de->d_name) ||
            lstat(vdir, &sb) != 0 || !S_ISDIR(sb.st_mode) ||
            !KHUB__PATHF(meta, "%s/metadata.json", vdir) || lstat(meta, &sb) != 0)
            continue;
        variants++;
        snprintf(rel, sizeof rel, "build/%s", de->d_name);
        st = add_tree(p, vdir, rel, 0);
        if (st == KHUB_STATUS_OK && KHUB__PATHF(tgz, "%s.tar.gz", vdir) && lstat(tgz, &sb) == 0) {
            snprintf(rel, sizeof rel, "build/%s.tar.gz", de->d_name);
            st = add_file(p, rel, tgz);
        }
    }
    closedir(d);
    if (st == KHUB_STATUS_OK && variants == 0)
        st = khub__hub_fail(p->hub, KHUB_STATUS_NOT_FOUND,
                            "%s/build has no variant with a metadata.json; run 'khub "
                            "build %s' first",
                            dir, dir);
    if (st == KHUB_STATUS_OK) qsort(p->files, p->n, sizeof *p->files, cmp_file);
    p->res->n_files = p->n;
    return st;
}
