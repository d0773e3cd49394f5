/*
 * gguf.h: a read-only GGUF (v2 and v3, little-endian) model file.
 *
 *     khub_gguf *g = NULL;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__gguf_open(rt, "model.gguf", &g));
 *     uint32_t n_layers;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__gguf_get_u32(g, "llama.block_count", &n_layers));
 *     const khub_gguf_tensor *t = khub__gguf_tensor_find(g, "blk.0.attn_q.weight");
 *     khub_dtype dt;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__gguf_tensor_dtype(g, t, &dt));
 *     ... t->data, t->nbytes, t->ne[0] (row length) ...
 *     khub__gguf_close(g);
 *
 * Open validates the whole header before it returns, so nothing after it can
 * read out of bounds: magic, version, the counts against the file size, every
 * string and array length, key and tensor-name uniqueness, n_dims 1..4, every
 * dim >= 1 with an overflow-free element count, a known ggml type whose block
 * divides ne[0], general.alignment (a power of two, default 32), every tensor
 * offset aligned, inside the data section and not overlapping another.
 *
 * Statuses of open: TRUNCATED when the file ends before a field or a tensor's
 * bytes (every strict prefix of a valid file gets this), MODEL_INVALID for a
 * malformed field, MODEL_UNSUPPORTED for a well-formed file khub cannot read
 * (version 1, big-endian, unknown ggml type id, nested arrays), IO, NOMEM.
 * Messages name the file and the field, e.g.
 *   "model.gguf: tensor 'blk.3.attn_q.weight': offset 123456 + 884736 bytes past end
 *    of file (890000)".
 *
 * Layout facts for the executor:
 *   - ne[] is in GGUF order: ne[0] is the fastest (contiguous, row) dimension.
 *     A PyTorch weight [out, in] is stored as ne = {in, out}; rows of ne[0]
 *     elements, quantization blocks run along ne[0].
 *   - Tensor data is aligned to general.alignment inside the file and the
 *     mapping is page aligned, so t->data is aligned to it in memory.
 *   - Llama GGUFs (general.architecture "llama", also Mistral converted to
 *     llama) store attn_q.weight and attn_k.weight with their output rows
 *     permuted for interleaved (adjacent-pair, KHUB_ROPE_INTERLEAVED) RoPE, by llama.cpp's
 *     convert_hf_to_gguf.py `permute(w, n_head, n_head_kv)`:
 *         w.reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2).reshape(rows, cols)
 *     with n_head = attention.head_count for Q and attention.head_count_kv for K.
 *     With D = head_dim, head h, i in [0, D/2), s in {0, 1}:
 *         gguf_row[h*D + 2*i + s] = hf_row[h*D + s*(D/2) + i]
 *     So a GGUF llama model either runs RoPE on adjacent pairs (x[2i], x[2i+1])
 *     with frequency theta^(-2i/D), or un-permutes those rows to get HF's
 *     weights and runs rotate-half (NeoX) RoPE. Biases of Q/K (if any) are
 *     permuted the same way. Qwen2/Qwen3 GGUFs are not permuted (NeoX RoPE).
 *     khub_model_config.rope_style (model_config.h) records which applies.
 *
 * Thread-safety: a khub_gguf is immutable after open; any number of threads
 * may read it. Close it once, after every reader is done.
 */
#ifndef KHUB_RUNTIME_GGUF_H
#define KHUB_RUNTIME_GGUF_H

#include "internal.h"

typedef struct khub_gguf khub_gguf;

/* GGUF metadata value types (the file format's numbers). */
typedef enum khub_gguf_type {
    KHUB_GGUF_UINT8 = 0,
    KHUB_GGUF_INT8 = 1,
    KHUB_GGUF_UINT16 = 2,
    KHUB_GGUF_INT16 = 3,
    KHUB_GGUF_UINT32 = 4,
    KHUB_GGUF_INT32 = 5,
    KHUB_GGUF_FLOAT32 = 6,
    KHUB_GGUF_BOOL = 7,
    KHUB_GGUF_STRING = 8,
    KHUB_GGUF_ARRAY = 9,
    KHUB_GGUF_UINT64 = 10,
    KHUB_GGUF_INT64 = 11,
    KHUB_GGUF_FLOAT64 = 12,
    KHUB_GGUF_TYPE__COUNT
} khub_gguf_type;

/* ggml tensor type ids that khub maps to a dtype (the others known to ggml
 * are accepted by open, sized, and refused by khub__gguf_tensor_dtype). */
enum {
    KHUB_GGML_F32 = 0,
    KHUB_GGML_F16 = 1,
    KHUB_GGML_Q4_0 = 2,
    KHUB_GGML_Q4_1 = 3,
    KHUB_GGML_Q5_0 = 6,
    KHUB_GGML_Q5_1 = 7,
    KHUB_GGML_Q8_0 = 8,
    KHUB_GGML_Q4_K = 12,
    KHUB_GGML_Q6_K = 14,
    KHUB_GGML_BF16 = 30
};

