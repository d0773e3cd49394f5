/*
 * model.c: khub_model_load and friends: the config, the weights (views into
 * the mmapped GGUF or safetensors files), quantize-at-load, the op bindings,
 * the KV cache and the scratch. See executor.h for the model's layout and
 * weights.h for the GGUF Q/K permutation.
 *
 * Loading is all-or-nothing: any failure frees what was made and leaves
 * *out NULL, with a message that names the file and the tensor or field.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "executor.h"
#include "khub/khub_kernels.h"
#include "gguf.h"
#include "safetensors.h"
#include "tokenizer.h"

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

/* ======================================================================== */
/* Bindings                                                                 */
/* ======================================================================== */

static const char *const role_names[KHUB__ROLE__COUNT] = {
    "embed_dequant", "quantize",  "rms_norm", "rms_norm+residual", "qkv_proj",     "rotary",
    "kv_cache",      "attention", "o_proj",   "gate_up_proj",      "silu_and_mul", "down_proj",
    "lm_head"};

typedef struct load_prefs {
    /* The preferred plugin of each kernel role (KHUB_KERNEL_ROLES), from
     * khub_model_opts; [KHUB_KERNEL_ROLE_QUANT] is the plugin id part of
     * opts.quant, or NULL. */
    const char *pref[KHUB_KERNEL_ROLE__COUNT];
    char quant_plugin_buf[128];
    khub_qformat quant; /* scheme, NONE = keep dtypes */
    int strict;
    int quant_embeddings;
} load_prefs;

/* The binding for (role, dtype_id), selecting it on first use. */
static khub_status bind(khub_model *m, khub__role role, uint32_t kind, int32_t dtype_id,
                        uint32_t flags, const char *pref, khub_binding **out)
{
    for (int i = 0; i < m->n_bound; i++) {
        if (m->bound[i].role == role && m->bound[i].dtype_id == dtype_id) {
            *out = m->bound[i].b;
            return KHUB_STATUS_OK;
        }
    }
    KHUB_RETURN_IF(m->rt, m->n_bound >= (int)(sizeof m->bound / sizeof m->bound[0]),
                   KHUB_STATUS_INTERNAL, "%s: too many op bindings", m->file);
    /* pref is "plugin/id" or "plugin/id:op" (an op inside it, as a Hub ID's
     * :symbol names one). */
    char pid[160] = "", *op = NULL;
    if (pref) {
        snprintf(pid, sizeof pid, "%s", pref);
        char *colon = strchr(pid, ':');
        if (colon) *colon = '\0', op = colon + 1;
    }
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = kind,
                       .device_type = KHUB_DEVICE_CPU,
                       .dtype_id = dtype_id,
                       .head_dim = role == KHUB__ROLE_ATTENTION ? (int32_t)m->cfg.head_dim : 0,
                       .flags = flags,
                       .plugin_id = pref ? pid : NULL,
                       .op_name = op && *op ? op : NULL};
    khub_binding *b = NULL;
    khub_status st = khub_registry_select(m->rt, &q, &b);
    if (st != KHUB_STATUS_OK) return st; /* the registry's message names the op */
    m->bound[m->n_bound++] = (khub__bound){role, dtype_id, b};
    KHUB_LOG_I(m->rt, "%s -> %s", role_names[role], khub_binding_name(b));
    *out = b;
    return KHUB_STATUS_OK;
}

/* True when b's op has the qlinear method asked for (quantize or dequantize). */
static bool has_qmethod(const khub_binding *b, bool quantize)
{
    void *state;
    const khub_qlinear_methods *qm = khub_binding_methods(b, &state);
    if (!qm || qm->struct_size < offsetof(khub_qlinear_methods, dequantize) + sizeof(void *))
        return false;
    return quantize ? qm->quantize != NULL : qm->dequantize != NULL;
}

/* Binds a qlinear op of dtype_id that has the method asked for. The best
 * ranked qlinear may lack it (methods are optional), so when it does, the
 * loaded plugins are asked one by one for a qlinear op that has it. */
