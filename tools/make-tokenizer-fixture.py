#!/usr/bin/env python3
"""Makes the small tokenizer fixtures of tests/test_tokenizer.c.

For each pre-tokenizer khub implements (GPT-2's ByteLevel, SmolLM2's
Digits+ByteLevel, Llama-3's and Qwen2's Split+ByteLevel) it trains a small
byte-level BPE (700 ids) with Hugging Face tokenizers on a fixed text, saves
tokenizer.json, and records tokenizers' ids for every corpus string:

    tests/fixtures/tokenizer/<kind>/tokenizer.json
    tests/fixtures/tokenizer/smollm/tokenizer_config.json   (chat template, eos)
    tests/fixtures/tokenizer/corpus.json  {"tokenizers": "<version>",
                                           "strings": [...], "ids": {kind: [[...]]}}
    tests/fixtures/tokenizer/chat.json    {"templates": {name: jinja}, "conversations":
                                           {name: [msg]}, "out": {"tmpl/conv/gen": text}}
                                          (rendered with jinja2, as Transformers does)

    pip install tokenizers jinja2 && python3 tools/make-tokenizer-fixture.py

The corpus favours the pattern edges: contractions in every case, digit runs,
whitespace runs ending in newlines, non-ASCII letters and numbers, added
tokens. It has no NUL character (cJSON cannot carry one inside a string).
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
KINDS = ["gpt2", "smollm", "llama3", "qwen2"]
TRAIN_AS = {"smollm": "gpt2", "qwen2": "llama3"}
# The Instruct models' own templates (SmolLM2's is checked against the real
# tokenizer_config.json by tests/test_tokenizer.c when the model is present).
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "What is 2+2?"}],
    "with_system": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "  Hi there \n"},
                    {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": "Bye"}],
    "no_system_multi": [{"role": "user", "content": "caf\u00e9?"},
                        {"role": "assistant", "content": "\tYes.  "},
                        {"role": "user", "content": ""}],
}
SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")

BASE = [
    "Hello world!", "I'm sure they'll say it's fine, don't you think? We've seen it.",
    "IT'S LOUD, WE'RE HERE, THEY'VE GONE, I'LL GO, HE'D SAY", "It'S mIxEd 'Re 'vE 'Ll 'D 'M 'T",
    "Numbers 12345 and 3.14159 and 1,000,000 and \u0663\u0664\u0665 and \u00bd \u2153 \u216b",
    "  leading and trailing spaces  ", "multiple   internal    spaces",
    "tabs\tand\nnewlines\r\nmixed\n\n\nend", "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 fa\u00e7ade",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u8fd9\u662f\u4e00\u4e2a\u6d4b\u8bd5\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u30fc", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0420\u043e\u0441\u0441\u0438\u044f \u0438 \u0423\u043a\u0440\u0430\u0457\u043d\u0430",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "Emoji: \U0001f600\U0001f44d\U0001f3fd\U0001f1fa\U0001f1f8 and \u2764\ufe0f",
    "def foo(x):\n    return x ** 2  \n", "<|im_start|>user\nhi<|im_end|>\n",
    "a<tool>b <tool> c", "'''quotes''' \"double\" `back`", "x'sy 's 'ss", "\u00a0nbsp\u2003em\u3000ideo",
    "  \n  \n x", "!!!\n\n?? ...\r\n", "\t\thello\t world", "\u017f '\u017f '\u017ft", "A\u0301 combining",
    "zero\u200bwidth", "\x01ctrl\x7f", "end with space ", "end with newline\n", "1234567890",
    " 12 345 6789", "ab12cd34", "x\u2028y\u2029z", "$100.50!", "e.g. i.e. etc.",
    "http://example.com/path?q=1&r=2", "snake_case camelCase PascalCase kebab-case", "   ", "\n",
    "", " a", "'", "''", "'s", " 's", "\u00bd\u00bd\u00bd\u00bd", "\U0001d7d8\U0001d7d9\U0001d7da\U0001d7db",
]


def pre(kind):
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if kind == "gpt2":
        return bl
    if kind == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bl])
    rx = LLAMA3 if kind == "llama3" else QWEN2
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(rx), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def corpus():
    rng = random.Random(7)
    words = " ".join(BASE).split()
    out = list(BASE)
    for _ in range(200):
        n = rng.randint(1, 12)
        out.append(" ".join(rng.choice(words) for _ in range(n)) +
                   rng.choice(["", " ", "\n", "  ", "!", "\t", " 42", "\n\n"]))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizer"
    strings = corpus()
    ids = {}
    for kind in KINDS:
        tok = Tokenizer(models.BPE())
        # Single-digit patterns never see a digit pair, so their own training
        # would learn no digit merges and the corpus could not tell them from
        # grouped digits. Train them on a grouping pattern, then switch.
        tok.pre_tokenizer = pre(TRAIN_AS.get(kind, kind))
        tok.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                 special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tok.train_from_iterator(strings * 3, tr)
        tok.pre_tokenizer = pre(kind)
        tok.add_tokens([AddedToken("<tool>", special=False)])
        os.makedirs(f"{root}/{kind}", exist_ok=True)
        tok.save(f"{root}/{kind}/tokenizer.json", pretty=False)
        ids[kind] = [tok.encode(s, add_special_tokens=False).ids for s in strings]
        for s, i in zip(strings, ids[kind]):
            assert tok.decode(i, skip_special_tokens=False) == s, (kind, s)
    with open(f"{root}/smollm/tokenizer_config.json", "w") as f:
        json.dump({"chat_template": SMOLLM_TEMPLATE, "bos_token": "<|im_start|>",
                   "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
                   "clean_up_tokenization_spaces": False}, f, indent=1)
    import jinja2
    env = jinja2.Environment()
    templates = {"smollm2": SMOLLM_TEMPLATE, "qwen2": QWEN2_TEMPLATE, "llama3": LLAMA3_TEMPLATE}
    rendered = {}
    for tn, t in templates.items():
        for cn, conv in CONVERSATIONS.items():
            for gen in (0, 1):
                rendered[f"{tn}/{cn}/{gen}"] = env.from_string(t).render(
                    messages=conv, add_generation_prompt=bool(gen), bos_token="<|begin_of_text|>")
    with open(f"{root}/chat.json", "w") as f:
        json.dump({"jinja2": jinja2.__version__, "templates": templates,
                   "conversations": CONVERSATIONS, "out": rendered}, f, indent=1)
    with open(f"{root}/corpus.json", "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "strings": strings, "ids": ids}, f)


if __name__ == "__main__":
    main()
