/*
 * forward.c: the decoder forward pass of a Llama-family model, every step an
 * op from the registry (bindings made by model.c).
 *
 * Per layer, in the order of Transformers' LlamaDecoderLayer / Qwen3 /
 * Gemma3DecoderLayer (Gemma: x = embed * sqrt(hidden) first):
 *   xb = rms_norm(ob + x) (x += ob: the fused residual; layer 0: rms_norm(x))
 *   q, k, v = linear(xb)                  (Qwen2: with bias)
 *   q, k = rms_norm per head              (Qwen3 q_norm / k_norm)
 *   q, k = rotary(q, k, positions)
 *   per segment: kv_cache.write(k, v); k', v' = kv_cache.view; att = attention(q, k', v')
 *   (a paged cache: every segment's kv_cache.write, then one paged_attention
 *   call over the layer's block pools for the whole batch)
 *   ob = o_proj(att)
 *   ob = rms_norm(ob)                      (Gemma post_attention_norm)
 *   xb = rms_norm(ob + x) (x += ob)
 *   ob = down(act(gate(xb)) * up(xb))      (act: SiLU, Gemma GELU-tanh)
 *   ob = rms_norm(ob)                      (Gemma post_ffw_norm)
 * then xb = final_norm(ob + x) and logits = lm_head(last row of each segment)
 * (Gemma 2-style final_logit_softcapping: logits = cap * tanh(logits / cap)),
 * or, for khub_model_logits_all, lm_head of every row (khub__forward_rows).
 * A capped attention (attn_logit_softcapping) is the attention op's job
 * (KHUB_ATTN_SOFTCAP, ABI 1.5): forward.c passes the cap in its args.
 *
 * The residual add is never done here: the norm op's fused residual does it,
 * one layer late, which is why `ob` carries each block's output forward.
 * Nothing in this file allocates: every buffer is scratch made at load.
 */
#include <math.h>
#include <string.h>

#include "contain.h"
#include "executor.h"
#include "placement.h"
#include "runtime_impl.h" /* khub__plugin_msg: a cache method's own message */

/* A tensor with its own shape/stride storage. Pass it by pointer only: the
 * khub_tensor inside points at its arrays. */
typedef struct tview {
    khub_tensor t;
    int64_t shape[3];
    int64_t strides[3];
} tview;

static khub_tensor *tv(tview *v, float *data, int ndim, int64_t a, int64_t b, int64_t c)
{
    memset(v, 0, sizeof *v);
    v->shape[0] = a;
    v->shape[1] = b;
    v->shape[2] = c;
    v->t.data = data;
    v->t.device = (khub_device){KHUB_DEVICE_CPU, 0};
    v->t.ndim = ndim;
    v->t.dtype = KHUB_DTYPE_F32;
    v->t.shape = v->shape;
    return &v->t;
}

/* Calls an op and, on failure, adds where it happened (the plugin's own
 * message, when it set one, wins: first error wins). what and layer also
 * name the call if the process dies in it (contain.h). */
static khub_status call(khub_model *m, khub_binding *b, const void *args, const char *what,
                        int layer)
{
    khub__inflight_role(what, layer);
    khub_status st = khub__verified_call(m, b, args, what, layer);
    khub__inflight_role(NULL, -1);
    if (st == KHUB_STATUS_OK) return st;
    return khub__fail(m->rt, st, "%s: layer %d %s failed in %s", m->file, layer, what,
                      khub_binding_name(b));
}

static khub_status linear(khub_model *m, const khub__mat *mat, float *x, int64_t n, float *y,
                          const char *what, int layer)
{
    tview xv, yv;
    khub_linear_args a = {KHUB_STRUCT_INIT(khub_linear_args),
                          .x = tv(&xv, x, 2, n, mat->w.shape[1], 0), .weight = &mat->w.t,
                          .bias = mat->bias.t.data ? &mat->bias.t : NULL,
                          .y = tv(&yv, y, 2, n, mat->w.shape[0], 0)};
    return call(m, mat->op, &a, what, layer);
}

/* y = rms_norm(x (+ residual)) * w over rows of `dim`. */
static khub_status norm(khub_model *m, float *x, float *residual, const khub__weight *w,
                        int64_t rows, int64_t dim, float *y, const char *what, int layer)
{
    tview xv, rv, yv;
    khub_norm_args a = {KHUB_STRUCT_INIT(khub_norm_args),
                        .norm_type = KHUB_NORM_RMS,
                        .eps = (float)m->cfg.rms_norm_eps,
                        .x = tv(&xv, x, 2, rows, dim, 0),
                        .residual = residual ? tv(&rv, residual, 2, rows, dim, 0) : NULL,
                        .weight = &w->t,
                        .y = tv(&yv, y, 2, rows, dim, 0)};
    return call(m, residual ? m->norm_res : m->norm, &a, what, layer);
}

