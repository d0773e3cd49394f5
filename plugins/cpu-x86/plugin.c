/*
 * plugin.c: the descriptor of khub/cpu-avx2 and khub/cpu-avx512 and the
 * checks every op call passes before a kernel runs.
 *
 * Compiled without ISA flags (see kx.h), so init, score and these checks are
 * safe on any x86-64; a run on a CPU without the module's features fails
 * with UNSUPPORTED instead of faulting. The registry already skips the ops
 * there, because caps.cpu_features names the features and score() returns 0.
 *
 * Argument tensors come from the executor or from an embedder and are
 * treated as untrusted: every shape is checked against the others, strides
 * must be non-negative with a unit innermost stride, and the furthest
 * element offset must be representable, so a kernel never computes an
 * address from an overflowed product. The buffers' real sizes cannot be
 * known here; that contract is the caller's.
 */
#include <math.h>
#include <stdio.h>

#include "../include/khub_paged_check.h"
#include "kx.h"

#if defined(KX_AVX512_EMU)
/* Test-only (kx_emu512.h): the AVX-512 kernels' logic with the AVX-512
 * instructions emulated by AVX2, so it needs what cpu-avx2 needs. Never
 * installed nor listed in plugins.json; below cpu-avx2 (10) and above
 * ref-cpu (0) and the by-name qlinear ops (1), so that it serves only where
 * a test loads it without cpu-avx2. */
#define KX_ID        "khub/cpu-avx512-emu"
#define KX_NEED      (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C)
#define KX_NEED_TEXT "AVX2, FMA and F16C"
#define KX_PRIORITY  2
#define KX_INIT      kx_avx512emu_init
#define KX_VERSION   "0.1.0+test-only-emulation"
#elif defined(KX_LEVEL_AVX512)
#define KX_ID "khub/cpu-avx512"
#define KX_NEED \
    (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C | KHUB_CPU_AVX512F | KHUB_CPU_AVX512VNNI)
#define KX_NEED_TEXT "AVX2, FMA, F16C, AVX-512 F/BW/DQ/VL and AVX-512 VNNI"
#define KX_PRIORITY  20
#define KX_INIT      kx_avx512_init
#else
#define KX_ID        "khub/cpu-avx2"
#define KX_NEED      (KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C)
#define KX_NEED_TEXT "AVX2, FMA and F16C"
#define KX_PRIORITY  10
#define KX_INIT      kx_avx2_init
#endif
#ifndef KX_VERSION
#define KX_VERSION "0.1.0"
#endif

/* Largest dimension accepted (2^40 elements, the bound khub_tensor.h uses). */
#define MAX_DIM (INT64_C(1) << 40)

#define FAIL(st, ...) KX_FAIL(s, KHUB_STATUS_##st, KX_ID " " __VA_ARGS__)

/* ------------------------------------------------------------------------ */
/* Tensor views                                                             */
/* ------------------------------------------------------------------------ */

/* A checked tensor, padded in front with size-1 dims to ND dims. */
#define ND 3
typedef struct view {
    const char *p;  /* element 0 */
    int64_t n[ND];  /* sizes */
    int64_t st[ND]; /* strides, elements */
    int dtype;      /* khub_dtype_id */
} view;

