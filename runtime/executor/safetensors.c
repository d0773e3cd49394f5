/*
 * safetensors.c: safetensors reader, single files and sharded folders (see
 * safetensors.h for the contract).
 *
 * The JSON header is parsed with cJSON, which allocates through its own
 * (global, C library) hooks rather than the runtime's allocator; the parsed
 * tree lives only for the duration of open. cJSON keeps duplicate object
 * keys, so uniqueness is checked here. Numbers arrive as doubles: shapes and
 * offsets must be integers in 0..2^53, where doubles are exact.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mmap_file.h"
#include "safetensors.h"

#define MAX_EXACT_INT 9007199254740992.0 /* 2^53 */
#define INDEX_NAME    "model.safetensors.index.json"
#define SINGLE_NAME   "model.safetensors"

typedef struct st_shard {
    khub_mmap map;       /* owned when mapped from a file; else zeroed */
    const uint8_t *base; /* the file's bytes */
    size_t size;
    char *name; /* owned: path or caller's name, for messages */
} st_shard;

struct khub_safetensors {
    khub_runtime *rt; /* borrowed */
    char *path;       /* owned: what open was given */
    st_shard *shards; /* owned [n_shards] */
    size_t n_shards, shard_cap;
    khub_st_tensor *tensors; /* owned [t_cap]; names owned */
    size_t n_tensors, t_cap;
    uint32_t *by_name; /* owned [n_tensors]: indices sorted by name */
    char **meta;       /* owned [2 * meta_cap]: key, value pairs */
    size_t n_meta, meta_cap;
};

/* ======================================================================== */
/* dtypes                                                                   */
/* ======================================================================== */

typedef struct dtype_info {
    const char *name;
    int bits;
    khub_dtype dt;
} dtype_info;

#define DT(c, b) ((khub_dtype){(c), (b), 1})
static const dtype_info dtypes[KHUB_ST_DTYPE__COUNT] = {
    [KHUB_ST_BOOL] = {"BOOL", 8, DT(KHUB_DL_BOOL, 8)},
    [KHUB_ST_U8] = {"U8", 8, DT(KHUB_DL_UINT, 8)},
    [KHUB_ST_I8] = {"I8", 8, DT(KHUB_DL_INT, 8)},
    [KHUB_ST_U16] = {"U16", 16, DT(KHUB_DL_UINT, 16)},
    [KHUB_ST_I16] = {"I16", 16, DT(KHUB_DL_INT, 16)},
    [KHUB_ST_F16] = {"F16", 16, DT(KHUB_DL_FLOAT, 16)},
    [KHUB_ST_BF16] = {"BF16", 16, DT(KHUB_DL_BFLOAT, 16)},
    [KHUB_ST_U32] = {"U32", 32, DT(KHUB_DL_UINT, 32)},
    [KHUB_ST_I32] = {"I32", 32, DT(KHUB_DL_INT, 32)},
    [KHUB_ST_F32] = {"F32", 32, DT(KHUB_DL_FLOAT, 32)},
    [KHUB_ST_U64] = {"U64", 64, DT(KHUB_DL_UINT, 64)},
    [KHUB_ST_I64] = {"I64", 64, DT(KHUB_DL_INT, 64)},
    [KHUB_ST_F64] = {"F64", 64, DT(KHUB_DL_FLOAT, 64)},
    [KHUB_ST_C64] = {"C64", 64, DT(KHUB_DL_OPAQUE, 64)},
    [KHUB_ST_F8_E5M2] = {"F8_E5M2", 8, DT(KHUB_DL_OPAQUE, 8)},
    [KHUB_ST_F8_E4M3] = {"F8_E4M3", 8, DT(KHUB_DL_OPAQUE, 8)},
    [KHUB_ST_F8_E8M0] = {"F8_E8M0", 8, DT(KHUB_DL_OPAQUE, 8)},
    [KHUB_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, DT(KHUB_DL_OPAQUE, 8)},
    [KHUB_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, DT(KHUB_DL_OPAQUE, 8)},
    [KHUB_ST_F6_E2M3] = {"F6_E2M3", 6, DT(KHUB_DL_OPAQUE, 6)},
    [KHUB_ST_F6_E3M2] = {"F6_E3M2", 6, DT(KHUB_DL_OPAQUE, 6)},
    [KHUB_ST_F4] = {"F4", 4, DT(KHUB_DL_OPAQUE, 4)},
};

