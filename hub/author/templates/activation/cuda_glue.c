/* @NAME@ CUDA host glue: loads the best PTX artifact for the device (the
 * highest sm at or below its compute capability) on first use and launches
 * the kernel. Scores 0 without a CUDA driver, so it is never chosen there. */
#include <stdio.h>

#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75};
static const khub_host_api *g_host; /* the host API, set by the init function */
static void *fn;

static int32_t score(void *s)
{
    (void)s;
    int n = 0;
    return g_host->cuda_device_count(g_host->host_ctx, &n) == KHUB_STATUS_OK && n > 0;
}

static khub_status load(const char *kernel)
{
    int cc = 0;
    khub_status st = g_host->cuda_device_cc(g_host->host_ctx, 0, &cc);
    if (st != KHUB_STATUS_OK) return st;
    for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
        char name[96];
        const void *img;
        size_t n;
        snprintf(name, sizeof name, "@NAME@.sm_%d.ptx", ccs[i]);
        if (ccs[i] > cc || g_host->artifact(g_host->host_ctx, name, &img, &n) != KHUB_STATUS_OK)
            continue;
        khub_cuda_module *mod;
        if ((st = g_host->cuda_module_load(g_host->host_ctx, 0, img, n, &mod)) != KHUB_STATUS_OK)
            return st;
        return g_host->cuda_module_function(g_host->host_ctx, mod, kernel, &fn);
    }
    return g_host->fail(g_host->host_ctx, KHUB_STATUS_UNSUPPORTED, "@NAME@: no PTX for sm_%d", cc);
}

static khub_status run(void *state, const void *args)
{
    (void)state;
    const khub_activation_args *a = args;
    if (!a || a->struct_size < sizeof *a || a->act_type != KHUB_ACT_SILU || !a->gate || !a->up ||
        !a->y || a->gate->ndim != 2)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG,
                            "@NAME@: needs KHUB_ACT_SILU and gate/up/y [n, ff]");
    khub_status st = fn ? KHUB_STATUS_OK : load("TEMPLATE_CNAME_silu_and_mul");
    if (st != KHUB_STATUS_OK) return st;
    long long n = a->gate->shape[0] * a->gate->shape[1];
    void *g = a->gate->data, *u = a->up->data, *y = a->y->data;
    void *params[] = {&g, &u, &y, &n};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)((n + 255) / 256), 1, 1}, .block = {256, 1, 1},
                                .stream = a->stream};
    return g_host->cuda_launch(g_host->host_ctx, fn, &cfg, params);
}
#define OP_KIND   KHUB_OP_ACTIVATION
#define OP_NAME   "silu_and_mul"
#define OP_DTYPES KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)
#define OP_FLAGS  0

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps),
                                  .device_type = KHUB_DEVICE_CUDA,
                                  .dtypes = OP_DTYPES,
                                  .flags = OP_FLAGS,
                                  .cc_min = 75,
                                  .priority = 30};
static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = OP_NAME, .kind = OP_KIND, .caps = &caps, .run = run},
};

khub_status TEMPLATE_CNAME_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                     size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_host = h;
    fn = NULL;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "@ID@",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(TEMPLATE_CNAME_cuda_init, "@ID@", "1.0.0", KHUB_KIND_BIT(OP_KIND))
