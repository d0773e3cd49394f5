#!/usr/bin/env bash
# tools/bench/decode-ab.sh: khub decode (tgN) with two or more plugin
# folders, interleaved, for an A/B of a kernel change on a shared machine.
#
# usage: tools/bench/decode-ab.sh [--build DIR] [--model GGUF] [--rounds 4]
#                                 [--threads 1] [--tg 64] [--reps 2] DIR_A DIR_B ...
#
# Each DIR is a plugin folder (the .so files and their plugins.json, e.g. a
# copy of BUILD/plugins made before and after the change), optionally as
# NAME=VALUE:DIR to run that one with an environment variable set (e.g.
# KHUB_HUGE_PAGES=0:build/plugins against build/plugins); every round runs
# `KHUB_PLUGIN_DIR=DIR khub bench-model -p 0 -n TG -t THREADS -r REPS` for
# each DIR in turn, so a neighbour's burst hits all of them. Prints one JSON
# line per run (with the 1-minute load average when it started), then the
# median over every sample of every round, [min-max], by the wall clock and
# by CPU time (khub bench-model's samples_cpu_ts: tok/s if the process had
# had its cores to itself; on a loaded machine the figure to compare), and
# each DIR's ratio to the first.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${KHUB_BUILD:-$here/../../build}
model=${KHUB_MODEL:-$HOME/.cache/khub/models/SmolLM2-135M-Instruct.Q4_1.gguf}
rounds=4
threads=1
tg=64
reps=2
dirs=()
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --tg) tg=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "decode-ab.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
    *) dirs+=("$1"); shift ;;
    esac
done
khub=$build/bin/khub
[ -x "$khub" ] || { echo "decode-ab.sh: no khub binary at $khub; pass --build" >&2; exit 1; }
[ -f "$model" ] || { echo "decode-ab.sh: no model at $model; pass --model" >&2; exit 1; }
[ ${#dirs[@]} -ge 1 ] || { echo "decode-ab.sh: name at least one plugin folder" >&2; exit 2; }
# NAME=VALUE:DIR -> the environment assignment and the folder
env_of() { if [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*=[^:]*: ]]; then echo "${1%%:*}"; fi; }
dir_of() { if [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*=[^:]*: ]]; then echo "${1#*:}"; else echo "$1"; fi; }
for d in "${dirs[@]}"; do
    [ -f "$(dir_of "$d")/plugins.json" ] || { echo "decode-ab.sh: $(dir_of "$d") has no plugins.json" >&2; exit 1; }
done

raw=$(mktemp /tmp/khub-decode-ab.XXXXXX)
for r in $(seq 1 "$rounds"); do
    for d in "${dirs[@]}"; do
        l=$(cut -d' ' -f1 /proc/loadavg)
        env $(env_of "$d") KHUB_PLUGIN_DIR="$(dir_of "$d")" "$khub" bench-model --model "$model" -p 0 -n "$tg" -t "$threads" \
            -r "$reps" 2> /dev/null | grep '"test":"tg' |
            sed "s|^{|{\"dir\":\"$d\",\"round\":$r,\"load\":$l,|" | tee -a "$raw"
    done
done
python3 - "$raw" "${dirs[@]}" <<'EOF'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = None
print("\n| plugins | tok/s, CPU clock | ratio | tok/s, wall | load (1 min) |")
print("|---|---:|---:|---:|---:|")
for d in sys.argv[2:]:
    c = [x for r in rows if r["dir"] == d for x in r["samples_cpu_ts"]]
    w = [x for r in rows if r["dir"] == d for x in r["samples_ts"]]
    ld = [r["load"] for r in rows if r["dir"] == d]
    m = st.median(c)
    base = base or m
    print("| %s | %.1f [%.1f-%.1f] | %.2f | %.1f [%.1f-%.1f] | %.1f-%.1f |" % (
        d, m, min(c), max(c), m / base, st.median(w), min(w), max(w), min(ld), max(ld)))
EOF
rm -f "$raw"
