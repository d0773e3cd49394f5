/*
 * test_gemv_cuda.c: the host glue of kernels-community/gemv
 * (kernels-src/gemv/gemv_cuda.c, issue 19 item 2) on the fake driver
 * (tests/fake_cuda): which kernel a call launches (the GEMV at or below 32
 * x rows, the tensor-core GEMM above them where the device's compute
 * capability has the format's GEMM), with the grid and block the glue
 * computes and the addresses of executor-shaped (offset, row-strided)
 * tensors, and what it refuses, with the exact message.
 *
 * The fake driver runs no kernel and does not parse PTX, so the glue's PTX
 * artifacts here are stand-ins, one per capability kernel.json lists. That
 * the real NVRTC build holds every kernel the glue can name is
 * tests/t_author.sh's check; the numbers are tools/gpu-check.sh's
 * (test_gpu_ops, on a GPU).
 */
#include "gpu_bench.h" /* sha256_file */

/* ======================================================================== */
/* The fake driver and the glue                                             */
/* ======================================================================== */

static long (*fake_stat)(const char *);
static const char *(*launch_name)(long);
static unsigned long long (*launch_arg0)(long);
static int (*launch_dims)(long, unsigned *);

/* The fake driver with one GPU of compute capability cc and 1 GiB. */
static void fake(int cc)
{
    char spec[32];
    snprintf(spec, sizeof spec, "12080:%d", cc);
    setenv("KHUB_FAKE_CUDA", spec, 1);
    setenv("KHUB_FAKE_CUDA_MEM", "1073741824", 1);
    unsetenv("KHUB_FAKE_CUDA_FAIL");
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) TEST_FAIL_("the fake driver: %s", dlerror());
    fake_stat = (long (*)(const char *))dlsym(h, "khub_fake_cuda_stat");
    launch_name = (const char *(*)(long))dlsym(h, "khub_fake_cuda_launch_name");
    launch_arg0 = (unsigned long long (*)(long))dlsym(h, "khub_fake_cuda_launch_arg0");
    launch_dims = (int (*)(long, unsigned *))dlsym(h, "khub_fake_cuda_launch_dims");
    ASSERT(fake_stat && launch_name && launch_arg0 && launch_dims);
}

static khub_runtime *g_rt; /* the case's runtime (one per process) */
static char g_dir[] = "/tmp/khub-gemv-XXXXXX", g_paths[3][96];

/* A runtime with the gemv glue loaded, its stand-in PTX for sm_75, sm_80 and
 * sm_90 as verified artifacts in a temporary folder (glue_free removes it:
 * they are read at the first call). */
static khub_runtime *glue_runtime(void)
{
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 1};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    ASSERT(mkdtemp(g_dir));
    static const int ccs[] = {75, 80, 90};
    static char names[3][32], sums[3][65];
    char(*paths)[96] = g_paths;
    khub__artifact_file files[3];
    for (int i = 0; i < 3; i++) {
        snprintf(names[i], sizeof names[i], "gemv.sm_%d.ptx", ccs[i]);
        snprintf(paths[i], sizeof paths[i], "%s/%s", g_dir, names[i]);
        char text[64];
        /* with its NUL, as khub build writes PTX (the host requires it) */
        int n = snprintf(text, sizeof text, "// stand-in PTX for sm_%d\n", ccs[i]) + 1;
        FILE *f = fopen(paths[i], "wb");
        ASSERT(f && fwrite(text, 1, (size_t)n, f) == (size_t)n);
        fclose(f);
        sha256_file(paths[i], sums[i]);
        files[i] = (khub__artifact_file){names[i], paths[i], sums[i]};
    }
    const char *so = KHUB_TEST_PLUGIN_DIR "/gemv_cuda.so";
    char so_sum[65];
    sha256_file(so, so_sum);
    if (khub__plugin_load_verified(rt, so, so_sum, files, 3, NULL) != KHUB_STATUS_OK)
        TEST_FAIL_("loading %s: %s", so, khub_runtime_errmsg(rt));
    return g_rt = rt;
}

static void glue_free(khub_runtime *rt)
{
    khub_runtime_free(rt);
    for (int i = 0; i < 3; i++) unlink(g_paths[i]);
    rmdir(g_dir);
}

static khub_binding *gemv_op(khub_runtime *rt, uint32_t kind, int dtype_id)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = kind,
                       .device_type = KHUB_DEVICE_CUDA, .dtype_id = dtype_id,
                       .flags = KHUB_CAP_BIAS,          .plugin_id = "kernels-community/gemv"};
    khub_binding *b = NULL;
    if (khub_registry_select(rt, &q, &b) != KHUB_STATUS_OK)
        TEST_FAIL_("selecting gemv: %s", khub_runtime_errmsg(rt));
    return b;
}

