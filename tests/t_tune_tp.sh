#!/usr/bin/env bash
# t_tune_tp.sh: `khub tune`'s parallelism lever (issue 17) on the tiny
# random Llama (tools/make-tiny-model.py: 4 query heads, 2 KV heads, ffn
# 128, vocab 704):
#   - unavailable, with the exact reason, when mpirun is not on PATH (tune
#     run with a PATH that lacks it), when this khub was built without MPI,
#     and for --tp 3, which the heads do not divide (the executor refuses the
#     same split under mpirun, so the check is not stricter than the load);
#   - where Open MPI is present, `tp=2` measured as a job of two ranks on the
#     same workload: its memory per rank (the largest rank's, with all ranks'
#     sum beside it, and the verdict says so), the same greedy tokens and
#     perplexity as the baseline (tp 2 computes the same model), and, with
#     the baseline slowed (baseline:slow), recommended: its flags carry
#     --tp 2, the validation line launches mpirun, and the saved khub.json
#     runs with them under mpirun.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin tune_tp
command -v python3 > /dev/null || t_skip "python3 absent"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
python3 "$SRC/tools/make-tiny-model.py" tiny > /dev/null
cat > w.jsonl << 'EOF'
{"concurrency": 2}
{"prompt": "The capital of France is", "max_tokens": 8}
{"prompt": "the cat sat on the mat and the dog sat on the log", "max_tokens": 12}
EOF
reason() { # JSON: the tp row's state and reason, one line
    python3 -c 'import json,sys
r = json.load(open(sys.argv[1])); rows = [c for c in r["candidates"] if c["lever"] == "parallelism"]
assert len(rows) == 1, rows
print(rows[0]["name"], rows[0]["state"], rows[0].get("reason", ""))' "$1"
}
MPI_BUILT=1
"$KHUB" tune --model tiny --workload w.jsonl --levers parallelism --time-budget 300 --json \
    > built.json 2> built.err || { cat built.err; fail "tune --levers parallelism"; }
if reason built.json | grep "built without MPI" > /dev/null; then
    MPI_BUILT=0
    [ "$(reason built.json)" = "tp=2 skipped unavailable: this khub was built without MPI (install libopenmpi-dev, tools/install-deps.sh, and configure again)" ] ||
        fail "no-MPI reason: $(reason built.json)"
    echo "ok   built without MPI: the lever is unavailable with the reason"
fi

# No mpirun on PATH: tune itself needs nothing from PATH.
mkdir empty
if [ $MPI_BUILT = 1 ]; then
    PATH="$T/empty" "$KHUB" tune --model tiny --workload w.jsonl --levers parallelism \
        --time-budget 300 --json > nompi.json 2> nompi.err || { cat nompi.err; fail "PATH without mpirun"; }
    got=$(reason nompi.json)
    [ "$got" = "tp=2 skipped unavailable: mpirun is not on PATH (tensor parallelism runs one process per rank under it; tools/install-deps.sh installs Open MPI's openmpi-bin)" ] ||
        fail "no mpirun: $got"
    echo "ok   no mpirun on PATH: unavailable with the reason"
fi

# --tp 3 over 2 KV heads and 4 query heads: unavailable, before anything runs.
"$KHUB" tune --model tiny --workload w.jsonl --levers parallelism --tp 3 --time-budget 300 \
    --json > tp3.json 2> tp3.err || { cat tp3.err; fail "tune --tp 3"; }
got=$(reason tp3.json)
if [ $MPI_BUILT = 1 ] && command -v mpirun > /dev/null; then
    [ "$got" = "tp=3 skipped unavailable: tp 3 cannot split the model: 2 KV heads (4 query heads) over 3 ranks needs at least 3 KV heads, or a rank count that is a multiple of the KV heads and divides the query heads" ] ||
        fail "tp 3: $got"
    # the executor refuses the same split
    if mpirun --oversubscribe -np 3 "$KHUB" run --model tiny --tp 3 --prompt hi \
        --max-new-tokens 2 > run3.out 2> run3.err; then
        fail "khub run --tp 3 on the tiny model loaded"
    fi
    grep -q "tp_size 3 cannot split" run3.err || fail "khub run --tp 3: $(cat run3.err)"
    echo "ok   --tp 3: the heads do not divide, unavailable with the reason (the load agrees)"
