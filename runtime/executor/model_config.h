/*
 * model_config.h: the hyper-parameters of a Llama-family decoder, read from
 * a Hugging Face config.json (+ generation_config.json) or from GGUF metadata.
 *
 *     khub_model_config cfg;
 *     KHUB_FORWARD_IF_ERROR(rt, khub__model_config_from_hf_dir(rt, "/models/smol", &cfg));
 *     // or: khub__model_config_from_gguf(rt, g, &cfg);
 *
 * Supported: LlamaForCausalLM (llama, also SmolLM), MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM; GGUF
 * general.architecture llama, qwen2, qwen3, gemma3 (mistral GGUFs say "llama").
 * Gemma 3 from GGUF: gemma3.attention.sliding_window, the rest as llama.cpp
 * fixes it (local RoPE base 10000, every sixth layer global, attention scale
 * 1/sqrt(head_dim), as query_pre_attn_scalar = head_dim gives); the
 * soft-caps gemma3.attn_logit_softcapping (alias gemma3.attention.
 * logit_softcapping) and gemma3.final_logit_softcapping when a file sets them
 * (Gemma 3 does not). Gemma 3 from config.json (Gemma3ForCausalLM or model_type
 * gemma3_text): hidden_activation gelu_pytorch_tanh, query_pre_attn_scalar,
 * sliding_window with layer_types (a regular every-n-th-layer-global
 * pattern) or sliding_window_pattern, rope_local_base_freq (or v5's
 * rope_parameters per layer type), Gemma3TextConfig's defaults for absent
 * keys, attn_logit_softcapping and final_logit_softcapping (null or absent
 * = none; a cap must be a positive number); use_bidirectional_attention and
 * a text_config (multimodal) folder are refused. Everything else is refused with
 * MODEL_UNSUPPORTED naming the value and the supported ones, e.g.
 *   "config.json: architectures[0] 'GPT2LMHeadModel' is not supported (supported:
 *    LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
 *    Gemma3ForCausalLM)"
 *   "config.json: rope_scaling.rope_type 'yarn' is not supported (supported: default,
 *    linear, llama3)"
 * Malformed input (bad JSON, wrong JSON types, missing required fields,
 * non-positive sizes, heads not dividing) is MODEL_INVALID naming the field.
 * Every value is checked once here so the executor can trust the struct:
 * all counts >= 1, n_heads % n_kv_heads == 0, head_dim even, eps > 0,
 * rope_theta > 0.
 *
 * RoPE layout (rope_style): HF checkpoints and qwen2/qwen3 GGUFs pair x[i]
 * with x[i + D/2] (rotate-half, NEOX). llama GGUFs had their Q/K rows
 * permuted by llama.cpp's converter (exact formula in gguf.h) and pair
 * x[2i] with x[2i+1] (INTERLEAVED). Frequencies are theta^(-2i/D) in both.
 */
#ifndef KHUB_RUNTIME_MODEL_CONFIG_H
#define KHUB_RUNTIME_MODEL_CONFIG_H

#include "gguf.h"
#include "internal.h"

#define KHUB_MODEL_MAX_EOS 8

typedef enum khub_model_arch {
    KHUB_ARCH_UNKNOWN = 0,
    KHUB_ARCH_LLAMA = 1,
    KHUB_ARCH_MISTRAL = 2,
    KHUB_ARCH_QWEN2 = 3,
    KHUB_ARCH_QWEN3 = 4,
    KHUB_ARCH_GEMMA3 = 5
} khub_model_arch;

/* RoPE style and scaling use the plugin ABI's enums (khub_plugin.h):
 * khub_rope_style (KHUB_ROPE_NEOX, KHUB_ROPE_INTERLEAVED) and khub_rope_scaling
 * (KHUB_ROPE_SCALING_NONE, _LINEAR, _LLAMA3). */

