/*
 * test_cpu_x86.c: the optimized CPU plugins (khub/cpu-avx2, khub/cpu-avx512)
 * against two oracles, under per-op NMSE bounds
 * (NMSE = sum (y - ref)^2 / sum ref^2):
 *
 *   - a double-precision scalar reference written here from each op's math,
 *     on the exact values the bytes encode (quantized weights dequantized,
 *     f16/bf16 widened);
 *   - khub/ref-cpu, run on the same inputs, when it serves the op.
 *
 * Bounds, and why:
 *   qlinear (int16 activations, the default) and qlinear_q8a (int8) vs an
 *       emulation of their own integer path (x rounded per 32-block exactly
 *       as the kernel does, the integer sums exact): 1e-9; only the order of
 *       f32 additions differs.
 *   qlinear_q8a vs the f32 math: 2e-4. Rounding x to 8 bits adds an error of
 *       variance d_x^2 / 12 per element, d_x = max|x| / 127; for Gaussian
 *       blocks of 32 (max ~ 2.1 sigma) that is NMSE ~ 2.5e-5, and the bound
 *       leaves 8x for heavier blocks. Measured values are printed.
 *   qlinear vs the f32 math: 1e-8. With d_x = max|x| / 32767 the same
 *       estimate gives ~4e-10 (256^2 times smaller); 1e-8 leaves 25x. From
 *       gemm_min_n() tokens on (kx.h KX_GEMM_MIN_N, KX_GEMM_MIN_N_K) qlinear is
 *       a dequantize + f32 GEMM, so its emulation there is the f32 math itself.
 *   qlinear_f32 (f32 activations) vs the f32 math: 1e-9.
 *   Q4_K / Q6_K (the default qlinear only): the same bounds; their weights
 *       are dequantized by tests/ref_oracle.h's published-order loops.
 *   Against khub/ref-cpu (the f32 math): each op's f32 bound, at least 1e-8.
 *   linear (f32 / f16 / bf16 weights): 1e-9; f32 sums of up to 1536 terms.
 *   attention, norms, activations: 1e-9; the vector exp is within a few ulp.
 * Each comparison is also shown to fail: a perturbed kernel input must push
 * the NMSE over the bound (perturbation_is_detected).
 *
 * The plugins are opened with dlopen and given the runtime's host table
 * (khub__runtime_host), the same table the loader hands out. A module this
 * CPU cannot run is left out (cpu-avx512.so without AVX-512); the ctest
 * entry test_cpu_x86@avx512-emu runs every check on the AVX-512 module's
 * logic anyway, as the test-only cpu-avx512-emu.so (KHUB_TEST_AVX512_EMU=1,
 * plugins/cpu-x86/kx_emu512.h).
 */
#include <dlfcn.h>
#include <float.h>
#include <stdint.h>

#include "ref_oracle.h"
#include "runtime_impl.h"
#include "runner.h"

/* ------------------------------------------------------------------------ */
/* Harness                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct plug {
    void *dl;
    const char *file; /* the module's file name */
    khub_plugin_desc d;
} plug;

static khub_runtime *g_rt;
static const khub_host_api *g_host;

static void levels_init(void);

static void setup(void)
{
    if (g_rt) return;
    khub_runtime_opts o = {KHUB_STRUCT_INIT(khub_runtime_opts), .n_threads = 2};
    ASSERT_OK(khub_runtime_new(&o, &g_rt));
    g_host = khub__runtime_host(g_rt);
    ASSERT(g_host != NULL);
    levels_init();
}

/* Opens dir/file and initialises it with host. */
static int plug_open_in(plug *p, const char *dir, const char *file, const khub_host_api *host)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    p->file = file;
    p->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!p->dl) return 0;
    khub_plugin_init_fn init = (khub_plugin_init_fn)(uintptr_t)dlsym(p->dl, KHUB_PLUGIN_ENTRY);
    ASSERT(init != NULL);
    memset(&p->d, 0, sizeof p->d);
    p->d.struct_size = sizeof p->d;
    char err[256] = "";
    khub_status st = init(host, &p->d, err, sizeof err);
    if (st != KHUB_STATUS_OK) TEST_FAIL_("init %s: %s: %s", file, khub_status_name(st), err);
    return 1;
}

static const khub_op_desc *plug_op(const plug *p, uint32_t kind)
{
    for (uint32_t i = 0; i < p->d.n_ops; i++)
        if (p->d.ops[i].kind == kind) return &p->d.ops[i];
    return NULL;
}

/* The op of kind named name (NULL: the first op of that kind). */
static const khub_op_desc *plug_op_named(const plug *p, uint32_t kind, const char *name)
{
    if (!name) return plug_op(p, kind);
    for (uint32_t i = 0; i < p->d.n_ops; i++)
        if (p->d.ops[i].kind == kind && !strcmp(p->d.ops[i].name, name)) return &p->d.ops[i];
    return NULL;
}

/* Opens plugins/<file> of the build (a built-in) and initialises it with host. */
static int plug_open(plug *p, const char *file, const khub_host_api *host)
{
    return plug_open_in(p, KHUB_PLUGIN_DIR_BUILD, file, host);
}

static khub_status plug_run(const plug *p, uint32_t kind, const void *args)
{
    const khub_op_desc *op = plug_op(p, kind);
    ASSERT(op != NULL);
    khub__plugin_msg_clear();
    return op->run(p->d.state, args);
}

/* The modules under test, one per CPU level: the built-ins cpu-avx2.so and
 * cpu-avx512.so, levels [g_level0, 2). With KHUB_TEST_AVX512_EMU=1 (the
 * ctest entry test_cpu_x86@avx512-emu) only the AVX-512 level, and as the
 * test-only cpu-avx512-emu.so of the test plugins (plugins/cpu-x86/
 * kx_emu512.h: the AVX-512 kernels' logic with its AVX-512 instructions
 * emulated by AVX2), which needs what cpu-avx2 needs; the plain entry
 * covers cpu-avx2. */
#define AVX2_NEED (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C)
static const char *level_dir[2] = {KHUB_PLUGIN_DIR_BUILD, KHUB_PLUGIN_DIR_BUILD};
static const char *level_file[2] = {"cpu-avx2.so", "cpu-avx512.so"};
static uint32_t level_need[2] = {AVX2_NEED, AVX2_NEED | KHUB_CPU_AVX512F | KHUB_CPU_AVX512VNNI};
static int g_level0;

static void levels_init(void)
{
    const char *emu = getenv("KHUB_TEST_AVX512_EMU");
    if (!emu || strcmp(emu, "1") != 0) return;
    level_dir[1] = KHUB_TEST_PLUGIN_DIR;
    level_file[1] = "cpu-avx512-emu.so";
    level_need[1] = AVX2_NEED;
    g_level0 = 1;
    fprintf(stderr, "  note: KHUB_TEST_AVX512_EMU=1: testing %s/%s\n", level_dir[1], level_file[1]);
}

static int level_open(plug *p, int l, const khub_host_api *host)
{
    return plug_open_in(p, level_dir[l], level_file[l], host);
}

/* Plugins opened on the runtime's host table, shut down at exit (before
 * LeakSanitizer's check, which was registered earlier), then the runtime. */
static khub_plugin_desc g_opened[8];
static int g_n_opened;

static void close_opened(void)
{
    for (int i = g_n_opened - 1; i >= 0; i--)
        if (g_opened[i].shutdown) g_opened[i].shutdown(g_opened[i].state);
    g_n_opened = 0;
    khub_runtime_free(g_rt);
    g_rt = NULL;
}

static void remember(const plug *p)
{
    if (g_n_opened == 0) atexit(close_opened);
    if (g_n_opened < (int)(sizeof g_opened / sizeof g_opened[0])) g_opened[g_n_opened++] = p->d;
}

/* The plugins of every level this CPU runs; returns how many. */
static int open_levels(plug out[2])
{
    setup();
    int n = 0;
    for (int l = g_level0; l < 2; l++) {
        if ((khub_cpu_features() & level_need[l]) != level_need[l]) {
            fprintf(stderr, "  note: this CPU cannot run %s\n", level_file[l]);
            continue;
        }
        if (!level_open(&out[n], l, g_host))
            TEST_FAIL_("%s was not built: %s", level_file[l], dlerror());
        remember(&out[n]);
        n++;
    }
    if (n == 0) TEST_SKIP("this CPU has no AVX2+FMA+F16C");
    return n;
}

