/*
 * device_fixture.h: what the host-side tests of a model placed on a CUDA
 * device share (test_placement.c, test_cuda_graphs.c, test_graphs_paged.c,
 * test_device_paged.c): the fake driver (tests/fake_cuda), dlopened by path
 * before khub opens "libcuda.so.1" so the name resolves to it, and read
 * through khub_fake_cuda_stat and its launch log; a tiny random Llama
 * written to /tmp (tiny_llama.h) with its loading for a device; and a
 * kernels-src CUDA glue loaded with stand-in PTX artifacts.
 */
#ifndef KHUB_TESTS_DEVICE_FIXTURE_H
#define KHUB_TESTS_DEVICE_FIXTURE_H

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../plugins/include/khub_plugin_util.h" /* f32 -> f16 */
#include "khub/khub_model.h"
#include "plugin_artifacts.h"
#include "plugins/tp_util.h"
#include "runtime_impl.h"
#include "tiny_llama.h"

/* ======================================================================== */
/* The fake driver                                                          */
/* ======================================================================== */

static long (*fake_stat)(const char *);

/* Loads the fake driver with KHUB_FAKE_CUDA=spec, KHUB_FAKE_CUDA_MEM=mem
 * and KHUB_FAKE_CUDA_FAIL=fail (NULL = unset). Each case is its own
 * process, so each gets a fresh driver. */
static inline void fake(const char *spec, const char *mem, const char *fail)
{
    setenv("KHUB_FAKE_CUDA", spec, 1);
    if (mem)
        setenv("KHUB_FAKE_CUDA_MEM", mem, 1);
    else
        unsetenv("KHUB_FAKE_CUDA_MEM");
    if (fail)
        setenv("KHUB_FAKE_CUDA_FAIL", fail, 1);
    else
        unsetenv("KHUB_FAKE_CUDA_FAIL");
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) TEST_FAIL_("the fake driver: %s", dlerror());
    fake_stat = (long (*)(const char *))dlsym(h, "khub_fake_cuda_stat");
    ASSERT(fake_stat != NULL);
}

static inline long stat_of(const char *what)
{
    long v = fake_stat(what);
    if (v < 0) TEST_FAIL_("the fake driver has no statistic %s", what);
    return v;
}

/* ======================================================================== */
/* A tiny model                                                             */
/* ======================================================================== */

/* The model's sizes; a test that needs others (test_graphs_paged.c: head_dim
 * 64, what kv-cache-cuda's paged attention serves) defines
 * DEVICE_FIXTURE_DIMS and the same names before including this file. */
#ifndef DEVICE_FIXTURE_DIMS
enum { HID = 64, HEADS = 4, KVH = 2, HD = 16, FFN = 128, VOCAB = 256, LAYERS = 2 };
#endif

/* Layer 0's q_proj stored as F16 (the others F32): the qkv role is then
 * bound twice, once per dtype. */
static bool f16_q0;

typedef tiny_llama_tensor tensor;

static inline tiny_llama tiny_spec(void)
{
    return (tiny_llama){.hidden = HID,
                        .ffn = FFN,
                        .layers = LAYERS,
                        .heads = HEADS,
                        .kv_heads = KVH,
                        .head_dim = HD,
                        .vocab = VOCAB,
                        .f16_q0 = f16_q0};
}

/* Elements of every tensor, in file order. */
static inline int tensors(tensor *t)
{
    tiny_llama s = tiny_spec();
    return tiny_llama_tensors(&s, t);
}

static inline const char *tiny_model(void)
{
    static char dir[128];
    snprintf(dir, sizeof dir, "/tmp/khub-placement-%d", (int)getpid());
    tiny_llama s = tiny_spec();
    tiny_llama_write(dir, &s);
    return dir;
}

static inline void tiny_rm(const char *dir) { tiny_llama_rm(dir); }

static inline size_t up256(size_t n) { return (n + 255) / 256 * 256; }

/* Device bytes of the weights of the roles test/cuda-ops serves (norms and
 * every dense projection, and the tied head as its own copy: the lm_head
 * role reads it), each rounded up to placement.c's 256-byte alignment; and
 * the same weights' bytes as copied. */
static inline void device_weights(size_t *aligned, size_t *copied)
{
    tensor t[32];
    int n = tensors(t);
    *aligned = *copied = 0;
    for (int i = 0; i < n; i++) {
        size_t b = (size_t)t[i].r * (size_t)(t[i].c ? t[i].c : 1) * 4;
        *aligned += up256(b); /* the embedding's bytes count once, as the head's */
        *copied += b;
    }
}

/* ======================================================================== */
/* Loading                                                                  */
/* ======================================================================== */

typedef struct fixture {
    khub_runtime *rt;
    khub_model *m;
    const char *dir;
} fixture;

