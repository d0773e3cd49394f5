/*
 * selftest_attn.c: the attention self-test: one case per K/V layout the
 * op's caps claim (compact, cache views, padded rows with a byte offset,
 * f16 K/V, mask, window, odd head dims), each against khub/ref-cpu.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../plugins/include/khub_plugin_util.h" /* f16 conversion, header-only */
#include "selftest_impl.h"

/* ------------------------------------------------------------------------ */
/* Attention: the layouts its caps claim                                    */
/* ------------------------------------------------------------------------ */

/* Where a case's K/V live. The executor (forward.c) passes the kv_cache op's
 * views: khub/ref-cpu's are [n, n_kv_heads, head_dim] over head-major slots,
 * strides [head_dim, capacity * head_dim, 1]. PADDED is any other cache's
 * view: padded rows, the heads further apart again, a byte offset, and NaN
 * in every element the view does not cover. */
enum { KV_COMPACT, KV_CACHE_VIEW, KV_PADDED };

typedef struct attn_case {
    int64_t nq, nkv, hd;
    int layout, f16, mask;
    int64_t window;
    float softcap; /* ABI 1.5 KHUB_ATTN_SOFTCAP; 0 = none */
} attn_case;

#define MAX_ATTN_CASES 16

static void attn_add(attn_case *c, int *n, attn_case one)
{
    if (*n < MAX_ATTN_CASES && one.nq >= 1 && one.nkv >= one.nq) c[(*n)++] = one;
}

/* The cases for one spec: the spec as written (compact f32, as before),
 * then every layout and feature the op's caps claim, at the spec's
 * lengths, a decode step and a longer chunk, and an odd head dim when the
 * op serves one. */
static int attn_cases(const khub_op_caps *caps, int64_t nq, int64_t nkv, int64_t hd, attn_case *c)
{
    int n = 0;
    uint32_t fl = caps->flags;
    int strided = (fl & KHUB_CAP_STRIDED_KV) != 0;
    attn_add(c, &n, (attn_case){nq, nkv, hd, KV_COMPACT, 0, 0, 0, 0});
    for (int f16 = 0; f16 <= ((fl & KHUB_CAP_KV_F16) ? 1 : 0); f16++) {
        if (!strided) {
            if (f16) attn_add(c, &n, (attn_case){nq, nkv, hd, KV_COMPACT, 1, 0, 0, 0});
            continue;
        }
        attn_add(c, &n, (attn_case){nq, nkv, hd, KV_CACHE_VIEW, f16, 0, 0, 0});
        attn_add(c, &n, (attn_case){nq, nkv, hd, KV_PADDED, f16, 0, 0, 0});
        attn_add(c, &n, (attn_case){1, nkv + 3, hd, KV_CACHE_VIEW, f16, 0, 0, 0});
        attn_add(c, &n, (attn_case){nq + 2, nkv + 19, hd, KV_PADDED, f16, 0, 0, 0});
    }
    int lay = strided ? KV_PADDED : KV_COMPACT;
    if (fl & KHUB_CAP_MASK) attn_add(c, &n, (attn_case){nq, nkv, hd, lay, 0, 1, 0, 0});
    if (fl & KHUB_CAP_SLIDING) {
        int64_t win = nkv / 3 > 0 ? nkv / 3 : 1;
        attn_add(c, &n, (attn_case){nq, nkv, hd, strided ? KV_CACHE_VIEW : lay, 0, 0, win, 0});
        attn_add(c, &n, (attn_case){1, nkv + 7, hd, lay, 0, 0, win, 0});
    }
    /* A cap near the scores' size, so tanh bends them (q and k are random
     * in [-1, 1): scaled scores of a few units). */
    if (caps->flags & KHUB_ATTN_SOFTCAP)
        attn_add(c, &n, (attn_case){nq, nkv, hd, lay, 0, 0, 0, 0.75f});
    int64_t odd = 0;
    if (!caps->head_dims) odd = hd % 2 ? hd : hd + 1;
    for (uint32_t i = 0; caps->head_dims && i < caps->n_head_dims && !odd; i++)
        if (caps->head_dims[i] % 2) odd = caps->head_dims[i];
    if (odd && odd != hd) {
        attn_add(c, &n, (attn_case){nq, nkv, odd, lay, 0, 0, 0, 0});
        if (fl & KHUB_CAP_KV_F16) attn_add(c, &n, (attn_case){nq, nkv, odd, lay, 1, 0, 0, 0});
    }
    return n;
}