static khub_status rotary(khub_model *m, float *x, int64_t n, int64_t heads, int layer,
                          const char *what)
{
    const khub_model_config *c = &m->cfg;
    const khub__layer *ly = &m->layers[layer];
    /* Gemma 3's local layers: their own base, no scaling. */
    bool local = ly->rope_theta != c->rope_theta;
    tview xv;
    khub_rotary_args a = {KHUB_STRUCT_INIT(khub_rotary_args),
                          .x = tv(&xv, x, 3, n, heads, c->head_dim),
                          .positions = m->positions,
                          .style = m->rope_style,
                          .scaling = local ? KHUB_ROPE_SCALING_NONE : c->rope_scaling,
                          .theta = (float)ly->rope_theta,
                          .factor = (float)c->rope_factor,
                          .low_freq_factor = (float)c->rope_low_freq_factor,
                          .high_freq_factor = (float)c->rope_high_freq_factor,
                          .original_max_pos = (int32_t)c->rope_original_max_pos,
                          .rotary_dim = 0};
    return call(m, m->rotary, &a, what, layer);
}

/* Cache write, view and attention for each segment of the batch. */
static khub_status attend(khub_model *m, const khub__layer *ly, int layer, const khub__seg *segs,
                          int n_segs)
{
    const khub_model_config *c = &m->cfg;
    int64_t hd = c->head_dim, qdim = c->n_heads * hd, kvdim = c->n_kv_heads * hd, off = 0;
    for (int s = 0; s < n_segs; s++) {
        const khub__seg *g = &segs[s];
        tview kv_, vv_, kc, vc, qv, ov;
        khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                                .layer = layer,
                                .seq = g->seq,
                                .pos = g->pos0,
                                .k = tv(&kv_, m->k + off * kvdim, 3, g->n, c->n_kv_heads, hd),
                                .v = tv(&vv_, m->v + off * kvdim, 3, g->n, c->n_kv_heads, hd)};
        khub__inflight rec;
        khub__inflight_role("kv_cache write", layer);
        khub__binding_enter(m->kv_op, &rec);
        khub_status st = m->kv->write(m->kv_state, m->cache, &w);
        khub__binding_leave(&rec);
        KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: layer %d kv_cache write failed in %s",
                       m->file, layer, khub_binding_name(m->kv_op));
        tv(&kc, NULL, 3, 0, 0, 0);
        tv(&vc, NULL, 3, 0, 0, 0);
        kc.t.strides = kc.strides;
        vc.t.strides = vc.strides;
        khub__inflight_role("kv_cache view", layer);
        khub__binding_enter(m->kv_op, &rec);
        /* A cache of ABI 1.4 may describe only [first, n) (view_from): a
         * sliding-window cache that dropped older positions. */
        int64_t first = 0;
        if (m->kv_view_from)
            st = m->kv->view_from(m->kv_state, m->cache, layer, g->seq, g->pos0 + g->n, &first,
                                  &kc.t, &vc.t);
        else
            st = m->kv->view(m->kv_state, m->cache, layer, g->seq, g->pos0 + g->n, &kc.t, &vc.t);
        khub__binding_leave(&rec);
        khub__inflight_role(NULL, -1);
        KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: layer %d kv_cache view failed in %s",
                       m->file, layer, khub_binding_name(m->kv_op));
        KHUB_RETURN_IF(m->rt, first < 0 || first > g->pos0, KHUB_STATUS_PLUGIN_INVALID,
                       "%s: layer %d kv_cache view_from of %s: first %lld (want 0..%lld)", m->file,
                       layer, khub_binding_name(m->kv_op), (long long)first, (long long)g->pos0);
        khub_attention_args a = {
            KHUB_STRUCT_INIT(khub_attention_args),
            .q = tv(&qv, m->q + off * qdim, 3, g->n, c->n_heads, hd),
            .k = &kc.t,
            .v = &vc.t,
            .mask = NULL,
            .out = tv(&ov, m->att + off * qdim, 3, g->n, c->n_heads, hd),
            .scale = (float)(c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)hd)),
            .causal = 1,
            .q_pos0 = g->pos0 - first,
            .window = ly->window,
            .softcap = (float)c->attn_softcap};
        KHUB_FORWARD_IF_ERROR(m->rt, call(m, m->attention, &a, "attention", layer));
        off += g->n;
    }
    return KHUB_STATUS_OK;
}

/* Calls a KV cache method under the in-flight record (contain.h) and adds
 * where it failed. */