/* ======================================================================== */
/* One call                                                                 */
/* ======================================================================== */

/* Device memory for one call: x rows XS floats apart from float X0 of its
 * block, y rows YS floats apart from float Y0, a weight and a bias. */
enum { X0 = 16, Y0 = 8 };

typedef struct call {
    uint64_t xd, yd, wd, bd;
    int64_t xs[2], ws[2], ys[2], bs[1], xst[2], yst[2];
    khub_tensor x, w, y, b;
    khub_linear_args a;
} call;

static uint64_t dalloc(size_t bytes)
{
    uint64_t d = 0;
    khub__plugin_msg_clear();
    if (khub__cuda_host_mem_alloc(NULL, 0, bytes, &d) != KHUB_STATUS_OK)
        TEST_FAIL_("cuMemAlloc of %zu B: %s", bytes, khub__plugin_msg());
    return d;
}

/* y [n, out] = x [n, in] W^T + bias with W of dtype dt; x rows in + 8
 * floats apart, y rows out + 4 apart, both at an offset. */
static void call_init(call *c, khub_dtype dt, int64_t n, int64_t in, int64_t out)
{
    memset(c, 0, sizeof *c);
    int id = khub_dtype_id_of(dt);
    int64_t rb = id == KHUB_DTYPE_ID_F32 ? in * 4
                 : id == KHUB_DTYPE_ID_F16 || id == KHUB_DTYPE_ID_BF16
                     ? in * 2
                     : khub_qformat_row_bytes((khub_qformat)dt.bits, in);
    if (rb <= 0) rb = in; /* a format the glue refuses: any bytes */
    c->xd = dalloc((size_t)(X0 + n * (in + 8)) * 4);
    c->yd = dalloc((size_t)(Y0 + n * (out + 4)) * 4);
    c->wd = dalloc((size_t)(rb * out));
    c->bd = dalloc((size_t)out * 4);
    c->xs[0] = n, c->xs[1] = in, c->xst[0] = in + 8, c->xst[1] = 1;
    c->ys[0] = n, c->ys[1] = out, c->yst[0] = out + 4, c->yst[1] = 1;
    c->ws[0] = out, c->ws[1] = in, c->bs[0] = out;
    khub_device cu = {KHUB_DEVICE_CUDA, 0};
    c->x = (khub_tensor){(void *)(uintptr_t)c->xd, cu, 2, KHUB_DTYPE_F32, c->xs, c->xst, 4 * X0};
    c->y = (khub_tensor){(void *)(uintptr_t)c->yd, cu, 2, KHUB_DTYPE_F32, c->ys, c->yst, 4 * Y0};
    c->w = (khub_tensor){(void *)(uintptr_t)c->wd, cu, 2, dt, c->ws, NULL, 0};
    c->b = (khub_tensor){(void *)(uintptr_t)c->bd, cu, 1, KHUB_DTYPE_F32, c->bs, NULL, 0};
    c->a = (khub_linear_args){KHUB_STRUCT_INIT(khub_linear_args), .x = &c->x, .weight = &c->w,
                              .bias = &c->b, .y = &c->y};
}

static void call_free(call *c)
{
    khub__cuda_host_stream_sync(NULL, NULL);
    khub__cuda_host_mem_free(NULL, c->xd);
    khub__cuda_host_mem_free(NULL, c->yd);
    khub__cuda_host_mem_free(NULL, c->wd);
    khub__cuda_host_mem_free(NULL, c->bd);
}

/* Calls op with n rows and checks the one launch it makes: the kernel's
 * name, grid (gx, gy, 1), block (128, 1, 1), no dynamic shared memory,
 * and x's address (its first argument) with the offset applied. */
static void expect_launch(khub_binding *op, khub_dtype dt, int64_t n, int64_t in, int64_t out,
                          const char *kernel, unsigned gx, unsigned gy)
{
    call c;
    call_init(&c, dt, n, in, out);
    long before = fake_stat("launches");
    khub_status st = khub_binding_call(op, &c.a);
    if (st != KHUB_STATUS_OK)
        TEST_FAIL_("%s for %lld rows: %s", kernel, (long long)n, khub_runtime_errmsg(g_rt));
    ASSERT_EQ(fake_stat("launches"), before + 1);
    ASSERT_STR_EQ(launch_name(before), kernel);
    unsigned d[7];
    ASSERT(launch_dims(before, d));
    unsigned want[7] = {gx, gy, 1, 128, 1, 1, 0};
    for (int i = 0; i < 7; i++)
        if (d[i] != want[i])
            TEST_FAIL_("%s, %lld rows: launch dims[%d] = %u, want %u", kernel, (long long)n, i,
                       d[i], want[i]);
    ASSERT_EQ(launch_arg0(before), c.xd + 4 * X0);
    call_free(&c);
}

/* ======================================================================== */
/* The cases                                                                */
/* ======================================================================== */

