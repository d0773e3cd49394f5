/*
 * test_paged.c: the paged KV cache and batched paged attention (ABI 1.4,
 * issue 13 items 1-2).
 *
 *   - paged_attention (khub/ref-cpu, and khub/cpu-avx2 / cpu-avx512 where
 *     this CPU runs them; they serve the f32/f16 layout) against khub/ref-cpu's dense
 *     attention, sequence by sequence, over random shapes: GQA groups 1-4,
 *     odd head dims, block sizes 1-16, sliding windows, f32 and f16 pools,
 *     ragged batches of up to 7 sequences, block tables shuffled so no
 *     sequence's blocks are contiguous; and the int8 layout with per-block
 *     scales against the dense attention of the dequantized values.
 *   - cpu-x86's paged attention gives the bits of its own dense attention
 *     (memcmp; sequences of several 32-key tiles, any block size): the
 *     paged cache keeps a batch's rows equal to their solo runs; and on an
 *     f16 pool the bits of an f32 pool holding the same values, at decode
 *     (halves read in place) and with more queries (tiles converted).
 *   - the paged cache: pool exhaustion is KV_FULL with its message and takes
 *     nothing; random reserve/release rounds never hand a block to two
 *     sequences, and releasing everything drains the pool to empty; an f16
 *     pool's write rounds every value as khub_pu_f32_to_f16 does.
 *   - bad paged_attention arguments are refused with their messages.
 * The plugins are opened with dlopen on the runtime's host table, as
 * test_cpu_x86 does.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>

#include "../plugins/include/khub_plugin_util.h"
#include "runtime_impl.h"
#include "runner.h"

typedef struct plug {
    void *dl;
    khub_plugin_desc d;
} plug;

static khub_runtime *g_rt;
static const khub_host_api *g_host;
static plug g_ref, g_lv[2];
static int g_n_lv = -1;

static void close_all(void)
{
    for (int i = 0; i < g_n_lv; i++) g_lv[i].d.shutdown(g_lv[i].d.state);
    if (g_ref.d.shutdown) g_ref.d.shutdown(g_ref.d.state);
    khub_runtime_free(g_rt);
}

static int plug_open(plug *p, const char *file)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", KHUB_PLUGIN_DIR_BUILD, file);
    p->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!p->dl) return 0;
    khub_plugin_init_fn init = (khub_plugin_init_fn)(uintptr_t)dlsym(p->dl, KHUB_PLUGIN_ENTRY);
    ASSERT(init != NULL);
    memset(&p->d, 0, sizeof p->d);
    p->d.struct_size = sizeof p->d;
    char err[256] = "";
    if (init(g_host, &p->d, err, sizeof err) != KHUB_STATUS_OK)
        TEST_FAIL_("init %s: %s", file, err);
    return 1;
}

/* The runtime, ref-cpu and the cpu-x86 levels this CPU runs. */
static void setup(void)
{
    if (g_rt) return;
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&o, &g_rt));
    g_host = khub__runtime_host(g_rt);
    if (!plug_open(&g_ref, "ref-cpu.so")) TEST_FAIL_("ref-cpu.so not built: %s", dlerror());
    static const char *const files[2] = {"cpu-avx2.so", "cpu-avx512.so"};
    static const uint32_t need[2] = {KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C,
                                     KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C |
                                         KHUB_CPU_AVX512F | KHUB_CPU_AVX512VNNI};
    g_n_lv = 0;
    for (int l = 0; l < 2; l++) {
        if ((khub_cpu_features() & need[l]) != need[l]) {
            fprintf(stderr, "  note: this CPU cannot run %s\n", files[l]);
            continue;
        }
        if (plug_open(&g_lv[g_n_lv], files[l])) g_n_lv++;
    }
    atexit(close_all);
}

static const khub_op_desc *op_of(const plug *p, uint32_t kind, const char *name)
{
    for (uint32_t i = 0; i < p->d.n_ops; i++)
        if (p->d.ops[i].kind == kind && (!name || !strcmp(p->d.ops[i].name, name)))
            return &p->d.ops[i];
    return NULL;
}

static khub_status run_op(const plug *p, uint32_t kind, const void *args)
{
    const khub_op_desc *op = op_of(p, kind, NULL);
    ASSERT(op != NULL);
    khub__plugin_msg_clear();
    return op->run(p->d.state, args);
}

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}
static int irand(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }
static float frand(void) { return (float)(rnd() & 0xffffff) / 8388608.0f - 1.0f; }

static uint16_t to_f16(float f)
{
    /* round to nearest even via the ref plugin's helper semantics: via
     * float -> half with the F16C-free algorithm of khub_plugin_util.h */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (e <= 0) return (uint16_t)sign; /* the test values are never this small */
    uint32_t h = sign | ((uint32_t)e << 10) | (man >> 13), rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)h;
}
static float from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u = e ? sign | ((e + 112u) << 23) | (man << 13) : sign;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------------------ */
/* One random batch, paged and dense                                        */
/* ------------------------------------------------------------------------ */

enum { MAXS = 7 };

typedef struct batch {
    int n_seqs, H, G, D, bs, window, kv_id; /* kv_id: F32, F16 or I8 */
    int32_t cu[MAXS + 1], pos0[MAXS], lens[MAXS], rows[MAXS];
    int n_blocks, stride, total_q;
    int32_t *table; /* [n_seqs rows, permuted by rows[]][stride] */
    void *kpool, *vpool;
    float *kscale, *vscale;
    float *q, *out, *ref;
    float *kd[MAXS], *vd[MAXS]; /* dense K/V per sequence [len][H][D], the values the pool holds */
} batch;

