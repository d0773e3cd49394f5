#!/usr/bin/env bash
# t_check.sh: `khub check`, the publish-time gate, failing for each reason
# with its own message, through the real CLI:
#   FILE: an extra export, an RPATH, a RUNPATH, NODELETE, a too-new glibc
#         symbol (and --glibc-ceiling), a library off the allow-list, an
#         unversioned import (a host symbol), --json;
#   DIR:  kernel.json's glibc_ceiling (khub build and check), metadata.json
#         disagreeing with the ABI note, a PTX whose .target/.version
#         disagree with metadata.json, a kernel that crashes in its numeric
#         self-test (reported, and the other checks still run), a kernel
#         that computes the wrong result (its NMSE against khub/ref-cpu).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin check
command -v cc > /dev/null || t_skip "no C compiler"

# ------------------------------------------------------------------- FILE
plugin() { # plugin NAME EXTRA_C [CC FLAGS...]
    local name=$1 extra=$2; shift 2
    cat > "$name.c" <<C
#include <khub/khub_plugin.h>
static khub_status init(const khub_host_api *h, khub_plugin_desc *o, char *e, size_t n)
{ (void)h; (void)e; (void)n; khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
  .id = "t/gate", .version = "1.0.0"}; return khub_plugin_desc_put(o, &d); }
KHUB_PLUGIN_DEFINE(init, "t/gate", "1.0.0")
$extra
C
    cc -std=gnu11 -shared -fPIC -fvisibility=hidden -DKHUB_PLUGIN_MODULE -I"$SRC/abi" "$name.c" \
        -o "$name.so" "$@" || fail "compiling fixture $name"
}
# expect_file NAME NEEDLE [khub check options]: check FILE exits 1 and prints NEEDLE
expect_file() {
    local name=$1 needle=$2 rc=0; shift 2
    "$KHUB" check "$name.so" "$@" > out.log 2>&1 || rc=$?
    [ $rc = 1 ] || { cat out.log; fail "check $name.so exited $rc, want 1"; }
    grep "^  ABI gate: " out.log | grep -F -- "$needle" > /dev/null || { cat out.log; fail "check $name.so: no ABI gate line with '$needle'"; }
}
plugin clean ""
"$KHUB" check clean.so > out.log 2>&1 || { cat out.log; fail "a clean plugin failed"; }
grep -q "ABI gate passed (glibc [A-Za-z0-9_.]*, ceiling GLIBC_2.28)" out.log || fail "clean: $(cat out.log)"
plugin export '__attribute__((visibility("default"))) int leaked_helper(void) { return 1; }'
expect_file export "exports leaked_helper"
plugin rpath "" -Wl,--disable-new-dtags,-rpath,/opt/evil
expect_file rpath "has RPATH '/opt/evil'"
plugin runpath "" -Wl,--enable-new-dtags,-rpath,/opt/evil2
expect_file runpath "has RUNPATH '/opt/evil2'"
plugin nodelete "" -Wl,-z,nodelete
expect_file nodelete "is marked NODELETE (-z nodelete): it could never be unloaded"
plugin libz '#include <zlib.h>
const char *v(void) { return zlibVersion(); }' -Wl,--no-as-needed -lz
expect_file libz "needs library libz.so.1, which is not on the allow-list"
plugin hostsym 'const char *khub_runtime_errmsg(const void *rt);
const char *peek(void) { return khub_runtime_errmsg(0); }'
if ldd "$KHUB" 2> /dev/null | grep 'lib[at]san\|libubsan' > /dev/null; then
    echo "skip unversioned import: a sanitizer build of khub does not apply the rule"
else
    expect_file hostsym "imports khub_runtime_errmsg without a symbol version: it comes from no allowed library"
