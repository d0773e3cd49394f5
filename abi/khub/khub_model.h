/*
 * khub_model.h: load a Llama-family causal language model and generate text,
 * every op served by a plugin through the registry (khub.h).
 *
 * This is khub's equivalent of Transformers'
 * AutoModelForCausalLM.from_pretrained(path, attn_implementation=...,
 * quantization_config=...) followed by model.generate(...):
 *
 *     khub_runtime *rt = NULL;
 *     khub_runtime_new(NULL, &rt);
 *     khub_plugin_load_builtin(rt);
 *     khub_model_opts mo = {KHUB_APP_INIT(khub_model_opts),
 *                           .attn_impl = "khub/cpu-avx2"};  // a loaded plugin, or NULL
 *     khub_model *m = NULL;
 *     if (khub_model_load(rt, "SmolLM2-135M-Instruct.Q4_1.gguf", &mo, &m) != KHUB_STATUS_OK)
 *         fprintf(stderr, "%s\n", khub_runtime_errmsg(rt));
 *     const char *prompts[] = {"The capital of France is"};
 *     khub_generate_opts go = {KHUB_APP_INIT(khub_generate_opts), .max_new_tokens = 32};
 *     khub_generate_result res = {KHUB_APP_INIT(khub_generate_result)};
 *     khub_model_generate(m, prompts, 1, &go, &res);
 *     printf("%s\n", res.text);
 *     khub_generate_results_free(m, &res, 1);
 *     khub_model_free(m);
 *     khub_runtime_free(rt);
 *
 * To name kernels by Hub ID ("kernels-community/flash-attn2", fetched,
 * verified and loaded first), with a khub.json mapping and a khub.lock, call
 * khub_model_load_hub (khub_kernels.h) with these options as its base.
 *
 * Models: a GGUF file (F32/F16/BF16 and Q8_0, Q4_0, Q4_1, Q4_K, Q6_K tensors,
 * used in place from the mmapped file) or a Hugging Face folder (config.json,
 * *.safetensors, tokenizer.json). Architectures: Llama (SmolLM, SmolLM2),
 * Mistral, Qwen2, Qwen3. Compute is f32.
 *
 * Threading: a model is used by one thread at a time; ops run on the
 * runtime's thread pool. Errors: as everywhere in khub, the status says what
 * kind of failure and khub_runtime_errmsg(rt) says what failed, on what.
 *
 * Anything not declared in abi/khub/ is not part of khub's API.
 */
#ifndef KHUB_MODEL_H
#define KHUB_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "khub.h"
#include "khub_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct khub_model khub_model;

/* ------------------------------------------------------------------------ */
/* Loading                                                                  */
/* ------------------------------------------------------------------------ */

/* Splits of o_proj and down_proj under tensor parallelism
 * (khub_model_opts.tp_plan). Since 0.2. */
typedef enum khub_tp_plan {
    KHUB_TP_PLAN_REDUCE = 0, /* rowwise, then one all-reduce (Megatron-LM's) */
    KHUB_TP_PLAN_GATHER = 1  /* input all-gathered, output rows split, all-gathered */
} khub_tp_plan;

/* How to load a model. Zero / NULL fields take the defaults. The *_impl
 * strings name a plugin id ("kernels-community/flash-attn2") that the
 * registry should prefer for that role; when it cannot serve the model (head
 * dim, dtype, CPU features) the best other plugin is used with a warning,
 * or, with strict, loading fails with KHUB_STATUS_NO_KERNEL. */
