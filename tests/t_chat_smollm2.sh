#!/usr/bin/env bash
# t_chat_smollm2.sh: `khub chat` on the real SmolLM2-135M-Instruct (Q4_1
# GGUF, the default kernels), its input piped: two turns answer what the
# model knows (Paris, then Berlin), the second turn reuses the whole cache of
# the first (/stats: every cached token reused, only the new message and the
# template's tokens computed), and the second answer equals the answer to
# the same conversation computed from scratch (/clear, then /load of the
# conversation up to the second question, which is answered at once with a
# whole prefill). Labelled slow (a real model; tens of seconds under the
# sanitizers).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin chat_smollm2
command -v python3 > /dev/null || t_skip "python3 absent"
DIR=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}
GGUF=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || t_skip "$GGUF absent (run tools/fetch-model.sh)"

printf '%s\n' "What is the capital of France?" "/stats" "And what is the capital of Germany?" \
    "/stats" "/save two.json" "/exit" |
    "$KHUB" chat --model "$GGUF" --max-new-tokens 40 --threads 2 > out.txt 2> err.txt ||
    fail "khub chat: exit $?: $(cat err.txt)"
python3 - << 'PY'
import json, re, sys

def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)

m = json.load(open("two.json"))["messages"]
if [x["role"] for x in m] != ["user", "assistant", "user", "assistant"]:
    fail("roles: %r" % m)
if "Paris" not in m[1]["content"] or "Berlin" not in m[3]["content"]:
    fail("answers: %r / %r" % (m[1]["content"], m[3]["content"]))
stats = re.findall(r"\[last turn: prompt (\d+) tokens \((\d+) reused from the cache, (\d+) "
                   r"computed in [\d.]+ ms\); answer (\d+) tokens in [\d.]+ ms \([\d.]+ tok/s\); "
                   r"cache (\d+) of 4096 tokens\]", open("err.txt").read())
if len(stats) != 2:
    fail("/stats lines: %r" % open("err.txt").read())
(p1, r1, c1, n1, k1), (p2, r2, c2, n2, k2) = [tuple(map(int, s)) for s in stats]
if r1 != 0 or c1 != p1 or k1 != p1 + n1:
    fail("turn 1: %r" % (stats[0],))
if r2 != k1 or c2 != p2 - k1 or c2 > p2 - p1:
    fail("turn 2 did not reuse turn 1's cache: %r after %r" % (stats[1], stats[0]))
json.dump({"messages": m[:3]}, open("three.json", "w"))
PY
printf '%s\n' "/load three.json" "/save again.json" "/exit" |
    "$KHUB" chat --model "$GGUF" --max-new-tokens 40 --threads 2 > out2.txt 2> err2.txt ||
    fail "khub chat /load: exit $?: $(cat err2.txt)"
python3 - << 'PY'
import json, sys
a, b = json.load(open("two.json"))["messages"], json.load(open("again.json"))["messages"]
if a != b:
    print("FAIL: turn 2 with the cache %r, from scratch %r" % (a[3], b[3:]), file=sys.stderr)
    sys.exit(1)
PY
echo "ok      chat on SmolLM2: Paris, Berlin, turn 2 reused turn 1's cache and equals scratch"
echo "1 passed, 0 failed, 0 skipped"