static khub_status bind_qmethod(khub_model *m, khub__role role, int32_t dtype_id, bool quantize,
                                const char *pref, khub_binding **out)
{
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, role, KHUB_OP_QLINEAR, dtype_id, 0, pref, out));
    if (has_qmethod(*out, quantize)) return KHUB_STATUS_OK;
    m->n_bound--; /* forget the binding without the method */
    for (size_t i = 0; i < khub_plugin_count(m->rt); i++) {
        const khub_plugin *pl = khub_plugin_at(m->rt, i);
        for (uint32_t k = 0; k < khub_plugin_op_count(pl); k++) {
            const khub_op_desc *op = khub_plugin_op(pl, k);
            const khub_qlinear_methods *qm = op ? op->methods : NULL;
            if (!op || op->kind != KHUB_OP_QLINEAR || !qm ||
                !(quantize ? qm->quantize : qm->dequantize))
                continue;
            khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query), .kind = KHUB_OP_QLINEAR,
                               .device_type = KHUB_DEVICE_CPU,  .dtype_id = dtype_id,
                               .plugin_id = khub_plugin_id(pl), .op_name = op->name};
            khub_binding *b = NULL;
            if (khub_registry_select(m->rt, &q, &b) != KHUB_STATUS_OK) {
                khub__clear(m->rt);
                continue;
            }
            if (!has_qmethod(b, quantize)) continue;
            m->bound[m->n_bound++] = (khub__bound){role, dtype_id, b};
            *out = b;
            return KHUB_STATUS_OK;
        }
    }
    return khub__fail(m->rt, KHUB_STATUS_NO_KERNEL,
                      "%s: no loaded qlinear plugin can %s %s weights; load one that does "
                      "(khub/ref-cpu can)",
                      m->file, quantize ? "quantize to" : "dequantize",
                      khub__dtype_short(KHUB_DTYPE_Q(dtype_id - KHUB_DTYPE_ID_QBASE)));
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

/* Binds the linear (dense) or qlinear (block format) op for mat's dtype. A
 * dense f16/bf16 weight that no linear plugin serves is converted to f32
 * once, with a log line, rather than failing. */
static khub_status bind_mat(khub_model *m, const load_prefs *p, khub__role role, khub__mat *mat)
{
    khub_dtype dt = mat->w.t.dtype;
    bool q = dt.code == KHUB_DL_BLOCKQ;
    uint32_t flags = mat->bias.t.data ? KHUB_CAP_BIAS : 0;
    const char *pref = q && p->pref[KHUB_KERNEL_ROLE_QUANT] ? p->pref[KHUB_KERNEL_ROLE_QUANT]
                                                            : p->pref[KHUB_KERNEL_ROLE_LINEAR];
    khub_status st = bind(m, role, q ? KHUB_OP_QLINEAR : KHUB_OP_LINEAR, khub_dtype_id_of(dt),
                          flags, pref, &mat->op);
    if (st != KHUB_STATUS_NO_KERNEL || q || khub_dtype_id_of(dt) == KHUB_DTYPE_ID_F32) return st;
    khub__clear(m->rt);
    KHUB_LOG_I(m->rt, "%s: no linear op takes %s weights; using an f32 copy of '%s'", m->file,
               khub__dtype_short(dt), mat->w.name);
    KHUB_FORWARD_IF_ERROR(m->rt, khub__weight_to_f32(m->rt, &mat->w));
    return bind(m, role, KHUB_OP_LINEAR, KHUB_DTYPE_ID_F32, flags, pref, &mat->op);
}

/* ======================================================================== */
/* Quantize at load                                                         */
/* ======================================================================== */