typedef struct khub_model_opts {
    KHUB_STRUCT_HEADER;
    int32_t n_threads; /* 0 = the runtime's pool; else must equal its size (the pool
                          belongs to the runtime: set khub_runtime_opts.n_threads) */
    /* {0, 0} or {KHUB_DEVICE_CPU, 0}: the CPU. {KHUB_DEVICE_CUDA, N}: placed on
     * CUDA device N (docs/gpu.md): each role with a CUDA op runs there and its
     * weights are uploaded once; a role without one stays on the CPU (refused
     * with strict); memory is checked per part before allocating. The forward
     * pass runs on the device, its decode steps as CUDA graphs when every
     * role is there (KHUB_CUDA_GRAPHS=0 in the environment turns them off;
     * khub_model_explain says which, and why). */
    khub_device device;
    /* Role preferences: a loaded plugin's id ("kernels-community/flash-attn2"),
     * optionally with ":op" to name one of its ops, or NULL. Hub IDs and
     * built-in names are resolved one level up (khub_model_load_hub in
     * khub_kernels.h), which passes the loaded plugin's id here. */
    const char *attn_impl; /* borrowed; attention plugin id or NULL */
    /* Quantize-at-load (BitsAndBytesConfig's role): "int8" (per-row int8),
     * "nf4" (NF4, blocks of 64), "q8_0", "q4_0"; optionally prefixed by a
     * plugin id and ':' ("acme/quant:nf4"), or a plugin id alone to prefer
     * that plugin for already-quantized GGUF tensors. NULL = keep dtypes. */
    const char *quant;        /* borrowed */
    const char *cache_impl;   /* borrowed; KV cache plugin id or NULL */
    const char *norm_impl;    /* borrowed; rms_norm plugin id or NULL */
    const char *act_impl;     /* borrowed; silu_and_mul plugin id or NULL */
    const char *rotary_impl;  /* borrowed; rotary plugin id or NULL */
    int32_t strict;           /* 1 = a preferred plugin that cannot serve is an error */
    int32_t quant_embeddings; /* 1 = quantize the output head too (with quant): lm_head,
                                 or a copy of the tied embedding; lookups stay dense */
    int64_t max_context;      /* KV capacity per sequence in tokens, 0 = min(model, 4096) */
    khub_dtype kv_dtype;      /* KV cache storage: {0} = f32, or KHUB_DTYPE_F16 */
    uint32_t reserved;
    const char *linear_impl; /* borrowed; dense/quantized linear plugin id or NULL */
    int32_t max_batch;       /* tokens per forward call (prefill chunk), 0 = 256 */
    int32_t max_seqs;        /* sequences generated together, 0 = 8 */
    /* Called on the loading thread after each layer is loaded (and
     * quantized), done of total, e.g. for a progress bar; NULL = none. */
    void (*progress)(void *ud, int32_t done, int32_t total);
    void *progress_ud;
    /* End of 0.1: 128 bytes, the struct as it stood when 0.2's changes
     * began (abi/ABI.md's history; khub_model_load refuses less). Every
     * field below came after, with 0.2. */
    /* Since 0.2, with plugin ABI 1.4 (issue 13): the paged KV cache's pool
     * (`--cache paged`; dense caches ignore them). kv_block_size: tokens per
     * block, 0 = the cache's default (16 for khub/ref-cpu); kv_num_blocks:
     * blocks in the pool, 0 = what kv_max_bytes holds, or with no budget
     * enough for max_seqs sequences of max_context tokens; kv_max_bytes: the
     * pool's memory budget in bytes, 0 = none. A sequence that needs a
     * block when none is free fails with KHUB_STATUS_KV_FULL. */
    int32_t kv_block_size;
    int32_t kv_num_blocks;
    uint64_t kv_max_bytes;
    /* Since 0.2 (issue 18): tensor parallelism (docs/parallelism.md).
     * tp_size: ranks the model is split over, 0 or 1 = none; comm: their
     * collectives (khub_comm.h; borrowed for the model's life), required
     * when tp_size > 1 with comm->size == tp_size. Every rank loads the same
     * file with the same options; rank 0 then generates and the others call
     * khub_model_tp_serve. */
    int32_t tp_size;
    /* Since 0.2 (issue 18; in the place of reserved2, which came with
     * tp_size and which every caller zeroed): how o_proj and down_proj are
     * split, the same on every rank (enum khub_tp_plan).
     * KHUB_TP_PLAN_REDUCE (0): Megatron-LM's, each rank multiplies its
     * columns and one all-reduce sums the partial outputs; the float sum's
     * other order moves the last bits, which kernels with integer
     * activations carry further (docs/parallelism.md). KHUB_TP_PLAN_GATHER:
     * the input is all-gathered whole and each rank computes its rows of
     * the output, then all-gathered: no sum crosses ranks, so each logit is
     * computed as one process computes it; more bytes move per layer. */
    int32_t tp_plan;
    const khub_comm *comm;
    /* Since 0.2 (issue 19): the embedding role's plugin id (borrowed), or
     * NULL: the host's own row lookup, as in 0.1. A named plugin's
     * embedding op (kind 9, plugin ABI 1.5) looks the rows up instead, on
     * the CPU; a model placed on a CUDA device prefers its CUDA op. */
    const char *embed_impl;
} khub_model_opts;

