/*
 * cmd_bench_ops.c: `khub bench-ops`, micro-benchmarks of single ops, each
 * built-in CPU plugin next to the others (ref-cpu, cpu-avx2, cpu-avx512).
 *
 * Every case prints, per plugin, the median time of one call and what it
 * means: GFLOP/s (2 * n * in * out for a linear) and GB/s of the operand
 * that must stream (the weights for a GEMV, K and V for decode attention).
 * "cold" cases cycle through enough copies of the weights (>= 256 MiB) that
 * every call reads them from DRAM, as a decoder's layers do; "hot" cases
 * reuse one copy from cache.
 *
 * The plugins are opened from --plugin-dir (default $KHUB_PLUGIN_DIR, else
 * ../plugins next to this binary) and given the runtime's host table, so the
 * thread pool is the one the executor uses.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "khub/khub_check.h"

typedef struct bplug {
    const char *file;
    void *dl;
    khub_plugin_desc d;
} bplug;

static bplug plugs[] = {{.file = "ref-cpu.so"}, {.file = "cpu-avx2.so"}, {.file = "cpu-avx512.so"}};
#define N_PLUGS (sizeof plugs / sizeof plugs[0])

/* CLOCK_MONOTONIC, or with --clock cpu the calling thread's CPU time (for a
 * shared, loaded machine; meaningful with --threads 1 only). */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static const khub_op_desc *find_op(const bplug *p, uint32_t kind)
{
    for (uint32_t i = 0; p->dl && i < p->d.n_ops; i++)
        if (p->d.ops[i].kind == kind) return &p->d.ops[i];
    return NULL;
}

static void open_plugins(const char *dir, const khub_host_api *host)
{
    for (size_t i = 0; i < N_PLUGS; i++) {
        char path[4096], err[256] = "";
        snprintf(path, sizeof path, "%s/%s", dir, plugs[i].file);
        plugs[i].dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!plugs[i].dl) continue;
        khub_plugin_init_fn init =
            (khub_plugin_init_fn)(uintptr_t)dlsym(plugs[i].dl, KHUB_PLUGIN_ENTRY);
        plugs[i].d.struct_size = sizeof plugs[i].d;
        if (!init || init(host, &plugs[i].d, err, sizeof err) != KHUB_STATUS_OK ||
            (plugs[i].d.score && plugs[i].d.score(plugs[i].d.state) == 0)) {
            const char *lvl = getenv("KHUB_CPU_LEVEL");
            fprintf(stderr, "khub bench-ops: skipping %s (%s%s%s)\n", plugs[i].file,
                    err[0] ? err : "cannot run on this CPU",
                    !err[0] && lvl && lvl[0] ? " at KHUB_CPU_LEVEL=" : "",
                    !err[0] && lvl && lvl[0] ? lvl : "");
            plugs[i].dl = NULL;
        }
    }
}

/* A case: args[c] is the argument struct for call c (c cycles over n_args
 * copies, so "cold" cases read new memory every call). */
typedef struct bcase {
    const char *name;
    uint32_t kind;
    const void **args;
    int n_args;
    double flops; /* per call */
    double bytes; /* streamed per call */
} bcase;

/* One call of a case's op for khub_time_calls: call i reads args[i % n]. */
typedef struct timed_op {
    const khub_op_desc *op;
    void *state;
    const bcase *c;
} timed_op;

static khub_status call_op(void *ud, int i)
{
    const timed_op *t = ud;
    return t->op->run(t->state, t->c->args[i % t->c->n_args]);
}

static void run_case(const bcase *c, double min_s)
{
    printf("%-44s", c->name);
    for (size_t i = 0; i < N_PLUGS; i++) {
        const khub_op_desc *op = find_op(&plugs[i], c->kind);
        if (!op) {
            printf(" | %-13s %24s", plugs[i].file, "-");
            continue;
        }
        timed_op t = {op, plugs[i].d.state, c};
        double med = 0;
        khub_status st = khub_time_calls(call_op, &t, min_s, (int)bench_clock, &med);
        if (st != KHUB_STATUS_OK) {
            printf(" | %-13s %24s", plugs[i].file, khub_status_name(st));
            continue;
        }
        printf(" | %-13s %8.1f us %5.1f GF %5.1f GB", plugs[i].file, med * 1e6,
               c->flops / med * 1e-9, c->bytes / med * 1e-9);
    }
    printf("\n");
    fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* Cases                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct lin_set {
    khub_tensor x, y, *w;
    khub_linear_args *a;
    const void **ptrs;
    int64_t sx[2], sy[2], sw[2];
    int n;
    float *xbuf, *ybuf;
    uint8_t *wbuf;
} lin_set;

static uint64_t rs = 88172645463325252u;
static uint8_t rb8(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint8_t)(rs >> 24);
}

