/*
 * test_gpu_ops.c (CTest label gpu): each in-tree CUDA op against
 * khub/ref-cpu on the tensors the executor hands it (issue 19 item 5):
 * rms_norm with the fused residual on rows that start past the start of
 * their buffer, silu_and_mul, flash attention over strided K/V views (the
 * cache's rows are wider than n_kv_heads x head_dim) for prefill and for a
 * decode step, rotary (NEOX and interleaved, two bases, Llama 3.1 scaling,
 * a partial rotary_dim), the linear layers (f32/f16 weights, Q8_0, Q4_0,
 * Q4_1, Q4_K, Q6_K blocks, with a bias) for a decode row and a prefill of
 * 17 rows, and the device KV cache (append, then views read back) against
 * the reference static cache. SmolLM2-135M's shapes: hidden 576, ffn 1536,
 * 9 query and 3 KV heads of 64.
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
#include <unistd.h>

#include "cuda.h"
#include "khub/khub_model.h"
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
static uint64_t rng_next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* Element i of a row of f32 (elem 4) or f16 (elem 2) values. */
static float load_elem(const uint8_t *row, size_t elem, int64_t i)
{
    if (elem == 4) {
        float f;
        memcpy(&f, row + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, row + 2 * i, 2);
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0 && m == 0) {
        x = sign;
    } else if (e == 0) { /* subnormal: renormalise */
        e = 113;
        while (!(m & 0x400)) m <<= 1, e--;
        x = sign | (e << 23) | ((m & 0x3ff) << 13);
    } else {
        x = sign | ((e == 31 ? 255 : e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

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

/* The host copy (h) to the device again, after the test changed it. */
static void upload(const buf *b)
{
    khub__plugin_msg_clear();
    if (khub__cuda_host_memcpy_htod(NULL, b->d, b->h, b->n * sizeof(float), NULL) != KHUB_STATUS_OK)
        TEST_FAIL_("upload: %s", khub__plugin_msg());
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

static khub_binding *op_dt(khub_runtime *rt, uint32_t kind, bool cuda, const char *plugin,
                           int dtype_id, uint32_t flags, int32_t head_dim)
{
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = kind,
                       .device_type = cuda ? KHUB_DEVICE_CUDA : KHUB_DEVICE_CPU,
                       .dtype_id = dtype_id,
                       .flags = flags,
                       .head_dim = head_dim,
                       .plugin_id = plugin};
    khub_binding *b = NULL;
    if (khub_registry_select(rt, &q, &b) != KHUB_STATUS_OK)
        TEST_FAIL_("%s: %s", plugin, khub_runtime_errmsg(rt));
    return b;
}

static khub_binding *op(khub_runtime *rt, uint32_t kind, bool cuda, const char *plugin,
                        uint32_t flags, int32_t head_dim)
{
    return op_dt(rt, kind, cuda, plugin, KHUB_DTYPE_ID_F32, flags, head_dim);
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

/* ======================================================================== */
/* Rotary, linear layers and the KV cache                                   */
/* ======================================================================== */

/* Rotary in place on x [n, NH, HD] at positions 7, 7 + 13, ... (a device
 * int32 array for the CUDA op, the same host array for ref-cpu). */
static void rope_case(khub_binding *cu, khub_binding *ref, int64_t n, uint32_t style,
                      uint32_t scaling, float theta, int32_t rotary_dim)
{
    size_t nx = (size_t)n * NH * HD;
    buf x = mkbuf(nx, true), pos = mkbuf((size_t)n, false);
    int32_t *p = (int32_t *)pos.h;
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(7 + 13 * i);
    upload(&pos);
    float *got = malloc(nx * sizeof(float));
    ASSERT(got);
    int64_t sh[3] = {n, NH, HD};
    khub_tensor dx = view(&x, true, 0, 3, sh, NULL);
    khub_rotary_args a = {KHUB_STRUCT_INIT(khub_rotary_args),
                          .x = &dx,
                          .positions = (const int32_t *)(uintptr_t)pos.d,
                          .style = style,
                          .scaling = scaling,
                          .theta = theta,
                          .factor = 8.0f,
                          .low_freq_factor = 1.0f,
                          .high_freq_factor = 4.0f,
                          .original_max_pos = 8192,
                          .rotary_dim = rotary_dim};
    ASSERT_OK(khub_binding_call(cu, &a));
    download(&x, got);
    khub_tensor hx = view(&x, false, 0, 3, sh, NULL);
    a.x = &hx, a.positions = p;
    ASSERT_OK(khub_binding_call(ref, &a));
    char what[128];
    snprintf(what, sizeof what, "rotary %s%s theta %g rotary_dim %d [%lld, %d, %d]",
             style == KHUB_ROPE_NEOX ? "neox" : "interleaved",
             scaling == KHUB_ROPE_SCALING_LLAMA3 ? " llama3" : "", theta, rotary_dim, (long long)n,
             NH, HD);
    compare(what, got, x.h, nx, 1e-12);
    free(got);
    freebuf(&x), freebuf(&pos);
}

TEST_IMPL(gpu_rotary_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "rotary");
    khub_binding *cu = op(rt, KHUB_OP_ROTARY, true, "kernels-community/rotary", 0, 0);
    khub_binding *ref = op(rt, KHUB_OP_ROTARY, false, "khub/ref-cpu", 0, 0);
    /* the kernel specialised for 32 pairs, both pair layouts, two bases (a
     * model with a base per layer passes each), a decode row and a prefill */
    rope_case(cu, ref, 1, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_NONE, 10000.0f, 0);
    rope_case(cu, ref, 37, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_NONE, 1e6f, 0);
    rope_case(cu, ref, 37, KHUB_ROPE_INTERLEAVED, KHUB_ROPE_SCALING_NONE, 10000.0f, 0);
    rope_case(cu, ref, 17, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_LLAMA3, 500000.0f, 0);
    /* a partial rotary_dim: the generic kernel (16 pairs) */
    rope_case(cu, ref, 17, KHUB_ROPE_NEOX, KHUB_ROPE_SCALING_NONE, 10000.0f, 32);
    khub_runtime_free(rt);
}

/* A weight [out, in] of dtype dt as bytes: f32 U(-1, 1); f16 of the same;
 * block formats random codes with every f16 scale (and min) set to a small
 * value, so each block decodes to numbers of order 1. */
static buf weight_buf(khub_dtype dt, int64_t out, int64_t in, size_t *row_bytes)
{
    int id = khub_dtype_id_of(dt);
    size_t rb = id == KHUB_DTYPE_ID_F32   ? (size_t)in * 4
                : id == KHUB_DTYPE_ID_F16 ? (size_t)in * 2
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
    } else if (id != KHUB_DTYPE_ID_F32) {
        for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)rng_next();
        int64_t bb = khub_qformat_block_bytes(dt.bits);
        /* offsets of the f16 scale fields in a block */
        int offs[2] = {0, -1};
        if (dt.bits == KHUB_QFORMAT_Q4_1 || dt.bits == KHUB_QFORMAT_Q4_K) offs[1] = 2;
        if (dt.bits == KHUB_QFORMAT_Q6_K) offs[0] = 208;
        for (size_t blk = 0; blk < bytes / (size_t)bb; blk++)
            for (int f = 0; f < 2; f++) {
                if (offs[f] < 0) continue;
                uint16_t h = (uint16_t)(0x2000 + (rng_next() % 0x0800)); /* ~0.008 .. 0.03 */
                memcpy(b + blk * (size_t)bb + (size_t)offs[f], &h, 2);
            }
    }
    upload(&w);
    *row_bytes = rb;
    return w;
}

/* y = x W^T + bias for n rows, the CUDA op against ref-cpu. */
static void linear_case(khub_binding *cu, khub_binding *ref, khub_dtype dt, const char *name,
                        int64_t n, int64_t in, int64_t out)
{
    size_t rb = 0;
    buf x = mkbuf((size_t)(n * in), true), bias = mkbuf((size_t)out, true),
        y = mkbuf((size_t)(n * out), false), w = weight_buf(dt, out, in, &rb);
    float *got = malloc((size_t)(n * out) * sizeof(float));
    ASSERT(got);
    int64_t xs[2] = {n, in}, ws[2] = {out, in}, ys[2] = {n, out}, bs[1] = {out};
    khub_tensor dx = view(&x, true, 0, 2, xs, NULL), dw = view(&w, true, 0, 2, ws, NULL),
                db = view(&bias, true, 0, 1, bs, NULL), dy = view(&y, true, 0, 2, ys, NULL);
    dw.dtype = dt;
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), .x = &dx, .weight = &dw, .bias = &db,
                          .y = &dy};
    ASSERT_OK(khub_binding_call(cu, &a));
    download(&y, got);
    khub_tensor hx = view(&x, false, 0, 2, xs, NULL), hw = view(&w, false, 0, 2, ws, NULL),
                hb = view(&bias, false, 0, 1, bs, NULL), hy = view(&y, false, 0, 2, ys, NULL);
    hw.dtype = dt;
    a.x = &hx, a.weight = &hw, a.bias = &hb, a.y = &hy;
    ASSERT_OK(khub_binding_call(ref, &a));
    char what[128];
    snprintf(what, sizeof what, "%s x [%lld, %lld] W [%lld, %lld] %s + bias", name, (long long)n,
             (long long)in, (long long)out, (long long)in,
             khub_dtype_id_of(dt) == KHUB_DTYPE_ID_F32   ? "f32"
             : khub_dtype_id_of(dt) == KHUB_DTYPE_ID_F16 ? "f16"
                                                         : "block-quantized");
    compare(what, got, y.h, (size_t)(n * out), 1e-10);
    free(got);
    freebuf(&x), freebuf(&bias), freebuf(&y), freebuf(&w);
}