#define KV_CALL(m, what, layer, expr) \
    do { \
        khub__inflight rec_; \
        khub__inflight_role("kv_cache " what, layer); \
        khub__plugin_msg_clear(); \
        khub__binding_enter((m)->kv_op, &rec_); \
        khub_status st_ = (expr); \
        khub__binding_leave(&rec_); \
        khub__inflight_role(NULL, -1); \
        KHUB_RETURN_IF((m)->rt, st_ != KHUB_STATUS_OK, st_, \
                       "%s: layer %d kv_cache " what " failed in %s: %s", (m)->file, layer, \
                       khub_binding_name((m)->kv_op), \
                       khub__plugin_msg()[0] ? khub__plugin_msg() : khub_status_str(st_)); \
    } while (0)

/* The paged path (issue 13): every segment's K/V written into its blocks,
 * then one paged_attention call for the whole batch over the layer's pools
 * and the cache's block table. The blocks were reserved by reserve_blocks. */
static khub_status attend_paged(khub_model *m, const khub__layer *ly, int layer,
                                const khub__seg *segs, int n_segs)
{
    const khub_model_config *c = &m->cfg;
    int64_t hd = c->head_dim, kvdim = c->n_kv_heads * hd, off = 0, n = 0;
    int32_t *cu = m->pa_ints, *pos0 = cu + n_segs + 1, *lens = pos0 + n_segs, *rows = lens + n_segs;
    cu[0] = 0;
    for (int s = 0; s < n_segs; s++) {
        const khub__seg *g = &segs[s];
        tview kv_, vv_;
        khub_kv_write_args w = {KHUB_STRUCT_INIT(khub_kv_write_args),
                                .layer = layer,
                                .seq = g->seq,
                                .pos = g->pos0,
                                .k = tv(&kv_, m->k + off * kvdim, 3, g->n, c->n_kv_heads, hd),
                                .v = tv(&vv_, m->v + off * kvdim, 3, g->n, c->n_kv_heads, hd)};
        KV_CALL(m, "write", layer, m->kv->write(m->kv_state, m->cache, &w));
        off += g->n;
        cu[s + 1] = (int32_t)off;
        pos0[s] = (int32_t)g->pos0;
        lens[s] = (int32_t)(g->pos0 + g->n);
        rows[s] = g->seq;
    }
    n = off;
    khub_kv_paged_view pv = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
    KV_CALL(m, "paged_view", layer, m->kv->paged_view(m->kv_state, m->cache, layer, &pv));
    tview qv, ov;
    khub_paged_attention_args a = {
        KHUB_STRUCT_INIT(khub_paged_attention_args),
        .ctx = NULL,
        .layout = pv.layout,
        .n_seqs = n_segs,
        .q = tv(&qv, m->q, 3, n, c->n_heads, hd),
        .out = tv(&ov, m->att, 3, n, c->n_heads, hd),
        .k_pool = pv.k_pool,
        .v_pool = pv.v_pool,
        .k_scales = pv.k_scales,
        .v_scales = pv.v_scales,
        .cu_seqlens_q = cu,
        .q_pos0 = pos0,
        .kv_lens = lens,
        .block_table = pv.block_table,
        .seq_rows = rows,
        .block_table_stride = pv.block_table_stride,
        .block_size = pv.block_size,
        .scale = (float)(c->attn_scale > 0 ? c->attn_scale : 1.0 / sqrt((double)hd)),
        .causal = 1,
        .window = ly->window,
        .softcap = (float)c->attn_softcap};
    return call(m, m->paged_attn, &a, "paged_attention", layer);
}

/* Takes the blocks every segment needs before layer 0, so a batch that does
 * not fit fails (KV_FULL) before anything is written. */
static khub_status reserve_blocks(khub_model *m, const khub__seg *segs, int n_segs)
{
    for (int s = 0; s < n_segs && m->kv_layout; s++)
        KV_CALL(m, "reserve", -1,
                m->kv->reserve(m->kv_state, m->cache, segs[s].seq, segs[s].pos0 + segs[s].n));
    return KHUB_STATUS_OK;
}

/* The final logit soft-cap (Gemma 2's final_logit_softcapping): logits =
 * cap * tanh(logits / cap), done here on the gathered logits rather than by
 * an op: it is elementwise over n_segs rows of the vocabulary, and the
 * lm_head op stays a plain linear. */
static void softcap_rows(const khub_model *m, float *logits, int64_t rows)
{
    double cap = m->cfg.final_softcap;
    if (!(cap > 0)) return;
    size_t n = (size_t)rows * (size_t)m->cfg.vocab_size;
    for (size_t i = 0; i < n; i++) logits[i] = (float)(cap * tanh(logits[i] / cap));
}

/* o_proj and down_proj: m->ob [n, hidden] = x W^T. Under tensor
 * parallelism's reduce plan each rank multiplies its columns of x and the
 * partial outputs are summed; under the gather plan x is all-gathered whole
 * and each rank computes its rows of the output, then those are gathered
 * (tp.h). */
