#!/usr/bin/env bash
# t_publish.sh: `khub build` a tiny kernel, `khub publish` it to `khub serve
# --token` on loopback, download it back and compare digests; republish a
# changed v1 (a stale file is deleted), then v2; auth failures; and, when
# huggingface_hub is installed, its upload calls against `khub serve` (a
# model repo, and a kernel repo holding a khub build that khub then downloads).
# Also `khub cache ls|verify|prune` on the cache these steps made.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin pub
INC=$SRC/abi

# A tiny kernel source tree (one CPU level keeps the build short).
K=$T/kernel
mkdir -p "$K"
write_kernel() { # $1 = major, $2 = version
    cat > "$K/kernel.json" <<JSON
{"repo": "acme/norm", "major": $1, "version": "$2",
 "ops": [{"name": "rms_norm", "kind": "norm"}], "sources": {"cpu": ["norm.c"]},
 "variants": {"cpu": [{"level": "generic"}]}}
JSON
    cat > "$K/norm.c" <<C
#include <khub/khub_plugin.h>
static khub_status init(const khub_host_api *h, khub_plugin_desc *o, char *e, size_t n)
{ (void)h; (void)e; (void)n; khub_plugin_desc d = {KHUB_STRUCT_INIT(khub_plugin_desc),
  .id = "acme/norm", .version = "$2"}; return khub_plugin_desc_put(o, &d); }
KHUB_PLUGIN_DEFINE(init, "acme/norm", "$2")
C
    rm -rf "$K/build"
    timeout 120 "$KHUB" build "$K" --quiet > /dev/null || fail "khub build $2"
}
write_kernel 1 1.0.0
V=$(ls "$K/build" | grep -v '\.tar\.gz$' | head -1)
[ -f "$K/build/$V/metadata.json" ] || fail "khub build made no variant"
# A variant of another family that the next build will not have (stale then).
mkdir -p "$K/build/torch28-cxx11-cpu-x86_64-linux"
echo '{}' > "$K/build/torch28-cxx11-cpu-x86_64-linux/metadata.json"

mkdir -p "$T/repos"
t_serve "$T/repos" "$T/out" --token hf_write --log "$T/log"
export HF_ENDPOINT=$EP KHUB_CACHE=$T/cache
unset HF_TOKEN HF_TOKEN_PATH HUGGING_FACE_HUB_TOKEN
export HF_HOME=$T/hfhome

# Auth: no token, then a wrong one.
out=$(timeout 30 "$KHUB" publish "$K" 2>&1) && fail "publish without a token succeeded"
grep -q <<<"$out" "token missing" || fail "no-token message: $out"
out=$(HF_TOKEN=hf_wrong timeout 30 "$KHUB" publish "$K" 2>&1) && fail "wrong token succeeded"
grep -q <<<"$out" "HTTP 401: token rejected or it lacks write access" || fail "401 message: $out"
[ ! -d "$T/repos/acme/norm" ] || fail "a rejected publish created the repo"
# A tree that is no kernel: the command's prefix once, as khub build says it
# ("khub publish: publish: ..." before session 18).
mkdir -p "$T/notakernel"
out=$(timeout 30 "$KHUB" publish "$T/notakernel" --token hf_write 2>&1) && fail "publish of no kernel"
want="khub publish: $T/notakernel/kernel.json: cannot open: No such file or directory (is $T/notakernel a kernel source dir?)"
[ "$out" = "$want" ] || fail "no-kernel message: $out"

# Publish v1 and download it back.
export HF_TOKEN=hf_write
C1=$(timeout 60 "$KHUB" publish "$K" --quiet)
[[ $C1 =~ ^[0-9a-f]{40}$ ]] || fail "publish printed no commit: $C1"
grep -q "PUT /lfs-upload/.* auth=no" "$T/log" || fail "LFS PUT went out with credentials"
[ "$(timeout 20 "$KHUB" resolve acme/norm@version=1)" = "$C1" ] || fail "v1 is not the commit"
timeout 30 "$KHUB" download acme/norm@v1 --variant "$V" --quiet || fail "download v1"
for f in "$K/build/$V"/*; do
    b=$(basename "$f")
    got=$(find "$KHUB_CACHE" -path "*$C1*/$V/$b" | head -1)
    [ -n "$got" ] || fail "downloaded variant lacks $b"
    cmp -s "$f" "$got" || fail "$b differs after the round trip"
done