/* SmolLM2's shapes on a device of capability 9.0: each format's GEMV at
 * 1 and 32 rows (4 output rows per block, 8 x rows per grid row), its GEMM
 * at 33 and 512 (64 x 64 tiles); f32 weights have no GEMM. */
TEST_IMPL(gemv_cuda_paths_by_rows_sm90)
{
    fake(90);
    khub_runtime *rt = glue_runtime();
    static const struct {
        khub_qformat f;
        const char *sfx;
    } q[] = {{KHUB_QFORMAT_Q8_0, "q8_0"}, {KHUB_QFORMAT_Q4_0, "q4_0"}, {KHUB_QFORMAT_Q4_1, "q4_1"},
             {KHUB_QFORMAT_Q4_K, "q4_k"}, {KHUB_QFORMAT_Q6_K, "q6_k"}, {KHUB_QFORMAT_NF4, "nf4"}};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        khub_binding *op = gemv_op(rt, KHUB_OP_QLINEAR, KHUB_DTYPE_ID_QBASE + (int)q[i].f);
        char gemv[32], gemm[32];
        snprintf(gemv, sizeof gemv, "khub_gemv_%s", q[i].sfx);
        snprintf(gemm, sizeof gemm, "khub_gemm_%s", q[i].sfx);
        expect_launch(op, KHUB_DTYPE_Q(q[i].f), 1, 1536, 576, gemv, 144, 1);
        expect_launch(op, KHUB_DTYPE_Q(q[i].f), 32, 1536, 576, gemv, 144, 4);
        expect_launch(op, KHUB_DTYPE_Q(q[i].f), 33, 1536, 576, gemm, 9, 1);
        expect_launch(op, KHUB_DTYPE_Q(q[i].f), 512, 1536, 576, gemm, 9, 8);
    }
    khub_binding *f16 = gemv_op(rt, KHUB_OP_LINEAR, KHUB_DTYPE_ID_F16);
    expect_launch(f16, KHUB_DTYPE_F16, 1, 576, 1536, "khub_gemv_f16", 384, 1);
    expect_launch(f16, KHUB_DTYPE_F16, 100, 576, 1536, "khub_gemm_f16", 24, 2);
    expect_launch(f16, KHUB_DTYPE_F16, 65, 100, 7, "khub_gemm_f16", 1,
                  2); /* K, N not whole tiles */
    khub_binding *bf16 = gemv_op(rt, KHUB_OP_LINEAR, KHUB_DTYPE_ID_BF16);
    expect_launch(bf16, KHUB_DTYPE_BF16, 8, 576, 1536, "khub_gemv_bf16", 384, 1);
    expect_launch(bf16, KHUB_DTYPE_BF16, 100, 576, 1536, "khub_gemm_bf16", 24, 2);
    khub_binding *f32 = gemv_op(rt, KHUB_OP_LINEAR, KHUB_DTYPE_ID_F32);
    expect_launch(f32, KHUB_DTYPE_F32, 100, 576, 1536, "khub_gemv_f32", 384, 13);
    glue_free(rt);
}

/* Capability 7.5 has f16 mma (m16n8k8) but no bf16 one: bf16 weights stay
 * on the GEMV at any row count; f16 and the block formats get the GEMM. */
TEST_IMPL(gemv_cuda_paths_sm75)
{
    fake(75);
    khub_runtime *rt = glue_runtime();
    khub_binding *bf16 = gemv_op(rt, KHUB_OP_LINEAR, KHUB_DTYPE_ID_BF16);
    expect_launch(bf16, KHUB_DTYPE_BF16, 512, 576, 1536, "khub_gemv_bf16", 384, 64);
    khub_binding *f16 = gemv_op(rt, KHUB_OP_LINEAR, KHUB_DTYPE_ID_F16);
    expect_launch(f16, KHUB_DTYPE_F16, 512, 576, 1536, "khub_gemm_f16", 24, 8);
    khub_binding *nf4 = gemv_op(rt, KHUB_OP_QLINEAR, KHUB_DTYPE_ID_QBASE + KHUB_QFORMAT_NF4);
    expect_launch(nf4, KHUB_DTYPE_Q(KHUB_QFORMAT_NF4), 512, 576, 1536, "khub_gemm_nf4", 24, 8);
    glue_free(rt);
}

/* Refused before any launch, each with its status and message. */
static void expect_refusal(khub_binding *op, call *c, khub_status want, const char *msg)
{
    long before = fake_stat("launches");
    ASSERT_STATUS(khub_binding_call(op, &c->a), want);
    ASSERT_STR_EQ(khub_runtime_errmsg(g_rt), msg);
    ASSERT_EQ(fake_stat("launches"), before);
}

