/*
 * model.c: khub_model_load and friends: the options, the source files
 * (config, weights, tokenizer), the load in order (bindings, weights, KV
 * cache, scratch), the model's info, free, and tokens. The weights and
 * quantize-at-load are model_weights.c, the op bindings model_bind.c. See
 * executor.h for the model's layout and weights.h for the GGUF Q/K
 * permutation.
 *
 * Loading is all-or-nothing: any failure frees what was made and leaves
 * *out NULL, with a message that names the file and the tensor or field.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "app_struct.h"
#include "model_impl.h"
#include "placement.h"
#include "runtime_impl.h"
#include "safetensors.h"
#include "tokenizer.h"

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
        KHUB__APP_CHECK(rt, in, KHUB__MODEL_OPTS_0_1, "khub_model_load", "opts");
        khub__app_copy_in(o, sizeof *o, in);
    }
    int pool = khub__pool_size(khub__runtime_pool(rt));
    KHUB_RETURN_IF(rt, o->n_threads != 0 && o->n_threads != pool, KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: n_threads %d differs from the runtime's pool of %d; set "
                   "khub_runtime_opts.n_threads instead",
                   (int)o->n_threads, pool);
    int dt = o->device.device_type;
    KHUB_RETURN_IF(rt, dt != 0 && dt != KHUB_DEVICE_CPU && dt != KHUB_DEVICE_CUDA,
                   KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: device type %d: want KHUB_DEVICE_CPU or KHUB_DEVICE_CUDA", dt);
    KHUB_RETURN_IF(rt, o->device.device_id < 0 || (dt != KHUB_DEVICE_CUDA && o->device.device_id),
                   KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: device id %d: want 0 for the CPU, a CUDA ordinal >= 0",
                   (int)o->device.device_id);
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
    KHUB_RETURN_IF(rt, o->kv_block_size < 0 || o->kv_block_size > 65536 || o->kv_num_blocks < 0,
                   KHUB_STATUS_INVALID_ARG,
                   "khub_model_load: kv_block_size %d or kv_num_blocks %d out of range (want "
                   "block size 0..65536, blocks >= 0; 0 = default)",
                   (int)o->kv_block_size, (int)o->kv_num_blocks);
    memset(p, 0, sizeof *p);
    /* Every role's option field, from the one role table; quant is parsed
     * below (a scheme, optionally after a plugin id). */
#define PREF(NAME, name, flag, field) p->pref[KHUB_KERNEL_ROLE_##NAME] = o->field;
    KHUB_KERNEL_ROLES(PREF)
#undef PREF
    p->strict = o->strict;
    p->quant_embeddings = o->quant_embeddings;
    return khub__model_parse_quant(rt, o->quant, p);
}

static const char *base_name(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *s = path + n;
    while (s > path && s[-1] != '/') s--;
    return s;
}

/* Opens the file(s): config, weights and tokenizer. huge: read a GGUF's weights into huge-page
 * memory (khub__gguf_open_huge) rather than map them: the decode step streams every weight, and 4
 * KiB file pages cost a TLB miss per 4 KiB of it (docs/performance.md, "Session 18"). Not for a
 * tensor-parallel rank (it reads only its part of a mapping) or a CUDA load (the device holds the
 * weights). */
static khub_status open_source(khub_model *m, const char *path, bool huge)
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
    KHUB_FORWARD_IF_ERROR(m->rt, huge ? khub__gguf_open_huge(m->rt, path, &m->gguf)
                                      : khub__gguf_open(m->rt, path, &m->gguf));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__model_config_from_gguf(m->rt, m->gguf, &m->cfg));
    if (!khub__gguf_find(m->gguf, "tokenizer.ggml.model")) {
        KHUB_LOG_I(m->rt, "%s: no tokenizer in the file; only token ids can be used", m->file);
        return KHUB_STATUS_OK;
    }
    return khub__tokenizer_from_gguf(m->rt, m->gguf, &m->tok);
}

