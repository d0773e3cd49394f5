/*
 * flash_attn_cpu.c: kernels-community/flash-attn2 for the CPU.
 *
 * The flash-attention 2 recurrence on tiles: a work item is one KV head g
 * and a block of up to QB queries; its rows are those queries times the
 * n_heads / n_kv_heads query heads that read g (GQA), so every K/V tile is
 * converted to f32 once and reused by all rows while it is in L1. Each row
 * keeps a running max m, a running sum l and an unnormalised output acc:
 *     s_j = scale * q.k_j (+ mask),   m' = max(m, s_j),
 *     l = l * e^(m - m') + e^(s_j - m'),   acc = acc * e^(m - m') + e^(s_j - m') v_j
 * and writes acc / l at the end; nothing of size n_kv is materialised.
 * Visibility: key j is seen by query i (position p = q_pos0 + i) when j <= p
 * (causal), p - j < window (window > 0) and the mask entry is not -inf.
 *
 * Built twice: "generic" (plain C) and "avx2" (-mavx2 -mfma -mf16c), which
 * turns on the 8-wide paths below.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <khub/khub_plugin.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define FA_SIMD 1
#else
#define FA_SIMD 0
#endif

#define QB       8  /* queries per work item */
#define KT       64 /* keys per tile */
#define MAX_HD   256
#define MAX_ROWS (QB * 16) /* QB queries x up to 16 query heads per KV head */

/* ======================================================================== */
/* Vector helpers                                                           */
/* ======================================================================== */

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    bits =
        exp == 31 ? (sign | 0x7f800000u | (man << 13)) : (sign | ((exp + 112) << 23) | (man << 13));
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float dot(const float *a, const float *b, int64_t n)
{
#if FA_SIMD
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
#else
    float r = 0.0f;
    for (int64_t i = 0; i < n; i++) r += a[i] * b[i];
    return r;
#endif
}

/* acc = acc * c + p * v */
static void scale_add(float *acc, float c, float p, const float *v, int64_t n)
{
#if FA_SIMD
    __m256 vc = _mm256_set1_ps(c), vp = _mm256_set1_ps(p);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(v + i),
                                                  _mm256_mul_ps(vc, _mm256_loadu_ps(acc + i))));
    for (; i < n; i++) acc[i] = acc[i] * c + p * v[i];
#else
    for (int64_t i = 0; i < n; i++) acc[i] = acc[i] * c + p * v[i];
#endif
}

/* Copies n elements of a K or V row (f32 or f16, element stride es) to f32. */
static void load_row(float *dst, const char *src, int is_f16, int64_t es, int64_t n)
{
    if (!is_f16) {
        if (es == 1) {
            memcpy(dst, src, (size_t)n * 4);
            return;
        }
        for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)src)[i * es];
        return;
    }
    const uint16_t *h = (const uint16_t *)src;
    int64_t i = 0;
#if FA_SIMD
    if (es == 1)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) dst[i] = f16_to_f32(h[i * es]);
}

/* ======================================================================== */
/* Tensor views                                                             */
/* ======================================================================== */

typedef struct view {
    const char *base;
    int64_t s[3]; /* element strides */
    int elem;     /* bytes per element */
} view;

static void make_view(const khub_tensor *t, view *v)
{
    v->base = (const char *)t->data + t->byte_offset;
    v->elem = t->dtype.bits / 8;
    if (t->strides) {
        for (int i = 0; i < 3; i++) v->s[i] = t->strides[i];
    } else {
        v->s[2] = 1;
        v->s[1] = t->shape[2];
        v->s[0] = t->shape[1] * t->shape[2];
    }
}

static const char *at(const view *v, int64_t i, int64_t h)
{
    return v->base + (i * v->s[0] + h * v->s[1]) * v->elem;
}

/* ======================================================================== */
/* The kernel                                                               */
/* ======================================================================== */

typedef struct job {
    const khub_attention_args *a;
    view q, k, v, o;
    int64_t nq, nh, nkv, nkvh, hd, group, n_qblk;
    int kv_f16;
    const khub_host_api *host;
    int failed;
} job;

typedef struct row {
    float q[MAX_HD];
    float acc[MAX_HD];
    float m, l;
    int64_t i, h; /* query index and head */
} row;

