#!/usr/bin/env bash
# t_run.sh: `khub run`, the main job, through the real CLI on the real
# SmolLM2-135M-Instruct in both formats (tools/fetch-model.sh, --hf for the
# folder): a coherent chat answer from the GGUF and from the safetensors
# folder; --json (several prompts in one call, per-prompt results, timings,
# peak RSS, threads: default = the cores, --threads N); two prompts as
# text; --chat --system; --stop; seeded
# sampling; --explain; --embed; --max-context; invalid UTF-8 in a prompt; --quant and --quant-embeddings; the load progress bar
# on a terminal and not through a pipe; option and bad-file errors. Skips
# what needs a file that is absent.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
DIR=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}
GGUF=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf
HF=$DIR/SmolLM2-135M-Instruct-hf
[ -f "$GGUF" ] || t_skip "$GGUF absent (run tools/fetch-model.sh)"
t_begin run
Q="What is the capital of France?"

# The main job, streamed, in both formats.
"$KHUB" run --model "$GGUF" --chat --prompt "$Q" --max-new-tokens 24 > g.out 2> g.err ||
    { cat g.err; fail "run gguf"; }
grep -q "Paris" g.out || fail "gguf answer: $(cat g.out)"
grep -Eq "^khub run: [0-9]+ prompt tokens at [0-9.]+ tok/s, [0-9]+ new tokens at [0-9.]+ tok/s \(load [0-9]+ ms, peak RSS [0-9]+ MiB\)$" g.err ||
    fail "summary line: $(cat g.err)"
echo "ok   gguf: $(head -n 1 g.out)"
if [ -f "$HF/model.safetensors" ]; then
    "$KHUB" run --model "$HF" --chat --prompt "$Q" --max-new-tokens 24 > h.out 2> h.err ||
        { cat h.err; fail "run hf"; }
    grep -q "Paris" h.out || fail "hf answer: $(cat h.out)"
    echo "ok   safetensors folder: $(head -n 1 h.out)"
else
    echo "skip safetensors folder: $HF absent (run tools/fetch-model.sh --hf)"
fi

# --json: two prompts in one call, results per prompt, timings, threads.
"$KHUB" run --model "$GGUF" --prompt "The capital of France is" --prompt "def add(a, b):" \
    --max-new-tokens 8 --json > j.json 2> j.err || { cat j.err; fail "json"; }
"$KHUB" run --model "$GGUF" --prompt "The capital of France is" --max-new-tokens 8 --json \
    --threads 1 > j1.json 2> j1.err || { cat j1.err; fail "json --threads 1"; }
"$KHUB" run --help > run_help.txt
python3 - j.json j1.json "$(nproc)" run_help.txt << 'PY' || fail "json fields: $(cat j.json)"
import json, re, sys
j = json.load(open(sys.argv[1]))
j1 = json.load(open(sys.argv[2]))
cores = int(sys.argv[3])
# --help's --json line names every field the object has
said = open(sys.argv[4]).read().split("  --json ", 1)[1].split("\n  --", 1)[0]
for k in list(j) + list(j["results"][0]):
    assert re.search(r"\b%s\b" % k, said), ("run --help's --json does not name", k, said)
r = j["results"]
assert len(r) == 2, r
for e in r:
    assert 1 <= len(e["tokens"]) <= 8 and e["text"], e
    assert e["stop_reason"] in ("eos", "max_tokens"), e
    assert e["n_prompt_tokens"] > 0, e
assert r[0]["text"] != r[1]["text"], r
assert "Paris" in r[0]["text"], r[0]
assert j["text"] == r[0]["text"]
t = j["timings"]
for k in ("load_ms", "prefill_ms", "decode_ms", "prefill_tok_s", "decode_tok_s"):
    assert t[k] > 0, (k, t)
assert j["peak_rss_kib"] > 50 * 1024, j["peak_rss_kib"]
assert j["threads"] == cores, ("default threads", j["threads"], cores)
assert j1["threads"] == 1, j1["threads"]
assert j1["results"][0]["tokens"][0] == r[0]["tokens"][0], (j1["results"][0], r[0])
PY
echo "ok   --json: 2 prompts, timings, peak RSS, threads $(nproc) by default and --threads 1"

