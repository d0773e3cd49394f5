/*
 * test_gpu_ops.c (CTest label gpu): each in-tree CUDA op against
 * khub/ref-cpu on the tensors the executor hands it (issue 19 item 5):
 * rms_norm with the fused residual on rows that start past the start of
 * their buffer, silu_and_mul, and flash attention over strided K/V views
 * (the cache's rows are wider than n_kv_heads x head_dim) for prefill and
 * for a decode step. SmolLM2-135M's shapes: hidden 576, ffn 1536, 9 query
 * and 3 KV heads of 64.
 *
 * KHUB_GPU_KERNELS names a folder of kernel folders built with `khub build`
 * (tools/gpu-check.sh makes it); each CUDA variant's glue is loaded with its
 * PTX as verified artifacts. Skips without that folder or without a CUDA
 * driver. On the fake driver (tests/fake_cuda) no kernel runs: the cases
 * then check only the plumbing (uploads, launches, downloads) and say that
 * they compared nothing.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cuda.h"
#include "plugin_artifacts.h"
#include "runtime_impl.h"
#include "runner.h"

/* ======================================================================== */
/* Loading a built kernel's CUDA variant                                    */
/* ======================================================================== */

static void sha256_file(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    ASSERT(f);
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    unsigned char buf[65536], md[32];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) EVP_DigestUpdate(c, buf, n);
    unsigned len = 0;
    EVP_DigestFinal_ex(c, md, &len);
    EVP_MD_CTX_free(c);
    fclose(f);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

/* Loads kernel folder `name`'s CUDA variant (build/khub1-cu*) from
 * $KHUB_GPU_KERNELS: its glue (*.so) with every other file as artifact. */
static void load_cuda_variant(khub_runtime *rt, const char *name)
{
    const char *root = getenv("KHUB_GPU_KERNELS");
    if (!root) TEST_SKIP("KHUB_GPU_KERNELS is not set (tools/gpu-check.sh sets it)");
    char build[1024], vdir[1400] = "";
    snprintf(build, sizeof build, "%s/%s/build", root, name);
    DIR *d = opendir(build);
    if (!d) TEST_SKIP("%s: not built (khub build)", build);
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "khub1-cu", 8) && !strstr(e->d_name, ".tar"))
            snprintf(vdir, sizeof vdir, "%s/%s", build, e->d_name);
    closedir(d);
    if (!vdir[0]) TEST_SKIP("%s: no CUDA variant (NVRTC missing when it was built?)", build);
    static char paths[16][1600], names[16][256], sums[16][65];
    khub__artifact_file files[16];
    int n = 0, glue = -1;
    d = opendir(vdir);
    ASSERT(d);
    while ((e = readdir(d)) && n < 16) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "metadata.json") || strstr(e->d_name, ".sig"))
            continue;
        snprintf(names[n], sizeof names[n], "%s", e->d_name);
        snprintf(paths[n], sizeof paths[n], "%s/%s", vdir, e->d_name);
        sha256_file(paths[n], sums[n]);
        if (strstr(e->d_name, ".so")) glue = n;
        n++;
    }
    closedir(d);
    ASSERT(glue >= 0);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i != glue) files[k++] = (khub__artifact_file){names[i], paths[i], sums[i]};
    khub_status st =
        khub__plugin_load_verified(rt, paths[glue], sums[glue], files, (size_t)k, NULL);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("loading %s: %s", paths[glue], khub_runtime_errmsg(rt));
}

/* ======================================================================== */
/* The bench: host buffers, their device copies, the comparison             */
/* ======================================================================== */

static bool fake_driver; /* the stand-in driver: kernels do not run */

