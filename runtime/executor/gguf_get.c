/*
 * gguf_get.c: look-ups in an opened GGUF file: metadata by key (binary
 * search of the sorted index), typed getters that name the key and the
 * wanted type in their errors, array elements, tensors by name.
 */
#include <stdio.h>
#include <string.h>

#include "gguf_impl.h"

/* ======================================================================== */
/* Accessors                                                                */
/* ======================================================================== */

const char *khub__gguf_path(const khub_gguf *g) { return g->name; }
uint32_t khub__gguf_version(const khub_gguf *g) { return g->version; }
uint32_t khub__gguf_alignment(const khub_gguf *g) { return g->alignment; }
size_t khub__gguf_data_offset(const khub_gguf *g) { return g->data_off; }
size_t khub__gguf_kv_count(const khub_gguf *g) { return g->n_kv; }

const khub_gguf_kv *khub__gguf_kv_at(const khub_gguf *g, size_t i)
{
    return i < g->n_kv ? &g->kvs[i] : NULL;
}

const khub_gguf_kv *khub__gguf_find(const khub_gguf *g, const char *key)
{
    if (!key || !g->kv_by_key) return NULL;
    size_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const khub_gguf_kv *kv = &g->kvs[g->kv_by_key[mid]];
        int c = strcmp(kv->key, key);
        if (c == 0) return kv;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static khub_status find_required(const khub_gguf *g, const char *key, const khub_gguf_kv **out)
{
    *out = khub__gguf_find(g, key);
    KHUB_RETURN_IF(g->rt, !*out, KHUB_STATUS_NOT_FOUND, "%s: metadata key '%s' is missing", g->name,
                   key);
    return KHUB_STATUS_OK;
}

static khub_status wrong_type(const khub_gguf *g, const khub_gguf_kv *kv, const char *want)
{
    return khub__fail(g->rt, KHUB_STATUS_MODEL_INVALID,
                      "%s: metadata key '%.200s' has type %s, want %s", g->name, kv->key,
                      khub__gguf_type_name(kv->type), want);
}

khub_status khub__gguf_get_i64(const khub_gguf *g, const char *key, int64_t *out)
{
    const khub_gguf_kv *kv;
    KHUB_FORWARD_IF_ERROR(g->rt, find_required(g, key, &kv));
    int r = kv->type == KHUB_GGUF_ARRAY || kv->type == KHUB_GGUF_BOOL
                ? 0
                : read_int(kv->type, kv->data, out);
    if (r == 0) return wrong_type(g, kv, "an integer");
    KHUB_RETURN_IF(g->rt, r == 2, KHUB_STATUS_MODEL_INVALID,
                   "%s: metadata key '%s' = %llu is out of range", g->name, key,
                   (unsigned long long)le64(kv->data));
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_get_u32(const khub_gguf *g, const char *key, uint32_t *out)
{
    int64_t v;
    KHUB_FORWARD_IF_ERROR(g->rt, khub__gguf_get_i64(g, key, &v));
    KHUB_RETURN_IF(g->rt, v < 0 || v > UINT32_MAX, KHUB_STATUS_MODEL_INVALID,
                   "%s: metadata key '%s' = %lld is not in 0..4294967295", g->name, key,
                   (long long)v);
    *out = (uint32_t)v;
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_get_f64(const khub_gguf *g, const char *key, double *out)
{
    const khub_gguf_kv *kv;
    KHUB_FORWARD_IF_ERROR(g->rt, find_required(g, key, &kv));
    if (kv->type == KHUB_GGUF_ARRAY || kv->type == KHUB_GGUF_BOOL ||
        !read_num(kv->type, kv->data, out))
        return wrong_type(g, kv, "a number");
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_get_f32(const khub_gguf *g, const char *key, float *out)
{
    double d;
    KHUB_FORWARD_IF_ERROR(g->rt, khub__gguf_get_f64(g, key, &d));
    *out = (float)d;
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_get_bool(const khub_gguf *g, const char *key, bool *out)
{
    const khub_gguf_kv *kv;
    KHUB_FORWARD_IF_ERROR(g->rt, find_required(g, key, &kv));
    if (kv->type == KHUB_GGUF_BOOL) {
        *out = kv->data[0] != 0;
        return KHUB_STATUS_OK;
    }
    int64_t v;
    if (kv->type == KHUB_GGUF_ARRAY || read_int(kv->type, kv->data, &v) != 1 || (v != 0 && v != 1))
        return wrong_type(g, kv, "BOOL");
    *out = v != 0;
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_get_str(const khub_gguf *g, const char *key, const char **ptr, size_t *len)
{
    const khub_gguf_kv *kv;
    KHUB_FORWARD_IF_ERROR(g->rt, find_required(g, key, &kv));
    if (kv->type != KHUB_GGUF_STRING) return wrong_type(g, kv, "STRING");
    *ptr = (const char *)kv->data;
    *len = (size_t)kv->len;
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_get_arr(const khub_gguf *g, const char *key, khub_gguf_type want_elem,
                               const khub_gguf_kv **out)
{
    const khub_gguf_kv *kv;
    *out = NULL;
    KHUB_FORWARD_IF_ERROR(g->rt, find_required(g, key, &kv));
    if (kv->type != KHUB_GGUF_ARRAY) return wrong_type(g, kv, "ARRAY");
    KHUB_RETURN_IF(g->rt, want_elem != KHUB_GGUF_TYPE__COUNT && kv->elem != want_elem,
                   KHUB_STATUS_MODEL_INVALID,
                   "%s: metadata key '%s' is an array of %s, want an array of %s", g->name, key,
                   khub__gguf_type_name(kv->elem), khub__gguf_type_name(want_elem));
    *out = kv;
    return KHUB_STATUS_OK;
}

static khub_status check_elem(const khub_gguf *g, const khub_gguf_kv *kv, uint64_t i)
{
    KHUB_RETURN_IF(g->rt, !kv || kv->type != KHUB_GGUF_ARRAY, KHUB_STATUS_INVALID_ARG,
                   "%s: not an array", g->name);
    KHUB_RETURN_IF(g->rt, i >= kv->count, KHUB_STATUS_INVALID_ARG,
                   "%s: metadata key '%s': index %llu out of range (array of %llu)", g->name,
                   kv->key, (unsigned long long)i, (unsigned long long)kv->count);
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_arr_i64(const khub_gguf *g, const khub_gguf_kv *kv, uint64_t i, int64_t *out)
{
    KHUB_FORWARD_IF_ERROR(g->rt, check_elem(g, kv, i));
    int r = kv->elem == KHUB_GGUF_BOOL || kv->elem == KHUB_GGUF_STRING
                ? 0
                : read_int(kv->elem, kv->data + i * khub__gguf_type_size(kv->elem), out);
    KHUB_RETURN_IF(g->rt, r != 1, KHUB_STATUS_MODEL_INVALID,
                   "%s: metadata key '%s': element %llu is not an int64 (array of %s)", g->name,
                   kv->key, (unsigned long long)i, khub__gguf_type_name(kv->elem));
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_arr_f32(const khub_gguf *g, const khub_gguf_kv *kv, uint64_t i, float *out)
{
    KHUB_FORWARD_IF_ERROR(g->rt, check_elem(g, kv, i));
    double d = 0;
    bool ok = kv->elem != KHUB_GGUF_BOOL && kv->elem != KHUB_GGUF_STRING &&
              read_num(kv->elem, kv->data + i * khub__gguf_type_size(kv->elem), &d);
    KHUB_RETURN_IF(g->rt, !ok, KHUB_STATUS_MODEL_INVALID,
                   "%s: metadata key '%s' is an array of %s, want numbers", g->name, kv->key,
                   khub__gguf_type_name(kv->elem));
    *out = (float)d;
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_arr_str(const khub_gguf *g, const khub_gguf_kv *kv, uint64_t i,
                               const char **ptr, size_t *len)
{
    KHUB_FORWARD_IF_ERROR(g->rt, check_elem(g, kv, i));
    KHUB_RETURN_IF(g->rt, kv->elem != KHUB_GGUF_STRING, KHUB_STATUS_MODEL_INVALID,
                   "%s: metadata key '%s' is an array of %s, want STRING", g->name, kv->key,
                   khub__gguf_type_name(kv->elem));
    const uint8_t *p = g->base + kv->str_off[i]; /* validated at open */
    *len = (size_t)le64(p);
    *ptr = (const char *)p + 8;
    return KHUB_STATUS_OK;
}

size_t khub__gguf_tensor_count(const khub_gguf *g) { return g->n_tensors; }

const khub_gguf_tensor *khub__gguf_tensor_at(const khub_gguf *g, size_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

_Static_assert(offsetof(khub_gguf_tensor, name) == 0, "khub__name_index_find needs name first");

const khub_gguf_tensor *khub__gguf_tensor_find(const khub_gguf *g, const char *name)
{
    return khub__name_index_find(g->tensors, sizeof *g->tensors, g->t_by_name, g->n_tensors, name);
}

khub_status khub__gguf_tensor_get(const khub_gguf *g, const char *name,
                                  const khub_gguf_tensor **out)
{
    *out = khub__gguf_tensor_find(g, name);
    KHUB_RETURN_IF(g->rt, !*out, KHUB_STATUS_NOT_FOUND, "%s: tensor '%s' is missing", g->name,
                   name ? name : "(null)");
    return KHUB_STATUS_OK;
}

khub_status khub__gguf_tensor_dtype(const khub_gguf *g, const khub_gguf_tensor *t, khub_dtype *out)
{
    KHUB_API_CHECK(g->rt, t != NULL && out != NULL);
    const char *tn = khub__ggml_type_name(t->ggml_type);
    KHUB_RETURN_IF(g->rt, !khub__ggml_type_dtype(t->ggml_type, out), KHUB_STATUS_MODEL_UNSUPPORTED,
                   "%s: unsupported tensor type %s (%u) in tensor '%s' (supported: F32, F16, "
                   "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)",
                   g->name, tn ? tn : "?", t->ggml_type, t->name);
    return KHUB_STATUS_OK;
}
