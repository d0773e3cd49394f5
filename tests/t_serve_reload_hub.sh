#!/usr/bin/env bash
# t_serve_reload_hub.sh: the load test of issue 16 item 6 on the real model
# (SmolLM2-135M-Instruct Q4_1) with kernels from a hub of our own (label
# slow: minutes of generation). flash-attn2 is built twice from the in-tree
# source, as v1 (1.0.0) and v2 (2.0.0: the same code, so the same numbers),
# signed and published to `khub serve`, with an unsigned copy of another
# organisation. serve-model starts with --attn kernels-community/flash-
# attn2@v1; then 32 streaming chat clients x 4 requests run through the
# `openai` client (tests/serve_load.py) while the attention is swapped to
# @v2 (fetched, signature and digests verified, loaded, switched between
# two batch steps), and two swaps are refused with the old kernel serving
# on: v1 again after its cached plugin was tampered with (digest mismatch)
# and the unsigned kernel (the policy does not list its organisation).
# Every streamed text must equal its solo greedy run, none lost. Then
# GET /v1/kernels names v2 with its commit and trust decision, /metrics
# shows calls on both v1 (retired) and v2, and a wrong key gets 401. A
# server with --lock reloads the locked commit (hashes re-checked) and
# refuses a kernel outside the lock (404) or another commit (422).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
MODEL=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$MODEL" ] || t_skip "$MODEL absent (run tools/fetch-model.sh)"
command -v curl > /dev/null || t_skip "curl is not installed"
python3 -c "import openai" 2> /dev/null || t_skip "the openai package is absent (tools/install-test-deps.sh)"
t_begin serve_reload_hub
HUBPID=
trap '[ -n "$HUBPID" ] && kill $HUBPID 2> /dev/null; t_cleanup' EXIT
KEY=reload-hub-key

