#!/usr/bin/env bash
# serve.sh: khub serve-model side by side with llama.cpp's llama-server on
# the same model file, threads and parallel slots (issue 16 item 8). Both
# servers run at once on loopback (an idle one takes no CPU); for each client
# count N the rounds alternate which server goes first, and each run is
# tools/bench/serve_clients.py: N concurrent streaming clients, greedy
# counting prompts (~35 tokens), --max-tokens new tokens each.
#
#   tools/bench/serve.sh --llama-server PATH [--model GGUF] [--khub BIN]
#                        [--threads 2] [--parallel 32] [--rounds 3]
#                        [--max-tokens 128] [--clients "1 8 32"]
#
# Prints one JSON line per run and a table of medians with the khub/llama
# ratio of generated tokens/s and of p99 time to first token. llama-server is
# not part of khub: build it outside the repository (docs/performance.md
# says how).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}/SmolLM2-135M-Instruct.Q4_1.gguf
KHUB=build/bin/khub
LLAMA=
THREADS=2
PARALLEL=32
ROUNDS=3
MAXTOK=128
CLIENTS="1 8 32"
while [ $# -gt 0 ]; do
    case $1 in
    --llama-server) LLAMA=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --khub) KHUB=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --parallel) PARALLEL=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --max-tokens) MAXTOK=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "serve.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x "$LLAMA" ] || { echo "serve.sh: --llama-server PATH (an executable) is required" >&2; exit 2; }
[ -x "$KHUB" ] || { echo "serve.sh: $KHUB not built (cmake --build build)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "serve.sh: no model at $MODEL (tools/fetch-model.sh)" >&2; exit 2; }

T=$(mktemp -d /tmp/khub-bench-serve-XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null || true; done; rm -rf "$T"; }
trap cleanup EXIT
CTX=512 # per sequence: prompt + answer fit

"$KHUB" serve-model --model "$MODEL" --port 0 --threads "$THREADS" --parallel "$PARALLEL" \
    --max-context $CTX --max-queue 256 > "$T/khub.out" 2> "$T/khub.err" &
PIDS+=($!)
"$LLAMA" -m "$MODEL" --host 127.0.0.1 --port 18931 -t "$THREADS" -tb "$THREADS" \
    --parallel "$PARALLEL" -c $((CTX * PARALLEL)) > "$T/llama.out" 2> "$T/llama.err" &
PIDS+=($!)
KB=
for _ in $(seq 300); do
    KB=$(grep -o 'http://[0-9.:]*' "$T/khub.out" | head -n 1 || true)
    [ -n "$KB" ] && curl -sf http://127.0.0.1:18931/health > /dev/null 2>&1 && break
    sleep 0.2
done
[ -n "$KB" ] || { echo "serve.sh: khub serve-model did not start: $(cat "$T/khub.err")" >&2; exit 1; }
curl -sf http://127.0.0.1:18931/health > /dev/null ||
    { echo "serve.sh: llama-server did not start: $(tail -5 "$T/llama.err")" >&2; exit 1; }
LB=http://127.0.0.1:18931

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
    "load $(cut -d' ' -f1-3 /proc/loadavg); threads $THREADS, parallel $PARALLEL," \
    "max_tokens $MAXTOK, rounds $ROUNDS"
run() { # LABEL BASE N
    local n=$3 reqs=$((32 / $3 < 1 ? 1 : 32 / $3))
    [ "$reqs" -gt 4 ] && reqs=4
    python3 tools/bench/serve_clients.py --base "$2" --clients "$n" --requests "$reqs" \
        --max-tokens "$MAXTOK" --label "$1" | tee -a "$T/runs.jsonl"
}
for n in $CLIENTS; do
    run warmup "$KB" 1 > /dev/null
    run warmup "$LB" 1 > /dev/null
    for r in $(seq "$ROUNDS"); do
        if [ $((r % 2)) = 1 ]; then
            run khub "$KB" "$n"; run llama "$LB" "$n"
        else
            run llama "$LB" "$n"; run khub "$KB" "$n"
        fi
    done
done
python3 - "$T/runs.jsonl" << 'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("\n| clients | server | gen tok/s | req/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | failed |")
print("|---|---|---|---|---|---|---|---|---|")
med = {}
for n in sorted({r["clients"] for r in runs}):
    for s in ("khub", "llama"):
        rs = [r for r in runs if r["clients"] == n and r["label"] == s]
        m = {k: statistics.median(r[k] for r in rs) for k in
             ("gen_tok_per_s", "req_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")}
        med[n, s] = m
        print(f"| {n} | {s} | {m['gen_tok_per_s']:.1f} | {m['req_per_s']:.2f} | {m['ttft_p50_ms']:.0f} | "
              f"{m['ttft_p99_ms']:.0f} | {m['itl_p50_ms']:.1f} | {m['itl_p99_ms']:.1f} | "
              f"{sum(r['failed'] for r in rs)} |")
print()
for n in sorted({r["clients"] for r in runs}):
    k, l = med[n, "khub"], med[n, "llama"]
    print(f"clients {n}: khub/llama generated tok/s {k['gen_tok_per_s'] / l['gen_tok_per_s']:.2f}x, "
          f"TTFT p99 {k['ttft_p99_ms'] / l['ttft_p99_ms']:.2f}x (lower is better)")
EOF
