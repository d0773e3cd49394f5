#!/usr/bin/env bash
# libkhub exports exactly the symbols abi/SYMBOLS.md lists.
set -euo pipefail
bash "${KHUB_SRC:?}/tools/check-symbols.sh" "${KHUB_BUILD:?}/libkhub.so"
echo "1 passed, 0 failed"
