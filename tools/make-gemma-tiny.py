#!/usr/bin/env python3
"""Makes the tiny Gemma 3 Hugging Face folder and its Transformers reference (issue 15).

  python3 tools/make-gemma-tiny.py --out tests/fixtures

Needs tools/requirements-reference.txt (torch, transformers, tokenizers). Writes:

  gemma3_tiny/               a Gemma3ForCausalLM folder as save_pretrained writes it
                             (config.json, generation_config.json, model.safetensors in
                             float32 (values that bfloat16 holds exactly), tokenizer.json,
                             tokenizer_config.json)
  gemma3_tiny_reference.json Transformers' float32 results on those weights

The model is random (seed 0) and small enough to commit, but it has every Gemma 3
knob set away from the Llama defaults so that a wrong one shows in the logits:
head_dim 256 with 2 query heads and 1 KV head, query_pre_attn_scalar 64 (not
head_dim), six layers in the 5 sliding : 1 global pattern with a 4-token window,
rope_local_base_freq 10000 against rope_theta 1e6, GELU-tanh, tied embeddings,
and norm weights drawn away from zero (Gemma scales by 1 + w).

The tokenizer is SentencePiece-style BPE as Gemma's tokenizer.json has it
(normalizer Replace " " -> "\u2581", no pre-tokenizer, BPE with byte_fallback and
the 256 <0xXX> pieces, decoder Replace + ByteFallback + Fuse, <bos> added by the
post-processor), trained with the tokenizers library on a few sentences.

The reference holds, for each string of TOKENIZER_STRINGS, Transformers' ids and
decoded text; for each prompt of PROMPTS, the ids, the whole last-position logits
(the vocabulary is small) and 24 greedy tokens with the KV cache.
"""
import argparse
import json
import os
import platform
import shutil
import sys

SCHEMA = "khub-reference-gemma3-tiny/1"
SEED = 0
NEW_TOKENS = 24
VOCAB_TARGET = 640

TRAIN = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Gemma is a family of lightweight open models built from the same research.",
    "A tokenizer splits text into pieces; each piece has an id in the vocabulary.",
    "Sliding window attention looks at the last few tokens, global layers see all.",
    "def add(a, b):\n    return a + b\n",
    "Numbers like 12345 and 3.14159 appear in text, as do dates: 2025-08-14.",
    "the quick brown fox jumps over the lazy dog " * 3,
]

TOKENIZER_STRINGS = [
    "Hello world",
    " leading space",
    "  two leading spaces and trailing  ",
    "tabs\tand\nnewlines\n\n",
    "The capital of France is Paris.",
    "caf\u00e9 na\u00efve \u00fcber",          # characters the small vocab lacks: byte fallback
    "\u65e5\u672c\u8a9e\u306e\u6587",          # CJK: all byte fallback
    "emoji \U0001F600!",
    "supercalifragilisticexpialidocious",
    "<start_of_turn>user\nHi<end_of_turn>\n",  # added tokens in the text
    "",
]

PROMPTS = [
    ("raw_short", "The capital of France is"),
    ("raw_window", "Paris is the capital of France; Rome is the capital of Italy, and "
                   "the lazy dog sleeps while the brown fox jumps."),
    ("raw_bytes", "caf\u00e9 \u65e5\u672c"),
    ("chat", "<start_of_turn>user\nWhat is Gemma?<end_of_turn>\n<start_of_turn>model\n"),
]


def build_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    from tokenizers.trainers import BpeTrainer

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    t.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = BpeTrainer(vocab_size=VOCAB_TARGET, special_tokens=specials + bytes_,
                         show_progress=False)
    t.train_from_iterator(TRAIN, trainer)
    # The byte pieces are ordinary vocabulary in Gemma's file, not added tokens.
    spec = json.loads(t.to_str())
    spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] in specials]
    t = Tokenizer.from_str(json.dumps(spec))
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                   decoders.Fuse()])
    t.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                     special_tokens=[("<bos>", 2)])
    return t


def make(out):
    import numpy as np
    import torch
    import transformers
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

    torch.manual_seed(SEED)
    raw = build_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", eos_token="<eos>",
                                  pad_token="<pad>", unk_token="<unk>")
    tok.add_bos_token = True
    cfg = Gemma3TextConfig(
        vocab_size=raw.get_vocab_size(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
        query_pre_attn_scalar=64, sliding_window=4, max_position_embeddings=256,
        rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", bos_token_id=2, eos_token_id=[1, 6],
        pad_token_id=0, tie_word_embeddings=True, initializer_range=0.1,
        attn_implementation="eager")
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # zeros at init: draw them so (1 + w) matters
                p.copy_(torch.randn_like(p) * 0.3)
            # bfloat16-representable values: a bf16 copy of the folder is exact
            p.copy_(p.to(torch.bfloat16).to(torch.float32))

    folder = os.path.join(out, "gemma3_tiny")
    tmp = folder + f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp, save_jinja_files=False)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)

    ref = {"schema": SCHEMA, "tokenizer": [], "cases": []}
    for s in TOKENIZER_STRINGS:
        ids = tok(s, add_special_tokens=True)["input_ids"]
        ref["tokenizer"].append({"text": s, "ids": ids,
                                 "decoded": tok.decode(ids[1:], skip_special_tokens=False)})
    torch.set_num_threads(2)
    for name, text in PROMPTS:
        ids = tok(text, add_special_tokens=True)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float().numpy()
            gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
        ref["cases"].append({"name": name, "text": text, "input_ids": ids,
                             "logits": [float(x) for x in logits],
                             "max_abs": float(np.abs(logits).max()),
                             "argmax": int(logits.argmax()),
                             "greedy_ids": [int(x) for x in gen[0, len(ids):]]})
    ref["provenance"] = {
        "made_by": "tools/make-gemma-tiny.py", "seed": SEED,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "compute": "float32, eager attention, CPU, on the float32 weights of the folder"}
    path = os.path.join(out, "gemma3_tiny_reference.json")
    with open(path, "w") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"make-gemma-tiny: wrote {folder} and {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures")
    make(ap.parse_args().out)


if __name__ == "__main__":
    main()
