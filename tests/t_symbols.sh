#!/usr/bin/env bash
# The linking contract of issue 2: libkhub exports exactly the symbols
# abi/SYMBOLS.md lists, its SONAME is the major version, neither it nor the
# CLI links the CUDA driver or NVRTC (both are dlopened), and every built-in
# plugin exports only its entry and does not link libkhub.
set -euo pipefail
B=${KHUB_BUILD:?}
fail() { echo "FAIL: $*"; exit 1; }

bash "${KHUB_SRC:?}/tools/check-symbols.sh" "$B/libkhub.so"

major=$(sed -n 's/^#define KHUB_VERSION_MAJOR *\([0-9]*\).*/\1/p' "$KHUB_SRC/abi/khub/khub_version.h")
soname=$(readelf -d "$B/libkhub.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkhub.so.$major" ] || fail "SONAME is '$soname', want libkhub.so.$major"
echo "ok   SONAME $soname"

for f in "$B/libkhub.so" "${KHUB_BIN:?}"; do
    dyn=$(readelf -d "$f") || fail "cannot read $f"
    if grep -E 'NEEDED.*(libcuda|libnvrtc|libcudart)' <<< "$dyn"; then
        fail "$f links CUDA; it must be opened at run time"
    fi
done
echo "ok   libkhub and khub link no CUDA library"

n=0
for so in "$B"/plugins/*.so; do
    exports=$(nm -D --defined-only "$so" | awk 'NF >= 3 {print $3}')
    [ "$exports" = "khub_plugin_init_v1" ] || fail "$so exports: $(echo $exports)"
    # Captured first: grep -q closing the pipe early would fail it under pipefail.
    dyn=$(readelf -d "$so")
    sections=$(readelf -S -W "$so")
    if grep -q 'NEEDED.*libkhub' <<< "$dyn"; then fail "$so links libkhub"; fi
    grep -q '\.note\.khub' <<< "$sections" || fail "$so has no .note.khub"
    n=$((n + 1))
done
[ "$n" -ge 1 ] || fail "no built-in plugins in $B/plugins"
echo "ok   $n built-in plugins export only khub_plugin_init_v1, carry .note.khub, skip libkhub"
echo "4 passed, 0 failed"
