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
    const khub_linear_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->x || !a->weight || !a->y || a->x->ndim != 2 ||
        a->weight->ndim != 2 || a->weight->dtype.code != KHUB_DL_BLOCKQ ||
        a->weight->dtype.bits != KHUB_QFORMAT_Q8_0 || a->weight->shape[1] != a->x->shape[1] ||
        a->x->shape[1] % 32)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG,
                            "@NAME@: needs f32 x [n, in], Q8_0 weight [out, in] with in a "
                            "multiple of 32, y [n, out]");
    khub_status st = fn ? KHUB_STATUS_OK : load("TEMPLATE_CNAME_qlinear");
    if (st != KHUB_STATUS_OK) return st;
    long long n = a->x->shape[0];
    int in = (int)a->x->shape[1], out = (int)a->weight->shape[0];
    void *x = a->x->data, *w = a->weight->data, *b = a->bias ? a->bias->data : NULL;
    void *y = a->y->data;
    void *params[] = {&x, &w, &b, &y, &n, &in, &out};
    long long threads = n * out;
    if (threads == 0) return KHUB_STATUS_OK;
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)((threads + 255) / 256), 1, 1},
                                .block = {256, 1, 1}, .stream = a->stream};
    return g_host->cuda_launch(g_host->host_ctx, fn, &cfg, params);
}
#define OP_KIND   KHUB_OP_QLINEAR
#define OP_NAME   "qlinear_q8_0"
#define OP_DTYPES KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0)
#define OP_FLAGS  KHUB_CAP_BIAS

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