/* Loads the model at path: a .gguf file, or a folder holding config.json and
 * safetensors. A .gguf of 2 MiB or more is read into memory on 2 MiB
 * transparent huge pages where the kernel offers them (THP "always" or
 * "madvise"; KHUB_HUGE_PAGES=0 in the environment, a tensor-parallel rank
 * or a CUDA device: mapped instead); safetensors are mapped; quantize-at-load
 * writes the quantized copy. Progress is logged at INFO. opts may be NULL.
 * Statuses: IO, NOT_FOUND, MODEL_INVALID (malformed file, a tensor missing
 * or of the wrong shape), MODEL_UNSUPPORTED (architecture or field value),
 * NO_KERNEL (no plugin serves a role), NOMEM, INVALID_ARG (an option),
 * STRUCT_SIZE (opts, or opts->comm, below its 0.1 size: "khub_model_load:
 * opts.struct_size S is smaller than 0.1's 128"; since 0.2, where a smaller
 * struct was read as zeros); with a CUDA device also NO_CUDA (no driver
 * or no GPU), CUDA (a driver call failed), NOMEM (the model does not fit
 * the device's free memory). *out is NULL on failure. Since 0.1. */
KHUB_API khub_status khub_model_load(khub_runtime *rt, const char *path,
                                     const khub_model_opts *opts, khub_model **out);
/* Frees the model, its KV cache and scratch; unmaps its files. Accepts NULL.
 * Its op bindings leave the runtime with it (since session 16): a plugin
 * that served only freed models can then be unloaded (khub_plugin_unload),
 * and one a kernel swap's prepare loaded is unloaded here when nothing else
 * uses it (khub_kernels.h, "Ownership of the prepared plugin"). A plugin
 * the caller or a model load loaded stays loaded: the caller's to unload.
 * Not while another thread uses m. Since 0.1. */
KHUB_API void khub_model_free(khub_model *m);

/* What was loaded. */
typedef struct khub_model_info {
    KHUB_STRUCT_HEADER;
    char arch[32];   /* "llama", "qwen2", "qwen3", "mistral" */
    char format[16]; /* "gguf" or "safetensors" */
    int32_t n_layers;
    int32_t hidden; /* hidden size */
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t ffn;            /* intermediate size */
    int32_t vocab;          /* rows of the logits */
    int32_t n_eos;          /* end-of-sequence ids in eos[] */
    int64_t context_length; /* the model's trained context, tokens */
    int64_t max_context;    /* this load's KV capacity per sequence, tokens */
    uint64_t n_params;      /* weights (elements) */
    uint64_t weight_bytes;  /* bytes of weights as used: mapped plus quantized copies */
    uint64_t scratch_bytes; /* activations, logits and KV cache, bytes */
    double load_ms;         /* wall time of khub_model_load */
    int32_t eos[8];         /* end-of-sequence token ids */
    int32_t bos;            /* beginning-of-sequence id, -1 = none */
    uint32_t reserved;
    /* End of 0.1. */
    /* KV cache bytes of one token of one sequence (every layer, K and V,
     * scales amortized) as the cache plugin reports it (ABI 1.4 `memory`);
     * 0 when the cache does not say. Since 0.1 (plugin ABI 1.4). */
    uint64_t kv_bytes_per_token;
    /* This rank and the ranks of a tensor-parallel load (0 and 1 without);
     * weight_bytes and scratch_bytes are then this rank's. Since 0.2 (issue 18). */
    int32_t tp_rank;
    int32_t tp_size;
    /* Collectives this rank has run since the load, and the wall time spent
     * in them (ns): the communication share of a step. Since 0.2 (issue 18). */
    uint64_t tp_collectives;
    uint64_t tp_comm_ns;
} khub_model_info;

