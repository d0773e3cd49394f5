/* @NAME@: rotary position embedding, in place, for the CPU: NEOX (HF Llama's
 * rotate_half) or interleaved pairs, partial rotary_dim, no or linear
 * scaling (Llama 3 scaling is refused). Frequencies in float (as Transformers
 * computes them; powf, since pow@GLIBC_2.29 is newer than the ABI gate's
 * glibc ceiling), angles, cos and sin in double. */
#include <math.h>

#include <khub/khub_plugin.h>

static khub_status rotary(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_rotary_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->x || a->x->ndim != 3 || a->x->dtype.bits != 32 ||
        (a->x->shape[0] > 0 && !a->positions) ||
        (a->style != KHUB_ROPE_NEOX && a->style != KHUB_ROPE_INTERLEAVED) ||
        a->scaling > KHUB_ROPE_SCALING_LINEAR || !(a->theta > 0.0f) ||
        (a->scaling && !(a->factor > 0.0f)))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: needs f32 x [n, heads, dim], positions, NEOX or interleaved "
                          "style, no or linear scaling");
    int64_t n = a->x->shape[0], nh = a->x->shape[1], hd = a->x->shape[2];
    int64_t rd = a->rotary_dim ? a->rotary_dim : hd, half = rd / 2;
    if (rd < 2 || rd % 2 || rd > hd)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: rotary_dim %lld (want an even number in 2..%lld)", (long long)rd,
                          (long long)hd);
    int64_t s0 = a->x->strides ? a->x->strides[0] : nh * hd;
    int64_t s1 = a->x->strides ? a->x->strides[1] : hd;
    int64_t s2 = a->x->strides ? a->x->strides[2] : 1;
    float *x = (float *)((char *)a->x->data + a->x->byte_offset);
    int neox = a->style == KHUB_ROPE_NEOX;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < half; j++) {
            double inv = powf(a->theta, -2.0f * (float)j / (float)rd);
            double ang = a->positions[i] * (a->scaling ? inv / a->factor : inv);
            double c = cos(ang), s = sin(ang);
            int64_t ia = (neox ? j : 2 * j) * s2, ib = (neox ? j + half : 2 * j + 1) * s2;
            for (int64_t h = 0; h < nh; h++) {
                float *xh = x + i * s0 + h * s1;
                double xa = xh[ia], xb = xh[ib];
                xh[ia] = (float)(xa * c - xb * s);
                xh[ib] = (float)(xb * c + xa * s);
            }
        }
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .priority = 5};
#define OP_KIND    KHUB_OP_ROTARY
#define OP_NAME    "rotary"
#define OP_RUN     rotary
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
