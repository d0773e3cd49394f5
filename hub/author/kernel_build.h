/*
 * kernel_build.h: `khub build DIR`: builds every variant of a kernel source
 * tree (kernel.json) into DIR/build/<variant>/ and packs each variant into
 * DIR/build/<variant>.tar.gz, the archive a hub client fetches in one
 * request.
 *
 *   - CPU: one .so per feature level (compiled with that level's -m flags)
 *     into khub<ABI>-cpu-<arch>-linux/; the loader picks the level by
 *     CPUID at run time.
 *   - CUDA: the host glue .so plus PTX for each listed compute capability
 *     (and cubins when asked), compiled with NVRTC opened at run time, into
 *     khub<ABI>-cu<NVRTC major><minor>-<arch>-linux/. Without NVRTC the CUDA
 *     variant is skipped with a warning.
 * Every .so passes the ABI gate (elf_gate.h) or the build fails. Each
 * variant gets a metadata.json (kernel_meta.h) with a SHA-256 per file and
 * provenance (source commit and dirty flag, compiler and NVRTC versions).
 */
#ifndef KHUB_HUB_KERNEL_BUILD_H
#define KHUB_HUB_KERNEL_BUILD_H

#include <stddef.h>

#include "kernel_manifest.h"

typedef void (*khub_build_progress_fn)(void *ud, const char *line);

typedef struct khub_build_opts {
    const char *cc;                  /* C compiler; NULL = $CC or "cc" */
    const char *include_dir;         /* directory holding khub/khub_plugin.h; NULL = found */
    khub_build_progress_fn progress; /* one line per step, or NULL */
    void *progress_ud;
} khub_build_opts;

#define KHUB_BUILD_MAX_VARIANTS 4

typedef struct khub_build_result {
    char variants[KHUB_BUILD_MAX_VARIANTS][96]; /* variant names built */
    size_t n_variants;
    char skipped[512]; /* why a declared variant was skipped, "" if none */
} khub_build_result;

KHUB_INTERNAL khub_status khub__kernel_build(const khub_kernel_manifest *m,
                                             const khub_build_opts *opts, khub_build_result *res,
                                             char *errbuf, size_t errbuf_size);

/* (Re)writes build_dir/<variant>.tar.gz from build_dir/<variant>/ (regular
 * files only, entries named <variant>/<file>, written to a temp file and
 * renamed). */
KHUB_INTERNAL khub_status khub__variant_pack(const char *build_dir, const char *variant,
                                             char *errbuf, size_t errbuf_size);

/* The CPU variant name of this host: "khub1-cpu-x86_64-linux". */
KHUB_INTERNAL void khub__cpu_variant_name(char *buf, size_t n);

#endif /* KHUB_HUB_KERNEL_BUILD_H */