static void fill_info(khub_model *m)
{
    /* The whole model's sizes, also on a rank of a tensor-parallel job (whose
     * m->cfg holds its part); the bytes below are this rank's. */
    const khub_model_config *c = &m->tp.full;
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
    i->tp_rank = m->tp.rank;
    i->tp_size = m->tp.size;
    i->scratch_bytes += m->scratch_bytes;
    const khub__weight *ws[] = {
        &m->embed, &m->final_norm,
        m->lm_head.w.owned || m->lm_head.w.name != m->embed.name ? &m->lm_head.w : NULL};
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

static khub_status load(khub_model *m, const char *path, const khub_model_opts *opts,
                        const khub__device_prefs *dev)
{
    khub_model_opts o;
    load_prefs p;
    KHUB_FORWARD_IF_ERROR(m->rt, read_opts(m->rt, opts, &o, &p));
    p.dev = dev;
    p.on_device = o.device.device_type == KHUB_DEVICE_CUDA;
    KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_setup(m, o.tp_size, o.tp_plan, o.comm));
    KHUB_FORWARD_IF_ERROR(m->rt, open_source(m, path, m->tp.size <= 1 && !p.on_device));
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
    m->kv_block_size = o.kv_block_size;
    m->kv_num_blocks = o.kv_num_blocks;
    m->kv_max_bytes = o.kv_max_bytes;
    KHUB_LOG_I(m->rt, "%s: %s, %lld layers, hidden %lld, %lld/%lld heads of %lld, vocab %lld",
               m->file, khub__model_arch_name(c->arch), (long long)c->n_layers,
               (long long)c->hidden_size, (long long)c->n_heads, (long long)c->n_kv_heads,
               (long long)c->head_dim, (long long)c->vocab_size);

    KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_plan(m));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__model_bind_ops(m, &p));
    m->layers = khub__calloc(m->rt, (size_t)c->n_layers, sizeof *m->layers);
    KHUB_RETURN_IF(m->rt, !m->layers, KHUB_STATUS_NOMEM, "%s: no memory for %lld layers", m->file,
                   (long long)c->n_layers);
    KHUB_FORWARD_IF_ERROR(m->rt, khub__model_load_ends(m, &p));
    for (int L = 0; L < c->n_layers; L++) {
        KHUB_FORWARD_IF_ERROR(m->rt, khub__model_load_layer(m, &p, L));
        KHUB_FORWARD_IF_ERROR(m->rt, khub__model_join_layer(m, L, p.on_device));
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
    KHUB_FORWARD_IF_ERROR(m->rt, khub__tp_localize(m)); /* m->cfg: this rank's part */
    KHUB_FORWARD_IF_ERROR(m->rt, khub__model_make_cache(m));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_alloc(m));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__kv_budget_init(m));
    KHUB_FORWARD_IF_ERROR(m->rt, khub__place_model(m, o.device, p.strict, p.dev));
    fill_info(m);
    return KHUB_STATUS_OK;
}

khub_status khub_model_load(khub_runtime *rt, const char *path, const khub_model_opts *opts,
                            khub_model **out)
{
    return khub__model_load_placed(rt, path, opts, NULL, out);
}

