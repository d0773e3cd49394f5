#!/usr/bin/env bash
# t_bench_kv.sh: `khub bench-kv-quality` (issue 13 item 6) on the tiny random
# Gemma 3 and its Transformers fixture (no download, so it runs everywhere):
# the f32 cache agrees with Transformers' greedy tokens; the sliding and
# offloaded caches, which are exact, agree 100% with a logits error of 0,
# so the tool's comparison is wired the right way round; the int4 cache
# with no residual window is measurably lossy there (the tool can see a
# difference); usage errors and a bad fixture are refused with the reason.
# The floors on SmolLM2 are t_bench_kv_smollm2.sh (slow).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin bench_kv
G=$SRC/tests/fixtures/gemma3_tiny
FX=$SRC/tests/fixtures/gemma3_tiny_reference.json

if "$KHUB" bench-kv-quality --model "$G" > u.out 2> u.err; then fail "no --fixture accepted"; fi
grep -q -- "--fixture PATH is required" u.err || fail "missing --fixture: $(cat u.err)"
if "$KHUB" bench-kv-quality --model "$G" --fixture "$FX" --tokens 0 > u.out 2> u.err; then
    fail "--tokens 0 accepted"; fi
grep -q -- "--tokens must be between 1 and 4096 (got '0')" u.err || fail "--tokens 0: $(cat u.err)"
echo '{"cases": 3}' > bad.json
if "$KHUB" bench-kv-quality --model "$G" --fixture bad.json > u.out 2> u.err; then
    fail "a fixture without cases accepted"; fi
grep -q 'bad.json: no "cases" array' u.err || fail "bad fixture: $(cat u.err)"
if "$KHUB" bench-kv-quality --model "$G" --fixture "$FX" --cache bogus > u.out 2> u.err; then
    fail "--cache bogus accepted"; fi
grep -q -- '--cache bogus: cache kernel "bogus": not a Hub ID' u.err || fail "bogus: $(cat u.err)"
echo "ok   usage errors, a fixture without cases and an unknown cache refused"

"$KHUB" bench-kv-quality --model "$G" --fixture "$FX" --tokens 16 --json --threads 2 \
    --cache sliding --cache "offloaded,budget=1,dir=$T" --cache quantized-int4,residual_length=0,q_group_size=16 \
    > q.json 2> q.err || fail "bench-kv-quality exited $?: $(cat q.err)"
python3 - q.json <<'PY'
import json, sys
rows = {r["cache"]: r for r in map(json.loads, open(sys.argv[1]))}
f32 = rows["dynamic"]
assert f32["baseline"] == "transformers greedy_ids" and f32["tokens"] == 16, f32
assert f32["prompts"] >= 4 and f32["agreement_mean"] == 1.0, f32
exact = [r for k, r in rows.items() if k.startswith(("sliding", "offloaded"))]
assert len(exact) == 2, rows.keys()
for r in exact:
    assert r["agreement_mean"] == 1.0 and r["prompts_identical"] == r["prompts"], r
    assert r["logits_rel_err_max"] == 0 and r["argmax_same"] == r["prompts"], r
q4 = rows["quantized-int4,residual_length=0,q_group_size=16"]
assert q4["logits_rel_err_max"] > 0 and q4["kv_bytes_per_token"] < f32["kv_bytes_per_token"] / 4, q4
print("  int4, no residual, keys per channel in blocks of 16 tokens, tiny Gemma 3: agreement %.3f, logits rel err max %.2e"
      % (q4["agreement_mean"], q4["logits_rel_err_max"]))
PY
echo "ok   f32 = Transformers; sliding and offloaded exact; int4 lossy, all measured"
