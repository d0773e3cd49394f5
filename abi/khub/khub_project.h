/*
 * khub_project.h: a project's kernels: the mapping (khub.json: which kernel
 * serves each role), the lock (khub.lock: the verified pins) and what the
 * `khub lock`, `sync`, `outdated` and `update` commands do with them, as
 * library calls (docs/kernel-mapping.md and docs/lockfile.md describe the
 * files).
 *
 *     char err[KHUB_ERROR_SIZE];
 *     khub_mapping *map = NULL;
 *     khub_lock *lock = NULL;
 *     khub_hub *hub = NULL;
 *     if (khub_mapping_load("khub.json", &map, err, sizeof err) != KHUB_STATUS_OK ||
 *         khub_lock_new(&lock) != KHUB_STATUS_OK || khub_hub_new(NULL, &hub) != KHUB_STATUS_OK)
 *         return fprintf(stderr, "%s\n", khub_last_error()), 1;
 *     for (size_t i = 0; i < khub_mapping_kernel_count(map); i++) {    // khub lock
 *         khub_hub_id id;
 *         khub_lock_result r = {KHUB_APP_INIT(khub_lock_result)};
 *         khub_hub_id_parse(khub_mapping_kernel(map, i), &id, NULL, 0);
 *         if (khub_lock_kernel(hub, lock, &id, NULL, &r) != KHUB_STATUS_OK)
 *             return fprintf(stderr, "%s\n", khub_hub_errmsg(hub)), 1;
 *         printf("locked %s -> %s\n", r.pin.repo, r.pin.commit);
 *     }
 *     khub_lock_save(lock, "khub.lock", err, sizeof err);
 *     for (size_t i = 0; i < khub_lock_count(lock); i++) {              // khub sync
 *         khub_sync_result s = {KHUB_APP_INIT(khub_sync_result)};
 *         khub_lock_sync(hub, lock, i, NULL, &s);
 *     }
 *     khub_hub_free(hub);
 *     khub_lock_free(lock);
 *     khub_mapping_free(map);
 *
 * Errors: functions without a hub write a one-line message into errbuf
 * (may be NULL) and khub_last_error(); functions with a hub leave it in
 * khub_hub_errmsg(hub) (and khub_last_error()). Threading: mappings and
 * locks are plain values, used by one thread at a time; hub calls as
 * khub_hub.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_PROJECT_H
#define KHUB_PROJECT_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"
#include "khub_hub.h"
#include "khub_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* The mapping: khub.json                                                   */
/* ------------------------------------------------------------------------ */

typedef struct khub_mapping khub_mapping;

/* Parses khub.json text (json[n], not NUL-terminated). Errors name the field
 * path ("khub.json: roles.norm.cuda[1]: ..."): an unknown role, device type
 * or field, a malformed ID (BAD_ID, with its column), version and revision
 * both set, a bad capability range (PARSE). *out is freed with
 * khub_mapping_free. Thread-safe. Since 0.1. */
KHUB_API khub_status khub_mapping_parse(const char *json, size_t n, khub_mapping **out,
                                        char *errbuf, size_t errbuf_size);
/* Reads and parses the file at path; the message starts with path.
 * NOT_FOUND when it is absent, IO, and those of khub_mapping_parse.
 * Since 0.1. */
KHUB_API khub_status khub_mapping_load(const char *path, khub_mapping **out, char *errbuf,
                                       size_t errbuf_size);
/* Frees m. Accepts NULL. Since 0.1. */
KHUB_API void khub_mapping_free(khub_mapping *m);
/* The kernels m names (every role's on every device, then the
 * dependencies), each repo once, in the file's order: count, and the
 * canonical ID text of the i-th ("org/name@version=1"; owned by m, NULL
 * past the end). Since 0.1. */
KHUB_API size_t khub_mapping_kernel_count(const khub_mapping *m);
KHUB_API const char *khub_mapping_kernel(const khub_mapping *m, size_t i);
/* The kernel m names for role on a device (khub_device_type) of compute
 * capability cc (x10; ignored for the CPU): the rule of that device type
 * whose capability range holds cc, the narrowest when several do, then the
 * first written. Its canonical ID text (owned by m), or NULL when none.
 * Since 0.1. */
KHUB_API const char *khub_mapping_pick(const khub_mapping *m, khub_kernel_role role,
                                       uint32_t device_type, int32_t cc);

/* ------------------------------------------------------------------------ */
/* The lock: khub.lock                                                      */
/* ------------------------------------------------------------------------ */

typedef struct khub_lock khub_lock;

