#!/usr/bin/env python3
"""Makes (or checks) the Transformers reference fixtures for SmolLM2-135M-Instruct.

Generate (needs tools/requirements-reference.txt and the HF copy made by
`tools/fetch-model.sh --hf`):

  python3 tools/make-reference.py --hf-dir "$KHUB_MODEL_DIR/SmolLM2-135M-Instruct-hf" \\
      --gguf "$KHUB_MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf" --out tests/fixtures

Check the committed fixtures for internal consistency (standard library only):

  python3 tools/make-reference.py --check tests/fixtures

What is computed, and the JSON schemas, are in docs/reference-fixtures.md. In short:
Transformers runs the dequantized model on the CPU in float32 with eager attention;
for each prompt it stores the input ids, the last-position logits of the prompt
(little-endian float32, one .bin per prompt) and 64 greedy tokens (pure argmax at
every step, EOS not special; where EOS first appears is recorded). A tokenizer
corpus stores Transformers' ids and decoded text for several hundred strings.
"""
import argparse
import hashlib
import json
import os
import platform
import struct
import sys

GREEDY_FILE = "smollm2_greedy.json"
CORPUS_FILE = "smollm2_tokenizer_corpus.json"
LOGITS_DIR = "smollm2_logits"
GREEDY_SCHEMA = "khub-reference-greedy/1"
CORPUS_SCHEMA = "khub-reference-tokenizer/1"
NEW_TOKENS = 64
VOCAB = 49152

# --------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------

LONG_TEXT = (
    "Lighthouses were once the most important machines on any rocky coast. Before radio "
    "beacons and satellite positioning, a ship approaching land at night had little more "
    "than a chart, a compass and the hope of seeing a light in time. The earliest towers "
    "burned wood or coal in open fires, which were smoky, dim and hard to keep alight in a "
    "storm. Oil lamps with polished reflectors came next, and in the early nineteenth "
    "century the Fresnel lens changed everything: rings of glass prisms bent the light of a "
    "single flame into a narrow beam that could be seen more than twenty miles away. Each "
    "station was given its own pattern of flashes so that sailors could tell one headland "
    "from another. Keepers lived at the stations with their families, trimming wicks, "
    "winding the clockwork that turned the lens, and writing the weather into a log every "
    "few hours. Today almost every light is automatic, but many of the old towers still "
    "stand, and some of them still"
)

SUMMARY_TEXT = (
    "The committee met on Tuesday to review the budget for the new library. Members agreed "
    "that the reading room needs better lighting and more power outlets, since most "
    "visitors now bring laptops. The children's section will move to the ground floor so "
    "that families with strollers can reach it without the lift. There was a long debate "
    "about opening hours: some members wanted the library open until ten at night, while "
    "others worried about the cost of extra staff. In the end they chose to stay open until "
    "eight on weekdays and to review the decision after six months. The next meeting is "
    "planned for the first week of March."
)

PROMPTS = [
    {"name": "text_one_token", "kind": "text", "text": "Hello"},
    {"name": "text_capital", "kind": "text", "text": "The capital of France is"},
    {"name": "text_numbers", "kind": "text", "text": "1, 1, 2, 3, 5, 8, 13, 21,"},
    {"name": "text_code", "kind": "text",
     "text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"},
    {"name": "text_multilingual", "kind": "text",
     "text": "Bonjour! 今日は良い天気ですね。 Привет, как дела? The word for water is"},
    {"name": "text_long", "kind": "text", "text": LONG_TEXT},
    {"name": "chat_capital", "kind": "chat",
     "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"name": "chat_system_haiku", "kind": "chat",
     "messages": [{"role": "system", "content": "You are a poet who answers only in haiku."},
                  {"role": "user", "content": "Describe the sea at night."}]},
    {"name": "chat_multiturn", "kind": "chat",
     "messages": [{"role": "user", "content": "I have 3 apples and buy 4 more."},
                  {"role": "assistant", "content": "Then you have 7 apples."},
                  {"role": "user", "content": "And if I eat 2 of them, how many are left?"}]},
    {"name": "chat_summary_long", "kind": "chat",
     "messages": [{"role": "user",
                   "content": "Summarize the following notes in two sentences.\n\n"
                              + SUMMARY_TEXT}]},
]

