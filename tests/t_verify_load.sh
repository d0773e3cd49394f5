#!/usr/bin/env bash
# t_verify_load.sh: the order of the checks when a kernel named by Hub ID is
# loaded (runtime/kernels/kernel_load.c), through `khub fetch` against `khub serve`:
#   - a metadata.json changed after signing: SIGNATURE_INVALID, naming the key;
#   - metadata.json that is not even JSON under a signature: still the
#     signature error, because the signature is checked on the exact bytes
#     before metadata.json is parsed; the same garbage signed by the trusted
#     key gets past the signature and only then fails to parse;
#   - a malformed metadata.json.sig: SIGNATURE_INVALID;
#   - a cached plugin changed after its download: DIGEST_MISMATCH before
#     anything is loaded (the loader never opens it);
#   - a validly signed plugin with a RUNPATH: PLUGIN_INVALID from the ABI
#     gate on its sealed bytes, before dlopen (its constructor never runs).
#   - a writer to the cache who swaps metadata.json and the plugins right
#     after metadata.json was read for the signature check (tests/swap_shim,
#     preloaded): DIGEST_MISMATCH against the signed table; the swapped-in,
#     unsigned plugin is never loaded (issue 10 item 1: one read of
#     metadata.json is the only source of digests).
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin verify
ARCH=$(uname -m); V=khub1-cpu-$ARCH-linux
C1=1111111111111111111111111111111111111111

cp -r "$SRC/kernels-src/kv-cache" kv && rm -rf kv/build
"$KHUB" build kv --quiet > build.log 2>&1 || fail "build: $(cat build.log)"
"$KHUB" keygen alice > /dev/null
"$KHUB" sign --key alice.key kv > /dev/null || fail "sign"
printf '{"version":1,"publishers":{"kernels-community":["%s"]}}' "$(cat alice.pub)" > policy.json
export KHUB_POLICY=$T/policy.json

