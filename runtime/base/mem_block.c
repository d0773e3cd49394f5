/*
 * mem_block.c: blocks that remember their allocator. The hub (hub/) and its
 * objects allocate through these, so that an embedder's khub_allocator
 * (khub_hub_opts.allocator, or the runtime's after khub_hub_set_runtime)
 * receives every allocation, and so that a result can be freed by a
 * function given only the result (khub_hub_variant_list_free(list), ...).
 *
 * khub_allocator's contract (lua_Alloc's) needs the old size on free and
 * realloc. The runtime tracks sizes itself (khub__free(rt, p, n)); the hub
 * has a few hundred allocations spread over lists, trees and parsed files,
 * and objects that outlive the handle that made them, so each block carries
 * a header instead, as SQLite's sqlite3MemMalloc keeps the size before the
 * block: the size and the allocator (function and ud, copied, so the handle
 * that chose it may be gone when the block is freed). Rejected: a size
 * argument at every free (the sizes of grown arrays and edited strings are
 * easy to get wrong, and only a counting allocator would notice), and one
 * allocator per process (curl's and SQLite's global hooks; STYLE.md 15).
 *
 * The header is 32 bytes, so a block keeps the 16-byte alignment that
 * malloc gives (an allocator must return memory aligned for any type, as
 * malloc does). A NULL allocator, or one whose realloc is NULL, is the C
 * library's.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct block_head {
    size_t size; /* bytes after the header */
    void *(*realloc)(void *ud, void *p, size_t old_size, size_t new_size);
    void *ud;
    size_t pad; /* keeps the header at 32 bytes */
} block_head;

_Static_assert(sizeof(block_head) == 32, "the block header keeps 16-byte alignment");

static void *libc_realloc(void *ud, void *p, size_t old_size, size_t new_size)
{
    (void)ud;
    (void)old_size;
    if (new_size == 0) {
        free(p);
        return NULL;
    }
    return realloc(p, new_size);
}

static block_head *head_of(void *p) { return (block_head *)p - 1; }

void *khub__mem_alloc(const khub_allocator *a, size_t n)
{
    size_t total;
    if (!khub__add_ok(n, sizeof(block_head), &total)) return NULL;
    void *(*fn)(void *, void *, size_t, size_t) = a && a->realloc ? a->realloc : libc_realloc;
    void *ud = a && a->realloc ? a->ud : NULL;
    block_head *h = fn(ud, NULL, 0, total);
    if (!h) return NULL;
    *h = (block_head){n, fn, ud, 0};
    return h + 1;
}

void *khub__mem_calloc(const khub_allocator *a, size_t count, size_t size)
{
    size_t n;
    if (!khub__mul_ok(count, size, &n)) return NULL;
    void *p = khub__mem_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

void *khub__mem_realloc(const khub_allocator *a, void *p, size_t n)
{
    if (!p) return khub__mem_alloc(a, n);
    size_t total;
    if (!khub__add_ok(n, sizeof(block_head), &total)) return NULL;
    block_head *h = head_of(p), old = *h;
    block_head *g = old.realloc(old.ud, h, old.size + sizeof *h, total);
    if (!g) return NULL; /* p is untouched, as with realloc */
    g->size = n;
    return g + 1;
}

void khub__mem_free(void *p)
{
    if (!p) return;
    block_head *h = head_of(p);
    h->realloc(h->ud, h, h->size + sizeof *h, 0);
}

size_t khub__mem_size(const void *p) { return p ? ((const block_head *)p - 1)->size : 0; }

char *khub__mem_strndup(const khub_allocator *a, const char *s, size_t n)
{
    if (!s) return NULL;
    size_t len = strnlen(s, n);
    char *d = khub__mem_alloc(a, len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *khub__mem_strdup(const khub_allocator *a, const char *s)
{
    return s ? khub__mem_strndup(a, s, strlen(s)) : NULL;
}

void khub__mem_wipe_free(void *p)
{
    if (!p) return;
    volatile unsigned char *v = p;
    for (size_t i = 0, n = khub__mem_size(p); i < n; i++) v[i] = 0;
    khub__mem_free(p);
}