# --------------------------------------------------------------------------
# Tokenizer corpus
# --------------------------------------------------------------------------

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
    "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>",
    "<jupyter_start>", "<jupyter_text>", "<jupyter_code>", "<jupyter_output>",
    "<jupyter_script>", "<empty_output>",
]

HANDWRITTEN = [
    # empty and whitespace
    "", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n ",
    "\t \t", "a b", "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a \n b",
    "   leading spaces", "trailing spaces   ", "  both  ", "line one\nline two\n\nline four\n",
    "tab\tseparated\tvalues\t1\t2\t3", "\u00a0non-breaking\u00a0space", "ideographic\u3000space",
    "thin\u2009space", "zero\u200bwidth", "\ufeffbyte order mark", "x\u2028y\u2029z",
    # digits and numbers
    "0", "7", "12", "123", "1234", "12345678901234567890", " 42", "  42", "\n\n1", "\t9",
    "a  2024", "3.14159", "-273.15", "1,000,000", "1e-5", "0x1F", "0b1010", "2024-06-01",
    "12:34:56", "v1.2.3", "+1 (555) 010-9999", "x1y2z3", "100%", "$19.99", "€5", "1/2",
    "\u0663\u0664\u0665", "\u2460\u2461\u2462", "\u216b", "\uff11\uff12\uff13", "\u00bd",
    "\u0967\u0968\u0969", "3rd 21st 100th",
    # punctuation and contractions
    "!", "!!!", "?", "?!", "...", "\u2026", "\u2014", "--", "---", "a-b", "a_b", "a.b",
    "(a)[b]{c}", "a,b;c:d", "@#$%^&*", "~`|\\", "\"quoted\"", "'single'",
    "\u201csmart quotes\u201d", "\u00abguillemets\u00bb", "don't", "I'll", "we've", "you're",
    "she'd", "I'm", "it's", "IT'S", "DON'T", "' s", "rock 'n' roll", "O'Brien",
    "e.g., i.e., etc.", "Mr. Smith vs. Mrs. Jones",
    # case
    "hello", "Hello", "HELLO", " hello", " Hello", "hELLO", "Hello World", "HelloWorld",
    "camelCaseIdentifier", "snake_case_identifier", "SCREAMING_SNAKE_CASE", "kebab-case-name",
    # Latin with accents and combining marks
    "caf\u00e9", "cafe\u0301", "na\u00efve", "\u00c5ngstr\u00f6m", "A\u030angstro\u0308m",
    "Stra\u00dfe", "\u0141\u00f3d\u017a", "\u0152uvre", "fa\u00e7ade",
    "a\u0308\u0304", "e\u0301\u0302\u0303\u0304", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034fA\u0334\u0335L\u0320G\u0334O\u0335",
    "\u1e9b\u0323", "\ufb01nance", "\u2126", "\u212b",
    # other scripts
    "\u4f60\u597d\uff0c\u4e16\u754c", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u6771\u4eac\u30bf\u30ef\u30fc", "\u4e2d\u6587English\u6df7\u5408",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\u1112\u1161\u11ab",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0661\u0662\u0663",
    "\u200f\u0645\u0631\u062d\u0628\u0627\u200e", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0938\u094d\u0935\u093e\u0917\u0924 \u0939\u0948", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u039a\u03b1\u03bb\u03b7\u03bc\u03ad\u03c1\u03b1", "\u0532\u0561\u0580\u0565\u0582",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u12a0\u121b\u122d\u129b", "\u0dc3\u0dd2\u0d82\u0dc4\u0dbd", "\u1000\u1019\u102c",
    "Ti\u1ebfng Vi\u1ec7t", "T\u00fcrk\u00e7e \u015fi\u015f", "\u00cdslenska \u00fe\u00f0",
    # emoji and symbols outside the BMP
    "\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f1eb\U0001f1f7", "\u2764\ufe0f", "1\ufe0f\u20e3", "\U0001f525\U0001f525\U0001f525",
    "I \u2764\ufe0f NY", "\U0001f680 launch", "\U0001d518\U0001d52b\U0001d526\U0001d520\U0001d52c\U0001d521\U0001d522",
    "\U0001f9d1\u200d\U0001f4bb", "\u263a", "\u2603\u2604", "\U0010ffff", "\ue000", "\U000e0041",
    "\u2200x \u2203y: x \u2264 y", "\u221a2 \u2248 1.414", "\u03c0r\u00b2", "\u2190\u2191\u2192\u2193",
    "\u00a9 \u00ae \u2122", "\u00b0C", "\u00b5s",
    # control characters
    "\x00", "a\x00b", "\x01\x02\x03", "\x07bell", "\x1b[31mred\x1b[0m", "\x7f", "\x0b\x0c",
    # special tokens and look-alikes
    "<|im_start|>user\nHello!<|im_end|>\n", "<|im_start|>assistant\n",
    "text<|im_end|>more", "<|im_start|><|im_end|>", "<|im_start|> <|im_end|>",
    "  <|im_start|>  ", "<|endoftext|><|endoftext|>", "<|im_start", "im_start|>",
    "<|IM_START|>", "< |im_start|>", "<|im_start |>", "<im_start>", "<|unknown_token|>",
    "<s>", "</s>", "<unk>", "<pad>", "[CLS]", "<|im_start|>system\nYou are helpful.<|im_end|>",
    # code
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "#include <stdio.h>\n\nint main(void) { printf(\"hi\\n\"); return 0; }\n",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "const add = (a, b) => a + b; // arrow",
    "if [ -f \"$HOME/.bashrc\" ]; then . \"$HOME/.bashrc\"; fi",
    "^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\\.[a-zA-Z]{2,}$",
    "    indented four\n        indented eight\n",
    "\t\tdouble tab indented\n\t\t\ttriple\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    "import numpy as np\nnp.zeros((3, 4), dtype=np.float32)",
    "SELECT * FROM t; -- comment\n/* block */",
    "a == b && c != d || !e",
    "ptr->next->prev = NULL;",
    "std::vector<std::string> v{\"a\", \"b\"};",
    "<?php echo $x; ?>",
    "```python\nprint('hello')\n```",
    "diff --git a/x b/x\n@@ -1,2 +1,2 @@\n-old\n+new\n",
    # URLs, paths, ids
    "https://example.com/path?q=1&r=two#frag", "user@example.org", "/usr/local/lib/libkhub.so.1",
    "C:\\Windows\\System32\\drivers", "kernels-community/flash-attn2", "khub1-cpu-x86_64-linux",
    "sha256:b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "550e8400-e29b-41d4-a716-446655440000", "SGVsbG8sIFdvcmxkIQ==", "#ff8800", "@mention #hashtag",
    # long words
    "supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "antidisestablishmentarianism", "Donaudampfschifffahrtsgesellschaftskapit\u00e4n",
    "x" * 300, "ab" * 150, "\u00e9" * 100, "\u4e2d" * 100, "\U0001f600" * 50, "1" * 200,
    " " * 64, "\n" * 32, "\t" * 16, "-" * 80, "=" * 40, "." * 100,
    "thequickbrownfoxjumpsoverthelazydog" * 5,
    # prose
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times.",
    "Hello, world! How are you today?",
    "SmolLM2 is a family of compact language models.",
    "Please summarize the following article in three bullet points.",
    "What's the difference between a list and a tuple in Python?",
    "Temperatures will reach 31\u00b0C on Friday, with a 40% chance of rain.",
    "She said, \"I'll be there at 5 p.m.\" \u2014 and she was.",
    "Numbers like 3.5 million and 0.25% appear in reports.",
    "New York, Paris, Tokyo, S\u00e3o Paulo and Z\u00fcrich.",
    "The model's weights are stored as 4-bit blocks with a scale and a minimum.",
    "He read 12 books in 2023 and 15 in 2024.",
    "Wait... what?! No way!!!",
    "Line with trailing newline\n",
    "Multiple\n\n\nblank\n\n\n\nlines",
    "Mixed\ttabs and    spaces\t \t here",
]


