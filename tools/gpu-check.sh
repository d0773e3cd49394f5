#!/usr/bin/env bash
# The GPU checks, as one script for a machine with an NVIDIA GPU and driver
# (run from the repository root; a few minutes). Everything here skips on a
# machine without a driver, which is why it is not part of tools/test.sh.
#   1. the CUDA driver layer: device count, compute capability, a memory
#      round trip and a PTX kernel launched through the host API table;
#   2. the in-tree CUDA kernels: built to PTX with NVRTC, their host glue
#      loaded and scored against the real device.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build-gpu -j"$(nproc)" > /dev/null
echo "== driver"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true
echo "== CUDA driver layer (test_host_api)"
./build-gpu/tests/test_host_api cuda_roundtrip_and_launch
echo "== in-tree CUDA kernels: build (NVRTC) and check (gate + glue load)"
work=$(mktemp -d)
for k in kernels-src/*/; do
    grep -q '"cuda"' "$k/kernel.json" || continue
    n=$(basename "$k")
    cp -r "$k" "$work/$n" && rm -rf "$work/$n/build"
    ./build-gpu/bin/khub build "$work/$n" --quiet
    ./build-gpu/bin/khub check "$work/$n" | grep -E 'cuda|FAIL|findings'
done
rm -rf "$work"