fi
# close_range is GLIBC_2.34, over the default ceiling; a higher one accepts it
plugin glibc '#include <unistd.h>
int use_it(void) { return close_range(100, 101, 0); }' -D_GNU_SOURCE
expect_file glibc "needs GLIBC_2.34, newer than the ceiling GLIBC_2.28"
expect_file glibc "needs GLIBC_2.34, newer than the ceiling GLIBC_2.30" --glibc-ceiling GLIBC_2.30
"$KHUB" check glibc.so --glibc-ceiling GLIBC_2.34 > out.log 2>&1 || { cat out.log; fail "ceiling 2.34"; }
grep -q "ABI gate passed (glibc GLIBC_2.34, ceiling GLIBC_2.34)" out.log || fail "ceiling: $(cat out.log)"
rc=0; "$KHUB" check glibc.so --glibc-ceiling 2.34 > out.log 2>&1 || rc=$?
[ $rc = 2 ] && grep -q "glibc-ceiling '2.34' is not like GLIBC_2.28" out.log || fail "bad ceiling: $rc $(cat out.log)"
rc=0; "$KHUB" check export.so --json > out.json || rc=$?
[ $rc = 1 ] || fail "check --json exit $rc"
python3 - out.json <<'PY' || fail "check --json: $(cat out.json)"
import json, sys
o = json.load(open(sys.argv[1]))
assert o["ok"] is False and o["load"] == "skipped", o
assert o["report"] == "not loaded: no plugin code runs until the ABI gate passes", o
assert o["gate"] == "KHUB_STATUS_PLUGIN_INVALID", o
assert any("exports leaked_helper" in f for f in o["gate_findings"]), o
PY
echo "ok   check FILE: export, RPATH, RUNPATH, NODELETE, library, unversioned import, glibc ceiling, --json"

# no code of a plugin runs before the gate passes it: a RUNPATH plugin's
# constructor would leave ctor.mark
plugin ctor '#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) { close(open("ctor.mark", O_WRONLY | O_CREAT, 0644)); }' \
    -Wl,--enable-new-dtags,-rpath,/opt/evil3
expect_file ctor "has RUNPATH '/opt/evil3'"
grep -q "^  not loaded: no plugin code runs until the ABI gate passes$" out.log || fail "ctor: $(cat out.log)"
[ ! -e ctor.mark ] || fail "check ran the constructor of a plugin the ABI gate refused"
# --sha256 that is not the digest of the bytes the gate read: nothing loads
rc=0; "$KHUB" check clean.so --sha256 "$(printf '0%.0s' {1..64})" > out.log 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "not loaded: its SHA-256 is [0-9a-f]*, expected 0000[0-9]* (--sha256)" out.log ||
    fail "check --sha256 mismatch: $rc $(cat out.log)"
# the forged verdict of tests/plugins/hostile.c (its constructor writes a
# passing result to every descriptor) is refused, through the CLI too
rc=0; "$KHUB" check "$KHUB_BUILD/test-plugins/hostile_forge.so" > out.log 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "plugin code wrote to the check's result channel" out.log ||
    fail "check hostile_forge.so: $rc $(cat out.log)"
echo "ok   check FILE: no plugin code runs before the gate passes; the bytes gated are the bytes loaded; a forged verdict is refused"