/* An empty lock (*out freed with khub_lock_free). NOMEM. Since 0.1. */
KHUB_API khub_status khub_lock_new(khub_lock **out);
/* Parses khub.lock text (json[n]; hostile input: sizes bounded, types
 * checked, every digest 64 hex digits, each variant's hash consistent with
 * its files). Errors name the entry and field; PARSE, NOMEM. Since 0.1. */
KHUB_API khub_status khub_lock_parse(const char *json, size_t n, khub_lock **out, char *errbuf,
                                     size_t errbuf_size);
/* Reads and parses the file at path: NOT_FOUND when absent, IO, and those
 * of khub_lock_parse. Since 0.1. */
KHUB_API khub_status khub_lock_load(const char *path, khub_lock **out, char *errbuf,
                                    size_t errbuf_size);
/* Writes lock to path atomically (a temporary file renamed over it), its
 * entries in order. IO. Since 0.1. */
KHUB_API khub_status khub_lock_save(const khub_lock *lock, const char *path, char *errbuf,
                                    size_t errbuf_size);
/* Frees lock. Accepts NULL. Since 0.1. */
KHUB_API void khub_lock_free(khub_lock *lock);
/* Number of kernels pinned. Since 0.1. */
KHUB_API size_t khub_lock_count(const khub_lock *lock);

/* One kernel's pin in a lock, as a copy.
 *
 * Frozen at its 0.1 layout (548 bytes): khub_lock_result holds two of it by
 * value (pin, previous), so a field appended here would move the result's
 * fields after the first one and break every 0.1 caller of khub_lock_kernel.
 * It never grows; a pin that needs more grows by a new struct (abi/ABI.md,
 * "The application API is versioned apart", rule 8; tests/test_app_structs.c
 * pins its size and the result's offsets). */
typedef struct khub_lock_pin {
    KHUB_STRUCT_HEADER;
    char repo[2 * KHUB_HUB_NAME_MAX + 2]; /* "org/name" */
    int32_t version;                      /* the pinned v<N>, -1 when pinned by revision */
    char revision[KHUB_HUB_REV_MAX + 1];  /* the pinned revision, "" with a version */
    char commit[41];                      /* what the pin resolved to, 40 hex */
    /* metadata.json's "version" at that commit ("1.0.1"), "" when the lock
     * does not record it (written before khub 0.1's downgrade check). */
    char kernel_version[32];
    uint32_t n_variants; /* khub variants locked, each with its file digests */
    uint32_t reserved;
    /* End of 0.1. Frozen: nothing is ever appended (above). */
} khub_lock_pin;

/* Copies the i-th pin into *out (its struct_size set by the caller).
 * NOT_FOUND past the end. Since 0.1. */
KHUB_API khub_status khub_lock_pin_at(const khub_lock *lock, size_t i, khub_lock_pin *out);
/* Copies the pin of repo ("org/name") into *out; NOT_FOUND when the lock
 * has none. Since 0.1. */
KHUB_API khub_status khub_lock_pin_find(const khub_lock *lock, const char *repo,
                                        khub_lock_pin *out);
/* The Hub ID a pin stands for: its repo with its version or revision
 * ("org/name@version=1"), what resolving the pin again starts from.
 * BAD_ID. Since 0.1. */
KHUB_API khub_status khub_lock_pin_id(const khub_lock_pin *pin, khub_hub_id *out);

/* Imports the Python `kernels` library's kernels.lock at path (its legacy
 * array of {repo_id, sha, variants} and its newer array of {dependency,
 * lock}) into a new lock of pins with commits and no variants: lock each
 * again with khub_lock_kernel(..., opts.commit = pin.commit) to download
 * and hash its khub variants. notes (may be NULL) receives one line per
 * thing that could not be carried over (torch variants and their hashes,
 * unknown fields), "\n"-separated. PARSE names the bad element ("PATH:
 * ..."); NOT_FOUND, IO, NOMEM. Since 0.1. */
KHUB_API khub_status khub_lock_import_python(const char *path, khub_lock **out, char *notes,
                                             size_t notes_size, char *errbuf, size_t errbuf_size);

/* ------------------------------------------------------------------------ */
/* Locking, syncing, checking for updates                                   */
/* ------------------------------------------------------------------------ */

