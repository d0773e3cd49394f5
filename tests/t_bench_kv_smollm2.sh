#!/usr/bin/env bash
# t_bench_kv_smollm2.sh (label slow): the quality floors of the lossy KV
# caches on SmolLM2-135M-Instruct Q4_1 (issue 13 item 6), measured with
# `khub bench-kv-quality` on the ten prompts of the Transformers fixture,
# 64 greedy tokens each, against khub's f32 cache. The floors sit below what
# docs/caches.md records (measured on an AMD EPYC Zen 3) with a margin for
# kernels that round differently on other CPUs (a greedy divergence moves
# with any near-tie). With no residual window and keys per channel (the
# default axis_key), int8 keeps at least 75% of the tokens (measured 92.5%)
# and its last-position logits within 0.03 of max |logit| (measured
# 8.5e-3); int4 keeps at least 40% (measured 65.6%) within 0.2 (measured
# 9.1e-2). Keys per token (axis_key=token) lose more: int4 keeps at least 8%
# (measured 17.0%) within 0.5 (measured 0.31), and per channel must beat it.
# With the default residual window of 128 tokens the seven prompts whose
# prompt and 64 tokens fit in it are exact by construction, so int4 agrees
# entirely on at least 7 of the 10 (measured 8). f16 K/V (--kv-type f16)
# keeps at least 90% of the f32 cache's tokens (measured 100%). Skips when
# the model is absent.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
DIR=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}
GGUF=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || t_skip "$GGUF absent (run tools/fetch-model.sh)"
t_begin bench_kv_smollm2
"$KHUB" bench-kv-quality --model "$GGUF" --fixture "$SRC/tests/fixtures/smollm2_greedy.json" \
    --json --cache quantized,residual_length=0 --cache quantized-int4,residual_length=0 \
    --cache quantized-int4,residual_length=0,axis_key=token \
    --cache quantized-int4 > q.json 2> q.err || fail "bench-kv-quality exited $?: $(cat q.err)"
cat q.json
python3 - q.json <<'PY'
import json, sys
rows = {r["cache"]: r for r in map(json.loads, open(sys.argv[1]))}
f32, q8 = rows["dynamic"], rows["quantized,residual_length=0"]
q4, q4r = rows["quantized-int4,residual_length=0"], rows["quantized-int4"]
q4t = rows["quantized-int4,residual_length=0,axis_key=token"]
assert f32["prompts"] == 10 and f32["tokens"] == 64, f32
assert f32["agreement_mean"] >= 0.95, f32  # khub's f32 cache vs Transformers
assert q8["agreement_mean"] >= 0.75 and q8["logits_rel_err_max"] <= 0.03, q8
assert q4["agreement_mean"] >= 0.4 and q4["logits_rel_err_max"] <= 0.2, q4
assert q4t["agreement_mean"] >= 0.08 and q4t["logits_rel_err_max"] <= 0.5, q4t
assert q4["agreement_mean"] > q4t["agreement_mean"], (q4, q4t)  # per channel beats per token
assert q4r["prompts_identical"] >= 7, q4r
assert q4r["kv_bytes_per_token"] * 10 <= f32["kv_bytes_per_token"] * 3 // 2, q4r  # <= 30% of f16
PY
echo "ok   int8 / int4 KV caches above their agreement floors on SmolLM2"

# f16 K/V (--kv-type f16) against the f32 cache: measured on Zen 2 (session
# 13) 100% of the 64 tokens on all 10 prompts, logits within 5.8e-4 of max
# |logit|; the floors leave room for near-ties on other CPUs.
"$KHUB" bench-kv-quality --model "$GGUF" --fixture "$SRC/tests/fixtures/smollm2_greedy.json" \
    --json --cache dynamic --kv-type f16 > h.json 2> h.err || fail "--kv-type f16 exited $?: $(cat h.err)"
cat h.json
python3 - h.json <<'PY'
import json, sys
f32, f16 = map(json.loads, open(sys.argv[1]))
assert f32["kv_type"] == "f32" and f16["kv_type"] == "f16" and f16["cache"] == "dynamic", (f32, f16)
assert f16["kv_bytes_per_token"] * 2 == f32["kv_bytes_per_token"], (f32, f16)
assert f16["agreement_mean"] >= 0.9 and f16["logits_rel_err_max"] <= 0.005, f16
PY
echo "ok   f16 K/V keeps the f32 cache's tokens on SmolLM2"