# Publishing the same build again changes nothing.
out=$(timeout 60 "$KHUB" publish "$K" --json)
grep -q <<<"$out" '"changed":false' || fail "an unchanged republish committed: $out"
grep -q <<<"$out" "\"commit\":\"$C1\"" || fail "unchanged republish commit: $out"

# A changed v1: a new commit on v1, notes.txt deleted.
write_kernel 1 1.0.1
out=$(timeout 60 "$KHUB" publish "$K" --json)
C2=$(echo "$out" | grep -o '"commit":"[0-9a-f]*"' | cut -d'"' -f4)
[ "$C2" != "$C1" ] || fail "changed v1 made no commit"
grep -q <<<"$out" '"deleted":1' || fail "stale file not deleted: $out"
OLD=build/torch28-cxx11-cpu-x86_64-linux/metadata.json
[ ! -e "$T/repos/acme/norm/commits/$C2/$OLD" ] || fail "the stale file is still in $C2"
[ -e "$T/repos/acme/norm/commits/$C1/$OLD" ] || fail "the old commit was modified"

# v2 goes to its own branch; v1 stays.
write_kernel 2 2.0.0
C3=$(timeout 60 "$KHUB" publish "$K" --quiet)
[ "$(timeout 20 "$KHUB" resolve acme/norm@version=2)" = "$C3" ] || fail "v2 branch"
[ "$(timeout 20 "$KHUB" resolve acme/norm@version=1)" = "$C2" ] || fail "v1 moved with v2"
timeout 30 "$KHUB" download acme/norm@version=2 --variant "$V" --quiet || fail "download v2"

# The cache these downloads made: ls, verify, a corrupt blob, prune.
timeout 20 "$KHUB" cache ls | grep "acme/norm" > /dev/null || fail "cache ls lists no acme/norm"
timeout 20 "$KHUB" cache ls --json | python3 -c 'import json,sys; json.load(sys.stdin)' \
    || fail "cache ls --json is not JSON"
timeout 60 "$KHUB" cache verify acme/norm > /dev/null || fail "cache verify of a good cache"
B=$(ls "$KHUB_CACHE"/kernels--acme--norm/blobs | head -1)
cp "$KHUB_CACHE/kernels--acme--norm/blobs/$B" "$T/blob.bak"
t_flip_byte "$KHUB_CACHE/kernels--acme--norm/blobs/$B" 0
out=$(timeout 60 "$KHUB" cache verify 2>&1) && fail "cache verify missed a corrupt blob"
grep -q <<<"$out" "corrupt .*$B" || fail "cache verify output: $out"
out=$(timeout 60 "$KHUB" cache verify --json 2>/dev/null) && fail "verify --json missed it"
python3 -c 'import json, sys
j = json.loads(sys.argv[1])
assert j["corrupt"] == 1 and j["checked"] >= 2, j
assert j["items"][0]["kind"] == "corrupt" and j["items"][0]["path"].endswith(sys.argv[2]), j' \
    "$out" "$B" || fail "cache verify --json: $out"
cp "$T/blob.bak" "$KHUB_CACHE/kernels--acme--norm/blobs/$B"
rm "$KHUB_CACHE"/kernels--acme--norm/refs/v1   # the v1 snapshots become detached
out=$(timeout 20 "$KHUB" cache prune --dry-run)
grep -q <<<"$out" "would remove snapshot" || fail "prune --dry-run: $out"
out=$(timeout 20 "$KHUB" cache prune --dry-run --json)
python3 -c 'import json, sys
j = json.loads(sys.argv[1])
assert j["dry_run"] is True and j["freed"] > 0, j
assert "snapshot" in {i["kind"] for i in j["items"]}, j' "$out" || fail "prune --dry-run --json: $out"
[ -n "$(ls "$KHUB_CACHE"/kernels--acme--norm/snapshots)" ] || fail "dry run removed something"
timeout 20 "$KHUB" cache prune | grep "^freed" > /dev/null || fail "prune"
[ "$(ls "$KHUB_CACHE"/kernels--acme--norm/snapshots)" = "$C3" ] || fail "prune kept the wrong snapshots"
timeout 60 "$KHUB" cache verify > /dev/null || fail "verify after prune"
HF_HUB_OFFLINE=1 timeout 30 "$KHUB" download acme/norm@version=2 --variant "$V" --quiet \
    || fail "v2 is not usable offline after prune"

if ! python3 -c 'import huggingface_hub' 2>/dev/null; then
    echo "skip interop: huggingface_hub is not installed (pip install huggingface_hub)"
    echo "t_publish: ok"
    exit 0