/* ref-cpu, or NULL when it is not built or lacks the op. */
static plug g_ref;
static const plug *ref_for(uint32_t kind)
{
    static int tried;
    if (!tried) {
        tried = 1;
        if (!plug_open(&g_ref, "ref-cpu.so", g_host))
            g_ref.dl = NULL;
        else
            remember(&g_ref);
        fprintf(stderr, "  note: %s\n",
                g_ref.dl ? "also comparing with khub/ref-cpu"
                         : "ref-cpu.so not built, scalar oracle only");
    }
    if (!g_ref.dl || !plug_op(&g_ref, kind)) return NULL;
    return &g_ref;
}

/* ------------------------------------------------------------------------ */
/* Data                                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float urand(void) { return (float)(rnd() & 0xffffff) / 16777216.0f; }
static float nrand(void)
{
    float u = urand() + 1e-7f, v = urand();
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

static float f16_to_f32(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}
/* A random normal f16 of magnitude in [2^(lo-15), 2^(hi-14)). */
static uint16_t rand_f16(int lo, int hi, int allow_neg)
{
    uint16_t e = (uint16_t)(lo + (int)(rnd() % (uint32_t)(hi - lo + 1)));
    uint16_t s = allow_neg && (rnd() & 1) ? 0x8000 : 0;
    return (uint16_t)(s | (e << 10) | (rnd() & 1023));
}
/* f32 to f16, round to nearest, for normal values in f16 range. */
static uint16_t f32_to_f16(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    uint32_t s = (b >> 16) & 0x8000, e = (b >> 23) & 255, m = b & 0x7fffff;
    if (e < 113) return (uint16_t)s;
    uint32_t h = ((e - 112) << 10) | (m >> 13);
    if ((m & 0x1fff) > 0x1000 || ((m & 0x1fff) == 0x1000 && (h & 1))) h++;
    return (uint16_t)(s | h);
}

static int64_t shape_x[2], shape_w[2], shape_y[2], shape_b[1];
static khub_tensor tens(void *data, khub_dtype dt, int nd, int64_t *shape)
{
    khub_tensor t = {data, {KHUB_DEVICE_CPU, 0}, nd, dt, shape, NULL, 0};
    return t;
}

static double nmse(const float *y, const double *ref, int64_t n)
{
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        e += d * d;
        s += ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}
static double nmse_f(const float *y, const float *ref, int64_t n)
{
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - ref[i];
        e += d * d;
        s += (double)ref[i] * ref[i];
    }
    return s > 0 ? e / s : e;
}

/* ------------------------------------------------------------------------ */
/* Quantized weights                                                        */
/* ------------------------------------------------------------------------ */

static int is_kquant(int f) { return f == KHUB_QFORMAT_Q4_K || f == KHUB_QFORMAT_Q6_K; }

/* Tokens from which the default qlinear (int16 tiles) becomes the f32 GEMM:
 * plugins/cpu-x86/kx.h KX_GEMM_MIN_N and KX_GEMM_MIN_N_K.
 * qlinear_batch_invariant fails when these and kx.h disagree. */
static int64_t gemm_min_n(int f) { return is_kquant(f) ? 32 : 128; }
static size_t qblk_bytes(int f) { return (size_t)khub_qformat_block_bytes((khub_qformat)f); }
static size_t qrow_bytes(int f, int64_t in)
{
    return (size_t)khub_qformat_row_bytes((khub_qformat)f, in);
}

/* Random blocks: any byte pattern is a valid block, so codes (and the
 * k-quants' 6- and 8-bit sub-block scales) are uniform (Q8_0 includes -128)
 * and the f16 scales are random normals of either sign. */
static uint8_t *rand_qweight(int f, int64_t out, int64_t in)
{
    size_t bb = qblk_bytes(f), nb = (size_t)out * qrow_bytes(f, in) / bb;
    uint8_t *w = malloc(nb * bb);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * bb;
        for (size_t i = 0; i < bb; i++) p[i] = (uint8_t)rnd();
        uint16_t d = rand_f16(5, 9, 1), m = rand_f16(3, 8, 1);
        if (f == KHUB_QFORMAT_Q4_K) { /* d*sc reaches 63x d: keep sums in f16 range */
            d = rand_f16(1, 5, 1), m = rand_f16(1, 4, 1);
            memcpy(p + 2, &m, 2);
        }
        if (f == KHUB_QFORMAT_Q6_K) /* d*sc*(q-32) reaches 4096x d */
            d = rand_f16(1, 4, 1);
        memcpy(p + (f == KHUB_QFORMAT_Q6_K ? 208 : 0), &d, 2);
        if (f == KHUB_QFORMAT_Q4_1 || f == KHUB_QFORMAT_Q5_1) memcpy(p + 2, &m, 2);
    }
    return w;
}

/* The values of one row (from the block definitions in khub_tensor.h; the
 * k-quants by tests/ref_oracle.h's dequantizers) and each element's
 * additive term: m (Q4_1, Q5_1), -8 d (Q4_0), -16 d (Q5_0), -dmin mn
 * (Q4_K), 0 (Q8_0, Q6_K). */
static void qrow_values(int f, const uint8_t *row, int64_t in, double *val, double *off)
{
    if (is_kquant(f)) {
        float y[256];
        uint8_t z[144];
        for (int64_t b = 0; b < in / 256; b++) {
            const uint8_t *blk = row + (size_t)b * qblk_bytes(f);
            if (f == KHUB_QFORMAT_Q4_K) {
                oracle_deq_q4_k(blk, y);
                for (int i = 0; i < 256; i++) val[b * 256 + i] = y[i];
                memcpy(z, blk, 16); /* codes 0: what is left is the offset */
                memset(z + 16, 0, 128);
                oracle_deq_q4_k(z, y);
                for (int i = 0; i < 256; i++) off[b * 256 + i] = y[i];
            } else {
                oracle_deq_q6_k(blk, y);
                for (int i = 0; i < 256; i++) val[b * 256 + i] = y[i], off[b * 256 + i] = 0.0;
            }
        }
        return;
    }
    for (int64_t i = 0; i < in; i++) {
        const uint8_t *b = row + (size_t)(i / 32) * qblk_bytes(f);
        uint16_t h, hm;
        memcpy(&h, b, 2);
        memcpy(&hm, b + 2, 2);
        double d = f16_to_f32(h);
        int k = (int)(i % 32);
        int o = f == KHUB_QFORMAT_Q4_1   ? 4
                : f == KHUB_QFORMAT_Q5_0 ? 6
                : f == KHUB_QFORMAT_Q5_1 ? 8
                                         : 2;
        int q = k < 16 ? (b[o + k] & 15) : (b[o + k - 16] >> 4);
        if (f == KHUB_QFORMAT_Q5_0 || f == KHUB_QFORMAT_Q5_1) /* bit 4: bit k of qh */
            q |= ((b[o - 4 + k / 8] >> (k % 8)) & 1) << 4;
        if (f == KHUB_QFORMAT_Q8_0) {
            val[i] = d * (int8_t)b[2 + k], off[i] = 0.0;
        } else if (f == KHUB_QFORMAT_Q4_0) {
            val[i] = d * (q - 8), off[i] = -8.0 * d;
        } else if (f == KHUB_QFORMAT_Q5_0) {
            val[i] = d * (q - 16), off[i] = -16.0 * d;
        } else {
            val[i] = d * q + f16_to_f32(hm), off[i] = f16_to_f32(hm);
        }
    }
}

/* x as the kernel sees it: codes in [-levels, levels] per 32-block with the
 * kernel's f32 scale, rounded to nearest even; levels 0 = x unchanged. */
static void quant_x(const float *x, int64_t in, float levels, float *xq)
{
    if (levels == 0) {
        memcpy(xq, x, sizeof(float) * (size_t)in);
        return;
    }
    for (int64_t b = 0; b < in; b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float d = amax / levels, id = amax > 0 ? levels / amax : 0.0f;
        for (int i = 0; i < 32; i++) xq[b + i] = nearbyintf(x[b + i] * id) * d;
    }
}

typedef struct qcase {
    int fmt;
    int64_t n, in, out;
    int bias;
} qcase;

