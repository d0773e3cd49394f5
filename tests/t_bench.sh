#!/usr/bin/env bash
# t_bench.sh: `khub bench --latency` on a cached, commit-pinned kernel from
# khub serve: the output format (text and --json), zero requests offline,
# and its errors; then `khub bench DIR` (op micro-benchmarks against
# ref-cpu) on a built copy of kernels-src/rmsnorm, and `khub bench ID` on
# that build published to the server; `khub bench-ops --quick`. A smoke
# test of the formats, not of the timings.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin bench

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

t_serve "$T/repos" "$T/out" --log "$T/log"
export HF_ENDPOINT=$EP
export KHUB_CACHE=$T/cache
# the default trust policy only: none of the user's
export XDG_CONFIG_HOME=$T/config
unset KHUB_POLICY

"$KHUB" bench --help | grep "usage: khub bench DIR|ID" > /dev/null || fail "bench --help"
"$KHUB" bench --help | grep "khub bench --latency ID" > /dev/null || fail "bench --help (latency)"
set +e
out=$(HF_HUB_OFFLINE=1 timeout 20 "$KHUB" bench --latency org/bk@$C1 -n 5 2>&1); rc=$?
set -e
[ $rc = 1 ] || fail "not cached: exit $rc, want 1: $out"
grep -q "download it first" <<<"$out" || fail "not cached message: $out"

timeout 20 "$KHUB" download org/bk@v1 --quiet || fail "download"
before=$(wc -l < "$T/log")
out=$(HF_HUB_OFFLINE=1 timeout 30 "$KHUB" bench --latency org/bk@$C1 -n 50) || fail "bench: $out"
grep -Eq "^org/bk@$C1 @${C1:0:12} $V: 50 iterations, 1 files, [0-9]+ bytes verified per call$" <<<"$out" \
    || fail "first line: $out"
grep -Eq "^resolve \+ verify: median [0-9.]+ us, p90 [0-9.]+ us \(resolve alone: median [0-9.]+ us\); 0 requests$" <<<"$out" \
    || fail "second line: $out"
bytes=$(echo "$out" | sed -n 's/.* \([0-9]*\) bytes verified.*/\1/p')
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
t_flip_byte "$blob" 10
set +e
out=$(HF_HUB_OFFLINE=1 timeout 20 "$KHUB" bench --latency org/bk@$C1 -n 5 2>&1); rc=$?
set -e
[ $rc = 1 ] || fail "tampered: exit $rc"
grep -q "metadata.json says" <<<"$out" || fail "tampered message: $out"

# op micro-benchmarks: a built copy of an in-tree kernel
RMS=$SRC/kernels-src/rmsnorm
cp -r "$RMS" "$T/rmsnorm-copy"
rm -rf "$T/rmsnorm-copy/build"
set +e
out=$(cd "$T" && "$KHUB" bench rmsnorm-copy 2>&1); rc=$?
set -e
[ $rc = 1 ] || fail "unbuilt DIR: exit $rc: $out"
grep -q "no metadata.json; build the kernel first" <<<"$out" || fail "unbuilt message: $out"
(cd "$T" && "$KHUB" build rmsnorm-copy --quiet > build.log 2>&1) || fail "build: $(cat "$T/build.log")"
out=$(cd "$T" && timeout 60 "$KHUB" bench rmsnorm-copy --time 0.05) || fail "bench DIR: $out"
grep -Eq "^kernels-community/rmsnorm \(rmsnorm-[a-z0-9]+\.so, $V\): 2 op benchmarks against khub/ref-cpu, 0\.05 s each, 1 thread$" <<< "${out%%$'\n'*}" \
    || fail "bench DIR header: $out"
[ "$(echo "$out" | grep -Ec '^rms_norm \[(4, 576|33, 1024)\] f32: [0-9.]+ us \([0-9.]+ GB/s\), ref-cpu [0-9.]+ us \([0-9.]+ GB/s\), speedup [0-9.]+x$')" = 2 ] \
    || fail "bench DIR lines: $out"
