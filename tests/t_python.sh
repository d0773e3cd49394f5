#!/usr/bin/env bash
# t_python.sh: the Python binding (python/). pip installs ./python into a
# scratch folder (offline: no build isolation, no dependencies), then runs
# its pytest suite (python/tests) from there against this build's libkhub:
# plugins with selection traces, a tiny model (tools/make-tiny-model.py)
# loaded with named kernels, tokens, generation whole and streamed, a
# khub.Session over chat turns (cache reuse, reset, cancel) with
# Model.chat_format, errors
# as khub.KhubError with khub's message, the ctypes layouts against the
# headers, and SmolLM2 when KHUB_MODEL_DIR (or ~/.cache/khub/models) has it.
set -euo pipefail
. "${KHUB_SRC:?set by ctest}/tests/lib.sh"
t_begin python

if ldd "$KHUB_BUILD/libkhub.so" 2> /dev/null | grep 'lib[at]san\|libubsan' > /dev/null; then
    t_skip "a sanitizer build of libkhub cannot be loaded into python (its runtime must come first)"
fi
python3 -c 'import pytest' 2> /dev/null || fail "pytest is missing: run tools/install-test-deps.sh"

# From a copy: setuptools writes build/ and khub.egg-info/ beside the sources.
cp -r "$SRC/python" "$T/pysrc"
rm -rf "$T/pysrc/build" "$T/pysrc"/*.egg-info
python3 -m pip install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
    --no-index --target "$T/site" "$T/pysrc" > pip.log 2>&1 ||
    fail "pip install ./python failed: $(cat pip.log)"
[ -f "$T/site/khub/__init__.py" ] || fail "pip installed no khub package: $(ls "$T/site")"

# The tests import the installed copy, not the source tree's.
cp -r "$SRC/python/tests" "$T/tests"
KHUB_LIBRARY="$KHUB_BUILD/libkhub.so" PYTHONPATH="$T/site" PYTHONDONTWRITEBYTECODE=1 \
    python3 -m pytest -q -p no:cacheprovider "$T/tests" -o addopts="" --rootdir "$T" ||
    fail "pytest python/tests failed (see above)"
