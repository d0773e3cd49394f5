/*
 * flash_attn_cuda.c: host glue of kernels-community/flash-attn2 for CUDA.
 *
 * Loads the best PTX artifact for the device (the highest sm at or below its
 * compute capability; PTX is forward compatible) on first use and launches
 * khub_fa2_hd64 or khub_fa2_hd128 with one block per 64 query rows and head.
 * Causal only, f32 q/k/v on the device. Scores 0 without a CUDA driver, so
 * the registry never chooses it there.
 */
#include <stdio.h>

#include <khub/khub_plugin.h>

static const int ccs[] = {90, 86, 80}; /* kernel.json's capabilities, highest first */

typedef struct fa_state {
    const khub_host_api *host;
    void *fn64, *fn128; /* CUfunction, loaded on first use */
} fa_state;

static fa_state g_state;

static int32_t score(void *sp)
{
    const khub_host_api *host = ((fa_state *)sp)->host;
    int n = 0;
    return host->cuda_device_count(host->host_ctx, &n) == KHUB_STATUS_OK && n > 0 ? 1 : 0;
}

static khub_status load(fa_state *s)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    khub_status st = host->cuda_device_cc(host->host_ctx, 0, &cc);
    if (st != KHUB_STATUS_OK) return st;
    for (size_t i = 0; i < sizeof ccs / sizeof ccs[0]; i++) {
        char name[64];
        const void *img = NULL;
        size_t n = 0;
        snprintf(name, sizeof name, "flash_attn.sm_%d.ptx", ccs[i]);
        if (ccs[i] > cc || host->artifact(host->host_ctx, name, &img, &n) != KHUB_STATUS_OK)
            continue;
        khub_cuda_module *mod = NULL;
        if ((st = host->cuda_module_load(host->host_ctx, 0, img, n, &mod)) != KHUB_STATUS_OK)
            return st;
        st = host->cuda_module_function(host->host_ctx, mod, "khub_fa2_hd64", &s->fn64);
        if (st == KHUB_STATUS_OK)
            st = host->cuda_module_function(host->host_ctx, mod, "khub_fa2_hd128", &s->fn128);
        return st;
    }
    return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                      "flash_attn: no PTX for compute capability %d.%d", cc / 10, cc % 10);
}

static khub_status flash_attn_cuda(void *sp, const void *args)
{
    fa_state *s = sp;
    const khub_host_api *host = s->host;
    const khub_attention_args *a = args;
    if (!a || a->struct_size < sizeof *a || !a->causal || a->mask || a->window || !a->q ||
        a->q->ndim != 3 || (a->q->shape[2] != 64 && a->q->shape[2] != 128) ||
        a->k->dtype.bits != 32 || a->q->device.device_type != KHUB_DEVICE_CUDA)
        return host->fail(
            host->host_ctx, KHUB_STATUS_INVALID_ARG,
            "flash_attn (cuda): causal f32 CUDA tensors, head dim 64 or 128, no mask");
    if (!s->fn64) {
        khub_status st = load(s);
        if (st != KHUB_STATUS_OK) return st;
    }
    int nq = (int)a->q->shape[0], nh = (int)a->q->shape[1], hd = (int)a->q->shape[2];
    int nkv = (int)a->k->shape[0], nkvh = (int)a->k->shape[1];
    long long ks = a->k->strides ? a->k->strides[0] : (long long)nkvh * hd;
    long long vs = a->v->strides ? a->v->strides[0] : (long long)nkvh * hd;
    long long q0 = a->q_pos0;
    float scale = a->scale;
    void *q = a->q->data, *k = a->k->data, *v = a->v->data, *o = a->out->data;
    void *params[] = {&q, &k, &v, &o, &nq, &nh, &nkv, &nkvh, &ks, &vs, &scale, &q0};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)((nq + 63) / 64), (uint32_t)nh, 1},
                                .block = {64, 1, 1}, .stream = a->stream};
    return host->cuda_launch(host->host_ctx, hd == 64 ? s->fn64 : s->fn128, &cfg, params);
}

static const int32_t head_dims[] = {64, 128};

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
    .head_dims = head_dims,
    .n_head_dims = 2,
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_STRIDED_KV,
    .cc_min = 80,
    .priority = 50,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "flash_attn", .kind = KHUB_OP_ATTENTION, .caps = &caps,
     .run = flash_attn_cuda},
};

khub_status khub_flash_attn2_cuda_init(const khub_host_api *h, khub_plugin_desc *out, char *errbuf,
                                       size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    g_state = (fa_state){.host = h};
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/flash-attn2",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = &g_state,
                          .score = score};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_flash_attn2_cuda_init, "kernels-community/flash-attn2", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_ATTENTION))
