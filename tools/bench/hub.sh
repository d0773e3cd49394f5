#!/usr/bin/env bash
# tools/bench/hub.sh: cold `khub download ID` against what a user would
# otherwise run (huggingface_hub's `hf_hub_download`, and `curl -o FILE &&
# sha256sum FILE`) and against `curl -o /dev/null`, all of the same file from
# the same `khub serve` on loopback, in interleaved rounds (issue 14 item 4).
#
# usage: tools/bench/hub.sh [--build DIR] [--before DIR] [--size-mb 100] [--rounds 5]
#                           [--work DIR] [--rate MIB_PER_S] [--python PY]
#
# --python names the interpreter whose huggingface_hub runs `hf_hub_download`
# (default python3; tools/install-test-deps.sh installs it). The sample
# `hf` is the whole process (interpreter start, import, download into an
# empty cache_dir, HF_ENDPOINT at the local server), as `khub download` is;
# `hf_call` is the `hf_hub_download` call alone, timed inside the process.
# hf_hub_download does not hash what it stores (its ETag names the blob), so
# it does less than khub. Without huggingface_hub the hf rows are skipped and
# the script says so.
#
# --rate paces every GET body of both servers to that speed (khub serve's
# `rate` fault), as a network link of that speed would: the same pace for
# curl and khub.
#
# Also in every round: `curl -o FILE`, `curl -o FILE` + `openssl dgst -sha256` + sync
# (curl with khub's guarantees, by hand; OpenSSL, as khub, uses SHA-NI where
# the CPU has it, coreutils' sha256sum does not) and the hash of the file alone
# (the floor a verified download cannot beat here).
#
# It writes a kernel repo (bench/big, branch v1) in the `khub serve` layout
# (docs/hub-server.md) whose variant build/khub1-cpu-<arch>-linux/ holds one
# random LFS file of --size-mb MiB and a metadata.json with its SHA-256, serves
# it with `khub serve`, and runs --rounds rounds. Each round runs, in an
# order that rotates, a download into an empty KHUB_CACHE (resolve, listing,
# GET, hash check, publish, variant verification: everything `khub
# download` does) and one curl GET of the resolve URL to /dev/null. With
# --before DIR (another build, e.g. of an older commit) the same happens
# against that build's own `khub serve` in the same rounds, interleaved, so
# both are measured under the same load. Output: one line per sample and a
# Markdown summary with medians, throughputs (MiB/s of the file) and the
# ratio khub/curl of throughputs. Then the resolve + verify latency of a
# cached, commit-pinned kernel (`khub bench --latency`, 3 runs of 1000
# iterations per build, alternating) on a variant made of the built plugins.
# Wall clock: run it on a quiet machine, and read the load it prints.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${KHUB_BUILD:-$here/../../build}
size_mb=100
rounds=5
work=
before=
rate=
python=python3
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --size-mb) size_mb=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    -h|--help) sed -n '2,42p' "$0"; exit 0 ;;
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

[ -z "$before" ] || [ -x "$before/bin/khub" ] ||
    { echo "hub.sh: no khub at $before/bin/khub" >&2; exit 1; }
# khub serve keeps digests only of files whose ctime is 2 s old.
sleep 2.5

srvs=
trap 'for p in $srvs; do kill $p 2>/dev/null; wait $p 2>/dev/null || true; done' EXIT
# start_server NAME KHUB: sets $endpoint_NAME (not in a subshell: the trap
# needs the pid).
start_server() {
    "$2" serve "$work/repos" --port 0 ${rate:+--fault rate=$rate} > "$work/serve-$1.out" 2>&1 &
    srvs="$srvs $!"
    for _ in $(seq 50); do grep -q '^serving' "$work/serve-$1.out" && break; sleep 0.1; done
    local ep
    ep=$(grep -o 'http://[0-9.:]*' "$work/serve-$1.out" | head -1)
    [ -n "$ep" ] || { echo "hub.sh: khub serve did not start: $(cat "$work/serve-$1.out")" >&2; exit 1; }
    printf -v "endpoint_$1" '%s' "$ep"
}
start_server after "$khub"
endpoint=$endpoint_after
if [ -n "$before" ]; then start_server before "$before/bin/khub"; fi
rel=kernels/bench/big/resolve/$commit/build/$variant/libbig.so