/* One case's K/V: tensors over storage the case owns (or the ref cache's). */
typedef struct attn_kv {
    khub_tensor k, v;
    int64_t shape[3], sk[3], sv[3];
    void *buf[2];          /* KV_COMPACT / KV_PADDED storage */
    khub_binding *cache_b; /* KV_CACHE_VIEW: ref-cpu's kv_cache, pinned */
    const khub_kv_cache_methods *m;
    void *cache_state;
    khub_kv_cache *cache;
} attn_kv;

static void attn_kv_free(bench *b, attn_kv *kv)
{
    for (int i = 0; i < 2; i++) khub__aligned_free(b->rt, kv->buf[i]);
    if (kv->cache) kv->m->destroy(kv->cache_state, kv->cache);
    if (kv->cache_b) khub_binding_release(kv->cache_b);
}

static void put_elem(void *base, int f16, int64_t i, float x)
{
    if (f16)
        ((uint16_t *)base)[i] = khub_pu_f32_to_f16(x);
    else
        ((float *)base)[i] = x;
}

/* K/V of c->nkv positions from src[2] (compact f32 [nkv, kvh, hd]), laid
 * out as c->layout says. */
static khub_status attn_kv_make(bench *b, const attn_case *c, int64_t kvh,
                                khub_tensor *const src[2], attn_kv *kv)
{
    int64_t nkv = c->nkv, hd = c->hd;
    size_t es = c->f16 ? 2 : 4;
    khub_dtype dt = c->f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32;
    kv->shape[0] = nkv, kv->shape[1] = kvh, kv->shape[2] = hd;
    khub_tensor *t[2] = {&kv->k, &kv->v};
    int64_t *str[2] = {kv->sk, kv->sv};
    if (c->layout == KV_CACHE_VIEW) {
        KHUB_FORWARD_IF_ERROR(b->rt, khub__st_bind(b, KHUB_OP_KV_CACHE, REF_ID, NULL,
                                                   c->f16 ? KHUB_DTYPE_ID_F16 : KHUB_DTYPE_ID_F32,
                                                   0, &kv->cache_b));
        const khub_op_desc *op = khub_binding_acquire(kv->cache_b, &kv->cache_state);
        kv->m = op ? op->methods : NULL;
        if (!kv->m) {
            khub_binding_release(kv->cache_b);
            kv->cache_b = NULL;
            return KHUB_STATUS_NO_KERNEL;
        }
        /* layer 1 of 2, capacity past n_kv (ref-cpu grows it by doubling from 16
         * tokens, as in generation): the view starts inside the
         * storage and its head stride is not n_kv * head_dim */
        khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                    .n_layers = 2,
                                    .n_kv_heads = (int32_t)kvh,
                                    .head_dim = (int32_t)hd,
                                    .n_seqs = 1,
                                    .max_tokens = nkv + 13,
                                    .dtype = dt};
        KHUB_FORWARD_IF_ERROR(b->rt, kv->m->create(kv->cache_state, &cfg, &kv->cache));
        for (int64_t p0 = 0; p0 < nkv;) { /* chunks of up to 5 positions, as decode writes */
            int64_t cnt = nkv - p0 < 5 ? nkv - p0 : 5, sh[3] = {cnt, kvh, hd};
            khub_tensor kc = *src[0], vc = *src[1];
            kc.shape = vc.shape = sh;
            kc.byte_offset = vc.byte_offset = (uint64_t)(p0 * kvh * hd * 4);
            khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                                    .layer = 1,
                                    .seq = 0,
                                    .pos = p0,
                                    .k = &kc,
                                    .v = &vc};
            KHUB_FORWARD_IF_ERROR(b->rt, kv->m->write(kv->cache_state, kv->cache, &w));
            p0 += cnt;
        }
        kv->k.shape = kv->shape, kv->k.strides = kv->sk;
        kv->v.shape = kv->shape + 0, kv->v.strides = kv->sv;
        return kv->m->view(kv->cache_state, kv->cache, 1, 0, nkv, &kv->k, &kv->v);
    }
    int padded = c->layout == KV_PADDED;
    int64_t row = padded ? hd + 3 : hd, cap = padded ? nkv + 5 : nkv;
    int64_t off = padded ? 7 : 0; /* elements before the view */
    size_t count = (size_t)(off + kvh * cap * row);
    for (int j = 0; j < 2; j++) {
        kv->buf[j] = khub__aligned_alloc(b->rt, count * es);
        if (!kv->buf[j]) return KHUB_STATUS_NOMEM;
        for (size_t i = 0; i < count; i++) put_elem(kv->buf[j], c->f16, (int64_t)i, NAN);
        /* padded: heads outermost, like a cache slot; compact: row-major */
        int64_t s0 = padded ? row : kvh * hd, s1 = padded ? cap * row : hd;
        const float *from = src[j]->data;
        for (int64_t i = 0; i < nkv; i++)
            for (int64_t h = 0; h < kvh; h++)
                for (int64_t d = 0; d < hd; d++)
                    put_elem(kv->buf[j], c->f16, off + i * s0 + h * s1 + d,
                             from[(i * kvh + h) * hd + d]);
        str[j][0] = s0, str[j][1] = s1, str[j][2] = 1;
        *t[j] = (khub_tensor){.data = kv->buf[j],
                              .device = {KHUB_DEVICE_CPU, 0},
                              .ndim = 3,
                              .dtype = dt,
                              .shape = kv->shape,
                              .strides = padded ? str[j] : NULL,
                              .byte_offset = (uint64_t)off * es};
    }
    return KHUB_STATUS_OK;
}

