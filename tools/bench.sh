#!/usr/bin/env bash
# tools/bench.sh: khub against llama.cpp's llama-bench on one GGUF, side by
# side, with this machine's physical bounds measured in the same run.
#
# usage: tools/bench.sh [--model GGUF] [--build DIR] [--llama-bench PATH]
#                       [--threads 1,2] [--rounds 3] [--reps 3] [--pp 512] [--tg 128]
#                       [--out DIR]
#
# Each round runs, in this order: bench-machine (read bandwidth, peak FMA),
# `khub bench-model` (ppN and tgN at every thread count), llama-bench with the
# same -p/-n/-t, and the load average. Rounds interleave the two programs, so
# a neighbour's burst hits both; the summary takes the median over every
# sample of every round, with [min-max]. Without --llama-bench (or
# $LLAMA_BENCH) only khub and the bounds are measured. llama-bench is not
# built by this project: point this script at one you built yourself.
#
# The bounds: decode reads every weight once per token plus the K/V cache
# (bytes/token = weight bytes + f16 K/V of the average cached position), so
# tok/s <= read bandwidth / bytes per token. Prefill does 2 * (layer MACs +
# attention MACs) flops per token, so tok/s <= peak fp32 FMA (the faster of
# 8 and 16 lanes) / flops per token. khub's prefill is an f32 GEMM; its
# quantized decode tiles multiply int16 activations (vpmaddwd), whose
# multiply-add rate equals the fp32 FMA peak on Zen 2 (bench_machine's madd16
# line) and can exceed it elsewhere; the fp32 peak is the yardstick the
# benchmark plan asked for.
#
# Output: raw JSON lines in OUT/raw.jsonl, the summary as Markdown on stdout
# and in OUT/summary.md.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
model=${KHUB_MODEL:-$HOME/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf}
build=${KHUB_BUILD:-$here/../build}
llama=${LLAMA_BENCH:-}
threads=1,2
rounds=3
reps=3
pp=512
tg=128
out=

while [ $# -gt 0 ]; do
    case "$1" in
    --model) model=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --llama-bench) llama=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --pp) pp=$2; shift 2 ;;
    --tg) tg=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
    esac
done

khub=$build/bin/khub
[ -x "$khub" ] || { echo "bench.sh: no khub binary at $khub; build first or pass --build" >&2; exit 1; }
[ -f "$model" ] || { echo "bench.sh: no model at $model; run tools/fetch-model.sh or pass --model" >&2; exit 1; }
if [ -n "$llama" ] && [ ! -x "$llama" ]; then
    echo "bench.sh: --llama-bench $llama is not an executable" >&2; exit 1
fi
out=${out:-$(mktemp -d /tmp/khub-bench.XXXXXX)}
mkdir -p "$out"
raw=$out/raw.jsonl
: > "$raw"

machine=$out/bench-machine
cc -std=c11 -O2 -pthread -o "$machine" "$here/bench/bench_machine.c"

load() { awk '{printf "{\"what\":\"loadavg\",\"when\":\"%s\",\"l1\":%s,\"l5\":%s,\"l15\":%s}\n", w, $1, $2, $3}' w="$1" /proc/loadavg; }

for r in $(seq 1 "$rounds"); do
    echo "bench.sh: round $r of $rounds" >&2
    load "round $r start" >> "$raw"
    "$machine" --threads "$threads" --reps 5 >> "$raw"
    "$khub" bench-model --model "$model" -p "$pp" -n "$tg" -t "$threads" -r "$reps" >> "$raw"
    if [ -n "$llama" ]; then
        /usr/bin/time -f '{"what":"llama_rss","peak_rss_kib":%M}' -o "$out/time.json" \
            "$llama" -m "$model" -p "$pp" -n "$tg" -t "$threads" -r "$reps" -o jsonl \
            2>> "$out/llama.stderr" | sed 's/^{/{"impl":"llama.cpp",/' >> "$raw"
        cat "$out/time.json" >> "$raw"
    fi
    load "round $r end" >> "$raw"
done

python3 - "$raw" "$pp" "$tg" <<'EOF' | tee "$out/summary.md"
import json, statistics, sys
raw, pp, tg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(raw) if l.strip()]

def stat(v):
    return (statistics.median(v), min(v), max(v)) if v else (float("nan"),) * 3

def fmt(s, d=1):
    return "%.*f [%.*f-%.*f]" % (d, s[0], d, s[1], d, s[2])

