#!/usr/bin/env bash
# t_serve_reload.sh: live kernel reload in `khub serve-model` (issue 16
# items 4 and 6, docs/model-server.md "Live kernel reload") on the tiny
# Gemma 3 fixture (no download, seconds): the load test of 32 streaming
# clients x 4 requests through the `openai` client (tests/serve_load.py)
# with three attention swaps (khub/ref-cpu, khub/cpu-avx2 when this CPU
# runs it, back by the alias sdpa) and a refused cache swap while requests
# stream, every text equal to its solo greedy run and none lost; then the
# endpoint's refusals with their statuses and messages (401 without or with
# a wrong key, 403 on a server without a key, 400 malformed, not an object,
# missing fields, an unknown role naming the roles, a name that is no Hub
# ID, 409 cache, 422 a plugin without the role's op), GET /v1/kernels after
# the swaps, the per-kernel call counts and reload counters in /metrics,
# and answers after it all. The real model with Hub kernels (signed,
# tampered, unsigned) is tests/t_serve_reload_hub.sh (label slow).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
command -v curl > /dev/null || t_skip "curl is not installed"
t_begin serve_reload
MODEL=$SRC/tests/fixtures/gemma3_tiny
KEY=reload-key-1
AUTH="Authorization: Bearer $KEY"

start() { # OUT [flags]: a server on a free port; sets BASE and SRV
    local out=$1
    shift
    "$KHUB" serve-model --model "$MODEL" --model-id tiny --port 0 --threads 2 "$@" \
        > "$out" 2> "$out.err" &
    SRV=$!
    for _ in $(seq 300); do
        grep -q http "$out" 2> /dev/null && break
        kill -0 $SRV 2> /dev/null || fail "serve-model exited: $(cat "$out.err")"
        sleep 0.1
    done
    BASE=$(grep -o 'http://[0-9.:]*' "$out" | head -n 1 || true)
    [ -n "$BASE" ] || fail "serve-model printed no address: $(cat "$out" "$out.err")"
}
# reload BODY [curl args]: prints the body, then the status
reload() {
    local body=$1
    shift
    curl -s -H "Content-Type: application/json" -w '\n%{http_code}' "$@" "$BASE/v1/kernels/reload" -d "$body"
}
# expect STATUS PATTERN BODY: the reload answer, with the key
expect() {
    local out
    out=$(reload "$3" -H "$AUTH")
    [ "$(tail -n 1 <<< "$out")" = "$1" ] || fail "reload $3: want $1, got: $out"
    grep -qF -- "$2" <<< "$out" || fail "reload $3: want '$2' in: $out"
}
metric() { curl -s "$BASE/metrics" | grep -F "$1" | grep -v '^#' || true; }

# An open server (no key) refuses every reload: swapping code needs a key.
start open.out
out=$(reload '{"role":"attention","kernel":"sdpa"}')
[ "$(tail -n 1 <<< "$out")" = 403 ] &&
    grep -qF "POST /v1/kernels/reload is disabled: the server has no API key" <<< "$out" ||
    fail "no key: $out"
kill $SRV && wait $SRV 2> /dev/null || true
echo "ok   a server without an API key answers a reload 403"

start srv.out --api-key "$KEY" --attn sdpa
FIRST=$(curl -s -H "$AUTH" "$BASE/v1/kernels" |
    python3 -c 'import json,sys; print([e["binding"] for e in json.load(sys.stdin)["data"] if e["role"].startswith("attention")][0])')
[ "$FIRST" = "khub/ref-cpu 0.1.0 :: attention" ] || fail "--attn sdpa serves: $FIRST"
# The optimized attention when this CPU can run it (not on a bare x86-64).
AVX2=0
"$KHUB" run --model "$MODEL" --prompt hi --max-new-tokens 1 --explain 2> /dev/null |
    grep -q '^attention\[f32\]: khub/cpu-avx2 ' && AVX2=1
