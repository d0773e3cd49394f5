#!/usr/bin/env bash
# The main job on a fresh Debian machine: installs what khub needs, builds it,
# and runs the demo (docs/demo.md says what each step shows).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)
KHUB=build/bin/khub

step() { printf '\n==== %s\n' "$*"; }

step "dependencies"
bash tools/install-deps.sh

step "build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$JOBS"

step "khub --version"
$KHUB --version

step "khub plugins: the verified built-in plugins"
$KHUB plugins

step "khub check: each built-in plugin inspected, loaded and self-tested in a child process"
for so in build/plugins/*.so; do
    $KHUB check "$so"
done
