/*
 * forward_device.c: the forward pass of a model placed on a CUDA device
 * (placement.h; issue 19 items 1 and 4): the layer loop of forward.c with
 * the activations in device memory, every call on the model's one stream.
 *
 * What the host touches per step: the token ids (4 B per token, looked up
 * on the device by the embedding role's CUDA op; without one the host looks
 * their rows up in the host table and uploads those, hidden x 4 B per
 * token), the positions (4 B per token, uploaded when rotary runs on the
 * device) and the logits rows it downloads at the end. Everything else
 * stays on the device, except the inputs and outputs of a role placed on
 * the CPU (no CUDA op served it): those are downloaded into the host
 * scratch, the CPU op runs there, and its outputs go back up, exactly the
 * copies khub_model_explain names for that role. A CPU role therefore
 * synchronises the stream (twice per call); a model with every role on the
 * device synchronises once per step, to read the logits.
 *
 * The device scratch block mirrors the host scratch (forward.c's
 * khub__forward_alloc, the same buffers in the same order and sizes), so
 * each host buffer has a device twin. The KV cache is the device one (made
 * by the kv_cache role's CUDA op at load) when that role is on the device,
 * else the model's host cache with attention on the host too: a cache and
 * its attention on different sides are refused (UNSUPPORTED, saying so)
 * rather than copying every cached position each layer. A paged cache runs
 * only on the device, with paged attention there too: its blocks are
 * reserved before layer 0 (the scheduler's budget asks the device pool,
 * kv_budget.c; a 1.5 cache copies its block table on the model's stream,
 * before the step's graph when it runs as one), the call's int32 arrays go
 * up once per step, and each layer appends K/V into the blocks and makes
 * one paged_attention call (device_kv.c holds the pool's side). Kernel verification
 * (KHUB_OPT_VERIFY_KERNELS) does not apply to device ops: ref-cpu cannot
 * read device memory.
 *
 * A decode step may run as a CUDA graph (forward_graph.c): the body
 * (khub__forward_device_body: every op call, the embedding's first, nothing
 * copied to or from the host) is what gets captured, so it must not
 * synchronise or use the legacy stream, and it may run twice for one step
 * (once captured, then plainly after a failed capture): whatever it changes
 * on the host is set, not accumulated (the sequence lengths grow after it).
 *
 * Nothing here is numerically checked without a GPU: on the fake driver
 * (tests/fake_cuda) the kernels do not run, so tests/test_device_forward.c
 * checks the order and arguments of the launches and copies, and
 * tools/gpu-check.sh step 7 compares the greedy tokens with the CPU's.
 */
#include <math.h>
#include <string.h>

#include "contain.h"
#include "cuda.h"
#include "executor.h"
#include "placement.h"
#include "runtime_impl.h"

/* A tensor with its own shape/stride storage (as forward.c's). */
typedef struct tview {
    khub_tensor t;
    int64_t shape[3];
    int64_t strides[3];
} tview;

/* Where a call's tensor lives: the model's device (its ordinal: a CUDA
 * op keeps its modules per device and picks them by it) or the host. */
static khub_device where(const khub_model *m, bool dev)
{
    return dev ? (khub_device){KHUB_DEVICE_CUDA, m->place->device}
               : (khub_device){KHUB_DEVICE_CPU, 0};
}

static khub_tensor *tens(tview *v, void *data, khub_device d, int ndim, int64_t a, int64_t b,
                         int64_t c)
{
    memset(v, 0, sizeof *v);
    v->shape[0] = a, v->shape[1] = b, v->shape[2] = c;
    v->t.data = data;
    v->t.device = d;
    v->t.ndim = ndim;
    v->t.dtype = KHUB_DTYPE_F32;
    v->t.shape = v->shape;
    return &v->t;
}

/* ======================================================================== */
/* Device twins of the host scratch                                         */
/* ======================================================================== */

/* B_PA: the int32 arrays of a paged attention call (cu_seqlens_q, q_pos0,
 * kv_lens, seq_rows: m->pa_ints' twin), only with a paged device cache.
 * B_IDS: the step's token ids (int32), only when the embedding role is on
 * the device; no host twin: they go up from the caller's array into this
 * fixed buffer before the body runs, so a captured decode step's embedding
 * launch reads each step's ids (placement.c adds both to the scratch). */
enum {
    B_X,
    B_XB,
    B_OB,
    B_Q,
    B_ATT,
    B_K,
    B_V,
    B_GATE,
    B_UP,
    B_LAST,
    B_LOGITS,
    B_POS,
    B_PA,
    B_IDS,
    B__COUNT
};
_Static_assert(B__COUNT == sizeof(((khub__place *)0)->dbuf) / sizeof(uint64_t),
               "placement.h's dbuf holds one device address per buffer");

static float **host_buf(khub_model *m, int b)
{
    float **bufs[B__COUNT] = {&m->x,    &m->xb, &m->ob,   &m->q,      &m->att, &m->k, &m->v,
                              &m->gate, &m->up, &m->last, &m->logits, NULL,    NULL,  NULL};
    return bufs[b];
}

