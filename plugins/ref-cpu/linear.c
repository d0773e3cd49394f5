/*
 * linear.c: reference y = x W^T + b (ops "linear" and, with quant.c, "qlinear").
 *
 *     y[i, o] = sum_k x[i, k] * W[o, k]  (+ bias[o])
 *
 * W is [out, in] compact: f32, f16 or bf16 for "linear", a block-quantized
 * format for "qlinear". Each worker takes a range of output rows o, turns
 * W[o, :] into f32 (a copy for half or quantized weights) and dots it with
 * every x row in double. x, y and bias may be strided; y must not alias x
 * (x is read again for every output row).
 */
#include "ref_cpu.h"

typedef struct lin_job {
    const khub_host_api *host;
    int64_t n, in, out;
    const float *x, *bias;
    float *y;
    int64_t sx[2], sy[2], sb[1];
    const uint8_t *w; /* row 0 of W */
    khub_dtype wdt;
    int64_t row_bytes; /* bytes per W row */
    atomic_int nomem;
} lin_job;

/* W[o, :] as f32: in place for f32 weights, else converted into buf. */
static const float *lin_weight_row(const lin_job *j, int64_t o, float *buf)
{
    const uint8_t *src = j->w + o * j->row_bytes;
    if (j->wdt.code == KHUB_DL_BLOCKQ) {
        khub_ref__dequantize_row((khub_qformat)j->wdt.bits, src, j->in, buf);
        return buf;
    }
    if (j->wdt.bits == 32) return (const float *)src;
    for (int64_t k = 0; k < j->in; k++) buf[k] = khub_ref__load(src, j->wdt, k);
    return buf;
}

static void lin_range(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    lin_job *j = ud;
    float *buf = j->host->alloc(j->host->host_ctx, (size_t)(j->in ? j->in : 1) * sizeof(float));
    if (!buf) {
        atomic_store(&j->nomem, 1);
        return;
    }
    for (int64_t o = begin; o < end; o++) {
        const float *w = lin_weight_row(j, o, buf);
        double b = j->bias ? (double)j->bias[o * j->sb[0]] : 0.0;
        for (int64_t i = 0; i < j->n; i++) {
            const float *x = j->x + i * j->sx[0];
            double acc = 0.0;
            for (int64_t k = 0; k < j->in; k++) acc += (double)x[k * j->sx[1]] * (double)w[k];
            j->y[i * j->sy[0] + o * j->sy[1]] = (float)(acc + b);
        }
    }
    j->host->free(j->host->host_ctx, buf);
}

/* Shared by both ops: op names the op for messages, wbits the weight dtypes
 * it serves. */
static khub_status lin_run(const khub_host_api *host, const char *op, const void *args,
                           uint64_t wbits)
{
    const uint64_t f32 = KHUB_REF_BIT_F32;
    void *c = host->host_ctx;
    KHUB_PU_TRY(khub_pu_args_check(host, op, args, sizeof(khub_linear_args)));
    const khub_linear_args *a = args;
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "x", a->x, 2, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "weight", a->weight, 2, wbits, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(host, op, "y", a->y, 2, f32, KHUB_DEVICE_CPU));
    lin_job j = {.host = host,
                 .n = a->x->shape[0],
                 .in = a->x->shape[1],
                 .out = a->weight->shape[0],
                 .wdt = a->weight->dtype};
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "weight", a->weight, 1, j.in, "in"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "y", a->y, 0, j.n, "n"));
    KHUB_PU_TRY(khub_pu_dim_check(host, op, "y", a->y, 1, j.out, "out"));
    if (a->bias) {
        KHUB_PU_TRY(khub_pu_tensor_check(host, op, "bias", a->bias, 1, f32, KHUB_DEVICE_CPU));
        KHUB_PU_TRY(khub_pu_dim_check(host, op, "bias", a->bias, 0, j.out, "out"));
        khub_pu_strides(a->bias, j.sb);
        j.bias = khub_pu_base(a->bias);
    }
    if (j.wdt.code == KHUB_DL_BLOCKQ) {
        j.row_bytes = khub_qformat_row_bytes((khub_qformat)j.wdt.bits, j.in);
        if (j.row_bytes < 0)
            return host->fail(c, KHUB_STATUS_INVALID_ARG,
                              "%s: weight.shape[1] (in) (got %lld, want a positive multiple of "
                              "%s's block of %lld)",
                              op, (long long)j.in, khub_pu_dtype_name(j.wdt),
                              (long long)khub_qformat_block_elems((khub_qformat)j.wdt.bits));
        int64_t total;
        if (__builtin_mul_overflow(j.out, j.row_bytes, &total))
            return host->fail(c, KHUB_STATUS_OVERFLOW,
                              "%s: weight of %lld rows x %lld bytes overflows (check its shape)",
                              op, (long long)j.out, (long long)j.row_bytes);
    } else {
        if (!khub_pu_is_compact(a->weight))
            return host->fail(c, KHUB_STATUS_INVALID_ARG,
                              "%s: weight has strides (want compact [out, in] rows)", op);
        j.row_bytes = j.in * (int64_t)khub_pu_elem_size(j.wdt);
    }
    if (a->y->data == a->x->data && a->y->byte_offset == a->x->byte_offset)
        return host->fail(c, KHUB_STATUS_INVALID_ARG, "%s: y aliases x (want separate memory)", op);
    khub_pu_strides(a->x, j.sx);
    khub_pu_strides(a->y, j.sy);
    j.x = khub_pu_base(a->x);
    j.y = khub_pu_base(a->y);
    j.w = khub_pu_base(a->weight);
    atomic_init(&j.nomem, 0);
    if (j.out > 0 && j.n > 0) host->parallel_for(c, j.out, lin_range, &j);
    if (atomic_load(&j.nomem))
        return host->fail(c, KHUB_STATUS_NOMEM, "%s: out of memory for a %lld-wide weight row", op,
                          (long long)j.in);
    return KHUB_STATUS_OK;
}

static khub_status ref_linear(void *state, const void *args)
{
    const uint64_t wbits = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16 | KHUB_REF_BIT_BF16;
    return lin_run(((khub_ref_state *)state)->host, "linear", args, wbits);
}

khub_status khub_ref__qlinear_run(void *state, const void *args)
{
    uint64_t wbits = 0;
    for (int f = 1; f < KHUB_QFORMAT__COUNT; f++) wbits |= KHUB_DTYPE_BIT_Q(f);
    return lin_run(((khub_ref_state *)state)->host, "qlinear", args, wbits);
}

static const khub_op_caps linear_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .dtypes = KHUB_REF_BIT_F32 | KHUB_REF_BIT_F16 | KHUB_REF_BIT_BF16,
    .flags = KHUB_CAP_BIAS,
};

const khub_op_desc khub_ref__linear_op = {
    KHUB_STRUCT_INIT(khub_op_desc), .name = "linear",  .kind = KHUB_OP_LINEAR,
    .caps = &linear_caps,           .run = ref_linear,
};