static bool dtype_from_name(const char *s, khub_st_dtype *out)
{
    for (int i = 0; i < KHUB_ST_DTYPE__COUNT; i++)
        if (strcmp(s, dtypes[i].name) == 0) {
            *out = (khub_st_dtype)i;
            return true;
        }
    return false;
}

/* ======================================================================== */
/* Growth and small helpers                                                 */
/* ======================================================================== */

/* Grows *arr (of *cap elements of size esz) to hold at least need. */
static bool grow(khub_runtime *rt, void **arr, size_t *cap, size_t need, size_t esz)
{
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap * 2 : 16, bytes;
    while (nc < need) nc *= 2;
    if (!khub__mul_ok(nc, esz, &bytes)) return false;
    void *p = khub__realloc(rt, *arr, *cap * esz, bytes);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

/* An integer in 0..2^53 held by a JSON number. */
static bool json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= MAX_EXACT_INT) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static int cmp_names(const void *a, const void *b, void *ud)
{
    const khub_safetensors *st = ud;
    return strcmp(st->tensors[*(const uint32_t *)a].name, st->tensors[*(const uint32_t *)b].name);
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Checks the children of a JSON object have distinct names. */
static khub_status check_unique_keys(khub_runtime *rt, const char *file, const char *what,
                                     const cJSON *obj)
{
    size_t n = (size_t)cJSON_GetArraySize(obj);
    if (n < 2) return KHUB_STATUS_OK;
    const char **names = khub__calloc(rt, n, sizeof *names);
    KHUB_RETURN_IF(rt, !names, KHUB_STATUS_NOMEM, "%s: out of memory", file);
    size_t i = 0;
    for (const cJSON *c = obj->child; c && i < n; c = c->next) names[i++] = c->string;
    qsort(names, n, sizeof *names, cmp_cstr);
    khub_status st = KHUB_STATUS_OK;
    for (i = 1; i < n && st == KHUB_STATUS_OK; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            st = khub__fail(rt, KHUB_STATUS_MODEL_INVALID, "%s: duplicate key '%.200s' in %s", file,
                            names[i], what);
    khub__free(rt, names, n * sizeof *names);
    return st;
}

/* ======================================================================== */
/* One header                                                               */
/* ======================================================================== */

static khub_status parse_metadata(khub_safetensors *st, const char *file, const cJSON *meta,
                                  bool keep)
{
    khub_runtime *rt = st->rt;
    KHUB_RETURN_IF(rt, !cJSON_IsObject(meta), KHUB_STATUS_MODEL_INVALID,
                   "%s: __metadata__ is not an object", file);
    KHUB_FORWARD_IF_ERROR(rt, check_unique_keys(rt, file, "__metadata__", meta));
    for (const cJSON *m = meta->child; m; m = m->next) {
        KHUB_RETURN_IF(rt, !cJSON_IsString(m), KHUB_STATUS_MODEL_INVALID,
                       "%s: __metadata__ value of '%.200s' is not a string", file, m->string);
        if (!keep) continue;
        KHUB_RETURN_IF(
            rt, !grow(rt, (void **)&st->meta, &st->meta_cap, st->n_meta + 1, 2 * sizeof *st->meta),
            KHUB_STATUS_NOMEM, "%s: out of memory", file);
        char *k = khub__strdup(rt, m->string), *v = khub__strdup(rt, m->valuestring);
        if (!k || !v) {
            khub__strfree(rt, k);
            khub__strfree(rt, v);
            return khub__fail(rt, KHUB_STATUS_NOMEM, "%s: out of memory", file);
        }
        st->meta[2 * st->n_meta] = k;
        st->meta[2 * st->n_meta + 1] = v;
        st->n_meta++;
    }
    return KHUB_STATUS_OK;
}

/* The member named key of entry, checking it appears at most once. */
static khub_status member(khub_runtime *rt, const char *file, const cJSON *entry, const char *key,
                          const cJSON **out)
{
    *out = NULL;
    for (const cJSON *c = entry->child; c; c = c->next) {
        if (strcmp(c->string, key) != 0) continue;
        KHUB_RETURN_IF(rt, *out != NULL, KHUB_STATUS_MODEL_INVALID,
                       "%s: tensor '%.200s': duplicate key '%s'", file, entry->string, key);
        *out = c;
    }
    KHUB_RETURN_IF(rt, *out == NULL, KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': '%s' is missing", file, entry->string, key);
    return KHUB_STATUS_OK;
}

/* dtype and shape of one entry into t; nbytes from them. */
static khub_status parse_dtype_shape(khub_runtime *rt, const char *file, const cJSON *e,
                                     khub_st_tensor *t)
{
    const cJSON *dt, *shape;
    KHUB_FORWARD_IF_ERROR(rt, member(rt, file, e, "dtype", &dt));
    KHUB_RETURN_IF(rt, !cJSON_IsString(dt), KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': dtype is not a string", file, e->string);
    KHUB_RETURN_IF(rt, !dtype_from_name(dt->valuestring, &t->st_dtype), KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': unknown dtype '%.40s'", file, e->string, dt->valuestring);
    t->dtype = dtypes[t->st_dtype].dt;

    KHUB_FORWARD_IF_ERROR(rt, member(rt, file, e, "shape", &shape));
    int n = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : -1;
    KHUB_RETURN_IF(rt, n < 0 || n > KHUB_ST_MAX_DIMS, KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': shape is not an array of at most %d dims", file, e->string,
                   KHUB_ST_MAX_DIMS);
    t->ndim = n;
    t->n_elems = 1;
    int d = 0;
    for (const cJSON *c = shape->child; c; c = c->next, d++) {
        uint64_t v;
        KHUB_RETURN_IF(rt, !json_uint(c, &v), KHUB_STATUS_MODEL_INVALID,
                       "%s: tensor '%.200s': shape[%d] is not an integer in 0..2^53", file,
                       e->string, d);
        t->shape[d] = (int64_t)v;
        KHUB_RETURN_IF(
            rt, !khub__mul_i64_ok(t->n_elems, t->shape[d], &t->n_elems), KHUB_STATUS_MODEL_INVALID,
            "%s: tensor '%.200s': element count overflows at shape[%d]", file, e->string, d);
    }
    size_t bits;
    KHUB_RETURN_IF(rt, !khub__mul_ok((size_t)t->n_elems, (size_t)dtypes[t->st_dtype].bits, &bits),
                   KHUB_STATUS_MODEL_INVALID, "%s: tensor '%.200s': byte size overflows", file,
                   e->string);
    KHUB_RETURN_IF(rt, bits % 8 != 0, KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': %lld elements of %s do not end on a byte boundary", file,
                   e->string, (long long)t->n_elems, dtypes[t->st_dtype].name);
    t->nbytes = bits / 8;
    return KHUB_STATUS_OK;
}

static khub_status parse_entry(khub_safetensors *st, uint32_t shard, const cJSON *e,
                               size_t buf_size, const uint8_t *buf)
{
    khub_runtime *rt = st->rt;
    const char *file = st->shards[shard].name;
    KHUB_RETURN_IF(rt, !cJSON_IsObject(e), KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': entry is not an object", file, e->string);
    khub_st_tensor t = {.shard = shard};
    KHUB_FORWARD_IF_ERROR(rt, parse_dtype_shape(rt, file, e, &t));

    const cJSON *off;
    uint64_t begin, end;
    KHUB_FORWARD_IF_ERROR(rt, member(rt, file, e, "data_offsets", &off));
    KHUB_RETURN_IF(rt,
                   !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
                       !json_uint(off->child, &begin) || !json_uint(off->child->next, &end),
                   KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': data_offsets is not [begin, end] of integers", file,
                   e->string);
    KHUB_RETURN_IF(rt, end < begin, KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': data_offsets [%llu, %llu) end before begin", file,
                   e->string, (unsigned long long)begin, (unsigned long long)end);
    KHUB_RETURN_IF(rt, end - begin != t.nbytes, KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%.200s': shape and dtype %s need %zu bytes but data_offsets "
                   "[%llu, %llu) hold %llu",
                   file, e->string, dtypes[t.st_dtype].name, t.nbytes, (unsigned long long)begin,
                   (unsigned long long)end, (unsigned long long)(end - begin));
    KHUB_RETURN_IF(rt, end > buf_size, KHUB_STATUS_TRUNCATED,
                   "%s: tensor '%.200s': data_offsets [%llu, %llu) past end of file (data "
                   "buffer is %zu bytes)",
                   file, e->string, (unsigned long long)begin, (unsigned long long)end, buf_size);
    t.data = buf + begin;

    KHUB_RETURN_IF(
        rt, !grow(rt, (void **)&st->tensors, &st->t_cap, st->n_tensors + 1, sizeof *st->tensors),
        KHUB_STATUS_NOMEM, "%s: out of memory", file);
    t.name = khub__strdup(rt, e->string);
    KHUB_RETURN_IF(rt, !t.name, KHUB_STATUS_NOMEM, "%s: out of memory", file);
    st->tensors[st->n_tensors++] = t;
    return KHUB_STATUS_OK;
}

typedef struct span {
    uint64_t begin, end;
    const char *name;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* No two tensors of a shard (from index first on) share a byte. */
static khub_status check_overlap(khub_safetensors *st, const char *file, size_t first,
                                 const uint8_t *buf)
{
    size_t n = st->n_tensors - first;
    if (n < 2) return KHUB_STATUS_OK;
    span *s = khub__calloc(st->rt, n, sizeof *s);
    KHUB_RETURN_IF(st->rt, !s, KHUB_STATUS_NOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < n; i++) {
        const khub_st_tensor *t = &st->tensors[first + i];
        s[i].begin = (uint64_t)((const uint8_t *)t->data - buf);
        s[i].end = s[i].begin + t->nbytes;
        s[i].name = t->name;
    }
    qsort(s, n, sizeof *s, cmp_span);
    khub_status rc = KHUB_STATUS_OK;
    for (size_t i = 1; i < n && rc == KHUB_STATUS_OK; i++)
        if (s[i - 1].end > s[i].begin)
            rc = khub__fail(st->rt, KHUB_STATUS_MODEL_INVALID,
                            "%s: tensors '%.100s' [%llu, %llu) and '%.100s' [%llu, %llu) overlap",
                            file, s[i - 1].name, (unsigned long long)s[i - 1].begin,
                            (unsigned long long)s[i - 1].end, s[i].name,
                            (unsigned long long)s[i].begin, (unsigned long long)s[i].end);
    khub__free(st->rt, s, n * sizeof *s);
    return rc;
}

/* Checks that bytes after the JSON value are only padding whitespace. */
static bool only_space(const char *p, const char *end)
{
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') return false;
    return true;
}

static khub_status parse_shard(khub_safetensors *st, uint32_t shard)
{
    khub_runtime *rt = st->rt;
    const st_shard *sh = &st->shards[shard];
    const char *file = sh->name;
    KHUB_RETURN_IF(rt, sh->size < 8, KHUB_STATUS_TRUNCATED,
                   "%s: truncated: %zu bytes, shorter than the 8-byte header length", file,
                   sh->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | sh->base[i];
    KHUB_RETURN_IF(rt, n > KHUB_ST_MAX_HEADER, KHUB_STATUS_MODEL_INVALID,
                   "%s: header length %llu exceeds the limit of %llu bytes", file,
                   (unsigned long long)n, (unsigned long long)KHUB_ST_MAX_HEADER);
    KHUB_RETURN_IF(rt, n > sh->size - 8, KHUB_STATUS_TRUNCATED,
                   "%s: truncated: header length %llu runs past end of file (%zu bytes)", file,
                   (unsigned long long)n, sh->size);
    const char *json = (const char *)sh->base + 8;
    KHUB_RETURN_IF(rt, n < 2 || json[0] != '{', KHUB_STATUS_MODEL_INVALID,
                   "%s: header does not start with a JSON object", file);

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + n ? (size_t)(end - json) : 0;
        return khub__fail(rt, KHUB_STATUS_MODEL_INVALID,
                          "%s: header is not valid JSON (near byte %zu of %llu)", file, at + 8,
                          (unsigned long long)n);
    }
    khub_status rc = KHUB_STATUS_OK;
    size_t first = st->n_tensors;
    const uint8_t *buf = sh->base + 8 + n;
    size_t buf_size = sh->size - 8 - (size_t)n;
    if (!end || end < json || end > json + n || !only_space(end, json + n) ||
        !cJSON_IsObject(root)) {
        rc = khub__fail(rt, KHUB_STATUS_MODEL_INVALID,
                        "%s: header is not one JSON object padded with spaces", file);
        goto done;
    }
    rc = check_unique_keys(rt, file, "the header", root);
    for (const cJSON *e = root->child; e && rc == KHUB_STATUS_OK; e = e->next) {
        if (strcmp(e->string, "__metadata__") != 0)
            rc = parse_entry(st, shard, e, buf_size, buf);
        else
            rc = parse_metadata(st, file, e, shard == 0); /* later shards': checked only */
    }
    if (rc == KHUB_STATUS_OK) rc = check_overlap(st, file, first, buf);
done:
    cJSON_Delete(root);
    return rc;
}

/* ======================================================================== */
/* Shards, folders and the index                                            */
/* ======================================================================== */

static khub_status add_shard(khub_safetensors *st, const char *name, const void *data, size_t size,
                             uint32_t *idx)
{
    khub_runtime *rt = st->rt;
    KHUB_RETURN_IF(
        rt, !grow(rt, (void **)&st->shards, &st->shard_cap, st->n_shards + 1, sizeof *st->shards),
        KHUB_STATUS_NOMEM, "%s: out of memory", name);
    st_shard *sh = &st->shards[st->n_shards];
    memset(sh, 0, sizeof *sh);
    sh->name = khub__strdup(rt, name);
    KHUB_RETURN_IF(rt, !sh->name, KHUB_STATUS_NOMEM, "%s: out of memory", name);
    if (data) {
        sh->base = data;
        sh->size = size;
    } else {
        khub_status rc = khub__mmap_open(rt, name, &sh->map);
        if (rc != KHUB_STATUS_OK) {
            khub__strfree(rt, sh->name);
            return rc;
        }
        sh->base = sh->map.data ? sh->map.data : (const uint8_t *)"";
        sh->size = sh->map.size;
    }
    *idx = (uint32_t)st->n_shards++;
    return KHUB_STATUS_OK;
}

static khub_status open_file(khub_safetensors *st, const char *path)
{
    uint32_t idx = 0;
    KHUB_FORWARD_IF_ERROR(st->rt, add_shard(st, path, NULL, 0, &idx));
    return parse_shard(st, idx);
}

static khub_status join(khub_runtime *rt, const char *dir, const char *name, char **out)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    *out = khub__malloc(rt, n);
    KHUB_RETURN_IF(rt, !*out, KHUB_STATUS_NOMEM, "%s: out of memory", dir);
    snprintf(*out, n, "%s/%s", dir, name);
    return KHUB_STATUS_OK;
}

/* A shard name from an index must be a plain file name in the folder. */
static khub_status check_shard_name(khub_runtime *rt, const char *index, const char *name)
{
    KHUB_RETURN_IF(rt,
                   name[0] == '\0' || strchr(name, '/') || strchr(name, '\\') ||
                       strcmp(name, ".") == 0 || strcmp(name, "..") == 0,
                   KHUB_STATUS_UNSAFE_PATH,
                   "%s: shard name '%.200s' is not a plain file name in the model folder", index,
                   name);
    return KHUB_STATUS_OK;
}

/* The shard index of the file named name (relative to the folder), or -1. */
static long shard_of(const khub_safetensors *st, const char *dir, const char *name)
{
    size_t dl = strlen(dir);
    for (size_t i = 0; i < st->n_shards; i++) {
        const char *p = st->shards[i].name;
        if (strncmp(p, dir, dl) == 0 && p[dl] == '/' && strcmp(p + dl + 1, name) == 0)
            return (long)i;
    }
    return -1;
}

/* Opens every shard named in weight_map (in sorted order) and checks the
 * map against what the shards hold. */
static khub_status open_index_shards(khub_safetensors *st, const char *dir, const char *index,
                                     const cJSON *wm)
{
    khub_runtime *rt = st->rt;
    KHUB_FORWARD_IF_ERROR(rt, check_unique_keys(rt, index, "weight_map", wm));
    size_t n = (size_t)cJSON_GetArraySize(wm);
    KHUB_RETURN_IF(rt, n == 0, KHUB_STATUS_MODEL_INVALID, "%s: weight_map is empty", index);
    const char **files = khub__calloc(rt, n, sizeof *files);
    KHUB_RETURN_IF(rt, !files, KHUB_STATUS_NOMEM, "%s: out of memory", index);
    khub_status rc = KHUB_STATUS_OK;
    size_t i = 0;
    for (const cJSON *e = wm->child; e && rc == KHUB_STATUS_OK; e = e->next, i++) {
        if (!cJSON_IsString(e))
            rc = khub__fail(rt, KHUB_STATUS_MODEL_INVALID,
                            "%s: weight_map['%.200s'] is not a file name string", index, e->string);
        else if ((rc = check_shard_name(rt, index, e->valuestring)) == KHUB_STATUS_OK)
            files[i] = e->valuestring;
    }
    if (rc == KHUB_STATUS_OK) qsort(files, n, sizeof *files, cmp_cstr);
    for (i = 0; i < n && rc == KHUB_STATUS_OK; i++) {
        if (i > 0 && strcmp(files[i], files[i - 1]) == 0) continue;
        char *path;
        rc = join(rt, dir, files[i], &path);
        if (rc != KHUB_STATUS_OK) break;
        rc = open_file(st, path);
        khub__strfree(rt, path);
    }
    khub__free(rt, files, n * sizeof *files);
    return rc;
}

static khub_status check_index_map(khub_safetensors *st, const char *dir, const char *index,
                                   const cJSON *wm)
{
    for (const cJSON *e = wm->child; e; e = e->next) {
        const khub_st_tensor *t = khub__safetensors_find(st, e->string);
        long want = shard_of(st, dir, e->valuestring);
        KHUB_RETURN_IF(st->rt, !t || (long)t->shard != want, KHUB_STATUS_MODEL_INVALID,
                       "%s: tensor '%.200s' mapped to '%.200s' is not in that file", index,
                       e->string, e->valuestring);
    }
    return KHUB_STATUS_OK;
}

static khub_status build_name_index(khub_safetensors *st);

static khub_status open_index(khub_safetensors *st, const char *dir, const char *index)
{
    khub_runtime *rt = st->rt;
    khub_mmap m;
    KHUB_FORWARD_IF_ERROR(rt, khub__mmap_open(rt, index, &m));
    cJSON *root = m.size ? cJSON_ParseWithLength((const char *)m.data, m.size) : NULL;
    khub__mmap_close(rt, &m);
    KHUB_RETURN_IF(rt, !root, KHUB_STATUS_MODEL_INVALID, "%s: not valid JSON", index);
    khub_status rc = check_unique_keys(rt, index, "the index", root);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (rc == KHUB_STATUS_OK && !cJSON_IsObject(wm))
        rc = khub__fail(rt, KHUB_STATUS_MODEL_INVALID,
                        "%s: weight_map is missing or not an "
                        "object",
                        index);
    if (rc == KHUB_STATUS_OK) rc = open_index_shards(st, dir, index, wm);
    if (rc == KHUB_STATUS_OK) rc = build_name_index(st);
    if (rc == KHUB_STATUS_OK) rc = check_index_map(st, dir, index, wm);
    cJSON_Delete(root);
    return rc;
}

static bool is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static khub_status open_dir(khub_safetensors *st, const char *dir)
{
    char *index, *single;
    KHUB_FORWARD_IF_ERROR(st->rt, join(st->rt, dir, INDEX_NAME, &index));
    khub_status rc = join(st->rt, dir, SINGLE_NAME, &single);
    if (rc != KHUB_STATUS_OK) {
        khub__strfree(st->rt, index);
        return rc;
    }
    if (is_file(index))
        rc = open_index(st, dir, index);
    else if (is_file(single))
        rc = open_file(st, single);
    else
        rc = khub__fail(st->rt, KHUB_STATUS_NOT_FOUND,
                        "%s: no " SINGLE_NAME " or " INDEX_NAME " in this folder", dir);
    khub__strfree(st->rt, index);
    khub__strfree(st->rt, single);
    return rc;
}

/* ======================================================================== */
/* Open and close                                                           */
/* ======================================================================== */

static khub_status build_name_index(khub_safetensors *st)
{
    if (st->by_name || st->n_tensors == 0) return KHUB_STATUS_OK;
    st->by_name = khub__calloc(st->rt, st->n_tensors, sizeof *st->by_name);
    KHUB_RETURN_IF(st->rt, !st->by_name, KHUB_STATUS_NOMEM, "%s: out of memory", st->path);
    for (size_t i = 0; i < st->n_tensors; i++) st->by_name[i] = (uint32_t)i;
    qsort_r(st->by_name, st->n_tensors, sizeof *st->by_name, cmp_names, st);
    for (size_t i = 1; i < st->n_tensors; i++) {
        const khub_st_tensor *a = &st->tensors[st->by_name[i - 1]];
        const khub_st_tensor *b = &st->tensors[st->by_name[i]];
        KHUB_RETURN_IF(st->rt, strcmp(a->name, b->name) == 0, KHUB_STATUS_MODEL_INVALID,
                       "%s: tensor '%.200s' appears in both '%s' and '%s'", st->path, a->name,
                       st->shards[a->shard].name, st->shards[b->shard].name);
    }
    return KHUB_STATUS_OK;
}

static khub_status finish_open(khub_safetensors *st, khub_status rc, khub_safetensors **out)
{
    if (rc == KHUB_STATUS_OK) rc = build_name_index(st);
    if (rc != KHUB_STATUS_OK) {
        khub__safetensors_close(st);
        return rc;
    }
    *out = st;
    return KHUB_STATUS_OK;
}

static khub_status new_st(khub_runtime *rt, const char *path, khub_safetensors **out)
{
    *out = khub__calloc(rt, 1, sizeof **out);
    KHUB_RETURN_IF(rt, !*out, KHUB_STATUS_NOMEM, "%s: out of memory", path);
    (*out)->rt = rt;
    (*out)->path = khub__strdup(rt, path);
    if (!(*out)->path) {
        khub__free(rt, *out, sizeof **out);
        *out = NULL;
        return khub__fail(rt, KHUB_STATUS_NOMEM, "%s: out of memory", path);
    }
    return KHUB_STATUS_OK;
}

khub_status khub__safetensors_open(khub_runtime *rt, const char *path, khub_safetensors **out)
{
    KHUB_API_CHECK(rt, out != NULL);
    *out = NULL;
    KHUB_API_CHECK(rt, path != NULL);
    struct stat sb;
    KHUB_RETURN_IF(rt, stat(path, &sb) != 0, KHUB_STATUS_NOT_FOUND, "%s: no such file or folder",
                   path);
    khub_safetensors *st;
    KHUB_FORWARD_IF_ERROR(rt, new_st(rt, path, &st));
    khub_status rc = S_ISDIR(sb.st_mode) ? open_dir(st, path) : open_file(st, path);
    return finish_open(st, rc, out);
}

khub_status khub__safetensors_open_mem(khub_runtime *rt, const char *name, const void *data,
                                       size_t size, khub_safetensors **out)
{
    KHUB_API_CHECK(rt, out != NULL);
    *out = NULL;
    KHUB_API_CHECK(rt, name != NULL && (data != NULL || size == 0));
    khub_safetensors *st;
    KHUB_FORWARD_IF_ERROR(rt, new_st(rt, name, &st));
    uint32_t idx = 0;
    khub_status rc = add_shard(st, name, data ? data : "", size, &idx);
    if (rc == KHUB_STATUS_OK) rc = parse_shard(st, idx);
    return finish_open(st, rc, out);
}

const khub_mmap *khub__safetensors_map_of(const khub_safetensors *st, const void *p, size_t n)
{
    for (size_t i = 0; st && i < st->n_shards; i++)
        if (khub__mmap_droppable(&st->shards[i].map, p, n)) return &st->shards[i].map;
    return NULL;
}

void khub__safetensors_close(khub_safetensors *st)
{
    if (!st) return;
    khub_runtime *rt = st->rt;
    for (size_t i = 0; i < st->n_tensors; i++) khub__strfree(rt, (char *)st->tensors[i].name);
    khub__free(rt, st->tensors, st->t_cap * sizeof *st->tensors);
    khub__free(rt, st->by_name, st->n_tensors * sizeof *st->by_name);
    for (size_t i = 0; i < 2 * st->n_meta; i++) khub__strfree(rt, st->meta[i]);
    khub__free(rt, st->meta, st->meta_cap * 2 * sizeof *st->meta);
    for (size_t i = 0; i < st->n_shards; i++) {
        khub__mmap_close(rt, &st->shards[i].map);
        khub__strfree(rt, st->shards[i].name);
    }
    khub__free(rt, st->shards, st->shard_cap * sizeof *st->shards);
    khub__strfree(rt, st->path);
    khub__free(rt, st, sizeof *st);
}

/* ======================================================================== */
/* Accessors                                                                */
/* ======================================================================== */

size_t khub__safetensors_count(const khub_safetensors *st) { return st->n_tensors; }

const khub_st_tensor *khub__safetensors_at(const khub_safetensors *st, size_t i)
{
    return i < st->n_tensors ? &st->tensors[i] : NULL;
}

_Static_assert(offsetof(khub_st_tensor, name) == 0, "khub__name_index_find needs name first");

const khub_st_tensor *khub__safetensors_find(const khub_safetensors *st, const char *name)
{
    return khub__name_index_find(st->tensors, sizeof *st->tensors, st->by_name, st->n_tensors,
                                 name);
}

khub_status khub__safetensors_get_weight(const khub_safetensors *st, const char *name,
                                         const khub_st_tensor **out)
{
    *out = khub__safetensors_find(st, name);
    KHUB_RETURN_IF(st->rt, !*out, KHUB_STATUS_NOT_FOUND, "%s: tensor '%s' is missing", st->path,
                   name ? name : "(null)");
    khub_st_dtype d = (*out)->st_dtype;
    if (d != KHUB_ST_F32 && d != KHUB_ST_F16 && d != KHUB_ST_BF16) {
        const char *file = st->shards[(*out)->shard].name;
        *out = NULL;
        return khub__fail(st->rt, KHUB_STATUS_MODEL_UNSUPPORTED,
                          "%s: tensor '%s' has dtype %s; weights must be F32, F16 or BF16", file,
                          name, dtypes[d].name);
    }
    return KHUB_STATUS_OK;
}

const char *khub__safetensors_metadata(const khub_safetensors *st, const char *key)
{
    for (size_t i = 0; key && i < st->n_meta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

size_t khub__safetensors_shard_count(const khub_safetensors *st) { return st->n_shards; }

const char *khub__safetensors_shard_path(const khub_safetensors *st, size_t i)
{
    return i < st->n_shards ? st->shards[i].name : NULL;
}
