/*
 * test_gpu_linear.c (CTest label gpu): kernels-community/gemv's linear and
 * qlinear against khub/ref-cpu on executor-shaped tensors (issue 19 item
 * 2): x starting 64 floats into its buffer with rows in + 16 floats apart,
 * y 32 floats in with rows out + 8 apart (the gaps must stay zero), a bias
 * 8 floats in. Each weight format (f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q4_K,
 * Q6_K, NF4) through the GEMV (1 and 17 rows) and the tensor-core GEMM (37
 * and 130 rows; above the glue's 32), dense weights also on 100 -> 7 with
 * 65 rows (K, N and M not whole tiles). SmolLM2-135M's shapes (hidden 576,
 * ffn 1536). Then the GEMM's (and the GEMV's) time and GFLOP/s for
 * SmolLM2's prefill projections.
 *
 * Tolerances (NMSE against ref-cpu, which sums in double): the GEMV is f32
 * arithmetic, 1e-10. The GEMM rounds x (and decoded block weights) to f16,
 * relative error <= 2^-11, which for these U(-1, 1) inputs gives an NMSE of
 * about 1e-7: held to 1e-6. bf16 weights stage x as bf16 (<= 2^-8, about
 * 3e-6): held to 3e-5.
 *
 * KHUB_GPU_KERNELS names the folder of built kernels (tools/gpu-check.sh);
 * skips without it or a driver; on the fake driver nothing is compared or
 * timed (gpu_bench.h).
 */
#include <time.h>

#include "gpu_bench.h"

enum { HID = 576, FFN = 1536, GEMM_ABOVE = 32 /* gemv_cuda.c's */ };
enum { XOFF = 64, YOFF = 32, BOFF = 8, XPAD = 16, YPAD = 8 };

/* A weight [out, in] of dtype dt as bytes: f32 U(-1, 1); f16 in +-[0.125,
 * 0.9]; bf16 the top half of U(-1, 1) floats; block formats random codes
 * with every scale (and min) set to a small value (NF4: an f32 absmax in
 * [0.5, 1.5)), so each block decodes to numbers of order 1. */
static buf weight_buf(khub_dtype dt, int64_t out, int64_t in, size_t *row_bytes)
{
    int id = khub_dtype_id_of(dt);
    size_t rb = id == KHUB_DTYPE_ID_F32 ? (size_t)in * 4
                : id == KHUB_DTYPE_ID_F16 || id == KHUB_DTYPE_ID_BF16
                    ? (size_t)in * 2
                    : (size_t)khub_qformat_row_bytes(dt.bits, in);
    size_t bytes = rb * (size_t)out;
    buf w = mkbuf((bytes + 3) / 4, id == KHUB_DTYPE_ID_F32);
    uint8_t *b = (uint8_t *)w.h;
    if (id == KHUB_DTYPE_ID_F16) {
        for (size_t i = 0; i < (size_t)in * (size_t)out; i++) {
            uint16_t h = (uint16_t)(0x3000 + (rng_next() % 0x0c00)); /* 0.125 .. 0.9 */
            if (rng_next() & 1) h |= 0x8000;
            memcpy(b + 2 * i, &h, 2);
        }
    } else if (id == KHUB_DTYPE_ID_BF16) {
        for (size_t i = 0; i < (size_t)in * (size_t)out; i++) {
            float f = rnd();
            uint32_t u;
            memcpy(&u, &f, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(b + 2 * i, &h, 2);
        }
    } else if (id != KHUB_DTYPE_ID_F32) {
        for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)rng_next();
        int64_t bb = khub_qformat_block_bytes(dt.bits);
        for (size_t blk = 0; blk < bytes / (size_t)bb; blk++) {
            uint8_t *p = b + blk * (size_t)bb;
            if (dt.bits == KHUB_QFORMAT_NF4) {
                float amax = 1.0f + 0.5f * rnd();
                memcpy(p, &amax, 4);
                continue;
            }
            /* offsets of the f16 scale fields in a block */
            int offs[2] = {0, -1};
            if (dt.bits == KHUB_QFORMAT_Q4_1 || dt.bits == KHUB_QFORMAT_Q4_K) offs[1] = 2;
            if (dt.bits == KHUB_QFORMAT_Q6_K) offs[0] = 208;
            for (int f = 0; f < 2; f++) {
                if (offs[f] < 0) continue;
                uint16_t h = (uint16_t)(0x2000 + (rng_next() % 0x0800)); /* ~0.008 .. 0.03 */
                memcpy(p + offs[f], &h, 2);
            }
        }
    }
    upload(&w);
    *row_bytes = rb;
    return w;
}

static int device_cc(void)
{
    int cc = 0;
    if (khub__cuda_host_device_cc(NULL, 0, &cc) != KHUB_STATUS_OK) TEST_FAIL_("no device cc");
    return cc;
}

