/*
 * test_embedding.c: the embedding op kind (ABI 1.5, KHUB_OP_EMBEDDING) and
 * khub/ref-cpu's op, against the executor's own row lookup
 * (runtime/executor/weights.c khub__weight_rows with the qlinear dequantize
 * method the executor binds for a quantized embedding, khub/ref-cpu's,
 * then forward.c's f32 scale multiply).
 *   - every table format a model may hold (f32, f16, bf16, Q8_0, Q4_0, Q4_1,
 *     Q5_0, Q5_1, Q4_K, Q6_K, and khub's int8_row and NF4): bit for bit, with
 *     and without Gemma's sqrt(hidden) scale;
 *   - a strided, offset y (KHUB_EMBEDDING_STRIDED_OUT): the same rows, and
 *     nothing written between them;
 *   - an id outside the vocabulary refused with its status and message,
 *     y untouched;
 *   - the registry routes a table format only to an op that lists it, and
 *     the manifest self-test of the kind (khub check's) runs against ref-cpu.
 */
#include <math.h>

#include "../plugins/include/khub_plugin_util.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"
#include "selftest.h"
#include "weights.h"

enum { VOCAB = 300, HIDDEN = 512, N = 9 };

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint8_t rbyte(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint8_t)(rng >> 56);
}
static float rfloat(void) { return (float)rbyte() / 128.0f - 1.0f; }

/* A table of `dt`: random values (dense), or random codes with small
 * finite scales at each format's scale fields (block formats, as a GGUF
 * holds them). Caller frees. */
static void *make_table(khub_dtype dt, size_t *bytes)
{
    int64_t rb = dt.code == KHUB_DL_BLOCKQ ? khub_qformat_row_bytes((khub_qformat)dt.bits, HIDDEN)
                                           : HIDDEN * (dt.bits / 8);
    ASSERT(rb > 0);
    *bytes = (size_t)(VOCAB * rb);
    uint8_t *t = malloc(*bytes);
    ASSERT(t != NULL);
    for (size_t i = 0; i < *bytes; i++) t[i] = rbyte();
    if (dt.code != KHUB_DL_BLOCKQ) {
        for (int64_t i = 0; i < VOCAB * HIDDEN; i++) {
            float v = rfloat();
            if (dt.bits == 32)
                memcpy(t + 4 * i, &v, 4);
            else if (dt.code == KHUB_DL_BFLOAT)
                ((uint16_t *)t)[i] = khub_pu_f32_to_bf16(v);
            else
                ((uint16_t *)t)[i] = khub_pu_f32_to_f16(v);
        }
        return t;
    }
    khub_qformat f = (khub_qformat)dt.bits;
    int64_t be = khub_qformat_block_elems(f), bb = khub_qformat_block_bytes(f);
    for (int64_t r = 0; r < VOCAB; r++) {
        uint8_t *row = t + r * rb;
        if (f == KHUB_QFORMAT_INT8_ROW) {
            khub_pu_store_f32(row, 0.01f * (rfloat() + 1.5f));
            continue;
        }
        for (int64_t k = 0; k < HIDDEN / be; k++) {
            uint8_t *b = row + k * bb;
            if (f == KHUB_QFORMAT_NF4)
                khub_pu_store_f32(b, 0.5f + 0.25f * rfloat());
            else if (f == KHUB_QFORMAT_Q6_K)
                khub_pu_store_f16le(b + 208, 0.01f * rfloat());
            else
                khub_pu_store_f16le(b, 0.05f * rfloat());
            if (f == KHUB_QFORMAT_Q4_1 || f == KHUB_QFORMAT_Q5_1 || f == KHUB_QFORMAT_Q4_K)
                khub_pu_store_f16le(b + 2, 0.05f * rfloat());
        }
    }
    return t;
}

typedef struct fix {
    khub_runtime *rt;
    khub_binding *embed; /* khub/ref-cpu :: embedding */
} fix;

static fix setup(void)
{
    fix f = {tp_runtime(1), NULL};
    ASSERT_OK(khub_plugin_load_builtin(f.rt));
    return f;
}

