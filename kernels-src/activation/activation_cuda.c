/*
 * activation_cuda.c: host glue of kernels-community/activation for CUDA.
 * Loads the best PTX artifact for a device on its first call there (once
 * per device: the tensors' device id picks it) and launches
 * khub_act_and_mul over gate/up/y device tensors. Scores 0 without a CUDA
 * driver.
 */
#include <stdio.h>

#include <khub/helpers/khub_cuda_glue.h>
#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75}; /* kernel.json's capabilities, highest first */

typedef struct act_state {
    const khub_host_api *host;
    void *fn[KHUB_CG_MAX_DEVICES]; /* CUfunction per device, loaded on first use */
} act_state;

static act_state g_state;

static int32_t score(void *sp)
{
    const khub_host_api *host = ((act_state *)sp)->host;
    int n = 0;
    return host->cuda_device_count(host->host_ctx, &n) == KHUB_STATUS_OK && n > 0 ? 1 : 0;
}

static khub_status load(act_state *s, int dev)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    khub_cuda_module *mod = NULL;
    KHUB_CG_TRY(host->cuda_device_cc(host->host_ctx, dev, &cc));
    KHUB_CG_TRY(khub_cg_load_ptx(host, dev, cc, "activation", ccs, sizeof ccs / sizeof ccs[0],
                                 "silu_and_mul", &mod));
    return host->cuda_module_function(host->host_ctx, mod, "khub_act_and_mul", &s->fn[dev]);
}

static khub_status run(void *sp, const void *args)
{
    act_state *s = sp;
    const khub_host_api *host = s->host;
    const khub_activation_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->gate || a->gate->ndim != 2 ||
        a->gate->device.device_type != KHUB_DEVICE_CUDA)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "silu_and_mul (cuda): needs CUDA tensors gate/up/y [n, ff]");
    int dev = 0;
    KHUB_CG_TRY(khub_cg_device(host, "silu_and_mul (cuda)", a->gate->device, &dev));
    if (!s->fn[dev]) KHUB_CG_TRY(load(s, dev));
    long long n = a->gate->shape[0] * a->gate->shape[1];
    int act = (int)a->act_type;
    void *g = a->gate->data, *u = a->up->data, *y = a->y->data;
    void *params[] = {&g, &u, &y, &n, &act};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)((n + 255) / 256), 1, 1}, .block = {256, 1, 1},
                                .stream = a->stream};
    return host->cuda_launch(host->host_ctx, s->fn[dev], &cfg, params);
}

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
    .cc_min = 75,
    .priority = 50,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "silu_and_mul", .kind = KHUB_OP_ACTIVATION,
     .caps = &caps, .run = run},
};

khub_status khub_activation_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                      size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_state = (act_state){.host = h};
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/activation",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = &g_state,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_activation_cuda_init, "kernels-community/activation", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_ACTIVATION))
