/*
 * model_bind.c: a model's op bindings, selected from the registry per
 * (role, dtype) on first use: the linear and qlinear ops of its weights,
 * the ops without weights, the KV cache, and khub_model_explain, which
 * lists them.
 */
#include <stdio.h>
#include <string.h>

#include "model_impl.h"
#include "placement.h"
#include "runtime_impl.h"

/* ======================================================================== */
/* Bindings                                                                 */
/* ======================================================================== */

static const char *const role_names[KHUB__ROLE__COUNT] = {
    "embed_dequant", "quantize",        "rms_norm",     "rms_norm+residual",
    "qkv_proj",      "rotary",          "kv_cache",     "attention",
    "o_proj",        "gate_up_proj",    "silu_and_mul", "down_proj",
    "lm_head",       "paged_attention", "embedding"};

/* A role's name in logs and khub_model_explain: the gated activation is
 * named by the function the model applies (Gemma's is GELU-tanh), not by
 * the op that serves it. */
const char *khub__model_role_name(const khub_model *m, khub__role role)
{
    if (role == KHUB__ROLE_ACT && m->cfg.act == KHUB_ACT_GELU_TANH) return "gelu_tanh_and_mul";
    return role_names[role];
}

/* The binding for (role, dtype_id), selecting it on first use. */
static khub_status bind_layout(khub_model *m, khub__role role, uint32_t kind, int32_t dtype_id,
                               uint64_t flags, uint32_t kv_layout, const char *pref,
                               khub_binding **out)
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
                       .head_dim =
                           role == KHUB__ROLE_ATTENTION || role == KHUB__ROLE_PAGED_ATTENTION
                               ? (int32_t)m->cfg.head_dim
                               : 0,
                       .flags = (uint32_t)(flags & 0xff), /* the 1.0 word's bits */
                       .kind_flags = flags,
                       .plugin_id = pref ? pid : NULL,
                       .op_name = op && *op ? op : NULL,
                       .kv_layout = kv_layout};
    khub_binding *b = NULL;
    khub_status st = khub__registry_select_for(m->rt, &q, m, &b);
    if (st != KHUB_STATUS_OK) return st; /* the registry's message names the op */
    m->bound[m->n_bound++] = (khub__bound){role, dtype_id, b, kind, flags, kv_layout};
    KHUB_LOG_I(m->rt, "%s -> %s", khub__model_role_name(m, role), khub_binding_name(b));
    *out = b;
    return KHUB_STATUS_OK;
}

static khub_status bind(khub_model *m, khub__role role, uint32_t kind, int32_t dtype_id,
                        uint64_t flags, const char *pref, khub_binding **out)
{
    return bind_layout(m, role, kind, dtype_id, flags, 0, pref, out);
}

khub_status khub__model_bind_embedding(khub_model *m, const load_prefs *p)
{
    /* Asked without the scale flag: a scaled model's rows are scaled by the
     * host after the lookup, as after its own (forward.c). */
    return bind(m, KHUB__ROLE_EMBEDDING, KHUB_OP_EMBEDDING, khub_dtype_id_of(m->embed.t.dtype), 0,
                p->pref[KHUB_KERNEL_ROLE_EMBEDDING], &m->embed_op);
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
khub_status khub__model_bind_qmethod(khub_model *m, khub__role role, int32_t dtype_id,
                                     bool quantize, const char *pref, khub_binding **out)
{
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, role, KHUB_OP_QLINEAR, dtype_id, 0, pref, out));
    if (has_qmethod(*out, quantize)) return KHUB_STATUS_OK;
    khub__registry_drop(m->rt, m->bound[--m->n_bound].b); /* the one without the method */
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
            if (khub__registry_select_for(m->rt, &q, m, &b) != KHUB_STATUS_OK) {
                khub__clear(m->rt);
                continue;
            }
            if (!has_qmethod(b, quantize)) {
                khub__registry_drop(m->rt, b);
                continue;
            }
            m->bound[m->n_bound++] = (khub__bound){role, dtype_id, b, KHUB_OP_QLINEAR, 0, 0};
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

/* Binds the linear (dense) or qlinear (block format) op for mat's dtype. A
 * dense f16/bf16 weight that no linear plugin serves is converted to f32
 * once, with a log line, rather than failing. */
khub_status khub__model_bind_mat(khub_model *m, const load_prefs *p, khub__role role,
                                 khub__mat *mat)
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
/* Ops without weights and the KV cache                                     */
/* ======================================================================== */

/* The paged KV layout the bound cache produces, or 0 for a dense cache.
 * The host's copy of the caps holds kv_layouts only for plugins of ABI 1.4
 * and newer (negotiate.c), and a paged cache must have the 1.4 methods. */
