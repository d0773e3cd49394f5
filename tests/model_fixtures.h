/*
 * model_fixtures.h: tiny writers for synthetic GGUF and safetensors files,
 * used by test_gguf.c, test_safetensors.c, test_model_config.c and the fuzz
 * seed generator (tests/fuzz/make_seeds.c). Header-only, test code only:
 * allocation failure aborts.
 *
 *     fx_buf b = {0};
 *     fx_gguf_small(&b, FX_NONE);            // a valid 3-tensor GGUF
 *     fx_write_file("/tmp/x.gguf", &b);
 *     fx_free(&b);
 */
#ifndef KHUB_TESTS_MODEL_FIXTURES_H
#define KHUB_TESTS_MODEL_FIXTURES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fx_buf {
    uint8_t *p;
    size_t n, cap;
} fx_buf;

static inline void fx_free(fx_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

static inline void fx_put(fx_buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}

static inline void fx_u8(fx_buf *b, uint8_t v) { fx_put(b, &v, 1); }
static inline void fx_u32(fx_buf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    fx_put(b, x, 4);
}
static inline void fx_u64(fx_buf *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) fx_u8(b, (uint8_t)(v >> (8 * i)));
}
static inline void fx_f32(fx_buf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    fx_u32(b, u);
}
static inline void fx_zeros(fx_buf *b, size_t n)
{
    for (size_t i = 0; i < n; i++) fx_u8(b, 0);
}
static inline void fx_fill(fx_buf *b, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++) fx_u8(b, (uint8_t)(seed + i * 7));
}
static inline void fx_align(fx_buf *b, size_t a)
{
    while (b->n % a) fx_u8(b, 0);
}

static inline int fx_write_file(const char *path, const fx_buf *b)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = b->n ? fwrite(b->p, 1, b->n, f) : 0;
    int rc = fclose(f);
    return (w == b->n && rc == 0) ? 0 : -1;
}

static inline int fx_write_text(const char *path, const char *text)
{
    fx_buf b = {(uint8_t *)text, strlen(text), 0};
    return fx_write_file(path, &b);
}

/* ------------------------------------------------------------------------ */
/* GGUF                                                                     */
/* ------------------------------------------------------------------------ */

enum {
    FXG_U8 = 0,
    FXG_I8,
    FXG_U16,
    FXG_I16,
    FXG_U32,
    FXG_I32,
    FXG_F32,
    FXG_BOOL,
    FXG_STR,
    FXG_ARR,
    FXG_U64,
    FXG_I64,
    FXG_F64
};

static inline void fx_gstr(fx_buf *b, const char *s)
{
    fx_u64(b, strlen(s));
    fx_put(b, s, strlen(s));
}
static inline void fx_gguf_header(fx_buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    fx_put(b, "GGUF", 4);
    fx_u32(b, version);
    fx_u64(b, n_tensors);
    fx_u64(b, n_kv);
}
static inline void fx_kv_u32(fx_buf *b, const char *k, uint32_t v)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_U32);
    fx_u32(b, v);
}
static inline void fx_kv_i32(fx_buf *b, const char *k, int32_t v)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_I32);
    fx_u32(b, (uint32_t)v);
}
static inline void fx_kv_u64(fx_buf *b, const char *k, uint64_t v)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_U64);
    fx_u64(b, v);
}
static inline void fx_kv_f32(fx_buf *b, const char *k, float v)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_F32);
    fx_f32(b, v);
}
static inline void fx_kv_bool(fx_buf *b, const char *k, int v)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_BOOL);
    fx_u8(b, (uint8_t)v);
}
static inline void fx_kv_str(fx_buf *b, const char *k, const char *v)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_STR);
    fx_gstr(b, v);
}
static inline void fx_kv_arr_str(fx_buf *b, const char *k, const char *const *v, size_t n)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_ARR);
    fx_u32(b, FXG_STR);
    fx_u64(b, n);
    for (size_t i = 0; i < n; i++) fx_gstr(b, v[i]);
}
static inline void fx_kv_arr_f32(fx_buf *b, const char *k, const float *v, size_t n)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_ARR);
    fx_u32(b, FXG_F32);
    fx_u64(b, n);
    for (size_t i = 0; i < n; i++) fx_f32(b, v[i]);
}
static inline void fx_kv_arr_i32(fx_buf *b, const char *k, const int32_t *v, size_t n)
{
    fx_gstr(b, k);
    fx_u32(b, FXG_ARR);
    fx_u32(b, FXG_I32);
    fx_u64(b, n);
    for (size_t i = 0; i < n; i++) fx_u32(b, (uint32_t)v[i]);
}
static inline void fx_tensor_info(fx_buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                                  uint32_t type, uint64_t offset)
{
    fx_gstr(b, name);
    fx_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) fx_u64(b, ne[d]);
    fx_u32(b, type);
    fx_u64(b, offset);
}