static khub_status parse_quant(khub_runtime *rt, const char *s, load_prefs *p)
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
    KHUB_FORWARD_IF_ERROR(m->rt, bind_qmethod(m, KHUB__ROLE_QUANTIZE,
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
    return bind_mat(m, p, mat_role(which), mat);
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

static khub_status load_layer(khub_model *m, const load_prefs *p, int L)
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
static khub_status load_ends(khub_model *m, const load_prefs *p)
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
    KHUB_FORWARD_IF_ERROR(m->rt, bind_mat(m, p, KHUB__ROLE_LM_HEAD, &m->lm_head));
    if (m->embed.t.dtype.code == KHUB_DL_BLOCKQ)
        KHUB_FORWARD_IF_ERROR(m->rt, bind_qmethod(m, KHUB__ROLE_EMBED_DEQUANT,
                                                  khub_dtype_id_of(m->embed.t.dtype), false,
                                                  p->pref[KHUB_KERNEL_ROLE_QUANT], &m->dequant));
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Ops without weights and the KV cache                                     */
/* ======================================================================== */

static khub_status bind_ops(khub_model *m, const load_prefs *p)
{
    const khub_model_config *c = &m->cfg;
    int kv_id = khub_dtype_id_of(m->kv_dtype);
    uint32_t aflags = KHUB_CAP_CAUSAL | KHUB_CAP_STRIDED_KV;
    if (c->n_kv_heads < c->n_heads) aflags |= KHUB_CAP_GQA;
    if (kv_id == KHUB_DTYPE_ID_F16) aflags |= KHUB_CAP_KV_F16;
    if (c->sliding_window > 0) aflags |= KHUB_CAP_SLIDING;
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, KHUB__ROLE_NORM, KHUB_OP_NORM, KHUB_DTYPE_ID_F32, 0,
                                      p->pref[KHUB_KERNEL_ROLE_NORM], &m->norm));
    KHUB_FORWARD_IF_ERROR(m->rt,
                          bind(m, KHUB__ROLE_NORM_RESIDUAL, KHUB_OP_NORM, KHUB_DTYPE_ID_F32,
                               KHUB_CAP_RESIDUAL, p->pref[KHUB_KERNEL_ROLE_NORM], &m->norm_res));
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, KHUB__ROLE_ROTARY, KHUB_OP_ROTARY, KHUB_DTYPE_ID_F32, 0,
                                      p->pref[KHUB_KERNEL_ROLE_ROTARY], &m->rotary));
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, KHUB__ROLE_ACT, KHUB_OP_ACTIVATION, KHUB_DTYPE_ID_F32, 0,
                                      p->pref[KHUB_KERNEL_ROLE_ACTIVATION], &m->act));
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, KHUB__ROLE_ATTENTION, KHUB_OP_ATTENTION, kv_id, aflags,
                                      p->pref[KHUB_KERNEL_ROLE_ATTENTION], &m->attention));
    return bind(m, KHUB__ROLE_KV_CACHE, KHUB_OP_KV_CACHE, kv_id, 0, p->pref[KHUB_KERNEL_ROLE_CACHE],
                &m->kv_op);
}

static khub_status make_cache(khub_model *m)
{
    const khub_model_config *c = &m->cfg;
    void *state = NULL;
    const khub_op_desc *op = khub_binding_acquire(m->kv_op, &state);
    const khub_kv_cache_methods *kv = op ? op->methods : NULL;
    khub_status st = KHUB_STATUS_OK;
    if (!kv || !kv->create || !kv->destroy || !kv->write || !kv->view || !kv->truncate) {
        st = khub__fail(m->rt, KHUB_STATUS_PLUGIN_INVALID, "%s: %s lacks a KV cache method",
                        m->file, khub_binding_name(m->kv_op));
    } else {
        khub_kv_cache_config cc = {KHUB_STRUCT_INIT(khub_kv_cache_config),
                                   .n_layers = (int32_t)c->n_layers,
                                   .n_kv_heads = (int32_t)c->n_kv_heads,
                                   .head_dim = (int32_t)c->head_dim,
                                   .n_seqs = m->max_seqs,
                                   .max_tokens = m->max_context,
                                   .dtype = m->kv_dtype};
        st = kv->create(state, &cc, &m->cache);
        if (st != KHUB_STATUS_OK)
            khub__fail(m->rt, st,
                       "%s: creating a KV cache of %lld tokens x %d sequences in %s "
                       "failed",
                       m->file, (long long)m->max_context, (int)m->max_seqs,
                       khub_binding_name(m->kv_op));
        m->kv = kv;
        m->kv_state = state;
    }
    khub_binding_release(m->kv_op);
    if (st == KHUB_STATUS_OK) {
        size_t per = (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)c->head_dim * 2 *
                     (size_t)(m->kv_dtype.bits / 8);
        m->info.scratch_bytes += per * (size_t)m->max_context * (size_t)m->max_seqs;
    }
    return st;
}

