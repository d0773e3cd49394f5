/*
 * gguf.c: GGUF v2/v3 reader: the parse of a file or buffer (see gguf.h for
 * the contract); the typed look-ups are gguf_get.c.
 *
 * The format (ggml docs/gguf.md): "GGUF", u32 version, u64 tensor_count,
 * u64 metadata_kv_count, the key-value pairs (key: u64 length + bytes; u32
 * value type; value), the tensor infos (name; u32 n_dims; u64 ne[n_dims];
 * u32 ggml type; u64 offset), padding to general.alignment, the data.
 * Everything is little-endian; v2 and v3 share this layout (v3 only added
 * big-endian files, which khub refuses). v1 used u32 counts and is refused.
 *
 * Every read goes through a cursor that checks the remaining length first,
 * so a hostile file can make open fail but never read past the buffer. The
 * counts are checked against the bytes left before anything is allocated
 * from them, so a 40-byte file cannot ask for 2^60 entries.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_impl.h"

/* ======================================================================== */
/* ggml type table                                                          */
/* ======================================================================== */

/* Block elements and bytes of every type id ggml defines (ggml.h; ids 4, 5
 * and 31-38 are retired there). Values follow ggml's block structs. */
typedef struct ggml_type_info {
    const char *name;
    int64_t blck;
    int64_t bytes;
} ggml_type_info;

static const ggml_type_info ggml_types[] = {
    [0] = {"F32", 1, 4},         [1] = {"F16", 1, 2},         [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},      [6] = {"Q5_0", 32, 22},      [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},      [9] = {"Q8_1", 32, 36},      [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110},   [12] = {"Q4_K", 256, 144},   [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210},   [15] = {"Q8_K", 256, 292},   [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},  [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},  [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},         [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},        [27] = {"I64", 1, 8},        [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56},   [30] = {"BF16", 1, 2},       [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66},   [39] = {"MXFP4", 32, 17},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *khub__ggml_type_name(uint32_t t)
{
    return t < N_GGML_TYPES ? ggml_types[t].name : NULL;
}

bool khub__ggml_type_block(uint32_t t, int64_t *blck, int64_t *bytes)
{
    if (t >= N_GGML_TYPES || !ggml_types[t].name) return false;
    if (blck) *blck = ggml_types[t].blck;
    if (bytes) *bytes = ggml_types[t].bytes;
    return true;
}

bool khub__ggml_type_dtype(uint32_t t, khub_dtype *out)
{
    khub_dtype d;
    switch (t) {
    case KHUB_GGML_F32: d = KHUB_DTYPE_F32; break;
    case KHUB_GGML_F16: d = KHUB_DTYPE_F16; break;
    case KHUB_GGML_BF16: d = KHUB_DTYPE_BF16; break;
    case KHUB_GGML_Q8_0: d = KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0); break;
    case KHUB_GGML_Q4_0: d = KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_0); break;
    case KHUB_GGML_Q4_1: d = KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1); break;
    case KHUB_GGML_Q5_0: d = KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_0); break;
    case KHUB_GGML_Q5_1: d = KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_1); break;
    case KHUB_GGML_Q4_K: d = KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_K); break;
    case KHUB_GGML_Q6_K: d = KHUB_DTYPE_Q(KHUB_QFORMAT_Q6_K); break;
    default: return false;
    }
    if (out) *out = d;
    return true;
}

/* ======================================================================== */
/* Value types                                                              */
/* ======================================================================== */

