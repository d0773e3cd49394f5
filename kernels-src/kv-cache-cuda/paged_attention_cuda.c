/*
 * paged_attention_cuda.c: kernels-community/kv-cache-cuda's attention over
 * the paged device cache (op "paged_attention", layout
 * KHUB_KV_LAYOUT_PAGED_HTD; paged_cuda.c holds the cache, paged_attn.cu the
 * kernels), as khub/ref-cpu's paged_attention is on the CPU.
 *
 * q and out are compact f32 device tensors [total_q, n_heads, head_dim]
 * (head_dim 64 or 128); every pointer of the args (cu_seqlens_q, q_pos0,
 * kv_lens, block_table, seq_rows) is device memory and is not read here, so
 * the launch shapes come from what the host knows: with total_q <= 8 x
 * n_seqs (decode rows, a few per sequence) the split-K kernels run: one
 * block per (split, head, packed row) over splits of the key range a
 * sequence can reach (block_table_stride x block_size keys, the same for
 * every step, so a captured grid stays valid), ceil(keys / 256) splits, at
 * most 64 and at most what the partials' budget (4 Mi floats) allows, then
 * merged (one split writes out directly); with more rows per sequence, the
 * prefill tiles: one block per (64 rows of a sequence, head), grid.z the
 * sequence. Both are causal or not, with GQA, a sliding window and the
 * soft-cap (ABI 1.5).
 *
 * The partials' scratch is this plugin's, one buffer per live stream (at
 * most PG_STREAMS), freed when the host ends the stream (stream_end, ABI
 * 1.5: after it drained, before the handle can name a new stream) or at
 * shutdown, and declared in caps.stream_bytes so that a placed model's
 * memory check counts it. It is allocated
 * at the stream's first split-K call at the budget's size (16 MiB): the
 * split plan never asks for more, so the buffer never grows. A growth
 * would have to wait for the stream (work queued may still read the old
 * buffer) and free it, and a decode step the host captures as a CUDA graph
 * cannot hold a synchronisation of its stream; a fixed buffer also keeps
 * every captured step pointing at the same partials (FlashInfer sizes its
 * split-K workspace once for the same reason). The one allocation may fall
 * inside a capture, which the host's relaxed capture mode allows.
 *
 * Kernels and scratch are kept per device, the one the call's ctx names (a
 * CUfunction launches only on the device its module was loaded on; each
 * device has its own legacy stream).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <khub/khub_plugin.h>

#include "kv_cache_cuda.h"

#define PG_DECODE_ROWS 8 /* rows per sequence, on average, for split-K */
#define PG_SPLIT_KEYS  256
#define PG_MAX_SPLITS  64
#define PG_PART_BUDGET (4u << 20) /* floats of partials per call */
#define PG_STREAMS     16

#define PG_TRY(x) \
    do { \
        khub_status st_ = (x); \
        if (st_ != KHUB_STATUS_OK) return st_; \
    } while (0)

typedef struct pg_scratch {
    void *stream;  /* CUstream (NULL: the legacy one) */
    int device;    /* the stream's */
    uint64_t dptr; /* PG_PART_BUDGET floats */
    int used;
} pg_scratch;

static struct {
    const khub_host_api *host;
    pthread_mutex_t lock;
    int loaded[KHUB_CG_MAX_DEVICES];
    void *attn[KHUB_CG_MAX_DEVICES][2][2][2]; /* [device][head dim 64/128][f32/f16][tiles/decode] */
    void *merge[KHUB_CG_MAX_DEVICES][2];      /* [device][head dim 64/128] */
    pg_scratch scratch[PG_STREAMS];
} g_pg = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define FAIL(st, ...) g_pg.host->fail(g_pg.host->host_ctx, (st), __VA_ARGS__)

/* ======================================================================== */
/* The module and the scratch                                               */
/* ======================================================================== */