# author: flash-attn2 v1 and v2 (same code), an unsigned copy; sign, publish
"$KHUB" keygen pub > /dev/null
cp -r "$SRC/kernels-src/flash-attn2" fa1 && rm -rf fa1/build
cp -r fa1 fa2
sed -i 's/"major": 1/"major": 2/; s/"version": "1.0.0"/"version": "2.0.0"/' fa2/kernel.json
sed -i "s/\"1.0.0\"/\"2.0.0\"/g" fa2/*.c
cp -r fa1 unsigned
sed -i 's#kernels-community/flash-attn2#other-org/flash-attn2#g' unsigned/kernel.json unsigned/*.c
for k in fa1 fa2 unsigned; do
    "$KHUB" build "$k" --quiet > /dev/null 2>&1 || fail "build $k"
    [ $k = unsigned ] || "$KHUB" sign --key pub.key "$k" > /dev/null || fail "sign $k"
done
mkdir hub
t_serve hub serve.out --token t0k
HUBPID=$SRV
SRV=
for k in fa1 fa2 unsigned; do
    "$KHUB" publish "$k" --endpoint "$EP" --token t0k --quiet > /dev/null || fail "publish $k"
done
printf '{"version": 1, "publishers": {"kernels-community": ["%s"]}}\n' "$(cat pub.pub)" > policy.json
export HF_ENDPOINT=$EP KHUB_CACHE=$T/cache
V2=$("$KHUB" resolve kernels-community/flash-attn2@v2)
echo "ok   flash-attn2 v1 and v2 (same code) signed and published, other-org's unsigned"

"$KHUB" serve-model --model "$MODEL" --model-id smollm2 --port 0 --threads 2 --api-key "$KEY" \
    --policy policy.json --attn kernels-community/flash-attn2@v1 --max-context 512 \
    > srv.out 2> srv.err &
SRV=$!
for _ in $(seq 600); do
    grep -q http srv.out 2> /dev/null && break
    kill -0 $SRV 2> /dev/null || fail "serve-model exited: $(cat srv.err)"
    sleep 0.1
done
BASE=$(grep -o 'http://[0-9.:]*' srv.out | head -n 1 || true)
[ -n "$BASE" ] || fail "serve-model printed no address: $(cat srv.out srv.err)"
AUTH="Authorization: Bearer $KEY"
curl -s -H "$AUTH" "$BASE/v1/kernels" | grep -F '"binding":"kernels-community/flash-attn2 1.0.0 :: flash_attn","role":"attention[f32]"' > /dev/null ||
    fail "v1 does not serve: $(curl -s -H "$AUTH" "$BASE/v1/kernels" | head -c 600)"
echo "ok   serving $MODEL with kernels-community/flash-attn2@v1"

# v1's cached plugin files tampered with: loading v1 again must fail its
# digest check (the server's copy was sealed in memory at load and runs on)
n=0
for f in $(find cache -path '*flash-attn2*' -name '*.so' | grep -v "$V2"); do
    t_flip_byte "$(readlink -f "$f")" 4000
    n=$((n + 1))
done
[ $n -gt 0 ] || fail "no cached v1 plugin to tamper with: $(find cache | head -n 40)"

# --- the load test ----------------------------------------------------------
python3 "$SRC/tests/serve_load.py" "$BASE" "$KEY" --mode chat --max-tokens 12 \
    --clients 32 --requests 4 --deadline 800 --gap 1 \
    --reload attention=kernels-community/flash-attn2@v2 \
    --refuse 'attention=kernels-community/flash-attn2@v1:422:KHUB_STATUS_DIGEST_MISMATCH' \
    --refuse 'attention=other-org/flash-attn2:422:KHUB_STATUS_UNSIGNED' > load.out 2>&1 ||
    { cat load.out; fail "the load test (above)"; }
cat load.out

# --- after: kernels, metrics, a wrong key ------------------------------------
curl -s -H "$AUTH" "$BASE/v1/kernels" > k.json
V2=$V2 python3 - k.json << 'EOF' || fail "kernels after the swap: $(head -c 800 k.json)"
import json, os, sys
k = json.load(open(sys.argv[1]))
att = [e["binding"] for e in k["data"] if e["role"] == "attention[f32]"]
assert att == ["kernels-community/flash-attn2 2.0.0 :: flash_attn"], att
assert k["reloads"] == 1 and k["reload_failures"] == 2, (k["reloads"], k["reload_failures"])
r = k["reload_history"][0]
assert r["previous"] == "kernels-community/flash-attn2 1.0.0 :: flash_attn", r
assert r["resolved"].startswith("attention: kernels-community/flash-attn2@v2 -> kernels-community/flash-attn2 commit " + os.environ["V2"][:12]), r
assert "accepted by the policy" in r["resolved"], r
EOF
curl -s "$BASE/metrics" | grep '^khub_kernel_calls_total{role="attention"' > att.txt
grep -Eq 'kernel="kernels-community/flash-attn2 1.0.0 :: flash_attn",state="retired"\} [1-9][0-9]*$' att.txt &&
    grep -Eq 'kernel="kernels-community/flash-attn2 2.0.0 :: flash_attn",state="active"\} [1-9][0-9]*$' att.txt ||
    fail "calls on v1 and v2: $(cat att.txt)"
out=$(curl -s -H "Authorization: Bearer $KEY-" -w '\n%{http_code}' "$BASE/v1/kernels/reload" \
    -d '{"role":"attention","kernel":"kernels-community/flash-attn2@v1"}')
[ "$(tail -n 1 <<< "$out")" = 401 ] || fail "wrong key: $out"
echo "ok   after the load: v2 serves (commit, trust decision), v1 retired with its calls, a wrong key 401"

kill -TERM $SRV
wait $SRV 2> /dev/null || true
SRV=

# --- a locked server: the lock's rules hold for a reload ----------------------
# (the tiny Gemma, head dim 256, which flash-attn2 serves; a fresh cache; the
# dense cache named, as flash-attn2 has no paged_attention op and a server's
# batch otherwise takes the paged pool)
mkdir lk
echo '{"format": 1, "roles": {"attention": "kernels-community/flash-attn2@version=1"}}' > lk/khub.json
KHUB_CACHE=$T/cache2 "$KHUB" lock lk > lk.out 2>&1 || fail "lock: $(cat lk.out)"
V1=$(KHUB_CACHE=$T/cache2 "$KHUB" resolve kernels-community/flash-attn2@v1)
KHUB_CACHE=$T/cache2 "$KHUB" serve-model --model "$SRC/tests/fixtures/gemma3_tiny" --port 0 \
    --threads 1 --api-key "$KEY" --policy policy.json --lock lk/khub.lock --cache dynamic \
    > srv2.out 2> srv2.err &
SRV=$!
for _ in $(seq 300); do
    grep -q http srv2.out 2> /dev/null && break
    kill -0 $SRV 2> /dev/null || fail "locked serve-model exited: $(cat srv2.err)"
    sleep 0.1
done
BASE=$(grep -o 'http://[0-9.:]*' srv2.out | head -n 1 || true)
lreload() { curl -s -H "$AUTH" -w '\n%{http_code}' "$BASE/v1/kernels/reload" -d "$1"; }
out=$(lreload '{"role":"attention","kernel":"other-org/flash-attn2"}')
[ "$(tail -n 1 <<< "$out")" = 404 ] &&
    grep -qF "other-org/flash-attn2 is not in lk/khub.lock; add it to khub.json and run khub lock" <<< "$out" ||
    fail "a kernel outside the lock: $out"
out=$(lreload "{\"role\":\"attention\",\"kernel\":\"kernels-community/flash-attn2@$V2\"}")
[ "$(tail -n 1 <<< "$out")" = 422 ] && grep -qF "KHUB_STATUS_LOCK_MISMATCH" <<< "$out" ||
    fail "a commit other than the locked one: $out"
# a branch names no commit: the lock's commit is loaded, as at model load
for id in kernels-community/flash-attn2 kernels-community/flash-attn2@v2; do
    out=$(lreload "{\"role\":\"attention\",\"kernel\":\"$id\"}")
    [ "$(tail -n 1 <<< "$out")" = 200 ] &&
        grep -qF "commit ${V1:0:12}" <<< "$out" && grep -qF "(locked, hashes re-checked)" <<< "$out" ||
        fail "the locked kernel as $id: $out"
done
kill -TERM $SRV
wait $SRV 2> /dev/null || true
SRV=
echo "ok   with --lock a reload loads the locked commit, hashes re-checked (also for @v2); outside the lock: 404; another commit: 422"
# under the sanitizers (tools/test.sh's pass) a report fails the test
! grep -E "AddressSanitizer|LeakSanitizer|runtime error:" srv.err srv2.err ||
    fail "sanitizer report (above)"
echo "passed"