TEST_IMPL(gpu_linear_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "gemv");
    khub_dtype dts[2] = {KHUB_DTYPE_F32, KHUB_DTYPE_F16};
    for (int d = 0; d < 2; d++) {
        int id = khub_dtype_id_of(dts[d]);
        khub_binding *cu =
            op_dt(rt, KHUB_OP_LINEAR, true, "kernels-community/gemv", id, KHUB_CAP_BIAS, 0);
        khub_binding *ref = op_dt(rt, KHUB_OP_LINEAR, false, "khub/ref-cpu", id, KHUB_CAP_BIAS, 0);
        linear_case(cu, ref, dts[d], "linear", 1, HID, FFN);  /* decode: gate/up */
        linear_case(cu, ref, dts[d], "linear", 17, FFN, HID); /* prefill: down */
        linear_case(cu, ref, dts[d], "linear", 3, 100, 7);    /* a row not in whole chunks */
    }
    khub_runtime_free(rt);
}

TEST_IMPL(gpu_qlinear_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "gemv");
    static const struct {
        khub_qformat f;
        const char *name;
    } fmts[] = {{KHUB_QFORMAT_Q8_0, "qlinear Q8_0"},
                {KHUB_QFORMAT_Q4_0, "qlinear Q4_0"},
                {KHUB_QFORMAT_Q4_1, "qlinear Q4_1"},
                {KHUB_QFORMAT_Q4_K, "qlinear Q4_K"},
                {KHUB_QFORMAT_Q6_K, "qlinear Q6_K"}};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        int id = KHUB_DTYPE_ID_QBASE + (int)fmts[i].f;
        khub_binding *cu =
            op_dt(rt, KHUB_OP_QLINEAR, true, "kernels-community/gemv", id, KHUB_CAP_BIAS, 0);
        khub_binding *ref = op_dt(rt, KHUB_OP_QLINEAR, false, "khub/ref-cpu", id, KHUB_CAP_BIAS, 0);
        /* in = 1536 is whole blocks of 32 and of 256 (the K formats) */
        linear_case(cu, ref, KHUB_DTYPE_Q(fmts[i].f), fmts[i].name, 1, FFN, HID);
        linear_case(cu, ref, KHUB_DTYPE_Q(fmts[i].f), fmts[i].name, 17, FFN, HID);
    }
    khub_runtime_free(rt);
}

