#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what khub needs, builds it,
# then shows the whole path of a kernel named by Hub ID (docs/demo.md):
#   1. the in-tree kernels (kernels-src/) are built, gated, self-tested
#      against khub/ref-cpu and signed by a publisher key;
#   2. they are published to a hub of our own (`khub serve` on loopback);
#   3. SmolLM2-135M-Instruct (GGUF Q4_1) generates with
#      --attn kernels-community/flash-attn2: fetched, signature and digests
#      verified against a trust policy, loaded, and shown serving attention;
#   4. the same kernels are pinned in khub.json + khub.lock and the model
#      runs again offline, the lock re-verified.
# Everything it writes outside build/ goes to a scratch folder (KHUB_DEMO_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=$(nproc 2>/dev/null || echo 2)
KHUB=$ROOT/build/bin/khub
PROMPT=${KHUB_DEMO_PROMPT:-"What is the capital of France? Answer in one sentence."}

step() { printf '\n==== %s\n' "$*"; }

step "dependencies and the model"
bash tools/install-deps.sh
MODEL=$(bash tools/fetch-model.sh | tail -n 1)

step "build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKHUB_WERROR=OFF > /dev/null
cmake --build build -j"$JOBS"
$KHUB --version

WORK=${KHUB_DEMO_DIR:-$(mktemp -d /tmp/khub-demo-XXXXXX)}
mkdir -p "$WORK"
SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2> /dev/null || true; }
trap cleanup EXIT

step "the verified built-in plugins"
$KHUB plugins | grep -v '^  op ' || true

step "build, gate and sign the in-tree kernels (scratch copies in $WORK/src)"
rm -rf "$WORK/src" "$WORK/publisher.key" "$WORK/publisher.pub"
mkdir -p "$WORK/src"
$KHUB keygen "$WORK/publisher" | head -n 2
for k in kernels-src/*/; do
    name=$(basename "$k")
    cp -r "$k" "$WORK/src/$name"
    rm -rf "$WORK/src/$name/build"
    $KHUB build "$WORK/src/$name" --quiet > /dev/null
    if ! ls -d "$WORK/src/$name"/build/khub1-*-linux > /dev/null 2>&1; then
        echo "$name: CUDA only and NVRTC is missing: skipped"
        rm -rf "${WORK:?}/src/$name"
        continue
    fi
    $KHUB check "$WORK/src/$name" | tail -n 1
    $KHUB sign --key "$WORK/publisher.key" "$WORK/src/$name" > /dev/null
done

step "a hub of our own: khub serve, and khub publish"
rm -rf "$WORK/hub" "$WORK/cache"
mkdir -p "$WORK/hub"
$KHUB serve "$WORK/hub" --port 0 --token demo-token > "$WORK/serve.out" 2> "$WORK/serve.log" &
SERVER_PID=$!
for _ in $(seq 50); do grep -q http "$WORK/serve.out" 2> /dev/null && break; sleep 0.1; done
ENDPOINT=$(grep -o 'http://[^ ]*' "$WORK/serve.out" | head -n 1)
echo "hub at $ENDPOINT"
for k in "$WORK"/src/*/; do
    printf '%-32s -> commit ' "$(grep -o '"repo": *"[^"]*"' "$k/kernel.json" | cut -d'"' -f4)"
    $KHUB publish "$k" --endpoint "$ENDPOINT" --token demo-token --quiet
done

step "trust policy: kernels-community must be signed by our publisher key"
printf '{"version": 1, "publishers": {"kernels-community": ["%s"]}}\n' \
    "$(cat "$WORK/publisher.pub")" > "$WORK/policy.json"
cat "$WORK/policy.json"
export HF_ENDPOINT=$ENDPOINT KHUB_CACHE=$WORK/cache KHUB_POLICY=$WORK/policy.json

step "khub run --attn kernels-community/flash-attn2 (fetched, verified, loaded)"
$KHUB run --model "$MODEL" --chat --prompt "$PROMPT" --max-new-tokens 48 \
    --attn kernels-community/flash-attn2 --explain | grep -v '^    '

step "pin the kernels: khub.json + khub lock"
mkdir -p "$WORK/project"
cat > "$WORK/project/khub.json" << 'EOF'
{"format": 1,
 "roles": {
   "attention": {"cpu": {"repo": "kernels-community/flash-attn2", "version": 1}},
   "norm": {"cpu": {"repo": "kernels-community/rmsnorm", "version": 1}},
   "activation": {"cpu": {"repo": "kernels-community/activation", "version": 1}}},
 "dependencies": {"kernels-community/kv-cache": {"version": 1}}}
EOF
$KHUB lock "$WORK/project"
grep -c '"commit"' "$WORK/project/khub.lock" | xargs echo "locked kernels:"

step "offline: the same model from khub.json + khub.lock, no network, lock re-checked"
kill "$SERVER_PID" 2> /dev/null || true
SERVER_PID=
HF_HUB_OFFLINE=1 $KHUB run --model "$MODEL" --chat --prompt "$PROMPT" --max-new-tokens 48 \
    --kernels "$WORK/project/khub.json" --lock "$WORK/project/khub.lock" --explain |
    grep -E '^(kernels:|attention|norm|activation|attention\[|rms_norm|silu)' || true
HF_HUB_OFFLINE=1 $KHUB run --model "$MODEL" --chat --prompt "$PROMPT" --max-new-tokens 48 \
    --kernels "$WORK/project/khub.json" --lock "$WORK/project/khub.lock"
echo
echo "demo done; scratch files in $WORK"