# Several prompts without --json: each result under its own header.
"$KHUB" run --model "$GGUF" --prompt "The capital of France is" --prompt "1, 2, 3," \
    --max-new-tokens 6 > two.out 2> two.err || { cat two.err; fail "two prompts"; }
grep -qx -- "--- prompt 1 ---" two.out && grep -qx -- "--- prompt 2 ---" two.out ||
    fail "two prompts: $(cat two.out)"
echo "ok   two prompts in one call, printed under their headers"

# --chat --system: the system message replaces the template's default one.
pt() { python3 -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["n_prompt_tokens"])'; }
d=$("$KHUB" run --model "$GGUF" --chat --prompt hi --max-new-tokens 2 --json | pt)
b=$("$KHUB" run --model "$GGUF" --chat --system "Be brief." --prompt hi --max-new-tokens 2 --json | pt)
[ "$b" -lt "$d" ] && [ "$b" -gt 3 ] || fail "--system: $b prompt tokens, default system $d"
echo "ok   --chat --system: $b prompt tokens (default system prompt: $d)"

# --stop: the text ends before the first occurrence, which is not printed.
stop=$(python3 -c 'import json,sys; t=json.load(open("j1.json"))["text"]; print(t.split()[-1])')
"$KHUB" run --model "$GGUF" --prompt "The capital of France is" --max-new-tokens 8 --json \
    --stop "$stop" > s.json 2> s.err || { cat s.err; fail "stop"; }
python3 - j1.json s.json "$stop" << 'PY' || fail "stop string '$stop': $(cat s.json)"
import json, sys
full = json.load(open(sys.argv[1]))["text"]
s = json.load(open(sys.argv[2]))["results"][0]
stop = sys.argv[3]
assert s["stop_reason"] == "stop_string", s
assert s["text"] == full[:full.index(stop)], (s["text"], full)
PY
"$KHUB" run --model "$GGUF" --prompt "The capital of France is" --max-new-tokens 8 \
    --stop "$stop" > s.out 2> /dev/null || fail "streamed stop"
grep -qF -- "$stop" s.out && fail "the stop string was streamed: $(cat s.out)"
echo "ok   --stop '$stop' cuts the text, streamed or not"

# Seeded sampling: the same seed gives the same tokens, another seed others.
samp() {
    "$KHUB" run --model "$GGUF" --prompt "My favourite food is" --max-new-tokens 16 --ignore-eos \
        --temperature 0.9 --top-k 40 --top-p 0.95 --repeat-penalty 1.1 --seed "$1" --json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["results"][0]["tokens"])'
}
a=$(samp 5); b=$(samp 5); c=$(samp 6)
[ "$a" = "$b" ] || fail "seed 5 twice: $a / $b"
[ "$a" != "$c" ] || fail "seeds 5 and 6 gave the same tokens: $a"
echo "ok   sampling: same seed, same tokens"

# --explain: every role with its plugin and the trace of the choice.
"$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 1 --explain > e.out 2> /dev/null ||
    fail "explain"
for role in 'attention\[f32\]' 'kv_cache\[f32\]' 'rms_norm\[f32\]' 'rotary\[f32\]' \
    'silu_and_mul\[f32\]' 'qkv_proj\[q4_1\]' 'down_proj\[q4_1\]' 'lm_head\[q8_0\]' \
    'embed_dequant\[q8_0\]'; do
    grep -Eq "^$role: khub/[a-z0-9-]+ [0-9.]+ :: [a-z_0-9]+$" e.out || fail "no $role line: $(grep -v '^ ' e.out)"
done
grep -Eq "^    chose khub/[a-z0-9-]+ [0-9.]+ :: attention \(best ranked" e.out || fail "no trace"
echo "ok   --explain names a plugin and the reason for every role"

# --embed (the embedding role, 0.2): the named plugin's op does the lookup,
# --explain lists it, and the greedy tokens are the host lookup's.
"$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 1 --embed khub/ref-cpu --explain \
    > em.out 2> /dev/null || fail "--embed"
