/* @NAME@ CUDA host glue: loads the best PTX artifact for the device (the
 * highest sm at or below its compute capability) on first use and launches
 * the kernel. Scores 0 without a CUDA driver, so it is never chosen there. */
#include <stdio.h>

#include <khub/khub_plugin.h>

static const int ccs[] = {90, 80, 75};
static const khub_host_api *g_host; /* the host API, set by the init function */
static void *fn;

static int32_t score(void *s)
{
    (void)s;
    int n = 0;
    return g_host->cuda_device_count(g_host->host_ctx, &n) == KHUB_STATUS_OK && n > 0;
}

static khub_status load(const char *kernel)
{
    int cc = 0;
    khub_status st = g_host->cuda_device_cc(g_host->host_ctx, 0, &cc);
    if (st != KHUB_STATUS_OK) return st;
    for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
        char name[96];
        const void *img;
        size_t n;
        snprintf(name, sizeof name, "@NAME@.sm_%d.ptx", ccs[i]);
        if (ccs[i] > cc || g_host->artifact(g_host->host_ctx, name, &img, &n) != KHUB_STATUS_OK)
            continue;
        khub_cuda_module *mod;
        if ((st = g_host->cuda_module_load(g_host->host_ctx, 0, img, n, &mod)) != KHUB_STATUS_OK)
            return st;
        return g_host->cuda_module_function(g_host->host_ctx, mod, kernel, &fn);
    }
    return g_host->fail(g_host->host_ctx, KHUB_STATUS_UNSUPPORTED, "@NAME@: no PTX for sm_%d", cc);
}

static khub_status run(void *state, const void *args)
{
    (void)state;
    const khub_attention_args *a = args;
    khub_status st = fn ? KHUB_STATUS_OK : load("TEMPLATE_CNAME_attention");
    if (st != KHUB_STATUS_OK) return st;
    int nq = (int)a->q->shape[0], nh = (int)a->q->shape[1], hd = (int)a->q->shape[2];
    int nkv = (int)a->k->shape[0], nkvh = (int)a->k->shape[1];
    /* K/V are cache views (KHUB_CAP_STRIDED_KV): any row and head strides,
     * a byte offset; the kernel needs f32 and contiguous head_dim. */
    if (a->k->dtype.bits != 32 || a->v->dtype.bits != 32 || a->mask || a->window ||
        (a->k->strides && a->k->strides[2] != 1) || (a->v->strides && a->v->strides[2] != 1))
        return g_host->fail(g_host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                            "@NAME@: needs f32 K/V with unit head_dim stride, no mask, no "
                            "window");
    long long ks0 = a->k->strides ? a->k->strides[0] : (long long)nkvh * hd;
    long long ks1 = a->k->strides ? a->k->strides[1] : hd;
    long long vs0 = a->v->strides ? a->v->strides[0] : (long long)nkvh * hd;
    long long vs1 = a->v->strides ? a->v->strides[1] : hd;
    float scale = a->scale, cap = 0.0f; /* cap: the logit soft-cap (ABI 1.5), 0 = none */
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    if (KHUB_HAS_FIELD(a, khub_attention_args, softcap)) cap = a->softcap;
#endif
    long long q0 = a->q_pos0;
    void *q = (char *)a->q->data + a->q->byte_offset;
    void *k = (char *)a->k->data + a->k->byte_offset;
    void *v = (char *)a->v->data + a->v->byte_offset;
    void *o = (char *)a->out->data + a->out->byte_offset;
    void *params[] = {&q,  &k,   &v,   &o,   &nq,  &nh,    &nkv, &nkvh,
                      &hd, &ks0, &ks1, &vs0, &vs1, &scale, &q0,  &cap};
    uint32_t threads = (uint32_t)(nq * nh);
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(threads + 127) / 128, 1, 1}, .block = {128, 1, 1},
                                .stream = a->stream};
    return g_host->cuda_launch(g_host->host_ctx, fn, &cfg, params);
}
#define OP_KIND   KHUB_OP_ATTENTION
#define OP_NAME   "attention"
#define OP_DTYPES KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32)
#define OP_FLAGS  (KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_STRIDED_KV)

static const khub_op_caps caps = {KHUB_STRUCT_INIT(khub_op_caps),
                                  .device_type = KHUB_DEVICE_CUDA,
                                  .dtypes = OP_DTYPES,
                                  .flags = OP_FLAGS,
#if KHUB_PLUGIN_TARGET_MINOR >= 5
                                  .kind_flags = KHUB_ATTN_SOFTCAP, /* kernel.cu caps */
#endif
                                  .cc_min = 75,
                                  .priority = 30};
static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = OP_NAME, .kind = OP_KIND, .caps = &caps, .run = run},
};

khub_status TEMPLATE_CNAME_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                     size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_host = h;
    fn = NULL;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "@ID@",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(TEMPLATE_CNAME_cuda_init, "@ID@", "1.0.0", KHUB_KIND_BIT(OP_KIND))
