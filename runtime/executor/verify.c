/*
 * verify.c: the runtime cross-check of kernels against khub/ref-cpu
 * (KHUB_OPT_VERIFY_KERNELS, `khub run --verify-kernels`).
 *
 * A kernel's self-test runs a few shapes; a kernel can pass them and still
 * be wrong on the shapes a model uses. With the option at N, one call in N
 * of each op kind made by the forward pass is checked: the inputs an op may
 * overwrite are copied first, the plugin's op runs on the real buffers (so
 * the model computes exactly what it would without the check), then
 * khub/ref-cpu's op of the same kind runs on the copies with outputs of its
 * own, and the NMSE of each output against the reference's must stay under
 * the kind's tolerance. A mismatch fails the call with KERNEL_MISMATCH.
 *
 * Covered kinds are the run ops of the forward pass with f32 activations:
 * norm (y, and the fused residual), activation, rotary (in place), linear
 * and qlinear (y), attention (out) and paged_attention (out: the paged
 * pool's one call per layer for a whole batch, the library's default for a
 * model of several sequences). The KV cache's methods and the embedding's
 * dequantize are not checked, nor are CUDA ops (the reference cannot read
 * device memory).
 *
 * paged_attention: the pools and tables are the cache's and are read-only
 * to the op (khub_paged_attention_args), so the reference reads the same
 * ones after the plugin's call, which wrote only out; q is copied anyway,
 * as for attention. Its reference is khub/ref-cpu's op of the pools' KV
 * layout (a layout the reference does not read is not checked). Checking
 * allocates scratch per checked call; it is a diagnostic, not a fast path.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "executor.h"
#include "runtime_impl.h"

#define REF_PLUGIN "khub/ref-cpu"

/* NMSE tolerance per kind: f32 against f32 (linear: weights of any dtype,
 * dequantized the same way by both sides, summed in another order). */
static double tolerance(uint32_t kind)
{
    switch (kind) {
    case KHUB_OP_LINEAR:
    case KHUB_OP_QLINEAR:
    case KHUB_OP_ATTENTION:
    case KHUB_OP_PAGED_ATTENTION: return 1e-4;
    default: return 1e-5;
    }
}

static size_t numel(const khub_tensor *t)
{
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* Only compact f32 CPU tensors are copied and compared. */
static bool plain_f32(const khub_tensor *t)
{
    return t && t->data && !t->strides && !t->byte_offset &&
           t->device.device_type == KHUB_DEVICE_CPU && t->dtype.code == KHUB_DTYPE_F32.code &&
           t->dtype.bits == 32 && t->dtype.lanes == 1;
}

static bool on_cpu(const khub_tensor *t)
{
    return t && t->data && t->device.device_type == KHUB_DEVICE_CPU;
}

static double nmse(const float *y, const float *r, size_t n)
{
    double err = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)y[i] - (double)r[i];
        err += d * d;
        ref += (double)r[i] * (double)r[i];
    }
    if (!isfinite(err)) return INFINITY;
    return err / (ref > 1e-30 ? ref : 1e-30);
}

/* A scratch tensor shaped like t: its data is a copy of t's (copy) or
 * uninitialised. */
typedef struct shadow {
    khub_tensor t;
    float *data;
    size_t n;
} shadow;

static bool shadow_of(khub_runtime *rt, shadow *s, const khub_tensor *t, bool copy)
{
    s->t = *t;
    s->n = numel(t);
    s->data = khub__malloc(rt, s->n * sizeof(float) + 1);
    if (!s->data) return false;
    if (copy) memcpy(s->data, t->data, s->n * sizeof(float));
    s->t.data = s->data;
    return true;
}

static void shadow_free(khub_runtime *rt, shadow *s)
{
    if (s->data) khub__free(rt, s->data, s->n * sizeof(float) + 1);
    s->data = NULL;
}

