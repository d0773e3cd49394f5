#!/usr/bin/env bash
# The khub CLI basics (issue 2 item 8): --version, --help on every command
# and sub-command, `khub plugins` (text and --json: id, version, ABI, kinds,
# capabilities, source file, digest) and `khub check FILE` on the
# purpose-built broken plugins, including one whose init crashes: khub must
# survive it, exit 1 and say what happened.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin cli
B=${KHUB_BUILD:?}
TP=$B/test-plugins
export KHUB_PLUGIN_DIR=${KHUB_PLUGIN_DIR:-$B/plugins}
pass=0
ok() { echo "ok   $*"; pass=$((pass + 1)); }

# ---------------------------------------------------------------- version
hdr() { sed -n "s/^#define $1 *\"*\([0-9.]*\)\"*.*/\1/p" "$SRC/abi/khub/khub_version.h"; }
want="khub $(hdr KHUB_VERSION_STRING) (plugin ABI $(hdr KHUB_ABI_MAJOR).$(hdr KHUB_ABI_MINOR))"
[ "$("$KHUB" --version)" = "$want" ] || fail "--version printed '$("$KHUB" --version)', want '$want'"
ok "--version: $want"

# ---------------------------------------------------------------- help
"$KHUB" --help > "$T/help.txt" || fail "--help exited $?"
cmds=$(awk '/^Commands:/ {f = 1; next} /^$/ {f = 0} f {print $1}' "$T/help.txt")
n_cmds=$(echo "$cmds" | wc -l)
[ "$n_cmds" -ge 20 ] || fail "khub --help lists $n_cmds commands"
# Every summary starts in one column, the longest name's included.
cols=$(awk '/^Commands:/ {f = 1; next} /^$/ {f = 0} f && match($0, /^  [^ ]+ +/) {print RLENGTH}' "$T/help.txt" | sort -u)
[ "$(echo "$cols" | wc -l)" = 1 ] || fail "khub --help's summaries start in columns $(echo $cols)"
for c in $cmds; do
    rc=0
    "$KHUB" "$c" --help > "$T/h.out" 2> "$T/h.err" || rc=$?
    [ "$rc" -eq 0 ] || fail "khub $c --help exited $rc: $(cat "$T/h.err")"
    grep -q "^usage: khub $c" "$T/h.out" || fail "khub $c --help: no 'usage: khub $c' on stdout"
done
for s in ls verify prune; do
    "$KHUB" cache "$s" --help > "$T/h.out" || fail "khub cache $s --help"
    grep -q "khub cache $s" "$T/h.out" || fail "khub cache $s --help does not describe it"
done
ok "--help on all $n_cmds commands and cache ls|verify|prune"

rc=0
"$KHUB" no-such-command > /dev/null 2> "$T/err" || rc=$?
[ "$rc" -eq 2 ] || fail "unknown command exited $rc, want 2"
grep -q "unknown command 'no-such-command'" "$T/err" || fail "unknown command message"
rc=0
"$KHUB" plugins --bogus > /dev/null 2> "$T/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "unknown argument '--bogus'" "$T/err" || fail "plugins --bogus ($rc)"
ok "unknown command and option: exit 2 with the name"

# ---------------------------------------------------------------- plugins
"$KHUB" plugins > "$T/plugins.txt" || fail "khub plugins exited $?"
ref_so=$KHUB_PLUGIN_DIR/ref-cpu.so
ref_sha=$(sha256sum "$ref_so" | cut -d' ' -f1)
grep -q "^khub/ref-cpu 0.1.0 (ABI $(hdr KHUB_ABI_MAJOR).$(hdr KHUB_ABI_MINOR))$" "$T/plugins.txt" ||
    fail "khub plugins: no 'khub/ref-cpu 0.1.0 (ABI ...)' line"
awk '/^khub\/ref-cpu /{f = 1; next} /^[^ ]/{f = 0} f' "$T/plugins.txt" > "$T/ref.txt"
grep -q "^  kinds  attention,linear,qlinear,kv_cache,norm,activation,rotary,paged_attention,embedding$" "$T/ref.txt" ||
    fail "ref-cpu kinds line: $(grep kinds "$T/ref.txt")"
grep -q "^  file   $ref_so$" "$T/ref.txt" || fail "ref-cpu file line"
grep -q "^  sha256 $ref_sha$" "$T/ref.txt" || fail "ref-cpu sha256 is not the file's"
grep -Eq "^  op attention +attention +cpu dtypes=f32,f16 flags=causal,gqa,mask" "$T/ref.txt" ||
    fail "ref-cpu attention caps: $(grep 'op attention' "$T/ref.txt")"
grep -Eq "^  op linear +linear +cpu dtypes=f32,f16,bf16" "$T/ref.txt" || fail "ref-cpu linear caps"
ok "khub plugins: ref-cpu with ABI, kinds, file, digest and op capabilities"

