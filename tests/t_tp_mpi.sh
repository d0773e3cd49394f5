#!/usr/bin/env bash
# t_tp_mpi.sh: tensor parallelism through mpirun and the CLI (issue 18) on
# SmolLM2-135M-Instruct Q4_1 (tools/fetch-model.sh):
#   - `mpirun -np 2 khub run --tp 2` gives `--tp 1`'s greedy tokens, 64 new
#     tokens on every prompt of tests/fixtures/smollm2_greedy.json (tp 3 on
#     the first five), and only rank 0 prints;
#   - continuous batching (--prompts-file) at tp 2 gives tp 1's texts;
#   - --explain prints the plan per tensor and the memory of each rank;
#   - tp 4 (3 KV heads) is refused naming the tensor; --tp 2 without mpirun
#     says how to launch;
#   - a rank killed with SIGKILL mid-generation ends the job within 30 s
#     with Open MPI's message naming the rank, not a hang;
#   - one rank given a file with one byte changed: the job stops before the
#     first token, naming the rank.
# Logits within 1e-4 of tp 1: test_tp (ranks as threads, same code path).
# Skips without mpirun, without MPI in the build, or without the model.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
DIR=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}
GGUF=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf
command -v mpirun > /dev/null || t_skip "mpirun absent (tools/install-deps.sh installs openmpi-bin)"
[ -f "$GGUF" ] || t_skip "$GGUF absent (run tools/fetch-model.sh)"
t_begin tp_mpi
# CI runs as root, which Open MPI refuses unless told; Open MPI's own
# allocations at exit are not ours to report (sanitizer builds).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
MPI=(mpirun --oversubscribe)

# Without mpirun: a singleton MPI job of one rank, refused with the launch line.
if "$KHUB" run --model "$GGUF" --prompt x --tp 2 > s.out 2> s.err; then fail "--tp 2 alone ran"; fi
grep -q "built without" s.err && t_skip "this khub was built without MPI: $(cat s.err)"
grep -q "khub run: --tp 2 but MPI started 1 rank; launch as mpirun -np 2 khub run --tp 2" s.err ||
    fail "--tp 2 alone: $(cat s.err)"
echo "ok   --tp 2 without mpirun refused"
if "$KHUB" run --model "$GGUF" --prompt x --tp-plan sum > s.out 2> s.err; then fail "--tp-plan sum ran"; fi
grep -q "khub run: --tp-plan wants reduce or gather, got 'sum'" s.err || fail "--tp-plan sum: $(cat s.err)"
echo "ok   --tp-plan sum refused"

# Greedy tokens of tp N against tp 1, five prompts per call.
mapfile -d '' -t P < <(python3 -c '
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
    sys.stdout.write(c["prompt_text"] + "\0")' "$SRC/tests/fixtures/smollm2_greedy.json")
[ ${#P[@]} -eq 10 ] || fail "expected 10 fixture prompts, read ${#P[@]}"
GEN=(--threads 1 --ignore-eos --max-new-tokens 64 --json)
same_tokens() { # A.json B.json: every result's tokens equal
    python3 - "$1" "$2" << 'PY'
import json, sys
a, b = (json.load(open(p))["results"] for p in sys.argv[1:3])
assert len(a) == len(b) == 5, (len(a), len(b))
for i, (x, y) in enumerate(zip(a, b)):
    assert len(x["tokens"]) == 64, (i, len(x["tokens"]))
    if x["tokens"] != y["tokens"]:
        k = next(j for j, (s, t) in enumerate(zip(x["tokens"], y["tokens"])) if s != t)
        sys.exit(f"prompt {i}: tokens differ from step {k}: {x['tokens'][k]} vs {y['tokens'][k]}")
PY
}
for g in 0 5; do
    args=()
    for i in $(seq "$g" $((g + 4))); do args+=(--prompt "${P[$i]}"); done
    "$KHUB" run --model "$GGUF" "${args[@]}" "${GEN[@]}" > t1_$g.json 2> t1_$g.err ||
        { cat t1_$g.err; fail "tp 1, prompts $g-$((g + 4))"; }
    "${MPI[@]}" -np 2 "$KHUB" run --model "$GGUF" --tp 2 "${args[@]}" "${GEN[@]}" > t2_$g.json \
        2> t2_$g.err || { cat t2_$g.err; fail "tp 2, prompts $g-$((g + 4))"; }
    same_tokens t1_$g.json t2_$g.json || fail "tp 2 vs tp 1, prompts $g-$((g + 4))"
    [ "$(grep -c '"results"' t2_$g.json)" = 1 ] || fail "tp 2: more than rank 0 printed"
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1]))
assert j["tp_size"] == 2 and j["tp_collectives"] > 64 * 60 and j["tp_comm_ms"] > 0, j' t2_$g.json ||
        fail "tp 2: --json lacks the collectives' count and time"
    echo "ok   tp 2 = tp 1: 64 greedy tokens of prompts $g-$((g + 4))"