fi
export HF_HUB_DISABLE_XET=1 HF_HUB_CACHE=$T/pycache HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1
timeout 120 python3 - <<'PY' || fail "huggingface_hub uploads to khub serve"
import os
from huggingface_hub import HfApi, CommitOperationAdd, hf_hub_download
api = HfApi(endpoint=os.environ["HF_ENDPOINT"], token="hf_write")
url = api.create_repo("pyorg/model", repo_type="model")
api.create_repo("pyorg/model", repo_type="model", exist_ok=True)   # 409 with url
big = bytes(range(256)) * 4096                                     # binary: LFS
info = api.create_commit("pyorg/model", repo_type="model", commit_message="add files",
                         operations=[CommitOperationAdd("README.md", b"# hello\n"),
                                     CommitOperationAdd("weights.bin", big),
                                     CommitOperationAdd("cfg/config.json", b'{"a": 1}')])
assert len(info.oid) == 40, info
api.create_branch("pyorg/model", repo_type="model", branch="dev")
api.create_tag("pyorg/model", repo_type="model", tag="v0.1", revision=info.oid)
refs = api.list_repo_refs("pyorg/model", repo_type="model")
assert {b.name for b in refs.branches} == {"main", "dev"}, refs
assert [t.name for t in refs.tags] == ["v0.1"], refs
for rev in ("main", "v0.1", "dev"):
    assert open(hf_hub_download("pyorg/model", "weights.bin", revision=rev), "rb").read() == big
assert open(hf_hub_download("pyorg/model", "cfg/config.json")).read() == '{"a": 1}'
try:
    HfApi(endpoint=os.environ["HF_ENDPOINT"], token="nope").create_branch(
        "pyorg/model", repo_type="model", branch="x")
    raise SystemExit("a wrong token created a branch")
except Exception as e:
    assert "401" in str(e), e
PY
# The official client writes a kernel repo (repo_type "kernel": create,
# preupload, LFS batch + PUT for the .so, the NDJSON commit, branch v2) with
# the files of a khub build; khub resolves, downloads and verifies it.
OID=$(timeout 120 python3 - "$K/build" "$V" <<'PY'
import os, sys
from huggingface_hub import HfApi, CommitOperationAdd
build, v = sys.argv[1], sys.argv[2]
api = HfApi(endpoint=os.environ["HF_ENDPOINT"], token="hf_write")
assert api.create_repo("pyorg/norm", repo_type="kernel").endswith("/kernels/pyorg/norm")
ops = [CommitOperationAdd(f"build/{v}/{f}", os.path.join(build, v, f))
       for f in sorted(os.listdir(os.path.join(build, v)))]
ops.append(CommitOperationAdd(f"build/{v}.tar.gz", os.path.join(build, v + ".tar.gz")))
info = api.create_commit("pyorg/norm", repo_type="kernel", commit_message="v2", operations=ops)
api.create_branch("pyorg/norm", repo_type="kernel", branch="v2", revision=info.oid)
refs = api.list_repo_refs("pyorg/norm", repo_type="kernel")
assert {b.name: b.target_commit for b in refs.branches}["v2"] == info.oid, refs
print(info.oid)
PY
) || fail "huggingface_hub writes a kernel repo"
grep -q "POST /kernels/pyorg/norm.git/info/lfs/objects/batch" "$T/log" || fail "no LFS batch from the client"
[ "$(timeout 20 "$KHUB" resolve pyorg/norm@version=2)" = "$OID" ] || fail "khub resolve of the client's v2"
timeout 30 "$KHUB" download pyorg/norm@version=2 --variant "$V" --quiet || fail "download the client's kernel"
for f in "$K/build/$V"/*; do
    got=$(find "$KHUB_CACHE" -path "*kernels--pyorg--norm*/$V/$(basename "$f")" | head -1)
    [ -n "$got" ] && cmp -s "$f" "$got" || fail "$(basename "$f") differs after the client's upload"
done

# khub reads the cache the official client wrote.
timeout 60 "$KHUB" cache verify --cache "$T/pycache" > /dev/null || fail "verify the python cache"
timeout 20 "$KHUB" cache ls --cache "$T/pycache" | grep "pyorg/model" > /dev/null || fail "ls python cache"
rm "$T"/pycache/models--pyorg--model/refs/*
timeout 20 "$KHUB" cache prune --cache "$T/pycache" > /dev/null || fail "prune the python cache"
[ -z "$(ls "$T"/pycache/models--pyorg--model/blobs)" ] || fail "prune left python blobs"
echo "t_publish: ok"