grep -q '^embedding\[q8_0\]: khub/ref-cpu 0.1.0 :: embedding$' em.out ||
    fail "no embedding line: $(grep -v '^ ' em.out)"
grep -q '^embedding\[' e.out && fail "an embedding binding without --embed"
"$KHUB" run --model "$GGUF" --prompt "The capital of France is" --max-new-tokens 6 > g1.out 2> /dev/null ||
    fail "greedy"
"$KHUB" run --model "$GGUF" --prompt "The capital of France is" --max-new-tokens 6 --embed khub/ref-cpu \
    > g2.out 2> /dev/null || fail "greedy --embed"
cmp -s g1.out g2.out || fail "--embed changed the text: $(cat g1.out) / $(cat g2.out)"
echo "ok   --embed binds the embedding op, same text as the host lookup"

# Quantize at load: the head stays as it is unless asked.
if [ -f "$HF/model.safetensors" ]; then
    "$KHUB" run --model "$HF" --prompt hi --max-new-tokens 1 --quant q8_0 --explain > q.out 2> /dev/null ||
        fail "--quant q8_0"
    grep -q "^qkv_proj\[q8_0\]: " q.out || fail "q8_0 does not serve qkv_proj"
    grep -q "^lm_head\[f32\]: " q.out || fail "lm_head quantized unasked: $(grep '^lm_head' q.out)"
    "$KHUB" run --model "$HF" --prompt hi --max-new-tokens 1 --quant q8_0 --quant-embeddings \
        --explain > qe.out 2> /dev/null || fail "--quant-embeddings"
    grep -q "^lm_head\[q8_0\]: " qe.out || fail "lm_head not quantized: $(grep '^lm_head' qe.out)"
    echo "ok   --quant q8_0 keeps lm_head f32; --quant-embeddings quantizes it"
fi

# The load progress bar: on a terminal only.
script -qec "'$KHUB' run --model '$GGUF' --prompt hi --max-new-tokens 1" tty.log > /dev/null ||
    fail "run under script"
grep -q "loading SmolLM2-135M-Instruct.Q4_1.gguf \[####################\] 30/30 layers" tty.log ||
    fail "no progress bar on a terminal: $(head -c 300 tty.log)"
"$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 1 > p.out 2> p.err || fail "piped run"
grep -q "loading" p.err && fail "progress bar through a pipe: $(cat p.err)"
echo "ok   progress bar on a terminal, none through a pipe"

# --max-context: the KV capacity per sequence reaches the executor (by
# default the trained context, at most 4096); past the trained context a
# warning says so; a prompt that does not fit names the flag.
"$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 1 --json > c0.json 2> c0.err ||
    { cat c0.err; fail "default context"; }
"$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 1 --max-context 8192 --json > c1.json \
    2> c1.err || { cat c1.err; fail "--max-context 8192"; }
"$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 1 --max-context 16384 --json > c2.json \
    2> c2.err || { cat c2.err; fail "--max-context 16384"; }
python3 - c0.json c1.json c2.json << 'PY' || fail "max_context: $(cat c0.json c1.json c2.json)"
import json, sys
c0, c1, c2 = (json.load(open(f)) for f in sys.argv[1:])
assert c0["context_length"] == 8192 and c0["max_context"] == 4096, c0
assert c1["max_context"] == 8192 and c2["max_context"] == 16384, (c1, c2)
PY
grep -q "beyond the model's trained context" c1.err && fail "warned at 8192: $(cat c1.err)"
grep -q "max_context 16384 is beyond the model's trained context 8192 (max_position_embeddings)" c2.err ||
    fail "no warning past the trained context: $(cat c2.err)"
rc=0
"$KHUB" run --model "$GGUF" --prompt "The capital of France is a city" --max-context 4 > c3.out \
    2> c3.err || rc=$?
[ $rc = 1 ] || fail "prompt over --max-context: exit $rc"
grep -Eq "prompt 0 has [0-9]+ tokens; the KV cache holds 4 per sequence .*; --max-context N raises it \(the model was trained for 8192\)" c3.err ||
    fail "context full message: $(cat c3.err)"