static khub_status out_linear(khub_model *m, const khub__mat *mat, khub__tp_part part, float *x,
                              int64_t n, const char *what, int layer)
{
    khub__tp *tp = &m->tp;
    if (tp->size < 2 || tp->plan != KHUB_TP_PLAN_GATHER) {
        KHUB_FORWARD_IF_ERROR(m->rt, linear(m, mat, x, n, m->ob, what, layer));
        return khub__tp_all_reduce(m, m->ob, n * m->cfg.hidden_size);
    }
    KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_gather_input(m, part, x, n));
    KHUB_FORWARD_IF_ERROR(m->rt, linear(m, mat, tp->whole, n, tp->part, what, layer));
    return khub__tp_gather_output(m, n, m->ob);
}

/* Copies column range [col, col + w) of each of n rows of src (row length
 * ld) to dst [n, w]. */
static void split_cols(const float *src, int64_t n, int64_t ld, int64_t col, int64_t w, float *dst)
{
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + i * w, src + i * ld + col, (size_t)w * sizeof(float));
}

/* m->q, m->k, m->v = xb W^T: one call of the joined weight (model_fuse.c)
 * into m->att, its rows then split, or three calls. The joined output goes
 * to att, which is free until attention and holds [max_batch, q_dim]: a
 * step of more rows than that holds of q + 2 kv_dim (a long prefill chunk,
 * where one call more is nothing) makes the three calls, rather than every
 * load growing its scratch. The bits are the same either way. */
static khub_status qkv_proj(khub_model *m, const khub__layer *ly, int64_t n, int L)
{
    int64_t qd = ly->q.w.shape[0], kvd = ly->k.w.shape[0], all = qd + 2 * kvd;
    if (!ly->qkv.op || n * all > (int64_t)m->max_batch * m->cfg.n_heads * m->cfg.head_dim) {
        KHUB_FORWARD_IF_ERROR(m->rt, linear(m, &ly->q, m->xb, n, m->q, "q_proj", L));
        KHUB_FORWARD_IF_ERROR(m->rt, linear(m, &ly->k, m->xb, n, m->k, "k_proj", L));
        return linear(m, &ly->v, m->xb, n, m->v, "v_proj", L);
    }
    KHUB_FORWARD_IF_ERROR(m->rt, linear(m, &ly->qkv, m->xb, n, m->att, "qkv_proj", L));
    split_cols(m->att, n, all, 0, qd, m->q);
    split_cols(m->att, n, all, qd, kvd, m->k);
    split_cols(m->att, n, all, qd + kvd, kvd, m->v);
    return KHUB_STATUS_OK;
}

/* gate and up = xb W^T: one call of the joined weight into m->up ([n, 2
 * ffn], so at most max_batch / 2 rows: more make two calls, as in
 * qkv_proj), or two calls into m->gate and m->up. *gate and *up are where
 * the two ended: one token's row [gate | up] is read in place; more rows
 * are split into m->gate and m->up (each up row moves down to its place in
 * m->up, never over a row still to be read). */
static khub_status gate_up_proj(khub_model *m, const khub__layer *ly, int64_t n, int L,
                                float **gate, float **up)
{
    if (!ly->gate_up.op || 2 * n > m->max_batch) {
        KHUB_FORWARD_IF_ERROR(m->rt, linear(m, &ly->gate, m->xb, n, m->gate, "gate_proj", L));
        return linear(m, &ly->up, m->xb, n, m->up, "up_proj", L);
    }
    int64_t ff = ly->gate.w.shape[0];
    KHUB_FORWARD_IF_ERROR(m->rt, linear(m, &ly->gate_up, m->xb, n, m->up, "gate_up_proj", L));
    if (n == 1) {
        *gate = m->up;
        *up = m->up + ff;
        return KHUB_STATUS_OK;
    }
    split_cols(m->up, n, 2 * ff, 0, ff, m->gate);
    for (int64_t i = 0; i < n; i++)
        memmove(m->up + i * ff, m->up + i * 2 * ff + ff, (size_t)ff * sizeof(float));
    return KHUB_STATUS_OK;
}

