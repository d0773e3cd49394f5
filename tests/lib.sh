# tests/lib.sh: what the shell tests (tests/t_*.sh) share. Source it right
# after `set -euo pipefail`:
#
#   . "${KHUB_SRC:?set by ctest}/tests/lib.sh"
#   t_begin NAME
#
# t_begin NAME    sets KHUB (the CLI) and SRC (the source tree) from ctest's
#                 environment, makes the scratch folder T (/tmp/khub-t-NAME-*)
#                 and cd's there; at exit the server of t_serve is stopped and
#                 T removed (KEEP=1 keeps T for a look).
# fail MSG...     prints "FAIL: MSG" on stderr and exits 1.
# t_skip MSG      prints the skip line ctest's log shows and exits 0.
# t_serve DIR OUT [ARGS...]
#                 starts `khub serve DIR --port 0 ARGS...` in the background,
#                 its stdout in OUT and stderr in OUT.err, waits for the
#                 address it prints and sets EP to it (SRV to its pid); fails
#                 with the server's own words when it prints none in 5 s.
# t_flip_byte FILE OFFSET
#                 tampers FILE in place: inverts every bit of the byte at
#                 OFFSET, so the file always changes (writing a fixed byte
#                 left random data unchanged once in 256 runs).
# t_plugin_folder DIR FILE...
#                 makes DIR a built-in plugin folder of copies of FILEs and
#                 their plugins.json, for KHUB_PLUGIN_DIR=DIR.

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

t_skip() {
    echo "skip: $*"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
}

t_cleanup() {
    if [ -n "${SRV:-}" ]; then kill "$SRV" 2> /dev/null || true; fi
    wait 2> /dev/null || true
    if [ -z "${KEEP:-}" ]; then rm -rf "$T"; else echo "kept $T" >&2; fi
}

t_begin() {
    KHUB=${KHUB_BIN:?KHUB_BIN is set by ctest}
    SRC=${KHUB_SRC:?KHUB_SRC is set by ctest}
    T=$(mktemp -d "/tmp/khub-t-$1-XXXXXX")
    SRV=
    trap t_cleanup EXIT
    cd "$T"
}

t_flip_byte() {
    python3 - "$1" "$2" <<'PY'
import sys
path, off = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(off)
    b = f.read(1)
    if len(b) != 1:
        sys.exit(f"t_flip_byte: {path} has no byte at offset {off}")
    f.seek(off)
    f.write(bytes([b[0] ^ 0xFF]))
PY
}

t_serve() {
    local dir=$1 out=$2
    shift 2
    "$KHUB" serve "$dir" --port 0 "$@" > "$out" 2> "$out.err" &
    SRV=$!
    for _ in $(seq 50); do
        grep -q http "$out" 2> /dev/null && break
        sleep 0.1
    done
    EP=$(grep -o 'http://[0-9.:]*' "$out" | head -n 1 || true)
    [ -n "$EP" ] || fail "khub serve $dir printed no address: $(cat "$out" "$out.err")"
}

t_plugin_folder() {
    local dir=$1 f sep=
    shift
    mkdir -p "$dir"
    {
        printf '{"plugins": [\n'
        for f in "$@"; do
            cp "$f" "$dir/"
            printf '%s  {"file": "%s", "sha256": "%s"}' "$sep" "$(basename "$f")" \
                "$(sha256sum "$f" | cut -d ' ' -f 1)"
            sep=$',\n'
        done
        printf '\n]}\n'
    } > "$dir/plugins.json"
}
