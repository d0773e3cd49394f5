/*
 * lockfile.h: khub.lock, the verified pins of a project's kernels, and the
 * import of the Python `kernels` library's kernels.lock
 * (docs/lockfile.md has the format and the content hash).
 *
 *     {"format": 1,
 *      "kernels": [
 *        {"repo": "kernels-community/rmsnorm", "version": 1,
 *         "commit": "<40 hex>", "kernel_version": "1.0.0",
 *         "variants": {
 *           "khub1-cpu-x86_64-linux": {
 *             "hash": "sha256:<64 hex>",
 *             "files": {"metadata.json": "<64 hex>", "rmsnorm-avx2.so": "<64 hex>"}}}}]}
 *
 * A lock entry pins a commit; each variant pins its content: the SHA-256 of
 * every file of build/<variant>/ (metadata.json included, metadata.json.sig
 * excluded) and one hash over all of them. A locked load compares the cached
 * bytes with these digests every time, before metadata.json is read.
 */
#ifndef KHUB_HUB_LOCKFILE_H
#define KHUB_HUB_LOCKFILE_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "khub/khub_hub.h"

#define KHUB_LOCK_MAX_ENTRIES  256
#define KHUB_LOCK_MAX_VARIANTS 32
#define KHUB_LOCK_MAX_FILES    72
#define KHUB_LOCK_HASH_LEN     71 /* "sha256:" + 64 hex */

typedef struct khub_lock_file {
    char name[128];  /* plain file name inside build/<variant>/ */
    char sha256[65]; /* hex digest of its bytes */
} khub_lock_file;

typedef struct khub_lock_variant {
    char name[128];                    /* "khub1-cpu-x86_64-linux" */
    char hash[KHUB_LOCK_HASH_LEN + 1]; /* khub__lock_content_hash of files */
    khub_lock_file *files;             /* owned, [n_files] */
    size_t n_files;
} khub_lock_variant;

typedef struct khub_lock_entry {
    char repo[2 * KHUB_HUB_NAME_MAX + 2]; /* "org/name" */
    int32_t version;                      /* pinned v<N>, -1 when pinned by revision */
    char revision[KHUB_HUB_REV_MAX + 1];  /* the pinned revision, "" with a version */
    char commit[41];                      /* what the pin resolved to */
    /* metadata.json's "version" at that commit ("1.0.1"); "" when not
     * recorded (a lock from before issue 10). khub update compares it to
     * refuse a branch moved back to an older build. */
    char kernel_version[32];
    khub_lock_variant *variants; /* owned, [n_variants] */
    size_t n_variants;
} khub_lock_entry;

typedef struct khub_lock {
    khub_lock_entry *items; /* owned, [count] */
    size_t count;
} khub_lock;

/* Parses khub.lock text (hostile: sizes bounded, types checked, every digest
 * 64 hex digits, each variant's hash consistent with its files). Errors
 * name the entry and field; statuses PARSE, NOMEM. */
KHUB_INTERNAL khub_status khub__lock_parse(const char *json, size_t n, khub_lock **out,
                                           char *errbuf, size_t errbuf_size);
/* Reads and parses the file at path (NOT_FOUND when absent, IO). */
KHUB_INTERNAL khub_status khub__lock_load(const char *path, khub_lock **out, char *errbuf,
                                          size_t errbuf_size);
/* Writes lock to path atomically (temp file + rename), entries in order. */
KHUB_INTERNAL khub_status khub__lock_save(const khub_lock *lock, const char *path, char *errbuf,
                                          size_t errbuf_size);
/* An empty lock. */
KHUB_INTERNAL khub_status khub__lock_new(khub_lock **out);
KHUB_INTERNAL void khub__lock_free(khub_lock *lock);
/* The entry for "org/name", or NULL. Borrowed. */
KHUB_INTERNAL khub_lock_entry *khub__lock_find(const khub_lock *lock, const char *repo);
/* Adds e (moved in: e's arrays now belong to lock; *e is zeroed) or
 * replaces the entry of the same repo. */
KHUB_INTERNAL khub_status khub__lock_put(khub_lock *lock, khub_lock_entry *e);
KHUB_INTERNAL void khub__lock_entry_clear(khub_lock_entry *e);
/* The variant of e named name, or NULL. */
KHUB_INTERNAL const khub_lock_variant *khub__lock_variant(const khub_lock_entry *e,
                                                          const char *name);

