/*
 * hub_act.c: one activation op, silu_and_mul, that tests publish on an
 * in-process hub as the two variants of one Hub kernel (id HUB_ACT_ID;
 * tests/test_placement_hub.c):
 *   - built plain, the CPU variant: it computes on host tensors (double
 *     per element, as khub/ref-cpu);
 *   - built with HUB_ACT_CUDA, the CUDA variant's host glue: it launches
 *     its own kernel, khub_hub_act, from a PTX module through the host's
 *     driver layer on the call's stream, with y's address as the first
 *     argument (the fake driver logs the name; nothing computes), and
 *     refuses host tensors;
 *   - built with HUB_ACT_VERSION="1.0.1", the CPU variant of another
 *     version (other bytes: another plugin).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <khub/khub_plugin.h>

#ifndef HUB_ACT_ID
#define HUB_ACT_ID "acme/act"
#endif
/* Another version: other bytes, so a hub that publishes both serves two
 * plugins (test_placement_hub's swaps back and forth). */
#ifndef HUB_ACT_VERSION
#define HUB_ACT_VERSION "1.0.0"
#endif

static const khub_host_api *g_host;

#ifdef HUB_ACT_CUDA
#define DEVICE KHUB_DEVICE_CUDA
static const char ptx[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                          ".visible .entry khub_hub_act(.param .u64 a)\n{\n  ret;\n}\n";
static khub_cuda_module *g_mod;

static khub_status act(void *s, const void *args)
{
    (void)s;
    const khub_activation_args *a = args;
    if (a->gate->device.device_type != KHUB_DEVICE_CUDA ||
        a->y->device.device_type != KHUB_DEVICE_CUDA)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_INVALID_ARG,
                            HUB_ACT_ID " (cuda): a tensor is not on the device");
    khub_status st = KHUB_STATUS_OK;
    if (!g_mod) st = g_host->cuda_module_load(g_host->host_ctx, 0, ptx, sizeof ptx, &g_mod);
    void *fn = NULL;
    if (st == KHUB_STATUS_OK)
        st = g_host->cuda_module_function(g_host->host_ctx, g_mod, "khub_hub_act", &fn);
    if (st != KHUB_STATUS_OK) return st;
    uint64_t y = (uint64_t)(uintptr_t)a->y->data;
    void *params[] = {&y};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .grid = {1, 1, 1},
                                .block = {32, 1, 1}, .stream = a->stream};
    return g_host->cuda_launch(g_host->host_ctx, fn, &cfg, params);
}
#else
#define DEVICE KHUB_DEVICE_CPU
/* Element (i, k) of a 2-D f32 host tensor. */
static float *at(const khub_tensor *t, int64_t i, int64_t k)
{
    int64_t s0 = t->strides ? t->strides[0] : t->shape[1], s1 = t->strides ? t->strides[1] : 1;
    return (float *)((char *)t->data + t->byte_offset) + i * s0 + k * s1;
}

static khub_status act(void *s, const void *args)
{
    (void)s;
    const khub_activation_args *a = args;
    if (a->act_type != KHUB_ACT_SILU)
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                            HUB_ACT_ID ": only SiLU (act_type 1), got %u", (unsigned)a->act_type);
    for (int64_t i = 0; i < a->gate->shape[0]; i++)
        for (int64_t k = 0; k < a->gate->shape[1]; k++) {
            double g = *at(a->gate, i, k), u = *at(a->up, i, k);
            *at(a->y, i, k) = (float)(g / (1.0 + exp(-g)) * u);
        }
    return KHUB_STATUS_OK;
}
#endif

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = DEVICE,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)};
static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "silu_and_mul",
                                    .kind = KHUB_OP_ACTIVATION, .caps = &caps, .run = act}};

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_host = host;
#ifdef HUB_ACT_CUDA
    g_mod = NULL;
#endif
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc), .id = HUB_ACT_ID,
                          .version = HUB_ACT_VERSION, .n_ops = 1, .ops = ops};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE(init, HUB_ACT_ID, HUB_ACT_VERSION)
