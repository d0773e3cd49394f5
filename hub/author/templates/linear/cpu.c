/* @NAME@: dense linear y = x W^T (+ bias), f32, for the CPU. Plain C, one
 * dot product per output; replace with a blocked, vectorised kernel. */
#include <khub/khub_plugin.h>

/* Tensors here are compact (this op claims no strides): data + byte_offset. */
static void *base(const khub_tensor *t) { return (char *)t->data + t->byte_offset; }

static khub_status linear(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_linear_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->x || !a->weight || !a->y || a->x->ndim != 2 ||
        a->weight->ndim != 2 || a->weight->dtype.bits != 32 ||
        a->weight->shape[1] != a->x->shape[1])
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: needs f32 x [n, in], weight [out, in], y [n, out]");
    int64_t n = a->x->shape[0], in = a->x->shape[1], out = a->weight->shape[0];
    if (a->x->strides || a->weight->strides || a->y->strides || (a->bias && a->bias->strides))
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "@NAME@: needs compact x, weight, bias and y (no strides)");
    const float *x = base(a->x), *w = base(a->weight), *b = a->bias ? base(a->bias) : NULL;
    float *y = base(a->y);
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < out; o++) {
            float acc = b ? b[o] : 0.0f;
            for (int64_t i = 0; i < in; i++) acc += x[r * in + i] * w[o * in + i];
            y[r * out + o] = acc;
        }
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
                                  .flags = KHUB_CAP_BIAS, .priority = 5};
#define OP_KIND    KHUB_OP_LINEAR
#define OP_NAME    "linear"
#define OP_RUN     linear
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
