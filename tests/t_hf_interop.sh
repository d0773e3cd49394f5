#!/usr/bin/env bash
# t_hf_interop: Hugging Face interop of `khub serve` and the shared cache,
# measured with the real clients (issue 11 item 4).
#
#  1. the protocol with curl: the organisation overview (kernels' publisher
#     check), full ref names as revisions, 401 for a token the server does
#     not accept (reads too), whoami-v2, repo listings by author, commit
#     history, Content-Type, suffix and multi-range requests, and a tree
#     page's Link keeping the request's parameters;
#  2. huggingface_hub (when installed): whoami, list_models(author=),
#     get_organization_overview, an LFS upload of a file no LFS glob names
#     served back as LFS (tree, ETag, X-Linked-Size), list_repo_commits;
#  3. the kernels library 0.17 (when installed; no torch: the test kernel is
#     a pure-Python torch-universal variant, which kernels accepts without
#     torch): get_kernel (publisher check included), `kernels versions`,
#     `kernels lock`, `kernels download`, and the shared cache both ways:
#     kernels offline from a cache khub filled, khub offline from a cache
#     kernels filled.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin hf-interop

C1=1111111111111111111111111111111111111111
C2=2222222222222222222222222222222222222222
TOKEN=sekrit-token
R=$T/repos

# A kernel repo as kernel-builder publishes one: build/torch-universal/
# with metadata.json (the fields kernels 0.17 requires) and the package.
mkrelu() { # commit version
    local d=$R/acme/relu/commits/$1
    mkdir -p "$d/build/torch-universal/relu"
    printf '# relu\n' > "$d/README.md"
    cat > "$d/build/torch-universal/metadata.json" << EOF
{"id": "_relu_universal_$2", "name": "relu", "version": $2, "license": "Apache-2.0",
 "python-depends": [], "backend": {"type": "cpu"}}
EOF
    cat > "$d/build/torch-universal/relu/__init__.py" << EOF
VERSION = $2
def relu(xs):
    return [x if x > 0 else 0 for x in xs]
EOF
}
mkdir -p "$R/acme/relu" "$R/other/relu"
mkrelu $C1 1
mkrelu $C2 2
printf '{"branches":{"main":"%s","v1":"%s","v2":"%s"},"tags":{"v1.0.0":"%s"}}' \
    $C1 $C1 $C2 $C1 > "$R/acme/relu/refs.json"
printf '{"trustedKernelPublisher": true, "fullname": "Acme kernels"}' > "$R/acme/.org.json"
cp -r "$R/acme/relu/commits" "$R/acme/relu/refs.json" "$R/other/relu/"
for i in 0 1 2 3 4; do printf 'p\n' > "$R/acme/relu/commits/$C1/page$i.md"; done

t_serve "$R" "$T/serve.out" --token "$TOKEN" --page-size 2 --log "$T/log"
AUTH="Authorization: Bearer $TOKEN"

# status code and headers of one request: hdr METHOD URL [curl args...]
hdr() {
    local m=$1 u=$2
    shift 2
    curl -s -o "$T/body" -D "$T/hdr" -X "$m" "$@" "$EP$u" || true
    tr -d '\r' < "$T/hdr" > "$T/hdr.txt"
    head -n 1 "$T/hdr.txt" | cut -d' ' -f2
}
header() { grep -i "^$1:" "$T/hdr.txt" | head -n 1 | cut -d' ' -f2- || true; }

# ---- 1. the protocol ------------------------------------------------------
[ "$(hdr GET /api/organizations/acme/overview)" = 200 ] || fail "overview of acme: $(cat "$T/body")"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["name"]=="acme" and j["trustedKernelPublisher"] is True and j["fullname"]=="Acme kernels", j' "$T/body" \
    || fail "acme overview: $(cat "$T/body")"
[ "$(hdr GET /api/organizations/other/overview)" = 200 ] || fail "overview of other"
grep -q '"trustedKernelPublisher":false' "$T/body" || fail "other is trusted: $(cat "$T/body")"
[ "$(hdr GET /api/organizations/nobody/overview)" = 404 ] || fail "overview of a missing org"

