/*
 * model_weights.c: a model's weights found by name in its GGUF or
 * safetensors file (views into the mapping), checked for shape, optionally
 * quantized at load, and bound to their linear or qlinear op
 * (model_bind.c).
 */
#include <stdio.h>
#include <string.h>

#include "gguf.h"
#include "model_impl.h"
#include "safetensors.h"

/* ======================================================================== */
/* Tensor names                                                             */
/* ======================================================================== */

typedef enum wname {
    W_EMBED,
    W_FINAL_NORM,
    W_LM_HEAD,
    W_ATTN_NORM,
    W_Q,
    W_K,
    W_V,
    W_O,
    W_Q_BIAS,
    W_K_BIAS,
    W_V_BIAS,
    W_O_BIAS,
    W_Q_NORM,
    W_K_NORM,
    W_FFN_NORM,
    W_GATE,
    W_UP,
    W_DOWN,
    W_GATE_BIAS,
    W_UP_BIAS,
    W_DOWN_BIAS,
    W_POST_ATTN_NORM,
    W_POST_FFW_NORM,
    W__COUNT
} wname;

/* GGUF and Hugging Face names; per-layer ones take the layer index. */
static const char *const gguf_names[W__COUNT] = {"token_embd.weight",
                                                 "output_norm.weight",
                                                 "output.weight",
                                                 "blk.%d.attn_norm.weight",
                                                 "blk.%d.attn_q.weight",
                                                 "blk.%d.attn_k.weight",
                                                 "blk.%d.attn_v.weight",
                                                 "blk.%d.attn_output.weight",
                                                 "blk.%d.attn_q.bias",
                                                 "blk.%d.attn_k.bias",
                                                 "blk.%d.attn_v.bias",
                                                 "blk.%d.attn_output.bias",
                                                 "blk.%d.attn_q_norm.weight",
                                                 "blk.%d.attn_k_norm.weight",
                                                 "blk.%d.ffn_norm.weight",
                                                 "blk.%d.ffn_gate.weight",
                                                 "blk.%d.ffn_up.weight",
                                                 "blk.%d.ffn_down.weight",
                                                 "blk.%d.ffn_gate.bias",
                                                 "blk.%d.ffn_up.bias",
                                                 "blk.%d.ffn_down.bias",
                                                 "blk.%d.post_attention_norm.weight",
                                                 "blk.%d.post_ffw_norm.weight"};
static const char *const hf_names[W__COUNT] = {"model.embed_tokens.weight",
                                               "model.norm.weight",
                                               "lm_head.weight",
                                               "model.layers.%d.input_layernorm.weight",
                                               "model.layers.%d.self_attn.q_proj.weight",
                                               "model.layers.%d.self_attn.k_proj.weight",
                                               "model.layers.%d.self_attn.v_proj.weight",
                                               "model.layers.%d.self_attn.o_proj.weight",
                                               "model.layers.%d.self_attn.q_proj.bias",
                                               "model.layers.%d.self_attn.k_proj.bias",
                                               "model.layers.%d.self_attn.v_proj.bias",
                                               "model.layers.%d.self_attn.o_proj.bias",
                                               "model.layers.%d.self_attn.q_norm.weight",
                                               "model.layers.%d.self_attn.k_norm.weight",
                                               "model.layers.%d.post_attention_layernorm.weight",
                                               "model.layers.%d.mlp.gate_proj.weight",
                                               "model.layers.%d.mlp.up_proj.weight",
                                               "model.layers.%d.mlp.down_proj.weight",
                                               "model.layers.%d.mlp.gate_proj.bias",
                                               "model.layers.%d.mlp.up_proj.bias",
                                               "model.layers.%d.mlp.down_proj.bias",
                                               NULL,
                                               NULL};
/* Gemma 3 folders name the norms around each block differently: their
 * post_attention_layernorm follows attention, pre_feedforward_layernorm
 * is the pre-FFN norm Llama calls post_attention_layernorm. */
static const char *hf_name(const khub_model *m, wname which)
{
    if (m->cfg.arch != KHUB_ARCH_GEMMA3) return hf_names[which];
    switch (which) {
    case W_FFN_NORM: return "model.layers.%d.pre_feedforward_layernorm.weight";
    case W_POST_ATTN_NORM: return "model.layers.%d.post_attention_layernorm.weight";
    case W_POST_FFW_NORM: return "model.layers.%d.post_feedforward_layernorm.weight";
    default: return hf_names[which];
    }
}

/* Finds tensor `which` (of layer L) in m's file. *found is false when it is
 * absent, with no error set (the caller decides whether it is required). */