/* A value of buffer b (row-major) as a device address, elem elements in. */
static uint64_t dev_at(const khub_model *m, int b, int64_t elem)
{
    return m->place->dbuf[b] + (uint64_t)elem * 4u;
}

static void *dev_ptr(const khub_model *m, int b, int64_t elem)
{
    return (void *)(uintptr_t)dev_at(m, b, elem);
}

static float *host_at(khub_model *m, int b, int64_t elem)
{
    if (b == B_PA) return (float *)(void *)(m->pa_ints + elem);
    return b == B_POS ? (float *)m->positions + elem : *host_buf(m, b) + elem;
}

khub_status khub__forward_device_init(khub_model *m)
{
    const khub_model_config *c = &m->cfg;
    khub__place *pl = m->place;
    int64_t B = m->max_batch, S = m->max_seqs, qd = c->n_heads * c->head_dim,
            kvd = c->n_kv_heads * c->head_dim, f = c->intermediate_size, h = c->hidden_size;
    int64_t elems[B__COUNT] = {B * h,
                               B * h,
                               B * h,
                               B * qd,
                               B * qd,
                               B * kvd,
                               B * kvd,
                               B * f,
                               B * f,
                               S * h,
                               S * c->vocab_size,
                               B,
                               m->kv_layout ? 4 * S + 1 : 0,
                               pl->cuda[KHUB__ROLE_EMBEDDING] ? B : 0};
    uint64_t off = 0;
    for (int b = 0; b < B__COUNT; b++) {
        pl->dbuf[b] = pl->scratch_dptr + off;
        off += (uint64_t)elems[b] * 4u;
    }
    KHUB_RETURN_IF(m->rt, off > pl->scratch_bytes, KHUB_STATUS_INTERNAL,
                   "%s: device scratch of %llu B holds %llu B of activations", m->file,
                   (unsigned long long)pl->scratch_bytes, (unsigned long long)off);
    if (!pl->cuda[KHUB__ROLE_KV_CACHE]) return KHUB_STATUS_OK;
    /* The cache on the device: the kv_cache role's CUDA op makes its own. */
    const khub_op_desc *op = khub_binding_acquire(pl->cuda[KHUB__ROLE_KV_CACHE], &pl->dkv_state);
    pl->dkv = op ? op->methods : NULL;
    if (op) pl->dkv_minor = pl->cuda[KHUB__ROLE_KV_CACHE]->plugin->abi_minor; /* pinned */
    khub_binding_release(pl->cuda[KHUB__ROLE_KV_CACHE]);
    KHUB_RETURN_IF(m->rt,
                   !pl->dkv || !pl->dkv->create || !pl->dkv->destroy || !pl->dkv->write ||
                       !pl->dkv->view || !pl->dkv->truncate,
                   KHUB_STATUS_PLUGIN_INVALID, "%s: %s lacks a KV cache method", m->file,
                   khub_binding_name(pl->cuda[KHUB__ROLE_KV_CACHE]));
    /* A paged cache is sized as the host's was (the same config). A cache
     * of ABI 1.5 gets the model's stream for its own copies (a paged one's
     * reserve and release), so they run in order with the steps and never
     * on the legacy stream, which a CUDA graph capture cannot hold. */
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CUDA, pl->device},
                         .stream = pl->stream};
    khub_kv_cache_config cc = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                               .n_layers = (int32_t)c->n_layers,
                               .n_kv_heads = (int32_t)c->n_kv_heads,
                               .head_dim = (int32_t)c->head_dim,
                               .n_seqs = m->max_seqs,
                               .max_tokens = m->max_context,
                               .dtype = m->kv_dtype,
                               .options = m->kv_options[0] ? m->kv_options : NULL,
                               .block_size = m->kv_block_size,
                               .n_blocks = m->kv_num_blocks,
                               .max_bytes = m->kv_max_bytes,
                               .ctx = pl->dkv_minor >= 5 ? &ctx : NULL};
    khub__plugin_msg_clear();
    khub_status st = pl->dkv->create(pl->dkv_state, &cc, &pl->dcache);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st,
                   "%s: cuda:%d: creating the device KV cache (%lld tokens x %d sequences) in %s: "
                   "%s",
                   m->file, (int)pl->device, (long long)m->max_context, (int)m->max_seqs,
                   khub_binding_name(pl->cuda[KHUB__ROLE_KV_CACHE]), khub__plugin_msg());
    return m->kv_layout ? khub__device_pool_init(m) : KHUB_STATUS_OK;
}

void khub__forward_device_free(khub_model *m)
{
    khub__place *pl = m->place;
    if (pl && pl->dcache) pl->dkv->destroy(pl->dkv_state, pl->dcache);
    if (pl) pl->dcache = NULL;
    if (pl) khub__free(m->rt, pl->dheld, pl->dheld ? (size_t)m->max_seqs * sizeof *pl->dheld : 0);
    if (pl) pl->dheld = NULL;
}

/* ======================================================================== */
/* Copies for the roles on the CPU                                          */
/* ======================================================================== */

/* One buffer range a CPU role reads or writes. */
typedef struct span {
    int buf;
    int64_t off, n; /* elements */
} span;