static khub_binding *select_op(khub_runtime *rt, uint32_t kind, int dtype_id, uint64_t flags)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = kind,
                       .device_type = KHUB_DEVICE_CPU,
                       .dtype_id = dtype_id,
                       .kind_flags = flags,
                       .plugin_id = "khub/ref-cpu"};
    khub_binding *b = NULL;
    ASSERT_OK(khub_registry_select(rt, &q, &b));
    return b;
}

/* The executor's lookup of ids into out: khub__weight_rows with ref-cpu's
 * dequantize for block formats, then forward.c's embed_scale. */
static void executor_rows(khub_runtime *rt, khub__weight *w, const int32_t *ids, float scale,
                          float *out)
{
    khub__dequant_fn deq = NULL;
    void *state = NULL;
    khub_binding *q = NULL;
    if (w->t.dtype.code == KHUB_DL_BLOCKQ) {
        q = select_op(rt, KHUB_OP_QLINEAR, khub_dtype_id_of(w->t.dtype), 0);
        const khub_op_desc *op = khub_binding_acquire(q, &state);
        deq = ((const khub_qlinear_methods *)op->methods)->dequantize;
    }
    ASSERT_OK(khub__weight_rows(rt, w, ids, N, out, deq, state));
    if (q) khub_binding_release(q);
    if (scale != 1.0f)
        for (int64_t i = 0; i < N * HIDDEN; i++) out[i] *= scale;
}

static const int32_t ids[N] = {0, 299, 7, 7, 150, 1, 298, 42, 255};

static void one_format(fix *f, khub_dtype dt)
{
    size_t bytes;
    void *table = make_table(dt, &bytes);
    khub__weight w = {.shape = {VOCAB, HIDDEN}, .name = "token_embd.weight"};
    w.t = (khub_tensor){
        .data = table, .device = {KHUB_DEVICE_CPU, 0}, .ndim = 2, .dtype = dt, .shape = w.shape};
    khub_binding *b = select_op(f->rt, KHUB_OP_EMBEDDING, khub_dtype_id_of(dt), 0);
    ASSERT_STR_EQ(khub_binding_name(b), "khub/ref-cpu 0.1.0 :: embedding");
    static float want[N * HIDDEN], got[N * HIDDEN];
    int64_t ys[2] = {N, HIDDEN};
    khub_tensor y = {.data = got,
                     .device = {KHUB_DEVICE_CPU, 0},
                     .ndim = 2,
                     .dtype = KHUB_DTYPE_F32,
                     .shape = ys};
    const float scales[] = {1.0f, (float)sqrt(640.0), 0.0f};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        executor_rows(f->rt, &w, ids, scales[s] == 0.0f ? 1.0f : scales[s], want);
        memset(got, 0xff, sizeof got);
        khub_embedding_args a = {KHUB_STRUCT_INIT(khub_embedding_args),
                                 .table = &w.t,
                                 .ids = ids,
                                 .y = &y,
                                 .n = N,
                                 .scale = scales[s]};
        ASSERT_OK(khub_binding_call(b, &a));
        if (memcmp(got, want, sizeof got) != 0) {
            for (int64_t i = 0; i < N * HIDDEN; i++)
                if (memcmp(&got[i], &want[i], 4) != 0)
                    TEST_FAIL_("%s scale %g: y[%lld] = %.9g, the executor's %.9g",
                               khub_pu_dtype_name(dt), (double)scales[s], (long long)i,
                               (double)got[i], (double)want[i]);
        }
        double norm = 0;
        for (int64_t i = 0; i < N * HIDDEN; i++) norm += fabs((double)want[i]);
        ASSERT(norm > 0 && isfinite(norm)); /* the rows hold values, not zeros or NaNs */
    }
    free(table);
}