static size_t esz(int kv_id)
{
    return kv_id == KHUB_DTYPE_ID_F32 ? 4 : kv_id == KHUB_DTYPE_ID_F16 ? 2 : 1;
}

/* Stores v at (blk, h, slot, d) of a pool and returns the value it holds. */
static float pool_put(batch *b, void *pool, float *scale, int blk, int h, int slot, int d, float v)
{
    size_t at = (((size_t)blk * b->H + h) * b->bs + slot) * b->D + d;
    if (b->kv_id == KHUB_DTYPE_ID_F32) return ((float *)pool)[at] = v;
    if (b->kv_id == KHUB_DTYPE_ID_F16) {
        ((uint16_t *)pool)[at] = to_f16(v);
        return from_f16(((uint16_t *)pool)[at]);
    }
    int qv = (int)lrintf(v * 127.0f);
    ((int8_t *)pool)[at] = (int8_t)qv;
    return (float)qv * scale[blk * b->H + h];
}

static int g_max_len = 40; /* longest sequence batch_make draws */
static int g_max_q = 9;    /* most queries of a sequence batch_make draws */

static void batch_make(batch *b, int n_seqs, int H, int G, int D, int bs, int window, int kv_id)
{
    memset(b, 0, sizeof *b);
    *b = (batch){
        .n_seqs = n_seqs, .H = H, .G = G, .D = D, .bs = bs, .window = window, .kv_id = kv_id};
    int need = 0;
    for (int s = 0; s < n_seqs; s++) {
        b->lens[s] = irand(1, g_max_len);
        int nq = irand(1, b->lens[s] < g_max_q ? b->lens[s] : g_max_q);
        b->pos0[s] = b->lens[s] - nq;
        b->cu[s + 1] = b->cu[s] + nq;
        b->stride =
            (b->lens[s] + bs - 1) / bs + 1 > b->stride ? (b->lens[s] + bs - 1) / bs + 1 : b->stride;
        need += (b->lens[s] + bs - 1) / bs;
        b->rows[s] = n_seqs - 1 - s; /* rows in reverse: seq_rows is honoured */
    }
    b->total_q = b->cu[n_seqs];
    b->n_blocks = need + 3; /* spare blocks hold garbage nobody may read */
    int32_t *perm = malloc((size_t)b->n_blocks * sizeof *perm);
    for (int i = 0; i < b->n_blocks; i++) perm[i] = i;
    for (int i = b->n_blocks - 1; i > 0; i--) {
        int j = irand(0, i), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    b->table = malloc((size_t)n_seqs * b->stride * sizeof *b->table);
    for (int i = 0; i < n_seqs * b->stride; i++) b->table[i] = -1;
    size_t pool = (size_t)b->n_blocks * H * bs * D;
    b->kpool = malloc(pool * esz(kv_id));
    b->vpool = malloc(pool * esz(kv_id));
    for (size_t i = 0; i < pool * esz(kv_id); i++)
        ((uint8_t *)b->kpool)[i] = ((uint8_t *)b->vpool)[i] = 0x7c; /* garbage (NaN in f16) */
    b->kscale = malloc((size_t)b->n_blocks * H * sizeof(float));
    b->vscale = malloc((size_t)b->n_blocks * H * sizeof(float));
    for (int i = 0; i < b->n_blocks * H; i++)
        b->kscale[i] = (0.5f + (float)irand(0, 8) / 8.0f) / 127.0f,
        b->vscale[i] = (0.5f + (float)irand(0, 8) / 8.0f) / 127.0f;
    int next = 0;
    for (int s = 0; s < n_seqs; s++) {
        int32_t *row = b->table + (size_t)b->rows[s] * b->stride;
        for (int k = 0; k < (b->lens[s] + bs - 1) / bs; k++) row[k] = perm[next++];
        b->kd[s] = malloc((size_t)b->lens[s] * H * D * sizeof(float));
        b->vd[s] = malloc((size_t)b->lens[s] * H * D * sizeof(float));
        for (int j = 0; j < b->lens[s]; j++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    size_t at = ((size_t)j * H + h) * D + d;
                    int blk = row[j / bs], slot = j % bs;
                    b->kd[s][at] = pool_put(b, b->kpool, b->kscale, blk, h, slot, d, frand());
                    b->vd[s][at] = pool_put(b, b->vpool, b->vscale, blk, h, slot, d, frand());
                }
    }
    free(perm);
    size_t qn = (size_t)b->total_q * H * G * D;
    b->q = malloc(qn * sizeof(float));
    b->out = malloc(qn * sizeof(float));
    b->ref = malloc(qn * sizeof(float));
    for (size_t i = 0; i < qn; i++) b->q[i] = 2.0f * frand();
}

static void batch_free(batch *b)
{
    for (int s = 0; s < b->n_seqs; s++) free(b->kd[s]), free(b->vd[s]);
    free(b->table), free(b->kpool), free(b->vpool), free(b->kscale), free(b->vscale);
    free(b->q), free(b->out), free(b->ref);
}

static khub_dtype kv_dtype(int kv_id)
{
    return kv_id == KHUB_DTYPE_ID_F32   ? KHUB_DTYPE_F32
           : kv_id == KHUB_DTYPE_ID_F16 ? KHUB_DTYPE_F16
                                        : (khub_dtype){KHUB_DL_INT, 8, 1};
}

/* The tensors and args of b, in storage of the caller's frame. */
typedef struct pa_call {
    int64_t qs[3], ps[4], ss[2];
    khub_tensor q, out, k, v, ks, vs;
    khub_paged_attention_args a;
} pa_call;

static void pa_fill(pa_call *c, batch *b)
{
    int64_t nh = (int64_t)b->H * b->G;
    c->qs[0] = b->total_q, c->qs[1] = nh, c->qs[2] = b->D;
    c->ps[0] = b->n_blocks, c->ps[1] = b->H, c->ps[2] = b->bs, c->ps[3] = b->D;
    c->ss[0] = b->n_blocks, c->ss[1] = b->H;
    khub_device cpu = {KHUB_DEVICE_CPU, 0};
    c->q = (khub_tensor){b->q, cpu, 3, KHUB_DTYPE_F32, c->qs, NULL, 0};
    c->out = (khub_tensor){b->out, cpu, 3, KHUB_DTYPE_F32, c->qs, NULL, 0};
    c->k = (khub_tensor){b->kpool, cpu, 4, kv_dtype(b->kv_id), c->ps, NULL, 0};
    c->v = (khub_tensor){b->vpool, cpu, 4, kv_dtype(b->kv_id), c->ps, NULL, 0};
    c->ks = (khub_tensor){b->kscale, cpu, 2, KHUB_DTYPE_F32, c->ss, NULL, 0};
    c->vs = (khub_tensor){b->vscale, cpu, 2, KHUB_DTYPE_F32, c->ss, NULL, 0};
    bool q8 = b->kv_id == KHUB_DTYPE_ID_I8;
    c->a = (khub_paged_attention_args){KHUB_STRUCT_INIT(khub_paged_attention_args),
                                       .layout = q8 ? KHUB_KV_LAYOUT_PAGED_HTD_Q8
                                                    : KHUB_KV_LAYOUT_PAGED_HTD,
                                       .n_seqs = b->n_seqs,
                                       .q = &c->q,
                                       .out = &c->out,
                                       .k_pool = &c->k,
                                       .v_pool = &c->v,
                                       .k_scales = q8 ? &c->ks : NULL,
                                       .v_scales = q8 ? &c->vs : NULL,
                                       .cu_seqlens_q = b->cu,
                                       .q_pos0 = b->pos0,
                                       .kv_lens = b->lens,
                                       .block_table = b->table,
                                       .seq_rows = b->rows,
                                       .block_table_stride = b->stride,
                                       .block_size = b->bs,
                                       .scale = 1.0f / sqrtf((float)b->D),
                                       .causal = 1,
                                       .window = b->window};
}

/* ref-cpu's dense attention, sequence by sequence, into b->ref. */
static void dense_ref(batch *b)
{
    const khub_op_desc *att = op_of(&g_ref, KHUB_OP_ATTENTION, "attention");
    ASSERT(att != NULL);
    khub_device cpu = {KHUB_DEVICE_CPU, 0};
    int64_t nh = (int64_t)b->H * b->G;
    for (int s = 0; s < b->n_seqs; s++) {
        int64_t nq = b->cu[s + 1] - b->cu[s];
        int64_t qs[3] = {nq, nh, b->D}, ks[3] = {b->lens[s], b->H, b->D};
        size_t off = (size_t)b->cu[s] * nh * b->D;
        khub_tensor q = {b->q + off, cpu, 3, KHUB_DTYPE_F32, qs, NULL, 0};
        khub_tensor o = {b->ref + off, cpu, 3, KHUB_DTYPE_F32, qs, NULL, 0};
        khub_tensor k = {b->kd[s], cpu, 3, KHUB_DTYPE_F32, ks, NULL, 0};
        khub_tensor v = {b->vd[s], cpu, 3, KHUB_DTYPE_F32, ks, NULL, 0};
        khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                                 .q = &q,
                                 .k = &k,
                                 .v = &v,
                                 .out = &o,
                                 .scale = 1.0f / sqrtf((float)b->D),
                                 .causal = 1,
                                 .q_pos0 = b->pos0[s],
                                 .window = b->window};
        khub__plugin_msg_clear();
        ASSERT_OK(att->run(g_ref.d.state, &a));
    }
}

