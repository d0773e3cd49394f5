/*
 * executor.h: the inside of a khub_model, shared by model.c (loading),
 * forward.c (the decoder pass) and generate.c (generation).
 *
 * The executor does no math of its own beyond the embedding row lookup and
 * the sampler: every other step is an op from the registry, bound once per
 * (role, weight dtype) at load time and recorded for khub_model_explain.
 *
 * Batches: one forward call takes up to max_batch tokens split into
 * segments, each a run of consecutive positions of one sequence. Prefill of
 * several prompts and a decode step of several sequences are both one call:
 * every linear sees all rows at once, while rotary, the KV cache and
 * attention work per segment.
 */
#ifndef KHUB_RUNTIME_EXECUTOR_H
#define KHUB_RUNTIME_EXECUTOR_H

#include <pthread.h>

#include "khub/khub_model.h"
#include "model_config.h"
#include "tp.h"
#include "weights.h"

/* khub_model_opts' 0.1 size, up to progress_ud (its "End of 0.1"): a
 * caller's options are refused below it (khub_model_load and
 * khub_model_load_hub; before session 18 anything from 8 bytes was read,
 * the rest as zeros). */
#define KHUB__MODEL_OPTS_0_1 (offsetof(khub_model_opts, progress_ud) + sizeof(void *))

typedef struct khub_tokenizer khub_tokenizer;
typedef struct khub__place khub__place;
typedef struct khub_gguf khub_gguf;
typedef struct khub_safetensors khub_safetensors;

/* Roles an op plays in the model; a binding is kept per (role, dtype). */
typedef enum khub__role {
    KHUB__ROLE_EMBED_DEQUANT, /* qlinear dequantize for a quantized embedding */
    KHUB__ROLE_QUANTIZE,      /* qlinear quantize at load */
    KHUB__ROLE_NORM,          /* rms_norm without residual (first layer, q/k norm) */
    KHUB__ROLE_NORM_RESIDUAL, /* rms_norm with the fused residual add */
    KHUB__ROLE_QKV,           /* q/k/v projections */
    KHUB__ROLE_ROTARY,
    KHUB__ROLE_KV_CACHE,
    KHUB__ROLE_ATTENTION,
    KHUB__ROLE_O,
    KHUB__ROLE_GATE_UP,
    KHUB__ROLE_ACT,
    KHUB__ROLE_DOWN,
    KHUB__ROLE_LM_HEAD,
    KHUB__ROLE_PAGED_ATTENTION, /* the paged cache's attention, bound by its KV layout */
    /* The token embedding lookup as an op (ABI 1.5). The CPU pass looks rows
     * up itself (khub__weight_rows; khub/ref-cpu's embedding op is bit for
     * bit the same, tests/test_embedding.c), so no CPU binding is made:
     * only placement asks for a CUDA op of the role (placement.c). */
    KHUB__ROLE_EMBEDDING,
    KHUB__ROLE__COUNT
} khub__role;

typedef struct khub__bound {
    khub__role role;
    int32_t dtype_id; /* of the weight / KV, -1 when none */
    khub_binding *b;  /* owned by the runtime */
    /* The registry query that chose b, for the same query on another
     * device (placement.c); 0 where the binding was not made by a query. */
    uint32_t kind, flags, kv_layout;
} khub__bound;

/* A binding a kernel swap replaced, as khub_model_binding_get lists it:
 * the binding itself is released at the swap (khub__registry_drop), so its
 * name and its final count are kept here. */
typedef struct khub__retired {
    khub__role role;
    int32_t dtype_id;
    char kernel[192]; /* khub_binding_name of the binding: "id version :: op" */
    uint64_t calls;   /* the calls it made; final (nothing calls it after the swap) */
} khub__retired;

/* A weight matrix with the binding that runs it (linear or qlinear). */
typedef struct khub__mat {
    khub__weight w;
    khub__weight bias; /* f32 [out], t.data NULL when none */
    khub_binding *op;
} khub__mat;

