/*
 * selftest.c: numeric self-tests against khub/ref-cpu (see selftest.h): the
 * test bench, the bindings, one test per kind; attention, which runs a case
 * per claimed K/V layout, is selftest_attn.c.
 *
 * Both ops are reached through the registry in strict mode, pinned to their
 * plugin by id, so a self-test never silently compares ref-cpu with itself.
 * Buffers come from the runtime allocator and are freed on every path.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../../plugins/include/khub_plugin_util.h" /* f16/bf16 conversions, header-only */
#include "selftest_impl.h"
#include "timing.h"

/* ======================================================================== */
/* Tensors and data                                                         */
/* ======================================================================== */

static float rnd(bench *b)
{
    b->rng ^= b->rng << 13;
    b->rng ^= b->rng >> 7;
    b->rng ^= b->rng << 17;
    return (float)((b->rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* A compact tensor of the given dtype and shape, filled with U(-1, 1) when
 * fill is set (f32 only), else zeroed. NULL on OOM or overflow. */
static khub_tensor *mk(bench *b, khub_dtype dt, size_t elem_bytes, int fill, int nd, int64_t d0,
                       int64_t d1, int64_t d2)
{
    if (b->n >= MAX_T) return NULL;
    tens *t = &b->t[b->n];
    int64_t dims[3] = {d0, d1, d2};
    size_t count = 1;
    for (int i = 0; i < nd; i++) {
        t->shape[i] = dims[i];
        if (dims[i] <= 0 || !khub__mul_ok(count, (size_t)dims[i], &count)) return NULL;
    }
    if (!khub__mul_ok(count, elem_bytes, &t->bytes)) return NULL;
    void *data = khub__aligned_alloc(b->rt, t->bytes);
    if (!data) return NULL;
    memset(data, 0, t->bytes);
    if (fill)
        for (size_t i = 0; i < count; i++) ((float *)data)[i] = rnd(b);
    t->t = (khub_tensor){
        .data = data, .device = {KHUB_DEVICE_CPU, 0}, .ndim = nd, .dtype = dt, .shape = t->shape};
    b->n++;
    return &t->t;
}

khub_tensor *khub__st_f32(bench *b, int fill, int nd, int64_t d0, int64_t d1, int64_t d2)
{
    return mk(b, KHUB_DTYPE_F32, 4, fill, nd, d0, d1, d2);
}

void khub__st_bench_free(bench *b)
{
    for (int i = 0; i < b->n; i++) khub__aligned_free(b->rt, b->t[i].t.data);
    b->n = 0;
}

static size_t numel(const khub_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

double khub__st_nmse(const khub_tensor *y, const khub_tensor *ref)
{
    const float *a = y->data, *r = ref->data;
    double num = 0, den = 0;
    for (size_t i = 0; i < numel(ref); i++) {
        double d = (double)a[i] - (double)r[i];
        num += d * d;
        den += (double)r[i] * r[i];
        if (!isfinite(a[i])) return INFINITY;
    }
    /* an all-zero reference would make any output pass: treat it as a failure */
    return den > 0 ? num / den : INFINITY;
}

/* ======================================================================== */
/* Bindings                                                                 */
/* ======================================================================== */

/* The device plugin's op of kind (named op, or its first of the kind) runs
 * on: CUDA ops get their self-test through selftest_cuda.c. */
static int32_t op_device(khub_runtime *rt, uint32_t kind, const char *plugin, const char *op)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++) {
        const khub_plugin *p = khub_plugin_at(rt, i);
        if (strcmp(khub_plugin_id(p), plugin) != 0) continue;
        for (uint32_t j = 0; j < khub_plugin_op_count(p); j++) {
            const khub_op_desc *d = khub_plugin_op(p, j);
            if (d->kind == kind && (!op || !strcmp(d->name, op)) && d->caps)
                return d->caps->device_type;
        }
    }
    return KHUB_DEVICE_CPU;
}

/* The bindings are the bench's (owner b), dropped when the self-test ends
 * (drop_bindings), so a plugin that was only self-tested can be unloaded:
 * they were khub_registry_select's, the caller's until khub_runtime_free
 * (before session 17). */
khub_status khub__st_bind(bench *b, uint32_t kind, const char *plugin, const char *op, int dtype_id,
                          int head_dim, khub_binding **out)
{
    khub_runtime *rt = b->rt;
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = kind,
                       .device_type = op_device(rt, kind, plugin, op),
                       .dtype_id = dtype_id,
                       .head_dim = head_dim,
                       .plugin_id = plugin,
                       .op_name = op};
    KHUB_FORWARD_IF_ERROR(rt, khub__registry_select_for(rt, &q, b, out));
    const char *name = khub_binding_name(*out);
    size_t len = strlen(plugin);
    KHUB_RETURN_IF(rt, strncmp(name, plugin, len) != 0 || name[len] != ' ', KHUB_STATUS_NO_KERNEL,
                   "self-test: wanted an op of %s, the registry chose %s", plugin, name);
    return KHUB_STATUS_OK;
}

khub_status khub__st_bind_pair(bench *b, uint32_t kind, const char *plugin, const char *op,
                               int dtype_id, int head_dim, pair *p)
{
    KHUB_FORWARD_IF_ERROR(b->rt, khub__st_bind(b, kind, plugin, op, dtype_id, head_dim, &p->test));
    return khub__st_bind(b, kind, REF_ID, NULL, dtype_id, head_dim, &p->ref);
}

/* One call of an op; when timing, also its median time per call, added to
 * b->us[which] (0 = the plugin under test, 1 = ref-cpu). Repeated calls
 * see their own outputs as inputs where an op works in place (rotary, a
 * norm's residual): same shapes, same work. */
typedef struct timed {
    khub_binding *binding;
    const void *args;
} timed;

static khub_status timed_call(void *ud, int i)
{
    (void)i;
    const timed *t = ud;
    return khub_binding_call(t->binding, t->args);
}

khub_status khub__st_call(bench *b, khub_binding *binding, const void *args, int which)
{
    const khub_op_desc *op = khub_binding_acquire(binding, &(void *){NULL});
    bool cuda = op && op->caps && op->caps->device_type == KHUB_DEVICE_CUDA;
    uint32_t kind = op ? op->kind : 0;
    khub_binding_release(binding);
    if (cuda) return khub__st_call_cuda(b, binding, kind, args); /* not timed */
    KHUB_FORWARD_IF_ERROR(b->rt, khub_binding_call(binding, args));
    if (b->min_s <= 0) return KHUB_STATUS_OK;
    timed t = {binding, args};
    double s = 0;
    KHUB_FORWARD_IF_ERROR(b->rt, khub__time_calls(timed_call, &t, b->min_s, CLOCK_MONOTONIC, &s));
    b->us[which] += s * 1e6;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* One test per kind: each fills y (plugin) and r (reference)               */
/* ======================================================================== */

static khub_status t_norm(bench *b, const char *pid, const khub_selftest_spec *s, result *res)
{
    if (s->ndim != 2) return KHUB_STATUS_INVALID_ARG;
    int64_t n = s->shape[0], dim = s->shape[1];
    pair p;
    KHUB_FORWARD_IF_ERROR(
        b->rt, khub__st_bind_pair(b, KHUB_OP_NORM, pid, s->op, KHUB_DTYPE_ID_F32, 0, &p));
    khub_tensor *x = khub__st_f32(b, 1, 2, n, dim, 0), *w = khub__st_f32(b, 1, 1, dim, 0, 0);
    khub_tensor *res1 = khub__st_f32(b, 1, 2, n, dim, 0), *res2 = khub__st_f32(b, 0, 2, n, dim, 0);
    res->y = khub__st_f32(b, 0, 2, n, dim, 0);
    res->r = khub__st_f32(b, 0, 2, n, dim, 0);
    if (!x || !w || !res1 || !res2 || !res->y || !res->r) return KHUB_STATUS_NOMEM;
    memcpy(res2->data, res1->data, numel(res1) * 4);
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .norm_type = KHUB_NORM_RMS,
                        .eps = 1e-5f,
                        .x = x,
                        .residual = res1,
                        .weight = w,
                        .y = res->y};
    KHUB_FORWARD_IF_ERROR(b->rt, khub__st_call(b, p.test, &a, 0));
    a.residual = res2;
    a.y = res->r;
    return khub__st_call(b, p.ref, &a, 1);
}

static khub_status t_act(bench *b, const char *pid, const khub_selftest_spec *s, result *res)
{
    if (s->ndim != 2) return KHUB_STATUS_INVALID_ARG;
    pair p;
    KHUB_FORWARD_IF_ERROR(
        b->rt, khub__st_bind_pair(b, KHUB_OP_ACTIVATION, pid, s->op, KHUB_DTYPE_ID_F32, 0, &p));
    khub_tensor *g = khub__st_f32(b, 1, 2, s->shape[0], s->shape[1], 0);
    khub_tensor *u = khub__st_f32(b, 1, 2, s->shape[0], s->shape[1], 0);
    res->y = khub__st_f32(b, 0, 2, s->shape[0], s->shape[1], 0);
    res->r = khub__st_f32(b, 0, 2, s->shape[0], s->shape[1], 0);
    if (!g || !u || !res->y || !res->r) return KHUB_STATUS_NOMEM;
    khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args), .act_type = KHUB_ACT_SILU,
                              .gate = g, .up = u, .y = res->y};
    KHUB_FORWARD_IF_ERROR(b->rt, khub__st_call(b, p.test, &a, 0));
    a.y = res->r;
    return khub__st_call(b, p.ref, &a, 1);
}