/* Mutations of the small GGUF, each breaking one rule. */
typedef enum fx_gguf_mut {
    FX_NONE,
    FX_BAD_MAGIC,
    FX_VERSION_1,
    FX_BIG_ENDIAN,
    FX_DUP_KEY,
    FX_DUP_TENSOR,
    FX_BAD_VALUE_TYPE,
    FX_NESTED_ARRAY,
    FX_HUGE_KV_COUNT,
    FX_HUGE_STRING,
    FX_HUGE_ARRAY,
    FX_NDIMS_0,
    FX_NDIMS_5,
    FX_DIM_0,
    FX_DIM_OVERFLOW,
    FX_UNKNOWN_TYPE,
    FX_Q5K_TYPE,
    FX_ROW_NOT_BLOCK,
    FX_MISALIGNED,
    FX_OVERLAP,
    FX_PAST_END,
    FX_BAD_ALIGNMENT,
    FX_ALIGN_64,
    FX_BAD_BOOL,
    FX_EMPTY_KEY,
    FX_NUL_IN_NAME
} fx_gguf_mut;

/* Sizes of the small file's tensors (F32 [8], Q4_1 [64 x 2], Q8_0 [32 x 3]). */
#define FX_T0_BYTES 32u
#define FX_T1_BYTES 80u  /* 2 rows x 2 blocks x 20 */
#define FX_T2_BYTES 102u /* 3 rows x 1 block x 34 */

/* A valid little GGUF v3 (unless mut says otherwise): 6 metadata pairs
 * (string, u32, f32, bool, string array, f32 array) and three tensors. */