static khub_status find_src(khub_model *m, wname which, int L, khub__wsrc *src, bool *found)
{
    char name[128];
    const char *fmt = m->gguf ? gguf_names[which] : hf_name(m, which);
    snprintf(name, sizeof name, fmt, L);
    memset(src, 0, sizeof *src);
    *found = false;
    if (m->gguf) {
        const khub_gguf_tensor *t = khub__gguf_tensor_find(m->gguf, name);
        if (!t) return KHUB_STATUS_OK;
        KHUB_FORWARD_IF_ERROR(m->rt, khub__gguf_tensor_dtype(m->gguf, t, &src->dtype));
        for (uint32_t d = 2; d < t->n_dims; d++)
            KHUB_RETURN_IF(m->rt, t->ne[d] != 1, KHUB_STATUS_MODEL_INVALID,
                           "%s: tensor '%s' has %u dimensions, expected at most 2", m->file,
                           t->name, t->n_dims);
        src->name = t->name;
        src->ndim = t->n_dims == 1 ? 1 : 2;
        src->shape[0] = src->ndim == 1 ? t->ne[0] : t->ne[1]; /* GGUF order is reversed */
        src->shape[1] = src->ndim == 1 ? 1 : t->ne[0];
        src->data = t->data;
        src->nbytes = t->nbytes;
    } else {
        const khub_st_tensor *t = khub__safetensors_find(m->st, name);
        if (!t) return KHUB_STATUS_OK;
        KHUB_FORWARD_IF_ERROR(m->rt, khub__safetensors_get_weight(m->st, name, &t));
        KHUB_RETURN_IF(m->rt, t->ndim < 1 || t->ndim > 2, KHUB_STATUS_MODEL_INVALID,
                       "%s: tensor '%s' has %d dimensions, expected 1 or 2", m->file, t->name,
                       (int)t->ndim);
        src->name = t->name;
        src->ndim = t->ndim;
        src->shape[0] = t->shape[0];
        src->shape[1] = t->ndim == 2 ? t->shape[1] : 1;
        src->dtype = t->dtype;
        src->data = t->data;
        src->nbytes = t->nbytes;
    }
    *found = true;
    return KHUB_STATUS_OK;
}

/* Loads tensor `which` as a view of shape want (ndim 1 or 2). Required
 * tensors that are absent fail with "<file>: tensor 'x' missing". */
static khub_status load_weight(khub_model *m, wname which, int L, int32_t ndim, int64_t d0,
                               int64_t d1, bool required, khub__weight *w, bool *found)
{
    khub__wsrc src;
    bool have;
    KHUB_FORWARD_IF_ERROR(m->rt, find_src(m, which, L, &src, &have));
    if (found) *found = have;
    if (!have) {
        char name[128];
        snprintf(name, sizeof name, m->gguf ? gguf_names[which] : hf_name(m, which), L);
        KHUB_RETURN_IF(m->rt, required, KHUB_STATUS_MODEL_INVALID, "%s: tensor '%s' missing",
                       m->file, name);
        return KHUB_STATUS_OK;
    }
    int64_t want[2] = {d0, d1};
    KHUB_FORWARD_IF_ERROR(m->rt, khub__weight_view(m->rt, m->file, w, &src, ndim, want));
    m->info.n_params += (uint64_t)(d0 * (ndim == 2 ? d1 : 1));
    return KHUB_STATUS_OK;
}

/* Where each projection goes under tensor parallelism (tp.h). */
static khub__tp_split tp_split(const khub_model *m, wname which)
{
    bool gather = m->tp.plan == KHUB_TP_PLAN_GATHER;
    switch (which) {
    case W_Q: return KHUB__TP_COL_Q;
    case W_K:
    case W_V: return KHUB__TP_COL_KV;
    case W_O: return gather ? KHUB__TP_COL_HIDDEN : KHUB__TP_ROW_HEADS;
    case W_GATE:
    case W_UP: return KHUB__TP_COL_FFN;
    case W_DOWN: return gather ? KHUB__TP_COL_HIDDEN : KHUB__TP_ROW_FFN;
    case W_LM_HEAD: return KHUB__TP_COL_VOCAB;
    default: return KHUB__TP_REPLICATE;
    }
}

static khub__role mat_role(wname which)
{
    switch (which) {
    case W_Q:
    case W_K:
    case W_V: return KHUB__ROLE_QKV;
    case W_O: return KHUB__ROLE_O;
    case W_GATE:
    case W_UP: return KHUB__ROLE_GATE_UP;
    case W_DOWN: return KHUB__ROLE_DOWN;
    default: return KHUB__ROLE_LM_HEAD;
    }
}

