#!/usr/bin/env bash
# tools/bench/warm-load.sh: the warm load of a cached, locked kernel
# (issue 14 item 5), against the floor measured in the same process and
# against the Python kernels library's get_kernel, offline, on the same cache.
#
# usage: tools/bench/warm-load.sh [--build DIR] [--rounds 200] [--py-rounds 7]
#                                 [--first-rounds 7] [--python PY] [--work DIR]
#
# It builds kernels-src/flash-attn2 with `khub build` (CPU variant), signs it
# with a fresh key that a policy file trusts for kernels-community, and
# publishes it as kernels-community/flash-attn2 (branch v1) in the `khub
# serve` layout. The same commit also gets build/torch-universal/: a Python
# package flash_attn2 whose import dlopens a copy of the same AVX2 .so
# (ctypes, RTLD_NOW | RTLD_LOCAL), as a Torch extension's import would, so
# that kernels.get_kernel has a variant it accepts without Torch. Then: a
# khub.json naming it for the attention role, `khub lock`, `khub sync` into
# a fresh KHUB_CACHE, one online get_kernel and a full snapshot_download into
# the same cache (HF_HUB_CACHE; see the note on kernels 0.17.2 below), and
# the server stops. Everything below runs offline (HF_HUB_OFFLINE=1):
#
#  - warm_load (tools/bench/warm_load.c, compiled here against libkhub):
#    --rounds rounds, interleaved, of khub_kernel_fetch through the lock on
#    fresh handles and of the floor, SHA-256 + dlopen of the same .so;
#  - --first-rounds fresh warm_load processes of one round each: khub's
#    first load in a process (OpenSSL's one-time set-up, lazy binding and
#    page faults included), the counterpart of Python's first get_kernel;
#  - --py-rounds fresh PY processes, each timing `import kernels`, its
#    first get_kernel("kernels-community/flash-attn2", revision="v1"), and
#    the median of 20 more get_kernel calls in the same process (steady);
#  - --first-rounds pairs of whole processes, interleaved: `khub fetch
#    --lock` against `PY -c 'import kernels; kernels.get_kernel(...)'`.
# Prints the medians and the ratios, first call against first call and
# steady against steady. Read the load it prints.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${KHUB_BUILD:-$src/build}
rounds=200
py_rounds=7
first_rounds=7
python=python3
work=
while [ $# -gt 0 ]; do
    case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --py-rounds) py_rounds=$2; shift 2 ;;
    --first-rounds) first_rounds=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "warm-load.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
    esac
done
build=$(cd "$build" && pwd)
khub=$build/bin/khub
[ -x "$khub" ] || { echo "warm-load.sh: no khub at $khub; build first or pass --build" >&2; exit 1; }
work=${work:-$(mktemp -d /tmp/khub-bench-warm.XXXXXX)}
mkdir -p "$work"
cd "$work"

arch=$(uname -m)
V=khub1-cpu-$arch-linux
C=$(printf 'warm load' | sha1sum | cut -c1-40)
R=repos/kernels-community/flash-attn2

