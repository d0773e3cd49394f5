#!/usr/bin/env python3
"""Builds the Transformers-format copy of the test model from its GGUF file.

Transformers reads the GGUF itself (from_pretrained(..., gguf_file=...)): it
dequantizes every tensor with the gguf package, undoes llama.cpp's Q/K row
permutation, and maps names to the Hugging Face layout. This script then saves
that model with save_pretrained (model.safetensors + config.json +
generation_config.json) and the tokenizer the same way (tokenizer.json,
tokenizer_config.json with the chat template, special_tokens_map.json).

The weights are the dequantized Q4_1/Q8_0 values, stored as float32 by default,
so the safetensors path and the GGUF path of khub compute with identical numbers.

Usage:
  python3 tools/make-hf-model.py --gguf MODEL.gguf --out DIR [--dtype float32]

Writes into DIR.tmp-<pid> and renames it to DIR at the end, so DIR is either
absent, the previous copy, or complete. Needs tools/requirements-reference.txt.
"""
import argparse
import copy
import hashlib
import json
import os
import shutil
import sys


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_string(path, key):
    from gguf import GGUFReader

    field = GGUFReader(path).fields.get(key)
    return field.contents() if field is not None else None


def fix_pre_tokenizer(tok, gguf_path):
    """Gives the tokenizer the pre-tokenizer its merges were learned with.

    The GGUF names it in tokenizer.ggml.pre. For "smollm", llama.cpp splits every
    digit on its own (regex \\p{N}) before the GPT-2 byte-level regex, as the
    original SmolLM2 tokenizer.json does with Digits(individual_digits=True).
    Transformers 5.24 maps several pre-tokenizer names but not "smollm", and falls
    back to plain byte-level splitting, which tokenizes whitespace runs before a
    digit differently ("\\n\\n1" gives two tokens instead of one). The fixtures
    must describe the model, so the split is restored here, and said so in
    docs/reference-fixtures.md.
    """
    from tokenizers import pre_tokenizers

    pre = gguf_string(gguf_path, "tokenizer.ggml.pre")
    if pre != "smollm":
        return
    current = tok.backend_tokenizer.pre_tokenizer
    if current is not None and "Digits" in repr(current):
        return
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    print("make-hf-model: tokenizer.ggml.pre is smollm: pre-tokenizer set to "
          "Digits(individual) + ByteLevel", file=sys.stderr)