/* Fills a weight buffer with valid bytes: random codes, small f16 scales
 * (0x2000..0x23ff ~ 0.008..0.015) in every 2-byte slot that holds one. */
static void fill_weights(uint8_t *w, size_t bytes, khub_dtype dt)
{
    for (size_t i = 0; i < bytes; i++) w[i] = rb8();
    if (dt.code == KHUB_DL_FLOAT || dt.code == KHUB_DL_BFLOAT) {
        for (size_t i = 1; i < bytes; i += 2) w[i] = (uint8_t)(0x20 | (w[i] & 0x83));
        if (dt.bits == 32)
            for (size_t i = 3; i < bytes; i += 4) w[i] = (uint8_t)(0x3c | (w[i] & 0x80));
        return;
    }
    size_t bb = (size_t)khub_qformat_block_bytes((khub_qformat)dt.bits);
    size_t nscale =
        dt.bits == KHUB_QFORMAT_Q4_1 || dt.bits == KHUB_QFORMAT_Q5_1 || dt.bits == KHUB_QFORMAT_Q4_K
            ? 2
            : 1;
    size_t at = dt.bits == KHUB_QFORMAT_Q6_K ? 208 : 0; /* Q6_K keeps d last */
    for (size_t b = 0; b + bb <= bytes; b += bb)
        for (size_t s = 0; s < nscale; s++)
            w[b + at + 2 * s + 1] = (uint8_t)(0x20 | (w[b + at + 2 * s + 1] & 3));
}

static int lin_make(lin_set *L, khub_dtype dt, int64_t n, int64_t in, int64_t out, int cold)
{
    int64_t rowb = dt.code == KHUB_DL_BLOCKQ ? khub_qformat_row_bytes((khub_qformat)dt.bits, in)
                                             : in * dt.bits / 8;
    size_t wbytes = (size_t)(rowb * out);
    L->n = cold ? (int)((256u << 20) / wbytes + 1) : 1;
    L->sx[0] = n, L->sx[1] = in, L->sy[0] = n, L->sy[1] = out, L->sw[0] = out, L->sw[1] = in;
    L->xbuf = malloc(sizeof(float) * (size_t)(n * in));
    L->ybuf = malloc(sizeof(float) * (size_t)(n * out));
    L->wbuf = malloc(wbytes * (size_t)L->n);
    L->w = calloc((size_t)L->n, sizeof *L->w);
    L->a = calloc((size_t)L->n, sizeof *L->a);
    L->ptrs = calloc((size_t)L->n, sizeof *L->ptrs);
    if (!L->xbuf || !L->ybuf || !L->wbuf || !L->w || !L->a || !L->ptrs) return -1;
    for (int64_t i = 0; i < n * in; i++) L->xbuf[i] = (float)rb8() / 128.0f - 1.0f;
    fill_weights(L->wbuf, wbytes * (size_t)L->n, dt);
    L->x = (khub_tensor){L->xbuf, {KHUB_DEVICE_CPU, 0}, 2, KHUB_DTYPE_F32, L->sx, NULL, 0};
    L->y = (khub_tensor){L->ybuf, {KHUB_DEVICE_CPU, 0}, 2, KHUB_DTYPE_F32, L->sy, NULL, 0};
    for (int i = 0; i < L->n; i++) {
        L->w[i] = (khub_tensor){
            L->wbuf + wbytes * (size_t)i, {KHUB_DEVICE_CPU, 0}, 2, dt, L->sw, NULL, 0};
        L->a[i] = (khub_linear_args){KHUB_STRUCT_INIT(khub_linear_args), .x = &L->x,
                                     .weight = &L->w[i], .y = &L->y};
        L->ptrs[i] = &L->a[i];
    }
    return 0;
}

