/*
 * rotary_cuda.c: host glue of kernels-community/rotary for CUDA.
 *
 * Loads the best PTX artifact for a device (the highest sm at or below
 * its compute capability) on the first call there, under a lock (ops may
 * be called from several threads), and launches one block per (token,
 * head). Modules, kernels and specialisations are kept per device (x's
 * device id picks it): a CUfunction launches only on its module's device.
 * Every pointer of the call is device memory: x and also `positions`, an
 * int32 array on the device (a CUDA op never reads host memory; the
 * executor keeps the step's positions on the device). Without a CUDA
 * driver the plugin initialises and scores 0.
 *
 * Specialisation (rotary.cu), at build time: a rotary_dim of 64, 128 or
 * 256 launches the kernel built for that pair count; any other even
 * rotary_dim the generic one. At load, when the host can compile (ABI 1.5
 * host->cuda_module_compile, docs/gpu.md): the first call with a shape set
 * (pairs, head_dim, pair layout, scaling rule) has rotary.cu, shipped in
 * the variant, compiled with them as -D constants (once per process; the
 * host's disk cache keeps it across processes) and launches that kernel.
 * When that compile fails (no NVRTC, turned off with KHUB_CUDA_JIT=0) the
 * build-time kernels run, as before. A GPU newer than every listed
 * capability gets the generic module compiled for its own architecture,
 * else the newest PTX (the driver compiles it forward).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <khub/helpers/khub_cuda_glue.h>
#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75}; /* kernel.json's capabilities, highest first */

enum { F_GENERIC, F_HALF32, F_HALF64, F_HALF128, F_COUNT };
static const char *const fn_names[F_COUNT] = {"khub_rope_f32", "khub_rope_f32_half32",
                                              "khub_rope_f32_half64", "khub_rope_f32_half128"};

/* A kernel compiled at load for one shape set; fn NULL when that failed
 * (then the build-time kernels run for it, without asking again). */
typedef struct rope_spec {
    int32_t device, half, head_dim;
    uint32_t style, scaling;
    void *fn; /* CUfunction */
} rope_spec;

#define MAX_SPECS 16 /* over every device */

typedef struct rope_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded[KHUB_CG_MAX_DEVICES];
    void *fn[KHUB_CG_MAX_DEVICES][F_COUNT]; /* CUfunction per device */
    rope_spec spec[MAX_SPECS];
    int n_spec;
} rope_state;

static rope_state g_state = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* rotary.cu's rope_params, field for field. */
typedef struct rope_params {
    double theta, factor, low_freq_factor, high_freq_factor, original_max_pos;
    int32_t scaling, style, n_heads, head_dim, half;
} rope_params;

static int32_t score(void *sp)
{
    const khub_host_api *host = ((rope_state *)sp)->host;
    int n = 0;
    return host->cuda_device_count(host->host_ctx, &n) == KHUB_STATUS_OK && n > 0 ? 1 : 0;
}

static int can_compile(const khub_host_api *host)
{
    return KHUB_HAS_FIELD(host, khub_host_api, cuda_module_compile) &&
           host->cuda_module_compile != NULL;
}

static khub_status functions_of(rope_state *s, int dev, khub_cuda_module *mod)
{
    const khub_host_api *host = s->host;
    khub_status st = KHUB_STATUS_OK;
    for (int f = 0; f < F_COUNT && st == KHUB_STATUS_OK; f++)
        st = host->cuda_module_function(host->host_ctx, mod, fn_names[f], &s->fn[dev][f]);
    s->loaded[dev] = st == KHUB_STATUS_OK;
    return st;
}

static khub_status load_locked(rope_state *s, int dev)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    KHUB_CG_TRY(host->cuda_device_cc(host->host_ctx, dev, &cc));
    if (cc > ccs[0] && can_compile(host)) { /* newer than the build: its own code */
        khub_cuda_module *mod = NULL;
        if (host->cuda_module_compile(host->host_ctx, dev, "rotary.cu", NULL, 0, &mod) ==
            KHUB_STATUS_OK)
            return functions_of(s, dev, mod);
        host->log(host->host_ctx, KHUB_LOG_INFO, "rotary: sm_%d: using the PTX for sm_%d", cc,
                  ccs[0]);
    }
    khub_cuda_module *mod = NULL;
    KHUB_CG_TRY(
        khub_cg_load_ptx(host, dev, cc, "rotary", ccs, sizeof ccs / sizeof ccs[0], "rotary", &mod));
    return functions_of(s, dev, mod);
}

