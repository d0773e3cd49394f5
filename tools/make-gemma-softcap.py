#!/usr/bin/env python3
"""Makes the Transformers reference of the tiny Gemma 3 with logit soft-capping (issue 15).

  python3 tools/make-gemma-softcap.py --fixtures tests/fixtures

Needs tools/requirements-reference.txt (torch, transformers) and the committed
tests/fixtures/gemma3_tiny folder (tools/make-gemma-tiny.py). Gemma 3 sets no caps;
Gemma 2 caps both the attention scores (attn_logit_softcapping: Gemma2Attention passes
softcap= to Transformers' eager_attention_forward, which caps after the scale, before
the mask) and the final logits (final_logit_softcapping, in the causal-LM head).
Transformers' Gemma3ForCausalLM applies the final cap but its Gemma3Attention does not
pass the attention cap on (5.24: it keeps self.attn_logit_softcapping and never uses
it), so this script registers an attention function "eager_softcap" that calls
Gemma 3's own eager_attention_forward with softcap=config.attn_logit_softcapping, as
Gemma 2 does, with the eager mask. It loads the tiny folder's weights with both caps
set, small enough that tanh bends the scores and logits, and writes

  gemma3_tiny_softcap_reference.json   {"config": {the two keys}, "cases": [...]}

with, per prompt of make-gemma-tiny.py's PROMPTS, the ids, the whole last-position
logits with and without the caps (so a test can check that the caps matter) and 24
greedy tokens with the KV cache. tests/test_gemma_tiny.c runs khub on a copy of the
folder whose config.json carries the two keys.
"""
import argparse
import importlib.util
import json
import os
import platform
import sys

SCHEMA = "khub-reference-gemma3-tiny-softcap/1"
ATTN_CAP = 1.0   # scaled scores here are a few units: the cap bends them
FINAL_CAP = 1.5  # the logits' max |x| is 1.6-2.1 uncapped
NEW_TOKENS = 24


def prompts():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("tiny", os.path.join(here, "make-gemma-tiny.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PROMPTS


def run(model, tok, text):
    import torch
    ids = tok(text, add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float().numpy()
        gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return ids, logits, [int(x) for x in gen[0, len(ids):]]


def register_softcap_attention():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward

    def eager_softcap(module, query, key, value, attention_mask, **kwargs):
        kwargs["softcap"] = module.config.attn_logit_softcapping
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("eager_softcap", eager_softcap)
    AttentionMaskInterface.register("eager_softcap", ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def make(fixtures):
    import numpy as np
    import torch
    import transformers
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    register_softcap_attention()

    folder = os.path.join(fixtures, "gemma3_tiny")
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(folder)
    plain = Gemma3ForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                              dtype=torch.float32).eval()
    capped = Gemma3ForCausalLM.from_pretrained(folder, attn_implementation="eager_softcap",
                                               dtype=torch.float32,
                                               attn_logit_softcapping=ATTN_CAP,
                                               final_logit_softcapping=FINAL_CAP).eval()
    assert capped.config.attn_logit_softcapping == ATTN_CAP
    assert capped.config.final_logit_softcapping == FINAL_CAP
    ref = {"schema": SCHEMA,
           "config": {"attn_logit_softcapping": ATTN_CAP, "final_logit_softcapping": FINAL_CAP},
           "cases": []}
    # The registered function with no cap is Transformers' eager attention.
    nocap = Gemma3ForCausalLM.from_pretrained(folder, attn_implementation="eager_softcap",
                                              dtype=torch.float32).eval()
    for name, text in prompts():
        ids, logits, greedy = run(capped, tok, text)
        _, uncapped, _ = run(plain, tok, text)
        _, same, _ = run(nocap, tok, text)
        assert np.array_equal(same, uncapped), "eager_softcap without a cap is not eager"
        head_only = FINAL_CAP * np.tanh(uncapped / FINAL_CAP)
        assert np.abs(head_only - logits).max() > 0.05, "the attention cap changed nothing"
        ref["cases"].append({"name": name, "text": text, "input_ids": ids,
                             "logits": [float(x) for x in logits],
                             "uncapped_logits": [float(x) for x in uncapped],
                             "max_abs": float(np.abs(logits).max()),
                             "greedy_ids": greedy})
    ref["provenance"] = {
        "made_by": "tools/make-gemma-softcap.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "compute": "float32, CPU, Transformers' eager_attention_forward with softcap (as "
                   "Gemma 2 calls it), on tests/fixtures/gemma3_tiny's weights"}
    path = os.path.join(fixtures, "gemma3_tiny_softcap_reference.json")
    with open(path, "w") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"make-gemma-softcap: wrote {path}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", default="tests/fixtures")
    make(ap.parse_args().fixtures)


if __name__ == "__main__":
    main()