static khub_status layer_forward(khub_model *m, int L, int64_t n, const khub__seg *segs, int n_segs)
{
    const khub_model_config *c = &m->cfg;
    const khub__layer *ly = &m->layers[L];
    int64_t hidden = c->hidden_size, hd = c->head_dim;
    khub_runtime *rt = m->rt;

    KHUB_FORWARD_IF_ERROR(rt, norm(m, L == 0 ? m->x : m->ob, L == 0 ? NULL : m->x, &ly->attn_norm,
                                   n, hidden, m->xb, "attn_norm", L));
    KHUB_FORWARD_IF_ERROR(rt, qkv_proj(m, ly, n, L));
    if (c->qk_norm) {
        KHUB_FORWARD_IF_ERROR(
            rt, norm(m, m->q, NULL, &ly->q_norm, n * c->n_heads, hd, m->q, "q_norm", L));
        KHUB_FORWARD_IF_ERROR(
            rt, norm(m, m->k, NULL, &ly->k_norm, n * c->n_kv_heads, hd, m->k, "k_norm", L));
    }
    KHUB_FORWARD_IF_ERROR(rt, rotary(m, m->q, n, c->n_heads, L, "rotary q"));
    KHUB_FORWARD_IF_ERROR(rt, rotary(m, m->k, n, c->n_kv_heads, L, "rotary k"));
    KHUB_FORWARD_IF_ERROR(rt, m->kv_layout ? attend_paged(m, ly, L, segs, n_segs)
                                           : attend(m, ly, L, segs, n_segs));
    KHUB_FORWARD_IF_ERROR(rt, out_linear(m, &ly->o, KHUB__TP_PART_HEADS, m->att, n, "o_proj", L));
    if (c->post_norms)
        KHUB_FORWARD_IF_ERROR(
            rt, norm(m, m->ob, NULL, &ly->post_attn_norm, n, hidden, m->ob, "post_attn_norm", L));

    KHUB_FORWARD_IF_ERROR(rt, norm(m, m->ob, m->x, &ly->ffn_norm, n, hidden, m->xb, "ffn_norm", L));
    float *gate = m->gate, *up = m->up;
    KHUB_FORWARD_IF_ERROR(rt, gate_up_proj(m, ly, n, L, &gate, &up));
    tview gv, uv, yv;
    khub_activation_args a = {KHUB_STRUCT_INIT(khub_activation_args), .act_type = c->act,
                              .gate = tv(&gv, gate, 2, n, c->intermediate_size, 0),
                              .up = tv(&uv, up, 2, n, c->intermediate_size, 0),
                              .y = tv(&yv, m->gate, 2, n, c->intermediate_size, 0)};
    KHUB_FORWARD_IF_ERROR(
        rt, call(m, m->act, &a, c->act == KHUB_ACT_GELU_TANH ? "gelu_tanh_and_mul" : "silu_and_mul",
                 L));
    KHUB_FORWARD_IF_ERROR(rt,
                          out_linear(m, &ly->down, KHUB__TP_PART_FFN, m->gate, n, "down_proj", L));
    if (!c->post_norms) return KHUB_STATUS_OK;
    return norm(m, m->ob, NULL, &ly->post_ffw_norm, n, hidden, m->ob, "post_ffw_norm", L);
}

/* Checks a batch against the scratch sizes and the cache, fills positions. */
static khub_status plan(khub_model *m, const khub__seg *segs, int n_segs, int64_t *n_out)
{
    khub_runtime *rt = m->rt;
    KHUB_RETURN_IF(rt, n_segs < 1 || n_segs > m->max_seqs, KHUB_STATUS_INVALID_ARG,
                   "forward: %d segments, this model was loaded for 1..%d sequences", n_segs,
                   (int)m->max_seqs);
    int64_t n = 0;
    for (int s = 0; s < n_segs; s++) {
        const khub__seg *g = &segs[s];
        KHUB_RETURN_IF(rt, g->seq < 0 || g->seq >= m->max_seqs || g->n < 1, KHUB_STATUS_INVALID_ARG,
                       "forward: segment %d (sequence %d, %lld tokens) "
                       "is invalid",
                       s, (int)g->seq, (long long)g->n);
        for (int t = 0; t < s; t++)
            KHUB_RETURN_IF(rt, segs[t].seq == g->seq, KHUB_STATUS_INVALID_ARG,
                           "forward: sequence %d appears twice in one batch", (int)g->seq);
        KHUB_RETURN_IF(rt, g->pos0 != m->seq_len[g->seq], KHUB_STATUS_INVALID_ARG,
                       "forward: sequence %d continues at %lld but holds %lld tokens", (int)g->seq,
                       (long long)g->pos0, (long long)m->seq_len[g->seq]);
        KHUB_RETURN_IF(rt, g->pos0 + g->n > m->max_context, KHUB_STATUS_CONTEXT_FULL,
                       "%s: sequence %d needs %lld positions, the KV cache holds %lld "
                       "(raise max_context)",
                       m->file, (int)g->seq, (long long)(g->pos0 + g->n),
                       (long long)m->max_context);
        KHUB_RETURN_IF(rt, n + g->n > m->max_batch, KHUB_STATUS_INVALID_ARG,
                       "forward: batch of more than %d tokens", (int)m->max_batch);
        for (int64_t i = 0; i < g->n; i++) m->positions[n + i] = (int32_t)(g->pos0 + i);
        n += g->n;
    }
    *n_out = n;
    return KHUB_STATUS_OK;
}

static khub_status embed_rows(khub_model *m, const int32_t *tokens, int64_t n);

/* Gemma multiplies the embeddings by sqrt(hidden), rounded to the activation
 * dtype (f32) first as Transformers' Gemma3TextScaledWordEmbedding does. */
