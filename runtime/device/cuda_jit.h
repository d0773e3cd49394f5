/*
 * cuda_jit.h: load-time CUDA compilation with an on-disk cache
 * (runtime/device/cuda_jit.c), what plugins get as
 * host->cuda_module_compile (ABI 1.5, issue 19).
 *
 * The source is a verified file of the plugin's own variant (its artifact
 * directory); NVRTC is opened at run time (nvrtc.h); the cubin is cached
 * under the cache directory below, keyed by the SHA-256 of everything that
 * decides the output, written atomically and checked on every read.
 *
 * Environment:
 *   KHUB_CUDA_CACHE   the cache directory (default $XDG_CACHE_HOME/khub/cuda,
 *                     else $HOME/.cache/khub/cuda)
 *   KHUB_CUDA_JIT=0   turns load-time compilation off (plugins then use
 *                     their build-time PTX)
 *   KHUB_NVRTC_LIBRARY  the NVRTC library (nvrtc.h)
 */
#ifndef KHUB_RUNTIME_CUDA_JIT_H
#define KHUB_RUNTIME_CUDA_JIT_H

#include "internal.h"

/* The khub_host_api.cuda_module_compile entry: host_ctx is a
 * khub__host_ctx * naming the plugin. Statuses as khub_plugin.h says, the
 * message through khub__plugin_fail. Thread-safe (two threads compiling the
 * same key both compile; the cache keeps one). */
KHUB_INTERNAL khub_status khub__cuda_host_module_compile(void *host_ctx, int device,
                                                         const char *source,
                                                         const char *const *defines,
                                                         size_t n_defines, khub_cuda_module **out);

/* The cache directory as above, in buf; false when none can be named (no
 * KHUB_CUDA_CACHE, XDG_CACHE_HOME or HOME) or it does not fit. */
KHUB_INTERNAL bool khub__cuda_jit_cache_dir(char *buf, size_t n);

#endif /* KHUB_RUNTIME_CUDA_JIT_H */
