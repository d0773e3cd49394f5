#!/usr/bin/env bash
# plugins.json, the manifest the loader checks every built-in plugin
# against, follows each built-in plugin's own build (session 15): before,
# only the khub_plugin_manifest target wrote it, so `cmake --build build
# --target cpu-avx2` left a stale digest that the loader then refused.
#   - the wiring: every plugin the manifest lists has a POST_BUILD step that
#     runs tools/plugin-manifest.cmake with UPDATE= its file (read from the
#     generated build rules: Unix Makefiles or Ninja);
#   - the update: with a stale digest for one plugin, UPDATE= that plugin
#     gives back the manifest the full build wrote, byte for byte, and leaves
#     the other entries as they were; an entry missing is added in file-name
#     order; a manifest missing is made with that one entry.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin plugin_manifest
B=${KHUB_BUILD:?}
M="$B/plugins/plugins.json"
[ -f "$M" ] || fail "no $M"
mapfile -t files < <(sed -n 's/.*"file": "\([^"]*\)".*/\1/p' "$M")
[ "${#files[@]}" -ge 2 ] || fail "the manifest lists ${#files[@]} plugins: $(cat "$M")"

gen=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$B/CMakeCache.txt")
for f in "${files[@]}"; do
    target=${f%.so}
    case "$gen" in
    "Unix Makefiles")
        rules=$(find "$B/plugins" -path "*/CMakeFiles/$target.dir/build.make" | head -1)
        [ -n "$rules" ] || fail "no build rules for $target under $B/plugins"
        grep -q -- "-DUPDATE=$B/plugins/$f .*plugin-manifest.cmake" "$rules" ||
            fail "$target's build does not update plugins.json ($rules)"
        ;;
    Ninja)
        grep -q -- "-DUPDATE=$B/plugins/$f .*plugin-manifest.cmake" "$B/build.ninja" ||
            fail "$target's build does not update plugins.json (build.ninja)"
        ;;
    *) t_skip "generator '$gen': its build rules are not read here" ;;
    esac
done
echo "ok   each of ${files[*]} updates plugins.json when it is built ($gen)"

update() { cmake -DOUT="$1" -DUPDATE="$B/plugins/$2" -P "$SRC/tools/plugin-manifest.cmake"; }
one=${files[0]}
zeros=0000000000000000000000000000000000000000000000000000000000000000
sed "s/\(\"file\": \"$one\", \"sha256\": \"\)[0-9a-f]*/\1$zeros/" "$M" > stale.json
grep -q "$zeros" stale.json || fail "could not make $one's digest stale"
update stale.json "$one"
cmp -s stale.json "$M" || fail "UPDATE=$one did not give back the manifest: $(diff stale.json "$M")"
echo "ok   a stale digest of $one is rewritten, the other entries kept"

last=${files[${#files[@]} - 1]}
python3 - "$M" "$last" > missing.json <<'PY'
import sys
lines = [l for l in open(sys.argv[1]) if '"file": "%s"' % sys.argv[2] not in l]
i = lines.index("  ]\n")
lines[i - 1] = lines[i - 1].replace("},", "}")  # the entry before the end has no comma
sys.stdout.write("".join(lines))
PY
grep -q "\"$last\"" missing.json && fail "could not drop $last"
update missing.json "$last"
cmp -s missing.json "$M" || fail "UPDATE=$last did not add its entry: $(diff missing.json "$M")"
update new.json "$one"
[ "$(grep -c '"file"' new.json)" = 1 ] && grep -q "\"file\": \"$one\", \"sha256\": \"$(sha256sum "$B/plugins/$one" | cut -c1-64)\"" new.json ||
    fail "a new manifest: $(cat new.json)"
echo "ok   a missing entry is added in order, a missing manifest is made"
echo "3 passed, 0 failed, 0 skipped"