/* The qlinear ops of the plugins and how each rounds x. */
typedef struct qop {
    const char *name; /* op name */
    float levels;     /* 32767 (int16), 127 (int8), 0 (f32) */
    int exact_offset; /* the block's additive term meets the exact f32 sum of x
                       * (except Q5_0 in the default qlinear, see exact_offset) */
    double bound_f32; /* NMSE bound against the f32 math */
} qop;

static const qop qops[] = {{"qlinear", 32767.0f, 1, 1e-8},
                           {"qlinear_q8a", 127.0f, 0, 2e-4},
                           {"qlinear_f32", 0.0f, 1, 1e-9}};
static const qop *g_qop = &qops[0];

/* Whether format f's additive term meets the exact f32 sum of x in g_qop.
 * The default qlinear's Q5_0 tiles have no separate offset term: their int16
 * codes are the signed 16 (q - 16) (qlinear_q16.c q5_0_codes), so the -16 d
 * meets the rounded x like the rest of the weight, as in Q8_0. */
static int exact_offset(int f)
{
    return g_qop->exact_offset && !(g_qop == &qops[0] && f == KHUB_QFORMAT_Q5_0);
}

/* Runs one qlinear case on every level; returns the largest NMSE against
 * the f32 math (the emulation bound is asserted inside). */
static double run_qcase(const plug *lv, int nlv, qcase c, int perturb)
{
    float *x = malloc(sizeof(float) * (size_t)(c.n * c.in));
    float *xq = malloc(sizeof(float) * (size_t)(c.n * c.in));
    float *y = malloc(sizeof(float) * (size_t)(c.n * c.out));
    float *bias = malloc(sizeof(float) * (size_t)c.out);
    double *ref = malloc(sizeof(double) * (size_t)(c.n * c.out));
    double *emu = malloc(sizeof(double) * (size_t)(c.n * c.out));
    uint8_t *w = rand_qweight(c.fmt, c.out, c.in);
    size_t rb = qrow_bytes(c.fmt, c.in);
    for (int64_t i = 0; i < c.n * c.in; i++) x[i] = nrand();
    for (int64_t i = 0; i < c.out; i++) bias[i] = nrand();
    /* qlinear (int16) becomes an f32 GEMM from gemm_min_n() tokens on. */
    float levels = g_qop == &qops[0] && c.n >= gemm_min_n(c.fmt) ? 0.0f : g_qop->levels;
    for (int64_t t = 0; t < c.n; t++) quant_x(x + t * c.in, c.in, levels, xq + t * c.in);
    double *wrow = malloc(sizeof(double) * (size_t)c.in);
    double *orow = malloc(sizeof(double) * (size_t)c.in);
    for (int64_t o = 0; o < c.out; o++) {
        qrow_values(c.fmt, w + (size_t)o * rb, c.in, wrow, orow);
        if (!exact_offset(c.fmt)) memset(orow, 0, sizeof(double) * (size_t)c.in);
        for (int64_t t = 0; t < c.n; t++) {
            double s = c.bias ? bias[o] : 0, e = s;
            for (int64_t i = 0; i < c.in; i++) {
                s += wrow[i] * x[t * c.in + i];
                e += (wrow[i] - orow[i]) * xq[t * c.in + i] + orow[i] * x[t * c.in + i];
            }
            ref[t * c.out + o] = s;
            emu[t * c.out + o] = e;
        }
    }
    if (perturb) w[rb / 2 + 8] ^= 0x88; /* codes in a middle block of row 0 */
    shape_x[0] = c.n, shape_x[1] = c.in, shape_w[0] = c.out, shape_w[1] = c.in;
    shape_y[0] = c.n, shape_y[1] = c.out, shape_b[0] = c.out;
    khub_tensor tx = tens(x, KHUB_DTYPE_F32, 2, shape_x);
    khub_tensor tw = tens(w, KHUB_DTYPE_Q(c.fmt), 2, shape_w);
    khub_tensor ty = tens(y, KHUB_DTYPE_F32, 2, shape_y);
    khub_tensor tb = tens(bias, KHUB_DTYPE_F32, 1, shape_b);
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), .x = &tx, .weight = &tw,
                          .bias = c.bias ? &tb : NULL, .y = &ty};
    double worst = 0, worst_emu = 0;
    for (int l = 0; l < nlv; l++) {
        memset(y, 0xff, sizeof(float) * (size_t)(c.n * c.out)); /* NaN: unwritten shows */
        const khub_op_desc *op = plug_op_named(&lv[l], KHUB_OP_QLINEAR, g_qop->name);
        if (!op) TEST_FAIL_("%s has no op %s", lv[l].d.id, g_qop->name);
        khub__plugin_msg_clear();
        ASSERT_OK(op->run(lv[l].d.state, &a));
        double e = nmse(y, ref, c.n * c.out), em = nmse(y, emu, c.n * c.out);
        worst = e > worst ? e : worst;
        worst_emu = em > worst_emu ? em : worst_emu;
        if (!perturb) ASSERT_LE(em, 1e-9);
    }
    const plug *rp = ref_for(KHUB_OP_QLINEAR);
    if (rp && !perturb) {
        float *yr = malloc(sizeof(float) * (size_t)(c.n * c.out));
        khub_tensor tyr = tens(yr, KHUB_DTYPE_F32, 2, shape_y);
        a.y = &tyr;
        ASSERT_OK(plug_run(rp, KHUB_OP_QLINEAR, &a));
        a.y = &ty;
        ASSERT_LE(nmse_f(y, yr, c.n * c.out), g_qop->bound_f32 > 1e-8 ? g_qop->bound_f32 : 1e-8);
        free(yr);
    }
    if (!perturb)
        fprintf(stderr, "  %s fmt %d n %lld %lld->%lld: nmse vs f32 %.2e, vs emulation %.2e\n",
                g_qop->name, c.fmt, (long long)c.n, (long long)c.in, (long long)c.out, worst,
                worst_emu);
    free(x), free(xq), free(y), free(bias), free(ref), free(emu), free(w), free(wrow), free(orow);
    return perturb ? worst_emu : worst;
}

/* SmolLM2-135M: hidden 576, KV 192, FFN 1536, vocab 49152; odd rows. */
static const qcase shapes_block[] = {
    {0, 1, 576, 576, 0},   {0, 1, 576, 192, 1},   {0, 1, 576, 1536, 0},  {0, 1, 1536, 576, 0},
    {0, 1, 576, 49152, 0}, {0, 3, 576, 193, 1},   {0, 17, 64, 7, 0},     {0, 5, 32, 1, 1},
    {0, 512, 576, 192, 0}, {0, 512, 1536, 65, 1}, {0, 16, 576, 1536, 1}, {0, 47, 576, 65, 1},
    {0, 48, 576, 193, 0},
};
/* Q4_K and Q6_K rows are whole 256-blocks: SmolLM2-135M's FFN down
 * projection (1536 -> 576) is the one matrix of a Q4_K_M SmolLM2 that has
 * them; the other widths are made up. Only the default qlinear serves them. */
static const qcase shapes_kquant[] = {
    {0, 1, 1536, 576, 0},  {0, 1, 256, 192, 1}, {0, 1, 768, 1536, 0},  {0, 1, 512, 8195, 0},
    {0, 3, 512, 193, 1},   {0, 5, 256, 1, 1},   {0, 15, 768, 9, 0},    {0, 16, 512, 65, 1},
    {0, 64, 1536, 576, 1}, {0, 17, 768, 7, 0},  {0, 512, 256, 192, 0}, {0, 31, 512, 9, 1},
    {0, 32, 512, 65, 0},
};

/* Every case of shapes (n of them) in format fmt, on the first n_ops qlinear ops. */
static void qlinear_shapes(int fmt, const qcase *shapes, size_t n, size_t n_ops)
{
    plug lv[2];
    int nlv = open_levels(lv);
    for (size_t k = 0; k < n_ops; k++) {
        g_qop = &qops[k];
        for (size_t i = 0; i < n; i++) {
            qcase c = shapes[i];
            c.fmt = fmt;
            ASSERT_LE(run_qcase(lv, nlv, c, 0), g_qop->bound_f32);
        }
    }
    g_qop = &qops[0];
}
/* Q5_0 / Q5_1: the 576-wide matrices of a Q4_K_M SmolLM2 (q, k, o, gate,
 * up); decode, a few tokens, and the prefill GEMM at 16, 17 and 64 tokens.
 * Only the default qlinear serves them. */