/* Both caches get the same writes (a prefill of 37 tokens, then one decode
 * token, in layer 1 of sequence 1); the CUDA cache's views are read back
 * row by row through their strides and compared with the reference's. */
static void kv_case(khub_binding *cu, khub_binding *ref, khub_dtype dt)
{
    enum { LAYERS = 2, SEQS = 2, CAP = 64, N0 = 37, ROWF = NKV * HD };
    void *cs = NULL, *rs = NULL;
    const khub_kv_cache_methods *cm = khub_binding_methods(cu, &cs);
    const khub_kv_cache_methods *rm = khub_binding_methods(ref, &rs);
    ASSERT(cm && rm);
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = LAYERS,
                                .n_kv_heads = NKV,
                                .head_dim = HD,
                                .n_seqs = SEQS,
                                .max_tokens = CAP,
                                .dtype = dt};
    khub_kv_cache *cc = NULL, *rc = NULL;
    khub__plugin_msg_clear();
    if (cm->create(cs, &cfg, &cc) != KHUB_STATUS_OK)
        TEST_FAIL_("CUDA cache create: %s", khub__plugin_msg());
    ASSERT_OK(rm->create(rs, &cfg, &rc));
    int64_t written = 0;
    for (int step = 0; step < 2; step++) {
        int64_t n = step ? 1 : N0;
        buf k = mkbuf((size_t)(n * ROWF), true), v = mkbuf((size_t)(n * ROWF), true);
        int64_t sh[3] = {n, NKV, HD};
        khub_tensor dk = view(&k, true, 0, 3, sh, NULL), dv = view(&v, true, 0, 3, sh, NULL);
        khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                                .layer = 1,
                                .seq = 1,
                                .pos = written,
                                .k = &dk,
                                .v = &dv};
        khub__plugin_msg_clear();
        if (cm->write(cs, cc, &w) != KHUB_STATUS_OK)
            TEST_FAIL_("CUDA cache write: %s", khub__plugin_msg());
        khub_tensor hk = view(&k, false, 0, 3, sh, NULL), hv = view(&v, false, 0, 3, sh, NULL);
        w.k = &hk, w.v = &hv;
        ASSERT_OK(rm->write(rs, rc, &w));
        written += n;
        khub__cuda_host_stream_sync(NULL, NULL);
        freebuf(&k), freebuf(&v);
    }
    int64_t n = written, shape[4][3], strides[4][3];
    khub_tensor t[4]; /* CUDA k, v; reference k, v */
    for (int i = 0; i < 4; i++) t[i] = (khub_tensor){.shape = shape[i], .strides = strides[i]};
    khub__plugin_msg_clear();
    if (cm->view(cs, cc, 1, 1, n, &t[0], &t[1]) != KHUB_STATUS_OK)
        TEST_FAIL_("CUDA cache view: %s", khub__plugin_msg());
    ASSERT_OK(rm->view(rs, rc, 1, 1, n, &t[2], &t[3]));
    ASSERT_EQ(t[0].device.device_type, KHUB_DEVICE_CUDA);
    ASSERT_EQ(t[0].dtype.bits, t[2].dtype.bits);
    ASSERT_EQ(strides[0][2], 1);
    ASSERT_EQ(strides[2][2], 1);
    size_t elem = t[0].dtype.bits / 8;
    for (int which = 0; which < 2; which++) {
        const khub_tensor *c = &t[which], *r = &t[2 + which];
        float *got = calloc((size_t)(n * ROWF), sizeof(float)),
              *want = calloc((size_t)(n * ROWF), sizeof(float));
        uint8_t *row = malloc((size_t)HD * elem);
        ASSERT(got && want && row);
        for (int64_t p = 0; p < n; p++)
            for (int64_t h = 0; h < NKV; h++) {
                uint64_t src = (uint64_t)(uintptr_t)c->data + c->byte_offset +
                               (uint64_t)(p * c->strides[0] + h * c->strides[1]) * elem;
                khub__plugin_msg_clear();
                if (khub__cuda_host_memcpy_dtoh(NULL, row, src, (size_t)HD * elem, NULL) !=
                        KHUB_STATUS_OK ||
                    khub__cuda_host_stream_sync(NULL, NULL) != KHUB_STATUS_OK)
                    TEST_FAIL_("reading the view: %s", khub__plugin_msg());
                const uint8_t *hr = (const uint8_t *)r->data + r->byte_offset +
                                    (size_t)(p * r->strides[0] + h * r->strides[1]) * elem;
                for (int64_t d = 0; d < HD; d++) {
                    got[(p * NKV + h) * HD + d] = load_elem(row, elem, d);
                    want[(p * NKV + h) * HD + d] = load_elem(hr, elem, d);
                }
            }
        char what[96];
        snprintf(what, sizeof what, "kv cache %s %s view of %lld positions",
                 dt.bits == 16 ? "f16" : "f32", which ? "V" : "K", (long long)n);
        compare(what, got, want, (size_t)(n * ROWF), 0.0);
        free(got), free(want), free(row);
    }
    cm->destroy(cs, cc);
    rm->destroy(rs, rc);
}

