#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: installs what it needs,
# builds khub twice (release with -Werror, then ASan+UBSan with leak
# checking), runs every CTest test in both (GPU tests are labelled `gpu` and
# skipped), then runs the fuzzers for a bounded time.
#   tools/test.sh            everything
#   KHUB_TEST_QUICK=1 ...    release build only (no sanitizer pass, no fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc 2>/dev/null || echo 2)

step() { printf '\n==== %s\n' "$*"; }

step "dependencies"
bash tools/install-deps.sh
if [ -f tools/install-test-deps.sh ]; then bash tools/install-test-deps.sh; fi
bash tools/fetch-model.sh --hf   # the GGUF, and the HF copy the safetensors tests use
bash tools/fetch-gemma.sh        # Gemma 3 270M, the second real model (test_gemma)

step "release build (-Werror)"
cmake -S . -B build -DKHUB_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build -j"$JOBS"

step "tests (release)"
ctest --test-dir build --output-on-failure -LE gpu -j2

if [ "${KHUB_TEST_QUICK:-0}" = "1" ]; then exit 0; fi

step "sanitizer build (address,undefined)"
cmake -S . -B build-asan -DKHUB_WERROR=ON -DKHUB_SANITIZE=address,undefined \
      -DCMAKE_BUILD_TYPE=Debug > /dev/null
cmake --build build-asan -j"$JOBS"

step "tests (ASan + UBSan, leak checking on; the 'slow' real-model generation test ran above)"
# The real-model tests (SmolLM2 fixtures, generation, the hub round trip with
# the model) take many minutes under the sanitizers and ran in the release
# pass; here KHUB_MODEL_DIR points nowhere so they skip, and the executor is
# covered by the tiny random models of test_model.
KHUB_MODEL_DIR=/nonexistent ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -LE 'gpu|slow' -j2

if [ -x tests/fuzz/run.sh ]; then
    step "fuzzers (bounded)"
    KHUB_FUZZ_BUILD=build-fuzz tests/fuzz/run.sh "${KHUB_FUZZ_SECONDS:-30}"
fi

step "format check"
bash tools/check-format.sh
