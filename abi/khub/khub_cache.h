/*
 * khub_cache.h: administration of the shared Hugging Face cache that a
 * khub_hub reads and writes (the library behind `khub cache`): what is in
 * it, whether its bytes are intact, what can be removed, and which kernel
 * builds are quarantined because they crashed a process.
 *
 *     khub_hub_opts o = {KHUB_APP_INIT(khub_hub_opts), .offline = 1};
 *     khub_hub *hub = NULL;
 *     if (khub_hub_new(&o, &hub) != KHUB_STATUS_OK)
 *         return fprintf(stderr, "%s\n", khub_last_error()), 1;
 *     khub_cache_report *r = NULL;
 *     if (khub_cache_scan(hub, &r) == KHUB_STATUS_OK)
 *         for (size_t i = 0; i < r->n_repos; i++)
 *             printf("%s %llu bytes\n", r->repos[i].id, (unsigned long long)r->repos[i].size);
 *     khub_cache_report_free(r);
 *     uint64_t checked = 0, bad = 0;
 *     if (khub_cache_verify(hub, NULL, NULL, NULL, &checked, &bad) != KHUB_STATUS_OK)
 *         fprintf(stderr, "%s\n", khub_hub_errmsg(hub));   // names the first bad file
 *     khub_hub_free(hub);
 *
 * The cache is the one khub_hub_cache_dir(hub) names: huggingface_hub's
 * layout (<type>s--<org>--<name>/{blobs,snapshots,refs}), shared with the
 * Python tools, plus khub's own khub-variants/ and khub-quarantine/ folders
 * inside each repo folder. None of these functions uses the network, so an
 * offline hub (opts.offline = 1) is the usual handle.
 *
 * Errors: every fallible function returns khub_status; the one-line message
 * is khub_hub_errmsg(hub). A NULL hub or out pointer is KHUB_STATUS_MISUSE
 * with the message in khub_last_error().
 *
 * Threading: as for khub_hub: one thread per handle. Another process may
 * download into the same cache meanwhile: scan and verify report what they
 * saw; prune leaves in-flight downloads (.incomplete files, lock files) alone.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_CACHE_H
#define KHUB_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "khub_hub.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Scan                                                                     */
/* ------------------------------------------------------------------------ */

/* One revision (snapshot folder) of a cached repo. The element types of the
 * report's arrays (this and khub_cache_repo) keep their 0.1 layout for good,
 * since callers index them; later facts would come in a parallel array that
 * the report's struct_size announces. */
typedef struct khub_cache_rev {
    char commit[41];  /* 40 hex */
    char refs[256];   /* the refs naming it, "main, v1"; "" = detached (prune removes it) */
    uint64_t n_files; /* files in the snapshot */
    uint64_t size;    /* bytes of those files */
} khub_cache_rev;

/* One repo folder of the cache. */
typedef struct khub_cache_repo {
    char folder[300];     /* "kernels--org--name" */
    char type[16];        /* "kernel", "model", "dataset" or "space" */
    char id[200];         /* "org/name" */
    uint64_t size;        /* bytes on disk: blobs/, khub-variants/ and snapshot
                             entries that are copies rather than blob links */
    uint64_t n_blobs;     /* files in blobs/ */
    khub_cache_rev *revs; /* [n_revs], by commit; owned by the report */
    size_t n_revs;
    char warnings[512]; /* "; "-separated (broken links, refs to missing
                           snapshots, leftovers), "" if none */
} khub_cache_repo;

/* What khub_cache_scan found. Allocated by khub; struct_size says which
 * fields this library fills (all of 0.1's). */
typedef struct khub_cache_report {
    KHUB_STRUCT_HEADER;
    khub_cache_repo *repos; /* [n_repos], by folder name; owned by the report */
    size_t n_repos;
    uint64_t size; /* sum of the repos' sizes, bytes */
    /* End of 0.1. */
} khub_cache_report;

/* Scans the cache of hub: every repo folder (kernels--, models--, datasets--,
 * spaces--) with its blobs, revisions and the refs naming them, sizes, and
 * warnings; the listing of `khub cache ls` and `hf cache scan`. A cache
 * folder that does not exist yet is an empty report. *out is set on success
 * and freed with khub_cache_report_free. Statuses: MISUSE, NOMEM, IO.
 * Since 0.1. */