# -------------------------------------------------------------------- DIR
# kernel.json "glibc_ceiling": khub build gates with it, khub check too
"$KHUB" init acme/newglibc --kind norm --backends cpu > /dev/null || fail "init newglibc"
sed -i 's|^#include <math.h>|#include <math.h>\n#include <unistd.h>\n__attribute__((used)) static int use_it(void) { return close_range(100, 101, 0); }|' newglibc/newglibc.c
rc=0; "$KHUB" build newglibc --quiet > out.log 2>&1 || rc=$?
[ $rc = 1 ] || fail "a GLIBC_2.34 kernel built under the default ceiling: $(cat out.log)"
grep -q "needs GLIBC_2.34, newer than the ceiling GLIBC_2.28" out.log || fail "build ceiling message: $(cat out.log)"
sed -i 's|"major": 1,|"major": 1, "glibc_ceiling": "GLIBC_2.34",|' newglibc/kernel.json
"$KHUB" build newglibc --quiet > out.log 2>&1 || fail "build with glibc_ceiling: $(cat out.log)"
"$KHUB" check newglibc > out.log 2>&1 || { cat out.log; fail "check with glibc_ceiling"; }
grep -q "ABI gate (glibc GLIBC_2.34)" out.log || fail "check ceiling: $(cat out.log)"
# the same build checked under a lower ceiling: the gate refuses it, and
# check DIR then runs none of its code (no self-test child)
sed -i 's|"GLIBC_2.34"|"GLIBC_2.28"|' newglibc/kernel.json
rc=0; "$KHUB" check newglibc > out.log 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "^FAIL .*needs GLIBC_2.34, newer than the ceiling GLIBC_2.28" out.log &&
    grep -q "^skip .*newglibc-generic.so: not loaded, the ABI gate did not pass it" out.log ||
    fail "check DIR, gate refused: $rc $(cat out.log)"
grep -q "selftest passed" out.log && fail "check DIR ran a plugin the gate refused: $(cat out.log)"
sed -i 's|"GLIBC_2.28"|"2.34"|' newglibc/kernel.json
rc=0; "$KHUB" build newglibc --quiet > out.log 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "kernel.json: 'glibc_ceiling' '2.34' is not a glibc version like GLIBC_2.28" out.log ||
    fail "bad glibc_ceiling: $(cat out.log)"
echo "ok   kernel.json glibc_ceiling: build and check use it, a malformed one is refused"

# metadata.json vs the ABI note (metadata.json is not among its own digests)
"$KHUB" init acme/meta --kind norm --backends cpu,cuda > /dev/null || fail "init meta"
"$KHUB" build meta --quiet > build.log 2>&1 || fail "build meta: $(cat build.log)"
cpu=$(ls -d meta/build/khub1-cpu-*-linux)
cp "$cpu/metadata.json" meta.json.bak
edit_meta() { # edit_meta FILE PYTHON-STATEMENT (m is the parsed metadata.json)
    python3 - "$1" "$2" <<'PY'
import json, sys
p = sys.argv[1]; m = json.load(open(p)); exec(sys.argv[2]); json.dump(m, open(p, "w"))
PY
}
expect_dir() { # expect_dir DIR NEEDLE: check DIR exits 1 with a FAIL line holding NEEDLE
    local rc=0
    "$KHUB" check "$1" > check.log 2>&1 || rc=$?
    [ $rc = 1 ] || { cat check.log; fail "check $1 exited $rc, want 1 (for '$2')"; }
    grep "^FAIL " check.log | grep -F -- "$2" > /dev/null || { cat check.log; fail "check $1: no FAIL with '$2'"; }
    tail -n 1 check.log | grep "^FAIL .* [1-9][0-9]* findings\?$" > /dev/null || fail "summary: $(tail -n 1 check.log)"
}
edit_meta "$cpu/metadata.json" 'm["abi"]["minor"] = 7'
expect_dir meta "meta-generic.so: ABI note says ABI 1."
grep -qF "metadata.json says 1.7" check.log || fail "ABI note message: $(grep FAIL check.log)"
cp meta.json.bak "$cpu/metadata.json"
edit_meta "$cpu/metadata.json" 'm["version"] = "1.0.9"'
expect_dir meta "ABI note says acme/meta 1.0.0, metadata.json says acme/meta 1.0.9"
grep -q "says acme/meta 1.0.9 (v1), kernel.json says acme/meta 1.0.0 (v1): rebuild" check.log ||
    fail "rebuild message: $(grep FAIL check.log)"
cp meta.json.bak "$cpu/metadata.json"
echo "ok   check DIR: the ABI note disagreeing with metadata.json (ABI, version)"