static khub_runtime *bench_runtime(void)
{
    if (khub__cuda_info(NULL, NULL, NULL) != KHUB_STATUS_OK)
        TEST_SKIP("no CUDA driver on this machine");
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    fake_driver = h && dlsym(h, "khub_fake_cuda_stat");
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    khub_runtime *rt = NULL;
    ASSERT_OK(khub_runtime_new(&o, &rt));
    ASSERT_OK(khub_plugin_load_builtin(rt));
    return rt;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* A buffer of n floats, U(-1, 1) (or zeros), and its device copy. */
typedef struct buf {
    float *h;
    uint64_t d;
    size_t n;
} buf;

static buf mkbuf(size_t n, bool fill)
{
    buf b = {calloc(n, sizeof(float)), 0, n};
    ASSERT(b.h);
    for (size_t i = 0; fill && i < n; i++) b.h[i] = rnd();
    khub__plugin_msg_clear();
    if (khub__cuda_host_mem_alloc(NULL, 0, n * sizeof(float), &b.d) != KHUB_STATUS_OK)
        TEST_FAIL_("cuMemAlloc of %zu floats: %s", n, khub__plugin_msg());
    if (khub__cuda_host_memcpy_htod(NULL, b.d, b.h, n * sizeof(float), NULL) != KHUB_STATUS_OK)
        TEST_FAIL_("upload: %s", khub__plugin_msg());
    return b;
}

/* The device copy back into out[n] (after the stream drained). */
static void download(const buf *b, float *out)
{
    khub__plugin_msg_clear();
    if (khub__cuda_host_stream_sync(NULL, NULL) != KHUB_STATUS_OK ||
        khub__cuda_host_memcpy_dtoh(NULL, out, b->d, b->n * sizeof(float), NULL) !=
            KHUB_STATUS_OK ||
        khub__cuda_host_stream_sync(NULL, NULL) != KHUB_STATUS_OK)
        TEST_FAIL_("download: %s", khub__plugin_msg());
}

static void freebuf(buf *b)
{
    khub__cuda_host_mem_free(NULL, b->d);
    free(b->h);
}

/* A tensor over a buffer, from element `off`, with row strides (NULL =
 * compact). shape and strides are borrowed. */
static khub_tensor view(const buf *b, bool device, size_t off, int nd, int64_t *shape,
                        int64_t *strides)
{
    return (khub_tensor){.data = device ? (void *)(uintptr_t)(b->d + off * sizeof(float))
                                        : (void *)(b->h + off),
                         .device = {device ? KHUB_DEVICE_CUDA : KHUB_DEVICE_CPU, 0},
                         .ndim = nd,
                         .dtype = KHUB_DTYPE_F32,
                         .shape = shape,
                         .strides = strides};
}

static khub_binding *op(khub_runtime *rt, uint32_t kind, bool cuda, const char *plugin,
                        uint32_t flags, int32_t head_dim)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = kind,
                       .device_type = cuda ? KHUB_DEVICE_CUDA : KHUB_DEVICE_CPU,
                       .dtype_id = KHUB_DTYPE_ID_F32,
                       .flags = flags,
                       .head_dim = head_dim,
                       .plugin_id = plugin};
    khub_binding *b = NULL;
    if (khub_registry_select(rt, &q, &b) != KHUB_STATUS_OK)
        TEST_FAIL_("%s: %s", plugin, khub_runtime_errmsg(rt));
    return b;
}

/* NMSE of got against want over n values, printed; fails above tol. On
 * the fake driver it compares nothing and says so. */
static void compare(const char *what, const float *got, const float *want, size_t n, double tol)
{
    if (fake_driver) {
        printf("  %s: fake driver, nothing compared\n", what);
        return;
    }
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        err += d * d;
        ref += (double)want[i] * want[i];
    }
    double nmse = ref > 0 ? err / ref : err;
    printf("  %s: NMSE %.3g (tolerance %.0e)\n", what, nmse, tol);
    if (!(nmse <= tol)) TEST_FAIL_("%s: NMSE %.3g above %.0e", what, nmse, tol);
}

/* ======================================================================== */
/* The ops                                                                  */
/* ======================================================================== */

enum { HID = 576, FFN = 1536, NH = 9, NKV = 3, HD = 64, OFF = 64 };

static void norm_case(khub_runtime *rt, khub_binding *cu, khub_binding *ref, int64_t rows)
{
    size_t n = (size_t)rows * HID;
    buf x = mkbuf(OFF + n, true), res = mkbuf(n, true), w = mkbuf(HID, true), y = mkbuf(n, false);
    float *res0 = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)),
          *got_res = malloc(n * sizeof(float));
    ASSERT(res0 && got && got_res);
    memcpy(res0, res.h, n * sizeof(float));
    int64_t sh[2] = {rows, HID}, wsh[1] = {HID};
    khub_tensor dx = view(&x, true, OFF, 2, sh, NULL), dr = view(&res, true, 0, 2, sh, NULL),
                dw = view(&w, true, 0, 1, wsh, NULL), dy = view(&y, true, 0, 2, sh, NULL);
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .norm_type = KHUB_NORM_RMS,
                        .eps = 1e-5f,
                        .x = &dx,
                        .residual = &dr,
                        .weight = &dw,
                        .y = &dy};
    ASSERT_OK(khub_binding_call(cu, &a));
    download(&y, got);
    download(&res, got_res);
    khub_tensor hx = view(&x, false, OFF, 2, sh, NULL), hr = view(&res, false, 0, 2, sh, NULL),
                hw = view(&w, false, 0, 1, wsh, NULL), hy = view(&y, false, 0, 2, sh, NULL);
    a.x = &hx, a.residual = &hr, a.weight = &hw, a.y = &hy;
    ASSERT_OK(khub_binding_call(ref, &a));
    char what[64];
    snprintf(what, sizeof what, "rms_norm+residual [%lld, %d] y", (long long)rows, HID);
    compare(what, got, y.h, n, 1e-10);
    snprintf(what, sizeof what, "rms_norm+residual [%lld, %d] residual", (long long)rows, HID);
    compare(what, got_res, res.h, n, 1e-12);
    free(res0), free(got), free(got_res);
    freebuf(&x), freebuf(&res), freebuf(&w), freebuf(&y);
}