static khub_status get_view(kx_state *s, const char *op, const char *name, const khub_tensor *t,
                            int nd_min, int nd_max, view *v)
{
    if (!t) return FAIL(INVALID_ARG, "%s: %s is NULL; pass a tensor", op, name);
    if (t->device.device_type != KHUB_DEVICE_CPU)
        return FAIL(UNSUPPORTED, "%s: %s is on device type %d; this plugin runs on the CPU", op,
                    name, (int)t->device.device_type);
    if (t->ndim < nd_min || t->ndim > nd_max)
        return FAIL(INVALID_ARG, "%s: %s has %d dims, expected %d to %d", op, name, (int)t->ndim,
                    nd_min, nd_max);
    if (!t->data || !t->shape) return FAIL(INVALID_ARG, "%s: %s has no data or shape", op, name);
    v->dtype = khub_dtype_id_of(t->dtype);
    int pad = ND - t->ndim;
    int64_t run = 1;
    for (int d = ND - 1; d >= 0; d--) {
        int64_t n = d < pad ? 1 : t->shape[d - pad];
        if (n < 0 || n > MAX_DIM)
            return FAIL(INVALID_ARG, "%s: %s dim %d is %lld, outside [0, 2^40]", op, name, d - pad,
                        (long long)n);
        int64_t st = d < pad ? 0 : t->strides ? t->strides[d - pad] : run;
        if (st < 0)
            return FAIL(UNSUPPORTED, "%s: %s has negative stride %lld", op, name, (long long)st);
        v->n[d] = n;
        v->st[d] = st;
        if (!t->strides && __builtin_mul_overflow(run, n > 0 ? n : 1, &run))
            return FAIL(OVERFLOW, "%s: %s is too large", op, name);
    }
    if (v->n[ND - 1] > 1 && v->st[ND - 1] != 1)
        return FAIL(UNSUPPORTED, "%s: %s has inner stride %lld; make its rows contiguous", op, name,
                    (long long)v->st[ND - 1]);
    /* The furthest element must be addressable: sum (n-1)*st < 2^59. */
    int64_t ext = 0, term;
    for (int d = 0; d < ND; d++) {
        if (v->n[d] == 0) break;
        if (__builtin_mul_overflow(v->n[d] - 1, v->st[d], &term) ||
            __builtin_add_overflow(ext, term, &ext) || ext > (INT64_C(1) << 59))
            return FAIL(OVERFLOW, "%s: %s spans more than 2^59 elements", op, name);
    }
    v->p = (const char *)t->data + t->byte_offset;
    return KHUB_STATUS_OK;
}

static khub_status want_dtype(kx_state *s, const char *op, const char *name, const view *v, int id)
{
    if (v->dtype != id)
        return FAIL(UNSUPPORTED, "%s: %s has dtype id %d, this op takes %s", op, name, v->dtype,
                    id == KHUB_DTYPE_ID_F32 ? "f32" : "f16");
    return KHUB_STATUS_OK;
}

/* Checks a [rows, cols] f32 operand (1-D means one row). */
static khub_status get_mat(kx_state *s, const char *op, const char *name, const khub_tensor *t,
                           view *v)
{
    khub_status st = get_view(s, op, name, t, 1, 2, v);
    if (st == KHUB_STATUS_OK) st = want_dtype(s, op, name, v, KHUB_DTYPE_ID_F32);
    return st;
}

#define CHECK(expr) \
    do { \
        khub_status st_ = (expr); \
        if (st_ != KHUB_STATUS_OK) return st_; \
    } while (0)

#define ARGS_OK(a, type, last) ((a) && KHUB_HAS_FIELD((a), type, last))

static khub_status not_runnable(kx_state *s, const char *op)
{
    return FAIL(UNSUPPORTED, "%s: this CPU lacks %s; use khub/ref-cpu or khub/cpu-avx2", op,
                KX_NEED_TEXT);
}

/* ------------------------------------------------------------------------ */
/* Linear and quantized linear                                              */
/* ------------------------------------------------------------------------ */

/* Weight formats by qlinear op: the default int16-activation qlinear serves
 * Q5_0 / Q5_1 and the k-quants too (qlinear_q16.c, qlinear_q16k.c);
 * qlinear_q8a and qlinear_f32 do not (they stay the Q4_0/Q4_1/Q8_0
 * comparison paths they were written as, and refuse the others by name). */
#define FMT_BIT(f) (1u << (f))
#define FMTS_BLOCK \
    (FMT_BIT(KHUB_QFORMAT_Q4_0) | FMT_BIT(KHUB_QFORMAT_Q4_1) | FMT_BIT(KHUB_QFORMAT_Q8_0))
#define FMTS_KQUANT (FMT_BIT(KHUB_QFORMAT_Q4_K) | FMT_BIT(KHUB_QFORMAT_Q6_K))
#define FMTS_Q5     (FMT_BIT(KHUB_QFORMAT_Q5_0) | FMT_BIT(KHUB_QFORMAT_Q5_1))

static const char *qformat_name(int f)
{
    static const char *names[KHUB_QFORMAT__COUNT] = {"none", "Q8_0",     "Q4_0", "Q4_1", "Q4_K",
                                                     "Q6_K", "INT8_ROW", "NF4",  "Q5_0", "Q5_1"};
    return f > 0 && f < KHUB_QFORMAT__COUNT ? names[f] : "unknown";
}

