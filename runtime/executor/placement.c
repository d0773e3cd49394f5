/*
 * placement.c: a model loaded for a CUDA device (placement.h; issue 19
 * items 1 and 4): the driver and the device, the plan per role, the memory
 * check with the numbers, the device blocks and the weight upload, and the
 * placement section of khub_model_explain.
 *
 * Order matters: nothing is allocated on the device before the whole plan
 * is known and checked against cuMemGetInfo, so a model that does not fit
 * fails with every part's size and leaves the device as it was. The CPU
 * load comes first (weights mapped, quantize-at-load done, CPU bindings
 * made): the upload copies exactly the bytes the CPU path would read, so
 * a quantized weight stays quantized on the device.
 *
 * Rejected: one cuMemAlloc per weight (SmolLM2 has 272 tensors; one block
 * per part keeps the driver's allocation count, and its 2 MiB granularity
 * waste, small; weights sit at 256-byte aligned offsets, as cuMemAlloc's own
 * alignment would give them).
 */
#include <stdio.h>
#include <string.h>

#include "cuda.h"
#include "placement.h"
#include "runtime_impl.h"

#define ALIGN 256u

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* ======================================================================== */
/* The plan                                                                 */
/* ======================================================================== */

/* The activations a role reads and writes per token, in f32 elements, and
 * their names: what crossing between the device and the host costs when
 * the role stays on the CPU while activations live on the device. */
typedef struct role_io {
    int64_t in, out;
    const char *in_names, *out_names;
} role_io;

static role_io io_of(const khub_model *m, khub__role r)
{
    const khub_model_config *c = &m->cfg;
    int64_t h = c->hidden_size, q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim,
            f = c->intermediate_size;
    switch (r) {
    case KHUB__ROLE_NORM: return (role_io){h, h, "x", "y"};
    case KHUB__ROLE_NORM_RESIDUAL: return (role_io){2 * h, 2 * h, "x, residual", "y, residual"};
    case KHUB__ROLE_QKV: return (role_io){h, q + 2 * kv, "x", "q, k, v"};
    case KHUB__ROLE_ROTARY: return (role_io){q + kv, q + kv, "q, k", "q, k"};
    case KHUB__ROLE_KV_CACHE:
        return (role_io){2 * kv, 0, "k, v rows (the cache is on the host)", ""};
    case KHUB__ROLE_ATTENTION:
    case KHUB__ROLE_PAGED_ATTENTION: return (role_io){q, q, "q", "attention output"};
    case KHUB__ROLE_O: return (role_io){q, h, "attention output", "o"};
    case KHUB__ROLE_GATE_UP: return (role_io){h, 2 * f, "x", "gate, up"};
    case KHUB__ROLE_ACT: return (role_io){2 * f, f, "gate, up", "act"};
    case KHUB__ROLE_DOWN: return (role_io){f, h, "act", "down"};
    /* The logits row goes to the host in any case: only its input crosses. */
    case KHUB__ROLE_LM_HEAD: return (role_io){h, 0, "last hidden row", ""};
    default: return (role_io){0, 0, "", ""};
    }
}

/* A preference "org/name" or "org/name:op" split: the plugin id into
 * pid[n], the op name returned (NULL when none, or when pref is NULL). */
static const char *split_pref(const char *pref, char *pid, size_t n)
{
    pid[0] = '\0';
    if (!pref) return NULL;
    snprintf(pid, n, "%s", pref);
    char *colon = strchr(pid, ':');
    if (!colon) return NULL;
    *colon = '\0';
    return colon[1] ? colon + 1 : NULL;
}

/* Asks the registry for a CUDA op answering b's query, preferring plugin
 * pref ("org/name" or "org/name:op"; NULL = none); NULL (and the
 * registry's reason in why) when there is none. */
