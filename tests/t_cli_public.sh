#!/usr/bin/env bash
# t_cli_public.sh: the khub CLI is a thin shell over khub's public API
# (issue 12 item 2). Every tools/cli file includes only the public headers
# (khub/*.h, which must exist in abi/khub/), the CLI's own headers in
# tools/cli and system headers, and names no internal khub__ function;
# tools/CMakeLists.txt puts neither runtime/ nor hub/ on the CLI's include
# path and links no static libkhub; the built CLI links the shared libraries.
set -euo pipefail
SRC=${KHUB_SRC:?set by ctest}
BIN=${KHUB_BIN:?set by ctest}
fail() { echo "FAIL: $*"; exit 1; }

bad=""
n=0
for f in "$SRC"/tools/cli/*.c "$SRC"/tools/cli/*.h; do
    n=$((n + 1))
    # #include "x": a public header or one of tools/cli's own
    while IFS= read -r inc; do
        case "$inc" in
            khub/*) [ -f "$SRC/abi/$inc" ] || bad+="  ${f#"$SRC"/}: \"$inc\" is not in abi/khub/"$'\n' ;;
            */* | "") bad+="  ${f#"$SRC"/}: \"$inc\" is not a tools/cli header"$'\n' ;;
            *) [ -f "$SRC/tools/cli/$inc" ] ||
                bad+="  ${f#"$SRC"/}: \"$inc\" is an internal header (runtime/ or hub/)"$'\n' ;;
        esac
    done < <(sed -n 's/^[ \t]*#[ \t]*include[ \t]*"\([^"]*\)".*/\1/p' "$f")
    # #include <x>: no internal header by another spelling
    while IFS= read -r inc; do
        base=${inc##*/}
        if [ -n "$(find "$SRC/runtime" "$SRC/hub" -name "$base" -print -quit)" ]; then
            bad+="  ${f#"$SRC"/}: <$inc> names an internal header"$'\n'
        fi
    done < <(sed -n 's/^[ \t]*#[ \t]*include[ \t]*<\([^>]*\)>.*/\1/p' "$f")
    if grep -n '\bkhub__[a-z0-9_]*' "$f" > /dev/null; then
        bad+="  ${f#"$SRC"/}: uses internals: $(grep -o '\bkhub__[a-z0-9_]*' "$f" | sort -u | xargs)"$'\n'
    fi
done
[ -z "$bad" ] || fail "tools/cli reaches past the public headers:"$'\n'"$bad"
echo "ok   $n tools/cli files include only abi/khub/ and tools/cli headers, no khub__ names"

# The build: include path and libraries of the khub_cli target.
cm=$(sed 's/#.*//' "$SRC/tools/CMakeLists.txt")
if grep -E 'target_include_directories\(khub_cli[^)]*(/runtime|/hub|KHUB_INTERNAL)' <<< "$cm"; then
    fail "tools/CMakeLists.txt puts runtime/ or hub/ on the CLI's include path (above)"
fi
if grep -E 'target_link_libraries\(khub_cli[^)]*_static' <<< "$cm"; then
    fail "tools/CMakeLists.txt links the CLI against a static khub library (above)"
fi
dyn=$(readelf -d "$BIN")
major=$(sed -n 's/^#define KHUB_VERSION_MAJOR *\([0-9]*\).*/\1/p' "$SRC/abi/khub/khub_version.h")
for lib in libkhub libkhub_server libkhub_author libkhub_model_server libkhub_tune; do
    grep -q "NEEDED.*\[$lib\.so\.$major\]" <<< "$dyn" || fail "$BIN does not link $lib.so.$major"
done
echo "ok   khub_cli: include path abi/ and tools/cli, links libkhub, libkhub_server, libkhub_author, libkhub_model_server, libkhub_tune"
echo "2 passed, 0 failed"
