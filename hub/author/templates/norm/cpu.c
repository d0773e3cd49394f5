/* @NAME@: RMSNorm (optional fused residual) for the CPU. */
#include <math.h>

#include <khub/khub_plugin.h>

/* Tensors here are compact (this op claims no strides): data + byte_offset. */
static void *base(const khub_tensor *t) { return (char *)t->data + t->byte_offset; }

static khub_status rms_norm(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_norm_args *a = args;
    if (!a || a->struct_size < sizeof *a || a->norm_type != KHUB_NORM_RMS || !a->x ||
        a->x->ndim != 2 || !a->weight || a->weight->shape[0] != a->x->shape[1])
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: needs KHUB_NORM_RMS, x [n, dim], weight [dim]");
    int64_t n = a->x->shape[0], dim = a->x->shape[1];
    if (a->x->strides || a->weight->strides || a->y->strides ||
        (a->residual && a->residual->strides))
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "@NAME@: needs compact x, weight, residual and y (no strides)");
    const float *x = base(a->x), *w = base(a->weight);
    float *y = base(a->y), *res = a->residual ? base(a->residual) : NULL;
    for (int64_t r = 0; r < n; r++) {
        float ss = 0.0f;
        for (int64_t i = 0; i < dim; i++) {
            float v = x[r * dim + i];
            if (res) v = (res[r * dim + i] += v);
            ss += v * v;
        }
        float scale = 1.0f / sqrtf(ss / (float)dim + a->eps);
        for (int64_t i = 0; i < dim; i++)
            y[r * dim + i] = (res ? res[r * dim + i] : x[r * dim + i]) * scale * w[i];
    }
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
                                  .flags = KHUB_CAP_RESIDUAL, .priority = 5};
#define OP_KIND    KHUB_OP_NORM
#define OP_NAME    "rms_norm"
#define OP_RUN     rms_norm
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