# PTX .target / .version against metadata.json (needs NVRTC for the PTX)
cu=$(ls -d meta/build/khub1-cu*-linux 2> /dev/null | head -n 1 || true)
if [ -n "$cu" ]; then
    cp "$cu/metadata.json" cu.json.bak
    edit_meta "$cu/metadata.json" 'a = [x for x in m["artifacts"] if x["sm"] == 80][0]; a["sm"] = 86'
    expect_dir meta "meta.sm_80.ptx: PTX says .target sm_80 .version"
    grep -q "metadata.json says sm_86 ISA" check.log || fail "PTX sm message: $(grep FAIL check.log)"
    cp cu.json.bak "$cu/metadata.json"
    edit_meta "$cu/metadata.json" 'a = [x for x in m["artifacts"] if x["sm"] == 75][0]; a["ptx_isa"] = 12'
    expect_dir meta "metadata.json says sm_75 ISA 1.2"
    cp cu.json.bak "$cu/metadata.json"
    # a PTX whose .target was rewritten (digest updated, so only the directive differs)
    sed -i 's/^\.target sm_90/.target sm_89/' "$cu/meta.sm_90.ptx"
    edit_meta "$cu/metadata.json" 'import hashlib; m["files"]["meta.sm_90.ptx"] = hashlib.sha256(open(p.rsplit("/", 1)[0] + "/meta.sm_90.ptx", "rb").read()).hexdigest()'
    expect_dir meta "meta.sm_90.ptx: PTX says .target sm_89"
    sed -i 's/^\.target sm_89/.target sm_90/' "$cu/meta.sm_90.ptx" && cp cu.json.bak "$cu/metadata.json"
    "$KHUB" check meta > check.log 2>&1 || { cat check.log; fail "meta after the PTX checks"; }
    echo "ok   check DIR: PTX .target/.version disagreeing with metadata.json"
else
    echo "skip PTX checks: no CUDA variant was built ($(grep -o 'CUDA variant skipped: .*' build.log || echo no reason))"
fi

# a kernel that crashes in its numeric self-test: reported, not fatal
"$KHUB" init acme/crash --kind norm --backends cpu > /dev/null || fail "init crash"
sed -i 's|    int64_t n = a->x->shape\[0\], dim = a->x->shape\[1\];|&\n    if (n == 4) *(volatile int *)0 = 1; /* the self-test shape */|' crash/crash.c
grep -q "volatile int" crash/crash.c || fail "the crash edit did not apply"
"$KHUB" build crash --quiet > build.log 2>&1 || fail "build crash: $(cat build.log)"
expect_dir crash "crash-generic.so: "
grep -q "crash-generic.so: .*crashed with SIGSEGV during numeric self-tests" check.log ||
    fail "crash message: $(grep FAIL check.log)"
grep -q "crash-avx2.so: .*crashed with SIGSEGV during numeric self-tests" check.log ||
    grep -q "^skip .*crash-avx2.so" check.log || fail "check stopped after the first crash: $(cat check.log)"
echo "ok   check DIR: a crash in the numeric self-test is reported, the gate goes on"

# a kernel that computes the wrong thing: its NMSE against khub/ref-cpu
"$KHUB" init acme/wrong --kind norm --backends cpu > /dev/null || fail "init wrong"
sed -i 's|float scale = 1.0f / sqrtf(ss / (float)dim + a->eps);|float scale = 1.01f / sqrtf(ss / (float)dim + a->eps);|' wrong/wrong.c
grep -q "1.01f" wrong/wrong.c || fail "the wrong-result edit did not apply"
"$KHUB" build wrong --quiet > build.log 2>&1 || fail "build wrong: $(cat build.log)"
expect_dir wrong "wrong-generic.so: "
grep -q "wrong-generic.so: .*rms_norm \[4, 576\] f32: NMSE [0-9.e+-]* > 1e-08" check.log ||
    fail "NMSE message: $(grep FAIL check.log)"