static void embed_scale(khub_model *m, int64_t n)
{
    if (m->cfg.embed_scale == 1.0) return;
    float s = (float)m->cfg.embed_scale;
    size_t total = (size_t)n * (size_t)m->cfg.hidden_size;
    for (size_t i = 0; i < total; i++) m->x[i] *= s;
}

static khub_status embed(khub_model *m, const int32_t *tokens, int64_t n)
{
    khub_status st = embed_rows(m, tokens, n);
    if (st == KHUB_STATUS_OK) embed_scale(m, n);
    return st;
}

static khub_status check_ids(khub_model *m, const int32_t *tokens, int64_t n);

/* The embedding role's op looks the rows up (khub_model_opts.embed_impl),
 * the ids checked first with the host lookup's message. */
static khub_status embed_op(khub_model *m, const int32_t *tokens, int64_t n)
{
    KHUB_FORWARD_IF_ERROR(m->rt, check_ids(m, tokens, n));
    tview yv;
    khub_embedding_args a = {KHUB_STRUCT_INIT(khub_embedding_args),
                             .table = &m->embed.t,
                             .ids = tokens,
                             .y = tv(&yv, m->x, 2, n, m->cfg.hidden_size, 0),
                             .n = n,
                             .scale = 1.0f};
    return call(m, m->embed_op, &a, "embedding", -1);
}

static khub_status embed_rows(khub_model *m, const int32_t *tokens, int64_t n)
{
    if (m->embed_op) return embed_op(m, tokens, n);
    if (!m->dequant) return khub__weight_rows(m->rt, &m->embed, tokens, n, m->x, NULL, NULL);
    void *state = NULL;
    const khub_op_desc *op = khub_binding_acquire(m->dequant, &state);
    const khub_qlinear_methods *qm = op ? op->methods : NULL;
    khub__inflight rec;
    khub__inflight_role("embedding dequantize", -1);
    khub__binding_enter(m->dequant, &rec);
    khub_status st =
        khub__weight_rows(m->rt, &m->embed, tokens, n, m->x, qm ? qm->dequantize : NULL, state);
    khub__binding_leave(&rec);
    khub__inflight_role(NULL, -1);
    khub_binding_release(m->dequant);
    return st;
}

/* Pins the KV cache plugin for one forward call and checks that it is still
 * the one that made the cache (a hot reload cannot move a plugin's cache). */
static khub_status kv_pin(khub_model *m)
{
    void *state = NULL;
    const khub_op_desc *op = khub_binding_acquire(m->kv_op, &state);
    if (op && op->methods == (const void *)m->kv && state == m->kv_state) return KHUB_STATUS_OK;
    khub_binding_release(m->kv_op);
    return khub__fail(m->rt, KHUB_STATUS_BUSY,
                      "%s: the KV cache plugin was reloaded under this model; load the model "
                      "again",
                      m->file);
}

/* The logits of every row of xb, [n, vocab], into out (NULL on ranks > 0,
 * which only take part in the all-gathers). Without tp, one lm_head call on
 * all n rows writes out directly. With tp, groups of max_seqs rows go
 * through the last-row buffers, so the gather's scratch stays [max_seqs,
 * vocab] per rank instead of growing to max_batch rows. */
static khub_status head_all_rows(khub_model *m, int64_t n, float *out)
{
    int64_t hidden = m->cfg.hidden_size;
    size_t V = (size_t)m->cfg.vocab_size;
    int layer = (int)m->cfg.n_layers;
    if (m->tp.size < 2) {
        KHUB_FORWARD_IF_ERROR(m->rt, linear(m, &m->lm_head, m->xb, n, out, "lm_head", layer));
        softcap_rows(m, out, n);
        return KHUB_STATUS_OK;
    }
    for (int64_t r = 0; r < n; r += m->max_seqs) {
        int k = (int)(n - r < m->max_seqs ? n - r : m->max_seqs);
        memcpy(m->last, m->xb + (size_t)(r * hidden), (size_t)k * (size_t)hidden * sizeof(float));
        KHUB_FORWARD_IF_ERROR(m->rt,
                              linear(m, &m->lm_head, m->last, k, m->tp.logits, "lm_head", layer));
        KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_gather_logits(m, k));
        softcap_rows(m, m->logits, k);
        if (out) memcpy(out + (size_t)r * V, m->logits, (size_t)k * V * sizeof(float));
    }
    return KHUB_STATUS_OK;
}

khub_status khub__forward_attend_host(khub_model *m, int layer, const khub__seg *segs, int n_segs)
{
    const khub__layer *ly = &m->layers[layer];
    return m->kv_layout ? attend_paged(m, ly, layer, segs, n_segs)
                        : attend(m, ly, layer, segs, n_segs);
}

/* The ids of a step whose embedding runs on the device, checked before
 * anything is reserved or goes up, with the host lookup's message: a CUDA
 * op cannot refuse one (it writes a NaN row). */
