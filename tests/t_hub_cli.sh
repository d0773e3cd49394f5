#!/usr/bin/env bash
# t_hub_cli.sh: khub serve + resolve/variants/download over loopback, offline
# reuse, and (when huggingface_hub is installed) interop with the official
# client in both directions. Bounded: every step has a timeout.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin hub
# Checks read "$out" with grep -q <<<: a pipe from echo under pipefail fails
# when grep -q exits before echo has written everything (SIGPIPE).

C1=1111111111111111111111111111111111111111
ARCH=$(uname -m); V=khub1-cpu-$ARCH-linux
R=$T/repos/org/demo; D=$R/commits/$C1/build/$V
mkdir -p "$D"
printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' $C1 $C1 > $R/refs.json
printf '# demo\n' > $R/commits/$C1/README.md
printf 'library bytes' > $D/libk.so
SHA=$(sha256sum $D/libk.so | cut -d' ' -f1)
cat > $D/metadata.json <<JSON
{"format":1,"name":"org/demo","version":"1.0.0","major":1,"variant":"$V",
 "abi":{"major":1,"minor":0},"backend":{"type":"cpu","archs":["$ARCH"]},
 "plugins":[{"file":"libk.so","level":"generic","cpu_features":[]}],
 "files":{"libk.so":"$SHA"},"provenance":{"source_commit":"unknown","dirty":false}}
JSON

t_serve "$T/repos" "$T/out" --log "$T/log"
export HF_ENDPOINT=$EP
export KHUB_CACHE=$T/cache HF_TOKEN=hf_test

"$KHUB" resolve --help | grep "usage: khub resolve" > /dev/null || fail "resolve --help"
[ "$(timeout 20 "$KHUB" resolve org/demo@version=1)" = $C1 ] || fail "resolve version=1"
timeout 20 "$KHUB" variants org/demo@v1 | grep "^\* $V" > /dev/null || fail "variants marks $V"
timeout 20 "$KHUB" download org/demo@v1 --quiet || fail "download"
timeout 20 "$KHUB" download org/demo@v1 --json | grep "\"sha256\":\"$SHA\"" > /dev/null || fail "download json"
# What each command's --help says --json and --quiet print.
out=$(timeout 20 "$KHUB" download org/demo@v1 --quiet) || fail "download --quiet"
[ -z "$out" ] || fail "download --quiet printed: $out"
out=$(timeout 20 "$KHUB" resolve org/demo@version=1 --json) || fail "resolve --json"
[ "$out" = "{\"id\":\"org/demo\",\"revision\":\"v1\",\"commit\":\"$C1\"}" ] ||
    fail "resolve --json: $out"
for c in resolve variants download; do "$KHUB" $c --help > "$T/$c.help"; done
grep -qF -- "--json  one object {id, revision, commit}" "$T/resolve.help" || fail "resolve --help: --json"
grep -qF -- "--json  an array of {name, accepted, reason}" "$T/variants.help" || fail "variants --help: --json"
grep -qF -- "--json  one object per file instead: {variant, file, path, sha256}" "$T/download.help" ||
    fail "download --help: --json"
[ "$(cat $KHUB_CACHE/kernels--org--demo/refs/v1)" = $C1 ] || fail "refs/v1 content"
[ "$(wc -c < $KHUB_CACHE/kernels--org--demo/refs/v1)" = 40 ] || fail "refs/v1 has no newline"
# Pinned to a commit with a complete cache: no request even online.
before=$(wc -l < "$T/log")
timeout 20 "$KHUB" download org/demo@$C1 --quiet || fail "pinned download"
timeout 20 "$KHUB" variants org/demo@$C1 > /dev/null || fail "pinned variants"
[ "$(wc -l < "$T/log")" = "$before" ] || fail "a commit-pinned download with a full cache made requests"
out=$(timeout 20 "$KHUB" resolve org/nope@main 2>&1) && fail "missing repo resolved"
grep -q <<<"$out" RepoNotFound || fail "RepoNotFound message: $out"