KHUB_API khub_status khub_cache_scan(khub_hub *hub, khub_cache_report **out);
/* Frees a report from khub_cache_scan. Accepts NULL. Since 0.1. */
KHUB_API void khub_cache_report_free(khub_cache_report *report);

/* ------------------------------------------------------------------------ */
/* Verify and prune                                                         */
/* ------------------------------------------------------------------------ */

/* Called once per finding. kind is, for khub_cache_verify, "corrupt" (a blob
 * whose content does not match its name), "unchecked" (a copied snapshot file
 * with no tree listing to check it against) or "stale" (a temporary name an
 * interrupted download left); for khub_cache_prune, what was removed (or
 * would be, with dry_run): "snapshot", "blob", "tree", "no_exist",
 * "variants" or "temporary". path is the absolute path, detail one line of
 * explanation. All three are borrowed for the call. */
typedef void (*khub_cache_item_fn)(void *ud, const char *kind, const char *path,
                                   const char *detail);

/* Re-hashes every blob of every repo, or only of repo ("org/name" or a folder
 * name such as "models--org--name"; NULL = all), against its name: 64 hex =
 * SHA-256 of the content, 40 hex = git blob SHA-1; snapshot files that are
 * copies (HF_HUB_DISABLE_SYMLINKS) are checked against trees/<commit>.json.
 * fn (may be NULL) hears of each finding; *checked and *bad (both required)
 * get the counts of files hashed and found corrupt, also on failure.
 * Partial downloads (.incomplete) are not checked. Statuses:
 * DIGEST_MISMATCH when a file is corrupt (the message names the first and
 * the count; delete and download again), IO when none is but stale
 * temporaries are there (run khub_cache_prune), NOT_FOUND when repo matches
 * no repo ("cache verify: no repo org/x in <dir> (see khub cache ls)"),
 * MISUSE. Since 0.1. */
KHUB_API khub_status khub_cache_verify(khub_hub *hub, const char *repo, khub_cache_item_fn fn,
                                       void *ud, uint64_t *checked, uint64_t *bad);

/* Removes snapshots that no ref names, then blobs that no remaining snapshot
 * links to (symlink or hard link) with the trees/, .no_exist/ and
 * khub-variants/ entries of the removed snapshots, then temporary names left
 * by interrupted downloads. Only names under the cache root are removed and
 * symlinks are never followed. With dry_run nonzero nothing is removed and fn
 * still hears of each. fn may be NULL; *freed (required) gets the bytes
 * removed, or that would be. Statuses: IO, MISUSE. Since 0.1. */
KHUB_API khub_status khub_cache_prune(khub_hub *hub, int32_t dry_run, khub_cache_item_fn fn,
                                      void *ud, uint64_t *freed);

/* ------------------------------------------------------------------------ */
/* Quarantined kernel builds                                                */
/* ------------------------------------------------------------------------ */

/* A kernel build that crashed (a fatal signal) or called exit() during a
 * call is marked in the cache, at <repo folder>/khub-quarantine/<commit>/
 * <variant>; loading it again fails with KHUB_STATUS_QUARANTINED unless
 * KHUB_OPT_ALLOW_QUARANTINED is set. A new commit of the repo is not
 * affected. */

/* One marker: repo "org/name", commit (40 hex), variant folder name, and what
 * happened ("SIGSEGV in plugin ..."; control characters shown as '?'). All
 * borrowed for the call. */
typedef void (*khub_cache_quarantine_fn)(void *ud, const char *repo, const char *commit,
                                         const char *variant, const char *why);

/* Calls fn (may be NULL) for every quarantine marker in hub's cache, or only
 * repo's ("org/name"; NULL = all), in folder order; *count (required) gets
 * the number. No marker is a success with *count 0. Statuses: MISUSE.
 * Since 0.1. */
KHUB_API khub_status khub_cache_quarantine_list(khub_hub *hub, const char *repo,
                                                khub_cache_quarantine_fn fn, void *ud,
                                                size_t *count);
/* As khub_cache_quarantine_list, and removes each marker after fn heard of
 * it, so those builds load again. Statuses: IO (a marker that cannot be
 * removed; the others are still removed), MISUSE. Since 0.1. */
KHUB_API khub_status khub_cache_quarantine_clear(khub_hub *hub, const char *repo,
                                                 khub_cache_quarantine_fn fn, void *ud,
                                                 size_t *count);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_CACHE_H */
