/*
 * variant_rank.h: the verdict on build variants for one host, as a pure
 * function of the variants' names (and, for CUDA builds, file names) and
 * the host's capabilities. The online listing (khub_hub_variants, from a
 * tree listing or the cache) and the lock (khub__kernel_rank_locked, from
 * khub.lock's names) both call khub__rank_variants, so a locked load picks
 * the variant the listing would, without any file or request.
 */
#ifndef KHUB_HUB_VARIANT_RANK_H
#define KHUB_HUB_VARIANT_RANK_H

#include "internal.h"
#include "khub/khub_hub.h"

#define KHUB__RANK_MAX_GPUS 16

/* What a variant is judged against. Plain value. */
typedef struct khub__rank_host {
    char cpu[32];                /* uname machine, "arm64" as "aarch64" */
    char cpu_features[112];      /* "avx2 fma ..." for the CPU reason, "" = none listed */
    int cuda;                    /* driver version as 1000*major + 10*minor, 0 = none */
    int n_gpus;                  /* devices the driver reports (with cuda) */
    int cc[KHUB__RANK_MAX_GPUS]; /* their compute capabilities x10 (90 = 9.0) */
    int gpu0;                    /* the ordinal of cc[0] (not 0 for a host cut to one GPU) */
} khub__rank_host;

/* One variant to judge. files: the names of the files directly in its
 * folder (borrowed; only read for a CUDA build with a driver present, see
 * khub__rank_wants_files; NULL with n_files 0 when unknown). */
typedef struct khub__rank_input {
    const char *name;
    const char *const *files;
    size_t n_files;
} khub__rank_input;

/* This host: uname, khub_cpu_features(), and the CUDA driver through the
 * runtime's driver layer (no driver: cuda 0, no GPUs). */
KHUB_INTERNAL void khub__rank_host_detect(khub__rank_host *h);

/* h cut to CUDA device ordinal gpu alone (a model placed on it: a CUDA
 * variant must run on that GPU, not on some GPU of the host); gpu < 0
 * leaves h as it is. A gpu the driver does not report leaves no GPU, so
 * every CUDA variant is rejected ("the CUDA driver reports no GPU"). */
KHUB_INTERNAL void khub__rank_host_only_gpu(khub__rank_host *h, int gpu);

/* Whether judging name on h reads its file names (a khub CUDA build with a
 * driver present: its sm_XY artifacts are matched against the GPUs); a
 * caller may skip listing the files of any other variant. */
KHUB_INTERNAL bool khub__rank_wants_files(const char *name, const khub__rank_host *h);

/* Judges each of the n inputs on h: accepted first by rank (CUDA builds
 * before CPU builds, newest matching CUDA minor first), then rejected, ties
 * by name; each with its "accept: ..." or "reject: ..." reason. A name
 * listed twice is judged once; a name of 128 bytes or more is left out.
 * *out (from a, freed with khub_hub_variant_list_free) has best = items[0].name
 * when that is accepted, else NULL. Reads nothing but its arguments.
 * Statuses: NOMEM (message in khub_last_error()). */
KHUB_INTERNAL khub_status khub__rank_variants(const khub_allocator *a, const khub__rank_input *in,
                                              size_t n, const khub__rank_host *h,
                                              khub_hub_variant_list **out);

/* khub_hub_variants judged for CUDA device ordinal gpu alone (a model
 * placed on it): a CUDA variant is accepted only when it runs on that GPU.
 * gpu < 0: every GPU of the host, as khub_hub_variants (variant_list.c). */
KHUB_INTERNAL khub_status khub__hub_variants_gpu(khub_hub *hub, const khub_hub_id *id,
                                                 const char *commit, int gpu,
                                                 khub_hub_variant_list **out);

#endif /* KHUB_HUB_VARIANT_RANK_H */