/* ======================================================================== */
/* Quantize at load                                                         */
/* ======================================================================== */

khub_status khub__model_parse_quant(khub_runtime *rt, const char *s, load_prefs *p)
{
    static const struct {
        const char *name;
        khub_qformat f;
    } schemes[] = {{"int8", KHUB_QFORMAT_INT8_ROW},
                   {"nf4", KHUB_QFORMAT_NF4},
                   {"q8_0", KHUB_QFORMAT_Q8_0},
                   {"q4_0", KHUB_QFORMAT_Q4_0}};
    p->quant = KHUB_QFORMAT_NONE;
    p->pref[KHUB_KERNEL_ROLE_QUANT] = NULL;
    if (!s || !*s) return KHUB_STATUS_OK;
    const char *scheme = s, *colon = strchr(s, ':');
    if (colon || strchr(s, '/')) {
        size_t n = colon ? (size_t)(colon - s) : strlen(s);
        KHUB_RETURN_IF(rt, n == 0 || n >= sizeof p->quant_plugin_buf, KHUB_STATUS_INVALID_ARG,
                       "quant '%s': the plugin id before ':' is empty or too long", s);
        memcpy(p->quant_plugin_buf, s, n);
        p->quant_plugin_buf[n] = '\0';
        p->pref[KHUB_KERNEL_ROLE_QUANT] = p->quant_plugin_buf;
        if (!colon) return KHUB_STATUS_OK;
        scheme = colon + 1;
    }
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        if (strcmp(scheme, schemes[i].name) == 0) {
            p->quant = schemes[i].f;
            return KHUB_STATUS_OK;
        }
    }
    return khub__fail(rt, KHUB_STATUS_INVALID_ARG,
                      "quant scheme '%s' is not known (known: int8, nf4, q8_0, q4_0)", scheme);
}

/* Quantizes a dense matrix with the qlinear plugin's quantize method, 64
 * rows at a time through an f32 staging buffer, into a block w owns. */
static khub_status quantize_mat(khub_model *m, const load_prefs *p, khub__mat *mat)
{
    khub__weight *w = &mat->w;
    int64_t rows = w->shape[0], cols = w->shape[1];
    if (khub_qformat_row_bytes(p->quant, cols) < 0) {
        KHUB_LOG_W(m->rt,
                   "%s: '%s' has rows of %lld, not a whole number of %s blocks; "
                   "kept as %s",
                   m->file, w->name, (long long)cols, khub__dtype_short(KHUB_DTYPE_Q(p->quant)),
                   khub__dtype_short(w->t.dtype));
        return KHUB_STATUS_OK;
    }
    khub_binding *qb = NULL;
    KHUB_FORWARD_IF_ERROR(m->rt,
                          khub__model_bind_qmethod(m, KHUB__ROLE_QUANTIZE,
                                                   KHUB_DTYPE_ID_QBASE + (int32_t)p->quant, true,
                                                   p->pref[KHUB_KERNEL_ROLE_QUANT], &qb));
    size_t qbytes, row_q = (size_t)khub_qformat_row_bytes(p->quant, cols);
    KHUB_RETURN_IF(m->rt, !khub__mul_ok(row_q, (size_t)rows, &qbytes), KHUB_STATUS_OVERFLOW,
                   "%s: '%s' too large to quantize", m->file, w->name);
    enum { CHUNK = 64 };
    uint8_t *dst = khub__aligned_alloc(m->rt, qbytes);
    float *stage = khub__aligned_alloc(m->rt, (size_t)CHUNK * (size_t)cols * sizeof(float));
    khub_status st = KHUB_STATUS_NOMEM;
    if (!dst || !stage) {
        khub__fail(m->rt, st, "%s: no memory to quantize '%s' (%zu bytes)", m->file, w->name,
                   qbytes);
        goto fail;
    }
    void *state = NULL;
    const khub_op_desc *op = khub_binding_acquire(qb, &state);
    const khub_qlinear_methods *qm = op ? op->methods : NULL;
    st = KHUB_STATUS_OK;
    if (!qm || !qm->quantize) {
        st = khub__fail(m->rt, KHUB_STATUS_NO_KERNEL, "%s: %s has no quantize method", m->file,
                        khub_binding_name(qb));
    }
    for (int64_t r = 0; r < rows && st == KHUB_STATUS_OK; r += CHUNK) {
        int64_t n = rows - r < CHUNK ? rows - r : CHUNK;
        int32_t ids[CHUNK]; /* rows [r, r + n), converted to f32 like embedding rows */
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(r + i);
        st = khub__weight_rows(m->rt, w, ids, n, stage, NULL, NULL);
        if (st != KHUB_STATUS_OK) break;
        khub_quant_args a = {KHUB_STRUCT_INIT(khub_quant_args),
                             .format = p->quant,
                             .n_rows = n,
                             .n_cols = cols,
                             .src = stage,
                             .dst = dst + (size_t)r * row_q};
        st = qm->quantize(state, &a);
        if (st != KHUB_STATUS_OK)
            khub__fail(m->rt, st, "%s: quantizing '%s' with %s failed", m->file, w->name,
                       khub_binding_name(qb));
    }
    khub_binding_release(qb);
    if (st != KHUB_STATUS_OK) goto fail;
    khub__aligned_free(m->rt, stage);
    if (w->owned) khub__aligned_free(m->rt, w->owned);
    w->owned = dst;
    w->owned_bytes = qbytes;
    w->t.data = dst;
    w->t.dtype = KHUB_DTYPE_Q(p->quant);
    return KHUB_STATUS_OK;
fail:
    khub__aligned_free(m->rt, stage);
    khub__aligned_free(m->rt, dst);
    return st;
}