static khub_status check_weight_q(kx_state *s, const khub_tensor *w, uint32_t fmts, kx_linear *L)
{
    const char *op = "qlinear";
    if (!w) return FAIL(INVALID_ARG, "%s: weight is NULL; pass a [out, in] tensor", op);
    if (w->device.device_type != KHUB_DEVICE_CPU || w->ndim != 2 || !w->data || !w->shape)
        return FAIL(INVALID_ARG, "%s: weight must be a 2-D CPU tensor with data", op);
    if (w->dtype.code != KHUB_DL_BLOCKQ)
        return FAIL(UNSUPPORTED, "%s: weight dtype code %d is not block-quantized; use op linear",
                    op, (int)w->dtype.code);
    int f = w->dtype.bits;
    if (f <= 0 || f >= 32 || !(fmts & FMT_BIT(f)))
        return FAIL(
            UNSUPPORTED, "%s: weight format %d (%s) is not served (%s are)", op, f, qformat_name(f),
            fmts & FMTS_KQUANT ? "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K"
                               : "Q4_0, Q4_1, Q8_0; op qlinear also serves Q5_0, Q5_1, Q4_K, Q6_K");
    L->out = w->shape[0];
    int64_t in = w->shape[1];
    if (L->out < 1 || L->out > MAX_DIM)
        return FAIL(INVALID_ARG, "%s: weight has %lld rows", op, (long long)L->out);
    int64_t rb = khub_qformat_row_bytes((khub_qformat)f, in);
    if (rb < 0)
        return FAIL(INVALID_ARG,
                    "%s: weight row length %lld is not a positive multiple of %lld, the %s "
                    "block; pad the rows or use a %s format",
                    op, (long long)in, (long long)khub_qformat_block_elems((khub_qformat)f),
                    qformat_name(f),
                    f == KHUB_QFORMAT_Q4_K || f == KHUB_QFORMAT_Q6_K
                        ? "32-weight (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)"
                        : "different");
    L->in = in;
    L->wfmt = f;
    L->w_row_bytes = (size_t)rb;
    L->w = (const uint8_t *)w->data + w->byte_offset;
    return KHUB_STATUS_OK;
}

static khub_status check_weight_dense(kx_state *s, const khub_tensor *w, kx_linear *L)
{
    view v;
    CHECK(get_view(s, "linear", "weight", w, 2, 2, &v));
    if (v.dtype != KHUB_DTYPE_ID_F32 && v.dtype != KHUB_DTYPE_ID_F16 &&
        v.dtype != KHUB_DTYPE_ID_BF16)
        return FAIL(UNSUPPORTED, "linear: weight dtype id %d is not f32, f16 or bf16", v.dtype);
    if (v.n[1] < 1 || v.n[2] < 1)
        return FAIL(INVALID_ARG, "linear: weight shape [%lld, %lld] is empty", (long long)v.n[1],
                    (long long)v.n[2]);
    L->out = v.n[1];
    L->in = v.n[2];
    L->wfmt = v.dtype;
    L->w_row_bytes = (size_t)v.st[1] * (v.dtype == KHUB_DTYPE_ID_F32 ? 4 : 2);
    L->w = (const uint8_t *)v.p;
    return KHUB_STATUS_OK;
}

/* quant: the weight formats the qlinear op serves (FMT_BIT), 0 for linear. */
static khub_status check_linear(kx_state *s, const void *args, uint32_t quant, kx_linear *L)
{
    const char *op = quant ? "qlinear" : "linear";
    const khub_linear_args *a = args;
    if (!ARGS_OK(a, khub_linear_args, y))
        return FAIL(STRUCT_SIZE, "%s: khub_linear_args is NULL or too small", op);
    if (!s->runnable) return not_runnable(s, op);
    CHECK(quant ? check_weight_q(s, a->weight, quant, L) : check_weight_dense(s, a->weight, L));
    view x, y;
    CHECK(get_mat(s, op, "x", a->x, &x));
    CHECK(get_mat(s, op, "y", a->y, &y));
    if (x.n[2] != L->in || y.n[2] != L->out || x.n[1] != y.n[1])
        return FAIL(INVALID_ARG,
                    "%s: x [%lld, %lld], weight [%lld, %lld], y [%lld, %lld] "
                    "do not agree; want x [n, in], weight [out, in], y [n, out]",
                    op, (long long)x.n[1], (long long)x.n[2], (long long)L->out, (long long)L->in,
                    (long long)y.n[1], (long long)y.n[2]);
    size_t scratch;
    if (quant && __builtin_mul_overflow((size_t)x.n[1], (size_t)(L->in / 32) * 40, &scratch))
        return FAIL(OVERFLOW, "%s: %lld tokens of %lld inputs overflow the scratch size", op,
                    (long long)x.n[1], (long long)L->in);
    L->bias = NULL;
    if (a->bias) {
        view b;
        CHECK(get_view(s, op, "bias", a->bias, 1, 1, &b));
        CHECK(want_dtype(s, op, "bias", &b, KHUB_DTYPE_ID_F32));
        if (b.n[2] != L->out)
            return FAIL(INVALID_ARG, "%s: bias has %lld entries, weight %lld rows", op,
                        (long long)b.n[2], (long long)L->out);
        L->bias = (const float *)b.p;
    }
    L->x = (const float *)x.p;
    L->ldx = x.st[1];
    L->n = x.n[1];
    L->y = (float *)y.p;
    L->ldy = y.st[1];
    return KHUB_STATUS_OK;
}