/* ======================================================================== */
/* khub_model_load                                                          */
/* ======================================================================== */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static khub_status read_opts(khub_runtime *rt, const khub_model_opts *in, khub_model_opts *o,
                             load_prefs *p)
{
    memset(o, 0, sizeof *o);
    if (in) {
        KHUB_RETURN_IF(rt, in->struct_size < offsetof(khub_model_opts, n_threads),
                       KHUB_STATUS_STRUCT_SIZE, "khub_model_load: opts.struct_size %u is too small",
                       (unsigned)in->struct_size);
        memcpy(o, in, in->struct_size < sizeof *o ? in->struct_size : sizeof *o);
    }
    int pool = khub__pool_size(khub__runtime_pool(rt));
    KHUB_RETURN_IF(rt, o->n_threads != 0 && o->n_threads != pool, KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: n_threads %d differs from the runtime's pool of %d; set "
                   "khub_runtime_opts.n_threads instead",
                   (int)o->n_threads, pool);
    KHUB_RETURN_IF(rt, o->device.device_type != 0 && o->device.device_type != KHUB_DEVICE_CPU,
                   KHUB_STATUS_UNSUPPORTED,
                   "khub_model_load: device type %d is not supported "
                   "by the executor yet (only the CPU)",
                   (int)o->device.device_type);
    int kv_id = khub_dtype_id_of(o->kv_dtype);
    KHUB_RETURN_IF(
        rt, o->kv_dtype.bits != 0 && kv_id != KHUB_DTYPE_ID_F32 && kv_id != KHUB_DTYPE_ID_F16,
        KHUB_STATUS_INVALID_ARG, "khub_model_load: KV dtype must be f32 or f16");
    KHUB_RETURN_IF(rt,
                   o->max_context < 0 || o->max_batch < 0 || o->max_seqs < 0 ||
                       o->max_batch > 65536 || o->max_seqs > 256,
                   KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: max_context %lld, max_batch %d or max_seqs %d out of range",
                   (long long)o->max_context, (int)o->max_batch, (int)o->max_seqs);
    memset(p, 0, sizeof *p);
    /* Every role's option field, from the one role table; quant is parsed
     * below (a scheme, optionally after a plugin id). */
#define PREF(NAME, name, flag, field) p->pref[KHUB_KERNEL_ROLE_##NAME] = o->field;
    KHUB_KERNEL_ROLES(PREF)
#undef PREF
    p->strict = o->strict;
    p->quant_embeddings = o->quant_embeddings;
    return parse_quant(rt, o->quant, p);
}

static const char *base_name(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *s = path + n;
    while (s > path && s[-1] != '/') s--;
    return s;
}