static khub_status t_rotary(bench *b, const char *pid, const khub_selftest_spec *s, result *res)
{
    if (s->ndim != 3 || s->shape[2] % 2 != 0) return KHUB_STATUS_INVALID_ARG;
    pair p;
    KHUB_FORWARD_IF_ERROR(
        b->rt, khub__st_bind_pair(b, KHUB_OP_ROTARY, pid, s->op, KHUB_DTYPE_ID_F32, 0, &p));
    res->y = khub__st_f32(b, 1, 3, s->shape[0], s->shape[1], s->shape[2]);
    res->r = khub__st_f32(b, 0, 3, s->shape[0], s->shape[1], s->shape[2]);
    khub_tensor *pos = mk(b, KHUB_DTYPE_I32, 4, 0, 1, s->shape[0], 0, 0);
    if (!res->y || !res->r || !pos) return KHUB_STATUS_NOMEM;
    memcpy(res->r->data, res->y->data, numel(res->y) * 4);
    for (int64_t i = 0; i < s->shape[0]; i++) ((int32_t *)pos->data)[i] = (int32_t)(i * 7);
    khub_rotary_args a = {KHUB_STRUCT_INIT(khub_rotary_args), .x = res->y, .positions = pos->data,
                          .style = KHUB_ROPE_NEOX, .theta = 10000.0f};
    KHUB_FORWARD_IF_ERROR(b->rt, khub__st_call(b, p.test, &a, 0));
    a.x = res->r;
    return khub__st_call(b, p.ref, &a, 1);
}