/* "K/V f16 padded view (strides [67, 804, 1], byte offset 14), n_q 1,
 * n_kv 10, head_dim 64, mask, window 3" */
static void attn_describe(const attn_case *c, const attn_kv *kv, char *buf, size_t n)
{
    static const char *const names[] = {"compact", "khub/ref-cpu kv_cache view", "padded view"};
    int len = snprintf(buf, n, "K/V %s %s", c->f16 ? "f16" : "f32", names[c->layout]);
    if (kv->k.strides && len >= 0 && (size_t)len < n)
        len +=
            snprintf(buf + len, n - (size_t)len, " (strides [%lld, %lld, %lld], byte offset %llu)",
                     (long long)kv->k.strides[0], (long long)kv->k.strides[1],
                     (long long)kv->k.strides[2], (unsigned long long)kv->k.byte_offset);
    if (len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, ", n_q %lld, n_kv %lld, head_dim %lld%s",
                        (long long)c->nq, (long long)c->nkv, (long long)c->hd,
                        c->mask ? ", mask" : "");
    if (c->window && len >= 0 && (size_t)len < n)
        len += snprintf(buf + len, n - (size_t)len, ", window %lld", (long long)c->window);
    if (c->softcap > 0 && len >= 0 && (size_t)len < n)
        snprintf(buf + len, n - (size_t)len, ", softcap %g", (double)c->softcap);
}