static khub_status load(rope_state *s, int dev)
{
    pthread_mutex_lock(&s->lock);
    khub_status st = s->loaded[dev] ? KHUB_STATUS_OK : load_locked(s, dev);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The kernel compiled for this shape set, compiling it on the first call
 * that has it; NULL: run the build-time kernels. */
static void *specialised(rope_state *s, int dev, int32_t half, int32_t hd, uint32_t style,
                         uint32_t scaling)
{
    const khub_host_api *host = s->host;
    if (half > 1024 || !can_compile(host)) return NULL;
    pthread_mutex_lock(&s->lock);
    void *fn = NULL;
    int i = 0;
    while (i < s->n_spec &&
           !(s->spec[i].device == dev && s->spec[i].half == half && s->spec[i].head_dim == hd &&
             s->spec[i].style == style && s->spec[i].scaling == scaling))
        i++;
    if (i < s->n_spec) {
        fn = s->spec[i].fn;
    } else if (s->n_spec < MAX_SPECS) {
        char d[4][48];
        snprintf(d[0], sizeof d[0], "KHUB_ROPE_HALF=%d", (int)half);
        snprintf(d[1], sizeof d[1], "KHUB_ROPE_HEAD_DIM=%d", (int)hd);
        snprintf(d[2], sizeof d[2], "KHUB_ROPE_STYLE=%u", style);
        snprintf(d[3], sizeof d[3], "KHUB_ROPE_SCALING=%u", scaling);
        const char *defs[4] = {d[0], d[1], d[2], d[3]};
        khub_cuda_module *mod = NULL;
        if (host->cuda_module_compile(host->host_ctx, dev, "rotary.cu", defs, 4, &mod) ==
                KHUB_STATUS_OK &&
            host->cuda_module_function(host->host_ctx, mod, "khub_rope_f32_spec", &fn) !=
                KHUB_STATUS_OK)
            fn = NULL;
        if (!fn)
            host->log(host->host_ctx, KHUB_LOG_INFO,
                      "rotary: %d pairs of head_dim %d: the build-time kernels run", (int)half,
                      (int)hd);
        s->spec[s->n_spec++] = (rope_spec){dev, half, hd, style, scaling, fn};
    }
    pthread_mutex_unlock(&s->lock);
    return fn;
}

static khub_status run(void *sp, const void *args)
{
    rope_state *s = sp;
    const khub_host_api *host = s->host;
    const khub_rotary_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->x || a->x->ndim != 3 || a->x->strides ||
        a->x->byte_offset || a->x->device.device_type != KHUB_DEVICE_CUDA || !a->positions)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "rotary (cuda): needs a compact CUDA tensor x [n, n_heads, head_dim] "
                          "and device positions [n]");
    int64_t n = a->x->shape[0], heads = a->x->shape[1], hd = a->x->shape[2];
    int64_t rd = a->rotary_dim ? a->rotary_dim : hd;
    if (rd <= 0 || rd > hd || rd % 2 || n <= 0 || n > 0x7fffffff || heads <= 0 || heads > 65535)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "rotary (cuda): rotary_dim %lld of head_dim %lld (even, <= head_dim), "
                          "%lld tokens, %lld heads (at most 65535)",
                          (long long)rd, (long long)hd, (long long)n, (long long)heads);
    if (a->style != KHUB_ROPE_NEOX && a->style != KHUB_ROPE_INTERLEAVED)
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "rotary (cuda): unknown style %u", a->style);
    if (a->scaling > KHUB_ROPE_SCALING_LLAMA3)
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "rotary (cuda): unknown scaling %u", a->scaling);
    int dev = 0;
    KHUB_CG_TRY(khub_cg_device(host, "rotary (cuda)", a->x->device, &dev));
    KHUB_CG_TRY(load(s, dev));
    int32_t half = (int32_t)(rd / 2);
    int f = half == 32 ? F_HALF32 : half == 64 ? F_HALF64 : half == 128 ? F_HALF128 : F_GENERIC;
    rope_params p = {a->theta,
                     a->factor,
                     a->low_freq_factor,
                     a->high_freq_factor,
                     a->original_max_pos,
                     (int32_t)a->scaling,
                     (int32_t)a->style,
                     (int32_t)heads,
                     (int32_t)hd,
                     half};
    void *x = a->x->data;
    const void *pos = a->positions;
    void *params[] = {&x, &pos, &p};
    void *fn = specialised(s, dev, half, (int32_t)hd, a->style, a->scaling);
    uint32_t threads = f == F_GENERIC ? (half < 128 ? (uint32_t)half : 128) : (uint32_t)half;
    if (fn) threads = (uint32_t)half; /* one pair per thread */
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)n, (uint32_t)heads, 1}, .block = {threads, 1, 1},
                                .stream = a->stream};
    return host->cuda_launch(host->host_ctx, fn ? fn : s->fn[dev][f], &cfg, params);
}

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
    .cc_min = 75,
    .priority = 30,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "rotary", .kind = KHUB_OP_ROTARY, .caps = &caps,
     .run = run},
};

khub_status khub_rotary_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                  size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_state.host = h;
    memset(g_state.loaded, 0, sizeof g_state.loaded);
    g_state.n_spec = 0;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/rotary",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = &g_state,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_rotary_cuda_init, "kernels-community/rotary", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_ROTARY))
