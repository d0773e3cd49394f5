#!/usr/bin/env bash
# t_lock.sh: kernels by Hub ID end to end on a local `khub serve`: real kernels
# built with `khub build` (kv-cache v1, a new v1 commit, v2), signed with
# `khub sign`, written into the server's directory layout; khub.json -> khub
# lock -> locked loads (old commit after the branch moved, zero requests with
# a full cache, offline), khub outdated/update, a tampered cache refused
# naming the file, an offline locked load of a variant not cached, khub sync
# (this machine's variant, --all-variants), fallback and strict mode for a
# kernel without a variant for this machine (khub fetch, and at model load
# from khub.json when the real model is there), and the trust policy at load
# (signed, unsigned, revoked, unknown key, opt-in), plus the import of a
# Python kernels.lock.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin lock

ARCH=$(uname -m); V=khub1-cpu-$ARCH-linux
[ "$ARCH" = x86_64 ] && OTHER=aarch64 || OTHER=x86_64
C1=1111111111111111111111111111111111111111
C2=2222222222222222222222222222222222222222
C3=3333333333333333333333333333333333333333
KC=repos/kernels-community/kv-cache

# --- real kernels: v1 (1.0.0), a later v1 commit (1.0.1), v2 (2.0.0) --------
build() { # build NAME VERSION MAJOR
    rm -rf "$1" && cp -r "$SRC/kernels-src/kv-cache" "$1" && rm -rf "$1/build"
    sed -i "s/\"version\": \"1.0.0\"/\"version\": \"$2\"/; s/\"major\": 1/\"major\": $3/" \
        "$1/kernel.json"
    sed -i "s/\"1.0.0\"/\"$2\"/g" "$1/static_cache.c" # the plugin's own version string
    "$KHUB" build "$1" --quiet > build.log 2>&1 || fail "build $1: $(cat build.log)"
}
build kv100 1.0.0 1; build kv101 1.0.1 1; build kv200 2.0.0 2
"$KHUB" keygen alice > /dev/null; "$KHUB" keygen bob > /dev/null
for k in kv100 kv101 kv200; do "$KHUB" sign --key alice.key "$k" > /dev/null || fail "sign $k"; done

# Writes the build of $2 as commit $3 of repo $1: the variant directory and a
# flat per-variant archive (one request per variant).
publish() {
    local d=repos/$1/commits/$3/build
    mkdir -p "$d" && cp -r "$2/build/$V" "$d/$4"
    (cd "$d/$4" && tar -czf "../$4.tar.gz" *)
}
publish kernels-community/kv-cache kv100 $C1 $V
publish kernels-community/kv-cache kv101 $C3 $V
publish kernels-community/kv-cache kv200 $C2 $V
refs() { printf '{"branches":{"main":"%s","v1":"%s","v2":"%s"},"tags":{}}' "$2" "$2" "$3" \
         > "repos/$1/refs.json"; }