now() { date +%s.%N; }
# run_khub LABEL KHUB ENDPOINT
run_khub() {
    rm -rf "$work/cache"
    local t0 t1
    t0=$(now)
    HF_ENDPOINT=$3 KHUB_CACHE=$work/cache "$2" download bench/big@v1 --quiet
    t1=$(now)
    cmp -s "$work/cache/kernels--bench--big/snapshots/$commit/build/$variant/libbig.so" \
        "$vdir/libbig.so" || { echo "hub.sh: khub's copy differs" >&2; exit 1; }
    echo "$1 $(echo "$t1 - $t0" | bc -l)"
}
# run_curl LABEL ENDPOINT
run_curl() {
    local t0 t1
    t0=$(now)
    curl -sf -o /dev/null "$2/$rel"
    t1=$(now)
    echo "$1 $(echo "$t1 - $t0" | bc -l)"
}
# curl_file: the same GET written to a file (no hash, no fsync): what a
# download that stores the bytes costs at the least.
run_curl_file() {
    local t0 t1
    rm -f "$work/curl.out"
    t0=$(now)
    curl -sf -o "$work/curl.out" "$2/$rel"
    t1=$(now)
    rm -f "$work/curl.out"
    echo "$1 $(echo "$t1 - $t0" | bc -l)"
}
# curl_checked: the same guarantees as khub, by hand: the bytes stored,
# their SHA-256 computed, and the file synced to disk.
run_curl_checked() {
    local t0 t1
    rm -f "$work/curl.out"
    t0=$(now)
    curl -sf -o "$work/curl.out" "$2/$rel"
    openssl dgst -sha256 "$work/curl.out" > /dev/null
    sync "$work/curl.out"
    t1=$(now)
    rm -f "$work/curl.out"
    echo "$1 $(echo "$t1 - $t0" | bc -l)"
}
# curl_sha256sum: what a user checking a download by hand runs,
# `curl -o FILE && sha256sum FILE` (coreutils' sha256sum, no sync).
run_curl_sha256sum() {
    local t0 t1
    rm -f "$work/curl.out"
    t0=$(now)
    curl -sf -o "$work/curl.out" "$2/$rel" && sha256sum "$work/curl.out" > /dev/null
    t1=$(now)
    rm -f "$work/curl.out"
    echo "$1 $(echo "$t1 - $t0" | bc -l)"
}
# run_hf LABEL ENDPOINT: huggingface_hub's hf_hub_download of the same file
# into an empty cache_dir; prints the whole process's time as LABEL and the
# call's own as LABEL_call.
run_hf() {
    rm -rf "$work/hf-cache"
    local t0 t1 call
    t0=$(now)
    call=$(HF_ENDPOINT=$2 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
        "$python" - "$work/hf-cache" "build/$variant/libbig.so" 2> "$work/hf.err" <<'PY'
import sys, time
t0 = time.perf_counter()
from huggingface_hub import hf_hub_download
t1 = time.perf_counter()
p = hf_hub_download("bench/big", sys.argv[2], repo_type="kernel", revision="v1",
                    cache_dir=sys.argv[1])
t2 = time.perf_counter()
print(t2 - t1, p)
PY
) || { echo "hub.sh: hf_hub_download failed: $(cat "$work/hf.err")" >&2; exit 1; }
    t1=$(now)
    cmp -s "${call#* }" "$vdir/libbig.so" || { echo "hub.sh: hf_hub_download's copy differs" >&2; exit 1; }
    echo "$1 $(echo "$t1 - $t0" | bc -l)"
    echo "${1}_call ${call%% *}"
}
# sha256: the hash alone, of the served file (in the page cache): a floor
# for any download that checks its bytes on this machine.
run_sha256() {
    local t0 t1
    t0=$(now)
    openssl dgst -sha256 "$vdir/libbig.so" > /dev/null
    t1=$(now)
    echo "$1 $(echo "$t1 - $t0" | bc -l)"
}
jobs_list=("run_khub khub $khub $endpoint" "run_curl curl $endpoint"
           "run_curl_file curl_file $endpoint" "run_curl_checked curl_checked $endpoint"
           "run_curl_sha256sum curl_sha256sum $endpoint" "run_sha256 sha256")
have_hf=0
if "$python" -c 'import huggingface_hub' 2>/dev/null; then
    have_hf=1
    jobs_list+=("run_hf hf $endpoint")
else
    echo "hub.sh: $python has no huggingface_hub: the hf_hub_download rows are skipped" >&2
fi
if [ -n "$before" ]; then
    jobs_list+=("run_khub khub_before $before/bin/khub $endpoint_before"
                "run_curl curl_before $endpoint_before")
fi