typedef struct khub_model_config {
    khub_model_arch arch;
    khub_rope_style rope_style; /* how the Q/K weights of this source pair dims */

    int64_t hidden_size;       /* model width (d_model) */
    int64_t intermediate_size; /* FFN width */
    int64_t n_layers;
    int64_t n_heads;    /* query heads */
    int64_t n_kv_heads; /* key/value heads (GQA); defaults to n_heads */
    int64_t head_dim;   /* defaults to hidden_size / n_heads */
    int64_t vocab_size;
    int64_t max_position_embeddings; /* context length the model was trained for */

    double rope_theta; /* RoPE base; default 10000 */
    khub_rope_scaling rope_scaling;
    double rope_factor;            /* LINEAR, LLAMA3: factor; else 1 */
    double rope_low_freq_factor;   /* LLAMA3; else 0 */
    double rope_high_freq_factor;  /* LLAMA3; else 0 */
    int64_t rope_original_max_pos; /* LLAMA3: original_max_position_embeddings; else 0 */

    double rms_norm_eps;
    bool tie_word_embeddings;   /* lm_head shares the token embedding */
    int64_t sliding_window;     /* tokens of the attention window; 0 = full attention */
    int64_t sliding_from_layer; /* layers >= this use the window (Qwen2/3
                                   max_window_layers; Mistral 0) */
    bool attention_bias;        /* q/k/v (and for llama o) projections have a bias:
                                   Qwen2 always, Llama when attention_bias is true */
    bool mlp_bias;              /* Llama mlp_bias */
    bool qk_norm;               /* Qwen3, Gemma 3: RMSNorm over head_dim of q and k before
                                   RoPE */

    /* Gemma 3 (all neutral for the Llama family). */
    bool post_norms;         /* post_attention_norm and post_ffw_norm on each block's
                                output before its residual add (four norms a layer) */
    bool norm_plus_one;      /* RMSNorm scales by (1 + w): Gemma HF folders; GGUF files
                                hold w + 1 already (llama.cpp's converter adds it) */
    khub_act_type act;       /* gated MLP activation: SILU, or GELU_TANH (Gemma) */
    double embed_scale;      /* embeddings are multiplied by this (Gemma sqrt(hidden)); 1 */
    double attn_scale;       /* softmax scale; Gemma query_pre_attn_scalar^-0.5; 0 =
                                1/sqrt(head_dim) */
    int64_t sliding_pattern; /* > 0: layer L slides unless (L + 1) % pattern == 0
                                (Gemma 3: 6); 0: sliding_from_layer decides */
    double rope_theta_local; /* RoPE base of sliding layers (Gemma 3 rope_local_base_freq,
                                which use no rope scaling); 0 = rope_theta */
    double attn_softcap;     /* > 0: attention scores s become cap * tanh(s / cap) after the
                                scale (attn_logit_softcapping; the attention op needs
                                KHUB_ATTN_SOFTCAP); 0 = none */
    double final_softcap;    /* > 0: logits become cap * tanh(logit / cap)
                                (final_logit_softcapping); 0 = none */

    int32_t bos_token_id;                      /* -1 when none */
    int32_t eos_token_ids[KHUB_MODEL_MAX_EOS]; /* generation stops at any of these */
    int32_t n_eos;                             /* 0..KHUB_MODEL_MAX_EOS */
    int32_t pad_token_id;                      /* -1 when none */

    khub_dtype torch_dtype; /* HF torch_dtype/dtype (F32, F16 or BF16); GGUF: F32 */
} khub_model_config;

/* Reads dir/config.json and, when present, dir/generation_config.json (its
 * bos/eos ids replace config.json's). Errors: NOT_FOUND (no config.json), IO,
 * MODEL_INVALID, MODEL_UNSUPPORTED, NOMEM. out is fully written on success
 * and zeroed on error. */
KHUB_INTERNAL khub_status khub__model_config_from_hf_dir(khub_runtime *rt, const char *dir,
                                                         khub_model_config *out);

/* Parses config.json text (len bytes, no NUL needed). name is used in
 * messages ("config.json" or a path). */
KHUB_INTERNAL khub_status khub__model_config_from_json(khub_runtime *rt, const char *name,
                                                       const char *json, size_t len,
                                                       khub_model_config *out);

/* Applies generation_config.json text: bos_token_id, eos_token_id (int or
 * list, replacing the config's), pad_token_id when present. */
KHUB_INTERNAL khub_status khub__model_config_apply_generation(khub_runtime *rt, const char *name,
                                                              const char *json, size_t len,
                                                              khub_model_config *cfg);

/* Fills out from GGUF metadata: general.architecture and <arch>.* keys
 * (embedding_length, feed_forward_length, block_count, attention.head_count,
 * attention.head_count_kv, attention.key_length, rope.freq_base,
 * attention.layer_norm_rms_epsilon, context_length, rope.scaling.type /
 * .factor / .original_context_length, vocab_size), tokenizer.ggml.bos/eos/
 * eot/pad_token_id. vocab_size falls back to the length of
 * tokenizer.ggml.tokens, then to token_embd.weight ne[1];
 * tie_word_embeddings is true when output.weight is absent; qwen2 sets
 * attention_bias, qwen3 qk_norm; rope_style is INTERLEAVED for llama, NEOX for qwen. */
KHUB_INTERNAL khub_status khub__model_config_from_gguf(khub_runtime *rt, const khub_gguf *g,
                                                       khub_model_config *out);

/* "llama", "mistral", "qwen2", "qwen3", "gemma3"; "unknown" otherwise. */
KHUB_INTERNAL const char *khub__model_arch_name(khub_model_arch arch);

/* Transformers' defaults for the optional fields (model_config.c). */
KHUB_INTERNAL void khub__model_config_defaults(khub_model_config *c);
/* The shape and value checks every source's config passes; name (the file)
 * goes into the message. */
KHUB_INTERNAL khub_status khub__model_config_validate(khub_runtime *rt, const char *name,
                                                      khub_model_config *c);

#endif /* KHUB_RUNTIME_MODEL_CONFIG_H */