fi
for bad in 1 65 x; do
    if "$KHUB" tune --model tiny --tp $bad > /dev/null 2> bad.err; then fail "--tp $bad accepted"; fi
    grep -qF "khub tune: --tp needs a number in [2, 64], got '$bad'" bad.err ||
        fail "--tp $bad: $(cat bad.err)"
done
echo "ok   --tp out of range refused"

[ $MPI_BUILT = 1 ] || t_skip "this khub was built without MPI: nothing to measure"
command -v mpirun > /dev/null || t_skip "mpirun absent (tools/install-deps.sh installs openmpi-bin)"

# Measured: memory per rank, same tokens and perplexity; recommended when
# the baseline is slowed.
"$KHUB" tune --model tiny --workload w.jsonl --goal throughput --levers parallelism \
    --inject-failure baseline:slow --time-budget 300 --json --save rec.json > m.json 2> m.err ||
    { cat m.err; fail "tune measuring tp=2"; }
python3 - m.json rec.json << 'PY' || fail "tp=2 row or recommendation"
import json, sys
r = json.load(open(sys.argv[1]))
rows = {c["name"]: c for c in r["candidates"]}
tp, base = rows["tp=2"], rows["baseline#1"]
assert tp["state"] == "measured", tp
m, b = tp["measured"], base["measured"]
assert m["tp_ranks"] == 2, m
assert m["peak_rss_all_ranks_bytes"] >= m["peak_rss_bytes"] > 0, m
assert m["peak_rss_all_ranks_bytes"] <= 2 * m["peak_rss_bytes"], m
assert "peak RSS per rank (the largest of 2; " in tp["verdict"], tp["verdict"]
assert m["weight_bytes"] < b["weight_bytes"], (m, b)     # rank 0 holds its shards only
assert m["generated_tokens"] == b["generated_tokens"] == 20, (m, b)
assert m["token_agreement"] == 1.0, m
assert m["perplexity_positions"] == b["perplexity_positions"] > 100, (m, b)
assert abs(m["perplexity"] / b["perplexity"] - 1) < 1e-3, (m["perplexity"], b["perplexity"])
assert m["threads"] >= 1 and tp["run_flags"] == "--tp 2", tp
rec = r["recommendation"]
assert rec["name"] == "tp=2" and tp["winner"], (rec, tp)
assert rec["run_flags"] == "--tp 2", rec
assert json.loads(open(sys.argv[2]).read()) == json.loads(rec["khub_json"])
print("tp=2:", tp["verdict"])
PY
echo "ok   tp=2 measured: memory per rank, same tokens and perplexity; recommended when faster"

"$KHUB" tune --model tiny --workload w.jsonl --goal throughput --levers parallelism \
    --inject-failure baseline:slow --time-budget 300 > m.txt 2> m.err ||
    { cat m.err; fail "tune text report"; }
grep -qF "mpirun -np 2 khub run --model tiny --kernels khub.json --tp 2" m.txt ||
    fail "validation line: $(grep -A3 Validation m.txt)"
grep -qF "tp=2: measured with its 2 ranks on this one machine" m.txt || fail "open question"
grep -qF "peak RSS per rank" m.txt || fail "per rank not said in the table"
mpirun --oversubscribe -np 2 "$KHUB" run --model tiny --kernels rec.json --tp 2 --prompt hi \
    --max-new-tokens 2 > run.out 2> run.err || { cat run.err; fail "mpirun khub run --tp 2"; }
echo "ok   text report: per rank, the validation under mpirun; the recommendation runs"
echo "all passed"