static void lin_free(lin_set *L)
{
    free(L->xbuf), free(L->ybuf), free(L->wbuf), free(L->w), free(L->a), free(L->ptrs);
}

static void bench_linear(const char *label, khub_dtype dt, int64_t n, int64_t in, int64_t out,
                         int cold, double min_s)
{
    lin_set L;
    memset(&L, 0, sizeof L);
    if (lin_make(&L, dt, n, in, out, cold) != 0) {
        fprintf(stderr, "khub bench-ops: out of memory for %s\n", label);
        lin_free(&L);
        return;
    }
    char name[96];
    snprintf(name, sizeof name, "%s n=%lld %lldx%lld %s", label, (long long)n, (long long)out,
             (long long)in, cold ? "cold" : "hot");
    int64_t rowb = dt.code == KHUB_DL_BLOCKQ ? khub_qformat_row_bytes((khub_qformat)dt.bits, in)
                                             : in * dt.bits / 8;
    bcase c = {name,
               dt.code == KHUB_DL_BLOCKQ ? KHUB_OP_QLINEAR : KHUB_OP_LINEAR,
               L.ptrs,
               L.n,
               2.0 * (double)n * (double)in * (double)out,
               (double)(rowb * out)};
    run_case(&c, min_s);
    lin_free(&L);
}

static void bench_attention(int64_t n_q, int64_t n_kv, int f16, double min_s)
{
    const int64_t H = 9, Hkv = 3, hd = 64;
    int64_t sq[3] = {n_q, H, hd}, skv[3] = {n_kv, Hkv, hd};
    size_t kv_n = (size_t)(n_kv * Hkv * hd), esz = f16 ? 2 : 4;
    float *q = malloc(sizeof(float) * (size_t)(n_q * H * hd));
    float *o = malloc(sizeof(float) * (size_t)(n_q * H * hd));
    uint8_t *k = malloc(kv_n * esz), *v = malloc(kv_n * esz);
    if (!q || !o || !k || !v) goto done;
    for (int64_t i = 0; i < n_q * H * hd; i++) q[i] = (float)rb8() / 128.0f - 1.0f;
    fill_weights(k, kv_n * esz, f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32);
    fill_weights(v, kv_n * esz, f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32);
    khub_dtype kd = f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32;
    khub_tensor tq = {q, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, sq, NULL, 0};
    khub_tensor to = {o, {KHUB_DEVICE_CPU, 0}, 3, KHUB_DTYPE_F32, sq, NULL, 0};
    khub_tensor tk = {k, {KHUB_DEVICE_CPU, 0}, 3, kd, skv, NULL, 0};
    khub_tensor tv = {v, {KHUB_DEVICE_CPU, 0}, 3, kd, skv, NULL, 0};
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = &tq,
                             .k = &tk,
                             .v = &tv,
                             .out = &to,
                             .scale = 0.125f,
                             .causal = 1,
                             .q_pos0 = n_kv - n_q};
    const void *ptr = &a;
    /* causal: query i sees q_pos0 + i + 1 keys */
    double pairs = 0;
    for (int64_t i = 0; i < n_q; i++) pairs += (double)(n_kv - n_q + i + 1);
    char name[96];
    snprintf(name, sizeof name, "attention %s n_q=%lld n_kv=%lld 9/3x64", f16 ? "f16" : "f32",
             (long long)n_q, (long long)n_kv);
    bcase c = {name,
               KHUB_OP_ATTENTION,
               &ptr,
               1,
               4.0 * pairs * (double)(H * hd),
               2.0 * (double)(kv_n * esz)};
    run_case(&c, min_s);
done:
    free(q), free(o), free(k), free(v);
}