typedef struct khub__layer {
    khub__weight attn_norm, ffn_norm;           /* f32 [hidden] */
    khub__weight q_norm, k_norm;                /* f32 [head_dim], Qwen3 and Gemma 3 */
    khub__weight post_attn_norm, post_ffw_norm; /* f32 [hidden], Gemma 3 only */
    khub__mat q, k, v, o, gate, up, down;
    /* q, k and v joined into one weight of q_rows + 2 kv_rows rows, and
     * gate and up into one of 2 ffn rows (model_fuse.c), so the layer calls
     * their op once for each: qkv.op / gate_up.op NULL when not joined.
     * Joined, q, k and v (gate and up) are views into the joined block,
     * which qkv (gate_up) owns. */
    khub__mat qkv, gate_up;
    int64_t window;    /* sliding window in tokens, 0 = full */
    double rope_theta; /* RoPE base of this layer (Gemma 3: local or global) */
} khub__layer;

/* One run of consecutive tokens of a sequence in a forward batch. */
typedef struct khub__seg {
    int32_t seq; /* KV sequence, [0, max_seqs) */
    int32_t pad;
    int64_t pos0; /* position of its first token */
    int64_t n;    /* tokens */
} khub__seg;

struct khub_model {
    khub_runtime *rt;
    khub_model_config cfg;
    khub_model_info info;
    char path[1024];
    char file[256]; /* base name for messages */

    khub_gguf *gguf; /* owned, one of these two */
    khub_safetensors *st;
    khub_tokenizer *tok; /* owned, NULL when the model has none */

    /* Weights. */
    khub__weight embed;      /* [vocab, hidden] */
    khub__weight final_norm; /* f32 [hidden] */
    khub__mat lm_head;       /* its weight may alias embed (tied): then w.owned is NULL
                                and w.t.data points at embed's data */
    khub__layer *layers;     /* owned, [n_layers] */

    /* Bindings. bound[] and retired[] change only on the model's thread (at
     * load, and in khub__model_rebind) and only under bind_lock, which
     * khub_model_binding_get takes to read them from any thread; the
     * forward pass reads the pointers below without it (same thread). */
    khub__bound bound[64];
    int n_bound;
    khub__retired *retired; /* owned, [n_retired]: bindings a rebind replaced, oldest first */
    int n_retired, cap_retired;
    char **old_explain; /* owned, [n_old_explain]: explain tables of before a rebind, kept
                           because khub_model_explain's answer lives until khub_model_free */
    int n_old_explain;
    pthread_mutex_t bind_lock;
    khub_binding *norm, *norm_res, *rotary, *attention, *act, *kv_op;
    khub_binding *dequant; /* for a quantized embedding, or NULL */
    /* The embedding role's CPU op (kind 9) when khub_model_opts.embed_impl
     * names a plugin, else NULL: the host looks the rows up itself. */
    khub_binding *embed_op;
    /* KHUB_OPT_VERIFY_KERNELS (runtime/executor/verify.c): khub/ref-cpu's binding per
     * op kind (made on first use) and the calls seen per kind. */
    khub_binding *verify_ref[KHUB_OP_KIND__COUNT];
    int64_t verify_calls[KHUB_OP_KIND__COUNT];
    uint32_t rope_style; /* khub_rope_style */

    /* KV cache (plugin-owned). */
    const khub_kv_cache_methods *kv;
    void *kv_state;
    khub_kv_cache *cache;
    bool kv_view_from;    /* the cache has view_from (ABI 1.4) */
    char kv_options[192]; /* the cache strategy's "key=value,..." options, "" = none */
    khub_dtype kv_dtype;
    int64_t max_context;
    int64_t *seq_len; /* owned, [max_seqs] tokens cached per sequence */
    /* owned, [max_seqs] times each sequence was truncated: a khub_session
     * (session.c) sees from it that another user took its sequence. */
    uint64_t *seq_resets;
    struct khub_session *session; /* the model's khub_session, or NULL (borrowed) */
    /* What each sequence may hold (kv_budget.c). */
    int64_t *kv_held;      /* owned, [max_seqs] tokens granted per sequence */
    int64_t kv_held_total; /* sum of kv_held */
    int64_t kv_limit;      /* tokens all sequences may hold together */
    /* Paged cache (issue 13): set when the bound cache serves a paged KV
     * layout (caps.kv_layouts); attention then goes through paged_attn, one
     * call per layer for the whole batch. NULL / 0 for a dense cache. */
    khub_binding *paged_attn;
    uint32_t kv_layout;     /* KHUB_KV_LAYOUT_* shared by the cache and paged_attn */
    bool kv_paged_default;  /* the pool was chosen because nothing named a cache
                               (model_bind.c paged_by_default) */
    int32_t kv_block_size;  /* khub_model_opts: tokens per block, 0 = the cache's */
    int32_t kv_num_blocks;  /* khub_model_opts: blocks in the pool, 0 = from the budget */
    uint64_t kv_max_bytes;  /* khub_model_opts: KV memory budget, 0 = none */
    int64_t kv_pool_tokens; /* blocks x block size of the paged pool */
    int32_t *pa_ints;       /* owned, [4 * max_seqs + 1]: cu_seqlens_q, q_pos0, kv_lens,
                               seq_rows of a paged call */