static const qcase shapes_q5[] = {
    {0, 1, 576, 576, 0},  {0, 1, 576, 192, 1}, {0, 1, 576, 1536, 0}, {0, 3, 576, 193, 1},
    {0, 16, 576, 65, 1},  {0, 17, 64, 7, 0},   {0, 64, 576, 192, 1}, {0, 5, 32, 1, 1},
    {0, 1, 1536, 576, 0}, {0, 3, 96, 9, 0},
};
#define BLOCK_SHAPES  shapes_block, sizeof shapes_block / sizeof shapes_block[0], 3
#define KQUANT_SHAPES shapes_kquant, sizeof shapes_kquant / sizeof shapes_kquant[0], 1
#define Q5_SHAPES     shapes_q5, sizeof shapes_q5 / sizeof shapes_q5[0], 1

TEST_IMPL(qlinear_q4_1) { qlinear_shapes(KHUB_QFORMAT_Q4_1, BLOCK_SHAPES); }
TEST_IMPL(qlinear_q8_0) { qlinear_shapes(KHUB_QFORMAT_Q8_0, BLOCK_SHAPES); }
TEST_IMPL(qlinear_q4_0) { qlinear_shapes(KHUB_QFORMAT_Q4_0, BLOCK_SHAPES); }
TEST_IMPL(qlinear_q4_k) { qlinear_shapes(KHUB_QFORMAT_Q4_K, KQUANT_SHAPES); }
TEST_IMPL(qlinear_q6_k) { qlinear_shapes(KHUB_QFORMAT_Q6_K, KQUANT_SHAPES); }
TEST_IMPL(qlinear_q5_0) { qlinear_shapes(KHUB_QFORMAT_Q5_0, Q5_SHAPES); }
TEST_IMPL(qlinear_q5_1) { qlinear_shapes(KHUB_QFORMAT_Q5_1, Q5_SHAPES); }

/* One call of the default qlinear on rows [t0, t0 + n) of x into y. */
static void qlinear_rows(const plug *p, int f, const uint8_t *w, int64_t in, int64_t out,
                         const float *x, int64_t t0, int64_t n, float *y)
{
    int64_t sx[2] = {n, in}, sw[2] = {out, in}, sy[2] = {n, out};
    khub_tensor tx = tens((void *)(x + t0 * in), KHUB_DTYPE_F32, 2, sx);
    khub_tensor tw = tens((void *)w, KHUB_DTYPE_Q(f), 2, sw);
    khub_tensor ty = tens(y, KHUB_DTYPE_F32, 2, sy);
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), .x = &tx, .weight = &tw, .y = &ty};
    ASSERT_OK(plug_run(p, KHUB_OP_QLINEAR, &a));
}

/* Every token of qlinear_rows(x, t0, n) equals its one-token result. */
static int tokens_match_alone(const plug *p, int f, const uint8_t *w, int64_t in, int64_t out,
                              const float *x, int64_t t0, int64_t n)
{
    float *all = malloc(sizeof(float) * (size_t)(n * out)),
          *one = malloc(sizeof(float) * (size_t)out);
    int same = 1;
    qlinear_rows(p, f, w, in, out, x, t0, n, all);
    for (int64_t t = 0; t < n && same; t++) {
        qlinear_rows(p, f, w, in, out, x, t0 + t, 1, one);
        if (memcmp(one, all + t * out, sizeof(float) * (size_t)out) != 0) {
            fprintf(stderr,
                    "%s format %d in %lld: token %lld alone differs from it in a call of "
                    "%lld tokens from %lld\n",
                    p->d.id, f, (long long)in, (long long)(t0 + t), (long long)n, (long long)t0);
            same = 0;
        }
    }
    free(all), free(one);
    return same;
}

/* Batch invariance (continuous batching mixes sequences in one call): below
 * gemm_min_n() tokens (127 for the 32-blocks, 31 for the k-quants), every
 * token of a call gets bit for bit what it gets alone or in any other group,
 * for every format, with the runtime's two threads splitting the rows. The
 * call sizes cover the 4 x KX_TC tiles (2 tokens) and the batch tiles of
 * every group size, 1 to KX_TB tokens, from KX_BATCH_MIN_N = 3 (kx.h: calls
 * of 3, 8, 9, 10, 12, 13, 14, 17 and 127 tokens end in groups of 3, 8, 1,
 * 2, 4, 5, 6, 1 and 7), and the 32-block formats run with an even (576) and an odd
 * (608) number of blocks per row, whose last block the tiles treat alone.
 * From gemm_min_n() tokens on the call is a prefill GEMM in f32 (qgemm.c),
 * which rounds differently: shown here, so that the comparison is known to
 * see a difference when there is one. */
TEST_IMPL(qlinear_batch_invariant)
{
    plug lv[2];
    int nlv = open_levels(lv);
    const int fmts[] = {KHUB_QFORMAT_Q4_0, KHUB_QFORMAT_Q4_1, KHUB_QFORMAT_Q5_0, KHUB_QFORMAT_Q5_1,
                        KHUB_QFORMAT_Q8_0, KHUB_QFORMAT_Q4_K, KHUB_QFORMAT_Q6_K};
    const int64_t out = 193;
    for (size_t k = 0; k < 2 * sizeof fmts / sizeof fmts[0]; k++) {
        int f = fmts[k / 2];
        if (is_kquant(f) && k % 2) continue; /* whole 256-blocks only */
        const int64_t n = gemm_min_n(f);
        int64_t in = is_kquant(f) ? 512 : k % 2 ? 608 : 576;
        uint8_t *w = rand_qweight(f, out, in);
        float *x = malloc(sizeof(float) * (size_t)(n * in));
        float *all = malloc(sizeof(float) * (size_t)(n * out));
        float *one = malloc(sizeof(float) * (size_t)out);
        for (int64_t i = 0; i < n * in; i++) x[i] = nrand() * (i % 97 == 0 ? 40.0f : 1.0f);
        for (int l = 0; l < nlv; l++) {
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 0, n - 1));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 4, 2));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 4, 3));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 1, 8));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 5, 9));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 0, 10));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 2, 12));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 3, 13));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 6, 14));
            ASSERT(tokens_match_alone(&lv[l], f, w, in, out, x, 7, 17));
            qlinear_rows(&lv[l], f, w, in, out, x, 0, n, all); /* the GEMM */
            qlinear_rows(&lv[l], f, w, in, out, x, 0, 1, one);
            ASSERT(memcmp(one, all, sizeof(float) * (size_t)out) != 0);
        }
        free(w), free(x), free(all), free(one);
    }
}

/* ------------------------------------------------------------------------ */
/* Dense linear                                                             */
/* ------------------------------------------------------------------------ */

static double run_dense(const plug *lv, int nlv, khub_dtype dt, int64_t n, int64_t in, int64_t out,
                        int perturb)
{
    int esz = dt.bits / 8;
    uint8_t *w = malloc((size_t)(out * in * esz));
    float *x = malloc(sizeof(float) * (size_t)(n * in));
    float *y = malloc(sizeof(float) * (size_t)(n * out));
    double *ref = malloc(sizeof(double) * (size_t)(n * out));
    double *wv = malloc(sizeof(double) * (size_t)(out * in));
    for (int64_t i = 0; i < out * in; i++) {
        float f = nrand() * 0.05f;
        if (dt.bits == 32) {
            memcpy(w + 4 * i, &f, 4);
            wv[i] = f;
        } else if (dt.code == KHUB_DL_FLOAT) {
            uint16_t h = f32_to_f16(f);
            memcpy(w + 2 * i, &h, 2);
            wv[i] = f16_to_f32(h);
        } else {
            uint32_t b;
            memcpy(&b, &f, 4);
            uint16_t h = (uint16_t)(b >> 16);
            memcpy(w + 2 * i, &h, 2);
            b = (uint32_t)h << 16;
            memcpy(&f, &b, 4);
            wv[i] = f;
        }
    }
    for (int64_t i = 0; i < n * in; i++) x[i] = nrand();
    for (int64_t t = 0; t < n; t++)
        for (int64_t o = 0; o < out; o++) {
            double s = 0;
            for (int64_t i = 0; i < in; i++) s += wv[o * in + i] * x[t * in + i];
            ref[t * out + o] = s;
        }
    if (perturb) x[in - 1] += 1.0f;
    shape_x[0] = n, shape_x[1] = in, shape_w[0] = out, shape_w[1] = in;
    shape_y[0] = n, shape_y[1] = out;
    khub_tensor tx = tens(x, KHUB_DTYPE_F32, 2, shape_x), tw = tens(w, dt, 2, shape_w);
    khub_tensor ty = tens(y, KHUB_DTYPE_F32, 2, shape_y);
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), .x = &tx, .weight = &tw, .y = &ty};
    double worst = 0;
    for (int l = 0; l < nlv; l++) {
        ASSERT_OK(plug_run(&lv[l], KHUB_OP_LINEAR, &a));
        double e = nmse(y, ref, n * out);
        worst = e > worst ? e : worst;
    }
    const plug *rp = ref_for(KHUB_OP_LINEAR);
    if (rp && !perturb) {
        float *yr = malloc(sizeof(float) * (size_t)(n * out));
        khub_tensor tyr = tens(yr, KHUB_DTYPE_F32, 2, shape_y);
        a.y = &tyr;
        ASSERT_OK(plug_run(rp, KHUB_OP_LINEAR, &a));
        ASSERT_LE(nmse_f(y, yr, n * out), 1e-9);
        free(yr);
    }
    free(w), free(x), free(y), free(ref), free(wv);
    return worst;
}