/* Fills info up to its struct_size, set by the caller and at least 0.1's
 * 176 bytes; struct_size and the stamp stay the caller's. STRUCT_SIZE below
 * ("khub_model_info_get: info.struct_size S is smaller than 0.1's 176" in
 * khub_runtime_errmsg; before 0.2 any size from 8 bytes was taken and
 * struct_size set to what was written), MISUSE. Since 0.1. */
KHUB_API khub_status khub_model_info_get(const khub_model *m, khub_model_info *info);
/* The runtime m was loaded on (borrowed; for khub_runtime_errmsg after a
 * khub_model_* call failed); NULL for NULL. Since 0.1. */
KHUB_API khub_runtime *khub_model_runtime(const khub_model *m);
/* Tensor parallelism, ranks other than 0: runs the forward steps that rank
 * 0 of the same model broadcasts (its khub_model_generate, khub_model_logits,
 * batches) on this rank's shards, and returns KHUB_STATUS_OK when rank 0
 * frees its model. A failed step or collective returns its status (the
 * message names the rank and the step): the job cannot go on, so end the
 * process and let the launcher stop the others. INVALID_ARG on rank 0 or
 * without tp_size > 1. Since 0.2 (issue 18). */
KHUB_API khub_status khub_model_tp_serve(khub_model *m);

/* The role -> plugin table: one line per role ("q_proj[q4_1]: khub/ref-cpu
 * 0.1.0 :: qlinear") followed by that binding's decision trace, indented.
 * Owned by the model, valid until khub_model_free (a kernel swap,
 * khub_model_kernel_swap in khub_kernels.h, makes the next call return a
 * new table; the old one stays valid). Since 0.1. */
KHUB_API const char *khub_model_explain(khub_model *m);

/* One op binding of a model, a line of khub_model_explain's table, and how
 * often it was called. */
typedef struct khub_model_binding {
    KHUB_STRUCT_HEADER;
    char role[32];    /* "attention", "qkv_proj", "kv_cache", "rms_norm+residual", ... */
    char dtype[16];   /* its weight or KV dtype: "f32", "q4_1", ...; "" when none */
    char kernel[192]; /* the op serving it: "khub/ref-cpu 0.1.0 :: attention" */
    uint64_t calls;   /* calls made through it since the load (khub_binding_calls) */
    uint32_t retired; /* 1 = a kernel swap replaced it: it takes no new call */
    uint32_t reserved;
    /* End of 0.1. */
} khub_model_binding;

/* Fills *out (its struct_size set by the caller) with binding i of m: the
 * bindings serving now, in khub_model_explain's order, then the ones kernel
 * swaps retired, oldest first, so that their counts are not lost (a
 * counter in Prometheus's sense only grows). Any thread, also while
 * another thread runs the model: it reads atomics under a lock that only
 * a kernel swap takes. Statuses: NOT_FOUND past the last binding (the loop
 * ends there), STRUCT_SIZE (out older than 0.1: "khub_model_binding_get:
 * out.struct_size S is smaller than 0.1's 264" in khub_last_error(), and
 * in khub_runtime_errmsg unless it holds a message already: nothing here
 * clears it under another thread), MISUSE. Since 0.1. */