static uint32_t kv_layout_of(khub_binding *b)
{
    void *state = NULL;
    const khub_op_desc *op = khub_binding_acquire(b, &state);
    const khub_kv_cache_methods *kv = op ? op->methods : NULL;
    uint32_t layout = 0;
    if (op && kv && op->caps->kv_layouts && KHUB_HAS_FIELD(kv, khub_kv_cache_methods, paged_view) &&
        kv->reserve && kv->release && kv->paged_view)
        for (uint32_t id = 1; id < 64 && !layout; id++)
            if (op->caps->kv_layouts & KHUB_KV_LAYOUT_BIT(id)) layout = id;
    khub_binding_release(b);
    return layout;
}

uint64_t khub__model_attn_flags(const khub_model *m)
{
    const khub_model_config *c = &m->cfg;
    uint64_t aflags = KHUB_ATTN_CAUSAL | KHUB_ATTN_STRIDED_KV;
    if (c->n_kv_heads < c->n_heads) aflags |= KHUB_ATTN_GQA;
    if (khub_dtype_id_of(m->kv_dtype) == KHUB_DTYPE_ID_F16) aflags |= KHUB_ATTN_KV_F16;
    if (c->sliding_window > 0) aflags |= KHUB_ATTN_SLIDING;
    /* A capped model needs an op that caps: one that does not would compute
     * another model, so it is passed over ("missing flag softcap"). */
    if (c->attn_softcap > 0) aflags |= KHUB_ATTN_SOFTCAP;
    return aflags;
}

/* Whether the KV cache is the paged pool because nothing chose one (issue
 * 13 item 4: `paged` is the default cache of batches). A model loaded for
 * several sequences (max_seqs > 1: khub_generate_batch, a khub_batch, a
 * model server, khub_model_generate of several prompts) gets the pool:
 * each layer then writes every sequence's K/V into its blocks and makes one
 * paged_attention call for the whole batch, where the dense cache makes one
 * attention call per sequence, and memory goes to sequences by the block
 * rather than by max_context. A model of one sequence keeps the dense cache
 * (`dynamic`), and so does a load that chooses the cache or its reader:
 * a cache named (options alone included), an attention kernel named (one
 * made for the dense cache may have no paged op), a CUDA device (its pool
 * needs a device cache plugin, docs/gpu.md) and tensor parallelism. The
 * choice is made here, not in the CLI, so every entry point of the library
 * behaves the same (docs/batching.md). */
static bool paged_by_default(const khub_model *m, const load_prefs *p, const char *cache_pref)
{
    return !cache_pref && !m->kv_options[0] && !p->pref[KHUB_KERNEL_ROLE_ATTENTION] &&
           m->max_seqs > 1 && !p->on_device && m->tp.size <= 1;
}

/* The paged pool of paged_by_default: the best loaded cache op that
 * produces KHUB_KV_LAYOUT_PAGED_HTD in kv_id, and the paged_attention op
 * that reads it. False, with nothing bound and no error set, when the
 * loaded plugins have no such pair for this model (the dense cache then
 * serves, as it would have). */
static bool bind_default_pool(khub_model *m, int32_t kv_id, uint64_t aflags)
{
    int n_bound = m->n_bound;
    khub_status st = bind_layout(m, KHUB__ROLE_KV_CACHE, KHUB_OP_KV_CACHE, kv_id, 0,
                                 KHUB_KV_LAYOUT_PAGED_HTD, NULL, &m->kv_op);
    m->kv_layout = st == KHUB_STATUS_OK ? kv_layout_of(m->kv_op) : 0;
    if (m->kv_layout == KHUB_KV_LAYOUT_PAGED_HTD)
        st = bind_layout(m, KHUB__ROLE_PAGED_ATTENTION, KHUB_OP_PAGED_ATTENTION, kv_id,
                         aflags & ~KHUB_ATTN_STRIDED_KV, m->kv_layout, NULL, &m->paged_attn);
    if (st == KHUB_STATUS_OK && m->kv_layout == KHUB_KV_LAYOUT_PAGED_HTD) {
        m->kv_paged_default = true;
        return true;
    }
    KHUB_LOG_I(m->rt,
               "%s: no paged KV cache and paged_attention pair serves this model (%s); "
               "the dense cache serves its batches",
               m->file, st != KHUB_STATUS_OK ? khub_runtime_errmsg(m->rt) : "no paged layout");
    khub__clear(m->rt);
    m->n_bound = n_bound;
    m->kv_op = NULL, m->paged_attn = NULL, m->kv_layout = 0;
    return false;
}