TEST_IMPL(linear_dense)
{
    plug lv[2];
    int nlv = open_levels(lv);
    const khub_dtype dts[3] = {KHUB_DTYPE_F32, KHUB_DTYPE_F16, KHUB_DTYPE_BF16};
    const int64_t shp[][3] = {{1, 576, 576},  {1, 576, 1536}, {1, 1536, 576}, {3, 576, 193},
                              {64, 576, 192}, {7, 37, 5},     {1, 3, 1}};
    for (int d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof shp / sizeof shp[0]; i++)
            ASSERT_LE(run_dense(lv, nlv, dts[d], shp[i][0], shp[i][1], shp[i][2], 0), 1e-9);
}

/* ------------------------------------------------------------------------ */
/* Attention                                                                */
/* ------------------------------------------------------------------------ */

typedef struct acase {
    int64_t n_q, n_kv, H, Hkv, hd, q_pos0, window;
    int causal, mask, f16, strided;
} acase;

static double run_acase(const plug *lv, int nlv, acase c, int perturb)
{
    const int64_t G = c.H / c.Hkv;
    /* K/V as a cache view: token stride leaves room for 2 extra heads. */
    int64_t st_t = c.strided ? (c.Hkv + 2) * c.hd : c.Hkv * c.hd, st_h = c.hd;
    size_t kv_elems = (size_t)(c.n_kv * st_t);
    float *q = malloc(sizeof(float) * (size_t)(c.n_q * c.H * c.hd));
    float *o = malloc(sizeof(float) * (size_t)(c.n_q * c.H * c.hd));
    double *ref = calloc((size_t)(c.n_q * c.H * c.hd), sizeof(double));
    float *kf = malloc(sizeof(float) * kv_elems), *vf = malloc(sizeof(float) * kv_elems);
    uint16_t *kh = malloc(2 * kv_elems), *vh = malloc(2 * kv_elems);
    float *mask = malloc(sizeof(float) * (size_t)(c.n_q * c.n_kv));
    for (int64_t i = 0; i < c.n_q * c.H * c.hd; i++) q[i] = nrand();
    for (size_t i = 0; i < kv_elems; i++) {
        kh[i] = f32_to_f16(nrand()), vh[i] = f32_to_f16(nrand());
        kf[i] = f16_to_f32(kh[i]), vf[i] = f16_to_f32(vh[i]);
    }
    for (int64_t i = 0; i < c.n_q * c.n_kv; i++) mask[i] = (rnd() % 7 == 0) ? -INFINITY : nrand();
    float scale = 1.0f / sqrtf((float)c.hd);
    double *s = malloc(sizeof(double) * (size_t)c.n_kv);
    for (int64_t i = 0; i < c.n_q; i++)
        for (int64_t h = 0; h < c.H; h++) {
            int64_t g = h / G, pos = c.q_pos0 + i;
            double mx = -INFINITY;
            for (int64_t j = 0; j < c.n_kv; j++) {
                s[j] = -INFINITY;
                if (c.causal && j > pos) continue;
                if (c.window > 0 && pos - j >= c.window) continue;
                double d = 0;
                for (int64_t e = 0; e < c.hd; e++)
                    d += (double)q[(i * c.H + h) * c.hd + e] * kf[j * st_t + g * st_h + e];
                s[j] = d * scale + (c.mask ? mask[i * c.n_kv + j] : 0.0);
                mx = s[j] > mx ? s[j] : mx;
            }
            if (mx == -INFINITY) continue; /* no visible key: zeros */
            double l = 0;
            for (int64_t j = 0; j < c.n_kv; j++) l += (s[j] = exp(s[j] - mx));
            for (int64_t j = 0; j < c.n_kv; j++)
                for (int64_t e = 0; e < c.hd; e++)
                    ref[(i * c.H + h) * c.hd + e] += s[j] / l * vf[j * st_t + g * st_h + e];
        }
    if (perturb) {
        kf[0] += 3.0f;
        kh[0] = f32_to_f16(kf[0]);
    }
    int64_t sq[3] = {c.n_q, c.H, c.hd}, skv[3] = {c.n_kv, c.Hkv, c.hd}, sm[2] = {c.n_q, c.n_kv};
    int64_t kvst[3] = {st_t, st_h, 1};
    khub_tensor tq = tens(q, KHUB_DTYPE_F32, 3, sq), to = tens(o, KHUB_DTYPE_F32, 3, sq);
    khub_dtype kd = c.f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32;
    khub_tensor tk = tens(c.f16 ? (void *)kh : kf, kd, 3, skv);
    khub_tensor tv = tens(c.f16 ? (void *)vh : vf, kd, 3, skv);
    tk.strides = kvst, tv.strides = kvst;
    khub_tensor tm = tens(mask, KHUB_DTYPE_F32, 2, sm);
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = &tq,
                             .k = &tk,
                             .v = &tv,
                             .mask = c.mask ? &tm : NULL,
                             .out = &to,
                             .scale = scale,
                             .causal = (uint32_t)c.causal,
                             .q_pos0 = c.q_pos0,
                             .window = c.window};
    double worst = 0;
    int64_t n_out = c.n_q * c.H * c.hd;
    for (int l = 0; l < nlv; l++) {
        memset(o, 0xff, sizeof(float) * (size_t)n_out);
        ASSERT_OK(plug_run(&lv[l], KHUB_OP_ATTENTION, &a));
        double e = nmse(o, ref, n_out);
        worst = e > worst ? e : worst;
    }
    const plug *rp = ref_for(KHUB_OP_ATTENTION);
    if (rp && !perturb) {
        float *orf = malloc(sizeof(float) * (size_t)n_out);
        khub_tensor tor = tens(orf, KHUB_DTYPE_F32, 3, sq);
        a.out = &tor;
        ASSERT_OK(plug_run(rp, KHUB_OP_ATTENTION, &a));
        ASSERT_LE(nmse_f(o, orf, n_out), 1e-9);
        free(orf);
    }
    free(q), free(o), free(ref), free(kf), free(vf), free(kh), free(vh), free(mask), free(s);
    return worst;
}

