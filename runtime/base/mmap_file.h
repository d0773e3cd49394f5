/*
 * mmap_file.h: a whole file mapped read-only, shared by the model parsers
 * (gguf.c, safetensors.c).
 *
 *     khub_mmap m;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__mmap_open(rt, path, &m));
 *     ... m.data[0 .. m.size) ...
 *     khub__mmap_close(rt, &m);
 *
 * The mapping is MAP_PRIVATE and PROT_READ: writing through it faults. Bytes
 * read from it are untrusted input; the file can also change under the
 * mapping if another process truncates it (SIGBUS), which khub accepts as the
 * same hazard every mmapping loader has (llama.cpp, safetensors).
 */
#ifndef KHUB_RUNTIME_MMAP_FILE_H
#define KHUB_RUNTIME_MMAP_FILE_H

#include "internal.h"

typedef struct khub_mmap {
    const uint8_t *data; /* borrowed from the mapping; NULL when size is 0 */
    size_t size;         /* bytes */
    char *path;          /* owned (rt's allocator): the path given to open */
} khub_mmap;

/* Maps path read-only. A regular file only (a folder or a device is
 * KHUB_STATUS_IO); an empty file gives data NULL, size 0. Errors: MISUSE,
 * IO ("<path>: cannot open: <reason>"), NOMEM. On error *out is zeroed. */
KHUB_INTERNAL khub_status khub__mmap_open(khub_runtime *rt, const char *path, khub_mmap *out);

/* Unmaps and frees m's path; m is zeroed. NULL or a zeroed m is fine. */
KHUB_INTERNAL void khub__mmap_close(khub_runtime *rt, khub_mmap *m);

#endif /* KHUB_RUNTIME_MMAP_FILE_H */