    /* Scratch, allocated at load: no allocation per token. */
    int32_t max_batch, max_seqs;
    float *x;           /* [max_batch, hidden] residual stream */
    float *xb;          /* [max_batch, hidden] normed input of a block */
    float *q;           /* [max_batch, n_heads * head_dim] */
    float *k;           /* [max_batch, n_kv_heads * head_dim] */
    float *v;           /* [max_batch, n_kv_heads * head_dim] */
    float *att;         /* [max_batch, n_heads * head_dim] attention output; before it,
                           joined q/k/v's output (forward.c qkv_proj) */
    float *ob;          /* [max_batch, hidden] o_proj / down output */
    float *gate;        /* [max_batch, ffn] */
    float *up;          /* [max_batch, ffn]; joined gate/up's output first (forward.c) */
    float *last;        /* [max_seqs, hidden] rows that need logits */
    float *logits;      /* [max_seqs, vocab] */
    int32_t *positions; /* [max_batch] */
    size_t scratch_bytes;

    char *explain; /* owned, built on first khub_model_explain */

    /* Tensor parallelism (tp.h): size 1 without. */
    khub__tp tp;

    /* Device placement (placement.h): owned, NULL for a model on the CPU. */
    khub__place *place;
};

/* Runs tokens[0..n) laid out as segs[0..n_segs) (n = sum of segs[i].n <=
 * max_batch, n_segs <= max_seqs, each segment continuing its sequence:
 * pos0 == seq_len[seq]) and writes the logits of each segment's last token to
 * m->logits[i * vocab]. The KV cache grows by each segment. CONTEXT_FULL when
 * a segment would pass max_context. */
/* Calls b's op like khub_binding_call; with KHUB_OPT_VERIFY_KERNELS = N > 0
 * one call in N of each kind also runs khub/ref-cpu's op on copies of the
 * inputs and fails with KERNEL_MISMATCH when the outputs differ by more
 * than the kind's NMSE tolerance (runtime/executor/verify.c). */
KHUB_INTERNAL khub_status khub__verified_call(khub_model *m, khub_binding *b, const void *args,
                                              const char *what, int layer);
KHUB_INTERNAL khub_status khub__forward(khub_model *m, const int32_t *tokens, const khub__seg *segs,
                                        int n_segs);
/* khub__forward, and with all_rows the logits of every row of the step,
 * [tokens, vocab], into out instead of the last rows' into m->logits (out
 * is NULL on tp ranks > 0: they only join the logits' all-gathers). */
KHUB_INTERNAL khub_status khub__forward_rows(khub_model *m, const int32_t *tokens,
                                             const khub__seg *segs, int n_segs, bool all_rows,
                                             float *out);
/* The host's KV cache write, view and attention of one layer for a batch
 * (forward.c; the device pass calls it when both sit on the CPU). */
KHUB_INTERNAL khub_status khub__forward_attend_host(khub_model *m, int layer, const khub__seg *segs,
                                                    int n_segs);
/* Forgets sequence seq's cache (a new prompt starts at position 0). */
KHUB_INTERNAL khub_status khub__forward_reset(khub_model *m, int32_t seq);
/* Forgets positions >= n of sequence seq (n <= its length; 0 = reset):
 * the cache plugin's truncate, which a cache that dropped older positions
 * may refuse (then the caller resets). */
KHUB_INTERNAL khub_status khub__forward_truncate(khub_model *m, int32_t seq, int64_t n);

/* ---- model_fuse.c: one call for q/k/v and one for gate/up --------------- */

/* Joins layer L's q, k and v into one weight when one op serves all three
 * alike, and gate and up likewise (model_fuse.c says when, and why the
 * result is the same bits). Off under tensor parallelism, on a device, and
 * with KHUB_JOIN_PROJ=0 in the environment. NOMEM when the joined copy
 * cannot be had. */