TEST_IMPL(attention_shapes)
{
    plug lv[2];
    int nlv = open_levels(lv);
    const acase cases[] = {
        /* SmolLM2: 9 heads over 3 KV heads, d 64: decode at position 99, prefill */
        {1, 100, 9, 3, 64, 99, 0, 1, 0, 1, 1},
        {37, 37, 9, 3, 64, 0, 0, 1, 0, 0, 0},
        {33, 80, 9, 3, 64, 47, 0, 1, 0, 1, 1},
        /* d 128, MHA, mask, no causal */
        {5, 70, 4, 4, 128, 0, 0, 0, 1, 0, 1},
        /* sliding window, GQA 4, odd head dim (vector tail) */
        {20, 50, 8, 2, 40, 30, 9, 1, 0, 1, 1},
        {3, 9, 2, 1, 20, 6, 0, 1, 1, 0, 0},
        /* a query that sees no key (q_pos0 0, fully masked row possible) */
        {4, 4, 2, 2, 8, 0, 1, 1, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ASSERT_LE(run_acase(lv, nlv, cases[i], 0), 1e-9);
}

/* f16 K/V give the bits of f32 K/V holding the same values, memcmp, on
 * both sides of kx_attn_tile.h's KX_ATT_F16_DIRECT_ROWS (4): work items of
 * R = min(n_q, 16 / G) * G rows read the halves in place when R <= 4
 * (decode) and convert each tile into f32 first above. Odd head dims (the
 * 8-wide and scalar tails), key counts that are not a multiple of the
 * 32-key tile, and windows and masks under which some rows of an item see
 * no key of a tile (those rows must be left as they are). */
typedef struct bcase {
    int64_t n_q, n_kv, H, Hkv, hd, q_pos0, window;
    int causal, mask;
    float softcap;
} bcase;

static void attention_bits_case(const plug *lv, int nlv, bcase c)
{
    const int64_t nq = c.n_q * c.H * c.hd, nkv = c.n_kv * c.Hkv * c.hd;
    float *q = malloc(sizeof(float) * (size_t)nq);
    float *mask = malloc(sizeof(float) * (size_t)(c.n_q * c.n_kv));
    float *o16 = malloc(sizeof(float) * (size_t)nq), *o32 = malloc(sizeof(float) * (size_t)nq);
    float *kf = malloc(sizeof(float) * (size_t)nkv), *vf = malloc(sizeof(float) * (size_t)nkv);
    uint16_t *kh = malloc(2 * (size_t)nkv), *vh = malloc(2 * (size_t)nkv);
    for (int64_t i = 0; i < nq; i++) q[i] = nrand();
    for (int64_t i = 0; i < nkv; i++) {
        kh[i] = f32_to_f16(nrand()), vh[i] = f32_to_f16(nrand());
        kf[i] = f16_to_f32(kh[i]), vf[i] = f16_to_f32(vh[i]);
    }
    for (int64_t i = 0; i < c.n_q * c.n_kv; i++) mask[i] = (rnd() % 5 == 0) ? -INFINITY : nrand();
    int64_t sq[3] = {c.n_q, c.H, c.hd}, skv[3] = {c.n_kv, c.Hkv, c.hd}, sm[2] = {c.n_q, c.n_kv};
    khub_tensor tq = tens(q, KHUB_DTYPE_F32, 3, sq), tm = tens(mask, KHUB_DTYPE_F32, 2, sm);
    khub_tensor t16 = tens(o16, KHUB_DTYPE_F32, 3, sq), t32 = tens(o32, KHUB_DTYPE_F32, 3, sq);
    khub_tensor kh_t = tens(kh, KHUB_DTYPE_F16, 3, skv), vh_t = tens(vh, KHUB_DTYPE_F16, 3, skv);
    khub_tensor kf_t = tens(kf, KHUB_DTYPE_F32, 3, skv), vf_t = tens(vf, KHUB_DTYPE_F32, 3, skv);
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = &tq,
                             .mask = c.mask ? &tm : NULL,
                             .scale = 1.0f / sqrtf((float)c.hd),
                             .causal = (uint32_t)c.causal,
                             .q_pos0 = c.q_pos0,
                             .window = c.window,
                             .softcap = c.softcap};
    for (int l = 0; l < nlv; l++) {
        memset(o16, 0xff, sizeof(float) * (size_t)nq);
        memset(o32, 0, sizeof(float) * (size_t)nq);
        a.k = &kh_t, a.v = &vh_t, a.out = &t16;
        ASSERT_OK(plug_run(&lv[l], KHUB_OP_ATTENTION, &a));
        a.k = &kf_t, a.v = &vf_t, a.out = &t32;
        ASSERT_OK(plug_run(&lv[l], KHUB_OP_ATTENTION, &a));
        if (memcmp(o16, o32, sizeof(float) * (size_t)nq) != 0) {
            int64_t i = 0;
            while (!memcmp(o16 + i, o32 + i, sizeof(float))) i++;
            TEST_FAIL_("%s: n_q %lld n_kv %lld G %lld hd %lld: f16 K/V differ from f32 at element "
                       "%lld: %.9g against %.9g",
                       lv[l].file, (long long)c.n_q, (long long)c.n_kv, (long long)(c.H / c.Hkv),
                       (long long)c.hd, (long long)i, (double)o16[i], (double)o32[i]);
        }
    }
    free(q), free(mask), free(o16), free(o32), free(kf), free(vf), free(kh), free(vh);
}

TEST_IMPL(attention_f16_bits_equal_f32)
{
    plug lv[2];
    int nlv = open_levels(lv);
    const bcase cases[] = {
        /* in place (R <= 4): SmolLM2 decode (R 3), MHA decode (R 1), GQA 4 (R 4) */
        {1, 100, 9, 3, 64, 99, 0, 1, 0, 0.0f},
        {1, 45, 2, 2, 13, 44, 0, 1, 0, 0.0f},
        {1, 70, 8, 2, 33, 69, 0, 1, 1, 0.75f},
        {1, 33, 4, 1, 40, 32, 0, 1, 0, 0.0f},
        {1, 200, 2, 1, 128, 150, 0, 1, 0, 0.0f},
        /* rows of 2-3 queries; a window that leaves some rows of a tile no key */
        {2, 64, 4, 2, 24, 62, 0, 1, 1, 0.0f},
        {3, 90, 3, 3, 72, 57, 31, 1, 0, 0.0f},
        {4, 50, 2, 2, 5, 46, 0, 0, 1, 0.0f},
        /* converted (R > 4): decode with G 8 (R 8), prefill with G 3 (R 15), MHA */
        {1, 100, 8, 1, 64, 99, 0, 1, 0, 0.0f},
        {37, 77, 9, 3, 64, 40, 0, 1, 0, 0.0f},
        {5, 45, 2, 2, 20, 40, 0, 1, 1, 0.5f},
        {16, 40, 4, 4, 17, 24, 9, 1, 0, 0.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        attention_bits_case(lv, nlv, cases[i]);
}

/* ------------------------------------------------------------------------ */
/* Norm and activation                                                      */
/* ------------------------------------------------------------------------ */

static double run_norm(const plug *lv, int nlv, int type, int64_t n, int64_t dim, int residual,
                       int perturb)
{
    size_t ne = (size_t)(n * dim);
    float *x = malloc(4 * ne), *r0 = malloc(4 * ne), *r = malloc(4 * ne), *y = malloc(4 * ne);
    float *w = malloc(4 * (size_t)dim);
    double *ref = malloc(8 * ne), *rsum = malloc(8 * ne);
    for (size_t i = 0; i < ne; i++) x[i] = nrand() * 3.0f, r0[i] = nrand();
    for (int64_t i = 0; i < dim; i++) w[i] = 1.0f + 0.1f * nrand();
    for (int64_t t = 0; t < n; t++) {
        double mu = 0, ss = 0;
        for (int64_t i = 0; i < dim; i++) {
            size_t k = (size_t)(t * dim + i);
            rsum[k] = residual ? (double)(x[k] + r0[k]) : x[k];
            mu += rsum[k] / dim;
        }
        if (type == KHUB_NORM_RMS) mu = 0;
        for (int64_t i = 0; i < dim; i++) {
            double d = rsum[t * dim + i] - mu;
            ss += d * d / dim;
        }
        for (int64_t i = 0; i < dim; i++)
            ref[t * dim + i] = (rsum[t * dim + i] - mu) / sqrt(ss + 1e-5) * w[i];
    }
    if (perturb) w[0] += 0.5f;
    shape_x[0] = n, shape_x[1] = dim, shape_b[0] = dim;
    khub_tensor tx = tens(x, KHUB_DTYPE_F32, 2, shape_x), tr = tens(r, KHUB_DTYPE_F32, 2, shape_x);
    khub_tensor ty = tens(y, KHUB_DTYPE_F32, 2, shape_x), tw = tens(w, KHUB_DTYPE_F32, 1, shape_b);
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .norm_type = (uint32_t)type,
                        .eps = 1e-5f,
                        .x = &tx,
                        .residual = residual ? &tr : NULL,
                        .weight = &tw,
                        .y = &ty};
    double worst = 0;
    for (int l = 0; l < nlv; l++) {
        memcpy(r, r0, 4 * ne);
        ASSERT_OK(plug_run(&lv[l], KHUB_OP_NORM, &a));
        double e = nmse(y, ref, (int64_t)ne);
        worst = e > worst ? e : worst;
        if (residual) ASSERT_LE(nmse(r, rsum, (int64_t)ne), 1e-12);
    }
    free(x), free(r0), free(r), free(y), free(w), free(ref), free(rsum);
    return worst;
}

TEST_IMPL(norm_rms_and_layer)
{
    plug lv[2];
    int nlv = open_levels(lv);
    const int64_t shp[][2] = {{1, 576}, {7, 576}, {3, 1536}, {2, 13}, {512, 64}};
    for (size_t i = 0; i < sizeof shp / sizeof shp[0]; i++)
        for (int res = 0; res < 2; res++) {
            ASSERT_LE(run_norm(lv, nlv, KHUB_NORM_RMS, shp[i][0], shp[i][1], res, 0), 1e-9);
            ASSERT_LE(run_norm(lv, nlv, KHUB_NORM_LAYER, shp[i][0], shp[i][1], res, 0), 1e-9);
        }
}

static double run_act(const plug *lv, int nlv, int type, int64_t n, int64_t ff, int perturb)
{
    size_t ne = (size_t)(n * ff);
    float *g = malloc(4 * ne), *u = malloc(4 * ne), *y = malloc(4 * ne);
    double *ref = malloc(8 * ne);
    for (size_t i = 0; i < ne; i++) {
        g[i] = nrand() * 4.0f, u[i] = nrand();
        if (i % 97 == 5) g[i] = (i & 1) ? 95.0f : -95.0f; /* exp clamping */
        double x = g[i];
        double t = type == KHUB_ACT_SILU ? x : 2 * 0.7978845608 * (x + 0.044715 * x * x * x);
        ref[i] = x / (1 + exp(-t)) * u[i];
    }
    if (perturb) g[1] += 1.0f;
    shape_x[0] = n, shape_x[1] = ff;
    khub_tensor tg = tens(g, KHUB_DTYPE_F32, 2, shape_x), tu = tens(u, KHUB_DTYPE_F32, 2, shape_x);
    khub_tensor ty = tens(y, KHUB_DTYPE_F32, 2, shape_x);
    khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args), .act_type = (uint32_t)type,
                              .gate = &tg, .up = &tu, .y = &ty};
    double worst = 0;
    for (int l = 0; l < nlv; l++) {
        ASSERT_OK(plug_run(&lv[l], KHUB_OP_ACTIVATION, &a));
        double e = nmse(y, ref, (int64_t)ne);
        worst = e > worst ? e : worst;
    }
    free(g), free(u), free(y), free(ref);
    return worst;
}