def corpus_strings():
    """The corpus, in a fixed order: hand-written cases, every special token alone
    and inside text, and every printable ASCII character alone and after a space."""
    out = list(HANDWRITTEN)
    for tok in SPECIAL_TOKENS:
        out.append(tok)
        out.append(f"before {tok} after")
    for c in range(0x20, 0x7f):
        out.append(chr(c))
        out.append(" " + chr(c))
    seen, unique = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def sha256_bytes(b):
    return hashlib.sha256(b).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1, separators=(",", ": "))
        f.write("\n")
    os.replace(tmp, path)


def redact_home(s):
    home = os.path.expanduser("~")
    return s.replace(home, "~") if home and home != "/" else s


# --------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------

def run_prompt(torch, model, tok, case, eos_id):
    if case["kind"] == "chat":
        text = tok.apply_chat_template(case["messages"], tokenize=False,
                                       add_generation_prompt=True)
    else:
        text = case["text"]
    ids = tok.encode(text, add_special_tokens=False)
    if case["kind"] == "chat":
        via_template = tok.apply_chat_template(case["messages"], tokenize=True,
                                               add_generation_prompt=True, return_dict=True)
        if list(via_template["input_ids"]) != ids:
            sys.exit(f"make-reference: {case['name']}: encode(template text) differs from "
                     "apply_chat_template(tokenize=True); fix the prompt")

    input_ids = torch.tensor([ids], dtype=torch.long)
    with torch.inference_mode():
        out = model(input_ids=input_ids, use_cache=True)
        last = out.logits[0, -1].to(torch.float32).contiguous()
        cache = out.past_key_values
        step_logits = last
        greedy, margins = [], []
        for _ in range(NEW_TOKENS):
            nxt = int(torch.argmax(step_logits))
            top2 = torch.topk(step_logits, 2).values
            greedy.append(nxt)
            margins.append(float(top2[0] - top2[1]))
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            step_logits = out.logits[0, -1].to(torch.float32)

        # Cross-check with generate(): greedy, no penalties, stopping at EOS. It
        # must agree with the loop above up to and including the first EOS.
        gen = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                             do_sample=False, max_new_tokens=NEW_TOKENS, num_beams=1,
                             repetition_penalty=1.0, temperature=None, top_p=None, top_k=None,
                             eos_token_id=eos_id, pad_token_id=eos_id)
    gen_new = gen[0, len(ids):].tolist()
    first_eos = greedy.index(eos_id) if eos_id in greedy else None
    upto = first_eos + 1 if first_eos is not None else NEW_TOKENS
    if gen_new[:upto] != greedy[:upto]:
        bad = next(i for i, (a, b) in enumerate(zip(gen_new, greedy)) if a != b)
        sys.exit(f"make-reference: {case['name']}: generate() and the argmax loop disagree at "
                 f"step {bad} (margin {margins[bad]:.3g}); refusing to write a fixture")

    raw = struct.pack(f"<{VOCAB}f", *last.tolist())
    top = torch.topk(last, 5)
    return text, ids, raw, {
        "argmax": int(torch.argmax(last)),
        "max_abs": float(last.abs().max()),
        "top5": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
        "greedy_ids": greedy,
        "greedy_text": tok.decode(greedy, skip_special_tokens=False),
        "greedy_margins": [round(m, 5) for m in margins],
        "first_eos": first_eos,
        "generate_ids": gen_new,
    }