static khub_status sync(khub_model *m, const char *what, int layer)
{
    khub__plugin_msg_clear();
    khub_status st = khub__cuda_host_stream_sync(NULL, m->place->stream);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: cuda:%d: layer %d %s: %s", m->file,
                   (int)m->place->device, layer, what, khub__plugin_msg());
    return KHUB_STATUS_OK;
}

static khub_status down(khub_model *m, const span *s, int n, const char *what, int layer)
{
    for (int i = 0; i < n; i++) {
        khub__plugin_msg_clear();
        khub_status st = khub__cuda_host_memcpy_dtoh(NULL, host_at(m, s[i].buf, s[i].off),
                                                     dev_at(m, s[i].buf, s[i].off),
                                                     (size_t)s[i].n * 4u, m->place->stream);
        KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: cuda:%d: layer %d %s: %s", m->file,
                       (int)m->place->device, layer, what, khub__plugin_msg());
    }
    return sync(m, what, layer);
}

/* Copies up without waiting: the caller makes sure the host buffers are
 * not written before the stream passes the copies. */
static khub_status up_async(khub_model *m, const span *s, int n, const char *what, int layer)
{
    for (int i = 0; i < n; i++) {
        khub__plugin_msg_clear();
        khub_status st = khub__cuda_host_memcpy_htod(NULL, dev_at(m, s[i].buf, s[i].off),
                                                     host_at(m, s[i].buf, s[i].off),
                                                     (size_t)s[i].n * 4u, m->place->stream);
        KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: cuda:%d: layer %d %s: %s", m->file,
                       (int)m->place->device, layer, what, khub__plugin_msg());
    }
    return KHUB_STATUS_OK;
}

/* The host buffers must outlive the asynchronous copies: synchronised. */
static khub_status up(khub_model *m, const span *s, int n, const char *what, int layer)
{
    KHUB_FORWARD_IF_ERROR(m->rt, up_async(m, s, n, what, layer));
    return sync(m, what, layer);
}

/* ======================================================================== */
/* One call per role: on the device, or on the CPU between copies          */
/* ======================================================================== */

static khub_status call(khub_model *m, khub_binding *b, const void *args, const char *what,
                        int layer)
{
    khub__inflight_role(what, layer);
    khub__plugin_msg_clear();
    khub_status st = khub_binding_call(b, args);
    khub__inflight_role(NULL, -1);
    if (st == KHUB_STATUS_OK) return st;
    /* The op's own message (on the runtime, or the driver layer's) goes
     * after where it failed: the first error would otherwise win alone. */
    char why[KHUB_ERROR_SIZE];
    khub__copy_error(m->rt, why, sizeof why);
    if (!why[0]) snprintf(why, sizeof why, "%s", khub__plugin_msg());
    khub__clear(m->rt);
    return khub__fail(m->rt, st, "%s: cuda:%d: layer %d %s failed: %s", m->file,
                      (int)m->place->device, layer, what, why[0] ? why : khub_binding_name(b));
}

/* The weight tensor of w as the op sees it: its device copy or the host's. */
static khub_tensor weight_t(const khub_model *m, const khub__weight *w, bool dev)
{
    khub_tensor t = w->t;
    if (dev) {
        t.data = (void *)(uintptr_t)w->dptr;
        t.device = where(m, true);
    }
    return t;
}

/* The CUDA op for a matrix's binding (a role bound per weight dtype has one
 * per binding), NULL when the role runs on the CPU. */
static khub_binding *cuda_of(const khub_model *m, khub_binding *cpu, khub__role role)
{
    if (!m->place->cuda[role]) return NULL;
    for (int i = 0; i < m->n_bound; i++)
        if (m->bound[i].b == cpu && m->bound[i].role == role && m->place->cuda_of[i])
            return m->place->cuda_of[i];
    return m->place->cuda[role];
}

/* linear's flags for a role on the CPU: x is on the host already (the
 * second and third projection of one input), y stays on the host (the
 * logits). */
enum { HAVE_X = 1, KEEP_Y = 2 };

static khub_status linear(khub_model *m, const khub__mat *mat, khub__role role, int xb, int yb,
                          int64_t n, int flags, const char *what, int layer)
{
    khub_binding *dev = cuda_of(m, mat->op, role);
    int64_t in = mat->w.shape[1], out = mat->w.shape[0];
    span x = {xb, 0, n * in}, y = {yb, 0, n * out};
    if (!dev && !(flags & HAVE_X)) KHUB_FORWARD_IF_ERROR(m->rt, down(m, &x, 1, what, layer));
    tview xv, yv;
    khub_tensor w = weight_t(m, &mat->w, dev), bias = weight_t(m, &mat->bias, dev);
    khub_linear_args a = {
        KHUB_STRUCT_INIT(khub_linear_args),
        .stream = dev ? m->place->stream : NULL,
        .x = tens(&xv, dev ? dev_ptr(m, xb, 0) : host_at(m, xb, 0), where(m, dev), 2, n, in, 0),
        .weight = &w,
        .bias = mat->bias.t.data ? &bias : NULL,
        .y = tens(&yv, dev ? dev_ptr(m, yb, 0) : host_at(m, yb, 0), where(m, dev), 2, n, out, 0)};
    KHUB_FORWARD_IF_ERROR(m->rt, call(m, dev ? dev : mat->op, &a, what, layer));
    return dev || (flags & KEEP_Y) ? KHUB_STATUS_OK : up(m, &y, 1, what, layer);
}