def machine(what, t, key):
    v = [x for r in rows if r.get("what") == what and r["threads"] == t for x in r["samples"]]
    c = [r[key] for r in rows if r.get("what") == what and r["threads"] == t]
    return stat(v), stat(c)

def peak_fma(t):
    """The faster of the 8-lane and 16-lane FMA peaks, by median."""
    a, b = machine("fma", t, "gflops_cpu_median"), machine("fma512", t, "gflops_cpu_median")
    return b if b[0][0] == b[0][0] and b[0][0] > a[0][0] else a

khub = [r for r in rows if r.get("impl") == "khub"]
llama = [r for r in rows if r.get("impl") == "llama.cpp"]
threads = sorted({r["threads"] for r in khub})
loads = [r["l1"] for r in rows if r.get("what") == "loadavg"]
print("## Model benchmark: khub vs llama-bench\n")
print("model: %s\n" % (khub[0].get("weight_bytes") and "%.1f MB of weights" % (khub[0]["weight_bytes"] / 1e6)))
print("load average (1 min) during the run: %s\n" % fmt(stat(loads), 2))
if llama:
    print("llama.cpp build: %s (commit %s), %s\n" % (llama[0].get("build_number"), llama[0].get("build_commit"), llama[0].get("cpu_info")))
    rss = [r["peak_rss_kib"] for r in rows if r.get("what") == "llama_rss"]
    print("peak RSS: khub %.0f MiB (largest bench-model process), llama-bench %.0f MiB\n" % (
        max(r["peak_rss_kib"] for r in khub) / 1024, max(rss) / 1024 if rss else float("nan")))

k0 = khub[0]
bytes_tok = k0["weight_bytes"] + k0["kv_bytes_per_pos"] * (tg / 2)
flops_pp = 2 * (k0["layer_macs_per_token"] + k0["attn_macs_per_pair"] * (pp + 1) / 2) + 2 * k0["head_macs"] / pp
print("bounds: decode reads %.1f MB/token (weights + K/V at the mean position); prefill does %.3f GFLOP/token\n" % (bytes_tok / 1e6, flops_pp / 1e9))
print("| test | threads | khub tok/s | llama.cpp tok/s | khub / llama | bound tok/s (wall; cpu) | khub / bound (wall; cpu clock) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for test, n in (("pp", pp), ("tg", tg)):
    if n == 0:
        continue
    for t in threads:
        name = "%s%d" % (test, n)
        kw = [x for r in khub if r["test"] == name and r["threads"] == t for x in r["samples_ts"]]
        kc = [x for r in khub if r["test"] == name and r["threads"] == t for x in r["samples_cpu_ts"]]
        lw = []
        for r in llama:
            if r.get("n_threads") == t and r.get("n_prompt") == (n if test == "pp" else 0) and r.get("n_gen") == (n if test == "tg" else 0):
                lw += r.get("samples_ts", [])
        ks, kcs, ls = stat(kw), stat(kc), stat(lw)
        if test == "tg":
            bw, bwc = machine("read_bw", t, "gbps_cpu_median")
            bound, boundc = bw[0] * 1e9 / bytes_tok, bwc[0] * 1e9 / bytes_tok
        else:
            fl, flc = peak_fma(t)
            bound, boundc = fl[0] * 1e9 / flops_pp, flc[0] * 1e9 / flops_pp
        ratio = ks[0] / ls[0] if lw else float("nan")
        print("| %s | %d | %s | %s | %.2f | %.0f; %.0f | %.0f %%; %.0f %% |" % (
            name, t, fmt(ks), fmt(ls) if lw else "-", ratio, bound, boundc,
            100 * ks[0] / bound, 100 * kcs[0] / boundc))
print()
for t in threads:
    bw, bwc = machine("read_bw", t, "gbps_cpu_median")
    fl, flc = machine("fma", t, "gflops_cpu_median")
    fz, fzc = machine("fma512", t, "gflops_cpu_median")
    print("machine, %d thread(s): read %s GB/s wall (cpu clock %.1f); fp32 FMA 8 lanes %s GFLOP/s wall (cpu clock %.0f), 16 lanes %s (cpu clock %.0f)" % (
        t, fmt(bw), bwc[0], fmt(fl, 0), flc[0], fmt(fz, 0), fzc[0]))
EOF
echo "bench.sh: raw samples in $raw" >&2