/* The reference binding for b's kind, made on first use (NULL: none). */
static khub_binding *ref_binding(khub_model *m, uint32_t kind, const void *args)
{
    if (m->verify_ref[kind]) return m->verify_ref[kind];
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = kind, .dtype_id = -1,
                       .plugin_id = REF_PLUGIN};
    if (kind == KHUB_OP_LINEAR || kind == KHUB_OP_QLINEAR)
        q.dtype_id = khub_dtype_id_of(((const khub_linear_args *)args)->weight->dtype);
    if (kind == KHUB_OP_PAGED_ATTENTION)
        q.kv_layout = ((const khub_paged_attention_args *)args)->layout; /* a model has one */
    khub_binding *r = NULL;
    if (khub_registry_select(m->rt, &q, &r) == KHUB_STATUS_OK &&
        !strncmp(khub_binding_name(r), REF_PLUGIN " ", strlen(REF_PLUGIN) + 1))
        m->verify_ref[kind] = r;
    khub__clear(m->rt);
    return m->verify_ref[kind];
}

/* What one checked call compares: up to two outputs of the plugin's call
 * (out[i], in the model's buffers) against the reference's (ref[i]). */
typedef struct check {
    const khub_tensor *out[2];
    shadow ref[2];
    shadow in[3]; /* copies of the inputs the plugin may overwrite */
    int n_out, n_in;
} check;

/* Fills args_ref (a copy of args pointing at shadows) and c for one kind;
 * false when the call's tensors are not plain f32 (then it is not checked). */
/* The attention kinds (dense and paged): q copied for the reference, whose
 * out is its own; the plugin's out is what is compared. */
static bool shadow_q_out(khub_runtime *rt, check *c, const khub_tensor *q, const khub_tensor *out,
                         const khub_tensor **ref_q, khub_tensor **ref_out)
{
    bool ok = shadow_of(rt, &c->in[c->n_in++], q, true) && shadow_of(rt, &c->ref[0], out, false);
    *ref_q = &c->in[0].t;
    *ref_out = &c->ref[0].t;
    c->out[0] = out;
    c->n_out = 1;
    return ok;
}

static bool prepare(khub_runtime *rt, uint32_t kind, const void *args, void *args_ref, check *c)
{
    bool ok = true;
    switch (kind) {
    case KHUB_OP_NORM: {
        const khub_norm_args *a = args;
        khub_norm_args *r = args_ref;
        *r = *a;
        if (!plain_f32(a->x) || !plain_f32(a->y) || (a->residual && !plain_f32(a->residual)))
            return false;
        ok = shadow_of(rt, &c->in[c->n_in++], a->x, true);
        r->x = &c->in[0].t;
        if (ok && a->residual) {
            ok = shadow_of(rt, &c->ref[1], a->residual, true);
            r->residual = &c->ref[1].t;
            c->out[1] = a->residual;
        }
        ok = ok && shadow_of(rt, &c->ref[0], a->y, false);
        r->y = &c->ref[0].t;
        c->out[0] = a->y;
        c->n_out = a->residual ? 2 : 1;
        return ok;
    }
    case KHUB_OP_ACTIVATION: {
        const khub_activation_args *a = args;
        khub_activation_args *r = args_ref;
        *r = *a;
        if (!plain_f32(a->gate) || !plain_f32(a->up) || !plain_f32(a->y)) return false;
        ok = shadow_of(rt, &c->in[c->n_in++], a->gate, true) &&
             shadow_of(rt, &c->in[c->n_in++], a->up, true) &&
             shadow_of(rt, &c->ref[0], a->y, false);
        r->gate = &c->in[0].t;
        r->up = &c->in[1].t;
        r->y = &c->ref[0].t;
        c->out[0] = a->y;
        c->n_out = 1;
        return ok;
    }
    case KHUB_OP_ROTARY: {
        const khub_rotary_args *a = args;
        khub_rotary_args *r = args_ref;
        *r = *a;
        if (!plain_f32(a->x)) return false;
        ok = shadow_of(rt, &c->ref[0], a->x, true);
        r->x = &c->ref[0].t;
        c->out[0] = a->x;
        c->n_out = 1;
        return ok;
    }
    case KHUB_OP_LINEAR:
    case KHUB_OP_QLINEAR: {
        const khub_linear_args *a = args;
        khub_linear_args *r = args_ref;
        *r = *a;
        if (!plain_f32(a->x) || !plain_f32(a->y)) return false;
        ok = shadow_of(rt, &c->in[c->n_in++], a->x, true) && shadow_of(rt, &c->ref[0], a->y, false);
        r->x = &c->in[0].t;
        r->y = &c->ref[0].t;
        c->out[0] = a->y;
        c->n_out = 1;
        return ok;
    }
    case KHUB_OP_ATTENTION: {
        const khub_attention_args *a = args;
        khub_attention_args *r = args_ref;
        *r = *a;
        if (!plain_f32(a->q) || !plain_f32(a->out)) return false;
        return shadow_q_out(rt, c, a->q, a->out, &r->q, &r->out);
    }
    case KHUB_OP_PAGED_ATTENTION: {
        const khub_paged_attention_args *a = args;
        khub_paged_attention_args *r = args_ref;
        *r = *a;
        if (!plain_f32(a->q) || !plain_f32(a->out) || !on_cpu(a->k_pool) || !on_cpu(a->v_pool) ||
            (a->ctx && a->ctx->device.device_type != KHUB_DEVICE_CPU))
            return false;
        return shadow_q_out(rt, c, a->q, a->out, &r->q, &r->out);
    }
    default: return false;
    }
}