#define KHUB_GGUF_MAX_DIMS          4
#define KHUB_GGUF_DEFAULT_ALIGNMENT 32

/* One metadata key-value pair. All pointers are valid until khub__gguf_close. */
typedef struct khub_gguf_kv {
    const char *key;         /* owned by the khub_gguf, NUL-terminated */
    khub_gguf_type type;     /* a scalar type, STRING or ARRAY */
    khub_gguf_type elem;     /* ARRAY: the element type (never ARRAY); else == type */
    uint64_t count;          /* ARRAY: number of elements; else 1 */
    const uint8_t *data;     /* borrowed, into the mapping, UNALIGNED: the scalar's bytes,
                                a string's bytes (not NUL-terminated), or an array's first
                                element (numbers packed little-endian; use memcpy) */
    uint64_t len;            /* STRING: bytes at data; ARRAY of numbers: count * elem size */
    const uint64_t *str_off; /* private: ARRAY of STRING, offsets of each u64 length prefix */
} khub_gguf_kv;

/* One tensor. All pointers are valid until khub__gguf_close. */
typedef struct khub_gguf_tensor {
    const char *name;               /* owned by the khub_gguf, NUL-terminated */
    uint32_t n_dims;                /* 1..4 */
    int64_t ne[KHUB_GGUF_MAX_DIMS]; /* elements per dim, GGUF order (ne[0] fastest);
                                       dims past n_dims are 1 */
    int64_t n_elems;                /* product of ne[] */
    uint32_t ggml_type;             /* ggml type id (KHUB_GGML_* or another known to ggml) */
    uint64_t offset;                /* bytes from the start of the data section */
    const void *data;               /* borrowed, into the mapping; aligned to alignment */
    size_t nbytes;                  /* bytes of data: (ne[0] / block) * block bytes * rows */
} khub_gguf_tensor;

/* ------------------------------------------------------------------------ */
/* Opening                                                                  */
/* ------------------------------------------------------------------------ */

/* Maps path and validates it (see the top of this file). *out is owned by
 * the caller, freed with khub__gguf_close; on error it is NULL. rt (may be
 * NULL) supplies the allocator and receives the message; it must outlive g. */
KHUB_INTERNAL khub_status khub__gguf_open(khub_runtime *rt, const char *path, khub_gguf **out);

/* As khub__gguf_open, the file read into huge-page memory where the kernel
 * gives it (khub__mmap_open_huge): for a model that streams all its weights
 * every step. */
KHUB_INTERNAL khub_status khub__gguf_open_huge(khub_runtime *rt, const char *path, khub_gguf **out);

/* As khub__gguf_open, on bytes the caller owns (fuzzers, tests). name is
 * used in messages. data must stay valid and unchanged until close. */
KHUB_INTERNAL khub_status khub__gguf_open_mem(khub_runtime *rt, const char *name, const void *data,
                                              size_t size, khub_gguf **out);

/* Unmaps and frees everything; every pointer from g dies. NULL is fine. */
KHUB_INTERNAL void khub__gguf_close(khub_gguf *g);
/* g's mapping or huge copy (zeroed when g was opened on a caller's
 * buffer), for khub__mmap_drop; valid until khub__gguf_close. */
struct khub_mmap;
KHUB_INTERNAL const struct khub_mmap *khub__gguf_map(const khub_gguf *g);

KHUB_INTERNAL const char *khub__gguf_path(const khub_gguf *g);   /* as given to open */
KHUB_INTERNAL uint32_t khub__gguf_version(const khub_gguf *g);   /* 2 or 3 */
KHUB_INTERNAL uint32_t khub__gguf_alignment(const khub_gguf *g); /* bytes */
KHUB_INTERNAL size_t khub__gguf_data_offset(const khub_gguf *g); /* file offset */

/* ------------------------------------------------------------------------ */
/* Metadata                                                                 */
/* ------------------------------------------------------------------------ */

KHUB_INTERNAL size_t khub__gguf_kv_count(const khub_gguf *g);
/* The i-th pair in file order; NULL when i is out of range. */
KHUB_INTERNAL const khub_gguf_kv *khub__gguf_kv_at(const khub_gguf *g, size_t i);
/* The pair named key, or NULL (sets no error: use it for optional keys). */
KHUB_INTERNAL const khub_gguf_kv *khub__gguf_find(const khub_gguf *g, const char *key);

