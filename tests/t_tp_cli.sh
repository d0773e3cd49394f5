#!/usr/bin/env bash
# t_tp_cli.sh: `--tp N` in the commands other than `khub run` (issue 18; run
# is tests/t_tp_mpi.sh) through mpirun on the tiny random Llama
# (tools/make-tiny-model.py; 2 KV heads, so tp 2 splits it):
#   - `khub serve-model --tp 2` answers /v1/completions and
#     /v1/chat/completions (greedy, 16 tokens) with tp 1's text; a kernel
#     reload swaps on both ranks (khub/ref-cpu for attention: 200, and the
#     text stays tp 1's); SIGTERM to rank 0 stops every rank (mpirun exits
#     0, one "stopped" line);
#   - a reload that one rank cannot make (rank 1 started with
#     KHUB_CPU_LEVEL=x86-64 and asked for khub/cpu-avx2, an MPMD launch):
#     422 with rank 1's reason, both ranks keep khub/ref-cpu, rank 1 says
#     so on stderr, and the text is still tp 1's;
#   - a serve-model rank killed with SIGKILL mid-request ends the job within
#     30 s with Open MPI's message naming the rank;
#   - `khub chat --tp 2`: two turns, the same text as tp 1;
#   - `khub bench-model --tp 2` and `khub bench-batch --tp 2`: rank 0 alone
#     prints, bench-model with "tp": 2 and its collectives' share;
#   - `khub chat --tp 2` without mpirun says how to launch.
# Skips without mpirun or without MPI in the build.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
command -v mpirun > /dev/null || t_skip "mpirun absent (tools/install-deps.sh installs openmpi-bin)"
command -v curl > /dev/null || t_skip "curl is not installed"
t_begin tp_cli
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
MPI=(mpirun --oversubscribe)
python3 "$SRC/tools/make-tiny-model.py" tiny > /dev/null

rc=0
"$KHUB" chat --model tiny --tp 2 < /dev/null > s.out 2> s.err || rc=$?
grep -q "built without" s.err && t_skip "this khub was built without MPI: $(cat s.err)"
[ "$rc" = 1 ] || fail "chat --tp 2 without mpirun: exit $rc"
grep -qF "khub chat: --tp 2 but MPI started 1 rank; launch as mpirun -np 2 khub chat --tp 2 ..." \
    s.err || fail "chat --tp 2 without mpirun: $(cat s.err)"
echo "ok   chat --tp 2 without mpirun says how to launch"