TEST_IMPL(activation_silu_gelu)
{
    plug lv[2];
    int nlv = open_levels(lv);
    const int64_t shp[][2] = {{1, 1536}, {9, 1536}, {3, 13}, {512, 64}};
    for (size_t i = 0; i < sizeof shp / sizeof shp[0]; i++) {
        ASSERT_LE(run_act(lv, nlv, KHUB_ACT_SILU, shp[i][0], shp[i][1], 0), 1e-9);
        ASSERT_LE(run_act(lv, nlv, KHUB_ACT_GELU_TANH, shp[i][0], shp[i][1], 0), 1e-9);
    }
}

/* ------------------------------------------------------------------------ */
/* The comparisons can fail                                                 */
/* ------------------------------------------------------------------------ */

TEST_IMPL(perturbation_is_detected)
{
    plug lv[2];
    int nlv = open_levels(lv);
    qcase q = {KHUB_QFORMAT_Q4_1, 1, 576, 64, 0};
    ASSERT(run_qcase(lv, nlv, q, 1) > 1e-9);
    q.fmt = KHUB_QFORMAT_Q8_0;
    ASSERT(run_qcase(lv, nlv, q, 1) > 1e-9);
    q.n = gemm_min_n(q.fmt); /* the prefill GEMM */
    ASSERT(run_qcase(lv, nlv, q, 1) > 1e-9);
    qcase k[] = {{KHUB_QFORMAT_Q4_K, 1, 768, 64, 0},  {KHUB_QFORMAT_Q6_K, 1, 768, 64, 0},
                 {KHUB_QFORMAT_Q4_K, 32, 768, 64, 0}, {KHUB_QFORMAT_Q6_K, 32, 768, 64, 0},
                 {KHUB_QFORMAT_Q5_0, 1, 576, 64, 0},  {KHUB_QFORMAT_Q5_1, 1, 576, 64, 0},
                 {KHUB_QFORMAT_Q5_0, 48, 576, 64, 0}, {KHUB_QFORMAT_Q5_1, 48, 576, 64, 0}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) ASSERT(run_qcase(lv, nlv, k[i], 1) > 1e-9);
    ASSERT(run_dense(lv, nlv, KHUB_DTYPE_F16, 1, 64, 8, 1) > 1e-9);
    acase c = {3, 40, 4, 2, 64, 37, 0, 1, 0, 1, 1};
    ASSERT(run_acase(lv, nlv, c, 1) > 1e-9);
    ASSERT(run_norm(lv, nlv, KHUB_NORM_RMS, 2, 64, 1, 1) > 1e-9);
    ASSERT(run_act(lv, nlv, KHUB_ACT_SILU, 1, 64, 1) > 1e-9);
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* qlinear_q8a and qlinear_f32 neither claim format f nor serve it, and
 * say so with a message containing want. */
static void others_refuse(const plug *p, int f, const khub_linear_args *a, const char *want)
{
    const char *others[] = {"qlinear_q8a", "qlinear_f32"};
    for (int o = 0; o < 2; o++) {
        const khub_op_desc *op = plug_op_named(p, KHUB_OP_QLINEAR, others[o]);
        ASSERT(op != NULL);
        ASSERT(!(op->caps->dtypes & KHUB_DTYPE_BIT_Q(f)));
        khub__plugin_msg_clear();
        ASSERT_STATUS(op->run(p->d.state, a), KHUB_STATUS_UNSUPPORTED);
        ASSERT_CONTAINS(khub__plugin_msg(), want);
    }
}

/* The default qlinear claims format f, refuses rows of `bad` weights
 * (INVALID_ARG naming the width and f's block) and serves rows of `good`;
 * the other two refuse f (others_refuse). *in_x, *in_w: a's input widths. */
static void row_rule(const plug *p, int f, const khub_linear_args *a, int64_t *in_x, int64_t *in_w,
                     int64_t bad, int64_t good, const char *others_msg)
{
    static const char *const name[KHUB_QFORMAT__COUNT] = {[KHUB_QFORMAT_Q4_K] = "Q4_K",
                                                          [KHUB_QFORMAT_Q6_K] = "Q6_K",
                                                          [KHUB_QFORMAT_Q5_0] = "Q5_0",
                                                          [KHUB_QFORMAT_Q5_1] = "Q5_1"};
    char want[160];
    snprintf(want, sizeof want,
             "weight row length %lld is not a positive multiple of %lld, the %s block",
             (long long)bad, (long long)khub_qformat_block_elems((khub_qformat)f), name[f]);
    *in_x = *in_w = bad;
    khub__plugin_msg_clear();
    ASSERT_STATUS(plug_run(p, KHUB_OP_QLINEAR, a), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__plugin_msg(), want);
    *in_x = *in_w = good;
    ASSERT_OK(plug_run(p, KHUB_OP_QLINEAR, a));
    ASSERT(plug_op(p, KHUB_OP_QLINEAR)->caps->dtypes & KHUB_DTYPE_BIT_Q(f));
    others_refuse(p, f, a, others_msg);
}

TEST_IMPL(errors_name_the_problem)
{
    plug lv[2];
    int nlv = open_levels(lv);
    float x[64] = {0}, y[8];
    uint8_t w[8 * 40] = {0};
    int64_t sx[2] = {1, 64}, sw[2] = {8, 64}, sy[2] = {1, 8};
    khub_tensor tx = tens(x, KHUB_DTYPE_F32, 2, sx), ty = tens(y, KHUB_DTYPE_F32, 2, sy);
    khub_tensor tw = tens(w, KHUB_DTYPE_Q(KHUB_QFORMAT_NF4), 2, sw);
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), .x = &tx, .weight = &tw, .y = &ty};
    for (int l = 0; l < nlv; l++) {
        ASSERT_STATUS(plug_run(&lv[l], KHUB_OP_QLINEAR, &a), KHUB_STATUS_UNSUPPORTED);
        ASSERT_CONTAINS(khub__plugin_msg(), "weight format 7 (NF4) is not served");
        tw.dtype = KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_1);
        sx[1] = 32; /* x no longer matches the weight's 64 inputs */
        ASSERT_STATUS(plug_run(&lv[l], KHUB_OP_QLINEAR, &a), KHUB_STATUS_INVALID_ARG);
        ASSERT_CONTAINS(khub__plugin_msg(), "do not agree");
        sx[1] = 64, sw[1] = 48; /* not whole blocks */
        ASSERT_STATUS(plug_run(&lv[l], KHUB_OP_QLINEAR, &a), KHUB_STATUS_INVALID_ARG);
        ASSERT_CONTAINS(khub__plugin_msg(), "not a positive multiple of 32");
        sw[1] = 64, sx[0] = INT64_C(1) << 41;
        ASSERT_STATUS(plug_run(&lv[l], KHUB_OP_QLINEAR, &a), KHUB_STATUS_INVALID_ARG);
        ASSERT_CONTAINS(khub__plugin_msg(), "outside [0, 2^40]");
        sx[0] = 1;
        a.struct_size = 8;
        ASSERT_STATUS(plug_run(&lv[l], KHUB_OP_QLINEAR, &a), KHUB_STATUS_STRUCT_SIZE);
        ASSERT_CONTAINS(khub__plugin_msg(), "too small");
        a.struct_size = sizeof a;
        tw.dtype = KHUB_DTYPE_Q(KHUB_QFORMAT_NF4);
    }
    /* Q4_K / Q6_K: rows of whole 256-blocks, and only the default qlinear. */
    float xk[576] = {0}, yk[2];
    uint8_t wk[2 * 3 * 210] = {0};
    int64_t skx[2] = {1, 576}, skw[2] = {2, 576}, sky[2] = {1, 2};
    khub_tensor tkx = tens(xk, KHUB_DTYPE_F32, 2, skx), tky = tens(yk, KHUB_DTYPE_F32, 2, sky);
    khub_tensor tkw = tens(wk, KHUB_DTYPE_Q(KHUB_QFORMAT_Q4_K), 2, skw);
    khub_linear_args ka = {KHUB_STRUCT_INIT(khub_linear_args), .x = &tkx, .weight = &tkw,
                           .y = &tky};
    for (int l = 0; l < nlv; l++) {
        for (int f = KHUB_QFORMAT_Q4_K; f <= KHUB_QFORMAT_Q6_K; f++) {
            tkw.dtype = KHUB_DTYPE_Q(f);
            /* 576, SmolLM2's hidden size, is 2.25 super-blocks */
            row_rule(&lv[l], f, &ka, &skx[1], &skw[1], 576, 512,
                     "op qlinear also serves Q5_0, Q5_1, Q4_K, Q6_K");
        }
    }
    /* Q5_0 / Q5_1: rows of whole 32-blocks, and only the default qlinear. */
    uint8_t w5[8 * 24 * 2] = {0};
    int64_t s5x[2] = {1, 48}, s5w[2] = {8, 48};
    khub_tensor t5x = tens(x, KHUB_DTYPE_F32, 2, s5x);
    khub_tensor t5w = tens(w5, KHUB_DTYPE_Q(KHUB_QFORMAT_Q5_0), 2, s5w);
    khub_linear_args a5 = {KHUB_STRUCT_INIT(khub_linear_args), .x = &t5x, .weight = &t5w, .y = &ty};
    for (int l = 0; l < nlv; l++) {
        for (int f = KHUB_QFORMAT_Q5_0; f <= KHUB_QFORMAT_Q5_1; f++) {
            t5w.dtype = KHUB_DTYPE_Q(f);
            row_rule(&lv[l], f, &a5, &s5x[1], &s5w[1], 48, 64, /* 48: a block and a half */
                     f == KHUB_QFORMAT_Q5_0 ? "weight format 8 (Q5_0) is not served"
                                            : "weight format 9 (Q5_1) is not served");
        }
    }
    /* K/V head counts that do not divide */
    float q[3 * 8], k[2 * 8], o[3 * 8];
    int64_t sq[3] = {1, 3, 8}, sk[3] = {1, 2, 8};
    khub_tensor tq = tens(q, KHUB_DTYPE_F32, 3, sq), to = tens(o, KHUB_DTYPE_F32, 3, sq);
    khub_tensor tk = tens(k, KHUB_DTYPE_F32, 3, sk);
    khub_attention_args at = {KHUB_STRUCT_INIT(khub_attention_args),
                              .q = &tq,
                              .k = &tk,
                              .v = &tk,
                              .out = &to,
                              .scale = 1.0f};
    ASSERT_STATUS(plug_run(&lv[0], KHUB_OP_ATTENTION, &at), KHUB_STATUS_INVALID_ARG);
    ASSERT_CONTAINS(khub__plugin_msg(), "3 query heads over 2 KV heads");
    int64_t neg[3] = {-8, 8, 1};
    tk.strides = neg, sk[1] = 1, sq[1] = 2;
    ASSERT_STATUS(plug_run(&lv[0], KHUB_OP_ATTENTION, &at), KHUB_STATUS_UNSUPPORTED);
    ASSERT_CONTAINS(khub__plugin_msg(), "negative stride");
}