static void check_free(khub_runtime *rt, check *c)
{
    for (int i = 0; i < 2; i++) shadow_free(rt, &c->ref[i]);
    for (int i = 0; i < 3; i++) shadow_free(rt, &c->in[i]);
}

static const char *out_name(uint32_t kind, int i)
{
    if (kind == KHUB_OP_NORM) return i ? "residual" : "y";
    if (kind == KHUB_OP_ROTARY) return "x";
    if (kind == KHUB_OP_ATTENTION || kind == KHUB_OP_PAGED_ATTENTION) return "out";
    return "y";
}

/* Runs b (the plugin) on args and the reference on the copies; compares. */
static khub_status cross_check(khub_model *m, khub_binding *b, khub_binding *ref, const void *args,
                               const char *what, int layer)
{
    khub_runtime *rt = m->rt;
    union {
        khub_norm_args n;
        khub_activation_args a;
        khub_rotary_args r;
        khub_linear_args l;
        khub_attention_args t;
        khub_paged_attention_args p;
    } args_ref;
    check c;
    memset(&c, 0, sizeof c);
    if (!prepare(rt, b->kind, args, &args_ref, &c)) {
        check_free(rt, &c);
        return khub_binding_call(b, args);
    }
    khub_status st = khub_binding_call(b, args);
    if (st != KHUB_STATUS_OK) {
        check_free(rt, &c);
        return st;
    }
    if (khub_binding_call(ref, &args_ref) != KHUB_STATUS_OK) {
        khub__log(rt, KHUB_LOG_DEBUG, "verify: %s cannot check %s: %s", REF_PLUGIN,
                  khub_binding_name(b), khub_runtime_errmsg(rt));
        khub__clear(rt);
        check_free(rt, &c);
        return KHUB_STATUS_OK;
    }
    for (int i = 0; i < c.n_out && st == KHUB_STATUS_OK; i++) {
        double e = nmse(c.out[i]->data, c.ref[i].data, c.ref[i].n);
        if (!(e <= tolerance(b->kind)))
            st = khub__fail(
                rt, KHUB_STATUS_KERNEL_MISMATCH,
                "%s: KHUB_OPT_VERIFY_KERNELS: %s (%s, layer %d) differs from %s: NMSE %.3g "
                "of %s over %zu values, tolerance %.0e",
                m->file, khub_binding_name(b), what, layer, REF_PLUGIN, e, out_name(b->kind, i),
                c.ref[i].n, tolerance(b->kind));
    }
    check_free(rt, &c);
    return st;
}

khub_status khub__verified_call(khub_model *m, khub_binding *b, const void *args, const char *what,
                                int layer)
{
    int every = m->rt->verify_kernels;
    if (every <= 0 || b->kind >= sizeof m->verify_ref / sizeof m->verify_ref[0])
        return khub_binding_call(b, args);
    if (m->verify_calls[b->kind]++ % every != 0) return khub_binding_call(b, args);
    if (!strncmp(khub_binding_name(b), REF_PLUGIN " ", strlen(REF_PLUGIN) + 1))
        return khub_binding_call(b, args); /* the oracle itself */
    khub_binding *ref = ref_binding(m, b->kind, args);
    if (!ref) return khub_binding_call(b, args);
    return cross_check(m, b, ref, args, what, layer);
}
