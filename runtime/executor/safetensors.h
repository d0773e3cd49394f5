/*
 * safetensors.h: read-only safetensors weights: one file, or a folder holding
 * model.safetensors or the shards listed by model.safetensors.index.json.
 *
 *     khub_safetensors *st = NULL;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__safetensors_open(rt, "/models/smol", &st));
 *     const khub_st_tensor *t;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__safetensors_get_weight(st, "model.norm.weight", &t));
 *     ... t->data (t->nbytes bytes), t->dtype, t->shape[0 .. t->ndim) ...
 *     khub__safetensors_close(st);
 *
 * Format (huggingface/safetensors): an 8-byte little-endian header length N
 * (khub caps it at KHUB_ST_MAX_HEADER), N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "string", ...}}
 * then the data buffer; offsets are relative to the buffer's start.
 *
 * Open validates everything before it returns: the header length against the
 * file, the JSON (strict: malformed JSON, duplicate keys, non-object entries,
 * a field of the wrong JSON type are MODEL_INVALID), each dtype name (unknown:
 * MODEL_INVALID; known but exotic ones are kept and refused by get_weight),
 * shape entries (integers 0 .. 2^53, at most KHUB_ST_MAX_DIMS, the element
 * count without overflow), numel * dtype size == end - begin, begin <= end <=
 * buffer size, and no two tensors overlapping. Holes between tensors are
 * allowed (upstream forbids them; khub only needs bounds). For a folder with
 * an index: every shard file name is a plain name in that folder
 * (UNSAFE_PATH otherwise), every tensor of weight_map is in the shard it
 * names (MODEL_INVALID "…index.json: tensor 'x' mapped to 'f' is not in that
 * file"), and no tensor appears in two shards.
 *
 * Statuses of open: TRUNCATED (file shorter than 8 bytes, header or a tensor
 * past the end), MODEL_INVALID, NOT_FOUND (a folder without
 * model.safetensors or an index; a shard file missing), UNSAFE_PATH, IO,
 * NOMEM. Messages name the file and the tensor or field.
 *
 * Layout facts for the executor: data is little-endian, row-major, compact;
 * shape[] is outermost first (PyTorch order: a Linear weight is [out, in]).
 * t->data is NOT necessarily aligned (8 + N + begin; writers pad N to a
 * multiple of 8, nothing enforces it): check before reading wider than a
 * byte in place. HF Llama/Qwen Q/K weights are unpermuted (rotate-half RoPE).
 *
 * Thread-safety: immutable after open; any number of threads may read.
 */
#ifndef KHUB_RUNTIME_SAFETENSORS_H
#define KHUB_RUNTIME_SAFETENSORS_H

#include "internal.h"

typedef struct khub_safetensors khub_safetensors;

#define KHUB_ST_MAX_DIMS   8
#define KHUB_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* bytes, as upstream */

/* safetensors dtypes (the header's names, e.g. "BF16"). */
typedef enum khub_st_dtype {
    KHUB_ST_BOOL,
    KHUB_ST_U8,
    KHUB_ST_I8,
    KHUB_ST_U16,
    KHUB_ST_I16,
    KHUB_ST_F16,
    KHUB_ST_BF16,
    KHUB_ST_U32,
    KHUB_ST_I32,
    KHUB_ST_F32,
    KHUB_ST_U64,
    KHUB_ST_I64,
    KHUB_ST_F64,
    KHUB_ST_C64,
    KHUB_ST_F8_E5M2,
    KHUB_ST_F8_E4M3,
    KHUB_ST_F8_E8M0,
    KHUB_ST_F8_E4M3FNUZ,
    KHUB_ST_F8_E5M2FNUZ,
    KHUB_ST_F6_E2M3,
    KHUB_ST_F6_E3M2,
    KHUB_ST_F4,
    KHUB_ST_DTYPE__COUNT
} khub_st_dtype;

/* One tensor. Pointers are valid until khub__safetensors_close. */
typedef struct khub_st_tensor {
    const char *name;                /* owned by the khub_safetensors, NUL-terminated */
    khub_st_dtype st_dtype;          /* as in the header */
    khub_dtype dtype;                /* khub's dtype; code KHUB_DL_OPAQUE when it has none */
    int32_t ndim;                    /* 0..KHUB_ST_MAX_DIMS (0: a scalar) */
    int64_t shape[KHUB_ST_MAX_DIMS]; /* elements, outermost first; unused entries 0 */
    int64_t n_elems;                 /* product of shape (1 for a scalar) */
    const void *data;                /* borrowed, into the shard's mapping; maybe unaligned */
    size_t nbytes;                   /* end - begin */
    uint32_t shard;                  /* index of its file (khub__safetensors_shard_path) */
} khub_st_tensor;

/* Opens path: a .safetensors file, or a folder with model.safetensors.index.json
 * (preferred when both exist) or model.safetensors. *out is owned by the
 * caller (khub__safetensors_close); NULL on error. rt may be NULL; it must
 * outlive st. */
KHUB_INTERNAL khub_status khub__safetensors_open(khub_runtime *rt, const char *path,
                                                 khub_safetensors **out);

/* As open, on one file's bytes owned by the caller (fuzzers, tests); name is
 * used in messages. data must stay valid until close. */
KHUB_INTERNAL khub_status khub__safetensors_open_mem(khub_runtime *rt, const char *name,
                                                     const void *data, size_t size,
                                                     khub_safetensors **out);

/* Unmaps and frees everything. NULL is fine. */
KHUB_INTERNAL void khub__safetensors_close(khub_safetensors *st);
/* The shard mapping that holds [p, p + n) and could give its pages back
 * (khub__mmap_droppable), or NULL (a caller's buffer is never one);
 * valid until khub__safetensors_close. */
struct khub_mmap;
KHUB_INTERNAL const struct khub_mmap *khub__safetensors_map_of(const khub_safetensors *st,
                                                               const void *p, size_t n);

/* Tensors of all shards, in shard then header order. */
KHUB_INTERNAL size_t khub__safetensors_count(const khub_safetensors *st);
KHUB_INTERNAL const khub_st_tensor *khub__safetensors_at(const khub_safetensors *st, size_t i);
/* The tensor named name, or NULL (sets no error). O(log n). */
KHUB_INTERNAL const khub_st_tensor *khub__safetensors_find(const khub_safetensors *st,
                                                           const char *name);
/* The tensor named name, for use as a weight: NOT_FOUND ("<path>: tensor 'x'
 * is missing") or, unless its dtype is F32, F16 or BF16, MODEL_UNSUPPORTED
 * ("<file>: tensor 'x' has dtype I64; weights must be F32, F16 or BF16"). */
KHUB_INTERNAL khub_status khub__safetensors_get_weight(const khub_safetensors *st, const char *name,
                                                       const khub_st_tensor **out);

/* The __metadata__ value for key in the first shard (the others' are ignored,
 * checked for shape only), or NULL. Owned by st, NUL-terminated. O(n). */
KHUB_INTERNAL const char *khub__safetensors_metadata(const khub_safetensors *st, const char *key);

KHUB_INTERNAL size_t khub__safetensors_shard_count(const khub_safetensors *st);
/* The path of shard i (as opened), or NULL when out of range. */
KHUB_INTERNAL const char *khub__safetensors_shard_path(const khub_safetensors *st, size_t i);

#endif /* KHUB_RUNTIME_SAFETENSORS_H */