static khub_binding *cuda_op(khub_model *m, const khub__bound *b, const char *pref, char *why,
                             size_t n)
{
    /* The cache is bound before its layout is known (model_bind.c): its
     * device twin is asked for the model's layout. */
    uint32_t layout = b->role == KHUB__ROLE_KV_CACHE ? m->kv_layout : b->kv_layout;
    char pid[256];
    const char *op = split_pref(pref, pid, sizeof pid);
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = b->kind,
                       .device_type = KHUB_DEVICE_CUDA,
                       .dtype_id = b->dtype_id,
                       .flags = b->flags,
                       .plugin_id = pref ? pid : NULL,
                       .op_name = op,
                       .kv_layout = layout};
    if (b->role == KHUB__ROLE_ATTENTION || b->role == KHUB__ROLE_PAGED_ATTENTION)
        q.head_dim = (int32_t)m->cfg.head_dim;
    khub_binding *out = NULL;
    if (khub__registry_select_for(m->rt, &q, m, &out) != KHUB_STATUS_OK) {
        snprintf(why, n, "%s", khub_runtime_errmsg(m->rt));
        khub__clear(m->rt);
        return NULL;
    }
    /* A dense query is not refused by layout: a paged CUDA cache would
     * answer it, and the model's cache is dense. */
    void *state = NULL;
    const khub_op_desc *op_desc = khub_binding_acquire(out, &state);
    bool paged = op_desc && b->role == KHUB__ROLE_KV_CACHE && !layout && op_desc->caps->kv_layouts;
    khub_binding_release(out);
    if (!paged) return out;
    snprintf(why, n, "%s is a paged cache; the model's is dense", khub_binding_name(out));
    khub__registry_drop(m->rt, out); /* not used: no user of its plugin */
    return NULL;
}

/* The kernel role (khub_model_load_hub's) whose device choice applies to
 * b; KHUB_KERNEL_ROLE__COUNT for none. A block-format projection (a
 * qlinear op) takes the quantization role's choice when it has one, as
 * its CPU binding takes that role's plugin (model_bind.c). */
static khub_kernel_role kernel_role(const khub__bound *b, const khub__device_prefs *dev)
{
    switch (b->role) {
    case KHUB__ROLE_NORM:
    case KHUB__ROLE_NORM_RESIDUAL: return KHUB_KERNEL_ROLE_NORM;
    case KHUB__ROLE_ROTARY: return KHUB_KERNEL_ROLE_ROTARY;
    case KHUB__ROLE_KV_CACHE: return KHUB_KERNEL_ROLE_CACHE;
    case KHUB__ROLE_ATTENTION:
    case KHUB__ROLE_PAGED_ATTENTION: return KHUB_KERNEL_ROLE_ATTENTION;
    case KHUB__ROLE_ACT: return KHUB_KERNEL_ROLE_ACTIVATION;
    case KHUB__ROLE_QKV:
    case KHUB__ROLE_O:
    case KHUB__ROLE_GATE_UP:
    case KHUB__ROLE_DOWN:
    case KHUB__ROLE_LM_HEAD:
        return b->kind == KHUB_OP_QLINEAR &&
                       (dev->impl[KHUB_KERNEL_ROLE_QUANT] || dev->cpu_why[KHUB_KERNEL_ROLE_QUANT])
                   ? KHUB_KERNEL_ROLE_QUANT
                   : KHUB_KERNEL_ROLE_LINEAR;
    default: return KHUB_KERNEL_ROLE__COUNT;
    }
}

/* b's CUDA op under dev's choices (may be NULL): none when its role is
 * kept on the CPU (why: dev's reason), else the registry's answer with
 * dev's preferred plugin. */
static khub_binding *device_op(khub_model *m, const khub__bound *b, const khub__device_prefs *dev,
                               char *why, size_t n)
{
    khub_kernel_role kr = dev ? kernel_role(b, dev) : KHUB_KERNEL_ROLE__COUNT;
    if (kr != KHUB_KERNEL_ROLE__COUNT && dev->cpu_why[kr]) {
        snprintf(why, n, "%s", dev->cpu_why[kr]);
        return NULL;
    }
    if (!b->kind) return NULL;
    return cuda_op(m, b, kr != KHUB_KERNEL_ROLE__COUNT ? dev->impl[kr] : NULL, why, n);
}

/* The roles the forward pass calls that are planned here: every binding
 * but the load's own (quantize-at-load), the embedding's dequantize, which
 * the host's row lookup uses (the embedding stays in host memory; its rows
 * are copied), and the embedding op named for the CPU's lookup, which
 * plan_embedding plans with the role. */
static bool in_forward(khub__role r)
{
    return r != KHUB__ROLE_QUANTIZE && r != KHUB__ROLE_EMBED_DEQUANT && r != KHUB__ROLE_EMBEDDING;
}