khub_status khub__model_bind_ops(khub_model *m, const load_prefs *p)
{
    int kv_id = khub_dtype_id_of(m->kv_dtype);
    uint64_t aflags = khub__model_attn_flags(m);
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, KHUB__ROLE_NORM, KHUB_OP_NORM, KHUB_DTYPE_ID_F32, 0,
                                      p->pref[KHUB_KERNEL_ROLE_NORM], &m->norm));
    KHUB_FORWARD_IF_ERROR(m->rt,
                          bind(m, KHUB__ROLE_NORM_RESIDUAL, KHUB_OP_NORM, KHUB_DTYPE_ID_F32,
                               KHUB_CAP_RESIDUAL, p->pref[KHUB_KERNEL_ROLE_NORM], &m->norm_res));
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, KHUB__ROLE_ROTARY, KHUB_OP_ROTARY, KHUB_DTYPE_ID_F32, 0,
                                      p->pref[KHUB_KERNEL_ROLE_ROTARY], &m->rotary));
    KHUB_FORWARD_IF_ERROR(m->rt, bind(m, KHUB__ROLE_ACT, KHUB_OP_ACTIVATION, KHUB_DTYPE_ID_F32, 0,
                                      p->pref[KHUB_KERNEL_ROLE_ACTIVATION], &m->act));
    /* The cache's name may carry the strategy's options after a comma
     * ("khub/ref-cpu:quantized_cache,q_group_size=32"): kept for create. */
    const char *cpref = p->pref[KHUB_KERNEL_ROLE_CACHE];
    char cbuf[256];
    if (cpref && strchr(cpref, ',')) {
        const char *comma = strchr(cpref, ',');
        snprintf(m->kv_options, sizeof m->kv_options, "%s", comma + 1);
        snprintf(cbuf, sizeof cbuf, "%.*s", (int)(comma - cpref), cpref);
        /* ",options" alone: a placed model's Hub cache prefers no CPU op */
        cpref = cbuf[0] ? cbuf : NULL;
    }
    if (paged_by_default(m, p, cpref) && bind_default_pool(m, kv_id, aflags)) return KHUB_STATUS_OK;
    KHUB_FORWARD_IF_ERROR(
        m->rt, bind(m, KHUB__ROLE_KV_CACHE, KHUB_OP_KV_CACHE, kv_id, 0, cpref, &m->kv_op));
    m->kv_layout = kv_layout_of(m->kv_op);
    if (!m->kv_layout)
        return bind(m, KHUB__ROLE_ATTENTION, KHUB_OP_ATTENTION, kv_id, aflags,
                    p->pref[KHUB_KERNEL_ROLE_ATTENTION], &m->attention);
    /* A paged cache: its reader is the paged_attention op of the same
     * layout (the pair). The strided-view flag means nothing there. */
    return bind_layout(m, KHUB__ROLE_PAGED_ATTENTION, KHUB_OP_PAGED_ATTENTION, kv_id,
                       aflags & ~KHUB_ATTN_STRIDED_KV, m->kv_layout,
                       p->pref[KHUB_KERNEL_ROLE_ATTENTION], &m->paged_attn);
}

/* Asks a cache of ABI 1.4 or newer what one token costs (info.kv_bytes_per_token);
 * an older cache has no `memory` method and reports nothing. */
static khub_status cache_memory(khub_model *m, const khub_kv_cache_methods *kv, void *state)
{
    if (!KHUB_HAS_FIELD(kv, khub_kv_cache_methods, memory) || !kv->memory) return KHUB_STATUS_OK;
    khub_kv_cache_memory mem = {KHUB_STRUCT_INIT(khub_kv_cache_memory)};
    khub_status st = kv->memory(state, m->cache, &mem);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: %s: kv_cache memory failed", m->file,
                   khub_binding_name(m->kv_op));
    m->info.kv_bytes_per_token = mem.bytes_per_token;
    return KHUB_STATUS_OK;
}

