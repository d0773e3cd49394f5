#!/usr/bin/env bash
# (Pipelines into grep use plain grep > /dev/null, not grep -q: with pipefail an early
# grep -q exit can kill a still-writing producer with SIGPIPE and fail the test.)
# The kernel author's loop, end to end with the real CLI: khub init for each
# template kind (attention, norm, activation, linear, qlinear, rotary: cpu,
# cuda, both; kv_cache: cpu, and cuda refused by name), khub
# build, khub check (gate, PTX per capability from NVRTC, self-tests against
# khub/ref-cpu in a child), provenance, cubins, keygen + sign, a tampered
# build; then every in-tree kernel of kernels-src/ is built and checked in a
# scratch copy, its CUDA kernels compiled by NVRTC (skipped by name without).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin author

# With NVRTC (opened at run time) the CUDA variant must be built; without it
# khub build says why it skipped it, and so does this test.
nvrtc=1
specs=("attention cpu,cuda" "norm cpu,cuda" "activation cpu,cuda" "linear cpu,cuda"
    "qlinear cpu,cuda" "rotary cpu,cuda" "kv_cache cpu" "norm cpu" "activation cuda" "rotary cuda")
# every template of hub/author/templates/index.json is instantiated below, with
# each backend it offers: a new template cannot go untested
for t in $(python3 -c 'import json, sys
for t in json.load(open(sys.argv[1]))["templates"]:
    print(t["kind"] + ("/cuda" if t["cuda"] else ""))' "$SRC/hub/author/templates/index.json"); do
    printf '%s\n' "${specs[@]}" | grep "^${t%/cuda} cpu" > /dev/null || fail "template ${t%/cuda}: no cpu spec"
    if [[ $t == */cuda ]]; then
        printf '%s\n' "${specs[@]}" | grep "^${t%/cuda} .*cuda" > /dev/null || fail "template ${t%/cuda}: no cuda spec"
    fi
done
for spec in "${specs[@]}"; do
    set -- $spec
    name="t-$1-${2/,/-}"
    "$KHUB" init "acme/$name" --kind "$1" --backends "$2" > init.log || fail "init $1: $(cat init.log)"
    "$KHUB" build "$name" --quiet > build.log 2>&1 || fail "build $1: $(cat build.log)"
    if [[ $2 == *cuda* ]] && ! ls -d "$name"/build/khub1-cu*-linux > /dev/null 2>&1; then
        grep -q "CUDA variant skipped: " build.log || fail "no CUDA variant and no reason: $(cat build.log)"
        nvrtc=0
        echo "skip CUDA variant of $name: $(grep -o 'CUDA variant skipped: .*' build.log)"
        [ "$2" = cuda ] && continue
    fi
    "$KHUB" check "$name" > check.log 2>&1 || { cat check.log; fail "check $1 ($2)"; }
    grep -q "0 findings" check.log || fail "check $1 summary"
    if [[ $2 == *cpu* ]]; then
        grep -q "NMSE" check.log || fail "check $1 ran no numeric self-test"
        grep -q "^ok   $name/build/khub1-cpu-.*-avx2.so: .*NMSE" check.log ||
            grep -q "^skip $name/build/khub1-cpu-.*-avx2.so: this CPU lacks" check.log ||
            fail "check $1: the avx2 level was neither tested nor skipped by name"
    fi
    if [ $nvrtc = 1 ] && [[ $2 == *cuda* ]]; then
        for cc in 75 80 90; do
            grep -q "^ok   $name/build/khub1-cu.*/$name.sm_$cc.ptx: .target sm_$cc " check.log ||
                fail "check $1: no checked PTX for sm_$cc: $(cat check.log)"
        done
        grep -q "^ok   $name/build/khub1-cu.*/$name-cuda.so: .*selftest passed" check.log ||
            fail "check $1: the CUDA glue did not load in the child"
    fi
    echo "ok   init/build/check $1 ($2)"
done

# kernel.json's "abi": {"target_minor": N} builds the plugins with
# -DKHUB_PLUGIN_TARGET_MINOR=N: their ABI notes and metadata.json say 1.N (so
# hosts of 1.N load them), and khub check passes; a minor newer than this
# khub's header, or a misspelt key, is refused by name before anything is built.
hdr_minor=$(sed -n 's/^#define KHUB_ABI_MINOR *\([0-9]*\).*/\1/p' "$SRC/abi/khub/khub_version.h")
target=$((hdr_minor - 1))
set_abi() { # DIR JSON-OBJECT
    python3 - "$1/kernel.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["abi"] = json.loads(sys.argv[2])
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY
}
"$KHUB" init acme/tmin --kind norm > /dev/null || fail "init tmin"
set_abi tmin "{\"target_minor\": $target}"
"$KHUB" build tmin --quiet > build.log 2>&1 || fail "build tmin: $(cat build.log)"
for so in tmin/build/khub1-cpu-*-linux/tmin-*.so; do
    "$KHUB" check "$so" > check.log 2>&1 || { cat check.log; fail "check $so"; }
    grep -q "^ok   acme/tmin 1.0.0 (ABI 1.$target)$" check.log || fail "ABI note of $so: $(head -1 check.log)"
done
python3 -c 'import json,sys; a=json.load(open(sys.argv[1]))["abi"]; assert a == {"major": 1, "minor": int(sys.argv[2])}, a' \
    tmin/build/khub1-cpu-*-linux/metadata.json "$target" || fail "metadata.json abi of tmin"
"$KHUB" check tmin > check.log 2>&1 || { cat check.log; fail "check tmin"; }
grep -q "0 findings" check.log || fail "check tmin summary"
rm -rf tmin/build
set_abi tmin "{\"target_minor\": $((hdr_minor + 1))}"
if "$KHUB" build tmin > build.log 2>&1; then fail "build accepted target_minor $((hdr_minor + 1))"; fi
grep -q "khub build: kernel.json: abi.target_minor $((hdr_minor + 1)) is newer than this khub's plugin ABI 1.$hdr_minor (it builds for 1.0-1.$hdr_minor): lower target_minor or use a newer khub$" build.log ||
    fail "newer target_minor message: $(cat build.log)"
[ ! -e tmin/build ] || fail "a refused build wrote tmin/build"
set_abi tmin '{"target-minor": 1}'
if "$KHUB" build tmin > build.log 2>&1; then fail "build accepted abi.target-minor"; fi
grep -q "kernel.json: abi.target-minor is not a field (abi has only target_minor)" build.log ||
    fail "misspelt abi key message: $(cat build.log)"
set_abi tmin '{"target_minor": 1.5}'
if "$KHUB" build tmin > build.log 2>&1; then fail "build accepted target_minor 1.5"; fi
grep -q "kernel.json: abi.target_minor must be a whole number (the N of plugin ABI 1.N)" build.log ||
    fail "fractional target_minor message: $(cat build.log)"
echo "ok   kernel.json abi.target_minor: plugins stamped 1.$target, a newer minor refused"

# provenance in metadata.json: a scaffold committed to git builds clean (its
# own build/ does not count), an edit makes it dirty, a tree outside git is
# "unknown" and dirty; the compiler's and NVRTC's versions are recorded.
prov_check() { # DIR COMMIT DIRTY(0|1)
    python3 - "$@" "$(${CC:-cc} --version | head -n 1)" <<'PY' || fail "provenance of $1"
import glob, json, re, sys
d, commit, dirty, cc = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
metas = glob.glob(d + "/build/*/metadata.json")
assert metas, "no metadata.json"
for p in metas:
    m = json.load(open(p)); pv = m["provenance"]
    assert pv["source_commit"] == commit, (p, pv)
    assert pv["dirty"] is dirty, (p, pv)
    assert pv["compiler"] == cc, (p, pv, cc)
    assert pv["khub"], (p, pv)
    if m["backend"]["type"] == "cuda":
        mm = re.fullmatch(r"(\d+)\.(\d+)", pv["nvrtc"])
        assert mm and m["variant"].startswith("khub1-cu%s%s-" % mm.groups()), (p, pv, m["variant"])
    else:
        assert "nvrtc" not in pv, (p, pv)
PY
}
if command -v git > /dev/null; then
    "$KHUB" init acme/prov --kind norm --backends cpu,cuda > /dev/null || fail "init prov"
    [ "$(cat prov/.gitignore)" = "/build/" ] || fail "init wrote no .gitignore for build/"
    rm prov/.gitignore # the build dir must not count even where nothing ignores it
    git -C prov init -q && git -C prov add . &&
        git -C prov -c user.email=t@example.com -c user.name=t commit -qm init || fail "git"
    "$KHUB" build prov --quiet > build.log 2>&1 || fail "build prov: $(cat build.log)"
    prov_check prov "$(git -C prov rev-parse HEAD)" 0
    echo "/* an edit */" >> prov/prov.c
    "$KHUB" build prov --quiet > build.log 2>&1 || fail "rebuild prov: $(cat build.log)"
    prov_check prov "$(git -C prov rev-parse HEAD)" 1
    prov_check t-norm-cpu-cuda unknown 1
    echo "ok   provenance: source commit, dirty flag, compiler and NVRTC versions"
else
    echo "skip provenance: git is not installed"
fi

# "cubin": true adds a cubin per capability; khub check reads each one's SM
# from its ELF header and holds it to metadata.json
if [ $nvrtc = 1 ]; then
    "$KHUB" init acme/cub --kind norm --backends cuda > /dev/null || fail "init cub"
    sed -i 's/"cubin": false/"cubin": true/' cub/kernel.json
    "$KHUB" build cub --quiet > build.log 2>&1 || fail "build cub: $(cat build.log)"
    "$KHUB" check cub > check.log 2>&1 || { cat check.log; fail "check cub"; }
    for cc in 75 80 90; do
        grep -q "^ok   cub/build/khub1-cu.*/cub.sm_$cc.cubin: cubin for sm_$cc$" check.log ||
            fail "no checked cubin for sm_$cc: $(cat check.log)"
    done
    m=$(ls cub/build/khub1-cu*-linux/metadata.json)
    # the CUDA source ships in the variant for load-time compilation
    # (docs/gpu.md): digested in files, no artifacts entry
    python3 - "$m" <<'PY' || fail "cub.cu is not a digested file of the CUDA variant"
import hashlib, json, os, sys
m = json.load(open(sys.argv[1]))
src = os.path.join(os.path.dirname(sys.argv[1]), "cub.cu")
assert m["files"]["cub.cu"] == hashlib.sha256(open(src, "rb").read()).hexdigest(), m["files"]
assert open(src).read() == open("cub/cub.cu").read()
assert all(a["file"] != "cub.cu" for a in m["artifacts"]), m["artifacts"]
PY
    python3 - "$m" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
[a for a in m["artifacts"] if a["kind"] == "cubin" and a["sm"] == 90][0]["sm"] = 80
json.dump(m, open(sys.argv[1], "w"))
PY
    if "$KHUB" check cub > check.log 2>&1; then fail "check accepted a cubin under the wrong SM"; fi
    grep -q "^FAIL .*cub.sm_90.cubin: cubin is for sm_90, metadata.json says sm_80$" check.log ||
        fail "cubin SM message: $(grep FAIL check.log)"
    echo "ok   cubins: one per capability, SM read from the ELF header and checked"
fi

# --backends names only cpu and cuda; an unknown entry is refused, not ignored
for b in cpu,rocm cpux "" ,cuda; do
    if "$KHUB" init acme/t-b --kind norm --backends "$b" > out.log 2>&1; then fail "init accepted --backends '$b'"; fi
    grep -q -- "--backends '$b': a comma-separated list of cpu and cuda" out.log || fail "backends message: $(cat out.log)"
    [ ! -e t-b ] || fail "a refused init left t-b behind"
done
echo "ok   init refuses unknown --backends entries"

# init refuses what it cannot scaffold, with a reason naming what it can
if "$KHUB" init acme/x --kind softmax > out.log 2>&1; then fail "init accepted kind softmax"; fi
grep -q "no template for kind 'softmax' (attention, norm, linear, activation, qlinear, rotary, kv_cache)" out.log ||
    fail "init error message: $(cat out.log)"
for b in cuda cpu,cuda; do
    if "$KHUB" init acme/t-kv --kind kv_cache --backends $b > out.log 2>&1; then fail "init kv_cache accepted --backends $b"; fi
    grep -q -- "--backends '$b': kind 'kv_cache' has a template for cpu only (use --backends cpu; cuda is offered for attention, norm, linear, activation, qlinear, rotary)" out.log ||
        fail "kv_cache cuda message: $(cat out.log)"
    [ ! -e t-kv ] || fail "a refused init left t-kv behind"
done
echo "ok   init refuses an unknown kind and cuda for kv_cache, naming what it offers"
mkdir t-attention
if "$KHUB" init acme/t-attention --kind attention > out.log 2>&1; then fail "init overwrote a dir"; fi
grep -q "t-attention: cannot create directory" out.log || fail "existing dir message: $(cat out.log)"

# keygen + sign: every variant's metadata.json gets a signature, archives repacked
"$KHUB" keygen author > keygen.log || fail "keygen"
grep -q "^khub-ed25519 " keygen.log || fail "keygen output"
if "$KHUB" keygen author > /dev/null 2>&1; then fail "keygen overwrote a key"; fi
"$KHUB" sign --key author.key t-norm-cpu-cuda > sign.log || fail "sign: $(cat sign.log)"
[ "$(grep -c '^signed ' sign.log)" -ge 1 ] || fail "sign signed nothing"
for v in t-norm-cpu-cuda/build/*/; do [ -f "$v/metadata.json.sig" ] || fail "no signature in $v"; done
tar -tzf t-norm-cpu-cuda/build/khub1-cpu-*-linux.tar.gz | grep metadata.json.sig > /dev/null || fail "archive lacks the signature"
"$KHUB" check t-norm-cpu-cuda > check.log 2>&1 || { cat check.log; fail "check after sign"; }
grep -q "signed (metadata.json.sig)" check.log || fail "check does not see the signature"

# a tampered build is refused by check, naming the file
so=$(ls t-norm-cpu-cuda/build/khub1-cpu-*-linux/t-norm-cpu-cuda-generic.so)
t_flip_byte "$so" 200
if "$KHUB" check t-norm-cpu-cuda > check.log 2>&1; then fail "check accepted a tampered .so"; fi
grep -q "t-norm-cpu-cuda-generic.so: SHA-256" check.log || fail "tamper message: $(grep FAIL check.log)"
echo "ok   keygen, sign, tamper detection"

# the in-tree kernels build and pass their gates
for k in "$SRC"/kernels-src/*/; do
    [ -f "$k/kernel.json" ] || continue
    n=$(basename "$k")
    mkdir -p intree && rm -rf "intree/$n" && cp -r "$k" "intree/$n" && rm -rf "intree/$n/build"
    "$KHUB" build "intree/$n" --quiet > build.log 2>&1 || fail "build kernels-src/$n: $(cat build.log)"
    # a CUDA-only kernel (rotary, gemv, kv-cache-cuda) has no variant without NVRTC
    if ! ls -d "intree/$n"/build/khub1-*-linux > /dev/null 2>&1; then
        grep -q "CUDA variant skipped: " build.log || fail "kernels-src/$n: no variant, no reason: $(cat build.log)"
        echo "skip kernels-src/$n: $(grep -o 'CUDA variant skipped: .*' build.log)"
        continue
    fi
    "$KHUB" check "intree/$n" > check.log 2>&1 || { cat check.log; fail "check kernels-src/$n"; }
    # NVRTC compiles every in-tree CUDA kernel: one checked PTX per listed capability
    ccs=$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))["variants"]