/* y = rms_norm(x (+ residual)) * w; x, residual and y are buffers of rows x dim. */
static khub_status norm(khub_model *m, int xb, int rb, const khub__weight *w, int64_t rows,
                        int64_t dim, int yb, const char *what, int layer)
{
    khub__role role = rb >= 0 ? KHUB__ROLE_NORM_RESIDUAL : KHUB__ROLE_NORM;
    khub_binding *dev = m->place->cuda[role];
    span in[2] = {{xb, 0, rows * dim}, {rb, 0, rows * dim}},
         out[2] = {{yb, 0, rows * dim}, {rb, 0, rows * dim}};
    int n_io = rb >= 0 ? 2 : 1;
    if (!dev) KHUB_FORWARD_IF_ERROR(m->rt, down(m, in, n_io, what, layer));
    tview xv, rv, yv;
    khub_tensor wt = weight_t(m, w, dev);
#define AT(b) (dev ? dev_ptr(m, b, 0) : (void *)host_at(m, b, 0))
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .stream = dev ? m->place->stream : NULL,
                        .norm_type = KHUB_NORM_RMS,
                        .eps = (float)m->cfg.rms_norm_eps,
                        .x = tens(&xv, AT(xb), where(m, dev), 2, rows, dim, 0),
                        .residual =
                            rb >= 0 ? tens(&rv, AT(rb), where(m, dev), 2, rows, dim, 0) : NULL,
                        .weight = &wt,
                        .y = tens(&yv, AT(yb), where(m, dev), 2, rows, dim, 0)};
    KHUB_FORWARD_IF_ERROR(m->rt,
                          call(m, dev ? dev : (rb >= 0 ? m->norm_res : m->norm), &a, what, layer));
    return dev ? KHUB_STATUS_OK : up(m, out, n_io, what, layer);
}

static khub_status rotary(khub_model *m, int xb, int64_t n, int64_t heads, int layer,
                          const char *what)
{
    const khub_model_config *c = &m->cfg;
    const khub__layer *ly = &m->layers[layer];
    khub_binding *dev = m->place->cuda[KHUB__ROLE_ROTARY];
    span s = {xb, 0, n * heads * c->head_dim};
    if (!dev) KHUB_FORWARD_IF_ERROR(m->rt, down(m, &s, 1, what, layer));
    bool local = ly->rope_theta != c->rope_theta; /* Gemma 3's local layers */
    tview xv;
    khub_rotary_args a = {KHUB_STRUCT_INIT(khub_rotary_args),
                          .stream = dev ? m->place->stream : NULL,
                          .x = tens(&xv, AT(xb), where(m, dev), 3, n, heads, c->head_dim),
                          .positions = dev ? dev_ptr(m, B_POS, 0) : m->positions,
                          .style = m->rope_style,
                          .scaling = local ? KHUB_ROPE_SCALING_NONE : c->rope_scaling,
                          .theta = (float)ly->rope_theta,
                          .factor = (float)c->rope_factor,
                          .low_freq_factor = (float)c->rope_low_freq_factor,
                          .high_freq_factor = (float)c->rope_high_freq_factor,
                          .original_max_pos = (int32_t)c->rope_original_max_pos};
    KHUB_FORWARD_IF_ERROR(m->rt, call(m, dev ? dev : m->rotary, &a, what, layer));
    return dev ? KHUB_STATUS_OK : up(m, &s, 1, what, layer);
}

static khub_status activation(khub_model *m, int64_t n, int layer)
{
    const khub_model_config *c = &m->cfg;
    khub_binding *dev = m->place->cuda[KHUB__ROLE_ACT];
    const char *what = c->act == KHUB_ACT_GELU_TANH ? "gelu_tanh_and_mul" : "silu_and_mul";
    int64_t f = c->intermediate_size;
    span in[2] = {{B_GATE, 0, n * f}, {B_UP, 0, n * f}}, out = {B_GATE, 0, n * f};
    if (!dev) KHUB_FORWARD_IF_ERROR(m->rt, down(m, in, 2, what, layer));
    tview gv, uv, yv;
    khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args),
                              .stream = dev ? m->place->stream : NULL,
                              .act_type = c->act,
                              .gate = tens(&gv, AT(B_GATE), where(m, dev), 2, n, f, 0),
                              .up = tens(&uv, AT(B_UP), where(m, dev), 2, n, f, 0),
                              .y = tens(&yv, AT(B_GATE), where(m, dev), 2, n, f, 0)};
    KHUB_FORWARD_IF_ERROR(m->rt, call(m, dev ? dev : m->act, &a, what, layer));
    return dev ? KHUB_STATUS_OK : up(m, &out, 1, what, layer);
}
#undef AT

/* ======================================================================== */
/* Attention                                                                */
/* ======================================================================== */

