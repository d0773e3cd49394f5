/*
 * cache_admin.h: `khub cache ls|verify|prune`: reports on, checks and
 * trims a huggingface_hub-layout cache (hub/cache.c writes it; so does the
 * official Python client). Internal: behind khub/khub_cache.h (hub/cache_api.c)
 * and used by tests.
 *
 *   scan   repos (kernels--, models--, datasets--, spaces--), their blobs,
 *          revisions (snapshots) with the refs naming them, sizes, and
 *          warnings (broken links, refs to missing snapshots, leftovers).
 *   verify every blob re-hashed against its name: 64 hex = SHA-256 of the
 *          content, 40 hex = git blob SHA-1.
 *   prune  snapshots that no ref names, then blobs no remaining snapshot
 *          links to (and the trees/, .no_exist/ and khub-variants/ entries
 *          of removed snapshots), then the debris of interrupted downloads:
 *          stale names in .khub-tmp/ and every temporary name older
 *          versions left inside snapshot and khub-variants/ folders. Only
 *          names under the cache root are removed; symlinks are never
 *          followed when removing.
 *   verify also reports that debris (kind "stale"): a temporary name left
 *          inside a variant folder keeps the variant from verifying.
 */
#ifndef KHUB_HUB_CACHE_ADMIN_H
#define KHUB_HUB_CACHE_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include "hub_impl.h"
#include "khub/khub_cache.h"

/* The report types and the item callback are public (khub/khub_cache.h,
 * whose khub_cache_* functions wrap these). */

/* Scans hub's cache root. A missing root is an empty report. *out is freed
 * with khub__cache_report_free. Statuses: NOMEM, IO. */
KHUB_INTERNAL khub_status khub__cache_scan(khub_hub *hub, khub_cache_report **out);
KHUB_INTERNAL void khub__cache_report_free(khub_cache_report *r);

/* Re-hashes the blobs of every repo, or only of filter ("org/name" or a
 * folder name such as "models--org--name"). Counts go to *checked and
 * *bad; each corrupt blob is reported to fn. Returns DIGEST_MISMATCH when
 * any blob is corrupt (message names the first and the count), IO when
 * none is but stale temporaries are there ("run khub cache prune"),
 * NOT_FOUND when filter matches no repo. Partial downloads (.incomplete)
 * are not checked. */
KHUB_INTERNAL khub_status khub__cache_verify(khub_hub *hub, const char *filter,
                                             khub_cache_item_fn fn, void *ud, uint64_t *checked,
                                             uint64_t *bad);

/* Removes detached snapshots and unreferenced blobs (see above); with
 * dry_run nothing is removed, fn still hears of each. *freed gets the
 * bytes removed (or that would be). In-flight downloads (.incomplete) and
 * lock files are left alone. Statuses: IO. */
KHUB_INTERNAL khub_status khub__cache_prune(khub_hub *hub, int dry_run, khub_cache_item_fn fn,
                                            void *ud, uint64_t *freed);

/* ------------------------------------------------------------------------ */
/* Shared by the files of cache administration                              */
/* ------------------------------------------------------------------------ */

/* Bytes of the regular files under path (lstat: links are not followed);
 * depth: how deep path already is (the walk stops at 64). cache_admin.c. */
KHUB_INTERNAL uint64_t khub__cache_du(const char *path, int depth);

/* A walk over the debris of interrupted downloads (cache_debris.c). */
typedef struct khub__tmp_walk {
    khub_cache_item_fn fn;
    void *ud;
    const char *kind;    /* "stale" (verify) or "temporary" (prune) */
    int remove, dry_run; /* prune: remove what is found (unless dry_run) */
    uint64_t n, bytes;
    char first[KHUB__PATH_MAX];
} khub__tmp_walk;

/* The debris of one repo folder, reported to w->fn (and removed with
 * w->remove unless w->dry_run); w->n, w->bytes and w->first add it up. */
KHUB_INTERNAL void khub__cache_debris_walk(khub__tmp_walk *w, const char *repo_dir);

#endif /* KHUB_HUB_CACHE_ADMIN_H */