echo "ok   check DIR: a wrong result fails its self-test with the NMSE"
# attention that claims strided K/V (KHUB_CAP_STRIDED_KV, as the template
# does) but assumes compact K/V: the compact self-test alone passes it; the
# gate drives the executor's layouts and names the one it failed on
"$KHUB" init acme/nostride --kind attention --backends cpu > /dev/null || fail "init nostride"
sed -i 's|t->strides ? t->strides\[[0-2]\] : ||' nostride/nostride.c
grep -q "t->strides" nostride/nostride.c && fail "the ignore-strides edit did not apply"
"$KHUB" build nostride --quiet > build.log 2>&1 || fail "build nostride: $(cat build.log)"
expect_dir nostride "nostride-generic.so: "
grep -q "nostride-generic.so: .*attention \[7, 9, 3, 64\] f32: NMSE [0-9.e+infa-]* > 1e-08 with K/V f32 khub/ref-cpu kv_cache view (strides \[64, [0-9]*, 1\], byte offset 0), n_q 7, n_kv 7, head_dim 64" check.log ||
    fail "strided K/V message: $(grep FAIL check.log)"
# strides honoured, byte offset ignored: the padded view's offset finds it
"$KHUB" init acme/nooffset --kind attention --backends cpu > /dev/null || fail "init nooffset"
sed -i 's|(const char \*)t->data + t->byte_offset|(const char *)t->data|' nooffset/nooffset.c
grep -q "(const char \*)t->data + t->byte_offset" nooffset/nooffset.c && fail "the ignore-offset edit did not apply"
"$KHUB" build nooffset --quiet > build.log 2>&1 || fail "build nooffset: $(cat build.log)"
expect_dir nooffset "nooffset-generic.so: "
grep -q "nooffset-generic.so: .*attention \[7, 9, 3, 64\] f32: NMSE [0-9.e+infa-]* > 1e-08 with K/V f32 padded view (strides \[67, 804, 1\], byte offset 28)" check.log ||
    fail "byte offset message: $(grep FAIL check.log)"
echo "ok   check DIR: attention that ignores K/V strides or the byte offset fails on that layout"
# the ops kernel.json declares (name and kind: the kind fixes the argument
# struct, the op's signature) against what each plugin registers
cp meta/kernel.json meta.kernel.json.bak
sed -i 's/"name": "rms_norm", "kind": "norm"/"name": "rmsnorm", "kind": "norm"/; s/"op": "rms_norm"/"op": "rmsnorm"/' meta/kernel.json
expect_dir meta "kernel.json declares op 'rmsnorm' (norm); the plugin registers no op by that name (it registers: rms_norm)"
cp meta.kernel.json.bak meta/kernel.json
sed -i 's/"name": "rms_norm", "kind": "norm"/"name": "rms_norm", "kind": "activation"/' meta/kernel.json
expect_dir meta "kernel.json declares op 'rms_norm' as activation; the plugin registers it as norm"
grep -q "meta-cuda.so: kernel.json declares op 'rms_norm' as activation" check.log ||
    [ -z "$cu" ] || fail "the CUDA glue's ops were not compared: $(grep FAIL check.log)"