# --- build, sign, publish ---------------------------------------------------
rm -rf fa2 repos cache proj
cp -r "$src/kernels-src/flash-attn2" fa2 && rm -rf fa2/build
"$khub" build fa2 --quiet > build.log 2>&1 || { echo "warm-load.sh: khub build: $(cat build.log)" >&2; exit 1; }
[ -f "$work/pub.key" ] || "$khub" keygen pub > /dev/null
"$khub" sign --key pub.key fa2 > /dev/null
printf '{"version":1,"publishers":{"kernels-community":["%s"]}}' "$(cat pub.pub)" > policy.json
export KHUB_POLICY=$work/policy.json
d=$R/commits/$C/build
mkdir -p "$d" && cp -r "fa2/build/$V" "$d/$V"
(cd "$d/$V" && tar -czf "../$V.tar.gz" ./*)
so=$(cd "$d/$V" && ls ./*avx2*.so 2> /dev/null | head -1)
[ -n "$so" ] || so=$(cd "$d/$V" && ls ./*.so | head -1)
mkdir -p "$d/torch-universal/flash_attn2"
cp "$d/$V/$so" "$d/torch-universal/flash_attn2/"
cat > "$d/torch-universal/metadata.json" << EOF
{"id": "_flash_attn2_universal_1", "name": "flash-attn2", "version": 1, "license": "Apache-2.0",
 "python-depends": [], "backend": {"type": "cpu"}}
EOF
cat > "$d/torch-universal/flash_attn2/__init__.py" << EOF
import ctypes, os
_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "${so#./}"),
                   mode=os.RTLD_NOW | os.RTLD_LOCAL)
EOF
printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' "$C" "$C" > "$R/refs.json"
printf '{"trustedKernelPublisher": true, "fullname": "kernels community"}' \
    > repos/kernels-community/.org.json
sleep 2.5 # khub serve keeps digests only of files whose ctime is 2 s old

# --- serve, lock, sync, one online get_kernel ---------------------------------
"$khub" serve repos --port 0 > serve.out 2>&1 &
srv=$!
trap 'kill $srv 2> /dev/null || true' EXIT
for _ in $(seq 50); do grep -q '^serving' serve.out && break; sleep 0.1; done
ep=$(grep -o 'http://[0-9.:]*' serve.out | head -1)
[ -n "$ep" ] || { echo "warm-load.sh: khub serve did not start: $(cat serve.out)" >&2; exit 1; }
export HF_ENDPOINT=$ep KHUB_CACHE=$work/cache HF_HUB_CACHE=$work/cache HF_TOKEN=
mkdir proj
echo '{"format":1,"roles":{"attention":{"cpu":{"repo":"kernels-community/flash-attn2","version":1}}}}' \
    > proj/khub.json
"$khub" lock proj > lock.log 2>&1 || { echo "warm-load.sh: khub lock: $(cat lock.log)" >&2; exit 1; }
"$khub" sync proj > sync.log 2>&1 || { echo "warm-load.sh: khub sync: $(cat sync.log)" >&2; exit 1; }
have_py=0
if "$python" -c 'import kernels' 2> /dev/null; then
    have_py=1
    # kernels 0.17.2 on huggingface_hub 2.4.0 downloads only its variant but
    # resolves offline with an unfiltered snapshot_download, which refuses a
    # snapshot missing any file of the cached tree listing: get_kernel
    # offline then fails even on a cache only kernels wrote. The full
    # snapshot (every variant) is fetched so that it has what it checks for.
    "$python" - > py.log 2>&1 << 'PY' || { echo "warm-load.sh: get_kernel online: $(cat py.log)" >&2; exit 1; }
from huggingface_hub import snapshot_download
from kernels import get_kernel
get_kernel("kernels-community/flash-attn2", version=1)
snapshot_download("kernels-community/flash-attn2", repo_type="kernel", revision="v1")
PY
else
    echo "warm-load.sh: $python has no kernels library: the get_kernel rows are skipped" >&2
fi
kill $srv && wait $srv 2> /dev/null || true
trap - EXIT
export HF_HUB_OFFLINE=1
sleep 2.5 # let the downloaded files settle (docs/performance.md, "settled")

# --- measure ------------------------------------------------------------------
cc -std=c11 -O2 -I"$src/abi" -o warm_load "$here/warm_load.c" -L"$build" -Wl,-rpath,"$build" \
    -lkhub -lcrypto -ldl
echo "warm-load.sh: $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
./warm_load kernels-community/flash-attn2 proj/khub.lock "cache/kernels--kernels-community--flash-attn2/khub-variants/$C/$V" \
    "$rounds" | tee warm.out
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# khub's first load in fresh processes (one round each: khub's round comes
# first, so "first" is the first load of the process)
: > first.out
for _ in $(seq "$first_rounds"); do
    ./warm_load kernels-community/flash-attn2 proj/khub.lock \
        "cache/kernels--kernels-community--flash-attn2/khub-variants/$C/$V" 1 > one.out
    w=$(sed -n 's/^khub (hub.*first \([0-9.]*\) (.*/\1/p' one.out)
    c=$(sed -n 's/^cpu: khub (hub.*first \([0-9.]*\) (.*/\1/p' one.out)
    echo "$w $c" >> first.out
done
fw=$(awk '{print $1}' first.out | med)
fc=$(awk '{print $2}' first.out | med)
printf 'khub first load in a fresh process (%s processes): median %.0f us wall, %.0f us CPU\n' \
    "$first_rounds" "$fw" "$fc"
if [ "$have_py" = 1 ]; then
    : > py.out
    : > py.err # kernels warns on stderr that offline mode skips its publisher check
    for _ in $(seq "$py_rounds"); do
        "$python" - >> py.out 2>> py.err << 'PY'
import time
t0 = time.perf_counter()
import kernels
t1 = time.perf_counter()
k = kernels.get_kernel("kernels-community/flash-attn2", revision="v1")
t2 = time.perf_counter()
assert k._lib is not None
steady = []
for _ in range(20):
    t = time.perf_counter()
    kernels.get_kernel("kernels-community/flash-attn2", revision="v1")
    steady.append(time.perf_counter() - t)
steady.sort()
print((t1 - t0) * 1e6, (t2 - t1) * 1e6, (steady[9] + steady[10]) / 2 * 1e6)
PY
    done
    imp=$(awk '{print $1}' py.out | med)
    gk=$(awk '{print $2}' py.out | med)
    gs=$(awk '{print $3}' py.out | med)
    printf 'python kernels (%s processes): import kernels median %.0f us; first get_kernel median %.1f us; later get_kernel calls median %.1f us\n' \
        "$py_rounds" "$imp" "$gk" "$gs"
    # whole processes, interleaved: what a user runs
    : > proc.out
    for _ in $(seq "$first_rounds"); do
        t0=$EPOCHREALTIME
        "$khub" fetch kernels-community/flash-attn2 --lock proj/khub.lock > /dev/null 2>&1 ||
            { echo "warm-load.sh: khub fetch --lock failed" >&2; exit 1; }
        t1=$EPOCHREALTIME
        "$python" -c 'import kernels; kernels.get_kernel("kernels-community/flash-attn2", revision="v1")' \
            2>> py.err
        t2=$EPOCHREALTIME
        echo "$t0 $t1 $t2" | awk '{printf "%.0f %.0f\n", ($2 - $1) * 1e6, ($3 - $2) * 1e6}' >> proc.out
    done
    pk=$(awk '{print $1}' proc.out | med)
    pp=$(awk '{print $2}' proc.out | med)
    printf 'whole process (%s interleaved pairs): khub fetch --lock median %.0f us; python import kernels + get_kernel median %.0f us\n' \
        "$first_rounds" "$pk" "$pp"
fi
fl=$(sed -n 's/^cpu: floor.*median \([0-9.]*\) us.*/\1/p' warm.out)
kt=$(sed -n 's/^cpu: khub (hub.*median \([0-9.]*\) us.*/\1/p' warm.out)
kw=$(sed -n 's/^khub (hub.*median \([0-9.]*\) us.*/\1/p' warm.out)
awk -v f="$fl" -v k="$kt" 'BEGIN { printf "khub / floor (CPU clock, steady): %.2f (target <= 2)\n", k / f }'
if [ "$have_py" = 1 ]; then
    awk -v g="$gs" -v k="$kw" 'BEGIN { printf "steady: later get_kernel / khub (wall medians): %.0fx (target >= 100x)\n", g / k }'
    awk -v g="$gk" -v k="$fw" 'BEGIN { printf "first call in a process: get_kernel / khub (wall medians): %.1fx\n", g / k }'
    awk -v g="$pp" -v k="$pk" 'BEGIN { printf "whole process: python / khub fetch (wall medians): %.1fx\n", g / k }'
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