/* A runtime with the built-in plugins (and the test plugin `cuda`, e.g.
 * "cuda_ops" or "cuda_all", unless NULL), and the tiny model loaded for
 * device; st is what the load returned. */
static inline khub_status load(fixture *f, khub_device device, const char *cuda, bool strict)
{
    memset(f, 0, sizeof *f);
    f->rt = tp_runtime(1);
    ASSERT_OK(khub_plugin_load_builtin(f->rt));
    if (cuda) tp_load(f->rt, cuda);
    f->dir = tiny_model();
    khub_model_opts o = {KHUB_APP_INIT(khub_model_opts),
                         .device = device,
                         .strict = strict,
                         .max_context = 64,
                         .max_seqs = 2,
                         .max_batch = 16};
    return khub_model_load(f->rt, f->dir, &o, &f->m);
}

static inline void unload(fixture *f)
{
    khub_model_free(f->m);
    khub_runtime_free(f->rt);
    tiny_rm(f->dir);
}

static const khub_device cuda0 = {KHUB_DEVICE_CUDA, 0};

static const char *(*launch_name)(long);

static inline void launch_log(void)
{
    void *h = dlopen(KHUB_BINARY_DIR "/fake-cuda/libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    launch_name = h ? (const char *(*)(long))dlsym(h, "khub_fake_cuda_launch_name") : NULL;
    ASSERT(launch_name != NULL);
}

/* ======================================================================== */
/* kernels-src glues with stand-in PTX                                      */
/* ======================================================================== */

static char glue_ptx[8][256]; /* the stand-ins written, removed at exit */

static inline void glue_ptx_rm(void)
{
    for (int i = 0; i < 8; i++)
        if (glue_ptx[i][0]) unlink(glue_ptx[i]);
}

/* Loads test plugin `name` (a kernels-src glue built as a test plugin,
 * tests/plugins) with n stand-in PTX files, named ptx[i] as the glue asks
 * for them, as its verified artifacts (the fake driver loads any image),
 * and returns it. The stand-ins go to /tmp (one file per name and
 * process), are read when the glue first asks, and are removed at exit. */
static inline khub_plugin *load_glue(khub_runtime *rt, const char *name, const char *const *ptx,
                                     int n)
{
    static const char text[] = ".version 7.0\n.target sm_90\n.address_size 64\n";
    char sums[8][65];
    khub__artifact_file files[8];
    ASSERT(n <= 8);
    for (int i = 0; i < n; i++) {
        char path[256];
        snprintf(path, sizeof path, "/tmp/khub-glue-%d-%s", (int)getpid(), ptx[i]);
        int k = 0;
        while (k < 8 && glue_ptx[k][0] && strcmp(glue_ptx[k], path) != 0) k++;
        ASSERT(k < 8);
        if (!glue_ptx[0][0]) atexit(glue_ptx_rm);
        snprintf(glue_ptx[k], sizeof glue_ptx[k], "%s", path);
        FILE *f = fopen(path, "wb");
        ASSERT(f);
        ASSERT_EQ(fwrite(text, 1, sizeof text, f), sizeof text); /* with its NUL */
        ASSERT_EQ(fclose(f), 0);
        ASSERT_OK(khub__sha256_file_hex(path, sums[i]));
        files[i] = (khub__artifact_file){ptx[i], glue_ptx[k], sums[i]};
    }
    const char *so = TP(name);
    khub_plugin *p = NULL;
    if (khub__plugin_load_verified(rt, so, TP_SHA(so), files, (size_t)n, &p) != KHUB_STATUS_OK)
        TEST_FAIL_("loading %s: %s", name, khub_runtime_errmsg(rt));
    return p;
}

/* kernels-src/kv-cache-cuda's glue: its caches, append and paged attention. */
static inline khub_plugin *load_kv_cache_cuda(khub_runtime *rt)
{
    static const char *const ptx[] = {"kv_append.sm_90.ptx", "paged_attn.sm_90.ptx"};
    return load_glue(rt, "ksrc_kv_cache_cuda", ptx, 2);
}

/* Loads a one-kernel PTX module through plugin host table h and launches
 * its nop on stream (NULL = legacy); *fn is the function. */
static inline khub_status nop_launch(const khub_host_api *h, void *stream, void **fn)
{
    static const char ptx[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                              ".visible .entry nop()\n{\n  ret;\n}\n";
    khub_cuda_module *m = NULL;
    khub_status st = h->cuda_module_load(h->host_ctx, 0, ptx, sizeof ptx, &m);
    if (st == KHUB_STATUS_OK) st = h->cuda_module_function(h->host_ctx, m, "nop", fn);
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .grid = {1, 1, 1},
                                .block = {32, 1, 1}, .stream = stream};
    if (st == KHUB_STATUS_OK) st = h->cuda_launch(h->host_ctx, *fn, &cfg, NULL);
    return st;
}

#endif /* KHUB_TESTS_DEVICE_FIXTURE_H */