print(" ".join(str(c) for c in v.get("cuda", {}).get("capabilities", [])))' "$k/kernel.json")
    if [ -n "$ccs" ] && [ $nvrtc = 1 ]; then
        for cc in $ccs; do
            grep -q "^ok   intree/$n/build/khub1-cu[0-9]*-.*\.sm_$cc\.ptx: .target sm_$cc " check.log ||
                fail "kernels-src/$n: no NVRTC-built PTX for sm_$cc: $(cat check.log)"
        done
        echo "ok   kernels-src/$n: NVRTC built PTX for sm_${ccs// /, sm_}"
        # gemv: each PTX holds every kernel the glue can name, from the glue's
        # own table (suffix, the lowest capability with a GEMM; 0: none): the
        # GEMV of each format, the GEMM from that capability on, and no GEMM
        # below it (bf16 mma needs sm_80)
        if [ "$n" = gemv ]; then
            table=$(grep -o '\[F_[A-Z0-9_]*\] = {"[a-z0-9_]*", [0-9]*}' "$k/gemv_cuda.c" |
                sed 's/.*{"\([a-z0-9_]*\)", \([0-9]*\)}/\1:\2/')
            [ "$(echo $table | wc -w)" -eq 9 ] || fail "kernels-src/gemv: the glue's format table: '$table'"
            for cc in $ccs; do
                ptx=$(ls intree/gemv/build/khub1-cu*-linux/gemv.sm_$cc.ptx)
                for e in $table; do
                    f=${e%%:*} from=${e##*:}
                    grep -q "\.entry khub_gemv_$f(" "$ptx" || fail "$ptx lacks khub_gemv_$f"
                    if [ "$from" -gt 0 ] && [ "$cc" -ge "$from" ]; then
                        grep -q "\.entry khub_gemm_$f(" "$ptx" || fail "$ptx lacks khub_gemm_$f"
                    elif grep -q "\.entry khub_gemm_$f(" "$ptx"; then
                        fail "$ptx has khub_gemm_$f, which the glue never launches on sm_$cc"
                    fi
                done
            done
            echo "ok   kernels-src/gemv: the GEMV and GEMM of every format the glue names in the PTX of sm_${ccs// /, sm_}"
        fi
        # flash-attn2: each PTX holds every build-time kernel the glue names
        # (tiles, split-K decode, merge per head_dim) and none of the kernels
        # it has compiled at load for a shape (khub_fa2_*spec: -D only)
        if [ "$n" = flash-attn2 ]; then
            names=$(grep -o '"khub_fa2_[a-z0-9_]*"' "$k/flash_attn_cuda.c" | tr -d '"' | sort -u)
            fa_built=$(echo "$names" | grep -v 'spec$')
            [ "$(echo $fa_built | wc -w)" -eq 6 ] || fail "kernels-src/flash-attn2: the glue's kernels: '$fa_built'"
            for cc in $ccs; do
                ptx=$(ls intree/flash-attn2/build/khub1-cu*-linux/flash_attn.sm_$cc.ptx)
                for f in $names; do
                    if [ "${f%spec}" = "$f" ]; then
                        grep -q "\.entry $f(" "$ptx" || fail "$ptx lacks $f"
                    elif grep -q "\.entry $f(" "$ptx"; then
                        fail "$ptx has $f, which only a load-time compile defines"
                    fi
                done
            done
            echo "ok   kernels-src/flash-attn2: tiles, split-K and merge for head_dim 64 and 128 in the PTX of sm_${ccs// /, sm_}"
        fi
    elif [ -n "$ccs" ]; then
        echo "skip kernels-src/$n CUDA variant: $(grep -o 'CUDA variant skipped: .*' build.log)"
    fi
    echo "ok   kernels-src/$n: $(tail -1 check.log)"
done
echo "1 passed, 0 failed"