static double max_abs(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

/* Runs one random batch through every plugin that serves its layout. */
static void one_case(int kv_id, int trial)
{
    int H = irand(1, 3), G = (int[]){1, 2, 3, 4}[irand(0, 3)];
    int D = (int[]){1, 5, 8, 13, 16, 33, 64}[irand(0, 6)];
    int bs = (int[]){1, 3, 4, 16}[irand(0, 3)], win = irand(0, 2) ? 0 : irand(1, 12);
    batch b;
    batch_make(&b, irand(1, MAXS), H, G, D, bs, win, kv_id);
    dense_ref(&b);
    size_t n = (size_t)b.total_q * H * G * D;
    const plug *ps[3] = {&g_ref, &g_lv[0], &g_lv[1]};
    for (int i = 0; i < 1 + g_n_lv; i++) {
        const khub_op_desc *op = op_of(ps[i], KHUB_OP_PAGED_ATTENTION, NULL);
        pa_call c;
        pa_fill(&c, &b);
        /* ref-cpu serves every layout, cpu-x86 PAGED_HTD (f32 and f16) */
        ASSERT(op != NULL);
        bool serves = op->caps->kv_layouts & KHUB_KV_LAYOUT_BIT(c.a.layout);
        ASSERT_EQ(serves, i == 0 || kv_id != KHUB_DTYPE_ID_I8);
        if (!serves) continue;
        memset(b.out, 0xff, n * sizeof(float)); /* NaN: every element must be written */
        khub__plugin_msg_clear();
        khub_status st = op->run(ps[i]->d.state, &c.a);
        if (st != KHUB_STATUS_OK) TEST_FAIL_("%s: %s", ps[i]->d.id, khub__plugin_msg());
        double e = max_abs(b.out, b.ref, n);
        if (!(e <= 2e-5))
            TEST_FAIL_("%s trial %d (kv %d, %d seqs, H %d G %d D %d bs %d window %d): max |diff| "
                       "%g",
                       ps[i]->d.id, trial, kv_id, b.n_seqs, H, G, D, bs, win, e);
    }
    batch_free(&b);
}

TEST_IMPL(paged_matches_dense)
{
    setup();
    for (int t = 0; t < 60; t++) one_case(t % 2 ? KHUB_DTYPE_ID_F16 : KHUB_DTYPE_ID_F32, t);
}

TEST_IMPL(paged_q8_scales_match_dense)
{
    setup();
    for (int t = 0; t < 20; t++) one_case(KHUB_DTYPE_ID_I8, t);
}

/* khub/cpu-avx2's (and cpu-avx512's) paged attention gives the bits of the
 * same module's dense attention, sequence by sequence: both walk tiles of 32
 * keys through kx_attn_tile.h, so a batch on the paged cache equals its solo
 * run on the dense one (docs/batching.md). Sequences of up to 150 keys
 * (several tiles), block sizes that do and do not divide 32, windows,
 * soft-capping; memcmp, no tolerance. */
static void bits_case(const plug *pl, int kv_id, int trial)
{
    int H = irand(1, 3), G = (int[]){1, 2, 3, 4}[irand(0, 3)];
    int D = (int[]){1, 5, 8, 13, 16, 33, 64}[irand(0, 6)];
    int bs = (int[]){1, 3, 7, 16, 32, 48}[irand(0, 5)], win = irand(0, 2) ? 0 : irand(1, 70);
    float cap = irand(0, 3) ? 0.0f : 0.75f;
    batch b;
    batch_make(&b, irand(1, MAXS), H, G, D, bs, win, kv_id);
    pa_call c;
    pa_fill(&c, &b);
    c.a.softcap = cap;
    size_t n = (size_t)b.total_q * H * G * D;
    ASSERT_OK(run_op(pl, KHUB_OP_PAGED_ATTENTION, &c.a));
    const khub_op_desc *att = op_of(pl, KHUB_OP_ATTENTION, NULL);
    ASSERT(att != NULL);
    khub_device cpu = {KHUB_DEVICE_CPU, 0};
    int64_t nh = (int64_t)H * G;
    memset(b.ref, 0xff, n * sizeof(float));
    for (int s = 0; s < b.n_seqs; s++) {
        int64_t nq = b.cu[s + 1] - b.cu[s];
        int64_t qs[3] = {nq, nh, D}, ks[3] = {b.lens[s], H, D};
        size_t off = (size_t)b.cu[s] * nh * D;
        khub_tensor q = {b.q + off, cpu, 3, KHUB_DTYPE_F32, qs, NULL, 0};
        khub_tensor o = {b.ref + off, cpu, 3, KHUB_DTYPE_F32, qs, NULL, 0};
        khub_tensor k = {b.kd[s], cpu, 3, KHUB_DTYPE_F32, ks, NULL, 0};
        khub_tensor v = {b.vd[s], cpu, 3, KHUB_DTYPE_F32, ks, NULL, 0};
        khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                                 .q = &q,
                                 .k = &k,
                                 .v = &v,
                                 .out = &o,
                                 .scale = c.a.scale,
                                 .causal = 1,
                                 .q_pos0 = b.pos0[s],
                                 .window = b.window,
                                 .softcap = cap};
        khub__plugin_msg_clear();
        ASSERT_OK(att->run(pl->d.state, &a));
    }
    if (memcmp(b.out, b.ref, n * sizeof(float)) != 0)
        TEST_FAIL_("%s trial %d (kv %d, %d seqs, H %d G %d D %d bs %d window %d cap %g): paged "
                   "differs from dense by up to %g",
                   pl->d.id, trial, kv_id, b.n_seqs, H, G, D, bs, win, (double)cap,
                   max_abs(b.out, b.ref, n));
    batch_free(&b);
}

