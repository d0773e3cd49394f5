/*
 * budget_alloc.h: an allocator for OOM tests (khub_allocator's realloc
 * contract). It fails every allocation once allocs_left reaches 0 and tracks
 * the bytes outstanding, so a test can fail allocation k for every k and
 * assert that nothing leaks on any of those error paths.
 *
 *     budget bu = {k, 0};
 *     khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts),
 *                            .allocator = {budget_realloc, &bu}};
 */
#ifndef KHUB_TESTS_BUDGET_ALLOC_H
#define KHUB_TESTS_BUDGET_ALLOC_H

#include <stdlib.h>

typedef struct budget {
    long allocs_left; /* < 0: unlimited */
    long long live;   /* bytes outstanding */
} budget;

static inline void *budget_realloc(void *ud, void *p, size_t old_n, size_t new_n)
{
    budget *bu = ud;
    if (new_n == 0) {
        bu->live -= (long long)old_n;
        free(p);
        return NULL;
    }
    if (bu->allocs_left == 0) return NULL;
    if (bu->allocs_left > 0) bu->allocs_left--;
    void *q = realloc(p, new_n);
    if (q) bu->live += (long long)new_n - (long long)(p ? old_n : 0);
    return q;
}

#endif /* KHUB_TESTS_BUDGET_ALLOC_H */