TEST_IMPL(embedding_matches_executor_lookup_every_format)
{
    fix f = setup();
    const khub_dtype dense[] = {KHUB_DTYPE_F32, KHUB_DTYPE_F16, KHUB_DTYPE_BF16};
    for (size_t i = 0; i < 3; i++) one_format(&f, dense[i]);
    const khub_qformat q[] = {KHUB_QFORMAT_Q8_0, KHUB_QFORMAT_Q4_0,     KHUB_QFORMAT_Q4_1,
                              KHUB_QFORMAT_Q5_0, KHUB_QFORMAT_Q5_1,     KHUB_QFORMAT_Q4_K,
                              KHUB_QFORMAT_Q6_K, KHUB_QFORMAT_INT8_ROW, KHUB_QFORMAT_NF4};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) one_format(&f, KHUB_DTYPE_Q(q[i]));
    khub_runtime_free(f.rt);
}

/* y with a row stride of HIDDEN + 24 floats and a byte offset of 16 floats:
 * each row lands where the strides say, the gaps keep their sentinel. */
TEST_IMPL(embedding_strided_offset_output)
{
    fix f = setup();
    size_t bytes;
    void *table = make_table(KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), &bytes);
    int64_t ts[2] = {VOCAB, HIDDEN};
    khub_tensor t = {.data = table,
                     .device = {KHUB_DEVICE_CPU, 0},
                     .ndim = 2,
                     .dtype = KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1),
                     .shape = ts};
    enum { RS = HIDDEN + 24, OFF = 16 };
    static float buf[OFF + N * RS], compact[N * HIDDEN];
    for (size_t i = 0; i < sizeof buf / sizeof buf[0]; i++) buf[i] = -7.0f;
    int64_t ys[2] = {N, HIDDEN}, st[2] = {RS, 1};
    khub_tensor y = {.data = buf,
                     .device = {KHUB_DEVICE_CPU, 0},
                     .ndim = 2,
                     .dtype = KHUB_DTYPE_F32,
                     .shape = ys,
                     .strides = st,
                     .byte_offset = OFF * sizeof(float)};
    khub_binding *b = select_op(f.rt, KHUB_OP_EMBEDDING, khub_dtype_id_of(t.dtype),
                                KHUB_EMBEDDING_STRIDED_OUT | KHUB_EMBEDDING_SCALE);
    khub_embedding_args a = {KHUB_STRUCT_INIT(khub_embedding_args),
                             .table = &t,
                             .ids = ids,
                             .y = &y,
                             .n = N,
                             .scale = 2.5f};
    ASSERT_OK(khub_binding_call(b, &a));
    khub_tensor yc = {.data = compact,
                      .device = {KHUB_DEVICE_CPU, 0},
                      .ndim = 2,
                      .dtype = KHUB_DTYPE_F32,
                      .shape = ys};
    a.y = &yc;
    ASSERT_OK(khub_binding_call(b, &a));
    for (int64_t i = 0; i < OFF; i++) ASSERT(buf[i] == -7.0f);
    for (int64_t r = 0; r < N; r++) {
        ASSERT_EQ(memcmp(buf + OFF + r * RS, compact + r * HIDDEN, HIDDEN * sizeof(float)), 0);
        for (int64_t k = HIDDEN; k < RS && r < N - 1; k++) ASSERT(buf[OFF + r * RS + k] == -7.0f);
    }
    /* values of a row must be contiguous */
    st[1] = 2;
    a.y = &y;
    ASSERT_STATUS(khub_binding_call(b, &a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    "khub/ref-cpu 0.1.0 :: embedding: embedding: y.strides[1] (got 2, want 1: a "
                    "row's values are contiguous)");
    free(table);
    khub_runtime_free(f.rt);
}