def plain_copy(model, dtype):
    """The same weights in a model that carries no GGUF quantizer.

    Transformers attaches a GGUF "quantizer" to a model read from a GGUF and
    refuses to save it, although every tensor is already a dequantized torch
    tensor. Rebuilding the model from its config minus quantization_config and
    loading the state dict strictly gives a plain model with identical values.
    """
    from transformers import AutoModelForCausalLM
    import torch

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = model.state_dict()
    plain.load_state_dict(state, strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    for name, t in plain.state_dict().items():
        if not torch.equal(t, state[name]):
            sys.exit(f"make-hf-model: tensor {name} changed while copying; refusing to save")
    return plain


# --------------------------------------------------------------------------
# Light backend: gguf + numpy + safetensors + tokenizers, no torch
# --------------------------------------------------------------------------

# GGUF tensor name -> Hugging Face name for the Llama architecture.
LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LLAMA_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def hf_name(name):
    if name in LLAMA_NAMES:
        return LLAMA_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LLAMA_BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{LLAMA_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    sys.exit(f"make-hf-model: tensor {name} has no Llama mapping; the light backend "
             "handles Llama GGUFs only (use the default transformers backend)")


def unpermute_qk(w, n_head):
    """Undoes llama.cpp's Q/K row permutation (adjacent-pair RoPE back to halves),
    the same reshape Transformers' GGUF loader applies."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def build_light(gguf_path, tmp, dtype_name):
    """Writes the HF folder from the GGUF with the gguf package's dequantizer."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import save_file
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = GGUFReader(gguf_path)
    kv = {k: f.contents() for k, f in r.fields.items()
          if k not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                       "tokenizer.ggml.token_type")}
    if kv.get("general.architecture") != "llama":
        sys.exit(f"make-hf-model: architecture {kv.get('general.architecture')!r}; the light "
                 "backend handles llama only")
    n_head = int(kv["llama.attention.head_count"])
    n_kv = int(kv.get("llama.attention.head_count_kv", n_head))
    np_dtype = {"float32": np.float32, "float16": np.float16}.get(dtype_name)
    if np_dtype is None:
        sys.exit(f"make-hf-model: the light backend cannot write {dtype_name}")

    tensors = {}
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape)]   # GGUF lists dims innermost first
        w = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if t.name.endswith("attn_q.weight"):
            w = unpermute_qk(w, n_head)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_qk(w, n_kv)
        tensors[hf_name(t.name)] = np.ascontiguousarray(w.astype(np_dtype))
    tied = "lm_head.weight" not in tensors
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})

    vocab = int(kv.get("llama.vocab_size", len(r.fields["tokenizer.ggml.tokens"].data)))
    head_dim = int(kv.get("llama.attention.key_length",
                          int(kv["llama.embedding_length"]) // n_head))
    bos, eos = int(kv["tokenizer.ggml.bos_token_id"]), int(kv["tokenizer.ggml.eos_token_id"])
    pad = int(kv.get("tokenizer.ggml.padding_token_id", eos))
    unk = kv.get("tokenizer.ggml.unknown_token_id")
    config = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": bos, "dtype": dtype_name,
        "eos_token_id": eos, "head_dim": head_dim, "hidden_act": "silu",
        "hidden_size": int(kv["llama.embedding_length"]), "initializer_range": 0.02,
        "intermediate_size": int(kv["llama.feed_forward_length"]),
        "max_position_embeddings": int(kv["llama.context_length"]), "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": n_head,
        "num_hidden_layers": int(kv["llama.block_count"]), "num_key_value_heads": n_kv,
        "pad_token_id": pad, "pretraining_tp": 1,
        "rms_norm_eps": float(kv["llama.attention.layer_norm_rms_epsilon"]),
        "rope_parameters": {"rope_theta": float(kv.get("llama.rope.freq_base", 10000.0)),
                            "rope_type": "default"},
        "tie_word_embeddings": tied, "use_cache": True, "vocab_size": vocab,
    }
    if unk is not None:
        config["unk_token_id"] = int(unk)
    write_json(os.path.join(tmp, "config.json"), config)
    write_json(os.path.join(tmp, "generation_config.json"),
               {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad})

    if kv.get("tokenizer.ggml.model") != "gpt2":
        sys.exit("make-hf-model: the light backend builds byte-level BPE (gpt2) tokenizers only")
    tokens = [str(bytes(r.fields["tokenizer.ggml.tokens"].parts[i]), "utf-8")
              for i in r.fields["tokenizer.ggml.tokens"].data]
    merges = [tuple(str(bytes(r.fields["tokenizer.ggml.merges"].parts[i]), "utf-8").split(" ", 1))
              for i in r.fields["tokenizer.ggml.merges"].data]
    types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in r.fields["tokenizer.ggml.token_type"].data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               fuse_unk=False, byte_fallback=False))
    if kv.get("tokenizer.ggml.pre") == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # token_type 3 is CONTROL in llama.cpp's vocabulary: those are the special tokens.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    tok.save(os.path.join(tmp, "tokenizer.json"))
    name = lambda i: tokens[int(i)] if i is not None else None  # noqa: E731
    write_json(os.path.join(tmp, "tokenizer_config.json"), {
        "add_bos_token": bool(kv.get("tokenizer.ggml.add_bos_token", False)),
        "bos_token": name(bos), "eos_token": name(eos), "pad_token": name(pad),
        "unk_token": name(unk), "chat_template": kv.get("tokenizer.chat_template"),
        "model_max_length": int(kv["llama.context_length"]),
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
    import gguf
    import safetensors
    import tokenizers
    from importlib.metadata import version
    return {"gguf": version("gguf"), "safetensors": safetensors.__version__,
            "tokenizers": tokenizers.__version__, "numpy": np.__version__}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def build_transformers(gguf_path, tmp, dtype_name):
    """Writes the HF folder with Transformers' own GGUF loader (the reference)."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as e:
        sys.exit(f"make-hf-model: cannot import {e.name}; install "
                 "tools/requirements-reference.txt with pip first, or use --backend light")
    src_dir, src_name = os.path.split(gguf_path)
    dtype = getattr(torch, dtype_name)
    print(f"make-hf-model: loading {gguf_path} with transformers {transformers.__version__}",
          file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=src_name, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=src_name)
    arch = gguf_string(gguf_path, "general.architecture")
    if not getattr(tok, "chat_template", None) and arch != "gemma3":
        # (a Gemma 3 base GGUF has none; khub then uses Gemma 3's own template)
        sys.exit("make-hf-model: the tokenizer read from the GGUF has no chat template; "
                 "the GGUF key tokenizer.chat_template is missing or was not mapped")
    fix_pre_tokenizer(tok, gguf_path)

    # Generation defaults of the instruct model: EOS is <|im_end|> (id 2 in this
    # vocabulary), BOS <|im_start|> (id 1), padding reuses EOS. Read from the
    # tokenizer so a different GGUF cannot silently get wrong ids.
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    model = plain_copy(model, dtype)
    model.save_pretrained(tmp, safe_serialization=True)
    # The chat template goes into tokenizer_config.json, where readers of both
    # the v4 and v5 layouts find it (v5 would write chat_template.jinja).
    tok.save_pretrained(tmp, save_jinja_files=False)
    return {"transformers": transformers.__version__, "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True, help="path of the .gguf file")
    ap.add_argument("--out", required=True, help="output folder (replaced atomically)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--backend", default="transformers", choices=["transformers", "light"],
                    help="transformers (the reference; needs torch) or light (gguf, numpy, "
                         "safetensors, tokenizers: same tensors, for machines without torch)")
    args = ap.parse_args()

    gguf_path = os.path.abspath(args.gguf)
    if not os.path.isfile(gguf_path):
        sys.exit(f"make-hf-model: no GGUF file at {gguf_path}; run tools/fetch-model.sh first")
    digest = sha256_file(gguf_path)
    out = os.path.abspath(args.out)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    if args.backend == "light":
        versions = build_light(gguf_path, tmp, args.dtype)
    else:
        versions = build_transformers(gguf_path, tmp, args.dtype)
    with open(os.path.join(tmp, ".khub-source-sha256"), "w") as f:
        f.write(digest)
    write_json(os.path.join(tmp, "khub-provenance.json"), {
        "source_file": os.path.basename(gguf_path),
        "source_sha256": digest,
        "dtype": args.dtype,
        "made_by": f"tools/make-hf-model.py --backend {args.backend}",
        "versions": versions,
    })

    if os.path.isdir(out):
        old = f"{out}.old-{os.getpid()}"
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)

    total = 0
    for name in sorted(os.listdir(out)):
        size = os.path.getsize(os.path.join(out, name))
        total += size
        print(f"make-hf-model: {name:28s} {size:>12d} bytes", file=sys.stderr)
    print(f"make-hf-model: wrote {out} ({total} bytes)", file=sys.stderr)
    print(out)


if __name__ == "__main__":
    main()
