#!/usr/bin/env bash
# tools/bench/make-quants.sh: other GGUF quantizations of the test model for
# benchmarks (issue 14: "Q4_0, Q8_0 and Q4_K files"), made with llama.cpp's
# llama-quantize from the cached Q4_1 file. Optional: no test needs it.
#
# usage: tools/bench/make-quants.sh --llama-quantize PATH [--src GGUF]
#                                   [--out DIR] [TYPE ...]
#
# TYPEs are llama-quantize's names (default: Q4_0 Q8_0 Q4_K_M); each file is
# OUT/smollm2-135m-TYPE.gguf (OUT defaults to ~/.cache/khub-bench). The
# source is the Q4_1 GGUF of tools/fetch-model.sh, requantized
# (--allow-requantize): its weights are already 4-bit, so the new files are
# no better than Q4_1 in quality, but their tensor types and bytes are those
# of a real TYPE file, which is what a speed comparison needs. (The cached
# Hugging Face copy is dequantized from the same Q4_1 file, so converting it
# to f16 first would give the same weights.) SmolLM2's hidden size 576 is
# not a multiple of 256, so a K-quant file keeps most matrices in a 32-weight
# fallback type (Q4_K_M: Q5_0 and Q8_0, with Q4_K / Q6_K only in ffn_down;
# docs/performance.md). Q4_K_S uses Q5_K, which khub does not read.
#
# llama-quantize is not built by this project: build it from the llama.cpp
# sources you benchmark against (cmake --build BUILD --target llama-quantize).
# Existing files are kept; delete one to make it again.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
quantize=${LLAMA_QUANTIZE:-}
src=
out=$HOME/.cache/khub-bench
types=()
while [ $# -gt 0 ]; do
    case "$1" in
    --llama-quantize) quantize=$2; shift 2 ;;
    --src) src=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "make-quants.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
    *) types+=("$1"); shift ;;
    esac
done
[ ${#types[@]} -gt 0 ] || types=(Q4_0 Q8_0 Q4_K_M)
[ -n "$quantize" ] && [ -x "$quantize" ] ||
    { echo "make-quants.sh: pass --llama-quantize PATH (an executable llama-quantize)" >&2; exit 2; }
src=${src:-$("$here/../fetch-model.sh")}
[ -f "$src" ] || { echo "make-quants.sh: no source GGUF at $src" >&2; exit 1; }
mkdir -p "$out"

for t in "${types[@]}"; do
    f=$out/smollm2-135m-$t.gguf
    if [ -f "$f" ]; then
        echo "$f"
        continue
    fi
    # A temporary name in the same folder, renamed at the end: a killed run
    # leaves no half-written file under the final name.
    tmp=$out/.smollm2-135m-$t.gguf.tmp-$$
    if ! "$quantize" --allow-requantize "$src" "$tmp" "$t" > "$tmp.log" 2>&1; then
        echo "make-quants.sh: llama-quantize $t failed; its output:" >&2
        tail -5 "$tmp.log" >&2
        rm -f "$tmp" "$tmp.log"
        exit 1
    fi
    rm -f "$tmp.log"
    mv "$tmp" "$f"
    echo "$f"
done