# ---- serve-model -------------------------------------------------------------
JOB=
rank_pid() { # the process of JOB's tree whose environment says rank $1
    local p
    for p in $(pgrep -P "$JOB"); do
        tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -x "OMPI_COMM_WORLD_RANK=$1" > /dev/null &&
            { echo "$p"; return; }
    done
}
start_server() { # OUT TP [RANK1_ENV]: sets JOB and BASE; rank 1 gets env RANK1_ENV
    local out=$1 launch=("$KHUB") flags=(--model tiny --port 0 --threads 1 --api-key k --tp "$2")
    [ "$2" = 1 ] || launch=("${MPI[@]}" -np "$2" "$KHUB")
    [ -z "${3:-}" ] || launch=("${MPI[@]}" -np 1 "$KHUB" serve-model "${flags[@]}" : -np 1
        -x "$3" "$KHUB")
    "${launch[@]}" serve-model "${flags[@]}" > "$out" 2> "$out.err" &
    JOB=$!
    for _ in $(seq 300); do
        grep -q http "$out" 2> /dev/null && break
        kill -0 $JOB 2> /dev/null || fail "serve-model exited: $(cat "$out.err")"
        sleep 0.1
    done
    BASE=$(grep -o 'http://[0-9.:]*' "$out" | head -n 1 || true)
    [ -n "$BASE" ] || fail "serve-model printed no address: $(cat "$out" "$out.err")"
}
ask() { # NAME: the completion and the chat answer into NAME.txt
    curl -sf -H "Authorization: Bearer k" "$BASE/v1/completions" \
        -d '{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}' > "$1.c"
    curl -sf -H "Authorization: Bearer k" "$BASE/v1/chat/completions" \
        -d '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}' > "$1.h"
    python3 - "$1" << 'PY'
import json, sys
c, h = (json.load(open(sys.argv[1] + s)) for s in (".c", ".h"))
assert c["usage"]["completion_tokens"] == 16 and h["usage"]["completion_tokens"] == 16, (c, h)
t = [c["choices"][0]["text"], h["choices"][0]["message"]["content"]]
assert all(t), t
open(sys.argv[1] + ".txt", "w").write(json.dumps(t))
PY
}
start_server s1.out 1
ask one
kill -TERM $JOB && wait $JOB || fail "tp 1 server: $(cat s1.out.err)"
start_server s2.out 2
ask two
cmp one.txt two.txt || fail "serve-model tp 2 answers $(cat two.txt), tp 1 $(cat one.txt)"
echo "ok   serve-model --tp 2 answers tp 1's greedy text: $(cat two.txt)"
reload() { # KERNEL: the answer's body, then its status
    curl -s -w '\n%{http_code}' -H "Authorization: Bearer k" "$BASE/v1/kernels/reload" \
        -d "{\"role\": \"attention\", \"kernel\": \"$1\"}"
}
attention() { # the binding rank 0 serves attention with
    curl -s -H "Authorization: Bearer k" "$BASE/v1/kernels" | python3 -c 'import json, sys
print([e["binding"] for e in json.load(sys.stdin)["data"] if e["role"] == "attention[f32]"])'
}
out=$(reload khub/ref-cpu)
[ "$(tail -n 1 <<< "$out")" = 200 ] && grep -qF '"binding":"khub/ref-cpu 0.1.0 :: attention"' \
    <<< "$out" || fail "reload under tp: $out"
[ "$(attention)" = "['khub/ref-cpu 0.1.0 :: attention']" ] || fail "after the reload: $(attention)"
ask again
cmp one.txt again.txt || fail "after the reload: $(cat again.txt)"
echo "ok   a kernel reload under --tp 2 swaps on every rank (200), the text stays tp 1's"
R0=$(rank_pid 0)
[ -n "$R0" ] || fail "rank 0's process not found under mpirun $JOB"
kill -TERM "$R0"
rc=0
wait $JOB || rc=$?
[ "$rc" = 0 ] || fail "SIGTERM to rank 0: mpirun exit $rc: $(cat s2.out.err)"
[ "$(grep -c 'khub serve-model: stopped: 6 requests, 4 completions' s2.out.err)" = 1 ] ||
    fail "stop: $(cat s2.out.err)"
echo "ok   SIGTERM to rank 0 stops every rank (mpirun exit 0)"

# A reload that rank 1 cannot make: every rank keeps its kernel.
AVX2=0
"$KHUB" run --model tiny --prompt hi --max-new-tokens 1 --explain 2> /dev/null |
    grep -q '^attention\[f32\]: khub/cpu-avx2 ' && AVX2=1
if [ "$AVX2" = 1 ]; then
    start_server f.out 2 KHUB_CPU_LEVEL=x86-64
    [ "$(tail -n 1 <<< "$(reload khub/ref-cpu)")" = 200 ] || fail "reload to khub/ref-cpu"
    out=$(reload khub/cpu-avx2)
    [ "$(tail -n 1 <<< "$out")" = 422 ] || fail "a reload rank 1 cannot make: $out"
    grep -qF '"message":"tp rank 1: tiny: khub/cpu-avx2 cannot serve attention: khub/cpu-avx2 0.1.0 for attention is rejected: needs cpu avx2 fma f16c; nothing changed"' \
        <<< "$out" || fail "rank 1's reason: $out"
    grep -qF '"code":"KHUB_STATUS_NO_KERNEL"' <<< "$out" || fail "rank 1's status: $out"
    [ "$(attention)" = "['khub/ref-cpu 0.1.0 :: attention']" ] ||
        fail "after the failed reload rank 0 serves $(attention)"
    grep -qF "tp rank 1 kept its kernels: tiny: khub/cpu-avx2 cannot serve attention" f.out.err ||
        fail "rank 1 did not say it kept its kernels: $(cat f.out.err)"
    ask failed
    cmp one.txt failed.txt || fail "after the failed reload: $(cat failed.txt)"
    kill -TERM "$(rank_pid 0)"
    wait $JOB || fail "stopping the MPMD job: $(cat f.out.err)"
    echo "ok   a reload rank 1 cannot make: 422 with rank 1's reason, every rank keeps its kernel"
