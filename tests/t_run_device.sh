#!/usr/bin/env bash
# t_run_device.sh: `khub run --device` through the real CLI on SmolLM2 Q4_1
# (tools/fetch-model.sh), without a GPU (docs/gpu.md): the flag's values, the
# missing-driver error this machine gives, and, on the fake driver
# (tests/fake_cuda, a whole driver with KHUB_FAKE_CUDA_MEM), the placement in
# --explain, the forward pass with every role on the CPU between copies (the
# CPU's tokens), --strict, and a model that does not fit.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
DIR=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}
GGUF=$DIR/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || t_skip "$GGUF absent (run tools/fetch-model.sh)"
t_begin run_device
FAKE="LD_LIBRARY_PATH=${KHUB_BUILD:?set by ctest}/fake-cuda KHUB_FAKE_CUDA=12080:90"

err() { # expected exit code, expected message, env assignments ("" = none), args...
    local want=$1 msg=$2 envs=$3 rc=0
    shift 3
    env $envs "$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 2 "$@" > x.out 2> x.err ||
        rc=$?
    [ "$rc" = "$want" ] || fail "khub run $*: exit $rc, want $want: $(cat x.err)"
    grep -qF -- "$msg" x.err || fail "khub run $*: message: $(cat x.err)"
}

err 2 "khub run: --device wants cpu, cuda or cuda:N, got 'gpu'" "" --device gpu
err 2 "khub run: --device wants cpu, cuda or cuda:N, got 'cuda:'" "" --device cuda:
err 2 "khub run: --device wants cpu, cuda or cuda:N, got 'cuda:x'" "" --device cuda:x
"$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 2 --device cpu > c.out 2> c.err ||
    { cat c.err; fail "--device cpu"; }
echo "ok   --device: cpu runs, bad values are usage errors"

if [ -e /dev/nvidiactl ] || ldconfig -p 2> /dev/null | grep 'libcuda\.so\.1 ' > /dev/null; then
    echo "skip the missing-driver error: this machine has a CUDA driver"
else
    err 1 "khub run: SmolLM2-135M-Instruct.Q4_1.gguf: device cuda:0 needs the CUDA driver: no CUDA driver (libcuda.so.1: " "" --device cuda
    echo "ok   no driver: $(cat x.err)"
fi

# Every role falls back to the CPU: the pass computes on the CPU between
# copies through the fake's memory (copies really copy), so the greedy
# tokens are the CPU's.
env $FAKE KHUB_FAKE_CUDA_MEM=1073741824 "$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 2 \
    --device cuda:0 > d.out 2> d.err || { cat d.err; fail "--device cuda:0 on the fake driver"; }
cmp -s c.out d.out || fail "the fake device's tokens differ from the CPU's: $(cat d.out) vs $(cat c.out)"
env $FAKE KHUB_FAKE_CUDA_MEM=1073741824 "$KHUB" run --model "$GGUF" --prompt hi --max-new-tokens 2 \
    --device cuda:0 --explain > x.out 2> x.err || { cat x.err; fail "--device cuda:0 --explain"; }
grep -q "^placement: cuda:0 (sm_90, driver 12.8): 0 roles on the device, 11 on the CPU$" x.out ||
    fail "placement line: $(grep -A3 placement x.out)"
# the embedding is a role (ABI 1.5): without a CUDA op its rows are looked
# up on the host and cross, SmolLM2's hidden 576 x 4 B per token
grep -q "^  embedding\[q8_0\]: host lookup (no CUDA kernel: no embedding op fits: " x.out ||
    fail "embedding line: $(grep -A1 '^  embedding' x.out)"
grep -q "embedding lookup on the host, host->device 2304 B per token$" x.out ||
    fail "host memory line: $(grep 'host memory' x.out)"
grep -q "^  device memory: weights 0.0 MiB, KV cache 0.0 MiB (on the host), scratch " x.out ||
    fail "device memory line: $(grep -A3 placement x.out)"
grep -q "^  qkv_proj\[q4_1\]: cpu fallback, khub/" x.out || fail "qkv fallback: $(grep qkv x.out)"
grep -q "^    copies per token each time it runs: device->host 2304 B (x), host->device 3840 B (q, k, v)$" x.out ||
    fail "qkv copies: $(grep -A1 '^  qkv' x.out)"
echo "ok   fake GPU: placement in --explain, every role on the CPU with its copies, the CPU's tokens"

err 1 ": cuda:0: strict: role rms_norm[f32] has no CUDA kernel (no norm op fits: " \
    "$FAKE KHUB_FAKE_CUDA_MEM=1073741824" --device cuda --strict
err 1 ": device cuda:1: 1 CUDA device(s) present (cuda:0..cuda:0)" \
    "$FAKE KHUB_FAKE_CUDA_MEM=1073741824" --device cuda:1
err 1 "MiB of device memory (weights 0.0 MiB, KV cache 0.0 MiB, scratch " \
    "$FAKE KHUB_FAKE_CUDA_MEM=4194304" --device cuda
grep -qF "MiB) and 4.0 MiB of 4.0 MiB are free; lower max_context or max_seqs" x.err ||
    fail "does not fit: $(cat x.err)"
echo "ok   fake GPU: --strict, a wrong ordinal and a model that does not fit, each named"
echo "1 passed, 0 failed"
