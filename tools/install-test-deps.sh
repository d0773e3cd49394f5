#!/usr/bin/env bash
# Installs the Python packages the TEST SUITE needs (not those that regenerate
# the reference fixtures: see tools/requirements-reference.txt). Kept light on
# purpose: no torch, no transformers.
#
#   huggingface_hub   outside check of the hub protocol and cache layout
#                     (tests/t_hub_cli.sh uses it to download from `khub serve`
#                     and to read a cache khub wrote)
#   kernels           the Hugging Face kernels library (0.17), the other
#                     outside check (tests/t_hf_interop.sh: resolve, versions,
#                     lock, download against `khub serve`); its torch extra is
#                     not installed: a pure-Python torch-universal test kernel
#                     needs no torch
#   pytest            the Python binding's tests (python/tests, run by
#                     tests/t_python.sh, which pip-installs ./python itself)
#   setuptools,       the build backend of ./python, used offline there
#   wheel             (pip install --no-build-isolation); setuptools before
#                     70.1 has no bdist_wheel of its own and needs `wheel`
#   openai            the OpenAI Python client, the outside check of `khub
#                     serve-model` (tests/t_model_server.sh: chat, streaming,
#                     completions, models, error statuses)
#   gguf, numpy,      `tools/fetch-model.sh --hf` without torch: the light
#   safetensors,      backend of tools/make-hf-model.py writes the safetensors
#   tokenizers        copy of the test model (bit-identical to Transformers')
#
# Idempotent: needs no network when everything imports already. Uses the
# `python3` on PATH, the one the tests run. On a Debian python that is marked
# externally managed, pip is retried with --break-system-packages (CI runs as
# root on a throw-away machine; a developer can use a venv instead and put it
# first on PATH).
set -euo pipefail

# module name = pip requirement
REQS=(
    "huggingface_hub=huggingface_hub>=0.30"
    "kernels=kernels>=0.17,<0.18"
    "gguf=gguf>=0.17"
    "numpy=numpy"
    "safetensors=safetensors>=0.4"
    "tokenizers=tokenizers>=0.20"
    "pytest=pytest>=7"
    "openai=openai>=1.40"
    "setuptools=setuptools>=61"
    "wheel=wheel"
)

missing=()
for r in "${REQS[@]}"; do
    mod="${r%%=*}"
    python3 -c "import $mod" 2>/dev/null || missing+=("${r#*=}")
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-test-deps: all ${#REQS[@]} Python packages present"
    exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "install-test-deps: python3 has no pip; install python3-pip (tools/install-deps.sh)" >&2
    exit 1
fi

echo "install-test-deps: installing ${missing[*]}"
if ! python3 -m pip install --quiet --disable-pip-version-check "${missing[@]}" 2>/tmp/khub-pip.$$; then
    if grep -q "externally-managed-environment" /tmp/khub-pip.$$; then
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
            "${missing[@]}"
    else
        cat /tmp/khub-pip.$$ >&2
        rm -f /tmp/khub-pip.$$
        echo "install-test-deps: pip could not install ${missing[*]}; see above" >&2
        exit 1
    fi
fi
rm -f /tmp/khub-pip.$$

for r in "${REQS[@]}"; do
    mod="${r%%=*}"
    if ! python3 -c "import $mod" 2>/dev/null; then
        echo "install-test-deps: $mod still does not import after pip install" >&2
        exit 1
    fi
done
echo "install-test-deps: done"