json=$(cd "$T" && timeout 60 "$KHUB" bench rmsnorm-copy --time 0.02 --threads 2 --json) || fail "bench DIR json"
python3 - "$json" <<'PY' || fail "bench DIR json fields: $json"
import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines()]
assert [r["shape"] for r in rows] == [[4, 576], [33, 1024]], rows
for r in rows:
    assert r["what"] == "op_bench" and r["plugin"] == "kernels-community/rmsnorm", r
    assert r["op"] == "rms_norm" and r["dtype"] == "f32" and r["unit"] == "GB/s", r
    assert r["us"] > 0 and r["ref_us"] > 0 and r["rate"] > 0, r
    assert abs(r["speedup"] - r["ref_us"] / r["us"]) < 0.01 * r["speedup"] + 1e-3, r
PY
# khub bench ID: the same build published to the local hub, then fetched,
# verified and trusted as `khub fetch` does (unsigned: refused unless
# --allow-unsigned), and timed on one shape per kind.
timeout 60 "$KHUB" publish "$T/rmsnorm-copy" --repo kernels-community/rmsnorm --quiet \
    > "$T/publish.out" 2>&1 || fail "publish: $(cat "$T/publish.out")"
set +e
out=$(timeout 60 "$KHUB" bench kernels-community/rmsnorm@v1 --time 0.02 2>&1); rc=$?
set -e
[ $rc = 1 ] || fail "bench ID unsigned: exit $rc: $out"
grep -q "unsigned kernel from an organisation the policy does not list; opt in with --allow-unsigned" <<<"$out" \
    || fail "bench ID unsigned message: $out"
out=$(timeout 60 "$KHUB" bench kernels-community/rmsnorm@v1 --time 0.02 --allow-unsigned) \
    || fail "bench ID: $out"
grep -Eq "^kernels-community/rmsnorm \(kernels-community/rmsnorm@[0-9a-f]{12}, rmsnorm-[a-z0-9]+\.so, $V\): 1 op benchmark against khub/ref-cpu, 0\.02 s each, 1 thread$" <<< "${out%%$'\n'*}" \
    || fail "bench ID header: $out"
sed -n 2p <<< "$out" | grep -E '^rms_norm \[16, 2048\] f32: [0-9.]+ us \([0-9.]+ GB/s\), ref-cpu [0-9.]+ us \([0-9.]+ GB/s\), speedup [0-9.]+x$' > /dev/null \
    || fail "bench ID line: $out"
before=$(wc -l < "$T/log")
HF_HUB_OFFLINE=1 timeout 60 "$KHUB" bench kernels-community/rmsnorm@v1 --time 0.02 \
    --allow-unsigned --json > "$T/id.json" || fail "bench ID offline json"
[ "$(wc -l < "$T/log")" = "$before" ] || fail "offline bench ID made a request"
python3 - "$T/id.json" <<'PY' || fail "bench ID json: $(cat "$T/id.json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1 and rows[0]["op"] == "rms_norm" and rows[0]["shape"] == [16, 2048], rows
assert rows[0]["plugin"] == "kernels-community/rmsnorm" and rows[0]["us"] > 0, rows
PY

# every other in-tree kernel: khub bench DIR times each declared self-test
# shape next to ref-cpu, khub bench ID (published, fetched, verified) one
# shape of its kind (here-strings, not pipes into grep -q: see t_author.sh)
for n in flash-attn2 activation quantization kv-cache; do
    rm -rf "$T/$n" && cp -r "$SRC/kernels-src/$n" "$T/$n" && rm -rf "$T/$n/build"
    (cd "$T" && "$KHUB" build "$n" --quiet > build.log 2>&1) || fail "build $n: $(cat "$T/build.log")"
    tests=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["selftests"]))' "$T/$n/kernel.json")
    out=$(cd "$T" && timeout 120 "$KHUB" bench "$n" --time 0.01) || fail "bench DIR $n: $out"
    grep -Eq "^kernels-community/$n \($n-[a-z0-9]+\.so, $V\): $tests op benchmarks? against khub/ref-cpu" <<< "${out%%$'\n'*}" \
        || fail "bench DIR $n header: $out"
    [ "$(grep -Ec '^[a-z_]+ \[[0-9, ]+\] [a-z0-9_]+: [0-9.]+ us \([0-9.]+ [GT][BF][A-Z/]*s?\), ref-cpu [0-9.]+ us \([0-9.]+ [GT][BF][A-Z/]*s?\), speedup [0-9.]+x$' <<< "$out")" = "$tests" ] \
        || fail "bench DIR $n lines ($tests expected): $out"
    timeout 60 "$KHUB" publish "$T/$n" --repo "kernels-community/$n" --quiet > "$T/publish.out" 2>&1 \
        || fail "publish $n: $(cat "$T/publish.out")"
    out=$(timeout 120 "$KHUB" bench "kernels-community/$n@v1" --time 0.01 --allow-unsigned) || fail "bench ID $n: $out"
    grep -Eq "^kernels-community/$n \(kernels-community/$n@[0-9a-f]{12}, $n-[a-z0-9]+\.so, $V\): 1 op benchmark against khub/ref-cpu" <<< "${out%%$'\n'*}" \
        || fail "bench ID $n header: $out"
    grep -Eq '^[a-z_]+ \[[0-9, ]+\] [a-z0-9_]+: [0-9.]+ us .*, ref-cpu [0-9.]+ us .*speedup [0-9.]+x$' <<< "$out" || fail "bench ID $n line: $out"