for rev in refs%2Fheads%2Fv2 refs%2Ftags%2Fv1.0.0; do
    [ "$(hdr GET /api/kernels/acme/relu/revision/$rev)" = 200 ] || fail "revision $rev: $(cat "$T/body")"
done
grep -q "\"sha\":\"$C1\"" "$T/body" || fail "refs/tags/v1.0.0 is not C1: $(cat "$T/body")"
[ "$(hdr GET /api/kernels/acme/relu/tree/refs%2Fheads%2Fv1/build)" = 200 ] || fail "tree at refs/heads/v1"
[ "$(hdr GET /api/kernels/acme/relu/revision/refs%2Fheads%2Fv1.0.0)" = 404 ] \
    || fail "refs/heads/ named a tag"
[ "$(header X-Error-Code)" = RevisionNotFound ] || fail "refs/heads/v1.0.0: $(cat "$T/hdr.txt")"

# reads: no token is fine, the right one too, any other is 401 (as on the Hub)
[ "$(hdr GET /api/kernels/acme/relu/refs)" = 200 ] || fail "anonymous read"
[ "$(hdr GET /api/kernels/acme/relu/refs -H "$AUTH")" = 200 ] || fail "read with the token"
[ "$(hdr GET /api/kernels/acme/relu/refs -H 'Authorization: Bearer wrong')" = 401 ] \
    || fail "read with a wrong token answered $(head -n 1 "$T/hdr.txt")"
grep -q "Invalid credentials" "$T/body" || fail "401 body: $(cat "$T/body")"
[ "$(hdr HEAD /kernels/acme/relu/resolve/v1/README.md -H 'Authorization: Bearer wrong' -I)" = 401 ] \
    || fail "HEAD with a wrong token"

[ "$(hdr GET /api/whoami-v2)" = 401 ] || fail "whoami-v2 without a token"
[ "$(hdr GET /api/whoami-v2 -H "$AUTH")" = 200 ] || fail "whoami-v2: $(cat "$T/body")"
grep -q '"name":"khub"' "$T/body" && grep -q '"name":"acme"' "$T/body" || fail "whoami: $(cat "$T/body")"

[ "$(hdr GET '/api/models?author=acme')" = 200 ] || fail "list by author"
[ "$(python3 -c 'import json,sys; print(" ".join(m["id"] for m in json.load(open(sys.argv[1]))))' "$T/body")" = acme/relu ] \
    || fail "models by acme: $(cat "$T/body")"
[ "$(hdr GET '/api/kernels?search=relu')" = 200 ] || fail "kernels by search"
grep -q '"id":"other/relu"' "$T/body" || fail "search: $(cat "$T/body")"
[ "$(hdr GET /api/kernels/acme/relu/commits/v2)" = 200 ] || fail "commits/v2"
grep -q "\"id\":\"$C2\"" "$T/body" || fail "commits: $(cat "$T/body")"

# file answers carry a Content-Type
hdr GET /kernels/acme/relu/resolve/v1/build/torch-universal/metadata.json > /dev/null
[ "$(header Content-Type)" = application/json ] || fail "Content-Type: $(cat "$T/hdr.txt")"
# suffix range: the last 5 bytes; a zero suffix is unsatisfiable; several
# ranges get the whole file (200), never the first range alone
[ "$(hdr GET /kernels/acme/relu/resolve/v1/README.md -H 'Range: bytes=-5')" = 206 ] \
    || fail "suffix range: $(head -n 1 "$T/hdr.txt")"
[ "$(header Content-Range)" = "bytes 2-6/7" ] || fail "suffix Content-Range: $(cat "$T/hdr.txt")"
[ "$(cat "$T/body")" = relu ] || fail "suffix body: $(od -c "$T/body")"
[ "$(hdr GET /kernels/acme/relu/resolve/v1/README.md -H 'Range: bytes=-100')" = 206 ] || fail "long suffix"
[ "$(header Content-Range)" = "bytes 0-6/7" ] || fail "long suffix: $(cat "$T/hdr.txt")"
[ "$(hdr GET /kernels/acme/relu/resolve/v1/README.md -H 'Range: bytes=-0')" = 416 ] || fail "bytes=-0"
[ "$(hdr GET /kernels/acme/relu/resolve/v1/README.md -H 'Range: bytes=0-1,4-5')" = 200 ] \
    || fail "multi-range answered $(head -n 1 "$T/hdr.txt")"
