/*
 * cuda_ops.c: a CUDA plugin for the host-side tests of device placement
 * (tests/test_placement.c), run against the fake driver (tests/fake_cuda):
 * rms_norm (with the fused residual), dense f32 linear (with bias) and
 * silu_and_mul, all on KHUB_DEVICE_CUDA. Each op loads a one-kernel PTX
 * module on its first call and launches it on the call's stream; nothing
 * here computes (the fake driver runs no kernel), so no test may read
 * numbers from it. Without a driver it still initialises and scores 0.
 */
#include <khub/khub_plugin.h>

static const char ptx[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                          ".visible .entry khub_test_nop()\n{\n  ret;\n}\n";

static const khub_host_api *g_host;
static void *g_fn;

static int32_t score(void *s)
{
    (void)s;
    int count = 0;
    return g_host->cuda_device_count(g_host->host_ctx, &count) == KHUB_STATUS_OK && count > 0;
}

static khub_status launch(void *stream)
{
    if (!g_fn) {
        khub_cuda_module *mod = NULL;
        khub_status st = g_host->cuda_module_load(g_host->host_ctx, 0, ptx, sizeof ptx, &mod);
        if (st == KHUB_STATUS_OK)
            st = g_host->cuda_module_function(g_host->host_ctx, mod, "khub_test_nop", &g_fn);
        if (st != KHUB_STATUS_OK) return st;
    }
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .grid = {1, 1, 1},
                                .block = {32, 1, 1}, .stream = stream};
    return g_host->cuda_launch(g_host->host_ctx, g_fn, &cfg, NULL);
}

static khub_status norm(void *s, const void *args)
{
    (void)s;
    return launch(((const khub_norm_args *)args)->stream);
}

static khub_status linear(void *s, const void *args)
{
    (void)s;
    return launch(((const khub_linear_args *)args)->stream);
}

static khub_status act(void *s, const void *args)
{
    (void)s;
    return launch(((const khub_activation_args *)args)->stream);
}

static const khub_op_caps norm_caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .flags = KHUB_CAP_RESIDUAL};
static const khub_op_caps linear_caps = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .flags = KHUB_CAP_BIAS};
static const khub_op_caps act_caps = {KHUB_STRUCT_INIT(khub_op_caps),
                                      .device_type = KHUB_DEVICE_CUDA,
                                      .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "rms_norm", .kind = KHUB_OP_NORM, .caps = &norm_caps,
     .run = norm},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "linear", .kind = KHUB_OP_LINEAR, .caps = &linear_caps,
     .run = linear},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "silu_and_mul", .kind = KHUB_OP_ACTIVATION,
     .caps = &act_caps, .run = act},
};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_host = host;
    g_fn = NULL;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "khub-test/cuda-ops",
                          .version = "1.0.0",
                          .n_ops = 3,
                          .ops = ops,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, "khub-test/cuda-ops", "1.0.0")