TEST_IMPL(paged_bits_equal_dense_cpu_x86)
{
    setup();
    if (g_n_lv == 0) TEST_SKIP("this CPU runs no khub/cpu-x86 level");
    g_max_len = 150;
    for (int i = 0; i < g_n_lv; i++)
        for (int t = 0; t < 40; t++)
            bits_case(&g_lv[i], t % 2 ? KHUB_DTYPE_ID_F16 : KHUB_DTYPE_ID_F32, t);
    g_max_len = 40;
}

/* cpu-x86's paged attention on an f16 pool gives the bits of the same op
 * on an f32 pool holding the same values (memcmp), on both sides of
 * kx_attn_tile.h's KX_ATT_F16_DIRECT_ROWS: decode batches (1 query per
 * sequence, G 1-4: items of 1-4 rows, halves read in place) and batches of
 * up to 9 queries per sequence (items of up to 16 rows, tiles converted);
 * odd head dims, sequences of up to 150 keys, any block size, windows,
 * soft-capping. */
static void f16_bits_case(const plug *pl, int trial)
{
    int H = irand(1, 3), G = (int[]){1, 2, 3, 4}[irand(0, 3)];
    int D = (int[]){1, 5, 8, 13, 16, 33, 64, 72}[irand(0, 7)];
    int bs = (int[]){1, 3, 7, 16, 32, 48}[irand(0, 5)], win = irand(0, 2) ? 0 : irand(1, 70);
    float cap = irand(0, 3) ? 0.0f : 0.75f;
    batch b;
    batch_make(&b, irand(1, MAXS), H, G, D, bs, win, KHUB_DTYPE_ID_F16);
    size_t n = (size_t)b.total_q * H * G * D, pool = (size_t)b.n_blocks * H * bs * D;
    float *kf = malloc(pool * sizeof(float)), *vf = malloc(pool * sizeof(float));
    float *o16 = malloc(n * sizeof(float));
    for (size_t i = 0; i < pool; i++)
        kf[i] = from_f16(((uint16_t *)b.kpool)[i]), vf[i] = from_f16(((uint16_t *)b.vpool)[i]);
    pa_call c;
    pa_fill(&c, &b);
    c.a.softcap = cap;
    memset(b.out, 0xff, n * sizeof(float));
    ASSERT_OK(run_op(pl, KHUB_OP_PAGED_ATTENTION, &c.a));
    memcpy(o16, b.out, n * sizeof(float));
    c.k.data = kf, c.v.data = vf, c.k.dtype = c.v.dtype = KHUB_DTYPE_F32;
    memset(b.out, 0, n * sizeof(float));
    ASSERT_OK(run_op(pl, KHUB_OP_PAGED_ATTENTION, &c.a));
    if (memcmp(o16, b.out, n * sizeof(float)) != 0)
        TEST_FAIL_("%s trial %d (%d seqs, up to %d queries each, H %d G %d D %d bs %d window %d "
                   "cap %g): the f16 pool differs from the f32 pool by up to %g",
                   pl->d.id, trial, b.n_seqs, g_max_q, H, G, D, bs, win, (double)cap,
                   max_abs(o16, b.out, n));
    free(kf), free(vf), free(o16);
    batch_free(&b);
}