/* The content hash of a variant: "sha256:" + hex SHA-256 over the lines
 * "<name>\0<sha256 hex>\n" of files[n], sorted by name bytewise. n may be 0.
 * Duplicate names are INVALID_ARG. out holds KHUB_LOCK_HASH_LEN + 1. */
KHUB_INTERNAL khub_status khub__lock_content_hash(const khub_lock_file *files, size_t n,
                                                  char out[KHUB_LOCK_HASH_LEN + 1]);
/* Fills v from the variant directory dir: SHA-256 of every regular file in
 * it except metadata.json.sig (a subdirectory or other entry is refused),
 * and the content hash. v->files comes from a (khub__mem_alloc; NULL = the
 * C library's). */
KHUB_INTERNAL khub_status khub__lock_variant_from_dir(const khub_allocator *a, const char *name,
                                                      const char *dir, khub_lock_variant *v,
                                                      char *errbuf, size_t errbuf_size);
/* Checks dir against v: every locked file is present with its digest, and
 * no other file (besides metadata.json.sig) is there. meta_sha256 (may be
 * NULL): the SHA-256 of the metadata.json bytes the caller read from dir
 * and goes on to use; metadata.json is then checked by it instead of being
 * read again. LOCK_MISMATCH names the file, both digests and the repo
 * label. */
KHUB_INTERNAL khub_status khub__lock_check_dir(const khub_lock_variant *v, const char *dir,
                                               const char *meta_sha256, const char *label,
                                               char *errbuf, size_t errbuf_size);
/* The part of khub__lock_check_dir a load needs before metadata.json is
 * parsed, without hashing the other files: every locked file is present,
 * no other file is there, and meta_sha256 (required here) is the locked
 * digest of metadata.json. The other files are then held to the lock by
 * khub__lock_check_table and checked against the table: the hub's check
 * (hashed unless its fingerprint sidecar vouches for them unchanged), the
 * loader's hash of the sealed plugin, an artifact's hash when it is read.
 * listed (may be NULL: dir is listed here): dir's names as the caller
 * listed them once for this check and its own (dir_list.h). */
struct khub__dir_list;
KHUB_INTERNAL khub_status khub__lock_check_names(const khub_lock_variant *v, const char *dir,
                                                 const struct khub__dir_list *listed,
                                                 const char *meta_sha256, const char *label,
                                                 char *errbuf, size_t errbuf_size);
struct khub_kmeta;
/* The parsed metadata.json m states the lock's digest for every file and
 * lists every locked file but metadata.json itself: with metadata.json's
 * bytes locked (khub__lock_check_names) this can only fail for a lock
 * edited by hand. LOCK_MISMATCH names the file and both digests. */
KHUB_INTERNAL khub_status khub__lock_check_table(const khub_lock_variant *v,
                                                 const struct khub_kmeta *m, const char *label,
                                                 char *errbuf, size_t errbuf_size);

/* The "version" of the metadata.json in the variant directory dir, into
 * out (METADATA_INVALID when it does not parse). Read without a trust
 * decision: it only feeds the downgrade check, and a load still judges the
 * signature over the same bytes. */
KHUB_INTERNAL khub_status khub__lock_version_from_dir(const khub_allocator *a, const char *dir,
                                                      char out[32], char *errbuf,
                                                      size_t errbuf_size);
/* Compares two kernel versions ("1.2.0", "1.10", "2.0.0-rc1"): dot-separated
 * numbers compared as numbers, a missing part is 0, and a pre-release
 * ("-...") sorts before its release; build metadata ("+...") is ignored.
 * Returns <0, 0 or >0; *comparable = false (and 0) when either is not of
 * that form. */
KHUB_INTERNAL int khub__lock_version_cmp(const char *a, const char *b, bool *comparable);

/* Imports the Python `kernels` kernels.lock (both its legacy array of
 * {repo_id, sha, variants} and its newer array of {dependency, lock}) as
 * entries with commits and no variants. notes receives one line per thing
 * that could not be carried over (torch variants and their git_lfs_concat
 * hashes, unknown fields), "\n"-separated. PARSE names the bad element. */
KHUB_INTERNAL khub_status khub__lock_import_python(const char *json, size_t n, khub_lock *into,
                                                   char *notes, size_t notes_size, char *errbuf,
                                                   size_t errbuf_size);

#endif /* KHUB_HUB_LOCKFILE_H */
