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
 *
 * khub__mmap_open_huge gives the same read-only view of a model's weights
 * from anonymous memory backed by 2 MiB transparent huge pages instead
 * (the file read into it once): a decode step streams every weight, and
 * with 4 KiB file pages that is one TLB miss per 4 KiB (~24,000 per token
 * for SmolLM2-135M Q4_1); docs/performance.md, "Session 18".
 */
#ifndef KHUB_RUNTIME_MMAP_FILE_H
#define KHUB_RUNTIME_MMAP_FILE_H

#include "internal.h"

typedef struct khub_mmap {
    const uint8_t *data; /* borrowed from the mapping; NULL when size is 0 */
    size_t size;         /* bytes */
    char *path;          /* owned (rt's allocator): the path given to open */
    bool huge;           /* data is khub__mmap_open_huge's anonymous copy */
} khub_mmap;

/* Maps path read-only. A regular file only (a folder or a device is
 * KHUB_STATUS_IO); an empty file gives data NULL, size 0. Errors: MISUSE,
 * IO ("<path>: cannot open: <reason>"), NOMEM. On error *out is zeroed. */
KHUB_INTERNAL khub_status khub__mmap_open(khub_runtime *rt, const char *path, khub_mmap *out);

/* As khub__mmap_open, but a file of at least 2 MiB is read into anonymous
 * memory at a 2 MiB boundary, advised MADV_HUGEPAGE and then made read-only
 * (m->huge set), when the kernel gives anonymous memory huge pages on
 * request (/sys/kernel/mm/transparent_hugepage/enabled is "always" or
 * "madvise") and the environment does not say KHUB_HUGE_PAGES=0. Otherwise
 * the file is mapped as khub__mmap_open does. The copy's pages are private
 * to the process (a mapping's page cache is shared between processes that
 * map the same file); its resident size is the file's, as a mapping whose
 * every page was read. Errors: those of khub__mmap_open, NOMEM (no
 * anonymous memory for the copy), IO ("<path>: read ...: <reason>", or the
 * file shrank while read). */
KHUB_INTERNAL khub_status khub__mmap_open_huge(khub_runtime *rt, const char *path, khub_mmap *out);

/* Gives the whole pages under [p, p + n) back to the kernel (MADV_DONTNEED,
 * after MADV_RANDOM, which keeps the kernel's fault-around from mapping
 * them again when a neighbour is read) when the range lies inside m's file
 * mapping (never a huge copy: false), and says whether it did: a copy of mapped bytes then leaves
 * no second resident copy behind (model_fuse.c). A first or last page shared with a neighbour
 * stays. The mapping is private and never written, so a later read of those pages faults the file's
 * bytes in again: nothing is lost. */
KHUB_INTERNAL bool khub__mmap_drop(const khub_mmap *m, const void *p, size_t n);
/* Whether khub__mmap_drop would give [p, p + n) back: inside m, a file
 * mapping (not a huge copy). */
KHUB_INTERNAL bool khub__mmap_droppable(const khub_mmap *m, const void *p, size_t n);

/* Unmaps and frees m's path; m is zeroed. NULL or a zeroed m is fine. */
KHUB_INTERNAL void khub__mmap_close(khub_runtime *rt, khub_mmap *m);

#endif /* KHUB_RUNTIME_MMAP_FILE_H */