def make(args):
    import numpy
    import safetensors
    import tokenizers
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf = os.path.abspath(args.hf_dir)
    prov = json.load(open(os.path.join(hf, "khub-provenance.json")))
    gguf_sha = prov["source_sha256"]
    if args.gguf:
        got = sha256_file(args.gguf)
        if got != gguf_sha:
            sys.exit(f"make-reference: {args.gguf} has sha256 {got} but {hf} was made from "
                     f"{gguf_sha}; rebuild it with tools/fetch-model.sh --hf")

    tok = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")
    if model.config.vocab_size != VOCAB:
        sys.exit(f"make-reference: vocab_size {model.config.vocab_size}, expected {VOCAB}")

    versions = {
        "python": platform.python_version(), "transformers": transformers.__version__,
        "torch": torch.__version__, "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__, "numpy": numpy.__version__,
    }
    try:
        import gguf  # noqa: F401
        from importlib.metadata import version
        versions["gguf"] = version("gguf")
    except Exception:
        pass
    command = redact_home(" ".join(["python3", "tools/make-reference.py"] + sys.argv[1:]))
    model_info = {
        "gguf_file": prov["source_file"], "gguf_sha256": gguf_sha,
        "hf_copy": os.path.basename(hf), "hf_dtype": prov["dtype"],
        "hf_made_with": prov["versions"],
        "safetensors_sha256": sha256_file(os.path.join(hf, "model.safetensors")),
        "tokenizer_json_sha256": sha256_file(os.path.join(hf, "tokenizer.json")),
    }

    out = os.path.abspath(args.out)
    if args.only in ("all", "greedy"):
        make_greedy(torch, model, tok, eos_id, out, model_info, command, versions, args)
    if args.only in ("all", "corpus"):
        plain = None
        if args.gguf:
            from transformers import AutoTokenizer as _AT
            d, f = os.path.split(os.path.abspath(args.gguf))
            plain = _AT.from_pretrained(d, gguf_file=f)
        make_corpus(tok, plain, out, model_info, command, versions)
    return check(out)


