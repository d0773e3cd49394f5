#!/usr/bin/env bash
# t_run_batch.sh: `khub run --prompts-file` (continuous batching, issue 13)
# through the real CLI on the tiny random Llama with SmolLM2's tokenizer
# (tools/make-tiny-model.py: milliseconds per token, so 200 requests stay
# fast in CI). A generated file of 200 mixed requests (plain lines and JSON
# lines; prompts of 1 to ~90 tokens; max_tokens 1..24; greedy and seeded
# sampling; chat with a system message; stop strings) runs with 16 requests
# in flight and 48-token steps, so requests join mid-run and prefill chunks
# share steps with decodes; every output must equal its solo run: all 200
# with --parallel 1 (one request at a time), and every 5th also as its own
# `khub run --prompt` process. Then --json's per-request timings and totals,
# the text output, and bad files: malformed JSON, zero max_tokens, an
# unknown setting, a setting given twice (each with its line), an empty
# file, and a request longer than the cache failing alone while the others finish; the default KV
# cache of a multi-request run (paged) and what keeps the dense one; f16 K/V
# (--kv-type f16: the batch equals its --parallel 1 run on f16 too, --explain
# names the type and half the bytes per token, bad values refused); and a
# small `khub bench-batch` run (f16 K/V by default); and `khub run --prompt`'s
# summary for one new token (no decode step, no rate).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin run_batch
command -v python3 > /dev/null || t_skip "python3 absent"
python3 "$SRC/tools/make-tiny-model.py" tiny > /dev/null

python3 - > prompts.jsonl << 'PY'
import json, random
r = random.Random(13)
words = "the a cat dog sat on mat red blue green sky sea runs fast slow big small one two".split()
for i in range(200):
    text = " ".join(r.choice(words) for _ in range(1 + (i * 7) % 60))
    if i % 4 == 0:
        print(text)  # a plain line: the command line's settings
        continue
    req = {"prompt": text, "max_tokens": 1 + (i * 5) % 24, "ignore_eos": True}
    if i % 4 == 2:
        req.update(temperature=0.9, top_k=40, seed=i)
    if i % 8 == 3:
        req.update(chat=True, system="be brief")
    if i % 12 == 5:
        req["stop"] = ["e"]
    print(json.dumps(req))
PY

"$KHUB" run --model tiny --prompts-file prompts.jsonl --max-new-tokens 6 --ignore-eos \
    --parallel 16 --max-batch-tokens 48 --json > batch.json 2> batch.err ||
    { cat batch.err; fail "batched run"; }
"$KHUB" run --model tiny --prompts-file prompts.jsonl --max-new-tokens 6 --ignore-eos \
    --parallel 1 --json > solo.json 2> solo.err || { cat solo.err; fail "solo run"; }
python3 - batch.json solo.json << 'PY' || fail "batched differs from solo"
import json, sys
b, s = (json.load(open(p)) for p in sys.argv[1:3])
assert len(b["results"]) == len(s["results"]) == 200
for x, y in zip(b["results"], s["results"]):
    assert x["status"] == "ok", x
    assert x["tokens"] == y["tokens"] and x["text"] == y["text"], (x["index"], x, y)
    assert x["stop_reason"] == y["stop_reason"]
    t = x["timings"]
    assert t["total_ms"] >= t["ttft_ms"] > 0 and t["queue_ms"] >= 0, t
texts = {x["text"] for x in b["results"]}
assert len(texts) > 100, "outputs too alike for the comparison to mean much: %d" % len(texts)
stops = [x for x in b["results"] if x["stop_reason"] == "stop_string"]
assert stops and all("e" not in x["text"] for x in stops)
tot = b["totals"]
assert tot["requests"] == 200 and tot["failed"] == 0 and tot["generated_tokens"] > 0, tot
assert tot["generated_tok_s"] > 0 and tot["steps"] > 0 and tot["peak_rss_kib"] > 0, tot
# Batching did batch: far fewer steps than one request at a time.
assert tot["steps"] * 3 < s["totals"]["steps"], (tot["steps"], s["totals"]["steps"])
print("ok   200 requests: batched = --parallel 1; %d steps against %d" %
      (tot["steps"], s["totals"]["steps"]))
PY

