#!/usr/bin/env bash
# Fails if any C source or header differs from .clang-format's output.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format > /dev/null; then
    echo "check-format: clang-format not installed (tools/install-deps.sh installs it)" >&2
    exit 1
fi
bad=0
while IFS= read -r f; do
    if ! clang-format --dry-run -Werror "$f" > /dev/null 2>&1; then
        echo "check-format: $f is not formatted (run: clang-format -i $f)" >&2
        bad=1
    fi
done < <(git ls-files '*.c' '*.h')
[ $bad -eq 0 ] && echo "check-format: all C files follow .clang-format"
exit $bad
