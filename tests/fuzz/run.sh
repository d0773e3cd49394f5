#!/usr/bin/env bash
# Builds the model-parser fuzzers with clang (libFuzzer + ASan + UBSan) and
# runs each for a bounded time on a seed corpus made from the test fixtures
# and the golden files.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET]     default 60
#
# Environment: KHUB_FUZZ_BUILD (build folder, default build-fuzz under the
# source tree), KHUB_FUZZ_JOBS (make -j, default 2). Crashes are written to
# the build folder as crash-*; the script exits non-zero on the first one.
set -euo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(realpath -m "${KHUB_FUZZ_BUILD:-$SRC/build-fuzz}")" # absolute: the runs cd into it
SECS="${1:-60}"
JOBS="${KHUB_FUZZ_JOBS:-2}"
TARGETS="gguf safetensors model_config tokenizer"

CC=clang cmake -S "$SRC" -B "$BUILD" -DKHUB_FUZZ=ON -DKHUB_SANITIZE=address,undefined \
    -DKHUB_WERROR=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target make_seeds fuzz_gguf fuzz_safetensors fuzz_model_config fuzz_tokenizer

CORPUS="$BUILD/fuzz-corpus"
for t in $TARGETS; do mkdir -p "$CORPUS/$t"; done
"$BUILD/tests/fuzz/make_seeds" "$CORPUS"
cp "$SRC"/tests/golden/*.gguf "$CORPUS/gguf/" 2>/dev/null || true
cp "$SRC"/tests/golden/*.safetensors "$CORPUS/safetensors/" 2>/dev/null || true
cp "$SRC"/tests/fixtures/tokenizer/*.json "$CORPUS/tokenizer/" 2>/dev/null || true

cd "$BUILD"
for t in $TARGETS; do
    echo "fuzz_$t: ${SECS}s"
    set +e
    "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECS" -max_len=65536 -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "$CORPUS/$t" 2>&1 | tail -n 12
    # PIPESTATUS: the fuzzer's own exit status, not tail's
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ]; then
        echo "fuzz_$t: FAILED (exit $rc); reproducer in $BUILD/crash-*" >&2
        exit "$rc"
    fi
done
echo "all fuzz targets ran ${SECS}s each without a failure"