/* Appends segment g's K/V rows (from row off of the device scratch) to the
 * device cache, on the model's stream through ctx (ABI 1.5; a plugin of an
 * older minor gets the 1.0 args and appends on the legacy stream). */
static khub_status kv_write(khub_model *m, int layer, const khub__seg *g, int64_t off,
                            const khub_call_ctx *ctx)
{
    const khub_model_config *c = &m->cfg;
    khub__place *pl = m->place;
    int64_t hd = c->head_dim, kvdim = c->n_kv_heads * hd;
    tview kw, vw;
    khub_kv_write_args w = {
        KHUB_STRUCT_INIT(khub_kv_write_args),
        .layer = layer,
        .seq = g->seq,
        .pos = g->pos0,
        .k = tens(&kw, dev_ptr(m, B_K, off * kvdim), where(m, true), 3, g->n, c->n_kv_heads, hd),
        .v = tens(&vw, dev_ptr(m, B_V, off * kvdim), where(m, true), 3, g->n, c->n_kv_heads, hd),
        .ctx = ctx};
    khub__args_buf cut;
    const khub_kv_write_args *sent =
        khub__args_for_minor(KHUB_OP_KV_CACHE, pl->dkv_minor, &w, &cut);
    khub__plugin_msg_clear();
    khub_status st = pl->dkv->write(pl->dkv_state, pl->dcache, sent);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st,
                   "%s: cuda:%d: layer %d kv_cache write failed in %s: %s", m->file,
                   (int)pl->device, layer, khub_binding_name(pl->cuda[KHUB__ROLE_KV_CACHE]),
                   khub__plugin_msg());
    return KHUB_STATUS_OK;
}
/* Cache write, view and attention per segment, all on the device. */
static khub_status attend_device(khub_model *m, const khub__layer *ly, int layer,
                                 const khub__seg *segs, int n_segs)
{
    const khub_model_config *c = &m->cfg;
    khub__place *pl = m->place;
    int64_t hd = c->head_dim, qdim = c->n_heads * hd, off = 0;
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CUDA, pl->device},
                         .stream = pl->stream};
    for (int s = 0; s < n_segs; s++) {
        const khub__seg *g = &segs[s];
        tview kc, vc, qv, ov;
        KHUB_FORWARD_IF_ERROR(m->rt, kv_write(m, layer, g, off, &ctx));
        khub_status st;
        tens(&kc, NULL, where(m, false), 3, 0, 0, 0);
        tens(&vc, NULL, where(m, false), 3, 0, 0, 0);
        kc.t.strides = kc.strides;
        vc.t.strides = vc.strides;
        khub__plugin_msg_clear();
        st = pl->dkv->view(pl->dkv_state, pl->dcache, layer, g->seq, g->pos0 + g->n, &kc.t, &vc.t);
        KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st,
                       "%s: cuda:%d: layer %d kv_cache view failed in %s: %s", m->file,
                       (int)pl->device, layer, khub_binding_name(pl->cuda[KHUB__ROLE_KV_CACHE]),
                       khub__plugin_msg());
        khub_attention_args a = {
            KHUB_STRUCT_INIT(khub_attention_args),
            .stream = pl->stream,
            .q = tens(&qv, dev_ptr(m, B_Q, off * qdim), where(m, true), 3, g->n, c->n_heads, hd),
            .k = &kc.t,
            .v = &vc.t,
            .out =
                tens(&ov, dev_ptr(m, B_ATT, off * qdim), where(m, true), 3, g->n, c->n_heads, hd),
            .scale = (float)(c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)hd)),
            .causal = 1,
            .q_pos0 = g->pos0,
            .window = ly->window,
            .softcap = (float)c->attn_softcap};
        KHUB_FORWARD_IF_ERROR(m->rt,
                              call(m, pl->cuda[KHUB__ROLE_ATTENTION], &a, "attention", layer));
        off += g->n;
    }
    return KHUB_STATUS_OK;
}

/* The host's cache and attention (forward.c), between copies of q, k, v
 * down and the attention output up. */
static khub_status attend_host(khub_model *m, int layer, int64_t n, const khub__seg *segs,
                               int n_segs)
{
    const khub_model_config *c = &m->cfg;
    int64_t qdim = c->n_heads * c->head_dim, kvdim = c->n_kv_heads * c->head_dim;
    span in[3] = {{B_Q, 0, n * qdim}, {B_K, 0, n * kvdim}, {B_V, 0, n * kvdim}},
         out = {B_ATT, 0, n * qdim};
    KHUB_FORWARD_IF_ERROR(m->rt, down(m, in, 3, "kv_cache write + attention", layer));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_attend_host(m, layer, segs, n_segs));
    return up(m, &out, 1, "attention", layer);
}

/* The paged path on the device (issue 19 item 2): every segment's K/V
 * appended into its blocks by the device cache, then one paged_attention
 * call for the whole batch over the layer's pools and the device block
 * table. The blocks were reserved before layer 0 and the int32 arrays of
 * the call (B_PA) went up with the step's inputs. */
