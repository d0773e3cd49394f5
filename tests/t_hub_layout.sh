#!/usr/bin/env bash
# The structure issue 12 asks of hub/: no file over 700 lines, and the
# files of `khub serve` call down the layers server_impl.h draws, never
# back up or sideways: every khub__srv_ symbol a server object uses is
# defined in that object or in a file of a lower layer (read from the
# static library's objects with nm, so what is checked is what is linked).
set -euo pipefail
B=${KHUB_BUILD:?}
S=${KHUB_SRC:?}
fail() { echo "FAIL: $*"; exit 1; }

big=$(find "$S/hub" -name '*.[ch]' -exec wc -l {} + | awk '$2 != "total" && $1 > 700 {print $2 " (" $1 " lines)"}')
[ -z "$big" ] || fail "hub/ files over 700 lines: $big"
echo "ok   no hub/ file over 700 lines"

# Layer of each server file, top (0) to bottom (5), as in server_impl.h.
declare -A layer=(
    [server_api]=0
    [server]=1
    [server_read]=2 [server_write]=2
    [server_hf]=3 [server_commit]=3 [server_lfs]=3 [server_faults]=3
    [server_util]=4 [server_store]=4 [server_digest]=4
    [server_path_set]=5
)
lib=""
for a in "$B"/*.a; do
    if ar t "$a" | grep -x 'server.c.o' > /dev/null; then lib=$a; fi
done
[ -n "$lib" ] || fail "no static library in $B holds server.c.o"
syms=$(nm -A "$lib" 2> /dev/null | grep -E ':server[a-z_]*\.c\.o:' | grep -E ' [TU] khub__srv_')
# object T|U symbol, one a line
rows=$(awk '{split($1, p, ":"); o = p[2]; sub(/\.c\.o$/, "", o); print o, $(NF-1), $NF}' <<< "$syms")
declare -A home=()
while read -r obj kind sym; do
    [ -n "${layer[$obj]+x}" ] || fail "hub/$obj.c is in no layer of tests/t_hub_layout.sh and server_impl.h"
    if [ "$kind" = T ]; then home[$sym]=$obj; fi
done <<< "$rows"
n=0
while read -r obj kind sym; do
    [ "$kind" = U ] || continue
    def=${home[$sym]:-}
    [ -n "$def" ] || continue # defined outside the server files
    if [ "${layer[$def]}" -le "${layer[$obj]}" ]; then
        fail "hub/$obj.c (layer ${layer[$obj]}) calls $sym of hub/$def.c (layer ${layer[$def]}): calls go down only"
    fi
    n=$((n + 1))
done <<< "$rows"
[ "$n" -gt 0 ] || fail "found no calls between server files in $lib"
echo "ok   $n calls between server files all go down a layer"
echo "2 passed, 0 failed"
