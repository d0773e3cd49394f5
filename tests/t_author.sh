#!/usr/bin/env bash
# (Pipelines into grep use plain grep > /dev/null, not grep -q: with pipefail an early
# grep -q exit can kill a still-writing producer with SIGPIPE and fail the test.)
# The kernel author's loop, end to end with the real CLI: khub init for each
# template kind (with CUDA where it has one), khub build, khub check (gate +
# self-tests against khub/ref-cpu in a child), keygen + sign; then every
# in-tree kernel of kernels-src/ is built and checked in a scratch copy.
set -euo pipefail
KHUB=${KHUB_BIN:?set by ctest}
SRC=${KHUB_SRC:?set by ctest}
work=$(mktemp -d /tmp/khub-author-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }

for spec in "attention cpu,cuda" "norm cpu,cuda" "activation cpu"; do
    set -- $spec
    name="t-$1"
    "$KHUB" init "acme/$name" --kind "$1" --backends "$2" > init.log || fail "init $1: $(cat init.log)"
    "$KHUB" build "$name" --quiet > build.log 2>&1 || fail "build $1: $(cat build.log)"
    "$KHUB" check "$name" > check.log 2>&1 || { cat check.log; fail "check $1"; }
    grep -q "NMSE" check.log || fail "check $1 ran no numeric self-test"
    grep -q "0 findings" check.log || fail "check $1 summary"
    echo "ok   init/build/check $1 ($2)"
done

# init refuses what it cannot scaffold, with a reason
if "$KHUB" init acme/x --kind softmax > out.log 2>&1; then fail "init accepted kind softmax"; fi
grep -q "no template for kind 'softmax'" out.log || fail "init error message: $(cat out.log)"
if "$KHUB" init acme/t-attention --kind attention > out.log 2>&1; then fail "init overwrote a dir"; fi

# keygen + sign: every variant's metadata.json gets a signature, archives repacked
"$KHUB" keygen author > keygen.log || fail "keygen"
grep -q "^khub-ed25519 " keygen.log || fail "keygen output"
if "$KHUB" keygen author > /dev/null 2>&1; then fail "keygen overwrote a key"; fi
"$KHUB" sign --key author.key t-norm > sign.log || fail "sign: $(cat sign.log)"
[ "$(grep -c '^signed ' sign.log)" -ge 1 ] || fail "sign signed nothing"
for v in t-norm/build/*/; do [ -f "$v/metadata.json.sig" ] || fail "no signature in $v"; done
tar -tzf t-norm/build/khub1-cpu-*-linux.tar.gz | grep metadata.json.sig > /dev/null || fail "archive lacks the signature"
"$KHUB" check t-norm > check.log 2>&1 || { cat check.log; fail "check after sign"; }
grep -q "signed (metadata.json.sig)" check.log || fail "check does not see the signature"

# a tampered build is refused by check, naming the file
so=$(ls t-norm/build/khub1-cpu-*-linux/t-norm-generic.so)
printf 'X' | dd of="$so" bs=1 seek=200 conv=notrunc status=none
if "$KHUB" check t-norm > check.log 2>&1; then fail "check accepted a tampered .so"; fi
grep -q "t-norm-generic.so: SHA-256" check.log || fail "tamper message: $(grep FAIL check.log)"
echo "ok   keygen, sign, tamper detection"

# the in-tree kernels build and pass their gates
for k in "$SRC"/kernels-src/*/; do
    [ -f "$k/kernel.json" ] || continue
    n=$(basename "$k")
    mkdir -p intree && rm -rf "intree/$n" && cp -r "$k" "intree/$n" && rm -rf "intree/$n/build"
    "$KHUB" build "intree/$n" --quiet > build.log 2>&1 || fail "build kernels-src/$n: $(cat build.log)"
    "$KHUB" check "intree/$n" > check.log 2>&1 || { cat check.log; fail "check kernels-src/$n"; }
    echo "ok   kernels-src/$n: $(tail -1 check.log)"
done
echo "1 passed, 0 failed"