echo "ok   --max-context: 4096 by default, 8192 and 16384 (warned) on request, a full context names the flag"

# Invalid UTF-8 in a prompt is tokenized as U+FFFD (as Transformers' text
# path does), with a warning naming the byte; it used to vanish.
"$KHUB" run --model "$GGUF" --prompt $'The caf\xe9 is' --max-new-tokens 1 --json > u8.json \
    2> u8.err || { cat u8.err; fail "invalid UTF-8 prompt"; }
grep -q "the text is not valid UTF-8 at byte 7; 1 invalid sequence replaced with U+FFFD" u8.err ||
    fail "no invalid UTF-8 warning: $(cat u8.err)"
"$KHUB" run --model "$GGUF" --prompt $'The caf\xef\xbf\xbd is' --max-new-tokens 1 --json \
    > u8r.json 2> u8r.err || { cat u8r.err; fail "U+FFFD prompt"; }
[ -s u8r.err ] && fail "a valid prompt warned: $(cat u8r.err)"
python3 - u8.json u8r.json << 'PY' || fail "invalid UTF-8 is not U+FFFD: $(cat u8.json u8r.json)"
import json, sys
a, b = (json.load(open(f))["results"][0] for f in sys.argv[1:])
assert a["n_prompt_tokens"] == b["n_prompt_tokens"] and a["tokens"] == b["tokens"], (a, b)
PY
echo "ok   invalid UTF-8 in a prompt: U+FFFD, warned with the byte offset"

# Errors: options, a missing model, a truncated file (named, with the field).
err() { # expected exit code, expected message, args...
    local want=$1 msg=$2 rc=0
    shift 2
    "$KHUB" run "$@" > x.out 2> x.err || rc=$?
    [ "$rc" = "$want" ] || fail "khub run $*: exit $rc, want $want: $(cat x.err)"
    grep -qF -- "$msg" x.err || fail "khub run $*: message: $(cat x.err)"
}
err 2 "--quant-embeddings needs --quant SCHEME" --model "$GGUF" --prompt a --quant-embeddings
err 2 "--top-p needs a number in [0, 1], got '2'" --model "$GGUF" --prompt a --top-p 2
err 2 "--threads needs a number in [0, 1024], got 'x'" --model "$GGUF" --prompt a --threads x
# NaN compares false with both bounds: it must still be refused
err 2 "--threads needs a number in [0, 1024], got 'nan'" --model "$GGUF" --prompt a --threads nan
err 2 "--temperature needs a number in [0, 100], got 'NAN'" --model "$GGUF" --prompt a --temperature NAN
err 2 "--max-context needs a number in [1, " --model "$GGUF" --prompt a --max-context 0
err 2 "unknown option '--bogus'" --model "$GGUF" --prompt a --bogus
err 2 "--prompt TEXT or --prompts-file FILE is required" --model "$GGUF"
err 1 "nowhere.gguf: no such file or folder" --model nowhere.gguf --prompt a
head -c 100000 "$GGUF" > cut.gguf
err 1 "cut.gguf: " --model cut.gguf --prompt a
grep -Eq "cut.gguf: .*(tensor|metadata|past end)" x.err || fail "truncated gguf message: $(cat x.err)"
echo "ok   errors: $(cat x.err)"
if [ -f "$HF/model.safetensors" ]; then
    mkdir cut
    cp "$HF/config.json" cut/
    head -c 100000 "$HF/model.safetensors" > cut/model.safetensors
    err 1 "cut/model.safetensors: tensor 'model.embed_tokens.weight': data_offsets [0, " \
        --model cut --prompt a
    grep -q "past end of file" x.err || fail "truncated safetensors message: $(cat x.err)"
    echo '{"architectures": ["LlamaForCausalLM"],' > cut/config.json
    err 1 "cut/config.json: not valid JSON" --model cut --prompt a
    echo "ok   a truncated safetensors file and a malformed config.json are refused by name"
fi
echo "1 passed, 0 failed"
