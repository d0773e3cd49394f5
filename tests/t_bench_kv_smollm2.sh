#!/usr/bin/env bash
# t_bench_kv_smollm2.sh (label slow): the quality floors of the lossy KV
# caches on SmolLM2-135M-Instruct Q4_1 (issue 13 item 6), measured with
# `khub bench-kv-quality` on the ten prompts of the Transformers fixture,
# 64 greedy tokens each, against khub's f32 cache. The floors sit below what
# docs/caches.md records (measured on this session's AMD EPYC) with a
# margin for kernels that round differently on other CPUs (a greedy
# divergence moves with any near-tie): with no residual window, int8 keeps
# at least 50% of the tokens (measured 71.6%) and its last-position logits
# within 0.05 of max |logit| (measured 2.05e-2); int4 keeps at least 8%
# (measured 17.0%) within 0.5 (measured 0.31). With the default residual
# window of 128 tokens the seven prompts whose prompt and 64 tokens fit in
# it are exact by construction, so int4 agrees entirely on at least 7 of the
# 10 (measured 8). Skips when the model is absent.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
DIR=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}
GGUF=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || t_skip "$GGUF absent (run tools/fetch-model.sh)"
t_begin bench_kv_smollm2
"$KHUB" bench-kv-quality --model "$GGUF" --fixture "$SRC/tests/fixtures/smollm2_greedy.json" \
    --json --cache quantized,residual_length=0 --cache quantized-int4,residual_length=0 \
    --cache quantized-int4 > q.json 2> q.err || fail "bench-kv-quality exited $?: $(cat q.err)"
cat q.json
python3 - q.json <<'PY'
import json, sys
rows = {r["cache"]: r for r in map(json.loads, open(sys.argv[1]))}
f32, q8 = rows["dynamic"], rows["quantized,residual_length=0"]
q4, q4r = rows["quantized-int4,residual_length=0"], rows["quantized-int4"]
assert f32["prompts"] == 10 and f32["tokens"] == 64, f32
assert f32["agreement_mean"] >= 0.95, f32  # khub's f32 cache vs Transformers
assert q8["agreement_mean"] >= 0.5 and q8["logits_rel_err_max"] <= 0.05, q8
assert q4["agreement_mean"] >= 0.08 and q4["logits_rel_err_max"] <= 0.5, q4
assert q4r["prompts_identical"] >= 7, q4r
assert q4r["kv_bytes_per_token"] * 10 <= f32["kv_bytes_per_token"] * 3 // 2, q4r  # <= 30% of f16
PY
echo "ok   int8 / int4 KV caches above their agreement floors on SmolLM2"
