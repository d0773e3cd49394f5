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
 * ones after the plugin's call; q is copied anyway, as for attention. Its
 * reference is khub/ref-cpu's op of the pools' KV layout (a layout the
 * reference does not read is not checked). A plugin that writes into the
 * pools would not be caught by the outputs alone (the reference reads the
 * pools as the plugin left them, and the damage shows only in later
 * steps), so every pool block the call's block tables reach (K, V, and
 * their scales for a Q8 layout) gets a 64-bit digest before the plugin's
 * call, compared after it: a change is KERNEL_MISMATCH naming the op, the
 * layer, the pool, the block and the sequence. The digest reads what the
 * op reads, once before and once after: bounded by the op's own reads, and
 * no copy of the pools. It is word-wise FNV-1a (xor then multiply by an odd
 * constant, both bijections of the state), so a change of any one 64-bit
 * word always changes it; changes of several words collide with
 * probability about 2^-64. Rejected: a copy of the blocks (exact, and it
 * could undo the damage, but memory the size of the sequences' caches per
 * checked call) and SHA-256 (several times slower, for no need of a
 * cryptographic digest against a kernel that is already trusted to run).
 * Checking allocates scratch per checked call; it is a diagnostic, not a
 * fast path.
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

/* ======================================================================== */
/* The paged pools' blocks a call reads, and their digests                  */
/* ======================================================================== */

enum { POOL_K, POOL_V, POOL_K_SCALES, POOL_V_SCALES, N_POOLS };

static const char *const pool_name[N_POOLS] = {"the K pool", "the V pool", "the K scales",
                                               "the V scales"};

/* The pools of a paged_attention call and a digest per (sequence, block)
 * its block tables reach, per pool. */
typedef struct pools {
    const khub_paged_attention_args *a;
    const unsigned char *base[N_POOLS]; /* NULL: the pool is absent (no scales) */
    size_t block_bytes[N_POOLS];        /* bytes of one block in each pool */
    int64_t n_blocks;                   /* blocks in each pool */
    uint64_t *sum;                      /* [n_reads][N_POOLS] */
    size_t n_reads;
} pools;

/* 64-bit FNV-1a over n bytes, a word at a time (see the top of the file). */
static uint64_t digest(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x100000001b3u;
    }
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

/* Block j of sequence s's row in the block table. */
static int32_t block_of(const khub_paged_attention_args *a, int32_t s, int64_t j)
{
    int64_t row = a->seq_rows ? a->seq_rows[s] : s;
    return a->block_table[row * a->block_table_stride + j];
}

static int64_t blocks_read(const khub_paged_attention_args *a, int32_t s)
{
    return (a->kv_lens[s] + a->block_size - 1) / a->block_size;
}

/* Whether t is a compact CPU pool of n_blocks blocks; its block's bytes. */
static bool pool_of(const khub_tensor *t, int64_t n_blocks, size_t *block_bytes)
{
    if (!on_cpu(t) || t->strides || t->ndim < 1 || t->shape[0] != n_blocks || n_blocks <= 0)
        return false;
    *block_bytes = numel(t) / (size_t)n_blocks * ((size_t)t->dtype.bits * t->dtype.lanes / 8);
    return true;
}

/* Fills the digests of every block a reads into sums ([n_reads][N_POOLS]);
 * a block id outside the pools (the op refuses it) gets 0. */
static void pools_digest(const pools *p, uint64_t *sums)
{
    const khub_paged_attention_args *a = p->a;
    size_t r = 0;
    for (int32_t s = 0; s < a->n_seqs; s++)
        for (int64_t j = 0; j < blocks_read(a, s); j++, r++) {
            int32_t id = block_of(a, s, j);
            for (int k = 0; k < N_POOLS; k++)
                sums[r * N_POOLS + k] =
                    p->base[k] && id >= 0 && id < p->n_blocks
                        ? digest(p->base[k] + (size_t)id * p->block_bytes[k], p->block_bytes[k])
                        : 0;
        }
}

