#!/usr/bin/env python3
"""Writes the golden model files khub's parsers are checked against, with the
upstream writers (safetensors + torch, llama.cpp's gguf-py). Values are fixed
(no randomness); rerun only when the expectations in the tests change:

    python3 tests/golden/make_golden.py          # from the repository root
    python3 tests/golden/make_golden.py kquants  # only kquants.gguf (numpy + gguf)

small.safetensors: 4 tensors (F32, BF16, F16, I64) + __metadata__ {"format": "pt"}.
tiny_llama.gguf:   a 2-layer llama-architecture GGUF (hidden 64, 4 heads, 2 kv
                   heads, ffn 128, vocab 32) with F32, Q8_0 and Q4_1 tensors.
kquants.gguf:      block-quantized tensors and gguf-py's own dequantization of
                   each (gguf.quants.dequantize, the code Transformers calls):
                   "<type>" is [3, 512] of that type, "<type>.f32" its values.
                   Q4_K and Q6_K blocks are random bytes with finite scales
                   (gguf-py cannot quantize to them); Q4_0, Q4_1, Q5_0, Q5_1
                   and Q8_0 are gguf-py's quantization of random normals.
"""
import sys
import os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def write_safetensors():
    import torch
    from safetensors.torch import save_file
    tensors = {
        "model.layers.0.w": torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1.0,
        "model.norm.weight": torch.tensor([1.0, 0.5, 0.25, -2.0], dtype=torch.bfloat16),
        "h": torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float16),
        "pos": torch.tensor([7, 9], dtype=torch.int64),
    }
    save_file(tensors, os.path.join(HERE, "small.safetensors"), metadata={"format": "pt"})


def write_gguf():
    import gguf
    hidden, heads, kv, ffn, vocab, layers = 64, 4, 2, 128, 32, 2
    w = gguf.GGUFWriter(os.path.join(HERE, "tiny_llama.gguf"), "llama")
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + ["t%d" % i for i in range(vocab - 3)])
    w.add_token_scores([float(-i) for i in range(vocab)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    x = np.linspace(-1, 1, vocab * hidden, dtype=np.float32).reshape(vocab, hidden)
    w.add_tensor("token_embd.weight", x)
    for i in range(layers):
        q = np.linspace(-2, 2, hidden * hidden, dtype=np.float32).reshape(hidden, hidden)
        w.add_tensor("blk.%d.attn_q.weight" % i,
                     gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        k = np.linspace(-1, 3, hidden * hidden // 2, dtype=np.float32).reshape(hidden // 2, hidden)
        w.add_tensor("blk.%d.attn_k.weight" % i,
                     gguf.quants.quantize(k, gguf.GGMLQuantizationType.Q4_1),
                     raw_dtype=gguf.GGMLQuantizationType.Q4_1)
        w.add_tensor("blk.%d.attn_norm.weight" % i, np.ones(hidden, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_kquant_blocks(rng, qtype, n_blocks):
    """Random bytes in the block layout, with the f16 scales set finite."""
    import gguf
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    def f16(col, lo, hi):
        v = rng.uniform(lo, hi, size=n_blocks).astype(np.float16)
        b[:, col:col + 2] = v.view(np.uint8).reshape(n_blocks, 2)
    if qtype == gguf.GGMLQuantizationType.Q4_K:
        f16(0, 0.001, 0.05)   # d
        f16(2, -0.05, 0.05)   # dmin
    else:                     # Q6_K: d last
        f16(208, -0.02, 0.02)
    return b


def write_kquants():
    import gguf
    from gguf import GGMLQuantizationType as T
    rng = np.random.default_rng(20261203)
    rows, cols = 3, 512
    w = gguf.GGUFWriter(os.path.join(HERE, "kquants.gguf"), "llama")
    for qtype in (T.Q4_K, T.Q6_K, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        name = qtype.name.lower()
        if qtype in (T.Q4_K, T.Q6_K):
            q = random_kquant_blocks(rng, qtype, rows * cols // 256).reshape(rows, -1)
        else:
            q = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
        y = gguf.quants.dequantize(q, qtype).astype(np.float32)
        assert y.shape == (rows, cols) and np.isfinite(y).all()
        w.add_tensor(name, q, raw_dtype=qtype)
        w.add_tensor(name + ".f32", y)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["kquants"]:
        write_kquants()
    else:
        write_safetensors()
        write_gguf()
        write_kquants()