def make_greedy(torch, model, tok, eos_id, out, model_info, command, versions, args):
    os.makedirs(os.path.join(out, LOGITS_DIR), exist_ok=True)
    cases = []
    for n, case in enumerate(PROMPTS):
        text, ids, raw, res = run_prompt(torch, model, tok, case, eos_id)
        rel = f"{LOGITS_DIR}/{n:02d}_{case['name']}.bin"
        with open(os.path.join(out, rel + ".tmp"), "wb") as f:
            f.write(raw)
        os.replace(os.path.join(out, rel + ".tmp"), os.path.join(out, rel))
        entry = {"name": case["name"], "kind": case["kind"]}
        if case["kind"] == "chat":
            entry["messages"] = case["messages"]
        entry.update({
            "prompt_text": text, "n_input": len(ids), "input_ids": ids,
            "logits_file": rel, "logits_sha256": sha256_bytes(raw),
        })
        entry.update(res)
        cases.append(entry)
        print(f"make-reference: {case['name']:20s} {len(ids):4d} input tokens, argmax "
              f"{res['argmax']}, first EOS {res['first_eos']}, min margin "
              f"{min(res['greedy_margins']):.4g}", file=sys.stderr)

    write_json(os.path.join(out, GREEDY_FILE), {
        "schema": GREEDY_SCHEMA,
        "model": model_info,
        "generator": {
            "command": command, "versions": versions, "device": "cpu", "dtype": "float32",
            "attn_implementation": "eager", "torch_threads": args.threads,
        },
        "logits": {"format": "float32 little-endian", "count": VOCAB, "position": "last prompt "
                   "token", "compare": "max|a-b| / max|b| over the vocabulary <= 1e-3"},
        "greedy": {"new_tokens": NEW_TOKENS, "rule": "argmax of the logits at every step, "
                   "ties to the lowest id, EOS not special; first_eos is the index of the first "
                   "EOS in greedy_ids or null; generate_ids is model.generate() stopping at EOS",
                   "eos_id": eos_id},
        "cases": cases,
    })


def make_corpus(tok, plain, out, model_info, command, versions):
    # Strings holding U+0000 go to their own list with their UTF-8 bytes in hex:
    # a C reader of "cases" (cJSON) sees text as a NUL-terminated string.
    items, nul_items, mismatch, differ = [], [], 0, 0
    for s in corpus_strings():
        ids = tok.encode(s, add_special_tokens=False)
        dec = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        item = {"text": s, "ids": ids, "decoded": dec, "roundtrip": dec == s}
        mismatch += dec != s
        if plain is not None:
            pids = plain.encode(s, add_special_tokens=False)
            if pids != ids:
                item["transformers_gguf_ids"] = pids
                differ += 1
        if "\x00" in s:
            item["utf8_hex"] = s.encode("utf-8").hex()
            nul_items.append(item)
        else:
            items.append(item)
    write_json(os.path.join(out, CORPUS_FILE), {
        "schema": CORPUS_SCHEMA,
        "model": model_info,
        "generator": {"command": command, "versions": versions,
                      "encode": "tokenizer.encode(text, add_special_tokens=False)",
                      "decode": "tokenizer.decode(ids, skip_special_tokens=False, "
                                "clean_up_tokenization_spaces=False)"},
        "count": len(items),
        "transformers_gguf_differs": differ if plain is not None else None,
        "cases": items,
        "nul_cases": nul_items,
    })
    print(f"make-reference: {len(items) + len(nul_items)} corpus strings, {mismatch} do not "
          f"round-trip, {differ} tokenized differently by Transformers' own GGUF tokenizer",
          file=sys.stderr)


