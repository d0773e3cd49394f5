/*
 * kernel_meta.h: build/<variant>/metadata.json, what a published variant
 * says about itself (docs/kernel-format.md has the schema).
 *
 *     {"format": 1, "name": "kernels-community/rmsnorm", "version": "1.0.0", "major": 1,
 *      "variant": "khub1-cpu-x86_64-linux",
 *      "abi": {"major": 1, "minor": 0},
 *      "backend": {"type": "cpu", "archs": ["x86_64"]},
 *      "plugins": [{"file": "rmsnorm-avx2.so", "level": "avx2",
 *                   "cpu_features": ["avx2", "fma", "f16c"]}],
 *      "artifacts": [{"file": "rmsnorm.sm_80.ptx", "kind": "ptx", "sm": 80, "ptx_isa": 90}],
 *      "files": {"rmsnorm-avx2.so": "<sha256 hex>", ...},
 *      "provenance": {"source_commit": "<40 hex or unknown>", "dirty": false,
 *                     "compiler": "cc (Debian 12.2.0-14) 12.2.0", "nvrtc": "13.0",
 *                     "khub": "0.1.0"}}
 *
 * Trust order: the signature over these exact bytes is checked first
 * (trust.h), then this parser runs, then every listed file's digest is
 * checked (khub__kmeta_verify_dir) before anything is loaded.
 */
#ifndef KHUB_HUB_KERNEL_META_H
#define KHUB_HUB_KERNEL_META_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define KHUB_KMETA_MAX_FILES   64
#define KHUB_KMETA_MAX_PLUGINS 16

typedef struct khub_kmeta_file {
    char name[128]; /* plain file name inside the variant directory */
    char sha256[65];
} khub_kmeta_file;

typedef struct khub_kmeta_plugin {
    char file[128];
    char level[32];
    uint32_t cpu_features; /* KHUB_CPU_* */
} khub_kmeta_plugin;

typedef struct khub_kmeta_artifact {
    char file[128];
    char kind[16]; /* "ptx" or "cubin" */
    int sm;        /* compute capability x10 it targets */
    int ptx_isa;   /* PTX ISA x10 (PTX only), 0 if not recorded */
} khub_kmeta_artifact;

typedef struct khub_kmeta {
    char name[200];
    char version[32];
    int major;
    char variant[96];
    uint16_t abi_major, abi_minor;
    char backend[16]; /* "cpu" or "cuda" */
    khub_kmeta_plugin plugins[KHUB_KMETA_MAX_PLUGINS];
    size_t n_plugins;
    khub_kmeta_artifact artifacts[KHUB_KMETA_MAX_FILES];
    size_t n_artifacts;
    khub_kmeta_file files[KHUB_KMETA_MAX_FILES];
    size_t n_files;
    char source_commit[48];
    int dirty;
} khub_kmeta;

/* Parses metadata.json bytes. Errors name the field (METADATA_INVALID). File
 * names must be plain names (no '/', no '..'). */
KHUB_INTERNAL khub_status khub__kmeta_parse(const char *json, size_t n, khub_kmeta *out,
                                            char *errbuf, size_t errbuf_size);
/* Checks every file listed against its digest in dir, and that dir holds no
 * unlisted file besides metadata.json and metadata.json.sig. Returns
 * DIGEST_MISMATCH naming the file, expected and actual digests, or
 * NOT_FOUND / METADATA_INVALID. */
KHUB_INTERNAL khub_status khub__kmeta_verify_dir(const khub_kmeta *m, const char *dir, char *errbuf,
                                                 size_t errbuf_size);
/* The digest of a listed file, or NULL. */
KHUB_INTERNAL const char *khub__kmeta_digest(const khub_kmeta *m, const char *file);
/* The best plugin file for a machine with these KHUB_CPU_* features (the
 * one needing the most features among those fully supported), or NULL. */
KHUB_INTERNAL const khub_kmeta_plugin *khub__kmeta_pick_plugin(const khub_kmeta *m,
                                                               uint32_t cpu_features);

#endif /* KHUB_HUB_KERNEL_META_H */