[ "$(cat "$T/body")" = "# relu" ] || fail "multi-range body"
[ -z "$(header Content-Range)" ] || fail "multi-range has a Content-Range"

# a tree page's next link keeps the request's parameters, cursor replaced
hdr GET '/api/kernels/acme/relu/tree/v1?recursive=true&expand=true&cursor=0' > /dev/null
link=$(header Link)
grep -q <<< "$link" "recursive=true&expand=true&cursor=2>" || fail "Link: $link"

# ---- 2. huggingface_hub ---------------------------------------------------
if ! python3 -c 'import huggingface_hub' 2> /dev/null; then
    t_skip "huggingface_hub is not installed (tools/install-test-deps.sh)"
fi
export HF_ENDPOINT=$EP HF_HUB_DISABLE_XET=1 HF_TOKEN=$TOKEN HF_HUB_CACHE=$T/pycache
export HF_HUB_DISABLE_TELEMETRY=1
timeout 120 python3 - << 'PY' || fail "huggingface_hub against khub serve"
import io, os
from huggingface_hub import HfApi, CommitOperationAdd, hf_hub_download
api = HfApi()
assert api.whoami()["name"] == "khub"
assert [m.id for m in api.list_models(author="acme")] == ["acme/relu"]
org = api.get_organization_overview("acme")
assert org.name == "acme" and org.trustedKernelPublisher is True, vars(org)
# an invalid token on a read is refused, as the Hub refuses it
try:
    HfApi(token="wrong").list_repo_refs("acme/relu", repo_type="kernel")
    raise SystemExit("a wrong token was accepted")
except Exception as e:
    assert "401" in str(e), repr(e)
# an LFS upload of a name no LFS glob covers (binary: preupload says lfs)
api.create_repo("acme/data", exist_ok=True)
blob = bytes(range(256)) * 40
api.create_commit("acme/data", operations=[CommitOperationAdd("data.dat", io.BytesIO(blob))],
                  commit_message="add data")
(f,) = [e for e in api.list_repo_tree("acme/data") if e.path == "data.dat"]
assert f.lfs is not None and f.lfs.size == len(blob), f
p = hf_hub_download("acme/data", "data.dat")
assert open(p, "rb").read() == blob
assert os.path.basename(os.path.realpath(p)) == f.lfs.sha256, p  # blob named by the sha256
titles = [c.title for c in api.list_repo_commits("acme/data")]
assert titles[0] == "add data" and len(titles) == 2, titles
PY
out=$(curl -s -I -H "$AUTH" "$EP/acme/data/resolve/main/data.dat" | tr -d '\r')
grep -qi "^x-linked-size: 10240" <<< "$out" || fail "LFS upload served as a regular file: $out"

# ---- 3. the kernels library ---------------------------------------------
if ! python3 -c 'import kernels' 2> /dev/null; then
    t_skip "the kernels library is not installed (tools/install-test-deps.sh)"
fi
# kernels 0.17.2 with HF_HUB_DISABLE_TELEMETRY=1 builds the User-Agent
# "kernels/0.17.2; hf_hub/2.4.0; python/3.11.7; " that httpx refuses (a
# trailing space), whatever the server: the kernels library's bug, not ours
unset HF_HUB_DISABLE_TELEMETRY
export HF_HUB_CACHE=$T/kcache
KCLI=(python3 -c 'import sys; from kernels.cli import main; sys.argv[0] = "kernels"; main()')
timeout 120 python3 - << 'PY' || fail "kernels.get_kernel against khub serve"
from kernels import get_kernel
relu = get_kernel("acme/relu", version=1)
assert relu.VERSION == 1 and relu.relu([-1, 2]) == [0, 2]
assert get_kernel("acme/relu", version=2).VERSION == 2
try:
    get_kernel("other/relu", version=1)
    raise SystemExit("an untrusted publisher was loaded")