/* A host whose CPU lacks the features: score 0, every op refuses. */
static uint32_t no_features(void *ctx)
{
    (void)ctx;
    return KHUB_CPU_SSE42;
}

TEST_IMPL(refuses_without_cpu_features)
{
    setup();
    khub_host_api h = *g_host;
    h.cpu_features = no_features;
    for (int l = g_level0; l < 2; l++) {
        plug p;
        if (!level_open(&p, l, &h)) TEST_FAIL_("%s not built", level_file[l]);
        ASSERT_EQ(p.d.score(p.d.state), 0);
        const khub_op_desc *op = plug_op(&p, KHUB_OP_NORM);
        ASSERT((op->caps->cpu_features & level_need[l]) == level_need[l]);
        ASSERT(op->caps->priority > 0);
        khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args)};
        ASSERT_STATUS(plug_run(&p, KHUB_OP_NORM, &a), KHUB_STATUS_UNSUPPORTED);
        ASSERT_CONTAINS(khub__plugin_msg(), "this CPU lacks AVX2, FMA");
        p.d.shutdown(p.d.state);
    }
}

/* With the runtime's own host table, which KHUB_CPU_LEVEL masks: a level's
 * plugin scores above 0 exactly when the features khub uses cover it, and
 * otherwise refuses every call. The @x86-64 and @avx2 ctest entries run
 * this masked (tests/cpu_level.sh). */
TEST_IMPL(follows_the_runtime_features)
{
    setup();
    const char *lv = getenv("KHUB_CPU_LEVEL");
    for (int l = g_level0; l < 2; l++) {
        plug p;
        if (!level_open(&p, l, g_host)) TEST_FAIL_("%s not built", level_file[l]);
        int can = (khub_cpu_features() & level_need[l]) == level_need[l];
        fprintf(stderr, "  note: KHUB_CPU_LEVEL=%s: %s %s\n", lv ? lv : "(unset)", level_file[l],
                can ? "runs" : "refuses");
        int avx512 = (level_need[l] & KHUB_CPU_AVX512F) != 0;
        if (lv && (!strcmp(lv, "x86-64") || (!strcmp(lv, "avx2") && avx512))) ASSERT(!can);
        ASSERT_EQ(p.d.score(p.d.state) > 0, can);
        if (!can) {
            khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args)};
            ASSERT_STATUS(plug_run(&p, KHUB_OP_NORM, &a), KHUB_STATUS_UNSUPPORTED);
            ASSERT_CONTAINS(khub__plugin_msg(), "this CPU lacks AVX2, FMA");
        }
        p.d.shutdown(p.d.state);
    }
}

#define TEST_LIST(X) \
    X(qlinear_q4_1) \
    X(qlinear_q8_0) \
    X(qlinear_q4_0) \
    X(qlinear_q4_k) \
    X(qlinear_q6_k) \
    X(qlinear_q5_0) \
    X(qlinear_q5_1) \
    X(qlinear_batch_invariant) \
    X(linear_dense) \
    X(attention_shapes) \
    X(attention_f16_bits_equal_f32) \
    X(norm_rms_and_layer) \
    X(activation_silu_gelu) \
    X(perturbation_is_detected) \
    X(errors_name_the_problem) \
    X(refuses_without_cpu_features) \
    X(follows_the_runtime_features)
TEST_MAIN(TEST_LIST)