/* Writes the same random K/V into both caches in two chunks per layer and
 * reads them back through view(); y and r hold the views converted to f32. */
static float elem_f32(const khub_tensor *t, int64_t i, int64_t h, int64_t d)
{
    int64_t off = i * t->strides[0] + h * t->strides[1] + d * t->strides[2];
    const char *base = (const char *)t->data + t->byte_offset;
    if (t->dtype.bits == 32) return ((const float *)base)[off];
    uint16_t half;
    memcpy(&half, base + off * 2, 2);
    return khub_pu_f16_to_f32(half);
}

static khub_status kv_roundtrip(bench *b, khub_binding *bind_, const khub_kv_cache_config *cfg,
                                khub_tensor *const kv[2], khub_tensor *dst)
{
    void *state = NULL;
    const khub_op_desc *op = khub_binding_acquire(bind_, &state);
    const khub_kv_cache_methods *m = op ? op->methods : NULL;
    khub_kv_cache *cache = NULL;
    khub_status st = m ? m->create(state, cfg, &cache) : KHUB_STATUS_NO_KERNEL;
    int64_t n = kv[0]->shape[0] / cfg->n_layers, half = n / 2,
            row = cfg->n_kv_heads * cfg->head_dim;
    float *out = dst->data;
    for (int32_t l = 0; st == KHUB_STATUS_OK && l < cfg->n_layers; l++) {
        for (int part = 0; part < 2 && st == KHUB_STATUS_OK; part++) {
            int64_t p0 = part ? half : 0, cnt = part ? n - half : half;
            if (!cnt) continue;
            int64_t sk[3] = {cnt, cfg->n_kv_heads, cfg->head_dim};
            khub_tensor k = *kv[0], v = *kv[1];
            k.shape = v.shape = sk;
            k.byte_offset = v.byte_offset = (uint64_t)((l * n + p0) * row * 4);
            khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                                    .layer = l,
                                    .seq = 0,
                                    .pos = p0,
                                    .k = &k,
                                    .v = &v};
            st = m->write(state, cache, &w);
        }
        int64_t shp[2][3], str[2][3];
        khub_tensor vk = {.shape = shp[0], .strides = str[0]},
                    vv = {.shape = shp[1], .strides = str[1]};
        if (st == KHUB_STATUS_OK) st = m->view(state, cache, l, 0, n, &vk, &vv);
        for (int64_t i = 0; st == KHUB_STATUS_OK && i < n; i++)
            for (int64_t h = 0; h < cfg->n_kv_heads; h++)
                for (int64_t d = 0; d < cfg->head_dim; d++) {
                    int64_t o = ((l * n + i) * cfg->n_kv_heads + h) * cfg->head_dim + d;
                    out[2 * o] = elem_f32(&vk, i, h, d);
                    out[2 * o + 1] = elem_f32(&vv, i, h, d);
                }
    }
    if (m && cache) m->destroy(state, cache);
    khub_binding_release(bind_);
    (void)b;
    return st;
}