/* Runs one case through both ops; *score is its NMSE. */
static khub_status attn_run_case(bench *b, pair *p, const attn_case *c, int64_t h, int64_t kvh,
                                 double *score)
{
    khub_tensor *q = khub__st_f32(b, 1, 3, c->nq, h, c->hd);
    khub_tensor *src[2] = {khub__st_f32(b, 1, 3, c->nkv, kvh, c->hd),
                           khub__st_f32(b, 1, 3, c->nkv, kvh, c->hd)};
    khub_tensor *y = khub__st_f32(b, 0, 3, c->nq, h, c->hd),
                *r = khub__st_f32(b, 0, 3, c->nq, h, c->hd);
    khub_tensor *mask = c->mask ? khub__st_f32(b, 1, 2, c->nq, c->nkv, 0) : NULL;
    if (!q || !src[0] || !src[1] || !y || !r || (c->mask && !mask)) return KHUB_STATUS_NOMEM;
    attn_kv kv = {0};
    khub_status st = attn_kv_make(b, c, kvh, src, &kv);
    attn_describe(c, &kv, b->layout, sizeof b->layout);
    khub_attention_args a = {KHUB_STRUCT_INIT(khub_attention_args),
                             .q = q,
                             .k = &kv.k,
                             .v = &kv.v,
                             .mask = mask,
                             .out = y,
                             .scale = 1.0f / sqrtf((float)c->hd),
                             .causal = 1,
                             .q_pos0 = c->nkv - c->nq,
                             .window = c->window,
                             .softcap = c->softcap};
    if (st == KHUB_STATUS_OK) st = khub__st_call(b, p->test, &a, 0);
    a.out = r;
    if (st == KHUB_STATUS_OK) st = khub__st_call(b, p->ref, &a, 1);
    attn_kv_free(b, &kv);
    if (st == KHUB_STATUS_OK) *score = khub__st_nmse(y, r);
    return st;
}

khub_status khub__st_attention(bench *b, const char *pid, const khub_selftest_spec *s, result *res)
{
    /* [n_q, heads, kv_heads, head_dim] or [..., n_kv]: the queries are the
     * last n_q positions of n_kv keys (a decode step when n_q = 1). */
    (void)res;
    if ((s->ndim != 4 && s->ndim != 5) || s->shape[1] % s->shape[2] != 0)
        return KHUB_STATUS_INVALID_ARG;
    int64_t nq = s->shape[0], h = s->shape[1], kvh = s->shape[2], hd = s->shape[3];
    int64_t nkv = s->ndim == 5 ? s->shape[4] : nq;
    if (nkv < nq) return KHUB_STATUS_INVALID_ARG;
    pair p;
    KHUB_FORWARD_IF_ERROR(b->rt, khub__st_bind_pair(b, KHUB_OP_ATTENTION, pid, s->op,
                                                    KHUB_DTYPE_ID_F32, (int)hd, &p));
    const khub_op_desc *op = khub_binding_acquire(p.test, &(void *){NULL});
    khub_op_caps caps = {0};
    if (op && op->caps) /* the host's copy: kind_flags (ABI 1.3) holds the 1.0 word too */
        caps.flags = (uint32_t)(op->caps->flags | op->caps->kind_flags),
        caps.head_dims = op->caps->head_dims, caps.n_head_dims = op->caps->n_head_dims;
    khub_binding_release(p.test);
    attn_case cases[MAX_ATTN_CASES];
    /* timing (min_s > 0) measures the spec as written, compact */
    int n = b->min_s > 0 ? 1 : attn_cases(&caps, nq, nkv, hd, cases);
    if (b->min_s > 0) cases[0] = (attn_case){nq, nkv, hd, KV_COMPACT, 0, 0, 0, 0};
    b->scored = 1;
    b->score = 0;
    for (int i = 0; i < n; i++) {
        double sc = 0;
        khub_status st = attn_run_case(b, &p, &cases[i], h, kvh, &sc);
        khub__st_bench_free(b);
        if (st != KHUB_STATUS_OK) return st;
        b->n_cases++;
        if (!(sc <= b->score)) {
            b->score = sc;
            snprintf(b->worst, sizeof b->worst, "%s", b->layout);
        }
        if (!(sc <= s->tolerance)) return KHUB_STATUS_OK; /* the first case over: the finding */
    }
    return KHUB_STATUS_OK;
}