static int visible(const job *j, int64_t i, int64_t key, float *bias)
{
    const khub_attention_args *a = j->a;
    int64_t p = a->q_pos0 + i;
    if (a->causal && key > p) return 0;
    if (a->window > 0 && p - key >= a->window) return 0;
    *bias = 0.0f;
    if (a->mask) {
        const float *mk = (const float *)((const char *)a->mask->data + a->mask->byte_offset);
        *bias = mk[i * j->nkv + key];
        if (isinf(*bias) && *bias < 0) return 0;
    }
    return 1;
}

static void work_item(job *j, int64_t item, row *rows, float *kt, float *vt)
{
    int64_t g = item / j->n_qblk, qb = item % j->n_qblk;
    int64_t i0 = qb * QB, i1 = i0 + QB < j->nq ? i0 + QB : j->nq;
    int64_t nrows = 0;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t hh = 0; hh < j->group; hh++) {
            row *r = &rows[nrows++];
            r->i = i;
            r->h = g * j->group + hh;
            r->m = -INFINITY;
            r->l = 0.0f;
            memset(r->acc, 0, sizeof(float) * (size_t)j->hd);
            const float *qs = (const float *)at(&j->q, i, r->h);
            for (int64_t d = 0; d < j->hd; d++) r->q[d] = qs[d * j->q.s[2]] * j->a->scale;
        }
    /* keys beyond the last query's causal horizon are never seen */
    int64_t kend = j->nkv;
    if (j->a->causal && j->a->q_pos0 + i1 < kend) kend = j->a->q_pos0 + i1;
    for (int64_t k0 = 0; k0 < kend; k0 += KT) {
        int64_t nk = kend - k0 < KT ? kend - k0 : KT;
        for (int64_t t = 0; t < nk; t++) {
            load_row(kt + t * j->hd, at(&j->k, k0 + t, g), j->kv_f16, j->k.s[2], j->hd);
            load_row(vt + t * j->hd, at(&j->v, k0 + t, g), j->kv_f16, j->v.s[2], j->hd);
        }
        for (int64_t r = 0; r < nrows; r++) {
            row *w = &rows[r];
            for (int64_t t = 0; t < nk; t++) {
                float bias;
                if (!visible(j, w->i, k0 + t, &bias)) continue;
                float s = dot(w->q, kt + t * j->hd, j->hd) + bias;
                float m2 = s > w->m ? s : w->m;
                float c = expf(w->m - m2), p = expf(s - m2);
                w->l = w->l * c + p;
                scale_add(w->acc, c, p, vt + t * j->hd, j->hd);
                w->m = m2;
            }
        }
    }
    for (int64_t r = 0; r < nrows; r++) {
        row *w = &rows[r];
        float *o = (float *)at(&j->o, w->i, w->h);
        float inv = w->l > 0.0f ? 1.0f / w->l : 0.0f;
        for (int64_t d = 0; d < j->hd; d++) o[d * j->o.s[2]] = w->acc[d] * inv;
    }
}

static void worker(void *ud, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    job *j = ud;
    size_t rows_bytes = sizeof(row) * (size_t)(QB * j->group);
    size_t tile_bytes = sizeof(float) * (size_t)(KT * j->hd);
    row *rows = j->host->alloc(j->host->host_ctx, rows_bytes);
    float *kt = j->host->alloc(j->host->host_ctx, tile_bytes);
    float *vt = j->host->alloc(j->host->host_ctx, tile_bytes);
    if (!rows || !kt || !vt) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
    } else {
        for (int64_t it = begin; it < end; it++) work_item(j, it, rows, kt, vt);
    }
    j->host->free(j->host->host_ctx, rows);
    j->host->free(j->host->host_ctx, kt);
    j->host->free(j->host->host_ctx, vt);
}

static int f32_or_f16(const khub_tensor *t)
{
    return t->dtype.code == KHUB_DL_FLOAT && (t->dtype.bits == 32 || t->dtype.bits == 16) &&
           t->dtype.lanes == 1;
}

