#!/usr/bin/env bash
# tools/bench/tp.sh: tensor parallelism on this machine (issue 18 item 7):
# prefill and decode tok/s of `khub run` at tp 1 x 1 thread, tp 1 x 2
# threads and tp 2 x 1 thread (mpirun -np 2) with the reduce plan and with
# the gather plan (--tp-plan gather), interleaved round by round so a
# drifting machine load hits all four alike, and tp 2's communication share
# (rank 0's wall time inside collectives, waits for the other rank
# included). Prints one line per configuration with the runs and medians.
#   tools/bench/tp.sh [ROUNDS=3] [MODEL=SmolLM2 Q4_1] [NEW=64]
set -euo pipefail
ROUNDS=${1:-3}
MODEL=${2:-$(bash "$(dirname "$0")/../fetch-model.sh")}
NEW=${3:-64}
KHUB=${KHUB_BIN:-build/bin/khub}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PROMPT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cases"][5]["prompt_text"])' \
    "$(dirname "$0")/../../tests/fixtures/smollm2_greedy.json")
GEN=(--model "$MODEL" --prompt "$PROMPT" --max-new-tokens "$NEW" --ignore-eos --json)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; load: $(uptime | sed 's/.*load average: //')"
for r in $(seq "$ROUNDS"); do
    "$KHUB" run "${GEN[@]}" --threads 1 > "$OUT/a$r.json" 2> /dev/null
    "$KHUB" run "${GEN[@]}" --threads 2 > "$OUT/b$r.json" 2> /dev/null
    mpirun -np 2 --oversubscribe "$KHUB" run "${GEN[@]}" --threads 1 --tp 2 > "$OUT/c$r.json" 2> /dev/null
    mpirun -np 2 --oversubscribe "$KHUB" run "${GEN[@]}" --threads 1 --tp 2 --tp-plan gather \
        > "$OUT/d$r.json" 2> /dev/null
done
python3 - "$OUT" "$ROUNDS" << 'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
for key, name in (("a", "tp 1 x 1 thread        "), ("b", "tp 1 x 2 threads       "),
                  ("c", "tp 2 x 1 thread        "), ("d", "tp 2 x 1 thread, gather")):
    runs = [json.load(open(f"{out}/{key}{r}.json")) for r in range(1, rounds + 1)]
    pre = [j["timings"]["prefill_tok_s"] for j in runs]
    dec = [j["timings"]["decode_tok_s"] for j in runs]
    share = [100 * j.get("tp_comm_ms", 0) / (j["timings"]["prefill_ms"] + j["timings"]["decode_ms"])
             for j in runs]
    print(f"{name}: prefill {statistics.median(pre):6.1f} tok/s, decode {statistics.median(dec):6.1f}"
          f" tok/s (runs: prefill {', '.join(f'{x:.1f}' for x in pre)}; decode "
          f"{', '.join(f'{x:.1f}' for x in dec)})"
          + (f"; collectives {statistics.median(share):.0f}% of rank 0's time" if key in "cd" else ""))
PY
echo "# load after: $(uptime | sed 's/.*load average: //')"
