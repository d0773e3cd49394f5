#!/usr/bin/env bash
# t_cache_procs.sh: eight processes on one cache (issue 10 item 7), through
# `khub fetch` against `khub serve`. A signed kv-cache build is served file by
# file (no per-variant archive), so every process links the same snapshot
# files while the others verify the variant folder; every third round the same
# build comes as an archive, which all eight unpack and race to publish. Each round starts from an
# empty cache and runs eight fetches (download, verify, load) at once; every
# one must load the plugin. Temporary names are made outside the folder
# (<repo>/.khub-tmp/), so no verifier ever lists one: with them inside the
# folder a fetch failed now and then ("F.<8hex>.tmp is not listed in
# metadata.json"). Then `khub cache verify` must find the cache clean, and a
# temporary left by a killed older version is reported by `khub cache verify`
# and removed by `khub cache prune`, after which the variant loads again.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin procs
ARCH=$(uname -m); V=khub1-cpu-$ARCH-linux
C1=1111111111111111111111111111111111111111
ROUNDS=${KHUB_PROCS_ROUNDS:-12}

cp -r "$SRC/kernels-src/kv-cache" kv && rm -rf kv/build
"$KHUB" build kv --quiet > build.log 2>&1 || fail "build: $(cat build.log)"
"$KHUB" keygen alice > /dev/null
# the archive copy is served as kernels-community/kv-archive: its metadata.json
# must name that repo (a load checks the name), signed again
cp -r kv kvarch && sed -i 's#"kernels-community/kv-cache"#"kernels-community/kv-archive"#' \
    "kvarch/build/$V/metadata.json"
"$KHUB" sign --key alice.key kv > /dev/null || fail "sign"
"$KHUB" sign --key alice.key kvarch > /dev/null || fail "sign kvarch"
printf '{"version":1,"publishers":{"kernels-community":["%s"]}}' "$(cat alice.pub)" > policy.json
export KHUB_POLICY=$T/policy.json
d=repos/kernels-community/kv-cache/commits/$C1/build
mkdir -p "$d" && cp -r "kv/build/$V" "$d/$V" # no $V.tar.gz: file by file
printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' $C1 $C1 \
    > repos/kernels-community/kv-cache/refs.json
# the same build with a per-variant archive: processes race to publish it
a=repos/kernels-community/kv-archive/commits/$C1/build
mkdir -p "$a" && cp -r "kvarch/build/$V" "$a/$V" && (cd "$a/$V" && tar -czf "../$V.tar.gz" ./*)
cp repos/kernels-community/kv-cache/refs.json repos/kernels-community/kv-archive/refs.json

t_serve repos serve.out --log log
export HF_ENDPOINT=$EP HF_TOKEN=

# round R: repo kv-cache (file by file), and every third round kv-archive, whose
# losers of the publish race verify the winner's copy
for r in $(seq 1 "$ROUNDS"); do
    export KHUB_CACHE=$T/cache$r
    repo=kv-cache
    [ $((r % 3)) = 0 ] && repo=kv-archive
    pids=()
    for p in 1 2 3 4 5 6 7 8; do
        "$KHUB" fetch kernels-community/$repo@v1 > "f$r.$p.out" 2>&1 &
        pids+=($!)
    done
    for p in 1 2 3 4 5 6 7 8; do
        wait "${pids[$((p - 1))]}" || fail "round $r, process $p failed: $(cat "f$r.$p.out")"
        grep -q "^plugin   kernels-community/kv-cache" "f$r.$p.out" ||
            fail "round $r, process $p loaded nothing: $(cat "f$r.$p.out")"
    done
    "$KHUB" cache verify > verify.out 2>&1 || fail "round $r: cache verify: $(cat verify.out)"
    [ -z "$(ls -A "$KHUB_CACHE/kernels--kernels-community--$repo/.khub-tmp")" ] ||
        fail "round $r: temporaries left: $(ls -A "$KHUB_CACHE/kernels--kernels-community--$repo/.khub-tmp")"
    rm -rf "$KHUB_CACHE"
done
echo "ok   $ROUNDS rounds of 8 processes fetching and loading one variant (file by file, archive)"

# A kill of an older version left its temporary link in the variant folder.
export KHUB_CACHE=$T/cache-debris
"$KHUB" fetch kernels-community/kv-cache@v1 > f.out 2>&1 || fail "debris setup: $(cat f.out)"
vdir=$KHUB_CACHE/kernels--kernels-community--kv-cache/snapshots/$C1/build/$V
so=$(basename "$(ls "$vdir"/*.so | head -n 1)")
ln -s "../../../../blobs/gone" "$vdir/$so.0badc0de.tmp"
if "$KHUB" fetch kernels-community/kv-cache@v1 > f.out 2>&1; then fail "loaded with debris: $(cat f.out)"; fi
grep -q "khub cache prune removes it" f.out || fail "debris message: $(cat f.out)"
if "$KHUB" cache verify > verify.out 2>&1; then fail "cache verify missed it: $(cat verify.out)"; fi
grep -q "^stale .*$so.0badc0de.tmp (temporary link left inside a snapshot" verify.out &&
    grep -q "run khub cache prune to remove them" verify.out ||
    fail "cache verify report: $(cat verify.out)"
"$KHUB" cache prune > prune.out 2>&1 || fail "prune: $(cat prune.out)"
grep -q "^temporary .*$so.0badc0de.tmp" prune.out || fail "prune report: $(cat prune.out)"
[ ! -L "$vdir/$so.0badc0de.tmp" ] || fail "prune left the temporary link"
"$KHUB" cache verify > verify.out 2>&1 || fail "cache verify after prune: $(cat verify.out)"
"$KHUB" fetch kernels-community/kv-cache@v1 > f.out 2>&1 || fail "after prune: $(cat f.out)"
echo "ok   a killed download's temporary is reported by cache verify and removed by cache prune"
echo "2 passed, 0 failed"