KHUB_INTERNAL khub_status khub__model_join_layer(khub_model *m, int L, bool on_device);
/* Layers whose q/k/v (qkv) or gate/up (!qkv) run as one call (a layer is
 * joined when its qkv / gate_up matrix has an op). */
KHUB_INTERNAL int khub__model_n_joined(const khub_model *m, bool qkv);
/* The line khub_model_explain adds under binding b when it runs joined
 * q/k/v or gate/up ("    q_proj, k_proj, v_proj as one call ..."), or "". */
KHUB_INTERNAL void khub__model_join_explain(const khub_model *m, const khub__bound *b, char *buf,
                                            size_t n);

/* ---- model_rebind.c: a kernel role switched to another plugin ---------- */

/* Rebinds every binding of kernel role `role` (khub_kernel_role: attention,
 * norm, activation or rotary) to plugin's op (op_name, or its best op of the
 * kind), strictly: all of the role's queries must be served by plugin, or
 * nothing changes (NO_KERNEL saying why). The cache, linear and
 * quantization roles are refused with UNSUPPORTED. Call on the model's
 * thread, between forward calls. */
KHUB_INTERNAL khub_status khub__model_rebind(khub_model *m, int role, const khub_plugin *plugin,
                                             const char *op_name);
KHUB_INTERNAL void khub__model_rebind_free(khub_model *m);

/* ---- model_bind.c ------------------------------------------------------ */

/* An executor role's name as khub_model_explain shows it. */
KHUB_INTERNAL const char *khub__model_role_name(const khub_model *m, khub__role role);
/* A binding's weight or KV dtype as explain writes it ("f32", "q4_1"; ""
 * when it has none). Static storage. */
KHUB_INTERNAL const char *khub__model_bound_dtype(const khub__bound *b);
/* The KHUB_ATTN_* flags the model's attention query asks for (bits 0-7 are
 * the 1.0 KHUB_CAP_* word's; KHUB_ATTN_SOFTCAP, ABI 1.5, when it caps). */
KHUB_INTERNAL uint64_t khub__model_attn_flags(const khub_model *m);

/* Allocates m's scratch for its config, max_batch and max_seqs. */
KHUB_INTERNAL khub_status khub__forward_alloc(khub_model *m);
KHUB_INTERNAL void khub__forward_free(khub_model *m);

/* ---- kv_budget.c: KV capacity per sequence ------------------------------
 * The scheduler's view of the cache: a sequence (a slot in [0, max_seqs))
 * is granted tokens before a forward call writes them, and gives them all
 * back when it leaves. Dense: slots of max_context tokens under a total
 * limit; a paged pool answers from its blocks. */
KHUB_INTERNAL khub_status khub__kv_budget_init(khub_model *m); /* after forward_alloc */
KHUB_INTERNAL void khub__kv_budget_free(khub_model *m);
/* Whether seq can hold n tokens in all (what it holds counts as granted). */
KHUB_INTERNAL bool khub__kv_can_grow(const khub_model *m, int32_t seq, int64_t n);
/* Grants seq n tokens in all; CONTEXT_FULL when khub__kv_can_grow says no. */
KHUB_INTERNAL khub_status khub__kv_grow(khub_model *m, int32_t seq, int64_t n);
/* Gives back all of seq's tokens and empties its cache. */
KHUB_INTERNAL khub_status khub__kv_release(khub_model *m, int32_t seq);
/* Tokens not granted to any sequence, granted, the limit, and the most the
 * cache could hold (every slot full). */
KHUB_INTERNAL int64_t khub__kv_free_tokens(const khub_model *m);
KHUB_INTERNAL int64_t khub__kv_used_tokens(const khub_model *m);
KHUB_INTERNAL int64_t khub__kv_limit_tokens(const khub_model *m);
KHUB_INTERNAL int64_t khub__kv_capacity_tokens(const khub_model *m);
/* Limits the tokens all sequences hold together (0 = the capacity);
 * INVALID_ARG outside [0, capacity]. */
KHUB_INTERNAL khub_status khub__kv_set_limit(khub_model *m, int64_t tokens);

#endif /* KHUB_RUNTIME_EXECUTOR_H */