/* An id outside [0, vocab) fails the call before anything is written. */
TEST_IMPL(embedding_bad_id_refused)
{
    fix f = setup();
    size_t bytes;
    void *table = make_table(KHUB_DTYPE_F16, &bytes);
    int64_t ts[2] = {VOCAB, HIDDEN}, ys[2] = {3, HIDDEN};
    khub_tensor t = {.data = table,
                     .device = {KHUB_DEVICE_CPU, 0},
                     .ndim = 2,
                     .dtype = KHUB_DTYPE_F16,
                     .shape = ts};
    static float out[3 * HIDDEN];
    for (int i = 0; i < 3 * HIDDEN; i++) out[i] = -7.0f;
    khub_tensor y = {.data = out,
                     .device = {KHUB_DEVICE_CPU, 0},
                     .ndim = 2,
                     .dtype = KHUB_DTYPE_F32,
                     .shape = ys};
    khub_binding *b = select_op(f.rt, KHUB_OP_EMBEDDING, KHUB_DTYPE_ID_F16, 0);
    const int32_t bad[3] = {5, 300, 1};
    khub_embedding_args a = {KHUB_STRUCT_INIT(khub_embedding_args), .table = &t, .ids = bad,
                             .y = &y, .n = 3};
    ASSERT_STATUS(khub_binding_call(b, &a), KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(khub_runtime_errmsg(f.rt),
                  "khub/ref-cpu 0.1.0 :: embedding: embedding: token id 300 at position 1 is "
                  "outside the vocabulary [0, 300)");
    for (int i = 0; i < 3 * HIDDEN; i++) ASSERT(out[i] == -7.0f);
    const int32_t neg[1] = {-1};
    a.ids = neg, a.n = 1;
    ASSERT_STATUS(khub_binding_call(b, &a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    "embedding: token id -1 at position 0 is outside the vocabulary [0, 300)");
    a.n = 4; /* more ids than y has rows */
    ASSERT_STATUS(khub_binding_call(b, &a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt), "embedding: n (got 4, want 0..y.shape[0] 3)");
    /* the executor's lookup says the same of the same id */
    khub__weight w = {.shape = {VOCAB, HIDDEN}, .name = "token_embd.weight"};
    w.t = t;
    w.t.shape = w.shape;
    khub__clear(f.rt); /* the first message wins: make room for the lookup's */
    ASSERT_STATUS(khub__weight_rows(f.rt, &w, bad, 3, out, NULL, NULL), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub_runtime_errmsg(f.rt),
                    "token id 300 at position 1 is outside the vocabulary [0, 300)");
    free(table);
    khub_runtime_free(f.rt);
}

/* The manifest self-test of the kind (what khub check runs for a kernel's
 * kernel.json "selftests"): ref-cpu against itself scores 0 for every
 * format, and a shape that does not fit the kind is refused. */
TEST_IMPL(embedding_selftest_kind)
{
    fix f = setup();
    const char *dts[] = {"f32",  "f16",  "bf16", "q8_0", "q4_0",     "q4_1",
                         "q5_0", "q5_1", "q4_k", "q6_k", "int8_row", "nf4"};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        khub_selftest_spec s = {"embedding", {17, 300, 512}, 3, dts[i], 0.0};
        double nmse = -1;
        char rep[256];
        ASSERT_OK(khub__selftest_run(f.rt, "khub/ref-cpu", &s, &nmse, rep, sizeof rep));
        ASSERT(nmse == 0.0);
        char want[96];
        snprintf(want, sizeof want, "embedding [17, 300, 512] %s: NMSE 0 <= 0", dts[i]);
        ASSERT_STR_EQ(rep, want);
    }
    khub_selftest_spec bad = {"embedding", {17, 300, 100}, 3, "q4_k", 0.0}; /* 100: no K block */
    char rep[256];
    ASSERT_STATUS(khub__selftest_run(f.rt, "khub/ref-cpu", &bad, NULL, rep, sizeof rep),
                  KHUB_STATUS_INVALID_ARG);
    ASSERT_STR_EQ(rep, "embedding [17, 300, 100] q4_k: shape or dtype does not fit a 9-kind op");
    khub_runtime_free(f.rt);
}

#define TEST_LIST(X) \
    X(embedding_matches_executor_lookup_every_format) \
    X(embedding_strided_offset_output) \
    X(embedding_bad_id_refused) \
    X(embedding_selftest_kind)
TEST_MAIN(TEST_LIST)