static void copies_line(khub_model *m, khub__role r, khub__text *t)
{
    role_io io = io_of(m, r);
    if (io.out)
        khub__text_add(
            t,
            "    copies per token each time it runs: device->host %lld B (%s), host->device "
            "%lld B (%s)\n",
            (long long)(4 * io.in), io.in_names, (long long)(4 * io.out), io.out_names);
    else if (io.in)
        khub__text_add(t, "    copies per token each time it runs: device->host %lld B (%s)\n",
                       (long long)(4 * io.in), io.in_names);
}

/* The embedding role (ABI 1.5): a CUDA embedding op for the table's dtype
 * (asking for the scale flag when the model scales its embeddings, Gemma)
 * looks the rows up on the device from the uploaded table; without one the
 * host looks them up (itself, or through the CPU op the role named,
 * m->embed_op) and each token's row crosses. Its CPU binding is not
 * planned with the others, so it is asked here, after the bound roles,
 * with the role's device choice (dev: a Hub kernel's CUDA variant, or why
 * its CPU variant serves): strict refuses it like any other role. */
static khub_status plan_embedding(khub_model *m, bool strict, const khub__device_prefs *dev,
                                  khub__text *t)
{
    khub__place *pl = m->place;
    const char *dt = khub__dtype_short(m->embed.t.dtype);
    const char *pref = dev ? dev->impl[KHUB_KERNEL_ROLE_EMBEDDING] : NULL;
    char pid[256];
    const char *op = split_pref(pref, pid, sizeof pid);
    khub_op_query q = {KHUB_STRUCT_INIT(khub_op_query),
                       .kind = KHUB_OP_EMBEDDING,
                       .device_type = KHUB_DEVICE_CUDA,
                       .dtype_id = khub_dtype_id_of(m->embed.t.dtype),
                       .kind_flags = m->cfg.embed_scale != 1.0 ? KHUB_EMBEDDING_SCALE : 0,
                       .plugin_id = pref ? pid : NULL,
                       .op_name = op};
    char why[640] = "";
    khub_binding *b = NULL;
    if (dev && dev->cpu_why[KHUB_KERNEL_ROLE_EMBEDDING]) {
        snprintf(why, sizeof why, "%s", dev->cpu_why[KHUB_KERNEL_ROLE_EMBEDDING]);
    } else if (khub__registry_select_for(m->rt, &q, m, &b) != KHUB_STATUS_OK) {
        snprintf(why, sizeof why, "%s", khub_runtime_errmsg(m->rt));
        khub__clear(m->rt);
        b = NULL;
    }
    pl->used[KHUB__ROLE_EMBEDDING] = true;
    pl->cuda[KHUB__ROLE_EMBEDDING] = b;
    if (b) {
        khub__text_add(t, "  embedding[%s]: cuda:%d, %s\n", dt, (int)pl->device,
                       khub_binding_name(b));
        return KHUB_STATUS_OK;
    }
    KHUB_RETURN_IF(m->rt, strict, KHUB_STATUS_NO_KERNEL,
                   "%s: cuda:%d: strict: role embedding[%s] has no CUDA kernel (%s); load one "
                   "that serves it, or drop strict to run it on the CPU",
                   m->file, (int)pl->device, dt, why);
    if (m->embed_op)
        khub__text_add(t, "  embedding[%s]: cpu fallback, %s (no CUDA kernel: %s)\n", dt,
                       khub_binding_name(m->embed_op), why);
    else
        khub__text_add(t, "  embedding[%s]: host lookup (no CUDA kernel: %s)\n", dt, why);
    khub__text_add(t, "    copies per token each time it runs: host->device %lld B (the row)\n",
                   (long long)(4 * m->cfg.hidden_size));
    return KHUB_STATUS_OK;
}

/* A role is bound once per weight dtype (a GGUF may mix Q4_K and Q6_K
 * projections); it runs on the device only when every one of its bindings
 * has a CUDA op, so a role is never split between the two sides. */