typedef struct kv_timed {
    bench *b;
    khub_binding *binding;
    const khub_kv_cache_config *cfg;
    khub_tensor *const *kv;
    khub_tensor *dst;
} kv_timed;

static khub_status kv_timed_call(void *ud, int i)
{
    (void)i;
    const kv_timed *t = ud;
    return kv_roundtrip(t->b, t->binding, t->cfg, t->kv, t->dst);
}

static khub_status t_kv(bench *b, const char *pid, const khub_selftest_spec *s, result *res)
{
    /* [n_layers, n_kv_heads, head_dim, n_tokens], dtype = storage */
    if (s->ndim != 4) return KHUB_STATUS_INVALID_ARG;
    int f16 = strcmp(s->dtype, "f16") == 0;
    if (!f16 && strcmp(s->dtype, "f32") != 0) return KHUB_STATUS_INVALID_ARG;
    int64_t L = s->shape[0], kvh = s->shape[1], hd = s->shape[2], n = s->shape[3];
    int dtype_id = f16 ? KHUB_DTYPE_ID_F16 : KHUB_DTYPE_ID_F32;
    pair p;
    KHUB_FORWARD_IF_ERROR(b->rt,
                          khub__st_bind_pair(b, KHUB_OP_KV_CACHE, pid, s->op, dtype_id, 0, &p));
    khub_tensor *kv[2] = {khub__st_f32(b, 1, 3, L * n, kvh, hd),
                          khub__st_f32(b, 1, 3, L * n, kvh, hd)};
    res->y = khub__st_f32(b, 0, 3, L * n, kvh, 2 * hd);
    res->r = khub__st_f32(b, 0, 3, L * n, kvh, 2 * hd);
    if (!kv[0] || !kv[1] || !res->y || !res->r) return KHUB_STATUS_NOMEM;
    khub_kv_cache_config cfg = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                .n_layers = (int32_t)L,
                                .n_kv_heads = (int32_t)kvh,
                                .head_dim = (int32_t)hd,
                                .n_seqs = 1,
                                .max_tokens = n + 3,
                                .dtype = f16 ? KHUB_DTYPE_F16 : KHUB_DTYPE_F32};
    KHUB_FORWARD_IF_ERROR(b->rt, kv_roundtrip(b, p.test, &cfg, kv, res->y));
    KHUB_FORWARD_IF_ERROR(b->rt, kv_roundtrip(b, p.ref, &cfg, kv, res->r));
    if (b->min_s <= 0) return KHUB_STATUS_OK;
    /* timed as whole round trips: create, the writes, the views, destroy */
    for (int which = 0; which < 2; which++) {
        kv_timed t = {b, which ? p.ref : p.test, &cfg, kv, which ? res->r : res->y};
        double sec = 0;
        KHUB_FORWARD_IF_ERROR(b->rt,
                              khub__time_calls(kv_timed_call, &t, b->min_s, CLOCK_MONOTONIC, &sec));
        b->us[which] += sec * 1e6;
    }
    return KHUB_STATUS_OK;
}