/* Three qlinear ops, by how they treat the activations x:
 *   qlinear      int16 per 32-block, integer dot products (qlinear_q16.c,
 *                qlinear_q16k.c for Q4_K / Q6_K): NMSE ~1e-9 per matmul,
 *                the default, and the only one serving Q5_0 / Q5_1 and
 *                Q4_K / Q6_K;
 *   qlinear_f32  f32 (qlinear_f32.c): exact up to summation order, slower;
 *   qlinear_q8a  int8 per 32-block (qlinear.c): ~1e-4 NMSE per matmul,
 *                enough to move greedy tokens over 30 layers.
 * The last two have priority 1 and are chosen only when asked for by name.
 * docs/performance.md has the measurements. */
static khub_status run_qlinear(void *state, const void *args)
{
    kx_state *s = state;
    kx_linear L;
    CHECK(check_linear(s, args, FMTS_BLOCK | FMTS_Q5 | FMTS_KQUANT, &L));
    return L.n == 0 ? KHUB_STATUS_OK : KX(qlinear_q16_run)(s, &L);
}

static khub_status run_qlinear_f32(void *state, const void *args)
{
    kx_state *s = state;
    kx_linear L;
    CHECK(check_linear(s, args, FMTS_BLOCK, &L));
    return L.n == 0 ? KHUB_STATUS_OK : KX(qlinear_f32_run)(s, &L);
}

static khub_status run_qlinear_q8a(void *state, const void *args)
{
    kx_state *s = state;
    kx_linear L;
    CHECK(check_linear(s, args, FMTS_BLOCK, &L));
    return L.n == 0 ? KHUB_STATUS_OK : KX(qlinear_run)(s, &L);
}

static khub_status run_linear(void *state, const void *args)
{
    kx_state *s = state;
    kx_linear L;
    CHECK(check_linear(s, args, 0, &L));
    return L.n == 0 ? KHUB_STATUS_OK : KX(linear_run)(s, &L);
}

/* ------------------------------------------------------------------------ */
/* Attention                                                                */
/* ------------------------------------------------------------------------ */

