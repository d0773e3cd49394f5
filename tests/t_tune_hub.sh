#!/usr/bin/env bash
# t_tune_hub.sh: `khub tune --kernels-from ENDPOINT` against a live local hub
# (`khub serve`, issue 17 leftovers 1 and 2) on the committed tiny Gemma 3
# (head size 256, which kernels-community/flash-attn2 serves).
#
# flash-attn2 is built, signed and published to `khub serve` as in
# t_run_hub.sh. With a policy that trusts its key, the Hub kernel candidate is
# fetched from the endpoint, verified and measured; every baseline run is
# made 3 s slower (--inject-failure baseline:slow), so the candidate wins on
# throughput whatever this machine's speed, and `--save` writes the khub.json
# naming it and a khub.lock pinning it (khub_project.h, as `khub lock`),
# which `khub run --kernels --lock` then loads with its hashes re-checked (an
# edited lock is refused). With a policy that does not trust the key, the
# same candidate fails verification: it is reported unverified with the
# policy's reason and never recommended, although the slowed baseline would
# lose to it, and no lock is written. Also --levers' errors.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin tunehub
command -v python3 > /dev/null || t_skip "python3 absent"
G=$SRC/tests/fixtures/gemma3_tiny
ID=kernels-community/flash-attn2

cp -r "$SRC/kernels-src/flash-attn2" fa && rm -rf fa/build
"$KHUB" keygen pub > /dev/null
"$KHUB" keygen other > /dev/null
"$KHUB" build fa --quiet > build.log 2>&1 || { cat build.log; fail "build flash-attn2"; }
"$KHUB" sign --key pub.key fa > /dev/null || fail "sign flash-attn2"
mkdir hub
t_serve hub serve.out --token t0k
"$KHUB" publish fa --endpoint "$EP" --token t0k --quiet > /dev/null || fail "publish flash-attn2"
COMMIT=$(HF_ENDPOINT=$EP "$KHUB" resolve "$ID@v1")
for k in pub other; do
    printf '{"version": 1, "publishers": {"kernels-community": ["%s"]}}\n' "$(cat $k.pub)" \
        > "policy-$k.json"
done
cat > w.jsonl << 'EOF'
{"concurrency": 2}
{"prompt": "The capital of France is", "max_tokens": 8}
{"prompt": "one two three", "max_tokens": 6}
EOF
export HF_ENDPOINT=$EP

# ---- a trusted Hub kernel: measured, recommended, saved and locked ----------
KHUB_CACHE=$T/c1 KHUB_POLICY=$T/policy-pub.json "$KHUB" tune --model "$G" --workload w.jsonl \
    --kernels-from "$EP" --levers kernels --goal throughput --inject-failure baseline:slow \
    --save rec.json --json > t1.json 2> t1.err || { cat t1.err; fail "tune against the hub"; }
python3 - t1.json rec.json rec.lock "$ID" "$COMMIT" << 'PY' || fail "trusted kernel: $(cat t1.err)"
import json, sys
r = json.load(open(sys.argv[1]))
kid, commit = sys.argv[4], sys.argv[5]
names = [c["name"] for c in r["candidates"]]
assert names == ["baseline#1", "baseline#2", "attn=" + kid], names  # --levers kernels
row = r["candidates"][2]
assert row["state"] == "measured" and row["lever"] == "kernels", row
assert row["measured"]["token_agreement"] == 1.0, row
assert row["winner"] and row["verdict"].startswith("winner: throughput +"), row
rec = r["recommendation"]
assert rec["name"] == "attn=" + kid and rec["run_flags"] == "--attn " + kid, rec
assert json.load(open(sys.argv[2])) == {"format": 1, "roles": {"attention": kid}}
lock = json.load(open(sys.argv[3]))
(pin,) = lock["kernels"]
assert pin["repo"] == kid and pin["commit"] == commit and pin["version"] == 1, pin
assert "khub1-cpu-x86_64-linux" in pin["variants"], pin
PY
grep -q "^tune: locked $ID -> $COMMIT$" t1.err || fail "no lock line: $(cat t1.err)"
grep -q "^tune: wrote rec.lock (1 kernel)$" t1.err || fail "no lock written: $(cat t1.err)"
echo "ok   a trusted Hub kernel from the endpoint: measured, recommended, khub.json + khub.lock"