static khub_status load_locked(int dev)
{
    const khub_host_api *host = g_pg.host;
    khub_cuda_module *mod = NULL;
    khub_status st = khub_kvc__module(host, dev, "paged_attn", "paged_attention (cuda)", &mod);
    static const char *const dt[2] = {"f32", "f16"};
    static const int hds[2] = {64, 128};
    for (int h = 0; h < 2 && st == KHUB_STATUS_OK; h++) {
        char name[64];
        snprintf(name, sizeof name, "khub_pa_merge_hd%d", hds[h]);
        st = host->cuda_module_function(host->host_ctx, mod, name, &g_pg.merge[dev][h]);
        for (int d = 0; d < 2 && st == KHUB_STATUS_OK; d++) {
            snprintf(name, sizeof name, "khub_pa_hd%d_%s", hds[h], dt[d]);
            st = host->cuda_module_function(host->host_ctx, mod, name, &g_pg.attn[dev][h][d][0]);
            snprintf(name, sizeof name, "khub_pa_decode_hd%d_%s", hds[h], dt[d]);
            if (st == KHUB_STATUS_OK)
                st =
                    host->cuda_module_function(host->host_ctx, mod, name, &g_pg.attn[dev][h][d][1]);
        }
    }
    g_pg.loaded[dev] = st == KHUB_STATUS_OK;
    return st;
}

/* The partials' scratch of stream on device dev (the file comment):
 * PG_PART_BUDGET floats, allocated once. */
static khub_status scratch_locked(int dev, void *stream, size_t bytes, uint64_t *out)
{
    const khub_host_api *host = g_pg.host;
    if (bytes > (size_t)PG_PART_BUDGET * sizeof(float)) /* pa_split_plan's bound */
        return FAIL(KHUB_STATUS_INTERNAL,
                    "paged_attention (cuda): split-K partials of %zu bytes exceed the budget of "
                    "%zu",
                    bytes, (size_t)PG_PART_BUDGET * sizeof(float));
    pg_scratch *e = NULL, *free_slot = NULL;
    for (int i = 0; i < PG_STREAMS && !e; i++)
        if (g_pg.scratch[i].used && g_pg.scratch[i].stream == stream &&
            g_pg.scratch[i].device == dev)
            e = &g_pg.scratch[i];
        else if (!g_pg.scratch[i].used && !free_slot)
            free_slot = &g_pg.scratch[i];
    if (!e && !free_slot)
        return FAIL(KHUB_STATUS_NOMEM,
                    "paged_attention (cuda): split-K scratch is kept for %d live streams; this "
                    "call is on another one (free a model placed on the device first)",
                    PG_STREAMS);
    if (!e) {
        uint64_t d = 0;
        khub_status st =
            host->cuda_mem_alloc(host->host_ctx, dev, (size_t)PG_PART_BUDGET * sizeof(float), &d);
        if (st != KHUB_STATUS_OK) return st; /* the driver layer's message names the call */
        *(e = free_slot) = (pg_scratch){.stream = stream, .device = dev, .dptr = d, .used = 1};
    }
    *out = e->dptr;
    return KHUB_STATUS_OK;
}

static khub_status prepare(int dev, void *stream, size_t bytes, uint64_t *scratch)
{
    pthread_mutex_lock(&g_pg.lock);
    khub_status st = g_pg.loaded[dev] ? KHUB_STATUS_OK : load_locked(dev);
    if (st == KHUB_STATUS_OK && bytes) st = scratch_locked(dev, stream, bytes, scratch);
    pthread_mutex_unlock(&g_pg.lock);
    return st;
}

/* ======================================================================== */
/* The attention                                                            */
/* ======================================================================== */

static int dev_f32(const khub_tensor *t, int nd)
{
    return t && t->data && t->ndim == nd && t->dtype.code == KHUB_DL_FLOAT && t->dtype.bits == 32 &&
           t->device.device_type == KHUB_DEVICE_CUDA && !t->strides && !t->byte_offset;
}

static int pool_ok(const khub_tensor *t, const khub_tensor *like, int64_t hd)
{
    if (!t || !t->data || t->ndim != 4 || t->device.device_type != KHUB_DEVICE_CUDA || t->strides ||
        t->byte_offset || t->dtype.code != KHUB_DL_FLOAT ||
        (t->dtype.bits != 32 && t->dtype.bits != 16) || t->shape[3] != hd)
        return 0;
    for (int d = 0; like && d < 4; d++)
        if (t->shape[d] != like->shape[d]) return 0;
    return !like || t->dtype.bits == like->dtype.bits;
}

/* What the args must be; everything the host can check without reading
 * device memory (the file comment). */