/* Opens the file(s): config, weights and tokenizer. */
static khub_status open_source(khub_model *m, const char *path)
{
    struct stat sb;
    KHUB_RETURN_IF(m->rt, stat(path, &sb) != 0, KHUB_STATUS_NOT_FOUND,
                   "%s: no such file or folder; pass a .gguf file or a Hugging Face model folder",
                   path);
    if (S_ISDIR(sb.st_mode)) {
        snprintf(m->info.format, sizeof m->info.format, "safetensors");
        KHUB_FORWARD_IF_ERROR(m->rt, khub__model_config_from_hf_dir(m->rt, path, &m->cfg));
        KHUB_FORWARD_IF_ERROR(m->rt, khub__safetensors_open(m->rt, path, &m->st));
        char tp[1100];
        snprintf(tp, sizeof tp, "%s/tokenizer.json", path);
        if (stat(tp, &sb) == 0) return khub__tokenizer_from_json(m->rt, tp, &m->tok);
        KHUB_LOG_I(m->rt, "%s: no tokenizer.json; only token ids can be used", m->file);
        return KHUB_STATUS_OK;
    }
    snprintf(m->info.format, sizeof m->info.format, "gguf");
    KHUB_FORWARD_IF_ERROR(m->rt, khub__gguf_open(m->rt, path, &m->gguf));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__model_config_from_gguf(m->rt, m->gguf, &m->cfg));
    if (!khub__gguf_find(m->gguf, "tokenizer.ggml.model")) {
        KHUB_LOG_I(m->rt, "%s: no tokenizer in the file; only token ids can be used", m->file);
        return KHUB_STATUS_OK;
    }
    return khub__tokenizer_from_gguf(m->rt, m->gguf, &m->tok);
}

static void fill_info(khub_model *m)
{
    const khub_model_config *c = &m->cfg;
    khub_model_info *i = &m->info;
    i->struct_size = sizeof *i;
    i->abi_major = KHUB_API_VERSION_MAJOR; /* an application struct */
    i->abi_minor = KHUB_API_VERSION_MINOR;
    snprintf(i->arch, sizeof i->arch, "%s", khub__model_arch_name(c->arch));
    i->n_layers = (int32_t)c->n_layers;
    i->hidden = (int32_t)c->hidden_size;
    i->n_heads = (int32_t)c->n_heads;
    i->n_kv_heads = (int32_t)c->n_kv_heads;
    i->head_dim = (int32_t)c->head_dim;
    i->ffn = (int32_t)c->intermediate_size;
    i->vocab = (int32_t)c->vocab_size;
    i->context_length = c->max_position_embeddings;
    i->max_context = m->max_context;
    i->n_eos = c->n_eos;
    for (int e = 0; e < c->n_eos && e < 8; e++) i->eos[e] = c->eos_token_ids[e];
    i->bos = c->bos_token_id;
    i->scratch_bytes += m->scratch_bytes;
    const khub__weight *ws[] = {
        &m->embed, &m->final_norm,
        m->lm_head.w.owned || m->lm_head.w.t.data != m->embed.t.data ? &m->lm_head.w : NULL};
    for (size_t k = 0; k < 3; k++) {
        size_t b;
        if (ws[k] && khub__dtype_bytes(ws[k]->t.dtype, ws[k]->shape[0], ws[k]->shape[1], &b))
            i->weight_bytes += b;
    }
    for (int64_t L = 0; L < c->n_layers; L++) {
        const khub__layer *ly = &m->layers[L];
        const khub__weight *lw[] = {
            &ly->attn_norm,    &ly->ffn_norm, &ly->q_norm, &ly->k_norm,
            &ly->q.w,          &ly->k.w,      &ly->v.w,    &ly->o.w,
            &ly->gate.w,       &ly->up.w,     &ly->down.w, &ly->q.bias,
            &ly->k.bias,       &ly->v.bias,   &ly->o.bias, &ly->post_attn_norm,
            &ly->post_ffw_norm};
        for (size_t k = 0; k < sizeof lw / sizeof lw[0]; k++) {
            size_t b;
            if (lw[k]->t.data &&
                khub__dtype_bytes(lw[k]->t.dtype, lw[k]->shape[0], lw[k]->shape[1], &b))
                i->weight_bytes += b;
        }
    }
}

/* True when some layer projection is stored in scheme q (quantized to it at
 * load, or already so in the file). */
