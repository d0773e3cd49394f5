/*
 * variant_list.c: khub_hub_variants, the build variants of a repo at a
 * commit, gathered from a tree listing (online) or the cache's snapshot
 * and unpacked archives (offline), and judged by khub__rank_variants
 * (variant_rank.c), the function the lock's ranking calls too.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hub_impl.h"
#include "variant_rank.h"

#define MAX_VARIANT_FILES 256

/* ======================================================================== */
/* The names found                                                          */
/* ======================================================================== */

/* One variant folder found, with the file names the judge reads (only for
 * a name khub__rank_wants_files). */
typedef struct found {
    char *name;
    char *files[MAX_VARIANT_FILES];
    size_t n_files;
} found;

typedef struct listing {
    found *v;
    size_t n, cap;
    const khub_allocator *a; /* the hub's */
} listing;

static void found_file(const listing *l, found *f, const char *name)
{
    if (f->n_files < MAX_VARIANT_FILES && (f->files[f->n_files] = khub__mem_strdup(l->a, name)))
        f->n_files++;
}

static void listing_free(listing *l)
{
    for (size_t i = 0; i < l->n; i++) {
        for (size_t k = 0; k < l->v[i].n_files; k++) khub__mem_free(l->v[i].files[k]);
        khub__mem_free(l->v[i].name);
    }
    khub__mem_free(l->v);
    *l = (listing){.a = l->a};
}

/* A new entry for name at the end of l; NULL when out of memory. */
static found *listing_add(listing *l, const char *name)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        found *v = khub__mem_realloc(l->a, l->v, cap * sizeof *v);
        if (!v) return NULL;
        l->v = v;
        l->cap = cap;
    }
    found *f = &l->v[l->n];
    memset(f, 0, sizeof *f);
    if (!(f->name = khub__mem_strdup(l->a, name))) return NULL;
    l->n++;
    return f;
}

/* The regular files directly in dir (a cached variant folder). */
static void files_in(const listing *l, const char *dir, found *f)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[KHUB__PATH_MAX];
        struct stat sb;
        if (de->d_name[0] != '.' && KHUB__PATHF(p, "%s/%s", dir, de->d_name) && stat(p, &sb) == 0 &&
            S_ISREG(sb.st_mode))
            found_file(l, f, de->d_name);
    }
    if (d) closedir(d);
}

/* The variant folders in dir (no dot in their names). */
static khub_status scan_dirs(khub_hub *hub, listing *l, const char *dir, const khub__rank_host *h)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    khub_status st = KHUB_STATUS_OK;
    while (d && st == KHUB_STATUS_OK && (de = readdir(d))) {
        char p[KHUB__PATH_MAX];
        struct stat sb;
        if (de->d_name[0] == '.' || !KHUB__PATHF(p, "%s/%s", dir, de->d_name)) continue;
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode) || strchr(de->d_name, '.')) continue;
        found *f = listing_add(l, de->d_name);
        if (!f) st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory listing variants");
        if (f && khub__rank_wants_files(de->d_name, h)) files_in(l, p, f);
    }
    if (d) closedir(d);
    return st;
}

/* The build/<variant>/ folders of a tree listing, with their files' names
 * when the judge reads them (one listing more, only with a CUDA driver). */
static khub_status scan_tree(khub_hub *hub, const khub_hub_id *id, const char *commit, listing *l,
                             const khub__rank_host *h)
{
    khub__tree t = {0};
    khub_status st = khub__list_tree(hub, id, commit, "build", 0, &t);
    for (size_t i = 0; st == KHUB_STATUS_OK && i < t.count; i++) {
        if (!t.items[i].is_dir) continue;
        const char *v = t.items[i].path + 6;
        found *f = listing_add(l, v);
        if (!f) st = khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory listing variants");
        if (!f || !khub__rank_wants_files(v, h)) continue;
        khub__tree vt = {0};
        st = khub__list_tree(hub, id, commit, t.items[i].path, 0, &vt);
        for (size_t k = 0; st == KHUB_STATUS_OK && k < vt.count; k++) {
            const char *slash = strrchr(vt.items[k].path, '/');
            if (!vt.items[k].is_dir) found_file(l, f, slash ? slash + 1 : vt.items[k].path);
        }
        khub__tree_free(&vt);
    }
    khub__tree_free(&t);
    return st;
}

/* ======================================================================== */
/* khub_hub_variants                                                        */
/* ======================================================================== */

void khub_hub_variant_list_free(khub_hub_variant_list *list)
{
    if (!list) return;
    khub__mem_free(list->items);
    khub__mem_free(list);
}

static khub_status rank_listing(khub_hub *hub, const listing *l, const khub__rank_host *h,
                                khub_hub_variant_list **out)
{
    khub__rank_input *in = khub__mem_calloc(l->a, l->n ? l->n : 1, sizeof *in);
    if (!in) return khub__hub_fail(hub, KHUB_STATUS_NOMEM, "out of memory listing variants");
    for (size_t i = 0; i < l->n; i++)
        in[i] =
            (khub__rank_input){l->v[i].name, (const char *const *)l->v[i].files, l->v[i].n_files};
    khub_status st = khub__rank_variants(l->a, in, l->n, h, out);
    khub__mem_free(in);
    return st == KHUB_STATUS_OK ? st : khub__hub_fail(hub, st, "%s", khub_last_error());
}

khub_status khub_hub_variants(khub_hub *hub, const khub_hub_id *id, const char *commit,
                              khub_hub_variant_list **out)
{
    return khub__hub_variants_gpu(hub, id, commit, -1, out);
}

khub_status khub__hub_variants_gpu(khub_hub *hub, const khub_hub_id *id, const char *commit,
                                   int gpu, khub_hub_variant_list **out)
{
    if (!hub || !id || !commit || !out)
        return khub__fail(NULL, KHUB_STATUS_MISUSE, "khub_hub_variants: NULL argument");
    khub__hub_clear(hub);
    *out = NULL;
    if (!khub__is_commit_hex(commit))
        return khub__hub_fail(hub, KHUB_STATUS_INVALID_ARG, "variants need a 40-hex commit");
    khub__rank_host h;
    khub__rank_host_detect(&h);
    khub__rank_host_only_gpu(&h, gpu);
    listing l = {.a = khub__hub_alloc(hub)};
    char repo_dir[KHUB__PATH_MAX], dir[KHUB__PATH_MAX];
    khub_status st = khub__cache_repo_dir(hub, id, repo_dir, sizeof repo_dir);
    if (st == KHUB_STATUS_OK && hub->offline) {
        if (KHUB__PATHF(dir, "%s/snapshots/%s/build", repo_dir, commit))
            st = scan_dirs(hub, &l, dir, &h);
        if (st == KHUB_STATUS_OK && KHUB__PATHF(dir, "%s/khub-variants/%s", repo_dir, commit))
            st = scan_dirs(hub, &l, dir, &h);
    } else if (st == KHUB_STATUS_OK) {
        st = scan_tree(hub, id, commit, &l, &h);
    }
    if (st == KHUB_STATUS_OK) st = rank_listing(hub, &l, &h, out);
    listing_free(&l);
    return st;
}
