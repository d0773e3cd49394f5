/*
 * embedding.c: reference token embedding lookup (op "embedding", kind
 * KHUB_OP_EMBEDDING, ABI 1.5).
 *
 *     y[i, :] = row(table, ids[i]) * scale,  i in [0, n)
 *
 * row() is the executor's own lookup, value for value: f16 and bf16 are
 * widened with khub_pu_*_to_f32, block formats go through
 * khub_ref__dequantize_row (the qlinear dequantize method the executor
 * calls for a quantized embedding), and the scale is one f32 multiply, as
 * forward.c's embed_scale does it (Gemma's sqrt(hidden), rounded to f32
 * by the caller). tests/test_embedding.c holds the two equal bit for bit.
 *
 * Every id is checked before anything is written: one outside the
 * vocabulary fails the call with INVALID_ARG and leaves y as it was.
 */
#include <math.h>

#include "ref_cpu.h"

#define OP "embedding"

typedef struct embed_job {
    const khub_embedding_args *a;
    const uint8_t *table;
    size_t row_bytes;
    int64_t hidden;
    int64_t row_stride; /* of y, in floats */
    float *y;
    float scale;
} embed_job;

static void embed_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const embed_job *j = ud;
    khub_dtype dt = j->a->table->dtype;
    for (int64_t i = begin; i < end; i++) {
        const uint8_t *row = j->table + (size_t)j->a->ids[i] * j->row_bytes;
        float *dst = j->y + i * j->row_stride;
        if (dt.code == KHUB_DL_BLOCKQ)
            khub_ref__dequantize_row((khub_qformat)dt.bits, row, j->hidden, dst);
        else
            for (int64_t k = 0; k < j->hidden; k++) dst[k] = khub_ref__load(row, dt, k);
        if (j->scale != 0.0f && j->scale != 1.0f)
            for (int64_t k = 0; k < j->hidden; k++) dst[k] *= j->scale;
    }
}

static const uint64_t table_dtypes =
    KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16 | KHUB_REF_BIT_BF16 | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0) |
    KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_1) |
    KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_K) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q6_K) |
    KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_INT8_ROW) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_NF4) |
    KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q5_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q5_1);

/* The table, y and the ids; the row size of the table's format. */
static khub_status embed_check(const khub_host_api *host, const khub_embedding_args *a,
                               size_t *row_bytes)
{
    void *c = host->host_ctx;
    KHUB_PU_TRY(
        khub_pu_tensor_check(host, OP, "table", a->table, 2, table_dtypes, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, OP, "y", a->y, 2, KHUB_REF_BIT_F32, KHUB_DEVICE_CPU));
    if (a->table->strides && !khub_pu_is_compact(a->table))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": table has strides (want compact rows)");
    int64_t hidden = a->table->shape[1];
    KHUB_PU_TRY(khub_pu_dim_check(host, OP, "y", a->y, 1, hidden, "hidden"));
    if (a->y->strides && a->y->shape[1] > 1 && a->y->strides[1] != 1)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": y.strides[1] (got %lld, want 1: a row's values are contiguous)",
                          (long long)a->y->strides[1]);
    if (a->n < 0 || a->y->shape[0] < a->n)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": n (got %lld, want 0..y.shape[0] %lld)",
                          (long long)a->n, (long long)a->y->shape[0]);
    if (a->n > 0 && !a->ids)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": ids is NULL (want [%lld])",
                          (long long)a->n);
    khub_dtype dt = a->table->dtype;
    int64_t rb = dt.code == KHUB_DL_BLOCKQ ? khub_qformat_row_bytes((khub_qformat)dt.bits, hidden)
                                           : hidden * (int64_t)khub_pu_elem_size(dt);
    if (rb <= 0)
        return host->fail(c, KHUB_STATUS_INVALID_ARG,
                          OP ": table rows of %lld values are not whole %s blocks",
                          (long long)hidden, khub_pu_dtype_name(dt));
    *row_bytes = (size_t)rb;
    int64_t vocab = a->table->shape[0];
    for (int64_t i = 0; i < a->n; i++)
        if (a->ids[i] < 0 || a->ids[i] >= vocab)
            return host->fail(c, KHUB_STATUS_INVALID_ARG,
                              OP ": token id %d at position %lld is outside the vocabulary "
                                 "[0, %lld)",
                              (int)a->ids[i], (long long)i, (long long)vocab);
    if (!isfinite(a->scale))
        return host->fail(c, KHUB_STATUS_INVALID_ARG, OP ": scale (got %g, want finite)",
                          (double)a->scale);
    return KHUB_STATUS_OK;
}

static khub_status ref_embedding(void *state, const void *args)
{
    const khub_host_api *host = ((khub_ref_state *)state)->host;
    KHUB_PU_TRY(khub_pu_args_check(host, OP, args, sizeof(khub_embedding_args)));
    const khub_embedding_args *a = args;
    embed_job j = {.a = a, .hidden = 0};
    KHUB_PU_TRY(embed_check(host, a, &j.row_bytes));
    if (a->n == 0 || a->table->shape[1] == 0) return KHUB_STATUS_OK;
    j.table = khub_pu_base(a->table);
    j.hidden = a->table->shape[1];
    int64_t sy[2];
    khub_pu_strides(a->y, sy);
    j.row_stride = sy[0];
    j.y = khub_pu_base(a->y);
    j.scale = a->scale;
    host->parallel_for(host->host_ctx, a->n, embed_range, &j);
    return KHUB_STATUS_OK;
}

static const khub_op_caps embedding_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = table_dtypes,
    .kind_flags = KHUB_EMBEDDING_SCALE | KHUB_EMBEDDING_STRIDED_OUT,
};

const khub_op_desc khub_ref__embedding_op = {
    KHUB_STRUCT_INIT(khub_op_desc), .name = "embedding",  .kind = KHUB_OP_EMBEDDING,
    .caps = &embedding_caps,        .run = ref_embedding,
};
