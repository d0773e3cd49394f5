/*
 * norm_plugin.c: a kernel plugin built against the INSTALLED headers only
 * (<khub/khub_plugin.h>, the ABI, and <khub/helpers/khub_plugin_util.h>,
 * helpers compiled in): one RMS norm op, "acme/install-norm". Built by
 * tests/t_install.sh with `pkg-config --cflags khub-plugin` and loaded by
 * the installed libkhub.
 */
#include <math.h>

#include <khub/helpers/khub_plugin_util.h>
#include <khub/khub_plugin.h>

typedef struct norm_state {
    const khub_host_api *host;
} norm_state;

static khub_status rms_norm(void *state, const void *args)
{
    const khub_host_api *h = ((norm_state *)state)->host;
    KHUB_PU_TRY(khub_pu_args_check(h, "rms_norm", args, sizeof(khub_norm_args)));
    const khub_norm_args *a = args;
    uint64_t f32 = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32);
    KHUB_PU_TRY(khub_pu_tensor_check(h, "rms_norm", "x", a->x, 2, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(h, "rms_norm", "y", a->y, 2, f32, KHUB_DEVICE_CPU));
    KHUB_PU_TRY(khub_pu_tensor_check(h, "rms_norm", "weight", a->weight, 1, f32, KHUB_DEVICE_CPU));
    int64_t n = a->x->shape[0], dim = a->x->shape[1], sx[2], sy[2];
    KHUB_PU_TRY(khub_pu_dim_check(h, "rms_norm", "weight", a->weight, 0, dim, "dim"));
    if (a->residual)
        return h->fail(h->host_ctx, KHUB_STATUS_UNSUPPORTED, "rms_norm: no fused residual");
    khub_pu_strides(a->x, sx);
    khub_pu_strides(a->y, sy);
    const float *x = khub_pu_base(a->x), *w = khub_pu_base(a->weight);
    float *y = khub_pu_base(a->y);
    for (int64_t i = 0; i < n; i++) {
        double ss = 0;
        for (int64_t j = 0; j < dim; j++)
            ss += (double)x[i * sx[0] + j * sx[1]] * x[i * sx[0] + j * sx[1]];
        float inv = 1.0f / sqrtf((float)(ss / (double)dim) + a->eps);
        for (int64_t j = 0; j < dim; j++)
            y[i * sy[0] + j * sy[1]] = x[i * sx[0] + j * sx[1]] * inv * w[j];
    }
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .priority = -1};
static const khub_op_desc ops[] = {{KHUB_STRUCT_INIT(khub_op_desc), .name = "rms_norm",
                                    .kind = KHUB_OP_NORM, .caps = &caps, .run = rms_norm}};

static void shutdown_fn(void *state)
{
    norm_state *s = state;
    s->host->free(s->host->host_ctx, s);
}

static khub_status init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                        size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    norm_state *s = host->alloc(host->host_ctx, sizeof *s);
    if (!s) return KHUB_STATUS_NOMEM;
    s->host = host;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "acme/install-norm",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = s,
                          .shutdown = shutdown_fn};
    return khub_plugin_desc_put(out, &d);
}
KHUB_PLUGIN_DEFINE_KINDS(init, "acme/install-norm", "1.0.0", KHUB_KIND_BIT(KHUB_OP_NORM))