TEST_IMPL(gpu_rms_norm_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "rmsnorm");
    khub_binding *cu =
        op(rt, KHUB_OP_NORM, true, "kernels-community/rmsnorm", KHUB_CAP_RESIDUAL, 0);
    khub_binding *ref = op(rt, KHUB_OP_NORM, false, "khub/ref-cpu", KHUB_CAP_RESIDUAL, 0);
    for (int64_t rows = 1; rows <= 33; rows += 16) norm_case(rt, cu, ref, rows); /* 1, 17, 33 */
    khub_runtime_free(rt);
}

TEST_IMPL(gpu_silu_and_mul_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "activation");
    khub_binding *cu = op(rt, KHUB_OP_ACTIVATION, true, "kernels-community/activation", 0, 0);
    khub_binding *ref = op(rt, KHUB_OP_ACTIVATION, false, "khub/ref-cpu", 0, 0);
    for (int64_t rows = 1; rows <= 17; rows += 16) {
        size_t n = (size_t)rows * FFN;
        buf g = mkbuf(n, true), u = mkbuf(n, true), y = mkbuf(n, false);
        float *got = malloc(n * sizeof(float));
        ASSERT(got);
        int64_t sh[2] = {rows, FFN};
        khub_tensor dg = view(&g, true, 0, 2, sh, NULL), du = view(&u, true, 0, 2, sh, NULL),
                    dy = view(&y, true, 0, 2, sh, NULL);
        khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args), .act_type = KHUB_ACT_SILU,
                                  .gate = &dg, .up = &du, .y = &dy};
        ASSERT_OK(khub_binding_call(cu, &a));
        download(&y, got);
        khub_tensor hg = view(&g, false, 0, 2, sh, NULL), hu = view(&u, false, 0, 2, sh, NULL),
                    hy = view(&y, false, 0, 2, sh, NULL);
        a.gate = &hg, a.up = &hu, a.y = &hy;
        ASSERT_OK(khub_binding_call(ref, &a));
        char what[64];
        snprintf(what, sizeof what, "silu_and_mul [%lld, %d]", (long long)rows, FFN);
        compare(what, got, y.h, n, 1e-10);
        free(got);
        freebuf(&g), freebuf(&u), freebuf(&y);
    }
    khub_runtime_free(rt);
}

/* Attention of n_q queries at positions [n_kv - n_q, n_kv) over n_kv cached
 * positions whose K and V rows are ROW floats apart (wider than NKV x HD,
 * as in a cache with room per row). */
static void attn_case(khub_binding *cu, khub_binding *ref, int64_t n_q, int64_t n_kv)
{
    enum { ROW = NKV * HD + 64 };
    size_t nq = (size_t)n_q * NH * HD, nkv = (size_t)n_kv * ROW;
    buf q = mkbuf(nq, true), k = mkbuf(nkv, true), v = mkbuf(nkv, true), o = mkbuf(nq, false);
    float *got = malloc(nq * sizeof(float));
    ASSERT(got);
    int64_t qs[3] = {n_q, NH, HD}, ks[3] = {n_kv, NKV, HD}, kst[3] = {ROW, HD, 1};
    khub_tensor dq = view(&q, true, 0, 3, qs, NULL), dk = view(&k, true, 0, 3, ks, kst),
                dv = view(&v, true, 0, 3, ks, kst), dout = view(&o, true, 0, 3, qs, NULL);
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = &dq,
                             .k = &dk,
                             .v = &dv,
                             .out = &dout,
                             .scale = 0.125f, /* 1/sqrt(64) */
                             .causal = 1,
                             .q_pos0 = n_kv - n_q};
    ASSERT_OK(khub_binding_call(cu, &a));
    download(&o, got);
    khub_tensor hq = view(&q, false, 0, 3, qs, NULL), hk = view(&k, false, 0, 3, ks, kst),
                hv = view(&v, false, 0, 3, ks, kst), hout = view(&o, false, 0, 3, qs, NULL);
    a.q = &hq, a.k = &hk, a.v = &hv, a.out = &hout;
    ASSERT_OK(khub_binding_call(ref, &a));
    char what[96];
    snprintf(what, sizeof what, "attention q [%lld, %d, %d] over %lld strided K/V rows",
             (long long)n_q, NH, HD, (long long)n_kv);
    compare(what, got, o.h, nq, 1e-6);
    free(got);
    freebuf(&q), freebuf(&k), freebuf(&v), freebuf(&o);
}

TEST_IMPL(gpu_flash_attention_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "flash-attn2");
    uint32_t flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_STRIDED_KV;
    khub_binding *cu = op(rt, KHUB_OP_ATTENTION, true, "kernels-community/flash-attn2", flags, HD);
    khub_binding *ref = op(rt, KHUB_OP_ATTENTION, false, "khub/ref-cpu", flags, HD);
    attn_case(cu, ref, 37, 37); /* prefill */
    attn_case(cu, ref, 1, 300); /* a decode step */
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(gpu_rms_norm_vs_ref_cpu) \
    X(gpu_silu_and_mul_vs_ref_cpu) \
    X(gpu_flash_attention_vs_ref_cpu)
TEST_MAIN(TEST_LIST)