static khub_status pa_check(const khub_paged_attention_args *a, float *softcap)
{
    const char *op = "paged_attention (cuda)";
    if (!a || a->struct_size < offsetof(khub_paged_attention_args, window) + sizeof a->window)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: args", op);
    *softcap = KHUB_HAS_FIELD(a, khub_paged_attention_args, softcap) ? a->softcap : 0.0f;
    if (a->layout != KHUB_KV_LAYOUT_PAGED_HTD)
        return FAIL(KHUB_STATUS_UNSUPPORTED, "%s: KV layout %u is not served here", op,
                    (unsigned)a->layout);
    if (!a->ctx || a->ctx->struct_size < sizeof(khub_call_ctx) ||
        a->ctx->device.device_type != KHUB_DEVICE_CUDA)
        return FAIL(KHUB_STATUS_INVALID_ARG, "%s: ctx must name the CUDA device and the stream",
                    op);
    if (!dev_f32(a->q, 3) || !dev_f32(a->out, 3) || a->q->data == a->out->data ||
        (a->q->shape[2] != 64 && a->q->shape[2] != 128) || a->q->shape[1] < 1 ||
        a->q->shape[0] > INT32_MAX)
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: q and out must be distinct compact f32 CUDA tensors [total_q, n_heads, "
                    "64 or 128]",
                    op);
    for (int d = 0; d < 3; d++)
        if (a->out->shape[d] != a->q->shape[d])
            return FAIL(KHUB_STATUS_INVALID_ARG, "%s: out.shape[%d] (got %lld, want q's %lld)", op,
                        d, (long long)a->out->shape[d], (long long)a->q->shape[d]);
    if (!pool_ok(a->k_pool, NULL, a->q->shape[2]) ||
        !pool_ok(a->v_pool, a->k_pool, a->q->shape[2]) || a->k_pool->shape[1] < 1 ||
        a->q->shape[1] % a->k_pool->shape[1] != 0 || a->k_pool->shape[2] != a->block_size ||
        a->k_pool->shape[0] > INT32_MAX)
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: k_pool/v_pool must be compact f32 or f16 CUDA tensors [n_blocks, "
                    "n_kv_heads (a divisor of n_heads), block_size, head_dim], alike",
                    op);
    if (a->n_seqs < 1 || a->n_seqs > 65535 || a->block_size < 1 || a->block_table_stride < 1 ||
        a->block_table_stride * (int64_t)a->block_size > INT32_MAX || a->causal > 1 ||
        a->window < 0 || !(*softcap >= 0.0f) || !a->cu_seqlens_q || !a->q_pos0 || !a->kv_lens ||
        !a->block_table)
        return FAIL(KHUB_STATUS_INVALID_ARG,
                    "%s: n_seqs %d (want 1..65535), block_size %d, block_table_stride %lld (want "
                    ">= 1, keys per sequence < 2^31), causal %u, window %lld, softcap %g, and "
                    "the four tables",
                    op, (int)a->n_seqs, (int)a->block_size, (long long)a->block_table_stride,
                    (unsigned)a->causal, (long long)a->window, (double)*softcap);
    return KHUB_STATUS_OK;
}

/* The split-K plan of the file comment (flash-attn2's split_plan). */
static void pa_split_plan(long long rows, long long nh, long long keys, int hd, int *nsplit,
                          int *chunk)
{
    long long n = (keys + PG_SPLIT_KEYS - 1) / PG_SPLIT_KEYS;
    long long cap = (long long)PG_PART_BUDGET / (rows * nh * (hd + 2));
    if (n > PG_MAX_SPLITS) n = PG_MAX_SPLITS;
    if (n > cap) n = cap;
    if (n < 1) n = 1;
    long long c = (keys + n - 1) / n;
    c = (c + 31) / 32 * 32;
    if (c < 32) c = 32;
    *chunk = (int)c;
    n = (keys + c - 1) / c;
    *nsplit = n < 1 ? 1 : (int)n;
}

