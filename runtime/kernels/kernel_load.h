/*
 * kernel_load.h: kernels fetched, verified and loaded by Hub ID
 * (runtime/kernels/kernel_load.c), beside the public khub_kernel_fetch.
 * Internal.
 */
#ifndef KHUB_KERNELS_KERNEL_LOAD_H
#define KHUB_KERNELS_KERNEL_LOAD_H

#include "internal.h"
#include "khub/khub_hub.h"
#include "khub/khub_kernels.h"

/* khub_kernel_fetch for a caller that can only use CPU code (the model
 * executor): among the variants that fit this host, the best CPU one, even
 * when a CUDA variant fits too (it would load and serve nothing). */
KHUB_INTERNAL khub_status khub__kernel_fetch_cpu(khub_hub *hub, khub_runtime *rt, const char *id,
                                                 const khub_kernel_opts *opts,
                                                 khub_kernel_result *out);

/* khub_kernel_fetch for a model placed on CUDA device gpu: the best CUDA
 * variant that runs on that GPU (the variants judged against it alone).
 * Without one: with strict_cuda NO_VARIANT ("R@C: no CUDA variant runs on
 * cuda:N (strict): <each CUDA variant's verdict>"); else the best CPU
 * variant is loaded and cpu_why[why_n] says why in one line (it is ""
 * when a CUDA variant was loaded). No variant at all: as khub_kernel_fetch
 * (fell_back, or NO_VARIANT with opts->strict). The load passes its strict
 * for both; a kernel swap never falls back to the reference plugin but
 * takes strict_cuda from its caller. */
KHUB_INTERNAL khub_status khub__kernel_fetch_gpu(khub_hub *hub, khub_runtime *rt, const char *id,
                                                 const khub_kernel_opts *opts, int gpu,
                                                 bool strict_cuda, khub_kernel_result *out,
                                                 char *cpu_why, size_t why_n);

/* Where a role resolved by khub__kernel_resolve_role runs: CUDA device gpu
 * of capability cc (x10, for the report); strict_cuda as in
 * khub__kernel_fetch_gpu. */
typedef struct khub__kernel_target {
    int32_t gpu, cc;
    bool strict_cuda;
} khub__kernel_target;

/* One role's name resolved as khub_model_load_hub resolves it (a built-in
 * alias, a loaded plugin's id, or a Hub ID fetched, verified and loaded
 * under k's policy and k->lock_path; for a role on a CUDA device, target
 * not NULL, the Hub ID's variant for that device as the load picks it):
 * impl[n] gets the plugin and op ("org/name:op"), *plugin the exact plugin
 * that serves it, and rep (may be NULL) the resolution lines, the role's
 * last (model_kernels.c). */
KHUB_INTERNAL khub_status khub__kernel_resolve_role(khub_hub *hub, khub_runtime *rt,
                                                    khub_kernel_role role, const char *name,
                                                    const khub_model_kernels *k,
                                                    const khub__kernel_target *target, char *impl,
                                                    size_t n, khub_plugin **plugin,
                                                    khub_model_kernels_report *rep);

#endif /* KHUB_KERNELS_KERNEL_LOAD_H */