/* Converts f32 weights in place into a new tensor of the wanted dtype. */
static khub_tensor *weights_as(bench *b, khub_tensor *w32, const char *dtype)
{
    int64_t o = w32->shape[0], in = w32->shape[1];
    const float *src = w32->data;
    if (strcmp(dtype, "f32") == 0) return w32;
    int bf = strcmp(dtype, "bf16") == 0;
    if (!bf && strcmp(dtype, "f16") != 0) return NULL;
    khub_tensor *w = mk(b, bf ? KHUB_DTYPE_BF16 : KHUB_DTYPE_F16, 2, 0, 2, o, in, 0);
    if (!w) return NULL;
    uint16_t *dst = w->data;
    for (int64_t i = 0; i < o * in; i++) {
        dst[i] = bf ? khub_pu_f32_to_bf16(src[i]) : khub_pu_f32_to_f16(src[i]);
    }
    return w;
}

static int qformat_of(const char *dtype)
{
    for (int i = 1; i < KHUB_QFORMAT__COUNT; i++)
        if (strcmp(khub__dtype_id_name(KHUB_DTYPE_ID_QBASE + i), dtype) == 0) return i;
    return 0;
}

/* Quantizes f32 weights [o, in] with ref-cpu's quantize method. */
static khub_tensor *quantized(bench *b, pair *p, khub_tensor *w32, int fmt, khub_status *st)
{
    int64_t o = w32->shape[0], in = w32->shape[1];
    int64_t row = khub_qformat_row_bytes((khub_qformat)fmt, in);
    *st = KHUB_STATUS_INVALID_ARG;
    if (row <= 0) return NULL;
    khub_tensor *w = mk(b, KHUB_DTYPE_Q(fmt), 1, 0, 2, o, row, 0);
    if (!w) return (*st = KHUB_STATUS_NOMEM), NULL;
    w->shape[1] = in; /* logical shape */
    void *ref_state = NULL;
    const khub_op_desc *op = khub_binding_acquire(p->ref, &ref_state);
    const khub_qlinear_methods *qm = op ? op->methods : NULL;
    khub_quant_args qa = {KHUB_STRUCT_INIT(khub_quant_args),
                          .format = (uint32_t)fmt,
                          .n_rows = o,
                          .n_cols = in,
                          .src = w32->data,
                          .dst = w->data};
    *st = qm && qm->quantize ? qm->quantize(ref_state, &qa) : KHUB_STATUS_UNSUPPORTED;
    khub_binding_release(p->ref);
    return *st == KHUB_STATUS_OK ? w : NULL;
}

static khub_status t_linear(bench *b, const char *pid, const khub_selftest_spec *s, result *res,
                            int quant)
{
    if (s->ndim != 3) return KHUB_STATUS_INVALID_ARG;
    int64_t n = s->shape[0], in = s->shape[1], out = s->shape[2];
    int fmt = quant ? qformat_of(s->dtype) : 0;
    if (quant && !fmt) return KHUB_STATUS_INVALID_ARG;
    int dtype_id = quant ? KHUB_DTYPE_ID_QBASE + fmt
                         : (strcmp(s->dtype, "f16") == 0    ? KHUB_DTYPE_ID_F16
                            : strcmp(s->dtype, "bf16") == 0 ? KHUB_DTYPE_ID_BF16
                                                            : KHUB_DTYPE_ID_F32);
    pair p;
    KHUB_FORWARD_IF_ERROR(b->rt, khub__st_bind_pair(b, quant ? KHUB_OP_QLINEAR : KHUB_OP_LINEAR,
                                                    pid, s->op, dtype_id, 0, &p));
    khub_tensor *x = khub__st_f32(b, 1, 2, n, in, 0), *w32 = khub__st_f32(b, 1, 2, out, in, 0);
    res->y = khub__st_f32(b, 0, 2, n, out, 0);
    res->r = khub__st_f32(b, 0, 2, n, out, 0);
    if (!x || !w32 || !res->y || !res->r) return KHUB_STATUS_NOMEM;
    khub_status st = KHUB_STATUS_OK;
    khub_tensor *w = quant ? quantized(b, &p, w32, fmt, &st) : weights_as(b, w32, s->dtype);
    if (!w) return st != KHUB_STATUS_OK ? st : KHUB_STATUS_INVALID_ARG;
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args), .x = x, .weight = w, .y = res->y};
    KHUB_FORWARD_IF_ERROR(b->rt, khub__st_call(b, p.test, &a, 0));
    a.y = res->r;
    return khub__st_call(b, p.ref, &a, 1);
}