done
"${MPI[@]}" -np 3 "$KHUB" run --model "$GGUF" --tp 3 "${args[@]}" "${GEN[@]}" > t3.json \
    2> t3.err || { cat t3.err; fail "tp 3"; }
same_tokens t1_5.json t3.json || fail "tp 3 vs tp 1"
echo "ok   tp 3 = tp 1: 64 greedy tokens of prompts 5-9"
# The gather plan (no sum across ranks): same tokens, and its plan printed.
"${MPI[@]}" -np 2 "$KHUB" run --model "$GGUF" --tp 2 --tp-plan gather "${args[@]}" "${GEN[@]}" \
    > tg.json 2> tg.err || { cat tg.err; fail "tp 2, gather plan"; }
same_tokens t1_5.json tg.json || fail "tp 2 gather plan vs tp 1"
"${MPI[@]}" -np 2 "$KHUB" run --model "$GGUF" --tp 2 --tp-plan gather --prompt "Hi" \
    --max-new-tokens 1 --explain > eg.out 2> eg.err || { cat eg.err; fail "gather --explain"; }
grep -qF "blk.*.ffn_down.weight              colwise   hidden rows 0-287 of 576 from the whole FFN activation (all-gathered), then all-gather" \
    eg.out || fail "gather plan --explain: $(cat eg.out)"
echo "ok   tp 2, gather plan = tp 1: 64 greedy tokens of prompts 5-9; plan printed"

# Continuous batching on top: rank 0 schedules, each step is broadcast.
printf '%s\n' "The capital of France is" "1, 1, 2, 3, 5, 8," \
    '{"prompt": "def add(a, b):", "max_tokens": 12}' > batch.txt
"$KHUB" run --model "$GGUF" --prompts-file batch.txt --max-new-tokens 16 --threads 1 --json \
    > b1.json 2> b1.err || { cat b1.err; fail "batch, tp 1"; }
"${MPI[@]}" -np 2 "$KHUB" run --model "$GGUF" --prompts-file batch.txt --max-new-tokens 16 \
    --threads 1 --tp 2 --json > b2.json 2> b2.err || { cat b2.err; fail "batch, tp 2"; }
python3 -c 'import json, sys
a, b = ([r["text"] for r in json.load(open(p))["results"]] for p in sys.argv[1:3])
assert len(a) == 3 and a == b, (a, b)' b1.json b2.json || fail "batch: tp 2 texts differ from tp 1"
echo "ok   --prompts-file (continuous batching) at tp 2 = tp 1"

# The plan, per tensor, and each rank's memory.
"${MPI[@]}" -np 2 "$KHUB" run --model "$GGUF" --tp 2 --prompt "Hi" --max-new-tokens 1 --explain \
    > e.out 2> e.err || { cat e.err; fail "--explain"; }
for want in "tp plan: rank 0 of 2 (reduce)" \
    "blk.*.attn_q.weight                colwise   query heads 0-5 of 9: rows 0-383" \
    "blk.*.attn_k.weight                colwise   KV heads 0-1 of 3: rows 0-127" \
    "blk.*.attn_output.weight           rowwise   columns of the query heads above, then all-reduce" \
    "blk.*.ffn_down.weight              rowwise   columns of the channels above, then all-reduce" \
    "output (tied)                      colwise   tokens 0-24575 of 49152, logits all-gathered"; do
    grep -qF -- "$want" e.out || fail "--explain lacks '$want': $(cat e.out)"