khub_status khub__model_make_cache(khub_model *m)
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
                                   .dtype = m->kv_dtype,
                                   .options = m->kv_options[0] ? m->kv_options : NULL,
                                   .layer_window = NULL,
                                   .block_size = m->kv_block_size,
                                   .n_blocks = m->kv_num_blocks,
                                   .max_bytes = m->kv_max_bytes};
        int64_t *win = khub__calloc(m->rt, (size_t)c->n_layers, sizeof *win);
        for (int64_t l = 0; win && l < c->n_layers; l++) win[l] = m->layers[l].window;
        cc.layer_window = win;
        khub__plugin_msg_clear();
        st = win ? kv->create(state, &cc, &m->cache)
                 : khub__fail(m->rt, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
        khub__free(m->rt, win, (size_t)c->n_layers * sizeof *win);
        if (st != KHUB_STATUS_OK)
            khub__fail(m->rt, st,
                       "%s: creating a KV cache of %lld tokens x %d sequences in %s "
                       "failed: %s",
                       m->file, (long long)m->max_context, (int)m->max_seqs,
                       khub_binding_name(m->kv_op), khub__plugin_msg());
        m->kv = kv;
        m->kv_state = state;
        m->kv_view_from = KHUB_HAS_FIELD(kv, khub_kv_cache_methods, view_from) && kv->view_from;
    }
    size_t per = (size_t)c->n_layers * (size_t)c->n_kv_heads * (size_t)c->head_dim * 2 *
                 (size_t)(m->kv_dtype.bits / 8);
    size_t tokens = (size_t)m->max_context * (size_t)m->max_seqs;
    if (st == KHUB_STATUS_OK && m->kv_layout) {
        khub_kv_paged_view pv = {KHUB_STRUCT_INIT(khub_kv_paged_view)};
        st = kv->paged_view(state, m->cache, 0, &pv);
        if (st != KHUB_STATUS_OK)
            khub__fail(m->rt, st, "%s: paged_view of %s failed", m->file,
                       khub_binding_name(m->kv_op));
        else if (pv.layout != m->kv_layout)
            st = khub__fail(m->rt, KHUB_STATUS_PLUGIN_INVALID,
                            "%s: %s declares KV layout %u in its caps but its paged_view gives %u",
                            m->file, khub_binding_name(m->kv_op), (unsigned)m->kv_layout,
                            (unsigned)pv.layout);
        tokens = (size_t)pv.n_blocks * (size_t)pv.block_size;
        m->kv_pool_tokens = (int64_t)tokens;
        KHUB_LOG_I(m->rt, "%s: paged KV cache, %d blocks of %d tokens (%zu bytes)", m->file,
                   (int)pv.n_blocks, (int)pv.block_size, per * tokens);
    }
    if (st == KHUB_STATUS_OK) st = cache_memory(m, kv, state);
    khub_binding_release(m->kv_op);
    if (st == KHUB_STATUS_OK) m->info.scratch_bytes += per * tokens;
    return st;
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

const char *khub__model_bound_dtype(const khub__bound *b)
{
    if (b->dtype_id >= KHUB_DTYPE_ID_QBASE)
        return khub__dtype_short(KHUB_DTYPE_Q(b->dtype_id - KHUB_DTYPE_ID_QBASE));
    if (b->dtype_id == KHUB_DTYPE_ID_F16) return "f16";
    if (b->dtype_id == KHUB_DTYPE_ID_BF16) return "bf16";
    if (b->dtype_id == KHUB_DTYPE_ID_F32) return "f32";
    return "";
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
        const char *dt = khub__model_bound_dtype(b);
        snprintf(line, sizeof line, "%s[%s]: %s\n", khub__model_role_name(m, b->role), dt,
                 khub_binding_name(b->b));
        ok = append(m->rt, &s, &len, &cap, line);
        khub__model_join_explain(m, b, line, sizeof line);
        if (ok && line[0]) ok = append(m->rt, &s, &len, &cap, line);
        if (ok && b->role == KHUB__ROLE_PAGED_ATTENTION) {
            snprintf(line, sizeof line, "    paired with kv_cache %s by KV layout %s\n",
                     khub_binding_name(m->kv_op), khub__kv_layout_name(m->kv_layout));
            ok = append(m->rt, &s, &len, &cap, line);
        }
        if (ok && b->role == KHUB__ROLE_KV_CACHE && m->kv_paged_default) {
            snprintf(line, sizeof line,
                     "    the paged pool by default: %d sequences (max_seqs) and no cache or "
                     "attention named\n",
                     (int)m->max_seqs);
            ok = append(m->rt, &s, &len, &cap, line);
        }
        const char *tr = khub_binding_trace(b->b);
        while (ok && tr && *tr) {
            const char *nl = strchr(tr, '\n');
            size_t n = nl ? (size_t)(nl - tr) : strlen(tr);
            snprintf(line, sizeof line, "    %.*s\n", (int)(n < 400 ? n : 400), tr);
            ok = append(m->rt, &s, &len, &cap, line);
            tr = nl ? nl + 1 : tr + n;
        }
    }
    if (ok && m->info.kv_bytes_per_token) {
        snprintf(line, sizeof line, "kv_cache memory: %llu bytes per token\n",
                 (unsigned long long)m->info.kv_bytes_per_token);
        ok = append(m->rt, &s, &len, &cap, line);
    }
    if (ok && m->place && m->place->text) ok = append(m->rt, &s, &len, &cap, m->place->text);
    if (ok && m->tp.size > 1) {
        char plan[2048];
        khub__tp_explain(m, plan, sizeof plan);
        ok = append(m->rt, &s, &len, &cap, plan);
        snprintf(line, sizeof line,
                 "tp memory: rank %d holds %llu bytes of weights, %llu of "
                 "scratch and KV cache\n",
                 (int)m->tp.rank, (unsigned long long)m->info.weight_bytes,
                 (unsigned long long)m->info.scratch_bytes);
        ok = ok && append(m->rt, &s, &len, &cap, line);
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