cp meta.kernel.json.bak meta/kernel.json
"$KHUB" init acme/extra --kind norm --backends cpu > /dev/null || fail "init extra"
sed -i 's|^     .run = OP_RUN},|&\n    {KHUB_STRUCT_INIT(khub_op_desc), .name = "rms_norm_twin", .kind = OP_KIND, .caps = \&caps,\n     .run = OP_RUN},|; s|.n_ops = 1|.n_ops = 2|' extra/extra.c
grep -q rms_norm_twin extra/extra.c || fail "the extra-op edit did not apply"
"$KHUB" build extra --quiet > build.log 2>&1 || fail "build extra: $(cat build.log)"
expect_dir extra "the plugin registers op 'rms_norm_twin' that kernel.json does not declare in 'ops'"
# the kinds in the ABI note (what is known without loading) are kernel.json's
"$KHUB" init acme/notekinds --kind norm --backends cpu > /dev/null || fail "init notekinds"
sed -i 's/KHUB_KIND_BIT(OP_KIND))/KHUB_KIND_BIT(OP_KIND) | KHUB_KIND_BIT(KHUB_OP_ROTARY))/' notekinds/notekinds.c
grep -q KHUB_OP_ROTARY notekinds/notekinds.c || fail "the note-kinds edit did not apply"
"$KHUB" build notekinds --quiet > build.log 2>&1 || fail "build notekinds: $(cat build.log)"
expect_dir notekinds "notekinds-generic.so: ABI note says kinds { norm rotary }, kernel.json's ops are { norm }"
echo "ok   check DIR: declared ops against registered ones (missing, other kind, undeclared) and the note's kinds"

# a self-test in a format the kernel does not serve says why (the registry's
# reason), and khub bench DIR refuses to time it the same way
cp -r "$SRC/kernels-src/quantization" quant && rm -rf quant/build
sed -i '0,/"dtype": "nf4"/s//"dtype": "q8_0"/' quant/kernel.json
"$KHUB" build quant --quiet > build.log 2>&1 || fail "build quant: $(cat build.log)"
expect_dir quant "qlinear_bnb [1, 576, 192] q8_0: preferred kernels-community/quantization :: qlinear_bnb for qlinear is rejected"
rc=0; "$KHUB" bench quant --time 0.01 > out.log 2>&1 || rc=$?
[ $rc = 1 ] && grep -q "khub bench: qlinear_bnb \[1, 576, 192\] q8_0: preferred kernels-community/quantization" out.log ||
    fail "bench of an unserved format: $rc $(cat out.log)"
echo "ok   check DIR and bench DIR: a self-test format the kernel does not serve, with the reason"

# a CUDA variant's numeric self-tests (issue 11): skipped, said so, without a
# GPU; with a driver that sees one they run through the device with the
# variant's PTX as artifacts. The fake driver (tests/fake_cuda) runs no
# kernel, so the op's output stays as uploaded (zeros) and the comparison
# fails: the present-device branch ran up to the launch and back.
cp -r "$SRC/kernels-src/rmsnorm" rms && rm -rf rms/build
"$KHUB" build rms --quiet > build.log 2>&1 || fail "build rms: $(cat build.log)"
if ls -d rms/build/khub1-cu*-linux > /dev/null 2>&1; then
    "$KHUB" check rms > check.log 2>&1 || { cat check.log; fail "check rms without a GPU"; }
    grep -q "^ok   rms/build/khub1-cu[0-9]*-x86_64-linux/rmsnorm-cuda.so: kernels-community/rmsnorm 1.0.0: loaded, 1 ops, selftest passed, ops as kernel.json declares (numeric self-tests need a GPU: skipped)$" check.log ||
        fail "no GPU: $(grep cuda.so check.log)"
    export LD_LIBRARY_PATH=${KHUB_BUILD:?set by ctest}/fake-cuda KHUB_FAKE_CUDA=12080:90 KHUB_FAKE_CUDA_MEM=1073741824
    expect_dir rms "rmsnorm-cuda.so: kernels-community/rmsnorm 1.0.0: loaded, 1 ops, selftest passed, ops as kernel.json declares; rms_norm [4, 576] f32: NMSE 1 > 1e-10"
    unset LD_LIBRARY_PATH KHUB_FAKE_CUDA KHUB_FAKE_CUDA_MEM
    echo "ok   check DIR: a CUDA variant's numeric self-tests skipped without a GPU, run through the (fake) device with one"
else
    echo "skip CUDA numeric self-tests: no CUDA variant was built ($(grep -o 'CUDA variant skipped: .*' build.log || echo no reason))"
fi
echo "1 passed, 0 failed"