static khub_status attend_device_paged(khub_model *m, const khub__layer *ly, int layer,
                                       const khub__seg *segs, int n_segs, int64_t n)
{
    const khub_model_config *c = &m->cfg;
    khub__place *pl = m->place;
    int64_t hd = c->head_dim, off = 0;
    /* The appends and the attention on the model's stream (ABI 1.5 ctx). */
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CUDA, pl->device},
                         .stream = pl->stream};
    for (int s = 0; s < n_segs; s++) {
        const khub__seg *g = &segs[s];
        KHUB_FORWARD_IF_ERROR(m->rt, kv_write(m, layer, g, off, &ctx));
        off += g->n;
    }
    khub_kv_paged_view pv = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    khub__plugin_msg_clear();
    khub_status st = pl->dkv->paged_view(pl->dkv_state, pl->dcache, layer, &pv);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st,
                   "%s: cuda:%d: layer %d kv_cache paged_view failed in %s: %s", m->file,
                   (int)pl->device, layer, khub_binding_name(pl->cuda[KHUB__ROLE_KV_CACHE]),
                   khub__plugin_msg());
    const int32_t *cu = dev_ptr(m, B_PA, 0);
    tview qv, ov;
    khub_paged_attention_args a = {
        KHUB_STRUCT_INIT(khub_paged_attention_args),
        .ctx = &ctx,
        .layout = pv.layout,
        .n_seqs = n_segs,
        .q = tens(&qv, dev_ptr(m, B_Q, 0), where(m, true), 3, n, c->n_heads, hd),
        .out = tens(&ov, dev_ptr(m, B_ATT, 0), where(m, true), 3, n, c->n_heads, hd),
        .k_pool = pv.k_pool,
        .v_pool = pv.v_pool,
        .k_scales = pv.k_scales,
        .v_scales = pv.v_scales,
        .cu_seqlens_q = cu,
        .q_pos0 = cu + n_segs + 1,
        .kv_lens = cu + 2 * n_segs + 1,
        .block_table = pv.block_table,
        .seq_rows = cu + 3 * n_segs + 1,
        .block_table_stride = pv.block_table_stride,
        .block_size = pv.block_size,
        .scale = (float)(c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)hd)),
        .causal = 1,
        .window = ly->window,
        .softcap = (float)c->attn_softcap};
    return call(m, pl->cuda[KHUB__ROLE_PAGED_ATTENTION], &a, "paged_attention", layer);
}

/* Takes every segment's blocks in the device cache before layer 0, so a
 * batch that does not fit fails (KV_FULL) before anything is written, and
 * fills the paged call's int32 arrays (forward.c's attend_paged does the
 * same per layer on the host). */
static khub_status paged_step(khub_model *m, const khub__seg *segs, int n_segs)
{
    int32_t *cu = m->pa_ints, *pos0 = cu + n_segs + 1, *lens = pos0 + n_segs, *rows = lens + n_segs;
    cu[0] = 0;
    for (int s = 0; s < n_segs; s++) {
        const khub__seg *g = &segs[s];
        KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_device_reserve(m, g->seq, g->pos0 + g->n));
        cu[s + 1] = cu[s] + (int32_t)g->n;
        pos0[s] = (int32_t)g->pos0;
        lens[s] = (int32_t)(g->pos0 + g->n);
        rows[s] = g->seq;
    }
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* The pass                                                                 */
/* ======================================================================== */

static khub_status layer_forward(khub_model *m, int L, int64_t n, const khub__seg *segs, int n_segs)
{
    const khub_model_config *c = &m->cfg;
    const khub__layer *ly = &m->layers[L];
    int64_t hidden = c->hidden_size, hd = c->head_dim;
    khub_runtime *rt = m->rt;
    KHUB_FORWARD_IF_ERROR(rt, norm(m, L == 0 ? B_X : B_OB, L == 0 ? -1 : B_X, &ly->attn_norm, n,
                                   hidden, B_XB, "attn_norm", L));
    KHUB_FORWARD_IF_ERROR(rt, linear(m, &ly->q, KHUB__ROLE_QKV, B_XB, B_Q, n, 0, "q_proj", L));
    KHUB_FORWARD_IF_ERROR(rt, linear(m, &ly->k, KHUB__ROLE_QKV, B_XB, B_K, n, HAVE_X, "k_proj", L));
    KHUB_FORWARD_IF_ERROR(rt, linear(m, &ly->v, KHUB__ROLE_QKV, B_XB, B_V, n, HAVE_X, "v_proj", L));
    if (c->qk_norm) {
        KHUB_FORWARD_IF_ERROR(rt,
                              norm(m, B_Q, -1, &ly->q_norm, n * c->n_heads, hd, B_Q, "q_norm", L));
        KHUB_FORWARD_IF_ERROR(
            rt, norm(m, B_K, -1, &ly->k_norm, n * c->n_kv_heads, hd, B_K, "k_norm", L));
    }
    KHUB_FORWARD_IF_ERROR(rt, rotary(m, B_Q, n, c->n_heads, L, "rotary q"));
    KHUB_FORWARD_IF_ERROR(rt, rotary(m, B_K, n, c->n_kv_heads, L, "rotary k"));
    if (khub__forward_device_paged(m))
        KHUB_FORWARD_IF_ERROR(rt, attend_device_paged(m, ly, L, segs, n_segs, n));
    else
        KHUB_FORWARD_IF_ERROR(rt, m->place->dcache ? attend_device(m, ly, L, segs, n_segs)
                                                   : attend_host(m, L, n, segs, n_segs));
    KHUB_FORWARD_IF_ERROR(rt, linear(m, &ly->o, KHUB__ROLE_O, B_ATT, B_OB, n, 0, "o_proj", L));
    if (c->post_norms)
        KHUB_FORWARD_IF_ERROR(
            rt, norm(m, B_OB, -1, &ly->post_attn_norm, n, hidden, B_OB, "post_attn_norm", L));
    KHUB_FORWARD_IF_ERROR(rt, norm(m, B_OB, B_X, &ly->ffn_norm, n, hidden, B_XB, "ffn_norm", L));
    KHUB_FORWARD_IF_ERROR(
        rt, linear(m, &ly->gate, KHUB__ROLE_GATE_UP, B_XB, B_GATE, n, 0, "gate_proj", L));
    KHUB_FORWARD_IF_ERROR(
        rt, linear(m, &ly->up, KHUB__ROLE_GATE_UP, B_XB, B_UP, n, HAVE_X, "up_proj", L));
    KHUB_FORWARD_IF_ERROR(rt, activation(m, n, L));
    KHUB_FORWARD_IF_ERROR(
        rt, linear(m, &ly->down, KHUB__ROLE_DOWN, B_GATE, B_OB, n, 0, "down_proj", L));
    if (!c->post_norms) return KHUB_STATUS_OK;
    return norm(m, B_OB, -1, &ly->post_ffw_norm, n, hidden, B_OB, "post_ffw_norm", L);
}