/* ======================================================================== */
/* Weights                                                                  */
/* ======================================================================== */

/* Loads a projection [out, in] with its optional bias, quantizes it when
 * asked, and binds its op. */
static khub_status load_mat(khub_model *m, const load_prefs *p, wname which, wname bias_w, int L,
                            int64_t out, int64_t in, bool want_bias, khub__mat *mat)
{
    KHUB_FORWARD_IF_ERROR(m->rt, load_weight(m, which, L, 2, out, in, true, &mat->w, NULL));
    if (want_bias) {
        KHUB_FORWARD_IF_ERROR(m->rt, load_weight(m, bias_w, L, 1, out, 0, true, &mat->bias, NULL));
        KHUB_FORWARD_IF_ERROR(m->rt, khub__weight_to_f32(m->rt, &mat->bias));
    }
    bool dense = mat->w.t.dtype.code != KHUB_DL_BLOCKQ;
    bool embedish = which == W_LM_HEAD;
    if (p->quant != KHUB_QFORMAT_NONE && dense && (!embedish || p->quant_embeddings))
        KHUB_FORWARD_IF_ERROR(m->rt, quantize_mat(m, p, mat));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_shard(m, tp_split(m, which), mat));
    return khub__model_bind_mat(m, p, mat_role(which), mat);
}

/* Loads a norm weight as f32. With norm_plus_one (Gemma folders: the model
 * scales by 1 + w) the 1 is added once here, into a copy the weight owns, so
 * every norm op sees a plain scale, as in a GGUF file. */
static khub_status load_norm(khub_model *m, wname which, int L, int64_t dim, khub__weight *w)
{
    KHUB_FORWARD_IF_ERROR(m->rt, load_weight(m, which, L, 1, dim, 0, true, w, NULL));
    bool was_f32 = khub_dtype_id_of(w->t.dtype) == KHUB_DTYPE_ID_F32;
    KHUB_FORWARD_IF_ERROR(m->rt, khub__weight_to_f32(m->rt, w));
    if (!m->cfg.norm_plus_one) return KHUB_STATUS_OK;
    if (was_f32 || !w->owned) { /* still a view of the file: copy before writing */
        size_t bytes = (size_t)dim * sizeof(float);
        float *cp = khub__aligned_alloc(m->rt, bytes);
        KHUB_RETURN_IF(m->rt, !cp, KHUB_STATUS_NOMEM, "%s: no memory for '%s'", m->file, w->name);
        memcpy(cp, w->t.data, bytes);
        if (w->owned) khub__aligned_free(m->rt, w->owned);
        w->owned = cp;
        w->owned_bytes = bytes;
        w->t.data = cp;
    }
    float *v = w->t.data;
    for (int64_t i = 0; i < dim; i++) v[i] += 1.0f;
    return KHUB_STATUS_OK;
}