static khub_status plan_roles(khub_model *m, bool strict, const khub__device_prefs *dev,
                              khub__text *t)
{
    khub__place *pl = m->place;
    khub_binding *found[sizeof m->bound / sizeof m->bound[0]] = {NULL};
    bool cpu[KHUB__ROLE__COUNT] = {false};
    char why[640];
    for (int i = 0; i < m->n_bound; i++) {
        const khub__bound *b = &m->bound[i];
        if (!in_forward(b->role)) continue;
        pl->used[b->role] = true;
        snprintf(why, sizeof why, "not chosen by a registry query");
        found[i] = device_op(m, b, dev, why, sizeof why);
        if (found[i]) continue;
        KHUB_RETURN_IF(m->rt, strict, KHUB_STATUS_NO_KERNEL,
                       "%s: cuda:%d: strict: role %s[%s] has no CUDA kernel (%s); load one "
                       "that serves it, or drop strict to run it on the CPU",
                       m->file, (int)pl->device, khub__model_role_name(m, b->role),
                       khub__model_bound_dtype(b), why);
        cpu[b->role] = true;
    }
    for (int i = 0; i < m->n_bound; i++) {
        const khub__bound *b = &m->bound[i];
        if (!in_forward(b->role)) continue;
        const char *name = khub__model_role_name(m, b->role), *dt = khub__model_bound_dtype(b);
        if (found[i] && !cpu[b->role]) {
            if (!pl->cuda[b->role]) pl->cuda[b->role] = found[i];
            pl->cuda_of[i] = found[i];
            khub__text_add(t, "  %s[%s]: cuda:%d, %s\n", name, dt, (int)pl->device,
                           khub_binding_name(found[i]));
            continue;
        }
        if (found[i])
            snprintf(why, sizeof why, "%s has one, but the role's other weights have none",
                     khub_binding_name(found[i]));
        else {
            snprintf(why, sizeof why, "not chosen by a registry query");
            device_op(m, b, dev, why, sizeof why); /* the reason again */
        }
        khub__text_add(t, "  %s[%s]: cpu fallback, %s (no CUDA kernel: %s)\n", name, dt,
                       khub_binding_name(b->b), why);
        copies_line(m, b->role, t);
    }
    KHUB_FORWARD_IF_ERROR(m->rt, plan_embedding(m, strict, dev, t));
    for (int r = 0; r < KHUB__ROLE__COUNT; r++)
        if (pl->used[r] && pl->cuda[r])
            pl->n_cuda++;
        else if (pl->used[r] && r != KHUB__ROLE_EMBEDDING) /* a host lookup is an input */
            pl->n_cpu++;
    /* The cache and its reader on different sides: every cached position
     * crosses for each layer of each step, not just the new rows. */
    const khub_model_config *c = &m->cfg;
    long long per_pos = 2LL * c->n_kv_heads * c->head_dim * (m->kv_dtype.bits / 8);
    bool attn_dev = pl->cuda[KHUB__ROLE_ATTENTION] || pl->cuda[KHUB__ROLE_PAGED_ATTENTION];
    if (pl->used[KHUB__ROLE_KV_CACHE] && attn_dev != (pl->cuda[KHUB__ROLE_KV_CACHE] != NULL))
        khub__text_add(
            t,
            "  attention on the %s reads a KV cache on the %s: %lld B per cached position cross "
            "for each layer of each step\n",
            attn_dev ? "device" : "CPU", attn_dev ? "host" : "device", per_pos);
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Weights: which go to the device, and the upload                          */
/* ======================================================================== */

typedef void (*weight_fn)(khub_model *m, khub__weight *w, void *ud);

static bool norms_on_device(const khub__place *pl)
{
    return pl->cuda[KHUB__ROLE_NORM] || pl->cuda[KHUB__ROLE_NORM_RESIDUAL];
}

static void each_mat(khub_model *m, khub__mat *mat, khub__role r, weight_fn fn, void *ud)
{
    bool dev = m->place->cuda[r] != NULL;
    khub__weight *ws[] = {&mat->w, &mat->bias};
    for (int k = 0; k < 2; k++)
        if (ws[k]->t.data) fn(m, ws[k], dev ? ud : NULL);
}

/* The head reads the embedding table (tied) and both sit on the device:
 * the table goes up once and the head reads that copy. */
static bool head_shares_table(const khub_model *m)
{
    const khub__place *pl = m->place;
    return m->lm_head.w.t.data == m->embed.t.data && pl->cuda[KHUB__ROLE_EMBEDDING] &&
           pl->cuda[KHUB__ROLE_LM_HEAD];
}

/* Calls fn for every weight of the forward pass with ud when its role is on
 * the device and NULL when it stays on the host. The embedding table is
 * visited only when the embedding role is on the device (else it is the
 * host lookup's, as always); a tied head that shares it is not visited. */
static void each_weight(khub_model *m, weight_fn fn, void *ud)
{
    void *norm_ud = norms_on_device(m->place) ? ud : NULL;
    fn(m, &m->final_norm, norm_ud);
    if (m->place->cuda[KHUB__ROLE_EMBEDDING]) fn(m, &m->embed, ud);
    if (!head_shares_table(m)) each_mat(m, &m->lm_head, KHUB__ROLE_LM_HEAD, fn, ud);
    for (int64_t L = 0; L < m->cfg.n_layers; L++) {
        khub__layer *ly = &m->layers[L];
        khub__weight *norms[] = {&ly->attn_norm, &ly->ffn_norm,       &ly->q_norm,
                                 &ly->k_norm,    &ly->post_attn_norm, &ly->post_ffw_norm};
        for (size_t k = 0; k < sizeof norms / sizeof norms[0]; k++)
            if (norms[k]->t.data) fn(m, norms[k], norm_ud);
        khub__mat *qkv[] = {&ly->q, &ly->k, &ly->v};
        for (int k = 0; k < 3; k++) each_mat(m, qkv[k], KHUB__ROLE_QKV, fn, ud);
        each_mat(m, &ly->o, KHUB__ROLE_O, fn, ud);
        each_mat(m, &ly->gate, KHUB__ROLE_GATE_UP, fn, ud);
        each_mat(m, &ly->up, KHUB__ROLE_GATE_UP, fn, ud);
        each_mat(m, &ly->down, KHUB__ROLE_DOWN, fn, ud);
    }
}

static size_t weight_bytes(const khub__weight *w)
{
    size_t b = 0;
    if (!khub__dtype_bytes(w->t.dtype, w->shape[0], w->shape[1] ? w->shape[1] : 1, &b)) return 0;
    return b;
}

static size_t round_up(size_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

static void count_weight(khub_model *m, khub__weight *w, void *ud)
{
    if (ud)
        m->place->weight_bytes += round_up(weight_bytes(w));
    else
        m->place->host_weight_bytes += weight_bytes(w);
}

typedef struct upload {
    size_t off;
    khub_status st;
    const char *failed; /* the weight whose copy failed */
} upload;

static void upload_weight(khub_model *m, khub__weight *w, void *ud)
{
    upload *u = ud;
    if (!u || u->st != KHUB_STATUS_OK) return;
    size_t n = weight_bytes(w);
    uint64_t dst = m->place->weights_dptr + u->off;
    u->st = khub__cuda_host_memcpy_htod(NULL, dst, w->t.data, n, m->place->stream);
    if (u->st != KHUB_STATUS_OK) u->failed = w->name;
    w->dptr = dst;
    u->off += round_up(n);
}

/* ======================================================================== */
/* Memory                                                                   */
/* ======================================================================== */

/* The device memory the model's CUDA ops say they keep for each stream
 * they run on (caps.stream_bytes, ABI 1.5: a split-K attention's
 * partials), each op once: the ops allocate it themselves at their first
 * call on the model's stream and free it when the stream ends, so it is
 * not in the model's blocks, but the model needs it all the same. An op
 * of a plugin before 1.5 declares nothing (0). Each op's name and bytes
 * go to t when it is not NULL. */
static uint64_t op_stream_bytes(khub_model *m, khub__text *t)
{
    khub__place *pl = m->place;
    const khub_op_desc *seen[sizeof pl->cuda_of / sizeof pl->cuda_of[0] + 1];
    int n_seen = 0;
    uint64_t sum = 0;
    for (int i = 0; i <= m->n_bound; i++) {
        khub_binding *b = i < m->n_bound ? pl->cuda_of[i] : pl->cuda[KHUB__ROLE_EMBEDDING];
        void *state = NULL;
        const khub_op_desc *op = b ? khub_binding_acquire(b, &state) : NULL;
        bool again = false;
        for (int k = 0; k < n_seen && !again; k++) again = seen[k] == op;
        if (op && !again) {
            seen[n_seen++] = op;
            uint64_t n = op->caps->stream_bytes;
            if (n && t)
                khub__text_add(t, "%s%s %.1f MiB", sum ? ", " : "", khub_binding_name(b), mib(n));
            sum += n;
        }
        if (op) khub_binding_release(b);
    }
    return sum;
}

static khub_status check_fit(khub_model *m)
{
    khub__place *pl = m->place;
    size_t free_b = 0, total = 0;
    khub__plugin_msg_clear();
    KHUB_FORWARD_IF_ERROR(m->rt, khub__cuda_mem_info(m->rt, pl->device, &free_b, &total));
    pl->free_bytes = free_b, pl->total_bytes = total;
    uint64_t need = pl->weight_bytes + pl->kv_bytes + pl->scratch_bytes + pl->op_bytes;
    char ops[64] = "";
    if (pl->op_bytes)
        snprintf(ops, sizeof ops, ", the ops' own scratch %.1f MiB", mib(pl->op_bytes));
    KHUB_RETURN_IF(m->rt, need > free_b, KHUB_STATUS_NOMEM,
                   "%s: cuda:%d: the model needs %.1f MiB of device memory (weights %.1f MiB, KV "
                   "cache %.1f MiB, scratch %.1f MiB%s) and %.1f MiB of %.1f MiB are free; lower "
                   "max_context or max_seqs, quantize the weights, or use another device",
                   m->file, (int)pl->device, mib(need), mib(pl->weight_bytes), mib(pl->kv_bytes),
                   mib(pl->scratch_bytes), ops, mib(free_b), mib(total));
    return KHUB_STATUS_OK;
}

static khub_status dev_alloc(khub_model *m, uint64_t bytes, uint64_t *dptr, const char *part)
{
    if (!bytes) return KHUB_STATUS_OK;
    khub__plugin_msg_clear();
    khub_status st = khub__cuda_host_mem_alloc(NULL, m->place->device, bytes, dptr);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st,
                   "%s: cuda:%d: allocating %.1f MiB for the %s: %s", m->file,
                   (int)m->place->device, mib(bytes), part, khub__plugin_msg());
    return KHUB_STATUS_OK;
}

/* KV bytes: every layer's K and V for every token the cache holds (the
 * paged pool's tokens, or max_context per sequence). */
static uint64_t kv_bytes(const khub_model *m)
{
    const khub_model_config *c = &m->cfg;
    uint64_t per = (uint64_t)c->n_layers * (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim * 2 *
                   (uint64_t)(m->kv_dtype.bits / 8);
    uint64_t tokens = m->kv_pool_tokens ? (uint64_t)m->kv_pool_tokens
                                        : (uint64_t)m->max_context * (uint64_t)m->max_seqs;
    return per * tokens;
}

static khub_status allocate_and_upload(khub_model *m)
{
    khub__place *pl = m->place;
    KHUB_FORWARD_IF_ERROR(m->rt, khub__cuda_stream_new(m->rt, pl->device, &pl->stream));
    KHUB_FORWARD_IF_ERROR(m->rt, dev_alloc(m, pl->weight_bytes, &pl->weights_dptr, "weights"));
    KHUB_FORWARD_IF_ERROR(m->rt, dev_alloc(m, pl->scratch_bytes, &pl->scratch_dptr, "scratch"));
    /* The KV cache (pl->kv_bytes, counted in check_fit) is the kv_cache
     * role's CUDA op's own allocation, made here. */
    KHUB_FORWARD_IF_ERROR(m->rt, khub__forward_device_init(m));
    upload u = {0, KHUB_STATUS_OK, NULL};
    khub__plugin_msg_clear();
    each_weight(m, upload_weight, &u);
    KHUB_RETURN_IF(m->rt, u.st != KHUB_STATUS_OK, u.st, "%s: cuda:%d: uploading '%s': %s", m->file,
                   (int)pl->device, u.failed ? u.failed : "?", khub__plugin_msg());
    if (head_shares_table(m)) m->lm_head.w.dptr = m->embed.dptr;
    /* The host's weights must outlive the asynchronous copies. */
    khub_status st = khub__cuda_host_stream_sync(NULL, pl->stream);
    KHUB_RETURN_IF(m->rt, st != KHUB_STATUS_OK, st, "%s: cuda:%d: uploading the weights: %s",
                   m->file, (int)pl->device, khub__plugin_msg());
    return KHUB_STATUS_OK;
}

/* ======================================================================== */
/* Entry points                                                             */
/* ======================================================================== */

static khub_status open_device(khub_model *m, int32_t ordinal)
{
    khub__place *pl = m->place;
    int n = 0;
    khub_status st = khub__cuda_info(m->rt, &pl->driver, &n);
    if (st != KHUB_STATUS_OK) {
        char why[KHUB_ERROR_SIZE];
        khub__copy_error(m->rt, why, sizeof why);
        khub__clear(m->rt); /* the first message wins: make room for the fuller one */
        return khub__fail(m->rt, st, "%s: device cuda:%d needs the CUDA driver: %s; use the CPU",
                          m->file, (int)ordinal, why);
    }
    KHUB_RETURN_IF(m->rt, n == 0, KHUB_STATUS_NO_CUDA,
                   "%s: device cuda:%d: CUDA driver %d.%d is present but sees no GPU; use the CPU",
                   m->file, (int)ordinal, pl->driver / 1000, pl->driver % 1000 / 10);
    KHUB_RETURN_IF(m->rt, ordinal < 0 || ordinal >= n, KHUB_STATUS_INVALID_ARG,
                   "%s: device cuda:%d: %d CUDA device(s) present (cuda:0..cuda:%d)", m->file,
                   (int)ordinal, n, n - 1);
    return khub__cuda_device_cc(m->rt, ordinal, &pl->cc);
}

static void report(khub_model *m, khub__text *t)
{
    khub__place *pl = m->place;
    khub__text_add(
        t, "placement: cuda:%d (sm_%d, driver %d.%d): %d roles on the device, %d on the CPU\n",
        (int)pl->device, (int)pl->cc, pl->driver / 1000, pl->driver % 1000 / 10, (int)pl->n_cuda,
        (int)pl->n_cpu);
    khub__text ops = {.rt = m->rt};
    if (pl->op_bytes) {
        khub__text_add(&ops, ", the ops' own scratch %.1f MiB (", mib(pl->op_bytes));
        op_stream_bytes(m, &ops);
        khub__text_add(&ops, ", kept for the model's stream)");
    }
    khub__text_add(
        t,
        "  device memory: weights %.1f MiB, KV cache %.1f MiB%s, scratch %.1f MiB%s = %.1f MiB; "
        "%.1f MiB were free of %.1f MiB\n",
        mib(pl->weight_bytes), mib(pl->kv_bytes), pl->kv_bytes ? "" : " (on the host)",
        mib(pl->scratch_bytes), ops.s ? ops.s : "",
        mib(pl->weight_bytes + pl->kv_bytes + pl->scratch_bytes + pl->op_bytes),
        mib(pl->free_bytes), mib(pl->total_bytes));
    t->oom |= ops.oom;
    khub__text_free(&ops);
    const char *pos = pl->cuda[KHUB__ROLE_ROTARY] ? " (+ 4 B of position)" : "";
    if (pl->cuda[KHUB__ROLE_EMBEDDING])
        khub__text_add(t,
                       "  host memory: weights of CPU roles %.1f MiB; embedding lookup on the "
                       "device (its table %.1f MiB in device memory%s), host->device 4 B of "
                       "token id per token%s\n",
                       mib(pl->host_weight_bytes), mib(weight_bytes(&m->embed)),
                       head_shares_table(m) ? ", read by the tied lm_head too" : "", pos);
    else
        khub__text_add(t,
                       "  host memory: weights of CPU roles %.1f MiB; embedding lookup on the "
                       "host, host->device %lld B per token%s\n",
                       mib(pl->host_weight_bytes), (long long)(4 * m->cfg.hidden_size), pos);
    char graphs[400];
    khub__graph_explain(m, graphs, sizeof graphs);
    khub__text_add(t,
                   "  forward pass on the device: one stream%s; logits device->host %lld B per "
                   "sequence per step; CUDA graphs: %s\n",
                   pl->n_cpu ? ", synchronised around each CPU role"
                             : ", one synchronisation per step",
                   pl->cuda[KHUB__ROLE_LM_HEAD] ? (long long)(4 * m->cfg.vocab_size) : 0LL, graphs);
}

khub_status khub__place_model(khub_model *m, khub_device device, bool strict,
                              const khub__device_prefs *dev)
{
    if (device.device_type == 0 || device.device_type == KHUB_DEVICE_CPU) return KHUB_STATUS_OK;
    KHUB_RETURN_IF(m->rt, device.device_type != KHUB_DEVICE_CUDA, KHUB_STATUS_INVALID_ARG,
                   "%s: device type %d: want KHUB_DEVICE_CPU or KHUB_DEVICE_CUDA", m->file,
                   (int)device.device_type);
    KHUB_RETURN_IF(m->rt, m->tp.size > 1, KHUB_STATUS_UNSUPPORTED,
                   "%s: device cuda:%d: tensor parallelism on CUDA devices is not built yet",
                   m->file, (int)device.device_id);
    m->place = khub__calloc(m->rt, 1, sizeof *m->place);
    KHUB_RETURN_IF(m->rt, !m->place, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
    khub__place *pl = m->place;
    pl->device = device.device_id;
    KHUB_FORWARD_IF_ERROR(m->rt, open_device(m, device.device_id));
    khub__text roles = {.rt = m->rt}, t = {.rt = m->rt};
    khub_status st = plan_roles(m, strict, dev, &roles);
    if (st == KHUB_STATUS_OK) {
        each_weight(m, count_weight, pl);
        pl->kv_bytes = pl->cuda[KHUB__ROLE_KV_CACHE] ? kv_bytes(m) : 0;
        /* + a paged call's int32 arrays (forward_device.c's B_PA) and the
         * step's token ids when the embedding is looked up there (B_IDS) */
        pl->scratch_bytes =
            m->scratch_bytes + (m->kv_layout ? (4u * m->max_seqs + 1) * 4u : 0) +
            (pl->cuda[KHUB__ROLE_EMBEDDING] ? round_up((size_t)m->max_batch * 4u) : 0);
        pl->op_bytes = op_stream_bytes(m, NULL);
        st = check_fit(m);
    }
    if (st == KHUB_STATUS_OK) st = allocate_and_upload(m);
    if (st == KHUB_STATUS_OK) {
        khub__graph_plan(m);
        report(m, &t);
        if (roles.s) khub__text_add(&t, "%s", roles.s);
        if (t.oom) st = khub__fail(m->rt, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
    }
    khub__text_free(&roles);
    if (st == KHUB_STATUS_OK) {
        pl->text = khub__strdup(m->rt, t.s);
        if (!pl->text) st = khub__fail(m->rt, KHUB_STATUS_NOMEM, "%s: out of memory", m->file);
    }
    khub__text_free(&t);
    if (st == KHUB_STATUS_OK)
        KHUB_LOG_I(m->rt,
                   "%s: cuda:%d holds %.1f MiB (weights %.1f, KV %.1f, scratch %.1f, the ops' "
                   "own %.1f)",
                   m->file, (int)pl->device,
                   mib(pl->weight_bytes + pl->kv_bytes + pl->scratch_bytes + pl->op_bytes),
                   mib(pl->weight_bytes), mib(pl->kv_bytes), mib(pl->scratch_bytes),
                   mib(pl->op_bytes));
    return st;
}

void khub__place_free(khub_model *m)
{
    khub__place *pl = m->place;
    if (!pl) return;
    /* The stream first: it waits for queued work that may still read or
     * write the blocks freed next. */
    if (pl->stream && khub__cuda_stream_free(m->rt, pl->device, pl->stream) != KHUB_STATUS_OK)
        KHUB_LOG_W(m->rt, "%s: cuda:%d: releasing the model's stream: %s", m->file, (int)pl->device,
                   khub_runtime_errmsg(m->rt));
    khub__graph_free(m);
    khub__forward_device_free(m);
    uint64_t blocks[] = {pl->weights_dptr, pl->kv_dptr, pl->scratch_dptr};
    for (int i = 0; i < 3; i++) {
        khub__plugin_msg_clear();
        if (blocks[i] && khub__cuda_host_mem_free(NULL, blocks[i]) != KHUB_STATUS_OK)
            KHUB_LOG_W(m->rt, "%s: cuda:%d: freeing device memory: %s", m->file, (int)pl->device,
                       khub__plugin_msg());
    }
    khub__strfree(m->rt, pl->text);
    khub__free(m->rt, pl, sizeof *pl);
    m->place = NULL;
}