KHUB_API khub_status khub_model_binding_get(const khub_model *m, size_t i, khub_model_binding *out);

/* ------------------------------------------------------------------------ */
/* Tokens                                                                   */
/* ------------------------------------------------------------------------ */

/* Encodes text into ids[cap]; *n receives the count (also when it exceeds
 * cap, then with KHUB_STATUS_OVERFLOW). add_bos: prepend the model's BOS when
 * it has one and the tokenizer asks for it. Since 0.1. */
KHUB_API khub_status khub_model_tokenize(khub_model *m, const char *text, int add_bos, int32_t *ids,
                                         size_t cap, size_t *n);
/* Decodes ids into buf[cap] as UTF-8, NUL-terminated; *len receives the
 * length without the NUL (KHUB_STATUS_OVERFLOW when it does not fit). Special
 * tokens are dropped. Since 0.1. */
KHUB_API khub_status khub_model_detokenize(khub_model *m, const int32_t *ids, size_t n, char *buf,
                                           size_t cap, size_t *len);

/* Formats a conversation with the model's own chat template (ChatML,
 * Llama-3 or Gemma, recognised from the template text; khub has no Jinja
 * engine): roles[i] ("system", "user", "assistant") and contents[i] for
 * i < n, both borrowed; add_generation_prompt 1 appends the opening of the
 * assistant's turn. The text, NUL-terminated, goes to buf[cap] and *len
 * receives its length without the NUL (KHUB_STATUS_OVERFLOW when it does
 * not fit: call again with cap > *len). It is meant as a prompt of
 * khub_model_generate with chat = 0, which adds the model's BOS when the
 * tokenizer asks for one, so a BOS text that the template writes first is
 * left out then. Statuses: TOKENIZER (no tokenizer, no or an unrecognised
 * template, an empty role, a NULL content, roles that Gemma's template
 * refuses), OVERFLOW, NOMEM. Since 0.1. */
KHUB_API khub_status khub_model_chat_format(khub_model *m, const char *const *roles,
                                            const char *const *contents, size_t n,
                                            int add_generation_prompt, char *buf, size_t cap,
                                            size_t *len);

/* ------------------------------------------------------------------------ */
/* Generation                                                               */
/* ------------------------------------------------------------------------ */

/* Streaming callback: text is the next complete UTF-8 piece of prompt
 * `prompt`'s output (borrowed, valid during the call, not NUL-terminated).
 * Return 0 to go on, nonzero to stop that prompt. */
typedef int (*khub_stream_fn)(void *ud, int32_t prompt, const char *text, size_t len);

typedef struct khub_generate_opts {
    KHUB_STRUCT_HEADER;
    int32_t max_new_tokens;   /* 0 = 128 */
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* 0 = all */
    float top_p;              /* 0 or 1 = off */
    float repetition_penalty; /* 0 or 1 = off; CTRL-style, over prompt and output */
    uint64_t seed;            /* sampling seed; same seed, same tokens */
    const char *const *stop;  /* borrowed; [n_stop] strings that end a prompt's output */
    uint32_t n_stop;
    uint32_t chat;           /* 1 = each prompt is a user message: apply the chat template */
    const char *system;      /* borrowed; chat system message or NULL */
    khub_stream_fn callback; /* NULL = no streaming */
    void *callback_ud;
    int32_t ignore_eos; /* 1 = do not stop at EOS (benchmarks) */
    uint32_t reserved;
    /* End of 0.1. */
} khub_generate_opts;

typedef enum khub_stop_reason {
    KHUB_STOP_NONE = 0,
    KHUB_STOP_EOS = 1,        /* an end-of-sequence token */
    KHUB_STOP_MAX_TOKENS = 2, /* max_new_tokens reached */
    KHUB_STOP_STRING = 3,     /* a stop string appeared (it is cut from text) */
    KHUB_STOP_CALLBACK = 4,   /* the stream callback asked to stop */
    KHUB_STOP_CONTEXT = 5,    /* the KV cache is full */
    KHUB_STOP_CANCELLED = 6   /* khub_batch_cancel, khub_session_cancel; added in 0.1 */
} khub_stop_reason;