static bool any_in_scheme(const khub_model *m, khub_qformat q)
{
    int32_t want = KHUB_DTYPE_ID_QBASE + (int32_t)q;
    for (int64_t L = 0; L < m->cfg.n_layers; L++) {
        const khub__layer *ly = &m->layers[L];
        const khub__mat *mats[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (khub_dtype_id_of(mats[i]->w.t.dtype) == want) return true;
    }
    return false;
}

static khub_status load(khub_model *m, const char *path, const khub_model_opts *opts)
{
    khub_model_opts o;
    load_prefs p;
    KHUB_FORWARD_IF_ERROR(m->rt, read_opts(m->rt, opts, &o, &p));
    KHUB_FORWARD_IF_ERROR(m->rt, open_source(m, path));
    const khub_model_config *c = &m->cfg;
    m->rope_style = c->rope_style;
    m->kv_dtype = o.kv_dtype.bits ? o.kv_dtype : KHUB_DTYPE_F32;
    int64_t ctx = c->max_position_embeddings > 0 ? c->max_position_embeddings : 4096;
    m->max_context = o.max_context ? o.max_context : (ctx < 4096 ? ctx : 4096);
    if (c->max_position_embeddings > 0 && m->max_context > c->max_position_embeddings)
        KHUB_LOG_W(m->rt,
                   "%s: max_context %lld is beyond the model's trained context %lld "
                   "(max_position_embeddings); positions past it are not what it learned",
                   m->file, (long long)m->max_context, (long long)c->max_position_embeddings);
    m->max_batch = o.max_batch ? o.max_batch : 256;
    m->max_seqs = o.max_seqs ? o.max_seqs : 8;
    KHUB_LOG_I(m->rt, "%s: %s, %lld layers, hidden %lld, %lld/%lld heads of %lld, vocab %lld",
               m->file, khub__model_arch_name(c->arch), (long long)c->n_layers,
               (long long)c->hidden_size, (long long)c->n_heads, (long long)c->n_kv_heads,
               (long long)c->head_dim, (long long)c->vocab_size);

    KHUB_FORWARD_IF_ERROR(m->rt, bind_ops(m, &p));
    m->layers = khub__calloc(m->rt, (size_t)c->n_layers, sizeof *m->layers);
    KHUB_RETURN_IF(m->rt, !m->layers, KHUB_STATUS_NOMEM, "%s: no memory for %lld layers", m->file,
                   (long long)c->n_layers);
    KHUB_FORWARD_IF_ERROR(m->rt, load_ends(m, &p));
    for (int L = 0; L < c->n_layers; L++) {
        KHUB_FORWARD_IF_ERROR(m->rt, load_layer(m, &p, L));
        if (p.quant != KHUB_QFORMAT_NONE && (L + 1) % 8 == 0)
            KHUB_LOG_I(m->rt, "%s: %d/%lld layers quantized", m->file, L + 1,
                       (long long)c->n_layers);
        if (o.progress) o.progress(o.progress_ud, L + 1, (int32_t)c->n_layers);
    }
    /* Quantize-at-load only converts dense projections: say so when none
     * was (a Q4_1 GGUF), instead of quietly keeping them. */
    if (p.quant != KHUB_QFORMAT_NONE && c->n_layers > 0 && !any_in_scheme(m, p.quant))
        khub__log(m->rt, KHUB_LOG_WARN,
                  "%s: quantize-at-load to %s changed nothing: the projections are already %s, "
                  "not dense (only F32/F16/BF16 weights are converted)",
                  m->file, khub__dtype_short(KHUB_DTYPE_Q(p.quant)),
                  khub__dtype_short(m->layers[0].q.w.t.dtype));
    KHUB_FORWARD_IF_ERROR(m->rt, make_cache(m));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_alloc(m));
    fill_info(m);
    return KHUB_STATUS_OK;
}

