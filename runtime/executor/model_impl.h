/*
 * model_impl.h: what model.c, model_weights.c and model_bind.c share.
 * Internal to runtime/executor.
 */
#ifndef KHUB_RUNTIME_MODEL_IMPL_H
#define KHUB_RUNTIME_MODEL_IMPL_H

#include "executor.h"
#include "khub/khub_kernels.h"

/* The kernel choices of one load, from khub_model_opts. */
typedef struct load_prefs {
    /* The preferred plugin of each kernel role (KHUB_KERNEL_ROLES), from
     * khub_model_opts; [KHUB_KERNEL_ROLE_QUANT] is the plugin id part of
     * opts.quant, or NULL. */
    const char *pref[KHUB_KERNEL_ROLE__COUNT];
    char quant_plugin_buf[128];
    khub_qformat quant; /* scheme, NONE = keep dtypes */
    int strict;
    int quant_embeddings;
    const struct khub__device_prefs *dev; /* a placed model's device choices (placement.h) */
    bool on_device;                       /* khub_model_opts.device is a CUDA device */
} load_prefs;

/* ---- model_weights.c --------------------------------------------------- */

/* opts.quant ("int8", "org/name:q4_0", ...) into p's quant and
 * quant_plugin; INVALID_ARG naming the value otherwise. */
KHUB_INTERNAL khub_status khub__model_parse_quant(khub_runtime *rt, const char *s, load_prefs *p);
/* The embedding, the final norm and the LM head (tied or its own). */
KHUB_INTERNAL khub_status khub__model_load_ends(khub_model *m, const load_prefs *p);
/* Layer L's norms and projections. */
KHUB_INTERNAL khub_status khub__model_load_layer(khub_model *m, const load_prefs *p, int L);

/* ---- model_bind.c ------------------------------------------------------ */

/* The embedding role named (p->pref): binds the embedding op (kind 9) of
 * the table's dtype from that plugin into m->embed_op, the CPU's lookup
 * (the registry's message when none serves it). */
KHUB_INTERNAL khub_status khub__model_bind_embedding(khub_model *m, const load_prefs *p);
/* Binds the linear (dense) or qlinear (block format) op for mat's dtype. */
KHUB_INTERNAL khub_status khub__model_bind_mat(khub_model *m, const load_prefs *p, khub__role role,
                                               khub__mat *mat);
/* Binds a qlinear op that can quantize to (quantize) or dequantize from
 * dtype_id, preferring plugin pref (may be NULL). */
KHUB_INTERNAL khub_status khub__model_bind_qmethod(khub_model *m, khub__role role, int32_t dtype_id,
                                                   bool quantize, const char *pref,
                                                   khub_binding **out);
/* The ops without weights: norm, rotary, activation, attention, KV cache. */
KHUB_INTERNAL khub_status khub__model_bind_ops(khub_model *m, const load_prefs *p);
/* The KV cache, made by the bound cache plugin. */
KHUB_INTERNAL khub_status khub__model_make_cache(khub_model *m);

#endif /* KHUB_RUNTIME_MODEL_IMPL_H */
