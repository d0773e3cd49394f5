/*
 * flash_attn_cuda.c: host glue of kernels-community/flash-attn2 for CUDA.
 *
 * Loads the best PTX artifact for the device (the highest sm at or below its
 * compute capability; PTX is forward compatible) on first use and launches
 * khub_fa2_hd64 or khub_fa2_hd128 with one block per 64 query rows and head.
 * Causal only, f32 q/k/v on the device. Scores 0 without a CUDA driver, so
 * the registry never chooses it there.
 *
 * At load, when the host can compile (ABI 1.5 host->cuda_module_compile,
 * docs/gpu.md): the first call with a shape (head_dim, query heads, KV
 * heads) has flash_attn.cu, shipped in the variant, compiled with them as
 * -D constants (once per process; the host's disk cache keeps it across
 * processes) and launches khub_fa2_spec. When that compile fails (no NVRTC,
 * KHUB_CUDA_JIT=0) the build-time kernels run. A GPU newer than every listed
 * capability gets the module compiled for its own architecture, else the
 * newest PTX (the driver compiles it forward).
 */
#include <pthread.h>
#include <stdio.h>

#include <khub/khub_plugin.h>

static const int ccs[] = {90, 86, 80}; /* kernel.json's capabilities, highest first */

/* A kernel compiled at load for one shape; fn NULL when that failed (the
 * build-time kernels run for it, without asking again). */
typedef struct fa_spec {
    int hd, nh, nkvh;
    void *fn; /* CUfunction */
} fa_spec;

#define MAX_SPECS 16

typedef struct fa_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    void *fn64, *fn128; /* CUfunction, loaded on first use */
    fa_spec spec[MAX_SPECS];
    int n_spec;
} fa_state;

static fa_state g_state = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int32_t score(void *sp)
{
    const khub_host_api *host = ((fa_state *)sp)->host;
    int n = 0;
    return host->cuda_device_count(host->host_ctx, &n) == KHUB_STATUS_OK && n > 0 ? 1 : 0;
}

static int can_compile(const khub_host_api *host)
{
    return KHUB_HAS_FIELD(host, khub_host_api, cuda_module_compile) &&
           host->cuda_module_compile != NULL;
}

static khub_status functions_of(fa_state *s, khub_cuda_module *mod)
{
    const khub_host_api *host = s->host;
    khub_status st = host->cuda_module_function(host->host_ctx, mod, "khub_fa2_hd64", &s->fn64);
    if (st == KHUB_STATUS_OK)
        st = host->cuda_module_function(host->host_ctx, mod, "khub_fa2_hd128", &s->fn128);
    return st;
}

static khub_status load_locked(fa_state *s)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    khub_status st = host->cuda_device_cc(host->host_ctx, 0, &cc);
    if (st != KHUB_STATUS_OK) return st;
    if (cc > ccs[0] && can_compile(host)) { /* newer than the build: its own code */
        khub_cuda_module *mod = NULL;
        if (host->cuda_module_compile(host->host_ctx, 0, "flash_attn.cu", NULL, 0, &mod) ==
            KHUB_STATUS_OK)
            return functions_of(s, mod);
        host->log(host->host_ctx, KHUB_LOG_INFO, "flash_attn: sm_%d: using the PTX for sm_%d", cc,
                  ccs[0]);
    }
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
        return functions_of(s, mod);
    }
    return host->fail(host->host_ctx, KHUB_STATUS_UNSUPPORTED,
                      "flash_attn: no PTX for compute capability %d.%d", cc / 10, cc % 10);
}

static khub_status load(fa_state *s)
{
    pthread_mutex_lock(&s->lock);
    khub_status st = s->fn64 && s->fn128 ? KHUB_STATUS_OK : load_locked(s);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The kernel compiled for this shape, compiling it on the first call that
 * has it; NULL: run the build-time kernels. */
static void *specialised(fa_state *s, int hd, int nh, int nkvh)
{
    const khub_host_api *host = s->host;
    if (nkvh <= 0 || nh % nkvh || !can_compile(host)) return NULL;
    pthread_mutex_lock(&s->lock);
    void *fn = NULL;
    int i = 0;
    while (i < s->n_spec &&
           !(s->spec[i].hd == hd && s->spec[i].nh == nh && s->spec[i].nkvh == nkvh))
        i++;
    if (i < s->n_spec) {
        fn = s->spec[i].fn;
    } else if (s->n_spec < MAX_SPECS) {
        char d[3][48];
        snprintf(d[0], sizeof d[0], "KHUB_FA2_HD=%d", hd);
        snprintf(d[1], sizeof d[1], "KHUB_FA2_HEADS=%d", nh);
        snprintf(d[2], sizeof d[2], "KHUB_FA2_GROUP=%d", nh / nkvh);
        const char *defs[3] = {d[0], d[1], d[2]};
        khub_cuda_module *mod = NULL;
        if (host->cuda_module_compile(host->host_ctx, 0, "flash_attn.cu", defs, 3, &mod) ==
                KHUB_STATUS_OK &&
            host->cuda_module_function(host->host_ctx, mod, "khub_fa2_spec", &fn) != KHUB_STATUS_OK)
            fn = NULL;
        if (!fn)
            host->log(host->host_ctx, KHUB_LOG_INFO,
                      "flash_attn: head_dim %d, %d/%d heads: the build-time kernels run", hd, nh,
                      nkvh);
        s->spec[s->n_spec++] = (fa_spec){hd, nh, nkvh, fn};
    }
    pthread_mutex_unlock(&s->lock);
    return fn;
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
    khub_status st = load(s);
    if (st != KHUB_STATUS_OK) return st;
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
    void *fn = specialised(s, hd, nh, nkvh);
    return host->cuda_launch(host->host_ctx, fn ? fn : hd == 64 ? s->fn64 : s->fn128, &cfg, params);
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
    g_state.host = h;
    g_state.fn64 = g_state.fn128 = NULL;
    g_state.n_spec = 0;
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