khub_status khub_model_load(khub_runtime *rt, const char *path, const khub_model_opts *opts,
                            khub_model **out)
{
    KHUB_API_CHECK(rt, rt && path && out);
    khub__clear(rt);
    *out = NULL;
    double t0 = now_ms();
    khub_model *m = khub__calloc(rt, 1, sizeof *m);
    KHUB_RETURN_IF(rt, !m, KHUB_STATUS_NOMEM, "khub_model_load: out of memory");
    m->rt = rt;
    snprintf(m->path, sizeof m->path, "%s", path);
    snprintf(m->file, sizeof m->file, "%s", base_name(path));
    /* strict is the registry's option: set it for the selections of this
     * load only, then put the embedder's value back. */
    int64_t old_strict = 0;
    khub_runtime_get_option(rt, KHUB_OPT_STRICT, &old_strict);
    bool strict = opts &&
                  opts->struct_size >= offsetof(khub_model_opts, strict) + sizeof(int32_t) &&
                  opts->strict;
    if (strict) khub_runtime_set_option(rt, KHUB_OPT_STRICT, 1);
    khub_status st = load(m, path, opts);
    if (strict) {
        char keep[KHUB_ERROR_SIZE];
        khub__copy_error(rt, keep, sizeof keep); /* set_option clears the message */
        khub_runtime_set_option(rt, KHUB_OPT_STRICT, old_strict);
        if (st != KHUB_STATUS_OK) khub__fail(rt, st, "%s", keep);
    }
    if (st != KHUB_STATUS_OK) {
        khub_model_free(m);
        return st;
    }
    m->info.load_ms = now_ms() - t0;
    KHUB_LOG_I(rt, "%s: loaded in %.0f ms (%.1f MiB of weights)", m->file, m->info.load_ms,
               (double)m->info.weight_bytes / (1024.0 * 1024.0));
    *out = m;
    return KHUB_STATUS_OK;
}

static void free_mat(khub_runtime *rt, khub__mat *mat)
{
    khub__weight_free(rt, &mat->w);
    khub__weight_free(rt, &mat->bias);
}

void khub_model_free(khub_model *m)
{
    if (!m) return;
    khub_runtime *rt = m->rt;
    if (m->cache && m->kv) {
        void *state = NULL;
        const khub_op_desc *op = khub_binding_acquire(m->kv_op, &state);
        if (op && op->methods == (const void *)m->kv)
            m->kv->destroy(m->kv_state, m->cache);
        else
            KHUB_LOG_W(rt, "%s: KV cache plugin was reloaded; its cache is leaked", m->file);
        khub_binding_release(m->kv_op);
    }
    khub__forward_free(m);
    for (int64_t L = 0; m->layers && L < m->cfg.n_layers; L++) {
        khub__layer *ly = &m->layers[L];
        khub__weight *ws[] = {&ly->attn_norm, &ly->ffn_norm,       &ly->q_norm,
                              &ly->k_norm,    &ly->post_attn_norm, &ly->post_ffw_norm};
        for (size_t k = 0; k < 6; k++) khub__weight_free(rt, ws[k]);
        khub__mat *ms[] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
        for (size_t k = 0; k < 7; k++) free_mat(rt, ms[k]);
    }
    khub__free(rt, m->layers, m->layers ? (size_t)m->cfg.n_layers * sizeof *m->layers : 0);
    free_mat(rt, &m->lm_head);
    khub__weight_free(rt, &m->embed);
    khub__weight_free(rt, &m->final_norm);
    khub__tokenizer_free(m->tok);
    khub__gguf_close(m->gguf);
    khub__safetensors_close(m->st);
    khub__strfree(rt, m->explain);
    khub__free(rt, m, sizeof *m);
}

khub_status khub_model_info_get(const khub_model *m, khub_model_info *info)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && info && info->struct_size >= sizeof(uint32_t) * 2);
    uint32_t n = info->struct_size < sizeof *info ? info->struct_size : sizeof *info;
    memcpy((char *)info + sizeof(uint32_t), (const char *)&m->info + sizeof(uint32_t),
           n - sizeof(uint32_t));
    info->struct_size = n;
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Explain and tokens                                                       */
/* ======================================================================== */

/* Appends to a growing string; false on OOM. */
static bool append(khub_runtime *rt, char **s, size_t *len, size_t *cap, const char *text)
{
    size_t n = strlen(text);
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 1024);
        while (nc < *len + n + 1) nc *= 2;
        char *p = khub__realloc(rt, *s, *cap, nc);
        if (!p) return false;
        *s = p;
        *cap = nc;
    }
    memcpy(*s + *len, text, n + 1);
    *len += n;
    return true;
}