khub_status khub__model_load_placed(khub_runtime *rt, const char *path, const khub_model_opts *opts,
                                    const khub__device_prefs *dev, khub_model **out)
{
    KHUB_API_CHECK(rt, rt && path && out);
    khub__clear(rt);
    *out = NULL;
    double t0 = now_ms();
    khub_model *m = khub__calloc(rt, 1, sizeof *m);
    KHUB_RETURN_IF(rt, !m, KHUB_STATUS_NOMEM, "khub_model_load: out of memory");
    m->rt = rt;
    pthread_mutex_init(&m->bind_lock, NULL);
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
    khub_status st = load(m, path, opts, dev);
    /* Tensor parallel: every rank fails when any did, or loaded other bytes. */
    st = khub__tp_agree(m, st);
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
    khub__tp_lead_stop(m); /* the other ranks leave khub_model_tp_serve */
    if (m->tp.size > 1)
        KHUB_LOG_I(rt, "%s: tp rank %d: %llu collectives, %.1f ms in them", m->file,
                   (int)m->tp.rank, (unsigned long long)m->tp.n_collectives,
                   (double)m->tp.comm_ns / 1e6);
    khub__tp_free(m);
    khub__place_free(m);
    if (m->cache && m->kv) {
        void *state = NULL;
        const khub_op_desc *op = khub_binding_acquire(m->kv_op, &state);
        if (op && op->methods == (const void *)m->kv)
            m->kv->destroy(m->kv_state, m->cache);
        else
            KHUB_LOG_W(rt, "%s: KV cache plugin was reloaded; its cache is leaked", m->file);
        khub_binding_release(m->kv_op);
    }
    khub__kv_budget_free(m);
    khub__forward_free(m);
    for (int64_t L = 0; m->layers && L < m->cfg.n_layers; L++) {
        khub__layer *ly = &m->layers[L];
        khub__weight *ws[] = {&ly->attn_norm, &ly->ffn_norm,       &ly->q_norm,
                              &ly->k_norm,    &ly->post_attn_norm, &ly->post_ffw_norm};
        for (size_t k = 0; k < 6; k++) khub__weight_free(rt, ws[k]);
        khub__mat *ms[] = {&ly->q,  &ly->k,    &ly->v,   &ly->o,      &ly->gate,
                           &ly->up, &ly->down, &ly->qkv, &ly->gate_up};
        for (size_t k = 0; k < sizeof ms / sizeof ms[0]; k++) free_mat(rt, ms[k]);
    }
    khub__free(rt, m->layers, m->layers ? (size_t)m->cfg.n_layers * sizeof *m->layers : 0);
    free_mat(rt, &m->lm_head);
    khub__weight_free(rt, &m->embed);
    khub__weight_free(rt, &m->final_norm);
    khub__tokenizer_free(m->tok);
    khub__gguf_close(m->gguf);
    khub__safetensors_close(m->st);
    khub__strfree(rt, m->explain);
    khub__model_rebind_free(m);
    /* Last: the cache's destroy and the device's frees above call through
     * them. A plugin that served only this model can be unloaded now. */
    size_t dropped = khub__registry_drop_owned(rt, m);
    KHUB_LOG_D(rt, "%s: freed, %zu op bindings dropped", m->file, dropped);
    pthread_mutex_destroy(&m->bind_lock);
    khub__free(rt, m, sizeof *m);
}

khub_status khub_model_info_get(const khub_model *m, khub_model_info *info)
{
    KHUB_API_CHECK(m ? m->rt : NULL, m && info);
    /* 0.1's size at least (since session 17: it took any size from 8 bytes
     * and set struct_size to what it wrote); the message replaces any
     * earlier one, and a call that succeeds leaves the runtime's alone. */
    char msg[KHUB_ERROR_SIZE];
    if (khub__app_struct_check(info, KHUB__SIZE_TO(khub_model_info, reserved),
                               "khub_model_info_get", "info", msg, sizeof msg)) {
        khub__clear(m->rt);
        return khub__fail(m->rt, KHUB_STATUS_STRUCT_SIZE, "%s", msg);
    }
    khub_model_info full = m->info;
    /* Live counters, not the load's snapshot. */
    full.tp_collectives = m->tp.n_collectives;
    full.tp_comm_ns = m->tp.comm_ns;
    khub__app_copy_out(info, &full, sizeof full); /* up to its struct_size, header kept */
    return KHUB_STATUS_OK;
}

khub_runtime *khub_model_runtime(const khub_model *m) { return m ? m->rt : NULL; }

/* ======================================================================== */
/* Tokens                                                                   */
/* ======================================================================== */

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