SWAPS=(--reload attention=khub/ref-cpu)
[ "$AVX2" = 1 ] && SWAPS+=(--reload attention=khub/cpu-avx2)
SWAPS+=(--reload attention=sdpa)
N_SWAPS=$((${#SWAPS[@]} / 2))

# --- the load test: 32 streaming clients x 4 requests, swaps in flight -------
if python3 -c "import openai" 2> /dev/null; then
    python3 "$SRC/tests/serve_load.py" "$BASE" "$KEY" --mode completion --max-tokens 64 \
        --clients 32 --requests 4 --deadline 240 "${SWAPS[@]}" \
        --refuse 'cache=static:409:KHUB_STATUS_UNSUPPORTED' > load.out 2>&1 ||
        { cat load.out; fail "the load test (above)"; }
    cat load.out
    LOADED=1
else
    echo "skip the load test: the openai package is absent (tools/install-test-deps.sh)"
    LOADED=0
    for s in "${SWAPS[@]}"; do
        [ "$s" = --reload ] && continue
        expect 200 '"object":"kernel.reload"' "{\"role\":\"attention\",\"kernel\":\"${s#attention=}\"}"
    done
    expect 409 KHUB_STATUS_UNSUPPORTED '{"role":"cache","kernel":"static"}'
fi

# --- after the swaps: kernels and metrics -------------------------------------
curl -s -H "$AUTH" "$BASE/v1/kernels" > k.json
N_SWAPS=$N_SWAPS python3 - k.json << 'EOF' || fail "kernels after the swaps: $(head -c 600 k.json)"
import json, os, sys
k = json.load(open(sys.argv[1]))
n = int(os.environ["N_SWAPS"])
att = [e["binding"] for e in k["data"] if e["role"] == "attention[f32]"]
assert att == ["khub/ref-cpu 0.1.0 :: attention"], att
assert k["reloads"] == n and k["reload_failures"] == 1, (k["reloads"], k["reload_failures"])
h = k["reload_history"]
assert len(h) == n and h[-1]["kernel"] == "sdpa" and h[-1]["role"] == "attention", h
assert h[-1]["resolved"] == "attention: sdpa = khub/ref-cpu (built-in)", h[-1]
assert h[0]["previous"] == "khub/ref-cpu 0.1.0 :: attention", h[0]
assert all(r["selftest"] in ("passed", "none") for r in h), h
assert "attention[f32]: khub/ref-cpu 0.1.0 :: attention" in k["explain"]
EOF
metric 'khub_kernel_calls_total{role="attention"' > att.txt
[ "$(grep -c 'state="retired"' att.txt)" -ge 1 ] && [ "$(grep -c 'state="active"' att.txt)" -eq 1 ] ||
    fail "attention calls: $(cat att.txt)"
if [ "$LOADED" = 1 ]; then # every binding took calls under the load
    ! grep -Eq ' 0$' att.txt || fail "a swapped-in attention served nothing: $(cat att.txt)"
fi
grep -q '^# TYPE khub_kernel_calls_total counter$' <(curl -s "$BASE/metrics") || fail "no TYPE line"
[ "$(metric 'khub_kernel_reloads_total ')" = "khub_kernel_reloads_total $N_SWAPS" ] ||
    fail "reloads: $(metric khub_kernel_reloads_total)"
[ "$(metric 'khub_kernel_reload_failures_total ')" = "khub_kernel_reload_failures_total 1" ] ||
    fail "failures: $(metric khub_kernel_reload_failures_total)"
grep -Eq '^khub_kernel_calls_total\{role="kv_cache",dtype="f32",kernel="khub/ref-cpu 0.1.0 :: kv_cache",state="active"\} [1-9][0-9]*$' \
    <(curl -s "$BASE/metrics") || fail "kv_cache calls: $(metric kv_cache)"
echo "ok   kernels after $N_SWAPS swaps: binding, history, resolution; metrics: calls per kernel (retired and active), reload counters"

# --- refusals ------------------------------------------------------------------
out=$(reload '{"role":"attention","kernel":"sdpa"}')
[ "$(tail -n 1 <<< "$out")" = 401 ] && grep -qF "Incorrect or missing API key" <<< "$out" || fail "no key: $out"
out=$(reload '{"role":"attention","kernel":"sdpa"}' -H "Authorization: Bearer $KEY-")
[ "$(tail -n 1 <<< "$out")" = 401 ] || fail "wrong key: $out"
expect 400 "the request body is not valid JSON" '{"role": "attention",'
expect 400 "the request body must be a JSON object" '["attention","sdpa"]'
expect 400 "'role' must be a non-empty string" '{"kernel":"sdpa"}'
expect 400 '"param":"role"' '{"role":7,"kernel":"sdpa"}'
expect 400 "'kernel' must be a non-empty string: a Hub ID org/name[@REV|@version=N][:symbol] or a loaded plugin's id" '{"role":"attention"}'
expect 400 "unknown kernel role 'attn' (roles: attention, quantization, cache, norm, activation, rotary, linear, embedding)" \
    '{"role":"attn","kernel":"sdpa"}'
expect 400 '"code":"KHUB_STATUS_BAD_ID"' '{"role":"attention","kernel":"flash"}'
expect 409 "the cache kernel cannot be swapped in a running model" '{"role":"cache","kernel":"static"}'
expect 409 "the linear kernel cannot be swapped in a running model" '{"role":"linear","kernel":"khub/ref-cpu"}'
expect 422 "tiny: khub/cpu-avx2 cannot serve rotary: khub/cpu-avx2 0.1.0 for rotary is unusable: it has no rotary op; nothing changed" \
    '{"role":"rotary","kernel":"khub/cpu-avx2"}'
curl -s -H "$AUTH" "$BASE/v1/kernels" | grep -F '"reloads":'"$N_SWAPS," > /dev/null || fail "a refusal changed the reload count"
out=$(curl -s -H "$AUTH" "$BASE/v1/completions" -d '{"prompt":"Sliding window","max_tokens":4,"temperature":0}')
grep -q '"completion_tokens":4' <<< "$out" || fail "no answer after the refusals: $out"
echo "ok   refusals: 401 (none, wrong), 400 (malformed, not an object, missing, unknown role, no Hub ID), 409 cache/linear, 422 no such op; still answering"

kill -TERM $SRV
wait $SRV 2> /dev/null || true
SRV=
# under the sanitizers (tools/test.sh's pass) a report fails the test
! grep -E "AddressSanitizer|LeakSanitizer|runtime error:" srv.out.err open.out.err ||
    fail "sanitizer report (above)"
echo "passed"