/* What the device pass cannot do, refused before anything runs: a cache
 * and its reader on different sides (every cached position would cross
 * each layer), and a paged cache anywhere but on the device with its
 * paged attention. */
static khub_status supported(khub_model *m)
{
    khub__place *pl = m->place;
    bool cache_dev = pl->dcache != NULL;
    if (m->kv_layout) {
        bool pa_dev = pl->cuda[KHUB__ROLE_PAGED_ATTENTION] != NULL;
        KHUB_RETURN_IF(m->rt, !pa_dev || !cache_dev, KHUB_STATUS_UNSUPPORTED,
                       "%s: cuda:%d: a paged KV cache runs on the device only with both the "
                       "paged cache and paged attention as CUDA ops (here the cache is on the %s "
                       "and paged attention on the %s); load kernels-community/kv-cache-cuda, or "
                       "load the model with a dense cache",
                       m->file, (int)pl->device, cache_dev ? "device" : "CPU",
                       pa_dev ? "device" : "CPU");
        return KHUB_STATUS_OK;
    }
    bool attn_dev = pl->cuda[KHUB__ROLE_ATTENTION] != NULL;
    KHUB_RETURN_IF(m->rt, attn_dev != cache_dev, KHUB_STATUS_UNSUPPORTED,
                   "%s: cuda:%d: attention on the %s with the KV cache on the %s is not built "
                   "(every cached position would cross each layer); load a %s op for the %s "
                   "role",
                   m->file, (int)pl->device, attn_dev ? "device" : "CPU",
                   attn_dev ? "host" : "device", "CUDA", attn_dev ? "kv_cache" : "attention");
    return KHUB_STATUS_OK;
}

/* The step's inputs: the token ids into B_IDS when the embedding role is
 * on the device (forward.c checked them against the vocabulary), else the
 * rows the host looked up into m->x (scaled there for Gemma); the
 * positions when rotary runs on the device; a paged call's int32 arrays.
 * They go up before the body (outside a graph's capture: a captured copy
 * would keep this step's host address), into fixed device buffers the
 * body's launches read. Not waited for: the step ends by reading the
 * logits (a synchronisation), and a failed step synchronises before
 * returning, so neither the next step's lookup nor the caller's ids array
 * are written while copies of them are in flight. */
static khub_status upload_inputs(khub_model *m, const int32_t *tokens, int64_t n, int n_segs)
{
    khub__place *pl = m->place;
    span s[2] = {{B_POS, 0, n}, {B_X, 0, n * m->cfg.hidden_size}};
    KHUB_FORWARD_IF_ERROR(
        m->rt, up_async(m, s, pl->cuda[KHUB__ROLE_ROTARY] ? 1 : 0, "position upload", -1));
    if (pl->cuda[KHUB__ROLE_EMBEDDING]) {
        khub__plugin_msg_clear();
        khub_status st = khub__cuda_host_memcpy_htod(NULL, dev_at(m, B_IDS, 0), tokens,
                                                     (size_t)n * 4u, pl->stream);
        KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: cuda:%d: uploading the token ids: %s",
                       m->file, (int)pl->device, khub__plugin_msg());
    } else {
        KHUB_FORWARD_IF_ERROR(m->rt, up_async(m, &s[1], 1, "embedding upload", -1));
    }
    span pa = {B_PA, 0, 4 * n_segs + 1};
    return khub__forward_device_paged(m) ? up_async(m, &pa, 1, "paged attention tables", -1)
                                         : KHUB_STATUS_OK;
}