khub_status khub__model_load_layer(khub_model *m, const load_prefs *p, int L)
{
    const khub_model_config *c = &m->cfg;
    khub__layer *ly = &m->layers[L];
    int64_t h = c->hidden_size, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    int64_t ff = c->intermediate_size;
    bool ab = c->attention_bias, mb = c->mlp_bias;
    KHUB_FORWARD_IF_ERROR(m->rt, load_norm(m, W_ATTN_NORM, L, h, &ly->attn_norm));
    KHUB_FORWARD_IF_ERROR(m->rt, load_mat(m, p, W_Q, W_Q_BIAS, L, qd, h, ab, &ly->q));
    KHUB_FORWARD_IF_ERROR(m->rt, load_mat(m, p, W_K, W_K_BIAS, L, kvd, h, ab, &ly->k));
    KHUB_FORWARD_IF_ERROR(m->rt, load_mat(m, p, W_V, W_V_BIAS, L, kvd, h, ab, &ly->v));
    /* Qwen2 has q/k/v biases only; Llama's attention_bias covers o_proj too. */
    bool ob = ab && c->arch != KHUB_ARCH_QWEN2;
    KHUB_FORWARD_IF_ERROR(m->rt, load_mat(m, p, W_O, W_O_BIAS, L, h, qd, ob, &ly->o));
    if (c->qk_norm) {
        KHUB_FORWARD_IF_ERROR(m->rt, load_norm(m, W_Q_NORM, L, c->head_dim, &ly->q_norm));
        KHUB_FORWARD_IF_ERROR(m->rt, load_norm(m, W_K_NORM, L, c->head_dim, &ly->k_norm));
    }
    KHUB_FORWARD_IF_ERROR(m->rt, load_norm(m, W_FFN_NORM, L, h, &ly->ffn_norm));
    if (c->post_norms) {
        KHUB_FORWARD_IF_ERROR(m->rt, load_norm(m, W_POST_ATTN_NORM, L, h, &ly->post_attn_norm));
        KHUB_FORWARD_IF_ERROR(m->rt, load_norm(m, W_POST_FFW_NORM, L, h, &ly->post_ffw_norm));
    }
    KHUB_FORWARD_IF_ERROR(m->rt, load_mat(m, p, W_GATE, W_GATE_BIAS, L, ff, h, mb, &ly->gate));
    KHUB_FORWARD_IF_ERROR(m->rt, load_mat(m, p, W_UP, W_UP_BIAS, L, ff, h, mb, &ly->up));
    KHUB_FORWARD_IF_ERROR(m->rt, load_mat(m, p, W_DOWN, W_DOWN_BIAS, L, h, ff, mb, &ly->down));
    bool slides =
        c->sliding_pattern > 0 ? (L + 1) % c->sliding_pattern != 0 : L >= c->sliding_from_layer;
    ly->window = c->sliding_window > 0 && slides ? c->sliding_window : 0;
    ly->rope_theta =
        ly->window > 0 && c->rope_theta_local > 0 ? c->rope_theta_local : c->rope_theta;
    return KHUB_STATUS_OK;
}

/* Embedding, final norm and lm_head (tied to the embedding when the config
 * says so or the file has no lm_head). */
khub_status khub__model_load_ends(khub_model *m, const load_prefs *p)
{
    const khub_model_config *c = &m->cfg;
    int64_t V = c->vocab_size, h = c->hidden_size;
    KHUB_FORWARD_IF_ERROR(m->rt, load_weight(m, W_EMBED, 0, 2, V, h, true, &m->embed, NULL));
    KHUB_FORWARD_IF_ERROR(m->rt, load_norm(m, W_FINAL_NORM, 0, h, &m->final_norm));
    bool found = false;
    if (!c->tie_word_embeddings)
        KHUB_FORWARD_IF_ERROR(m->rt,
                              load_weight(m, W_LM_HEAD, 0, 2, V, h, true, &m->lm_head.w, &found));
    if (!found) {
        m->lm_head.w = m->embed;
        m->lm_head.w.owned = NULL; /* borrowed from embed */
        m->lm_head.w.owned_bytes = 0;
        m->lm_head.w.t.shape = m->lm_head.w.shape;
    }
    bool dense = m->lm_head.w.t.dtype.code != KHUB_DL_BLOCKQ;
    if (p->quant != KHUB_QFORMAT_NONE && dense && p->quant_embeddings)
        KHUB_FORWARD_IF_ERROR(m->rt, quantize_mat(m, p, &m->lm_head));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_shard(m, KHUB__TP_COL_VOCAB, &m->lm_head));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__model_bind_mat(m, p, KHUB__ROLE_LM_HEAD, &m->lm_head));
    if (p->pref[KHUB_KERNEL_ROLE_EMBEDDING]) return khub__model_bind_embedding(m, p);
    if (m->embed.t.dtype.code == KHUB_DL_BLOCKQ)
        KHUB_FORWARD_IF_ERROR(
            m->rt, khub__model_bind_qmethod(m, KHUB__ROLE_EMBED_DEQUANT,
                                            khub_dtype_id_of(m->embed.t.dtype), false,
                                            p->pref[KHUB_KERNEL_ROLE_QUANT], &m->dequant));
    return KHUB_STATUS_OK;
}