/* Typed getters of required keys. Absent: NOT_FOUND ("<file>: metadata key
 * 'k' is missing"); wrong type or out of range: MODEL_INVALID naming key and
 * type. Conversions accepted:
 *   get_u32 / get_i64: any integer type whose value fits (not BOOL, not float);
 *   get_f32 / get_f64: FLOAT32, FLOAT64, or any integer type;
 *   get_bool: BOOL, or an integer 0/1;
 *   get_str: STRING; *ptr borrowed into the mapping, NOT NUL-terminated. */
KHUB_INTERNAL khub_status khub__gguf_get_u32(const khub_gguf *g, const char *key, uint32_t *out);
KHUB_INTERNAL khub_status khub__gguf_get_i64(const khub_gguf *g, const char *key, int64_t *out);
KHUB_INTERNAL khub_status khub__gguf_get_f32(const khub_gguf *g, const char *key, float *out);
KHUB_INTERNAL khub_status khub__gguf_get_f64(const khub_gguf *g, const char *key, double *out);
KHUB_INTERNAL khub_status khub__gguf_get_bool(const khub_gguf *g, const char *key, bool *out);
KHUB_INTERNAL khub_status khub__gguf_get_str(const khub_gguf *g, const char *key, const char **ptr,
                                             size_t *len);

/* Array access. khub__gguf_get_arr: the array named key (NOT_FOUND when
 * absent, MODEL_INVALID when not an array or, when want_elem is not
 * KHUB_GGUF_TYPE__COUNT, when its element type differs). The element
 * accessors take such a kv; i out of range is INVALID_ARG.
 *   arr_i64: any integer element type (u64 above INT64_MAX: MODEL_INVALID);
 *   arr_f32: FLOAT32, FLOAT64 or any integer element type;
 *   arr_str: STRING elements; (ptr, len) borrowed, not NUL-terminated. O(1). */
KHUB_INTERNAL khub_status khub__gguf_get_arr(const khub_gguf *g, const char *key,
                                             khub_gguf_type want_elem, const khub_gguf_kv **out);
KHUB_INTERNAL khub_status khub__gguf_arr_i64(const khub_gguf *g, const khub_gguf_kv *kv, uint64_t i,
                                             int64_t *out);
KHUB_INTERNAL khub_status khub__gguf_arr_f32(const khub_gguf *g, const khub_gguf_kv *kv, uint64_t i,
                                             float *out);
KHUB_INTERNAL khub_status khub__gguf_arr_str(const khub_gguf *g, const khub_gguf_kv *kv, uint64_t i,
                                             const char **ptr, size_t *len);

/* Bytes of one element of a scalar type (STRING and ARRAY: 0). */
KHUB_INTERNAL size_t khub__gguf_type_size(khub_gguf_type t);
/* "UINT32", "STRING", ...; "?" for an unknown value. */
KHUB_INTERNAL const char *khub__gguf_type_name(khub_gguf_type t);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */

KHUB_INTERNAL size_t khub__gguf_tensor_count(const khub_gguf *g);
/* The i-th tensor in file order; NULL when i is out of range. */
KHUB_INTERNAL const khub_gguf_tensor *khub__gguf_tensor_at(const khub_gguf *g, size_t i);
/* The tensor named name, or NULL (sets no error). O(log n). */
KHUB_INTERNAL const khub_gguf_tensor *khub__gguf_tensor_find(const khub_gguf *g, const char *name);
/* The tensor named name; NOT_FOUND with "<file>: tensor 'x' is missing". */
KHUB_INTERNAL khub_status khub__gguf_tensor_get(const khub_gguf *g, const char *name,
                                                const khub_gguf_tensor **out);

/* The khub dtype of t: F32, F16, BF16, or KHUB_DTYPE_Q(KHUB_QFORMAT_*) for
 * Q8_0, Q4_0, Q4_1, Q4_K, Q6_K. Any other type: MODEL_UNSUPPORTED with
 * "<file>: unsupported tensor type Q5_K (13) in tensor 'blk.0.ffn_down.weight'
 * (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)". */
KHUB_INTERNAL khub_status khub__gguf_tensor_dtype(const khub_gguf *g, const khub_gguf_tensor *t,
                                                  khub_dtype *out);

/* Static facts about ggml type ids (no file needed). */
/* "Q4_1", "F32", ...; NULL for an id ggml does not define. */
KHUB_INTERNAL const char *khub__ggml_type_name(uint32_t ggml_type);
/* Elements per block and bytes per block (F32: 1 and 4); false for an
 * unknown id. */
KHUB_INTERNAL bool khub__ggml_type_block(uint32_t ggml_type, int64_t *block_elems,
                                         int64_t *block_bytes);
/* The khub dtype of a ggml type id; false when khub has none. */
KHUB_INTERNAL bool khub__ggml_type_dtype(uint32_t ggml_type, khub_dtype *out);

#endif /* KHUB_RUNTIME_GGUF_H */
