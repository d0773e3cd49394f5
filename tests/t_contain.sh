#!/usr/bin/env bash
# t_contain.sh: a kernel that misbehaves at run time, through `khub run` on
# the real model (issue 10 item 5). acme/crashy is the `khub init --kind
# norm` scaffold with one addition: when CRASHY_MODE is set in the
# environment its rms_norm segfaults, aborts or calls exit(0) (so it builds,
# passes `khub check` and is signed and published as a healthy kernel).
# Each misbehaviour names the plugin, op and role on stderr; exit(0) is not a
# success; the crashed build is quarantined in the cache: the next run is
# refused, `khub cache quarantine` lists it, --allow-quarantined loads it
# with a warning, `khub cache unquarantine` clears it. CRASHY_MODE=wrong makes
# it wrong on one row (decode) only: its self-test (4 rows) passes and
# --verify-kernels catches it.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
MODEL=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$MODEL" ] || t_skip "$MODEL absent (run tools/fetch-model.sh)"
t_begin contain

"$KHUB" init acme/crashy --kind norm --backends cpu > /dev/null || fail "init"
python3 - crashy/crashy.c << 'PY'
import sys
p = sys.argv[1]
s = open(p).read()
anchor = "    int64_t n = a->x->shape[0], dim = a->x->shape[1];\n"
assert anchor in s, "the scaffold's rms_norm changed; update t_contain.sh"
s = s.replace("#include <math.h>\n", "#include <math.h>\n#include <stdint.h>\n#include <stdlib.h>\n", 1)
s = s.replace(anchor, anchor + """    static int *volatile wild = (int *)(uintptr_t)8;
    const char *mode = getenv("CRASHY_MODE");
    if (mode && mode[0] == 's') *wild = 1;
    if (mode && mode[0] == 'a') abort();
    if (mode && mode[0] == 'e') exit(0);
    float wrong = mode && mode[0] == 'w' && n == 1 ? 1.5f : 1.0f; /* self-test rows: 4 */
""", 1)
s = s.replace("* scale * w[i];", "* scale * w[i] * wrong;", 1)
assert "* wrong;" in s
open(p, "w").write(s)
PY
"$KHUB" keygen pub > /dev/null
"$KHUB" build crashy --quiet > build.log 2>&1 || { cat build.log; fail "build"; }
"$KHUB" check crashy > check.log 2>&1 || { cat check.log; fail "check"; }
"$KHUB" sign --key pub.key crashy > /dev/null || fail "sign"
mkdir hub
t_serve hub serve.out --token t0k
"$KHUB" publish crashy --endpoint "$EP" --token t0k --quiet > /dev/null || fail "publish"
printf '{"version": 1, "publishers": {"acme": ["%s"]}}\n' "$(cat pub.pub)" > policy.json
export HF_ENDPOINT=$EP KHUB_CACHE=$T/cache KHUB_POLICY=$T/policy.json
run() { "$KHUB" run --model "$MODEL" --prompt hi --max-new-tokens 2 --norm acme/crashy "$@"; }

run --explain > ok.out 2> ok.err || { cat ok.err; fail "healthy run"; }
grep -q "^rms_norm\[f32\]: acme/crashy 1.0.0 :: rms_norm" ok.out || fail "crashy does not serve norm"
echo "ok   acme/crashy serves rms_norm while it behaves"

# A segfault in the op: the process still dies of SIGSEGV, and says in what.
rc=0
CRASHY_MODE=segv run > s.out 2> s.err || rc=$?
[ "$rc" -eq 139 ] || { cat s.err; fail "segfault: exit status $rc, want 139 (SIGSEGV)"; }
grep -q "^khub: SIGSEGV in plugin acme/crashy 1.0.0 :: rms_norm (norm, role [a-z_]* layer [0-9]*); the process dies with it; quarantined (.*/kernels--acme--crashy/khub-quarantine/[0-9a-f]\{40\}/khub1-cpu-[a-z0-9_]*-linux): the next load refuses it unless allowed$" s.err ||
    fail "segfault line: $(cat s.err)"
echo "ok   SIGSEGV in rms_norm: $(grep '^khub: SIGSEGV' s.err | cut -c1-100)..."

