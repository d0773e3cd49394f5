/* @NAME@: weight-only Q8_0 linear y = x W^T (+ bias) for the CPU. W is in
 * ggml's Q8_0 (each block of 32 weights is an f16 scale d, then 32 int8 q;
 * weight = q * d), as in GGUF files and from `khub run --quant q8_0`. Plain
 * C, one dot product per output; replace with a vectorised kernel. The
 * quantize/dequantize methods are optional: without them the host makes
 * Q8_0 weights with khub/ref-cpu's. */
#include <math.h>

#include <khub/khub_plugin.h>

/* An IEEE half, stored little-endian, as a float. */
static float f16_at(const unsigned char *p)
{
    int h = p[0] | p[1] << 8, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0    ? ldexpf((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

/* Tensors here are compact (this op claims no strides): data + byte_offset. */
static void *base(const khub_tensor *t) { return (char *)t->data + t->byte_offset; }

static khub_status qlinear(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_linear_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->x || !a->weight || !a->y || a->x->ndim != 2 ||
        a->weight->ndim != 2 || a->weight->dtype.code != KHUB_DL_BLOCKQ ||
        a->weight->dtype.bits != KHUB_QFORMAT_Q8_0 || a->weight->shape[1] != a->x->shape[1] ||
        a->x->shape[1] % 32)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: needs f32 x [n, in], Q8_0 weight [out, in] with in a "
                          "multiple of 32, y [n, out]");
    int64_t n = a->x->shape[0], in = a->x->shape[1], out = a->weight->shape[0];
    if (a->x->strides || a->weight->strides || a->y->strides || (a->bias && a->bias->strides))
        return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                          "@NAME@: needs compact x, weight, bias and y (no strides)");
    const float *x = base(a->x), *b = a->bias ? base(a->bias) : NULL;
    const unsigned char *w = base(a->weight);
    float *y = base(a->y);
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < out; o++) {
            const unsigned char *blk = w + o * (in / 32) * 34; /* row o: in/32 blocks */
            float acc = 0.0f;
            for (int64_t i = 0; i < in; i += 32, blk += 34) {
                float dot = 0.0f;
                for (int l = 0; l < 32; l++)
                    dot += (float)(signed char)blk[2 + l] * x[r * in + i + l];
                acc += f16_at(blk) * dot;
            }
            y[r * out + o] = acc + (b ? b[o] : 0.0f);
        }
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0),
                                  .flags = KHUB_CAP_BIAS, .priority = 5};
#define OP_KIND    KHUB_OP_QLINEAR
#define OP_NAME    "qlinear_q8_0"
#define OP_RUN     qlinear
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