# Every 5th request as its own process, with the same settings as flags.
python3 - prompts.jsonl batch.json << 'PY' > solo_cmds
import json, shlex, sys
lines = [l.rstrip("\n") for l in open(sys.argv[1])]
res = json.load(open(sys.argv[2]))["results"]
for i in range(0, 200, 5):
    l = lines[i]
    req = json.loads(l) if l.startswith("{") else {"prompt": l}
    args = ["--prompt", req["prompt"], "--max-new-tokens", str(req.get("max_tokens", 6)),
            "--ignore-eos", "--json"]
    if "temperature" in req:
        args += ["--temperature", str(req["temperature"]), "--top-k", str(req["top_k"]),
                 "--seed", str(req["seed"])]
    if req.get("chat"):
        args += ["--chat", "--system", req["system"]]
    for st in req.get("stop", []):
        args += ["--stop", st]
    print(i, json.dumps(res[i]["tokens"], separators=(",", ":")), shlex.join(args))
PY
n=0
while read -r i want args; do
    eval "set -- $args"
    "$KHUB" run --model tiny "$@" > one.json 2> one.err || { cat one.err; fail "solo $i"; }
    got=$(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["results"][0]["tokens"], separators=(",", ":")))' one.json)
    [ "$got" = "$want" ] || fail "request $i alone: $got, batched: $want"
    n=$((n + 1))
done < solo_cmds
[ "$n" = 40 ] || fail "ran $n solo processes, not 40"
echo "ok   40 requests as their own khub run equal the batch"

# Text output: in file order, a summary line on stderr.
printf 'one two\n{"prompt": "three", "max_tokens": 2}\n' > two.txt
"$KHUB" run --model tiny --prompts-file two.txt --max-new-tokens 3 > two.out 2> two.err ||
    { cat two.err; fail "text output"; }
[ "$(grep -c '^--- prompt [12] ---$' two.out)" = 2 ] || fail "text output: $(cat two.out)"
grep -Eq "^khub run: 2 requests, [0-9]+ prompt and [0-9]+ generated tokens in" two.err ||
    fail "summary: $(cat two.err)"
# One request, one token, one step: singular nouns (it said "1 requests",
# "1 generated tokens", "1 steps" before session 18).
printf 'one two\n' > one.txt
"$KHUB" run --model tiny --prompts-file one.txt --max-new-tokens 1 --ignore-eos > one1.out \
    2> one1.err || { cat one1.err; fail "one request"; }
grep -Eqx "khub run: 1 request, [0-9]+ prompt and 1 generated token in [0-9.]+ s \
\([0-9.]+ generated tok/s, 1 step, 0 preemptions, peak RSS [0-9]+ MiB\)" one1.err ||
    fail "one request: $(cat one1.err)"
# Several --prompt: the counts of all prompts beside the whole call's rates
# (the first prompt's counts before session 18).
"$KHUB" run --model tiny --prompt "one two" --prompt "three" --max-new-tokens 2 --ignore-eos \
    > p2.out 2> p2.err || { cat p2.err; fail "two prompts"; }