const char *khub_model_explain(khub_model *m)
{
    if (!m) return "";
    if (m->explain) return m->explain;
    char *s = NULL, line[512];
    size_t len = 0, cap = 0;
    bool ok = true;
    for (int i = 0; i < m->n_bound && ok; i++) {
        const khub__bound *b = &m->bound[i];
        const char *dt = "";
        if (b->dtype_id >= KHUB_DTYPE_ID_QBASE)
            dt = khub__dtype_short(KHUB_DTYPE_Q(b->dtype_id - KHUB_DTYPE_ID_QBASE));
        else if (b->dtype_id == KHUB_DTYPE_ID_F16)
            dt = "f16";
        else if (b->dtype_id == KHUB_DTYPE_ID_BF16)
            dt = "bf16";
        else if (b->dtype_id == KHUB_DTYPE_ID_F32)
            dt = "f32";
        snprintf(line, sizeof line, "%s[%s]: %s\n", role_names[b->role], dt,
                 khub_binding_name(b->b));
        ok = append(m->rt, &s, &len, &cap, line);
        const char *tr = khub_binding_trace(b->b);
        while (ok && tr && *tr) {
            const char *nl = strchr(tr, '\n');
            size_t n = nl ? (size_t)(nl - tr) : strlen(tr);
            snprintf(line, sizeof line, "    %.*s\n", (int)(n < 400 ? n : 400), tr);
            ok = append(m->rt, &s, &len, &cap, line);
            tr = nl ? nl + 1 : tr + n;
        }
    }
    if (!ok || !s) {
        khub__free(m->rt, s, cap);
        return "";
    }
    /* Shrink to strlen + 1 so khub__strfree can release it. */
    m->explain = khub__strdup(m->rt, s);
    khub__free(m->rt, s, cap);
    return m->explain ? m->explain : "";
}

khub_status khub_model_tokenize(khub_model *m, const char *text, int add_bos, int32_t *ids,
                                size_t cap, size_t *n)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && text && n && (ids || cap == 0));
    khub__clear(m->rt);
    KHUB_RETURN_IF(m->rt, !m->tok, KHUB_STATUS_TOKENIZER, "%s: the model has no tokenizer",
                   m->file);
    int32_t *tmp = NULL;
    size_t cnt = 0;
    uint32_t flags = KHUB_TOK_PARSE_SPECIAL | (add_bos ? KHUB_TOK_ADD_SPECIAL : 0);
    KHUB_FORWARD_IF_ERROR(m->rt,
                          khub__tokenizer_encode(m->tok, text, strlen(text), flags, &tmp, &cnt));
    *n = cnt;
    if (cnt <= cap && cnt) memcpy(ids, tmp, cnt * sizeof *ids);
    khub__tokenizer_free_ids(m->tok, tmp, cnt);
    KHUB_RETURN_IF(m->rt, cnt > cap, KHUB_STATUS_OVERFLOW,
                   "khub_model_tokenize: %zu tokens do not fit in %zu", cnt, cap);
    return KHUB_STATUS_OK;
}

khub_status khub_model_detokenize(khub_model *m, const int32_t *ids, size_t n, char *buf,
                                  size_t cap, size_t *len)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && (ids || n == 0) && len && (buf || cap == 0));
    khub__clear(m->rt);
    KHUB_RETURN_IF(m->rt, !m->tok, KHUB_STATUS_TOKENIZER, "%s: the model has no tokenizer",
                   m->file);
    char *s = NULL;
    size_t sl = 0;
    KHUB_FORWARD_IF_ERROR(m->rt, khub__tokenizer_decode(m->tok, ids, n, 0, &s, &sl));
    *len = sl;
    if (sl < cap) memcpy(buf, s, sl + 1);
    khub__strfree(m->rt, s);
    KHUB_RETURN_IF(m->rt, sl >= cap, KHUB_STATUS_OVERFLOW,
                   "khub_model_detokenize: %zu bytes do not fit in %zu", sl + 1, cap);
    return KHUB_STATUS_OK;
}