# One file by path; a missing one leaves .no_exist/<commit>/<path> and is
# then answered without a request.
out=$(timeout 20 "$KHUB" download org/demo@v1 --file README.md) || fail "download --file"
[ "$(cat "${out#README.md }")" = "# demo" ] || fail "download --file content: $out"
out=$(timeout 20 "$KHUB" download org/demo@v1 --file other.txt 2>&1) && fail "missing file downloaded"
grep -q <<<"$out" EntryNotFound || fail "EntryNotFound message: $out"
[ -f "$KHUB_CACHE/kernels--org--demo/.no_exist/$C1/other.txt" ] || fail "no .no_exist marker"
before=$(wc -l < "$T/log")
out=$(timeout 20 "$KHUB" download org/demo@$C1 --file other.txt 2>&1) && fail "marked file downloaded"
grep -q <<<"$out" "other.txt is not in that commit" || fail ".no_exist message: $out"
[ "$(wc -l < "$T/log")" = "$before" ] || fail "a .no_exist marker still made a request"

# --json stays JSON when a hostile hub names a variant with a quote (listed
# and rejected; backslashes and control characters make the whole listing
# refused as unsafe paths, as huggingface_hub refuses them).
C3=3333333333333333333333333333333333333333
mkdir -p "$R/commits/$C3/build/torch\"evil"
printf 'x' > "$R/commits/$C3/build/torch\"evil/f.so"
printf '{"branches":{"main":"%s","v1":"%s","odd":"%s"},"tags":{}}' $C1 $C1 $C3 > $R/refs.json
out=$(timeout 20 "$KHUB" variants org/demo@odd --json) || fail "variants --json (odd name): $out"
echo "$out" | python3 -c '
import json, sys
v = json.load(sys.stdin)
assert v[0]["name"] == "torch\"evil" and not v[0]["accepted"], v' || fail "variants --json: $out"
printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' $C1 $C1 > $R/refs.json

# CUDA variants against this host's driver and GPUs: a stand-in libcuda.so.1
# (tests/fake_cuda, driver version and capabilities from KHUB_FAKE_CUDA).
C4=4444444444444444444444444444444444444444
G=$R/commits/$C4/build/khub1-cu130-$ARCH-linux
mkdir -p "$G" "$R/commits/$C4/build/$V"
printf 'glue' > "$G/k-cuda.so"; printf 'ptx' > "$G/k.sm_80.ptx"; printf 'bin' > "$G/k.sm_90.cubin"
printf 'library bytes' > "$R/commits/$C4/build/$V/libk.so"
sha() { sha256sum "$G/$1" | cut -d' ' -f1; }
cat > "$G/metadata.json" <<JSON
{"format":1,"name":"org/demo","version":"1.0.0","major":1,"variant":"khub1-cu130-$ARCH-linux",
 "abi":{"major":1,"minor":0},"backend":{"type":"cuda","archs":["sm_80","sm_90"]},
 "plugins":[{"file":"k-cuda.so","level":"generic","cpu_features":[]}],
 "artifacts":[{"file":"k.sm_80.ptx","kind":"ptx","sm":80},{"file":"k.sm_90.cubin","kind":"cubin","sm":90}],
 "files":{"k-cuda.so":"$(sha k-cuda.so)","k.sm_80.ptx":"$(sha k.sm_80.ptx)","k.sm_90.cubin":"$(sha k.sm_90.cubin)"},
 "provenance":{"source_commit":"unknown","dirty":false}}
JSON
printf '{"branches":{"main":"%s","v1":"%s","gpu":"%s"},"tags":{}}' $C1 $C1 $C4 > $R/refs.json
gpu_variants() { # KHUB_FAKE_CUDA value ("" = no driver at all)
    if [ -z "$1" ]; then timeout 20 "$KHUB" variants org/demo@gpu
    else LD_LIBRARY_PATH=$KHUB_BUILD/fake-cuda KHUB_FAKE_CUDA=$1 timeout 20 "$KHUB" variants org/demo@gpu
    fi
}
out=$(gpu_variants "") || fail "variants gpu: $out"
grep -q <<<"$out" "khub1-cu130-$ARCH-linux .*reject: needs CUDA 13.0, no CUDA driver" || fail "no driver: $out"
grep -q <<<"$out" "^\* $V" || fail "no driver: the CPU build is best: $out"
out=$(gpu_variants 13000:90) || fail "variants sm_90: $out"
grep -q <<<"$out" "^\* khub1-cu130-$ARCH-linux .*accept: CUDA 13.0 build, driver 13.0, GPU 0 sm_90" \
    || fail "sm_90 GPU: $out"
out=$(gpu_variants 13000:86) || fail "variants sm_86: $out"
grep -q <<<"$out" "accept: CUDA 13.0 build, driver 13.0, GPU 0 sm_86" || fail "sm_86 runs the sm_80 PTX: $out"
out=$(gpu_variants 13000:75,70) || fail "variants sm_75: $out"
grep -q <<<"$out" "reject: no PTX or cubin for GPU 0 sm_75 or the other GPUs" || fail "sm_75: $out"
grep -q <<<"$out" "^\* $V" || fail "sm_75: the CPU build is best: $out"
out=$(gpu_variants 12080:90) || fail "variants driver 12.8: $out"
grep -q <<<"$out" "reject: needs CUDA 13.0, driver supports 12.8" || fail "old driver: $out"
out=$(gpu_variants 13000:) || fail "variants no GPU: $out"
grep -q <<<"$out" "reject: the CUDA driver reports no GPU" || fail "no GPU: $out"
# offline, the cached variant's own files decide
timeout 20 "$KHUB" download org/demo@gpu --variant khub1-cu130-$ARCH-linux --quiet || fail "download the CUDA variant"
out=$(HF_HUB_OFFLINE=1 gpu_variants 13000:90) || fail "offline variants: $out"
grep -q <<<"$out" "^\* khub1-cu130-$ARCH-linux .*GPU 0 sm_90" || fail "offline sm_90: $out"
out=$(HF_HUB_OFFLINE=1 gpu_variants 13000:75) || fail "offline variants sm_75: $out"
grep -q <<<"$out" "reject: no PTX or cubin for GPU 0 sm_75" || fail "offline sm_75: $out"
printf '{"branches":{"main":"%s","v1":"%s"},"tags":{}}' $C1 $C1 > $R/refs.json

# Offline: no request reaches the server, and no socket is even opened
# (tests/no_socket: socket() and socketpair() fail and leave a line). An
# online command under the shim proves that it catches one.
before=$(wc -l < "$T/log")
HF_HUB_OFFLINE=1 timeout 20 "$KHUB" download org/demo@v1 --quiet || fail "offline download"
[ "$(wc -l < "$T/log")" = "$before" ] || fail "offline mode made a request"
NS=$T/sockets.log
no_socket() { # runs the rest with the shim; sanitizer builds allow the preload
    ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0 KHUB_NO_SOCKET_LOG=$NS \
        LD_PRELOAD=$KHUB_BUILD/no-socket/libkhub_no_socket.so timeout 20 "$@"
}
no_socket "$KHUB" resolve org/demo@v1 > /dev/null 2>&1 || true # cached refs/v1 answer
[ -s "$NS" ] || fail "the no-socket shim saw no socket from an online resolve"
rm -f "$NS"
export HF_HUB_OFFLINE=1
[ "$(no_socket "$KHUB" resolve org/demo@version=1)" = $C1 ] || fail "offline resolve"
no_socket "$KHUB" variants org/demo@v1 | grep "^\* $V" > /dev/null || fail "offline variants"
no_socket "$KHUB" download org/demo@v1 --quiet || fail "offline download (shim)"
no_socket "$KHUB" download org/demo@v1 --file README.md > /dev/null || fail "offline --file"
out=$(no_socket "$KHUB" download org/demo@v1 --file never.txt 2>&1) && fail "never.txt offline"
grep -q <<<"$out" "never.txt is not cached and HF_HUB_OFFLINE forbids the network" \
    || fail "offline not-cached message: $out"
out=$(no_socket "$KHUB" resolve org/other@main 2>&1) && fail "org/other offline"
grep -q <<<"$out" "is not cached" || fail "offline unknown repo: $out"
unset HF_HUB_OFFLINE
[ ! -e "$NS" ] || fail "offline commands opened sockets: $(cat "$NS")"

# --all-variants takes every khub variant (here one that does not fit, too).
C6=6666666666666666666666666666666666666666
mkdir -p "$R/commits/$C6/build"
cp -r "$D" "$G" "$R/commits/$C6/build/"
out=$(timeout 20 "$KHUB" download org/demo@$C6 --all-variants --json 2>&1) || fail "--all-variants: $out"
grep -q <<<"$out" "\"variant\":\"$V\",\"file\":\"libk.so\"" || fail "--all-variants CPU: $out"
grep -q <<<"$out" "\"variant\":\"khub1-cu130-$ARCH-linux\",\"file\":\"k.sm_80.ptx\"" \
    || fail "--all-variants CUDA: $out"
C5=5555555555555555555555555555555555555555
mkdir -p "$R/commits/$C5/build/torch28-cxx11-cpu-$ARCH-linux"
printf 'x' > "$R/commits/$C5/build/torch28-cxx11-cpu-$ARCH-linux/f.so"
out=$(timeout 20 "$KHUB" download org/demo@$C5 --all-variants 2>&1) && fail "no khub variant: $out"
grep -q <<<"$out" "has no khub variant at 555555555555" || fail "--all-variants, none: $out"

# The progress bar: on a terminal (script gives the command one), not with
# --quiet, not when stderr is not a terminal.
if command -v script > /dev/null; then
    export KHUB_CACHE=$T/cache-tty
    out=$(timeout 30 script -qec "$KHUB download org/demo@v1 --file README.md" /dev/null) \
        || fail "download on a terminal: $out"
    grep -q <<<"$out" "README.md .* B / .* ETA" || fail "no progress bar on a terminal: $out"
    rm -rf "$KHUB_CACHE"
    out=$(timeout 30 script -qec "$KHUB download org/demo@v1 --file README.md --quiet" /dev/null)
    ! grep -q <<<"$out" "ETA" || fail "--quiet still drew the bar: $out"
    [ -z "$out" ] || fail "--quiet printed: $out"
    rm -rf "$KHUB_CACHE"
    timeout 20 "$KHUB" download org/demo@v1 > /dev/null 2> "$T/err" || fail "download to a pipe"
    [ ! -s "$T/err" ] || fail "a bar without a terminal: $(cat "$T/err")"
    export KHUB_CACHE=$T/cache
else
    echo "skip the progress bar checks: no script(1)"
fi

# khub serve listens on loopback only (and refuses a port that is no number).
PORT=${HF_ENDPOINT##*:}
HEXPORT=$(printf '%04X' "$PORT")
grep -q " 0100007F:$HEXPORT 00000000:0000 0A " /proc/net/tcp || fail "serve is not on 127.0.0.1:$PORT"
! grep -q " 00000000:$HEXPORT 00000000:0000 0A " /proc/net/tcp || fail "serve listens on 0.0.0.0"
out=$("$KHUB" serve "$T/repos" --port 70000 2>&1) && fail "--port 70000 accepted"
grep -q <<<"$out" "port 70000 is not a port number (0-65535)" || fail "--port message: $out"
out=$("$KHUB" serve "$T/repos" --port abc 2>&1) && fail "--port abc accepted"
grep -q <<<"$out" "port abc is not a port number" || fail "--port abc message: $out"
P=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$KHUB" serve "$T/repos" --port "$P" --log "$T/log2" > "$T/out2" &
SRV2=$!
for _ in $(seq 50); do grep -q http "$T/out2" 2>/dev/null && break; sleep 0.1; done
out=$(cat "$T/out2")
HF_ENDPOINT=http://127.0.0.1:$P timeout 20 "$KHUB" resolve org/demo@v1 > /dev/null || true
kill $SRV2; wait $SRV2 2>/dev/null || true
grep -q <<<"$out" "on http://127.0.0.1:$P\$" || fail "--port $P: $out"
grep -q "GET /api/kernels/org/demo/revision/v1 " "$T/log2" || fail "nothing served on --port $P"

if ! python3 -c 'import huggingface_hub' 2>/dev/null; then
    echo "skip interop: huggingface_hub is not installed (pip install huggingface_hub)"
    exit 0
fi
export HF_HUB_DISABLE_XET=1 HF_HUB_CACHE=$T/pycache
timeout 60 python3 - "$V" <<'PY' || fail "huggingface_hub against khub serve"
import os, sys
from huggingface_hub import hf_hub_download, snapshot_download, list_repo_refs
v = sys.argv[1]
refs = list_repo_refs("org/demo", repo_type="kernel")
assert {b.name for b in refs.branches} == {"main", "v1"}, refs
p = hf_hub_download("org/demo", "README.md", repo_type="kernel", revision="v1")
assert open(p).read() == "# demo\n"
d = snapshot_download("org/demo", repo_type="kernel", revision="v1",
                      allow_patterns=[f"build/{v}/*"])
assert os.path.exists(os.path.join(d, "build", v, "libk.so"))
PY
# The official client, offline, reads the cache khub wrote (with the variant's
# pattern, as the kernels library asks: khub's trees/<commit>.json lists the
# whole repo, so an unfiltered offline snapshot is rightly "incomplete") ...
HF_HUB_OFFLINE=1 HF_HUB_CACHE=$KHUB_CACHE timeout 60 python3 - "$V" <<'PY' || fail "python reads khub cache"
import sys
from huggingface_hub import snapshot_download
d = snapshot_download("org/demo", repo_type="kernel", revision="v1",
                      allow_patterns=[f"build/{sys.argv[1]}/*"])
assert open(d + f"/build/{sys.argv[1]}/libk.so").read() == "library bytes"
PY
# .no_exist both ways: khub's marker is the official client's "cached: does
# not exist", and the official client's marker is khub's.
HF_HUB_OFFLINE=1 HF_HUB_CACHE=$KHUB_CACHE timeout 60 python3 - "$C1" <<'PY' || fail "python reads khub's .no_exist"
import sys
from huggingface_hub import try_to_load_from_cache, _CACHED_NO_EXIST
r = try_to_load_from_cache("org/demo", "other.txt", revision=sys.argv[1], repo_type="kernel")
assert r is _CACHED_NO_EXIST, r
PY
timeout 60 python3 - <<'PY' || fail "huggingface_hub writes .no_exist"
from huggingface_hub import hf_hub_download
try:
    hf_hub_download("org/demo", "absent.txt", repo_type="kernel", revision="v1")
    raise SystemExit("absent.txt downloaded")
except Exception as e:
    assert "EntryNotFound" in type(e).__name__, repr(e)
PY
[ -f "$T/pycache/kernels--org--demo/.no_exist/$C1/absent.txt" ] || fail "python wrote no .no_exist"
out=$(HF_HUB_OFFLINE=1 KHUB_CACHE=$T/pycache timeout 20 "$KHUB" download org/demo@v1 \
      --file absent.txt 2>&1) && fail "khub downloaded a file python marked absent"
grep -q <<<"$out" "absent.txt is not in that commit" || fail "khub reads python's .no_exist: $out"
# ... and khub, offline, reads the cache the official client wrote.
HF_HUB_OFFLINE=1 KHUB_CACHE=$T/pycache timeout 20 "$KHUB" download org/demo@v1 --quiet \
    || fail "khub reads the huggingface_hub cache"
echo "t_hub_cli: ok"