TEST_IMPL(paged_f16_bits_equal_f32_cpu_x86)
{
    setup();
    if (g_n_lv == 0) TEST_SKIP("this CPU runs no khub/cpu-x86 level");
    g_max_len = 150;
    for (int i = 0; i < g_n_lv; i++)
        for (int t = 0; t < 60; t++) {
            g_max_q = t % 2 ? 1 : 9;
            f16_bits_case(&g_lv[i], t);
        }
    g_max_len = 40, g_max_q = 9;
}

/* The comparison can fail: one key of one block changed moves the output. */
TEST_IMPL(paged_perturbation_is_detected)
{
    setup();
    batch b;
    batch_make(&b, 3, 2, 2, 8, 4, 0, KHUB_DTYPE_ID_F32);
    dense_ref(&b);
    int s = b.n_seqs - 1, last = b.lens[s] - 1;
    int blk = b.table[(size_t)b.rows[s] * b.stride + last / b.bs];
    ((float *)b.vpool)[(((size_t)blk * b.H + 0) * b.bs + last % b.bs) * b.D] += 4.0f;
    pa_call c;
    pa_fill(&c, &b);
    ASSERT_OK(run_op(&g_ref, KHUB_OP_PAGED_ATTENTION, &c.a));
    ASSERT(max_abs(b.out, b.ref, (size_t)b.total_q * b.H * b.G * b.D) > 1e-2);
    batch_free(&b);
}

