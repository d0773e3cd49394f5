#!/usr/bin/env bash
# t_bench.sh: `khub bench --latency` on a cached, commit-pinned kernel from
# khub serve: the output format (text and --json), zero requests offline,
# and its errors. A smoke test of the format, not of the timings.
set -euo pipefail
KHUB=${KHUB_BIN:?KHUB_BIN is set by ctest}
T=$(mktemp -d /tmp/khub-t-bench-XXXXXX)
SRV=
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

C1=3333333333333333333333333333333333333333
ARCH=$(uname -m); V=khub1-cpu-$ARCH-linux
R=$T/repos/org/bk; D=$R/commits/$C1/build/$V
mkdir -p "$D"
printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' $C1 $C1 > $R/refs.json
head -c 65536 /dev/urandom > $D/libk.so
SHA=$(sha256sum $D/libk.so | cut -d' ' -f1)
cat > $D/metadata.json <<JSON
{"format":1,"name":"org/bk","version":"1.0.0","major":1,"variant":"$V",
 "abi":{"major":1,"minor":0},"backend":{"type":"cpu","archs":["$ARCH"]},
 "plugins":[{"file":"libk.so","level":"generic","cpu_features":[]}],
 "files":{"libk.so":"$SHA"},"provenance":{"source_commit":"unknown","dirty":false}}
JSON

"$KHUB" serve "$T/repos" --log "$T/log" > "$T/out" &
SRV=$!
for _ in $(seq 50); do grep -q http "$T/out" 2>/dev/null && break; sleep 0.1; done
export HF_ENDPOINT=$(grep -o 'http://[0-9.:]*' "$T/out")
[ -n "$HF_ENDPOINT" ] || fail "serve printed no address"
export KHUB_CACHE=$T/cache

"$KHUB" bench --help | grep -q "usage: khub bench --latency" || fail "bench --help"
set +e
out=$(HF_HUB_OFFLINE=1 timeout 20 "$KHUB" bench --latency org/bk@$C1 -n 5 2>&1); rc=$?
set -e
[ $rc = 1 ] || fail "not cached: exit $rc, want 1: $out"
echo "$out" | grep -q "download it first" || fail "not cached message: $out"

timeout 20 "$KHUB" download org/bk@v1 --quiet || fail "download"
before=$(wc -l < "$T/log")
out=$(HF_HUB_OFFLINE=1 timeout 30 "$KHUB" bench --latency org/bk@$C1 -n 50) || fail "bench: $out"
echo "$out" | grep -Eq "^org/bk@$C1 @${C1:0:12} $V: 50 iterations, 1 files, [0-9]+ bytes hashed per call$" \
    || fail "first line: $out"
echo "$out" | grep -Eq "^resolve \+ verify: median [0-9.]+ us, p90 [0-9.]+ us \(resolve alone: median [0-9.]+ us\); 0 requests$" \
    || fail "second line: $out"
bytes=$(echo "$out" | sed -n 's/.* \([0-9]*\) bytes hashed.*/\1/p')
[ "$bytes" = 65536 ] || fail "bytes hashed $bytes"
[ "$(wc -l < "$T/log")" = "$before" ] || fail "offline bench made a request"

json=$(HF_HUB_OFFLINE=1 timeout 30 "$KHUB" bench --latency org/bk@$C1 -n 10 --json) || fail "json"
python3 - "$json" "$C1" "$V" <<'PY' || fail "json fields: $json"
import json, sys
j = json.loads(sys.argv[1])
assert j["what"] == "hub_latency" and j["commit"] == sys.argv[2] and j["variant"] == sys.argv[3], j
assert j["iterations"] == 10 and j["files"] == 1 and j["requests"] == 0, j
assert 0 < j["median_us"] <= j["p90_us"], j
PY

# a tampered cache fails the bench instead of timing a broken kernel
blob=$(readlink -f "$KHUB_CACHE/kernels--org--bk/snapshots/$C1/build/$V/libk.so")
printf 'Z' | dd of="$blob" bs=1 seek=10 conv=notrunc status=none
set +e
out=$(HF_HUB_OFFLINE=1 timeout 20 "$KHUB" bench --latency org/bk@$C1 -n 5 2>&1); rc=$?
set -e
[ $rc = 1 ] || fail "tampered: exit $rc"
echo "$out" | grep -q "metadata.json says" || fail "tampered message: $out"

set +e
out=$("$KHUB" bench org/bk@$C1 2>&1); rc=$?
set -e
[ $rc = 2 ] || fail "ops form: exit $rc"
echo "$out" | grep -q "not implemented yet" || fail "ops form message: $out"
echo "t_bench: ok"