"$KHUB" plugins --json > "$T/plugins.json" || fail "khub plugins --json exited $?"
python3 - "$T/plugins.json" "$ref_so" "$ref_sha" "$(hdr KHUB_ABI_MAJOR).$(hdr KHUB_ABI_MINOR)" <<'EOF'
import json, sys
path, so, sha, abi = sys.argv[1:]
plugins = json.load(open(path))
ref = [p for p in plugins if p["id"] == "khub/ref-cpu"]
assert len(ref) == 1, [p["id"] for p in plugins]
p = ref[0]
assert p["version"] == "0.1.0" and p["abi"] == abi, p
assert p["file"] == so and p["sha256"] == sha, (p["file"], p["sha256"])
kinds = "attention,linear,qlinear,kv_cache,norm,activation,rotary,paged_attention,embedding"
assert p["kinds"] == kinds, p["kinds"]
# seven KV caches: the dynamic default, and the static, int8, int4, paged,
# sliding and offloaded ones (--cache static|quantized|quantized-int4|paged|
# sliding|offloaded), chosen only when named
assert sorted(o["kind"] for o in p["ops"]) == sorted(kinds.split(",") + ["kv_cache"] * 6), p["ops"]
for name in ("static_cache", "quantized_cache", "quantized_cache_int4", "paged_cache",
             "sliding_cache", "offloaded_cache"):
    named = [o for o in p["ops"] if o["name"] == name]
    assert len(named) == 1 and named[0]["kind"] == "kv_cache" and named[0]["priority"] == -1, named
for o in plugins[0]["ops"] + p["ops"]:
    for key in ("name", "kind", "device", "dtypes", "cpu_features", "flags", "head_dims",
                "priority"):
        assert key in o, (key, o)
att = [o for o in p["ops"] if o["kind"] == "attention"][0]
assert set(att["flags"].split(",")) >= {"causal", "gqa", "mask"}, att
EOF
ok "khub plugins --json: parses, ref-cpu's fields match the file"

# ---------------------------------------------------------------- check
# check NAME WANT_RC NEEDLE: khub check on a test plugin exits WANT_RC (not a
# signal) and prints NEEDLE.
check() {
    local name=$1 want=$2 needle=$3 rc=0
    "$KHUB" check "$TP/$name.so" > "$T/check.out" 2>&1 || rc=$?
    [ "$rc" -eq "$want" ] || { cat "$T/check.out"; fail "khub check $name exited $rc, want $want"; }
    grep -qF -- "$needle" "$T/check.out" || { cat "$T/check.out"; fail "khub check $name: no '$needle'"; }
}
check good_v1 0 "khub-test/good 1.0.0: loaded, 3 ops, selftest passed"
check bad_init_crash 1 "bad_init_crash.so: crashed with SIGSEGV during init"
check bad_init_fails 1 "init failed with KHUB_STATUS_IO: cannot open the widget table"
check abi_major_other 1 "plugin khub-test/major-other 1.2.0: ABI 2.1, host supports 1.0-1.$(hdr KHUB_ABI_MINOR)"
check abi_minor_newer 1 "plugin khub-test/minor-newer 1.2.0: ABI 1.9, host supports 1.0-1.$(hdr KHUB_ABI_MINOR)"
check no_entry 1 "no entry symbol khub_plugin_init_v1"
check no_note 1 "no .note.khub section"
check bad_small_desc 1 "descriptor struct_size 16, ABI 1.0 minimum 80"
check bad_dup_ops 1 "op name \"first\" appears twice (ops 0 and 1)"
check note_ptr4 1 "pointer size 4 bytes, host pointer size 8 bytes"
ok "khub check: good plugin passes; crash, init error, ABI, entry, note, size, duplicates reported"

printf '{"not": "an ELF"}\n' > "$T/text.so"
rc=0
"$KHUB" check "$T/text.so" > "$T/check.out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && grep -q "not an ELF file" "$T/check.out" || fail "check on a text file ($rc)"
rc=0
zero=0000000000000000000000000000000000000000000000000000000000000000
"$KHUB" check "$TP/good_v1.so" --sha256 $zero > "$T/check.out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] && grep -q "expected $zero" "$T/check.out" || fail "check --sha256 mismatch ($rc)"
rc=0
"$KHUB" check > /dev/null 2> "$T/err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "missing FILE" "$T/err" || fail "check without FILE ($rc)"
ok "khub check: not an ELF, digest mismatch, usage error"

rc=0
"$KHUB" check "$TP/bad_init_crash.so" --json > "$T/crash.json" || rc=$?
[ "$rc" -eq 1 ] || fail "check --json on the crashing plugin exited $rc"
python3 - "$T/crash.json" <<'EOF'
import json, sys
o = json.load(open(sys.argv[1]))
assert o["ok"] is False and o["inspect"] == "KHUB_STATUS_OK", o
assert o["load"] == "KHUB_STATUS_CHILD_CRASHED", o
assert "crashed with SIGSEGV during init" in o["report"], o
assert o["id"] == "khub-test/bad" and len(o["sha256"]) == 64, o
EOF
ok "khub check --json: the crash as KHUB_STATUS_CHILD_CRASHED"

echo "$pass passed, 0 failed"
