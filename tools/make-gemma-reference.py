#!/usr/bin/env python3
"""Makes (or checks) the Transformers reference fixture for Gemma 3 270M (issue 15).

Generate (needs tools/requirements-reference.txt and tools/fetch-gemma.sh's GGUF):

  python3 tools/make-gemma-reference.py \\
      --gguf "$KHUB_MODEL_DIR/gemma-3-270m-q4_k_m.gguf" --out tests/fixtures

Check the committed fixture for internal consistency (standard library only):

  python3 tools/make-gemma-reference.py --check tests/fixtures

Transformers reads the GGUF itself (`from_pretrained(dir, gguf_file=...)`): the
tokenizer (converted to a tokenizers BPE with byte fallback, merges ranked by the
SentencePiece scores) and the model, dequantized to float32 (Transformers takes the
+1 that llama.cpp's converter added to every Gemma norm weight back out, and its
Gemma3RMSNorm adds it again). The model runs on the CPU in float32 with eager
attention. One JSON file, tests/fixtures/gemma3_reference.json, holds:

  tokenizer  Transformers' ids (encode with add_special_tokens=True: <bos> first)
             for the SmolLM2 corpus strings (tools/make-reference.py), the small
             tokenizer corpus (tests/fixtures/tokenizer/corpus.json) and
             Gemma-specific strings (leading spaces, byte fallback, long words,
             whitespace runs, special tokens); the decoded text of each
  chat       Gemma 3's chat template (the text google/gemma-3-*-it ship; the
             270M base GGUF carries none), rendered by Transformers' Jinja for
             a few conversations
  cases      the prompts of tools/make-reference.py (6 raw texts, 4 chats rendered
             with that template): input ids, the last-position logits at 256
             ids (the top 64 and 192 fixed ones; the whole vector is 1 MiB) with
             max|logit| over the vocabulary, and 64 greedy tokens (argmax at every
             step with the KV cache, EOS not special; unlike tools/make-reference.py
             there is no second model.generate() pass, which doubled the run time)
"""
import argparse
import hashlib
import importlib.util
import json
import os
import platform
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FILE = "gemma3_reference.json"
SCHEMA = "khub-reference-gemma3/1"
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
VOCAB = 262144
NEW_TOKENS = 64
TOP = 64
FIXED = 192

# The chat template of google/gemma-3-*-it (tokenizer_config.json), text-only parts.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n")

GEMMA_STRINGS = [
    " leading space", "  two leading spaces", "   three", "trailing space ", "a  b  c",
    "\u2581already a block", "\u2581\u2581", "tab\tand\t\ttabs", "\t\t\tindented",
    "\n", "\n\n\n\n", "x\n\n\n\n\n\ny", "    four spaces of code",
    "Supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "Donaudampfschifffahrtselektrizit\u00e4tenhauptbetriebswerkbauunterbeamtengesellschaft",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "\U0001F917\U0001F680\U0001F9EA", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
    "\U00010348 gothic", "\u0f00\u0f01 tibetan", "\ua9c1\ua9c2 javanese", "\u2603\ufe0f",
    "\u00e9\u0301 combining", "caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5", "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>double bos", "text <eos> after", "<start_of_image>", "<mask> and <pad>",
    "<unused0><unused1>", "</iframe> html-like", "[multimodal]",
    "<start_of_turn", "start_of_turn>", "<0x41> is not a byte here",
]


