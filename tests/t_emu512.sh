#!/usr/bin/env bash
# t_emu512.sh: the test-only cpu-avx512-emu.so (plugins/cpu-x86/kx_emu512.h:
# the AVX-512 kernels' logic, its AVX-512 instructions emulated by AVX2) is
# never what khub picks on its own, and says what it is:
#   - it is built among the test plugins, not in the built-in plugin folder;
#     plugins.json does not list it, so `khub plugins` (the build's folder,
#     or KHUB_PLUGIN_DIR's) never loads it (t_install: nor is it installed);
#   - its descriptor: id khub/cpu-avx512-emu, a version that says
#     "test-only-emulation", every op needs AVX2, FMA and F16C and no
#     AVX-512, at priority 2 (below cpu-avx2's 10; above ref-cpu's 0);
#   - loaded beside cpu-avx2 and ref-cpu (a manifest naming all three), no
#     role of a model goes to it; beside ref-cpu alone it serves the roles
#     cpu-avx2 would (how t_emu512_smollm2 runs a real model through it);
#     under KHUB_CPU_LEVEL=x86-64 it scores 0 and ref-cpu serves;
#   - its code holds no AVX-512 instruction (objdump, where installed), so
#     it runs wherever cpu-avx2 runs.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin emu512
B=${KHUB_BUILD:?set by ctest}
EMU=$B/test-plugins/cpu-avx512-emu.so
[ -f "$EMU" ] || t_skip "$EMU not built (the compiler lacks the AVX-512 flags)"
case " $("$KHUB" cpu | sed -n 's/^features //p') " in
*" avx2 "*) ;;
*) t_skip "this CPU has no AVX2: the module cannot run here" ;;
esac

# ---- not a built-in
[ ! -e "$B/plugins/cpu-avx512-emu.so" ] || fail "cpu-avx512-emu.so is in the built-in folder"
grep -q cpu-avx512-emu "$B/plugins/plugins.json" && fail "plugins.json lists it: $(cat "$B/plugins/plugins.json")"
for dir in "$B/plugins" ""; do
    KHUB_PLUGIN_DIR=$dir "$KHUB" plugins > plugins.txt 2> plugins.err ||
        fail "khub plugins (KHUB_PLUGIN_DIR='$dir'): $(cat plugins.err)"
    grep -q "^khub/cpu-avx2 " plugins.txt || fail "khub plugins lists no cpu-avx2: $(cat plugins.txt)"
    grep -q "cpu-avx512-emu" plugins.txt plugins.err && fail "khub plugins loads the emulation: $(cat plugins.txt)"
done
echo "ok   not in plugins/ nor plugins.json; khub plugins loads only the built-ins"

t_plugin_folder all "$B/plugins/ref-cpu.so" "$B/plugins/cpu-avx2.so" "$EMU"
t_plugin_folder emu "$B/plugins/ref-cpu.so" "$EMU"

# ---- the descriptor
KHUB_PLUGIN_DIR=$T/all "$KHUB" plugins --json > all.json 2> all.err || fail "plugins: $(cat all.err)"
python3 - all.json << 'PY' || fail "descriptor (above)"
import json, sys
plugins = {p["id"]: p for p in json.load(open(sys.argv[1]))}
emu, avx2 = plugins["khub/cpu-avx512-emu"], plugins["khub/cpu-avx2"]
assert emu["version"] == "0.1.0+test-only-emulation", emu["version"]
prio = {op["name"]: op["priority"] for op in avx2["ops"]}
assert sorted(prio) == sorted(op["name"] for op in emu["ops"]), (prio, emu["ops"])
for op in emu["ops"]:
    assert op["cpu_features"] == "avx2,fma,f16c", op
    # the by-name qlinear ops keep cpu-avx2's priority 1
    by_name = op["name"] in ("qlinear_q8a", "qlinear_f32")
    assert op["priority"] == (1 if by_name else 2), op
    assert op["priority"] < prio[op["name"]] or by_name, (op, prio)
PY
echo "ok   descriptor: khub/cpu-avx512-emu 0.1.0+test-only-emulation, needs avx2 fma f16c, priority 2"

# ---- what serves a model's roles (the tiny random Llama, its linears as Q8_0)
python3 "$SRC/tools/make-tiny-model.py" tiny > /dev/null
roles() { # roles DIR [ENV...]: "role plugin" per line of --explain
    env KHUB_PLUGIN_DIR="$T/$1" "${@:2}" "$KHUB" run --model tiny --prompt "The capital is" \
        --max-new-tokens 4 --quant q8_0 --explain --json > "run-$1.json" 2> "run-$1.err" ||
        fail "run with $1: $(cat "run-$1.err")"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["explain"])' "run-$1.json" |
        sed -n 's/^\([a-z_+]*\)\[[a-z0-9_]*\]: \(khub\/[a-z0-9-]*\) .*/\1 \2/p'
}
roles all > all.roles
grep -q "qkv_proj khub/cpu-avx2" all.roles || fail "with all three: $(cat all.roles)"
grep -q cpu-avx512-emu all.roles && fail "with all three the emulation serves: $(cat all.roles)"
roles emu > emu.roles
for r in rms_norm attention qkv_proj o_proj gate_up_proj down_proj silu_and_mul lm_head; do
    grep -q "^$r khub/cpu-avx512-emu$" emu.roles || fail "$r with ref-cpu + emu: $(cat emu.roles)"
done
sed 's/cpu-avx2/X/' all.roles > a.x
sed 's/cpu-avx512-emu/X/' emu.roles > e.x
cmp -s a.x e.x || fail "the emulation does not serve what cpu-avx2 serves: $(diff a.x e.x)"
roles emu KHUB_CPU_LEVEL=x86-64 > x86.roles
grep -q cpu-avx512-emu x86.roles && fail "KHUB_CPU_LEVEL=x86-64: the emulation serves: $(cat x86.roles)"
grep -q "^qkv_proj khub/ref-cpu$" x86.roles || fail "KHUB_CPU_LEVEL=x86-64: $(cat x86.roles)"
echo "ok   beside cpu-avx2 it serves nothing; beside ref-cpu, every role cpu-avx2 would; x86-64: none"

# ---- no AVX-512 instruction in its code
if command -v objdump > /dev/null; then
    objdump -d --no-show-raw-insn "$EMU" > emu.dis
    grep -q 'vfmadd' emu.dis || fail "objdump shows no FMA in $EMU: the check reads nothing"
    if grep -E '%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|vpdp|\{' emu.dis > evex.txt; then
        fail "AVX-512 instructions in $EMU: $(head -n 5 evex.txt)"
    fi
    echo "ok   no AVX-512 instruction in $(wc -l < emu.dis) lines of its disassembly"
else
    echo "skip the disassembly check: objdump is not installed"
fi
echo "4 passed, 0 failed, 0 skipped"