TEST_IMPL(gpu_kv_cache_vs_ref_cpu)
{
    khub_runtime *rt = bench_runtime();
    load_cuda_variant(rt, "kv-cache-cuda");
    uint32_t flags = KHUB_CAP_STRIDED_KV;
    khub_binding *cu = op(rt, KHUB_OP_KV_CACHE, true, "kernels-community/kv-cache-cuda", flags, 0);
    khub_binding *ref = op(rt, KHUB_OP_KV_CACHE, false, "khub/ref-cpu", flags, 0);
    kv_case(cu, ref, KHUB_DTYPE_F32);
    khub_binding *cu16 = op_dt(rt, KHUB_OP_KV_CACHE, true, "kernels-community/kv-cache-cuda",
                               KHUB_DTYPE_ID_F16, flags | KHUB_CAP_KV_F16, 0);
    khub_binding *ref16 = op_dt(rt, KHUB_OP_KV_CACHE, false, "khub/ref-cpu", KHUB_DTYPE_ID_F16,
                                flags | KHUB_CAP_KV_F16, 0);
    kv_case(cu16, ref16, KHUB_DTYPE_F16);
    khub_runtime_free(rt);
}

/* ======================================================================== */
/* SmolLM2 on the device                                                    */
/* ======================================================================== */

