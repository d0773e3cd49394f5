#!/usr/bin/env bash
# tools/bench/warm-load-ab.sh: the warm locked load of two libkhub builds,
# interleaved (issue 14 item 5), on a cache that tools/bench/warm-load.sh
# prepared (its --work folder).
#
# usage: tools/bench/warm-load-ab.sh --work DIR --before LIBDIR --after LIBDIR
#                                    [--pairs 5] [--rounds 300]
#
# LIBDIR holds a libkhub.so (a build folder, or a copy of one). warm_load
# (tools/bench/warm_load.c) is compiled against each, then run --pairs times
# each, before and after alternating, --rounds rounds per run, offline on
# DIR's cache and lock. Prints each run's CPU-clock medians of the floor and
# of khub (hub + runtime + fetch), their ratio, and the load; then the
# medians over the runs. Compare by the CPU clock and the ratios: on a
# shared machine one wall-clock run says little.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
work= before= after= pairs=5 rounds=300
while [ $# -gt 0 ]; do
    case "$1" in
    --work) work=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "warm-load-ab.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
    esac
done
[ -n "$work" ] && [ -f "$work/proj/khub.lock" ] ||
    { echo "warm-load-ab.sh: --work DIR must be a folder tools/bench/warm-load.sh --work DIR filled" >&2; exit 2; }
for d in "$before" "$after"; do
    [ -n "$d" ] && [ -f "$d/libkhub.so" ] ||
        { echo "warm-load-ab.sh: no libkhub.so in '$d' (--before and --after name library folders)" >&2; exit 2; }
done
work=$(cd "$work" && pwd)
before=$(cd "$before" && pwd)
after=$(cd "$after" && pwd)
cd "$work"
for side in before after; do
    lib=${!side}
    cc -std=c11 -O2 -I"$src/abi" -o "warm_load_$side" "$here/warm_load.c" -L"$lib" \
        -Wl,-rpath,"$lib" -lkhub -lcrypto -ldl
done
export HF_HUB_OFFLINE=1 KHUB_CACHE=$work/cache HF_HUB_CACHE=$work/cache HF_TOKEN=
export KHUB_POLICY=$work/policy.json
C=$(printf 'warm load' | sha1sum | cut -c1-40)
V=khub1-cpu-$(uname -m)-linux
D=cache/kernels--kernels-community--flash-attn2/khub-variants/$C/$V
echo "warm-load-ab.sh: $(lscpu | sed -n 's/^Model name: *//p'), load $(cut -d' ' -f1-3 /proc/loadavg)"
: > ab.out
for i in $(seq "$pairs"); do
    for side in before after; do
        "./warm_load_$side" kernels-community/flash-attn2 proj/khub.lock "$D" "$rounds" > run.out
        f=$(sed -n 's/^cpu: floor.*: median \([0-9.]*\) us.*/\1/p' run.out)
        k=$(sed -n 's/^cpu: khub (hub.*: median \([0-9.]*\) us.*/\1/p' run.out)
        l=$(cut -d' ' -f1 /proc/loadavg)
        echo "$side $i $f $k $l" >> ab.out
        printf '%-6s pair %d: floor %7.1f us, khub %7.1f us, khub/floor %5.2f (load %s)\n' \
            "$side" "$i" "$f" "$k" "$(echo "$k / $f" | bc -l)" "$l"
    done
done
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for side in before after; do
    k=$(awk -v s=$side '$1 == s {print $4}' ab.out | med)
    r=$(awk -v s=$side '$1 == s {print $4 / $3}' ab.out | med)
    printf '%-6s median of %d runs: khub %.1f us CPU, khub/floor %.2f\n' "$side" "$pairs" "$k" "$r"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