refs kernels-community/kv-cache $C1 $C2
# unsigned build of a listed org, unlisted org, bob-signed, other-arch only
cp -r kv100 kvu && rm -f kvu/build/*/metadata.json.sig
publish kernels-community/unsigned kvu $C1 $V; refs kernels-community/unsigned $C1 $C1
# acme/kv: the unsigned build, under its own name (a load checks the name)
cp -r kvu kva && sed -i 's#"kernels-community/kv-cache"#"acme/kv"#' kva/build/$V/metadata.json
publish acme/kv kva $C1 $V; refs acme/kv $C1 $C1
# alice's validly signed kv-cache build served as another kernel of her org
publish kernels-community/other-kernel kv100 $C1 $V; refs kernels-community/other-kernel $C1 $C1
cp -r kvu kvb && "$KHUB" sign --key bob.key kvb > /dev/null
publish kernels-community/bobs kvb $C1 $V; refs kernels-community/bobs $C1 $C1
publish kernels-community/elsewhere kv100 $C1 "khub1-cpu-$OTHER-linux"
refs kernels-community/elsewhere $C1 $C1
# one commit built for this machine and for the other architecture
publish kernels-community/multi kv100 $C1 $V
publish kernels-community/multi kv100 $C1 "khub1-cpu-$OTHER-linux"
refs kernels-community/multi $C1 $C1

ALICE=$(cat alice.pub)
printf '{"version":1,"publishers":{"kernels-community":["%s"]}}' "$ALICE" > policy.json
export KHUB_POLICY=$T/policy.json

t_serve repos serve.out --log log
export HF_ENDPOINT=$EP
export KHUB_CACHE=$T/cache HF_TOKEN=
requests() { grep '^requests' "$1" | awk '{print $2}'; }

# --- khub.json -> khub.lock ------------------------------------------------
mkdir proj
cat > proj/khub.json <<'JSON'
{"format": 1,
 "roles": {"cache": {"cpu": {"repo": "kernels-community/kv-cache", "version": 1}}}}
JSON
timeout 60 "$KHUB" lock proj > lock.out 2> lock.err || fail "lock: $(cat lock.err)"
grep -q "locked kernels-community/kv-cache v1 -> $C1" lock.out || fail "lock: $(cat lock.out)"
grep -q "pinned to v1, but v2 is the newest version" lock.err || fail "no newest-version warning"
grep -q "\"commit\":	\"$C1\"" proj/khub.lock || fail "lock content: $(cat proj/khub.lock)"
grep -q '"hash":	"sha256:' proj/khub.lock || fail "no content hash"
echo "ok   khub lock pins v1 to its commit, warns that v2 exists"

# no version named: the newest v<N> and its own commit (not main's); a cache
# of its own, so the v2 build it fetches does not reach the checks below
mkdir bare
echo '{"format": 1, "roles": {"cache": {"cpu": {"repo": "kernels-community/kv-cache"}}}}' \
    > bare/khub.json
KHUB_CACHE=$T/cache-bare timeout 60 "$KHUB" lock bare > lock.out 2> lock.err || fail "lock bare: $(cat lock.err)"
grep -q "kernels-community/kv-cache: no version given; pinned to v2 (the newest), commit 222222222222" \
    lock.err || fail "no-version warning: $(cat lock.err)"
grep -q "\"commit\":	\"$C2\"" bare/khub.lock && grep -q '"version":	2' bare/khub.lock \
    && grep -q '"kernel_version":	"2.0.0"' bare/khub.lock || fail "bare lock: $(cat bare/khub.lock)"
echo "ok   khub lock without a version pins the newest v2 and its commit"

# a built-in plugin named by its id (what `khub tune --save` writes when
# attention=khub/ref-cpu wins) is loaded, never fetched: nothing to pin, no request
mkdir mixed
echo '{"format": 1, "roles": {"attention": "khub/ref-cpu", "cache": "kernels-community/kv-cache@v1"}}' \
    > mixed/khub.json
timeout 60 "$KHUB" lock mixed > lock.out 2> lock.err || fail "lock mixed: $(cat lock.err)"
grep -qx "khub lock: khub/ref-cpu is a built-in plugin: nothing to lock" lock.err ||
    fail "built-in note: $(cat lock.err)"
grep -q "wrote mixed/khub.lock (1 kernel)" lock.out && ! grep -q ref-cpu mixed/khub.lock ||
    fail "mixed lock: $(cat lock.out) $(cat mixed/khub.lock)"
echo "ok   khub lock skips a built-in plugin named in khub.json, pins the Hub kernel"

# --- locked load, signed, zero requests with a full cache ------------------
timeout 60 "$KHUB" fetch kernels-community/kv-cache --lock proj/khub.lock > f.out 2>&1 \
    || fail "locked fetch: $(cat f.out)"
grep -q "(locked, verified)" f.out || fail "not locked: $(cat f.out)"
grep -q "^version  1.0.0" f.out || fail "wrong version: $(cat f.out)"
grep -q "^trust    metadata.json signed with key" f.out || fail "trust: $(cat f.out)"
[ "$(requests f.out)" = 0 ] || fail "locked load with a full cache made $(requests f.out) requests"
echo "ok   locked load: signed, lock verified, 0 requests"

# --- branch v1 moves: the lock still loads the old commit ------------------
refs kernels-community/kv-cache $C3 $C2
timeout 60 "$KHUB" fetch kernels-community/kv-cache --lock proj/khub.lock > f.out 2>&1 \
    || fail "locked fetch after move: $(cat f.out)"
grep -q "@$C1 (locked" f.out && grep -q "^version  1.0.0" f.out || fail "moved: $(cat f.out)"
[ "$(requests f.out)" = 0 ] || fail "moved: $(requests f.out) requests"
rc=0; timeout 60 "$KHUB" outdated proj > od.out 2>&1 || rc=$?
[ $rc = 3 ] && grep -q "moved: khub update" od.out && grep -q "  newer v2 (newest v2)$" od.out \
    || fail "outdated rc=$rc: $(cat od.out)"
# every newer version is listed, in numeric order, each once (v03 is v3)
cp repos/kernels-community/kv-cache/refs.json refs.saved
printf '{"branches":{"main":"%s","v1":"%s","v10":"%s","v2":"%s","v03":"%s","v3":"%s","vx":"%s"},"tags":{}}' \
    $C3 $C3 $C2 $C2 $C2 $C2 $C2 > repos/kernels-community/kv-cache/refs.json
rc=0; timeout 60 "$KHUB" outdated proj > od.out 2>&1 || rc=$?
[ $rc = 3 ] && grep -q "  newer v2 v3 v10 (newest v10)$" od.out || fail "outdated, 3 newer: rc=$rc: $(cat od.out)"
rc=0; timeout 60 "$KHUB" outdated proj --json > od.json 2> od.err || rc=$?
[ $rc = 3 ] || fail "outdated --json rc=$rc: $(cat od.err)"
python3 - od.json "$C1" "$C3" <<'PY' || fail "outdated --json: $(cat od.json)"
import json, sys
rows = {r["repo"]: r for r in json.load(open(sys.argv[1]))}
r = rows["kernels-community/kv-cache"]
assert (r["pin"], r["locked"], r["now"], r["moved"]) == ("v1", sys.argv[2], sys.argv[3], True), r
assert r["newer"] == [2, 3, 10] and r["newest"] == 10, r
PY
if "$KHUB" sync proj --json > /dev/null 2> od.err; then fail "sync took --json"; fi
grep -q "unknown option --json" od.err || fail "sync --json: $(cat od.err)"
mv refs.saved repos/kernels-community/kv-cache/refs.json
before=$(wc -l < log)
HF_HUB_OFFLINE=1 timeout 60 "$KHUB" fetch kernels-community/kv-cache --lock proj/khub.lock \
    > f.out 2>&1 || fail "offline locked fetch: $(cat f.out)"
[ "$(wc -l < log)" = "$before" ] || fail "offline locked load reached the server"
echo "ok   moved branch: locked load keeps $C1 (online and offline), outdated says so"

mkdir lockonly && cp proj/khub.lock lockonly/ # a lock without its khub.json
timeout 60 "$KHUB" update proj kernels-community/kv-cache > up.out 2>&1 || fail "update: $(cat up.out)"
grep -q "\"commit\":	\"$C3\"" proj/khub.lock || fail "update did not pin $C3"
# the same last line as khub lock's (it had no kernel count)
grep -qx "wrote proj/khub.lock (1 kernel)" up.out || fail "update's line: $(cat up.out)"
timeout 60 "$KHUB" fetch kernels-community/kv-cache --lock proj/khub.lock > f.out 2>&1 \
    || fail "fetch after update: $(cat f.out)"
grep -q "^version  1.0.1" f.out || fail "update: $(cat f.out)"
timeout 60 "$KHUB" update lockonly > up.out 2>&1 || fail "update lockonly: $(cat up.out)"
grep -q "updated kernels-community/kv-cache v1 -> $C3" up.out || fail "update lockonly: $(cat up.out)"
grep -q "pinned to v1, but v2 is the newest version" up.out || fail "update: no newest-version warning"
grep -q "\"commit\":	\"$C3\"" lockonly/khub.lock && grep -q '"version":	1' lockonly/khub.lock \
    || fail "lockonly pin: $(cat lockonly/khub.lock)"
echo "ok   khub update picks the new v1 commit (one ID from khub.json; all, from the lock's own pins)"

# --- downgrade: v1 moved back to the older signed build --------------------
grep -q '"kernel_version":	"1.0.1"' proj/khub.lock || fail "no kernel_version: $(cat proj/khub.lock)"
cp proj/khub.lock lock.before
refs kernels-community/kv-cache $C1 $C2
if timeout 60 "$KHUB" update proj kernels-community/kv-cache > up.out 2>&1; then
    fail "update followed v1 back to 1.0.0: $(cat up.out)"; fi
grep -q "khub update: kernels-community/kv-cache: the pin now resolves to commit 111111111111, version 1.0.0, older than the locked 1.0.1 (commit 333333333333): the branch was moved back to an older build; refusing to downgrade (--allow-downgrade accepts it)" up.out \
    || fail "downgrade message: $(cat up.out)"
cmp -s lock.before proj/khub.lock || fail "a refused update changed the lock"
if timeout 60 "$KHUB" update lockonly > up.out 2>&1; then fail "lockonly downgrade: $(cat up.out)"; fi
grep -q "refusing to downgrade" up.out || fail "lockonly downgrade message: $(cat up.out)"
timeout 60 "$KHUB" update proj kernels-community/kv-cache --allow-downgrade > up.out 2>&1 \
    || fail "update --allow-downgrade: $(cat up.out)"
grep -q "warning: kernels-community/kv-cache: downgrading from 1.0.1 (commit 333333333333) to 1.0.0 (commit 111111111111) (--allow-downgrade)" up.out \
    || fail "downgrade warning: $(cat up.out)"
grep -q "\"commit\":	\"$C1\"" proj/khub.lock && grep -q '"kernel_version":	"1.0.0"' proj/khub.lock \
    || fail "allowed downgrade: $(cat proj/khub.lock)"
# khub sync installs what the lock says, and warns that this cache already
# holds a newer build of it (the lock was moved back)
timeout 60 "$KHUB" sync proj > sync.out 2>&1 || fail "sync of the older lock: $(cat sync.out)"
grep -q "khub: warning: kernels-community/kv-cache: proj/khub.lock pins version 1.0.0 (commit 111111111111), older than version 1.0.1 (commit 333333333333) already in this cache: was the lock moved back to an older build?" sync.out \
    || fail "sync downgrade warning: $(cat sync.out)"
refs kernels-community/kv-cache $C3 $C2
timeout 60 "$KHUB" update proj kernels-community/kv-cache > up.out 2>&1 || fail "upgrade: $(cat up.out)"
grep -q "\"commit\":	\"$C3\"" proj/khub.lock || fail "upgrade did not pin $C3"
timeout 60 "$KHUB" sync proj > sync.out 2>&1 || fail "sync: $(cat sync.out)"
if grep -q "warning" sync.out; then fail "sync of the newest build warned: $(cat sync.out)"; fi
echo "ok   downgrade: khub update refuses a v1 moved back to an older signed build (lock unchanged), --allow-downgrade takes it with a warning; khub sync of a lock moved back warns"

# --- a tampered cached file is refused, naming it --------------------------
so=$(ls cache/kernels--kernels-community--kv-cache/khub-variants/$C3/$V/kv-cache-avx2.so)
t_flip_byte "$so" 300
if "$KHUB" fetch kernels-community/kv-cache --lock proj/khub.lock > f.out 2>&1; then
    fail "tampered cache loaded"; fi
grep -q "^khub fetch: verifying kernels-community/kv-cache: .*kv-cache-avx2.so has SHA-256" f.out \
    || fail "tamper message: $(cat f.out)"
rm -rf "cache/kernels--kernels-community--kv-cache/khub-variants/$C3"
if HF_HUB_OFFLINE=1 "$KHUB" fetch kernels-community/kv-cache --lock proj/khub.lock > f.out 2>&1; then
    fail "offline locked load without the variant cached succeeded"; fi
grep -q "^khub fetch: kernels-community/kv-cache@333333333333: locked variant $V is not cached and the hub is offline (HF_HUB_OFFLINE); run khub sync" f.out \
    || fail "offline, not cached: $(cat f.out)"
timeout 60 "$KHUB" sync proj > s.out 2>&1 || fail "sync: $(cat s.out)"
grep -q "1 variant verified" s.out || fail "sync: $(cat s.out)"
"$KHUB" fetch kernels-community/kv-cache --lock proj/khub.lock > f.out 2>&1 || fail "after sync"
echo "ok   tampered cache refused (LOCK_MISMATCH naming the file); offline and not cached says run khub sync; khub sync repairs it"

# --- no variant for this machine: fallback with the trace, strict fails ----
timeout 60 "$KHUB" fetch kernels-community/elsewhere@v1 > f.out 2>&1 || fail "fallback: $(cat f.out)"
grep -q "falling back to khub/ref-cpu" f.out && grep -q "khub1-cpu-$OTHER-linux: reject" f.out \
    || fail "fallback output: $(cat f.out)"
if "$KHUB" fetch kernels-community/elsewhere@v1 --strict > f.out 2>&1; then fail "strict"; fi
grep -q "^khub fetch: kernels-community/elsewhere@[0-9a-f]*: no build variant fits this machine (strict): khub1-cpu-$OTHER-linux: reject" f.out \
    || fail "strict output: $(cat f.out)"
echo "ok   no variant: fallback with the trace; --strict fails with NO_VARIANT"

# --- the same at model load, from khub.json (needs the real model) --------
MODEL=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$MODEL" ]; then
    mkdir away
    echo '{"format":1,"roles":{"cache":{"cpu":{"repo":"kernels-community/elsewhere","version":1}}}}' \
        > away/khub.json
    timeout 120 "$KHUB" run --model "$MODEL" --prompt hi --max-new-tokens 1 --kernels away/khub.json \
        --explain > r.out 2> r.err || fail "mapping fallback run: $(cat r.err)"
    grep -q "cache kernel kernels-community/elsewhere@version=1: no variant fits this machine; the reference plugin serves cache instead. Variant trace: khub1-cpu-$OTHER-linux: reject" r.err \
        || fail "mapping fallback warning: $(cat r.err)"
    grep -q "^cache: kernels-community/elsewhere@version=1 -> fell back to khub/ref-cpu" r.out &&
        grep -q "^kv_cache\[f32\]: khub/ref-cpu" r.out || fail "mapping fallback explain: $(cat r.out)"
    if timeout 120 "$KHUB" run --model "$MODEL" --prompt hi --max-new-tokens 1 \
        --kernels away/khub.json --strict > r.out 2> r.err; then fail "strict mapping fallback ran"; fi
    grep -q "cache kernel kernels-community/elsewhere@version=1: kernels-community/elsewhere@111111111111: no build variant fits this machine (strict): khub1-cpu-$OTHER-linux: reject" r.err \
        || fail "strict mapping message: $(cat r.err)"
    # a locked model load with a full cache makes no request
    before=$(wc -l < log)
    timeout 120 "$KHUB" run --model "$MODEL" --prompt hi --max-new-tokens 1 --kernels proj/khub.json \
        --lock proj/khub.lock --explain > r.out 2> r.err || fail "locked run: $(cat r.err)"
    grep -q "^cache: kernels-community/kv-cache@version=1 -> kernels-community/kv-cache commit 333333333333 .*(locked, hashes re-checked)" r.out \
        || fail "locked run explain: $(cat r.out)"
    [ "$(wc -l < log)" = "$before" ] || fail "a locked model load with a full cache reached the server"
    echo "ok   at model load: a khub.json kernel with no variant falls back with the trace, --strict fails; a locked load makes no request"
else
    echo "skip model-load fallback: $MODEL absent (run tools/fetch-model.sh)"
fi

# --- khub sync: this machine's variant, or every platform's ---------------
mkdir multi
echo '{"format":1,"dependencies":{"kernels-community/multi":{"version":1}}}' > multi/khub.json
timeout 60 "$KHUB" lock multi > l.out 2>&1 || fail "lock multi: $(cat l.out)"
grep -q "locked kernels-community/multi v1 -> $C1 (2 variants)" l.out || fail "lock multi: $(cat l.out)"
MV=cache/kernels--kernels-community--multi/khub-variants/$C1
rm -rf cache/kernels--kernels-community--multi
timeout 60 "$KHUB" sync multi > s.out 2>&1 || fail "sync multi: $(cat s.out)"
grep -q "synced kernels-community/multi@$C1: 1 variant verified" s.out || fail "sync: $(cat s.out)"
[ -d "$MV/$V" ] && [ ! -e "$MV/khub1-cpu-$OTHER-linux" ] || fail "sync fetched: $(ls $MV)"
timeout 60 "$KHUB" sync multi --all-variants > s.out 2>&1 || fail "sync --all-variants: $(cat s.out)"
grep -q "synced kernels-community/multi@$C1: 2 variants verified" s.out || fail "all: $(cat s.out)"
[ -d "$MV/khub1-cpu-$OTHER-linux" ] || fail "--all-variants did not fetch $OTHER: $(ls $MV)"
before=$(wc -l < log)
HF_HUB_OFFLINE=1 timeout 60 "$KHUB" sync multi --all-variants > s.out 2>&1 || fail "offline: $(cat s.out)"
[ "$(wc -l < log)" = "$before" ] || fail "a synced copy re-synced with requests"
printf 'X' >> "$MV/khub1-cpu-$OTHER-linux/metadata.json"
if HF_HUB_OFFLINE=1 "$KHUB" sync multi --all-variants > s.out 2>&1; then fail "tampered copy synced"; fi
grep -q "metadata.json has SHA-256" s.out || fail "sync tamper message: $(cat s.out)"
echo "ok   khub sync fetches this machine's variant, --all-variants every platform's; both re-verified"

# --- trust policy at load --------------------------------------------------
# STATUS names the library's status (asserted in the C tests); the CLI
# prints "khub fetch: MESSAGE" as every command does (the status name came
# first before session 18).
expect() { # expect STATUS TEXT ID [args]
    local st=$1 txt=$2; shift 2
    if "$KHUB" fetch "$@" > f.out 2>&1; then fail "$* loaded, expected $st"; fi
    grep -q "^khub fetch: " f.out && grep -q -- "$txt" f.out || fail "$*: $(cat f.out)"
}
expect KHUB_STATUS_UNSIGNED "requires a signature" kernels-community/unsigned@v1
expect KHUB_STATUS_UNSIGNED "requires a signature" kernels-community/unsigned@v1 --allow-unsigned
expect KHUB_STATUS_KEY_UNKNOWN "does not trust for this organisation" kernels-community/bobs@v1
expect KHUB_STATUS_UNSIGNED "opt in with --allow-unsigned" acme/kv@v1
"$KHUB" fetch acme/kv@v1 --allow-unsigned > f.out 2>&1 || fail "opt-in: $(cat f.out)"
grep -q "unsigned, accepted by opt-in" f.out || fail "opt-in trust line: $(cat f.out)"
# another kernel's signed build: the signature verifies, the name does not
expect KHUB_STATUS_NAME_MISMATCH "refusing kernels-community/other-kernel@111111111111: kernels-community/other-kernel: the hub served the signed build of another kernel (metadata.json names kernels-community/kv-cache 1.0.0); refusing it (--allow-name-mismatch loads it anyway)" \
    kernels-community/other-kernel@v1
"$KHUB" fetch kernels-community/other-kernel@v1 --allow-name-mismatch > f.out 2>&1 \
    || fail "--allow-name-mismatch: $(cat f.out)"
grep -q "warning: kernels-community/other-kernel: the hub served the signed build of another kernel (metadata.json names kernels-community/kv-cache 1.0.0); loading it anyway (--allow-name-mismatch)" f.out \
    || fail "name mismatch warning: $(cat f.out)"
printf '{"version":1,"publishers":{"kernels-community":["%s"]},"revoked":["%s"]}' \
    "$ALICE" "$ALICE" > revoked.json
expect KHUB_STATUS_KEY_REVOKED "signed with revoked key" kernels-community/kv-cache@v2 \
    --policy revoked.json
expect KHUB_STATUS_KEY_REVOKED "signed with revoked key" kernels-community/kv-cache \
    --lock proj/khub.lock --policy revoked.json
# a policy with a typo names the file once, then the field
printf '{"version": 1, "revokd": []}' > typo.json
expect KHUB_STATUS_PARSE "^khub fetch: trust policy typo.json: policy: unknown field \"revokd\" (the fields are version, publishers, revoked, allow_unsigned)$" \
    kernels-community/kv-cache@v2 --policy typo.json
"$KHUB" fetch kernels-community/kv-cache@v2 > f.out 2>&1 || fail "v2: $(cat f.out)"
grep -q "^version  2.0.0" f.out || fail "v2 version: $(cat f.out)"
echo "ok   trust at load: signed, unsigned (listed and unlisted org), unknown key, revoked, opt-in; another kernel's signed build refused (NAME_MISMATCH) unless --allow-name-mismatch"

# --- khub.json errors name the field ---------------------------------------
echo '{"format":1,"roles":{"attn":"kernels-community/kv-cache@v1"}}' > bad.json
if "$KHUB" lock proj --kernels bad.json > e.out 2>&1; then fail "bad role accepted"; fi
grep -q "roles.attn: unknown role" e.out || fail "bad role message: $(cat e.out)"
# docs/kernel-mapping.md quotes the version-and-revision error whole: the
# CLI's line ends with the quote (it lacked "; they are mutually exclusive, ...").
mkdir vr
echo '{"format":1,"roles":{"norm":{"cpu":{"repo":"kernels-community/rmsnorm","version":1,
  "revision":"main"}}}}' > vr/khub.json
if "$KHUB" lock vr > e.out 2>&1; then fail "version and revision accepted"; fi
quote=$(grep -o '`khub.json: roles.norm.cpu.repo: both[^`]*`' "$SRC/docs/kernel-mapping.md" | tr -d '`')
[ -n "$quote" ] && [ "$(cat e.out)" = "khub lock: vr/$quote" ] ||
    fail "docs/kernel-mapping.md quotes '$quote'; the CLI says: $(cat e.out)"

# --- the Python library's kernels.lock -------------------------------------
cat > kernels.lock <<JSON
[{"repo_id": "kernels-community/kv-cache", "sha": "$C1",
  "variants": {"torch212-cxx11-cu130-x86_64-linux":
     {"hash": "sha256-00", "hash_type": "git_lfs_concat"}}}]
JSON
mkdir imp
timeout 60 "$KHUB" lock imp --import kernels.lock > i.out 2> i.err || fail "import: $(cat i.err)"
grep -q "not mapped from kernels.lock: kernels-community/kv-cache: variant torch212" i.err \
    || fail "import notes: $(cat i.err)"
grep -q "\"commit\":	\"$C1\"" imp/khub.lock && grep -q "$V" imp/khub.lock \
    || fail "imported lock: $(cat imp/khub.lock)"
echo "ok   khub.json errors name the field; kernels.lock import says what it could not map"
echo "1 passed, 0 failed"