static void bench_pointwise(int64_t n, int64_t dim, double min_s)
{
    size_t ne = (size_t)(n * dim);
    float *x = malloc(4 * ne), *r = malloc(4 * ne), *y = malloc(4 * ne), *w = malloc(4 * ne);
    if (!x || !r || !y || !w) goto done;
    for (size_t i = 0; i < ne; i++) x[i] = r[i] = w[i] = (float)rb8() / 128.0f - 1.0f;
    int64_t s2[2] = {n, dim}, s1[1] = {dim};
    khub_tensor tx = {x, {KHUB_DEVICE_CPU, 0}, 2, KHUB_DTYPE_F32, s2, NULL, 0};
    khub_tensor tr = tx, ty = tx, tw = {w, {KHUB_DEVICE_CPU, 0}, 1, KHUB_DTYPE_F32, s1, NULL, 0};
    tr.data = r, ty.data = y;
    khub_norm_args na = {KHUB_STRUCT_INIT(khub_norm_args),
                         .norm_type = KHUB_NORM_RMS,
                         .eps = 1e-5f,
                         .x = &tx,
                         .residual = &tr,
                         .weight = &tw,
                         .y = &ty};
    khub_activation_args aa = {KHUB_STRUCT_INIT(khub_activation_args), .act_type = KHUB_ACT_SILU,
                               .gate = &tx, .up = &tr, .y = &ty};
    const void *pn = &na, *pa = &aa;
    char name[96];
    snprintf(name, sizeof name, "rms_norm+residual n=%lld d=%lld", (long long)n, (long long)dim);
    bcase cn = {name, KHUB_OP_NORM, &pn, 1, 4.0 * (double)ne, 16.0 * (double)ne};
    run_case(&cn, min_s);
    snprintf(name, sizeof name, "silu_and_mul n=%lld ff=%lld", (long long)n, (long long)dim);
    bcase ca = {name, KHUB_OP_ACTIVATION, &pa, 1, 5.0 * (double)ne, 12.0 * (double)ne};
    run_case(&ca, min_s);
done:
    free(x), free(r), free(y), free(w);
}

/* Q4_K / Q6_K rows must hold whole 256-weight super-blocks, so SmolLM2's
 * hidden size 576 cannot be an input width: its FFN down projection
 * (576 x 1536) is the real shape, and 768 (the next multiple of 256) stands
 * in for 576 in front of the other SmolLM2 output widths. */
static void bench_kquant(double min_s)
{
    static const int64_t shp[][2] = {{1536, 768}, {576, 768}, {49152, 768}, {576, 1536}};
    static const struct {
        const char *label;
        khub_qformat f;
    } fmts[] = {{"qlinear Q4_K", KHUB_QFORMAT_Q4_K}, {"qlinear Q6_K", KHUB_QFORMAT_Q6_K}};
    for (int n = 1; n <= 64; n += 63)
        for (size_t i = 0; i < sizeof shp / sizeof shp[0]; i++)
            for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
                bench_linear(fmts[f].label, KHUB_DTYPE_Q(fmts[f].f), n, shp[i][1], shp[i][0],
                             n == 1, min_s);
    /* For scale: from cache, and a 32-weight format at the same shape. */
    bench_linear("qlinear Q4_K", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_K), 1, 768, 1536, 0, min_s);
    bench_linear("qlinear Q6_K", KHUB_DTYPE_Q(KHUB_QFORMAT_Q6_K), 1, 768, 1536, 0, min_s);
    bench_linear("qlinear Q4_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_0), 1, 768, 1536, 0, min_s);
    bench_linear("qlinear Q4_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_0), 1, 768, 1536, 1, min_s);
    bench_linear("qlinear Q4_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_0), 64, 768, 1536, 0, min_s);
}

/* The 5-bit formats next to the 4-bit ones they extend, decode from memory
 * at the SmolLM2 shapes a Q4_K_M file stores as Q5_0 (out x in). */
static void bench_q5(double min_s)
{
    static const int64_t shp[][2] = {{1536, 576}, {576, 1536}, {576, 576}};
    static const struct {
        const char *label;
        khub_qformat f;
    } fmts[] = {{"qlinear Q4_0", KHUB_QFORMAT_Q4_0},
                {"qlinear Q5_0", KHUB_QFORMAT_Q5_0},
                {"qlinear Q4_1", KHUB_QFORMAT_Q4_1},
                {"qlinear Q5_1", KHUB_QFORMAT_Q5_1}};
    for (size_t i = 0; i < sizeof shp / sizeof shp[0]; i++)
        for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
            bench_linear(fmts[f].label, KHUB_DTYPE_Q(fmts[f].f), 1, shp[i][1], shp[i][0], 1, min_s);
}

/* The tied output heads of the real models (Q8_0: SmolLM2-135M 49152 x 576,
 * Gemma 3 270M 262144 x 640) and a Q8_0 layer matrix hot and cold, next to
 * Q4_1 for scale: the cases of the Q8_0 decode tile (qlinear_q16.c). */
static void bench_head(double min_s)
{
    const khub_dtype q8 = KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0);
    bench_linear("qlinear Q4_1", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), 1, 576, 1536, 1, min_s);
    bench_linear("qlinear Q8_0", q8, 1, 576, 1536, 1, min_s);
    bench_linear("qlinear Q8_0", q8, 1, 576, 1536, 0, min_s);
    bench_linear("qlinear Q8_0", q8, 1, 576, 49152, 1, min_s);
    bench_linear("qlinear Q8_0", q8, 1, 640, 262144, 1, min_s);
}