TEST_IMPL(gemv_cuda_refusals)
{
    fake(90);
    khub_runtime *rt = glue_runtime();
    khub_binding *op = gemv_op(rt, KHUB_OP_QLINEAR, KHUB_DTYPE_ID_QBASE + KHUB_QFORMAT_Q4_1);
    call c;
    /* a format without a CUDA kernel here */
    call_init(&c, KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_0), 64, 1536, 576);
    expect_refusal(op, &c, KHUB_STATUS_UNSUPPORTED,
                   "kernels-community/gemv 1.1.0 :: qlinear: qlinear (cuda): weight dtype (code "
                   "192, bits 8) with 1536 columns is not served (f32, f16, bf16, Q8_0, Q4_0, "
                   "Q4_1, Q4_K, Q6_K, NF4 in whole blocks)");
    call_free(&c);
    /* NF4 rows must be whole blocks of 64 */
    call_init(&c, KHUB_DTYPE_Q(KHUB_QFORMAT_NF4), 64, 96, 576);
    expect_refusal(op, &c, KHUB_STATUS_UNSUPPORTED,
                   "kernels-community/gemv 1.1.0 :: qlinear: qlinear (cuda): weight dtype (code "
                   "192, bits 7) with 96 columns is not served (f32, f16, bf16, Q8_0, Q4_0, "
                   "Q4_1, Q4_K, Q6_K, NF4 in whole blocks)");
    call_free(&c);
    /* x with an inner stride, x at an unaligned offset, rows that overlap */
    call_init(&c, KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), 64, 1536, 576);
    c.xst[1] = 2;
    const char *xmsg = "kernels-community/gemv 1.1.0 :: qlinear: qlinear (cuda): x must be a 2-D "
                       "f32 CUDA tensor [n, in] with contiguous rows (strides none or [s >= in, "
                       "1]) at a 4-byte aligned address";
    expect_refusal(op, &c, KHUB_STATUS_INVALID_ARG, xmsg);
    c.xst[1] = 1, c.x.byte_offset = 6;
    expect_refusal(op, &c, KHUB_STATUS_INVALID_ARG, xmsg);
    c.x.byte_offset = 4 * X0, c.xst[0] = 100;
    expect_refusal(op, &c, KHUB_STATUS_INVALID_ARG, xmsg);
    c.xst[0] = 1536 + 8;
    c.yst[0] = 575;
    expect_refusal(op, &c, KHUB_STATUS_INVALID_ARG,
                   "kernels-community/gemv 1.1.0 :: qlinear: qlinear (cuda): y must be a 2-D f32 "
                   "CUDA tensor [n, out] with contiguous rows (strides none or [s >= out, 1]) at "
                   "a 4-byte aligned address");
    c.yst[0] = 580;
    /* shapes that disagree, a strided bias, y over x */
    c.ys[1] = 575;
    c.yst[0] = 575;
    expect_refusal(op, &c, KHUB_STATUS_INVALID_ARG,
                   "kernels-community/gemv 1.1.0 :: qlinear: qlinear (cuda): shapes x [64, 1536], "
                   "weight [576, 1536], y [64, 575] do not agree (or exceed 2^31 - 1)");
    c.ys[1] = 576, c.yst[0] = 580;
    int64_t bst[1] = {2};
    c.b.strides = bst;
    expect_refusal(op, &c, KHUB_STATUS_INVALID_ARG,
                   "kernels-community/gemv 1.1.0 :: qlinear: qlinear (cuda): bias must be a 1-D "
                   "f32 CUDA tensor [out] with unit stride at a 4-byte aligned address, or none");
    c.b.strides = NULL;
    khub_tensor y_over_x = c.x;
    int64_t ys2[2] = {64, 576};
    y_over_x.shape = ys2;
    c.a.y = &y_over_x;
    expect_refusal(op, &c, KHUB_STATUS_INVALID_ARG,
                   "kernels-community/gemv 1.1.0 :: qlinear: qlinear (cuda): y aliases x (want "
                   "separate memory)");
    c.a.y = &c.y;
    /* and the same call, fixed, launches; compact x and y (no strides, as
     * the executor's scratch views) too */
    long before = fake_stat("launches");
    ASSERT_OK(khub_binding_call(op, &c.a));
    c.x.strides = NULL, c.y.strides = NULL;
    ASSERT_OK(khub_binding_call(op, &c.a));
    ASSERT_EQ(fake_stat("launches"), before + 2);
    ASSERT_STR_EQ(launch_name(before + 1), "khub_gemm_q4_1");
    ASSERT_EQ(launch_arg0(before + 1), c.xd + 4 * X0);
    call_free(&c);
    glue_free(rt);
}

#define TEST_LIST(X) \
    X(gemv_cuda_paths_by_rows_sm90) \
    X(gemv_cuda_paths_sm75) \
    X(gemv_cuda_refusals)
TEST_MAIN(TEST_LIST)
