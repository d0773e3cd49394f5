/* fuzz_safetensors.c: libFuzzer target for the safetensors reader (one file
 * in memory). Any input may be rejected; none may crash, leak or read out of
 * bounds. */
#include <stdint.h>
#include <string.h>

#include "safetensors.h"

static volatile uint8_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    khub_safetensors *st = NULL;
    if (khub__safetensors_open_mem(NULL, "fuzz.safetensors", data, size, &st) != KHUB_STATUS_OK)
        return 0;
    for (size_t i = 0; i < khub__safetensors_count(st); i++) {
        const khub_st_tensor *t = khub__safetensors_at(st, i);
        const uint8_t *p = t->data;
        if (t->nbytes) sink ^= p[0] ^ p[t->nbytes - 1]; /* open promised these bytes exist */
        if (khub__safetensors_find(st, t->name) != t) __builtin_trap();
        const khub_st_tensor *w;
        (void)khub__safetensors_get_weight(st, t->name, &w);
    }
    (void)khub__safetensors_metadata(st, "format");
    khub__safetensors_close(st);
    return 0;
}
