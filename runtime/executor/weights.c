/*
 * weights.c: weight tensor views, f32 copies and embedding rows (see
 * weights.h for why Q/K rows of llama GGUFs are left permuted).
 */
#include <stdio.h>
#include <string.h>

#include "../../plugins/include/khub_plugin_util.h"
#include "weights.h"

const char *khub__dtype_short(khub_dtype dt)
{
    static const char *const q[KHUB_QFORMAT__COUNT] = {"?",    "q8_0", "q4_0", "q4_1", "q4_k",
                                                       "q6_k", "int8", "nf4",  "q5_0", "q5_1"};
    switch (khub_dtype_id_of(dt)) {
    case KHUB_DTYPE_ID_F32: return "f32";
    case KHUB_DTYPE_ID_F16: return "f16";
    case KHUB_DTYPE_ID_BF16: return "bf16";
    default: break;
    }
    if (dt.code == KHUB_DL_BLOCKQ && dt.bits < KHUB_QFORMAT__COUNT) return q[dt.bits];
    return "?";
}

bool khub__dtype_bytes(khub_dtype dt, int64_t n_rows, int64_t n_cols, size_t *out)
{
    if (n_rows < 1 || n_cols < 1) return false;
    int64_t row;
    if (dt.code == KHUB_DL_BLOCKQ) {
        row = khub_qformat_row_bytes((khub_qformat)dt.bits, n_cols);
        if (row < 0) return false;
    } else if (dt.bits == 16 || dt.bits == 32) {
        if (!khub__mul_i64_ok(n_cols, dt.bits / 8, &row)) return false;
    } else {
        return false;
    }
    return khub__mul_ok((size_t)row, (size_t)n_rows, out);
}

static void set_tensor(khub__weight *w, khub_dtype dt, const void *data, int32_t ndim)
{
    w->t.data = (void *)data; /* weights are read-only; the ABI's field is not const */
    w->t.device = (khub_device){KHUB_DEVICE_CPU, 0};
    w->t.ndim = ndim;
    w->t.dtype = dt;
    w->t.shape = w->shape;
    w->t.strides = NULL;
    w->t.byte_offset = 0;
}

static void shape_str(char *buf, size_t n, const int64_t *s, int32_t ndim)
{
    if (ndim == 1)
        snprintf(buf, n, "[%lld]", (long long)s[0]);
    else
        snprintf(buf, n, "[%lld, %lld]", (long long)s[0], (long long)s[1]);
}

khub_status khub__weight_view(khub_runtime *rt, const char *file, khub__weight *w,
                              const khub__wsrc *src, int32_t ndim, const int64_t want[2])
{
    memset(w, 0, sizeof *w);
    w->name = src->name;
    int same =
        src->ndim == ndim && src->shape[0] == want[0] && (ndim == 1 || src->shape[1] == want[1]);
    /* A [n] vector stored as [1, n] or [n, 1] is the same bytes. */
    if (!same && ndim == 1 && src->ndim == 2)
        same = (src->shape[0] == 1 && src->shape[1] == want[0]) ||
               (src->shape[1] == 1 && src->shape[0] == want[0]);
    if (!same) {
        char got[48], exp[48];
        shape_str(got, sizeof got, src->shape, src->ndim);
        shape_str(exp, sizeof exp, want, ndim);
        return khub__fail(rt, KHUB_STATUS_MODEL_INVALID,
                          "%s: tensor '%s' has shape %s, expected %s", file, src->name, got, exp);
    }
    w->shape[0] = want[0];
    w->shape[1] = ndim == 2 ? want[1] : 1;
    size_t need;
    int64_t rows = ndim == 2 ? want[0] : 1, cols = ndim == 2 ? want[1] : want[0];
    KHUB_RETURN_IF(rt, !khub__dtype_bytes(src->dtype, rows, cols, &need) || need != src->nbytes,
                   KHUB_STATUS_MODEL_INVALID,
                   "%s: tensor '%s' holds %zu bytes, its %s shape needs %zu", file, src->name,
                   src->nbytes, khub__dtype_short(src->dtype), need);
    size_t align = src->dtype.code == KHUB_DL_BLOCKQ ? 1 : (size_t)src->dtype.bits / 8;
    const void *data = src->data;
    if ((uintptr_t)data % align != 0) {
        w->owned = khub__aligned_alloc(rt, need);
        KHUB_RETURN_IF(rt, !w->owned, KHUB_STATUS_NOMEM, "%s: no memory to align tensor '%s'", file,
                       src->name);
        memcpy(w->owned, data, need);
        w->owned_bytes = need;
        data = w->owned;
    }
    set_tensor(w, src->dtype, data, ndim);
    return KHUB_STATUS_OK;
}