/* Greedy text of SmolLM2-135M Q4_1 for a prompt, loaded for device. */
static char *smollm2_text(khub_runtime *rt, const char *gguf, khub_device device)
{
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts), .device = device, .max_context = 256};
    khub_model *m = NULL;
    if (khub_model_load(rt, gguf, &o, &m) != KHUB_STATUS_OK)
        TEST_FAIL_("loading %s: %s", gguf, khub_runtime_errmsg(rt));
    if (device.device_type == KHUB_DEVICE_CUDA)
        printf("%s", strstr(khub_model_explain(m), "placement:"));
    const char *prompts[] = {"The capital of France is"};
    khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 16};
    khub_generate_result res = {KHUB_APP_INIT(khub_generate_result)};
    if (khub_model_generate(m, prompts, 1, &go, &res) != KHUB_STATUS_OK)
        TEST_FAIL_("generating: %s", khub_runtime_errmsg(rt));
    char *text = strdup(res.text);
    khub_generate_results_free(m, &res, 1);
    khub_model_free(m);
    return text;
}

/* Every in-tree CUDA kernel loaded, SmolLM2 placed on the device with every
 * role there, and its greedy tokens against the CPU's. On the fake driver
 * the pass runs (launches, copies) but computes nothing: not compared. */
TEST_IMPL(gpu_smollm2_device_matches_cpu)
{
    const char *dir = getenv("KHUB_MODEL_DIR");
    char gguf[1024];
    snprintf(gguf, sizeof gguf, "%s%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : getenv("HOME"),
             dir ? "" : "/.cache/khub/models");
    if (access(gguf, R_OK) != 0) TEST_SKIP("%s absent (tools/fetch-model.sh)", gguf);
    khub_runtime *rt = bench_runtime();
    static const char *const kernels[] = {"rmsnorm", "activation", "flash-attn2",
                                          "rotary",  "gemv",       "kv-cache-cuda"};
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        load_cuda_variant(rt, kernels[i]);
    char *cpu = smollm2_text(rt, gguf, (khub_device){KHUB_DEVICE_CPU, 0});
    char *dev = smollm2_text(rt, gguf, (khub_device){KHUB_DEVICE_CUDA, 0});
    printf("  cpu:  %s\n  cuda: %s\n", cpu, dev);
    if (fake_driver)
        printf("  SmolLM2 greedy tokens: fake driver, nothing compared\n");
    else if (strcmp(cpu, dev) != 0)
        TEST_FAIL_("SmolLM2's greedy text on the device differs from the CPU's");
    free(cpu), free(dev);
    khub_runtime_free(rt);
}

#define TEST_LIST(X) \
    X(gpu_rms_norm_vs_ref_cpu) \
    X(gpu_silu_and_mul_vs_ref_cpu) \
    X(gpu_flash_attention_vs_ref_cpu) \
    X(gpu_rotary_vs_ref_cpu) \
    X(gpu_linear_vs_ref_cpu) \
    X(gpu_qlinear_vs_ref_cpu) \
    X(gpu_kv_cache_vs_ref_cpu) \
    X(gpu_smollm2_device_matches_cpu)
TEST_MAIN(TEST_LIST)
