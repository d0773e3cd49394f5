#!/usr/bin/env python3
"""Writes a tiny random Llama model as a Hugging Face folder, for tests that
need a whole model (weights, config, tokenizer) in milliseconds: the install
test (tests/t_install.sh) and the Python binding's tests (python/tests).

    python3 tools/make-tiny-model.py DIR

DIR gets config.json (LlamaForCausalLM: 2 layers, hidden 64, 4 heads of 16,
2 KV heads, ffn 128, vocab 704), model.safetensors (float32, a fixed
xorshift stream scaled like tests/test_model.c's tiny models, norms near 1)
and the byte-level BPE tokenizer of tests/fixtures/tokenizer/smollm
(tokenizer.json with 701 ids, tokenizer_config.json with SmolLM2's chat
template). Standard library only; the same bytes on every run.
"""
import json
import os
import shutil
import struct
import sys

HIDDEN, FFN, LAYERS, HEADS, KV, HD, VOCAB = 64, 128, 2, 4, 2, 16, 704
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(SRC, "tests", "fixtures", "tokenizer", "smollm")


def tensors():
    """(name, shape) of every tensor, in file order."""
    t = [("model.embed_tokens.weight", (VOCAB, HIDDEN)), ("model.norm.weight", (HIDDEN,))]
    for layer in range(LAYERS):
        p = "model.layers.%d." % layer
        t += [
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
            (p + "self_attn.q_proj.weight", (HEADS * HD, HIDDEN)),
            (p + "self_attn.k_proj.weight", (KV * HD, HIDDEN)),
            (p + "self_attn.v_proj.weight", (KV * HD, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HD)),
            (p + "mlp.gate_proj.weight", (FFN, HIDDEN)),
            (p + "mlp.up_proj.weight", (FFN, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, FFN)),
        ]
    return t


class XorShift:
    """tests/test_model.c's frand(): uniform in [-1, 1)."""

    def __init__(self):
        self.s = 88172645463325252

    def next(self):
        m = (1 << 64) - 1
        self.s ^= (self.s << 13) & m
        self.s ^= self.s >> 7
        self.s ^= (self.s << 17) & m
        return (self.s >> 40) / float(1 << 24) * 2.0 - 1.0


def write_safetensors(path):
    rng = XorShift()
    header, blobs, off = {}, [], 0
    for name, shape in tensors():
        count = shape[0] * (shape[1] if len(shape) > 1 else 1)
        vec = len(shape) == 1
        scale = 0.1 if vec else 1.0 / shape[1] ** 0.5
        bias = 1.0 if vec and "norm" in name else 0.0
        data = struct.pack("<%df" % count, *(rng.next() * scale + bias for _ in range(count)))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make-tiny-model.py DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
        "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 512, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "torch_dtype": "float32",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_safetensors(os.path.join(out, "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(TOKENIZER, name), os.path.join(out, name))


if __name__ == "__main__":
    main()