TEST_IMPL(paged_attention_bad_args)
{
    setup();
    batch b;
    batch_make(&b, 2, 1, 2, 8, 4, 0, KHUB_DTYPE_ID_F32);
    pa_call c;
    pa_fill(&c, &b);
    int32_t *row = b.table + (size_t)b.rows[0] * b.stride, saved = row[0];
    row[0] = b.n_blocks; /* one past the pool */
    ASSERT_STATUS(run_op(&g_ref, KHUB_OP_PAGED_ATTENTION, &c.a), KHUB_STATUS_INVALID_ARG);
    char want[160];
    snprintf(want, sizeof want,
             "paged_attention: sequence 0: block_table entry 0 (got %d, want 0..%d", b.n_blocks,
             b.n_blocks - 1);
    ASSERT_CONTAINS(khub__plugin_msg(), want);
    row[0] = saved;
    c.a.kv_lens = (int32_t[]){b.lens[0], b.stride * b.bs + 1};
    ASSERT_STATUS(run_op(&g_ref, KHUB_OP_PAGED_ATTENTION, &c.a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__plugin_msg(), "want cu_seqlens_q ascending, q_pos0 >= 0, 0 <= kv_len");
    c.a.kv_lens = b.lens;
    c.a.layout = 9;
    ASSERT_STATUS(run_op(&g_ref, KHUB_OP_PAGED_ATTENTION, &c.a), KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(khub__plugin_msg(), "paged_attention: KV layout 9 is not served here");
    c.a.layout = KHUB_KV_LAYOUT_PAGED_HTD;
    int32_t cu_bad[3] = {0, b.cu[1], b.cu[2] + 1};
    c.a.cu_seqlens_q = cu_bad;
    ASSERT_STATUS(run_op(&g_ref, KHUB_OP_PAGED_ATTENTION, &c.a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__plugin_msg(), "paged_attention: cu_seqlens_q (got [0] = 0");
    c.a.cu_seqlens_q = b.cu;
    c.out.data = b.q; /* out aliases q */
    ASSERT_STATUS(run_op(&g_ref, KHUB_OP_PAGED_ATTENTION, &c.a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__plugin_msg(), "paged_attention: out aliases q");
    batch_free(&b);
}

/* ------------------------------------------------------------------------ */
/* The pool                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct pool {
    const khub_kv_cache_methods *m;
    void *st;
    khub_kv_cache *c;
} pool;

static pool pool_of(const khub_kv_cache_config *cfg)
{
    setup();
    const khub_op_desc *op = op_of(&g_ref, KHUB_OP_KV_CACHE, "paged_cache");
    ASSERT(op != NULL);
    pool p = {op->methods, g_ref.d.state, NULL};
    khub__plugin_msg_clear();
    ASSERT_OK(p.m->create(p.st, cfg, &p.c));
    return p;
}

static pool pool_new(int n_seqs, int64_t max_tokens, int bs, int n_blocks, uint64_t max_bytes)
{
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 2,
                                .n_kv_heads = 2,
                                .head_dim = 4,
                                .n_seqs = n_seqs,
                                .max_tokens = max_tokens,
                                .dtype = KHUB_DTYPE_F32,
                                .block_size = bs,
                                .n_blocks = n_blocks,
                                .max_bytes = max_bytes};
    return pool_of(&cfg);
}

static khub_kv_paged_view pool_view(const pool *p)
{
    khub_kv_paged_view v = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    ASSERT_OK(p->m->paged_view(p->st, p->c, 1, &v));
    return v;
}

TEST_IMPL(pool_exhaustion_is_kv_full)
{
    pool p = pool_new(3, 64, 4, 4, 0);
    khub_kv_paged_view v = pool_view(&p);
    ASSERT_EQ(v.n_blocks, 4);
    ASSERT_EQ(v.block_size, 4);
    ASSERT_EQ(v.layout, KHUB_KV_LAYOUT_PAGED_HTD);
    ASSERT_EQ(v.block_table_stride, 16);       /* 64 tokens / 4 */
    ASSERT_OK(p.m->reserve(p.st, p.c, 0, 12)); /* 3 blocks */
    khub__plugin_msg_clear();
    ASSERT_STATUS(p.m->reserve(p.st, p.c, 1, 8), KHUB_STATUS_KV_FULL);
    ASSERT_STR_EQ(khub__plugin_msg(),
                  "paged_cache.reserve: sequence 1 needs 2 more blocks of 4 tokens for 8 tokens, "
                  "the pool has 1 of 4 free (release finished sequences, or raise --num-blocks "
                  "or the KV memory budget)");
    ASSERT_EQ(pool_view(&p).n_free, 1); /* the failed reserve took nothing */
    ASSERT_EQ(pool_view(&p).block_table[1 * 16 + 0], -1);
    /* A write that needs a block the pool lacks fails the same way. */
    float kv[5 * 2 * 4] = {0};
    int64_t sh[3] = {5, 2, 4};
    khub_tensor t = {kv, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, sh, NULL, 0};
    khub_kv_write_args w = {
        KHUB_STRUCT_INIT(khub_kv_write_args), .layer = 0, .seq = 2, .pos = 0, .k = &t, .v = &t};
    khub__plugin_msg_clear();
    ASSERT_STATUS(p.m->write(p.st, p.c, &w), KHUB_STATUS_KV_FULL);
    ASSERT_CONTAINS(khub__plugin_msg(), "paged_cache.write: sequence 2 needs 2 more blocks");
    /* Past max_tokens is CONTEXT_FULL, not KV_FULL. */
    ASSERT_STATUS(p.m->reserve(p.st, p.c, 0, 65), KHUB_STATUS_CONTEXT_FULL);
    ASSERT_CONTAINS(khub__plugin_msg(), "sequence 0 needs 65 positions, max_tokens is 64");
    /* Releasing sequence 0 makes room. */
    ASSERT_OK(p.m->release(p.st, p.c, 0));
    ASSERT_OK(p.m->reserve(p.st, p.c, 1, 8));
    ASSERT_OK(p.m->write(p.st, p.c, &w));
    ASSERT_EQ(pool_view(&p).n_free, 0);
    khub__plugin_msg_clear();
    ASSERT_STATUS(p.m->view(p.st, p.c, 0, 1, 1, &t, &t), KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(khub__plugin_msg(), "paged_cache.view: a paged cache has no dense view");
    p.m->destroy(p.st, p.c);
}

/* Random reserve/release rounds: no block is ever held twice, and the pool
 * drains back to every block free. */
TEST_IMPL(pool_drains_after_release)
{
    enum { S = 5, T = 48, B = 4 };
    pool p = pool_new(S, T, B, 30, 0);
    int64_t want[S] = {0};
    for (int round = 0; round < 400; round++) {
        int s = irand(0, S - 1);
        if (irand(0, 3) == 0) {
            ASSERT_OK(p.m->release(p.st, p.c, s));
            want[s] = 0;
        } else {
            int64_t n = want[s] + irand(0, 12);
            if (n > T) n = T;
            khub_status st = p.m->reserve(p.st, p.c, s, n);
            if (st == KHUB_STATUS_OK)
                want[s] = n;
            else
                ASSERT_STATUS(st, KHUB_STATUS_KV_FULL);
        }
        khub_kv_paged_view v = pool_view(&p);
        int seen[30] = {0}, held = 0;
        for (int q = 0; q < S; q++)
            for (int k = 0; k < v.block_table_stride; k++) {
                int32_t id = v.block_table[q * v.block_table_stride + k];
                ASSERT_EQ(id >= 0, k < (want[q] + B - 1) / B); /* exactly the blocks needed */
                if (id < 0) continue;
                ASSERT(id < 30);
                ASSERT_EQ(seen[id], 0);
                seen[id] = 1, held++;
            }
        ASSERT_EQ(v.n_free + held, 30);
    }
    for (int s = 0; s < S; s++) ASSERT_OK(p.m->release(p.st, p.c, s));
    khub_kv_paged_view v = pool_view(&p);
    ASSERT_EQ(v.n_free, v.n_blocks);
    for (int i = 0; i < S * v.block_table_stride; i++) ASSERT_EQ(v.block_table[i], -1);
    p.m->destroy(p.st, p.c);
}

/* Sizing: n_blocks, else the memory budget, else every sequence at max. */
TEST_IMPL(pool_sizing)
{
    pool a = pool_new(3, 20, 8, 0, 0); /* 3 x ceil(20 / 8) */
    ASSERT_EQ(pool_view(&a).n_blocks, 9);
    a.m->destroy(a.st, a.c);
    /* one block: 2 (K, V) x 2 layers x 2 heads x 8 tokens x 4 dims x 4 bytes = 1024 */
    pool b = pool_new(3, 20, 8, 0, 5 * 1024 + 1000);
    ASSERT_EQ(pool_view(&b).n_blocks, 5);
    b.m->destroy(b.st, b.c);
    const khub_kv_cache_methods *m = b.m;
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = 2,
                                .n_kv_heads = 2,
                                .head_dim = 4,
                                .n_seqs = 1,
                                .max_tokens = 8,
                                .dtype = KHUB_DTYPE_F32,
                                .block_size = 8,
                                .max_bytes = 1000};
    khub_kv_cache *c = NULL;
    khub__plugin_msg_clear();
    ASSERT_STATUS(m->create(b.st, &cfg, &c), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__plugin_msg(),
                    "paged_cache.create: a memory budget of 1000 bytes holds no block (one block "
                    "of 8 tokens takes 1024 bytes over 2 layers");
    ASSERT(c == NULL);
}

/* memory (ABI 1.4): the whole pool is allocated at create; a token costs
 * one block slot in every layer; capacity is the pool's or max_tokens,
 * whichever is less; tokens used follow writes and release. */
TEST_IMPL(pool_memory)
{
    pool p = pool_new(3, 64, 4, 5, 0); /* 5 blocks of 4: 20 tokens < 64 */
    ASSERT(KHUB_HAS_FIELD(p.m, khub_kv_cache_methods, memory) && p.m->memory);
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    ASSERT_OK(p.m->memory(p.st, p.c, &mem));
    /* per token: 2 (K, V) x 2 layers x 2 heads x 4 dims x 4 bytes = 128 */
    ASSERT_EQ(mem.bytes_per_token, 128);
    ASSERT_EQ(mem.bytes_total, 5 * 4 * 128);
    ASSERT_EQ(mem.tokens_capacity, 20);
    ASSERT_EQ(mem.tokens_used, 0);
    float kv[6 * 2 * 4] = {0};
    int64_t sh[3] = {6, 2, 4};
    khub_tensor t = {kv, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, sh, NULL, 0};
    khub_kv_write_args w = {
        KHUB_STRUCT_INIT(khub_kv_write_args), .layer = 1, .seq = 2, .pos = 0, .k = &t, .v = &t};
    ASSERT_OK(p.m->write(p.st, p.c, &w));
    sh[0] = 3, w.seq = 0;
    ASSERT_OK(p.m->write(p.st, p.c, &w));
    ASSERT_OK(p.m->memory(p.st, p.c, &mem));
    ASSERT_EQ(mem.tokens_used, 9);
    ASSERT_EQ(mem.bytes_total, 5 * 4 * 128); /* the pool does not grow */
    ASSERT_OK(p.m->release(p.st, p.c, 2));
    ASSERT_OK(p.m->memory(p.st, p.c, &mem));
    ASSERT_EQ(mem.tokens_used, 3);
    khub__plugin_msg_clear();
    mem.struct_size = 8; /* a struct too small for the answer is refused */
    ASSERT_STATUS(p.m->memory(p.st, p.c, &mem), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__plugin_msg(), "paged_cache.memory: args.struct_size (got 8, want >= 40)");
    p.m->destroy(p.st, p.c);
    pool q = pool_new(1, 10, 4, 0, 0); /* 3 blocks: 12 tokens, max_tokens 10 */
    mem.struct_size = sizeof mem;
    ASSERT_OK(q.m->memory(q.st, q.c, &mem));
    ASSERT_EQ(mem.tokens_capacity, 10);
    q.m->destroy(q.st, q.c);
}

/* The f16 pool's write stores khub_pu_f32_to_f16's bits (round to nearest
 * even) for every value: random ones, exact ties, and in rows of their own
 * (the write converts a row of normal-range values in groups of 8 without
 * the helper, and redoes a row that holds anything else) zeros, f16
 * subnormals and what underflows to zero, the largest finite half and what
 * overflows to inf, inf and NaN; head dims with and without a tail past the
 * groups, contiguous and strided inputs (one K row per token and head).
 * An f32 pool keeps the values as they are. */
static const uint32_t f16_odd_bits[] = {
    0x00000000u, 0x80000000u, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
    0x32ffffffu, 0x3380a000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u, 0x7f800000u,
    0xff800000u, 0x7fc00001u, 0x7f812345u, 0x00000001u, 0x477fe000u, 0x38801000u,
    0x38000000u, 0xb8400000u, 0x47900000u, 0x7f7fffffu, 0x80000001u,
};

static void f16_write_case(int D, int strided, int odd)
{
    enum { H = 3, N = 5, BS = 4 };
    for (int dt = 0; dt < 2; dt++) {
        khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                    .n_layers = 1,
                                    .n_kv_heads = H,
                                    .head_dim = D,
                                    .n_seqs = 2,
                                    .max_tokens = 16,
                                    .dtype = dt ? KHUB_DTYPE_F32 : KHUB_DTYPE_F16,
                                    .block_size = BS};
        pool p = pool_of(&cfg);
        int64_t step = strided ? 3 : 1, sh[3] = {N, H, D}, bs[3] = {0};
        static float x[N * H * 64 * 3];
        for (int i = 0; i < N * H * D * 3; i++) {
            uint32_t r = rnd(), e = 127 - 14 + r % 29; /* 2^-14 .. 2^15: normal halves */
            uint32_t u = (r & 0x80000000u) | e << 23 | (rnd() & 0x7fffffu);
            if (i % 5 == 0) u = (u & 0xffffe000u) | 0x1000u; /* a tie */
            memcpy(&x[i], &u, 4);
        }
        if (odd) { /* f16_odd_bits[odd - 1] in one row of token 3, the others normal */
            int h = odd % H, at = ((3 * H + h) * D + (odd * 7) % D) * (int)step;
            memcpy(&x[at], &f16_odd_bits[odd - 1], 4);
        }
        bs[2] = step, bs[1] = step * D, bs[0] = step * D * H; /* elements */
        khub_tensor t = {x, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, sh, bs, 0};
        khub_kv_write_args w = {
            KHUB_STRUCT_INIT(khub_kv_write_args), .layer = 0, .seq = 1, .pos = 0, .k = &t, .v = &t};
        ASSERT_OK(p.m->write(p.st, p.c, &w));
        khub_kv_paged_view v = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
        ASSERT_OK(p.m->paged_view(p.st, p.c, 0, &v));
        for (int i = 0; i < N; i++)
            for (int h = 0; h < H; h++)
                for (int d = 0; d < D; d++) {
                    int32_t blk = v.block_table[1 * v.block_table_stride + i / BS];
                    int64_t at = (((int64_t)blk * H + h) * BS + i % BS) * D + d;
                    float f = x[((i * H + h) * D + d) * step];
                    for (int kv = 0; kv < 2; kv++) {
                        const khub_tensor *pt = kv ? v.v_pool : v.k_pool;
                        if (dt) {
                            ASSERT_EQ(memcmp(&((const float *)pt->data)[at], &f, 4), 0);
                            continue;
                        }
                        uint16_t got = ((const uint16_t *)pt->data)[at];
                        uint16_t want = khub_pu_f32_to_f16(f);
                        if (got != want)
                            TEST_FAIL_("D %d strided %d: token %d head %d dim %d: %#x -> %#x, "
                                       "want %#x",
                                       D, strided, i, h, d, (unsigned)khub_pu_f32_bits(f),
                                       (unsigned)got, (unsigned)want);
                    }
                }
        p.m->destroy(p.st, p.c);
    }
}

TEST_IMPL(pool_write_f16_rounds_like_the_helper)
{
    /* The helper's own bits on a few of the odd values, so the oracle is
     * pinned too. */
    ASSERT_EQ(khub_pu_f32_to_f16(65504.0f), 0x7bff);
    ASSERT_EQ(khub_pu_f32_to_f16(65520.0f), 0x7c00);
    ASSERT_EQ(khub_pu_f32_to_f16(-0.0f), 0x8000);
    ASSERT_EQ(khub_pu_f32_to_f16(0x1p-24f), 0x0001);
    ASSERT_EQ(khub_pu_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    ASSERT_EQ(khub_pu_f32_to_f16(1.0f + 0x3p-11f), 0x3c02); /* tie to even, up */
    const int dims[] = {4, 8, 20, 64, 3};
    for (int k = 0; k < 5; k++)
        for (int strided = 0; strided < 2; strided++)
            for (int odd = 0; odd <= (int)(sizeof f16_odd_bits / 4); odd++)
                f16_write_case(dims[k], strided, odd);
}

#define TEST_LIST(X) \
    X(paged_matches_dense) \
    X(paged_bits_equal_dense_cpu_x86) \
    X(paged_f16_bits_equal_f32_cpu_x86) \
    X(paged_q8_scales_match_dense) \
    X(paged_perturbation_is_detected) \
    X(paged_attention_bad_args) \
    X(pool_exhaustion_is_kv_full) \
    X(pool_drains_after_release) \
    X(pool_sizing) \
    X(pool_memory) \
    X(pool_write_f16_rounds_like_the_helper)
TEST_MAIN(TEST_LIST)