/* One prompt's output. The caller sets struct_size; khub fills the rest,
 * never past struct_size. */
typedef struct khub_generate_result {
    KHUB_STRUCT_HEADER;
    char *text; /* owned; the generated text, NUL-terminated */
    size_t text_len;
    int32_t *tokens; /* owned; [n_tokens] generated ids (EOS excluded) */
    int64_t n_tokens;
    int64_t n_prompt_tokens; /* prompt length after templating and tokenizing */
    uint32_t stop_reason;    /* khub_stop_reason */
    uint32_t reserved;
    double load_ms;       /* of the model */
    double prefill_ms;    /* of the whole call's prefill (all prompts) */
    double decode_ms;     /* of the whole call's decode steps */
    double prefill_tok_s; /* prompt tokens of all prompts / prefill seconds */
    double decode_tok_s;  /* generated tokens of all prompts / decode seconds */
    /* End of 0.1. */
} khub_generate_result;

/* Generates a continuation for each of prompts[n] (n <= max_seqs of the
 * load), batched by the continuous-batching scheduler (khub_batch.h): the
 * prompts are tokenized and checked first, then prefilled in chunks beside
 * each other's decode steps.
 * results[n] are filled; free them with khub_generate_results_free, also
 * after a failure. results is the caller's array: its elements are
 * results[0].struct_size bytes apart (the caller's struct, not this
 * header's sizeof), every element has that struct_size, at least 0.1's
 * (96), and nothing past it is read or written (since 0.2; 0.1 asked for
 * the header's size and indexed by it). Statuses: TOKENIZER, CONTEXT_FULL
 * (a prompt longer than the KV capacity), INVALID_ARG, NOMEM, STRUCT_SIZE
 * (results[0] below 0.1's size, or an element of another size than
 * results[0]'s: "khub_model_generate: results[I].struct_size N differs from
 * results[0]'s M (the array's elements are one struct)"), and op failures.
 * Since 0.1. */
KHUB_API khub_status khub_model_generate(khub_model *m, const char *const *prompts, size_t n,
                                         const khub_generate_opts *opts,
                                         khub_generate_result *results);
/* Frees what khub_model_generate put in results[n] (the same array: its
 * elements results[0].struct_size bytes apart) and clears each up to its
 * struct_size; the header (struct_size and stamp) stays as the caller
 * wrote it. An array khub_model_generate refuses by size is not written. */
KHUB_API void khub_generate_results_free(khub_model *m, khub_generate_result *results, size_t n);

/* Runs ids[n] as a fresh sequence (one batched prefill) and writes the
 * logits of the last position to out[vocab]. For tests and tools.
 * Since 0.1. */
KHUB_API khub_status khub_model_logits(khub_model *m, const int32_t *ids, size_t n,
                                       float *out_last_logits);
/* Runs ids[n] as a fresh sequence, as khub_model_logits does, and writes
 * the logits of every position to out[n * vocab] (row i: the next-token
 * logits after ids[0..i]), e.g. for perplexity over a whole text in one
 * prefill. Row n - 1 is khub_model_logits' result up to the rounding of a
 * matrix product over more rows. With tp_size > 1, call it on rank 0 (the
 * other ranks run it in khub_model_tp_serve). Statuses: CONTEXT_FULL (n
 * over the KV capacity per sequence, khub_model_info.max_context), MISUSE
 * (NULL m, ids or out, or n == 0), TOKENIZER for an id outside the
 * vocabulary, and op failures. Not thread-safe with other calls on m.
 * Since 0.2 (issue 17). */
KHUB_API khub_status khub_model_logits_all(khub_model *m, const int32_t *ids, size_t n,
                                           float *out_all_logits);

#ifdef __cplusplus
}
#endif

#endif /* KHUB_MODEL_H */
