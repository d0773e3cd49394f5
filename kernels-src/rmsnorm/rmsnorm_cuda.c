/*
 * rmsnorm_cuda.c: host glue of kernels-community/rmsnorm for CUDA.
 *
 * The GPU code ships as PTX artifacts (rmsnorm.sm_<cc>.ptx) in the verified
 * variant; the host loads the best one for the device (the highest sm at or
 * below the device's compute capability: PTX is forward compatible) on the
 * first call on that device (one module per device, chosen by the tensors'
 * device id), and launches khub_rms_norm_f32 with one block per row. Tensors
 * are device pointers (device type CUDA). Without a CUDA driver the plugin
 * still initialises (so `khub check` works anywhere) and scores 0, so the
 * registry never picks it.
 */
#include <stdio.h>
#include <string.h>

#include <khub/helpers/khub_cuda_glue.h>
#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75}; /* must match kernel.json, highest first */

typedef struct state {
    const khub_host_api *host;
    void *fn[KHUB_CG_MAX_DEVICES]; /* CUfunction per device, loaded on first use */
} state;

static state g_state;

static int32_t score(void *s)
{
    const khub_host_api *host = ((state *)s)->host;
    int count = 0;
    return host->cuda_device_count(host->host_ctx, &count) == KHUB_STATUS_OK && count > 0 ? 1 : 0;
}

static khub_status load_function(state *s, int dev)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    khub_cuda_module *mod = NULL;
    KHUB_CG_TRY(host->cuda_device_cc(host->host_ctx, dev, &cc));
    KHUB_CG_TRY(khub_cg_load_ptx(host, dev, cc, "rmsnorm", ccs, sizeof ccs / sizeof ccs[0],
                                 "rmsnorm", &mod));
    return host->cuda_module_function(host->host_ctx, mod, "khub_rms_norm_f32", &s->fn[dev]);
}

static khub_status rms_norm_cuda(void *sp, const void *args)
{
    state *s = sp;
    const khub_host_api *host = s->host;
    const khub_norm_args *a = args;
    if (!a || a->struct_size < sizeof(khub_norm_args) || a->norm_type != KHUB_NORM_RMS || !a->x ||
        a->x->ndim != 2 || a->x->device.device_type != KHUB_DEVICE_CUDA)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "rms_norm (cuda): needs KHUB_NORM_RMS args with CUDA tensors [n, dim]");
    int dev = 0;
    KHUB_CG_TRY(khub_cg_device(host, "rms_norm (cuda)", a->x->device, &dev));
    if (!s->fn[dev]) KHUB_CG_TRY(load_function(s, dev));
    int rows = (int)a->x->shape[0], dim = (int)a->x->shape[1];
    void *x = a->x->data, *w = a->weight->data, *y = a->y->data;
    void *res = a->residual ? a->residual->data : NULL;
    float eps = a->eps;
    void *params[] = {&x, &res, &w, &y, &dim, &eps};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)rows, 1, 1}, .block = {256, 1, 1},
                                .shared_bytes = 256 * sizeof(float), .stream = a->stream};
    return host->cuda_launch(host->host_ctx, s->fn[dev], &cfg, params);
}

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
    .flags = KHUB_CAP_RESIDUAL,
    .cc_min = 75,
    .cc_max = 0,
    .priority = 30,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "rms_norm", .kind = KHUB_OP_NORM, .caps = &caps,
     .run = rms_norm_cuda},
};

khub_status khub_rmsnorm_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                   size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_state.host = h;
    memset(g_state.fn, 0, sizeof g_state.fn);
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/rmsnorm",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = &g_state,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_rmsnorm_cuda_init, "kernels-community/rmsnorm", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_NORM))
