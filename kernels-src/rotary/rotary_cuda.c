/*
 * rotary_cuda.c: host glue of kernels-community/rotary for CUDA.
 *
 * Loads the best PTX artifact for the device (the highest sm at or below
 * its compute capability) on the first call, under a lock (ops may be
 * called from several threads), and launches one block per (token, head).
 * Every pointer of the call is device memory: x and also `positions`, an
 * int32 array on the device (a CUDA op never reads host memory; the
 * executor keeps the step's positions on the device). Without a CUDA
 * driver the plugin initialises and scores 0.
 *
 * Specialisation (rotary.cu): a rotary_dim of 64, 128 or 256 launches the
 * kernel built for that pair count; any other even rotary_dim the generic
 * one.
 */
#include <pthread.h>
#include <stdio.h>

#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75}; /* kernel.json's capabilities, highest first */

enum { F_GENERIC, F_HALF32, F_HALF64, F_HALF128, F_COUNT };
static const char *const fn_names[F_COUNT] = {"khub_rope_f32", "khub_rope_f32_half32",
                                              "khub_rope_f32_half64", "khub_rope_f32_half128"};

typedef struct rope_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded;
    void *fn[F_COUNT]; /* CUfunction */
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

static khub_status load_locked(rope_state *s)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    khub_status st = host->cuda_device_cc(host->host_ctx, 0, &cc);
    if (st != KHUB_STATUS_OK) return st;
    for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
        char name[64];
        const void *img = NULL;
        size_t n = 0;
        snprintf(name, sizeof name, "rotary.sm_%d.ptx", ccs[i]);
        if (ccs[i] > cc || host->artifact(host->host_ctx, name, &img, &n) != KHUB_STATUS_OK)
            continue;
        khub_cuda_module *mod = NULL;
        if ((st = host->cuda_module_load(host->host_ctx, 0, img, n, &mod)) != KHUB_STATUS_OK)
            return st;
        for (int f = 0; f < F_COUNT && st == KHUB_STATUS_OK; f++)
            st = host->cuda_module_function(host->host_ctx, mod, fn_names[f], &s->fn[f]);
        s->loaded = st == KHUB_STATUS_OK;
        return st;
    }
    return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                      "rotary: no PTX for compute capability %d.%d", cc / 10, cc % 10);
}

static khub_status load(rope_state *s)
{
    pthread_mutex_lock(&s->lock);
    khub_status st = s->loaded ? KHUB_STATUS_OK : load_locked(s);
    pthread_mutex_unlock(&s->lock);
    return st;
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
    khub_status st = load(s);
    if (st != KHUB_STATUS_OK) return st;
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
    uint32_t threads = f == F_GENERIC ? (half < 128 ? (uint32_t)half : 128) : (uint32_t)half;
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)n, (uint32_t)heads, 1}, .block = {threads, 1, 1},
                                .stream = a->stream};
    return host->cuda_launch(host->host_ctx, s->fn[f], &cfg, params);
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
    g_state.loaded = 0;
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