static khub_status check_attention(kx_state *s, const khub_attention_args *a, kx_attn *A)
{
    const char *op = "attention";
    view q, k, v, o;
    CHECK(get_view(s, op, "q", a->q, 3, 3, &q));
    CHECK(get_view(s, op, "k", a->k, 3, 3, &k));
    CHECK(get_view(s, op, "v", a->v, 3, 3, &v));
    CHECK(get_view(s, op, "out", a->out, 3, 3, &o));
    CHECK(want_dtype(s, op, "q", &q, KHUB_DTYPE_ID_F32));
    CHECK(want_dtype(s, op, "out", &o, KHUB_DTYPE_ID_F32));
    if (k.dtype != KHUB_DTYPE_ID_F32 && k.dtype != KHUB_DTYPE_ID_F16)
        return FAIL(UNSUPPORTED, "%s: k has dtype id %d; K/V must be f32 or f16", op, k.dtype);
    CHECK(want_dtype(s, op, "v", &v, k.dtype));
    A->n_q = q.n[0], A->n_heads = q.n[1], A->hd = q.n[2];
    A->n_kv = k.n[0], A->n_kv_heads = k.n[1];
    if (memcmp(q.n, o.n, sizeof q.n) != 0 || memcmp(k.n, v.n, sizeof k.n) != 0 || k.n[2] != A->hd)
        return FAIL(INVALID_ARG,
                    "%s: shapes disagree: want q and out [n_q, n_heads, d], "
                    "k and v [n_kv, n_kv_heads, d]",
                    op);
    if (A->hd < 1 || A->hd > 256)
        return FAIL(UNSUPPORTED, "%s: head dim %lld is outside 1..256", op, (long long)A->hd);
    if (A->n_kv_heads < 1 || A->n_heads % A->n_kv_heads != 0 || A->n_heads / A->n_kv_heads > 16)
        return FAIL(INVALID_ARG,
                    "%s: %lld query heads over %lld KV heads; need a multiple, "
                    "at most 16 per KV head",
                    op, (long long)A->n_heads, (long long)A->n_kv_heads);
    if (a->causal > 1 || a->window < 0 || a->q_pos0 < 0 || a->q_pos0 > MAX_DIM ||
        !isfinite(a->scale))
        return FAIL(INVALID_ARG,
                    "%s: causal %u, window %lld, q_pos0 %lld or scale %g out of "
                    "range",
                    op, (unsigned)a->causal, (long long)a->window, (long long)a->q_pos0,
                    (double)a->scale);
    A->mask = NULL;
    A->smask = 0;
    if (a->mask) {
        view m;
        CHECK(get_view(s, op, "mask", a->mask, 2, 2, &m));
        CHECK(want_dtype(s, op, "mask", &m, KHUB_DTYPE_ID_F32));
        if (m.n[1] != A->n_q || m.n[2] != A->n_kv)
            return FAIL(INVALID_ARG, "%s: mask is [%lld, %lld], want [n_q %lld, n_kv %lld]", op,
                        (long long)m.n[1], (long long)m.n[2], (long long)A->n_q,
                        (long long)A->n_kv);
        A->mask = (const float *)m.p;
        A->smask = m.st[1];
    }
    A->q = (const float *)q.p, A->sq_t = q.st[0], A->sq_h = q.st[1];
    A->k = k.p, A->sk_t = k.st[0], A->sk_h = k.st[1];
    A->v = v.p, A->sv_t = v.st[0], A->sv_h = v.st[1];
    A->kv_f16 = k.dtype == KHUB_DTYPE_ID_F16;
    A->out = (float *)o.p, A->so_t = o.st[0], A->so_h = o.st[1];
    A->scale = a->scale;
    A->causal = (int)a->causal;
    A->q_pos0 = a->q_pos0;
    A->window = a->window;
    A->softcap = 0.0f;
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    CHECK(khub_pu_softcap(s->host, op, a, offsetof(khub_attention_args, softcap), &A->softcap));
#endif
    return KHUB_STATUS_OK;
}

static khub_status run_attention(void *state, const void *args)
{
    kx_state *s = state;
    const khub_attention_args *a = args;
    kx_attn A;
    if (!ARGS_OK(a, khub_attention_args, window))
        return FAIL(STRUCT_SIZE, "attention: khub_attention_args is NULL or too small");
    if (!s->runnable) return not_runnable(s, "attention");
    CHECK(check_attention(s, a, &A));
    return KX(attention_run)(s, &A);
}

/* ------------------------------------------------------------------------ */
/* Norm and activation                                                      */
/* ------------------------------------------------------------------------ */