static khub_status check(const khub_host_api *host, const khub_attention_args *a)
{
    if (!a || a->struct_size < sizeof *a || !a->q || !a->k || !a->v || !a->out)
        return host->fail(host->host_ctx, KHUB_STATUS_INVALID_ARG,
                          "flash_attn: needs khub_attention_args with q, k, v and out");
    const khub_tensor *q = a->q, *k = a->k, *v = a->v, *o = a->out;
    if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3 || o->ndim != 3 || q->dtype.bits != 32 ||
        o->dtype.bits != 32 || !f32_or_f16(k) || k->dtype.bits != v->dtype.bits)
        return host->fail(
            host->host_ctx, KHUB_STATUS_INVALID_ARG,
            "flash_attn: q/out must be f32 [n, heads, dim], k/v f32 or f16 [n, kv_heads, dim]");
    int64_t nh = q->shape[1], hd = q->shape[2], nkvh = k->shape[1];
    if (hd < 1 || hd > MAX_HD || nkvh < 1 || nh % nkvh != 0 || nh / nkvh > 16 ||
        k->shape[2] != hd || v->shape[2] != hd || v->shape[0] != k->shape[0] ||
        v->shape[1] != nkvh || o->shape[0] != q->shape[0] || o->shape[1] != nh || o->shape[2] != hd)
        return host->fail(
            host->host_ctx, KHUB_STATUS_INVALID_ARG,
            "flash_attn: shapes q [%lld, %lld, %lld], k [%lld, %lld, %lld] do not fit "
            "(head_dim <= %d, heads a multiple of kv_heads, at most 16 per group)",
            (long long)q->shape[0], (long long)nh, (long long)hd, (long long)k->shape[0],
            (long long)nkvh, (long long)k->shape[2], MAX_HD);
    return KHUB_STATUS_OK;
}

static khub_status flash_attn(void *state, const void *args)
{
    const khub_host_api *host = state;
    const khub_attention_args *a = args;
    khub_status st = check(host, a);
    if (st != KHUB_STATUS_OK) return st;
    job j = {.a = a, .host = host};
    make_view(a->q, &j.q);
    make_view(a->k, &j.k);
    make_view(a->v, &j.v);
    make_view(a->out, &j.o);
    j.nq = a->q->shape[0];
    j.nh = a->q->shape[1];
    j.hd = a->q->shape[2];
    j.nkv = a->k->shape[0];
    j.nkvh = a->k->shape[1];
    j.group = j.nh / j.nkvh;
    j.kv_f16 = a->k->dtype.bits == 16;
    j.n_qblk = (j.nq + QB - 1) / QB;
    host->parallel_for(host->host_ctx, j.nkvh * j.n_qblk, worker, &j);
    if (j.failed) return host->fail(host->host_ctx, KHUB_STATUS_NOMEM, "flash_attn: out of memory");
    return KHUB_STATUS_OK;
}

static const int32_t head_dims[] = {64, 80, 96, 128, 256};

static const khub_op_caps caps = {
    KHUB_STRUCT_INIT(khub_op_caps),
    .device_type = KHUB_DEVICE_CPU,
#if FA_SIMD
    .cpu_features = KHUB_CPU_AVX2 | KHUB_CPU_FMA | KHUB_CPU_F16C,
    .priority = 40,
#else
    .priority = 15,
#endif
    .dtypes = KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F32) | KHUB_DTYPE_BIT(KHUB_DTYPE_ID_F16),
    .head_dims = head_dims,
    .n_head_dims = sizeof head_dims / sizeof head_dims[0],
    .flags = KHUB_CAP_CAUSAL | KHUB_CAP_GQA | KHUB_CAP_MASK | KHUB_CAP_STRIDED_KV |
             KHUB_CAP_KV_F16 | KHUB_CAP_SLIDING,
};

static const khub_op_desc ops[] = {
    {KHUB_STRUCT_INIT(khub_op_desc), .name = "flash_attn", .kind = KHUB_OP_ATTENTION, .caps = &caps,
     .run = flash_attn},
};

khub_status khub_flash_attn2_init(const khub_host_api *host, khub_plugin_desc *out, char *errbuf,
                                  size_t errbuf_size)
{
    (void)errbuf, (void)errbuf_size;
    khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
                          .id = "kernels-community/flash-attn2",
                          .version = "1.0.0",
                          .n_ops = 1,
                          .ops = ops,
                          .state = (void *)host};
    return khub_plugin_desc_put(out, &d);
}

KHUB_PLUGIN_DEFINE_KINDS(khub_flash_attn2_init, "kernels-community/flash-attn2", "1.0.0",
                         KHUB_KIND_BIT(KHUB_OP_ATTENTION))