else
    echo "skip a reload rank 1 cannot make: this CPU does not run khub/cpu-avx2"
fi

# A rank killed while a long request runs: the job ends, saying which rank.
start_server k.out 2
curl -s -N -H "Authorization: Bearer k" "$BASE/v1/completions" -d '{"prompt": "Once",
    "max_tokens": 400, "ignore_eos": true, "stream": true}' > k.stream 2> /dev/null &
for _ in $(seq 300); do [ -s k.stream ] && break; sleep 0.1; done
[ -s k.stream ] || fail "no token streamed: $(cat k.out.err)"
R1=$(rank_pid 1)
[ -n "$R1" ] || fail "rank 1's process not found under mpirun $JOB"
kill -9 "$R1"
begin=$(date +%s)
while kill -0 $JOB 2> /dev/null && [ $(($(date +%s) - begin)) -lt 30 ]; do sleep 0.2; done
kill -0 $JOB 2> /dev/null && { kill $JOB; fail "serve-model still runs 30 s after rank 1 died"; }
rc=0
wait $JOB || rc=$?
[ "$rc" != 0 ] || fail "the job exited 0 after rank 1 was killed"
grep -q "process rank 1 .* on signal 9" k.out.err || fail "rank 1's death: $(cat k.out.err)"
echo "ok   rank 1 killed mid-request: the job ended in $(($(date +%s) - begin)) s (exit $rc)"

# ---- chat ------------------------------------------------------------------
printf 'Hello there\nTell me more\n' > turns.txt
"$KHUB" chat --model tiny --max-new-tokens 12 --threads 1 < turns.txt > c1.out 2> c1.err ||
    fail "chat tp 1: $(cat c1.err)"
"${MPI[@]}" -np 2 "$KHUB" chat --model tiny --tp 2 --max-new-tokens 12 --threads 1 \
    < turns.txt > c2.out 2> c2.err || fail "chat tp 2: $(cat c2.err)"
[ "$(grep -c '^> ..*' c1.out)" = 1 ] && [ "$(wc -c < c1.out)" -gt 30 ] ||
    fail "chat tp 1 did not answer twice: $(cat c1.out)"
cmp c1.out c2.out || fail "chat tp 2: $(cat c2.out) vs tp 1: $(cat c1.out)"
echo "ok   chat --tp 2: two turns equal to tp 1"

# ---- benchmarks --------------------------------------------------------------
"${MPI[@]}" -np 2 "$KHUB" bench-model --model tiny --tp 2 -p 16 -n 8 -r 2 > bm.out 2> bm.err ||
    fail "bench-model --tp 2: $(cat bm.err)"
python3 - bm.out << 'PY' || fail "bench-model --tp 2: $(cat bm.out)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["test"] for r in rows] == ["pp16", "tg8"], rows
assert all(r["tp"] == 2 and 0 < r["tp_comm_share"] <= 1 for r in rows), rows
PY
"${MPI[@]}" -np 2 "$KHUB" bench-batch --model tiny --tp 2 --seqs 1,3 --prompt-tokens 8 \
    --gen-tokens 4 --threads 1 > bb.out 2> bb.err || fail "bench-batch --tp 2: $(cat bb.err)"
python3 - bb.out << 'PY' || fail "bench-batch --tp 2: $(cat bb.out)"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["seqs"] for r in rows] == [1, 3] and rows[1]["steps"] >= 4, rows
PY
echo "ok   bench-model and bench-batch --tp 2: rank 0 prints"
