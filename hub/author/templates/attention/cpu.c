/* @NAME@: causal scaled dot-product attention with GQA for the CPU.
 * Plain C: one (query, head) pair at a time, two passes over the keys
 * (max, then softmax-weighted sum). Replace with a tiled kernel. Built for
 * ABI 1.5 or newer it declares KHUB_ATTN_SOFTCAP and caps the scaled scores
 * (softcap * tanh(s / softcap)) when the host sends a softcap > 0. */
#include <math.h>
#include <stdlib.h>

#include <khub/khub_plugin.h>

static float at(const khub_tensor *t, int64_t i, int64_t h, int64_t d)
{
    int64_t s0 = t->strides ? t->strides[0] : t->shape[1] * t->shape[2];
    int64_t s1 = t->strides ? t->strides[1] : t->shape[2];
    int64_t s2 = t->strides ? t->strides[2] : 1;
    return ((const float *)((const char *)t->data + t->byte_offset))[i * s0 + h * s1 + d * s2];
}

static khub_status attention(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_attention_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->q || !a->k || !a->v || !a->out || a->q->ndim != 3 ||
        a->k->ndim != 3 || a->v->ndim != 3 || a->k->dtype.bits != 32 || a->v->dtype.bits != 32 ||
        a->mask || a->window)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "@NAME@: needs f32 q/k/v [n, heads, dim], no mask, no window");
    float cap = 0.0f; /* logit soft-cap (ABI 1.5), 0 = none */
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    if (KHUB_HAS_FIELD(a, khub_attention_args, softcap)) cap = a->softcap;
#endif
    if (!(cap >= 0.0f) || isinf(cap))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "@NAME@: softcap %g", cap);
    int64_t nq = a->q->shape[0], nh = a->q->shape[1], hd = a->q->shape[2];
    int64_t nkv = a->k->shape[0], nkvh = a->k->shape[1];
    if (nkvh <= 0 || nh % nkvh || a->k->shape[2] != hd || a->v->shape[0] != nkv)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG, "@NAME@: bad shapes");
    float *out = (float *)((char *)a->out->data + a->out->byte_offset);
    float *w = host->alloc(host->host_ctx, sizeof(float) * (size_t)(nkv ? nkv : 1));
    if (!w) return host->fail(host->host_ctx, KHUB_STATUS_NOMEM, "@NAME@: out of memory");
    for (int64_t i = 0; i < nq; i++) {
        int64_t last = a->causal ? a->q_pos0 + i : nkv - 1;
        if (last > nkv - 1) last = nkv - 1;
        for (int64_t h = 0; h < nh; h++) {
            int64_t g = h / (nh / nkvh);
            float mx = -INFINITY, sum = 0.0f;
            for (int64_t j = 0; j <= last; j++) {
                float s = 0.0f;
                for (int64_t d = 0; d < hd; d++) s += at(a->q, i, h, d) * at(a->k, j, g, d);
                w[j] = s * a->scale;
                if (cap > 0.0f) w[j] = cap * tanhf(w[j] / cap);
                if (w[j] > mx) mx = w[j];
            }
            for (int64_t j = 0; j <= last; j++) sum += (w[j] = expf(w[j] - mx));
            float *o = out + (i * nh + h) * hd;
            for (int64_t d = 0; d < hd; d++) {
                float acc = 0.0f;
                for (int64_t j = 0; j <= last; j++) acc += w[j] * at(a->v, j, g, d);
                o[d] = last >= 0 ? acc / sum : 0.0f;
            }
        }
    }
    host->free(host->host_ctx, w);
    return KHUB_STATUS_OK;
}

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps),
                                  .device_type = KHUB_DEVICE_CPU,
                                  .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
                                  .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_STRIDED_KV,
#if KHUB_PLUGIN_TARGET_MINOR >= 5
                                  .kind_flags = KHUB_ATTN_SOFTCAP,
#endif
                                  .priority = 5};
#define OP_KIND    KHUB_OP_ATTENTION
#define OP_NAME    "attention"
#define OP_RUN     attention
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
