/*
 * plugin_artifacts.h: a plugin's verified artifact directory, what
 * host->artifact(name) serves (PTX, cubins, tables of the plugin's own
 * variant).
 *
 * The fetch pipeline (runtime/kernels/kernel_load.c) has already checked every
 * file of the variant against metadata.json; it hands the loader the list
 * of (name, path, sha256). The bytes are read on first request, hashed
 * again, and served only when they still match: the plugin gets the bytes
 * that were verified, never a file that changed after the check.
 */
#ifndef KHUB_RUNTIME_PLUGIN_ARTIFACTS_H
#define KHUB_RUNTIME_PLUGIN_ARTIFACTS_H

#include <stddef.h>

#include "internal.h"

/* One verified file of a variant. Borrowed strings. */
typedef struct khub__artifact_file {
    const char *name;   /* plain file name inside the variant directory */
    const char *path;   /* absolute path of the verified bytes */
    const char *sha256; /* 64 hex digits of those bytes */
} khub__artifact_file;

typedef struct khub__artifacts khub__artifacts;

/* Loads a plugin like khub_plugin_load (digest, ABI note, sealed memfd) and
 * gives it the artifact directory files[n] before its init runs, so
 * host->artifact works from init on. Names must be plain and unique, digests
 * 64 hex digits (INVALID_ARG otherwise). Since 0.1. */
KHUB_INTERNAL khub_status khub__plugin_load_verified(khub_runtime *rt, const char *path,
                                                     const char *sha256_hex,
                                                     const khub__artifact_file *files, size_t n,
                                                     khub_plugin **out);

/* Copies files[n] into a new artifact set (rt's allocator). On failure msg
 * names the bad entry. */
KHUB_INTERNAL khub_status khub__artifacts_new(khub_runtime *rt, const khub__artifact_file *files,
                                              size_t n, khub__artifacts **out, char *msg,
                                              size_t msg_size);
KHUB_INTERNAL void khub__artifacts_free(khub_runtime *rt, khub__artifacts *a);
/* The bytes of artifact name, read and re-verified on first use, valid until
 * the set is freed. NOT_FOUND (not in the set), DIGEST_MISMATCH (the file
 * changed since it was verified), IO, OVERFLOW, NOMEM; msg says which file.
 * Thread-safe. */
KHUB_INTERNAL khub_status khub__artifacts_get(khub_runtime *rt, khub__artifacts *a,
                                              const char *name, const void **data, size_t *size,
                                              char *msg, size_t msg_size);

#endif /* KHUB_RUNTIME_PLUGIN_ARTIFACTS_H */
