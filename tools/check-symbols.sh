#!/usr/bin/env bash
# Diffs the symbols a khub library exports against abi/SYMBOLS.md: every
# export must be listed there (a new public function is an API decision) and
# every listed symbol must be exported (a removal is an ABI break).
#   tools/check-symbols.sh [path/to/libkhub*.so] ...   default build/libkhub.so
# SYMBOLS.md has one "## header.h" section per header; a section whose
# heading ends in "(libkhub_server)" (or another library's name) lists that
# library's exports, every other section libkhub's. Each library given is
# checked against its own sections. With --headers, it also checks that every
# KHUB_API function declared in abi/khub/*.h is listed in some section.
set -euo pipefail
cd "$(dirname "$0")/.."
headers=0
libs=()
for a in "$@"; do
    if [ "$a" = --headers ]; then headers=1; else libs+=("$a"); fi
done
[ ${#libs[@]} -gt 0 ] || libs=(build/libkhub.so)

# The symbols SYMBOLS.md lists for library $1 ("libkhub", "libkhub_server").
listed_for() {
    awk -v lib="$1" '
        /^## / { owner = "libkhub"; if (match($0, /\((lib[a-z_0-9]+)\)[ \t]*$/))
                     owner = substr($0, RSTART + 1, RLENGTH - 2) }
        /^- `[a-z_0-9]*`/ && owner == lib { s = $2; gsub(/`/, "", s); print s }
    ' abi/SYMBOLS.md | sort
}

rc=0
for LIB in "${libs[@]}"; do
    [ -f "$LIB" ] || { echo "check-symbols: $LIB not found (build first)" >&2; exit 2; }
    name=$(basename "$LIB"); name=${name%%.so*}
    want=$(listed_for "$name")
    # Every defined dynamic symbol, whatever its type (T, D, B, R, but also W weak,
    # V weak object, i ifunc, u unique), so no kind of export slips past.
    # AddressSanitizer adds an __odr_asan.NAME marker beside each exported
    # global NAME (its one-definition-rule check); NAME itself is checked.
    have=$(nm -D --defined-only "$LIB" | awk 'NF >= 3 && $3 !~ /^__odr_asan\./ {print $3}' | sort)
    extra=$(comm -13 <(echo "$want") <(echo "$have"))
    missing=$(comm -23 <(echo "$want") <(echo "$have"))
    if [ -n "$extra" ]; then
        echo "check-symbols: $name exports but abi/SYMBOLS.md does not list for it:"
        echo "$extra" | sed 's/^/  /'
        rc=1
    fi
    if [ -n "$missing" ]; then
        echo "check-symbols: in abi/SYMBOLS.md for $name but not exported:"
        echo "$missing" | sed 's/^/  /'
        rc=1
    fi
    [ -n "$extra$missing" ] || echo "check-symbols: $name: $(echo "$have" | wc -l) exports match abi/SYMBOLS.md"
done

if [ $headers = 1 ]; then
    # KHUB_API <type> name( on one line, as clang-format leaves every declaration.
    declared=$(grep -ohE 'KHUB_API[^;(]*\bkhub_[a-z0-9_]+ *\(' abi/khub/*.h |
        grep -oE 'khub_[a-z0-9_]+ *\($' | tr -d ' (' | sort -u)
    all=$(grep -o '^- `[a-z_0-9]*`' abi/SYMBOLS.md | sed 's/^- `//; s/`$//' | sort -u)
    unlisted=$(comm -23 <(echo "$declared") <(echo "$all"))
    if [ -n "$unlisted" ]; then
        echo "check-symbols: declared KHUB_API in abi/khub/ but not in abi/SYMBOLS.md:"
        echo "$unlisted" | sed 's/^/  /'
        rc=1
    else
        echo "check-symbols: all $(echo "$declared" | wc -l) KHUB_API declarations are listed"
    fi
fi
exit $rc