/* Batched steps (issue 13 item 8): SmolLM2-135M's Q4_1 layer matrices and
 * its Q8_0 head (out x in) at the row counts of continuous-batching steps,
 * weights in cache (a step reuses them for every row). The int16 tiles run
 * below 128 rows, the f32 GEMM from there (plugins/cpu-x86/kx.h). */
static void bench_batch(double min_s)
{
    static const int64_t shp[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
    static const int64_t ns[] = {1, 2, 4, 8, 16, 32, 47, 48, 64, 80, 96, 112, 128, 256};
    for (size_t i = 0; i < sizeof shp / sizeof shp[0]; i++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            bench_linear(shp[i][0] == 49152 ? "qlinear Q8_0" : "qlinear Q4_1",
                         KHUB_DTYPE_Q(shp[i][0] == 49152 ? KHUB_QFORMAT_Q8_0 : KHUB_QFORMAT_Q4_1),
                         ns[k], shp[i][1], shp[i][0], 0, min_s);
}

/* ------------------------------------------------------------------------ */
/* Command                                                                  */
/* ------------------------------------------------------------------------ */

static int run_bench_ops(int argc, char **argv);

static const khub_cli_cmd cmd_bench_ops = {
    "bench-ops", "micro-benchmark each op of the built-in CPU plugins",
    "usage: khub bench-ops [--threads N] [--time S] [--clock wall|cpu] [--plugin-dir DIR]\n"
    "                      [--quick | --kquant | --q5 | --head | --batch]\n"
    "\n"
    "Times single op calls of ref-cpu, cpu-avx2 and cpu-avx512 side by side and\n"
    "prints the median time per call, GFLOP/s and GB/s of the streamed operand.\n"
    "  --threads N       thread pool size (default 1)\n"
    "  --time S          seconds per plugin and case (default 0.5)\n"
    "  --clock cpu       time by this thread's CPU time instead of wall time (for a\n"
    "                    loaded machine; use with --threads 1)\n"
    "  --plugin-dir DIR  where the .so files are (default $KHUB_PLUGIN_DIR or\n"
    "                    ../plugins next to this binary)\n"
    "  --quick           only the decode GEMV cases\n"
    "  --kquant          only the Q4_K / Q6_K cases (rows of whole 256-blocks)\n"
    "  --q5              only the Q5_0 / Q5_1 decode cases, next to Q4_0 / Q4_1\n"
    "  --head            only the Q8_0 decode cases: the tied output heads of\n"
    "                    SmolLM2-135M and Gemma 3 270M, a layer matrix hot and cold\n"
    "  --batch           only qlinear at the row counts of batched steps (1 to 256\n"
    "                    tokens, SmolLM2's Q4_1 layers and Q8_0 head, hot)\n",
    run_bench_ops};

static int run_bench_ops(int argc, char **argv)
{
    if (khub_cli_wants_help(&cmd_bench_ops, argc, argv)) return 0;
    int threads = 1, quick = 0;
    double min_s = 0.5;
    const char *dir = getenv("KHUB_PLUGIN_DIR");
    char exe_dir[4096];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--time") && i + 1 < argc)
            min_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--plugin-dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--kquant"))
            quick = 2;
        else if (!strcmp(argv[i], "--q5"))
            quick = 3;
        else if (!strcmp(argv[i], "--head"))
            quick = 4;
        else if (!strcmp(argv[i], "--batch"))
            quick = 5;
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc && !strcmp(argv[i + 1], "cpu"))
            bench_clock = CLOCK_THREAD_CPUTIME_ID, i++;
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc && !strcmp(argv[i + 1], "wall"))
            i++;
        else
            return khub_cli_usage(&cmd_bench_ops, "unknown argument '%s'", argv[i]);
    }
    if (threads < 1 || threads > 256)
        return khub_cli_usage(&cmd_bench_ops, "--threads must be between 1 and 256");
    if (!(min_s > 0 && min_s <= 600))
        return khub_cli_usage(&cmd_bench_ops, "--time must be in (0, 600] seconds");
    if (bench_clock != CLOCK_MONOTONIC && threads != 1)
        return khub_cli_usage(&cmd_bench_ops, "--clock cpu measures one thread; add --threads 1");
    if (!dir) {
        ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof exe_dir - 16);
        if (n <= 0) return khub_cli_fail("bench-ops", "cannot find this binary; use --plugin-dir");
        exe_dir[n] = '\0';
        char *slash = strrchr(exe_dir, '/');
        if (slash) strcpy(slash, "/../plugins");
        dir = exe_dir;
    }
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = threads,
                           .log = khub_cli_log};
    khub_runtime *rt = NULL;
    if (khub_runtime_new(&o, &rt) != KHUB_STATUS_OK)
        return khub_cli_fail("bench-ops", "%s", khub_last_error());
    open_plugins(dir, khub_runtime_host(rt));
    printf("khub bench-ops: %d thread(s), %.2f s per plugin and case, %s clock, plugins from %s\n",
           threads, min_s, bench_clock == CLOCK_MONOTONIC ? "wall" : "thread-CPU", dir);
    if (quick == 2) {
        bench_kquant(min_s);
        goto done;
    }
    if (quick == 3) {
        bench_q5(min_s);
        goto done;
    }
    if (quick == 4) {
        bench_head(min_s);
        goto done;
    }
    if (quick == 5) {
        bench_batch(min_s);
        goto done;
    }
    bench_linear("qlinear Q4_1", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), 1, 576, 1536, 1, min_s);
    bench_linear("qlinear Q4_1", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), 1, 1536, 576, 1, min_s);
    bench_linear("qlinear Q4_1", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), 1, 576, 576, 1, min_s);
    bench_linear("qlinear Q4_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_0), 1, 576, 1536, 1, min_s);
    bench_linear("qlinear Q5_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_0), 1, 576, 1536, 1, min_s);
    bench_linear("qlinear Q5_1", KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_1), 1, 576, 1536, 1, min_s);
    bench_linear("qlinear Q8_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0), 1, 576, 1536, 1, min_s);
    bench_linear("qlinear Q8_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0), 1, 576, 49152, 1, min_s);
    bench_linear("linear f16", KHUB_DTYPE_F16, 1, 576, 1536, 1, min_s);
    bench_linear("linear f32", KHUB_DTYPE_F32, 1, 576, 1536, 1, min_s);
    bench_linear("qlinear Q4_1", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), 1, 576, 1536, 0, min_s);
    if (!quick) {
        bench_linear("qlinear Q4_1", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1), 512, 576, 1536, 0, min_s);
        bench_linear("qlinear Q4_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_0), 512, 576, 1536, 0, min_s);
        bench_linear("qlinear Q8_0", KHUB_DTYPE_Q(KHUB_QFORMAT_Q8_0), 512, 576, 1536, 0, min_s);
        bench_linear("linear f32", KHUB_DTYPE_F32, 512, 576, 1536, 0, min_s);
        bench_linear("linear f16", KHUB_DTYPE_F16, 512, 576, 1536, 0, min_s);
        bench_attention(1, 1024, 1, min_s);
        bench_attention(1, 1024, 0, min_s);
        bench_attention(512, 512, 1, min_s);
        bench_pointwise(1, 576, min_s);
        bench_pointwise(512, 1536, min_s);
    }
done:
    for (size_t i = 0; i < N_PLUGS; i++)
        if (plugs[i].dl && plugs[i].d.shutdown) plugs[i].d.shutdown(plugs[i].d.state);
    khub_runtime_free(rt);
    return 0;
}

KHUB_CLI_COMMAND(cmd_bench_ops)
