#!/usr/bin/env bash
# t_emu512_models.sh: real models through the AVX-512 kernels' logic on any
# AVX2 CPU. The test-only cpu-avx512-emu.so (plugins/cpu-x86/kx_emu512.h,
# tests/t_emu512.sh) beside ref-cpu must give the same greedy tokens as
# cpu-avx2 beside ref-cpu, for five prompts run as one batch: one of about
# 170 tokens (its prefill goes through qgemm.c's 512-bit GEMM) and four
# short ones (the batch tiles, 4-token tiles and vpdpwssd steps in decode).
# On SmolLM2-135M-Instruct Q4_1 (Q4_1 layers, a Q8_0 head) and, when
# present, Gemma 3 270M Q4_K_M (Q4_K, Q6_K, Q5_0, Q8_0). --explain must show
# the emulation serving each quantized format. Skips when SmolLM2 is absent.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin emu512_models
B=${KHUB_BUILD:?set by ctest}
EMU=$B/test-plugins/cpu-avx512-emu.so
DIR=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}
SMOL=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA=$DIR/gemma-3-270m-q4_k_m.gguf
[ -f "$EMU" ] || t_skip "$EMU not built (the compiler lacks the AVX-512 flags)"
[ -f "$SMOL" ] || t_skip "$SMOL absent (run tools/fetch-model.sh)"
case " $("$KHUB" cpu | sed -n 's/^features //p') " in
*" avx2 "*) ;;
*) t_skip "this CPU has no AVX2: the module cannot run here" ;;
esac
t_plugin_folder avx2 "$B/plugins/ref-cpu.so" "$B/plugins/cpu-avx2.so"
t_plugin_folder emu "$B/plugins/ref-cpu.so" "$EMU"

LONG="Once upon a time, in a small village at the edge of a great forest, there lived an old \
clockmaker named Elias. Every morning he opened the shutters of his tiny shop, wound the hundred \
clocks that hung on its walls, and listened as they ticked together like a choir. Children from \
the village would press their noses against the window to watch him work, and travellers who \
passed through on their way to the mountains often stopped to ask him to mend a watch or a music \
box. One winter evening, as snow fell softly on the cobblestones, a stranger in a long grey coat \
knocked on the door and placed a strange silver clock on the counter. It had no hands, and its \
face was covered with symbols that Elias had never seen. The stranger said only that"

# run NAME MODEL DIR: five prompts, 24 greedy tokens each, --json --explain
run() {
    KHUB_PLUGIN_DIR=$T/$3 "$KHUB" run --model "$2" --prompt "$LONG" \
        --prompt "The capital of France is" --prompt "def fibonacci(n):" \
        --prompt "List three colours:" --prompt "1, 2, 3, 4," --max-new-tokens 24 --json \
        --explain > "$1-$3.json" 2> "$1-$3.err" || fail "$1 with $3: $(cat "$1-$3.err")"
}

n=0
for model in "$SMOL" "$GEMMA"; do
    [ -f "$model" ] || {
        echo "skip $(basename "$model"): absent (tools/fetch-gemma.sh)"
        continue
    }
    name=$(basename "$model" .gguf)
    run "$name" "$model" avx2
    run "$name" "$model" emu
    python3 - "$name-avx2.json" "$name-emu.json" "$name" << 'PY' || fail "$name (above)"
import json, re, sys
a, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
served = sorted(set(re.findall(r"^\w+\[(\w+)\]: khub/cpu-avx512-emu", e["explain"], re.M)))
quant = [f for f in served if f != "f32"]
assert quant, ("the emulation served no quantized role", e["explain"])
assert "cpu-avx512-emu" not in a["explain"], a["explain"]
assert a["results"][0]["n_prompt_tokens"] >= 128, a["results"][0]  # qgemm's prefill
for i, (x, y) in enumerate(zip(a["results"], e["results"])):
    if x["tokens"] != y["tokens"]:
        sys.exit("prompt %d: cpu-avx2 %s, emulated AVX-512 %s" % (i, x["tokens"], y["tokens"]))
print("ok   %s: 5 prompts (%d prompt tokens), greedy tokens equal; emulation served %s"
      % (sys.argv[3], sum(r["n_prompt_tokens"] for r in e["results"]), ", ".join(served)))
PY
    n=$((n + 1))
done
echo "$n passed, 0 failed, $((2 - n)) skipped"
