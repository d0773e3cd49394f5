#!/usr/bin/env bash
# tools/bench/hub.sh: cold `khub download ID` against `curl -o /dev/null` of
# the same file's resolve URL, both from `khub serve` on loopback.
#
# usage: tools/bench/hub.sh [--build DIR] [--size-mb 100] [--rounds 5] [--work DIR]
#
# It writes a kernel repo (bench/big, branch v1) in the `khub serve` layout
# (docs/hub-server.md) whose variant build/khub1-cpu-<arch>-linux/ holds one
# random LFS file of --size-mb MiB and a metadata.json with its SHA-256, serves
# it, and runs --rounds rounds. Each round runs, in alternating order, a
# download into an empty KHUB_CACHE (resolve, listing, HEAD, GET, hash check,
# publish, variant verification: everything `khub download` does) and one
# curl GET of the resolve URL to /dev/null. Output: one line per sample and a
# Markdown summary with medians, throughputs (MiB/s of the file) and the
# ratio khub/curl of throughputs. Then the resolve + verify latency of a
# cached, commit-pinned kernel (`khub bench --latency`, 1000 iterations) on a
# variant made of the built plugins. Wall clock: run it on a quiet machine.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${KHUB_BUILD:-$here/../../build}
size_mb=100
rounds=5
work=
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --size-mb) size_mb=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "hub.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
    esac
done
khub=$build/bin/khub
[ -x "$khub" ] || { echo "hub.sh: no khub at $khub; build first or pass --build" >&2; exit 1; }
command -v curl >/dev/null || { echo "hub.sh: curl is not installed" >&2; exit 1; }
work=${work:-$(mktemp -d /tmp/khub-bench-hub.XXXXXX)}
mkdir -p "$work"

arch=$(uname -m)
variant=khub1-cpu-$arch-linux
commit=$(printf 'bench %s' "$size_mb" | sha1sum | cut -c1-40)
repo=$work/repos/bench/big
vdir=$repo/commits/$commit/build/$variant
if [ ! -f "$vdir/libbig.so" ] || [ "$(stat -c %s "$vdir/libbig.so")" != $((size_mb << 20)) ]; then
    mkdir -p "$vdir"
    head -c $((size_mb << 20)) /dev/urandom > "$vdir/libbig.so"
fi
sha=$(sha256sum "$vdir/libbig.so" | cut -c1-64)
printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' "$commit" "$commit" > "$repo/refs.json"
cat > "$vdir/metadata.json" <<JSON
{"format":1,"name":"bench/big","version":"1.0.0","major":1,"variant":"$variant",
 "abi":{"major":1,"minor":0},"backend":{"type":"cpu","archs":["$arch"]},
 "plugins":[{"file":"libbig.so","level":"generic","cpu_features":[]}],
 "files":{"libbig.so":"$sha"},"provenance":{"source_commit":"unknown","dirty":false}}
JSON

"$khub" serve "$work/repos" --port 0 > "$work/serve.out" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null || true' EXIT
for _ in $(seq 50); do grep -q '^serving' "$work/serve.out" && break; sleep 0.1; done
endpoint=$(grep -o 'http://[0-9.:]*' "$work/serve.out" | head -1)
[ -n "$endpoint" ] || { echo "hub.sh: khub serve did not start: $(cat "$work/serve.out")" >&2; exit 1; }
url=$endpoint/kernels/bench/big/resolve/$commit/build/$variant/libbig.so

now() { date +%s.%N; }
run_khub() {
    rm -rf "$work/cache"
    local t0 t1
    t0=$(now)
    HF_ENDPOINT=$endpoint KHUB_CACHE=$work/cache "$khub" download bench/big@v1 --quiet
    t1=$(now)
    cmp -s "$work/cache/kernels--bench--big/snapshots/$commit/build/$variant/libbig.so" \
        "$vdir/libbig.so" || { echo "hub.sh: khub's copy differs" >&2; exit 1; }
    echo "khub $(echo "$t1 - $t0" | bc -l)"
}
run_curl() {
    local t0 t1
    t0=$(now)
    curl -sf -o /dev/null "$url"
    t1=$(now)
    echo "curl $(echo "$t1 - $t0" | bc -l)"
}

samples=$work/samples.txt
: > "$samples"
echo "hub.sh: $rounds rounds, ${size_mb} MiB, $endpoint, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then run_khub; run_curl; else run_curl; run_khub; fi | tee -a "$samples" >&2
done

# Resolve + verify latency: a second repo (bench/small) whose variant holds
# the built plugins (real .so files, the size of a kernel), downloaded once,
# then `khub bench --latency` on the commit-pinned ID, offline.
small=$work/repos/bench/small
scommit=$(printf 'bench small' | sha1sum | cut -c1-40)
sdir=$small/commits/$scommit/build/$variant
mkdir -p "$sdir"
files='' plugins=''
for so in "$build"/plugins/*.so; do
    b=$(basename "$so")
    cp "$so" "$sdir/$b"
    files="$files${files:+,}\"$b\":\"$(sha256sum "$sdir/$b" | cut -c1-64)\""
    plugins="$plugins${plugins:+,}{\"file\":\"$b\",\"level\":\"generic\",\"cpu_features\":[]}"
done
printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' "$scommit" "$scommit" > "$small/refs.json"
printf '{"format":1,"name":"bench/small","version":"1.0.0","major":1,"variant":"%s","abi":{"major":1,"minor":0},"backend":{"type":"cpu","archs":["%s"]},"plugins":[%s],"files":{%s},"provenance":{"source_commit":"unknown","dirty":false}}' \
    "$variant" "$arch" "$plugins" "$files" > "$sdir/metadata.json"
rm -rf "$work/cache"
HF_ENDPOINT=$endpoint KHUB_CACHE=$work/cache "$khub" download bench/small@v1 --quiet
latency=$(HF_HUB_OFFLINE=1 KHUB_CACHE=$work/cache "$khub" bench --latency "bench/small@$scommit" -n 1000)

median() { grep "^$1 " "$samples" | awk '{print $2}' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mk=$(median khub)
mc=$(median curl)
awk -v mk="$mk" -v mc="$mc" -v mb="$size_mb" -v n="$rounds" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" 'BEGIN {
    printf "| %d MiB, %d rounds (load after: %s) | median s | MiB/s |\n|---|---:|---:|\n", mb, n, load
    printf "| khub download (cold cache) | %.3f | %.0f |\n", mk, mb / mk
    printf "| curl -o /dev/null | %.3f | %.0f |\n", mc, mb / mc
    printf "\nkhub/curl throughput ratio: %.2f\n", mc / mk
}'
echo
echo "resolve + verify (khub bench --latency bench/small@$scommit -n 1000, offline):"
echo "$latency"
