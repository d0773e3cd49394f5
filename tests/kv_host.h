/*
 * kv_host.h: the fake host the ref-cpu tests share (test_ref_ops.c,
 * test_kv_strategies.c, test_kv_offload.c): ref-cpu.so opened with dlopen
 * on a host table whose allocator counts live blocks (ASSERT_NO_LEAKS) and
 * can fail the N-th allocation, and whose fail() keeps the last message
 * (ASSERT_FAILS checks status and message); tensors and cache helpers.
 * Header-only, one test program each.
 */
#ifndef KHUB_TESTS_KV_HOST_H
#define KHUB_TESTS_KV_HOST_H

#include <dlfcn.h>
#include <stdarg.h>

#include <khub/khub.h>
#include <khub/khub_plugin.h>

#include "../plugins/include/khub_plugin_util.h"
#include "runner.h"

/* ------------------------------------------------------------------------ */
/* The fake host                                                            */
/* ------------------------------------------------------------------------ */

static char g_err[1024];
static int g_live;        /* blocks allocated and not freed */
static int g_fail_allocs; /* when > 0, the g_fail_allocs-th alloc from now fails */
static int g_live_base;   /* g_live after setup (the plugin state) */

#define ASSERT_NO_LEAKS() ASSERT_EQ(g_live, g_live_base)

static inline void th_log(void *ctx, khub_log_level lv, const char *fmt, ...)
{
    (void)ctx, (void)lv, (void)fmt;
}

static inline khub_status th_fail(void *ctx, khub_status st, const char *fmt, ...)
{
    (void)ctx;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return st;
}

static inline void *th_alloc(void *ctx, size_t n)
{
    (void)ctx;
    if (g_fail_allocs > 0 && --g_fail_allocs == 0) return NULL;
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    if (p) g_live++;
    return p;
}

static inline void th_free(void *ctx, void *p)
{
    (void)ctx;
    if (p) g_live--;
    free(p);
}

static inline void th_parallel_for(void *ctx, int64_t n, khub_range_fn fn, void *ud)
{
    (void)ctx;
    int64_t a = n / 3, b = 2 * n / 3;
    if (a > 0) fn(ud, 0, a, 0);
    if (b > a) fn(ud, a, b, 1);
    if (n > b) fn(ud, b, n, 2);
}

static inline int th_n_threads(void *ctx) { return (void)ctx, 3; }
static inline uint32_t th_cpu(void *ctx) { return (void)ctx, 0u; }

static khub_host_api g_host = {
    KHUB_STRUCT_INIT(khub_host_api),
    .log = th_log,
    .fail = th_fail,
    .alloc = th_alloc,
    .free = th_free,
    .parallel_for = th_parallel_for,
    .n_threads = th_n_threads,
    .cpu_features = th_cpu,
};

static khub_plugin_desc g_desc;

static inline khub_plugin_init_fn load_entry(void)
{
    void *h = dlopen(KHUB_PLUGIN_DIR_BUILD "/ref-cpu.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) TEST_FAIL_("dlopen ref-cpu.so: %s", dlerror());
    khub_plugin_init_fn init = (khub_plugin_init_fn)(uintptr_t)dlsym(h, KHUB_PLUGIN_ENTRY);
    ASSERT(init != NULL);
    return init;
}

static inline void setup(void)
{
    khub_plugin_init_fn init = load_entry();
    memset(&g_desc, 0, sizeof g_desc);
    g_desc.struct_size = sizeof g_desc;
    char eb[256] = "";
    ASSERT_OK(init(&g_host, &g_desc, eb, sizeof eb));
    g_live_base = g_live;
}

static inline const khub_op_desc *op(const char *name)
{
    for (uint32_t i = 0; i < g_desc.n_ops; i++)
        if (strcmp(g_desc.ops[i].name, name) == 0) return &g_desc.ops[i];
    TEST_FAIL_("op %s not found", name);
}

/* The methods of kv_cache op name. */
static inline const khub_kv_cache_methods *kvm(const char *name) { return op(name)->methods; }

/* Asserts the status and that the message names the problem. */
#define ASSERT_FAILS(expr, st, needle) \
    do { \
        g_err[0] = '\0'; \
        ASSERT_STATUS((expr), (st)); \
        ASSERT_CONTAINS(g_err, (needle)); \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct tens {
    khub_tensor t;
    int64_t shape[4];
    int64_t strides[4];
} tens;

/* A compact (strides NULL) tensor of up to 3 dims; unused dims are 0. */
static inline khub_tensor *mk(tens *s, void *data, khub_dtype dt, int ndim, int64_t d0, int64_t d1,
                              int64_t d2)
{
    memset(s, 0, sizeof *s);
    s->shape[0] = d0, s->shape[1] = d1, s->shape[2] = d2;
    s->t = (khub_tensor){
        .data = data, .device = {KHUB_DEVICE_CPU, 0}, .ndim = ndim, .dtype = dt, .shape = s->shape};
    return &s->t;
}

static inline float *fbuf(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    ASSERT(p != NULL);
    return p;
}

static inline khub_kv_cache *cache_new(const char *name, int32_t layers, int32_t H, int32_t D,
                                       int32_t seqs, int64_t max_tokens, khub_dtype dt,
                                       const char *options)
{
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = layers,
                                .n_kv_heads = H,
                                .head_dim = D,
                                .n_seqs = seqs,
                                .max_tokens = max_tokens,
                                .dtype = dt,
                                .options = options};
    khub_kv_cache *c = NULL;
    const khub_kv_cache_methods *m = op(name)->methods;
    ASSERT_OK(m->create(g_desc.state, &cfg, &c));
    ASSERT(c != NULL);
    return c;
}

static inline khub_status put(const char *name, khub_kv_cache *c, int32_t layer, int32_t seq,
                              int64_t pos, float *k, float *v, int64_t n, int64_t H, int64_t D)
{
    tens tk, tv;
    khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                            .layer = layer,
                            .seq = seq,
                            .pos = pos,
                            .k = mk(&tk, k, KHUB_DTYPE_F32, 3, n, H, D),
                            .v = mk(&tv, v, KHUB_DTYPE_F32, 3, n, H, D)};
    g_err[0] = '\0';
    const khub_kv_cache_methods *m = op(name)->methods;
    return m->write(g_desc.state, c, &w);
}

static inline float view_at(const khub_tensor *t, int64_t i, int64_t h, int64_t d)
{
    int64_t off = i * t->strides[0] + h * t->strides[1] + d * t->strides[2];
    const void *base = khub_pu_base(t);
    if (t->dtype.bits == 32) return ((const float *)base)[off];
    return khub_pu_f16_to_f32(((const uint16_t *)base)[off]);
}

#endif /* KHUB_TESTS_KV_HOST_H */