/* Block-quantized rows of random codes whose scales are small finite
 * values: what a GGUF holds, for every format (Q4_K and Q6_K have no
 * reference quantizer, so the bytes are made, not quantized). */
static void random_rows(bench *b, khub_qformat f, uint8_t *dst, int64_t rows, int64_t cols)
{
    int64_t rb = khub_qformat_row_bytes(f, cols), be = khub_qformat_block_elems(f),
            bb = khub_qformat_block_bytes(f);
    for (int64_t i = 0; i < rows * rb; i++) {
        b->rng ^= b->rng << 13, b->rng ^= b->rng >> 7, b->rng ^= b->rng << 17;
        dst[i] = (uint8_t)(b->rng >> 56);
    }
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = dst + r * rb;
        if (f == KHUB_QFORMAT_INT8_ROW) {
            khub_pu_store_f32(row, 0.01f + 0.01f * (rnd(b) + 1.0f));
            continue;
        }
        for (int64_t k = 0; k < cols / be; k++) {
            uint8_t *blk = row + k * bb;
            switch (f) {
            case KHUB_QFORMAT_NF4: khub_pu_store_f32(blk, 0.5f + 0.25f * rnd(b)); break;
            case KHUB_QFORMAT_Q6_K: khub_pu_store_f16le(blk + 208, 0.01f * rnd(b)); break;
            case KHUB_QFORMAT_Q4_1:
            case KHUB_QFORMAT_Q5_1:
            case KHUB_QFORMAT_Q4_K:
                khub_pu_store_f16le(blk, 0.05f * rnd(b));
                khub_pu_store_f16le(blk + 2, 0.05f * rnd(b));
                break;
            default: khub_pu_store_f16le(blk, 0.05f * rnd(b)); break;
            }
        }
    }
}

/* embedding [n, vocab, hidden], dtype = the table's: ids spread over the
 * vocabulary (its first and last rows included), the scale sqrt(hidden) as
 * Gemma's, y compact. */
static khub_status t_embedding(bench *b, const char *pid, const khub_selftest_spec *s, result *res)
{
    if (s->ndim != 3) return KHUB_STATUS_INVALID_ARG;
    int64_t n = s->shape[0], vocab = s->shape[1], hidden = s->shape[2];
    int fmt = qformat_of(s->dtype);
    int dtype_id = fmt                             ? KHUB_DTYPE_ID_QBASE + fmt
                   : strcmp(s->dtype, "f16") == 0  ? KHUB_DTYPE_ID_F16
                   : strcmp(s->dtype, "bf16") == 0 ? KHUB_DTYPE_ID_BF16
                   : strcmp(s->dtype, "f32") == 0  ? KHUB_DTYPE_ID_F32
                                                   : -1;
    if (dtype_id < 0 || (fmt && khub_qformat_row_bytes((khub_qformat)fmt, hidden) <= 0))
        return KHUB_STATUS_INVALID_ARG;
    pair p;
    KHUB_FORWARD_IF_ERROR(b->rt,
                          khub__st_bind_pair(b, KHUB_OP_EMBEDDING, pid, s->op, dtype_id, 0, &p));
    khub_tensor *table;
    if (fmt) {
        int64_t rb = khub_qformat_row_bytes((khub_qformat)fmt, hidden);
        table = mk(b, KHUB_DTYPE_Q(fmt), 1, 0, 2, vocab, rb, 0);
        if (table) {
            table->shape[1] = hidden; /* logical shape */
            random_rows(b, (khub_qformat)fmt, table->data, vocab, hidden);
        }
    } else {
        khub_tensor *t32 = khub__st_f32(b, 1, 2, vocab, hidden, 0);
        table = t32 ? weights_as(b, t32, s->dtype) : NULL;
    }
    khub_tensor *ids = mk(b, KHUB_DTYPE_I32, 4, 0, 1, n, 0, 0);
    res->y = khub__st_f32(b, 0, 2, n, hidden, 0);
    res->r = khub__st_f32(b, 0, 2, n, hidden, 0);
    if (!table || !ids || !res->y || !res->r) return KHUB_STATUS_NOMEM;
    int32_t *id = ids->data;
    for (int64_t i = 0; i < n; i++)
        id[i] = i == 0 ? (int32_t)(vocab - 1) : (int32_t)((i * 7919) % vocab);
    khub_embedding_args a = {
        KHUB_STRUCT_INIT(khub_embedding_args), .table = table, .ids = id, .y = res->y, .n = n,
        .scale = (float)sqrt((double)hidden)};
    KHUB_FORWARD_IF_ERROR(b->rt, khub__st_call(b, p.test, &a, 0));
    a.y = res->r;
    return khub__st_call(b, p.ref, &a, 1);
}