/* The path the glue takes and the tolerance that goes with it. */
static double tolerance(khub_dtype dt, int64_t n, const char **path)
{
    int id = khub_dtype_id_of(dt);
    bool gemm = n > GEMM_ABOVE && id != KHUB_DTYPE_ID_F32 &&
                (id != KHUB_DTYPE_ID_BF16 || device_cc() >= 80);
    *path = gemm ? "GEMM" : "GEMV";
    return !gemm ? 1e-10 : id == KHUB_DTYPE_ID_BF16 ? 3e-5 : 1e-6;
}

static const char *dtype_name(khub_dtype dt)
{
    static const char *const q[] = {"?", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "INT8_ROW", "NF4"};
    int id = khub_dtype_id_of(dt);
    return id == KHUB_DTYPE_ID_F32    ? "f32"
           : id == KHUB_DTYPE_ID_F16  ? "f16"
           : id == KHUB_DTYPE_ID_BF16 ? "bf16"
           : dt.bits < 8              ? q[dt.bits]
                                      : "?";
}

/* y = x W^T + bias for n rows on executor-shaped tensors, the CUDA op
 * against ref-cpu; y's whole buffer is compared (its gaps stay zero). */
static void linear_case(khub_binding *cu, khub_binding *ref, khub_dtype dt, int64_t n, int64_t in,
                        int64_t out)
{
    size_t rb = 0, ny = (size_t)(YOFF + n * (out + YPAD));
    buf x = mkbuf((size_t)(XOFF + n * (in + XPAD)), true), bias = mkbuf((size_t)(BOFF + out), true),
        y = mkbuf(ny, false), w = weight_buf(dt, out, in, &rb);
    float *got = malloc(ny * sizeof(float));
    ASSERT(got);
    int64_t xs[2] = {n, in}, xst[2] = {in + XPAD, 1}, ws[2] = {out, in}, ys[2] = {n, out},
            yst[2] = {out + YPAD, 1}, bs[1] = {out};
    khub_tensor dx = view(&x, true, XOFF, 2, xs, xst), dw = view(&w, true, 0, 2, ws, NULL),
                db = view(&bias, true, BOFF, 1, bs, NULL), dy = view(&y, true, YOFF, 2, ys, yst);
    dw.dtype = dt;
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), .x = &dx, .weight = &dw, .bias = &db,
                          .y = &dy};
    ASSERT_OK(khub_binding_call(cu, &a));
    download(&y, got);
    khub_tensor hx = view(&x, false, XOFF, 2, xs, xst), hw = view(&w, false, 0, 2, ws, NULL),
                hb = view(&bias, false, BOFF, 1, bs, NULL), hy = view(&y, false, YOFF, 2, ys, yst);
    hw.dtype = dt;
    a.x = &hx, a.weight = &hw, a.bias = &hb, a.y = &hy;
    ASSERT_OK(khub_binding_call(ref, &a));
    const char *path = "";
    double tol = fake_driver ? 0 : tolerance(dt, n, &path);
    char what[128];
    snprintf(what, sizeof what, "%s %s x [%lld, %lld] W [%lld, %lld] + bias", path, dtype_name(dt),
             (long long)n, (long long)in, (long long)out, (long long)in);
    compare(what, got, y.h, ny, tol);
    free(got);
    freebuf(&x), freebuf(&bias), freebuf(&y), freebuf(&w);
}

static void binding_pair(khub_runtime *rt, khub_dtype dt, khub_binding **cu, khub_binding **ref)
{
    int id = khub_dtype_id_of(dt);
    uint32_t kind = dt.code == KHUB_DL_BLOCKQ ? KHUB_OP_QLINEAR : KHUB_OP_LINEAR;
    *cu = op_dt(rt, kind, true, "kernels-community/gemv", id, KHUB_CAP_BIAS, 0);
    *ref = op_dt(rt, kind, false, "khub/ref-cpu", id, KHUB_CAP_BIAS, 0);
}

TEST_IMPL(gpu_linear_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "gemv");
    khub_dtype dts[3] = {KHUB_DTYPE_F32, KHUB_DTYPE_F16, KHUB_DTYPE_BF16};
    for (int d = 0; d < 3; d++) {
        khub_binding *cu, *ref;
        binding_pair(rt, dts[d], &cu, &ref);
        linear_case(cu, ref, dts[d], 1, HID, FFN);   /* decode: gate/up */
        linear_case(cu, ref, dts[d], 17, FFN, HID);  /* GEMV row tiles: down */
        linear_case(cu, ref, dts[d], 37, HID, FFN);  /* GEMM: one row tile */
        linear_case(cu, ref, dts[d], 130, FFN, HID); /* GEMM: three row tiles, the last short */
        linear_case(cu, ref, dts[d], 3, 100, 7);     /* a row not in whole pieces */
        linear_case(cu, ref, dts[d], 65, 100, 7);    /* GEMM: K, N, M not whole tiles */
    }
    khub_runtime_free(rt);
}

