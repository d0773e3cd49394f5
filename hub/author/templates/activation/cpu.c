/* @NAME@: SiLU-and-mul (y = silu(gate) * up) for the CPU. */
#include <math.h>

#include <khub/khub_plugin.h>

/* Tensors here are compact (this op claims no strides): data + byte_offset. */
static void *base(const khub_tensor *t) { return (char *)t->data + t->byte_offset; }

static khub_status silu_and_mul(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_activation_args *a = args;
    if (!a || a->struct_size < sizeof *a || a->act_type != KHUB_ACT_SILU || !a->gate || !a->up ||
        !a->y || a->gate->ndim != 2)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: needs KHUB_ACT_SILU and gate/up/y [n, ff]");
    int64_t count = a->gate->shape[0] * a->gate->shape[1];
    if (a->gate->strides || a->up->strides || a->y->strides)
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "@NAME@: needs compact gate, up and y (no strides)");
    const float *g = base(a->gate), *u = base(a->up);
    float *y = base(a->y);
    for (int64_t i = 0; i < count; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .priority = 5};
#define OP_KIND    KHUB_OP_ACTIVATION
#define OP_NAME    "silu_and_mul"
#define OP_RUN     silu_and_mul
#define OP_METHODS NULL

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = OP_NAME, .kind = OP_KIND, .caps = &caps,
     .methods = OP_METHODS, /* NULL except for a kv_cache's methods */
     .run = OP_RUN},
};

khub_status TEMPLATE_CNAME_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                                size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "@ID@",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = (void *)host};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(TEMPLATE_CNAME_init, "@ID@", "1.0.0", KHUB_KIND_BIT(OP_KIND))