# The next load is refused, naming what happened and the ways out.
if run > q.out 2> q.err; then fail "a quarantined build loaded"; fi
grep -q "acme/crashy@[0-9a-f]\{12\} variant khub1-cpu-[a-z0-9_]*-linux is quarantined: it ended a process before (SIGSEGV in plugin acme/crashy 1.0.0 :: rms_norm (norm, role .*)). Clear it with khub cache unquarantine acme/crashy to retry, or load it anyway with --allow-quarantined" q.err ||
    fail "quarantine refusal: $(cat q.err)"
"$KHUB" cache quarantine > l.out 2>&1 || fail "cache quarantine: $(cat l.out)"
grep -q "^acme/crashy@[0-9a-f]\{40\} khub1-cpu-[a-z0-9_]*-linux: SIGSEGV in plugin acme/crashy 1.0.0 :: rms_norm" l.out ||
    fail "cache quarantine: $(cat l.out)"
"$KHUB" cache quarantine --json | python3 -c '
import json, sys
j = json.load(sys.stdin)["quarantined"]
assert len(j) == 1 and j[0]["repo"] == "acme/crashy" and j[0]["why"].startswith("SIGSEGV"), j' ||
    fail "cache quarantine --json"
run --allow-quarantined > a.out 2> a.err || { cat a.err; fail "--allow-quarantined"; }
grep -q "warning: acme/crashy@[0-9a-f]\{12\} variant .* is quarantined (SIGSEGV in plugin .*); loading it anyway as allowed" a.err ||
    fail "--allow-quarantined warning: $(cat a.err)"
"$KHUB" cache unquarantine acme/crashy > c.out 2>&1 || fail "unquarantine: $(cat c.out)"
grep -q "^1 quarantine marker(s) cleared$" c.out || fail "unquarantine: $(cat c.out)"
grep -q "^no kernel build is quarantined$" <<< "$("$KHUB" cache quarantine)" || fail "not cleared"
run > ok.out 2> ok.err || { cat ok.err; fail "run after unquarantine"; }
echo "ok   quarantined: refused, listed, --allow-quarantined warns, unquarantine clears"

# abort() in the op: SIGABRT, named.
rc=0
CRASHY_MODE=abort run > b.out 2> b.err || rc=$?
[ "$rc" -eq 134 ] || { cat b.err; fail "abort: exit status $rc, want 134 (SIGABRT)"; }
grep -q "^khub: SIGABRT in plugin acme/crashy 1.0.0 :: rms_norm (norm" b.err || fail "abort line: $(cat b.err)"
"$KHUB" cache unquarantine --all > /dev/null || fail "unquarantine --all"
echo "ok   abort() in rms_norm: SIGABRT, named"

# exit(0) in the op used to make `khub run` exit 0.
rc=0
CRASHY_MODE=exit run > e.out 2> e.err || rc=$?
[ "$rc" -eq 70 ] || { cat e.err; fail "exit(0) in a kernel: exit status $rc, want 70"; }
grep -q "^khub: exit() called in plugin acme/crashy 1.0.0 :: rms_norm (norm, role [a-z_]* layer [0-9]*); exiting with status 70 (KHUB_EXIT_PLUGIN_EXITED) instead; quarantined (" e.err ||
    fail "exit line: $(cat e.err)"
echo "ok   exit(0) in rms_norm: status 70, named, quarantined"
"$KHUB" cache unquarantine --all > /dev/null || fail "unquarantine --all"

# Wrong on one row only (decode): the self-test passes with the fault on,
# a plain run does not notice, --verify-kernels names plugin, op and NMSE.
CRASHY_MODE=wrong "$KHUB" check crashy > w.log 2>&1 || { cat w.log; fail "check with the shape fault"; }
CRASHY_MODE=wrong run > w.out 2> w.err || { cat w.err; fail "run with the shape fault, unchecked"; }
rc=0
CRASHY_MODE=wrong run --verify-kernels > v.out 2> v.err || rc=$?
[ "$rc" -eq 1 ] || { cat v.err; fail "--verify-kernels: exit status $rc, want 1"; }
grep -q "SmolLM2-135M-Instruct.Q4_1.gguf: --verify-kernels: acme/crashy 1.0.0 :: rms_norm (attn_norm, layer 0) differs from khub/ref-cpu: NMSE 0.25 of y over [0-9]* values, tolerance 1e-05" v.err ||
    fail "--verify-kernels message: $(cat v.err)"
run --verify-kernels > v.out 2> v.err || { cat v.err; fail "--verify-kernels on a correct kernel"; }
echo "ok   a kernel wrong on the model's shapes passes its self-test; --verify-kernels catches it"