TEST_IMPL(gpu_qlinear_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "gemv");
    static const khub_qformat fmts[] = {KHUB_QFORMAT_Q8_0, KHUB_QFORMAT_Q4_0, KHUB_QFORMAT_Q4_1,
                                        KHUB_QFORMAT_Q4_K, KHUB_QFORMAT_Q6_K, KHUB_QFORMAT_NF4};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        khub_binding *cu, *ref;
        binding_pair(rt, KHUB_DTYPE_Q(fmts[i]), &cu, &ref);
        /* in = 1536 is whole blocks of 32, 64 (NF4) and 256 (the K formats) */
        static const int64_t rows[] = {1, 17, 37, 130}; /* GEMV, GEMV, GEMM, GEMM */
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
            linear_case(cu, ref, KHUB_DTYPE_Q(fmts[i]), rows[r], FFN, HID);
        linear_case(cu, ref, KHUB_DTYPE_Q(fmts[i]), 37, 512, 100); /* N not whole tiles */
    }
    khub_runtime_free(rt);
}

/* ======================================================================== */
/* Timing                                                                   */
/* ======================================================================== */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The median of 5 runs of REPS calls of op on x [n, in] W [out, in]: the
 * time per call and 2 n in out / time. */
static void time_case(khub_binding *cu, khub_dtype dt, int64_t n, int64_t in, int64_t out)
{
    enum { REPS = 20, RUNS = 5 };
    size_t rb = 0;
    buf x = mkbuf((size_t)(n * in), true), y = mkbuf((size_t)(n * out), false),
        w = weight_buf(dt, out, in, &rb);
    int64_t xs[2] = {n, in}, ws[2] = {out, in}, ys[2] = {n, out};
    khub_tensor dx = view(&x, true, 0, 2, xs, NULL), dw = view(&w, true, 0, 2, ws, NULL),
                dy = view(&y, true, 0, 2, ys, NULL);
    dw.dtype = dt;
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), .x = &dx, .weight = &dw, .y = &dy};
    ASSERT_OK(khub_binding_call(cu, &a)); /* warm: module loaded, caches filled */
    ASSERT_OK(khub__cuda_host_stream_sync(NULL, NULL));
    double t[RUNS];
    for (int r = 0; r < RUNS; r++) {
        double t0 = now_s();
        for (int i = 0; i < REPS; i++) ASSERT_OK(khub_binding_call(cu, &a));
        ASSERT_OK(khub__cuda_host_stream_sync(NULL, NULL));
        t[r] = (now_s() - t0) / REPS;
    }
    for (int i = 1; i < RUNS; i++) /* insertion sort, for the median */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double s = t[j];
            t[j] = t[j - 1], t[j - 1] = s;
        }
    const char *path = "";
    tolerance(dt, n, &path);
    printf("  time %s %s x [%lld, %lld] W [%lld, %lld]: %.1f us, %.0f GFLOP/s\n", path,
           dtype_name(dt), (long long)n, (long long)in, (long long)out, (long long)in, t[2] * 1e6,
           2.0 * (double)n * (double)in * (double)out / t[2] * 1e-9);
    freebuf(&x), freebuf(&y), freebuf(&w);
}

/* SmolLM2's prefill projections (q/o 576 -> 576, k/v 576 -> 192, gate/up
 * 576 -> 1536, down 1536 -> 576) at 512 tokens in Q4_1 and f16, and
 * gate/up at 32 rows (the last GEMV) and 33 (the first GEMM) for the
 * threshold. Prints; fails only when a call fails. */
TEST_IMPL(gpu_gemm_timing)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "gemv");
    if (fake_driver) {
        printf("  GEMM timing: fake driver, nothing timed\n");
        khub_runtime_free(rt);
        return;
    }
    khub_dtype dts[2] = {KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), KHUB_DTYPE_F16};
    static const int64_t shapes[][2] = {{HID, HID}, {HID, 192}, {HID, FFN}, {FFN, HID}};
    for (int d = 0; d < 2; d++) {
        khub_binding *cu, *ref;
        binding_pair(rt, dts[d], &cu, &ref);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            time_case(cu, dts[d], 512, shapes[s][0], shapes[s][1]);
        time_case(cu, dts[d], 32, HID, FFN);
        time_case(cu, dts[d], 33, HID, FFN);
    }
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(gpu_linear_vs_ref_cpu) \
    X(gpu_qlinear_vs_ref_cpu) \
    X(gpu_gemm_timing)
TEST_MAIN(TEST_LIST)
