/*
 * nvrtc.h: CUDA source to PTX and cubin with NVRTC, opened at run time.
 *
 * libnvrtc is never linked: khub__nvrtc_open dlopens $KHUB_NVRTC_LIBRARY
 * when it is set (that path only; KHUB_NVRTC_PATH, its older name, is read
 * when it is not), else libnvrtc.so.13, .12, libnvrtc.so or
 * /usr/local/cuda/lib64/libnvrtc.so, and resolves the handful of functions
 * used. NVRTC compiles without a GPU, so PTX is built and checked on any
 * machine with the toolkit. Two users: `khub build` (libkhub_author, through
 * these KHUB_PRIVATE_API exports) at build time, and the load-time
 * compilation plugins ask for (cuda_jit.c, host->cuda_module_compile).
 * Without a usable library khub__nvrtc_open returns KHUB_STATUS_NO_NVRTC
 * with "NVRTC not found (...)".
 */
#ifndef KHUB_RUNTIME_NVRTC_H
#define KHUB_RUNTIME_NVRTC_H

#include <stddef.h>

#include "internal.h"

typedef struct khub_nvrtc khub_nvrtc;

KHUB_PRIVATE_API khub_status khub__nvrtc_open(khub_nvrtc **out, char *errbuf, size_t errbuf_size);
KHUB_PRIVATE_API void khub__nvrtc_close(khub_nvrtc *nv);
/* NVRTC's version, e.g. 13 and 0. */
KHUB_PRIVATE_API void khub__nvrtc_version(const khub_nvrtc *nv, int *major, int *minor);
/* The path of the library that was opened. */
KHUB_INTERNAL const char *khub__nvrtc_path(const khub_nvrtc *nv);

typedef enum khub_nvrtc_output { KHUB_NVRTC_PTX = 1, KHUB_NVRTC_CUBIN = 2 } khub_nvrtc_output;

/* Compiles src (NUL-terminated CUDA C++; kernels declared extern "C") for
 * compute capability cc (e.g. 80). PTX targets compute_<cc>, cubin sm_<cc>.
 * *out is malloc'd (PTX NUL-terminated; *out_size excludes the NUL); the
 * compiler log goes into errbuf on failure (KHUB_STATUS_ERROR). */
KHUB_PRIVATE_API khub_status khub__nvrtc_compile(khub_nvrtc *nv, const char *src, const char *name,
                                                 int cc, khub_nvrtc_output kind,
                                                 const char *const *extra_opts, size_t n_extra,
                                                 char **out, size_t *out_size, char *errbuf,
                                                 size_t errbuf_size);

#endif /* KHUB_RUNTIME_NVRTC_H */
