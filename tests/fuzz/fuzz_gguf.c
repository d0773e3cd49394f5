/* fuzz_gguf.c: libFuzzer target for the GGUF reader and the GGUF half of the
 * model config. Any input may be rejected; none may crash, leak or read out
 * of bounds. Every accessor is exercised on what open accepts. */
#include <stdint.h>
#include <string.h>

#include "gguf.h"
#include "model_config.h"

static volatile uint8_t sink;

static void walk_kv(const khub_gguf *g, const khub_gguf_kv *kv)
{
    int64_t i64;
    uint32_t u32;
    double f64;
    bool b;
    const char *s;
    size_t len;
    (void)khub__gguf_get_i64(g, kv->key, &i64);
    (void)khub__gguf_get_u32(g, kv->key, &u32);
    (void)khub__gguf_get_f64(g, kv->key, &f64);
    (void)khub__gguf_get_bool(g, kv->key, &b);
    if (khub__gguf_get_str(g, kv->key, &s, &len) == KHUB_STATUS_OK && len) sink ^= s[len - 1];
    if (kv->type != KHUB_GGUF_ARRAY) return;
    for (uint64_t i = 0; i < kv->count && i < 4096; i++) {
        float f;
        (void)khub__gguf_arr_i64(g, kv, i, &i64);
        (void)khub__gguf_arr_f32(g, kv, i, &f);
        if (khub__gguf_arr_str(g, kv, i, &s, &len) == KHUB_STATUS_OK && len) sink ^= s[len - 1];
    }
    (void)khub__gguf_arr_i64(g, kv, kv->count, &i64); /* out of range: refused */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    khub_gguf *g = NULL;
    if (khub__gguf_open_mem(NULL, "fuzz.gguf", data, size, &g) != KHUB_STATUS_OK) return 0;
    for (size_t i = 0; i < khub__gguf_kv_count(g); i++) walk_kv(g, khub__gguf_kv_at(g, i));
    for (size_t i = 0; i < khub__gguf_tensor_count(g); i++) {
        const khub_gguf_tensor *t = khub__gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        sink ^= p[0] ^ p[t->nbytes - 1]; /* open promised these bytes exist */
        khub_dtype dt;
        (void)khub__gguf_tensor_dtype(g, t, &dt);
        if (khub__gguf_tensor_find(g, t->name) != t) __builtin_trap();
    }
    khub_model_config cfg;
    (void)khub__model_config_from_gguf(NULL, g, &cfg);
    khub__gguf_close(g);
    return 0;
}