/* Converts n elements of an f32/f16/bf16 array to f32. */
static void to_f32(khub_dtype dt, const void *src, int64_t n, float *dst)
{
    if (dt.bits == 32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *h = src;
    if (dt.code == KHUB_DL_BFLOAT)
        for (int64_t i = 0; i < n; i++) dst[i] = khub_pu_bf16_to_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = khub_pu_f16_to_f32(h[i]);
}

khub_status khub__weight_to_f32(khub_runtime *rt, khub__weight *w)
{
    if (khub_dtype_id_of(w->t.dtype) == KHUB_DTYPE_ID_F32) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(rt, w->t.dtype.code == KHUB_DL_BLOCKQ, KHUB_STATUS_MODEL_UNSUPPORTED,
                   "tensor '%s' is %s; this weight must be f32, f16 or bf16", w->name,
                   khub__dtype_short(w->t.dtype));
    int64_t n = w->shape[0] * w->shape[1];
    size_t bytes;
    KHUB_RETURN_IF(rt, !khub__mul_ok((size_t)n, sizeof(float), &bytes), KHUB_STATUS_OVERFLOW,
                   "tensor '%s': size overflow", w->name);
    float *f = khub__aligned_alloc(rt, bytes);
    KHUB_RETURN_IF(rt, !f, KHUB_STATUS_NOMEM,
                   "no memory for an f32 copy of tensor '%s' (%zu bytes)", w->name, bytes);
    to_f32(w->t.dtype, w->t.data, n, f);
    if (w->owned) khub__aligned_free(rt, w->owned);
    w->owned = f;
    w->owned_bytes = bytes;
    set_tensor(w, KHUB_DTYPE_F32, f, w->t.ndim);
    return KHUB_STATUS_OK;
}

void khub__weight_free(khub_runtime *rt, khub__weight *w)
{
    if (!w) return;
    if (w->owned) khub__aligned_free(rt, w->owned);
    memset(w, 0, sizeof *w);
}

khub_status khub__weight_rows(khub_runtime *rt, const khub__weight *w, const int32_t *ids,
                              int64_t n, float *out, khub__dequant_fn deq, void *deq_state)
{
    int64_t vocab = w->shape[0], dim = w->shape[1];
    size_t row_bytes;
    KHUB_RETURN_IF(rt, !khub__dtype_bytes(w->t.dtype, 1, dim, &row_bytes), KHUB_STATUS_INTERNAL,
                   "embedding '%s': bad row size", w->name);
    const uint8_t *base = w->t.data;
    for (int64_t i = 0; i < n; i++) {
        KHUB_RETURN_IF(rt, ids[i] < 0 || ids[i] >= vocab, KHUB_STATUS_INVALID_ARG,
                       "token id %d at position %lld is outside the vocabulary [0, %lld)",
                       (int)ids[i], (long long)i, (long long)vocab);
        const uint8_t *row = base + (size_t)ids[i] * row_bytes;
        float *dst = out + i * dim;
        if (w->t.dtype.code != KHUB_DL_BLOCKQ) {
            to_f32(w->t.dtype, row, dim, dst);
            continue;
        }
        KHUB_RETURN_IF(rt, !deq, KHUB_STATUS_NO_KERNEL,
                       "embedding '%s' is %s and no qlinear plugin can dequantize it", w->name,
                       khub__dtype_short(w->t.dtype));
        khub_quant_args a = {KHUB_STRUCT_INIT(khub_quant_args),
                             .format = w->t.dtype.bits,
                             .n_rows = 1,
                             .n_cols = dim,
                             .src = row,
                             .dst = dst};
        khub_status st = deq(deq_state, &a);
        KHUB_RETURN_IF(rt, st != KHUB_STATUS_OK, st, "dequantizing row %d of '%s' failed: %s",
                       (int)ids[i], w->name, khub_runtime_errmsg(rt));
    }
    return KHUB_STATUS_OK;
}
