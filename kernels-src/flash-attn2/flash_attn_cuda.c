/*
 * flash_attn_cuda.c: host glue of kernels-community/flash-attn2 for CUDA.
 *
 * Loads the best PTX artifact for a device (the highest sm at or below its
 * compute capability; PTX is forward compatible) on its first call there
 * and launches one of two paths (flash_attn.cu), chosen from the shapes of
 * the call. Modules, kernels, specialisations and scratch are kept per
 * device (q's device id picks it): a CUfunction launches only on the device
 * its module was loaded on. The paths:
 *
 *   - n_q > FA_DECODE_MAX_Q (8) query rows: the prefill tiles, khub_fa2_hd64
 *     or khub_fa2_hd128, one block of 64 threads per 64 query rows and head.
 *   - n_q <= 8 (decode, or a few rows): split-K (flash-decoding). The keys
 *     the last row sees, n_keys = min(n_kv, q_pos0 + n_q), are cut into
 *     nsplit splits of `chunk` keys: nsplit = ceil(n_keys / 256), at most
 *     64 and at most what the partials' budget (4 Mi floats) allows for
 *     n_q x n_heads rows, then chunk = ceil(n_keys / nsplit) rounded up to
 *     32 keys. khub_fa2_decode_hd* runs one block of 4 warps per (split,
 *     head, row); with nsplit > 1 each writes its split's partial max, sum
 *     and output into a device scratch and khub_fa2_merge_hd* (one block
 *     per row and head) merges them into out; with nsplit == 1 the decode
 *     kernel writes out itself (one launch).
 *
 * The partials' scratch is the plugin's: one device buffer per stream, at
 * most FA_STREAMS live streams, freed when the host ends the stream
 * (stream_end, ABI 1.5: after the stream drained, before the handle can
 * name a new stream) or at shutdown; a slot of a stream still alive is
 * never given to another. Its first split-K call with
 * partials sizes it for the most any call of that (heads, head_dim) can
 * need (8 rows x 64 splits, within the budget), so a model's decode steps
 * never grow it as the context grows: no synchronisation and no new
 * allocation mid-step, which a CUDA graph capture of the step (the
 * executor's forward_graph.c; relaxed mode, so that first allocation may
 * happen in it) could not hold. A call whose partials do not fit (a
 * larger shape on the same stream) replaces it after that stream drained.
 * A scratch is keyed by stream and device (each device has its own legacy
 * stream) and allocated on that device.
 *
 * At load, when the host can compile (ABI 1.5 host->cuda_module_compile,
 * docs/gpu.md): the first call with a shape (head_dim, query heads, KV
 * heads) has flash_attn.cu, shipped in the variant, compiled with them as
 * -D constants (once per process; the host's disk cache keeps it across
 * processes) and launches khub_fa2_spec (prefill) or khub_fa2_decode_spec
 * (split-K; the merge, which needs head_dim only, stays the build-time
 * kernel). When that compile fails (no NVRTC, KHUB_CUDA_JIT=0) the
 * build-time kernels run. A GPU newer than every listed capability gets
 * the module compiled for its own architecture, else the newest PTX (the
 * driver compiles it forward).
 *
 * Causal only, no mask, window or soft-cap, f32 q/k/v on the device, K/V
 * rows of [n_kv_heads, head_dim] contiguous values at any row stride.
 * Scores 0 without a CUDA driver, so the registry never chooses it there.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <khub/helpers/khub_cuda_glue.h>
#include <khub/khub_plugin.h>

static const int ccs[] = {90, 86, 80}; /* kernel.json's capabilities, highest first */

#define FA_DECODE_MAX_Q 8          /* at most this many query rows: split-K */
#define FA_SPLIT_KEYS   256        /* keys per split, before the caps below */
#define FA_MAX_SPLITS   64         /* splits per (row, head) */
#define FA_PART_BUDGET  (4u << 20) /* floats of partials per call */
#define FA_STREAMS      16         /* live streams with a scratch of their own */
#define MAX_SPECS       16         /* over every device */

enum { FN_PREFILL, FN_DECODE, FN_MERGE };

/* The kernels compiled at load for one shape (prefill, split-K decode);
 * NULL when that failed (the build-time kernels run for it, without asking
 * again). */
typedef struct fa_spec {
    int device, hd, nh, nkvh;
    void *fn[2]; /* CUfunction */
} fa_spec;

typedef struct fa_scratch {
    void *stream; /* CUstream (NULL = the legacy stream) */
    int device;   /* the stream's */
    uint64_t dptr;
    size_t bytes;
    int used;
} fa_scratch;

