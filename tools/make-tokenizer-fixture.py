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

With --spm-only it makes only the SentencePiece-style fixtures of
tests/test_tokenizer_spm.c (issue 15): one byte-fallback BPE vocab with the
"\u2581" space marker and one Unigram vocab (with and without byte pieces and
byte_fallback), trained on SPM_TRAIN, each
saved under the tokenizer.json pipelines Transformers writes for Llama 2,
Mistral 7B v0.1 and TinyLlama and the tokenizers library allows around them
(SPM_SHAPES), with the library's ids and decoded text for every string of the
corpora the other tokenizer tests use plus SPM_EXTRA:

    tests/fixtures/tokenizer/spm/<shape>.json   tokenizer.json of each shape
    tests/fixtures/tokenizer/spm/corpus.json    {"tokenizers": "<version>", "strings": [...],
                                                 "shapes": [{"name": shape, "ids": [[...]],
                                                 "decoded": [...], "decoded_special": {...}}]}

ids[i] is encode(strings[i], add_special_tokens=True).ids, or null when it
equals the previous shape's; decoded[i] is decode(ids, skip_special_tokens=
True), null when it equals the previous shape's (the first shape's: when it
is strings[i]); decoded_special {"i": text} holds decode(ids,
skip_special_tokens=False) for the strings of SPM_EXTRA. (The nulls and the
subset keep the file small.)

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


# --------------------------------------------------------------------------
# SentencePiece-style fixtures (--spm-only)
# --------------------------------------------------------------------------

SPM_TRAIN = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Llama 2 and Mistral use a SentencePiece vocabulary with byte fallback.",
    "A tokenizer splits text into pieces; each piece has an id in the vocabulary.",
    "  two leading spaces, three   inside, and    four before this.",
    "def add(a, b):\n    return a + b\n",
    "Numbers like 12345 and 3.14159 appear in text, as do dates: 2025-08-14.",
    "the quick brown fox jumps over the lazy dog " * 3,
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    "".join(chr(c) for c in range(0x21, 0x7f)),  # every printable ASCII character
]
SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
SPM_EXTRA = [
    "", " ", "  ", "   x", "x   ", " x ", "a  b   c    d", "\u2581", "\u2581x", " \u2581x",
    "x\u2581\u2581y", "<s>", "</s>", "<s>Hello", "Hello</s>", "Hello</s>world", "Hello </s> world",
    "<s> leading", "<s>  two", "a<s>b<s>c", "</s></s>", "<tool>", "<tool>x", "x<tool>", " <tool> ",
    "x <tool>  y", "<unk>", "ab", "p\u00fc", "\u00f6q", "ab p\u00fc \u00f6q", "\u00fc\u00fc x",
    "ccc cccc", "\u2581ab", "<unk>\u00fc", "The capital<s>of France", "\u65e5\u672c\u8a9e", "caf\u00e9 \U0001F600",
    "\U0001F600 at the start", "ends with emoji \U0001F600", "\u00e9\u00e9\u00e9",
    "the the the  the", "\t\ttabs and\nnewlines\n", "supercalifragilisticexpialidocious",
]
# name: (model kind, normalizer, pre_tokenizer, decoder)
SPM_SHAPES = {
    # Transformers' legacy Llama conversion (Llama 2, TinyLlama, Mistral v0.1 files)
    "legacy": ("bpe", "prepend", None, "strip"),
    # Transformers' non-legacy conversion (legacy=False): Metaspace "first", no split
    "first": ("bpe", None, ("first", False), "strip"),
    # the other Metaspace settings the library allows, with its Metaspace decoder
    "always_split": ("bpe", None, ("always", True), ("always", True)),
    "first_split": ("bpe", None, ("first", True), ("first", True)),
    "never_metadec": ("bpe", None, ("never", True), ("never", True)),
    "never": ("bpe", None, ("never", False), "plain"),
    # a Unigram model: as SentencePieceUnigramTokenizer builds it (without its
    # NFKC normalizers), unknown characters fused into one <unk>
    "unigram": ("unigram", None, ("always", True), ("always", True)),
    # the same vocab with the 256 byte pieces and byte_fallback, Llama's pipeline
    "unigram_bytes": ("unigram_bytes", None, ("first", False), "strip"),
    # a hand-made Unigram vocab (SPM_UNIGRAM_EDGES) for the Viterbi's edges
    "unigram_edges": ("unigram_edges", None, ("always", True), ("always", True)),
}
# "\u2581ab": "\u2581ab" and "\u2581a" + "b" tie at -2 (the earlier start wins);
# "p\u00fc": "p\u00fc" (-18) beats "p" + unk (3 + min - 10 = -27), only because of
# the unk penalty; "\u00f6q": unk + "q" (-30 + 12) beats "\u00f6q" (-20), only
# because a character that no one-character piece covers gets an unk node even
# when a longer piece starts there.
SPM_UNIGRAM_EDGES = [
    ("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("\u2581", -1.0), ("a", -1.0), ("b", -1.0),
    ("\u2581a", -1.0), ("\u2581ab", -2.0), ("p", 3.0), ("p\u00fc", -18.0), ("\u00f6q", -20.0),
    ("q", 12.0), ("c", -1.0), ("\u2581c", -2.0), ("cc", -2.0), ("\u2581cc", -4.0),
]


def spm_corpus(root):
    out = []
    with open(f"{root}/corpus.json") as f:
        out += json.load(f)["strings"]
    with open(f"{root}/../smollm2_tokenizer_corpus.json") as f:
        out += [c["text"] for c in json.load(f)["cases"]]
    out += SPM_EXTRA
    seen, unique = set(), []
    for s in out:
        if s not in seen and "\x00" not in s:
            seen.add(s)
            unique.append(s)
    return unique


def spm_train_bpe():
    from tokenizers import normalizers
    t = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    # No pre-tokenizer while training: merges may cross a "\u2581", so that a
    # Metaspace split changes the ids.
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                         normalizers.Replace(" ", "\u2581")])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tr = trainers.BpeTrainer(vocab_size=700, special_tokens=SPM_SPECIALS + bytes_,
                             show_progress=False)
    t.train_from_iterator(SPM_TRAIN * 2, tr)
    spec = json.loads(t.to_str())
    # As in the Llama files, the byte pieces are vocabulary, not added tokens.
    spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] in SPM_SPECIALS]
    return spec