static inline void fx_gguf_small(fx_buf *b, fx_gguf_mut mut)
{
    uint32_t align = mut == FX_ALIGN_64 ? 64 : 32;
    uint64_t n_kv = 6 + (mut == FX_DUP_KEY || mut == FX_BAD_ALIGNMENT || mut == FX_ALIGN_64);
    uint64_t n_t = 3;
    if (mut == FX_HUGE_KV_COUNT) n_kv = UINT64_C(1) << 60;
    uint32_t version = mut == FX_VERSION_1 ? 1 : mut == FX_BIG_ENDIAN ? 0x03000000u : 3;
    fx_put(b, mut == FX_BAD_MAGIC ? "GGML" : "GGUF", 4);
    fx_u32(b, version);
    fx_u64(b, n_t);
    fx_u64(b, n_kv);

    fx_kv_str(b, mut == FX_EMPTY_KEY ? "" : "general.architecture", "llama");
    if (mut == FX_BAD_VALUE_TYPE) {
        fx_gstr(b, "test.count");
        fx_u32(b, 99);
        fx_u32(b, 7);
    } else {
        fx_kv_u32(b, "test.count", 7);
    }
    fx_kv_f32(b, "test.scale", 0.5f);
    if (mut == FX_BAD_BOOL) {
        fx_gstr(b, "test.flag");
        fx_u32(b, FXG_BOOL);
        fx_u8(b, 2);
    } else {
        fx_kv_bool(b, "test.flag", 1);
    }
    static const char *const words[] = {"<s>", "</s>", "hello", ""};
    if (mut == FX_HUGE_STRING) {
        fx_gstr(b, "test.words");
        fx_u32(b, FXG_STR);
        fx_u64(b, UINT64_C(1) << 62);
    } else if (mut == FX_HUGE_ARRAY) {
        fx_gstr(b, "test.words");
        fx_u32(b, FXG_ARR);
        fx_u32(b, FXG_STR);
        fx_u64(b, UINT64_C(1) << 61);
    } else if (mut == FX_NESTED_ARRAY) {
        fx_gstr(b, "test.words");
        fx_u32(b, FXG_ARR);
        fx_u32(b, FXG_ARR);
        fx_u64(b, 0);
    } else {
        fx_kv_arr_str(b, "test.words", words, 4);
    }
    static const float scores[] = {0.0f, -1.5f, 2.25f};
    fx_kv_arr_f32(b, "test.scores", scores, 3);
    if (mut == FX_DUP_KEY) fx_kv_u32(b, "test.count", 8);
    if (mut == FX_BAD_ALIGNMENT) fx_kv_u32(b, "general.alignment", 48);
    if (mut == FX_ALIGN_64) fx_kv_u32(b, "general.alignment", 64);

    uint64_t ne0[1] = {8};
    uint64_t ne1[2] = {64, 2};
    uint64_t ne2[2] = {32, 3};
    uint64_t o1 = 64, o2 = 64 + 96; /* 32-aligned, room for the previous tensor */
    if (align == 64) o2 = 64 + 128;
    if (mut == FX_Q5K_TYPE) o2 = 64 + 2 * 176;
    if (mut == FX_NDIMS_0 || mut == FX_NDIMS_5) {
        fx_gstr(b, "t.f32");
        fx_u32(b, mut == FX_NDIMS_0 ? 0 : 5);
        for (int i = 0; i < 5; i++) fx_u64(b, 1);
        fx_u32(b, 0);
        fx_u64(b, 0);
    } else if (mut == FX_NUL_IN_NAME) {
        fx_u64(b, 5);
        fx_put(b, "t.f\0x", 5);
        fx_u32(b, 1);
        fx_u64(b, 8);
        fx_u32(b, 0);
        fx_u64(b, 0);
    } else {
        uint64_t d0[1] = {mut == FX_DIM_0 ? 0 : 8};
        fx_tensor_info(b, "t.f32", 1, mut == FX_DIM_0 ? d0 : ne0, 0, 0);
    }
    if (mut == FX_DIM_OVERFLOW) {
        uint64_t big[4] = {64, UINT64_C(1) << 31, UINT64_C(1) << 31, UINT64_C(1) << 31};
        fx_tensor_info(b, "t.q4_1", 4, big, 3, o1);
    } else if (mut == FX_ROW_NOT_BLOCK) {
        uint64_t odd[2] = {48, 2};
        fx_tensor_info(b, "t.q4_1", 2, odd, 3, o1);
    } else {
        uint32_t type = mut == FX_UNKNOWN_TYPE ? 77 : mut == FX_Q5K_TYPE ? 13 : 3;
        uint64_t q5k[2] = {256, 2};
        fx_tensor_info(b, mut == FX_DUP_TENSOR ? "t.f32" : "t.q4_1", 2,
                       mut == FX_Q5K_TYPE ? q5k : ne1, type, mut == FX_MISALIGNED ? o1 + 4 : o1);
    }
    uint64_t off2 = mut == FX_OVERLAP ? o1 + 32 : mut == FX_PAST_END ? 4096 : o2;
    fx_tensor_info(b, "t.q8_0", 2, ne2, 8, off2);

    fx_align(b, align);
    size_t data = b->n;
    fx_fill(b, FX_T0_BYTES, 1);
    fx_zeros(b, (size_t)(data + o1 - b->n));
    fx_fill(b, mut == FX_Q5K_TYPE ? 2 * 176 : FX_T1_BYTES, 2);
    if (b->n < data + o2) fx_zeros(b, (size_t)(data + o2 - b->n));
    fx_fill(b, FX_T2_BYTES, 3);
}

/* ------------------------------------------------------------------------ */
/* safetensors                                                              */
/* ------------------------------------------------------------------------ */

/* A safetensors file from a JSON header and a data buffer of n bytes
 * (filled with a pattern). The header is padded with spaces to a multiple of
 * 8 unless pad is 0. */
static inline void fx_safetensors(fx_buf *b, const char *json, size_t data_bytes, int pad)
{
    size_t n = strlen(json);
    size_t padded = pad ? (n + 7) / 8 * 8 : n;
    fx_u64(b, padded);
    fx_put(b, json, n);
    for (size_t i = n; i < padded; i++) fx_u8(b, ' ');
    fx_fill(b, data_bytes, 5);
}

#endif /* KHUB_TESTS_MODEL_FIXTURES_H */