def load_make_reference():
    spec = importlib.util.spec_from_file_location("make_reference",
                                                  os.path.join(HERE, "make-reference.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def corpus(mr):
    out = list(mr.corpus_strings())
    with open(os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "corpus.json")) as f:
        out += json.load(f)["strings"]
    out += GEMMA_STRINGS
    seen, unique = set(), []
    for s in out:
        if s not in seen and "\x00" not in s:
            seen.add(s)
            unique.append(s)
    return unique


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_case(torch, model, tok, case, fixed_ids):
    if case["kind"] == "chat":
        text = tok.apply_chat_template(case["messages"], chat_template=GEMMA3_TEMPLATE,
                                       tokenize=False, add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)  # the template has <bos>
    else:
        text = case["text"]
        ids = tok.encode(text, add_special_tokens=True)
    eos = tok.eos_token_id
    input_ids = torch.tensor([ids], dtype=torch.long)
    with torch.inference_mode():
        out = model(input_ids=input_ids, use_cache=True)
        last = out.logits[0, -1].to(torch.float32).contiguous()
        cache, step, greedy, margins = out.past_key_values, last, [], []
        for _ in range(NEW_TOKENS):
            nxt = int(torch.argmax(step))
            top2 = torch.topk(step, 2).values
            greedy.append(nxt)
            margins.append(float(top2[0] - top2[1]))
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
            cache, step = out.past_key_values, out.logits[0, -1].to(torch.float32)
    first_eos = greedy.index(eos) if eos in greedy else None
    top = torch.topk(last, TOP)
    at = [int(i) for i in top.indices] + fixed_ids
    return {
        "name": case["name"], "kind": case["kind"], "prompt_text": text,
        "n_input": len(ids), "input_ids": ids,
        "argmax": int(torch.argmax(last)), "max_abs": float(last.abs().max()),
        "logits_sha256": hashlib.sha256(last.numpy().astype("<f4").tobytes()).hexdigest(),
        "logit_ids": at, "logits": [float(last[i]) for i in at],
        "greedy_ids": greedy, "greedy_text": tok.decode(greedy, skip_special_tokens=False),
        "greedy_margins": [round(m, 5) for m in margins], "first_eos": first_eos,
    }


def make(args):
    import tokenizers
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    gguf = os.path.abspath(args.gguf)
    if sha256_file(gguf) != GGUF_SHA256:
        sys.exit(f"make-gemma-reference: {gguf} is not the pinned file (tools/fetch-gemma.sh)")
    d, f = os.path.dirname(gguf), os.path.basename(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    mr = load_make_reference()
    versions = {"python": platform.python_version(), "transformers": transformers.__version__,
                "torch": torch.__version__, "tokenizers": tokenizers.__version__}
    strings = corpus(mr)
    cases = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=True)
        dec = tok.decode(ids[1:], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        cases.append({"text": s, "ids": ids, "decoded": dec})
    chats = {}
    for p in mr.PROMPTS:
        if p["kind"] == "chat":
            chats[p["name"]] = {"messages": p["messages"], "text": tok.apply_chat_template(
                p["messages"], chat_template=GEMMA3_TEMPLATE, tokenize=False,
                add_generation_prompt=True)}
    print(f"make-gemma-reference: {len(cases)} corpus strings", file=sys.stderr)
    model_cases = []
    if args.only != "tokenizer":
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        rng = random.Random(15)
        fixed = sorted(rng.sample(range(VOCAB), FIXED))
        for p in mr.PROMPTS:
            c = run_case(torch, model, tok, p, fixed)
            model_cases.append(c)
            write(args, tok, chats, cases, model_cases, versions)
            print(f"make-gemma-reference: {c['name']:20s} {c['n_input']:4d} tokens, argmax "
                  f"{c['argmax']}, min margin {min(c['greedy_margins']):.4g}", file=sys.stderr)
    write(args, tok, chats, cases, model_cases, versions)


def write(args, tok, chats, cases, model_cases, versions):
    """Writes the fixture (again after each prompt, so a long run keeps its progress)."""
    out = {
        "schema": SCHEMA,
        "model": {"gguf_file": GGUF_NAME, "gguf_sha256": GGUF_SHA256},
        "generator": {
            "command": "python3 tools/make-gemma-reference.py --gguf "
                       f"~/.cache/khub/models/{GGUF_NAME} --out tests/fixtures"
                       + (f" --only {args.only}" if args.only != "all" else ""),
            "versions": versions, "device": "cpu", "dtype": "float32",
            "attn_implementation": "eager", "torch_threads": args.threads,
            "encode": "tokenizer.encode(text, add_special_tokens=True)",
            "decode": "tokenizer.decode(ids[1:], skip_special_tokens=False, "
                      "clean_up_tokenization_spaces=False)",
        },
        "logits": {"count": VOCAB, "stored": f"top {TOP} ids then {FIXED} fixed ids",
                   "compare": "max|a-b| over logit_ids / max_abs <= 1e-3"},
        "greedy": {"new_tokens": NEW_TOKENS, "eos_id": tok.eos_token_id,
                   "rule": "argmax at every step, EOS not special"},
        "chat_template": GEMMA3_TEMPLATE,
        "chats": chats,
        "tokenizer": cases,
        "cases": model_cases,
    }
    path = os.path.join(args.out, FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(out, fh, ensure_ascii=False, indent=0, separators=(",", ":"))
        fh.write("\n")
    os.replace(path + ".tmp", path)


def check(folder):
    with open(os.path.join(folder, FILE), encoding="utf-8") as fh:
        j = json.load(fh)
    errors = []
    if j.get("schema") != SCHEMA:
        errors.append("schema")
    for c in j["tokenizer"]:
        if not c["ids"] or c["ids"][0] != 2 or not all(0 <= i < VOCAB for i in c["ids"]):
            errors.append(f"tokenizer {c['text'][:20]!r}: ids")
    for c in j["cases"]:
        if len(c["logit_ids"]) != TOP + FIXED or len(c["logits"]) != TOP + FIXED:
            errors.append(f"{c['name']}: logits")
        if c["logit_ids"][0] != c["argmax"] or len(c["greedy_ids"]) != NEW_TOKENS:
            errors.append(f"{c['name']}: argmax or greedy")
    for e in errors:
        print(f"make-gemma-reference: {e}", file=sys.stderr)
    print(f"make-gemma-reference: {len(j['tokenizer'])} strings, {len(j['cases'])} prompts, "
          f"{len(errors)} errors", file=sys.stderr)
    return 1 if errors else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="gemma-3-270m-q4_k_m.gguf (tools/fetch-gemma.sh)")
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["all", "tokenizer"], default="all")
    ap.add_argument("--check", metavar="DIR")
    args = ap.parse_args()
    if args.check:
        sys.exit(check(args.check))
    if not args.gguf:
        ap.error("--gguf is required")
    make(args)


if __name__ == "__main__":
    main()
