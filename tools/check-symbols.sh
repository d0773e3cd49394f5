#!/usr/bin/env bash
# Diffs the symbols libkhub.so exports against abi/SYMBOLS.md: every export
# must be listed there (a new public function is an API decision) and every
# listed symbol must be exported (a removal is an ABI break).
#   tools/check-symbols.sh [path/to/libkhub.so]     default build/libkhub.so
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=${1:-build/libkhub.so}
[ -f "$LIB" ] || { echo "check-symbols: $LIB not found (build first)" >&2; exit 2; }
want=$(grep -o '^- `[a-z_0-9]*`' abi/SYMBOLS.md | sed 's/^- `//; s/`$//' | sort)
# Every defined dynamic symbol, whatever its type (T, D, B, R, but also W weak,
# V weak object, i ifunc, u unique), so no kind of export slips past.
have=$(nm -D --defined-only "$LIB" | awk 'NF >= 3 {print $3}' | sort)
extra=$(comm -13 <(echo "$want") <(echo "$have"))
missing=$(comm -23 <(echo "$want") <(echo "$have"))
rc=0
if [ -n "$extra" ]; then echo "check-symbols: exported but not in abi/SYMBOLS.md:"; echo "$extra" | sed 's/^/  /'; rc=1; fi
if [ -n "$missing" ]; then echo "check-symbols: in abi/SYMBOLS.md but not exported:"; echo "$missing" | sed 's/^/  /'; rc=1; fi
[ $rc -eq 0 ] && echo "check-symbols: $(echo "$have" | wc -l) exports match abi/SYMBOLS.md"
exit $rc