# --------------------------------------------------------------------------
# Check (standard library only)
# --------------------------------------------------------------------------

def check(folder):
    """Verifies the fixtures against themselves: schemas, sizes, digests, ranges."""
    errors = []

    def need(cond, msg):
        if not cond:
            errors.append(msg)

    g = json.load(open(os.path.join(folder, GREEDY_FILE), encoding="utf-8"))
    need(g.get("schema") == GREEDY_SCHEMA, f"{GREEDY_FILE}: schema {g.get('schema')!r}")
    need(len(g["cases"]) >= 8, f"{GREEDY_FILE}: only {len(g['cases'])} cases")
    for c in g["cases"]:
        name = c["name"]
        path = os.path.join(folder, c["logits_file"])
        raw = open(path, "rb").read()
        need(len(raw) == 4 * VOCAB, f"{name}: {c['logits_file']} has {len(raw)} bytes")
        need(sha256_bytes(raw) == c["logits_sha256"], f"{name}: logits sha256 mismatch")
        vals = struct.unpack(f"<{len(raw) // 4}f", raw)
        am = max(range(len(vals)), key=lambda i: (vals[i], -i))
        need(am == c["argmax"], f"{name}: argmax {am} != recorded {c['argmax']}")
        need(c["greedy_ids"][0] == c["argmax"], f"{name}: first greedy token is not the argmax")
        need(len(c["greedy_ids"]) == NEW_TOKENS, f"{name}: {len(c['greedy_ids'])} greedy ids")
        need(len(c["input_ids"]) == c["n_input"], f"{name}: n_input mismatch")
        need(all(0 <= t < VOCAB for t in c["input_ids"] + c["greedy_ids"]),
             f"{name}: token id out of range")
    t = json.load(open(os.path.join(folder, CORPUS_FILE), encoding="utf-8"))
    need(t.get("schema") == CORPUS_SCHEMA, f"{CORPUS_FILE}: schema {t.get('schema')!r}")
    need(t["count"] == len(t["cases"]) >= 300, f"{CORPUS_FILE}: {len(t['cases'])} cases")
    for c in t["cases"] + t.get("nul_cases", []):
        need(all(0 <= i < VOCAB for i in c["ids"]), f"corpus {c['text'][:20]!r}: id range")
        need(("\x00" in c["text"]) == ("utf8_hex" in c), f"corpus {c['text'][:20]!r}: utf8_hex")
        if "utf8_hex" in c:
            need(bytes.fromhex(c["utf8_hex"]).decode("utf-8") == c["text"],
                 f"corpus {c['text'][:20]!r}: utf8_hex does not match text")
        need((c["text"] == "") == (c["ids"] == []), f"corpus {c['text'][:20]!r}: empty mismatch")
    for e in errors:
        print(f"make-reference: check failed: {e}", file=sys.stderr)
    if not errors:
        print(f"make-reference: {folder}: {len(g['cases'])} prompts and {t['count']} corpus "
              "strings consistent", file=sys.stderr)
    return 1 if errors else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-dir", help="the Transformers copy (tools/fetch-model.sh --hf)")
    ap.add_argument("--gguf", help="the GGUF it came from, to re-verify its digest")
    ap.add_argument("--out", default="tests/fixtures", help="fixture folder")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--only", choices=["all", "greedy", "corpus"], default="all",
                    help="regenerate only one of the two fixture sets")
    ap.add_argument("--check", metavar="DIR", help="only check the fixtures in DIR")
    args = ap.parse_args()
    if args.check:
        sys.exit(check(args.check))
    if not args.hf_dir:
        ap.error("--hf-dir is required unless --check is given")
    sys.exit(make(args))


if __name__ == "__main__":
    main()