typedef struct khub_lock_opts {
    KHUB_STRUCT_HEADER;
    /* Lock this 40-hex commit instead of resolving the pin (an import), or
     * NULL. Borrowed. */
    const char *commit;
    /* 1 = accept a pin that now resolves to an older kernel version than the
     * lock's entry for the repo (its branch was moved back); the result says
     * so. 0 = refuse it with KHUB_STATUS_DOWNGRADE. */
    int32_t allow_downgrade;
    uint32_t reserved;
    /* End of 0.1. */
} khub_lock_opts;

typedef struct khub_lock_result {
    KHUB_STRUCT_HEADER;
    khub_lock_pin pin;      /* the new pin */
    int32_t replaced;       /* 1 = the lock had an entry for the repo; previous holds it */
    int32_t downgrade;      /* 1 = pin is older than previous (allowed by opts) */
    khub_lock_pin previous; /* the entry replaced, when replaced */
    /* End of 0.1. */
} khub_lock_result;

/* Pins the kernel id into lock: resolves its revision to a commit (or takes
 * opts->commit), downloads every khub variant of that commit (one archive
 * request each) and records each file's SHA-256 and the variant's content
 * hash, then adds the pin or replaces the repo's entry. An ID without a
 * version or revision is pinned to the newest v<N> branch (else main), with
 * a warning in the log. opts may be NULL; out (struct_size set) may be
 * NULL. A pin that resolves to an older kernel version ("1.0.0") than the
 * locked one at the same version or revision is refused with
 * KHUB_STATUS_DOWNGRADE unless opts->allow_downgrade, and the lock is left
 * as it was. Statuses: those of khub_hub_resolve and
 * khub_hub_download_variant, DOWNGRADE, NOMEM. Since 0.1. */
KHUB_API khub_status khub_lock_kernel(khub_hub *hub, khub_lock *lock, const khub_hub_id *id,
                                      const khub_lock_opts *opts, khub_lock_result *out);

typedef struct khub_sync_opts {
    KHUB_STRUCT_HEADER;
    /* 1 = every locked variant (a copy for air-gapped machines); 0 = the one
     * this machine would load and, when that is not a CPU variant, its best
     * CPU one (which model loading takes). */
    int32_t all_variants;
    uint32_t reserved;
    /* End of 0.1. */
} khub_sync_opts;

typedef struct khub_sync_result {
    KHUB_STRUCT_HEADER;
    uint32_t n_checked; /* variants downloaded or found cached, all checked against the lock */
    uint32_t reserved;
    /* A newer kernel version of the repo that this cache already holds at
     * another commit (a lock moved back to an older build?), and its commit;
     * "" when none. Read without a trust decision: it is only a warning. */
    char newer_version[32];
    char newer_commit[41];
    /* End of 0.1. */
} khub_sync_result;

/* Downloads the locked commit of the lock's i-th kernel into the cache and
 * checks every file of the chosen variants against the lock (LOCK_MISMATCH
 * names the file and both digests); a cached, matching variant makes no
 * request. opts may be NULL; out (struct_size set) may be NULL. Statuses:
 * NOT_FOUND (i past the end), those of khub_hub_download_variant,
 * LOCK_MISMATCH, NO_VARIANT. Since 0.1. */
KHUB_API khub_status khub_lock_sync(khub_hub *hub, const khub_lock *lock, size_t i,
                                    const khub_sync_opts *opts, khub_sync_result *out);

typedef struct khub_outdated_result {
    KHUB_STRUCT_HEADER;
    char now[41];   /* the commit the pin resolves to now */
    int32_t moved;  /* 1 = now differs from the locked commit */
    int32_t newest; /* the repo's highest v<N> branch, -1 when it has none */
    /* v<N> branches newer than a version pin, ascending ([n_newer]; none for a
     * revision pin); at most 64 listed, newest is still the newest. */
    uint32_t n_newer;
    int32_t newer[64];
    uint32_t reserved;
    /* End of 0.1. */
} khub_outdated_result;

/* Resolves the lock's i-th pin again and lists the repo's versions (two
 * requests, none offline from refs/): whether the pin moved and which v<N>
 * branches are newer than it. Statuses: NOT_FOUND (i past the end), those
 * of khub_hub_resolve. Since 0.1. */
KHUB_API khub_status khub_lock_outdated(khub_hub *hub, const khub_lock *lock, size_t i,
                                        khub_outdated_result *out);

/* Every v<N> branch of the repo of id, ascending and each once, up to cap of
 * them in versions (one refs request); *n receives the count kept.
 * Statuses: those of khub_hub_resolve. Since 0.1. */
KHUB_API khub_status khub_kernel_versions(khub_hub *hub, const khub_hub_id *id, int32_t *versions,
                                          size_t cap, size_t *n);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_PROJECT_H */