samples=$work/samples.txt
: > "$samples"
echo "hub.sh: $rounds rounds, ${size_mb} MiB${rate:+, bodies paced to $rate MiB/s}, $endpoint ${before:+and $endpoint_before (before)}, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
n_jobs=${#jobs_list[@]}
for r in $(seq 1 "$rounds"); do
    for k in $(seq 0 $((n_jobs - 1))); do
        ${jobs_list[$(((r + k) % n_jobs))]}
    done | tee -a "$samples" >&2
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
# latency KHUB ENDPOINT: one fresh cache, one download, then 3 latency runs
# offline; the settle wait lets the first verify record the fingerprints.
lat_cache() {
    rm -rf "$work/cache-$1"
    HF_ENDPOINT=$3 KHUB_CACHE=$work/cache-$1 "$2" download bench/small@v1 --quiet
}
lat_cache after "$khub" "$endpoint"
[ -z "$before" ] || lat_cache before "$before/bin/khub" "$endpoint_before"
sleep 2.5
latency=
for r in 1 2 3; do
    latency="$latency$(HF_HUB_OFFLINE=1 KHUB_CACHE=$work/cache-after "$khub" bench --latency \
        "bench/small@$scommit" -n 1000)
"
    [ -z "$before" ] || latency="${latency}before: $(HF_HUB_OFFLINE=1 \
        KHUB_CACHE=$work/cache-before "$before/bin/khub" bench --latency "bench/small@$scommit" \
        -n 1000 | tail -1)
"
done

median() { grep "^$1 " "$samples" | awk '{print $2}' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mk=$(median khub)
mc=$(median curl)
awk -v mk="$mk" -v mc="$mc" -v mb="$size_mb" -v n="$rounds" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" 'BEGIN {
    printf "| %d MiB, %d rounds (load after: %s) | median s | MiB/s |\n|---|---:|---:|\n", mb, n, load
    printf "| khub download (cold cache) | %.3f | %.0f |\n", mk, mb / mk
    printf "| curl -o /dev/null | %.3f | %.0f |\n", mc, mb / mc
    printf "\nkhub/curl throughput ratio: %.2f\n", mc / mk
}'
mcs=$(median curl_sha256sum)
awk -v mk="$mk" -v m="$mcs" -v mb="$size_mb" 'BEGIN {
    printf "curl -o FILE && sha256sum FILE: %.3f s, %.0f MiB/s; khub/that ratio: %.2f (target >= 1.0)\n",
           m, mb / m, m / mk
}'
if [ "$have_hf" = 1 ]; then
    mh=$(median hf)
    mhc=$(median hf_call)
    awk -v mk="$mk" -v m="$mh" -v mc="$mhc" -v mb="$size_mb" 'BEGIN {
        printf "hf_hub_download, whole process: %.3f s, %.0f MiB/s; khub/that ratio: %.2f (target >= 1.5)\n",
               m, mb / m, m / mk
        printf "hf_hub_download, the call alone: %.3f s, %.0f MiB/s; khub/that ratio: %.2f\n",
               mc, mb / mc, mc / mk
    }'
fi
mcf=$(median curl_file)
mcc=$(median curl_checked)
msh=$(median sha256)
awk -v mk="$mk" -v mc="$mcf" -v mcc="$mcc" -v msh="$msh" -v mb="$size_mb" 'BEGIN {
    printf "curl -o FILE: %.3f s, %.0f MiB/s; khub/(curl -o FILE) ratio: %.2f\n", mc, mb / mc, mc / mk
    printf "curl -o FILE + openssl dgst -sha256 + sync FILE: %.3f s, %.0f MiB/s; khub/that ratio: %.2f\n",
           mcc, mb / mcc, mcc / mk
    printf "openssl dgst -sha256 of the file alone (page cache): %.3f s, %.0f MiB/s\n", msh, mb / msh
}'
if [ -n "$before" ]; then
    mkb=$(median khub_before)
    mcb=$(median curl_before)
    awk -v mk="$mkb" -v mc="$mcb" -v mb="$size_mb" 'BEGIN {
        printf "| before: khub download | %.3f | %.0f |\n", mk, mb / mk
        printf "| before: curl (its server) | %.3f | %.0f |\n", mc, mb / mc
        printf "\nbefore: khub/curl throughput ratio: %.2f\n", mc / mk
    }'
fi
echo
echo "resolve + verify (khub bench --latency bench/small@$scommit -n 1000, offline, 3 runs):"
echo "$latency"