typedef struct fa_state {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded[KHUB_CG_MAX_DEVICES];
    void *fn[KHUB_CG_MAX_DEVICES][2][3]; /* CUfunction per device and head dim (64, 128):
                                            prefill, decode, merge */
    fa_spec spec[MAX_SPECS];
    int n_spec;
    fa_scratch scratch[FA_STREAMS];
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

/* ======================================================================== */
/* The modules                                                              */
/* ======================================================================== */

static khub_status functions_of(fa_state *s, int dev, khub_cuda_module *mod)
{
    static const char *const names[2][3] = {
        {"khub_fa2_hd64", "khub_fa2_decode_hd64", "khub_fa2_merge_hd64"},
        {"khub_fa2_hd128", "khub_fa2_decode_hd128", "khub_fa2_merge_hd128"}};
    const khub_host_api *host = s->host;
    khub_status st = KHUB_STATUS_OK;
    for (int h = 0; h < 2; h++)
        for (int f = 0; f < 3 && st == KHUB_STATUS_OK; f++)
            st = host->cuda_module_function(host->host_ctx, mod, names[h][f], &s->fn[dev][h][f]);
    s->loaded[dev] = st == KHUB_STATUS_OK;
    return st;
}

static khub_status load_locked(fa_state *s, int dev)
{
    const khub_host_api *host = s->host;
    int cc = 0;
    KHUB_CG_TRY(host->cuda_device_cc(host->host_ctx, dev, &cc));
    if (cc > ccs[0] && can_compile(host)) { /* newer than the build: its own code */
        khub_cuda_module *mod = NULL;
        if (host->cuda_module_compile(host->host_ctx, dev, "flash_attn.cu", NULL, 0, &mod) ==
            KHUB_STATUS_OK)
            return functions_of(s, dev, mod);
        host->log(host->host_ctx, KHUB_LOG_INFO, "flash_attn: sm_%d: using the PTX for sm_%d", cc,
                  ccs[0]);
    }
    khub_cuda_module *mod = NULL;
    KHUB_CG_TRY(khub_cg_load_ptx(host, dev, cc, "flash_attn", ccs, sizeof ccs / sizeof ccs[0],
                                 "flash_attn", &mod));
    return functions_of(s, dev, mod);
}

/* The kernels compiled for this shape (fn[0] prefill, fn[1] decode),
 * compiling them on the first call that has it; NULLs: run the build-time
 * kernels. */
static void specialised(fa_state *s, int dev, int hd, int nh, int nkvh, void *fn[2])
{
    const khub_host_api *host = s->host;
    fn[0] = fn[1] = NULL;
    if (nkvh <= 0 || nh % nkvh || !can_compile(host)) return;
    pthread_mutex_lock(&s->lock);
    int i = 0;
    while (i < s->n_spec && !(s->spec[i].device == dev && s->spec[i].hd == hd &&
                              s->spec[i].nh == nh && s->spec[i].nkvh == nkvh))
        i++;
    if (i < s->n_spec) {
        fn[0] = s->spec[i].fn[0], fn[1] = s->spec[i].fn[1];
    } else if (s->n_spec < MAX_SPECS) {
        char d[3][48];
        snprintf(d[0], sizeof d[0], "KHUB_FA2_HD=%d", hd);
        snprintf(d[1], sizeof d[1], "KHUB_FA2_HEADS=%d", nh);
        snprintf(d[2], sizeof d[2], "KHUB_FA2_GROUP=%d", nh / nkvh);
        const char *defs[3] = {d[0], d[1], d[2]};
        khub_cuda_module *mod = NULL;
        if (host->cuda_module_compile(host->host_ctx, dev, "flash_attn.cu", defs, 3, &mod) !=
                KHUB_STATUS_OK ||
            host->cuda_module_function(host->host_ctx, mod, "khub_fa2_spec", &fn[0]) !=
                KHUB_STATUS_OK ||
            host->cuda_module_function(host->host_ctx, mod, "khub_fa2_decode_spec", &fn[1]) !=
                KHUB_STATUS_OK)
            fn[0] = fn[1] = NULL;
        if (!fn[0])
            host->log(host->host_ctx, KHUB_LOG_INFO,
                      "flash_attn: head_dim %d, %d/%d heads: the build-time kernels run", hd, nh,
                      nkvh);
        s->spec[s->n_spec++] = (fa_spec){dev, hd, nh, nkvh, {fn[0], fn[1]}};
    }
    pthread_mutex_unlock(&s->lock);
}

/* ======================================================================== */
/* The partials' scratch                                                    */
/* ======================================================================== */

/* The scratch of `stream` on device dev, at least `need` bytes long; a
 * new buffer is `shape_max` bytes (file comment). A buffer that grows is
 * replaced only after its stream drained (a kernel queued earlier may
 * still read it). */
static khub_status scratch_locked(fa_state *s, int dev, void *stream, size_t need, size_t shape_max,
                                  uint64_t *out)
{
    const khub_host_api *host = s->host;
    fa_scratch *e = NULL, *free_slot = NULL;
    for (int i = 0; i < FA_STREAMS && !e; i++)
        if (s->scratch[i].used && s->scratch[i].stream == stream && s->scratch[i].device == dev)
            e = &s->scratch[i];
        else if (!s->scratch[i].used && !free_slot)
            free_slot = &s->scratch[i];
    if (!e && !free_slot)
        return host->fail(host->host_ctx, KHUB_STATUS_NOMEM,
                          "flash_attn (cuda): split-K scratch is kept for %d live streams; this "
                          "call is on another one (free a model placed on the device first)",
                          FA_STREAMS);
    if (!e) *(e = free_slot) = (fa_scratch){.stream = stream, .device = dev, .used = 1};
    if (e->bytes < need) {
        khub_status st = KHUB_STATUS_OK;
        if (e->dptr) {
            st = host->cuda_stream_sync(host->host_ctx, stream);
            if (st == KHUB_STATUS_OK) st = host->cuda_mem_free(host->host_ctx, e->dptr);
            if (st != KHUB_STATUS_OK) return st;
            e->dptr = 0, e->bytes = 0;
        }
        size_t want = shape_max > need ? shape_max : need;
        if ((st = host->cuda_mem_alloc(host->host_ctx, dev, want, &e->dptr)) != KHUB_STATUS_OK) {
            e->dptr = 0;
            return st;
        }
        e->bytes = want;
    }
    *out = e->dptr;
    return KHUB_STATUS_OK;
}

/* The host ended `stream` (khub_plugin_desc.stream_end): it drained, and
 * no call on it follows, so its scratch is freed without a synchronisation
 * and its slot serves the next stream. */
static void fa_stream_end(void *sp, void *stream)
{
    fa_state *s = sp;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < FA_STREAMS; i++) {
        fa_scratch *e = &s->scratch[i];
        if (!e->used || e->stream != stream) continue;
        if (e->dptr) s->host->cuda_mem_free(s->host->host_ctx, e->dptr);
        *e = (fa_scratch){0};
    }
    pthread_mutex_unlock(&s->lock);
}

