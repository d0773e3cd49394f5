/*
 * gguf_impl.h: the GGUF reader's handle and little-endian value decoding,
 * shared by gguf.c (parse) and gguf_get.c (look-ups). Internal to
 * runtime/executor.
 */
#ifndef KHUB_RUNTIME_GGUF_IMPL_H
#define KHUB_RUNTIME_GGUF_IMPL_H

#include <string.h>

#include "gguf.h"
#include "mmap_file.h"

struct khub_gguf {
    khub_runtime *rt;    /* borrowed; allocator and messages */
    khub_mmap map;       /* owned when opened from a file; else zeroed */
    const uint8_t *base; /* the bytes (map.data or the caller's) */
    size_t size;
    char *name; /* owned: path or caller's name, for messages */
    uint32_t version;
    uint32_t alignment;
    size_t data_off; /* file offset of the data section */

    khub_gguf_kv *kvs;   /* owned [kv_cap]; keys and str_off owned too */
    size_t n_kv, kv_cap; /* pairs read so far, pairs allocated */
    uint32_t *kv_by_key; /* owned [n_kv]: indices sorted by key */

    khub_gguf_tensor *tensors; /* owned [t_cap]; names owned too */
    size_t n_tensors, t_cap;
    uint32_t *t_by_name; /* owned [n_tensors]: indices sorted by name */
};

static inline uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads an integer scalar at p. Returns 0 when t is not an integer type, 1
 * with *v set, 2 for a UINT64 above INT64_MAX. */
static inline int read_int(khub_gguf_type t, const uint8_t *p, int64_t *v)
{
    switch (t) {
    case KHUB_GGUF_UINT8: *v = p[0]; return 1;
    case KHUB_GGUF_INT8: *v = (int8_t)p[0]; return 1;
    case KHUB_GGUF_UINT16: *v = (uint16_t)(p[0] | p[1] << 8); return 1;
    case KHUB_GGUF_INT16: *v = (int16_t)(uint16_t)(p[0] | p[1] << 8); return 1;
    case KHUB_GGUF_UINT32: *v = le32(p); return 1;
    case KHUB_GGUF_INT32: *v = (int32_t)le32(p); return 1;
    case KHUB_GGUF_INT64: *v = (int64_t)le64(p); return 1;
    case KHUB_GGUF_UINT64: {
        uint64_t u = le64(p);
        if (u > INT64_MAX) return 2;
        *v = (int64_t)u;
        return 1;
    }
    default: return 0;
    }
}

/* Reads a number (integer or float) as a double; false for other types. */
static inline bool read_num(khub_gguf_type t, const uint8_t *p, double *out)
{
    if (t == KHUB_GGUF_FLOAT32) {
        uint32_t u = le32(p);
        float f;
        memcpy(&f, &u, 4);
        *out = f;
        return true;
    }
    if (t == KHUB_GGUF_FLOAT64) {
        uint64_t u = le64(p);
        memcpy(out, &u, 8);
        return true;
    }
    int64_t v;
    int r = read_int(t, p, &v);
    if (r == 1) *out = (double)v;
    if (r == 2) *out = (double)le64(p);
    return r != 0;
}

#endif /* KHUB_RUNTIME_GGUF_IMPL_H */