KHUB_CACHE=$T/c1 KHUB_POLICY=$T/policy-pub.json "$KHUB" run --model "$G" --kernels rec.json \
    --lock rec.lock --prompt hi --max-new-tokens 2 --explain > run.out 2> run.err ||
    { cat run.err; fail "khub run --kernels rec.json --lock rec.lock"; }
grep -q "^attention: $ID -> $ID commit ${COMMIT:0:12} variant khub1-cpu-x86_64-linux .*(locked, hashes re-checked)" run.out ||
    fail "not loaded through the lock: $(grep '^attention' run.out)"
grep -q "^attention\[f32\]: $ID 1.0.0 :: flash_attn" run.out || fail "flash-attn2 does not serve"
python3 - rec.lock bad.lock << 'PY'
import json, sys
lock = json.load(open(sys.argv[1]))
v = lock["kernels"][0]["variants"]["khub1-cpu-x86_64-linux"]
v["hash"] = "sha256:" + "0" * 64
json.dump(lock, open(sys.argv[2], "w"))
PY
rc=0
KHUB_CACHE=$T/c1b KHUB_POLICY=$T/policy-pub.json "$KHUB" run --model "$G" --kernels rec.json \
    --lock bad.lock --prompt hi --max-new-tokens 2 > run.out 2> run.err || rc=$?
[ "$rc" = 1 ] || fail "an edited lock: exit $rc"
grep -q "bad.lock: kernels\[0\].variants.khub1-cpu-x86_64-linux.hash is sha256:0000000000000000000000000000000000000000000000000000000000000000 but its files hash to sha256:" run.err ||
    fail "edited lock: $(cat run.err)"
echo "ok   khub run loads the recommendation through the lock; an edited lock is refused"

# ---- the same kernel failing verification: unverified, never recommended ---
KHUB_CACHE=$T/c2 KHUB_POLICY=$T/policy-other.json "$KHUB" tune --model "$G" --workload w.jsonl \
    --kernels-from "$EP" --levers kernels --goal throughput --inject-failure baseline:slow \
    --save rec2.json --json > t2.json 2> t2.err || { cat t2.err; fail "tune, untrusted key"; }
python3 - t2.json rec2.json "$ID" << 'PY' || fail "untrusted kernel"
import json, sys
r = json.load(open(sys.argv[1]))
kid = sys.argv[3]
row = r["candidates"][2]
assert row["name"] == "attn=" + kid and row["state"] == "unverified", row
assert "measured" not in row and "winner" not in row, row
assert row["reason"].startswith("load: attention kernel %s: refusing %s@" % (kid, kid)), row
assert "which the policy does not trust for this organisation" in row["reason"], row
assert r["recommendation"]["name"] == "baseline", r["recommendation"]
assert json.load(open(sys.argv[2])) == {"format": 1, "roles": {}}
PY
[ ! -e rec2.lock ] || fail "a lock was written for a recommendation without Hub kernels"
grep -q "tune: wrote" t2.err && fail "a lock line without Hub kernels: $(cat t2.err)"
echo "ok   a kernel failing verification: unverified with the policy's reason, not recommended"

# ---- --levers errors --------------------------------------------------------
rc=0
"$KHUB" tune --model "$G" --levers kernels,speed > out.txt 2> err.txt || rc=$?
[ "$rc" = 1 ] || fail "--levers speed: exit $rc"
grep -qx 'khub tune: khub_tune_run: unknown lever "speed" in levers (known: attention, quantization, cache, threads, batching, kernels, parallelism)' err.txt ||
    fail "--levers speed: $(cat err.txt)"
rc=0
"$KHUB" tune --model "$G" --levers > out.txt 2> err.txt || rc=$?
[ "$rc" = 2 ] && grep -q "^khub tune: --levers needs a value" err.txt || fail "--levers: $rc $(cat err.txt)"
echo "1 passed, 0 failed, 0 skipped"