/* Takes the digests of the pools' blocks that a reads before the plugin's
 * call; false when the pools are not compact CPU tensors (or out of memory:
 * then the call is not checked). */
static bool pools_before(khub_runtime *rt, pools *p, const khub_paged_attention_args *a)
{
    memset(p, 0, sizeof *p);
    p->a = a;
    p->n_blocks = a->k_pool && a->k_pool->ndim >= 1 ? a->k_pool->shape[0] : 0;
    const khub_tensor *t[N_POOLS] = {a->k_pool, a->v_pool, a->k_scales, a->v_scales};
    for (int k = 0; k < N_POOLS; k++) {
        if (!t[k] && k >= POOL_K_SCALES) continue;
        if (!pool_of(t[k], p->n_blocks, &p->block_bytes[k])) return false;
        p->base[k] = (const unsigned char *)t[k]->data + t[k]->byte_offset;
    }
    if (a->block_size < 1 || a->n_seqs < 1) return false;
    for (int32_t s = 0; s < a->n_seqs; s++) p->n_reads += (size_t)blocks_read(a, s);
    p->sum = khub__malloc(rt, p->n_reads * N_POOLS * sizeof *p->sum + 1);
    if (!p->sum) return false;
    pools_digest(p, p->sum);
    return true;
}

static void pools_free(khub_runtime *rt, pools *p)
{
    if (p->sum) khub__free(rt, p->sum, p->n_reads * N_POOLS * sizeof *p->sum + 1);
    p->sum = NULL;
}

/* After the plugin's call: KERNEL_MISMATCH when a block it reads changed,
 * naming the first (pool, block, sequence) and how many changed. */
static khub_status pools_after(khub_model *m, pools *p, const khub_binding *b, const char *what,
                               int layer)
{
    uint64_t *now = khub__malloc(m->rt, p->n_reads * N_POOLS * sizeof *now + 1);
    KHUB_RETURN_IF(m->rt, !now, KHUB_STATUS_NOMEM, "%s: verify: out of memory", m->file);
    pools_digest(p, now);
    size_t changed = 0, first = SIZE_MAX;
    for (size_t i = 0; i < p->n_reads * N_POOLS; i++)
        if (now[i] != p->sum[i]) {
            changed++;
            if (first == SIZE_MAX) first = i;
        }
    khub__free(m->rt, now, p->n_reads * N_POOLS * sizeof *now + 1);
    if (!changed) return KHUB_STATUS_OK;
    size_t present = 0;
    for (int k = 0; k < N_POOLS; k++) present += p->base[k] != NULL;
    size_t r = first / N_POOLS, k = first % N_POOLS, seen = 0;
    int32_t s = 0;
    while (seen + (size_t)blocks_read(p->a, s) <= r) seen += (size_t)blocks_read(p->a, s++);
    int64_t j = (int64_t)(r - seen);
    return khub__fail(m->rt, KHUB_STATUS_KERNEL_MISMATCH,
                      "%s: KHUB_OPT_VERIFY_KERNELS: %s (%s, layer %d) wrote into the read-only "
                      "KV pools: block %d of %s (sequence %d's block %lld) changed, %zu of the "
                      "%zu blocks read",
                      m->file, khub_binding_name(b), what, layer, (int)block_of(p->a, s, j),
                      pool_name[k], (int)s, (long long)j, changed, p->n_reads * present);
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
    if (khub__registry_select_for(m->rt, &q, m, &r) == KHUB_STATUS_OK) {
        if (!strncmp(khub_binding_name(r), REF_PLUGIN " ", strlen(REF_PLUGIN) + 1))
            m->verify_ref[kind] = r;
        else
            khub__registry_drop(m->rt, r); /* another plugin's: not a reference */
    }
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
    pools pl = {0};
    bool paged = b->kind == KHUB_OP_PAGED_ATTENTION && pools_before(rt, &pl, args);
    khub_status st = khub_binding_call(b, args);
    if (st == KHUB_STATUS_OK && paged) st = pools_after(m, &pl, b, what, layer);
    pools_free(rt, &pl);
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