/* The embedding role on the device, the body's first launch: the op reads
 * the ids from B_IDS and writes the rows of x from the table in device
 * memory, scaled there for Gemma. */
static khub_status embed_device(khub_model *m, int64_t n)
{
    khub__place *pl = m->place;
    tview yv;
    khub_tensor table = weight_t(m, &m->embed, true);
    khub_call_ctx ctx = {KHUB_STRUCT_INIT(khub_call_ctx), .device = {KHUB_DEVICE_CUDA, pl->device},
                         .stream = pl->stream};
    khub_embedding_args a = {
        KHUB_STRUCT_INIT(khub_embedding_args),
        .ctx = &ctx,
        .table = &table,
        .ids = dev_ptr(m, B_IDS, 0),
        .y = tens(&yv, dev_ptr(m, B_X, 0), where(m, true), 2, n, m->cfg.hidden_size, 0),
        .n = n,
        .scale = m->cfg.embed_scale == 1.0 ? 1.0f : (float)m->cfg.embed_scale};
    return call(m, pl->cuda[KHUB__ROLE_EMBEDDING], &a, "embedding", -1);
}

/* The final norm, the last row of each segment into `last` and the head. */
static khub_status head(khub_model *m, int64_t n, const khub__seg *segs, int n_segs)
{
    khub__place *pl = m->place;
    int64_t hidden = m->cfg.hidden_size, row = 0;
    int L = (int)m->cfg.n_layers;
    KHUB_FORWARD_IF_ERROR(m->rt,
                          norm(m, B_OB, B_X, &m->final_norm, n, hidden, B_XB, "final_norm", L));
    for (int s = 0; s < n_segs; s++) {
        row += segs[s].n;
        khub__plugin_msg_clear();
        khub_status st = khub__cuda_memcpy_dtod(dev_at(m, B_LAST, s * hidden),
                                                dev_at(m, B_XB, (row - 1) * hidden),
                                                (size_t)hidden * 4u, pl->stream);
        KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: cuda:%d: gathering the last rows: %s",
                       m->file, (int)pl->device, khub__plugin_msg());
    }
    return linear(m, &m->lm_head, KHUB__ROLE_LM_HEAD, B_LAST, B_LOGITS, n_segs, KEEP_Y, "lm_head",
                  L);
}

/* The logits rows down to the host (the step's one synchronisation). */
static khub_status read_logits(khub_model *m, int n_segs)
{
    if (!m->place->cuda[KHUB__ROLE_LM_HEAD]) return KHUB_STATUS_OK; /* the host has them */
    span s = {B_LOGITS, 0, n_segs * m->cfg.vocab_size};
    return down(m, &s, 1, "reading the logits", (int)m->cfg.n_layers);
}

khub_status khub__forward_device_body(khub_model *m, const khub__seg *segs, int n_segs, int64_t n)
{
    khub_status st = m->place->cuda[KHUB__ROLE_EMBEDDING] ? embed_device(m, n) : KHUB_STATUS_OK;
    for (int L = 0; L < m->cfg.n_layers && st == KHUB_STATUS_OK; L++)
        st = layer_forward(m, L, n, segs, n_segs);
    return st == KHUB_STATUS_OK ? head(m, n, segs, n_segs) : st;
}

/* A decode step may run as a CUDA graph of the body (forward_graph.c);
 * otherwise, and for prefill, the body's launches go to the stream one by
 * one. The inputs go up before and the logits come down after, either way. */
khub_status khub__forward_device(khub_model *m, const int32_t *tokens, const khub__seg *segs,
                                 int n_segs, int64_t n)
{
    KHUB_FORWARD_IF_ERROR(m->rt, supported(m));
    /* Launches and copies run in the thread's current context: the model's
     * device's, whichever thread runs the step and whatever it ran before
     * (the driver's default, with no context current, is cuda:0's). */
    khub__plugin_msg_clear();
    khub_status cur = khub__cuda_use_device(m->place->device);
    KHUB_RETURN_IF(m->rt, cur != KHUB_STATUS_OK, cur, "%s: cuda:%d: %s", m->file,
                   (int)m->place->device, khub__plugin_msg());
    if (khub__forward_device_paged(m)) KHUB_FORWARD_IF_ERROR(m->rt, paged_step(m, segs, n_segs));
    bool graphed = false;
    khub_status st = upload_inputs(m, tokens, n, n_segs);
    if (st == KHUB_STATUS_OK) st = khub__graph_step(m, segs, n_segs, n, &graphed);
    if (st == KHUB_STATUS_OK && !graphed) st = khub__forward_device_body(m, segs, n_segs, n);
    if (st == KHUB_STATUS_OK) {
        for (int s = 0; s < n_segs; s++) m->seq_len[segs[s].seq] += segs[s].n;
        st = read_logits(m, n_segs);
    }
    if (st != KHUB_STATUS_OK) /* drain what was queued; the error is already set */
        (void)khub__cuda_host_stream_sync(NULL, m->place->stream);
    return st;
}