static khub_status check_ids(khub_model *m, const int32_t *tokens, int64_t n)
{
    int64_t vocab = m->embed.shape[0];
    for (int64_t i = 0; i < n; i++)
        KHUB_RETURN_IF(m->rt, tokens[i] < 0 || tokens[i] >= vocab, KHUB_STATUS_INVALID_ARG,
                       "token id %d at position %lld is outside the vocabulary [0, %lld)",
                       (int)tokens[i], (long long)i, (long long)vocab);
    return KHUB_STATUS_OK;
}

/* A model placed on a CUDA device: the host's embedding lookup unless the
 * embedding role runs on the device (then only the ids go up), then
 * forward_device.c's pass (the host cache pinned in case attention uses it). */
static khub_status forward_placed(khub_model *m, const int32_t *tokens, const khub__seg *segs,
                                  int n_segs, int64_t n)
{
    KHUB_FORWARD_IF_ERROR(m->rt, m->place->cuda[KHUB__ROLE_EMBEDDING] ? check_ids(m, tokens, n)
                                                                      : embed(m, tokens, n));
    KHUB_FORWARD_IF_ERROR(m->rt, kv_pin(m));
    khub_status st = khub__forward_device(m, tokens, segs, n_segs, n);
    khub_binding_release(m->kv_op);
    KHUB_FORWARD_IF_ERROR(m->rt, st);
    softcap_rows(m, m->logits, n_segs);
    return KHUB_STATUS_OK;
}

/* The logits of the last row of each segment into m->logits [n_segs, vocab]. */
static khub_status head_last_rows(khub_model *m, const khub__seg *segs, int n_segs)
{
    int64_t row = 0, hidden = m->cfg.hidden_size;
    for (int s = 0; s < n_segs; s++) {
        row += segs[s].n;
        memcpy(m->last + (size_t)s * hidden, m->xb + (size_t)(row - 1) * hidden,
               (size_t)hidden * sizeof(float));
    }
    if (m->tp.size < 2) {
        KHUB_FORWARD_IF_ERROR(m->rt, linear(m, &m->lm_head, m->last, n_segs, m->logits, "lm_head",
                                            (int)m->cfg.n_layers));
    } else {
        /* Tensor parallel: this rank's slice of the vocabulary, then all of it. */
        KHUB_FORWARD_IF_ERROR(m->rt, linear(m, &m->lm_head, m->last, n_segs, m->tp.logits,
                                            "lm_head", (int)m->cfg.n_layers));
        KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_gather_logits(m, n_segs));
    }
    softcap_rows(m, m->logits, n_segs);
    return KHUB_STATUS_OK;
}

khub_status khub__forward_rows(khub_model *m, const int32_t *tokens, const khub__seg *segs,
                               int n_segs, bool all_rows, float *out)
{
    int64_t n = 0, hidden = m->cfg.hidden_size;
    /* A model placed on a CUDA device reads back only the last rows' logits. */
    KHUB_RETURN_IF(m->rt, m->place && all_rows, KHUB_STATUS_UNSUPPORTED,
                   "%s: the logits of every row on a CUDA device are not built (docs/gpu.md); "
                   "load the model for the CPU",
                   m->file);
    KHUB_FORWARD_IF_ERROR(m->rt, plan(m, segs, n_segs, &n));
    if (m->place) return forward_placed(m, tokens, segs, n_segs, n);
    KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_lead_forward(m, tokens, segs, n_segs, all_rows));
    KHUB_FORWARD_IF_ERROR(m->rt, embed(m, tokens, n));
    KHUB_FORWARD_IF_ERROR(m->rt, kv_pin(m));
    khub_status st = reserve_blocks(m, segs, n_segs);
    for (int L = 0; L < m->cfg.n_layers && st == KHUB_STATUS_OK; L++)
        st = layer_forward(m, L, n, segs, n_segs);
    khub_binding_release(m->kv_op);
    KHUB_FORWARD_IF_ERROR(m->rt, st);
    for (int s = 0; s < n_segs; s++) m->seq_len[segs[s].seq] += segs[s].n;

    KHUB_FORWARD_IF_ERROR(m->rt, norm(m, m->ob, m->x, &m->final_norm, n, hidden, m->xb,
                                      "final_norm", (int)m->cfg.n_layers));
    return all_rows ? head_all_rows(m, n, out) : head_last_rows(m, segs, n_segs);
}

khub_status khub__forward(khub_model *m, const int32_t *tokens, const khub__seg *segs, int n_segs)
{
    return khub__forward_rows(m, tokens, segs, n_segs, false, NULL);
}

khub_status khub__forward_reset(khub_model *m, int32_t seq)
{
    return khub__forward_truncate(m, seq, 0);
}