done

# a tampered build is refused, not timed
so=$(ls "$T"/rmsnorm-copy/build/$V/*.so | head -1)
t_flip_byte "$so" 100
set +e
out=$(cd "$T" && "$KHUB" bench rmsnorm-copy 2>&1); rc=$?
set -e
[ $rc = 1 ] || fail "tampered DIR: exit $rc: $out"
grep -qi "sha-256\|digest" <<<"$out" || fail "tampered DIR message: $out"
set +e
out=$("$KHUB" bench rmsnorm-copy --time 0 2>&1); rc=$?
set -e
[ $rc = 2 ] || fail "--time 0: exit $rc"
grep -q -- "--time must be in" <<<"$out" || fail "--time message: $out"
# khub bench-ops: the built-in plugins side by side (format only). The
# table is stdout; a plugin this CPU (or KHUB_CPU_LEVEL) cannot run is
# skipped with a line on stderr, which must not come before the header
# (issue 11: on a CPU without AVX-512 it did, through 2>&1).
out=$(timeout 300 "$KHUB" bench-ops --quick --time 0.002 2> "$T/bench-ops.err") \
    || fail "bench-ops: $out $(cat "$T/bench-ops.err")"
grep -q "^khub bench-ops: 1 thread(s), " <<< "${out%%$'\n'*}" || fail "bench-ops header: $out"
[ "$(echo "$out" | grep -Ec '^qlinear Q4_1 n=1 1536x576 cold +\| ref-cpu\.so +[0-9.]+ us +[0-9.]+ GF +[0-9.]+ GB \| cpu-avx2\.so ')" = 1 ] \
    || fail "bench-ops line: $out"
if grep -v '^khub bench-ops: skipping cpu-avx[0-9]*\.so (' "$T/bench-ops.err" > /dev/null; then
    fail "bench-ops stderr has more than skip lines: $(cat "$T/bench-ops.err")"
fi
# the features khub uses (KHUB_CPU_LEVEL applied) decide which columns
# are timed and which are skipped
feats=" $("$KHUB" cpu | sed -n 's/^features //p') "
has() { for x; do [[ "$feats" == *" $x "* ]] || return 1; done; }
for f in cpu-avx2 cpu-avx512; do
    need="avx2 fma f16c"
    [ $f = cpu-avx512 ] && need="$need avx512f avx512vnni"
    # shellcheck disable=SC2086
    if has $need; then
        grep -Eq "\| $f\.so +[0-9.]+ us" <<< "$out" || fail "features$feats: $f not timed: $out"
    else
        grep -q "^khub bench-ops: skipping $f\.so (cannot run on this CPU" "$T/bench-ops.err" \
            || fail "features$feats: $f not skipped: $(cat "$T/bench-ops.err")"
        grep -Eq "\| $f\.so +-( |$)" <<< "$out" || fail "features$feats: $f column not '-': $out"
    fi
done
set +e
out=$("$KHUB" bench-ops --time 0 2>&1); rc=$?
set -e
[ $rc = 2 ] || fail "bench-ops --time 0: exit $rc"
grep -q -- "--time must be in (0, 600\] seconds" <<<"$out" || fail "bench-ops --time message: $out"
echo "t_bench: ok"
