/*
 * kernel_manifest.h: kernels-src/<name>/kernel.json, the source manifest of
 * a kernel repo (docs/kernel-format.md describes every field).
 *
 *     {"repo": "kernels-community/rmsnorm", "major": 1, "version": "1.0.0",
 *      "ops": [{"name": "rms_norm", "kind": "norm"}],
 *      "sources": {"cpu": ["rmsnorm.c"], "cuda_host": ["rmsnorm_cuda.c"],
 *                  "cuda": ["rmsnorm.cu"]},
 *      "variants": {"cpu": [{"level": "generic", "flags": []},
 *                           {"level": "avx2", "flags": ["-mavx2", "-mfma", "-mf16c"],
 *                            "features": ["avx2", "fma", "f16c"]}],
 *                   "cuda": {"capabilities": [80, 90], "cubin": true}},
 *      "selftests": [{"op": "rms_norm", "shape": [4, 576], "dtype": "f32",
 *                     "tolerance": 1e-5}]}
 */
#ifndef KHUB_HUB_KERNEL_MANIFEST_H
#define KHUB_HUB_KERNEL_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define KHUB_KM_MAX_OPS     16
#define KHUB_KM_MAX_SOURCES 16
#define KHUB_KM_MAX_LEVELS  8
#define KHUB_KM_MAX_FLAGS   16
#define KHUB_KM_MAX_CCS     16
#define KHUB_KM_MAX_TESTS   16

typedef struct khub_km_op {
    char name[64];
    uint32_t kind; /* khub_op_kind */
} khub_km_op;

typedef struct khub_km_level {
    char name[32];                     /* "generic", "avx2", "avx512" */
    char flags[KHUB_KM_MAX_FLAGS][48]; /* extra compiler flags */
    size_t n_flags;
    uint32_t features; /* KHUB_CPU_* the level needs */
} khub_km_level;

typedef struct khub_km_selftest {
    char op[64];
    int64_t shape[6];
    size_t ndim;
    char dtype[16];   /* "f32", "f16", "q4_1", ... */
    double tolerance; /* NMSE bound against khub/ref-cpu */
} khub_km_selftest;

typedef struct khub_kernel_manifest {
    char dir[1024]; /* the kernel source directory */
    char repo[200]; /* "org/name" */
    char org[97], name[97];
    int major;        /* published to branch v<major> */
    char version[32]; /* semantic version */
    khub_km_op ops[KHUB_KM_MAX_OPS];
    size_t n_ops;
    char cpu_sources[KHUB_KM_MAX_SOURCES][128];
    size_t n_cpu_sources;
    char cuda_host_sources[KHUB_KM_MAX_SOURCES][128];
    size_t n_cuda_host_sources;
    char cuda_sources[KHUB_KM_MAX_SOURCES][128];
    size_t n_cuda_sources;
    khub_km_level levels[KHUB_KM_MAX_LEVELS];
    size_t n_levels;
    int ccs[KHUB_KM_MAX_CCS]; /* CUDA compute capabilities x10 */
    size_t n_ccs;
    int cubin; /* also build cubins for the listed capabilities */
    khub_km_selftest tests[KHUB_KM_MAX_TESTS];
    size_t n_tests;
    char glibc_ceiling[32]; /* "GLIBC_x.y" for the ABI gate; "" = its default */
    /* "abi": {"target_minor": N}: the plugin ABI minor the plugins are built
     * for (-DKHUB_PLUGIN_TARGET_MINOR=N), KHUB_ABI_MINOR_MIN..KHUB_ABI_MINOR;
     * KHUB_ABI_MINOR when kernel.json has none. */
    int target_minor;
} khub_kernel_manifest;

/* Reads dir/kernel.json. Errors name the field: "kernel.json: ops[1].kind
 * 'softmax' is not an op kind (attention, linear, qlinear, kv_cache, norm,
 * activation, rotary)". Source names must be plain relative paths inside
 * dir (no '..', not absolute). */
KHUB_PRIVATE_API khub_status khub__km_load(const char *dir, khub_kernel_manifest *out, char *errbuf,
                                           size_t errbuf_size);
KHUB_INTERNAL khub_status khub__km_parse(const char *json, size_t n, const char *dir,
                                         khub_kernel_manifest *out, char *errbuf,
                                         size_t errbuf_size);

/* Op kinds by name: khub__op_kind_from_name / khub__op_kind_name (internal.h). */
/* KHUB_CPU_* bit by name ("avx2"); 0 when unknown. */
KHUB_INTERNAL uint32_t khub__cpu_feature_from_name(const char *name);

#endif /* KHUB_HUB_KERNEL_MANIFEST_H */
