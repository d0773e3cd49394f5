#!/usr/bin/env bash
# tools/gpu-check.sh: the GPU checks of issue 19 as one script, run from the
# repository root on a machine with an NVIDIA GPU and driver (docs/gpu.md),
# meant to take under 5 minutes. It runs anywhere: every step that needs
# something this machine lacks prints "SKIP: <step>: <why>", and the summary
# counts them. Exit status 0 when no step failed.
#   1. build (release, all targets, in build-gpu/);
#   2. the driver and GPU (nvidia-smi);
#   3. the host side of device placement on the fake driver (test_placement,
#      runs without a GPU: the fallback, strict, memory and error paths;
#      test_cuda_graphs: the decode step as a CUDA graph;
#      test_device_paged: paged attention launches, the device paged
#      cache's blocks; test_graphs_paged: CUDA graphs with the paged device
#      cache; test_fa2_cuda: flash-attn2's split-K and tiles,
#      their scratch, inside a graph capture, compiled at load; and
#      test_placement_hub: a Hub kernel's CUDA variant chosen for the
#      placed GPU, or its CPU variant on the CPU);
#   4. the CUDA driver layer: memory, streams, a PTX kernel launched
#      (test_host_api cuda_roundtrip_and_launch);
#   5. the in-tree CUDA kernels built to PTX with NVRTC and checked
#      (khub build, khub check: ABI gate and glue load);
#   6. each CUDA op against khub/ref-cpu on the executor's tensors
#      (test_gpu_ops: rms_norm+residual at an offset, silu_and_mul, flash
#      attention over strided K/V: prefill tiles and split-K decode steps of
#      1-8 rows over up to 20480 keys, GQA 9/3 at head_dim 64 and 32/8 and
#      64/8 at 128; rotary, the device KV cache; then
#      test_gpu_linear: linear f32/f16/bf16 and qlinear Q8_0/Q4_0/Q4_1/
#      Q4_K/Q6_K/NF4 on offset, row-strided x and y through the GEMV and the
#      tensor-core GEMM; NMSE per op), and the GEMM's GFLOP/s on SmolLM2's
#      prefill shapes; test_gpu_ops once with the build-time PTX
#      (KHUB_CUDA_JIT=0) and once compiled at load (flash-attn2 and rotary
#      specialised on the shapes, NVRTC at run time, a fresh disk cache),
#      each output also against the first run's;
#      test_gpu_paged: the paged cache and paged attention of
#      kv-cache-cuda against ref-cpu's dense attention (decode batches
#      through split-K, prefill batches through the tiles, f32 and f16
#      pools, a sliding window and the soft-cap); and test_gpu_embedding:
#      the embedding lookup for f32/f16/bf16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/
#      Q6_K tables into strided rows, bit for bit;
#   7. SmolLM2-135M on the device against the CPU's greedy tokens (test_gpu_ops
#      gpu_smollm2_device_matches_cpu, every in-tree CUDA kernel loaded), and
#      with CUDA graphs off and on (gpu_smollm2_graphs_on_off: the same
#      tokens, decode tok/s medians of 3 interleaved rounds and the ratio,
#      with the dense device cache and with the paged one);
#   8. the benchmark: decode and prefill tokens/s (bench-model) on the CPU,
#      and on the device once it runs there.
# Options: --jobs N (build parallelism, default nproc). KHUB_GPU_BUILD: the
# build folder (default build-gpu). KHUB_MODEL_DIR as in
# tools/fetch-model.sh (the model must already be there: a device machine
# may have no network).
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
[ "${1:-}" = "--jobs" ] && JOBS=${2:?--jobs needs N}
B=${KHUB_GPU_BUILD:-build-gpu} # the build folder (a fresh one by default)
KHUB=$B/bin/khub
pass=0 failed=0 skipped=0
ok() { echo "PASS: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
skip() { echo "SKIP: $*"; skipped=$((skipped + 1)); }
step() { echo; echo "== $*"; }
t0=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A test program's outcome: PASS, FAIL, or SKIP with the runner's reason.
run_test() { # label, command...
    local label=$1 out rc
    shift
    out=$("$@" 2>&1)
    rc=$?
    echo "$out" | grep -E '^  |^(ok|FAIL|skip) ' | sed 's/^/    /'
    if [ $rc -ne 0 ]; then
        bad "$label (exit $rc)"
    elif echo "$out" | grep -q '^skip '; then
        skip "$label: $(echo "$out" | grep -m1 '^  skip: ' | sed 's/^  skip: //')"
    else
        ok "$label"
    fi
}

step "1. build ($B, -j$JOBS)"
if cmake -S . -B $B -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$work/cmake.log" 2>&1 &&
    cmake --build $B -j"$JOBS" >> "$work/cmake.log" 2>&1; then
    ok "build"
else
    tail -20 "$work/cmake.log"
    bad "build"
    echo "summary: $pass passed, $failed failed, $skipped skipped"
    exit 1
fi

step "2. driver and GPU"
gpu=0
if command -v nvidia-smi > /dev/null &&
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader; then
    gpu=1
    ok "driver: nvidia-smi sees a GPU"
else
    skip "driver: no NVIDIA driver or GPU on this machine (every GPU step below skips)"
fi

step "3. host side of device placement on the fake driver (no GPU needed)"
run_test "test_placement" $B/tests/test_placement
run_test "test_cuda_graphs (decode-step CUDA graphs on the fake driver)" $B/tests/test_cuda_graphs
run_test "test_device_paged" $B/tests/test_device_paged
run_test "test_fa2_cuda (flash-attn2 split-K and tiles on the fake driver)" $B/tests/test_fa2_cuda
run_test "test_placement_hub (Hub kernels' CUDA variants for a placed model)" \
    $B/tests/test_placement_hub
run_test "test_graphs_paged (CUDA graphs with the paged device cache on the fake driver)" \
    $B/tests/test_graphs_paged

step "4. CUDA driver layer (test_host_api cuda_roundtrip_and_launch)"
run_test "driver layer round trip and launch" $B/tests/test_host_api cuda_roundtrip_and_launch

step "5. in-tree CUDA kernels: NVRTC build and khub check"
built=0
for k in kernels-src/*/; do
    grep -q '"cuda"' "$k/kernel.json" || continue
    n=$(basename "$k")
    cp -r "$k" "$work/$n" && rm -rf "$work/$n/build"
    if ! "$KHUB" build "$work/$n" --quiet > "$work/$n.build" 2>&1; then
        cat "$work/$n.build"
        bad "build $n"
        continue
    fi
    if ! ls -d "$work/$n"/build/khub1-cu*-linux > /dev/null 2>&1; then
        skip "build $n: no CUDA variant built (NVRTC missing?): $(tr '\n' ' ' < "$work/$n.build")"
        continue
    fi
    built=$((built + 1))
    "$KHUB" check "$work/$n" > "$work/$n.check" 2>&1
    rc=$?
    grep -E 'cuda|FAIL|findings' "$work/$n.check" | sed 's/^/    /'
    [ $rc -eq 0 ] && ok "build and check $n" || bad "check $n (exit $rc)"
done

step "6. each CUDA op against khub/ref-cpu on executor-shaped tensors (test_gpu_ops, test_gpu_linear, test_gpu_paged, test_gpu_embedding)"
if [ $built -eq 0 ]; then
    skip "ops: no CUDA kernel was built"
else
    # First with the build-time PTX only (KHUB_CUDA_JIT=0), keeping every
    # device output; then with load-time compilation into an empty cache
    # (flash-attn2 and rotary specialised on the shapes), each output also
    # held to its tolerance against the build-time run's.
    mkdir -p "$work/outputs" "$work/jit-cache"
    run_test "CUDA ops vs khub/ref-cpu, build-time PTX" env KHUB_GPU_KERNELS="$work" \
        KHUB_CUDA_JIT=0 KHUB_GPU_OUTPUTS="$work/outputs" $B/tests/test_gpu_ops
    run_test "CUDA ops vs khub/ref-cpu and vs the build-time PTX, compiled at load" \
        env KHUB_GPU_KERNELS="$work" KHUB_CUDA_CACHE="$work/jit-cache" \
        KHUB_GPU_OUTPUTS="$work/outputs" $B/tests/test_gpu_ops
    n_jit=$(ls "$work/jit-cache" | grep -c '\.cubin$')
    if [ "$n_jit" -gt 0 ]; then
        ok "load-time compilation ran: $n_jit cubins in the cache"
    else
        skip "load-time compilation: nothing compiled (no NVRTC on this machine? KHUB_NVRTC_LIBRARY)"
    fi
    run_test "CUDA linear layers (GEMV, GEMM) vs khub/ref-cpu, GEMM timing" \
        env KHUB_GPU_KERNELS="$work" $B/tests/test_gpu_linear
    run_test "paged attention vs dense (ref-cpu)" env KHUB_GPU_KERNELS="$work" \
        $B/tests/test_gpu_paged
    run_test "CUDA embedding vs khub/ref-cpu, bit for bit" env KHUB_GPU_KERNELS="$work" \
        $B/tests/test_gpu_embedding
fi

step "7. SmolLM2-135M on the device vs the CPU's greedy tokens; CUDA graphs off vs on (dense and paged cache)"
MODEL=${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$MODEL" ]; then
    skip "SmolLM2: $MODEL absent (tools/fetch-model.sh on a machine with network, then copy it)"
elif [ $built -eq 0 ]; then
    skip "SmolLM2 on the device: no CUDA kernel was built"
else
    # every in-tree CUDA kernel loaded, the model placed with every role on
    # the device, 16 greedy tokens against the CPU's
    run_test "SmolLM2 greedy tokens, device vs CPU" env KHUB_GPU_KERNELS="$work" \
        KHUB_MODEL_DIR="$(dirname "$MODEL")" $B/tests/test_gpu_ops gpu_smollm2_device_matches_cpu
    # the decode step as a CUDA graph vs plain launches, with the dense
    # device cache and with the paged one: same tokens, timing
    run_test "SmolLM2 CUDA graphs off vs on, dense and paged KV cache" env KHUB_GPU_KERNELS="$work" \
        KHUB_MODEL_DIR="$(dirname "$MODEL")" $B/tests/test_gpu_ops gpu_smollm2_graphs_on_off
fi

step "8. benchmark"
if [ -f "$MODEL" ]; then
    "$KHUB" bench-model --model "$MODEL" -p 128 -n 32 -t "$(nproc)" -r 3 2> /dev/null |
        sed 's/^/    cpu: /' && ok "CPU benchmark (bench-model pp128/tg32, $(nproc) threads)"
else
    skip "CPU benchmark: $MODEL absent"
fi
skip "device benchmark (decode/prefill tok/s on cuda, attention vs torch SDPA): not written yet (the CLI loads no local CUDA plugin for placement)"

echo
echo "summary: $pass passed, $failed failed, $skipped skipped in $((SECONDS - t0)) s"
[ $failed -eq 0 ]