static const char *const type_names[KHUB_GGUF_TYPE__COUNT] = {
    "UINT8", "INT8",   "UINT16", "INT16",  "UINT32", "INT32",   "FLOAT32",
    "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64",  "FLOAT64",
};
static const uint8_t type_sizes[KHUB_GGUF_TYPE__COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

size_t khub__gguf_type_size(khub_gguf_type t)
{
    return (unsigned)t < KHUB_GGUF_TYPE__COUNT ? type_sizes[t] : 0;
}

const char *khub__gguf_type_name(khub_gguf_type t)
{
    return (unsigned)t < KHUB_GGUF_TYPE__COUNT ? type_names[t] : "?";
}

/* ======================================================================== */
/* The cursor                                                               */
/* ======================================================================== */

typedef struct cursor {
    khub_gguf *g;
    size_t pos;
    char where[160]; /* what is being read, for messages: "metadata key 3 'x'" */
} cursor;

static khub_status need(cursor *c, uint64_t n, const char *field)
{
    KHUB_RETURN_IF(c->g->rt, n > c->g->size - c->pos, KHUB_STATUS_TRUNCATED,
                   "%s: truncated: %s%s%s needs %llu bytes at offset %zu, past end of file "
                   "(%zu bytes)",
                   c->g->name, c->where, c->where[0] ? ": " : "", field, (unsigned long long)n,
                   c->pos, c->g->size);
    return KHUB_STATUS_OK;
}

static khub_status get_u32(cursor *c, const char *field, uint32_t *v)
{
    KHUB_FORWARD_IF_ERROR(c->g->rt, need(c, 4, field));
    *v = le32(c->g->base + c->pos);
    c->pos += 4;
    return KHUB_STATUS_OK;
}

static khub_status get_u64(cursor *c, const char *field, uint64_t *v)
{
    KHUB_FORWARD_IF_ERROR(c->g->rt, need(c, 8, field));
    *v = le64(c->g->base + c->pos);
    c->pos += 8;
    return KHUB_STATUS_OK;
}

/* A string: u64 length, then bytes. Returns a view into the buffer. */
static khub_status get_str(cursor *c, const char *field, const uint8_t **p, uint64_t *len)
{
    KHUB_FORWARD_IF_ERROR(c->g->rt, get_u64(c, field, len));
    KHUB_FORWARD_IF_ERROR(c->g->rt, need(c, *len, field));
    *p = c->g->base + c->pos;
    c->pos += (size_t)*len;
    return KHUB_STATUS_OK;
}

/* A name (key or tensor name): a non-empty string without NUL bytes, copied
 * into a NUL-terminated string from rt's allocator. */
static khub_status get_name(cursor *c, const char *field, char **out)
{
    const uint8_t *p;
    uint64_t len;
    KHUB_FORWARD_IF_ERROR(c->g->rt, get_str(c, field, &p, &len));
    KHUB_RETURN_IF(c->g->rt, len == 0, KHUB_STATUS_MODEL_INVALID, "%s: %s: empty %s", c->g->name,
                   c->where, field);
    KHUB_RETURN_IF(c->g->rt, memchr(p, 0, (size_t)len) != NULL, KHUB_STATUS_MODEL_INVALID,
                   "%s: %s: %s contains a NUL byte", c->g->name, c->where, field);
    char *s = khub__malloc(c->g->rt, (size_t)len + 1);
    KHUB_RETURN_IF(c->g->rt, !s, KHUB_STATUS_NOMEM, "%s: out of memory reading %s", c->g->name,
                   field);
    memcpy(s, p, (size_t)len);
    s[len] = '\0';
    *out = s;
    return KHUB_STATUS_OK;
}

/* Checks that count entries of at least min_bytes each can fit in what is
 * left, before anything is allocated from count. */
static khub_status check_count(cursor *c, uint64_t count, uint64_t min_bytes, const char *field)
{
    uint64_t left = c->g->size - c->pos;
    KHUB_RETURN_IF(c->g->rt, count > left / min_bytes, KHUB_STATUS_TRUNCATED,
                   "%s: %s%s%s %llu needs at least %llu bytes per entry but only %llu bytes are "
                   "left (truncated file or corrupt count)",
                   c->g->name, c->where, c->where[0] ? ": " : "", field, (unsigned long long)count,
                   (unsigned long long)min_bytes, (unsigned long long)left);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Metadata                                                                 */
/* ======================================================================== */

static khub_status parse_array(cursor *c, khub_gguf_kv *kv)
{
    khub_runtime *rt = c->g->rt;
    uint32_t elem;
    KHUB_FORWARD_IF_ERROR(rt, get_u32(c, "array element type", &elem));
    KHUB_RETURN_IF(rt, elem == KHUB_GGUF_ARRAY, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: %s: nested arrays are not supported", c->g->name, c->where);
    KHUB_RETURN_IF(rt, elem >= KHUB_GGUF_TYPE__COUNT, KHUB_STATUS_MODEL_INVALID,
                   "%s: %s: unknown array element type %u", c->g->name, c->where, elem);
    kv->elem = (khub_gguf_type)elem;
    KHUB_FORWARD_IF_ERROR(rt, get_u64(c, "array length", &kv->count));
    kv->data = c->g->base + c->pos;

    if (elem != KHUB_GGUF_STRING) {
        uint64_t esz = type_sizes[elem];
        KHUB_FORWARD_IF_ERROR(rt, check_count(c, kv->count, esz, "array length"));
        kv->len = kv->count * esz; /* cannot overflow: checked against the file size */
        c->pos += (size_t)kv->len;
        return KHUB_STATUS_OK;
    }
    KHUB_FORWARD_IF_ERROR(rt, check_count(c, kv->count, 8, "string array length"));
    uint64_t *off = NULL;
    if (kv->count > 0) {
        off = khub__calloc(rt, (size_t)kv->count, sizeof *off);
        KHUB_RETURN_IF(rt, !off, KHUB_STATUS_NOMEM, "%s: %s: out of memory for %llu strings",
                       c->g->name, c->where, (unsigned long long)kv->count);
    }
    kv->str_off = off;
    for (uint64_t i = 0; i < kv->count; i++) {
        const uint8_t *p;
        uint64_t len;
        char field[48];
        snprintf(field, sizeof field, "string %llu", (unsigned long long)i);
        off[i] = c->pos;
        KHUB_FORWARD_IF_ERROR(rt, get_str(c, field, &p, &len));
    }
    kv->len = c->g->base + c->pos - kv->data;
    return KHUB_STATUS_OK;
}

static khub_status parse_value(cursor *c, khub_gguf_kv *kv)
{
    khub_runtime *rt = c->g->rt;
    uint32_t type;
    KHUB_FORWARD_IF_ERROR(rt, get_u32(c, "value type", &type));
    KHUB_RETURN_IF(rt, type >= KHUB_GGUF_TYPE__COUNT, KHUB_STATUS_MODEL_INVALID,
                   "%s: %s: unknown value type %u", c->g->name, c->where, type);
    kv->type = kv->elem = (khub_gguf_type)type;
    kv->count = 1;
    if (type == KHUB_GGUF_ARRAY) return parse_array(c, kv);
    if (type == KHUB_GGUF_STRING) return get_str(c, "string value", &kv->data, &kv->len);
    kv->len = type_sizes[type];
    KHUB_FORWARD_IF_ERROR(rt, need(c, kv->len, "value"));
    kv->data = c->g->base + c->pos;
    KHUB_RETURN_IF(rt, type == KHUB_GGUF_BOOL && kv->data[0] > 1, KHUB_STATUS_MODEL_INVALID,
                   "%s: %s: BOOL value %u is neither 0 nor 1", c->g->name, c->where, kv->data[0]);
    c->pos += (size_t)kv->len;
    return KHUB_STATUS_OK;
}

static int cmp_kv(const void *a, const void *b, void *ud)
{
    const khub_gguf *g = ud;
    return strcmp(g->kvs[*(const uint32_t *)a].key, g->kvs[*(const uint32_t *)b].key);
}

static int cmp_tensor_name(const void *a, const void *b, void *ud)
{
    const khub_gguf *g = ud;
    return strcmp(g->tensors[*(const uint32_t *)a].name, g->tensors[*(const uint32_t *)b].name);
}

static int cmp_tensor_off(const void *a, const void *b, void *ud)
{
    const khub_gguf *g = ud;
    uint64_t x = g->tensors[*(const uint32_t *)a].offset;
    uint64_t y = g->tensors[*(const uint32_t *)b].offset;
    return x < y ? -1 : x > y;
}

/* An index array 0..n-1 sorted with cmp. */
static khub_status sorted_index(khub_gguf *g, size_t n,
                                int (*cmp)(const void *, const void *, void *), uint32_t **out)
{
    *out = NULL;
    if (n == 0) return KHUB_STATUS_OK;
    uint32_t *idx = khub__calloc(g->rt, n, sizeof *idx);
    KHUB_RETURN_IF(g->rt, !idx, KHUB_STATUS_NOMEM, "%s: out of memory", g->name);
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)i;
    qsort_r(idx, n, sizeof *idx, cmp, g);
    *out = idx;
    return KHUB_STATUS_OK;
}

static khub_status parse_metadata(cursor *c, uint64_t n_kv)
{
    khub_gguf *g = c->g;
    /* Smallest pair: 8-byte length + 1-byte key + 4-byte type + 1-byte value. */
    KHUB_FORWARD_IF_ERROR(g->rt, check_count(c, n_kv, 14, "metadata_kv_count"));
    if (n_kv > 0) {
        g->kvs = khub__calloc(g->rt, (size_t)n_kv, sizeof *g->kvs);
        KHUB_RETURN_IF(g->rt, !g->kvs, KHUB_STATUS_NOMEM, "%s: out of memory for %llu keys",
                       g->name, (unsigned long long)n_kv);
        g->kv_cap = (size_t)n_kv;
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        khub_gguf_kv *kv = &g->kvs[i];
        snprintf(c->where, sizeof c->where, "metadata key %llu", (unsigned long long)i);
        KHUB_FORWARD_IF_ERROR(g->rt, get_name(c, "key", (char **)&kv->key));
        g->n_kv = (size_t)i + 1;
        snprintf(c->where, sizeof c->where, "metadata key %llu '%.100s'", (unsigned long long)i,
                 kv->key);
        KHUB_FORWARD_IF_ERROR(g->rt, parse_value(c, kv));
    }
    c->where[0] = '\0';

    KHUB_FORWARD_IF_ERROR(g->rt, sorted_index(g, g->n_kv, cmp_kv, &g->kv_by_key));
    for (size_t i = 1; i < g->n_kv; i++) {
        const char *k = g->kvs[g->kv_by_key[i]].key;
        KHUB_RETURN_IF(g->rt, strcmp(g->kvs[g->kv_by_key[i - 1]].key, k) == 0,
                       KHUB_STATUS_MODEL_INVALID, "%s: duplicate metadata key '%.200s'", g->name,
                       k);
    }

    g->alignment = KHUB_GGUF_DEFAULT_ALIGNMENT;
    if (khub__gguf_find(g, "general.alignment")) {
        KHUB_FORWARD_IF_ERROR(g->rt, khub__gguf_get_u32(g, "general.alignment", &g->alignment));
        uint32_t a = g->alignment;
        KHUB_RETURN_IF(g->rt, a == 0 || (a & (a - 1)) != 0 || a > (1u << 20),
                       KHUB_STATUS_MODEL_INVALID,
                       "%s: general.alignment %u is not a power of two in 1..1048576", g->name, a);
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Tensor infos                                                             */
/* ======================================================================== */

/* Shape, type and byte size of one tensor info (its name is already read). */
static khub_status parse_tensor_shape(cursor *c, khub_gguf_tensor *t)
{
    khub_gguf *g = c->g;
    KHUB_FORWARD_IF_ERROR(g->rt, get_u32(c, "n_dims", &t->n_dims));
    KHUB_RETURN_IF(g->rt, t->n_dims < 1 || t->n_dims > KHUB_GGUF_MAX_DIMS,
                   KHUB_STATUS_MODEL_INVALID, "%s: %s: n_dims %u is not in 1..%d", g->name,
                   c->where, t->n_dims, KHUB_GGUF_MAX_DIMS);
    t->n_elems = 1;
    for (int d = 0; d < KHUB_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        KHUB_FORWARD_IF_ERROR(g->rt, get_u64(c, "dimension", &ne));
        KHUB_RETURN_IF(g->rt, ne == 0 || ne > INT64_MAX, KHUB_STATUS_MODEL_INVALID,
                       "%s: %s: ne[%u] = %llu is not in 1..2^63-1", g->name, c->where, d,
                       (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
        KHUB_RETURN_IF(g->rt, !khub__mul_i64_ok(t->n_elems, t->ne[d], &t->n_elems),
                       KHUB_STATUS_MODEL_INVALID, "%s: %s: element count overflows at ne[%u]",
                       g->name, c->where, d);
    }
    KHUB_FORWARD_IF_ERROR(g->rt, get_u32(c, "ggml type", &t->ggml_type));
    int64_t blck, bytes;
    KHUB_RETURN_IF(g->rt, !khub__ggml_type_block(t->ggml_type, &blck, &bytes),
                   KHUB_STATUS_MODEL_UNSUPPORTED, "%s: %s: unknown ggml type %u", g->name, c->where,
                   t->ggml_type);
    KHUB_RETURN_IF(g->rt, t->ne[0] % blck != 0, KHUB_STATUS_MODEL_INVALID,
                   "%s: %s: ne[0] = %lld is not a multiple of the %s block size %lld", g->name,
                   c->where, (long long)t->ne[0], ggml_types[t->ggml_type].name, (long long)blck);
    size_t row, total;
    KHUB_RETURN_IF(g->rt,
                   !khub__mul_ok((size_t)(t->ne[0] / blck), (size_t)bytes, &row) ||
                       !khub__mul_ok(row, (size_t)(t->n_elems / t->ne[0]), &total),
                   KHUB_STATUS_MODEL_INVALID, "%s: %s: byte size overflows", g->name, c->where);
    t->nbytes = total;
    KHUB_FORWARD_IF_ERROR(g->rt, get_u64(c, "offset", &t->offset));
    KHUB_RETURN_IF(g->rt, t->offset % g->alignment != 0, KHUB_STATUS_MODEL_INVALID,
                   "%s: %s: offset %llu is not a multiple of the alignment %u", g->name, c->where,
                   (unsigned long long)t->offset, g->alignment);
    return KHUB_STATUS_OK;
}

static khub_status parse_tensor_infos(cursor *c, uint64_t n_tensors)
{
    khub_gguf *g = c->g;
    /* Smallest info: 8 + 1 name, 4 n_dims, 8 one dim, 4 type, 8 offset. */
    KHUB_FORWARD_IF_ERROR(g->rt, check_count(c, n_tensors, 33, "tensor_count"));
    KHUB_RETURN_IF(g->rt, n_tensors > UINT32_MAX, KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor_count %llu is absurd", g->name, (unsigned long long)n_tensors);
    if (n_tensors > 0) {
        g->tensors = khub__calloc(g->rt, (size_t)n_tensors, sizeof *g->tensors);
        KHUB_RETURN_IF(g->rt, !g->tensors, KHUB_STATUS_NOMEM, "%s: out of memory for %llu tensors",
                       g->name, (unsigned long long)n_tensors);
        g->t_cap = (size_t)n_tensors;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        khub_gguf_tensor *t = &g->tensors[i];
        snprintf(c->where, sizeof c->where, "tensor %llu", (unsigned long long)i);
        KHUB_FORWARD_IF_ERROR(g->rt, get_name(c, "tensor name", (char **)&t->name));
        g->n_tensors = (size_t)i + 1;
        snprintf(c->where, sizeof c->where, "tensor '%.120s'", t->name);
        KHUB_FORWARD_IF_ERROR(g->rt, parse_tensor_shape(c, t));
    }
    c->where[0] = '\0';
    return KHUB_STATUS_OK;
}

/* Places the data section and checks every tensor's bytes lie inside it,
 * names are unique and no two tensors overlap. */
static khub_status check_tensor_data(cursor *c)
{
    khub_gguf *g = c->g;
    size_t a = g->alignment;
    g->data_off = c->pos + (a - c->pos % a) % a; /* c->pos <= size, so no overflow */
    if (g->n_tensors == 0) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(g->rt, g->data_off > g->size, KHUB_STATUS_TRUNCATED,
                   "%s: truncated: data section starts at %zu, past end of file (%zu bytes)",
                   g->name, g->data_off, g->size);
    size_t avail = g->size - g->data_off;
    for (size_t i = 0; i < g->n_tensors; i++) {
        khub_gguf_tensor *t = &g->tensors[i];
        KHUB_RETURN_IF(
            g->rt, t->offset > avail || t->nbytes > avail - t->offset, KHUB_STATUS_TRUNCATED,
            "%s: tensor '%.120s': offset %llu + %zu bytes past end of file (%zu)", g->name, t->name,
            (unsigned long long)(g->data_off + t->offset), t->nbytes, g->size);
        t->data = g->base + g->data_off + t->offset;
    }

    KHUB_FORWARD_IF_ERROR(g->rt, sorted_index(g, g->n_tensors, cmp_tensor_name, &g->t_by_name));
    for (size_t i = 1; i < g->n_tensors; i++) {
        const char *n = g->tensors[g->t_by_name[i]].name;
        KHUB_RETURN_IF(g->rt, strcmp(g->tensors[g->t_by_name[i - 1]].name, n) == 0,
                       KHUB_STATUS_MODEL_INVALID, "%s: duplicate tensor name '%.200s'", g->name, n);
    }

    uint32_t *by_off;
    KHUB_FORWARD_IF_ERROR(g->rt, sorted_index(g, g->n_tensors, cmp_tensor_off, &by_off));
    khub_status st = KHUB_STATUS_OK;
    for (size_t i = 1; i < g->n_tensors && st == KHUB_STATUS_OK; i++) {
        const khub_gguf_tensor *p = &g->tensors[by_off[i - 1]], *t = &g->tensors[by_off[i]];
        if (p->offset + p->nbytes > t->offset)
            st = khub__fail(g->rt, KHUB_STATUS_MODEL_INVALID,
                            "%s: tensor '%.100s' [%llu, +%zu) overlaps tensor '%.100s' at %llu",
                            g->name, p->name, (unsigned long long)p->offset, p->nbytes, t->name,
                            (unsigned long long)t->offset);
    }
    khub__free(g->rt, by_off, g->n_tensors * sizeof *by_off);
    return st;
}

/* ======================================================================== */
/* Open and close                                                           */
/* ======================================================================== */

static khub_status parse_header(khub_gguf *g)
{
    cursor c = {.g = g, .pos = 0, .where = ""};
    static const uint8_t magic[4] = {'G', 'G', 'U', 'F'};
    size_t have = g->size < 4 ? g->size : 4;
    KHUB_RETURN_IF(g->rt, memcmp(g->base, magic, have) != 0, KHUB_STATUS_MODEL_INVALID,
                   "%s: not a GGUF file (no 'GGUF' magic at offset 0)", g->name);
    KHUB_FORWARD_IF_ERROR(g->rt, need(&c, 4, "magic"));
    c.pos = 4;
    KHUB_FORWARD_IF_ERROR(g->rt, get_u32(&c, "version", &g->version));
    uint32_t v = g->version;
    KHUB_RETURN_IF(g->rt, v == 0x02000000u || v == 0x03000000u, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: big-endian GGUF files are not supported", g->name);
    KHUB_RETURN_IF(g->rt, v != 2 && v != 3, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: GGUF version %u is not supported (supported: 2, 3)", g->name, v);
    uint64_t n_tensors, n_kv;
    KHUB_FORWARD_IF_ERROR(g->rt, get_u64(&c, "tensor_count", &n_tensors));
    KHUB_FORWARD_IF_ERROR(g->rt, get_u64(&c, "metadata_kv_count", &n_kv));
    KHUB_FORWARD_IF_ERROR(g->rt, parse_metadata(&c, n_kv));
    KHUB_FORWARD_IF_ERROR(g->rt, parse_tensor_infos(&c, n_tensors));
    return check_tensor_data(&c);
}

static khub_status open_common(khub_runtime *rt, const char *name, khub_gguf *g, khub_gguf **out)
{
    khub_status st;
    g->name = khub__strdup(rt, name);
    if (!g->name) {
        st = khub__fail(rt, KHUB_STATUS_NOMEM, "%s: out of memory", name);
    } else {
        st = parse_header(g);
    }
    if (st != KHUB_STATUS_OK) {
        khub__gguf_close(g);
        return st;
    }
    *out = g;
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_open_mem(khub_runtime *rt, const char *name, const void *data, size_t size,
                                khub_gguf **out)
{
    KHUB_API_CHECK(rt, out != NULL);
    *out = NULL;
    KHUB_API_CHECK(rt, name != NULL && (data != NULL || size == 0));
    khub_gguf *g = khub__calloc(rt, 1, sizeof *g);
    KHUB_RETURN_IF(rt, !g, KHUB_STATUS_NOMEM, "%s: out of memory", name);
    g->rt = rt;
    g->base = data ? data : (const uint8_t *)"";
    g->size = size;
    return open_common(rt, name, g, out);
}

static khub_status open_path(khub_runtime *rt, const char *path, bool huge, khub_gguf **out)
{
    KHUB_API_CHECK(rt, out != NULL);
    *out = NULL;
    KHUB_API_CHECK(rt, path != NULL);
    khub_gguf *g = khub__calloc(rt, 1, sizeof *g);
    KHUB_RETURN_IF(rt, !g, KHUB_STATUS_NOMEM, "%s: out of memory", path);
    g->rt = rt;
    khub_status st =
        huge ? khub__mmap_open_huge(rt, path, &g->map) : khub__mmap_open(rt, path, &g->map);
    if (st != KHUB_STATUS_OK) {
        khub__free(rt, g, sizeof *g);
        return st;
    }
    g->base = g->map.data ? g->map.data : (const uint8_t *)"";
    g->size = g->map.size;
    return open_common(rt, path, g, out);
}

khub_status khub__gguf_open(khub_runtime *rt, const char *path, khub_gguf **out)
{
    return open_path(rt, path, false, out);
}

khub_status khub__gguf_open_huge(khub_runtime *rt, const char *path, khub_gguf **out)
{
    return open_path(rt, path, true, out);
}

const khub_mmap *khub__gguf_map(const khub_gguf *g) { return g ? &g->map : NULL; }

void khub__gguf_close(khub_gguf *g)
{
    if (!g) return;
    khub_runtime *rt = g->rt;
    for (size_t i = 0; i < g->n_kv; i++) {
        khub__strfree(rt, (char *)g->kvs[i].key);
        if (g->kvs[i].str_off)
            khub__free(rt, (void *)g->kvs[i].str_off, g->kvs[i].count * sizeof(uint64_t));
    }
    khub__free(rt, g->kvs, g->kv_cap * sizeof *g->kvs);
    khub__free(rt, g->kv_by_key, g->n_kv * sizeof *g->kv_by_key);
    for (size_t i = 0; i < g->n_tensors; i++) khub__strfree(rt, (char *)g->tensors[i].name);
    khub__free(rt, g->tensors, g->t_cap * sizeof *g->tensors);
    khub__free(rt, g->t_by_name, g->n_tensors * sizeof *g->t_by_name);
    khub__mmap_close(rt, &g->map);
    khub__strfree(rt, g->name);
    khub__free(rt, g, sizeof *g);
}