# publish REPO EDIT: the signed build as commit C1 of kernels-community/REPO,
# after running EDIT (shell, in the variant directory)
publish() {
    local d=repos/kernels-community/$1/commits/$C1/build
    mkdir -p "$d" && cp -r "kv/build/$V" "$d/$V"
    (cd "$d/$V" && eval "$2") || fail "edit for $1"
    (cd "$d/$V" && tar -czf "../$V.tar.gz" ./*)
    printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' $C1 $C1 \
        > "repos/kernels-community/$1/refs.json"
}
publish kv-cache ":" # the build names itself kernels-community/kv-cache
publish swapped ":"
publish edited "sed -i 's/\"1.0.0\"/\"1.0.1\"/' metadata.json"
publish garbage "printf '{not json' > metadata.json"
publish garbage-signed "printf '{not json' > metadata.json && '$KHUB' sign --key '$T/alice.key' metadata.json > /dev/null"
publish badsig "printf '{\"algorithm\": \"ed25519\"}' > metadata.json.sig"
# runpath: the same kernel rebuilt with a RUNPATH (and a constructor that
# leaves runpath.mark), its digests updated and metadata.json signed again
# by the trusted key (under this repo's name): a valid signature over a
# plugin the ABI gate refuses
cat > ctor.c <<'C'
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) { close(open(RUNPATH_MARK, O_WRONLY | O_CREAT, 0644)); }
C
cc -std=gnu11 -O2 -fPIC -shared -fvisibility=hidden -DKHUB_PLUGIN_MODULE -I"$SRC/abi" \
    -DRUNPATH_MARK="\"$T/runpath.mark\"" "$SRC/kernels-src/kv-cache/static_cache.c" ctor.c \
    -Wl,--enable-new-dtags,-rpath,"$T/evil-lib" -o runpath.so -lm || fail "compiling runpath.so"
publish runpath "for f in kv-cache-*.so; do cp '$T/runpath.so' \$f; done && python3 -c '
import hashlib, json
m = json.load(open(\"metadata.json\"))
for f in m[\"files\"]: m[\"files\"][f] = hashlib.sha256(open(f, \"rb\").read()).hexdigest()
m[\"name\"] = \"kernels-community/runpath\"  # its own name: a load checks it
json.dump(m, open(\"metadata.json\", \"w\"))' && '$KHUB' sign --key '$T/alice.key' metadata.json > /dev/null"
cmp -s repos/kernels-community/edited/commits/$C1/build/$V/metadata.json "kv/build/$V/metadata.json" &&
    fail "the edit of metadata.json did not apply"

t_serve repos serve.out --log log
export HF_ENDPOINT=$EP
export KHUB_CACHE=$T/cache HF_TOKEN=

# STATUS names the library's status (asserted in the C tests); the CLI
# prints "khub fetch: MESSAGE" as every command does.
expect() { # expect STATUS TEXT ID
    if "$KHUB" fetch "$3" > f.out 2>&1; then fail "$3 loaded, expected $1: $(cat f.out)"; fi
    grep -q "^khub fetch: " f.out && grep -q -- "$2" f.out || fail "$3: want $1 '$2': $(cat f.out)"
}
"$KHUB" fetch kernels-community/kv-cache@v1 > f.out 2>&1 || fail "good: $(cat f.out)"
grep -q "^trust    metadata.json signed with key" f.out || fail "good trust line: $(cat f.out)"
ALICE_ID=$(grep -o 'signed with key [0-9a-f]*' f.out | awk '{print $4}')
[ -n "$ALICE_ID" ] || fail "no key id in: $(cat f.out)"
expect KHUB_STATUS_SIGNATURE_INVALID "signature by key $ALICE_ID does not verify over metadata.json" \
    kernels-community/edited@v1
expect KHUB_STATUS_SIGNATURE_INVALID "does not verify over metadata.json" kernels-community/garbage@v1
expect KHUB_STATUS_METADATA_INVALID "metadata.json: not a JSON object" kernels-community/garbage-signed@v1
grep -q "does not verify" f.out && fail "signed garbage failed on the signature: $(cat f.out)"
expect KHUB_STATUS_SIGNATURE_INVALID "metadata.json.sig is malformed" kernels-community/badsig@v1
echo "ok   the signature is checked on the exact bytes before metadata.json is parsed"

# a signed plugin with a RUNPATH is refused by the ABI gate on its sealed
# bytes, before dlopen: its constructor never runs, no library is searched
expect KHUB_STATUS_PLUGIN_INVALID "refused before loading: the ABI gate found 1 problem(s): has RUNPATH '$T/evil-lib'" \
    kernels-community/runpath@v1
grep -q "SIGNATURE\|DIGEST" f.out && fail "runpath: refused for its signature or digests: $(cat f.out)"
[ ! -e runpath.mark ] || fail "the RUNPATH plugin's constructor ran"
echo "ok   a signed plugin with a RUNPATH is refused at load, before any of its code runs"

# a cached plugin changed after its download is refused before dlopen
so=$(find cache -path "*kernels--kernels-community--kv-cache*" -name 'kv-cache-*.so' | head -n 1)
[ -n "$so" ] || fail "no cached plugin"
so=$(readlink -f "$so")
t_flip_byte "$so" 300
expect KHUB_STATUS_DIGEST_MISMATCH "kv-cache-[a-z0-9]*.so has SHA-256 [0-9a-f]*, metadata.json says" kernels-community/kv-cache@v1
grep -q "loaded" f.out && grep -q "^file " f.out && fail "a tampered plugin was loaded: $(cat f.out)"
echo "ok   a tampered cached plugin is refused (digest) before it is loaded"

# The swap between the signature check and the load: cache the variant, then
# stage a consistent unsigned copy (every plugin with one byte more, and a
# metadata.json whose table lists their digests) that the shim renames into
# the cached folder as soon as metadata.json.sig is opened.
# (the kv-cache build served as "swapped": its clean load needs the override)
"$KHUB" fetch kernels-community/swapped@v1 --allow-name-mismatch > f.out 2>&1 \
    || fail "swapped (clean): $(cat f.out)"
vdir=$(find cache -type d -path "*kernels--kernels-community--swapped*" -name "$V" | head -n 1)
[ -n "$vdir" ] || fail "swapped: no cached variant folder"
rm -rf evil && mkdir evil
cp "$vdir/metadata.json" evil/metadata.json
for so in "$vdir"/*.so; do
    b=$(basename "$so")
    old=$(sha256sum < "$so" | cut -c1-64)
    { cat "$so"; printf 'X'; } > "evil/$b"
    new=$(sha256sum < "evil/$b" | cut -c1-64)
    sed -i "s/$old/$new/" evil/metadata.json
done
cmp -s evil/metadata.json "$vdir/metadata.json" && fail "the unsigned table did not change"
swapped_fetch() {
    ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 KHUB_SWAP_FROM=$T/evil \
        LD_PRELOAD=$KHUB_BUILD/swap-shim/libkhub_swap_shim.so "$KHUB" fetch "$@"
}
if swapped_fetch kernels-community/swapped@v1 > f.out 2>&1; then
    fail "the unsigned plugin swapped in after the signature check was loaded: $(cat f.out)"
fi
[ -z "$(ls evil)" ] || fail "the shim swapped nothing in: $(ls evil) $(cat f.out)"
cmp -s "$vdir/metadata.json" kv/build/$V/metadata.json && fail "metadata.json was not swapped"
grep -q -- "^khub fetch: .*kv-cache-[a-z0-9]*.so has SHA-256 [0-9a-f]*, metadata.json says" f.out ||
    fail "swap: want DIGEST_MISMATCH against the signed table: $(cat f.out)"
echo "ok   files swapped in after the signature check are refused against the signed table"
echo "2 passed, 0 failed"