static khub_status run_norm(void *state, const void *args)
{
    kx_state *s = state;
    const khub_norm_args *a = args;
    const char *op = "rms_norm";
    if (!ARGS_OK(a, khub_norm_args, y))
        return FAIL(STRUCT_SIZE, "rms_norm: khub_norm_args is NULL or too small");
    if (!s->runnable) return not_runnable(s, op);
    if (a->norm_type != KHUB_NORM_RMS && a->norm_type != KHUB_NORM_LAYER)
        return FAIL(UNSUPPORTED, "rms_norm: norm_type %u is neither RMS (1) nor LAYER (2)",
                    (unsigned)a->norm_type);
    if (!(a->eps >= 0.0f) || !isfinite(a->eps))
        return FAIL(INVALID_ARG, "rms_norm: eps %g must be finite and >= 0", (double)a->eps);
    view x, y, w, r;
    CHECK(get_mat(s, op, "x", a->x, &x));
    CHECK(get_mat(s, op, "y", a->y, &y));
    CHECK(get_view(s, op, "weight", a->weight, 1, 1, &w));
    CHECK(want_dtype(s, op, "weight", &w, KHUB_DTYPE_ID_F32));
    if (memcmp(x.n, y.n, sizeof x.n) != 0 || w.n[2] != x.n[2] || x.n[2] < 1)
        return FAIL(INVALID_ARG,
                    "rms_norm: x [%lld, %lld], y [%lld, %lld] and weight [%lld] "
                    "disagree",
                    (long long)x.n[1], (long long)x.n[2], (long long)y.n[1], (long long)y.n[2],
                    (long long)w.n[2]);
    kx_norm N = {.type = (int)a->norm_type,
                 .eps = a->eps,
                 .x = (const float *)x.p,
                 .w = (const float *)w.p,
                 .y = (float *)y.p,
                 .n = x.n[1],
                 .dim = x.n[2],
                 .ldx = x.st[1],
                 .ldy = y.st[1]};
    if (a->residual) {
        CHECK(get_mat(s, op, "residual", a->residual, &r));
        if (memcmp(r.n, x.n, sizeof x.n) != 0)
            return FAIL(INVALID_ARG, "rms_norm: residual shape differs from x");
        N.res = (float *)r.p;
        N.ldr = r.st[1];
    }
    return KX(norm_run)(s, &N);
}

static khub_status run_act(void *state, const void *args)
{
    kx_state *s = state;
    const khub_activation_args *a = args;
    const char *op = "silu_and_mul";
    if (!ARGS_OK(a, khub_activation_args, y))
        return FAIL(STRUCT_SIZE, "silu_and_mul: khub_activation_args is NULL or too small");
    if (!s->runnable) return not_runnable(s, op);
    if (a->act_type != KHUB_ACT_SILU && a->act_type != KHUB_ACT_GELU_TANH)
        return FAIL(UNSUPPORTED, "silu_and_mul: act_type %u is neither SILU (1) nor GELU_TANH (2)",
                    (unsigned)a->act_type);
    view g, u, y;
    CHECK(get_mat(s, op, "gate", a->gate, &g));
    CHECK(get_mat(s, op, "up", a->up, &u));
    CHECK(get_mat(s, op, "y", a->y, &y));
    if (memcmp(g.n, u.n, sizeof g.n) != 0 || memcmp(g.n, y.n, sizeof g.n) != 0)
        return FAIL(INVALID_ARG, "silu_and_mul: gate [%lld, %lld], up and y must share one shape",
                    (long long)g.n[1], (long long)g.n[2]);
    kx_act A = {.type = (int)a->act_type,
                .gate = (const float *)g.p,
                .up = (const float *)u.p,
                .y = (float *)y.p,
                .n = g.n[1],
                .ff = g.n[2],
                .ldg = g.st[1],
                .ldu = u.st[1],
                .ldy = y.st[1]};
    return KX(act_run)(s, &A);
}

/* ------------------------------------------------------------------------ */
/* Descriptor                                                               */
/* ------------------------------------------------------------------------ */

static const khub_op_caps caps_qlinear = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .cpu_features = KX_NEED,
    .dtypes = KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_1) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_K) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q6_K) | KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q5_0) |
              KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q5_1),
    .flags = KHUB_CAP_BIAS,
    .priority = KX_PRIORITY};
static const khub_op_caps caps_qlinear_q8a = {KHUB_STRUCT_INIT(khub_op_caps),
                                              .device_type = KHUB_DEVICE_CPU,
                                              .cpu_features = KX_NEED,
                                              .dtypes = KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_0) |
                                                        KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q4_1) |
                                                        KHUB_DTYPE_BIT_Q(KHUB_QFORMAT_Q8_0),
                                              .flags = KHUB_CAP_BIAS,
                                              .priority = 1};
/* ------------------------------------------------------------------------ */
/* Paged attention (ABI 1.4)                                                */
/* ------------------------------------------------------------------------ */

static khub_status run_paged_attention(void *state, const void *args)
{
    kx_state *s = state;
    if (!s->runnable) return not_runnable(s, "paged_attention");
    khub_pu_paged p;
    CHECK(khub_pu_paged_check(s->host, "paged_attention", args,
                              KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD), &p));
    return KX(paged_attention_run)(s, &p);
}