/* Loads dev's module on the first call there and finds the call's scratch
 * (need 0: none). */
static khub_status prepare(fa_state *s, int dev, void *stream, size_t need, size_t shape_max,
                           uint64_t *scratch)
{
    pthread_mutex_lock(&s->lock);
    khub_status st = s->loaded[dev] ? KHUB_STATUS_OK : load_locked(s, dev);
    if (st == KHUB_STATUS_OK && need) st = scratch_locked(s, dev, stream, need, shape_max, scratch);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ======================================================================== */
/* The op                                                                   */
/* ======================================================================== */

/* The split-K plan for n_q rows of n_heads over n_keys keys (file comment). */
static void split_plan(long long n_q, long long n_heads, long long n_keys, int hd, int *nsplit,
                       int *chunk)
{
    long long n = (n_keys + FA_SPLIT_KEYS - 1) / FA_SPLIT_KEYS;
    long long cap = (long long)FA_PART_BUDGET / (n_q * n_heads * (hd + 2));
    if (n > FA_MAX_SPLITS) n = FA_MAX_SPLITS;
    if (n > cap) n = cap;
    if (n < 1) n = 1;
    long long c = (n_keys + n - 1) / n;
    c = (c + 31) / 32 * 32;
    if (c < 32) c = 32;
    *chunk = (int)c;
    n = (n_keys + c - 1) / c;
    *nsplit = n < 1 ? 1 : (int)n;
}

/* The most partials bytes any split-K call of (n_heads, hd) can need. */
static size_t shape_max_bytes(long long n_heads, int hd)
{
    long long floats = (long long)FA_DECODE_MAX_Q * n_heads * FA_MAX_SPLITS * (hd + 2);
    if (floats > (long long)FA_PART_BUDGET) floats = FA_PART_BUDGET;
    return (size_t)floats * 4;
}

static int kv_ok(const khub_tensor *t, long long nkvh, long long hd)
{
    return t && t->ndim == 3 && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           t->device.device_type == KHUB_DEVICE_CUDA && t->shape[1] == nkvh && t->shape[2] == hd &&
           (!t->strides || (t->strides[1] == hd && t->strides[2] == 1));
}

static int args_ok(const khub_attention_args *a)
{
    if (!a || a->struct_size < sizeof *a || !a->causal || a->mask || a->window ||
        a->softcap != 0.0f || !a->q || !a->out || a->q->ndim != 3 ||
        (a->q->shape[2] != 64 && a->q->shape[2] != 128) || a->q->shape[1] < 1 ||
        a->q->dtype.bits != 32 || a->q->device.device_type != KHUB_DEVICE_CUDA || a->q_pos0 < 0)
        return 0;
    long long nkvh = a->k ? a->k->shape[1] : 0, hd = a->q->shape[2];
    return kv_ok(a->k, nkvh, hd) && kv_ok(a->v, nkvh, hd) && a->v->shape[0] == a->k->shape[0] &&
           nkvh >= 1 && a->q->shape[1] % nkvh == 0;
}

static void *base(const khub_tensor *t) { return (char *)t->data + t->byte_offset; }

static khub_status flash_attn_cuda(void *sp, const void *args)
{
    fa_state *s = sp;
    const khub_host_api *host = s->host;
    const khub_attention_args *a = args;
    if (!args_ok(a))
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "flash_attn (cuda): causal f32 CUDA tensors, head dim 64 or 128, no "
                          "mask, window or soft-cap, K/V rows [n_kv_heads, head_dim] contiguous");
    int nq = (int)a->q->shape[0], nh = (int)a->q->shape[1], hd = (int)a->q->shape[2];
    int nkv = (int)a->k->shape[0], nkvh = (int)a->k->shape[1], h = hd == 128;
    long long ks = a->k->strides ? a->k->strides[0] : (long long)nkvh * hd;
    long long vs = a->v->strides ? a->v->strides[0] : (long long)nkvh * hd;
    long long q0 = a->q_pos0, n_keys = q0 + nq < nkv ? q0 + nq : nkv;
    float scale = a->scale;
    void *q = base(a->q), *k = base(a->k), *v = base(a->v), *o = base(a->out);
    if (nq == 0) return KHUB_STATUS_OK;
    int nsplit = 1, chunk = 32;
    if (nq <= FA_DECODE_MAX_Q) split_plan(nq, nh, n_keys, hd, &nsplit, &chunk);
    size_t need = nq <= FA_DECODE_MAX_Q && nsplit > 1
                      ? (size_t)nq * (size_t)nh * (size_t)nsplit * (size_t)(hd + 2) * 4
                      : 0;
    uint64_t scratch = 0;
    int dev = 0;
    KHUB_CG_TRY(khub_cg_device(host, "flash_attn (cuda)", a->q->device, &dev));
    khub_status st = prepare(s, dev, a->stream, need, shape_max_bytes(nh, hd), &scratch);
    if (st != KHUB_STATUS_OK) return st;
    void *spec[2];
    specialised(s, dev, hd, nh, nkvh, spec);
    if (nq > FA_DECODE_MAX_Q) {
        void *params[] = {&q, &k, &v, &o, &nq, &nh, &nkv, &nkvh, &ks, &vs, &scale, &q0};
        khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                    .grid = {(uint32_t)((nq + 63) / 64), (uint32_t)nh, 1},
                                    .block = {64, 1, 1}, .stream = a->stream};
        return host->cuda_launch(host->host_ctx, spec[0] ? spec[0] : s->fn[dev][h][FN_PREFILL],
                                 &cfg, params);
    }
    void *part = (void *)(uintptr_t)scratch;
    void *params[] = {&q,    &k,  &v,  &o,     &part, &nh,     &nkv,
                      &nkvh, &ks, &vs, &scale, &q0,   &nsplit, &chunk};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                .grid = {(uint32_t)nsplit, (uint32_t)nh, (uint32_t)nq},
                                .block = {128, 1, 1}, .stream = a->stream};
    st = host->cuda_launch(host->host_ctx, spec[1] ? spec[1] : s->fn[dev][h][FN_DECODE], &cfg,
                           params);
    if (st != KHUB_STATUS_OK || nsplit == 1) return st;
    void *mparams[] = {&part, &o, &nsplit};
    khub_cuda_launch_cfg mcfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                 .grid = {(uint32_t)(nq * nh), 1, 1}, .block = {(uint32_t)hd, 1, 1},
                                 .stream = a->stream};
    return host->cuda_launch(host->host_ctx, s->fn[dev][h][FN_MERGE], &mcfg, mparams);
}

static void fa_shutdown(void *sp)
{
    fa_state *s = sp;
    for (int i = 0; i < FA_STREAMS; i++)
        if (s->scratch[i].dptr) s->host->cuda_mem_free(s->host->host_ctx, s->scratch[i].dptr);
    memset(s->scratch, 0, sizeof s->scratch);
    memset(s->loaded, 0, sizeof s->loaded);
    s->n_spec = 0;
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
    .stream_bytes = (uint64_t)FA_PART_BUDGET * 4, /* the most shape_max_bytes gives */
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
    memset(g_state.loaded, 0, sizeof g_state.loaded);
    g_state.n_spec = 0;
    memset(g_state.scratch, 0, sizeof g_state.scratch);
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/flash-attn2",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = &g_state,
                          .score = score,
                          .shutdown = fa_shutdown,
                          .stream_end = fa_stream_end};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_flash_attn2_cuda_init, "kernels-community/flash-attn2", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_ATTENTION))