except ValueError as e:
    assert "not from a trusted publisher" in str(e), e
assert get_kernel("other/relu", version=1, trust_remote_code=True).VERSION == 1
PY
# write: huggingface_hub publishes a kernel repo (branch v1, an LFS file
# among the variant's), which kernels then loads
timeout 120 python3 - << 'PY' || fail "huggingface_hub publishes, kernels loads"
import io, json
from huggingface_hub import HfApi, CommitOperationAdd
from kernels import get_kernel
api = HfApi()
api.create_repo("acme/gelu", repo_type="kernel", exist_ok=True)
api.create_branch("acme/gelu", repo_type="kernel", branch="v1")
meta = {"id": "_gelu_universal_1", "name": "gelu", "version": 1, "license": "MIT",
        "python-depends": [], "backend": {"type": "cpu"}}
v = "build/torch-universal/"
ops = [CommitOperationAdd(v + "metadata.json", io.BytesIO(json.dumps(meta).encode())),
       CommitOperationAdd(v + "gelu/__init__.py", io.BytesIO(b"NAME = 'gelu'\n")),
       CommitOperationAdd(v + "gelu/table.bin", io.BytesIO(bytes(range(256))))]
api.create_commit("acme/gelu", repo_type="kernel", revision="v1", operations=ops,
                  commit_message="gelu v1")
k = get_kernel("acme/gelu", version=1)
assert k.NAME == "gelu", k
PY
out=$(timeout 120 "${KCLI[@]}" versions acme/relu 2>&1) || fail "kernels versions: $out"
grep -q "Version 1:" <<< "$out" && grep -q "Version 2:" <<< "$out" || fail "versions: $out"
grep -q "torch-universal" <<< "$out" || fail "versions lists no variant: $out"
mkdir -p "$T/proj"
printf '[project]\nname = "proj"\nversion = "0.1"\n[tool.kernels.dependencies]\n"acme/relu" = 1\n' \
    > "$T/proj/pyproject.toml"
out=$(timeout 120 "${KCLI[@]}" lock "$T/proj" 2>&1) || fail "kernels lock: $out"
grep -q "$C1" "$T/proj/kernels.lock" || fail "kernels.lock: $(cat "$T/proj/kernels.lock")"
rm -rf "$T/kcache"
out=$(timeout 120 "${KCLI[@]}" download "$T/proj" 2>&1) || fail "kernels download: $out"
[ -f "$T/kcache/kernels--acme--relu/snapshots/$C1/build/torch-universal/relu/__init__.py" ] \
    || fail "kernels download left no snapshot: $out"

# shared cache, kernels -> khub: khub offline reads what kernels downloaded
# (by the commit kernels.lock pins: kernels writes no refs/v1)
HF_HUB_OFFLINE=1 KHUB_CACHE=$T/kcache timeout 20 "$KHUB" download "acme/relu@$C1" --quiet \
    --file build/torch-universal/relu/__init__.py > /dev/null \
    || fail "khub offline does not read the kernels library's cache"

# shared cache, khub -> kernels: kernels offline loads what khub downloaded
# (every file of v1, so the snapshot is whole), the cache named with "~"
# in HF_HUB_CACHE, expanded by both
mkdir -p "$T/home"
for f in README.md build/torch-universal/metadata.json build/torch-universal/relu/__init__.py \
    page0.md page1.md page2.md page3.md page4.md; do
    HOME=$T/home HF_HUB_CACHE='~/shared' KHUB_CACHE= timeout 20 "$KHUB" download acme/relu@v1 \
        --quiet --file "$f" > /dev/null || fail "khub download $f"
done
[ -d "$T/home/shared/kernels--acme--relu" ] || fail "khub did not expand ~ in HF_HUB_CACHE"
HOME=$T/home HF_HUB_CACHE='~/shared' HF_HUB_OFFLINE=1 timeout 60 python3 - << 'PY' \
    || fail "kernels offline does not load from khub's cache"
from kernels import get_kernel
assert get_kernel("acme/relu", version=1).VERSION == 1
PY
echo "t_hf_interop: ok"