/* ======================================================================== */
/* Entry                                                                    */
/* ======================================================================== */

static uint32_t kind_of_op(khub_runtime *rt, const char *plugin_id, const char *op)
{
    for (size_t i = 0; i < khub_plugin_count(rt); i++) {
        const khub_plugin *p = khub_plugin_at(rt, i);
        if (strcmp(khub_plugin_id(p), plugin_id) != 0) continue;
        for (uint32_t j = 0; j < khub_plugin_op_count(p); j++)
            if (strcmp(khub_plugin_op(p, j)->name, op) == 0) return khub_plugin_op(p, j)->kind;
    }
    return 0;
}

static void shape_str(const khub_selftest_spec *s, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < s->ndim && len < n; i++)
        len +=
            (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)s->shape[i]);
}

static khub_status run_kind(bench *b, uint32_t kind, const char *plugin_id,
                            const khub_selftest_spec *spec, result *res)
{
    switch (kind) {
    case KHUB_OP_NORM: return t_norm(b, plugin_id, spec, res);
    case KHUB_OP_ACTIVATION: return t_act(b, plugin_id, spec, res);
    case KHUB_OP_ATTENTION: return khub__st_attention(b, plugin_id, spec, res);
    case KHUB_OP_ROTARY: return t_rotary(b, plugin_id, spec, res);
    case KHUB_OP_LINEAR: return t_linear(b, plugin_id, spec, res, 0);
    case KHUB_OP_QLINEAR: return t_linear(b, plugin_id, spec, res, 1);
    case KHUB_OP_KV_CACHE: return t_kv(b, plugin_id, spec, res);
    case KHUB_OP_EMBEDDING: return t_embedding(b, plugin_id, spec, res);
    default: b->no_test = 1; return KHUB_STATUS_UNSUPPORTED;
    }
}

khub_status khub__selftest_run(khub_runtime *rt, const char *plugin_id,
                               const khub_selftest_spec *spec, double *nmse_out, char *report,
                               size_t n)
{
    char shape[96];
    shape_str(spec, shape, sizeof shape);
    uint32_t kind = kind_of_op(rt, plugin_id, spec->op);
    if (!kind) {
        khub__errbuf(report, n, "%s: no op named %s is loaded", plugin_id, spec->op);
        return khub__fail(rt, KHUB_STATUS_NO_KERNEL, "%s: no op named %s is loaded", plugin_id,
                          spec->op);
    }
    int64_t strict = 0;
    khub_runtime_get_option(rt, KHUB_OPT_STRICT, &strict);
    khub_runtime_set_option(rt, KHUB_OPT_STRICT, 1);
    bench b = {.rt = rt, .rng = 0x9E3779B97F4A7C15ull};
    result res = {0};
    khub_status st = run_kind(&b, kind, plugin_id, spec, &res);
    khub__registry_drop_owned(rt, &b); /* nothing calls them any more */
    char why[KHUB_ERROR_SIZE];
    khub__copy_error(rt, why, sizeof why); /* set_option clears the message */
    khub_runtime_set_option(rt, KHUB_OPT_STRICT, strict);
    double score = st != KHUB_STATUS_OK ? NAN : b.scored ? b.score : khub__st_nmse(res.y, res.r);
    khub__st_bench_free(&b);
    if (st == KHUB_STATUS_INVALID_ARG) {
        khub__errbuf(report, n, "%s [%s] %s: shape or dtype does not fit a %u-kind op", spec->op,
                     shape, spec->dtype, kind);
        return khub__fail(rt, st, "%s", report ? report : "self-test: bad shape");
    }
    if (st == KHUB_STATUS_UNSUPPORTED && b.no_test) {
        khub__errbuf(report, n, "%s: no numeric self-test for this kind", spec->op);
        return st;
    }
    if (st != KHUB_STATUS_OK) {
        khub__errbuf(report, n, "%s [%s] %s%s%s: %s", spec->op, shape, spec->dtype,
                     b.layout[0] ? " with " : "", b.layout, why[0] ? why : khub_status_str(st));
        return khub__fail(rt, st, "%s", report ? report : why);
    }
    if (nmse_out) *nmse_out = score;
    int ok = score <= spec->tolerance;
    char cases[256] = "";
    if (b.scored && ok)
        snprintf(cases, sizeof cases, " over %d layouts", b.n_cases);
    else if (b.scored)
        snprintf(cases, sizeof cases, " with %s", b.worst);
    khub__errbuf(report, n, "%s [%s] %s: NMSE %.3g %s %.3g%s", spec->op, shape, spec->dtype, score,
                 ok ? "<=" : ">", spec->tolerance, cases);
    if (!ok) return khub__fail(rt, KHUB_STATUS_ERROR, "self-test failed: %s", report ? report : "");
    return KHUB_STATUS_OK;
}

