/*
 * name_index.c: lookup by name in a table of records through an index of
 * the records sorted by name (GGUF tensors, safetensors tensors).
 */
#include <string.h>

#include "internal.h"

const void *khub__name_index_find(const void *items, size_t elem_size, const uint32_t *order,
                                  size_t n, const char *name)
{
    if (!name || !order) return NULL;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *rec = (const char *)items + (size_t)order[mid] * elem_size;
        const char *rec_name;
        memcpy(&rec_name, rec, sizeof rec_name);
        int c = strcmp(rec_name, name);
        if (c == 0) return rec;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
