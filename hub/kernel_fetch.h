/*
 * kernel_fetch.h: the hub half of khub_kernel_fetch (khub_kernels.h) that
 * the lock commands share: pinning a kernel into a lock entry, syncing a
 * locked entry into the cache, the newest v<N> of a repo, and the trust
 * policy lookup. The loading half is runtime/kernels/kernel_load.h.
 */
#ifndef KHUB_HUB_KERNEL_FETCH_H
#define KHUB_HUB_KERNEL_FETCH_H

#include "internal.h"
#include "khub/khub_hub.h"
#include "khub/khub_kernels.h"
#include "lockfile.h"
#include "trust.h"

/* Loads the policy: path if given, else $KHUB_POLICY, else the user's
 * config file when present, else the default. *used receives the file read
 * ("" for the default; 4096 bytes). */
KHUB_INTERNAL khub_status khub__policy_find(const char *path, khub_trust_policy **out,
                                            char used[4096], char *errbuf, size_t errbuf_size);

/* Resolves id (commit_pin: use this commit instead, or NULL), downloads every
 * khub-family variant of that commit (one archive request each) and fills
 * e with the pin and each variant's file digests and content hash. A
 * missing version/revision in id is pinned to the version it resolved to.
 * Errors go to hub's message. */
KHUB_INTERNAL khub_status khub__kernel_lock_entry(khub_hub *hub, const khub_hub_id *id,
                                                  const char *commit_pin, khub_lock_entry *e);

/* Downloads the locked variants of e (this host's best one and, when that
 * is not a CPU variant, its best CPU one, which model loading takes; or all
 * with all_variants) and checks them against the lock. *n_checked counts
 * the variants checked. */
KHUB_INTERNAL khub_status khub__kernel_sync_entry(khub_hub *hub, const khub_lock_entry *e,
                                                  int all_variants, size_t *n_checked);

/* The newest kernel version already in this cache for e's repo at another
 * commit than e's (the metadata.json of every snapshot and unpacked
 * variant, read without a trust decision: it only feeds khub sync's
 * downgrade warning). version[0] = 0 when no other commit holds a version
 * newer than e->kernel_version, or e has none. */
KHUB_INTERNAL khub_status khub__kernel_cached_newer(khub_hub *hub, const khub_lock_entry *e,
                                                    char version[32], char commit[41]);

/* The highest v<N> branch of the repo and its commit (one refs request);
 * *newest = -1 when it has none. */
KHUB_INTERNAL khub_status khub__kernel_newest_version(khub_hub *hub, const khub_hub_id *id,
                                                      int32_t *newest, char commit[41]);

/* Every v<N> branch's N, ascending and each once, up to cap of them (one
 * refs request). */
KHUB_INTERNAL khub_status khub__kernel_versions(khub_hub *hub, const khub_hub_id *id,
                                                int32_t *versions, size_t cap, size_t *n);

/* Ranks the locked variants of e for this host without any request: the
 * locked names and file names go through khub__rank_variants, the judge
 * the hub's listing uses (a CUDA variant's sm_XY names are matched against
 * this host's GPUs, or with gpu >= 0 against CUDA device gpu alone, as
 * khub__hub_variants_gpu). *out as khub_hub_variants, from hub's allocator
 * (hub may be NULL: the C library's). */
KHUB_INTERNAL khub_status khub__kernel_rank_locked(khub_hub *hub, const khub_lock_entry *e, int gpu,
                                                   khub_hub_variant_list **out);
#endif /* KHUB_HUB_KERNEL_FETCH_H */