static const khub_op_caps caps_linear = {KHUB_STRUCT_INIT(khub_op_caps),
                                         .device_type = KHUB_DEVICE_CPU,
                                         .cpu_features = KX_NEED,
                                         .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) |
                                                   KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16) |
                                                   KHUB_DTYPE_BIT(KHUB_DTYPE_ID_BF16),
                                         .flags = KHUB_CAP_BIAS,
                                         .priority = KX_PRIORITY};
static const khub_op_caps caps_attention = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .cpu_features = KX_NEED,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_MASK | KHUB_CAP_STRIDED_KV |
             KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING,
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    .kind_flags = KHUB_ATTN_SOFTCAP,
#endif
    .priority = KX_PRIORITY};
static const khub_op_caps caps_paged_attention = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
    .cpu_features = KX_NEED,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING,
#if KHUB_PLUGIN_TARGET_MINOR >= 5
    .kind_flags = KHUB_ATTN_SOFTCAP,
#endif
    .priority = KX_PRIORITY,
    .kv_layouts = KHUB_KV_LAYOUT_BIT(KHUB_KV_LAYOUT_PAGED_HTD)};
static const khub_op_caps caps_norm = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU,
    .cpu_features = KX_NEED,        .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32),
    .flags = KHUB_CAP_RESIDUAL,     .priority = KX_PRIORITY};
static const khub_op_caps caps_act = {
    KHUB_STRUCT_INIT(khub_op_caps), .device_type = KHUB_DEVICE_CPU, .cpu_features = KX_NEED,
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32), .priority = KX_PRIORITY};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "qlinear", .kind = KHUB_OP_QLINEAR,
     .caps = &caps_qlinear, .run = run_qlinear},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "qlinear_q8a", .kind = KHUB_OP_QLINEAR,
     .caps = &caps_qlinear_q8a, .run = run_qlinear_q8a},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "qlinear_f32", .kind = KHUB_OP_QLINEAR,
     .caps = &caps_qlinear_q8a, .run = run_qlinear_f32},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "linear", .kind = KHUB_OP_LINEAR, .caps = &caps_linear,
     .run = run_linear},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "attention", .kind = KHUB_OP_ATTENTION,
     .caps = &caps_attention, .run = run_attention},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "paged_attention", .kind = KHUB_OP_PAGED_ATTENTION,
     .caps = &caps_paged_attention, .run = run_paged_attention},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "rms_norm", .kind = KHUB_OP_NORM, .caps = &caps_norm,
     .run = run_norm},
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "silu_and_mul", .kind = KHUB_OP_ACTIVATION,
     .caps = &caps_act, .run = run_act},
};

static int32_t kx_score(void *state) { return ((kx_state *)state)->runnable ? KX_PRIORITY : 0; }

static void kx_shutdown(void *state)
{
    kx_state *s = state;
    if (s) s->host->free(s->host->host_ctx, s);
}

khub_status KX_INIT(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                    size_t errbuf_size);
khub_status KX_INIT(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                    size_t errbuf_size)
{
    if (!host || !KHUB_HAS_FIELD(host, khub_host_api, cpu_features)) {
        if (errbuf && errbuf_size)
            snprintf(errbuf, errbuf_size,
                     KX_ID ": the host table is missing or older than "
                           "ABI 1.0 (no cpu_features); update the host");
        return KHUB_STATUS_STRUCT_SIZE;
    }
    kx_state *s = host->alloc(host->host_ctx, sizeof *s);
    if (!s) {
        if (errbuf && errbuf_size) snprintf(errbuf, errbuf_size, KX_ID ": out of memory");
        return KHUB_STATUS_NOMEM;
    }
    s->host = host;
    s->need = KX_NEED;
    s->runnable = (host->cpu_features(host->host_ctx) & KX_NEED) == KX_NEED;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = KX_ID,
                          .version = KX_VERSION,
                          .n_ops = sizeof ops / sizeof ops[0],
                          .ops = ops,
                          .state = s,
                          .score = kx_score,
                          .shutdown = kx_shutdown};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(KX_INIT, KX_ID, KX_VERSION,
                         KHUB_KIND_BIT(KHUB_OP_ATTENTION) | KHUB_KIND_BIT(KHUB_OP_LINEAR) |
                             KHUB_KIND_BIT(KHUB_OP_QLINEAR) | KHUB_KIND_BIT(KHUB_OP_NORM) |
                             KHUB_KIND_BIT(KHUB_OP_ACTIVATION) |
                             KHUB_KIND_BIT(KHUB_OP_PAGED_ATTENTION))
