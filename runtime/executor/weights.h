/*
 * weights.h: weight tensors of a loaded model (runtime/executor/weights.c).
 *
 * A khub__weight is a khub_tensor describing bytes that stay where they are:
 * in the mmapped GGUF or safetensors file (zero copy), or, when the executor
 * had to make them (quantize-at-load, an f32 copy of a small norm vector, a
 * dense copy for a dtype no linear plugin serves), in a block the weight
 * owns. Matrices are [out, in] in PyTorch order whatever the file's order
 * (GGUF's ne[] is reversed), so linear ops see the same tensor from both.
 *
 * RoPE and the GGUF Q/K permutation: llama GGUFs store the Q and K rows
 * permuted for adjacent-pair RoPE (gguf.h has the formula). khub does not
 * un-permute them: it runs the rotary op in KHUB_ROPE_INTERLEAVED for such
 * files (khub_model_config.rope_style), which yields the same attention
 * scores because Q and K are permuted alike within each head, and the
 * attention output (from V, never permuted) is unchanged. This keeps the
 * weights zero-copy. The trade-off: q and k activations differ from
 * Transformers' by that permutation, so tests compare logits, not q/k.
 */
#ifndef KHUB_RUNTIME_WEIGHTS_H
#define KHUB_RUNTIME_WEIGHTS_H

#include "internal.h"

typedef struct khub__weight {
    khub_tensor t;    /* t.shape points at shape; t.strides NULL (compact) */
    int64_t shape[2]; /* [out, in] for matrices, [n] for vectors */
    void *owned;      /* khub__aligned_alloc block holding the data, or NULL (mapped) */
    size_t owned_bytes;
    const char *name; /* borrowed from the file's tensor table: for messages */
    uint64_t dptr;    /* its copy in device memory (placement.c), 0 = none */
} khub__weight;

/* A source tensor as the file describes it, in PyTorch order (outermost
 * first). */
typedef struct khub__wsrc {
    const char *name; /* borrowed */
    khub_dtype dtype;
    int32_t ndim; /* 1 or 2 */
    int64_t shape[2];
    const void *data; /* borrowed (mapping) */
    size_t nbytes;
} khub__wsrc;

/* Bytes of n_rows x n_cols of dtype (block formats by row); false when the
 * row is not a whole number of blocks or the size overflows. */
KHUB_INTERNAL bool khub__dtype_bytes(khub_dtype dt, int64_t n_rows, int64_t n_cols, size_t *out);

/* Makes w a zero-copy view of src after checking that its shape is exactly
 * want[0..ndim) and that nbytes matches: MODEL_INVALID "<file>: tensor 'x'
 * has shape [a, b], expected [c, d]". Elements of 2 or 4 bytes that are not
 * naturally aligned in the file are copied (safetensors does not promise
 * alignment). */
KHUB_INTERNAL khub_status khub__weight_view(khub_runtime *rt, const char *file, khub__weight *w,
                                            const khub__wsrc *src, int32_t ndim,
                                            const int64_t want[2]);
/* Replaces w's data with an f32 copy (F16/BF16 converted; F32 kept as is). */
KHUB_INTERNAL khub_status khub__weight_to_f32(khub_runtime *rt, khub__weight *w);
/* Frees what w owns and zeroes it. */
KHUB_INTERNAL void khub__weight_free(khub_runtime *rt, khub__weight *w);

/* Copies rows ids[0..n) of the embedding matrix w ([vocab, dim]) into
 * out[n, dim] as f32. Dense dtypes are converted here; block formats are
 * dequantized by `deq` (a qlinear plugin's dequantize method with its
 * state) one row at a time. Ids outside [0, vocab) are INVALID_ARG. */
typedef khub_status (*khub__dequant_fn)(void *state, const khub_quant_args *a);
KHUB_INTERNAL khub_status khub__weight_rows(khub_runtime *rt, const khub__weight *w,
                                            const int32_t *ids, int64_t n, float *out,
                                            khub__dequant_fn deq, void *deq_state);

/* "f32", "f16", "bf16", "q4_1", ...: the dtype's short name for messages and
 * role tables; "?" when unknown. */
KHUB_INTERNAL const char *khub__dtype_short(khub_dtype dt);

#endif /* KHUB_RUNTIME_WEIGHTS_H */