khub_status khub__selftest_time(khub_runtime *rt, const char *plugin_id,
                                const khub_selftest_spec *spec, double min_s, double *us_test,
                                double *us_ref)
{
    *us_test = *us_ref = 0;
    uint32_t kind = kind_of_op(rt, plugin_id, spec->op);
    KHUB_RETURN_IF(rt, !kind, KHUB_STATUS_NO_KERNEL, "%s: no op named %s is loaded", plugin_id,
                   spec->op);
    int64_t strict = 0;
    khub_runtime_get_option(rt, KHUB_OPT_STRICT, &strict);
    khub_runtime_set_option(rt, KHUB_OPT_STRICT, 1);
    bench b = {.rt = rt, .rng = 0x9E3779B97F4A7C15ull, .min_s = min_s > 0 ? min_s : 0.2};
    result res = {0};
    khub_status st = run_kind(&b, kind, plugin_id, spec, &res);
    khub__registry_drop_owned(rt, &b); /* nothing calls them any more */
    char why[KHUB_ERROR_SIZE];
    khub__copy_error(rt, why, sizeof why); /* set_option clears the message */
    khub_runtime_set_option(rt, KHUB_OPT_STRICT, strict);
    khub__st_bench_free(&b);
    if (st == KHUB_STATUS_INVALID_ARG) {
        char shape[96];
        shape_str(spec, shape, sizeof shape);
        return khub__fail(rt, st, "%s [%s] %s: shape or dtype does not fit a %u-kind op", spec->op,
                          shape, spec->dtype, kind);
    }
    if (st == KHUB_STATUS_UNSUPPORTED && b.no_test)
        return khub__fail(rt, st, "%s: no timing for this kind of op", spec->op);
    if (st != KHUB_STATUS_OK) return khub__fail(rt, st, "%s", why[0] ? why : khub_status_str(st));
    *us_test = b.us[0];
    *us_ref = b.us[1];
    return KHUB_STATUS_OK;
}

double khub__selftest_work(uint32_t kind, const khub_selftest_spec *s, int *is_flops)
{
    const int64_t *d = s->shape;
    double w = 0;
    *is_flops = 0;
    if ((kind == KHUB_OP_NORM || kind == KHUB_OP_ACTIVATION) && s->ndim == 2)
        w = 4.0 * 4 * (double)d[0] * (double)d[1]; /* f32, per element: 2 read, 2 written */
    else if (kind == KHUB_OP_ROTARY && s->ndim == 3)
        w = 2.0 * 4 * (double)d[0] * (double)d[1] * (double)d[2]; /* read and written once */
    else if (kind == KHUB_OP_KV_CACHE && s->ndim == 4)
        w = 4.0 * 4 * (double)d[0] * (double)d[1] * (double)d[2] * (double)d[3]; /* K,V in+out */
    else if (kind == KHUB_OP_EMBEDDING && s->ndim == 3)
        w = 4.0 * (double)d[0] * (double)d[2]; /* f32 rows written (the table's reads vary) */
    else if ((kind == KHUB_OP_LINEAR || kind == KHUB_OP_QLINEAR) && s->ndim == 3)
        *is_flops = 1, w = 2.0 * (double)d[0] * (double)d[1] * (double)d[2];
    else if (kind == KHUB_OP_ATTENTION && s->ndim >= 4) /* QK^T and PV, before causal masking */
        *is_flops = 1,
        w = 4.0 * (double)d[0] * (double)d[1] * (double)d[3] * (double)(s->ndim == 5 ? d[4] : d[0]);
    return w;
}

uint32_t khub__selftest_kind(khub_runtime *rt, const char *plugin_id, const char *op)
{
    return kind_of_op(rt, plugin_id, op);
}