static khub_status paged_attention_cuda(void *sp, const void *args)
{
    (void)sp;
    const khub_paged_attention_args *a = args;
    float softcap = 0.0f;
    PG_TRY(pa_check(a, &softcap));
    const khub_host_api *host = g_pg.host;
    void *stream = a->ctx->stream;
    int total = (int)a->q->shape[0], nh = (int)a->q->shape[1], hd = (int)a->q->shape[2];
    int nkvh = (int)a->k_pool->shape[1], n_blocks = (int)a->k_pool->shape[0];
    int n_seqs = a->n_seqs, bs = a->block_size, causal = (int)a->causal;
    int h = hd == 128, dt = a->k_pool->dtype.bits == 16;
    long long stride = a->block_table_stride, window = a->window;
    float scale = a->scale;
    if (total == 0) return KHUB_STATUS_OK;
    int decode = total <= PG_DECODE_ROWS * (long long)n_seqs && total <= 65535;
    int nsplit = 1, chunk = 32;
    if (decode) pa_split_plan(total, nh, stride * bs, hd, &nsplit, &chunk);
    size_t bytes = decode && nsplit > 1
                       ? (size_t)total * (size_t)nh * (size_t)nsplit * (size_t)(hd + 2) * 4
                       : 0;
    uint64_t scratch = 0;
    int dev = 0;
    PG_TRY(khub_cg_device(host, "paged_attention (cuda)", a->ctx->device, &dev));
    PG_TRY(prepare(dev, stream, bytes, &scratch));
    const void *table = a->block_table, *q = a->q->data, *kp = a->k_pool->data,
               *vp = a->v_pool->data, *cu = a->cu_seqlens_q, *p0 = a->q_pos0, *kl = a->kv_lens,
               *rows = a->seq_rows;
    void *out = a->out->data, *part = (void *)(uintptr_t)scratch;
    void *params[] = {&table,   &q,      &kp,     &vp,   &out,    &cu,   &p0,       &kl,
                      &rows,    &stride, &n_seqs, &nh,   &nkvh,   &bs,   &n_blocks, &scale,
                      &softcap, &causal, &window, &part, &nsplit, &chunk};
    khub_cuda_launch_cfg cfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg), .stream = stream};
    if (!decode) {
        cfg.grid[0] = (uint32_t)((total + 63) / 64), cfg.grid[1] = (uint32_t)nh;
        cfg.grid[2] = (uint32_t)n_seqs, cfg.block[0] = 64;
    } else {
        cfg.grid[0] = (uint32_t)nsplit, cfg.grid[1] = (uint32_t)nh, cfg.grid[2] = (uint32_t)total;
        cfg.block[0] = 128;
    }
    cfg.block[1] = cfg.block[2] = 1;
    PG_TRY(host->cuda_launch(host->host_ctx, g_pg.attn[dev][h][dt][decode], &cfg, params));
    if (!decode || nsplit == 1) return KHUB_STATUS_OK;
    void *mparams[] = {&part, &out, &nsplit};
    khub_cuda_launch_cfg mcfg = {KHUB_STRUCT_INIT(khub_cuda_launch_cfg),
                                 .grid = {(uint32_t)(total * nh), 1, 1},
                                 .block = {(uint32_t)hd, 1, 1}, .stream = stream};
    return host->cuda_launch(host->host_ctx, g_pg.merge[dev][h], &mcfg, mparams);
}

/* ======================================================================== */
/* The op                                                                   */
/* ======================================================================== */

static const int32_t pa_head_dims[] = {64, 128};

static const khub_op_caps pa_caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CUDA,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .head_dims = pa_head_dims,
    .n_head_dims = 2,
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING,
    .cc_min = 75,
    .priority = 50,
    .kind_flags = KHUB_ATTN_SOFTCAP,
    .kv_layouts = KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD),
    .stream_bytes = (uint64_t)PG_PART_BUDGET * sizeof(float),
};

const khub_op_desc khub_kvc__paged_attention_op = {
    KHUB_STRUCT_INIT(khub_op_desc), .name = "paged_attention", .kind = KHUB_OP_PAGED_ATTENTION,
    .caps = &pa_caps, .run = paged_attention_cuda};

void khub_kvc__attention_init(const khub_host_api *host)
{
    g_pg.host = host;
    memset(g_pg.loaded, 0, sizeof g_pg.loaded);
    memset(g_pg.scratch, 0, sizeof g_pg.scratch);
}

void khub_kvc__attention_stream_end(void *stream)
{
    pthread_mutex_lock(&g_pg.lock);
    for (int i = 0; i < PG_STREAMS; i++) {
        pg_scratch *e = &g_pg.scratch[i];
        if (!e->used || e->stream != stream) continue;
        if (e->dptr) g_pg.host->cuda_mem_free(g_pg.host->host_ctx, e->dptr);
        *e = (pg_scratch){0};
    }
    pthread_mutex_unlock(&g_pg.lock);
}

void khub_kvc__attention_shutdown(void)
{
    for (int i = 0; i < PG_STREAMS; i++)
        if (g_pg.scratch[i].dptr)
            g_pg.host->cuda_mem_free(g_pg.host->host_ctx, g_pg.scratch[i].dptr);
    memset(g_pg.scratch, 0, sizeof g_pg.scratch);
    memset(g_pg.loaded, 0, sizeof g_pg.loaded);
}