done
grep -qF "blk.*.attn_q.weight                colwise   query heads 6-8 of 9: rows 384-575" e.err ||
    fail "rank 1's plan on stderr: $(cat e.err)"
grep -Eq "^tp memory: rank 0 holds [0-9]+ bytes of weights" e.out || fail "rank 0 memory"
grep -Eq "^tp memory: rank 1 holds [0-9]+ bytes of weights" e.err || fail "rank 1 memory"
echo "ok   --explain: $(grep -h '^tp memory' e.out e.err | tr '\n' ';')"

# Sizes that do not divide: refused, naming the tensor.
if "${MPI[@]}" -np 4 "$KHUB" run --model "$GGUF" --tp 4 --prompt x > r.out 2> r.err; then
    fail "tp 4 ran"
fi
grep -q "tp_size 4 cannot split 'blk.0.attn_k.weight': 3 KV heads (9 query heads) over 4 ranks" \
    r.err || fail "tp 4 refusal: $(cat r.err)"
echo "ok   tp 4 refused: 3 KV heads"

# A rank killed mid-generation: the job ends, in bounded time, saying so.
"${MPI[@]}" -np 2 "$KHUB" run --model "$GGUF" --tp 2 --threads 1 --prompt "Once upon a time" \
    --ignore-eos --max-new-tokens 3000 --max-context 3100 > k.out 2> k.err &
JOB=$!
for _ in $(seq 300); do [ -s k.out ] && break; sleep 0.1; done
[ -s k.out ] || { kill "$JOB"; fail "no token streamed in 30 s: $(cat k.err)"; }
rank_pid() { # the process of JOB's tree whose environment says rank $1
    local p q
    for p in $(pgrep -P "$JOB"); do
        if tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -x "OMPI_COMM_WORLD_RANK=$1" > /dev/null; then
            echo "$p"
            return
        fi
        for q in $(pgrep -P "$p"); do
            tr '\0' '\n' < "/proc/$q/environ" 2> /dev/null |
                grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$q"; return; }
        done
    done
}
R1=$(rank_pid 1)
[ -n "$R1" ] || { kill "$JOB"; fail "rank 1's process not found under mpirun $JOB"; }
kill -9 "$R1"
start=$(date +%s)
while kill -0 "$JOB" 2> /dev/null && [ $(($(date +%s) - start)) -lt 30 ]; do sleep 0.2; done
if kill -0 "$JOB" 2> /dev/null; then
    kill "$JOB"
    fail "the job still runs 30 s after rank 1 was killed"
fi
rc=0
wait "$JOB" || rc=$?
[ "$rc" -ne 0 ] || fail "the job exited 0 after rank 1 was killed"
grep -Eq "process rank 1 with PID [0-9]+ .*exited on signal 9" k.err ||
    fail "no message naming rank 1: $(cat k.err)"
echo "ok   rank 1 killed: job ended in $(($(date +%s) - start)) s, exit $rc"

# One rank on different bytes: refused before the first token, naming it.
cp "$GGUF" other.gguf
t_flip_byte other.gguf $(($(stat -c %s other.gguf) - 4096))
if "${MPI[@]}" -np 1 "$KHUB" run --model "$GGUF" --tp 2 --prompt "Hi" : \
    -np 1 "$KHUB" run --model other.gguf --tp 2 --prompt "Hi" > d.out 2> d.err; then
    fail "a mismatched model ran"
fi
grep -q "tp rank 1 loaded different model bytes than rank 0" d.err ||
    fail "mismatch message: $(cat d.err)"
[ ! -s d.out ] || fail "tokens printed before the mismatch was found: $(cat d.out)"
echo "ok   mismatched file on rank 1 refused before the first token"
echo "t_tp_mpi: all passed"
