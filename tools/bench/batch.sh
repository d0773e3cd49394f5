#!/usr/bin/env bash
# batch.sh: `khub bench-batch` side by side with llama.cpp's
# llama-batched-bench on the same model file, threads, sequence counts and
# prompt + generated lengths (issue 13 item 8). Each round runs both, the
# order alternating between rounds; every N is its own run of each tool.
#
#   tools/bench/batch.sh --llama-batched-bench PATH [--model GGUF] [--khub BIN]
#                        [--threads 2] [--seqs "1 8 32"] [--prompt 128]
#                        [--gen 128] [--rounds 3]
#
# Prints one line per run and a table of medians: generated tokens per second
# of the whole run (prefill included: khub's gen_tok_s, llama's N * gen / T)
# for each and their ratio; the decode phase alone (khub's decode_tok_s, the
# steps that compute no prompt token, and llama's S_TG) for each and their
# ratio; khub's mean time to first token; and khub's decode at N against its
# decode at the first N (the issue's ">= 4x khub's own single-sequence decode
# at 32 sequences" when the first N is 1). Wall-clock figures, as llama's.
# llama-batched-bench is not part of khub: build it outside the repository
# (docs/performance.md says how).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}/SmolLM2-135M-Instruct.Q4_1.gguf
KHUB=build/bin/khub
LLAMA=
THREADS=2
SEQS="1 8 32"
PROMPT=128
GEN=128
ROUNDS=3
while [ $# -gt 0 ]; do
    case $1 in
    --llama-batched-bench) LLAMA=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --khub) KHUB=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --seqs) SEQS=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --gen) GEN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "batch.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x "$LLAMA" ] || { echo "batch.sh: --llama-batched-bench PATH (an executable) is required" >&2; exit 2; }
[ -x "$KHUB" ] || { echo "batch.sh: $KHUB not built (cmake --build build)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "batch.sh: no model at $MODEL (tools/fetch-model.sh)" >&2; exit 2; }

T=$(mktemp -d /tmp/khub-bench-batch-XXXXXX)
trap 'rm -rf "$T"' EXIT
echo "batch.sh: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
    "load $(cut -d' ' -f1-3 /proc/loadavg), threads $THREADS, prompt $PROMPT + gen $GEN"

run_khub() { # N round
    "$KHUB" bench-batch --model "$MODEL" --seqs "$1" --prompt-tokens "$PROMPT" \
        --gen-tokens "$GEN" --threads "$THREADS" 2> "$T/khub.err" |
        python3 -c '
import json, sys
d = json.loads(sys.stdin.readline())
print("khub", sys.argv[1], sys.argv[2], d["gen_tok_s"], d["ttft_ms_mean"], d["peak_rss_kib"],
      d["decode_tok_s"], d["decode_tok_s_cpu"], flush=True)
' "$1" "$2" | tee -a "$T/runs"
}

run_llama() { # N round: the row of llama-batched-bench's table for B = N
    "$LLAMA" -m "$MODEL" -npp "$PROMPT" -ntg "$GEN" -npl "$1" -c $(($1 * (PROMPT + GEN))) \
        -t "$THREADS" -tb "$THREADS" 2> "$T/llama.err" |
        python3 -c '
import sys
n, gen = int(sys.argv[1]), int(sys.argv[3])
for line in sys.stdin:
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) == 10 and c[2] == str(n):  # PP TG B N_KV T_PP S_PP T_TG S_TG T S
        print("llama", n, sys.argv[2], round(n * gen / float(c[8]), 2), c[7], flush=True)
        break
else:
    sys.exit("batch.sh: no B=%d row in llama-batched-bench output" % n)
' "$1" "$2" "$GEN" | tee -a "$T/runs"
}

for r in $(seq "$ROUNDS"); do
    for n in $SEQS; do
        if [ $((r % 2)) = 1 ]; then run_khub "$n" "$r"; run_llama "$n" "$r"; else
            run_llama "$n" "$r"; run_khub "$n" "$r"; fi
    done
done
echo "batch.sh: done, load $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$T/runs" "$SEQS" << 'EOF'
import statistics, sys
k, l = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "khub":
        k.setdefault(int(f[1]), []).append((float(f[3]), float(f[4]), int(f[5]), float(f[6])))
    else:
        l.setdefault(int(f[1]), []).append((float(f[3]), float(f[4])))
med = lambda v: statistics.median(v)
seqs = [int(s) for s in sys.argv[2].split()]
base = med([x[0] for x in k[seqs[0]]]) if seqs else None
dbase = med([x[3] for x in k[seqs[0]]]) if seqs else None
print("\n| N | khub gen tok/s | llama gen tok/s | khub / llama | khub decode tok/s "
      "| llama S_TG t/s | khub / llama decode | khub TTFT mean s | khub gen vs N=%d "
      "| khub decode vs N=%d decode | khub peak RSS MiB |" % (seqs[0], seqs[0]))
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in seqs:
    kg, lg = med([x[0] for x in k[n]]), med([x[0] for x in l[n]])
    kd, ld = med([x[3] for x in k[n]]), med([x[1] for x in l[n]])
    print("| %d | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.0f |" % (
        n, kg, lg, kg / lg, kd, ld, kd / ld, med([x[1] for x in k[n]]) / 1000,
        kg / base, kd / dbase, max(x[2] for x in k[n]) / 1024))
EOF
