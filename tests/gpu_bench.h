/*
 * gpu_bench.h: the bench the CUDA op tests (test_gpu_ops, test_gpu_linear;
 * CTest label gpu) share: loading a built kernel's CUDA variant from
 * $KHUB_GPU_KERNELS with its PTX as verified artifacts, host buffers with
 * their device copies, tensor views over them, op selection, and the NMSE
 * comparison with khub/ref-cpu. On the fake driver (tests/fake_cuda) no
 * kernel runs: compare() then says that it compared nothing.
 * test_gemv_cuda (no label: fake driver only) uses its sha256_file.
 */
#ifndef KHUB_TESTS_GPU_BENCH_H
#define KHUB_TESTS_GPU_BENCH_H

#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda.h"
#include "cuda_variant.h"
#include "plugin_artifacts.h"
#include "runtime_impl.h"
#include "runner.h"

/* ======================================================================== */
/* The bench: host buffers, their device copies, the comparison             */
/* ======================================================================== */

static bool fake_driver; /* the stand-in driver: kernels do not run */

static inline khub_runtime *bench_runtime(void)
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
static inline uint64_t rng_next(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* Element i of a row of f32 (elem 4) or f16 (elem 2) values. */
static inline float load_elem(const uint8_t *row, size_t elem, int64_t i)
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

static inline float rnd(void)
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

static inline buf mkbuf(size_t n, bool fill)
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
static inline void upload(const buf *b)
{
    khub__plugin_msg_clear();
    if (khub__cuda_host_memcpy_htod(NULL, b->d, b->h, b->n * sizeof(float), NULL) != KHUB_STATUS_OK)
        TEST_FAIL_("upload: %s", khub__plugin_msg());
}

/* The device copy back into out[n] (after the stream drained). */
static inline void download(const buf *b, float *out)
{
    khub__plugin_msg_clear();
    if (khub__cuda_host_stream_sync(NULL, NULL) != KHUB_STATUS_OK ||
        khub__cuda_host_memcpy_dtoh(NULL, out, b->d, b->n * sizeof(float), NULL) !=
            KHUB_STATUS_OK ||
        khub__cuda_host_stream_sync(NULL, NULL) != KHUB_STATUS_OK)
        TEST_FAIL_("download: %s", khub__plugin_msg());
}

static inline void freebuf(buf *b)
{
    khub__cuda_host_mem_free(NULL, b->d);
    free(b->h);
}

/* A tensor over a buffer, from element `off`, with row strides (NULL =
 * compact). shape and strides are borrowed. */
static inline khub_tensor view(const buf *b, bool device, size_t off, int nd, int64_t *shape,
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

static inline khub_binding *op_dt(khub_runtime *rt, uint32_t kind, bool cuda, const char *plugin,
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

static inline khub_binding *op(khub_runtime *rt, uint32_t kind, bool cuda, const char *plugin,
                               uint32_t flags, int32_t head_dim)
{
    return op_dt(rt, kind, cuda, plugin, KHUB_DTYPE_ID_F32, flags, head_dim);
}

static inline double nmse_of(const float *got, const float *want, size_t n)
{
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        err += d * d;
        ref += (double)want[i] * want[i];
    }
    return ref > 0 ? err / ref : err;
}

/* KHUB_GPU_OUTPUTS=DIR: each device output is kept in DIR, one file per
 * comparison named after it, or, when that file is there already (written
 * by a run with KHUB_CUDA_JIT=0: the build-time PTX), compared with it
 * under the same tolerance. tools/gpu-check.sh step 6 checks the kernels
 * compiled at load against the build-time ones so (the inputs are the same
 * in both runs: the generator starts from one seed in each case's child). */
static inline void against_earlier_run(const char *what, const float *got, size_t n, double tol)
{
    const char *dir = getenv("KHUB_GPU_OUTPUTS");
    if (!dir || !dir[0]) return;
    char path[1200], name[160];
    size_t k = 0;
    for (const char *c = what; *c && k + 1 < sizeof name; c++)
        name[k++] = isalnum((unsigned char)*c) ? *c : '_';
    name[k] = '\0';
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        f = fopen(path, "wb");
        ASSERT(f && fwrite(got, sizeof(float), n, f) == n);
        fclose(f);
        return;
    }
    float *was = malloc(n * sizeof(float));
    ASSERT(was);
    size_t r = fread(was, sizeof(float), n, f);
    fclose(f);
    if (r != n) TEST_FAIL_("%s: %s holds %zu values, this run has %zu", what, path, r, n);
    double e = nmse_of(got, was, n);
    free(was);
    printf("  %s: against the earlier run (%s): NMSE %.3g (tolerance %.0e)\n", what, dir, e, tol);
    if (!(e <= tol)) TEST_FAIL_("%s: NMSE %.3g against the earlier run, above %.0e", what, e, tol);
}

/* NMSE of got against want over n values, printed; fails above tol; and
 * against an earlier run's output (above). On the fake driver it compares
 * nothing and says so. */
static inline void compare(const char *what, const float *got, const float *want, size_t n,
                           double tol)
{
    if (fake_driver) {
        printf("  %s: fake driver, nothing compared\n", what);
        return;
    }
    double nmse = nmse_of(got, want, n);
    printf("  %s: NMSE %.3g (tolerance %.0e)\n", what, nmse, tol);
    if (!(nmse <= tol)) TEST_FAIL_("%s: NMSE %.3g above %.0e", what, nmse, tol);
    against_earlier_run(what, got, n, tol);
}

#endif /* KHUB_TESTS_GPU_BENCH_H */