khub_status khub__forward_truncate(khub_model *m, int32_t seq, int64_t n)
{
    KHUB_RETURN_IF(m->rt, seq < 0 || seq >= m->max_seqs, KHUB_STATUS_INVALID_ARG,
                   "forward: sequence %d outside [0, %d)", (int)seq, (int)m->max_seqs);
    KHUB_RETURN_IF(m->rt, n < 0 || n > m->seq_len[seq], KHUB_STATUS_INVALID_ARG,
                   "forward: truncating sequence %d of %lld tokens to %lld", (int)seq,
                   (long long)m->seq_len[seq], (long long)n);
    KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_lead_truncate(m, seq, n));
    KHUB_FORWARD_IF_ERROR(m->rt, kv_pin(m));
    khub__inflight rec;
    khub__inflight_role("kv_cache truncate", -1);
    khub__binding_enter(m->kv_op, &rec);
    /* A paged cache gives the sequence's blocks back to the pool on a reset. */
    khub_status st = m->kv_layout && n == 0 ? m->kv->release(m->kv_state, m->cache, seq)
                                            : m->kv->truncate(m->kv_state, m->cache, seq, n);
    khub__binding_leave(&rec);
    khub__inflight_role(NULL, -1);
    khub_binding_release(m->kv_op);
    m->seq_resets[seq]++;
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: kv_cache truncate failed in %s", m->file,
                   khub_binding_name(m->kv_op));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_device_truncate(m, seq, n));
    m->seq_len[seq] = n;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Scratch                                                                  */
/* ======================================================================== */

/* Allocates n floats (checked) and counts them. */
static float *scratch(khub_model *m, int64_t rows, int64_t cols, bool *ok)
{
    size_t n, bytes;
    if (!*ok || !khub__mul_ok((size_t)rows, (size_t)cols, &n) ||
        !khub__mul_ok(n, sizeof(float), &bytes)) {
        *ok = false;
        return NULL;
    }
    float *p = khub__aligned_alloc(m->rt, bytes);
    if (!p)
        *ok = false;
    else {
        memset(p, 0, bytes);
        m->scratch_bytes += bytes;
    }
    return p;
}

khub_status khub__forward_alloc(khub_model *m)
{
    const khub_model_config *c = &m->cfg;
    int64_t B = m->max_batch, S = m->max_seqs;
    int64_t qdim = c->n_heads * c->head_dim, kvdim = c->n_kv_heads * c->head_dim;
    bool ok = true;
    m->x = scratch(m, B, c->hidden_size, &ok);
    m->xb = scratch(m, B, c->hidden_size, &ok);
    m->ob = scratch(m, B, c->hidden_size, &ok);
    m->q = scratch(m, B, qdim, &ok);
    m->att = scratch(m, B, qdim, &ok);
    m->k = scratch(m, B, kvdim, &ok);
    m->v = scratch(m, B, kvdim, &ok);
    m->gate = scratch(m, B, c->intermediate_size, &ok);
    m->up = scratch(m, B, c->intermediate_size, &ok);
    m->last = scratch(m, S, c->hidden_size, &ok);
    m->logits = scratch(m, S, c->vocab_size, &ok);
    m->positions = (int32_t *)scratch(m, B, 1, &ok); /* int32 fits in a float's size */
    m->seq_len = khub__calloc(m->rt, (size_t)S, sizeof *m->seq_len);
    m->seq_resets = khub__calloc(m->rt, (size_t)S, sizeof *m->seq_resets);
    m->pa_ints = khub__calloc(m->rt, (size_t)(4 * S + 1), sizeof *m->pa_ints);
    KHUB_RETURN_IF(m->rt, !ok || !m->seq_len || !m->seq_resets || !m->pa_ints, KHUB_STATUS_NOMEM,
                   "%s: no memory for %lld x %lld activation scratch", m->file, (long long)B,
                   (long long)c->hidden_size);
    return KHUB_STATUS_OK;
}

void khub__forward_free(khub_model *m)
{
    float **bufs[] = {&m->x, &m->xb,   &m->ob, &m->q,    &m->att,   &m->k,
                      &m->v, &m->gate, &m->up, &m->last, &m->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        khub__aligned_free(m->rt, *bufs[i]);
        *bufs[i] = NULL;
    }
    khub__aligned_free(m->rt, m->positions);
    m->positions = NULL;
    khub__free(m->rt, m->seq_len, m->seq_len ? (size_t)m->max_seqs * sizeof *m->seq_len : 0);
    m->seq_len = NULL;
    khub__free(m->rt, m->seq_resets,
               m->seq_resets ? (size_t)m->max_seqs * sizeof *m->seq_resets : 0);
    m->seq_resets = NULL;
    khub__free(m->rt, m->pa_ints,
               m->pa_ints ? (size_t)(4 * m->max_seqs + 1) * sizeof *m->pa_ints : 0);
    m->pa_ints = NULL;
}