np=$("$KHUB" run --model tiny --prompt "one two" --prompt "three" --max-new-tokens 2 --ignore-eos \
    --json | python3 -c 'import json, sys
print(sum(r["n_prompt_tokens"] for r in json.load(sys.stdin)["results"]))')
grep -Eqx "khub run: 2 prompts, $np prompt tokens at [0-9.]+ tok/s, 4 new tokens at [0-9.]+ tok/s \
\(load [0-9]+ ms, peak RSS [0-9]+ MiB\)" p2.err || fail "two prompts ($np prompt tokens): $(cat p2.err)"
echo "ok   text output"

# One new token is sampled from the prefill's logits: no decode step, so
# the summary names no rate (it said "1 new tokens at 0.0 tok/s"), and
# --json's decode_ms and decode_tok_s are 0, the same fact as numbers.
"$KHUB" run --model tiny --prompt "one two" --max-new-tokens 1 --ignore-eos > one.out 2> one.err ||
    { cat one.err; fail "one token"; }
grep -Eqx "khub run: [0-9]+ prompt tokens at [0-9.]+ tok/s, 1 new token, no decode step to time \
\(load [0-9]+ ms, peak RSS [0-9]+ MiB\)" one.err || fail "one token: $(cat one.err)"
"$KHUB" run --model tiny --prompt "one two" --max-new-tokens 2 --ignore-eos > two1.out 2> two1.err ||
    { cat two1.err; fail "two tokens"; }
grep -Eq ", 2 new tokens at [0-9.]+ tok/s \(load" two1.err || fail "two tokens: $(cat two1.err)"
"$KHUB" run --model tiny --prompt "one two" --max-new-tokens 1 --ignore-eos --json |
    python3 -c 'import json, sys; t = json.load(sys.stdin)["timings"]
assert t["decode_ms"] == 0 and t["decode_tok_s"] == 0 and t["prefill_tok_s"] > 0, t' ||
    fail "one token --json"
echo "ok   one new token: no rate without a decode step, in text and --json"

# The default KV cache of a multi-request run is the paged pool, read by
# one paged_attention call per layer (docs/batching.md); its outputs above
# equal the --parallel 1 run and the solo processes, which use the dense
# `dynamic` cache: the two attention ops give the same bits. --cache
# dynamic (and --attn, or a khub.json) keeps the dense cache.
"$KHUB" run --model tiny --prompts-file two.txt --max-new-tokens 1 --explain > ex.out 2> ex.err ||
    { cat ex.err; fail "--explain of a prompts file"; }
grep -q '^kv_cache\[f32\]: khub/ref-cpu [0-9.]* :: paged_cache$' ex.out ||
    fail "default cache: $(grep '^kv_cache' ex.out)"
grep -q '^paged_attention\[f32\]: khub/cpu-avx' ex.out || fail "no paged attention in: $(cat ex.out)"
grep -qxF '    the paged pool by default: 16 sequences (max_seqs) and no cache or attention named' \
    ex.out || fail "no default line in: $(cat ex.out)"
# The choice is the library's, by the model's sequences: two --prompt's
# share the pool, one keeps the dense cache.
"$KHUB" run --model tiny --prompt a --prompt b --max-new-tokens 1 --explain > ex2.out 2> ex2.err ||
    { cat ex2.err; fail "--explain of two prompts"; }
grep -qxF '    the paged pool by default: 2 sequences (max_seqs) and no cache or attention named' \
    ex2.out || fail "two prompts: $(cat ex2.out)"
"$KHUB" run --model tiny --prompt a --max-new-tokens 1 --explain > ex0.out 2> ex0.err ||
    { cat ex0.err; fail "--explain of one prompt"; }
grep -q '^kv_cache\[f32\]: khub/ref-cpu [0-9.]* :: kv_cache$' ex0.out ||
    fail "one prompt: $(grep '^kv_cache' ex0.out)"
"$KHUB" run --model tiny --prompts-file two.txt --max-new-tokens 1 --explain --parallel 1 \
    > ex1.out 2> ex1.err || { cat ex1.err; fail "--explain --parallel 1"; }
grep -q '^kv_cache\[f32\]: khub/ref-cpu [0-9.]* :: kv_cache$' ex1.out ||
    fail "--parallel 1 cache: $(grep '^kv_cache' ex1.out)"
for flags in "--cache dynamic" "--attn sdpa"; do
    # shellcheck disable=SC2086
    "$KHUB" run --model tiny --prompts-file two.txt --max-new-tokens 1 --explain $flags \
        > exd.out 2> exd.err || { cat exd.err; fail "$flags"; }
    grep -q '^kv_cache\[f32\]: khub/ref-cpu [0-9.]* :: kv_cache$' exd.out ||
        fail "$flags: $(grep '^kv_cache' exd.out)"
    if grep -q 'paged' <(grep -v '^    ' exd.out); then fail "$flags: a paged role: $(cat exd.out)"; fi
done
echo "ok   the default cache of a batch is paged; one prompt, --parallel 1, --cache dynamic, --attn keep dense"

# f16 K/V: the guarantee holds per KV type (the batch equals its one-at-a-time
# run on f16); how many requests keep f32's tokens is stated, not asserted.
"$KHUB" run --model tiny --prompts-file prompts.jsonl --max-new-tokens 6 --ignore-eos \
    --parallel 16 --max-batch-tokens 48 --kv-type f16 --json > b16.json 2> b16.err ||
    { cat b16.err; fail "batched run, f16"; }
"$KHUB" run --model tiny --prompts-file prompts.jsonl --max-new-tokens 6 --ignore-eos \
    --parallel 1 --kv-type f16 --json > s16.json 2> s16.err || { cat s16.err; fail "solo run, f16"; }
python3 - b16.json s16.json batch.json << 'PY' || fail "f16 batched differs from f16 solo"
import json, sys
b, s, f32 = (json.load(open(p))["results"] for p in sys.argv[1:4])
assert len(b) == len(s) == 200
for x, y in zip(b, s):
    assert x["status"] == "ok" and x["tokens"] == y["tokens"], (x["index"], x, y)
same = sum(x["tokens"] == y["tokens"] for x, y in zip(b, f32))
print("ok   200 requests on f16 K/V: batched = --parallel 1; %d of 200 equal their f32 tokens"
      % same)
PY
for t in f32 f16; do
    "$KHUB" run --model tiny --prompts-file two.txt --max-new-tokens 1 --explain --kv-type $t \
        > kv$t.out 2> kv$t.err || { cat kv$t.err; fail "--explain --kv-type $t"; }
    grep -q "^kv_cache\[$t\]: khub/ref-cpu [0-9.]* :: paged_cache$" kv$t.out ||
        fail "--kv-type $t: $(grep '^kv_cache' kv$t.out)"
done
b32=$(sed -n 's/^kv_cache memory: \([0-9]*\) bytes per token$/\1/p' kvf32.out)
b16=$(sed -n 's/^kv_cache memory: \([0-9]*\) bytes per token$/\1/p' kvf16.out)
[ -n "$b32" ] && [ -n "$b16" ] && [ "$((b16 * 2))" = "$b32" ] ||
    fail "bytes per token: f32 '$b32', f16 '$b16'"
for v in f8 bf16 F16 ""; do
    "$KHUB" run --model tiny --prompt hi --kv-type "$v" > /dev/null 2> kvbad.err &&
        fail "--kv-type '$v' accepted"
    grep -qxF "khub run: --kv-type wants f32 or f16, got '$v'" kvbad.err ||
        fail "--kv-type '$v': $(cat kvbad.err)"
done
"$KHUB" run --model tiny --prompt hi --kv-type > /dev/null 2> kvnone.err && fail "--kv-type alone"
grep -qxF "khub run: --kv-type needs a value" kvnone.err || fail "--kv-type alone: $(cat kvnone.err)"
echo "ok   --kv-type: f16 in --explain ($b16 bytes per token, f32 $b32); bad values refused"

# Bad files: a clear message with the line, exit 1, nothing run.
bad() { # FILE-CONTENT EXPECTED-MESSAGE
    printf '%b' "$1" > bad.txt
    if "$KHUB" run --model tiny --prompts-file bad.txt > bad.out 2> bad.err; then
        fail "accepted: $1"
    fi
    grep -qF "$2" bad.err || fail "message for '$1': $(cat bad.err)"
}
bad 'ok\n\n{"prompt": "x",\n' 'bad.txt:3: malformed JSON object'
bad 'ok\n{"prompt": "x", "max_tokens": 0}\n' 'bad.txt:2: "max_tokens" must be an integer in [1, 1048576]'
bad '{"prompt": "x", "max_tokens": -3}\n' 'bad.txt:1: "max_tokens" must be an integer'
bad '{"prompt": "x", "colour": 1}\n' 'bad.txt:1: unknown setting "colour"'
bad '{"max_tokens": 2}\n' 'bad.txt:1: no "prompt"'
# a repeated setting (found by fuzz_prompts: a second "prompt" leaked the
# first, a second "stop" wrote past the first one's shorter array)
bad '{"prompt": "x", "prompt": "y"}\n' 'bad.txt:1: "prompt": this line already sets it'
bad '{"prompt": "x", "stop": ["a", "b", "c"], "stop": "d"}\n' \
    'bad.txt:1: "stop": this line already sets it'
bad '{"prompt": "x", "max_tokens": 2, "max_new_tokens": 3}\n' \
    'bad.txt:1: "max_new_tokens": this line already sets it'
bad '{"prompt": "x", "stop": [""]}\n' 'bad.txt:1: "stop" must hold non-empty strings'
bad '\n  \n' 'bad.txt: no prompts'
"$KHUB" run --model tiny --prompts-file nothere.txt > /dev/null 2> nf.err && fail "missing file"
grep -qF "nothere.txt: No such file" nf.err || fail "missing file: $(cat nf.err)"
"$KHUB" run --model tiny --prompts-file two.txt --prompt x > /dev/null 2> ex.err && fail "both"
grep -qF -- "--prompt and --prompts-file exclude each other" ex.err || fail "both: $(cat ex.err)"
"$KHUB" run --model tiny --prompts-file two.txt --max-batch-tokens 0 > /dev/null 2> z.err &&
    fail "zero max-batch-tokens"
grep -qF -- "--max-batch-tokens needs a number in [1, 65536], got '0'" z.err ||
    fail "zero: $(cat z.err)"
echo "ok   bad files and limits refused"

# A request longer than the cache fails alone; the others finish.
python3 -c 'print("short one"); print(" ".join(["cat"] * 80)); print("short two")' > long.txt
if "$KHUB" run --model tiny --prompts-file long.txt --max-context 48 --max-new-tokens 4 \
    --json > long.json 2> long.err; then
    fail "a failed request must make the exit status 1"
fi
python3 - long.json << 'PY' || fail "long request: $(cat long.json)"
import json, sys
r = json.load(open(sys.argv[1]))["results"]
assert [x["status"] for x in r] == ["ok", "KHUB_STATUS_CONTEXT_FULL", "ok"], r
assert [(x["index"], x["line"]) for x in r] == [(1, 1), (2, 2), (3, 3)], r
assert "request 2 has" in r[1]["error"] and "the KV cache holds 48 per sequence" in r[1]["error"]
assert len(r[0]["tokens"]) == 4 and len(r[2]["tokens"]) == 4
PY
"$KHUB" run --model tiny --prompts-file long.txt --max-context 48 --max-new-tokens 4 \
    > long.out 2> long.err && fail "text: exit 1 expected"
# Prompts are numbered from 1, as the batch numbers its requests (issue: "prompt 1 (line 2):
# request 2" named one request twice).
grep -qxF "khub run: prompt 2 (line 2): request 2 has 239 tokens; the KV cache holds 48 per \
sequence (raise max_context)" long.err || fail "text: $(cat long.err)"
[ "$(grep -c '^--- prompt' long.out)" = 2 ] || fail "text: $(cat long.out)"
echo "ok   a request longer than the cache fails alone"

# khub bench-batch (issue 13 item 8): one JSON line per request count.
"$KHUB" bench-batch --model tiny --seqs 1,4 --prompt-tokens 8 --gen-tokens 4 > bb.jsonl 2> bb.err ||
    { cat bb.err; fail "bench-batch"; }
python3 - bb.jsonl << 'PY' || fail "bench-batch output: $(cat bb.jsonl)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["seqs"] for r in rows] == [1, 4], rows
for r in rows:
    assert r["gen_tok_s"] > 0 and r["ttft_ms_max"] >= r["ttft_ms_median"] > 0, r
    assert r["peak_rss_kib"] > 0 and r["steps"] >= 4, r
    assert r["kv_type"] == "f16", r  # llama-batched-bench's default
    # All prompts fit the first step, which samples each first token: the
    # decode phase is the 3 steps after it, one token per request each.
    assert r["decode_steps"] == 3 and r["decode_tokens"] == 3 * r["seqs"], r
    assert r["decode_tok_s"] > 0 and r["decode_tok_s_cpu"] > 0, r
PY
"$KHUB" bench-batch --model tiny --seqs 2 --prompt-tokens 4 --gen-tokens 2 --kv-type f32 \
    > bb32.jsonl 2> bb32.err || { cat bb32.err; fail "bench-batch --kv-type f32"; }
grep -qF '"kv_type": "f32"' bb32.jsonl || fail "bench-batch --kv-type f32: $(cat bb32.jsonl)"
"$KHUB" bench-batch --model tiny --kv-type q8 > /dev/null 2> bbq.err && fail "bench-batch --kv-type q8"
grep -qxF "khub bench-batch: --kv-type wants f32 or f16, got 'q8'" bbq.err || fail "bbq: $(cat bbq.err)"
"$KHUB" bench-batch --model tiny --seqs 0 > /dev/null 2> bb0.err && fail "bench-batch --seqs 0"
grep -qF -- "--seqs needs an integer in [1, 256], got '0'" bb0.err || fail "bb0: $(cat bb0.err)"
# a --cache id that no loaded plugin has is refused, not timed as the dense cache
"$KHUB" bench-batch --model tiny --seqs 1 --cache nosuch/plugin > /dev/null 2> bbc.err &&
    fail "bench-batch --cache nosuch/plugin"
grep -qF -- "--cache nosuch/plugin: no loaded plugin has that id; use dynamic, paged or a loaded plugin's id" bbc.err ||
    fail "bbc: $(cat bbc.err)"
"$KHUB" bench-batch --model tiny --seqs 1 --cache khub/ref-cpu:nosuch > /dev/null 2> bbo.err &&
    fail "bench-batch --cache khub/ref-cpu:nosuch"
grep -qF -- '--cache khub/ref-cpu:nosuch: plugin khub/ref-cpu has no op "nosuch"' bbo.err ||
    fail "bbo: $(cat bbo.err)"
"$KHUB" bench-batch --model tiny --seqs 1 --prompt-tokens 4 --gen-tokens 2 --cache khub/ref-cpu:kv_cache \
    > /dev/null 2> bbk.err || { cat bbk.err; fail "bench-batch --cache khub/ref-cpu:kv_cache"; }
echo "ok   bench-batch"
echo "1 passed, 0 failed"