def spm_train_unigram():
    t = Tokenizer(models.Unigram())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tr = trainers.UnigramTrainer(vocab_size=400, special_tokens=SPM_SPECIALS, unk_token="<unk>",
                                 show_progress=False)
    t.train_from_iterator(SPM_TRAIN * 2, tr)
    spec = json.loads(t.to_str())
    bytes_spec = json.loads(t.to_str())
    # SentencePiece's byte pieces (score 0) after the others, and byte_fallback
    bytes_spec["model"]["vocab"] += [[f"<0x{b:02X}>", 0.0] for b in range(256)]
    bytes_spec["model"]["byte_fallback"] = True
    return spec, bytes_spec


def spm_shape(bases, shape):
    from tokenizers import normalizers, processors
    kind, norm, pre, dec = SPM_SHAPES[shape]
    t = Tokenizer.from_str(json.dumps(bases[kind]))
    t.normalizer = None
    t.pre_tokenizer = None
    if norm == "prepend":
        t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                             normalizers.Replace(" ", "\u2581")])
    elif norm == "replace":
        t.normalizer = normalizers.Replace(" ", "\u2581")
    if pre:
        t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=pre[0],
                                                   split=pre[1])
    seq = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if dec == "strip":
        t.decoder = decoders.Sequence(seq + [decoders.Strip(" ", 1, 0)])
    elif dec == "plain":
        t.decoder = decoders.Sequence(seq)
    else:
        t.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=dec[0], split=dec[1])
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPM_SPECIALS])
    t.add_tokens([AddedToken("<tool>", special=False, normalized=False)])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                     special_tokens=[("<s>", 1)])
    return t


def make_spm(root):
    strings = spm_corpus(root)
    os.makedirs(f"{root}/spm", exist_ok=True)
    bases = {"bpe": spm_train_bpe()}
    bases["unigram"], bases["unigram_bytes"] = spm_train_unigram()
    edges = Tokenizer(models.Unigram(SPM_UNIGRAM_EDGES, 0, False))
    bases["unigram_edges"] = json.loads(edges.to_str())
    shapes, prev, prev_dec = [], [None] * len(strings), list(strings)
    for shape in SPM_SHAPES:
        t = spm_shape(bases, shape)
        t.save(f"{root}/spm/{shape}.json", pretty=False)
        ids = [t.encode(s, add_special_tokens=True).ids for s in strings]
        dec = [t.decode(i, skip_special_tokens=True) for i in ids]
        dsp = [t.decode(i, skip_special_tokens=False) for i in ids]
        shapes.append({
            "name": shape,
            "ids": [None if i == p else i for i, p in zip(ids, prev)],
            "decoded": [None if d == p else d for d, p in zip(dec, prev_dec)],
            "decoded_special": {str(k): dsp[k] for k, s in enumerate(strings) if s in SPM_EXTRA}})
        prev, prev_dec = ids, dec
    with open(f"{root}/spm/corpus.json", "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "strings": strings, "shapes": shapes},
                  f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def main():
    if "--spm-only" in sys.argv:
        args = [a for a in sys.argv[1:] if a != "--spm-only"]
        make_spm(args[0] if args else "tests/fixtures/tokenizer")
        return
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
    make_spm(root)


if __name__ == "__main__":
    main()
