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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", required=True, help="path of the .gguf file")
    ap.add_argument("--out", required=True, help="output folder (replaced atomically)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = ap.parse_args()

    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as e:
        sys.exit(f"make-hf-model: cannot import {e.name}; "
                 "install tools/requirements-reference.txt with pip first")

    gguf_path = os.path.abspath(args.gguf)
    if not os.path.isfile(gguf_path):
        sys.exit(f"make-hf-model: no GGUF file at {gguf_path}; run tools/fetch-model.sh first")
    src_dir, src_name = os.path.split(gguf_path)
    digest = sha256_file(gguf_path)
    dtype = getattr(torch, args.dtype)

    out = os.path.abspath(args.out)
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)

    print(f"make-hf-model: loading {gguf_path} with transformers {transformers.__version__}",
          file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=src_name, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=src_name)
    if not getattr(tok, "chat_template", None):
        sys.exit("make-hf-model: the tokenizer read from the GGUF has no chat template; "
                 "the GGUF key tokenizer.chat_template is missing or was not mapped")

    fix_pre_tokenizer(tok, gguf_path)

    # Generation defaults of the instruct model: EOS is <|im_end|> (id 2 in this
    # vocabulary), BOS <|im_start|> (id 1), padding reuses EOS. Read from the
    # tokenizer so a different GGUF cannot silently get wrong ids.
    gen = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                           else tok.eos_token_id)
    model.generation_config = gen

    model = plain_copy(model, dtype)
    model.save_pretrained(tmp, safe_serialization=True)
    # The chat template goes into tokenizer_config.json, where readers of both
    # the v4 and v5 layouts find it (v5 would write chat_template.jinja).
    tok.save_pretrained(tmp, save_jinja_files=False)
    with open(os.path.join(tmp, ".khub-source-sha256"), "w") as f:
        f.write(digest)
    with open(os.path.join(tmp, "khub-provenance.json"), "w") as f:
        json.dump({
            "source_file": src_name,
            "source_sha256": digest,
            "dtype": args.dtype,
            "made_by": "tools/make-hf-model.py",
            "versions": {"transformers": transformers.__version__,
                         "torch": torch.__version__},
        }, f, indent=2)
        f.write("\n")

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
